//! `pollux ctl upgrade`: a running `pollux` process hands its listeners and live
//! connections to a new process of the binary, and hosts keep going (verified I/O on two
//! controllers, one with its queues on both reactors) with no error; RAM namespace data
//! written before is there after; and every refusal (a binary that exits at once, one that
//! refuses the state format, one killed midway, a second upgrade at once) leaves the old
//! process serving with every connection intact.
#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::{HOST, Healthy, OTHER_HOST, Spawned, pattern};
use pollux_host::{Controller, Digests};

const BIN: &str = env!("CARGO_BIN_EXE_pollux");
const NQN: &str = "nqn.2026-12.io.pollux:upgrade";

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("pollux-upgrade-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A `pollux --config FILE` process (its successors after upgrades included), stopped by
/// SIGTERM to whichever serves when dropped ([`Spawned`]).
struct Server {
    p: Spawned,
    sock: PathBuf,
    addr: SocketAddr,
}

impl Server {
    fn start(d: &Path) -> Server {
        Self::start_with(d, "")
    }

    /// With `extra` namespaces of the subsystem.
    fn start_with(d: &Path, extra: &str) -> Server {
        let sock = d.join("ctl.sock");
        let port = free_port();
        let conf = format!(
            r#"[reactors]
cores = [0, 1]
mode = "interrupt"

[[listener]]
address = "127.0.0.1:{port}"

[control]
socket = "{}"

[[subsystem]]
nqn = "{NQN}"
allow_any_host = true

[[subsystem.namespace]]
nsid = 1
backend = {{ ram = {{ size = "16MiB" }} }}

[[subsystem.namespace]]
nsid = 2
backend = {{ ram = {{ size = "16MiB" }} }}
{extra}
"#,
            sock.display()
        );
        let p = Spawned::start(
            BIN,
            &d.join("pollux.toml"),
            &conf,
            &sock,
            Some(&d.join("pollux.log")),
            "info",
        );
        Server {
            p,
            sock,
            addr: format!("127.0.0.1:{port}").parse().unwrap(),
        }
    }

    fn ctl(&self, args: &[&str]) -> Output {
        self.p.ctl(args)
    }

    fn pid(&self) -> u64 {
        let pid = self.p.pid();
        assert!(pid.is_some(), "no pid from ctl version");
        pid.unwrap_or_default() as u64
    }

    fn upgrade(&self, binary: &Path) -> Output {
        self.ctl(&["upgrade", "--binary", binary.to_str().unwrap()])
    }
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A script at `d/name` that runs `body`.
fn script(d: &Path, name: &str, body: &str) -> PathBuf {
    let p = d.join(name);
    std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

#[test]
fn hosts_keep_their_connections_and_data_across_upgrades() {
    let d = dir("keep");
    let s = Server::start(&d);
    // Data written before any upgrade, read back after each.
    let mut c = Controller::connect(s.addr, NQN, OTHER_HOST, 2, 32, Digests::NONE).unwrap();
    let before = pattern(7, 4000, 64 * 512);
    c.io[1].write(1, 4000, 64, &before).unwrap();
    let mut a = Healthy::start_on(s.addr, NQN, HOST, 0);
    let mut b = Healthy::start_on(
        s.addr,
        NQN,
        "nqn.2014-08.org.nvmexpress:uuid:0c0c0c0c-0000-4000-8000-000000000003",
        100,
    );
    a.progress(10);
    b.progress(10);
    // QD32 random reads and writes, every block read checked against what was written,
    // on 4 queues, across the upgrades: nothing lost, nothing run twice.
    let trid = format!("trtype:tcp traddr:127.0.0.1 trsvcid:{} subnqn:{NQN}", s.addr.port());
    let perf = Command::new(BIN)
        .args([
            "perf", "-r", &trid, "-q", "32", "-w", "randrw", "--verify", "-t", "6", "--span", "4MiB", "--nsid", "2",
        ])
        .args([
            "--cores",
            "0",
            "--no-pin",
            "--conns-per-core",
            "4",
            "--no-probe",
            "--json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let mut pids = vec![s.pid()];
    for round in 0..3 {
        let o = s.upgrade(Path::new(BIN));
        assert!(o.status.success(), "upgrade {round}: {}", text(&o));
        assert!(text(&o).contains("upgraded: pid"), "{}", text(&o));
        let pid = s.pid();
        assert!(!pids.contains(&pid), "upgrade {round}: still pid {pid}");
        pids.push(pid);
        a.progress(10);
        b.progress(10);
        let mut back = vec![0u8; before.len()];
        c.io[0].read(1, 4000, 64, &mut back).unwrap();
        assert!(back == before, "upgrade {round}: RAM data written before differs after");
        // The admin queue too (Identify through the new process).
        assert_eq!(c.admin.identify_namespace(1).unwrap().block_size, 512);
    }
    let perf = perf.wait_with_output().unwrap();
    assert!(perf.status.success(), "perf --verify across upgrades: {}", text(&perf));
    a.finish();
    b.finish();
    c.shutdown().unwrap();
}

#[test]
fn failed_upgrades_leave_the_old_process_serving() {
    let d = dir("refuse");
    let s = Server::start(&d);
    let mut h = Healthy::start_on(s.addr, NQN, HOST, 0);
    h.progress(5);
    let pid = s.pid();
    let cases = [
        (script(&d, "exits", "exit 3"), "exit status 3"),
        (
            script(
                &d,
                "older",
                &format!("POLLUX_UPGRADE_NEWEST_FORMAT=0 exec {BIN} \"$@\""),
            ),
            "state format 1 is not one the new binary reads",
        ),
        (
            script(
                &d,
                "dies-prepare",
                &format!("POLLUX_UPGRADE_FAIL_AT=prepare exec {BIN} \"$@\""),
            ),
            "the new process ended during the handover",
        ),
        (
            script(
                &d,
                "dies-handover",
                &format!("POLLUX_UPGRADE_FAIL_AT=handover exec {BIN} \"$@\""),
            ),
            "the new process ended during the handover",
        ),
        (
            script(
                &d,
                "dies-ready",
                &format!("POLLUX_UPGRADE_FAIL_AT=ready exec {BIN} \"$@\""),
            ),
            "the new process ended during the handover",
        ),
        (
            script(
                &d,
                "dies-commit",
                &format!("POLLUX_UPGRADE_FAIL_AT=commit exec {BIN} \"$@\""),
            ),
            "the new process ended during the handover",
        ),
        (d.join("no-such-binary"), "cannot start"),
    ];
    for (bin, why) in &cases {
        let o = s.upgrade(bin);
        assert!(!o.status.success(), "{}: {}", bin.display(), text(&o));
        assert!(text(&o).contains(why), "{}: {}", bin.display(), text(&o));
        assert_eq!(s.pid(), pid, "{}", bin.display());
        // The host's connection is intact and serving.
        h.progress(5);
    }
    // Two upgrades do not overlap: the second is refused while the first (a slow binary)
    // runs, and the first completes.
    let slow = script(&d, "slow", &format!("sleep 2; exec {BIN} \"$@\""));
    let first = Command::new(BIN)
        .arg("ctl")
        .arg("--socket")
        .arg(&s.sock)
        .args(["upgrade", "--binary", slow.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let o = s.upgrade(Path::new(BIN));
    assert!(
        !o.status.success() && text(&o).contains("already in progress"),
        "{}",
        text(&o)
    );
    // Run-time changes wait for it too.
    let o = s.ctl(&["add-namespace", "--nqn", NQN, "--nsid", "3", "--ram", "1MiB"]);
    assert!(
        !o.status.success() && text(&o).contains("upgrade is in progress"),
        "{}",
        text(&o)
    );
    let o = first.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    h.progress(5);
    assert_ne!(s.pid(), pid);
    // Still upgradable after all that.
    let o = s.upgrade(Path::new(BIN));
    assert!(o.status.success(), "{}", text(&o));
    h.progress(5);
    h.finish();
}

/// A namespace on an NVMe device through VFIO (here the driver's fake controller) cannot be
/// handed over: the upgrade is refused before anything starts, saying why.
#[test]
fn an_nvme_device_is_let_go_of_and_brought_up_again_by_the_new_process() {
    // The driver's fake controller stands for a VFIO device: the old process drains and
    // shuts it down, the new one brings it up before it serves, the report says how long
    // each took. (A fake device's media is its process's memory: it starts empty again.
    // A real device keeps its data: ci/guest/guest.d/pollux-nvme.sh verifies it.)
    let d = dir("vfio");
    let s = Server::start_with(
        &d,
        "[[subsystem.namespace]]\nnsid = 3\nbackend = { nvme = { fake = \"upgrade-fake\", size = \"8MiB\" } }",
    );
    let mut h = Healthy::start_on(s.addr, NQN, HOST, 0);
    let mut c = Controller::connect(s.addr, NQN, OTHER_HOST, 1, 32, Digests::NONE).unwrap();
    let data = pattern(3, 100, 8 * 512);
    c.io[0].write(3, 100, 8, &data).unwrap();
    h.progress(5);

    // Refused after the device was let go of: the old process brings it up again.
    let pid = s.pid();
    let dies = script(
        &d,
        "dies-ready",
        &format!("POLLUX_UPGRADE_FAIL_AT=ready exec {BIN} \"$@\""),
    );
    let o = s.upgrade(&dies);
    assert!(!o.status.success(), "{}", text(&o));
    assert_eq!(s.pid(), pid);
    c.io[0].write(3, 200, 8, &data).unwrap();
    let mut back = vec![0u8; 8 * 512];
    c.io[0].read(3, 200, 8, &mut back).unwrap();
    assert_eq!(back, data, "the device serves again after the rollback");

    let o = s.ctl(&["--json", "upgrade", "--binary", BIN]);
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["devices"], 1, "{v}");
    assert!(v["device_init_ms"].as_f64().unwrap() > 0.0, "{v}");
    assert_ne!(s.pid(), pid);
    h.progress(5);
    c.io[0].write(3, 300, 8, &data).unwrap();
    c.io[0].read(3, 300, 8, &mut back).unwrap();
    assert_eq!(
        back, data,
        "the same connection, on the device the new process brought up"
    );
    let o = s.ctl(&["--json", "call", "nvme_devices"]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("\"ok\""), "{}", text(&o));
    drop(c);
    h.finish();
}
