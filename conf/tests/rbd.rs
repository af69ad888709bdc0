//! The `rbd` backend's conf: defaults, checks with positions, identifiers and round trips.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use pollux_conf::{Backend, Config, RBD_OP_TIMEOUT_S, RbdBackend};

const HEAD: &str = "[reactors]\ncores = [0]\n[[listener]]\naddress = \"127.0.0.1:4420\"\n\
[[subsystem]]\nnqn = \"nqn.2026-12.io.pollux:rbd\"\nallow_any_host = true\n[[subsystem.namespace]]\n";

/// A conf whose namespace (nsid 1) has `backend` on line 10.
fn conf(backend: &str) -> String {
    format!("{HEAD}nsid = 1\nbackend = {{ rbd = {{ {backend} }} }}\n")
}

fn rbd(c: &Config) -> &RbdBackend {
    match &c.subsystems[0].namespaces[0].backend {
        Backend::Rbd(r) => r,
        other => panic!("not rbd: {other:?}"),
    }
}

#[track_caller]
fn assert_err(text: &str, line: usize, col: usize, needle: &str) {
    let e = match Config::parse(text, "t.toml") {
        Ok(c) => panic!("parsed, expected an error:\n{text}\n{c:?}"),
        Err(e) => e,
    };
    assert_eq!(
        (e.line(), e.column()),
        (Some(line), Some(col)),
        "wrong position for {e}"
    );
    assert!(e.message().contains(needle), "{e} lacks {needle:?}");
}

#[test]
fn defaults_and_every_key() {
    let c = Config::parse(&conf("pool = \"rbd\", image = \"img0\""), "t.toml").unwrap_or_else(|e| panic!("{e}"));
    let r = rbd(&c);
    assert_eq!((r.pool.as_str(), r.image.as_str()), ("rbd", "img0"));
    assert_eq!(r.ceph_conf, PathBuf::from("/etc/ceph/ceph.conf"));
    assert_eq!(r.user, "admin");
    assert_eq!((r.keyring.as_ref(), r.rados_namespace.as_ref()), (None, None));
    assert!(!r.write_cache, "the cache is off by default");
    assert_eq!(r.op_timeout_s, RBD_OP_TIMEOUT_S);
    assert_eq!(r.spec(), "rbd/img0");
    assert_eq!(c.subsystems[0].namespaces[0].backend.kind(), "rbd");
    let n = &c.subsystems[0].namespaces[0];
    assert!(!n.given_ids.uuid && !n.given_ids.nguid && !n.given_ids.eui64);

    let dir = std::env::temp_dir().join(format!("pollux-conf-rbd-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    let keyring = dir.join("client.gw.keyring");
    std::fs::write(&keyring, "[client.gw]\n\tkey = x\n").unwrap_or_else(|e| panic!("{e}"));
    std::fs::set_permissions(&keyring, std::fs::Permissions::from_mode(0o600)).unwrap_or_else(|e| panic!("{e}"));
    let text = conf(&format!(
        "pool = \"p\", image = \"i\", rados_namespace = \"tenant-a\", ceph_conf = \"ceph.conf\", user = \"gw\", keyring = {:?}, write_cache = true, op_timeout_s = 30",
        keyring.display()
    ));
    let c = Config::parse(&text, dir.join("t.toml").to_str().unwrap_or("t.toml")).unwrap_or_else(|e| panic!("{e}"));
    let r = rbd(&c);
    assert_eq!(r.spec(), "p/tenant-a/i");
    assert_eq!(r.user, "gw");
    assert_eq!(r.keyring.as_deref(), Some(keyring.as_path()));
    assert!(r.write_cache);
    assert_eq!(r.op_timeout_s, 30);
    assert!(r.ceph_conf.is_absolute(), "{}", r.ceph_conf.display());

    // Written back and read again: the same conf, the identifiers left to derive.
    let back = c.to_toml();
    assert!(
        !back.contains("nguid"),
        "derived ids of an rbd namespace are not written:\n{back}"
    );
    let again = Config::parse(&back, "t.toml").unwrap_or_else(|e| panic!("{e}\n{back}"));
    assert_eq!(rbd(&again), r);

    // A keyring others can read is refused, as key files are.
    std::fs::set_permissions(&keyring, std::fs::Permissions::from_mode(0o644)).unwrap_or_else(|e| panic!("{e}"));
    let e = Config::parse(&text, "t.toml").expect_err("0644 keyring");
    assert!(e.message().contains("readable by its owner only"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn given_identifiers_are_kept_and_written() {
    let text = format!(
        "{HEAD}nsid = 1\nnguid = \"0123456789abcdef0123456789abcdef\"\nbackend = {{ rbd = {{ pool = \"rbd\", image = \"i\" }} }}\n"
    );
    let c = Config::parse(&text, "t.toml").unwrap_or_else(|e| panic!("{e}"));
    let n = &c.subsystems[0].namespaces[0];
    assert!(n.given_ids.nguid && !n.given_ids.uuid);
    let back = c.to_toml();
    assert!(back.contains("nguid = \"0123456789abcdef0123456789abcdef\""), "{back}");
    assert!(!back.contains("uuid ="), "{back}");
}

#[test]
fn bad_rbd_keys_are_located() {
    assert_err(&conf("image = \"i\""), 10, 19, "missing key `pool`");
    assert_err(
        &conf("pool = \"\", image = \"i\""),
        10,
        28,
        "`pool` \"\" must not be empty",
    );
    assert_err(&conf("pool = \"rbd\", image = \"a/b\""), 10, 43, "must not contain '/'");
    assert_err(
        &conf("pool = \"rbd\", image = \"a@snap\""),
        10,
        43,
        "must not contain '/', '@'",
    );
    assert_err(
        &conf("pool = \"rbd\", image = \"i\", user = \"client.admin\""),
        10,
        55,
        "write \"admin\"",
    );
    assert_err(
        &conf("pool = \"rbd\", image = \"i\", op_timeout_s = 0"),
        10,
        63,
        "`op_timeout_s` must be between 1 and 300",
    );
    assert_err(
        &conf("pool = \"rbd\", image = \"i\", keyring = \"/nonexistent/k\""),
        10,
        58,
        "`keyring` /nonexistent/k: cannot be read",
    );
    assert_err(
        &conf("pool = \"rbd\", image = \"i\", cache = true"),
        10,
        48,
        "unknown key `cache`, expected one of `pool`, `image`",
    );
    assert_err(
        &format!("{HEAD}nsid = 1\nbackend = {{ ram = {{ size = 512 }}, rbd = {{ pool = \"p\", image = \"i\" }} }}\n"),
        10,
        50,
        "two backends, `ram` and `rbd`",
    );
    // One image backs one namespace of a target.
    let two = format!(
        "{}[[subsystem.namespace]]\nnsid = 2\nbackend = {{ rbd = {{ pool = \"rbd\", image = \"img0\" }} }}\n",
        conf("pool = \"rbd\", image = \"img0\"")
    );
    assert_err(&two, 13, 43, "RBD image rbd/img0 is already the backend of namespace 1");
    // The same image name in another RADOS namespace is another image.
    let other = format!(
        "{}[[subsystem.namespace]]\nnsid = 2\nbackend = {{ rbd = {{ pool = \"rbd\", image = \"img0\", rados_namespace = \"b\" }} }}\n",
        conf("pool = \"rbd\", image = \"img0\"")
    );
    Config::parse(&other, "t.toml").unwrap_or_else(|e| panic!("{e}"));
}
