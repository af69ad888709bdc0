//! SPDK's JSON-RPC methods (SPDK v26.05 `doc/jsonrpc.md`), so that SPDK's own client
//! (`rpc.py`, the `spdk` Python package) and the programs built on it drive pollux as they
//! drive `nvmf_tgt`. Not a second control plane: each method is translated onto pollux's
//! own (the same run-time change `pollux ctl` makes, written by `pollux ctl save`), and
//! answers in SPDK's shapes and error codes.
//!
//! SPDK's model has bdevs: named stores created first (`bdev_malloc_create`, ...), attached
//! as namespaces later (`nvmf_subsystem_add_ns`). pollux's namespaces hold their store; the
//! bdevs created here are kept by the control plane until attached, and remembered by name
//! while attached (a namespace made otherwise has no bdev name: it is reported as
//! `NQN/nsid`). A bdev not attached lives in this process only, as an SPDK malloc bdev does.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Mutex;

use pollux_conf::TlsMode;
use serde_json::{Map, Value, json};

use super::spdk_bdev::{Bdev, BdevKind};
use super::{Ctx, INVALID_PARAMS, RpcError};

/// What SPDK's RPC layer keeps beside pollux's conf: the bdevs and whether the TCP
/// transport was created.
#[derive(Debug, Default)]
pub struct SpdkState {
    pub(super) bdevs: BTreeMap<String, Bdev>,
    /// bdev_rbd_register_cluster's clusters, by name.
    pub(super) clusters: BTreeMap<String, super::spdk_rbd::RbdCluster>,
    /// keyring_file_add_key's keys: name -> the owner-only file holding the key.
    pub(super) keys: BTreeMap<String, std::path::PathBuf>,
    transport_created: bool,
    /// nvmf_set_config's DH-HMAC-CHAP hashes and groups, for the subsystems created after it.
    dhchap: Option<Map<String, Value>>,
    /// The next `MallocN` / `NullN` number for a bdev created without a name.
    pub(super) next_auto: u32,
}

/// One SPDK method: its name and what it does here.
pub struct SpdkMethod {
    /// SPDK's name.
    pub name: &'static str,
    handler: fn(&Ctx, &Value) -> Result<Value, RpcError>,
}

const fn m(name: &'static str, handler: fn(&Ctx, &Value) -> Result<Value, RpcError>) -> SpdkMethod {
    SpdkMethod { name, handler }
}

/// Every SPDK method pollux answers.
pub const SPDK_METHODS: &[SpdkMethod] = &[
    m("spdk_get_version", |_, _| Ok(version())),
    m("rpc_get_methods", |_, _| Ok(method_names())),
    m("framework_start_init", |_, _| Ok(Value::Bool(true))),
    m("framework_wait_init", |_, _| Ok(Value::Bool(true))),
    m("nvmf_create_transport", Ctx::spdk_create_transport),
    m("nvmf_get_transports", Ctx::spdk_get_transports),
    m("nvmf_create_subsystem", Ctx::spdk_create_subsystem),
    m("nvmf_delete_subsystem", Ctx::spdk_delete_subsystem),
    m("nvmf_get_subsystems", Ctx::spdk_get_subsystems),
    m("nvmf_subsystem_add_listener", Ctx::spdk_add_listener),
    m("nvmf_subsystem_remove_listener", Ctx::spdk_remove_listener),
    m("nvmf_subsystem_get_listeners", Ctx::spdk_get_listeners),
    m("nvmf_subsystem_add_ns", Ctx::spdk_add_ns),
    m("nvmf_subsystem_remove_ns", Ctx::spdk_remove_ns),
    m("nvmf_subsystem_add_host", Ctx::spdk_add_host),
    m("nvmf_subsystem_remove_host", Ctx::spdk_remove_host),
    m("nvmf_subsystem_allow_any_host", Ctx::spdk_allow_any_host),
    m("nvmf_ns_add_host", |c, p| c.spdk_ns_host(p, "ns_add_host")),
    m("nvmf_ns_remove_host", |c, p| c.spdk_ns_host(p, "ns_remove_host")),
    m("bdev_malloc_create", |c, p| c.spdk_bdev_create(p, BdevKind::Malloc)),
    m("bdev_null_create", |c, p| c.spdk_bdev_create(p, BdevKind::Null)),
    m("bdev_aio_create", |c, p| c.spdk_bdev_create(p, BdevKind::Aio)),
    m("bdev_uring_create", |c, p| c.spdk_bdev_create(p, BdevKind::Uring)),
    m("bdev_malloc_delete", Ctx::spdk_bdev_delete),
    m("bdev_null_delete", Ctx::spdk_bdev_delete),
    m("bdev_aio_delete", Ctx::spdk_bdev_delete),
    m("bdev_uring_delete", Ctx::spdk_bdev_delete),
    m("bdev_rbd_register_cluster", Ctx::spdk_rbd_register_cluster),
    m("bdev_rbd_unregister_cluster", Ctx::spdk_rbd_unregister_cluster),
    m("bdev_rbd_get_clusters_info", Ctx::spdk_rbd_get_clusters_info),
    m("bdev_rbd_create", Ctx::spdk_rbd_create),
    m("bdev_rbd_delete", Ctx::spdk_bdev_delete),
    m("bdev_rbd_resize", Ctx::spdk_rbd_resize),
    m("bdev_nvme_attach_controller", Ctx::spdk_nvme_attach),
    m("bdev_nvme_detach_controller", Ctx::spdk_nvme_detach),
    m("bdev_get_bdevs", Ctx::spdk_get_bdevs),
    m("bdev_set_qos_limit", Ctx::spdk_set_qos_limit),
    m("bdev_get_iostat", Ctx::spdk_get_iostat),
    m("save_config", |c, _| c.spdk_save_config()),
    m("framework_get_subsystems", |_, _| Ok(super::spdk_config::subsystems())),
    m("framework_get_config", Ctx::spdk_get_config),
    m("load_config", Ctx::spdk_load_config),
    m("keyring_file_add_key", Ctx::spdk_keyring_add),
    m("keyring_file_remove_key", Ctx::spdk_keyring_remove),
    m("keyring_get_keys", Ctx::spdk_keyring_get),
    m("nvmf_subsystem_listener_set_ana_state", Ctx::spdk_set_ana_state),
    m("nvmf_subsystem_get_controllers", Ctx::spdk_get_controllers),
    m("nvmf_subsystem_get_qpairs", Ctx::spdk_get_qpairs),
    m("nvmf_get_stats", Ctx::spdk_get_stats),
    m("nvmf_set_config", Ctx::spdk_set_config),
    m("framework_get_reactors", Ctx::spdk_get_reactors),
    m("framework_get_scheduler", Ctx::spdk_get_scheduler),
    m("thread_get_stats", Ctx::spdk_thread_stats),
    m("thread_get_pollers", Ctx::spdk_thread_pollers),
    m("log_set_level", spdk_log_set_level),
    m("log_set_print_level", spdk_log_set_level),
    m("log_get_level", |_, _| spdk_log_level()),
    m("log_get_print_level", |_, _| spdk_log_level()),
];

/// SPDK's log levels and pollux's (tracing's) for each.
const LOG_LEVELS: [(&str, &str); 5] = [
    ("ERROR", "error"),
    ("WARNING", "warn"),
    ("NOTICE", "info"),
    ("INFO", "info"),
    ("DEBUG", "debug"),
];

/// `log_set_level {level}`: the process's log filter, as SPDK names levels.
fn spdk_log_set_level(_: &Ctx, p: &Value) -> Result<Value, RpcError> {
    let level = req_str(obj(p)?, "level")?;
    let ours = LOG_LEVELS
        .iter()
        .find(|(spdk, _)| spdk.eq_ignore_ascii_case(level))
        .map(|(_, ours)| *ours)
        .ok_or_else(|| invalid(format!("level '{level}': one of ERROR, WARNING, NOTICE, INFO, DEBUG")))?;
    crate::log::set_filter(ours).map_err(|e| RpcError::new(super::CONFIG_ERROR, e.to_string()))?;
    tracing::info!(filter = ours, "control: log filter set (SPDK log_set_level {level})");
    Ok(Value::Bool(true))
}

/// `log_get_level`: the filter's overall level, as SPDK names it.
fn spdk_log_level() -> Result<Value, RpcError> {
    let f = crate::log::filter().map_err(|e| RpcError::new(super::CONFIG_ERROR, e.to_string()))?;
    // The filter's default directive (the one without a module); `trace` reads as DEBUG.
    let level = f
        .split(',')
        .find(|d| !d.contains('='))
        .unwrap_or("info")
        .trim()
        .to_ascii_lowercase();
    let spdk = match level.as_str() {
        "error" | "off" => "ERROR",
        "warn" => "WARNING",
        "debug" | "trace" => "DEBUG",
        _ => "INFO",
    };
    Ok(Value::String(spdk.into()))
}

/// SPDK's method `name`, if pollux answers it.
pub fn find(name: &str) -> Option<&'static SpdkMethod> {
    SPDK_METHODS.iter().find(|m| m.name == name)
}

impl SpdkMethod {
    /// Run it.
    pub fn call(&self, ctx: &Ctx, params: &Value) -> Result<Value, RpcError> {
        (self.handler)(ctx, params)
    }
}

/// SPDK's answer to a bad param: -32602, naming it.
pub(super) fn invalid(why: impl std::fmt::Display) -> RpcError {
    RpcError::new(INVALID_PARAMS, format!("Invalid parameters: {why}"))
}

pub(super) fn obj(params: &Value) -> Result<&Map<String, Value>, RpcError> {
    match params {
        Value::Object(o) => Ok(o),
        Value::Null => Err(invalid("params are required")),
        _ => Err(invalid("params must be an object")),
    }
}

pub(super) fn req_str<'a>(o: &'a Map<String, Value>, key: &str) -> Result<&'a str, RpcError> {
    match o.get(key) {
        Some(Value::String(s)) => Ok(s),
        Some(v) => Err(invalid(format!("'{key}' must be a string, got {v}"))),
        None => Err(invalid(format!("missing '{key}'"))),
    }
}

pub(super) fn opt_str<'a>(o: &'a Map<String, Value>, key: &str) -> Result<Option<&'a str>, RpcError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(v) => Err(invalid(format!("'{key}' must be a string, got {v}"))),
    }
}

pub(super) fn opt_u64(o: &Map<String, Value>, key: &str) -> Result<Option<u64>, RpcError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| invalid(format!("'{key}' must be a non-negative integer, got {v}"))),
    }
}

pub(super) fn opt_bool(o: &Map<String, Value>, key: &str) -> Result<Option<bool>, RpcError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(invalid(format!("'{key}' must be true or false, got {v}"))),
    }
}

/// `spdk_get_version`: the SPDK release whose RPC surface pollux answers.
fn version() -> Value {
    json!({
        "version": format!("SPDK v26.05 (pollux {})", env!("CARGO_PKG_VERSION")),
        "fields": {"major": 26, "minor": 5, "patch": 0, "suffix": "-pollux"}
    })
}

/// `rpc_get_methods`: SPDK's methods pollux answers (its tuning methods included, which
/// `rpc.py load_config` checks a config against), then its own.
fn method_names() -> Value {
    let spdk = SPDK_METHODS.iter().map(|m| m.name);
    let tuning = super::spdk_config::TUNING_METHODS.iter().copied();
    let own = crate::control::methods::METHODS.iter().map(|m| m.name);
    Value::Array(spdk.chain(tuning).chain(own).map(|n| Value::String(n.into())).collect())
}

/// `IP:PORT` (`[IP]:PORT` for IPv6) of an SPDK `listen_address` object.
pub(super) fn listen_address(o: &Map<String, Value>) -> Result<String, RpcError> {
    let la = match o.get("listen_address") {
        Some(Value::Object(la)) => la,
        Some(v) => return Err(invalid(format!("'listen_address' must be an object, got {v}"))),
        None => return Err(invalid("missing 'listen_address'")),
    };
    let trtype = req_str(la, "trtype")?;
    if !trtype.eq_ignore_ascii_case("tcp") {
        return Err(invalid(format!("trtype '{trtype}': pollux serves TCP only")));
    }
    let traddr = req_str(la, "traddr")?;
    let trsvcid = match la.get("trsvcid") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        _ => return Err(invalid("missing 'listen_address.trsvcid'")),
    };
    let text = if traddr.contains(':') {
        format!("[{traddr}]:{trsvcid}")
    } else {
        format!("{traddr}:{trsvcid}")
    };
    text.parse::<SocketAddr>()
        .map_err(|e| invalid(format!("listen_address {text}: {e}")))?;
    Ok(text)
}

/// SPDK's `listen_address` object of `a`.
pub(super) fn address_json(a: &SocketAddr) -> Value {
    json!({
        "trtype": "TCP",
        "adrfam": if a.is_ipv4() { "IPv4" } else { "IPv6" },
        "traddr": a.ip().to_string(),
        "trsvcid": a.port().to_string(),
    })
}

/// Upper-case hex, as SPDK writes NGUIDs and EUI-64s.
fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02X}")).collect()
}

impl Ctx {
    /// The running configuration (run-time changes included).
    fn running(&self) -> pollux_conf::Config {
        self.shared.config.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The ANA groups of subsystem `nqn`'s namespaces.
    fn ana_groups_of(cfg: &pollux_conf::Config, nqn: &str) -> Result<std::collections::BTreeSet<u32>, RpcError> {
        let s = cfg
            .subsystems
            .iter()
            .find(|s| s.nqn == nqn)
            .ok_or_else(|| invalid(format!("subsystem {nqn} not found")))?;
        Ok(s.namespaces.iter().map(|n| n.ana_group).collect())
    }

    pub(super) fn spdk(&self) -> std::sync::MutexGuard<'_, SpdkState> {
        self.spdk.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A pollux mutation, its result not SPDK's business (SPDK answers `true`).
    pub(super) fn change(&self, method: &str, params: Value) -> Result<(), RpcError> {
        self.mutation(method, &params).map(|_| ())
    }

    fn spdk_create_transport(&self, p: &Value) -> Result<Value, RpcError> {
        let o = obj(p)?;
        let trtype = req_str(o, "trtype")?;
        if !trtype.eq_ignore_ascii_case("tcp") {
            return Err(invalid(format!(
                "Transport type '{trtype}' is not supported: pollux serves NVMe/TCP"
            )));
        }
        // Options that would change behaviour pollux does not have are refused; the sizes
        // are the conf's `[transport]` (nvmf_get_transports shows them) and the rest are
        // SPDK's own tuning (buffer pools, socket priority), which pollux has no use for.
        for (key, lacks) in [
            ("dif_insert_or_strip", "DIF insert/strip"),
            ("zcopy", "SPDK's zero-copy bdev path"),
        ] {
            if opt_bool(o, key)? == Some(true) {
                return Err(invalid(format!("'{key}': pollux has no {lacks}")));
            }
        }
        let mut s = self.spdk();
        if s.transport_created {
            return Err(invalid(format!("Transport type '{trtype}' already exists")));
        }
        s.transport_created = true;
        tracing::info!("control: SPDK nvmf_create_transport TCP (pollux's NVMe/TCP transport, as configured)");
        Ok(Value::Bool(true))
    }

    fn spdk_get_transports(&self, _: &Value) -> Result<Value, RpcError> {
        if !self.spdk().transport_created {
            return Ok(json!([]));
        }
        let t = &self.shared.transport;
        Ok(json!([{
            "trtype": "TCP",
            "max_queue_depth": t.io_queue_depth,
            "max_io_qpairs_per_ctrlr": t.io_queues_for(self.reactor_count()),
            "in_capsule_data_size": t.in_capsule_data_size,
            "max_io_size": t.max_io_size,
            "io_unit_size": t.max_h2c_data,
            "max_aq_depth": 32,
            "dif_insert_or_strip": false,
            "zcopy": false,
            "c2h_success": true,
            "sock_priority": 0,
            "abort_timeout_sec": 1,
        }]))
    }

    fn spdk_create_subsystem(&self, p: &Value) -> Result<Value, RpcError> {
        let o = obj(p)?;
        let nqn = req_str(o, "nqn")?;
        let mut t = json!({
            "nqn": nqn,
            "allow_any_host": opt_bool(o, "allow_any_host")?.unwrap_or(false),
            // No host until nvmf_subsystem_add_host (or allow_any_host).
            "hosts": [],
            // SPDK's subsystem is on no listener until nvmf_subsystem_add_listener.
            "listeners": [],
        });
        if let Some(s) = opt_str(o, "serial_number")? {
            t["serial"] = s.into();
        }
        if let Some(s) = opt_str(o, "model_number")? {
            t["model"] = s.into();
        }
        for (spdk, ours) in [("min_cntlid", "min_cntlid"), ("max_cntlid", "max_cntlid")] {
            if let Some(v) = opt_u64(o, spdk)? {
                t[ours] = v.into();
            }
        }
        // nvmf_set_config's DH-HMAC-CHAP lists, which SPDK applies to every subsystem.
        if let Some(d) = self.spdk().dhchap.clone() {
            for (k, v) in d {
                t[k] = v;
            }
        }
        // max_namespaces and ana_reporting: pollux has no namespace cap below the spec's and
        // always reports ANA (NVMe 2.0 §8.1.3); accepted as they are.
        opt_u64(o, "max_namespaces")?;
        opt_bool(o, "ana_reporting")?;
        if self.shared.snapshot.load().subsystem(nqn).is_some() {
            return Err(invalid(format!("Unable to create subsystem {nqn}: it exists")));
        }
        self.change("add_subsystem", t)?;
        Ok(Value::Bool(true))
    }

    /// `nvmf_set_config`: SPDK's target-wide options. `dhchap_digests` and `dhchap_dhgroups`
    /// become every subsystem's `dhchap_hashes` and `dhchap_dh_groups` (those there and
    /// those created after; SPDK takes the call only before its subsystems exist). Admin
    /// command passthrough is behaviour pollux lacks: refused. `discovery_filter` is
    /// `[discovery] filter`. `poll_groups_mask` (pollux's reactors are the conf's cores)
    /// and `dup_host_policy` are accepted as they are.
    fn spdk_set_config(&self, p: &Value) -> Result<Value, RpcError> {
        let empty = Map::new();
        let o = match p {
            Value::Null => &empty,
            _ => obj(p)?,
        };
        let passthru = o.get("admin_cmd_passthru").and_then(Value::as_object);
        if passthru.is_some_and(|m| m.values().any(|v| v == &Value::Bool(true))) {
            return Err(invalid("admin_cmd_passthru: pollux has no admin command passthrough"));
        }
        if let Some(f) = opt_str(o, "discovery_filter")? {
            if pollux_conf::DiscoveryFilter::parse(f).is_none() {
                return Err(invalid(format!(
                    "discovery_filter '{f}': match_any, or transport, address, svcid joined by ','"
                )));
            }
            self.change("set_discovery_filter", json!({ "filter": f }))?;
        }
        let mut d = Map::new();
        for (spdk, ours) in [
            ("dhchap_digests", "dhchap_hashes"),
            ("dhchap_dhgroups", "dhchap_dh_groups"),
        ] {
            match o.get(spdk) {
                None | Some(Value::Null) => {}
                Some(Value::Array(a)) if a.iter().all(Value::is_string) => {
                    let known = |n: &str| match spdk {
                        "dhchap_digests" => pollux_nvme::auth::HashId::from_name(n).is_some(),
                        _ => pollux_nvme::auth::DhGroup::from_name(n).is_some(),
                    };
                    if let Some(bad) = a.iter().filter_map(Value::as_str).find(|n| !known(n)) {
                        return Err(invalid(format!("'{spdk}': unknown '{bad}'")));
                    }
                    d.insert(ours.to_string(), Value::Array(a.clone()));
                }
                Some(_) => return Err(invalid(format!("'{spdk}' must be an array of strings"))),
            }
        }
        if d.is_empty() {
            return Ok(Value::Bool(true));
        }
        let nqns: Vec<String> = self
            .shared
            .snapshot
            .load()
            .subsystems
            .iter()
            .map(|s| s.nqn.clone())
            .collect();
        for nqn in nqns {
            let mut params = d.clone();
            params.insert("nqn".into(), nqn.into());
            self.change("set_subsystem_dhchap", Value::Object(params))?;
        }
        self.spdk().dhchap = Some(d);
        Ok(Value::Bool(true))
    }

    fn spdk_delete_subsystem(&self, p: &Value) -> Result<Value, RpcError> {
        let nqn = req_str(obj(p)?, "nqn")?;
        self.change("remove_subsystem", json!({ "nqn": nqn }))?;
        for b in self.spdk().bdevs.values_mut() {
            if b.attached.as_ref().is_some_and(|(n, _)| n == nqn) {
                b.attached = None;
            }
        }
        Ok(Value::Bool(true))
    }

    /// The bdev name of namespace `nsid` of `nqn`: the one attached there, else `NQN/nsid`.
    pub(super) fn bdev_name_of(&self, nqn: &str, nsid: u32) -> String {
        self.spdk()
            .bdevs
            .iter()
            .find(|(_, b)| b.attached.as_ref().is_some_and(|(n, i)| n == nqn && *i == nsid))
            .map_or_else(|| format!("{nqn}/{nsid}"), |(name, _)| name.clone())
    }

    fn spdk_get_subsystems(&self, p: &Value) -> Result<Value, RpcError> {
        let only = match p {
            Value::Object(o) => opt_str(o, "nqn")?.map(str::to_string),
            _ => None,
        };
        let cfg = self.running();
        let mut out = Vec::new();
        if only.is_none() || only.as_deref() == Some(pollux_conf::DISCOVERY_NQN) {
            out.push(json!({
                "nqn": pollux_conf::DISCOVERY_NQN,
                "subtype": "Discovery",
                "listen_addresses": cfg.listeners.iter().map(|l| address_json(&l.address)).collect::<Vec<_>>(),
                "allow_any_host": true,
                "hosts": [],
            }));
        }
        for s in &cfg.subsystems {
            if only.as_deref().is_some_and(|n| n != s.nqn) {
                continue;
            }
            let listeners: Vec<Value> = cfg
                .listeners
                .iter()
                .filter(|l| s.served_on(l.address))
                .map(|l| address_json(&l.address))
                .collect();
            let namespaces: Vec<Value> = s
                .namespaces
                .iter()
                .map(|n| {
                    let name = self.bdev_name_of(&s.nqn, n.nsid);
                    json!({
                        "nsid": n.nsid,
                        "bdev_name": name,
                        "name": name,
                        "nguid": hex(&n.nguid),
                        "uuid": uuid::Uuid::from_bytes(n.uuid).hyphenated().to_string(),
                        "anagrpid": n.ana_group,
                        "no_auto_visible": n.hosts.is_some(),
                    })
                })
                .collect();
            out.push(json!({
                "nqn": s.nqn,
                "subtype": "NVMe",
                "listen_addresses": listeners,
                "allow_any_host": s.allow_any_host,
                "hosts": s.hosts.iter().map(|h| json!({"nqn": h})).collect::<Vec<_>>(),
                "serial_number": s.serial,
                "model_number": s.model,
                "max_namespaces": 0,
                "min_cntlid": s.min_cntlid,
                "max_cntlid": s.max_cntlid,
                "namespaces": namespaces,
            }));
        }
        if let Some(n) = only
            && out.is_empty()
        {
            return Err(invalid(format!("subsystem {n} not found")));
        }
        Ok(Value::Array(out))
    }

    fn spdk_add_listener(&self, p: &Value) -> Result<Value, RpcError> {
        let o = obj(p)?;
        let nqn = req_str(o, "nqn")?;
        let address = listen_address(o)?;
        let secure = opt_bool(o, "secure_channel")?.unwrap_or(false);
        let cfg = self.running();
        let parsed: SocketAddr = address.parse().map_err(|e| invalid(format!("{address}: {e}")))?;
        let existing = cfg.listeners.iter().find(|l| l.address == parsed);
        if let Some(l) = existing
            && secure
            && l.tls != TlsMode::Required
        {
            return Err(invalid(format!(
                "listener {address} exists without secure_channel (tls = \"required\"); remove it first"
            )));
        }
        let added = existing.is_none();
        if added {
            let mut l = json!({ "address": address });
            if secure {
                l["tls"] = "required".into();
            }
            self.change("add_listener", l)?;
        }
        if let Err(e) = self.change("subsystem_add_listener", json!({"nqn": nqn, "address": address})) {
            if added {
                // Not half done: the listener this call opened goes again.
                let _ = self.change("remove_listener", json!({ "address": address }));
            }
            return Err(e);
        }
        Ok(Value::Bool(true))
    }

    fn spdk_remove_listener(&self, p: &Value) -> Result<Value, RpcError> {
        let o = obj(p)?;
        let nqn = req_str(o, "nqn")?;
        let address = listen_address(o)?;
        self.change("subsystem_remove_listener", json!({"nqn": nqn, "address": address}))?;
        Ok(Value::Bool(true))
    }

    fn spdk_get_listeners(&self, p: &Value) -> Result<Value, RpcError> {
        let nqn = req_str(obj(p)?, "nqn")?;
        let cfg = self.running();
        let groups = Self::ana_groups_of(&cfg, nqn)?;
        let Some(s) = cfg.subsystems.iter().find(|s| s.nqn == nqn) else {
            return Err(invalid(format!("subsystem {nqn} not found")));
        };
        Ok(Value::Array(
            cfg.listeners
                .iter()
                .filter(|l| s.served_on(l.address))
                .map(|l| {
                    let states: Vec<Value> = groups
                        .iter()
                        .map(|g| {
                            let st = l.ana.get(g).copied().unwrap_or_default();
                            json!({"ana_group": g, "ana_state": st.name().replace('-', "_")})
                        })
                        .collect();
                    json!({
                        "address": address_json(&l.address),
                        "secure_channel": l.tls == TlsMode::Required,
                        "ana_states": states,
                    })
                })
                .collect(),
        ))
    }

    fn spdk_add_ns(&self, p: &Value) -> Result<Value, RpcError> {
        let o = obj(p)?;
        let nqn = req_str(o, "nqn")?;
        let ns = match o.get("namespace") {
            Some(Value::Object(n)) => n,
            _ => return Err(invalid("missing 'namespace' object")),
        };
        let bdev_name = req_str(ns, "bdev_name")?;
        let bdev = {
            let s = self.spdk();
            let b = s
                .bdevs
                .get(bdev_name)
                .ok_or_else(|| invalid(format!("Unable to find bdev with name: {bdev_name}")))?;
            if let Some((n, i)) = &b.attached {
                return Err(invalid(format!("bdev {bdev_name} is claimed by namespace {i} of {n}")));
            }
            b.clone()
        };
        let snap = self.shared.snapshot.load();
        let sub = snap
            .subsystem(nqn)
            .ok_or_else(|| invalid(format!("Unable to find subsystem with NQN {nqn}")))?;
        let nsid = match opt_u64(ns, "nsid")? {
            Some(0) | None => (1u32..)
                .find(|i| sub.all_namespaces().all(|n| n.nsid != *i))
                .unwrap_or(1),
            Some(n) => u32::try_from(n).map_err(|_| invalid(format!("'nsid' {n} is out of range")))?,
        };
        let mut t = json!({
            "nqn": nqn,
            "nsid": nsid,
            "backend": bdev.backend,
            "uuid": opt_str(ns, "uuid")?.map_or_else(|| bdev.uuid.hyphenated().to_string(), str::to_string),
        });
        // An SSD's namespace has its device's block size (the conf names none for it).
        if bdev.backend.pointer("/nvme/pci").is_none() {
            t["block_size"] = bdev.block_size.into();
        }
        for key in ["nguid", "eui64"] {
            if let Some(v) = opt_str(ns, key)? {
                t[key] = v.replace('-', "").into();
            }
        }
        if let Some(g) = opt_u64(ns, "anagrpid")? {
            t["ana_group"] = g.into();
        }
        if opt_bool(ns, "no_auto_visible")? == Some(true) {
            // Attached to no host until nvmf_ns_add_host.
            t["hosts"] = json!([]);
        }
        self.change("add_namespace", t)?;
        if let Some(b) = self.spdk().bdevs.get_mut(bdev_name) {
            b.attached = Some((nqn.to_string(), nsid));
        }
        Ok(Value::from(nsid))
    }

    fn spdk_remove_ns(&self, p: &Value) -> Result<Value, RpcError> {
        let o = obj(p)?;
        let nqn = req_str(o, "nqn")?;
        let nsid = opt_u64(o, "nsid")?.ok_or_else(|| invalid("missing 'nsid'"))?;
        self.change("remove_namespace", json!({"nqn": nqn, "nsid": nsid}))?;
        for b in self.spdk().bdevs.values_mut() {
            if b.attached
                .as_ref()
                .is_some_and(|(n, i)| n == nqn && u64::from(*i) == nsid)
            {
                b.attached = None;
            }
        }
        Ok(Value::Bool(true))
    }

    /// `nvmf_subsystem_listener_set_ana_state`: pollux keeps ANA states per listener and
    /// group, so the state is set for the group on that listener (for every subsystem with
    /// namespaces in it); without `anagrpid`, for each group of the subsystem's namespaces.
    fn spdk_set_ana_state(&self, p: &Value) -> Result<Value, RpcError> {
        let o = obj(p)?;
        let nqn = req_str(o, "nqn")?;
        let address = listen_address(o)?;
        let state = req_str(o, "ana_state")?.replace('_', "-");
        let groups: Vec<u64> = match opt_u64(o, "anagrpid")? {
            Some(g) => vec![g],
            None => Self::ana_groups_of(&self.running(), nqn)?
                .into_iter()
                .map(u64::from)
                .collect(),
        };
        for g in groups {
            self.change(
                "set_ana_state",
                json!({"listener": address, "group": g, "state": state}),
            )?;
        }
        Ok(Value::Bool(true))
    }

    fn spdk_get_controllers(&self, p: &Value) -> Result<Value, RpcError> {
        let nqn = req_str(obj(p)?, "nqn")?;
        Ok(Value::Array(
            self.controllers()
                .controllers
                .iter()
                .filter(|c| c.subsystem == nqn)
                .map(|c| {
                    let mut v = json!({
                        "cntlid": c.cntlid,
                        "hostnqn": c.hostnqn,
                        "hostid": c.hostid,
                        "num_io_qpairs": c.io_queues.len(),
                    });
                    // How DH-HMAC-CHAP went, in SPDK's words (pollux's "sha384/ffdhe2048",
                    // "+ctrl" after it when bidirectional; not a generated TLS PSK's).
                    if let Some(a) = c.authenticated.as_ref().filter(|a| !a.starts_with("generated-psk")) {
                        let mut parts = a.split(['/', '+']);
                        v["auth"] = json!({
                            "state": "completed",
                            "digest": parts.next().unwrap_or(""),
                            "dhgroup": parts.next().unwrap_or(""),
                        });
                    }
                    v
                })
                .collect(),
        ))
    }
}

/// The state the RPC context keeps for SPDK's methods.
pub(super) fn state() -> Mutex<SpdkState> {
    Mutex::new(SpdkState::default())
}
