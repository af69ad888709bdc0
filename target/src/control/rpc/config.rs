//! The runtime configuration methods: `reload`, `save` and the mutations (`add_subsystem`,
//! `add_namespace`, `add_host`, `add_listener`, `add_referral`, ...) applied to the running
//! conf.

use serde_json::Value;

use super::{CONFIG_ERROR, Ctx, METHOD_NOT_FOUND, RpcError};

// ------------------------------------------------------------------ runtime configuration

fn changes_json(c: &crate::mutate::Changes) -> Value {
    serde_json::json!({
        "added_subsystems": c.added_subsystems,
        "removed_subsystems": c.removed_subsystems,
        "changed_subsystems": c.changed_subsystems,
        "added_namespaces": c.added_namespaces,
        "removed_namespaces": c.removed_namespaces,
        "added_listeners": c.added_listeners.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
        "ana_changed": c.ana_changed.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
        "removed_listeners": c.removed_listeners.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
        "added_referrals": c.added_referrals.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
        "removed_referrals": c.removed_referrals.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
        "polling_changed": c.polling_changed,
        "reactors_changed": c.reactors_changed,
        "restart_needed": c.restart_needed,
    })
}

pub(super) fn str_param<'a>(params: &'a Value, key: &str) -> Result<&'a str, RpcError> {
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
    /// `resize_namespace` {nqn, nsid, size}: resize the namespace's store (an rbd image) and
    /// serve the new size; its hosts get a Namespace Attribute Changed event. `size` is bytes
    /// or a size string ("20GiB"). Nothing of the conf changes: an rbd namespace's size is
    /// its image's.
    pub(super) fn resize_namespace(&self, params: &Value) -> Result<Value, RpcError> {
        let nqn = str_param(params, "nqn")?;
        let nsid = params
            .get("nsid")
            .and_then(Value::as_u64)
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| RpcError::params("missing integer param 'nsid'"))?;
        let bytes = match params.get("size") {
            Some(Value::Number(n)) => n
                .as_u64()
                .ok_or_else(|| RpcError::params("'size' must be a positive integer"))?,
            Some(Value::String(s)) => {
                pollux_conf::parse_size(s).map_err(|e| RpcError::params(format!("'size' {s:?}: {e}")))?
            }
            _ => {
                return Err(RpcError::params(
                    "missing param 'size' (bytes, or a size such as \"20GiB\")",
                ));
            }
        };
        match crate::resize::resize_namespace(&self.shared, &self.remotes, nqn, nsid, bytes) {
            Ok(b) => Ok(serde_json::json!({"nqn": nqn, "nsid": nsid, "size": b})),
            Err(crate::resize::ResizeError::Params(m)) => Err(RpcError::params(m)),
            Err(crate::resize::ResizeError::Store(e)) => Err(RpcError::new(CONFIG_ERROR, e.to_string())),
        }
    }

    /// Apply a new configuration; on error nothing changed.
    fn apply(&self, cfg: pollux_conf::Config) -> Result<Value, RpcError> {
        let ch = crate::mutate::reconcile(&self.shared, &self.remotes, cfg)
            .map_err(|e| RpcError::new(CONFIG_ERROR, e.to_string()))?;
        Ok(changes_json(&ch))
    }

    /// `reload`: re-read the conf file and apply the difference (an invalid file changes
    /// nothing; the error names file, line and column).
    pub(super) fn reload(&self) -> Result<Value, RpcError> {
        let ch = crate::mutate::reload(&self.shared, &self.remotes)
            .map_err(|e| RpcError::new(CONFIG_ERROR, e.to_string()))?;
        Ok(changes_json(&ch))
    }

    /// `save {path?}`: write the running configuration as TOML (to the conf file by default).
    pub(super) fn save(&self, params: &Value) -> Result<Value, RpcError> {
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
    pub(super) fn mutation(&self, method: &str, params: &Value) -> Result<Value, RpcError> {
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
            "add_host" | "remove_host" | "set_host_keys" => {
                let (nqn, host) = (str_param(params, "nqn")?, str_param(params, "host")?);
                let keys = host_key_fields(params)?;
                let hosts = array(subsystem_table(&mut doc, nqn)?, "hosts")?;
                let at = hosts.iter().position(|h| host_nqn(h) == Some(host));
                let entry = || -> toml::Value {
                    if keys.is_empty() {
                        return toml::Value::String(host.to_string());
                    }
                    let mut t = toml::Table::new();
                    t.insert("nqn".into(), toml::Value::String(host.to_string()));
                    for (k, v) in &keys {
                        t.insert((*k).into(), toml::Value::String(v.clone()));
                    }
                    toml::Value::Table(t)
                };
                match (method, at) {
                    ("add_host", Some(_)) => {
                        return Err(RpcError::params(format!("host '{host}' is already allowed on '{nqn}'")));
                    }
                    ("add_host", None) => hosts.push(entry()),
                    (_, None) => {
                        return Err(RpcError::params(format!(
                            "host '{host}' is not in the hosts of '{nqn}'"
                        )));
                    }
                    ("remove_host", Some(i)) => {
                        hosts.remove(i);
                    }
                    (_, Some(i)) => hosts[i] = entry(),
                }
            }
            "set_polling" => {
                // `{nqn, nsid, polling}` sets a namespace's; without `nsid`, the subsystem's
                // default (for its namespaces that set none). The conf validates the value.
                let nqn = str_param(params, "nqn")?;
                let polling = str_param(params, "polling")?;
                let value = toml::Value::String(polling.to_string());
                let sub = subsystem_table(&mut doc, nqn)?;
                match params.get("nsid") {
                    None | Some(Value::Null) => {
                        sub.insert("polling".into(), value);
                    }
                    Some(v) => {
                        let nsid = v
                            .as_i64()
                            .ok_or_else(|| RpcError::params(format!("'nsid' must be an integer, got {v}")))?;
                        let ns = array(sub, "namespace")?
                            .iter_mut()
                            .filter_map(toml::Value::as_table_mut)
                            .find(|t| t.get("nsid").and_then(toml::Value::as_integer) == Some(nsid))
                            .ok_or_else(|| RpcError::params(format!("subsystem '{nqn}' has no namespace {nsid}")))?;
                        ns.insert("polling".into(), value);
                    }
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
                match params.get("tls") {
                    None | Some(Value::Null) => {}
                    Some(Value::String(m)) => {
                        t.insert("tls".into(), toml::Value::String(m.clone()));
                    }
                    Some(_) => return Err(RpcError::params("'tls' must be a string")),
                }
                array(&mut doc, "listener")?.push(toml::Value::Table(t));
            }
            "set_ana_state" => {
                let l = str_param(params, "listener")?;
                let group = params
                    .get("group")
                    .and_then(Value::as_u64)
                    .filter(|g| (1..=u64::from(pollux_conf::ANAGRPMAX)).contains(g))
                    .ok_or_else(|| {
                        RpcError::params(format!(
                            "'group' must be an ANA group id, 1 to {}",
                            pollux_conf::ANAGRPMAX
                        ))
                    })?;
                let state = str_param(params, "state")?;
                let s = pollux_conf::AnaState::from_name(state).ok_or_else(|| {
                    RpcError::params(format!(
                        "unknown ANA state '{state}': optimized, non-optimized, inaccessible, persistent-loss or change"
                    ))
                })?;
                // The listener as configured, or as bound (a `:0` listener's port).
                let bound: Vec<String> = self
                    .shared
                    .snapshot
                    .load()
                    .listeners
                    .iter()
                    .map(|b| b.addr.to_string())
                    .collect();
                let list = array(&mut doc, "listener")?;
                let at = list
                    .iter()
                    .position(|t| t.get("address").and_then(toml::Value::as_str) == Some(l))
                    .or_else(|| bound.iter().position(|b| b == l))
                    .ok_or_else(|| RpcError::params(format!("no listener '{l}'")))?;
                let t = list
                    .get_mut(at)
                    .and_then(toml::Value::as_table_mut)
                    .ok_or_else(|| RpcError::new(CONFIG_ERROR, "running conf: a listener is not a table"))?;
                let ana = t.entry("ana").or_insert_with(|| toml::Value::Table(toml::Table::new()));
                let Some(ana) = ana.as_table_mut() else {
                    return Err(RpcError::new(
                        CONFIG_ERROR,
                        "running conf: a listener's 'ana' is not a table",
                    ));
                };
                if s == pollux_conf::AnaState::Optimized {
                    ana.remove(&group.to_string());
                } else {
                    ana.insert(group.to_string(), toml::Value::String(s.name().to_string()));
                }
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
            "add_referral" => {
                let a = str_param(params, "address")?;
                let mut t = toml::Table::new();
                t.insert("address".into(), toml::Value::String(a.to_string()));
                // The conf refuses a duplicate, a malformed address and one of the listeners
                // as configured; reconcile one reaching a bound listener.
                array(&mut doc, "referral")?.push(toml::Value::Table(t));
            }
            "remove_referral" => {
                let a = str_param(params, "address")?;
                // Compared parsed, so "[fd00:0::2]:8009" removes "[fd00::2]:8009".
                let want: Option<std::net::SocketAddr> = a.trim().parse().ok();
                let list = array(&mut doc, "referral")?;
                let before = list.len();
                list.retain(|t| {
                    let have = t.get("address").and_then(toml::Value::as_str);
                    have != Some(a) && (want.is_none() || have.and_then(|h| h.parse().ok()) != want)
                });
                if list.len() == before {
                    return Err(RpcError::params(format!("no referral '{a}'")));
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

/// The host NQN of a `hosts` entry: a string, or a table's `nqn`.
fn host_nqn(v: &toml::Value) -> Option<&str> {
    match v {
        toml::Value::String(s) => Some(s),
        toml::Value::Table(t) => t.get("nqn").and_then(toml::Value::as_str),
        _ => None,
    }
}

/// The key fields of `add_host` / `set_host_keys`: DH-HMAC-CHAP keys and the TLS PSK
/// (validated with the conf: a bad key or an open key file is refused there, with the
/// reason and never the key). `set_host_keys` replaces all of a host's keys.
fn host_key_fields(params: &Value) -> Result<Vec<(&'static str, String)>, RpcError> {
    let mut out = Vec::new();
    for k in [
        "dhchap_key",
        "dhchap_key_file",
        "dhchap_ctrl_key",
        "dhchap_ctrl_key_file",
        "tls_key",
        "tls_key_file",
    ] {
        match params.get(k) {
            None | Some(Value::Null) => {}
            Some(Value::String(v)) => out.push((k, v.clone())),
            Some(_) => return Err(RpcError::params(format!("'{k}' must be a string"))),
        }
    }
    Ok(out)
}
