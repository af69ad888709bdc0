//! Receive-side fast path: [`parse_bare_capsule_cmd`], a command capsule without in-capsule
//! data recognised by its common header alone.

use zerocopy::FromBytes;

#[cfg(doc)]
use super::parse_pdu_header;
use super::{CommonHeader, PduType};
use crate::spec::Sqe;

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
