//! The receive path: framing and dispatching the PDUs the controller sends, C2HData into
//! the commands' buffers (in place for a lone read), completions.

use std::convert::Infallible;

use pollux_nvme::spec::Status;
use pollux_nvme::tcp::{
    DataHdr, Direction, Frame, FrameError, FrameErrorKind, Framed, PduHeader, PduType, Recv, RxBuf, check_data_digest,
    crc32c, encode_c2h_data_hdr, encode_h2c_data_hdr, next_frame,
};
use zerocopy::FromBytes;

use super::send::queue_data;
use super::{C2H_HLEN, Completion, Dir, HostQueue, IN_PLACE_MIN, Slot, io_err};
use crate::error::HostError;

/// The header at the front of `bytes` if it is, to the byte, the one C2HData PDU a target
/// sends for command `cid`'s read of `len` bytes (NVMe/TCP §3.6.2.8: LAST_PDU, with or
/// without SUCCESS, data right after the header, DDGSTF as negotiated, no header digest).
/// Comparing with those 24 bytes is a tenth of the instructions of a field-by-field parse,
/// and accepts nothing that the parse would refuse; any other header takes the parse.
pub(crate) fn expected_c2h(bytes: &[u8], cid: u16, len: u32, ddgst: bool) -> Option<PduHeader> {
    for success in [true, false] {
        let (b, n) = encode_c2h_data_hdr(cid, 0, len, true, success, false, ddgst);
        if bytes.get(..n) == b.get(..n)
            && let Ok(hdr) = DataHdr::read_from_bytes(&b[..n])
        {
            return Some(PduHeader::C2HData {
                hdr,
                data_len: len,
                last: true,
                success,
                ddgst,
            });
        }
    }
    None
}

/// What one read of the receive buffer ([`RxBuf::recv`], [`RxBuf::recv_into`]) brought: the
/// bytes appended to the buffer and those placed in a command's buffer, or None when nothing
/// was there. The end of the stream or an error closes the queue. Inlined: it runs on every
/// poll of a waiting client, and as a call it cost ~30 instructions a read.
#[inline(always)]
fn received(closed: &mut bool, r: std::io::Result<Recv>) -> Result<Option<(usize, usize)>, HostError> {
    match r {
        Ok(Recv::Data { buffered, placed, .. }) => Ok(Some((buffered, placed))),
        Ok(Recv::Empty | Recv::Full) => Ok(None),
        Ok(Recv::Eof) => {
            *closed = true;
            Err(HostError::Closed)
        }
        Err(e) => {
            *closed = true;
            Err(io_err(e))
        }
    }
}

/// A PDU the framer refused: the target broke the header rules.
fn frame_error(e: FrameError<Infallible>) -> HostError {
    match e.kind {
        FrameErrorKind::Pdu(e) => HostError::BadPdu(e),
        FrameErrorKind::Refused(never) => match never {},
        FrameErrorKind::TooLarge { plen, max } => HostError::Protocol(format!("PDU of {plen} bytes, at most {max}")),
    }
}

impl HostQueue {
    /// Handles the complete PDUs in the receive buffer; returns the completions delivered.
    pub(super) fn process<F: FnMut(Completion)>(&mut self, f: &mut F) -> Result<usize, HostError> {
        let mut n = 0;
        if let Some(PduHeader::C2HData {
            hdr,
            data_len,
            success,
            ddgst,
            ..
        }) = self.landed.take()
        {
            // The data is in the command's buffer already; its digest, if any, came next
            // (`in_place_header` checked that it did).
            let digest = if ddgst {
                let Some(&d) = self.rx.avail().first_chunk::<4>() else {
                    return Err(self.protocol("data digest outside the receive buffer".into()));
                };
                self.rx.consume(4);
                Some(u32::from_le_bytes(d))
            } else {
                None
            };
            n += self.c2h_data(&hdr, data_len, success, ddgst, None, digest, f)?;
        }
        let framed = self.peek(self.rx.avail());
        let Some(p) = self.complete_pdu(framed)? else {
            return Ok(n);
        };
        // The receive buffer leaves `self` while its PDUs are dispatched (`dispatch` needs
        // `self` and a PDU's bytes at once), once for all of them, and only when there is
        // one: most polls find none.
        let mut rx = std::mem::take(&mut self.rx);
        let r = self.dispatch_all(p, &mut rx, f);
        self.rx = rx;
        Ok(n + r?)
    }

    /// Dispatches `p`, the complete PDU at the front of `rx` (the receive buffer, out of
    /// `self`), and every complete PDU after it.
    fn dispatch_all<F: FnMut(Completion)>(
        &mut self,
        mut p: Frame,
        rx: &mut RxBuf,
        f: &mut F,
    ) -> Result<usize, HostError> {
        let mut n = 0;
        loop {
            self.need = 8;
            let res = match rx.avail().get(..p.plen) {
                Some(pdu) => self.dispatch(&p, pdu, f),
                None => Err(HostError::Protocol("PDU outside the receive buffer".into())),
            };
            rx.consume(p.plen);
            n += res?;
            let framed = self.peek(rx.avail());
            match self.complete_pdu(framed)? {
                Some(next) => p = next,
                None => return Ok(n),
            }
        }
    }

    /// What [`HostQueue::peek`] found, for the receive loop: the complete PDU, or None after
    /// setting `need`; an error closes the queue.
    #[inline(always)]
    fn complete_pdu(&mut self, framed: Result<Framed, HostError>) -> Result<Option<Frame>, HostError> {
        match framed {
            Ok(Framed::Pdu(p)) => Ok(Some(p)),
            Ok(Framed::Header(p)) => {
                self.need = p.plen;
                Ok(None)
            }
            Ok(Framed::Need(n)) => {
                self.need = n;
                Ok(None)
            }
            Err(e) => {
                self.closed = true;
                Err(e)
            }
        }
    }

    /// The PDU at the front of `avail`, the unread bytes of the receive buffer: whole, or the
    /// bytes it needs.
    fn peek(&self, avail: &[u8]) -> Result<Framed, HostError> {
        let Some(ch8) = avail.first_chunk::<8>() else {
            return Ok(Framed::Need(8));
        };
        // A read's one C2HData, as a target sends it, needs no field-by-field parse (see
        // `expected_c2h`): at QD32 that parse was a tenth of the host's instructions.
        if !self.hdgst
            && ch8[0] == PduType::C2HData as u8
            && let Some(&[c0, c1]) = avail.get(8..10)
            && let cid = u16::from_le_bytes([c0, c1])
            && let Some(s) = self.slots.get(usize::from(cid))
            && s.busy
            && s.dir == Dir::C2h
            && s.done == 0
            && s.len <= self.opts.max_data
            && let Some(hdr) = expected_c2h(avail, cid, s.len, self.ddgst)
        {
            let plen = C2H_HLEN + s.len as usize + if self.ddgst { 4 } else { 0 };
            if avail.len() < plen {
                return Ok(Framed::Need(plen));
            }
            return Ok(Framed::Pdu(Frame {
                hdr,
                hl: C2H_HLEN,
                plen,
            }));
        }
        let limits = self.limits();
        next_frame(avail, Direction::ControllerToHost, usize::MAX, |_, _| {
            Ok::<_, Infallible>(limits)
        })
        .map_err(frame_error)
    }

    fn protocol(&mut self, why: String) -> HostError {
        self.closed = true;
        HostError::Protocol(why)
    }

    fn dispatch<F: FnMut(Completion)>(&mut self, p: &Frame, pdu: &[u8], f: &mut F) -> Result<usize, HostError> {
        match p.hdr {
            PduHeader::CapsuleResp { cqe } => {
                let cid = cqe.cid.get();
                let Some(slot) = self.slots.get(usize::from(cid)).filter(|s| s.busy) else {
                    return Err(self.protocol(format!("CapsuleResp for command id {cid}, not in flight")));
                };
                let mut status = cqe.status();
                if slot.ddgst_error && status.is_success() {
                    status = Status::DATA_TRANSFER_ERROR;
                }
                self.complete(cid, status, cqe.dw0.get(), cqe.dw1.get(), f);
                Ok(1)
            }
            PduHeader::C2HData {
                hdr,
                data_len,
                success,
                ddgst,
                ..
            } => {
                let data = p.data(pdu);
                if data.len() != data_len as usize {
                    return Err(self.protocol("C2HData data outside the PDU".into()));
                }
                self.c2h_data(&hdr, data_len, success, ddgst, Some(data), p.data_digest(pdu), f)
            }
            PduHeader::R2T(r) => {
                let cid = r.cccid.get();
                let (r2to, r2tl) = (r.r2to.get(), r.r2tl.get());
                let end = u64::from(self.data_pdu_end("R2T", cid, Dir::H2cR2t, r2to, r2tl)?);
                let Some(slot) = self.slots.get_mut(usize::from(cid)) else {
                    return Ok(0);
                };
                // H2CData PDUs of at most MAXH2CDATA each, in order (NVMe/TCP §3.6.2.7);
                // LAST_PDU on the last one of this R2T.
                let max = self.maxh2cdata.max(4096);
                let mut off = r2to;
                while u64::from(off) < end {
                    let chunk = (end - u64::from(off)).min(u64::from(max)) as u32;
                    let last = u64::from(off + chunk) == end;
                    let (h, n) = encode_h2c_data_hdr(cid, r.ttag.get(), off, chunk, last, self.hdgst, self.ddgst);
                    self.out.extend_from_slice(&h[..n]);
                    let data = &slot.buf[off as usize..(off + chunk) as usize];
                    slot.sent_by = slot.sent_by.max(queue_data(&mut self.out, data, self.borrow_min));
                    if self.ddgst {
                        self.out.extend_from_slice(&crc32c(data).to_le_bytes());
                    }
                    off += chunk;
                }
                slot.done = end as u32;
                Ok(0)
            }
            PduHeader::TermReq { c2h: true, hdr, .. } => {
                self.closed = true;
                Err(HostError::TermReq {
                    fes: hdr.fes.get(),
                    fei: hdr.fei.get(),
                })
            }
            other => Err(self.protocol(format!("unexpected {:?} PDU", other.pdu_type()))),
        }
    }

    /// A C2HData PDU (NVMe/TCP §3.6.2.8) for a command in flight: its data is copied into the
    /// command's buffer, or, with `data` None, is there already (received in place). With
    /// `ddgst` a data digest was due: `digest` is it, or None if it was missing.
    #[allow(clippy::too_many_arguments)]
    fn c2h_data<F: FnMut(Completion)>(
        &mut self,
        hdr: &DataHdr,
        data_len: u32,
        success: bool,
        ddgst: bool,
        data: Option<&[u8]>,
        digest: Option<u32>,
        f: &mut F,
    ) -> Result<usize, HostError> {
        let cid = hdr.cccid.get();
        let datao = hdr.datao.get();
        let end = self.data_pdu_end("C2HData", cid, Dir::C2h, datao, data_len)?;
        let Some(slot) = self.slots.get_mut(usize::from(cid)) else {
            return Ok(0);
        };
        let Some(dest) = slot.buf.get_mut(datao as usize..end as usize) else {
            return Err(self.protocol(format!("C2HData beyond command id {cid}'s buffer")));
        };
        if let Some(data) = data {
            dest.copy_from_slice(data);
        }
        let digest_ok = match (ddgst, digest) {
            (false, _) => true,
            (true, Some(d)) => check_data_digest(dest, d).is_ok(),
            (true, None) => false,
        };
        slot.done = end;
        slot.ddgst_error |= !digest_ok;
        if success {
            // DATA_SUCCESS: no CapsuleResp follows (NVMe/TCP §3.6.2.8).
            let status = if slot.ddgst_error {
                Status::DATA_TRANSFER_ERROR
            } else {
                Status::SUCCESS
            };
            self.complete(cid, status, 0, 0, f);
            return Ok(1);
        }
        Ok(0)
    }

    /// Where a `what` PDU (C2HData or R2T) moving `len` bytes at offset `off` of command
    /// `cid` ends, once it is checked: the command is in flight, moves data in direction
    /// `dir`, and the PDU continues where the last one ended, within the transfer (data PDUs
    /// come in order, NVMe/TCP §3.6.2.7-8). Anything else is a protocol error.
    fn data_pdu_end(&mut self, what: &str, cid: u16, dir: Dir, off: u32, len: u32) -> Result<u32, HostError> {
        let slot = self.slots.get(usize::from(cid)).filter(|s| s.busy);
        let Some(&Slot {
            dir: slot_dir,
            done,
            len: total,
            ..
        }) = slot
        else {
            return Err(self.protocol(format!("{what} for command id {cid}, not in flight")));
        };
        if slot_dir != dir {
            let why = if dir == Dir::C2h {
                "which reads nothing"
            } else {
                "which has no data to send"
            };
            return Err(self.protocol(format!("{what} for command id {cid}, {why}")));
        }
        let end = u64::from(off) + u64::from(len);
        if off != done || end > u64::from(total) {
            return Err(self.protocol(format!(
                "{what} offset {off} length {len} for command id {cid}: expected offset {done} of {total}"
            )));
        }
        Ok(end as u32)
    }

    /// Hands command `cid`'s buffer back with its completion. A controller completes a
    /// command only after it has all its data, so the data queued from the buffer has been
    /// sent by then; one that does not (a bug or a hostile peer) gets the buffer's bytes
    /// copied for the caller, and the buffer itself stays parked until the socket took them.
    fn complete<F: FnMut(Completion)>(&mut self, cid: u16, status: Status, dw0: u32, dw1: u32, f: &mut F) {
        let Some(slot) = self.slots.get_mut(usize::from(cid)) else {
            return;
        };
        slot.busy = false;
        let mut buf = std::mem::take(&mut slot.buf);
        if slot.sent_by > self.out.sent_total() {
            let copy = buf.clone();
            self.parked.push_back((slot.sent_by, std::mem::replace(&mut buf, copy)));
        }
        let c = Completion {
            cid,
            tag: slot.tag,
            status,
            dw0,
            dw1,
            buf,
            transferred: slot.done,
        };
        self.free.push(cid);
        f(c);
    }

    /// One non-blocking read into the receive buffer. Ok(false) if nothing was there. Over
    /// TLS: the decrypted bytes, as many as fit; when the read may have left some above the
    /// socket (OpenSSL's buffers), `tls_unread` says so and the next wait does not block.
    pub(super) fn fill(&mut self) -> Result<bool, HostError> {
        if self.closed {
            return Err(HostError::Closed);
        }
        self.rx.make_room(self.need.max(8));
        let r = match &mut self.tls {
            None => self.rx.recv(&self.sock),
            Some(link) => {
                let r = link.recv(&mut self.rx);
                self.tls_unread = matches!(r, Ok(Recv::Full | Recv::Data { drained: false, .. }));
                r
            }
        };
        Ok(received(&mut self.closed, r)?.is_some())
    }

    /// [`HostQueue::fill`], except that a lone read's data is received straight into its
    /// buffer. At queue depth 1 every read's data was otherwise copied once more, from the
    /// receive buffer into the command's, on the path from the data's arrival to the next
    /// command (a third of the instructions the host spent there). When nothing is buffered
    /// and the only command in flight is a read that has received nothing, the next PDU is
    /// almost surely its one C2HData: the read's header goes to the receive buffer, its
    /// data to the command's buffer and whatever follows (a data digest, a CapsuleResp) to
    /// the receive buffer after the header, with one `readv`. If the bytes are not that PDU
    /// whole (another PDU, data split over several PDUs, a short read), they are moved
    /// back into stream order in the receive buffer and handled as any others. A `readv`
    /// costs the kernel more than a `recv` (it imports the iovecs), empty ones included, so
    /// this saves the host's instructions rather than time: side by side, QD1 latency was
    /// unchanged (ci/BENCHMARKS.md).
    pub(super) fn fill_in_place(&mut self) -> Result<bool, HostError> {
        let hl = C2H_HLEN + if self.hdgst { 4 } else { 0 };
        let cid = self.last_cid;
        // Not over TLS: the data must pass through the record layer's decryption.
        let lone =
            self.tls.is_none() && self.rx.is_empty() && self.landed.is_none() && self.in_flight() == 1 && !self.closed;
        let cap = self.rx.capacity();
        let len = match self.slots.get(usize::from(cid)) {
            Some(s)
                if lone
                    && s.busy
                    && s.dir == Dir::C2h
                    && s.done == 0
                    && s.len as usize >= IN_PLACE_MIN
                    && s.buf.len() == s.len as usize
                    // Room after the data's place for what follows, and for the data itself
                    // should it have to be moved back.
                    && hl + s.len as usize + 4096 <= cap =>
            {
                s.len as usize
            }
            _ => return self.fill(),
        };
        self.rx.clear();
        let Some(slot) = self.slots.get_mut(usize::from(cid)) else {
            return self.fill();
        };
        let dest = slot.buf.as_mut_ptr();
        // SAFETY: `dest` is the read's buffer, `len` bytes long (checked above), which is not
        // handed out (nor resized) until the command completes: nothing else touches it for
        // the call, and it is not the receive buffer.
        let r = unsafe { self.rx.recv_into(&self.sock, hl, dest, len, cap - hl - len) };
        let Some((buffered, got)) = received(&mut self.closed, r)? else {
            return Ok(false);
        };
        if got == 0 {
            // At most the header came: it is in the receive buffer.
            return Ok(true);
        }
        let after = buffered - hl;
        if got == len
            && let Some(hdr) = self.in_place_header(cid, hl, len, after)
        {
            self.landed = Some(hdr);
            self.in_place_reads += 1;
            self.rx.consume(hl);
            return Ok(true);
        }
        // Not the lone read's data PDU whole: back into stream order, after the header
        // (`hl + got + after` fits: the tail left room for the data).
        if let Some(slot) = self.slots.get(usize::from(cid)) {
            self.rx.insert(hl, slot.buf.get(..got).unwrap_or_default());
        }
        Ok(true)
    }

    /// The header at the front of the receive buffer if it is command `cid`'s one C2HData
    /// PDU for all its `len` bytes, with the data right after the header (PDO = HLEN plus
    /// header digest: CPDA is 0) and, when data digests are on, its digest among the
    /// `after` bytes that followed.
    fn in_place_header(&self, cid: u16, hl: usize, len: usize, after: usize) -> Option<PduHeader> {
        let avail = self.rx.avail();
        let dg = if self.ddgst { 4 } else { 0 };
        if !self.hdgst
            && after >= dg
            && let Some(hdr) = expected_c2h(avail, cid, len as u32, self.ddgst)
        {
            return Some(hdr);
        }
        let header = avail.get(..hl)?;
        let limits = self.limits();
        let framed = next_frame(header, Direction::ControllerToHost, usize::MAX, |_, _| {
            Ok::<_, Infallible>(limits)
        });
        let Ok(Framed::Header(p)) = framed else {
            return None;
        };
        let PduHeader::C2HData {
            hdr: h,
            data_len,
            ddgst,
            ..
        } = p.hdr
        else {
            return None;
        };
        let dg = if ddgst { 4 } else { 0 };
        let whole = p.hl == hl
            && h.cccid.get() == cid
            && h.datao.get() == 0
            && data_len as usize == len
            && usize::from(h.ch.pdo) == hl
            && p.plen == hl + len + dg
            && after >= dg;
        whole.then_some(p.hdr)
    }
}
