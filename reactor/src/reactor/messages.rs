//! Messages: closures sent by other reactors (or this one), run at the top of an iteration.

use std::time::Instant;

use super::Reactor;
use crate::inbox::{Message, Remote};
use crate::stats::bump;

impl Reactor {
    /// A handle to send messages to reactor `to`.
    pub fn remote(&self, to: usize) -> Option<Remote> {
        self.peers.get(to).cloned()
    }

    /// Run `f` on reactor `to` (may be this one: it then runs on a later iteration). False if
    /// that reactor does not exist or has stopped.
    pub fn send(&mut self, to: usize, f: impl FnOnce(&mut Reactor) + Send + 'static) -> bool {
        match self.peers.get(to) {
            Some(r) => r.send_counted(&self.stats, Box::new(f)),
            None => false,
        }
    }

    pub(super) fn drain_inbox(&mut self) -> bool {
        let mut n = 0u64;
        while let Some(msg) = self.inbox.queue.pop() {
            n += 1;
            self.run_message(msg);
            if self.stop {
                break;
            }
        }
        if n > 0 {
            bump(&self.stats.msgs_received, n);
        }
        n > 0
    }

    fn run_message(&mut self, msg: Message) {
        let t0 = Instant::now();
        msg(self);
        let took = t0.elapsed();
        if took > self.stall_threshold {
            self.stall("message", took);
        }
    }
}
