//! The nemesis: faults injected at random moments from a seed, several at once, and undone
//! after a random while.

use std::collections::BTreeMap;
use std::io::{Read, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use pollux_host::{HostQueue, QueueOpts};
use pollux_nvme::spec::Status;
use rand::rngs::Xoshiro256PlusPlus;
use rand::{Rng, RngExt, SeedableRng};

use super::process::CtlFailed;
use super::*;

/// The faults the nemesis injects. Each has a weight; those with an undo are undone after
/// a random while, so several overlap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Fault {
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
    /// A host takes Write Exclusive on a namespace while the workers write (their writes are
    /// refused: Reservation Conflict), holds it, and releases it, or a second host preempts
    /// it with abort (the first host's commands aborted) and then clears.
    Reserve,
    /// `kill -9` of a gateway of the rbd part, restarted later.
    GatewayKill,
    /// A gateway paused (SIGSTOP) with writes in flight, continued later.
    GatewayPause,
    /// The Ceph monitor, the OSD or both paused, resumed later.
    CephPause,
    /// The Ceph monitor or the OSD stopped and started again (the OSD saves its memstore as
    /// it stops and loads it as it starts: its objects survive, as on a disk).
    CephRestart,
    /// The rbd image grown under its namespace.
    Grow,
}

impl Fault {
    pub(crate) const ALL: [(Fault, u32); 19] = [
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
        (Fault::Reserve, 5),
        (Fault::GatewayKill, 3),
        (Fault::GatewayPause, 3),
        (Fault::CephPause, 3),
        (Fault::CephRestart, 1),
        (Fault::Grow, 2),
    ];

    /// Faults of the rbd part.
    fn of_rbd(self) -> bool {
        matches!(
            self,
            Fault::GatewayKill | Fault::GatewayPause | Fault::CephPause | Fault::CephRestart | Fault::Grow
        )
    }

    pub(crate) fn name(self) -> &'static str {
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
            Fault::Reserve => "reserve",
            Fault::GatewayKill => "gateway_kill",
            Fault::GatewayPause => "gateway_pause",
            Fault::CephPause => "ceph_pause",
            Fault::CephRestart => "ceph_restart",
            Fault::Grow => "rbd_grow",
        }
    }
}

/// A fault's effect to take back, and when.
#[derive(Debug)]
pub(crate) enum Undo {
    Mask { ns: usize, host: usize },
    Qos { ns: usize },
    Listener { addr: usize },
    Ana { addr: usize, group: u32 },
    GatewayRestart { gw: usize },
    GatewayCont { gw: usize },
    CephResume,
}

pub(crate) struct Nemesis {
    pub(crate) c: Arc<Shared>,
    pub(crate) target: Target,
    pub(crate) rng: Xoshiro256PlusPlus,
    pub(crate) undo: Vec<(Instant, Undo)>,
    pub(crate) injected: BTreeMap<&'static str, u64>,
    pub(crate) ctl_errors: u64,
    pub(crate) ctl_first_error: Option<String>,
    pub(crate) bad_bin: PathBuf,
    pub(crate) side: Vec<std::thread::JoinHandle<u64>>,
    /// What the side threads (storms, chaos) did: connections, malformed PDUs sent.
    pub(crate) side_total: u64,
    /// The rbd part's cluster and gateways, when it runs.
    pub(crate) rbd: Option<super::rbd::Rbd>,
    /// The reservation fault's thread, while it runs: how many reservations it took.
    pub(crate) reserving: Option<std::thread::JoinHandle<u64>>,
    /// Reservations the reservation faults took (Write Exclusive acquired or preempted).
    pub(crate) reserved: u64,
}

impl Nemesis {
    pub(crate) fn ctl(&mut self, args: &[&str]) -> bool {
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

    pub(crate) fn undo_one(&mut self, u: Undo) {
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
            Undo::GatewayRestart { gw } => {
                if let Some(r) = self.rbd.as_mut() {
                    r.restart(gw);
                }
            }
            Undo::GatewayCont { gw } => {
                if let Some(r) = self.rbd.as_mut() {
                    r.cont(gw);
                }
            }
            Undo::CephResume => {
                if let Some(r) = self.rbd.as_ref() {
                    r.ceph("resume", "");
                }
            }
            Undo::Ana { addr, group } => {
                let a = self.c.addrs[addr].to_string();
                self.ctl(&["set-ana-state", &a, &group.to_string(), "optimized"]);
            }
        }
    }

    pub(crate) fn pick(&mut self) -> Fault {
        let rbd = self.rbd.is_some();
        let all: Vec<(Fault, u32)> = Fault::ALL.into_iter().filter(|(f, _)| rbd || !f.of_rbd()).collect();
        let total: u32 = all.iter().map(|f| f.1).sum();
        let mut r = self.rng.random_range(0..total);
        for (f, w) in all {
            if r < w {
                return f;
            }
            r -= w;
        }
        Fault::Mode
    }

    pub(crate) fn later(&mut self) -> Instant {
        Instant::now() + Duration::from_millis(self.rng.random_range(200..2500))
    }

    pub(crate) fn inject(&mut self, f: Fault) {
        // The main pollux's namespaces (the control-plane faults are its).
        let local: Vec<usize> = (0..self.c.nss.len()).filter(|&i| !self.c.nss[i].gateway).collect();
        let ns = local[self.rng.random_range(0..local.len())];
        let (nqn, nsid) = (self.c.nss[ns].nqn, self.c.nss[ns].nsid.to_string());
        let ok = match f {
            Fault::Kill => {
                self.target.kill9();
                let t = self.c.now();
                for (i, h) in self.c.hist.iter().enumerate() {
                    if !self.c.nss[i].gateway {
                        h.lock().unwrap().crashed(t);
                    }
                }
                // Whatever the control plane changed is gone with the process.
                self.undo.retain(|(_, u)| {
                    matches!(
                        u,
                        Undo::GatewayRestart { .. } | Undo::GatewayCont { .. } | Undo::CephResume
                    )
                });
                std::thread::sleep(Duration::from_millis(self.rng.random_range(0..400)));
                self.target.start(&self.c.addrs[..2]);
                true
            }
            Fault::Upgrade => {
                let ok = self.ctl(&["upgrade"]);
                // Remember the new process (a later kill ends it).
                let _ = self.target.pid();
                ok
            }
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
            Fault::GatewayKill | Fault::GatewayPause | Fault::CephPause | Fault::CephRestart | Fault::Grow => {
                self.inject_rbd(f)
            }
            Fault::Chaos => {
                let addr = self.c.addrs[self.rng.random_range(0..2usize)];
                let seed = self.rng.random::<u64>();
                self.side.push(std::thread::spawn(move || chaos(addr, seed)));
                true
            }
            Fault::Reserve => {
                // One reservation at a time per campaign: the hosts' keys are fixed.
                if self.reserving.as_ref().is_some_and(|r| !r.is_finished()) {
                    true
                } else {
                    if let Some(h) = self.reserving.take() {
                        self.reserved += h.join().unwrap_or(0);
                    }
                    let addrs = self.c.addrs[..2].to_vec();
                    let (hold, preempt) = (
                        Duration::from_millis(self.rng.random_range(200..2500)),
                        self.rng.random::<bool>(),
                    );
                    let nqn = self.c.nss[ns].nqn;
                    self.reserving = Some(std::thread::spawn(move || reserve(&addrs, nqn, hold, preempt)));
                    true
                }
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

    /// A fault of the rbd part.
    fn inject_rbd(&mut self, f: Fault) -> bool {
        let gw = self.rng.random_range(0..2usize);
        let for_ms = |rng: &mut Xoshiro256PlusPlus, lo: u64, hi: u64| {
            Instant::now() + Duration::from_millis(rng.random_range(lo..hi))
        };
        let Some(r) = self.rbd.as_mut() else { return false };
        match f {
            Fault::GatewayKill => {
                if r.dead[gw] {
                    return true;
                }
                r.kill(gw);
                let at = for_ms(&mut self.rng, 300, 5000);
                self.undo.push((at, Undo::GatewayRestart { gw }));
                true
            }
            Fault::GatewayPause => {
                if !r.pause(gw) {
                    return true;
                }
                // Sometimes past the group's grace (1.5 s): the other gateway fences it.
                let at = for_ms(&mut self.rng, 500, 6000);
                self.undo.push((at, Undo::GatewayCont { gw }));
                true
            }
            Fault::CephPause => {
                if self.undo.iter().any(|(_, u)| matches!(u, Undo::CephResume)) {
                    return true;
                }
                let which = ["mon", "osd", ""][self.rng.random_range(0..3)];
                let ok = r.ceph("pause", which);
                let at = for_ms(&mut self.rng, 500, 6000);
                self.undo.push((at, Undo::CephResume));
                ok
            }
            Fault::CephRestart => {
                // A daemon starts by meeting the other: not while one is paused.
                if self.undo.iter().any(|(_, u)| matches!(u, Undo::CephResume)) {
                    return true;
                }
                let which = ["mon", "osd"][self.rng.random_range(0..2)];
                r.ceph("restart", which)
            }
            _ => {
                // `rbd resize` waits for the cluster: not while it is paused.
                if self.undo.iter().any(|(_, u)| matches!(u, Undo::CephResume)) {
                    return true;
                }
                let mib = self.rng.random_range(1..4u64);
                r.grow(mib)
            }
        }
    }

    pub(crate) fn run(&mut self, until: Instant) {
        while Instant::now() < until {
            let next = Instant::now() + Duration::from_millis(self.rng.random_range(50..900));
            // Undo what is due meanwhile.
            while Instant::now() < next {
                let due: Vec<usize> = (0..self.undo.len())
                    .filter(|&i| self.undo[i].0 <= Instant::now())
                    .collect();
                let ceph_paused = self.undo.iter().any(|(_, u)| matches!(u, Undo::CephResume));
                for i in due.into_iter().rev() {
                    let (_, u) = self.undo.remove(i);
                    // A gateway starts by opening its image: not while the cluster is paused
                    // (the undo that resumes it runs on this thread).
                    if ceph_paused && matches!(u, Undo::GatewayRestart { .. }) {
                        self.undo.push((Instant::now() + Duration::from_millis(100), u));
                        continue;
                    }
                    // An ANA state on a listener removed meanwhile waits for the listener.
                    if let Undo::Ana { addr, .. } = u
                        && self
                            .undo
                            .iter()
                            .any(|(_, l)| matches!(l, Undo::Listener { addr: a } if *a == addr))
                    {
                        self.undo.push((Instant::now() + Duration::from_millis(100), u));
                        continue;
                    }
                    self.undo_one(u);
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let f = self.pick();
            *self.c.nemesis_log.lock().unwrap() = (f.name(), Instant::now());
            self.inject(f);
            for h in std::mem::take(&mut self.side) {
                if h.is_finished() {
                    self.side_total += h.join().unwrap_or(0);
                } else {
                    self.side.push(h);
                }
            }
        }
        // The cluster and listeners first: a gateway's start needs the one, an ANA state is
        // set on the other.
        let mut rest = std::mem::take(&mut self.undo);
        rest.sort_by_key(|(_, u)| !matches!(u, Undo::Listener { .. } | Undo::CephResume));
        for (_, u) in rest {
            self.undo_one(u);
        }
        if let Some(r) = self.rbd.as_mut() {
            r.heal();
        }
        for h in self.side.drain(..) {
            self.side_total += h.join().unwrap_or(0);
        }
        if let Some(h) = self.reserving.take() {
            self.reserved += h.join().unwrap_or(0);
        }
    }
}

/// Opens `n` connections, half of them past ICReq, holds them a moment and closes them.
pub(crate) fn storm(addr: SocketAddr, n: u32) -> u64 {
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
pub(crate) fn chaos(addr: SocketAddr, seed: u64) -> u64 {
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

/// The hosts of the reservation fault (their NQNs are [`host_nqn`] of these).
pub(crate) const RESERVERS: [usize; 2] = [96, 97];

/// A reservation command (NVMe 2.0 §7.6-7.8) on namespace 1 with its key data: its status.
fn resv(c: &mut pollux_host::Controller, sqe: pollux_nvme::spec::Sqe, keys: &[u64]) -> Result<Status, String> {
    c.io[0]
        .exec(sqe, pollux_host::Data::ToCtrl(pollux_host::sqe::resv_keys(keys)))
        .map(|d| d.status)
        .map_err(|e| e.to_string())
}

/// Reservation Register: RREGA `action` with CRKEY `crkey`, NRKEY `nrkey`.
fn resv_register(
    c: &mut pollux_host::Controller,
    action: u32,
    iekey: bool,
    crkey: u64,
    nrkey: u64,
) -> Result<Status, String> {
    resv(c, pollux_host::sqe::resv_register(1, action, iekey, 0), &[crkey, nrkey])
}

/// Register `key` for this host: Register (RREGA 0), or, when the host is registered
/// already with another key (an earlier run cut short), Replace ignoring the current key
/// (RREGA 2 with IEKEY). Whether it is registered with `key` now.
fn resv_register_key(c: &mut pollux_host::Controller, key: u64) -> bool {
    match resv_register(c, 0, false, 0, key) {
        Ok(s) if s.is_success() => true,
        Ok(_) => resv_register(c, 2, true, 0, key).is_ok_and(|s| s.is_success()),
        Err(_) => false,
    }
}

/// Reservation Acquire: RACQA `action`, RTYPE `rtype`, with CRKEY `crkey`, PRKEY `prkey`.
fn resv_acquire(
    c: &mut pollux_host::Controller,
    action: u32,
    rtype: u8,
    crkey: u64,
    prkey: u64,
) -> Result<Status, String> {
    resv(c, pollux_host::sqe::resv_acquire(1, action, rtype), &[crkey, prkey])
}

/// Reservation Release: RRELA `action` (0 release, 1 clear) of type `rtype`, CRKEY `crkey`.
fn resv_release(c: &mut pollux_host::Controller, action: u32, rtype: u8, crkey: u64) -> Result<Status, String> {
    resv(c, pollux_host::sqe::resv_release(1, action, rtype), &[crkey])
}

/// The reservation fault on namespace 1 of `nqn`: host RESERVERS[0] registers and takes
/// Write Exclusive while the workers write, holds it for `hold`, then releases it; or
/// (`preempt`) host RESERVERS[1] registers and preempts it with abort (NVMe 2.0 §8.19.7:
/// the first host's commands aborted, its registration gone). Whatever happened on the way
/// (a kill or an upgrade of the target meanwhile), it ends by clearing the namespace's
/// reservations through a fresh controller. How many reservations it took.
pub(crate) fn reserve(addrs: &[SocketAddr], nqn: &str, hold: Duration, preempt: bool) -> u64 {
    const K1: u64 = 0x7e5e_0000_0000_0001;
    const K2: u64 = 0x7e5e_0000_0000_0002;
    const WRITE_EXCLUSIVE: u8 = 1;
    let connect = |w: usize| {
        let mut o = pollux_host::ControllerOpts::new(nqn, &host_nqn(w), 1, 16);
        o.timeout = Duration::from_secs(10);
        addrs
            .iter()
            .find_map(|&a| pollux_host::Controller::connect_with(a, &o).ok())
    };
    let mut took = 0;
    let mut run = || -> Option<()> {
        let mut h1 = connect(RESERVERS[0])?;
        resv_register_key(&mut h1, K1).then_some(())?;
        if resv_acquire(&mut h1, 0, WRITE_EXCLUSIVE, K1, 0).ok()?.is_success() {
            took += 1;
        }
        std::thread::sleep(hold);
        if preempt {
            let mut h2 = connect(RESERVERS[1])?;
            resv_register_key(&mut h2, K2).then_some(())?;
            // Preempt and abort (RACQA 2) of K1's holder: h2 holds it now.
            if resv_acquire(&mut h2, 2, WRITE_EXCLUSIVE, K2, K1).ok()?.is_success() {
                took += 1;
            }
            std::thread::sleep(hold / 2);
            resv_release(&mut h2, 0, WRITE_EXCLUSIVE, K2).ok()?;
            let _ = h2.shutdown();
        } else {
            resv_release(&mut h1, 0, WRITE_EXCLUSIVE, K1).ok()?;
        }
        let _ = h1.shutdown();
        Some(())
    };
    let _ = run();
    // Clear whatever is left (Release action 1: every registration and the reservation).
    for _ in 0..20 {
        if let Some(mut c) = connect(RESERVERS[0])
            && resv_register_key(&mut c, K1)
            && resv_release(&mut c, 1, 0, K1).is_ok_and(|s| s.is_success())
        {
            let _ = c.shutdown();
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    took
}
