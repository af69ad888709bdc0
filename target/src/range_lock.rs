//! LBA range locks of a namespace: what makes a fused Compare and Write (NVMe 2.0 §3.4.2,
//! NVM Command Set 1.0 §3.2.1) and a Copy (NVM Command Set 1.0 §3.2.2) atomic against every
//! other write to their blocks, from any queue on any reactor, without a lock on the write
//! path (SPDK: the bdev layer's LBA range lock).
//!
//! # Design
//! - **State.** Each namespace has a [`RangeLocks`]: a count of held locks (`active`) and,
//!   behind a mutex touched only when `active` is not zero or by a locker, the held ranges
//!   and, per range, who waits for it.
//! - **A plain write** (Write, Write Zeroes, Dataset Management deallocate) loads `active`
//!   once before it starts ([`RangeLocks::blocked`]): zero, it goes. Otherwise it looks at the
//!   held ranges; one overlapping it parks the write on its connection (its data with it)
//!   and records the connection as a waiter of that range. Unlocking wakes each waiter by a
//!   message to its reactor, and the parked writes run again (and may park again).
//! - **A locker** (the connection running a Compare and Write, or a Copy to its
//!   destination) takes the range ([`RangeLocks::try_lock`]; an overlapping held range makes
//!   it wait exactly as a write does), then *fences* every reactor: a message to each, which
//!   answers once the writes that reactor had started to this namespace before the message
//!   have completed ([`crate::queue::fence`]). A write that starts on a reactor after that
//!   reactor ran the message sees `active` (the message orders it after the locker's store)
//!   and checks the range; one that started before is in flight and the fence waits for it;
//!   there is nothing in between, because a reactor runs a message between its sources'
//!   runs, and a write is checked and submitted within one run. Writes that complete inline
//!   (RAM) are done before the run ends, so they are never in flight. Then the locker reads,
//!   compares, writes and unlocks.
//! - **In-flight writes** are counted per reactor and namespace, in two slots
//!   ([`NsCounters`]' `writes`, written by that reactor only, as the I/O counters are): a
//!   write adds one to the current slot at submission and takes it back from the same slot
//!   when it completes. A fence flips the current slot (new writes go to the other one) and
//!   waits for the old slot to drain; a second fence while one drains waits for that drain,
//!   flips again and waits for the second slot. So a fence waits for at most two
//!   generations of writes and never for a write started after it: a steady stream of writes
//!   to other blocks cannot hold it off, and no write waits for anything but an overlapping
//!   lock.
//! - **Reads** are not held: NVMe 2.0 §3.4.2 makes the pair atomic against the commands that
//!   could come between its compare and its write and change the outcome, which are writes
//!   (as SPDK's range lock, reads are not quiesced). A read overlapping the pair's write step
//!   sees what a read overlapping any write sees.
//! - **Teardown.** A connection that closes with a lock held unlocks it (and wakes its
//!   waiters); a fence answer that finds its locker gone unlocks too (unlocking twice is a
//!   no-op). A write of a closed connection still completes through its channel and leaves
//!   its slot, so a later fence never waits forever.
//!
//! [`NsCounters`]: crate::subsystem::NsCounters
//!
//! This module is the lock table a namespace holds; the fences and the count of writes in
//! flight, which need the namespace and the reactors, are the queue's
//! ([`crate::queue::fence`]).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use pollux_reactor::SourceId;

/// A connection that waits for a range to be unlocked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waiter {
    /// Its reactor.
    pub reactor: usize,
    /// Its source id there.
    pub source: SourceId,
    /// Its serial (guards against source id reuse).
    pub serial: u64,
}

#[derive(Debug)]
struct Held {
    id: u64,
    start: u64,
    end: u64,
    waiters: Vec<Waiter>,
}

/// The LBA range locks of one namespace (byte ranges).
#[derive(Debug, Default)]
pub struct RangeLocks {
    active: AtomicUsize,
    next_id: AtomicU64,
    held: Mutex<Vec<Held>>,
}

impl RangeLocks {
    /// Whether a write of `[start, end)` must wait; if so, `waiter` is recorded on the
    /// overlapping range and woken when it is unlocked. One atomic load when nothing is
    /// locked.
    #[inline(always)]
    pub fn blocked(&self, start: u64, end: u64, waiter: impl FnOnce() -> Waiter) -> bool {
        if self.active.load(Ordering::Acquire) == 0 {
            return false;
        }
        self.blocked_slow(start, end, waiter())
    }

    #[cold]
    fn blocked_slow(&self, start: u64, end: u64, waiter: Waiter) -> bool {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        match held.iter_mut().find(|h| h.start < end && start < h.end) {
            Some(h) => {
                if !h.waiters.contains(&waiter) {
                    h.waiters.push(waiter);
                }
                true
            }
            None => false,
        }
    }

    /// Lock `[start, end)`: its id, or None when an overlapping range is held (`waiter` is
    /// then woken when that one is unlocked).
    pub fn try_lock(&self, start: u64, end: u64, waiter: Waiter) -> Option<u64> {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(h) = held.iter_mut().find(|h| h.start < end && start < h.end) {
            if !h.waiters.contains(&waiter) {
                h.waiters.push(waiter);
            }
            return None;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        held.push(Held {
            id,
            start,
            end,
            waiters: Vec::new(),
        });
        self.active.fetch_add(1, Ordering::AcqRel);
        Some(id)
    }

    /// Unlock range `id` (a no-op if it is not held): who waited for it.
    pub fn unlock(&self, id: u64) -> Vec<Waiter> {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(at) = held.iter().position(|h| h.id == id) else {
            return Vec::new();
        };
        let h = held.swap_remove(at);
        self.active.fetch_sub(1, Ordering::AcqRel);
        h.waiters
    }

    /// Ranges held now (for tests and `pollux ctl`).
    pub fn held(&self) -> usize {
        self.active.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(source: usize) -> Waiter {
        Waiter {
            reactor: 0,
            source,
            serial: 1,
        }
    }

    #[test]
    fn overlapping_writes_wait_and_are_named_at_unlock() {
        let l = RangeLocks::default();
        assert!(!l.blocked(0, 4096, || w(1)));
        let id = l.try_lock(512, 1024, w(9)).unwrap_or_else(|| panic!("free range"));
        assert_eq!(l.held(), 1);
        assert!(!l.blocked(0, 512, || w(1)), "adjacent, not overlapping");
        assert!(!l.blocked(1024, 2048, || w(1)));
        assert!(l.blocked(1000, 1001, || w(2)));
        assert!(l.blocked(0, 4096, || w(3)));
        assert!(l.blocked(0, 4096, || w(3)), "a waiter is recorded once");
        assert!(l.try_lock(0, 600, w(4)).is_none(), "an overlapping lock waits");
        assert_eq!(l.unlock(id), vec![w(2), w(3), w(4)]);
        assert_eq!(l.held(), 0);
        assert!(l.unlock(id).is_empty(), "unlocking twice is a no-op");
        assert!(!l.blocked(0, 4096, || w(1)));
    }
}
