//! The shipped example configurations and the embedded default.

use std::path::{Path, PathBuf};

use pollux_conf::{
    Backend, Config, Control, DEFAULT_CONF, FileBackend, KeepAlive, Latency, ModelKind, Placement, ReactorMode,
    SimBackend, Transport, derive_ids, derive_serial,
};

fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples")
}

fn example(name: &str) -> Config {
    let path = examples_dir().join(name);
    match Config::from_path(&path) {
        Ok(c) => c,
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn every_example_parses() {
    let mut n = 0;
    for entry in std::fs::read_dir(examples_dir()).expect("examples dir") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "toml") && !path.ends_with("secure.toml") {
            let c = Config::from_path(&path).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(c.origin, path.display().to_string());
            n += 1;
        }
    }
    assert!(n >= 5, "found only {n} examples");
}

#[test]
fn embedded_default_is_ram_toml() {
    let c = Config::embedded_default();
    assert_eq!(c.origin, "<embedded>");
    assert_eq!(c.reactors.cores, vec![0]);
    assert_eq!(c.reactors.mode, ReactorMode::Adaptive);
    assert_eq!(c.reactors.stall_threshold_us, 2000);
    assert_eq!(c.reactors.placement, Placement::Measured);
    let addrs: Vec<String> = c.listeners.iter().map(|l| l.address.to_string()).collect();
    assert_eq!(addrs, ["127.0.0.1:4420", "127.0.0.1:8009"]);
    assert_eq!(c.transport, Transport::default());
    assert_eq!(c.keep_alive, KeepAlive::default());
    assert_eq!(c.control, Control::default());
    assert_eq!(c.subsystems.len(), 1);
    let s = &c.subsystems[0];
    assert_eq!(s.nqn, "nqn.2026-11.io.pollux:ram0");
    assert!(s.allow_any_host);
    assert!(s.hosts.is_empty());
    assert_eq!(s.model, "pollux");
    assert_eq!(s.serial, derive_serial(&s.nqn));
    assert_eq!(s.namespaces.len(), 1);
    let ns = &s.namespaces[0];
    assert_eq!(ns.nsid, 1);
    assert_eq!(ns.block_size, 512);
    assert_eq!(ns.backend, Backend::Ram { size: 1 << 30 });
    let ids = derive_ids(&s.nqn, 1);
    assert_eq!((ns.uuid, ns.nguid, ns.eui64), (ids.uuid, ids.nguid, ids.eui64));

    // The same text read from the file gives the same configuration.
    let mut from_file = example("ram.toml");
    from_file.origin = c.origin.clone();
    assert_eq!(from_file, c);
    assert_eq!(
        DEFAULT_CONF,
        std::fs::read_to_string(examples_dir().join("ram.toml")).expect("read")
    );
}

#[test]
fn two_subsystems_example() {
    let c = example("two-subsystems.toml");
    assert_eq!(c.reactors.cores, vec![0, 1]);
    assert_eq!(c.reactors.mode, ReactorMode::Hybrid);
    assert_eq!(c.reactors.placement, Placement::LeastLoaded);
    assert_eq!(c.listeners[1].address.to_string(), "[::1]:4420");
    assert_eq!(c.subsystems.len(), 2);

    let r = &c.subsystems[0];
    assert!(!r.allow_any_host);
    assert_eq!(r.hosts.len(), 2);
    assert!(r.allows_host("nqn.2026-11.io.pollux:host-a"));
    assert!(!r.allows_host("nqn.2026-11.io.pollux:host-b"));
    assert_eq!(r.serial, "POLLUX0001");
    assert_eq!(r.model, "pollux restricted");
    assert_eq!(r.namespaces[1].block_size, 4096);
    assert_eq!(r.namespaces[1].eui64, [2, 0, 0, 0, 0, 0, 0, 1]);
    assert_eq!(r.namespaces[1].uuid[0], 0x6d);
    assert_eq!(r.namespaces[1].nguid[15], 0xef);

    let s = &c.subsystems[1];
    assert!(s.allow_any_host);
    assert!(s.allows_host("nqn.2026-11.io.pollux:anyone"));
    assert_eq!(s.namespaces[0].backend, Backend::Ram { size: 64 << 20 });
    assert_eq!(s.namespaces[1].backend, Backend::Ram { size: 32 << 20 });
    for sub in &c.subsystems {
        assert_eq!(sub.namespaces.len(), 2);
    }
}

#[test]
fn poll_example() {
    let c = example("poll.toml");
    assert_eq!(c.reactors.cores.len(), 1);
    assert_eq!(c.reactors.mode, ReactorMode::Poll);
    assert_eq!(c.transport.max_io_size, 1 << 20);
    assert_eq!(c.transport.mdts(), 8);
    assert_eq!(c.transport.io_queue_depth, 256);
}

#[test]
fn polling_example() {
    let c = example("polling.toml");
    assert_eq!(c.reactors.mode, ReactorMode::Interrupt);
    let (fast, bulk) = (&c.subsystems[0], &c.subsystems[1]);
    assert_eq!(fast.polling, Some(pollux_conf::Polling::Always));
    assert_eq!(fast.namespaces[0].polling, None, "inherits");
    assert_eq!(fast.polling_of(&fast.namespaces[0]), pollux_conf::Polling::Always);
    assert_eq!(bulk.polling, None);
    assert_eq!(bulk.polling_of(&bulk.namespaces[0]), pollux_conf::Polling::Never);
}

#[test]
fn sim_example() {
    let c = example("sim.toml");
    assert_eq!(c.reactors.cores, vec![0]);
    assert_eq!(c.reactors.mode, ReactorMode::Adaptive);
    assert_eq!(c.reactors.cpu_budget, 0.3);
    assert_eq!(c.reactors.policy, ModelKind::Robust);
    assert_eq!(c.subsystems.len(), 2);
    let nand = &c.subsystems[0].namespaces[0];
    assert_eq!(nand.block_size, 4096);
    let Backend::Sim(nand) = &nand.backend else {
        panic!("not sim: {:?}", nand.backend)
    };
    assert_eq!(nand.size, 1 << 30);
    assert_eq!(
        nand.read,
        Latency::LogNormal {
            median_us: 80.0,
            sigma: 0.3
        }
    );
    assert_eq!(nand.parallelism, 128);
    assert_eq!(
        c.subsystems[1].namespaces[0].backend,
        Backend::Sim(SimBackend {
            size: 256 << 20,
            read: Latency::Fixed { us: 10.0 },
            write: Latency::Fixed { us: 10.0 },
            per_kib_us: 0.0,
            parallelism: 64,
            bandwidth: None,
            interrupt_delay_us: 0.0,
            coalesce_count: 1,
            coalesce_us: 0.0,
            seed: 1,
        })
    );
}

#[test]
fn file_example() {
    let c = example("file.toml");
    assert_eq!(c.subsystems.len(), 1);
    let ns = &c.subsystems[0].namespaces[0];
    assert_eq!(ns.block_size, 4096);
    assert_eq!(
        ns.backend,
        Backend::File(FileBackend {
            path: PathBuf::from("/tmp/pollux-disk0.img"),
            size: Some(256 << 20),
            direct: true,
            shared: false,
        })
    );
    assert_eq!(ns.backend.kind(), "file");
}

#[test]
fn nvme_example() {
    let c = example("nvme.toml");
    let ns = &c.subsystems[0].namespaces[0];
    assert_eq!(
        ns.backend,
        Backend::Nvme(pollux_conf::NvmeBackend {
            device: pollux_conf::NvmeDevice::Pci("0000:00:04.0".into()),
            nsid: 1,
        })
    );
    assert_eq!(ns.backend.kind(), "nvme");
}

#[test]
fn secure_toml_parses_with_its_key_files() {
    use std::os::unix::fs::PermissionsExt;
    // Its key files are generated as its comments say (not shipped: secrets).
    let dir = std::env::temp_dir().join(format!("pollux-secure-example-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("keys")).expect("dir");
    let conf = dir.join("secure.toml");
    std::fs::copy(examples_dir().join("secure.toml"), &conf).expect("copy");
    for (f, h) in [
        ("host-a.key", pollux_conf::HashId::Sha256),
        ("ctrl-a.key", pollux_conf::HashId::Sha512),
    ] {
        let k = pollux_conf::DhchapKey::generate(Some(h), h.output_len()).expect("random");
        let p = dir.join("keys").join(f);
        std::fs::write(&p, format!("{}\n", *k.encode())).expect("write");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    }
    let psk = pollux_conf::ConfiguredPsk::new(Some(pollux_nvme::tls::PskHash::Sha256), &[9; 32]).expect("psk");
    let p = dir.join("keys").join("host-a.psk");
    std::fs::write(&p, format!("{}\n", *psk.encode())).expect("write");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let c = Config::from_path(&conf).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.listeners[0].tls, pollux_conf::TlsMode::Allowed);
    let s = &c.subsystems[0];
    assert_eq!(s.tls_keys.len(), 1);
    assert_eq!(s.host_keys.len(), 1);
    assert!(s.host_keys.values().all(|k| k.ctrl.is_some()));
    assert!(!s.allow_any_host);
    // Written back with its key files as files, it reads the same.
    let text = c.to_toml();
    assert!(!text.contains("DHHC-1") && !text.contains("NVMeTLSkey"), "{text}");
    let back = Config::parse(&text, &c.origin).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(back.subsystems, c.subsystems);
    let _ = std::fs::remove_dir_all(&dir);
}
