//! Fabrics commands and queue creation (NVMe-oF 1.1 §6, §3.3): Connect's checks, which
//! answer a refused Connect with the status and invalid-parameter offset the spec gives, and
//! the attachment of an I/O queue to its controller. Pure: the connection applies the
//! result (SPDK: `ctrlr.c`'s connect path).

use std::net::SocketAddr;
use std::sync::Arc;

use pollux_conf::{DISCOVERY_NQN, validate_nqn};
use pollux_nvme::bindings::nvmf_connect_data;
use pollux_nvme::spec::{Sqe, Status, opcode};
use pollux_nvme::tls::PskIdentity;
use tracing::info;
use zerocopy::FromBytes;

use super::{Ctrl, QueueRef};
use crate::sgl::{DataPtr, data_ptr};
use crate::shared::Shared;
use crate::subsystem::{HostView, Subsystem};

/// Admin queue entries accepted at Connect.
const MAX_ADMIN_ENTRIES: u32 = 4096;

/// Connect invalid-parameter result (NVMe-oF 1.1 §6.3, Figure 21): IATTR bit 16 set for an
/// offset into the Connect data, clear for an offset into the SQE.
fn ipo_data(off: u32) -> u32 {
    (1 << 16) | off
}

/// Fabrics commands (NVMe-oF 1.1 §6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fabrics {
    /// Connect (NVMe-oF 1.1 §6.3): creates the admin queue (qid 0) or an I/O queue.
    Connect {
        /// Record format, must be 0.
        recfmt: u16,
        /// Queue id.
        qid: u16,
        /// Submission queue size, 0's based.
        sqsize: u16,
        /// Connect attributes (bit 2: disable SQ flow control).
        cattr: u8,
        /// Keep-alive timeout in ms (admin queue).
        kato: u32,
    },
    /// Property Get (NVMe-oF 1.1 §6.5).
    PropertyGet {
        /// 8-byte property.
        size8: bool,
        /// Register offset.
        offset: u32,
    },
    /// Property Set (NVMe-oF 1.1 §6.6).
    PropertySet {
        /// 8-byte property.
        size8: bool,
        /// Register offset.
        offset: u32,
        /// New value.
        value: u64,
    },
    /// Disconnect (NVMe-oF 1.1 §6.4, I/O queues).
    Disconnect {
        /// Record format (CDW10 bits 15:0): 0 is the only one defined.
        recfmt: u16,
    },
    /// Authentication Send (NVMe-oF 1.1 §6.1, NVMe 2.0 §8.13.5): a DH-HMAC-CHAP message from
    /// the host.
    AuthSend {
        /// CDW10: SECP, SPSP1, SPSP0.
        cdw10: u32,
        /// Transfer length (TL), bytes.
        tl: u32,
    },
    /// Authentication Receive (NVMe-oF 1.1 §6.2): the controller's next message.
    AuthReceive {
        /// CDW10: SECP, SPSP1, SPSP0.
        cdw10: u32,
        /// Allocation length (AL), bytes.
        al: u32,
    },
    /// Any other fabrics command type.
    Other(u8),
}

/// Decode a fabrics command.
pub fn decode_fabrics(sqe: &Sqe) -> Fabrics {
    use opcode::fctype::*;
    let cdw10 = sqe.cdw10.get();
    let cdw11 = sqe.cdw11.get();
    match sqe.fctype() {
        CONNECT => Fabrics::Connect {
            recfmt: cdw10 as u16,
            qid: (cdw10 >> 16) as u16,
            sqsize: cdw11 as u16,
            cattr: (cdw11 >> 16) as u8,
            kato: sqe.cdw12.get(),
        },
        PROPERTY_GET => Fabrics::PropertyGet {
            size8: cdw10 & 7 == 1,
            offset: cdw11,
        },
        PROPERTY_SET => Fabrics::PropertySet {
            size8: cdw10 & 7 == 1,
            offset: cdw11,
            value: u64::from(sqe.cdw12.get()) | (u64::from(sqe.cdw13.get()) << 32),
        },
        DISCONNECT => Fabrics::Disconnect { recfmt: cdw10 as u16 },
        AUTHENTICATION_SEND => Fabrics::AuthSend { cdw10, tl: cdw11 },
        AUTHENTICATION_RECEIVE => Fabrics::AuthReceive { cdw10, al: cdw11 },
        other => Fabrics::Other(other),
    }
}

/// The Connect command's data (NVMe-oF 1.1 §6.3, Figure 20: 1024 bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectData {
    /// Host identifier.
    pub hostid: [u8; 16],
    /// Controller id (0xFFFF: dynamic, for the admin queue).
    pub cntlid: u16,
    /// Subsystem NQN.
    pub subnqn: String,
    /// Host NQN.
    pub hostnqn: String,
}

/// Byte offsets of Connect data fields (for the invalid-parameter offset, IPO).
pub mod connect_off {
    use std::mem::offset_of;

    use pollux_nvme::bindings::nvmf_connect_data;

    /// Host identifier.
    pub const HOSTID: u32 = offset_of!(nvmf_connect_data, hostid) as u32;
    /// Controller id.
    pub const CNTLID: u32 = offset_of!(nvmf_connect_data, cntlid) as u32;
    /// Subsystem NQN.
    pub const SUBNQN: u32 = offset_of!(nvmf_connect_data, subsysnqn) as u32;
    /// Host NQN.
    pub const HOSTNQN: u32 = offset_of!(nvmf_connect_data, hostnqn) as u32;
}

/// Byte offsets in the Connect SQE (for IPO with IATTR 0).
pub mod connect_sqe_off {
    /// RECFMT.
    pub const RECFMT: u32 = 40;
    /// QID.
    pub const QID: u32 = 42;
    /// SQSIZE.
    pub const SQSIZE: u32 = 44;
    /// CATTR.
    pub const CATTR: u32 = 46;
}

/// An NQN field of the Connect data: NUL-terminated within its 256 bytes (NVMe-oF 1.1
/// §6.3, Figure 20) and UTF-8. Its form is not checked here: as SPDK's nvmf_tgt and Linux's
/// nvmet do, a target accepts any terminated host NQN where any host may connect (SPDK's
/// initiator sends an empty one by default), and a host list matches exact strings only.
fn nqn_field(b: &[u8]) -> Result<String, ()> {
    let end = b.iter().position(|&c| c == 0).ok_or(())?;
    std::str::from_utf8(&b[..end]).map(str::to_owned).map_err(|_| ())
}

/// Parse Connect data; Err carries the offset of the bad field.
pub fn parse_connect_data(d: &[u8]) -> Result<ConnectData, u32> {
    let Ok((cd, _)) = nvmf_connect_data::read_from_prefix(d) else {
        return Err(connect_off::HOSTID);
    };
    Ok(ConnectData {
        hostid: cd.hostid,
        cntlid: u16::from_le(cd.cntlid),
        subnqn: nqn_field(&cd.subsysnqn).map_err(|_| connect_off::SUBNQN)?,
        hostnqn: nqn_field(&cd.hostnqn).map_err(|_| connect_off::HOSTNQN)?,
    })
}

/// A refused Connect: its status, completion dword 0 (the invalid parameter's offset) and
/// the reason to log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Status.
    pub status: Status,
    /// Completion dword 0.
    pub dw0: u32,
    /// Why, for the log.
    pub why: String,
}

fn refuse(status: Status, dw0: u32, why: impl Into<String>) -> Refusal {
    Refusal {
        status,
        dw0,
        why: why.into(),
    }
}

fn invalid(dw0: u32, why: impl Into<String>) -> Refusal {
    refuse(Status::CONNECT_INVALID_PARAMETERS.with_dnr(), dw0, why)
}

/// An accepted Connect.
#[derive(Debug, Clone)]
pub struct ConnectReq {
    /// Queue id.
    pub qid: u16,
    /// Submission queue entries.
    pub entries: u32,
    /// SQ flow control disabled (CATTR bit 2).
    pub sqflow_off: bool,
    /// Keep-alive timeout asked for, ms.
    pub kato: u32,
    /// The Connect data.
    pub data: ConnectData,
    /// The subsystem (None: the discovery controller).
    pub subsys: Option<Arc<Subsystem>>,
}

/// The Connect command's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectCmd {
    /// Record format.
    pub recfmt: u16,
    /// Queue id.
    pub qid: u16,
    /// SQ size, 0's based.
    pub sqsize: u16,
    /// Connect attributes.
    pub cattr: u8,
    /// Keep-alive timeout, ms.
    pub kato: u32,
}

/// Check a Connect (NVMe-oF 1.1 §6.3) against the target's subsystems and limits; `tls`:
/// the PSK identity the queue's TLS session was secured with; `listener`: the bound address
/// of the listener the queue came through.
pub fn check(
    shared: &Shared,
    sqe: &Sqe,
    c: ConnectCmd,
    data: &[u8],
    tls: Option<&PskIdentity>,
    listener: Option<SocketAddr>,
) -> Result<ConnectReq, Refusal> {
    if c.recfmt != 0 {
        return Err(refuse(
            Status::CONNECT_INCOMPATIBLE_FORMAT.with_dnr(),
            0,
            "record format",
        ));
    }
    // Connect data always travels in-capsule (NVMe/TCP 1.0 §3.3.1).
    match data_ptr(sqe) {
        Ok(DataPtr::InCapsule(1024)) if data.len() == 1024 => {}
        _ => {
            let s = Status::DATA_SGL_LENGTH_INVALID.with_dnr();
            return Err(refuse(s, 0, "connect data not in capsule"));
        }
    }
    let d = parse_connect_data(data).map_err(|off| {
        let field = match off {
            connect_off::SUBNQN => "subsystem NQN not NUL-terminated within 256 bytes, or not UTF-8",
            connect_off::HOSTNQN => "host NQN not NUL-terminated within 256 bytes, or not UTF-8",
            _ => "bad connect data",
        };
        invalid(ipo_data(off), field)
    })?;
    // The PSK proves the host and subsystem its identity names (NVMe/TCP 1.0 §3.6.1.3): a
    // queue secured with one host's PSK connects as that host, to that subsystem.
    if let Some(id) = tls {
        if id.hostnqn != d.hostnqn {
            let why = format!(
                "host {} connects over TLS with the PSK of host {}",
                d.hostnqn, id.hostnqn
            );
            return Err(refuse(
                Status::CONNECT_INVALID_HOST.with_dnr(),
                ipo_data(connect_off::HOSTNQN),
                why,
            ));
        }
        if id.subnqn != d.subnqn {
            let why = format!(
                "connect to {} over TLS with a PSK for subsystem {}",
                d.subnqn, id.subnqn
            );
            return Err(invalid(ipo_data(connect_off::SUBNQN), why));
        }
    }
    let entries = u32::from(c.sqsize) + 1;
    let max_entries = if c.qid == 0 {
        MAX_ADMIN_ENTRIES
    } else {
        shared.transport.io_queue_depth
    };
    if c.sqsize == 0 || entries > max_entries {
        return Err(invalid(connect_sqe_off::SQSIZE, "queue size"));
    }
    let subsys = if d.subnqn == DISCOVERY_NQN {
        if c.qid != 0 {
            return Err(invalid(connect_sqe_off::QID, "I/O queue on discovery"));
        }
        let snap = shared.snapshot.load();
        if snap.discovery.require_authentication && !snap.discovery.host_keys.contains_key(&d.hostnqn) {
            let why = format!(
                "host {} has no discovery key and discovery requires authentication",
                d.hostnqn
            );
            return Err(refuse(
                Status::CONNECT_INVALID_HOST.with_dnr(),
                ipo_data(connect_off::HOSTNQN),
                why,
            ));
        }
        None
    } else {
        let snap = shared.snapshot.load();
        // A subsystem that does not exist (yet), or that this listener does not serve (yet),
        // is refused without DNR, as SPDK does (`spdk_nvmf_tgt_find_subsystem` failing in
        // `nvmf_ctrlr_cmd_connect`: Invalid Parameters at SUBNQN, DNR clear): an operator may
        // be removing and re-adding it, and a host reconnecting meanwhile must retry rather
        // than delete its controller (NVMe 2.0 §3.3.3.2.1: DNR set means the same command
        // would fail again). nvmet sets DNR here, which is what makes blktests nvme/061 race.
        let Some(s) = snap.subsystem(&d.subnqn) else {
            let why = format!("unknown subsystem {}", d.subnqn);
            return Err(refuse(
                Status::CONNECT_INVALID_PARAMETERS,
                ipo_data(connect_off::SUBNQN),
                why,
            ));
        };
        if !s.served_on(listener.and_then(|a| snap.listener(a))) {
            let why = match listener {
                Some(a) => format!("subsystem {} is not served on listener {a}", d.subnqn),
                None => format!("subsystem {} is not served on this listener", d.subnqn),
            };
            return Err(refuse(
                Status::CONNECT_INVALID_PARAMETERS,
                ipo_data(connect_off::SUBNQN),
                why,
            ));
        }
        if !s.allows(&d.hostnqn) {
            let why = format!("host {} not allowed", d.hostnqn);
            return Err(refuse(
                Status::CONNECT_INVALID_HOST.with_dnr(),
                ipo_data(connect_off::HOSTNQN),
                why,
            ));
        }
        Some(s.clone())
    };
    if c.qid == 0
        && let Err(why) = validate_nqn(&d.hostnqn)
    {
        // Only where any host may connect (a host list names exact, valid NQNs).
        info!(hostnqn = ?d.hostnqn, subnqn = %d.subnqn, "accepting a host NQN that is not a well-formed NQN ({why})");
    }
    Ok(ConnectReq {
        qid: c.qid,
        entries,
        sqflow_off: c.cattr & (1 << 2) != 0,
        kato: c.kato,
        data: d,
        subsys,
    })
}

/// An admin queue's Connect must ask for a dynamic controller (CNTLID FFFFh, NVMe-oF 1.1
/// §6.3). Checked once the queue has taken the Connect's SQ attributes, which its refusal's
/// CQE reports.
pub fn check_dynamic_cntlid(req: &ConnectReq) -> Result<(), Refusal> {
    if req.qid == 0 && req.data.cntlid != 0xFFFF {
        let why = "admin queue must ask for a dynamic controller";
        return Err(invalid(ipo_data(connect_off::CNTLID), why));
    }
    Ok(())
}

/// Attach I/O queue `qid` (connection `q`) to `ctrl`, the controller the Connect names
/// (NVMe-oF 1.1 §3.3): it must be this host's, of this subsystem, enabled, and the queue id
/// one it granted and not yet connected. The queue gets the controller's view of the
/// subsystem (its host's namespaces).
pub fn attach_io(ctrl: &mut Ctrl, qid: u16, d: &ConnectData, q: QueueRef) -> Result<HostView, Refusal> {
    let Some(subsys) = ctrl.subsys.clone() else {
        return Err(invalid(ipo_data(connect_off::CNTLID), "discovery controller"));
    };
    if subsys.nqn != d.subnqn {
        return Err(invalid(
            ipo_data(connect_off::SUBNQN),
            "controller belongs to another subsystem",
        ));
    }
    if ctrl.hostnqn != d.hostnqn {
        return Err(invalid(
            ipo_data(connect_off::HOSTNQN),
            "host NQN differs from the admin queue's",
        ));
    }
    if ctrl.hostid != d.hostid {
        let why = "host identifier differs from the admin queue's";
        return Err(invalid(ipo_data(connect_off::HOSTID), why));
    }
    if !ctrl.ready() {
        return Err(refuse(
            Status::COMMAND_SEQUENCE_ERROR.with_dnr(),
            0,
            "controller not enabled",
        ));
    }
    let granted = if ctrl.io_queues_granted > 0 {
        ctrl.io_queues_granted
    } else {
        u16::MAX
    };
    if qid > granted {
        return Err(invalid(
            connect_sqe_off::QID,
            "queue id above the granted number of queues",
        ));
    }
    if ctrl.io_queues.contains_key(&qid) {
        return Err(invalid(connect_sqe_off::QID, "queue id already connected"));
    }
    ctrl.io_queues.insert(qid, q);
    Ok(subsys)
}

/// The refusal for an I/O queue Connect naming a controller that does not exist.
pub fn no_such_controller() -> Refusal {
    invalid(ipo_data(connect_off::CNTLID), "no such controller")
}

#[cfg(test)]
mod tests {
    use pollux_nvme::spec::command::{FABRICS, Opcodes};
    use zerocopy::FromZeros;

    use super::*;

    #[test]
    fn the_fabrics_decoder_serves_exactly_the_fabrics_table() {
        let served = Opcodes::of(FABRICS);
        for t in 0..=255u8 {
            let mut sqe = Sqe::new_zeroed();
            sqe.opcode = opcode::FABRICS;
            sqe.set_fctype(t);
            let decoded = !matches!(decode_fabrics(&sqe), Fabrics::Other(_));
            assert_eq!(decoded, served.contains(t), "fctype {t:#x}");
        }
    }
}
