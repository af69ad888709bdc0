//! [`MarginSleep`]: the hybrid sleep policy, woken early by the measured lateness of timed
//! wake-ups.

use std::time::{Duration, Instant};

use crate::mode::SleepPolicy;

/// Lateness samples a [`MarginSleep`] keeps.
pub const LATE_WINDOW: usize = 256;
/// A [`MarginSleep`] whose margin covers every wait sleeps anyway once in this many, to
/// measure the lateness again.
pub const PROBE_EVERY: u32 = 32;

/// Hybrid sleep: wake at the predicted completion minus a high quantile (`quantile`, p99 by
/// default) of how late timed wake-ups really were, over the last [`LATE_WINDOW`] of them;
/// and do not sleep at all when the sleep would be shorter than a wake-up costs (the median
/// lateness, at least `min_sleep`): spinning through it is cheaper and never late.
///
/// Why a quantile, not a mean plus deviations: on a VM the lateness is heavy-tailed (here
/// 13-24 us at p50, 21-77 us at p99). A mean plus two mean deviations sits near the body of
/// the distribution, so every tail wake-up overshoots the completion by the tail's excess,
/// which at QD1 is latency added to that I/O; the quantile says directly how often a wake-up
/// may be late: at p99, one in a hundred.
#[derive(Debug, Clone)]
pub struct MarginSleep {
    ring: Vec<u64>,
    pos: usize,
    since_update: usize,
    margin_ns: u64,
    cost_ns: u64,
    /// Waits declined in a row only because the margin covered them.
    declined: u32,
    /// A margin given by the operator (`hybrid_margin_us`): used as it is, never measured.
    fixed: Option<u64>,
    /// The lateness quantile woken ahead of (0..=1).
    pub quantile: f64,
    /// Shortest sleep worth taking, whatever the measured cost.
    pub min_sleep: Duration,
}

impl Default for MarginSleep {
    fn default() -> Self {
        // Start pessimistic (a wake-up is ~ 10-15 us late here) and learn.
        Self {
            ring: Vec::with_capacity(LATE_WINDOW),
            pos: 0,
            since_update: 0,
            margin_ns: 14_000,
            cost_ns: 10_000,
            declined: 0,
            fixed: None,
            quantile: 0.99,
            min_sleep: Duration::from_micros(4),
        }
    }
}

impl MarginSleep {
    /// A margin sleep that wakes `margin` before each predicted completion, whatever the
    /// measured lateness (None: the measured `quantile`, as [`MarginSleep::default`]). The
    /// lateness is still measured for the wake-up cost, which decides what wait is too
    /// short to sleep in.
    pub fn with_margin(margin: Option<Duration>) -> Self {
        Self {
            fixed: margin.map(|m| m.as_nanos().min(u128::from(u64::MAX)) as u64),
            ..Self::default()
        }
    }

    /// The current margin: the one given ([`MarginSleep::with_margin`]), else the `quantile`
    /// of the measured lateness.
    pub fn margin(&self) -> Duration {
        Duration::from_nanos(self.fixed.unwrap_or(self.margin_ns))
    }

    /// What a timed wake-up costs: the median measured lateness (at least `min_sleep`).
    pub fn wake_cost(&self) -> Duration {
        Duration::from_nanos(self.cost_ns).max(self.min_sleep)
    }

    fn quantile_of(v: &mut [u64], q: f64) -> u64 {
        let k = ((v.len() as f64 - 1.0) * q.clamp(0.0, 1.0)).round() as usize;
        *v.select_nth_unstable(k).1
    }

    fn update(&mut self) {
        let mut v = self.ring.clone();
        self.margin_ns = Self::quantile_of(&mut v, self.quantile);
        self.cost_ns = Self::quantile_of(&mut v, 0.5);
    }
}

impl SleepPolicy for MarginSleep {
    fn name(&self) -> &str {
        "margin"
    }

    fn wake_at(&mut self, now: Instant, expected: Instant) -> Option<Instant> {
        let left = expected.checked_duration_since(now)?;
        if let Some(sleep) = left.checked_sub(self.margin())
            && sleep >= self.wake_cost()
        {
            self.declined = 0;
            return Some(now + sleep);
        }
        // Declined. When the wait itself is long enough to sleep in but the margin covers
        // it, the margin may be stale: it is only measured by sleeping, so a burst of late
        // wake-ups (a preempted VM) that pushed its p99 past the device's latency would keep
        // hybrid spinning through every wait for good. Every PROBE_EVERY such waits, sleep
        // half of one anyway to measure again (at most one I/O in 32 pays a wake-up). The
        // measured cost is as stale as the margin: the floor decides what is worth it. A
        // given margin is never stale: nothing to measure.
        if self.fixed.is_none() && left >= 4 * self.min_sleep {
            self.declined += 1;
            if self.declined >= PROBE_EVERY {
                self.declined = 0;
                return Some(now + left / 2);
            }
        }
        None
    }

    fn margin(&self) -> Option<Duration> {
        Some(MarginSleep::margin(self))
    }

    fn observe_wakeup(&mut self, requested: Instant, actual: Instant) {
        let late = actual
            .saturating_duration_since(requested)
            .as_nanos()
            .min(u128::from(u64::MAX)) as u64;
        if self.ring.len() < LATE_WINDOW {
            self.ring.push(late);
        } else {
            self.ring[self.pos] = late;
        }
        self.pos = (self.pos + 1) % LATE_WINDOW;
        self.since_update += 1;
        // Re-select every 16 wake-ups once the window is full (O(window) each), on every one
        // while it fills (the pessimistic start goes at once).
        if self.ring.len() < LATE_WINDOW || self.since_update >= 16 {
            self.update();
            self.since_update = 0;
        }
    }
}
