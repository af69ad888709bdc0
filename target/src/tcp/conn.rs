//! An NVMe/TCP connection: one NVMe-oF queue ([`crate::queue::Queue`]) carried by the NVMe/TCP
//! transport ([`TcpTransport`]). Here is the receive side (NVMe/TCP 1.0 §3.6): the loop that
//! frames PDUs out of the receive buffer and hands command capsules to the queue, H2CData
//! after an R2T into its command's buffer (received in place when most of its data is still
//! in the socket, [`super::h2c`]), and the fatal errors that end the connection with a
//! C2HTermReq (NVMe/TCP 1.0 §3.6.2.3). What the queue sends goes through
//! [`crate::queue::Transport`], implemented in [`super`].

use pollux_nvme::tcp::{
    BARE_CAPSULE_CMD_LEN, DataHdr, Direction, FrameErrorKind, Framed, PduHeader, PduType, fes, next_frame,
    parse_bare_capsule_cmd,
};
use pollux_reactor::{Next, Progress, Reactor, SourceId};
use tracing::info;

use super::h2c::{DIRECT_MIN, DirectRx, check_h2c, live_buf, unknown_ttag};
use super::{Fatal, InPlace, RxPool, TcpTransport, WBUF_HIGH};
use crate::close::CloseReason;
use crate::queue::Queue;
use crate::queue::request::{ReqState, Request};

/// An NVMe/TCP connection: an NVMe-oF queue on the NVMe/TCP transport (the reactor source of
/// every accepted socket).
pub type Conn = Queue<TcpTransport>;

/// PDUs handled per run before yielding to other sources.
const PDU_BUDGET: u32 = 64;
/// Bytes of PDUs handled per run before yielding (large writes would otherwise hold the
/// reactor for milliseconds).
const BYTE_BUDGET: usize = 512 * 1024;

/// Fatal transport error: C2HTermReq with the offending header, then close.
fn fatal(q: &mut Conn, r: &mut Reactor, id: SourceId, f: Fatal, header: &[u8]) {
    q.t.term_req(&f, header);
    q.close(r, id, f.why);
}

/// The connection's reactor-source body ([`crate::queue::Transport::run`]): flush, read,
/// handle the PDUs that arrived, within a budget.
#[inline(always)]
pub(super) fn run(q: &mut Conn, r: &mut Reactor, id: SourceId) -> Progress {
    let mut did = false;
    let mut budget = PDU_BUDGET;
    loop {
        if let Err(e) = q.t.flush() {
            q.close(r, id, CloseReason::Write(e));
            return Progress::WORKED;
        }
        if q.t.pending_out() >= WBUF_HIGH {
            // The host is not reading: wait for the socket to drain (writable event).
            return Progress {
                did_work: did,
                next: Next::Idle,
            };
        }
        let got = match fill(q) {
            Ok(g) => g,
            Err(why) => {
                // Process what did arrive (e.g. a final H2CTermReq) before closing.
                process(q, r, id, &mut budget);
                q.close(r, id, why);
                return Progress::WORKED;
            }
        };
        let progressed = process(q, r, id, &mut budget);
        if q.closed {
            return Progress::WORKED;
        }
        did |= got || progressed;
        if budget == 0 {
            let _ = q.t.flush();
            return Progress {
                did_work: true,
                next: Next::Asap,
            };
        }
        // Done when the socket is empty and every complete PDU has been handled (a partial
        // one waits for the edge its remaining bytes will raise).
        if q.t.drained || (!got && !progressed) {
            break;
        }
    }
    if let Err(e) = q.t.flush() {
        q.close(r, id, CloseReason::Write(e));
        return Progress::WORKED;
    }
    Progress {
        did_work: did,
        next: Next::Idle,
    }
}

/// Parse and run the complete PDUs in the receive buffer (NVMe/TCP 1.0 §3.6).
fn process(q: &mut Conn, r: &mut Reactor, id: SourceId, budget: &mut u32) -> bool {
    let mut progressed = false;
    let mut bytes = 0usize;
    // A PDU longer than the buffer holds: the buffer grows to it after the loop.
    let mut grow_to = 0usize;
    let mut rx = q.t.take_rx();
    let io_queue = q.is_io();
    while !q.closed && *budget > 0 && q.t.pending_out() < WBUF_HIGH {
        if bytes >= BYTE_BUDGET {
            *budget = 0;
            break;
        }
        let avail = rx.avail();
        if q.t.direct.is_some() {
            // The stream is inside an H2CData PDU whose data goes in place.
            let Some(used) = direct_continue(q, r, id, avail) else {
                break;
            };
            rx.consume(used);
            bytes += used;
            progressed = true;
            continue;
        }
        // The PDU of every read and of every write that waits for R2T: a command
        // capsule without data, recognised by its exact common header.
        if q.t.ic_done
            && !q.t.hdgst
            && let Some(sqe) = parse_bare_capsule_cmd(avail)
        {
            rx.consume(BARE_CAPSULE_CMD_LEN);
            bytes += BARE_CAPSULE_CMD_LEN;
            *budget -= 1;
            progressed = true;
            q.on_capsule(r, id, &sqe, &[], true);
            continue;
        }
        let tcp = &q.t;
        // The buffer grows to any PDU the limits accept: no bound of its own.
        let framed = next_frame(avail, Direction::HostToController, usize::MAX, |_, kind| {
            // NVMe/TCP 1.0 §3.6.2.1: ICReq first and only once.
            match (kind == PduType::IcReq, tcp.ic_done) {
                (true, true) => Err("a second ICReq"),
                (false, false) => Err("a PDU before ICReq"),
                _ => Ok(tcp.limits(kind, io_queue)),
            }
        });
        // By reference: the frame holds the whole header (an SQE); moving it out of the
        // result is a copy per PDU.
        let f = match &framed {
            Ok(Framed::Pdu(f)) => f,
            // Most of an H2CData PDU's data still to come: receive it in place.
            Ok(Framed::Header(f))
                if f.hdr.pdu_type() == PduType::H2CData
                    && f.plen - avail.len() >= DIRECT_MIN
                    && avail.len() >= f.hdr.data_offset() =>
            {
                let Some(used) = direct_start(q, r, id, &f.hdr, avail, f.hl) else {
                    // Declined: only a fatal header does (the connection closed). Were
                    // the whole PDU awaited instead, the buffer must grow to hold it, or
                    // a full buffer would wait for bytes it has no room for.
                    grow_to = f.plen;
                    break;
                };
                rx.consume(used);
                bytes += f.plen;
                *budget -= 1;
                progressed = true;
                continue;
            }
            Ok(Framed::Header(f)) => {
                grow_to = f.plen;
                break;
            }
            Ok(Framed::Need(n)) => {
                grow_to = *n;
                break;
            }
            Err(e) => {
                let header = e.offending_header(avail);
                match &e.kind {
                    FrameErrorKind::Pdu(p) => {
                        let why = q.t.term_req_for(p, header);
                        q.close(r, id, why);
                    }
                    FrameErrorKind::Refused(why) => {
                        fatal(
                            q,
                            r,
                            id,
                            Fatal::new(fes::PDU_SEQUENCE_ERROR, 0, CloseReason::PduSequence(why)),
                            header,
                        );
                    }
                    // Cannot happen once the header bounded the data (the buffer holds
                    // the largest PDU accepted); keep it a clean error.
                    FrameErrorKind::TooLarge { .. } => {
                        let f = Fatal::new(fes::DATA_TRANSFER_LIMIT_EXCEEDED, 4, CloseReason::PduTooLarge);
                        fatal(q, r, id, f, header);
                    }
                }
                break;
            }
        };
        let pdu = &avail[..f.plen];
        let (data, digest_ok) = (f.data(pdu), f.digest_ok(pdu));
        *budget -= 1;
        progressed = true;
        bytes += f.plen;
        dispatch(q, r, id, &f.hdr, data, digest_ok, &pdu[..f.hl]);
        rx.consume(f.plen);
    }
    // Reads keep filling it: any size past the current one (grow_rx doubles past the
    // need, so the buffer grows fourfold).
    if q.t.take_rx_pressed() {
        grow_to = grow_to.max(rx.capacity() + 1);
    }
    if grow_to > rx.capacity() && !q.closed {
        q.t.grow_rx(&mut rx, grow_to);
        // Read again: the socket may hold the rest, and no new edge will say so.
        progressed = true;
    }
    q.t.put_rx(rx);
    progressed
}

fn dispatch(q: &mut Conn, r: &mut Reactor, id: SourceId, hdr: &PduHeader, data: &[u8], digest_ok: bool, header: &[u8]) {
    match hdr {
        PduHeader::IcReq(req) => {
            if let Err(f) = q.t.on_icreq(req) {
                fatal(q, r, id, f, header);
            }
        }
        PduHeader::TermReq { hdr, .. } => {
            info!(peer = %q.t.peer, fes = hdr.fes.get(), "host sent H2CTermReq");
            q.close(r, id, CloseReason::HostTermReq);
        }
        PduHeader::CapsuleCmd { sqe, .. } => q.on_capsule(r, id, sqe, data, digest_ok),
        PduHeader::H2CData { hdr, .. } => on_h2c_data(q, r, id, hdr, data, digest_ok, header),
        other => {
            let why = CloseReason::NotHostToController(other.pdu_type());
            fatal(q, r, id, Fatal::new(fes::INVALID_HEADER_FIELD, 0, why), header);
        }
    }
}

/// A whole H2CData PDU with its data.
fn on_h2c_data(
    q: &mut Conn,
    r: &mut Reactor,
    id: SourceId,
    hdr: &DataHdr,
    data: &[u8],
    digest_ok: bool,
    header: &[u8],
) {
    let Some(ttag) = h2c_target(q, r, id, hdr, header) else {
        return;
    };
    if let Some(Request {
        state: ReqState::AwaitingData { buf, .. },
        ..
    }) = q.reqs.get_mut(ttag)
    {
        buf.place(hdr.datao.get(), data);
    }
    q.data_received(r, id, ttag, hdr.datal.get(), digest_ok);
}

/// The request (its TTAG) whose R2T an H2CData header continues; a header that continues
/// none is fatal (and None).
fn h2c_target(q: &mut Conn, r: &mut Reactor, id: SourceId, hdr: &DataHdr, header: &[u8]) -> Option<usize> {
    let checked = match q.reqs.fetch_target(usize::from(hdr.ttag.get()), hdr.cccid.get()) {
        None => Err(unknown_ttag()),
        Some((ttag, progress)) => check_h2c(&progress, hdr).map(|()| ttag),
    };
    match checked {
        Ok(ttag) => Some(ttag),
        Err(f) => {
            fatal(q, r, id, f, header);
            None
        }
    }
}

/// An H2CData header whose data has not all arrived: copy what did into the command's
/// buffer and receive the rest in place (`fill`). A command already completed (aborted,
/// or failed by an earlier PDU's data digest, NVMe/TCP 1.0 §3.6.2.4) has no buffer: its
/// data streams through the receive buffer and is dropped piece by piece, so that the
/// buffer need not grow to hold a PDU only to drop it. Returns the receive-buffer bytes
/// used (header, padding and data), or None after a fatal header (the connection closed).
fn direct_start(
    q: &mut Conn,
    r: &mut Reactor,
    id: SourceId,
    pdu: &PduHeader,
    avail: &[u8],
    hl: usize,
) -> Option<usize> {
    let PduHeader::H2CData { hdr, ddgst, .. } = pdu else {
        return None;
    };
    let (ddgst, data_off) = (*ddgst, pdu.data_offset());
    let ttag = h2c_target(q, r, id, hdr, &avail[..hl])?;
    let req = q.reqs.get_mut(ttag)?;
    let (datao, datal) = (hdr.datao.get(), hdr.datal.get());
    let have = (avail.len() - data_off).min(datal as usize);
    if let ReqState::AwaitingData { buf, .. } = &mut req.state {
        buf.place(datao, &avail[data_off..data_off + have]);
    }
    q.t.direct = Some(DirectRx {
        ttag,
        cid: req.cid,
        at: datao + have as u32,
        left: datal - have as u32,
        datal,
        ddgst,
    });
    Some(data_off + have)
}

/// Continue the in-place H2CData with the receive buffer's bytes: data that a plain read
/// brought (copied into place, or dropped when the command is already complete), then its
/// digest. Returns the bytes used, or None to wait for more.
fn direct_continue(q: &mut Conn, r: &mut Reactor, id: SourceId, avail: &[u8]) -> Option<usize> {
    let d = q.t.direct.as_mut()?;
    let live = live_buf(&mut q.reqs, d);
    if d.left > 0 {
        if avail.is_empty() {
            return None;
        }
        let n = avail.len().min(d.left as usize);
        if let Some(buf) = live {
            buf.place(d.at, &avail[..n]);
        }
        d.at += n as u32;
        d.left -= n as u32;
        return Some(n);
    }
    let used = if d.ddgst { 4 } else { 0 };
    let digest = avail.first_chunk::<4>().map(|b| u32::from_le_bytes(*b));
    if d.ddgst && digest.is_none() {
        return None;
    }
    // The digest is checked over the bytes in place, before the command may run.
    let digest_ok = match (digest.filter(|_| d.ddgst), live) {
        (Some(got), Some(buf)) => buf.crc(d.at - d.datal, d.datal) == got,
        _ => true,
    };
    let (ttag, datal) = (d.ttag, d.datal);
    q.t.direct = None;
    q.data_received(r, id, ttag, datal, digest_ok);
    Some(used)
}

/// Read what the socket has, in place when an H2CData PDU's data is being received into
/// its command's buffer. Ok(true) if bytes arrived.
fn fill(q: &mut Conn) -> Result<bool, CloseReason> {
    let mut in_place = None;
    // The transport receives in place only with nothing buffered (`Transport::fill`).
    if let Some(d) = q.t.direct.as_ref().filter(|d| d.left > 0)
        // An aborted command's buffer is gone: its data is drained through the receive
        // buffer instead (process drops it).
        && let Some(buf) = live_buf(&mut q.reqs, d)
    {
        let dest = buf.dest_ptr(d.at, d.left as usize);
        // SAFETY: `dest..dest + left` is the rest of the command's buffer (`dest_ptr` checked
        // the range), which this connection owns: its data is still arriving, so no device
        // has been given it, and nothing else touches it until `fill` returns.
        in_place = Some(unsafe { InPlace::new(dest, d.left as usize) });
    }
    let filled = q.t.fill(in_place)?;
    if filled.placed > 0
        && let Some(d) = q.t.direct.as_mut()
    {
        d.at += filled.placed as u32;
        d.left -= filled.placed as u32;
    }
    Ok(filled.buffered || filled.placed > 0)
}

/// An accepted, non-blocking socket of a listener on `path` becomes a connection of reactor
/// `reactor`: the NVMe/TCP transport (TLS on a TLS listener) under a new queue; its receive
/// buffer grows from, and goes back to, `rx_pool`.
pub fn accept(
    sock: std::net::TcpStream,
    shared: std::sync::Arc<crate::shared::Shared>,
    reactor: usize,
    serial: u64,
    started: std::time::Instant,
    path: crate::path::Path,
    rx_pool: Option<&RxPool>,
) -> std::io::Result<Conn> {
    let lookup = || -> std::sync::Arc<super::tls::PskLookup> {
        let sh = shared.clone();
        std::sync::Arc::new(move |id| sh.tls_psk(id))
    };
    let t = TcpTransport::new(sock, &shared.transport, path.tls, lookup, rx_pool)?;
    Ok(Queue::new(t, shared, reactor, serial, started, path))
}
