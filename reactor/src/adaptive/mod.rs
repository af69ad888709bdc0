//! The adaptive machinery, as pure state machines (times in, decisions out; no clock):
//!
//! - [`LatencyModel`]: per (operation, size class) estimate of a device's completion time.
//!   Linux 4.10's hybrid polling slept half the *mean observed* completion time; a request
//!   it overslept is observed late, which raises the mean, which lengthens the next sleep:
//!   a feedback loop. Here only *exact* observations (the completion was found by a poll
//!   shortly after the previous poll that had not found it) enter as they are; an observation
//!   made after a sleep is an upper bound and enters clamped to the current estimate, so a
//!   sleep can lower the estimate but never raise it. The estimate is a low percentile of a
//!   window of samples, which recovers from a device latency step within one window.
//! - [`MarginSleep`]: the hybrid sleep policy: wake at the predicted completion minus a
//!   high quantile of the measured lateness of timed wake-ups, and spin through a wait
//!   shorter than a wake-up costs.
//! - [`ModePolicy`]: chooses busy-poll, hybrid or interrupt for a reactor from its load,
//!   the predicted device latency against the cost of a wake-up, and an idle-CPU budget, with
//!   hysteresis and a minimum dwell time. What it has measured of a mode outweighs what it
//!   models: hybrid's spin per completion once hybrid ran (and, where commands overlap and
//!   the model can only bound it, it runs hybrid to measure it), busy-poll's work per
//!   completion once busy-poll ran (a sleeping mode's own busy share also counts its
//!   wake-ups).
//!
//! One file per machine: [`model`] (the latency model), [`margin`] (the hybrid sleep),
//! [`turnaround`] (the spin through a host's turnaround), [`policy`] (the mode policy).

mod margin;
mod model;
mod policy;
mod turnaround;

pub use margin::{LATE_WINDOW, MarginSleep, PROBE_EVERY};
pub use model::{LatencyModel, ModelKind, PERCENTILE, SIZE_CLASS_NAMES, SIZE_CLASSES, WINDOW};
pub use policy::{
    HYSTERESIS_BAND, MEASURED_TTL, ModePolicy, OVERLAP_MIN, POLL_WORK_TTL, PROBE_BACKOFF_MAX, PROBE_DWELL,
    PROBE_MIN_BUSY, PROBE_SUCCESS, PROBE_SUSTAIN, PolicyConfig, PolicyInputs,
};
pub use turnaround::{GAP_WINDOW, Turnaround, TurnaroundSpin};

#[cfg(test)]
mod tests;
