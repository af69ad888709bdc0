//! BAR0 access and the typed controller registers (NVMe 2.0 §3.1.3, Figure 33;
//! doorbells NVMe 2.0 §3.1.4, Figure 55).

use std::sync::Arc;

use crate::spec::{Cap, Cc, Csts};

/// Register offsets in BAR0 (NVMe 2.0 §3.1.3, Figure 33).
pub mod offset {
    /// Controller Capabilities (8 bytes).
    pub const CAP: usize = 0x00;
    /// Version.
    pub const VS: usize = 0x08;
    /// Interrupt Mask Set.
    pub const INTMS: usize = 0x0C;
    /// Interrupt Mask Clear.
    pub const INTMC: usize = 0x10;
    /// Controller Configuration.
    pub const CC: usize = 0x14;
    /// Controller Status.
    pub const CSTS: usize = 0x1C;
    /// NVM Subsystem Reset.
    pub const NSSR: usize = 0x20;
    /// Admin Queue Attributes.
    pub const AQA: usize = 0x24;
    /// Admin Submission Queue Base Address (8 bytes).
    pub const ASQ: usize = 0x28;
    /// Admin Completion Queue Base Address (8 bytes).
    pub const ACQ: usize = 0x30;
    /// First doorbell (SQ 0 tail).
    pub const DOORBELLS: usize = 0x1000;
}

/// Offset of submission queue `qid`'s tail doorbell: 1000h + (2y × (4 << CAP.DSTRD)) (NVMe 2.0 §3.1.4).
pub const fn sq_tail_doorbell(qid: u16, dstrd: u8) -> usize {
    offset::DOORBELLS + (2 * qid as usize) * (4usize << dstrd)
}

/// Offset of completion queue `qid`'s head doorbell: 1000h + ((2y + 1) × (4 << CAP.DSTRD)).
pub const fn cq_head_doorbell(qid: u16, dstrd: u8) -> usize {
    offset::DOORBELLS + (2 * qid as usize + 1) * (4usize << dstrd)
}

/// Reads and writes of BAR0 at byte offsets: the seam between the driver and the hardware.
///
/// Implementations: a VFIO mmap of BAR0 (volatile accesses to device memory) and the fake
/// controller's registers (atomics). Accesses are 32-bit aligned (NVMe 2.0 §3.1.3: registers are
/// accessed in their natural width or as 32-bit halves).
pub trait RegisterAccess: Send + Sync {
    /// Reads the 32-bit register at `offset`.
    fn read32(&self, offset: usize) -> u32;
    /// Writes the 32-bit register at `offset`.
    fn write32(&self, offset: usize, value: u32);
    /// Reads the 64-bit register at `offset` as two 32-bit reads, low half first (NVMe 2.0 §3.1.3:
    /// "a 64-bit register may be read as two 32-bit accesses").
    fn read64(&self, offset: usize) -> u64 {
        let lo = u64::from(self.read32(offset));
        let hi = u64::from(self.read32(offset + 4));
        (hi << 32) | lo
    }
    /// Writes the 64-bit register at `offset` as two 32-bit writes, low half first.
    fn write64(&self, offset: usize, value: u64) {
        self.write32(offset, value as u32);
        self.write32(offset + 4, (value >> 32) as u32);
    }
}

/// The typed register layer over a [`RegisterAccess`].
#[derive(Clone)]
pub struct Registers {
    bar: Arc<dyn RegisterAccess>,
    dstrd: u8,
}

impl Registers {
    /// Registers over `bar`; the doorbell stride is read from CAP.DSTRD.
    pub fn new(bar: Arc<dyn RegisterAccess>) -> Self {
        let dstrd = Cap(bar.read64(offset::CAP)).dstrd();
        Self { bar, dstrd }
    }

    /// The raw BAR.
    pub fn bar(&self) -> &Arc<dyn RegisterAccess> {
        &self.bar
    }

    /// CAP.DSTRD as read at creation.
    pub fn dstrd(&self) -> u8 {
        self.dstrd
    }

    /// Controller Capabilities (NVMe 2.0 §3.1.3.1).
    pub fn cap(&self) -> Cap {
        Cap(self.bar.read64(offset::CAP))
    }

    /// Version (NVMe 2.0 §3.1.3.2), raw.
    pub fn vs(&self) -> u32 {
        self.bar.read32(offset::VS)
    }

    /// Controller Configuration (NVMe 2.0 §3.1.3.5).
    pub fn cc(&self) -> Cc {
        Cc(self.bar.read32(offset::CC))
    }

    /// Writes CC.
    pub fn set_cc(&self, cc: Cc) {
        self.bar.write32(offset::CC, cc.0);
    }

    /// Controller Status (NVMe 2.0 §3.1.3.6).
    pub fn csts(&self) -> Csts {
        Csts(self.bar.read32(offset::CSTS))
    }

    /// Admin Queue Attributes (NVMe 2.0 §3.1.3.8): ACQS in bits 27:16, ASQS in 11:0, both 0's based.
    pub fn set_aqa(&self, sq_entries: u16, cq_entries: u16) {
        let v = ((u32::from(cq_entries) - 1) << 16) | (u32::from(sq_entries) - 1);
        self.bar.write32(offset::AQA, v);
    }

    /// Admin Submission Queue base (NVMe 2.0 §3.1.3.9, 4 KiB aligned).
    pub fn set_asq(&self, iova: u64) {
        self.bar.write64(offset::ASQ, iova);
    }

    /// Admin Completion Queue base (NVMe 2.0 §3.1.3.10, 4 KiB aligned).
    pub fn set_acq(&self, iova: u64) {
        self.bar.write64(offset::ACQ, iova);
    }

    /// The tail doorbell of SQ `qid` and the head doorbell of CQ `qid`.
    pub fn doorbells(&self, qid: u16) -> (Doorbell, Doorbell) {
        (
            Doorbell {
                bar: self.bar.clone(),
                offset: sq_tail_doorbell(qid, self.dstrd),
            },
            Doorbell {
                bar: self.bar.clone(),
                offset: cq_head_doorbell(qid, self.dstrd),
            },
        )
    }
}

/// One doorbell register.
#[derive(Clone)]
pub struct Doorbell {
    bar: Arc<dyn RegisterAccess>,
    offset: usize,
}

impl Doorbell {
    /// Writes the new tail (SQ) or head (CQ).
    ///
    /// A full fence comes first: the queue entries written to DMA memory must be visible to
    /// the device before it sees the doorbell (NVMe 2.0 §3.3.1.2).
    #[inline]
    pub fn ring(&self, value: u16) {
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        self.bar.write32(self.offset, u32::from(value));
    }

    /// The register's offset in BAR0.
    pub fn offset(&self) -> usize {
        self.offset
    }
}
