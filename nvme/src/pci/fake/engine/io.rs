//! The fake's NVM I/O commands over its RAM namespaces: Read, Write, Flush and Write Zeroes.

use super::Engine;
use crate::pci::dma::PAGE_SIZE;
use crate::spec::{Sqe, Status, opcode};

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
        let segs = match self.prp_segments(sqe, len) {
            Ok(s) => s,
            Err(s) => return s,
        };
        let space = self.inner.dma.lock();
        let mut done = off;
        for (iova, n) in segs {
            let ok = if sqe.opcode == opcode::io::READ {
                space.write(iova, &r.data[done..done + n])
            } else {
                space.read(iova, &mut r.data[done..done + n])
            };
            if !ok {
                return Status::DATA_TRANSFER_ERROR;
            }
            done += n;
        }
        let moved = if sqe.opcode == opcode::io::READ {
            &self.inner.bytes_read
        } else {
            &self.inner.bytes_written
        };
        moved.fetch_add(len as u64, std::sync::atomic::Ordering::Relaxed);
        Status::SUCCESS
    }
}
