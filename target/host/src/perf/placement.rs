//! Where the host put the client's and the target's (virtual) CPUs relative to each other,
//! measured as the round trip of one cache line between two pinned threads.
//!
//! Why: on this kind of VM the host moves the two vCPUs every few seconds between places
//! that share a cache (a cache line crosses in ~35 ns, a round trip ~70-120 ns) and places
//! that do not (~430-510 ns round trips, as across the chiplets of an EPYC). Every
//! loopback round trip moves many cache lines between the two cores (socket locks, skbs,
//! the data), so a QD1 round trip is ~12-14 us in the first case and ~19-22 us in the
//! second, for the same binary seconds apart; that, not the binary, decides most of the
//! run-to-run spread. Probing right before and after a run says which case it ran in.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::PerfError;

/// Round trips per batch; the probe reports the median batch.
const ROUND_TRIPS: u64 = 2_000;
const BATCHES: usize = 5;
/// A probe that has not finished by then (a core that is not ours to run on, say) gives up.
const GIVE_UP: Duration = Duration::from_secs(1);

/// The cache-line round trip between the client's core and the target's, before and after
/// a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Placement {
    /// The client's (first) core.
    pub client_core: usize,
    /// The target's (first reactor's, or the floor server's) core.
    pub target_core: usize,
    /// Median round trip of one cache line between them right before the run, ns.
    pub before_ns: u64,
    /// The same right after the run, ns.
    pub after_ns: u64,
}

/// Why a probe thread stopped.
#[derive(Debug, thiserror::Error)]
enum ProbeError {
    /// It could not be pinned to its core.
    #[error("pin to core {core}: {source}")]
    Pin {
        /// The core.
        core: usize,
        /// The OS's reason.
        source: std::io::Error,
    },
    /// The other thread did not answer within [`GIVE_UP`].
    #[error("no answer")]
    NoAnswer,
}

/// One cache line, alone in it.
#[repr(align(128))]
struct Line(AtomicU64);

impl Line {
    /// Spins until the line holds `v`; gives up [`GIVE_UP`] after `t0`.
    fn wait_for(&self, v: u64, t0: Instant) -> Result<(), ProbeError> {
        let mut spins = 0u32;
        while self.0.load(Ordering::Acquire) != v {
            std::hint::spin_loop();
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(4096) && t0.elapsed() > GIVE_UP {
                return Err(ProbeError::NoAnswer);
            }
        }
        Ok(())
    }
}

/// The median over [`BATCHES`] of the time per round trip of a counter that the thread on
/// core `a` makes odd and the thread on core `b` makes even, ns.
pub fn probe(a: usize, b: usize) -> Result<u64, PerfError> {
    let line = Arc::new(Line(AtomicU64::new(0)));
    let total = ROUND_TRIPS * BATCHES as u64;
    let failed =
        |what: &dyn std::fmt::Display| PerfError::Thread(format!("placement probe, cores {a} and {b}: {what}"));
    let pong = {
        let line = line.clone();
        std::thread::Builder::new()
            .name("perf-probe".into())
            .spawn(move || -> Result<(), ProbeError> {
                pollux_reactor::sys::pin_current_thread(b).map_err(|source| ProbeError::Pin { core: b, source })?;
                let t0 = Instant::now();
                for i in 0..total {
                    line.wait_for(2 * i + 1, t0)?;
                    line.0.store(2 * i + 2, Ordering::Release);
                }
                Ok(())
            })
            .map_err(|e| failed(&e))?
    };
    let ping = std::thread::Builder::new()
        .name("perf-probe".into())
        .spawn(move || -> Result<Vec<u64>, ProbeError> {
            pollux_reactor::sys::pin_current_thread(a).map_err(|source| ProbeError::Pin { core: a, source })?;
            let t0 = Instant::now();
            let mut batches = Vec::with_capacity(BATCHES);
            for batch in 0..BATCHES as u64 {
                let tb = Instant::now();
                for i in batch * ROUND_TRIPS..(batch + 1) * ROUND_TRIPS {
                    line.0.store(2 * i + 1, Ordering::Release);
                    line.wait_for(2 * i + 2, t0)?;
                }
                batches.push(tb.elapsed().as_nanos() as u64 / ROUND_TRIPS);
            }
            Ok(batches)
        })
        .map_err(|e| failed(&e))?;
    let batches = ping.join().map_err(|_| failed(&"panicked"))?;
    // The answering side's error first: when it could not start, the asking side only saw
    // no answer.
    pong.join().map_err(|_| failed(&"panicked"))?.map_err(|e| failed(&e))?;
    let mut batches = batches.map_err(|e| failed(&e))?;
    batches.sort_unstable();
    Ok(batches[BATCHES / 2])
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_cache_line_goes_back_and_forth_between_two_cores() {
        // On one core the two threads would take turns in time slices and the probe give up.
        if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
            return;
        }
        let ns = probe(0, 1).unwrap();
        assert!(ns > 0 && ns < 1_000_000, "round trip {ns} ns between cores 0 and 1");
    }

    #[test]
    fn a_core_that_does_not_exist_is_an_error_not_a_hang() {
        let e = probe(0, 4095).unwrap_err();
        assert!(e.to_string().contains("4095"), "{e}");
    }
}
