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

use std::collections::VecDeque;
use std::convert::Infallible;
use std::io::ErrorKind;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use pollux_nvme::spec::{SglDescriptor, Sqe, Status};
use pollux_nvme::tcp::{
    CommonHeader, DataHdr, Direction, Frame, FrameError, FrameErrorKind, Framed, PduHeader, PduLimits, PduType, Recv,
    RxBuf, TermReqHdr, check_data_digest, crc32c, encode_c2h_data_hdr, encode_capsule_cmd, encode_h2c_data_hdr,
    encode_ic_req, next_frame, parse_pdu_header,
};
use zerocopy::FromBytes;
use zerocopy::little_endian::U16;

use super::error::HostError;
use super::sqe::{self, DsmRange};
use crate::tcp::sendq::SendQueue;

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
}

/// The header at the front of `bytes` if it is, to the byte, the one C2HData PDU a target
/// sends for command `cid`'s read of `len` bytes (NVMe/TCP §3.6.2.8: LAST_PDU, with or
/// without SUCCESS, data right after the header, DDGSTF as negotiated, no header digest).
/// Comparing with those 24 bytes is a tenth of the instructions of a field-by-field parse,
/// and accepts nothing that the parse would refuse; any other header takes the parse.
pub(super) fn expected_c2h(bytes: &[u8], cid: u16, len: u32, ddgst: bool) -> Option<PduHeader> {
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
    /// Opens the TCP connection only (raw mode): no ICReq yet.
    pub fn tcp(addr: SocketAddr, opts: QueueOpts) -> Result<Self, HostError> {
        let sock = TcpStream::connect_timeout(&addr, opts.timeout)?;
        sock.set_nodelay(true)?;
        sock.set_nonblocking(true)?;
        let entries = usize::from(opts.sqsize) + 1;
        Ok(Self {
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
            opts,
        })
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
        Ok(q)
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

    // ------------------------------------------------------------------ connection set-up

    /// ICReq/ICResp (NVMe/TCP 1.0 §3.6.2.2-3): asks for the digests of the options, HPDA 0,
    /// MAXR2T 0 (as Linux), and refuses an ICResp that Linux would refuse: PLEN not 128,
    /// PFV not 0, digests other than requested, CPDA not 0, MAXH2CDATA below 4096 or not a
    /// multiple of 4.
    pub fn initialize(&mut self) -> Result<IcInfo, HostError> {
        if self.ic_done {
            return Err(HostError::Invalid("ICReq/ICResp already exchanged"));
        }
        let req = encode_ic_req(self.opts.hdgst, self.opts.ddgst, 0, 0);
        self.send_raw(&req)?;
        let timeout = self.opts.timeout;
        let reply = match self.recv_raw(timeout) {
            Err(HostError::Timeout { waited, .. }) => {
                return Err(HostError::Timeout { waited, what: "ICResp" });
            }
            r => r?,
        };
        let (hdr, bytes) = match reply {
            RawReply::Pdu { hdr, bytes } => (hdr, bytes),
            RawReply::TermReq { fes, fei, .. } => {
                self.closed = true;
                return Err(HostError::TermReq { fes, fei });
            }
            RawReply::Eof => {
                self.closed = true;
                return Err(HostError::Closed);
            }
            RawReply::Garbage(b) => {
                self.closed = true;
                return Err(HostError::IcResp(format!("not a PDU: {:02x?}", &b[..b.len().min(16)])));
            }
        };
        let fail = |q: &mut Self, why: String| {
            q.closed = true;
            Err(HostError::IcResp(why))
        };
        let ty = bytes.first().copied().unwrap_or_default();
        if ty != PduType::IcResp as u8 {
            return fail(self, format!("PDU type {ty:#04x} instead of ICResp"));
        }
        if bytes.len() != 128 {
            return fail(self, format!("PLEN {} instead of 128", bytes.len()));
        }
        let Some(PduHeader::IcResp(ic)) = hdr else {
            // Re-parse for the precise reason.
            let why = match CommonHeader::read_from_prefix(&bytes) {
                Ok((ch, _)) => parse_pdu_header(&ch, &bytes, &PduLimits::default(), Direction::ControllerToHost)
                    .err()
                    .map_or_else(|| "invalid ICResp".to_string(), |e| e.to_string()),
                Err(_) => "short ICResp".to_string(),
            };
            return fail(self, why);
        };
        if ic.pfv.get() != 0 {
            return fail(self, format!("PFV {}", ic.pfv.get()));
        }
        if ic.hdgst() != self.opts.hdgst || ic.ddgst() != self.opts.ddgst {
            return fail(
                self,
                format!(
                    "digests {:#x}, requested header {} data {}",
                    ic.dgst, self.opts.hdgst, self.opts.ddgst
                ),
            );
        }
        if ic.cpda != 0 {
            return fail(self, format!("CPDA {} (only 0 is supported)", ic.cpda));
        }
        let m = ic.maxh2cdata.get();
        if m < 4096 || !m.is_multiple_of(4) {
            return fail(self, format!("MAXH2CDATA {m}"));
        }
        self.hdgst = ic.hdgst();
        self.ddgst = ic.ddgst();
        self.maxh2cdata = m;
        self.ic_done = true;
        Ok(self.ic_info())
    }

    /// Fabrics Connect (NVMe-oF 1.1 §6.3) with the options' QID, SQSIZE, CATTR, KATO,
    /// HOSTID, CNTLID, SUBNQN and HOSTNQN; the Connect data goes in-capsule. Returns the
    /// status and dw0 whatever they are; on success the controller id is remembered.
    pub fn fabrics_connect(&mut self) -> Result<ConnectResult, HostError> {
        let o = &self.opts;
        let sqe = sqe::connect(o.qid, o.sqsize, o.cattr, o.kato_ms);
        let data = sqe::connect_data(&o.hostid, o.cntlid, &o.subnqn, &o.hostnqn);
        debug_assert_eq!(data.len(), CONNECT_DATA_LEN);
        let cid = self.submit_inner(sqe, Data::ToCtrl(data.to_vec()), 0, true)?;
        let c = self.wait_for(cid)?;
        if c.status.is_success() {
            self.cntlid = c.dw0 as u16;
        }
        Ok(ConnectResult {
            status: c.status,
            dw0: c.dw0,
        })
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
            sent_by = queue_data(&mut self.out, &buf);
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
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
        Ok(())
    }

    // ------------------------------------------------------------------ receive path

    /// Handles the complete PDUs in the receive buffer; returns the completions delivered.
    fn process<F: FnMut(Completion)>(&mut self, f: &mut F) -> Result<usize, HostError> {
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
                    slot.sent_by = slot.sent_by.max(queue_data(&mut self.out, data));
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

    /// One non-blocking read into the receive buffer. Ok(false) if nothing was there.
    fn fill(&mut self) -> Result<bool, HostError> {
        if self.closed {
            return Err(HostError::Closed);
        }
        self.rx.make_room(self.need.max(8));
        let r = self.rx.recv(&self.sock);
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
    fn fill_in_place(&mut self) -> Result<bool, HostError> {
        let hl = C2H_HLEN + if self.hdgst { 4 } else { 0 };
        let cid = self.last_cid;
        let lone = self.rx.is_empty() && self.landed.is_none() && self.in_flight() == 1 && !self.closed;
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

    // ------------------------------------------------------------------ send path

    /// Writes what the socket takes now, without blocking.
    fn send_some(&mut self) -> Result<(), HostError> {
        if self.out.pending() == 0 && self.parked.is_empty() {
            return Ok(());
        }
        if let Err(e) = self.out.flush(self.sock.as_raw_fd()) {
            self.closed = true;
            return Err(match e.kind() {
                ErrorKind::WriteZero => HostError::Closed,
                _ => io_err(e),
            });
        }
        if !self.parked.is_empty() {
            let sent = self.out.sent_total();
            self.parked.retain(|&(by, _)| by > sent);
        }
        Ok(())
    }

    /// Bytes queued for the socket and not yet taken by it.
    pub fn queued_bytes(&self) -> usize {
        self.out.pending()
    }

    /// Sends everything queued, waiting for the socket up to the timeout.
    pub fn send_pending(&mut self) -> Result<(), HostError> {
        let start = Instant::now();
        let deadline = start + self.opts.timeout;
        loop {
            self.send_some()?;
            if self.queued_bytes() == 0 {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(HostError::Timeout {
                    waited: start.elapsed(),
                    what: "the socket to take our data",
                });
            }
            self.wait_fd(deadline, false, true)?;
        }
    }

    /// Waits until the socket is readable (`read`) or writable (`write`), or `deadline`.
    fn wait_fd(&self, deadline: Instant, read: bool, write: bool) -> Result<(), HostError> {
        let left = deadline.saturating_duration_since(Instant::now());
        let ms = left.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
        let mut events = 0;
        if read {
            events |= libc::POLLIN;
        }
        if write {
            events |= libc::POLLOUT;
        }
        let mut pfd = libc::pollfd {
            fd: self.sock.as_raw_fd(),
            events,
            revents: 0,
        };
        // SAFETY: `pfd` is a valid pollfd that lives on the stack for the whole call and the
        // count passed is 1; poll only writes its `revents`.
        let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
        if rc < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != ErrorKind::Interrupted {
                return Err(HostError::Io(e));
            }
        }
        Ok(())
    }

    // ------------------------------------------------------------------ raw mode

    /// Sends `bytes` as they are (after anything already queued), waiting up to the timeout.
    pub fn send_raw(&mut self, bytes: &[u8]) -> Result<(), HostError> {
        if self.closed {
            return Err(HostError::Closed);
        }
        self.out.extend_from_slice(bytes);
        self.send_pending()
    }

    /// Reads the next PDU whole, whatever it is, waiting up to `timeout`: a PDU (parsed when
    /// valid), a C2HTermReq, bytes that are no PDU, or EOF. Nothing is dispatched: commands
    /// in flight are not completed by what this returns.
    pub fn recv_raw(&mut self, timeout: Duration) -> Result<RawReply, HostError> {
        let start = Instant::now();
        let deadline = start + timeout;
        loop {
            let avail = self.rx.avail();
            if let Some(ch8) = avail.first_chunk::<8>() {
                let Ok(ch) = CommonHeader::read_from_bytes(ch8) else {
                    return Err(HostError::Invalid("common header"));
                };
                let plen = ch.plen.get();
                if CommonHeader::parse(ch8).is_err() || plen > MAX_RAW_PLEN {
                    let bytes = avail.to_vec();
                    self.rx.clear();
                    self.need = 8;
                    return Ok(RawReply::Garbage(bytes));
                }
                let plen = plen as usize;
                self.need = plen;
                if avail.len() >= plen {
                    let bytes = avail[..plen].to_vec();
                    self.rx.consume(plen);
                    self.need = 8;
                    return Ok(self.raw_reply(&ch, bytes));
                }
            }
            match self.fill() {
                Ok(true) => continue,
                Ok(false) => {}
                Err(HostError::Closed) => return Ok(RawReply::Eof),
                Err(e) => return Err(e),
            }
            if Instant::now() >= deadline {
                return Err(HostError::Timeout {
                    waited: start.elapsed(),
                    what: "a PDU",
                });
            }
            self.wait_fd(deadline, true, false)?;
        }
    }

    fn raw_reply(&self, ch: &CommonHeader, bytes: Vec<u8>) -> RawReply {
        if ch.pdu_type == PduType::C2HTermReq as u8
            && let Ok((t, rest)) = TermReqHdr::read_from_prefix(&bytes)
        {
            return RawReply::TermReq {
                fes: t.fes.get(),
                fei: t.fei.get(),
                offending: rest.to_vec(),
            };
        }
        let limits = PduLimits {
            max_data: u32::MAX,
            ..self.limits()
        };
        let hl = ch.header_len(&limits);
        let hdr = bytes
            .get(..hl)
            .and_then(|h| parse_pdu_header(ch, h, &limits, Direction::ControllerToHost).ok());
        RawReply::Pdu { hdr, bytes }
    }

    /// A whole CapsuleCmd PDU for `sqe` with `data` in-capsule, digests as negotiated (for
    /// raw tests; CID, PSDT and SGL are taken as they are in `sqe`).
    pub fn capsule_pdu(&self, sqe: &Sqe, data: &[u8]) -> Vec<u8> {
        let (h, n) = encode_capsule_cmd(sqe, data.len() as u32, self.hdgst, self.ddgst);
        let mut v = h[..n].to_vec();
        v.extend_from_slice(data);
        if self.ddgst && !data.is_empty() {
            v.extend_from_slice(&crc32c(data).to_le_bytes());
        }
        v
    }

    /// A whole H2CData PDU, digests as negotiated (for raw tests).
    pub fn h2c_data_pdu(&self, cccid: u16, ttag: u16, datao: u32, data: &[u8], last: bool) -> Vec<u8> {
        let (h, n) = encode_h2c_data_hdr(cccid, ttag, datao, data.len() as u32, last, self.hdgst, self.ddgst);
        let mut v = h[..n].to_vec();
        v.extend_from_slice(data);
        if self.ddgst {
            v.extend_from_slice(&crc32c(data).to_le_bytes());
        }
        v
    }

    /// Closes the connection now (both directions), like a host that goes away.
    pub fn close(&mut self) {
        self.closed = true;
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }
}

/// Queues `data` for sending: in place when it is long enough to be worth an iovec, else
/// copied. Returns the stream position its last byte is sent by (0 when copied).
fn queue_data(out: &mut SendQueue, data: &[u8]) -> u64 {
    if data.len() < BORROW_MIN {
        out.extend_from_slice(data);
        return 0;
    }
    // SAFETY: `data` is (part of) the buffer of a command in flight, held in its slot, which
    // nothing resizes or writes while the command is in flight; when the command completes,
    // `complete` parks the buffer until `sent_total` passes the position returned here, and
    // a dropped `HostQueue` drops its send queue unflushed.
    unsafe { out.push_borrowed(NonNull::from(data).cast(), data.len()) }
}
