//! The exposition's tests: what a scrape says for given views.
#![allow(clippy::unwrap_used)]

use super::*;
use crate::control::view::{ClassView, Lateness, NamespaceView, PerMode};

fn reactor(id: usize, mode: &str) -> ReactorView {
    ReactorView {
        id,
        core: Some(id),
        mode: mode.into(),
        adaptive: id == 0,
        cpu_budget: 0.3,
        mode_ns: PerMode::from_array([1_500_000_000, 0, 2]),
        mode_pct: PerMode::default(),
        switches: 3,
        held: false,
        held_pct: 0.0,
        cpu_ns: 123_456_789,
        cpu_pct_1s: 12.5,
        cpu_pct: 10.0,
        busy_ns: 5,
        busy_pct: 1.0,
        iterations: 99,
        iops: 10.0,
        commands: 1000,
        outstanding: 2,
        device_completions: 7,
        predicted_ns: 80_000,
        classes: vec![ClassView {
            channel: "sim-ns1-r0".into(),
            op: "read".into(),
            size: "<=4KiB".into(),
            estimate_ns: 80_000,
            completions: 10,
            window_completions: 2,
        }],
        wake_cost_ns: 9_000,
        hybrid_spin_ns: 0,
        wakeups: 4,
        wake_late_us: Lateness::default(),
        stalls: 1,
        sources: 3,
        connections: 2,
        admin_queues: 1,
        io_queues: 1,
        closed: Default::default(),
        requests: Default::default(),
    }
}

fn subsystem(nqn: &str) -> SubsystemView {
    SubsystemView {
        nqn: nqn.into(),
        serial: "S".into(),
        model: "M".into(),
        allow_any_host: true,
        hosts: vec![],
        dhchap_hosts: vec![],
        tls_hosts: vec![],
        secure_concat: false,
        vanished: vec![],
        namespaces: vec![NamespaceView {
            nsid: 1,
            size: 4096,
            block_size: 512,
            backend: "ram".into(),
            io_path: "inline".into(),
            uuid: "u".into(),
            read_cmds: 1,
            write_cmds: 2,
            read_bytes: 512,
            write_bytes: 1024,
            reservation: String::new(),
            reservations: String::new(),
            polling: "auto".into(),
            hosts: None,
            rbd: None,
            qos: None,
            read_latency: LatencyView::of(&{
                let h = crate::latency::LatencyHistogram::default();
                // Two reads of 3 us, one of 5 ms.
                h.record(3_000);
                h.record(3_000);
                h.record(5_000_000);
                let mut l = crate::latency::Latencies::default();
                h.add_to(&mut l);
                l
            }),
            write_latency: LatencyView::default(),
        }],
        listeners: vec![],
        paths: vec![],
        controllers: 1,
        min_cntlid: 1,
        max_cntlid: 0xFFEF,
    }
}

/// Checks the exposition format: HELP then TYPE before each family's samples, every
/// sample `name{k="v",...} value` with a known family name and a float value, names and
/// label names valid identifiers, label values properly quoted.
/// A parsed sample: name, labels, value.
type Sample = (String, Vec<(String, String)>, f64);

fn validate(text: &str) -> Vec<Sample> {
    let ident = |s: &str| {
        !s.is_empty()
            && s.chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
            && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    };
    let mut samples = Vec::new();
    let mut helped = std::collections::HashSet::new();
    let mut typed = std::collections::HashMap::new();
    assert!(text.ends_with('\n'));
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap();
            assert!(ident(name) && !help.is_empty(), "{line}");
            assert!(helped.insert(name.to_string()), "second HELP for {name}");
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            assert!(helped.contains(name), "TYPE before HELP: {line}");
            assert!(["counter", "gauge", "histogram"].contains(&kind), "{line}");
            assert!(typed.insert(name.to_string(), kind.to_string()).is_none());
            continue;
        }
        assert!(!line.starts_with('#'), "stray comment {line}");
        let (series, value) = line.rsplit_once(' ').unwrap();
        let v: f64 = value.parse().unwrap_or_else(|_| panic!("bad value in {line}"));
        let (name, labels) = match series.split_once('{') {
            Some((n, rest)) => {
                let body = rest
                    .strip_suffix('}')
                    .unwrap_or_else(|| panic!("unclosed labels: {line}"));
                let mut labels = Vec::new();
                let mut rest = body;
                while !rest.is_empty() {
                    let (k, r) = rest.split_once("=\"").unwrap();
                    assert!(ident(k), "{line}");
                    let mut val = String::new();
                    let mut chars = r.char_indices();
                    let end = loop {
                        match chars.next().unwrap() {
                            (_, '\\') => match chars.next().unwrap().1 {
                                'n' => val.push('\n'),
                                c @ ('\\' | '"') => val.push(c),
                                c => panic!("bad escape \\{c} in {line}"),
                            },
                            (i, '"') => break i,
                            (_, c) => val.push(c),
                        }
                    };
                    labels.push((k.to_string(), val));
                    rest = &r[end + 1..];
                    rest = rest.strip_prefix(',').unwrap_or(rest);
                }
                (n, labels)
            }
            None => (series, Vec::new()),
        };
        assert!(ident(name), "{line}");
        // A histogram's samples are its name with `_bucket`, `_sum` or `_count`.
        let histogram = ["_bucket", "_sum", "_count"]
            .iter()
            .filter_map(|x| name.strip_suffix(x))
            .find(|f| typed.get(*f).is_some_and(|k| k == "histogram"));
        let kind = match histogram {
            Some(f) => &typed[f],
            None => typed.get(name).unwrap_or_else(|| panic!("sample without TYPE: {line}")),
        };
        if kind == "counter" {
            assert!(name.ends_with("_total"), "counter {name} should end in _total");
            assert!(v >= 0.0);
        }
        samples.push((name.to_string(), labels, v));
    }
    samples
}

#[test]
fn exposition_format_is_valid() {
    let text = render(
        vec![reactor(0, "poll"), reactor(1, "interrupt")],
        vec![subsystem("nqn.2026-11.io.pollux:a"), subsystem("odd\"nqn\\x\ny")],
        12.25,
    )
    .unwrap();
    let samples = validate(&text);
    let get = |name: &str, labels: &[(&str, &str)]| {
        samples
            .iter()
            .find(|(n, l, _)| n == name && labels.iter().all(|(k, v)| l.iter().any(|(a, b)| a == k && b == v)))
            .map(|s| s.2)
    };
    assert_eq!(
        get("pollux_reactor_mode", &[("reactor", "0"), ("mode", "poll")]),
        Some(1.0)
    );
    assert_eq!(
        get("pollux_reactor_mode", &[("reactor", "1"), ("mode", "poll")]),
        Some(0.0)
    );
    assert_eq!(
        get("pollux_reactor_mode", &[("reactor", "1"), ("mode", "interrupt")]),
        Some(1.0)
    );
    assert_eq!(
        get(
            "pollux_reactor_mode_seconds_total",
            &[("reactor", "0"), ("mode", "poll")]
        ),
        Some(1.5)
    );
    assert_eq!(
        get("pollux_reactor_cpu_seconds_total", &[("reactor", "0")]),
        Some(0.123456789)
    );
    assert_eq!(
        get("pollux_reactor_predicted_latency_seconds", &[("reactor", "1")]),
        Some(0.00008)
    );
    assert_eq!(
        get(
            "pollux_reactor_class_predicted_latency_seconds",
            &[
                ("reactor", "1"),
                ("channel", "sim-ns1-r0"),
                ("op", "read"),
                ("size", "<=4KiB")
            ]
        ),
        Some(0.00008)
    );
    assert_eq!(
        get(
            "pollux_namespace_write_bytes_total",
            &[("subsystem", "nqn.2026-11.io.pollux:a"), ("nsid", "1")]
        ),
        Some(1024.0)
    );
    // Escaped label values round-trip.
    assert_eq!(
        get("pollux_subsystem_controllers", &[("subsystem", "odd\"nqn\\x\ny")]),
        Some(1.0)
    );
    assert_eq!(get("pollux_uptime_seconds", &[]), Some(12.25));
    // Latency histograms: cumulative buckets in seconds, +Inf, sum and count.
    let ns = [("subsystem", "nqn.2026-11.io.pollux:a"), ("nsid", "1")];
    let bucket = |le: &str| {
        let mut l = ns.to_vec();
        l.push(("le", le));
        get("pollux_namespace_read_latency_seconds_bucket", &l)
    };
    assert_eq!(bucket("1.024e-06"), Some(0.0), "{text}");
    assert_eq!(bucket("4.096e-06"), Some(2.0), "{text}");
    assert_eq!(bucket("0.004194304"), Some(2.0), "{text}");
    assert_eq!(bucket("0.008388608"), Some(3.0), "{text}");
    assert_eq!(bucket("+Inf"), Some(3.0), "{text}");
    assert_eq!(get("pollux_namespace_read_latency_seconds_count", &ns), Some(3.0));
    assert_eq!(get("pollux_namespace_read_latency_seconds_sum", &ns), Some(0.005006));
    assert_eq!(get("pollux_namespace_write_latency_seconds_count", &ns), Some(0.0));
    assert!(
        text.contains("# TYPE pollux_namespace_read_latency_seconds histogram"),
        "{text}"
    );
    // Build info and the process figures of this very process.
    assert_eq!(
        get(
            "pollux_build_info",
            &[("version", crate::VERSION), ("commit", crate::BUILD_COMMIT)]
        ),
        Some(1.0)
    );
    assert!(!crate::BUILD_COMMIT.is_empty());
    assert!(get("process_cpu_seconds_total", &[]).is_some_and(|v| v > 0.0), "{text}");
    assert!(
        get("process_resident_memory_bytes", &[]).is_some_and(|v| v > 1e5),
        "{text}"
    );
    assert!(get("process_open_fds", &[]).is_some_and(|v| v >= 3.0), "{text}");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let start = get("process_start_time_seconds", &[]).unwrap_or_default();
    assert!(start > now - 86_400.0 && start <= now + 1.0, "start {start}, now {now}");
}

#[test]
fn rbd_namespaces_have_their_families() {
    let mut s = subsystem("s");
    s.namespaces[0].backend = "rbd".into();
    s.namespaces[0].rbd = Some(crate::control::view::RbdView {
        image: "rbd/img0".into(),
        pool: "rbd".into(),
        image_id: "1234".into(),
        fsid: "f".into(),
        ceph_conf: "/etc/ceph/ceph.conf".into(),
        write_cache: false,
        exclusive_lock: true,
        lock_owner: true,
        health: "unavailable".into(),
        ops: 10,
        unavailable: 2,
        errors: 1,
        overdue: 1,
    });
    let text = render(vec![reactor(0, "poll")], vec![s, subsystem("ram")], 1.0).unwrap();
    validate(&text);
    for line in [
        "pollux_rbd_operations_total{subsystem=\"s\",nsid=\"1\",image=\"rbd/img0\"} 10",
        "pollux_rbd_unavailable_total{subsystem=\"s\",nsid=\"1\",image=\"rbd/img0\"} 2",
        "pollux_rbd_errors_total{subsystem=\"s\",nsid=\"1\",image=\"rbd/img0\"} 1",
        "pollux_rbd_overdue_total{subsystem=\"s\",nsid=\"1\",image=\"rbd/img0\"} 1",
        "pollux_rbd_unhealthy{subsystem=\"s\",nsid=\"1\",image=\"rbd/img0\"} 1",
        "pollux_rbd_lock_owner{subsystem=\"s\",nsid=\"1\",image=\"rbd/img0\"} 1",
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
    }
    assert!(
        !text.contains("subsystem=\"ram\",nsid=\"1\",image"),
        "a RAM namespace has no rbd samples"
    );
}

#[test]
fn counts_are_integers_and_counters_end_in_total() {
    let text = render(vec![reactor(0, "poll")], vec![subsystem("s")], 3.0).unwrap();
    for line in [
        "# HELP pollux_reactor_switches_total Mode switches made by the adaptive policy.",
        "# TYPE pollux_reactor_switches_total counter",
        "pollux_reactor_switches_total{reactor=\"0\"} 3",
        "pollux_reactor_mode{reactor=\"0\",mode=\"poll\"} 1",
        "pollux_reactor_outstanding{reactor=\"0\"} 2",
        "pollux_reactor_cpu_budget{reactor=\"0\"} 0.3",
        "pollux_reactor_mode_seconds_total{reactor=\"0\",mode=\"poll\"} 1.5",
        "pollux_namespace_read_bytes_total{subsystem=\"s\",nsid=\"1\"} 512",
        "pollux_namespace_info{subsystem=\"s\",nsid=\"1\",backend=\"ram\",io_path=\"inline\"} 1",
        "pollux_subsystem_controllers{subsystem=\"s\"} 1",
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
    }
    assert!(!text.contains("_total_total"), "{text}");
    // No subsystem: the families are still declared, with no samples.
    let text = render(vec![reactor(0, "poll")], vec![], 1.0).unwrap();
    validate(&text);
    assert!(text.contains("# TYPE pollux_subsystem_controllers gauge\n"), "{text}");
}

#[test]
fn closes_are_counted_by_reason() {
    let mut r = reactor(1, "poll");
    r.closed = [("keep_alive_timeout", 2), ("peer_closed", 0)]
        .map(|(k, n)| (k.to_string(), n))
        .into();
    let text = render(vec![r], vec![], 1.0).unwrap();
    validate(&text);
    for line in [
        "# TYPE pollux_connections_closed_total counter",
        "pollux_connections_closed_total{reactor=\"1\",reason=\"keep_alive_timeout\"} 2",
        "pollux_connections_closed_total{reactor=\"1\",reason=\"peer_closed\"} 0",
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
    }
}

#[test]
fn qos_limits_and_held_commands_have_their_families() {
    let mut s = subsystem("s");
    s.namespaces[0].qos = Some(crate::control::view::QosView {
        iops: Some(5000),
        write_mbps: Some(40),
        held: 17,
        ..Default::default()
    });
    let mut r = reactor(0, "poll");
    r.requests.held = 3;
    let text = render(vec![r], vec![s, subsystem("free")], 1.0).unwrap();
    validate(&text);
    for line in [
        "pollux_namespace_qos_limit{subsystem=\"s\",nsid=\"1\",limit=\"iops\"} 5000",
        "pollux_namespace_qos_limit{subsystem=\"s\",nsid=\"1\",limit=\"write_mbps\"} 40",
        "pollux_namespace_qos_held_commands_total{subsystem=\"s\",nsid=\"1\"} 17",
        "pollux_namespace_qos_held_commands_total{subsystem=\"free\",nsid=\"1\"} 0",
        "pollux_reactor_requests{reactor=\"0\",state=\"held\"} 3",
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
    }
    // Limits not set, and namespaces without any, have no sample.
    assert!(!text.contains("limit=\"mbps\""), "{text}");
    assert!(
        !text.contains("pollux_namespace_qos_limit{subsystem=\"free\""),
        "{text}"
    );
}
