//! The reactor mode methods: `set_mode` and `set_cpu_budget`.

use pollux_reactor::Mode;
use serde_json::Value;

use super::dispatch::param;
use super::{Ctx, RpcError};
use crate::control::view::ModeView;

impl Ctx {
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
}
