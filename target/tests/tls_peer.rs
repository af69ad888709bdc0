//! TLS 1.3 with a PSK (NVMe/TCP 1.0 §3.6.1, TP 8011) against a TLS implementation nobody
//! here wrote: OpenSSL's own client, `openssl s_client`, completes a handshake with the
//! PSK and identity of a host configured with an `NVMeTLSkey-1:` key, carries an ICReq
//! that pollux answers with an ICResp, and is refused with a wrong PSK, with TLS 1.2, with
//! a handshake that offers no PSK, and on a listener without TLS; a plaintext ICReq is
//! refused on a listener that requires TLS, and a handshake that stalls is closed. A TLS 1.3
//! KeyUpdate from the client (s_client's `k` and `K` commands) is honoured on a live
//! connection. The host library's TLS (full I/O) is `tls.rs`.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::*;
use pollux_nvme::tcp::{encode_capsule_cmd, encode_ic_req};
use pollux_nvme::tls::{ConfiguredPsk, PskHash};
use pollux_target::Target;

const SUB: &str = "nqn.2026-11.io.pollux:tls-peer";

fn key() -> ConfiguredPsk {
    let bytes: Vec<u8> = (0..32u8).map(|i| i.wrapping_mul(37).wrapping_add(11)).collect();
    ConfiguredPsk::new(Some(PskHash::Sha256), &bytes).unwrap()
}

/// A target with a TLS-required, a TLS-allowed and a plain listener, in that order.
fn start_tls() -> (Target, [SocketAddr; 3]) {
    let text = format!(
        r#"
[reactors]
cores = [0]
mode = "interrupt"

[[listener]]
address = "127.0.0.1:0"
tls = "required"

[[listener]]
address = "127.0.0.2:0"
tls = "allowed"

[[listener]]
address = "127.0.0.3:0"

[[subsystem]]
nqn = "{SUB}"
hosts = [{{ nqn = "{HOST}", tls_key = "{}" }}]

[[subsystem.namespace]]
nsid = 1
backend = {{ ram = {{ size = "1MiB" }} }}
"#,
        *key().encode()
    );
    let t = start_text(&text);
    let a = t.listen_addrs();
    (t, [a[0], a[1], a[2]])
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// `openssl s_client` to `addr` with `args`, its stdin and stdout piped.
fn s_client(addr: SocketAddr, args: &[&str]) -> Child {
    Command::new("openssl")
        .arg("s_client")
        .args(["-connect", &addr.to_string(), "-quiet", "-ign_eof"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run openssl s_client (ci/test installs openssl): {e}"))
}

/// The PSK options of HOST's identity (version `v`): the identity and the TLS PSK in hex.
fn psk_args(v: u8, psk: &ConfiguredPsk) -> (String, String) {
    let t = psk.tls_psk(HOST, SUB, v).unwrap();
    (t.identity.clone(), hex(&t.psk))
}

/// Send an ICReq through the client and wait up to `within` for the bytes that come back
/// (None: the client ended, or nothing came).
fn icreq_through(mut c: Child, within: Duration) -> (Option<Vec<u8>>, String) {
    let mut stdin = c.stdin.take().unwrap();
    let _ = stdin.write_all(&encode_ic_req(false, false, 0, 0));
    let _ = stdin.flush();
    let mut out = c.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut got = Vec::new();
        let mut b = [0u8; 256];
        while got.len() < 128 {
            match out.read(&mut b) {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&b[..n]),
            }
        }
        let _ = tx.send(got);
    });
    let got = rx.recv_timeout(within).ok().filter(|g| !g.is_empty());
    drop(stdin);
    (got, end_client(c))
}

/// Stop the client and return what it wrote to stderr.
fn end_client(mut c: Child) -> String {
    let _ = c.kill();
    let mut err = String::new();
    if let Some(mut e) = c.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    let _ = c.wait();
    err
}

fn assert_icresp(got: &Option<Vec<u8>>, err: &str) {
    let g = got
        .as_ref()
        .unwrap_or_else(|| panic!("no ICResp; s_client said: {err}"));
    assert!(g.len() >= 128, "short ICResp {g:?}");
    assert_eq!(g[0], 0x01, "PDU type ICResp");
    assert_eq!(g[2], 128, "HLEN");
    assert_eq!(u32::from_le_bytes(g[4..8].try_into().unwrap()), 128, "PLEN");
}

#[test]
fn openssl_s_client_handshakes_with_the_hosts_psk_and_gets_an_icresp() {
    let (t, [required, allowed, _]) = start_tls();
    for (addr, v) in [(required, 0), (required, 1), (allowed, 0)] {
        let (id, psk) = psk_args(v, &key());
        let c = s_client(addr, &["-tls1_3", "-psk_identity", &id, "-psk", &psk]);
        let (got, err) = icreq_through(c, Duration::from_secs(20));
        assert_icresp(&got, &err);
    }
    drop(t);
}

#[test]
fn openssl_s_client_is_refused_without_the_right_psk_or_tls_1_3() {
    let (t, [required, allowed, plain]) = start_tls();
    let (id, psk) = psk_args(0, &key());
    let mut wrong_key = key().tls_psk(HOST, SUB, 0).unwrap().psk.to_vec();
    wrong_key[0] ^= 1;
    let wrong = hex(&wrong_key);
    let other_host = key().tls_psk(OTHER_HOST, SUB, 0).unwrap();
    let cases: [(&str, SocketAddr, Vec<&str>); 6] = [
        (
            "a wrong PSK",
            required,
            vec!["-tls1_3", "-psk_identity", &id, "-psk", &wrong],
        ),
        ("TLS 1.2", required, vec!["-tls1_2", "-psk_identity", &id, "-psk", &psk]),
        ("no PSK offered", required, vec!["-tls1_3"]),
        (
            "an identity with no key",
            allowed,
            vec!["-tls1_3", "-psk_identity", &other_host.identity, "-psk", &psk],
        ),
        (
            "a non-NVMe identity",
            allowed,
            vec!["-tls1_3", "-psk_identity", "Client_identity", "-psk", &psk],
        ),
        (
            "a listener without TLS",
            plain,
            vec!["-tls1_3", "-psk_identity", &id, "-psk", &psk],
        ),
    ];
    for (what, addr, args) in cases {
        let (got, err) = icreq_through(s_client(addr, &args), Duration::from_secs(10));
        assert!(
            got.as_ref().is_none_or(|g| g.first() != Some(&0x01)),
            "{what}: got an ICResp {got:?} ({err})"
        );
    }
    // The target is unharmed: the right PSK still works.
    let c = s_client(required, &["-tls1_3", "-psk_identity", &id, "-psk", &psk]);
    let (got, err) = icreq_through(c, Duration::from_secs(20));
    assert_icresp(&got, &err);
    drop(t);
}

/// Read from `s` until EOF or an error; the bytes and whether it ended in time.
fn read_to_end_within(s: &mut TcpStream, within: Duration) -> (Vec<u8>, bool) {
    s.set_read_timeout(Some(within)).unwrap();
    let start = Instant::now();
    let mut got = Vec::new();
    let mut b = [0u8; 512];
    loop {
        match s.read(&mut b) {
            Ok(0) => return (got, true),
            Ok(n) => got.extend_from_slice(&b[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return (got, false);
            }
            Err(_) => return (got, true),
        }
        if start.elapsed() > within {
            return (got, false);
        }
    }
}

#[test]
fn plaintext_is_refused_where_tls_is_required_and_served_where_allowed() {
    let (t, [required, allowed, _]) = start_tls();
    let mut s = TcpStream::connect(required).unwrap();
    s.write_all(&encode_ic_req(false, false, 0, 0)).unwrap();
    let (got, closed) = read_to_end_within(&mut s, Duration::from_secs(5));
    assert!(
        closed && got.is_empty(),
        "plaintext ICReq on a TLS-required listener: {got:?}"
    );

    let mut s = TcpStream::connect(allowed).unwrap();
    s.write_all(&encode_ic_req(false, false, 0, 0)).unwrap();
    let mut resp = [0u8; 128];
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.read_exact(&mut resp).unwrap();
    assert_eq!(resp[0], 0x01, "ICResp on a TLS-allowed listener");
    drop(t);
}

#[test]
fn a_stalled_tls_handshake_is_closed_after_its_deadline() {
    let (t, [required, allowed, _]) = start_tls();
    // Silent after connecting, and stalled one byte into a record.
    let mut silent = TcpStream::connect(required).unwrap();
    let mut partial = TcpStream::connect(allowed).unwrap();
    partial.write_all(&[22]).unwrap();
    for (what, s) in [("silent", &mut silent), ("partial record", &mut partial)] {
        let (_, closed) = read_to_end_within(s, Duration::from_secs(20));
        assert!(closed, "{what}: still open after 20 s");
    }
    drop(t);
}

#[test]
fn tls_listeners_and_psks_are_added_at_run_time() {
    let text = format!(
        r#"
[reactors]
cores = [0]
mode = "interrupt"

[[listener]]
address = "127.0.0.1:0"

[[subsystem]]
nqn = "{SUB}"
hosts = ["{HOST}"]

[[subsystem.namespace]]
nsid = 1
backend = {{ ram = {{ size = "1MiB" }} }}
"#
    );
    let t = start_text(&text);
    let cfg = pollux_conf::Config::parse(&text, "test.toml").unwrap();
    let ctx = pollux_target::control::rpc::Ctx::new(&t, &cfg.reactors);
    let call = |m: &str, p: serde_json::Value| ctx.call(m, &p).unwrap_or_else(|e| panic!("{m}: {e:?}"));
    call(
        "add_listener",
        serde_json::json!({"address": "127.0.0.5:0", "tls": "required"}),
    );
    let bad = ctx.call(
        "add_listener",
        &serde_json::json!({"address": "127.0.0.6:0", "tls": "maybe"}),
    );
    assert!(bad.is_err(), "an unknown TLS mode is refused");
    let secure = t.listen_addrs()[1];
    // No PSK for the host yet: the handshake fails.
    let (id, psk) = psk_args(0, &key());
    let args = ["-tls1_3", "-psk_identity", id.as_str(), "-psk", psk.as_str()];
    let (got, _) = icreq_through(s_client(secure, &args), Duration::from_secs(10));
    assert!(got.as_ref().is_none_or(|g| g.first() != Some(&0x01)), "{got:?}");
    // Given one, the next handshake uses it; the view names the host, not the key.
    let k = key().encode().to_string();
    call(
        "set_host_keys",
        serde_json::json!({"nqn": SUB, "host": HOST, "tls_key": k}),
    );
    let (got, err) = icreq_through(s_client(secure, &args), Duration::from_secs(20));
    assert_icresp(&got, &err);
    let subs = call("subsystems", serde_json::Value::Null).to_string();
    assert!(subs.contains(&format!("{HOST} sha256")), "{subs}");
    assert!(subs.contains("(tls required)"), "{subs}");
    assert!(!subs.contains(&k[16..40]), "the view shows the key: {subs}");
    drop(ctx);
    drop(t);
}

/// Read exactly `n` bytes from `out` within `within` (None: fewer came).
fn read_within(out: &mut std::process::ChildStdout, n: usize, within: Duration) -> Option<Vec<u8>> {
    let mut out = out.try_clone_fd()?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut got = vec![0u8; n];
        let r = out.read_exact(&mut got).map(|()| got);
        let _ = tx.send(r.ok());
    });
    rx.recv_timeout(within).ok().flatten()
}

/// A duplicate of a child's stdout, for a reader thread that may outlive a timed-out wait.
trait TryCloneFd {
    fn try_clone_fd(&self) -> Option<std::fs::File>;
}

impl TryCloneFd for std::process::ChildStdout {
    fn try_clone_fd(&self) -> Option<std::fs::File> {
        use std::os::fd::AsFd;
        self.as_fd().try_clone_to_owned().ok().map(std::fs::File::from)
    }
}

/// TLS 1.3 lets either side replace its traffic keys at any time (RFC 8446 §4.6.3); a
/// host may, and one that asks (`update_requested`) must get the controller's own
/// KeyUpdate back. `openssl s_client` sends one when a line of its input starts with `k`
/// (not requested) or `K` (requested); its commands work only without `-ign_eof`. After it,
/// the connection carries a command and its response under the new keys.
#[test]
fn a_key_update_from_the_host_keeps_the_connection() {
    let (t, [required, _, _]) = start_tls();
    let (id, psk) = psk_args(0, &key());
    for (cmd, cid) in [(&b"k\n"[..], 7u16), (b"K\n", 8)] {
        let mut c = Command::new("openssl")
            .arg("s_client")
            .args(["-connect", &required.to_string(), "-quiet", "-no_ign_eof"])
            .args(["-tls1_3", "-psk_identity", &id, "-psk", &psk])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run openssl s_client (ci/test installs openssl): {e}"));
        let mut stdin = c.stdin.take().unwrap();
        let mut out = c.stdout.take().unwrap();
        stdin.write_all(&encode_ic_req(false, false, 0, 0)).unwrap();
        stdin.flush().unwrap();
        let resp = read_within(&mut out, 128, Duration::from_secs(20));
        assert_icresp(&resp, "(stderr read at the end)");
        // The command letter alone in one read of s_client's input.
        std::thread::sleep(Duration::from_millis(300));
        stdin.write_all(cmd).unwrap();
        stdin.flush().unwrap();
        std::thread::sleep(Duration::from_millis(300));
        // Before Connect, a command is answered with an error: a response that pollux
        // must encrypt under its keys after the update, for a capsule the client
        // encrypted under its new ones.
        let mut s = pollux_host::sqe::keep_alive();
        s.cid.set(cid);
        let (pdu, n) = encode_capsule_cmd(&s, 0, false, false);
        stdin.write_all(&pdu[..n]).unwrap();
        stdin.flush().unwrap();
        let got = read_within(&mut out, 24, Duration::from_secs(20));
        drop(stdin);
        let err = end_client(c);
        assert!(err.contains("KEYUPDATE"), "s_client sent no KeyUpdate: {err}");
        let g = got.unwrap_or_else(|| panic!("no response after the key update; s_client said: {err}"));
        assert_eq!(g[0], 0x05, "PDU type CapsuleResp: {g:?}");
        assert_eq!(u16::from_le_bytes([g[8 + 12], g[8 + 13]]), cid, "the CQE's CID: {g:?}");
        let status = u16::from_le_bytes([g[8 + 14], g[8 + 15]]) >> 1;
        assert_ne!(status, 0, "a Keep Alive before Connect is refused: {g:?}");
    }
    drop(t);
}
