//! A gateway group's configuration kept in the cluster (`[gateway]`, `gateway::config`),
//! against a real Ceph cluster (`ci/ceph.sh`) and three gateway processes whose confs name
//! only themselves: a change through any gateway reaches every one (a subsystem, an rbd
//! namespace, listeners, a host with DH-HMAC-CHAP keys, QoS), the host authenticates through
//! another gateway with the keys, a host removed through a third loses its controllers
//! everywhere, keys rotated through a gateway authenticate everywhere; racing changes from two
//! gateways each count once and every gateway ends identical; gateways started late or
//! paused across changes catch up; a change while the cluster is paused lands whole or not at
//! all; an object of a future format is refused, nothing of it applied; no key is in clear in
//! any object the gateways wrote.
//!
//! Needs Ceph (`ci/test` installs it); without it the tests say so and pass, unless
//! `POLLUX_REQUIRE_CEPH=1`.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::Spawned;
use common::ceph::Ceph;
use pollux_host::{Controller, ControllerOpts, HostDhchap};
use pollux_nvme::auth::{DhchapKey, HashId};
use serde_json::{Value, json};

const SUB: &str = "nqn.2026-12.io.pollux:group-cfg";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:53535353-0000-4000-8000-000000000053";

fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

fn owner_only(path: &Path, bytes: &[u8]) {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(path)
        .unwrap();
    f.write_all(bytes).unwrap();
}

/// The group key every gateway holds.
fn group_key(ceph: &Ceph) -> PathBuf {
    let p = ceph.dir.join("group.key");
    let mut k = [0u8; 32];
    getrandom::fill(&mut k).unwrap();
    owner_only(&p, &k);
    p
}

/// Gateway `name`: its conf names only itself (the group, the cluster, the group key).
fn gateway(ceph: &Ceph, key: &Path, name: &str, grace_ms: u32) -> Spawned {
    let sock = ceph.dir.join(format!("gw-{name}.sock"));
    let text = format!(
        "[reactors]\ncores = [0]\nmode = \"interrupt\"\n\
         [control]\nsocket = \"{}\"\n\
         [gateway]\ngroup = \"cfg\"\nname = \"{name}\"\npool = \"rbd\"\nceph_conf = \"{}\"\nkey_file = \"{}\"\n\
         heartbeat_ms = 200\ngrace_ms = {grace_ms}\n",
        sock.display(),
        ceph.conf.display(),
        key.display()
    );
    Spawned::start(
        env!("CARGO_BIN_EXE_pollux"),
        &ceph.dir.join(format!("gw-{name}.toml")),
        &text,
        &sock,
        Some(&ceph.dir.join(format!("gw-{name}.log"))),
        "info",
    )
}

/// `ctl call METHOD PARAMS` on `gw`: the result, or the error's text.
fn call(gw: &Spawned, method: &str, params: &Value) -> Result<Value, String> {
    let o = gw.ctl(&["--json", "call", method, &params.to_string()]);
    if o.status.success() {
        Ok(serde_json::from_slice(&o.stdout).unwrap_or(Value::Null))
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ))
    }
}

fn group(gw: &Spawned) -> Value {
    call(gw, "group", &json!({})).unwrap()
}

/// Wait until every gateway of `gws` has a slot and runs the group's version (at least `v`).
fn converged(gws: &[&Spawned], v: u64, within: Duration) -> Value {
    let t0 = Instant::now();
    loop {
        let views: Vec<Value> = gws.iter().map(|g| group(g)).collect();
        let ok = views.iter().all(|g| {
            g["version"].as_u64() >= Some(v)
                && g["running"] == views[0]["version"]
                && g["gateways"].as_array().is_some_and(|a| a.len() >= gws.len())
        });
        if ok {
            return views[0].clone();
        }
        assert!(
            t0.elapsed() < within,
            "the gateways did not converge on version {v}: {views:#?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The subsystem's namespaces as gateway `gw` serves them (None: it serves no such subsystem).
fn served(gw: &Spawned, nqn: &str) -> Option<Vec<u64>> {
    let v = call(gw, "subsystems", &json!({})).unwrap();
    v.as_array()?.iter().find(|s| s["nqn"] == nqn).map(|s| {
        s["namespaces"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|n| n["nsid"].as_u64())
            .collect()
    })
}

/// Every object of the pool whose name is a gateway group's, with its bytes.
fn group_objects(ceph: &Ceph) -> Vec<(String, Vec<u8>)> {
    let ls = String::from_utf8(ceph.run("rados", &["-p", "rbd", "ls"])).unwrap();
    ls.lines()
        .filter(|o| o.starts_with("pollux.") || o.starts_with("rbd_header"))
        .map(|o| (o.to_string(), ceph.run("rados", &["-p", "rbd", "get", o, "-"])))
        .collect()
}

fn key() -> DhchapKey {
    DhchapKey::generate(Some(HashId::Sha256), 32).unwrap()
}

fn opts(k: &DhchapKey) -> ControllerOpts {
    let mut o = ControllerOpts::new(SUB, HOST, 1, 32);
    o.dhchap = Some(HostDhchap::new(k.clone(), None));
    o.timeout = Duration::from_secs(30);
    o
}

#[test]
fn a_change_through_any_gateway_reaches_all_of_them() {
    let Some(ceph) = Ceph::start("group-cfg") else { return };
    ceph.create("cfg0", "16M");
    let gk = group_key(&ceph);
    let (a, b, c) = (
        gateway(&ceph, &gk, "a", 1500),
        gateway(&ceph, &gk, "b", 1500),
        gateway(&ceph, &gk, "c", 1500),
    );
    converged(&[&a, &b, &c], 0, Duration::from_secs(20));

    // Through A: every gateway's listener, the subsystem, its rbd namespace, a host with
    // keys (from a key file on A's machine), a QoS limit.
    let (la, lb, lc) = (free_addr(), free_addr(), free_addr());
    for (gw, l) in [("a", la), ("b", lb), ("c", lc)] {
        call(&a, "add_listener", &json!({"address": l.to_string(), "gateway": gw})).unwrap();
    }
    call(&a, "add_subsystem", &json!({"nqn": SUB, "hosts": []})).unwrap();
    call(
        &a,
        "add_namespace",
        &json!({"nqn": SUB, "nsid": 1, "backend": {"rbd": {"pool": "rbd", "image": "cfg0"}}}),
    )
    .unwrap();
    let k1 = key();
    let kf = ceph.dir.join("host.key");
    owner_only(&kf, k1.encode().as_bytes());
    let t0 = Instant::now();
    let r = call(
        &a,
        "add_host",
        &json!({"nqn": SUB, "host": HOST, "dhchap_key_file": kf.display().to_string()}),
    )
    .unwrap();
    let took = t0.elapsed();
    assert_eq!(
        r["group"]["acknowledged"], 3,
        "every gateway has it when A answers: {r}"
    );
    assert!(took < Duration::from_secs(1), "the change took {took:?}");
    let r = call(&a, "set_qos", &json!({"nqn": SUB, "nsid": 1, "iops": 50000})).unwrap();
    assert_eq!(r["group"]["acknowledged"], 3, "{r}");
    for gw in [&a, &b, &c] {
        assert_eq!(served(gw, SUB), Some(vec![1]), "every gateway serves the namespace");
    }
    let v = converged(&[&a, &b, &c], 6, Duration::from_secs(1));
    let version = v["version"].as_u64().unwrap();

    // The host authenticates through C with the key given to A, and writes; B reads it.
    let data = common::pattern(53, 0, 4096);
    let mut hc = Controller::connect_with(lc, &opts(&k1)).unwrap();
    hc.io[0].write(1, 0, 8, &data).unwrap();
    let mut hb = Controller::connect_with(lb, &opts(&k1)).unwrap();
    let mut back = vec![0u8; 4096];
    hb.io[0].read(1, 0, 8, &mut back).unwrap();
    assert_eq!(back, data);
    // Each gateway's controller IDs are its slot's: the host sees no duplicate.
    assert_ne!(hb.cntlid, hc.cntlid);
    // ANA group ownership is the group's too: set through A for B, B registers it.
    call(&a, "set_ana_groups", &json!({"gateway": "b", "groups": [2]})).unwrap();
    let t0 = Instant::now();
    loop {
        let v = call(&a, "gateways", &json!({})).unwrap();
        let b_groups = v["members"]
            .as_array()
            .and_then(|m| m.iter().find(|x| x["name"] == "b"))
            .map(|x| x["ana_groups"].clone());
        if b_groups == Some(json!([2])) {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "B did not take ANA group 2: {v}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let e = call(&c, "set_ana_groups", &json!({"gateway": "c", "groups": [2]})).unwrap_err();
    assert!(e.contains("owned by b and by c"), "{e}");
    // A host that discovers through A finds every gateway's path.
    let paths_of = |at: SocketAddr, host: &str| {
        let w = pollux_host::discover_all(at, host).unwrap();
        let mut p: Vec<SocketAddr> = w
            .subsystems
            .iter()
            .filter(|e| e.subnqn == SUB)
            .filter_map(pollux_host::DiscoveryEntry::tcp_addr)
            .collect();
        p.sort();
        p
    };
    let paths = |at: SocketAddr| paths_of(at, HOST);
    let mut all = vec![la, lb, lc];
    all.sort();
    assert_eq!(paths(la), all, "A's discovery log lists every gateway's path");
    assert_eq!(paths(lc), all, "so does C's");

    // A reservation key registered through C, seen through B (kept in the cluster).
    const RKEY: u64 = 0x5ec7_e7c0_ffee_0053;
    hc.io[0]
        .exec_ok(
            pollux_host::sqe::resv_register(1, 0, false, 0),
            pollux_host::Data::ToCtrl(pollux_host::sqe::resv_keys(&[0, RKEY])),
        )
        .unwrap();
    let rep = hb.io[0]
        .exec_ok(
            pollux_host::sqe::resv_report(1, 4096, true),
            pollux_host::Data::FromCtrl(vec![0; 4096]),
        )
        .unwrap();
    assert_eq!(rep.buf[5..7], [1, 0], "one registrant, as B sees it (REGCTL)");
    // No key in clear anywhere in the pool: neither a host's DH-HMAC-CHAP key nor a
    // reservation key.
    let secret = k1.encode();
    let rkey_text = [RKEY.to_string(), format!("{RKEY:x}"), format!("{RKEY:X}")];
    for (name, bytes) in group_objects(&ceph) {
        let text = String::from_utf8_lossy(&bytes);
        assert!(!text.contains("DHHC-1"), "{name} holds a key in clear: {text}");
        assert!(!text.contains(secret.as_str()), "{name} holds the host's key");
        assert!(
            !bytes
                .windows(8)
                .any(|w| w == RKEY.to_le_bytes() || w == RKEY.to_be_bytes())
        );
        for t in &rkey_text {
            assert!(
                !text.contains(t.as_str()),
                "{name} holds the reservation key in clear: {text}"
            );
        }
    }

    // Rotate the keys through C: the old key authenticates nowhere, the new one everywhere.
    let k2 = key();
    call(
        &c,
        "set_host_keys",
        &json!({"nqn": SUB, "host": HOST, "dhchap_key": *k2.encode()}),
    )
    .unwrap();
    for l in [la, lb, lc] {
        let e = Controller::connect_with(l, &opts(&k1)).unwrap_err();
        assert!(e.to_string().contains("authentication failed"), "{l}: {e}");
        Controller::connect_with(l, &opts(&k2)).unwrap().shutdown().unwrap();
    }

    // Remove the host through B: its controllers on C and B go.
    call(&b, "remove_host", &json!({"nqn": SUB, "host": HOST})).unwrap();
    for (what, h) in [("C", &mut hc), ("B", &mut hb)] {
        let t0 = Instant::now();
        while h.io[0].read(1, 0, 8, &mut back).is_ok() {
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "the host's controller on {what} stayed"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let end = converged(&[&a, &b, &c], version + 2, Duration::from_secs(2));
    let confs: Vec<Value> = [&a, &b, &c].iter().map(|g| group(g)["conf"].clone()).collect();
    assert!(confs.iter().all(|x| *x == confs[0]), "every gateway reads one document");
    assert!(
        !end["conf"].as_str().unwrap().contains(HOST),
        "the host is gone from the group"
    );

    // Export and import: the document comes back whole, as one more version.
    let file = ceph.dir.join("group-export.toml");
    call(&a, "group_export", &json!({"path": file.display().to_string()})).unwrap();
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.contains(SUB), "{text}");
    let r = call(&b, "group_import", &json!({"path": file.display().to_string()})).unwrap();
    assert_eq!(
        r["group"]["version"].as_u64(),
        Some(end["version"].as_u64().unwrap() + 1),
        "{r}"
    );
    assert_eq!(served(&c, SUB), Some(vec![1]));

    // B upgrades without downtime: the new process runs its own conf and the group's as
    // before (nothing of the group's in its own part: `save` writes the conf as written).
    let bpid = b.pid().unwrap();
    call(&b, "upgrade", &json!({})).unwrap();
    let t0 = Instant::now();
    while b.pid() == Some(bpid) || b.pid().is_none() {
        assert!(t0.elapsed() < Duration::from_secs(20), "B did not upgrade");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        served(&b, SUB),
        Some(vec![1]),
        "B serves the group's subsystem after its upgrade"
    );
    let saved = ceph.dir.join("b-saved.toml");
    call(&b, "save", &json!({"path": saved.display().to_string()})).unwrap();
    let own = std::fs::read_to_string(&saved).unwrap();
    assert!(
        !own.contains(SUB) && !own.contains("[[listener]]"),
        "B's own conf: {own}"
    );
    call(&a, "set_qos", &json!({"nqn": SUB, "nsid": 1, "iops": 40000})).unwrap();
    let v = group(&a)["version"].clone();
    converged(&[&a, &b, &c], v.as_u64().unwrap(), Duration::from_secs(3));

    // C dies: once the group fences it, its path leaves A's discovery log (a Discovery Log
    // Change event to A's discovery controllers), the others stay.
    drop(hc);
    const HOST2: &str = "nqn.2014-08.org.nvmexpress:uuid:53535353-0000-4000-8000-000000000054";
    call(&a, "add_host", &json!({"nqn": SUB, "host": HOST2})).unwrap();
    let paths = |at: SocketAddr| paths_of(at, HOST2);
    assert_eq!(paths(la), all);
    let cpid = c.pid().unwrap() as i32;
    // SAFETY: kill(2) of the gateway process this test started.
    unsafe { libc::kill(cpid, libc::SIGKILL) };
    let t0 = Instant::now();
    let mut left = vec![la, lb];
    left.sort();
    while paths(la) != left {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "C's path stayed in A's discovery log: {:?} {:?}\n{}",
            paths(la),
            left,
            std::fs::read_to_string(ceph.dir.join("gw-a.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn racing_changes_count_once_and_every_gateway_ends_identical() {
    let Some(ceph) = Ceph::start("group-race") else { return };
    let gk = group_key(&ceph);
    let (a, b) = (gateway(&ceph, &gk, "a", 1500), gateway(&ceph, &gk, "b", 1500));
    converged(&[&a, &b], 0, Duration::from_secs(20));
    call(&a, "add_subsystem", &json!({"nqn": SUB, "hosts": []})).unwrap();
    let v0 = converged(&[&a, &b], 1, Duration::from_secs(2))["version"]
        .as_u64()
        .unwrap();
    const PAIRS: usize = 100;
    std::thread::scope(|s| {
        for (gw, tag) in [(&a, "a"), (&b, "b")] {
            s.spawn(move || {
                for i in 0..PAIRS {
                    let host = format!("nqn.2026-12.io.pollux:host-{tag}-{i}");
                    call(gw, "add_host", &json!({"nqn": SUB, "host": host})).unwrap();
                }
            });
        }
    });
    let end = converged(&[&a, &b], v0 + 2 * PAIRS as u64, Duration::from_secs(5));
    assert_eq!(
        end["version"].as_u64(),
        Some(v0 + 2 * PAIRS as u64),
        "each change counted once"
    );
    let (ga, gb) = (group(&a), group(&b));
    assert_eq!(ga["conf"], gb["conf"]);
    let conf = ga["conf"].as_str().unwrap();
    for tag in ["a", "b"] {
        for i in 0..PAIRS {
            assert!(conf.contains(&format!("host-{tag}-{i}\"")), "host-{tag}-{i} was lost");
        }
    }
    // What each gateway serves is what the document says.
    let hosts = |gw: &Spawned| {
        let v = call(gw, "subsystems", &json!({})).unwrap();
        let s = v.as_array().unwrap().iter().find(|s| s["nqn"] == SUB).unwrap().clone();
        s["hosts"].as_array().map_or(0, Vec::len)
    };
    assert_eq!(hosts(&a), 2 * PAIRS);
    assert_eq!(hosts(&b), 2 * PAIRS);
}

#[test]
fn late_and_paused_gateways_catch_up_and_bad_objects_apply_nothing() {
    let Some(ceph) = Ceph::start("group-late") else { return };
    let gk = group_key(&ceph);
    // A grace long enough that the pause below is not a fence: this is about configuration.
    let (a, b) = (gateway(&ceph, &gk, "a", 60_000), gateway(&ceph, &gk, "b", 60_000));
    converged(&[&a, &b], 0, Duration::from_secs(20));
    for i in 0..10 {
        call(
            &a,
            "add_subsystem",
            &json!({"nqn": format!("{SUB}-{i}"), "allow_any_host": true}),
        )
        .unwrap();
    }
    // Started after ten changes: it catches up.
    let c = gateway(&ceph, &gk, "c", 60_000);
    converged(&[&a, &b, &c], 10, Duration::from_secs(5));
    for i in 0..10 {
        assert!(served(&c, &format!("{SUB}-{i}")).is_some());
    }
    // Paused across five changes: the changes land meanwhile, it catches up on resume.
    let bpid = b.pid().unwrap() as i32;
    // SAFETY: kill(2) of the gateway process this test started.
    unsafe { libc::kill(bpid, libc::SIGSTOP) };
    for i in 0..5 {
        call(&c, "remove_subsystem", &json!({"nqn": format!("{SUB}-{i}")})).unwrap();
    }
    // SAFETY: as above.
    unsafe { libc::kill(bpid, libc::SIGCONT) };
    converged(&[&a, &b, &c], 15, Duration::from_secs(10));
    for i in 0..10 {
        assert_eq!(served(&b, &format!("{SUB}-{i}")).is_some(), i >= 5, "{SUB}-{i} on B");
    }

    // The cluster paused during a change: it lands whole or is refused, never half.
    let before = group(&a);
    ceph.signal("pause");
    let r = call(
        &a,
        "add_subsystem",
        &json!({"nqn": format!("{SUB}-paused"), "allow_any_host": true}),
    );
    ceph.signal("resume");
    let after = converged(&[&a, &b, &c], 15, Duration::from_secs(30));
    let landed = after["conf"].as_str().unwrap().contains("-paused\"");
    match &r {
        Ok(_) => assert!(landed, "answered but not in the group"),
        Err(e) => assert!(
            e.contains("cannot reach the cluster") || e.contains("may land or not"),
            "refused without saying why: {e}"
        ),
    }
    let expect = before["version"].as_u64().unwrap() + u64::from(landed);
    assert_eq!(after["version"].as_u64(), Some(expect), "{r:?}");
    for gw in [&a, &b, &c] {
        assert_eq!(served(gw, &format!("{SUB}-paused")).is_some(), landed);
    }

    // An object of a future format: refused by name and version, nothing applied.
    let oid = "pollux.gateway.cfg.config";
    let saved = ceph.run("rados", &["-p", "rbd", "get", oid, "-"]);
    let mut future: Value = serde_json::from_slice(&saved).unwrap();
    future["format"] = json!(99);
    future["version"] = json!(1000);
    future["conf"] = json!("");
    let f = ceph.dir.join("future.json");
    std::fs::write(&f, future.to_string()).unwrap();
    ceph.run("rados", &["-p", "rbd", "put", oid, f.to_str().unwrap()]);
    let t0 = Instant::now();
    loop {
        let e = call(&b, "group", &json!({})).unwrap_err();
        if e.contains("format 99") {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "{e}");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(1500));
    for gw in [&a, &b, &c] {
        assert!(served(gw, &format!("{SUB}-9")).is_some(), "nothing of it applied");
    }
    let e = call(
        &a,
        "add_subsystem",
        &json!({"nqn": format!("{SUB}-x"), "allow_any_host": true}),
    )
    .unwrap_err();
    assert!(e.contains("format 99"), "{e}");
    // Garbage: the same.
    std::fs::write(&f, b"not json").unwrap();
    ceph.run("rados", &["-p", "rbd", "put", oid, f.to_str().unwrap()]);
    std::thread::sleep(Duration::from_millis(1500));
    let e = call(&c, "group", &json!({})).unwrap_err();
    assert!(e.contains("malformed"), "{e}");
    assert!(served(&c, &format!("{SUB}-9")).is_some());
    // Put back: served again as it was.
    std::fs::write(&f, &saved).unwrap();
    ceph.run("rados", &["-p", "rbd", "put", oid, f.to_str().unwrap()]);
    converged(&[&a, &b, &c], expect, Duration::from_secs(5));
}
