//! `ci/bench failover` (issue 49): the write stall a host sees when the gateway holding an
//! RBD image's exclusive lock is killed (SIGKILL), with the gateways in a gateway group
//! (`[gateway]`, its defaults: 500 ms heartbeats, 1.5 s grace) and without one. Not a test:
//! it measures.
//!
//! A one-node Ceph cluster (`ci/ceph.sh`) and two pairs of gateway processes: A and B in a
//! group over rbd/img0, A' and B' (no `[gateway]`) over rbd/img1. One cycle: A (or A') is
//! started, serves its ANA group optimized (after a group's failback), and a host writes
//! through it, so it holds the image's lock; then A is killed and the host writes through B
//! at once (a multipath host moves there as soon as A's connection drops): the stall is the
//! time from the kill to that write's completion. BENCH_FAILOVER_CYCLES cycles with the
//! group, BENCH_FAILOVER_BASELINE without, interleaved (one without, then the next with).
//! Reported: p50 and max per cell, and every cycle.
//!
//! Writes failover.json and failover.md in POLLUX_BENCH_OUT_DIR (default the workspace's
//! build/bench) and a line per cycle on stderr (`failover: ...`).
//!
//! env: POLLUX_BIN (the workspace's build/release/pollux), BENCH_FAILOVER_CYCLES (20),
//! BENCH_FAILOVER_BASELINE (3), BENCH_QUICK=1 (3 and 1).
#![allow(missing_docs, clippy::print_stdout, clippy::unwrap_used)]

mod cluster;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use pollux_host::{Controller, Digests};

const NQN: &str = "nqn.2026-12.io.pollux:bench-failover";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:fa110000-0000-4000-8000-000000000001";

/// Gateway `name` over `image`: owns ANA group `owns` (its listener reports the other
/// non-optimized); in group `bench` when `group`.
fn conf(ceph: &Path, name: &str, addr: SocketAddr, owns: u32, cntlid: u16, image: &str, group: bool) -> String {
    let gw = if group {
        format!("[gateway]\ngroup = \"bench\"\nname = \"{name}\"\nana_groups = [{owns}]\n")
    } else {
        String::new()
    };
    format!(
        "[reactors]\ncores = [0]\nmode = \"interrupt\"\n[[listener]]\naddress = \"{addr}\"\nana = {{ {} = \"non-optimized\" }}\n{gw}\
         [[subsystem]]\nnqn = \"{NQN}\"\nallow_any_host = true\nmin_cntlid = {cntlid}\nmax_cntlid = {}\n\
         [[subsystem.namespace]]\nnsid = 1\nana_group = 1\nbackend = {{ rbd = {{ pool = \"rbd\", image = \"{image}\", ceph_conf = \"{}\" }} }}\n",
        3 - owns,
        cntlid + 99,
        ceph.display()
    )
}

/// The state code of ANA group 1 in `c`'s ANA log page (NVMe 2.0 §5.16.1.13).
fn group1_state(c: &mut Controller) -> Option<u8> {
    let page = c.admin.get_log_page(0x0C, 0, 4096).ok()?;
    let le32 = |b: &[u8]| u32::from_le_bytes(b[..4].try_into().unwrap());
    let n = u16::from_le_bytes(page[8..10].try_into().unwrap());
    let mut at = 16;
    for _ in 0..n {
        let d = &page[at..at + 32];
        if le32(d) == 1 {
            return Some(d[16]);
        }
        at += 32 + 4 * le32(&d[4..]) as usize;
    }
    None
}

fn pct(v: &[f64], q: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

struct Pair {
    name: &'static str,
    image: &'static str,
    group: bool,
    a_addr: SocketAddr,
    b: Child,
    hb: Controller,
}

impl Pair {
    fn new(bin: &str, dir: &Path, ceph: &Path, name: &'static str, image: &'static str, group: bool) -> Self {
        let (a_addr, b_addr) = (cluster::free_addr(), cluster::free_addr());
        let b = cluster::gateway(
            bin,
            dir,
            &format!("{name}-b"),
            &conf(ceph, "b", b_addr, 2, 101, image, group),
            b_addr,
        );
        let mut hb = Controller::connect(b_addr, NQN, HOST, 1, 32, Digests::NONE).unwrap();
        hb.io[0].set_timeout(Duration::from_secs(120));
        Self {
            name,
            image,
            group,
            a_addr,
            b,
            hb,
        }
    }

    /// One cycle: A up and holding the lock, killed, B's first write: the stall.
    fn cycle(&mut self, bin: &str, dir: &Path, ceph: &Path, data: &[u8]) -> f64 {
        let text = conf(ceph, "a", self.a_addr, 1, 1, self.image, self.group);
        let mut a = cluster::gateway(bin, dir, &format!("{}-a", self.name), &text, self.a_addr);
        let mut ha = Controller::connect(self.a_addr, NQN, HOST, 1, 32, Digests::NONE).unwrap();
        ha.io[0].set_timeout(Duration::from_secs(120));
        // In a group, A rejoins after the previous cycle's fence: its group comes back after
        // the failback delay, and only then is A the path a host writes through.
        let t0 = Instant::now();
        while group1_state(&mut ha) != Some(1) {
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "{}: A's group is not optimized again",
                self.name
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        ha.io[0].write(1, 0, 8, data).unwrap();
        ha.io[0].write(1, 8, 8, data).unwrap();
        let _ = a.kill();
        let killed = Instant::now();
        // As a host does: a retryable status (a command librbd held past twice its operation
        // timeout, waiting for the lock, is answered Namespace Not Ready) is sent again.
        let mut retries = 0;
        while let Err(e) = self.hb.io[0].write(1, 16, 8, data) {
            let st = e.status().unwrap_or_else(|| panic!("{}: {e}", self.name));
            assert!(!st.dnr() && retries < 20, "{}: {e}", self.name);
            retries += 1;
        }
        let stall = killed.elapsed().as_secs_f64();
        let _ = a.wait();
        drop(ha);
        stall
    }
}

fn main() {
    let (bin, out) = cluster::bin_and_out();
    let cycles = cluster::setting("BENCH_FAILOVER_CYCLES", 20, 3);
    let baseline = cluster::setting("BENCH_FAILOVER_BASELINE", 3, 1);
    let ceph = cluster::Cluster::start("failover");
    let (dir, conf_path) = (ceph.dir.clone(), ceph.conf.clone());
    ceph.rbd(&["create", "--size", "64M", "rbd/img1"]);
    let data = vec![0x3cu8; 4096];
    let mut grouped = Pair::new(&bin, &dir, &conf_path, "group", "img0", true);
    let mut lone = Pair::new(&bin, &dir, &conf_path, "none", "img1", false);

    let mut runs = Vec::new();
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for i in 0..cycles {
        if i < baseline {
            let s = lone.cycle(&bin, &dir, &conf_path, &data);
            eprintln!("failover: cycle {i} without a group: {s:.2} s from SIGKILL to the survivor's first write");
            runs.push(serde_json::json!({"cycle": i, "cell": "none", "stall_s": s}));
            without.push(s);
        }
        let s = grouped.cycle(&bin, &dir, &conf_path, &data);
        eprintln!("failover: cycle {i} in a group: {s:.2} s from SIGKILL to the survivor's first write");
        runs.push(serde_json::json!({"cycle": i, "cell": "group", "stall_s": s}));
        with.push(s);
    }
    let summary = serde_json::json!({
        "cycles": cycles,
        "baseline_cycles": baseline,
        "group_p50_s": pct(&with, 0.5),
        "group_max_s": pct(&with, 1.0),
        "none_p50_s": pct(&without, 0.5),
        "none_max_s": pct(&without, 1.0),
        "runs": runs,
    });
    std::fs::write(
        out.join("failover.json"),
        serde_json::to_string_pretty(&summary).unwrap(),
    )
    .unwrap();
    let md = format!(
        "| SIGKILL of the gateway holding the image's lock | cycles | stall p50 | stall max |\n|---|---|---|---|\n\
         | gateway group (heartbeat 500 ms, grace 1.5 s) | {} | {:.2} s | {:.2} s |\n\
         | no group (librbd waits for the OSDs' watch timeout) | {} | {:.2} s | {:.2} s |\n",
        with.len(),
        pct(&with, 0.5),
        pct(&with, 1.0),
        without.len(),
        pct(&without, 0.5),
        pct(&without, 1.0),
    );
    std::fs::write(out.join("failover.md"), &md).unwrap();
    eprint!("failover: {}", md.replace('\n', "\nfailover: "));
    eprintln!();

    drop((grouped.hb, lone.hb));
    for g in [&mut grouped.b, &mut lone.b] {
        cluster::stop(g);
    }
}
