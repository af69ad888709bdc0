//! What an NVMe-oF queue asks of the transport that carries it (SPDK:
//! `spdk_nvmf_transport_ops`; NVMe-oF 1.1 §2.4: a transport binding moves capsules and
//! data). The queue ([`super::Queue`]) decides what a command does and how it ends; the
//! transport frames and moves the bytes: NVMe/TCP ([`crate::tcp`]) is one. A second
//! transport implements this trait and nothing else: its [`Transport::run`] receives
//! capsules and data and hands them to the queue's entry points ([`super::Queue::on_capsule`],
//! [`super::Queue::data_received`]), and the queue calls back for everything it sends.

use std::any::Any;
use std::net::SocketAddr;
use std::ptr::NonNull;
use std::sync::Arc;

use pollux_nvme::spec::Cqe;
use pollux_nvme::tls::PskIdentity;
use pollux_reactor::{Progress, Reactor, SourceId};

use super::Queue;
use crate::backend::ReadData;
use crate::close::CloseReason;
use crate::subsystem::Namespace;

/// A successful read's data as the queue hands it to its transport: bytes to copy where the
/// transport frames them ([`Self::append_to`]), or, when they lie in memory that is never
/// written, where they lie and what keeps them there ([`Self::fixed`]), to be sent without
/// a copy.
pub struct ReadBytes<'a> {
    data: ReadData<'a>,
    len: u32,
    /// Keeps in-memory bytes mapped.
    keep: &'a Arc<Namespace>,
}

impl<'a> ReadBytes<'a> {
    /// The first `len` bytes of `data`, a read of the namespace `keep`.
    #[inline(always)]
    pub(crate) fn new(data: ReadData<'a>, len: u32, keep: &'a Arc<Namespace>) -> Self {
        Self { data, len, keep }
    }

    /// The bytes to send.
    #[inline(always)]
    pub fn len(&self) -> u32 {
        self.len
    }

    /// No bytes.
    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Append a copy of the bytes to `out` (block-atomically for a RAM namespace: a write
    /// after this cannot reach the copy).
    #[inline(always)]
    pub fn append_to(&self, out: &mut Vec<u8>) {
        self.data.append_to(self.len as usize, out);
    }

    /// The bytes in place, when they lie in memory that is never written (the null
    /// backend's zeroes): a transport may hand them to the network from where they are.
    /// Memory that is written (a RAM disk) is never offered: a write could change it under a
    /// send still queued.
    #[inline(always)]
    pub fn fixed(&self) -> Option<FixedBytes> {
        match self.data {
            ReadData::Ram(mem, off) if mem.sends_in_place() => Some(FixedBytes {
                base: mem.range_ptr(off, self.len as usize),
                len: self.len as usize,
                keep: self.keep.clone(),
            }),
            _ => None,
        }
    }
}

/// Read data that never changes, where it lies: `len` bytes at `base`, mapped and readable
/// as long as `keep` lives. Only [`ReadBytes::fixed`] makes one (a transport that sends the
/// bytes in place relies on that).
pub struct FixedBytes {
    base: NonNull<u8>,
    len: usize,
    keep: Arc<dyn Any + Send + Sync>,
}

impl FixedBytes {
    /// The first byte.
    #[inline(always)]
    pub fn base(&self) -> NonNull<u8> {
        self.base
    }

    /// How many bytes.
    #[inline(always)]
    pub fn len(&self) -> usize {
        self.len
    }

    /// No bytes.
    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// What keeps the memory mapped: hold it until the bytes are sent.
    #[inline(always)]
    pub fn keep(&self) -> &Arc<dyn Any + Send + Sync> {
        &self.keep
    }
}

/// One queue's transport.
pub trait Transport: Sized + 'static {
    /// The reactor source's name (logs, the stall detector).
    const NAME: &'static str;

    /// Receive and hand to `q` what arrived (capsules, data); flush what `q` queued. The
    /// reactor source's body: a transport owns its receive loop.
    fn run(q: &mut Queue<Self>, r: &mut Reactor, id: SourceId) -> Progress;

    /// The host's address (logs).
    fn peer(&self) -> SocketAddr;
    /// The address of ours the host reached (Identify's and the discovery log's view of it).
    fn local(&self) -> SocketAddr;
    /// The TLS PSK identity the channel was secured with (None: not secured).
    fn tls_identity(&self) -> Option<&PskIdentity>;
    /// The transport's part of setting up the connection not done yet (a TLS handshake, an
    /// ICReq): what it is, for the log, and the reason to close with when its deadline came.
    fn setup_pending(&self) -> Option<(&'static str, CloseReason)>;

    /// Queue a completion (a CapsuleResp).
    fn send_completion(&mut self, cqe: &Cqe);
    /// Queue data for the host of command `cid` (what a controller-to-host command returns).
    fn send_data(&mut self, cid: u16, data: &[u8]);
    /// Queue a successful read's data for command `cid`. `fold`: the completion would say
    /// nothing but success (SQ flow control is off, so it carries no SQ head), and the
    /// transport may say that with the data instead of a completion of its own. True when it
    /// did: the queue then sends no completion for the command.
    fn send_read(&mut self, cid: u16, data: ReadBytes<'_>, fold: bool) -> bool;
    /// Ask the host for command `cid`'s `len` bytes of data (NVMe/TCP: an R2T). The transport
    /// puts them into the buffer of the request in slot `tag` (`Queue::reqs`), each byte once
    /// and in order from offset 0, and tells [`super::Queue::data_received`] as they come.
    fn fetch_data(&mut self, cid: u16, tag: u16, len: u32);
    /// Where the last thing queued ends in the transport's stream, and how much of the stream
    /// went out: completions whose end went out are the host's to see (SQ accounting).
    fn stream_end(&self) -> u64;
    /// Bytes of the stream handed to the network so far (see [`Self::stream_end`]).
    fn sent_total(&self) -> u64;
    /// Hand what is queued to the network (as much as it takes).
    fn flush(&mut self) -> std::io::Result<()>;
    /// Tell the host the connection ends for `why`, a fault of the protocol (NVMe/TCP: a
    /// C2HTermReq), before [`Self::close`].
    fn terminate(&mut self, why: &CloseReason);
    /// Send what is queued (best effort) and end the connection (its buffers go back to
    /// their pools as they drop).
    fn close(&mut self);

    /// A hot upgrade: why this connection cannot be handed to another process, if it cannot
    /// (NVMe/TCP: TLS keys live in this process's OpenSSL), for the log.
    fn stays(&self) -> Option<&'static str>;
    /// A hot upgrade: what is still under way in the transport (bytes not yet sent, a PDU's
    /// data being received in place), if anything: the queue is not at a boundary yet.
    fn busy(&self) -> Option<&'static str>;
}
