//! The NVMe device methods: `nvme_devices` and `nvme_fault`.

use std::sync::Arc;

use serde_json::{Value, json};

use super::config::str_param;
use super::dispatch::param;
use super::{Ctx, RpcError};
use crate::backend::nvme::SsdNamespace;

impl Ctx {
    // --------------------------------------------------------------- NVMe devices

    /// The NVMe devices behind this target's namespaces, by name.
    fn ssd_devices(&self) -> std::collections::BTreeMap<String, Arc<crate::backend::nvme::SsdDevice>> {
        let snap = self.shared.snapshot.load();
        let mut out = std::collections::BTreeMap::new();
        for s in &snap.subsystems {
            for ns in s.all_namespaces() {
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
    pub(super) fn nvme_fault(&self, params: &Value) -> Result<Value, RpcError> {
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
}
