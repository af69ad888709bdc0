//! `pollux perf` against an in-process target: --verify finds no mismatch on RAM and
//! simulated namespaces, the report adds up, data changed behind perf's back is caught (also
//! by a write-only job's read-back), and a verify that checked nothing fails. The command
//! line: DH-HMAC-CHAP one way and both ways, statuses by name, no progress line off a
//! terminal.
#![allow(clippy::unwrap_used)]

mod common;

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::*;
use pollux_host::perf::{self, Access, PerfError, PerfOpts, PerfReport, Workload};
use pollux_host::{Controller, Digests, HostError};
use pollux_nvme::auth::{DhchapKey, HashId};

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

#[test]
fn a_write_only_verify_reads_back_what_it_wrote_and_a_verify_of_nothing_fails() {
    let t = target();
    // randwrite reads nothing while it runs: the blocks it wrote are read back after it.
    let mut o = job(&t, RAM);
    o.workload = Workload::parse("randwrite", 0).unwrap();
    let r = perf::run(&o).unwrap();
    sane(&r);
    assert_eq!(r.reads, 0, "{r:?}");
    assert_eq!(r.verified_blocks, Some(0), "{r:?}");
    let back = r.readback_blocks.unwrap();
    assert!(back > 0, "{r:?}");
    // Each unit written is read back once: never more blocks than the range holds.
    assert!(back <= (1 << 20) / 512, "{back} blocks read back");
    assert!(
        r.text().contains("written blocks read back after the run and checked"),
        "{}",
        r.text()
    );
    // A mixed job reads back what it wrote too.
    let r = perf::run(&job(&t, SIM)).unwrap();
    assert!(
        r.verified_blocks.unwrap() > 0 && r.readback_blocks.unwrap() > 0,
        "{r:?}"
    );
    // Connected and idle: nothing read, nothing written, so nothing checked: an error.
    let mut o = job(&t, RAM);
    o.workload = Workload::parse("idle", 0).unwrap();
    o.duration = Duration::from_millis(100);
    match perf::run(&o) {
        Err(e @ PerfError::NothingVerified { .. }) => assert!(e.to_string().contains("checked nothing"), "{e}"),
        other => panic!("expected a verify that checked nothing to fail, got {other:?}"),
    }
    t.shutdown().unwrap();
}

#[test]
fn data_changed_behind_a_write_only_jobs_back_fails_its_read_back() {
    let t = target();
    let a = addr(&t);
    let mut o = job(&t, RAM);
    o.workload = Workload::parse("randwrite", 0).unwrap();
    o.span = Some(64 << 10); // 128 blocks of 512 bytes, one per I/O
    o.io_size = 512;
    o.queue_depth = 4;
    o.conns_per_core = 1;
    o.duration = Duration::from_millis(300);
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let (wrote, first_write) = std::sync::mpsc::channel();
    // A second host overwrites the range without pause until perf returns: the last of
    // perf's writes to a block is overwritten before its read-back, which is the only
    // check a write-only job has. perf starts once the vandal is connected and writing
    // (on a loaded machine its connect alone could outlast perf's 300 ms).
    let vandal = std::thread::spawn(move || {
        let mut c = Controller::connect(a, RAM, OTHER_HOST, 1, 8, Digests::NONE).unwrap();
        let junk = vec![0x5Au8; 64 << 10];
        while !s.load(Ordering::Relaxed) {
            c.io[0].write(1, 0, 128, &junk).unwrap();
            let _ = wrote.send(());
        }
        c.shutdown().unwrap();
    });
    first_write.recv_timeout(Duration::from_secs(30)).unwrap();
    let r = perf::run(&o);
    stop.store(true, Ordering::Relaxed);
    vandal.join().unwrap();
    match r {
        Err(PerfError::Verify { lba, found, .. }) => {
            assert!(lba < 128, "LBA {lba}");
            assert!(found.contains("foreign"), "{found}");
        }
        other => panic!("expected the read-back to find the foreign data, got {other:?}"),
    }
    t.shutdown().unwrap();
}

const SECURE: &str = "nqn.2026-11.io.pollux:perf-secure";

/// A target whose subsystem admits HOST only with `host` (and `ctrl`) keys.
fn secure_target(host: &DhchapKey, ctrl: &DhchapKey) -> pollux_target::Target {
    start_text(&format!(
        r#"
[reactors]
cores = [0]
mode = "interrupt"

[[listener]]
address = "127.0.0.1:0"

[[subsystem]]
nqn = "{SECURE}"
hosts = [{{ nqn = "{HOST}", dhchap_key = "{}", dhchap_ctrl_key = "{}" }}]

[[subsystem.namespace]]
nsid = 1
block_size = 512
backend = {{ ram = {{ size = "4MiB" }} }}
"#,
        *host.encode(),
        *ctrl.encode()
    ))
}

/// `pollux perf` as a subprocess against `addr`: its exit status, stdout and stderr
/// (stderr a pipe, not a terminal).
fn perf_cli(addr: SocketAddr, host: &str, extra: &[&str]) -> (i32, String, String) {
    let trid = format!(
        "trtype:tcp traddr:{} trsvcid:{} subnqn:{SECURE}",
        addr.ip(),
        addr.port()
    );
    let out = Command::new(env!("CARGO_BIN_EXE_pollux"))
        .args(["perf", "-r", &trid, "--hostnqn", host, "--no-pin", "--no-probe"])
        .args(["-w", "randrw", "-q", "4", "-t", "0.3", "--span", "256KiB", "--verify"])
        .args(extra)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn owner_only(dir: &std::path::Path, name: &str, key: &DhchapKey, mode: u32) -> String {
    let file = dir.join(name);
    std::fs::write(&file, format!("{}\n", *key.encode())).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
    file.to_str().unwrap().to_string()
}

#[test]
fn perf_authenticates_with_dhchap_one_way_and_both_ways_and_never_shows_a_secret() {
    let host = DhchapKey::generate(Some(HashId::Sha256), 32).unwrap();
    let ctrl = DhchapKey::generate(Some(HashId::Sha384), 48).unwrap();
    let t = secure_target(&host, &ctrl);
    let a = addr(&t);
    let (host_text, ctrl_text) = (host.encode(), ctrl.encode());

    // One way, the key on the command line.
    let (rc, out, err) = perf_cli(a, HOST, &["--json", "--dhchap-key", host_text.as_str()]);
    assert_eq!(rc, 0, "{err}");
    let r: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(r["dhchap"], serde_json::Value::Bool(true), "{out}");
    assert!(r["verified_blocks"].as_u64().unwrap() > 0, "{out}");

    // Both ways, from owner-only files (as the conf's dhchap_key_file).
    let dir = std::env::temp_dir().join(format!("pollux-perf-dhchap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let host_file = owner_only(&dir, "host.key", &host, 0o600);
    let ctrl_file = owner_only(&dir, "ctrl.key", &ctrl, 0o600);
    let (rc, out, err) = perf_cli(
        a,
        HOST,
        &["--dhchap-key-file", &host_file, "--dhchap-ctrl-key-file", &ctrl_file],
    );
    assert_eq!(rc, 0, "{err}");
    assert!(out.contains("IOPS"), "{out}");
    // Off a terminal, no progress line: stderr holds nothing but (no) warnings.
    assert!(!err.contains("IOPS") && !err.contains('\r'), "{err:?}");

    // A controller that cannot prove itself (the wrong controller key) is refused by the
    // host, and the error names no secret.
    let wrong = DhchapKey::generate(Some(HashId::Sha384), 48).unwrap();
    let (rc, _, err) = perf_cli(
        a,
        HOST,
        &[
            "--dhchap-key",
            host_text.as_str(),
            "--dhchap-ctrl-key",
            wrong.encode().as_str(),
        ],
    );
    assert_eq!(rc, 1, "{err}");
    assert!(err.contains("authentication"), "{err}");
    // The wrong host key: the controller refuses.
    let (rc, _, err) = perf_cli(a, HOST, &["--dhchap-key", wrong.encode().as_str()]);
    assert_eq!(rc, 1, "{err}");
    assert!(err.contains("authentication"), "{err}");
    // No key at all: said so.
    let (rc, _, err) = perf_cli(a, HOST, &[]);
    assert_eq!(rc, 1, "{err}");
    assert!(err.contains("requires authentication and no key is set"), "{err}");

    // Bad options: a key file others can read, a controller key alone, a mistyped key.
    let loose = owner_only(&dir, "loose.key", &host, 0o644);
    let (rc, _, err) = perf_cli(a, HOST, &["--dhchap-key-file", &loose]);
    assert_eq!(rc, 2, "{err}");
    assert!(err.contains("chmod 600"), "{err}");
    let (rc, _, err) = perf_cli(a, HOST, &["--dhchap-ctrl-key", ctrl_text.as_str()]);
    assert_eq!(rc, 2, "{err}");
    assert!(err.contains("needs --dhchap-key"), "{err}");
    assert!(!err.contains(ctrl_text.as_str()), "{err}");
    let mangled = format!("{}x", &host_text[..host_text.len() - 2]);
    let (rc, _, err) = perf_cli(a, HOST, &["--dhchap-key", &mangled]);
    assert_eq!(rc, 2, "{err}");
    assert!(err.contains("--dhchap-key") && !err.contains(&mangled[7..]), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
    t.shutdown().unwrap();
}

#[test]
fn a_host_the_subsystem_does_not_admit_is_told_connect_invalid_host_by_name() {
    let host = DhchapKey::generate(None, 32).unwrap();
    let ctrl = DhchapKey::generate(None, 32).unwrap();
    let t = secure_target(&host, &ctrl);
    let (rc, _, err) = perf_cli(addr(&t), OTHER_HOST, &[]);
    assert_eq!(rc, 1, "{err}");
    assert!(
        err.contains("connect refused: Connect Invalid Host (sct 0x1, sc 0x84, dnr)"),
        "{err}"
    );
    t.shutdown().unwrap();
}

#[test]
fn the_readmes_quick_check_works_against_the_secure_example() {
    // conf/examples/secure.toml as shipped, its keys made as its comment says (one file per
    // secret, owner-only, next to the conf), on a free loopback port and one core.
    let dir = std::env::temp_dir().join(format!("pollux-perf-secure-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("keys")).unwrap();
    let host = DhchapKey::generate(Some(HashId::Sha256), 32).unwrap();
    let ctrl = DhchapKey::generate(Some(HashId::Sha384), 48).unwrap();
    let psk_bytes: Vec<u8> = (0..32u8).map(|i| i.wrapping_mul(37) ^ 0x5A).collect();
    let psk = pollux_nvme::tls::ConfiguredPsk::new(Some(pollux_nvme::tls::PskHash::Sha256), &psk_bytes).unwrap();
    let keys = dir.join("keys");
    let host_file = owner_only(&keys, "host-a.key", &host, 0o600);
    let ctrl_file = owner_only(&keys, "ctrl-a.key", &ctrl, 0o600);
    let psk_file = keys.join("host-a.psk");
    std::fs::write(&psk_file, format!("{}\n", *psk.encode())).unwrap();
    std::fs::set_permissions(&psk_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../conf/examples/secure.toml"))
        .unwrap()
        .replace("0.0.0.0:4420", "127.0.0.1:0")
        .replace("cores = [0, 1]", "cores = [0]")
        .replace("\"1GiB\"", "\"4MiB\"");
    let conf = dir.join("secure.toml");
    std::fs::write(&conf, text).unwrap();
    let cfg = pollux_conf::Config::from_path(&conf).unwrap();
    let t = pollux_target::Target::start(&cfg, pollux_target::Options { pin: false }).unwrap();
    let a = t.listen_addrs()[0];
    let trid = format!(
        "trtype:tcp traddr:{} trsvcid:{} subnqn:nqn.2026-11.io.pollux:secure",
        a.ip(),
        a.port()
    );
    // The README's command (-t 5 made 0.5).
    let out = Command::new(env!("CARGO_BIN_EXE_pollux"))
        .args(["perf", "-r", &trid])
        .args([
            "--hostnqn",
            "nqn.2014-08.org.nvmexpress:uuid:f81d4fae-7dec-11d0-a765-00a0c91e6bf6",
        ])
        .args(["--tls-key-file", psk_file.to_str().unwrap()])
        .args(["--dhchap-key-file", &host_file, "--dhchap-ctrl-key-file", &ctrl_file])
        .args([
            "-w", "randrw", "-q", "8", "-o", "4096", "-t", "0.5", "--verify", "--json",
        ])
        .args(["--no-pin", "--no-probe"])
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    let r: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(
        (r["tls"].as_bool(), r["dhchap"].as_bool()),
        (Some(true), Some(true)),
        "{stdout}"
    );
    assert!(r["verified_blocks"].as_u64().unwrap() > 0, "{stdout}");
    t.shutdown().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}
