//! The `null` backend (writes discarded, reads zeroes): its keys, checks and emission.

use std::path::Path;

use pollux_conf::{Backend, Config};

const HEAD: &str = r#"
[reactors]
cores = [0]

[[listener]]
address = "127.0.0.1:4420"

[[subsystem]]
nqn = "nqn.2026-11.io.pollux:null"
allow_any_host = true

[[subsystem.namespace]]
nsid = 1
block_size = 4096
"#;

fn parse(backend: &str) -> Result<Config, pollux_conf::ConfError> {
    Config::parse(&format!("{HEAD}backend = {backend}\n"), "test.toml")
}

#[test]
fn a_null_namespace_has_a_size_and_round_trips() {
    let c = parse(r#"{ null = { size = "1TiB" } }"#).unwrap_or_else(|e| panic!("{e}"));
    let b = &c.subsystems[0].namespaces[0].backend;
    assert_eq!(*b, Backend::Null { size: 1 << 40 });
    assert_eq!(b.kind(), "null");
    let text = c.to_toml();
    assert!(text.contains(r#"backend = { null = { size = "1TiB" } }"#), "{text}");
    let back = Config::parse(&text, &c.origin).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(back, c);
}

#[test]
fn a_null_size_is_checked_as_a_ram_one() {
    let cases = [
        (r#"{ null = { size = 0 } }"#, "null `size` must be greater than 0"),
        (
            r#"{ null = { size = 6144 } }"#,
            "null `size` 6144 bytes is not a multiple of block_size 4096",
        ),
        (r#"{ null = { size = "1.5GiB" } }"#, "size"),
        (
            r#"{ null = { size = "1GiB", latency_us = 5 } }"#,
            "unknown key `latency_us`",
        ),
        (r#"{ null = {} }"#, "missing key `size`"),
        (
            r#"{ ram = { size = "1GiB" }, null = { size = "1GiB" } }"#,
            "namespace 1 has two backends, `ram` and `null`",
        ),
        (r#"{ nul = { size = "1GiB" } }"#, "`null`"),
    ];
    for (backend, needle) in cases {
        match parse(backend) {
            Ok(_) => panic!("{backend} accepted"),
            Err(e) => assert!(e.to_string().contains(needle), "{backend}: {e} lacks {needle:?}"),
        }
    }
}

#[test]
fn the_null_example_is_a_null_namespace() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/null.toml");
    let c = Config::from_path(&path).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.subsystems[0].namespaces[0].backend, Backend::Null { size: 1 << 40 });
}
