//! SPDK JSON configs (what SPDK's `save_config` writes and `nvmf_tgt -c` reads:
//! `{"subsystems": [{"subsystem": "bdev", "config": [{"method": ..., "params": ...}]}, ...]}`):
//! served by replaying their method calls through [`super::spdk`]'s table, and written from
//! the running state. What cannot be expressed either way is refused, naming the method or
//! the namespace, never dropped.

use serde_json::{Map, Value, json};

use super::spdk::find;
use super::{CONFIG_ERROR, Ctx, INVALID_PARAMS, RpcError};

fn invalid(why: impl std::fmt::Display) -> RpcError {
    RpcError::new(INVALID_PARAMS, format!("Invalid parameters: {why}"))
}

/// SPDK's tuning methods that `save_config` always writes (thread pools, socket and buffer
/// options, the bdev layer's and its NVMe initiator's options), which pollux has no use for:
/// taken as they are, unless a param asks for behaviour pollux lacks (the check's refusal).
/// A tuning method's params checked: what pollux lacks that they ask for.
type TuningCheck = fn(&Map<String, Value>) -> Result<(), &'static str>;

/// Those methods' names (answered as methods too: `rpc.py load_config` calls them).
pub(super) const TUNING_METHODS: &[&str] = &[
    "framework_set_scheduler",
    "sock_set_default_impl",
    "sock_impl_set_options",
    "iobuf_set_options",
    "accel_set_options",
    "bdev_set_options",
    "bdev_raid_set_options",
    "bdev_nvme_set_options",
    "bdev_wait_for_examine",
    "nvmf_set_max_subsystems",
    "bdev_nvme_set_hotplug",
    "nvmf_set_crdt",
];

/// A tuning method called on its own: checked as in a config, then `true`.
pub(super) fn call_tuning(method: &str, params: &Value) -> Option<Result<Value, RpcError>> {
    let check = tuning(method)?;
    let empty = Map::new();
    Some(
        check(params.as_object().unwrap_or(&empty))
            .map(|()| Value::Bool(true))
            .map_err(|why| invalid(format!("{method}: {why}"))),
    )
}

pub(super) fn tuning(method: &str) -> Option<TuningCheck> {
    let any: TuningCheck = |_| Ok(());
    Some(match method {
        "framework_set_scheduler"
        | "sock_set_default_impl"
        | "sock_impl_set_options"
        | "iobuf_set_options"
        | "accel_set_options"
        | "bdev_set_options"
        | "bdev_raid_set_options"
        | "bdev_nvme_set_options"
        | "bdev_wait_for_examine"
        | "nvmf_set_max_subsystems" => any,
        "bdev_nvme_set_hotplug" => |p| {
            if p.get("enable") == Some(&Value::Bool(true)) {
                Err("PCIe hotplug of SPDK's NVMe bdevs: pollux has none")
            } else {
                Ok(())
            }
        },
        "nvmf_set_crdt" => |p| {
            if p.values().any(|v| v.as_u64().is_some_and(|n| n != 0)) {
                Err("command retry delay times (CRDT): pollux reports none")
            } else {
                Ok(())
            }
        },
        _ => return None,
    })
}

/// The calls of an SPDK JSON config `doc`, in order: every method checked before any is
/// made (a method pollux does not have refuses the whole config, naming it).
fn calls(doc: &Value) -> Result<Vec<(String, Value)>, RpcError> {
    let subs = doc
        .get("subsystems")
        .and_then(Value::as_array)
        .ok_or_else(|| invalid("not an SPDK JSON config: no 'subsystems' array"))?;
    let mut out = Vec::new();
    for s in subs {
        let name = s.get("subsystem").and_then(Value::as_str).unwrap_or("?");
        let config = match s.get("config") {
            None | Some(Value::Null) => continue,
            Some(Value::Array(c)) => c,
            Some(_) => return Err(invalid(format!("subsystem '{name}': 'config' is not an array"))),
        };
        for c in config {
            let method = c
                .get("method")
                .and_then(Value::as_str)
                .ok_or_else(|| invalid(format!("subsystem '{name}': an entry without 'method'")))?;
            let params = c.get("params").cloned().unwrap_or(Value::Null);
            if find(method).is_some() {
                out.push((method.to_string(), params));
            } else if let Some(check) = tuning(method) {
                let empty = Map::new();
                check(params.as_object().unwrap_or(&empty))
                    .map_err(|why| invalid(format!("{name}: {method}: {why}")))?;
            } else {
                return Err(invalid(format!(
                    "{name}: {method} has no pollux equivalent (conf/REFERENCE.md lists SPDK's methods pollux takes)"
                )));
            }
        }
    }
    Ok(out)
}

/// `[transport]` and listeners of the conf a target serving SPDK config `doc` starts from:
/// the TCP transport's sizes, and every address `nvmf_subsystem_add_listener` names (the
/// replay then serves each subsystem on its own). pollux needs a listener to start.
pub fn base_conf(doc: &Value) -> Result<String, RpcError> {
    let calls = calls(doc)?;
    let mut text = String::from("# Made from an SPDK JSON config (pollux --spdk-config).\n[reactors]\ncores = [0]\n");
    if let Some((_, p)) = calls.iter().find(|(m, _)| m == "nvmf_create_transport") {
        text.push_str("\n[transport]\n");
        for (spdk, ours) in [
            ("max_queue_depth", "io_queue_depth"),
            ("in_capsule_data_size", "in_capsule_data_size"),
            ("max_io_size", "max_io_size"),
        ] {
            if let Some(v) = p.get(spdk).and_then(Value::as_u64) {
                text.push_str(&format!("{ours} = {v}\n"));
            }
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    for (_, p) in calls.iter().filter(|(m, _)| m == "nvmf_subsystem_add_listener") {
        let Some(o) = p.as_object() else { continue };
        let address = super::spdk::listen_address(o)?;
        let secure = o.get("secure_channel") == Some(&Value::Bool(true));
        if seen.insert(address.clone()) {
            text.push_str(&format!("\n[[listener]]\naddress = \"{address}\"\n"));
            if secure {
                text.push_str("tls = \"required\"\n");
            }
        }
    }
    if seen.is_empty() {
        return Err(invalid(
            "the config names no listener (nvmf_subsystem_add_listener): pollux needs one to serve",
        ));
    }
    Ok(text)
}

/// The tuning methods `doc` calls (taken as they are: no pollux key says them), in order,
/// each once.
pub fn tuning_calls(doc: &Value) -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    let entries = doc
        .get("subsystems")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|s| s.get("config").and_then(Value::as_array))
        .flatten();
    for e in entries {
        let m = e.get("method").and_then(Value::as_str).unwrap_or("");
        if let Some(t) = TUNING_METHODS.iter().find(|t| **t == m)
            && !out.contains(t)
        {
            out.push(t);
        }
    }
    out
}

/// For `pollux convert --from spdk`, which replays `doc` on a target of its own that must
/// bind nothing another process holds (the SPDK target it replaces may still serve): every
/// `listen_address` of its calls moved to a loopback port of its own (`port` gives a free
/// one), the same address to the same port. (the address in the replay, the address it
/// stands for), for each.
pub fn loopback_listeners(
    doc: &mut Value,
    mut port: impl FnMut() -> std::io::Result<u16>,
) -> Result<Vec<(String, String)>, RpcError> {
    let mut map: Vec<(String, String)> = Vec::new();
    let entries = doc
        .get_mut("subsystems")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
        .filter_map(|s| s.get_mut("config").and_then(Value::as_array_mut))
        .flatten();
    for e in entries {
        let Some(params) = e.get_mut("params").and_then(Value::as_object_mut) else {
            continue;
        };
        if !params.contains_key("listen_address") {
            continue;
        }
        let original = super::spdk::listen_address(params)?;
        let replay = match map.iter().find(|(_, o)| *o == original) {
            Some((r, _)) => r.clone(),
            None => {
                let p = port().map_err(|e| invalid(format!("no free loopback port: {e}")))?;
                let r = format!("127.0.0.1:{p}");
                map.push((r.clone(), original));
                r
            }
        };
        let (addr, svc) = replay.split_once(':').unwrap_or((&replay, ""));
        if let Some(la) = params.get_mut("listen_address").and_then(Value::as_object_mut) {
            la.insert("adrfam".into(), "ipv4".into());
            la.insert("traddr".into(), addr.into());
            la.insert("trsvcid".into(), svc.into());
        }
    }
    Ok(map)
}

/// `framework_get_subsystems`: the config's subsystems in SPDK's initialization order, each
/// with what it depends on (`rpc.py save_config` asks for them, then each one's config).
pub(super) fn subsystems() -> Value {
    json!([
        {"subsystem": "keyring", "depends_on": []},
        {"subsystem": "bdev", "depends_on": ["keyring"]},
        {"subsystem": "nvmf", "depends_on": ["bdev", "keyring"]},
    ])
}

impl Ctx {
    /// `framework_get_config {name}`: one subsystem's part of [`Self::spdk_save_config`].
    pub(super) fn spdk_get_config(&self, params: &Value) -> Result<Value, RpcError> {
        let name = params
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| invalid("missing 'name'"))?;
        let all = self.spdk_save_config()?;
        all["subsystems"]
            .as_array()
            .and_then(|subs| subs.iter().find(|s| s["subsystem"] == name))
            .map(|s| s["config"].clone())
            .ok_or_else(|| invalid(format!("subsystem '{name}' not found")))
    }

    /// Serve SPDK JSON config `doc`: its calls, in order (`load_config`, `pollux
    /// --spdk-config`). A call that fails stops the replay, naming it.
    pub fn spdk_load_config(&self, doc: &Value) -> Result<Value, RpcError> {
        for (method, params) in calls(doc)? {
            let m = find(&method).ok_or_else(|| invalid(format!("{method}: not a method")))?;
            m.call(self, &params)
                .map_err(|e| RpcError::new(e.code, format!("{method}: {}", e.message)))?;
        }
        Ok(Value::Bool(true))
    }

    /// `save_config`: the running state as an SPDK JSON config: the keyring, a bdev for
    /// each namespace (its SPDK bdev, or one made for it: RAM as malloc, null as null, a
    /// file as aio), the TCP transport, each subsystem with its hosts, namespaces and
    /// listeners. A namespace SPDK has no bdev for (sim, a fake nvme device, rbd in a RADOS
    /// namespace) or a host with keys
    /// inline (no file to name) refuses the whole config, naming it.
    pub fn spdk_save_config(&self) -> Result<Value, RpcError> {
        let cfg = self.shared.config.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut keyring = Vec::new();
        let mut bdevs = Vec::new();
        // The Rados clusters written so far, and the name each was registered as.
        let mut clusters: Vec<(super::spdk_rbd::RbdCluster, String)> = Vec::new();
        // The NVMe controllers attached so far (BDF, controller name).
        let mut nvme_ctrls: Vec<(String, String)> = Vec::new();
        let mut nvmf = Vec::new();
        let t = &cfg.transport;
        nvmf.push(json!({"method": "nvmf_create_transport", "params": {
            "trtype": "TCP",
            "max_queue_depth": t.io_queue_depth,
            "in_capsule_data_size": t.in_capsule_data_size,
            "max_io_size": t.max_io_size,
        }}));
        // SPDK's DH-HMAC-CHAP hashes and groups are the target's, pollux's each subsystem's:
        // written when every subsystem has the same, other than the default.
        if let Some(first) = cfg.subsystems.first() {
            if let Some(other) = cfg.subsystems.iter().find(|s| s.dhchap != first.dhchap) {
                return Err(invalid(format!(
                    "subsystems {} and {} accept different DH-HMAC-CHAP hashes or groups: SPDK's (nvmf_set_config) are the whole target's",
                    first.nqn, other.nqn
                )));
            }
            if first.dhchap != pollux_conf::Dhchap::default() {
                nvmf.push(json!({"method": "nvmf_set_config", "params": {
                    "dhchap_digests": first.dhchap.hashes.iter().map(|h| h.name()).collect::<Vec<_>>(),
                    "dhchap_dhgroups": first.dhchap.dh_groups.iter().map(|g| g.name()).collect::<Vec<_>>(),
                }}));
            }
        }
        if cfg.discovery.filter != pollux_conf::DiscoveryFilter::default() {
            nvmf.push(
                json!({"method": "nvmf_set_config", "params": {"discovery_filter": cfg.discovery.filter.name()}}),
            );
        }
        let mut key_of = |path: &std::path::Path| -> String {
            let name = format!("key{}", keyring.len());
            keyring.push(
                json!({"method": "keyring_file_add_key", "params": {"name": name, "path": path.display().to_string()}}),
            );
            name
        };
        for s in &cfg.subsystems {
            nvmf.push(json!({"method": "nvmf_create_subsystem", "params": {
                "nqn": s.nqn,
                "allow_any_host": s.allow_any_host,
                "serial_number": s.serial,
                "model_number": s.model,
                "min_cntlid": s.min_cntlid,
                "max_cntlid": s.max_cntlid,
                "ana_reporting": true,
            }}));
            for h in &s.hosts {
                let mut p = json!({"nqn": s.nqn, "host": h});
                if let Some(k) = s.host_keys.get(h) {
                    let inline_ctrl = k.ctrl.as_ref().is_some_and(|c| c.file.is_none());
                    let (Some(key), false) = (k.host.file.as_deref(), inline_ctrl) else {
                        return Err(RpcError::new(
                            CONFIG_ERROR,
                            format!(
                                "host {h} of {}: its DH-HMAC-CHAP key is inline, and an SPDK config names key files",
                                s.nqn
                            ),
                        ));
                    };
                    p["dhchap_key"] = key_of(key).into();
                    if let Some(c) = k.ctrl.as_ref().and_then(|c| c.file.as_deref()) {
                        p["dhchap_ctrlr_key"] = key_of(c).into();
                    }
                }
                // The host's TLS PSK through the keyring (SPDK's `psk`), from its file; SPDK
                // derives as RFC 8446 says, so a libnvme-compat host has no SPDK form.
                if let Some(t) = s.tls_keys.get(h) {
                    let refuse = |why: &str| RpcError::new(CONFIG_ERROR, format!("host {h} of {}: {why}", s.nqn));
                    if t.key.derivation() != pollux_nvme::tls::PskDerivation::default() {
                        return Err(refuse(
                            "its TLS key's derivation is libnvme-compat, which SPDK's keyring cannot say",
                        ));
                    }
                    let Some(file) = t.file.as_deref() else {
                        return Err(refuse(
                            "its TLS key is inline (no file for SPDK's keyring to name): give it a tls_key_file",
                        ));
                    };
                    p["psk"] = key_of(file).into();
                }
                nvmf.push(json!({"method": "nvmf_subsystem_add_host", "params": p}));
            }
            for n in &s.namespaces {
                let mut name = self.bdev_name_of(&s.nqn, n.nsid);
                let blocks = |size: u64| size / u64::from(n.block_size);
                let uuid = uuid::Uuid::from_bytes(n.uuid).hyphenated().to_string();
                let create = match &n.backend {
                    pollux_conf::Backend::Nvme(pollux_conf::NvmeBackend {
                        device: pollux_conf::NvmeDevice::Pci(bdf),
                        nsid,
                    }) => {
                        // A controller attached once (named as SPDK's client named it, or
                        // NvmeN), its namespace's bdev named as SPDK names it.
                        let ctrl = match nvme_ctrls.iter().find(|(b, _)| b == bdf) {
                            Some((_, c)) => c.clone(),
                            None => {
                                let c = self
                                    .spdk()
                                    .bdevs
                                    .values()
                                    .find(|b| b.backend.pointer("/nvme/pci").and_then(Value::as_str) == Some(bdf))
                                    .and_then(|b| b.controller.clone())
                                    .unwrap_or_else(|| format!("Nvme{}", nvme_ctrls.len()));
                                bdevs.push(json!({"method": "bdev_nvme_attach_controller", "params": {
                                    "name": c, "trtype": "PCIe", "traddr": bdf}}));
                                nvme_ctrls.push((bdf.clone(), c.clone()));
                                c
                            }
                        };
                        name = format!("{ctrl}n{nsid}");
                        None
                    }
                    pollux_conf::Backend::Ram { size } => Some(json!({"method": "bdev_malloc_create", "params": {
                        "name": name, "num_blocks": blocks(*size), "block_size": n.block_size, "uuid": uuid}})),
                    pollux_conf::Backend::Null { size } => Some(json!({"method": "bdev_null_create", "params": {
                        "name": name, "num_blocks": blocks(*size), "block_size": n.block_size, "uuid": uuid}})),
                    pollux_conf::Backend::File(f) => Some(json!({"method": "bdev_aio_create", "params": {
                        "name": name, "filename": f.path.display().to_string(), "block_size": n.block_size}})),
                    pollux_conf::Backend::Rbd(r) if r.rados_namespace.is_none() => {
                        // The cluster as bdev_rbd_register_cluster named it, or one named
                        // here, registered once before its first image.
                        let key = super::spdk_rbd::RbdCluster {
                            user_id: Some(r.user.clone()),
                            config_file: Some(r.ceph_conf.display().to_string()),
                            key_file: r.keyring.as_ref().map(|k| k.display().to_string()),
                        };
                        let known = self.spdk().clusters.iter().find_map(|(cn, c)| {
                            (c.config_file.as_deref().unwrap_or("/etc/ceph/ceph.conf")
                                == key.config_file.as_deref().unwrap_or_default()
                                && c.user_id.as_deref().unwrap_or("admin") == r.user
                                && c.key_file == key.key_file)
                                .then(|| cn.clone())
                        });
                        let cluster = match clusters.iter().find(|(k, _)| *k == key) {
                            Some((_, cn)) => cn.clone(),
                            None => {
                                let cn = known.unwrap_or_else(|| format!("pollux_cluster{}", clusters.len()));
                                let mut p = json!({"name": cn, "config_file": key.config_file, "user_id": key.user_id});
                                if let Some(k) = &key.key_file {
                                    p["key_file"] = k.clone().into();
                                }
                                bdevs.push(json!({"method": "bdev_rbd_register_cluster", "params": p}));
                                clusters.push((key, cn.clone()));
                                cn
                            }
                        };
                        Some(json!({"method": "bdev_rbd_create", "params": {
                            "name": name, "pool_name": r.pool, "rbd_name": r.image, "block_size": n.block_size,
                            "cluster_name": cluster, "uuid": uuid}}))
                    }
                    other => {
                        return Err(RpcError::new(
                            CONFIG_ERROR,
                            format!(
                                "namespace {} of {}: SPDK has no bdev for a pollux {} namespace",
                                n.nsid,
                                s.nqn,
                                other.kind()
                            ),
                        ));
                    }
                };
                bdevs.extend(create);
                let mut ns = json!({
                    "nsid": n.nsid,
                    "bdev_name": name,
                    "uuid": uuid,
                    "nguid": n.nguid.iter().map(|b| format!("{b:02X}")).collect::<String>(),
                    "anagrpid": n.ana_group,
                    "no_auto_visible": n.hosts.is_some(),
                });
                if n.hosts.is_none() {
                    ns.as_object_mut().map(|o| o.remove("no_auto_visible"));
                }
                nvmf.push(json!({"method": "nvmf_subsystem_add_ns", "params": {"nqn": s.nqn, "namespace": ns}}));
                for h in n.hosts.iter().flatten() {
                    nvmf.push(
                        json!({"method": "nvmf_ns_add_host", "params": {"nqn": s.nqn, "nsid": n.nsid, "host": h}}),
                    );
                }
            }
            for l in cfg.listeners.iter().filter(|l| s.served_on(l.address)) {
                nvmf.push(json!({"method": "nvmf_subsystem_add_listener", "params": {
                    "nqn": s.nqn,
                    "listen_address": super::spdk::address_json(&l.address),
                    "secure_channel": l.tls == pollux_conf::TlsMode::Required,
                }}));
            }
        }
        Ok(json!({"subsystems": [
            {"subsystem": "keyring", "config": keyring},
            {"subsystem": "bdev", "config": bdevs},
            {"subsystem": "nvmf", "config": nvmf},
        ]}))
    }
}
