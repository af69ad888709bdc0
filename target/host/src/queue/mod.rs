//! One NVMe-oF queue on one NVMe/TCP connection, as the host sees it.
//!
//! The socket is non-blocking. Submissions are appended to one send queue and go out with
//! one `sendmsg` when the caller polls ([`HostQueue::poll_completions`]) or calls
//! [`HostQueue::send_pending`]; write data of 2 KiB or more is not copied into it but sent
//! from the buffer the command was submitted with, which the queue holds until the command
//! completes (and, should a completion come before its data went, keeps until the data did:
//! see [`HostQueue::complete`]). Received bytes land in one reusable buffer ([`RxBuf`]),
//! complete PDUs are framed and parsed in place ([`next_frame`], direction controller-to-host,
//! as the target frames its input) and their data copied once, into the buffer the command
//! was submitted with; a lone read's data is received straight into that buffer instead (see
//! [`HostQueue::fill_in_place`]). Waiting is `poll(2)` on the socket with a deadline.
//!
//! With [`QueueOpts::tls`] the queue runs over TLS 1.3 ([`super::HostTls`]): the handshake
//! right after the TCP connect, then the same PDUs through the record layer, copied on both
//! sides (no data sent or received in place). The choice is made once per queue: a plain
//! queue pays one test of an `Option` on the few paths that touch the socket, nothing more.

mod raw;
mod recv;
mod send;
mod setup;

use std::collections::VecDeque;
use std::io::ErrorKind;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use pollux_nvme::spec::{SglDescriptor, Sqe, Status};
#[cfg(doc)]
use pollux_nvme::tcp::next_frame;
use pollux_nvme::tcp::{PduHeader, PduLimits, RxBuf, crc32c, encode_capsule_cmd};
use zerocopy::little_endian::U16;

use self::send::queue_data;
use super::error::HostError;
use super::sqe::{self, DsmRange};
use super::tls::{HostPsk, HostTls};
use pollux_link::sendq::SendQueue;
use pollux_link::tls::TlsLink;
use pollux_nvme::auth::sc_c;

#[cfg(test)]
pub(super) use recv::expected_c2h;

/// In-capsule data a controller accepts on the admin queue (NVMe/TCP 1.0 §3.3.1: 8 KiB for
/// fabrics and admin commands).
pub const ADMIN_IN_CAPSULE: u32 = 8192;
/// Initial receive buffer; it grows (once) to the largest PDU seen.
const RBUF_INITIAL: usize = 128 * 1024;
/// Largest PDU [`HostQueue::recv_raw`] accepts.
const MAX_RAW_PLEN: u32 = 64 << 20;
/// Write data at least this long is sent from the command's buffer, not copied into the
/// send queue: at QD32 the copy of each 4 KiB block was a third of the client's user-space
/// instructions, and a 128 KiB write's copy kept the client's core busy. Shorter data is
/// cheaper to copy than to describe with an iovec.
const BORROW_MIN: usize = 2048;
/// Reads at least this long are received in place when they are alone in flight (see
/// [`HostQueue::fill_in_place`]); shorter data is cheaper to copy than to give an iovec.
const IN_PLACE_MIN: usize = 2048;
/// A C2HData PDU header (NVMe/TCP 1.0 §3.6.2.8), without its header digest.
const C2H_HLEN: usize = 24;
/// Fabrics Connect data length (NVMe-oF 1.1 §6.3).
const CONNECT_DATA_LEN: usize = 1024;

/// A host identifier derived from the host NQN (stable, so every queue of one host NQN sends
/// the same HOSTID, which the target checks on I/O queue Connect).
pub fn hostid_from_nqn(hostnqn: &str) -> [u8; 16] {
    let mut id = [0u8; 16];
    for (i, chunk) in id.chunks_exact_mut(4).enumerate() {
        let mut c = pollux_nvme::tcp::Crc32c::new();
        c.update(&[i as u8]);
        c.update(hostnqn.as_bytes());
        chunk.copy_from_slice(&c.finish().to_le_bytes());
    }
    id
}

/// How to open and connect one queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueOpts {
    /// Ask for header digests in ICReq.
    pub hdgst: bool,
    /// Ask for data digests in ICReq.
    pub ddgst: bool,
    /// Queue id: 0 for the admin queue.
    pub qid: u16,
    /// Controller id for Connect: 0xFFFF (dynamic) on the admin queue, the admin queue's
    /// controller id on I/O queues.
    pub cntlid: u16,
    /// Connect SQSIZE, 0's based; the queue keeps up to SQSIZE + 1 commands in flight.
    pub sqsize: u16,
    /// Connect KATO in milliseconds (admin queue; 0 disables keep-alive).
    pub kato_ms: u32,
    /// Connect CATTR (bit 2: disable SQ flow control, which lets the target complete reads
    /// with C2HData SUCCESS and no CapsuleResp).
    pub cattr: u8,
    /// SUBNQN.
    pub subnqn: String,
    /// HOSTNQN.
    pub hostnqn: String,
    /// HOSTID.
    pub hostid: [u8; 16],
    /// Deadline of every blocking step (TCP connect, ICResp, a command, a raw send).
    pub timeout: Duration,
    /// Largest write sent in-capsule; larger ones use a transport SGL and R2T. The admin
    /// queue's is 8 KiB; an I/O queue's is IOCCSZ * 16 - 64 from Identify Controller.
    pub in_capsule_max: u32,
    /// Largest C2HData data part accepted.
    pub max_data: u32,
    /// DH-HMAC-CHAP keys: the queue authenticates when its Connect response asks (ATR).
    pub dhchap: Option<super::HostDhchap>,
    /// TLS 1.3 with this PSK (NVMe/TCP 1.0 §3.6.1): the handshake right after the TCP
    /// connect, before ICReq (None: plain TCP).
    pub tls: Option<HostTls>,
    /// The local address to connect from (None: the system's choice).
    pub source: Option<std::net::IpAddr>,
}

impl QueueOpts {
    /// An admin queue for `hostnqn` on subsystem `subnqn` (SQSIZE 31 like Linux, KATO 0).
    pub fn admin(subnqn: &str, hostnqn: &str) -> Self {
        Self {
            hdgst: false,
            ddgst: false,
            qid: 0,
            cntlid: 0xFFFF,
            sqsize: 31,
            kato_ms: 0,
            cattr: 0,
            subnqn: subnqn.to_string(),
            hostnqn: hostnqn.to_string(),
            hostid: hostid_from_nqn(hostnqn),
            timeout: Duration::from_secs(5),
            in_capsule_max: ADMIN_IN_CAPSULE,
            max_data: 1 << 20,
            dhchap: None,
            tls: None,
            source: None,
        }
    }

    /// I/O queue `qid` of controller `cntlid`, `entries` deep (SQSIZE `entries - 1`). Writes
    /// go by R2T until [`QueueOpts::in_capsule_max`] is set from IOCCSZ.
    pub fn io(subnqn: &str, hostnqn: &str, qid: u16, cntlid: u16, entries: u16) -> Self {
        Self {
            qid,
            cntlid,
            sqsize: entries.saturating_sub(1).max(1),
            in_capsule_max: 0,
            ..Self::admin(subnqn, hostnqn)
        }
    }

    /// With header/data digests requested.
    pub fn digests(mut self, hdgst: bool, ddgst: bool) -> Self {
        self.hdgst = hdgst;
        self.ddgst = ddgst;
        self
    }

    /// Over TLS 1.3 with `tls`.
    pub fn tls(mut self, tls: HostTls) -> Self {
        self.tls = Some(tls);
        self
    }
}

/// What ICReq/ICResp negotiated (NVMe/TCP 1.0 §3.6.2.2-3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IcInfo {
    /// Header digests enabled.
    pub hdgst: bool,
    /// Data digests enabled.
    pub ddgst: bool,
    /// MAXH2CDATA: most data in one H2CData PDU.
    pub maxh2cdata: u32,
    /// CPDA (always 0: anything else is refused).
    pub cpda: u8,
}

/// The outcome of Fabrics Connect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectResult {
    /// Completion status.
    pub status: Status,
    /// Completion dword 0 (controller id on success; IATTR/IPO for Invalid Parameters).
    pub dw0: u32,
}

/// A command's data buffer, moved into the queue at submission and handed back in its
/// [`Completion`]. The whole buffer is the transfer.
#[derive(Debug, Default)]
pub enum Data {
    /// No data.
    #[default]
    None,
    /// Host to controller (write, Dataset Management, Connect): in-capsule when it fits,
    /// otherwise by R2T/H2CData.
    ToCtrl(Vec<u8>),
    /// Controller to host (read, Identify, Get Log Page): filled by C2HData.
    FromCtrl(Vec<u8>),
}

/// A completed command.
#[derive(Debug)]
pub struct Completion {
    /// Command id.
    pub cid: u16,
    /// The tag given at submission.
    pub tag: u64,
    /// Status (a data digest mismatch on C2HData turns success into Data Transfer Error, as
    /// Linux does).
    pub status: Status,
    /// Completion dword 0.
    pub dw0: u32,
    /// Completion dword 1.
    pub dw1: u32,
    /// The buffer the command was submitted with (read data in it).
    pub buf: Vec<u8>,
    /// Data bytes moved (C2H received, or H2C sent).
    pub transferred: u32,
}

impl Completion {
    /// The status is success.
    pub fn is_success(&self) -> bool {
        self.status.is_success()
    }
}

/// What [`HostQueue::recv_raw`] read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RawReply {
    /// A PDU: its bytes and, when it passes the header rules, its parsed header.
    Pdu {
        /// The header, if valid for the negotiated digests.
        hdr: Option<PduHeader>,
        /// The whole PDU (PLEN bytes).
        bytes: Vec<u8>,
    },
    /// A C2HTermReq.
    TermReq {
        /// Fatal Error Status.
        fes: u16,
        /// Fatal Error Information.
        fei: u32,
        /// The offending PDU header the target sent back.
        offending: Vec<u8>,
    },
    /// Bytes that do not start with a valid common header.
    Garbage(Vec<u8>),
    /// The target closed the connection.
    Eof,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Dir {
    #[default]
    None,
    /// Host to controller, data sent in-capsule.
    H2cInCapsule,
    /// Host to controller, data sent on R2T.
    H2cR2t,
    /// Controller to host.
    C2h,
}

/// One command id.
#[derive(Debug, Default)]
struct Slot {
    busy: bool,
    tag: u64,
    buf: Vec<u8>,
    dir: Dir,
    len: u32,
    /// Bytes moved so far (C2H received / H2C queued).
    done: u32,
    ddgst_error: bool,
    /// Stream position after the last bytes of `buf` queued in place: `buf` must live until
    /// the send queue's `sent_total` reaches it.
    sent_by: u64,
}

/// One NVMe-oF queue over NVMe/TCP.
#[derive(Debug)]
pub struct HostQueue {
    sock: TcpStream,
    opts: QueueOpts,
    hdgst: bool,
    ddgst: bool,
    maxh2cdata: u32,
    ic_done: bool,
    cntlid: u16,
    rx: RxBuf,
    /// Bytes the PDU at the front of `rx` needs (8 until its header is known).
    need: usize,
    out: SendQueue,
    /// Buffers of commands that completed before the data queued from them was sent (only
    /// a misbehaving controller does that), each with the stream position it waits for.
    parked: VecDeque<(u64, Vec<u8>)>,
    slots: Vec<Slot>,
    free: Vec<u16>,
    /// Completions read while waiting for another command ([`HostQueue::exec`]).
    stash: VecDeque<Completion>,
    scratch: Vec<u8>,
    closed: bool,
    /// The command id submitted last: when it is the only one in flight, the next PDU is
    /// expected to be its data.
    last_cid: u16,
    /// A C2HData header whose data [`HostQueue::fill_in_place`] received in place, to be
    /// handled before the bytes that followed it (at the front of `rx`).
    landed: Option<PduHeader>,
    /// Reads whose data was received in place.
    in_place_reads: u64,
    /// The TLS session (None: plain TCP), from the handshake on.
    tls: Option<Box<TlsLink>>,
    /// The last TLS read stopped with plaintext possibly still held by OpenSSL or its read
    /// buffer (it filled the receive buffer, or did not find the socket empty): the socket
    /// will not signal those bytes again, so the queue reads before it waits.
    tls_unread: bool,
    /// Write data at least this long is sent in place ([`BORROW_MIN`]; never over TLS, whose
    /// record layer encrypts owned bytes only).
    borrow_min: usize,
    /// The PSK the Connect's authentication generated (secure channel concatenation).
    generated: Option<pollux_nvme::tls::GeneratedPsk>,
}

fn io_err(e: std::io::Error) -> HostError {
    match e.kind() {
        ErrorKind::ConnectionReset
        | ErrorKind::BrokenPipe
        | ErrorKind::ConnectionAborted
        | ErrorKind::UnexpectedEof => HostError::Closed,
        _ => HostError::Io(e),
    }
}

impl HostQueue {
    /// Opens the TCP connection only (raw mode): no ICReq yet. With [`QueueOpts::tls`] the
    /// TLS handshake is done too (NVMe/TCP 1.0 §3.6.1.1: it comes before ICReq), and raw
    /// PDUs travel inside the session.
    pub fn tcp(addr: SocketAddr, opts: QueueOpts) -> Result<Self, HostError> {
        let sock = match opts.source {
            None => TcpStream::connect_timeout(&addr, opts.timeout)?,
            Some(ip) => {
                let s = socket2::Socket::new(socket2::Domain::for_address(addr), socket2::Type::STREAM, None)?;
                s.bind(&std::net::SocketAddr::new(ip, 0).into())?;
                s.connect_timeout(&addr.into(), opts.timeout)?;
                s.into()
            }
        };
        sock.set_nodelay(true)?;
        sock.set_nonblocking(true)?;
        let entries = usize::from(opts.sqsize) + 1;
        let mut q = Self {
            sock,
            hdgst: false,
            ddgst: false,
            maxh2cdata: 0,
            ic_done: false,
            cntlid: 0xFFFF,
            rx: RxBuf::new(RBUF_INITIAL),
            need: 8,
            out: SendQueue::with_capacity(64 * 1024),
            parked: VecDeque::new(),
            slots: (0..entries).map(|_| Slot::default()).collect(),
            free: (0..entries).rev().map(|i| i as u16).collect(),
            stash: VecDeque::new(),
            scratch: Vec::new(),
            closed: false,
            last_cid: 0,
            landed: None,
            in_place_reads: 0,
            tls: None,
            tls_unread: false,
            borrow_min: BORROW_MIN,
            generated: None,
            opts,
        };
        if let Some(cfg) = q.opts.tls.clone() {
            let link = q.tls_handshake(&cfg)?;
            q.tls = Some(Box::new(link));
            q.borrow_min = usize::MAX;
            // Whatever came with the handshake's last flight is read before any wait.
            q.tls_unread = true;
        }
        Ok(q)
    }

    /// TCP connect, ICReq/ICResp, Fabrics Connect. A Connect that completes with an error is
    /// [`HostError::ConnectRefused`] carrying its status and dw0.
    pub fn connect(addr: SocketAddr, opts: QueueOpts) -> Result<Self, HostError> {
        let mut q = Self::tcp(addr, opts)?;
        q.initialize()?;
        let r = q.fabrics_connect()?;
        if !r.status.is_success() {
            return Err(HostError::ConnectRefused {
                status: r.status,
                dw0: r.dw0,
            });
        }
        // AUTHREQ ATR (NVMe-oF 1.1 §6.3): authenticate before anything else, as Linux does.
        if r.dw0 & (1 << 17) != 0 {
            let Some(cfg) = q.opts.dhchap.clone() else {
                return Err(HostError::Auth(
                    "the controller requires authentication and no key is set".into(),
                ));
            };
            let t_id = q.opts.qid;
            // With concatenation the admin queue asks for a new PSK (plain TCP) or to replace
            // the generated PSK that secures it, and sends C2 without asking the controller
            // to prove itself, as the Linux host does (TP 8018).
            let x = match (cfg.concat && t_id == 0, &q.opts.tls) {
                (false, _) => super::ExchangeOpts::default(),
                (
                    true,
                    Some(HostTls {
                        psk: HostPsk::Generated(_),
                        ..
                    }),
                ) => super::ExchangeOpts {
                    sc_c: sc_c::REPLACE_TLS_PSK,
                    c2_only: true,
                },
                (true, _) => super::ExchangeOpts {
                    sc_c: sc_c::NEW_TLS_PSK,
                    c2_only: true,
                },
            };
            let (_, generated) = q.exchange(&cfg, t_id, 0x5EED_0000 | u32::from(t_id), x)?;
            q.generated = generated;
        }
        Ok(q)
    }

    /// The PSK the Connect's authentication generated (secure channel concatenation), once.
    pub fn take_generated(&mut self) -> Option<pollux_nvme::tls::GeneratedPsk> {
        self.generated.take()
    }

    /// TCP connect and ICReq/ICResp only (no Fabrics Connect yet).
    pub fn initialized(addr: SocketAddr, opts: QueueOpts) -> Result<Self, HostError> {
        let mut q = Self::tcp(addr, opts)?;
        q.initialize()?;
        Ok(q)
    }

    // ------------------------------------------------------------------ accessors

    /// The options the queue was opened with.
    pub fn opts(&self) -> &QueueOpts {
        &self.opts
    }

    /// Queue id.
    pub fn qid(&self) -> u16 {
        self.opts.qid
    }

    /// Controller id returned by Connect (0xFFFF before).
    pub fn cntlid(&self) -> u16 {
        self.cntlid
    }

    /// What ICReq/ICResp negotiated (all zero before).
    pub fn ic_info(&self) -> IcInfo {
        IcInfo {
            hdgst: self.hdgst,
            ddgst: self.ddgst,
            maxh2cdata: self.maxh2cdata,
            cpda: 0,
        }
    }

    /// Command ids: SQSIZE + 1.
    pub fn depth(&self) -> usize {
        self.slots.len()
    }

    /// Commands submitted and not completed.
    pub fn in_flight(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Reads whose data was received straight into their buffer (see
    /// [`HostQueue::fill_in_place`]), since the queue was opened.
    pub fn in_place_reads(&self) -> u64 {
        self.in_place_reads
    }

    /// Command ids free for [`HostQueue::submit`].
    pub fn free_slots(&self) -> usize {
        self.free.len()
    }

    /// Sets the largest write sent in-capsule (IOCCSZ * 16 - 64).
    pub fn set_in_capsule_max(&mut self, bytes: u32) {
        self.opts.in_capsule_max = bytes;
    }

    /// Sets the deadline of blocking steps.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.opts.timeout = timeout;
    }

    /// The local socket address.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.sock.local_addr()
    }

    /// The queue runs over TLS: the negotiated cipher suite (None: plain TCP).
    pub fn tls_cipher(&self) -> Option<&str> {
        self.tls.as_deref().map(TlsLink::cipher)
    }

    /// The connection was closed or broke.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    fn limits(&self) -> PduLimits {
        PduLimits {
            hdgst: self.hdgst,
            ddgst: self.ddgst,
            max_data: self.opts.max_data,
        }
    }

    // ------------------------------------------------------------------ submission

    /// Queues a command for sending; it goes out with the next [`HostQueue::poll_completions`]
    /// or [`HostQueue::send_pending`], together with every other command queued meanwhile.
    /// Fills CID, PSDT (SGL) and SGL1: writes up to [`QueueOpts::in_capsule_max`] bytes go
    /// in-capsule (SGL data block, offset subtype), other data uses a transport SGL data block
    /// (0x5A; NVMe/TCP §3.3). Returns the command id. On error the buffer is dropped.
    pub fn submit(&mut self, sqe: Sqe, data: Data, tag: u64) -> Result<u16, HostError> {
        self.submit_inner(sqe, data, tag, false)
    }

    fn submit_inner(&mut self, mut sqe: Sqe, data: Data, tag: u64, force_in_capsule: bool) -> Result<u16, HostError> {
        if self.closed {
            return Err(HostError::Closed);
        }
        if !self.ic_done {
            return Err(HostError::Invalid("no ICReq/ICResp exchanged yet"));
        }
        let (dir, buf) = match data {
            Data::None => (Dir::None, Vec::new()),
            Data::ToCtrl(b) => (Dir::H2cR2t, b),
            Data::FromCtrl(b) => (Dir::C2h, b),
        };
        let len = u32::try_from(buf.len()).map_err(|_| HostError::Invalid("a transfer above 4 GiB"))?;
        let dir = match dir {
            Dir::H2cR2t if len == 0 => Dir::None,
            Dir::H2cR2t if force_in_capsule || len <= self.opts.in_capsule_max => Dir::H2cInCapsule,
            Dir::C2h if len == 0 => Dir::None,
            d => d,
        };
        let Some(cid) = self.free.pop() else {
            return Err(HostError::QueueFull(self.slots.len()));
        };
        sqe.cid = U16::new(cid);
        self.last_cid = cid;
        sqe.set_psdt(Sqe::PSDT_SGL_MPTR_CONTIGUOUS);
        let in_capsule = dir == Dir::H2cInCapsule;
        sqe.set_sgl(&if in_capsule {
            SglDescriptor::in_capsule(0, len)
        } else {
            SglDescriptor::transport_data_block(if dir == Dir::None { 0 } else { len })
        });
        let Some(slot) = self.slots.get_mut(usize::from(cid)) else {
            return Err(HostError::Invalid("command id outside the queue"));
        };
        let (h, n) = encode_capsule_cmd(&sqe, if in_capsule { len } else { 0 }, self.hdgst, self.ddgst);
        self.out.extend_from_slice(&h[..n]);
        let mut sent_by = 0;
        if in_capsule {
            sent_by = queue_data(&mut self.out, &buf, self.borrow_min);
            if self.ddgst {
                self.out.extend_from_slice(&crc32c(&buf).to_le_bytes());
            }
        }
        *slot = Slot {
            busy: true,
            tag,
            buf,
            dir,
            len,
            done: if in_capsule { len } else { 0 },
            ddgst_error: false,
            sent_by,
        };
        Ok(cid)
    }

    /// Submits a Read of `nlb` blocks at `slba` into `buf` (its length is the transfer).
    pub fn submit_read(&mut self, nsid: u32, slba: u64, nlb: u32, buf: Vec<u8>, tag: u64) -> Result<u16, HostError> {
        self.submit(sqe::read(nsid, slba, nlb), Data::FromCtrl(buf), tag)
    }

    /// Submits a Write of `nlb` blocks at `slba` from `buf` (its length is the transfer).
    pub fn submit_write(&mut self, nsid: u32, slba: u64, nlb: u32, buf: Vec<u8>, tag: u64) -> Result<u16, HostError> {
        self.submit(sqe::write(nsid, slba, nlb), Data::ToCtrl(buf), tag)
    }

    // ------------------------------------------------------------------ completion

    /// Sends what is queued, reads what arrived, answers R2Ts with H2CData (split at
    /// MAXH2CDATA), and calls `f` for every completed command. Returns the number of
    /// completions; with `wait` it blocks up to that long for at least one (returning 0 at
    /// the deadline), without it it never blocks (busy polling).
    pub fn poll_completions<F: FnMut(Completion)>(
        &mut self,
        wait: Option<Duration>,
        mut f: F,
    ) -> Result<usize, HostError> {
        let deadline = wait.map(|w| Instant::now() + w);
        let mut n = 0;
        while let Some(c) = self.stash.pop_front() {
            f(c);
            n += 1;
        }
        loop {
            self.send_some()?;
            n += self.process(&mut f)?;
            if n > 0 {
                self.send_some()?;
                return Ok(n);
            }
            if self.fill_in_place()? {
                continue;
            }
            let Some(d) = deadline else { return Ok(0) };
            if Instant::now() >= d {
                return Ok(0);
            }
            let pending = self.queued_bytes() > 0;
            self.wait_fd(d, true, pending)?;
        }
    }

    /// Waits for command `cid`, keeping other completions for the next poll.
    fn wait_for(&mut self, cid: u16) -> Result<Completion, HostError> {
        let start = Instant::now();
        let deadline = start + self.opts.timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(HostError::Timeout {
                    waited: start.elapsed(),
                    what: "a command completion",
                });
            }
            let mut found = None;
            let mut stash = std::mem::take(&mut self.stash);
            let r = self.poll_completions(Some(left), |c| {
                if c.cid == cid && found.is_none() {
                    found = Some(c);
                } else {
                    stash.push_back(c);
                }
            });
            self.stash = stash;
            r?;
            if let Some(c) = found {
                return Ok(c);
            }
        }
    }

    /// Submits one command and waits for its completion, whatever its status.
    pub fn exec(&mut self, sqe: Sqe, data: Data) -> Result<Completion, HostError> {
        let cid = self.submit(sqe, data, 0)?;
        self.wait_for(cid)
    }

    /// Run `sqe` with `data` in-capsule whatever its length (fabrics commands: Connect,
    /// Authentication Send); the completion whatever its status.
    pub fn exec_in_capsule(&mut self, sqe: Sqe, data: Vec<u8>) -> Result<Completion, HostError> {
        let cid = self.submit_inner(sqe, Data::ToCtrl(data), 0, true)?;
        self.wait_for(cid)
    }

    /// Like [`HostQueue::exec`], but an error status is [`HostError::Command`].
    pub fn exec_ok(&mut self, sqe: Sqe, data: Data) -> Result<Completion, HostError> {
        let opcode = sqe.opcode;
        let c = self.exec(sqe, data)?;
        if c.is_success() {
            Ok(c)
        } else {
            Err(HostError::Command {
                opcode,
                status: c.status,
                dw0: c.dw0,
            })
        }
    }

    /// Reads `nlb` blocks at `slba` into `out` (blocking; `out.len()` is the transfer).
    pub fn read(&mut self, nsid: u32, slba: u64, nlb: u32, out: &mut [u8]) -> Result<(), HostError> {
        let mut buf = std::mem::take(&mut self.scratch);
        buf.clear();
        buf.resize(out.len(), 0);
        let c = self.exec_ok(sqe::read(nsid, slba, nlb), Data::FromCtrl(buf))?;
        if c.transferred as usize != out.len() {
            return Err(HostError::Protocol(format!(
                "read of {} bytes completed after {} bytes of data",
                out.len(),
                c.transferred
            )));
        }
        out.copy_from_slice(&c.buf);
        self.scratch = c.buf;
        Ok(())
    }

    /// Writes `data` as `nlb` blocks at `slba` (blocking).
    pub fn write(&mut self, nsid: u32, slba: u64, nlb: u32, data: &[u8]) -> Result<(), HostError> {
        let mut buf = std::mem::take(&mut self.scratch);
        buf.clear();
        buf.extend_from_slice(data);
        let c = self.exec_ok(sqe::write(nsid, slba, nlb), Data::ToCtrl(buf))?;
        self.scratch = c.buf;
        Ok(())
    }

    /// Flush (blocking).
    pub fn flush(&mut self, nsid: u32) -> Result<(), HostError> {
        self.exec_ok(sqe::flush(nsid), Data::None).map(drop)
    }

    /// Write Zeroes of `nlb` blocks at `slba` (blocking).
    pub fn write_zeroes(&mut self, nsid: u32, slba: u64, nlb: u32) -> Result<(), HostError> {
        self.exec_ok(sqe::write_zeroes(nsid, slba, nlb), Data::None).map(drop)
    }

    /// Dataset Management over `ranges` (1..=256) with CDW11 `attributes` (blocking).
    pub fn dataset_management(&mut self, nsid: u32, ranges: &[DsmRange], attributes: u32) -> Result<(), HostError> {
        if ranges.is_empty() || ranges.len() > 256 {
            return Err(HostError::Invalid("Dataset Management takes 1 to 256 ranges"));
        }
        let data: Vec<u8> = ranges.iter().flat_map(|r| r.to_bytes()).collect();
        self.exec_ok(sqe::dsm(nsid, ranges.len() as u32, attributes), Data::ToCtrl(data))
            .map(drop)
    }

    /// Fabrics Disconnect of this I/O queue (NVMe-oF 1.1 §6.4), then close.
    pub fn disconnect(mut self) -> Result<(), HostError> {
        self.exec_ok(sqe::disconnect(), Data::None)?;
        self.close();
        Ok(())
    }
}
