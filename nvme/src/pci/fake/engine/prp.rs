//! The fake's data transfers: walking PRP1/PRP2 and PRP lists through its IOVA space, and
//! copying a command's data out to host memory and in from it.

use super::Engine;
use crate::pci::Result;
use crate::pci::dma::PAGE_SIZE;
use crate::pci::fake::PRP_OFFSET_INVALID;
use crate::spec::{Sqe, Status};

impl Engine {
    /// Walks PRP1/PRP2 (and PRP lists) for `len` bytes (NVMe 2.0 §4.1.1): the host memory segments.
    pub(super) fn prp_segments(&self, sqe: &Sqe, len: usize) -> Result<Vec<(u64, usize)>, Status> {
        let ps = PAGE_SIZE as u64;
        let (prp1, prp2) = (sqe.prp1(), sqe.prp2());
        if prp1 & 3 != 0 {
            return Err(PRP_OFFSET_INVALID);
        }
        let first = len.min((ps - prp1 % ps) as usize);
        let mut segs = vec![(prp1, first)];
        let mut remaining = len - first;
        if remaining == 0 {
            return Ok(segs);
        }
        if remaining <= PAGE_SIZE {
            if prp2 % ps != 0 {
                return Err(PRP_OFFSET_INVALID);
            }
            segs.push((prp2, remaining));
            return Ok(segs);
        }
        let mut list = prp2;
        if list & 7 != 0 {
            return Err(PRP_OFFSET_INVALID);
        }
        let space = self.inner.dma.lock();
        while remaining > 0 {
            let entry = space.read_u64(list).ok_or(Status::DATA_TRANSFER_ERROR)?;
            let last_slot = list % ps == ps - 8;
            if last_slot && remaining > PAGE_SIZE {
                // The last entry of a list page points to the next list page.
                if entry % ps != 0 {
                    return Err(PRP_OFFSET_INVALID);
                }
                list = entry;
                continue;
            }
            if entry % ps != 0 {
                return Err(PRP_OFFSET_INVALID);
            }
            let n = remaining.min(PAGE_SIZE);
            segs.push((entry, n));
            remaining -= n;
            list += 8;
        }
        Ok(segs)
    }

    /// Copy `data` to the host memory the command's PRPs name (a Read's data, a log page).
    pub(super) fn transfer_out(&self, sqe: &Sqe, data: &[u8]) -> Status {
        let segs = match self.prp_segments(sqe, data.len()) {
            Ok(s) => s,
            Err(s) => return s,
        };
        let space = self.inner.dma.lock();
        let mut done = 0;
        for (iova, n) in segs {
            if !space.write(iova, &data[done..done + n]) {
                return Status::DATA_TRANSFER_ERROR;
            }
            done += n;
        }
        Status::SUCCESS
    }

    /// Fill `data` from the host memory the command's PRPs name (a Write's data, a Copy's
    /// source range entries).
    pub(super) fn transfer_in(&self, sqe: &Sqe, data: &mut [u8]) -> Status {
        let segs = match self.prp_segments(sqe, data.len()) {
            Ok(s) => s,
            Err(s) => return s,
        };
        let space = self.inner.dma.lock();
        let mut done = 0;
        for (iova, n) in segs {
            if !space.read(iova, &mut data[done..done + n]) {
                return Status::DATA_TRANSFER_ERROR;
            }
            done += n;
        }
        Status::SUCCESS
    }
}
