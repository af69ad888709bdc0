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
        let roles = self.reactors.iter().zip(&self.ids).flat_map(|(r, id)| {
            [("admin", r.admin_queues), ("io", r.io_queues)]
                .map(move |(role, n)| ([("reactor", id.as_str()), ("role", role)], Num::Int(n)))
        });
        family(
            enc,
            "pollux_reactor_queues",
            Gauge,
            "Bound NVMe-oF queues on the reactor, by role (admin: the controllers it owns).",
            roles,
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
        let states = self.reactors.iter().zip(&self.ids).flat_map(|(r, id)| {
            let q = r.requests;
            [
                ("awaiting_data", q.awaiting_data),
                ("parked", q.parked),
                ("submitted", q.submitted),
                ("draining", q.draining),
                ("held", q.held),
            ]
            .map(move |(state, n)| ([("reactor", id.as_str()), ("state", state)], Num::Int(n)))
        });
        family(
            enc,
            "pollux_reactor_requests",
            Gauge,
            "Requests of the reactor's queues outstanding now, by state.",
            states,
        )?;
        self.per_reactor(
            enc,
            "pollux_reactor_commands_ended",
            Counter,
            "Commands the reactor's queues ended (completed, any status).",
            |r| Num::Int(r.requests.ended),
        )?;
        self.per_reactor(
            enc,
            "pollux_reactor_commands_failed",
            Counter,
            "Commands the reactor's queues ended with an error status.",
            |r| Num::Int(r.requests.failed),
        )?;
        self.per_reactor(
            enc,
            "pollux_reactor_commands_received",
            Counter,
            "Commands the reactor's queues received.",
            |r| Num::Int(r.requests.received),
        )?;
        self.per_reactor(
            enc,
            "pollux_reactor_commands_dropped",
            Counter,
            "Commands received that never ended: their queue closed first, or went to a new process.",
            |r| Num::Int(r.requests.dropped),
        )?;
        self.per_reactor(
            enc,
            "pollux_reactor_commands_open",
            Gauge,
            "Commands received and not yet ended on open queues (held AERs included).",
            |r| Num::Int(r.requests.open()),
        )?;
        self.per_reactor(
            enc,
            "pollux_reactor_aers_held",
            Gauge,
            "Asynchronous Event Requests the reactor's controllers hold now.",
            |r| Num::Int(r.requests.aers),
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
        self.per_namespace(
            enc,
            "pollux_namespace_qos_held_commands",
            "Commands its QoS limits held before they ran (0 without limits).",
            |n| n.qos.as_ref().map_or(0, |q| q.held),
        )?;
        let limits = self.subsystems.iter().flat_map(|s| {
            s.namespaces.iter().flat_map(move |n| {
                let q = n.qos.clone().unwrap_or_default();
                [
                    ("iops", q.iops),
                    ("mbps", q.mbps),
                    ("read_mbps", q.read_mbps),
                    ("write_mbps", q.write_mbps),
                ]
                .into_iter()
                .filter_map(move |(kind, v)| {
                    let labels = [
                        ("subsystem", s.nqn.clone()),
                        ("nsid", n.nsid.to_string()),
                        ("limit", kind.to_string()),
                    ];
                    v.map(|v| (labels, Num::Int(v)))
                })
            })
        });
        family(
            enc,
            "pollux_namespace_qos_limit",
            Gauge,
            "A namespace's QoS limits, as set: iops in commands per second, the others in MiB/s (none: no limit).",
            limits,
        )?;
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
mod tests;
