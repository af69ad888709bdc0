//! The NVM I/O path's command parsing (NVMe 2.0 §3.3.3, NVM Command Set 1.0 §3): one function
//! turns an SQE and its PDU into a fully validated typed command ([`IoCmd`]: namespace, LBA
//! range, transfer size, SGL against the PDU, FUA) or the NVMe status to fail it with; the
//! command's data then maps to one [`BlockOp`] of its namespace's backend (Dataset
//! Management ranges are checked there, when its data has arrived). SPDK: `ctrlr_bdev.c`;
//! firecracker: the block device's `request.rs`. What runs a command is the connection's
//! I/O queue ([`crate::conn`]).

use std::sync::Arc;

use pollux_nvme::spec::{Sqe, Status, opcode};

use crate::backend::{BlockOp, WriteData};
use crate::sgl::{DataPtr, data_ptr};
use crate::subsystem::{Namespace, Subsystem};

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

/// Decode and validate an NVM command against its namespace (the first half of [`parse`],
/// without the SGL). `max_io` is the largest data transfer (MDTS in bytes).
pub fn decode_io(sqe: &Sqe, subsys: &Subsystem, max_io: u32) -> Result<Io, Status> {
    use opcode::io::*;
    let nsid = sqe.nsid.get();
    if sqe.opcode == FLUSH && nsid == u32::MAX {
        // Flush of all namespaces: nothing to do unless some namespace caches writes, and for
        // those we advertise (VWC bits 2:1 = 10b) that it is not supported (NVMe 2.0 §5.17.2.1).
        return if subsys.volatile_cache() {
            Err(Status::INVALID_NAMESPACE.with_dnr())
        } else {
            Ok(Io::Flush { ns: None })
        };
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

/// The ranges of Dataset Management data (NVM Command Set 1.0 §3.2.3, Figure 39) as byte
/// ranges, empty ones left out; or the status for a range outside the namespace.
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

/// How a command's host-to-controller data arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataIn {
    /// It has none (a read's data goes the other way, by C2HData).
    None,
    /// In the command capsule.
    InCapsule,
    /// By R2T and H2CData, this many bytes (the host's SGL length).
    R2t(u32),
}

/// A command of an I/O queue, validated.
#[derive(Debug, Clone)]
pub struct IoCmd {
    /// What it does.
    pub io: Io,
    /// Where its data comes from.
    pub data: DataIn,
}

/// Why a command is refused, and the LBA to record in the error log (NVMe 2.0 §5.16.1.2).
pub type Refusal = (Status, u64);

/// Parse and validate an I/O queue's command: `data` is its in-capsule data. Every check of
/// the command against its namespace and its PDU happens here, once.
pub fn parse(sqe: &Sqe, subsys: &Subsystem, max_io: u32, data: &[u8]) -> Result<IoCmd, Refusal> {
    let slba = u64::from(sqe.cdw10.get()) | (u64::from(sqe.cdw11.get()) << 32);
    let io = decode_io(sqe, subsys, max_io).map_err(|s| (s, slba))?;
    let refuse = |s: Status| (s, 0);
    let dp = data_ptr(sqe).map_err(refuse)?;
    let need = io.h2c_len();
    if need > 0 {
        // The host's buffer may be larger than the command needs (Linux sizes Dataset
        // Management buffers by segment); only a shorter one is invalid (NVMe 2.0 §4.3.2).
        let data = match dp {
            DataPtr::InCapsule(len) if len >= need && data.len() == len as usize => DataIn::InCapsule,
            DataPtr::Transport(len) if len >= need && len <= max_io && data.is_empty() => DataIn::R2t(len),
            _ => return Err(refuse(Status::DATA_SGL_LENGTH_INVALID.with_dnr())),
        };
        return Ok(IoCmd { io, data });
    }
    if let Io::Read { len, .. } = &io {
        match dp {
            DataPtr::Transport(l) if l >= *len => {}
            DataPtr::InCapsule(_) => return Err(refuse(Status::SGL_DESCRIPTOR_TYPE_INVALID.with_dnr())),
            _ => return Err(refuse(Status::DATA_SGL_LENGTH_INVALID.with_dnr())),
        }
    }
    Ok(IoCmd { io, data: DataIn::None })
}

/// The backend operation of a validated command with its data (`data`: exactly the bytes
/// it needs, [`Io::h2c_len`]). `ranges` holds Dataset Management's parsed ranges. None:
/// nothing to do (a flush of all namespaces with no volatile cache; Dataset Management
/// without deallocate, which is advisory, or with no blocks).
pub fn block_op<'a>(
    io: &Io,
    data: WriteData<'a>,
    ranges: &'a mut Vec<(u64, u64)>,
) -> Result<Option<BlockOp<'a>>, Status> {
    Ok(Some(match io {
        Io::Read { off, len, .. } => BlockOp::Read { off: *off, len: *len },
        Io::Write { off, fua, .. } => BlockOp::Write {
            off: *off,
            data,
            fua: *fua,
        },
        Io::WriteZeroes { off, len, .. } => BlockOp::WriteZeroes { off: *off, len: *len },
        Io::Flush { ns: Some(_) } => BlockOp::Flush,
        Io::Flush { ns: None } => return Ok(None),
        Io::DatasetManagement { ns, deallocate, .. } => {
            let WriteData::Bytes(bytes) = data else {
                return Err(Status::INTERNAL_ERROR);
            };
            *ranges = dsm_ranges(bytes, ns)?;
            if !*deallocate || ranges.is_empty() {
                return Ok(None);
            }
            BlockOp::Deallocate { ranges }
        }
    }))
}
