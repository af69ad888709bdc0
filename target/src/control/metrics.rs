//! The Prometheus text exposition format (version 0.0.4) of the control views.

use std::fmt::Write;

use super::view::{ReactorView, SubsystemView};

/// Escape a label value: backslash, double quote and newline.
pub fn escape(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

/// A metric family being written.
struct Family<'a> {
    out: &'a mut String,
    name: &'static str,
}

impl<'a> Family<'a> {
    fn new(out: &'a mut String, name: &'static str, kind: &str, help: &str) -> Self {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        Self { out, name }
    }

    fn sample(&mut self, labels: &[(&str, &str)], value: f64) {
        let name = self.name;
        let _ = write!(self.out, "{name}");
        if !labels.is_empty() {
            let l: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{}\"", escape(v))).collect();
            let _ = write!(self.out, "{{{}}}", l.join(","));
        }
        let _ = writeln!(self.out, " {}", number(value));
    }
}

/// A sample value: integers without a fraction, NaN and infinities spelled as Prometheus does.
fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf".into() } else { "-Inf".into() }
    } else if v.fract() == 0.0 && v.abs() < 9.0e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

/// Render the metrics of the reactors and subsystems.
pub fn render(reactors: &[ReactorView], subsystems: &[SubsystemView], uptime_s: f64) -> String {
    let mut out = String::new();
    let o = &mut out;
    Family::new(
        o,
        "pollux_uptime_seconds",
        "gauge",
        "Seconds since the control plane started.",
    )
    .sample(&[], uptime_s);
    let ids: Vec<String> = reactors.iter().map(|r| r.id.to_string()).collect();
    let per_reactor = |o: &mut String, name, kind, help, f: &dyn Fn(&ReactorView) -> f64| {
        let mut fam = Family::new(o, name, kind, help);
        for (r, id) in reactors.iter().zip(&ids) {
            fam.sample(&[("reactor", id)], f(r));
        }
    };
    {
        let mut fam = Family::new(
            o,
            "pollux_reactor_mode",
            "gauge",
            "1 for the reactor's current mode, 0 for the others.",
        );
        for (r, id) in reactors.iter().zip(&ids) {
            for m in ["poll", "hybrid", "interrupt"] {
                fam.sample(&[("reactor", id), ("mode", m)], f64::from(u8::from(r.mode == m)));
            }
        }
    }
    per_reactor(
        o,
        "pollux_reactor_adaptive",
        "gauge",
        "1 when the adaptive policy chooses the mode.",
        &|r| f64::from(u8::from(r.adaptive)),
    );
    per_reactor(
        o,
        "pollux_reactor_cpu_budget",
        "gauge",
        "The adaptive policy's CPU budget (fraction of a core).",
        &|r| r.cpu_budget,
    );
    per_reactor(
        o,
        "pollux_reactor_cpu_seconds_total",
        "counter",
        "CPU time of the reactor thread.",
        &|r| r.cpu_ns as f64 / 1e9,
    );
    per_reactor(
        o,
        "pollux_reactor_busy_seconds_total",
        "counter",
        "Wall time in loop iterations that found work.",
        &|r| r.busy_ns as f64 / 1e9,
    );
    {
        let mut fam = Family::new(
            o,
            "pollux_reactor_mode_seconds_total",
            "counter",
            "Wall time spent in each mode.",
        );
        for (r, id) in reactors.iter().zip(&ids) {
            for (m, ns) in r.mode_ns.pairs() {
                fam.sample(&[("reactor", id), ("mode", m)], ns as f64 / 1e9);
            }
        }
    }
    per_reactor(
        o,
        "pollux_reactor_switches_total",
        "counter",
        "Mode switches made by the adaptive policy.",
        &|r| r.switches as f64,
    );
    per_reactor(
        o,
        "pollux_reactor_stalls_total",
        "counter",
        "Callbacks that ran longer than the stall threshold.",
        &|r| r.stalls as f64,
    );
    per_reactor(
        o,
        "pollux_reactor_iterations_total",
        "counter",
        "Reactor loop iterations.",
        &|r| r.iterations as f64,
    );
    per_reactor(
        o,
        "pollux_reactor_commands_total",
        "counter",
        "NVMe I/O commands completed by the reactor's queues.",
        &|r| r.commands as f64,
    );
    per_reactor(
        o,
        "pollux_reactor_outstanding",
        "gauge",
        "Device commands outstanding.",
        &|r| r.outstanding as f64,
    );
    per_reactor(
        o,
        "pollux_reactor_predicted_latency_seconds",
        "gauge",
        "The latency model's device completion estimate (0: none).",
        &|r| r.predicted_ns as f64 / 1e9,
    );
    {
        let mut fam = Family::new(
            o,
            "pollux_reactor_class_predicted_latency_seconds",
            "gauge",
            "The latency model's completion estimate per device channel, operation and size class (0: none).",
        );
        for (r, id) in reactors.iter().zip(&ids) {
            for c in &r.classes {
                let labels = [
                    ("reactor", id.as_str()),
                    ("channel", &c.channel),
                    ("op", &c.op),
                    ("size", &c.size),
                ];
                fam.sample(&labels, c.estimate_ns as f64 / 1e9);
            }
        }
    }
    per_reactor(
        o,
        "pollux_reactor_connections",
        "gauge",
        "Open NVMe/TCP connections on the reactor.",
        &|r| r.connections as f64,
    );
    let ns_family = |o: &mut String, name, help, f: &dyn Fn(&super::view::NamespaceView) -> u64| {
        let mut fam = Family::new(o, name, "counter", help);
        for s in subsystems {
            for n in &s.namespaces {
                fam.sample(&[("subsystem", &s.nqn), ("nsid", &n.nsid.to_string())], f(n) as f64);
            }
        }
    };
    ns_family(
        o,
        "pollux_namespace_read_commands_total",
        "Read commands completed.",
        &|n| n.read_cmds,
    );
    ns_family(
        o,
        "pollux_namespace_write_commands_total",
        "Write commands completed.",
        &|n| n.write_cmds,
    );
    ns_family(o, "pollux_namespace_read_bytes_total", "Bytes read.", &|n| n.read_bytes);
    ns_family(o, "pollux_namespace_write_bytes_total", "Bytes written.", &|n| {
        n.write_bytes
    });
    {
        let mut fam = Family::new(o, "pollux_subsystem_controllers", "gauge", "Connected controllers.");
        for s in subsystems {
            fam.sample(&[("subsystem", &s.nqn)], s.controllers as f64);
        }
    }
    out
}

#[cfg(test)]
mod tests {
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
            wakeups: 4,
            wake_late_us: Lateness::default(),
            stalls: 1,
            sources: 3,
            connections: 2,
        }
    }

    fn subsystem(nqn: &str) -> SubsystemView {
        SubsystemView {
            nqn: nqn.into(),
            serial: "S".into(),
            model: "M".into(),
            allow_any_host: true,
            hosts: vec![],
            namespaces: vec![NamespaceView {
                nsid: 1,
                size: 4096,
                block_size: 512,
                backend: "ram".into(),
                uuid: "u".into(),
                read_cmds: 1,
                write_cmds: 2,
                read_bytes: 512,
                write_bytes: 1024,
            }],
            listeners: vec![],
            controllers: 1,
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
                assert!(["counter", "gauge"].contains(&kind), "{line}");
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
            let kind = typed.get(name).unwrap_or_else(|| panic!("sample without TYPE: {line}"));
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
            &[reactor(0, "poll"), reactor(1, "interrupt")],
            &[subsystem("nqn.2026-11.io.pollux:a"), subsystem("odd\"nqn\\x\ny")],
            12.25,
        );
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
    }

    #[test]
    fn numbers_are_prometheus_floats() {
        assert_eq!(number(3.0), "3");
        assert_eq!(number(0.5), "0.5");
        assert_eq!(number(f64::NAN), "NaN");
        assert_eq!(number(f64::INFINITY), "+Inf");
    }
}
