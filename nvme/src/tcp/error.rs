//! Errors: [`PduError`], the crate's one error type, and the TermReq fields it maps to.

#[cfg(doc)]
use super::parse_pdu_header;
use super::{CommonHeader, Direction, PduType, fes};
use crate::spec::Status;

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

pub(super) const fn invalid(pdu_type: u8, offset: u8, value: u32, reason: &'static str) -> PduError {
    PduError::InvalidHeaderField {
        pdu_type,
        offset,
        value,
        reason,
    }
}

pub(super) const fn unsupported(pdu_type: u8, offset: u8, value: u32, reason: &'static str) -> PduError {
    PduError::UnsupportedParameter {
        pdu_type,
        offset,
        value,
        reason,
    }
}
