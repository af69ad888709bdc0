//! A gateway group's configuration: what every gateway of a group serves alike, kept in the
//! cluster (the target's `gateway::config`) as a TOML document of its own, and merged into
//! each gateway's own conf to make the configuration that gateway runs.
//!
//! **Group-scoped** (the group's document): `[[subsystem]]` tables whole (hosts and their
//! keys, namespaces, which must be rbd, with their ANA group, masking, QoS and polling
//! policy) and `[[listener]]` tables, each naming the gateway that binds it
//! (`gateway = "NAME"`). **Gateway-scoped** (each gateway's conf): everything else, the
//! reactors, the control socket, `[gateway]` with the cluster connection, and local
//! subsystems (RAM, file, VFIO namespaces), as Ceph's NVMe-oF gateway keeps subsystems,
//! namespaces, hosts and per-gateway listeners in `nvmeof.<group>.state` and the rest in
//! each gateway's `ceph-nvmeof.conf`.
//!
//! A gateway's part of the group: its own listeners become listeners of its conf (the
//! others' are its peers, for discovery), a subsystem's `listeners` keep the addresses it
//! binds, and every group subsystem gets the gateway's controller ID range (its slot in the
//! group: hosts on multipath refuse two controllers with one ID) and its rbd namespaces the
//! gateway's cluster connection (`ceph_conf`, `user`, `keyring` are paths and names of the
//! gateway's machine, never the group's).

use toml_edit::{ArrayOfTables, DocumentMut, Item, Table, Value};
use zeroize::Zeroizing;

/// Gateways a group may have: each gets [`SLOT_IDS`] controller IDs of the 65,519.
pub const MAX_SLOTS: u16 = 32;

/// Controller IDs per gateway slot (as ceph-nvmeof's 2040 per gateway).
pub const SLOT_IDS: u16 = 2040;

/// The controller IDs of slot `slot` (`slot < MAX_SLOTS`): 1..=2040 for slot 0, and on.
pub fn cntlid_range(slot: u16) -> (u16, u16) {
    let lo = slot.min(MAX_SLOTS - 1) * SLOT_IDS + 1;
    (lo, lo + SLOT_IDS - 1)
}

/// Why a group document is refused, or cannot be merged into a gateway's conf.
#[derive(Debug, thiserror::Error)]
pub enum GroupError {
    /// Not TOML.
    #[error("the {what} is not TOML: {source}")]
    NotToml {
        /// "group's configuration" or "gateway's conf".
        what: &'static str,
        /// The parser's error.
        #[source]
        source: Box<toml_edit::TomlError>,
    },
    /// A table the group does not keep (it is each gateway's).
    #[error(
        "the group's configuration holds `{key}`: only [[subsystem]] and [[listener]] tables are group-scoped (`{key}` belongs in each gateway's conf)"
    )]
    NotGroupScoped {
        /// The top-level key.
        key: String,
    },
    /// A listener or subsystem entry that is not right for a group.
    #[error("the group's {what}: {why}")]
    Entry {
        /// Which entry (`listener 2`, `subsystem nqn...`).
        what: String,
        /// Why.
        why: String,
    },
    /// Something both the group and the gateway's own conf define.
    #[error(
        "{what} is in both the group's configuration and this gateway's conf: remove it from the conf (the group's is served)"
    )]
    Both {
        /// Which (`subsystem NQN`, `listener ADDRESS`).
        what: String,
    },
}

/// A listener of another gateway of the group, with what it serves of the group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupPeer {
    /// The gateway that binds it.
    pub gateway: String,
    /// Its address.
    pub address: std::net::SocketAddr,
    /// Its TLS mode.
    pub tls: crate::TlsMode,
    /// The group subsystems it serves.
    pub subsystems: Vec<String>,
}

/// A gateway's configuration with the group's merged in.
#[derive(Debug)]
pub struct Merged {
    /// The document to parse (holds the group's secrets unsealed: zeroed when dropped).
    pub text: Zeroizing<String>,
    /// The other gateways' listeners.
    pub peers: Vec<GroupPeer>,
    /// The group's subsystems' NQNs.
    pub subsystems: Vec<String>,
}

/// What the gateway gives each group rbd namespace: its own cluster connection.
#[derive(Debug, Clone, Default)]
pub struct ClusterKeys {
    /// `ceph_conf`, absolute.
    pub ceph_conf: Option<String>,
    /// `user`.
    pub user: Option<String>,
    /// `keyring`, absolute.
    pub keyring: Option<String>,
}

/// The tables of array `key` of `t` (an array of tables, or an array of inline tables).
fn tables_of(t: &Table, key: &str) -> Vec<Table> {
    match t.get(key) {
        Some(Item::ArrayOfTables(a)) => a.iter().cloned().collect(),
        Some(Item::Value(Value::Array(a))) => a
            .iter()
            .filter_map(|v| v.as_inline_table().map(|i| i.clone().into_table()))
            .collect(),
        _ => Vec::new(),
    }
}

fn str_of<'a>(t: &'a Table, key: &str) -> Option<&'a str> {
    t.get(key).and_then(Item::as_str)
}

/// Parse and check a group document: only `[[subsystem]]` and `[[listener]]` (each with a
/// `gateway`), subsystems without controller ID ranges (each gateway's slot gives them) whose
/// namespaces are rbd without a cluster connection of their own.
pub fn check(text: &str) -> Result<DocumentMut, GroupError> {
    let doc: DocumentMut = text.parse().map_err(|e| GroupError::NotToml {
        what: "group's configuration",
        source: Box::new(e),
    })?;
    for (key, item) in doc.as_table().iter() {
        let arrayish = matches!(item, Item::ArrayOfTables(_) | Item::Value(Value::Array(_)));
        let ok = match key {
            "subsystem" | "listener" => arrayish,
            "ana_groups" => item.is_table_like(),
            _ => false,
        };
        if !ok {
            return Err(GroupError::NotGroupScoped { key: key.to_string() });
        }
    }
    ana_owners(&doc)?;
    for (i, l) in tables_of(doc.as_table(), "listener").iter().enumerate() {
        let what = || {
            format!(
                "listener {}",
                str_of(l, "address").map_or_else(|| format!("#{}", i + 1), str::to_string)
            )
        };
        if str_of(l, "address").is_none() {
            return Err(GroupError::Entry {
                what: what(),
                why: "has no `address`".into(),
            });
        }
        match str_of(l, "gateway") {
            Some(g) if !g.is_empty() => {}
            _ => {
                return Err(GroupError::Entry {
                    what: what(),
                    why: "names no `gateway`: a group's listener is bound by the gateway it names".into(),
                });
            }
        }
    }
    for (i, s) in tables_of(doc.as_table(), "subsystem").iter().enumerate() {
        let what = || {
            format!(
                "subsystem {}",
                str_of(s, "nqn").map_or_else(|| format!("#{}", i + 1), str::to_string)
            )
        };
        for k in ["min_cntlid", "max_cntlid"] {
            if s.contains_key(k) {
                return Err(GroupError::Entry {
                    what: what(),
                    why: format!("sets `{k}`: in a gateway group each gateway's controller IDs are its slot's"),
                });
            }
        }
        for n in tables_of(s, "namespace") {
            let nsid = n.get("nsid").and_then(Item::as_integer).unwrap_or(0);
            let rbd = n
                .get("backend")
                .and_then(Item::as_table_like)
                .and_then(|b| b.get("rbd"))
                .and_then(Item::as_table_like);
            let Some(rbd) = rbd else {
                return Err(GroupError::Entry {
                    what: what(),
                    why: format!(
                        "namespace {nsid} is not rbd: only a cluster's images are the same on every gateway (keep RAM, file and VFIO namespaces in a gateway's own conf)"
                    ),
                });
            };
            for k in ["ceph_conf", "user", "keyring"] {
                if rbd.contains_key(k) {
                    return Err(GroupError::Entry {
                        what: what(),
                        why: format!(
                            "namespace {nsid} sets `{k}`: each gateway connects to the cluster as its own `[gateway]` says"
                        ),
                    });
                }
            }
        }
    }
    Ok(doc)
}

/// The group's `ana_groups` table: which gateway owns which ANA groups (each group by one
/// gateway at most).
pub fn ana_owners(doc: &DocumentMut) -> Result<Vec<(String, Vec<u32>)>, GroupError> {
    let Some(t) = doc.get("ana_groups").and_then(Item::as_table_like) else {
        return Ok(Vec::new());
    };
    let bad = |why: String| GroupError::Entry {
        what: "ana_groups".into(),
        why,
    };
    let mut out: Vec<(String, Vec<u32>)> = Vec::new();
    for (gw, v) in t.iter() {
        let a = v
            .as_array()
            .ok_or_else(|| bad(format!("gateway {gw}'s ANA groups are not an array of integers")))?;
        let mut groups = Vec::new();
        for g in a.iter() {
            let n = g
                .as_integer()
                .and_then(|n| u32::try_from(n).ok())
                .filter(|n| (1..=crate::ANAGRPMAX).contains(n))
                .ok_or_else(|| {
                    bad(format!(
                        "gateway {gw}: {g} is not an ANA group (1 to {})",
                        crate::ANAGRPMAX
                    ))
                })?;
            if groups.contains(&n) {
                return Err(bad(format!("gateway {gw} lists ANA group {n} twice")));
            }
            if let Some((other, _)) = out.iter().find(|(_, gs)| gs.contains(&n)) {
                return Err(bad(format!(
                    "ANA group {n} is owned by {other} and by {gw}: one gateway owns a group"
                )));
            }
            groups.push(n);
        }
        out.push((gw.to_string(), groups));
    }
    Ok(out)
}

/// Append `t` to the array of tables `key` of `root`.
fn push(root: &mut Table, key: &str, t: Table) {
    match root.get_mut(key) {
        Some(Item::ArrayOfTables(a)) => a.push(t),
        Some(Item::Value(Value::Array(a))) => a.push(t.into_inline_table()),
        _ => {
            let mut a = ArrayOfTables::new();
            a.push(t);
            root.insert(key, Item::ArrayOfTables(a));
        }
    }
}

/// Gateway `me`'s configuration: its own conf `local` with group document `group` merged in,
/// its controller IDs those of `slot` and its rbd namespaces connecting as `cluster` says.
pub fn merge(local: &str, group: &str, me: &str, slot: u16, cluster: &ClusterKeys) -> Result<Merged, GroupError> {
    let group = check(group)?;
    let mut doc: DocumentMut = local.parse().map_err(|e| GroupError::NotToml {
        what: "gateway's conf",
        source: Box::new(e),
    })?;
    let root = doc.as_table_mut();
    let local_listeners: Vec<String> = tables_of(root, "listener")
        .iter()
        .filter_map(|l| str_of(l, "address").map(str::to_string))
        .collect();
    let local_subsystems: Vec<String> = tables_of(root, "subsystem")
        .iter()
        .filter_map(|s| str_of(s, "nqn").map(str::to_string))
        .collect();
    // This gateway's ANA groups, where the group says them.
    if let Some((_, groups)) = ana_owners(&group)?.into_iter().find(|(g, _)| g == me) {
        let Some(gw) = root.get_mut("gateway").and_then(Item::as_table_like_mut) else {
            return Err(GroupError::Entry {
                what: "ana_groups".into(),
                why: format!("names gateway {me}, whose conf has no [gateway]"),
            });
        };
        if gw.contains_key("ana_groups") {
            return Err(GroupError::Both {
                what: format!("the ANA groups of gateway {me}"),
            });
        }
        let mut a = toml_edit::Array::new();
        for g in groups {
            a.push(i64::from(g));
        }
        gw.insert("ana_groups", toml_edit::value(a));
    }
    let mut own = local_listeners.clone();
    let mut peers = Vec::new();
    for mut l in tables_of(group.as_table(), "listener") {
        let gateway = str_of(&l, "gateway").unwrap_or_default().to_string();
        let address = str_of(&l, "address").unwrap_or_default().to_string();
        if gateway != me {
            peers.push(peer(gateway, &address, &l, &group)?);
            continue;
        }
        if local_listeners.contains(&address) {
            return Err(GroupError::Both {
                what: format!("listener {address}"),
            });
        }
        l.remove("gateway");
        own.push(address);
        push(root, "listener", l);
    }
    let (lo, hi) = cntlid_range(slot);
    let mut subsystems = Vec::new();
    for mut s in tables_of(group.as_table(), "subsystem") {
        let nqn = str_of(&s, "nqn").unwrap_or_default().to_string();
        if local_subsystems.contains(&nqn) {
            return Err(GroupError::Both {
                what: format!("subsystem {nqn}"),
            });
        }
        s.insert("min_cntlid", toml_edit::value(i64::from(lo)));
        s.insert("max_cntlid", toml_edit::value(i64::from(hi)));
        // The listeners named are every gateway's: this one serves it on those it binds.
        if let Some(Item::Value(Value::Array(a))) = s.get_mut("listeners") {
            a.retain(|v| v.as_str().is_some_and(|x| own.iter().any(|o| o == x)));
        }
        fill_cluster(&mut s, cluster);
        subsystems.push(nqn);
        push(root, "subsystem", s);
    }
    Ok(Merged {
        text: Zeroizing::new(doc.to_string()),
        peers,
        subsystems,
    })
}

/// Another gateway's listener `l` at `address`, and the subsystems of `group` it serves
/// (those naming no `listeners`, and those naming its address).
fn peer(gateway: String, address: &str, l: &Table, group: &DocumentMut) -> Result<GroupPeer, GroupError> {
    let bad = |why: String| GroupError::Entry {
        what: format!("listener {address} of gateway {gateway}"),
        why,
    };
    let addr: std::net::SocketAddr = address.parse().map_err(|e| bad(format!("is not IP:PORT: {e}")))?;
    let tls = match str_of(l, "tls") {
        None => crate::TlsMode::None,
        Some(t) => t
            .parse()
            .map_err(|_| bad(format!("`tls` {t:?} is not none, allowed or required")))?,
    };
    let subsystems = tables_of(group.as_table(), "subsystem")
        .iter()
        .filter(|s| match s.get("listeners") {
            Some(Item::Value(Value::Array(a))) => a.iter().any(|v| v.as_str() == Some(address)),
            _ => true,
        })
        .filter_map(|s| str_of(s, "nqn").map(str::to_string))
        .collect();
    Ok(GroupPeer {
        gateway,
        address: addr,
        tls,
        subsystems,
    })
}

/// Give each rbd namespace of subsystem `s` the gateway's cluster connection.
fn fill_cluster(s: &mut Table, cluster: &ClusterKeys) {
    let fill = |rbd: &mut dyn toml_edit::TableLike| {
        for (k, v) in [
            ("ceph_conf", &cluster.ceph_conf),
            ("user", &cluster.user),
            ("keyring", &cluster.keyring),
        ] {
            if let Some(v) = v {
                rbd.insert(k, toml_edit::value(v.as_str()));
            }
        }
    };
    let each = |n: &mut dyn toml_edit::TableLike| {
        if let Some(rbd) = n
            .get_mut("backend")
            .and_then(Item::as_table_like_mut)
            .and_then(|b| b.get_mut("rbd"))
            .and_then(Item::as_table_like_mut)
        {
            fill(rbd);
        }
    };
    match s.get_mut("namespace") {
        Some(Item::ArrayOfTables(a)) => a.iter_mut().for_each(|n| each(n)),
        Some(Item::Value(Value::Array(a))) => a
            .iter_mut()
            .filter_map(Value::as_inline_table_mut)
            .for_each(|n| each(n)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const LOCAL: &str = "[reactors]\ncores = [0]\n[[listener]]\naddress = \"127.0.0.1:4420\"\n\
        [gateway]\ngroup = \"g\"\nname = \"a\"\npool = \"rbd\"\n";

    const GROUP: &str = "[[listener]]\ngateway = \"a\"\naddress = \"127.0.0.1:4430\"\n\
        [[listener]]\ngateway = \"b\"\naddress = \"127.0.0.2:4430\"\n\
        [[subsystem]]\nnqn = \"nqn.2026-12.io.pollux:g1\"\nallow_any_host = true\n\
        listeners = [\"127.0.0.1:4430\", \"127.0.0.2:4430\"]\n\
        [[subsystem.namespace]]\nnsid = 1\nbackend = { rbd = { pool = \"rbd\", image = \"i1\" } }\n";

    fn keys() -> ClusterKeys {
        ClusterKeys {
            ceph_conf: Some("/etc/ceph/ceph.conf".into()),
            user: Some("gw".into()),
            keyring: None,
        }
    }

    #[test]
    fn a_gateway_gets_its_listeners_its_ids_and_its_cluster_connection() {
        let m = merge(LOCAL, GROUP, "a", 1, &keys()).unwrap();
        assert_eq!(
            m.peers,
            vec![GroupPeer {
                gateway: "b".into(),
                address: "127.0.0.2:4430".parse().unwrap(),
                tls: crate::TlsMode::None,
                subsystems: vec!["nqn.2026-12.io.pollux:g1".into()],
            }]
        );
        assert_eq!(m.subsystems, vec!["nqn.2026-12.io.pollux:g1".to_string()]);
        let cfg = crate::Config::parse(&m.text, "merged").unwrap();
        assert_eq!(cfg.listeners.len(), 2);
        let s = &cfg.subsystems[0];
        assert_eq!((s.min_cntlid, s.max_cntlid), (2041, 4080));
        assert_eq!(s.listeners.as_ref().unwrap().len(), 1, "only the address it binds");
        match &s.namespaces[0].backend {
            crate::Backend::Rbd(b) => {
                assert_eq!(b.user, "gw");
                assert_eq!(b.gateway_group.as_deref(), Some("g"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn what_a_group_does_not_keep_is_refused_by_name() {
        let e = check("[reactors]\ncores = [0]\n").unwrap_err();
        assert!(e.to_string().contains("`reactors`"), "{e}");
        let e = check("[[listener]]\naddress = \"127.0.0.1:1\"\n").unwrap_err();
        assert!(e.to_string().contains("names no `gateway`"), "{e}");
        let e = check("[[subsystem]]\nnqn = \"nqn.2026-12.io.pollux:x\"\nmin_cntlid = 5\n").unwrap_err();
        assert!(e.to_string().contains("min_cntlid"), "{e}");
        let e = check(
            "[[subsystem]]\nnqn = \"nqn.2026-12.io.pollux:x\"\n[[subsystem.namespace]]\nnsid = 1\nbackend = { ram = { size = \"1MiB\" } }\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("not rbd"), "{e}");
        let e = check(
            "[[subsystem]]\nnqn = \"nqn.2026-12.io.pollux:x\"\n[[subsystem.namespace]]\nnsid = 1\nbackend = { rbd = { pool = \"p\", image = \"i\", keyring = \"/k\" } }\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("`keyring`"), "{e}");
        assert!(check("not = [toml").is_err());
    }

    #[test]
    fn ana_group_ownership_is_the_groups() {
        let group = format!("ana_groups = {{ a = [1, 3], b = [2] }}\n{GROUP}");
        let m = merge(LOCAL, &group, "a", 0, &keys()).unwrap();
        let cfg = crate::Config::parse(&m.text, "merged").unwrap();
        assert_eq!(cfg.gateway.unwrap().ana_groups, vec![1, 3]);
        let e = check("ana_groups = { a = [1], b = [1] }\n").unwrap_err();
        assert!(e.to_string().contains("ANA group 1 is owned by a and by b"), "{e}");
        let e = check("ana_groups = { a = [0] }\n").unwrap_err();
        assert!(e.to_string().contains("not an ANA group"), "{e}");
        let local = LOCAL.replace("pool = \"rbd\"", "pool = \"rbd\"\nana_groups = [4]");
        assert!(matches!(
            merge(&local, &group, "a", 0, &keys()),
            Err(GroupError::Both { .. })
        ));
    }

    #[test]
    fn a_subsystem_in_both_is_refused() {
        let local = format!("{LOCAL}[[subsystem]]\nnqn = \"nqn.2026-12.io.pollux:g1\"\nallow_any_host = true\n");
        let e = merge(&local, GROUP, "a", 0, &keys()).unwrap_err();
        assert!(matches!(e, GroupError::Both { .. }), "{e}");
    }

    #[test]
    fn slots_never_overlap_and_fit_the_id_space() {
        for s in 0..MAX_SLOTS {
            let (lo, hi) = cntlid_range(s);
            assert!(lo >= 1 && hi <= 0xFFEF && hi - lo + 1 == SLOT_IDS);
            if s > 0 {
                assert_eq!(cntlid_range(s - 1).1 + 1, lo);
            }
        }
    }
}
