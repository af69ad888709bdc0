//! Secure channel concatenation (TP 8018) end to end with the host library, as the Linux
//! host's `nvme connect --concat` runs it: the admin queue authenticates over plain TCP
//! asking for a new PSK (SC_C NEWTLSPSK), the generated PSK secures new TLS connections for
//! the admin and I/O queues, which then need no authentication of their own; REPLACETLSPSK
//! on the TLS admin queue replaces the key. Refused cleanly, with AUTH_Failure1 and no
//! authenticated queue: a subsystem or listener that does not allow it, an I/O queue, an
//! unknown or mismatched SC_C, a hash or group that cannot generate a PSK, a Reply without
//! C2, a replayed Reply; a TLS connection offering a generated identity the target does not
//! hold (made up, of another host, revoked, or of a host whose keys were removed) fails its
//! handshake. The Linux host's side of the same is the guest scenario `pollux-concat-linux`.
#![allow(clippy::unwrap_used)]

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use pollux_host::{
    Controller, ControllerOpts, ExchangeOpts, HostDhchap, HostError, HostQueue, HostTls, QueueOpts, RECEIVE_LEN,
};
use pollux_nvme::auth::msg::{Message, Negotiate, Reason, Reply};
use pollux_nvme::auth::{DhGroup, DhPrivate, DhchapKey, HashId, Transaction, augmented_challenge, sc_c};
use pollux_nvme::spec::property;
use pollux_nvme::tls::GeneratedPsk;
use pollux_target::Target;
use pollux_target::control::rpc::Ctx;
use serde_json::{Value, json};

const SUB: &str = "nqn.2026-11.io.pollux:concat";
const PLAIN_SUB: &str = "nqn.2026-11.io.pollux:noconcat";
const OTHER: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000b2";
/// Listener 0 takes TLS and plain TCP, listener 1 plain TCP only.
const ALLOWED: usize = 0;
const NO_TLS: usize = 1;
const WAIT: Duration = Duration::from_secs(5);

fn key() -> DhchapKey {
    DhchapKey::generate(Some(HashId::Sha256), 32).unwrap()
}

/// A target with SUB (concatenation allowed) and PLAIN_SUB (not), both admitting HOST and
/// OTHER with `hk` and `ok`.
fn start(hk: &DhchapKey, ok: &DhchapKey) -> (Target, Ctx) {
    let hosts = format!(
        r#"hosts = [{{ nqn = "{HOST}", dhchap_key = "{}" }}, {{ nqn = "{OTHER}", dhchap_key = "{}" }}]
dhchap_hashes = ["sha512", "sha384", "sha256"]
dhchap_dh_groups = ["null", "ffdhe2048", "ffdhe3072"]"#,
        *hk.encode(),
        *ok.encode()
    );
    let text = format!(
        r#"
[reactors]
cores = [0, 1]
mode = "interrupt"

[[listener]]
address = "127.0.0.1:0"
tls = "allowed"

[[listener]]
address = "127.0.0.2:0"
tls = "none"

[[subsystem]]
nqn = "{SUB}"
secure_concat = true
{hosts}

[[subsystem.namespace]]
nsid = 1
backend = {{ ram = {{ size = "4MiB" }} }}

[[subsystem]]
nqn = "{PLAIN_SUB}"
{hosts}

[[subsystem.namespace]]
nsid = 1
backend = {{ ram = {{ size = "4MiB" }} }}
"#
    );
    start_with_ctx(&text)
}

fn at(t: &Target, listener: usize) -> SocketAddr {
    t.listen_addrs()[listener]
}

fn concat(hk: &DhchapKey) -> HostDhchap {
    let mut d = HostDhchap::new(hk.clone(), None);
    d.concat = true;
    d
}

fn opts(sub: &str, host: &str, d: HostDhchap) -> ControllerOpts {
    let mut o = ControllerOpts::new(sub, host, 2, 32);
    o.dhchap = Some(d);
    o
}

fn io_works(c: &mut Controller, seed: u64) {
    let data = pattern(seed, 0, 128 * 1024);
    c.io[0].write(1, 0, 256, &data).unwrap();
    let mut back = vec![0u8; data.len()];
    c.io[1].read(1, 0, 256, &mut back).unwrap();
    assert_eq!(back, data);
}

/// Controllers the target holds now (waiting a little for ones being torn down).
fn controllers(ctx: &Ctx, want: usize) -> Vec<Value> {
    let until = Instant::now() + WAIT;
    loop {
        let v = ctx.call("controllers", &Value::Null).unwrap();
        let list = v["controllers"].as_array().unwrap().clone();
        if list.len() == want || Instant::now() >= until {
            return list;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn negotiate(t_id: u16, sc: u8, hashes: &[u8], groups: &[u8]) -> Vec<u8> {
    Message::Negotiate(Negotiate {
        t_id,
        sc_c: sc,
        hashes: hashes.to_vec(),
        dh_groups: groups.to_vec(),
    })
    .encode()
}

/// An admin queue of `sub` past its Connect (which asks for authentication), over plain TCP.
fn unauthenticated(addr: SocketAddr, sub: &str) -> HostQueue {
    let mut q = HostQueue::initialized(addr, QueueOpts::admin(sub, HOST)).unwrap();
    let r = q.fabrics_connect().unwrap();
    assert!(r.status.is_success(), "{r:?}");
    assert_eq!(r.dw0 & (1 << 17), 1 << 17, "Connect response AUTHREQ ATR");
    q
}

#[track_caller]
fn unauthenticated_still(q: &mut HostQueue) {
    let e = q.property_get(property::CAP).unwrap_err();
    let s = e.status().unwrap();
    assert_eq!((s.sct(), s.sc(), s.dnr()), (1, 0x91, true), "{e}");
}

#[test]
fn the_generated_psk_secures_every_queue_with_either_hash() {
    let (hk, ok) = (key(), key());
    let (t, ctx) = start(&hk, &ok);
    for hashes in [vec![HashId::Sha256], vec![HashId::Sha384]] {
        let mut d = concat(&hk);
        d.hashes = hashes.clone();
        let mut c = Controller::connect_with(at(&t, ALLOWED), &opts(SUB, HOST, d)).unwrap();
        io_works(&mut c, u64::from(hashes[0].id()));
        // Every queue runs over TLS with the generated PSK's identity, and the plain
        // controller that generated it is gone: one controller, over TLS.
        for q in std::iter::once(&c.admin).chain(&c.io) {
            let tls = q.opts().tls.as_ref().unwrap();
            let id = tls.tls_psk(HOST, SUB).unwrap().identity;
            assert!(
                id.starts_with(&format!("NVMe1G{:02} {HOST} {SUB} ", hashes[0].id())),
                "{id}"
            );
        }
        let list = controllers(&ctx, 1);
        assert_eq!(list.len(), 1, "{list:?}");
        assert_eq!(
            list[0]["authenticated"],
            format!("generated-psk/{}", hashes[0].name()),
            "{list:?}"
        );
        c.shutdown().unwrap();
        controllers(&ctx, 0);
    }
    t.shutdown().unwrap();
}

#[test]
fn concatenation_is_refused_where_it_is_not_allowed_or_cannot_work() {
    let (hk, ok) = (key(), key());
    let (t, ctx) = start(&hk, &ok);
    // The library's whole connect fails on a listener without TLS, and on a subsystem that
    // does not allow it: the exchange ends in AUTH_Failure1, nothing is authenticated.
    for (addr, sub) in [(at(&t, NO_TLS), SUB), (at(&t, ALLOWED), PLAIN_SUB)] {
        let e = Controller::connect_with(addr, &opts(sub, HOST, concat(&hk))).unwrap_err();
        assert!(matches!(e, HostError::Auth(_)), "{e}");
        assert!(e.to_string().contains("concatenation mismatch"), "{e}");
    }
    let mut q = unauthenticated(at(&t, NO_TLS), SUB);
    q.auth_send(&negotiate(1, sc_c::NEW_TLS_PSK, &[1], &[1])).unwrap();
    expect_auth_failure(&mut q, Reason::ConcatMismatch);
    unauthenticated_still(&mut q);
    let mut q = unauthenticated(at(&t, ALLOWED), SUB);
    // SC_C values this target does not know (01h is obsolete), and REPLACETLSPSK on a
    // queue no generated PSK secures.
    for sc in [0x01, 0x04, 0xFF, sc_c::REPLACE_TLS_PSK] {
        q.auth_send(&negotiate(2, sc, &[1], &[1])).unwrap();
        expect_auth_failure(&mut q, Reason::ConcatMismatch);
    }
    // A hash that has no TLS cipher suite, the null group: no PSK can come of them.
    q.auth_send(&negotiate(3, sc_c::NEW_TLS_PSK, &[3], &[1])).unwrap();
    expect_auth_failure(&mut q, Reason::HashUnusable);
    q.auth_send(&negotiate(4, sc_c::NEW_TLS_PSK, &[1], &[0])).unwrap();
    expect_auth_failure(&mut q, Reason::DhGroupUnusable);
    // A Reply without the host's challenge C2 (CVALID clear): the PSK needs it.
    q.auth_send(&negotiate(5, sc_c::NEW_TLS_PSK, &[1], &[1])).unwrap();
    let ch = match Message::parse(&q.auth_receive(RECEIVE_LEN).unwrap()).unwrap() {
        Message::Challenge(c) => c,
        m => panic!("{m:?}"),
    };
    let p = DhPrivate::generate(DhGroup::Ffdhe2048).unwrap();
    let z = p.shared(&ch.dhv).unwrap();
    let tx = Transaction {
        hash: ch.hash,
        t_id: 5,
        sc_c: sc_c::NEW_TLS_PSK,
        hostnqn: HOST,
        subnqn: SUB,
    };
    let r1 = tx.host_response(
        &hk.transform(HOST),
        &augmented_challenge(ch.hash, &ch.c, Some(z.as_slice())),
        ch.seq,
    );
    let reply = |cvalid: bool| {
        Message::Reply(Reply {
            t_id: 5,
            r: r1.to_vec(),
            cvalid,
            seq: 0,
            c2: vec![7; 32],
            dhv: p.public().unwrap(),
        })
        .encode()
    };
    q.auth_send(&reply(false)).unwrap();
    expect_auth_failure(&mut q, Reason::IncorrectPayload);
    unauthenticated_still(&mut q);
    // The same Reply with C2, replayed into the next exchange (a new C1, S1 and DH value):
    // refused; nothing generated, nothing authenticated.
    q.auth_send(&negotiate(5, sc_c::NEW_TLS_PSK, &[1], &[1])).unwrap();
    let _next = q.auth_receive(RECEIVE_LEN).unwrap();
    q.auth_send(&reply(true)).unwrap();
    expect_auth_failure(&mut q, Reason::Failed);
    unauthenticated_still(&mut q);
    // On an I/O queue: refused (only the admin queue generates). The controller's admin
    // queue authenticates without concatenation first.
    let mut ao = QueueOpts::admin(SUB, HOST);
    ao.dhchap = Some(HostDhchap::new(hk.clone(), None));
    let mut admin = HostQueue::connect(at(&t, ALLOWED), ao).unwrap();
    admin.enable().unwrap();
    admin.set_num_queues(1).unwrap();
    let mut io = HostQueue::initialized(at(&t, ALLOWED), QueueOpts::io(SUB, HOST, 1, admin.cntlid(), 32)).unwrap();
    let r = io.fabrics_connect().unwrap();
    assert!(r.status.is_success() && r.dw0 & (1 << 17) != 0, "{r:?}");
    io.auth_send(&negotiate(6, sc_c::NEW_TLS_PSK, &[1], &[1])).unwrap();
    expect_auth_failure(&mut io, Reason::ConcatMismatch);
    // Nothing was generated by any of it: the target holds no key.
    let stats = ctx.call("controllers", &Value::Null).unwrap().to_string();
    assert!(!stats.contains("NVMe1G"), "no identity is ever listed: {stats}");
    t.shutdown().unwrap();
}

/// A TLS admin queue of `host` with generated PSK `g`: its handshake, or why it failed.
fn tls_admin(addr: SocketAddr, host: &str, g: &GeneratedPsk, as_host: Option<&str>) -> Result<HostQueue, HostError> {
    let mut tls = HostTls::generated(g.clone());
    tls.identity_hostnqn = as_host.map(str::to_owned);
    HostQueue::connect(addr, QueueOpts::admin(SUB, host).tls(tls))
}

#[test]
fn only_a_held_generated_psk_opens_a_tls_connection() {
    let (hk, ok) = (key(), key());
    let (t, ctx) = start(&hk, &ok);
    // A generated identity made up by the host: the target holds no such key.
    let fake = GeneratedPsk::generate(HashId::Sha256, &[9; 256], &[1; 32], &[2; 32]).unwrap();
    let e = tls_admin(at(&t, ALLOWED), HOST, &fake, None).unwrap_err();
    assert!(matches!(e, HostError::Tls(_) | HostError::Closed), "{e}");
    // A genuine one: its admin queue connects without authenticating (no ATR).
    let mut plain = unauthenticated(at(&t, ALLOWED), SUB);
    let (_, g) = plain
        .exchange(
            &concat(&hk),
            1,
            0,
            ExchangeOpts {
                sc_c: sc_c::NEW_TLS_PSK,
                c2_only: true,
            },
        )
        .unwrap();
    let g = g.unwrap();
    plain.close();
    let mut q = tls_admin(at(&t, ALLOWED), HOST, &g, None).unwrap();
    q.property_get(property::CAP).unwrap();
    q.close();
    // The same key offered under another host's identity (derived for OTHER): not held;
    // OTHER connecting with HOST's identity: refused at Connect.
    assert!(tls_admin(at(&t, ALLOWED), OTHER, &g, None).is_err());
    let e = tls_admin(at(&t, ALLOWED), OTHER, &g, Some(HOST)).unwrap_err();
    assert!(matches!(e, HostError::ConnectRefused { .. }), "{e}");
    // A listener without TLS refuses the handshake.
    assert!(tls_admin(at(&t, NO_TLS), HOST, &g, None).is_err());
    // The host's keys removed from the subsystem: its generated keys stop serving at once.
    ctx.call("set_host_keys", &json!({"nqn": SUB, "host": HOST})).unwrap();
    assert!(tls_admin(at(&t, ALLOWED), HOST, &g, None).is_err());
    t.shutdown().unwrap();
}

#[test]
fn replace_tls_psk_on_the_tls_admin_queue_replaces_the_generated_key() {
    let (hk, ok) = (key(), key());
    let (t, _ctx) = start(&hk, &ok);
    let mut c = Controller::connect_with(at(&t, ALLOWED), &opts(SUB, HOST, concat(&hk))).unwrap();
    io_works(&mut c, 1);
    let old = match &c.admin.opts().tls.as_ref().unwrap().psk {
        pollux_host::HostPsk::Generated(g) => g.clone(),
        other => panic!("{other:?}"),
    };
    // Asking for a new PSK on a queue TLS secures is a mismatch; replacing it is not.
    c.admin
        .auth_send(&negotiate(20, sc_c::NEW_TLS_PSK, &[1], &[1]))
        .unwrap();
    expect_auth_failure(&mut c.admin, Reason::ConcatMismatch);
    let (_, new) = c
        .admin
        .exchange(
            &concat(&hk),
            21,
            0,
            ExchangeOpts {
                sc_c: sc_c::REPLACE_TLS_PSK,
                c2_only: true,
            },
        )
        .unwrap();
    let new = new.unwrap();
    assert_ne!(new, old);
    // Live queues keep their sessions; new connections need the new key.
    c.admin.property_get(property::CAP).unwrap();
    io_works(&mut c, 2);
    assert!(tls_admin(at(&t, ALLOWED), HOST, &old, None).is_err());
    let mut q = tls_admin(at(&t, ALLOWED), HOST, &new, None).unwrap();
    q.property_get(property::CAP).unwrap();
    q.close();
    c.shutdown().unwrap();
    t.shutdown().unwrap();
}
