//! `to_toml` round trips, small API behaviours, and fuzzing of the parser.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use pollux_conf::{
    Backend, Config, Control, FileBackend, KeepAlive, Latency, ModelKind, NvmeBackend, NvmeDevice, Placement,
    ReactorMode, SimBackend, Transport, Turnaround, derive_ids, parse_size, validate_nqn,
};
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
        // secure.toml needs its key files: conf/tests/examples.rs makes them and round-trips it.
        if path.extension().is_some_and(|e| e == "toml") && !path.ends_with("secure.toml") {
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
    c.subsystems[0].namespaces[0].given_ids.uuid = true;
    round_trip(&c);
}

#[test]
fn new_keys_round_trip() {
    // Every new key, floats that need care to print (0.1, 1e-7, 1e300, the
    // smallest subnormal, integers written for floats), awkward paths.
    let text = r#"
[reactors]
cores = [0]
mode = "adaptive"
cpu_budget = 0.1
latency_target_us = 1e-7
policy = "linux-half-mean"
hybrid_margin_us = 12.5
hybrid_turnaround = "sleep"

[[listener]]
address = "127.0.0.1:4420"

[control]
socket = "/run/pollux/\"ctl\" ü.sock"
metrics = "[::1]:9100"

[[subsystem]]
nqn = "nqn.2026-11.io.pollux:a"
allow_any_host = true

[[subsystem.namespace]]
nsid = 1
backend = { file = { path = '/var/lib/pollux/a b\#[x].img' } }

[[subsystem.namespace]]
nsid = 2
block_size = 4096
backend = { file = { path = "/dev/nvme0n1", size = "1TiB", direct = false } }

[[subsystem.namespace]]
nsid = 3
backend = { sim = { size = "1GiB", read = { fixed_us = 1e300 }, write = { min_us = 5e-324, max_us = 7 }, per_kib_us = 0.30000000000000004, parallelism = 65536, bandwidth = "2GiB", interrupt_delay_us = 2, coalesce_count = 4294967295, coalesce_us = 12.5, seed = 9223372036854775807 } }

[[subsystem.namespace]]
nsid = 4
[subsystem.namespace.backend.sim]
size = 512
read = { fast_us = 10.0, slow_us = 10.0, slow_fraction = 1 }
write = { median_us = 0.001, sigma = 3.0 }
seed = 0
"#;
    let c = Config::parse(text, "new.toml").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.reactors.mode, ReactorMode::Adaptive);
    assert_eq!(c.reactors.cpu_budget, 0.1);
    assert_eq!(c.reactors.latency_target_us, Some(1e-7));
    assert_eq!(c.reactors.policy, ModelKind::LinuxMean);
    assert_eq!(c.reactors.hybrid_margin_us, Some(12.5));
    assert_eq!(c.reactors.hybrid_turnaround, Turnaround::Sleep);
    assert_eq!(
        c.control,
        Control {
            socket: Some(PathBuf::from("/run/pollux/\"ctl\" ü.sock")),
            socket_is_default: false,
            metrics: Some("[::1]:9100".parse().expect("addr")),
        }
    );
    let ns = &c.subsystems[0].namespaces;
    assert_eq!(
        ns[0].backend,
        Backend::File(FileBackend {
            path: PathBuf::from("/var/lib/pollux/a b\\#[x].img"),
            size: None,
            direct: true,
            shared: false,
        })
    );
    assert_eq!(
        ns[1].backend,
        Backend::File(FileBackend {
            path: PathBuf::from("/dev/nvme0n1"),
            size: Some(1 << 40),
            direct: false,
            shared: false,
        })
    );
    assert_eq!(
        ns[2].backend,
        Backend::Sim(SimBackend {
            size: 1 << 30,
            read: Latency::Fixed { us: 1e300 },
            write: Latency::Uniform {
                min_us: 5e-324,
                max_us: 7.0
            },
            per_kib_us: 0.1 + 0.2,
            parallelism: 65536,
            bandwidth: Some(2 << 30),
            interrupt_delay_us: 2.0,
            coalesce_count: u32::MAX,
            coalesce_us: 12.5,
            seed: i64::MAX.unsigned_abs(),
        })
    );
    let Backend::Sim(sim) = &ns[3].backend else {
        panic!("not sim: {:?}", ns[3].backend)
    };
    assert_eq!(
        sim.read,
        Latency::Bimodal {
            fast_us: 10.0,
            slow_us: 10.0,
            slow_fraction: 1.0
        }
    );
    assert_eq!(
        sim.write,
        Latency::LogNormal {
            median_us: 0.001,
            sigma: 3.0
        }
    );
    assert_eq!(sim.seed, 0);
    let kinds: Vec<&str> = ns.iter().map(|n| n.backend.kind()).collect();
    assert_eq!(kinds, ["file", "file", "sim", "sim"]);
    round_trip(&c);
}

#[test]
fn defaults_of_new_keys() {
    let c = Config::parse(
        "[reactors]\ncores = [0]\n[[listener]]\naddress = \"127.0.0.1:4420\"\n\
         [[subsystem]]\nnqn = \"nqn.2026-11.io.pollux:a\"\nallow_any_host = true\n\
         [[subsystem.namespace]]\nnsid = 1\nbackend = { sim = { size = \"1GiB\" } }\n\
         [[subsystem.namespace]]\nnsid = 2\nbackend = { file = { path = \"/tmp/d.img\" } }\n",
        "min.toml",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.reactors.cpu_budget, 0.3);
    assert_eq!(c.reactors.latency_target_us, None);
    assert_eq!(c.reactors.policy, ModelKind::Robust);
    // No [control] table: the default socket, taken if free; no metrics.
    assert_eq!(c.control, Control::default());
    assert_eq!(
        c.control,
        Control {
            socket: Some(PathBuf::from(pollux_conf::DEFAULT_CONTROL_SOCKET)),
            socket_is_default: true,
            metrics: None
        }
    );
    let ns = &c.subsystems[0].namespaces;
    assert_eq!(
        ns[0].backend,
        Backend::Sim(SimBackend {
            size: 1 << 30,
            read: Latency::LogNormal {
                median_us: 80.0,
                sigma: 0.2
            },
            write: Latency::LogNormal {
                median_us: 20.0,
                sigma: 0.2
            },
            per_kib_us: 0.0,
            parallelism: 128,
            bandwidth: None,
            interrupt_delay_us: 0.0,
            coalesce_count: 1,
            coalesce_us: 0.0,
            seed: 1,
        })
    );
    assert_eq!(
        ns[1].backend,
        Backend::File(FileBackend {
            path: PathBuf::from("/tmp/d.img"),
            size: None,
            direct: true,
            shared: false,
        })
    );
    // The hand-built default agrees with the parsed one.
    let r = pollux_conf::Reactors::default();
    assert_eq!(
        (r.cpu_budget, r.latency_target_us, r.policy),
        (0.3, None, ModelKind::Robust)
    );
    assert_eq!((r.hybrid_margin_us, r.hybrid_turnaround), (None, Turnaround::Spin));
    // An integer is accepted where a float is expected.
    let c = Config::parse(
        "[reactors]\ncores = [0]\ncpu_budget = 1\nlatency_target_us = 50\n[[listener]]\naddress = \"127.0.0.1:4420\"\n",
        "int.toml",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((c.reactors.cpu_budget, c.reactors.latency_target_us), (1.0, Some(50.0)));
}

/// A conf whose file backend and control socket are the relative paths
/// `disk` and `socket`.
fn relative_conf(disk: &str, socket: &str) -> String {
    format!(
        "[reactors]\ncores = [0]\n[[listener]]\naddress = \"127.0.0.1:4420\"\n\
         [control]\nsocket = \"{socket}\"\n\
         [[subsystem]]\nnqn = \"nqn.2026-11.io.pollux:a\"\nallow_any_host = true\n\
         [[subsystem.namespace]]\nnsid = 1\nbackend = {{ file = {{ path = \"{disk}\" }} }}\n"
    )
}

fn file_path(c: &Config) -> &Path {
    match &c.subsystems[0].namespaces[0].backend {
        Backend::File(f) => &f.path,
        other => panic!("not a file backend: {other:?}"),
    }
}

#[test]
fn relative_paths_resolve_against_the_conf_directory() {
    let dir = std::env::temp_dir().join(format!("pollux-conf-paths-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("mkdir");
    let conf = dir.join("pollux.toml");
    std::fs::write(&conf, relative_conf("./disks/d0.img", "ctl.sock")).expect("write");
    let from_file = Config::from_path(&conf);
    // The conf named by a relative path: its directory is relative too.
    let cwd = std::env::current_dir().expect("cwd");
    let up: PathBuf = cwd.components().skip(1).map(|_| "..").collect();
    let rel_conf = up.join(conf.strip_prefix("/").expect("absolute temp dir"));
    let from_rel = Config::from_path(&rel_conf);
    let _ = std::fs::remove_dir_all(&dir);

    let c = from_file.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(file_path(&c), dir.join("disks/d0.img"));
    assert_eq!(c.control.socket.as_deref(), Some(dir.join("ctl.sock").as_path()));
    round_trip(&c);

    let c = from_rel.unwrap_or_else(|e| panic!("{e}"));
    assert!(rel_conf.is_relative());
    // `..` is kept: removing it could change the file when symlinks are
    // involved.
    assert_eq!(
        file_path(&c),
        cwd.join(&up)
            .join(dir.strip_prefix("/").expect("abs"))
            .join("disks/d0.img")
    );
    assert!(file_path(&c).is_absolute());

    // Text without a file: relative to the current directory.
    let c = Config::parse(&relative_conf("d0.img", "run/../ctl.sock"), "<text>").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(file_path(&c), cwd.join("d0.img"));
    assert_eq!(c.control.socket, Some(cwd.join("run/../ctl.sock")));
    round_trip(&c);

    // Absolute paths only lose `.` components and repeated or trailing
    // separators.
    let c =
        Config::parse(&relative_conf("/srv//./d0.img/", "/run/./ctl.sock"), "<text>").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(file_path(&c), Path::new("/srv/d0.img"));
    assert_eq!(c.control.socket.as_deref(), Some(Path::new("/run/ctl.sock")));
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
    assert_eq!(c.reactors.mode, ReactorMode::Adaptive);
    assert_eq!(c.reactors.stall_threshold_us, 2000);
    assert_eq!(c.reactors.placement, Placement::Measured);
    assert_eq!(
        c.transport,
        Transport {
            io_queue_depth: 128,
            max_io_queues: None,
            in_capsule_data_size: 8192,
            max_io_size: 131072,
            max_h2c_data: 131072,
            max_connections: 4096,
            setup_timeout_ms: 10000,
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
    assert_eq!(ReactorMode::default(), ReactorMode::Adaptive);
    for p in [ModelKind::Robust, ModelKind::LinuxMean] {
        assert_eq!(p.to_string().parse::<ModelKind>(), Ok(p));
    }
    assert_eq!(ModelKind::LinuxMean.to_string(), "linux-half-mean");
    assert_eq!(ModelKind::default(), ModelKind::Robust);
    assert!("linux".parse::<ModelKind>().is_err());
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
    "secure_concat = true\n",
    "secure_concat = \"on\"\n",
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
    "cpu_budget = 0.5\n",
    "cpu_budget = 0\n",
    "latency_target_us = inf\n",
    "policy = \"linux-half-mean\"\n",
    "hybrid_margin_us = 0\n",
    "hybrid_margin_us = -3\n",
    "hybrid_turnaround = \"sleep\"\n",
    "[control]\n",
    "socket = \"ctl.sock\"\n",
    "metrics = \"127.0.0.1:9100\"\n",
    "metrics = \"10.0.0.1:9100\"\n",
    "backend = { file = { path = \"d.img\" } }\n",
    "backend = { file = { path = \"\" } }\n",
    "backend = { file = { path = \"/d.img\", size = 4096, direct = false } }\n",
    "backend = { sim = { size = \"1M\", read = { fixed_us = 5 } } }\n",
    "backend = { sim = { size = 512, write = { median_us = 1.0, sigma = 9.0 } } }\n",
    "backend = { ram = { size = 512 }, sim = { size = 512 } }\n",
    "[subsystem.namespace.backend.sim]\n",
    "[subsystem.namespace.backend.file]\n",
    "path = \"./x/../d.img\"\n",
    "read = { min_us = 1.0, max_us = nan }\n",
    "read = { fast_us = 1, slow_us = 2, slow_fraction = 0.25 }\n",
    "[subsystem.namespace.backend.sim.write]\n",
    "fixed_us = 1e300\n",
    "bandwidth = \"1G\"\n",
    "min_cntlid = 1\n",
    "max_cntlid = 100\n",
    "min_cntlid = 101\n",
    "max_cntlid = 0\n",
    "[[referral]]\n",
    "address = \"10.0.0.2:8009\"\n",
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
        let _ = s.parse::<ModelKind>();
    }
}

proptest! {
    // Each case builds, writes and parses a whole configuration: fewer
    // cases keep the debug-build test fast.
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn generated_configs_round_trip(
        mode in prop::sample::select(vec![ReactorMode::Poll, ReactorMode::Hybrid, ReactorMode::Interrupt, ReactorMode::Adaptive]),
        cpu_budget in prop_oneof![Just(1.0), unit_fraction()],
        latency_target_us in prop::option::of(positive_us()),
        policy in prop::sample::select(vec![ModelKind::Robust, ModelKind::LinuxMean]),
        hybrid_margin_us in prop::option::of(us().prop_filter("<= 1 s", |x| *x <= 1e6)),
        hybrid_turnaround in prop::sample::select(vec![Turnaround::Spin, Turnaround::Sleep]),
        sim in sim_backend(),
        file in file_backend(),
        nvme in nvme_backends(),
        control in control(),
        secure_concat in any::<bool>(),
        ns_hosts in prop::option::of(prop::sample::subsequence(
            vec![
                "nqn.2014-08.org.nvmexpress:uuid:0c0c0c0c-0000-4000-8000-00000000000a",
                "nqn.2014-08.org.nvmexpress:uuid:0c0c0c0c-0000-4000-8000-00000000000b",
                "nqn.2026-11.io.pollux:host-c",
            ],
            0..=3,
        )),
    ) {
        let mut c = Config::embedded_default();
        c.origin = "generated".into();
        c.reactors.mode = mode;
        c.reactors.cpu_budget = cpu_budget;
        c.reactors.latency_target_us = latency_target_us;
        c.reactors.policy = policy;
        c.reactors.hybrid_margin_us = hybrid_margin_us;
        c.reactors.hybrid_turnaround = hybrid_turnaround;
        c.control = control;
        let s = &mut c.subsystems[0];
        s.secure_concat = secure_concat;
        let mut second = s.namespaces[0].clone();
        s.namespaces[0].backend = Backend::Sim(sim);
        // The subsystem admits any host: any NQN may be named, none (`[]`) too.
        s.namespaces[0].hosts = ns_hosts.map(|h| h.into_iter().map(String::from).collect());
        let ids = derive_ids(&s.nqn, 2);
        second.nsid = 2;
        (second.uuid, second.nguid, second.eui64) = (ids.uuid, ids.nguid, ids.eui64);
        second.backend = Backend::File(file);
        s.namespaces.push(second.clone());
        for (i, b) in nvme.into_iter().enumerate() {
            let mut n = second.clone();
            n.nsid = 3 + i as u32;
            let ids = derive_ids(&s.nqn, n.nsid);
            (n.uuid, n.nguid, n.eui64) = (ids.uuid, ids.nguid, ids.eui64);
            // A PCI namespace's block size is the device's: it is not written.
            if matches!(b.device, NvmeDevice::Pci(_)) {
                n.block_size = 512;
            }
            n.backend = Backend::Nvme(b);
            s.namespaces.push(n);
        }
        let text = c.to_toml();
        let back = Config::parse(&text, "generated");
        prop_assert!(back.is_ok(), "{:?}\n{}", back.err(), text);
        prop_assert_eq!(back.ok(), Some(c), "{}", text);
    }
}

/// Finite floats >= 0 of every class (zero, subnormal, normal), to stress
/// how to_toml prints them.
fn us() -> impl Strategy<Value = f64> {
    use proptest::num::f64::{NORMAL, POSITIVE, SUBNORMAL, ZERO};
    prop_oneof![
        POSITIVE | ZERO | SUBNORMAL | NORMAL,
        0.0..1e6f64,
        (0u32..1_000_000).prop_map(f64::from),
    ]
}

fn positive_us() -> impl Strategy<Value = f64> {
    us().prop_filter("> 0", |x| *x > 0.0)
}

/// A float in (0, 1].
fn unit_fraction() -> impl Strategy<Value = f64> {
    use proptest::num::f64::{NORMAL, POSITIVE, SUBNORMAL};
    (POSITIVE | SUBNORMAL | NORMAL).prop_filter("<= 1", |x| *x <= 1.0)
}

fn latency() -> impl Strategy<Value = Latency> {
    prop_oneof![
        us().prop_map(|us| Latency::Fixed { us }),
        (us(), us()).prop_map(|(a, b)| Latency::Uniform {
            min_us: a.min(b),
            max_us: a.max(b)
        }),
        (positive_us(), 0.0..=3.0f64).prop_map(|(median_us, sigma)| Latency::LogNormal { median_us, sigma }),
        (us(), us(), prop_oneof![Just(0.0), Just(1.0), 0.0..=1.0f64]).prop_map(|(a, b, slow_fraction)| {
            Latency::Bimodal {
                fast_us: a.min(b),
                slow_us: a.max(b),
                slow_fraction,
            }
        }),
    ]
}

prop_compose! {
    fn sim_backend()(
        blocks in 1..=u64::MAX / 512,
        read in latency(),
        write in latency(),
        per_kib_us in us(),
        parallelism in 1..=65536u32,
        bandwidth in prop::option::of(1..=u64::MAX),
        interrupt_delay_us in us(),
        coalesce_count in 1..=u32::MAX,
        coalesce_us in us(),
        seed in 0..=i64::MAX.unsigned_abs(),
    ) -> SimBackend {
        SimBackend {
            size: blocks * 512,
            read,
            write,
            per_kib_us,
            parallelism,
            bandwidth,
            interrupt_delay_us,
            coalesce_count,
            coalesce_us,
            seed,
        }
    }
}

/// Absolute, already normalized paths (no `.`, `..` or empty components)
/// with characters that need quoting.
fn abs_path() -> impl Strategy<Value = PathBuf> {
    prop::collection::vec("[a-zA-Z0-9_é#\"\\\\'\\[-][a-zA-Z0-9._ é#\"\\\\'\\[-]{0,15}", 1..=3)
        .prop_map(|parts| PathBuf::from(format!("/{}", parts.join("/"))))
}

prop_compose! {
    fn file_backend()(
        path in abs_path(),
        blocks in prop::option::of(1..=u64::MAX / 512),
        direct in any::<bool>(),
        shared in any::<bool>(),
    ) -> FileBackend {
        FileBackend { path, size: blocks.map(|b| b * 512), direct, shared }
    }
}

/// A PCI NVMe namespace and a fake one (distinct devices).
fn nvme_backends() -> impl Strategy<Value = Vec<NvmeBackend>> {
    (
        (0u32..=0xFFFF, 0u32..=0xFF, 0u32..=0x1F, 0u32..=7),
        1..=0xFFFF_FFFEu32,
        "[a-z][a-z0-9_-]{0,11}",
        1..=u64::MAX / 512,
        us(),
        1..=0xFFFF_FFFEu32,
    )
        .prop_map(|((d, b, v, f), nsid, name, blocks, latency_us, fnsid)| {
            vec![
                NvmeBackend {
                    device: NvmeDevice::Pci(format!("{d:04x}:{b:02x}:{v:02x}.{f:x}")),
                    nsid,
                },
                NvmeBackend {
                    device: NvmeDevice::Fake {
                        name,
                        size: blocks * 512,
                        latency_us,
                    },
                    nsid: fnsid,
                },
            ]
        })
}

fn control() -> impl Strategy<Value = Control> {
    let metrics = prop_oneof![
        (any::<[u8; 3]>(), 9000u16..9100).prop_map(|(ip, port)| SocketAddr::from(([127, ip[0], ip[1], ip[2]], port))),
        (0u16..9100).prop_map(|port| SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port))),
    ];
    // A socket named, "none" (no socket) or the default (the key left out).
    let socket = prop_oneof![
        abs_path().prop_map(|p| (Some(p), false)),
        Just((None, false)),
        Just((Some(PathBuf::from(pollux_conf::DEFAULT_CONTROL_SOCKET)), true)),
    ];
    (socket, prop::option::of(metrics)).prop_map(|((socket, socket_is_default), metrics)| Control {
        socket,
        socket_is_default,
        metrics,
    })
}
