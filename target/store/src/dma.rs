//! The DMA buffers a channel lends: power-of-two size classes from 4 KiB ([`DmaShelf`]),
//! each buffer going back to its class when dropped ([`PooledDma`], [`crate::pool`]) —
//! whether its write ran, was aborted, or its connection closed while its data came. One
//! channel's buffers, on its reactor: no lock.

use pollux_nvme::pci::{self, DmaBuf};

use crate::pool::{Pool, Pooled, Shelf};

/// A DMA buffer lent by a channel's [`DmaPool`]. DMA memory is only touched through
/// [`DmaBuf`]'s volatile accesses.
pub type PooledDma = Pooled<DmaShelf>;

/// A channel's pool of DMA buffers.
pub type DmaPool = Pool<DmaShelf>;

/// The free DMA buffers of a channel, by size class. It keeps every buffer (a channel's DMA
/// memory grows with the most data it had in flight, not with the I/O done, and is the
/// device's until the channel goes).
#[derive(Debug, Default)]
pub struct DmaShelf {
    free: Vec<Vec<DmaBuf>>,
}

impl DmaShelf {
    /// The size class of `len` bytes: (its size, its index).
    pub fn class(len: usize) -> (usize, usize) {
        let size = len.max(pci::PAGE_SIZE).next_power_of_two();
        (size, (size.trailing_zeros() - pci::PAGE_SIZE.trailing_zeros()) as usize)
    }

    /// A free buffer of class `idx`, if one is kept.
    pub fn pop(&mut self, idx: usize) -> Option<DmaBuf> {
        self.free.get_mut(idx).and_then(Vec::pop)
    }

    /// Buffers kept.
    pub fn count(&self) -> usize {
        self.free.iter().map(Vec::len).sum()
    }
}

impl Shelf for DmaShelf {
    type Item = DmaBuf;

    fn keep(&mut self, b: DmaBuf) {
        let (_, idx) = Self::class(b.len());
        if self.free.len() <= idx {
            self.free.resize_with(idx + 1, Vec::new);
        }
        self.free[idx].push(b);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use pollux_nvme::pci::DmaRegion;
    use pollux_nvme::pci::dma::HostMemory;

    use super::*;

    #[test]
    fn a_dropped_dma_buffer_is_back_in_its_size_class() {
        let mem = HostMemory::new(64 << 10).expect("anonymous memory");
        let region = Arc::new(DmaRegion::new(mem, 0x1_0000, None));
        let pool = DmaPool::default();
        let (_, idx) = DmaShelf::class(8192);
        let b = pool.lend(DmaBuf::new(region.clone(), 0, 8192).expect("in the region"));
        assert_eq!(pool.with(|s| s.count()), Some(0));
        drop(b);
        assert_eq!(pool.with(|s| s.count()), Some(1));
        let back = pool.with(|s| s.pop(idx)).flatten().expect("kept in its class");
        assert_eq!((back.offset(), back.len()), (0, 8192));
        assert!(pool.with(|s| s.pop(DmaShelf::class(4096).1)).flatten().is_none());
    }
}
