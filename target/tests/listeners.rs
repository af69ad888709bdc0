//! Which listeners serve which subsystem (a subsystem's `listeners`, SPDK's
//! `nvmf_subsystem_add_listener`, nvmet's port-to-subsystem links): the discovery log lists a
//! subsystem only on the listeners that serve it (NVMe-oF 1.1 §5.3), a Connect through
//! another listener is refused, and a run-time change that takes a listener away from a
//! subsystem disconnects that subsystem's controllers on it. Also: a Connect to a subsystem
//! that does not exist is refused without DNR (as SPDK does), so that a host retries while an
//! operator re-adds it.
#![allow(clippy::unwrap_used)]

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use pollux_conf::{Config, DISCOVERY_NQN};
use pollux_host::{Controller, Digests, HostError, HostQueue, QueueOpts};

/// Listeners on 127.0.0.1 and 127.0.0.2; [`NQN`] (any host) served on `listeners` (a TOML
/// line, or nothing for every listener), [`NQN_PRIVATE`] (only [`OTHER_HOST`]) on every one.
fn two_listeners(listeners: &str) -> String {
    format!(
        r#"
[reactors]
cores = [0, 1]
mode = "interrupt"

[[listener]]
address = "127.0.0.1:0"

[[listener]]
address = "127.0.0.2:0"

[[subsystem]]
nqn = "{NQN}"
allow_any_host = true
{listeners}

[[subsystem.namespace]]
nsid = 1
backend = {{ ram = {{ size = "16MiB" }} }}

[[subsystem]]
nqn = "{NQN_PRIVATE}"
hosts = ["{OTHER_HOST}"]

[[subsystem.namespace]]
nsid = 1
backend = {{ ram = {{ size = "16MiB" }} }}
"#
    )
}

/// The Connect was refused with Connect Invalid Parameters (SCT 1, SC 82h) at the Connect
/// data's SUBNQN (IATTR 1, IPO 256), and without DNR: the host may retry.
#[track_caller]
fn refused_at_subnqn_without_dnr(r: Result<HostQueue, HostError>) {
    match r {
        Err(HostError::ConnectRefused { status, dw0 }) => {
            assert_eq!(code(status), (1, 0x82), "{status:?}");
            assert_eq!(dw0, (1 << 16) | 256, "dw0 {dw0:#x}");
            assert!(!status.dnr(), "DNR set: {status:?}");
        }
        Err(e) => panic!("expected a refused Connect, got {e}"),
        Ok(_) => panic!("expected a refused Connect, it succeeded"),
    }
}

/// The subsystems the discovery log read through `at` lists, with the listener of each entry.
fn discovered(at: SocketAddr, host: &str) -> Vec<(String, SocketAddr)> {
    let mut d = HostQueue::connect(at, QueueOpts::admin(DISCOVERY_NQN, host)).unwrap();
    d.enable().unwrap();
    let log = d.discovery_log().unwrap();
    let mut out: Vec<(String, SocketAddr)> = log
        .entries
        .iter()
        .filter(|e| e.subtype == 2)
        .map(|e| {
            let a = format!("{}:{}", e.traddr, e.trsvcid).parse().unwrap();
            (e.subnqn.clone(), a)
        })
        .collect();
    out.sort();
    out
}

#[test]
fn a_connect_to_an_unknown_subsystem_may_be_retried_but_a_host_not_allowed_may_not() {
    let t = start("");
    let a = addr(&t);
    refused_at_subnqn_without_dnr(HostQueue::connect(
        a,
        QueueOpts::admin("nqn.2026-11.io.pollux:not-yet", HOST),
    ));
    // A host the subsystem does not allow is a permanent refusal: Invalid Host, DNR.
    match HostQueue::connect(a, QueueOpts::admin(NQN_PRIVATE, HOST)) {
        Err(HostError::ConnectRefused { status, .. }) => {
            assert_eq!(code(status), (1, 0x84), "{status:?}");
            assert!(status.dnr(), "{status:?}");
        }
        other => panic!("expected Connect Invalid Host, got {:?}", other.err()),
    }
    t.shutdown().unwrap();
}

#[test]
fn a_subsystem_is_discovered_and_reached_only_on_its_listeners() {
    let t = start_text(&two_listeners("listeners = [\"127.0.0.2:0\"]"));
    let [one, two] = t.listen_addrs()[..] else {
        panic!("two listeners: {:?}", t.listen_addrs())
    };
    for at in [one, two] {
        // The discovery controller is on every listener; the log lists NQN on `two` only,
        // and NQN_PRIVATE (for its host) on both.
        assert_eq!(discovered(at, HOST), vec![(NQN.to_string(), two)], "through {at}");
        let mut want = vec![
            (NQN.to_string(), two),
            (NQN_PRIVATE.to_string(), one),
            (NQN_PRIVATE.to_string(), two),
        ];
        want.sort();
        assert_eq!(discovered(at, OTHER_HOST), want, "through {at}");
    }
    refused_at_subnqn_without_dnr(HostQueue::connect(one, QueueOpts::admin(NQN, HOST)));
    let mut c = Controller::connect(two, NQN, HOST, 1, 32, Digests::NONE).unwrap();
    c.io[0].write(1, 0, 1, &[7u8; 512]).unwrap();
    // An I/O queue of that controller through the other listener is refused too.
    refused_at_subnqn_without_dnr(HostQueue::connect(one, QueueOpts::io(NQN, HOST, 2, c.cntlid, 32)));
    Controller::connect(one, NQN_PRIVATE, OTHER_HOST, 1, 32, Digests::NONE).unwrap();
    t.shutdown().unwrap();
}

#[test]
fn taking_a_listener_from_a_subsystem_disconnects_its_controllers_there_only() {
    let text = two_listeners("");
    let t = start_text(&text);
    let [one, two] = t.listen_addrs()[..] else {
        panic!("two listeners: {:?}", t.listen_addrs())
    };
    let mut stays = Controller::connect(one, NQN, HOST, 1, 32, Digests::NONE).unwrap();
    let mut goes = Controller::connect(two, NQN, HOST, 1, 32, Digests::NONE).unwrap();
    let mut other = Controller::connect(two, NQN_PRIVATE, OTHER_HOST, 1, 32, Digests::NONE).unwrap();
    let data = vec![9u8; 512];
    goes.io[0].write(1, 0, 1, &data).unwrap();
    let genctr = {
        let mut d = HostQueue::connect(one, QueueOpts::admin(DISCOVERY_NQN, HOST)).unwrap();
        d.enable().unwrap();
        d.discovery_log().unwrap().genctr
    };

    let mut cfg = Config::parse(&text, "test.toml").unwrap();
    cfg.subsystems[0].listeners = Some(vec![cfg.listeners[0].address]);
    let ch = t.apply(cfg).unwrap();
    assert_eq!(ch.changed_subsystems, vec![NQN.to_string()]);
    std::thread::sleep(Duration::from_millis(300));

    let r = goes.io[0].write(1, 0, 1, &data);
    assert!(
        matches!(r, Err(HostError::Closed | HostError::Io(_) | HostError::Timeout { .. })),
        "the controller through the listener taken away still serves: {r:?}"
    );
    stays.io[0].write(1, 0, 1, &data).unwrap();
    other.io[0].write(1, 0, 1, &data).unwrap();
    refused_at_subnqn_without_dnr(HostQueue::connect(two, QueueOpts::admin(NQN, HOST)));
    assert_eq!(discovered(two, HOST), vec![(NQN.to_string(), one)]);
    let mut d = HostQueue::connect(one, QueueOpts::admin(DISCOVERY_NQN, HOST)).unwrap();
    d.enable().unwrap();
    assert!(d.discovery_log().unwrap().genctr > genctr, "GENCTR unchanged");
    t.shutdown().unwrap();
}

#[test]
fn a_discovery_filter_lists_only_the_listeners_that_match_the_one_a_host_came_through() {
    // SPDK's discovery_filter; "address,svcid" is Linux nvmet's discovery log (the subsystems
    // of the host's port only), which `pollux --nvmet-config` serves.
    for (filter, through_one_sees_two) in [("match_any", true), ("address", false), ("address,svcid", false)] {
        let t = start_text(&format!("{}\n[discovery]\nfilter = \"{filter}\"\n", two_listeners("")));
        let [one, two] = t.listen_addrs()[..] else {
            panic!("two listeners: {:?}", t.listen_addrs())
        };
        let mut want = vec![(NQN.to_string(), one)];
        if through_one_sees_two {
            want.push((NQN.to_string(), two));
        }
        assert_eq!(discovered(one, HOST), want, "filter {filter} through {one}");
        t.shutdown().unwrap();
    }
    // Only the same port: a listener on another port of the same address is not listed.
    let free = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let text = two_listeners("").replace("127.0.0.2:0", &free.to_string());
    let t = start_text(&format!("{text}\n[discovery]\nfilter = \"svcid\"\n"));
    let one = t.listen_addrs()[0];
    assert_eq!(discovered(one, HOST), vec![(NQN.to_string(), one)]);
    t.shutdown().unwrap();
    let bad = pollux_conf::Config::parse(&format!("{text}\n[discovery]\nfilter = \"port\"\n"), "bad.toml")
        .expect_err("an unknown filter");
    assert!(bad.to_string().contains("match_any"), "{bad}");
}
