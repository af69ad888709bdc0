//! `ci/bench faults DURATION` (issue 52): a fault campaign with a history checker. Not a
//! test of speed: it proves that nothing acknowledged is lost or read stale while faults
//! that pollux claims to survive overlap at moments nobody chose.
//!
//! One pollux process (the release binary, two reactors, two listeners, a control socket)
//! serves a RAM namespace and a file namespace, each in its own subsystem. Six hosts (the
//! host library, each with its own host NQN; two of them through both listeners at once)
//! write self-describing blocks ([`pollux_host::history`]) and read them back; every write,
//! read and Flush is recorded with its start and end, and every block a read returns is
//! checked against the history. A nemesis, seeded, injects faults at random moments, several
//! at once (see [`Fault`]). At the end the faults stop, their effects are undone and every
//! block of every namespace is read back and checked: no acknowledged write lost.
//!
//! Writes faults.json in POLLUX_BENCH_OUT_DIR (default the workspace's build/bench) and one
//! summary line on stdout (`faults: ...`); exits 1 on any violation, hang or panic, printing
//! the first violation with its block's history and the seed that replays the run.
//!
//! args: [DURATION] (`150`, `90s`, `10m`, `1h`; default 60 s). env: POLLUX_BIN (the
//! workspace's build/release/pollux), FAULTS_SEED (default: random, printed),
//! FAULTS_DIR (the run's files, default build/bench/faults-run).
#![allow(missing_docs, clippy::print_stdout, clippy::unwrap_used)]

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pollux_host::history::{History, Nanos, Violation};
use pollux_host::{Controller, ControllerOpts};
use pollux_nvme::spec::Status;
use rand::SeedableRng;
use rand::rngs::Xoshiro256PlusPlus;

// The benches' shared Ceph cluster and settings (`failover`, `resv` use it too).
#[path = "../cluster/mod.rs"]
#[allow(dead_code, clippy::all)]
mod cluster;
mod nemesis;
mod process;
mod rbd;
mod worker;

use nemesis::Nemesis;
use process::Target;
use worker::{PathState, Worker};

/// Commands in flight per host and path.
const QD: usize = 8;
/// A command outstanding longer than this is a hang.
const HANG: Duration = Duration::from_secs(15);
/// Logical blocks per namespace (8 MiB at 512 bytes).
const NS_BYTES: u64 = 8 << 20;

const RAM_NQN: &str = "nqn.2026-12.io.pollux.faults:ram";
const FILE_NQN: &str = "nqn.2026-12.io.pollux.faults:file";

fn host_nqn(w: usize) -> String {
    format!("nqn.2014-08.org.nvmexpress:uuid:fa017000-0000-4000-8000-{w:012}")
}

/// A namespace of the campaign.
struct Ns {
    nqn: &'static str,
    nsid: u32,
    /// Its contents survive a kill of the target.
    survives_crash: bool,
    /// The hosts (workers) whose namespace it is.
    workers: Vec<usize>,
    /// Served by the gateways of the rbd part, not by the main pollux.
    gateway: bool,
    /// How long a command may be outstanding before it is a hang.
    hang: Duration,
}

impl Ns {
    fn local(nqn: &'static str, survives_crash: bool, workers: Vec<usize>) -> Self {
        Self {
            nqn,
            nsid: 1,
            survives_crash,
            workers,
            gateway: false,
            hang: HANG,
        }
    }
}

/// Counters every thread adds to.
#[derive(Default)]
struct Counts {
    writes_acked: AtomicU64,
    writes_refused: AtomicU64,
    writes_unknown: AtomicU64,
    reads_checked: AtomicU64,
    blocks_checked: AtomicU64,
    reads_failed: AtomicU64,
    flushes: AtomicU64,
    connects: AtomicU64,
    connect_failures: AtomicU64,
    hangs: AtomicU64,
}

struct Shared {
    t0: Instant,
    nss: Vec<Ns>,
    hist: Vec<Mutex<History>>,
    block: usize,
    /// The main pollux's two listeners, then (with the rbd part) gateway A's and B's.
    addrs: Vec<SocketAddr>,
    next_id: AtomicU64,
    stop: AtomicBool,
    counts: Counts,
    /// Statuses of failed commands, by name.
    statuses: Mutex<BTreeMap<String, u64>>,
    /// Violations by kind, and the first one.
    violations: Mutex<(BTreeMap<&'static str, u64>, Option<Violation>)>,
    hang_first: Mutex<Option<String>>,
    /// The main pollux's binary and control socket: at the first hang of one of its
    /// namespaces, an upgrade is asked for, whose refusal names the command its queue holds.
    ctl: (PathBuf, PathBuf),
    /// The fault the nemesis injected last, and when it began (a hang says what it was).
    nemesis_log: Mutex<(&'static str, Instant)>,
    /// The disk under the file namespace, as a probe sees it: each 100 ms a 512-byte
    /// write and fdatasync of a file beside the image, (when it began, how long it took)
    /// over the last minute. A hang of the file namespace says whether the disk stalled too.
    disk: Mutex<std::collections::VecDeque<(Instant, Duration)>>,
    /// Per worker: the start of its oldest outstanding read (MAX: none), published under
    /// its namespace's history lock.
    read_floor: Vec<AtomicU64>,
    /// Per worker: an order from the nemesis (0 none, 1 cut a connection, 2 reset a
    /// controller).
    orders: Vec<AtomicU8>,
}

impl Shared {
    fn now(&self) -> Nanos {
        self.t0.elapsed().as_nanos() as u64 + 1
    }

    fn violation(&self, v: Violation) {
        let mut g = self.violations.lock().unwrap();
        *g.0.entry(v.kind).or_default() += 1;
        if g.1.is_none() {
            eprintln!("faults: VIOLATION {v}");
            g.1 = Some(v);
        }
    }

    /// Asks the main pollux for an upgrade while the hung command's connection is still
    /// open: refused, it names the command a queue still holds after 5 s; done, the target
    /// held nothing (the command or its completion was lost between).
    fn held_by_target(&self) -> String {
        match process::ctl(&self.ctl.0, &self.ctl.1, &["upgrade"]) {
            Ok(_) => "nothing: an upgrade went through".into(),
            Err(process::CtlFailed(e)) => e,
        }
    }

    /// The disk probe's longest write and fdatasync begun since `since`, and when it began.
    fn disk_since(&self, since: Instant) -> String {
        let d = self.disk.lock().unwrap();
        let (mut n, mut longest) = (0, None::<(Instant, Duration)>);
        for &(at, took) in d.iter().filter(|(at, _)| *at >= since) {
            n += 1;
            if longest.is_none_or(|(_, l)| took > l) {
                longest = Some((at, took));
            }
        }
        match longest {
            Some((at, took)) => format!(
                "{n} probes, the longest {took:?}, begun {:?} after the command was sent",
                at.saturating_duration_since(since)
            ),
            None => "no probe since the command was sent (the probe itself is stuck)".into(),
        }
    }

    fn status(&self, what: &str, s: Status) {
        let name = format!("{what} {}", s.in_context(pollux_nvme::spec::StatusContext::Nvm));
        *self.statuses.lock().unwrap().entry(name).or_default() += 1;
    }
}

// ------------------------------------------------------------------ the campaign

fn parse_duration(s: &str) -> Option<Duration> {
    let (n, unit) = s.find(|c: char| !c.is_ascii_digit()).map_or((s, ""), |i| s.split_at(i));
    let n: u64 = n.parse().ok()?;
    Some(Duration::from_secs(match unit {
        "" | "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        _ => return None,
    }))
}

fn conf(dir: &Path, addrs: &[SocketAddr], sock: &Path, nss: &[Ns]) -> String {
    // The workers, and the two hosts of the reservation fault (nemesis::reserve).
    let hosts = |ns: &Ns| {
        ns.workers
            .iter()
            .chain(&nemesis::RESERVERS)
            .map(|&w| format!("\"{}\"", host_nqn(w)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "[reactors]\ncores = [0, 1]\n\n[control]\nsocket = \"{}\"\n\n\
         [[listener]]\naddress = \"{}\"\n\n[[listener]]\naddress = \"{}\"\n\n\
         [[subsystem]]\nnqn = \"{RAM_NQN}\"\nallow_any_host = true\n\
         [[subsystem.namespace]]\nnsid = 1\nhosts = [{}]\nbackend = {{ ram = {{ size = \"{NS_BYTES}\" }} }}\n\n\
         [[subsystem]]\nnqn = \"{FILE_NQN}\"\nallow_any_host = true\n\
         [[subsystem.namespace]]\nnsid = 1\nhosts = [{}]\nbackend = {{ file = {{ path = \"{}\", size = \"{NS_BYTES}\" }} }}\n",
        sock.display(),
        addrs[0],
        addrs[1],
        hosts(&nss[0]),
        hosts(&nss[1]),
        dir.join("file-ns.img").display()
    )
}

/// Reads every block of namespace `ns` through a fresh controller and checks it.
/// Why the final read-back could not check every block.
#[derive(Debug)]
struct ReadBackFailed {
    nqn: &'static str,
    lba: Option<u64>,
    error: pollux_host::HostError,
}

impl std::fmt::Display for ReadBackFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.lba {
            Some(lba) => write!(f, "the final read of {} LBA {lba} failed: {}", self.nqn, self.error),
            None => write!(f, "the final read-back cannot connect to {}: {}", self.nqn, self.error),
        }
    }
}

fn read_back(c: &Shared, ns: usize) -> Result<u64, ReadBackFailed> {
    let n = &c.nss[ns];
    let mut o = ControllerOpts::new(n.nqn, &host_nqn(n.workers[0]), 1, 32);
    o.timeout = Duration::from_secs(10);
    let (a, b) = if n.gateway { (2, 3) } else { (0, 1) };
    let mut ctrl = Controller::connect_with(c.addrs[a], &o)
        .or_else(|_| Controller::connect_with(c.addrs[b], &o))
        .map_err(|error| ReadBackFailed {
            nqn: n.nqn,
            lba: None,
            error,
        })?;
    let blocks = c.hist[ns].lock().unwrap().len();
    let chunk = 64u64;
    let mut checked = 0;
    let mut buf = vec![0u8; chunk as usize * c.block];
    let mut lba = 0;
    while lba < blocks {
        let nlb = chunk.min(blocks - lba);
        let rs = c.now();
        let b = &mut buf[..nlb as usize * c.block];
        ctrl.io[0]
            .read(n.nsid, lba, nlb as u32, b)
            .map_err(|error| ReadBackFailed {
                nqn: n.nqn,
                lba: Some(lba),
                error,
            })?;
        let re = c.now();
        let h = c.hist[ns].lock().unwrap();
        for (i, blk) in b.chunks_exact(c.block).enumerate() {
            if let Err(v) = h.check(lba + i as u64, blk, rs, re) {
                c.violation(v);
            }
            checked += 1;
        }
        lba += nlb;
    }
    let _ = ctrl.shutdown();
    Ok(checked)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let duration = args
        .first()
        .map(|a| parse_duration(a).unwrap_or_else(|| panic!("faults: not a duration: {a} (150, 90s, 10m, 1h)")))
        .unwrap_or(Duration::from_secs(60));
    let seed: u64 = std::env::var("FAULTS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            let mut b = [0u8; 8];
            getrandom::fill(&mut b).unwrap();
            u64::from_le_bytes(b) >> 1
        });
    let (bin, out_dir) = cluster::bin_and_out();
    let bin = PathBuf::from(bin);
    let dir = std::env::var("FAULTS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| out_dir.join("faults-run"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    eprintln!(
        "faults: seed {seed} ({} s; replay with FAULTS_SEED={seed}), files in {}",
        duration.as_secs(),
        dir.display()
    );

    let mut addrs = vec![cluster::free_addr(), cluster::free_addr()];
    let sock = dir.join("pollux.sock");
    let mut nss = vec![
        Ns::local(RAM_NQN, false, vec![0, 1, 2]),
        Ns::local(FILE_NQN, true, vec![3, 4, 5]),
    ];
    // The rbd part: a Ceph cluster and two gateways in a group.
    let with_rbd = std::env::var("FAULTS_RBD").is_ok_and(|v| v == "1");
    let mut rbd = with_rbd.then(|| {
        let r = rbd::Rbd::start(&dir, &bin);
        addrs.extend(r.addrs);
        nss.push(Ns {
            nqn: rbd::NQN,
            nsid: 1,
            survives_crash: true,
            workers: vec![6, 7],
            gateway: true,
            hang: rbd::HANG,
        });
        r
    });
    let conf_path = dir.join("pollux.toml");
    std::fs::write(&conf_path, conf(&dir, &addrs, &sock, &nss)).unwrap();
    let bad_bin = dir.join("failing-pollux");
    std::fs::write(
        &bad_bin,
        "#!/bin/sh\necho 'faults: an upgrade binary that fails on purpose' >&2\nexit 3\n",
    )
    .unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&bad_bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let mut target = Target {
        bin,
        conf: conf_path,
        sock,
        log: dir.join("pollux.log"),
        child: None,
        starts: 0,
        seen: Vec::new(),
    };
    target.start(&addrs[..2]);

    // Identify: the block size and whether a volatile write cache is reported.
    let mut hist = Vec::new();
    let mut block = 0usize;
    for (i, n) in nss.iter().enumerate() {
        let mut c = Controller::connect(
            addrs[if n.gateway { 2 } else { 0 }],
            n.nqn,
            &host_nqn(n.workers[0]),
            1,
            8,
            pollux_host::Digests::NONE,
        )
        .expect("connect for Identify");
        let id = c.admin.identify_namespace(n.nsid).expect("Identify Namespace");
        let vwc = c.id.vwc & 1 != 0;
        block = id.block_size as usize;
        eprintln!(
            "faults: namespace {i}: {} nsid {} {} blocks of {} bytes, volatile write cache {vwc}, {}",
            n.nqn,
            n.nsid,
            id.nsze,
            id.block_size,
            if n.survives_crash {
                "survives a kill"
            } else {
                "lost in a kill"
            }
        );
        // The first 8 MiB only, whatever the namespace's size: writes that overlap.
        let blocks = id.nsze.min(NS_BYTES / u64::from(id.block_size));
        hist.push(Mutex::new(History::new(i as u32, blocks, vwc, n.survives_crash)));
        let _ = c.shutdown();
    }
    let workers = if with_rbd { 8 } else { 6 };
    let shared = Arc::new(Shared {
        t0: Instant::now(),
        nss,
        hist,
        block,
        addrs,
        next_id: AtomicU64::new(1),
        stop: AtomicBool::new(false),
        counts: Counts::default(),
        statuses: Mutex::new(BTreeMap::new()),
        violations: Mutex::new((BTreeMap::new(), None)),
        hang_first: Mutex::new(None),
        ctl: (target.bin.clone(), target.sock.clone()),
        nemesis_log: Mutex::new(("none", Instant::now())),
        disk: Mutex::new(std::collections::VecDeque::new()),
        read_floor: (0..workers).map(|_| AtomicU64::new(u64::MAX)).collect(),
        orders: (0..workers).map(|_| AtomicU8::new(0)).collect(),
    });
    let mut handles = Vec::new();
    for w in 0..workers {
        let ns = shared.nss.iter().position(|n| n.workers.contains(&w)).unwrap();
        // Hosts 0 and 3 use both listeners at once (two paths); the others one each; the
        // rbd hosts both gateways, A's path while it serves (its ANA group's optimized one).
        let gateway = shared.nss[ns].gateway;
        let addrs_of: Vec<usize> = if gateway {
            vec![2, 3]
        } else if w % 3 == 0 {
            vec![0, 1]
        } else {
            vec![w % 2]
        };
        let wk = Worker {
            c: Arc::clone(&shared),
            w,
            ns,
            nsid: shared.nss[ns].nsid,
            nqn: shared.nss[ns].nqn,
            blocks: shared.hist[ns].lock().unwrap().len(),
            rng: Xoshiro256PlusPlus::seed_from_u64(seed ^ (w as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)),
            paths: addrs_of
                .into_iter()
                .map(|addr| PathState {
                    addr,
                    ctrl: None,
                    next_try: Instant::now(),
                    hold: Instant::now(),
                    pending: HashMap::new(),
                    tag: 0,
                })
                .collect(),
            turn: w,
            prefer_first: gateway,
            hang: shared.nss[ns].hang,
        };
        handles.push(std::thread::spawn(move || wk.run()));
    }
    // The disk probe (see `Shared::disk`).
    let probe = {
        let (c, path) = (Arc::clone(&shared), dir.join("disk-probe"));
        std::thread::spawn(move || {
            use std::io::Write as _;
            let Ok(mut f) = std::fs::File::create(&path) else {
                return;
            };
            while !c.stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                let ok = f.write_all(&[0x5a; 512]).is_ok() && f.sync_data().is_ok();
                let took = t.elapsed();
                let _ = std::io::Seek::rewind(&mut f);
                let mut d = c.disk.lock().unwrap();
                d.push_back((t, if ok { took } else { Duration::MAX }));
                while d.front().is_some_and(|(at, _)| at.elapsed() > Duration::from_secs(60)) {
                    d.pop_front();
                }
                drop(d);
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    // A pruner: forgets what no outstanding or later read can return.
    let pruner = {
        let c = Arc::clone(&shared);
        std::thread::spawn(move || {
            while !c.stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(500));
                for (i, h) in c.hist.iter().enumerate() {
                    let mut h = h.lock().unwrap();
                    let floor = c.nss[i]
                        .workers
                        .iter()
                        .map(|&w| c.read_floor[w].load(Ordering::SeqCst))
                        .min()
                        .unwrap_or(u64::MAX)
                        .min(c.now());
                    h.prune(floor);
                }
            }
        })
    };

    std::thread::sleep(Duration::from_secs(2));
    let rss_start = target.rss_kib();
    let mut nemesis = Nemesis {
        c: Arc::clone(&shared),
        target,
        rng: Xoshiro256PlusPlus::seed_from_u64(seed),
        undo: Vec::new(),
        injected: BTreeMap::new(),
        ctl_errors: 0,
        ctl_first_error: None,
        bad_bin,
        side: Vec::new(),
        side_total: 0,
        rbd: rbd.take(),
        reserving: None,
        reserved: 0,
    };
    let t_faults = Instant::now();
    nemesis.run(t_faults + duration);
    eprintln!(
        "faults: faults stopped after {:.0} s; the workload runs on 3 s",
        t_faults.elapsed().as_secs_f64()
    );
    std::thread::sleep(Duration::from_secs(3));
    shared.stop.store(true, Ordering::Relaxed);
    let mut worker_panics = 0;
    for h in handles {
        if h.join().is_err() {
            worker_panics += 1;
        }
    }
    let _ = pruner.join();
    let _ = probe.join();

    // The final read-back: every block of every namespace.
    let mut final_blocks = 0;
    let mut final_error = None;
    for ns in 0..shared.nss.len() {
        match read_back(&shared, ns) {
            Ok(n) => final_blocks += n,
            Err(e) => {
                eprintln!("faults: {e}");
                final_error = Some(e.to_string());
            }
        }
    }
    let rss_end = nemesis.target.rss_kib();
    let mut stopped = nemesis.target.stop();
    let mut log = std::fs::read_to_string(&nemesis.target.log).unwrap_or_default();
    if let Some(r) = nemesis.rbd.as_mut() {
        stopped &= r.stop();
        log.push_str(&r.logs());
    }
    let panics = log.matches("panicked").count() + worker_panics;

    let k = &shared.counts;
    let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let (violations, first) = shared.violations.lock().unwrap().clone();
    let n_viol: u64 = violations.values().sum();
    let hangs = ld(&k.hangs);
    let faults_total: u64 = nemesis.injected.values().sum();
    let json = serde_json::json!({
        "seed": seed,
        "duration_s": duration.as_secs(),
        "faults": nemesis.injected,
        "faults_total": faults_total,
        "pollux_starts": nemesis.target.starts,
        "ctl_errors": nemesis.ctl_errors,
        "ctl_first_error": nemesis.ctl_first_error,
        "side_connections": nemesis.side_total,
        "reservations_taken": nemesis.reserved,
        "writes_acked": ld(&k.writes_acked),
        "writes_refused": ld(&k.writes_refused),
        "writes_unknown": ld(&k.writes_unknown),
        "reads_checked": ld(&k.reads_checked),
        "blocks_checked": ld(&k.blocks_checked),
        "reads_failed": ld(&k.reads_failed),
        "flushes": ld(&k.flushes),
        "connects": ld(&k.connects),
        "connect_failures": ld(&k.connect_failures),
        "final_blocks_checked": final_blocks,
        "final_error": final_error,
        "statuses": *shared.statuses.lock().unwrap(),
        "violations": violations,
        "first_violation": first.as_ref().map(|v| v.to_string()),
        "hangs": hangs,
        "first_hang": *shared.hang_first.lock().unwrap(),
        "panics": panics,
        "stopped_cleanly": stopped,
        "rss_start_kib": rss_start,
        "rss_end_kib": rss_end,
    });
    std::fs::write(
        out_dir.join("faults.json"),
        serde_json::to_string_pretty(&json).unwrap(),
    )
    .unwrap();
    let mut md = format!(
        "# ci/bench faults\n\nSeed {seed} (`BENCH_FAULTS_SEED={seed} ci/bench faults {}s` replays it), {} s of faults; \
         pollux started {} times.\n\n| fault | injected |\n|---|---|\n",
        duration.as_secs(),
        duration.as_secs(),
        nemesis.target.starts
    );
    for (k, v) in &nemesis.injected {
        md.push_str(&format!("| {k} | {v} |\n"));
    }
    md.push_str(&format!(
        "| **all** | **{faults_total}** |\n\n| checked | count |\n|---|---|\n\
         | writes acknowledged | {} |\n| writes refused (never to land) | {} |\n| writes of unknown outcome | {} |\n\
         | reads checked | {} |\n| blocks checked in reads | {} |\n| blocks read back at the end | {final_blocks} |\n\
         | violations (lost, stale, torn, misplaced, phantom) | {n_viol} |\n| hangs | {hangs} |\n| panics | {panics} |\n\
         | pollux RSS at start / end, KiB | {} / {} |\n",
        ld(&k.writes_acked),
        ld(&k.writes_refused),
        ld(&k.writes_unknown),
        ld(&k.reads_checked),
        ld(&k.blocks_checked),
        rss_start.unwrap_or(0),
        rss_end.unwrap_or(0),
    ));
    if let Some(v) = &first {
        md.push_str(&format!("\nFirst violation:\n\n```\n{v}\n```\n"));
    }
    std::fs::write(out_dir.join("faults.md"), md).unwrap();
    let kinds: Vec<String> = nemesis.injected.iter().map(|(k, v)| format!("{k} {v}")).collect();
    println!(
        "faults: seed {seed}, {} s: {faults_total} faults ({}; {} reservations taken); {} writes acknowledged ({} refused, {} unknown), \
         {} reads ({} blocks) checked, {final_blocks} blocks read back; violations {n_viol} (lost {}, stale {}, torn {}, \
         misplaced {}, phantom {}), hangs {hangs}, panics {panics}; RSS {} -> {} KiB (pollux started {} times)",
        duration.as_secs(),
        kinds.join(", "),
        nemesis.reserved,
        ld(&k.writes_acked),
        ld(&k.writes_refused),
        ld(&k.writes_unknown),
        ld(&k.reads_checked),
        ld(&k.blocks_checked),
        violations.get("lost").unwrap_or(&0),
        violations.get("stale").unwrap_or(&0),
        violations.get("torn").unwrap_or(&0),
        violations.get("misplaced").unwrap_or(&0),
        violations.get("phantom").unwrap_or(&0),
        rss_start.unwrap_or(0),
        rss_end.unwrap_or(0),
        nemesis.target.starts,
    );
    let failed = n_viol > 0 || hangs > 0 || panics > 0 || final_error.is_some() || !stopped;
    // The Ceph cluster stops (and is wiped) when dropped: before any exit.
    drop(nemesis.rbd.take());
    if let Some(v) = first {
        println!("faults: first violation: {v}");
    }
    if failed {
        println!(
            "faults: FAILED (seed {seed}: replay with FAULTS_SEED={seed} ci/bench faults {}s); pollux log {}",
            duration.as_secs(),
            nemesis.target.log.display()
        );
        std::process::exit(1);
    }
}
