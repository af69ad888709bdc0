//! The runtime configuration methods: `reload`, `save` and the mutations (`add_subsystem`,
//! `add_namespace`, `add_host`, `ns_add_host`, `add_listener`, `add_referral`, ...) applied
//! to the running conf.

use serde_json::Value;

use toml_edit::TableLike;

use super::document::{self, Step};
use super::{CONFIG_ERROR, Ctx, METHOD_NOT_FOUND, RpcError, UPGRADE_REFUSED};

// ------------------------------------------------------------------ runtime configuration

pub(super) fn changes_json(c: &crate::mutate::Changes) -> Value {
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
        "hosts_changed": c.hosts_changed,
        "qos_changed": c.qos_changed,
        "reactors_changed": c.reactors_changed,
        "restart_needed": c.restart_needed,
    })
}

/// The integer param `nsid`.
fn nsid_param(params: &Value) -> Result<i64, RpcError> {
    params
        .get("nsid")
        .and_then(Value::as_i64)
        .ok_or_else(|| RpcError::params("missing integer param 'nsid'"))
}

pub(super) fn str_param<'a>(params: &'a Value, key: &str) -> Result<&'a str, RpcError> {
    params
        .get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| RpcError::params(format!("missing string param '{key}'")))
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
    pub(super) fn apply(&self, cfg: pollux_conf::Config) -> Result<Value, RpcError> {
        let ch = crate::mutate::reconcile(&self.shared, &self.remotes, cfg)
            .map_err(|e| RpcError::new(CONFIG_ERROR, e.to_string()))?;
        self.settled(&ch)?;
        Ok(changes_json(&ch))
    }

    /// A change of namespaces' hosts answers once every queue judges commands by the new
    /// hosts: a command a host sends after a detach has returned fails, whichever queue and
    /// reactor it takes (the controllers' new views reach their I/O queues by message).
    pub(super) fn settled(&self, ch: &crate::mutate::Changes) -> Result<(), RpcError> {
        if ch.hosts_changed.is_empty() || crate::mutate::settle(&self.remotes, super::REACTOR_TIMEOUT) {
            return Ok(());
        }
        Err(RpcError::new(
            super::REACTOR_UNAVAILABLE,
            format!(
                "the change was applied, but a reactor did not confirm within {} ms that its queues have the namespaces' new hosts",
                super::REACTOR_TIMEOUT.as_millis()
            ),
        ))
    }

    /// `reload`: re-read the conf file and apply the difference (an invalid file changes
    /// nothing; the error names file, line and column).
    pub(super) fn reload(&self) -> Result<Value, RpcError> {
        let ch = crate::mutate::reload(&self.shared, &self.remotes)
            .map_err(|e| RpcError::new(CONFIG_ERROR, e.to_string()))?;
        self.settled(&ch)?;
        Ok(changes_json(&ch))
    }

    /// `upgrade {binary?}`: hand the target to a new binary without downtime
    /// ([`crate::upgrade`]); default: the path this process was started from. On success
    /// the answer is the last thing this process sends: it exits once it is written.
    pub(super) fn upgrade(&self, params: &Value) -> Result<Value, RpcError> {
        let binary = match params.get("binary").and_then(Value::as_str) {
            Some(b) => std::path::PathBuf::from(b),
            None => crate::upgrade::old::default_binary()
                .ok_or_else(|| RpcError::new(CONFIG_ERROR, "the binary this process runs is unknown: give one"))?,
        };
        match crate::upgrade::old::upgrade(&self.shared, &self.remotes, &binary) {
            Ok(report) => {
                crate::upgrade::old::EXIT_AFTER_REPLY.store(true, std::sync::atomic::Ordering::SeqCst);
                serde_json::to_value(report).map_err(|e| RpcError::new(CONFIG_ERROR, e.to_string()))
            }
            Err(e) => Err(RpcError::new(UPGRADE_REFUSED, e.to_string())),
        }
    }

    /// A mutation: edit the running conf's document, validate the result with the conf
    /// crate (every rule of a conf file applies), then reconcile. A refusal names the param
    /// and the value the caller gave, not a line of a document they never saw.
    pub(super) fn mutation(&self, method: &str, params: &Value) -> Result<Value, RpcError> {
        if !params.is_object() {
            return Err(RpcError::params(format!(
                "'{method}' takes named params (a JSON object)"
            )));
        }
        if method == "set_ana_groups" && self.group.is_none() {
            return Err(RpcError::params(
                "'set_ana_groups' sets a gateway group's ANA group ownership: this target is in no group (set `[gateway] ana_groups` in its conf)",
            ));
        }
        if let Some(svc) = &self.group {
            return match self.group_scoped(method, params) {
                Some(me) => self.group_mutation(svc, &me, method, params),
                None => self.own_mutation(method, params),
            };
        }
        let running = self.shared.config.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mut doc = document::parse(&zeroize::Zeroizing::new(document_text(&running)))?;
        let edited = self.edit(&mut doc, method, params)?;
        let new_text = zeroize::Zeroizing::new(doc.to_string());
        let origin = running.origin.clone();
        let parsed = if origin == pollux_conf::EMBEDDED_ORIGIN {
            pollux_conf::Config::parse(&new_text, method)
        } else {
            pollux_conf::Config::parse_as(&new_text, method, std::path::Path::new(&origin))
        };
        let mut cfg = parsed.map_err(|e| refusal(method, &new_text, &edited, &e))?;
        cfg.origin = origin;
        tracing::info!(method, "control: configuration change");
        self.apply(cfg)
    }

    /// Edit `doc` as `method` says; the path of the item written (empty when the change
    /// removed something).
    pub(super) fn edit(
        &self,
        doc: &mut toml_edit::DocumentMut,
        method: &str,
        params: &Value,
    ) -> Result<Vec<Step>, RpcError> {
        let root = doc.as_table_mut() as &mut dyn TableLike;
        let key = |k: &str| Step::Key(k.to_string());
        let no_sub = |nqn: &str| RpcError::params(format!("no subsystem '{nqn}'"));
        Ok(match method {
            "add_subsystem" => {
                let i = document::push_table(root, "subsystem", document::table(params, &[], method)?)?;
                vec![key("subsystem"), Step::Index(i)]
            }
            "remove_subsystem" => {
                let nqn = str_param(params, "nqn")?;
                let gone = document::remove_where(root, "subsystem", |t| document::str_of(t, "nqn") == Some(nqn));
                if gone == 0 {
                    return Err(no_sub(nqn));
                }
                Vec::new()
            }
            "add_namespace" => {
                let nqn = str_param(params, "nqn")?;
                let ns = document::table(params, &["nqn"], method)?;
                let (i, sub) = document::find_mut(root, "subsystem", |t| document::str_of(t, "nqn") == Some(nqn))
                    .ok_or_else(|| no_sub(nqn))?;
                let j = document::push_table(sub, "namespace", ns)?;
                vec![key("subsystem"), Step::Index(i), key("namespace"), Step::Index(j)]
            }
            "remove_namespace" => {
                let nqn = str_param(params, "nqn")?;
                let nsid = nsid_param(params)?;
                let (_, sub) = document::find_mut(root, "subsystem", |t| document::str_of(t, "nqn") == Some(nqn))
                    .ok_or_else(|| no_sub(nqn))?;
                let gone = document::remove_where(sub, "namespace", |t| document::int_of(t, "nsid") == Some(nsid));
                if gone == 0 {
                    return Err(RpcError::params(format!("subsystem '{nqn}' has no namespace {nsid}")));
                }
                Vec::new()
            }
            "add_host" | "remove_host" | "set_host_keys" => {
                let (nqn, host) = (str_param(params, "nqn")?, str_param(params, "host")?);
                let keys = host_key_fields(params)?;
                let entry = if keys.is_empty() {
                    toml_edit::Value::from(host)
                } else {
                    let mut t = toml_edit::InlineTable::new();
                    t.insert("nqn", host.into());
                    for (k, v) in keys {
                        t.insert(k, v);
                    }
                    toml_edit::Value::InlineTable(t)
                };
                let (i, sub) = document::find_mut(root, "subsystem", |t| document::str_of(t, "nqn") == Some(nqn))
                    .ok_or_else(|| no_sub(nqn))?;
                let hosts: Vec<Option<String>> = match sub.get("hosts") {
                    Some(toml_edit::Item::Value(toml_edit::Value::Array(a))) => {
                        a.iter().map(|v| host_nqn(v).map(str::to_string)).collect()
                    }
                    _ => Vec::new(),
                };
                let at = hosts.iter().position(|h| h.as_deref() == Some(host));
                let path = |k: usize| vec![key("subsystem"), Step::Index(i), key("hosts"), Step::Index(k)];
                match (method, at) {
                    ("add_host", Some(_)) => {
                        return Err(RpcError::params(format!("host '{host}' is already allowed on '{nqn}'")));
                    }
                    ("add_host", None) => path(document::push_value(sub, "hosts", entry)?),
                    (_, None) => {
                        return Err(RpcError::params(format!(
                            "host '{host}' is not in the hosts of '{nqn}'"
                        )));
                    }
                    (m, Some(k)) => {
                        let Some(toml_edit::Item::Value(toml_edit::Value::Array(a))) = sub.get_mut("hosts") else {
                            return Err(RpcError::new(CONFIG_ERROR, "running conf: 'hosts' is not an array"));
                        };
                        if m == "remove_host" {
                            a.remove(k);
                            // A host the subsystem no longer admits is no namespace's: the
                            // namespaces that named it keep the rest of their hosts (none:
                            // attached to no host, never to every host).
                            for ns in document::tables_mut(sub, "namespace") {
                                if let Some(toml_edit::Item::Value(toml_edit::Value::Array(a))) = ns.get_mut("hosts") {
                                    a.retain(|v| v.as_str() != Some(host));
                                }
                            }
                            Vec::new()
                        } else {
                            a.replace(k, entry);
                            path(k)
                        }
                    }
                }
            }
            "ns_add_host" | "ns_remove_host" => {
                // Host masking (SPDK's nvmf_ns_add_host / nvmf_ns_remove_host): the
                // namespace's `hosts`. The conf checks that the subsystem admits the host.
                let (nqn, host) = (str_param(params, "nqn")?, str_param(params, "host")?);
                pollux_conf::validate_nqn(host)
                    .map_err(|e| RpcError::params(format!("'host' {host:?} is not a valid host NQN: {e}")))?;
                let nsid = nsid_param(params)?;
                let (i, sub) = document::find_mut(root, "subsystem", |t| document::str_of(t, "nqn") == Some(nqn))
                    .ok_or_else(|| no_sub(nqn))?;
                let (j, ns) = document::find_mut(sub, "namespace", |t| document::int_of(t, "nsid") == Some(nsid))
                    .ok_or_else(|| RpcError::params(format!("subsystem '{nqn}' has no namespace {nsid}")))?;
                let path = |k: usize| {
                    vec![
                        key("subsystem"),
                        Step::Index(i),
                        key("namespace"),
                        Step::Index(j),
                        key("hosts"),
                        Step::Index(k),
                    ]
                };
                let at = match ns.get("hosts") {
                    None => None,
                    Some(toml_edit::Item::Value(toml_edit::Value::Array(a))) => {
                        Some(a.iter().position(|v| v.as_str() == Some(host)))
                    }
                    Some(_) => {
                        return Err(RpcError::new(
                            CONFIG_ERROR,
                            "running conf: a namespace's 'hosts' is not an array",
                        ));
                    }
                };
                match (method, at) {
                    // The first host of a namespace that had none masks it from every other.
                    ("ns_add_host", None) => {
                        ns.insert("hosts", toml_edit::value(toml_edit::Array::from_iter([host])));
                        path(0)
                    }
                    ("ns_add_host", Some(Some(_))) => {
                        return Err(RpcError::params(format!(
                            "host '{host}' is already attached to namespace {nsid} of '{nqn}'"
                        )));
                    }
                    ("ns_add_host", Some(None)) => path(document::push_value(ns, "hosts", host.into())?),
                    (_, None) => {
                        return Err(RpcError::params(format!(
                            "namespace {nsid} of '{nqn}' has no hosts of its own: it is attached to every host the subsystem admits; ns-add-host the hosts that may see it first"
                        )));
                    }
                    (_, Some(None)) => {
                        return Err(RpcError::params(format!(
                            "host '{host}' is not attached to namespace {nsid} of '{nqn}'"
                        )));
                    }
                    (_, Some(Some(k))) => {
                        // The last host gone leaves `hosts = []`: attached to no host, never
                        // back to every host.
                        if let Some(toml_edit::Item::Value(toml_edit::Value::Array(a))) = ns.get_mut("hosts") {
                            a.remove(k);
                        }
                        Vec::new()
                    }
                }
            }
            "set_polling" => {
                // `{nqn, nsid, polling}` sets a namespace's; without `nsid`, the subsystem's
                // default (for its namespaces that set none). The conf validates the value.
                let nqn = str_param(params, "nqn")?;
                let polling = str_param(params, "polling")?;
                let (i, sub) = document::find_mut(root, "subsystem", |t| document::str_of(t, "nqn") == Some(nqn))
                    .ok_or_else(|| no_sub(nqn))?;
                match params.get("nsid") {
                    None | Some(Value::Null) => {
                        sub.insert("polling", toml_edit::value(polling));
                        vec![key("subsystem"), Step::Index(i), key("polling")]
                    }
                    Some(v) => {
                        let nsid = v
                            .as_i64()
                            .ok_or_else(|| RpcError::params(format!("'nsid' must be an integer, got {v}")))?;
                        let (j, ns) =
                            document::find_mut(sub, "namespace", |t| document::int_of(t, "nsid") == Some(nsid))
                                .ok_or_else(|| {
                                    RpcError::params(format!("subsystem '{nqn}' has no namespace {nsid}"))
                                })?;
                        ns.insert("polling", toml_edit::value(polling));
                        vec![
                            key("subsystem"),
                            Step::Index(i),
                            key("namespace"),
                            Step::Index(j),
                            key("polling"),
                        ]
                    }
                }
            }
            "set_ana_groups" => {
                // Only a group's document has the table (checked by `group_scoped`).
                let gw = str_param(params, "gateway")?;
                let mut a = toml_edit::Array::new();
                for g in params.get("groups").and_then(Value::as_array).into_iter().flatten() {
                    let n = g
                        .as_i64()
                        .ok_or_else(|| RpcError::params(format!("'groups' must be ANA group numbers, got {g}")))?;
                    a.push(n);
                }
                let t = root
                    .entry("ana_groups")
                    .or_insert(toml_edit::Item::Table(toml_edit::Table::new()))
                    .as_table_like_mut()
                    .ok_or_else(|| RpcError::new(CONFIG_ERROR, "the group's 'ana_groups' is not a table"))?;
                if a.is_empty() {
                    t.remove(gw);
                } else {
                    t.insert(gw, toml_edit::value(a));
                }
                vec![key("ana_groups"), key(gw)]
            }
            "set_qos" => {
                // `{nqn, nsid, iops?, mbps?, read_mbps?, write_mbps?}`, as SPDK's
                // `bdev_set_qos_limit`: a limit not given is kept, 0 or null removes it (the
                // conf itself refuses 0: there the key is left out). The conf validates what
                // is set, and the namespace's budget takes it in place (`crate::mutate`).
                let nqn = str_param(params, "nqn")?;
                let nsid = params
                    .get("nsid")
                    .and_then(Value::as_i64)
                    .ok_or_else(|| RpcError::params("missing integer param 'nsid'"))?;
                let limits = qos_fields(params)?;
                let (i, sub) = document::find_mut(root, "subsystem", |t| document::str_of(t, "nqn") == Some(nqn))
                    .ok_or_else(|| no_sub(nqn))?;
                let (j, ns) = document::find_mut(sub, "namespace", |t| document::int_of(t, "nsid") == Some(nsid))
                    .ok_or_else(|| RpcError::params(format!("subsystem '{nqn}' has no namespace {nsid}")))?;
                if ns.get("qos").is_none() {
                    ns.insert("qos", toml_edit::Item::Value(toml_edit::InlineTable::new().into()));
                }
                let Some(q) = ns.get_mut("qos").and_then(toml_edit::Item::as_table_like_mut) else {
                    return Err(RpcError::new(
                        CONFIG_ERROR,
                        "running conf: a namespace's 'qos' is not a table",
                    ));
                };
                for (k, v) in limits {
                    match v {
                        Some(n) => {
                            q.insert(k, toml_edit::value(n));
                        }
                        None => {
                            q.remove(k);
                        }
                    }
                }
                if q.is_empty() {
                    ns.remove("qos");
                    Vec::new()
                } else {
                    vec![
                        key("subsystem"),
                        Step::Index(i),
                        key("namespace"),
                        Step::Index(j),
                        key("qos"),
                    ]
                }
            }
            "set_allow_any_host" => {
                let nqn = str_param(params, "nqn")?;
                let allow = params
                    .get("allow")
                    .and_then(Value::as_bool)
                    .ok_or_else(|| RpcError::params("missing boolean param 'allow'"))?;
                let (i, sub) = document::find_mut(root, "subsystem", |t| document::str_of(t, "nqn") == Some(nqn))
                    .ok_or_else(|| no_sub(nqn))?;
                sub.insert("allow_any_host", toml_edit::value(allow));
                vec![key("subsystem"), Step::Index(i), key("allow_any_host")]
            }
            "set_discovery_filter" => {
                // SPDK's nvmf_set_config discovery_filter (spdk.rs): `[discovery] filter`,
                // checked as the conf's when the edited conf is parsed.
                let f = str_param(params, "filter")?;
                if root.get("discovery").is_none() {
                    root.insert("discovery", toml_edit::Item::Table(toml_edit::Table::new()));
                }
                let d = root
                    .get_mut("discovery")
                    .and_then(toml_edit::Item::as_table_like_mut)
                    .ok_or_else(|| RpcError::params("`discovery` is not a table"))?;
                d.insert("filter", toml_edit::value(f));
                vec![key("discovery"), key("filter")]
            }
            "set_subsystem_dhchap" => {
                // SPDK's nvmf_set_config (spdk.rs): the subsystem's hash functions and DH
                // groups, checked as the conf's when the edited conf is parsed.
                let nqn = str_param(params, "nqn")?;
                let (i, sub) = document::find_mut(root, "subsystem", |t| document::str_of(t, "nqn") == Some(nqn))
                    .ok_or_else(|| no_sub(nqn))?;
                for key in ["dhchap_hashes", "dhchap_dh_groups"] {
                    if let Some(Value::Array(a)) = params.get(key) {
                        let mut arr = toml_edit::Array::new();
                        for v in a.iter().filter_map(Value::as_str) {
                            arr.push(v);
                        }
                        sub.insert(key, toml_edit::value(arr));
                    }
                }
                vec![key("subsystem"), Step::Index(i)]
            }
            "set_subsystem_secure_concat" => {
                // Edited in place like `allow_any_host`. The subsystem is rebuilt without
                // dropping a controller; the snapshot is read at each AUTH_Negotiate, so the
                // change applies from a host's next (re-)authentication (TP 8018).
                let nqn = str_param(params, "nqn")?;
                let enable = params
                    .get("enable")
                    .and_then(Value::as_bool)
                    .ok_or_else(|| RpcError::params("missing boolean param 'enable'"))?;
                let (i, sub) = document::find_mut(root, "subsystem", |t| document::str_of(t, "nqn") == Some(nqn))
                    .ok_or_else(|| no_sub(nqn))?;
                sub.insert("secure_concat", toml_edit::value(enable));
                vec![key("subsystem"), Step::Index(i), key("secure_concat")]
            }
            "add_listener" => {
                let a = str_param(params, "address")?;
                let mut t = toml_edit::Table::new();
                // A gateway group's listener names the gateway that binds it.
                if let Some(g) = params.get("gateway").and_then(Value::as_str) {
                    t.insert("gateway", toml_edit::value(g));
                }
                t.insert("address", toml_edit::value(a));
                match params.get("tls") {
                    None | Some(Value::Null) => {}
                    Some(Value::String(m)) => {
                        t.insert("tls", toml_edit::value(m.as_str()));
                    }
                    Some(_) => return Err(RpcError::params("'tls' must be a string")),
                }
                let i = document::push_table(root, "listener", t)?;
                vec![key("listener"), Step::Index(i)]
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
                let mut list = document::tables_mut(root, "listener");
                let at = list
                    .iter()
                    .position(|t| document::str_of(&**t, "address") == Some(l))
                    .or_else(|| bound.iter().position(|b| b == l))
                    .ok_or_else(|| RpcError::params(format!("no listener '{l}'")))?;
                let t = list
                    .get_mut(at)
                    .ok_or_else(|| RpcError::new(CONFIG_ERROR, "running conf: a listener is not a table"))?;
                if t.get("ana").is_none() {
                    t.insert("ana", toml_edit::Item::Value(toml_edit::InlineTable::new().into()));
                }
                let Some(ana) = t.get_mut("ana").and_then(toml_edit::Item::as_table_like_mut) else {
                    return Err(RpcError::new(
                        CONFIG_ERROR,
                        "running conf: a listener's 'ana' is not a table",
                    ));
                };
                if s == pollux_conf::AnaState::Optimized {
                    ana.remove(&group.to_string());
                } else {
                    ana.insert(&group.to_string(), toml_edit::value(s.name()));
                }
                if ana.is_empty() {
                    t.remove("ana");
                    Vec::new()
                } else {
                    vec![key("listener"), Step::Index(at), key("ana")]
                }
            }
            "subsystem_add_listener" | "subsystem_remove_listener" => {
                // A subsystem's `listeners` (SPDK's nvmf_subsystem_add_listener and
                // remove_listener): absent is every listener of the conf.
                let (nqn, a) = (str_param(params, "nqn")?, str_param(params, "address")?);
                let configured: Vec<String> = document::tables_mut(root, "listener")
                    .into_iter()
                    .filter_map(|t| document::str_of(t, "address").map(str::to_string))
                    .collect();
                if !configured.iter().any(|c| c == a) {
                    return Err(RpcError::params(format!(
                        "no listener '{a}' (add it with add-listener first; use the address as configured)"
                    )));
                }
                let (i, sub) = document::find_mut(root, "subsystem", |t| document::str_of(t, "nqn") == Some(nqn))
                    .ok_or_else(|| no_sub(nqn))?;
                let listed: Option<Vec<String>> = match sub.get("listeners") {
                    None => None,
                    Some(toml_edit::Item::Value(toml_edit::Value::Array(l))) => {
                        Some(l.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
                    }
                    Some(_) => return Err(RpcError::new(CONFIG_ERROR, "running conf: 'listeners' is not an array")),
                };
                let now: Vec<String> = match (method, listed) {
                    // Served on every listener already: nothing to add.
                    ("subsystem_add_listener", None) => return Ok(Vec::new()),
                    ("subsystem_add_listener", Some(l)) if l.iter().any(|x| x == a) => {
                        return Err(RpcError::params(format!(
                            "subsystem '{nqn}' is served on '{a}' already"
                        )));
                    }
                    ("subsystem_add_listener", Some(mut l)) => {
                        l.push(a.to_string());
                        l
                    }
                    (_, None) => configured.into_iter().filter(|c| c != a).collect(),
                    (_, Some(l)) if !l.iter().any(|x| x == a) => {
                        return Err(RpcError::params(format!("subsystem '{nqn}' is not served on '{a}'")));
                    }
                    (_, Some(l)) => l.into_iter().filter(|c| c != a).collect(),
                };
                sub.insert(
                    "listeners",
                    toml_edit::value(now.into_iter().collect::<toml_edit::Array>()),
                );
                vec![key("subsystem"), Step::Index(i), key("listeners")]
            }
            "remove_listener" => {
                let a = str_param(params, "address")?;
                let gw = params.get("gateway").and_then(Value::as_str);
                let gone = document::remove_where(root, "listener", |t| {
                    document::str_of(t, "address") == Some(a) && (gw.is_none() || document::str_of(t, "gateway") == gw)
                });
                if gone == 0 {
                    return Err(RpcError::params(format!(
                        "no listener '{a}' (use the address as configured)"
                    )));
                }
                Vec::new()
            }
            "add_referral" => {
                let a = str_param(params, "address")?;
                let mut t = toml_edit::Table::new();
                t.insert("address", toml_edit::value(a));
                // The conf refuses a duplicate, a malformed address and one of the listeners
                // as configured; reconcile one reaching a bound listener.
                let i = document::push_table(root, "referral", t)?;
                vec![key("referral"), Step::Index(i)]
            }
            "remove_referral" => {
                let a = str_param(params, "address")?;
                // Compared parsed, so "[fd00:0::2]:8009" removes "[fd00::2]:8009".
                let want: Option<std::net::SocketAddr> = a.trim().parse().ok();
                let gone = document::remove_where(root, "referral", |t| {
                    let have = document::str_of(t, "address");
                    have == Some(a) || (want.is_some() && have.and_then(|h| h.parse().ok()) == want)
                });
                if gone == 0 {
                    return Err(RpcError::params(format!("no referral '{a}'")));
                }
                Vec::new()
            }
            _ => return Err(RpcError::new(METHOD_NOT_FOUND, format!("method not found: '{method}'"))),
        })
    }
}

/// The running conf's document: the text it was parsed from, or (a conf built in code) its
/// TOML.
pub(super) fn document_text(c: &pollux_conf::Config) -> String {
    match c.document.text() {
        "" => c.to_toml(),
        t => t.to_string(),
    }
}

/// A refusal of the edited document, in the terms of the change's params: the param (as a
/// dotted path) and the value given when the refusal points into what the change wrote.
fn refusal(method: &str, text: &str, edited: &[Step], e: &pollux_conf::ConfError) -> RpcError {
    let at = e.span().map(|s| s.start);
    // A key's value is never echoed (`dhchap_key`, `dhchap_ctrl_key`, `tls_key`).
    let secret = |p: &str| p.rsplit('.').next().is_some_and(|k| k.ends_with("_key"));
    match at.and_then(|at| document::param_at(text, edited, at)) {
        Some((param, shown)) if !shown.is_empty() && !secret(&param) => {
            RpcError::params(format!("{method}: param '{param}' = {shown}: {}", e.message()))
        }
        Some((param, _)) => RpcError::params(format!("{method}: param '{param}': {}", e.message())),
        None => RpcError::params(format!("{method}: {}", e.message())),
    }
}

/// The limits `set_qos` names: (key, Some(value) to set, None to remove). Each a non-negative
/// integer or null; 0 and null remove the limit. At least one must be given. The conf checks
/// the upper bound.
fn qos_fields(params: &Value) -> Result<Vec<(&'static str, Option<i64>)>, RpcError> {
    let mut out = Vec::new();
    for k in ["iops", "mbps", "read_mbps", "write_mbps"] {
        match params.get(k) {
            None => {}
            Some(Value::Null) => out.push((k, None)),
            Some(v) => match v.as_u64() {
                Some(0) => out.push((k, None)),
                Some(n) => out.push((k, Some(i64::try_from(n).unwrap_or(i64::MAX)))),
                None => {
                    let unit = if k == "iops" { "commands per second" } else { "MiB/s" };
                    return Err(RpcError::params(format!(
                        "'{k}' must be a non-negative integer ({unit}; 0 or null: no limit), got {v}"
                    )));
                }
            },
        }
    }
    if out.is_empty() {
        return Err(RpcError::params(
            "set_qos: give at least one of 'iops', 'mbps', 'read_mbps', 'write_mbps' (0 or null: no limit; those not given are kept)",
        ));
    }
    Ok(out)
}

/// The host NQN of a `hosts` entry: a string, or a table's `nqn`.
fn host_nqn(v: &toml_edit::Value) -> Option<&str> {
    match v {
        toml_edit::Value::String(s) => Some(s.value()),
        toml_edit::Value::InlineTable(t) => t.get("nqn").and_then(toml_edit::Value::as_str),
        _ => None,
    }
}

/// The key fields of `add_host` / `set_host_keys`: DH-HMAC-CHAP keys and the TLS PSK with
/// how the host derives from it, and the host's own DH-HMAC-CHAP hashes and DH groups
/// (`dhchap_hashes`, `dhchap_dh_groups`: arrays of strings, or one comma-separated string),
/// validated with the conf: a bad key or an open key file is refused there, with the reason
/// and never the key; a list without a `dhchap_key[_file]` likewise. `set_host_keys`
/// replaces all of a host's keys and lists.
fn host_key_fields(params: &Value) -> Result<Vec<(&'static str, toml_edit::Value)>, RpcError> {
    let mut out = Vec::new();
    for k in [
        "dhchap_key",
        "dhchap_key_file",
        "dhchap_ctrl_key",
        "dhchap_ctrl_key_file",
        "tls_key",
        "tls_key_file",
        "tls_key_derivation",
    ] {
        match params.get(k) {
            None | Some(Value::Null) => {}
            Some(Value::String(v)) => out.push((k, v.as_str().into())),
            Some(_) => return Err(RpcError::params(format!("'{k}' must be a string"))),
        }
    }
    for k in ["dhchap_hashes", "dhchap_dh_groups"] {
        let names: Vec<&str> = match params.get(k) {
            None | Some(Value::Null) => continue,
            Some(Value::String(v)) => v.split(',').map(str::trim).collect(),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| {
                    v.as_str()
                        .ok_or_else(|| RpcError::params(format!("'{k}' must be an array of strings, got {v} in it")))
                })
                .collect::<Result<_, _>>()?,
            Some(v) => {
                return Err(RpcError::params(format!(
                    "'{k}' must be an array of strings (or one comma-separated string), got {v}"
                )));
            }
        };
        out.push((k, toml_edit::Value::Array(names.into_iter().collect())));
    }
    Ok(out)
}
