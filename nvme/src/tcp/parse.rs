//! Receive-side parser: [`PduLimits`], [`PduHeader`] and [`parse_pdu_header`], the second
//! parsing stage.

use zerocopy::{FromBytes, IntoBytes};

use super::error::{invalid, unsupported};
use super::{
    CapsuleCmdHdr, CapsuleRespHdr, CommonHeader, DIGEST_LEN, DataHdr, Direction, IcReq, IcResp, MAX_PDA,
    MIN_MAXH2CDATA, PFV_1_0, PduError, PduType, R2tHdr, TERM_REQ_MAX_PLEN, TermReqHdr, crc32c, flags,
};
use crate::spec::{Cqe, Sqe};

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
