//! Asymmetric Namespace Access (NVMe 2.0 §8.1.3) with the host library: Identify reports
//! ANA, the ANA log page gives each group's state on the controller's own listener (port),
//! `set_ana_state` changes a state at run time with an ANA change event to the controllers
//! of that listener, I/O on an inaccessible, lost or transitioning path completes with the
//! path status (no DNR: the host retries on another path) while other paths and groups go
//! on, and bad requests change nothing. The Linux host's multipath over the same is the
//! guest scenario `pollux-multipath`.
#![allow(clippy::unwrap_used)]

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use pollux_host::{Controller, Data, Digests, sqe};
use pollux_nvme::spec::Status;
use pollux_target::Target;
use pollux_target::control::rpc::Ctx;
use serde_json::json;

const SUB: &str = "nqn.2026-11.io.pollux:ana";

/// Listener A (all optimized) and B (group 1 non-optimized); namespace 1 in group 1,
/// namespace 2 in group 2.
fn start_ana() -> (Target, Ctx, [SocketAddr; 2]) {
    let text = format!(
        r#"
[reactors]
cores = [0, 1]
mode = "interrupt"

[[listener]]
address = "127.0.0.1:0"

[[listener]]
address = "127.0.0.2:0"
ana = {{ 1 = "non-optimized" }}

[[subsystem]]
nqn = "{SUB}"
allow_any_host = true

[[subsystem.namespace]]
nsid = 1
backend = {{ ram = {{ size = "4MiB" }} }}

[[subsystem.namespace]]
nsid = 2
ana_group = 2
backend = {{ ram = {{ size = "4MiB" }} }}
"#
    );
    let (t, ctx) = start_with_ctx(&text);
    let a = t.listen_addrs();
    (t, ctx, [a[0], a[1]])
}

/// (group, state code, NSIDs) of each descriptor, and the change count.
fn ana_log(c: &mut Controller, rgo: bool) -> (u64, Vec<(u32, u8, Vec<u32>)>) {
    let page = if rgo {
        // LSP bit 0 (RGO) in CDW10 bits 11:8.
        let mut s = sqe::get_log_page(0x0C, 4096, 0, false);
        s.cdw10.set(s.cdw10.get() | 1 << 8);
        c.admin.exec_ok(s, Data::FromCtrl(vec![0u8; 4096])).unwrap().buf
    } else {
        c.admin.get_log_page(0x0C, 0, 4096).unwrap()
    };
    let le32 = |b: &[u8]| u32::from_le_bytes(b[..4].try_into().unwrap());
    let chgcnt = u64::from_le_bytes(page[0..8].try_into().unwrap());
    let n = u16::from_le_bytes(page[8..10].try_into().unwrap());
    let mut at = 16;
    let mut groups = Vec::new();
    for _ in 0..n {
        let d = &page[at..at + 32];
        let nn = le32(&d[4..]) as usize;
        let nsids = (0..nn).map(|i| le32(&page[at + 32 + 4 * i..])).collect();
        groups.push((le32(d), d[16], nsids));
        at += 32 + 4 * nn;
    }
    (chgcnt, groups)
}

fn io_status(c: &mut Controller, nsid: u32) -> Option<Status> {
    let mut buf = vec![0u8; 4096];
    c.io[0]
        .read(nsid, 0, 8, &mut buf)
        .err()
        .map(|e| e.status().unwrap_or_else(|| panic!("{e}")))
}

/// Wait for the AER `cid` to complete: its dword 0.
fn aer_dw0(c: &mut Controller, cid: u16) -> Option<u32> {
    let mut got = None;
    let t0 = Instant::now();
    while got.is_none() && t0.elapsed() < Duration::from_secs(5) {
        c.admin
            .poll_completions(Some(Duration::from_millis(100)), |done| {
                if done.cid == cid {
                    got = Some(done.dw0);
                }
            })
            .unwrap();
    }
    got
}

#[test]
fn identify_and_the_ana_log_report_each_listeners_states() {
    let (t, ctx, [a, b]) = start_ana();
    let mut ca = Controller::connect(a, SUB, HOST, 1, 32, Digests::NONE).unwrap();
    let id = ca.admin.identify(1, 0).unwrap();
    assert_eq!(
        id[76] & 0b1011,
        0b1011,
        "CMIC: multi-port, multi-controller, ANA reporting"
    );
    assert_eq!(id[342], 10, "ANATT");
    assert_eq!(id[343], 0x5F, "ANACAP: every state, ANAGRPID fixed while attached");
    assert_eq!(&id[344..348], &128u32.to_le_bytes(), "ANAGRPMAX");
    assert_eq!(&id[348..352], &128u32.to_le_bytes(), "NANAGRPID");
    assert_ne!(u32::from_le_bytes(id[540..544].try_into().unwrap()), 0, "MNAN");
    assert_ne!(
        u32::from_le_bytes(id[92..96].try_into().unwrap()) & (1 << 11),
        0,
        "OAES ANA change"
    );
    let ns2 = ca.admin.identify(0, 2).unwrap();
    assert_eq!(&ns2[92..96], &2u32.to_le_bytes(), "ANAGRPID of namespace 2");

    let (_, groups) = ana_log(&mut ca, false);
    assert_eq!(groups, vec![(1, 0x01, vec![1]), (2, 0x01, vec![2])]);
    let (_, groups) = ana_log(&mut ca, true);
    assert_eq!(groups, vec![(1, 0x01, vec![]), (2, 0x01, vec![])], "RGO: groups only");

    let mut cb = Controller::connect(b, SUB, HOST, 1, 32, Digests::NONE).unwrap();
    let (_, groups) = ana_log(&mut cb, false);
    assert_eq!(
        groups,
        vec![(1, 0x02, vec![1]), (2, 0x01, vec![2])],
        "non-optimized on B"
    );
    assert_eq!(io_status(&mut cb, 1), None, "I/O runs on a non-optimized path");
    let subs = ctx.call("subsystems", &serde_json::Value::Null).unwrap().to_string();
    assert!(subs.contains("ana 1:non-optimized,2:optimized"), "{subs}");
    drop(ctx);
    t.shutdown().unwrap();
}

#[test]
fn a_state_change_raises_the_event_and_moves_io_off_the_path() {
    let (t, ctx, [a, b]) = start_ana();
    let mut ca = Controller::connect(a, SUB, HOST, 1, 32, Digests::NONE).unwrap();
    let mut cb = Controller::connect(b, SUB, HOST, 1, 32, Digests::NONE).unwrap();
    for c in [&mut ca, &mut cb] {
        c.admin.set_features(0x0B, 1 << 11).unwrap(); // ANA change notices, as Linux enables
    }
    let aer_b = cb.admin.submit(sqe::async_event_request(), Data::None, 7).unwrap();
    let aer_a = ca.admin.submit(sqe::async_event_request(), Data::None, 7).unwrap();
    let (before, _) = ana_log(&mut cb, false);

    for (state, status) in [
        ("inaccessible", Status::ANA_INACCESSIBLE),
        ("persistent-loss", Status::ANA_PERSISTENT_LOSS),
        ("change", Status::ANA_TRANSITION),
    ] {
        let r = ctx
            .call(
                "set_ana_state",
                &json!({"listener": b.to_string(), "group": 1, "state": state}),
            )
            .unwrap();
        assert_eq!(r["ana_changed"], json!([b.to_string()]), "{r}");
        if state == "inaccessible" {
            // Notice, ANA change (03h), log page 0Ch, to B's controller only.
            assert_eq!(aer_dw0(&mut cb, aer_b), Some(0x000C_0302));
        }
        let (chg, groups) = ana_log(&mut cb, false);
        assert!(chg > before, "the change count moved on");
        assert_eq!(groups[0].1, pollux_conf::AnaState::from_name(state).unwrap().code());
        let s = io_status(&mut cb, 1).unwrap_or_else(|| panic!("I/O ran on a {state} path"));
        assert_eq!(
            (s.sct(), s.sc(), s.dnr()),
            (status.sct(), status.sc(), false),
            "{state}"
        );
        // The other group on B, and every group on A, still serve.
        assert_eq!(io_status(&mut cb, 2), None);
        assert_eq!(io_status(&mut ca, 1), None);
    }
    // A's controller heard nothing: its path did not change.
    let mut none = None;
    ca.admin
        .poll_completions(Some(Duration::from_millis(300)), |d| {
            if d.cid == aer_a {
                none = Some(d.dw0);
            }
        })
        .unwrap();
    assert_eq!(none, None, "no ANA event for a listener whose states did not change");

    // Back to optimized: I/O runs again; after the log was read the next change notifies.
    let aer_b = cb.admin.submit(sqe::async_event_request(), Data::None, 8).unwrap();
    ctx.call(
        "set_ana_state",
        &json!({"listener": b.to_string(), "group": 1, "state": "optimized"}),
    )
    .unwrap();
    assert_eq!(aer_dw0(&mut cb, aer_b), Some(0x000C_0302));
    assert_eq!(io_status(&mut cb, 1), None);
    // The running conf keeps it (`ctl save` writes what runs).
    assert!(!t.running_config().contains("inaccessible"));
    drop(ctx);
    t.shutdown().unwrap();
}

#[test]
fn bad_state_changes_are_refused_and_change_nothing() {
    let (t, ctx, [_, b]) = start_ana();
    let before = t.running_config();
    for (params, needle) in [
        (
            json!({"listener": b.to_string(), "group": 0, "state": "inaccessible"}),
            "1 to 128",
        ),
        (
            json!({"listener": b.to_string(), "group": 129, "state": "inaccessible"}),
            "1 to 128",
        ),
        (
            json!({"listener": b.to_string(), "group": 1, "state": "down"}),
            "unknown ANA state",
        ),
        (
            json!({"listener": "10.9.9.9:4420", "group": 1, "state": "inaccessible"}),
            "no listener",
        ),
        (json!({"group": 1, "state": "inaccessible"}), "listener"),
    ] {
        let e = ctx.call("set_ana_state", &params).unwrap_err();
        assert!(format!("{e:?}").contains(needle), "{params}: {e:?}");
    }
    assert_eq!(t.running_config(), before);
    drop(ctx);
    t.shutdown().unwrap();
}
