//! What a perf run reports, as JSON (serde) and as text.

use std::fmt::Write as _;
use std::time::Duration;

use hdrhistogram::Histogram;
use pollux_reactor::ReactorStats;
use serde::Serialize;

use super::PerfOpts;
use super::placement::Placement;
use super::worker::ThreadResult;

/// Completion latency from submission to the completion being seen, ns.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LatencySummary {
    /// Samples (equals the I/Os counted).
    pub count: u64,
    /// Smallest.
    pub min: u64,
    /// Mean.
    pub avg: f64,
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// 99.99th percentile.
    pub p9999: u64,
    /// Largest.
    pub max: u64,
}

impl LatencySummary {
    pub(super) fn of(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return Self::default();
        }
        Self {
            count: h.len(),
            min: h.min(),
            avg: h.mean(),
            p50: h.value_at_quantile(0.5),
            p90: h.value_at_quantile(0.9),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
            p9999: h.value_at_quantile(0.9999),
            max: h.max(),
        }
    }
}

/// One reactor over the measured window.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReactorReport {
    /// Reactor index.
    pub id: usize,
    /// Pinned core.
    pub core: Option<usize>,
    /// Thread CPU / wall (1.0: a whole core).
    pub cpu: f64,
    /// Share of wall time in iterations that found work.
    pub busy: f64,
    /// Share of wall time in iterations that neither found work nor slept (spinning).
    pub spin: f64,
    /// Share of wall time in poll, hybrid and interrupt mode.
    pub mode_share: [f64; 3],
    /// Mode at the end.
    pub mode: String,
    /// Adaptive-policy mode switches.
    pub switches: u64,
    /// Timed wake-ups (hybrid sleeps).
    pub wakeups: u64,
    /// Device completions the reactor saw.
    pub completions: u64,
    /// What hybrid mode measurably spun per device completion at the end, ns (0: none
    /// measured; [`pollux_reactor::ReactorStats::hybrid_spin_ns`]).
    pub hybrid_spin_ns: u64,
}

/// The target's side, from reactor accounting of an in-process target.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TargetReport {
    /// CPU of all reactors / wall, in cores.
    pub cpu: f64,
    /// Reactor CPU per I/O, ns.
    pub cpu_ns_per_io: f64,
    /// Each reactor.
    pub reactors: Vec<ReactorReport>,
}

/// The result of a perf run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PerfReport {
    /// Workload name (randread, ...).
    pub workload: String,
    /// Read percentage.
    pub read_pct: u8,
    /// Bytes per I/O.
    pub io_size: u32,
    /// Commands in flight per queue.
    pub queue_depth: usize,
    /// Client threads.
    pub threads: usize,
    /// I/O queues in all.
    pub queues: usize,
    /// Header digest.
    pub hdgst: bool,
    /// Data digest.
    pub ddgst: bool,
    /// Every queue ran over TLS 1.3 (`--tls-key`).
    pub tls: bool,
    /// Every queue was set up with DH-HMAC-CHAP keys (`--dhchap-key`; authenticated where
    /// the controller asked).
    pub dhchap: bool,
    /// Pacing asked for, IOPS.
    pub rate: Option<f64>,
    /// Namespace block size.
    pub block_size: u32,
    /// I/O units in the range used.
    pub units: u64,
    /// Measured wall time, s.
    pub seconds: f64,
    /// I/Os counted.
    pub ios: u64,
    /// Reads counted.
    pub reads: u64,
    /// Writes counted.
    pub writes: u64,
    /// I/Os per second.
    pub iops: f64,
    /// MiB per second.
    pub mib_s: f64,
    /// Latency, ns.
    pub latency_ns: LatencySummary,
    /// Client threads' CPU / wall, in cores (busy-polling: about one per thread).
    pub client_cpu: f64,
    /// Share of the client's time in loop iterations that submitted or completed something:
    /// near 1.0 means the client is the bottleneck.
    pub client_busy: f64,
    /// Client work per I/O (busy time / I/Os), ns.
    pub client_ns_per_io: f64,
    /// Loop iterations per I/O (below 1: batching).
    pub client_iterations_per_io: f64,
    /// Blocks read in the measured window and checked by --verify (None without it).
    pub verified_blocks: Option<u64>,
    /// Blocks written during the run (warmup included) that --verify read back after it and
    /// checked against what was last written there (None without --verify).
    pub readback_blocks: Option<u64>,
    /// The in-process target, when measured.
    pub target: Option<TargetReport>,
    /// User and system CPU of this process's reactor and client threads over the measured
    /// window (from /proc/self/task: where the kernel's TCP work shows).
    pub thread_cpu: Vec<ThreadCpu>,
    /// The cache-line round trip between the client's core and the target's right before
    /// and after the run: which of the host's placements of the two (virtual) CPUs the run
    /// had (see [`Placement`]). None when either core is unknown or unpinned.
    pub placement: Option<Placement>,
    /// Reads whose data the client received straight into their buffer (a read alone in
    /// flight, warm-up included; see `HostQueue::fill_in_place`).
    pub in_place_reads: u64,
}

/// One thread's CPU split over the measured window, in fractions of wall time.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ThreadCpu {
    /// Thread name (reactor-N, perf-N).
    pub name: String,
    /// User-mode CPU / wall.
    pub user: f64,
    /// Kernel-mode CPU / wall.
    pub sys: f64,
}

/// (name, utime, stime) in clock ticks of this process's reactor and perf threads.
pub(super) fn task_times() -> Vec<(String, u64, u64)> {
    let mut v = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return v;
    };
    for e in dir.flatten() {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ... : comm may hold spaces, so split at the last ')'.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let name = &stat[open + 1..close];
        if !(name.starts_with("reactor-") || name.starts_with("perf-")) {
            continue;
        }
        let f: Vec<&str> = stat[close + 1..].split_whitespace().collect();
        // After the comm: state is field 3, utime 14, stime 15 (1-based, proc(5)).
        let (Some(u), Some(s)) = (
            f.get(11).and_then(|x| x.parse().ok()),
            f.get(12).and_then(|x| x.parse().ok()),
        ) else {
            continue;
        };
        v.push((name.to_string(), u, s));
    }
    v.sort();
    v
}

pub(super) fn task_delta(a: &[(String, u64, u64)], b: &[(String, u64, u64)], wall: Duration) -> Vec<ThreadCpu> {
    // SAFETY: sysconf has no memory effects; _SC_CLK_TCK is a valid name.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let w = wall.as_secs_f64().max(1e-9);
    b.iter()
        .filter_map(|(n, u1, s1)| {
            let (_, u0, s0) = a.iter().find(|(m, _, _)| m == n)?;
            Some(ThreadCpu {
                name: n.clone(),
                user: u1.saturating_sub(*u0) as f64 / hz / w,
                sys: s1.saturating_sub(*s0) as f64 / hz / w,
            })
        })
        .collect()
}

pub(super) fn target_report(before: &[ReactorStats], after: &[ReactorStats], wall: Duration) -> TargetReport {
    let w = wall.as_nanos().max(1) as f64;
    let mut total_cpu = 0u64;
    let reactors = after
        .iter()
        .map(|a| {
            let d = match before.iter().find(|b| b.id == a.id) {
                Some(b) => a.since(b),
                None => a.clone(),
            };
            total_cpu += d.cpu_ns;
            let mw: u64 = d.mode_ns.iter().sum::<u64>().max(1);
            ReactorReport {
                id: a.id,
                core: a.core,
                cpu: d.cpu_ns as f64 / w,
                busy: d.busy_ns as f64 / mw as f64,
                spin: d.spin_ns as f64 / mw as f64,
                mode_share: std::array::from_fn(|i| d.mode_ns[i] as f64 / mw as f64),
                mode: a.mode.to_string(),
                switches: d.switches,
                wakeups: d.wakeups(),
                completions: d.completions,
                hybrid_spin_ns: a.hybrid_spin_ns,
            }
        })
        .collect();
    TargetReport {
        cpu: total_cpu as f64 / w,
        // Filled in by build() once the I/O count is known.
        cpu_ns_per_io: total_cpu as f64,
        reactors,
    }
}

pub(super) fn build(
    opts: &PerfOpts,
    block_size: u32,
    units: u64,
    wall: Duration,
    threads: Vec<ThreadResult>,
    mut target: Option<TargetReport>,
) -> PerfReport {
    let mut hist: Option<Histogram<u64>> = None;
    let (mut reads, mut writes, mut cpu, mut busy, mut twall, mut verified, mut iters) = (0, 0, 0, 0, 0, 0, 0);
    let mut readback = 0;
    for t in &threads {
        match &mut hist {
            None => hist = Some(t.hist.clone()),
            // Same bounds everywhere, so adding cannot fail.
            Some(h) => {
                let _ = h.add(&t.hist);
            }
        }
        reads += t.reads;
        writes += t.writes;
        cpu += t.cpu_ns;
        busy += t.busy_ns;
        twall += t.wall_ns;
        verified += t.verified_blocks;
        readback += t.readback_blocks;
        iters += t.iterations;
    }
    let ios = reads + writes;
    let secs = wall.as_secs_f64().max(1e-9);
    let per_io = |x: u64| if ios == 0 { 0.0 } else { x as f64 / ios as f64 };
    if let Some(t) = &mut target {
        t.cpu_ns_per_io = per_io(t.cpu_ns_per_io as u64);
    }
    PerfReport {
        workload: opts.workload.name().to_string(),
        read_pct: opts.workload.read_pct,
        io_size: opts.io_size,
        queue_depth: opts.queue_depth,
        threads: opts.cores.len(),
        queues: opts.cores.len() * opts.conns_per_core,
        hdgst: opts.digests.hdgst,
        ddgst: opts.digests.ddgst,
        tls: opts.tls.is_some(),
        dhchap: opts.dhchap.is_some(),
        rate: opts.rate,
        block_size,
        units,
        seconds: secs,
        ios,
        reads,
        writes,
        iops: ios as f64 / secs,
        mib_s: ios as f64 * f64::from(opts.io_size) / secs / (1024.0 * 1024.0),
        latency_ns: hist.as_ref().map(LatencySummary::of).unwrap_or_default(),
        client_cpu: cpu as f64 / (secs * 1e9),
        client_busy: if twall == 0 { 0.0 } else { busy as f64 / twall as f64 },
        client_ns_per_io: per_io(busy),
        client_iterations_per_io: per_io(iters),
        verified_blocks: opts.verify.then_some(verified),
        readback_blocks: opts.verify.then_some(readback),
        target,
        thread_cpu: Vec::new(),
        placement: None,
        in_place_reads: 0,
    }
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

impl PerfReport {
    /// A human-readable summary, spdk_nvme_perf style.
    pub fn text(&self) -> String {
        let mut s = String::new();
        let dg = match (self.hdgst, self.ddgst) {
            (false, false) => "",
            (true, false) => ", header digest",
            (false, true) => ", data digest",
            (true, true) => ", header+data digests",
        };
        let rate = self.rate.map(|r| format!(", paced at {r:.0} IOPS")).unwrap_or_default();
        let tls = if self.tls { ", TLS 1.3" } else { "" };
        let _ = writeln!(
            s,
            "{} {} B, QD {} x {} queue(s) on {} thread(s){dg}{tls}{rate}, {:.2} s",
            self.workload, self.io_size, self.queue_depth, self.queues, self.threads, self.seconds
        );
        let _ = writeln!(
            s,
            "  IOPS {:>10.0}   MiB/s {:>9.1}   I/Os {} ({} reads, {} writes)",
            self.iops, self.mib_s, self.ios, self.reads, self.writes
        );
        let l = &self.latency_ns;
        let _ = writeln!(
            s,
            "  latency us: avg {:.1}  min {:.1}  p50 {:.1}  p90 {:.1}  p99 {:.1}  p99.9 {:.1}  p99.99 {:.1}  max {:.1}",
            l.avg / 1000.0,
            us(l.min),
            us(l.p50),
            us(l.p90),
            us(l.p99),
            us(l.p999),
            us(l.p9999),
            us(l.max)
        );
        let _ = writeln!(
            s,
            "  client: CPU {:.2} cores (busy-polling), busy {:.0}%, {:.0} ns work per I/O, {:.2} loop iterations per I/O",
            self.client_cpu,
            100.0 * self.client_busy,
            self.client_ns_per_io,
            self.client_iterations_per_io
        );
        if self.client_busy > 0.9 {
            let _ = writeln!(
                s,
                "  warning: the client was busy {:.0}% of the time: it may be the bottleneck",
                100.0 * self.client_busy
            );
        }
        if let (Some(v), Some(b)) = (self.verified_blocks, self.readback_blocks) {
            let _ = writeln!(
                s,
                "  verify: {v} blocks checked as read, {b} written blocks read back after the run and checked, no mismatch"
            );
        }
        if !self.thread_cpu.is_empty() {
            let parts: Vec<String> = self
                .thread_cpu
                .iter()
                .map(|t| format!("{} {:.0}% user + {:.0}% sys", t.name, 100.0 * t.user, 100.0 * t.sys))
                .collect();
            let _ = writeln!(s, "  threads: {}", parts.join(", "));
        }
        if let Some(p) = &self.placement {
            let _ = writeln!(
                s,
                "  cores {} and {}: a cache line's round trip {} ns before the run, {} ns after",
                p.client_core, p.target_core, p.before_ns, p.after_ns
            );
        }
        if let Some(t) = &self.target {
            let _ = writeln!(s, "  target: CPU {:.3} cores, {:.0} ns per I/O", t.cpu, t.cpu_ns_per_io);
            for r in &t.reactors {
                let core = r.core.map_or_else(|| "unpinned".to_string(), |c| format!("core {c}"));
                let _ = writeln!(
                    s,
                    "    reactor {} ({core}): CPU {:.1}%, busy {:.1}%, poll/hybrid/interrupt {:.0}/{:.0}/{:.0}%, now {}, {} switches, {} timed wake-ups",
                    r.id,
                    100.0 * r.cpu,
                    100.0 * r.busy,
                    100.0 * r.mode_share[0],
                    100.0 * r.mode_share[1],
                    100.0 * r.mode_share[2],
                    r.mode,
                    r.switches,
                    r.wakeups
                );
            }
        }
        s
    }
}
