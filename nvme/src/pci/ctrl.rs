//! Controller bring-up, queue creation, reset and shutdown (NVMe 2.0 §3.5.1
//! "Memory-based Controller Initialization", §3.6.1 shutdown, §3.7.2 controller reset).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use vmm_sys_util::eventfd::EventFd;
use zerocopy::{FromBytes, FromZeros};

use super::dma::{DmaBuf, DmaRegion, PAGE_SIZE};
use super::queue::{self, CQE_SIZE, Completion, CtrlShared, QueuePair, QueueParts, QueueShared, SQE_SIZE};
use super::regs::Registers;
use super::{HOST_ABORTED, Hardware, PciError, Result};
use crate::bindings::{nvme_id_ctrl, nvme_id_ns};
use crate::spec::{Cap, Cc, Csts, Health, Sqe, cns, feature, log_page, opcode};

/// How the driver sets the controller up.
#[derive(Clone, Debug)]
pub struct ControllerConfig {
    /// I/O queue pairs to ask for (Set Features Number of Queues); one per reactor.
    pub io_queues: u16,
    /// Admin queue entries (AQA; at most 4096, NVMe 2.0 §3.1.3.8).
    pub admin_depth: u16,
    /// Upper bound on one command's transfer, below MDTS (and when MDTS is 0, unlimited).
    pub max_transfer: usize,
    /// A command not completed after this long triggers a controller reset.
    pub command_timeout: Duration,
    /// How long an admin command may take before the driver gives up on it.
    pub admin_timeout: Duration,
    /// Wire an MSI-X vector (eventfd) to each I/O CQ; false: every queue is polled.
    pub interrupts: bool,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        Self {
            io_queues: 1,
            admin_depth: 32,
            max_transfer: 1 << 20,
            command_timeout: Duration::from_secs(10),
            admin_timeout: Duration::from_secs(10),
            interrupts: true,
        }
    }
}

/// An active namespace (Identify Namespace, NVMe 2.0 §5.17.2.1; NVM Command Set 1.0 §4.1.5.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Namespace {
    /// Namespace ID.
    pub nsid: u32,
    /// Size in logical blocks (NSZE).
    pub blocks: u64,
    /// log2 of the LBA data size (LBADS of the format FLBAS selects).
    pub lba_shift: u8,
    /// The device's own Copy on this namespace and its limits, when the controller has Copy
    /// (ONCS bit 8) with source range format 0 (OCFS bit 0) and the namespace reports its
    /// limits (MSSRL and MCL non-zero).
    pub copy: Option<CopyLimits>,
}

/// The Copy limits of a namespace (Identify Namespace MSSRL, MCL, MSRC: NVM Command Set 1.0
/// §4.1.5.1, Figure 97), in logical blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyLimits {
    /// Most blocks of one source range (MSSRL).
    pub max_range_blocks: u32,
    /// Most blocks of one Copy, all ranges together (MCL).
    pub max_blocks: u64,
    /// Most source ranges of one Copy (MSRC + 1).
    pub max_ranges: u32,
}

impl Namespace {
    /// LBA data size in bytes.
    pub fn block_size(&self) -> usize {
        1 << self.lba_shift
    }

    /// Capacity in bytes.
    pub fn bytes(&self) -> u64 {
        self.blocks << self.lba_shift
    }
}

/// What Identify told about the controller.
#[derive(Clone, Debug, Default)]
pub struct ControllerInfo {
    /// PCI vendor ID.
    pub vid: u16,
    /// Serial number.
    pub serial: String,
    /// Model number.
    pub model: String,
    /// Firmware revision.
    pub firmware: String,
    /// VS register.
    pub version: u32,
    /// CAP register.
    pub cap: Cap,
    /// MDTS in bytes (`None`: no limit).
    pub mdts_bytes: Option<usize>,
    /// The transfer limit the queues use: MDTS and [`ControllerConfig::max_transfer`].
    pub max_transfer: usize,
    /// Number of namespaces (NN).
    pub nn: u32,
    /// Active namespaces with a supported format (no metadata).
    pub namespaces: Vec<Namespace>,
    /// I/O queue pairs granted by Set Features Number of Queues.
    pub io_queues: u16,
    /// MSI-X vectors wired (0: polled only).
    pub vectors: u16,
    /// A volatile write cache is present (VWC bit 0): writes are durable after a Flush.
    pub volatile_write_cache: bool,
    /// Optional NVM Command Support (ONCS): bit 2 Dataset Management, bit 3 Write Zeroes,
    /// bit 8 Copy.
    pub oncs: u16,
    /// Optional Copy Formats Supported (OCFS): bit 0 source range format 0.
    pub ocfs: u16,
}

/// What [`Controller::service`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServiceOutcome {
    /// A reset was done (CSTS.CFS, or a queue's command timeout).
    pub reset: bool,
    /// I/O queues created again after a reset.
    pub recreated: usize,
    /// I/O queues still waiting for their owner to acknowledge a reset.
    pub pending: usize,
}

/// An NVMe controller behind a PCI function, brought up and owning the admin queue.
///
/// I/O queue pairs are created with [`create_io_queue_pair`](Self::create_io_queue_pair) and
/// handed to their threads. The thread owning the controller calls
/// [`service`](Self::service) now and then (e.g. every 10-100 ms): it watches CSTS.CFS and
/// the queues' timeouts, resets the controller and recreates queues after a reset.
pub struct Controller {
    hw: Hardware,
    regs: Registers,
    cfg: ControllerConfig,
    admin: QueuePair,
    scratch: Arc<DmaRegion>,
    shared: Arc<CtrlShared>,
    queues: Vec<Arc<QueueShared>>,
    vectors: Vec<Arc<EventFd>>,
    info: ControllerInfo,
    next_tag: u64,
    ready_timeout: Duration,
    shut_down: bool,
}

impl std::fmt::Debug for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller")
            .field("hw", &self.hw.name)
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

const ADMIN_MAX_XFER: usize = 16 * PAGE_SIZE;
/// ONCS bit 8: Copy supported (Identify Controller, NVMe 2.0 §5.17.2.1).
pub const ONCS_COPY: u16 = 1 << 8;
/// OCFS bit 0: Copy source range format 0 supported.
pub const OCFS_FORMAT_0: u16 = 1 << 0;

fn ascii(b: &[u8]) -> String {
    String::from_utf8_lossy(b).trim_end_matches([' ', '\0']).to_string()
}

impl Controller {
    /// Brings the controller up (NVMe 2.0 §3.5.1): disable and wait CSTS.RDY=0, admin queues (AQA,
    /// ASQ, ACQ), CC (NVM command set, 4 KiB pages, 64/16-byte entries), enable and wait
    /// CSTS.RDY=1 within CAP.TO, Identify Controller, the active namespaces, Set Features
    /// Number of Queues, MSI-X vectors.
    pub fn new(hw: Hardware, cfg: ControllerConfig) -> Result<Self> {
        let regs = Registers::new(hw.regs.clone());
        let cap = regs.cap();
        let name = hw.name.clone();
        if cap.0 == u64::MAX {
            return Err(PciError::Unsupported {
                name,
                what: "CAP reads all ones: the device is gone".into(),
            });
        }
        if cap.css() & Cap::CSS_NVM == 0 {
            return Err(PciError::Unsupported {
                name,
                what: format!("CAP.CSS {:#x} lacks the NVM command set", cap.css()),
            });
        }
        if cap.mpsmin() > 0 {
            return Err(PciError::Unsupported {
                name,
                what: format!("CAP.MPSMIN {} (4 KiB pages needed)", cap.mpsmin()),
            });
        }
        if !(2..=4096).contains(&cfg.admin_depth) {
            return Err(PciError::Invalid(format!(
                "admin depth {} not in 2..=4096",
                cfg.admin_depth
            )));
        }
        let admin_depth = cfg.admin_depth.min(cap.mqes().saturating_add(1));
        // CAP.TO: worst case time to wait for CSTS.RDY to change, in 500 ms units.
        let ready_timeout = Duration::from_millis(500 * u64::from(cap.to().max(1)));
        let dma = hw.dma.clone();
        let sq = Arc::new(dma.allocate(usize::from(admin_depth) * SQE_SIZE)?);
        let cq = Arc::new(dma.allocate(usize::from(admin_depth) * CQE_SIZE)?);
        let list_pages = queue::list_pages_for(ADMIN_MAX_XFER);
        let pool = Arc::new(dma.allocate(usize::from(admin_depth) * list_pages * PAGE_SIZE)?);
        let scratch = Arc::new(dma.allocate(PAGE_SIZE)?);
        let shared_q = Arc::new(QueueShared {
            qid: 0,
            depth: admin_depth,
            vector: None,
            sq,
            cq,
            acked_gen: 0.into(),
            live_gen: 0.into(),
            dropped: false.into(),
            graveyard: Default::default(),
        });
        let admin = QueuePair::new(QueueParts {
            name: format!("{name} admin").into(),
            shared: shared_q,
            doorbells: regs.doorbells(0),
            prp_pool: pool,
            list_pages,
            max_xfer: ADMIN_MAX_XFER,
            timeout: cfg.admin_timeout,
            eventfd: None,
            ctrl: None,
        });
        let mut c = Self {
            hw,
            regs,
            cfg,
            admin,
            scratch,
            shared: Arc::default(),
            queues: Vec::new(),
            vectors: Vec::new(),
            info: ControllerInfo {
                cap,
                ..Default::default()
            },
            next_tag: 0,
            ready_timeout,
            shut_down: false,
        };
        c.bring_up()?;
        if c.cfg.interrupts {
            let want = (c.info.io_queues + 1).min(c.hw.irqs.max_vectors());
            if want > 0 {
                c.vectors = c.hw.irqs.enable(want)?;
            }
            c.info.vectors = c.vectors.len() as u16;
        }
        Ok(c)
    }

    /// The function's name (BDF).
    pub fn name(&self) -> &str {
        &self.hw.name
    }

    /// What Identify said.
    pub fn info(&self) -> &ControllerInfo {
        &self.info
    }

    /// The active namespaces.
    pub fn namespaces(&self) -> &[Namespace] {
        &self.info.namespaces
    }

    /// The typed registers.
    pub fn registers(&self) -> &Registers {
        &self.regs
    }

    /// Disable, admin queue, enable, Identify, Number of Queues.
    fn bring_up(&mut self) -> Result<()> {
        // NVMe 2.0 §3.5.1 steps 1-2: CC.EN = 0, wait for CSTS.RDY = 0.
        self.disable()?;
        // Step 3: the admin queue (AQA, ASQ, ACQ).
        self.admin.reset_rings();
        let (sq, cq, depth) = {
            let s = self.admin_shared();
            (s.sq.iova(), s.cq.iova(), s.depth)
        };
        self.regs.set_aqa(depth, depth);
        self.regs.set_asq(sq);
        self.regs.set_acq(cq);
        // Steps 4-5: CC: NVM command set, MPS 0 (4 KiB), round robin, IOSQES 6, IOCQES 4;
        // then CC.EN = 1.
        let cc = Cc::default()
            .with_css(Cc::CSS_NVM)
            .with_mps(0)
            .with_ams(0)
            .with_shn(Cc::SHN_NONE)
            .with_iosqes(6)
            .with_iocqes(4);
        self.regs.set_cc(cc);
        self.regs.set_cc(cc.with_en(true));
        // Step 6: wait for CSTS.RDY = 1 (CAP.TO).
        self.wait_csts("RDY=1", |c| c.rdy())?;
        self.info.version = self.regs.vs();
        // Step 7: Identify Controller; the active namespaces and each one.
        self.identify()?;
        // Step 8: Set Features Number of Queues.
        let n = self.cfg.io_queues.max(1) - 1;
        let mut sqe = Sqe::new_zeroed();
        sqe.opcode = opcode::admin::SET_FEATURES;
        sqe.cdw10.set(u32::from(feature::NUMBER_OF_QUEUES));
        sqe.cdw11.set((u32::from(n) << 16) | u32::from(n));
        let c = self.admin_command(sqe, None, "Set Features Number of Queues")?;
        let (nsqa, ncqa) = (c.result & 0xFFFF, c.result >> 16);
        self.info.io_queues = (nsqa.min(ncqa) + 1).min(u32::from(self.cfg.io_queues.max(1))) as u16;
        tracing::info!(ctrl = %self.hw.name, model = %self.info.model, serial = %self.info.serial,
            namespaces = self.info.namespaces.len(), io_queues = self.info.io_queues,
            max_transfer = self.info.max_transfer, "NVMe controller ready");
        Ok(())
    }

    fn admin_shared(&self) -> Arc<QueueShared> {
        self.admin.shared()
    }

    fn identify(&mut self) -> Result<()> {
        let mut raw = vec![0u8; PAGE_SIZE];
        self.identify_into(cns::CONTROLLER, 0, &mut raw, "Identify Controller")?;
        let id = nvme_id_ctrl::read_from_bytes(&raw).map_err(|_| PciError::Invalid("Identify size".into()))?;
        let cap = self.info.cap;
        let page_min = PAGE_SIZE << cap.mpsmin();
        self.info.vid = id.vid;
        self.info.serial = ascii(&id.sn);
        self.info.model = ascii(&id.mn);
        self.info.firmware = ascii(&id.fr);
        self.info.nn = id.nn;
        self.info.volatile_write_cache = id.vwc & 1 != 0;
        self.info.oncs = id.oncs;
        self.info.ocfs = id.ocfs;
        let has_copy = id.oncs & ONCS_COPY != 0 && id.ocfs & OCFS_FORMAT_0 != 0;
        // MDTS (byte 77): 2^MDTS units of CAP.MPSMIN pages; 0 = no limit.
        self.info.mdts_bytes = (id.mdts != 0).then(|| page_min << id.mdts);
        let lim = self.info.mdts_bytes.unwrap_or(usize::MAX).min(self.cfg.max_transfer);
        self.info.max_transfer = (lim / PAGE_SIZE).max(1) * PAGE_SIZE;

        self.identify_into(
            cns::ACTIVE_NAMESPACE_LIST,
            0,
            &mut raw,
            "Identify Active Namespace List",
        )?;
        let ids: Vec<u32> = raw
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .take_while(|&n| n != 0)
            .collect();
        let mut namespaces = Vec::new();
        for nsid in ids {
            self.identify_into(cns::NAMESPACE, nsid, &mut raw, "Identify Namespace")?;
            let ns = nvme_id_ns::read_from_bytes(&raw).map_err(|_| PciError::Invalid("Identify size".into()))?;
            // FLBAS bits 3:0 (and 6:5 above 16 formats) select the LBA format.
            let idx = usize::from(ns.flbas & 0xF) | (usize::from((ns.flbas >> 5) & 0x3) << 4);
            let lbaf = ns.lbaf[idx.min(63)];
            if ns.nsze == 0 || lbaf.ds < 9 {
                continue;
            }
            if lbaf.ms != 0 {
                tracing::warn!(ctrl = %self.hw.name, nsid, ms = lbaf.ms, "namespace with metadata: not supported, skipped");
                continue;
            }
            let copy = (has_copy && ns.mssrl != 0 && ns.mcl != 0).then(|| CopyLimits {
                max_range_blocks: u32::from(ns.mssrl),
                max_blocks: u64::from(ns.mcl),
                max_ranges: u32::from(ns.msrc) + 1,
            });
            namespaces.push(Namespace {
                nsid,
                blocks: ns.nsze,
                lba_shift: lbaf.ds,
                copy,
            });
        }
        self.info.namespaces = namespaces;
        Ok(())
    }

    fn identify_into(&mut self, cns: u8, nsid: u32, out: &mut [u8], what: &'static str) -> Result<()> {
        let mut sqe = Sqe::new_zeroed();
        sqe.opcode = opcode::admin::IDENTIFY;
        sqe.nsid.set(nsid);
        sqe.cdw10.set(u32::from(cns));
        self.scratch.fill(0, PAGE_SIZE, 0);
        let buf = DmaBuf::new(self.scratch.clone(), 0, PAGE_SIZE);
        self.admin_command(sqe, buf, what)?;
        self.scratch.read_bytes(0, out);
        Ok(())
    }

    /// Runs one admin command to completion (polling), with the admin timeout. A non-success
    /// status is an error naming the command.
    pub fn admin_command(&mut self, sqe: Sqe, buf: Option<DmaBuf>, what: &'static str) -> Result<Completion> {
        let tag = self.next_tag;
        self.next_tag += 1;
        let name = self.hw.name.clone();
        let op = sqe.opcode;
        self.admin.submit_raw(sqe, buf, tag).map_err(|error| PciError::Queue {
            name: name.clone(),
            error,
        })?;
        self.admin.flush();
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            let mut got = None;
            self.admin.poll(|c| {
                if c.tag == tag {
                    got = Some(c);
                }
            });
            if let Some(c) = got {
                if !c.status.is_success() {
                    return Err(PciError::CommandFailed {
                        name,
                        opcode: op,
                        what,
                        status: c.status,
                    });
                }
                return Ok(c);
            }
            spins += 1;
            if spins.is_multiple_of(64) {
                let csts = self.regs.csts();
                if csts.cfs() {
                    return Err(PciError::ControllerFatal { name, csts: csts.0 });
                }
                if start.elapsed() > self.cfg.admin_timeout {
                    return Err(PciError::CommandTimeout {
                        name,
                        opcode: op,
                        what,
                        waited: start.elapsed(),
                    });
                }
            }
            if spins > 1024 {
                std::thread::sleep(Duration::from_micros(50));
            } else {
                std::hint::spin_loop();
            }
        }
    }

    /// Waits until CSTS satisfies `ok`, within CAP.TO; CSTS.CFS ends the wait with an error.
    fn wait_csts(&self, awaited: &'static str, ok: impl Fn(Csts) -> bool) -> Result<Csts> {
        let start = Instant::now();
        loop {
            let csts = self.regs.csts();
            if csts.0 != u32::MAX && ok(csts) {
                return Ok(csts);
            }
            if csts.0 != u32::MAX && csts.cfs() && awaited != "RDY=0" {
                return Err(PciError::ControllerFatal {
                    name: self.hw.name.clone(),
                    csts: csts.0,
                });
            }
            if start.elapsed() > self.ready_timeout {
                return Err(PciError::RegisterTimeout {
                    name: self.hw.name.clone(),
                    register: "CSTS",
                    awaited,
                    waited: start.elapsed(),
                    last: csts.0,
                });
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    /// CC.EN = 0 and wait for CSTS.RDY = 0 (NVMe 2.0 §3.7.2): the controller stops, forgets its
    /// queues and no longer touches host memory.
    fn disable(&self) -> Result<()> {
        let cc = self.regs.cc();
        if cc.en() {
            self.regs.set_cc(cc.with_en(false));
        }
        self.wait_csts("RDY=0", |c| !c.rdy()).map(drop)
    }

    /// Creates an I/O queue pair of `depth` entries (clamped to 2..=CAP.MQES+1): Create I/O
    /// Completion Queue (interrupts enabled on its own MSI-X vector when there is one), then
    /// Create I/O Submission Queue (NVMe 2.0 §5.4, NVMe 2.0 §5.5).
    pub fn create_io_queue_pair(&mut self, depth: u16) -> Result<QueuePair> {
        self.reap_dropped();
        let granted = self.info.io_queues;
        let qid = (1..=granted)
            .find(|q| !self.queues.iter().any(|s| s.qid == *q))
            .ok_or_else(|| PciError::NoQueueLeft {
                name: self.hw.name.clone(),
                granted,
            })?;
        let depth = depth.clamp(2, self.info.cap.mqes().saturating_add(1).max(2));
        let dma = self.hw.dma.clone();
        let sq = Arc::new(dma.allocate(usize::from(depth) * SQE_SIZE)?);
        let cq = Arc::new(dma.allocate(usize::from(depth) * CQE_SIZE)?);
        let vector = (usize::from(qid) < self.vectors.len()).then_some(qid);
        let generation = self.shared.generation.load(Ordering::Acquire);
        let shared = Arc::new(QueueShared {
            qid,
            depth,
            vector,
            sq,
            cq,
            acked_gen: generation.into(),
            live_gen: generation.into(),
            dropped: false.into(),
            graveyard: Default::default(),
        });
        self.create_on_device(&shared)?;
        self.queues.push(shared.clone());
        let max_xfer = self.info.max_transfer;
        let list_pages = queue::list_pages_for(max_xfer);
        let pool = Arc::new(dma.allocate(usize::from(depth) * list_pages * PAGE_SIZE)?);
        Ok(QueuePair::new(QueueParts {
            name: format!("{} q{qid}", self.hw.name).into(),
            shared,
            doorbells: self.regs.doorbells(qid),
            prp_pool: pool,
            list_pages,
            max_xfer,
            timeout: self.cfg.command_timeout,
            eventfd: vector.map(|v| self.vectors[usize::from(v)].clone()),
            ctrl: Some(self.shared.clone()),
        }))
    }

    fn create_on_device(&mut self, q: &QueueShared) -> Result<()> {
        let qsize = (u32::from(q.depth) - 1) << 16 | u32::from(q.qid);
        let mut sqe = Sqe::new_zeroed();
        sqe.opcode = opcode::admin::CREATE_CQ;
        sqe.set_prps(q.cq.iova(), 0);
        sqe.cdw10.set(qsize);
        // CDW11: IV (31:16), IEN (bit 1), PC (bit 0): rings are physically contiguous.
        let (ien, iv) = q.vector.map_or((0, 0), |v| (1u32, u32::from(v)));
        sqe.cdw11.set((iv << 16) | (ien << 1) | 1);
        self.admin_command(sqe, None, "Create I/O Completion Queue")?;
        let mut sqe = Sqe::new_zeroed();
        sqe.opcode = opcode::admin::CREATE_SQ;
        sqe.set_prps(q.sq.iova(), 0);
        sqe.cdw10.set(qsize);
        // CDW11: CQID (31:16), QPRIO (2:1) = 0, PC (bit 0).
        sqe.cdw11.set((u32::from(q.qid) << 16) | 1);
        if let Err(e) = self.admin_command(sqe, None, "Create I/O Submission Queue") {
            let _ = self.delete_queue(q.qid, opcode::admin::DELETE_CQ, "Delete I/O Completion Queue");
            return Err(e);
        }
        Ok(())
    }

    fn delete_queue(&mut self, qid: u16, op: u8, what: &'static str) -> Result<()> {
        let mut sqe = Sqe::new_zeroed();
        sqe.opcode = op;
        sqe.cdw10.set(u32::from(qid));
        self.admin_command(sqe, None, what).map(drop)
    }

    /// Deletes an I/O queue pair from the device (SQ first, then CQ, NVMe 2.0 §3.3.1.3). Its commands
    /// still in flight are aborted by the device.
    pub fn delete_io_queue_pair(&mut self, qp: QueuePair) -> Result<()> {
        let qid = qp.qid();
        drop(qp);
        self.reap_dropped();
        if self.queues.iter().any(|q| q.qid == qid) {
            return Err(PciError::Invalid(format!("queue {qid} could not be deleted")));
        }
        Ok(())
    }

    /// Deletes the queues whose QueuePair was dropped.
    fn reap_dropped(&mut self) {
        let generation = self.shared.generation.load(Ordering::Acquire);
        let dropped: Vec<Arc<QueueShared>> = self
            .queues
            .iter()
            .filter(|q| q.dropped.load(Ordering::Acquire))
            .cloned()
            .collect();
        for q in dropped {
            if q.live_gen.load(Ordering::Acquire) == generation {
                let a = self.delete_queue(q.qid, opcode::admin::DELETE_SQ, "Delete I/O Submission Queue");
                let b = self.delete_queue(q.qid, opcode::admin::DELETE_CQ, "Delete I/O Completion Queue");
                if let Err(e) = a.and(b) {
                    tracing::warn!(ctrl = %self.hw.name, qid = q.qid, "deleting a dropped queue: {e}");
                    continue; // keep its buffers: the device may still reach them
                }
            }
            q.graveyard.lock().unwrap_or_else(|p| p.into_inner()).clear();
            self.queues.retain(|x| !Arc::ptr_eq(x, &q));
        }
    }

    /// Periodic housekeeping, on the thread owning the controller: resets the controller on
    /// CSTS.CFS or a queue's command timeout, creates again the queues whose owners have
    /// acknowledged a reset, deletes dropped queues.
    pub fn service(&mut self) -> Result<ServiceOutcome> {
        let mut out = ServiceOutcome::default();
        let csts = self.regs.csts();
        let fatal = csts.0 == u32::MAX || csts.cfs();
        if fatal || self.shared.reset_requested.swap(false, Ordering::AcqRel) {
            if fatal {
                tracing::error!(ctrl = %self.hw.name, csts = csts.0, "controller fatal status: resetting");
            }
            self.reset()?;
            out.reset = true;
        }
        self.reap_dropped();
        let (r, p) = self.recreate_acked()?;
        out.recreated += r;
        out.pending = p;
        Ok(out)
    }

    /// Resets the controller (NVMe 2.0 §3.7.2): CC.EN = 0 and CSTS.RDY = 0 (the device stops and
    /// forgets its queues), every in-flight command fails with [`HOST_ABORTED`] (each queue
    /// pair does it for its own on its next call), then bring-up again. I/O queues are
    /// created again here when their owners have already acknowledged, else by a later
    /// [`service`](Self::service).
    pub fn reset(&mut self) -> Result<()> {
        tracing::warn!(ctrl = %self.hw.name, "controller reset");
        self.disable()?;
        // The device no longer runs any queue: a new generation tells the queue pairs.
        self.shared.generation.fetch_add(1, Ordering::AcqRel);
        self.shared.reset_requested.store(false, Ordering::Release);
        self.admin.abort_all(HOST_ABORTED);
        drop(self.admin.take_failed());
        for q in &self.queues {
            q.graveyard.lock().unwrap_or_else(|p| p.into_inner()).clear();
        }
        self.queues.retain(|q| !q.dropped.load(Ordering::Acquire));
        let granted = self.info.io_queues;
        self.bring_up()?;
        if self.info.io_queues < granted {
            tracing::warn!(ctrl = %self.hw.name, before = granted, now = self.info.io_queues, "fewer I/O queues granted after reset");
        }
        self.recreate_acked()?;
        Ok(())
    }

    /// Creates on the device the queues of an earlier generation whose owners acknowledged
    /// the current one; returns (created, still pending).
    fn recreate_acked(&mut self) -> Result<(usize, usize)> {
        let generation = self.shared.generation.load(Ordering::Acquire);
        let (mut done, mut pending) = (0, 0);
        for q in self.queues.clone() {
            if q.live_gen.load(Ordering::Acquire) == generation {
                continue;
            }
            if q.acked_gen.load(Ordering::Acquire) != generation {
                pending += 1;
                continue;
            }
            self.create_on_device(&q)?;
            q.live_gen.store(generation, Ordering::Release);
            done += 1;
        }
        Ok((done, pending))
    }

    /// SMART / Health Information of the whole controller (Get Log Page 02h, NSID FFFFFFFFh:
    /// NVMe 2.0 §5.16.1.3).
    pub fn smart_health(&mut self) -> Result<Health> {
        let mut sqe = Sqe::new_zeroed();
        sqe.opcode = opcode::admin::GET_LOG_PAGE;
        sqe.nsid.set(u32::MAX);
        // NUMDL (bits 31:16) is 0's based: 128 dwords.
        sqe.cdw10.set(u32::from(log_page::SMART) | (127 << 16));
        self.scratch.fill(0, 512, 0);
        let buf = DmaBuf::new(self.scratch.clone(), 0, 512);
        self.admin_command(sqe, buf, "Get Log Page SMART")?;
        let mut page = [0u8; 512];
        self.scratch.read_bytes(0, &mut page);
        Health::parse(&page).ok_or_else(|| PciError::Invalid("SMART page size".into()))
    }

    /// Aborts command `cid` of SQ `qid` (Abort, NVMe 2.0 §5.1); true when the controller says it
    /// aborted it (DW0 bit 0 = 0).
    pub fn abort(&mut self, qid: u16, cid: u16) -> Result<bool> {
        let mut sqe = Sqe::new_zeroed();
        sqe.opcode = opcode::admin::ABORT;
        sqe.cdw10.set((u32::from(cid) << 16) | u32::from(qid));
        Ok(self.admin_command(sqe, None, "Abort")?.result & 1 == 0)
    }

    /// Orderly shutdown (NVMe 2.0 §3.6.1): deletes the I/O queues (SQ, then CQ), writes CC.SHN = 01b
    /// and waits for CSTS.SHST = 10b. Drop the queue pairs first: queues still owned are
    /// deleted under their owners.
    pub fn shutdown(mut self) -> Result<()> {
        for q in std::mem::take(&mut self.queues) {
            let a = self.delete_queue(q.qid, opcode::admin::DELETE_SQ, "Delete I/O Submission Queue");
            let b = self.delete_queue(q.qid, opcode::admin::DELETE_CQ, "Delete I/O Completion Queue");
            if let Err(e) = a.and(b) {
                tracing::warn!(ctrl = %self.hw.name, qid = q.qid, "shutdown: {e}");
            }
        }
        let cc = self.regs.cc();
        self.regs.set_cc(cc.with_shn(Cc::SHN_NORMAL));
        let r = self.wait_csts("SHST=10b", |c| c.shst() == Csts::SHST_COMPLETE);
        self.shut_down = true;
        let _ = self.hw.irqs.disable();
        r.map(drop)
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        if !self.shut_down {
            // No DMA into memory about to be freed: stop the device.
            let cc = self.regs.cc();
            if cc.en() {
                self.regs.set_cc(cc.with_en(false));
                let _ = self.wait_csts("RDY=0", |c| !c.rdy());
            }
            let _ = self.hw.irqs.disable();
        }
    }
}
