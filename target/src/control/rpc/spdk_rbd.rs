//! SPDK's rbd bdevs on pollux ([`super::spdk`]): Rados clusters registered by name
//! (`bdev_rbd_register_cluster`, as Ceph's NVMe-oF gateway registers them), images made
//! bdevs (`bdev_rbd_create`), attached as pollux rbd namespaces (`nvmf_subsystem_add_ns`),
//! resized, deleted and listed.

use serde_json::{Map, Value, json};

use super::spdk::{invalid, obj, opt_str, opt_u64, req_str};
use super::spdk_bdev::Bdev;
use super::{Ctx, RpcError};

/// SPDK's product name of an rbd bdev.
pub(super) const PRODUCT: &str = "Ceph Rbd Disk";

/// A Rados cluster as `bdev_rbd_register_cluster` named it: how the bdevs of it connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct RbdCluster {
    pub(super) user_id: Option<String>,
    pub(super) config_file: Option<String>,
    pub(super) key_file: Option<String>,
}

/// `config_param` / `config`: librados settings as key-value pairs, which pollux takes from
/// the cluster's conf file only (its connections set their own timeouts over it).
fn refuse_settings(o: &Map<String, Value>, key: &str) -> Result<(), RpcError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(()),
        Some(Value::Object(m)) if m.is_empty() => Ok(()),
        Some(_) => Err(invalid(format!(
            "'{key}': pollux reads a cluster's settings from its conf file only; give 'config_file' (a ceph.conf) and 'key_file' with bdev_rbd_register_cluster"
        ))),
    }
}

impl Ctx {
    /// `bdev_rbd_register_cluster {name, user_id?, config_file?, key_file?, core_mask?}`.
    pub(super) fn spdk_rbd_register_cluster(&self, p: &Value) -> Result<Value, RpcError> {
        let o = obj(p)?;
        let name = req_str(o, "name")?;
        refuse_settings(o, "config_param")?;
        let c = RbdCluster {
            user_id: opt_str(o, "user_id")?.map(str::to_owned),
            config_file: opt_str(o, "config_file")?.map(str::to_owned),
            key_file: opt_str(o, "key_file")?.map(str::to_owned),
        };
        for f in [&c.config_file, &c.key_file].into_iter().flatten() {
            if !std::path::Path::new(f).exists() {
                return Err(invalid(format!("{f}: no such file")));
            }
        }
        // core_mask places librbd's threads: pollux leaves them to the scheduler.
        let mut s = self.spdk();
        if s.clusters.contains_key(name) {
            return Err(invalid(format!("Cluster {name} already exists")));
        }
        s.clusters.insert(name.to_owned(), c);
        Ok(Value::String(name.to_owned()))
    }

    /// `bdev_rbd_unregister_cluster {name}`: refused while a bdev uses it.
    pub(super) fn spdk_rbd_unregister_cluster(&self, p: &Value) -> Result<Value, RpcError> {
        let name = req_str(obj(p)?, "name")?;
        let mut s = self.spdk();
        if let Some((b, _)) = s.bdevs.iter().find(|(_, b)| b.cluster.as_deref() == Some(name)) {
            return Err(invalid(format!("Cluster {name} is used by bdev {b}")));
        }
        s.clusters
            .remove(name)
            .ok_or_else(|| invalid(format!("Cluster {name} not found")))?;
        Ok(Value::Bool(true))
    }

    /// `bdev_rbd_get_clusters_info {name?}`: one cluster, or all of them.
    pub(super) fn spdk_rbd_get_clusters_info(&self, p: &Value) -> Result<Value, RpcError> {
        let only = match p {
            Value::Object(o) => opt_str(o, "name")?.map(str::to_owned),
            _ => None,
        };
        let s = self.spdk();
        let show = |n: &str, c: &RbdCluster| json!({"cluster_name": n, "user_id": c.user_id, "config_file": c.config_file, "key_file": c.key_file});
        match only {
            Some(n) => s
                .clusters
                .get(&n)
                .map(|c| show(&n, c))
                .ok_or_else(|| invalid(format!("Cluster {n} not found"))),
            None => Ok(Value::Array(s.clusters.iter().map(|(n, c)| show(n, c)).collect())),
        }
    }

    /// `bdev_rbd_create {pool_name, rbd_name, block_size, name?, user_id?, cluster_name?,
    /// uuid?, read_only?}`: the image is opened now (its size is the bdev's) and becomes an
    /// rbd namespace when attached.
    pub(super) fn spdk_rbd_create(&self, p: &Value) -> Result<Value, RpcError> {
        let o = obj(p)?;
        refuse_settings(o, "config")?;
        let pool = req_str(o, "pool_name")?;
        let image = req_str(o, "rbd_name")?;
        let block_size = opt_u64(o, "block_size")?.ok_or_else(|| invalid("missing 'block_size'"))?;
        if block_size != 512 && block_size != 4096 {
            return Err(invalid(format!("block_size {block_size}: pollux serves 512 or 4096")));
        }
        if o.get("read_only").and_then(Value::as_bool) == Some(true) {
            return Err(invalid("'read_only': pollux serves rbd namespaces read-write"));
        }
        let cluster_name = opt_str(o, "cluster_name")?.map(str::to_owned);
        let cluster = match &cluster_name {
            Some(n) => Some(
                self.spdk()
                    .clusters
                    .get(n)
                    .cloned()
                    .ok_or_else(|| invalid(format!("Cluster {n} not found")))?,
            ),
            None => None,
        };
        let user = opt_str(o, "user_id")?
            .map(str::to_owned)
            .or_else(|| cluster.as_ref().and_then(|c| c.user_id.clone()));
        let conf = cluster.as_ref().and_then(|c| c.config_file.clone());
        let keyring = cluster.as_ref().and_then(|c| c.key_file.clone());
        let mut rbd = json!({"pool": pool, "image": image});
        for (k, v) in [("ceph_conf", &conf), ("user", &user), ("keyring", &keyring)] {
            if let Some(v) = v {
                rbd[k] = v.clone().into();
            }
        }
        // Its size, as SPDK's bdev has it from the start: the image opened and closed here
        // (on the control thread; bounded by the connection's timeouts).
        let b = pollux_conf::RbdBackend {
            pool: pool.to_owned(),
            image: image.to_owned(),
            rados_namespace: None,
            ceph_conf: conf.clone().unwrap_or_else(|| "/etc/ceph/ceph.conf".into()).into(),
            user: user.clone().unwrap_or_else(|| "admin".into()),
            keyring: keyring.clone().map(Into::into),
            write_cache: false,
            op_timeout_s: pollux_conf::RBD_OP_TIMEOUT_S,
            gateway_group: None,
            take_over_group: false,
        };
        let bytes = crate::backend::rbd::client::Cluster::get(&b)
            .and_then(|c| crate::backend::rbd::client::Image::open(c, &b))
            .and_then(|img| {
                img.size()
                    .map_err(|rc| crate::backend::rbd::client::rbd_error(&b, "cannot read the image's size", rc.into()))
            })
            .map_err(|e| invalid(format!("Failed to open rbd {pool}/{image}: {e}")))?;
        let mut s = self.spdk();
        let name = super::spdk_bdev::new_name(&mut s, opt_str(o, "name")?, "Ceph")?;
        let uuid = super::spdk_bdev::uuid_param(o)?;
        s.bdevs.insert(
            name.clone(),
            Bdev {
                product: PRODUCT,
                block_size: block_size as u32,
                num_blocks: bytes / block_size,
                uuid,
                backend: json!({ "rbd": rbd }),
                attached: None,
                cluster: cluster_name,
                controller: None,
            },
        );
        Ok(Value::String(name))
    }

    /// `bdev_rbd_resize {name, new_size}` (MiB): the image grows and the namespace it backs
    /// serves the new size (a Namespace Attribute Changed event to its hosts).
    pub(super) fn spdk_rbd_resize(&self, p: &Value) -> Result<Value, RpcError> {
        let o = obj(p)?;
        let name = req_str(o, "name")?;
        let mib = opt_u64(o, "new_size")?.ok_or_else(|| invalid("missing 'new_size'"))?;
        let bytes = mib
            .checked_mul(1 << 20)
            .ok_or_else(|| invalid("'new_size' overflows"))?;
        let (nqn, nsid) = self.attached(name, "the size of rbd bdevs")?;
        self.resize_namespace(&json!({"nqn": nqn, "nsid": nsid, "size": bytes}))?;
        if let Some(b) = self.spdk().bdevs.get_mut(name) {
            b.num_blocks = bytes / u64::from(b.block_size);
        }
        Ok(Value::Bool(true))
    }
}
