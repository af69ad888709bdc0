//! The fake's IOVA space: the IOVA -> host memory table its controller thread translates
//! DMA through, as an IOMMU would.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use vm_memory::VolatileSlice;

use crate::pci::dma::{DmaUnmap, IovaAllocator};

#[derive(Default)]
pub(super) struct Space {
    pub(super) map: BTreeMap<u64, (usize, usize)>,
}

/// The fake's IOVA space: IOVA -> host memory, as an IOMMU's page tables.
pub(super) struct DmaSpace {
    pub(super) space: Mutex<Space>,
    pub(super) iova: Mutex<IovaAllocator>,
}

impl DmaSpace {
    pub(super) fn lock(&self) -> MutexGuard<'_, Space> {
        self.space.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl DmaUnmap for DmaSpace {
    fn unmap(&self, iova: u64, len: usize) {
        self.lock().map.remove(&iova);
        self.iova
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .free(iova, len as u64);
    }
}

impl Space {
    /// Host address of `[iova, iova + len)` when one mapping holds it all.
    fn translate(&self, iova: u64, len: usize) -> Option<*mut u8> {
        let (&base, &(ptr, size)) = self.map.range(..=iova).next_back()?;
        let off = (iova - base) as usize;
        (off.checked_add(len)? <= size).then(|| (ptr + off) as *mut u8)
    }

    fn slice(&self, iova: u64, len: usize) -> Option<VolatileSlice<'_>> {
        let p = self.translate(iova, len)?;
        // SAFETY: translate() checked the range lies in a live mapping, which stays mapped
        // while the Space lock (borrowed by the result) is held: unmapping takes that lock
        // before the memory is freed. The access is volatile.
        Some(unsafe { VolatileSlice::new(p, len) })
    }

    pub(super) fn read(&self, iova: u64, out: &mut [u8]) -> bool {
        self.slice(iova, out.len()).map(|s| s.copy_to(out)).is_some()
    }

    pub(super) fn write(&self, iova: u64, data: &[u8]) -> bool {
        self.slice(iova, data.len()).map(|s| s.copy_from(data)).is_some()
    }

    pub(super) fn read_u64(&self, iova: u64) -> Option<u64> {
        let mut b = [0u8; 8];
        self.read(iova, &mut b).then(|| u64::from_le_bytes(b))
    }
}
