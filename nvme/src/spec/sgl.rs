//! The SGL descriptor (NVMe 2.0 §4.3.2): layout, type/subtype codes and constructors.

use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

// ---------------------------------------------------------------------------------------------
// SGL descriptor (NVMe 2.0 §4.3.2)
// ---------------------------------------------------------------------------------------------

/// SGL descriptor (NVMe 2.0 §4.3.2, 16 bytes).
///
/// Byte 15 is the SGL identifier: descriptor type in bits 7:4, subtype in bits 3:0. For a
/// Keyed SGL Data Block (RDMA) bytes 8..11 are a 3-byte length and 11..15 the key; NVMe/TCP
/// only uses the unkeyed forms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct SglDescriptor {
    /// Address (or, for subtype Offset, the offset into the in-capsule data).
    pub address: U64,
    /// Length in bytes.
    pub length: U32,
    /// Reserved (type specific).
    pub rsvd: [u8; 3],
    /// SGL identifier: type (7:4) and subtype (3:0).
    pub id: u8,
}
const _: () = assert!(size_of::<SglDescriptor>() == 16);

impl SglDescriptor {
    /// Descriptor type: SGL Data Block (NVMe 2.0 §4.3.2.1, Figure 118).
    pub const TYPE_DATA_BLOCK: u8 = 0x0;
    /// Descriptor type: SGL Bit Bucket.
    pub const TYPE_BIT_BUCKET: u8 = 0x1;
    /// Descriptor type: SGL Segment.
    pub const TYPE_SEGMENT: u8 = 0x2;
    /// Descriptor type: SGL Last Segment.
    pub const TYPE_LAST_SEGMENT: u8 = 0x3;
    /// Descriptor type: Keyed SGL Data Block.
    pub const TYPE_KEYED_DATA_BLOCK: u8 = 0x4;
    /// Descriptor type: Transport SGL Data Block.
    pub const TYPE_TRANSPORT_DATA_BLOCK: u8 = 0x5;

    /// Subtype: Address (Figure 119).
    pub const SUBTYPE_ADDRESS: u8 = 0x0;
    /// Subtype: Offset (the address is an offset into the in-capsule data).
    pub const SUBTYPE_OFFSET: u8 = 0x1;
    /// Subtype: Transport specific.
    pub const SUBTYPE_TRANSPORT_SPECIFIC: u8 = 0xA;
    /// Subtype: Invalidate Key (keyed data block only).
    pub const SUBTYPE_INVALIDATE_KEY: u8 = 0xF;

    /// Identifier of an SGL Data Block with Offset subtype: in-capsule data (NVMe/TCP 1.0
    /// §3.3.2: the data follows the SQE in the CapsuleCmd PDU).
    pub const ID_DATA_BLOCK_OFFSET: u8 = 0x01;
    /// Identifier of an SGL Data Block with Address subtype.
    pub const ID_DATA_BLOCK_ADDRESS: u8 = 0x00;
    /// Identifier of a Last Segment descriptor with Offset subtype.
    pub const ID_LAST_SEGMENT_OFFSET: u8 = 0x31;
    /// Identifier of a Keyed SGL Data Block with Address subtype (RDMA).
    pub const ID_KEYED_DATA_BLOCK: u8 = 0x40;
    /// Identifier of a Keyed SGL Data Block with Invalidate Key subtype (RDMA).
    pub const ID_KEYED_DATA_BLOCK_INVALIDATE: u8 = 0x4F;
    /// Identifier of a Transport SGL Data Block with transport specific subtype: the data is
    /// moved by R2T/H2CData (writes) or C2HData (reads) on NVMe/TCP.
    pub const ID_TRANSPORT_DATA_BLOCK: u8 = 0x5A;

    /// A descriptor with the given fields.
    pub const fn new(address: u64, length: u32, id: u8) -> Self {
        Self {
            address: U64::new(address),
            length: U32::new(length),
            rsvd: [0; 3],
            id,
        }
    }

    /// In-capsule data: SGL Data Block, Offset subtype, `offset` into the in-capsule data.
    pub const fn in_capsule(offset: u64, length: u32) -> Self {
        Self::new(offset, length, Self::ID_DATA_BLOCK_OFFSET)
    }

    /// Transport SGL Data Block (0x5A) of `length` bytes, address 0.
    pub const fn transport_data_block(length: u32) -> Self {
        Self::new(0, length, Self::ID_TRANSPORT_DATA_BLOCK)
    }

    /// Descriptor type (identifier bits 7:4).
    pub const fn sgl_type(&self) -> u8 {
        self.id >> 4
    }

    /// Descriptor subtype (identifier bits 3:0).
    pub const fn subtype(&self) -> u8 {
        self.id & 0xF
    }
}
