//! A gateway group's configuration through the control socket: which changes are the
//! group's and go to the cluster ([`crate::gateway::config`]), which are this gateway's own,
//! and `group`, `group_export`, `group_import`.

use serde_json::Value;
use toml_edit::TableLike;

use super::config::{changes_json, str_param};
use super::{CONFIG_ERROR, Ctx, RpcError, document};

impl From<crate::gateway::config::GroupConfigError> for RpcError {
    fn from(e: crate::gateway::config::GroupConfigError) -> Self {
        RpcError::new(CONFIG_ERROR, e.to_string())
    }
}

impl Ctx {
    pub(super) fn group_service(&self) -> Result<&crate::gateway::config::Service, RpcError> {
        self.group.as_deref().ok_or_else(|| {
            RpcError::new(
                super::INVALID_PARAMS,
                "this target is in no gateway group (its conf has no [gateway])",
            )
        })
    }

    /// `group`: the group's configuration as kept in the cluster (its keys sealed), its
    /// version, and the version every gateway applied.
    pub(super) fn group(&self) -> Result<Value, RpcError> {
        Ok(self.group_service()?.show()?)
    }

    /// `group_export {path}`: the group's configuration, its keys in clear, to a file
    /// written owner-only (a backup, or a group moved to another cluster).
    pub(super) fn group_export(&self, params: &Value) -> Result<Value, RpcError> {
        let path = str_param(params, "path")?;
        let (doc, version) = self.group_service()?.export()?;
        let text = zeroize::Zeroizing::new(format!(
            "# The configuration of a pollux gateway group, version {version}: `pollux ctl group import FILE` makes it a group's.\n{}",
            doc.as_str()
        ));
        let saved = pollux_conf::save::save(std::path::Path::new(path), &text, true)
            .map_err(|e| RpcError::new(CONFIG_ERROR, e.to_string()))?;
        tracing::info!(file = %path, version, "control: the group's configuration exported");
        Ok(serde_json::json!({
            "path": path,
            "version": version,
            "mode": format!("{:04o}", saved.mode),
        }))
    }

    /// `group_import {path}`: make a file's document (`group_export`'s) the group's
    /// configuration, as one change.
    pub(super) fn group_import(&self, params: &Value) -> Result<Value, RpcError> {
        let path = str_param(params, "path")?;
        let text = pollux_conf::Config::read_text(std::path::Path::new(path))
            .map_err(|e| RpcError::new(CONFIG_ERROR, e.to_string()))?;
        let new = pollux_conf::group::check(&text).map_err(|e| RpcError::new(CONFIG_ERROR, format!("{path}: {e}")))?;
        let svc = self.group_service()?;
        let (_, report) = svc.change("group_import", |doc| {
            *doc = new.clone();
            Ok::<(), RpcError>(())
        })?;
        self.group_answer(&report)
    }

    /// A group change's answer: what this gateway's reconciliation changed, once its queues
    /// have it, and the group's version and acknowledgements.
    fn group_answer(&self, report: &crate::gateway::config::Report) -> Result<Value, RpcError> {
        self.settled(&report.changes)?;
        let mut v = changes_json(&report.changes);
        v["group"] = serde_json::json!({
            "version": report.version,
            "acknowledged": report.notify.acked,
            "not_acknowledged": report.notify.timed_out,
            "tries": report.tries,
        });
        Ok(v)
    }

    /// In a gateway group: whether `method` with `params` changes the group (this gateway's
    /// name: Some) or this gateway's own conf. Subsystems added, listeners added (each names
    /// its gateway, this one by default), and anything done to a group subsystem or listener
    /// are the group's; the rest (referrals, ANA states of own listeners, local subsystems)
    /// this gateway's.
    pub(super) fn group_scoped(&self, method: &str, params: &Value) -> Option<String> {
        let g = self.shared.group.lock().unwrap_or_else(|p| p.into_inner());
        let gc = g.as_ref()?;
        let own_listener = |a: &str| {
            document::parse(&gc.doc).ok().is_some_and(|d| {
                let root = d.as_table() as &dyn TableLike;
                let gw = params.get("gateway").and_then(Value::as_str).unwrap_or(&gc.me);
                root.get("listener")
                    .and_then(toml_edit::Item::as_array_of_tables)
                    .is_some_and(|a2| {
                        a2.iter().any(|t| {
                            t.get("address").and_then(|v| v.as_str()) == Some(a)
                                && t.get("gateway").and_then(|v| v.as_str()) == Some(gw)
                        })
                    })
            })
        };
        let group = match method {
            "add_subsystem" | "add_listener" | "set_ana_groups" => true,
            "remove_listener" => params.get("address").and_then(Value::as_str).is_some_and(own_listener),
            _ => params
                .get("nqn")
                .and_then(Value::as_str)
                .is_some_and(|n| gc.subsystems.iter().any(|s| s == n)),
        };
        group.then(|| gc.me.clone())
    }

    /// A change of the group: made in the group's configuration in the cluster, applied
    /// here and on every gateway ([`crate::gateway::config::Service::change`]).
    pub(super) fn group_mutation(
        &self,
        svc: &crate::gateway::config::Service,
        me: &str,
        method: &str,
        params: &Value,
    ) -> Result<Value, RpcError> {
        let mut params = params.clone();
        if matches!(method, "add_listener" | "remove_listener" | "set_ana_groups")
            && params.get("gateway").is_none()
            && let Some(o) = params.as_object_mut()
        {
            o.insert("gateway".into(), Value::from(me));
        }
        let (_, report) = svc.change(method, |doc| self.edit(doc, method, &params).map(|_| ()))?;
        tracing::info!(method, version = report.version, "control: group configuration change");
        self.group_answer(&report)
    }

    /// A change of a group member's own conf: edited in its own document, run with the
    /// group's part as applied.
    pub(super) fn own_mutation(&self, method: &str, params: &Value) -> Result<Value, RpcError> {
        let mut g = self.shared.group.lock().unwrap_or_else(|p| p.into_inner());
        let Some(gc) = g.as_mut() else {
            return Err(RpcError::new(CONFIG_ERROR, "this gateway left its group meanwhile"));
        };
        let mut doc = document::parse(&gc.local)?;
        self.edit(&mut doc, method, params)?;
        let local = zeroize::Zeroizing::new(doc.to_string());
        let origin = self.shared.origin();
        let (cfg, merged) = gc
            .compose(&local, &gc.doc, gc.slot, &origin)
            .map_err(|e| RpcError::new(CONFIG_ERROR, format!("'{method}' is refused: {e}")))?;
        tracing::info!(method, "control: configuration change (this gateway's own)");
        let out = self.apply(cfg)?;
        gc.local = local;
        gc.took(merged);
        Ok(out)
    }
}
