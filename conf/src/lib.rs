//! pollux configuration: the TOML file that sets up reactors, listeners,
//! transport options, keep-alive limits, the control socket, subsystems,
//! namespaces and their backends, and allowed hosts.
//!
//! [`Config::parse`] and [`Config::from_path`] read, deserialize and validate
//! a configuration in one step; the result is fully resolved (defaults filled
//! in, serial numbers and namespace identifiers derived), so consumers never
//! see an `Option` for something that has a default. Every error, syntactic or
//! semantic, is a [`ConfError`] that names the file, line and column of the
//! offending value. The keys are documented in `conf/REFERENCE.md`.

mod backend;
mod emit;
mod error;
pub mod group;
mod ids;
mod nqn;
pub mod nvmet;
mod raw;
pub mod save;
mod size;
mod validate;

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;

pub use backend::{Backend, FileBackend, Latency, NvmeBackend, NvmeDevice, RBD_OP_TIMEOUT_S, RbdBackend, SimBackend};
pub use error::ConfError;
pub use ids::{DerivedIds, derive_ids, derive_serial};
pub use nqn::{DISCOVERY_NQN, HexError, NQN_MAX_LEN, NqnError, UuidError, validate_nqn};
pub use pollux_nvme::auth::{DhGroup, DhchapKey, HashId};
pub use pollux_nvme::spec::AnaState;
pub use pollux_nvme::spec::ana::ANAGRPMAX;
pub use pollux_nvme::tls::ConfiguredPsk;
/// The reactor's own enums, spelled and parsed there: `[reactors] policy`, `hybrid_turnaround`
/// and a subsystem's or namespace's `polling` name them directly.
pub use pollux_reactor::{ModelKind, Polling, Turnaround, UnknownSpelling};
pub use size::{SizeError, format_size, parse_size};
pub use validate::backend::nvme::{BdfError, parse_bdf as parse_pci_address};
pub use validate::hosts::check_owner_only;
pub use validate::hosts::{KeyFileError, SecretFileError, read_dhchap_key_file, read_tls_key_file};

/// The text of `conf/examples/ram.toml`, the configuration used when none is
/// given (see [`Config::embedded_default`]).
pub const DEFAULT_CONF: &str = include_str!("../examples/ram.toml");

/// The origin reported for [`Config::embedded_default`].
pub const EMBEDDED_ORIGIN: &str = "<embedded>";

/// A complete, validated target configuration.
///
/// Only `PartialEq`: simulated backends hold `f64` latencies.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Reactor threads: cores, mode and connection placement.
    pub reactors: Reactors,
    /// Addresses to listen on (at least one); each serves the discovery
    /// subsystem and every configured subsystem whose `listeners` does not leave it out.
    pub listeners: Vec<Listener>,
    /// NVMe/TCP transport limits advertised to hosts.
    pub transport: Transport,
    /// Bounds applied to the keep-alive timeout a host asks for.
    pub keep_alive: KeepAlive,
    /// The NVM subsystems exported (possibly none: discovery only).
    pub subsystems: Vec<Subsystem>,
    /// The optional control socket and metrics endpoint.
    pub control: Control,
    /// Who must authenticate to the discovery controller (`[discovery]`).
    pub discovery: Discovery,
    /// Other targets' discovery controllers the discovery log refers hosts to
    /// (`[[referral]]`), in configuration order.
    pub referrals: Vec<Referral>,
    /// Where state that outlives the process is kept (`state_dir`): the reservations of
    /// file and nvme namespaces whose hosts set Persist Through Power Loss. None: no
    /// reservation persists (Identify Namespace RESCAP bit 0 is clear).
    pub state_dir: Option<PathBuf>,
    /// This gateway's membership in a gateway group (`[gateway]`): heartbeats, fencing and
    /// ANA takeover through the cluster of its rbd namespaces. None: a lone target.
    pub gateway: Option<Gateway>,
    /// A gateway group's member: the other gateways' listeners and the group subsystems each
    /// serves, for the discovery log (never in a conf file: set from the group's
    /// configuration, [`group::merge`]).
    pub group_peers: Vec<group::GroupPeer>,
    /// Where the configuration came from: a file name, or `"<embedded>"`.
    pub origin: String,
    /// The text it was parsed from, as its author wrote it (comments, order, what was left
    /// to defaults): run-time changes edit this document, and `pollux ctl save` writes it.
    pub document: Document,
}

/// The TOML text a [`Config`] was parsed from. Configurations are compared by meaning, so
/// two documents always compare equal: a comment does not make two configurations differ.
#[derive(Clone, Default)]
pub struct Document(std::sync::Arc<str>);

impl Document {
    /// The text.
    pub fn text(&self) -> &str {
        &self.0
    }
}

impl From<&str> for Document {
    fn from(t: &str) -> Self {
        Document(t.into())
    }
}

impl PartialEq for Document {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl std::fmt::Debug for Document {
    /// The length only: the text may hold inline secrets.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Document({} bytes)", self.0.len())
    }
}

/// The `[reactors]` table.
#[derive(Debug, Clone, PartialEq)]
pub struct Reactors {
    /// CPU cores, one reactor thread pinned to each; non-empty, no
    /// duplicates.
    pub cores: Vec<usize>,
    /// How reactors wait for work.
    pub mode: ReactorMode,
    /// A poller or handler running longer than this (microseconds) is logged
    /// as a stall; always > 0.
    pub stall_threshold_us: u64,
    /// How accepted connections are spread over reactors.
    pub placement: Placement,
    /// The fraction of one core each reactor may spend polling without
    /// finding work ([`ReactorMode::Adaptive`]); finite, `0 < cpu_budget <=
    /// 1`.
    pub cpu_budget: f64,
    /// The completion latency (microseconds) the adaptive mode aims for, if
    /// any, polling beyond `cpu_budget` to meet it; finite and > 0.
    pub latency_target_us: Option<f64>,
    /// Which sleep policy decides how long a hybrid reactor sleeps.
    pub policy: ModelKind,
    /// A fixed wake margin (microseconds) a hybrid reactor wakes before a predicted
    /// completion; finite and `>= 0`. None: the measured p99 of its timed wake-ups'
    /// lateness.
    pub hybrid_margin_us: Option<f64>,
    /// Whether a hybrid reactor spins through a closed-loop host's turnaround.
    pub hybrid_turnaround: Turnaround,
}

impl Default for Reactors {
    fn default() -> Self {
        Reactors {
            cores: vec![0],
            mode: ReactorMode::default(),
            stall_threshold_us: 2000,
            placement: Placement::default(),
            cpu_budget: 0.3,
            latency_target_us: None,
            policy: ModelKind::default(),
            hybrid_margin_us: None,
            hybrid_turnaround: Turnaround::default(),
        }
    }
}

/// How a reactor waits for work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ReactorMode {
    /// Spin on pollers without sleeping: lowest latency, one busy core per
    /// reactor. Spelled `"poll"`.
    Poll,
    /// With device commands in flight, sleep on a microsecond timer until
    /// shortly before their predicted completion, then poll; otherwise sleep
    /// in the kernel until an event arrives. Spelled `"hybrid"`.
    Hybrid,
    /// Sleep in the kernel until an event arrives. Spelled `"interrupt"`.
    Interrupt,
    /// Let a policy choose poll, hybrid or interrupt from the measured load and
    /// device latency, spending at most [`Reactors::cpu_budget`] of a core on
    /// polling that finds no work. Spelled `"adaptive"`; the default.
    #[default]
    Adaptive,
}

impl ReactorMode {
    /// The configuration spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ReactorMode::Poll => "poll",
            ReactorMode::Hybrid => "hybrid",
            ReactorMode::Interrupt => "interrupt",
            ReactorMode::Adaptive => "adaptive",
        }
    }
}

impl fmt::Display for ReactorMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ReactorMode {
    type Err = UnknownSpelling;
    fn from_str(s: &str) -> Result<Self, UnknownSpelling> {
        match s {
            "poll" => Ok(ReactorMode::Poll),
            "hybrid" => Ok(ReactorMode::Hybrid),
            "interrupt" => Ok(ReactorMode::Interrupt),
            "adaptive" => Ok(ReactorMode::Adaptive),
            _ => Err(UnknownSpelling {
                what: "reactor mode",
                given: s.to_owned(),
                expected: "\"poll\", \"hybrid\", \"interrupt\" or \"adaptive\"",
            }),
        }
    }
}

/// How accepted connections are assigned to reactors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Placement {
    /// Each new connection goes to the reactor of least measured load (its busy share,
    /// commands per second and open queues over the last sampling window), away from the
    /// reactors that already serve connections from the same host address, so that one
    /// controller's I/O queues spread instead of following one another. Spelled
    /// `"measured"`.
    #[default]
    Measured,
    /// Each new connection goes to the next reactor in turn. Spelled
    /// `"round-robin"`.
    RoundRobin,
    /// Each new connection goes to the reactor with the fewest connections.
    /// Spelled `"least-loaded"`.
    LeastLoaded,
}

impl Placement {
    /// The configuration spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Placement::Measured => "measured",
            Placement::RoundRobin => "round-robin",
            Placement::LeastLoaded => "least-loaded",
        }
    }
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Placement {
    type Err = UnknownSpelling;
    fn from_str(s: &str) -> Result<Self, UnknownSpelling> {
        match s {
            "measured" => Ok(Placement::Measured),
            "round-robin" => Ok(Placement::RoundRobin),
            "least-loaded" => Ok(Placement::LeastLoaded),
            _ => Err(UnknownSpelling {
                what: "placement",
                given: s.to_owned(),
                expected: "\"measured\", \"round-robin\" or \"least-loaded\"",
            }),
        }
    }
}

/// One `[[listener]]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listener {
    /// The TCP address to listen on. Port 0 asks the OS for a free port.
    pub address: SocketAddr,
    /// Whether connections must, may or may not secure the channel with TLS.
    pub tls: TlsMode,
    /// The ANA state of each ANA group on this listener's path (NVMe 2.0 §8.1.3) that is not
    /// optimized, by group id (1..=[`ANAGRPMAX`]).
    pub ana: BTreeMap<u32, AnaState>,
    /// Connections this listener serves at once (None: only
    /// [`Transport::max_connections`] bounds them); one more is accepted and closed.
    pub max_connections: Option<u32>,
}

impl Listener {
    /// A listener on `address` without TLS, every ANA group optimized.
    pub fn plain(address: SocketAddr) -> Self {
        Self {
            address,
            tls: TlsMode::None,
            ana: BTreeMap::new(),
            max_connections: None,
        }
    }

    /// The ANA state of group `grp` on this listener.
    pub fn ana_state(&self, grp: u32) -> AnaState {
        self.ana.get(&grp).copied().unwrap_or_default()
    }
}

/// One `[[referral]]`: another target's discovery controller, listed in this
/// target's discovery log as a referral entry (NVMe-oF 1.1 §5.3, SUBTYPE 1) so
/// that a host's `nvme connect-all` goes on to discover there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Referral {
    /// The other target's discovery listener: numeric, a real port, not one of
    /// this configuration's listeners.
    pub address: SocketAddr,
}

/// The lowest controller ID (NVMe-oF 1.1 §4.2: 0 is not a fabrics controller ID).
pub const MIN_CNTLID: u16 = 1;
/// The highest controller ID a dynamic controller may get: FFF0h..FFFFh are reserved
/// (NVMe-oF 1.1 §4.2; FFFFh asks for a dynamic controller in Connect, §6.3). nvmet and
/// SPDK use the same bound.
pub const MAX_CNTLID: u16 = 0xFFEF;

/// A listener's secure channel (NVMe/TCP 1.0 §3.6.1, TP 8011: TLS 1.3 with a PSK), which the
/// discovery log entry reports in TREQ and TSAS.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TlsMode {
    /// Plain TCP only: a TLS ClientHello is refused.
    #[default]
    None,
    /// TLS or plain TCP, as the host begins.
    Allowed,
    /// TLS only: a plaintext ICReq is refused.
    Required,
}

impl TlsMode {
    /// The name in a conf file.
    pub fn as_str(self) -> &'static str {
        match self {
            TlsMode::None => "none",
            TlsMode::Allowed => "allowed",
            TlsMode::Required => "required",
        }
    }
}

impl FromStr for TlsMode {
    type Err = UnknownSpelling;
    fn from_str(s: &str) -> Result<Self, UnknownSpelling> {
        match s {
            "none" => Ok(TlsMode::None),
            "allowed" => Ok(TlsMode::Allowed),
            "required" => Ok(TlsMode::Required),
            _ => Err(UnknownSpelling {
                what: "tls mode",
                given: s.to_owned(),
                expected: "\"none\", \"allowed\" or \"required\"",
            }),
        }
    }
}

/// The most connections `max_connections` (of `[transport]` or a listener) may allow.
pub const MAX_CONNECTIONS: i64 = 1 << 20;

/// The `[transport]` table: NVMe/TCP limits advertised to hosts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transport {
    /// Entries per I/O queue (CAP.MQES + 1), 2..=65536.
    pub io_queue_depth: u32,
    /// I/O queues a controller grants at most, 1..=65535 (None: as many as are useful on
    /// the target's reactors, [`Transport::io_queues_for`]).
    pub max_io_queues: Option<u32>,
    /// In-capsule data accepted with a command (IOCCSZ minus the SQE), bytes;
    /// a multiple of 16 in 4096..=131072.
    pub in_capsule_data_size: u32,
    /// Largest data transfer of one command, bytes; a power of two >= 4096.
    /// MDTS is derived from it (see [`Transport::mdts`]).
    pub max_io_size: u32,
    /// MAXH2CDATA advertised in ICResp, bytes; a multiple of 4, >= 4096.
    pub max_h2c_data: u32,
    /// Connections the target serves at once, over every listener; 1..=1048576.
    pub max_connections: u32,
    /// A connection that has not completed ICReq and Connect (and, on a TLS listener, its
    /// handshake) this long after it was accepted is closed, ms; 100..=600000.
    pub setup_timeout_ms: u32,
}

/// I/O queues per reactor a controller is granted without `max_io_queues`.
pub const AUTO_IO_QUEUES_PER_REACTOR: u32 = 4;
/// The fewest I/O queues a controller is granted without `max_io_queues` (a one-reactor
/// target still gives a host's CPUs a few queues to share).
pub const AUTO_IO_QUEUES_MIN: u32 = 8;
/// The most I/O queues a controller is granted without `max_io_queues` (nvmet's default).
pub const AUTO_IO_QUEUES_MAX: u32 = 128;

impl Transport {
    /// The I/O queues a controller grants at most on a target of `reactors` reactors:
    /// `max_io_queues`, or else 4 per reactor, between 8 and 128. Queues beyond a few per
    /// reactor add no parallelism on the target (each is a connection on one of them) and
    /// cost a connection's buffers each: a host that asks for one per CPU (127 from a
    /// 128-CPU host) is granted this many and shares them among its CPUs (NVMe 2.0
    /// §5.27.1.5: the controller may allocate fewer than requested).
    pub fn io_queues_for(&self, reactors: usize) -> u32 {
        self.max_io_queues.unwrap_or_else(|| {
            let per = u32::try_from(reactors)
                .unwrap_or(u32::MAX)
                .saturating_mul(AUTO_IO_QUEUES_PER_REACTOR);
            per.clamp(AUTO_IO_QUEUES_MIN, AUTO_IO_QUEUES_MAX)
        })
    }
}

impl Default for Transport {
    fn default() -> Self {
        Transport {
            io_queue_depth: 128,
            max_io_queues: None,
            in_capsule_data_size: 8192,
            max_io_size: 131_072,
            max_h2c_data: 131_072,
            max_connections: 4096,
            setup_timeout_ms: 10_000,
        }
    }
}

impl Transport {
    /// The Identify Controller MDTS value for [`Transport::max_io_size`],
    /// assuming a 4 KiB minimum memory page size (CAP.MPSMIN = 0): MDTS is a
    /// power of two in units of that page.
    pub fn mdts(&self) -> u8 {
        let pages = (self.max_io_size / 4096).max(1);
        // ilog2 of a nonzero u32 is at most 31, so it fits a u8.
        pages.ilog2() as u8
    }
}

/// The `[keep_alive]` table: bounds on the keep-alive timeout (KATO) that a
/// host requests in Connect, in milliseconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeepAlive {
    /// A nonzero KATO below this is raised to it.
    pub min_ms: u32,
    /// A KATO above this is lowered to it; `min_ms <= max_ms`, `max_ms > 0`.
    pub max_ms: u32,
}

impl Default for KeepAlive {
    fn default() -> Self {
        KeepAlive {
            min_ms: 1000,
            max_ms: 300_000,
        }
    }
}

impl KeepAlive {
    /// The KATO to use for a host that asked for `requested_ms`: 0 stays 0
    /// (keep-alive disabled, which NVMe over Fabrics permits), anything else
    /// is clamped into `min_ms..=max_ms`.
    pub fn clamp(&self, requested_ms: u32) -> u32 {
        if requested_ms == 0 {
            0
        } else {
            // `max` then `min` rather than `u32::clamp`, which panics if a
            // hand-built KeepAlive has min_ms > max_ms.
            requested_ms.max(self.min_ms).min(self.max_ms)
        }
    }
}

/// The `[gateway]` table: one member of a gateway group, whose members share rbd images
/// and watch each other through the cluster (a failed member is fenced and its ANA groups
/// taken over by a survivor).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gateway {
    /// The group's name (its RADOS objects are `pollux.gateway.<group>...`).
    pub group: String,
    /// This gateway's name, unique in the group.
    pub name: String,
    /// The ANA groups this gateway owns: reported optimized on its listeners while it
    /// lives, taken over by a survivor when it is fenced.
    pub ana_groups: Vec<u32>,
    /// How often this gateway proves it lives, in milliseconds.
    pub heartbeat_ms: u32,
    /// How long a member may be silent before it is fenced, in milliseconds.
    pub grace_ms: u32,
    /// How long a fenced member's cluster clients stay blocklisted, in seconds.
    pub blocklist_expiry_s: u32,
    /// How long a returning member waits before its ANA groups go back to it, in
    /// milliseconds.
    pub failback_delay_ms: u32,
    /// The cluster connection, pool and RADOS namespace of the group's objects: the
    /// table's `ceph_conf`, `user`, `keyring`, `pool` and `rados_namespace`, each absent one
    /// the first rbd namespace's (the defaults without one). The group's rbd namespaces
    /// (kept in the cluster, [`group`]) connect as this says.
    pub cluster: RbdBackend,
    /// The group key (an owner-only file of at least 32 random bytes, the same on every
    /// gateway of the group): the group's secrets are kept in the cluster sealed under it.
    /// None: the group's configuration holds no secret.
    pub key_file: Option<PathBuf>,
}

/// Where a target listens for `pollux ctl`, `pollux top` and RPC clients when its conf
/// names no `[control] socket`, and where they look without a flag.
pub const DEFAULT_CONTROL_SOCKET: &str = "/run/pollux.sock";

/// The `[control]` table: ways to inspect and steer a running target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Control {
    /// The Unix socket to accept control commands on (absolute, resolved
    /// like file backend paths); `None`: no control socket (`socket = "none"`).
    pub socket: Option<PathBuf>,
    /// `socket` is [`DEFAULT_CONTROL_SOCKET`] because the conf named none: a target that
    /// cannot have it (another pollux serves it, or the directory is not writable) serves
    /// on without one, saying so, where a socket the conf names must be had.
    pub socket_is_default: bool,
    /// The loopback address serving Prometheus text metrics over HTTP;
    /// `None`: no metrics endpoint.
    pub metrics: Option<SocketAddr>,
}

impl Default for Control {
    /// No `[control]` table: the default socket, no metrics.
    fn default() -> Self {
        Self {
            socket: Some(PathBuf::from(DEFAULT_CONTROL_SOCKET)),
            socket_is_default: true,
            metrics: None,
        }
    }
}

/// One `[[subsystem]]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Subsystem {
    /// The subsystem NQN; valid per [`validate_nqn`], unique, not
    /// [`DISCOVERY_NQN`].
    pub nqn: String,
    /// Identify Controller serial number: printable ASCII, 1..=20 bytes.
    pub serial: String,
    /// Identify Controller model number: printable ASCII, 1..=40 bytes.
    pub model: String,
    /// Whether any host may connect, whatever its NQN.
    pub allow_any_host: bool,
    /// Host NQNs allowed to connect (when `allow_any_host` is false), with or without keys.
    pub hosts: Vec<String>,
    /// The DH-HMAC-CHAP keys of listed hosts that must authenticate (NVMe 2.0 §8.13.5),
    /// by host NQN. A host with keys must authenticate even where `allow_any_host` is set.
    pub host_keys: BTreeMap<String, HostKeys>,
    /// The configured TLS PSKs of listed hosts, by host NQN: the PSK a host's TLS 1.3
    /// handshake with this subsystem's identity uses (NVMe/TCP 1.0 §3.6.1.3).
    pub tls_keys: BTreeMap<String, TlsKey>,
    /// The hash functions and DH groups this subsystem accepts (for a host whose
    /// [`HostKeys::dhchap`] gives its own, those instead).
    pub dhchap: Dhchap,
    /// Whether a host may ask for secure channel concatenation (SC_C in its DH-HMAC-CHAP
    /// Negotiate on the admin queue, NVMe 2.0 §8.13.5.9 as TP 8018 adds it): the exchange then
    /// generates a TLS PSK that the host's following connections use. It needs a listener
    /// with `tls = "allowed"` (the first connection is plain TCP, the rest TLS). False:
    /// such a Negotiate is refused (AUTH_Failure1, concatenation mismatch).
    pub secure_concat: bool,
    /// The namespaces, in configuration order; nsids are unique.
    pub namespaces: Vec<Namespace>,
    /// The lowest controller ID this subsystem's controllers get ([`MIN_CNTLID`] by
    /// default).
    pub min_cntlid: u16,
    /// The highest controller ID ([`MAX_CNTLID`] by default). Two targets exporting
    /// the same subsystem give it disjoint ranges, so a host never sees one controller
    /// ID twice among its paths (NVMe 2.0 §3.1: controller IDs are unique in a
    /// subsystem); `min_cntlid <= max_cntlid`, and the range holds at least one ID
    /// per reactor.
    pub max_cntlid: u16,
    /// The `polling` of its namespaces that set none (None: not given, `auto`).
    pub polling: Option<Polling>,
    /// The listeners that serve it, by their configured [`Listener::address`] (SPDK's
    /// `nvmf_subsystem_add_listener`, nvmet's port-to-subsystem links): a host discovers it
    /// and connects to it only there. None (not given): every listener. Never empty, each
    /// one of the conf's listeners, no duplicates.
    pub listeners: Option<Vec<SocketAddr>>,
}

/// Which listeners' entries a host's discovery log lists, by what they share with the
/// listener the host's discovery connection came through (SPDK's `discovery_filter`): all
/// of them (`match_any`, the default), or those with the same address, the same port or
/// both (as Linux nvmet, which lists the subsystems of the host's port only). The transport
/// is always TCP here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DiscoveryFilter {
    /// Only listeners on the same address (a listener on the unspecified address matches any).
    pub address: bool,
    /// Only listeners on the same port.
    pub svcid: bool,
}

impl DiscoveryFilter {
    /// Parse SPDK's spelling: `match_any`, or `transport`, `address`, `svcid` joined by `,`.
    pub fn parse(s: &str) -> Option<Self> {
        let mut f = Self::default();
        if s.trim() == "match_any" {
            return Some(f);
        }
        for part in s.split(',').map(str::trim) {
            match part {
                "transport" => {}
                "address" => f.address = true,
                "svcid" => f.svcid = true,
                _ => return None,
            }
        }
        Some(f)
    }

    /// SPDK's spelling (`match_any` for none).
    pub fn name(self) -> String {
        match (self.address, self.svcid) {
            (false, false) => "match_any".into(),
            (true, false) => "address".into(),
            (false, true) => "svcid".into(),
            (true, true) => "address,svcid".into(),
        }
    }

    /// Whether a listener on `listener` is listed to a host that came through `local`.
    pub fn admits(self, listener: std::net::SocketAddr, local: std::net::SocketAddr) -> bool {
        (!self.address || listener.ip().is_unspecified() || listener.ip() == local.ip())
            && (!self.svcid || listener.port() == local.port())
    }
}

/// The `[discovery]` table: DH-HMAC-CHAP on the discovery controller, and what its log
/// lists.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Discovery {
    /// Which listeners' entries the log lists ([`DiscoveryFilter`]).
    pub filter: DiscoveryFilter,
    /// Hosts that must authenticate to discover, with their keys.
    pub host_keys: BTreeMap<String, HostKeys>,
    /// The TLS PSKs of hosts that discover over TLS (identity naming the discovery NQN).
    pub tls_keys: BTreeMap<String, TlsKey>,
    /// Only hosts of `host_keys` may connect to the discovery controller (each
    /// authenticating); otherwise any host may, and those with keys authenticate.
    pub require_authentication: bool,
    /// Hash functions and DH groups accepted (for a host whose [`HostKeys::dhchap`] gives
    /// its own, those instead).
    pub dhchap: Dhchap,
}

/// A DH-HMAC-CHAP secret and the key file it was read from (None: given inline). `Debug`
/// shows no key material; the key's memory is zeroed when dropped.
#[derive(Debug, Clone, PartialEq)]
pub struct Secret {
    /// The key.
    pub key: DhchapKey,
    /// Its key file (owner-only permissions), written back by `pollux ctl save` instead of
    /// the key.
    pub file: Option<PathBuf>,
}

/// A configured TLS PSK (`NVMeTLSkey-1:`) and the key file it was read from (None: given
/// inline). `Debug` shows no key material; the key's memory is zeroed when dropped.
#[derive(Debug, Clone, PartialEq)]
pub struct TlsKey {
    /// The configured PSK.
    pub key: ConfiguredPsk,
    /// Its key file (owner-only permissions), written back by `pollux ctl save`.
    pub file: Option<PathBuf>,
}

/// A host's DH-HMAC-CHAP keys.
#[derive(Debug, Clone, PartialEq)]
pub struct HostKeys {
    /// The host's key: it proves the host to the controller.
    pub host: Secret,
    /// The controller's key, for bidirectional authentication: it proves the controller to
    /// a host that asks (`nvme connect --dhchap-ctrl-secret`).
    pub ctrl: Option<Secret>,
    /// This host's own hash functions and DH groups (its entry's `dhchap_hashes` and
    /// `dhchap_dh_groups`, as Linux nvmet's per-host `dhchap_hash` and `dhchap_dhgroup`),
    /// used instead of its subsystem's (or `[discovery]`'s) in the negotiation (NVMe 2.0
    /// §8.13.5.1); a list the entry does not give is the subsystem's. None: the subsystem's.
    pub dhchap: Option<Dhchap>,
}

impl HostKeys {
    /// The hash functions and DH groups this host negotiates with: its own, or `parent`'s
    /// (its subsystem's or `[discovery]`'s).
    pub fn policy<'a>(&'a self, parent: &'a Dhchap) -> &'a Dhchap {
        self.dhchap.as_ref().unwrap_or(parent)
    }
}

/// The hash functions and DH groups of a subsystem's DH-HMAC-CHAP, most preferred first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dhchap {
    /// Hash functions (`dhchap_hashes`).
    pub hashes: Vec<HashId>,
    /// DH groups (`dhchap_dh_groups`).
    pub dh_groups: Vec<DhGroup>,
}

impl Default for Dhchap {
    /// Every hash, SHA-256 first (what nvmet picks by default); every group, ffdhe2048 first
    /// (an exchange gives forward secrecy), the null group last.
    fn default() -> Self {
        Dhchap {
            hashes: HashId::ALL.to_vec(),
            dh_groups: vec![
                DhGroup::Ffdhe2048,
                DhGroup::Ffdhe3072,
                DhGroup::Ffdhe4096,
                DhGroup::Ffdhe6144,
                DhGroup::Ffdhe8192,
                DhGroup::Null,
            ],
        }
    }
}

impl Subsystem {
    /// Whether the controller ID range is the default one, [`MIN_CNTLID`]..=[`MAX_CNTLID`]
    /// (not written back by [`Config::to_toml`], and shared with every other subsystem
    /// that keeps it).
    pub fn default_cntlid_range(&self) -> bool {
        (self.min_cntlid, self.max_cntlid) == (MIN_CNTLID, MAX_CNTLID)
    }

    /// The polling policy namespace `n` (one of this subsystem's) runs with: its own, else
    /// the subsystem's, else `auto`.
    pub fn polling_of(&self, n: &Namespace) -> Polling {
        n.polling.or(self.polling).unwrap_or_default()
    }

    /// Whether the listener configured at `address` serves this subsystem.
    pub fn served_on(&self, address: SocketAddr) -> bool {
        self.listeners.as_ref().is_none_or(|l| l.contains(&address))
    }

    /// Whether a host with NQN `host_nqn` may connect.
    pub fn allows_host(&self, host_nqn: &str) -> bool {
        self.allow_any_host || self.hosts.iter().any(|h| h == host_nqn)
    }
}

/// One `[[subsystem.namespace]]`, with identifiers resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct Namespace {
    /// Namespace ID, 1..=0xFFFFFFFE.
    pub nsid: u32,
    /// Logical block size in bytes: 512 or 4096.
    pub block_size: u32,
    /// Where the data lives.
    pub backend: Backend,
    /// Namespace UUID (given, or derived from the subsystem NQN and nsid).
    pub uuid: [u8; 16],
    /// Namespace globally unique identifier (given or derived).
    pub nguid: [u8; 16],
    /// IEEE extended unique identifier (given or derived).
    pub eui64: [u8; 8],
    /// Which of `uuid`, `nguid` and `eui64` the conf gave. An `rbd` namespace's derived
    /// identifiers are replaced at start by ones derived from the cluster and the image
    /// ([`RbdBackend`]), so that every gateway serving the image presents the same namespace.
    pub given_ids: GivenIds,
    /// Its ANA group (NVMe 2.0 §8.1.3), 1..=[`ANAGRPMAX`]: its state on each listener is the
    /// listener's for the group.
    pub ana_group: u32,
    /// Its own `polling` (None: the subsystem's; see [`Subsystem::polling_of`]).
    pub polling: Option<Polling>,
    /// The hosts it is attached to (host masking, SPDK's `nvmf_ns_add_host`): only their
    /// controllers have it among their active namespaces (NVMe 2.0 §3.2.1.5); for every
    /// other host it is an inactive NSID. None (not given): every host the subsystem admits.
    /// Each a valid NQN, listed once, and one of the subsystem's `hosts` unless it has
    /// `allow_any_host`; may be empty (attached to no host).
    pub hosts: Option<Vec<String>>,
    /// Its QoS limits (`qos`; none given: unlimited).
    pub qos: Qos,
}

impl Namespace {
    /// Whether the controllers of host `host_nqn` have this namespace attached.
    pub fn visible_to(&self, host_nqn: &str) -> bool {
        self.hosts.as_ref().is_none_or(|h| h.iter().any(|x| x == host_nqn))
    }
}

/// A namespace's QoS limits (`qos = { iops = N, mbps = M, read_mbps = R, write_mbps = W }`,
/// any of them): one budget of the namespace, shared by every host, queue and reactor that
/// reaches it. None: no limit of that kind. A command over a limit is held until the budget
/// allows it, never failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Qos {
    /// Commands per second.
    pub iops: Option<u64>,
    /// Bytes read and written together, in MiB/s ([`Qos::MIB`] bytes: SPDK's bdev QoS
    /// `rw_mbytes_per_sec` counts the same 1024 * 1024-byte MB).
    pub mbps: Option<u64>,
    /// Bytes read, MiB/s.
    pub read_mbps: Option<u64>,
    /// Bytes written, MiB/s.
    pub write_mbps: Option<u64>,
}

impl Qos {
    /// The bytes of one MB of `mbps`, `read_mbps` and `write_mbps`: 1 MiB, as SPDK's bdev QoS.
    pub const MIB: u64 = 1024 * 1024;
    /// The largest value of any limit (an `iops` or a MiB/s): 2^32 - 1, well above what a
    /// namespace serves, and small enough that a byte rate fits 64 bits.
    pub const MAX: u64 = u32::MAX as u64;

    /// No limit is set.
    pub fn is_unlimited(&self) -> bool {
        *self == Qos::default()
    }

    /// The limits as `(key, value)`, in the conf's order, the ones set only.
    pub fn entries(&self) -> Vec<(&'static str, u64)> {
        [
            ("iops", self.iops),
            ("mbps", self.mbps),
            ("read_mbps", self.read_mbps),
            ("write_mbps", self.write_mbps),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k, v)))
        .collect()
    }
}

/// Which namespace identifiers a conf gave explicitly (the others are derived).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GivenIds {
    /// `uuid` was given.
    pub uuid: bool,
    /// `nguid` was given.
    pub nguid: bool,
    /// `eui64` was given.
    pub eui64: bool,
}

impl Config {
    /// The text of conf file `path` (zeroed when dropped: it may hold keys inline), for a
    /// caller that composes it with more before parsing (a gateway group's member).
    pub fn read_text(path: &Path) -> Result<zeroize::Zeroizing<String>, ConfError> {
        let origin = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|e| ConfError::io(&origin, e))?;
        String::from_utf8(bytes).map(zeroize::Zeroizing::new).map_err(|e| {
            let at = e.utf8_error().valid_up_to();
            drop(zeroize::Zeroizing::new(e.into_bytes()));
            ConfError::nowhere(
                &origin,
                format!("not UTF-8 (byte {at}): a conf file is TOML, which is UTF-8"),
            )
        })
    }

    /// Reads, parses and validates the configuration file at `path`.
    /// Relative paths inside it (file backends, the control socket) are
    /// resolved against the directory holding `path`.
    pub fn from_path(path: &Path) -> Result<Config, ConfError> {
        let origin = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|e| ConfError::io(&origin, e))?;
        // The text may hold keys inline (`dhchap_key`, `tls_key`): zeroed when dropped, as
        // a key file's text is.
        match String::from_utf8(bytes) {
            Ok(text) => {
                let text = zeroize::Zeroizing::new(text);
                validate::build(&text, &origin, validate::Base::DirOf(path))
            }
            Err(e) => {
                // TOML is UTF-8 (TOML 1.0 "Spec"); point at the first bad
                // byte, measured in the valid text before it.
                let valid = e.utf8_error().valid_up_to();
                let bytes = zeroize::Zeroizing::new(e.into_bytes());
                let prefix = std::str::from_utf8(&bytes[..valid]).unwrap_or_default();
                Err(ConfError::at(
                    &origin,
                    prefix,
                    valid..valid,
                    "the file is not valid UTF-8, as TOML requires".into(),
                ))
            }
        }
    }

    /// Parses and validates configuration `text`; `origin` names it in
    /// errors and in [`Config::origin`]. Relative paths inside it (file
    /// backends, the control socket) are resolved against the current
    /// directory.
    pub fn parse(text: &str, origin: &str) -> Result<Config, ConfError> {
        validate::build(text, origin, validate::Base::CurrentDir)
    }

    /// Parses and validates `text` as the new content of the configuration file `path`
    /// (a run-time change to be saved there): relative paths resolve against the directory
    /// holding `path`, as [`Config::from_path`] would resolve them; `origin` names the text
    /// in errors. Nothing is read from `path` itself.
    pub fn parse_as(text: &str, origin: &str, path: &Path) -> Result<Config, ConfError> {
        validate::build(text, origin, validate::Base::SavedAs(path))
    }

    /// Whether any key is given inline in the conf (`dhchap_key`, `dhchap_ctrl_key`,
    /// `tls_key`) rather than read from a key file: such a conf is a secret itself.
    pub fn has_inline_secrets(&self) -> bool {
        let dhchap = self.subsystems.iter().flat_map(|s| s.host_keys.values());
        let tls = self.subsystems.iter().flat_map(|s| s.tls_keys.values());
        dhchap
            .chain(self.discovery.host_keys.values())
            .any(|k| k.host.file.is_none() || k.ctrl.as_ref().is_some_and(|c| c.file.is_none()))
            || tls.chain(self.discovery.tls_keys.values()).any(|k| k.file.is_none())
    }

    /// The built-in configuration, `conf/examples/ram.toml` (one reactor on
    /// core 0, listeners on 127.0.0.1:4420 and :8009, one 1 GiB RAM
    /// namespace open to any host), with origin `"<embedded>"`.
    pub fn embedded_default() -> Config {
        // The text is fixed at build time and a unit test parses it, so this
        // cannot fail in a tested build.
        Config::parse(DEFAULT_CONF, EMBEDDED_ORIGIN).expect("conf/examples/ram.toml is valid")
    }

    /// Writes this configuration as TOML. For a configuration that came
    /// from [`Config::parse`], parsing the result (with the same origin)
    /// gives an equal `Config`; derived serials and identifiers are written
    /// out explicitly, paths as resolved (absolute), and floats in a form
    /// that parses back to the same value.
    pub fn to_toml(&self) -> String {
        emit::to_toml(self)
    }
}
