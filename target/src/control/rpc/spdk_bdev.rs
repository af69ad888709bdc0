//! SPDK's bdevs on pollux ([`super::spdk`]): named stores created first
//! (`bdev_malloc_create`, `bdev_null_create`, `bdev_aio_create`, `bdev_uring_create`), attached
//! as namespaces later (`nvmf_subsystem_add_ns`), deleted, listed, limited
//! (`bdev_set_qos_limit`) and counted (`bdev_get_iostat`).

use serde_json::{Value, json};

use super::spdk::{invalid, obj, opt_str, opt_u64, req_str};
use super::{Ctx, RpcError};

/// A bdev: a named store, and the namespace it backs once attached.
#[derive(Debug, Clone)]
pub(super) struct Bdev {
    pub(super) product: &'static str,
    pub(super) block_size: u32,
    pub(super) num_blocks: u64,
    pub(super) uuid: uuid::Uuid,
    /// pollux's backend table for it (`{"ram": {"size": ...}}`, ...).
    pub(super) backend: Value,
    /// (subsystem NQN, NSID) once attached.
    pub(super) attached: Option<(String, u32)>,
    /// The registered Rados cluster of an rbd bdev (`bdev_rbd_register_cluster`).
    pub(super) cluster: Option<String>,
    /// The NVMe controller (`bdev_nvme_attach_controller`'s name) of an NVMe bdev.
    pub(super) controller: Option<String>,
}

/// A new bdev's name: `given`, or the next free `PREFIXn` (none without a prefix); one in use
/// is refused.
pub(super) fn new_name(s: &mut super::spdk::SpdkState, given: Option<&str>, prefix: &str) -> Result<String, RpcError> {
    let name = match given {
        Some(n) if !n.is_empty() => n.to_owned(),
        _ if prefix.is_empty() => return Err(invalid("missing 'name'")),
        _ => loop {
            let n = format!("{prefix}{}", s.next_auto);
            s.next_auto += 1;
            if !s.bdevs.contains_key(&n) {
                break n;
            }
        },
    };
    if s.bdevs.contains_key(&name) {
        return Err(invalid(format!("Bdev name {name} already exists")));
    }
    Ok(name)
}

/// The `uuid` param, or a random one.
pub(super) fn uuid_param(o: &serde_json::Map<String, Value>) -> Result<uuid::Uuid, RpcError> {
    match opt_str(o, "uuid")? {
        Some(u) => uuid::Uuid::parse_str(u).map_err(|e| invalid(format!("'uuid' {u}: {e}"))),
        None => {
            let mut b = [0u8; 16];
            getrandom::fill(&mut b)
                .map_err(|e| RpcError::new(super::CONFIG_ERROR, format!("no random bytes for a UUID: {e}")))?;
            Ok(uuid::Builder::from_random_bytes(b).into_uuid())
        }
    }
}

/// The kinds of bdev that map onto pollux backends.
#[derive(Debug, Clone, Copy)]
pub(super) enum BdevKind {
    Malloc,
    Null,
    Aio,
    Uring,
}

impl Ctx {
    pub(super) fn spdk_bdev_create(&self, p: &Value, kind: BdevKind) -> Result<Value, RpcError> {
        let o = obj(p)?;
        let block_size = opt_u64(o, "block_size")?.unwrap_or(512);
        if block_size != 512 && block_size != 4096 {
            return Err(invalid(format!("block_size {block_size}: pollux serves 512 or 4096")));
        }
        let (product, backend, num_blocks, prefix) = match kind {
            BdevKind::Malloc | BdevKind::Null => {
                let num_blocks = opt_u64(o, "num_blocks")?.ok_or_else(|| invalid("missing 'num_blocks'"))?;
                if num_blocks == 0 {
                    return Err(invalid("'num_blocks' must be above 0"));
                }
                let size = num_blocks
                    .checked_mul(block_size)
                    .ok_or_else(|| invalid("'num_blocks' x 'block_size' overflows"))?;
                match kind {
                    BdevKind::Malloc => ("Malloc disk", json!({"ram": {"size": size}}), num_blocks, "Malloc"),
                    _ => ("Null disk", json!({"null": {"size": size}}), num_blocks, "Null"),
                }
            }
            BdevKind::Aio | BdevKind::Uring => {
                let path = req_str(o, "filename")?;
                let len = file_len(path).map_err(|e| invalid(format!("Could not open {path}: {e}")))?;
                if len < block_size || len % block_size != 0 {
                    return Err(invalid(format!(
                        "{path}: {len} bytes is not a whole number of {block_size}-byte blocks"
                    )));
                }
                let product = if matches!(kind, BdevKind::Aio) {
                    "AIO disk"
                } else {
                    "URING bdev"
                };
                (product, json!({"file": {"path": path}}), len / block_size, "")
            }
        };
        let uuid = uuid_param(o)?;
        let mut s = self.spdk();
        let name = new_name(&mut s, opt_str(o, "name")?, prefix)?;
        s.bdevs.insert(
            name.clone(),
            Bdev {
                product,
                block_size: block_size as u32,
                num_blocks,
                uuid,
                backend,
                attached: None,
                cluster: None,
                controller: None,
            },
        );
        Ok(Value::String(name))
    }

    pub(super) fn spdk_bdev_delete(&self, p: &Value) -> Result<Value, RpcError> {
        let name = req_str(obj(p)?, "name")?;
        let attached = {
            let s = self.spdk();
            s.bdevs
                .get(name)
                .ok_or_else(|| invalid(format!("bdev {name} not found")))?
                .attached
                .clone()
        };
        // Deleting an attached bdev removes its namespace, as SPDK's hot remove does.
        if let Some((nqn, nsid)) = attached {
            self.change("remove_namespace", json!({"nqn": nqn, "nsid": nsid}))?;
        }
        self.spdk().bdevs.remove(name);
        Ok(Value::Bool(true))
    }

    /// The (subsystem, NSID) bdev `name` backs: attached, or refused naming it.
    pub(super) fn attached(&self, name: &str, what: &str) -> Result<(String, u32), RpcError> {
        let s = self.spdk();
        let b = s
            .bdevs
            .get(name)
            .ok_or_else(|| invalid(format!("bdev {name} not found")))?;
        b.attached.clone().ok_or_else(|| {
            invalid(format!(
                "bdev {name} is not attached to a subsystem: pollux keeps {what} with namespaces (nvmf_subsystem_add_ns first)"
            ))
        })
    }

    /// `bdev_set_qos_limit`: the QoS limits of the namespace the bdev backs (pollux's
    /// `set_qos`: one budget for every host, queue and reactor reaching it); 0 removes one.
    pub(super) fn spdk_set_qos_limit(&self, p: &Value) -> Result<Value, RpcError> {
        let o = obj(p)?;
        let name = req_str(o, "name")?;
        let (nqn, nsid) = self.attached(name, "QoS limits")?;
        let mut t = json!({"nqn": nqn, "nsid": nsid});
        for (spdk, ours) in [
            ("rw_ios_per_sec", "iops"),
            ("rw_mbytes_per_sec", "mbps"),
            ("r_mbytes_per_sec", "read_mbps"),
            ("w_mbytes_per_sec", "write_mbps"),
        ] {
            if let Some(v) = opt_u64(o, spdk)? {
                t[ours] = v.into();
            }
        }
        self.change("set_qos", t)?;
        Ok(Value::Bool(true))
    }

    /// `bdev_get_iostat {name?}`: the commands and bytes of the namespaces the bdevs back,
    /// summed over the reactors (SPDK's field names; ticks are microseconds here).
    pub(super) fn spdk_get_iostat(&self, p: &Value) -> Result<Value, RpcError> {
        let only = match p {
            Value::Object(o) => opt_str(o, "name")?.map(str::to_string),
            _ => None,
        };
        let attached: Vec<(String, String, u32)> = self
            .spdk()
            .bdevs
            .iter()
            .filter(|(n, _)| only.as_ref().is_none_or(|o| o == *n))
            .filter_map(|(n, b)| b.attached.clone().map(|(nqn, nsid)| (n.clone(), nqn, nsid)))
            .collect();
        let snap = self.shared.snapshot.load();
        let mut out = Vec::new();
        for (name, nqn, nsid) in attached {
            let Some(ns) = snap
                .subsystem(&nqn)
                .and_then(|s| s.all_namespaces().find(|n| n.nsid == nsid).cloned())
            else {
                continue;
            };
            let sum = |f: fn(&crate::subsystem::NsCounters) -> &std::sync::atomic::AtomicU64| -> u64 {
                ns.counters
                    .iter()
                    .map(|c| f(c).load(std::sync::atomic::Ordering::Relaxed))
                    .sum()
            };
            out.push(json!({
                "name": name,
                "bytes_read": sum(|c| &c.read_bytes),
                "num_read_ops": sum(|c| &c.read_cmds),
                "bytes_written": sum(|c| &c.write_bytes),
                "num_write_ops": sum(|c| &c.write_cmds),
            }));
        }
        if let Some(n) = only
            && out.is_empty()
        {
            return Err(invalid(format!("bdev {n} not found or not attached")));
        }
        Ok(json!({"tick_rate": 1_000_000, "bdevs": out}))
    }

    pub(super) fn spdk_get_bdevs(&self, p: &Value) -> Result<Value, RpcError> {
        let only = match p {
            Value::Object(o) => opt_str(o, "name")?.map(str::to_string),
            _ => None,
        };
        let s = self.spdk();
        let list: Vec<Value> = s
            .bdevs
            .iter()
            .filter(|(n, _)| only.as_ref().is_none_or(|o| o == *n))
            .map(|(name, b)| {
                json!({
                    "name": name,
                    "aliases": [],
                    "product_name": b.product,
                    "block_size": b.block_size,
                    "num_blocks": b.num_blocks,
                    "uuid": b.uuid.hyphenated().to_string(),
                    "claimed": b.attached.is_some(),
                    "supported_io_types": {"read": true, "write": true, "unmap": true, "write_zeroes": true, "flush": true},
                    "driver_specific": {"pollux": {"backend": b.backend}},
                })
            })
            .collect();
        if let Some(n) = only
            && list.is_empty()
        {
            return Err(invalid(format!("bdev {n} not found")));
        }
        Ok(Value::Array(list))
    }
}

/// The size of a file or block device.
fn file_len(path: &str) -> std::io::Result<u64> {
    use std::io::{Seek, SeekFrom};
    let mut f = std::fs::File::open(path)?;
    // A block device's metadata says 0: its end is its size.
    f.seek(SeekFrom::End(0))
}
