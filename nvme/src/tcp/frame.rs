//! The PDU framer: the next PDU at the front of a receive buffer, validated, and where it ends
//! (NVMe/TCP 1.0 §3.6.1 for the common header, §3.6.2 for the PDU headers).
//!
//! Both receivers walk their bytes with [`next_frame`], each keeping its own state machine
//! around it: a target ([`Direction::HostToController`]) with its ICReq rule and its in-place
//! H2CData, a host ([`Direction::ControllerToHost`]) with its in-place C2HData.

use std::fmt;

use super::{
    CommonHeader, DIGEST_LEN, Direction, PduError, PduHeader, PduLimits, PduType, TERM_REQ_MAX_DATA, check_data_digest,
    parse_pdu_header,
};

/// A PDU with a valid header at the front of a receive buffer, as [`next_frame`] found it.
///
/// A receiver that recognises a header on its own (say by comparing bytes with the one
/// header it expects) may build one: `hl` and `plen` then mean the same.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame {
    /// The validated header.
    pub hdr: PduHeader,
    /// Header length, header digest included ([`CommonHeader::header_len`]): the bytes a
    /// TermReq about this PDU carries, and where padding or data start.
    pub hl: usize,
    /// PDU length (PLEN): header, header digest, padding, data and data digest.
    pub plen: usize,
}

impl Frame {
    /// The data part of the PDU whose bytes start `pdu`, as far as `pdu` holds it: all of it
    /// ([`PduHeader::data_len`] bytes from [`PduHeader::data_offset`]) when `pdu` has the
    /// whole PDU, as for [`Framed::Pdu`]; what arrived of it for [`Framed::Header`]. Empty
    /// for a PDU without data.
    #[inline]
    pub fn data<'a>(&self, pdu: &'a [u8]) -> &'a [u8] {
        let len = self.hdr.data_len() as usize;
        match pdu.get(self.hdr.data_offset()..) {
            Some(data) => data.get(..len).unwrap_or(data),
            None => &[],
        }
    }

    /// The data digest that follows the data (NVMe/TCP 1.0 §3.6.1, DDGST), `None` when the
    /// PDU carries none or `pdu` does not reach it.
    #[inline]
    pub fn data_digest(&self, pdu: &[u8]) -> Option<u32> {
        if !self.hdr.has_data_digest() {
            return None;
        }
        let at = self.hdr.data_offset() + self.hdr.data_len() as usize;
        let digest = pdu.get(at..)?.first_chunk::<DIGEST_LEN>()?;
        Some(u32::from_le_bytes(*digest))
    }

    /// Whether the data digest checks ([`check_data_digest`]): true for a PDU without one,
    /// false when `pdu` does not hold all the data and the digest. A mismatch is not fatal
    /// ([`PduError::is_fatal`]): the command fails, not the connection.
    #[inline]
    pub fn digest_ok(&self, pdu: &[u8]) -> bool {
        if !self.hdr.has_data_digest() {
            return true;
        }
        let data = self.data(pdu);
        match self.data_digest(pdu) {
            Some(digest) if data.len() == self.hdr.data_len() as usize => check_data_digest(data, digest).is_ok(),
            _ => false,
        }
    }
}

/// What [`next_frame`] found at the front of the bytes it was given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framed {
    /// A whole PDU: its `plen` bytes are there.
    Pdu(Frame),
    /// A valid header whose data is not all there yet (fewer than `plen` bytes): wait for
    /// `plen` bytes, or receive the data elsewhere (in place) from here.
    Header(Frame),
    /// Too few bytes to go on: wait until there are this many in all (8 for the common
    /// header, then the header and its digest).
    Need(usize),
}

/// Why [`next_frame`] stopped: see [`FrameError`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FrameErrorKind<E> {
    /// The PDU breaks a header rule; [`PduError::fes`] and [`PduError::fei`] give the
    /// TermReq ([`super::encode_term_req_for`]).
    Pdu(PduError),
    /// The receiver's limits callback refused the PDU type (e.g. the target's "ICReq first
    /// and only once", NVMe/TCP 1.0 §3.6.2.1: FES PDU Sequence Error).
    Refused(E),
    /// PLEN is larger than the receiver can hold (the `max_plen` given to [`next_frame`]).
    /// [`parse_pdu_header`] bounds the data by [`PduLimits::max_data`] first, so a receiver
    /// whose buffer fits its limits never sees this; its TermReq would carry FES Data
    /// Transfer Limit Exceeded, FEI 4 (PLEN).
    TooLarge {
        /// The PDU's PLEN.
        plen: usize,
        /// The most the receiver can hold.
        max: usize,
    },
}

/// A PDU the receiver cannot take: the connection ends with a TermReq (NVMe/TCP 1.0 §3.6.2,
/// H2CTermReq/C2HTermReq) whose data is the offending header, `header_len` leading bytes of
/// the input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrameError<E> {
    /// What is wrong.
    pub kind: FrameErrorKind<E>,
    /// The leading bytes of the input that form the offending PDU header, at most
    /// [`TERM_REQ_MAX_DATA`] and never more than the input: for an error in the common
    /// header (HLEN, and so the header's extent, not trusted) every byte there was, up to
    /// 128; for a refused type its 8 bytes; otherwise the header with its digest (`hl`).
    pub header_len: usize,
}

impl<E> FrameError<E> {
    /// The offending header: the first [`FrameError::header_len`] bytes of `input`, the bytes
    /// given to [`next_frame`].
    pub fn offending_header<'a>(&self, input: &'a [u8]) -> &'a [u8] {
        input.get(..self.header_len).unwrap_or(input)
    }
}

impl<E: fmt::Display> fmt::Display for FrameError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            FrameErrorKind::Pdu(e) => e.fmt(f),
            FrameErrorKind::Refused(e) => write!(f, "PDU refused: {e}"),
            FrameErrorKind::TooLarge { plen, max } => write!(f, "PDU of {plen} bytes, at most {max} fit"),
        }
    }
}

impl<E: fmt::Debug + fmt::Display> std::error::Error for FrameError<E> {}

/// The PDU at the front of `avail`, the unread bytes of a receive buffer, arriving in
/// direction `dir`.
///
/// `limits` gives the receiver's [`PduLimits`] for the PDU's type once its common header is
/// valid, before the rest of the header is looked at; it may refuse the type instead
/// ([`FrameErrorKind::Refused`]). `max_plen` is the largest PDU the receiver can hold
/// ([`FrameErrorKind::TooLarge`] above; `usize::MAX` for a buffer that grows).
///
/// The checks, in this order (the first that fails decides):
/// 1. fewer than 8 bytes: [`Framed::Need`]`(8)`;
/// 2. the common header ([`CommonHeader::parse`]: type, HLEN, PLEN >= HLEN);
/// 3. `limits`;
/// 4. fewer than `hl` bytes ([`CommonHeader::header_len`]): [`Framed::Need`]`(hl)`;
/// 5. the header ([`parse_pdu_header`]);
/// 6. PLEN against `max_plen`;
/// 7. fewer than PLEN bytes: [`Framed::Header`], else [`Framed::Pdu`].
///
/// The answer depends only on the PDU's bytes that are there, not on how they arrived:
/// however a stream is split, the same frames and errors come out of it (an error in the
/// common header comes with up to 128 of the bytes there were, see
/// [`FrameError::header_len`]).
///
/// # Example
/// A target's receive loop; a host's is the same in the other direction, without the ICReq
/// rule.
/// ```
/// use std::io::Write;
/// use std::os::unix::net::UnixStream;
/// use pollux_nvme::tcp::*;
///
/// let (sock, mut host) = UnixStream::pair()?;
/// host.write_all(&encode_ic_req(false, false, 0, 0))?;
/// drop(host);
/// let (mut rx, mut ic_done) = (RxBuf::new(64 * 1024), false);
/// 'conn: loop {
///     rx.make_room(0);
///     if rx.recv(&sock)? == Recv::Eof {
///         break;
///     }
///     loop {
///         let avail = rx.avail();
///         let framed = next_frame(avail, Direction::HostToController, rx.capacity(), |_, ty| {
///             // NVMe/TCP 1.0 §3.6.2.1: ICReq first and only once.
///             if (ty == PduType::IcReq) == ic_done {
///                 return Err("ICReq first and only once");
///             }
///             Ok(PduLimits { hdgst: false, ddgst: false, max_data: 8192 })
///         });
///         match framed {
///             Ok(Framed::Pdu(f)) => {
///                 let pdu = &avail[..f.plen];
///                 let (data, digest_ok, header) = (f.data(pdu), f.digest_ok(pdu), &pdu[..f.hl]);
///                 ic_done |= matches!(f.hdr, PduHeader::IcReq(_)); // dispatch here
///                 rx.consume(f.plen);
///             }
///             // A large H2CData's data could be received in place from here (RxBuf::recv_into).
///             Ok(Framed::Header(_) | Framed::Need(_)) => break,
///             Err(e) => {
///                 let header = e.offending_header(avail);
///                 if let FrameErrorKind::Pdu(err) = &e.kind {
///                     let _term_req = encode_term_req_for(err, Direction::ControllerToHost, header);
///                 }
///                 break 'conn;
///             }
///         }
///     }
/// }
/// assert!(ic_done);
/// # Ok::<(), std::io::Error>(())
/// ```
#[inline]
pub fn next_frame<E>(
    avail: &[u8],
    dir: Direction,
    max_plen: usize,
    limits: impl FnOnce(&CommonHeader, PduType) -> Result<PduLimits, E>,
) -> Result<Framed, FrameError<E>> {
    let Some(ch8) = avail.first_chunk::<8>() else {
        return Ok(Framed::Need(8));
    };
    let (ch, ty) = CommonHeader::parse_typed(ch8).map_err(|e| FrameError {
        kind: FrameErrorKind::Pdu(e),
        header_len: avail.len().min(TERM_REQ_MAX_DATA),
    })?;
    let limits = limits(&ch, ty).map_err(|e| FrameError {
        kind: FrameErrorKind::Refused(e),
        header_len: ch8.len(),
    })?;
    let hl = usize::from(ch.hlen)
        + if ty.carries_digests() && limits.hdgst {
            DIGEST_LEN
        } else {
            0
        };
    let Some(header) = avail.get(..hl) else {
        return Ok(Framed::Need(hl));
    };
    // HLEN is the type's (at most 128, an ICReq's, which carries no digest): the header with
    // its digest fits in a TermReq.
    let hdr = parse_pdu_header(&ch, header, &limits, dir).map_err(|e| FrameError {
        kind: FrameErrorKind::Pdu(e),
        header_len: hl.min(TERM_REQ_MAX_DATA),
    })?;
    let plen = ch.plen.get() as usize;
    if plen > max_plen {
        return Err(FrameError {
            kind: FrameErrorKind::TooLarge { plen, max: max_plen },
            header_len: hl.min(TERM_REQ_MAX_DATA),
        });
    }
    let frame = Frame { hdr, hl, plen };
    Ok(if avail.len() < plen {
        Framed::Header(frame)
    } else {
        Framed::Pdu(frame)
    })
}
