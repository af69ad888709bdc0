//! The Prometheus text exposition format (version 0.0.4) of the control views.
//!
//! prometheus-client's encoder writes the text: it keeps the format's rules (HELP and TYPE
//! lines, label escaping, counters' `_total`, float spelling); this module only says what is
//! exported.

use std::fmt;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet, prometheus_text,
};
use prometheus_client::metrics::MetricType::{self, Counter, Gauge, Histogram};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use super::view::{LatencyView, NamespaceView, ReactorView, SubsystemView};

/// The `Content-Type` of what [`render`] writes.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// A sample value. Counts are integers, so they read `3` rather than `3.0`; times and
/// fractions are floats.
#[derive(Debug, Clone, Copy)]
enum Num {
    Int(u64),
    Float(f64),
}

impl From<bool> for Num {
    fn from(b: bool) -> Self {
        Num::Int(u64::from(b))
    }
}

/// Nanoseconds as seconds.
fn seconds(ns: u64) -> Num {
    Num::Float(ns as f64 / 1e9)
}

/// One sample of a family of type `kind`.
fn sample(m: MetricEncoder, kind: MetricType, v: Num) -> fmt::Result {
    match (kind, v) {
        (Counter, Num::Int(x)) => ConstCounter::new(x).encode(m),
        (Counter, Num::Float(x)) => ConstCounter::new(x).encode(m),
        (_, Num::Int(x)) => ConstGauge::new(x).encode(m),
        (_, Num::Float(x)) => ConstGauge::new(x).encode(m),
    }
}

/// One family: its HELP and TYPE lines, then `samples`. A counter's `name` is given without
/// the `_total` suffix, which the encoder adds to all three.
fn family<L: EncodeLabelSet>(
    enc: &mut DescriptorEncoder,
    name: &str,
    kind: MetricType,
    help: &str,
    samples: impl IntoIterator<Item = (L, Num)>,
) -> fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, kind)?;
    for (labels, v) in samples {
        sample(m.encode_family(&labels)?, kind, v)?;
    }
    Ok(())
}

/// The process figures every Prometheus client library exports (`process_*`), read from
/// `/proc/self` and the C library; a figure that cannot be read is left out.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProcessStats {
    /// User and system CPU time, seconds (getrusage).
    pub cpu_seconds: Option<f64>,
    /// Resident memory, bytes (`/proc/self/statm`).
    pub resident_memory_bytes: Option<u64>,
    /// Virtual memory, bytes (`/proc/self/statm`).
    pub virtual_memory_bytes: Option<u64>,
    /// Open file descriptors (`/proc/self/fd`).
    pub open_fds: Option<u64>,
    /// The open file descriptor limit (RLIMIT_NOFILE).
    pub max_fds: Option<u64>,
    /// When the process started, seconds since the Unix epoch (`/proc/self/stat` starttime
    /// after `/proc/stat` btime).
    pub start_time_seconds: Option<f64>,
}

impl ProcessStats {
    /// This process's figures now.
    pub fn read() -> Self {
        // SAFETY: sysconf only reads a configuration value.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        // SAFETY: likewise.
        let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        let statm = std::fs::read_to_string("/proc/self/statm").ok();
        let statm_field = |i: usize| -> Option<u64> {
            let pages: u64 = statm.as_deref()?.split_whitespace().nth(i)?.parse().ok()?;
            Some(pages * u64::try_from(page).ok().filter(|p| *p > 0)?)
        };
        Self {
            cpu_seconds: cpu_seconds(),
            resident_memory_bytes: statm_field(1),
            virtual_memory_bytes: statm_field(0),
            open_fds: std::fs::read_dir("/proc/self/fd").ok().map(|d| d.count() as u64),
            max_fds: max_fds(),
            start_time_seconds: start_time(u64::try_from(ticks).ok().filter(|t| *t > 0)),
        }
    }
}

fn cpu_seconds() -> Option<f64> {
    // SAFETY: an all-zero rusage is a valid value for getrusage to overwrite.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid out pointer for the duration of the call.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return None;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Some(tv(ru.ru_utime) + tv(ru.ru_stime))
}

fn max_fds() -> Option<u64> {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `rl` is a valid out pointer for the duration of the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } != 0 || rl.rlim_cur == libc::RLIM_INFINITY {
        return None;
    }
    Some(rl.rlim_cur)
}

/// The process's start: its starttime (clock ticks after boot, field 22 of
/// `/proc/self/stat`, proc(5)) plus the boot time (`btime` of `/proc/stat`).
fn start_time(ticks_per_s: Option<u64>) -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count from after it.
    let after = &stat[stat.rfind(')')? + 1..];
    let start_ticks: u64 = after.split_whitespace().nth(22 - 3)?.parse().ok()?;
    let btime: u64 = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    Some(btime as f64 + start_ticks as f64 / ticks_per_s? as f64)
}

/// One scrape's views. They are sampled per scrape, not kept as live metrics, so they reach
/// the encoder as a collector of constant metrics.
#[derive(Debug)]
struct Scrape {
    reactors: Vec<ReactorView>,
    subsystems: Vec<SubsystemView>,
    uptime_s: f64,
    /// The reactors' ids as label values.
    ids: Vec<String>,
    process: ProcessStats,
}

impl Scrape {
    /// A family with one sample per reactor, labelled `reactor`.
    fn per_reactor(
        &self,
        enc: &mut DescriptorEncoder,
        name: &str,
        kind: MetricType,
        help: &str,
        f: fn(&ReactorView) -> Num,
    ) -> fmt::Result {
        let samples = self.reactors.iter().zip(&self.ids);
        family(
            enc,
            name,
            kind,
            help,
            samples.map(|(r, id)| ([("reactor", id.as_str())], f(r))),
        )
    }

    /// A counter family with one sample per namespace, labelled `subsystem` and `nsid`.
    fn per_namespace(
        &self,
        enc: &mut DescriptorEncoder,
        name: &str,
        help: &str,
        f: fn(&NamespaceView) -> u64,
    ) -> fmt::Result {
        let mut m = enc.encode_descriptor(name, help, None, Counter)?;
        for s in &self.subsystems {
            for n in &s.namespaces {
                let nsid = n.nsid.to_string();
                let labels = [("subsystem", s.nqn.as_str()), ("nsid", nsid.as_str())];
                sample(m.encode_family(&labels)?, Counter, Num::Int(f(n)))?;
            }
        }
        Ok(())
    }

    /// A histogram family with one histogram per namespace, labelled `subsystem` and `nsid`,
    /// in seconds: buckets at the octave bounds of [`crate::latency::EXPORT_OCTAVES`], then
    /// `+Inf`.
    fn per_namespace_histogram(
        &self,
        enc: &mut DescriptorEncoder,
        name: &str,
        help: &str,
        f: fn(&NamespaceView) -> &LatencyView,
    ) -> fmt::Result {
        let mut m = enc.encode_descriptor(name, help, None, Histogram)?;
        for s in &self.subsystems {
            for n in &s.namespaces {
                let nsid = n.nsid.to_string();
                let labels = [("subsystem", s.nqn.as_str()), ("nsid", nsid.as_str())];
                let l = f(n);
                // The encoder takes each bucket's own count and sums them itself.
                let mut below = 0;
                let mut buckets: Vec<(f64, u64)> = l
                    .buckets
                    .iter()
                    .map(|[le, cum]| {
                        let own = cum.saturating_sub(below);
                        below = below.max(*cum);
                        (*le as f64 / 1e9, own)
                    })
                    .collect();
                buckets.push((f64::INFINITY, l.count.saturating_sub(below)));
                m.encode_family(&labels)?.encode_histogram::<NoLabelSet>(
                    l.sum_ns as f64 / 1e9,
                    l.count,
                    &buckets,
                    None,
                )?;
            }
        }
        Ok(())
    }

    /// The `process_*` families, each only when its figure could be read.
    fn process(&self, enc: &mut DescriptorEncoder) -> fmt::Result {
        let p = &self.process;
        let one = |enc: &mut DescriptorEncoder, name: &str, kind: MetricType, help: &str, v: Option<Num>| match v {
            Some(v) => family(enc, name, kind, help, [([] as [(&str, &str); 0], v)]),
            None => Ok(()),
        };
        one(
            enc,
            "process_cpu_seconds",
            Counter,
            "Total user and system CPU time spent in seconds.",
            p.cpu_seconds.map(Num::Float),
        )?;
        one(
            enc,
            "process_resident_memory_bytes",
            Gauge,
            "Resident memory size in bytes.",
            p.resident_memory_bytes.map(Num::Int),
        )?;
        one(
            enc,
            "process_virtual_memory_bytes",
            Gauge,
            "Virtual memory size in bytes.",
            p.virtual_memory_bytes.map(Num::Int),
        )?;
        one(
            enc,
            "process_open_fds",
            Gauge,
            "Number of open file descriptors.",
            p.open_fds.map(Num::Int),
        )?;
        one(
            enc,
            "process_max_fds",
            Gauge,
            "Maximum number of open file descriptors.",
            p.max_fds.map(Num::Int),
        )?;
        one(
            enc,
            "process_start_time_seconds",
            Gauge,
            "Start time of the process since unix epoch in seconds.",
            p.start_time_seconds.map(Num::Float),
        )
    }

    /// A family with one sample per rbd namespace, labelled `subsystem`, `nsid` and `image`.
    fn per_rbd(
        &self,
        enc: &mut DescriptorEncoder,
        name: &str,
        kind: MetricType,
        help: &str,
        f: fn(&crate::control::view::RbdView) -> u64,
    ) -> fmt::Result {
        let samples = self.subsystems.iter().flat_map(|s| {
            s.namespaces.iter().filter_map(move |n| {
                let r = n.rbd.as_ref()?;
                let labels = [
                    ("subsystem", s.nqn.clone()),
                    ("nsid", n.nsid.to_string()),
                    ("image", r.image.clone()),
                ];
                Some((labels, Num::Int(f(r))))
            })
        });
        family(enc, name, kind, help, samples)
    }
}

impl Collector for Scrape {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let enc = &mut enc;
        let help = "Seconds since the control plane started.";
        ConstGauge::new(self.uptime_s).encode(enc.encode_descriptor("pollux_uptime_seconds", help, None, Gauge)?)?;
        family(
            enc,
            "pollux_build_info",
            Gauge,
            "The version and commit pollux was built from (always 1).",
            [(
                [("version", crate::VERSION), ("commit", crate::BUILD_COMMIT)],
                Num::Int(1),
            )],
        )?;
        self.process(enc)?;
        let modes = self.reactors.iter().zip(&self.ids).flat_map(|(r, id)| {
            ["poll", "hybrid", "interrupt"].map(|m| ([("reactor", id.as_str()), ("mode", m)], Num::from(r.mode == m)))
        });
        family(
            enc,
            "pollux_reactor_mode",
            Gauge,
            "1 for the reactor's current mode, 0 for the others.",
            modes,
        )?;
        self.per_reactor(
            enc,
            "pollux_reactor_adaptive",
            Gauge,
            "1 when the adaptive policy chooses the mode.",
            |r| r.adaptive.into(),
        )?;
        self.per_reactor(
            enc,
            "pollux_reactor_cpu_budget",
            Gauge,
            "The adaptive policy's CPU budget (fraction of a core).",
            |r| Num::Float(r.cpu_budget),
        )?;
        self.per_reactor(
            enc,
            "pollux_reactor_cpu_seconds",
            Counter,
            "CPU time of the reactor thread.",
            |r| seconds(r.cpu_ns),
        )?;
        self.per_reactor(
            enc,
            "pollux_reactor_busy_seconds",
            Counter,
            "Wall time in loop iterations that found work.",
            |r| seconds(r.busy_ns),
        )?;
        let mode_time = self.reactors.iter().zip(&self.ids).flat_map(|(r, id)| {
            r.mode_ns
                .pairs()
                .map(|(m, ns)| ([("reactor", id.as_str()), ("mode", m)], seconds(ns)))
        });
        family(
            enc,
            "pollux_reactor_mode_seconds",
            Counter,
            "Wall time spent in each mode.",
            mode_time,
        )?;
        self.per_reactor(
            enc,
            "pollux_reactor_switches",
            Counter,
            "Mode switches made by the adaptive policy.",
            |r| Num::Int(r.switches),
        )?;
        self.per_reactor(
            enc,
            "pollux_reactor_stalls",
            Counter,
            "Callbacks that ran longer than the stall threshold.",
            |r| Num::Int(r.stalls),
        )?;
        self.per_reactor(
            enc,
            "pollux_reactor_iterations",
            Counter,
            "Reactor loop iterations.",
            |r| Num::Int(r.iterations),
        )?;
        self.per_reactor(
            enc,
            "pollux_reactor_commands",
            Counter,
            "NVMe I/O commands completed by the reactor's queues.",
            |r| Num::Int(r.commands),
        )?;
        self.per_reactor(
            enc,
            "pollux_reactor_outstanding",
            Gauge,
            "Device commands outstanding.",
            |r| Num::Int(r.outstanding),
        )?;
        self.per_reactor(
            enc,
            "pollux_reactor_predicted_latency_seconds",
            Gauge,
            "The latency model's device completion estimate (0: none).",
            |r| seconds(r.predicted_ns),
        )?;
        let classes = self.reactors.iter().zip(&self.ids).flat_map(|(r, id)| {
            r.classes.iter().map(move |c| {
                let labels = [
                    ("reactor", id.clone()),
                    ("channel", c.channel.clone()),
                    ("op", c.op.clone()),
                    ("size", c.size.clone()),
                ];
                (labels, seconds(c.estimate_ns))
            })
        });
        family(
            enc,
            "pollux_reactor_class_predicted_latency_seconds",
            Gauge,
            "The latency model's completion estimate per device channel, operation and size class (0: none).",
            classes,
        )?;
        self.per_reactor(
            enc,
            "pollux_reactor_connections",
            Gauge,
            "Open NVMe/TCP connections on the reactor.",
            |r| Num::Int(r.connections),
        )?;
        let closed = self.reactors.iter().zip(&self.ids).flat_map(|(r, id)| {
            r.closed
                .iter()
                .map(move |(reason, n)| ([("reactor", id.as_str()), ("reason", reason.as_str())], Num::Int(*n)))
        });
        family(
            enc,
            "pollux_connections_closed",
            Counter,
            "NVMe/TCP connections closed, by why.",
            closed,
        )?;
        self.per_namespace(enc, "pollux_namespace_read_commands", "Read commands completed.", |n| {
            n.read_cmds
        })?;
        self.per_namespace(
            enc,
            "pollux_namespace_write_commands",
            "Write commands completed.",
            |n| n.write_cmds,
        )?;
        let info = self.subsystems.iter().flat_map(|s| {
            s.namespaces.iter().map(|n| {
                let labels = [
                    ("subsystem", s.nqn.clone()),
                    ("nsid", n.nsid.to_string()),
                    ("backend", n.backend.clone()),
                    ("io_path", n.io_path.clone()),
                ];
                (labels, Num::Int(1))
            })
        });
        family(
            enc,
            "pollux_namespace_info",
            Gauge,
            "A namespace's backend and how its commands reach the store (always 1).",
            info,
        )?;
        self.per_namespace(enc, "pollux_namespace_read_bytes", "Bytes read.", |n| n.read_bytes)?;
        self.per_namespace_histogram(
            enc,
            "pollux_namespace_read_latency_seconds",
            "Completion latency of Read commands, from the command's arrival to its completion.",
            |n| &n.read_latency,
        )?;
        self.per_namespace_histogram(
            enc,
            "pollux_namespace_write_latency_seconds",
            "Completion latency of Write and Write Zeroes commands, from the command's arrival (before its data transfer) to its completion.",
            |n| &n.write_latency,
        )?;
        self.per_namespace(enc, "pollux_namespace_write_bytes", "Bytes written.", |n| n.write_bytes)?;
        self.per_rbd(
            enc,
            "pollux_rbd_operations",
            Counter,
            "librbd operations completed.",
            |r| r.ops,
        )?;
        self.per_rbd(
            enc,
            "pollux_rbd_unavailable",
            Counter,
            "librbd operations that failed because the cluster was unreachable or too slow (answered Namespace Not Ready).",
            |r| r.unavailable,
        )?;
        self.per_rbd(
            enc,
            "pollux_rbd_errors",
            Counter,
            "librbd operations failed otherwise.",
            |r| r.errors,
        )?;
        self.per_rbd(
            enc,
            "pollux_rbd_overdue",
            Counter,
            "Commands answered Namespace Not Ready by pollux's bound before librbd completed them.",
            |r| r.overdue,
        )?;
        self.per_rbd(
            enc,
            "pollux_rbd_unhealthy",
            Gauge,
            "1 while the last librbd operation failed for the cluster's unavailability.",
            |r| u64::from(r.health != "ok"),
        )?;
        self.per_rbd(
            enc,
            "pollux_rbd_lock_owner",
            Gauge,
            "1 while this gateway holds the image's exclusive lock.",
            |r| u64::from(r.lock_owner),
        )?;
        let controllers =
            (self.subsystems.iter()).map(|s| ([("subsystem", s.nqn.as_str())], Num::Int(s.controllers as u64)));
        family(
            enc,
            "pollux_subsystem_controllers",
            Gauge,
            "Connected controllers.",
            controllers,
        )
    }
}

/// Render the metrics of the reactors and subsystems. An error is the encoder's (writing to
/// a `String` cannot fail otherwise).
pub fn render(reactors: Vec<ReactorView>, subsystems: Vec<SubsystemView>, uptime_s: f64) -> Result<String, fmt::Error> {
    let ids = reactors.iter().map(|r| r.id.to_string()).collect();
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Scrape {
        reactors,
        subsystems,
        uptime_s,
        ids,
        process: ProcessStats::read(),
    }));
    let mut out = String::new();
    prometheus_text::encode(&mut out, &registry)?;
    Ok(out)
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
            closed: Default::default(),
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
                polling: "auto".into(),
                rbd: None,
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
}
