//! A bell and the thread it wakes: rung from any thread (a store's callback, a cluster
//! client's), counted so that a ring between two looks is never missed. The target's
//! watchers (stores resized by someone else, reservations changed by another gateway) are
//! each a [`BellThread`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use tracing::warn;

use crate::error::StoreError;

/// Rings counted, and the watchers waiting for the next.
#[derive(Debug)]
pub struct Bell {
    rung: Mutex<u64>,
    wake: Condvar,
}

impl Bell {
    /// Never rung.
    pub const fn new() -> Self {
        Self {
            rung: Mutex::new(0),
            wake: Condvar::new(),
        }
    }

    /// Wake every thread of this bell.
    pub fn ring(&self) {
        let mut n = self.rung.lock().unwrap_or_else(|p| p.into_inner());
        *n = n.wrapping_add(1);
        self.wake.notify_all();
    }
}

impl Default for Bell {
    fn default() -> Self {
        Self::new()
    }
}

/// A thread that runs its work each time its bell rings (and every tick, if it has one),
/// until dropped.
#[derive(Debug)]
pub struct BellThread {
    name: &'static str,
    bell: &'static Bell,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl BellThread {
    /// Start thread `name`, running `work` at each ring of `bell`, and every `tick` without
    /// one (None: only when rung).
    pub fn spawn(
        name: &'static str,
        bell: &'static Bell,
        tick: Option<Duration>,
        mut work: impl FnMut() + Send + 'static,
    ) -> Result<Self, StoreError> {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        // Counted from here, not from when the thread first runs: a ring once this returns
        // is never missed.
        let mut seen = *bell.rung.lock().unwrap_or_else(|p| p.into_inner());
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                loop {
                    {
                        let mut n = bell.rung.lock().unwrap_or_else(|p| p.into_inner());
                        while *n == seen && !s.load(Ordering::Relaxed) {
                            match tick {
                                None => n = bell.wake.wait(n).unwrap_or_else(|p| p.into_inner()),
                                Some(t) => {
                                    let (g, to) = bell.wake.wait_timeout(n, t).unwrap_or_else(|p| p.into_inner());
                                    n = g;
                                    if to.timed_out() {
                                        break;
                                    }
                                }
                            }
                        }
                        seen = *n;
                    }
                    if s.load(Ordering::Relaxed) {
                        return;
                    }
                    work();
                }
            })
            .map_err(|source| StoreError::Thread {
                name: name.into(),
                source,
            })?;
        Ok(Self {
            name,
            bell,
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for BellThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.bell.ring();
        if let Some(t) = self.thread.take()
            && t.join().is_err()
        {
            warn!(thread = self.name, "a watcher thread panicked");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn a_ring_runs_the_work_and_a_tick_runs_it_unrung() {
        static BELL: Bell = Bell::new();
        let runs = Arc::new(AtomicU64::new(0));
        let r = runs.clone();
        let t = BellThread::spawn("bell-test", &BELL, None, move || {
            r.fetch_add(1, Ordering::Relaxed);
        })
        .unwrap_or_else(|e| panic!("{e}"));
        BELL.ring();
        let t0 = std::time::Instant::now();
        while runs.load(Ordering::Relaxed) == 0 {
            assert!(t0.elapsed() < Duration::from_secs(5), "a ring ran nothing");
            std::thread::sleep(Duration::from_millis(1));
        }
        drop(t);
        static QUIET: Bell = Bell::new();
        let ticks = Arc::new(AtomicU64::new(0));
        let k = ticks.clone();
        let t = BellThread::spawn("bell-tick", &QUIET, Some(Duration::from_millis(5)), move || {
            k.fetch_add(1, Ordering::Relaxed);
        })
        .unwrap_or_else(|e| panic!("{e}"));
        let t0 = std::time::Instant::now();
        while ticks.load(Ordering::Relaxed) < 2 {
            assert!(t0.elapsed() < Duration::from_secs(5), "no tick ran it");
            std::thread::sleep(Duration::from_millis(1));
        }
        drop(t);
    }
}
