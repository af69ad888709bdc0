//! NVMe SSD namespaces through pollux's userspace driver ([`pollux_nvme::pci`]): the `nvme`
//! backend.
//!
//! Ownership follows the data path, as in SPDK's NVMe bdev:
//! - An [`SsdDevice`] is one controller (a PCI function bound to vfio-pci, or the in-process
//!   fake controller), opened once however many namespaces name it (a registry by name). At
//!   open it is brought up (NVMe 2.0 §3.5.1) and one I/O queue pair is created for
//!   every reactor, each with its own MSI-X vector wired to an eventfd.
//! - Each reactor takes its queue pair into an [`SsdChannel`], a reactor source: it alone
//!   submits and reaps on it, with no lock. The MSI-X eventfd wakes the reactor in interrupt
//!   and hybrid mode; busy-poll reads the completion queue's phase bits. Every completion's
//!   latency feeds the reactor's latency model (hybrid sleeps, the adaptive policy).
//! - The admin queue belongs to a small admin thread per device, off the I/O path: every
//!   100 ms it checks CSTS.CFS and the queues' command timeouts and resets the controller
//!   (NVMe 2.0 §3.7.2) when needed. In-flight commands then complete with Command Aborted By Host
//!   (the host retries them), new ones wait in the channel until their queue is created
//!   again, and a controller that cannot be brought back fails I/O with Namespace Not Ready
//!   rather than hanging hosts.
//! - Data moves through DMA buffers from a per-channel pool (size classes carved from 2 MiB
//!   regions, huge pages when the system has them): written data is copied once from the
//!   receive buffer into the DMA buffer, read data once from the DMA buffer into the send
//!   buffer, both with volatile accesses (the device may write that memory).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, LazyLock, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

mod channel;

pub use channel::{SsdChannel, SsdOp};
use pollux_conf::{NvmeBackend, NvmeDevice};
use pollux_nvme::pci::fake::{FakeConfig, FakeController, FakeNamespace};
use pollux_nvme::pci::{self, Controller, ControllerConfig, ControllerInfo, DmaAllocator, QueuePair};
use pollux_nvme::spec::{Health, Status};
use serde::Serialize;
use tracing::{debug, error, info, warn};

use super::{Backend, Caps, Channel, ChannelEnv, ChannelNs, CopyOffload};
use crate::error::StoreError;

/// Entries per I/O queue (capped by CAP.MQES).
const QUEUE_DEPTH: u16 = 256;
/// How often the admin thread looks at the controller.
const SERVICE_PERIOD: Duration = Duration::from_millis(100);
/// How often a busy channel is run even without an interrupt: it notices lost completions
/// (command timeout) and a controller reset.
const WATCHDOG: Duration = Duration::from_millis(100);
/// How often the admin thread reads the device's SMART / Health page.
const HEALTH_PERIOD: Duration = Duration::from_secs(2);
/// Retry period of a reset that failed.
const RETRY_FAILED: Duration = Duration::from_secs(1);
/// DMA memory is allocated in chunks of this size and carved into buffers.
const CHUNK: usize = 2 << 20;
/// Largest transfer of one device command (below MDTS); larger target commands are split.
const MAX_TRANSFER: usize = 1 << 20;
/// Completions within this gap of the previous poll are exact latency samples.
const EXACT_GAP: Duration = Duration::from_micros(5);
/// CDW12 bit 30, Force Unit Access (NVM Command Set 1.0 §3.2.6).
const FUA: u32 = 1 << 30;
/// CDW12 bit 25, Deallocate, of Write Zeroes (NVM Command Set 1.0 §3.2.8).
const DEAC: u32 = 1 << 25;
/// ONCS bit 3: Write Zeroes supported.
const ONCS_WRITE_ZEROES: u16 = 1 << 3;
/// Source range entries of one device Copy at most: one page of 32-byte entries, which
/// PRP1 alone references.
const COPY_ENTRIES_MAX: u32 = (pci::PAGE_SIZE / pci::queue::COPY_ENTRY) as u32;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The admin side of a device, shared with its admin thread.
struct Admin {
    name: String,
    ctrl: Mutex<Option<Controller>>,
    /// The fake controller serving it, for a fake device (replaced when it is brought up
    /// again: [`SsdDevice::reopen`]).
    fake: Mutex<Option<FakeController>>,
    /// The last reset failed: I/O fails until one succeeds.
    failed: AtomicBool,
    resets: AtomicU64,
    failed_resets: AtomicU64,
    stop: Mutex<bool>,
    wake: Condvar,
    /// The device's last SMART / Health page (None until first read, or when it cannot be
    /// read).
    health: Mutex<Option<Health>>,
    /// Device commands (SQ id, CID) whose target command a host aborted: the admin thread
    /// sends the device's own Abort for each (NVMe 2.0 §5.1).
    aborts: Mutex<Vec<(u16, u16)>>,
}

impl Admin {
    fn run(self: Arc<Self>) {
        let mut last_attempt = Instant::now();
        let mut last_health = Instant::now();
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
            if !failed {
                self.send_aborts(ctrl);
                if last_health.elapsed() >= HEALTH_PERIOD {
                    last_health = Instant::now();
                    self.read_health(ctrl);
                }
            }
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

impl Admin {
    /// The device's Abort for each device command a host aborted. Whatever the device
    /// answers, the channel completes the target command with Command Aborted Requested.
    fn send_aborts(&self, ctrl: &mut Controller) {
        for (qid, cid) in std::mem::take(&mut *lock(&self.aborts)) {
            match ctrl.abort(qid, cid) {
                Ok(aborted) => debug!(device = %self.name, qid, cid, aborted, "device Abort"),
                Err(e) => warn!(device = %self.name, qid, cid, error = %e, "device Abort failed"),
            }
        }
    }

    /// Refresh the SMART / Health page; log when the Critical Warning changes.
    fn read_health(&self, ctrl: &mut Controller) {
        let new = match ctrl.smart_health() {
            Ok(h) => Some(h),
            Err(e) => {
                debug!(device = %self.name, error = %e, "SMART / Health page unreadable");
                None
            }
        };
        let mut cur = lock(&self.health);
        let (was, now) = (
            cur.map_or(0, |h| h.critical_warning),
            new.map_or(0, |h| h.critical_warning),
        );
        if was != now {
            if now != 0 {
                warn!(device = %self.name, critical_warning = format_args!("{now:#04x}"), "device reports a critical warning");
            } else {
                info!(device = %self.name, "device critical warning cleared");
            }
        }
        *cur = new;
    }
}

/// A device brought up: what [`SsdDevice`] keeps of it.
struct Live {
    name: String,
    kind: &'static str,
    info: ControllerInfo,
    dma: Arc<dyn DmaAllocator>,
    ctrl: Controller,
    fake: Option<FakeController>,
    queues: Vec<Option<QueuePair>>,
    health: Option<Health>,
}

impl Live {
    fn start(device: &NvmeDevice, nsid: u32, block_size: u32, reactors: usize) -> Result<Self, StoreError> {
        let reactors = reactors.max(1);
        let driver = |source| StoreError::Nvme {
            device: device.name().to_string(),
            source,
        };
        let want = u16::try_from(reactors).map_err(|_| StoreError::NvmeUnfit {
            device: device.name().to_string(),
            reason: format!("{reactors} reactors: too many I/O queues"),
        })?;
        let (hw, fake, kind) = match device {
            NvmeDevice::Pci(bdf) => (pci::vfio::open(bdf).map_err(driver)?, None, "pci"),
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
        let mut ctrl = Controller::new(hw, cfg).map_err(driver)?;
        let info = ctrl.info().clone();
        if usize::from(info.io_queues) < reactors {
            return Err(StoreError::NvmeUnfit {
                device: name,
                reason: format!(
                    "the controller grants {} I/O queue pairs; pollux needs one per reactor ({reactors})",
                    info.io_queues
                ),
            });
        }
        let depth = QUEUE_DEPTH.min(info.cap.mqes().saturating_add(1)).max(2);
        let mut queues = Vec::with_capacity(reactors);
        for _ in 0..reactors {
            queues.push(Some(ctrl.create_io_queue_pair(depth).map_err(driver)?));
        }
        // The first SMART / Health page now, so a subsystem never reports this device without it.
        let health = ctrl.smart_health().ok();
        info!(device = %name, model = %info.model, serial = %info.serial, io_queues = reactors, depth,
            vectors = info.vectors, "NVMe device ready: one queue pair per reactor");
        Ok(Live {
            name,
            kind,
            info,
            dma,
            ctrl,
            fake,
            queues,
            health,
        })
    }
}

/// Start `admin`'s thread.
fn spawn_admin(admin: &Arc<Admin>) -> Result<JoinHandle<()>, StoreError> {
    let a = admin.clone();
    let thread_name = format!("nvme-admin-{}", short(&admin.name));
    std::thread::Builder::new()
        .name(thread_name.clone())
        .spawn(move || a.run())
        .map_err(|source| StoreError::Thread {
            name: thread_name,
            source,
        })
}

/// One NVMe controller, shared by the namespaces that name it.
pub struct SsdDevice {
    name: String,
    kind: &'static str,
    info: ControllerInfo,
    /// What brought it up, to bring it up again ([`SsdDevice::reopen`]).
    spec: (NvmeDevice, u32, u32, usize),
    /// Its DMA memory's allocator (None while released: the allocator holds the VFIO
    /// container and group).
    dma: Mutex<Option<Arc<dyn DmaAllocator>>>,
    admin: Arc<Admin>,
    /// Let go of for a hot upgrade ([`SsdDevice::release`]): no controller, no VFIO handle.
    released: AtomicBool,
    /// The I/O queue pair of each reactor, until it takes it (and back when its channel goes).
    queues: Mutex<Vec<Option<QueuePair>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// DMA memory the channels' data-buffer pools have allocated, bytes. Buffers are
    /// recycled, so it grows with the most data in flight, not with the I/O done: growth
    /// beyond that is a buffer not given back.
    data_dma_bytes: Arc<AtomicU64>,
    /// Copies pollux sent to the device as its own Copy command.
    offloaded_copies: AtomicU64,
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
    /// CC.SHN (NVMe 2.0 §3.6.1): the reactors gave their queue pairs back.
    fn stop(&self) {
        self.dev.shutdown();
    }

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
            inline_reads: false,
            copy_offload: copy_offload(&self.ns),
            compare_and_write: None,
        }
    }

    fn io_path(&self) -> &'static str {
        match self.dev.kind {
            "pci" => "vfio",
            _ => "fake controller",
        }
    }

    fn block_size(&self) -> Option<u32> {
        Some(self.ns.block_size() as u32)
    }

    /// The device's namespaces share its queue pair on each reactor: one channel per device.
    fn channel_key(&self, _own: usize) -> usize {
        Arc::as_ptr(&self.dev) as usize
    }

    fn open_channel(&self, _ns: ChannelNs, env: &ChannelEnv) -> Result<Box<dyn Channel>, StoreError> {
        Ok(Box::new(SsdChannel::new(self.dev.clone(), env)?))
    }

    fn device_health(&self) -> Option<(&str, Health)> {
        self.dev.health().map(|h| (self.dev.name(), h))
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// The device's own Copy on `ns`, within its limits (MSSRL, MCL, MSRC + 1) and what one
/// command's entry list holds (a page, PRP1 alone), when it has one (ONCS bit 8, OCFS bit 0).
pub(super) fn copy_offload(ns: &pci::Namespace) -> Option<CopyOffload> {
    let l = ns.copy?;
    let shift = ns.lba_shift;
    Some(CopyOffload {
        max_ranges: l.max_ranges.min(COPY_ENTRIES_MAX),
        max_range_bytes: u64::from(l.max_range_blocks) << shift,
        max_bytes: l.max_blocks.saturating_mul(1 << shift),
    })
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
    /// The device has its own Copy (ONCS bit 8, source range format 0), which pollux uses
    /// for a Copy within its limits.
    pub copy_offload: bool,
    /// Copies run as the device's own Copy command.
    pub offloaded_copies: u64,
    /// A fake device's own count of the I/O commands it executed (None: a PCI device).
    pub fake_io_commands: Option<u64>,
    /// A fake device's own count of the Copy commands it executed.
    pub fake_copy_commands: Option<u64>,
}

/// A device's usable namespaces (active, without metadata): (nsid, blocks, block size).
pub type NamespaceList = Vec<(u32, u64, u32)>;

/// The usable namespaces of the device `name` names (a BDF, or a fake controller that is
/// open): read from the open device, or from one brought up for the question and let go
/// again. Blocks on the device (a bring-up resets the controller): never on a reactor.
pub fn probe(name: &str, reactors: usize) -> Result<NamespaceList, StoreError> {
    let list = |info: &ControllerInfo| -> NamespaceList {
        info.namespaces
            .iter()
            .map(|n| (n.nsid, n.blocks, 1u32 << n.lba_shift))
            .collect()
    };
    if let Some(dev) = lock(&DEVICES).get(name).and_then(Weak::upgrade) {
        return Ok(list(&dev.info));
    }
    let bdf = pollux_conf::parse_pci_address(name).map_err(|e| StoreError::NvmeUnfit {
        device: name.to_string(),
        reason: format!("not a PCI address nor an open device: {e}"),
    })?;
    let dev = SsdDevice::bring_up(&NvmeDevice::Pci(bdf), 1, 512, reactors)?;
    Ok(list(&dev.info))
}

impl SsdDevice {
    /// The device `b` names, opened (and brought up with one queue pair per reactor) unless
    /// another namespace already did; and its namespace `b.nsid`. `block_size` is the conf's
    /// (a fake device's format).
    pub fn open(b: &NvmeBackend, block_size: u32, reactors: usize) -> Result<SsdNamespace, StoreError> {
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
            return Err(StoreError::NvmeUnfit {
                device: name,
                reason: format!("no usable namespace {} (active, without metadata: {active:?})", b.nsid),
            });
        };
        Ok(SsdNamespace { dev, ns })
    }

    fn bring_up(device: &NvmeDevice, nsid: u32, block_size: u32, reactors: usize) -> Result<Self, StoreError> {
        let live = Live::start(device, nsid, block_size, reactors)?;
        let admin = Arc::new(Admin {
            name: live.name.clone(),
            ctrl: Mutex::new(Some(live.ctrl)),
            fake: Mutex::new(live.fake),
            failed: AtomicBool::new(false),
            resets: AtomicU64::new(0),
            failed_resets: AtomicU64::new(0),
            stop: Mutex::new(false),
            wake: Condvar::new(),
            health: Mutex::new(live.health),
            aborts: Mutex::new(Vec::new()),
        });
        let thread = spawn_admin(&admin)?;
        Ok(Self {
            name: live.name,
            kind: live.kind,
            info: live.info,
            spec: (device.clone(), nsid, block_size, reactors),
            dma: Mutex::new(Some(live.dma)),
            admin,
            released: AtomicBool::new(false),
            queues: Mutex::new(live.queues),
            thread: Mutex::new(Some(thread)),
            data_dma_bytes: Arc::new(AtomicU64::new(0)),
            offloaded_copies: AtomicU64::new(0),
        })
    }

    /// Let go of the device for another process (a hot upgrade, once every queue is
    /// drained and each reactor closed its channel): the controller shut down (NVMe 2.0
    /// §3.6.1) and every VFIO handle closed, so that the new process can open and bring it
    /// up. [`SsdDevice::reopen`] takes it back (the upgrade rolled back). Idempotent.
    pub fn release(&self) {
        if self.released.swap(true, Ordering::AcqRel) {
            return;
        }
        self.shutdown();
        lock(&self.admin.fake).take();
        lock(&self.dma).take();
        info!(device = %self.name, "NVMe device released for another process");
    }

    /// Bring a released device up again, as at open (the same namespaces, or an error).
    pub fn reopen(&self) -> Result<(), StoreError> {
        if !self.released.load(Ordering::Acquire) {
            return Ok(());
        }
        let (device, nsid, block_size, reactors) = &self.spec;
        let live = Live::start(device, *nsid, *block_size, *reactors)?;
        if live.info.namespaces != self.info.namespaces {
            return Err(StoreError::NvmeUnfit {
                device: self.name.clone(),
                reason: "its namespaces changed while it was released".into(),
            });
        }
        *lock(&self.admin.ctrl) = Some(live.ctrl);
        *lock(&self.admin.fake) = live.fake;
        *lock(&self.admin.health) = live.health;
        self.admin.failed.store(false, Ordering::Release);
        *lock(&self.admin.stop) = false;
        *lock(&self.queues) = live.queues;
        *lock(&self.dma) = Some(live.dma);
        *lock(&self.thread) = Some(spawn_admin(&self.admin)?);
        self.released.store(false, Ordering::Release);
        info!(device = %self.name, "NVMe device brought up again");
        Ok(())
    }

    /// The DMA allocator (None while released).
    fn dma(&self) -> Option<Arc<dyn DmaAllocator>> {
        lock(&self.dma).clone()
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

    /// The device's last SMART / Health page (read every [`HEALTH_PERIOD`]).
    pub fn health(&self) -> Option<Health> {
        *lock(&self.admin.health)
    }

    /// Ask the admin thread to send the device's Abort for these commands of SQ `qid`.
    fn request_abort(&self, qid: u16, cids: &[u16]) {
        lock(&self.admin.aborts).extend(cids.iter().map(|&c| (qid, c)));
        self.admin.wake.notify_all();
    }

    /// For the control socket.
    pub fn view(&self) -> DeviceView {
        let fake = lock(&self.admin.fake).as_ref().map(|f| f.stats());
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
            state: if self.released.load(Ordering::Acquire) {
                "released"
            } else if self.failed() {
                "failed"
            } else {
                "ok"
            }
            .into(),
            resets: self.admin.resets.load(Ordering::Relaxed),
            failed_resets: self.admin.failed_resets.load(Ordering::Relaxed),
            copy_offload: self.info.namespaces.iter().any(|n| n.copy.is_some()),
            offloaded_copies: self.offloaded_copies.load(Ordering::Relaxed),
            fake_io_commands: fake.map(|f| f.io_commands),
            fake_copy_commands: fake.map(|f| f.copy_commands),
        }
    }

    /// Injects a fault into a fake device: `cfs` (controller fatal status: the admin thread
    /// resets it), `lose` (the next `count` completions are never posted: the command timeout
    /// resets it), `fail` (the next `count` I/O commands fail with `status`),
    /// `critical_warning` (its SMART page reports bits `count`), `temperature` (its composite
    /// temperature is `count` kelvin).
    pub fn inject(&self, kind: &str, count: u32, status: Status) -> Result<(), StoreError> {
        let unfit = |reason: String| StoreError::NvmeUnfit {
            device: self.name.clone(),
            reason,
        };
        let guard = lock(&self.admin.fake);
        let Some(fake) = guard.as_ref() else {
            return Err(unfit(
                "a PCI device: faults can be injected into fake devices only".into(),
            ));
        };
        match kind {
            "cfs" => fake.inject_cfs(),
            "lose" => fake.lose_completions(count),
            "fail" => fake.fail_io(count, status),
            "critical_warning" => {
                let bits = u8::try_from(count).map_err(|_| unfit(format!("critical warning {count:#x}: 8 bits")))?;
                let temp = self.health().map_or(310, |h| h.temperature_k);
                fake.set_health(bits, temp);
            }
            "temperature" => {
                let k = u16::try_from(count).map_err(|_| unfit(format!("temperature {count} K: out of range")))?;
                let bits = self.health().map_or(0, |h| h.critical_warning);
                fake.set_health(bits, k);
            }
            other => {
                return Err(unfit(format!(
                    "unknown fault {other:?}: cfs, lose, fail, critical_warning or temperature"
                )));
            }
        }
        warn!(device = %self.name, fault = kind, count, "fault injected");
        Ok(())
    }

    /// Stops the admin thread and shuts the controller down (NVMe 2.0 §3.6.1: queues deleted, CC.SHN,
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
