//! A fake NVMe controller in process memory: the driver's test peer.
//!
//! Registers are atomics; "DMA" memory is anonymous memory registered in an IOVA table that
//! the controller thread translates through (as an IOMMU would: an unmapped IOVA is a Data
//! Transfer Error). The thread implements enough of an NVMe controller (base spec 2.0) to
//! exercise the driver: the CC.EN/CSTS.RDY handshake (with a ready delay within CAP.TO),
//! shutdown (CC.SHN/CSTS.SHST), the admin commands Identify (Controller, Namespace, Active
//! Namespace List), Set/Get Features Number of Queues, Create/Delete I/O CQ/SQ and Abort, and
//! the NVM I/O commands Read, Write, Flush and Write Zeroes over RAM namespaces with PRP1/PRP2
//! and PRP lists walked from DMA memory, phase tags, doorbells, MSI-X eventfds, a
//! configurable latency and injected faults (CSTS.CFS, lost completions, error statuses).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

use vm_memory::VolatileSlice;
use vmm_sys_util::eventfd::EventFd;
use zerocopy::{FromZeros, IntoBytes};

use super::dma::{DmaAllocator, DmaRegion, DmaUnmap, HostMemory, IovaAllocator, PAGE_SIZE, alloc_iova};
use super::irq::Interrupts;
use super::regs::{RegisterAccess, cq_head_doorbell, offset, sq_tail_doorbell};
use super::{Hardware, Result};
use crate::bindings::{nvme_id_ctrl, nvme_id_ns};
use crate::spec::{Cap, Cc, Csts, Sqe, Status, Vs, cns, feature, opcode, sct};

/// Command specific 00h: Completion Queue Invalid (§5.5, Create I/O Submission Queue).
pub const CQ_INVALID: Status = Status::new(sct::COMMAND_SPECIFIC, 0x00);
/// Command specific 08h: Invalid Interrupt Vector (§5.4).
pub const INVALID_INTERRUPT_VECTOR: Status = Status::new(sct::COMMAND_SPECIFIC, 0x08);
/// Command specific 0Ch: Invalid Queue Deletion (§5.6).
pub const INVALID_QUEUE_DELETION: Status = Status::new(sct::COMMAND_SPECIFIC, 0x0C);
/// Generic 13h: PRP Offset Invalid (§4.6.1.2.1).
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
}

struct Ram {
    ns: FakeNamespace,
    data: Vec<u8>,
}

#[derive(Default)]
struct Space {
    map: BTreeMap<u64, (usize, usize)>,
}

/// The fake's IOVA space: IOVA -> host memory, as an IOMMU's page tables.
struct DmaSpace {
    space: Mutex<Space>,
    iova: Mutex<IovaAllocator>,
}

impl DmaSpace {
    fn lock(&self) -> MutexGuard<'_, Space> {
        self.space.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl DmaUnmap for DmaSpace {
    fn unmap(&self, iova: u64, len: usize) {
        self.lock().map.remove(&iova);
        self.iova
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .free(iova, len as u64);
    }
}

impl Space {
    /// Host address of `[iova, iova + len)` when one mapping holds it all.
    fn translate(&self, iova: u64, len: usize) -> Option<*mut u8> {
        let (&base, &(ptr, size)) = self.map.range(..=iova).next_back()?;
        let off = (iova - base) as usize;
        (off.checked_add(len)? <= size).then(|| (ptr + off) as *mut u8)
    }

    fn slice(&self, iova: u64, len: usize) -> Option<VolatileSlice<'_>> {
        let p = self.translate(iova, len)?;
        // SAFETY: translate() checked the range lies in a live mapping, which stays mapped
        // while the Space lock (borrowed by the result) is held: unmapping takes that lock
        // before the memory is freed. The access is volatile.
        Some(unsafe { VolatileSlice::new(p, len) })
    }

    fn read(&self, iova: u64, out: &mut [u8]) -> bool {
        self.slice(iova, out.len()).map(|s| s.copy_to(out)).is_some()
    }

    fn write(&self, iova: u64, data: &[u8]) -> bool {
        self.slice(iova, data.len()).map(|s| s.copy_from(data)).is_some()
    }

    fn read_u64(&self, iova: u64) -> Option<u64> {
        let mut b = [0u8; 8];
        self.read(iova, &mut b).then(|| u64::from_le_bytes(b))
    }
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

struct FakeBar(Arc<Inner>);

impl RegisterAccess for FakeBar {
    fn read32(&self, off: usize) -> u32 {
        match off {
            offset::CAP => self.0.cap as u32,
            o if o == offset::CAP + 4 => (self.0.cap >> 32) as u32,
            _ => self.0.reg(off),
        }
    }

    fn write32(&self, off: usize, value: u32) {
        match off {
            // Read-only registers.
            offset::CAP | 0x04 | offset::VS | offset::CSTS => return,
            o if o >= offset::DOORBELLS => {
                let stride = 4usize << self.0.cfg.dstrd;
                let idx = (o - offset::DOORBELLS) / stride;
                if idx.is_multiple_of(2) && idx > 0 {
                    self.0.io_sq_doorbells.fetch_add(1, Ordering::Relaxed);
                }
            }
            _ => {}
        }
        self.0.set_reg(off, value);
        self.0.wake();
    }
}

struct FakeDma(Arc<DmaSpace>);

impl DmaAllocator for FakeDma {
    fn allocate(&self, len: usize) -> Result<DmaRegion> {
        let mem = HostMemory::new(len)?;
        let iova = alloc_iova(&self.0.iova, &mem)?;
        self.0.lock().map.insert(iova, (mem.as_ptr() as usize, mem.len()));
        let unmap: Arc<dyn DmaUnmap> = self.0.clone();
        Ok(DmaRegion::new(mem, iova, Some(unmap)))
    }
}

struct FakeIrqs(Arc<Inner>);

impl Interrupts for FakeIrqs {
    fn max_vectors(&self) -> u16 {
        self.0.cfg.vectors
    }
    fn enable(&self, count: u16) -> Result<Vec<Arc<EventFd>>> {
        let fds = super::irq::eventfds(count.min(self.0.cfg.vectors), "fake")?;
        *self.0.irqs.lock().unwrap_or_else(|p| p.into_inner()) = fds.clone();
        Ok(fds)
    }
    fn disable(&self) -> Result<()> {
        self.0.irqs.lock().unwrap_or_else(|p| p.into_inner()).clear();
        Ok(())
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

struct FSq {
    iova: u64,
    size: u16,
    cqid: u16,
    head: u16,
}

struct FCq {
    iova: u64,
    size: u16,
    tail: u16,
    phase: bool,
    ien: bool,
    iv: u16,
}

struct Pending {
    due: Instant,
    cqid: u16,
    sqid: u16,
    cid: u16,
    sqhd: u16,
    status: Status,
    dw0: u32,
}

struct Engine {
    inner: Arc<Inner>,
    enabled: bool,
    fatal: bool,
    shut: bool,
    ready_at: Option<Instant>,
    sqs: Vec<Option<FSq>>,
    cqs: Vec<Option<FCq>>,
    pending: Vec<Pending>,
    granted: u16,
}

impl Engine {
    fn new(inner: Arc<Inner>) -> Self {
        let n = usize::from(inner.cfg.max_io_queues) + 1;
        Self {
            inner,
            enabled: false,
            fatal: false,
            shut: false,
            ready_at: None,
            sqs: (0..n).map(|_| None).collect(),
            cqs: (0..n).map(|_| None).collect(),
            pending: Vec::new(),
            granted: 0,
        }
    }

    fn csts(&self) -> Csts {
        Csts(self.inner.reg(offset::CSTS))
    }

    fn set_csts(&self, c: Csts) {
        self.inner.set_reg(offset::CSTS, c.0);
    }

    fn run(mut self) {
        while !self.inner.stop.load(Ordering::Acquire) {
            self.step();
            let now = Instant::now();
            let next = self.pending.iter().map(|p| p.due).min();
            let wait = match next {
                Some(d) if d <= now => continue,
                Some(d) => (d - now).min(Duration::from_millis(1)),
                None if self.ready_at.is_some() => Duration::from_micros(200),
                None => Duration::from_millis(2),
            };
            std::thread::park_timeout(wait);
        }
    }

    fn step(&mut self) {
        let cc = Cc(self.inner.reg(offset::CC));
        if self.inner.cfs.swap(false, Ordering::AcqRel) {
            self.fatal = true;
            self.pending.clear();
            self.set_csts(self.csts().with_cfs(true));
        }
        if !cc.en() {
            if self.enabled || self.csts().0 != 0 || self.ready_at.is_some() {
                // Controller reset (§3.7.2): queues gone, CSTS cleared.
                self.enabled = false;
                self.fatal = false;
                self.shut = false;
                self.ready_at = None;
                self.sqs.iter_mut().for_each(|q| *q = None);
                self.cqs.iter_mut().for_each(|q| *q = None);
                self.pending.clear();
                // Doorbells reset with the controller: no stale tail may replay old commands.
                for r in &self.inner.regs[offset::DOORBELLS / 4..] {
                    r.store(0, Ordering::Release);
                }
                self.set_csts(Csts(0));
            }
            return;
        }
        if !self.enabled {
            if self.fatal {
                return;
            }
            let now = Instant::now();
            let at = *self.ready_at.get_or_insert(now + self.inner.cfg.ready_delay);
            if now >= at && !self.inner.stall_ready.load(Ordering::Acquire) {
                self.enable(cc);
            }
            return;
        }
        if self.fatal {
            return;
        }
        if cc.shn() != Cc::SHN_NONE {
            if !self.shut {
                self.shut = true;
                self.pending.clear();
                self.sqs.iter_mut().skip(1).for_each(|q| *q = None);
                self.cqs.iter_mut().skip(1).for_each(|q| *q = None);
                self.set_csts(self.csts().with_shst(Csts::SHST_COMPLETE));
            }
            return;
        }
        for qid in 0..self.sqs.len() {
            self.fetch(qid as u16);
        }
        self.post_due();
    }

    fn enable(&mut self, cc: Cc) {
        let aqa = self.inner.reg(offset::AQA);
        let asq = u64::from(self.inner.reg(offset::ASQ)) | u64::from(self.inner.reg(offset::ASQ + 4)) << 32;
        let acq = u64::from(self.inner.reg(offset::ACQ)) | u64::from(self.inner.reg(offset::ACQ + 4)) << 32;
        let ok = cc.iosqes() == 6
            && cc.iocqes() == 4
            && cc.mps() == 0
            && asq % PAGE_SIZE as u64 == 0
            && acq % PAGE_SIZE as u64 == 0;
        if !ok {
            self.fatal = true;
            self.set_csts(Csts::default().with_cfs(true));
            return;
        }
        self.sqs[0] = Some(FSq {
            iova: asq,
            size: (aqa & 0xFFF) as u16 + 1,
            cqid: 0,
            head: 0,
        });
        self.cqs[0] = Some(FCq {
            iova: acq,
            size: ((aqa >> 16) & 0xFFF) as u16 + 1,
            tail: 0,
            phase: true,
            ien: false,
            iv: 0,
        });
        self.enabled = true;
        self.ready_at = None;
        self.inner.enables.fetch_add(1, Ordering::Relaxed);
        self.set_csts(Csts::default().with_rdy(true));
    }

    fn fetch(&mut self, qid: u16) {
        let dstrd = self.inner.cfg.dstrd;
        loop {
            let Some(sq) = &self.sqs[usize::from(qid)] else { return };
            let tail = self.inner.reg(sq_tail_doorbell(qid, dstrd)) as u16;
            if tail >= sq.size || tail == sq.head {
                return; // an invalid doorbell value is ignored
            }
            let (iova, head, size, cqid) = (sq.iova + u64::from(sq.head) * 64, sq.head, sq.size, sq.cqid);
            let mut raw = [0u8; 64];
            let ok = self.inner.dma.lock().read(iova, &mut raw);
            let new_head = (head + 1) % size;
            if let Some(sq) = &mut self.sqs[usize::from(qid)] {
                sq.head = new_head;
            }
            if !ok {
                self.fatal = true;
                self.set_csts(self.csts().with_cfs(true));
                return;
            }
            let sqe: Sqe = zerocopy::transmute!(raw);
            let (status, dw0) = if qid == 0 {
                self.inner.admin_commands.fetch_add(1, Ordering::Relaxed);
                self.admin(&sqe)
            } else {
                self.inner.io_commands.fetch_add(1, Ordering::Relaxed);
                if self.take_one(&self.inner.lose) {
                    self.inner.lost.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                if self.take_one(&self.inner.fail_n) {
                    let st = Status::from_field(self.inner.fail_status.load(Ordering::Acquire) as u16);
                    (st, 0)
                } else {
                    (self.io(&sqe), 0)
                }
            };
            let lat = Duration::from_nanos(self.inner.latency_ns.load(Ordering::Relaxed));
            let due = Instant::now() + if qid == 0 { Duration::ZERO } else { lat };
            self.pending.push(Pending {
                due,
                cqid,
                sqid: qid,
                cid: sqe.cid.get(),
                sqhd: new_head,
                status,
                dw0,
            });
            if !self.enabled {
                return; // a Delete of the admin queue's own... (not possible) or shutdown
            }
        }
    }

    fn take_one(&self, n: &AtomicU32) -> bool {
        n.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| v.checked_sub(1))
            .is_ok()
    }

    fn post_due(&mut self) {
        let now = Instant::now();
        let dstrd = self.inner.cfg.dstrd;
        let mut i = 0;
        while i < self.pending.len() {
            if self.pending[i].due > now {
                i += 1;
                continue;
            }
            let p = &self.pending[i];
            let Some(cq) = &mut self.cqs[usize::from(p.cqid)] else {
                self.pending.remove(i);
                continue;
            };
            let head = self.inner.reg(cq_head_doorbell(p.cqid, dstrd)) as u16;
            if (cq.tail + 1) % cq.size == head {
                i += 1; // CQ full: wait for the host to consume
                continue;
            }
            let mut cqe = crate::spec::Cqe::new(p.cid, p.sqid, p.sqhd, p.status, p.dw0);
            cqe.set_phase(cq.phase);
            let at = cq.iova + u64::from(cq.tail) * 16;
            let bytes = cqe.as_bytes();
            {
                let space = self.inner.dma.lock();
                // The status word (with the phase tag) goes last.
                space.write(at, &bytes[..14]);
                std::sync::atomic::fence(Ordering::Release);
                space.write(at + 14, &bytes[14..]);
            }
            cq.tail += 1;
            if cq.tail == cq.size {
                cq.tail = 0;
                cq.phase = !cq.phase;
            }
            if cq.ien {
                let irqs = self.inner.irqs.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(e) = irqs.get(usize::from(cq.iv)) {
                    // Counted before it is raised: whoever it wakes sees the count.
                    self.inner.interrupts.fetch_add(1, Ordering::Relaxed);
                    let _ = e.write(1);
                }
            }
            self.pending.remove(i);
        }
    }

    fn admin(&mut self, sqe: &Sqe) -> (Status, u32) {
        let cdw10 = sqe.cdw10.get();
        let cdw11 = sqe.cdw11.get();
        let max_q = self.inner.cfg.max_io_queues;
        match sqe.opcode {
            opcode::admin::IDENTIFY => (self.identify(sqe), 0),
            opcode::admin::SET_FEATURES | opcode::admin::GET_FEATURES => {
                if (cdw10 & 0xFF) as u8 != feature::NUMBER_OF_QUEUES {
                    return (Status::SUCCESS, 0);
                }
                if sqe.opcode == opcode::admin::SET_FEATURES {
                    let nsqr = (cdw11 & 0xFFFF) as u16;
                    let ncqr = (cdw11 >> 16) as u16;
                    if nsqr == 0xFFFF || ncqr == 0xFFFF {
                        return (Status::INVALID_FIELD, 0);
                    }
                    self.granted = nsqr.min(ncqr).min(max_q - 1) + 1;
                }
                let g = u32::from(self.granted.max(1) - 1);
                (Status::SUCCESS, (g << 16) | g)
            }
            opcode::admin::CREATE_CQ => {
                let qid = (cdw10 & 0xFFFF) as u16;
                let size = (cdw10 >> 16) + 1;
                if qid == 0 || qid > max_q || self.cqs[usize::from(qid)].is_some() {
                    return (Status::INVALID_QUEUE_IDENTIFIER, 0);
                }
                if size < 2 || size > u32::from(self.inner.cfg.mqes) + 1 {
                    return (Status::INVALID_QUEUE_SIZE, 0);
                }
                if cdw11 & 1 == 0 || !sqe.prp1().is_multiple_of(PAGE_SIZE as u64) {
                    return (Status::INVALID_FIELD, 0);
                }
                let ien = cdw11 & 2 != 0;
                let iv = (cdw11 >> 16) as u16;
                if ien && iv >= self.inner.cfg.vectors {
                    return (INVALID_INTERRUPT_VECTOR, 0);
                }
                self.cqs[usize::from(qid)] = Some(FCq {
                    iova: sqe.prp1(),
                    size: size as u16,
                    tail: 0,
                    phase: true,
                    ien,
                    iv,
                });
                (Status::SUCCESS, 0)
            }
            opcode::admin::CREATE_SQ => {
                let qid = (cdw10 & 0xFFFF) as u16;
                let size = (cdw10 >> 16) + 1;
                let cqid = (cdw11 >> 16) as u16;
                if qid == 0 || qid > max_q || self.sqs[usize::from(qid)].is_some() {
                    return (Status::INVALID_QUEUE_IDENTIFIER, 0);
                }
                if size < 2 || size > u32::from(self.inner.cfg.mqes) + 1 {
                    return (Status::INVALID_QUEUE_SIZE, 0);
                }
                if cqid == 0 || cqid > max_q || self.cqs[usize::from(cqid)].is_none() {
                    return (CQ_INVALID, 0);
                }
                if cdw11 & 1 == 0 || !sqe.prp1().is_multiple_of(PAGE_SIZE as u64) {
                    return (Status::INVALID_FIELD, 0);
                }
                // The doorbell may hold a stale tail from an earlier queue of this ID.
                self.inner.set_reg(sq_tail_doorbell(qid, self.inner.cfg.dstrd), 0);
                self.sqs[usize::from(qid)] = Some(FSq {
                    iova: sqe.prp1(),
                    size: size as u16,
                    cqid,
                    head: 0,
                });
                (Status::SUCCESS, 0)
            }
            opcode::admin::DELETE_SQ => {
                let qid = (cdw10 & 0xFFFF) as u16;
                if qid == 0 || qid > max_q || self.sqs[usize::from(qid)].is_none() {
                    return (Status::INVALID_QUEUE_IDENTIFIER, 0);
                }
                self.sqs[usize::from(qid)] = None;
                for p in self.pending.iter_mut().filter(|p| p.sqid == qid) {
                    p.status = Status::ABORTED_SQ_DELETION;
                }
                (Status::SUCCESS, 0)
            }
            opcode::admin::DELETE_CQ => {
                let qid = (cdw10 & 0xFFFF) as u16;
                if qid == 0 || qid > max_q || self.cqs[usize::from(qid)].is_none() {
                    return (Status::INVALID_QUEUE_IDENTIFIER, 0);
                }
                if self.sqs.iter().flatten().any(|s| s.cqid == qid) {
                    return (INVALID_QUEUE_DELETION, 0);
                }
                self.cqs[usize::from(qid)] = None;
                self.pending.retain(|p| p.cqid != qid);
                self.inner.set_reg(cq_head_doorbell(qid, self.inner.cfg.dstrd), 0);
                (Status::SUCCESS, 0)
            }
            opcode::admin::ABORT => {
                let sqid = (cdw10 & 0xFFFF) as u16;
                let cid = (cdw10 >> 16) as u16;
                match self.pending.iter_mut().find(|p| p.sqid == sqid && p.cid == cid) {
                    Some(p) => {
                        p.status = Status::ABORT_REQUESTED;
                        (Status::SUCCESS, 0)
                    }
                    None => (Status::SUCCESS, 1),
                }
            }
            _ => (Status::INVALID_OPCODE.with_dnr(), 0),
        }
    }

    fn identify(&mut self, sqe: &Sqe) -> Status {
        let cns_v = (sqe.cdw10.get() & 0xFF) as u8;
        let nsid = sqe.nsid.get();
        let mut page = vec![0u8; PAGE_SIZE];
        let ram = self.inner.ram();
        match cns_v {
            cns::CONTROLLER => {
                let mut id = nvme_id_ctrl::new_zeroed();
                id.vid = 0x1b36;
                id.ssvid = 0x1af4;
                id.sn[..8].copy_from_slice(b"FAKE0001");
                id.sn[8..].fill(b' ');
                let mn = b"pollux fake NVMe controller";
                id.mn.fill(b' ');
                id.mn[..mn.len()].copy_from_slice(mn);
                id.fr.copy_from_slice(b"1.0     ");
                id.mdts = self.inner.cfg.mdts;
                id.ver = Vs::V2_0.0;
                id.sqes = 0x66;
                id.cqes = 0x44;
                id.nn = ram.iter().map(|r| r.ns.nsid).max().unwrap_or(0);
                id.oncs = 0x8; // Write Zeroes
                page.copy_from_slice(id.as_bytes());
            }
            cns::NAMESPACE => {
                let Some(r) = ram.iter().find(|r| r.ns.nsid == nsid) else {
                    return Status::INVALID_NAMESPACE;
                };
                let mut id = nvme_id_ns::new_zeroed();
                id.nsze = r.ns.blocks;
                id.ncap = r.ns.blocks;
                id.nuse = r.ns.blocks;
                id.nlbaf = 0;
                id.flbas = 0;
                id.lbaf[0].ds = r.ns.lba_shift;
                page.copy_from_slice(id.as_bytes());
            }
            cns::ACTIVE_NAMESPACE_LIST => {
                let mut ids: Vec<u32> = ram.iter().map(|r| r.ns.nsid).filter(|&n| n > nsid).collect();
                ids.sort_unstable();
                for (i, id) in ids.iter().take(1024).enumerate() {
                    page[i * 4..i * 4 + 4].copy_from_slice(&id.to_le_bytes());
                }
            }
            _ => return Status::INVALID_FIELD,
        }
        drop(ram);
        self.transfer_out(sqe, &page)
    }

    /// Walks PRP1/PRP2 (and PRP lists) for `len` bytes (§4.1.1): the host memory segments.
    fn prp_segments(&self, sqe: &Sqe, len: usize) -> Result<Vec<(u64, usize)>, Status> {
        let ps = PAGE_SIZE as u64;
        let (prp1, prp2) = (sqe.prp1(), sqe.prp2());
        if prp1 & 3 != 0 {
            return Err(PRP_OFFSET_INVALID);
        }
        let first = len.min((ps - prp1 % ps) as usize);
        let mut segs = vec![(prp1, first)];
        let mut remaining = len - first;
        if remaining == 0 {
            return Ok(segs);
        }
        if remaining <= PAGE_SIZE {
            if prp2 % ps != 0 {
                return Err(PRP_OFFSET_INVALID);
            }
            segs.push((prp2, remaining));
            return Ok(segs);
        }
        let mut list = prp2;
        if list & 7 != 0 {
            return Err(PRP_OFFSET_INVALID);
        }
        let space = self.inner.dma.lock();
        while remaining > 0 {
            let entry = space.read_u64(list).ok_or(Status::DATA_TRANSFER_ERROR)?;
            let last_slot = list % ps == ps - 8;
            if last_slot && remaining > PAGE_SIZE {
                // The last entry of a list page points to the next list page.
                if entry % ps != 0 {
                    return Err(PRP_OFFSET_INVALID);
                }
                list = entry;
                continue;
            }
            if entry % ps != 0 {
                return Err(PRP_OFFSET_INVALID);
            }
            let n = remaining.min(PAGE_SIZE);
            segs.push((entry, n));
            remaining -= n;
            list += 8;
        }
        Ok(segs)
    }

    fn transfer_out(&self, sqe: &Sqe, data: &[u8]) -> Status {
        let segs = match self.prp_segments(sqe, data.len()) {
            Ok(s) => s,
            Err(s) => return s,
        };
        let space = self.inner.dma.lock();
        let mut done = 0;
        for (iova, n) in segs {
            if !space.write(iova, &data[done..done + n]) {
                return Status::DATA_TRANSFER_ERROR;
            }
            done += n;
        }
        Status::SUCCESS
    }

    fn io(&mut self, sqe: &Sqe) -> Status {
        let nsid = sqe.nsid.get();
        let slba = u64::from(sqe.cdw10.get()) | u64::from(sqe.cdw11.get()) << 32;
        let nlb = u64::from(sqe.cdw12.get() & 0xFFFF) + 1;
        let mut ram = self.inner.ram();
        let Some(r) = ram.iter_mut().find(|r| r.ns.nsid == nsid) else {
            return if sqe.opcode == opcode::io::FLUSH && nsid == u32::MAX {
                Status::SUCCESS
            } else {
                Status::INVALID_NAMESPACE
            };
        };
        if sqe.opcode == opcode::io::FLUSH {
            return Status::SUCCESS;
        }
        if !matches!(
            sqe.opcode,
            opcode::io::READ | opcode::io::WRITE | opcode::io::WRITE_ZEROES
        ) {
            return Status::INVALID_OPCODE.with_dnr();
        }
        if slba.checked_add(nlb).is_none_or(|e| e > r.ns.blocks) {
            return Status::LBA_OUT_OF_RANGE.with_dnr();
        }
        let off = (slba << r.ns.lba_shift) as usize;
        let len = (nlb << r.ns.lba_shift) as usize;
        if sqe.opcode == opcode::io::WRITE_ZEROES {
            r.data[off..off + len].fill(0);
            return Status::SUCCESS;
        }
        let mdts = self.inner.cfg.mdts;
        if mdts != 0 && len > PAGE_SIZE << mdts {
            return Status::INVALID_FIELD.with_dnr();
        }
        let segs = match self.prp_segments(sqe, len) {
            Ok(s) => s,
            Err(s) => return s,
        };
        let space = self.inner.dma.lock();
        let mut done = off;
        for (iova, n) in segs {
            let ok = if sqe.opcode == opcode::io::READ {
                space.write(iova, &r.data[done..done + n])
            } else {
                space.read(iova, &mut r.data[done..done + n])
            };
            if !ok {
                return Status::DATA_TRANSFER_ERROR;
            }
            done += n;
        }
        Status::SUCCESS
    }
}
