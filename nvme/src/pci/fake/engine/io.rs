//! The fake's NVM I/O commands over its RAM namespaces: Read, Write, Flush, Write Zeroes and
//! Copy.

use std::sync::atomic::Ordering;

use super::Engine;
use crate::pci::dma::PAGE_SIZE;
use crate::pci::fake::{FakeCopyLimits, Ram};
use crate::pci::queue::COPY_ENTRY;
use crate::spec::{Sqe, Status, opcode, sct};

/// Command Size Limit Exceeded (NVM Command Set 1.0 §3.2.2, SCT 1h SC 83h).
pub const COMMAND_SIZE_LIMIT_EXCEEDED: Status = Status::new(sct::COMMAND_SPECIFIC, 0x83);

impl Engine {
    pub(super) fn io(&mut self, sqe: &Sqe) -> Status {
        let nsid = sqe.nsid.get();
        let slba = u64::from(sqe.cdw10.get()) | u64::from(sqe.cdw11.get()) << 32;
        let nlb = u64::from(sqe.cdw12.get() & 0xFFFF) + 1;
        let mut ram = self.inner.ram();
        let Some(r) = ram.iter_mut().find(|r| r.ns.nsid == nsid) else {
            return if sqe.opcode == opcode::io::FLUSH && nsid == u32::MAX {
                Status::SUCCESS
            } else {
                Status::INVALID_NAMESPACE
            };
        };
        if sqe.opcode == opcode::io::FLUSH {
            return Status::SUCCESS;
        }
        if sqe.opcode == opcode::io::COPY {
            return match self.inner.cfg.copy {
                Some(limits) => self.copy(sqe, r, limits),
                None => Status::INVALID_OPCODE.with_dnr(),
            };
        }
        if !matches!(
            sqe.opcode,
            opcode::io::READ | opcode::io::WRITE | opcode::io::WRITE_ZEROES
        ) {
            return Status::INVALID_OPCODE.with_dnr();
        }
        if slba.checked_add(nlb).is_none_or(|e| e > r.ns.blocks) {
            return Status::LBA_OUT_OF_RANGE.with_dnr();
        }
        let off = (slba << r.ns.lba_shift) as usize;
        let len = (nlb << r.ns.lba_shift) as usize;
        if sqe.opcode == opcode::io::WRITE_ZEROES {
            r.data[off..off + len].fill(0);
            return Status::SUCCESS;
        }
        let mdts = self.inner.cfg.mdts;
        if mdts != 0 && len > PAGE_SIZE << mdts {
            return Status::INVALID_FIELD.with_dnr();
        }
        let data = &mut r.data[off..off + len];
        let (status, moved) = if sqe.opcode == opcode::io::READ {
            (self.transfer_out(sqe, data), &self.inner.bytes_read)
        } else {
            (self.transfer_in(sqe, data), &self.inner.bytes_written)
        };
        if status != Status::SUCCESS {
            return status;
        }
        moved.fetch_add(len as u64, Ordering::Relaxed);
        Status::SUCCESS
    }
}

impl Engine {
    /// Copy (NVM Command Set 1.0 §3.2.2), source range format 0: the entries are read from
    /// host memory (PRP1/PRP2), checked (the count against MSRC, each range against the
    /// namespace and MSSRL, the total against MCL, the destination against the namespace),
    /// every source read before the destination is written (a destination overlapping a
    /// source gets the source as it was). A refused Copy changes nothing.
    fn copy(&self, sqe: &Sqe, r: &mut Ram, limits: FakeCopyLimits) -> Status {
        let cdw12 = sqe.cdw12.get();
        if (cdw12 >> 8) & 0xF != 0 {
            return Status::INVALID_FIELD.with_dnr();
        }
        let nr = (cdw12 & 0xFF) as usize + 1;
        if nr > usize::from(limits.msrc) + 1 {
            return COMMAND_SIZE_LIMIT_EXCEEDED.with_dnr();
        }
        let mut entries = vec![0u8; nr * COPY_ENTRY];
        let read = self.transfer_in(sqe, &mut entries);
        if read != Status::SUCCESS {
            return read;
        }
        let shift = r.ns.lba_shift;
        let mut total = 0u64;
        let mut ranges = Vec::with_capacity(nr);
        for e in entries.chunks_exact(COPY_ENTRY) {
            let slba = u64::from_le_bytes([e[8], e[9], e[10], e[11], e[12], e[13], e[14], e[15]]);
            let nlb = u64::from(u16::from_le_bytes([e[16], e[17]])) + 1;
            if slba.checked_add(nlb).is_none_or(|end| end > r.ns.blocks) {
                return Status::LBA_OUT_OF_RANGE.with_dnr();
            }
            if nlb > u64::from(limits.mssrl) {
                return COMMAND_SIZE_LIMIT_EXCEEDED.with_dnr();
            }
            total += nlb;
            ranges.push((slba, nlb));
        }
        if total > u64::from(limits.mcl) {
            return COMMAND_SIZE_LIMIT_EXCEEDED.with_dnr();
        }
        let sdlba = u64::from(sqe.cdw10.get()) | u64::from(sqe.cdw11.get()) << 32;
        if sdlba.checked_add(total).is_none_or(|end| end > r.ns.blocks) {
            return Status::LBA_OUT_OF_RANGE.with_dnr();
        }
        let mut data = Vec::with_capacity((total << shift) as usize);
        for (slba, nlb) in ranges {
            let (off, len) = ((slba << shift) as usize, (nlb << shift) as usize);
            data.extend_from_slice(&r.data[off..off + len]);
        }
        let dst = (sdlba << shift) as usize;
        r.data[dst..dst + data.len()].copy_from_slice(&data);
        self.inner.bytes_written.fetch_add(data.len() as u64, Ordering::Relaxed);
        self.inner.copy_commands.fetch_add(1, Ordering::Relaxed);
        Status::SUCCESS
    }
}
