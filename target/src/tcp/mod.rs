//! The NVMe/TCP transport of one connection (NVMe/TCP 1.0 §3): the socket, the receive
//! buffer and its PDU framing, ICReq/ICResp, the PDUs the controller sends (CapsuleResp,
//! C2HData, R2T, C2HTermReq) with their digests, and the send queue. It knows PDUs and
//! buffers, not controllers or namespaces (SPDK: `lib/nvmf/tcp.c`'s PDU layer).
//!
//! Receive: socket bytes go into a linear buffer big enough for the largest PDU accepted;
//! complete PDUs are parsed in place (no copy before the data reaches the namespace). An
//! H2CData PDU whose data is mostly still in the socket when its header is parsed has the
//! rest read straight into its command's buffer ([`h2c`]), with the next header read in the
//! same `readv`, as nvmet-tcp and SPDK receive data into the request. Send: the responses of
//! a whole batch of PDUs are gathered ([`sendq`]) and written with one syscall. Fatal
//! protocol errors answer C2HTermReq and close (NVMe/TCP 1.0 §3.6.2.3).
//!
//! On a listener with TLS the first byte tells a TLS handshake (a record of content type
//! 22) from a plaintext ICReq (PDU type 0), as nvmet-tcp does; [`tls`] carries the stream
//! from then on.

mod conn;
pub mod h2c;
pub mod handover;
// Shared with the host library (`pollux_host`): the send queue and the TLS record layer.
pub use pollux_link::{sendq, tls};

use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::ptr::NonNull;
use std::sync::Arc;

use pollux_reactor::{Progress, Reactor, SourceId};

use pollux_conf::{TlsMode, Transport as TransportConf};
use pollux_nvme::spec::Cqe;
use pollux_nvme::tcp::{
    ADMIN_IN_CAPSULE, Direction, IcReq, PduError, PduLimits, PduType, Recv, RxBuf, crc32c, encode_c2h_data_hdr,
    encode_capsule_resp, encode_ic_resp, encode_r2t, encode_term_req, encode_term_req_for, fes,
};
use pollux_nvme::tls::PskIdentity;
use tracing::{debug, info, warn};

pub use conn::{Conn, accept};
use h2c::DirectRx;
use sendq::SendQueue;
use tls::{PskLookup, TlsLink};

use crate::close::CloseReason;
use crate::pool::{Home, Pool, Shelf};
use crate::queue::{Queue, ReadBytes, Transport};

/// The first byte of a TLS handshake record (RFC 8446 §5.1: ContentType handshake).
const TLS_HANDSHAKE_RECORD: u8 = 22;

/// What carries the connection's bytes.
enum Carrier {
    /// The socket itself.
    Plain,
    /// A TLS listener's connection whose first byte has not arrived yet.
    Detect(TlsMode, Arc<PskLookup>),
    /// TLS 1.3 (handshaking until [`TlsLink::open`]).
    Tls(Box<TlsLink>),
}

/// Stop reading new commands while this much output waits for the socket.
pub const WBUF_HIGH: usize = 8 << 20;
/// A connection's receive buffer until a PDU needs more: an ICReq, command capsules
/// without data and the 1 KiB of a Connect fit, so an idle or setting-up connection costs
/// this (and its send buffer's start, [`SEND_START`]), not the largest PDU it may send.
pub const RX_START: usize = 4096;
/// A connection's send buffer's start; it grows as its responses need.
pub const SEND_START: usize = 4096;

/// Where the rest of an H2CData PDU's data goes while it is received in place: raw memory
/// of the command's buffer (possibly DMA memory: no Rust reference is made to it).
///
/// Only [`InPlace::new`], an `unsafe fn`, makes one: [`TcpTransport::fill`] writes through
/// it, so whoever makes one promises the memory (a safe caller could otherwise hand `fill`
/// any pointer).
#[derive(Debug, Clone, Copy)]
pub struct InPlace {
    /// First byte still to come.
    dest: *mut u8,
    /// Bytes still to come.
    left: usize,
}

impl InPlace {
    /// The `left` bytes at `dest`.
    ///
    /// # Safety
    /// `dest..dest + left` must be memory the caller may write, that nothing else reads or
    /// writes until the [`TcpTransport::fill`] it is given to returns (the rest of a command's
    /// buffer, whose data is still arriving: no device has it yet).
    pub unsafe fn new(dest: *mut u8, left: usize) -> Self {
        Self { dest, left }
    }
}

/// What a fill of the receive buffer brought.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Filled {
    /// Bytes that went into the receive buffer.
    pub buffered: bool,
    /// Bytes that went in place (out of [`InPlace::left`]).
    pub placed: usize,
}

/// A fatal transport error: the C2HTermReq to send before closing.
#[derive(Debug)]
pub struct Fatal {
    /// Fatal error status (NVMe/TCP 1.0 §3.6.2.3, Figure 18).
    pub fes: u16,
    /// Fatal error information (the offending field's offset).
    pub fei: u32,
    /// Why: the connection's close reason.
    pub why: CloseReason,
}

impl Fatal {
    /// A fatal error with its status, field offset and reason.
    pub fn new(fes: u16, fei: u32, why: CloseReason) -> Self {
        Self { fes, fei, why }
    }
}

/// Receive buffers a reactor keeps for its connections to reuse (reactor-local state: no
/// lock): a connection starts with [`RX_START`] bytes and grows to its PDUs; a grown buffer
/// goes back here when its connection's transport is dropped (or when it grows again), and
/// the next connection that needs as much takes it, not a new allocation. Bounded in bytes
/// per reactor, however many connections come and go; what it does not keep is freed, so
/// that after a storm of connections the target's memory returns to within this bound of
/// where it was.
pub type RxPool = Pool<RxShelf>;

/// What an [`RxPool`] keeps: grown receive buffers, at most [`RxShelf::MAX_BYTES`].
#[derive(Debug, Default)]
pub struct RxShelf {
    bufs: Vec<Vec<u8>>,
    bytes: usize,
}

impl RxShelf {
    /// Most bytes of buffers kept per reactor: 32 connections' largest buffers (2 x (128
    /// KiB + 256) by default).
    pub const MAX_BYTES: usize = 8 << 20;

    /// A kept buffer of at least `len` bytes, if there is one.
    pub fn take(&mut self, len: usize) -> Option<Vec<u8>> {
        let i = self.bufs.iter().position(|b| b.len() >= len)?;
        let buf = self.bufs.swap_remove(i);
        self.bytes -= buf.len().min(self.bytes);
        Some(buf)
    }

    /// Bytes kept.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Shelf for RxShelf {
    type Item = Vec<u8>;

    /// Keep `buf` (every byte initialised) for reuse, or free it: buffers no larger than a
    /// connection's start are not worth keeping, and the pool is bounded.
    fn keep(&mut self, buf: Vec<u8>) {
        let n = buf.len();
        if n > RX_START && self.bytes + n <= Self::MAX_BYTES {
            self.bytes += n;
            self.bufs.push(buf);
        }
    }
}

/// One connection's NVMe/TCP transport.
pub struct TcpTransport {
    sock: Arc<TcpStream>,
    carrier: Carrier,
    /// The host's address.
    pub peer: SocketAddr,
    /// Our listener's address the host connected to.
    pub local: SocketAddr,
    /// Header digests negotiated.
    pub hdgst: bool,
    /// Data digests negotiated.
    pub ddgst: bool,
    /// ICReq/ICResp done.
    pub ic_done: bool,
    max_h2c_data: u32,
    in_capsule_data_size: u32,
    /// The most the receive buffer grows to: the largest PDU accepted, plus as much again
    /// for the next PDUs in the same read.
    rx_max: usize,
    rx: RxBuf,
    /// The reactor's receive buffer pool: where grown storage goes (a grown-out one, and
    /// the last one when the transport is dropped) and comes from.
    rx_home: Home<RxShelf>,
    /// The last fill emptied the socket (a short read or EAGAIN).
    pub drained: bool,
    /// The last plain read filled the receive buffer and the socket still held more: the
    /// connection's traffic wants a larger buffer (see [`Self::rx_wants_more`]).
    rx_pressed: bool,
    /// Bytes for the host: PDUs built here, with RAM read data sent in place.
    pub out: SendQueue,
    /// The H2CData PDU whose data is being received in place, if one is.
    pub(crate) direct: Option<DirectRx>,
}

impl TcpTransport {
    /// Wrap an accepted, non-blocking socket of a listener with TLS `mode` (`lookup` makes
    /// what finds the PSK of an identity a host offers; called only for a TLS listener).
    /// Its receive buffer grows from, and goes back to, `rx_pool` (None: allocated, freed).
    pub fn new(
        sock: TcpStream,
        t: &TransportConf,
        mode: TlsMode,
        lookup: impl FnOnce() -> Arc<PskLookup>,
        rx_pool: Option<&RxPool>,
    ) -> std::io::Result<Self> {
        let peer = sock.peer_addr()?;
        let local = sock.local_addr()?;
        // Room for the largest PDU we accept (header, digests, data) plus slack for the next,
        // at most; it starts small and grows to the PDUs that come ([`Self::grow_rx`]).
        let max_data = t.max_h2c_data.max(t.in_capsule_data_size).max(ADMIN_IN_CAPSULE) as usize;
        let rx_max = (max_data + 256).max(64 * 1024) * 2;
        let carrier = match mode {
            TlsMode::None => Carrier::Plain,
            m => Carrier::Detect(m, lookup()),
        };
        Ok(Self {
            sock: Arc::new(sock),
            carrier,
            peer,
            local,
            hdgst: false,
            ddgst: false,
            ic_done: false,
            max_h2c_data: t.max_h2c_data,
            in_capsule_data_size: t.in_capsule_data_size,
            rx_max,
            rx: RxBuf::new(RX_START),
            rx_home: rx_pool.map(RxPool::home).unwrap_or_default(),
            drained: false,
            rx_pressed: false,
            out: SendQueue::with_capacity(SEND_START),
            direct: None,
        })
    }

    /// The socket's fd.
    pub fn raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    /// What the receiver accepts of a PDU of type `kind` (digests only once ICReq/ICResp
    /// negotiated them). `io_queue`: in-capsule data beyond the admin queue's 8 KiB is only
    /// for I/O queues.
    #[inline]
    pub fn limits(&self, kind: PduType, io_queue: bool) -> PduLimits {
        let max_data = match kind {
            PduType::CapsuleCmd if io_queue => self.in_capsule_data_size,
            PduType::CapsuleCmd => ADMIN_IN_CAPSULE.max(self.in_capsule_data_size),
            PduType::H2CData => self.max_h2c_data,
            _ => 0,
        };
        PduLimits {
            hdgst: self.hdgst,
            ddgst: self.ddgst,
            max_data,
        }
    }

    // ------------------------------------------------------------------------- receive

    /// Take the receive buffer out (to parse it while the connection handles its PDUs);
    /// [`Self::put_rx`] gives it back.
    pub fn take_rx(&mut self) -> RxBuf {
        std::mem::take(&mut self.rx)
    }

    /// Give the receive buffer back.
    pub fn put_rx(&mut self, rx: RxBuf) {
        self.rx = rx;
    }

    /// Grow the (taken) receive buffer `rx` so that a PDU of `need` bytes fits, with room
    /// for what follows: to twice the need, a power of two, at most [`Self::rx_max`] (the
    /// framing bounded `need` by the limits already). The storage comes from the reactor's
    /// pool when it has one large enough; the old one goes back to it.
    pub fn grow_rx(&self, rx: &mut RxBuf, need: usize) {
        let cap = need.saturating_mul(2).next_power_of_two().min(self.rx_max).max(need);
        let spare = self.rx_home.with(|s| s.take(cap)).flatten();
        self.rx_home.keep(rx.move_to(cap, spare));
    }

    /// Read what the socket has. With `in_place` (and nothing buffered), the first
    /// `left` bytes go straight to its destination, and what follows into the receive
    /// buffer, in one `readv`. Err on EOF or a socket error (the reason, for the log).
    #[inline]
    pub fn fill(&mut self, in_place: Option<InPlace>) -> Result<Filled, CloseReason> {
        match self.carrier {
            Carrier::Plain => self.fill_plain(in_place),
            Carrier::Tls(_) => self.fill_tls(),
            Carrier::Detect(..) => {
                if !self.detect()? {
                    self.drained = true;
                    return Ok(Filled::default());
                }
                self.fill(in_place)
            }
        }
    }

    /// A TLS listener's first byte: a handshake record begins TLS, anything else is plain
    /// NVMe/TCP, each if the listener's mode allows it. Ok(false) until a byte is there.
    fn detect(&mut self) -> Result<bool, CloseReason> {
        let Carrier::Detect(mode, lookup) = &self.carrier else {
            return Ok(true);
        };
        let mut first = [0u8; 1];
        // The byte stays queued for whichever reads the stream (the socket is non-blocking).
        match self.sock.peek(&mut first) {
            Ok(0) => return Err(CloseReason::PeerClosed),
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                ) =>
            {
                return Ok(false);
            }
            Err(e) => return Err(CloseReason::Read(e)),
        }
        if first[0] == TLS_HANDSHAKE_RECORD {
            let link =
                TlsLink::accept(self.sock.clone(), lookup.clone()).map_err(|e| CloseReason::TlsSetup(Box::new(e)))?;
            self.carrier = Carrier::Tls(Box::new(link));
        } else if *mode == TlsMode::Required {
            return Err(CloseReason::TlsRequired);
        } else {
            self.carrier = Carrier::Plain;
        }
        Ok(true)
    }

    /// Decrypted bytes into the receive buffer, after the handshake.
    fn fill_tls(&mut self) -> Result<Filled, CloseReason> {
        let Carrier::Tls(link) = &mut self.carrier else {
            return Ok(Filled::default());
        };
        if !link.open {
            if !link.handshake().map_err(|e| CloseReason::TlsHandshake(Box::new(e)))? {
                self.drained = true;
                return Ok(Filled::default());
            }
            let (host, sub) = link
                .identity()
                .map_or(("?", "?"), |i| (i.hostnqn.as_str(), i.subnqn.as_str()));
            info!(peer = %self.peer, hostnqn = host, subnqn = sub, cipher = link.cipher(), "TLS 1.3 session established");
        }
        self.rx.make_room(0);
        let (buffered, drained) = match link.recv(&mut self.rx) {
            Ok(Recv::Data { buffered, drained, .. }) => (buffered > 0, drained),
            Ok(Recv::Empty) => (false, true),
            Ok(Recv::Full) => (false, false),
            Ok(Recv::Eof) => return Err(CloseReason::PeerClosed),
            Err(e) => return Err(CloseReason::Read(e)),
        };
        self.drained = drained;
        Ok(Filled { buffered, placed: 0 })
    }

    /// The plain socket's fill (see [`Self::fill`]).
    #[inline]
    fn fill_plain(&mut self, in_place: Option<InPlace>) -> Result<Filled, CloseReason> {
        self.rx.make_room(0);
        let got = match in_place.filter(|p| p.left > 0 && self.rx.is_empty()) {
            // SAFETY: `dest..dest + left` is writable and the transport's alone for the call:
            // the promise of `InPlace::new`, the only way to make one.
            Some(p) => unsafe { self.rx.recv_into(&*self.sock, 0, p.dest, p.left, h2c::DIRECT_TAIL) },
            None => self.rx.recv(&*self.sock),
        };
        let (filled, drained) = match got {
            Ok(Recv::Data {
                buffered,
                placed,
                drained,
            }) => (
                Filled {
                    buffered: buffered > 0,
                    placed,
                },
                drained,
            ),
            Ok(Recv::Empty) => (Filled::default(), true),
            Ok(Recv::Full) => (Filled::default(), false),
            Ok(Recv::Eof) => return Err(CloseReason::PeerClosed),
            Err(e) => return Err(CloseReason::Read(e)),
        };
        self.drained = drained;
        // A read that stopped at the end of the buffer with the socket not empty: at this
        // size every few PDUs cost a read, a compaction and a header parsed twice.
        self.rx_pressed = !drained && self.rx.capacity() < self.rx_max;
        Ok(filled)
    }

    /// Whether the last plain read filled the receive buffer while the socket held more,
    /// once: its traffic wants a larger buffer, so a busy connection reaches
    /// [`Self::rx_max`] in a few reads while an idle one keeps its few KiB (issue 26).
    pub fn take_rx_pressed(&mut self) -> bool {
        std::mem::take(&mut self.rx_pressed)
    }

    /// ICReq (NVMe/TCP 1.0 §3.6.2.2): negotiate digests, answer ICResp.
    pub fn on_icreq(&mut self, req: &IcReq) -> Result<(), Fatal> {
        // We place C2H data right after the header: only HPDA 0 (no padding) is served.
        if req.hpda != 0 {
            let fei = u32::from(IcReq::OFFSET_HPDA);
            return Err(Fatal::new(
                fes::UNSUPPORTED_PARAMETER,
                fei,
                CloseReason::HpdaUnsupported,
            ));
        }
        let (hd, dd) = (req.hdgst(), req.ddgst());
        let resp = encode_ic_resp(hd, dd, self.max_h2c_data, 0);
        self.out.extend_from_slice(&resp);
        self.hdgst = hd;
        self.ddgst = dd;
        self.ic_done = true;
        debug!(peer = %self.peer, hdgst = hd, ddgst = dd, "ICReq accepted");
        Ok(())
    }

    // ------------------------------------------------------------------------- send

    /// Write what is queued (as much as the socket takes).
    pub fn flush(&mut self) -> std::io::Result<()> {
        match &mut self.carrier {
            Carrier::Tls(link) => link.send(&mut self.out),
            _ => self.out.flush(self.sock.as_raw_fd()),
        }
    }

    /// Bytes queued for the socket.
    pub fn pending_out(&self) -> usize {
        match &self.carrier {
            Carrier::Tls(link) => self.out.pending() + link.pending(),
            _ => self.out.pending(),
        }
    }

    /// Read data may be sent from where it lies (no data digest to compute over the bytes
    /// sent, no TLS to encrypt them).
    #[inline]
    pub fn sends_in_place(&self) -> bool {
        !self.ddgst && matches!(self.carrier, Carrier::Plain)
    }

    /// The TLS PSK identity the connection was secured with (None: plain TCP).
    pub fn tls_identity(&self) -> Option<&PskIdentity> {
        match &self.carrier {
            Carrier::Tls(link) => link.identity(),
            _ => None,
        }
    }

    /// A TLS listener's connection has not finished choosing or handshaking yet.
    pub fn securing(&self) -> bool {
        match &self.carrier {
            Carrier::Plain => false,
            Carrier::Detect(..) => true,
            Carrier::Tls(link) => !link.open,
        }
    }

    /// A CapsuleResp with `cqe`.
    #[inline(always)]
    pub fn send_cqe(&mut self, cqe: &Cqe) {
        let (b, n) = encode_capsule_resp(cqe, self.hdgst);
        self.out.extend_from_slice(&b[..n]);
    }

    /// The header of a C2HData PDU carrying all `len` bytes of command `cid`'s data, with
    /// SUCCESS when no CapsuleResp follows (NVMe/TCP 1.0 §3.6.2.8).
    #[inline(always)]
    pub fn c2h_header(&mut self, cid: u16, len: u32, success: bool) {
        let (h, n) = encode_c2h_data_hdr(cid, 0, len, true, success, self.hdgst, self.ddgst);
        self.out.extend_from_slice(&h[..n]);
    }

    /// A C2HData PDU with `data` (and its digest).
    pub fn c2h(&mut self, cid: u16, data: &[u8]) {
        self.c2h_header(cid, data.len() as u32, false);
        self.out.extend_from_slice(data);
        if self.ddgst {
            self.out.extend_from_slice(&crc32c(data).to_le_bytes());
        }
    }

    /// The data of a C2HData PDU whose header was queued, appended by `append` to the send
    /// buffer (a copy), with its digest.
    pub fn c2h_data_copied(&mut self, append: impl FnOnce(&mut Vec<u8>)) {
        let buf = self.out.owned();
        let start = buf.len();
        append(buf);
        if self.ddgst {
            let dg = crc32c(&buf[start..]);
            buf.extend_from_slice(&dg.to_le_bytes());
        }
    }

    /// The data of a C2HData PDU whose header was queued, sent from where it is (no copy;
    /// only without a data digest, which must cover exactly the bytes sent).
    ///
    /// # Safety
    /// `base..base + len` must stay mapped and readable while `keep` lives (the send queue
    /// holds it until the bytes are sent).
    #[inline]
    pub unsafe fn c2h_data_in_place(
        &mut self,
        base: NonNull<u8>,
        len: usize,
        keep: &Arc<dyn std::any::Any + Send + Sync>,
    ) {
        debug_assert!(self.sends_in_place());
        // SAFETY: the caller's contract is push_external_dyn's.
        unsafe { self.out.push_external_dyn(base, len, keep) };
    }

    /// An R2T for all `len` bytes of command `cid` (one R2T per command, as Linux nvmet and
    /// SPDK do; the host splits the data into H2CData PDUs of at most MAXH2CDATA).
    pub fn r2t(&mut self, cid: u16, ttag: u16, len: u32) {
        let (b, n) = encode_r2t(cid, ttag, 0, len, self.hdgst);
        self.out.extend_from_slice(&b[..n]);
    }

    /// Queue a C2HTermReq for `f` with the offending `header` and try to send it.
    pub fn term_req(&mut self, f: &Fatal, header: &[u8]) {
        warn!(peer = %self.peer, fes = f.fes, fei = f.fei, "fatal NVMe/TCP error: {}; sending C2HTermReq", f.why);
        let (b, n) = encode_term_req(true, f.fes, f.fei, header);
        self.out.extend_from_slice(&b[..n]);
        let _ = self.flush();
    }

    /// Queue the C2HTermReq a PDU error calls for and try to send it; the close reason.
    pub fn term_req_for(&mut self, e: &PduError, header: &[u8]) -> CloseReason {
        let why = CloseReason::BadPdu(e.clone());
        match encode_term_req_for(e, Direction::ControllerToHost, header) {
            Some((b, n)) => {
                warn!(peer = %self.peer, error = %e, "bad PDU; sending C2HTermReq");
                self.out.extend_from_slice(&b[..n]);
                let _ = self.flush();
                why
            }
            None => {
                let f = Fatal::new(fes::INVALID_HEADER_FIELD, 0, why);
                self.term_req(&f, header);
                f.why
            }
        }
    }

    /// Send what is queued (best effort) and shut the socket down.
    pub fn shutdown(&mut self) {
        let _ = self.flush();
        if let Carrier::Tls(link) = &mut self.carrier
            && link.open
        {
            link.close();
        }
        let _ = self.sock.shutdown(Shutdown::Both);
    }
}

impl Transport for TcpTransport {
    const NAME: &'static str = "nvme-tcp-connection";

    #[inline(always)]
    fn run(q: &mut Queue<Self>, r: &mut Reactor, id: SourceId) -> Progress {
        conn::run(q, r, id)
    }

    fn peer(&self) -> SocketAddr {
        self.peer
    }

    fn local(&self) -> SocketAddr {
        self.local
    }

    fn tls_identity(&self) -> Option<&PskIdentity> {
        TcpTransport::tls_identity(self)
    }

    fn setup_pending(&self) -> Option<(&'static str, CloseReason)> {
        if self.securing() {
            Some(("TLS handshake", CloseReason::TlsHandshakeTimeout))
        } else if !self.ic_done {
            Some(("ICReq", CloseReason::IcReqTimeout))
        } else {
            None
        }
    }

    #[inline(always)]
    fn send_completion(&mut self, cqe: &Cqe) {
        self.send_cqe(cqe);
    }

    fn send_data(&mut self, cid: u16, data: &[u8]) {
        self.c2h(cid, data);
    }

    /// A C2HData PDU with the read's data, with SUCCESS in place of a CapsuleResp when the
    /// queue lets the completion fold into it (NVMe/TCP 1.0 §3.6.2.8: SQ flow control off).
    /// Memory that is never written (a null namespace's zeroes) is sent in place (see
    /// [`sendq`]) unless a data digest must cover it or TLS encrypt it; a RAM namespace's
    /// bytes are copied, block-atomically, when the read completes (a write after that must
    /// not reach a send still queued).
    #[inline(always)]
    fn send_read(&mut self, cid: u16, data: ReadBytes<'_>, fold: bool) -> bool {
        self.c2h_header(cid, data.len(), fold);
        // Only asked for when it could be used: the keeper is a reference more.
        let fixed = if self.sends_in_place() { data.fixed() } else { None };
        match fixed {
            Some(f) => {
                // SAFETY: `f` is the read's bytes in memory that stays mapped while `f.keep()`
                // lives (FixedBytes' promise: only ReadBytes::fixed makes one, its range
                // checked by range_ptr), which the send queue holds until the bytes are sent.
                unsafe { self.c2h_data_in_place(f.base(), f.len(), f.keep()) };
            }
            _ => self.c2h_data_copied(|buf| data.append_to(buf)),
        }
        fold
    }

    #[inline]
    fn fetch_data(&mut self, cid: u16, tag: u16, len: u32) {
        self.r2t(cid, tag, len);
    }

    #[inline]
    fn stream_end(&self) -> u64 {
        self.out.stream_end()
    }

    #[inline]
    fn sent_total(&self) -> u64 {
        self.out.sent_total()
    }

    #[inline]
    fn flush(&mut self) -> std::io::Result<()> {
        TcpTransport::flush(self)
    }

    fn terminate(&mut self, why: &CloseReason) {
        // The queue's own faults are of the command sequence (a full queue given another
        // command): NVMe/TCP 1.0 §3.6.2.3 has no closer status than PDU Sequence Error.
        warn!(peer = %self.peer, fes = fes::PDU_SEQUENCE_ERROR, "fatal NVMe/TCP error: {why}; sending C2HTermReq");
        let (b, n) = encode_term_req(true, fes::PDU_SEQUENCE_ERROR, 0, &[]);
        self.out.extend_from_slice(&b[..n]);
        let _ = TcpTransport::flush(self);
    }

    fn close(&mut self) {
        // Its grown receive buffer goes to the reactor's pool when it drops.
        self.shutdown();
    }

    fn stays(&self) -> Option<&'static str> {
        // TLS: the session keys and sequence numbers live in this process's OpenSSL (and
        // this kernel has no kTLS to hold them), so the host must reconnect. A TLS
        // listener's connection that has not sent its first byte could move, but costs a
        // host nothing to redo.
        match self.carrier {
            Carrier::Plain => None,
            Carrier::Detect(..) => Some("TLS listener, not yet chosen"),
            Carrier::Tls(_) => Some("TLS"),
        }
    }

    fn busy(&self) -> Option<&'static str> {
        if self.direct.is_some() {
            Some("receiving an H2CData PDU's data")
        } else if self.pending_out() > 0 {
            Some("bytes not yet sent")
        } else {
            None
        }
    }
}

impl Drop for TcpTransport {
    /// A grown receive buffer goes to the reactor's pool for the next connection.
    fn drop(&mut self) {
        self.rx_home.keep(std::mem::take(&mut self.rx).into_storage());
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use super::*;

    fn kept(pool: &RxPool) -> (usize, usize) {
        pool.with(|s| (s.bufs.len(), s.bytes())).unwrap_or_default()
    }

    #[test]
    fn a_grown_receive_buffer_goes_back_to_the_pool_when_its_transport_drops() {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let _client = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let (sock, _) = l.accept().expect("accept");
        let pool = RxPool::default();
        let conf = TransportConf::default();
        let no_tls = || -> Arc<PskLookup> { Arc::new(|_| None) };
        let mut t = TcpTransport::new(sock, &conf, TlsMode::None, no_tls, Some(&pool)).expect("transport");
        let mut rx = t.take_rx();
        t.grow_rx(&mut rx, 64 << 10);
        let cap = rx.capacity();
        assert!(cap >= 64 << 10);
        // The start buffer it grew out of is too small to keep.
        assert_eq!(kept(&pool), (0, 0));
        t.put_rx(rx);
        drop(t);
        assert_eq!(kept(&pool), (1, cap));
        // The next connection that needs as much takes it.
        assert_eq!(pool.with(|s| s.take(cap).map(|b| b.len())), Some(Some(cap)));
        // Bounded: beyond MAX_BYTES buffers are freed.
        let home = pool.home();
        for _ in 0..=RxShelf::MAX_BYTES / cap {
            home.keep(vec![0; cap]);
        }
        let (n, bytes) = kept(&pool);
        assert_eq!((n, bytes), (RxShelf::MAX_BYTES / cap, n * cap));
    }
}
