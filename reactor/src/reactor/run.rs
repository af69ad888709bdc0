//! The loop: iterations, their accounting, the adaptive policy's evaluation, and shutdown.

use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::time::{Duration, Instant};

use tracing::debug;

use super::wait::WaitPlan;
use super::{EvalMark, Reactor, SourceId};
use crate::adaptive::PolicyInputs;
use crate::mode::Mode;
use crate::stats::bump;

/// How often the adaptive policy evaluates.
const EVAL_INTERVAL: Duration = Duration::from_millis(2);
/// Weight of the newest window in the smoothed policy inputs (a time constant of ~4 windows:
/// one burst, or one preemption of the thread, must not flip the mode).
const EWMA: f64 = 0.25;
/// A window measures hybrid's spin when at least this share of it ran in hybrid mode.
const HYBRID_WINDOW_SHARE: f64 = 0.9;

impl Reactor {
    /// Run the loop until [`Reactor::stop`].
    pub(crate) fn run(&mut self) {
        // One clock subtraction per iteration (`Instant` to ns, for the published start):
        // the accounting subtracts those ns and the evaluation compares with a deadline.
        // A busy-poll iteration at QD1 is little more than one hot `recv`, and each
        // `Instant` difference costs ~25 instructions.
        let mut t_iter = Instant::now();
        let mut iter_start_ns = crate::stats::mono_ns_at(t_iter);
        self.stats.iteration_booked(iter_start_ns);
        let mut eval_due = self.eval.at + EVAL_INTERVAL;
        while !self.stop {
            self.check_hold(t_iter);
            let held = self.held;
            let mut work = self.drain_inbox();
            work |= self.run_timers(t_iter);
            // Messages or timers ran: a fresh time, or the first source's run would seem to
            // include theirs (and a stall be blamed on it).
            let t_sched = if work { Instant::now() } else { t_iter };
            let (w, now) = self.run_scheduled(t_sched);
            work |= w;
            let plan = if work || self.stop {
                WaitPlan::Poll
            } else {
                self.plan_wait()
            };
            // The iteration ends at the time read last (after the last source that ran or
            // the epoll_wait): what follows it is counted in the next one.
            let (w, slept, t_end) = self.wait_and_dispatch(plan, now);
            work |= w;
            let out = self.load.outstanding;
            if out != self.prev_outstanding {
                self.note_outstanding(out, t_end);
            }
            let end_ns = crate::stats::mono_ns_at(t_end);
            let iter_ns = end_ns.saturating_sub(iter_start_ns);
            let s = &self.stats;
            s.booking_iteration();
            bump(&s.iterations, 1);
            bump(&s.mode_ns[self.mode.index()], iter_ns);
            if held {
                bump(&s.held_ns, iter_ns);
            }
            if work {
                bump(&s.busy_iterations, 1);
                bump(&s.busy_ns, iter_ns);
            } else {
                bump(&s.idle_ns, iter_ns);
            }
            if !slept.is_zero() {
                bump(&s.sleep_ns, slept.as_nanos() as u64);
            }
            let spun = !work && slept.is_zero();
            if spun {
                bump(&s.spin_ns, iter_ns);
            }
            if self.mode == Mode::Hybrid && !held {
                self.hybrid_ns += iter_ns;
                if spun {
                    self.hybrid_spin_ns += iter_ns;
                }
            }
            if t_end >= eval_due {
                self.evaluate_policy(t_end);
                eval_due = self.eval.at + EVAL_INTERVAL;
            }
            t_iter = t_end;
            iter_start_ns = end_ns;
            self.stats.iteration_booked(end_ns);
        }
        self.shutdown_sources();
    }

    /// The device queues' outstanding count changed to `out` by the end of an iteration
    /// (`now`): the idle-to-busy gaps are the host's turnarounds ([`TurnaroundSpin`]).
    fn note_outstanding(&mut self, out: u64, now: Instant) {
        if out == 0 {
            // Only a completion of a channel that may spin starts a turnaround to spin
            // through: a `never` namespace's never does.
            self.idle_since = (!self.load.last_quiet).then_some(now);
        } else if self.prev_outstanding == 0
            && let Some(t) = self.idle_since.take()
        {
            self.turnaround.observe_gap(now.saturating_duration_since(t));
        }
        self.prev_outstanding = out;
    }

    /// Publish the device load and, for an adaptive reactor, let the policy pick the mode.
    fn evaluate_policy(&mut self, now: Instant) {
        // The completion-weighted mean of the (channel, class) estimates of this window,
        // smoothed over windows like the busy fraction.
        let predicted = self.load.evaluate(EWMA);
        let s = &self.stats;
        s.outstanding.store(self.load.outstanding, Relaxed);
        s.completions.store(self.load.completions, Relaxed);
        s.predicted_ns
            .store(predicted.map_or(0, |p| p.as_nanos() as u64), Relaxed);
        s.publish_classes(self.load.classes());
        s.wake_cost_ns.store(self.wake_cost_ns as u64, Relaxed);
        self.turnaround
            .set_wake_cost(Duration::from_nanos(self.wake_cost_ns as u64));
        let busy_ns = s.busy_ns.load(Relaxed);
        let window = now.duration_since(self.eval.at).as_nanos().max(1) as f64;
        let cpu_ns = crate::sys::thread_cpu_ns();
        let wall_busy = busy_ns.saturating_sub(self.eval.busy_ns) as f64 / window;
        let cpu = cpu_ns.saturating_sub(self.eval.cpu_ns) as f64 / window;
        let busy = wall_busy.min(cpu).min(1.0);
        self.busy_ewma += EWMA * (busy - self.busy_ewma);
        let completions = (self.load.completions - self.load.quiet_completions)
            .saturating_sub(self.eval.completions - self.eval.quiet_completions);
        // What hybrid spun per completion, from a window spent (nearly) all in it: the
        // iterations that neither found work nor slept. A window that began in another mode
        // or was held in busy-poll measures something else.
        let hybrid_window = self.hybrid_ns - self.eval.hybrid_ns;
        let hybrid_measured = (hybrid_window as f64 >= HYBRID_WINDOW_SHARE * window && completions > 0)
            .then(|| Duration::from_nanos((self.hybrid_spin_ns - self.eval.hybrid_spin_ns) / completions));
        let inputs = PolicyInputs {
            now,
            busy_fraction: self.busy_ewma,
            completions,
            quiet_completions: self.load.quiet_completions - self.eval.quiet_completions,
            outstanding: (self.load.outstanding + self.eval.outstanding) as f64 / 2.0,
            predicted,
            wake_cost: Duration::from_nanos(self.wake_cost_ns as u64),
            hybrid_spin: self.sleep_policy.margin().map(|m| m + self.turnaround.spin_for()),
            hybrid_measured,
            window: now.duration_since(self.eval.at),
        };
        self.eval = EvalMark {
            at: now,
            busy_ns,
            cpu_ns,
            completions: self.load.completions,
            quiet_completions: self.load.quiet_completions,
            outstanding: self.load.outstanding,
            hybrid_ns: self.hybrid_ns,
            hybrid_spin_ns: self.hybrid_spin_ns,
        };
        let Some(policy) = &mut self.policy else {
            if let Some(m) = hybrid_measured {
                s.hybrid_spin_ns.store(m.as_nanos() as u64, Relaxed);
            }
            return;
        };
        let switched = policy.evaluate(&inputs);
        let standing = policy.measured_hybrid_spin(now);
        s.hybrid_spin_ns
            .store(standing.map_or(0, |m| m.as_nanos() as u64), Relaxed);
        if let Some(mode) = switched {
            bump(&self.stats.switches, 1);
            debug!(reactor = self.id, ?inputs, to = %mode, "adaptive policy switches mode");
            self.set_mode(mode);
        }
    }

    fn shutdown_sources(&mut self) {
        self.inbox.closed.store(true, SeqCst);
        let ids: Vec<SourceId> = self.slots.iter().map(|(id, _)| id).collect();
        for id in ids {
            if let Some(mut src) = self.slots.get_mut(id).and_then(|s| s.src.take()) {
                src.shutdown(self, id);
                if let Some(s) = self.slots.get_mut(id) {
                    s.src = Some(src);
                }
            }
        }
        // Messages that arrived late may hold resources (e.g. sockets): drop them here.
        while self.inbox.queue.pop().is_some() {}
        let ids: Vec<SourceId> = self.slots.iter().map(|(id, _)| id).collect();
        for id in ids {
            drop(self.finish_removal(id));
        }
        self.timer_fns.clear();
        self.timers.clear();
        self.locals.clear();
    }
}
