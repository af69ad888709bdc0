//! Runtime configuration changes against an in-process target: the new snapshot is served,
//! hosts are told by AER, and what a change does not concern is not disturbed.
#![allow(missing_docs, clippy::unwrap_used)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use pollux_conf::Config;
use pollux_host::{Controller, Data, Digests, HostError, sqe};
use pollux_nvme::spec::Status;
use pollux_target::{Options, Target};

const NQN: &str = "nqn.2026-11.io.pollux:mutate";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:0c0c0c0c-0000-4000-8000-00000000aaaa";
const OTHER: &str = "nqn.2014-08.org.nvmexpress:uuid:0c0c0c0c-0000-4000-8000-00000000bbbb";

fn conf(hosts: &str, extra_ns: &str, extra_listener: &str) -> String {
    format!(
        r#"
[reactors]
cores = [0, 1]
mode = "interrupt"

[[listener]]
address = "127.0.0.1:0"
{extra_listener}
[[subsystem]]
nqn = "{NQN}"
{hosts}

[[subsystem.namespace]]
nsid = 1
backend = {{ ram = {{ size = "16MiB" }} }}
{extra_ns}
"#
    )
}

const NS2: &str = r#"
[[subsystem.namespace]]
nsid = 2
backend = { ram = { size = "8MiB" } }
"#;

fn start(text: &str) -> Target {
    Target::start(&Config::parse(text, "<test>").unwrap(), Options { pin: false }).unwrap()
}

fn addr(t: &Target) -> SocketAddr {
    t.listen_addrs()[0]
}

/// The running conf with the (resolved) first listener kept, so a reconcile keeps it.
fn next(t: &Target, hosts: &str, extra_ns: &str, extra_listener: &str) -> Config {
    let mut c = Config::parse(&conf(hosts, extra_ns, extra_listener), "<test>").unwrap();
    c.listeners[0] = Config::parse(&t.running_config(), "<test>").unwrap().listeners[0].clone();
    c
}

#[test]
fn an_added_namespace_is_announced_by_aer_and_served_without_reconnecting() {
    let t = start(&conf("allow_any_host = true", "", ""));
    let mut c = Controller::connect(addr(&t), NQN, HOST, 1, 32, Digests::NONE).unwrap();
    // Namespace attribute notices on (the Linux host does this at connect).
    c.admin.set_features(0x0B, 1 << 8).unwrap();
    let aer = c.admin.submit(sqe::async_event_request(), Data::None, 7).unwrap();
    let data: Vec<u8> = (0..4096u32).map(|i| i as u8).collect();
    c.io[0].write(1, 0, 8, &data).unwrap();

    let ch = t.apply(next(&t, "allow_any_host = true", NS2, "")).unwrap();
    assert_eq!(ch.added_namespaces, vec![(NQN.to_string(), 2)]);

    let mut got = None;
    let t0 = Instant::now();
    while got.is_none() && t0.elapsed() < Duration::from_secs(5) {
        c.admin
            .poll_completions(Some(Duration::from_millis(100)), |done| {
                if done.cid == aer {
                    got = Some((done.status, done.dw0));
                }
            })
            .unwrap();
    }
    // Notice, Namespace Attribute Changed, log page 04h (NVMe 2.0 §5.2).
    assert_eq!(got, Some((Status::SUCCESS, 0x0004_0002)));
    let log = c.admin.get_log_page(0x04, 0, 4096).unwrap();
    assert_eq!(&log[0..4], &2u32.to_le_bytes(), "changed namespace list names nsid 2");
    assert_eq!(&log[4..8], &0u32.to_le_bytes());
    assert_eq!(c.admin.active_namespaces(0).unwrap(), vec![1, 2]);
    // The same I/O queue serves the new namespace, and namespace 1 kept its data.
    c.io[0].write(2, 0, 8, &data).unwrap();
    let mut back = vec![0u8; 4096];
    c.io[0].read(2, 0, 8, &mut back).unwrap();
    assert_eq!(back, data);
    c.io[0].read(1, 0, 8, &mut back).unwrap();
    assert_eq!(back, data);

    // Removing it: I/O to it fails with Invalid Namespace, namespace 1 is untouched.
    let ch = t.apply(next(&t, "allow_any_host = true", "", "")).unwrap();
    assert_eq!(ch.removed_namespaces, vec![(NQN.to_string(), 2)]);
    std::thread::sleep(Duration::from_millis(200));
    let err = c.io[0].read(2, 0, 8, &mut back).unwrap_err();
    assert_eq!(err.status().map(|s| (s.sct(), s.sc())), Some((0, 0x0B)), "{err}");
    c.io[0].read(1, 0, 8, &mut back).unwrap();
    assert_eq!(back, data);
    t.shutdown().unwrap();
}

/// Read data of a RAM namespace is sent from the namespace in place (no copy), so a read
/// whose bytes still wait for a host that is not reading must keep the namespace's memory
/// alive when the namespace is removed meanwhile: every byte arrives, unchanged.
#[test]
fn reads_waiting_for_a_slow_host_survive_the_removal_of_their_namespace() {
    const CHUNK: usize = 128 * 1024;
    const READS: u64 = 32;
    let t = start(&conf("allow_any_host = true", NS2, ""));
    let mut c = Controller::connect(addr(&t), NQN, HOST, 1, 64, Digests::NONE).unwrap();
    let nlb = (CHUNK / 512) as u32;
    let chunk = |i: u64| -> Vec<u8> {
        (0..CHUNK)
            .map(|j| (i as usize * 131 + j * 7 + j / 4096) as u8)
            .collect()
    };
    for i in 0..READS {
        c.io[0].write(2, i * u64::from(nlb), nlb, &chunk(i)).unwrap();
    }
    // 4 MiB of reads, far more than the sockets buffer while the host does not read.
    for i in 0..READS {
        c.io[0]
            .submit_read(2, i * u64::from(nlb), nlb, vec![0u8; CHUNK], i)
            .unwrap();
    }
    c.io[0].send_pending().unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let ch = t.apply(next(&t, "allow_any_host = true", "", "")).unwrap();
    assert_eq!(ch.removed_namespaces, vec![(NQN.to_string(), 2)]);
    std::thread::sleep(Duration::from_millis(100));
    let mut done = 0;
    let t0 = Instant::now();
    while done < READS && t0.elapsed() < Duration::from_secs(10) {
        c.io[0]
            .poll_completions(Some(Duration::from_millis(100)), |cpl| {
                assert!(cpl.is_success(), "read {} failed: {:?}", cpl.tag, cpl.status);
                assert!(cpl.buf == chunk(cpl.tag), "read {} returned other bytes", cpl.tag);
                done += 1;
            })
            .unwrap();
    }
    assert_eq!(done, READS);
    // The namespace is gone for new commands.
    let mut back = vec![0u8; 4096];
    let err = c.io[0].read(2, 0, 8, &mut back).unwrap_err();
    assert_eq!(err.status().map(|s| (s.sct(), s.sc())), Some((0, 0x0B)), "{err}");
    t.shutdown().unwrap();
}

#[test]
fn removing_a_host_deletes_its_controller_and_refuses_it_while_others_stay() {
    let t = start(&conf(&format!("hosts = [\"{HOST}\", \"{OTHER}\"]"), "", ""));
    let mut gone = Controller::connect(addr(&t), NQN, HOST, 1, 32, Digests::NONE).unwrap();
    let mut stays = Controller::connect(addr(&t), NQN, OTHER, 1, 32, Digests::NONE).unwrap();
    t.apply(next(&t, &format!("hosts = [\"{OTHER}\"]"), "", "")).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let data = vec![5u8; 512];
    let r = gone.io[0].write(1, 0, 1, &data);
    assert!(
        matches!(r, Err(HostError::Closed | HostError::Io(_) | HostError::Timeout { .. })),
        "{r:?}"
    );
    let refused = Controller::connect(addr(&t), NQN, HOST, 1, 32, Digests::NONE).unwrap_err();
    assert_eq!(
        refused.status().map(|s| (s.sct(), s.sc())),
        Some((1, 0x84)),
        "{refused}"
    );
    stays.io[0].write(1, 0, 1, &data).unwrap();
    t.shutdown().unwrap();
}

#[test]
fn listeners_are_added_and_removed_at_run_time() {
    let t = start(&conf("allow_any_host = true", "", ""));
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let extra_listener = format!("[[listener]]\naddress = \"127.0.0.1:{port}\"\n");
    let ch = t.apply(next(&t, "allow_any_host = true", "", &extra_listener)).unwrap();
    assert_eq!(ch.added_listeners.len(), 1);
    let extra = ch.added_listeners[0];
    std::thread::sleep(Duration::from_millis(100));
    let mut c = Controller::connect(extra, NQN, HOST, 1, 32, Digests::NONE).unwrap();
    let log = Controller::connect(addr(&t), pollux_conf::DISCOVERY_NQN, HOST, 0, 32, Digests::NONE)
        .unwrap()
        .admin
        .discovery_log()
        .unwrap();
    assert_eq!(
        log.entries.iter().filter(|e| e.subtype == 2).count(),
        2,
        "the discovery log lists both listeners"
    );
    assert!(log.genctr > 1, "genctr changed: {}", log.genctr);
    let ch = t.apply(next(&t, "allow_any_host = true", "", "")).unwrap();
    assert_eq!(ch.removed_listeners, vec![extra]);
    std::thread::sleep(Duration::from_millis(100));
    assert!(std::net::TcpStream::connect_timeout(&extra, Duration::from_secs(1)).is_err());
    // The connection made through it stays.
    c.io[0].write(1, 0, 1, &[1u8; 512]).unwrap();
    t.shutdown().unwrap();
}

#[test]
fn reload_applies_the_file_and_a_broken_file_changes_nothing() {
    let dir = std::env::temp_dir().join(format!("pollux-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("pollux.toml");
    std::fs::write(&path, conf("allow_any_host = true", "", "")).unwrap();
    let t = Target::start(&Config::from_path(&path).unwrap(), Options { pin: false }).unwrap();
    // Keep the resolved port in the file, as an operator would.
    let port = addr(&t).port();
    let with_port =
        |ns: &str| conf("allow_any_host = true", ns, "").replace("127.0.0.1:0", &format!("127.0.0.1:{port}"));
    std::fs::write(&path, with_port(NS2)).unwrap();
    let ch = t.reload().unwrap();
    assert_eq!(ch.added_namespaces, vec![(NQN.to_string(), 2)]);
    assert!(
        ch.removed_listeners.is_empty() && ch.added_listeners.is_empty(),
        "{ch:?}"
    );
    let before = t.running_config();
    std::fs::write(&path, with_port(NS2).replace("nsid = 2", "nsid = 2\nbogus = 1")).unwrap();
    let err = t.reload().unwrap_err().to_string();
    assert!(err.contains("pollux.toml:") && err.contains("bogus"), "{err}");
    assert_eq!(t.running_config(), before, "nothing changed");
    t.shutdown().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_saved_running_configuration_loads_back_to_the_same_state() {
    let t = start(&conf("allow_any_host = true", NS2, ""));
    let saved = t.running_config();
    let again = Config::parse(&saved, "<saved>").unwrap();
    let ch = t.apply(again).unwrap();
    assert!(ch.is_empty(), "re-applying the saved conf changes nothing: {ch:?}");
    t.shutdown().unwrap();
}

/// The hybrid sleep rules apply in place: a reload that sets them needs no restart, and the
/// running conf shows them.
#[test]
fn hybrid_margin_and_turnaround_apply_without_a_restart() {
    let t = start(&conf("allow_any_host = true", "", ""));
    let mut c = next(&t, "allow_any_host = true", "", "");
    c.reactors.hybrid_margin_us = Some(20.0);
    c.reactors.hybrid_turnaround = pollux_conf::Turnaround::Sleep;
    let ch = t.apply(c).unwrap();
    assert!(ch.reactors_changed, "{ch:?}");
    assert!(ch.restart_needed.is_empty(), "{ch:?}");
    let running = t.running_config();
    assert!(running.contains("hybrid_margin_us = 20.0"), "{running}");
    assert!(running.contains("hybrid_turnaround = \"sleep\""), "{running}");
    // Applying the same again changes nothing.
    let again = t.apply(Config::parse(&running, "<test>").unwrap()).unwrap();
    assert!(!again.reactors_changed, "{again:?}");
}
