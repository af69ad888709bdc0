//! `pollux perf` against an in-process target: --verify finds no mismatch on RAM and
//! simulated namespaces, the report adds up, and data changed behind perf's back is caught.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::*;
use pollux_target::host::{Controller, Digests, HostError};
use pollux_target::perf::{self, Access, PerfError, PerfOpts, PerfReport, Workload};

const RAM: &str = "nqn.2026-11.io.pollux:perf-ram";
const SIM: &str = "nqn.2026-11.io.pollux:perf-sim";

fn target() -> pollux_target::Target {
    start_text(&format!(
        r#"
[reactors]
cores = [0]
mode = "poll"

[[listener]]
address = "127.0.0.1:0"

[[subsystem]]
nqn = "{RAM}"
allow_any_host = true

[[subsystem.namespace]]
nsid = 1
block_size = 512
backend = {{ ram = {{ size = "8MiB" }} }}

[[subsystem]]
nqn = "{SIM}"
allow_any_host = true

[[subsystem.namespace]]
nsid = 1
block_size = 4096
backend = {{ sim = {{ size = "8MiB", read = {{ median_us = 10.0, sigma = 0.2 }}, write = {{ fixed_us = 5.0 }} }} }}
"#
    ))
}

fn sane(r: &PerfReport) {
    assert!(r.ios > 0, "{r:?}");
    assert_eq!(r.latency_ns.count, r.ios, "every counted I/O has one latency sample");
    assert_eq!(r.reads + r.writes, r.ios);
    let l = &r.latency_ns;
    assert!(
        l.min <= l.p50 && l.p50 <= l.p90 && l.p90 <= l.p99 && l.p99 <= l.p999 && l.p999 <= l.max,
        "{l:?}"
    );
    assert!(l.avg >= l.min as f64 && l.avg <= l.max as f64);
    assert!((r.iops - r.ios as f64 / r.seconds).abs() < 1.0);
    assert!(r.client_cpu > 0.0);
}

fn job(t: &pollux_target::Target, nqn: &str) -> PerfOpts {
    let mut o = PerfOpts::new(addr(t), nqn);
    o.workload = Workload::parse("randrw", 50).unwrap();
    o.queue_depth = 8;
    o.cores = vec![None];
    o.conns_per_core = 2;
    o.duration = Duration::from_millis(400);
    o.warmup = Duration::from_millis(50);
    o.verify = true;
    // A small range, so blocks are read back after being written.
    o.span = Some(1 << 20);
    o
}

#[test]
fn verify_runs_clean_on_ram_and_sim_namespaces_and_the_report_adds_up() {
    let t = target();
    for (nqn, fill) in [(RAM, false), (SIM, false), (RAM, true)] {
        let mut o = job(&t, nqn);
        // --fill writes generation 1 everywhere first: every read is then checked strictly.
        o.fill = fill;
        let r = perf::run_with_stats(&o, &|| t.reactor_stats()).unwrap();
        sane(&r);
        assert!(r.reads > 0 && r.writes > 0, "{r:?}");
        assert!(r.verified_blocks.unwrap() > 0);
        let tr = r.target.as_ref().unwrap();
        assert!(tr.cpu > 0.0 && tr.cpu_ns_per_io > 0.0, "{tr:?}");
    }
    // Sequential 8 KiB writes then reads with digests, count-based: exactly N I/Os.
    for w in ["write", "read"] {
        let mut o = job(&t, RAM);
        o.workload = Workload::parse(w, 0).unwrap();
        o.io_size = 8192;
        o.digests = Digests::BOTH;
        o.ios = Some(1000);
        let r = perf::run(&o).unwrap();
        sane(&r);
        assert_eq!(r.ios, 1000);
        assert_eq!(o.workload.access, Access::Sequential);
    }
    // At queue depth 1 every read is alone in flight: received in place, and verified.
    let mut o = job(&t, RAM);
    o.queue_depth = 1;
    o.conns_per_core = 1;
    o.io_size = 4096;
    let r = perf::run(&o).unwrap();
    sane(&r);
    assert!(r.reads > 0 && r.verified_blocks.unwrap() > 0, "{r:?}");
    // (A reply split across two reads would take the usual path: not seen on loopback.)
    assert!(
        r.in_place_reads * 10 >= r.reads * 9,
        "{} of {} reads in place",
        r.in_place_reads,
        r.reads
    );
    t.shutdown().unwrap();
}

#[test]
fn a_block_changed_behind_perfs_back_is_a_verify_mismatch() {
    let t = target();
    let a = addr(&t);
    let mut o = job(&t, RAM);
    o.duration = Duration::from_secs(4);
    o.span = Some(64 << 10); // 128 blocks of 512 bytes
    o.queue_depth = 4;
    o.conns_per_core = 1;
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    // A second host overwrites the range with foreign data until perf notices.
    let vandal = std::thread::spawn(move || {
        let mut c = Controller::connect(a, RAM, OTHER_HOST, 1, 8, Digests::NONE).unwrap();
        let junk = vec![0x5Au8; 64 << 10];
        std::thread::sleep(Duration::from_millis(100));
        while !s.load(Ordering::Relaxed) {
            c.io[0].write(1, 0, 128, &junk).unwrap();
            std::thread::sleep(Duration::from_millis(5));
        }
    });
    let t0 = Instant::now();
    let r = perf::run(&o);
    stop.store(true, Ordering::Relaxed);
    vandal.join().unwrap();
    match r {
        Err(PerfError::Verify { lba, found, .. }) => {
            assert!(lba < 128, "LBA {lba}");
            assert!(found.contains("foreign"), "{found}");
        }
        other => panic!("expected a verify mismatch, got {other:?}"),
    }
    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "found only after {:?}",
        t0.elapsed()
    );
    t.shutdown().unwrap();
}

#[test]
fn a_refused_connect_and_a_vanished_target_are_clear_errors() {
    let t = target();
    let o = PerfOpts::new(addr(&t), "nqn.2026-11.io.pollux:no-such-subsystem");
    match perf::run(&o) {
        Err(PerfError::Connect {
            source: HostError::ConnectRefused { status, .. },
            ..
        }) => assert!(!status.is_success()),
        other => panic!("expected a refused Connect, got {other:?}"),
    }
    let mut o = job(&t, RAM);
    o.duration = Duration::from_secs(10);
    o.timeout = Duration::from_secs(2);
    let h = std::thread::spawn(move || perf::run(&o));
    std::thread::sleep(Duration::from_millis(300));
    let t0 = Instant::now();
    t.shutdown().unwrap();
    match h.join().unwrap() {
        Err(e @ (PerfError::Queue { .. } | PerfError::Stalled { .. })) => {
            assert!(!e.to_string().is_empty());
        }
        other => panic!("expected a queue error, got {other:?}"),
    }
    assert!(t0.elapsed() < Duration::from_secs(4));
}
