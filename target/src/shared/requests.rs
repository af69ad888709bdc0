//! A reactor's requests as `pollux ctl` sees them: how many of its queues' requests are in
//! each state ([`crate::queue::request`] keeps the states), and how many commands it
//! received and ended. Part of what the running target holds ([`super::Shared::requests`]).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use serde::{Deserialize, Serialize};

/// A request's state ([`crate::queue::request::ReqState`]) without its contents: what is
/// counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReqKind {
    /// [`crate::queue::request::ReqState::AwaitingData`].
    AwaitingData = 0,
    /// [`crate::queue::request::ReqState::Draining`].
    Draining = 1,
    /// [`crate::queue::request::ReqState::Parked`].
    Parked = 2,
    /// [`crate::queue::request::ReqState::Submitted`].
    Submitted = 3,
    /// [`crate::queue::request::ReqState::Held`].
    Held = 4,
}

/// A reactor's requests for `pollux ctl`: how many of its queues' requests are in each state
/// now, and how many commands ended. Written only by its reactor (a relaxed load and store,
/// no read-modify-write on the I/O path), read by the control thread.
#[derive(Debug, Default)]
#[repr(align(64))]
pub struct RequestStats {
    states: [AtomicU64; 5],
    ended: AtomicU64,
    failed: AtomicU64,
    /// Commands received (every capsule, fabrics ones included).
    received: AtomicU64,
    /// Commands whose queue closed (or was handed to another process) before they ended.
    dropped: AtomicU64,
    /// Asynchronous Event Requests held now by the controllers of this reactor.
    aers: AtomicU64,
}

/// A snapshot of [`RequestStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestCounts {
    /// Waiting for their data (R2T sent).
    pub awaiting_data: u64,
    /// Completed early, their data still draining.
    pub draining: u64,
    /// Waiting for a locked range or a fused partner.
    pub parked: u64,
    /// At their backend.
    pub submitted: u64,
    /// Held by their namespace's QoS limits (absent from older targets: 0).
    #[serde(default)]
    pub held: u64,
    /// Commands ended so far.
    pub ended: u64,
    /// Of which failed (any status but success).
    pub failed: u64,
    /// Commands received so far (absent from older targets: 0).
    #[serde(default)]
    pub received: u64,
    /// Commands received that never ended here: their queue closed first, or was handed to
    /// a new process by an upgrade (absent from older targets: 0).
    #[serde(default)]
    pub dropped: u64,
    /// Asynchronous Event Requests held now (absent from older targets: 0).
    #[serde(default)]
    pub aers: u64,
}

impl RequestCounts {
    /// Commands received and not yet ended, on queues still open: what the reactor's hosts
    /// wait for now, held AERs included. Every other command got its one completion.
    pub fn open(&self) -> u64 {
        self.received.saturating_sub(self.ended + self.dropped)
    }
}

impl RequestStats {
    /// One writer (its reactor): a plain load and store.
    #[inline]
    fn add(c: &AtomicU64, n: u64) {
        c.store(c.load(Relaxed).wrapping_add(n), Relaxed);
    }

    /// A request left state `from` (None: it was received) for `to` (None: it is done).
    #[inline]
    pub fn moved(&self, from: Option<ReqKind>, to: Option<ReqKind>) {
        if let Some(f) = from {
            Self::add(&self.states[f as usize], u64::MAX);
        }
        if let Some(t) = to {
            Self::add(&self.states[t as usize], 1);
        }
    }

    /// A command ended (its completion was queued).
    #[inline]
    pub fn finished(&self, ok: bool) {
        Self::add(&self.ended, 1);
        if !ok {
            Self::add(&self.failed, 1);
        }
    }

    /// `n` commands were received.
    #[inline]
    pub fn received(&self, n: u64) {
        Self::add(&self.received, n);
    }

    /// `n` commands received will never end here (their queue closed or left).
    pub fn dropped(&self, n: u64) {
        Self::add(&self.dropped, n);
    }

    /// The AERs held changed from `was` to `now`.
    pub fn aers_held(&self, was: u64, now: u64) {
        Self::add(&self.aers, now.wrapping_sub(was));
    }

    /// The counts now.
    pub fn snapshot(&self) -> RequestCounts {
        let s = |k: ReqKind| self.states[k as usize].load(Relaxed);
        RequestCounts {
            awaiting_data: s(ReqKind::AwaitingData),
            draining: s(ReqKind::Draining),
            parked: s(ReqKind::Parked),
            submitted: s(ReqKind::Submitted),
            held: s(ReqKind::Held),
            ended: self.ended.load(Relaxed),
            failed: self.failed.load(Relaxed),
            received: self.received.load(Relaxed),
            dropped: self.dropped.load(Relaxed),
            aers: self.aers.load(Relaxed),
        }
    }
}
