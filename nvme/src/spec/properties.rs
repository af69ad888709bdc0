//! Controller properties (NVMe 2.0 §3.1.3; NVMe-oF Property Get/Set): their offsets
//! and the CAP, VS, CC and CSTS values.

use crate::bindings::nvme_register_offsets as reg;

// ---------------------------------------------------------------------------------------------
// Controller properties (NVMe 2.0 §3.1.3; NVMe-oF Property Get/Set)
// ---------------------------------------------------------------------------------------------

/// Controller property offsets (NVMe 2.0 §3.1.3, Figure 33).
pub mod property {
    use super::reg;
    /// Controller Capabilities (8 bytes).
    pub const CAP: u32 = reg::NVME_REG_CAP;
    /// Version (4 bytes).
    pub const VS: u32 = reg::NVME_REG_VS;
    /// Controller Configuration (4 bytes).
    pub const CC: u32 = reg::NVME_REG_CC;
    /// Controller Status (4 bytes).
    pub const CSTS: u32 = reg::NVME_REG_CSTS;
    /// NVM Subsystem Reset (4 bytes).
    pub const NSSR: u32 = reg::NVME_REG_NSSR;

    /// Width in bytes of the property at `offset` (4 or 8), `None` for an offset a fabrics
    /// controller does not define. Property Get's ATTRIB bit 0 must match (1 = 8 bytes).
    pub const fn size(offset: u32) -> Option<u8> {
        match offset {
            CAP => Some(8),
            VS | CC | CSTS | NSSR => Some(4),
            _ => None,
        }
    }
}

const fn field32(v: u32, shift: u32, width: u32) -> u32 {
    (v >> shift) & ((1 << width) - 1)
}

const fn set32(v: u32, shift: u32, width: u32, x: u32) -> u32 {
    let mask = ((1u32 << width) - 1) << shift;
    (v & !mask) | ((x << shift) & mask)
}

const fn field64(v: u64, shift: u32, width: u32) -> u64 {
    (v >> shift) & ((1 << width) - 1)
}

const fn set64(v: u64, shift: u32, width: u32, x: u64) -> u64 {
    let mask = ((1u64 << width) - 1) << shift;
    (v & !mask) | ((x << shift) & mask)
}

/// Controller Capabilities (CAP, NVMe 2.0 §3.1.3.1, Figure 36).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Cap(pub u64);

impl Cap {
    /// CAP.CSS bit 0 (bit 37): NVM command set.
    pub const CSS_NVM: u8 = 1 << 0;
    /// CAP.CSS bit 6 (bit 43): one or more I/O command sets.
    pub const CSS_IO_COMMAND_SETS: u8 = 1 << 6;
    /// CAP.CSS bit 7 (bit 44): no I/O command set (admin only / discovery).
    pub const CSS_NO_IO: u8 = 1 << 7;

    /// Maximum Queue Entries Supported, 0's based (bits 15:0).
    pub const fn mqes(self) -> u16 {
        field64(self.0, 0, 16) as u16
    }
    /// Sets MQES (0's based).
    pub const fn with_mqes(self, mqes: u16) -> Self {
        Self(set64(self.0, 0, 16, mqes as u64))
    }
    /// Contiguous Queues Required (bit 16).
    pub const fn cqr(self) -> bool {
        field64(self.0, 16, 1) != 0
    }
    /// Sets CQR.
    pub const fn with_cqr(self, cqr: bool) -> Self {
        Self(set64(self.0, 16, 1, cqr as u64))
    }
    /// Arbitration Mechanism Supported (bits 18:17).
    pub const fn ams(self) -> u8 {
        field64(self.0, 17, 2) as u8
    }
    /// Timeout in 500 ms units (bits 31:24).
    pub const fn to(self) -> u8 {
        field64(self.0, 24, 8) as u8
    }
    /// Sets TO (500 ms units).
    pub const fn with_to(self, to: u8) -> Self {
        Self(set64(self.0, 24, 8, to as u64))
    }
    /// Doorbell Stride (bits 35:32).
    pub const fn dstrd(self) -> u8 {
        field64(self.0, 32, 4) as u8
    }
    /// Command Sets Supported (bits 44:37); see `CSS_*`.
    pub const fn css(self) -> u8 {
        field64(self.0, 37, 8) as u8
    }
    /// Sets CSS (bits 44:37).
    pub const fn with_css(self, css: u8) -> Self {
        Self(set64(self.0, 37, 8, css as u64))
    }
    /// Memory Page Size Minimum, 2^(12 + MPSMIN) (bits 51:48).
    pub const fn mpsmin(self) -> u8 {
        field64(self.0, 48, 4) as u8
    }
    /// Sets MPSMIN.
    pub const fn with_mpsmin(self, mpsmin: u8) -> Self {
        Self(set64(self.0, 48, 4, mpsmin as u64))
    }
    /// Memory Page Size Maximum, 2^(12 + MPSMAX) (bits 55:52).
    pub const fn mpsmax(self) -> u8 {
        field64(self.0, 52, 4) as u8
    }
    /// Sets MPSMAX.
    pub const fn with_mpsmax(self, mpsmax: u8) -> Self {
        Self(set64(self.0, 52, 4, mpsmax as u64))
    }
}

/// Version (VS, NVMe 2.0 §3.1.3.2): major (31:16), minor (15:8), tertiary (7:0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Vs(pub u32);

impl Vs {
    /// NVMe 1.3, what Linux's nvmet reports for fabrics controllers.
    pub const V1_3: Self = Self::new(1, 3, 0);
    /// NVMe 1.4.
    pub const V1_4: Self = Self::new(1, 4, 0);
    /// NVMe 2.0.
    pub const V2_0: Self = Self::new(2, 0, 0);

    /// A version value.
    pub const fn new(major: u16, minor: u8, tertiary: u8) -> Self {
        Self(((major as u32) << 16) | ((minor as u32) << 8) | tertiary as u32)
    }
}

/// Controller Configuration (CC, NVMe 2.0 §3.1.3.5, Figure 41).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Cc(pub u32);

impl Cc {
    /// CC.SHN: no notification.
    pub const SHN_NONE: u8 = 0;
    /// CC.SHN: normal shutdown.
    pub const SHN_NORMAL: u8 = 1;
    /// CC.SHN: abrupt shutdown.
    pub const SHN_ABRUPT: u8 = 2;
    /// CC.CSS: NVM command set.
    pub const CSS_NVM: u8 = 0;
    /// CC.CSS: all supported I/O command sets.
    pub const CSS_ALL: u8 = 6;
    /// CC.CSS: admin command set only.
    pub const CSS_ADMIN_ONLY: u8 = 7;

    /// Enable (bit 0).
    pub const fn en(self) -> bool {
        field32(self.0, 0, 1) != 0
    }
    /// Sets EN.
    pub const fn with_en(self, en: bool) -> Self {
        Self(set32(self.0, 0, 1, en as u32))
    }
    /// I/O Command Set Selected (bits 6:4).
    pub const fn css(self) -> u8 {
        field32(self.0, 4, 3) as u8
    }
    /// Sets CSS.
    pub const fn with_css(self, css: u8) -> Self {
        Self(set32(self.0, 4, 3, css as u32))
    }
    /// Memory Page Size, 2^(12 + MPS) (bits 10:7).
    pub const fn mps(self) -> u8 {
        field32(self.0, 7, 4) as u8
    }
    /// Sets MPS.
    pub const fn with_mps(self, mps: u8) -> Self {
        Self(set32(self.0, 7, 4, mps as u32))
    }
    /// Arbitration Mechanism Selected (bits 13:11).
    pub const fn ams(self) -> u8 {
        field32(self.0, 11, 3) as u8
    }
    /// Sets AMS.
    pub const fn with_ams(self, ams: u8) -> Self {
        Self(set32(self.0, 11, 3, ams as u32))
    }
    /// Shutdown Notification (bits 15:14); see `SHN_*`.
    pub const fn shn(self) -> u8 {
        field32(self.0, 14, 2) as u8
    }
    /// Sets SHN.
    pub const fn with_shn(self, shn: u8) -> Self {
        Self(set32(self.0, 14, 2, shn as u32))
    }
    /// I/O Submission Queue Entry Size, 2^n bytes (bits 19:16); 6 (64 bytes) for NVMe.
    pub const fn iosqes(self) -> u8 {
        field32(self.0, 16, 4) as u8
    }
    /// Sets IOSQES.
    pub const fn with_iosqes(self, iosqes: u8) -> Self {
        Self(set32(self.0, 16, 4, iosqes as u32))
    }
    /// I/O Completion Queue Entry Size, 2^n bytes (bits 23:20); 4 (16 bytes) for NVMe.
    pub const fn iocqes(self) -> u8 {
        field32(self.0, 20, 4) as u8
    }
    /// Sets IOCQES.
    pub const fn with_iocqes(self, iocqes: u8) -> Self {
        Self(set32(self.0, 20, 4, iocqes as u32))
    }
}

/// Controller Status (CSTS, NVMe 2.0 §3.1.3.6, Figure 42).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Csts(pub u32);

impl Csts {
    /// CSTS.SHST: normal operation.
    pub const SHST_NORMAL: u8 = 0;
    /// CSTS.SHST: shutdown processing occurring.
    pub const SHST_OCCURRING: u8 = 1;
    /// CSTS.SHST: shutdown processing complete.
    pub const SHST_COMPLETE: u8 = 2;

    /// Ready (bit 0).
    pub const fn rdy(self) -> bool {
        field32(self.0, 0, 1) != 0
    }
    /// Sets RDY.
    pub const fn with_rdy(self, rdy: bool) -> Self {
        Self(set32(self.0, 0, 1, rdy as u32))
    }
    /// Controller Fatal Status (bit 1).
    pub const fn cfs(self) -> bool {
        field32(self.0, 1, 1) != 0
    }
    /// Sets CFS.
    pub const fn with_cfs(self, cfs: bool) -> Self {
        Self(set32(self.0, 1, 1, cfs as u32))
    }
    /// Shutdown Status (bits 3:2); see `SHST_*`.
    pub const fn shst(self) -> u8 {
        field32(self.0, 2, 2) as u8
    }
    /// Sets SHST.
    pub const fn with_shst(self, shst: u8) -> Self {
        Self(set32(self.0, 2, 2, shst as u32))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn properties() {
        assert_eq!(
            (property::CAP, property::VS, property::CC, property::CSTS),
            (0, 8, 0x14, 0x1C)
        );
        assert_eq!(property::size(property::CAP), Some(8));
        assert_eq!(property::size(property::CSTS), Some(4));
        assert_eq!(property::size(0x28), None);

        // What nvmet reports: MQES = 127, TO = 15, CSS NVM.
        let cap = Cap::default()
            .with_mqes(127)
            .with_cqr(true)
            .with_to(15)
            .with_css(Cap::CSS_NVM);
        assert_eq!(cap.0, 127 | 1 << 16 | 15 << 24 | 1 << 37);
        assert_eq!((cap.mqes(), cap.cqr(), cap.to(), cap.css()), (127, true, 15, 1));
        let cap = cap.with_mpsmin(0).with_mpsmax(4);
        assert_eq!((cap.mpsmin(), cap.mpsmax()), (0, 4));
        assert_eq!(cap.0 >> 52 & 0xF, 4);

        // Linux's host writes CC = EN | IOSQES 6 | IOCQES 4 (MPS 0, CSS NVM).
        let cc = Cc(0x0046_0001);
        assert!(cc.en());
        assert_eq!(
            (cc.iosqes(), cc.iocqes(), cc.mps(), cc.css(), cc.shn()),
            (6, 4, 0, 0, 0)
        );
        let cc = cc
            .with_shn(Cc::SHN_NORMAL)
            .with_ams(0)
            .with_mps(1)
            .with_css(Cc::CSS_ALL);
        assert_eq!((cc.shn(), cc.mps(), cc.css()), (1, 1, 6));
        assert_eq!(cc.0 & (3 << 14), 1 << 14);
        assert_eq!(Cc::default().with_en(true).with_iosqes(6).with_iocqes(4).0, 0x0046_0001);

        let csts = Csts::default().with_rdy(true).with_shst(Csts::SHST_COMPLETE);
        assert_eq!(csts.0, 0b1001);
        assert!(csts.rdy() && !csts.cfs());
        assert_eq!(csts.with_cfs(true).with_rdy(false).0, 0b1010);

        assert_eq!(Vs::V1_3.0, 0x0001_0300);
        assert_eq!(Vs::new(2, 0, 0).0, 0x0002_0000);
    }
}
