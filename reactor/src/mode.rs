//! Reactor modes and the sleep policy used by hybrid mode.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

use crate::error::UnknownSpelling;

/// How a reactor waits for work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Never block: every polled source runs every iteration and the fd set is checked with a
    /// zero timeout. Lowest latency, one whole core.
    Poll,
    /// Sleep on the microsecond timer until shortly before the earliest expected completion
    /// (a [`SleepPolicy`] decides how long), or until an fd wakes the reactor; then poll.
    Hybrid,
    /// Block in epoll until an fd is ready (socket, completion eventfd, message doorbell, timer).
    Interrupt,
}

impl Mode {
    /// All modes, in index order.
    pub const ALL: [Mode; 3] = [Mode::Poll, Mode::Hybrid, Mode::Interrupt];

    /// Stable index for per-mode counters.
    pub fn index(self) -> usize {
        match self {
            Mode::Poll => 0,
            Mode::Hybrid => 1,
            Mode::Interrupt => 2,
        }
    }

    /// The conf-file spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Poll => "poll",
            Mode::Hybrid => "hybrid",
            Mode::Interrupt => "interrupt",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Mode {
    type Err = UnknownSpelling;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "poll" => Ok(Mode::Poll),
            "hybrid" => Ok(Mode::Hybrid),
            "interrupt" => Ok(Mode::Interrupt),
            _ => Err(UnknownSpelling {
                what: "reactor mode",
                given: s.to_owned(),
                expected: "\"poll\", \"hybrid\" or \"interrupt\"",
            }),
        }
    }
}

/// Decides, in hybrid mode, when to wake up before an expected completion.
///
/// A policy is a pure state machine: it is given times, never reads the clock, so it can be
/// driven by synthetic traces in tests.
pub trait SleepPolicy: Send {
    /// A short name for logs and stats.
    fn name(&self) -> &str;
    /// `now` and the earliest expected completion: return the time to wake up, or `None` to
    /// poll without sleeping.
    fn wake_at(&mut self, now: Instant, expected: Instant) -> Option<Instant>;
    /// Feedback after a timed sleep: when the reactor asked to wake and when it really did.
    fn observe_wakeup(&mut self, _requested: Instant, _actual: Instant) {}
    /// How long before an expected completion it wakes (None: not a fixed margin, e.g. a
    /// fraction of the wait): what the adaptive policy counts as hybrid's spin per I/O.
    fn margin(&self) -> Option<Duration> {
        None
    }
}

/// Sleep a fixed fraction of the time left until the expected completion, and not at all when
/// that is below `min_sleep` (a wake-up costs more than it saves).
#[derive(Debug, Clone)]
pub struct FractionSleep {
    /// Fraction of the remaining time to sleep (0..=1).
    pub fraction: f64,
    /// Shortest sleep worth taking.
    pub min_sleep: Duration,
}

impl Default for FractionSleep {
    fn default() -> Self {
        Self {
            fraction: 0.5,
            min_sleep: Duration::from_micros(5),
        }
    }
}

impl SleepPolicy for FractionSleep {
    fn name(&self) -> &str {
        "fraction"
    }

    fn wake_at(&mut self, now: Instant, expected: Instant) -> Option<Instant> {
        let left = expected.checked_duration_since(now)?;
        let sleep = left.mul_f64(self.fraction.clamp(0.0, 1.0));
        (sleep >= self.min_sleep).then(|| now + sleep)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fraction_sleep_sleeps_a_fraction_and_skips_short_waits() {
        let mut p = FractionSleep {
            fraction: 0.5,
            min_sleep: Duration::from_micros(5),
        };
        let t0 = Instant::now();
        assert_eq!(
            p.wake_at(t0, t0 + Duration::from_micros(80)),
            Some(t0 + Duration::from_micros(40))
        );
        assert_eq!(p.wake_at(t0, t0 + Duration::from_micros(8)), None);
        assert_eq!(p.wake_at(t0 + Duration::from_micros(10), t0), None);
    }

    #[test]
    fn mode_round_trips_through_its_name() {
        for m in Mode::ALL {
            assert_eq!(m.as_str().parse::<Mode>(), Ok(m));
        }
        assert!("adaptive-ish".parse::<Mode>().is_err());
    }
}
