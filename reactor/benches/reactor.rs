//! Reactor benchmark (not a test): wake-up error of microsecond sleeps with timerfd,
//! epoll_pwait2 and nanosleep; cross-reactor message round trip in busy-poll and interrupt
//! mode; idle CPU per mode. Writes JSON to the path in `POLLUX_BENCH_OUT` (default
//! build/bench/reactor.json) and a table on stderr.
#![allow(missing_docs, clippy::print_stdout, clippy::unwrap_used)]

use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pollux_reactor::sys::{self, TimerFd};
use pollux_reactor::{Mode, ReactorConfig, Runtime};

fn pct(v: &mut [u64], p: f64) -> u64 {
    v.sort_unstable();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn wake_error(method: &str, sleep: Duration, n: usize) -> (u64, u64) {
    let mut late = Vec::with_capacity(n);
    let mut ep = mio::Poll::new().unwrap();
    let mut tfd = TimerFd::new().unwrap();
    ep.registry()
        .register(
            &mut mio::unix::SourceFd(&tfd.as_raw_fd()),
            mio::Token(1),
            mio::Interest::READABLE,
        )
        .unwrap();
    let mut events = mio::Events::with_capacity(4);
    for _ in 0..n {
        let t0 = Instant::now();
        match method {
            "timerfd" => {
                tfd.arm(sleep).unwrap();
                loop {
                    ep.poll(&mut events, None).unwrap();
                    if tfd.consume() {
                        break;
                    }
                }
            }
            "epoll_pwait2" => {
                sys::epoll_pwait2(ep.as_raw_fd(), sleep).unwrap();
            }
            _ => sys::nanosleep(sleep),
        }
        late.push(t0.elapsed().saturating_sub(sleep).as_nanos() as u64);
    }
    (pct(&mut late, 0.5), pct(&mut late, 0.99))
}

fn rtt(mode: Mode, n: usize) -> (u64, u64) {
    let cfg = |core| ReactorConfig {
        core,
        mode,
        ..Default::default()
    };
    let allowed = sys::allowed_cores().unwrap();
    let cores = if allowed.len() >= 2 {
        [Some(allowed[0]), Some(allowed[1])]
    } else {
        [None, None]
    };
    let rt = Runtime::start(vec![cfg(cores[0]), cfg(cores[1])], Arc::new(|_| Ok(()))).unwrap();
    // The ping-pong runs between the two reactors only: reactor 0 timestamps each round
    // trip 0 -> 1 -> 0 and starts the next one; the main thread blocks on a channel (a third
    // spinning thread on two cores would measure the scheduler, not the messages).
    let (tx, rx) = std::sync::mpsc::channel::<Vec<u64>>();
    fn ping(r: &mut pollux_reactor::Reactor, mut lat: Vec<u64>, left: usize, tx: std::sync::mpsc::Sender<Vec<u64>>) {
        if left == 0 {
            let _ = tx.send(lat);
            return;
        }
        let t0 = Instant::now();
        r.send(1, move |r| {
            r.send(0, move |r| {
                lat.push(t0.elapsed().as_nanos() as u64);
                ping(r, lat, left - 1, tx);
            });
        });
    }
    rt.remote(0)
        .unwrap()
        .send(move |r| ping(r, Vec::with_capacity(n), n, tx));
    let mut lat = rx.recv_timeout(Duration::from_secs(30)).unwrap_or_default();
    if lat.is_empty() {
        lat.push(0);
    }
    rt.shutdown().unwrap();
    (pct(&mut lat, 0.5), pct(&mut lat, 0.99))
}

fn idle_cpu(mode: Mode) -> f64 {
    let rt = Runtime::start(
        vec![ReactorConfig {
            mode,
            ..Default::default()
        }],
        Arc::new(|_| Ok(())),
    )
    .unwrap();
    let a = rt.stats()[0].clone();
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(2));
    let b = rt.stats()[0].clone();
    let wall = t0.elapsed().as_nanos() as f64;
    rt.shutdown().unwrap();
    (b.cpu_ns - a.cpu_ns) as f64 / wall
}

fn main() {
    sys::set_timer_slack_ns(1).unwrap();
    let out = std::env::var("POLLUX_BENCH_OUT").unwrap_or_else(|_| "build/bench/reactor.json".into());
    let mut wake = Vec::new();
    for method in ["timerfd", "epoll_pwait2", "nanosleep"] {
        for us in [5u64, 20, 80] {
            let (p50, p99) = wake_error(method, Duration::from_micros(us), 2000);
            eprintln!(
                "wake-up error {method:>12} {us:>3} us sleep: p50 {:>6.2} us  p99 {:>6.2} us",
                p50 as f64 / 1e3,
                p99 as f64 / 1e3
            );
            wake.push(serde_json::json!({"method": method, "sleep_us": us, "late_p50_ns": p50, "late_p99_ns": p99}));
        }
    }
    let mut msgs = Vec::new();
    for mode in [Mode::Poll, Mode::Interrupt] {
        let (p50, p99) = rtt(mode, 20_000);
        eprintln!(
            "message round trip (0->1->0) {mode:>9}: p50 {:>6.2} us  p99 {:>6.2} us",
            p50 as f64 / 1e3,
            p99 as f64 / 1e3
        );
        msgs.push(serde_json::json!({"mode": mode.as_str(), "rtt_p50_ns": p50, "rtt_p99_ns": p99}));
    }
    let mut idle = Vec::new();
    for mode in Mode::ALL {
        let cpu = idle_cpu(mode);
        eprintln!("idle CPU {mode:>9}: {:.2}% of a core", cpu * 100.0);
        idle.push(serde_json::json!({"mode": mode.as_str(), "idle_cpu_fraction": cpu}));
    }
    let doc = serde_json::json!({"wakeup_error": wake, "message_rtt": msgs, "idle_cpu": idle});
    if let Some(dir) = std::path::Path::new(&out).parent() {
        std::fs::create_dir_all(dir).unwrap();
    }
    std::fs::write(&out, serde_json::to_string_pretty(&doc).unwrap()).unwrap();
    eprintln!("wrote {out}");
}
