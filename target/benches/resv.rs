//! `ci/bench resv` (issue 40): what a reservation change costs when the state is kept in the
//! cluster for every gateway, beside the same change on a target's own reservations. Not a
//! test: it measures.
//!
//! A one-node Ceph cluster (`ci/ceph.sh`); gateway A (a `pollux` process) serves rbd/img0
//! (reservations kept in the cluster) and a RAM namespace (the target's own reservations) in
//! two subsystems; gateway B (another process) serves rbd/img0 too, so every change of it is
//! announced to a second gateway and waits for its acknowledgement. One host, connected to
//! both of A's subsystems, registers on each, then changes its key (Reservation Register,
//! Replace) BENCH_RESV_CHANGES times in a row on one, then on the other, alternating in
//! BENCH_RESV_PAIRS ABBA pairs. Per run: each change's round trip as the host sees it (p50,
//! p99). Reported: the medians per cell, and the per-pair ratios of the cluster's p50 to the
//! target's own.
//!
//! Writes resv.json and resv.md in POLLUX_BENCH_OUT_DIR (default the workspace's build/bench)
//! and a line per run on stderr (`resv: ...`).
//!
//! env: POLLUX_BIN (the workspace's build/release/pollux), BENCH_RESV_CHANGES (200),
//! BENCH_RESV_PAIRS (4), BENCH_QUICK=1 (1 pair of 20 changes).
#![allow(missing_docs, clippy::print_stdout, clippy::unwrap_used)]

mod cluster;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use pollux_host::{Controller, Data, Digests, sqe};

const RBD_NQN: &str = "nqn.2026-12.io.pollux:bench-resv-rbd";
const RAM_NQN: &str = "nqn.2026-12.io.pollux:bench-resv-ram";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:be4c0001-0000-4000-8000-000000000001";

fn subsystem(nqn: &str, cntlid: u16, backend: &str) -> String {
    format!(
        "[[subsystem]]\nnqn = \"{nqn}\"\nallow_any_host = true\nmin_cntlid = {cntlid}\nmax_cntlid = {}\n\
         [[subsystem.namespace]]\nnsid = 1\nbackend = {backend}\n",
        cntlid + 99
    )
}

/// `n` Register Replace changes of the host's key on `c`, from `key`; each round trip.
fn changes(c: &mut Controller, key: &mut u64, n: usize) -> Vec<Duration> {
    (0..n)
        .map(|_| {
            let t0 = Instant::now();
            let done = c.io[0]
                .exec(
                    sqe::resv_register(1, 2, false, 0),
                    Data::ToCtrl(sqe::resv_keys(&[*key, *key + 1])),
                )
                .unwrap();
            let took = t0.elapsed();
            assert!(done.is_success(), "replace: {:?}", done.status);
            *key += 1;
            took
        })
        .collect()
}

fn pct(v: &mut [Duration], p: f64) -> f64 {
    v.sort();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i].as_secs_f64() * 1e6
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn main() {
    let (bin, out) = cluster::bin_and_out();
    let n = cluster::setting("BENCH_RESV_CHANGES", 200, 20);
    let pairs = cluster::setting("BENCH_RESV_PAIRS", 4, 1);
    let ceph = cluster::Cluster::start("resv");
    let dir = ceph.dir.clone();
    let conf = ceph.conf.clone();
    let rbd = format!(
        "{{ rbd = {{ pool = \"rbd\", image = \"img0\", ceph_conf = \"{}\" }} }}",
        conf.display()
    );
    let head = |addr: SocketAddr| {
        format!("[reactors]\ncores = [0]\nmode = \"interrupt\"\n[[listener]]\naddress = \"{addr}\"\n")
    };
    let (a_addr, b_addr) = (cluster::free_addr(), cluster::free_addr());
    let a_text = format!(
        "{}{}{}",
        head(a_addr),
        subsystem(RBD_NQN, 1, &rbd),
        subsystem(RAM_NQN, 201, "{ ram = { size = \"16MiB\" } }")
    );
    let b_text = format!("{}{}", head(b_addr), subsystem(RBD_NQN, 101, &rbd));
    let mut a = cluster::gateway(&bin, &dir, "a", &a_text, a_addr);
    let mut b = cluster::gateway(&bin, &dir, "b", &b_text, b_addr);

    let mut cluster = Controller::connect(a_addr, RBD_NQN, HOST, 1, 32, Digests::NONE).unwrap();
    let mut local = Controller::connect(a_addr, RAM_NQN, HOST, 1, 32, Digests::NONE).unwrap();
    for c in [&mut cluster, &mut local] {
        c.io[0].set_timeout(Duration::from_secs(30));
        let done = c.io[0]
            .exec(
                sqe::resv_register(1, 0, false, 0),
                Data::ToCtrl(sqe::resv_keys(&[0, 1])),
            )
            .unwrap();
        assert!(done.is_success(), "register: {:?}", done.status);
    }
    let (mut ck, mut lk) = (1u64, 1u64);
    // Warm both paths (connections, the change threads, the cluster's object).
    changes(&mut cluster, &mut ck, 5);
    changes(&mut local, &mut lk, 5);

    let mut runs = Vec::new();
    let mut ratios = Vec::new();
    for p in 0..pairs {
        let order: [&str; 2] = if p % 2 == 0 {
            ["target", "cluster"]
        } else {
            ["cluster", "target"]
        };
        let mut p50 = [0.0f64; 2];
        for cell in order {
            let mut v = if cell == "cluster" {
                changes(&mut cluster, &mut ck, n)
            } else {
                changes(&mut local, &mut lk, n)
            };
            let (m, q) = (pct(&mut v, 0.5), pct(&mut v, 0.99));
            eprintln!("resv: pair {p} {cell:<7} {n} changes: p50 {m:.0} us, p99 {q:.0} us");
            p50[usize::from(cell == "cluster")] = m;
            runs.push(serde_json::json!({"pair": p, "cell": cell, "changes": n, "p50_us": m, "p99_us": q}));
        }
        ratios.push(p50[1] / p50[0]);
    }
    let cell = |name: &str, key: &str| {
        median(
            runs.iter()
                .filter(|r| r["cell"] == name)
                .map(|r| r[key].as_f64().unwrap())
                .collect(),
        )
    };
    let summary = serde_json::json!({
        "changes_per_run": n,
        "pairs": pairs,
        "target_p50_us": cell("target", "p50_us"),
        "target_p99_us": cell("target", "p99_us"),
        "cluster_p50_us": cell("cluster", "p50_us"),
        "cluster_p99_us": cell("cluster", "p99_us"),
        "cluster_over_target_p50": ratios,
        "runs": runs,
    });
    std::fs::write(out.join("resv.json"), serde_json::to_string_pretty(&summary).unwrap()).unwrap();
    let md = format!(
        "| reservation change (Register Replace) | p50 | p99 |\n|---|---|---|\n\
         | the target's own (RAM namespace) | {:.0} us | {:.0} us |\n\
         | kept in the cluster, two gateways watching | {:.0} us | {:.0} us |\n\n\
         cluster / target p50 per ABBA pair: {}\n",
        cell("target", "p50_us"),
        cell("target", "p99_us"),
        cell("cluster", "p50_us"),
        cell("cluster", "p99_us"),
        ratios.iter().map(|r| format!("{r:.1}")).collect::<Vec<_>>().join(", ")
    );
    std::fs::write(out.join("resv.md"), &md).unwrap();
    eprint!("resv: {}", md.replace('\n', "\nresv: "));
    eprintln!();

    drop((cluster, local));
    for g in [&mut a, &mut b] {
        cluster::stop(g);
    }
}
