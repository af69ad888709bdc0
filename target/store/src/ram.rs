//! The RAM backend: a namespace whose data is a [`RamDisk`] (the memory, its fill and its
//! hand-over are [`crate::region`]'s), every command completed inline on the reactor that
//! received it.

use std::any::Any;

use pollux_nvme::spec::Status;

use crate::error::StoreError;
pub use crate::region::RamDisk;
use crate::{Backend, BlockOp, Caps, Channel, ChannelEnv, ChannelNs, WriteData};

impl RamDisk {
    /// Apply a write-side operation to the memory (a RAM namespace inline, a simulated SSD
    /// at submission: its data is visible at once, its completion comes later). Reads and
    /// flushes change nothing: a read's data is sent from the memory, and there is no
    /// volatile cache to flush.
    #[inline]
    pub fn apply(&self, op: &BlockOp<'_>) -> Status {
        match op {
            BlockOp::Write {
                off,
                data: WriteData::Bytes(b),
                ..
            } => self.write(*off, b),
            // DMA buffers come from NVMe channels only.
            BlockOp::Write { .. } => return Status::INTERNAL_ERROR,
            BlockOp::WriteZeroes { off, len } => self.zero(*off, *len),
            BlockOp::Deallocate { ranges } => ranges.iter().for_each(|&(off, len)| self.zero(off, len)),
            BlockOp::Read { .. } | BlockOp::Flush => {}
            // No copy offload (Caps::copy_offload): a Copy is read and written through pollux.
            BlockOp::Copy { .. } | BlockOp::CompareAndWrite { .. } => return Status::INTERNAL_ERROR,
        }
        Status::SUCCESS
    }
}

/// A RAM namespace: every command completes inline, on the reactor that received it.
impl Backend for RamDisk {
    fn kind(&self) -> &'static str {
        "ram"
    }

    fn len(&self) -> u64 {
        RamDisk::len(self)
    }

    fn io_path(&self) -> &'static str {
        "inline"
    }

    fn memory(&self) -> Option<&RamDisk> {
        Some(self)
    }

    fn caps(&self) -> Caps {
        Caps {
            inline_reads: true,
            ..Caps::default()
        }
    }

    fn run_inline(&self, op: &BlockOp<'_>) -> Option<Status> {
        Some(self.apply(op))
    }

    fn open_channel(&self, ns: ChannelNs, env: &ChannelEnv) -> Result<Box<dyn Channel>, StoreError> {
        Err(StoreError::Channel {
            nsid: ns.nsid,
            reactor: env.reactor,
            reason: "a RAM namespace completes inline and has no channel".into(),
        })
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
