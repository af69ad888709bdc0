//! `pollux ctl` and `pollux --check` from the command line, as an operator runs them: the
//! binary against a running `pollux` process. The verbs and their flags, `ctl methods`,
//! quiet summaries, errors in the caller's terms, `-c FILE` reading only the socket, the
//! run-time log filter, and `--check`'s compiler-style output.
#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::Spawned;

const BIN: &str = env!("CARGO_BIN_EXE_pollux");
const NQN: &str = "nqn.2026-12.io.pollux:cli";

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("pollux-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn conf(sock: &Path) -> String {
    format!(
        r#"# kept by save
[reactors]
cores = [0]
mode = "interrupt"

[[listener]]
address = "127.0.0.1:0"

[control]
socket = "{}"

[[subsystem]]
nqn = "{NQN}"
allow_any_host = true

[[subsystem.namespace]]
nsid = 1
backend = {{ ram = {{ size = "4MiB" }} }}
"#,
        sock.display()
    )
}

/// A `pollux --config FILE` process on [`conf`], stopped (SIGTERM) when dropped.
struct Server;

impl Server {
    fn start(d: &Path) -> Spawned {
        let sock = d.join("ctl.sock");
        Spawned::start(BIN, &d.join("pollux.toml"), &conf(&sock), &sock, None, "warn")
    }
}

fn out(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn verbs_methods_errors_and_summaries() {
    let d = dir("verbs");
    let s = Server::start(&d);

    // A verb with flags: one quiet line; --json the change set.
    let o = s.ctl(&["add-namespace", "--nqn", NQN, "--nsid", "2", "--ram", "8MiB"]);
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(out(&o), format!("add-namespace: added namespace {NQN} 2\n"));
    let o = s.ctl(&["--json", "remove-namespace", "--nqn", NQN, "--nsid", "2"]);
    assert!(o.status.success(), "{}", err(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["removed_namespaces"], serde_json::json!([[NQN, 2]]));

    // The host and listener verbs.
    let host = "nqn.2014-08.org.nvmexpress:uuid:c1c1c1c1-0000-4000-8000-000000000001";
    let o = s.ctl(&["add-host", "--nqn", NQN, "--host", host]);
    assert!(o.status.success(), "{}", err(&o));
    assert!(out(&o).starts_with("add-host: changed subsystem"), "{}", out(&o));
    // Host masking: namespace 1 attached to that host only, one quiet line.
    let o = s.ctl(&["ns-add-host", "--nqn", NQN, "--nsid", "1", "--host", host]);
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(
        out(&o),
        format!("ns-add-host: changed the hosts of namespace {NQN} 1\n")
    );
    let o = s.ctl(&["ns-remove-host", "--nqn", NQN, "--nsid", "1", "--host", "nqn.x"]);
    assert_eq!(o.status.code(), Some(2), "{}", err(&o));
    assert!(err(&o).contains("not a valid host NQN"), "{}", err(&o));
    let o = s.ctl(&["add-listener", "--address", "127.0.0.2:0"]);
    assert!(o.status.success(), "{}", err(&o));
    assert!(
        out(&o).starts_with("add-listener: added listener 127.0.0.2:"),
        "{}",
        out(&o)
    );

    // QoS limits: set in place, shown by `subsystems`, a bad value refused by the verb.
    let o = s.ctl(&[
        "set-qos",
        "--nqn",
        NQN,
        "--nsid",
        "1",
        "--iops",
        "500",
        "--read-mbps",
        "20",
    ]);
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(out(&o), format!("set-qos: QoS limits of {NQN} 1\n"));
    let o = s.ctl(&["subsystems"]);
    assert!(
        out(&o).contains("namespace 1 qos iops 500, read_mbps 20 (held 0 commands so far)"),
        "{}",
        out(&o)
    );
    let o = s.ctl(&["set-qos", "--nqn", NQN, "--nsid", "1", "--iops", "-3"]);
    assert_eq!(o.status.code(), Some(2), "{}", err(&o));
    let o = s.ctl(&[
        "set-qos",
        "--nqn",
        NQN,
        "--nsid",
        "1",
        "--iops",
        "0",
        "--read-mbps",
        "0",
    ]);
    assert!(o.status.success(), "{}", err(&o));
    assert!(!out(&s.ctl(&["subsystems"])).contains("qos"));

    // `methods`: the list and one method's params.
    let o = s.ctl(&["methods"]);
    assert!(o.status.success(), "{}", err(&o));
    let list = out(&o);
    for m in ["add_namespace", "set_host_keys", "log_level", "remove_referral"] {
        assert!(list.contains(m), "methods lacks {m}:\n{list}");
    }
    let o = s.ctl(&["methods", "add-namespace"]);
    let one = out(&o);
    assert!(
        one.contains("--ram") && one.contains("--rbd") && one.contains("size"),
        "{one}"
    );

    // Errors in the caller's terms: the param and the value, the nearest method.
    let o = s.ctl(&[
        "call",
        "add_namespace",
        &format!(r#"{{"nqn":"{NQN}","nsid":3,"backend":{{"ram":{{"size":"1.5GiB"}}}}}}"#),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", err(&o));
    let e = err(&o);
    assert!(e.contains("'backend.ram.size' = \"1.5GiB\""), "{e}");
    assert!(!e.contains("<control>"), "{e}");
    let o = s.ctl(&["call", "add_nammespace", "{}"]);
    assert!(!o.status.success());
    assert!(err(&o).contains("did you mean 'add_namespace'"), "{}", err(&o));
    let o = s.ctl(&["add-nammespace"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(err(&o).contains("add-namespace"), "{}", err(&o));
    // clap refuses a namespace without a backend before anything is sent.
    let o = s.ctl(&["add-namespace", "--nqn", NQN, "--nsid", "4"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(err(&o).contains("--ram"), "{}", err(&o));

    // The run-time log filter.
    let o = s.ctl(&["log-level"]);
    assert_eq!(out(&o), "log filter: warn\n", "{}", err(&o));
    let o = s.ctl(&["log-level", "info,pollux_target::controller=debug"]);
    assert!(o.status.success(), "{}", err(&o));
    assert!(out(&o).contains("pollux_target::controller=debug"), "{}", out(&o));
    let o = s.ctl(&["log-level", "loud"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(err(&o).contains("invalid log filter"), "{}", err(&o));

    // save: quiet, the file kept as its author wrote it.
    let o = s.ctl(&["save"]);
    assert!(o.status.success(), "{}", err(&o));
    assert!(
        out(&o).starts_with(&format!("saved {}", s.conf.display())),
        "{}",
        out(&o)
    );
    let saved = std::fs::read_to_string(&s.conf).unwrap();
    assert!(saved.starts_with("# kept by save"), "{saved}");
    assert!(saved.contains(host), "{saved}");
    // Namespace 1's hosts, besides the subsystem's.
    let ns1 = saved.split("[[subsystem.namespace]]").nth(1).unwrap_or_default();
    assert!(ns1.contains(&format!("hosts = [\"{host}\"]")), "{saved}");

    // `-c FILE` only reads the socket: a file broken elsewhere still reaches the target
    // (so `ctl reload` can report the breakage), and so does a relative socket path.
    let broken = d.join("broken.toml");
    std::fs::write(&broken, "[control]\nsocket = \"ctl.sock\"\n[reactors]\ncores = \"x\"\n").unwrap();
    let o = Command::new(BIN)
        .args(["ctl", "-c"])
        .arg(&broken)
        .arg("version")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", err(&o));
    assert!(out(&o).starts_with("pollux "), "{}", out(&o));
    std::fs::write(&s.conf, "[reactors]\ncores = 7\n").unwrap();
    let o = Command::new(BIN)
        .args(["ctl", "-c"])
        .arg(&broken)
        .arg("reload")
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(
        err(&o).contains("pollux.toml:2:9"),
        "the server's refusal, located: {}",
        err(&o)
    );
    drop(s);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn the_command_line_control_socket_outlasts_reloads_and_upgrades() {
    // `pollux -r PATH` (SPDK's nvmf_tgt -r): the socket served, whatever the conf names; a
    // reload of the conf file does not call it a change, and a hot upgrade's successor
    // serves it too.
    let d = dir("rsock");
    let named = d.join("named.sock");
    let given = d.join("given.sock");
    let arg = given.to_str().unwrap();
    let s = Spawned::start_with(
        BIN,
        &d.join("pollux.toml"),
        &conf(&named),
        &given,
        None,
        "warn",
        &["-r", arg],
    );
    assert!(!named.exists(), "the conf's socket is not served");
    let o = s.ctl(&["--json", "reload"]);
    assert!(o.status.success(), "{}", err(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["restart_needed"], serde_json::json!([]), "{v}");
    let pid = s.pid();
    let o = s.ctl(&["--json", "upgrade", "--binary", BIN]);
    assert!(o.status.success(), "{}", err(&o));
    assert_ne!(s.pid(), pid, "the successor answers on the same socket");
    let o = s.ctl(&["--json", "reload"]);
    assert!(o.status.success(), "{}", err(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["restart_needed"], serde_json::json!([]), "the successor kept -r: {v}");
    assert!(!named.exists());
    drop(s);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn check_prints_file_line_col_first() {
    let d = dir("check");
    let bad = d.join("bad.toml");
    std::fs::write(
        &bad,
        "[reactors]\ncores = [0]\n[[listener]]\naddress = \"127.0.0.1:99999\"\n",
    )
    .unwrap();
    let o = Command::new(BIN).arg("--check").arg(&bad).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    let e = err(&o);
    assert!(e.starts_with(&format!("{}:4:11: ", bad.display())), "{e}");
    assert_eq!(e.lines().count(), 1, "{e}");

    // A core this machine does not have is found by --check, not at start.
    let allowed = pollux_reactor::sys::allowed_cores().unwrap();
    let missing = (0..4096).find(|c| !allowed.contains(c)).unwrap();
    let cores = d.join("cores.toml");
    std::fs::write(
        &cores,
        format!("[reactors]\ncores = [{missing}]\n[[listener]]\naddress = \"127.0.0.1:4420\"\n"),
    )
    .unwrap();
    let o = Command::new(BIN).arg("--check").arg(&cores).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    let e = err(&o);
    assert!(e.starts_with(&format!("{}:2:9: ", cores.display())), "{e}");
    assert!(e.contains(&format!("core {missing}")), "{e}");

    let good = d.join("good.toml");
    std::fs::write(
        &good,
        "[reactors]\ncores = [0]\n[[listener]]\naddress = \"127.0.0.1:4420\"\n",
    )
    .unwrap();
    let o = Command::new(BIN).arg("--check").arg(&good).output().unwrap();
    assert!(o.status.success(), "{}", err(&o));
    assert!(
        out(&o).starts_with(&format!("{}: valid", good.display())),
        "{}",
        out(&o)
    );
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn version_names_pollux_and_its_commit() {
    let o = Command::new(BIN).arg("--version").output().unwrap();
    assert!(o.status.success());
    let v = out(&o);
    assert!(
        v.starts_with(&format!("pollux {} (commit ", env!("CARGO_PKG_VERSION"))),
        "{v}"
    );
    assert!(v.contains(pollux_target::BUILD_COMMIT), "{v}");
}
