//! The completion queue entry (NVMe 2.0 §4.6): layout, constructors and the
//! phase/status accessors.

use zerocopy::little_endian::{U16, U32};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::Status;

// ---------------------------------------------------------------------------------------------
// Completion queue entry and status (NVMe 2.0 §4.6)
// ---------------------------------------------------------------------------------------------

/// Completion queue entry (NVMe 2.0 §4.6, Figure 89; 16 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct Cqe {
    /// DW0: command specific result (Connect: controller ID in bits 15:0; Property Get:
    /// low 32 bits of the value).
    pub dw0: U32,
    /// DW1: command specific (Property Get of an 8-byte property: high 32 bits).
    pub dw1: U32,
    /// SQ head pointer.
    pub sqhd: U16,
    /// SQ identifier.
    pub sqid: U16,
    /// Command identifier of the completed command.
    pub cid: U16,
    /// Phase tag (bit 0) and status field (bits 15:1).
    pub status: U16,
}
const _: () = assert!(size_of::<Cqe>() == 16);

impl Cqe {
    /// A completion with the given status and DW0 result; DW1 and phase are 0 (fabrics
    /// transports do not use the phase tag).
    pub const fn new(cid: u16, sqid: u16, sqhd: u16, status: Status, dw0: u32) -> Self {
        Self {
            dw0: U32::new(dw0),
            dw1: U32::new(0),
            sqhd: U16::new(sqhd),
            sqid: U16::new(sqid),
            cid: U16::new(cid),
            status: U16::new(status.to_cqe_field()),
        }
    }

    /// A successful completion with DW0 = 0.
    pub const fn success(cid: u16, sqid: u16, sqhd: u16) -> Self {
        Self::new(cid, sqid, sqhd, Status::SUCCESS, 0)
    }

    /// A completion carrying a 64-bit result in DW0 (low) and DW1 (high), e.g. Property Get
    /// of CAP.
    pub const fn with_result64(cid: u16, sqid: u16, sqhd: u16, status: Status, result: u64) -> Self {
        let mut cqe = Self::new(cid, sqid, sqhd, status, result as u32);
        cqe.dw1 = U32::new((result >> 32) as u32);
        cqe
    }

    /// The 64-bit result DW1:DW0.
    pub fn result64(&self) -> u64 {
        (u64::from(self.dw1.get()) << 32) | u64::from(self.dw0.get())
    }

    /// The status field (bits 15:1 of the status word).
    pub fn status(&self) -> Status {
        Status::from_cqe_field(self.status.get())
    }

    /// The phase tag (bit 0 of the status word).
    pub fn phase(&self) -> bool {
        self.status.get() & 1 != 0
    }

    /// Sets the phase tag.
    pub fn set_phase(&mut self, phase: bool) {
        self.status = U16::new((self.status.get() & !1) | u16::from(phase));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cqe_layout() {
        let cqe = Cqe::new(0xABCD, 0, 5, Status::INVALID_FIELD.with_dnr(), 0x77);
        let b = cqe.as_bytes();
        assert_eq!(&b[0..4], &0x77u32.to_le_bytes());
        assert_eq!(&b[8..10], &5u16.to_le_bytes());
        assert_eq!(&b[12..14], &0xABCDu16.to_le_bytes());
        assert_eq!(u16::from_le_bytes([b[14], b[15]]), 0x4002 << 1);
        assert_eq!(cqe.status(), Status::INVALID_FIELD.with_dnr());
        assert!(!cqe.phase());
        let mut c = Cqe::with_result64(1, 2, 3, Status::SUCCESS, 0x1_0000_0002);
        assert_eq!((c.dw0.get(), c.dw1.get(), c.result64()), (2, 1, 0x1_0000_0002));
        c.set_phase(true);
        assert!(c.phase() && c.status().is_success());
        assert_eq!(Cqe::success(7, 1, 2).status(), Status::SUCCESS);
    }
}
