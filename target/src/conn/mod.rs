//! One NVMe/TCP connection (one NVMe-oF queue) on its reactor: the glue between its
//! transport ([`crate::tcp`]), its controller ([`crate::ctrl`]) or the I/O path
//! ([`crate::io`], [`crate::backend`]), and its requests ([`crate::request`]).
//!
//! A command capsule goes: the receive loop here frames the PDU, `Conn::on_capsule` routes
//! it by queue, then the admin queue (`conn/admin.rs`: fabrics, Connect, admin commands,
//! keep-alive, AER, Abort) or the I/O queue (`conn/io.rs`: parse, R2T/H2CData, submission,
//! completion) runs it; its completion goes out through the transport. The controller logic itself is pure
//! ([`crate::ctrl`]); what needs the reactor (timers, messages to other reactors' queues)
//! is done here.

mod admin;
mod auth;
mod fused;
mod io;
mod resv;

use std::collections::VecDeque;
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

use pollux_nvme::spec::{Cqe, Sqe, Status, opcode};
use pollux_nvme::tcp::{
    BARE_CAPSULE_CMD_LEN, Direction, FrameErrorKind, Framed, PduHeader, PduType, fes, next_frame,
    parse_bare_capsule_cmd,
};
use pollux_reactor::{Next, Progress, Reactor, Source, SourceId, TimerId};
use tracing::info;

pub use admin::for_each_ctrl;
pub use io::deliver;

use crate::ana::AnaStates;
use crate::close::CloseReason;
use crate::ctrl::auth::QueueAuth;
use crate::ctrl::reply::Reply;
use crate::ctrl::{Ctrl, QueueRef};
use crate::path::Path;
use crate::request::Requests;
use crate::subsystem::{Shared, Subsystem};
use crate::tcp::h2c::{DIRECT_MIN, DirectRx};
use crate::tcp::tls::PskLookup;
use crate::tcp::{Fatal, InPlace, RxPool, Transport, WBUF_HIGH};

/// PDUs handled per run before yielding to other sources.
const PDU_BUDGET: u32 = 64;
/// Bytes of PDUs handled per run before yielding (large writes would otherwise hold the
/// reactor for milliseconds).
const BYTE_BUDGET: usize = 512 * 1024;

/// What a queue is.
enum Queue {
    /// No Connect yet.
    Unbound,
    /// An I/O queue Connect waits for its controller's answer.
    Connecting,
    /// Admin queue: owns the controller.
    Admin(Box<Ctrl>),
    /// I/O queue of a controller on reactor `owner`.
    Io(IoQueue),
}

struct IoQueue {
    cntlid: u16,
    owner: usize,
    subsys: Arc<Subsystem>,
    /// The host identifier of its Connect (its controller's): reservations know hosts by it.
    hostid: [u8; 16],
}

/// The submission queue's state that completions report (NVMe-oF 1.1 §3.3, NVMe 2.0 §4.6).
struct Sq {
    qid: u16,
    entries: u32,
    head: u32,
    /// SQ flow control disabled at Connect: SQHD is reserved (0).
    flow_off: bool,
}

/// A connection source.
pub struct Conn {
    serial: u64,
    shared: Arc<Shared>,
    reactor: usize,
    closed: bool,
    tcp: Transport,
    q: Queue,
    sq: Sq,
    reqs: Requests,
    started: Instant,
    /// H2CData being received in place.
    direct: Option<DirectRx>,
    /// DH-HMAC-CHAP of this queue.
    auth: QueueAuth,
    /// Closes the queue if it has not authenticated by then.
    auth_timer: Option<TimerId>,
    /// An Authentication Receive waiting for DH work: (cid, bytes).
    auth_held: Option<(u16, u32)>,
    /// The ANA states of the listener's path.
    ana: Arc<AnaStates>,
    /// Fused pairs, locked operations (Compare and Write, Copy) and writes waiting for a
    /// locked range.
    fused: fused::Fused,
    /// Where each completion of an I/O queue not yet known to be written to the socket
    /// ends in the send stream (see [`Conn::sq_overflow`]).
    unsent: VecDeque<u64>,
    /// Open connections of the listener that accepted this one (this one included).
    listener_open: Arc<AtomicU64>,
    /// The bound address of the listener that accepted it (None: unknown).
    listener: Option<std::net::SocketAddr>,
}

impl Conn {
    /// Wrap an accepted, non-blocking socket.
    pub fn new(
        sock: TcpStream,
        shared: Arc<Shared>,
        reactor: usize,
        serial: u64,
        started: Instant,
        path: Path,
        rx_pool: Option<&RxPool>,
    ) -> std::io::Result<Self> {
        let lookup = || -> Arc<PskLookup> {
            let sh = shared.clone();
            Arc::new(move |id| sh.snapshot.load().tls_psk(id))
        };
        let tcp = Transport::new(sock, &shared.transport, path.tls, lookup, rx_pool)?;
        Ok(Self {
            serial,
            shared,
            reactor,
            closed: false,
            tcp,
            q: Queue::Unbound,
            sq: Sq {
                qid: 0,
                entries: 32,
                head: 0,
                flow_off: false,
            },
            reqs: Requests::default(),
            started,
            direct: None,
            auth: QueueAuth::new("", false),
            auth_timer: None,
            auth_held: None,
            ana: path.ana,
            fused: fused::Fused::default(),
            unsent: VecDeque::new(),
            listener_open: path.open,
            listener: path.addr,
        })
    }

    /// The setup deadline (`[transport] setup_timeout_ms` after the accept) has come: close
    /// the connection if it has not finished its TLS handshake (on a TLS listener), its
    /// ICReq or its Connect, saying which; `serial` names it. A host that connects and then
    /// says nothing costs a socket and a few KiB until then, not forever.
    pub fn check_setup(&mut self, r: &mut Reactor, id: SourceId, serial: u64) {
        if self.serial != serial || self.closed {
            return;
        }
        let (what, reason) = if self.tcp.securing() {
            ("TLS handshake", CloseReason::TlsHandshakeTimeout)
        } else if !self.tcp.ic_done {
            ("ICReq", CloseReason::IcReqTimeout)
        } else if matches!(self.q, Queue::Unbound) {
            ("Connect", CloseReason::ConnectTimeout)
        } else {
            return;
        };
        let ms = self.shared.transport.setup_timeout_ms;
        tracing::warn!(peer = %self.tcp.peer, reactor = self.reactor, timeout_ms = ms, "{what} not completed in time: closing the connection");
        self.close(r, id, reason);
    }

    /// The socket's fd (for registration).
    pub fn raw_fd(&self) -> std::os::fd::RawFd {
        self.tcp.raw_fd()
    }

    /// The connection's serial number (unique in this process).
    pub fn serial(&self) -> u64 {
        self.serial
    }

    fn me(&self, id: SourceId) -> QueueRef {
        QueueRef {
            reactor: self.reactor,
            source: id,
            serial: self.serial,
        }
    }

    // ---------------------------------------------------------------- responses

    fn sqhd(&self) -> u16 {
        if self.sq.flow_off { 0 } else { self.sq.head as u16 }
    }

    /// Queue a CapsuleResp.
    fn resp(&mut self, cid: u16, status: Status, dw0: u32, dw1: u32) {
        let mut cqe = Cqe::new(cid, self.sq.qid, self.sqhd(), status, dw0);
        cqe.dw1.set(dw1);
        self.tcp.send_cqe(&cqe);
        self.completion_queued();
    }

    /// Send a command's reply: its data (at most what the host's SGL asked for), then the CQE.
    fn reply(&mut self, cid: u16, rep: Reply, max_len: u32) {
        if rep.status.is_success() && !rep.data.is_empty() && max_len > 0 {
            let n = rep.data.len().min(max_len as usize);
            self.tcp.c2h(cid, &rep.data[..n]);
        }
        self.resp(cid, rep.status, rep.dw0, rep.dw1);
    }

    /// Send an error status, logging it for the controller's error log.
    fn fail(&mut self, r: &mut Reactor, cid: u16, status: Status, nsid: u32, lba: u64) {
        self.resp(cid, status, 0, 0);
        self.log_error(r, cid, status, nsid, lba);
    }

    /// Record a failed command in its controller's error log (NVMe 2.0 §5.16.1.2).
    fn log_error(&mut self, r: &mut Reactor, cid: u16, status: Status, nsid: u32, lba: u64) {
        let sqid = self.sq.qid;
        match &mut self.q {
            Queue::Admin(ctrl) => ctrl.log_error(sqid, cid, status, nsid, lba),
            Queue::Io(q) => {
                // Errors are rare: one message to the controller's reactor for its log.
                let (cntlid, owner) = (q.cntlid, q.owner);
                r.send(owner, move |r| {
                    admin::with_ctrl(r, cntlid, |ctrl, _| ctrl.log_error(sqid, cid, status, nsid, lba));
                });
            }
            _ => {}
        }
    }

    /// Flush the send queue; close on a socket error.
    fn flush_or_close(&mut self, r: &mut Reactor, id: SourceId) {
        if let Err(e) = self.tcp.flush() {
            self.close(r, id, CloseReason::Write(e));
        }
    }

    // ---------------------------------------------------------------- teardown

    /// Fatal transport error: C2HTermReq with the offending header, then close.
    fn fatal(&mut self, r: &mut Reactor, id: SourceId, f: Fatal, header: &[u8]) {
        self.tcp.term_req(&f, header);
        self.close(r, id, f.why);
    }

    /// Close the connection: tear down its controller (admin queue) or leave it (I/O queue).
    pub fn close(&mut self, r: &mut Reactor, id: SourceId, reason: CloseReason) {
        if self.closed {
            return;
        }
        self.closed = true;
        self.shared.closes[self.reactor].count(reason.kind());
        self.tcp.shutdown();
        if let Some(t) = self.auth_timer.take() {
            r.cancel_timer(t);
        }
        // Writes still waiting for their data never run: their buffers go back to the pools
        // as they drop, or a host that reconnects in a loop mid-write would have the target
        // allocate anew.
        self.reqs.drain().for_each(drop);
        // Locked ranges are unlocked (their waiters woken), parked writes dropped.
        self.fused_teardown(r);
        match std::mem::replace(&mut self.q, Queue::Unbound) {
            Queue::Admin(ctrl) => admin::teardown_ctrl(r, ctrl, &reason),
            Queue::Io(q) => admin::detach_io(r, &q, self.sq.qid, self.serial),
            _ => {}
        }
        self.shared.conns_per_reactor[self.reactor].fetch_sub(1, Relaxed);
        self.listener_open.fetch_sub(1, Relaxed);
        // The reason as a string field, as the log has always shown it.
        let reason = reason.to_string();
        info!(peer = %self.tcp.peer, reactor = self.reactor, qid = self.sq.qid, reason = reason.as_str(), "connection closed");
        r.remove_source(id);
    }

    // ---------------------------------------------------------------- receive

    /// Parse and run the complete PDUs in the receive buffer (NVMe/TCP 1.0 §3.6).
    fn process(&mut self, r: &mut Reactor, id: SourceId, budget: &mut u32) -> bool {
        let mut progressed = false;
        let mut bytes = 0usize;
        // A PDU longer than the buffer holds: the buffer grows to it after the loop.
        let mut grow_to = 0usize;
        let mut rx = self.tcp.take_rx();
        let io_queue = matches!(self.q, Queue::Io(_));
        while !self.closed && *budget > 0 && self.tcp.pending_out() < WBUF_HIGH {
            if bytes >= BYTE_BUDGET {
                *budget = 0;
                break;
            }
            let avail = rx.avail();
            if self.direct.is_some() {
                // The stream is inside an H2CData PDU whose data goes in place.
                let Some(used) = self.direct_continue(r, id, avail) else {
                    break;
                };
                rx.consume(used);
                bytes += used;
                progressed = true;
                continue;
            }
            // The PDU of every read and of every write that waits for R2T: a command
            // capsule without data, recognised by its exact common header.
            if self.tcp.ic_done
                && !self.tcp.hdgst
                && let Some(sqe) = parse_bare_capsule_cmd(avail)
            {
                rx.consume(BARE_CAPSULE_CMD_LEN);
                bytes += BARE_CAPSULE_CMD_LEN;
                *budget -= 1;
                progressed = true;
                self.on_capsule_pdu(r, id, &sqe, &[], true);
                continue;
            }
            let tcp = &self.tcp;
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
                    let Some(used) = self.direct_start(r, id, &f.hdr, avail, f.hl) else {
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
                            let why = self.tcp.term_req_for(p, header);
                            self.close(r, id, why);
                        }
                        FrameErrorKind::Refused(why) => {
                            self.fatal(
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
                            self.fatal(r, id, f, header);
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
            self.dispatch(r, id, &f.hdr, data, digest_ok, &pdu[..f.hl]);
            rx.consume(f.plen);
        }
        // Reads keep filling it: any size past the current one (grow_rx doubles past the
        // need, so the buffer grows fourfold).
        if self.tcp.take_rx_pressed() {
            grow_to = grow_to.max(rx.capacity() + 1);
        }
        if grow_to > rx.capacity() && !self.closed {
            self.tcp.grow_rx(&mut rx, grow_to);
            // Read again: the socket may hold the rest, and no new edge will say so.
            progressed = true;
        }
        self.tcp.put_rx(rx);
        progressed
    }

    fn dispatch(
        &mut self,
        r: &mut Reactor,
        id: SourceId,
        hdr: &PduHeader,
        data: &[u8],
        digest_ok: bool,
        header: &[u8],
    ) {
        match hdr {
            PduHeader::IcReq(req) => {
                if let Err(f) = self.tcp.on_icreq(req) {
                    self.fatal(r, id, f, header);
                }
            }
            PduHeader::TermReq { hdr, .. } => {
                info!(peer = %self.tcp.peer, fes = hdr.fes.get(), "host sent H2CTermReq");
                self.close(r, id, CloseReason::HostTermReq);
            }
            PduHeader::CapsuleCmd { sqe, .. } => self.on_capsule_pdu(r, id, sqe, data, digest_ok),
            PduHeader::H2CData { hdr, .. } => self.on_h2c_data(r, id, hdr, data, digest_ok, header),
            other => {
                let why = CloseReason::NotHostToController(other.pdu_type());
                self.fatal(r, id, Fatal::new(fes::INVALID_HEADER_FIELD, 0, why), header);
            }
        }
    }

    /// A command capsule PDU, `data` its in-capsule data.
    fn on_capsule_pdu(&mut self, r: &mut Reactor, id: SourceId, sqe: &Sqe, data: &[u8], digest_ok: bool) {
        self.sq.head = (self.sq.head + 1) % self.sq.entries.max(1);
        if matches!(self.q, Queue::Io(_)) && self.sq_overflow() {
            // More commands outstanding than the queue has entries (its size agreed at
            // Connect, NVMe-oF 1.1 §3.3.1): a full queue takes no command. There is no status
            // for a command the queue has no entry for; nvmet-tcp ("out of commands") and
            // SPDK ("Cannot allocate tcp_req") end the queue, and so does this, with a
            // C2HTermReq that says why.
            let why = CloseReason::SqOverflow {
                entries: self.sq.entries,
            };
            let f = Fatal::new(fes::PDU_SEQUENCE_ERROR, 0, why);
            return self.fatal(r, id, f, &[]);
        }
        if !digest_ok {
            // NVMe/TCP 1.0 §3.6.2.4: a data digest error fails the command, not the queue.
            self.fail(r, sqe.cid.get(), Status::TRANSIENT_TRANSPORT_ERROR, sqe.nsid.get(), 0);
            return;
        }
        if sqe.psdt() != Sqe::PSDT_SGL_MPTR_CONTIGUOUS {
            // NVMe-oF 1.1 §2.3.1: fabrics commands use SGLs, PSDT 01b; PRPs mean nothing on
            // a fabric. nvmet answers Invalid Field too.
            let status = Status::INVALID_FIELD.with_dnr();
            return self.fail(r, sqe.cid.get(), status, sqe.nsid.get(), 0);
        }
        self.on_capsule(r, id, sqe, data);
    }

    /// A new command would make more outstanding on this I/O queue than it has entries:
    /// requests in flight (awaiting data or at their backend; not the drained tombstones,
    /// whose completion went) plus completions queued but not yet written to the socket,
    /// which the host cannot have seen. A host that keeps SQ flow control never gets here.
    fn sq_overflow(&mut self) -> bool {
        let entries = self.sq.entries as usize;
        if self.reqs.in_flight() + self.unsent.len() < entries {
            return false;
        }
        let sent = self.tcp.out.sent_total();
        while self.unsent.front().is_some_and(|&end| end <= sent) {
            self.unsent.pop_front();
        }
        self.reqs.in_flight() + self.unsent.len() >= entries
    }

    /// A completion of this I/O queue was queued: remember where it ends in the stream
    /// (see [`Self::sq_overflow`]).
    #[inline]
    fn completion_queued(&mut self) {
        if matches!(self.q, Queue::Io(_)) {
            self.unsent.push_back(self.tcp.out.stream_end());
        }
    }

    /// Route a command by the queue it arrived on.
    fn on_capsule(&mut self, r: &mut Reactor, id: SourceId, sqe: &Sqe, data: &[u8]) {
        let cid = sqe.cid.get();
        if sqe.opcode == opcode::FABRICS {
            return self.on_fabrics(r, id, sqe, data);
        }
        if !self.auth.allows_commands() {
            // NVMe 2.0 §8.13.5: until the queue authenticates, only Authentication Send and
            // Receive run. DNR: the Linux host would otherwise retry instead of
            // authenticating.
            return self.resp(cid, Status::AUTH_REQUIRED.with_dnr(), 0, 0);
        }
        match self.q {
            Queue::Unbound | Queue::Connecting => self.fail(r, cid, Status::COMMAND_SEQUENCE_ERROR.with_dnr(), 0, 0),
            Queue::Admin(_) => self.on_admin(r, id, sqe),
            Queue::Io(_) => self.on_io(r, id, sqe, data),
        }
    }
}

impl Source for Conn {
    fn name(&self) -> &str {
        "nvme-tcp-connection"
    }

    fn run(&mut self, r: &mut Reactor, id: SourceId) -> Progress {
        if self.closed {
            return Progress::IDLE;
        }
        let mut did = false;
        let mut budget = PDU_BUDGET;
        loop {
            if let Err(e) = self.tcp.flush() {
                self.close(r, id, CloseReason::Write(e));
                return Progress::WORKED;
            }
            if self.tcp.pending_out() >= WBUF_HIGH {
                // The host is not reading: wait for the socket to drain (writable event).
                return Progress {
                    did_work: did,
                    next: Next::Idle,
                };
            }
            let got = match self.fill() {
                Ok(g) => g,
                Err(why) => {
                    // Process what did arrive (e.g. a final H2CTermReq) before closing.
                    self.process(r, id, &mut budget);
                    self.close(r, id, why);
                    return Progress::WORKED;
                }
            };
            let progressed = self.process(r, id, &mut budget);
            if self.closed {
                return Progress::WORKED;
            }
            did |= got || progressed;
            if budget == 0 {
                let _ = self.tcp.flush();
                return Progress {
                    did_work: true,
                    next: Next::Asap,
                };
            }
            // Done when the socket is empty and every complete PDU has been handled (a partial
            // one waits for the edge its remaining bytes will raise).
            if self.tcp.drained || (!got && !progressed) {
                break;
            }
        }
        if let Err(e) = self.tcp.flush() {
            self.close(r, id, CloseReason::Write(e));
            return Progress::WORKED;
        }
        Progress {
            did_work: did,
            next: Next::Idle,
        }
    }

    fn shutdown(&mut self, _r: &mut Reactor, _id: SourceId) {
        // The target is stopping: send what is queued, then close. Commands waiting for data
        // are never completed; the host sees the connection close and retries elsewhere.
        self.tcp.shutdown();
        self.shared.conns_per_reactor[self.reactor].fetch_sub(1, Relaxed);
        self.listener_open.fetch_sub(1, Relaxed);
        tracing::debug!(peer = %self.tcp.peer, "connection closed at shutdown");
    }
}

impl Conn {
    /// Read what the socket has, in place when an H2CData PDU's data is being received into
    /// its command's buffer. Ok(true) if bytes arrived.
    fn fill(&mut self) -> Result<bool, CloseReason> {
        let mut in_place = None;
        // The transport receives in place only with nothing buffered (`Transport::fill`).
        if let Some(d) = self.direct.as_ref().filter(|d| d.left > 0)
            // An aborted command's buffer is gone: its data is drained through the receive
            // buffer instead (process drops it).
            && let Some(buf) = io::live_buf(&mut self.reqs, d)
        {
            in_place = Some(InPlace {
                dest: buf.dest_ptr(d.at, d.left as usize),
                left: d.left as usize,
            });
        }
        let filled = self.tcp.fill(in_place)?;
        if filled.placed > 0
            && let Some(d) = self.direct.as_mut()
        {
            d.at += filled.placed as u32;
            d.left -= filled.placed as u32;
        }
        Ok(filled.buffered || filled.placed > 0)
    }
}
