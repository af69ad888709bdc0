//! The control socket's JSON-RPC: one request line at a time to a running in-process target
//! (a RAM namespace, one reactor), every method reachable, pollux's own and SPDK's. Whatever
//! the line, an answer that is a JSON-RPC response (or none, for a notification), never a
//! panic. Requests that would reach outside the process are skipped: an upgrade (it runs a
//! binary), a save or export (it writes a file), anything naming a path (a file namespace
//! or bdev creates its file), and a Ceph cluster (librbd waits on monitors for seconds).
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use pollux_target::control::rpc::Ctx;
use pollux_target::{Options, Target};
use serde_json::Value;

const CONF: &str = r#"
[reactors]
cores = [0]
mode = "interrupt"

[[listener]]
address = "127.0.0.1:0"

[[subsystem]]
nqn = "nqn.2026-12.io.pollux.fuzz:ram"
allow_any_host = true

[[subsystem.namespace]]
nsid = 1
backend = { ram = { size = "1MiB" } }
"#;

const OUTSIDE: [&str; 9] = [
    "upgrade",
    "save",
    "export",
    "rbd",
    "nvme_attach",
    "nvme-fault",
    "nvme_fault",
    "setup",
    "reload",
];

fn reaches_outside(v: &Value) -> bool {
    match v {
        Value::String(s) => s.contains('/') || s.contains('\\') || OUTSIDE.iter().any(|m| s.contains(m)),
        Value::Array(a) => a.iter().any(reaches_outside),
        Value::Object(o) => o
            .iter()
            .any(|(k, v)| OUTSIDE.iter().any(|m| k.contains(m)) || reaches_outside(v)),
        _ => false,
    }
}

fn ctx() -> &'static Ctx {
    static CTX: OnceLock<(Target, Ctx)> = OnceLock::new();
    &CTX.get_or_init(|| {
        let cfg = pollux_conf::Config::parse(CONF, "fuzz").expect("the fuzz target's conf");
        let target = Target::start(&cfg, Options { pin: false }).expect("an in-process target");
        let ctx = Ctx::new(&target, &cfg.reactors);
        (target, ctx)
    })
    .1
}

fuzz_target!(|data: &[u8]| {
    match serde_json::from_slice::<Value>(data) {
        Ok(v) if reaches_outside(&v) => return,
        // Bytes that are not JSON go through too: the parse error is the answer.
        _ => {}
    }
    if let Some(reply) = ctx().handle_line(data) {
        let v: Value = serde_json::from_str(&reply).expect("a reply that is JSON");
        assert_eq!(v["jsonrpc"], "2.0", "{reply}");
        assert!(v.get("result").is_some() != v.get("error").is_some(), "{reply}");
    }
});
