//! The control socket and the metrics endpoint against an in-process target: every method,
//! its error paths, socket permissions, oversized and broken requests, concurrent clients.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use common::{HOST, NQN, NQN_PRIVATE};
use pollux_conf::Config;
use pollux_target::control::{Client, ControlError, ControlServer, MAX_LINE};
use pollux_target::{Options, Target};
use serde_json::{Value, json};

static SEQ: AtomicU64 = AtomicU64::new(0);

/// A fresh socket path (short enough for sun_path).
fn sock_path() -> PathBuf {
    let n = SEQ.fetch_add(1, Relaxed);
    let p = std::env::temp_dir().join(format!("pollux-ctl-{}-{n}.sock", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

fn cfg_with(mode: &str, sock: &Path, metrics: bool) -> Config {
    let mut control = format!("[control]\nsocket = \"{}\"\n", sock.display());
    if metrics {
        control.push_str("metrics = \"127.0.0.2:0\"\n");
    }
    Config::parse(&common::conf(mode, &control), "control-test.toml").unwrap()
}

struct Env {
    // Dropped first: the control plane stops before the target.
    ctl: ControlServer,
    target: Option<Target>,
    sock: PathBuf,
}

impl Drop for Env {
    fn drop(&mut self) {
        if let Some(t) = self.target.take() {
            let _ = t.shutdown();
        }
    }
}

fn start_mode(mode: &str, metrics: bool) -> Env {
    let sock = sock_path();
    let cfg = cfg_with(mode, &sock, metrics);
    let target = Target::start(&cfg, Options { pin: false }).unwrap();
    let ctl = ControlServer::start(&target, &cfg).unwrap();
    Env {
        ctl,
        target: Some(target),
        sock,
    }
}

fn start() -> Env {
    start_mode("interrupt", false)
}

impl Env {
    fn client(&self) -> Client {
        Client::connect(&self.sock).unwrap()
    }

    fn target(&self) -> &Target {
        self.target.as_ref().unwrap()
    }
}

/// Send one raw line, read one response line.
fn raw(sock: &Path, line: &[u8]) -> Value {
    let mut s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(line).unwrap();
    s.write_all(b"\n").unwrap();
    let mut r = BufReader::new(s);
    let mut resp = String::new();
    r.read_line(&mut resp).unwrap();
    serde_json::from_str(&resp).unwrap()
}

fn rpc_code(r: Result<Value, ControlError>) -> (i64, String) {
    match r {
        Err(ControlError::Rpc { code, message }) => (code, message),
        other => panic!("expected a JSON-RPC error, got {other:?}"),
    }
}

#[test]
fn socket_is_owner_only_and_version_answers() {
    let env = start();
    let mode = std::fs::metadata(&env.sock).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "socket mode {mode:o}");
    let v = env.client().call("version", Value::Null).unwrap();
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(v["reactors"], 2);
    assert!(v["uptime_s"].as_f64().unwrap() >= 0.0);
    let path = env.sock.clone();
    drop(env);
    assert!(!path.exists(), "the socket file is removed at stop");
}

#[test]
fn stale_socket_is_replaced_and_a_live_one_refused() {
    let sock = sock_path();
    // A stale socket: bound, then its listener dropped.
    drop(UnixListener::bind(&sock).unwrap());
    assert!(sock.exists());
    let cfg = cfg_with("interrupt", &sock, false);
    let target = Target::start(&cfg, Options { pin: false }).unwrap();
    let ctl = ControlServer::start(&target, &cfg).unwrap();
    Client::connect(&sock).unwrap().call("version", Value::Null).unwrap();
    // A second control plane on the same path is refused, and the first keeps serving.
    let err = pollux_target::control::Bound::bind(&cfg.control).unwrap_err();
    assert!(matches!(err, ControlError::SocketInUse { .. }), "{err}");
    assert!(err.to_string().contains("another pollux"), "{err}");
    Client::connect(&sock).unwrap().call("version", Value::Null).unwrap();
    drop(ctl);
    target.shutdown().unwrap();
    // A regular file at the path is not ours to remove.
    std::fs::write(&sock, b"precious").unwrap();
    let err = pollux_target::control::Bound::bind(&cfg.control).unwrap_err();
    assert!(matches!(err, ControlError::NotASocket { .. }), "{err}");
    assert_eq!(std::fs::read(&sock).unwrap(), b"precious");
    std::fs::remove_file(&sock).unwrap();
}

#[test]
fn malformed_and_invalid_requests_get_json_rpc_errors() {
    let env = start();
    let e = raw(&env.sock, b"{not json");
    assert_eq!(e["error"]["code"], -32700);
    assert_eq!(e["id"], Value::Null);
    let e = raw(&env.sock, b"[1,2]");
    assert_eq!(e["error"]["code"], -32600);
    let e = raw(&env.sock, b"42");
    assert_eq!(e["error"]["code"], -32600);
    let e = raw(&env.sock, br#"{"id":1,"method":"version"}"#);
    assert_eq!(e["error"]["code"], -32600, "jsonrpc missing: {e}");
    assert_eq!(e["id"], 1);
    let e = raw(&env.sock, br#"{"jsonrpc":"2.0","id":2,"method":7}"#);
    assert_eq!(e["error"]["code"], -32600);
    let e = raw(&env.sock, br#"{"jsonrpc":"2.0","id":{"x":1},"method":"version"}"#);
    assert_eq!(e["error"]["code"], -32600);
    let e = raw(
        &env.sock,
        br#"{"jsonrpc":"2.0","id":"a","method":"version","params":"x"}"#,
    );
    assert_eq!(e["error"]["code"], -32602);
    assert_eq!(e["id"], "a");
    let (code, msg) = rpc_code(env.client().call("frobnicate", Value::Null));
    assert_eq!(code, -32601);
    assert!(msg.contains("frobnicate"), "{msg}");
    // CRLF line ends are fine.
    let ok = raw(&env.sock, b"{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"version\"}\r");
    assert!(ok["result"]["version"].is_string(), "{ok}");
}

#[test]
fn set_mode_params_are_checked() {
    let env = start();
    let mut c = env.client();
    let cases = [
        (json!({"mode": "poll"}), "missing param 'reactor'"),
        (
            json!({"reactor": "0", "mode": "poll"}),
            "'reactor' must be a non-negative integer",
        ),
        (
            json!({"reactor": -1, "mode": "poll"}),
            "'reactor' must be a non-negative integer",
        ),
        (
            json!({"reactor": 1.5, "mode": "poll"}),
            "'reactor' must be a non-negative integer",
        ),
        (json!({"reactor": 2, "mode": "poll"}), "reactor 2 out of range"),
        (json!({"reactor": 99999999999u64, "mode": "poll"}), "out of range"),
        (json!({"reactor": 0}), "missing param 'mode'"),
        (json!({"reactor": 0, "mode": 3}), "'mode' must be a string"),
        (json!({"reactor": 0, "mode": "turbo"}), "unknown mode 'turbo'"),
        (json!([0, "sleepy"]), "unknown mode 'sleepy'"),
    ];
    for (params, want) in cases {
        let (code, msg) = rpc_code(c.call("set_mode", params.clone()));
        assert_eq!(code, -32602, "{params}");
        assert!(msg.contains(want), "{params}: {msg}");
    }
    // Nothing changed.
    let rs = c.call("reactors", Value::Null).unwrap();
    assert!(rs.as_array().unwrap().iter().all(|r| r["mode"] == "interrupt"));
}

#[test]
fn set_cpu_budget_params_are_checked() {
    let env = start();
    let mut c = env.client();
    for (params, want) in [
        (json!({"reactor": 0}), "missing param 'budget'"),
        (json!({"reactor": 0, "budget": "half"}), "'budget' must be a number"),
        (json!({"reactor": 0, "budget": 0}), "out of range"),
        (json!({"reactor": 0, "budget": -0.5}), "out of range"),
        (json!({"reactor": 0, "budget": 1.01}), "out of range"),
        (json!({"reactor": 7, "budget": 0.5}), "reactor 7 out of range"),
        (
            json!({"reactor": null, "budget": 0.5}),
            "'reactor' must be a non-negative integer",
        ),
    ] {
        let (code, msg) = rpc_code(c.call("set_cpu_budget", params.clone()));
        assert_eq!(code, -32602, "{params}");
        assert!(msg.contains(want), "{params}: {msg}");
    }
    let ok = c.call("set_cpu_budget", json!({"reactor": 1, "budget": 1})).unwrap();
    assert_eq!(ok["cpu_budget"], 1.0);
}

#[test]
fn set_mode_and_budget_take_effect() {
    let env = start_mode("adaptive", false);
    let mut c = env.client();
    let r = c.call("set_mode", json!({"reactor": 1, "mode": "poll"})).unwrap();
    assert_eq!(
        (r["mode"].as_str(), r["adaptive"].as_bool()),
        (Some("poll"), Some(false))
    );
    let stats = env.target().reactor_stats();
    assert_eq!(stats[1].mode.as_str(), "poll");
    assert!(!stats[1].adaptive);
    assert!(stats[0].adaptive, "reactor 0 untouched");
    let rs = c.call("reactors", Value::Null).unwrap();
    assert_eq!(rs[1]["mode"], "poll");
    assert_eq!(rs[1]["adaptive"], false);
    assert_eq!(rs[0]["adaptive"], true);
    let r = c.call("set_mode", json!([1, "hybrid"])).unwrap();
    assert_eq!(r["mode"], "hybrid");
    let r = c.call("set_cpu_budget", json!({"reactor": 1, "budget": 0.75})).unwrap();
    assert_eq!(
        (r["adaptive"].as_bool(), r["cpu_budget"].as_f64()),
        (Some(false), Some(0.75))
    );
    let r = c.call("set_mode", json!({"reactor": 1, "mode": "adaptive"})).unwrap();
    assert_eq!(
        (r["adaptive"].as_bool(), r["cpu_budget"].as_f64()),
        (Some(true), Some(0.75))
    );
    assert!(env.target().reactor_stats()[1].adaptive);
    let r = c.call("set_cpu_budget", json!({"reactor": 1, "budget": 0.1})).unwrap();
    assert_eq!(r["adaptive"], true);
    let rs = c.call("reactors", Value::Null).unwrap();
    assert_eq!(rs[1]["cpu_budget"], 0.1);
    assert_eq!(rs[0]["cpu_budget"], 0.3);
}

#[test]
fn reactors_report_every_field_and_count_io() {
    let env = start();
    let mut ctrl = common::controller(common::addr(env.target()), 2);
    let data = vec![0x5au8; 4096];
    for i in 0..50u64 {
        let q = &mut ctrl.io[(i % 2) as usize];
        q.write(1, i * 8, 8, &data).unwrap();
    }
    let mut out = vec![0u8; 4096];
    ctrl.io[0].read(1, 0, 8, &mut out).unwrap();
    let rs = env.client().call("reactors", Value::Null).unwrap();
    let rs = rs.as_array().unwrap();
    assert_eq!(rs.len(), 2);
    for key in [
        "id",
        "core",
        "mode",
        "adaptive",
        "cpu_budget",
        "mode_ns",
        "mode_pct",
        "switches",
        "cpu_pct_1s",
        "cpu_pct",
        "busy_pct",
        "iterations",
        "iops",
        "commands",
        "outstanding",
        "predicted_ns",
        "wake_cost_ns",
        "hybrid_spin_ns",
        "wake_late_us",
        "stalls",
    ] {
        assert!(rs[0].get(key).is_some(), "missing {key}: {}", rs[0]);
    }
    let total: u64 = rs.iter().map(|r| r["commands"].as_u64().unwrap()).sum();
    assert_eq!(total, 51, "{rs:?}");
    assert!(rs.iter().map(|r| r["iops"].as_f64().unwrap()).sum::<f64>() > 0.0);
    let pct = &rs[0]["mode_pct"];
    let sum = pct["poll"].as_f64().unwrap() + pct["hybrid"].as_f64().unwrap() + pct["interrupt"].as_f64().unwrap();
    assert!((sum - 100.0).abs() < 0.5 || sum == 0.0, "{pct}");
    ctrl.shutdown().unwrap();
}

#[test]
fn subsystems_and_controllers_show_connected_hosts() {
    let env = start();
    let mut c = env.client();
    let empty = c.call("controllers", Value::Null).unwrap();
    assert_eq!(empty["controllers"].as_array().unwrap().len(), 0);
    let ctrl = common::controller(common::addr(env.target()), 3);
    let list = c.call("controllers", Value::Null).unwrap();
    assert_eq!(list["unanswered"], json!([]));
    let cs = list["controllers"].as_array().unwrap();
    assert_eq!(cs.len(), 1, "{list}");
    let x = &cs[0];
    assert_eq!(x["cntlid"], ctrl.cntlid);
    assert_eq!(x["subsystem"], NQN);
    assert_eq!(x["hostnqn"], HOST);
    assert_eq!(x["discovery"], false);
    assert_eq!(x["ready"], true);
    let queues = x["io_queues"].as_object().unwrap();
    assert_eq!(queues.keys().cloned().collect::<Vec<_>>(), ["1", "2", "3"]);
    assert!(queues.values().all(|r| r.as_u64().unwrap() < 2));
    assert!(x["admin_reactor"].as_u64().unwrap() < 2);
    assert!(x["created_unix_s"].as_f64().unwrap() > 1.0e9);
    let ss = c.call("subsystems", Value::Null).unwrap();
    let ss = ss.as_array().unwrap();
    assert_eq!(ss.len(), 2);
    assert_eq!(ss[0]["nqn"], NQN);
    assert_eq!(ss[0]["controllers"], 1);
    assert_eq!(ss[0]["allow_any_host"], true);
    assert_eq!(ss[1]["nqn"], NQN_PRIVATE);
    assert_eq!(ss[1]["controllers"], 0);
    assert_eq!(ss[1]["hosts"], json!([common::OTHER_HOST]));
    let ns = &ss[0]["namespaces"][0];
    assert_eq!(ns["nsid"], 1);
    assert_eq!(ns["size"], 16 << 20);
    assert_eq!(ns["block_size"], 512);
    assert_eq!(ns["backend"], "ram");
    assert_eq!(ns["uuid"].as_str().unwrap().len(), 36);
    assert_eq!(ss[0]["listeners"], json!([common::addr(env.target()).to_string()]));
    ctrl.shutdown().unwrap();
    // The controller is gone once its admin queue is.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let n = c.call("controllers", Value::Null).unwrap()["controllers"]
            .as_array()
            .unwrap()
            .len();
        if n == 0 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "controller still listed");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn an_oversized_line_is_refused_without_reading_it_all() {
    let env = start();
    let s = UnixStream::connect(&env.sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut w = s.try_clone().unwrap();
    // Far more than the limit and no newline: the server must answer and close rather than
    // keep reading. The writer gives up once the server has closed.
    let writer = std::thread::spawn(move || {
        let chunk = vec![b'x'; 64 * 1024];
        let mut sent = 0usize;
        while sent < 64 * MAX_LINE {
            match w.write(&chunk) {
                Ok(n) => sent += n,
                Err(_) => break,
            }
        }
        sent
    });
    let mut r = BufReader::new(s);
    let mut resp = String::new();
    r.read_line(&mut resp).unwrap();
    let v: Value = serde_json::from_str(&resp).unwrap();
    assert_eq!(v["error"]["code"], -32600, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("65536"), "{v}");
    let mut rest = Vec::new();
    let _ = r.read_to_end(&mut rest);
    assert!(rest.is_empty(), "connection closed after the error");
    let sent = writer.join().unwrap();
    assert!(sent < 64 * MAX_LINE, "the server stopped reading ({sent} bytes sent)");
    // A line just under the limit is read (and is simply not JSON).
    let line = vec![b'x'; MAX_LINE - 10];
    assert_eq!(raw(&env.sock, &line)["error"]["code"], -32700);
    // A JSON value still open past the limit (a request may span lines: SPDK's client
    // pretty-prints them) is refused too.
    let mut open = b"{\"jsonrpc\": \"2.0\",\n".to_vec();
    open.extend(std::iter::repeat_n(b' ', MAX_LINE + 10));
    assert_eq!(raw(&env.sock, &open)["error"]["code"], -32600);
    env.client().call("version", Value::Null).unwrap();
}

#[test]
fn disconnects_mid_request_and_notifications_are_harmless() {
    let env = start();
    for _ in 0..10 {
        let mut s = UnixStream::connect(&env.sock).unwrap();
        s.write_all(br#"{"jsonrpc":"2.0","id":1,"meth"#).unwrap();
        drop(s);
    }
    // A client that sends a request and leaves before the answer.
    let mut s = UnixStream::connect(&env.sock).unwrap();
    s.write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"controllers\"}\n")
        .unwrap();
    drop(s);
    // A notification gets no response: the next line's answer is the first one.
    let mut s = UnixStream::connect(&env.sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"version\"}\n\n")
        .unwrap();
    s.write_all(b"{\"jsonrpc\":\"2.0\",\"id\":\"second\",\"method\":\"version\"}\n")
        .unwrap();
    let mut resp = String::new();
    BufReader::new(s).read_line(&mut resp).unwrap();
    let v: Value = serde_json::from_str(&resp).unwrap();
    assert_eq!(v["id"], "second");
    env.client().call("version", Value::Null).unwrap();
}

#[test]
fn many_clients_at_once() {
    let env = start();
    let sock = env.sock.clone();
    let threads: Vec<_> = (0..16)
        .map(|i| {
            let sock = sock.clone();
            std::thread::spawn(move || {
                let mut c = Client::connect(&sock).unwrap();
                for j in 0..20 {
                    let m = ["version", "reactors", "subsystems", "controllers"][(i + j) % 4];
                    c.call(m, Value::Null).unwrap();
                }
            })
        })
        .collect();
    // Idle clients do not hold the others up.
    let idle: Vec<_> = (0..8).map(|_| UnixStream::connect(&sock).unwrap()).collect();
    for t in threads {
        t.join().unwrap();
    }
    drop(idle);
}

fn http_get(addr: std::net::SocketAddr, path: &str) -> (String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let (head, body) = resp.split_once("\r\n\r\n").unwrap();
    (head.to_string(), body.to_string())
}

#[test]
fn reactors_report_one_estimate_per_channel_and_class_and_their_weighted_mean() {
    // Two simulated namespaces on one reactor's queue: 10 us and 80 us reads, three fast
    // reads for each slow one, the slow one always last. The policy's estimate is their
    // completion-weighted mean, not the 80 us of whichever completed last.
    let sock = sock_path();
    let sim = |us: f64| {
        format!("{{ sim = {{ size = \"1MiB\", read = {{ fixed_us = {us:.1} }}, write = {{ fixed_us = {us:.1} }} }} }}")
    };
    let namespaces = format!(
        "[[subsystem.namespace]]\nnsid = 1\nblock_size = 4096\nbackend = {}\n\n\
         [[subsystem.namespace]]\nnsid = 2\nblock_size = 4096\nbackend = {}\n",
        sim(10.0),
        sim(80.0)
    );
    let control = format!("[control]\nsocket = \"{}\"\n", sock.display());
    let text = common::conf_with("interrupt", &control, NQN, &namespaces);
    let cfg = Config::parse(&text, "classes-test.toml").unwrap();
    let target = Target::start(&cfg, Options { pin: false }).unwrap();
    let ctl = ControlServer::start(&target, &cfg).unwrap();
    let mut ctrl = common::controller(common::addr(&target), 1);
    let mut out = vec![0u8; 4096];
    for i in 0..40u64 {
        for _ in 0..3 {
            ctrl.io[0].read(1, i % 16, 1, &mut out).unwrap();
        }
        ctrl.io[0].read(2, i % 16, 1, &mut out).unwrap();
    }
    let mut c = Client::connect(&sock).unwrap();
    // An interrupt-mode reactor evaluates when an iteration ends: a message wakes it (again,
    // until it has published the last completions).
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let (rs, r) = loop {
        std::thread::sleep(Duration::from_millis(5));
        c.call("controllers", Value::Null).unwrap();
        std::thread::sleep(Duration::from_millis(5));
        let rs = c.call("reactors", Value::Null).unwrap();
        let r = rs.as_array().unwrap().iter().find(|r| {
            let cs = r["classes"].as_array().unwrap();
            cs.iter().map(|c| c["completions"].as_u64().unwrap()).sum::<u64>() == 160
        });
        match r {
            Some(r) => break (rs.clone(), r.clone()),
            None if std::time::Instant::now() < deadline => {}
            None => panic!("no reactor published 160 class completions: {rs}"),
        }
    };
    let classes = r["classes"].as_array().unwrap();
    assert_eq!(classes.len(), 2, "{r}");
    let class = |name: &str| {
        classes
            .iter()
            .find(|c| c["channel"].as_str().unwrap().starts_with(name))
            .unwrap_or_else(|| panic!("no {name} in {r}"))
    };
    let (fast, slow) = (class("sim-ns1-"), class("sim-ns2-"));
    for (c, n) in [(fast, 120), (slow, 40)] {
        assert_eq!(c["op"], "read", "{c}");
        assert_eq!(c["size"], "<=4KiB", "{c}");
        assert_eq!(c["completions"], n, "{c}");
        assert!(c.get("window_completions").is_some(), "{c}");
    }
    let (f, s) = (
        fast["estimate_ns"].as_u64().unwrap(),
        slow["estimate_ns"].as_u64().unwrap(),
    );
    let p = r["predicted_ns"].as_u64().unwrap();
    assert!(f >= 10_000 && s >= 80_000 && f < s, "{r}");
    assert!(p > f && p < s, "predicted {p} ns between the classes' {f} and {s}: {r}");
    // The table shows them too.
    let views: Vec<pollux_target::control::view::ReactorView> = serde_json::from_value(rs).unwrap();
    let text = pollux_target::control::format::format_classes(&views);
    assert!(text.contains("CHANNEL") && text.contains("sim-ns2-"), "{text}");
    // The reactors table stays one row per reactor (scripts read it by reactor id).
    let reactors = pollux_target::control::format::format_reactors(&views, false);
    assert!(!reactors.contains("CHANNEL"), "{reactors}");
    ctrl.shutdown().unwrap();
    drop(ctl);
    target.shutdown().unwrap();
}

#[test]
fn metrics_endpoint_serves_prometheus_text() {
    let env = start_mode("interrupt", true);
    let ctrl = common::controller(common::addr(env.target()), 1);
    let addr = env.ctl.metrics_addr().unwrap();
    let (head, body) = http_get(addr, "/metrics");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");
    for want in [
        "pollux_reactor_mode{reactor=\"0\",mode=\"interrupt\"} 1",
        "pollux_reactor_mode{reactor=\"1\",mode=\"poll\"} 0",
        "# TYPE pollux_reactor_cpu_seconds_total counter",
        "pollux_reactor_busy_seconds_total{reactor=\"1\"}",
        "pollux_reactor_mode_seconds_total{reactor=\"0\",mode=\"hybrid\"}",
        "pollux_reactor_switches_total{reactor=\"0\"} 0",
        "pollux_reactor_stalls_total{reactor=\"0\"}",
        "pollux_reactor_outstanding{reactor=\"0\"} 0",
        "pollux_reactor_predicted_latency_seconds{reactor=\"0\"}",
        "pollux_namespace_read_commands_total{subsystem=\"nqn.2026-11.io.pollux:test0\",nsid=\"1\"}",
        "pollux_namespace_write_bytes_total{subsystem=\"nqn.2026-11.io.pollux:private\",nsid=\"1\"} 0",
        "pollux_subsystem_controllers{subsystem=\"nqn.2026-11.io.pollux:test0\"} 1",
        "pollux_subsystem_controllers{subsystem=\"nqn.2026-11.io.pollux:private\"} 0",
    ] {
        assert!(body.contains(want), "missing {want} in\n{body}");
    }
    let (head, _) = http_get(addr, "/");
    assert!(head.starts_with("HTTP/1.1 404"), "{head}");
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"POST /metrics HTTP/1.1\r\n\r\n").unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    assert!(resp.starts_with("HTTP/1.1 405"), "{resp}");
    assert!(resp.contains("Allow: GET, HEAD\r\n"), "{resp}");
    // Broken requests get an HTTP error, and the endpoint keeps serving.
    let raw_http = |req: &[u8]| {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(req).unwrap();
        let mut resp = Vec::new();
        let _ = s.read_to_end(&mut resp);
        String::from_utf8_lossy(&resp).into_owned()
    };
    for garbage in [
        &b"\x00\x01\x02 garbage\r\n\r\n"[..],
        b"GET /metrics HTTP/9.9\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n",
    ] {
        let resp = raw_http(garbage);
        assert!(resp.starts_with("HTTP/1.1 400"), "{garbage:?}: {resp}");
    }
    let mut huge = b"GET /metrics HTTP/1.1\r\n".to_vec();
    while huge.len() <= 16 * 1024 {
        huge.extend_from_slice(b"X-Filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n");
    }
    assert!(raw_http(&huge).starts_with("HTTP/1.1 431"));
    let (head, body) = http_get(addr, "/metrics?x=1");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        body.contains("# TYPE pollux_reactor_cpu_seconds_total counter"),
        "{body}"
    );
    ctrl.shutdown().unwrap();
}

/// The sum over reactors of `pollux_connections_closed_total` for `reason`.
fn closed_total(body: &str, reason: &str) -> u64 {
    let label = format!("reason=\"{reason}\"}}");
    body.lines()
        .filter(|l| l.starts_with("pollux_connections_closed_total{") && l.contains(&label))
        .map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap())
        .sum()
}

#[test]
fn closed_connections_are_counted_by_reason() {
    let env = start_mode("interrupt", true);
    let addr = env.ctl.metrics_addr().unwrap();
    let (_, body) = http_get(addr, "/metrics");
    assert!(
        body.contains("# TYPE pollux_connections_closed_total counter"),
        "{body}"
    );
    assert_eq!(closed_total(&body, "pdu_sequence"), 0, "{body}");
    // A command capsule before ICReq (NVMe/TCP 1.0 §3.6.2.1): C2HTermReq, then close.
    let mut s = TcpStream::connect(common::addr(env.target())).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut capsule = [0u8; 72];
    capsule[..8].copy_from_slice(&[0x04, 0, 72, 0, 72, 0, 0, 0]);
    s.write_all(&capsule).unwrap();
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
    assert_eq!(rest.first(), Some(&0x03), "C2HTermReq expected: {rest:?}");
    // The count is the reactor's, read by the next scrape.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let (_, body) = http_get(addr, "/metrics");
        if closed_total(&body, "pdu_sequence") == 1 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "close not counted:\n{body}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn every_listed_method_is_dispatched() {
    // `pollux ctl call` accepts rpc::METHODS: each must reach a handler (a missing or bad
    // parameter is fine here), and nothing else may.
    let env = start();
    let cfg = Config::parse(&common::conf("interrupt", ""), "t.toml").unwrap();
    let ctx = pollux_target::control::rpc::Ctx::new(env.target(), &cfg.reactors);
    for m in pollux_target::control::methods::METHODS.iter().map(|m| m.name) {
        // Methods that change or write the running state are not run: a wrong parameter
        // stops them before they do anything.
        let params = match m {
            "version" | "reactors" | "subsystems" | "discovery" | "controllers" | "nvme_devices" | "methods" => {
                Value::Null
            }
            "save" => json!({"path": 1}),
            _ => json!({"__not_a_param__": true}),
        };
        if let Err(e) = ctx.call(m, &params) {
            assert_ne!(e.code, -32601, "{m} is listed but not dispatched: {}", e.message);
        }
    }
    let e = ctx.call("no_such_method", &Value::Null).unwrap_err();
    assert_eq!(e.code, -32601);
    // A typo is answered with the nearest method.
    let e = ctx.call("add_nammespace", &Value::Null).unwrap_err();
    assert_eq!(e.code, -32601);
    assert!(e.message.contains("did you mean 'add_namespace'"), "{}", e.message);
}

/// The per-namespace polling policy (issue 25) at run time: `set_polling` changes it in place
/// (the RAM namespace keeps its data), `subsystems` and the tables report it, `reactors`
/// reports the `always` hold, `never` I/O completes in every mode (its channel waits for the
/// simulated interrupt even in hybrid mode), a bad value is refused with the conf's message,
/// and `save` writes it.
#[test]
fn polling_policy_changes_at_run_time_and_is_reported() {
    let sock = sock_path();
    let namespaces = "[[subsystem.namespace]]\nnsid = 1\nblock_size = 4096\nbackend = { ram = { size = \"1MiB\" } }\n\n\
         [[subsystem.namespace]]\nnsid = 2\nblock_size = 4096\npolling = \"never\"\n\
         backend = { sim = { size = \"1MiB\", read = { fixed_us = 80.0 }, write = { fixed_us = 80.0 } } }\n";
    let control = format!("[control]\nsocket = \"{}\"\n", sock.display());
    let text = common::conf_with("interrupt", &control, NQN, namespaces);
    let cfg = Config::parse(&text, "polling-test.toml").unwrap();
    let target = Target::start(&cfg, Options { pin: false }).unwrap();
    let ctl = ControlServer::start(&target, &cfg).unwrap();
    let mut c = Client::connect(&sock).unwrap();
    let polling_of = |c: &mut Client, nsid: u64| -> String {
        let ss = c.call("subsystems", Value::Null).unwrap();
        let s = ss.as_array().unwrap().iter().find(|s| s["nqn"] == NQN).unwrap().clone();
        let n = s["namespaces"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["nsid"] == nsid)
            .unwrap()
            .clone();
        n["polling"].as_str().unwrap().to_string()
    };
    assert_eq!(polling_of(&mut c, 1), "auto");
    assert_eq!(polling_of(&mut c, 2), "never", "from the conf");

    let mut ctrl = common::controller(common::addr(&target), 1);
    let data = common::pattern(7, 0, 4096);
    ctrl.io[0].write(1, 3, 1, &data).unwrap();

    // always on the RAM namespace: applied in place, reported.
    let r = c
        .call("set_polling", json!({"nqn": NQN, "nsid": 1, "polling": "always"}))
        .unwrap();
    assert_eq!(r["polling_changed"], json!([[NQN, 1, "always"]]), "{r}");
    assert_eq!(r["added_namespaces"], json!([]), "{r}");
    assert_eq!(r["changed_subsystems"], json!([]), "nothing reopened: {r}");
    assert_eq!(polling_of(&mut c, 1), "always");
    let mut out = vec![0u8; 4096];
    ctrl.io[0].read(1, 3, 1, &mut out).unwrap();
    assert_eq!(out, data, "the RAM namespace kept its data");
    for i in 0..200u64 {
        ctrl.io[0].read(1, i % 16, 1, &mut out).unwrap();
    }
    let rs = c.call("reactors", Value::Null).unwrap();
    let held: f64 = rs
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["held_pct"].as_f64().unwrap())
        .sum();
    assert!(held > 0.0, "an interrupt-mode reactor was held in busy-poll: {rs}");
    let views: Vec<pollux_target::control::view::ReactorView> = serde_json::from_value(rs).unwrap();
    assert!(pollux_target::control::format::format_reactors(&views, true).contains("HELD%"));

    // never: I/O completes in each mode, by the interrupt where the reactor sleeps.
    for mode in ["hybrid", "interrupt", "poll", "adaptive"] {
        for reactor in 0..2 {
            c.call("set_mode", json!({"reactor": reactor, "mode": mode})).unwrap();
        }
        for i in 0..20u64 {
            ctrl.io[0].read(2, i % 16, 1, &mut out).unwrap();
        }
    }
    // The subsystem default is for the namespaces that set none: both set their own here.
    let r = c.call("set_polling", json!({"nqn": NQN, "polling": "always"})).unwrap();
    assert_eq!(r["polling_changed"], json!([]), "each keeps its own: {r}");
    let r = c
        .call("set_polling", json!({"nqn": NQN, "nsid": 2, "polling": "auto"}))
        .unwrap();
    assert_eq!(r["polling_changed"], json!([[NQN, 2, "auto"]]), "{r}");
    let r = c
        .call("set_polling", json!({"nqn": NQN, "nsid": 2, "polling": "never"}))
        .unwrap();
    assert_eq!(r["polling_changed"], json!([[NQN, 2, "never"]]), "{r}");
    let ss: Vec<pollux_target::control::view::SubsystemView> =
        serde_json::from_value(c.call("subsystems", Value::Null).unwrap()).unwrap();
    let table = pollux_target::control::format::format_subsystems(&ss);
    assert!(
        table.contains("POLLING") && table.contains("always") && table.contains("never"),
        "{table}"
    );

    // Refused: an unknown value (the conf's message), a namespace that is not there.
    let (code, msg) = rpc_code(c.call("set_polling", json!({"nqn": NQN, "nsid": 1, "polling": "sometimes"})));
    assert_eq!(code, -32602);
    assert!(msg.contains("polling") && msg.contains("always"), "{msg}");
    let (_, msg) = rpc_code(c.call("set_polling", json!({"nqn": NQN, "nsid": 9, "polling": "never"})));
    assert!(msg.contains("no namespace 9"), "{msg}");
    assert_eq!(polling_of(&mut c, 1), "always", "a refused change changes nothing");

    // save writes the running policy.
    let path = std::env::temp_dir().join(format!("pollux-polling-{}.toml", std::process::id()));
    c.call("save", json!({"path": path.to_str().unwrap()})).unwrap();
    let saved = Config::from_path(&path).unwrap();
    let s = saved.subsystems.iter().find(|s| s.nqn == NQN).unwrap();
    assert_eq!(s.polling, Some(pollux_conf::Polling::Always));
    assert_eq!(s.polling_of(&s.namespaces[0]), pollux_conf::Polling::Always);
    assert_eq!(s.polling_of(&s.namespaces[1]), pollux_conf::Polling::Never);
    let _ = std::fs::remove_file(&path);
    ctrl.shutdown().unwrap();
    drop(ctl);
    target.shutdown().unwrap();
}

/// A subsystem's `secure_concat` at run time: `set_subsystem_secure_concat` edits it in place
/// without dropping the connected controller, `add_subsystem` takes it, `subsystems` and the
/// table report it, wrong params are refused by name, and `save` writes it.
#[test]
fn secure_concat_changes_at_run_time_and_is_reported() {
    let env = start();
    let mut c = env.client();
    let concat_of = |c: &mut Client, nqn: &str| -> Value {
        let ss = c.call("subsystems", Value::Null).unwrap();
        ss.as_array().unwrap().iter().find(|s| s["nqn"] == nqn).unwrap()["secure_concat"].clone()
    };
    assert_eq!(concat_of(&mut c, NQN), json!(false), "the default");

    let mut ctrl = common::controller(common::addr(env.target()), 1);
    let data = common::pattern(3, 0, 512);
    ctrl.io[0].write(1, 5, 1, &data).unwrap();

    let r = c
        .call("set_subsystem_secure_concat", json!({"nqn": NQN, "enable": true}))
        .unwrap();
    assert_eq!(r["changed_subsystems"], json!([NQN]), "{r}");
    assert_eq!(r["added_namespaces"], json!([]), "the namespace is kept: {r}");
    assert_eq!(concat_of(&mut c, NQN), json!(true));
    assert_eq!(concat_of(&mut c, NQN_PRIVATE), json!(false), "only the one named");
    let ss: Vec<pollux_target::control::view::SubsystemView> =
        serde_json::from_value(c.call("subsystems", Value::Null).unwrap()).unwrap();
    let table = pollux_target::control::format::format_subsystems(&ss);
    assert_eq!(table.matches("secure_concat true").count(), 1, "{table}");

    // The controller stayed, with its data.
    let mut back = vec![0u8; 512];
    ctrl.io[0].read(1, 5, 1, &mut back).unwrap();
    assert_eq!(back, data);
    let list = c.call("controllers", Value::Null).unwrap();
    assert_eq!(list["controllers"].as_array().unwrap().len(), 1, "{list}");

    // Refused by name; a refused change changes nothing.
    for params in [
        json!({"nqn": NQN}),
        json!({"nqn": NQN, "enable": "yes"}),
        json!({"nqn": NQN, "enable": 1}),
    ] {
        let (code, msg) = rpc_code(c.call("set_subsystem_secure_concat", params.clone()));
        assert_eq!(code, -32602, "{params}");
        assert!(msg.contains("missing boolean param 'enable'"), "{params}: {msg}");
    }
    let (code, msg) = rpc_code(c.call(
        "set_subsystem_secure_concat",
        json!({"nqn": "nqn.2026-11.io.pollux:nope", "enable": true}),
    ));
    assert_eq!(code, -32602);
    assert!(msg.contains("no subsystem 'nqn.2026-11.io.pollux:nope'"), "{msg}");
    assert_eq!(concat_of(&mut c, NQN), json!(true));

    // add_subsystem takes it as a boolean; anything else names the param and the value.
    let added = "nqn.2026-11.io.pollux:concat";
    c.call(
        "add_subsystem",
        json!({"nqn": added, "allow_any_host": true, "secure_concat": true}),
    )
    .unwrap();
    assert_eq!(concat_of(&mut c, added), json!(true));
    let (code, msg) = rpc_code(c.call(
        "add_subsystem",
        json!({"nqn": "nqn.2026-11.io.pollux:bad", "allow_any_host": true, "secure_concat": "yes"}),
    ));
    assert_eq!(code, -32602);
    assert!(
        msg.contains("param 'secure_concat' = \"yes\"") && msg.contains("expected a boolean"),
        "{msg}"
    );

    // save writes the running values.
    let path = std::env::temp_dir().join(format!("pollux-concat-{}.toml", std::process::id()));
    c.call("save", json!({"path": path.to_str().unwrap()})).unwrap();
    let saved = Config::from_path(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    let of = |nqn: &str| saved.subsystems.iter().find(|s| s.nqn == nqn).unwrap().secure_concat;
    assert!(of(NQN) && of(added) && !of(NQN_PRIVATE));

    // And off again.
    c.call("set_subsystem_secure_concat", json!({"nqn": NQN, "enable": false}))
        .unwrap();
    assert_eq!(concat_of(&mut c, NQN), json!(false));
    ctrl.shutdown().unwrap();
}

#[test]
fn requests_spanning_lines_or_back_to_back_are_each_answered() {
    // SPDK's client (spdk.rpc.client) sends a request pretty-printed over several lines with
    // nothing after it, and may send several back to back.
    let env = start();
    let mut s = UnixStream::connect(&env.sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"{\n  \"jsonrpc\": \"2.0\",\n  \"method\": \"spdk_get_version\",\n  \"id\": 1\n}")
        .unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut resp = String::new();
    r.read_line(&mut resp).unwrap();
    let v: Value = serde_json::from_str(&resp).unwrap();
    assert_eq!(
        (v["id"].clone(), v["result"]["fields"]["major"].clone()),
        (json!(1), json!(26)),
        "{v}"
    );
    s.write_all(
        br#"{"jsonrpc":"2.0","method":"version","id":2}{"jsonrpc":"2.0","method":"nvmf_get_transports","id":3}"#,
    )
    .unwrap();
    for id in [2, 3] {
        resp.clear();
        r.read_line(&mut resp).unwrap();
        let v: Value = serde_json::from_str(&resp).unwrap();
        assert_eq!(v["id"], json!(id), "{v}");
        assert!(v.get("result").is_some(), "{v}");
    }
}
