//! Many namespaces in many subsystems (issue 38): 16,384 RAM namespaces, 128 in each of 128
//! subsystems, all reachable from a host: in its discovery log, in each subsystem's Active
//! Namespace ID list, by Identify Namespace, and by a read. Its figures (start, discovery
//! and Identify latency, RSS) are `ci/bench scale`'s; this checks that it all works, and
//! bounds the start loosely enough that only a cost growing faster than the namespaces
//! (quadratic conf validation took 5.5 s in release) trips it.
#![allow(missing_docs, clippy::unwrap_used)]

use std::time::{Duration, Instant};

use pollux_conf::{Config, DISCOVERY_NQN};
use pollux_host::{Controller, ControllerOpts};
use pollux_nvme::spec::Status;
use pollux_target::{Options, Target};

mod common;
use common::HOST;

const SUBSYSTEMS: usize = 128;
const PER: u32 = 128;
/// 4 KiB each: RAM namespaces are committed whole at start (16,384 x 4 KiB = 64 MiB).
const BLOCKS: u64 = 8;

fn nqn(s: usize) -> String {
    format!("nqn.2026-11.io.pollux:scale-{s:03}")
}

fn conf() -> String {
    let mut c =
        String::from("[reactors]\ncores = [0, 1]\nmode = \"interrupt\"\n\n[[listener]]\naddress = \"127.0.0.1:0\"\n");
    for s in 0..SUBSYSTEMS {
        c += &format!("\n[[subsystem]]\nnqn = \"{}\"\nallow_any_host = true\n", nqn(s));
        for n in 1..=PER {
            // Every fourth subsystem with 4096-byte blocks: both formats at scale.
            let bs = if s % 4 == 3 { 4096 } else { 512 };
            c += &format!(
                "\n[[subsystem.namespace]]\nnsid = {n}\nblock_size = {bs}\nbackend = {{ ram = {{ size = {} }} }}\n",
                BLOCKS * bs
            );
        }
    }
    c
}

#[test]
fn every_one_of_16384_namespaces_in_128_subsystems_is_reachable() {
    let text = conf();
    let t0 = Instant::now();
    let cfg = Config::parse(&text, "scale.toml").unwrap();
    let parsed = t0.elapsed();
    let target = Target::start(&cfg, Options { pin: false }).unwrap();
    let started = t0.elapsed();
    let addr = target.listen_addrs()[0];

    // Discovery: one record per subsystem, read in pieces as libnvme does.
    let mut d = Controller::connect_with(addr, &ControllerOpts::new(DISCOVERY_NQN, HOST, 0, 32)).unwrap();
    let log = d.admin.discovery_log().unwrap();
    let mut names: Vec<String> = log
        .entries
        .iter()
        .filter(|e| e.subtype == 2)
        .map(|e| e.subnqn.clone())
        .collect();
    names.sort();
    assert_eq!(names, (0..SUBSYSTEMS).map(nqn).collect::<Vec<_>>());
    d.shutdown().unwrap();

    let mut buf = vec![0u8; 4096];
    for s in 0..SUBSYSTEMS {
        let mut c = Controller::connect(addr, &nqn(s), HOST, 1, 32, pollux_host::Digests::NONE).unwrap();
        let id = c.admin.identify_controller().unwrap();
        assert_eq!(id.nn, 1024, "NN: the largest NSID, at least 1024");
        let active = c.admin.active_namespaces(0).unwrap();
        assert_eq!(active, (1..=PER).collect::<Vec<_>>(), "subsystem {s}");
        // The list from a given NSID on (CNS 02h: NSIDs above it).
        assert_eq!(c.admin.active_namespaces(PER - 2).unwrap(), [PER - 1, PER]);
        assert!(c.admin.active_namespaces(PER).unwrap().is_empty());
        let bs = if s % 4 == 3 { 4096 } else { 512 };
        for nsid in 1..=PER {
            let ns = c.admin.identify_namespace(nsid).unwrap();
            assert_eq!((ns.nsze, ns.block_size), (BLOCKS, bs), "subsystem {s} namespace {nsid}");
            // The I/O path finds it too: the last block reads back as zeroes.
            let n = bs as usize;
            c.io[0].read(nsid, BLOCKS - 1, 1, &mut buf[..n]).unwrap();
            assert!(buf[..n].iter().all(|&b| b == 0));
        }
        // An NSID past the last is inactive for Identify and I/O alike.
        let ns = c.admin.identify_namespace(PER + 1).unwrap();
        assert_eq!(ns.nsze, 0, "an inactive NSID: zero-filled");
        let err = c.io[0].read(PER + 1, 0, 1, &mut buf[..512]).unwrap_err();
        assert_eq!(err.status(), Some(Status::INVALID_NAMESPACE.with_dnr()), "{err}");
        c.shutdown().unwrap();
    }
    let all = t0.elapsed();
    eprintln!("conf parsed in {parsed:?}, target started at {started:?}, every namespace checked at {all:?}");
    // Loose: a debug build here parses in ~3 s and starts in ~5 s; quadratic costs took
    // minutes.
    assert!(started < Duration::from_secs(60), "start took {started:?}");
    target.shutdown().unwrap();
}
