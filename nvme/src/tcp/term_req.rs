//! TermReq helpers: encoding an H2CTermReq/C2HTermReq, and the one answering a [`PduError`].

use zerocopy::IntoBytes;
use zerocopy::little_endian::{U16, U32};

use super::{CommonHeader, Direction, PduError, PduType, TERM_REQ_MAX_DATA, TermReqHdr};

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
