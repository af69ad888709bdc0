//! A fake NVMe controller in process memory: the driver's test peer.
//!
//! Registers are atomics; "DMA" memory is anonymous memory registered in an IOVA table that
//! the controller thread translates through (as an IOMMU would: an unmapped IOVA is a Data
//! Transfer Error). The thread implements enough of an NVMe controller (base spec 2.0) to
//! exercise the driver: the CC.EN/CSTS.RDY handshake (with a ready delay within CAP.TO),
//! shutdown (CC.SHN/CSTS.SHST), the admin commands Identify (Controller, Namespace, Active
//! Namespace List), Set/Get Features Number of Queues, Create/Delete I/O CQ/SQ and Abort, and
//! the NVM I/O commands Read, Write, Flush, Write Zeroes and Copy (source range format 0,
//! configurable limits) over RAM namespaces with PRP1/PRP2
//! and PRP lists walked from DMA memory, phase tags, doorbells, MSI-X eventfds, a
//! configurable latency and injected faults (CSTS.CFS, lost completions, error statuses).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::{JoinHandle, Thread};
use std::time::Duration;

use vmm_sys_util::eventfd::EventFd;

use super::Hardware;
use super::dma::IovaAllocator;
use super::regs::offset;
use crate::spec::{Cap, Status, Vs, sct};

use engine::Engine;
use hw::{FakeBar, FakeDma, FakeIrqs};
use iova::DmaSpace;

mod engine;
mod hw;
mod iova;

/// Command specific 00h: Completion Queue Invalid (NVMe 2.0 §5.5, Create I/O Submission Queue).
pub const CQ_INVALID: Status = Status::new(sct::COMMAND_SPECIFIC, 0x00);
/// Command specific 08h: Invalid Interrupt Vector (NVMe 2.0 §5.4).
pub const INVALID_INTERRUPT_VECTOR: Status = Status::new(sct::COMMAND_SPECIFIC, 0x08);
/// Command specific 0Ch: Invalid Queue Deletion (NVMe 2.0 §5.6).
pub const INVALID_QUEUE_DELETION: Status = Status::new(sct::COMMAND_SPECIFIC, 0x0C);
/// Generic 13h: PRP Offset Invalid (NVMe 2.0 §4.6.1.2.1).
pub const PRP_OFFSET_INVALID: Status = Status::new(sct::GENERIC, 0x13);

/// A RAM namespace of the fake controller.
#[derive(Clone, Copy, Debug)]
pub struct FakeNamespace {
    /// Namespace ID.
    pub nsid: u32,
    /// log2 of the LBA size.
    pub lba_shift: u8,
    /// Size in LBAs.
    pub blocks: u64,
}

/// The fake controller's capabilities and behaviour.
#[derive(Clone, Debug)]
pub struct FakeConfig {
    /// CAP.MQES (0's based).
    pub mqes: u16,
    /// CAP.DSTRD.
    pub dstrd: u8,
    /// CAP.TO (500 ms units).
    pub cap_to: u8,
    /// Identify Controller MDTS (2^n pages; 0 = no limit).
    pub mdts: u8,
    /// I/O queue pairs it grants at most.
    pub max_io_queues: u16,
    /// MSI-X vectors.
    pub vectors: u16,
    /// Namespaces.
    pub namespaces: Vec<FakeNamespace>,
    /// Delay between fetching a command and posting its completion.
    pub latency: Duration,
    /// Delay between CC.EN = 1 and CSTS.RDY = 1.
    pub ready_delay: Duration,
    /// Copy (ONCS bit 8, source range format 0) with these limits on every namespace; None:
    /// no Copy (Invalid Opcode).
    pub copy: Option<FakeCopyLimits>,
}

/// The fake's Copy limits (Identify Namespace MSSRL, MCL, MSRC), in logical blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FakeCopyLimits {
    /// MSSRL: most blocks of one source range (1..=65535).
    pub mssrl: u16,
    /// MCL: most blocks of one Copy.
    pub mcl: u32,
    /// MSRC: most source ranges of one Copy, 0's based.
    pub msrc: u8,
}

impl Default for FakeCopyLimits {
    /// Smaller than pollux's own limits (so a test can send a copy pollux takes and this
    /// device does not): 256 blocks per range, 1024 in all, 8 ranges.
    fn default() -> Self {
        Self {
            mssrl: 256,
            mcl: 1024,
            msrc: 7,
        }
    }
}

impl Default for FakeConfig {
    fn default() -> Self {
        Self {
            mqes: 1023,
            dstrd: 0,
            cap_to: 2,
            mdts: 5,
            max_io_queues: 8,
            vectors: 9,
            namespaces: vec![
                FakeNamespace {
                    nsid: 1,
                    lba_shift: 9,
                    blocks: 32768,
                },
                FakeNamespace {
                    nsid: 2,
                    lba_shift: 12,
                    blocks: 2048,
                },
            ],
            latency: Duration::ZERO,
            ready_delay: Duration::from_millis(2),
            copy: Some(FakeCopyLimits::default()),
        }
    }
}

/// Counters of the fake controller.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FakeStats {
    /// Writes to I/O SQ tail doorbells.
    pub io_sq_doorbells: u64,
    /// I/O commands executed.
    pub io_commands: u64,
    /// Admin commands executed.
    pub admin_commands: u64,
    /// Times CSTS.RDY went 0 -> 1.
    pub enables: u64,
    /// Interrupts signalled.
    pub interrupts: u64,
    /// Completions dropped on purpose.
    pub lost: u64,
    /// Copy commands executed successfully (the device moved the blocks itself).
    pub copy_commands: u64,
}

struct Ram {
    ns: FakeNamespace,
    data: Vec<u8>,
}

struct Inner {
    cfg: FakeConfig,
    cap: u64,
    regs: Box<[AtomicU32]>,
    dma: Arc<DmaSpace>,
    thread: OnceLock<Thread>,
    stop: AtomicBool,
    latency_ns: AtomicU64,
    cfs: AtomicBool,
    lose: AtomicU32,
    fail_n: AtomicU32,
    fail_status: AtomicU32,
    stall_ready: AtomicBool,
    irqs: Mutex<Vec<Arc<EventFd>>>,
    ram: Mutex<Vec<Ram>>,
    io_sq_doorbells: AtomicU64,
    io_commands: AtomicU64,
    admin_commands: AtomicU64,
    enables: AtomicU64,
    interrupts: AtomicU64,
    lost: AtomicU64,
    copy_commands: AtomicU64,
    /// Bytes moved by Read and Write (the SMART page's data units).
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    /// SMART Critical Warning and Composite Temperature (kelvin) the fake reports.
    critical_warning: AtomicU32,
    temperature_k: AtomicU32,
}

impl Inner {
    fn reg(&self, off: usize) -> u32 {
        self.regs.get(off / 4).map_or(0, |r| r.load(Ordering::Acquire))
    }
    fn set_reg(&self, off: usize, v: u32) {
        if let Some(r) = self.regs.get(off / 4) {
            r.store(v, Ordering::Release);
        }
    }
    fn wake(&self) {
        if let Some(t) = self.thread.get() {
            t.unpark();
        }
    }
    fn ram(&self) -> MutexGuard<'_, Vec<Ram>> {
        self.ram.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A running fake controller; stops its thread on drop.
pub struct FakeController {
    inner: Arc<Inner>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for FakeController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeController")
            .field("cfg", &self.inner.cfg)
            .finish_non_exhaustive()
    }
}

impl FakeController {
    /// Starts the controller thread; returns it and the [`Hardware`] to drive it with.
    pub fn start(cfg: FakeConfig) -> (Self, Hardware) {
        let cap = Cap::default()
            .with_mqes(cfg.mqes)
            .with_cqr(true)
            .with_to(cfg.cap_to)
            .with_css(Cap::CSS_NVM)
            .with_mpsmin(0)
            .with_mpsmax(4);
        let cap = Cap(cap.0 | (u64::from(cfg.dstrd & 0xF) << 32));
        let reg_bytes = offset::DOORBELLS + 2 * (usize::from(cfg.max_io_queues) + 1) * (4usize << cfg.dstrd);
        let ram = cfg
            .namespaces
            .iter()
            .map(|&ns| Ram {
                ns,
                data: vec![0; (ns.blocks << ns.lba_shift) as usize],
            })
            .collect();
        let inner = Arc::new(Inner {
            latency_ns: AtomicU64::new(cfg.latency.as_nanos() as u64),
            cfg,
            cap: cap.0,
            regs: (0..reg_bytes / 4).map(|_| AtomicU32::new(0)).collect(),
            dma: Arc::new(DmaSpace {
                space: Mutex::default(),
                iova: Mutex::new(IovaAllocator::new(0x10_0000_0000, 0x20_0000_0000)),
            }),
            thread: OnceLock::new(),
            stop: AtomicBool::new(false),
            cfs: AtomicBool::new(false),
            lose: AtomicU32::new(0),
            fail_n: AtomicU32::new(0),
            fail_status: AtomicU32::new(0),
            stall_ready: AtomicBool::new(false),
            irqs: Mutex::default(),
            ram: Mutex::new(ram),
            io_sq_doorbells: AtomicU64::new(0),
            io_commands: AtomicU64::new(0),
            admin_commands: AtomicU64::new(0),
            enables: AtomicU64::new(0),
            interrupts: AtomicU64::new(0),
            lost: AtomicU64::new(0),
            copy_commands: AtomicU64::new(0),
            bytes_read: AtomicU64::new(0),
            bytes_written: AtomicU64::new(0),
            critical_warning: AtomicU32::new(0),
            // 37 °C: a plausible idle SSD.
            temperature_k: AtomicU32::new(310),
        });
        inner.set_reg(offset::VS, Vs::V2_0.0);
        let engine_inner = inner.clone();
        let thread = std::thread::Builder::new()
            .name("fake-nvme".into())
            .spawn(move || Engine::new(engine_inner).run())
            .ok();
        if let Some(t) = &thread {
            let _ = inner.thread.set(t.thread().clone());
        }
        let hw = Hardware {
            name: "fake".into(),
            regs: Arc::new(FakeBar(inner.clone())),
            dma: Arc::new(FakeDma(inner.dma.clone())),
            irqs: Arc::new(FakeIrqs(inner.clone())),
        };
        (Self { inner, thread }, hw)
    }

    /// Sets the command latency.
    pub fn set_latency(&self, d: Duration) {
        self.inner.latency_ns.store(d.as_nanos() as u64, Ordering::Relaxed);
    }

    /// Raises CSTS.CFS (controller fatal status): the controller stops processing until it
    /// is reset (CC.EN 1 -> 0).
    pub fn inject_cfs(&self) {
        self.inner.cfs.store(true, Ordering::Release);
        self.inner.wake();
    }

    /// Drops the completions of the next `n` I/O commands (executed, never completed).
    pub fn lose_completions(&self, n: u32) {
        self.inner.lose.store(n, Ordering::Release);
    }

    /// Completes the next `n` I/O commands with `status` (without executing them).
    pub fn fail_io(&self, n: u32, status: Status) {
        self.inner
            .fail_status
            .store(u32::from(status.field()), Ordering::Release);
        self.inner.fail_n.store(n, Ordering::Release);
    }

    /// Keeps CSTS.RDY at 0 after CC.EN = 1 (a controller that never becomes ready).
    pub fn stall_ready(&self, on: bool) {
        self.inner.stall_ready.store(on, Ordering::Release);
    }

    /// Sets what the SMART / Health page reports: Critical Warning bits and Composite
    /// Temperature (kelvin).
    pub fn set_health(&self, critical_warning: u8, temperature_k: u16) {
        self.inner
            .critical_warning
            .store(u32::from(critical_warning), Ordering::Release);
        self.inner
            .temperature_k
            .store(u32::from(temperature_k), Ordering::Release);
    }

    /// Counters.
    pub fn stats(&self) -> FakeStats {
        let i = &self.inner;
        FakeStats {
            io_sq_doorbells: i.io_sq_doorbells.load(Ordering::Relaxed),
            io_commands: i.io_commands.load(Ordering::Relaxed),
            admin_commands: i.admin_commands.load(Ordering::Relaxed),
            enables: i.enables.load(Ordering::Relaxed),
            interrupts: i.interrupts.load(Ordering::Relaxed),
            lost: i.lost.load(Ordering::Relaxed),
            copy_commands: i.copy_commands.load(Ordering::Relaxed),
        }
    }

    /// A copy of `len` bytes of namespace `nsid` from byte `offset`.
    pub fn read_namespace(&self, nsid: u32, offset: usize, len: usize) -> Vec<u8> {
        let ram = self.inner.ram();
        ram.iter()
            .find(|r| r.ns.nsid == nsid)
            .map(|r| r.data[offset..offset + len].to_vec())
            .unwrap_or_default()
    }

    /// IOVA mappings currently registered (a leak check for tests).
    pub fn mappings(&self) -> usize {
        self.inner.dma.lock().map.len()
    }
}

impl Drop for FakeController {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::Release);
        self.inner.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
