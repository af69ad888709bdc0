//! Encoders: the header (and header digest) of each PDU a host or a target sends, except
//! the TermReqs ([`super::term_req`]).

use zerocopy::IntoBytes;
use zerocopy::little_endian::{U16, U32};

use super::{
    CapsuleCmdHdr, CapsuleRespHdr, CommonHeader, DIGEST_LEN, DataHdr, IcReq, IcResp, PFV_1_0, PduType, R2tHdr, crc32c,
    dgst, flags,
};
use crate::spec::{Cqe, Sqe};

/// Writes the header digest of `buf[..hlen]` at `buf[hlen..hlen + 4]` when `hdgst`, and
/// returns the header length including the digest.
#[inline]
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
#[inline(always)]
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

#[inline]
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
#[inline(always)]
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
#[inline(always)]
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
