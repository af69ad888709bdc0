//! NVMe/TCP over TLS 1.3 with PSKs (NVMe/TCP 1.0 §3.6.1) end to end with the host library:
//! every queue of a host with a PSK handshakes before ICReq and carries verified I/O (both
//! PSK hashes, both identity versions, with and without digests, transfers split into
//! H2CData PDUs, many commands in flight); a wrong PSK, plaintext on a listener that
//! requires TLS, a PSK of another host, and TLS on a listener without it are refused and
//! leave no controller; an "allowed" listener serves both; the discovery log reports each
//! listener's TREQ and TSAS; and `pollux perf --tls-key --verify` runs clean over TLS.
#![allow(clippy::unwrap_used)]

mod common;

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt as _;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use pollux_conf::DISCOVERY_NQN;
use pollux_host::{Completion, Controller, ControllerOpts, Digests, HostError, HostQueue, HostTls, QueueOpts};
use pollux_nvme::spec::Status;
use pollux_nvme::tls::{ConfiguredPsk, PskHash};
use pollux_target::Target;
use pollux_target::control::rpc::Ctx;
use serde_json::Value;

const SUB: &str = "nqn.2026-11.io.pollux:tls";
/// A host with a SHA-256 PSK (`NVMeTLSkey-1:01:`, 32 bytes).
const HOST256: &str = "nqn.2014-08.org.nvmexpress:uuid:7150c0de-0000-4000-8000-000000000256";
/// A host with a SHA-384 PSK (`NVMeTLSkey-1:02:`, 48 bytes).
const HOST384: &str = "nqn.2014-08.org.nvmexpress:uuid:7150c0de-0000-4000-8000-000000000384";
/// A listed host without a PSK.
const PLAIN_HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:7150c0de-0000-4000-8000-000000000000";

/// Listener order in the conf (and in `listen_addrs`).
const REQUIRED: usize = 0;
const ALLOWED: usize = 1;
const NONE: usize = 2;

fn psk(hash: PskHash, fill: u8) -> ConfiguredPsk {
    let bytes: Vec<u8> = (0..hash.output_len() as u8)
        .map(|i| fill ^ i.wrapping_mul(37))
        .collect();
    ConfiguredPsk::new(Some(hash), &bytes).unwrap()
}

fn key256() -> ConfiguredPsk {
    psk(PskHash::Sha256, 0x11)
}

fn key384() -> ConfiguredPsk {
    psk(PskHash::Sha384, 0x22)
}

/// The conf: listeners requiring, allowing and refusing TLS (in that order, on three
/// loopback addresses: one address takes one listener), H2CData PDUs
/// of at most 32 KiB (a 128 KiB write takes four), SUB with the two keyed hosts and a plain
/// one, and HOST256 able to discover over TLS.
fn conf() -> String {
    format!(
        r#"
[reactors]
cores = [0, 1]
mode = "interrupt"

[[listener]]
address = "127.0.0.1:0"
tls = "required"

[[listener]]
address = "127.0.0.2:0"
tls = "allowed"

[[listener]]
address = "127.0.0.3:0"
tls = "none"

[transport]
max_h2c_data = "32KiB"
max_io_size = "512KiB"

[discovery]
hosts = [{{ nqn = "{HOST256}", tls_key = "{k256}" }}]

[[subsystem]]
nqn = "{SUB}"
hosts = [
    {{ nqn = "{HOST256}", tls_key = "{k256}" }},
    {{ nqn = "{HOST384}", tls_key = "{k384}" }},
    "{PLAIN_HOST}",
]

[[subsystem.namespace]]
nsid = 1
block_size = 512
backend = {{ ram = {{ size = "16MiB" }} }}
"#,
        k256 = *key256().encode(),
        k384 = *key384().encode(),
    )
}

fn start_tls() -> (Target, Ctx) {
    let text = conf();
    let t = start_text(&text);
    let cfg = pollux_conf::Config::parse(&text, "tls.toml").unwrap();
    let ctx = Ctx::new(&t, &cfg.reactors);
    (t, ctx)
}

fn at(t: &Target, listener: usize) -> SocketAddr {
    t.listen_addrs()[listener]
}

fn opts(host: &str, tls: Option<HostTls>, digests: Digests) -> ControllerOpts {
    let mut o = ControllerOpts::new(SUB, host, 2, 32);
    o.digests = digests;
    o.tls = tls;
    o
}

/// Controllers the target holds now (waiting a little for ones being torn down).
fn controllers(ctx: &Ctx, want: usize) -> usize {
    let until = Instant::now() + WAIT;
    loop {
        let v = ctx.call("controllers", &Value::Null).unwrap();
        let n = v["controllers"].as_array().unwrap().len();
        if n == want || Instant::now() >= until {
            return n;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Verified I/O on a controller with two I/O queues: single commands of 4 KiB (in-capsule)
/// and 128 KiB (R2T, four H2CData PDUs; one C2HData), written by one queue and read by the
/// other; then 16 writes and 16 reads of 128 KiB in flight at once on one queue, whose 2 MiB
/// of replies overrun the receive buffer and leave decrypted bytes in OpenSSL between reads.
fn verified_io(c: &mut Controller, seed: u64, what: &str) {
    for (k, (lba, len)) in [(0u64, 4096usize), (64, 128 << 10), (1024, 128 << 10), (4096, 512 << 10)]
        .into_iter()
        .enumerate()
    {
        let data = pattern(seed, lba, len);
        let nlb = (len / 512) as u32;
        c.io[k % 2].write(1, lba, nlb, &data).unwrap();
        let mut back = vec![0u8; len];
        c.io[(k + 1) % 2].read(1, lba, nlb, &mut back).unwrap();
        assert!(back == data, "{what}: {len} bytes at LBA {lba} differ");
    }
    let q = &mut c.io[0];
    let (n, nlb, base) = (16u64, 256u32, 8192u64);
    let lba = |i: u64| base + i * u64::from(nlb);
    for i in 0..n {
        q.submit_write(1, lba(i), nlb, pattern(seed + 1, lba(i), 128 << 10), i)
            .unwrap();
    }
    drain(q, n, what, |_| {});
    for i in 0..n {
        q.submit_read(1, lba(i), nlb, vec![0; 128 << 10], i).unwrap();
    }
    drain(q, n, what, |c| {
        assert!(
            c.buf == pattern(seed + 1, lba(c.tag), 128 << 10),
            "{what}: read {} differs",
            c.tag
        );
    });
    assert_eq!(q.in_place_reads(), 0, "{what}: nothing is received in place over TLS");
}

/// Waits (in poll(2)) for `n` successful completions on `q`.
fn drain(q: &mut HostQueue, n: u64, what: &str, mut check: impl FnMut(&Completion)) {
    let until = Instant::now() + WAIT;
    let mut done = 0;
    while done < n {
        assert!(Instant::now() < until, "{what}: {done} of {n} completions");
        done += q
            .poll_completions(Some(WAIT), |c| {
                assert!(c.is_success(), "{what}: {}", c.status);
                check(&c);
            })
            .unwrap() as u64;
    }
}

#[test]
fn tls_queues_carry_verified_io_with_both_hashes_identity_versions_and_digests() {
    let (t, ctx) = start_tls();
    let hd = Digests {
        hdgst: true,
        ddgst: false,
    };
    let cases = [
        (HOST256, key256(), 0, Digests::NONE, "TLS_AES_128_GCM_SHA256"),
        (HOST256, key256(), 1, Digests::BOTH, "TLS_AES_128_GCM_SHA256"),
        (HOST384, key384(), 0, Digests::BOTH, "TLS_AES_256_GCM_SHA384"),
        (HOST384, key384(), 1, hd, "TLS_AES_256_GCM_SHA384"),
    ];
    for (k, (host, key, version, digests, suite)) in cases.into_iter().enumerate() {
        let what = format!("{host} identity {version} {digests:?}");
        let tls = HostTls::new(key).identity(version);
        let mut c = Controller::connect_with(at(&t, REQUIRED), &opts(host, Some(tls), digests))
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(c.admin.tls_cipher(), Some(suite), "{what}");
        for q in &c.io {
            assert_eq!(q.tls_cipher(), Some(suite), "{what}");
            assert_eq!((q.ic_info().hdgst, q.ic_info().ddgst), (digests.hdgst, digests.ddgst));
        }
        verified_io(&mut c, k as u64, &what);
        assert_eq!(controllers(&ctx, 1), 1);
        c.shutdown().unwrap();
    }
    assert_eq!(controllers(&ctx, 0), 0);
    t.shutdown().unwrap();
}

#[test]
fn a_wrong_psk_fails_at_the_handshake_and_leaves_no_controller() {
    let (t, ctx) = start_tls();
    // The right identity, another key: the controller's binder check fails.
    for (host, wrong) in [
        (HOST256, psk(PskHash::Sha256, 0x12)),
        (HOST384, psk(PskHash::Sha384, 0x23)),
    ] {
        for version in [0, 1] {
            let tls = HostTls::new(wrong.clone()).identity(version);
            let e = Controller::connect_with(at(&t, REQUIRED), &opts(host, Some(tls), Digests::NONE)).unwrap_err();
            eprintln!("{host} v{version} with a wrong PSK: {e}");
            assert!(
                matches!(&e, HostError::Tls(why) if why.starts_with("handshake failed")),
                "{host} v{version}: {e}"
            );
        }
    }
    // A host the subsystem holds no PSK for: no identity matches.
    let tls = HostTls::new(key256());
    let e = Controller::connect_with(at(&t, REQUIRED), &opts(PLAIN_HOST, Some(tls), Digests::NONE)).unwrap_err();
    eprintln!("a host without a PSK: {e}");
    assert!(matches!(e, HostError::Tls(_)), "{e}");
    // The same on a raw queue: the failure is the TCP connect's step, before any ICReq.
    let e = HostQueue::tcp(
        at(&t, REQUIRED),
        QueueOpts::admin(SUB, HOST256).tls(HostTls::new(psk(PskHash::Sha256, 0x13))),
    )
    .unwrap_err();
    assert!(matches!(e, HostError::Tls(_)), "{e}");
    assert_eq!(controllers(&ctx, 0), 0);
    // The target still serves the right key.
    let mut c = Controller::connect_with(
        at(&t, REQUIRED),
        &opts(HOST256, Some(HostTls::new(key256())), Digests::NONE),
    )
    .unwrap();
    verified_io(&mut c, 7, "after refusals");
    c.shutdown().unwrap();
    t.shutdown().unwrap();
}

#[test]
fn plaintext_on_a_listener_that_requires_tls_is_refused() {
    let (t, ctx) = start_tls();
    for host in [HOST256, PLAIN_HOST] {
        let e = Controller::connect_with(at(&t, REQUIRED), &opts(host, None, Digests::NONE)).unwrap_err();
        assert!(matches!(e, HostError::Closed), "{host}: {e}");
    }
    assert_eq!(controllers(&ctx, 0), 0);
    t.shutdown().unwrap();
}

#[test]
fn a_psk_of_one_host_cannot_connect_as_another() {
    let (t, ctx) = start_tls();
    // Secured with HOST256's identity and PSK, Connect naming HOST384 (a listed host with a
    // PSK of its own) or PLAIN_HOST: Connect Invalid Host (NVMe/TCP 1.0 §3.6.1.3).
    for claimed in [HOST384, PLAIN_HOST] {
        let mut tls = HostTls::new(key256());
        tls.identity_hostnqn = Some(HOST256.to_string());
        let e = Controller::connect_with(at(&t, REQUIRED), &opts(claimed, Some(tls), Digests::NONE)).unwrap_err();
        eprintln!("HOST256's PSK connecting as {claimed}: {e}");
        let s = e.status().unwrap_or_else(|| panic!("{claimed}: {e}"));
        assert_eq!(
            (s.sct(), s.sc()),
            (Status::CONNECT_INVALID_HOST.sct(), Status::CONNECT_INVALID_HOST.sc()),
            "{claimed}: {e}"
        );
        assert!(s.dnr(), "{e}");
    }
    // The same knob naming the host it connects as is the ordinary case.
    let mut tls = HostTls::new(key256());
    tls.identity_hostnqn = Some(HOST256.to_string());
    let c = Controller::connect_with(at(&t, REQUIRED), &opts(HOST256, Some(tls), Digests::NONE)).unwrap();
    assert_eq!(controllers(&ctx, 1), 1);
    c.shutdown().unwrap();
    assert_eq!(controllers(&ctx, 0), 0);
    t.shutdown().unwrap();
}

#[test]
fn an_allowed_listener_serves_plain_and_tls_hosts_side_by_side() {
    let (t, ctx) = start_tls();
    let a = at(&t, ALLOWED);
    let mut secure = Controller::connect_with(a, &opts(HOST384, Some(HostTls::new(key384())), Digests::BOTH)).unwrap();
    let mut plain = Controller::connect_with(a, &opts(PLAIN_HOST, None, Digests::NONE)).unwrap();
    // A host with a PSK may connect in plaintext where TLS is only allowed.
    let mut keyed_plain = Controller::connect_with(a, &opts(HOST256, None, Digests::NONE)).unwrap();
    assert_eq!(secure.io[0].tls_cipher(), Some("TLS_AES_256_GCM_SHA384"));
    assert_eq!(plain.io[0].tls_cipher(), None);
    assert_eq!(controllers(&ctx, 3), 3);
    verified_io(&mut secure, 11, "TLS on allowed");
    assert_round_trips(
        &mut plain,
        512,
        &[8, 256, 1024],
        |k| 20_000 + k as u64 * 1024,
        12,
        "plain on allowed",
    );
    assert_round_trips(
        &mut keyed_plain,
        512,
        &[8, 256],
        |k| 26_000 + k as u64 * 1024,
        13,
        "keyed host in plaintext",
    );
    // The TLS queue sees what the plain one wrote.
    let data = pattern(14, 30_000, 128 << 10);
    plain.io[0].write(1, 30_000, 256, &data).unwrap();
    let mut back = vec![0u8; data.len()];
    secure.io[1].read(1, 30_000, 256, &mut back).unwrap();
    assert!(back == data);
    for c in [secure, plain, keyed_plain] {
        c.shutdown().unwrap();
    }
    t.shutdown().unwrap();
}

#[test]
fn a_listener_without_tls_refuses_a_handshake() {
    let (t, ctx) = start_tls();
    let a = at(&t, NONE);
    let e = Controller::connect_with(a, &opts(HOST256, Some(HostTls::new(key256())), Digests::NONE)).unwrap_err();
    eprintln!("TLS on a listener without it: {e}");
    assert!(matches!(e, HostError::Tls(_)), "{e}");
    assert_eq!(controllers(&ctx, 0), 0);
    // Plain TCP there works.
    let mut c = Controller::connect_with(a, &opts(HOST256, None, Digests::NONE)).unwrap();
    assert_round_trips(&mut c, 512, &[8, 256], |k| k as u64 * 1024, 15, "plain on none");
    c.shutdown().unwrap();
    t.shutdown().unwrap();
}

#[test]
fn the_discovery_log_reports_each_listeners_tls() {
    let (t, _ctx) = start_tls();
    let addrs = t.listen_addrs();
    // TREQ bits 1:0 (NVMe-oF 1.1 §5.3: 1 required, 2 not required, 0 not specified) and
    // TSAS SECTYPE (NVMe/TCP 1.0 §3.6.1: 2 TLS 1.3, 0 none), by listener.
    let expected = [(REQUIRED, 1u8, 2u8), (ALLOWED, 2, 2), (NONE, 0, 0)];
    let check = |c: &mut Controller, how: &str| {
        let log = c.admin.discovery_log().unwrap();
        // The subsystem on each listener (after the current discovery subsystem's entry).
        let subs: Vec<_> = log.entries.iter().filter(|e| e.subtype == 2).collect();
        assert_eq!(subs.len(), expected.len(), "{how}: {log:?}");
        for &(l, treq, sectype) in &expected {
            let port = addrs[l].port().to_string();
            let e = subs
                .iter()
                .find(|e| e.trsvcid == port)
                .unwrap_or_else(|| panic!("{how}: no entry for listener {l}: {log:?}"));
            assert_eq!((e.subnqn.as_str(), e.trtype), (SUB, 3), "{how}");
            assert_eq!(e.treq & 3, treq, "{how}: listener {l} TREQ {:#x}", e.treq);
            assert_eq!(e.treq & 4, 4, "{how}: SQ flow control disable supported");
            assert_eq!(e.sectype, sectype, "{how}: listener {l} SECTYPE");
        }
    };
    // In plaintext where TLS is not required ...
    for l in [ALLOWED, NONE] {
        let mut c = Controller::connect_with(addrs[l], &ControllerOpts::new(DISCOVERY_NQN, HOST256, 0, 32)).unwrap();
        check(&mut c, "plain discovery");
        c.shutdown().unwrap();
    }
    // ... and over TLS with the discovery PSK (the identity naming the discovery NQN).
    let mut o = ControllerOpts::new(DISCOVERY_NQN, HOST256, 0, 32);
    o.tls = Some(HostTls::new(key256()).identity(1));
    let mut c = Controller::connect_with(addrs[REQUIRED], &o).unwrap();
    assert_eq!(c.admin.tls_cipher(), Some("TLS_AES_128_GCM_SHA256"));
    check(&mut c, "TLS discovery");
    c.shutdown().unwrap();
    // A host without a discovery PSK cannot discover over TLS.
    o.hostnqn = HOST384.to_string();
    o.tls = Some(HostTls::new(key384()));
    assert!(matches!(
        Controller::connect_with(addrs[REQUIRED], &o).unwrap_err(),
        HostError::Tls(_)
    ));
    t.shutdown().unwrap();
}

/// `pollux perf` as a subprocess against `addr`: its exit status, stdout and stderr.
fn perf(addr: SocketAddr, host: &str, extra: &[&str]) -> (i32, String, String) {
    let trid = format!("trtype:tcp traddr:{} trsvcid:{} subnqn:{SUB}", addr.ip(), addr.port());
    let out = Command::new(env!("CARGO_BIN_EXE_pollux"))
        .args([
            "perf",
            "-r",
            &trid,
            "--hostnqn",
            host,
            "--no-pin",
            "--no-probe",
            "--json",
        ])
        .args(extra)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn report(stdout: &str) -> Value {
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

#[test]
fn perf_verifies_over_tls_with_a_key_or_a_key_file() {
    let (t, _ctx) = start_tls();
    let key = key256().encode();
    let job = [
        "-w",
        "randrw",
        "-q",
        "8",
        "-o",
        "4096",
        "-t",
        "0.5",
        "--conns-per-core",
        "2",
        "--span",
        "1MiB",
        "--verify",
    ];
    let mut args: Vec<&str> = job.to_vec();
    args.extend(["--tls-key", key.as_str()]);
    let (rc, out, err) = perf(at(&t, REQUIRED), HOST256, &args);
    assert_eq!(rc, 0, "{err}");
    let r = report(&out);
    assert_eq!(r["tls"], Value::Bool(true), "{out}");
    assert!(r["verified_blocks"].as_u64().unwrap() > 0, "{out}");
    assert!(
        r["reads"].as_u64().unwrap() > 0 && r["writes"].as_u64().unwrap() > 0,
        "{out}"
    );
    assert_eq!(r["in_place_reads"].as_u64(), Some(0), "{out}");

    // A key file: refused while others may read it (with the reason), used once it is 0600;
    // SHA-384, identity version 1, 128 KiB I/Os with digests, waiting in poll(2).
    let dir = std::env::temp_dir().join(format!("pollux-tls-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("host384.key");
    std::fs::write(&file, format!("{}\n", *key384().encode())).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let path = file.to_str().unwrap();
    let big = [
        "-w",
        "rw",
        "-q",
        "4",
        "-o",
        "128KiB",
        "--ios",
        "400",
        "--span",
        "4MiB",
        "--verify",
        "--hdgst",
        "--ddgst",
        "--blocking",
        "--tls-identity",
        "1",
        "--tls-key-file",
        path,
    ];
    let (rc, _, err) = perf(at(&t, REQUIRED), HOST384, &big);
    assert_eq!(rc, 2, "{err}");
    assert!(err.contains("accessible to others (mode 0644)"), "{err}");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (rc, out, err) = perf(at(&t, REQUIRED), HOST384, &big);
    assert_eq!(rc, 0, "{err}");
    let r = report(&out);
    assert_eq!(r["tls"], Value::Bool(true), "{out}");
    assert_eq!(r["ios"].as_u64(), Some(400), "{out}");
    assert!(r["verified_blocks"].as_u64().unwrap() > 0, "{out}");
    std::fs::remove_dir_all(&dir).unwrap();

    // Without TLS options on the allowed listener: a plain run, reported as such.
    let (rc, out, err) = perf(at(&t, ALLOWED), PLAIN_HOST, &job);
    assert_eq!(rc, 0, "{err}");
    assert_eq!(report(&out)["tls"], Value::Bool(false), "{out}");
    // A wrong key fails the run at connect; options that make no sense are usage errors.
    let wrong = psk(PskHash::Sha256, 0x14).encode();
    let (rc, _, err) = perf(at(&t, REQUIRED), HOST256, &["-t", "0.2", "--tls-key", wrong.as_str()]);
    assert_eq!(rc, 1, "{err}");
    assert!(err.contains("TLS: handshake failed"), "{err}");
    assert!(!err.contains(wrong.as_str()), "the key is never echoed");
    let (rc, _, err) = perf(at(&t, REQUIRED), HOST256, &["-t", "0.2", "--tls-identity", "1"]);
    assert_eq!(rc, 2, "{err}");
    assert!(err.contains("--tls-identity needs --tls-key"), "{err}");
    let (rc, _, err) = perf(at(&t, REQUIRED), HOST256, &["--tls-key", "NVMeTLSkey-1:01:nonsense:"]);
    assert_eq!(rc, 2, "{err}");
    assert!(!err.contains("nonsense"), "{err}");
    t.shutdown().unwrap();
}

/// SPDK JSON configs carry a host's TLS PSK as SPDK's do: its key file in the keyring
/// (`keyring_file_add_key`), named by `nvmf_subsystem_add_host`'s `psk`, on a listener with
/// `secure_channel`; a target serving that config admits the host over TLS with that key.
#[test]
fn a_host_tls_key_goes_into_an_spdk_config_through_the_keyring_and_back() {
    let dir = std::env::temp_dir().join(format!("pollux-tls-spdk-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("host256.key");
    std::fs::write(&file, format!("{}\n", *key256().encode())).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let text = format!(
        "[reactors]\ncores = [0]\nmode = \"interrupt\"\n\
         [[listener]]\naddress = \"127.0.0.1:0\"\ntls = \"required\"\n\
         [[subsystem]]\nnqn = \"{SUB}\"\nhosts = [{{ nqn = \"{HOST256}\", tls_key_file = \"{}\" }}]\n\
         [[subsystem.namespace]]\nnsid = 1\nbackend = {{ ram = {{ size = \"8MiB\" }} }}\n",
        file.display()
    );
    let t = start_text(&text);
    let ctx = Ctx::new(&t, &pollux_conf::Config::parse(&text, "t.toml").unwrap().reactors);
    let doc = ctx.call("save_config", &Value::Null).unwrap();
    let calls: Vec<&Value> = doc["subsystems"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["config"].as_array().unwrap())
        .collect();
    let key = calls
        .iter()
        .find(|c| c["method"] == "keyring_file_add_key")
        .unwrap_or_else(|| panic!("no keyring entry: {doc}"));
    assert_eq!(key["params"]["path"], file.display().to_string(), "{doc}");
    let host = calls.iter().find(|c| c["method"] == "nvmf_subsystem_add_host").unwrap();
    assert_eq!(host["params"]["psk"], key["params"]["name"], "{doc}");
    assert!(
        calls
            .iter()
            .any(|c| c["method"] == "nvmf_subsystem_add_listener" && c["params"]["secure_channel"] == true),
        "{doc}"
    );
    t.shutdown().unwrap();

    // A target serving that config (as `pollux --spdk-config` does) admits the host over TLS.
    let base = pollux_target::control::rpc::spdk_base_conf(&doc).unwrap();
    let cfg = pollux_conf::Config::parse(&base, "spdk.json").unwrap();
    let t = Target::start(&cfg, pollux_target::Options { pin: false }).unwrap();
    let ctx = Ctx::new(&t, &cfg.reactors);
    ctx.spdk_load_config(&doc).unwrap();
    let k = key256().encode();
    let (rc, _, err) = perf(
        t.listen_addrs()[0],
        HOST256,
        &["-w", "randrw", "-t", "0.3", "--verify", "--tls-key", k.as_str()],
    );
    assert_eq!(rc, 0, "{err}");
    t.shutdown().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
