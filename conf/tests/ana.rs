//! ANA in the conf: a namespace's `ana_group` and a listener's `ana` states, their
//! defaults, what is refused (with the position), and `to_toml` writing them back.

use pollux_conf::{AnaState, Config};

fn conf(listener: &str, ns: &str) -> String {
    format!(
        "[reactors]\ncores = [0]\n[[listener]]\naddress = \"127.0.0.1:4420\"\n{listener}\n\
         [[subsystem]]\nnqn = \"nqn.2026-11.io.pollux:a\"\nallow_any_host = true\n\
         [[subsystem.namespace]]\nnsid = 1\n{ns}\nbackend = {{ ram = {{ size = \"1MiB\" }} }}\n"
    )
}

#[test]
fn groups_and_states_are_read_and_written_back() {
    let c = Config::parse(&conf("", ""), "t.toml").expect("valid");
    assert_eq!(c.subsystems[0].namespaces[0].ana_group, 1, "default group");
    assert!(c.listeners[0].ana.is_empty(), "every group optimized by default");
    let text = conf(
        "ana = { 1 = \"optimized\", 2 = \"inaccessible\", 7 = \"change\" }",
        "ana_group = 2",
    );
    let c = Config::parse(&text, "t.toml").expect("valid");
    let l = &c.listeners[0];
    assert_eq!(l.ana_state(1), AnaState::Optimized);
    assert_eq!(l.ana_state(2), AnaState::Inaccessible);
    assert_eq!(l.ana_state(7), AnaState::Change);
    assert_eq!(l.ana.len(), 2, "optimized entries are the default, not kept");
    assert_eq!(c.subsystems[0].namespaces[0].ana_group, 2);
    let back = Config::parse(&c.to_toml(), "t.toml").expect("round trip");
    assert_eq!(back.listeners, c.listeners);
    assert_eq!(back.subsystems, c.subsystems);
}

#[test]
fn bad_groups_and_states_are_refused_with_the_reason() {
    for (text, line, needle) in [
        (conf("", "ana_group = 0"), 11, "1 to 128"),
        (conf("", "ana_group = 129"), 11, "1 to 128"),
        (conf("ana = { 0 = \"optimized\" }", ""), 5, "not an ANA group id"),
        (conf("ana = { x = \"optimized\" }", ""), 5, "not an ANA group id"),
        (conf("ana = { 2 = \"down\" }", ""), 5, "unknown ANA state"),
    ] {
        let e = Config::parse(&text, "t.toml").expect_err("parsed");
        assert_eq!(e.line(), Some(line), "{e}");
        assert!(e.message().contains(needle), "{e} lacks {needle:?}");
    }
}
