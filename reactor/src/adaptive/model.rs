//! [`LatencyModel`]: per (operation, size class) estimate of a device's completion time.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

use crate::error::UnknownSpelling;
use crate::next::Next;

/// Size classes: <= 4 KiB, <= 16 KiB, <= 64 KiB, <= 256 KiB, larger; times read/write.
pub const SIZE_CLASSES: usize = 5;
/// Names of the size classes, as [`LatencyModel::class`] draws them.
pub const SIZE_CLASS_NAMES: [&str; SIZE_CLASSES] = ["<=4KiB", "<=16KiB", "<=64KiB", "<=256KiB", ">256KiB"];
/// Samples kept per class.
pub const WINDOW: usize = 64;
/// The estimate is this percentile of the window.
pub const PERCENTILE: f64 = 0.10;

/// Which estimator a model uses, and so which sleep policy a hybrid reactor follows (the
/// conf's `[reactors] policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ModelKind {
    /// Low percentile of exact samples, censored samples clamped, woken early by a margin
    /// learned from measured wake-up lateness ([`crate::MarginSleep`]). Spelled `"pollux"`;
    /// the default.
    #[default]
    Robust,
    /// Mean of every observed completion time, sleeping half of it, as Linux 4.10 did
    /// (baseline for comparison). Spelled `"linux-half-mean"`.
    LinuxMean,
}

impl ModelKind {
    /// The conf spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ModelKind::Robust => "pollux",
            ModelKind::LinuxMean => "linux-half-mean",
        }
    }
}

impl fmt::Display for ModelKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ModelKind {
    type Err = UnknownSpelling;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "pollux" => Ok(ModelKind::Robust),
            "linux-half-mean" => Ok(ModelKind::LinuxMean),
            _ => Err(UnknownSpelling {
                what: "sleep policy",
                given: s.to_owned(),
                expected: "\"pollux\" or \"linux-half-mean\"",
            }),
        }
    }
}

#[derive(Debug, Clone)]
struct Class {
    ring: [u64; WINDOW],
    len: usize,
    pos: usize,
    since_update: usize,
    est_ns: Option<u64>,
}

impl Default for Class {
    fn default() -> Self {
        Self {
            ring: [0; WINDOW],
            len: 0,
            pos: 0,
            since_update: 0,
            est_ns: None,
        }
    }
}

impl Class {
    fn push(&mut self, v: u64) {
        self.ring[self.pos] = v;
        self.pos = (self.pos + 1) % WINDOW;
        self.len = (self.len + 1).min(WINDOW);
    }

    fn percentile(&self, p: f64) -> u64 {
        let mut v = self.ring[..self.len].to_vec();
        let k = ((self.len as f64 - 1.0) * p).round() as usize;
        *v.select_nth_unstable(k).1
    }

    fn mean(&self) -> u64 {
        self.ring[..self.len].iter().sum::<u64>() / self.len.max(1) as u64
    }
}

/// Per-class completion time estimates of one device queue.
#[derive(Debug, Clone)]
pub struct LatencyModel {
    kind: ModelKind,
    classes: Vec<Class>,
}

impl LatencyModel {
    /// An empty model.
    pub fn new(kind: ModelKind) -> Self {
        Self {
            kind,
            classes: vec![Class::default(); 2 * SIZE_CLASSES],
        }
    }

    /// The estimator.
    pub fn kind(&self) -> ModelKind {
        self.kind
    }

    /// The class of an operation of `len` bytes.
    pub fn class(read: bool, len: u32) -> usize {
        let size = match len {
            0..=4096 => 0,
            4097..=16384 => 1,
            16385..=65536 => 2,
            65537..=262_144 => 3,
            _ => 4,
        };
        if read { size } else { SIZE_CLASSES + size }
    }

    /// Estimated completion time of class `c` (None until it has samples).
    pub fn estimate(&self, c: usize) -> Option<Duration> {
        self.classes.get(c)?.est_ns.map(Duration::from_nanos)
    }

    /// When a channel with commands `pending` (submission time, class) next needs to run:
    /// [`Next::Expect`] at the earliest predicted completion, [`Next::Asap`] while some class
    /// has no estimate yet (it is being learned: poll), [`Next::Idle`] with nothing pending.
    pub fn next_run(&self, pending: impl IntoIterator<Item = (Instant, usize)>) -> Next {
        let mut earliest: Option<Instant> = None;
        for (submitted, class) in pending {
            let Some(e) = self.estimate(class) else {
                return Next::Asap;
            };
            let t = submitted + e;
            earliest = Some(earliest.map_or(t, |x| x.min(t)));
        }
        earliest.map_or(Next::Idle, Next::Expect)
    }

    /// A completion of class `c` observed `seen` after submission. `exact`: it was found
    /// by a poll that followed closely on one that had not found it, so `seen` is the device's
    /// time (within the poll gap); otherwise `seen` is only an upper bound (the reactor slept
    /// or was busy elsewhere).
    pub fn observe(&mut self, c: usize, seen: Duration, exact: bool) {
        let kind = self.kind;
        let Some(cl) = self.classes.get_mut(c) else { return };
        let v = seen.as_nanos().min(u128::from(u64::MAX)) as u64;
        match kind {
            ModelKind::LinuxMean => {
                cl.push(v);
                cl.est_ns = Some(cl.mean());
                return;
            }
            ModelKind::Robust => {
                if exact {
                    cl.push(v);
                } else if let Some(est) = cl.est_ns {
                    // An upper bound: it may pull the estimate down, never up.
                    cl.push(v.min(est));
                } else {
                    // No estimate yet (e.g. an interrupt-mode reactor never polls closely): an
                    // upper bound is a safe start, since exact samples, which come as soon as
                    // the reactor wakes early and polls, pull a low percentile down at once.
                    cl.push(v);
                }
            }
        }
        cl.since_update += 1;
        // Re-select the percentile every few samples: O(WINDOW) each time.
        if cl.est_ns.is_none() || cl.since_update >= 8 || cl.len < WINDOW {
            cl.est_ns = Some(cl.percentile(PERCENTILE));
            cl.since_update = 0;
        }
    }
}
