//! The adaptive machinery's tests: synthetic traces in, decisions out.

use std::time::{Duration, Instant};

use super::*;
use crate::mode::{FractionSleep, Mode, SleepPolicy};

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
    let mut s = TurnaroundSpin::with_rule(Turnaround::Sleep);
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
    let probe = |p: &mut ModePolicy, t: &mut Instant| next_switch(p, t, 2 * ms * (PROBE_SUSTAIN + 1), |t| qd8(t, None));

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
