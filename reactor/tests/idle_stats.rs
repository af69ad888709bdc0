//! The time accounting of idle reactors. Its own test binary: the first reactor of the
//! process must be one of these, as it is in `pollux` (the accounting's epoch is
//! process-wide and a defect hid in its first use).
#![allow(missing_docs, clippy::unwrap_used)]

use std::time::{Duration, Instant};

mod common;
use common::start;
use pollux_reactor::{Mode, ReactorStats};

fn wall(st: &ReactorStats) -> u64 {
    st.mode_ns.iter().sum()
}

/// Defect: the first reactor's loop start saturated to the epoch taken after it, which the
/// snapshot read as "no iteration pending": an interrupt-mode reactor that had not woken
/// showed 0 ns in every mode (`ctl reactors`: POLL/HYBRID/INTR% all 0.0) and the shutdown
/// summary divided its CPU time by 1 ns (`cpu_pct="29141200.0"`).
#[test]
fn an_idle_reactor_is_booked_its_time_asleep_in_its_mode() {
    let t0 = Instant::now();
    let rt = start(&[Mode::Interrupt, Mode::Interrupt, Mode::Hybrid]);
    std::thread::sleep(Duration::from_millis(400));
    let st = rt.stats();
    let elapsed = t0.elapsed().as_nanos() as u64;
    for r in &st {
        let mode = r.mode.index();
        assert!(
            r.mode_ns[mode] >= 300_000_000,
            "reactor {} ({}) idle for 400 ms is booked {:?} ns per mode",
            r.id,
            r.mode,
            r.mode_ns
        );
        assert!(
            wall(r) <= elapsed,
            "reactor {}: {} ns booked in {elapsed} ns",
            r.id,
            wall(r)
        );
        assert_eq!(
            r.busy_ns + r.idle_ns,
            wall(r),
            "reactor {}: busy + idle is its wall time",
            r.id
        );
        assert!(
            r.idle_ns >= 300_000_000,
            "reactor {}: idle {} ns of 400 ms",
            r.id,
            r.idle_ns
        );
        // What the shutdown summary and `ctl reactors` compute: a share of a core.
        let cpu_pct = 100.0 * r.cpu_ns as f64 / wall(r) as f64;
        assert!(cpu_pct < 5.0, "reactor {}: idle at {cpu_pct:.1} % CPU", r.id);
    }
    // Still asleep, still counting.
    std::thread::sleep(Duration::from_millis(100));
    let later = rt.stats();
    for (a, b) in st.iter().zip(&later) {
        assert!(
            wall(b) >= wall(a) + 80_000_000,
            "reactor {}: {} then {}",
            a.id,
            wall(a),
            wall(b)
        );
    }
    rt.shutdown().unwrap();
}
