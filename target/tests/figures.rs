//! The figures an operator reads: per-namespace read and write latency histograms in
//! `pollux ctl subsystems` and `/metrics`, and each listener's ANA state per group.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use pollux_target::control::format::format_subsystems;
use pollux_target::control::view::SubsystemView;

#[test]
fn reads_and_writes_fill_their_namespace_latency_histograms() {
    let extra = "[[listener]]\naddress = \"127.0.0.2:0\"\nana = { 2 = \"inaccessible\" }\n";
    let (t, ctx) = start_with_ctx(&conf("interrupt", extra));
    let mut c = controller(addr(&t), 1);
    let data = pattern(1, 0, 8 * 512);
    for lba in 0..5 {
        c.io[0].write(1, lba * 8, 8, &data).unwrap();
    }
    let mut back = vec![0u8; data.len()];
    for _ in 0..3 {
        c.io[0].read(1, 0, 8, &mut back).unwrap();
    }
    let v: Vec<SubsystemView> =
        serde_json::from_value(ctx.call("subsystems", &serde_json::Value::Null).unwrap()).unwrap();
    let s = v.iter().find(|s| s.nqn == NQN).unwrap();
    let n = &s.namespaces[0];
    assert_eq!((n.read_latency.count, n.write_latency.count), (3, 5), "{n:?}");
    for l in [&n.read_latency, &n.write_latency] {
        assert!(l.p50_ns > 0 && l.p50_ns <= l.p99_ns && l.sum_ns > 0, "{l:?}");
        assert!(l.p99_ns < 5_000_000_000, "{l:?}");
    }
    // The other subsystem's namespace saw nothing.
    let p = v.iter().find(|s| s.nqn == NQN_PRIVATE).unwrap();
    assert_eq!(p.namespaces[0].read_latency.count, 0);

    // Each listener with its ANA state for the subsystem's group (1): optimized on both.
    let listeners = t.listen_addrs();
    assert_eq!(s.paths.len(), 2, "{:?}", s.paths);
    for (p, a) in s.paths.iter().zip(&listeners) {
        assert_eq!(p.address, a.to_string());
        assert_eq!(p.ana, vec![(1, "optimized".to_string())]);
    }
    let text = format_subsystems(&v);
    assert!(text.contains("R_P50") && text.contains("W_P99"), "{text}");
    assert!(text.contains(&format!("{}  none  1:optimized", listeners[1])), "{text}");

    // Group 2 is inaccessible on the second listener: a subsystem with a namespace in it
    // shows that.
    ctx.call(
        "add_namespace",
        &serde_json::json!({"nqn": NQN, "nsid": 2, "ana_group": 2, "backend": {"ram": {"size": "1MiB"}}}),
    )
    .unwrap();
    let v: Vec<SubsystemView> =
        serde_json::from_value(ctx.call("subsystems", &serde_json::Value::Null).unwrap()).unwrap();
    let s = v.iter().find(|s| s.nqn == NQN).unwrap();
    assert_eq!(
        s.paths[1].ana,
        vec![(1, "optimized".to_string()), (2, "inaccessible".to_string())]
    );

    let m = ctx.metrics().unwrap();
    let count = format!("pollux_namespace_write_latency_seconds_count{{subsystem=\"{NQN}\",nsid=\"1\"}} 5");
    assert!(m.contains(&count), "{m}");
    assert!(m.contains("pollux_namespace_read_latency_seconds_bucket{"), "{m}");
    assert!(m.contains("pollux_build_info{version=\""), "{m}");
    assert!(m.contains("process_resident_memory_bytes "), "{m}");
    t.shutdown().unwrap();
}
