//! Per-reactor accounting: written by the reactor thread alone with relaxed atomic stores (no
//! read-modify-write on the hot path), read by anyone as a [`ReactorStats`] snapshot. The one
//! list, the per-class estimates, is behind a mutex that the reactor only tries, once per
//! policy evaluation: it never waits for a reader.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Acquire, Ordering::Relaxed, Ordering::Release};
use std::sync::{Mutex, TryLockError};

use crate::load::ClassStats;
use crate::mode::Mode;
use crate::sys;

/// [`StatsCell::iter_start_ns`] of a reactor whose loop has not started (or whose thread
/// failed to initialise): no iteration is pending.
const NOT_STARTED: u64 = 0;
/// [`StatsCell::iter_start_ns`] while the reactor books an ended iteration into the time
/// counters: a snapshot waits for the next start rather than count that iteration twice
/// (once booked, once as pending).
const BOOKING: u64 = u64::MAX;

/// The process-wide origin of [`mono_ns`]. [`crate::Runtime::start`] takes it before any
/// reactor thread runs, so that every time a reactor reads is after it.
pub(crate) fn epoch() -> std::time::Instant {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(std::time::Instant::now)
}

/// Monotonic nanoseconds since [`epoch`] (so they fit an atomic), never [`NOT_STARTED`].
pub(crate) fn mono_ns() -> u64 {
    mono_ns_at(std::time::Instant::now())
}

/// [`mono_ns`] of a time already read (the loop has one: no second clock read).
///
/// Why at least 1: 0 says "no iteration pending" ([`NOT_STARTED`]). When the epoch was taken
/// lazily here, after the first reactor had read its loop's start, that start saturated to
/// 0: the reactor's first iteration, the whole idle time of an interrupt-mode reactor, read
/// as nothing until it woke (an idle target's summary divided its CPU time by 1 ns).
pub(crate) fn mono_ns_at(t: std::time::Instant) -> u64 {
    (t.saturating_duration_since(epoch()).as_nanos() as u64).clamp(1, BOOKING - 1)
}

/// Buckets of the wake-up lateness histogram: bucket 0 is < 1 us late, bucket i (i >= 1) is
/// [2^(i-1), 2^i) us late, and the last bucket takes everything beyond.
pub const WAKE_BUCKETS: usize = 16;

/// The shared counters of one reactor.
#[derive(Debug, Default)]
pub struct StatsCell {
    pub(crate) core: AtomicUsize,
    pub(crate) tid: AtomicU64,
    pub(crate) mode: AtomicUsize,
    pub(crate) cpu_clock: AtomicU64,
    pub(crate) exited: std::sync::atomic::AtomicBool,
    pub(crate) final_cpu_ns: AtomicU64,
    pub(crate) busy_ns: AtomicU64,
    pub(crate) idle_ns: AtomicU64,
    pub(crate) sleep_ns: AtomicU64,
    pub(crate) spin_ns: AtomicU64,
    pub(crate) iterations: AtomicU64,
    pub(crate) busy_iterations: AtomicU64,
    pub(crate) fd_polls: AtomicU64,
    pub(crate) mode_ns: [AtomicU64; 3],
    pub(crate) mode_entries: [AtomicU64; 3],
    pub(crate) wake_late: [AtomicU64; WAKE_BUCKETS],
    pub(crate) wake_late_sum_ns: AtomicU64,
    pub(crate) msgs_sent: AtomicU64,
    pub(crate) msgs_received: AtomicU64,
    pub(crate) stalls: AtomicU64,
    pub(crate) sources: AtomicU64,
    pub(crate) hot_sources: AtomicU64,
    pub(crate) hot_entries: AtomicU64,
    pub(crate) forced_poll: AtomicU64,
    pub(crate) held: AtomicU64,
    pub(crate) held_ns: AtomicU64,
    pub(crate) hold_entries: AtomicU64,
    pub(crate) adaptive: AtomicU64,
    pub(crate) switches: AtomicU64,
    pub(crate) outstanding: AtomicU64,
    pub(crate) completions: AtomicU64,
    pub(crate) predicted_ns: AtomicU64,
    pub(crate) wake_cost_ns: AtomicU64,
    pub(crate) hybrid_spin_ns: AtomicU64,
    /// The (channel, class) estimates of the last policy evaluation.
    pub(crate) classes: Mutex<Vec<ClassStats>>,
    /// When the iteration in progress began ([`mono_ns`]; [`NOT_STARTED`]: none; [`BOOKING`]:
    /// the ended one is being added to the counters). An iteration blocked in epoll has not
    /// been added to the time counters yet: snapshots add it as idle time, in the current
    /// mode.
    pub(crate) iter_start_ns: AtomicU64,
}

/// Adds to a counter that only this reactor thread writes: a load and a store, no locked
/// instruction.
#[inline]
pub(crate) fn bump(c: &AtomicU64, by: u64) {
    c.store(c.load(Relaxed).wrapping_add(by), Relaxed);
}

impl StatsCell {
    /// The reactor thread ended an iteration: until [`StatsCell::iteration_booked`], snapshots
    /// wait instead of adding the iteration as pending to counters that may already hold it.
    #[inline]
    pub(crate) fn booking_iteration(&self) {
        self.iter_start_ns.store(BOOKING, Relaxed);
        // The marker is visible before any of the counters it guards (a seqlock's writer).
        std::sync::atomic::fence(Release);
    }

    /// The ended iteration is in the counters; the next began at `start_ns` ([`mono_ns`]).
    #[inline]
    pub(crate) fn iteration_booked(&self, start_ns: u64) {
        self.iter_start_ns.store(start_ns, Release);
    }

    pub(crate) fn record_wake_lateness(&self, late_ns: u64) {
        let us = late_ns / 1000;
        let bucket = if us == 0 {
            0
        } else {
            (64 - us.leading_zeros() as usize).min(WAKE_BUCKETS - 1)
        };
        bump(&self.wake_late[bucket], 1);
        bump(&self.wake_late_sum_ns, late_ns);
    }

    /// Publish the per-class estimates, in place (the list only grows when a (channel, class)
    /// is new). Skipped if a reader holds the list: the next evaluation publishes.
    pub(crate) fn publish_classes(&self, classes: impl ExactSizeIterator<Item = ClassStats>) {
        let mut list = match self.classes.try_lock() {
            Ok(l) => l,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return,
        };
        list.truncate(classes.len());
        for (i, c) in classes.enumerate() {
            match list.get_mut(i) {
                Some(slot) => *slot = c,
                None => list.push(c),
            }
        }
    }

    /// Wall time in iterations that found work so far, ns, as booked (the iteration in
    /// progress is not in it): one load, for a reader that samples it often (connection
    /// placement) and needs only its rate.
    pub fn booked_busy_ns(&self) -> u64 {
        self.busy_ns.load(Relaxed)
    }

    /// Read a snapshot. Fields are read one by one: a snapshot taken while the reactor runs is
    /// consistent per counter, which is what rates and fractions need.
    pub fn snapshot(&self, id: usize) -> ReactorStats {
        // A thread's CPU clock is readable from any thread while it lives; after it exits the
        // reactor stored its final value.
        let cpu_ns = if self.exited.load(Relaxed) {
            self.final_cpu_ns.load(Relaxed)
        } else {
            match self.cpu_clock.load(Relaxed) {
                0 => 0, // not started yet (0 would be CLOCK_REALTIME; thread clocks are negative)
                c => sys::clock_ns(c as i64 as libc::clockid_t),
            }
        };
        // The time counters and the pending iteration are read as one: a snapshot taken
        // while the reactor books an iteration retries, or that iteration would be counted
        // twice and the next snapshot would go backwards. Booking takes tens of nanoseconds,
        // but the reactor thread may be preempted in the middle of it for a scheduler slice
        // (milliseconds on a busy machine): a reader waits, yielding, and gives up (adding
        // nothing pending) only after a second, which a reactor thread that died mid-booking
        // would take. A patience counted in spins instead (100,000) ran out in under 4 ms
        // under load, and the snapshot, without the pending iteration, went back by it.
        const PATIENCE: std::time::Duration = std::time::Duration::from_secs(1);
        let mut tries = 0u32;
        let mut waiting_since: Option<std::time::Instant> = None;
        let mut patient = || {
            tries += 1;
            if tries < 64 {
                std::hint::spin_loop();
                return true;
            }
            std::thread::yield_now();
            let t0 = *waiting_since.get_or_insert_with(std::time::Instant::now);
            t0.elapsed() < PATIENCE && !self.exited.load(Relaxed)
        };
        let (mode, busy_ns, idle_ns, mode_ns) = loop {
            let started = self.iter_start_ns.load(Acquire);
            if started == BOOKING && patient() {
                continue;
            }
            let mode = self.mode.load(Relaxed).min(2);
            let busy_ns = self.busy_ns.load(Relaxed);
            let idle_ns = self.idle_ns.load(Relaxed);
            let mode_ns: [u64; 3] = std::array::from_fn(|i| self.mode_ns[i].load(Relaxed));
            std::sync::atomic::fence(Acquire);
            if self.iter_start_ns.load(Relaxed) != started && patient() {
                continue;
            }
            let pending = if started == NOT_STARTED || started == BOOKING || self.exited.load(Relaxed) {
                0
            } else {
                mono_ns().saturating_sub(started)
            };
            let mut mode_ns = mode_ns;
            mode_ns[mode] += pending;
            break (mode, busy_ns, idle_ns + pending, mode_ns);
        };
        ReactorStats {
            id,
            core: match self.core.load(Relaxed) {
                usize::MAX => None,
                c => Some(c),
            },
            tid: self.tid.load(Relaxed),
            mode: Mode::ALL[mode],
            cpu_ns,
            busy_ns,
            idle_ns,
            sleep_ns: self.sleep_ns.load(Relaxed),
            spin_ns: self.spin_ns.load(Relaxed),
            iterations: self.iterations.load(Relaxed),
            busy_iterations: self.busy_iterations.load(Relaxed),
            fd_polls: self.fd_polls.load(Relaxed),
            mode_ns,
            mode_entries: std::array::from_fn(|i| self.mode_entries[i].load(Relaxed)),
            wake_late: std::array::from_fn(|i| self.wake_late[i].load(Relaxed)),
            wake_late_sum_ns: self.wake_late_sum_ns.load(Relaxed),
            msgs_sent: self.msgs_sent.load(Relaxed),
            msgs_received: self.msgs_received.load(Relaxed),
            stalls: self.stalls.load(Relaxed),
            sources: self.sources.load(Relaxed),
            hot_sources: self.hot_sources.load(Relaxed),
            hot_entries: self.hot_entries.load(Relaxed),
            forced_poll: self.forced_poll.load(Relaxed) != 0,
            held: self.held.load(Relaxed) != 0,
            held_ns: self.held_ns.load(Relaxed),
            hold_entries: self.hold_entries.load(Relaxed),
            adaptive: self.adaptive.load(Relaxed) != 0,
            switches: self.switches.load(Relaxed),
            outstanding: self.outstanding.load(Relaxed),
            completions: self.completions.load(Relaxed),
            predicted_ns: self.predicted_ns.load(Relaxed),
            wake_cost_ns: self.wake_cost_ns.load(Relaxed),
            hybrid_spin_ns: self.hybrid_spin_ns.load(Relaxed),
            classes: self.classes.lock().unwrap_or_else(|p| p.into_inner()).clone(),
        }
    }
}

/// A point-in-time copy of one reactor's accounting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReactorStats {
    /// Reactor index.
    pub id: usize,
    /// The core it is pinned to (None: not pinned, as in tests).
    pub core: Option<usize>,
    /// Its thread's id (gettid; 0 until it runs).
    pub tid: u64,
    /// Its current mode.
    pub mode: Mode,
    /// Thread CPU time (CLOCK_THREAD_CPUTIME_ID of the reactor thread), ns.
    pub cpu_ns: u64,
    /// Wall time in iterations that found work, ns.
    pub busy_ns: u64,
    /// Wall time in iterations that found none (including sleeping), ns.
    pub idle_ns: u64,
    /// Wall time blocked in the kernel waiting for events, ns.
    pub sleep_ns: u64,
    /// Wall time in iterations that neither found work nor slept (spinning), ns.
    pub spin_ns: u64,
    /// Loop iterations.
    pub iterations: u64,
    /// Iterations that found work.
    pub busy_iterations: u64,
    /// `epoll_wait` calls (fewer than iterations while busy-poll mode has hot sources).
    pub fd_polls: u64,
    /// Wall time per mode (index: [`Mode::index`]), ns.
    pub mode_ns: [u64; 3],
    /// Times each mode was entered.
    pub mode_entries: [u64; 3],
    /// Lateness of timed wake-ups (requested vs actual), see [`WAKE_BUCKETS`].
    pub wake_late: [u64; WAKE_BUCKETS],
    /// Sum of wake-up lateness, ns.
    pub wake_late_sum_ns: u64,
    /// Messages this reactor sent to others.
    pub msgs_sent: u64,
    /// Messages it received.
    pub msgs_received: u64,
    /// Callbacks that ran longer than the stall threshold.
    pub stalls: u64,
    /// Registered work sources.
    pub sources: u64,
    /// Sources polled outside epoll right now (busy-poll mode's active sockets).
    pub hot_sources: u64,
    /// Times a source was taken out of epoll to be polled (cumulative).
    pub hot_entries: u64,
    /// True while a source without an fd forces an interrupt-mode reactor to poll.
    pub forced_poll: bool,
    /// True while an `always` namespace holds the reactor in busy-poll
    /// ([`crate::Reactor::hold_poll`]).
    pub held: bool,
    /// Wall time in iterations run held in busy-poll by an `always` namespace, ns (also
    /// counted in `mode_ns` under the reactor's own mode).
    pub held_ns: u64,
    /// Times an `always` namespace started holding the reactor in busy-poll.
    pub hold_entries: u64,
    /// The mode is chosen by the adaptive policy.
    pub adaptive: bool,
    /// Mode switches made by the adaptive policy.
    pub switches: u64,
    /// Device commands outstanding on this reactor's channels now.
    pub outstanding: u64,
    /// Device completions seen by this reactor.
    pub completions: u64,
    /// The device completion estimate the adaptive policy sees: the (channel, class)
    /// estimates weighted by their completions per evaluation window, smoothed over windows,
    /// ns (0: none).
    pub predicted_ns: u64,
    /// Measured cost of a timed wake-up (EWMA of its lateness), ns.
    pub wake_cost_ns: u64,
    /// What hybrid mode measurably spun per device completion (iterations that neither found
    /// work nor slept), ns: an adaptive reactor's smoothed figure while it stands, a fixed
    /// hybrid reactor's last window (0: none measured).
    pub hybrid_spin_ns: u64,
    /// Per (channel, class) estimates behind `predicted_ns`, in the order they first completed.
    pub classes: Vec<ClassStats>,
}

impl ReactorStats {
    /// Timed wake-ups counted.
    pub fn wakeups(&self) -> u64 {
        self.wake_late.iter().sum()
    }

    /// Approximate lateness percentile from the histogram (upper bound of the bucket), in us.
    pub fn wake_late_percentile_us(&self, p: f64) -> Option<u64> {
        let total = self.wakeups();
        if total == 0 {
            return None;
        }
        let want = ((total as f64) * p).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, n) in self.wake_late.iter().enumerate() {
            seen += n;
            if seen >= want {
                return Some(if i == 0 { 1 } else { 1u64 << i });
            }
        }
        None
    }

    /// Differences of the monotonically growing counters since `earlier` (for rates).
    pub fn since(&self, earlier: &ReactorStats) -> ReactorStats {
        let d = |a: u64, b: u64| a.saturating_sub(b);
        ReactorStats {
            id: self.id,
            core: self.core,
            tid: self.tid,
            mode: self.mode,
            cpu_ns: d(self.cpu_ns, earlier.cpu_ns),
            busy_ns: d(self.busy_ns, earlier.busy_ns),
            idle_ns: d(self.idle_ns, earlier.idle_ns),
            sleep_ns: d(self.sleep_ns, earlier.sleep_ns),
            spin_ns: d(self.spin_ns, earlier.spin_ns),
            iterations: d(self.iterations, earlier.iterations),
            busy_iterations: d(self.busy_iterations, earlier.busy_iterations),
            fd_polls: d(self.fd_polls, earlier.fd_polls),
            mode_ns: std::array::from_fn(|i| d(self.mode_ns[i], earlier.mode_ns[i])),
            mode_entries: std::array::from_fn(|i| d(self.mode_entries[i], earlier.mode_entries[i])),
            wake_late: std::array::from_fn(|i| d(self.wake_late[i], earlier.wake_late[i])),
            wake_late_sum_ns: d(self.wake_late_sum_ns, earlier.wake_late_sum_ns),
            msgs_sent: d(self.msgs_sent, earlier.msgs_sent),
            msgs_received: d(self.msgs_received, earlier.msgs_received),
            stalls: d(self.stalls, earlier.stalls),
            sources: self.sources,
            hot_sources: self.hot_sources,
            hot_entries: d(self.hot_entries, earlier.hot_entries),
            forced_poll: self.forced_poll,
            held: self.held,
            held_ns: d(self.held_ns, earlier.held_ns),
            hold_entries: d(self.hold_entries, earlier.hold_entries),
            adaptive: self.adaptive,
            switches: d(self.switches, earlier.switches),
            outstanding: self.outstanding,
            completions: d(self.completions, earlier.completions),
            predicted_ns: self.predicted_ns,
            wake_cost_ns: self.wake_cost_ns,
            hybrid_spin_ns: self.hybrid_spin_ns,
            classes: self.classes.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lateness_buckets_are_log2_microseconds() {
        let s = StatsCell::default();
        s.record_wake_lateness(500); // < 1 us
        s.record_wake_lateness(1_500); // [1, 2) us
        s.record_wake_lateness(3_000); // [2, 4) us
        s.record_wake_lateness(10_000_000_000); // far out: last bucket
        let snap = s.snapshot(0);
        assert_eq!(snap.wake_late[0], 1);
        assert_eq!(snap.wake_late[1], 1);
        assert_eq!(snap.wake_late[2], 1);
        assert_eq!(snap.wake_late[WAKE_BUCKETS - 1], 1);
        assert_eq!(snap.wakeups(), 4);
        assert_eq!(snap.wake_late_percentile_us(0.5), Some(2));
    }

    #[test]
    fn classes_are_published_in_place() {
        let s = StatsCell::default();
        let class = |n: &str, c: usize| ClassStats {
            channel: n.into(),
            class: c,
            estimate_ns: 1000 * c as u64,
            completions: 1,
            window_completions: 1,
        };
        s.publish_classes([class("a", 0), class("b", 5)].into_iter());
        assert_eq!(s.snapshot(0).classes, vec![class("a", 0), class("b", 5)]);
        s.publish_classes([class("a", 1)].into_iter());
        assert_eq!(s.snapshot(0).classes, vec![class("a", 1)]);
        // A reader holding the list: the reactor skips this publication instead of waiting.
        let held = s.classes.lock().unwrap_or_else(|p| p.into_inner());
        s.publish_classes([class("c", 2)].into_iter());
        drop(held);
        assert_eq!(s.snapshot(0).classes, vec![class("a", 1)]);
    }

    /// Defect: a reader gave up waiting for a booking after 100,000 tries (a few
    /// milliseconds) and returned the counters without the pending iteration; a reactor
    /// preempted mid-booking under load made the next snapshot go back by that iteration.
    #[test]
    fn a_snapshot_waits_for_a_booking_the_reactor_was_preempted_in() {
        let s = std::sync::Arc::new(StatsCell::default());
        let start = mono_ns();
        s.iteration_booked(start);
        std::thread::sleep(std::time::Duration::from_millis(5));
        let before = s.snapshot(0).idle_ns;
        assert!(before >= 5_000_000, "the pending iteration counts: {before}");
        // The reactor ends that iteration and is preempted half way through booking it.
        let end = mono_ns();
        s.booking_iteration();
        let reactor = {
            let s = s.clone();
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(50));
                bump(&s.idle_ns, end - start);
                bump(&s.mode_ns[0], end - start);
                s.iteration_booked(end);
            })
        };
        let t0 = std::time::Instant::now();
        let during = s.snapshot(0);
        let waited = t0.elapsed();
        reactor.join().unwrap_or_else(|_| panic!("booking thread"));
        assert!(
            waited >= std::time::Duration::from_millis(40),
            "did not wait: {waited:?}"
        );
        assert!(during.idle_ns >= before, "went back: {before} then {}", during.idle_ns);
        assert_eq!(during.mode_ns[0], during.idle_ns);
    }
}
