//! pollux's block store: the layer every namespace backend lives in, below the target and
//! knowing nothing of NVMe-oF (no controller, subsystem, queue nor transport: byte-addressed
//! operations on a store, completed with an NVMe status). It depends on `pollux_nvme` (the
//! status codes, the SMART / Health page, the userspace NVMe driver behind [`nvme`]),
//! `pollux_reactor` (the reactors its channels run on) and `pollux_conf` (a namespace's
//! backend table, which [`open`] reads); never on the target, which re-exports it as its
//! `backend` module. Being a crate of its own, the compiler checks that no backend names
//! anything of the target: what a store needs of a namespace it is given ([`ChannelNs`]).
//!
//! Namespace backends behind one interface (SPDK: a bdev and its per-thread io_channel).
//!
//! A [`Backend`] is a namespace's data store, shared by every reactor: RAM ([`ram`]), a
//! simulated SSD ([`sim`]), a file or block device through io_uring ([`file`](mod@file)), a
//! namespace of a local NVMe SSD through pollux's userspace driver ([`nvme`]), a Ceph RBD
//! image through librbd ([`rbd`]), or none at all ([`null`]: writes discarded, reads
//! zeroes). A backend that completes commands asynchronously opens one [`Channel`] per
//! reactor (for an SSD its own queue pair, for a file its own io_uring): the channel takes
//! typed operations ([`BlockOp`]), completes each with one [`Completion`] type through the
//! function its reactor gave it, and tells the reactor when its next completion is due
//! (hybrid sleep) and which fd raises it (interrupt mode). RAM completes inline and has no
//! channel.
//!
//! Beside the backends, what they use and the target's layers share with them: [`error`]
//! (the store's one error type, [`StoreError`], which the target wraps whole), [`bell`] (the
//! bell a store rings when it may have changed size, [`SIZE_BELL`], and the threads that wait
//! on bells), [`counter`] (one-writer counters), [`pool`] (reactor-local buffer pools) with
//! [`dma`] (a channel's DMA buffers), [`region`] (the shared memory of a RAM namespace,
//! which a simulated SSD and a null namespace use too, committed ahead of time by the
//! prefault service, `prefault`), [`stripes`] (the sequence counters that keep a RAM block
//! whole) and [`cluster`] (the object a store's cluster keeps reservations in).
//!
//! Adding a backend: a file here implementing [`Backend`] (and [`Channel`] if it is
//! asynchronous), and its line in [`open`]. Nothing else names a backend type.

pub mod bell;
pub mod cluster;
pub mod counter;
pub mod dma;
pub mod error;
pub mod file;
pub mod null;
pub mod nvme;
pub mod pool;
mod prefault;
pub mod ram;
pub mod rbd;
pub mod region;
pub mod sim;
pub mod stripes;

use std::any::Any;
use std::collections::HashMap;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pollux_nvme::pci::DmaBuf;
use pollux_nvme::spec::{Health, Status};
use pollux_reactor::{ChannelKey, LatencyModel, Polling, PollingCell, Progress, Reactor, Source, SourceId, SourceOpts};
use tracing::warn;

use crate::bell::Bell;
pub use dma::{DmaPool, PooledDma};
pub use error::StoreError;
pub use region::RamDisk;

/// Rung (by any store's watch, on the store's own thread) when a store may have changed
/// size: the target's resize watcher (its `resize::watcher`) waits on it.
pub static SIZE_BELL: Bell = Bell::new();

/// Who to tell when a command completes: a connection and the slot of its request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tag {
    /// The connection's source id.
    pub source: SourceId,
    /// The connection's serial (guards against source id reuse).
    pub serial: u64,
    /// Its request slot.
    pub slot: usize,
}

/// One operation on a namespace, in bytes (validated against the namespace by the target's
/// NVM command decoder: in range, a whole number of blocks).
#[derive(Debug)]
pub enum BlockOp<'a> {
    /// Read `len` bytes at `off`.
    Read {
        /// Byte offset.
        off: u64,
        /// Length.
        len: u32,
    },
    /// Write `data` at `off`.
    Write {
        /// Byte offset.
        off: u64,
        /// The data.
        data: WriteData<'a>,
        /// Force unit access: durable when it completes.
        fua: bool,
    },
    /// Write zeroes over `len` bytes at `off`.
    WriteZeroes {
        /// Byte offset.
        off: u64,
        /// Length.
        len: u64,
    },
    /// Deallocate these (offset, length) ranges: they read back as zeroes.
    Deallocate {
        /// The byte ranges, none empty.
        ranges: Vec<(u64, u64)>,
    },
    /// Make completed writes durable (flush a volatile cache).
    Flush,
    /// Compare the `expect.len()` bytes at `off` with `expect` and, only if they are equal,
    /// write `data` (as long) there, atomically for every client of the store (an RBD
    /// image's other gateways included): only to a backend with
    /// [`Caps::compare_and_write`], within one of its units. A miscompare completes with
    /// Compare Failure, the blocks unchanged.
    CompareAndWrite {
        /// Byte offset.
        off: u64,
        /// What the blocks must hold.
        expect: &'a [u8],
        /// What to write then.
        data: &'a [u8],
        /// Force unit access.
        fua: bool,
    },
    /// Copy the (offset, length) source ranges, in order, to `dst`, by the store itself (a
    /// device's own Copy): only to a backend whose [`Caps::copy_offload`] they fit. Every
    /// source is read before the destination is written.
    Copy {
        /// The source byte ranges, none empty.
        ranges: Vec<(u64, u64)>,
        /// Destination byte offset.
        dst: u64,
        /// Force unit access.
        fua: bool,
    },
}

/// Where a write's data is.
#[derive(Debug)]
pub enum WriteData<'a> {
    /// In memory (in-capsule data, or an R2T buffer).
    Bytes(&'a [u8]),
    /// The first `len` bytes of a DMA buffer the data was received into (from
    /// [`Channel::take_buf`] of the channel it is submitted to; back to its pool when dropped).
    Dma {
        /// The buffer.
        buf: PooledDma,
        /// Bytes of data in it.
        len: usize,
    },
}

impl WriteData<'_> {
    /// Bytes of data.
    pub fn len(&self) -> usize {
        match self {
            WriteData::Bytes(b) => b.len(),
            WriteData::Dma { len, .. } => *len,
        }
    }

    /// No data.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Where a completed read's data is.
#[derive(Debug, Clone, Copy)]
pub enum ReadData<'a> {
    /// In memory (a file channel's buffer).
    Bytes(&'a [u8]),
    /// In a DMA buffer (read with volatile accesses only).
    Dma(&'a DmaBuf),
    /// In a RAM (or simulated) namespace's memory, from this byte offset.
    Ram(&'a RamDisk, u64),
}

impl ReadData<'_> {
    /// Bytes available.
    pub fn len(&self) -> usize {
        match self {
            ReadData::Bytes(b) => b.len(),
            ReadData::Dma(d) => d.len(),
            ReadData::Ram(m, off) => m.len().saturating_sub(*off) as usize,
        }
    }

    /// Nothing available.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Append the first `len` bytes to `out`.
    pub fn append_to(&self, len: usize, out: &mut Vec<u8>) {
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

/// A command's completion, as every channel reports it. A read's data comes with it (a
/// file's buffer, an SSD's DMA buffer) or is in the namespace's memory (a simulated SSD:
/// `data` is None).
#[derive(Debug)]
pub struct Completion<'a> {
    /// Whose command.
    pub tag: Tag,
    /// Its status.
    pub status: Status,
    /// A successful read's data, when it is not in the namespace's memory.
    pub data: Option<ReadData<'a>>,
}

/// Called by a channel for every completion, never from within [`Channel::submit`] (the
/// submitting connection is busy then).
pub type CompleteFn = fn(&mut Reactor, Completion<'_>);

/// What a reactor gives a channel it opens.
#[derive(Debug, Clone)]
pub struct ChannelEnv {
    /// The reactor's id.
    pub reactor: usize,
    /// Largest transfer of one command, bytes (buffer sizes).
    pub max_io: u32,
    /// The channel's latency model (kind chosen by the conf).
    pub model: LatencyModel,
    /// The key its estimates go under in the reactor's device load ([`account_completion`]):
    /// its [`Backend::channel_key`], unique on the reactor while the channel lives.
    pub key: ChannelKey,
    /// Where completions go.
    pub complete: CompleteFn,
}

/// What a backend can do beyond read and write (Identify, Flush and Dataset Management
/// semantics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Caps {
    /// Writes may sit in a volatile cache until a Flush (the page cache, a device cache).
    pub volatile_cache: bool,
    /// Its channels lend DMA buffers that write data can be received into
    /// ([`Channel::take_buf`]).
    pub dma_data: bool,
    /// It completes inline ([`Backend::run_inline`]) and keeps its data in
    /// [`Backend::memory`]: a read needs no backend call at all, its data is sent from the
    /// memory (the RAM namespace's QD1 and QD32 read path).
    pub inline_reads: bool,
    /// It copies blocks itself ([`BlockOp::Copy`]: an NVMe device's own Copy), within these
    /// limits; None: a Copy is read and written through pollux.
    pub copy_offload: Option<CopyOffload>,
    /// It compares and writes atomically itself ([`BlockOp::CompareAndWrite`]: an RBD
    /// image's compare-and-write, atomic in the cluster), for a range within one aligned
    /// unit of this many bytes (an RBD object); None, or a range across units: a fused
    /// Compare and Write is read, compared and written by pollux under its range lock,
    /// atomic among this target's hosts only.
    pub compare_and_write: Option<u64>,
}

/// The limits of a backend's own Copy ([`Caps::copy_offload`]), in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CopyOffload {
    /// Most source ranges of one Copy.
    pub max_ranges: u32,
    /// Most bytes of one source range.
    pub max_range_bytes: u64,
    /// Most bytes of one Copy, all ranges together.
    pub max_bytes: u64,
}

impl CopyOffload {
    /// Whether a Copy of these (offset, length) source ranges is within the limits.
    pub fn fits(&self, ranges: &[(u64, u64)]) -> bool {
        let total = ranges.iter().try_fold(0u64, |t, r| t.checked_add(r.1));
        ranges.len() <= self.max_ranges as usize
            && ranges.iter().all(|r| r.1 <= self.max_range_bytes)
            && total.is_some_and(|t| t <= self.max_bytes)
    }
}

/// A namespace's data store, shared by all reactors.
pub trait Backend: Send + Sync + std::fmt::Debug + Any {
    /// "ram", "sim", "file", "nvme", "rbd" or "null" (the conf's name; shown by `pollux ctl`).
    fn kind(&self) -> &'static str;
    /// Size in bytes.
    fn len(&self) -> u64;
    /// Always false: a backend has a size.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// How its commands reach the store, for operators (`pollux ctl`, metrics): "inline",
    /// "simulated", "io_uring", "worker thread", "vfio", "fake controller".
    fn io_path(&self) -> &'static str;
    /// Capabilities.
    fn caps(&self) -> Caps {
        Caps::default()
    }
    /// The block size the store dictates (an NVMe namespace's format), if any.
    fn block_size(&self) -> Option<u32> {
        None
    }
    /// The memory holding the data, for a store whose data reads can be sent in place (RAM,
    /// simulated SSD).
    fn memory(&self) -> Option<&RamDisk> {
        None
    }
    /// The descriptor the target's hot upgrade hands to the next process so that it serves
    /// the same store: a file namespace's open file (its lock goes with it). None: the next
    /// process opens the store itself (RAM memory goes by [`RamDisk::memfd`]).
    fn handover_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }
    /// Where a read at `off` can be sent from without a backend call: the namespace's
    /// memory at that offset (RAM, simulated SSD), or a null namespace's zeroes. None: the
    /// data comes with the read's completion.
    fn read_in_place(&self, off: u64) -> Option<ReadData<'_>> {
        self.memory().map(|m| ReadData::Ram(m, off))
    }
    /// Run `op` now, on the calling reactor, if this store completes inline (RAM): its
    /// status. None: submit it to a channel. With [`Caps::inline_reads`], a read is not
    /// passed here.
    fn run_inline(&self, _op: &BlockOp<'_>) -> Option<Status> {
        None
    }
    /// The key of a namespace's channel on a reactor, given `own`, the key a channel of that
    /// namespace alone has ([`ChannelNs::key`]): one channel per namespace unless namespaces
    /// share a device queue (NVMe: one channel per device). The key is an address that the
    /// channel keeps alive (an `Arc` it holds), so it cannot be reused while the channel
    /// exists.
    fn channel_key(&self, own: usize) -> usize {
        own
    }
    /// Open this reactor's channel on the namespace `ns` (whose backend is `self`).
    fn open_channel(&self, ns: ChannelNs, env: &ChannelEnv) -> Result<Box<dyn Channel>, StoreError>;
    /// The health of the device behind this store, when it has one that reports it: its name
    /// (namespaces of one device share it) and its last SMART / Health page.
    fn device_health(&self) -> Option<(&str, Health)> {
        None
    }
    /// Identifiers the store itself determines (an RBD image: its cluster and image), used
    /// for the namespace in place of those derived from the conf's subsystem and nsid
    /// unless the conf gives them.
    fn ids(&self) -> Option<pollux_conf::DerivedIds> {
        None
    }
    /// The object in the store's cluster that keeps the namespace's reservations for every
    /// gateway (the target's reservations kept in the cluster use it); None: the store has
    /// no cluster, the target keeps them. Blocks on the cluster: called where the namespace
    /// is built.
    fn reservation_object(&self) -> Option<Result<Box<dyn cluster::ClusterObject>, StoreError>> {
        None
    }
    /// Resize the store to `bytes` (`pollux ctl resize-namespace`; blocks on the store, never
    /// called on a reactor). Err: the store cannot be resized (most cannot), or failed.
    fn resize(&self, _bytes: u64) -> Result<(), StoreError> {
        Err(StoreError::ResizeUnsupported { kind: self.kind() })
    }
    /// The store's size now, if something other than pollux may have changed it since the
    /// last call (an RBD image resized by another client); None otherwise. May block on the
    /// store: called on the target's resize watcher's thread.
    fn refresh_size(&self) -> Option<u64> {
        None
    }
    /// Why the store no longer exists, if there is reason to look (its I/O failed as a
    /// deleted store's would, or `cut_off`: the namespace refuses I/O for want of the
    /// store's cluster) and it was deleted under the namespace (an RBD image removed once
    /// this gateway's watch was gone); None otherwise. May block on the store: called on the
    /// resize watcher's thread.
    fn vanished(&self, _cut_off: bool) -> Option<String> {
        None
    }
    /// The reactors have stopped (the target is stopping): let go of the store now rather
    /// than whenever the last namespace reference goes (an NVMe controller is shut down, an
    /// RBD image closed). May block on the store; [`crate::rbd::wait_closed`]
    /// waits for the images.
    fn stop(&self) {}
    /// Starts of this store under pollux and unsafe shutdowns among them, where the store
    /// keeps that record (files).
    fn shutdown_record(&self) -> Option<(u64, u64)> {
        None
    }
    /// As `Any`, for what only one kind has (an NVMe device's view and error injection).
    fn as_any(&self) -> &dyn Any;
}

/// What a channel keeps of the namespace it was opened for: its id (names, logs) and its
/// polling policy (shared with the control plane, which changes it). Not the namespace: a
/// channel depends on its store, not on the subsystem's model.
#[derive(Debug, Clone)]
pub struct ChannelNs {
    /// The namespace's id.
    pub nsid: u32,
    /// Its polling policy.
    pub polling: Arc<PollingCell>,
}

impl ChannelNs {
    /// The key of a channel of this namespace alone: the address of its polling cell, which
    /// the channel keeps alive (see [`Backend::channel_key`]).
    pub fn key(polling: &Arc<PollingCell>) -> usize {
        Arc::as_ptr(polling) as usize
    }
}

/// One reactor's channel on a backend: it alone submits to and reaps from its queue.
pub trait Channel: 'static {
    /// A name for logs and the stall detector.
    fn name(&self) -> &str;
    /// Start `op` on `store`, the backend of the namespace it is for (a channel may serve
    /// several: an NVMe device's queue pair serves each of its namespaces); it completes
    /// through [`ChannelEnv::complete`], never from within this call. Err: refused, nothing
    /// was started.
    fn submit(&mut self, r: &mut Reactor, tag: Tag, store: &dyn Backend, op: BlockOp<'_>) -> Result<(), Status>;
    /// Reap what completed; say when the next completion is expected ([`pollux_reactor::Next`]).
    fn poll(&mut self, r: &mut Reactor) -> Progress;
    /// The fd that becomes readable on a completion (interrupt mode), if the channel has one;
    /// without one it can only be polled.
    fn interrupt_fd(&self) -> Option<RawFd>;
    /// Commands submitted and not yet completed.
    fn outstanding(&self) -> usize;
    /// The polling policy of the namespace(s) it serves ([`pollux_reactor::Polling`]; read
    /// at each run, a relaxed atomic load). A channel shared by several namespaces (an NVMe
    /// device's queue pair) says `auto`: their `always` still holds the reactor from each
    /// command's submission (the target's queue does), but the shared queue's waits are the
    /// mode's.
    fn polling(&self) -> Polling {
        Polling::Auto
    }
    /// Run the channel at least this often while it has work, fd or not (it notices lost
    /// completions and device resets).
    fn watchdog(&self) -> Option<Duration> {
        None
    }
    /// Cancel the command submitted with `tag` (Abort, NVMe 2.0 §5.1), if the store allows:
    /// true when it will complete with Command Aborted Requested (through
    /// [`ChannelEnv::complete`], on a later poll; the caller wakes the channel). False: it
    /// runs to its own completion.
    fn abort(&mut self, _r: &mut Reactor, _tag: Tag) -> bool {
        false
    }
    /// A DMA buffer of at least `len` bytes that a write's data can be received into and
    /// then submitted as [`WriteData::Dma`] (one copy from the socket, none after). None:
    /// the channel has no such memory, or not now. The buffer goes back to the channel's
    /// pool when dropped, whether its write ran or not (freed if the channel is gone).
    fn take_buf(&mut self, _len: usize) -> Option<PooledDma> {
        None
    }
    /// The reactor is stopping: wait (bounded) for what the store still holds buffers of.
    fn shutdown(&mut self) {}
}

/// A channel as a reactor source: the one source type of every backend. It applies the
/// namespace's polling policy to what the channel says after each run (the channels
/// themselves only arm their interrupts by [`Polling::device_wait`]).
pub struct ChannelSource {
    ch: Box<dyn Channel>,
    /// Its key in the reactor's device load.
    key: ChannelKey,
    has_fd: bool,
    /// The device load has it as quiet (`never`).
    quiet: bool,
}

impl Source for ChannelSource {
    fn name(&self) -> &str {
        self.ch.name()
    }

    fn run(&mut self, r: &mut Reactor, _id: SourceId) -> Progress {
        let mut p = self.ch.poll(r);
        let polling = self.ch.polling();
        match polling {
            // Commands in flight (or one just completed): the hold goes on, to a linger
            // after the last.
            Polling::Always if p.did_work || self.ch.outstanding() > 0 => r.hold_poll(),
            _ => {}
        }
        let quiet = polling == Polling::Never;
        if quiet != self.quiet {
            // Only when the setting changed: no work per run.
            r.device_load().set_quiet(self.key, quiet);
            self.quiet = quiet;
        }
        p.next = polling.shape(p.next, r.effective_mode(), self.has_fd);
        p
    }

    fn shutdown(&mut self, _r: &mut Reactor, _id: SourceId) {
        self.ch.shutdown();
    }
}

/// Run channel `id` every `every` while it has work, even with no interrupt.
fn arm_watchdog(r: &mut Reactor, id: SourceId, every: Duration) {
    r.add_timer(Instant::now() + every, move |r| {
        let busy = r.with_source::<ChannelSource, _>(id, |c, _| c.ch.outstanding() > 0);
        if let Some(busy) = busy {
            if busy {
                r.wake(id);
            }
            arm_watchdog(r, id, every);
        }
    });
}

/// A completion seen by channel `key` ([`ChannelEnv::key`]): feed its latency to the model,
/// and the model's estimate for its class to the reactor's load, which keeps one per
/// (channel, class) and gives the adaptive policy their completion-weighted mean.
pub fn account_completion(
    r: &mut Reactor,
    key: ChannelKey,
    model: &mut LatencyModel,
    class: usize,
    took: Duration,
    exact: bool,
) {
    model.observe(class, took, exact);
    r.device_load().complete(key, class, model.estimate(class));
}

/// The end of every channel command, in one place: its latency goes to the channel's model
/// and the reactor's device load ([`account_completion`]), then its completion to its
/// connection through [`ChannelEnv::complete`]. Read data goes only with a success.
pub struct Completer {
    /// The channel's key in the reactor's device load.
    pub key: ChannelKey,
    /// The channel's latency model (its estimates also time the channel's next run).
    pub model: LatencyModel,
    complete: CompleteFn,
}

impl Completer {
    /// The completer of a channel opened with `env`.
    pub fn new(env: &ChannelEnv) -> Self {
        Self {
            key: env.key,
            model: env.model.clone(),
            complete: env.complete,
        }
    }

    /// Command `tag` of latency class `class` ended with `status` after `took` (`exact`: the
    /// reactor was polling closely when it found it): account it and complete it.
    pub fn finish(&mut self, r: &mut Reactor, done: Completion<'_>, class: usize, took: Duration, exact: bool) {
        account_completion(r, self.key, &mut self.model, class, took, exact);
        self.complete(r, done);
    }

    /// Complete `done` without timing it (nothing of it reached the store).
    pub fn complete(&self, r: &mut Reactor, mut done: Completion<'_>) {
        if !done.status.is_success() {
            done.data = None;
        }
        (self.complete)(r, done);
    }
}

/// Per-reactor map from namespace to that reactor's channel on it (a source), opened on
/// first use.
pub struct Channels {
    by_key: HashMap<usize, SourceId>,
    max_io: u32,
    complete: CompleteFn,
}

impl Channels {
    /// No channel yet; channels will size buffers for `max_io` bytes and complete to
    /// `complete`.
    pub fn new(max_io: u32, complete: CompleteFn) -> Self {
        Self {
            by_key: HashMap::new(),
            max_io,
            complete,
        }
    }
}

/// This reactor's channel of key `key` ([`Backend::channel_key`]), if it has opened one.
pub fn existing_channel(r: &mut Reactor, key: usize) -> Option<SourceId> {
    r.local::<Channels>().and_then(|c| c.by_key.get(&key).copied())
}

/// The channel of this reactor of key `key` ([`Backend::channel_key`]) on the namespace
/// `ns` gives (called only to open it) of `store`, opened on first use.
pub fn channel_for(
    r: &mut Reactor,
    store: &dyn Backend,
    key: usize,
    ns: impl FnOnce() -> ChannelNs,
) -> Result<SourceId, Status> {
    let Some(c) = r.local::<Channels>() else {
        warn!(nsid = ns().nsid, "this reactor has no channel registry");
        return Err(Status::INTERNAL_ERROR);
    };
    if let Some(id) = c.by_key.get(&key) {
        return Ok(*id);
    }
    let (max_io, complete) = (c.max_io, c.complete);
    let env = ChannelEnv {
        reactor: r.id(),
        max_io,
        model: LatencyModel::new(r.model_kind()),
        key,
        complete,
    };
    let ns = ns();
    let nsid = ns.nsid;
    let opened = store.open_channel(ns, &env).and_then(|ch| {
        let (fd, watchdog) = (ch.interrupt_fd(), ch.watchdog());
        r.device_load().name_channel(key, ch.name());
        let src = Box::new(ChannelSource {
            ch,
            key,
            has_fd: fd.is_some(),
            quiet: false,
        });
        let id = match fd {
            Some(fd) => r.add_sleepable_source(src, SourceOpts::polled_with_fd(fd)),
            None => {
                warn!(
                    nsid,
                    "a channel without an interrupt fd: it is polled, the reactor cannot sleep on it"
                );
                r.add_source(src, SourceOpts::polled())
            }
        }?;
        if let Some(every) = watchdog {
            arm_watchdog(r, id, every);
        }
        Ok(id)
    });
    let id = opened.map_err(|e| {
        warn!(nsid, error = %e, "cannot open a device channel");
        Status::INTERNAL_ERROR
    })?;
    if let Some(c) = r.local::<Channels>() {
        c.by_key.insert(key, id);
    }
    Ok(id)
}

/// Close every channel of this reactor, giving their stores' resources back (a hot
/// upgrade's old process, whose queues the new one serves now).
pub fn close_channels(r: &mut Reactor) {
    let ids: Vec<SourceId> = r
        .local::<Channels>()
        .map(|c| c.by_key.drain().map(|(_, id)| id).collect())
        .unwrap_or_default();
    for id in ids {
        if let Some(mut src) = r.remove_source(id) {
            src.shutdown(r, id);
        }
    }
}

/// Run `f` on channel `id` of this reactor.
pub fn with_channel<R>(
    r: &mut Reactor,
    id: SourceId,
    f: impl FnOnce(&mut dyn Channel, &mut Reactor) -> R,
) -> Option<R> {
    r.with_source::<ChannelSource, _>(id, |c, r| f(c.ch.as_mut(), r))
}

/// Open a namespace's store as the conf describes it (`reactors`: one queue pair each for an
/// NVMe device). The one place that names the backend kinds.
pub fn open(n: &pollux_conf::Namespace, reactors: usize) -> Result<Box<dyn Backend>, StoreError> {
    use pollux_conf::Backend as Conf;
    Ok(match &n.backend {
        Conf::Ram { size } => {
            Box::new(RamDisk::populated(*size).map_err(|source| StoreError::Ram { bytes: *size, source })?)
        }
        Conf::Sim(sim) => Box::new(sim::SimDisk::open(sim)?),
        Conf::File(f) => Box::new(file::FileDisk::open(&f.path, f.size, f.direct, f.shared, n.block_size)?),
        Conf::Nvme(b) => Box::new(nvme::SsdDevice::open(b, n.block_size, reactors)?),
        Conf::Rbd(b) => Box::new(rbd::RbdDisk::open(b, n.block_size, reactors)?),
        Conf::Null { size } => {
            Box::new(null::NullDisk::new(*size).map_err(|source| StoreError::Ram { bytes: *size, source })?)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::CopyOffload;

    #[test]
    fn a_copy_fits_an_offload_only_within_every_limit() {
        let l = CopyOffload {
            max_ranges: 2,
            max_range_bytes: 4096,
            max_bytes: 6144,
        };
        assert!(l.fits(&[(0, 4096), (8192, 2048)]));
        assert!(!l.fits(&[(0, 512), (512, 512), (1024, 512)]), "ranges");
        assert!(!l.fits(&[(0, 4608)]), "one range");
        assert!(!l.fits(&[(0, 4096), (8192, 4096)]), "in all");
        assert!(!l.fits(&[(0, u64::MAX), (0, u64::MAX)]), "overflow");
    }
}
