//! `save` keeps the operator's conf file: comments, order, relative paths and what was left
//! to defaults survive run-time changes, the previous version is kept, the write is atomic,
//! and a conf that comes to hold a key inline is written owner-only. A change the conf
//! refuses is reported in the terms of its params.
#![allow(missing_docs, clippy::unwrap_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use pollux_conf::{Config, DhchapKey, HashId};
use pollux_target::control::{Client, ControlError, ControlServer};
use pollux_target::{Options, Target};
use serde_json::json;

const A: &str = "nqn.2026-12.io.pollux:save-a";
const B: &str = "nqn.2026-12.io.pollux:save-b";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:5a5a5a5a-0000-4000-8000-000000000001";

fn dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("pollux-save-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn text(sock: &str) -> String {
    format!(
        r#"# The operator's own words: kept by every save.
[reactors]
cores = [0]
mode = "interrupt"   # no busy polling on a test machine

[[listener]]
address = "127.0.0.1:0"

[control]
socket = "{sock}"

# First subsystem: a file namespace by a relative path.
[[subsystem]]
nqn = "{A}"
allow_any_host = true

[[subsystem.namespace]]
nsid = 1
backend = {{ file = {{ path = "disk.img", size = "4MiB" }} }}

# Second subsystem, after the first.
[[subsystem]]
nqn = "{B}"
allow_any_host = true

[[subsystem.namespace]]
nsid = 1
backend = {{ ram = {{ size = "4MiB" }} }}
"#
    )
}

fn rpc_err(r: Result<serde_json::Value, ControlError>) -> String {
    match r {
        Err(ControlError::Rpc { message, .. }) => message,
        other => panic!("expected an RPC error, got {other:?}"),
    }
}

#[test]
fn save_edits_the_operators_file_in_place() {
    let d = dir();
    let conf = d.join("pollux.toml");
    let sock = d.join("ctl.sock");
    let original = text(sock.to_str().unwrap());
    std::fs::write(&conf, &original).unwrap();
    std::fs::set_permissions(&conf, std::fs::Permissions::from_mode(0o644)).unwrap();
    let cfg = Config::from_path(&conf).unwrap();
    let target = Target::start(&cfg, Options { pin: false }).unwrap();
    let ctl = ControlServer::start(&target, &cfg).unwrap();
    let mut c = Client::connect(&sock).unwrap();

    // A change the conf refuses names the param and the value given, not a line of a
    // document the caller never saw.
    let msg = rpc_err(c.call(
        "add_namespace",
        json!({"nqn": A, "nsid": 2, "backend": {"ram": {"size": "1.5GiB"}}}),
    ));
    assert!(msg.contains("backend.ram.size") && msg.contains("\"1.5GiB\""), "{msg}");
    assert!(!msg.contains(":55:") && !msg.contains("<control>"), "{msg}");

    // Changes: a namespace into the FIRST subsystem, a host with an inline key, a policy.
    c.call(
        "add_namespace",
        json!({"nqn": A, "nsid": 2, "backend": {"ram": {"size": "8MiB"}}}),
    )
    .unwrap();
    let key = DhchapKey::generate(Some(HashId::Sha256), 32)
        .unwrap()
        .encode()
        .to_string();
    c.call("add_host", json!({"nqn": B, "host": HOST, "dhchap_key": key}))
        .unwrap();
    c.call("set_allow_any_host", json!({"nqn": B, "allow": false})).unwrap();
    c.call("set_polling", json!({"nqn": B, "nsid": 1, "polling": "never"}))
        .unwrap();
    let r = c.call("save", json!({})).unwrap();
    assert_eq!(r["mode"], "0600", "{r}");

    let saved = std::fs::read_to_string(&conf).unwrap();
    for kept in [
        "# The operator's own words: kept by every save.",
        "mode = \"interrupt\"   # no busy polling on a test machine",
        "# First subsystem: a file namespace by a relative path.",
        "path = \"disk.img\"",
    ] {
        assert!(saved.contains(kept), "lost {kept:?}:\n{saved}");
    }
    for derived in [
        "serial",
        "uuid",
        "nguid",
        "eui64",
        "model",
        "placement",
        "max_io_queues",
    ] {
        assert!(
            !saved.contains(&format!("{derived} =")),
            "wrote the default {derived:?}:\n{saved}"
        );
    }
    assert!(
        saved.find(&format!("nqn = \"{B}\"")).unwrap() > saved.find("nsid = 2").unwrap(),
        "the new namespace is not under the first subsystem:\n{saved}"
    );
    // Owner-only: it now holds a key. The previous version is kept as it was.
    let mode = std::fs::metadata(&conf).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let bak = d.join("pollux.toml.bak");
    assert_eq!(std::fs::read_to_string(&bak).unwrap(), original);
    // It loads back to the running state (from_path: the mode check passes).
    let back = Config::from_path(&conf).unwrap();
    let a = back.subsystems.iter().find(|s| s.nqn == A).unwrap();
    assert_eq!(a.namespaces.len(), 2);
    let b = back.subsystems.iter().find(|s| s.nqn == B).unwrap();
    assert!(b.host_keys.contains_key(HOST));
    assert_eq!(b.namespaces[0].polling, Some(pollux_conf::Polling::Never));

    // Saved elsewhere, a relative path would name another file: refused, nothing written.
    let other = std::env::temp_dir().join(format!("pollux-save-elsewhere-{}", std::process::id()));
    std::fs::create_dir_all(&other).unwrap();
    let msg = rpc_err(c.call("save", json!({"path": other.join("p.toml").to_str().unwrap()})));
    assert!(msg.contains("relative paths"), "{msg}");
    assert!(!other.join("p.toml").exists());
    // Next to it, fine.
    c.call("save", json!({"path": d.join("copy.toml").to_str().unwrap()}))
        .unwrap();
    assert_eq!(std::fs::read_to_string(d.join("copy.toml")).unwrap(), saved);

    drop(c);
    drop(ctl);
    target.shutdown().unwrap();
    let _ = std::fs::remove_dir_all(&d);
    let _ = std::fs::remove_dir_all(&other);
}
