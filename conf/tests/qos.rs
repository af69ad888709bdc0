//! A namespace's `qos`: its limits (iops, mbps, read_mbps, write_mbps), each a positive
//! integer; anything else refused at its place.

use pollux_conf::{Config, Qos};

/// A subsystem with one namespace (its header on line 8, `nsid` line 9); tests append keys
/// to the namespace from line 10.
const BASE: &str = "[reactors]\ncores = [0]\n[[listener]]\naddress = \"127.0.0.1:4420\"\n[[subsystem]]\nnqn = \"nqn.2026-11.io.pollux:a\"\nallow_any_host = true\n[[subsystem.namespace]]\nnsid = 1\nbackend = { ram = { size = \"1MiB\" } }\n";

fn parse(text: &str) -> Config {
    Config::parse(text, "test.toml").unwrap_or_else(|e| panic!("{e}\n{text}"))
}

fn refused(text: &str) -> pollux_conf::ConfError {
    match Config::parse(text, "test.toml") {
        Ok(_) => panic!("parsed:\n{text}"),
        Err(e) => e,
    }
}

#[test]
fn absent_or_empty_is_unlimited_and_not_emitted() {
    for text in [BASE.to_string(), format!("{BASE}qos = {{}}\n")] {
        let c = parse(&text);
        assert!(c.subsystems[0].namespaces[0].qos.is_unlimited());
        let out = c.to_toml();
        assert!(!out.contains("qos"), "{out}");
        assert_eq!(parse(&out), c);
    }
}

#[test]
fn any_subset_is_kept_and_round_trips() {
    let cases = [
        (
            "qos = { iops = 1000 }",
            Qos {
                iops: Some(1000),
                ..Qos::default()
            },
        ),
        (
            "qos = { mbps = 100, read_mbps = 80 }",
            Qos {
                mbps: Some(100),
                read_mbps: Some(80),
                ..Qos::default()
            },
        ),
        (
            "qos = { iops = 5000, mbps = 200, read_mbps = 150, write_mbps = 50 }",
            Qos {
                iops: Some(5000),
                mbps: Some(200),
                read_mbps: Some(150),
                write_mbps: Some(50),
            },
        ),
        (
            "qos = { write_mbps = 4294967295 }",
            Qos {
                write_mbps: Some(u64::from(u32::MAX)),
                ..Qos::default()
            },
        ),
    ];
    for (line, want) in cases {
        let c = parse(&format!("{BASE}{line}\n"));
        assert_eq!(c.subsystems[0].namespaces[0].qos, want, "{line}");
        let out = c.to_toml();
        assert_eq!(out.matches("qos = {").count(), 1, "{out}");
        assert_eq!(parse(&out), c, "{out}");
    }
}

#[test]
fn a_table_header_works_as_well_as_an_inline_table() {
    let c = parse(&format!("{BASE}[subsystem.namespace.qos]\niops = 10\nwrite_mbps = 2\n"));
    let q = c.subsystems[0].namespaces[0].qos;
    assert_eq!((q.iops, q.mbps, q.write_mbps), (Some(10), None, Some(2)));
}

#[test]
fn zero_negative_and_too_large_values_are_refused_at_their_place() {
    for (value, key) in [
        ("iops = 0", "iops"),
        ("mbps = -5", "mbps"),
        ("read_mbps = 4294967296", "read_mbps"),
    ] {
        let e = refused(&format!("{BASE}qos = {{ {value} }}\n"));
        assert_eq!(e.line(), Some(11), "{e}");
        // The column of the value, after `qos = { KEY = `.
        assert_eq!(e.column(), Some(8 + key.len() + 3 + 1), "{e}");
        assert!(
            e.message().contains(&format!("`qos.{key}` must be a positive number")),
            "{e}"
        );
        assert!(e.message().contains("leave the key out for no limit"), "{e}");
    }
}

#[test]
fn non_integers_and_unknown_keys_are_refused_at_their_line() {
    for (value, says) in [
        ("iops = 1.5", "invalid type"),
        ("mbps = \"100\"", "invalid type"),
        ("iops = true", "invalid type"),
        ("bps = 100", "unknown key `bps`"),
        (
            "riops = 100",
            "expected one of `iops`, `mbps`, `read_mbps`, `write_mbps`",
        ),
    ] {
        let e = refused(&format!("{BASE}qos = {{ {value} }}\n"));
        assert_eq!(e.line(), Some(11), "{value}: {e}");
        assert!(e.message().contains(says), "{value}: {e}");
    }
    // Not a table at all.
    let e = refused(&format!("{BASE}qos = 1000\n"));
    assert_eq!(e.line(), Some(11), "{e}");
}

#[test]
fn limits_differ_per_namespace() {
    let text = format!(
        "{BASE}qos = {{ iops = 100 }}\n[[subsystem.namespace]]\nnsid = 2\nbackend = {{ ram = {{ size = \"1MiB\" }} }}\n"
    );
    let c = parse(&text);
    let ns = &c.subsystems[0].namespaces;
    assert_eq!(ns[0].qos.iops, Some(100));
    assert!(ns[1].qos.is_unlimited());
    assert_eq!(ns[0].qos.entries(), vec![("iops", 100)]);
}
