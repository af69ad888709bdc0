//! Per-namespace QoS limits (issue 38; the conf's `qos`, `pollux ctl set-qos`): one budget of
//! the namespace, shared by every host, queue and reactor that reaches it, as SPDK's bdev QoS
//! (`bdev_set_qos_limit`) and ceph-nvmeof's `namespace set_qos` have it.
//!
//! Each limit is a token bucket in one 64-bit atomic, written as the Generic Cell Rate
//! Algorithm keeps it (ITU-T I.371; RFC 2697's buckets are the same thing counted the other
//! way): its *theoretical arrival time* (TAT), the instant at which everything taken from the
//! bucket so far is paid for at the limit's rate. A command of cost `c` (1 / rate per command,
//! bytes / byte rate) arriving at `now` moves it from `old` to `max(old, now) + c` with one
//! compare-and-swap, whichever reactor it arrives on: no lock, no message, and the shared
//! budget is exact whatever the number of reactors (a per-reactor share rebalanced by message
//! would drift by the rebalancing period). The command may run from `max(old, now) - BURST_NS`:
//! at once while the bucket is less than [`BURST_NS`] in debt (an idle namespace may serve
//! 10 ms of its rate at once), else at that time — so each command learns when it runs as it
//! takes its cost, in the order commands reach the bucket across all queues and reactors, and
//! none can be overtaken forever. Its cost is taken whether it runs now or later: long-run
//! the rate is exact; a command released late by less than the burst loses nothing.
//!
//! What is counted ([`crate::nvm::Io::qos_cost`]): `iops` counts Read, Write, Compare, Verify, Write Zeroes,
//! Dataset Management and Copy; bytes are those of Read, Compare and Verify (read from the
//! store) and Write (the host's). Flush and the reservation commands are never held.
//!
//! The cost for a namespace without limits is [`NsQos::is_on`]: one relaxed load of a flag in
//! the namespace and a branch. Limits change in place ([`NsQos::set`]): a new generation,
//! which queues holding commands under the old one notice ([`RECHECK_NS`]).

use std::sync::atomic::{AtomicU64, Ordering};

use pollux_conf::Qos;

/// How far a bucket may be in debt before a command waits: the burst a namespace idle for a
/// while may serve at once (10 ms of its rate), and the lateness a release timer may have
/// without losing any of the rate. SPDK's bdev QoS refills every 1 ms timeslice; a longer
/// allowance here keeps a loaded reactor's late timers from costing the tenant its rate.
pub const BURST_NS: u64 = 10_000_000;

/// How often a queue holding commands looks whether its namespace's limits changed: commands
/// held under old limits are timed again under the new ones at most this late.
pub const RECHECK_NS: u64 = 50_000_000;

const NS_PER_S: u128 = 1_000_000_000;

/// One limit: a rate and its bucket's theoretical arrival time.
#[derive(Debug, Default)]
pub struct Bucket {
    /// Units (commands or bytes) per second; 0: no limit.
    rate: AtomicU64,
    /// CLOCK_MONOTONIC ns by which what was taken is paid for at `rate`.
    tat: AtomicU64,
}

impl Bucket {
    /// A bucket of `rate` units per second (0: no limit), idle.
    pub fn new(rate: u64) -> Self {
        Self {
            rate: AtomicU64::new(rate),
            tat: AtomicU64::new(0),
        }
    }

    /// Its rate (0: no limit).
    pub fn rate(&self) -> u64 {
        self.rate.load(Ordering::Relaxed)
    }

    /// A new rate; the bucket starts idle (what the old rate was owed is forgiven).
    fn set(&self, rate: u64) {
        self.rate.store(rate, Ordering::Relaxed);
        self.tat.store(0, Ordering::Relaxed);
    }

    /// Take the cost of `units` at `now` (CLOCK_MONOTONIC ns): the time from which the
    /// command may run (at or before `now`: at once). Without a limit, or for nothing, 0.
    pub fn take(&self, units: u64, now: u64) -> u64 {
        let rate = self.rate();
        if rate == 0 || units == 0 {
            return 0;
        }
        // Rounded up: the rate served never exceeds the limit.
        let cost = (u128::from(units) * NS_PER_S).div_ceil(u128::from(rate));
        let cost = u64::try_from(cost).unwrap_or(u64::MAX);
        let mut old = self.tat.load(Ordering::Relaxed);
        loop {
            // An idle bucket (its debt paid before now) starts from now: what it did not
            // serve while idle is not saved up beyond the burst.
            let start = old.max(now);
            match self
                .tat
                .compare_exchange_weak(old, start.saturating_add(cost), Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return start.saturating_sub(BURST_NS),
                Err(now_there) => old = now_there,
            }
        }
    }
}

/// What one command costs against each limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cost {
    /// Commands (`iops`).
    pub cmds: u64,
    /// Bytes read from the store (`mbps`, `read_mbps`).
    pub read: u64,
    /// Bytes of host data written (`mbps`, `write_mbps`).
    pub write: u64,
}

/// A namespace's limits and their buckets, shared by every reactor (it lives in the
/// [`crate::subsystem::Namespace`]). Aligned to its own cache lines: the buckets are written
/// by every limited command, and must not share a line with what every command of the
/// namespace reads.
#[derive(Debug, Default)]
#[repr(align(64))]
pub struct NsQos {
    /// Bit 0: some limit is set; above it, the generation of the limits (one more at each
    /// [`NsQos::set`]).
    state: AtomicU64,
    iops: Bucket,
    /// Bytes read and written (`mbps`).
    bytes: Bucket,
    read: Bucket,
    write: Bucket,
    /// Commands held so far, by every reactor.
    held: AtomicU64,
}

impl NsQos {
    /// The limits `q` (none: off).
    pub fn new(q: &Qos) -> Self {
        let s = Self::default();
        s.set(q);
        s
    }

    /// Some limit is set: the one test every command of the namespace pays.
    #[inline(always)]
    pub fn is_on(&self) -> bool {
        self.state.load(Ordering::Relaxed) & 1 != 0
    }

    /// The generation of the limits: it changes whenever they are set.
    pub fn generation(&self) -> u64 {
        // Acquire: a queue that sees the new generation sees the new rates it times its held
        // commands with.
        self.state.load(Ordering::Acquire) >> 1
    }

    /// Set the limits (the control thread, one change at a time: `crate::mutate`). The
    /// buckets start idle; commands held under the old limits are timed again under these
    /// by their queues (within [`RECHECK_NS`]).
    pub fn set(&self, q: &Qos) {
        let mib = |v: Option<u64>| v.map_or(0, |m| m.saturating_mul(Qos::MIB));
        self.iops.set(q.iops.unwrap_or(0));
        self.bytes.set(mib(q.mbps));
        self.read.set(mib(q.read_mbps));
        self.write.set(mib(q.write_mbps));
        let on = u64::from(!q.is_unlimited());
        // Release: after the rates, for the queues that read the generation (Acquire).
        let _ = self.state.fetch_update(Ordering::Release, Ordering::Relaxed, |s| {
            Some((((s >> 1) + 1) << 1) | on)
        });
    }

    /// The limits now.
    pub fn limits(&self) -> Qos {
        let n = |b: &Bucket| Some(b.rate()).filter(|&r| r != 0);
        let mib = |b: &Bucket| n(b).map(|r| r / Qos::MIB);
        Qos {
            iops: n(&self.iops),
            mbps: mib(&self.bytes),
            read_mbps: mib(&self.read),
            write_mbps: mib(&self.write),
        }
    }

    /// Take a command's `cost` at `now` from every bucket it draws on: the time from which it
    /// may run (at or before `now`: at once), the latest of theirs.
    pub fn take(&self, cost: Cost, now: u64) -> u64 {
        self.iops
            .take(cost.cmds, now)
            .max(self.bytes.take(cost.read + cost.write, now))
            .max(self.read.take(cost.read, now))
            .max(self.write.take(cost.write, now))
    }

    /// A command was held.
    pub fn count_held(&self) {
        self.held.fetch_add(1, Ordering::Relaxed);
    }

    /// Commands held so far.
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests;
