//! The JSON-RPC methods and their dispatch.
//!
//! | method | params | result |
//! |---|---|---|
//! | `version` | none | [`VersionView`] |
//! | `reactors` | none | `[`[`ReactorView`]`]` |
//! | `subsystems` | none | `[`[`SubsystemView`]`]` |
//! | `controllers` | none | [`CtrlList`] |
//! | `set_mode` | `{reactor, mode}` (`poll`, `hybrid`, `interrupt`, `adaptive`) | [`ModeView`] |
//! | `set_cpu_budget` | `{reactor, budget}` (`0 < budget <= 1`) | [`ModeView`] |
//!
//! Params are an object by name, or an array in the order above. Errors: -32700 parse error,
//! -32600 invalid request, -32601 method not found, -32602 invalid params, -32000 a reactor
//! did not answer.

use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use pollux_conf::{ReactorMode, Reactors};
use pollux_reactor::{Mode, PolicyConfig, Reactor, ReactorStats, Remote, StatsCell};
use serde::Serialize;
use serde_json::{Value, json};

use super::view::{
    ClassView, CtrlList, CtrlView, Lateness, ModeView, NamespaceView, PerMode, ReactorView, SubsystemView, VersionView,
};
use crate::Target;
use crate::backend::nvme::SsdNamespace;
use crate::subsystem::Shared;

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

/// How long a method waits for a reactor's reply.
pub const REACTOR_TIMEOUT: Duration = Duration::from_secs(2);

/// The NQN a discovery controller reports as its subsystem.
const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";

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
        };
        ctx.sample();
        ctx
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
            for ns in s.namespaces.values() {
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

    // ------------------------------------------------------------------ views

    /// `version`.
    pub fn version(&self) -> VersionView {
        VersionView {
            version: env!("CARGO_PKG_VERSION").to_string(),
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
                    wakeups: st.wakeups(),
                    wake_late_us: Lateness {
                        p50: st.wake_late_percentile_us(0.5),
                        p90: st.wake_late_percentile_us(0.9),
                        p99: st.wake_late_percentile_us(0.99),
                    },
                    stalls: st.stalls,
                    sources: st.sources,
                    connections: self.shared.conns_per_reactor.get(i).map_or(0, |c| c.load(Relaxed)),
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
        for remote in self.remotes.iter() {
            let tx = tx.clone();
            let sent = remote.send(move |r| {
                let id = r.id();
                let mut v = Vec::new();
                crate::conn::for_each_ctrl(r, |c| {
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
        let listeners: Vec<String> = self
            .shared
            .snapshot
            .load()
            .listeners
            .iter()
            .map(|a| a.to_string())
            .collect();
        snap.subsystems
            .iter()
            .map(|s| SubsystemView {
                nqn: s.nqn.clone(),
                serial: s.serial.clone(),
                model: s.model.clone(),
                allow_any_host: s.allow_any_host,
                hosts: s.hosts.clone(),
                namespaces: s
                    .namespaces
                    .values()
                    .map(|n| {
                        let t = n.totals();
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
                        }
                    })
                    .collect(),
                listeners: listeners.clone(),
                controllers: ctrls
                    .controllers
                    .iter()
                    .filter(|c| !c.discovery && c.subsystem == s.nqn)
                    .count(),
            })
            .collect()
    }

    /// `subsystems`.
    pub fn subsystems(&self) -> Vec<SubsystemView> {
        self.subsystems_with(&self.controllers())
    }

    /// The Prometheus text of the metrics endpoint (an error is the encoder's).
    pub fn metrics(&self) -> Result<String, std::fmt::Error> {
        super::metrics::render(self.reactors(), self.subsystems(), self.started.elapsed().as_secs_f64())
    }

    // -------------------------------------------------------------- mutations

    fn reactor_param(&self, params: &Value) -> Result<usize, RpcError> {
        let v = param(params, "reactor", 0)?.ok_or_else(|| RpcError::params("missing param 'reactor'"))?;
        let n = self.reactor_count();
        let id = v
            .as_u64()
            .ok_or_else(|| RpcError::params(format!("'reactor' must be a non-negative integer, got {v}")))?;
        if id >= n as u64 {
            return Err(RpcError::params(format!(
                "reactor {id} out of range: this target has {n} reactor{} (0..={})",
                if n == 1 { "" } else { "s" },
                n - 1
            )));
        }
        Ok(id as usize)
    }

    /// `set_mode {reactor, mode}`.
    pub fn set_mode(&self, params: &Value) -> Result<ModeView, RpcError> {
        let id = self.reactor_param(params)?;
        let v = param(params, "mode", 1)?.ok_or_else(|| RpcError::params("missing param 'mode'"))?;
        let name = v
            .as_str()
            .ok_or_else(|| RpcError::params(format!("'mode' must be a string, got {v}")))?;
        let fixed = match name {
            "adaptive" => None,
            other => Some(other.parse::<Mode>().map_err(|_| {
                RpcError::params(format!("unknown mode '{other}': poll, hybrid, interrupt or adaptive"))
            })?),
        };
        let policy = self.policy(id);
        let (mode, adaptive) = self.on_reactor(id, move |r| {
            match fixed {
                Some(m) => {
                    r.set_adaptive(None);
                    r.set_mode(m);
                }
                None => r.set_adaptive(Some(policy)),
            }
            let st = r.stats();
            (st.mode, st.adaptive)
        })?;
        tracing::info!(reactor = id, mode = name, "control: set_mode");
        Ok(ModeView {
            reactor: id,
            mode: mode.to_string(),
            adaptive,
            cpu_budget: policy.cpu_budget,
        })
    }

    /// `set_cpu_budget {reactor, budget}`: re-creates the adaptive policy (if on) with it.
    pub fn set_cpu_budget(&self, params: &Value) -> Result<ModeView, RpcError> {
        let id = self.reactor_param(params)?;
        let v = param(params, "budget", 1)?.ok_or_else(|| RpcError::params("missing param 'budget'"))?;
        let b = v
            .as_f64()
            .ok_or_else(|| RpcError::params(format!("'budget' must be a number, got {v}")))?;
        if !(b.is_finite() && b > 0.0 && b <= 1.0) {
            return Err(RpcError::params(format!(
                "budget {b} out of range: a fraction of a core, 0 < budget <= 1"
            )));
        }
        let policy = {
            let mut p = self.policies.lock().unwrap_or_else(|e| e.into_inner());
            let slot = p
                .get_mut(id)
                .ok_or_else(|| RpcError::params(format!("no reactor {id}")))?;
            slot.cpu_budget = b;
            *slot
        };
        let (mode, adaptive) = self.on_reactor(id, move |r| {
            if r.stats().adaptive {
                r.set_adaptive(Some(policy));
            }
            let st = r.stats();
            (st.mode, st.adaptive)
        })?;
        tracing::info!(reactor = id, budget = b, adaptive, "control: set_cpu_budget");
        Ok(ModeView {
            reactor: id,
            mode: mode.to_string(),
            adaptive,
            cpu_budget: b,
        })
    }

    // --------------------------------------------------------------- NVMe devices

    /// The NVMe devices behind this target's namespaces, by name.
    fn ssd_devices(&self) -> std::collections::BTreeMap<String, Arc<crate::backend::nvme::SsdDevice>> {
        let snap = self.shared.snapshot.load();
        let mut out = std::collections::BTreeMap::new();
        for s in &snap.subsystems {
            for ns in s.namespaces.values() {
                if let Some(n) = ns.backend.as_any().downcast_ref::<SsdNamespace>() {
                    out.insert(n.dev.name().to_string(), n.dev.clone());
                }
            }
        }
        out
    }

    /// Every NVMe device of the target: identity, queues, state, resets.
    pub fn nvme_devices(&self) -> Vec<crate::backend::nvme::DeviceView> {
        self.ssd_devices().values().map(|d| d.view()).collect()
    }

    /// Inject a fault into a fake NVMe device: `{"device": NAME, "kind": "cfs" | "lose" |
    /// "fail", "count": N (default 1), "status": SCT<<8|SC for "fail" (default 0x281,
    /// Unrecovered Read Error)}`.
    fn nvme_fault(&self, params: &Value) -> Result<Value, RpcError> {
        let name = str_param(params, "device")?;
        let kind = str_param(params, "kind")?;
        let count = match param(params, "count", 2)? {
            None => 1,
            Some(v) => v
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| RpcError::params("'count' must be a non-negative integer"))?,
        };
        let status = match param(params, "status", 3)? {
            None => pollux_nvme::spec::Status::UNRECOVERED_READ_ERROR,
            Some(v) => v
                .as_u64()
                .filter(|&n| n > 0 && n <= 0x7FF)
                .map(|n| pollux_nvme::spec::Status::from_field(n as u16))
                .ok_or_else(|| RpcError::params("'status' must be SCT << 8 | SC, 1..=0x7ff"))?,
        };
        let devices = self.ssd_devices();
        let Some(dev) = devices.get(name) else {
            let names: Vec<&String> = devices.keys().collect();
            return Err(RpcError::params(format!(
                "no NVMe device {name:?} in this target (devices: {names:?})"
            )));
        };
        dev.inject(kind, count, status)
            .map_err(|e| RpcError::params(e.to_string()))?;
        Ok(json!({"device": name, "kind": kind, "count": count}))
    }

    // --------------------------------------------------------------- dispatch

    /// Run one method.
    pub fn call(&self, method: &str, params: &Value) -> Result<Value, RpcError> {
        match method {
            "version" => to_value(self.version()),
            "reactors" => to_value(self.reactors()),
            "subsystems" => to_value(self.subsystems()),
            "controllers" => to_value(self.controllers()),
            "set_mode" => to_value(self.set_mode(params)?),
            "set_cpu_budget" => to_value(self.set_cpu_budget(params)?),
            "nvme_devices" => to_value(self.nvme_devices()),
            "nvme_fault" => self.nvme_fault(params),
            "reload" => self.reload(),
            "save" => self.save(params),
            "add_subsystem" | "remove_subsystem" | "add_namespace" | "remove_namespace" | "add_host"
            | "remove_host" | "set_allow_any_host" | "add_listener" | "remove_listener" => {
                self.mutation(method, params)
            }
            other => Err(RpcError::new(METHOD_NOT_FOUND, format!("method not found: '{other}'"))),
        }
    }

    /// Handle one request line; the response line (without newline), or None for a
    /// notification.
    pub fn handle_line(&self, line: &[u8]) -> Option<String> {
        let req: Value = match serde_json::from_slice(line) {
            Ok(v) => v,
            Err(e) => return Some(error_response(&Value::Null, PARSE_ERROR, &format!("parse error: {e}"))),
        };
        let Some(obj) = req.as_object() else {
            let what = if req.is_array() {
                "batch requests are not supported"
            } else {
                "a request must be a JSON object"
            };
            return Some(error_response(&Value::Null, INVALID_REQUEST, what));
        };
        let id = obj.get("id").cloned();
        let reply_id = match &id {
            Some(v @ (Value::Null | Value::Number(_) | Value::String(_))) => v.clone(),
            Some(_) => {
                return Some(error_response(
                    &Value::Null,
                    INVALID_REQUEST,
                    "'id' must be a string, a number or null",
                ));
            }
            None => Value::Null,
        };
        if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
            return Some(error_response(&reply_id, INVALID_REQUEST, "'jsonrpc' must be \"2.0\""));
        }
        let Some(method) = obj.get("method").and_then(Value::as_str) else {
            return Some(error_response(&reply_id, INVALID_REQUEST, "'method' must be a string"));
        };
        let params = obj.get("params").cloned().unwrap_or(Value::Null);
        let result = if matches!(params, Value::Null | Value::Object(_) | Value::Array(_)) {
            self.call(method, &params)
        } else {
            Err(RpcError::params("'params' must be an object or an array"))
        };
        id.as_ref()?;
        Some(match result {
            Ok(v) => json!({"jsonrpc": "2.0", "id": reply_id, "result": v}).to_string(),
            Err(e) => error_response(&reply_id, e.code, &e.message),
        })
    }
}

/// Every method [`Ctx::call`] dispatches (what `pollux ctl call` accepts).
pub const METHODS: [&str; 19] = [
    "version",
    "reactors",
    "subsystems",
    "controllers",
    "set_mode",
    "set_cpu_budget",
    "nvme_devices",
    "nvme_fault",
    "reload",
    "save",
    "add_subsystem",
    "remove_subsystem",
    "add_namespace",
    "remove_namespace",
    "add_host",
    "remove_host",
    "set_allow_any_host",
    "add_listener",
    "remove_listener",
];

/// Param `name` (object) or `pos` (array); Ok(None) if absent.
fn param<'a>(params: &'a Value, name: &str, pos: usize) -> Result<Option<&'a Value>, RpcError> {
    match params {
        Value::Object(m) => Ok(m.get(name)),
        Value::Array(a) => Ok(a.get(pos)),
        Value::Null => Ok(None),
        _ => Err(RpcError::params("'params' must be an object or an array")),
    }
}

fn to_value(v: impl Serialize) -> Result<Value, RpcError> {
    serde_json::to_value(v).map_err(|e| RpcError::new(-32603, format!("internal error: {e}")))
}

/// A JSON-RPC error response line.
pub fn error_response(id: &Value, code: i64, message: &str) -> String {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}).to_string()
}

// ------------------------------------------------------------------ runtime configuration

fn changes_json(c: &crate::mutate::Changes) -> Value {
    serde_json::json!({
        "added_subsystems": c.added_subsystems,
        "removed_subsystems": c.removed_subsystems,
        "changed_subsystems": c.changed_subsystems,
        "added_namespaces": c.added_namespaces,
        "removed_namespaces": c.removed_namespaces,
        "added_listeners": c.added_listeners.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
        "removed_listeners": c.removed_listeners.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
        "reactors_changed": c.reactors_changed,
        "restart_needed": c.restart_needed,
    })
}

fn str_param<'a>(params: &'a Value, key: &str) -> Result<&'a str, RpcError> {
    params
        .get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| RpcError::params(format!("missing string param '{key}'")))
}

fn toml_of(v: &Value) -> Result<toml::Value, RpcError> {
    toml::Value::try_from(v).map_err(|e| RpcError::params(format!("not representable in the conf file: {e}")))
}

fn array<'a>(doc: &'a mut toml::Table, key: &str) -> Result<&'a mut Vec<toml::Value>, RpcError> {
    match doc
        .entry(key.to_string())
        .or_insert_with(|| toml::Value::Array(Vec::new()))
    {
        toml::Value::Array(a) => Ok(a),
        _ => Err(RpcError::new(
            CONFIG_ERROR,
            format!("running conf: '{key}' is not an array"),
        )),
    }
}

fn subsystem_table<'a>(doc: &'a mut toml::Table, nqn: &str) -> Result<&'a mut toml::Table, RpcError> {
    array(doc, "subsystem")?
        .iter_mut()
        .filter_map(toml::Value::as_table_mut)
        .find(|t| t.get("nqn").and_then(toml::Value::as_str) == Some(nqn))
        .ok_or_else(|| RpcError::params(format!("no subsystem '{nqn}'")))
}

impl Ctx {
    /// Apply a new configuration; on error nothing changed.
    fn apply(&self, cfg: pollux_conf::Config) -> Result<Value, RpcError> {
        let ch = crate::mutate::reconcile(&self.shared, &self.remotes, cfg)
            .map_err(|e| RpcError::new(CONFIG_ERROR, e.to_string()))?;
        Ok(changes_json(&ch))
    }

    /// `reload`: re-read the conf file and apply the difference (an invalid file changes
    /// nothing; the error names file, line and column).
    fn reload(&self) -> Result<Value, RpcError> {
        let ch = crate::mutate::reload(&self.shared, &self.remotes)
            .map_err(|e| RpcError::new(CONFIG_ERROR, e.to_string()))?;
        Ok(changes_json(&ch))
    }

    /// `save {path?}`: write the running configuration as TOML (to the conf file by default).
    fn save(&self, params: &Value) -> Result<Value, RpcError> {
        let (text, origin) = {
            let c = self.shared.config.lock().unwrap_or_else(|p| p.into_inner());
            (c.to_toml(), c.origin.clone())
        };
        let path = match params.get("path") {
            Some(Value::String(p)) => p.clone(),
            Some(other) => return Err(RpcError::params(format!("'path' must be a string, got {other}"))),
            None if origin == pollux_conf::EMBEDDED_ORIGIN => {
                return Err(RpcError::params(
                    "running the embedded default: give a 'path' to save to",
                ));
            }
            None => origin,
        };
        std::fs::write(&path, text).map_err(|e| RpcError::new(CONFIG_ERROR, format!("cannot write {path}: {e}")))?;
        tracing::info!(file = %path, "control: running configuration saved");
        Ok(serde_json::json!({ "path": path }))
    }

    /// A mutation: edit the running conf as a TOML document, validate the result with the
    /// conf crate (every rule of a conf file applies), then reconcile.
    fn mutation(&self, method: &str, params: &Value) -> Result<Value, RpcError> {
        if !params.is_object() {
            return Err(RpcError::params(format!(
                "'{method}' takes named params (a JSON object)"
            )));
        }
        let (text, origin) = {
            let c = self.shared.config.lock().unwrap_or_else(|p| p.into_inner());
            (c.to_toml(), c.origin.clone())
        };
        let mut doc: toml::Table = text
            .parse()
            .map_err(|e| RpcError::new(CONFIG_ERROR, format!("running conf does not parse: {e}")))?;
        match method {
            "add_subsystem" => array(&mut doc, "subsystem")?.push(toml_of(params)?),
            "remove_subsystem" => {
                let nqn = str_param(params, "nqn")?;
                let subs = array(&mut doc, "subsystem")?;
                let before = subs.len();
                subs.retain(|t| t.get("nqn").and_then(toml::Value::as_str) != Some(nqn));
                if subs.len() == before {
                    return Err(RpcError::params(format!("no subsystem '{nqn}'")));
                }
            }
            "add_namespace" => {
                let nqn = str_param(params, "nqn")?;
                let mut ns = params.clone();
                if let Some(o) = ns.as_object_mut() {
                    o.remove("nqn");
                }
                let ns = toml_of(&ns)?;
                array(subsystem_table(&mut doc, nqn)?, "namespace")?.push(ns);
            }
            "remove_namespace" => {
                let nqn = str_param(params, "nqn")?;
                let nsid = params
                    .get("nsid")
                    .and_then(Value::as_i64)
                    .ok_or_else(|| RpcError::params("missing integer param 'nsid'"))?;
                let list = array(subsystem_table(&mut doc, nqn)?, "namespace")?;
                let before = list.len();
                list.retain(|t| t.get("nsid").and_then(toml::Value::as_integer) != Some(nsid));
                if list.len() == before {
                    return Err(RpcError::params(format!("subsystem '{nqn}' has no namespace {nsid}")));
                }
            }
            "add_host" | "remove_host" => {
                let (nqn, host) = (str_param(params, "nqn")?, str_param(params, "host")?);
                let hosts = array(subsystem_table(&mut doc, nqn)?, "hosts")?;
                let present = hosts.iter().any(|h| h.as_str() == Some(host));
                if method == "add_host" {
                    if present {
                        return Err(RpcError::params(format!("host '{host}' is already allowed on '{nqn}'")));
                    }
                    hosts.push(toml::Value::String(host.to_string()));
                } else {
                    if !present {
                        return Err(RpcError::params(format!(
                            "host '{host}' is not in the hosts of '{nqn}'"
                        )));
                    }
                    hosts.retain(|h| h.as_str() != Some(host));
                }
            }
            "set_allow_any_host" => {
                let nqn = str_param(params, "nqn")?;
                let allow = params
                    .get("allow")
                    .and_then(Value::as_bool)
                    .ok_or_else(|| RpcError::params("missing boolean param 'allow'"))?;
                subsystem_table(&mut doc, nqn)?.insert("allow_any_host".into(), toml::Value::Boolean(allow));
            }
            "add_listener" => {
                let a = str_param(params, "address")?;
                let mut t = toml::Table::new();
                t.insert("address".into(), toml::Value::String(a.to_string()));
                array(&mut doc, "listener")?.push(toml::Value::Table(t));
            }
            "remove_listener" => {
                let a = str_param(params, "address")?;
                let list = array(&mut doc, "listener")?;
                let before = list.len();
                list.retain(|t| t.get("address").and_then(toml::Value::as_str) != Some(a));
                if list.len() == before {
                    return Err(RpcError::params(format!(
                        "no listener '{a}' (use the address as configured)"
                    )));
                }
            }
            _ => return Err(RpcError::new(METHOD_NOT_FOUND, format!("method not found: '{method}'"))),
        }
        let new_text =
            toml::to_string(&doc).map_err(|e| RpcError::new(CONFIG_ERROR, format!("cannot write the conf: {e}")))?;
        let mut cfg =
            pollux_conf::Config::parse(&new_text, "<control>").map_err(|e| RpcError::params(e.to_string()))?;
        cfg.origin = origin;
        tracing::info!(method, "control: configuration change");
        self.apply(cfg)
    }
}
