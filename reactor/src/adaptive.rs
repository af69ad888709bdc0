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

use std::time::{Duration, Instant};

use crate::mode::{Mode, SleepPolicy};
use crate::reactor::Next;

/// Size classes: <= 4 KiB, <= 16 KiB, <= 64 KiB, <= 256 KiB, larger; times read/write.
pub const SIZE_CLASSES: usize = 5;
/// Names of the size classes, as [`LatencyModel::class`] draws them.
pub const SIZE_CLASS_NAMES: [&str; SIZE_CLASSES] = ["<=4KiB", "<=16KiB", "<=64KiB", "<=256KiB", ">256KiB"];
/// Samples kept per class.
pub const WINDOW: usize = 64;
/// The estimate is this percentile of the window.
pub const PERCENTILE: f64 = 0.10;

/// Which estimator a model uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelKind {
    /// Low percentile of exact samples, censored samples clamped (pollux).
    Robust,
    /// Mean of every observed completion time, as Linux 4.10 did (baseline for comparison).
    LinuxMean,
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

/// Gaps a [`TurnaroundSpin`] keeps.
pub const GAP_WINDOW: usize = 64;

/// What hybrid mode does while it waits for a host's next command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Turnaround {
    /// Spin through a closed-loop host's turnaround when it is shorter than a wake-up
    /// ([`TurnaroundSpin`]).
    #[default]
    Spin,
    /// Never spin through it: block until an event at once.
    Sleep,
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

/// Width of the band around the budget threshold: enter polling below `budget - band` of
/// idle time, leave it above `budget + band`.
pub const HYSTERESIS_BAND: f64 = 0.05;

/// Settings of the mode policy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PolicyConfig {
    /// Fraction of a core the reactor may spend polling without finding work.
    pub cpu_budget: f64,
    /// Wanted completion latency, if any: polling is allowed beyond the budget when an
    /// interrupt-mode wake-up would miss it.
    pub latency_target: Option<Duration>,
    /// Shortest time between two switches.
    pub min_dwell: Duration,
    /// A new mode must be wanted this many evaluations in a row.
    pub confirmations: u32,
    /// Sleeping pays off when the predicted latency exceeds this many wake-up costs.
    pub sleep_payoff: f64,
    /// Under sustained load in a sleeping mode, try busy-poll this often (doubling after
    /// each try that did not stay, up to 16 times): see [`ModePolicy::evaluate`]. `None`:
    /// never probe.
    pub probe_interval: Option<Duration>,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        Self {
            cpu_budget: 0.3,
            latency_target: None,
            min_dwell: Duration::from_millis(50),
            confirmations: 4,
            sleep_payoff: 3.0,
            probe_interval: Some(Duration::from_secs(1)),
        }
    }
}

/// What the policy sees at an evaluation: the reactor's accounting over the last window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PolicyInputs {
    /// Evaluation time.
    pub now: Instant,
    /// Share of the window spent doing work: the smaller of the wall time in iterations that
    /// found work and the thread's CPU time (wall time alone grows when the thread is
    /// preempted).
    pub busy_fraction: f64,
    /// Device completions in the window, of channels that are not `never`.
    pub completions: u64,
    /// Completions in the window of `never` channels ([`crate::Polling::Never`]): counted
    /// apart, since their load is never a reason to spin.
    pub quiet_completions: u64,
    /// Mean device commands outstanding in the window.
    pub outstanding: f64,
    /// Predicted device completion time: the (channel, operation class) estimates weighted by
    /// their completions, i.e. the expected wait per I/O, smoothed over windows
    /// ([`crate::DeviceLoad::evaluate`]). None: no device with an estimate.
    pub predicted: Option<Duration>,
    /// What a timed or interrupt wake-up costs (its measured lateness).
    pub wake_cost: Duration,
    /// What hybrid mode spins per I/O, as measured: its wake margin before each expected
    /// completion plus the turnaround spin after it ([`TurnaroundSpin`]). None: unknown (the
    /// whole predicted wait is counted).
    pub hybrid_spin: Option<Duration>,
    /// What hybrid mode spun per completion in this window, measured: the time of its
    /// iterations that neither found work nor slept, over the window's completions. Only for
    /// a window spent (nearly) all in hybrid mode and not held in busy-poll by an `always`
    /// namespace; None otherwise.
    pub hybrid_measured: Option<Duration>,
    /// Length of the window the counts cover.
    pub window: Duration,
}

impl PolicyInputs {
    /// The busy fraction that counts toward polling: with `never` namespaces beside others,
    /// only the others' share of it (work split by completions: a rough attribution, but one
    /// that a `never` namespace's load alone can never tip; with only `never` completions,
    /// none).
    pub fn spin_busy(&self) -> f64 {
        if self.quiet_completions == 0 {
            return self.busy_fraction;
        }
        let share = self.completions as f64 / (self.completions + self.quiet_completions) as f64;
        self.busy_fraction * share
    }
}

/// Chooses a reactor's mode; see the module docs.
#[derive(Debug, Clone)]
pub struct ModePolicy {
    cfg: PolicyConfig,
    current: Mode,
    since: Option<Instant>,
    pending: Option<(Mode, u32)>,
    switches: u64,
    /// Consecutive evaluations with sustained load in a sleeping mode.
    loaded: u32,
    /// Busy-poll probes under sustained load in a sleeping mode.
    poll_probe: Probe,
    /// The work per device completion that busy-poll measured: see
    /// [`ModePolicy::poll_busy`].
    poll_work: Measured,
    /// Hybrid's measured spin per completion.
    hybrid_cost: Measured,
    /// Consecutive evaluations in interrupt mode at which a hybrid probe would be worth it.
    overlapped: u32,
    /// Hybrid probes where the model alone rules hybrid out while commands overlap.
    hybrid_probe: Probe,
}

/// One kind of probe's schedule: a try of `mode` at most once per interval, which doubles
/// after each try that did not keep the mode for [`PROBE_SUCCESS`] and goes back to its base
/// after one that did ([`next_probe_interval`]).
#[derive(Debug, Clone)]
struct Probe {
    mode: Mode,
    /// The current interval.
    every: Duration,
    last: Option<Instant>,
    /// When the running period in `mode` started as this probe.
    since: Option<Instant>,
    started: u64,
}

impl Probe {
    fn new(mode: Mode, base: Option<Duration>) -> Self {
        Self {
            mode,
            every: base.unwrap_or_default(),
            last: None,
            since: None,
            started: 0,
        }
    }

    /// Whether the interval since the last try has passed (`base`: probing is configured).
    fn due(&self, base: Option<Duration>, now: Instant) -> bool {
        base.is_some() && self.last.is_none_or(|t| now.saturating_duration_since(t) >= self.every)
    }

    fn start(&mut self, now: Instant) {
        self.last = Some(now);
        self.since = Some(now);
        self.started += 1;
    }

    /// The policy switches `from` one mode `to` another at `now`: a probe of `from` that is
    /// running ends, and sets the next interval by how long it held.
    fn switching(&mut self, from: Mode, to: Mode, base: Option<Duration>, now: Instant) {
        if from == self.mode
            && to != self.mode
            && let Some(start) = self.since.take()
            && let Some(base) = base
        {
            self.every = next_probe_interval(self.every, base, now.saturating_duration_since(start));
        }
    }

    /// Whether the reactor, in `current`, is in a period this probe started.
    fn running(&self, current: Mode) -> bool {
        current == self.mode && self.since.is_some()
    }
}

/// Busy fraction from which a sleeping reactor counts as loaded (a probe candidate).
pub const PROBE_MIN_BUSY: f64 = 0.25;
/// Evaluations of sustained load before a probe.
pub const PROBE_SUSTAIN: u32 = 16;
/// A probe that kept busy-poll this long succeeded: the interval goes back to its base.
pub const PROBE_SUCCESS: Duration = Duration::from_secs(1);
/// A running probe may leave its mode after this long instead of the minimum dwell. The
/// dwell keeps the policy from flapping between modes it chose by their thresholds; a
/// probe's schedule already bounds how often it comes, and the mode it tries tells within
/// a few windows whether it pays (a closed-loop host speeds up within a round trip, and
/// hybrid's spin is measured from its second window). Under a load whose best mode is
/// interrupt, the probes' polling then costs about 1 % of a core at the base interval, not
/// the 5 % of a minimum dwell (measured at 3-5 points over interrupt in `ci/bench frontier`).
pub const PROBE_DWELL: Duration = Duration::from_millis(10);
/// The probe interval grows at most to this many times its base.
pub const PROBE_BACKOFF_MAX: u32 = 16;
/// Hybrid's measured spin per completion stands for this long (the load may have changed
/// since), after which the model prices hybrid again.
pub const MEASURED_TTL: Duration = Duration::from_secs(1);
/// Busy-poll's measured work per completion stands for this long. Longer than hybrid's: it
/// is only refreshed in busy-poll, which a load it ruled out no longer visits but in a
/// probe, and either way it errs it corrects itself (a figure too high sends the reactor
/// to busy-poll, which measures again; one too low is what the busy-poll probe catches).
pub const POLL_WORK_TTL: Duration = Duration::from_secs(10);
/// Weight of a window's measurement in a smoothed measured figure.
const MEASURED_EWMA: f64 = 0.25;
/// A mean of at least this many device commands in flight: their waits overlap, so the
/// model's sum of one spin per completion counts the same spinning several times and is
/// only an upper bound. There the policy measures what hybrid spins (a hybrid probe)
/// before it rules hybrid out.
pub const OVERLAP_MIN: f64 = 1.5;

/// A figure measured of a mode per completion, in ns: smoothed over the windows that
/// measured it ([`MEASURED_EWMA`]), standing for `ttl` after the last of them.
#[derive(Debug, Clone)]
struct Measured {
    ttl: Duration,
    /// The smoothed figure and when it was last measured.
    figure: Option<(f64, Instant)>,
}

impl Measured {
    fn new(ttl: Duration) -> Self {
        Self { ttl, figure: None }
    }

    /// Folds a window's measurement `ns` in and dates it `now`; a stale figure is replaced.
    fn fold(&mut self, ns: f64, now: Instant) {
        let smoothed = match self.figure {
            Some((c, t)) if now.saturating_duration_since(t) < self.ttl => c + MEASURED_EWMA * (ns - c),
            _ => ns,
        };
        self.figure = Some((smoothed, now));
    }

    /// The figure, while it stands.
    fn get(&self, now: Instant) -> Option<Duration> {
        self.figure
            .filter(|&(_, t)| now.saturating_duration_since(t) < self.ttl)
            .map(|(ns, _)| Duration::from_nanos(ns as u64))
    }
}

/// The probe interval after a probe that kept its mode for `held`: back to `base` when that
/// was [`PROBE_SUCCESS`] or longer, otherwise doubled, up to [`PROBE_BACKOFF_MAX`] times `base`.
fn next_probe_interval(every: Duration, base: Duration, held: Duration) -> Duration {
    if held >= PROBE_SUCCESS {
        base
    } else {
        (every * 2).min(base * PROBE_BACKOFF_MAX)
    }
}

impl ModePolicy {
    /// A policy that starts in `initial`.
    pub fn new(cfg: PolicyConfig, initial: Mode) -> Self {
        Self {
            poll_probe: Probe::new(Mode::Poll, cfg.probe_interval),
            hybrid_probe: Probe::new(Mode::Hybrid, cfg.probe_interval),
            cfg,
            current: initial,
            since: None,
            pending: None,
            switches: 0,
            loaded: 0,
            poll_work: Measured::new(POLL_WORK_TTL),
            hybrid_cost: Measured::new(MEASURED_TTL),
            overlapped: 0,
        }
    }

    /// Busy-poll probes started.
    pub fn probes(&self) -> u64 {
        self.poll_probe.started
    }

    /// The current probe interval.
    pub fn probe_interval(&self) -> Duration {
        self.poll_probe.every
    }

    /// Hybrid probes started (see [`ModePolicy::evaluate`]).
    pub fn hybrid_probes(&self) -> u64 {
        self.hybrid_probe.started
    }

    /// The current hybrid probe interval.
    pub fn hybrid_probe_interval(&self) -> Duration {
        self.hybrid_probe.every
    }

    /// Hybrid's measured spin per completion, while it stands ([`MEASURED_TTL`]).
    pub fn measured_hybrid_spin(&self, now: Instant) -> Option<Duration> {
        self.hybrid_cost.get(now)
    }

    /// What hybrid would spin per completion at `i`: as measured while that stands,
    /// otherwise as modelled (see [`ModePolicy::desired`]).
    fn hybrid_spin(&self, i: &PolicyInputs, predicted: Duration) -> Duration {
        if let Some(m) = self.measured_hybrid_spin(i.now) {
            return m;
        }
        let slow = predicted.as_secs_f64() >= self.cfg.sleep_payoff * i.wake_cost.as_secs_f64();
        match i.hybrid_spin {
            Some(s) if slow => s.min(predicted),
            _ => predicted,
        }
    }

    fn start_hybrid_probe(&mut self, now: Instant) -> Option<Mode> {
        self.hybrid_probe.start(now);
        self.switch(Mode::Hybrid, now)
    }

    fn switch(&mut self, to: Mode, now: Instant) -> Option<Mode> {
        // A probe that did not hold tries less often: busy-poll did not raise the load enough
        // (it was not saturated, or it only burned the budget), or what hybrid measurably
        // spins did not fit the budget after all.
        let base = self.cfg.probe_interval;
        self.poll_probe.switching(self.current, to, base, now);
        self.hybrid_probe.switching(self.current, to, base, now);
        self.current = to;
        self.since = Some(now);
        self.pending = None;
        self.switches += 1;
        Some(to)
    }

    /// The mode it last chose.
    pub fn current(&self) -> Mode {
        self.current
    }

    /// Switches made.
    pub fn switches(&self) -> u64 {
        self.switches
    }

    /// The mode this window's inputs call for, before hysteresis.
    pub fn desired(&self, i: &PolicyInputs) -> Mode {
        // Idle: nothing in flight and nothing completed: sleep in epoll.
        if i.completions == 0 && i.outstanding < 0.01 && i.busy_fraction < 0.05 {
            return Mode::Interrupt;
        }
        // Only `never` namespaces completed: however busy they keep the reactor, they wait
        // for their interrupts.
        if i.completions == 0 && i.quiet_completions > 0 {
            return Mode::Interrupt;
        }
        if self.saturated(i) {
            return Mode::Poll;
        }
        if let Some(p) = i.predicted {
            // Hybrid costs its spinning: take it while that fits the budget (with the same
            // band as polling, so a load near the limit does not flip the mode).
            // - A slow device (several wake-ups' time): hybrid sleeps through most of each
            //   wait and spins its wake margin and the host's turnaround, as measured.
            // - A fast device: sleeping for each completion adds a wake-up's latency and its
            //   CPU (two context switches and a timer; on a VM often more than a 10 us spin).
            //   Hybrid spins through a wait shorter than a wake-up costs and still sleeps in
            //   epoll between commands, so it costs at most one predicted wait per completion.
            // - Either, once hybrid ran: what it measurably spun per completion. With several
            //   commands in flight their waits overlap and one spin serves several of them, so
            //   the two rules above only bound it from above (see the hybrid probe in
            //   `evaluate`).
            if self.hybrid_fits(i, p) {
                return Mode::Hybrid;
            }
            // Over budget: an interrupt per command. Poll only if the latency target
            // demands it.
            if let Some(t) = self.cfg.latency_target
                && p + i.wake_cost > t
            {
                return Mode::Poll;
            }
        }
        Mode::Interrupt
    }

    /// Completions per second in `i`'s window.
    fn rate(i: &PolicyInputs) -> f64 {
        i.completions as f64 / i.window.as_secs_f64().max(1e-9)
    }

    /// Saturated: the work itself keeps the core busy, so polling costs little idle CPU (at
    /// most 1 - busy) and saves every wake-up. A band around the threshold keeps a load that
    /// hovers at it from flipping the mode.
    fn saturated(&self, i: &PolicyInputs) -> bool {
        1.0 - self.poll_busy(i) <= self.cfg.cpu_budget + self.band(Mode::Poll)
    }

    /// The share of the core `i`'s load would keep busy-poll busy. In busy-poll, what it
    /// reads: an iteration either finds work or spins. A sleeping mode's reading also counts
    /// its wake-ups, which on a VM can cost most of a core (interrupt mode 80-98 % busy at
    /// 48.8 K IOPS on a 10 us device, QD 8, where busy-poll read 40-50 %), so taken alone it
    /// sends the reactor to busy-poll, which finds itself over budget and leaves at the next
    /// minimum dwell, again and again (39 switches in 2.5 s there). Once busy-poll has
    /// measured its work per completion, a sleeping mode prices the load by that instead
    /// (at most its own reading, while it stands: [`POLL_WORK_TTL`]).
    fn poll_busy(&self, i: &PolicyInputs) -> f64 {
        let reading = i.spin_busy();
        match self.measured_poll_work(i.now) {
            Some(w) if self.current != Mode::Poll && i.completions > 0 => {
                (Self::rate(i) * w.as_secs_f64()).min(reading)
            }
            _ => reading,
        }
    }

    /// Busy-poll's measured work per device completion, while it stands ([`POLL_WORK_TTL`]).
    pub fn measured_poll_work(&self, now: Instant) -> Option<Duration> {
        self.poll_work.get(now)
    }

    /// The hysteresis band on the budget for `mode`: widened while the reactor is in it (it
    /// stays), narrowed otherwise (it enters only clearly inside).
    fn band(&self, mode: Mode) -> f64 {
        if self.current == mode {
            HYSTERESIS_BAND
        } else {
            -HYSTERESIS_BAND
        }
    }

    /// Whether what hybrid spins (measured, or modelled from `predicted`) fits the budget,
    /// with the same band as polling, so a load near the limit does not flip the mode.
    fn hybrid_fits(&self, i: &PolicyInputs, predicted: Duration) -> bool {
        Self::rate(i) * self.hybrid_spin(i, predicted).as_secs_f64() <= self.cfg.cpu_budget + self.band(Mode::Hybrid)
    }

    /// Evaluate: returns Some(mode) when the policy switches.
    ///
    /// Besides the thresholds of [`desired`](Self::desired), it *probes*: a sleeping reactor
    /// under sustained load ([`PROBE_MIN_BUSY`] for [`PROBE_SUSTAIN`] evaluations) cannot
    /// tell from its own accounting whether it is saturated, because each wake-up's latency
    /// throttles a closed-loop client: the reactor looks half idle while the client waits
    /// on it. So every probe interval it switches to busy-poll, where the saturation rule
    /// decides with real numbers: if polling lifted the load so that the idle share fits the
    /// budget, it stays; otherwise it leaves after [`PROBE_DWELL`] (not the minimum dwell)
    /// and the interval doubles (a failed probe costs that much polling: about 1 % of a core
    /// at the base interval, decaying 16-fold).
    ///
    /// It also probes *hybrid*: with several commands in flight (a mean of [`OVERLAP_MIN`])
    /// the model's price of hybrid is an upper bound, so where the model alone rules hybrid
    /// out (no measurement standing) a reactor tries hybrid at most once a probe interval
    /// (doubling after each try that did not stay, as for busy-poll): in interrupt mode under
    /// sustained load of that kind, and in busy-poll mode instead of leaving for interrupt.
    /// From its second window there it prices hybrid by what it measurably spins: it stays
    /// while that fits the budget and leaves after [`PROBE_DWELL`] if not.
    pub fn evaluate(&mut self, i: &PolicyInputs) -> Option<Mode> {
        if let Some(m) = i.hybrid_measured {
            self.hybrid_cost.fold(m.as_nanos() as f64, i.now);
        }
        // Only device completions price a load by its work (sockets alone, as a RAM
        // namespace's, leave it to the reading and the busy-poll probe).
        if self.current == Mode::Poll && i.completions > 0 {
            self.poll_work.fold(i.spin_busy() / Self::rate(i) * 1e9, i.now);
        }
        let want = self.desired(i);
        let dwell = if self.poll_probe.running(self.current) || self.hybrid_probe.running(self.current) {
            self.cfg.min_dwell.min(PROBE_DWELL)
        } else {
            self.cfg.min_dwell
        };
        let dwelt = self.since.is_none_or(|s| i.now.saturating_duration_since(s) >= dwell);
        if self.current != Mode::Poll && want != Mode::Poll && i.spin_busy() >= PROBE_MIN_BUSY {
            self.loaded += 1;
        } else {
            self.loaded = 0;
        }
        if self.loaded >= PROBE_SUSTAIN && dwelt && self.poll_probe.due(self.cfg.probe_interval, i.now) {
            self.loaded = 0;
            self.poll_probe.start(i.now);
            return self.switch(Mode::Poll, i.now);
        }
        // Hybrid ruled out by the model alone while commands overlap: measure it first.
        let overlap = i.completions > 0
            && i.outstanding >= OVERLAP_MIN
            && self.measured_hybrid_spin(i.now).is_none()
            && !self.saturated(i)
            && i.predicted.is_some_and(|p| !self.hybrid_fits(i, p));
        let hybrid_probe_due = self.hybrid_probe.due(self.cfg.probe_interval, i.now);
        self.overlapped = if overlap && self.current == Mode::Interrupt {
            self.overlapped + 1
        } else {
            0
        };
        if self.overlapped >= PROBE_SUSTAIN && dwelt && hybrid_probe_due {
            self.overlapped = 0;
            return self.start_hybrid_probe(i.now);
        }
        // Busy-poll that is not saturated, with hybrid ruled out on the model's word: try
        // hybrid, measured, before interrupt.
        let want = if overlap && self.current == Mode::Poll && hybrid_probe_due {
            Mode::Hybrid
        } else {
            want
        };
        if want == self.current {
            self.pending = None;
            return None;
        }
        let n = match self.pending {
            Some((m, n)) if m == want => n + 1,
            _ => 1,
        };
        self.pending = Some((want, n));
        if n >= self.cfg.confirmations && dwelt {
            if want == Mode::Hybrid && overlap {
                return self.start_hybrid_probe(i.now);
            }
            return self.switch(want, i.now);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mode::FractionSleep;

    const US: Duration = Duration::from_micros(1);

    /// Replays QD1 I/O on a device with a fixed 10 us latency, where every timed wake-up is
    /// 15 us late (a realistic wake-up cost). Returns the last estimate.
    fn replay(model: &mut LatencyModel, policy: &mut dyn SleepPolicy, n: usize) -> Vec<Duration> {
        let device = 10 * US;
        let lateness = 15 * US;
        let t0 = Instant::now();
        let mut t = t0;
        let mut ests = Vec::new();
        let c = LatencyModel::class(true, 4096);
        for _ in 0..n {
            let submit = t;
            let expected = submit + model.estimate(c).unwrap_or(device);
            let (seen, exact) = match policy.wake_at(submit, expected) {
                Some(w) => {
                    // Sleep until w, wake `lateness` late; then poll until the completion.
                    let woke = w + lateness;
                    policy.observe_wakeup(w, woke);
                    if woke >= submit + device {
                        (woke - submit, false)
                    } else {
                        (device, true)
                    }
                }
                None => (device, true), // spin: found right when it lands
            };
            model.observe(c, seen, exact);
            ests.push(model.estimate(c).unwrap_or_default());
            t = submit + seen + 2 * US;
        }
        ests
    }

    #[test]
    fn linux_half_mean_drifts_upward_under_oversleep_and_pollux_does_not() {
        let mut linux = LatencyModel::new(ModelKind::LinuxMean);
        let mut half = FractionSleep {
            fraction: 0.5,
            min_sleep: Duration::ZERO,
        };
        let l = replay(&mut linux, &mut half, 2000);
        // Fixed point of m = m/2 + 15: the mean climbs to ~3x the device's 10 us.
        assert!(
            *l.last().unwrap_or(&Duration::ZERO) >= 25 * US,
            "linux estimate {:?}",
            l.last()
        );
        assert!(l[l.len() - 1] > l[10], "it drifted upward");

        let mut ours = LatencyModel::new(ModelKind::Robust);
        let mut margin = MarginSleep::default();
        let p = replay(&mut ours, &mut margin, 2000);
        let max = p.iter().skip(1).max().copied().unwrap_or_default();
        assert!(
            max <= 11 * US,
            "pollux estimate never exceeds the device latency: max {max:?}"
        );
        assert!(*p.last().unwrap_or(&Duration::ZERO) >= 9 * US);
    }

    #[test]
    fn censored_observations_never_raise_the_estimate() {
        let mut m = LatencyModel::new(ModelKind::Robust);
        let c = 0;
        for _ in 0..WINDOW {
            m.observe(c, 80 * US, true);
        }
        let before = m.estimate(c);
        for _ in 0..10 * WINDOW {
            m.observe(c, 500 * US, false);
        }
        assert_eq!(m.estimate(c), before);
    }

    #[test]
    fn recovers_after_a_device_latency_step() {
        let mut m = LatencyModel::new(ModelKind::Robust);
        let c = LatencyModel::class(false, 65536);
        for _ in 0..200 {
            m.observe(c, 20 * US, true);
        }
        assert_eq!(m.estimate(c), Some(20 * US));
        // The device gets slower: exact samples (we woke early and spun) carry it up.
        for _ in 0..WINDOW {
            m.observe(c, 90 * US, true);
        }
        assert_eq!(m.estimate(c), Some(90 * US));
        // Faster again: we now oversleep; the upper bounds pull the estimate down.
        for _ in 0..WINDOW {
            m.observe(c, 30 * US, false);
        }
        assert_eq!(m.estimate(c), Some(30 * US));
    }

    #[test]
    fn margin_learns_the_wake_up_lateness() {
        let mut s = MarginSleep::default();
        let t = Instant::now();
        for _ in 0..200 {
            s.observe_wakeup(t, t + 3 * US);
        }
        let m = s.margin();
        assert_eq!(m, 3 * US);
        assert_eq!(s.wake_at(t, t + 100 * US), Some(t + 100 * US - m));
        assert_eq!(s.wake_at(t, t + 5 * US), None, "not worth sleeping");
    }

    /// A heavy-tailed lateness (a VM's: 15 us body, 1 in 20 wake-ups 40-75 us late): the
    /// margin is its p99, so about 1 % of wake-ups overshoot the completion; a mean plus two
    /// mean deviations (the former rule) would let about 5 % overshoot, each by tens of us.
    #[test]
    fn the_margin_is_a_high_quantile_of_a_heavy_tailed_lateness() {
        let mut s = MarginSleep::default();
        let t = Instant::now();
        let late = |k: u64| {
            if k % 20 == 7 {
                Duration::from_micros(40 + (k * 7919) % 36) // the tail: 40-75 us
            } else {
                Duration::from_micros(13 + (k * 31) % 5) // the body: 13-17 us
            }
        };
        let (mut ewma, mut dev) = (10_000.0f64, 2_000.0f64);
        for k in 0..2000u64 {
            s.observe_wakeup(t, t + late(k));
            let err = late(k).as_nanos() as f64 - ewma;
            ewma += 0.125 * err;
            dev += 0.25 * (err.abs() - dev);
        }
        let m = s.margin();
        let over = |margin: Duration| (0..2000u64).filter(|&k| late(k) > margin).count() as f64 / 2000.0;
        assert!(over(m) <= 0.015, "p99 margin {m:?}: {:.3} late", over(m));
        let old = Duration::from_nanos((ewma + 2.0 * dev) as u64);
        assert!(over(old) >= 0.04, "mean + 2 dev {old:?}: {:.3} late", over(old));
        assert!(m > old, "{m:?} vs {old:?}");
        // The cost of a wake-up is the body (the median), not the tail.
        assert!(
            s.wake_cost() >= 13 * US && s.wake_cost() <= 17 * US,
            "{:?}",
            s.wake_cost()
        );
    }

    /// The spin decision: a wait shorter than what a wake-up costs is spun through (no timed
    /// sleep at all), a longer one is slept until the margin before it.
    #[test]
    fn waits_shorter_than_a_wake_up_are_spun_through() {
        let mut s = MarginSleep::default();
        let t = Instant::now();
        for k in 0..300u64 {
            s.observe_wakeup(t, t + Duration::from_micros(10 + k % 3)); // body 10-12 us, p99 12 us
        }
        let (m, cost) = (s.margin(), s.wake_cost());
        assert_eq!((m, cost), (12 * US, 11 * US));
        // 20 us to the completion: waking 12 us ahead leaves an 8 us sleep, below the 11 us a
        // wake-up costs: spin.
        assert_eq!(s.wake_at(t, t + 20 * US), None);
        // 23 us: an 11 us sleep, worth it.
        assert_eq!(s.wake_at(t, t + 23 * US), Some(t + 11 * US));
        // Past due, or due within the margin: spin.
        assert_eq!(s.wake_at(t + 30 * US, t + 23 * US), None);
        assert_eq!(s.wake_at(t, t + 5 * US), None);
    }

    /// A burst of very late wake-ups (a preempted VM) pushes the p99 past the device's 80 us:
    /// every wait is then spun through, and without sleeping the lateness is never measured
    /// again. A probe sleep once in [`PROBE_EVERY`] such waits refreshes it, and the margin
    /// comes back down once the platform is quiet again.
    #[test]
    fn a_stale_margin_is_measured_again() {
        let mut s = MarginSleep::default();
        let t = Instant::now();
        for _ in 0..LATE_WINDOW {
            s.observe_wakeup(t, t + 500 * US);
        }
        assert_eq!(s.margin(), 500 * US);
        let (mut probes, mut now) = (0, t);
        for _ in 0..40 * LATE_WINDOW {
            now += 100 * US;
            if let Some(w) = s.wake_at(now, now + 80 * US) {
                probes += 1;
                s.observe_wakeup(w, w + 12 * US); // quiet again: 12 us late
            }
        }
        assert!(probes >= LATE_WINDOW, "{probes} probes");
        assert_eq!(s.margin(), 12 * US, "re-measured");
        // Now it sleeps every time, until 12 us before the completion.
        assert_eq!(s.wake_at(now, now + 80 * US), Some(now + 68 * US));
    }

    /// The turnaround spin: a closed-loop host's 12-16 us turnarounds are spun through (their
    /// p90), one that thinks 200 us between commands is not, nor a turnaround longer than
    /// what a wake-up costs.
    #[test]
    fn turnaround_spin_covers_a_closed_loop_and_nothing_else() {
        let mut s = TurnaroundSpin::default();
        s.set_wake_cost(20 * US); // a blocking wake-up: ~40 us
        assert_eq!(s.spin_for(), Duration::ZERO, "nothing learnt yet");
        for k in 0..200u64 {
            s.observe_gap(Duration::from_micros(12 + k % 5));
        }
        assert_eq!(s.spin_for(), 16 * US);
        s.set_wake_cost(7 * US);
        assert_eq!(s.spin_for(), Duration::ZERO, "longer than a 14 us wake-up: block");
        s.set_wake_cost(20 * US);
        for _ in 0..GAP_WINDOW {
            s.observe_gap(200 * US);
        }
        assert_eq!(s.spin_for(), Duration::ZERO, "an open loop: block at once");
    }

    /// A given margin is the margin, whatever the lateness measured: the wake-up is that
    /// long before the predicted completion, a margin covering the wait spins through it
    /// (and never probe-sleeps: there is nothing to re-measure), and zero wakes at the
    /// prediction itself.
    #[test]
    fn a_fixed_margin_is_used_as_given() {
        let t = Instant::now();
        for given in [0, 5, 10, 20, 40] {
            let mut s = MarginSleep::with_margin(Some(given * US));
            assert_eq!(s.margin(), given * US);
            for _ in 0..LATE_WINDOW {
                s.observe_wakeup(t, t + 30 * US); // 30 us late: the measured p99 would be 30 us
            }
            assert_eq!(s.margin(), given * US, "the lateness does not move it");
            assert_eq!(s.wake_at(t, t + 100 * US), Some(t + 100 * US - given * US));
        }
        let mut s = MarginSleep::with_margin(Some(40 * US));
        let mut now = t;
        for _ in 0..4 * PROBE_EVERY {
            now += 100 * US;
            assert_eq!(s.wake_at(now, now + 30 * US), None, "covered by the margin: spin");
        }
        // Without a given margin the same waits are probed once in PROBE_EVERY.
        let mut m = MarginSleep::default();
        for _ in 0..LATE_WINDOW {
            m.observe_wakeup(t, t + 40 * US);
        }
        let probes = (0..4 * PROBE_EVERY)
            .filter(|k| {
                let now = t + *k * 100 * US;
                m.wake_at(now, now + 30 * US).is_some()
            })
            .count();
        assert_eq!(probes, 4);
        assert_eq!(MarginSleep::with_margin(None).margin(), MarginSleep::default().margin());
    }

    /// `sleep` never spins through a turnaround, however short and regular the host's.
    #[test]
    fn a_sleeping_turnaround_never_spins() {
        let mut s = TurnaroundSpin {
            rule: Turnaround::Sleep,
            ..TurnaroundSpin::default()
        };
        s.set_wake_cost(50 * US);
        for k in 0..4 * GAP_WINDOW as u64 {
            s.observe_gap(Duration::from_micros(2 + k % 3));
            assert_eq!(s.spin_for(), Duration::ZERO);
        }
        s.rule = Turnaround::Spin;
        assert_eq!(s.spin_for(), 4 * US, "the same gaps, spun through");
    }

    /// Policy time within which a switch the tests wait for must come.
    const LONG: Duration = Duration::from_secs(10);

    /// Evaluates `p` at `at(t)` every 2 ms of policy time (advancing `t`) until it switches,
    /// for at most `limit`: the mode it switched to (None: none within `limit`).
    fn next_switch(
        p: &mut ModePolicy,
        t: &mut Instant,
        limit: Duration,
        at: impl Fn(Instant) -> PolicyInputs,
    ) -> Option<Mode> {
        let start = *t;
        while *t - start < limit {
            *t += Duration::from_millis(2);
            if let Some(m) = p.evaluate(&at(*t)) {
                return Some(m);
            }
        }
        None
    }

    fn inputs(now: Instant, busy: f64, completions: u64, outstanding: f64, predicted_us: Option<u64>) -> PolicyInputs {
        PolicyInputs {
            now,
            busy_fraction: busy,
            completions,
            quiet_completions: 0,
            outstanding,
            predicted: predicted_us.map(Duration::from_micros),
            wake_cost: 8 * US,
            hybrid_spin: None,
            hybrid_measured: None,
            window: Duration::from_secs(1),
        }
    }

    #[test]
    fn thresholds_pick_the_expected_mode() {
        let p = ModePolicy::new(PolicyConfig::default(), Mode::Interrupt);
        let t = Instant::now();
        assert_eq!(p.desired(&inputs(t, 0.0, 0, 0.0, None)), Mode::Interrupt, "idle");
        assert_eq!(
            p.desired(&inputs(t, 0.9, 100_000, 32.0, Some(80))),
            Mode::Poll,
            "saturated"
        );
        // A slow device at QD1 (10 K IOPS of 80 us): hybrid when what it spins per I/O (its
        // measured margin and turnaround) fits the budget, never beyond it.
        let slow = |spin_us: Option<u64>| PolicyInputs {
            hybrid_spin: spin_us.map(Duration::from_micros),
            ..inputs(t, 0.1, 10_000, 1.0, Some(80))
        };
        assert_eq!(
            p.desired(&slow(Some(20))),
            Mode::Hybrid,
            "slow device, QD1: 20 % spinning"
        );
        assert_eq!(p.desired(&slow(Some(40))), Mode::Interrupt, "40 % is over a 0.3 budget");
        assert_eq!(
            p.desired(&slow(None)),
            Mode::Interrupt,
            "unknown spin: the whole wait counts"
        );
        let half = ModePolicy::new(
            PolicyConfig {
                cpu_budget: 0.5,
                ..PolicyConfig::default()
            },
            Mode::Interrupt,
        );
        assert_eq!(half.desired(&slow(Some(40))), Mode::Hybrid, "40 % fits a 0.5 budget");
        assert_eq!(
            p.desired(&inputs(t, 0.1, 50_000, 1.0, Some(10))),
            Mode::Interrupt,
            "fast device, spinning through every completion would take half the core"
        );
        assert_eq!(
            p.desired(&inputs(t, 0.1, 20_000, 1.0, Some(10))),
            Mode::Hybrid,
            "fast device, spinning through its completions fits the budget (20%)"
        );
        let h = ModePolicy::new(PolicyConfig::default(), Mode::Hybrid);
        let near = inputs(t, 0.1, 33_000, 1.0, Some(10));
        assert_eq!(h.desired(&near), Mode::Hybrid, "band: hybrid stays at 33% of spinning");
        assert_eq!(
            p.desired(&near),
            Mode::Interrupt,
            "band: interrupt does not leave for 33%"
        );
        let strict = ModePolicy::new(
            PolicyConfig {
                latency_target: Some(15 * US),
                ..PolicyConfig::default()
            },
            Mode::Interrupt,
        );
        assert_eq!(
            strict.desired(&inputs(t, 0.1, 50_000, 1.0, Some(10))),
            Mode::Poll,
            "latency target"
        );
        assert_eq!(
            p.desired(&inputs(t, 0.2, 40_000, 1.0, None)),
            Mode::Interrupt,
            "sockets only"
        );
    }

    #[test]
    fn hysteresis_and_dwell_prevent_flapping() {
        let cfg = PolicyConfig::default();
        let mut p = ModePolicy::new(cfg, Mode::Interrupt);
        let t0 = Instant::now();
        let ms = Duration::from_millis(1);
        // Alternating inputs never confirm a switch.
        for k in 0..100u32 {
            let busy = if k % 2 == 0 { 0.95 } else { 0.1 };
            assert_eq!(p.evaluate(&inputs(t0 + ms * k, busy, 1000, 4.0, None)), None);
        }
        assert_eq!(p.switches(), 0);
        // A steady signal switches after `confirmations` evaluations...
        let t1 = t0 + ms * 200;
        let mut switched = None;
        for k in 0..cfg.confirmations {
            switched = p.evaluate(&inputs(t1 + ms * k, 0.95, 100_000, 32.0, None));
        }
        assert_eq!(switched, Some(Mode::Poll));
        // ...and not back before the minimum dwell, however clear the signal.
        let t2 = t1 + ms * 5;
        for k in 0..10 {
            assert_eq!(p.evaluate(&inputs(t2 + ms * k / 2, 0.0, 0, 0.0, None)), None);
        }
        // The signal was confirmed meanwhile: it switches at the first evaluation past it.
        let t3 = t1 + cfg.min_dwell + ms * 5; // the switch happened at t1 + 2 ms
        assert_eq!(p.evaluate(&inputs(t3, 0.0, 0, 0.0, None)), Some(Mode::Interrupt));
        assert_eq!(p.evaluate(&inputs(t3 + ms, 0.0, 0, 0.0, None)), None);
        assert_eq!(p.switches(), 2);
    }

    #[test]
    fn sustained_load_in_a_sleeping_mode_probes_busy_poll_and_backs_off() {
        let cfg = PolicyConfig::default();
        let base = cfg.probe_interval.unwrap_or_default();
        let mut p = ModePolicy::new(cfg, Mode::Interrupt);
        let t0 = Instant::now();
        let ms = Duration::from_millis(1);
        // A reactor half busy in interrupt mode on a fast device at QD1 (spinning through its
        // completions would take half the core): interrupt by the thresholds,
        // but after PROBE_SUSTAIN loaded evaluations it tries busy-poll.
        let mut t = t0;
        let mut probed_at = None;
        for _ in 0..PROBE_SUSTAIN + 1 {
            t += 2 * ms;
            if p.evaluate(&inputs(t, 0.45, 100_000, 1.0, Some(5))) == Some(Mode::Poll) {
                probed_at = Some(t);
                break;
            }
        }
        let probed_at = probed_at.expect("no probe under sustained load");
        assert_eq!(p.probes(), 1);
        // Polling did not saturate it (still half idle: over budget): back to interrupt after
        // a probe's dwell, shorter than the minimum dwell between chosen modes, and the next
        // probe waits twice as long.
        let back = next_switch(&mut p, &mut t, LONG, |t| inputs(t, 0.45, 100_000, 1.0, Some(5)));
        assert_eq!(back, Some(Mode::Interrupt));
        assert!(t - probed_at >= PROBE_DWELL, "left after {:?}", t - probed_at);
        assert!(t - probed_at < cfg.min_dwell, "a failed probe held {:?}", t - probed_at);
        assert_eq!(p.probe_interval(), base * 2);
        // No probe before the doubled interval.
        while t - probed_at < base * 2 - 10 * ms {
            t += 2 * ms;
            assert_eq!(p.evaluate(&inputs(t, 0.45, 100_000, 1.0, Some(5))), None);
        }
        // The second probe finds saturation (busy-poll made the reactor 90% busy): it stays,
        // and a long stay resets the interval.
        let second = next_switch(&mut p, &mut t, 400 * ms, |t| inputs(t, 0.45, 100_000, 1.0, Some(5)));
        assert_eq!(second, Some(Mode::Poll));
        for _ in 0..1000 {
            t += 2 * ms;
            assert_eq!(
                p.evaluate(&inputs(t, 0.9, 200_000, 32.0, Some(5))),
                None,
                "saturated: stays"
            );
        }
        let left = next_switch(&mut p, &mut t, LONG, |t| inputs(t, 0.0, 0, 0.0, None));
        assert_eq!(left, Some(Mode::Interrupt));
        assert_eq!(p.probe_interval(), base, "a probe that held resets the interval");
        // An idle reactor never probes.
        for _ in 0..5000 {
            t += 2 * ms;
            assert_eq!(p.evaluate(&inputs(t, 0.01, 0, 0.0, None)), None);
        }
        assert_eq!(p.probes(), 2);
    }

    /// The per-namespace override as the policy sees it: a `never` namespace's completions
    /// alone never make it poll, probe or choose hybrid, however busy they keep the reactor;
    /// beside an `auto` namespace only the latter's share of the busy time counts.
    #[test]
    fn never_load_never_makes_the_policy_spin() {
        let ms = Duration::from_millis(1);
        let never_only = |t, busy| PolicyInputs {
            completions: 0,
            quiet_completions: 20_000,
            ..inputs(t, busy, 0, 4.0, None)
        };
        for start in Mode::ALL {
            let mut p = ModePolicy::new(PolicyConfig::default(), start);
            let mut t = Instant::now();
            // Saturated by never traffic (95 % busy) for long enough to confirm and to probe.
            for _ in 0..5000 {
                t += 2 * ms;
                p.evaluate(&never_only(t, 0.95));
            }
            assert_eq!(p.current(), Mode::Interrupt, "from {start}");
            assert_eq!(p.probes(), 0, "from {start}: no busy-poll probe for never load");
        }
        // Beside an auto namespace: 90 % busy, but 3/4 of the completions are never: 22.5 %
        // counts, which is not saturation (with a 0.3 budget).
        let p = ModePolicy::new(PolicyConfig::default(), Mode::Interrupt);
        let t = Instant::now();
        let mixed = PolicyInputs {
            quiet_completions: 30_000,
            ..inputs(t, 0.9, 10_000, 4.0, Some(80))
        };
        assert!((mixed.spin_busy() - 0.225).abs() < 1e-9);
        assert_ne!(p.desired(&mixed), Mode::Poll);
        // The same busy share, all of it auto: saturated, polls.
        assert_eq!(p.desired(&inputs(t, 0.9, 40_000, 4.0, Some(80))), Mode::Poll);
    }

    #[test]
    fn budget_is_respected() {
        // Light load on a fast device: polling would idle most of a core: over a 0.3 budget.
        let p = ModePolicy::new(
            PolicyConfig {
                cpu_budget: 0.3,
                ..PolicyConfig::default()
            },
            Mode::Poll,
        );
        let t = Instant::now();
        assert_ne!(p.desired(&inputs(t, 0.5, 50_000, 1.0, Some(5))), Mode::Poll);
        // With a generous budget the same load polls.
        let p = ModePolicy::new(
            PolicyConfig {
                cpu_budget: 0.6,
                ..PolicyConfig::default()
            },
            Mode::Interrupt,
        );
        assert_eq!(p.desired(&inputs(t, 0.5, 50_000, 1.0, Some(5))), Mode::Poll);
    }

    /// A 10 us device at QD 8, paced (the frontier's sim10 QD8 cell: 77.6 K IOPS, 4 in
    /// flight on average). The model prices hybrid at one whole wait per completion, 0.78 of
    /// a core: over budget. But the waits overlap, so the policy probes hybrid and prices it
    /// by what it measurably spins.
    #[test]
    fn overlapping_commands_probe_hybrid_and_price_it_as_measured() {
        let cfg = PolicyConfig::default();
        let base = cfg.probe_interval.unwrap_or_default();
        let ms = Duration::from_millis(1);
        let qd8 = |t, measured_us: Option<u64>| PolicyInputs {
            hybrid_measured: measured_us.map(Duration::from_micros),
            ..inputs(t, 0.2, 77_600, 4.0, Some(10))
        };
        let t0 = Instant::now();
        // The hybrid probe comes within PROBE_SUSTAIN + 1 evaluations of the load.
        let probe =
            |p: &mut ModePolicy, t: &mut Instant| next_switch(p, t, 2 * ms * (PROBE_SUSTAIN + 1), |t| qd8(t, None));

        // Measured 3 us per completion: 0.23 of a core, inside 0.3. Hybrid stays, and a
        // probe that held leaves the interval at its base.
        let mut p = ModePolicy::new(cfg, Mode::Interrupt);
        assert_eq!(p.desired(&qd8(t0, None)), Mode::Interrupt, "the model: 0.78 of a core");
        let mut t = t0;
        assert_eq!(probe(&mut p, &mut t), Some(Mode::Hybrid), "no hybrid probe");
        assert_eq!((p.hybrid_probes(), p.probes()), (1, 0));
        for _ in 0..1000 {
            t += 2 * ms;
            assert_eq!(p.evaluate(&qd8(t, Some(3))), None, "measured inside the budget: stays");
        }
        assert_eq!(p.measured_hybrid_spin(t), Some(3 * US));
        // The load goes; the next evaluation leaves hybrid for interrupt.
        let left = next_switch(&mut p, &mut t, LONG, |t| inputs(t, 0.0, 0, 0.0, None));
        assert_eq!(left, Some(Mode::Interrupt));
        assert_eq!(p.hybrid_probe_interval(), base, "a probe that held");

        // Measured 6 us per completion: 0.47 of a core. Back to interrupt after a probe's
        // dwell, the next probe waits twice as long, and none comes while the measurement
        // stands.
        let mut p = ModePolicy::new(cfg, Mode::Interrupt);
        let mut t = t0;
        assert_eq!(probe(&mut p, &mut t), Some(Mode::Hybrid));
        let probed_at = t;
        let back = next_switch(&mut p, &mut t, LONG, |t| qd8(t, Some(6)));
        assert_eq!(back, Some(Mode::Interrupt));
        assert!(t - probed_at >= PROBE_DWELL, "left after {:?}", t - probed_at);
        assert!(t - probed_at < cfg.min_dwell, "a failed probe held {:?}", t - probed_at);
        assert_eq!(p.hybrid_probe_interval(), base * 2);
        while t - probed_at < base * 2 - 10 * ms {
            t += 2 * ms;
            assert_eq!(p.evaluate(&qd8(t, None)), None, "no probe before the doubled interval");
        }
        assert_eq!(probe(&mut p, &mut t), Some(Mode::Hybrid), "the second probe");
        assert_eq!(p.hybrid_probes(), 2);

        // From busy-poll (a load that looked saturated in interrupt mode, where each wake-up
        // costs CPU, but is not: 0.4 busy in poll mode), the model's word would send it to
        // interrupt; it goes to hybrid instead, and stays there while its measured spin fits.
        let mut p = ModePolicy::new(cfg, Mode::Poll);
        let mut t = t0;
        let to = next_switch(&mut p, &mut t, Duration::from_millis(200), |t| PolicyInputs {
            busy_fraction: 0.4,
            ..qd8(t, None)
        });
        assert_eq!(to, Some(Mode::Hybrid), "busy-poll leaves by way of hybrid");
        assert_eq!(p.hybrid_probes(), 1);
        for _ in 0..1000 {
            t += 2 * ms;
            assert_eq!(p.evaluate(&qd8(t, Some(3))), None, "measured inside the budget: stays");
        }

        // One command at a time: the model's price is exact, so no hybrid probe.
        let mut p = ModePolicy::new(cfg, Mode::Interrupt);
        let mut t = t0;
        for _ in 0..10 * PROBE_SUSTAIN {
            t += 2 * ms;
            assert_eq!(p.evaluate(&inputs(t, 0.2, 77_600, 1.0, Some(10))), None, "QD1");
        }
        assert_eq!(p.hybrid_probes(), 0);
    }

    /// Once hybrid ran, its measured spin decides, in both directions, until it is stale.
    #[test]
    fn a_measured_hybrid_spin_overrides_the_model_until_it_is_stale() {
        let ms = Duration::from_millis(1);
        // A slow device at QD1: the model (margin plus turnaround, 20 us per I/O at 10 K
        // IOPS) says 0.2 of a core; measured, hybrid spun 40 us per I/O (its margin kept
        // missing): 0.4, over 0.3.
        let slow = |t, measured_us: Option<u64>| PolicyInputs {
            hybrid_spin: Some(20 * US),
            hybrid_measured: measured_us.map(Duration::from_micros),
            ..inputs(t, 0.1, 10_000, 1.0, Some(80))
        };
        let t0 = Instant::now();
        let mut p = ModePolicy::new(PolicyConfig::default(), Mode::Hybrid);
        assert_eq!(p.desired(&slow(t0, None)), Mode::Hybrid, "modelled: 0.2");
        let mut t = t0;
        let mut switched = None;
        for _ in 0..100 {
            t += 2 * ms;
            switched = switched.or(p.evaluate(&slow(t, Some(40))));
        }
        assert_eq!(switched, Some(Mode::Interrupt), "measured: 0.4");
        assert_eq!(
            p.desired(&slow(t + MEASURED_TTL, None)),
            Mode::Hybrid,
            "stale: the model again"
        );
        // The smoothing: one window's outlier moves the estimate by a quarter of the way.
        let mut q = ModePolicy::new(PolicyConfig::default(), Mode::Hybrid);
        q.evaluate(&slow(t0, Some(10)));
        q.evaluate(&slow(t0 + ms, Some(50)));
        assert_eq!(q.measured_hybrid_spin(t0 + ms), Some(20 * US));
    }

    /// Interrupt mode whose wake-ups keep the reactor busy (saturated by its own reading)
    /// sends it to busy-poll, where the same load reads half busy: over budget. Taking the
    /// sleeping mode's reading alone again, the two would alternate at every minimum dwell
    /// (seen at 48.8 K IOPS on a 10 us device, QD 8, paced: 39 switches in 2.5 s). Once
    /// busy-poll has measured the load's work per completion, interrupt mode prices the
    /// load by that and stays, inside the budget; the busy-poll probe (short, backing off)
    /// is all the polling left.
    #[test]
    fn busy_polls_measured_work_outweighs_a_sleeping_modes_reading() {
        let cfg = PolicyConfig::default();
        let ms = Duration::from_millis(1);
        // One command at a time (no hybrid probe), 50 K IOPS, a fast device (spinning through
        // its completions would take half the core: interrupt by the model).
        let load = |t, busy, completions| inputs(t, busy, completions, 1.0, Some(10));
        let t0 = Instant::now();
        let mut p = ModePolicy::new(cfg, Mode::Interrupt);
        let mut t = t0;
        let to = next_switch(&mut p, &mut t, LONG, |t| load(t, 0.95, 50_000));
        assert_eq!(to, Some(Mode::Poll), "saturated by interrupt mode's reading");
        assert_eq!(p.probes(), 0, "by the saturation rule, not a probe");
        let polled_at = t;
        // 0.45 busy in busy-poll (9 us of work per completion): over budget, it leaves after
        // the minimum dwell, having measured the work.
        let to = next_switch(&mut p, &mut t, LONG, |t| load(t, 0.45, 50_000));
        assert_eq!(to, Some(Mode::Interrupt));
        assert!(t - polled_at >= cfg.min_dwell);
        assert_eq!(p.measured_poll_work(t), Some(9 * US));
        // Back in interrupt mode at 0.95 busy: the load is priced at 0.45, so no switch to
        // busy-poll but the probe's, each leaving after PROBE_DWELL and backing off.
        let left_at = t;
        let mut polled = Duration::ZERO;
        while t - left_at < POLL_WORK_TTL - 10 * ms {
            t += 2 * ms;
            match p.evaluate(&load(t, 0.95, 50_000)) {
                None => {}
                Some(Mode::Poll) => {
                    // Busy-poll reads the load's work as it is.
                    let entered = t;
                    let to = next_switch(&mut p, &mut t, LONG, |t| load(t, 0.45, 50_000));
                    assert_eq!(
                        to,
                        Some(Mode::Interrupt),
                        "a probe that finds the budget exceeded leaves"
                    );
                    polled += t - entered;
                }
                Some(m) => panic!("switched to {m:?}"),
            }
        }
        // Probes at 1, 2, 4 s after the first (and the first): 4, of 10-12 ms each.
        assert!((3..=5).contains(&p.probes()), "{} probes", p.probes());
        assert!(
            polled <= Duration::from_millis(15) * p.probes() as u32,
            "polled {polled:?} in {} probes",
            p.probes()
        );
        assert!(p.switches() <= 2 + 2 * p.probes(), "{} switches", p.switches());
        // A heavier load (twice the rate at the same work: 0.9 of a core) is saturated by
        // busy-poll's own measure: it polls.
        let to = next_switch(&mut p, &mut t, LONG, |t| load(t, 0.97, 100_000));
        assert_eq!(to, Some(Mode::Poll));
        // A load without device completions (a RAM namespace: sockets only) is not priced by
        // it: the reading decides.
        let mut q = ModePolicy::new(cfg, Mode::Poll);
        let mut t = t0;
        for _ in 0..100 {
            t += 2 * ms;
            q.evaluate(&load(t, 0.95, 0));
        }
        assert_eq!(q.measured_poll_work(t), None);
    }
}
