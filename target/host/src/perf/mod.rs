//! `pollux perf`: an NVMe/TCP load generator in the manner of SPDK's `spdk_nvme_perf`, built
//! on this crate's host library.
//!
//! One controller, `cores x conns_per_core` I/O queues; each client thread is pinned to its
//! core and owns `conns_per_core` queues, on which it keeps `queue_depth` commands in flight
//! each. The client is built not to be the bottleneck: buffers and per-command contexts are
//! allocated before the run and circulate, submissions made in one loop iteration leave in
//! one `write`, one `read` pulls every completion that arrived, and the sockets are
//! busy-polled (non-blocking reads in a loop) on the pinned core.
//!
//! [`run`] measures from the client's side; [`run_with_stats`] also takes reactor accounting
//! of an in-process target ([`cli::InProcessTarget`]) at the start and end of the measured window,
//! for the target's CPU per I/O and its mode mix.
//!
//! `--verify` writes, in every logical block, a pattern encoding its LBA and a generation
//! (the count of writes to that I/O unit in this run) and checks every block read; after
//! the run it reads back every unit written during it and checks that too (so a write-only
//! job is verified as well); a mismatch ends the run with an error naming the LBA, and a
//! run that checked nothing at all is an error. Queues work on disjoint LBA ranges
//! and never have two commands on one I/O unit at once, so the expected content of every
//! block is always known.

pub mod cli;
mod floor;
mod placement;
mod progress;
mod report;
mod verify;
mod worker;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::{Duration, Instant};

use pollux_reactor::ReactorStats;
use tracing::warn;

use crate::{Controller, ControllerOpts, Digests, HostDhchap, HostError, HostTls};
pub use placement::{Placement, probe as probe_placement};
pub use report::{LatencySummary, PerfReport, ReactorReport, TargetReport, ThreadCpu};
use worker::{Shared, ThreadPlan, ThreadResult};

/// Everything that can end a perf run early.
#[derive(Debug, thiserror::Error)]
pub enum PerfError {
    /// The options do not make a runnable job.
    #[error("invalid options: {0}")]
    Options(String),
    /// Setting up the controller failed (TCP connect, ICReq, Connect, Identify...).
    #[error("cannot connect to {addr} subsystem {subnqn}: {source}")]
    Connect {
        /// Target address.
        addr: SocketAddr,
        /// Subsystem NQN.
        subnqn: String,
        /// What went wrong.
        source: HostError,
    },
    /// The namespace cannot take the job.
    #[error("namespace {nsid}: {why}")]
    Namespace {
        /// NSID.
        nsid: u32,
        /// Why.
        why: String,
    },
    /// A queue failed during the run: the target closed it, broke the protocol, or vanished.
    #[error("I/O queue {qid} failed after {ios} I/Os: {source}")]
    Queue {
        /// Queue id.
        qid: u16,
        /// I/Os this thread had completed.
        ios: u64,
        /// What went wrong.
        source: HostError,
    },
    /// Commands were in flight and nothing completed for too long.
    #[error("I/O queue {qid}: {in_flight} commands in flight and no completion for {waited:?}")]
    Stalled {
        /// Queue id.
        qid: u16,
        /// Commands in flight.
        in_flight: usize,
        /// How long nothing completed.
        waited: Duration,
    },
    /// A command completed with an error status.
    #[error("{op} of {nlb} blocks at LBA {lba} on queue {qid} failed: {status}")]
    IoFailed {
        /// "read" or "write".
        op: &'static str,
        /// Starting LBA.
        lba: u64,
        /// Blocks.
        nlb: u32,
        /// Queue id.
        qid: u16,
        /// Completion status.
        status: pollux_nvme::spec::Status,
    },
    /// `--verify` found a block that does not hold what was last written there.
    #[error("verify mismatch at LBA {lba} (queue {qid}, expected generation {expected_gen}): {found}")]
    Verify {
        /// The LBA of the first bad block.
        lba: u64,
        /// Queue id that read it.
        qid: u16,
        /// The generation last written there (0: never written in this run).
        expected_gen: u32,
        /// What the block held instead.
        found: String,
    },
    /// `--verify` was asked for but the run neither read a block nor wrote one to read back
    /// (an `idle` job, say): a verify that checked nothing is not a pass.
    #[error("--verify checked nothing: the {workload} run read no block and wrote none to read back")]
    NothingVerified {
        /// The workload's name.
        workload: &'static str,
    },
    /// A client thread could not be started or pinned, or panicked.
    #[error("client thread: {0}")]
    Thread(String),
}

/// Access pattern of a workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Access {
    /// Uniformly random I/O units.
    Random,
    /// Each queue walks its range in order, wrapping around.
    Sequential,
    /// No I/O at all: the queues stay connected and quiet (for idle CPU).
    Idle,
}

/// What to do: pattern and read share.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Workload {
    /// Access pattern.
    pub access: Access,
    /// Percentage of reads (0..=100).
    pub read_pct: u8,
}

impl Workload {
    /// Parses an spdk_nvme_perf `-w` name: randread, randwrite, randrw, read, write, rw, or
    /// idle; `mix` is the read percentage of rw/randrw (`-M`).
    pub fn parse(name: &str, mix: u8) -> Result<Self, PerfError> {
        let (access, read_pct) = match name {
            "randread" => (Access::Random, 100),
            "randwrite" => (Access::Random, 0),
            "randrw" => (Access::Random, mix),
            "read" => (Access::Sequential, 100),
            "write" => (Access::Sequential, 0),
            "rw" => (Access::Sequential, mix),
            "idle" => (Access::Idle, 0),
            other => {
                return Err(PerfError::Options(format!(
                    "workload {other:?}: expected randread, randwrite, randrw, read, write, rw or idle"
                )));
            }
        };
        if read_pct > 100 {
            return Err(PerfError::Options(format!("read percentage {read_pct} above 100")));
        }
        Ok(Self { access, read_pct })
    }

    /// The spdk_nvme_perf name.
    pub fn name(&self) -> &'static str {
        match (self.access, self.read_pct) {
            (Access::Idle, _) => "idle",
            (Access::Random, 100) => "randread",
            (Access::Random, 0) => "randwrite",
            (Access::Random, _) => "randrw",
            (Access::Sequential, 100) => "read",
            (Access::Sequential, 0) => "write",
            (Access::Sequential, _) => "rw",
        }
    }
}

/// A perf job.
#[derive(Debug, Clone, PartialEq)]
pub struct PerfOpts {
    /// Target address.
    pub addr: SocketAddr,
    /// Subsystem NQN.
    pub subnqn: String,
    /// Host NQN to connect as.
    pub hostnqn: String,
    /// Namespace.
    pub nsid: u32,
    /// Commands in flight per I/O queue.
    pub queue_depth: usize,
    /// Bytes per command (a multiple of the block size).
    pub io_size: u32,
    /// Pattern and read share.
    pub workload: Workload,
    /// Measured time (ignored when [`PerfOpts::ios`] is set).
    pub duration: Duration,
    /// Load before measuring, not counted.
    pub warmup: Duration,
    /// Count-based run: measure exactly this many I/Os (split over the threads).
    pub ios: Option<u64>,
    /// One client thread per entry, pinned to that core when `Some`.
    pub cores: Vec<Option<usize>>,
    /// I/O queues (TCP connections) per client thread.
    pub conns_per_core: usize,
    /// Header and data digests.
    pub digests: Digests,
    /// Write LBA+generation patterns and check every read.
    pub verify: bool,
    /// Pace submissions to this many IOPS in total (None: as fast as the queue depth allows).
    pub rate: Option<f64>,
    /// Bytes of the namespace to use, from LBA 0 (None: all of it).
    pub span: Option<u64>,
    /// No completion for this long with commands in flight is an error; also the deadline of
    /// every connection step.
    pub timeout: Duration,
    /// Seed of the offset generators.
    pub seed: u64,
    /// Before the warmup, write every I/O unit of the range once (preconditioning: reads then
    /// touch written data, not never-written holes).
    pub fill: bool,
    /// Wait for completions in poll(2) instead of busy-polling (one queue per thread only):
    /// for counting the instructions an I/O costs, or a client that must not spin.
    pub blocking: bool,
    /// Keep SQ flow control on the I/O queues. Off by default (Connect CATTR bit 2,
    /// NVMe-oF 1.1 §3.3.1; Linux's `nvme connect --disable-sqflow`): the host never needs
    /// SQHD, and the controller may then answer a read with one C2HData PDU carrying
    /// SUCCESS instead of the data plus a response capsule (NVMe/TCP 1.0 §3.6.2.8).
    pub sqflow: bool,
    /// TLS 1.3 with a PSK on every queue (NVMe/TCP 1.0 §3.6.1), derived for `hostnqn` and
    /// `subnqn` (None: plain TCP).
    pub tls: Option<HostTls>,
    /// DH-HMAC-CHAP keys (NVMe 2.0 §8.13.5) for every queue whose Connect asks for it
    /// (None: connect without).
    pub dhchap: Option<HostDhchap>,
    /// Draw live progress (elapsed, remaining, IOPS) on stderr from a thread of its own:
    /// only for a terminal, never with `--json` (the command line decides).
    pub progress: bool,
}

/// Connect CATTR bit 2: SQ flow control disable (NVMe-oF 1.1 §3.3.1).
const CATTR_DISABLE_SQFLOW: u8 = 1 << 2;

/// The host NQN perf connects as unless told otherwise.
pub const DEFAULT_HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:70011000-7065-7266-0000-000000000001";

impl PerfOpts {
    /// A 4 KiB random-read QD1 job on one unpinned thread, 1 s, no warmup.
    pub fn new(addr: SocketAddr, subnqn: &str) -> Self {
        Self {
            addr,
            subnqn: subnqn.to_string(),
            hostnqn: DEFAULT_HOSTNQN.to_string(),
            nsid: 1,
            queue_depth: 1,
            io_size: 4096,
            workload: Workload {
                access: Access::Random,
                read_pct: 100,
            },
            duration: Duration::from_secs(1),
            warmup: Duration::ZERO,
            ios: None,
            cores: vec![None],
            conns_per_core: 1,
            digests: Digests::NONE,
            verify: false,
            rate: None,
            span: None,
            timeout: Duration::from_secs(5),
            seed: 1,
            blocking: false,
            fill: false,
            sqflow: false,
            tls: None,
            dhchap: None,
            progress: false,
        }
    }

    fn check(&self) -> Result<(), PerfError> {
        let bad = |s: String| Err(PerfError::Options(s));
        if self.queue_depth == 0 || self.queue_depth > 65535 {
            return bad(format!("queue depth {} (1..=65535)", self.queue_depth));
        }
        if self.cores.is_empty() || self.conns_per_core == 0 {
            return bad("at least one core and one connection per core".into());
        }
        if self.cores.len() * self.conns_per_core > 1024 {
            return bad("more than 1024 I/O queues".into());
        }
        if self.io_size == 0 {
            return bad("I/O size 0".into());
        }
        if let Some(r) = self.rate
            && !(r.is_finite() && r > 0.0)
        {
            return bad(format!("rate {r} IOPS"));
        }
        if self.blocking && self.conns_per_core != 1 {
            return bad("--blocking waits on one queue: use --conns-per-core 1".into());
        }
        if self.ios == Some(0) {
            return bad("--ios 0".into());
        }
        Ok(())
    }
}

/// Runs `opts` and reports from the client's side.
pub fn run(opts: &PerfOpts) -> Result<PerfReport, PerfError> {
    run_inner(opts, None)
}

/// Runs `opts`, reading `stats` (an in-process target's
/// [`reactor_stats`](cli::InProcessTarget::reactor_stats))
/// when measuring starts and ends, for the target's CPU per I/O.
pub fn run_with_stats(opts: &PerfOpts, stats: &dyn Fn() -> Vec<ReactorStats>) -> Result<PerfReport, PerfError> {
    run_inner(opts, Some(stats))
}

fn run_inner(opts: &PerfOpts, stats: Option<&dyn Fn() -> Vec<ReactorStats>>) -> Result<PerfReport, PerfError> {
    opts.check()?;
    let nq = opts.cores.len() * opts.conns_per_core;
    let mut co = ControllerOpts::new(
        &opts.subnqn,
        &opts.hostnqn,
        nq as u16,
        // Room for --fill's deeper queue; the run itself keeps queue_depth in flight.
        opts.queue_depth.max(worker::FILL_DEPTH) as u16,
    );
    co.digests = opts.digests;
    co.timeout = opts.timeout;
    co.tls = opts.tls.clone();
    co.dhchap = opts.dhchap.clone();
    if !opts.sqflow {
        co.io_cattr |= CATTR_DISABLE_SQFLOW;
    }
    let connect_err = |source| PerfError::Connect {
        addr: opts.addr,
        subnqn: opts.subnqn.clone(),
        source,
    };
    let mut ctrl = Controller::connect_with(opts.addr, &co).map_err(connect_err)?;
    if ctrl.io.len() < nq {
        return Err(PerfError::Options(format!(
            "asked for {nq} I/O queues, the controller granted {}",
            ctrl.io.len()
        )));
    }
    let depth = ctrl.io[0].depth();
    if depth < opts.queue_depth {
        return Err(PerfError::Options(format!(
            "queue depth {} above the {depth} entries the controller allows (CAP.MQES; conf transport.io_queue_depth)",
            opts.queue_depth
        )));
    }
    let ns = ctrl.admin.identify_namespace(opts.nsid).map_err(connect_err)?;
    let ns_err = |why: String| PerfError::Namespace { nsid: opts.nsid, why };
    if ns.block_size == 0 || ns.nsze == 0 {
        return Err(ns_err("inactive (Identify Namespace is empty)".into()));
    }
    let bs = ns.block_size;
    if !opts.io_size.is_multiple_of(bs) {
        return Err(ns_err(format!(
            "I/O size {} is not a multiple of the {bs}-byte block",
            opts.io_size
        )));
    }
    if let Some(max) = ctrl.max_transfer()
        && u64::from(opts.io_size) > max
    {
        return Err(PerfError::Options(format!(
            "I/O size {} above the controller's MDTS ({max} bytes)",
            opts.io_size
        )));
    }
    if opts.io_size / bs > 65536 {
        return Err(PerfError::Options("I/O size above 65536 blocks".into()));
    }
    let ns_bytes = ns.nsze * u64::from(bs);
    let span = opts.span.unwrap_or(ns_bytes).min(ns_bytes);
    let units = span / u64::from(opts.io_size);
    if units == 0 {
        return Err(ns_err(format!("{span} bytes hold no {}-byte I/O", opts.io_size)));
    }
    // Verify: each queue a disjoint range with room to choose among busy units.
    let per_queue = if opts.verify { units / nq as u64 } else { units };
    if opts.verify && per_queue <= opts.queue_depth as u64 {
        return Err(ns_err(format!(
            "--verify needs more than {} I/O units per queue; {nq} queues share {units}",
            opts.queue_depth
        )));
    }

    let threads = opts.cores.len();
    let shared = Arc::new(Shared {
        phase: AtomicU8::new(worker::WARMUP),
        abort: AtomicBool::new(false),
        finished: std::sync::atomic::AtomicUsize::new(0),
        ready: std::sync::atomic::AtomicUsize::new(0),
        completed: (0..threads).map(|_| worker::Counter::default()).collect(),
    });
    let mut queues = std::mem::take(&mut ctrl.io).into_iter();
    let mut plans = Vec::with_capacity(threads);
    for (t, core) in opts.cores.iter().enumerate() {
        let qs: Vec<_> = queues.by_ref().take(opts.conns_per_core).collect();
        let quota = opts
            .ios
            .map(|n| n / threads as u64 + u64::from((t as u64) < n % threads as u64));
        plans.push(ThreadPlan {
            index: t,
            core: *core,
            queues: qs,
            block_size: bs,
            units_per_queue: per_queue,
            total_queues: nq,
            max_transfer: ctrl
                .max_transfer()
                .map_or(u32::MAX, |m| m.min(u64::from(u32::MAX)) as u32),
            quota,
            rate: opts.rate.map(|r| r / threads as f64),
        });
    }
    let extra: Vec<_> = queues.collect();

    type Joined = Vec<Result<ThreadResult, PerfError>>;
    let (results, wall, before, after, tasks): (Joined, _, _, _, _) = std::thread::scope(|s| {
        let handles: Vec<_> = plans
            .into_iter()
            .map(|plan| {
                let sh = shared.clone();
                std::thread::Builder::new()
                    .name(format!("perf-{}", plan.index))
                    .spawn_scoped(s, move || worker::run_thread(opts, plan, &sh))
            })
            .collect();
        // Off the I/O path: it reads the counters the threads publish, a few times a second.
        let progress = opts.progress.then(|| progress::Progress::start(s, opts, &shared));
        let sleep_until = |until: Instant| {
            while Instant::now() < until && !shared.abort.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(2).min(until.saturating_duration_since(Instant::now())));
            }
        };
        // Connected, pinned and filled: only then does the clock start.
        while shared.ready.load(Ordering::Acquire) < threads && !shared.abort.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(1));
        }
        sleep_until(Instant::now() + opts.warmup);
        let before = stats.map(|f| f());
        let tasks0 = report::task_times();
        let t0 = Instant::now();
        shared.phase.store(worker::MEASURE, Ordering::Release);
        match opts.ios {
            Some(_) => {
                while shared.finished.load(Ordering::Acquire) < threads && !shared.abort.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_micros(200));
                }
            }
            None => sleep_until(t0 + opts.duration),
        }
        let wall = t0.elapsed();
        let after = stats.map(|f| f());
        let tasks1 = report::task_times();
        shared.phase.store(worker::STOP, Ordering::Release);
        if let Some(p) = progress {
            p.finish();
        }
        let joined = handles
            .into_iter()
            .map(|h| match h {
                Ok(h) => h
                    .join()
                    .unwrap_or_else(|_| Err(PerfError::Thread("a client thread panicked".into()))),
                Err(e) => Err(PerfError::Thread(e.to_string())),
            })
            .collect();
        (joined, wall, before, after, (tasks0, tasks1))
    });
    let mut done = Vec::with_capacity(threads);
    let mut first_err = None;
    for r in results {
        match r {
            Ok(t) => done.push(t),
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    let in_place_reads = done
        .iter()
        .flat_map(|t| &t.queues)
        .map(crate::HostQueue::in_place_reads)
        .sum();
    // Orderly goodbye: Disconnect every I/O queue, shut the controller down.
    for t in &mut done {
        ctrl.io.append(&mut t.queues);
    }
    ctrl.io.extend(extra);
    if let Err(e) = ctrl.shutdown() {
        warn!("controller shutdown after the run: {e}");
    }
    let target = match (before, after) {
        (Some(b), Some(a)) => Some(report::target_report(&b, &a, wall)),
        _ => None,
    };
    let mut r = report::build(opts, bs, units, wall, done, target);
    if opts.verify && r.verified_blocks.unwrap_or(0) + r.readback_blocks.unwrap_or(0) == 0 {
        return Err(PerfError::NothingVerified {
            workload: opts.workload.name(),
        });
    }
    r.thread_cpu = report::task_delta(&tasks.0, &tasks.1, wall);
    r.in_place_reads = in_place_reads;
    Ok(r)
}
