//! One client thread: its queues, buffers, command contexts and the busy-poll loop.

mod fill;

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::time::Duration;

use hdrhistogram::Histogram;
use pollux_reactor::sys;
use rand::SeedableRng;
use rand::distr::{Bernoulli, Distribution, Uniform};
use rand::rngs::Xoshiro256PlusPlus;

use super::{Access, PerfError, PerfOpts, verify};
use crate::{Completion, HostQueue};
use fill::{FillGeometry, fill, read_back};

pub(super) use fill::FILL_DEPTH;

/// Load runs, nothing is counted.
pub(super) const WARMUP: u8 = 0;
/// Completions are counted.
pub(super) const MEASURE: u8 = 1;
/// Stop submitting, drain, return.
pub(super) const STOP: u8 = 2;

/// What the threads and the conductor share.
#[derive(Debug)]
pub(super) struct Shared {
    pub phase: AtomicU8,
    /// A thread failed: everyone stops.
    pub abort: AtomicBool,
    /// Threads that completed their quota (count-based runs).
    pub finished: AtomicUsize,
    /// Threads connected, pinned and done with --fill: the warmup starts when all are.
    pub ready: AtomicUsize,
    /// Commands each thread completed so far (warmup included), for the progress line.
    pub completed: Vec<Counter>,
}

/// A count one thread writes and others read, alone in its cache line (so publishing it
/// costs the I/O path one store to a line it owns).
#[derive(Debug, Default)]
#[repr(align(128))]
pub(super) struct Counter(pub std::sync::atomic::AtomicU64);

/// One thread's share of the job.
#[derive(Debug)]
pub(super) struct ThreadPlan {
    pub index: usize,
    pub core: Option<usize>,
    pub queues: Vec<HostQueue>,
    pub block_size: u32,
    /// I/O units each queue may use (all the same range without verify; disjoint with it).
    pub units_per_queue: u64,
    /// I/O queues of all threads.
    pub total_queues: usize,
    /// Largest transfer the controller takes (MDTS), bytes.
    pub max_transfer: u32,
    /// Count-based: I/Os to measure.
    pub quota: Option<u64>,
    /// IOPS for this thread.
    pub rate: Option<f64>,
}

/// What one thread measured.
#[derive(Debug)]
pub(super) struct ThreadResult {
    pub queues: Vec<HostQueue>,
    pub hist: Histogram<u64>,
    pub reads: u64,
    pub writes: u64,
    /// Thread CPU time in the measured window, ns.
    pub cpu_ns: u64,
    /// Wall time of loop iterations that submitted or completed something, ns.
    pub busy_ns: u64,
    /// The measured window as this thread saw it, ns.
    pub wall_ns: u64,
    pub verified_blocks: u64,
    /// Blocks written in this run that were read back after it and checked (--verify).
    pub readback_blocks: u64,
    pub iterations: u64,
}

/// The state of one queue besides its [`HostQueue`] (kept apart so completions can update
/// it while the queue is borrowed for polling).
struct QState {
    qid: u16,
    in_flight: usize,
    /// First I/O unit of the queue's range.
    base: u64,
    units: u64,
    cursor: u64,
    /// Random units and the read/write mix: xoshiro256++ is a few shifts and adds per draw,
    /// and seeds reproducibly from `--seed`.
    rng: Xoshiro256PlusPlus,
    /// A random unit of the range.
    random_unit: Uniform<u64>,
    /// Verify: units with a command in flight.
    busy: Vec<u64>,
    /// Verify: the generation last written to each unit (0: none in this run).
    gens: Vec<u32>,
    /// Verify: units a write of the run (not --fill) completed on, read back after the run.
    written: Vec<u64>,
}

impl QState {
    fn is_busy(&self, u: u64) -> bool {
        self.busy
            .get((u / 64) as usize)
            .is_some_and(|w| w & (1 << (u % 64)) != 0)
    }

    fn set_written(&mut self, u: u64) {
        if let Some(w) = self.written.get_mut((u / 64) as usize) {
            *w |= 1 << (u % 64);
        }
    }

    /// The units written in this run, in order.
    fn written_units(&self) -> impl Iterator<Item = u64> + '_ {
        self.written.iter().enumerate().flat_map(|(i, &w)| {
            (0..64u64)
                .filter(move |b| w & (1 << b) != 0)
                .map(move |b| i as u64 * 64 + b)
        })
    }

    fn set_busy(&mut self, u: u64, on: bool) {
        if let Some(w) = self.busy.get_mut((u / 64) as usize) {
            if on {
                *w |= 1 << (u % 64);
            } else {
                *w &= !(1 << (u % 64));
            }
        }
    }

    /// The next unit (relative to `base`) to work on, skipping busy ones under verify.
    fn pick(&mut self, access: Access, verify: bool) -> u64 {
        let mut u = match access {
            Access::Sequential => {
                let u = self.cursor;
                self.cursor = if u + 1 >= self.units { 0 } else { u + 1 };
                u
            }
            _ => self.random_unit.sample(&mut self.rng),
        };
        if verify {
            // At most queue-depth units are busy and the range is larger, so this ends.
            while self.is_busy(u) {
                u = if u + 1 >= self.units { 0 } else { u + 1 };
            }
            if access == Access::Sequential {
                self.cursor = if u + 1 >= self.units { 0 } else { u + 1 };
            }
        }
        u
    }
}

/// One command in flight.
#[derive(Debug, Clone, Copy, Default)]
struct IoCtx {
    /// Submission time, ns since the thread's epoch.
    t0: u64,
    /// Unit relative to its queue's base.
    unit: u64,
    queue: u32,
    gen_: u32,
    write: bool,
    /// Submitted in the measured window (count-based runs count these).
    measured: bool,
}

/// The measured-window counters.
struct Tally {
    hist: Histogram<u64>,
    reads: u64,
    writes: u64,
    counted: u64,
    completed: u64,
    verified_blocks: u64,
}

pub(super) fn run_thread(opts: &PerfOpts, plan: ThreadPlan, shared: &Shared) -> Result<ThreadResult, PerfError> {
    let r = thread_body(opts, plan, shared);
    if r.is_err() {
        shared.abort.store(true, Ordering::Release);
    }
    r
}

fn thread_body(opts: &PerfOpts, plan: ThreadPlan, shared: &Shared) -> Result<ThreadResult, PerfError> {
    if let Some(c) = plan.core {
        sys::pin_current_thread(c).map_err(|e| PerfError::Thread(format!("cannot pin to core {c}: {e}")))?;
    }
    let ThreadPlan {
        index,
        mut queues,
        block_size,
        units_per_queue,
        total_queues,
        max_transfer,
        quota,
        rate,
        ..
    } = plan;
    let qd = opts.queue_depth;
    let nq = queues.len();
    let bs = block_size as usize;
    let nlb = opts.io_size / block_size;
    let blocks_per_unit = u64::from(nlb);
    let access = opts.workload.access;
    let verify = opts.verify;
    let slots = nq * qd;

    // Everything the loop touches is allocated here, before the first command.
    let random_unit = Uniform::new(0, units_per_queue)
        .map_err(|e| PerfError::Thread(format!("{units_per_queue} I/O units per queue: {e}")))?;
    let read_pct = opts.workload.read_pct;
    let reads = Bernoulli::from_ratio(u32::from(read_pct), 100)
        .map_err(|e| PerfError::Options(format!("read percentage {read_pct}: {e}")))?;
    let mut qs: Vec<QState> = queues
        .iter()
        .enumerate()
        .map(|(i, q)| {
            let global = (index * nq + i) as u64;
            let base = if verify { global * units_per_queue } else { 0 };
            let words = if verify {
                units_per_queue.div_ceil(64) as usize
            } else {
                0
            };
            QState {
                qid: q.qid(),
                in_flight: 0,
                base,
                units: units_per_queue,
                // Sequential queues without verify share the range: spread their start.
                cursor: if verify {
                    0
                } else {
                    (units_per_queue / nq.max(1) as u64) * i as u64
                },
                rng: Xoshiro256PlusPlus::seed_from_u64(opts.seed ^ (global + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)),
                random_unit,
                busy: vec![0; words],
                written: vec![0; words],
                gens: vec![0; if verify { units_per_queue as usize } else { 0 }],
            }
        })
        .collect();
    let mut pool: Vec<Vec<u8>> = (0..slots)
        .map(|i| {
            let mut b = vec![0u8; opts.io_size as usize];
            if !verify {
                // Something other than zeroes for plain writes.
                verify::fill(&mut b, i as u64, bs, 1);
            }
            b
        })
        .collect();
    let mut ctxs = vec![IoCtx::default(); slots];
    let mut free: Vec<u32> = (0..slots as u32).rev().collect();
    let mut tally = Tally {
        hist: Histogram::new_with_bounds(1, 60_000_000_000, 3)
            .map_err(|e| PerfError::Thread(format!("histogram: {e}")))?,
        reads: 0,
        writes: 0,
        counted: 0,
        completed: 0,
        verified_blocks: 0,
    };

    if opts.fill {
        fill(
            opts,
            &mut queues,
            &mut qs,
            max_transfer,
            FillGeometry {
                index,
                total_queues,
                bs,
                nlb,
            },
        )?;
    }
    shared.ready.fetch_add(1, Ordering::AcqRel);

    let epoch = sys::monotonic_ns();
    let now = || sys::monotonic_ns().saturating_sub(epoch);
    let interval = rate.map(|r| (1e9 / r) as u64);
    let mut next_due = 0u64;
    let mut phase = WARMUP;
    let (mut cpu0, mut cpu1, mut wall0, mut wall1) = (0u64, 0u64, 0u64, 0u64);
    let mut busy_ns = 0u64;
    let mut iterations = 0u64;
    let mut in_flight = 0usize;
    let mut measured_submitted = 0u64;
    let mut quota_done = false;
    let mut stopping = false;
    let mut last_progress = 0u64;
    let timeout_ns = opts.timeout.as_nanos() as u64;
    let mut prev_t = now();
    let mut prev_work = false;
    let mut rr = 0usize;

    loop {
        let t = now();
        if prev_work && phase == MEASURE && !quota_done {
            busy_ns += t - prev_t;
        }
        prev_t = t;
        let p = shared.phase.load(Ordering::Acquire);
        if p != phase {
            if p >= MEASURE && phase == WARMUP {
                cpu0 = sys::thread_cpu_ns();
                wall0 = t;
                next_due = next_due.max(t);
            }
            if p == STOP && !quota_done {
                cpu1 = sys::thread_cpu_ns();
                wall1 = t;
            }
            phase = p;
            if p == STOP {
                stopping = true;
            }
        }
        if shared.abort.load(Ordering::Relaxed) {
            stopping = true;
        }
        if stopping && in_flight == 0 {
            break;
        }
        if access == Access::Idle || (quota_done && in_flight == 0) {
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        iterations += 1;

        // Submit: fill every queue up to its depth (or what the pacing allows).
        let mut submitted = 0usize;
        if !stopping {
            for k in 0..nq {
                let qi = (rr + k) % nq;
                while qs[qi].in_flight < qd {
                    if let Some(q) = quota
                        && phase == MEASURE
                        && measured_submitted >= q
                    {
                        break;
                    }
                    if let Some(iv) = interval {
                        if t < next_due {
                            break;
                        }
                        next_due = if t > next_due + 1_000_000_000 { t } else { next_due + iv };
                    }
                    let (Some(ci), Some(mut buf)) = (free.pop(), pool.pop()) else {
                        break;
                    };
                    let q = &mut qs[qi];
                    let u = q.pick(access, verify);
                    let write = match opts.workload.read_pct {
                        100 => false,
                        0 => true,
                        _ => !reads.sample(&mut q.rng),
                    };
                    let slba = (q.base + u) * blocks_per_unit;
                    let mut gen_ = 0;
                    if verify {
                        gen_ = q.gens[u as usize];
                        if write {
                            gen_ = gen_.wrapping_add(1).max(1);
                            verify::fill(&mut buf, slba, bs, gen_);
                        }
                        q.set_busy(u, true);
                    }
                    ctxs[ci as usize] = IoCtx {
                        t0: t,
                        unit: u,
                        queue: qi as u32,
                        gen_,
                        write,
                        measured: phase == MEASURE,
                    };
                    let hq = &mut queues[qi];
                    let r = if write {
                        hq.submit_write(opts.nsid, slba, nlb, buf, u64::from(ci))
                    } else {
                        hq.submit_read(opts.nsid, slba, nlb, buf, u64::from(ci))
                    };
                    if let Err(source) = r {
                        return Err(PerfError::Queue {
                            qid: q.qid,
                            ios: tally.completed,
                            source,
                        });
                    }
                    q.in_flight += 1;
                    in_flight += 1;
                    submitted += 1;
                    if phase == MEASURE {
                        measured_submitted += 1;
                    }
                    if in_flight == 1 {
                        last_progress = t;
                    }
                }
            }
            rr = rr.wrapping_add(1);
        }

        // Poll: one read per queue pulls whatever completed.
        let mut completed = 0usize;
        let mut err: Option<PerfError> = None;
        for (qi, hq) in queues.iter_mut().enumerate() {
            if qs[qi].in_flight == 0 {
                continue;
            }
            let mut tc = 0u64;
            let counting = phase == MEASURE && !quota_done;
            let wait = opts.blocking.then(|| {
                let until_due = interval.map_or(u64::MAX, |_| next_due.saturating_sub(t));
                // Long enough that a slow target (under valgrind) is not polled in vain.
                Duration::from_nanos(until_due.min(50_000_000))
            });
            let r = hq.poll_completions(wait, |c: Completion| {
                if tc == 0 {
                    tc = now();
                }
                complete(
                    c,
                    tc,
                    counting,
                    quota.is_some(),
                    verify,
                    bs,
                    blocks_per_unit,
                    &mut ctxs,
                    &mut free,
                    &mut pool,
                    &mut qs,
                    &mut tally,
                    &mut err,
                );
            });
            match r {
                Ok(n) => completed += n,
                Err(source) => {
                    return Err(PerfError::Queue {
                        qid: qs[qi].qid,
                        ios: tally.completed,
                        source,
                    });
                }
            }
            if let Some(e) = err.take() {
                return Err(e);
            }
        }
        in_flight -= completed;
        if completed > 0
            && let Some(c) = shared.completed.get(index)
        {
            c.0.store(tally.completed, Ordering::Relaxed);
        }
        if opts.blocking
            && in_flight == 0
            && interval.is_some()
            && !stopping
            && let Some(d) = next_due.checked_sub(now())
        {
            std::thread::sleep(Duration::from_nanos(d.min(1_000_000)));
        }
        if completed > 0 {
            last_progress = t;
        } else if in_flight > 0 && t.saturating_sub(last_progress) > timeout_ns {
            let (qid, n) = qs
                .iter()
                .find(|q| q.in_flight > 0)
                .map_or((0, in_flight), |q| (q.qid, q.in_flight));
            return Err(PerfError::Stalled {
                qid,
                in_flight: n,
                waited: Duration::from_nanos(t - last_progress),
            });
        }
        prev_work = submitted > 0 || completed > 0;
        if let Some(q) = quota
            && !quota_done
            && phase == MEASURE
            && tally.counted >= q
        {
            quota_done = true;
            cpu1 = sys::thread_cpu_ns();
            wall1 = now();
            shared.finished.fetch_add(1, Ordering::AcqRel);
        }
    }
    if phase == WARMUP {
        // Aborted before measuring.
        cpu0 = sys::thread_cpu_ns();
        cpu1 = cpu0;
    }
    // A write-only job reads nothing back while it runs: check what it wrote now, outside
    // the measured window, so `--verify` never passes having checked nothing.
    let readback_blocks = if verify && !shared.abort.load(Ordering::Acquire) {
        read_back(opts, &mut queues, &qs, pool, bs, nlb)?
    } else {
        0
    };
    Ok(ThreadResult {
        queues,
        hist: tally.hist,
        reads: tally.reads,
        writes: tally.writes,
        cpu_ns: cpu1.saturating_sub(cpu0),
        busy_ns,
        wall_ns: wall1.saturating_sub(wall0),
        verified_blocks: tally.verified_blocks,
        readback_blocks,
        iterations,
    })
}

/// Handles one completion: status, verify, latency, and the buffer and context go back.
#[allow(clippy::too_many_arguments)]
#[inline]
fn complete(
    c: Completion,
    tc: u64,
    counting: bool,
    count_based: bool,
    verify: bool,
    bs: usize,
    blocks_per_unit: u64,
    ctxs: &mut [IoCtx],
    free: &mut Vec<u32>,
    pool: &mut Vec<Vec<u8>>,
    qs: &mut [QState],
    tally: &mut Tally,
    err: &mut Option<PerfError>,
) {
    let ci = c.tag as usize;
    let Some(io) = ctxs.get(ci).copied() else {
        err.get_or_insert(PerfError::Thread(format!("completion with unknown tag {}", c.tag)));
        return;
    };
    let Some(q) = qs.get_mut(io.queue as usize) else {
        return;
    };
    q.in_flight -= 1;
    let slba = (q.base + io.unit) * blocks_per_unit;
    if !c.is_success() {
        err.get_or_insert(PerfError::IoFailed {
            op: if io.write { "write" } else { "read" },
            lba: slba,
            nlb: blocks_per_unit as u32,
            qid: q.qid,
            status: c.status,
        });
    } else if verify {
        if io.write {
            if let Some(g) = q.gens.get_mut(io.unit as usize) {
                *g = io.gen_;
            }
            q.set_written(io.unit);
        } else {
            match verify::check(&c.buf, slba, bs, io.gen_) {
                Ok(()) => {
                    if counting {
                        tally.verified_blocks += blocks_per_unit;
                    }
                }
                Err(m) => {
                    err.get_or_insert(PerfError::Verify {
                        lba: m.lba,
                        qid: q.qid,
                        expected_gen: io.gen_,
                        found: m.found,
                    });
                }
            }
        }
        q.set_busy(io.unit, false);
    }
    tally.completed += 1;
    let counts = if count_based { io.measured } else { counting };
    if counts {
        tally.counted += 1;
        if io.write {
            tally.writes += 1;
        } else {
            tally.reads += 1;
        }
        tally.hist.saturating_record(tc.saturating_sub(io.t0).max(1));
    }
    pool.push(c.buf);
    free.push(ci as u32);
}
