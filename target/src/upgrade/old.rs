//! The running process's side of a hot upgrade (see [`super`] for the steps).

use std::collections::HashSet;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use pollux_reactor::Remote;
use tracing::{info, warn};

use super::reactors::{self, on_all, on_one};
use super::state::{
    ConnState, FORMAT, Handover, ListenerFd, Msg, Prepare, RegistrantState, ResvEntry, RoleState, StoreFd,
};
use super::wire::Wire;
use super::{DEVICE_LIMIT, PAUSE_LIMIT, Report, STEP_LIMIT, UpgradeError};
use crate::shared::Shared;

/// The descriptor the new process finds its end of the handover socket at.
pub const CHILD_FD: RawFd = 3;

/// The control endpoints a new process takes over (set when they are served).
#[derive(Debug, Clone, Default)]
pub struct ControlFds {
    /// The control socket: its path and listening descriptor.
    pub socket: Option<(PathBuf, RawFd)>,
    /// The metrics listener.
    pub metrics: Option<RawFd>,
}

/// Set once the process's control endpoints are served.
pub static CONTROL_FDS: OnceLock<ControlFds> = OnceLock::new();
/// The binary this process was started from (before a package upgrade replaced it).
static OWN_BINARY: OnceLock<PathBuf> = OnceLock::new();
/// Set when an upgrade committed through the control socket: the control thread ends the
/// process once its answer is written.
pub static EXIT_AFTER_REPLY: AtomicBool = AtomicBool::new(false);

/// Environment the next process of a hot upgrade gets besides this one's (a gateway group's
/// incarnation, [`crate::gateway`]).
static SUCCESSOR_ENV: std::sync::Mutex<Vec<(&'static str, String)>> = std::sync::Mutex::new(Vec::new());

/// Give the next process of a hot upgrade `key=value` in its environment (replacing what
/// was given for `key` before).
pub fn pass_to_successor(key: &'static str, value: String) {
    let mut env = SUCCESSOR_ENV.lock().unwrap_or_else(|p| p.into_inner());
    env.retain(|(k, _)| *k != key);
    env.push((key, value));
}

/// Remember the binary this process runs (call at start, before it can be replaced).
pub fn remember_own_binary() {
    if let Ok(p) = std::env::current_exe() {
        let _ = OWN_BINARY.set(p);
    }
}

/// The binary an upgrade starts by default: the path this process was started from (which
/// a package upgrade has replaced; the kernel then calls the old file "... (deleted)").
pub fn default_binary() -> Option<PathBuf> {
    let p = OWN_BINARY.get()?;
    let s = p.to_string_lossy();
    Some(PathBuf::from(s.strip_suffix(" (deleted)").unwrap_or(&s).to_string()))
}

/// Whether an upgrade is under way (run-time conf changes wait for it).
pub fn in_progress() -> bool {
    crate::mutate::upgrading()
}

/// Upgrade to `binary`: Ok once the new process serves every queue handed over (the caller
/// then ends this process with [`exit_upgraded`], closing nothing); Err with why when the
/// upgrade was refused or rolled back (this process serves on, every connection intact).
pub fn upgrade(shared: &Arc<Shared>, remotes: &Arc<[Remote]>, binary: &Path) -> Result<Report, UpgradeError> {
    let _running = crate::mutate::Upgrading::begin().ok_or(UpgradeError::InProgress)?;
    let t0 = Instant::now();
    info!(binary = %binary.display(), "upgrade: starting the new binary");
    let (wire, child_end) = Wire::pair()?;
    let mut child = spawn(binary, child_end)?;
    let mut paused_at = None;
    let mut released = false;
    match drive(shared, remotes, &wire, &mut paused_at, &mut released, t0) {
        Ok(r) => {
            release_stores(shared, remotes);
            Ok(r)
        }
        Err(e) => {
            // Roll back: the new process goes, and everything here serves again. Whether it
            // ended by itself is learnt before it is killed: a process that closed the
            // socket is given a moment to be reaped, one that stayed silent is not said to
            // have ended (it is killed here).
            let ended = match e {
                UpgradeError::PeerGone => ended_within(&mut child, Duration::from_secs(1)),
                _ => child.try_wait().ok().flatten(),
            };
            let _ = child.kill();
            let _ = child.wait();
            let e = match (e, ended) {
                (UpgradeError::PeerGone | UpgradeError::Timeout, Some(s)) => UpgradeError::Exited {
                    status: format!(", {}", describe(&s)),
                },
                (e, _) => e,
            };
            if released {
                reopen_devices(shared);
            }
            if paused_at.is_some() {
                let _ = on_one(remotes, 0, STEP_LIMIT, |r| {
                    reactors::listeners(r, false);
                });
                let _ = on_all(remotes, STEP_LIMIT, reactors::resume);
            }
            warn!(error = %e, paused_ms = paused_at.map(|t: Instant| t.elapsed().as_secs_f64() * 1e3), "upgrade rolled back: serving on");
            Err(e)
        }
    }
}

/// The NVMe devices (VFIO, or the in-process fake controller) the namespaces are on, each
/// once.
fn nvme_devices(shared: &Shared) -> Vec<Arc<crate::backend::nvme::SsdDevice>> {
    let mut out: Vec<Arc<crate::backend::nvme::SsdDevice>> = Vec::new();
    for s in &shared.snapshot.load().subsystems {
        for ns in s.all_namespaces() {
            if let Some(n) = ns.backend.as_any().downcast_ref::<crate::backend::nvme::SsdNamespace>()
                && !out.iter().any(|d| Arc::ptr_eq(d, &n.dev))
            {
                out.push(n.dev.clone());
            }
        }
    }
    out
}

/// Every queue drained: let go of the NVMe devices for the new process, which brings them
/// up again (a VFIO group opens in one process at a time, and the queues' memory is this
/// process's). Each reactor closes its channels (on a rollback they open again on first
/// use), then each device is shut down and its VFIO handles closed. The devices and the
/// time it took (ms); none: nothing done.
fn release_devices(shared: &Shared, remotes: &[Remote]) -> Result<Option<(usize, f64)>, UpgradeError> {
    let devices = nvme_devices(shared);
    if devices.is_empty() {
        return Ok(None);
    }
    let t0 = Instant::now();
    on_all(remotes, STEP_LIMIT, crate::backend::close_channels)?;
    for d in &devices {
        d.release();
    }
    Ok(Some((devices.len(), t0.elapsed().as_secs_f64() * 1e3)))
}

/// The upgrade rolled back after the devices were let go: bring them up again here.
fn reopen_devices(shared: &Shared) {
    for d in nvme_devices(shared) {
        if let Err(e) = d.reopen() {
            tracing::error!(device = %d.name(), error = %e, "upgrade rolled back but the NVMe device cannot be brought up again: its namespaces fail I/O");
        }
    }
}

/// `child`'s exit status if it ends within `d`.
fn ended_within(child: &mut Child, d: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + d;
    loop {
        match child.try_wait() {
            Ok(Some(s)) => return Some(s),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            _ => return None,
        }
    }
}

/// `s` in words.
fn describe(s: &std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (Some(c), _) => format!("exit status {c}"),
        (None, Some(sig)) => match nix::sys::signal::Signal::try_from(sig) {
            Ok(name) => format!("killed by {}", name.as_str()),
            Err(_) => format!("killed by signal {sig}"),
        },
        _ => s.to_string(),
    }
}

/// Start `binary --takeover 3` with `child_end` as its fd 3.
fn spawn(binary: &Path, child_end: OwnedFd) -> Result<Child, UpgradeError> {
    use std::os::unix::process::CommandExt;
    let fd = child_end.as_raw_fd();
    let mut cmd = Command::new(binary);
    cmd.arg("--takeover").arg(CHILD_FD.to_string()).stdin(Stdio::null());
    if let Some(socket) = crate::mutate::control_socket_arg() {
        cmd.arg("--control-socket").arg(socket);
    }
    for (k, v) in SUCCESSOR_ENV.lock().unwrap_or_else(|p| p.into_inner()).iter() {
        cmd.env(k, v);
    }
    // SAFETY: the closure runs in the child between fork and exec and makes only
    // async-signal-safe calls (dup2, fcntl) on descriptors it owns there.
    unsafe {
        cmd.pre_exec(move || {
            if fd == CHILD_FD {
                // dup2 onto itself keeps close-on-exec: clear it.
                if libc::fcntl(fd, libc::F_SETFD, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            } else if libc::dup2(fd, CHILD_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().map_err(|source| UpgradeError::Spawn {
        path: binary.to_path_buf(),
        source,
    })?;
    // Our copy of the child's end goes: its exit is then the socket's end.
    drop(child_end);
    Ok(child)
}

/// Expect `want` from the new process (a `Refuse` is its reason).
fn expect(wire: &Wire, within: Duration, want: &str) -> Result<(Msg, Vec<OwnedFd>), UpgradeError> {
    match wire.recv(within)? {
        (Msg::Refuse(why), _) => Err(UpgradeError::Refused(why)),
        (m, fds) => {
            let name = msg_name(&m);
            if name == want {
                Ok((m, fds))
            } else {
                Err(UpgradeError::Protocol(format!("expected {want}, got {name}")))
            }
        }
    }
}

/// A message's name, for errors.
pub fn msg_name(m: &Msg) -> &'static str {
    match m {
        Msg::Hello(_) => "Hello",
        Msg::Prepare(_) => "Prepare",
        Msg::Prepared => "Prepared",
        Msg::Handover(_) => "Handover",
        Msg::Ready { .. } => "Ready",
        Msg::Commit => "Commit",
        Msg::Serving => "Serving",
        Msg::Refuse(_) => "Refuse",
    }
}

fn drive(
    shared: &Arc<Shared>,
    remotes: &Arc<[Remote]>,
    wire: &Wire,
    paused_at: &mut Option<Instant>,
    released: &mut bool,
    t0: Instant,
) -> Result<Report, UpgradeError> {
    // 1. Hello: the formats meet?
    let (hello, _) = expect(wire, STEP_LIMIT, "Hello")?;
    let Msg::Hello(hello) = hello else {
        return Err(UpgradeError::Protocol("no Hello".into()));
    };
    if !(hello.oldest_read..=hello.newest_read).contains(&FORMAT) {
        let e = UpgradeError::Format {
            ours: FORMAT,
            oldest: hello.oldest_read,
            newest: hello.newest_read,
        };
        let _ = wire.send(&Msg::Refuse(e.to_string()), &[]);
        return Err(e);
    }
    info!(pid = hello.pid, version = %hello.version, commit = %hello.commit, "upgrade: the new process answered");

    // 2. Prepare: conf, listeners, control endpoints, RAM memory.
    let (prepare, fds) = prepare(shared, remotes)?;
    wire.send(&Msg::Prepare(Box::new(prepare)), &fds)?;
    expect(wire, STEP_LIMIT, "Prepared")?;

    // 3. Pause at a command boundary.
    let pause_t0 = Instant::now();
    *paused_at = Some(pause_t0);
    on_one(remotes, 0, STEP_LIMIT, |r| {
        reactors::listeners(r, true);
    })?;
    let taken = pause_all(remotes, pause_t0)?;
    let paused_ms = pause_t0.elapsed().as_secs_f64() * 1e3;

    // 4. Handover: queues (an I/O queue goes only with its controller) and reservations.
    let mut queues: Vec<(ConnState, RawFd)> = Vec::new();
    let mut stayed: Vec<&'static str> = Vec::new();
    for t in taken {
        queues.extend(t.queues);
        stayed.extend(t.stayed);
    }
    let moving: HashSet<u16> = queues
        .iter()
        .filter_map(|(q, _)| match &q.queue.role {
            RoleState::Admin(c) => Some(c.cntlid),
            _ => None,
        })
        .collect();
    let mut fds = Vec::new();
    let mut states = Vec::new();
    for (mut q, fd) in queues {
        if let RoleState::Io { cntlid, .. } = &q.queue.role
            && !moving.contains(cntlid)
        {
            stayed.push("its controller's admin queue stays");
            continue;
        }
        q.transport.fd = fds.len();
        fds.push(fd);
        states.push(q);
    }
    let n = states.len();
    // NVMe devices: drained with every queue; let go of now, brought up by the new process
    // before it answers Ready.
    *released = true;
    let devices = release_devices(shared, remotes)?;
    let handover = Handover {
        format: FORMAT,
        queues: states,
        reservations: reservations(shared),
    };
    wire.send(&Msg::Handover(Box::new(handover)), &fds)?;
    let (ready, _) = expect(wire, DEVICE_LIMIT, "Ready")?;
    let mut device_init_ms = 0.0;
    if let Msg::Ready {
        refused, devices_ms, ..
    } = &ready
    {
        for r in refused {
            warn!("upgrade: the new process could not take {r}");
        }
        device_init_ms = *devices_ms;
    }

    // 5. Commit. The new process answers before it touches any socket, so until its
    // answer comes everything is still ours: if it dies or does not answer, it is killed
    // and this process takes everything back, exactly as it was paused. Once it answered,
    // nothing here touches a queue again.
    wire.send(&Msg::Commit, &[])?;
    expect(wire, STEP_LIMIT, "Serving")?;
    super::notify_systemd(hello.pid);
    let mut by_reason: Vec<(String, usize)> = Vec::new();
    for s in stayed {
        match by_reason.iter_mut().find(|(r, _)| r == s) {
            Some((_, c)) => *c += 1,
            None => by_reason.push((s.to_string(), 1)),
        }
    }
    let report = Report {
        pid: hello.pid,
        version: format!("{} ({})", hello.version, hello.commit),
        queues: n,
        stayed: by_reason,
        pause_ms: pause_t0.elapsed().as_secs_f64() * 1e3,
        total_ms: t0.elapsed().as_secs_f64() * 1e3,
        devices: devices.map_or(0, |d| d.0),
        device_release_ms: devices.map_or(0.0, |d| d.1),
        device_init_ms,
    };
    info!(
        pid = report.pid,
        queues = report.queues,
        stayed = ?report.stayed,
        quiesce_ms = format!("{paused_ms:.1}"),
        pause_ms = format!("{:.1}", report.pause_ms),
        total_ms = format!("{:.1}", report.total_ms),
        devices = report.devices,
        device_release_ms = format!("{:.1}", report.device_release_ms),
        device_init_ms = format!("{:.1}", report.device_init_ms),
        "upgrade: the new process serves; this one exits"
    );
    Ok(report)
}

/// Pause every connection and take their state once all are at a boundary.
fn pause_all(remotes: &Arc<[Remote]>, t0: Instant) -> Result<Vec<reactors::Taken>, UpgradeError> {
    let mut wait = Duration::from_micros(100);
    loop {
        let standing = on_all(remotes, STEP_LIMIT, reactors::pause)?;
        let busy: usize = standing.iter().map(|s| s.busy).sum();
        if busy == 0 {
            let taken = on_all(remotes, STEP_LIMIT, reactors::take)?;
            if taken.iter().all(Option::is_some) {
                return Ok(taken.into_iter().flatten().collect());
            }
            // One moved on between the two rounds (a connection accepted just before the
            // pause): those taken are paused; look again.
        } else if t0.elapsed() >= PAUSE_LIMIT {
            let why = standing.into_iter().find_map(|s| s.why).unwrap_or_default();
            return Err(UpgradeError::NotQuiet { busy, why });
        }
        std::thread::sleep(wait);
        wait = (wait * 2).min(Duration::from_millis(2));
    }
}

/// Step 2's message and its descriptors.
fn prepare(shared: &Arc<Shared>, remotes: &Arc<[Remote]>) -> Result<(Prepare, Vec<RawFd>), UpgradeError> {
    let (config, origin) = {
        let c = shared.config.lock().unwrap_or_else(|p| p.into_inner());
        let origin = (c.origin != pollux_conf::EMBEDDED_ORIGIN).then(|| PathBuf::from(&c.origin));
        (c.document.text().to_string(), origin)
    };
    let mut fds = Vec::new();
    let snap = shared.snapshot.load_full();
    let bound = on_one(remotes, 0, STEP_LIMIT, |r| reactors::listeners(r, false))?;
    let mut listeners = Vec::new();
    for (addr, fd, _) in bound {
        let configured = snap
            .listeners
            .iter()
            .find(|l| l.addr == addr)
            .map_or(addr, |l| l.configured);
        listeners.push(ListenerFd {
            configured,
            bound: addr,
            fd: fds.len(),
        });
        fds.push(fd);
    }
    let ctl = CONTROL_FDS.get().cloned().unwrap_or_default();
    let control = ctl.socket.map(|(p, fd)| {
        fds.push(fd);
        (p, fds.len() - 1)
    });
    let metrics = ctl.metrics.map(|fd| {
        fds.push(fd);
        fds.len() - 1
    });
    let mut stores = Vec::new();
    for s in &snap.subsystems {
        for ns in s.all_namespaces() {
            let b = &ns.backend;
            let fd = match b.kind() {
                "ram" => b.memory().and_then(|d| d.memfd()),
                _ => b.handover_fd(),
            };
            if let Some(fd) = fd {
                stores.push(StoreFd {
                    subnqn: s.nqn.clone(),
                    nsid: ns.nsid,
                    kind: b.kind().to_string(),
                    len: b.len(),
                    fd: fds.len(),
                });
                fds.push(fd.as_raw_fd());
            }
        }
    }
    Ok((
        Prepare {
            format: FORMAT,
            from_version: crate::VERSION.into(),
            from_commit: crate::BUILD_COMMIT.into(),
            config,
            origin,
            reactors: shared.reactors,
            listeners,
            control,
            metrics,
            stores,
            next_serial: crate::listener::next_serial(),
            group_local: shared
                .group
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_ref()
                .map(|g| g.local.to_string()),
        },
        fds,
    ))
}

/// Every namespace's reservation state with anything in it.
fn reservations(shared: &Shared) -> Vec<ResvEntry> {
    let snap = shared.snapshot.load_full();
    let mut out = Vec::new();
    for s in &snap.subsystems {
        for ns in s.all_namespaces() {
            let st = ns.resv.state();
            if st.generation == 0 && st.registrants.is_empty() && st.holder.is_none() && !st.ptpl {
                continue;
            }
            out.push(ResvEntry {
                subnqn: s.nqn.clone(),
                nsid: ns.nsid,
                generation: st.generation,
                registrants: st
                    .registrants
                    .iter()
                    .map(|r| RegistrantState {
                        hostid: r.hostid,
                        key: r.key,
                    })
                    .collect(),
                holder: st.holder.map(|h| (h.hostid, h.rtype.code())),
                ptpl: st.ptpl,
            });
        }
    }
    out
}

/// The new process serves: let go of what this one still holds in a cluster, as a stop
/// does (its channels closed, an RBD image closed, which releases its exclusive lock, the
/// reservation object's watch ended), so that the new process's writes and the other
/// gateways' reservation changes do not wait for the cluster to time this process out.
/// Files and memory stay as they are: the new process has them.
fn release_stores(shared: &Shared, remotes: &[Remote]) {
    let (tx, rx) = std::sync::mpsc::channel();
    let mut sent = 0;
    for r in remotes {
        let tx = tx.clone();
        if r.send(move |r| {
            crate::backend::close_channels(r);
            let _ = tx.send(());
        }) {
            sent += 1;
        }
    }
    for _ in 0..sent {
        if rx.recv_timeout(Duration::from_secs(5)).is_err() {
            warn!("upgrade: a reactor did not close its channels within 5 s");
            break;
        }
    }
    for s in &shared.snapshot.load().subsystems {
        for ns in s.all_namespaces() {
            ns.resv.release_cluster();
            ns.backend.stop();
        }
    }
    crate::backend::rbd::wait_closed(Duration::from_secs(10));
}

/// End this process after an upgrade committed: no destructor runs, so no socket is shut
/// down and no file removed (the new process holds the same sockets and serves them).
pub fn exit_upgraded() -> ! {
    info!("upgrade: exiting (the new process serves)");
    std::process::exit(0)
}
