//! Changing a running target without a restart: every change (a control-socket mutation, a
//! reload of the conf file) is a new, fully validated [`Config`] reconciled against the
//! running one.
//!
//! Reconciling keeps what did not change: a namespace whose conf is unchanged keeps its
//! backend, data and counters; a subsystem whose conf is unchanged keeps its `Arc`. The new
//! [`Snapshot`] is swapped in whole (readers never lock), then every reactor refreshes the
//! controllers it owns, by message: a controller whose subsystem went away, or whose host
//! is no longer allowed, is deleted (its connections closed); one whose namespaces changed
//! gets the Changed Namespace List and a Namespace Attribute Changed AER; discovery
//! controllers get a Discovery Log Change AER when what they list changed (subsystems,
//! listeners, referrals; NVMe 2.0 §5.2, NVMe-oF 1.1 §5.3). Connections that the change does not concern are not disturbed.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};

use pollux_conf::Config;
use pollux_reactor::{MarginSleep, ModelKind, Reactor, Remote, SourceId};
use tracing::{info, warn};

use crate::ana::AnaStates;
use crate::controller::Local;
use crate::error::TargetError;
use crate::listener::Conn;
use crate::listener::Listener;
use crate::shared::Shared;
use crate::subsystem::{BoundListener, Snapshot, build_subsystem};

/// What a reconciliation changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    /// Subsystems added.
    pub added_subsystems: Vec<String>,
    /// Subsystems removed (their controllers deleted).
    pub removed_subsystems: Vec<String>,
    /// Subsystems whose hosts, identity or namespaces changed.
    pub changed_subsystems: Vec<String>,
    /// (subsystem, nsid) added.
    pub added_namespaces: Vec<(String, u32)>,
    /// (subsystem, nsid) removed.
    pub removed_namespaces: Vec<(String, u32)>,
    /// Listeners added (bound addresses).
    pub added_listeners: Vec<SocketAddr>,
    /// Listeners removed.
    pub removed_listeners: Vec<SocketAddr>,
    /// Referrals added to the discovery log.
    pub added_referrals: Vec<SocketAddr>,
    /// Referrals removed from it.
    pub removed_referrals: Vec<SocketAddr>,
    /// Listeners whose ANA states changed (bound addresses).
    pub ana_changed: Vec<SocketAddr>,
    /// (subsystem, nsid, polling) of namespaces whose polling policy changed in place
    /// (nothing is reopened for it).
    pub polling_changed: Vec<(String, u32, String)>,
    /// (subsystem, nsid) of namespaces whose hosts changed in place (attached to hosts or
    /// detached from them: nothing is reopened, only the controllers whose view changed
    /// hear of it).
    pub hosts_changed: Vec<(String, u32)>,
    /// (subsystem, nsid) of namespaces whose QoS limits changed in place (nothing is
    /// reopened, no queue dropped: [`crate::qos`]).
    pub qos_changed: Vec<(String, u32)>,
    /// The reactors' mode, adaptive policy or hybrid sleep rules changed.
    pub reactors_changed: bool,
    /// Keys that differ but only take effect at the next start.
    pub restart_needed: Vec<String>,
}

impl Changes {
    /// Nothing changed.
    pub fn is_empty(&self) -> bool {
        *self == Changes::default()
    }
}

/// The listeners reactor 0 serves, by bound address (reactor-local state).
#[derive(Debug, Default)]
pub struct Listeners {
    /// Bound address -> listener source.
    pub by_addr: HashMap<SocketAddr, SourceId>,
}

/// A subsystem's conf without its `polling` settings and its namespaces' `qos`: they apply
/// in place, so confs that differ only there are the same subsystem with the same namespaces.
fn without_polling(s: &pollux_conf::Subsystem) -> pollux_conf::Subsystem {
    let mut s = s.clone();
    s.polling = None;
    for n in &mut s.namespaces {
        n.polling = None;
        n.qos = pollux_conf::Qos::default();
    }
    s
}

/// The same namespace, whatever its `polling`, `hosts` and `qos`: all apply in place (its store,
/// data and in-flight commands stay), the hosts by a new subsystem object around it.
fn same_namespace(a: &pollux_conf::Namespace, b: &pollux_conf::Namespace) -> bool {
    let bare = |n: &pollux_conf::Namespace| pollux_conf::Namespace {
        polling: None,
        hosts: None,
        qos: pollux_conf::Qos::default(),
        ..n.clone()
    };
    a.nsid == b.nsid && bare(a) == bare(b)
}

/// Set while a hot upgrade is under way in this process ([`crate::upgrade::old`]; one at a
/// time): the running conf is what the next process starts from, so it must not change
/// under the handover.
static UPGRADING: AtomicBool = AtomicBool::new(false);

/// Whether an upgrade is under way: [`reconcile`] refuses every change meanwhile.
pub fn upgrading() -> bool {
    UPGRADING.load(SeqCst)
}

/// An upgrade under way ([`upgrading`]) until dropped, however the upgrade ends. The
/// upgrade, above this layer, holds it; run-time changes here only read it.
#[derive(Debug)]
pub struct Upgrading(());

impl Upgrading {
    /// Begin one; None: another is under way.
    pub fn begin() -> Option<Self> {
        UPGRADING
            .compare_exchange(false, true, SeqCst, SeqCst)
            .ok()
            .map(|_| Upgrading(()))
    }
}

impl Drop for Upgrading {
    fn drop(&mut self) {
        UPGRADING.store(false, SeqCst);
    }
}

/// Reconcile `new` against the running configuration and apply the difference. On error
/// nothing changes.
pub fn reconcile(shared: &Arc<Shared>, remotes: &[Remote], new: Config) -> Result<Changes, TargetError> {
    if upgrading() {
        // The running conf is what the next process starts from: it must not change under
        // the handover.
        return Err(TargetError::Upgrading);
    }
    let mut running = shared.config.lock().unwrap_or_else(|p| p.into_inner());
    let old = shared.snapshot.load_full();
    let n = shared.reactors;
    let mut ch = Changes::default();
    if new.reactors.cores != running.reactors.cores {
        ch.restart_needed.push("reactors.cores".into());
    }
    if new.reactors.policy != running.reactors.policy {
        ch.restart_needed.push("reactors.policy".into());
    }
    let margin_changed = new.reactors.hybrid_margin_us != running.reactors.hybrid_margin_us;
    let turnaround_changed = new.reactors.hybrid_turnaround != running.reactors.hybrid_turnaround;
    if new.transport != running.transport {
        ch.restart_needed.push("transport".into());
    }
    if new.keep_alive != running.keep_alive {
        ch.restart_needed.push("keep_alive".into());
    }
    if new.control != running.control {
        ch.restart_needed.push("control".into());
    }

    // Each reactor hands out its own controller ids of a subsystem's range: the conf checked
    // the range against its `cores`, which apply only at the next start.
    if let Some(s) = new
        .subsystems
        .iter()
        .find(|s| usize::from(s.max_cntlid - s.min_cntlid) + 1 < n)
    {
        return Err(TargetError::CntlidRange {
            nqn: s.nqn.clone(),
            min: s.min_cntlid,
            max: s.max_cntlid,
            reactors: n,
        });
    }

    // Subsystems and namespaces: build what is new before touching anything.
    let mut subsystems = Vec::with_capacity(new.subsystems.len());
    for s in &new.subsystems {
        let before = running
            .subsystems
            .iter()
            .find(|o| o.nqn == s.nqn)
            .zip(old.subsystem(&s.nqn));
        match before {
            Some((oc, oa)) if without_polling(oc) == without_polling(s) => subsystems.push(oa.clone()),
            Some((oc, oa)) => {
                let keep = |nsid: u32| {
                    let was = oc.namespaces.iter().find(|x| x.nsid == nsid)?;
                    let now = s.namespaces.iter().find(|x| x.nsid == nsid)?;
                    if same_namespace(was, now) {
                        oa.namespace_ignoring_masks(nsid).cloned()
                    } else {
                        None
                    }
                };
                subsystems.push(build_subsystem(
                    s,
                    n,
                    new.state_dir.as_deref(),
                    shared.adopt_store,
                    keep,
                )?);
                for nn in &s.namespaces {
                    if !oc.namespaces.iter().any(|x| same_namespace(x, nn)) {
                        ch.added_namespaces.push((s.nqn.clone(), nn.nsid));
                    }
                }
                for on in &oc.namespaces {
                    if !s.namespaces.iter().any(|x| same_namespace(x, on)) {
                        ch.removed_namespaces.push((s.nqn.clone(), on.nsid));
                    }
                }
                for nn in &s.namespaces {
                    if oc
                        .namespaces
                        .iter()
                        .any(|x| same_namespace(x, nn) && x.hosts != nn.hosts)
                    {
                        ch.hosts_changed.push((s.nqn.clone(), nn.nsid));
                    }
                }
                ch.changed_subsystems.push(s.nqn.clone());
            }
            None => {
                subsystems.push(build_subsystem(
                    s,
                    n,
                    new.state_dir.as_deref(),
                    shared.adopt_store,
                    |_| None,
                )?);
                ch.added_subsystems.push(s.nqn.clone());
            }
        }
    }
    for o in &running.subsystems {
        if !new.subsystems.iter().any(|s| s.nqn == o.nqn) {
            ch.removed_subsystems.push(o.nqn.clone());
        }
    }

    // Listeners: bind the new ones first (an address in use fails the whole change).
    let mut bound = Vec::with_capacity(new.listeners.len());
    let mut fresh = Vec::new();
    for l in &new.listeners {
        // The same listener: the same address as configured, or the address it is bound to
        // (a conf that now names the port a `:0` listener got).
        let was = running
            .listeners
            .iter()
            .position(|o| o.address == l.address)
            .or_else(|| old.listeners.iter().position(|b| b.addr == l.address));
        match was.and_then(|i| old.listeners.get(i)) {
            // A change of TLS mode takes effect for the next connection it accepts; ANA
            // states once nothing can fail any more (below).
            Some(b) => bound.push(BoundListener {
                addr: b.addr,
                configured: l.address,
                tls: l.tls,
                ana: b.ana.clone(),
                max_connections: l.max_connections,
            }),
            None => {
                let err = |source| TargetError::Listen {
                    addr: l.address,
                    source,
                };
                let sock = TcpListener::bind(l.address).map_err(err)?;
                sock.set_nonblocking(true).map_err(err)?;
                let addr = sock.local_addr().map_err(err)?;
                bound.push(BoundListener {
                    addr,
                    configured: l.address,
                    tls: l.tls,
                    ana: Arc::new(AnaStates::new(l)),
                    max_connections: l.max_connections,
                });
                ch.added_listeners.push(addr);
                fresh.push(sock);
            }
        }
    }
    for (i, o) in running.listeners.iter().enumerate() {
        let Some(b) = old.listeners.get(i) else { continue };
        if !new
            .listeners
            .iter()
            .any(|l| l.address == o.address || l.address == b.addr)
        {
            ch.removed_listeners.push(b.addr);
        }
    }
    // Referrals: none may lead back here, now that every listener is bound.
    let referrals: Vec<SocketAddr> = new.referrals.iter().map(|r| r.address).collect();
    if let Some((referral, listener)) = crate::referral::self_referral(&referrals, &bound) {
        return Err(TargetError::SelfReferral { referral, listener });
    }
    ch.added_referrals = referrals
        .iter()
        .filter(|r| !old.referrals.contains(r))
        .copied()
        .collect();
    ch.removed_referrals = old
        .referrals
        .iter()
        .filter(|r| !referrals.contains(r))
        .copied()
        .collect();
    let reactors_changed = new.reactors.mode != running.reactors.mode
        || new.reactors.cpu_budget != running.reactors.cpu_budget
        || new.reactors.latency_target_us != running.reactors.latency_target_us;
    ch.reactors_changed = reactors_changed || margin_changed || turnaround_changed;

    // Polling policies, set in place on the namespaces of the new snapshot (kept or new):
    // the reactors read them at their next command or channel run.
    let mut polling_set = Vec::new();
    for (sc, sa) in new.subsystems.iter().zip(&subsystems) {
        for nc in &sc.namespaces {
            let Some(ns) = sa.namespace_ignoring_masks(nc.nsid) else {
                continue;
            };
            let want = sc.polling_of(nc);
            if ns.polling.get() != want {
                polling_set.push((ns.clone(), want));
                if !ch.added_namespaces.iter().any(|(q, id)| *q == sc.nqn && *id == nc.nsid) {
                    ch.polling_changed.push((sc.nqn.clone(), nc.nsid, want.to_string()));
                }
            }
        }
    }

    // QoS limits likewise: a kept namespace's budget carries on under its new limits (a new
    // one was built with its own).
    let mut qos_set = Vec::new();
    for (sc, sa) in new.subsystems.iter().zip(&subsystems) {
        for nc in &sc.namespaces {
            let Some(ns) = sa.namespace_ignoring_masks(nc.nsid) else {
                continue;
            };
            if ns.qos.limits() != nc.qos {
                qos_set.push((ns.clone(), nc.qos));
                ch.qos_changed.push((sc.nqn.clone(), nc.nsid));
            }
        }
    }

    // Swap: from here on nothing can fail.
    for (ns, p) in polling_set {
        ns.polling.set(p);
    }
    for (ns, q) in qos_set {
        info!(nsid = ns.nsid, limits = ?q, "namespace QoS limits changed");
        ns.qos.set(&q);
    }
    let discovery_changed = !(ch.added_subsystems.is_empty()
        && ch.removed_subsystems.is_empty()
        && ch.changed_subsystems.is_empty()
        && ch.added_listeners.is_empty()
        && ch.removed_listeners.is_empty()
        && bound
            .iter()
            .map(|b| (b.addr, b.tls))
            .eq(old.listeners.iter().map(|b| (b.addr, b.tls)))
        && referrals == old.referrals
        && new.group_peers == old.peers);
    let snap = Arc::new(
        Snapshot::new(
            subsystems,
            bound,
            if discovery_changed { old.genctr + 1 } else { old.genctr },
            Arc::new(new.discovery.clone()),
            referrals,
        )
        .with_peers(new.group_peers.clone()),
    );
    shared.snapshot.store(snap.clone());
    // `bound` is in conf order: each listener beside its conf (a new one already has its
    // states, so nothing changes for it).
    let overlay = shared.ana_overlay.lock().unwrap_or_else(|p| p.into_inner()).clone();
    for (b, l) in snap.listeners.iter().zip(&new.listeners) {
        if b.ana.apply_over(l, &overlay) {
            info!(listener = %b.addr, "ANA states changed");
            ch.ana_changed.push(b.addr);
        }
    }

    if !fresh.is_empty() || !ch.removed_listeners.is_empty() {
        let (sh, placement, gone) = (shared.clone(), new.reactors.placement, ch.removed_listeners.clone());
        let started = shared.started;
        if let Some(r0) = remotes.first() {
            r0.send(move |r| {
                for sock in fresh {
                    let addr = sock.local_addr().ok();
                    match Listener::new(sock, sh.clone(), placement, started).register(r) {
                        Ok(id) => {
                            if let Some(a) = addr {
                                info!(address = %a, "listener added");
                                local_listeners(r).by_addr.insert(a, id);
                            }
                        }
                        Err(e) => warn!(error = %e, "cannot register a new listener"),
                    }
                }
                for a in gone {
                    if let Some(id) = local_listeners(r).by_addr.remove(&a) {
                        r.remove_source(id);
                        info!(address = %a, "listener removed (its connections stay)");
                    }
                }
            });
        }
    }
    // A gateway group's peers changing changes nothing of this gateway's own but the
    // discovery log: its discovery controllers still hear of it.
    if !ch.is_empty() || discovery_changed {
        for remote in remotes {
            let snap = snap.clone();
            remote.send(move |r| refresh_controllers(r, &snap, discovery_changed));
        }
    }
    if reactors_changed {
        let (mode, adaptive) = crate::modes_of(&new.reactors);
        for remote in remotes {
            remote.send(move |r| {
                r.set_adaptive(adaptive);
                if adaptive.is_none() {
                    r.set_mode(mode);
                }
            });
        }
    }
    if margin_changed || turnaround_changed {
        let (margin, turnaround) = crate::hybrid_of(&new.reactors);
        for remote in remotes {
            remote.send(move |r| {
                // A fresh margin sleep: with a margin given, the lateness learnt so far is
                // moot; back to the measured one, it is learnt again within a window of
                // wake-ups. The Linux half-mean baseline has no margin to set.
                if margin_changed && r.model_kind() == ModelKind::Robust {
                    r.set_sleep_policy(Box::new(MarginSleep::with_margin(margin)));
                }
                r.set_turnaround(turnaround);
            });
        }
    }
    if !ch.restart_needed.is_empty() {
        warn!(keys = ?ch.restart_needed, "these changes take effect at the next start");
    }
    info!(changes = ?ch, genctr = snap.genctr, "configuration applied");
    *running = new;
    Ok(ch)
}

/// Set the ANA states over the conf's on every listener (a gateway group's: the groups this
/// gateway took over optimized, its own inaccessible while fenced); the controllers of a
/// listener whose states changed raise an ANA change event (NVMe 2.0 §5.27.1.3). Whether
/// any changed.
pub fn set_ana_overlay(shared: &Arc<Shared>, remotes: &[Remote], overlay: crate::ana::Overlay) -> bool {
    // The config lock orders this with every conf change, which applies the overlay too.
    let running = shared.config.lock().unwrap_or_else(|p| p.into_inner());
    {
        let mut o = shared.ana_overlay.lock().unwrap_or_else(|p| p.into_inner());
        if *o == overlay {
            return false;
        }
        *o = overlay.clone();
    }
    let snap = shared.snapshot.load_full();
    let mut changed = false;
    for (b, l) in snap.listeners.iter().zip(&running.listeners) {
        if b.ana.apply_over(l, &overlay) {
            info!(listener = %b.addr, ?overlay, "ANA states changed (gateway group)");
            changed = true;
        }
    }
    drop(running);
    if changed {
        for remote in remotes {
            let snap = snap.clone();
            remote.send(move |r| refresh_controllers(r, &snap, false));
        }
    }
    changed
}

/// The control socket the process was started with on its command line (`pollux -r PATH`),
/// which overrides every conf's `[control] socket`, the re-read one's included: set once,
/// at start.
static CONTROL_SOCKET_ARG: std::sync::OnceLock<Option<std::path::PathBuf>> = std::sync::OnceLock::new();

/// Remember `pollux -r PATH` (`"none"`: no control socket) for this process's life.
pub fn set_control_socket_arg(path: &std::path::Path) {
    let _ = CONTROL_SOCKET_ARG.set((path.as_os_str() != "none").then(|| path.to_path_buf()));
}

/// The command line's control socket, as `pollux -r` takes it (`"none"`), if given.
pub fn control_socket_arg() -> Option<std::ffi::OsString> {
    CONTROL_SOCKET_ARG
        .get()
        .map(|s| s.as_ref().map_or_else(|| "none".into(), |p| p.clone().into_os_string()))
}

/// `cfg` with the command line's control socket, if the process was given one.
pub fn apply_control_socket_arg(cfg: &mut Config) {
    if let Some(socket) = CONTROL_SOCKET_ARG.get() {
        cfg.control.socket = socket.clone();
        cfg.control.socket_is_default = false;
    }
}

/// Re-read the conf file the target runs from and apply the difference (SIGHUP, `ctl
/// reload`). An invalid file changes nothing; its error names file, line and column.
pub fn reload(shared: &Arc<Shared>, remotes: &[Remote]) -> Result<Changes, TargetError> {
    let origin = shared.config.lock().unwrap_or_else(|p| p.into_inner()).origin.clone();
    if origin == pollux_conf::EMBEDDED_ORIGIN {
        return Err(TargetError::NoConfFile);
    }
    let path = std::path::Path::new(&origin);
    // A gateway group's member: the file is its own part; the group's stays as applied.
    let mut group = shared.group.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(g) = group.as_mut() {
        let text = Config::read_text(path)?;
        let (mut cfg, merged) = g.compose(&text, &g.doc, g.slot, &origin)?;
        apply_control_socket_arg(&mut cfg);
        info!(file = %origin, group_version = g.version, "reloading the configuration (the group's part as applied)");
        let ch = reconcile(shared, remotes, cfg)?;
        g.local = text;
        g.took(merged);
        return Ok(ch);
    }
    drop(group);
    let mut cfg = Config::from_path(path)?;
    apply_control_socket_arg(&mut cfg);
    info!(file = %origin, "reloading the configuration");
    reconcile(shared, remotes, cfg)
}

/// Wait, at most `within`, until every reactor has run what [`reconcile`] sent it and what
/// that sent on in turn: a controller's new view of its subsystem reaches its I/O queues on
/// other reactors by a second message. Each reactor's inbox is one FIFO queue, so two
/// rounds of a message to every reactor suffice: the first runs after the controllers'
/// refresh (sent earlier from this thread), which has queued the I/O queues' updates before
/// it answers; the second is queued after those and runs after them. False: some reactor
/// did not answer in time (a stopped one counts as done: it runs nothing any more).
pub fn settle(remotes: &[Remote], within: std::time::Duration) -> bool {
    let deadline = std::time::Instant::now() + within;
    for _ in 0..2 {
        let (tx, rx) = std::sync::mpsc::channel();
        let mut waiting = 0;
        for remote in remotes {
            let tx = tx.clone();
            if remote.send(move |_| {
                let _ = tx.send(());
            }) {
                waiting += 1;
            }
        }
        for _ in 0..waiting {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if rx.recv_timeout(left).is_err() {
                return false;
            }
        }
    }
    true
}

fn local_listeners(r: &mut Reactor) -> &mut Listeners {
    if r.local::<Listeners>().is_none() {
        r.set_local(Listeners::default());
    }
    r.local::<Listeners>().unwrap_or_else(|| unreachable!("set just above"))
}

/// Namespace `nsid` of subsystem `nqn` is now `bytes` long (its store was resized, by
/// `pollux ctl resize-namespace` or by someone else): serve the new size and tell every
/// controller of the subsystem (Namespace Attribute Changed, NVMe 2.0 §5.27.1.3). A size
/// that is not a whole number of blocks is served rounded down.
pub fn namespace_resized(shared: &Shared, remotes: &[Remote], nqn: &str, nsid: u32, bytes: u64) {
    let snap = shared.snapshot.load();
    let Some(ns) = snap.subsystem(nqn).and_then(|s| s.namespace_ignoring_masks(nsid)) else {
        return;
    };
    let blocks = bytes >> ns.block_shift;
    let old = ns.blocks.swap(blocks, std::sync::atomic::Ordering::Relaxed);
    if old == blocks {
        return;
    }
    info!(
        nqn,
        nsid,
        old_bytes = old << ns.block_shift,
        new_bytes = blocks << ns.block_shift,
        "namespace resized"
    );
    for remote in remotes {
        let nqn = nqn.to_string();
        remote.send(move |r| for_each_ctrl(r, |c, r, _| c.namespace_changed(r, &nqn, nsid)));
    }
}

/// The store of namespace `nsid` of subsystem `nqn` vanished (`why`): stop serving it, as
/// `pollux ctl remove-namespace` would (its hosts get a Namespace Attribute Changed event,
/// NVMe 2.0 §5.27.1.3, and then Invalid Namespace, which fails their I/O instead of
/// retrying it for good), and keep why for `pollux ctl subsystems`. The conf file is not
/// touched: a reload that still names the store says it is missing.
pub fn namespace_vanished(shared: &Arc<Shared>, remotes: &[Remote], nqn: &str, nsid: u32, why: &str) {
    let mut cfg = shared.config.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let Some(sub) = cfg.subsystems.iter_mut().find(|s| s.nqn == nqn) else {
        return;
    };
    let before = sub.namespaces.len();
    sub.namespaces.retain(|n| n.nsid != nsid);
    if sub.namespaces.len() == before {
        return;
    }
    tracing::error!(nqn, nsid, why, "namespace removed: its store vanished");
    match reconcile(shared, remotes, cfg) {
        Ok(_) => shared
            .vanished
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((nqn.to_owned(), nsid, why.to_owned())),
        // An upgrade under way, say: the next check tries again.
        Err(e) => warn!(nqn, nsid, error = %e, "cannot remove the namespace whose store vanished (yet)"),
    }
}

/// On one reactor: run `f` on the admin queue of every controller it owns.
fn for_each_ctrl(r: &mut Reactor, mut f: impl FnMut(&mut Conn, &mut Reactor, SourceId)) {
    let ctrls: Vec<_> = r
        .local::<Local>()
        .map(|l| l.ctrls.values().copied().collect())
        .unwrap_or_default();
    for q in ctrls {
        r.with_source::<Conn, _>(q.source, |c, r| {
            if c.serial() == q.serial {
                f(c, r, q.source);
            }
        });
    }
}

/// On one reactor: bring every controller it owns up to date with `snap`.
fn refresh_controllers(r: &mut Reactor, snap: &Arc<Snapshot>, discovery_changed: bool) {
    for_each_ctrl(r, |c, r, id| c.refresh_ctrl(r, id, snap, discovery_changed));
}
