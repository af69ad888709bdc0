//! `to_toml` round trips, small API behaviours, and fuzzing of the parser.

use std::path::Path;

use pollux_conf::{Backend, Config, KeepAlive, Placement, ReactorMode, Transport, parse_size, validate_nqn};
use proptest::prelude::*;

#[track_caller]
fn round_trip(c: &Config) {
    let text = c.to_toml();
    match Config::parse(&text, &c.origin) {
        Ok(back) => assert_eq!(&back, c, "round trip changed the config:\n{text}"),
        Err(e) => panic!("to_toml output does not parse: {e}\n{text}"),
    }
}

#[test]
fn examples_round_trip() {
    round_trip(&Config::embedded_default());
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    for entry in std::fs::read_dir(dir).expect("examples") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "toml") {
            round_trip(&Config::from_path(&path).unwrap_or_else(|e| panic!("{e}")));
        }
    }
}

#[test]
fn awkward_strings_round_trip() {
    let text = r#"
[reactors]
cores = [3, 1, 2]
mode = "poll"
stall_threshold_us = 1
placement = "least-loaded"

[[listener]]
address = "[fe80::1%2]:4420"

[[listener]]
address = "0.0.0.0:0"

[transport]
io_queue_depth = 65536
max_io_queues = 1
in_capsule_data_size = "128KiB"
max_io_size = 2147483648
max_h2c_data = 4294967292

[keep_alive]
min_ms = 0
max_ms = 4294967295

[[subsystem]]
nqn = 'nqn.2026-11.io.pollux:"quoted" \back\ ünï # [x]'
serial = 'S"\ 1'
model = "  padded model  "
hosts = ["nqn.2026-11.io.pollux:h'1", "nqn.2014-08.org.nvmexpress:uuid:F81D4FAE-7DEC-11D0-A765-00A0C91E6BF6"]

[[subsystem.namespace]]
nsid = 4294967294
block_size = 4096
backend = { ram = { size = 1073745920 } }
"#;
    let c = Config::parse(text, "awkward.toml").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        c.subsystems[0].nqn,
        r#"nqn.2026-11.io.pollux:"quoted" \back\ ünï # [x]"#
    );
    assert_eq!(c.transport.max_io_size, 1 << 31);
    assert_eq!(c.transport.mdts(), 19);
    round_trip(&c);
}

#[test]
fn hand_built_config_round_trips() {
    let mut c = Config::embedded_default();
    c.origin = "hand".into();
    c.reactors.cores = vec![5, 4];
    c.reactors.mode = ReactorMode::Hybrid;
    c.transport.io_queue_depth = 32;
    c.keep_alive = KeepAlive { min_ms: 10, max_ms: 20 };
    c.subsystems[0].namespaces[0].backend = Backend::Ram { size: 1536 << 20 };
    c.subsystems[0].namespaces[0].uuid[0] ^= 0xff;
    round_trip(&c);
}

#[test]
fn defaults_when_optional_keys_are_absent() {
    let c = Config::parse(
        "[reactors]\ncores = [0]\n[[listener]]\naddress = \"127.0.0.1:4420\"\n\
         [[subsystem]]\nnqn = \"nqn.2026-11.io.pollux:a\"\nhosts = [\"nqn.2026-11.io.pollux:h\"]\n\
         [[subsystem.namespace]]\nnsid = 1\nbackend = { ram = { size = 4096 } }\n",
        "min.toml",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.reactors.mode, ReactorMode::Interrupt);
    assert_eq!(c.reactors.stall_threshold_us, 2000);
    assert_eq!(c.reactors.placement, Placement::RoundRobin);
    assert_eq!(
        c.transport,
        Transport {
            io_queue_depth: 128,
            max_io_queues: 128,
            in_capsule_data_size: 8192,
            max_io_size: 131072,
            max_h2c_data: 131072,
        }
    );
    assert_eq!(c.transport.mdts(), 5);
    assert_eq!(
        c.keep_alive,
        KeepAlive {
            min_ms: 1000,
            max_ms: 300_000
        }
    );
    let s = &c.subsystems[0];
    assert!(!s.allow_any_host);
    assert_eq!(s.model, "pollux");
    assert_eq!(s.serial.len(), 20);
    assert_eq!(s.namespaces[0].block_size, 512);
}

#[test]
fn no_subsystems_is_discovery_only() {
    let c = Config::parse(
        "[reactors]\ncores = [0]\n[[listener]]\naddress = \"127.0.0.1:8009\"\n",
        "d.toml",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(c.subsystems.is_empty());
    round_trip(&c);
}

#[test]
fn keep_alive_clamp() {
    let k = KeepAlive::default();
    assert_eq!(k.clamp(0), 0);
    assert_eq!(k.clamp(1), 1000);
    assert_eq!(k.clamp(999), 1000);
    assert_eq!(k.clamp(120_000), 120_000);
    assert_eq!(k.clamp(300_001), 300_000);
    assert_eq!(k.clamp(u32::MAX), 300_000);
    // A nonsensical hand-built value does not panic.
    let odd = KeepAlive { min_ms: 10, max_ms: 5 };
    assert_eq!(odd.clamp(7), 5);
}

#[test]
fn mode_and_placement_spellings() {
    for m in [
        ReactorMode::Poll,
        ReactorMode::Hybrid,
        ReactorMode::Interrupt,
        ReactorMode::Adaptive,
    ] {
        assert_eq!(m.to_string().parse::<ReactorMode>(), Ok(m));
    }
    assert_eq!("poll".parse(), Ok(ReactorMode::Poll));
    assert_eq!("interrupt".parse(), Ok(ReactorMode::Interrupt));
    assert_eq!("adaptive".parse(), Ok(ReactorMode::Adaptive));
    assert!("Adaptive".parse::<ReactorMode>().is_err());
    assert_eq!(ReactorMode::Hybrid.to_string(), "hybrid");
    for p in [Placement::RoundRobin, Placement::LeastLoaded] {
        assert_eq!(p.to_string().parse::<Placement>(), Ok(p));
    }
    assert_eq!(Placement::LeastLoaded.to_string(), "least-loaded");
    assert_eq!(ReactorMode::default(), ReactorMode::Interrupt);
}

/// Fragments that, shuffled together, make TOML that reaches deep into
/// validation rather than failing at the first byte.
const FRAGMENTS: &[&str] = &[
    "[reactors]\n",
    "cores = [0]\n",
    "cores = [0, 0]\n",
    "cores = []\n",
    "mode = \"poll\"\n",
    "mode = \"adaptive\"\n",
    "stall_threshold_us = 0\n",
    "[[listener]]\n",
    "address = \"127.0.0.1:4420\"\n",
    "address = \"[::1]:9\"\n",
    "[transport]\n",
    "io_queue_depth = 99999999999999999999\n",
    "max_io_size = \"1G\"\n",
    "max_h2c_data = -1\n",
    "[keep_alive]\n",
    "min_ms = 9\n",
    "max_ms = 1\n",
    "[[subsystem]]\n",
    "nqn = \"nqn.2026-11.io.pollux:a\"\n",
    "nqn = \"nqn.2014-08.org.nvmexpress.discovery\"\n",
    "allow_any_host = true\n",
    "hosts = [\"nqn.2026-11.io.pollux:h\"]\n",
    "serial = \"\"\n",
    "[[subsystem.namespace]]\n",
    "nsid = 1\n",
    "nsid = -1\n",
    "block_size = 4096\n",
    "backend = { ram = { size = \"1M\" } }\n",
    "backend = { ram = { size = \"18446744073709551615T\" } }\n",
    "backend = {}\n",
    "[subsystem.namespace.backend.ram]\n",
    "size = 512\n",
    "uuid = \"00000000-0000-0000-0000-000000000000\"\n",
    "eui64 = \"0200000000000001\"\n",
    "é = \"\u{0}\"\n",
    "\"\n",
    "[\n",
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_text_never_panics(text in ".{0,400}") {
        let _ = Config::parse(&text, "fuzz.toml");
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let text = String::from_utf8_lossy(&bytes);
        let _ = Config::parse(&text, "fuzz.toml");
    }

    #[test]
    fn shuffled_fragments_never_panic(
        picks in proptest::collection::vec(0..FRAGMENTS.len(), 0..40)
    ) {
        let text: String = picks.iter().map(|&i| FRAGMENTS[i]).collect();
        match Config::parse(&text, "frag.toml") {
            // Anything accepted must survive a round trip.
            Ok(c) => {
                let back = Config::parse(&c.to_toml(), "frag.toml");
                prop_assert_eq!(back.ok(), Some(c));
            }
            Err(e) => {
                // A position, when given, lies within the text.
                if let Some(line) = e.line() {
                    prop_assert!(line <= text.lines().count().max(1) + 1, "{}", e);
                }
            }
        }
    }

    #[test]
    fn helpers_never_panic(s in ".{0,300}") {
        let _ = validate_nqn(&s);
        let _ = parse_size(&s);
        let _ = s.parse::<ReactorMode>();
        let _ = s.parse::<Placement>();
    }
}
