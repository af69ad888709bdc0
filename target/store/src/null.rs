//! The null backend (SPDK's null bdev): no store at all. Writes are discarded, reads return
//! zeroes, Write Zeroes, Deallocate and Flush succeed at once: what is left of a command's
//! cost is the target's own (parsing, the transport, the reactor), which is what a benchmark
//! of the target wants to see.
//!
//! A read's zeroes are sent in place, as a RAM namespace's data is (see pollux-link's `sendq`), from
//! one window of untouched anonymous memory per namespace: every read starts at its
//! beginning, so the only pages the kernel ever maps there are its shared zero page (huge
//! zero page with THP), whatever the namespace's size, and no command fills a buffer.

use std::any::Any;

use pollux_nvme::spec::Status;

use super::{Backend, BlockOp, Caps, Channel, ChannelEnv, ChannelNs, RamDisk, ReadData};
use crate::error::StoreError;

/// The largest read a null namespace may serve at once: the conf's largest `max_io_size`.
const MAX_READ: u64 = 2 << 30;

/// A null namespace of `len` bytes.
#[derive(Debug)]
pub struct NullDisk {
    len: u64,
    /// Never written: reads as zeroes, and no page of it is committed.
    zeroes: RamDisk,
}

impl NullDisk {
    /// A null namespace of `len` bytes (> 0, a multiple of 8, as the conf's block sizes
    /// make it). Maps address space for its zeroes, not memory.
    pub fn new(len: u64) -> std::io::Result<Self> {
        let zeroes = RamDisk::anonymous(len.min(MAX_READ))?;
        Ok(Self { len, zeroes })
    }
}

impl Backend for NullDisk {
    fn kind(&self) -> &'static str {
        "null"
    }

    fn len(&self) -> u64 {
        self.len
    }

    fn io_path(&self) -> &'static str {
        "inline"
    }

    fn caps(&self) -> Caps {
        Caps {
            inline_reads: true,
            ..Caps::default()
        }
    }

    fn read_in_place(&self, _off: u64) -> Option<ReadData<'_>> {
        Some(ReadData::Ram(&self.zeroes, 0))
    }

    fn run_inline(&self, op: &BlockOp<'_>) -> Option<Status> {
        Some(match op {
            BlockOp::Read { .. }
            | BlockOp::Write { .. }
            | BlockOp::WriteZeroes { .. }
            | BlockOp::Deallocate { .. }
            | BlockOp::Flush => Status::SUCCESS,
            // Neither is offered (Caps::copy_offload, Caps::compare_and_write): pollux reads
            // (zeroes) and writes (nothing) for them.
            BlockOp::Copy { .. } | BlockOp::CompareAndWrite { .. } => Status::INTERNAL_ERROR,
        })
    }

    fn open_channel(&self, ns: ChannelNs, env: &ChannelEnv) -> Result<Box<dyn Channel>, StoreError> {
        Err(StoreError::Channel {
            nsid: ns.nsid,
            reactor: env.reactor,
            reason: "a null namespace completes inline and has no channel".into(),
        })
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_vanish_and_reads_are_zeroes_from_one_window() {
        let d = NullDisk::new(1 << 40).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(d.len(), 1 << 40);
        let data = [0xa5u8; 4096];
        let write = BlockOp::Write {
            off: (1 << 40) - 4096,
            data: super::super::WriteData::Bytes(&data),
            fua: true,
        };
        assert_eq!(d.run_inline(&write), Some(Status::SUCCESS));
        assert_eq!(d.run_inline(&BlockOp::Flush), Some(Status::SUCCESS));
        assert_eq!(
            d.run_inline(&BlockOp::WriteZeroes { off: 0, len: 1 << 40 }),
            Some(Status::SUCCESS)
        );
        // Wherever it reads, a read is the same zeroes.
        let (a, b) = (d.read_in_place(0), d.read_in_place((1 << 40) - 4096));
        for r in [a, b] {
            let mut out = b"hdr".to_vec();
            r.unwrap_or_else(|| panic!("no data")).append_to(4096, &mut out);
            assert_eq!(&out[..3], b"hdr");
            assert!(out[3..].iter().all(|&x| x == 0) && out.len() == 3 + 4096);
        }
        // The window is no larger than a read can be.
        assert_eq!(d.zeroes.len(), MAX_READ);
    }
}
