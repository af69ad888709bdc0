//! Commands parsed once from an SQE into typed values (NVMe base spec 2.0 §5, §7; NVMe-oF 1.1
//! §6). Validation that needs the namespace (LBA range, size limits) happens in
//! [`decode_io`]; what needs the controller happens where the controller is.

use std::sync::Arc;

use pollux_nvme::spec::{SglDescriptor, Sqe, Status, opcode};

use crate::subsystem::{Namespace, Subsystem};

/// Data transfer direction from opcode bits 1:0 (base spec §5.1 / §7.1, NVMe-oF §6.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Xfer {
    /// No data.
    None,
    /// Host to controller.
    HostToCtrl,
    /// Controller to host.
    CtrlToHost,
}

/// Direction of an opcode (or fabrics command type).
pub fn xfer_of(code: u8) -> Xfer {
    match code & 3 {
        1 => Xfer::HostToCtrl,
        2 => Xfer::CtrlToHost,
        0 => Xfer::None,
        _ => Xfer::HostToCtrl, // bidirectional: none that we support; treated as a write
    }
}

/// The direction of a command.
pub fn xfer(sqe: &Sqe) -> Xfer {
    if sqe.opcode == opcode::FABRICS {
        xfer_of(sqe.fctype())
    } else {
        xfer_of(sqe.opcode)
    }
}

/// Where a command's data comes from or goes to, from SGL1 (NVMe/TCP §3.3.1: in-capsule data
/// is an SGL data block with offset; everything else a transport data block).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataPtr {
    /// No data.
    None,
    /// In-capsule data of this length (offset 0).
    InCapsule(u32),
    /// Transferred by C2HData or R2T/H2CData, this length.
    Transport(u32),
}

/// Decode SGL1 of a command that moves data.
pub fn data_ptr(sqe: &Sqe) -> Result<DataPtr, Status> {
    let sgl = sqe.sgl();
    let len = sgl.length.get();
    match sgl.id {
        SglDescriptor::ID_DATA_BLOCK_OFFSET => {
            if sgl.address.get() != 0 {
                return Err(Status::SGL_OFFSET_INVALID.with_dnr());
            }
            Ok(if len == 0 {
                DataPtr::None
            } else {
                DataPtr::InCapsule(len)
            })
        }
        SglDescriptor::ID_TRANSPORT_DATA_BLOCK => Ok(if len == 0 {
            DataPtr::None
        } else {
            DataPtr::Transport(len)
        }),
        _ => Err(Status::SGL_DESCRIPTOR_TYPE_INVALID.with_dnr()),
    }
}

/// Fabrics commands (NVMe-oF 1.1 §6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fabrics {
    /// Connect (§6.3): creates the admin queue (qid 0) or an I/O queue.
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
    /// Property Get (§6.5).
    PropertyGet {
        /// 8-byte property.
        size8: bool,
        /// Register offset.
        offset: u32,
    },
    /// Property Set (§6.6).
    PropertySet {
        /// 8-byte property.
        size8: bool,
        /// Register offset.
        offset: u32,
        /// New value.
        value: u64,
    },
    /// Disconnect (§6.4, I/O queues).
    Disconnect,
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
        DISCONNECT => Fabrics::Disconnect,
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
    /// Host identifier.
    pub const HOSTID: u32 = 0;
    /// Controller id.
    pub const CNTLID: u32 = 16;
    /// Subsystem NQN.
    pub const SUBNQN: u32 = 256;
    /// Host NQN.
    pub const HOSTNQN: u32 = 512;
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

fn nqn_field(b: &[u8]) -> Result<String, ()> {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    std::str::from_utf8(&b[..end]).map(str::to_owned).map_err(|_| ())
}

/// Parse Connect data; Err carries the offset of the bad field.
pub fn parse_connect_data(d: &[u8]) -> Result<ConnectData, u32> {
    if d.len() < 1024 {
        return Err(connect_off::HOSTID);
    }
    let mut hostid = [0u8; 16];
    hostid.copy_from_slice(&d[0..16]);
    Ok(ConnectData {
        hostid,
        cntlid: u16::from_le_bytes([d[16], d[17]]),
        subnqn: nqn_field(&d[256..512]).map_err(|_| connect_off::SUBNQN)?,
        hostnqn: nqn_field(&d[512..768]).map_err(|_| connect_off::HOSTNQN)?,
    })
}

/// Admin commands this target implements (base spec §5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admin {
    /// Identify (§5.17).
    Identify {
        /// Controller or namespace structure.
        cns: u8,
        /// Namespace id.
        nsid: u32,
    },
    /// Get Log Page (§5.16).
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
    /// Set Features (§5.27).
    SetFeatures {
        /// Feature id.
        fid: u8,
        /// Save.
        save: bool,
        /// Value.
        cdw11: u32,
    },
    /// Get Features (§5.15).
    GetFeatures {
        /// Feature id.
        fid: u8,
        /// Select (current/default/saved/capabilities).
        sel: u8,
        /// Feature specific.
        cdw11: u32,
    },
    /// Keep Alive (§5.19).
    KeepAlive,
    /// Asynchronous Event Request (§5.2).
    AsyncEventRequest,
    /// Abort (§5.1).
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
            save: cdw10 & (1 << 31) != 0,
            cdw11,
        },
        GET_FEATURES => Admin::GetFeatures {
            fid: cdw10 as u8,
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

/// An NVM command, validated against its namespace.
#[derive(Debug, Clone)]
pub enum Io {
    /// Read `len` bytes at byte offset `off`.
    Read {
        /// Namespace.
        ns: Arc<Namespace>,
        /// Byte offset.
        off: u64,
        /// Byte length.
        len: u32,
    },
    /// Write.
    Write {
        /// Namespace.
        ns: Arc<Namespace>,
        /// Byte offset.
        off: u64,
        /// Byte length.
        len: u32,
        /// Force unit access.
        fua: bool,
    },
    /// Write Zeroes.
    WriteZeroes {
        /// Namespace.
        ns: Arc<Namespace>,
        /// Byte offset.
        off: u64,
        /// Byte length.
        len: u64,
    },
    /// Flush one namespace or all (None: NSID FFFFFFFFh).
    Flush {
        /// Namespace.
        ns: Option<Arc<Namespace>>,
    },
    /// Dataset Management with `ranges` 16-byte range entries as data.
    DatasetManagement {
        /// Namespace.
        ns: Arc<Namespace>,
        /// Number of ranges.
        ranges: u32,
        /// Deallocate attribute.
        deallocate: bool,
    },
}

impl Io {
    /// The namespace addressed (None: a flush of all namespaces).
    pub fn namespace(&self) -> Option<&Arc<Namespace>> {
        match self {
            Io::Read { ns, .. }
            | Io::Write { ns, .. }
            | Io::WriteZeroes { ns, .. }
            | Io::DatasetManagement { ns, .. } => Some(ns),
            Io::Flush { ns } => ns.as_ref(),
        }
    }

    /// Bytes of host-to-controller data the command carries.
    pub fn h2c_len(&self) -> u32 {
        match self {
            Io::Write { len, .. } => *len,
            Io::DatasetManagement { ranges, .. } => ranges * 16,
            _ => 0,
        }
    }
}

/// Decode and validate an NVM command (base spec §3.3.3, NVM command set spec §3).
/// `max_io` is the largest data transfer (MDTS in bytes).
pub fn decode_io(sqe: &Sqe, subsys: &Subsystem, max_io: u32) -> Result<Io, Status> {
    use opcode::io::*;
    let nsid = sqe.nsid.get();
    if sqe.opcode == FLUSH && nsid == u32::MAX {
        return Ok(Io::Flush { ns: None });
    }
    if !matches!(sqe.opcode, FLUSH | READ | WRITE | WRITE_ZEROES | DATASET_MANAGEMENT) {
        return Err(Status::INVALID_OPCODE.with_dnr());
    }
    if sqe.fuse() != Sqe::FUSE_NONE {
        return Err(Status::INVALID_FIELD.with_dnr());
    }
    let ns = subsys
        .namespace(nsid)
        .ok_or(Status::INVALID_NAMESPACE.with_dnr())?
        .clone();
    let slba = u64::from(sqe.cdw10.get()) | (u64::from(sqe.cdw11.get()) << 32);
    let nlb = u64::from(sqe.cdw12.get() & 0xFFFF) + 1;
    let range = |ns: &Namespace| -> Result<(u64, u64), Status> {
        match slba.checked_add(nlb) {
            Some(end) if end <= ns.blocks => Ok((slba << ns.block_shift, nlb << ns.block_shift)),
            _ => Err(Status::LBA_OUT_OF_RANGE.with_dnr()),
        }
    };
    match sqe.opcode {
        FLUSH => Ok(Io::Flush { ns: Some(ns) }),
        READ | WRITE => {
            let (off, len) = range(&ns)?;
            if len > u64::from(max_io) {
                return Err(Status::INVALID_FIELD.with_dnr());
            }
            let len = len as u32;
            if sqe.opcode == READ {
                Ok(Io::Read { ns, off, len })
            } else {
                Ok(Io::Write {
                    ns,
                    off,
                    len,
                    fua: sqe.cdw12.get() & (1 << 30) != 0,
                })
            }
        }
        WRITE_ZEROES => {
            let (off, len) = range(&ns)?;
            Ok(Io::WriteZeroes { ns, off, len })
        }
        _ => Ok(Io::DatasetManagement {
            ns,
            ranges: (sqe.cdw10.get() & 0xFF) + 1,
            deallocate: sqe.cdw11.get() & (1 << 2) != 0,
        }),
    }
}

/// One Dataset Management range (NVM command set spec §3.2.3, Figure 39): byte range or error.
pub fn dsm_ranges(data: &[u8], ns: &Namespace) -> Result<Vec<(u64, u64)>, Status> {
    let mut out = Vec::with_capacity(data.len() / 16);
    for r in data.chunks_exact(16) {
        let nlb = u64::from(u32::from_le_bytes([r[4], r[5], r[6], r[7]]));
        let slba = u64::from_le_bytes([r[8], r[9], r[10], r[11], r[12], r[13], r[14], r[15]]);
        if nlb == 0 {
            continue;
        }
        match slba.checked_add(nlb) {
            Some(end) if end <= ns.blocks => out.push((slba << ns.block_shift, nlb << ns.block_shift)),
            _ => return Err(Status::LBA_OUT_OF_RANGE.with_dnr()),
        }
    }
    Ok(out)
}
