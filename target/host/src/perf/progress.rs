//! `pollux perf`'s live progress on a terminal: what the run is doing, elapsed and remaining
//! time and the current IOPS, redrawn a few times a second on stderr by a thread of its own
//! that only reads the counters the client threads publish (so the I/O path never waits
//! for it). The command line turns it on only when stderr is a terminal and the report is
//! not `--json`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::{Scope, ScopedJoinHandle};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::PerfOpts;
use super::worker::{self, Shared};

/// How often the line is redrawn.
const TICK: Duration = Duration::from_millis(250);
/// Bar positions: per mille of the measured part.
const SCALE: u64 = 1000;

/// The drawing thread; [`Progress::finish`] clears the line and joins it.
pub(super) struct Progress<'scope> {
    stop: Arc<AtomicBool>,
    handle: Option<ScopedJoinHandle<'scope, ()>>,
}

impl<'scope> Progress<'scope> {
    /// Starts drawing for the run of `opts` whose threads share `shared`.
    pub(super) fn start<'env>(s: &'scope Scope<'scope, 'env>, opts: &'env PerfOpts, shared: &Arc<Shared>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (st, sh) = (stop.clone(), shared.clone());
        // Not named perf-*: the report's per-thread CPU is the client's and the reactors'.
        let handle = std::thread::Builder::new()
            .name("progress".into())
            .spawn_scoped(s, move || draw(opts, &sh, &st))
            .map_err(|e| tracing::debug!("no progress line: {e}"))
            .ok();
        Self { stop, handle }
    }

    /// Clears the line (the report follows) and waits for the thread.
    pub(super) fn finish(self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.handle {
            let _ = h.join();
        }
    }
}

/// What the run is doing, as the progress thread sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Stage {
    /// Connecting, or writing the range once (--fill).
    Preparing,
    /// Load that is not measured.
    Warmup,
    /// Measuring: since when (s), and the I/Os completed since it began.
    Measuring { elapsed: f64, ios: u64 },
}

/// The bar position (per mille of the measured part) and the text after the bar.
pub(super) fn line(opts: &PerfOpts, stage: Stage, iops: f64) -> (u64, String) {
    let rate = format!("{} IOPS", thousands(iops.round() as u64));
    match stage {
        Stage::Preparing if opts.fill => (0, "connected, filling the range (--fill)".into()),
        Stage::Preparing => (0, "connecting".into()),
        Stage::Warmup => (0, format!("warmup ({:.1} s), {rate}", opts.warmup.as_secs_f64())),
        Stage::Measuring { ios, .. } if opts.ios.is_some() => {
            let total = opts.ios.unwrap_or(1).max(1);
            (
                (ios.min(total) * SCALE) / total,
                format!("{} of {} I/Os, {rate}", thousands(ios), thousands(total)),
            )
        }
        Stage::Measuring { elapsed, .. } => {
            let total = opts.duration.as_secs_f64();
            let done = elapsed.min(total);
            let pos = if total > 0.0 {
                (done / total * SCALE as f64) as u64
            } else {
                SCALE
            };
            (
                pos,
                format!("{done:.1} of {total:.1} s, {:.1} s left, {rate}", total - done),
            )
        }
    }
}

/// 1234567 as "1,234,567".
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn draw(opts: &PerfOpts, shared: &Shared, stop: &AtomicBool) {
    let bar = ProgressBar::with_draw_target(Some(SCALE), ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template("{bar:30} {msg}") {
        bar.set_style(style);
    }
    let threads = shared.completed.len();
    let completed = || {
        shared
            .completed
            .iter()
            .map(|c| c.0.load(Ordering::Relaxed))
            .sum::<u64>()
    };
    let mut prev = (Instant::now(), completed());
    let mut measuring_since: Option<(Instant, u64)> = None;
    while !stop.load(Ordering::Acquire) {
        std::thread::sleep(TICK);
        let (now, done) = (Instant::now(), completed());
        let dt = now.duration_since(prev.0).as_secs_f64();
        let iops = if dt > 0.0 {
            done.saturating_sub(prev.1) as f64 / dt
        } else {
            0.0
        };
        prev = (now, done);
        let stage = if shared.ready.load(Ordering::Acquire) < threads {
            Stage::Preparing
        } else if shared.phase.load(Ordering::Acquire) == worker::WARMUP {
            Stage::Warmup
        } else {
            let (t0, n0) = *measuring_since.get_or_insert((now, done));
            Stage::Measuring {
                elapsed: now.duration_since(t0).as_secs_f64(),
                ios: done.saturating_sub(n0),
            }
        };
        let (pos, msg) = line(opts, stage, iops);
        bar.set_position(pos);
        bar.set_message(msg);
    }
    bar.finish_and_clear();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> PerfOpts {
        PerfOpts::new(std::net::SocketAddr::from(([127, 0, 0, 1], 4420)), "nqn.x")
    }

    #[test]
    fn the_line_says_what_the_run_does_how_long_is_left_and_the_iops() {
        let mut o = opts();
        o.duration = Duration::from_secs(10);
        assert_eq!(line(&o, Stage::Preparing, 0.0).1, "connecting");
        o.fill = true;
        assert!(line(&o, Stage::Preparing, 0.0).1.contains("filling"));
        let (pos, msg) = line(
            &o,
            Stage::Measuring {
                elapsed: 2.5,
                ios: 139_020,
            },
            55_608.4,
        );
        assert_eq!(pos, 250);
        assert_eq!(msg, "2.5 of 10.0 s, 7.5 s left, 55,608 IOPS");
        // Past the end (the threads drain): full, nothing left.
        let (pos, msg) = line(&o, Stage::Measuring { elapsed: 11.0, ios: 1 }, 0.0);
        assert_eq!((pos, msg.as_str()), (1000, "10.0 of 10.0 s, 0.0 s left, 0 IOPS"));
        o.ios = Some(2000);
        let (pos, msg) = line(&o, Stage::Measuring { elapsed: 1.0, ios: 500 }, 1234.0);
        assert_eq!((pos, msg.as_str()), (250, "500 of 2,000 I/Os, 1,234 IOPS"));
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_000_000), "1,000,000");
    }
}
