//! Busy-poll mode's hot sources: sockets taken out of epoll and run every iteration.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use mio::Token;
use mio::unix::SourceFd;
use tracing::{debug, warn};

use super::{HOT_MAX, Reactor, SourceId};
use crate::mode::Mode;
use crate::stats::bump;

impl Reactor {
    /// Busy-poll mode takes a pollable source that finds work out of epoll and runs it every
    /// iteration; it goes back when it has been idle for `cold_after` ([`super::COLD_AFTER`] by default) or the mode changes.
    ///
    /// Why: a socket in an epoll set has epoll's wake-up callback on its data-ready path, so
    /// the peer's `send` (which on loopback runs this socket's receive in its own softirq)
    /// takes the epoll lock and queues the socket on the ready list, and this reactor needs
    /// an `epoll_wait` before its `recv`. A polling reactor needs neither: measured on a QD1
    /// 4 KiB read over loopback (alternating pairs against the build before, medians of the
    /// pairs' differences), the p50 fell by 1.33 us (16 pairs) and 1.14 us (20 pairs) and the
    /// target's CPU per I/O by 4.8 % and 6.5 %, where skipping only the `epoll_wait` (the
    /// socket still registered) gained 0.3 us.
    pub(super) fn update_heat(&mut self, id: SourceId, did_work: bool, now: Instant) {
        let polling = self.effective_mode() == Mode::Poll;
        let cold_after = self.cold_after;
        let Some(s) = self.slots.get_mut(id) else { return };
        if did_work {
            s.cold_at = now + cold_after;
        }
        if s.hot {
            if !polling || now >= s.cold_at {
                self.cool(id);
            }
        } else if did_work && polling && self.hot < HOT_MAX {
            self.heat(id);
        }
    }

    fn heat(&mut self, id: SourceId) {
        let Some(s) = self.slots.get_mut(id) else { return };
        let Some(fd) = s.fd else { return };
        match self.poll.registry().deregister(&mut SourceFd(&fd)) {
            Ok(()) => {
                s.hot = true;
                self.hot += 1;
                self.stats.hot_sources.store(self.hot as u64, Relaxed);
                bump(&self.stats.hot_entries, 1);
                self.schedule(id);
            }
            Err(e) => debug!(reactor = self.id, error = %e, "cannot take a socket out of epoll: it stays there"),
        }
    }

    /// Back into epoll. Registering reports readiness that is already there (the kernel polls
    /// the file when it is added), so bytes that arrived meanwhile are not missed.
    fn cool(&mut self, id: SourceId) {
        let Some(s) = self.slots.get_mut(id) else { return };
        let Some(fd) = s.fd else { return };
        match self.poll.registry().register(&mut SourceFd(&fd), Token(id), s.interest) {
            Ok(()) => {
                s.hot = false;
                self.hot -= 1;
                self.stats.hot_sources.store(self.hot as u64, Relaxed);
            }
            // It stays hot, and a reactor with a hot source polls: nothing is lost.
            Err(e) => warn!(reactor = self.id, error = %e, "cannot put a socket back into epoll: it stays polled"),
        }
    }

    /// Put every hot source back into epoll (the reactor stopped busy-polling).
    pub(super) fn cool_all(&mut self) {
        let ids: Vec<SourceId> = self.slots.iter().filter(|(_, s)| s.hot).map(|(id, _)| id).collect();
        for id in ids {
            self.cool(id);
        }
    }
}
