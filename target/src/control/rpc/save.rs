//! Writing the running configuration out: `save` (the conf file as its author wrote it,
//! with the run-time changes edited in; a gateway group's member writes its own part) and
//! `export_nvmet` (an nvmetcli config).

use serde_json::Value;

use super::config::{document_text, str_param};
use super::{CONFIG_ERROR, Ctx, RpcError};

impl Ctx {
    /// `save {path?}`: write the running configuration's document (the conf file as its
    /// author wrote it, with the run-time changes edited in) to the conf file, or to `path`.
    /// The write is atomic (a temporary file, fsync, rename) and the previous version is
    /// kept as `FILE.bak`; a document holding a key inline is written owner-only (0600).
    pub(super) fn save(&self, params: &Value) -> Result<Value, RpcError> {
        if let Some(p) = params.get("spdk_config") {
            let p = p
                .as_str()
                .ok_or_else(|| RpcError::params(format!("'spdk_config' must be a string, got {p}")))?;
            let doc = self.spdk_save_config()?;
            let text = serde_json::to_string_pretty(&doc).map_err(|e| RpcError::new(CONFIG_ERROR, e.to_string()))?;
            // It names key files, not keys: written as a conf without secrets is.
            let saved = pollux_conf::save::save(std::path::Path::new(p), &text, false)
                .map_err(|e| RpcError::new(CONFIG_ERROR, e.to_string()))?;
            tracing::info!(file = %p, "control: running configuration saved as an SPDK JSON config");
            return Ok(serde_json::json!({
                "path": p,
                "backup": saved.backup.map(|b| b.display().to_string()),
                "mode": format!("{:04o}", saved.mode),
            }));
        }
        let running = self.shared.config.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let path = match params.get("path") {
            Some(Value::String(p)) => p.clone(),
            Some(other) => return Err(RpcError::params(format!("'path' must be a string, got {other}"))),
            None if running.origin == pollux_conf::EMBEDDED_ORIGIN => {
                return Err(RpcError::params(
                    "running the embedded default: give a path to save to (`pollux ctl save --to FILE`)",
                ));
            }
            None => running.origin.clone(),
        };
        // The document may hold keys inline: zeroed when dropped. A gateway group's member
        // writes its own part: the group's is kept in the cluster.
        let own = self
            .shared
            .group
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|g| g.local.clone());
        let grouped = own.is_some();
        let text = own.unwrap_or_else(|| zeroize::Zeroizing::new(document_text(&running)));
        // Relative paths in the document resolve against the file's directory: saved
        // elsewhere, they must still name the same files.
        if path != running.origin && !grouped {
            let same = |mut c: pollux_conf::Config| {
                c.origin.clone_from(&running.origin);
                c == running
            };
            match pollux_conf::Config::parse_as(&text, &path, std::path::Path::new(&path)) {
                Ok(c) if same(c.clone()) => {}
                Ok(_) => {
                    return Err(RpcError::params(format!(
                        "saved to {path}, the conf's relative paths would name other files: save next to {} or use absolute paths",
                        running.origin
                    )));
                }
                Err(e) => return Err(RpcError::new(CONFIG_ERROR, format!("cannot save to {path}: {e}"))),
            }
        }
        let secret = running.has_inline_secrets();
        let saved = pollux_conf::save::save(std::path::Path::new(&path), &text, secret)
            .map_err(|e| RpcError::new(CONFIG_ERROR, e.to_string()))?;
        tracing::info!(file = %path, backup = ?saved.backup, "control: running configuration saved");
        Ok(serde_json::json!({
            "path": path,
            "backup": saved.backup.map(|b| b.display().to_string()),
            "mode": format!("{:04o}", saved.mode),
        }))
    }

    /// `export_nvmet {path}`: the running configuration as an nvmetcli config (Linux nvmet's
    /// `/etc/nvmet/config.json`), written atomically; what nvmet cannot serve (a RAM
    /// namespace, keys in files) refuses the export, naming it.
    pub(super) fn export_nvmet(&self, params: &Value) -> Result<Value, RpcError> {
        let path = str_param(params, "path")?;
        let running = self.shared.config.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let doc = pollux_conf::nvmet::from_config(&running).map_err(|e| RpcError::new(CONFIG_ERROR, e.to_string()))?;
        let text = serde_json::to_string_pretty(&doc).map_err(|e| RpcError::new(CONFIG_ERROR, e.to_string()))?;
        let saved = pollux_conf::save::save(std::path::Path::new(path), &text, false)
            .map_err(|e| RpcError::new(CONFIG_ERROR, e.to_string()))?;
        tracing::info!(file = %path, "control: running configuration exported as an nvmetcli config");
        Ok(serde_json::json!({
            "path": path,
            "backup": saved.backup.map(|b| b.display().to_string()),
            "mode": format!("{:04o}", saved.mode),
        }))
    }
}
