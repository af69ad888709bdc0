//! Host-to-controller data after an R2T (NVMe/TCP 1.0 §3.6.2.6-7): the rules an H2CData PDU
//! must follow and its reception in place. The buffer the data goes into and the pool it
//! comes from are the queue's ([`crate::queue::data`]): any transport's data lands there.

use pollux_nvme::tcp::{CommonHeader, DataHdr, fes, flags};

use super::Fatal;
use crate::close::CloseReason;
use crate::queue::data::{DataBuf, DataProgress};
use crate::queue::request::{ReqState, Request, Requests};

/// An H2CData PDU with at least this many data bytes still to come when its header is parsed
/// has them received from the socket straight into its command's buffer (the R2T buffer, or
/// the DMA buffer of an SSD write) instead of into the receive buffer and then a copy.
pub const DIRECT_MIN: usize = 4096;
/// While data is received in place, the same `readv` reads at most this much of what follows
/// into the receive buffer: enough for the next PDU's header (and a stream of small PDUs), so
/// that a large next payload mostly goes in place too.
pub const DIRECT_TAIL: usize = 8192;

/// Check an H2CData header against the R2T it names (its progress `p`): each H2CData
/// continues where the last ended and stays inside the R2T (NVMe/TCP 1.0 §3.6.2.7).
pub fn check_h2c(p: &DataProgress, hdr: &DataHdr) -> Result<(), Fatal> {
    let (datao, datal) = (hdr.datao.get(), hdr.datal.get());
    if datao != p.received || u64::from(datao) + u64::from(datal) > u64::from(p.len) {
        let fei = u32::from(DataHdr::OFFSET_DATAO);
        return Err(Fatal::new(
            fes::DATA_TRANSFER_OUT_OF_RANGE,
            fei,
            CloseReason::DataOutOfRange,
        ));
    }
    // NVMe/TCP 1.0 §3.6.2.7: LAST_PDU is set on the PDU that ends the R2T's data and on
    // no other. Without it on the final PDU the host says more is coming when nothing
    // can; with it on a short one the data ends before the command's length, and the
    // command would wait for bytes that never come. Either way the FLAGS field is wrong.
    let last = hdr.ch.flags & flags::DATA_LAST != 0;
    let ends = datao + datal == p.len;
    if last != ends {
        let why = if last {
            CloseReason::LastPduEarly
        } else {
            CloseReason::LastPduMissing
        };
        return Err(Fatal::new(
            fes::INVALID_HEADER_FIELD,
            u32::from(CommonHeader::OFFSET_FLAGS),
            why,
        ));
    }
    Ok(())
}

/// The fatal error for an H2CData whose TTAG names no outstanding R2T of its command.
pub fn unknown_ttag() -> Fatal {
    Fatal::new(
        fes::INVALID_HEADER_FIELD,
        u32::from(DataHdr::OFFSET_TTAG),
        CloseReason::UnknownTtag,
    )
}

/// An H2CData PDU whose data is being received in place (see [`DIRECT_MIN`]). Until all of
/// it is in, no other PDU can be parsed: the stream is in the middle of this one.
#[derive(Debug, Clone, Copy)]
pub struct DirectRx {
    /// The R2T it answers (its request slot) and that command's CID.
    pub ttag: usize,
    /// The command's CID.
    pub cid: u16,
    /// Where the next data byte goes in the command's buffer.
    pub at: u32,
    /// Data bytes still to come.
    pub left: u32,
    /// DATAL of the PDU: once all of it is in (`left` 0), its digest covers
    /// `[at - datal, at)`.
    pub datal: u32,
    /// A data digest follows the data (negotiated in ICReq/ICResp).
    pub ddgst: bool,
}

/// The buffer that in-place data of `d` goes into, while it exists: None once the command
/// completed early (an Abort freed its buffer), when its data is only drained.
pub fn live_buf<'a>(reqs: &'a mut Requests, d: &DirectRx) -> Option<&'a mut DataBuf> {
    match reqs.get_mut(d.ttag) {
        Some(Request {
            cid,
            state: ReqState::AwaitingData { buf, .. },
            ..
        }) if *cid == d.cid => Some(buf),
        _ => None,
    }
}
