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
use std::io::{Read, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pollux_host::history::{self, History, Nanos, Outcome, Stamp, Violation};
use pollux_host::{Completion, Controller, ControllerOpts, HostQueue, QueueOpts};
use pollux_nvme::spec::Status;
use rand::rngs::Xoshiro256PlusPlus;
use rand::{Rng, RngExt, SeedableRng};

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
    addrs: [SocketAddr; 2],
    next_id: AtomicU64,
    stop: AtomicBool,
    counts: Counts,
    /// Statuses of failed commands, by name.
    statuses: Mutex<BTreeMap<String, u64>>,
    /// Violations by kind, and the first one.
    violations: Mutex<(BTreeMap<&'static str, u64>, Option<Violation>)>,
    hang_first: Mutex<Option<String>>,
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

    fn status(&self, what: &str, s: Status) {
        let name = format!("{what} {}", s.in_context(pollux_nvme::spec::StatusContext::Nvm));
        *self.statuses.lock().unwrap().entry(name).or_default() += 1;
    }
}

#[derive(Debug, Clone, Copy)]
enum OpKind {
    Write { lba: u64, nlb: u32, id: u64, fua: bool },
    Read { lba: u64, nlb: u32, rs: Nanos },
    Flush { start: Nanos },
}

struct Op {
    kind: OpKind,
    at: Instant,
}

/// What a write's error status says about its effect: refused before it took effect, or
/// unknown. Statuses pollux returns from its checks before the backend sees the command.
fn write_outcome(s: Status) -> Outcome {
    const REFUSED: [Status; 7] = [
        Status::RESERVATION_CONFLICT,
        Status::INVALID_NAMESPACE,
        Status::INVALID_FIELD,
        Status::LBA_OUT_OF_RANGE,
        Status::ANA_INACCESSIBLE,
        Status::ANA_PERSISTENT_LOSS,
        Status::ANA_TRANSITION,
    ];
    let plain = Status::new(s.sct(), s.sc());
    if REFUSED.contains(&plain) {
        Outcome::Refused
    } else {
        Outcome::Unknown
    }
}

/// One path of a worker: a controller through one listener, its commands in flight.
struct PathState {
    addr: usize,
    ctrl: Option<Controller>,
    next_try: Instant,
    pending: HashMap<u64, Op>,
    tag: u64,
}

struct Worker {
    c: Arc<Shared>,
    w: usize,
    ns: usize,
    nsid: u32,
    nqn: &'static str,
    blocks: u64,
    rng: Xoshiro256PlusPlus,
    paths: Vec<PathState>,
    turn: usize,
}

impl Worker {
    fn connect(&mut self, p: usize) {
        let now = Instant::now();
        let path = &mut self.paths[p];
        if path.ctrl.is_some() || now < path.next_try {
            return;
        }
        let mut o = ControllerOpts::new(self.nqn, &host_nqn(self.w), 1, 64);
        o.timeout = Duration::from_secs(3);
        match Controller::connect_with(self.c.addrs[path.addr], &o) {
            Ok(ctrl) => {
                self.c.counts.connects.fetch_add(1, Ordering::Relaxed);
                path.ctrl = Some(ctrl);
            }
            Err(_) => {
                self.c.counts.connect_failures.fetch_add(1, Ordering::Relaxed);
                path.next_try = now + Duration::from_millis(100 + self.rng.random_range(0..200));
            }
        }
    }

    /// The path's connection is gone: what it had in flight ends unknown.
    fn drop_path(&mut self, p: usize) {
        let path = &mut self.paths[p];
        path.ctrl = None;
        path.next_try = Instant::now() + Duration::from_millis(self.rng.random_range(0..100));
        let t = self.c.now();
        let ops: Vec<Op> = path.pending.drain().map(|(_, o)| o).collect();
        let mut h = self.c.hist[self.ns].lock().unwrap();
        for op in ops {
            if let OpKind::Write { lba, nlb, id, .. } = op.kind {
                h.end_write(lba, nlb, id, t, Outcome::Unknown);
                self.c.counts.writes_unknown.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.publish_floor(&h);
    }

    /// The oldest outstanding read's start (MAX: none), published under the history lock.
    fn publish_floor(&self, _h: &History) {
        let floor = self
            .paths
            .iter()
            .flat_map(|p| p.pending.values())
            .filter_map(|o| match o.kind {
                OpKind::Read { rs, .. } => Some(rs),
                _ => None,
            })
            .min()
            .unwrap_or(u64::MAX);
        self.c.read_floor[self.w].store(floor, Ordering::SeqCst);
    }

    fn submit(&mut self, p: usize) -> bool {
        let block = self.c.block;
        let roll = self.rng.random_range(0..100u32);
        let path = &mut self.paths[p];
        let Some(ctrl) = path.ctrl.as_mut() else { return false };
        let q = &mut ctrl.io[0];
        path.tag += 1;
        let tag = path.tag;
        let (kind, r) = if roll < 55 {
            let nlb = self.rng.random_range(1..=8u32);
            let lba = self.rng.random_range(0..=self.blocks - u64::from(nlb));
            let id = self.c.next_id.fetch_add(1, Ordering::Relaxed);
            let fua = self.rng.random_range(0..10) == 0;
            let mut buf = vec![0u8; nlb as usize * block];
            history::fill(
                &mut buf,
                lba,
                block,
                Stamp {
                    ns: self.ns as u32,
                    write_id: id,
                    writer: self.w as u32,
                },
            );
            self.c.hist[self.ns]
                .lock()
                .unwrap()
                .begin_write(lba, nlb, id, self.w as u32, self.c.now());
            let mut sqe = pollux_host::sqe::write(self.nsid, lba, nlb);
            if fua {
                sqe.cdw12.set(sqe.cdw12.get() | 1 << 30);
            }
            let r = q.submit(sqe, pollux_host::Data::ToCtrl(buf), tag);
            (OpKind::Write { lba, nlb, id, fua }, r)
        } else if roll < 95 {
            let nlb = self.rng.random_range(1..=16u32);
            let lba = self.rng.random_range(0..=self.blocks - u64::from(nlb));
            let rs = {
                let h = self.c.hist[self.ns].lock().unwrap();
                let rs = self.c.now();
                self.c.read_floor[self.w].fetch_min(rs, Ordering::SeqCst);
                drop(h);
                rs
            };
            let r = q.submit_read(self.nsid, lba, nlb, vec![0u8; nlb as usize * block], tag);
            (OpKind::Read { lba, nlb, rs }, r)
        } else {
            let start = self.c.now();
            (
                OpKind::Flush { start },
                q.submit(pollux_host::sqe::flush(self.nsid), pollux_host::Data::None, tag),
            )
        };
        path.pending.insert(
            tag,
            Op {
                kind,
                at: Instant::now(),
            },
        );
        if r.is_err() {
            self.drop_path(p);
            return false;
        }
        true
    }

    fn complete(&mut self, p: usize, cpl: Completion) {
        let Some(op) = self.paths[p].pending.remove(&cpl.tag) else {
            return;
        };
        let t = self.c.now();
        let c = Arc::clone(&self.c);
        match op.kind {
            OpKind::Write { lba, nlb, id, fua } => {
                let outcome = if cpl.is_success() {
                    c.counts.writes_acked.fetch_add(1, Ordering::Relaxed);
                    Outcome::Acked { fua }
                } else {
                    c.status("write", cpl.status);
                    let o = write_outcome(cpl.status);
                    let n = if o == Outcome::Refused {
                        &c.counts.writes_refused
                    } else {
                        &c.counts.writes_unknown
                    };
                    n.fetch_add(1, Ordering::Relaxed);
                    o
                };
                c.hist[self.ns].lock().unwrap().end_write(lba, nlb, id, t, outcome);
            }
            OpKind::Read { lba, nlb, rs } => {
                let h = c.hist[self.ns].lock().unwrap();
                if cpl.is_success() && cpl.buf.len() == nlb as usize * c.block {
                    c.counts.reads_checked.fetch_add(1, Ordering::Relaxed);
                    for (i, b) in cpl.buf.chunks_exact(c.block).enumerate() {
                        c.counts.blocks_checked.fetch_add(1, Ordering::Relaxed);
                        if let Err(v) = h.check(lba + i as u64, b, rs, t) {
                            c.violation(v);
                        }
                    }
                } else {
                    c.counts.reads_failed.fetch_add(1, Ordering::Relaxed);
                    c.status("read", cpl.status);
                }
                self.publish_floor(&h);
            }
            OpKind::Flush { start } => {
                if cpl.is_success() {
                    c.counts.flushes.fetch_add(1, Ordering::Relaxed);
                    c.hist[self.ns].lock().unwrap().flushed(start, t);
                } else {
                    c.status("flush", cpl.status);
                }
            }
        }
    }

    fn poll(&mut self, p: usize, wait: Duration) {
        let mut done = Vec::new();
        let r = match self.paths[p].ctrl.as_mut() {
            Some(ctrl) => ctrl.io[0].poll_completions(Some(wait), |c| done.push(c)),
            None => return,
        };
        for c in done {
            self.complete(p, c);
        }
        if r.is_err() {
            self.drop_path(p);
            return;
        }
        let oldest = self.paths[p].pending.values().map(|o| o.at).min();
        if let Some(at) = oldest.filter(|at| at.elapsed() > HANG) {
            self.c.counts.hangs.fetch_add(1, Ordering::Relaxed);
            let what = self.paths[p].pending.values().find(|o| o.at == at).map(|o| o.kind);
            let mut g = self.c.hang_first.lock().unwrap();
            if g.is_none() {
                let s = format!(
                    "host {} via {}: {:?} outstanding for {:?}",
                    self.w,
                    self.c.addrs[self.paths[p].addr],
                    what,
                    at.elapsed()
                );
                eprintln!("faults: HANG {s}");
                *g = Some(s);
            }
            drop(g);
            self.drop_path(p);
        }
    }

    fn order(&mut self) {
        let o = self.c.orders[self.w].swap(0, Ordering::Relaxed);
        if o == 0 {
            return;
        }
        let live: Vec<usize> = (0..self.paths.len())
            .filter(|&p| self.paths[p].ctrl.is_some())
            .collect();
        if live.is_empty() {
            return;
        }
        let p = live[self.rng.random_range(0..live.len())];
        if o == 2 {
            // A controller reset as a host does it: CC.EN cleared with commands in flight
            // (NVMe 2.0 §3.7.2), then the queues are gone and it connects anew.
            if let Some(ctrl) = self.paths[p].ctrl.as_mut() {
                let _ = ctrl.admin.property_set(0x14, 0);
            }
        }
        // Either way the connection is closed under the commands in flight.
        self.drop_path(p);
    }

    fn run(mut self) {
        while !self.c.stop.load(Ordering::Relaxed) {
            self.order();
            for p in 0..self.paths.len() {
                self.connect(p);
            }
            let live: Vec<usize> = (0..self.paths.len())
                .filter(|&p| self.paths[p].ctrl.is_some())
                .collect();
            if live.is_empty() {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            self.turn += 1;
            let p = live[self.turn % live.len()];
            while self.paths[p].pending.len() < QD && self.paths[p].ctrl.is_some() {
                if !self.submit(p) {
                    break;
                }
            }
            for &q in &live {
                self.poll(q, Duration::from_millis(2));
            }
        }
        // Drain: what is in flight completes (or ends unknown).
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until && self.paths.iter().any(|p| !p.pending.is_empty()) {
            for p in 0..self.paths.len() {
                self.poll(p, Duration::from_millis(5));
            }
        }
        for p in 0..self.paths.len() {
            if !self.paths[p].pending.is_empty() {
                self.drop_path(p);
            }
            if let Some(ctrl) = self.paths[p].ctrl.take() {
                let _ = ctrl.shutdown();
            }
        }
    }
}

// ------------------------------------------------------------------ the target process

struct Target {
    bin: PathBuf,
    conf: PathBuf,
    sock: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    starts: u64,
}

#[derive(Debug)]
struct CtlFailed(String);

impl Target {
    fn start(&mut self, addrs: &[SocketAddr]) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(&self.bin)
            .arg("--config")
            .arg(&self.conf)
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
        self.starts += 1;
        let t0 = Instant::now();
        for a in addrs {
            while TcpStream::connect(a).is_err() {
                assert!(
                    t0.elapsed() < Duration::from_secs(60),
                    "pollux did not listen on {a}: see {}",
                    self.log.display()
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    fn ctl(&self, args: &[&str]) -> Result<String, CtlFailed> {
        let out = Command::new(&self.bin)
            .arg("ctl")
            .arg("--socket")
            .arg(&self.sock)
            .args(args)
            .output()
            .map_err(|e| CtlFailed(e.to_string()))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(CtlFailed(format!(
                "pollux ctl {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            )))
        }
    }

    /// The pid of the process serving now (an upgrade replaces it).
    fn pid(&self) -> Option<i32> {
        let v: serde_json::Value = serde_json::from_str(&self.ctl(&["--json", "version"]).ok()?).ok()?;
        v["pid"].as_i64().map(|p| p as i32)
    }

    fn rss_kib(&self) -> Option<u64> {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.pid()?)).ok()?;
        s.lines()
            .find(|l| l.starts_with("VmRSS:"))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    }

    fn kill9(&mut self) {
        let pid = self.pid().or_else(|| self.child.as_ref().map(|c| c.id() as i32));
        if let Some(pid) = pid {
            // SAFETY: kill(2) of the pollux process this campaign runs.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            // Wait until it is gone (it may be the child, or a process an upgrade started).
            let t0 = Instant::now();
            while Path::new(&format!("/proc/{pid}")).exists() && t0.elapsed() < Duration::from_secs(10) {
                if let Some(c) = self.child.as_mut() {
                    let _ = c.try_wait();
                }
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                if stat.split_whitespace().nth(2) == Some("Z") {
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
    }

    fn stop(&mut self) -> bool {
        let Some(pid) = self.pid() else { return false };
        // SAFETY: kill(2) of the pollux process this campaign runs.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let t0 = Instant::now();
        while Path::new(&format!("/proc/{pid}")).exists() && t0.elapsed() < Duration::from_secs(20) {
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(_)) = c.try_wait()
            {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.child.take();
        !Path::new(&format!("/proc/{pid}")).exists()
    }
}

// ------------------------------------------------------------------ the nemesis

/// The faults the nemesis injects. Each has a weight; those with an undo are undone after
/// a random while, so several overlap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    /// `kill -9` of pollux and a restart (RAM starts empty, the file keeps every write).
    Kill,
    /// `pollux ctl upgrade` to the same binary (live connections handed over).
    Upgrade,
    /// `pollux ctl upgrade` to a binary that fails: the old process serves on.
    UpgradeRollback,
    /// A reactor's mode set to poll, hybrid, interrupt or adaptive.
    Mode,
    /// A reactor's adaptive CPU budget changed.
    CpuBudget,
    /// A namespace detached from one of its hosts, attached again later.
    Mask,
    /// A namespace's IOPS limited, the limit lifted later.
    Qos,
    /// A listener removed (its connections close), added again later.
    Listener,
    /// An ANA group inaccessible or in change on one listener, optimized again later.
    Ana,
    /// A host resets its controller with commands in flight.
    HostReset,
    /// A host closes a connection with commands in flight.
    ClientCut,
    /// Hundreds of connections opened and closed beside the workload.
    Storm,
    /// A client sending malformed PDUs beside the workload.
    Chaos,
}

impl Fault {
    const ALL: [(Fault, u32); 13] = [
        (Fault::Kill, 4),
        (Fault::Upgrade, 3),
        (Fault::UpgradeRollback, 2),
        (Fault::Mode, 10),
        (Fault::CpuBudget, 6),
        (Fault::Mask, 8),
        (Fault::Qos, 8),
        (Fault::Listener, 6),
        (Fault::Ana, 8),
        (Fault::HostReset, 8),
        (Fault::ClientCut, 10),
        (Fault::Storm, 3),
        (Fault::Chaos, 6),
    ];

    fn name(self) -> &'static str {
        match self {
            Fault::Kill => "kill",
            Fault::Upgrade => "upgrade",
            Fault::UpgradeRollback => "upgrade_rollback",
            Fault::Mode => "mode",
            Fault::CpuBudget => "cpu_budget",
            Fault::Mask => "mask",
            Fault::Qos => "qos",
            Fault::Listener => "listener",
            Fault::Ana => "ana",
            Fault::HostReset => "host_reset",
            Fault::ClientCut => "client_cut",
            Fault::Storm => "storm",
            Fault::Chaos => "chaos",
        }
    }
}

/// A fault's effect to take back, and when.
#[derive(Debug)]
enum Undo {
    Mask { ns: usize, host: usize },
    Qos { ns: usize },
    Listener { addr: usize },
    Ana { addr: usize, group: u32 },
}

struct Nemesis {
    c: Arc<Shared>,
    target: Target,
    rng: Xoshiro256PlusPlus,
    undo: Vec<(Instant, Undo)>,
    injected: BTreeMap<&'static str, u64>,
    ctl_errors: u64,
    ctl_first_error: Option<String>,
    bad_bin: PathBuf,
    side: Vec<std::thread::JoinHandle<u64>>,
    /// What the side threads (storms, chaos) did: connections, malformed PDUs sent.
    side_total: u64,
}

impl Nemesis {
    fn ctl(&mut self, args: &[&str]) -> bool {
        match self.target.ctl(args) {
            Ok(_) => true,
            Err(CtlFailed(e)) => {
                self.ctl_errors += 1;
                if self.ctl_first_error.is_none() {
                    eprintln!("faults: ctl failed: {e}");
                    self.ctl_first_error = Some(e);
                }
                false
            }
        }
    }

    fn undo_one(&mut self, u: Undo) {
        match u {
            Undo::Mask { ns, host } => {
                let (nqn, nsid) = (self.c.nss[ns].nqn, self.c.nss[ns].nsid.to_string());
                self.ctl(&["ns-add-host", "--nqn", nqn, "--nsid", &nsid, "--host", &host_nqn(host)]);
            }
            Undo::Qos { ns } => {
                let (nqn, nsid) = (self.c.nss[ns].nqn, self.c.nss[ns].nsid.to_string());
                self.ctl(&["set-qos", "--nqn", nqn, "--nsid", &nsid, "--iops", "0"]);
            }
            Undo::Listener { addr } => {
                let a = self.c.addrs[addr].to_string();
                self.ctl(&["add-listener", "--address", &a]);
            }
            Undo::Ana { addr, group } => {
                let a = self.c.addrs[addr].to_string();
                self.ctl(&["set-ana-state", &a, &group.to_string(), "optimized"]);
            }
        }
    }

    fn pick(&mut self) -> Fault {
        let total: u32 = Fault::ALL.iter().map(|f| f.1).sum();
        let mut r = self.rng.random_range(0..total);
        for (f, w) in Fault::ALL {
            if r < w {
                return f;
            }
            r -= w;
        }
        Fault::Mode
    }

    fn later(&mut self) -> Instant {
        Instant::now() + Duration::from_millis(self.rng.random_range(200..2500))
    }

    fn inject(&mut self, f: Fault) {
        let ns = self.rng.random_range(0..self.c.nss.len());
        let (nqn, nsid) = (self.c.nss[ns].nqn, self.c.nss[ns].nsid.to_string());
        let ok = match f {
            Fault::Kill => {
                self.target.kill9();
                let t = self.c.now();
                for h in &self.c.hist {
                    h.lock().unwrap().crashed(t);
                }
                // Whatever the control plane changed is gone with the process.
                self.undo.clear();
                std::thread::sleep(Duration::from_millis(self.rng.random_range(0..400)));
                self.target.start(&self.c.addrs);
                true
            }
            Fault::Upgrade => self.ctl(&["upgrade"]),
            Fault::UpgradeRollback => {
                let pid = self.target.pid();
                let bad = self.bad_bin.to_string_lossy().into_owned();
                let refused = self.target.ctl(&["upgrade", "--binary", &bad]).is_err();
                // It must fail and leave the same process serving.
                refused && self.target.pid() == pid && pid.is_some()
            }
            Fault::Mode => {
                let r = self.rng.random_range(0..2u32).to_string();
                let m = ["poll", "hybrid", "interrupt", "adaptive"][self.rng.random_range(0..4)];
                self.ctl(&["set-mode", &r, m])
            }
            Fault::CpuBudget => {
                let r = self.rng.random_range(0..2u32).to_string();
                let b = format!("{:.2}", self.rng.random_range(0.05..1.0f64));
                self.ctl(&["set-cpu-budget", &r, &b])
            }
            Fault::Mask => {
                let hosts = self.c.nss[ns].workers.clone();
                let host = hosts[self.rng.random_range(0..hosts.len())];
                let masked = self
                    .undo
                    .iter()
                    .any(|(_, u)| matches!(u, Undo::Mask { ns: n, host: h } if *n == ns && *h == host));
                let ok = masked
                    || self.ctl(&[
                        "ns-remove-host",
                        "--nqn",
                        nqn,
                        "--nsid",
                        &nsid,
                        "--host",
                        &host_nqn(host),
                    ]);
                if ok && !masked {
                    let at = self.later();
                    self.undo.push((at, Undo::Mask { ns, host }));
                }
                ok
            }
            Fault::Qos => {
                let iops = self.rng.random_range(200..5000u32).to_string();
                let ok = self.ctl(&["set-qos", "--nqn", nqn, "--nsid", &nsid, "--iops", &iops]);
                if ok
                    && !self
                        .undo
                        .iter()
                        .any(|(_, u)| matches!(u, Undo::Qos { ns: n } if *n == ns))
                {
                    let at = self.later();
                    self.undo.push((at, Undo::Qos { ns }));
                }
                ok
            }
            Fault::Listener => {
                let addr = self.rng.random_range(0..2usize);
                if self.undo.iter().any(|(_, u)| matches!(u, Undo::Listener { .. })) {
                    // One listener stays: the hosts need a way in.
                    true
                } else {
                    let a = self.c.addrs[addr].to_string();
                    let ok = self.ctl(&["remove-listener", "--address", &a]);
                    if ok {
                        let at = self.later();
                        self.undo.push((at, Undo::Listener { addr }));
                    }
                    ok
                }
            }
            Fault::Ana => {
                let addr = self.rng.random_range(0..2usize);
                let listener_gone = self
                    .undo
                    .iter()
                    .any(|(_, u)| matches!(u, Undo::Listener { addr: a } if *a == addr));
                if listener_gone
                    || self
                        .undo
                        .iter()
                        .any(|(_, u)| matches!(u, Undo::Ana { addr: a, .. } if *a == addr))
                {
                    true
                } else {
                    let a = self.c.addrs[addr].to_string();
                    let st = ["inaccessible", "change", "non-optimized"][self.rng.random_range(0..3)];
                    let ok = self.ctl(&["set-ana-state", &a, "1", st]);
                    if ok {
                        let at = self.later();
                        self.undo.push((at, Undo::Ana { addr, group: 1 }));
                    }
                    ok
                }
            }
            Fault::HostReset | Fault::ClientCut => {
                let w = self.rng.random_range(0..self.c.orders.len());
                self.c.orders[w].store(if f == Fault::HostReset { 2 } else { 1 }, Ordering::Relaxed);
                true
            }
            Fault::Storm => {
                let addr = self.c.addrs[self.rng.random_range(0..2usize)];
                let n = self.rng.random_range(50..300u32);
                self.side.push(std::thread::spawn(move || storm(addr, n)));
                true
            }
            Fault::Chaos => {
                let addr = self.c.addrs[self.rng.random_range(0..2usize)];
                let seed = self.rng.random::<u64>();
                self.side.push(std::thread::spawn(move || chaos(addr, seed)));
                true
            }
        };
        if ok {
            *self.injected.entry(f.name()).or_default() += 1;
        } else if f == Fault::UpgradeRollback {
            self.ctl_errors += 1;
            if self.ctl_first_error.is_none() {
                self.ctl_first_error =
                    Some("an upgrade to a failing binary did not leave the old process serving".into());
            }
        }
    }

    fn run(&mut self, until: Instant) {
        while Instant::now() < until {
            let next = Instant::now() + Duration::from_millis(self.rng.random_range(50..900));
            // Undo what is due meanwhile.
            while Instant::now() < next {
                let due: Vec<usize> = (0..self.undo.len())
                    .filter(|&i| self.undo[i].0 <= Instant::now())
                    .collect();
                for i in due.into_iter().rev() {
                    let (_, u) = self.undo.remove(i);
                    self.undo_one(u);
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let f = self.pick();
            self.inject(f);
            for h in std::mem::take(&mut self.side) {
                if h.is_finished() {
                    self.side_total += h.join().unwrap_or(0);
                } else {
                    self.side.push(h);
                }
            }
        }
        for (_, u) in std::mem::take(&mut self.undo) {
            self.undo_one(u);
        }
        for h in self.side.drain(..) {
            self.side_total += h.join().unwrap_or(0);
        }
    }
}

/// Opens `n` connections, half of them past ICReq, holds them a moment and closes them.
fn storm(addr: SocketAddr, n: u32) -> u64 {
    let mut held = Vec::new();
    let mut queues = Vec::new();
    for i in 0..n {
        if i % 2 == 0 {
            if let Ok(s) = TcpStream::connect(addr) {
                held.push(s);
            }
        } else if let Ok(q) = HostQueue::initialized(addr, QueueOpts::admin(RAM_NQN, &host_nqn(99))) {
            queues.push(q);
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    (held.len() + queues.len()) as u64
}

/// Malformed PDUs on a few connections: random bytes, and after a valid ICReq headers of
/// every type with random fields and lengths.
fn chaos(addr: SocketAddr, seed: u64) -> u64 {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    let mut sent = 0;
    for _ in 0..rng.random_range(3..10) {
        let mut junk = vec![0u8; rng.random_range(1..600)];
        rng.fill_bytes(&mut junk);
        if rng.random_range(0..3) == 0 {
            let Ok(mut s) = TcpStream::connect(addr) else { continue };
            let _ = s.write_all(&junk);
            let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
            let _ = s.read(&mut [0u8; 256]);
        } else {
            let mut o = QueueOpts::admin(RAM_NQN, &host_nqn(98));
            o.timeout = Duration::from_secs(1);
            let Ok(mut q) = HostQueue::initialized(addr, o) else {
                continue;
            };
            // A plausible common header (NVMe/TCP 1.0 §3.6.1): a PDU type, flags, HLEN,
            // PDO and PLEN, random but often near the truth, then the junk.
            let pdu_type = rng.random_range(0..0x12u8);
            let hlen = [8u8, 24, 72, 128][rng.random_range(0..4)];
            let plen = if rng.random() {
                u32::from(hlen) + junk.len() as u32
            } else {
                rng.random::<u32>()
            };
            let mut pdu = vec![pdu_type, rng.random(), hlen, rng.random()];
            pdu.extend_from_slice(&plen.to_le_bytes());
            pdu.extend_from_slice(&junk);
            let _ = q.send_raw(&pdu);
            let _ = q.recv_raw(Duration::from_millis(200));
        }
        sent += 1;
    }
    sent
}

// ------------------------------------------------------------------ the campaign

fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

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

fn conf(dir: &Path, addrs: &[SocketAddr; 2], sock: &Path, nss: &[Ns]) -> String {
    let hosts = |ns: &Ns| {
        ns.workers
            .iter()
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
fn read_back(c: &Shared, ns: usize) -> Result<u64, String> {
    let n = &c.nss[ns];
    let mut o = ControllerOpts::new(n.nqn, &host_nqn(n.workers[0]), 1, 32);
    o.timeout = Duration::from_secs(10);
    let mut ctrl = Controller::connect_with(c.addrs[0], &o)
        .or_else(|_| Controller::connect_with(c.addrs[1], &o))
        .map_err(|e| format!("the final read-back cannot connect to {}: {e}", n.nqn))?;
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
            .map_err(|e| format!("the final read of {} LBA {lba} failed: {e}", n.nqn))?;
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
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let bin = std::env::var("POLLUX_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root.join("build/release/pollux"));
    let out_dir = std::env::var("POLLUX_BENCH_OUT_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root.join("build/bench"));
    let dir = std::env::var("FAULTS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| out_dir.join("faults-run"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::create_dir_all(&out_dir).unwrap();
    eprintln!(
        "faults: seed {seed} ({} s; replay with FAULTS_SEED={seed}), files in {}",
        duration.as_secs(),
        dir.display()
    );

    let addrs = [free_port(), free_port()];
    let sock = dir.join("pollux.sock");
    let nss = vec![
        Ns {
            nqn: RAM_NQN,
            nsid: 1,
            survives_crash: false,
            workers: vec![0, 1, 2],
        },
        Ns {
            nqn: FILE_NQN,
            nsid: 1,
            survives_crash: true,
            workers: vec![3, 4, 5],
        },
    ];
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
    };
    target.start(&addrs);

    // Identify: the block size and whether a volatile write cache is reported.
    let mut hist = Vec::new();
    let mut block = 0usize;
    for (i, n) in nss.iter().enumerate() {
        let mut c = Controller::connect(
            addrs[0],
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
        hist.push(Mutex::new(History::new(i as u32, id.nsze, vwc, n.survives_crash)));
        let _ = c.shutdown();
    }
    let workers = 6;
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
        read_floor: (0..workers).map(|_| AtomicU64::new(u64::MAX)).collect(),
        orders: (0..workers).map(|_| AtomicU8::new(0)).collect(),
    });
    let mut handles = Vec::new();
    for w in 0..workers {
        let ns = shared.nss.iter().position(|n| n.workers.contains(&w)).unwrap();
        // Hosts 0 and 3 use both listeners at once (two paths); the others one each.
        let addrs_of: Vec<usize> = if w % 3 == 0 { vec![0, 1] } else { vec![w % 2] };
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
                    pending: HashMap::new(),
                    tag: 0,
                })
                .collect(),
            turn: w,
        };
        handles.push(std::thread::spawn(move || wk.run()));
    }
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

    // The final read-back: every block of every namespace.
    let mut final_blocks = 0;
    let mut final_error = None;
    for ns in 0..shared.nss.len() {
        match read_back(&shared, ns) {
            Ok(n) => final_blocks += n,
            Err(e) => {
                eprintln!("faults: {e}");
                final_error = Some(e);
            }
        }
    }
    let rss_end = nemesis.target.rss_kib();
    let stopped = nemesis.target.stop();
    let log = std::fs::read_to_string(&nemesis.target.log).unwrap_or_default();
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
        "faults: seed {seed}, {} s: {faults_total} faults ({}); {} writes acknowledged ({} refused, {} unknown), \
         {} reads ({} blocks) checked, {final_blocks} blocks read back; violations {n_viol} (lost {}, stale {}, torn {}, \
         misplaced {}, phantom {}), hangs {hangs}, panics {panics}; RSS {} -> {} KiB (pollux started {} times)",
        duration.as_secs(),
        kinds.join(", "),
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
