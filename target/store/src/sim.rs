//! The simulated SSD backend: real data in RAM, completions after a latency drawn from a
//! configured distribution, like a device with an MSI-X interrupt.
//!
//! Each reactor has its own channel (a queue pair of the simulated device). A command is "in
//! service" from submission until its due time; no CPU is spent meanwhile: a busy-polling or
//! hybrid reactor sees the completion on its first poll after the due time, an interrupt-mode
//! reactor is woken by the channel's timerfd at the due time plus the interrupt delivery delay
//! (with optional coalescing), as an SSD's MSI-X would.

use std::any::Any;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

use pollux_nvme::spec::Status;
use pollux_reactor::sys::TimerFd;
use pollux_reactor::{DeviceWait, LatencyModel, Next, Polling, Progress, Reactor};
use rand::SeedableRng;
use rand::rngs::Xoshiro256PlusPlus;
use rand_distr::{Bernoulli, Distribution, LogNormal, Uniform};
use tracing::warn;

use super::{Backend, BlockOp, Channel, ChannelEnv, ChannelNs, Completer, Completion, RamDisk, Tag};
use crate::error::StoreError;

/// A latency distribution, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LatencyDist {
    /// Always the same.
    Fixed(f64),
    /// Uniform in [min, max].
    Uniform(f64, f64),
    /// Lognormal with this median and sigma (of the underlying normal).
    LogNormal {
        /// Median.
        median: f64,
        /// Sigma.
        sigma: f64,
    },
    /// `fast` with probability 1 - `slow_fraction`, else `slow`.
    Bimodal {
        /// Fast latency.
        fast: f64,
        /// Slow latency.
        slow: f64,
        /// Share of slow commands.
        slow_fraction: f64,
    },
}

/// Parameters of a simulated device.
#[derive(Debug, Clone, PartialEq)]
pub struct SimParams {
    /// Read latency.
    pub read: LatencyDist,
    /// Write latency (also flush, write zeroes, deallocate).
    pub write: LatencyDist,
    /// Extra microseconds per KiB beyond the first 4 KiB.
    pub per_kib_us: f64,
    /// Commands in service at once per channel; more wait in a queue.
    pub parallelism: u32,
    /// Bytes per second per channel (None: unlimited).
    pub bandwidth: Option<u64>,
    /// Completion to interrupt.
    pub interrupt_delay: Duration,
    /// Interrupt after this many completions...
    pub coalesce_count: u32,
    /// ...or this long after the first, whichever comes first.
    pub coalesce_time: Duration,
    /// Random seed (each reactor's channel mixes in its id).
    pub seed: u64,
}

impl LatencyDist {
    fn from_conf(l: &pollux_conf::Latency) -> Self {
        use pollux_conf::Latency as L;
        match *l {
            L::Fixed { us } => LatencyDist::Fixed(us),
            L::Uniform { min_us, max_us } => LatencyDist::Uniform(min_us, max_us),
            L::LogNormal { median_us, sigma } => LatencyDist::LogNormal {
                median: median_us,
                sigma,
            },
            L::Bimodal {
                fast_us,
                slow_us,
                slow_fraction,
            } => LatencyDist::Bimodal {
                fast: fast_us,
                slow: slow_us,
                slow_fraction,
            },
        }
    }
}

fn us(v: f64) -> Duration {
    Duration::from_nanos((v.max(0.0) * 1000.0) as u64)
}

impl SimParams {
    /// From the conf file's `sim` backend.
    pub fn from_conf(c: &pollux_conf::SimBackend) -> Self {
        Self {
            read: LatencyDist::from_conf(&c.read),
            write: LatencyDist::from_conf(&c.write),
            per_kib_us: c.per_kib_us,
            parallelism: c.parallelism.max(1),
            bandwidth: c.bandwidth,
            interrupt_delay: us(c.interrupt_delay_us),
            coalesce_count: c.coalesce_count.max(1),
            coalesce_time: us(c.coalesce_us),
            seed: c.seed,
        }
    }
}

/// A simulated SSD: its data and parameters.
#[derive(Debug)]
pub struct SimDisk {
    /// The data.
    pub data: RamDisk,
    /// How it behaves.
    pub params: SimParams,
}

impl SimDisk {
    /// The device the conf's `sim` backend describes, its memory zeroed.
    pub fn open(c: &pollux_conf::SimBackend) -> Result<Self, StoreError> {
        let data = RamDisk::new(c.size).map_err(|source| StoreError::Ram { bytes: c.size, source })?;
        Ok(Self {
            data,
            params: SimParams::from_conf(c),
        })
    }
}

impl Backend for SimDisk {
    fn kind(&self) -> &'static str {
        "sim"
    }

    fn len(&self) -> u64 {
        self.data.len()
    }

    fn io_path(&self) -> &'static str {
        "simulated"
    }

    fn memory(&self) -> Option<&RamDisk> {
        Some(&self.data)
    }

    fn open_channel(&self, ns: ChannelNs, env: &ChannelEnv) -> Result<Box<dyn Channel>, StoreError> {
        let nsid = ns.nsid;
        let ch = SimChannel::new(ns, self.params.clone(), env).map_err(|e| StoreError::Channel {
            nsid,
            reactor: env.reactor,
            reason: format!("cannot make the simulated interrupt's timerfd: {e}"),
        })?;
        Ok(Box::new(ch))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The latency draws' random source: xoshiro256++, small and fast, and one of rand's named,
/// portable generators (`SmallRng` may change its algorithm), so a conf `seed` replays the
/// same latencies.
#[derive(Debug, Clone)]
pub struct Rng(Xoshiro256PlusPlus);

impl Rng {
    /// Seeded generator.
    pub fn new(seed: u64) -> Self {
        Self(Xoshiro256PlusPlus::seed_from_u64(seed))
    }
}

impl LatencyDist {
    /// Draw one latency in microseconds (never negative).
    pub fn sample(&self, rng: &mut Rng) -> f64 {
        // The conf checks the parameters (min <= max, a positive median, sigma and
        // slow_fraction in range), so each distribution builds; were one not to, the draw is
        // its typical value rather than a panic on the I/O path.
        let rng = &mut rng.0;
        let v = match *self {
            LatencyDist::Fixed(us) => us,
            LatencyDist::Uniform(a, b) => Uniform::new_inclusive(a, b).map_or(a, |d| d.sample(rng)),
            LatencyDist::LogNormal { median, sigma } => {
                LogNormal::new(median.ln(), sigma).map_or(median, |d| d.sample(rng))
            }
            LatencyDist::Bimodal {
                fast,
                slow,
                slow_fraction,
            } => {
                if Bernoulli::new(slow_fraction).is_ok_and(|d| d.sample(rng)) {
                    slow
                } else {
                    fast
                }
            }
        };
        v.max(0.0)
    }
}

/// What a simulated command does when it completes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimOp {
    /// A read (data is copied out at completion).
    Read,
    /// A write, flush or deallocate (data was applied at submission).
    Write,
}

#[derive(Debug, Clone, Copy)]
struct Req {
    tag: Tag,
    op: SimOp,
    len: u32,
    class: usize,
}

/// A completion found within this long of the previous poll was timed exactly: the reactor
/// was polling, not sleeping, when it landed.
const EXACT_GAP: Duration = Duration::from_micros(5);

/// One reactor's queue pair on a simulated device.
pub struct SimChannel {
    ns: ChannelNs,
    params: SimParams,
    rng: Rng,
    waiting: VecDeque<(Instant, Req)>,
    in_service: BinaryHeap<Reverse<(Instant, u64, usize)>>,
    reqs: slab::Slab<(Instant, Req)>,
    seq: u64,
    bw_free_at: Instant,
    irq: TimerFd,
    irq_at: Option<Instant>,
    name: String,
    end: Completer,
    last_poll: Instant,
    /// Commands aborted, completed (Command Aborted Requested) on the next poll.
    aborted: Vec<Tag>,
}

impl SimChannel {
    /// A channel for namespace `ns` (whose backend is a [`SimDisk`]) on reactor `reactor`.
    pub fn new(ns: ChannelNs, params: SimParams, env: &ChannelEnv) -> std::io::Result<Self> {
        let reactor = env.reactor;
        let seed = params.seed ^ (reactor as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(ns.nsid);
        Ok(Self {
            name: format!("sim-ns{}-r{reactor}", ns.nsid),
            ns,
            params,
            rng: Rng::new(seed),
            waiting: VecDeque::new(),
            in_service: BinaryHeap::new(),
            reqs: slab::Slab::new(),
            seq: 0,
            bw_free_at: Instant::now(),
            irq: TimerFd::new()?,
            irq_at: None,
            end: Completer::new(env),
            last_poll: Instant::now(),
            aborted: Vec::new(),
        })
    }

    /// What it keeps of the namespace it serves.
    pub fn namespace(&self) -> &ChannelNs {
        &self.ns
    }

    fn service_time(&mut self, op: SimOp, len: u32) -> Duration {
        let dist = if op == SimOp::Read {
            self.params.read
        } else {
            self.params.write
        };
        let extra_kib = (f64::from(len) / 1024.0 - 4.0).max(0.0);
        let us = dist.sample(&mut self.rng) + extra_kib * self.params.per_kib_us;
        Duration::from_nanos((us * 1000.0) as u64)
    }

    fn start(&mut self, now: Instant, req: Req) {
        let mut due = now + self.service_time(req.op, req.len);
        if let Some(bw) = self.params.bandwidth.filter(|&b| b > 0) {
            // Transfers share the channel's bandwidth one after another.
            let xfer = Duration::from_nanos((u128::from(req.len) * 1_000_000_000 / u128::from(bw)) as u64);
            self.bw_free_at = self.bw_free_at.max(now) + xfer;
            due = due.max(self.bw_free_at);
        }
        let key = self.reqs.insert((now, req));
        self.seq += 1;
        self.in_service.push(Reverse((due, self.seq, key)));
    }

    /// Queue a command at `now`.
    fn enqueue(&mut self, r: &mut Reactor, now: Instant, tag: Tag, op: SimOp, len: u32) {
        r.device_load().outstanding += 1;
        let req = Req {
            tag,
            op,
            len,
            class: LatencyModel::class(op == SimOp::Read, len),
        };
        if self.in_service.len() < self.params.parallelism as usize {
            self.start(now, req);
        } else {
            self.waiting.push_back((now, req));
        }
    }

    /// The model's prediction of the earliest completion (None: a command whose class has no
    /// estimate yet, so the reactor must poll to learn it).
    fn predicted_next(&self) -> Option<Instant> {
        let mut earliest: Option<Instant> = None;
        for (_, (submitted, req)) in self.reqs.iter() {
            let t = *submitted + self.end.model.estimate(req.class)?;
            earliest = Some(earliest.map_or(t, |e| e.min(t)));
        }
        for (submitted, req) in &self.waiting {
            let t = *submitted + self.end.model.estimate(req.class)?;
            earliest = Some(earliest.map_or(t, |e| e.min(t)));
        }
        earliest
    }

    /// Earliest due time of a command in service (the device's truth, not a prediction).
    pub fn next_due(&self) -> Option<Instant> {
        self.in_service.peek().map(|Reverse((t, _, _))| *t)
    }

    /// When the interrupt for what is in service fires: the `coalesce_count`-th completion
    /// or `coalesce_time` after the first, plus the delivery delay.
    fn interrupt_time(&self) -> Option<Instant> {
        let first = self.next_due()?;
        let by_time = first + self.params.coalesce_time;
        let count = self.params.coalesce_count.max(1) as usize;
        let by_count = if count == 1 {
            Some(first)
        } else if self.in_service.len() >= count {
            let mut dues: Vec<Instant> = self.in_service.iter().map(|Reverse((t, _, _))| *t).collect();
            dues.sort_unstable();
            Some(dues[count - 1])
        } else {
            None
        };
        let t = by_count.map_or(by_time, |c| c.min(by_time));
        Some(t + self.params.interrupt_delay)
    }

    fn arm_interrupt(&mut self, now: Instant) {
        let want = self.interrupt_time();
        if want == self.irq_at {
            return;
        }
        let res = match want {
            Some(t) => self.irq.arm(t.saturating_duration_since(now)),
            None => self.irq.disarm(),
        };
        if let Err(e) = res {
            warn!(channel = %self.name, error = %e, "cannot arm the simulated interrupt");
        }
        self.irq_at = want;
    }
}

impl Channel for SimChannel {
    fn name(&self) -> &str {
        &self.name
    }

    /// Writes land in the memory now (visible to every reactor at once, as with a device
    /// that acknowledges from its cache) and complete after the device latency; reads are
    /// sent from the memory at completion.
    fn submit(&mut self, r: &mut Reactor, tag: Tag, store: &dyn Backend, op: BlockOp<'_>) -> Result<(), Status> {
        let status = store.memory().map_or(Status::INTERNAL_ERROR, |m| m.apply(&op));
        if !status.is_success() {
            return Err(status);
        }
        let (kind, len) = match op {
            BlockOp::Read { len, .. } => (SimOp::Read, len),
            BlockOp::Write { data, .. } => (SimOp::Write, data.len() as u32),
            _ => (SimOp::Write, 0),
        };
        self.enqueue(r, Instant::now(), tag, kind, len);
        Ok(())
    }

    /// The simulated device drops the command, in service or waiting: nothing of it is left
    /// to complete but its Command Aborted Requested, on the next poll.
    fn abort(&mut self, r: &mut Reactor, tag: Tag) -> bool {
        if let Some(key) = self.reqs.iter().find(|(_, (_, q))| q.tag == tag).map(|(k, _)| k) {
            self.reqs.remove(key);
            // Its slot may be reused at once: no entry of the heap may name it any longer.
            self.in_service.retain(|Reverse((_, _, k))| *k != key);
        } else if let Some(pos) = self.waiting.iter().position(|(_, q)| q.tag == tag) {
            self.waiting.remove(pos);
        } else {
            return false;
        }
        let load = r.device_load();
        load.outstanding = load.outstanding.saturating_sub(1);
        self.aborted.push(tag);
        true
    }

    fn interrupt_fd(&self) -> Option<RawFd> {
        Some(self.irq.as_raw_fd())
    }

    fn outstanding(&self) -> usize {
        self.reqs.len() + self.waiting.len()
    }

    fn poll(&mut self, r: &mut Reactor) -> Progress {
        let fired = self.irq.consume();
        if fired {
            self.irq_at = None;
        }
        let now = Instant::now();
        let exact = now.duration_since(self.last_poll) <= EXACT_GAP;
        self.last_poll = now;
        let mut did = !self.aborted.is_empty();
        for tag in std::mem::take(&mut self.aborted) {
            let done = Completion {
                tag,
                status: Status::ABORT_REQUESTED,
                data: None,
            };
            self.end.complete(r, done);
        }
        while let Some(Reverse((due, _, key))) = self.in_service.peek().copied() {
            if due > now {
                break;
            }
            self.in_service.pop();
            let Some((submitted, req)) = self.reqs.try_remove(key) else {
                continue;
            };
            did = true;
            // What the reactor can know: when it found the completion, and whether it was
            // polling closely then (exact) or had slept (an upper bound).
            let took = now.saturating_duration_since(submitted);
            let done = Completion {
                tag: req.tag,
                status: Status::SUCCESS,
                data: None,
            };
            self.end.finish(r, done, req.class, took, exact);
        }
        while self.in_service.len() < self.params.parallelism as usize {
            let Some((_, req)) = self.waiting.pop_front() else {
                break;
            };
            self.start(now, req);
        }
        // The device raises its interrupt only when the reactor sleeps on it (interrupt mode,
        // or a `never` namespace in hybrid mode); polling and hybrid reactors poll for
        // completions, as with an SSD queue polled by its driver.
        let wait = self.ns.polling.get().device_wait(r.effective_mode());
        if wait == DeviceWait::Interrupt {
            self.arm_interrupt(now);
        } else if self.irq_at.is_some() {
            let _ = self.irq.disarm();
            self.irq_at = None;
        }
        if self.outstanding() == 0 {
            return Progress {
                did_work: did,
                next: Next::Idle,
            };
        }
        match self.predicted_next() {
            Some(t) => Progress {
                did_work: did,
                next: Next::Expect(t),
            },
            // A class without an estimate is learnt by polling, except where its commands
            // wait for the interrupt anyway (whose upper bound is the model's first sample).
            None if wait == DeviceWait::Interrupt => Progress {
                did_work: did,
                next: Next::Idle,
            },
            None => Progress {
                did_work: did,
                next: Next::Asap,
            },
        }
    }

    fn polling(&self) -> Polling {
        self.ns.polling.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lognormal_median_is_the_median() {
        let d = LatencyDist::LogNormal {
            median: 80.0,
            sigma: 0.5,
        };
        let mut rng = Rng::new(7);
        let mut v: Vec<f64> = (0..20_001).map(|_| d.sample(&mut rng)).collect();
        v.sort_by(f64::total_cmp);
        let med = v[10_000];
        assert!((med - 80.0).abs() < 3.0, "median {med}");
        assert!(v.iter().all(|&x| x > 0.0));
    }

    #[test]
    fn bimodal_and_uniform_stay_in_their_bounds() {
        let mut rng = Rng::new(1);
        let b = LatencyDist::Bimodal {
            fast: 10.0,
            slow: 500.0,
            slow_fraction: 0.1,
        };
        let slow = (0..10_000).filter(|_| b.sample(&mut rng) == 500.0).count();
        assert!((800..1200).contains(&slow), "{slow}");
        let u = LatencyDist::Uniform(5.0, 9.0);
        assert!((0..1000).map(|_| u.sample(&mut rng)).all(|x| (5.0..=9.0).contains(&x)));
    }
}
