//! NVMe SSD namespaces through pollux's userspace driver ([`pollux_nvme::pci`]): the `nvme`
//! backend.
//!
//! Ownership follows the data path, as in SPDK's NVMe bdev:
//! - An [`SsdDevice`] is one controller (a PCI function bound to vfio-pci, or the in-process
//!   fake controller), opened once however many namespaces name it (a registry by name). At
//!   open it is brought up (NVMe base spec 2.0 §3.5.1) and one I/O queue pair is created for
//!   every reactor, each with its own MSI-X vector wired to an eventfd.
//! - Each reactor takes its queue pair into an [`SsdChannel`], a reactor source: it alone
//!   submits and reaps on it, with no lock. The MSI-X eventfd wakes the reactor in interrupt
//!   and hybrid mode; busy-poll reads the completion queue's phase bits. Every completion's
//!   latency feeds the reactor's latency model (hybrid sleeps, the adaptive policy).
//! - The admin queue belongs to a small admin thread per device, off the I/O path: every
//!   100 ms it checks CSTS.CFS and the queues' command timeouts and resets the controller
//!   (§3.7.2) when needed. In-flight commands then complete with Command Aborted By Host
//!   (the host retries them), new ones wait in the channel until their queue is created
//!   again, and a controller that cannot be brought back fails I/O with Namespace Not Ready
//!   rather than hanging hosts.
//! - Data moves through DMA buffers from a per-channel pool (size classes carved from 2 MiB
//!   regions, huge pages when the system has them): written data is copied once from the
//!   receive buffer into the DMA buffer, read data once from the DMA buffer into the send
//!   buffer, both with volatile accesses (the device may write that memory).

use std::collections::{BTreeMap, VecDeque};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, LazyLock, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pollux_conf::{NvmeBackend, NvmeDevice};
use pollux_nvme::pci::fake::{FakeConfig, FakeController, FakeNamespace};
use pollux_nvme::pci::{
    self, Completion as DeviceCompletion, Controller, ControllerConfig, ControllerInfo, DmaAllocator, DmaBuf,
    DmaRegion, IoRequest, QueueError, QueuePair,
};
use pollux_nvme::spec::Status;
use pollux_reactor::{ChannelKey, LatencyModel, Mode, Next, Progress, Reactor};
use serde::Serialize;
use tracing::{error, info, warn};

use super::{
    Backend, BlockOp, Caps, Channel, ChannelEnv, CompleteFn, Completion, ReadData, Tag, WriteData, account_completion,
};
use crate::subsystem::Namespace;

/// Entries per I/O queue (capped by CAP.MQES).
const QUEUE_DEPTH: u16 = 256;
/// How often the admin thread looks at the controller.
const SERVICE_PERIOD: Duration = Duration::from_millis(100);
/// How often a busy channel is run even without an interrupt: it notices lost completions
/// (command timeout) and a controller reset.
const WATCHDOG: Duration = Duration::from_millis(100);
/// Retry period of a reset that failed.
const RETRY_FAILED: Duration = Duration::from_secs(1);
/// DMA memory is allocated in chunks of this size and carved into buffers.
const CHUNK: usize = 2 << 20;
/// Largest transfer of one device command (below MDTS); larger target commands are split.
const MAX_TRANSFER: usize = 1 << 20;
/// Completions within this gap of the previous poll are exact latency samples.
const EXACT_GAP: Duration = Duration::from_micros(5);
/// CDW12 bit 30, Force Unit Access (NVM command set spec §3.2.6).
const FUA: u32 = 1 << 30;
/// CDW12 bit 25, Deallocate, of Write Zeroes (NVM command set spec §3.2.8).
const DEAC: u32 = 1 << 25;
/// ONCS bit 3: Write Zeroes supported.
const ONCS_WRITE_ZEROES: u16 = 1 << 3;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The admin side of a device, shared with its admin thread.
struct Admin {
    name: String,
    ctrl: Mutex<Option<Controller>>,
    fake: Option<FakeController>,
    /// The last reset failed: I/O fails until one succeeds.
    failed: AtomicBool,
    resets: AtomicU64,
    failed_resets: AtomicU64,
    stop: Mutex<bool>,
    wake: Condvar,
}

impl Admin {
    fn run(self: Arc<Self>) {
        let mut last_attempt = Instant::now();
        loop {
            {
                let stop = lock(&self.stop);
                if *stop {
                    return;
                }
                let (stop, _) = self
                    .wake
                    .wait_timeout(stop, SERVICE_PERIOD)
                    .unwrap_or_else(|p| p.into_inner());
                if *stop {
                    return;
                }
            }
            let mut g = lock(&self.ctrl);
            let Some(ctrl) = g.as_mut() else { return };
            let failed = self.failed.load(Ordering::Acquire);
            let res = if failed {
                if last_attempt.elapsed() < RETRY_FAILED {
                    continue;
                }
                last_attempt = Instant::now();
                ctrl.reset().map(|()| true)
            } else {
                ctrl.service().map(|o| o.reset)
            };
            match res {
                Ok(reset) => {
                    if reset {
                        self.resets.fetch_add(1, Ordering::Relaxed);
                        info!(device = %self.name, "controller reset done: I/O queues return as their reactors acknowledge");
                    }
                    if failed {
                        self.failed.store(false, Ordering::Release);
                        info!(device = %self.name, "controller recovered");
                    }
                }
                Err(e) => {
                    self.failed_resets.fetch_add(1, Ordering::Relaxed);
                    if !failed {
                        error!(device = %self.name, error = %e, "controller failed: I/O on its namespaces fails until a reset succeeds (retried every second)");
                    }
                    self.failed.store(true, Ordering::Release);
                    last_attempt = Instant::now();
                }
            }
        }
    }
}

/// One NVMe controller, shared by the namespaces that name it.
pub struct SsdDevice {
    name: String,
    kind: &'static str,
    info: ControllerInfo,
    dma: Arc<dyn DmaAllocator>,
    admin: Arc<Admin>,
    /// The I/O queue pair of each reactor, until it takes it (and back when its channel goes).
    queues: Mutex<Vec<Option<QueuePair>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// DMA memory the channels' data-buffer pools have allocated, bytes. Buffers are
    /// recycled, so it grows with the most data in flight, not with the I/O done: growth
    /// beyond that is a buffer not given back.
    data_dma_bytes: Arc<AtomicU64>,
}

impl std::fmt::Debug for SsdDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SsdDevice")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

/// A namespace of an [`SsdDevice`]: the backend of a target namespace.
#[derive(Debug)]
pub struct SsdNamespace {
    /// The controller.
    pub dev: Arc<SsdDevice>,
    /// The namespace on it.
    pub ns: pci::Namespace,
}

impl Backend for SsdNamespace {
    fn kind(&self) -> &'static str {
        "nvme"
    }

    fn len(&self) -> u64 {
        self.ns.bytes()
    }

    fn caps(&self) -> Caps {
        Caps {
            volatile_cache: self.dev.volatile_write_cache(),
            dma_data: true,
        }
    }

    fn block_size(&self) -> Option<u32> {
        Some(self.ns.block_size() as u32)
    }

    /// The device's namespaces share its queue pair on each reactor: one channel per device.
    fn channel_key(&self, _ns: &Arc<Namespace>) -> usize {
        Arc::as_ptr(&self.dev) as usize
    }

    fn open_channel(&self, _ns: &Arc<Namespace>, env: &ChannelEnv) -> Result<Box<dyn Channel>, String> {
        Ok(Box::new(SsdChannel::new(self.dev.clone(), env)?))
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// Open devices by name (BDF or fake name). Weak: a device lives as long as a namespace or a
/// channel holds it.
static DEVICES: LazyLock<Mutex<BTreeMap<String, Weak<SsdDevice>>>> = LazyLock::new(Mutex::default);

/// What the control socket shows of a device.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DeviceView {
    /// BDF or fake device name.
    pub name: String,
    /// "pci" or "fake".
    pub kind: String,
    /// Model number.
    pub model: String,
    /// Serial number.
    pub serial: String,
    /// Firmware revision.
    pub firmware: String,
    /// Active namespaces: (nsid, blocks, block size).
    pub namespaces: Vec<(u32, u64, usize)>,
    /// I/O queue pairs (one per reactor).
    pub io_queues: u16,
    /// MSI-X vectors wired.
    pub vectors: u16,
    /// Largest transfer per command, bytes.
    pub max_transfer: usize,
    /// Volatile write cache present.
    pub volatile_write_cache: bool,
    /// DMA memory allocated for data buffers, bytes (grows with the data in flight only).
    pub data_dma_bytes: u64,
    /// "ok" or "failed".
    pub state: String,
    /// Controller resets done.
    pub resets: u64,
    /// Reset attempts that failed.
    pub failed_resets: u64,
}

impl SsdDevice {
    /// The device `b` names, opened (and brought up with one queue pair per reactor) unless
    /// another namespace already did; and its namespace `b.nsid`. `block_size` is the conf's
    /// (a fake device's format).
    pub fn open(b: &NvmeBackend, block_size: u32, reactors: usize) -> Result<SsdNamespace, String> {
        let name = b.device.name().to_string();
        let mut devices = lock(&DEVICES);
        let dev = match devices.get(&name).and_then(Weak::upgrade) {
            Some(d) => d,
            None => {
                let d = Arc::new(Self::bring_up(&b.device, b.nsid, block_size, reactors)?);
                devices.insert(name.clone(), Arc::downgrade(&d));
                d
            }
        };
        drop(devices);
        let Some(ns) = dev.info.namespaces.iter().find(|n| n.nsid == b.nsid).copied() else {
            let active: Vec<u32> = dev.info.namespaces.iter().map(|n| n.nsid).collect();
            return Err(format!(
                "NVMe device {name} has no usable namespace {} (active, without metadata: {active:?})",
                b.nsid
            ));
        };
        Ok(SsdNamespace { dev, ns })
    }

    fn bring_up(device: &NvmeDevice, nsid: u32, block_size: u32, reactors: usize) -> Result<Self, String> {
        let reactors = reactors.max(1);
        let want = u16::try_from(reactors).map_err(|_| format!("{reactors} reactors: too many I/O queues"))?;
        let (hw, fake, kind) = match device {
            NvmeDevice::Pci(bdf) => (pci::vfio::open(bdf).map_err(|e| e.to_string())?, None, "pci"),
            NvmeDevice::Fake { name, size, latency_us } => {
                let cfg = FakeConfig {
                    max_io_queues: want.max(1),
                    vectors: want + 1,
                    namespaces: vec![FakeNamespace {
                        nsid,
                        lba_shift: block_size.trailing_zeros() as u8,
                        blocks: size / u64::from(block_size),
                    }],
                    latency: Duration::from_nanos((latency_us * 1000.0) as u64),
                    ..FakeConfig::default()
                };
                let (fake, mut hw) = FakeController::start(cfg);
                hw.name = name.clone();
                (hw, Some(fake), "fake")
            }
        };
        let name = hw.name.clone();
        let dma = hw.dma.clone();
        let cfg = ControllerConfig {
            io_queues: want,
            max_transfer: MAX_TRANSFER,
            interrupts: true,
            ..ControllerConfig::default()
        };
        let mut ctrl = Controller::new(hw, cfg).map_err(|e| e.to_string())?;
        let info = ctrl.info().clone();
        if usize::from(info.io_queues) < reactors {
            return Err(format!(
                "{name}: the controller grants {} I/O queue pairs; pollux needs one per reactor ({reactors})",
                info.io_queues
            ));
        }
        let depth = QUEUE_DEPTH.min(info.cap.mqes().saturating_add(1)).max(2);
        let mut queues = Vec::with_capacity(reactors);
        for _ in 0..reactors {
            queues.push(Some(ctrl.create_io_queue_pair(depth).map_err(|e| e.to_string())?));
        }
        info!(device = %name, model = %info.model, serial = %info.serial, io_queues = reactors, depth,
            vectors = info.vectors, "NVMe device ready: one queue pair per reactor");
        let admin = Arc::new(Admin {
            name: name.clone(),
            ctrl: Mutex::new(Some(ctrl)),
            fake,
            failed: AtomicBool::new(false),
            resets: AtomicU64::new(0),
            failed_resets: AtomicU64::new(0),
            stop: Mutex::new(false),
            wake: Condvar::new(),
        });
        let a = admin.clone();
        let thread = std::thread::Builder::new()
            .name(format!("nvme-admin-{}", short(&name)))
            .spawn(move || a.run())
            .map_err(|e| format!("{name}: cannot start the admin thread: {e}"))?;
        Ok(Self {
            name,
            kind,
            info,
            dma,
            admin,
            queues: Mutex::new(queues),
            thread: Mutex::new(Some(thread)),
            data_dma_bytes: Arc::new(AtomicU64::new(0)),
        })
    }

    /// BDF or fake name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Identify data of the controller.
    pub fn info(&self) -> &ControllerInfo {
        &self.info
    }

    /// Writes may sit in the device's volatile cache until a Flush.
    pub fn volatile_write_cache(&self) -> bool {
        self.info.volatile_write_cache
    }

    fn failed(&self) -> bool {
        self.admin.failed.load(Ordering::Acquire)
    }

    /// For the control socket.
    pub fn view(&self) -> DeviceView {
        DeviceView {
            name: self.name.clone(),
            kind: self.kind.into(),
            model: self.info.model.clone(),
            serial: self.info.serial.clone(),
            firmware: self.info.firmware.clone(),
            namespaces: self
                .info
                .namespaces
                .iter()
                .map(|n| (n.nsid, n.blocks, n.block_size()))
                .collect(),
            io_queues: self.info.io_queues,
            vectors: self.info.vectors,
            max_transfer: self.info.max_transfer,
            volatile_write_cache: self.info.volatile_write_cache,
            data_dma_bytes: self.data_dma_bytes.load(Ordering::Relaxed),
            state: if self.failed() { "failed" } else { "ok" }.into(),
            resets: self.admin.resets.load(Ordering::Relaxed),
            failed_resets: self.admin.failed_resets.load(Ordering::Relaxed),
        }
    }

    /// Injects a fault into a fake device: `cfs` (controller fatal status: the admin thread
    /// resets it), `lose` (the next `count` completions are never posted: the command timeout
    /// resets it), `fail` (the next `count` I/O commands fail with `status`).
    pub fn inject(&self, kind: &str, count: u32, status: Status) -> Result<(), String> {
        let Some(fake) = &self.admin.fake else {
            return Err(format!(
                "{} is a PCI device: faults can be injected into fake devices only",
                self.name
            ));
        };
        match kind {
            "cfs" => fake.inject_cfs(),
            "lose" => fake.lose_completions(count),
            "fail" => fake.fail_io(count, status),
            other => return Err(format!("unknown fault {other:?}: cfs, lose or fail")),
        }
        warn!(device = %self.name, fault = kind, count, "fault injected");
        Ok(())
    }

    /// Stops the admin thread and shuts the controller down (§3.6.1: queues deleted, CC.SHN,
    /// CSTS.SHST). Idempotent; also done on drop.
    pub fn shutdown(&self) {
        *lock(&self.admin.stop) = true;
        self.admin.wake.notify_all();
        if let Some(t) = lock(&self.thread).take() {
            let _ = t.join();
        }
        // Queue pairs not taken by a reactor go first: the controller deletes them.
        lock(&self.queues).clear();
        if let Some(ctrl) = lock(&self.admin.ctrl).take() {
            match ctrl.shutdown() {
                Ok(()) => info!(device = %self.name, "NVMe controller shut down"),
                Err(e) => warn!(device = %self.name, error = %e, "NVMe controller shutdown"),
            }
        }
    }
}

impl Drop for SsdDevice {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A device name without the usual `0000:` domain, for thread and source names (Linux cuts
/// thread names at 15 bytes: more of the BDF shows).
fn short(name: &str) -> &str {
    name.strip_prefix("0000:").unwrap_or(name)
}

/// DMA buffers of one channel: power-of-two size classes from 4 KiB, carved from 2 MiB
/// regions and recycled, so the steady state allocates (and maps) nothing.
struct Pool {
    dma: Arc<dyn DmaAllocator>,
    free: Vec<Vec<DmaBuf>>,
    chunk: Option<Arc<DmaRegion>>,
    used: usize,
    zeroes: Option<DmaBuf>,
    /// The device's [`SsdDevice::data_dma_bytes`].
    allocated: Arc<AtomicU64>,
}

impl Pool {
    fn new(dma: Arc<dyn DmaAllocator>, allocated: Arc<AtomicU64>) -> Self {
        Self {
            dma,
            allocated,
            free: Vec::new(),
            chunk: None,
            used: 0,
            zeroes: None,
        }
    }

    fn class(len: usize) -> (usize, usize) {
        let size = len.max(pci::PAGE_SIZE).next_power_of_two();
        (size, (size.trailing_zeros() - pci::PAGE_SIZE.trailing_zeros()) as usize)
    }

    /// A buffer of at least `len` bytes (its class size).
    fn take(&mut self, len: usize) -> pci::Result<DmaBuf> {
        let (size, idx) = Self::class(len);
        if let Some(b) = self.free.get_mut(idx).and_then(Vec::pop) {
            return Ok(b);
        }
        let room = self.chunk.as_ref().map_or(0, |c| c.len() - self.used);
        if room < size {
            let chunk = self.dma.allocate(size.max(CHUNK))?;
            self.allocated.fetch_add(chunk.len() as u64, Ordering::Relaxed);
            self.chunk = Some(Arc::new(chunk));
            self.used = 0;
        }
        let chunk = self.chunk.clone().ok_or(pci::PciError::IovaExhausted { len: size })?;
        let b = DmaBuf::new(chunk, self.used, size).ok_or(pci::PciError::IovaExhausted { len: size })?;
        self.used += size;
        Ok(b)
    }

    fn give(&mut self, b: DmaBuf) {
        let (_, idx) = Self::class(b.len());
        if self.free.len() <= idx {
            self.free.resize_with(idx + 1, Vec::new);
        }
        self.free[idx].push(b);
    }

    /// A zero-filled buffer of MAX_TRANSFER bytes the device only reads (Write Zeroes on a
    /// device without it).
    fn zeroes(&mut self) -> pci::Result<DmaBuf> {
        if let Some(z) = &self.zeroes {
            return Ok(z.clone());
        }
        let z = DmaBuf::whole(Arc::new(self.dma.allocate(MAX_TRANSFER)?));
        self.zeroes = Some(z.clone());
        Ok(z)
    }
}

/// One operation of a target command on an SSD namespace, in logical blocks.
#[derive(Debug, Clone)]
pub enum SsdOp<'a> {
    /// Read `blocks` from `slba`.
    Read {
        /// First LBA.
        slba: u64,
        /// Number of blocks.
        blocks: u64,
    },
    /// Write `data` at `slba`.
    Write {
        /// First LBA.
        slba: u64,
        /// The data (a whole number of blocks).
        data: &'a [u8],
        /// Force unit access.
        fua: bool,
    },
    /// Write the first `len` bytes of `buf` (from [`SsdChannel::take_buf`], the host's data
    /// received straight into it) at `slba`.
    WriteBuf {
        /// First LBA.
        slba: u64,
        /// The buffer.
        buf: DmaBuf,
        /// Bytes (a whole number of blocks).
        len: usize,
        /// Force unit access.
        fua: bool,
    },
    /// Flush the device's volatile write cache.
    Flush,
    /// Zero (and, with `deallocate`, deallocate) the (slba, blocks) ranges.
    Zero {
        /// The ranges.
        ranges: &'a [(u64, u64)],
        /// Deallocate them too (Dataset Management deallocate).
        deallocate: bool,
    },
}

struct Cmd {
    tag: Tag,
    buf: Option<DmaBuf>,
    read_len: usize,
    pending: u32,
    status: Status,
    submitted: Instant,
    class: usize,
}

/// One reactor's queue pair on a device: a source of its reactor.
pub struct SsdChannel {
    dev: Arc<SsdDevice>,
    reactor: usize,
    qp: Option<QueuePair>,
    cmds: slab::Slab<Cmd>,
    backlog: VecDeque<IoRequest>,
    pool: Pool,
    model: LatencyModel,
    /// Its key in the reactor's device load.
    key: ChannelKey,
    complete: CompleteFn,
    done: Vec<DeviceCompletion>,
    /// Largest target command, bytes (the queue splits it by MDTS).
    max_io: usize,
    /// Device commands refused at submission, completed on the next run.
    deferred: Vec<(usize, Status)>,
    last_poll: Instant,
    name: String,
}

impl SsdChannel {
    /// Take reactor `reactor`'s queue pair on `dev`.
    pub fn new(dev: Arc<SsdDevice>, env: &ChannelEnv) -> Result<Self, String> {
        let (reactor, max_io, model, complete) = (env.reactor, env.max_io as usize, env.model.clone(), env.complete);
        let qp = lock(&dev.queues)
            .get_mut(reactor)
            .and_then(Option::take)
            .ok_or_else(|| format!("{}: no I/O queue pair for reactor {reactor}", dev.name))?;
        Ok(Self {
            name: format!("nvme-{}-q{}", short(&dev.name), qp.qid()),
            pool: Pool::new(dev.dma.clone(), dev.data_dma_bytes.clone()),
            dev,
            reactor,
            qp: Some(qp),
            cmds: slab::Slab::new(),
            backlog: VecDeque::new(),
            model,
            key: env.key,
            complete,
            done: Vec::new(),
            max_io: max_io.max(pci::PAGE_SIZE),
            deferred: Vec::new(),
            last_poll: Instant::now(),
        })
    }

    /// Submit one target command; it completes (through the completion function, never from
    /// within this call) when all of its device commands have. Wake the channel afterwards.
    pub fn submit_op(&mut self, r: &mut Reactor, tag: Tag, ns: &pci::Namespace, op: SsdOp<'_>) -> Result<(), Status> {
        if self.dev.failed() {
            return Err(Status::NAMESPACE_NOT_READY);
        }
        let shift = ns.lba_shift;
        let (is_read, bytes) = match &op {
            SsdOp::Read { blocks, .. } => (true, (blocks << shift) as usize),
            SsdOp::Write { data, .. } => (false, data.len()),
            SsdOp::WriteBuf { len, .. } => (false, *len),
            _ => (false, 0),
        };
        let key = self.cmds.vacant_key();
        let mut reqs: Vec<IoRequest> = Vec::with_capacity(1);
        let mut buf = None;
        match op {
            SsdOp::Read { slba, .. } | SsdOp::Write { slba, .. } | SsdOp::WriteBuf { slba, .. } => {
                if bytes == 0 || bytes > self.max_io || bytes % ns.block_size() != 0 {
                    return Err(Status::INVALID_FIELD.with_dnr());
                }
                let (class, fua, data) = match op {
                    SsdOp::WriteBuf { buf, fua, .. } if buf.len() >= bytes => (buf, fua, None),
                    SsdOp::WriteBuf { .. } => return Err(Status::INTERNAL_ERROR),
                    SsdOp::Write { fua, data, .. } => (self.alloc(bytes)?, fua, Some(data)),
                    _ => (self.alloc(bytes)?, false, None),
                };
                let sub = DmaBuf::new(class.region().clone(), class.offset(), bytes).ok_or(Status::INTERNAL_ERROR)?;
                let req = if is_read {
                    IoRequest::read(ns, slba, sub, key as u64)
                } else {
                    if let Some(data) = data {
                        sub.write(data);
                    }
                    let mut q = IoRequest::write(ns, slba, sub, key as u64);
                    if fua {
                        q.cdw12_flags |= FUA;
                    }
                    q
                };
                reqs.push(req);
                buf = Some(class);
            }
            SsdOp::Flush => reqs.push(IoRequest::flush(ns, key as u64)),
            SsdOp::Zero { ranges, deallocate } => {
                if self.dev.info.oncs & ONCS_WRITE_ZEROES != 0 {
                    for &(slba, blocks) in ranges.iter().filter(|r| r.1 > 0) {
                        let mut q = IoRequest::write_zeroes(ns, slba, blocks, key as u64);
                        if deallocate {
                            q.cdw12_flags |= DEAC;
                        }
                        reqs.push(q);
                    }
                } else {
                    // No Write Zeroes on the device: write zero-filled buffers.
                    let z = self.pool.zeroes().map_err(|_| Status::INTERNAL_ERROR)?;
                    let per = (MAX_TRANSFER >> shift) as u64;
                    for &(slba, blocks) in ranges {
                        let mut done = 0;
                        while done < blocks {
                            let n = per.min(blocks - done);
                            let sub = DmaBuf::new(z.region().clone(), 0, (n << shift) as usize)
                                .ok_or(Status::INTERNAL_ERROR)?;
                            reqs.push(IoRequest::write(ns, slba + done, sub, key as u64));
                            done += n;
                        }
                    }
                }
            }
        }
        if reqs.is_empty() {
            return Err(Status::INTERNAL_ERROR);
        }
        self.cmds.insert(Cmd {
            tag,
            buf,
            read_len: if is_read { bytes } else { 0 },
            pending: reqs.len() as u32,
            status: Status::SUCCESS,
            submitted: Instant::now(),
            class: LatencyModel::class(is_read, bytes as u32),
        });
        r.device_load().outstanding += 1;
        // Behind a backlog, keep the order: queue behind it.
        self.backlog.extend(reqs);
        self.drain_backlog();
        Ok(())
    }

    fn alloc(&mut self, bytes: usize) -> Result<DmaBuf, Status> {
        self.pool.take(bytes).map_err(|e| {
            warn!(channel = %self.name, error = %e, "no DMA memory for a command");
            Status::INTERNAL_ERROR
        })
    }

    /// One device command of target command `key` finished with `status`.
    fn part_done(&mut self, r: &mut Reactor, key: usize, status: Status, now: Instant, exact: bool) {
        let Some(c) = self.cmds.get_mut(key) else { return };
        if c.status.is_success() && !status.is_success() {
            c.status = status;
        }
        c.pending = c.pending.saturating_sub(1);
        if c.pending > 0 {
            return;
        }
        let c = self.cmds.remove(key);
        account_completion(
            r,
            self.key,
            &mut self.model,
            c.class,
            now.saturating_duration_since(c.submitted),
            exact,
        );
        let data = (c.read_len > 0 && c.status.is_success())
            .then(|| {
                c.buf
                    .as_ref()
                    .and_then(|b| DmaBuf::new(b.region().clone(), b.offset(), c.read_len))
            })
            .flatten();
        let done = Completion {
            tag: c.tag,
            status: c.status,
            data: data.as_ref().map(ReadData::Dma),
        };
        (self.complete)(r, done);
        if let Some(b) = c.buf {
            self.pool.give(b);
        }
    }

    /// Submit what waits for queue slots or for the end of a reset, in order, and ring the
    /// doorbell. Refused commands complete on the next run (the caller's source may be the
    /// connection that is submitting: it cannot take a completion now).
    fn drain_backlog(&mut self) {
        if self.dev.failed() {
            self.deferred.extend(
                self.backlog
                    .drain(..)
                    .map(|q| (q.tag as usize, Status::NAMESPACE_NOT_READY)),
            );
            return;
        }
        let Some(qp) = self.qp.as_mut() else { return };
        while let Some(req) = self.backlog.pop_front() {
            match qp.submit(req) {
                Ok(()) => {}
                Err(rej) => match rej.error {
                    QueueError::Full { .. } | QueueError::Resetting => {
                        self.backlog.push_front(*rej.request);
                        break;
                    }
                    e => {
                        warn!(channel = %self.name, error = %e, "the queue refused a command");
                        self.deferred.push((rej.request.tag as usize, Status::INTERNAL_ERROR));
                    }
                },
            }
        }
        qp.flush();
    }
}

impl Channel for SsdChannel {
    fn name(&self) -> &str {
        &self.name
    }

    /// Byte ranges become LBA ranges of the device's namespace. Write data is copied into a
    /// DMA buffer (unless it was received into one); read data goes to the send buffer from
    /// the DMA buffer at completion.
    fn submit(&mut self, r: &mut Reactor, tag: Tag, ns: &Namespace, op: BlockOp<'_>) -> Result<(), Status> {
        let Some(dev_ns) = ns.backend.as_any().downcast_ref::<SsdNamespace>() else {
            return Err(Status::INTERNAL_ERROR);
        };
        let shift = ns.block_shift;
        let ranges: Vec<(u64, u64)>;
        let op = match op {
            BlockOp::Read { off, len } => SsdOp::Read {
                slba: off >> shift,
                blocks: u64::from(len) >> shift,
            },
            BlockOp::Write {
                off,
                data: WriteData::Bytes(data),
                fua,
            } => SsdOp::Write {
                slba: off >> shift,
                data,
                fua,
            },
            BlockOp::Write {
                off,
                data: WriteData::Dma { buf, len },
                fua,
            } => SsdOp::WriteBuf {
                slba: off >> shift,
                buf,
                len,
                fua,
            },
            BlockOp::WriteZeroes { off, len } => {
                ranges = vec![(off >> shift, len >> shift)];
                SsdOp::Zero {
                    ranges: &ranges,
                    deallocate: false,
                }
            }
            BlockOp::Deallocate { ranges: r } => {
                ranges = r.iter().map(|&(off, len)| (off >> shift, len >> shift)).collect();
                SsdOp::Zero {
                    ranges: &ranges,
                    deallocate: true,
                }
            }
            BlockOp::Flush => SsdOp::Flush,
        };
        let dev_ns = dev_ns.ns;
        self.submit_op(r, tag, &dev_ns, op)
    }

    fn interrupt_fd(&self) -> Option<RawFd> {
        self.qp.as_ref().and_then(QueuePair::eventfd)
    }

    fn outstanding(&self) -> usize {
        self.cmds.len() + self.backlog.len()
    }

    fn watchdog(&self) -> Option<Duration> {
        Some(WATCHDOG)
    }

    fn path(&self) -> &'static str {
        match self.dev.kind {
            "pci" => "vfio",
            _ => "fake controller",
        }
    }

    /// A DMA buffer of at least `len` bytes for a write's data to be received into: the
    /// data is copied once, from the socket into DMA memory. `None` beyond the transfer limit
    /// or without DMA memory.
    fn take_buf(&mut self, len: usize) -> Option<DmaBuf> {
        (len > 0 && len <= self.max_io)
            .then(|| self.pool.take(len).ok())
            .flatten()
    }

    fn give_buf(&mut self, buf: DmaBuf) {
        self.pool.give(buf);
    }

    fn poll(&mut self, r: &mut Reactor) -> Progress {
        let Some(qp) = self.qp.as_mut() else {
            return Progress {
                did_work: false,
                next: Next::Idle,
            };
        };
        // Busy-poll never sleeps on the eventfd: no read() per iteration there. Edge-triggered
        // epoll reports every new interrupt whether or not the counter was drained.
        if r.effective_mode() != Mode::Poll {
            qp.ack_interrupts();
        }
        let now = Instant::now();
        let exact = now.duration_since(self.last_poll) <= EXACT_GAP;
        self.last_poll = now;
        let mut done = std::mem::take(&mut self.done);
        qp.poll(|c| done.push(c));
        let completed = !done.is_empty();
        for c in done.drain(..) {
            self.part_done(r, c.tag as usize, c.status, now, exact);
        }
        self.done = done;
        if !self.backlog.is_empty() {
            self.drain_backlog();
        }
        let did = completed || !self.deferred.is_empty();
        for (key, status) in std::mem::take(&mut self.deferred) {
            self.part_done(r, key, status, now, false);
        }
        let next = if !self.deferred.is_empty() {
            Next::Asap
        } else if !self.backlog.is_empty() {
            // Waiting for a reset to finish or for slots: look again soon.
            Next::At(now + Duration::from_millis(1))
        } else {
            self.model
                .next_run(self.cmds.iter().map(|(_, c)| (c.submitted, c.class)))
        };
        Progress { did_work: did, next }
    }

    fn shutdown(&mut self) {
        // Wait (bounded) for what the device still holds, so no buffer is reused under it.
        let Some(qp) = self.qp.as_mut() else { return };
        let deadline = Instant::now() + Duration::from_secs(5);
        while qp.inflight() > 0 && Instant::now() < deadline {
            qp.poll(|_| {});
            std::thread::sleep(Duration::from_micros(50));
        }
        self.backlog.clear();
        self.cmds.clear();
    }
}

impl Drop for SsdChannel {
    fn drop(&mut self) {
        // An idle queue pair goes back to the device for a later channel of this reactor; one
        // with commands in flight is dropped (the controller deletes it and frees its buffers
        // once the device can no longer reach them).
        if let Some(qp) = self.qp.take()
            && qp.inflight() == 0
            && let Some(slot) = lock(&self.dev.queues).get_mut(self.reactor)
        {
            *slot = Some(qp);
        }
    }
}
