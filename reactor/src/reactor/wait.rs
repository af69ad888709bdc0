//! The end of an iteration as the mode makes it: poll the epoll set, sleep until a deadline
//! (hybrid: shortly before an expected completion), or block until an fd is ready.

use std::cmp::Reverse;
use std::sync::atomic::Ordering::SeqCst;
use std::time::{Duration, Instant};

use mio::Token;
use tracing::warn;

use super::{HOT_MAX, INBOX_TOKEN, Next, Reactor, TIMER_TOKEN};
use crate::mode::Mode;
use crate::stats::bump;

impl Reactor {
    /// The earliest deadline of timers and `At` sources (and `Expect` sources without an fd
    /// in interrupt mode).
    fn next_deadline(&self, mode: Mode) -> (Option<Instant>, bool, Option<Instant>) {
        let mut deadline = self.timers.peek().map(|Reverse((t, _))| *t);
        let mut asap = false;
        let mut expect: Option<Instant> = None;
        for &id in &self.sched {
            let Some(s) = self.slots.get(id) else { continue };
            match s.next {
                Next::Asap => asap = true,
                Next::At(t) => deadline = Some(deadline.map_or(t, |d| d.min(t))),
                Next::Expect(t) => {
                    if mode == Mode::Interrupt && s.fd.is_none() {
                        deadline = Some(deadline.map_or(t, |d| d.min(t)));
                    } else {
                        expect = Some(expect.map_or(t, |e| e.min(t)));
                    }
                }
                Next::Idle => {}
            }
        }
        (deadline, asap, expect)
    }

    /// How long to wait for events when the iteration found no work: Some(ZERO) to poll,
    /// Some(deadline) to sleep until then, None to block until an fd is ready.
    pub(super) fn plan_wait(&mut self) -> WaitPlan {
        let mode = self.effective_mode();
        // A hot source left over (it could not go back into epoll) is only found by polling.
        if mode == Mode::Poll || self.hot > 0 {
            return WaitPlan::Poll;
        }
        // About to sleep: a fresh time, so that the sleep is not longer by this iteration's
        // work (polling needs none).
        let now = Instant::now();
        let (deadline, asap, expect) = self.next_deadline(mode);
        if asap {
            return WaitPlan::Poll;
        }
        // Hybrid, nothing in flight: spin through a closed-loop host's turnaround when it is
        // shorter than a wake-up (`TurnaroundSpin`), then block.
        if mode == Mode::Hybrid
            && expect.is_none()
            && self.idle_since.is_some_and(|t| now < t + self.turnaround.spin_for())
        {
            return WaitPlan::Poll;
        }
        let mut plan = match deadline {
            Some(d) if d <= now => return WaitPlan::Poll,
            Some(d) => WaitPlan::Until(d, false),
            None => WaitPlan::Block,
        };
        if mode == Mode::Hybrid
            && let Some(e) = expect
        {
            if self.hybrid_slept_for == Some(e) {
                return WaitPlan::Poll; // slept once for this completion: now spin until it lands
            }
            self.hybrid_slept_for = Some(e);
            match self.sleep_policy.wake_at(now, e) {
                None => return WaitPlan::Poll,
                Some(w) => {
                    if !matches!(plan, WaitPlan::Until(d, _) if d <= w) {
                        plan = WaitPlan::Until(w, true);
                    }
                }
            }
        }
        plan
    }

    fn arm_timer(&mut self, at: Instant, now: Instant) {
        if self.timerfd_deadline == Some(at) {
            return;
        }
        if let Err(e) = self.timerfd.arm(at.saturating_duration_since(now)) {
            warn!(reactor = self.id, error = %e, "timerfd arm failed");
        }
        self.timerfd_deadline = Some(at);
    }

    /// Checks the epoll set as `plan` says (`now`: the time read last) and runs the sources
    /// it names; returns whether they did work, how long the reactor slept, and the time
    /// read last.
    pub(super) fn wait_and_dispatch(&mut self, plan: WaitPlan, now: Instant) -> (bool, Duration, Instant) {
        let timeout = match plan {
            WaitPlan::Poll => {
                if self.hot > 0 && self.hot < HOT_MAX && now < self.next_fd_poll {
                    return (false, Duration::ZERO, now);
                }
                Some(Duration::ZERO)
            }
            WaitPlan::Until(at, _) => {
                self.arm_timer(at, Instant::now());
                None
            }
            WaitPlan::Block => None,
        };
        let blocking = timeout.is_none();
        let mut t_wait = now;
        if blocking {
            self.inbox.sleeping.store(true, SeqCst);
            if !self.inbox.queue.is_empty() {
                self.inbox.sleeping.store(false, SeqCst);
                return (true, Duration::ZERO, now);
            }
            t_wait = Instant::now();
        }
        bump(&self.stats.fd_polls, 1);
        let res = self.poll.poll(&mut self.events, timeout);
        let woke = Instant::now();
        let slept = if blocking { woke - t_wait } else { Duration::ZERO };
        if blocking {
            self.inbox.sleeping.store(false, SeqCst);
        }
        self.next_fd_poll = woke + self.fd_poll_interval;
        if let Err(e) = res {
            if e.kind() != std::io::ErrorKind::Interrupted {
                warn!(reactor = self.id, error = %e, "epoll_wait failed");
            }
            return (false, slept, woke);
        }
        let mut ready = std::mem::take(&mut self.ready);
        ready.clear();
        let mut timer_fired = false;
        for ev in self.events.iter() {
            match ev.token() {
                TIMER_TOKEN => timer_fired = true,
                INBOX_TOKEN => {
                    self.inbox.doorbell.drain();
                }
                Token(id) => ready.push(id),
            }
        }
        if timer_fired && self.timerfd.consume() {
            if let (WaitPlan::Until(at, hybrid), Some(_)) = (plan, self.timerfd_deadline) {
                let late = woke.saturating_duration_since(at);
                self.stats.record_wake_lateness(late.as_nanos() as u64);
                self.wake_cost_ns += 0.125 * (late.as_nanos() as f64 - self.wake_cost_ns);
                if hybrid {
                    self.sleep_policy.observe_wakeup(at, woke);
                }
            }
            self.timerfd_deadline = None;
        }
        let (mut work, mut t) = (false, woke);
        for &id in &ready {
            let (w, t1) = self.run_source(id, t);
            work |= w;
            t = t1;
        }
        self.ready = ready;
        (work, slept, t)
    }
}

#[derive(Debug, Clone, Copy)]
pub(super) enum WaitPlan {
    /// Check fds without blocking.
    Poll,
    /// Block until this time (true: a hybrid sleep before an expected completion).
    Until(Instant, bool),
    /// Block until an fd is ready.
    Block,
}
