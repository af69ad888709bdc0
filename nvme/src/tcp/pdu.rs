//! PDU types and the PDU header structs (NVMe/TCP 1.0 §3.6) as zerocopy structs.

use zerocopy::little_endian::{U16, U32};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::error::invalid;
use super::{DIGEST_LEN, PduError, PduLimits, dgst};
#[cfg(doc)]
use super::{fes, flags};
use crate::spec::{Cqe, Sqe};

/// Which peer sent a PDU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Host to controller: what a target receives.
    HostToController,
    /// Controller to host: what a host receives.
    ControllerToHost,
}

/// PDU types (NVMe/TCP 1.0 §3.6.1, Figure "PDU Type").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum PduType {
    /// Initialize Connection Request.
    IcReq = 0x00,
    /// Initialize Connection Response.
    IcResp = 0x01,
    /// Host to Controller Terminate Connection Request.
    H2CTermReq = 0x02,
    /// Controller to Host Terminate Connection Request.
    C2HTermReq = 0x03,
    /// Command capsule.
    CapsuleCmd = 0x04,
    /// Response capsule.
    CapsuleResp = 0x05,
    /// Host to Controller data.
    H2CData = 0x06,
    /// Controller to Host data.
    C2HData = 0x07,
    /// Ready to Transfer.
    R2T = 0x09,
}

impl PduType {
    /// The type for a PDU-Type byte, `None` for an unknown or reserved value.
    pub const fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0x00 => Self::IcReq,
            0x01 => Self::IcResp,
            0x02 => Self::H2CTermReq,
            0x03 => Self::C2HTermReq,
            0x04 => Self::CapsuleCmd,
            0x05 => Self::CapsuleResp,
            0x06 => Self::H2CData,
            0x07 => Self::C2HData,
            0x09 => Self::R2T,
            _ => return None,
        })
    }

    /// The fixed HLEN of this type.
    pub const fn hlen(self) -> u8 {
        match self {
            Self::IcReq | Self::IcResp => 128,
            Self::CapsuleCmd => 72,
            Self::H2CTermReq | Self::C2HTermReq | Self::CapsuleResp | Self::H2CData | Self::C2HData | Self::R2T => 24,
        }
    }

    /// Who sends this type.
    pub const fn direction(self) -> Direction {
        match self {
            Self::IcReq | Self::H2CTermReq | Self::CapsuleCmd | Self::H2CData => Direction::HostToController,
            Self::IcResp | Self::C2HTermReq | Self::CapsuleResp | Self::C2HData | Self::R2T => {
                Direction::ControllerToHost
            }
        }
    }

    /// Whether this type carries digests when they are negotiated. ICReq, ICResp and the
    /// TermReqs never do (they are exchanged before or regardless of the negotiation).
    pub const fn carries_digests(self) -> bool {
        !matches!(self, Self::IcReq | Self::IcResp | Self::H2CTermReq | Self::C2HTermReq)
    }
}

// ---------------------------------------------------------------------------------------------
// PDU header structs (§3.6)
// ---------------------------------------------------------------------------------------------

/// PDU common header (CH, NVMe/TCP 1.0 §3.6.1; 8 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct CommonHeader {
    /// PDU-Type.
    pub pdu_type: u8,
    /// FLAGS, see [`flags`].
    pub flags: u8,
    /// Header length, without the header digest.
    pub hlen: u8,
    /// PDU data offset from the start of the PDU; 0 when there is no data.
    pub pdo: u8,
    /// Total PDU length: header, header digest, padding, data, data digest.
    pub plen: U32,
}
const _: () = assert!(size_of::<CommonHeader>() == 8);

impl CommonHeader {
    /// Byte offset of PDU-Type (for FEI).
    pub const OFFSET_TYPE: u8 = 0;
    /// Byte offset of FLAGS.
    pub const OFFSET_FLAGS: u8 = 1;
    /// Byte offset of HLEN.
    pub const OFFSET_HLEN: u8 = 2;
    /// Byte offset of PDO.
    pub const OFFSET_PDO: u8 = 3;
    /// Byte offset of PLEN.
    pub const OFFSET_PLEN: u8 = 4;

    /// A common header with the given fields.
    pub const fn new(pdu_type: PduType, flags: u8, hlen: u8, pdo: u8, plen: u32) -> Self {
        Self {
            pdu_type: pdu_type as u8,
            flags,
            hlen,
            pdo,
            plen: U32::new(plen),
        }
    }

    /// First parsing stage: the type is known, HLEN is the type's fixed header length
    /// (FEI 2 otherwise) and PLEN >= HLEN (FEI 4 otherwise).
    pub fn parse(bytes: &[u8; 8]) -> Result<Self, PduError> {
        Self::parse_typed(bytes).map(|(ch, _)| ch)
    }

    /// [`CommonHeader::parse`], also returning the type it found.
    #[inline]
    pub(crate) fn parse_typed(bytes: &[u8; 8]) -> Result<(Self, PduType), PduError> {
        let ch: Self = zerocopy::transmute!(*bytes);
        let ty = ch.kind()?;
        if ch.hlen != ty.hlen() {
            return Err(invalid(
                ch.pdu_type,
                Self::OFFSET_HLEN,
                ch.hlen.into(),
                "HLEN is not the type's header length",
            ));
        }
        if ch.plen.get() < u32::from(ch.hlen) {
            return Err(invalid(
                ch.pdu_type,
                Self::OFFSET_PLEN,
                ch.plen.get(),
                "PLEN is less than HLEN",
            ));
        }
        Ok((ch, ty))
    }

    /// The PDU type, or [`PduError::UnknownType`].
    pub fn kind(&self) -> Result<PduType, PduError> {
        PduType::from_u8(self.pdu_type).ok_or(PduError::UnknownType {
            pdu_type: self.pdu_type,
        })
    }

    /// How many bytes the second parsing stage needs: HLEN, plus [`DIGEST_LEN`] if header
    /// digests are negotiated and the type carries them. Unknown types: HLEN.
    pub fn header_len(&self, limits: &PduLimits) -> usize {
        let digest = match PduType::from_u8(self.pdu_type) {
            Some(ty) if ty.carries_digests() && limits.hdgst => DIGEST_LEN,
            _ => 0,
        };
        usize::from(self.hlen) + digest
    }
}

/// ICReq PDU (NVMe/TCP 1.0 §3.6.2, "ICReq"; 128 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct IcReq {
    /// Common header.
    pub ch: CommonHeader,
    /// PDU format version, 0.
    pub pfv: U16,
    /// Host PDU data alignment: 0's based dwords the controller shall align C2H data to.
    pub hpda: u8,
    /// Digests requested, see [`dgst`].
    pub dgst: u8,
    /// Maximum outstanding R2Ts per command, 0's based.
    pub maxr2t: U32,
    /// Reserved.
    pub rsvd: [u8; 112],
}
const _: () = assert!(size_of::<IcReq>() == 128);

impl IcReq {
    /// Byte offset of PFV (for FEI).
    pub const OFFSET_PFV: u8 = 8;
    /// Byte offset of HPDA.
    pub const OFFSET_HPDA: u8 = 10;

    /// Header digests requested.
    pub fn hdgst(&self) -> bool {
        self.dgst & dgst::HDGST_ENABLE != 0
    }

    /// Data digests requested.
    pub fn ddgst(&self) -> bool {
        self.dgst & dgst::DDGST_ENABLE != 0
    }
}

/// ICResp PDU (NVMe/TCP 1.0 §3.6.2, "ICResp"; 128 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct IcResp {
    /// Common header.
    pub ch: CommonHeader,
    /// PDU format version, 0.
    pub pfv: U16,
    /// Controller PDU data alignment: 0's based dwords the host shall align H2C data to.
    pub cpda: u8,
    /// Digests enabled, see [`dgst`].
    pub dgst: u8,
    /// MAXH2CDATA: most data bytes in one H2CData PDU.
    pub maxh2cdata: U32,
    /// Reserved.
    pub rsvd: [u8; 112],
}
const _: () = assert!(size_of::<IcResp>() == 128);

impl IcResp {
    /// Byte offset of PFV (for FEI).
    pub const OFFSET_PFV: u8 = 8;
    /// Byte offset of CPDA.
    pub const OFFSET_CPDA: u8 = 10;
    /// Byte offset of MAXH2CDATA.
    pub const OFFSET_MAXH2CDATA: u8 = 12;

    /// Header digests enabled.
    pub fn hdgst(&self) -> bool {
        self.dgst & dgst::HDGST_ENABLE != 0
    }

    /// Data digests enabled.
    pub fn ddgst(&self) -> bool {
        self.dgst & dgst::DDGST_ENABLE != 0
    }
}

/// H2CTermReq / C2HTermReq header (NVMe/TCP 1.0 §3.6.2; 24 bytes). Up to 128 bytes of the
/// offending PDU header follow as data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct TermReqHdr {
    /// Common header.
    pub ch: CommonHeader,
    /// Fatal Error Status, see [`fes`].
    pub fes: U16,
    /// Fatal Error Information (for invalid header field / unsupported parameter: the byte
    /// offset of the offending field).
    pub fei: U32,
    /// Reserved.
    pub rsvd: [u8; 10],
}
const _: () = assert!(size_of::<TermReqHdr>() == 24);

/// CapsuleCmd header (NVMe/TCP 1.0 §3.6.2; 72 bytes): CH and the SQE. In-capsule data
/// follows at PDO.
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct CapsuleCmdHdr {
    /// Common header.
    pub ch: CommonHeader,
    /// Submission queue entry.
    pub sqe: Sqe,
}
const _: () = assert!(size_of::<CapsuleCmdHdr>() == 72);

/// CapsuleResp header (NVMe/TCP 1.0 §3.6.2; 24 bytes): CH and the CQE.
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct CapsuleRespHdr {
    /// Common header.
    pub ch: CommonHeader,
    /// Completion queue entry.
    pub cqe: Cqe,
}
const _: () = assert!(size_of::<CapsuleRespHdr>() == 24);

/// H2CData and C2HData header (NVMe/TCP 1.0 §3.6.2; 24 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct DataHdr {
    /// Common header.
    pub ch: CommonHeader,
    /// CCCID: command capsule CID of the command this data belongs to.
    pub cccid: U16,
    /// TTAG: transfer tag from the R2T (H2CData); reserved in C2HData.
    pub ttag: U16,
    /// DATAO: offset of this data in the command's data buffer.
    pub datao: U32,
    /// DATAL: bytes of data in this PDU.
    pub datal: U32,
    /// Reserved.
    pub rsvd: [u8; 4],
}
const _: () = assert!(size_of::<DataHdr>() == 24);

impl DataHdr {
    /// Byte offset of CCCID (for FEI).
    pub const OFFSET_CCCID: u8 = 8;
    /// Byte offset of TTAG.
    pub const OFFSET_TTAG: u8 = 10;
    /// Byte offset of DATAO.
    pub const OFFSET_DATAO: u8 = 12;
    /// Byte offset of DATAL.
    pub const OFFSET_DATAL: u8 = 16;
}

/// R2T header (NVMe/TCP 1.0 §3.6.2; 24 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct R2tHdr {
    /// Common header.
    pub ch: CommonHeader,
    /// CCCID: CID of the command.
    pub cccid: U16,
    /// TTAG: transfer tag the host echoes in its H2CData PDUs.
    pub ttag: U16,
    /// R2TO: offset of the requested data.
    pub r2to: U32,
    /// R2TL: bytes requested.
    pub r2tl: U32,
    /// Reserved.
    pub rsvd: [u8; 4],
}
const _: () = assert!(size_of::<R2tHdr>() == 24);

impl R2tHdr {
    /// Byte offset of R2TL (for FEI).
    pub const OFFSET_R2TL: u8 = 16;
}
