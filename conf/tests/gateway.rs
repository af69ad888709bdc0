//! `[gateway]`: a gateway group's member, its defaults, the cluster it takes from its first
//! rbd namespace, and its errors (with positions).

use pollux_conf::Config;

const BASE: &str = "[reactors]\ncores = [0]\n[[listener]]\naddress = \"127.0.0.1:4420\"\n";
const RBD: &str = "[[subsystem]]\nnqn = \"nqn.2026-12.io.pollux:g\"\nallow_any_host = true\n\
[[subsystem.namespace]]\nnsid = 1\nbackend = { rbd = { pool = \"images\", image = \"i\", user = \"gw\", ceph_conf = \"/etc/ceph/c.conf\" } }\n";

fn err(text: &str) -> pollux_conf::ConfError {
    match Config::parse(text, "gw.toml") {
        Ok(c) => panic!("parsed, expected an error:\n{text}\n{c:?}"),
        Err(e) => e,
    }
}

#[test]
fn defaults_and_the_cluster_of_the_first_rbd_namespace() {
    let c = Config::parse(
        &format!("{BASE}[gateway]\ngroup = \"g1\"\nname = \"a\"\nana_groups = [1, 3]\n{RBD}"),
        "gw.toml",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let g = c.gateway.unwrap_or_else(|| panic!("no gateway"));
    assert_eq!(
        (g.group.as_str(), g.name.as_str(), g.ana_groups.as_slice()),
        ("g1", "a", &[1, 3][..])
    );
    assert_eq!(
        (g.heartbeat_ms, g.grace_ms, g.blocklist_expiry_s, g.failback_delay_ms),
        (500, 1500, 3600, 5000)
    );
    assert_eq!((g.cluster.pool.as_str(), g.cluster.user.as_str()), ("images", "gw"));
    assert_eq!(g.cluster.ceph_conf.to_str(), Some("/etc/ceph/c.conf"));
    assert_eq!(g.cluster.op_timeout_s, 2, "group operations wait about the grace");
    let c = Config::parse(
        &format!("{BASE}[gateway]\ngroup = \"g1\"\nname = \"a\"\npool = \"meta\"\nrados_namespace = \"gw\"\n{RBD}"),
        "gw.toml",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let g = c.gateway.unwrap_or_else(|| panic!("no gateway"));
    assert_eq!(
        (g.cluster.pool.as_str(), g.cluster.rados_namespace.as_deref()),
        ("meta", Some("gw"))
    );
    assert!(Config::parse(&format!("{BASE}{RBD}"), "gw.toml").is_ok_and(|c| c.gateway.is_none()));
}

#[test]
fn bad_gateways_are_refused_where_they_are_written() {
    let e = err(&format!("{BASE}[gateway]\ngroup = \"g1\"\nname = \"a\"\n"));
    assert_eq!(e.line(), Some(6), "{e}");
    assert!(e.message().contains("needs a `pool` (or an rbd namespace)"), "{e}");
    let e = err(&format!("{BASE}[gateway]\ngroup = \"g 1\"\nname = \"a\"\n{RBD}"));
    assert_eq!((e.line(), e.column()), (Some(6), Some(9)), "{e}");
    assert!(e.message().contains("letters, digits"), "{e}");
    let e = err(&format!(
        "{BASE}[gateway]\ngroup = \"g1\"\nname = \"a\"\nheartbeat_ms = 500\ngrace_ms = 600\n{RBD}"
    ));
    assert_eq!(e.line(), Some(9), "{e}");
    assert!(e.message().contains("at least two heartbeats"), "{e}");
    let e = err(&format!(
        "{BASE}[gateway]\ngroup = \"g1\"\nname = \"a\"\nana_groups = [1, 1]\n{RBD}"
    ));
    assert!(e.message().contains("listed twice"), "{e}");
    let e = err(&format!(
        "{BASE}[gateway]\ngroup = \"g1\"\nname = \"a\"\nana_groups = [0]\n{RBD}"
    ));
    assert!(e.message().contains("between 1 and"), "{e}");
    let e = err(&format!(
        "{BASE}[gateway]\ngroup = \"g1\"\nname = \"a\"\nbeat = 1\n{RBD}"
    ));
    assert!(e.message().contains("beat"), "{e}");
}
