//! `ci/bench scale` (issue 38): a target with many namespaces in many subsystems (by default
//! 16,384 RAM namespaces, 128 in each of 128 subsystems), run as its own `pollux` process.
//! Not a test: it measures.
//!
//! Per run (a fresh target each, BENCH_SCALE_REPS runs):
//! - `pollux --check CONF`: its wall time;
//! - the start: the time from spawning `pollux -c CONF` until it accepts on its listener,
//!   until it logs `pollux running`, and until a host has seen every namespace active (one
//!   controller per subsystem, connected in turn, whose Active Namespace ID list (CNS 02h)
//!   holds every NSID the conf gave it); and until every RAM disk is committed (the fillers'
//!   `RAM disks populated` lines add up to every namespace);
//! - discovery: the discovery log (one record per subsystem and listener) read whole
//!   BENCH_SCALE_QUERIES times on one discovery controller (Get Log Page of the header, then
//!   of the whole log, as `nvme discover` does), and `nvme discover`'s whole exchange
//!   (connect, enable, read, shut down) 10 times;
//! - Identify on the last subsystem: the Active Namespace ID list, Identify Namespace of
//!   NSIDs taken in turn, Identify Controller, BENCH_SCALE_QUERIES times each;
//! - one 4K read of every namespace through one I/O queue per subsystem (the per-I/O
//!   namespace lookup at scale; its median round trip);
//! - the target's RSS (VmRSS, VmHWM) once every disk is committed, and what it holds beyond
//!   the namespaces' data, per namespace;
//! - the time SIGTERM takes to end it.
//!
//! Writes scale.json and scale.md in POLLUX_BENCH_OUT_DIR (default the workspace's
//! build/bench) and a line per step on stderr (`scale: ...`).
//!
//! env: POLLUX_BIN (the workspace's build/release/pollux), BENCH_SCALE_SUBSYSTEMS (128),
//! BENCH_SCALE_NAMESPACES (per subsystem, 128), BENCH_SCALE_SIZE (each namespace's size,
//! 64KiB: RAM namespaces are committed whole at start, so 16,384 of 64 KiB take 1 GiB),
//! BENCH_SCALE_REPS (3), BENCH_SCALE_QUERIES (200), BENCH_TARGET_CORE (1), BENCH_QUICK=1
//! (1 run, 20 queries).
#![allow(missing_docs, clippy::print_stdout, clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use pollux_host::{Controller, ControllerOpts, Digests};

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:0c0c0c0c-0000-4000-8000-0000000005ca";
const DISCOVERY: &str = "nqn.2014-08.org.nvmexpress.discovery";

fn env_or<T: std::str::FromStr>(key: &str, default: T) -> T {
    std::env::var(key).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn nqn(s: usize) -> String {
    format!("nqn.2026-11.io.pollux:scale-{s:04}")
}

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

struct Setup {
    subsystems: usize,
    per: usize,
    size: String,
    core: usize,
}

impl Setup {
    fn total(&self) -> usize {
        self.subsystems * self.per
    }

    fn conf(&self, port: u16) -> String {
        let mut c = format!(
            "# ci/bench scale: {} subsystems of {} RAM namespaces of {}\n[reactors]\ncores = [{}]\nmode = \"interrupt\"\n\n[[listener]]\naddress = \"127.0.0.1:{port}\"\n",
            self.subsystems, self.per, self.size, self.core
        );
        for s in 0..self.subsystems {
            c += &format!("\n[[subsystem]]\nnqn = \"{}\"\nallow_any_host = true\n", nqn(s));
            for n in 1..=self.per {
                c += &format!(
                    "\n[[subsystem.namespace]]\nnsid = {n}\nbackend = {{ ram = {{ size = \"{}\" }} }}\n",
                    self.size
                );
            }
        }
        c
    }
}

/// Median, 99th percentile and worst of `v` (sorted here), in microseconds.
fn stats_us(v: &mut [Duration]) -> serde_json::Value {
    v.sort_unstable();
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1e6;
    serde_json::json!({ "n": v.len(), "p50_us": at(0.5), "p99_us": at(0.99), "max_us": at(1.0) })
}

fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let t0 = Instant::now();
    let r = f();
    (r, t0.elapsed())
}

fn rss_kib(pid: u32) -> (u64, u64) {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |k: &str| {
        s.lines()
            .find(|l| l.starts_with(k))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// What the target's log said, with when (since spawn).
enum Logged {
    Running(Duration),
    Populated(Duration, u64),
}

/// Take what the target logged, waiting up to `wait` for the first line: `running` when it
/// said `pollux running`, `populated` the time of the last fill line and the disks so far.
fn drain(
    log: &mpsc::Receiver<Logged>,
    running: &mut Option<Duration>,
    populated: &mut (Duration, u64),
    wait: Duration,
) {
    let mut next = log.recv_timeout(wait).ok();
    while let Some(m) = next {
        match m {
            Logged::Running(at) => *running = Some(at),
            Logged::Populated(at, n) => *populated = (at, populated.1 + n),
        }
        next = log.try_recv().ok();
    }
}

/// The target process, killed if the bench fails before it stops it.
struct Target(Child);

impl Drop for Target {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Spawn the target; its log lines of interest come on the channel.
fn spawn(bin: &str, conf: &str) -> (Target, mpsc::Receiver<Logged>, Instant) {
    let t0 = Instant::now();
    let mut child = Command::new(bin)
        .args(["-c", conf])
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {bin}: {e}"));
    let (tx, rx) = mpsc::channel();
    for out in [
        Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
        Box::new(child.stderr.take().unwrap()),
    ] {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let at = t0.elapsed();
                if line.contains("pollux running") {
                    let _ = tx.send(Logged::Running(at));
                } else if line.contains("RAM disks populated") || line.contains("RAM disk populated") {
                    // A filler's line counts its disks; an older pollux logged each disk.
                    let disks = line
                        .split_whitespace()
                        .find_map(|w| w.strip_prefix("disks="))
                        .and_then(|d| d.parse().ok())
                        .unwrap_or(1);
                    let _ = tx.send(Logged::Populated(at, disks));
                } else if line.contains("ERROR") || line.contains("WARN") {
                    eprintln!("scale: target: {line}");
                }
            }
        });
    }
    (Target(child), rx, t0)
}

fn connect(addr: SocketAddr, subnqn: &str, io: u16) -> Controller {
    let mut o = ControllerOpts::new(subnqn, HOST, io, 32);
    o.digests = Digests::NONE;
    Controller::connect_with(addr, &o).unwrap_or_else(|e| panic!("connect to {subnqn}: {e}"))
}

fn run(bin: &str, setup: &Setup, dir: &str, queries: usize, rep: usize) -> serde_json::Value {
    let port = free_port();
    let conf = format!("{dir}/conf/scale.toml");
    std::fs::write(&conf, setup.conf(port)).unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();

    let (check, check_t) = timed(|| Command::new(bin).args(["--check", &conf]).output().unwrap());
    assert!(
        check.status.success(),
        "--check: {}",
        String::from_utf8_lossy(&check.stderr)
    );
    eprintln!("scale: rep {rep}: --check {:.3} s", check_t.as_secs_f64());

    // Its listener is bound (and the kernel completes connections) before its namespaces
    // are built: `pollux running` says when it serves.
    let (mut target, log, t0) = spawn(bin, &conf);
    let child = &mut target.0;
    let (mut running, mut populated) = (None, (Duration::ZERO, 0u64));
    while running.is_none() {
        drain(&log, &mut running, &mut populated, Duration::from_millis(100));
        assert!(child.try_wait().unwrap().is_none(), "the target exited");
        assert!(t0.elapsed() < Duration::from_secs(120), "no `pollux running` line");
    }
    // Every namespace active, as a host sees it: each subsystem's active list complete.
    let mut admins = Vec::with_capacity(setup.subsystems);
    for s in 0..setup.subsystems {
        let mut c = connect(addr, &nqn(s), 1);
        let mut ids = Vec::new();
        let mut after = 0;
        loop {
            let page = c.admin.active_namespaces(after).unwrap();
            let Some(&last) = page.last() else { break };
            ids.extend_from_slice(&page);
            after = last;
        }
        assert_eq!(
            ids,
            (1..=setup.per as u32).collect::<Vec<_>>(),
            "subsystem {s}'s active list"
        );
        admins.push(c);
    }
    let active = t0.elapsed();
    let filled = loop {
        drain(&log, &mut running, &mut populated, Duration::from_secs(1));
        if populated.1 >= setup.total() as u64 {
            break Some(populated.0);
        }
        if t0.elapsed() > Duration::from_secs(120) {
            eprintln!(
                "scale: rep {rep}: {} of {} RAM disks filled after 120 s",
                populated.1,
                setup.total()
            );
            break None;
        }
    };
    let (rss, hwm) = rss_kib(child.id());
    let running = running.unwrap_or_default();
    eprintln!(
        "scale: rep {rep}: running {:.3} s, every namespace active to a host {:.3} s, filled {:.3} s; RSS {} MiB",
        running.as_secs_f64(),
        active.as_secs_f64(),
        filled.map_or(f64::NAN, |f| f.as_secs_f64()),
        rss / 1024
    );

    // Discovery.
    let mut d = connect(addr, DISCOVERY, 0);
    let mut disc = Vec::with_capacity(queries);
    for _ in 0..queries {
        let (log, t) = timed(|| d.admin.discovery_log().unwrap());
        assert_eq!(log.entries.len(), setup.subsystems, "one record per subsystem");
        disc.push(t);
    }
    d.shutdown().unwrap();
    let mut disc_whole = Vec::new();
    for _ in 0..10 {
        let (_, t) = timed(|| {
            let mut d = connect(addr, DISCOVERY, 0);
            let log = d.admin.discovery_log().unwrap();
            d.shutdown().unwrap();
            log
        });
        disc_whole.push(t);
    }

    // Identify on the last subsystem.
    let c = admins.last_mut().unwrap();
    let (mut list, mut idns, mut idctrl) = (Vec::new(), Vec::new(), Vec::new());
    for q in 0..queries {
        let (ids, t) = timed(|| c.admin.active_namespaces(0).unwrap());
        assert_eq!(ids.len(), setup.per.min(1024));
        list.push(t);
        let nsid = (q % setup.per) as u32 + 1;
        let (ns, t) = timed(|| c.admin.identify_namespace(nsid).unwrap());
        assert!(ns.nsze > 0, "namespace {nsid} active");
        idns.push(t);
        let (_, t) = timed(|| c.admin.identify_controller().unwrap());
        idctrl.push(t);
    }

    // One read of every namespace.
    let mut reads = Vec::with_capacity(setup.total());
    let mut buf = vec![0u8; 4096];
    let t_reads = Instant::now();
    for c in &mut admins {
        for nsid in 1..=setup.per as u32 {
            let (r, t) = timed(|| c.io[0].read(nsid, 0, 8, &mut buf));
            r.unwrap_or_else(|e| panic!("read of namespace {nsid}: {e}"));
            reads.push(t);
        }
    }
    let reads_s = t_reads.elapsed();
    for c in admins {
        c.shutdown().unwrap();
    }

    // Stop.
    // SAFETY: kill(2) of the child this process started and has not waited for.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let (status, stop) = timed(|| child.wait().unwrap());
    assert!(status.success(), "the target ended with {status}");

    let data_kib = setup.total() as u64 * parse_size(&setup.size) / 1024;
    let out = serde_json::json!({
        "rep": rep,
        "check_s": check_t.as_secs_f64(),
        "running_s": running.as_secs_f64(),
        "all_active_s": active.as_secs_f64(),
        "filled_s": filled.map(|f| f.as_secs_f64()),
        "rss_kib": rss,
        "hwm_kib": hwm,
        "data_kib": data_kib,
        "overhead_per_ns_kib": (rss.saturating_sub(data_kib)) as f64 / setup.total() as f64,
        "discovery_log": stats_us(&mut disc),
        "discover_whole": stats_us(&mut disc_whole),
        "active_ns_list": stats_us(&mut list),
        "identify_ns": stats_us(&mut idns),
        "identify_ctrl": stats_us(&mut idctrl),
        "read_every_ns": stats_us(&mut reads),
        "read_every_ns_s": reads_s.as_secs_f64(),
        "stop_s": stop.as_secs_f64(),
    });
    eprintln!(
        "scale: rep {rep}: discovery log p50 {:.0} us, CNS 02h p50 {:.0} us, Identify Namespace p50 {:.0} us, a read of each namespace p50 {:.0} us, stop {:.3} s",
        out["discovery_log"]["p50_us"].as_f64().unwrap_or(0.0),
        out["active_ns_list"]["p50_us"].as_f64().unwrap_or(0.0),
        out["identify_ns"]["p50_us"].as_f64().unwrap_or(0.0),
        out["read_every_ns"]["p50_us"].as_f64().unwrap_or(0.0),
        stop.as_secs_f64()
    );
    out
}

/// "64KiB", "1MiB", "4096": bytes.
fn parse_size(s: &str) -> u64 {
    let (n, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = n.parse().unwrap_or(0);
    n * match unit {
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        _ => 1,
    }
}

/// Now as an ISO 8601 UTC time, as the other benchmarks write `written` (days to a civil
/// date: H. Hinnant's algorithm).
fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn median(runs: &[serde_json::Value], key: &str, sub: Option<&str>) -> f64 {
    let mut v: Vec<f64> = runs
        .iter()
        .filter_map(|r| match sub {
            Some(s) => r[key][s].as_f64(),
            None => r[key].as_f64(),
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is taken from the command line.
    let quick = std::env::var("BENCH_QUICK").is_ok_and(|v| v == "1");
    // `cargo bench` runs this in the package's directory: the defaults are the workspace's.
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let bin = std::env::var("POLLUX_BIN").unwrap_or_else(|_| format!("{root}/build/release/pollux"));
    let dir = std::env::var("POLLUX_BENCH_OUT_DIR").unwrap_or_else(|_| format!("{root}/build/bench"));
    let setup = Setup {
        subsystems: env_or("BENCH_SCALE_SUBSYSTEMS", 128),
        per: env_or("BENCH_SCALE_NAMESPACES", 128),
        size: env_or("BENCH_SCALE_SIZE", "64KiB".to_string()),
        core: env_or("BENCH_TARGET_CORE", 1),
    };
    let reps = env_or("BENCH_SCALE_REPS", if quick { 1 } else { 3 });
    let queries = env_or("BENCH_SCALE_QUERIES", if quick { 20 } else { 200 });
    std::fs::create_dir_all(format!("{dir}/conf")).unwrap();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    eprintln!(
        "scale: {} subsystems x {} RAM namespaces of {} ({} namespaces), {reps} runs, {queries} queries each, {bin}",
        setup.subsystems,
        setup.per,
        setup.size,
        setup.total()
    );
    let runs: Vec<_> = (0..reps).map(|r| run(&bin, &setup, &dir, queries, r)).collect();
    let m = |k: &str| median(&runs, k, None);
    let ms = |k: &str, s: &str| median(&runs, k, Some(s));
    let summary = serde_json::json!({
        "bench": "scale",
        "written": utc_now(),
        "binary": bin,
        "subsystems": setup.subsystems,
        "namespaces_per_subsystem": setup.per,
        "namespaces": setup.total(),
        "namespace_size": setup.size,
        "reps": reps,
        "queries": queries,
        "load_before": load.split_whitespace().take(3).collect::<Vec<_>>().join(" "),
        "median": {
            "check_s": m("check_s"),
            "running_s": m("running_s"),
            "all_active_s": m("all_active_s"),
            "filled_s": m("filled_s"),
            "rss_mib": m("rss_kib") / 1024.0,
            "hwm_mib": m("hwm_kib") / 1024.0,
            "overhead_per_ns_kib": m("overhead_per_ns_kib"),
            "discovery_log_p50_us": ms("discovery_log", "p50_us"),
            "discovery_log_p99_us": ms("discovery_log", "p99_us"),
            "discover_whole_p50_us": ms("discover_whole", "p50_us"),
            "active_ns_list_p50_us": ms("active_ns_list", "p50_us"),
            "active_ns_list_p99_us": ms("active_ns_list", "p99_us"),
            "identify_ns_p50_us": ms("identify_ns", "p50_us"),
            "identify_ns_p99_us": ms("identify_ns", "p99_us"),
            "identify_ctrl_p50_us": ms("identify_ctrl", "p50_us"),
            "read_every_ns_p50_us": ms("read_every_ns", "p50_us"),
            "stop_s": m("stop_s"),
        },
        "goal": {
            "check_and_start_within_10s": m("check_s") + m("all_active_s") <= 10.0,
        },
        "runs": runs,
    });
    std::fs::write(
        format!("{dir}/scale.json"),
        serde_json::to_string_pretty(&summary).unwrap(),
    )
    .unwrap();
    let md = summary["median"].clone();
    let f = |k: &str| md[k].as_f64().unwrap_or(0.0);
    let mut t = format!(
        "# scale (issue 38): {} namespaces in {} subsystems\n\n{} RAM namespaces of {} in each of {} subsystems, one interrupt-mode reactor (core {}); medians of {reps} runs (a fresh target each), {queries} queries per figure per run. Load before: {}.\n\n",
        setup.total(),
        setup.subsystems,
        setup.per,
        setup.size,
        setup.subsystems,
        setup.core,
        summary["load_before"].as_str().unwrap_or("")
    );
    t += "| figure | median |\n|---|---|\n";
    t += &format!("| `pollux --check` | {:.3} s |\n", f("check_s"));
    t += &format!("| start: `pollux running` logged | {:.3} s |\n", f("running_s"));
    t += &format!(
        "| start: every namespace in a host's active lists (one controller per subsystem) | {:.3} s |\n",
        f("all_active_s")
    );
    t += &format!("| start: every RAM disk committed | {:.3} s |\n", f("filled_s"));
    t += &format!(
        "| RSS (VmRSS / VmHWM) | {:.0} / {:.0} MiB |\n",
        f("rss_mib"),
        f("hwm_mib")
    );
    t += &format!(
        "| RSS beyond the namespaces' data, per namespace | {:.1} KiB |\n",
        f("overhead_per_ns_kib")
    );
    t += &format!(
        "| discovery log ({} records) on a connected discovery controller, p50 / p99 | {:.0} / {:.0} us |\n",
        setup.subsystems,
        f("discovery_log_p50_us"),
        f("discovery_log_p99_us")
    );
    t += &format!(
        "| `nvme discover`'s exchange (connect, read, shut down), p50 | {:.0} us |\n",
        f("discover_whole_p50_us")
    );
    t += &format!(
        "| Identify Active Namespace ID list ({} NSIDs), p50 / p99 | {:.0} / {:.0} us |\n",
        setup.per.min(1024),
        f("active_ns_list_p50_us"),
        f("active_ns_list_p99_us")
    );
    t += &format!(
        "| Identify Namespace, p50 / p99 | {:.0} / {:.0} us |\n",
        f("identify_ns_p50_us"),
        f("identify_ns_p99_us")
    );
    t += &format!("| Identify Controller, p50 | {:.0} us |\n", f("identify_ctrl_p50_us"));
    t += &format!(
        "| a 4K read of every namespace, p50 round trip | {:.0} us |\n",
        f("read_every_ns_p50_us")
    );
    t += &format!("| SIGTERM to exit | {:.3} s |\n", f("stop_s"));
    t += &format!(
        "\nGoal: `--check` and start until every namespace is active within 10 s: {}.\n",
        summary["goal"]["check_and_start_within_10s"]
    );
    std::fs::write(format!("{dir}/scale.md"), &t).unwrap();
    eprintln!("scale: wrote {dir}/scale.json and {dir}/scale.md");
    print!("{t}");
}
