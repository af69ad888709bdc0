//! [`ModePolicy`]: chooses busy-poll, hybrid or interrupt for a reactor.

use std::time::{Duration, Instant};

use crate::mode::Mode;

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
