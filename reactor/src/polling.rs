//! Per-namespace polling policy ("control over when the hammer swings"): whether the commands
//! in flight on one namespace may make its reactor spin. A pure part (what each setting means
//! in each mode, [`Polling::device_wait`] and [`Polling::shape`]; the `always` hold,
//! [`SpinHold`]) tested with synthetic traces, and the cell the control plane writes and the
//! reactors read ([`PollingCell`]: one relaxed atomic byte, no lock on the I/O path).
//!
//! What the settings mean, mode by mode (the effective mode: a reactor whose only wait is a
//! polled fd-less source runs as `poll` whatever it is set to):
//!
//! | setting | `poll` | `hybrid` | `interrupt` | adaptive |
//! |---|---|---|---|---|
//! | `auto` | spins | timed sleep, then spins up to the completion | interrupt | the policy's mode |
//! | `always` | spins | spins (held in poll) | spins (held in poll) | spins (held in poll) |
//! | `never` | spins (for other reasons) | interrupt | interrupt | interrupt; not counted by the policy |
//!
//! `always` *holds* the reactor in busy-poll from each command on the namespace until
//! [`ALWAYS_LINGER`] after the last one it saw in flight: the hold is what makes the next
//! command of a closed-loop host (which arrives on a socket, before anything says which
//! namespace it is for) find the reactor spinning, as in poll mode.
//!
//! `never` makes the namespace's channel wait for its device's interrupt (eventfd) instead of
//! reporting an expected completion: it never starts a hybrid sleep-then-spin nor a busy-poll,
//! and the adaptive policy does not count its completions as a reason to poll or to choose
//! hybrid. It cannot stop a reactor that spins for another reason: a fixed `poll` reactor, a
//! reactor held by an `always` namespace, or one whose other load makes the policy poll. Then
//! its channel is polled with the rest (its completions are found at the next iteration).

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};
use std::time::{Duration, Instant};

use crate::error::UnknownSpelling;
use crate::mode::Mode;
use crate::next::Next;

/// How long an `always` namespace holds its reactor in busy-poll after the last command it
/// saw in flight. Why 1 ms: it is the time a busy connection stays hot in poll mode
/// ([`crate::COLD_AFTER`]), far longer than a closed-loop host's turnaround
/// (tens of us here) and than a DRAM or Optane-class device's latency, so a namespace in use
/// keeps the reactor spinning between its commands; a namespace idle for 1 ms lets it sleep.
pub const ALWAYS_LINGER: Duration = Duration::from_millis(1);

/// A namespace's polling policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Polling {
    /// The reactor's mode (and adaptive policy) decide.
    #[default]
    Auto,
    /// Busy-poll while the namespace has commands in flight (and [`ALWAYS_LINGER`] after).
    Always,
    /// Its commands never make the reactor spin: they wait for the device's interrupt.
    Never,
}

/// How a device channel waits for its commands in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceWait {
    /// The reactor polls it (busy-poll, or hybrid's sleep-then-poll): report the expected
    /// completion ([`Next::Expect`]); no interrupt is needed.
    Poll,
    /// The reactor sleeps until the device's interrupt: arm it, report [`Next::Idle`].
    Interrupt,
}

impl Polling {
    /// All settings, in index order.
    pub const ALL: [Polling; 3] = [Polling::Auto, Polling::Always, Polling::Never];

    /// The conf spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Polling::Auto => "auto",
            Polling::Always => "always",
            Polling::Never => "never",
        }
    }

    fn index(self) -> u8 {
        match self {
            Polling::Auto => 0,
            Polling::Always => 1,
            Polling::Never => 2,
        }
    }

    /// How a channel with this setting waits for its commands under effective mode `mode`
    /// (the table of the module docs): a polling reactor polls everything it has (`never`
    /// cannot stop it, and an interrupt would only wake a reactor that is awake); a sleeping
    /// one needs the interrupt in interrupt mode, and for `never` in hybrid mode too.
    /// (`always` never sees a sleeping mode while it has commands in flight: it holds the
    /// reactor in poll.)
    pub fn device_wait(self, mode: Mode) -> DeviceWait {
        match (self, mode) {
            (_, Mode::Poll) => DeviceWait::Poll,
            (Polling::Never, _) | (_, Mode::Interrupt) => DeviceWait::Interrupt,
            (_, Mode::Hybrid) => DeviceWait::Poll,
        }
    }

    /// A channel's [`Next`] with this setting applied, under effective mode `mode`: `never`
    /// turns an expected completion into waiting for the fd (the interrupt), so that it
    /// starts no hybrid sleep-then-spin. A source without an fd cannot sleep on one: for it
    /// the expected time becomes a plain deadline (a timed wake-up at it, no spin before; a
    /// command still running then is polled for, having no other way to be seen).
    /// Real work ([`Next::Asap`]) and deadlines pass unchanged.
    pub fn shape(self, next: Next, mode: Mode, has_fd: bool) -> Next {
        if self != Polling::Never || self.device_wait(mode) != DeviceWait::Interrupt {
            return next; // `auto` is today's behaviour exactly; `always` holds poll instead
        }
        match next {
            Next::Expect(_) if has_fd => Next::Idle,
            Next::Expect(t) => Next::At(t),
            other => other,
        }
    }
}

impl fmt::Display for Polling {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Polling {
    type Err = UnknownSpelling;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Polling::Auto),
            "always" => Ok(Polling::Always),
            "never" => Ok(Polling::Never),
            _ => Err(UnknownSpelling {
                what: "polling",
                given: s.to_owned(),
                expected: "\"auto\", \"always\" or \"never\"",
            }),
        }
    }
}

/// A namespace's polling setting as shared by the control plane (which changes it) and every
/// reactor (which reads it on each command and channel run): one atomic byte, read relaxed.
/// Why relaxed is enough: the setting orders no other memory; a reactor that reads the old
/// value for one more command is as if the change came a moment later.
#[derive(Debug, Default)]
pub struct PollingCell(AtomicU8);

impl PollingCell {
    /// A cell holding `p`.
    pub fn new(p: Polling) -> Self {
        Self(AtomicU8::new(p.index()))
    }

    /// The current setting.
    #[inline]
    pub fn get(&self) -> Polling {
        match self.0.load(Relaxed) {
            1 => Polling::Always,
            2 => Polling::Never,
            _ => Polling::Auto,
        }
    }

    /// Change it (takes effect at each reactor's next command or channel run on it).
    pub fn set(&self, p: Polling) {
        self.0.store(p.index(), Relaxed);
    }
}

/// The `always` hold of one reactor, as a pure state machine: each sign of an `always`
/// namespace's command in flight ([`SpinHold::note`]) holds the reactor in busy-poll until
/// `linger` after it.
#[derive(Debug, Clone)]
pub struct SpinHold {
    until: Option<Instant>,
    linger: Duration,
}

impl Default for SpinHold {
    fn default() -> Self {
        Self::new(ALWAYS_LINGER)
    }
}

impl SpinHold {
    /// A hold that lasts `linger` after each note.
    pub fn new(linger: Duration) -> Self {
        Self { until: None, linger }
    }

    /// An `always` command was seen in flight (submitted, running, completing) at `now`.
    pub fn note(&mut self, now: Instant) {
        let t = now + self.linger;
        self.until = Some(self.until.map_or(t, |u| u.max(t)));
    }

    /// Whether the hold is on at `now`.
    pub fn active(&self, now: Instant) -> bool {
        self.until.is_some_and(|u| now < u)
    }

    /// The mode the reactor runs at `now` when it is set to (or its policy chose) `base`.
    pub fn mode(&self, base: Mode, now: Instant) -> Mode {
        if self.active(now) { Mode::Poll } else { base }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    #[test]
    fn names_round_trip_and_the_cell_holds_each_setting() {
        let c = PollingCell::default();
        assert_eq!(c.get(), Polling::Auto);
        for p in Polling::ALL {
            assert_eq!(p.as_str().parse::<Polling>(), Ok(p));
            c.set(p);
            assert_eq!(c.get(), p);
        }
        assert!("sometimes".parse::<Polling>().is_err());
    }

    #[test]
    fn the_override_in_every_mode() {
        let t = Instant::now() + 80 * US;
        let expect = Next::Expect(t);
        for mode in Mode::ALL {
            // auto: what the mode does today.
            let auto = Polling::Auto.device_wait(mode);
            assert_eq!(
                auto,
                if mode == Mode::Interrupt {
                    DeviceWait::Interrupt
                } else {
                    DeviceWait::Poll
                },
                "{mode}"
            );
            assert_eq!(Polling::Auto.shape(expect, mode, true), expect);
            // never: an interrupt wait in every sleeping mode; in poll mode polled with the rest.
            let never = Polling::Never.device_wait(mode);
            let next = Polling::Never.shape(expect, mode, true);
            if mode == Mode::Poll {
                assert_eq!((never, next), (DeviceWait::Poll, expect));
            } else {
                assert_eq!((never, next), (DeviceWait::Interrupt, Next::Idle), "{mode}");
                assert_eq!(
                    Polling::Never.shape(expect, mode, false),
                    Next::At(t),
                    "no fd: one timed wake"
                );
            }
            // Real work and deadlines are never changed.
            for p in Polling::ALL {
                assert_eq!(p.shape(Next::Asap, mode, true), Next::Asap);
                assert_eq!(p.shape(Next::At(t), mode, true), Next::At(t));
                assert_eq!(p.shape(Next::Idle, mode, true), Next::Idle);
            }
        }
    }

    /// A synthetic trace: an `always` namespace's QD1 commands every 30 us for 1 ms, then
    /// nothing; the hold keeps every base mode in poll from the first command to the linger
    /// after the last, and gives the base mode back after.
    #[test]
    fn always_holds_poll_in_every_mode_until_the_linger() {
        let t0 = Instant::now();
        for base in Mode::ALL {
            let mut h = SpinHold::new(200 * US);
            assert_eq!(h.mode(base, t0), base, "no hold before any command");
            let mut last = t0;
            for k in 0..34u32 {
                let at = t0 + k * 30 * US;
                h.note(at);
                // Between commands (the host's turnaround): still polling.
                assert_eq!(h.mode(base, at + 15 * US), Mode::Poll, "{base} at {k}");
                last = at;
            }
            assert_eq!(h.mode(base, last + 199 * US), Mode::Poll);
            assert_eq!(h.mode(base, last + 200 * US), base, "{base}: released at the linger");
            // A late note never shortens the hold.
            h.note(last + 300 * US);
            h.note(last + 100 * US);
            assert!(h.active(last + 499 * US));
        }
    }
}
