//! One NVMe/TCP connection (one NVMe-oF queue) on its reactor: reads PDUs (NVMe/TCP 1.0 §3.6),
//! parses each once, runs the command, writes C2HData/R2T/CapsuleResp PDUs back.
//!
//! Receive: socket bytes go into a linear buffer big enough for the largest PDU accepted;
//! complete PDUs are parsed in place (no copy before the data reaches the namespace). An
//! H2CData PDU whose data is mostly still in the socket when its header is parsed has the
//! rest read straight into its command's buffer (the R2T buffer, or an SSD write's DMA
//! buffer), with the next header read in the same `readv`, as nvmet-tcp and SPDK receive
//! data into the request; its digest is checked there before the command runs. Send:
//! responses of a whole batch of PDUs are gathered in one buffer and written with one
//! syscall. Fatal protocol errors answer C2HTermReq and close (§3.6.2.3).

use std::io::{ErrorKind, Read};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use pollux_conf::{DISCOVERY_NQN, validate_nqn};
use pollux_nvme::pci::DmaBuf;
use pollux_nvme::spec::{Cqe, Sqe, Status, opcode};
use pollux_nvme::tcp::{
    BARE_CAPSULE_CMD_LEN, CommonHeader, Crc32c, DataHdr, Direction, IcReq, PduError, PduHeader, PduLimits, PduType,
    check_data_digest, crc32c, encode_c2h_data_hdr, encode_capsule_resp, encode_ic_resp, encode_r2t, encode_term_req,
    encode_term_req_for, fes, parse_bare_capsule_cmd, parse_pdu_header,
};
use pollux_reactor::{Progress, Reactor, Source, SourceId};
use slab::Slab;
use tracing::{debug, info, warn};

use crate::admin::{self, CcEffect, FeatureEffect, Reply};
use crate::cmd::{self, Admin, DataPtr, Fabrics, Io, Xfer, connect_off, connect_sqe_off};
use crate::ctrl::{AER_LIMIT, Ctrl, Local, QueueRef, owner_of};
use crate::file::{FileChannel, FileOp};
use crate::ram::RamDisk;
use crate::sendq::SendQueue;
use crate::sim::{SimChannel, SimOp, Tag};
use crate::ssd::{SsdChannel, SsdOp};
use crate::subsystem::{Backend, Namespace, Shared, Snapshot, Subsystem, bump};

/// In-capsule data accepted on the admin queue (NVMe/TCP §3.3.1: 8 KiB for fabrics and admin).
const ADMIN_IN_CAPSULE: u32 = 8192;
/// PDUs handled per run before yielding to other sources.
const PDU_BUDGET: u32 = 64;
/// Bytes of PDUs handled per run before yielding (large writes would otherwise hold the
/// reactor for milliseconds).
const BYTE_BUDGET: usize = 512 * 1024;
/// Stop reading new commands while this much output waits for the socket.
const WBUF_HIGH: usize = 8 << 20;
/// Admin queue entries accepted at Connect.
const MAX_ADMIN_ENTRIES: u32 = 4096;

/// Connect invalid-parameter result (NVMe-oF 1.1 §6.3, Figure 21): IATTR bit 16 set for an
/// offset into the Connect data, clear for an offset into the SQE.
fn ipo_data(off: u32) -> u32 {
    (1 << 16) | off
}

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
}

/// A command waiting for its data (R2T sent, H2CData PDUs arriving).
struct PendingH2c {
    cid: u16,
    io: Io,
    buf: Vec<u8>,
    /// For a write to an NVMe SSD: the DMA buffer the data is received into (then `buf` is
    /// empty), so it is copied once, from the receive buffer to DMA memory.
    dma: Option<DmaBuf>,
    /// Bytes the R2T asked for (the buffer is dropped when the command completes early).
    len: u32,
    received: u32,
    /// Completed early (aborted or failed): the data is still drained, then dropped.
    done: Option<Status>,
}

impl PendingH2c {
    /// Copy `data` to offset `at` of the buffer the command's data is received into (callers
    /// checked the range against the R2T's length).
    fn place(&mut self, at: u32, data: &[u8]) {
        let at = at as usize;
        match &self.dma {
            // Volatile stores: the device reads this memory.
            Some(d) => d.region().write_bytes(d.offset() + at, data),
            None => self.buf[at..at + data.len()].copy_from_slice(data),
        }
    }

    /// `[at, at + len)` of that buffer as raw memory, for the kernel to write into (readv).
    /// No Rust reference to DMA memory is made.
    fn dest_ptr(&mut self, at: u32, len: usize) -> *mut u8 {
        let at = at as usize;
        match &self.dma {
            Some(d) => {
                assert!(at + len <= d.len(), "in-place data past its DMA buffer");
                d.region().as_ptr().wrapping_add(d.offset() + at)
            }
            None => self.buf[at..at + len].as_mut_ptr(),
        }
    }

    /// CRC32C of `[at, at + len)`: the data digest of data received in place. DMA memory is
    /// read with volatile copies, a page at a time.
    fn crc(&self, at: u32, len: u32) -> u32 {
        let (at, len) = (at as usize, len as usize);
        match &self.dma {
            Some(d) => {
                let mut crc = Crc32c::new();
                let mut chunk = [0u8; 4096];
                let mut done = 0;
                while done < len {
                    let n = (len - done).min(chunk.len());
                    d.region().read_bytes(d.offset() + at + done, &mut chunk[..n]);
                    crc.update(&chunk[..n]);
                    done += n;
                }
                crc.finish()
            }
            None => crc32c(&self.buf[at..at + len]),
        }
    }
}

/// An H2CData PDU with at least this many data bytes still to come when its header is parsed
/// has them received from the socket straight into its command's buffer (the R2T buffer, or
/// the DMA buffer of an SSD write) instead of into the receive buffer and then a copy.
const DIRECT_MIN: usize = 4096;
/// While data is received in place, the same `readv` reads at most this much of what follows
/// into the receive buffer: enough for the next PDU's header (and a stream of small PDUs), so
/// that a large next payload mostly goes in place too.
const DIRECT_TAIL: usize = 8192;

/// An H2CData PDU whose data is being received in place (see `DIRECT_MIN`). Until all of it
/// is in, no other PDU can be parsed: the stream is in the middle of this one.
struct DirectRx {
    /// The R2T it answers (key in `Conn::r2t`) and that command's CID.
    ttag: usize,
    cid: u16,
    /// Where the next data byte goes in the command's buffer, and how many are still to come.
    at: u32,
    left: u32,
    /// DATAL of the PDU: once all of it is in (`left` 0), its digest covers
    /// `[at - datal, at)`.
    datal: u32,
    /// A data digest follows the data (negotiated in ICReq/ICResp).
    ddgst: bool,
}

impl DirectRx {
    /// The command whose buffer the data goes into, while that buffer exists: None once the
    /// command completed early (an Abort freed its buffer), when its data is only drained.
    fn live<'a>(&self, r2t: &'a mut Slab<PendingH2c>) -> Option<&'a mut PendingH2c> {
        r2t.get_mut(self.ttag).filter(|p| p.cid == self.cid && p.done.is_none())
    }
}

/// R2T data buffers a reactor keeps for its connections to reuse, shared by them (reactor-local
/// state: no lock). A write whose data comes by R2T needs a buffer of its length until its data
/// has arrived and it ran, and allocating and zero-filling a new one per write is costly: 128
/// KiB sequential writes at QD32 had 24 of their 32 buffers new each round under the old pool
/// of 8 per connection; with this one, IOPS x1.055 and target CPU per I/O x0.950 (10
/// alternating pairs; the client is then the limit). The pool is bounded in bytes per
/// reactor, however many connections it serves, as SPDK bounds its transport's shared data
/// buffers (511 of 128 KiB by default); what it does not keep is freed.
#[derive(Debug, Default)]
pub struct H2cPool {
    bufs: Vec<Vec<u8>>,
    /// Capacity of the buffers kept.
    bytes: usize,
}

impl H2cPool {
    /// Most bytes of buffers kept per reactor: QD32 of 128 KiB writes on eight connections.
    pub const MAX_BYTES: usize = 32 << 20;

    /// A buffer of `len` bytes. A kept one keeps its length, so only growth is zeroed: the
    /// H2CData PDUs overwrite every byte up to `len` (contiguous from offset 0, §3.6.2.7)
    /// before the command uses the buffer.
    fn take(&mut self, len: usize) -> Vec<u8> {
        let mut buf = self.bufs.pop().unwrap_or_default();
        self.bytes -= buf.capacity().min(self.bytes);
        buf.resize(len, 0);
        buf
    }

    /// Keep `buf` for reuse, or free it when the pool is full.
    fn give(&mut self, buf: Vec<u8>) {
        let cap = buf.capacity();
        if cap > 0 && self.bytes + cap <= Self::MAX_BYTES {
            self.bytes += cap;
            self.bufs.push(buf);
        }
    }
}

/// Give the buffers of an R2T whose command will not run back: its DMA buffer to its SSD
/// channel's pool (the one it came from: a reactor has one channel per device), its heap
/// buffer to the reactor's [`H2cPool`]. A channel already gone (reactor shutdown) frees it.
fn recycle_h2c(r: &mut Reactor, p: PendingH2c) {
    if let (Some(d), Io::Write { ns, .. }) = (p.dma, &p.io)
        && let Some(ch) = existing_channel(r, ns)
    {
        r.with_source::<SsdChannel, _>(ch, |c, _| c.give_buf(d));
    }
    if let Some(pool) = r.local::<H2cPool>() {
        pool.give(p.buf);
    }
}

/// A command submitted to an asynchronous backend, waiting for its completion.
struct Inflight {
    cid: u16,
    io: Io,
}

/// Per-reactor map from namespace to that reactor's channel on it (a source).
pub struct Channels {
    by_ns: std::collections::HashMap<usize, SourceId>,
    /// Largest transfer: file channels size their aligned buffers by it.
    pub max_io: u32,
}

impl Channels {
    /// No channel yet; file channels will size buffers for `max_io` bytes.
    pub fn new(max_io: u32) -> Self {
        Self {
            by_ns: std::collections::HashMap::new(),
            max_io,
        }
    }
}

impl Default for Channels {
    fn default() -> Self {
        Self::new(1 << 20)
    }
}

/// The key of `ns`'s channel: one channel per device for SSD namespaces (its namespaces
/// share the queue pair), one per namespace otherwise. The key is the address of the device
/// or namespace: the channel holds an `Arc` of it, so the address cannot be reused while the
/// entry exists.
fn channel_key(ns: &Arc<Namespace>) -> usize {
    match &ns.backend {
        Backend::Nvme(s) => Arc::as_ptr(&s.dev) as usize,
        _ => Arc::as_ptr(ns) as usize,
    }
}

/// This reactor's channel on `ns`, if it has opened one.
fn existing_channel(r: &mut Reactor, ns: &Arc<Namespace>) -> Option<SourceId> {
    let key = channel_key(ns);
    r.local::<Channels>().and_then(|c| c.by_ns.get(&key).copied())
}

/// The channel of this reactor on `ns` (a simulated device, a file or an SSD), created on
/// first use.
fn channel_for(r: &mut Reactor, ns: &Arc<Namespace>) -> Result<SourceId, Status> {
    if let Some(id) = existing_channel(r, ns) {
        return Ok(id);
    }
    if r.local::<Channels>().is_none() {
        r.set_local(Channels::default());
    }
    let model = pollux_reactor::LatencyModel::new(r.model_kind());
    let registered = match &ns.backend {
        Backend::Sim(sim) => SimChannel::new(ns.clone(), sim.params.clone(), r.id(), model, sim_completed)
            .map_err(|e| e.to_string())
            .and_then(|ch| ch.register(r).map_err(|e| e.to_string())),
        Backend::File(f) => {
            let max_io = r.local::<Channels>().map_or(1 << 20, |c| c.max_io);
            FileChannel::new(ns.clone(), f.file.as_raw_fd(), r.id(), max_io, model, file_completed)
                .map_err(|e| e.to_string())
                .and_then(|ch| ch.register(r).map_err(|e| e.to_string()))
        }
        Backend::Nvme(s) => {
            let max_io = r.local::<Channels>().map_or(1 << 20, |c| c.max_io) as usize;
            SsdChannel::new(s.dev.clone(), r.id(), max_io, model, ssd_completed)
                .and_then(|ch| ch.register(r).map_err(|e| e.to_string()))
        }
        Backend::Ram(_) => return Err(Status::INTERNAL_ERROR),
    };
    let id = registered.map_err(|e| {
        warn!(nsid = ns.nsid, error = %e, "cannot open a device channel");
        Status::INTERNAL_ERROR
    })?;
    if let Some(c) = r.local::<Channels>() {
        c.by_ns.insert(channel_key(ns), id);
    }
    Ok(id)
}

/// A device channel completed a command (with the data of a read, for a file): hand it to
/// its connection, which flushes on its next run.
fn file_completed(r: &mut Reactor, tag: Tag, status: Status, data: Option<&[u8]>) {
    deliver(r, tag, status, data.map(ReadData::Bytes));
}

/// An SSD channel completed a command (with the DMA buffer of a read).
fn ssd_completed(r: &mut Reactor, tag: Tag, status: Status, data: Option<&DmaBuf>) {
    deliver(r, tag, status, data.map(ReadData::Dma));
}

/// Where a completed read's data is.
#[derive(Debug, Clone, Copy)]
pub enum ReadData<'a> {
    /// In memory.
    Bytes(&'a [u8]),
    /// In a DMA buffer (read with volatile accesses only).
    Dma(&'a DmaBuf),
    /// In a RAM (or simulated) namespace's memory, from this byte offset.
    Ram(&'a RamDisk, u64),
}

impl ReadData<'_> {
    fn len(&self) -> usize {
        match self {
            ReadData::Bytes(b) => b.len(),
            ReadData::Dma(d) => d.len(),
            ReadData::Ram(m, off) => m.len().saturating_sub(*off) as usize,
        }
    }

    /// Append the first `len` bytes to `out`.
    fn append_to(&self, len: usize, out: &mut Vec<u8>) {
        let len = len.min(self.len());
        match self {
            ReadData::Bytes(b) => out.extend_from_slice(&b[..len]),
            ReadData::Dma(d) => {
                let start = out.len();
                out.resize(start + len, 0);
                d.read(&mut out[start..]);
            }
            ReadData::Ram(m, off) => m.read_append(*off, len, out),
        }
    }
}

fn deliver(r: &mut Reactor, tag: Tag, status: Status, data: Option<ReadData<'_>>) {
    let done = r.with_source::<Conn, _>(tag.source, |c, r| {
        c.serial == tag.serial && {
            c.complete_async(r, tag.slot, status, data);
            true
        }
    });
    if done == Some(true) {
        r.wake(tag.source);
    }
}

/// A simulated device completed a command: hand it to its connection, which flushes on its
/// next run (one write for all the completions of a poll).
fn sim_completed(r: &mut Reactor, tag: Tag, status: Status, _device_latency: Duration) {
    // A read's data is in the namespace's memory: nothing comes with the completion.
    file_completed(r, tag, status, None);
}

/// A connection source.
pub struct Conn {
    serial: u64,
    sock: TcpStream,
    peer: SocketAddr,
    local: SocketAddr,
    shared: Arc<Shared>,
    reactor: usize,
    ic_done: bool,
    closed: bool,
    hdgst: bool,
    ddgst: bool,
    rbuf: Box<[u8]>,
    rstart: usize,
    rend: usize,
    /// Bytes for the host: PDUs built here, with RAM read data sent in place.
    out: SendQueue,
    q: Queue,
    qid: u16,
    sq_entries: u32,
    sqhd: u32,
    sqflow_off: bool,
    r2t: Slab<PendingH2c>,
    inflight: Slab<Inflight>,
    started: Instant,
    /// The last fill emptied the socket (a short read or EAGAIN).
    drained: bool,
    /// H2CData being received in place.
    direct: Option<DirectRx>,
}

impl Conn {
    /// Wrap an accepted, non-blocking socket.
    pub fn new(
        sock: TcpStream,
        shared: Arc<Shared>,
        reactor: usize,
        serial: u64,
        started: Instant,
    ) -> std::io::Result<Self> {
        let peer = sock.peer_addr()?;
        let local = sock.local_addr()?;
        let t = &shared.transport;
        // Room for the largest PDU we accept (header, digests, data) plus slack for the next.
        let max_data = t.max_h2c_data.max(t.in_capsule_data_size).max(ADMIN_IN_CAPSULE) as usize;
        let cap = (max_data + 256).max(64 * 1024) * 2;
        Ok(Self {
            serial,
            sock,
            peer,
            local,
            shared,
            reactor,
            ic_done: false,
            closed: false,
            hdgst: false,
            ddgst: false,
            rbuf: vec![0u8; cap].into_boxed_slice(),
            rstart: 0,
            rend: 0,
            out: SendQueue::with_capacity(64 * 1024),
            q: Queue::Unbound,
            qid: 0,
            sq_entries: 32,
            sqhd: 0,
            sqflow_off: false,
            r2t: Slab::new(),
            inflight: Slab::new(),
            started,
            drained: false,
            direct: None,
        })
    }

    /// The socket's fd (for registration).
    pub fn raw_fd(&self) -> std::os::fd::RawFd {
        self.sock.as_raw_fd()
    }

    /// The connection's serial number (unique in this process).
    pub fn serial(&self) -> u64 {
        self.serial
    }

    // ---------------------------------------------------------------- output

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush(self.sock.as_raw_fd())
    }

    fn pending_out(&self) -> usize {
        self.out.pending()
    }

    fn sqhd(&self) -> u16 {
        if self.sqflow_off { 0 } else { self.sqhd as u16 }
    }

    fn resp(&mut self, cid: u16, status: Status, dw0: u32, dw1: u32) {
        let mut cqe = Cqe::new(cid, self.qid, self.sqhd(), status, dw0);
        cqe.dw1.set(dw1);
        let (b, n) = encode_capsule_resp(&cqe, self.hdgst);
        self.out.extend_from_slice(&b[..n]);
    }

    fn c2h_header(&mut self, cid: u16, len: u32, success: bool) {
        let (h, n) = encode_c2h_data_hdr(cid, 0, len, true, success, self.hdgst, self.ddgst);
        self.out.extend_from_slice(&h[..n]);
    }

    fn c2h(&mut self, cid: u16, data: &[u8]) {
        self.c2h_header(cid, data.len() as u32, false);
        self.out.extend_from_slice(data);
        if self.ddgst {
            self.out.extend_from_slice(&crc32c(data).to_le_bytes());
        }
    }

    /// Send a command's reply: its data (at most what the host's SGL asked for), then the CQE.
    fn reply(&mut self, cid: u16, rep: Reply, max_len: u32) {
        if rep.status.is_success() && !rep.data.is_empty() && max_len > 0 {
            let n = rep.data.len().min(max_len as usize);
            self.c2h(cid, &rep.data[..n]);
        }
        self.resp(cid, rep.status, rep.dw0, rep.dw1);
    }

    /// Send an error status, logging it for the controller's error log.
    fn fail(&mut self, r: &mut Reactor, cid: u16, status: Status, nsid: u32, lba: u64) {
        self.resp(cid, status, 0, 0);
        self.log_error(r, cid, status, nsid, lba);
    }

    fn log_error(&mut self, r: &mut Reactor, cid: u16, status: Status, nsid: u32, lba: u64) {
        let sqid = self.qid;
        match &mut self.q {
            Queue::Admin(ctrl) => ctrl.log_error(sqid, cid, status, nsid, lba),
            Queue::Io(q) => {
                // Errors are rare: one message to the controller's reactor for its log.
                let (cntlid, owner) = (q.cntlid, q.owner);
                r.send(owner, move |r| {
                    with_ctrl(r, cntlid, |ctrl, _| ctrl.log_error(sqid, cid, status, nsid, lba));
                });
            }
            _ => {}
        }
    }

    // ---------------------------------------------------------------- teardown

    /// Fatal transport error: C2HTermReq with `fes`/`fei` and the offending header, then close.
    fn fatal(&mut self, r: &mut Reactor, id: SourceId, fes_value: u16, fei: u32, header: &[u8], why: &str) {
        warn!(peer = %self.peer, reactor = self.reactor, fes = fes_value, fei, "fatal NVMe/TCP error: {why}; sending C2HTermReq");
        let (b, n) = encode_term_req(true, fes_value, fei, header);
        self.out.extend_from_slice(&b[..n]);
        let _ = self.flush();
        self.close(r, id, why);
    }

    fn fatal_pdu(&mut self, r: &mut Reactor, id: SourceId, e: &PduError, header: &[u8]) {
        match encode_term_req_for(e, Direction::ControllerToHost, header) {
            Some((b, n)) => {
                warn!(peer = %self.peer, reactor = self.reactor, error = %e, "bad PDU; sending C2HTermReq");
                self.out.extend_from_slice(&b[..n]);
                let _ = self.flush();
                self.close(r, id, &e.to_string());
            }
            None => self.fatal(r, id, fes::INVALID_HEADER_FIELD, 0, header, &e.to_string()),
        }
    }

    /// Close the connection: tear down its controller (admin queue) or leave it (I/O queue).
    pub fn close(&mut self, r: &mut Reactor, id: SourceId, reason: &str) {
        if self.closed {
            return;
        }
        self.closed = true;
        let _ = self.flush();
        let _ = self.sock.shutdown(Shutdown::Both);
        // Writes still waiting for their data never run: their buffers go back to the pools,
        // or a host that reconnects in a loop mid-write would have the target allocate anew.
        for (_, p) in std::mem::take(&mut self.r2t) {
            recycle_h2c(r, p);
        }
        match std::mem::replace(&mut self.q, Queue::Unbound) {
            Queue::Admin(ctrl) => teardown_ctrl(r, ctrl, reason),
            Queue::Io(q) => {
                let (qid, serial, cntlid) = (self.qid, self.serial, q.cntlid);
                r.send(q.owner, move |r| {
                    with_ctrl(r, cntlid, |ctrl, _| {
                        if ctrl.io_queues.get(&qid).is_some_and(|x| x.serial == serial) {
                            ctrl.io_queues.remove(&qid);
                        }
                    });
                });
            }
            _ => {}
        }
        self.shared.conns_per_reactor[self.reactor].fetch_sub(1, Relaxed);
        info!(peer = %self.peer, reactor = self.reactor, qid = self.qid, reason, "connection closed");
        r.remove_source(id);
    }

    // ---------------------------------------------------------------- input

    /// Read what the socket has. Ok(true) if bytes arrived, Ok(false) if none; Err on EOF/error.
    fn fill(&mut self) -> Result<bool, String> {
        if self.rstart == self.rend {
            self.rstart = 0;
            self.rend = 0;
        } else if self.rstart > 0 && self.rend > self.rbuf.len() / 2 {
            self.rbuf.copy_within(self.rstart..self.rend, 0);
            self.rend -= self.rstart;
            self.rstart = 0;
        }
        let mut got = false;
        self.drained = false;
        if self.rstart == self.rend
            && let Some(d) = self.direct.as_mut().filter(|d| d.left > 0)
            // An aborted command's buffer is gone: its data is drained through the receive
            // buffer instead (process drops it).
            && let Some(p) = d.live(&mut self.r2t)
        {
            let left = d.left as usize;
            let tail = (self.rbuf.len() - self.rend).min(DIRECT_TAIL);
            let iov = [
                libc::iovec {
                    iov_base: p.dest_ptr(d.at, left).cast(),
                    iov_len: left,
                },
                libc::iovec {
                    iov_base: self.rbuf[self.rend..].as_mut_ptr().cast(),
                    iov_len: tail,
                },
            ];
            loop {
                // SAFETY: both iovecs are memory this connection owns exclusively for the
                // call: the rest of the command's buffer (in range: dest_ptr checked it, and
                // the device has not been given a DMA buffer whose data is still arriving)
                // and free space at the end of the receive buffer.
                let n = unsafe { libc::readv(self.sock.as_raw_fd(), iov.as_ptr(), 2) };
                if n < 0 {
                    let e = std::io::Error::last_os_error();
                    match e.kind() {
                        ErrorKind::Interrupted => continue,
                        ErrorKind::WouldBlock => {
                            self.drained = true;
                            return Ok(false);
                        }
                        _ => return Err(format!("read: {e}")),
                    }
                }
                if n == 0 {
                    return Err("peer closed the connection".into());
                }
                let n = n as usize;
                let placed = n.min(left);
                d.at += placed as u32;
                d.left -= placed as u32;
                self.rend += n - placed;
                self.drained = n < left + tail;
                return Ok(true);
            }
        }
        while self.rend < self.rbuf.len() {
            let room = self.rbuf.len() - self.rend;
            match self.sock.read(&mut self.rbuf[self.rend..]) {
                Ok(0) => {
                    return if got {
                        Ok(true)
                    } else {
                        Err("peer closed the connection".into())
                    };
                }
                Ok(n) => {
                    self.rend += n;
                    got = true;
                    // A short read emptied the socket's receive queue: more data raises a new
                    // edge, so reading again now would only return EAGAIN (a syscall per I/O).
                    if n < room {
                        self.drained = true;
                        break;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    self.drained = true;
                    break;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("read: {e}")),
            }
        }
        Ok(got)
    }

    fn limits(&self, kind: PduType) -> PduLimits {
        let t = &self.shared.transport;
        let max_data = match kind {
            PduType::CapsuleCmd => match self.q {
                Queue::Io(_) => t.in_capsule_data_size,
                _ => ADMIN_IN_CAPSULE.max(t.in_capsule_data_size),
            },
            PduType::H2CData => t.max_h2c_data,
            _ => 0,
        };
        // Digests apply only after ICReq/ICResp negotiated them.
        PduLimits {
            hdgst: self.hdgst,
            ddgst: self.ddgst,
            max_data,
        }
    }

    /// Parse and run the complete PDUs in the receive buffer.
    fn process(&mut self, r: &mut Reactor, id: SourceId, budget: &mut u32) -> bool {
        let mut progressed = false;
        let mut bytes = 0usize;
        let rbuf = std::mem::take(&mut self.rbuf);
        while !self.closed && *budget > 0 && self.pending_out() < WBUF_HIGH {
            if bytes >= BYTE_BUDGET {
                *budget = 0;
                break;
            }
            let avail = &rbuf[self.rstart..self.rend];
            if self.direct.is_some() {
                // The stream is inside an H2CData PDU whose data goes in place.
                let Some(used) = self.direct_continue(r, id, avail) else {
                    break;
                };
                self.rstart += used;
                bytes += used;
                progressed = true;
                continue;
            }
            // The PDU of every read and of every write that waits for R2T: a command
            // capsule without data, recognised by its exact common header.
            if self.ic_done
                && !self.hdgst
                && let Some(sqe) = parse_bare_capsule_cmd(avail)
            {
                self.rstart += BARE_CAPSULE_CMD_LEN;
                bytes += BARE_CAPSULE_CMD_LEN;
                *budget -= 1;
                progressed = true;
                self.on_capsule_pdu(r, id, &sqe, &[], true);
                continue;
            }
            let Some(ch_bytes) = avail.first_chunk::<8>() else {
                break;
            };
            let ch = match CommonHeader::parse(ch_bytes) {
                Ok(ch) => ch,
                Err(e) => {
                    self.fatal_pdu(r, id, &e, &avail[..avail.len().min(128)]);
                    break;
                }
            };
            let kind = match ch.kind() {
                Ok(k) => k,
                Err(e) => {
                    self.fatal_pdu(r, id, &e, ch_bytes);
                    break;
                }
            };
            // §3.6.2.1: ICReq first and only once.
            if (kind == PduType::IcReq) == self.ic_done {
                let why = if self.ic_done {
                    "a second ICReq"
                } else {
                    "a PDU before ICReq"
                };
                self.fatal(r, id, fes::PDU_SEQUENCE_ERROR, 0, ch_bytes, why);
                break;
            }
            let limits = self.limits(kind);
            let hl = ch.header_len(&limits);
            if avail.len() < hl {
                break;
            }
            let hdr = match parse_pdu_header(&ch, &avail[..hl], &limits, Direction::HostToController) {
                Ok(h) => h,
                Err(e) => {
                    self.fatal_pdu(r, id, &e, &avail[..hl.min(128)]);
                    break;
                }
            };
            let plen = ch.plen.get() as usize;
            if plen > rbuf.len() {
                // Cannot happen after parse_pdu_header bounded the data; keep it a clean error.
                self.fatal(
                    r,
                    id,
                    fes::DATA_TRANSFER_LIMIT_EXCEEDED,
                    4,
                    &avail[..hl.min(128)],
                    "PDU larger than the buffer",
                );
                break;
            }
            if avail.len() < plen {
                // Most of an H2CData PDU's data still to come: receive it in place.
                if kind == PduType::H2CData
                    && plen - avail.len() >= DIRECT_MIN
                    && avail.len() >= hdr.data_offset()
                    && let Some(used) = self.direct_start(r, id, &hdr, avail, hl)
                {
                    self.rstart += used;
                    bytes += plen;
                    *budget -= 1;
                    progressed = true;
                    continue;
                }
                break;
            }
            let pdu = &avail[..plen];
            let (off, dl) = (hdr.data_offset(), hdr.data_len() as usize);
            let data = if dl > 0 { &pdu[off..off + dl] } else { &[][..] };
            let digest_ok = !hdr.has_data_digest() || {
                let d = &pdu[off + dl..off + dl + 4];
                check_data_digest(data, u32::from_le_bytes([d[0], d[1], d[2], d[3]])).is_ok()
            };
            self.rstart += plen;
            bytes += plen;
            *budget -= 1;
            progressed = true;
            self.dispatch(r, id, hdr, data, digest_ok, &pdu[..hl]);
        }
        self.rbuf = rbuf;
        progressed
    }

    fn dispatch(&mut self, r: &mut Reactor, id: SourceId, hdr: PduHeader, data: &[u8], digest_ok: bool, header: &[u8]) {
        match hdr {
            PduHeader::IcReq(req) => self.on_icreq(r, id, &req, header),
            PduHeader::TermReq { hdr, .. } => {
                info!(peer = %self.peer, fes = hdr.fes.get(), "host sent H2CTermReq");
                self.close(r, id, "host terminated the connection");
            }
            PduHeader::CapsuleCmd { sqe, .. } => self.on_capsule_pdu(r, id, &sqe, data, digest_ok),
            PduHeader::H2CData { hdr, .. } => self.on_h2c_data(r, id, &hdr, data, digest_ok, header),
            other => {
                let why = format!("{:?} is not a host-to-controller PDU", other.pdu_type());
                self.fatal(r, id, fes::INVALID_HEADER_FIELD, 0, header, &why);
            }
        }
    }

    fn on_icreq(&mut self, r: &mut Reactor, id: SourceId, req: &IcReq, header: &[u8]) {
        // We place C2H data right after the header: only HPDA 0 (no padding) is served.
        if req.hpda != 0 {
            self.fatal(
                r,
                id,
                fes::UNSUPPORTED_PARAMETER,
                u32::from(IcReq::OFFSET_HPDA),
                header,
                "HPDA other than 0",
            );
            return;
        }
        let (hd, dd) = (req.hdgst(), req.ddgst());
        let resp = encode_ic_resp(hd, dd, self.shared.transport.max_h2c_data, 0);
        self.out.extend_from_slice(&resp);
        self.hdgst = hd;
        self.ddgst = dd;
        self.ic_done = true;
        debug!(peer = %self.peer, hdgst = hd, ddgst = dd, "ICReq accepted");
    }

    /// A command capsule PDU, `data` its in-capsule data.
    fn on_capsule_pdu(&mut self, r: &mut Reactor, id: SourceId, sqe: &Sqe, data: &[u8], digest_ok: bool) {
        self.sqhd = (self.sqhd + 1) % self.sq_entries.max(1);
        if !digest_ok {
            // NVMe/TCP §3.6.2.4: a data digest error fails the command, not the queue.
            self.fail(r, sqe.cid.get(), Status::TRANSIENT_TRANSPORT_ERROR, sqe.nsid.get(), 0);
            return;
        }
        self.on_capsule(r, id, sqe, data);
    }

    fn on_capsule(&mut self, r: &mut Reactor, id: SourceId, sqe: &Sqe, data: &[u8]) {
        let cid = sqe.cid.get();
        if sqe.opcode == opcode::FABRICS {
            return self.on_fabrics(r, id, sqe, data);
        }
        match self.q {
            Queue::Unbound | Queue::Connecting => self.fail(r, cid, Status::COMMAND_SEQUENCE_ERROR.with_dnr(), 0, 0),
            Queue::Admin(_) => self.on_admin(r, id, sqe, data),
            Queue::Io(_) => self.on_io(r, id, sqe, data),
        }
    }

    /// The host's buffer length for a controller-to-host command, or the status to fail with.
    fn c2h_len(&self, sqe: &Sqe) -> Result<u32, Status> {
        match cmd::data_ptr(sqe)? {
            DataPtr::None => Ok(0),
            DataPtr::InCapsule(_) => Err(Status::SGL_DESCRIPTOR_TYPE_INVALID.with_dnr()),
            DataPtr::Transport(len) if len > self.shared.transport.max_io_size.max(ADMIN_IN_CAPSULE) => {
                Err(Status::DATA_SGL_LENGTH_INVALID.with_dnr())
            }
            DataPtr::Transport(len) => Ok(len),
        }
    }

    // ---------------------------------------------------------------- fabrics

    fn on_fabrics(&mut self, r: &mut Reactor, id: SourceId, sqe: &Sqe, data: &[u8]) {
        let cid = sqe.cid.get();
        match cmd::decode_fabrics(sqe) {
            Fabrics::Connect {
                recfmt,
                qid,
                sqsize,
                cattr,
                kato,
            } => {
                if !matches!(self.q, Queue::Unbound) {
                    return self.fail(r, cid, Status::COMMAND_SEQUENCE_ERROR.with_dnr(), 0, 0);
                }
                self.connect(r, id, sqe, recfmt, qid, sqsize, cattr, kato, data);
            }
            Fabrics::PropertyGet { size8, offset } => match &self.q {
                Queue::Admin(ctrl) => {
                    let rep = admin::property_get(ctrl, &self.shared, size8, offset);
                    self.reply(cid, rep, 0);
                }
                _ => self.fail(r, cid, Status::INVALID_OPCODE.with_dnr(), 0, 0),
            },
            Fabrics::PropertySet { size8, offset, value } => {
                let Queue::Admin(ctrl) = &mut self.q else {
                    return self.fail(r, cid, Status::INVALID_OPCODE.with_dnr(), 0, 0);
                };
                let (rep, effect) = admin::property_set(ctrl, size8, offset, value);
                let cntlid = ctrl.cntlid;
                match effect {
                    CcEffect::Enabled => info!(cntlid, peer = %self.peer, "controller enabled"),
                    CcEffect::Disabled => {
                        info!(cntlid, "controller disabled (reset): deleting its I/O queues");
                        close_io_queues(r, ctrl, "controller reset");
                    }
                    CcEffect::Shutdown => info!(cntlid, "controller shutdown"),
                    CcEffect::None => {}
                }
                self.reply(cid, rep, 0);
            }
            Fabrics::Disconnect => {
                if matches!(self.q, Queue::Io(_)) {
                    self.resp(cid, Status::SUCCESS, 0, 0);
                    self.close(r, id, "Disconnect command");
                } else {
                    self.fail(r, cid, Status::INVALID_FIELD.with_dnr(), 0, 0);
                }
            }
            Fabrics::Other(_) => self.fail(r, cid, Status::INVALID_OPCODE.with_dnr(), 0, 0),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn connect(
        &mut self,
        r: &mut Reactor,
        id: SourceId,
        sqe: &Sqe,
        recfmt: u16,
        qid: u16,
        sqsize: u16,
        cattr: u8,
        kato: u32,
        data: &[u8],
    ) {
        let cid = sqe.cid.get();
        let refuse = |c: &mut Self, r: &mut Reactor, status: Status, dw0: u32, why: &str| {
            info!(peer = %c.peer, qid, status = %status, "connect refused: {why}");
            c.resp(cid, status, dw0, 0);
            let _ = r;
        };
        if recfmt != 0 {
            return refuse(
                self,
                r,
                Status::CONNECT_INCOMPATIBLE_FORMAT.with_dnr(),
                0,
                "record format",
            );
        }
        // Connect data always travels in-capsule (NVMe/TCP §3.3.1).
        match cmd::data_ptr(sqe) {
            Ok(DataPtr::InCapsule(1024)) if data.len() == 1024 => {}
            _ => {
                return refuse(
                    self,
                    r,
                    Status::DATA_SGL_LENGTH_INVALID.with_dnr(),
                    0,
                    "connect data not in capsule",
                );
            }
        }
        let d = match cmd::parse_connect_data(data) {
            Ok(d) => d,
            Err(off) => {
                return refuse(
                    self,
                    r,
                    Status::CONNECT_INVALID_PARAMETERS.with_dnr(),
                    ipo_data(off),
                    "bad connect data",
                );
            }
        };
        if let Err(why) = validate_nqn(&d.hostnqn) {
            let dw0 = ipo_data(connect_off::HOSTNQN);
            return refuse(
                self,
                r,
                Status::CONNECT_INVALID_PARAMETERS.with_dnr(),
                dw0,
                &format!("host NQN: {why}"),
            );
        }
        let entries = u32::from(sqsize) + 1;
        let max_entries = if qid == 0 {
            MAX_ADMIN_ENTRIES
        } else {
            self.shared.transport.io_queue_depth
        };
        if sqsize == 0 || entries > max_entries {
            return refuse(
                self,
                r,
                Status::CONNECT_INVALID_PARAMETERS.with_dnr(),
                connect_sqe_off::SQSIZE,
                "queue size",
            );
        }
        let subsys = if d.subnqn == DISCOVERY_NQN {
            if qid != 0 {
                return refuse(
                    self,
                    r,
                    Status::CONNECT_INVALID_PARAMETERS.with_dnr(),
                    connect_sqe_off::QID,
                    "I/O queue on discovery",
                );
            }
            None
        } else {
            let snap = self.shared.snapshot.load();
            let Some(s) = snap.subsystem(&d.subnqn) else {
                let dw0 = ipo_data(connect_off::SUBNQN);
                return refuse(
                    self,
                    r,
                    Status::CONNECT_INVALID_PARAMETERS.with_dnr(),
                    dw0,
                    &format!("unknown subsystem {}", d.subnqn),
                );
            };
            if !s.allows(&d.hostnqn) {
                let dw0 = ipo_data(connect_off::HOSTNQN);
                return refuse(
                    self,
                    r,
                    Status::CONNECT_INVALID_HOST.with_dnr(),
                    dw0,
                    &format!("host {} not allowed", d.hostnqn),
                );
            }
            Some(s.clone())
        };
        self.qid = qid;
        self.sq_entries = entries;
        self.sqhd = 1 % entries; // the Connect itself was consumed
        self.sqflow_off = cattr & (1 << 2) != 0;
        if qid == 0 {
            if d.cntlid != 0xFFFF {
                let dw0 = ipo_data(connect_off::CNTLID);
                return refuse(
                    self,
                    r,
                    Status::CONNECT_INVALID_PARAMETERS.with_dnr(),
                    dw0,
                    "admin queue must ask for a dynamic controller",
                );
            }
            let n = r.reactor_count();
            let me = self.reactor;
            let Some(cntlid) = r.local::<Local>().and_then(|l| l.alloc_cntlid(me, n)) else {
                return refuse(self, r, Status::CONNECT_CONTROLLER_BUSY, 0, "no controller id left");
            };
            if let Some(l) = r.local::<Local>() {
                l.ctrls.insert(
                    cntlid,
                    QueueRef {
                        reactor: me,
                        source: id,
                        serial: self.serial,
                    },
                );
            }
            let kato = self.shared.keep_alive.clamp(kato);
            let ctrl = Ctrl::new(cntlid, subsys, d.hostnqn.clone(), d.hostid, kato);
            info!(
                cntlid, reactor = me, peer = %self.peer, subnqn = %d.subnqn, hostnqn = %d.hostnqn, kato_ms = kato,
                "controller created"
            );
            self.shared.controllers_created.fetch_add(1, Relaxed);
            self.q = Queue::Admin(Box::new(ctrl));
            self.schedule_keep_alive(r, id);
            self.resp(cid, Status::SUCCESS, u32::from(cntlid), 0);
            return;
        }
        // An I/O queue: ask the controller's reactor to attach it; answer when it replies.
        let owner = owner_of(d.cntlid, r.reactor_count());
        let me = QueueRef {
            reactor: self.reactor,
            source: id,
            serial: self.serial,
        };
        self.q = Queue::Connecting;
        let (cntlid, subnqn, hostnqn, hostid) = (d.cntlid, d.subnqn, d.hostnqn, d.hostid);
        let sent = r.send(owner, move |r| {
            let res = attach_io(r, cntlid, qid, &subnqn, &hostnqn, &hostid, me);
            r.send(me.reactor, move |r| {
                r.with_source::<Conn, _>(me.source, |c, r| {
                    if c.serial == me.serial {
                        c.io_connected(r, me.source, cid, cntlid, owner, res);
                    }
                });
            });
        });
        if !sent {
            self.q = Queue::Unbound;
            self.resp(cid, Status::CONNECT_CONTROLLER_BUSY, 0, 0);
        }
    }

    fn io_connected(&mut self, r: &mut Reactor, id: SourceId, cid: u16, cntlid: u16, owner: usize, res: AttachResult) {
        if self.closed {
            return;
        }
        match res {
            Ok(subsys) => {
                debug!(cntlid, qid = self.qid, reactor = self.reactor, peer = %self.peer, "I/O queue connected");
                self.q = Queue::Io(IoQueue { cntlid, owner, subsys });
                self.resp(cid, Status::SUCCESS, u32::from(cntlid), 0);
            }
            Err((status, dw0, why)) => {
                info!(peer = %self.peer, qid = self.qid, cntlid, status = %status, "I/O queue connect refused: {why}");
                self.q = Queue::Unbound;
                self.resp(cid, status, dw0, 0);
            }
        }
        if let Err(e) = self.flush() {
            self.close(r, id, &format!("write: {e}"));
        }
    }

    // ---------------------------------------------------------------- admin

    fn schedule_keep_alive(&mut self, r: &mut Reactor, id: SourceId) {
        let Queue::Admin(ctrl) = &mut self.q else { return };
        if let Some(t) = ctrl.ka_timer.take() {
            r.cancel_timer(t);
        }
        if ctrl.kato_ms == 0 {
            return;
        }
        let at = ctrl.last_keep_alive + Duration::from_millis(u64::from(ctrl.kato_ms));
        let serial = self.serial;
        ctrl.ka_timer = Some(r.add_timer(at, move |r| {
            r.with_source::<Conn, _>(id, |c, r| {
                if c.serial == serial {
                    c.keep_alive_check(r, id);
                }
            });
        }));
    }

    fn keep_alive_check(&mut self, r: &mut Reactor, id: SourceId) {
        let Queue::Admin(ctrl) = &mut self.q else { return };
        ctrl.ka_timer = None;
        let deadline = ctrl.last_keep_alive + Duration::from_millis(u64::from(ctrl.kato_ms));
        if Instant::now() >= deadline {
            warn!(cntlid = ctrl.cntlid, peer = %self.peer, kato_ms = ctrl.kato_ms, "keep-alive timeout: deleting the controller");
            self.close(r, id, "keep-alive timeout");
        } else {
            self.schedule_keep_alive(r, id);
        }
    }

    fn on_admin(&mut self, r: &mut Reactor, id: SourceId, sqe: &Sqe, _data: &[u8]) {
        let cid = sqe.cid.get();
        let nsid = sqe.nsid.get();
        let command = cmd::decode_admin(sqe);
        let Queue::Admin(ctrl) = &mut self.q else { return };
        // Admin commands need an enabled controller (base spec §3.5.1).
        if !ctrl.ready() {
            return self.fail(r, cid, Status::COMMAND_SEQUENCE_ERROR.with_dnr(), nsid, 0);
        }
        if cmd::xfer(sqe) == Xfer::HostToCtrl && !matches!(cmd::data_ptr(sqe), Ok(DataPtr::None)) {
            // No admin command we serve takes data from the host.
            return self.fail(r, cid, Status::INVALID_FIELD.with_dnr(), nsid, 0);
        }
        let max_len = match cmd::xfer(sqe) {
            Xfer::CtrlToHost => match self.c2h_len(sqe) {
                Ok(l) => l,
                Err(s) => return self.fail(r, cid, s, nsid, 0),
            },
            _ => 0,
        };
        let Queue::Admin(ctrl) = &mut self.q else { return };
        let rep = match command {
            Admin::Identify { cns, nsid } => admin::identify(ctrl, &self.shared, cns, nsid),
            Admin::GetLogPage {
                lid, rae, offset, len, ..
            } => {
                let snap = self.shared.snapshot.load();
                let len = len.min(max_len);
                admin::get_log_page(
                    ctrl,
                    &admin::LogEnv {
                        shared: &self.shared,
                        snapshot: &snap,
                        local: self.local,
                        started: self.started,
                    },
                    lid,
                    rae,
                    offset,
                    len,
                )
            }
            Admin::GetFeatures { fid, cdw11, .. } => admin::get_features(ctrl, &self.shared, fid, cdw11),
            Admin::SetFeatures { fid, save, cdw11 } => {
                let (rep, effect) = admin::set_features(ctrl, &self.shared, fid, save, cdw11);
                if effect == FeatureEffect::KeepAlive {
                    ctrl.last_keep_alive = Instant::now();
                    self.schedule_keep_alive(r, id);
                }
                rep
            }
            Admin::KeepAlive => {
                ctrl.last_keep_alive = Instant::now();
                Reply::ok()
            }
            Admin::AsyncEventRequest => {
                if ctrl.aers.len() >= AER_LIMIT {
                    Reply::err(Status::ASYNC_EVENT_REQUEST_LIMIT_EXCEEDED)
                } else if let Some(ev) = ctrl.events.pop_front() {
                    Reply::dw0(ev)
                } else {
                    // Held until an event (base spec §5.2); completes later.
                    ctrl.aers.push_back(cid);
                    return;
                }
            }
            Admin::Abort { sqid, cid: target } => return self.abort(r, id, cid, sqid, target),
            Admin::Unsupported(_) => Reply::err(Status::INVALID_OPCODE.with_dnr()),
        };
        if !rep.status.is_success() {
            let status = rep.status;
            self.reply(cid, rep, max_len);
            self.log_error(r, cid, status, nsid, 0);
        } else {
            self.reply(cid, rep, max_len);
        }
    }

    /// Abort (base spec §5.1): dw0 bit 0 is 0 if the command was aborted, 1 if not.
    fn abort(&mut self, r: &mut Reactor, id: SourceId, cid: u16, sqid: u16, target: u16) {
        let Queue::Admin(ctrl) = &mut self.q else { return };
        if sqid == 0 {
            // Only AERs are ever pending on the admin queue.
            if let Some(pos) = ctrl.aers.iter().position(|&c| c == target) {
                ctrl.aers.remove(pos);
                self.resp(target, Status::ABORT_REQUESTED, 0, 0);
                self.resp(cid, Status::SUCCESS, 0, 0);
            } else {
                self.resp(cid, Status::SUCCESS, 1, 0);
            }
            return;
        }
        let Some(q) = ctrl.io_queues.get(&sqid).copied() else {
            return self.resp(cid, Status::SUCCESS, 1, 0);
        };
        let (me, serial) = (self.reactor, self.serial);
        let sent = r.send(q.reactor, move |r| {
            let aborted = r
                .with_source::<Conn, _>(q.source, |c, r| {
                    c.serial == q.serial && c.abort_pending(r, q.source, target)
                })
                .unwrap_or(false);
            r.send(me, move |r| {
                r.with_source::<Conn, _>(id, |c, r| {
                    if c.serial == serial {
                        c.resp(cid, Status::SUCCESS, u32::from(!aborted), 0);
                        if let Err(e) = c.flush() {
                            c.close(r, id, &format!("write: {e}"));
                        }
                    }
                });
            });
        });
        if !sent {
            self.resp(cid, Status::SUCCESS, 1, 0);
        }
    }

    /// Abort command `cid` if it still waits for data on this I/O queue.
    fn abort_pending(&mut self, r: &mut Reactor, id: SourceId, cid: u16) -> bool {
        let Some((_, p)) = self.r2t.iter_mut().find(|(_, p)| p.cid == cid && p.done.is_none()) else {
            return false;
        };
        // The command is complete: its CID and queue slot are free now (a host may reuse
        // them at once). Its buffer goes; the entry stays only as a tombstone so that data
        // already on its way for this TTAG is drained, not treated as a protocol error.
        p.done = Some(Status::ABORT_REQUESTED);
        p.buf = Vec::new();
        p.dma = None;
        self.resp(cid, Status::ABORT_REQUESTED, 0, 0);
        if let Err(e) = self.flush() {
            self.close(r, id, &format!("write: {e}"));
        }
        true
    }

    /// Complete held AERs with queued events (called when an event is raised).
    pub fn complete_events(&mut self) {
        let Queue::Admin(ctrl) = &mut self.q else { return };
        let mut done = Vec::new();
        while !ctrl.aers.is_empty() && !ctrl.events.is_empty() {
            if let (Some(cid), Some(ev)) = (ctrl.aers.pop_front(), ctrl.events.pop_front()) {
                done.push((cid, ev));
            }
        }
        for (cid, ev) in done {
            self.resp(cid, Status::SUCCESS, ev, 0);
        }
        let _ = self.flush();
    }

    // ---------------------------------------------------------------- NVM I/O

    fn on_io(&mut self, r: &mut Reactor, id: SourceId, sqe: &Sqe, data: &[u8]) {
        let cid = sqe.cid.get();
        let nsid = sqe.nsid.get();
        let Queue::Io(q) = &mut self.q else { return };
        let max_io = self.shared.transport.max_io_size;
        let mut decoded = cmd::decode_io(sqe, &q.subsys, max_io);
        if decoded.as_ref().err() == Some(&Status::INVALID_NAMESPACE.with_dnr()) {
            // Slow path, on a miss only: the subsystem may have changed and the host may have
            // heard of it (AER from the admin queue's reactor) before this queue's reactor got
            // the update by message. The snapshot is the truth: catch up and decode again.
            let snap = self.shared.snapshot.load();
            if let Some(now) = snap.subsystem(&q.subsys.nqn)
                && !Arc::ptr_eq(now, &q.subsys)
            {
                q.subsys = now.clone();
                decoded = cmd::decode_io(sqe, &q.subsys, max_io);
            }
        }
        let io = match decoded {
            Ok(io) => io,
            Err(s) => {
                let slba = u64::from(sqe.cdw10.get()) | (u64::from(sqe.cdw11.get()) << 32);
                return self.fail(r, cid, s, nsid, slba);
            }
        };
        let dp = match cmd::data_ptr(sqe) {
            Ok(dp) => dp,
            Err(s) => return self.fail(r, cid, s, nsid, 0),
        };
        let need = io.h2c_len();
        if need > 0 {
            // The host's buffer may be larger than the command needs (Linux sizes Dataset
            // Management buffers by segment); only a shorter one is invalid (base spec §4.3.2).
            match dp {
                DataPtr::InCapsule(len) if len >= need && data.len() == len as usize => {
                    self.exec_io(r, id, cid, io, &data[..need as usize])
                }
                DataPtr::Transport(len)
                    if len >= need && len <= self.shared.transport.max_io_size && data.is_empty() =>
                {
                    self.start_r2t(r, cid, io, len)
                }
                _ => self.fail(r, cid, Status::DATA_SGL_LENGTH_INVALID.with_dnr(), nsid, 0),
            }
            return;
        }
        if let Io::Read { len, .. } = &io {
            match dp {
                DataPtr::Transport(l) if l >= *len => {}
                DataPtr::InCapsule(_) => {
                    return self.fail(r, cid, Status::SGL_DESCRIPTOR_TYPE_INVALID.with_dnr(), nsid, 0);
                }
                _ => return self.fail(r, cid, Status::DATA_SGL_LENGTH_INVALID.with_dnr(), nsid, 0),
            }
        }
        self.exec_io(r, id, cid, io, &[]);
    }

    /// A successful read's reply: C2HData with its `len` bytes, then the CQE (or DATA_SUCCESS
    /// instead of a CQE when SQ flow control is off, NVMe/TCP §3.6.2.8). `data` is what came
    /// with the completion (a file's buffer, an SSD's DMA buffer); without it the bytes are
    /// in the namespace's memory (RAM, simulated SSD). Those are sent from the namespace in
    /// place (see `sendq`) unless a data digest must cover them: the digest is computed over
    /// a copy, so that it covers exactly the bytes sent.
    fn send_read(
        &mut self,
        r: &mut Reactor,
        cid: u16,
        ns: Arc<Namespace>,
        off: u64,
        len: u32,
        data: Option<ReadData<'_>>,
    ) {
        let Some(data) = data.or_else(|| ns.backend.memory().map(|m| ReadData::Ram(m, off))) else {
            return self.fail(r, cid, Status::INTERNAL_ERROR, ns.nsid, 0);
        };
        let success = self.sqflow_off;
        self.c2h_header(cid, len, success);
        match data {
            ReadData::Ram(mem, off) if !self.ddgst => {
                let base = mem.range_ptr(off, len as usize);
                let keep: Arc<dyn std::any::Any + Send + Sync> = ns.clone();
                // SAFETY: the range is inside the RAM disk's mapping (range_ptr checks it),
                // which lives as long as the namespace that `keep` holds.
                unsafe { self.out.push_external(base, len as usize, keep) };
            }
            data => {
                let buf = self.out.owned();
                let start = buf.len();
                data.append_to(len as usize, buf);
                if self.ddgst {
                    let dg = crc32c(&buf[start..]);
                    buf.extend_from_slice(&dg.to_le_bytes());
                }
            }
        }
        let c = ns.counters(self.reactor);
        bump(&c.read_cmds, 1);
        bump(&c.read_bytes, u64::from(len));
        if !success {
            self.resp(cid, Status::SUCCESS, 0, 0);
        }
    }

    /// Submit to this reactor's channel on a simulated device. Writes land in its memory now
    /// and complete after the device latency; reads are copied out at completion.
    fn submit_sim(&mut self, r: &mut Reactor, id: SourceId, cid: u16, io: Io, data: &[u8]) {
        let Some(ns) = io.namespace().cloned() else { return };
        let ch = match channel_for(r, &ns) {
            Ok(ch) => ch,
            Err(s) => return self.fail(r, cid, s, ns.nsid, 0),
        };
        let Some(mem) = ns.backend.memory() else {
            return self.fail(r, cid, Status::INTERNAL_ERROR, ns.nsid, 0);
        };
        let (op, len) = match &io {
            Io::Read { len, .. } => (SimOp::Read, *len),
            Io::Write { off, len, .. } => {
                apply_write(mem, &ns, self.reactor, *off, &data[..*len as usize]);
                (SimOp::Write, *len)
            }
            Io::WriteZeroes { off, len, .. } => {
                mem.zero(*off, *len);
                (SimOp::Write, 0)
            }
            Io::DatasetManagement { deallocate, .. } => match cmd::dsm_ranges(data, &ns) {
                Ok(ranges) => {
                    if *deallocate {
                        ranges.iter().for_each(|&(off, len)| mem.zero(off, len));
                    }
                    (SimOp::Write, 0)
                }
                Err(s) => return self.fail(r, cid, s, ns.nsid, 0),
            },
            Io::Flush { .. } => (SimOp::Write, 0),
        };
        let slot = self.inflight.insert(Inflight { cid, io });
        let tag = Tag {
            source: id,
            serial: self.serial,
            slot,
        };
        let now = Instant::now();
        let submitted = r
            .with_source::<SimChannel, _>(ch, |c, r| c.submit(r, now, tag, op, len))
            .is_some();
        if submitted {
            r.wake(ch);
        } else {
            self.inflight.remove(slot);
            self.fail(r, cid, Status::INTERNAL_ERROR, ns.nsid, 0);
        }
    }

    /// An asynchronous backend completed the command in `slot`; a read's data comes with it
    /// (a file, an SSD) or is in the namespace's memory (a simulated device).
    pub fn complete_async(&mut self, r: &mut Reactor, slot: usize, status: Status, data: Option<ReadData<'_>>) {
        let Some(inf) = self.inflight.try_remove(slot) else {
            return;
        };
        if self.closed {
            return;
        }
        match inf.io {
            Io::Read { ns, off, len } if status.is_success() => self.send_read(r, inf.cid, ns, off, len, data),
            io => {
                if status.is_success() {
                    self.resp(inf.cid, status, 0, 0);
                } else {
                    let nsid = io.namespace().map_or(0, |n| n.nsid);
                    self.fail(r, inf.cid, status, nsid, 0);
                }
            }
        }
    }

    fn start_r2t(&mut self, r: &mut Reactor, cid: u16, io: Io, len: u32) {
        // Command ids are the host's: two commands in flight with one id is a host bug.
        // Completed (aborted) entries kept only to drain late data do not count.
        if self.r2t.iter().any(|(_, p)| p.cid == cid && p.done.is_none()) {
            return self.fail(r, cid, Status::CID_CONFLICT.with_dnr(), 0, 0);
        }
        let live = self.r2t.iter().filter(|(_, p)| p.done.is_none()).count();
        if live >= self.sq_entries as usize {
            return self.fail(r, cid, Status::COMMAND_SEQUENCE_ERROR, 0, 0);
        }
        // Tombstones whose data never came are bounded: beyond a queue's worth, drop the
        // oldest (late data for it is then an unknown TTAG: fatal, which a host that aborts
        // a command and still sends its data much later has earned).
        let dead: Vec<usize> = self
            .r2t
            .iter()
            .filter(|(_, p)| p.done.is_some())
            .map(|(k, _)| k)
            .collect();
        if dead.len() > self.sq_entries as usize {
            let p = self.r2t.remove(dead[0]);
            recycle_h2c(r, p);
        }
        let dma = match &io {
            Io::Write { ns, .. } if matches!(ns.backend, Backend::Nvme(_)) => channel_for(r, ns)
                .ok()
                .and_then(|ch| r.with_source::<SsdChannel, _>(ch, |c, _| c.take_buf(len as usize)))
                .flatten(),
            _ => None,
        };
        // A recycled buffer: no allocation (for large writes an mmap and its page faults).
        // Every reactor of a target has a pool from its start.
        let buf = match (&dma, r.local::<H2cPool>()) {
            (Some(_), _) => Vec::new(),
            (None, Some(pool)) => pool.take(len as usize),
            (None, None) => vec![0; len as usize],
        };
        let ttag = self.r2t.insert(PendingH2c {
            cid,
            io,
            buf,
            dma,
            len,
            received: 0,
            done: None,
        });
        // One R2T for the whole transfer (as Linux nvmet and SPDK do); the host splits it into
        // H2CData PDUs of at most MAXH2CDATA.
        let (b, n) = encode_r2t(cid, ttag as u16, 0, len, self.hdgst);
        self.out.extend_from_slice(&b[..n]);
    }

    fn on_h2c_data(
        &mut self,
        r: &mut Reactor,
        id: SourceId,
        hdr: &DataHdr,
        data: &[u8],
        digest_ok: bool,
        header: &[u8],
    ) {
        let Some(ttag) = self.h2c_target(r, id, hdr, header) else {
            return;
        };
        let p = &mut self.r2t[ttag];
        if p.done.is_none() {
            p.place(hdr.datao.get(), data);
        }
        self.h2c_received(r, id, ttag, hdr.datal.get(), digest_ok);
    }

    /// The R2T (its TTAG) that an H2CData header continues; a header that continues none is
    /// fatal (and None).
    fn h2c_target(&mut self, r: &mut Reactor, id: SourceId, hdr: &DataHdr, header: &[u8]) -> Option<usize> {
        let ttag = usize::from(hdr.ttag.get());
        let (datao, datal) = (hdr.datao.get(), hdr.datal.get());
        let Some(p) = self.r2t.get(ttag).filter(|p| p.cid == hdr.cccid.get()) else {
            let fei = u32::from(DataHdr::OFFSET_TTAG);
            self.fatal(
                r,
                id,
                fes::INVALID_HEADER_FIELD,
                fei,
                header,
                "H2CData for no outstanding R2T",
            );
            return None;
        };
        // Each H2CData continues where the last ended (NVMe/TCP §3.6.2.7).
        if datao != p.received || u64::from(datao) + u64::from(datal) > u64::from(p.len) {
            let fei = u32::from(DataHdr::OFFSET_DATAO);
            self.fatal(
                r,
                id,
                fes::DATA_TRANSFER_OUT_OF_RANGE,
                fei,
                header,
                "H2CData outside its R2T",
            );
            return None;
        }
        Some(ttag)
    }

    /// `datal` more bytes of R2T `ttag` are in its buffer: fail the command on a bad digest,
    /// run it when all its data is in.
    fn h2c_received(&mut self, r: &mut Reactor, id: SourceId, ttag: usize, datal: u32, digest_ok: bool) {
        let Some(p) = self.r2t.get_mut(ttag) else { return };
        p.received += datal;
        if !digest_ok && p.done.is_none() {
            // NVMe/TCP §3.6.2.4: a data digest error fails the command, not the queue.
            p.done = Some(Status::TRANSIENT_TRANSPORT_ERROR);
            let cid = p.cid;
            self.resp(cid, Status::TRANSIENT_TRANSPORT_ERROR, 0, 0);
        }
        let Some(p) = self.r2t.get(ttag) else { return };
        if p.received == p.len {
            let mut p = self.r2t.remove(ttag);
            if p.done.is_some() {
                return recycle_h2c(r, p);
            }
            match p.dma.take() {
                Some(d) => self.submit_ssd_buf(r, id, p.cid, p.io, d),
                None => {
                    let need = p.io.h2c_len() as usize;
                    self.exec_io(r, id, p.cid, p.io, &p.buf[..need]);
                }
            }
            if let Some(pool) = r.local::<H2cPool>() {
                pool.give(p.buf);
            }
        }
    }

    /// An H2CData header whose data has not all arrived: copy what did into the command's
    /// buffer and receive the rest in place (`fill`). Returns the receive-buffer bytes used
    /// (header, padding and data), or None to wait for the whole PDU as usual (a fatal
    /// header, or a command already completed, whose data is only drained).
    fn direct_start(
        &mut self,
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
        let ttag = self.h2c_target(r, id, hdr, &avail[..hl])?;
        let p = &mut self.r2t[ttag];
        if p.done.is_some() {
            return None;
        }
        let (datao, datal) = (hdr.datao.get(), hdr.datal.get());
        let have = (avail.len() - data_off).min(datal as usize);
        p.place(datao, &avail[data_off..data_off + have]);
        self.direct = Some(DirectRx {
            ttag,
            cid: p.cid,
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
    fn direct_continue(&mut self, r: &mut Reactor, id: SourceId, avail: &[u8]) -> Option<usize> {
        let d = self.direct.as_mut()?;
        let live = d.live(&mut self.r2t);
        if d.left > 0 {
            if avail.is_empty() {
                return None;
            }
            let n = avail.len().min(d.left as usize);
            if let Some(p) = live {
                p.place(d.at, &avail[..n]);
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
            (Some(got), Some(p)) => p.crc(d.at - d.datal, d.datal) == got,
            _ => true,
        };
        let (ttag, datal) = (d.ttag, d.datal);
        self.direct = None;
        self.h2c_received(r, id, ttag, datal, digest_ok);
        Some(used)
    }

    fn exec_io(&mut self, r: &mut Reactor, id: SourceId, cid: u16, io: Io, data: &[u8]) {
        let reactor = self.reactor;
        let Some(ns) = io.namespace().cloned() else {
            // Flush of NSID FFFFFFFFh: nothing to do unless some namespace caches writes, and
            // for those we advertise (VWC bits 2:1 = 10b) that it is not supported.
            let cached = matches!(&self.q, Queue::Io(q) if q.subsys.volatile_cache());
            return if cached {
                self.fail(r, cid, Status::INVALID_NAMESPACE.with_dnr(), u32::MAX, 0)
            } else {
                self.resp(cid, Status::SUCCESS, 0, 0)
            };
        };
        let mem = match &ns.backend {
            Backend::Ram(mem) => mem,
            Backend::Sim(_) => return self.submit_sim(r, id, cid, io, data),
            Backend::File(_) => return self.submit_file(r, id, cid, io, data),
            Backend::Nvme(_) => return self.submit_ssd(r, id, cid, io, data),
        };
        match io {
            Io::Read { off, len, .. } => self.send_read(r, cid, ns, off, len, None),
            Io::Write { off, len, .. } => {
                apply_write(mem, &ns, reactor, off, &data[..len as usize]);
                self.resp(cid, Status::SUCCESS, 0, 0);
            }
            Io::WriteZeroes { off, len, .. } => {
                mem.zero(off, len);
                bump(&ns.counters(reactor).write_cmds, 1);
                self.resp(cid, Status::SUCCESS, 0, 0);
            }
            // RAM has no volatile cache to flush: a completed write is already visible.
            Io::Flush { .. } => self.resp(cid, Status::SUCCESS, 0, 0),
            Io::DatasetManagement { deallocate, .. } => match cmd::dsm_ranges(data, &ns) {
                Ok(ranges) => {
                    if deallocate {
                        ranges.iter().for_each(|&(off, len)| mem.zero(off, len));
                    }
                    self.resp(cid, Status::SUCCESS, 0, 0);
                }
                Err(s) => self.fail(r, cid, s, ns.nsid, 0),
            },
        }
    }

    /// Submit to this reactor's io_uring channel on a file namespace. Write data is copied
    /// into an aligned buffer of the channel (O_DIRECT); read data comes back with the
    /// completion.
    fn submit_file(&mut self, r: &mut Reactor, id: SourceId, cid: u16, io: Io, data: &[u8]) {
        let Some(ns) = io.namespace().cloned() else { return };
        let ch = match channel_for(r, &ns) {
            Ok(ch) => ch,
            Err(s) => return self.fail(r, cid, s, ns.nsid, 0),
        };
        let mut ops: Vec<FileOp> = Vec::with_capacity(1);
        let mut payload: Option<&[u8]> = None;
        match &io {
            Io::Read { off, len, .. } => ops.push(FileOp::Read { off: *off, len: *len }),
            Io::Write { off, len, fua, .. } => {
                ops.push(FileOp::Write {
                    off: *off,
                    len: *len,
                    fua: *fua,
                });
                payload = Some(&data[..*len as usize]);
            }
            Io::WriteZeroes { off, len, .. } => ops.push(FileOp::Zero { off: *off, len: *len }),
            Io::Flush { .. } => ops.push(FileOp::Flush),
            Io::DatasetManagement { deallocate, .. } => match cmd::dsm_ranges(data, &ns) {
                Ok(ranges) if *deallocate => {
                    ops.extend(ranges.iter().map(|&(off, len)| FileOp::Deallocate { off, len }));
                }
                Ok(_) => {}
                Err(s) => return self.fail(r, cid, s, ns.nsid, 0),
            },
        }
        if ops.is_empty() {
            // Dataset Management without deallocate (or no ranges): an advisory no-op.
            return self.resp(cid, Status::SUCCESS, 0, 0);
        }
        self.submit_to::<FileChannel>(r, id, ch, cid, io, |c, r, tag| c.submit(r, tag, &ops, payload));
    }

    /// Hand command `cid` to the device channel `ch` (a source of type `T`) with `submit`,
    /// keeping it in flight until the channel completes it; count a write; wake the channel
    /// so that it tells the reactor when the completion is expected (hybrid mode).
    fn submit_to<T: Source>(
        &mut self,
        r: &mut Reactor,
        id: SourceId,
        ch: SourceId,
        cid: u16,
        io: Io,
        submit: impl FnOnce(&mut T, &mut Reactor, Tag) -> Result<(), Status>,
    ) {
        let nsid = io.namespace().map_or(0, |n| n.nsid);
        if let Io::Write { ns, len, .. } = &io {
            let c = ns.counters(self.reactor);
            bump(&c.write_cmds, 1);
            bump(&c.write_bytes, u64::from(*len));
        }
        let slot = self.inflight.insert(Inflight { cid, io });
        let tag = Tag {
            source: id,
            serial: self.serial,
            slot,
        };
        let res = r
            .with_source::<T, _>(ch, |c, r| submit(c, r, tag))
            .unwrap_or(Err(Status::INTERNAL_ERROR));
        match res {
            Ok(()) => r.wake(ch),
            Err(s) => {
                self.inflight.remove(slot);
                self.fail(r, cid, s, nsid, 0);
            }
        }
    }
}

impl Conn {
    /// Submit to this reactor's queue pair on the namespace's NVMe device. Write data is
    /// copied into a DMA buffer; read data is appended to the send buffer from the DMA buffer
    /// at completion.
    fn submit_ssd(&mut self, r: &mut Reactor, id: SourceId, cid: u16, io: Io, data: &[u8]) {
        let Some(ns) = io.namespace().cloned() else { return };
        let Backend::Nvme(dev_ns) = &ns.backend else {
            return self.fail(r, cid, Status::INTERNAL_ERROR, ns.nsid, 0);
        };
        let ch = match channel_for(r, &ns) {
            Ok(ch) => ch,
            Err(s) => return self.fail(r, cid, s, ns.nsid, 0),
        };
        let shift = ns.block_shift;
        let ranges: Vec<(u64, u64)>;
        let op = match &io {
            Io::Read { off, len, .. } => SsdOp::Read {
                slba: off >> shift,
                blocks: u64::from(*len) >> shift,
            },
            Io::Write { off, len, fua, .. } => SsdOp::Write {
                slba: off >> shift,
                data: &data[..*len as usize],
                fua: *fua,
            },
            Io::WriteZeroes { off, len, .. } => {
                ranges = vec![(off >> shift, len >> shift)];
                SsdOp::Zero {
                    ranges: &ranges,
                    deallocate: false,
                }
            }
            Io::Flush { .. } => SsdOp::Flush,
            Io::DatasetManagement { deallocate, .. } => match cmd::dsm_ranges(data, &ns) {
                Ok(r) if *deallocate && r.iter().any(|&(_, len)| len > 0) => {
                    ranges = r.iter().map(|&(off, len)| (off >> shift, len >> shift)).collect();
                    SsdOp::Zero {
                        ranges: &ranges,
                        deallocate: true,
                    }
                }
                // Without deallocate (or no blocks): advisory, nothing to do.
                Ok(_) => return self.resp(cid, Status::SUCCESS, 0, 0),
                Err(s) => return self.fail(r, cid, s, ns.nsid, 0),
            },
        };
        let dev_ns = dev_ns.ns;
        self.submit_to::<SsdChannel>(r, id, ch, cid, io, |c, r, tag| c.submit(r, tag, &dev_ns, op));
    }

    /// A write whose data was received into the DMA buffer `buf`.
    fn submit_ssd_buf(&mut self, r: &mut Reactor, id: SourceId, cid: u16, io: Io, buf: DmaBuf) {
        let (Io::Write { ns, off, len, fua }, Some(ns_arc)) = (&io, io.namespace().cloned()) else {
            return;
        };
        let Backend::Nvme(dev_ns) = &ns.backend else {
            return self.fail(r, cid, Status::INTERNAL_ERROR, ns.nsid, 0);
        };
        let ch = match channel_for(r, &ns_arc) {
            Ok(ch) => ch,
            Err(s) => return self.fail(r, cid, s, ns.nsid, 0),
        };
        let op = SsdOp::WriteBuf {
            slba: off >> ns.block_shift,
            buf,
            len: *len as usize,
            fua: *fua,
        };
        let dev_ns = dev_ns.ns;
        self.submit_to::<SsdChannel>(r, id, ch, cid, io, |c, r, tag| c.submit(r, tag, &dev_ns, op));
    }
}

/// Copy written data into a namespace's memory and count it.
fn apply_write(mem: &RamDisk, ns: &Namespace, reactor: usize, off: u64, data: &[u8]) {
    mem.write(off, data);
    let c = ns.counters(reactor);
    bump(&c.write_cmds, 1);
    bump(&c.write_bytes, data.len() as u64);
}

type AttachResult = Result<Arc<Subsystem>, (Status, u32, String)>;

/// Run `f` on controller `cntlid` owned by this reactor, if it exists.
fn with_ctrl<R>(r: &mut Reactor, cntlid: u16, f: impl FnOnce(&mut Ctrl, &mut Reactor) -> R) -> Option<R> {
    let aref = r.local::<Local>()?.ctrls.get(&cntlid).copied()?;
    r.with_source::<Conn, _>(aref.source, |c, r| {
        if c.serial != aref.serial {
            return None;
        }
        match &mut c.q {
            Queue::Admin(ctrl) => Some(f(ctrl, r)),
            _ => None,
        }
    })
    .flatten()
}

/// On the controller's reactor: attach I/O queue `qid` of connection `q` (NVMe-oF §3.3).
fn attach_io(
    r: &mut Reactor,
    cntlid: u16,
    qid: u16,
    subnqn: &str,
    hostnqn: &str,
    hostid: &[u8; 16],
    q: QueueRef,
) -> AttachResult {
    let bad = |off: u32, why: &str| Err((Status::CONNECT_INVALID_PARAMETERS.with_dnr(), off, why.to_string()));
    let res = with_ctrl(r, cntlid, |ctrl, _| -> AttachResult {
        let Some(subsys) = ctrl.subsys.clone() else {
            return bad(ipo_data(connect_off::CNTLID), "discovery controller");
        };
        if subsys.nqn != subnqn {
            return bad(ipo_data(connect_off::SUBNQN), "controller belongs to another subsystem");
        }
        if ctrl.hostnqn != hostnqn {
            return bad(
                ipo_data(connect_off::HOSTNQN),
                "host NQN differs from the admin queue's",
            );
        }
        if &ctrl.hostid != hostid {
            return bad(
                ipo_data(connect_off::HOSTID),
                "host identifier differs from the admin queue's",
            );
        }
        if !ctrl.ready() {
            return Err((
                Status::COMMAND_SEQUENCE_ERROR.with_dnr(),
                0,
                "controller not enabled".into(),
            ));
        }
        let granted = if ctrl.io_queues_granted > 0 {
            ctrl.io_queues_granted
        } else {
            u16::MAX
        };
        if qid > granted {
            return bad(connect_sqe_off::QID, "queue id above the granted number of queues");
        }
        if ctrl.io_queues.contains_key(&qid) {
            return bad(connect_sqe_off::QID, "queue id already connected");
        }
        ctrl.io_queues.insert(qid, q);
        Ok(subsys)
    });
    res.unwrap_or_else(|| bad(ipo_data(connect_off::CNTLID), "no such controller"))
}

/// Ask every I/O queue of `ctrl` to close.
fn close_io_queues(r: &mut Reactor, ctrl: &mut Ctrl, reason: &'static str) {
    for (_, q) in std::mem::take(&mut ctrl.io_queues) {
        r.send(q.reactor, move |r| {
            r.with_source::<Conn, _>(q.source, |c, r| {
                if c.serial == q.serial {
                    c.close(r, q.source, reason);
                }
            });
        });
    }
}

/// Delete a controller: its timer, its registry entry, its I/O queues.
fn teardown_ctrl(r: &mut Reactor, mut ctrl: Box<Ctrl>, reason: &str) {
    if let Some(t) = ctrl.ka_timer.take() {
        r.cancel_timer(t);
    }
    if let Some(l) = r.local::<Local>() {
        l.ctrls.remove(&ctrl.cntlid);
    }
    close_io_queues(r, &mut ctrl, "controller deleted");
    info!(cntlid = ctrl.cntlid, hostnqn = %ctrl.hostnqn, reason, lifetime_s = ctrl.created.elapsed().as_secs(), "controller deleted");
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
            if let Err(e) = self.flush() {
                self.close(r, id, &format!("write: {e}"));
                return Progress::WORKED;
            }
            if self.pending_out() >= WBUF_HIGH {
                // The host is not reading: wait for the socket to drain (writable event).
                return Progress {
                    did_work: did,
                    next: pollux_reactor::Next::Idle,
                };
            }
            let got = match self.fill() {
                Ok(g) => g,
                Err(why) => {
                    // Process what did arrive (e.g. a final H2CTermReq) before closing.
                    self.process(r, id, &mut budget);
                    self.close(r, id, &why);
                    return Progress::WORKED;
                }
            };
            let progressed = self.process(r, id, &mut budget);
            if self.closed {
                return Progress::WORKED;
            }
            did |= got || progressed;
            if budget == 0 {
                let _ = self.flush();
                return Progress {
                    did_work: true,
                    next: pollux_reactor::Next::Asap,
                };
            }
            // Done when the socket is empty and every complete PDU has been handled (a partial
            // one waits for the edge its remaining bytes will raise).
            if self.drained || (!got && !progressed) {
                break;
            }
        }
        if let Err(e) = self.flush() {
            self.close(r, id, &format!("write: {e}"));
            return Progress::WORKED;
        }
        Progress {
            did_work: did,
            next: pollux_reactor::Next::Idle,
        }
    }

    fn shutdown(&mut self, _r: &mut Reactor, _id: SourceId) {
        // The target is stopping: send what is queued, then close. Commands waiting for data
        // are never completed; the host sees the connection close and retries elsewhere.
        let _ = self.flush();
        let _ = self.sock.shutdown(Shutdown::Both);
        self.shared.conns_per_reactor[self.reactor].fetch_sub(1, Relaxed);
        debug!(peer = %self.peer, "connection closed at shutdown");
    }
}

/// Run `f` on every controller this reactor owns (the control socket's `controllers`).
pub fn for_each_ctrl(r: &mut Reactor, mut f: impl FnMut(&Ctrl)) {
    let ids: Vec<u16> = r
        .local::<Local>()
        .map(|l| l.ctrls.keys().copied().collect())
        .unwrap_or_default();
    for id in ids {
        with_ctrl(r, id, |c, _| f(c));
    }
}

/// AER completion dword 0 (base spec §5.2, Figure 146-148): Notice (type 2), Namespace
/// Attribute Changed (info 00h, so bits 15:8 are zero), log page Changed Namespace List (04h).
const AER_NS_ATTR_CHANGED: u32 = 0x2 | (0x04 << 16);
/// Notice, Discovery Log Page Change (info F0h), log page Discovery (70h) (NVMe-oF §5.3).
const AER_DISCOVERY_CHANGED: u32 = 0x2 | (0xF0 << 8) | (0x70 << 16);

impl Conn {
    /// The subsystems changed (a new snapshot was swapped in): bring this admin queue's
    /// controller up to date — delete it if its subsystem is gone or its host no longer
    /// allowed; otherwise record the changed namespaces, hand the new subsystem to its I/O
    /// queues, and raise the AER the host enabled (masked while one of the kind is pending).
    pub fn refresh_ctrl(&mut self, r: &mut Reactor, id: SourceId, snap: &Snapshot, discovery_changed: bool) {
        let Queue::Admin(ctrl) = &mut self.q else { return };
        let mut event = None;
        match ctrl.subsys.clone() {
            None => {
                if discovery_changed && ctrl.aec & (1 << 31) != 0 {
                    event = Some(AER_DISCOVERY_CHANGED);
                }
            }
            Some(old) => {
                let Some(new) = snap.subsystem(&old.nqn).cloned() else {
                    return self.close(r, id, "subsystem removed");
                };
                if !new.allows(&ctrl.hostnqn) {
                    return self.close(r, id, "host no longer allowed");
                }
                if Arc::ptr_eq(&new, &old) {
                    return;
                }
                let mut changed: Vec<u32> = old.namespaces.keys().chain(new.namespaces.keys()).copied().collect();
                changed.sort_unstable();
                changed.dedup();
                changed.retain(|nsid| match (old.namespace(*nsid), new.namespace(*nsid)) {
                    (Some(a), Some(b)) => !Arc::ptr_eq(a, b),
                    _ => true,
                });
                if !changed.is_empty() {
                    for nsid in &changed {
                        if !ctrl.changed_ns.contains(nsid) {
                            ctrl.changed_ns.push(*nsid);
                        }
                    }
                    if ctrl.aec & (1 << 8) != 0 {
                        event = Some(AER_NS_ATTR_CHANGED);
                    }
                }
                ctrl.subsys = Some(new.clone());
                for q in ctrl.io_queues.values().copied() {
                    let new = new.clone();
                    r.send(q.reactor, move |r| {
                        r.with_source::<Conn, _>(q.source, |c, _| {
                            if c.serial == q.serial
                                && let Queue::Io(io) = &mut c.q
                            {
                                io.subsys = new;
                            }
                        });
                    });
                }
                info!(cntlid = ctrl.cntlid, changed = ?changed, "controller sees a changed subsystem");
            }
        }
        if let Some(ev) = event
            && !ctrl.events.contains(&ev)
        {
            ctrl.events.push_back(ev);
        }
        self.complete_events();
    }
}

#[cfg(test)]
mod tests {
    use super::H2cPool;

    #[test]
    fn r2t_buffers_are_reused_up_to_the_pool_bound() {
        let mut pool = H2cPool::default();
        let a = pool.take(128 << 10);
        assert_eq!(a.len(), 128 << 10);
        let ptr = a.as_ptr();
        pool.give(a);
        // The same buffer comes back, keeping its length (only growth is zeroed).
        let b = pool.take(64 << 10);
        assert_eq!((b.as_ptr(), b.len()), (ptr, 64 << 10));
        assert_eq!(pool.bytes, 0);
        pool.give(b);
        // Beyond the bound, buffers are freed, not kept.
        let n = H2cPool::MAX_BYTES / (128 << 10);
        let bufs: Vec<Vec<u8>> = (0..n + 4).map(|_| pool.take(128 << 10)).collect();
        for buf in bufs {
            pool.give(buf);
        }
        assert_eq!(pool.bufs.len(), n);
        assert!(pool.bytes <= H2cPool::MAX_BYTES);
        assert_eq!(pool.bytes, pool.bufs.iter().map(Vec::capacity).sum::<usize>());
    }
}
