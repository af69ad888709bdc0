//! A subsystem's `listeners`: which listeners serve it (SPDK's `nvmf_subsystem_add_listener`,
//! nvmet's port-to-subsystem links).

use std::net::SocketAddr;

use pollux_conf::Config;

/// Two listeners (lines 3-6), then a subsystem header and NQN (lines 7-9); tests append the
/// `listeners` key as line 10.
const BASE: &str = "[reactors]\ncores = [0]\n[[listener]]\naddress = \"127.0.0.1:4420\"\n[[listener]]\naddress = \"[::1]:4421\"\n[[subsystem]]\nnqn = \"nqn.2026-11.io.pollux:a\"\nallow_any_host = true\n";

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
}

#[test]
fn absent_means_every_listener() {
    let c = Config::parse(BASE, "test.toml").expect("BASE");
    let s = &c.subsystems[0];
    assert_eq!(s.listeners, None);
    assert!(s.served_on(addr("127.0.0.1:4420")) && s.served_on(addr("[::1]:4421")));
    assert!(!c.to_toml().contains("listeners"), "{}", c.to_toml());
}

#[test]
fn named_listeners_serve_it_and_round_trip() {
    let text = format!("{BASE}listeners = [\"[::1]:4421\"]\n");
    let c = Config::parse(&text, "test.toml").expect("valid");
    let s = &c.subsystems[0];
    assert_eq!(s.listeners, Some(vec![addr("[::1]:4421")]));
    assert!(s.served_on(addr("[::1]:4421")));
    assert!(!s.served_on(addr("127.0.0.1:4420")));
    let back = Config::parse(&c.to_toml(), "test.toml").expect("emitted conf parses");
    assert_eq!(back, c, "{}", c.to_toml());
}

#[test]
fn empty_means_no_listener_yet() {
    // SPDK's subsystem between nvmf_create_subsystem and nvmf_subsystem_add_listener.
    let text = format!("{BASE}listeners = []\n");
    let c = Config::parse(&text, "test.toml").expect("valid");
    let s = &c.subsystems[0];
    assert_eq!(s.listeners, Some(vec![]));
    assert!(!s.served_on(addr("127.0.0.1:4420")) && !s.served_on(addr("[::1]:4421")));
    let back = Config::parse(&c.to_toml(), "test.toml").expect("emitted conf parses");
    assert_eq!(back, c, "{}", c.to_toml());
}

#[track_caller]
fn assert_err(listeners: &str, col: usize, needle: &str) {
    let text = format!("{BASE}listeners = {listeners}\n");
    match Config::parse(&text, "test.toml") {
        Ok(_) => panic!("parsed, expected an error for listeners = {listeners}"),
        Err(e) => {
            assert_eq!((e.line(), e.column()), (Some(10), Some(col)), "{e}");
            assert!(e.message().contains(needle), "{e} lacks {needle:?}");
        }
    }
}

#[test]
fn each_must_be_a_configured_listener_once() {
    assert_err(
        "[\"127.0.0.1:4420\", \"10.0.0.1:4420\"]",
        32,
        "names 10.0.0.1:4420, which is not a [[listener]] address of this conf (they are \"127.0.0.1:4420\", \"[::1]:4421\")",
    );
    assert_err("[\"localhost:4420\"]", 14, "not of the form");
    assert_err(
        "[\"127.0.0.1:4420\", \"127.0.0.1:4420\"]",
        32,
        "listener address 127.0.0.1:4420 is already listed on line 10",
    );
    assert_err("\"127.0.0.1:4420\"", 13, "");
}
