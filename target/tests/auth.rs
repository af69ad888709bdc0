//! DH-HMAC-CHAP (NVMe 2.0 §8.13.5) end to end with the host library: every queue of a host
//! with keys authenticates after its Connect, with each hash and DH group, one way and both
//! ways; wrong, missing and out-of-order input is refused with AUTH_Failure1 or a status and
//! leaves nothing usable; keys, and a host's own hashes and DH groups, change at run time
//! and a live queue re-authenticates with them. The
//! Linux host's side of the same is the guest scenario `pollux-auth`.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use pollux_host::{Controller, ControllerOpts, HostDhchap, HostError, HostQueue, QueueOpts, RECEIVE_LEN};
use pollux_nvme::auth::msg::{Message, Negotiate, Reason, Reply};
use pollux_nvme::auth::{DhGroup, DhchapKey, HashId, Transaction};
use pollux_nvme::spec::property;
use pollux_target::Target;
use pollux_target::control::rpc::Ctx;
use serde_json::json;

const SUB: &str = "nqn.2026-11.io.pollux:secure";

fn key(hash: Option<HashId>) -> DhchapKey {
    DhchapKey::generate(hash, hash.map_or(32, HashId::output_len)).unwrap()
}

/// A target whose subsystem admits HOST with `host_key` (and `ctrl_key`), and `lists`.
fn start_secure(host_key: &DhchapKey, ctrl_key: Option<&DhchapKey>, lists: &str) -> (Target, Ctx) {
    let ctrl = ctrl_key.map_or(String::new(), |k| format!(", dhchap_ctrl_key = \"{}\"", *k.encode()));
    let text = format!(
        r#"
[reactors]
cores = [0, 1]
mode = "interrupt"

[[listener]]
address = "127.0.0.1:0"

[[subsystem]]
nqn = "{SUB}"
hosts = [{{ nqn = "{HOST}", dhchap_key = "{}"{ctrl} }}, "nqn.2026-11.io.pollux:keyless"]
{lists}

[[subsystem.namespace]]
nsid = 1
backend = {{ ram = {{ size = "4MiB" }} }}
"#,
        *host_key.encode()
    );
    let (t, ctx) = start_with_ctx(&text);
    (t, ctx)
}

fn opts(cfg: Option<HostDhchap>) -> ControllerOpts {
    let mut o = ControllerOpts::new(SUB, HOST, 2, 32);
    o.dhchap = cfg;
    o
}

fn io_works(c: &mut Controller) {
    let data = pattern(1, 0, 4096);
    c.io[0].write(1, 0, 8, &data).unwrap();
    let mut back = vec![0u8; 4096];
    c.io[1].read(1, 0, 8, &mut back).unwrap();
    assert_eq!(back, data);
}

/// A queue past Connect that has not authenticated (the library's raw steps).
fn unauthenticated(t: &Target) -> HostQueue {
    let mut q = HostQueue::initialized(addr(t), QueueOpts::admin(SUB, HOST)).unwrap();
    let r = q.fabrics_connect().unwrap();
    assert!(r.status.is_success(), "{r:?}");
    assert_eq!(r.dw0 & (1 << 17), 1 << 17, "Connect response AUTHREQ ATR");
    q
}

fn auth_code(e: &HostError) -> Option<(u8, u8, bool)> {
    e.status().map(|s| (s.sct(), s.sc(), s.dnr()))
}

#[test]
fn every_queue_authenticates_with_each_hash_and_group() {
    let hk = key(Some(HashId::Sha256));
    let (t, _ctx) = start_secure(&hk, None, "");
    // Every hash, with the null group and ffdhe2048; the larger groups with SHA-512.
    let mut cases: Vec<(HashId, DhGroup)> = Vec::new();
    for h in HashId::ALL {
        cases.push((h, DhGroup::Null));
        cases.push((h, DhGroup::Ffdhe2048));
    }
    for g in [
        DhGroup::Ffdhe3072,
        DhGroup::Ffdhe4096,
        DhGroup::Ffdhe6144,
        DhGroup::Ffdhe8192,
    ] {
        cases.push((HashId::Sha512, g));
    }
    for (h, g) in cases {
        let mut cfg = HostDhchap::new(hk.clone(), None);
        cfg.hashes = vec![h];
        cfg.dh_groups = vec![g];
        let t0 = Instant::now();
        let mut c = Controller::connect_with(addr(&t), &opts(Some(cfg))).unwrap_or_else(|e| panic!("{h}/{g}: {e}"));
        let took = t0.elapsed();
        io_works(&mut c);
        c.shutdown().unwrap();
        eprintln!("{h} {g}: admin + 2 I/O queues authenticated in {took:?}");
    }
    t.shutdown().unwrap();
}

#[test]
fn bidirectional_authentication_proves_the_controller() {
    let (hk, ck) = (key(None), key(Some(HashId::Sha384)));
    let (t, _ctx) = start_secure(&hk, Some(&ck), "");
    let mut c = Controller::connect_with(addr(&t), &opts(Some(HostDhchap::new(hk.clone(), Some(ck.clone()))))).unwrap();
    io_works(&mut c);
    c.shutdown().unwrap();
    // A host holding another controller key refuses the controller (and says so).
    let e = Controller::connect_with(addr(&t), &opts(Some(HostDhchap::new(hk.clone(), Some(key(None)))))).unwrap_err();
    assert!(e.to_string().contains("controller's response does not match"), "{e}");
    t.shutdown().unwrap();
}

#[test]
fn wrong_and_missing_keys_leave_nothing_usable() {
    let hk = key(Some(HashId::Sha512));
    let (t, _ctx) = start_secure(&hk, None, "");
    // A wrong key: AUTH_Failure1, "authentication failed".
    let e =
        Controller::connect_with(addr(&t), &opts(Some(HostDhchap::new(key(Some(HashId::Sha512)), None)))).unwrap_err();
    assert!(e.to_string().contains("authentication failed"), "{e}");
    // No key at all: the Connect says authentication is required.
    let e = Controller::connect_with(addr(&t), &opts(None)).unwrap_err();
    assert!(e.to_string().contains("requires authentication"), "{e}");
    // A controller key the target does not have: Failure1.
    let e = Controller::connect_with(addr(&t), &opts(Some(HostDhchap::new(hk.clone(), Some(key(None)))))).unwrap_err();
    assert!(e.to_string().contains("authentication failed"), "{e}");
    // Before authenticating, nothing but Authentication Send/Receive runs: Property Get
    // (fabrics), Identify (admin) are Authentication Required with DNR.
    let mut q = unauthenticated(&t);
    let e = q.property_get(property::CAP).unwrap_err();
    assert_eq!(auth_code(&e), Some((1, 0x91, true)), "{e}");
    let e = q.identify_controller().unwrap_err();
    assert_eq!(auth_code(&e), Some((1, 0x91, true)), "{e}");
    // And after a failed exchange, still nothing.
    let mut cfg = HostDhchap::new(key(Some(HashId::Sha512)), None);
    cfg.dh_groups = vec![DhGroup::Null];
    assert!(q.authenticate(&cfg, 1, 0).is_err());
    assert_eq!(auth_code(&q.identify_controller().unwrap_err()), Some((1, 0x91, true)));
    // A keyless host of the same subsystem connects without authenticating.
    let mut o = ControllerOpts::new(SUB, "nqn.2026-11.io.pollux:keyless", 1, 32);
    o.dhchap = None;
    Controller::connect_with(addr(&t), &o).unwrap().shutdown().unwrap();
    t.shutdown().unwrap();
}

/// Negotiate for `hashes`/`groups` with transaction `t_id`.
fn negotiate(t_id: u16, hashes: &[u8], groups: &[u8]) -> Vec<u8> {
    Message::Negotiate(Negotiate {
        t_id,
        sc_c: 0,
        hashes: hashes.to_vec(),
        dh_groups: groups.to_vec(),
    })
    .encode()
}

#[test]
fn malformed_and_out_of_order_messages_get_failure1_never_a_queue() {
    let hk = key(None);
    let (t, _ctx) = start_secure(
        &hk,
        None,
        "dhchap_hashes = [\"sha256\"]\ndhchap_dh_groups = [\"null\", \"ffdhe2048\"]",
    );
    let mut q = unauthenticated(&t);
    // Command fields: SECP other than E9h, and a zero length, are Invalid Field.
    let mut s = pollux_host::sqe::fabrics_cmd(0x05);
    s.cdw10.set(0xE8 << 24 | 0x0101 << 8);
    s.cdw11.set(8);
    let c = q.exec_in_capsule(s, vec![0; 8]).unwrap();
    assert_eq!((c.status.sct(), c.status.sc(), c.status.dnr()), (0, 0x02, true));
    assert_eq!(auth_code(&q.auth_receive(0).unwrap_err()).map(|c| c.1), Some(0x02));
    // A Receive with nothing due; a Reply before any Negotiate.
    expect_auth_failure(&mut q, Reason::IncorrectMessage);
    let reply = Message::Reply(Reply {
        t_id: 1,
        r: vec![0; 32],
        cvalid: false,
        seq: 0,
        c2: vec![0; 32],
        dhv: vec![],
    })
    .encode();
    assert!(q.auth_send(&reply).unwrap().status.is_success());
    expect_auth_failure(&mut q, Reason::IncorrectMessage);
    // Garbage, a short message, no hash or group in common.
    q.auth_send(&[0xAB; 40]).unwrap();
    expect_auth_failure(&mut q, Reason::IncorrectMessage);
    q.auth_send(&[0, 0, 0, 0, 1, 0, 0]).unwrap();
    expect_auth_failure(&mut q, Reason::IncorrectPayload);
    q.auth_send(&negotiate(2, &[2, 3], &[0])).unwrap();
    expect_auth_failure(&mut q, Reason::HashUnusable);
    q.auth_send(&negotiate(3, &[1], &[3, 4])).unwrap();
    expect_auth_failure(&mut q, Reason::DhGroupUnusable);
    // A Reply whose DH value is huge, or 1 (a forced secret), after a real challenge.
    for dhv in [vec![7u8; 4000], {
        let mut one = vec![0u8; 256];
        one[255] = 1;
        one
    }] {
        q.auth_send(&negotiate(4, &[1], &[1])).unwrap();
        let ch = match Message::parse(&q.auth_receive(RECEIVE_LEN).unwrap()).unwrap() {
            Message::Challenge(c) => c,
            m => panic!("{m:?}"),
        };
        assert_eq!(
            (ch.hash, ch.dh, ch.dhv.len()),
            (HashId::Sha256, DhGroup::Ffdhe2048, 256)
        );
        let r = Message::Reply(Reply {
            t_id: 4,
            r: vec![0; 32],
            cvalid: false,
            seq: 0,
            c2: vec![0; 32],
            dhv,
        })
        .encode();
        q.auth_send(&r).unwrap();
        expect_auth_failure(&mut q, Reason::IncorrectPayload);
    }
    // Still unauthenticated after all of it.
    assert_eq!(auth_code(&q.identify_controller().unwrap_err()), Some((1, 0x91, true)));
    // A replayed Reply: the one that authenticated a first exchange fails a second (with a
    // new challenge); the queue authenticates with a genuine one.
    let reply_to = |q: &mut HostQueue, t_id: u16| -> Vec<u8> {
        q.auth_send(&negotiate(t_id, &[1], &[0])).unwrap();
        let ch = match Message::parse(&q.auth_receive(RECEIVE_LEN).unwrap()).unwrap() {
            Message::Challenge(c) => c,
            m => panic!("{m:?}"),
        };
        let tx = Transaction {
            hash: ch.hash,
            t_id,
            sc_c: 0,
            hostnqn: HOST,
            subnqn: SUB,
        };
        let r1 = tx.host_response(&hk.transform(HOST), &ch.c, ch.seq);
        Message::Reply(Reply {
            t_id,
            r: r1.to_vec(),
            cvalid: false,
            seq: 0,
            c2: vec![0; 32],
            dhv: vec![],
        })
        .encode()
    };
    let first = reply_to(&mut q, 10);
    q.auth_send(&first).unwrap();
    assert!(matches!(
        Message::parse(&q.auth_receive(RECEIVE_LEN).unwrap()),
        Ok(Message::Success1 { r2: None, .. })
    ));
    let _second = reply_to(&mut q, 10);
    q.auth_send(&first).unwrap();
    expect_auth_failure(&mut q, Reason::Failed);
    // A failed re-authentication takes the queue's authentication away.
    assert_eq!(
        auth_code(&q.property_get(property::CAP).unwrap_err()),
        Some((1, 0x91, true))
    );
    let mut cfg = HostDhchap::new(hk.clone(), None);
    cfg.dh_groups = vec![DhGroup::Null];
    q.authenticate(&cfg, 11, 0).unwrap();
    q.property_get(property::CAP).unwrap();
    t.shutdown().unwrap();
}

#[test]
fn a_host_that_stalls_mid_exchange_is_dropped() {
    let hk = key(None);
    let (t, _ctx) = start_secure(&hk, None, "");
    let mut q = unauthenticated(&t);
    q.auth_send(&negotiate(1, &[1], &[0])).unwrap();
    let t0 = Instant::now();
    // No Reply ever, only Receives (each failing the exchange anew): the target closes the
    // queue at the deadline its Connect started.
    loop {
        match q.auth_receive(RECEIVE_LEN) {
            Ok(_) => std::thread::sleep(Duration::from_millis(500)),
            Err(e) => {
                assert!(matches!(e, HostError::Closed | HostError::Io(_)), "{e}");
                break;
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(45),
            "the stalled queue was never closed"
        );
    }
    let took = t0.elapsed();
    assert!(took >= Duration::from_secs(28), "closed after {took:?}");
    t.shutdown().unwrap();
}

#[test]
fn keys_change_at_run_time_and_live_queues_reauthenticate() {
    let (hk1, hk2) = (key(Some(HashId::Sha256)), key(Some(HashId::Sha256)));
    let (t, ctx) = start_secure(&hk1, None, "");
    let mut c = Controller::connect_with(addr(&t), &opts(Some(HostDhchap::new(hk1.clone(), None)))).unwrap();
    // The controller listing says how it authenticated (the subsystem's first choices).
    let ctrls = ctx.call("controllers", &serde_json::Value::Null).unwrap().to_string();
    assert!(ctrls.contains("\"authenticated\":\"sha256/ffdhe2048\""), "{ctrls}");
    // Rotate the host's key through the control socket: connected queues keep working.
    ctx.call(
        "set_host_keys",
        &json!({"nqn": SUB, "host": HOST, "dhchap_key": *hk2.encode()}),
    )
    .unwrap();
    io_works(&mut c);
    // The host re-authenticates each live queue with the new key (as Linux does after a
    // write to sysfs dhchap_secret), and the old key no longer authenticates anything.
    let new = HostDhchap::new(hk2.clone(), None);
    c.admin.authenticate(&new, 100, 0).unwrap();
    for (i, q) in c.io.iter_mut().enumerate() {
        q.authenticate(&new, 101 + i as u16, 0).unwrap();
    }
    io_works(&mut c);
    let e = Controller::connect_with(addr(&t), &opts(Some(HostDhchap::new(hk1.clone(), None)))).unwrap_err();
    assert!(e.to_string().contains("authentication failed"), "{e}");
    Controller::connect_with(addr(&t), &opts(Some(new.clone())))
        .unwrap()
        .shutdown()
        .unwrap();
    // Re-authenticating with the old key fails, and the queue is unauthenticated again.
    assert!(
        c.io[1]
            .authenticate(&HostDhchap::new(hk1.clone(), None), 110, 0)
            .is_err()
    );
    let e = c.io[1].read(1, 0, 8, &mut vec![0u8; 4096]).unwrap_err();
    assert_eq!(auth_code(&e), Some((1, 0x91, true)), "{e}");
    c.io[1].authenticate(&new, 111, 0).unwrap();
    io_works(&mut c);

    // A new host with a controller key from an owner-only key file.
    let dir = std::env::temp_dir().join(format!("pollux-auth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (h3, c3) = (key(None), key(Some(HashId::Sha512)));
    let (hf, cf) = (dir.join("h3.key"), dir.join("c3.key"));
    for (p, k) in [(&hf, &h3), (&cf, &c3)] {
        std::fs::write(p, format!("{}\n", *k.encode())).unwrap();
        std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    }
    let host3 = "nqn.2026-11.io.pollux:host3";
    ctx.call(
        "add_host",
        &json!({"nqn": SUB, "host": host3, "dhchap_key_file": hf, "dhchap_ctrl_key_file": cf}),
    )
    .unwrap();
    let mut o = ControllerOpts::new(SUB, host3, 1, 32);
    o.dhchap = Some(HostDhchap::new(h3.clone(), Some(c3.clone())));
    Controller::connect_with(addr(&t), &o).unwrap().shutdown().unwrap();
    // The subsystem listing names who must authenticate, never a key.
    let subs = ctx.call("subsystems", &serde_json::Value::Null).unwrap().to_string();
    assert!(subs.contains(&format!("{host3} +ctrl")), "{subs}");
    assert!(!subs.contains(&h3.encode()[10..30]) && !subs.contains(&hk2.encode()[10..30]));
    // Saving keeps the key files as files.
    let saved = dir.join("saved.toml");
    ctx.call("save", &json!({"path": saved})).unwrap();
    let text = std::fs::read_to_string(&saved).unwrap();
    assert!(
        text.contains(&format!("dhchap_key_file = \"{}\"", hf.display())),
        "{text}"
    );
    assert!(
        !text.contains(&h3.encode()[10..30]),
        "a key file's secret was saved inline"
    );
    // A bad key, or a key file others can read, changes nothing and never echoes the key.
    let bad = format!("{}x:", &hk2.encode()[..hk2.encode().len() - 1]);
    let e = ctx
        .call("set_host_keys", &json!({"nqn": SUB, "host": HOST, "dhchap_key": bad}))
        .unwrap_err();
    assert!(!e.message.contains(&bad[10..30]), "{}", e.message);
    std::fs::set_permissions(&hf, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let e = ctx
        .call(
            "set_host_keys",
            &json!({"nqn": SUB, "host": host3, "dhchap_key_file": hf}),
        )
        .unwrap_err();
    assert!(e.message.contains("mode 0644"), "{}", e.message);
    Controller::connect_with(addr(&t), &opts(Some(new)))
        .unwrap()
        .shutdown()
        .unwrap();
    c.shutdown().unwrap();
    t.shutdown().unwrap();
}

/// The `controllers` listing's entry of controller `cntlid`.
fn listed(ctx: &Ctx, cntlid: u16) -> Option<serde_json::Value> {
    let list = ctx.call("controllers", &serde_json::Value::Null).unwrap();
    list["controllers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["cntlid"] == cntlid)
        .cloned()
}

/// The same creation time (the listing derives it from the clock at each call).
fn same_created(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    let t = |v: &serde_json::Value| v["created_unix_s"].as_f64().unwrap();
    (t(a) - t(b)).abs() < 0.5
}

#[test]
fn a_hosts_own_hash_and_group_apply_to_its_next_reauthentication() {
    // Linux nvmet's per-host dhchap_hash and dhchap_dhgroup, changed on a live controller
    // (blktests nvme/045): NVMe 2.0 §8.13.5.1, the controller picks from the host's lists.
    let (hk1, hk2) = (key(Some(HashId::Sha256)), key(Some(HashId::Sha512)));
    let (t, ctx) = start_secure(&hk1, None, "");
    let old = HostDhchap::new(hk1.clone(), None);
    let mut c = Controller::connect_with(addr(&t), &opts(Some(old.clone()))).unwrap();
    let before = listed(&ctx, c.cntlid).unwrap();
    assert_eq!(before["authenticated"], "sha256/ffdhe2048", "{before}");

    // The host gets a new key and its own lists, through the control plane as `pollux ctl
    // set-host-keys --dhchap-hashes sha512 --dhchap-dh-groups ffdhe3072` sends them.
    let changes = ctx
        .call(
            "set_host_keys",
            &json!({"nqn": SUB, "host": HOST, "dhchap_key": *hk2.encode(),
                    "dhchap_hashes": ["sha512"], "dhchap_dh_groups": ["ffdhe3072"]}),
        )
        .unwrap();
    assert_eq!(changes["changed_subsystems"], json!([SUB]), "{changes}");
    // The live controller stays, with every queue, authenticated as it was.
    let after = listed(&ctx, c.cntlid).expect("the change dropped the controller");
    assert!(same_created(&after, &before), "{after} {before}");
    assert_eq!(after["authenticated"], "sha256/ffdhe2048", "{after}");
    io_works(&mut c);
    c.admin.keep_alive().unwrap();

    // Its next re-authentication, offering everything as Linux does, negotiates the
    // host's own hash and group with the new key, on the admin queue and each I/O queue.
    let new = HostDhchap::new(hk2.clone(), None);
    let info = c.admin.authenticate(&new, 200, 0).unwrap();
    assert_eq!((info.hash, info.dh), (HashId::Sha512, DhGroup::Ffdhe3072));
    for (i, q) in c.io.iter_mut().enumerate() {
        let info = q.authenticate(&new, 201 + i as u16, 0).unwrap();
        assert_eq!((info.hash, info.dh), (HashId::Sha512, DhGroup::Ffdhe3072));
    }
    io_works(&mut c);
    let now = listed(&ctx, c.cntlid).unwrap();
    assert_eq!(now["authenticated"], "sha512/ffdhe3072", "{now}");
    assert!(same_created(&now, &before), "{now} {before}");

    // A re-authentication offering only the old hash (or only the old group) is refused
    // with AUTH_Failure1, and the queue is unauthenticated until it authenticates again
    // (as any failed re-authentication leaves it: the controller stays).
    let mut only_old = new.clone();
    only_old.hashes = vec![HashId::Sha256];
    let e = c.io[0].authenticate(&only_old, 210, 0).unwrap_err();
    assert!(e.to_string().contains("no hash function in common"), "{e}");
    let e = c.io[0].write(1, 0, 8, &pattern(2, 0, 4096)).unwrap_err();
    assert_eq!(auth_code(&e), Some((1, 0x91, true)), "{e}");
    let mut old_group = new.clone();
    old_group.dh_groups = vec![DhGroup::Ffdhe2048, DhGroup::Null];
    let e = c.admin.authenticate(&old_group, 211, 0).unwrap_err();
    assert!(e.to_string().contains("no DH group in common"), "{e}");
    assert_eq!(
        auth_code(&c.admin.identify_controller().unwrap_err()),
        Some((1, 0x91, true))
    );
    assert!(
        listed(&ctx, c.cntlid).is_some(),
        "a failed re-authentication dropped the controller"
    );
    c.admin.authenticate(&new, 212, 0).unwrap();
    c.io[0].authenticate(&new, 213, 0).unwrap();
    io_works(&mut c);
    // The old key no longer authenticates, whatever it offers.
    assert!(c.io[1].authenticate(&old, 214, 0).is_err());
    c.io[1].authenticate(&new, 215, 0).unwrap();
    io_works(&mut c);

    // A new connection of this host gets its lists too; another host of the subsystem
    // keeps the subsystem's (every hash and group, SHA-256 and ffdhe2048 first). The list
    // may come as one comma-separated string (`ctl call`).
    let c2 = Controller::connect_with(addr(&t), &opts(Some(new.clone()))).unwrap();
    assert_eq!(listed(&ctx, c2.cntlid).unwrap()["authenticated"], "sha512/ffdhe3072");
    c2.shutdown().unwrap();
    let (host3, k3) = ("nqn.2026-11.io.pollux:host3", key(None));
    ctx.call(
        "add_host",
        &json!({"nqn": SUB, "host": host3, "dhchap_key": *k3.encode()}),
    )
    .unwrap();
    let mut o = ControllerOpts::new(SUB, host3, 1, 32);
    o.dhchap = Some(HostDhchap::new(k3.clone(), None));
    let c3 = Controller::connect_with(addr(&t), &o).unwrap();
    assert_eq!(listed(&ctx, c3.cntlid).unwrap()["authenticated"], "sha256/ffdhe2048");
    c3.shutdown().unwrap();
    ctx.call(
        "set_host_keys",
        &json!({"nqn": SUB, "host": host3, "dhchap_key": *k3.encode(), "dhchap_hashes": "sha384, sha512"}),
    )
    .unwrap();
    let c3 = Controller::connect_with(addr(&t), &o).unwrap();
    assert_eq!(listed(&ctx, c3.cntlid).unwrap()["authenticated"], "sha384/ffdhe2048");
    c3.shutdown().unwrap();

    // Refused, changing nothing: an unknown name (the param and value named), a list
    // without a key (naming the key), a list that is not of strings. Never a key echoed.
    let e = ctx
        .call(
            "set_host_keys",
            &json!({"nqn": SUB, "host": HOST, "dhchap_key": *hk1.encode(), "dhchap_hashes": ["md5"]}),
        )
        .unwrap_err();
    assert!(
        e.message.contains("dhchap_hashes") && e.message.contains("md5"),
        "{}",
        e.message
    );
    assert!(!e.message.contains(&hk1.encode()[10..30]), "{}", e.message);
    let e = ctx
        .call(
            "set_host_keys",
            &json!({"nqn": SUB, "host": HOST, "dhchap_dh_groups": ["null"]}),
        )
        .unwrap_err();
    assert!(
        e.message.contains("without a `dhchap_key` or `dhchap_key_file`"),
        "{}",
        e.message
    );
    let e = ctx
        .call(
            "set_host_keys",
            &json!({"nqn": SUB, "host": HOST, "dhchap_key": *hk1.encode(), "dhchap_hashes": [512]}),
        )
        .unwrap_err();
    assert!(e.message.contains("array of strings"), "{}", e.message);
    // ... so the host's lists and key are still the new ones.
    c.admin.authenticate(&new, 220, 0).unwrap();
    assert_eq!(listed(&ctx, c.cntlid).unwrap()["authenticated"], "sha512/ffdhe3072");

    // Saved as given; without lists, set_host_keys gives the host the subsystem's again.
    let dir = std::env::temp_dir().join(format!("pollux-auth-lists-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let saved = dir.join("saved.toml");
    ctx.call("save", &json!({"path": saved})).unwrap();
    let text = std::fs::read_to_string(&saved).unwrap();
    assert!(
        text.contains("dhchap_hashes = [\"sha512\"], dhchap_dh_groups = [\"ffdhe3072\"]"),
        "{text}"
    );
    ctx.call(
        "set_host_keys",
        &json!({"nqn": SUB, "host": HOST, "dhchap_key": *hk2.encode()}),
    )
    .unwrap();
    let info = c.admin.authenticate(&new, 230, 0).unwrap();
    assert_eq!((info.hash, info.dh), (HashId::Sha256, DhGroup::Ffdhe2048));
    io_works(&mut c);
    let _ = std::fs::remove_dir_all(&dir);
    c.shutdown().unwrap();
    t.shutdown().unwrap();
}

#[test]
fn the_discovery_controller_can_require_authentication() {
    let hk = key(Some(HashId::Sha384));
    let text = format!(
        r#"
[reactors]
cores = [0]

[[listener]]
address = "127.0.0.1:0"

[discovery]
hosts = [{{ nqn = "{HOST}", dhchap_key = "{}" }}]
require_authentication = true
dhchap_dh_groups = ["ffdhe2048"]

[[subsystem]]
nqn = "{SUB}"
allow_any_host = true
"#,
        *hk.encode()
    );
    let t = start_text(&text);
    let disc = pollux_conf::DISCOVERY_NQN;
    let mut o = ControllerOpts::new(disc, HOST, 0, 32);
    o.dhchap = Some(HostDhchap::new(hk.clone(), None));
    let mut c = Controller::connect_with(addr(&t), &o).unwrap();
    let log = c.admin.discovery_log().unwrap();
    assert_eq!(log.entries.iter().filter(|e| e.subtype == 2).count(), 1);
    c.shutdown().unwrap();
    // Without a key, or with another: refused.
    o.dhchap = None;
    let e = Controller::connect_with(addr(&t), &o).unwrap_err();
    assert!(e.to_string().contains("requires authentication"), "{e}");
    o.dhchap = Some(HostDhchap::new(key(Some(HashId::Sha384)), None));
    assert!(Controller::connect_with(addr(&t), &o).is_err());
    // A host the table does not name may not even connect.
    let o = ControllerOpts::new(disc, "nqn.2026-11.io.pollux:stranger", 0, 32);
    let e = Controller::connect_with(addr(&t), &o).unwrap_err();
    assert_eq!(e.status().map(|s| (s.sct(), s.sc())), Some((1, 0x84)), "{e}");
    t.shutdown().unwrap();
}

#[test]
fn keep_alive_waits_while_a_slow_host_authenticates() {
    // KATO 1 s, and a host that takes 2.5 s between its Negotiate and its Reply (the
    // Linux host's first use of a large group under emulation takes seconds).
    let hk = key(None);
    let (t, _ctx) = start_secure(&hk, None, "");
    let mut o = QueueOpts::admin(SUB, HOST);
    o.kato_ms = 1000;
    let mut q = HostQueue::initialized(addr(&t), o).unwrap();
    assert!(q.fabrics_connect().unwrap().status.is_success());
    std::thread::sleep(Duration::from_millis(2500));
    let mut cfg = HostDhchap::new(hk.clone(), None);
    cfg.dh_groups = vec![DhGroup::Ffdhe2048];
    q.authenticate(&cfg, 1, 0).unwrap();
    q.property_get(property::CAP).unwrap();
    // From here on keep-alive runs: without one the controller goes.
    std::thread::sleep(Duration::from_millis(2500));
    assert!(
        q.property_get(property::CAP).is_err(),
        "no keep-alive for 2.5 s with KATO 1 s"
    );
    t.shutdown().unwrap();
}
