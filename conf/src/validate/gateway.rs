//! The `[gateway]` table: this target's membership in a gateway group.

use super::cx::Cx;
use crate::raw::RawGateway;
use crate::{ANAGRPMAX, Backend, ConfError, Gateway, Subsystem};

/// A name of the group or of a gateway: it becomes part of a RADOS object name and of log
/// lines, so letters, digits, `-`, `_` and `.` only.
fn name_ok(s: &str) -> bool {
    !s.is_empty() && s.len() <= 64 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

pub(super) fn gateway(cx: &Cx<'_>, g: RawGateway, subsystems: &[Subsystem]) -> Result<Gateway, ConfError> {
    for (v, key) in [(&g.group, "group"), (&g.name, "name")] {
        if !name_ok(v.get_ref()) {
            return Err(cx.at(
                v.span(),
                format!(
                    "gateway `{key}` {:?} must be 1 to 64 letters, digits, '-', '_' or '.'",
                    v.get_ref()
                ),
            ));
        }
    }
    // The group lives in a cluster: the table names it (`ceph_conf`, `user`, `keyring`,
    // `pool`), or the first rbd namespace does for what the table leaves out. A gateway
    // whose conf names only itself (its subsystems kept in the group) needs `pool`.
    let first = subsystems
        .iter()
        .flat_map(|s| &s.namespaces)
        .find_map(|n| match &n.backend {
            Backend::Rbd(b) => Some(b),
            _ => None,
        });
    let mut cluster = match first {
        Some(b) => b.clone(),
        None => {
            let Some(p) = &g.pool else {
                return Err(cx.at(
                    g.group.span(),
                    "a [gateway] needs a `pool` (or an rbd namespace): the group's configuration, state and heartbeats live in that pool of the cluster"
                        .into(),
                ));
            };
            crate::RbdBackend {
                pool: p.get_ref().clone(),
                image: String::new(),
                rados_namespace: None,
                ceph_conf: std::path::PathBuf::from(super::backend::rbd::DEFAULT_CEPH_CONF),
                user: "admin".into(),
                keyring: None,
                write_cache: false,
                op_timeout_s: 30,
                gateway_group: None,
                take_over_group: false,
            }
        }
    };
    if let Some(v) = &g.ceph_conf {
        cluster.ceph_conf = cx.path(v, "ceph_conf")?;
    }
    if let Some(v) = &g.user {
        let u = v.get_ref();
        if !name_ok(u) || u.starts_with("client.") {
            return Err(cx.at(
                v.span(),
                format!("gateway `user` {u:?} must be a Ceph user name without its type (\"gateway\", not \"client.gateway\")"),
            ));
        }
        cluster.user.clone_from(u);
    }
    if let Some(v) = &g.keyring {
        let path = cx.path(v, "keyring")?;
        super::hosts::check_owner_only(&path)
            .map_err(|why| cx.at(v.span(), format!("gateway `keyring` {}: {why}", path.display())))?;
        cluster.keyring = Some(path);
    }
    let key_file = match &g.key_file {
        None => None,
        Some(v) => {
            let path = cx.path(v, "key_file")?;
            let meta = super::hosts::check_owner_only(&path)
                .map_err(|why| cx.at(v.span(), format!("gateway `key_file` {}: {why}", path.display())))?;
            if meta.len() < 32 {
                return Err(cx.at(
                    v.span(),
                    format!(
                        "gateway `key_file` {} holds {} bytes: a group key is at least 32 random bytes (`head -c 32 /dev/urandom > FILE`)",
                        path.display(),
                        meta.len()
                    ),
                ));
            }
            Some(path)
        }
    };
    let mut ana_groups = Vec::new();
    if let Some(list) = &g.ana_groups {
        for v in list.get_ref() {
            let n = cx.int(v, "ana_groups", 1, i64::from(ANAGRPMAX))?;
            let n = u32::try_from(n).map_err(|_| cx.at(v.span(), "`ana_groups` is out of range".into()))?;
            if ana_groups.contains(&n) {
                return Err(cx.at(v.span(), format!("ANA group {n} is listed twice in `ana_groups`")));
            }
            ana_groups.push(n);
        }
    }
    let heartbeat_ms = cx.u32_or(&g.heartbeat_ms, "heartbeat_ms", 50, 60_000, 500)?;
    let grace_ms = cx.u32_or(&g.grace_ms, "grace_ms", 100, 600_000, 1500)?;
    if grace_ms < 2 * heartbeat_ms {
        let span = g.grace_ms.as_ref().map_or_else(|| g.group.span(), |v| v.span());
        return Err(cx.at(
            span,
            format!(
                "`grace_ms` ({grace_ms}) must be at least two heartbeats (`heartbeat_ms` {heartbeat_ms}): one late heartbeat must not fence a live gateway"
            ),
        ));
    }
    if let Some(p) = &g.pool {
        if p.get_ref().is_empty() {
            return Err(cx.at(p.span(), "gateway `pool` is empty".into()));
        }
        cluster.pool = p.get_ref().clone();
    }
    if let Some(ns) = &g.rados_namespace {
        cluster.rados_namespace = Some(ns.get_ref().clone()).filter(|s| !s.is_empty());
    }
    // Group operations wait at most about the grace: a heartbeat stuck behind a slow OSD
    // counts as a missed one, not as a stalled gateway thread.
    cluster.op_timeout_s = grace_ms.div_ceil(1000).max(1);
    cluster.image = String::new();
    Ok(Gateway {
        group: g.group.into_inner(),
        name: g.name.into_inner(),
        ana_groups,
        heartbeat_ms,
        grace_ms,
        blocklist_expiry_s: cx.u32_or(&g.blocklist_expiry_s, "blocklist_expiry_s", 60, 30 * 86_400, 3600)?,
        failback_delay_ms: cx.u32_or(&g.failback_delay_ms, "failback_delay_ms", 0, 3_600_000, 5000)?,
        cluster,
        key_file,
    })
}
