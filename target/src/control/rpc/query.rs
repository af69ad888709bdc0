//! The read-only methods: `version`, `reactors`, `controllers`, `subsystems`, and the
//! Prometheus text of the metrics endpoint.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use super::{Ctx, REACTOR_TIMEOUT};
use crate::close::CloseKind;
use crate::control::view::{
    ClassView, CtrlList, CtrlView, DiscoveryView, LatencyView, Lateness, NamespaceView, PathView, PerMode, QosView,
    ReactorView, SubsystemView, VersionView,
};

/// The NQN a discovery controller reports as its subsystem.
const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";

impl Ctx {
    // ------------------------------------------------------------------ views

    /// `version`.
    pub fn version(&self) -> VersionView {
        VersionView {
            version: crate::VERSION.to_string(),
            commit: crate::BUILD_COMMIT.to_string(),
            uptime_s: self.started.elapsed().as_secs_f64(),
            reactors: self.reactor_count(),
            pid: std::process::id(),
        }
    }

    /// `reactors`.
    pub fn reactors(&self) -> Vec<ReactorView> {
        let now = Instant::now();
        let base = self.baseline(now);
        let stats = self.stats();
        let cmds = self.commands();
        let pct = |a: u64, b: u64| if b == 0 { 0.0 } else { 100.0 * a as f64 / b as f64 };
        stats
            .iter()
            .map(|st| {
                let i = st.id;
                let wall: u64 = st.mode_ns.iter().sum();
                let (cpu_pct_1s, iops) = match &base {
                    Some(b) => {
                        let dt = now.duration_since(b.at).as_secs_f64();
                        let prev = b.stats.get(i);
                        let dcpu = prev.map_or(0, |p| st.cpu_ns.saturating_sub(p.cpu_ns));
                        let dcmd = cmds[i].saturating_sub(b.cmds.get(i).copied().unwrap_or(0));
                        if dt > 0.0 {
                            (100.0 * dcpu as f64 / (dt * 1e9), dcmd as f64 / dt)
                        } else {
                            (0.0, 0.0)
                        }
                    }
                    None => (0.0, 0.0),
                };
                ReactorView {
                    id: i,
                    core: st.core,
                    mode: st.mode.to_string(),
                    adaptive: st.adaptive,
                    cpu_budget: self.policy(i).cpu_budget,
                    mode_ns: PerMode::from_array(st.mode_ns),
                    mode_pct: PerMode::from_array(std::array::from_fn(|m| pct(st.mode_ns[m], wall))),
                    switches: st.switches,
                    held: st.held,
                    held_pct: pct(st.held_ns, wall),
                    cpu_ns: st.cpu_ns,
                    cpu_pct_1s,
                    cpu_pct: pct(st.cpu_ns, wall),
                    busy_ns: st.busy_ns,
                    busy_pct: pct(st.busy_ns, st.busy_ns + st.idle_ns),
                    iterations: st.iterations,
                    iops,
                    commands: cmds[i],
                    outstanding: st.outstanding,
                    device_completions: st.completions,
                    predicted_ns: st.predicted_ns,
                    classes: st.classes.iter().map(ClassView::of).collect(),
                    wake_cost_ns: st.wake_cost_ns,
                    hybrid_spin_ns: st.hybrid_spin_ns,
                    wakeups: st.wakeups(),
                    wake_late_us: Lateness {
                        p50: st.wake_late_percentile_us(0.5),
                        p90: st.wake_late_percentile_us(0.9),
                        p99: st.wake_late_percentile_us(0.99),
                    },
                    stalls: st.stalls,
                    sources: st.sources,
                    connections: self.shared.conns_per_reactor.get(i).map_or(0, |c| c.load(Relaxed)),
                    admin_queues: self.shared.queue_roles.get(i).map_or(0, |c| c.admin.load(Relaxed)),
                    io_queues: self.shared.queue_roles.get(i).map_or(0, |c| c.io.load(Relaxed)),
                    closed: self.shared.closes.get(i).map_or_else(Default::default, |c| {
                        CloseKind::ALL
                            .iter()
                            .map(|&k| (k.name().to_string(), c.get(k)))
                            .collect()
                    }),
                    requests: self.shared.requests.get(i).map(|q| q.snapshot()).unwrap_or_default(),
                }
            })
            .collect()
    }

    /// `controllers`: asks every reactor for the controllers it owns.
    pub fn controllers(&self) -> CtrlList {
        let now_i = Instant::now();
        let now_s = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        let (tx, rx) = mpsc::channel::<(usize, Vec<CtrlView>)>();
        let mut asked = Vec::new();
        // A controller knows its listener by its ANA states, which are the listener's own.
        let listeners: Vec<_> = self
            .shared
            .snapshot
            .load()
            .listeners
            .iter()
            .map(|l| (l.ana.clone(), l.addr))
            .collect();
        for remote in self.remotes.iter() {
            let tx = tx.clone();
            let listeners = listeners.clone();
            let sent = remote.send(move |r| {
                let id = r.id();
                let mut v = Vec::new();
                crate::listener::for_each_ctrl(r, |c| {
                    let age = c.created.elapsed().as_secs_f64();
                    v.push(CtrlView {
                        cntlid: c.cntlid,
                        subsystem: c.subsys.as_ref().map_or(DISCOVERY_NQN.to_string(), |s| s.nqn.clone()),
                        discovery: c.is_discovery(),
                        hostnqn: c.hostnqn.clone(),
                        hostid: uuid::Uuid::from_bytes(c.hostid).hyphenated().to_string(),
                        kato_ms: c.kato_ms,
                        ready: c.ready(),
                        admin_reactor: id,
                        io_queues: c.io_queues.iter().map(|(q, r)| (*q, r.reactor)).collect(),
                        created_unix_s: 0.0,
                        age_s: age,
                        authenticated: c.authenticated.clone(),
                        listener: listeners
                            .iter()
                            .find(|(a, _)| std::sync::Arc::ptr_eq(a, &c.ana))
                            .map(|(_, addr)| addr.to_string()),
                    });
                });
                let _ = tx.send((id, v));
            });
            if sent {
                asked.push(remote.id());
            }
        }
        drop(tx);
        let deadline = now_i + REACTOR_TIMEOUT;
        let mut answered = Vec::new();
        let mut all = Vec::new();
        while answered.len() < asked.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok((id, v)) => {
                    answered.push(id);
                    all.extend(v);
                }
                Err(_) => break,
            }
        }
        for c in &mut all {
            c.created_unix_s = now_s - c.age_s;
        }
        all.sort_by_key(|c| c.cntlid);
        let unanswered = (0..self.remotes.len()).filter(|i| !answered.contains(i)).collect();
        CtrlList {
            controllers: all,
            unanswered,
        }
    }

    /// `subsystems`; `ctrls` from [`Ctx::controllers`] gives the controller counts.
    pub fn subsystems_with(&self, ctrls: &CtrlList) -> Vec<SubsystemView> {
        let snap = self.shared.snapshot.load();
        // Each listener with its TLS mode and the ANA state, on its path, of each group the
        // subsystem's namespaces are in.
        let listeners_of = |s: &crate::subsystem::Subsystem| -> Vec<String> {
            let groups: std::collections::BTreeSet<u32> = s.all_namespaces().map(|n| n.ana_group).collect();
            snap.listeners
                .iter()
                .filter(|l| s.served_on(Some(l)))
                .map(|l| {
                    let mut v = l.addr.to_string();
                    if l.tls != pollux_conf::TlsMode::None {
                        v.push_str(&format!(" (tls {})", l.tls.as_str()));
                    }
                    let states: Vec<(u32, pollux_conf::AnaState)> =
                        groups.iter().map(|g| (*g, l.ana.state(*g))).collect();
                    // Only where a group is not optimized (the default says nothing).
                    if states.iter().any(|(_, s)| *s != pollux_conf::AnaState::Optimized) {
                        let ana: Vec<String> = states.iter().map(|(g, s)| format!("{g}:{}", s.name())).collect();
                        v.push_str(&format!(" ana {}", ana.join(",")));
                    }
                    v
                })
                .collect()
        };
        // The same, structured: every group's state, optimized ones included.
        let paths_of = |s: &crate::subsystem::Subsystem| -> Vec<PathView> {
            let groups: std::collections::BTreeSet<u32> = s.all_namespaces().map(|n| n.ana_group).collect();
            snap.listeners
                .iter()
                .filter(|l| s.served_on(Some(l)))
                .map(|l| PathView {
                    address: l.addr.to_string(),
                    tls: l.tls.as_str().to_string(),
                    ana: groups
                        .iter()
                        .map(|g| (*g, l.ana.state(*g).name().to_string()))
                        .collect(),
                })
                .collect()
        };
        let vanished = self.shared.vanished.lock().unwrap_or_else(|p| p.into_inner()).clone();
        snap.subsystems
            .iter()
            .map(|s| SubsystemView {
                // Not one that was added again since.
                vanished: vanished
                    .iter()
                    .filter(|(nqn, nsid, _)| *nqn == s.nqn && s.namespace_ignoring_masks(*nsid).is_none())
                    .map(|(_, nsid, why)| crate::control::view::VanishedView {
                        nsid: *nsid,
                        why: why.clone(),
                    })
                    .collect(),
                nqn: s.nqn.clone(),
                serial: s.serial.clone(),
                model: s.model.clone(),
                allow_any_host: s.allow_any_host,
                hosts: s.hosts.clone(),
                dhchap_hosts: s
                    .host_keys
                    .iter()
                    .map(|(h, k)| {
                        if k.ctrl.is_some() {
                            format!("{h} +ctrl")
                        } else {
                            h.clone()
                        }
                    })
                    .collect(),
                tls_hosts: s
                    .tls_keys
                    .iter()
                    .map(|(h, k)| match k.key.cipher() {
                        pollux_nvme::tls::PskHash::Sha256 => format!("{h} sha256"),
                        pollux_nvme::tls::PskHash::Sha384 => format!("{h} sha384"),
                    })
                    .collect(),
                secure_concat: s.secure_concat,
                namespaces: s
                    .all_namespaces()
                    .map(|n| {
                        let t = n.totals();
                        let (read, write) = n.latencies();
                        NamespaceView {
                            nsid: n.nsid,
                            size: n.bytes(),
                            block_size: n.block_size,
                            backend: n.backend.kind().to_string(),
                            io_path: n.backend.io_path().to_string(),
                            uuid: uuid::Uuid::from_bytes(n.uuid).hyphenated().to_string(),
                            read_cmds: t.read_cmds,
                            write_cmds: t.write_cmds,
                            read_bytes: t.read_bytes,
                            write_bytes: t.write_bytes,
                            reservation: reservation_summary(&n.resv.state(), n.resv.cluster_object()),
                            reservations: match (n.resv.kind(), n.resv.uncertain()) {
                                ("cluster", true) => "cluster-unseen".to_string(),
                                (k, _) => k.to_string(),
                            },
                            polling: n.polling.get().to_string(),
                            hosts: s.masked_to(n.nsid).map(|h| h.iter().cloned().collect()),
                            rbd: rbd_view(n.backend.as_ref()),
                            qos: QosView::of(&n.qos),
                            read_latency: LatencyView::of(&read),
                            write_latency: LatencyView::of(&write),
                        }
                    })
                    .collect(),
                listeners: listeners_of(s),
                paths: paths_of(s),
                controllers: ctrls
                    .controllers
                    .iter()
                    .filter(|c| !c.discovery && c.subsystem == s.nqn)
                    .count(),
                min_cntlid: *s.cntlids.start(),
                max_cntlid: *s.cntlids.end(),
            })
            .collect()
    }

    /// `discovery`: the generation counter, listeners, referrals and discovery controllers.
    pub fn discovery(&self) -> DiscoveryView {
        let ctrls = self.controllers();
        let snap = self.shared.snapshot.load();
        DiscoveryView {
            genctr: snap.genctr,
            listeners: listener_names(&snap),
            referrals: snap.referrals.iter().map(ToString::to_string).collect(),
            controllers: ctrls.controllers.iter().filter(|c| c.discovery).count(),
        }
    }

    /// `subsystems`.
    pub fn subsystems(&self) -> Vec<SubsystemView> {
        self.subsystems_with(&self.controllers())
    }

    /// The Prometheus text of the metrics endpoint (an error is the encoder's).
    pub fn metrics(&self) -> Result<String, std::fmt::Error> {
        crate::control::metrics::render(self.reactors(), self.subsystems(), self.started.elapsed().as_secs_f64())
    }
}

/// The bound listeners, with their TLS mode when not none.
fn listener_names(snap: &crate::subsystem::Snapshot) -> Vec<String> {
    snap.listeners
        .iter()
        .map(|l| match l.tls {
            pollux_conf::TlsMode::None => l.addr.to_string(),
            m => format!("{} (tls {})", l.addr, m.as_str()),
        })
        .collect()
}

/// One line about a namespace's reservations for `ctl subsystems`: empty while it has no
/// registrant and PTPL is clear. Keys are never shown (they are the hosts' secrets for
/// preempting each other).
fn reservation_summary(s: &crate::resv::ResvState, object: Option<&str>) -> String {
    if s.registrants.is_empty() && !s.ptpl {
        return String::new();
    }
    let host = |h: &[u8; 16]| uuid::Uuid::from_bytes(*h).hyphenated().to_string();
    let held = match s.holder {
        None => "none held".to_string(),
        Some(h) if h.rtype.all_registrants() => format!("{} (every registrant)", h.rtype.name()),
        Some(h) => format!("{} held by host {}", h.rtype.name(), host(&h.hostid)),
    };
    let mut out = format!("{held}; {} registrant(s)", s.registrants.len());
    for r in &s.registrants {
        out.push_str(&format!(" {}", host(&r.hostid)));
    }
    out.push_str(&format!("; generation {}", s.generation));
    if s.ptpl {
        out.push_str("; persists (PTPL)");
    }
    if let Some(o) = object {
        out.push_str(&format!("; kept in cluster object {o} for every gateway"));
    }
    out
}

/// An rbd namespace's image and connection health (None for other backends).
fn rbd_view(b: &dyn crate::backend::Backend) -> Option<crate::control::view::RbdView> {
    use std::sync::atomic::Ordering::Relaxed;
    let r = b.as_any().downcast_ref::<crate::backend::rbd::RbdDisk>()?;
    Some(crate::control::view::RbdView {
        image: r.conf.spec(),
        pool: r.conf.pool.clone(),
        image_id: r.image_id.clone(),
        fsid: r.fsid.clone(),
        ceph_conf: r.conf.ceph_conf.display().to_string(),
        write_cache: r.conf.write_cache,
        exclusive_lock: r.exclusive_lock,
        lock_owner: r.owns_lock(),
        health: if r.health.degraded.load(Relaxed) {
            "unavailable"
        } else {
            "ok"
        }
        .into(),
        ops: r.health.ops(),
        unavailable: r.health.unavailable.load(Relaxed),
        errors: r.health.errors.load(Relaxed),
        overdue: r.health.overdue.load(Relaxed),
    })
}
