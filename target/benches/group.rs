//! `ci/bench group` (issue 53): how long a configuration change takes to reach every gateway
//! of a three-gateway group kept in the cluster, against the same change made by hand on
//! three lone gateways (one `pollux ctl` per gateway, one after the other, as an operator's
//! script does). Not a test: it measures.
//!
//! A one-node Ceph cluster (`ci/ceph.sh`); three gateway processes in group `bench` whose
//! confs name only themselves (the subsystem in the group's configuration), and three lone
//! gateways serving the same subsystem from their own confs. One pair: a host NQN added
//! through one group gateway (rotating A, B, C; the answer comes once every gateway
//! acknowledged it, checked), then the same added on each lone gateway in turn; each timed
//! from the first command to the last answer. Pairs alternate which goes first (ABBA).
//! Reported: p50, p99 and max per cell and the per-pair ratio group / by hand.
//!
//! Writes group.json and group.md in POLLUX_BENCH_OUT_DIR (default the workspace's
//! build/bench) and a summary line on stderr (`group: ...`).
//!
//! env: POLLUX_BIN (the workspace's build/release/pollux), BENCH_GROUP_PAIRS (60),
//! BENCH_QUICK=1 (10).
#![allow(missing_docs, clippy::print_stdout, clippy::unwrap_used)]

mod cluster;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const NQN: &str = "nqn.2026-12.io.pollux:bench-group";

struct Gw {
    child: Child,
    sock: PathBuf,
}

/// `bin --config DIR/NAME.toml` serving `text`, with control socket DIR/NAME.sock; once it
/// answers there.
fn start(bin: &str, dir: &Path, name: &str, text: &str) -> Gw {
    let sock = dir.join(format!("{name}.sock"));
    let text = format!("{text}[control]\nsocket = \"{}\"\n", sock.display());
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).unwrap();
    let log = std::fs::File::create(dir.join(format!("{name}.log"))).unwrap();
    let child = Command::new(bin)
        .arg("--config")
        .arg(&path)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while std::os::unix::net::UnixStream::connect(&sock).is_err() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "gateway {name} did not open its socket"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Gw { child, sock }
}

/// `pollux ctl call METHOD PARAMS` on `gw`: its JSON result.
fn call(bin: &str, gw: &Gw, method: &str, params: &Value) -> Value {
    let o = Command::new(bin)
        .arg("ctl")
        .arg("--socket")
        .arg(&gw.sock)
        .args(["--json", "call", method, &params.to_string()])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{method}: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap_or(Value::Null)
}

fn pct(v: &[f64], q: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

fn main() {
    let (bin, out) = cluster::bin_and_out();
    let pairs = cluster::setting("BENCH_GROUP_PAIRS", 60, 10);
    let ceph = cluster::Cluster::start("group");
    let key = ceph.dir.join("group.key");
    {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut k = [0u8; 32];
        getrandom::fill(&mut k).unwrap();
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o600)
            .open(&key)
            .unwrap();
        f.write_all(&k).unwrap();
    }
    let grouped: Vec<Gw> = ["a", "b", "c"]
        .iter()
        .map(|n| {
            let text = format!(
                "[reactors]\ncores = [0]\nmode = \"interrupt\"\n[gateway]\ngroup = \"bench\"\nname = \"{n}\"\npool = \"rbd\"\nceph_conf = \"{}\"\nkey_file = \"{}\"\n",
                ceph.conf.display(),
                key.display()
            );
            start(&bin, &ceph.dir, n, &text)
        })
        .collect();
    let lone: Vec<Gw> = ["x", "y", "z"]
        .iter()
        .map(|n| {
            let text = format!(
                "[reactors]\ncores = [0]\nmode = \"interrupt\"\n[[listener]]\naddress = \"{}\"\n[[subsystem]]\nnqn = \"{NQN}\"\nhosts = []\n",
                cluster::free_addr()
            );
            start(&bin, &ceph.dir, n, &text)
        })
        .collect();
    // Every group gateway has its slot, then the group's subsystem.
    let t0 = Instant::now();
    while grouped.iter().any(|g| {
        call(&bin, g, "group", &json!({}))["gateways"]
            .as_array()
            .map_or(0, Vec::len)
            < 3
    }) {
        assert!(t0.elapsed() < Duration::from_secs(30), "the group did not form");
        std::thread::sleep(Duration::from_millis(100));
    }
    call(&bin, &grouped[0], "add_subsystem", &json!({"nqn": NQN, "hosts": []}));

    let host = |cell: &str, i: usize| format!("nqn.2026-12.io.pollux:bench-{cell}-{i}");
    let (mut g_ms, mut h_ms, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..pairs {
        let run_group = |i: usize| {
            let gw = &grouped[i % 3];
            let t = Instant::now();
            let r = call(&bin, gw, "add_host", &json!({"nqn": NQN, "host": host("g", i)}));
            let ms = t.elapsed().as_secs_f64() * 1e3;
            assert_eq!(r["group"]["acknowledged"], 3, "not every gateway acknowledged: {r}");
            ms
        };
        let run_hand = |i: usize| {
            let t = Instant::now();
            for gw in &lone {
                call(&bin, gw, "add_host", &json!({"nqn": NQN, "host": host("h", i)}));
            }
            t.elapsed().as_secs_f64() * 1e3
        };
        let (g, h) = if i % 2 == 0 {
            let g = run_group(i);
            (g, run_hand(i))
        } else {
            let h = run_hand(i);
            (run_group(i), h)
        };
        g_ms.push(g);
        h_ms.push(h);
        ratios.push(g / h);
    }
    // Every group gateway serves every host added.
    for gw in &grouped {
        let v = call(&bin, gw, "subsystems", &json!({}));
        let s = v.as_array().unwrap().iter().find(|s| s["nqn"] == NQN).unwrap().clone();
        assert_eq!(
            s["hosts"].as_array().map_or(0, Vec::len),
            pairs,
            "a gateway lacks hosts"
        );
    }
    let version = call(&bin, &grouped[1], "group", &json!({}))["version"]
        .as_u64()
        .unwrap();
    assert_eq!(version, pairs as u64 + 1, "each change counted once");
    for mut g in grouped.into_iter().chain(lone) {
        // SAFETY: kill(2) of a process this program started.
        unsafe { libc::kill(g.child.id() as i32, libc::SIGTERM) };
        let _ = g.child.wait();
    }
    let cell = |v: &[f64]| json!({"p50_ms": pct(v, 0.5), "p99_ms": pct(v, 0.99), "max_ms": pct(v, 1.0)});
    let doc = json!({
        "pairs": pairs,
        "group": cell(&g_ms),
        "by_hand": cell(&h_ms),
        "ratio_group_over_by_hand": {"p50": pct(&ratios, 0.5), "min": pct(&ratios, 0.0), "max": pct(&ratios, 1.0)},
        "version": version,
    });
    std::fs::write(out.join("group.json"), serde_json::to_string_pretty(&doc).unwrap()).unwrap();
    let md = format!(
        "# ci/bench group\n\n{pairs} ABBA pairs: a host added through one gateway of a three-gateway group (answered once all three acknowledged) against the same on three lone gateways, one `pollux ctl` each.\n\n\
         | cell | p50 ms | p99 ms | max ms |\n|---|---|---|---|\n\
         | group (one command) | {:.1} | {:.1} | {:.1} |\n| by hand (three commands) | {:.1} | {:.1} | {:.1} |\n\n\
         Per-pair ratio group / by hand: p50 {:.2} (min {:.2}, max {:.2}).\n",
        pct(&g_ms, 0.5),
        pct(&g_ms, 0.99),
        pct(&g_ms, 1.0),
        pct(&h_ms, 0.5),
        pct(&h_ms, 0.99),
        pct(&h_ms, 1.0),
        pct(&ratios, 0.5),
        pct(&ratios, 0.0),
        pct(&ratios, 1.0),
    );
    std::fs::write(out.join("group.md"), &md).unwrap();
    eprintln!(
        "group: {pairs} pairs: one change reaching 3 gateways p50 {:.1} ms (max {:.1}), by hand on 3 p50 {:.1} ms; ratio p50 {:.2}",
        pct(&g_ms, 0.5),
        pct(&g_ms, 1.0),
        pct(&h_ms, 0.5),
        pct(&ratios, 0.5)
    );
}
