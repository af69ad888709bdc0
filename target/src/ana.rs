//! Asymmetric Namespace Access (NVMe 2.0 §8.1.3) on one listener's path: the state of every
//! ANA group, read by each I/O command of the listener's connections and by the ANA log page
//! of its controllers, changed by the conf and `pollux ctl set-ana-state`.
//!
//! A listener is a port of the subsystem (every listener serves every subsystem), so a
//! group's state is per (listener, group), as SPDK keeps it per listener and nvmet per port.
//! The states are atomics behind an `Arc` the listener's connections share: a change is seen
//! by the next command on every reactor without a message, and the I/O path pays one relaxed
//! load. The change count tells controllers that the log page changed (their next snapshot
//! refresh raises the ANA change event).

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering::Relaxed};

use pollux_conf::{ANAGRPMAX, AnaState, Listener};
use pollux_nvme::spec::Status;

/// ANA states set over every listener's conf states, by group (see [`AnaStates::apply_over`]).
pub type Overlay = std::collections::BTreeMap<u32, AnaState>;

/// The ANA states of one listener's path.
#[derive(Debug)]
pub struct AnaStates {
    /// State codes by group id (index 0 unused).
    codes: Box<[AtomicU8]>,
    /// ANA log page Change Count: bumped on every change of a state here.
    chgcnt: AtomicU64,
}

impl Default for AnaStates {
    /// Every group optimized.
    fn default() -> Self {
        Self::from_fn(|_| AnaState::Optimized)
    }
}

impl AnaStates {
    /// The states a conf listener gives.
    pub fn new(l: &Listener) -> Self {
        Self::from_fn(|g| l.ana_state(g))
    }

    fn from_fn(state: impl Fn(u32) -> AnaState) -> Self {
        Self {
            codes: (0..=ANAGRPMAX).map(|g| AtomicU8::new(state(g).code())).collect(),
            chgcnt: AtomicU64::new(1),
        }
    }

    /// The state of group `grp` (optimized for a group out of range).
    pub fn state(&self, grp: u32) -> AnaState {
        self.codes
            .get(grp as usize)
            .and_then(|c| AnaState::from_code(c.load(Relaxed)))
            .unwrap_or_default()
    }

    /// The path status of an I/O command on a namespace of group `grp` (None: it runs).
    #[inline]
    pub fn path_status(&self, grp: u32) -> Option<Status> {
        let code = self.codes.get(grp as usize)?.load(Relaxed);
        if code <= AnaState::NonOptimized.code() {
            return None;
        }
        AnaState::from_code(code).and_then(AnaState::path_status)
    }

    /// Take the states of conf listener `l`: whether any changed (the change count then
    /// moved on).
    pub fn apply(&self, l: &Listener) -> bool {
        self.apply_over(l, &Overlay::new())
    }

    /// Take the states of conf listener `l` with `overlay`'s over them (a gateway group's:
    /// the groups this gateway took over, or its own while it is fenced).
    pub fn apply_over(&self, l: &Listener, overlay: &Overlay) -> bool {
        let mut changed = false;
        for (g, c) in self.codes.iter().enumerate().skip(1) {
            let want = overlay
                .get(&(g as u32))
                .copied()
                .unwrap_or_else(|| l.ana_state(g as u32))
                .code();
            if c.swap(want, Relaxed) != want {
                changed = true;
            }
        }
        if changed {
            self.chgcnt.fetch_add(1, Relaxed);
        }
        changed
    }

    /// The Change Count of the ANA log page.
    pub fn chgcnt(&self) -> u64 {
        self.chgcnt.load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_follow_the_conf_and_count_changes() {
        let mut l = Listener::plain(([127, 0, 0, 1], 4420).into());
        let a = AnaStates::new(&l);
        assert_eq!(
            (a.state(1), a.path_status(1), a.chgcnt()),
            (AnaState::Optimized, None, 1)
        );
        l.ana.insert(2, AnaState::Inaccessible);
        l.ana.insert(3, AnaState::NonOptimized);
        assert!(a.apply(&l));
        assert_eq!(a.chgcnt(), 2);
        assert_eq!(a.path_status(2), Some(Status::ANA_INACCESSIBLE));
        assert_eq!((a.state(3), a.path_status(3)), (AnaState::NonOptimized, None));
        assert!(!a.apply(&l), "the same states are no change");
        assert_eq!(a.chgcnt(), 2);
        // Out of range: optimized, no status, no panic.
        assert_eq!(
            (a.state(0), a.state(ANAGRPMAX + 1), a.path_status(u32::MAX)),
            (AnaState::Optimized, AnaState::Optimized, None)
        );
    }
}
