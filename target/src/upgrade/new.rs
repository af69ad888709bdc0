//! The new process's side of a hot upgrade: `pollux --takeover FD` (see [`super`] for the
//! steps). It starts from the state the old process hands it and serves only once the old
//! one commits; until then it touches no socket it was given, and on any failure it exits
//! at once without closing them (the old process serves on).

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use pollux_conf::Config;
use tracing::{error, info, warn};

use super::reactors::{self, on_all, on_one};
use super::state::{ConnState, FORMAT, Hello, Msg, OLDEST_READ, Prepare};
use super::wire::Wire;
use super::{STEP_LIMIT, UpgradeError};
use crate::backend::{Backend, StoreError};
use crate::controller::QueueRef;
use crate::{Options, Target};

/// Namespaces' stores handed over (descriptor, kind, size), by (subsystem, nsid), taken as
/// the namespaces are built.
type Stores = HashMap<(String, u32), (OwnedFd, String, u64)>;
static STORES: Mutex<Option<Stores>> = Mutex::new(None);

/// Namespace `nsid` of `nqn`'s store, if the old process handed it over: a RAM disk mapping
/// the same memory (its content as the old process left it), a file namespace on the same
/// open file (its lock with it). None: open it as the conf says.
pub fn inherited_store(nqn: &str, n: &pollux_conf::Namespace) -> Option<Result<Box<dyn Backend>, StoreError>> {
    let mut guard = STORES.lock().unwrap_or_else(|p| p.into_inner());
    let stores = guard.as_mut()?;
    let key = (nqn.to_string(), n.nsid);
    match (&n.backend, stores.get(&key)) {
        (pollux_conf::Backend::Ram { size }, Some((_, kind, len))) if kind == "ram" => {
            if len != size {
                // Resized in the conf meanwhile: a new, empty disk (as a restart would give).
                warn!(
                    nqn,
                    nsid = n.nsid,
                    was = len,
                    now = size,
                    "upgrade: RAM namespace size changed; not taking its memory"
                );
                return None;
            }
            let (fd, _, len) = stores.remove(&key)?;
            Some(crate::backend::RamDisk::adopt(fd, len).map(|d| Box::new(d) as Box<dyn Backend>))
        }
        (pollux_conf::Backend::File(f), Some((_, kind, _))) if kind == "file" => {
            let (fd, _, _) = stores.remove(&key)?;
            Some(
                crate::backend::file::FileDisk::open_or_adopt(
                    &f.path,
                    f.size,
                    f.direct,
                    f.shared,
                    n.block_size,
                    Some(std::fs::File::from(fd)),
                )
                .map(|d| Box::new(d) as Box<dyn Backend>),
            )
        }
        _ => None,
    }
}

/// What the target of a new process takes instead of binding (see [`Target::start_with`]).
#[derive(Debug, Default)]
pub struct Inherited {
    /// Listening sockets by the address their `[[listener]]` names.
    pub listeners: HashMap<SocketAddr, TcpListener>,
    /// Start with every listener paused (until the old process commits).
    pub paused: bool,
}

/// The control endpoints of a new process: those the old one handed over, served once the
/// new process serves the queues. The control plane, above the upgrade, says how
/// ([`crate::control::Bound`] does), so that the upgrade does not name it.
pub trait TakeoverControl: Sized {
    /// What serves them.
    type Server;
    /// Why they could not be served.
    type Error: std::fmt::Display;
    /// The endpoints handed over (`socket`, `metrics`); one the conf `c` names that did not
    /// come is bound here.
    fn inherited(
        socket: Option<(UnixListener, PathBuf)>,
        metrics: Option<TcpListener>,
        c: &pollux_conf::Control,
    ) -> Self;
    /// Serve them for `target` (its conf's `[reactors]` is `reactors`).
    fn serve(self, target: &Target, reactors: &pollux_conf::Reactors) -> Result<Self::Server, Self::Error>;
}

/// A target started by a takeover, serving, with its control endpoints.
pub struct TakenOver<C: TakeoverControl> {
    /// The target.
    pub target: Target,
    /// Its control server (None: no `[control]` endpoints).
    pub control: Option<C::Server>,
    /// Its conf's reactor settings, for later.
    pub config: Config,
}

/// Take over from the process at the other end of `fd`, its control endpoints served by `C`.
/// Err: the takeover did not happen (the old process serves on); the caller exits at once,
/// without running destructors.
pub fn takeover<C: TakeoverControl>(fd: RawFd) -> Result<TakenOver<C>, UpgradeError> {
    // SAFETY: the old process started this one with its end of the handover socket at `fd`
    // (`--takeover`), owned by nothing else here.
    let wire = Wire::new(unsafe { OwnedFd::from_raw_fd(fd) });
    wire.send(
        &Msg::Hello(Hello {
            version: crate::VERSION.into(),
            commit: crate::BUILD_COMMIT.into(),
            pid: std::process::id(),
            oldest_read: OLDEST_READ,
            newest_read: newest_read(),
        }),
        &[],
    )?;
    let (msg, fds) = wire.recv(STEP_LIMIT)?;
    let prepare = match msg {
        Msg::Prepare(p) => p,
        Msg::Refuse(why) => return Err(UpgradeError::Refused(why)),
        m => {
            return Err(UpgradeError::Protocol(format!(
                "expected Prepare, got {}",
                super::old::msg_name(&m)
            )));
        }
    };
    let refuse = |e: UpgradeError| {
        let _ = wire.send(&Msg::Refuse(e.to_string()), &[]);
        e
    };
    if !(OLDEST_READ..=newest_read()).contains(&prepare.format) {
        return Err(refuse(UpgradeError::Format {
            ours: prepare.format,
            oldest: OLDEST_READ,
            newest: newest_read(),
        }));
    }
    fail_at("prepare");
    let mut fds: Vec<Option<OwnedFd>> = fds.into_iter().map(Some).collect();
    let (target, bound, cfg) = start::<C>(&prepare, &mut fds).map_err(refuse)?;
    wire.send(&Msg::Prepared, &[])?;
    info!(from = %prepare.from_version, commit = %prepare.from_commit, "upgrade: started from the handed state; waiting for the queues");

    let (msg, fds) = wire.recv(STEP_LIMIT)?;
    let handover = match msg {
        Msg::Handover(h) => h,
        Msg::Refuse(why) => return Err(UpgradeError::Refused(why)),
        m => {
            return Err(UpgradeError::Protocol(format!(
                "expected Handover, got {}",
                super::old::msg_name(&m)
            )));
        }
    };
    fail_at("handover");
    let t0 = Instant::now();
    let shared = target.shared().clone();
    let remotes = target.runtime().remotes();
    // The NVMe devices the old process let go of: brought up here, their namespaces added
    // as a run-time change would (no controller is here yet to be told).
    let mut devices_ms = 0.0;
    if *shared.config.lock().unwrap_or_else(|p| p.into_inner()) != cfg {
        let d0 = Instant::now();
        crate::mutate::reconcile(&shared, &remotes, cfg.clone())
            .map_err(|e| refuse(UpgradeError::Start(format!("bringing up the NVMe devices: {e}"))))?;
        devices_ms = d0.elapsed().as_secs_f64() * 1e3;
        info!(ms = format!("{devices_ms:.1}"), "upgrade: NVMe devices brought up");
    }
    restore_reservations(&shared, &handover.reservations);
    let opens = on_one(&remotes, 0, STEP_LIMIT, |r| reactors::listeners(r, true))?;
    let opens: Arc<HashMap<SocketAddr, _>> = Arc::new(opens.into_iter().map(|(a, _, o)| (a, o)).collect());
    let mut fds: Vec<Option<OwnedFd>> = fds.into_iter().map(Some).collect();
    let mut per: Vec<Vec<(ConnState, OwnedFd)>> = (0..remotes.len()).map(|_| Vec::new()).collect();
    let mut refused = Vec::new();
    let n = handover.queues.len();
    for q in handover.queues {
        let Some(fd) = fds.get_mut(q.transport.fd).and_then(Option::take) else {
            refused.push(format!("queue serial {}: its socket did not come", q.queue.serial));
            continue;
        };
        match per.get_mut(q.queue.reactor) {
            Some(v) => v.push((q, fd)),
            None => refused.push(format!(
                "queue serial {}: reactor {} does not exist",
                q.queue.serial, q.queue.reactor
            )),
        }
    }
    let started = shared.started;
    let mut at: HashMap<u64, QueueRef> = HashMap::new();
    for (i, queues) in per.into_iter().enumerate() {
        let (sh, opens) = (shared.clone(), opens.clone());
        let (done, no) = on_one(&remotes, i, STEP_LIMIT, move |r| {
            reactors::install(r, queues, &sh, started, &opens)
        })?;
        at.extend(done);
        refused.extend(no);
    }
    wire.send(
        &Msg::Ready {
            queues: at.len(),
            refused,
            devices_ms,
        },
        &[],
    )?;
    fail_at("ready");
    match wire.recv(STEP_LIMIT)? {
        (Msg::Commit, _) => {}
        (Msg::Refuse(why), _) => return Err(UpgradeError::Refused(why)),
        (m, _) => {
            return Err(UpgradeError::Protocol(format!(
                "expected Commit, got {}",
                super::old::msg_name(&m)
            )));
        }
    }
    fail_at("commit");
    // Say so before touching any socket: until the old process has this, it may still take
    // everything back (it does if this process dies first).
    wire.send(&Msg::Serving, &[])?;
    // Committed: the old process touches nothing again. Serve.
    let at = Arc::new(at);
    on_all(&remotes, STEP_LIMIT, move |r| reactors::commit(r, &at))?;
    on_one(&remotes, 0, STEP_LIMIT, |r| {
        reactors::listeners(r, false);
    })?;
    let control = match bound.serve(&target, &cfg.reactors) {
        Ok(c) => Some(c),
        Err(e) => {
            error!("upgrade: serving, but the control endpoints could not start: {e}");
            None
        }
    };
    super::notify_systemd(std::process::id());
    info!(
        queues = n,
        resume_ms = format!("{:.1}", t0.elapsed().as_secs_f64() * 1e3),
        "upgrade: serving every queue handed over"
    );
    Ok(TakenOver {
        target,
        control,
        config: cfg,
    })
}

/// The newest format this binary reads: [`FORMAT`], or less where a test makes it play an
/// older binary (`POLLUX_UPGRADE_NEWEST_FORMAT`).
fn newest_read() -> u32 {
    std::env::var("POLLUX_UPGRADE_NEWEST_FORMAT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(FORMAT)
}

/// Fault injection for the rollback tests: `POLLUX_UPGRADE_FAIL_AT=STEP` makes the new
/// process die (abort) at that step: `prepare`, `handover`, `ready` or `commit`.
fn fail_at(step: &str) {
    if std::env::var("POLLUX_UPGRADE_FAIL_AT").is_ok_and(|v| v == step) {
        error!(step, "upgrade: POLLUX_UPGRADE_FAIL_AT: dying here");
        std::process::abort();
    }
}

/// Build the target from `p`, its listeners paused, and the control endpoints (not served
/// yet).
fn start<C: TakeoverControl>(p: &Prepare, fds: &mut [Option<OwnedFd>]) -> Result<(Target, C, Config), UpgradeError> {
    let mut take = |i: usize| {
        fds.get_mut(i)
            .and_then(Option::take)
            .ok_or_else(|| UpgradeError::Protocol(format!("descriptor {i} did not come")))
    };
    let mut cfg = match &p.origin {
        Some(path) => Config::parse_as(&p.config, &path.display().to_string(), path),
        None => Config::parse(&p.config, pollux_conf::EMBEDDED_ORIGIN),
    }
    .map_err(|e| UpgradeError::Start(format!("the running configuration: {e}")))?;
    // The old process's `-r`, which it passed on: the conf text may name another socket.
    crate::mutate::apply_control_socket_arg(&mut cfg);
    if cfg.reactors.cores.len() != p.reactors {
        return Err(UpgradeError::Start(format!(
            "{} reactors configured, {} running: a controller's id names its reactor",
            cfg.reactors.cores.len(),
            p.reactors
        )));
    }
    let mut listeners = HashMap::new();
    for l in &p.listeners {
        let sock = TcpListener::from(take(l.fd)?);
        listeners.insert(l.configured, sock);
    }
    let mut stores = HashMap::new();
    for s in &p.stores {
        stores.insert((s.subnqn.clone(), s.nsid), (take(s.fd)?, s.kind.clone(), s.len));
    }
    *STORES.lock().unwrap_or_else(|p| p.into_inner()) = Some(stores);
    let control = match &p.control {
        Some((path, i)) => Some((UnixListener::from(take(*i)?), path.clone())),
        None => None,
    };
    let metrics = match p.metrics {
        Some(i) => Some(TcpListener::from(take(i)?)),
        None => None,
    };
    crate::listener::serials_from(p.next_serial);
    // A gateway group's member goes on with its own part as it was (the group's part it
    // reads from the cluster again).
    crate::shared::group::inherit_local(p.group_local.clone());
    let inherited = Inherited {
        listeners,
        paused: true,
    };
    // NVMe devices are the old process's until it drained its queues and let go of them
    // (Handover): the target starts without their namespaces, which join at Handover.
    let mut now = cfg.clone();
    for s in &mut now.subsystems {
        s.namespaces
            .retain(|n| !matches!(n.backend, pollux_conf::Backend::Nvme(_)));
    }
    let target =
        Target::start_with(&now, Options::default(), inherited).map_err(|e| UpgradeError::Start(e.to_string()))?;
    // Stores not taken (a namespace gone from the conf) are let go.
    STORES.lock().unwrap_or_else(|p| p.into_inner()).take();
    let bound = C::inherited(control, metrics, &cfg.control);
    Ok((target, bound, cfg))
}

/// Set every namespace's reservations to the old process's.
fn restore_reservations(shared: &crate::shared::Shared, entries: &[super::state::ResvEntry]) {
    use crate::resv::{Holder, Registrant, ResvState};
    use pollux_nvme::spec::resv::ResvType;
    let snap = shared.snapshot.load_full();
    for e in entries {
        let Some(ns) = snap
            .subsystem(&e.subnqn)
            .and_then(|s| s.all_namespaces().find(|n| n.nsid == e.nsid))
        else {
            warn!(nqn = %e.subnqn, nsid = e.nsid, "upgrade: reservations of a namespace not configured here are dropped");
            continue;
        };
        let holder = match e.holder {
            Some((hostid, code)) => match ResvType::from_code(code) {
                Some(rtype) => Some(Holder { hostid, rtype }),
                None => {
                    warn!(nqn = %e.subnqn, nsid = e.nsid, code, "upgrade: unknown reservation type; the reservation is dropped");
                    None
                }
            },
            None => None,
        };
        ns.resv.restore(ResvState {
            generation: e.generation,
            registrants: e
                .registrants
                .iter()
                .map(|r| Registrant {
                    hostid: r.hostid,
                    key: r.key,
                })
                .collect(),
            holder,
            ptpl: e.ptpl,
        });
    }
}
