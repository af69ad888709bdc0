//! The fake's [`Hardware`](crate::pci::Hardware) seam: the BAR0 registers, the DMA allocator
//! and the MSI-X interrupts the driver is handed, as views onto the controller's state.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use vmm_sys_util::eventfd::EventFd;

use super::Inner;
use super::iova::DmaSpace;
use crate::pci::Result;
use crate::pci::dma::{DmaAllocator, DmaRegion, DmaUnmap, HostMemory, alloc_iova};
use crate::pci::irq::Interrupts;
use crate::pci::regs::{RegisterAccess, offset};

pub(super) struct FakeBar(pub(super) Arc<Inner>);

impl RegisterAccess for FakeBar {
    fn read32(&self, off: usize) -> u32 {
        match off {
            offset::CAP => self.0.cap as u32,
            o if o == offset::CAP + 4 => (self.0.cap >> 32) as u32,
            _ => self.0.reg(off),
        }
    }

    fn write32(&self, off: usize, value: u32) {
        match off {
            // Read-only registers.
            offset::CAP | 0x04 | offset::VS | offset::CSTS => return,
            o if o >= offset::DOORBELLS => {
                let stride = 4usize << self.0.cfg.dstrd;
                let idx = (o - offset::DOORBELLS) / stride;
                if idx.is_multiple_of(2) && idx > 0 {
                    self.0.io_sq_doorbells.fetch_add(1, Ordering::Relaxed);
                }
            }
            _ => {}
        }
        self.0.set_reg(off, value);
        self.0.wake();
    }
}

pub(super) struct FakeDma(pub(super) Arc<DmaSpace>);

impl DmaAllocator for FakeDma {
    fn allocate(&self, len: usize) -> Result<DmaRegion> {
        let mem = HostMemory::new(len)?;
        let iova = alloc_iova(&self.0.iova, &mem)?;
        self.0.lock().map.insert(iova, (mem.as_ptr() as usize, mem.len()));
        let unmap: Arc<dyn DmaUnmap> = self.0.clone();
        Ok(DmaRegion::new(mem, iova, Some(unmap)))
    }
}

pub(super) struct FakeIrqs(pub(super) Arc<Inner>);

impl Interrupts for FakeIrqs {
    fn max_vectors(&self) -> u16 {
        self.0.cfg.vectors
    }
    fn enable(&self, count: u16) -> Result<Vec<Arc<EventFd>>> {
        let fds = crate::pci::irq::eventfds(count.min(self.0.cfg.vectors), "fake")?;
        *self.0.irqs.lock().unwrap_or_else(|p| p.into_inner()) = fds.clone();
        Ok(fds)
    }
    fn disable(&self) -> Result<()> {
        self.0.irqs.lock().unwrap_or_else(|p| p.into_inner()).clear();
        Ok(())
    }
}
