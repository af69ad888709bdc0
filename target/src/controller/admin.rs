//! Admin commands of a controller (NVMe 2.0 §5): their decoding from the SQE, their checks,
//! and their execution as pure functions from the controller state to a [`Reply`]: Identify
//! (NVMe 2.0 §5.17), Get/Set Features (NVMe 2.0 §5.15, §5.27), Keep Alive (NVMe 2.0 §5.19),
//! Asynchronous Event Request (NVMe 2.0 §5.2) and Abort (NVMe 2.0 §5.1), which the
//! connection completes with the reactor's help. Log pages are in [`super::log`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use pollux_conf::DISCOVERY_NQN;
use pollux_nvme::bindings::{nvme_id_ctrl, nvme_id_ns};
use pollux_nvme::spec::ana::{ANAGRPMAX, ANATT_S};
use pollux_nvme::spec::text::{ascii_padded, nul_terminated};
use pollux_nvme::spec::{Sqe, Status, Vs, cns, command, opcode};
use pollux_nvme::tcp::ADMIN_IN_CAPSULE;
use zerocopy::{FromZeros, IntoBytes};

use super::features::{CCTEMP_K, FeatureEffect, WCTEMP_K, get_features, set_features};
use super::log::{LogEnv, get_log_page};
use super::reply::Reply;
use super::{AER_LIMIT, Ctrl, ERROR_LOG_ENTRIES};
use crate::sgl::{DataPtr, Xfer, data_ptr, xfer};
use crate::shared::Shared;

/// NVMe version this controller reports (as Linux nvmet does).
pub const VERSION: Vs = Vs::V1_3;
/// Keep-alive granularity reported in KAS, in 100 ms units.
pub const KAS_100MS: u16 = 10;

/// MDTS in units of the minimum page size (4 KiB), as a power of two.
pub fn mdts(max_io_size: u32) -> u8 {
    (max_io_size / 4096).max(1).ilog2() as u8
}

/// Identify Controller (CNS 01h), NVMe 2.0 §5.17.2.1, with the fabrics fields of NVMe-oF
/// §4.1 (IOCCSZ, IORCSZ, ICDOFF, FCATT, MSDBD, OFCS).
pub fn identify_controller(ctrl: &Ctrl, shared: &Shared) -> Vec<u8> {
    let t = &shared.transport;
    let mut id = nvme_id_ctrl::new_zeroed();
    let (serial, model, nqn, nn) = match &ctrl.subsys {
        Some(s) => (
            s.serial.as_str(),
            s.model.as_str(),
            s.nqn.as_str(),
            s.max_nsid().max(1024),
        ),
        None => ("", "pollux discovery", DISCOVERY_NQN, 0),
    };
    ascii_padded(&mut id.sn, serial);
    ascii_padded(&mut id.mn, model);
    ascii_padded(&mut id.fr, env!("CARGO_PKG_VERSION"));
    id.rab = 6;
    // Several hosts may connect to one subsystem: multi-controller (CMIC bit 1); every
    // listener serves every subsystem, so with more than one it has several ports (bit 0);
    // ANA reporting (bit 3, NVMe 2.0 §8.1.3) on every listener.
    let ports = shared.snapshot.load().listeners.len();
    id.cmic = if ctrl.is_discovery() {
        0
    } else {
        (1 << 1) | u8::from(ports > 1) | (1 << 3)
    };
    if !ctrl.is_discovery() {
        // ANACAP: every state reported (bits 4:0); a namespace's group never changes while
        // it is attached (bit 6: a new group is a new namespace). Linux's multipath needs
        // MNAN within 1..=NN and the ANA page within MDTS.
        id.anatt = ANATT_S;
        id.anacap = 0x1F | (1 << 6);
        id.anagrpmax = ANAGRPMAX.to_le();
        id.nanagrpid = ANAGRPMAX.to_le();
        id.mnan = nn.to_le();
    }
    id.mdts = mdts(t.max_io_size);
    id.cntlid = ctrl.cntlid.to_le();
    id.ver = VERSION.0.to_le();
    // OAES: namespace attribute notices (bit 8), ANA change notices (bit 11), discovery log
    // change notices (bit 31).
    id.oaes = (if ctrl.is_discovery() {
        1u32 << 31
    } else {
        (1 << 8) | (1 << 11)
    })
    .to_le();
    id.ctratt = 1u32.to_le(); // 128-bit host identifier
    id.cntrltype = if ctrl.is_discovery() { 2 } else { 1 };
    id.acl = 3;
    id.aerl = (AER_LIMIT - 1) as u8;
    id.frmw = (1 << 1) | 1; // one slot, slot 1 read-only
    // SMART per namespace (bit 0), commands supported and effects (bit 1), extended data
    // (bit 2: NUMDU and offsets).
    id.lpa = 1 | (1 << 1) | (1 << 2);
    id.elpe = (ERROR_LOG_ENTRIES - 1) as u8;
    id.kas = KAS_100MS.to_le();
    if !ctrl.is_discovery() {
        // The composite temperature thresholds the Temperature Threshold feature starts from.
        id.wctemp = WCTEMP_K.to_le();
        id.cctemp = CCTEMP_K.to_le();
    }
    id.sqes = 0x66;
    id.cqes = 0x44;
    id.maxcmd = (t.io_queue_depth.min(0xFFFF) as u16).to_le();
    id.nn = nn.to_le();
    // ONCS and OACS: the commands served ([`command`]), as the I/O decoder accepts them.
    id.oacs = command::OACS.to_le();
    id.oncs = command::ONCS.to_le();
    // FUSES bit 0: fused Compare and Write (NVMe 2.0 §5.17.2.1, `queue::locked`).
    id.fuses = 1u16.to_le();
    // OCFS bit 0: Copy source range format 0 (NVM Command Set 1.0 §4.1.5.1... Figure 97).
    id.ocfs = 1u16.to_le();
    // VWC (NVMe 2.0 §5.17.2.1): files and devices cache writes until a Flush; RAM and the
    // simulated device hold a completed write in the namespace's memory. Bits 2:1 = 10b: a
    // Flush with NSID FFFFFFFFh is not supported (each namespace is flushed by its own).
    id.vwc = if ctrl.subsys.as_ref().is_some_and(|s| s.volatile_cache()) {
        0x1 | (0b10 << 1)
    } else {
        0
    };
    // SGLs supported (bit 0), SGL data block with offset for in-capsule data (bit 20).
    id.sgls = ((1u32 << 0) | (1 << 20)).to_le();
    nul_terminated(&mut id.subnqn, nqn);
    id.ioccsz = ((64 + t.in_capsule_data_size) / 16).to_le();
    id.iorcsz = 1u32.to_le();
    id.msdbd = 1;
    id.ofcs = 1u16.to_le(); // Disconnect supported
    id.as_bytes().to_vec()
}

/// Identify Namespace (CNS 00h), NVM Command Set 1.0 §4.1.5.1.
pub fn identify_namespace(ctrl: &Ctrl, nsid: u32) -> Reply {
    let Some(subsys) = &ctrl.subsys else {
        return Reply::err(Status::INVALID_FIELD.with_dnr());
    };
    if nsid == 0 || nsid == u32::MAX {
        return Reply::err(Status::INVALID_NAMESPACE.with_dnr());
    }
    let mut id = nvme_id_ns::new_zeroed();
    // An inactive NSID (none there, or one masked from this host) gets a zero-filled
    // structure (NVMe 2.0 §5.17.2.1).
    if let Some(ns) = subsys.namespace(nsid) {
        id.nsze = ns.blocks().to_le();
        id.ncap = ns.blocks().to_le();
        id.nuse = ns.blocks().to_le();
        id.nlbaf = 0;
        id.flbas = 0;
        id.lbaf[0].ds = ns.block_shift as u8;
        id.nmic = 1; // may be attached to several controllers
        // Deallocated blocks read as zeroes (bits 2:0 = 001b); Write Zeroes may deallocate.
        id.dlfeat = 0x1 | (1 << 3);
        id.nguid = ns.nguid;
        id.eui64 = ns.eui64;
        id.anagrpid = ns.ana_group.to_le();
        // Every type and IEKEY's meaning since 1.3; PTPL where the state can be kept.
        id.rescap = pollux_nvme::spec::resv::rescap(ns.resv.ptpl_capable());
        // Copy limits (NVM Command Set 1.0 §4.1.5.1): MSSRL and MCL in blocks, MSRC 0-based.
        id.mssrl = crate::nvm::copy_max_range_blocks(ns).to_le();
        id.mcl = ((crate::nvm::COPY_MAX_BYTES >> ns.block_shift) as u32).to_le();
        id.msrc = (crate::nvm::COPY_MAX_RANGES - 1) as u8;
    }
    Reply::data(id.as_bytes().to_vec())
}

/// Active Namespace ID list (CNS 02h): the NSIDs attached to the controller's host greater
/// than `nsid`, ascending, at most 1024.
pub fn active_ns_list(ctrl: &Ctrl, nsid: u32) -> Reply {
    let Some(subsys) = &ctrl.subsys else {
        return Reply::err(Status::INVALID_FIELD.with_dnr());
    };
    if nsid >= 0xFFFF_FFFE {
        return Reply::err(Status::INVALID_NAMESPACE.with_dnr());
    }
    let mut out = vec![0u8; 4096];
    // The host's active namespaces only: one masked from it is not attached (NVMe 2.0
    // §5.17.2.2).
    let ids = subsys.namespaces_above(nsid).map(|n| n.nsid);
    for (slot, id) in ids.take(1024).enumerate() {
        out[slot * 4..slot * 4 + 4].copy_from_slice(&id.to_le_bytes());
    }
    Reply::data(out)
}

/// Namespace Identification Descriptor list (CNS 03h), NVMe 2.0 §5.17.2.3.
pub fn ns_id_descriptors(ctrl: &Ctrl, nsid: u32) -> Reply {
    let Some(ns) = ctrl.subsys.as_ref().and_then(|s| s.namespace(nsid)) else {
        return Reply::err(Status::INVALID_NAMESPACE.with_dnr());
    };
    let mut out = Vec::with_capacity(4096);
    let mut push = |nidt: u8, nid: &[u8]| {
        out.extend_from_slice(&[nidt, nid.len() as u8, 0, 0]);
        out.extend_from_slice(nid);
    };
    push(1, &ns.eui64); // IEEE EUI-64
    push(2, &ns.nguid); // NGUID
    push(3, &ns.uuid); // UUID
    push(4, &[0]); // Command Set Identifier: NVM
    out.resize(4096, 0);
    Reply::data(out)
}

/// Identify, by CNS.
pub fn identify(ctrl: &Ctrl, shared: &Shared, cns_value: u8, nsid: u32) -> Reply {
    match cns_value {
        cns::CONTROLLER => Reply::data(identify_controller(ctrl, shared)),
        cns::NAMESPACE if !ctrl.is_discovery() => identify_namespace(ctrl, nsid),
        cns::ACTIVE_NAMESPACE_LIST if !ctrl.is_discovery() => active_ns_list(ctrl, nsid),
        cns::NS_ID_DESCRIPTOR_LIST if !ctrl.is_discovery() => ns_id_descriptors(ctrl, nsid),
        _ => Reply::err(Status::INVALID_FIELD.with_dnr()),
    }
}

/// Admin commands this target implements (NVMe 2.0 §5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admin {
    /// Identify (NVMe 2.0 §5.17).
    Identify {
        /// Controller or namespace structure.
        cns: u8,
        /// Namespace id.
        nsid: u32,
    },
    /// Get Log Page (NVMe 2.0 §5.16).
    GetLogPage {
        /// Log page id.
        lid: u8,
        /// Log specific field.
        lsp: u8,
        /// Retain asynchronous event.
        rae: bool,
        /// Byte offset.
        offset: u64,
        /// Bytes wanted.
        len: u32,
    },
    /// Set Features (NVMe 2.0 §5.27).
    SetFeatures {
        /// Feature id.
        fid: u8,
        /// Namespace (namespace-specific features).
        nsid: u32,
        /// Save.
        save: bool,
        /// Value.
        cdw11: u32,
    },
    /// Get Features (NVMe 2.0 §5.15).
    GetFeatures {
        /// Feature id.
        fid: u8,
        /// Namespace (namespace-specific features).
        nsid: u32,
        /// Select (current/default/saved/capabilities).
        sel: u8,
        /// Feature specific.
        cdw11: u32,
    },
    /// Keep Alive (NVMe 2.0 §5.19).
    KeepAlive,
    /// Asynchronous Event Request (NVMe 2.0 §5.2).
    AsyncEventRequest,
    /// Abort (NVMe 2.0 §5.1).
    Abort {
        /// Queue of the command to abort.
        sqid: u16,
        /// Its command id.
        cid: u16,
    },
    /// Not implemented.
    Unsupported(u8),
}

/// Decode an admin command.
pub fn decode_admin(sqe: &Sqe) -> Admin {
    use opcode::admin::*;
    let cdw10 = sqe.cdw10.get();
    let cdw11 = sqe.cdw11.get();
    match sqe.opcode {
        IDENTIFY => Admin::Identify {
            cns: cdw10 as u8,
            nsid: sqe.nsid.get(),
        },
        GET_LOG_PAGE => {
            let numd = ((cdw10 >> 16) | ((cdw11 & 0xFFFF) << 16)) as u64 + 1;
            Admin::GetLogPage {
                lid: cdw10 as u8,
                lsp: ((cdw10 >> 8) & 0x7F) as u8,
                rae: cdw10 & (1 << 15) != 0,
                offset: u64::from(sqe.cdw12.get()) | (u64::from(sqe.cdw13.get()) << 32),
                len: (numd * 4).min(u64::from(u32::MAX)) as u32,
            }
        }
        SET_FEATURES => Admin::SetFeatures {
            fid: cdw10 as u8,
            nsid: sqe.nsid.get(),
            save: cdw10 & (1 << 31) != 0,
            cdw11,
        },
        GET_FEATURES => Admin::GetFeatures {
            fid: cdw10 as u8,
            nsid: sqe.nsid.get(),
            sel: ((cdw10 >> 8) & 7) as u8,
            cdw11,
        },
        KEEP_ALIVE => Admin::KeepAlive,
        ASYNC_EVENT_REQUEST => Admin::AsyncEventRequest,
        ABORT => Admin::Abort {
            sqid: cdw10 as u16,
            cid: (cdw10 >> 16) as u16,
        },
        other => Admin::Unsupported(other),
    }
}

/// What an admin command asks of the connection.
#[derive(Debug)]
pub enum Outcome {
    /// Send this reply (data of at most `max_len` bytes, then the CQE).
    Reply {
        /// The reply.
        rep: Reply,
        /// The host's buffer for the data.
        max_len: u32,
    },
    /// The keep-alive timer restarted (Keep Alive, or Set Features Keep Alive Timer): send
    /// the reply and reschedule the timer.
    KeepAlive(Reply),
    /// An AER is held until an event (NVMe 2.0 §5.2): nothing to send now.
    Held,
    /// Abort command `cid` of queue `sqid` (NVMe 2.0 §5.1): it may be on another reactor.
    Abort {
        /// Queue of the command.
        sqid: u16,
        /// Its command id.
        cid: u16,
    },
    /// Set Features Reservation Persistence: a change of the namespace's reservations,
    /// made by their owner ([`crate::resv`]); the reply comes when it is durable.
    SetPtpl {
        /// The namespace.
        ns: Arc<crate::subsystem::Namespace>,
        /// PTPL wanted.
        ptpl: bool,
    },
}

/// What admin commands may depend on besides the controller.
#[derive(Debug, Clone, Copy)]
pub struct AdminEnv<'a> {
    /// Target-wide state.
    pub shared: &'a Shared,
    /// The connection's local address (stands in for unspecified listener addresses).
    pub local: SocketAddr,
    /// When the target started (power-on hours).
    pub started: Instant,
    /// The host's temperature, kelvin ([`crate::health::host_temperature_k`]).
    pub host_k: u16,
}

/// The host's buffer length for a controller-to-host command, or the status to fail with.
pub fn to_host_len(sqe: &Sqe, max_io_size: u32) -> Result<u32, Status> {
    match data_ptr(sqe)? {
        DataPtr::None => Ok(0),
        DataPtr::InCapsule(_) => Err(Status::SGL_DESCRIPTOR_TYPE_INVALID.with_dnr()),
        DataPtr::Transport(len) if len > max_io_size.max(ADMIN_IN_CAPSULE) => {
            Err(Status::DATA_SGL_LENGTH_INVALID.with_dnr())
        }
        DataPtr::Transport(len) => Ok(len),
    }
}

/// Check and run admin command `sqe` (command id `cid`) of an enabled controller.
pub fn execute(ctrl: &mut Ctrl, env: &AdminEnv<'_>, sqe: &Sqe) -> Outcome {
    let reply = |rep: Reply| Outcome::Reply { rep, max_len: 0 };
    // Admin commands need an enabled controller (NVMe 2.0 §3.5.1).
    if !ctrl.ready() {
        return reply(Reply::err(Status::COMMAND_SEQUENCE_ERROR.with_dnr()));
    }
    if xfer(sqe) == Xfer::HostToCtrl && !matches!(data_ptr(sqe), Ok(DataPtr::None)) {
        // No admin command we serve takes data from the host.
        return reply(Reply::err(Status::INVALID_FIELD.with_dnr()));
    }
    let max_len = match xfer(sqe) {
        Xfer::CtrlToHost => match to_host_len(sqe, env.shared.transport.max_io_size) {
            Ok(l) => l,
            Err(s) => return reply(Reply::err(s)),
        },
        _ => 0,
    };
    let rep = match decode_admin(sqe) {
        Admin::Identify { cns, nsid } => identify(ctrl, env.shared, cns, nsid),
        Admin::GetLogPage {
            lid,
            lsp,
            rae,
            offset,
            len,
        } => {
            let snap = env.shared.snapshot.load();
            let log_env = LogEnv {
                shared: env.shared,
                snapshot: &snap,
                local: env.local,
                started: env.started,
                host_k: env.host_k,
            };
            get_log_page(ctrl, &log_env, lid, lsp, sqe.nsid.get(), rae, offset, len.min(max_len))
        }
        Admin::GetFeatures { fid, nsid, sel, cdw11 } => get_features(ctrl, env.shared, fid, nsid, sel, cdw11),
        Admin::SetFeatures { fid, nsid, save, cdw11 } => {
            let (rep, effect) = set_features(ctrl, env.shared, fid, nsid, save, cdw11);
            match effect {
                FeatureEffect::KeepAlive => {
                    ctrl.last_keep_alive = Instant::now();
                    return Outcome::KeepAlive(rep);
                }
                FeatureEffect::SetPtpl(ns, ptpl) => return Outcome::SetPtpl { ns, ptpl },
                FeatureEffect::None => {}
            }
            rep
        }
        Admin::KeepAlive => {
            // The timer is not rescheduled: its check finds the new deadline when it fires.
            ctrl.last_keep_alive = Instant::now();
            Reply::ok()
        }
        Admin::AsyncEventRequest => {
            if ctrl.aers.len() >= AER_LIMIT {
                Reply::err(Status::ASYNC_EVENT_REQUEST_LIMIT_EXCEEDED)
            } else if let Some(ev) = ctrl.events.pop_front() {
                Reply::dw0(ev)
            } else {
                ctrl.aers.push_back(sqe.cid.get());
                return Outcome::Held;
            }
        }
        Admin::Abort { sqid, cid } => return Outcome::Abort { sqid, cid },
        Admin::Unsupported(_) => Reply::err(Status::INVALID_OPCODE.with_dnr()),
    };
    Outcome::Reply { rep, max_len }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identify_controller_reports_todays_optional_commands() {
        // Compare, Dataset Management, Write Zeroes, Save/Select, Reservations, Verify, Copy.
        assert_eq!(command::ONCS, 0x01BD);
        assert_eq!(command::OACS, 0);
    }

    #[test]
    fn a_masked_namespace_is_inactive_to_the_other_hosts_identify() {
        use crate::subsystem::{test_namespace, test_subsystem_masked};
        let nss = [test_namespace(1, 8), test_namespace(2, 8), test_namespace(3, 8)];
        let s = test_subsystem_masked(&nss, &[], &[(2, &["nqn.a"])]);
        let a = Ctrl::new(1, Some(s.clone()), "nqn.a".into(), [0; 16], 0);
        let b = Ctrl::new(2, Some(s), "nqn.b".into(), [0; 16], 0);
        let list = |c: &Ctrl, from: u32| -> Vec<u32> {
            active_ns_list(c, from)
                .data
                .chunks_exact(4)
                .map(|d| u32::from_le_bytes([d[0], d[1], d[2], d[3]]))
                .take_while(|&n| n != 0)
                .collect()
        };
        assert_eq!(list(&a, 0), [1, 2, 3]);
        assert_eq!(list(&b, 0), [1, 3]);
        assert_eq!(list(&b, 1), [3]);
        // Identify Namespace: zero-filled for b, as for an NSID with no namespace (NVMe 2.0
        // §5.17.2.1); a's is the namespace's.
        let id_a = identify_namespace(&a, 2);
        let id_b = identify_namespace(&b, 2);
        let none = identify_namespace(&b, 9);
        assert_eq!(id_b.status, Status::SUCCESS);
        assert_eq!(id_b.data.len(), 4096);
        assert!(id_b.data.iter().all(|&x| x == 0));
        assert_eq!(id_b, none);
        assert_eq!(id_a.data[0..8], 8u64.to_le_bytes(), "NSZE");
        // The descriptor list: Invalid Namespace or Format, as for one that does not exist.
        assert_eq!(ns_id_descriptors(&b, 2).status, Status::INVALID_NAMESPACE.with_dnr());
        assert_eq!(ns_id_descriptors(&b, 9), ns_id_descriptors(&b, 2));
        assert_eq!(ns_id_descriptors(&a, 2).status, Status::SUCCESS);
    }

    #[test]
    fn the_admin_decoder_serves_exactly_the_admin_table() {
        for op in 0..=255u8 {
            let mut sqe = Sqe::new_zeroed();
            sqe.opcode = op;
            let served = !matches!(decode_admin(&sqe), Admin::Unsupported(_));
            assert_eq!(served, command::ADMIN_OPCODES.contains(op), "opcode {op:#x}");
        }
    }
}
