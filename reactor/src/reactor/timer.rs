//! Timers: closures run on the reactor at a deadline (the timerfd wakes a sleeping loop).

use std::cmp::Reverse;
use std::time::Instant;

use super::Reactor;

/// Handle of a pending timer, for [`Reactor::cancel_timer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TimerId(u64);

pub(super) type TimerFn = Box<dyn FnOnce(&mut Reactor)>;

impl Reactor {
    /// Run `f` on this reactor at `at` (microsecond precision: the timerfd is armed in ns).
    pub fn add_timer(&mut self, at: Instant, f: impl FnOnce(&mut Reactor) + 'static) -> TimerId {
        self.timer_seq += 1;
        let seq = self.timer_seq;
        self.timers.push(Reverse((at, seq)));
        self.timer_fns.insert(seq, Box::new(f));
        TimerId(seq)
    }

    /// Cancel a pending timer; false if it already ran or was cancelled.
    pub fn cancel_timer(&mut self, t: TimerId) -> bool {
        if self.timer_top_live == t.0 {
            self.timer_top_live = 0;
        }
        self.timer_fns.remove(&t.0).is_some()
    }

    pub(super) fn run_timers(&mut self, now: Instant) -> bool {
        let mut ran = false;
        while let Some(Reverse((at, seq))) = self.timers.peek().copied() {
            if at > now {
                break;
            }
            self.timers.pop();
            if let Some(f) = self.timer_fns.remove(&seq) {
                ran = true;
                let t0 = Instant::now();
                f(self);
                let took = t0.elapsed();
                if took > self.stall_threshold {
                    self.stall("timer", took);
                }
            }
        }
        // Drop cancelled timers at the top so they do not arm the timerfd. The top seen live
        // before (and not cancelled since) needs no lookup: this runs every iteration.
        while let Some(Reverse((_, seq))) = self.timers.peek() {
            if *seq == self.timer_top_live {
                break;
            }
            if self.timer_fns.contains_key(seq) {
                self.timer_top_live = *seq;
                break;
            }
            self.timers.pop();
        }
        ran
    }
}
