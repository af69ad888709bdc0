//! The JSON-RPC methods and their dispatch.
//!
//! | method | params | result |
//! |---|---|---|
//! | `version` | none | [`VersionView`] |
//! | `reactors` | none | `[`[`ReactorView`]`]` |
//! | `subsystems` | none | `[`[`SubsystemView`]`]` |
//! | `discovery` | none | [`DiscoveryView`] |
//! | `controllers` | none | [`CtrlList`] |
//! | `set_mode` | `{reactor, mode}` (`poll`, `hybrid`, `interrupt`, `adaptive`) | [`ModeView`] |
//! | `set_cpu_budget` | `{reactor, budget}` (`0 < budget <= 1`) | [`ModeView`] |
//!
//! Params are an object by name, or an array in the order above. Errors: -32700 parse error,
//! -32600 invalid request, -32601 method not found, -32602 invalid params, -32000 a reactor
//! did not answer.
//!
//! [`VersionView`]: super::view::VersionView
//! [`ReactorView`]: super::view::ReactorView
//! [`SubsystemView`]: super::view::SubsystemView
//! [`DiscoveryView`]: super::view::DiscoveryView
//! [`CtrlList`]: super::view::CtrlList
//! [`ModeView`]: super::view::ModeView

use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pollux_conf::{ReactorMode, Reactors};
use pollux_reactor::{PolicyConfig, Reactor, ReactorStats, Remote, StatsCell};

use crate::Target;
use crate::shared::Shared;

mod config;
mod dispatch;
mod document;
mod group;
mod modes;
mod nvme;
mod query;
mod save;
pub mod spdk;
mod spdk_bdev;
pub(crate) mod spdk_config;
mod spdk_hosts;
mod spdk_nvme;
mod spdk_rbd;
mod spdk_stats;
mod spdk_threads;

pub use spdk_config::base_conf as spdk_base_conf;
pub use spdk_config::loopback_listeners as spdk_loopback_listeners;
pub use spdk_config::tuning_calls as spdk_tuning_calls;

pub use dispatch::error_response;

/// JSON-RPC: invalid JSON.
pub const PARSE_ERROR: i64 = -32700;
/// JSON-RPC: not a valid request object.
pub const INVALID_REQUEST: i64 = -32600;
/// JSON-RPC: no such method.
pub const METHOD_NOT_FOUND: i64 = -32601;
/// JSON-RPC: invalid method parameters.
pub const INVALID_PARAMS: i64 = -32602;
/// Server error: a reactor did not answer in time, or has stopped.
pub const REACTOR_UNAVAILABLE: i64 = -32000;

/// Server error: the requested configuration is invalid or cannot be applied (nothing changed).
pub const CONFIG_ERROR: i64 = -32001;

/// Server error: the upgrade did not happen (this process serves on).
pub const UPGRADE_REFUSED: i64 = -32002;

/// How long a method waits for a reactor's reply.
pub const REACTOR_TIMEOUT: Duration = Duration::from_secs(2);

/// A JSON-RPC error object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RpcError {
    /// Code.
    pub code: i64,
    /// Message.
    pub message: String,
}

impl RpcError {
    fn new(code: i64, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    fn params(message: impl Into<String>) -> Self {
        Self::new(INVALID_PARAMS, message)
    }
}

/// One accounting sample, for rates over the last second.
#[derive(Debug, Clone)]
struct Sample {
    at: Instant,
    stats: Vec<ReactorStats>,
    cmds: Vec<u64>,
}

/// What the methods work on: read-only handles to the target, plus the control plane's own
/// state (its locks are taken by control threads only, never by a reactor).
#[derive(Debug)]
pub struct Ctx {
    shared: Arc<Shared>,
    remotes: Arc<[Remote]>,
    cells: Vec<Arc<StatsCell>>,
    started: Instant,
    policies: Mutex<Vec<PolicyConfig>>,
    samples: Mutex<VecDeque<Sample>>,
    /// SPDK's bdevs and transport ([`spdk`]).
    spdk: Mutex<spdk::SpdkState>,
    /// This gateway's view of its gateway group (`[gateway]`).
    gateway: Option<Arc<Mutex<crate::gateway::View>>>,
    /// Its group's configuration, kept in the cluster.
    group: Option<Arc<crate::gateway::config::Service>>,
}

/// The adaptive policy the conf's `[reactors]` table describes (whatever its mode).
fn policy_of(r: &Reactors) -> PolicyConfig {
    let mut a = r.clone();
    a.mode = ReactorMode::Adaptive;
    crate::modes_of(&a).1.unwrap_or_default()
}

impl Ctx {
    /// Handles to `target`, whose conf `[reactors]` table is `reactors`.
    pub fn new(target: &Target, reactors: &Reactors) -> Self {
        let rt = target.runtime();
        let n = rt.len();
        let ctx = Self {
            shared: target.shared().clone(),
            remotes: rt.remotes(),
            cells: rt.stats_cells(),
            started: Instant::now(),
            policies: Mutex::new(vec![policy_of(reactors); n]),
            samples: Mutex::new(VecDeque::new()),
            spdk: spdk::state(),
            gateway: target.gateway().map(crate::gateway::Agent::view_handle),
            group: target.gateway().map(crate::gateway::Agent::config),
        };
        ctx.sample();
        ctx
    }

    /// `gateways`: the members of this gateway's group as it last read the group object,
    /// with the age of each one's last heartbeat as seen here.
    pub fn gateways(&self) -> Result<serde_json::Value, RpcError> {
        let Some(v) = &self.gateway else {
            return Err(RpcError::new(
                INVALID_PARAMS,
                "this target is in no gateway group (its conf has no [gateway])",
            ));
        };
        let v = v.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let members: Vec<serde_json::Value> = v
            .last
            .iter()
            .flat_map(|g| &g.members)
            .map(|(name, r)| {
                let silent = v.silent_ms.iter().find(|(n, _)| n == name).map(|(_, ms)| *ms);
                let state = match r.standing {
                    crate::gateway::state::Standing::Alive if silent.is_some_and(|ms| ms > 1000) => "suspect",
                    crate::gateway::state::Standing::Alive => "alive",
                    // Fenced in the group object, its blocklist not (yet) in the cluster.
                    crate::gateway::state::Standing::Fenced if !r.blocklisted => "fencing",
                    crate::gateway::state::Standing::Fenced => "fenced",
                    crate::gateway::state::Standing::Rejoining => "rejoining",
                };
                serde_json::json!({
                    "name": name,
                    "self": *name == v.name,
                    "state": state,
                    "heartbeat_age_ms": silent,
                    "ana_groups": r.ana_groups,
                    "taken_by": r.taken_by,
                    "fenced_by": r.fenced_by,
                    "blocklisted": r.blocklisted,
                    "listeners": r.listeners,
                    "addrs": r.addrs,
                })
            })
            .collect();
        Ok(serde_json::json!({
            "group": v.group,
            "name": v.name,
            "fenced": v.fenced,
            "error": v.error,
            "members": members,
        }))
    }

    /// Number of reactors.
    pub fn reactor_count(&self) -> usize {
        self.cells.len()
    }

    fn stats(&self) -> Vec<ReactorStats> {
        self.cells.iter().enumerate().map(|(i, c)| c.snapshot(i)).collect()
    }

    /// NVMe I/O commands completed per reactor, from the namespaces' per-reactor counters.
    fn commands(&self) -> Vec<u64> {
        let mut v = vec![0u64; self.cells.len()];
        let snap = self.shared.snapshot.load();
        for s in &snap.subsystems {
            for ns in s.all_namespaces() {
                for (r, c) in ns.counters.iter().enumerate() {
                    if let Some(x) = v.get_mut(r) {
                        *x += c.read_cmds.load(Relaxed) + c.write_cmds.load(Relaxed);
                    }
                }
            }
        }
        v
    }

    /// Take an accounting sample (the control thread does, about once a second); keeps the
    /// last few seconds.
    pub fn sample(&self) {
        let s = Sample {
            at: Instant::now(),
            stats: self.stats(),
            cmds: self.commands(),
        };
        let mut q = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        while q
            .front()
            .is_some_and(|f| s.at.duration_since(f.at) > Duration::from_secs(3))
        {
            q.pop_front();
        }
        q.push_back(s);
    }

    /// The newest sample at least one second old, else the oldest.
    fn baseline(&self, now: Instant) -> Option<Sample> {
        let q = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        q.iter()
            .rev()
            .find(|s| now.duration_since(s.at) >= Duration::from_secs(1))
            .or_else(|| q.front())
            .cloned()
    }

    fn policy(&self, reactor: usize) -> PolicyConfig {
        let p = self.policies.lock().unwrap_or_else(|e| e.into_inner());
        p.get(reactor).copied().unwrap_or_default()
    }

    /// Run `f` on reactor `id` and wait for its result.
    fn on_reactor<T: Send + 'static>(
        &self,
        id: usize,
        f: impl FnOnce(&mut Reactor) -> T + Send + 'static,
    ) -> Result<T, RpcError> {
        let remote = self
            .remotes
            .get(id)
            .ok_or_else(|| RpcError::params(format!("no reactor {id}")))?;
        let (tx, rx) = mpsc::channel();
        if !remote.send(move |r| {
            let _ = tx.send(f(r));
        }) {
            return Err(RpcError::new(REACTOR_UNAVAILABLE, format!("reactor {id} has stopped")));
        }
        rx.recv_timeout(REACTOR_TIMEOUT).map_err(|_| {
            RpcError::new(
                REACTOR_UNAVAILABLE,
                format!("reactor {id} did not answer within {} ms", REACTOR_TIMEOUT.as_millis()),
            )
        })
    }
}
