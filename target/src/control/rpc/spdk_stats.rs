//! SPDK's views of connections and poll groups on pollux ([`super::spdk`]): a subsystem's
//! queue pairs (`nvmf_subsystem_get_qpairs`) and the target's per-poll-group figures
//! (`nvmf_get_stats`). SPDK's poll groups are pollux's reactors, named as SPDK names them.

use serde_json::{Value, json};

use super::spdk::{address_json, invalid, obj, req_str};
use super::{Ctx, RpcError};

/// SPDK's name of the poll group of reactor `i`.
fn poll_group(i: usize) -> String {
    format!("nvmf_tgt_poll_group_{i:03}")
}

impl Ctx {
    /// `nvmf_subsystem_get_qpairs {nqn}`: each controller's admin queue (qid 0) and I/O
    /// queues, with the listener they came through and the poll group (reactor) serving each.
    pub(super) fn spdk_get_qpairs(&self, p: &Value) -> Result<Value, RpcError> {
        let nqn = req_str(obj(p)?, "nqn")?;
        if self.shared.snapshot.load().subsystem(nqn).is_none() {
            return Err(invalid(format!("Unable to find subsystem with NQN {nqn}")));
        }
        let mut out = Vec::new();
        for c in self.controllers().controllers.iter().filter(|c| c.subsystem == nqn) {
            let listen = c
                .listener
                .as_deref()
                .and_then(|l| l.parse().ok())
                .map_or(Value::Null, |a| address_json(&a));
            let queues = std::iter::once((0u16, c.admin_reactor)).chain(c.io_queues.iter().map(|(q, r)| (*q, *r)));
            for (qid, reactor) in queues {
                out.push(json!({
                    "cntlid": c.cntlid,
                    "qid": qid,
                    "state": "active",
                    "thread": poll_group(reactor),
                    "hostnqn": c.hostnqn,
                    "listen_address": listen,
                }));
            }
        }
        Ok(Value::Array(out))
    }

    /// `nvmf_get_stats`: per poll group (reactor), its queue pairs open now and its commands.
    /// pollux counts the queues open, not those ever opened: `admin_qpairs` and `io_qpairs`
    /// are the current ones too.
    pub(super) fn spdk_get_stats(&self, _: &Value) -> Result<Value, RpcError> {
        let groups: Vec<Value> = (0..self.reactor_count())
            .map(|i| {
                let roles = self.shared.queue_roles.get(i);
                let load = |f: fn(&crate::shared::QueueRoles) -> &std::sync::atomic::AtomicU64| {
                    roles.map_or(0, |r| f(r).load(std::sync::atomic::Ordering::Relaxed))
                };
                let (admin, io) = (load(|r| &r.admin), load(|r| &r.io));
                let req = self.shared.requests.get(i).map(|q| q.snapshot()).unwrap_or_default();
                json!({
                    "name": poll_group(i),
                    "admin_qpairs": admin,
                    "io_qpairs": io,
                    "current_admin_qpairs": admin,
                    "current_io_qpairs": io,
                    "pending_bdev_io": req.open(),
                    "completed_nvme_io": req.ended,
                    "transports": [{"trtype": "TCP"}],
                })
            })
            .collect();
        Ok(json!({"tick_rate": 1_000_000_000u64, "poll_groups": groups}))
    }
}
