//! The submission queue entry (NVMe 2.0 §4.2): the common command format and its
//! field accessors.

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::SglDescriptor;

// ---------------------------------------------------------------------------------------------
// Submission queue entry (NVMe 2.0 §4.2)
// ---------------------------------------------------------------------------------------------

/// Submission queue entry, common command format (NVMe 2.0 §4.2, Figure 88; 64
/// bytes). Fabrics commands (opcode 0x7F, NVMe-oF 1.1 §6.1) keep FCTYPE in byte 4, where
/// NSID is: see [`Sqe::fctype`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct Sqe {
    /// CDW0 bits 7:0: opcode.
    pub opcode: u8,
    /// CDW0 bits 15:8: FUSE (bits 1:0) and PSDT (bits 7:6).
    pub flags: u8,
    /// CDW0 bits 31:16: command identifier (CID), chosen by the host.
    pub cid: U16,
    /// Namespace identifier; fabrics commands: FCTYPE in byte 0 of this field.
    pub nsid: U32,
    /// Command dword 2.
    pub cdw2: U32,
    /// Command dword 3.
    pub cdw3: U32,
    /// Metadata pointer.
    pub mptr: U64,
    /// Data pointer: PRP entry 1 and 2, or an SGL descriptor (SGL1).
    pub dptr: [u8; 16],
    /// Command dword 10.
    pub cdw10: U32,
    /// Command dword 11.
    pub cdw11: U32,
    /// Command dword 12.
    pub cdw12: U32,
    /// Command dword 13.
    pub cdw13: U32,
    /// Command dword 14.
    pub cdw14: U32,
    /// Command dword 15.
    pub cdw15: U32,
}
const _: () = assert!(size_of::<Sqe>() == 64);

impl Sqe {
    /// FUSE: normal operation (flags bits 1:0).
    pub const FUSE_NONE: u8 = 0;
    /// FUSE: first command of a fused operation.
    pub const FUSE_FIRST: u8 = 1;
    /// FUSE: second command of a fused operation.
    pub const FUSE_SECOND: u8 = 2;
    /// PSDT (flags bits 7:6): PRPs.
    pub const PSDT_PRP: u8 = 0;
    /// PSDT: SGLs, MPTR is a contiguous buffer. Required for fabrics (NVMe-oF 1.1 §2.3.1),
    /// what Linux calls `NVME_CMD_SGL_METABUF`.
    pub const PSDT_SGL_MPTR_CONTIGUOUS: u8 = 1;
    /// PSDT: SGLs, MPTR is an SGL segment.
    pub const PSDT_SGL_MPTR_SGL: u8 = 2;

    /// FUSE field (flags bits 1:0).
    pub const fn fuse(&self) -> u8 {
        self.flags & 0x3
    }

    /// PSDT field (flags bits 7:6).
    pub const fn psdt(&self) -> u8 {
        self.flags >> 6
    }

    /// Sets the FUSE field (flags bits 1:0).
    pub fn set_fuse(&mut self, fuse: u8) {
        self.flags = (self.flags & !0x3) | (fuse & 0x3);
    }

    /// Sets the PSDT field (flags bits 7:6).
    pub fn set_psdt(&mut self, psdt: u8) {
        self.flags = (self.flags & 0x3F) | ((psdt & 0x3) << 6);
    }

    /// Fabrics command type (byte 4), meaningful when `opcode == opcode::FABRICS`.
    pub fn fctype(&self) -> u8 {
        self.nsid.to_bytes()[0]
    }

    /// Sets the fabrics command type (byte 4); bytes 5..8 are reserved and cleared.
    pub fn set_fctype(&mut self, fctype: u8) {
        self.nsid = U32::new(u32::from(fctype));
    }

    /// DPTR read as an SGL descriptor (SGL1).
    pub fn sgl(&self) -> SglDescriptor {
        zerocopy::transmute!(self.dptr)
    }

    /// Stores an SGL descriptor in DPTR.
    pub fn set_sgl(&mut self, sgl: &SglDescriptor) {
        self.dptr.copy_from_slice(sgl.as_bytes());
    }

    /// PRP entry 1 (DPTR bytes 0..8).
    pub fn prp1(&self) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.dptr[..8]);
        u64::from_le_bytes(b)
    }

    /// PRP entry 2 (DPTR bytes 8..16).
    pub fn prp2(&self) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.dptr[8..]);
        u64::from_le_bytes(b)
    }

    /// Stores PRP entries 1 and 2 in DPTR.
    pub fn set_prps(&mut self, prp1: u64, prp2: u64) {
        self.dptr[..8].copy_from_slice(&prp1.to_le_bytes());
        self.dptr[8..].copy_from_slice(&prp2.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::opcode;
    use zerocopy::FromZeros;

    #[test]
    fn sqe_fields() {
        let mut raw = [0u8; 64];
        raw[0] = opcode::FABRICS;
        raw[1] = 0x40; // PSDT 01b
        raw[2..4].copy_from_slice(&0x1234u16.to_le_bytes());
        raw[4] = opcode::fctype::CONNECT;
        raw[24..32].copy_from_slice(&0u64.to_le_bytes());
        raw[32..36].copy_from_slice(&1024u32.to_le_bytes());
        raw[39] = SglDescriptor::ID_DATA_BLOCK_OFFSET;
        let sqe = Sqe::read_from_bytes(&raw).expect("64 bytes");
        assert_eq!(sqe.opcode, 0x7F);
        assert_eq!(sqe.psdt(), Sqe::PSDT_SGL_MPTR_CONTIGUOUS);
        assert_eq!(sqe.fuse(), Sqe::FUSE_NONE);
        assert_eq!(sqe.cid.get(), 0x1234);
        assert_eq!(sqe.fctype(), 0x01);
        let sgl = sqe.sgl();
        assert_eq!(sgl, SglDescriptor::in_capsule(0, 1024));
        assert_eq!(sgl.sgl_type(), SglDescriptor::TYPE_DATA_BLOCK);
        assert_eq!(sgl.subtype(), SglDescriptor::SUBTYPE_OFFSET);

        let mut s = Sqe::new_zeroed();
        s.set_fctype(opcode::fctype::PROPERTY_GET);
        s.set_psdt(Sqe::PSDT_SGL_MPTR_CONTIGUOUS);
        s.set_fuse(Sqe::FUSE_FIRST);
        assert_eq!(s.flags, 0x41);
        assert_eq!(s.as_bytes()[4], 0x04);
        s.set_sgl(&SglDescriptor::transport_data_block(8192));
        assert_eq!(s.as_bytes()[39], 0x5A);
        assert_eq!(s.sgl().sgl_type(), SglDescriptor::TYPE_TRANSPORT_DATA_BLOCK);
        assert_eq!(s.sgl().subtype(), SglDescriptor::SUBTYPE_TRANSPORT_SPECIFIC);
        s.set_prps(0x1122_3344_5566_7788, 0x99);
        assert_eq!((s.prp1(), s.prp2()), (0x1122_3344_5566_7788, 0x99));
    }
}
