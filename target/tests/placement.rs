//! Connection placement against an in-process target with two reactors: a controller's I/O
//! queues spread over the reactors (two hosts connecting at once, from two addresses, each
//! get queues on both), `reactors` counts queues and controllers per reactor, and a host
//! asking for 127 I/O queues is granted as many as are useful (NVMe 2.0 §5.27.1.5) and
//! works on every one.
#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use common::{addr, pattern, start_with_ctx};
use pollux_host::{Controller, ControllerOpts, HostQueue, QueueOpts};
use pollux_target::control::rpc::Ctx;
use serde_json::{Value, json};

const NQN: &str = "nqn.2026-12.io.pollux:placement";
const A: &str = "nqn.2014-08.org.nvmexpress:uuid:0d0d0d0d-0000-4000-8000-00000000000a";
const B: &str = "nqn.2014-08.org.nvmexpress:uuid:0d0d0d0d-0000-4000-8000-00000000000b";

fn conf(transport: &str) -> String {
    format!(
        r#"
[reactors]
cores = [0, 1]
mode = "interrupt"

[[listener]]
address = "127.0.0.1:0"

{transport}

[[subsystem]]
nqn = "{NQN}"
allow_any_host = true

[[subsystem.namespace]]
nsid = 1
backend = {{ ram = {{ size = "16MiB" }} }}
"#
    )
}

fn connect_from(t: &pollux_target::Target, host: &str, source: &str, io: u16) -> Controller {
    let mut o = ControllerOpts::new(NQN, host, io, 32);
    o.source = Some(source.parse::<IpAddr>().unwrap());
    Controller::connect_with(addr(t), &o).unwrap()
}

/// The reactor of each I/O queue of the controller of `host`.
fn io_reactors(ctx: &Ctx, host: &str) -> Vec<usize> {
    let list = ctx.call("controllers", &json!({})).unwrap();
    let c = list["controllers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["hostnqn"] == host)
        .unwrap_or_else(|| panic!("no controller of {host}: {list}"));
    let qs: BTreeMap<String, usize> = serde_json::from_value(c["io_queues"].clone()).unwrap();
    qs.values().copied().collect()
}

/// `reactors`' (connections, admin queues, I/O queues) of each reactor, once they settle
/// (a closed connection leaves its reactor's counts as its source is removed).
fn queues(ctx: &Ctx, want: impl Fn(&[(u64, u64, u64)]) -> bool) -> Vec<(u64, u64, u64)> {
    let t0 = Instant::now();
    loop {
        let v: Value = ctx.call("reactors", &json!({})).unwrap();
        let got: Vec<(u64, u64, u64)> = v
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["connections"].as_u64().unwrap(),
                    r["admin_queues"].as_u64().unwrap(),
                    r["io_queues"].as_u64().unwrap(),
                )
            })
            .collect();
        if want(&got) || t0.elapsed() > Duration::from_secs(5) {
            return got;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn two_hosts_connecting_at_once_get_queues_on_every_reactor() {
    let (t, ctx) = start_with_ctx(&conf(""));
    // Each connects its admin queue and 4 I/O queues from its own address, as two machines
    // would, and their arrivals alternate exactly: A B A B ... (round robin on two reactors
    // then puts all of A's on one reactor and all of B's on the other).
    let admin = |host: &str, src: &str| {
        let mut o = ControllerOpts::new(NQN, host, 0, 32);
        o.source = Some(src.parse::<IpAddr>().unwrap());
        Controller::connect_with(addr(&t), &o).unwrap()
    };
    let (ca, cb) = (admin(A, "127.0.0.1"), admin(B, "127.0.0.2"));
    let mut io = Vec::new();
    for qid in 1..=4u16 {
        for (c, host, src) in [(&ca, A, "127.0.0.1"), (&cb, B, "127.0.0.2")] {
            let mut o = QueueOpts::io(NQN, host, qid, c.cntlid, 32);
            o.source = Some(src.parse::<IpAddr>().unwrap());
            io.push(HostQueue::connect(addr(&t), o).unwrap());
        }
    }
    for host in [A, B] {
        let rs = io_reactors(&ctx, host);
        assert_eq!(rs.len(), 4, "{host}: {rs:?}");
        let on0 = rs.iter().filter(|&&r| r == 0).count();
        assert_eq!(on0, 2, "{host}'s I/O queues not spread over the two reactors: {rs:?}");
    }
    // Five queues each: 10 connections, 2 controllers, 8 I/O queues over the reactors.
    let q = queues(&ctx, |q| q.iter().map(|x| x.2).sum::<u64>() == 8);
    assert_eq!(q.iter().map(|x| x.0).sum::<u64>(), 10, "{q:?}");
    assert_eq!(q.iter().map(|x| x.1).sum::<u64>(), 2, "{q:?}");
    assert!(q.iter().all(|x| x.0 == 5), "connections not even: {q:?}");
    drop((ca, cb, io));
    let q = queues(&ctx, |q| q.iter().all(|x| *x == (0, 0, 0)));
    assert!(
        q.iter().all(|x| *x == (0, 0, 0)),
        "counts left after the hosts went: {q:?}"
    );
}

#[test]
fn one_host_after_another_spreads_too() {
    let (t, ctx) = start_with_ctx(&conf(""));
    let mut hosts = Vec::new();
    for (host, src) in [(A, "127.0.0.3"), (B, "127.0.0.3")] {
        hosts.push(connect_from(&t, host, src, 2));
    }
    for host in [A, B] {
        let mut rs = io_reactors(&ctx, host);
        rs.sort();
        assert_eq!(rs, vec![0, 1], "{host}");
    }
}

#[test]
fn a_host_asking_for_127_queues_is_granted_what_is_useful_and_uses_them_all() {
    let (t, _ctx) = start_with_ctx(&conf(""));
    let mut c = connect_from(&t, A, "127.0.0.1", 127);
    // Two reactors: 4 each (at least 8).
    assert_eq!(c.io.len(), 8);
    let granted = c.admin.set_num_queues(127).unwrap();
    assert_eq!((granted.sq, granted.cq), (8, 8));
    for (i, q) in c.io.iter_mut().enumerate() {
        let lba = i as u64 * 8;
        let data = pattern(i as u64, lba, 4096);
        q.write(1, lba, 8, &data).unwrap();
        let mut back = vec![0u8; 4096];
        q.read(1, lba, 8, &mut back).unwrap();
        assert!(back == data, "queue {}", i + 1);
    }
    // The conf's limit wins when set.
    let (t, _ctx) = start_with_ctx(&conf("[transport]\nmax_io_queues = 127"));
    let c = connect_from(&t, A, "127.0.0.1", 127);
    assert_eq!(c.io.len(), 127);
}
