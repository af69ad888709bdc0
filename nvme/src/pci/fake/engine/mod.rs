//! The fake controller's thread: the CC.EN/CSTS.RDY handshake, reset and shutdown, fetching
//! commands from the SQs by doorbell and posting their completions (phase tags, MSI-X).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use zerocopy::IntoBytes;

use super::Inner;
use crate::pci::dma::PAGE_SIZE;
use crate::pci::regs::{cq_head_doorbell, offset, sq_tail_doorbell};
use crate::spec::{Cc, Csts, Sqe, Status};

mod admin;
mod io;
mod prp;

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

pub(super) struct Engine {
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
    pub(super) fn new(inner: Arc<Inner>) -> Self {
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

    pub(super) fn run(mut self) {
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
                // Controller reset (NVMe 2.0 §3.7.2): queues gone, CSTS cleared.
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
}
