//! JSON-RPC 2.0 framing and dispatch: request lines to method calls and response lines, the
//! method list, and positional or named params.

use serde::Serialize;
use serde_json::{Value, json};

use super::{Ctx, INVALID_REQUEST, METHOD_NOT_FOUND, PARSE_ERROR, RpcError};

impl Ctx {
    // --------------------------------------------------------------- dispatch

    /// Run one method.
    pub fn call(&self, method: &str, params: &Value) -> Result<Value, RpcError> {
        match method {
            "version" => to_value(self.version()),
            "reactors" => to_value(self.reactors()),
            "subsystems" => to_value(self.subsystems()),
            "discovery" => to_value(self.discovery()),
            "controllers" => to_value(self.controllers()),
            "gateways" => self.gateways(),
            "group" => self.group(),
            "group_export" => self.group_export(params),
            "group_import" => self.group_import(params),
            "set_mode" => to_value(self.set_mode(params)?),
            "set_cpu_budget" => to_value(self.set_cpu_budget(params)?),
            "nvme_devices" => to_value(self.nvme_devices()),
            "nvme_fault" => self.nvme_fault(params),
            "resize_namespace" => self.resize_namespace(params),
            "reload" => self.reload(),
            "upgrade" => self.upgrade(params),
            "methods" => Ok(crate::control::methods::to_json()),
            "log_level" => log_level(params),
            "save" => self.save(params),
            "export_nvmet" => self.export_nvmet(params),
            "add_subsystem"
            | "remove_subsystem"
            | "add_namespace"
            | "remove_namespace"
            | "add_host"
            | "remove_host"
            | "set_host_keys"
            | "set_allow_any_host"
            | "set_subsystem_secure_concat"
            | "add_listener"
            | "remove_listener"
            | "subsystem_add_listener"
            | "subsystem_remove_listener"
            | "add_referral"
            | "remove_referral"
            | "set_ana_state"
            | "set_polling"
            | "ns_add_host"
            | "ns_remove_host"
            | "set_qos"
            | "set_ana_groups" => self.mutation(method, params),
            other if let Some(m) = super::spdk::find(other) => m.call(self, params),
            other if let Some(r) = super::spdk_config::call_tuning(other, params) => r,
            other => {
                let near = crate::control::methods::nearest(other);
                let hint = match near.as_slice() {
                    [] => String::new(),
                    [one] => format!("; did you mean '{one}'?"),
                    many => format!("; did you mean one of {}?", many.join(", ")),
                };
                Err(RpcError::new(
                    METHOD_NOT_FOUND,
                    format!("method not found: '{other}'{hint} (`pollux ctl methods` lists them)"),
                ))
            }
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

/// `log_level {level?}`: the process's log filter, set first when `level` is given.
fn log_level(params: &Value) -> Result<Value, RpcError> {
    if let Some(l) = param(params, "level", 0)? {
        let l = l
            .as_str()
            .ok_or_else(|| RpcError::params(format!("'level' must be a string, got {l}")))?;
        crate::log::set_filter(l).map_err(|e| RpcError::params(e.to_string()))?;
        tracing::info!(filter = l, "control: log filter set");
    }
    let filter = crate::log::filter().map_err(|e| RpcError::new(super::CONFIG_ERROR, e.to_string()))?;
    Ok(json!({ "filter": filter }))
}

/// Param `name` (object) or `pos` (array); Ok(None) if absent.
pub(super) fn param<'a>(params: &'a Value, name: &str, pos: usize) -> Result<Option<&'a Value>, RpcError> {
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
