//! The NVM I/O path's command parsing (NVMe 2.0 §3.3.3, NVM Command Set 1.0 §3): one function
//! turns an SQE and its PDU into a fully validated typed command ([`IoCmd`]: namespace, LBA
//! range, transfer size, SGL against the PDU, FUA) or the NVMe status to fail it with; the
//! command's data then maps to one [`BlockOp`] of its namespace's backend (Dataset
//! Management ranges are checked there, when its data has arrived). SPDK: `ctrlr_bdev.c`;
//! firecracker: the block device's `request.rs`. What runs a command is the NVMe-oF queue's
//! I/O queue ([`crate::queue`]).

use std::sync::Arc;

use pollux_nvme::spec::resv::{Access, ResvCdw10};
use pollux_nvme::spec::{Sqe, Status, command, opcode};

use crate::backend::{BlockOp, WriteData};
use crate::qos::Cost;
use crate::sgl::{DataPtr, data_ptr};
use crate::subsystem::{HostView, Namespace};

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
    /// Compare (NVM Command Set 1.0 §3.2.1): the host's `len` bytes against those at `off`.
    Compare {
        /// Namespace.
        ns: Arc<Namespace>,
        /// Byte offset.
        off: u64,
        /// Byte length.
        len: u32,
        /// The host's data, once it has all come (empty until then).
        expect: Vec<u8>,
    },
    /// Verify (NVM Command Set 1.0 §3.2.4): the `len` bytes at `off` can be read; nothing
    /// is transferred.
    Verify {
        /// Namespace.
        ns: Arc<Namespace>,
        /// Byte offset.
        off: u64,
        /// Byte length.
        len: u32,
    },
    /// Reservation Register, Acquire or Release (NVM Command Set 1.0 §7.3-§7.5): its keys
    /// come as data.
    Reservation {
        /// Namespace.
        ns: Arc<Namespace>,
        /// What it asks.
        cmd: ResvCdw10,
    },
    /// Reservation Report (NVM Command Set 1.0 §7.6), extended data structure: `len` bytes.
    ReservationReport {
        /// Namespace.
        ns: Arc<Namespace>,
        /// Bytes the host asked for ((NUMD + 1) * 4).
        len: u32,
    },
    /// Copy (NVM Command Set 1.0 §3.2.2) to byte offset `dst`, its `ranges` 32-byte source
    /// range entries (format 0) as data.
    Copy {
        /// Namespace.
        ns: Arc<Namespace>,
        /// Destination byte offset (SDLBA).
        dst: u64,
        /// Number of source ranges.
        ranges: u32,
        /// Force unit access.
        fua: bool,
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
    /// The command's name, for what `pollux ctl` and the logs say of it.
    pub fn name(&self) -> &'static str {
        match self {
            Io::Read { .. } => "Read",
            Io::Write { .. } => "Write",
            Io::WriteZeroes { .. } => "Write Zeroes",
            Io::Flush { .. } => "Flush",
            Io::Compare { .. } => "Compare",
            Io::Verify { .. } => "Verify",
            Io::Reservation { .. } => "Reservation",
            Io::ReservationReport { .. } => "Reservation Report",
            Io::Copy { .. } => "Copy",
            Io::DatasetManagement { .. } => "Dataset Management",
        }
    }

    /// The cost of this command against its namespace's QoS limits ([`crate::qos`]); None:
    /// it is never held. Flush is not (holding it would only delay the durability of writes
    /// that completed already, and SPDK's QoS does not hold it either), nor are the
    /// reservation commands (they move no blocks). Write Zeroes and Dataset Management count
    /// as commands without bytes (no data moves); a Copy as one command, its bytes not
    /// counted (they are known only once its ranges have come).
    pub fn qos_cost(&self) -> Option<Cost> {
        let one = |read: u32, write: u32| {
            Some(Cost {
                cmds: 1,
                read: u64::from(read),
                write: u64::from(write),
            })
        };
        match self {
            Io::Read { len, .. } | Io::Compare { len, .. } | Io::Verify { len, .. } => one(*len, 0),
            Io::Write { len, .. } => one(0, *len),
            Io::WriteZeroes { .. } | Io::DatasetManagement { .. } | Io::Copy { .. } => one(0, 0),
            Io::Flush { .. } | Io::Reservation { .. } | Io::ReservationReport { .. } => None,
        }
    }

    /// The namespace addressed (None: a flush of all namespaces).
    pub fn namespace(&self) -> Option<&Arc<Namespace>> {
        match self {
            Io::Read { ns, .. }
            | Io::Write { ns, .. }
            | Io::WriteZeroes { ns, .. }
            | Io::Compare { ns, .. }
            | Io::Verify { ns, .. }
            | Io::Reservation { ns, .. }
            | Io::ReservationReport { ns, .. }
            | Io::Copy { ns, .. }
            | Io::DatasetManagement { ns, .. } => Some(ns),
            Io::Flush { ns } => ns.as_ref(),
        }
    }

    /// Bytes of host-to-controller data the command carries.
    pub fn host_data_len(&self) -> u32 {
        match self {
            Io::Write { len, .. } | Io::Compare { len, .. } => *len,
            Io::DatasetManagement { ranges, .. } => ranges * 16,
            Io::Reservation { cmd, .. } => cmd.data_len(),
            Io::Copy { ranges, .. } => ranges * COPY_RANGE_LEN,
            _ => 0,
        }
    }

    /// The command group a reservation restricts it by (NVMe 2.0 §8.19.2, Figure 474);
    /// None: the reservation commands, which check their keys themselves, and a flush of
    /// every namespace.
    pub fn access(&self) -> Option<Access> {
        match self {
            Io::Read { .. } | Io::Compare { .. } | Io::Verify { .. } => Some(Access::Read),
            Io::Write { .. }
            | Io::WriteZeroes { .. }
            | Io::DatasetManagement { .. }
            | Io::Copy { .. }
            | Io::Flush { ns: Some(_) } => Some(Access::Write),
            Io::Flush { ns: None } | Io::Reservation { .. } | Io::ReservationReport { .. } => None,
        }
    }

    /// The bytes a command that changes blocks writes, as `[start, end)` of its namespace
    /// (the range locks check them, [`crate::range_lock`]); None for one that writes
    /// nothing. Dataset Management's ranges are in its data: the whole namespace stands for
    /// them (checked only while some range is locked).
    #[inline(always)]
    pub fn written(&self) -> Option<(&Arc<Namespace>, u64, u64)> {
        match self {
            Io::Write { ns, off, len, .. } => Some((ns, *off, off + u64::from(*len))),
            Io::WriteZeroes { ns, off, len } => Some((ns, *off, off + len)),
            Io::DatasetManagement {
                ns, deallocate: true, ..
            } => Some((ns, 0, ns.bytes())),
            _ => None,
        }
    }
}

/// Bytes of one Copy source range entry, format 0 (NVM Command Set 1.0 §3.2.2.1).
pub const COPY_RANGE_LEN: u32 = 32;
/// Most source ranges of one Copy (Identify Namespace MSRC is this less one).
pub const COPY_MAX_RANGES: u32 = 128;
/// Most bytes one Copy moves (Identify Namespace MCL in blocks; MSSRL the same, at most
/// 65535 blocks). The copy is read into pollux's memory whole before it is written, so
/// that a destination overlapping a source is well defined (the source as it was).
pub const COPY_MAX_BYTES: u64 = 1 << 20;

/// Command Size Limit Exceeded (NVM Command Set 1.0 §3.2.2, SCT 1h SC 83h).
pub const COMMAND_SIZE_LIMIT_EXCEEDED: Status = Status::new(pollux_nvme::spec::sct::COMMAND_SPECIFIC, 0x83);

/// MSSRL of a namespace: the most blocks of one source range.
pub fn copy_max_range_blocks(ns: &Namespace) -> u16 {
    (COPY_MAX_BYTES >> ns.block_shift).min(u64::from(u16::MAX)) as u16
}

/// The source ranges of a Copy's data (format 0, NVM Command Set 1.0 §3.2.2.1, Figure 50)
/// as byte ranges; or its status: LBA Out of Range for a range beyond the namespace, Command
/// Size Limit Exceeded beyond MSSRL or MCL.
pub fn copy_ranges(data: &[u8], ns: &Namespace) -> Result<Vec<(u64, u64)>, Status> {
    let mut out = Vec::with_capacity(data.len() / COPY_RANGE_LEN as usize);
    let mut total = 0u64;
    let max_range = u64::from(copy_max_range_blocks(ns));
    for r in data.chunks_exact(COPY_RANGE_LEN as usize) {
        let slba = u64::from_le_bytes([r[8], r[9], r[10], r[11], r[12], r[13], r[14], r[15]]);
        let nlb = u64::from(u16::from_le_bytes([r[16], r[17]])) + 1;
        match slba.checked_add(nlb) {
            Some(end) if end <= ns.blocks() => {}
            _ => return Err(Status::LBA_OUT_OF_RANGE.with_dnr()),
        }
        total += nlb;
        if nlb > max_range || total << ns.block_shift > COPY_MAX_BYTES {
            return Err(COMMAND_SIZE_LIMIT_EXCEEDED.with_dnr());
        }
        out.push((slba << ns.block_shift, nlb << ns.block_shift));
    }
    Ok(out)
}

/// Extended data structure header size: the least a Reservation Report may ask for.
const REPORT_MIN: u32 = pollux_nvme::spec::resv::REPORT_EXT_HEADER as u32;

/// Decode and validate an NVM command against its namespace (the first half of [`parse`],
/// without the SGL), as the host of `subsys` sees it: an NSID masked from that host is
/// inactive, like one that does not exist. `max_io` is the largest data transfer (MDTS in
/// bytes).
#[inline(always)]
pub fn decode_io(sqe: &Sqe, subsys: &HostView, max_io: u32) -> Result<Io, Status> {
    use opcode::io::*;
    let nsid = sqe.nsid.get();
    if sqe.opcode == FLUSH && nsid == u32::MAX {
        return Ok(Io::Flush { ns: None });
    }
    // The NVM commands served (`command::NVM`): one bit test.
    if !command::NVM_OPCODES.contains(sqe.opcode) {
        return Err(Status::INVALID_OPCODE.with_dnr());
    }
    if sqe.fuse() != Sqe::FUSE_NONE {
        return Err(Status::INVALID_FIELD.with_dnr());
    }
    // An inactive NSID: Invalid Namespace or Format (NVMe 2.0 §3.2.1.5, §4.2.3.1).
    let ns = subsys
        .namespace(nsid)
        .ok_or(Status::INVALID_NAMESPACE.with_dnr())?
        .clone();
    let slba = u64::from(sqe.cdw10.get()) | (u64::from(sqe.cdw11.get()) << 32);
    let nlb = u64::from(sqe.cdw12.get() & 0xFFFF) + 1;
    let range = |ns: &Namespace| -> Result<(u64, u64), Status> {
        match slba.checked_add(nlb) {
            Some(end) if end <= ns.blocks() => Ok((slba << ns.block_shift, nlb << ns.block_shift)),
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
        // Both read the blocks through the namespace's channel, as a read does, so they are
        // bounded like one (MDTS; Verify's VSL is not reported, so MDTS is its limit too).
        COMPARE | VERIFY => {
            let (off, len) = range(&ns)?;
            if len > u64::from(max_io) {
                return Err(Status::INVALID_FIELD.with_dnr());
            }
            let len = len as u32;
            if sqe.opcode == COMPARE {
                Ok(Io::Compare {
                    ns,
                    off,
                    len,
                    expect: Vec::new(),
                })
            } else {
                Ok(Io::Verify { ns, off, len })
            }
        }
        RESERVATION_REGISTER | RESERVATION_ACQUIRE | RESERVATION_RELEASE => {
            let cmd = ResvCdw10::decode(sqe.opcode, sqe.cdw10.get()).ok_or(Status::INVALID_FIELD.with_dnr())?;
            Ok(Io::Reservation { ns, cmd })
        }
        RESERVATION_REPORT => {
            // Host identifiers over fabrics are 128-bit: only the extended data structure
            // holds them (NVMe 2.0 §5.27.1.25; nvmet and SPDK answer the same).
            if sqe.cdw11.get() & 1 == 0 {
                return Err(Status::HOST_ID_INCONSISTENT.with_dnr());
            }
            let len = u64::from(sqe.cdw10.get()).saturating_add(1).saturating_mul(4);
            if len < u64::from(REPORT_MIN) || len > u64::from(max_io) {
                return Err(Status::INVALID_FIELD.with_dnr());
            }
            Ok(Io::ReservationReport { ns, len: len as u32 })
        }
        // NVM Command Set 1.0 §3.2.2: the destination is checked here, the source ranges
        // when the data has come (`copy_ranges`).
        COPY => {
            let cdw12 = sqe.cdw12.get();
            if (cdw12 >> 8) & 0xF != 0 {
                // Only source range format 0 (OCFS bit 0).
                return Err(Status::INVALID_FIELD.with_dnr());
            }
            let ranges = (cdw12 & 0xFF) + 1;
            if ranges > COPY_MAX_RANGES {
                return Err(COMMAND_SIZE_LIMIT_EXCEEDED.with_dnr());
            }
            if slba >= ns.blocks() {
                return Err(Status::LBA_OUT_OF_RANGE.with_dnr());
            }
            Ok(Io::Copy {
                dst: slba << ns.block_shift,
                ns,
                ranges,
                fua: cdw12 & (1 << 30) != 0,
            })
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
            Some(end) if end <= ns.blocks() => out.push((slba << ns.block_shift, nlb << ns.block_shift)),
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
    Fetch(u32),
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
#[inline(always)]
pub fn parse(sqe: &Sqe, subsys: &HostView, max_io: u32, data: &[u8]) -> Result<IoCmd, Refusal> {
    let slba = u64::from(sqe.cdw10.get()) | (u64::from(sqe.cdw11.get()) << 32);
    let io = decode_io(sqe, subsys, max_io).map_err(|s| (s, slba))?;
    let refuse = |s: Status| (s, 0);
    let dp = data_ptr(sqe).map_err(refuse)?;
    let need = io.host_data_len();
    if need > 0 {
        // The host's buffer may be larger than the command needs (Linux sizes Dataset
        // Management buffers by segment); only a shorter one is invalid (NVMe 2.0 §4.3.2).
        let data = match dp {
            DataPtr::InCapsule(len) if len >= need && data.len() == len as usize => DataIn::InCapsule,
            DataPtr::Transport(len) if len >= need && len <= max_io && data.is_empty() => DataIn::Fetch(len),
            _ => return Err(refuse(Status::DATA_SGL_LENGTH_INVALID.with_dnr())),
        };
        return Ok(IoCmd { io, data });
    }
    if let Io::Read { len, .. } | Io::ReservationReport { len, .. } = &io {
        match dp {
            DataPtr::Transport(l) if l >= *len => {}
            DataPtr::InCapsule(_) => return Err(refuse(Status::SGL_DESCRIPTOR_TYPE_INVALID.with_dnr())),
            _ => return Err(refuse(Status::DATA_SGL_LENGTH_INVALID.with_dnr())),
        }
    }
    if matches!(io, Io::Flush { ns: None }) && subsys.volatile_cache() {
        // Flush of all namespaces: nothing to do unless some namespace caches writes, and for
        // those we advertise (VWC bits 2:1 = 10b) that it is not supported (NVMe 2.0 §5.17.2.1).
        return Err(refuse(Status::INVALID_NAMESPACE.with_dnr()));
    }
    Ok(IoCmd { io, data: DataIn::None })
}

/// The backend operation of a validated command with its data (`data`: exactly the bytes
/// it needs, [`Io::host_data_len`]). None:
/// nothing to do (a flush of all namespaces with no volatile cache; Dataset Management
/// without deallocate, which is advisory, or with no blocks).
#[inline(always)]
pub fn block_op<'a>(io: &Io, data: WriteData<'a>) -> Result<Option<BlockOp<'a>>, Status> {
    Ok(Some(match io {
        Io::Read { off, len, .. } | Io::Compare { off, len, .. } | Io::Verify { off, len, .. } => {
            BlockOp::Read { off: *off, len: *len }
        }
        Io::Write { off, fua, .. } => BlockOp::Write {
            off: *off,
            data,
            fua: *fua,
        },
        Io::WriteZeroes { off, len, .. } => BlockOp::WriteZeroes { off: *off, len: *len },
        Io::Flush { ns: Some(_) } => BlockOp::Flush,
        Io::Flush { ns: None } | Io::Reservation { .. } | Io::ReservationReport { .. } => return Ok(None),
        // Run by the connection as a locked operation (`queue::locked`), never as one op.
        Io::Copy { .. } => return Err(Status::INTERNAL_ERROR),
        Io::DatasetManagement { ns, deallocate, .. } => {
            let WriteData::Bytes(bytes) = data else {
                return Err(Status::INTERNAL_ERROR);
            };
            let ranges = dsm_ranges(bytes, ns)?;
            if !*deallocate || ranges.is_empty() {
                return Ok(None);
            }
            BlockOp::Deallocate { ranges }
        }
    }))
}

#[cfg(test)]
mod tests {
    use pollux_host::sqe;
    use pollux_nvme::spec::SglDescriptor;

    use super::*;
    use crate::subsystem::{test_namespace, test_subsystem, test_subsystem_masked};

    const MAX_IO: u32 = 128 << 10;

    fn subsystem() -> HostView {
        HostView::new(test_subsystem(&[test_namespace(1, 1024)], &[]), "nqn.h")
    }

    fn with_sgl(mut s: Sqe, len: u32, in_capsule: bool) -> Sqe {
        let id = if in_capsule {
            SglDescriptor::ID_DATA_BLOCK_OFFSET
        } else {
            SglDescriptor::ID_TRANSPORT_DATA_BLOCK
        };
        s.set_sgl(&SglDescriptor::new(0, len, id));
        s
    }

    #[test]
    fn the_data_of_a_command_is_checked_against_its_pdu_once() {
        let s = subsystem();
        // A write of 8 blocks: in the capsule (exactly its bytes), or by R2T (its SGL length).
        let w = |len, ic| with_sgl(sqe::write(1, 0, 8), len, ic);
        assert!(matches!(
            parse(&w(4096, true), &s, MAX_IO, &[0; 4096]),
            Ok(IoCmd {
                data: DataIn::InCapsule,
                ..
            })
        ));
        assert!(matches!(
            parse(&w(8192, false), &s, MAX_IO, &[]),
            Ok(IoCmd {
                data: DataIn::Fetch(8192),
                ..
            })
        ));
        let short = Status::DATA_SGL_LENGTH_INVALID.with_dnr();
        assert_eq!(parse(&w(2048, true), &s, MAX_IO, &[0; 2048]).err(), Some((short, 0)));
        assert_eq!(parse(&w(4096, true), &s, MAX_IO, &[0; 100]).err(), Some((short, 0)));
        assert_eq!(parse(&w(MAX_IO + 512, false), &s, MAX_IO, &[]).err(), Some((short, 0)));
        // A read's data goes by C2HData: never in the capsule, never a shorter buffer.
        let r = |len, ic| with_sgl(sqe::read(1, 0, 8), len, ic);
        assert!(matches!(
            parse(&r(4096, false), &s, MAX_IO, &[]),
            Ok(IoCmd { data: DataIn::None, .. })
        ));
        let in_capsule = Status::SGL_DESCRIPTOR_TYPE_INVALID.with_dnr();
        assert_eq!(parse(&r(4096, true), &s, MAX_IO, &[]).err(), Some((in_capsule, 0)));
        assert_eq!(parse(&r(512, false), &s, MAX_IO, &[]).err(), Some((short, 0)));
        // Out of range: the LBA goes to the error log.
        let oor = Status::LBA_OUT_OF_RANGE.with_dnr();
        assert_eq!(
            parse(&with_sgl(sqe::read(1, 1020, 8), 4096, false), &s, MAX_IO, &[]).err(),
            Some((oor, 1020))
        );
        // A flush of every namespace, with no volatile cache: nothing to do.
        assert!(matches!(
            parse(&with_sgl(sqe::flush(u32::MAX), 0, false), &s, MAX_IO, &[]),
            Ok(IoCmd {
                io: Io::Flush { ns: None },
                ..
            })
        ));
    }

    #[test]
    fn a_namespace_masked_from_the_host_is_an_inactive_nsid_to_every_command() {
        let s = test_subsystem_masked(
            &[test_namespace(1, 1024), test_namespace(2, 1024)],
            &[],
            &[(2, &["nqn.a"])],
        );
        let (a, b) = (HostView::new(s.clone(), "nqn.a"), HostView::new(s, "nqn.b"));
        let inactive = Some(Status::INVALID_NAMESPACE.with_dnr());
        for op in [0x00, 0x01, 0x02, 0x05, 0x08, 0x09, 0x0C, 0x0D, 0x0E, 0x11, 0x15, 0x19] {
            let mut q = sqe::read(2, 0, 1);
            q.opcode = op;
            // As for an NSID that does not exist.
            assert_eq!(decode_io(&q, &b, MAX_IO).err(), inactive, "opcode {op:#x}, host b");
            q.nsid.set(3);
            assert_eq!(decode_io(&q, &b, MAX_IO).err(), inactive, "opcode {op:#x}, nsid 3");
            q.nsid.set(2);
            assert_ne!(decode_io(&q, &a, MAX_IO).err(), inactive, "opcode {op:#x}, host a");
        }
        // The unmasked namespace is everyone's.
        let r = with_sgl(sqe::read(1, 0, 8), 4096, false);
        assert!(parse(&r, &b, MAX_IO, &[]).is_ok());
        let r2 = with_sgl(sqe::read(2, 0, 8), 4096, false);
        assert_eq!(
            parse(&r2, &b, MAX_IO, &[]).err(),
            Some((Status::INVALID_NAMESPACE.with_dnr(), 0))
        );
        assert!(parse(&r2, &a, MAX_IO, &[]).is_ok());
    }

    #[test]
    fn the_decoder_accepts_todays_nvm_opcodes() {
        let s = subsystem();
        let accepted = [0x00, 0x01, 0x02, 0x05, 0x08, 0x09, 0x0C, 0x0D, 0x0E, 0x11, 0x15, 0x19];
        for op in 0..=255u8 {
            let mut q = sqe::read(1, 0, 1);
            q.opcode = op;
            let invalid = decode_io(&q, &s, MAX_IO).err() == Some(Status::INVALID_OPCODE.with_dnr());
            assert_eq!(invalid, !accepted.contains(&op), "opcode {op:#x}");
        }
    }

    #[test]
    fn dataset_management_maps_to_deallocate_only_with_the_attribute_and_blocks() {
        let s = subsystem();
        let ns = s.namespace(1).cloned().unwrap_or_else(|| panic!("namespace 1"));
        let range = |nlb: u32, slba: u64| {
            let mut b = [0u8; 16];
            b[4..8].copy_from_slice(&nlb.to_le_bytes());
            b[8..16].copy_from_slice(&slba.to_le_bytes());
            b
        };
        let data = [range(8, 0), range(0, 5), range(4, 100)].concat();
        let io = |deallocate| Io::DatasetManagement {
            ns: ns.clone(),
            ranges: 3,
            deallocate,
        };
        let op = block_op(&io(true), WriteData::Bytes(&data));
        assert!(matches!(op, Ok(Some(BlockOp::Deallocate { ranges: r })) if r == [(0, 4096), (51200, 2048)]));
        assert!(matches!(block_op(&io(false), WriteData::Bytes(&data)), Ok(None)));
        let beyond = range(8, 1020);
        assert_eq!(
            block_op(&io(true), WriteData::Bytes(&beyond)).err(),
            Some(Status::LBA_OUT_OF_RANGE.with_dnr())
        );
    }
}
