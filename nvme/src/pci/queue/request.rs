//! What a queue pair takes and gives back: the block I/O request, its completion, the
//! reason a request was not taken, and the queue's counters.

use std::time::{Duration, Instant};

use crate::pci::Namespace;
use crate::pci::dma::DmaBuf;
use crate::spec::{Status, opcode};

/// Why a queue did not take a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QueueError {
    /// Not enough free command slots now; retry after completions.
    #[error("queue full: {needed} command(s) needed, {free} free")]
    Full {
        /// Commands the request needs.
        needed: usize,
        /// Free command slots.
        free: usize,
    },
    /// The controller is being reset; the queue takes commands again once it is recreated.
    #[error("the controller is resetting")]
    Resetting,
    /// The request can never fit: it needs more commands than the queue has slots.
    #[error("request needs {needed} commands, the queue holds {depth}")]
    TooLarge {
        /// Commands needed.
        needed: usize,
        /// Queue capacity in commands.
        depth: usize,
    },
    /// A malformed request.
    #[error("invalid request: {0}")]
    Invalid(&'static str),
}

/// A request the queue did not take, handed back with the reason.
#[derive(Debug)]
pub struct Rejected {
    /// Why.
    pub error: QueueError,
    /// The request.
    pub request: Box<IoRequest>,
}

/// A block I/O request on one namespace.
#[derive(Clone, Debug)]
pub struct IoRequest {
    /// NVM command set opcode (Read, Write, Flush, Write Zeroes, Copy).
    pub opcode: u8,
    /// Namespace.
    pub nsid: u32,
    /// log2 of the namespace's LBA data size.
    pub lba_shift: u8,
    /// First LBA (Copy: the destination, SDLBA).
    pub slba: u64,
    /// Number of LBAs (1-based); for Copy, the number of source range entries in `buf`.
    pub blocks: u64,
    /// The data buffer (Read/Write), `blocks << lba_shift` bytes; for Copy its source range
    /// entries (format 0, 32 bytes each) within one page, so that PRP1 alone names them.
    pub buf: Option<DmaBuf>,
    /// Returned in the completion.
    pub tag: u64,
    /// Flag bits OR-ed into CDW12 of each of its commands: FUA (bit 30) for Read/Write, DEAC
    /// (bit 25) for Write Zeroes (NVM Command Set 1.0 §3.2.4, §3.2.8). The NLB field
    /// (bits 15:0) is the queue's.
    pub cdw12_flags: u32,
}

impl IoRequest {
    /// Read `buf.len()` bytes from `slba` into `buf`.
    pub fn read(ns: &Namespace, slba: u64, buf: DmaBuf, tag: u64) -> Self {
        Self::data(opcode::io::READ, ns, slba, buf, tag)
    }

    /// Write `buf` at `slba`.
    pub fn write(ns: &Namespace, slba: u64, buf: DmaBuf, tag: u64) -> Self {
        Self::data(opcode::io::WRITE, ns, slba, buf, tag)
    }

    fn data(opcode: u8, ns: &Namespace, slba: u64, buf: DmaBuf, tag: u64) -> Self {
        let blocks = (buf.len() >> ns.lba_shift) as u64;
        Self {
            opcode,
            nsid: ns.nsid,
            lba_shift: ns.lba_shift,
            slba,
            blocks,
            buf: Some(buf),
            tag,
            cdw12_flags: 0,
        }
    }

    /// Flush the namespace's volatile write cache.
    pub fn flush(ns: &Namespace, tag: u64) -> Self {
        Self {
            opcode: opcode::io::FLUSH,
            nsid: ns.nsid,
            lba_shift: ns.lba_shift,
            slba: 0,
            blocks: 0,
            buf: None,
            tag,
            cdw12_flags: 0,
        }
    }

    /// Copy (NVM Command Set 1.0 §3.2.2) the `ranges` source range entries (format 0) at the
    /// start of `entries` to `sdlba`: one command, the device moves the data itself.
    pub fn copy(ns: &Namespace, sdlba: u64, entries: DmaBuf, ranges: u32, tag: u64) -> Self {
        Self {
            opcode: opcode::io::COPY,
            nsid: ns.nsid,
            lba_shift: ns.lba_shift,
            slba: sdlba,
            blocks: u64::from(ranges),
            buf: Some(entries),
            tag,
            cdw12_flags: 0,
        }
    }

    /// Write Zeroes over `blocks` LBAs from `slba`.
    pub fn write_zeroes(ns: &Namespace, slba: u64, blocks: u64, tag: u64) -> Self {
        Self {
            opcode: opcode::io::WRITE_ZEROES,
            nsid: ns.nsid,
            lba_shift: ns.lba_shift,
            slba,
            blocks,
            buf: None,
            tag,
            cdw12_flags: 0,
        }
    }
}

/// A finished request.
#[derive(Debug)]
pub struct Completion {
    /// The request's tag.
    pub tag: u64,
    /// Success, or the first error status of its commands ([`crate::pci::HOST_ABORTED`] when the
    /// host gave up on it: reset, timeout).
    pub status: Status,
    /// CQE DW0 of its (last) command.
    pub result: u32,
    /// When it was submitted.
    pub submitted: Instant,
    /// Submission to completion (as seen by the poll that found it).
    pub latency: Duration,
    /// The data buffer, handed back.
    pub buf: Option<DmaBuf>,
    /// How many commands it took (more than 1 when split by MDTS).
    pub commands: u16,
}

/// Counters of a queue pair.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Requests taken.
    pub requests: u64,
    /// Commands written to the SQ.
    pub commands: u64,
    /// Requests completed (including failed ones).
    pub completed: u64,
    /// SQ tail doorbell writes.
    pub sq_doorbells: u64,
    /// CQ head doorbell writes.
    pub cq_doorbells: u64,
    /// Commands that exceeded the command timeout.
    pub timeouts: u64,
}
