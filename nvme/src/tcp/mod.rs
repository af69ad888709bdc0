//! NVMe/TCP transport (NVMe/TCP Transport Specification 1.0, §3.6 "PDU definitions"): the
//! PDU headers as zerocopy structs, CRC32C digests, an incremental receive-side parser with
//! typed errors that map to C2HTermReq/H2CTermReq fields, and allocation-free encoders.
//!
//! # Receiving
//! Bytes arrive in pieces, so parsing has two stages:
//! 1. read 8 bytes and call [`CommonHeader::parse`] (type known, HLEN right for the type,
//!    PLEN >= HLEN);
//! 2. read [`CommonHeader::header_len`] bytes in total (HLEN, plus 4 if header digests were
//!    negotiated and the type carries them) and call [`parse_pdu_header`], which checks
//!    everything that can be checked from the header and tells where the data part is.
//!
//! Then skip to [`PduHeader::data_offset`] (PDO; padding between the header digest and PDO
//! is allowed), read [`PduHeader::data_len`] bytes of data and, if
//! [`PduHeader::has_data_digest`], 4 more bytes for [`check_data_digest`].
//!
//! [`next_frame`] does both stages over the unread bytes of a receive buffer ([`RxBuf`]) and
//! tells whether a whole PDU is there ([`Framed::Pdu`]), only its header
//! ([`Framed::Header`], for a receiver that takes the data in place from there) or how many
//! bytes it needs ([`Framed::Need`]); the receiver's limits come from a callback that may
//! also refuse a type outright. A target and a host both frame their input with it, each
//! with its own state machine around it.
//!
//! Every error is a [`PduError`] whose [`PduError::fes`] / [`PduError::fei`] give the
//! Fatal Error Status and Fatal Error Information of the TermReq to send before closing the
//! connection ([`encode_term_req`]); a data digest error is the one non-fatal error
//! ([`PduError::is_fatal`]): the command completes with Transient Transport Error.
//!
//! # Sending
//! The `encode_*` functions return the header (plus header digest when enabled) in a fixed
//! array and its length; the caller sends the data and, when data digests are enabled, the
//! data digest ([`crc32c()`] / [`Crc32c`]) after it. They never pad: PDO = HLEN + HDGST, i.e.
//! they assume the peer asked for CPDA/HPDA 0.

use zerocopy::little_endian::{U16, U32};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::spec::{Cqe, Sqe, Status};

mod frame;
mod rxbuf;

pub use frame::{Frame, FrameError, FrameErrorKind, Framed, next_frame};
pub use rxbuf::{Recv, RxBuf};

/// Length of a header or data digest (CRC32C) in bytes.
pub const DIGEST_LEN: usize = 4;
/// Most bytes of the offending PDU header a TermReq may carry (NVMe/TCP 1.0 §3.6.2,
/// H2CTermReq/C2HTermReq).
pub const TERM_REQ_MAX_DATA: usize = 128;
/// Largest TermReq PLEN: 24-byte header + 128 bytes of offending header.
pub const TERM_REQ_MAX_PLEN: u32 = 152;
/// The only PDU format version defined (PFV 0, NVMe/TCP 1.0).
pub const PFV_1_0: u16 = 0;
/// Largest CPDA/HPDA value (0's based number of dwords, 128 bytes).
pub const MAX_PDA: u8 = 31;
/// Smallest MAXH2CDATA an ICResp may advertise.
pub const MIN_MAXH2CDATA: u32 = 4096;

/// Common header FLAGS bits (NVMe/TCP 1.0 §3.6.1, Figure "PDU Common Header").
pub mod flags {
    /// HDGSTF: a header digest follows the header.
    pub const HDGSTF: u8 = 1 << 0;
    /// DDGSTF: a data digest follows the data.
    pub const DDGSTF: u8 = 1 << 1;
    /// LAST_PDU (H2CData/C2HData): last data PDU of the transfer.
    pub const DATA_LAST: u8 = 1 << 2;
    /// SUCCESS (C2HData, only with LAST_PDU): the command completed successfully and no
    /// CapsuleResp follows (only when SQ flow control is disabled).
    pub const DATA_SUCCESS: u8 = 1 << 3;
}

/// ICReq/ICResp DGST field bits.
pub mod dgst {
    /// HDGST_ENABLE: header digests requested/enabled.
    pub const HDGST_ENABLE: u8 = 1 << 0;
    /// DDGST_ENABLE: data digests requested/enabled.
    pub const DDGST_ENABLE: u8 = 1 << 1;
}

/// Fatal Error Status values of H2CTermReq/C2HTermReq (NVMe/TCP 1.0 §3.6.2, Figure
/// "C2HTermReq FES" / "H2CTermReq FES").
pub mod fes {
    /// Invalid PDU Header Field; FEI is the byte offset of the offending field.
    pub const INVALID_HEADER_FIELD: u16 = 0x01;
    /// PDU Sequence Error.
    pub const PDU_SEQUENCE_ERROR: u16 = 0x02;
    /// Header Digest Error.
    pub const HEADER_DIGEST_ERROR: u16 = 0x03;
    /// Data Transfer Out of Range.
    pub const DATA_TRANSFER_OUT_OF_RANGE: u16 = 0x04;
    /// Data Transfer Limit Exceeded (C2HTermReq: the host sent more data than allowed).
    pub const DATA_TRANSFER_LIMIT_EXCEEDED: u16 = 0x05;
    /// R2T Limit Exceeded (H2CTermReq: the controller sent more R2Ts than MAXR2T). Same
    /// value as [`DATA_TRANSFER_LIMIT_EXCEEDED`]: the meaning depends on the direction.
    pub const R2T_LIMIT_EXCEEDED: u16 = 0x05;
    /// Unsupported Parameter; FEI is the byte offset of the offending field.
    pub const UNSUPPORTED_PARAMETER: u16 = 0x06;
}

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

// ---------------------------------------------------------------------------------------------
// Digests
// ---------------------------------------------------------------------------------------------

/// CRC32C (Castagnoli) of `data`, as used by NVMe/TCP header and data digests (hardware
/// SSE4.2 when available). The digest is sent little-endian.
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}

/// Incremental CRC32C, for a data digest over several buffers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Crc32c(u32);

impl Crc32c {
    /// An empty digest.
    pub const fn new() -> Self {
        Self(0)
    }

    /// Feeds more bytes.
    pub fn update(&mut self, data: &[u8]) {
        self.0 = crc32c::crc32c_append(self.0, data);
    }

    /// The digest of everything fed so far.
    pub const fn finish(&self) -> u32 {
        self.0
    }
}

/// Checks a data digest: `received` is the little-endian u32 that followed the data.
/// A mismatch is [`PduError::DataDigest`], which is not fatal.
pub fn check_data_digest(data: &[u8], received: u32) -> Result<(), PduError> {
    let computed = crc32c(data);
    if computed == received {
        Ok(())
    } else {
        Err(PduError::DataDigest { computed, received })
    }
}

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

/// A PDU that breaks the NVMe/TCP rules, or a digest mismatch. The crate's one error type.
///
/// [`PduError::fes`] and [`PduError::fei`] give the fields of the TermReq to send; the FES
/// values are those of C2HTermReq (what a target sends). A host sending H2CTermReq uses the
/// same values, except that 0x05 reads "R2T Limit Exceeded" there.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PduError {
    /// The PDU-Type byte is not a defined type (FES invalid header field, FEI 0).
    #[error("unknown PDU type {pdu_type:#04x}")]
    UnknownType {
        /// The PDU-Type byte.
        pdu_type: u8,
    },
    /// A PDU type the peer may not send, e.g. a C2H type from the host (FES invalid header
    /// field, FEI 0).
    #[error("{pdu_type:?} PDU received in direction {dir:?}")]
    WrongDirection {
        /// The PDU type.
        pdu_type: PduType,
        /// The direction it arrived in.
        dir: Direction,
    },
    /// A header field with an invalid value (FES invalid header field, FEI the field's byte
    /// offset).
    #[error("invalid header field at byte {offset} of PDU type {pdu_type:#04x}: {reason} (value {value:#x})")]
    InvalidHeaderField {
        /// The PDU-Type byte.
        pdu_type: u8,
        /// Byte offset of the field in the PDU header.
        offset: u8,
        /// The offending value.
        value: u32,
        /// What is wrong.
        reason: &'static str,
    },
    /// A header field with a value this implementation does not support, e.g. ICReq PFV
    /// != 0 (FES unsupported parameter, FEI the field's byte offset).
    #[error("unsupported parameter at byte {offset} of PDU type {pdu_type:#04x}: {reason} (value {value:#x})")]
    UnsupportedParameter {
        /// The PDU-Type byte.
        pdu_type: u8,
        /// Byte offset of the field in the PDU header.
        offset: u8,
        /// The offending value.
        value: u32,
        /// What is unsupported.
        reason: &'static str,
    },
    /// The header buffer given to [`parse_pdu_header`] does not have
    /// [`CommonHeader::header_len`] bytes (a caller error; reported as invalid HLEN).
    #[error("header buffer has {got} bytes, expected {expected}")]
    HeaderLength {
        /// Bytes expected.
        expected: usize,
        /// Bytes given.
        got: usize,
    },
    /// Header digest mismatch (FES header digest error).
    #[error("header digest error: computed {computed:#010x}, received {received:#010x}")]
    HeaderDigest {
        /// CRC32C of the received header.
        computed: u32,
        /// The digest that came with it.
        received: u32,
    },
    /// Data digest mismatch. Not fatal: the command completes with Transient Transport
    /// Error ([`PduError::command_status`]).
    #[error("data digest error: computed {computed:#010x}, received {received:#010x}")]
    DataDigest {
        /// CRC32C of the received data.
        computed: u32,
        /// The digest that came with it.
        received: u32,
    },
    /// The PDU carries more data than allowed (in-capsule data size, MAXH2CDATA; FES data
    /// transfer limit exceeded).
    #[error("PDU type {pdu_type:#04x} carries {len} data bytes, limit {max}")]
    DataLimitExceeded {
        /// The PDU-Type byte.
        pdu_type: u8,
        /// Data bytes in the PDU.
        len: u32,
        /// The limit.
        max: u32,
    },
    /// Data outside the command's buffer or not at the expected offset (FES data transfer
    /// out of range). Raised by the connection state machine, not by the parser.
    #[error(
        "data transfer out of range: offset {offset}, length {len}, expected offset {expected_offset} of {total} bytes"
    )]
    DataOutOfRange {
        /// DATAO of the PDU.
        offset: u32,
        /// DATAL of the PDU.
        len: u32,
        /// The offset the receiver expected next.
        expected_offset: u32,
        /// Bytes the command transfers in total.
        total: u32,
    },
    /// A PDU that is valid on its own but not now, e.g. a second ICReq or H2CData for an
    /// unknown TTAG (FES PDU sequence error). Raised by the connection state machine.
    #[error("PDU sequence error on PDU type {pdu_type:#04x}: {reason}")]
    Sequence {
        /// The PDU-Type byte.
        pdu_type: u8,
        /// What is out of sequence.
        reason: &'static str,
    },
}

impl PduError {
    /// The Fatal Error Status for the TermReq, see [`fes`]. For the non-fatal
    /// [`PduError::DataDigest`] it is 0 (reserved): no TermReq is due.
    pub const fn fes(&self) -> u16 {
        match self {
            Self::UnknownType { .. }
            | Self::WrongDirection { .. }
            | Self::InvalidHeaderField { .. }
            | Self::HeaderLength { .. } => fes::INVALID_HEADER_FIELD,
            Self::UnsupportedParameter { .. } => fes::UNSUPPORTED_PARAMETER,
            Self::HeaderDigest { .. } => fes::HEADER_DIGEST_ERROR,
            Self::DataLimitExceeded { .. } => fes::DATA_TRANSFER_LIMIT_EXCEEDED,
            Self::DataOutOfRange { .. } => fes::DATA_TRANSFER_OUT_OF_RANGE,
            Self::Sequence { .. } => fes::PDU_SEQUENCE_ERROR,
            Self::DataDigest { .. } => 0,
        }
    }

    /// The Fatal Error Information for the TermReq: the byte offset of the offending field
    /// for invalid header field and unsupported parameter, 0 otherwise (reserved).
    pub const fn fei(&self) -> u32 {
        match self {
            Self::UnknownType { .. } | Self::WrongDirection { .. } => CommonHeader::OFFSET_TYPE as u32,
            Self::HeaderLength { .. } => CommonHeader::OFFSET_HLEN as u32,
            Self::InvalidHeaderField { offset, .. } | Self::UnsupportedParameter { offset, .. } => *offset as u32,
            Self::HeaderDigest { .. }
            | Self::DataDigest { .. }
            | Self::DataLimitExceeded { .. }
            | Self::DataOutOfRange { .. }
            | Self::Sequence { .. } => 0,
        }
    }

    /// Whether the connection must be terminated (TermReq, then close). Only a data digest
    /// error is not fatal.
    pub const fn is_fatal(&self) -> bool {
        !matches!(self, Self::DataDigest { .. })
    }

    /// The status to complete the affected command with, for non-fatal errors: a data digest
    /// error completes the command with Transient Transport Error.
    pub const fn command_status(&self) -> Option<Status> {
        match self {
            Self::DataDigest { .. } => Some(Status::TRANSIENT_TRANSPORT_ERROR),
            _ => None,
        }
    }
}

const fn invalid(pdu_type: u8, offset: u8, value: u32, reason: &'static str) -> PduError {
    PduError::InvalidHeaderField {
        pdu_type,
        offset,
        value,
        reason,
    }
}

const fn unsupported(pdu_type: u8, offset: u8, value: u32, reason: &'static str) -> PduError {
    PduError::UnsupportedParameter {
        pdu_type,
        offset,
        value,
        reason,
    }
}

// ---------------------------------------------------------------------------------------------
// Receive-side parser
// ---------------------------------------------------------------------------------------------

/// What the receiver negotiated and accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PduLimits {
    /// Header digests negotiated (ICReq/ICResp).
    pub hdgst: bool,
    /// Data digests negotiated.
    pub ddgst: bool,
    /// Largest data part accepted in one PDU: the in-capsule data size for CapsuleCmd,
    /// MAXH2CDATA for H2CData, the receive buffer for C2HData.
    pub max_data: u32,
}

/// A validated PDU header (second parsing stage).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PduHeader {
    /// ICReq (PFV 0, HPDA <= 31 checked).
    IcReq(IcReq),
    /// ICResp (PFV 0, CPDA <= 31, MAXH2CDATA >= 4096 and a multiple of 4 checked).
    IcResp(IcResp),
    /// H2CTermReq (`c2h == false`) or C2HTermReq; `data_len` bytes (<= 128) of the
    /// offending header follow the 24-byte header.
    TermReq {
        /// C2HTermReq rather than H2CTermReq.
        c2h: bool,
        /// The header.
        hdr: TermReqHdr,
        /// Bytes of offending header that follow.
        data_len: u32,
    },
    /// CapsuleCmd with `data_len` bytes of in-capsule data at `pdo` (0 and 0 when none).
    CapsuleCmd {
        /// The command.
        sqe: Sqe,
        /// PDO: offset of the in-capsule data in the PDU, 0 without data.
        pdo: u8,
        /// In-capsule data bytes.
        data_len: u32,
        /// A data digest follows the data.
        ddgst: bool,
    },
    /// CapsuleResp.
    CapsuleResp {
        /// The completion.
        cqe: Cqe,
    },
    /// H2CData; `data_len == hdr.datal`, data at `hdr.ch.pdo`.
    H2CData {
        /// The header.
        hdr: DataHdr,
        /// Data bytes.
        data_len: u32,
        /// LAST_PDU flag.
        last: bool,
        /// A data digest follows the data.
        ddgst: bool,
    },
    /// C2HData; `data_len == hdr.datal`, data at `hdr.ch.pdo`.
    C2HData {
        /// The header.
        hdr: DataHdr,
        /// Data bytes.
        data_len: u32,
        /// LAST_PDU flag.
        last: bool,
        /// SUCCESS flag (only with LAST_PDU): no CapsuleResp follows.
        success: bool,
        /// A data digest follows the data.
        ddgst: bool,
    },
    /// R2T.
    R2T(R2tHdr),
}

impl PduHeader {
    /// The PDU type.
    pub const fn pdu_type(&self) -> PduType {
        match self {
            Self::IcReq(_) => PduType::IcReq,
            Self::IcResp(_) => PduType::IcResp,
            Self::TermReq { c2h: true, .. } => PduType::C2HTermReq,
            Self::TermReq { c2h: false, .. } => PduType::H2CTermReq,
            Self::CapsuleCmd { .. } => PduType::CapsuleCmd,
            Self::CapsuleResp { .. } => PduType::CapsuleResp,
            Self::H2CData { .. } => PduType::H2CData,
            Self::C2HData { .. } => PduType::C2HData,
            Self::R2T(_) => PduType::R2T,
        }
    }

    /// Offset of the data part from the start of the PDU (PDO; for a TermReq its HLEN, 24);
    /// 0 when there is no data. Bytes between the header (and header digest) and this offset
    /// are padding.
    pub const fn data_offset(&self) -> usize {
        match self {
            Self::TermReq { hdr, .. } => hdr.ch.hlen as usize,
            Self::CapsuleCmd { pdo, .. } => *pdo as usize,
            Self::H2CData { hdr, .. } | Self::C2HData { hdr, .. } => hdr.ch.pdo as usize,
            Self::IcReq(_) | Self::IcResp(_) | Self::CapsuleResp { .. } | Self::R2T(_) => 0,
        }
    }

    /// Bytes in the data part (without digest).
    pub const fn data_len(&self) -> u32 {
        match self {
            Self::TermReq { data_len, .. }
            | Self::CapsuleCmd { data_len, .. }
            | Self::H2CData { data_len, .. }
            | Self::C2HData { data_len, .. } => *data_len,
            Self::IcReq(_) | Self::IcResp(_) | Self::CapsuleResp { .. } | Self::R2T(_) => 0,
        }
    }

    /// Whether a 4-byte data digest follows the data.
    pub const fn has_data_digest(&self) -> bool {
        match self {
            Self::CapsuleCmd { ddgst, .. } | Self::H2CData { ddgst, .. } | Self::C2HData { ddgst, .. } => *ddgst,
            _ => false,
        }
    }
}

/// Where the data part of a PDU is, once validated.
struct DataPart {
    pdo: u8,
    len: u32,
    ddgst: bool,
}

/// Second parsing stage: validates the whole header of a PDU whose common header `ch` passed
/// [`CommonHeader::parse`], and returns it typed.
///
/// `header_with_digest` is the PDU's first [`CommonHeader::header_len`] bytes: HLEN bytes
/// (starting with the 8 bytes `ch` was parsed from) plus the 4-byte header digest when
/// `limits.hdgst` and the type carries digests. Checks, in this order (first failure wins):
/// - the type is known and sent in direction `dir` (FEI 0);
/// - HLEN is the type's (FEI 2) and the buffer has the right length;
/// - HDGSTF/DDGSTF agree with `limits` (FEI 1); ICReq/ICResp/TermReq carry none;
/// - the header digest;
/// - PDO and PLEN: PDUs without data have PDO 0 (FEI 3) and PLEN = HLEN + HDGST (FEI 4);
///   PDUs with data have PDO >= HLEN + HDGST (FEI 3), PLEN = PDO + data + DDGST (FEI 4),
///   0 < data <= `limits.max_data` (data transfer limit exceeded); TermReq PLEN 24..=152;
/// - type specific fields: ICReq PFV 0 and HPDA <= 31 (unsupported parameter); ICResp
///   likewise plus MAXH2CDATA; H2CData/C2HData DATAL equal to the data part (FEI 16);
///   C2HData SUCCESS only with LAST_PDU (FEI 1); R2T R2TL != 0 (FEI 16).
pub fn parse_pdu_header(
    ch: &CommonHeader,
    header_with_digest: &[u8],
    limits: &PduLimits,
    dir: Direction,
) -> Result<PduHeader, PduError> {
    let ty = ch.kind()?;
    if ty.direction() != dir {
        return Err(PduError::WrongDirection { pdu_type: ty, dir });
    }
    let t = ch.pdu_type;
    let hlen = ty.hlen();
    if ch.hlen != hlen {
        return Err(invalid(
            t,
            CommonHeader::OFFSET_HLEN,
            ch.hlen.into(),
            "HLEN is not the type's header length",
        ));
    }
    let hdgst = ty.carries_digests() && limits.hdgst;
    let hd = if hdgst { DIGEST_LEN } else { 0 };
    let expected = usize::from(hlen) + hd;
    if header_with_digest.len() != expected || header_with_digest.get(..8) != Some(ch.as_bytes()) {
        return Err(PduError::HeaderLength {
            expected,
            got: header_with_digest.len(),
        });
    }

    // Digest flags against the negotiation (§3.6.1: HDGSTF/DDGSTF).
    if !ty.carries_digests() {
        if ch.flags & (flags::HDGSTF | flags::DDGSTF) != 0 {
            return Err(invalid(
                t,
                CommonHeader::OFFSET_FLAGS,
                ch.flags.into(),
                "digest flag on a PDU type without digests",
            ));
        }
    } else {
        if (ch.flags & flags::HDGSTF != 0) != limits.hdgst {
            return Err(invalid(
                t,
                CommonHeader::OFFSET_FLAGS,
                ch.flags.into(),
                "HDGSTF disagrees with the negotiated header digest",
            ));
        }
        if ch.flags & flags::DDGSTF != 0 && !limits.ddgst {
            return Err(invalid(
                t,
                CommonHeader::OFFSET_FLAGS,
                ch.flags.into(),
                "DDGSTF set but data digests not negotiated",
            ));
        }
    }

    let (header, digest) = header_with_digest.split_at(usize::from(hlen));
    if let Ok(d) = <[u8; 4]>::try_from(digest) {
        let received = u32::from_le_bytes(d);
        let computed = crc32c(header);
        if computed != received {
            return Err(PduError::HeaderDigest { computed, received });
        }
    }

    let plen = ch.plen.get();
    let hdr_end = u32::from(hlen) + hd as u32;
    match ty {
        PduType::IcReq => {
            no_data(ch, hdr_end)?;
            let ic = read::<IcReq>(header)?;
            if ic.pfv.get() != PFV_1_0 {
                return Err(unsupported(
                    t,
                    IcReq::OFFSET_PFV,
                    ic.pfv.get().into(),
                    "PDU format version is not 0",
                ));
            }
            if ic.hpda > MAX_PDA {
                return Err(unsupported(t, IcReq::OFFSET_HPDA, ic.hpda.into(), "HPDA above 31"));
            }
            Ok(PduHeader::IcReq(ic))
        }
        PduType::IcResp => {
            no_data(ch, hdr_end)?;
            let ic = read::<IcResp>(header)?;
            if ic.pfv.get() != PFV_1_0 {
                return Err(unsupported(
                    t,
                    IcResp::OFFSET_PFV,
                    ic.pfv.get().into(),
                    "PDU format version is not 0",
                ));
            }
            if ic.cpda > MAX_PDA {
                return Err(unsupported(t, IcResp::OFFSET_CPDA, ic.cpda.into(), "CPDA above 31"));
            }
            let m = ic.maxh2cdata.get();
            if m < MIN_MAXH2CDATA || m % 4 != 0 {
                return Err(invalid(
                    t,
                    IcResp::OFFSET_MAXH2CDATA,
                    m,
                    "MAXH2CDATA below 4096 or not a multiple of 4",
                ));
            }
            Ok(PduHeader::IcResp(ic))
        }
        PduType::H2CTermReq | PduType::C2HTermReq => {
            if plen > TERM_REQ_MAX_PLEN {
                return Err(invalid(t, CommonHeader::OFFSET_PLEN, plen, "TermReq PLEN above 152"));
            }
            if plen < hdr_end {
                return Err(invalid(t, CommonHeader::OFFSET_PLEN, plen, "PLEN is less than HLEN"));
            }
            let hdr = read::<TermReqHdr>(header)?;
            Ok(PduHeader::TermReq {
                c2h: ty == PduType::C2HTermReq,
                hdr,
                data_len: plen - hdr_end,
            })
        }
        PduType::CapsuleCmd => {
            let data = data_part(ch, hdr_end, limits, false)?;
            let hdr = read::<CapsuleCmdHdr>(header)?;
            Ok(PduHeader::CapsuleCmd {
                sqe: hdr.sqe,
                pdo: data.pdo,
                data_len: data.len,
                ddgst: data.ddgst,
            })
        }
        PduType::CapsuleResp => {
            no_data(ch, hdr_end)?;
            let hdr = read::<CapsuleRespHdr>(header)?;
            Ok(PduHeader::CapsuleResp { cqe: hdr.cqe })
        }
        PduType::H2CData | PduType::C2HData => {
            let data = data_part(ch, hdr_end, limits, true)?;
            let hdr = read::<DataHdr>(header)?;
            if hdr.datal.get() != data.len {
                return Err(invalid(
                    t,
                    DataHdr::OFFSET_DATAL,
                    hdr.datal.get(),
                    "DATAL differs from the data in the PDU",
                ));
            }
            let last = ch.flags & flags::DATA_LAST != 0;
            if ty == PduType::H2CData {
                return Ok(PduHeader::H2CData {
                    hdr,
                    data_len: data.len,
                    last,
                    ddgst: data.ddgst,
                });
            }
            let success = ch.flags & flags::DATA_SUCCESS != 0;
            if success && !last {
                return Err(invalid(
                    t,
                    CommonHeader::OFFSET_FLAGS,
                    ch.flags.into(),
                    "SUCCESS without LAST_PDU",
                ));
            }
            Ok(PduHeader::C2HData {
                hdr,
                data_len: data.len,
                last,
                success,
                ddgst: data.ddgst,
            })
        }
        PduType::R2T => {
            no_data(ch, hdr_end)?;
            let hdr = read::<R2tHdr>(header)?;
            if hdr.r2tl.get() == 0 {
                return Err(invalid(t, R2tHdr::OFFSET_R2TL, 0, "R2TL is 0"));
            }
            Ok(PduHeader::R2T(hdr))
        }
    }
}

/// Length of a command capsule without in-capsule data or header digest: the CapsuleCmd
/// header alone.
pub const BARE_CAPSULE_CMD_LEN: usize = 72;

/// The common header of a command capsule without in-capsule data, sent without a header
/// digest: PDO 0 and PLEN = HLEN, DDGSTF clear as no data follows (NVMe/TCP 1.0 §3.6.2,
/// "CapsuleCmd"; §3.6.1 for the flags).
const BARE_CAPSULE_CMD_CH: [u8; 8] = zerocopy::transmute!(CommonHeader::new(
    PduType::CapsuleCmd,
    0,
    BARE_CAPSULE_CMD_LEN as u8,
    0,
    BARE_CAPSULE_CMD_LEN as u32,
));

/// The SQE of a command capsule that carries no in-capsule data, when header digests are not
/// negotiated; `None` for any other PDU.
///
/// Every read and every write that waits for R2T arrives as this PDU, so a target receives
/// it more than any other. Its common header then has one possible value, and comparing its
/// 8 bytes decides what [`CommonHeader::parse`] and [`parse_pdu_header`] would (a
/// host-to-controller type, HLEN, no digest flags, no data) at a fraction of their cost.
/// Anything else, including a well-formed capsule with data or a header digest, returns
/// `None` and takes the full parse, which also finds the errors.
pub fn parse_bare_capsule_cmd(bytes: &[u8]) -> Option<Sqe> {
    let pdu = bytes.first_chunk::<BARE_CAPSULE_CMD_LEN>()?;
    let (ch, sqe) = pdu.split_first_chunk::<8>()?;
    if *ch != BARE_CAPSULE_CMD_CH {
        return None;
    }
    Sqe::read_from_bytes(sqe).ok()
}

fn read<T: FromBytes>(header: &[u8]) -> Result<T, PduError> {
    T::read_from_bytes(header).map_err(|_| PduError::HeaderLength {
        expected: size_of::<T>(),
        got: header.len(),
    })
}

/// Checks of a PDU that never carries data: PDO 0, PLEN = HLEN + HDGST, no DDGSTF.
fn no_data(ch: &CommonHeader, hdr_end: u32) -> Result<(), PduError> {
    let t = ch.pdu_type;
    if ch.flags & flags::DDGSTF != 0 {
        return Err(invalid(
            t,
            CommonHeader::OFFSET_FLAGS,
            ch.flags.into(),
            "DDGSTF on a PDU without data",
        ));
    }
    if ch.pdo != 0 {
        return Err(invalid(
            t,
            CommonHeader::OFFSET_PDO,
            ch.pdo.into(),
            "PDO must be 0 on a PDU without data",
        ));
    }
    if ch.plen.get() != hdr_end {
        return Err(invalid(
            t,
            CommonHeader::OFFSET_PLEN,
            ch.plen.get(),
            "PLEN must be HLEN plus header digest",
        ));
    }
    Ok(())
}

/// Checks the data layout of a CapsuleCmd (data optional) or H2CData/C2HData (data
/// required).
fn data_part(ch: &CommonHeader, hdr_end: u32, limits: &PduLimits, required: bool) -> Result<DataPart, PduError> {
    let t = ch.pdu_type;
    let plen = ch.plen.get();
    let ddgst = ch.flags & flags::DDGSTF != 0;
    if ch.pdo == 0 {
        if required {
            return Err(invalid(t, CommonHeader::OFFSET_PDO, 0, "PDO is 0 on a data PDU"));
        }
        no_data(ch, hdr_end)?;
        return Ok(DataPart {
            pdo: 0,
            len: 0,
            ddgst: false,
        });
    }
    if u32::from(ch.pdo) < hdr_end {
        return Err(invalid(
            t,
            CommonHeader::OFFSET_PDO,
            ch.pdo.into(),
            "PDO points into the header or header digest",
        ));
    }
    if limits.ddgst && !ddgst {
        return Err(invalid(
            t,
            CommonHeader::OFFSET_FLAGS,
            ch.flags.into(),
            "DDGSTF clear but data digests negotiated",
        ));
    }
    let dd = if ddgst { DIGEST_LEN as u32 } else { 0 };
    let len = match plen.checked_sub(u32::from(ch.pdo) + dd) {
        Some(len) if len > 0 => len,
        _ => {
            return Err(invalid(
                t,
                CommonHeader::OFFSET_PLEN,
                plen,
                "PLEN leaves no data after PDO",
            ));
        }
    };
    if len > limits.max_data {
        return Err(PduError::DataLimitExceeded {
            pdu_type: t,
            len,
            max: limits.max_data,
        });
    }
    Ok(DataPart {
        pdo: ch.pdo,
        len,
        ddgst,
    })
}

// ---------------------------------------------------------------------------------------------
// Encoders
// ---------------------------------------------------------------------------------------------

/// Writes the header digest of `buf[..hlen]` at `buf[hlen..hlen + 4]` when `hdgst`, and
/// returns the header length including the digest.
fn finish_header(buf: &mut [u8], hlen: usize, hdgst: bool) -> usize {
    if !hdgst {
        return hlen;
    }
    let digest = crc32c(&buf[..hlen]).to_le_bytes();
    buf[hlen..hlen + DIGEST_LEN].copy_from_slice(&digest);
    hlen + DIGEST_LEN
}

const fn dgst_bits(hdgst: bool, ddgst: bool) -> u8 {
    (if hdgst { dgst::HDGST_ENABLE } else { 0 }) | (if ddgst { dgst::DDGST_ENABLE } else { 0 })
}

const fn digest_flags(hdgst: bool, ddgst: bool) -> u8 {
    (if hdgst { flags::HDGSTF } else { 0 }) | (if ddgst { flags::DDGSTF } else { 0 })
}

/// An ICReq asking for the given digests, MAXR2T (0's based) and HPDA.
pub fn encode_ic_req(hdgst: bool, ddgst: bool, maxr2t: u32, hpda: u8) -> [u8; 128] {
    let pdu = IcReq {
        ch: CommonHeader::new(PduType::IcReq, 0, 128, 0, 128),
        pfv: U16::new(PFV_1_0),
        hpda,
        dgst: dgst_bits(hdgst, ddgst),
        maxr2t: U32::new(maxr2t),
        rsvd: [0; 112],
    };
    zerocopy::transmute!(pdu)
}

/// An ICResp enabling the given digests, with MAXH2CDATA and CPDA.
pub fn encode_ic_resp(hdgst: bool, ddgst: bool, maxh2cdata: u32, cpda: u8) -> [u8; 128] {
    let pdu = IcResp {
        ch: CommonHeader::new(PduType::IcResp, 0, 128, 0, 128),
        pfv: U16::new(PFV_1_0),
        cpda,
        dgst: dgst_bits(hdgst, ddgst),
        maxh2cdata: U32::new(maxh2cdata),
        rsvd: [0; 112],
    };
    zerocopy::transmute!(pdu)
}

/// A CapsuleCmd header (and header digest) for `sqe` followed by `in_capsule_data_len`
/// bytes of data; returns the buffer and the bytes used (72 or 76). The caller sends the
/// data and, when `ddgst` and there is data, its digest.
pub fn encode_capsule_cmd(sqe: &Sqe, in_capsule_data_len: u32, hdgst: bool, ddgst: bool) -> ([u8; 76], usize) {
    let hlen = PduType::CapsuleCmd.hlen();
    let hdr_end = u32::from(hlen) + if hdgst { DIGEST_LEN as u32 } else { 0 };
    let has_data = in_capsule_data_len > 0;
    let ddgst = ddgst && has_data;
    let plen = hdr_end
        .saturating_add(in_capsule_data_len)
        .saturating_add(if ddgst { DIGEST_LEN as u32 } else { 0 });
    let pdo = if has_data { hdr_end as u8 } else { 0 };
    let hdr = CapsuleCmdHdr {
        ch: CommonHeader::new(PduType::CapsuleCmd, digest_flags(hdgst, ddgst), hlen, pdo, plen),
        sqe: *sqe,
    };
    let mut buf = [0u8; 76];
    buf[..72].copy_from_slice(hdr.as_bytes());
    let n = finish_header(&mut buf, 72, hdgst);
    (buf, n)
}

/// A CapsuleResp for `cqe`; returns the buffer and the bytes used (24 or 28).
pub fn encode_capsule_resp(cqe: &Cqe, hdgst: bool) -> ([u8; 28], usize) {
    let hlen = PduType::CapsuleResp.hlen();
    let plen = u32::from(hlen) + if hdgst { DIGEST_LEN as u32 } else { 0 };
    let hdr = CapsuleRespHdr {
        ch: CommonHeader::new(PduType::CapsuleResp, digest_flags(hdgst, false), hlen, 0, plen),
        cqe: *cqe,
    };
    let mut buf = [0u8; 28];
    buf[..24].copy_from_slice(hdr.as_bytes());
    let n = finish_header(&mut buf, 24, hdgst);
    (buf, n)
}

fn encode_data_hdr(ty: PduType, cccid: u16, ttag: u16, datao: u32, datal: u32, pdu_flags: u8) -> ([u8; 28], usize) {
    let hdgst = pdu_flags & flags::HDGSTF != 0;
    let ddgst = pdu_flags & flags::DDGSTF != 0;
    let hlen = ty.hlen();
    let hdr_end = u32::from(hlen) + if hdgst { DIGEST_LEN as u32 } else { 0 };
    let plen = hdr_end
        .saturating_add(datal)
        .saturating_add(if ddgst { DIGEST_LEN as u32 } else { 0 });
    let hdr = DataHdr {
        ch: CommonHeader::new(ty, pdu_flags, hlen, hdr_end as u8, plen),
        cccid: U16::new(cccid),
        ttag: U16::new(ttag),
        datao: U32::new(datao),
        datal: U32::new(datal),
        rsvd: [0; 4],
    };
    let mut buf = [0u8; 28];
    buf[..24].copy_from_slice(hdr.as_bytes());
    let n = finish_header(&mut buf, 24, hdgst);
    (buf, n)
}

/// A C2HData header for `datal` bytes at offset `datao` of command `cccid`; returns the
/// buffer and the bytes used (24 or 28). `success` (no CapsuleResp follows) implies `last`:
/// LAST_PDU is set whenever SUCCESS is.
pub fn encode_c2h_data_hdr(
    cccid: u16,
    datao: u32,
    datal: u32,
    last: bool,
    success: bool,
    hdgst: bool,
    ddgst: bool,
) -> ([u8; 28], usize) {
    let f = if success {
        flags::DATA_LAST | flags::DATA_SUCCESS
    } else if last {
        flags::DATA_LAST
    } else {
        0
    };
    encode_data_hdr(PduType::C2HData, cccid, 0, datao, datal, f | digest_flags(hdgst, ddgst))
}

/// An H2CData header for `datal` bytes at offset `datao` of command `cccid`, answering the
/// R2T with transfer tag `ttag`; returns the buffer and the bytes used (24 or 28).
pub fn encode_h2c_data_hdr(
    cccid: u16,
    ttag: u16,
    datao: u32,
    datal: u32,
    last: bool,
    hdgst: bool,
    ddgst: bool,
) -> ([u8; 28], usize) {
    let f = if last { flags::DATA_LAST } else { 0 };
    encode_data_hdr(
        PduType::H2CData,
        cccid,
        ttag,
        datao,
        datal,
        f | digest_flags(hdgst, ddgst),
    )
}

/// An R2T asking for `r2tl` bytes at offset `r2to` of command `cccid`, tagged `ttag`;
/// returns the buffer and the bytes used (24 or 28).
pub fn encode_r2t(cccid: u16, ttag: u16, r2to: u32, r2tl: u32, hdgst: bool) -> ([u8; 28], usize) {
    let hlen = PduType::R2T.hlen();
    let plen = u32::from(hlen) + if hdgst { DIGEST_LEN as u32 } else { 0 };
    let hdr = R2tHdr {
        ch: CommonHeader::new(PduType::R2T, digest_flags(hdgst, false), hlen, 0, plen),
        cccid: U16::new(cccid),
        ttag: U16::new(ttag),
        r2to: U32::new(r2to),
        r2tl: U32::new(r2tl),
        rsvd: [0; 4],
    };
    let mut buf = [0u8; 28];
    buf[..24].copy_from_slice(hdr.as_bytes());
    let n = finish_header(&mut buf, 24, hdgst);
    (buf, n)
}

/// A C2HTermReq (`c2h`) or H2CTermReq with the given FES and FEI, carrying at most 128
/// bytes of `offending_header`; returns the buffer and the bytes used (24..=152). TermReqs
/// never carry digests; PDO is 0.
pub fn encode_term_req(c2h: bool, fes: u16, fei: u32, offending_header: &[u8]) -> ([u8; 152], usize) {
    let ty = if c2h { PduType::C2HTermReq } else { PduType::H2CTermReq };
    let n = offending_header.len().min(TERM_REQ_MAX_DATA);
    let hlen = ty.hlen();
    let hdr = TermReqHdr {
        ch: CommonHeader::new(ty, 0, hlen, 0, u32::from(hlen) + n as u32),
        fes: U16::new(fes),
        fei: U32::new(fei),
        rsvd: [0; 10],
    };
    let mut buf = [0u8; 152];
    buf[..24].copy_from_slice(hdr.as_bytes());
    buf[24..24 + n].copy_from_slice(&offending_header[..n]);
    (buf, 24 + n)
}

/// The TermReq answering `err` about the PDU whose header is `offending_header`, sent in
/// direction `sending` (a target sends [`Direction::ControllerToHost`]: C2HTermReq).
/// `None` for a non-fatal error.
pub fn encode_term_req_for(err: &PduError, sending: Direction, offending_header: &[u8]) -> Option<([u8; 152], usize)> {
    err.is_fatal().then(|| {
        encode_term_req(
            sending == Direction::ControllerToHost,
            err.fes(),
            err.fei(),
            offending_header,
        )
    })
}
