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

mod digest;
mod encode;
mod error;
mod fast;
mod frame;
mod parse;
mod pdu;
mod rxbuf;
mod term_req;

pub use digest::{Crc32c, check_data_digest, crc32c};
pub use encode::{
    encode_c2h_data_hdr, encode_capsule_cmd, encode_capsule_resp, encode_h2c_data_hdr, encode_ic_req, encode_ic_resp,
    encode_r2t,
};
pub use error::PduError;
pub use fast::{BARE_CAPSULE_CMD_LEN, parse_bare_capsule_cmd};
pub use frame::{Frame, FrameError, FrameErrorKind, Framed, next_frame};
pub use parse::{PduHeader, PduLimits, parse_pdu_header};
pub use pdu::{
    CapsuleCmdHdr, CapsuleRespHdr, CommonHeader, DataHdr, Direction, IcReq, IcResp, PduType, R2tHdr, TermReqHdr,
};
pub use rxbuf::{Recv, RxBuf};
pub use term_req::{encode_term_req, encode_term_req_for};

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
/// In-capsule data a target accepts on the admin queue (NVMe/TCP 1.0 §3.3.1: 8 KiB for
/// fabrics and admin commands).
pub const ADMIN_IN_CAPSULE: u32 = 8192;

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
