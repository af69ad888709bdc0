//! Counters that one reactor writes and any thread reads: the per-reactor I/O counters of
//! a namespace, its latency histograms, a store's operation counts. Below every layer that
//! counts, so that a backend counts without knowing the namespaces.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;

/// Add to a counter that only the calling reactor writes: a relaxed load and store, no
/// locked instruction (readers sum such counters and tolerate a stale value).
#[inline]
pub fn bump(c: &AtomicU64, by: u64) {
    c.store(c.load(Relaxed).wrapping_add(by), Relaxed);
}
