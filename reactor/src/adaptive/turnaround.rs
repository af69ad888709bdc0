//! [`TurnaroundSpin`]: spinning through a closed-loop host's turnaround in hybrid mode.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::error::UnknownSpelling;

/// Gaps a [`TurnaroundSpin`] keeps.
pub const GAP_WINDOW: usize = 64;

/// What hybrid mode does while it waits for a host's next command (nothing in flight on its
/// devices; the conf's `[reactors] hybrid_turnaround`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Turnaround {
    /// Spin through a closed-loop host's turnaround when it is shorter than a wake-up
    /// ([`TurnaroundSpin`]), then sleep until an event. Spelled `"spin"`; the default.
    #[default]
    Spin,
    /// Never spin through it: block until an event at once. Spelled `"sleep"`.
    Sleep,
}

impl Turnaround {
    /// The conf spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Turnaround::Spin => "spin",
            Turnaround::Sleep => "sleep",
        }
    }
}

impl fmt::Display for Turnaround {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Turnaround {
    type Err = UnknownSpelling;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "spin" => Ok(Turnaround::Spin),
            "sleep" => Ok(Turnaround::Sleep),
            _ => Err(UnknownSpelling {
                what: "hybrid turnaround",
                given: s.to_owned(),
                expected: "\"spin\" or \"sleep\"",
            }),
        }
    }
}

/// Spinning through the wait for a closed-loop host's next command: between a reactor's
/// device queues going idle (the last completion's response left) and the next submission,
/// a QD1 host turns around in a time as predictable as a device's (here ~15 us). A hybrid
/// reactor that blocks in epoll then pays a whole blocking wake-up (here 38-53 us for an
/// eventfd round trip between the two cores) on every I/O; spinning through it costs the gap.
/// So: spin for the gap's p90 after each idle transition, when that is shorter than
/// `max_spin` (what a wake-up costs, [`TurnaroundSpin::set_wake_cost`]); otherwise (an open
/// loop, a host that thinks between commands) do not spin at all.
#[derive(Debug, Clone)]
pub struct TurnaroundSpin {
    ring: Vec<u64>,
    pos: usize,
    spin_ns: u64,
    /// Longest turnaround worth spinning through.
    pub max_spin: Duration,
    /// Whether to spin at all ([`Turnaround::Sleep`]: never; the gaps are still measured).
    pub rule: Turnaround,
}

impl Default for TurnaroundSpin {
    fn default() -> Self {
        Self {
            ring: Vec::with_capacity(GAP_WINDOW),
            pos: 0,
            spin_ns: 0,
            max_spin: Duration::from_micros(30),
            rule: Turnaround::Spin,
        }
    }
}

impl TurnaroundSpin {
    /// A turnaround spin that follows `rule`.
    pub fn with_rule(rule: Turnaround) -> Self {
        Self {
            rule,
            ..Self::default()
        }
    }

    /// A blocking wake-up costs about twice a timed one's lateness (a context switch out and
    /// one in, and the lateness): the longest spin worth taking.
    pub fn set_wake_cost(&mut self, timed_lateness: Duration) {
        self.max_spin = timed_lateness * 2;
    }

    /// The device queues went idle and the next command came `gap` later.
    pub fn observe_gap(&mut self, gap: Duration) {
        let v = gap.as_nanos().min(u128::from(u64::MAX)) as u64;
        if self.ring.len() < GAP_WINDOW {
            self.ring.push(v);
        } else {
            self.ring[self.pos] = v;
        }
        self.pos = (self.pos + 1) % GAP_WINDOW;
        if self.pos.is_multiple_of(8) || self.ring.len() < GAP_WINDOW {
            let mut w = self.ring.clone();
            let k = ((w.len() as f64 - 1.0) * 0.9).round() as usize;
            self.spin_ns = *w.select_nth_unstable(k).1;
        }
    }

    /// How long to spin after the queues go idle (zero: block at once).
    pub fn spin_for(&self) -> Duration {
        let p90 = Duration::from_nanos(self.spin_ns);
        if self.rule == Turnaround::Spin && self.ring.len() >= 8 && p90 <= self.max_spin {
            p90
        } else {
            Duration::ZERO
        }
    }
}
