//! I/O (and admin) queue pairs: one submission queue and its completion queue, owned by one
//! thread (a reactor), without locks.
//!
//! - Submission writes SQEs into the SQ ring in DMA memory and rings the tail doorbell once
//!   per batch ([`QueuePair::flush`], also done by [`QueuePair::poll`]).
//! - Completion is found by the phase tag (NVMe 2.0 §4.6, NVMe 2.0 §3.3.1.2.2: the controller inverts the phase
//!   it writes on each pass through the CQ), read with volatile loads; the CQ head doorbell
//!   is written once per poll that consumed entries.
//! - Data pointers are PRPs (NVMe 2.0 §4.1.1) with per-command PRP list pages from the queue's pool.
//! - A request larger than the per-command limit (MDTS, Identify Controller byte 77) is split
//!   into several commands and completes when all of them have.
//! - After a controller reset ([`super::Controller::reset`]) the queue fails its in-flight
//!   requests with [`super::HOST_ABORTED`] on its next call and waits for the controller to
//!   create it again.

mod request;

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vmm_sys_util::eventfd::EventFd;
use zerocopy::{FromZeros, IntoBytes};

use super::HOST_ABORTED;
use super::dma::{DmaBuf, DmaRegion, PAGE_SIZE};
use super::prp::{self, ListPages};
use super::regs::Doorbell;
use crate::spec::{Sqe, Status, opcode};

pub use request::{Completion, IoRequest, QueueError, QueueStats, Rejected};

/// SQE size (CC.IOSQES = 6).
pub const SQE_SIZE: usize = 64;
/// CQE size (CC.IOCQES = 4).
pub const CQE_SIZE: usize = 16;
/// Most blocks one Read/Write/Write Zeroes can name (NLB is 16 bits, 0's based).
pub const MAX_NLB: u64 = 1 << 16;
/// Bytes of one Copy source range entry, format 0 (NVM Command Set 1.0 §3.2.2.1).
pub const COPY_ENTRY: usize = 32;

/// State shared by the controller and a queue pair: atomics, and a lock only on the rare
/// paths (a queue dropped with commands in flight).
#[derive(Debug)]
pub(crate) struct QueueShared {
    pub qid: u16,
    pub depth: u16,
    pub vector: Option<u16>,
    pub sq: Arc<DmaRegion>,
    pub cq: Arc<DmaRegion>,
    /// The reset generation whose in-flight commands the queue has failed (and whose rings it
    /// has cleared): the controller may create it on the device again.
    pub acked_gen: AtomicU64,
    /// The generation in which the controller last created the queue on the device.
    pub live_gen: AtomicU64,
    /// The QueuePair was dropped: the controller deletes the queue.
    pub dropped: AtomicBool,
    /// Buffers of commands in flight when the queue was dropped, freed once the device can
    /// no longer reach them (queue deleted or controller disabled).
    pub graveyard: Mutex<Vec<DmaBuf>>,
}

/// Controller-wide state the queue pairs watch.
#[derive(Debug, Default)]
pub(crate) struct CtrlShared {
    /// Bumped after each controller disable of a reset.
    pub generation: AtomicU64,
    /// A queue saw a command time out.
    pub reset_requested: AtomicBool,
}

#[derive(Clone, Copy, Debug)]
struct Slot {
    req: u32,
    submitted: Instant,
}

const FREE: u32 = u32::MAX;

#[derive(Debug)]
struct Req {
    tag: u64,
    remaining: u16,
    commands: u16,
    status: Status,
    result: u32,
    submitted: Instant,
    buf: Option<DmaBuf>,
}

/// One SQ/CQ pair. Owned by one thread; `Send` so it can be moved to its reactor.
pub struct QueuePair {
    name: Arc<str>,
    qid: u16,
    depth: u16,
    sq: Arc<DmaRegion>,
    cq: Arc<DmaRegion>,
    sq_db: Doorbell,
    cq_db: Doorbell,
    sq_tail: u16,
    sq_head: u16,
    cq_head: u16,
    phase: bool,
    unrung: u16,
    free_cids: Vec<u16>,
    slots: Box<[Slot]>,
    reqs: Vec<Req>,
    free_reqs: Vec<u32>,
    prp_pool: Arc<DmaRegion>,
    list_pages: usize,
    max_xfer: usize,
    timeout: Duration,
    next_timeout_check: Option<Instant>,
    eventfd: Option<Arc<EventFd>>,
    shared: Arc<QueueShared>,
    ctrl: Option<Arc<CtrlShared>>,
    generation: u64,
    live: bool,
    failed: VecDeque<Completion>,
    inflight: usize,
    timed_out: bool,
    stats: QueueStats,
}

impl std::fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueuePair")
            .field("name", &self.name)
            .field("qid", &self.qid)
            .field("depth", &self.depth)
            .field("inflight", &self.inflight)
            .field("live", &self.live)
            .finish_non_exhaustive()
    }
}

/// What the controller hands over to build a queue pair.
pub(crate) struct QueueParts {
    pub name: Arc<str>,
    pub shared: Arc<QueueShared>,
    pub doorbells: (Doorbell, Doorbell),
    pub prp_pool: Arc<DmaRegion>,
    pub list_pages: usize,
    pub max_xfer: usize,
    pub timeout: Duration,
    pub eventfd: Option<Arc<EventFd>>,
    pub ctrl: Option<Arc<CtrlShared>>,
}

/// PRP list pages a command needs at most for transfers up to `max_xfer` bytes.
pub(crate) fn list_pages_for(max_xfer: usize) -> usize {
    prp::list_pages_needed(max_xfer / PAGE_SIZE + 1).max(1)
}

impl QueuePair {
    pub(crate) fn new(p: QueueParts) -> Self {
        let depth = p.shared.depth;
        let now = Instant::now();
        let generation = p.ctrl.as_ref().map_or(0, |c| c.generation.load(Ordering::Acquire));
        Self {
            name: p.name,
            qid: p.shared.qid,
            depth,
            sq: p.shared.sq.clone(),
            cq: p.shared.cq.clone(),
            sq_db: p.doorbells.0,
            cq_db: p.doorbells.1,
            sq_tail: 0,
            sq_head: 0,
            cq_head: 0,
            phase: true,
            unrung: 0,
            free_cids: (0..depth - 1).rev().collect(),
            slots: vec![
                Slot {
                    req: FREE,
                    submitted: now
                };
                usize::from(depth)
            ]
            .into_boxed_slice(),
            reqs: Vec::with_capacity(usize::from(depth)),
            free_reqs: Vec::with_capacity(usize::from(depth)),
            prp_pool: p.prp_pool,
            list_pages: p.list_pages,
            max_xfer: p.max_xfer,
            timeout: p.timeout,
            next_timeout_check: None,
            eventfd: p.eventfd,
            shared: p.shared,
            ctrl: p.ctrl,
            generation,
            live: true,
            failed: VecDeque::new(),
            inflight: 0,
            timed_out: false,
            stats: QueueStats::default(),
        }
    }

    /// Queue identifier (0: admin).
    pub fn qid(&self) -> u16 {
        self.qid
    }

    /// Entries in each ring; at most `depth - 1` commands are in flight.
    pub fn depth(&self) -> u16 {
        self.depth
    }

    /// Most bytes one command transfers (MDTS, or the configured limit).
    pub fn max_transfer(&self) -> usize {
        self.max_xfer
    }

    /// The CIDs of the device commands in flight for request `tag` (for Abort: NVMe 2.0 §5.1).
    pub fn cids_of(&self, tag: u64) -> Vec<u16> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.req != FREE && self.reqs.get(s.req as usize).is_some_and(|r| r.tag == tag))
            .map(|(cid, _)| cid as u16)
            .collect()
    }

    /// Commands in flight (submitted or staged, not completed).
    pub fn inflight(&self) -> usize {
        self.inflight
    }

    /// Free command slots.
    pub fn free_slots(&self) -> usize {
        self.free_cids.len()
    }

    /// Counters.
    pub fn stats(&self) -> QueueStats {
        self.stats
    }

    /// The eventfd of this queue's MSI-X vector, for interrupt mode: register it with the
    /// reactor, read it to drain, then [`poll`](Self::poll). `None` for a polled-only queue.
    pub fn eventfd(&self) -> Option<RawFd> {
        self.eventfd.as_ref().map(|e| e.as_raw_fd())
    }

    /// Drains the eventfd's counter (non-blocking); returns the interrupts counted.
    pub fn ack_interrupts(&self) -> u64 {
        self.eventfd.as_ref().and_then(|e| e.read().ok()).unwrap_or(0)
    }

    /// Submission time of the oldest command in flight: with a latency estimate it tells the
    /// reactor when the next completion is due (hybrid mode). `None` when idle.
    pub fn oldest_submitted(&self) -> Option<Instant> {
        if self.inflight == 0 {
            return None;
        }
        self.slots.iter().filter(|s| s.req != FREE).map(|s| s.submitted).min()
    }

    /// When the next completion is expected, given the typical device latency (the reactor's
    /// latency model): oldest submission + `typical`. `None` when idle.
    pub fn next_expected(&self, typical: Duration) -> Option<Instant> {
        self.oldest_submitted().map(|t| t + typical)
    }

    /// Whether a command of this queue exceeded the command timeout (a controller reset has
    /// been requested; see [`super::Controller::service`]).
    pub fn timed_out(&self) -> bool {
        self.timed_out
    }

    /// Whether the queue takes commands (false while the controller resets).
    pub fn is_live(&mut self) -> bool {
        self.sync_gen();
        self.live
    }

    /// Stages a block request: writes its command(s) into the SQ without ringing the doorbell
    /// (see [`flush`](Self::flush)). All or nothing: a rejected request left no command.
    pub fn submit(&mut self, req: IoRequest) -> Result<(), Rejected> {
        let reject = |error, request| {
            Err(Rejected {
                error,
                request: Box::new(request),
            })
        };
        self.sync_gen();
        if !self.live {
            return reject(QueueError::Resetting, req);
        }
        if req.opcode == opcode::io::COPY {
            return self.submit_copy(req);
        }
        let data = matches!(req.opcode, opcode::io::READ | opcode::io::WRITE);
        let bytes = req.blocks << req.lba_shift;
        if data {
            let Some(buf) = &req.buf else {
                return reject(QueueError::Invalid("no buffer"), req);
            };
            if req.blocks == 0 || buf.len() as u64 != bytes {
                return reject(QueueError::Invalid("buffer length is not blocks << lba_shift"), req);
            }
            if buf.iova() & 3 != 0 {
                return reject(QueueError::Invalid("buffer not dword aligned"), req);
            }
        } else if req.opcode == opcode::io::WRITE_ZEROES && req.blocks == 0 {
            return reject(QueueError::Invalid("Write Zeroes of 0 blocks"), req);
        }
        // Blocks per command: MDTS for data commands, the 16-bit NLB for all.
        let per_cmd = if data {
            ((self.max_xfer >> req.lba_shift) as u64).clamp(1, MAX_NLB)
        } else {
            MAX_NLB
        };
        let needed = if req.opcode == opcode::io::FLUSH {
            1
        } else {
            req.blocks.div_ceil(per_cmd) as usize
        };
        if needed > usize::from(self.depth) - 1 {
            return reject(
                QueueError::TooLarge {
                    needed,
                    depth: usize::from(self.depth) - 1,
                },
                req,
            );
        }
        if needed > self.free_cids.len() {
            return reject(
                QueueError::Full {
                    needed,
                    free: self.free_cids.len(),
                },
                req,
            );
        }
        let now = Instant::now();
        let r = self.new_req(req.tag, needed as u16, now, req.buf.clone());
        let mut done = 0u64;
        for _ in 0..needed {
            let n = if req.opcode == opcode::io::FLUSH {
                0
            } else {
                per_cmd.min(req.blocks - done)
            };
            let mut sqe = Sqe::new_zeroed();
            sqe.opcode = req.opcode;
            sqe.nsid.set(req.nsid);
            let slba = req.slba + done;
            sqe.cdw10.set(slba as u32);
            sqe.cdw11.set((slba >> 32) as u32);
            let nlb = if n > 0 { (n - 1) as u32 } else { 0 };
            sqe.cdw12.set(nlb | (req.cdw12_flags & !0xFFFF));
            let xfer = req
                .buf
                .as_ref()
                .filter(|_| data)
                .map(|b| (b.iova() + (done << req.lba_shift), (n << req.lba_shift) as usize));
            // Cannot fail: alignment checked above, list pages sized for max_xfer.
            if let Err(e) = self.push(sqe, xfer, r, now) {
                tracing::error!(queue = %self.name, qid = self.qid, "PRP build failed: {e}");
            }
            done += n;
        }
        self.stats.requests += 1;
        Ok(())
    }

    /// A Copy: one command, NR (CDW12 7:0, 0's based) from `blocks`, source range format 0,
    /// its entries by PRP1 alone.
    fn submit_copy(&mut self, req: IoRequest) -> Result<(), Rejected> {
        let reject = |error, request| {
            Err(Rejected {
                error,
                request: Box::new(request),
            })
        };
        let Some(buf) = &req.buf else {
            return reject(QueueError::Invalid("Copy without its source range entries"), req);
        };
        let len = req.blocks as usize * COPY_ENTRY;
        if req.blocks == 0 || req.blocks > 256 || buf.len() < len {
            return reject(
                QueueError::Invalid("Copy range count beyond 1..=256 or its buffer"),
                req,
            );
        }
        let page = PAGE_SIZE as u64;
        if buf.iova() & 3 != 0 || buf.iova() % page + len as u64 > page {
            return reject(
                QueueError::Invalid("Copy entries not within one dword-aligned page"),
                req,
            );
        }
        if self.free_cids.is_empty() {
            return reject(QueueError::Full { needed: 1, free: 0 }, req);
        }
        let mut sqe = Sqe::new_zeroed();
        sqe.opcode = opcode::io::COPY;
        sqe.nsid.set(req.nsid);
        sqe.cdw10.set(req.slba as u32);
        sqe.cdw11.set((req.slba >> 32) as u32);
        // Bits 11:8 (Descriptor Format) 0: format 0.
        sqe.cdw12.set((req.blocks - 1) as u32 | (req.cdw12_flags & !0xFFF));
        let now = Instant::now();
        let xfer = Some((buf.iova(), len));
        let r = self.new_req(req.tag, 1, now, req.buf.clone());
        // Cannot fail: within one page, PRP1 alone.
        if let Err(e) = self.push(sqe, xfer, r, now) {
            tracing::error!(queue = %self.name, qid = self.qid, "PRP build failed: {e}");
        }
        self.stats.requests += 1;
        Ok(())
    }

    /// Stages one raw command (admin commands; I/O commands not covered by [`IoRequest`]) with
    /// an optional data buffer of at most [`max_transfer`](Self::max_transfer) bytes. The
    /// CID and the data pointer are filled in.
    pub fn submit_raw(&mut self, sqe: Sqe, buf: Option<DmaBuf>, tag: u64) -> Result<(), QueueError> {
        self.sync_gen();
        if !self.live {
            return Err(QueueError::Resetting);
        }
        if let Some(b) = &buf {
            if b.len() > self.max_xfer {
                return Err(QueueError::Invalid("raw command buffer larger than the transfer limit"));
            }
            if b.iova() & 3 != 0 {
                return Err(QueueError::Invalid("buffer not dword aligned"));
            }
        }
        if self.free_cids.is_empty() {
            return Err(QueueError::Full { needed: 1, free: 0 });
        }
        let now = Instant::now();
        let xfer = buf.as_ref().map(|b| (b.iova(), b.len()));
        let r = self.new_req(tag, 1, now, buf);
        self.push(sqe, xfer, r, now)
            .map_err(|_| QueueError::Invalid("PRP list"))?;
        self.stats.requests += 1;
        Ok(())
    }

    fn new_req(&mut self, tag: u64, commands: u16, now: Instant, buf: Option<DmaBuf>) -> u32 {
        let req = Req {
            tag,
            remaining: commands,
            commands,
            status: Status::SUCCESS,
            result: 0,
            submitted: now,
            buf,
        };
        match self.free_reqs.pop() {
            Some(i) => {
                self.reqs[i as usize] = req;
                i
            }
            None => {
                self.reqs.push(req);
                (self.reqs.len() - 1) as u32
            }
        }
    }

    /// Writes one SQE at the tail with a fresh CID and PRPs; the caller checked a CID is free.
    fn push(&mut self, mut sqe: Sqe, xfer: Option<(u64, usize)>, req: u32, now: Instant) -> Result<(), prp::PrpError> {
        let Some(cid) = self.free_cids.pop() else { return Ok(()) };
        if let Some((iova, len)) = xfer {
            let lists = ListPages {
                region: &self.prp_pool,
                offset: usize::from(cid) * self.list_pages * PAGE_SIZE,
                pages: self.list_pages,
            };
            match prp::build(iova, len, lists) {
                Ok((p1, p2)) => sqe.set_prps(p1, p2),
                Err(e) => {
                    self.free_cids.push(cid);
                    return Err(e);
                }
            }
        }
        sqe.cid.set(cid);
        sqe.set_psdt(Sqe::PSDT_PRP);
        self.sq
            .write_bytes(usize::from(self.sq_tail) * SQE_SIZE, sqe.as_bytes());
        self.slots[usize::from(cid)] = Slot { req, submitted: now };
        self.sq_tail = (self.sq_tail + 1) % self.depth;
        self.unrung += 1;
        self.inflight += 1;
        self.stats.commands += 1;
        if self.next_timeout_check.is_none() {
            self.next_timeout_check = Some(now + self.timeout);
        }
        Ok(())
    }

    /// Rings the SQ tail doorbell if commands were staged since the last ring: once per batch.
    pub fn flush(&mut self) {
        if self.unrung > 0 && self.live {
            self.sq_db.ring(self.sq_tail);
            self.unrung = 0;
            self.stats.sq_doorbells += 1;
        }
    }

    /// Rings pending doorbells, then delivers finished requests to `f` (failed ones first
    /// after a reset); returns how many. Checks the command timeout when nothing completed.
    pub fn poll(&mut self, mut f: impl FnMut(Completion)) -> usize {
        self.sync_gen();
        let mut n = 0;
        while let Some(c) = self.failed.pop_front() {
            f(c);
            n += 1;
        }
        if !self.live {
            return n;
        }
        self.flush();
        let mut now: Option<Instant> = None;
        let mut consumed = false;
        loop {
            let off = usize::from(self.cq_head) * CQE_SIZE;
            let sw = self.cq.read_u16(off + 14);
            if (sw & 1 != 0) != self.phase {
                break;
            }
            // The phase tag is written last by the device: read the rest only after it.
            fence(Ordering::Acquire);
            let dw0 = self.cq.read_u32(off);
            let sqhd = self.cq.read_u16(off + 8);
            let cid = self.cq.read_u16(off + 12);
            self.cq_head += 1;
            if self.cq_head == self.depth {
                self.cq_head = 0;
                self.phase = !self.phase;
            }
            consumed = true;
            self.sq_head = sqhd;
            let t = *now.get_or_insert_with(Instant::now);
            if let Some(c) = self.complete_cmd(cid, Status::from_cqe_field(sw), dw0, t) {
                f(c);
                n += 1;
            }
        }
        if consumed {
            self.cq_db.ring(self.cq_head);
            self.stats.cq_doorbells += 1;
        } else if self.inflight > 0 {
            self.check_timeout();
        }
        n
    }

    fn complete_cmd(&mut self, cid: u16, status: Status, dw0: u32, now: Instant) -> Option<Completion> {
        let Some(slot) = self.slots.get(usize::from(cid)).copied().filter(|s| s.req != FREE) else {
            tracing::warn!(queue = %self.name, qid = self.qid, cid, "completion for a CID not in flight");
            return None;
        };
        self.slots[usize::from(cid)].req = FREE;
        self.free_cids.push(cid);
        self.inflight -= 1;
        if self.inflight == 0 {
            self.next_timeout_check = None;
        }
        self.finish_part(slot.req, status, dw0, now)
    }

    fn finish_part(&mut self, r: u32, status: Status, dw0: u32, now: Instant) -> Option<Completion> {
        let req = &mut self.reqs[r as usize];
        if req.status.is_success() && !status.is_success() {
            req.status = status;
        }
        req.result = dw0;
        req.remaining -= 1;
        if req.remaining > 0 {
            return None;
        }
        self.free_reqs.push(r);
        self.stats.completed += 1;
        Some(Completion {
            tag: req.tag,
            status: req.status,
            result: req.result,
            submitted: req.submitted,
            latency: now.saturating_duration_since(req.submitted),
            buf: req.buf.take(),
            commands: req.commands,
        })
    }

    fn check_timeout(&mut self) {
        let Some(at) = self.next_timeout_check else { return };
        let now = Instant::now();
        if now < at {
            return;
        }
        let oldest = self.oldest_submitted().unwrap_or(now);
        if now.saturating_duration_since(oldest) >= self.timeout {
            if !self.timed_out {
                self.timed_out = true;
                self.stats.timeouts += 1;
                tracing::warn!(queue = %self.name, qid = self.qid, timeout = ?self.timeout,
                    inflight = self.inflight, "command timeout: requesting a controller reset");
                if let Some(c) = &self.ctrl {
                    c.reset_requested.store(true, Ordering::Release);
                }
            }
            self.next_timeout_check = Some(now + self.timeout / 4);
        } else {
            self.next_timeout_check = Some(oldest + self.timeout);
        }
    }

    /// Notices a controller reset: fails what was in flight, clears the rings, acknowledges;
    /// becomes live again once the controller has recreated the queue.
    fn sync_gen(&mut self) {
        let Some(ctrl) = &self.ctrl else { return };
        let g = ctrl.generation.load(Ordering::Acquire);
        if g != self.generation {
            self.generation = g;
            self.live = false;
            self.abort_all(HOST_ABORTED);
            self.reset_rings();
            self.shared.acked_gen.store(g, Ordering::Release);
        }
        if !self.live && self.shared.live_gen.load(Ordering::Acquire) == g {
            self.live = true;
            self.timed_out = false;
        }
    }

    /// Fails every command in flight with `status` (their requests go to the next poll).
    pub(crate) fn abort_all(&mut self, status: Status) {
        let now = Instant::now();
        for cid in 0..self.slots.len() {
            let s = self.slots[cid];
            if s.req == FREE {
                continue;
            }
            self.slots[cid].req = FREE;
            self.free_cids.push(cid as u16);
            self.inflight -= 1;
            if let Some(c) = self.finish_part(s.req, status, 0, now) {
                self.failed.push_back(c);
            }
        }
        self.next_timeout_check = None;
    }

    /// Rings back to their initial state (empty, phase 1), CQ memory zeroed: for a queue the
    /// device no longer runs, before it is created again.
    pub(crate) fn reset_rings(&mut self) {
        self.sq_tail = 0;
        self.sq_head = 0;
        self.cq_head = 0;
        self.phase = true;
        self.unrung = 0;
        self.cq.fill(0, self.cq.len(), 0);
    }

    /// The block shared with the controller.
    pub(crate) fn shared(&self) -> Arc<QueueShared> {
        self.shared.clone()
    }

    /// Drops failed completions waiting for delivery (the admin queue after a reset).
    pub(crate) fn take_failed(&mut self) -> Vec<Completion> {
        self.failed.drain(..).collect()
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        if self.inflight > 0 {
            // The device may still reach these buffers: keep them until the controller has
            // deleted the queue or disabled the device.
            let mut g = self.shared.graveyard.lock().unwrap_or_else(|p| p.into_inner());
            for s in self.slots.iter().filter(|s| s.req != FREE) {
                if let Some(b) = self.reqs[s.req as usize].buf.take() {
                    g.push(b);
                }
            }
        }
        self.shared.dropped.store(true, Ordering::Release);
    }
}
