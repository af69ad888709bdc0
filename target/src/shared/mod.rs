//! What the running target holds, shared by every reactor and the control plane: its
//! subsystems ([`crate::subsystem::Snapshot`], swapped whole on change), the configuration
//! running, its per-reactor counts (connections, closes, requests, queues), the PSKs secure
//! channel concatenation generated ([`mod@concat`]), and the services the layers below are
//! given rather than call by name (where a namespace's store comes from at an upgrade).
//! Above the subsystems and backends it holds; below the controller, queues, transports and
//! control plane that read it.

pub mod concat;
pub mod group;
pub mod requests;

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use arc_swap::ArcSwap;
use pollux_conf::{Config, Transport};
use pollux_nvme::tls::{PskIdentity, TlsPsk};

use crate::close::CloseCounts;
use crate::subsystem::{AdoptStore, Snapshot};
#[cfg(test)]
use crate::subsystem::{build_snapshot, no_store_to_adopt};
use concat::GeneratedKeys;
use requests::RequestStats;

/// A reactor's queues by role: written by that reactor as its queues bind and close.
#[derive(Debug, Default)]
pub struct QueueRoles {
    /// Admin queues: the controllers the reactor owns.
    pub admin: AtomicU64,
    /// I/O queues.
    pub io: AtomicU64,
}

impl Shared {
    /// The I/O queues a controller grants at most ([`Transport::io_queues_for`]).
    pub fn io_queues_max(&self) -> u16 {
        self.transport.io_queues_for(self.reactors).min(0xFFFF) as u16
    }

    /// The state of a target of `reactors` reactors running `cfg`, whose subsystems are
    /// `snapshot`, whose namespaces added later take their stores from `adopt_store` first.
    pub fn new(
        cfg: &Config,
        reactors: usize,
        snapshot: Snapshot,
        started: std::time::Instant,
        adopt_store: AdoptStore,
    ) -> Self {
        Self {
            adopt_store,
            transport: cfg.transport.clone(),
            keep_alive: cfg.keep_alive.clone(),
            snapshot: ArcSwap::from_pointee(snapshot),
            generated: Default::default(),
            reactors,
            conns_per_reactor: (0..reactors).map(|_| AtomicU64::new(0)).collect(),
            closes: (0..reactors).map(|_| CloseCounts::default()).collect(),
            requests: (0..reactors).map(|_| Arc::default()).collect(),
            queue_roles: (0..reactors).map(|_| QueueRoles::default()).collect(),
            stats_cells: Default::default(),
            controllers_created: AtomicU64::new(0),
            config: std::sync::Mutex::new(cfg.clone()),
            ana_overlay: Default::default(),
            vanished: Default::default(),
            group: std::sync::Mutex::new(group::GroupConf::new(cfg)),
            started,
        }
    }

    /// The running configuration's origin: its conf file, or the embedded default's name
    /// (what a configuration composed anew is parsed as).
    pub fn origin(&self) -> String {
        self.config.lock().unwrap_or_else(|p| p.into_inner()).origin.clone()
    }

    /// The TLS PSK of an identity a host offers: a retained PSK derived from the configured
    /// one, or a PSK secure channel concatenation generated, which only serves while its
    /// subsystem still allows concatenation and the host may still connect with its
    /// DH-HMAC-CHAP keys there (a host removed, or its keys, loses it at once).
    pub fn tls_psk(&self, id: &PskIdentity) -> Option<TlsPsk> {
        let snap = self.snapshot.load();
        if !id.generated {
            return snap.tls_psk(id);
        }
        let s = snap.subsystem(&id.subnqn)?;
        if !s.secure_concat || !s.allows(&id.hostnqn) || s.keys_of(&id.hostnqn).is_none() {
            return None;
        }
        self.generated.lookup(id)
    }
}

/// State shared by all reactors of one target.
#[derive(Debug)]
pub struct Shared {
    /// Transport limits from the conf.
    pub transport: Transport,
    /// Keep-alive limits from the conf.
    pub keep_alive: pollux_conf::KeepAlive,
    /// The current subsystems.
    pub snapshot: ArcSwap<Snapshot>,
    /// The PSKs secure channel concatenation generated, for the TLS connections that follow.
    pub generated: GeneratedKeys,
    /// Number of reactors.
    pub reactors: usize,
    /// Open connections per reactor (for least-loaded placement and stats).
    pub conns_per_reactor: Box<[AtomicU64]>,
    /// Connections closed per reactor, by why (each reactor adds only to its own).
    pub closes: Box<[CloseCounts]>,
    /// Per reactor: its queues' requests by state, and the commands they ended.
    pub requests: Box<[Arc<RequestStats>]>,
    /// Per reactor: its admin queues (the controllers it owns) and I/O queues.
    pub queue_roles: Box<[QueueRoles]>,
    /// The reactors' accounting cells, once they run (connection placement samples their
    /// busy time).
    pub stats_cells: std::sync::OnceLock<Vec<Arc<pollux_reactor::StatsCell>>>,
    /// Controllers ever created (for logs).
    pub controllers_created: AtomicU64,
    /// When the target started (SMART power-on hours).
    pub started: std::time::Instant,
    /// The configuration running now (changed only by the control plane, which serializes
    /// its changes on this lock; reactors never take it).
    pub config: std::sync::Mutex<Config>,
    /// ANA states over the conf's on every listener (a gateway group's takeovers and
    /// fences); changed under the `config` lock, by [`crate::mutate::set_ana_overlay`].
    pub ana_overlay: std::sync::Mutex<crate::ana::Overlay>,
    /// Where the stores of namespaces added later come from before the conf is asked (a new
    /// process of a hot upgrade takes over its predecessor's, [`crate::upgrade`]): given by
    /// whoever starts the target, so that the layers that build namespaces need not know
    /// the upgrade.
    pub adopt_store: AdoptStore,
    /// Namespaces removed because their store vanished (subsystem NQN, NSID, why), for
    /// `pollux ctl subsystems`; a namespace added again under that NSID clears its entry.
    pub vanished: std::sync::Mutex<Vec<(String, u32, String)>>,
    /// A gateway group's member: its own conf and the group's configuration it runs
    /// (None: no `[gateway]`). Taken before `config` by whoever changes either.
    pub group: std::sync::Mutex<Option<group::GroupConf>>,
}

/// A target's shared state for unit tests: `reactors` reactors, no subsystem.
#[cfg(test)]
pub(crate) fn test_shared(reactors: usize) -> Shared {
    let mut cfg = Config::embedded_default();
    cfg.subsystems.clear();
    let snapshot =
        build_snapshot(&cfg, reactors, Vec::new(), no_store_to_adopt).expect("a conf without subsystems builds");
    Shared::new(&cfg, reactors, snapshot, std::time::Instant::now(), no_store_to_adopt)
}
