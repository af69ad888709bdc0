//! What the control methods return: plain, serializable views shared by the server, the
//! metrics endpoint, `pollux ctl` and `pollux top`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One value per reactor mode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct PerMode<T> {
    /// Busy-poll.
    pub poll: T,
    /// Hybrid.
    pub hybrid: T,
    /// Interrupt.
    pub interrupt: T,
}

impl<T: Copy> PerMode<T> {
    /// From an array in [`pollux_reactor::Mode::index`] order.
    pub fn from_array(a: [T; 3]) -> Self {
        Self {
            poll: a[0],
            hybrid: a[1],
            interrupt: a[2],
        }
    }

    /// `(mode name, value)` pairs in index order.
    pub fn pairs(&self) -> [(&'static str, T); 3] {
        [
            ("poll", self.poll),
            ("hybrid", self.hybrid),
            ("interrupt", self.interrupt),
        ]
    }
}

/// Wake-up lateness percentiles from the reactor's log2 histogram (bucket upper bounds), us.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lateness {
    /// Median.
    pub p50: Option<u64>,
    /// 90th percentile.
    pub p90: Option<u64>,
    /// 99th percentile.
    pub p99: Option<u64>,
}

/// The `version` method's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VersionView {
    /// Crate version.
    pub version: String,
    /// The commit built (`unknown` outside a git checkout).
    #[serde(default)]
    pub commit: String,
    /// Seconds since the control plane started (with the target).
    pub uptime_s: f64,
    /// Number of reactors.
    pub reactors: usize,
    /// Process id.
    pub pid: u32,
}

/// One reactor, as `reactors` reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReactorView {
    /// Reactor index.
    pub id: usize,
    /// Pinned core (None: unpinned).
    pub core: Option<usize>,
    /// Current mode: `poll`, `hybrid` or `interrupt`.
    pub mode: String,
    /// The adaptive policy chooses the mode.
    pub adaptive: bool,
    /// The CPU budget the adaptive policy uses (or would use once turned on).
    pub cpu_budget: f64,
    /// Wall time per mode, ns.
    pub mode_ns: PerMode<u64>,
    /// Wall time per mode, % of the reactor's life.
    pub mode_pct: PerMode<f64>,
    /// Mode switches made by the adaptive policy.
    pub switches: u64,
    /// An `always` namespace holds the reactor in busy-poll now (absent from older targets).
    #[serde(default)]
    pub held: bool,
    /// Wall time held in busy-poll by `always` namespaces, % of the reactor's life.
    #[serde(default)]
    pub held_pct: f64,
    /// Thread CPU time, ns.
    pub cpu_ns: u64,
    /// CPU % over the last second (or as much of it as has been sampled).
    pub cpu_pct_1s: f64,
    /// CPU % since start.
    pub cpu_pct: f64,
    /// Wall time in iterations that found work, ns.
    pub busy_ns: u64,
    /// Busy % of wall time since start.
    pub busy_pct: f64,
    /// Loop iterations.
    pub iterations: u64,
    /// NVMe I/O commands completed by this reactor's queues over the last second, per second.
    pub iops: f64,
    /// NVMe I/O commands completed by this reactor's queues since start.
    pub commands: u64,
    /// Device commands outstanding now.
    pub outstanding: u64,
    /// Device completions seen.
    pub device_completions: u64,
    /// The device completion estimate the adaptive policy sees: the `classes` estimates
    /// weighted by their completions per evaluation window, smoothed, ns (0: none).
    pub predicted_ns: u64,
    /// The latency models' estimates behind `predicted_ns`, one per (device channel,
    /// operation, size class) that completed (absent from older targets: empty).
    #[serde(default)]
    pub classes: Vec<ClassView>,
    /// Measured cost of a timed wake-up, ns.
    pub wake_cost_ns: u64,
    /// What hybrid mode measurably spun per device completion, ns (0: none measured; absent
    /// from older targets).
    #[serde(default)]
    pub hybrid_spin_ns: u64,
    /// Timed wake-ups counted.
    pub wakeups: u64,
    /// Wake-up lateness percentiles, us.
    pub wake_late_us: Lateness,
    /// Callbacks that ran longer than the stall threshold.
    pub stalls: u64,
    /// Registered work sources.
    pub sources: u64,
    /// Open NVMe/TCP connections placed on this reactor (its queues, bound or not yet).
    pub connections: u64,
    /// Of its queues, admin queues: the controllers this reactor owns (discovery ones
    /// included; absent from older targets: 0).
    #[serde(default)]
    pub admin_queues: u64,
    /// Of its queues, I/O queues (absent from older targets: 0).
    #[serde(default)]
    pub io_queues: u64,
    /// Connections of this reactor closed since start, by why (the kinds of
    /// [`crate::close::CloseKind`], every one; absent from older targets: empty).
    #[serde(default)]
    pub closed: BTreeMap<String, u64>,
    /// Its queues' requests in each state now, and the commands they ended (absent from
    /// older targets: zeroes).
    #[serde(default)]
    pub requests: crate::queue::request::RequestCounts,
}

/// One (device channel, operation, size class) estimate of a reactor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClassView {
    /// The channel, e.g. `sim-ns1-r0` (a namespace's channel on reactor 0) or
    /// `nvme-01:00.0-q1` (a device's queue pair, shared by its namespaces).
    pub channel: String,
    /// `read`, or `write` (which includes the commands without data: flush, write zeroes,
    /// deallocate).
    pub op: String,
    /// Size class: `<=4KiB`, `<=16KiB`, `<=64KiB`, `<=256KiB` or `>256KiB`.
    pub size: String,
    /// The channel's latest completion time estimate for the class, ns (0: none yet).
    pub estimate_ns: u64,
    /// Completions of the class since the channel opened.
    pub completions: u64,
    /// Completions in the last policy window (2 ms): the estimate's weight in `predicted_ns`.
    pub window_completions: u64,
}

impl ClassView {
    /// The view of a reactor's class estimate.
    pub fn of(c: &pollux_reactor::ClassStats) -> Self {
        Self {
            channel: c.channel.to_string(),
            op: if c.is_read() { "read" } else { "write" }.into(),
            size: c.size_name().into(),
            estimate_ns: c.estimate_ns,
            completions: c.completions,
            window_completions: c.window_completions,
        }
    }
}

/// One namespace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamespaceView {
    /// Namespace id.
    pub nsid: u32,
    /// Size in bytes.
    pub size: u64,
    /// Logical block size in bytes.
    pub block_size: u32,
    /// Backend kind: `ram`, `sim`, `file` or `nvme`.
    pub backend: String,
    /// How its commands reach the store: `inline` (RAM), `simulated`, `io_uring` or `worker
    /// thread` (file), `vfio` or `fake controller` (nvme).
    #[serde(default)]
    pub io_path: String,
    /// RFC 4122 UUID, hyphenated.
    pub uuid: String,
    /// Read commands completed.
    pub read_cmds: u64,
    /// Write commands completed.
    pub write_cmds: u64,
    /// Bytes read.
    pub read_bytes: u64,
    /// Bytes written.
    pub write_bytes: u64,
    /// Its reservations (NVMe 2.0 §8.19), when it has a registrant or PTPL set: the type
    /// held and by which host, the registrants, PTPL. Empty otherwise.
    #[serde(default)]
    pub reservation: String,
    /// Where its reservations are kept: `cluster` (in the store's cluster, shared by every
    /// gateway; `cluster-unseen` while this gateway cannot see them and admits no I/O),
    /// `target` (this target's, persisted in its state directory while PTPL is set) or
    /// `volatile` (this target's, lost at exit). Empty from older targets.
    #[serde(default)]
    pub reservations: String,
    /// Its polling policy now: `auto`, `always` or `never` (absent from older targets).
    #[serde(default)]
    pub polling: String,
    /// The hosts it is attached to (host masking); None: every host the subsystem admits
    /// (and absent from older targets).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hosts: Option<Vec<String>>,
    /// An rbd namespace's image and the health of its cluster connection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rbd: Option<RbdView>,
    /// Its QoS limits and the commands they held (none: no limit; absent from older
    /// targets).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos: Option<QosView>,
    /// Completion latency of its Read commands (absent from older targets: none).
    #[serde(default)]
    pub read_latency: LatencyView,
    /// Completion latency of its Write and Write Zeroes commands.
    #[serde(default)]
    pub write_latency: LatencyView,
}

/// A namespace's QoS limits (`crate::qos`), as the conf spells them: commands per second
/// and MiB/s; absent: no limit of that kind.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QosView {
    /// Commands per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iops: Option<u64>,
    /// MiB/s read and written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mbps: Option<u64>,
    /// MiB/s read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_mbps: Option<u64>,
    /// MiB/s written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_mbps: Option<u64>,
    /// Commands held so far (since the namespace was opened, whatever the limits then).
    pub held: u64,
}

impl QosView {
    /// The view of a namespace's limits; None without any.
    pub fn of(q: &crate::qos::NsQos) -> Option<Self> {
        let l = q.limits();
        (!l.is_unlimited()).then(|| Self {
            iops: l.iops,
            mbps: l.mbps,
            read_mbps: l.read_mbps,
            write_mbps: l.write_mbps,
            held: q.held(),
        })
    }

    /// The limits as `iops 1000, mbps 100` (the conf's keys).
    pub fn limits_text(&self) -> String {
        let l = pollux_conf::Qos {
            iops: self.iops,
            mbps: self.mbps,
            read_mbps: self.read_mbps,
            write_mbps: self.write_mbps,
        };
        l.entries()
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// A namespace's completion latency histogram (`crate::latency`), as `subsystems` and the
/// metrics report it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LatencyView {
    /// Completions recorded.
    pub count: u64,
    /// The sum of their latencies, ns.
    pub sum_ns: u64,
    /// The median, as the upper bound of its bucket (within 25 %), ns; 0: none.
    pub p50_ns: u64,
    /// The 99th percentile, likewise.
    pub p99_ns: u64,
    /// Cumulative counts at octave bounds: `[le_ns, completions that took less]`.
    pub buckets: Vec<[u64; 2]>,
}

impl LatencyView {
    /// The view of summed histograms.
    pub fn of(l: &crate::latency::Latencies) -> Self {
        Self {
            count: l.count(),
            sum_ns: l.sum_ns,
            p50_ns: l.quantile_ns(0.5),
            p99_ns: l.quantile_ns(0.99),
            buckets: l.cumulative().into_iter().map(|(le, n)| [le, n]).collect(),
        }
    }
}

/// A listener that serves a subsystem, with the ANA state on its path of each ANA group the
/// subsystem's namespaces are in (NVMe 2.0 §8.1.3).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathView {
    /// Its bound address.
    pub address: String,
    /// Its TLS mode: `none`, `allowed`, `required`.
    pub tls: String,
    /// `(group, state)` of each group, state as the conf spells it (`optimized`, ...).
    pub ana: Vec<(u32, String)>,
}

/// An rbd namespace's image and cluster, as `subsystems` and the metrics report them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RbdView {
    /// `pool[/namespace]/image`.
    pub image: String,
    /// The pool.
    pub pool: String,
    /// The image's id.
    pub image_id: String,
    /// The cluster's fsid.
    pub fsid: String,
    /// The cluster's configuration file.
    pub ceph_conf: String,
    /// librbd's writeback cache is on.
    pub write_cache: bool,
    /// The image has the exclusive-lock feature.
    pub exclusive_lock: bool,
    /// This gateway holds the exclusive lock now.
    pub lock_owner: bool,
    /// `ok`, or `unavailable` while the last operation failed for the cluster's
    /// unavailability (or went past its bound).
    pub health: String,
    /// Operations librbd completed.
    pub ops: u64,
    /// Of them, failed because the cluster was unreachable or too slow.
    pub unavailable: u64,
    /// Other failed operations.
    pub errors: u64,
    /// Commands answered Namespace Not Ready by pollux's bound before librbd completed them.
    pub overdue: u64,
}

/// A namespace removed because its store vanished, as `subsystems` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VanishedView {
    /// The NSID it had.
    pub nsid: u32,
    /// What happened to its store.
    pub why: String,
}

/// One subsystem, as `subsystems` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubsystemView {
    /// NQN.
    pub nqn: String,
    /// Serial number.
    pub serial: String,
    /// Model number.
    pub model: String,
    /// Any host may connect.
    pub allow_any_host: bool,
    /// Allowed host NQNs.
    pub hosts: Vec<String>,
    /// Hosts that must authenticate (DH-HMAC-CHAP), with "+ctrl" when a controller key
    /// lets them authenticate the controller too. Never a key.
    #[serde(default)]
    pub dhchap_hosts: Vec<String>,
    /// Hosts with a TLS PSK, with its hash ("sha256", "sha384"). Never a key.
    #[serde(default)]
    pub tls_hosts: Vec<String>,
    /// Hosts may ask for secure channel concatenation (the conf's `secure_concat`; absent
    /// from older targets: false).
    #[serde(default)]
    pub secure_concat: bool,
    /// Namespaces by nsid.
    pub namespaces: Vec<NamespaceView>,
    /// Namespaces the target removed by itself because their store vanished, and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub vanished: Vec<VanishedView>,
    /// Listener addresses serving it.
    pub listeners: Vec<String>,
    /// The listeners serving it with the ANA state of each of its groups there (absent from
    /// older targets: none).
    #[serde(default)]
    pub paths: Vec<PathView>,
    /// Connected controllers.
    pub controllers: usize,
    /// The lowest controller ID its controllers get (absent from older targets: 1).
    #[serde(default = "min_cntlid")]
    pub min_cntlid: u16,
    /// The highest (absent from older targets: 0xFFEF).
    #[serde(default = "max_cntlid")]
    pub max_cntlid: u16,
}

fn min_cntlid() -> u16 {
    pollux_conf::MIN_CNTLID
}

fn max_cntlid() -> u16 {
    pollux_conf::MAX_CNTLID
}

/// What the discovery controller serves, as `discovery` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiscoveryView {
    /// The discovery log's generation counter (GENCTR): it changes with what it lists.
    pub genctr: u64,
    /// Listener addresses (each serves discovery), with their TLS mode when not none.
    pub listeners: Vec<String>,
    /// Referrals to other targets' discovery controllers, listed after the subsystems.
    pub referrals: Vec<String>,
    /// Discovery controllers connected now.
    pub controllers: usize,
}

/// One controller, as `controllers` reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CtrlView {
    /// Controller id.
    pub cntlid: u16,
    /// Subsystem NQN (the discovery NQN for a discovery controller).
    pub subsystem: String,
    /// A discovery controller.
    pub discovery: bool,
    /// Host NQN.
    pub hostnqn: String,
    /// Host identifier, hyphenated.
    pub hostid: String,
    /// Keep-alive timeout, ms (0: none).
    pub kato_ms: u32,
    /// CSTS.RDY: enabled by the host.
    pub ready: bool,
    /// Reactor of the admin queue (which owns the controller).
    pub admin_reactor: usize,
    /// I/O queues: qid -> reactor.
    pub io_queues: BTreeMap<u16, usize>,
    /// Created, seconds since the Unix epoch.
    pub created_unix_s: f64,
    /// Age, seconds.
    pub age_s: f64,
    /// How its admin queue authenticated ("sha384/ffdhe2048", "+ctrl" when bidirectional;
    /// "generated-psk/sha256" when TLS with a PSK secure channel concatenation generated
    /// secures it); None: its host has no keys.
    #[serde(default)]
    pub authenticated: Option<String>,
    /// The listener its admin queue connected through, as bound (absent from older
    /// targets).
    #[serde(default)]
    pub listener: Option<String>,
}

/// The `controllers` method's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CtrlList {
    /// Every controller that answered, by cntlid.
    pub controllers: Vec<CtrlView>,
    /// Reactors that did not answer in time (their controllers are missing).
    pub unanswered: Vec<usize>,
}

/// The result of `set_mode` and `set_cpu_budget`: the reactor's state once applied.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModeView {
    /// Reactor index.
    pub reactor: usize,
    /// Its mode now.
    pub mode: String,
    /// The adaptive policy is on.
    pub adaptive: bool,
    /// The adaptive policy's CPU budget.
    pub cpu_budget: f64,
}
