//! SPDK's methods for a subsystem's hosts and the keys they name (SPDK v26.05
//! `doc/jsonrpc.md`: `nvmf_subsystem_add_host`, `nvmf_subsystem_remove_host`,
//! `nvmf_subsystem_allow_any_host`, `nvmf_ns_add_host`/`nvmf_ns_remove_host`, and
//! `keyring_file_add_key`, `keyring_file_remove_key`, `keyring_get_keys`): SPDK names a key
//! by its keyring name, pollux's conf by its file, so the keyring is the names of files,
//! kept by the control plane ([`super::spdk::SpdkState`]).

use serde_json::{Value, json};

use super::spdk::{invalid, obj, opt_bool, opt_str, opt_u64, req_str};
use super::{Ctx, RpcError};

impl Ctx {
    pub(super) fn spdk_add_host(&self, p: &Value) -> Result<Value, RpcError> {
        let o = obj(p)?;
        let (nqn, host) = (req_str(o, "nqn")?, req_str(o, "host")?);
        let mut t = json!({"nqn": nqn, "host": host});
        // SPDK names keys by their keyring name; pollux's conf names their files.
        for (spdk, ours) in [
            ("dhchap_key", "dhchap_key_file"),
            ("dhchap_ctrlr_key", "dhchap_ctrl_key_file"),
            ("psk", "tls_key_file"),
        ] {
            if let Some(name) = opt_str(o, spdk)? {
                let path = self.spdk().keys.get(name).cloned().ok_or_else(|| {
                    invalid(format!(
                        "'{spdk}': no key '{name}' in the keyring (keyring_file_add_key)"
                    ))
                })?;
                t[ours] = path.display().to_string().into();
            }
        }
        self.change("add_host", t)?;
        Ok(Value::Bool(true))
    }

    pub(super) fn spdk_keyring_add(&self, p: &Value) -> Result<Value, RpcError> {
        use std::os::unix::fs::PermissionsExt;
        let o = obj(p)?;
        let (name, path) = (req_str(o, "name")?, req_str(o, "path")?);
        let path = std::path::PathBuf::from(path);
        if !path.is_absolute() {
            return Err(invalid(format!("'path' {}: must be absolute", path.display())));
        }
        // As SPDK's keyring_file and pollux's own key files: owner-only, or refused.
        let meta = std::fs::metadata(&path).map_err(|e| invalid(format!("'path' {}: {e}", path.display())))?;
        if !meta.is_file() || meta.permissions().mode() & 0o077 != 0 {
            return Err(invalid(format!(
                "'path' {}: not a regular file readable by its owner only (mode {:04o})",
                path.display(),
                meta.permissions().mode() & 0o7777
            )));
        }
        let mut s = self.spdk();
        if s.keys.contains_key(name) {
            return Err(invalid(format!("key '{name}' already exists")));
        }
        s.keys.insert(name.to_string(), path);
        Ok(Value::Bool(true))
    }

    pub(super) fn spdk_keyring_remove(&self, p: &Value) -> Result<Value, RpcError> {
        let name = req_str(obj(p)?, "name")?;
        self.spdk()
            .keys
            .remove(name)
            .map(|_| Value::Bool(true))
            .ok_or_else(|| invalid(format!("key '{name}' not found")))
    }

    pub(super) fn spdk_keyring_get(&self, _: &Value) -> Result<Value, RpcError> {
        // Names and paths only: a key's contents never leave the file.
        Ok(Value::Array(
            self.spdk()
                .keys
                .iter()
                .map(|(n, p)| json!({"name": n, "path": p.display().to_string(), "removed": false, "probed": true, "refcnt": 1}))
                .collect(),
        ))
    }

    pub(super) fn spdk_remove_host(&self, p: &Value) -> Result<Value, RpcError> {
        let o = obj(p)?;
        self.change(
            "remove_host",
            json!({"nqn": req_str(o, "nqn")?, "host": req_str(o, "host")?}),
        )?;
        Ok(Value::Bool(true))
    }

    pub(super) fn spdk_allow_any_host(&self, p: &Value) -> Result<Value, RpcError> {
        let o = obj(p)?;
        let allow = opt_bool(o, "allow_any_host")?.ok_or_else(|| invalid("missing 'allow_any_host'"))?;
        self.change("set_allow_any_host", json!({"nqn": req_str(o, "nqn")?, "allow": allow}))?;
        Ok(Value::Bool(true))
    }

    pub(super) fn spdk_ns_host(&self, p: &Value, ours: &str) -> Result<Value, RpcError> {
        let o = obj(p)?;
        let nsid = opt_u64(o, "nsid")?.ok_or_else(|| invalid("missing 'nsid'"))?;
        self.change(
            ours,
            json!({"nqn": req_str(o, "nqn")?, "nsid": nsid, "host": req_str(o, "host")?}),
        )?;
        Ok(Value::Bool(true))
    }
}
