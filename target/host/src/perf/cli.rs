//! The `pollux perf` command line: spdk_nvme_perf's options where they exist.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use pollux_conf::Config;
use pollux_conf::DhchapKey;
use pollux_nvme::tls::ConfiguredPsk;
use pollux_reactor::ReactorStats;
use zeroize::Zeroizing;

use super::{DEFAULT_HOSTNQN, PerfError, PerfOpts, PerfReport, Workload};
use crate::{Digests, HostDhchap, HostTls};

/// A target `--target-conf` runs in this process, started by whoever links the server
/// (`pollux_target::Target` implements it; the `pollux` binary picks it): the host library
/// cannot depend on the target crate, whose binary depends on it.
pub trait InProcessTarget: Sized {
    /// Why starting or stopping failed.
    type Error: std::error::Error + Send + Sync + 'static;
    /// Binds the listeners of `cfg` and starts its reactors (pinned to their cores when
    /// `pin`).
    fn start(cfg: &Config, pin: bool) -> Result<Self, Self::Error>;
    /// The bound listener addresses, in conf order (ports resolved).
    fn listen_addrs(&self) -> Vec<SocketAddr>;
    /// Accounting of every reactor, read when measuring starts and ends.
    fn reactor_stats(&self) -> Vec<ReactorStats>;
    /// Stops the target: closes every connection and joins the reactors.
    fn shutdown(self) -> Result<(), Self::Error>;
}

/// `pollux perf`: NVMe/TCP load generator (like spdk_nvme_perf).
#[derive(Debug, Clone, clap::Args)]
pub struct PerfArgs {
    /// Target: 'trtype:tcp traddr:127.0.0.1 trsvcid:4420 subnqn:NQN [hostnqn:NQN]'. With
    /// --target-conf only subnqn is used (default: the conf's first subsystem).
    #[arg(short = 'r', long = "transport-id", value_name = "TRID")]
    pub trid: Option<String>,
    /// Commands in flight per I/O queue.
    #[arg(short = 'q', long = "queue-depth", default_value_t = 1)]
    pub queue_depth: usize,
    /// Bytes per I/O (4096, 4K, 128KiB...).
    #[arg(short = 'o', long = "io-size", default_value = "4096")]
    pub io_size: String,
    /// randread, randwrite, randrw, read, write, rw, or idle (connect, no I/O).
    #[arg(short = 'w', long = "workload", default_value = "randread")]
    pub workload: String,
    /// Read percentage of rw and randrw.
    #[arg(short = 'M', long = "rwmixread", default_value_t = 50)]
    pub mix: u8,
    /// Measured seconds (fractions allowed).
    #[arg(short = 't', long = "time", default_value_t = 10.0)]
    pub time: f64,
    /// Seconds of load before measuring.
    #[arg(long, default_value_t = 0.0)]
    pub warmup: f64,
    /// Count-based run: measure exactly N I/Os instead of a duration.
    #[arg(long, value_name = "N")]
    pub ios: Option<u64>,
    /// Client cores, one pinned thread each: "0", "0,2", "0-3". Default: one core that no
    /// reactor of --target-conf (or the --floor server) runs on, else 0. Sharing a core with
    /// a polling reactor works but is warned about: the two take turns, and latency goes
    /// from microseconds to milliseconds.
    #[arg(long)]
    pub cores: Option<String>,
    /// I/O queues (TCP connections) per client thread.
    #[arg(long, default_value_t = 1)]
    pub conns_per_core: usize,
    /// Do not pin the client threads.
    #[arg(long)]
    pub no_pin: bool,
    /// Header digests.
    #[arg(long)]
    pub hdgst: bool,
    /// Data digests.
    #[arg(long)]
    pub ddgst: bool,
    /// Namespace ID.
    #[arg(long, default_value_t = 1)]
    pub nsid: u32,
    /// Write LBA+generation patterns and check every block read; a mismatch fails the run.
    #[arg(long)]
    pub verify: bool,
    /// Pace submissions to this many IOPS in total.
    #[arg(long, value_name = "IOPS")]
    pub rate: Option<f64>,
    /// Use only the first SIZE bytes of the namespace (4G, 64MiB...).
    #[arg(long, value_name = "SIZE")]
    pub span: Option<String>,
    /// Seconds without any completion (commands in flight) before giving up; also the
    /// deadline of each connection step.
    #[arg(long, default_value_t = 5.0)]
    pub timeout: f64,
    /// Seed of the offset generators.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Before the warmup, write every I/O unit of the range once (so reads touch written data).
    #[arg(long)]
    pub fill: bool,
    /// Wait for completions in poll(2) instead of busy-polling (needs --conns-per-core 1).
    #[arg(long)]
    pub blocking: bool,
    /// Host NQN to connect as (instead of the -r hostnqn; default: a fixed perf NQN).
    #[arg(long, value_name = "NQN")]
    pub hostnqn: Option<String>,
    /// TLS 1.3 on every queue with this configured PSK ('NVMeTLSkey-1:01:...:', as `nvme
    /// gen-tls-key` writes), derived for the host NQN and the subsystem NQN (NVMe/TCP 1.0
    /// §3.6.1.3). Visible to other users in the process list: prefer --tls-key-file.
    #[arg(long, value_name = "KEY", value_parser = secret_arg, conflicts_with = "tls_key_file")]
    pub tls_key: Option<SecretArg>,
    /// The same from a file, which neither group nor others may access (chmod 600).
    #[arg(long, value_name = "FILE")]
    pub tls_key_file: Option<PathBuf>,
    /// DH-HMAC-CHAP (NVMe 2.0 §8.13.5) on every queue where the controller asks for it, with
    /// this host secret ('DHHC-1:XX:...:', as `nvme gen-dhchap-key` writes; `nvme connect
    /// --dhchap-secret`). Visible to other users in the process list: prefer
    /// --dhchap-key-file.
    #[arg(long, value_name = "KEY", value_parser = secret_arg, conflicts_with = "dhchap_key_file")]
    pub dhchap_key: Option<SecretArg>,
    /// The same from a file, which neither group nor others may access (chmod 600), as the
    /// conf's `dhchap_key_file`.
    #[arg(long, value_name = "FILE")]
    pub dhchap_key_file: Option<PathBuf>,
    /// Bidirectional DH-HMAC-CHAP: the controller's secret, with which the controller must
    /// prove itself too (`nvme connect --dhchap-ctrl-secret`). Prefer
    /// --dhchap-ctrl-key-file.
    #[arg(long, value_name = "KEY", value_parser = secret_arg, conflicts_with = "dhchap_ctrl_key_file")]
    pub dhchap_ctrl_key: Option<SecretArg>,
    /// The same from an owner-only file, as the conf's `dhchap_ctrl_key_file`.
    #[arg(long, value_name = "FILE")]
    pub dhchap_ctrl_key_file: Option<PathBuf>,
    /// PSK identity version with --tls-key: 0 (nvme-cli's default) or 1 (with the PSK digest).
    #[arg(long, value_name = "0|1", value_parser = clap::value_parser!(u8).range(0..=1))]
    pub tls_identity: Option<u8>,
    /// Keep SQ flow control on (by default perf disables it at Connect, like
    /// `nvme connect --disable-sqflow`, so reads complete with one C2HData PDU).
    #[arg(long)]
    pub sqflow: bool,
    /// Start a pollux target from this conf in this process (reactors pinned to its cores)
    /// and also report the target's CPU per I/O and its reactors' mode mix.
    #[arg(long, value_name = "FILE")]
    pub target_conf: Option<PathBuf>,
    /// Measure the platform's loopback floor instead of a target: a thread pinned to CORE
    /// answers each read or write with the bytes pollux would, over plain TCP (no NVMe/TCP),
    /// at the queue depth given; with --span, from random blocks of a region that large (as a
    /// RAM namespace), else from one cache-hot block. Run next to pollux's run of the same
    /// job it tells what pollux adds.
    #[arg(long, value_name = "CORE", conflicts_with = "target_conf")]
    pub floor: Option<usize>,
    /// Right before and after the run, time a cache line's round trip between the client's
    /// first core and this one (default: the in-process target's first reactor core, or the
    /// floor's core): it tells how near the host placed the two CPUs for this run, which on
    /// a VM moves the loopback round trip by half (reported as "placement"). Not when the two
    /// cores are the same; a default probe that fails is logged, an asked-for one fails the run.
    #[arg(long, value_name = "CORE")]
    pub probe_core: Option<usize>,
    /// Do not probe the placement (see --probe-core).
    #[arg(long, conflicts_with = "probe_core")]
    pub no_probe: bool,
    /// Print the report as one line of JSON.
    #[arg(long)]
    pub json: bool,
    /// KEY=VALUE copied into the JSON report's "tags" (repeatable; for benchmark scripts).
    #[arg(long = "tag", value_name = "KEY=VALUE")]
    pub tags: Vec<String>,
}

/// The fields of an SPDK transport ID string.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Trid {
    /// traddr.
    pub traddr: Option<String>,
    /// trsvcid.
    pub trsvcid: Option<u16>,
    /// subnqn.
    pub subnqn: Option<String>,
    /// hostnqn.
    pub hostnqn: Option<String>,
}

/// Parses 'trtype:tcp adrfam:IPv4 traddr:A trsvcid:P subnqn:N hostnqn:H' (keys in any
/// order, case-insensitive; trtype must be tcp).
pub fn parse_trid(s: &str) -> Result<Trid, PerfError> {
    let bad = |m: String| PerfError::Options(format!("-r {s:?}: {m}"));
    let mut t = Trid::default();
    for kv in s.split_whitespace() {
        let Some((k, v)) = kv.split_once(':') else {
            return Err(bad(format!("{kv:?} is not key:value")));
        };
        match k.to_ascii_lowercase().as_str() {
            "trtype" if v.eq_ignore_ascii_case("tcp") => {}
            "trtype" => return Err(bad(format!("trtype {v}: only tcp"))),
            "adrfam" => {}
            "traddr" => t.traddr = Some(v.to_string()),
            "trsvcid" => t.trsvcid = Some(v.parse().map_err(|_| bad(format!("trsvcid {v}")))?),
            "subnqn" => t.subnqn = Some(v.to_string()),
            "hostnqn" => t.hostnqn = Some(v.to_string()),
            other => return Err(bad(format!("unknown key {other}"))),
        }
    }
    Ok(t)
}

/// Parses "0", "0,2", "1-3", "0,2-3".
pub fn parse_cores(s: &str) -> Result<Vec<usize>, PerfError> {
    let bad = || PerfError::Options(format!("--cores {s:?}: expected e.g. 0 or 0,2 or 0-3"));
    let mut v = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
                if a > b || b - a > 1024 {
                    return Err(bad());
                }
                v.extend(a..=b);
            }
            None => v.push(part.parse().map_err(|_| bad())?),
        }
    }
    if v.is_empty() {
        return Err(bad());
    }
    Ok(v)
}

/// A secret as given (`--tls-key`, `--dhchap-key`, `--dhchap-ctrl-key`), parsed by
/// [`to_opts`]: clap's own error for a value its parser refuses would echo the value, a
/// secret. `Debug` does not show it; zeroed when dropped.
#[derive(Clone)]
pub struct SecretArg(Zeroizing<String>);

impl std::fmt::Debug for SecretArg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretArg(..)")
    }
}

fn secret_arg(s: &str) -> Result<SecretArg, std::convert::Infallible> {
    Ok(SecretArg(Zeroizing::new(s.to_string())))
}

/// One DH-HMAC-CHAP secret from `--NAME KEY` or `--NAME-file FILE`; the reason for a
/// refusal names no part of the key ([`pollux_nvme::auth::KeyError`] never carries it).
fn dhchap_secret(
    name: &str,
    inline: Option<&SecretArg>,
    file: Option<&PathBuf>,
) -> Result<Option<DhchapKey>, PerfError> {
    match (inline, file) {
        (Some(k), _) => DhchapKey::parse(&k.0)
            .map(Some)
            .map_err(|e| PerfError::Options(format!("--{name}: {e}"))),
        (None, Some(path)) => pollux_conf::read_dhchap_key_file(path)
            .map(Some)
            .map_err(|why| PerfError::Options(format!("--{name}-file {}: {why}", path.display()))),
        (None, None) => Ok(None),
    }
}

/// The DH-HMAC-CHAP options: a host secret, and a controller secret for bidirectional
/// authentication (which needs the host's: the host authenticates first).
fn dhchap_opts(a: &PerfArgs) -> Result<Option<HostDhchap>, PerfError> {
    let host = dhchap_secret("dhchap-key", a.dhchap_key.as_ref(), a.dhchap_key_file.as_ref())?;
    let ctrl = dhchap_secret(
        "dhchap-ctrl-key",
        a.dhchap_ctrl_key.as_ref(),
        a.dhchap_ctrl_key_file.as_ref(),
    )?;
    match (host, ctrl) {
        (Some(host), ctrl) => Ok(Some(HostDhchap::new(host, ctrl))),
        (None, Some(_)) => Err(PerfError::Options(
            "--dhchap-ctrl-key needs --dhchap-key (or --dhchap-key-file): the host authenticates first".into(),
        )),
        (None, None) => Ok(None),
    }
}

/// The TLS options: a PSK from --tls-key or --tls-key-file, with --tls-identity.
fn tls_opts(a: &PerfArgs) -> Result<Option<HostTls>, PerfError> {
    let psk = match (&a.tls_key, &a.tls_key_file) {
        // The reason names no part of the key (PskError never carries it).
        (Some(k), _) => Some(ConfiguredPsk::parse(&k.0).map_err(|e| PerfError::Options(format!("--tls-key: {e}")))?),
        // The conf's rules for a `tls_key_file` (owner-only, a regular file, small).
        (None, Some(path)) => Some(
            pollux_conf::read_tls_key_file(path)
                .map_err(|why| PerfError::Options(format!("--tls-key-file {}: {why}", path.display())))?,
        ),
        (None, None) => None,
    };
    match psk {
        Some(k) => Ok(Some(HostTls::new(k).identity(a.tls_identity.unwrap_or(0)))),
        None if a.tls_identity.is_some() => Err(PerfError::Options(
            "--tls-identity needs --tls-key or --tls-key-file".into(),
        )),
        None => Ok(None),
    }
}

fn secs(what: &str, s: f64) -> Result<Duration, PerfError> {
    Duration::try_from_secs_f64(s).map_err(|_| PerfError::Options(format!("{what} {s}: not a duration")))
}

fn size(what: &str, s: &str) -> Result<u64, PerfError> {
    pollux_conf::parse_size(s).map_err(|e| PerfError::Options(format!("{what} {s:?}: {e}")))
}

/// Builds the options; `target` is the in-process target's address and default subsystem,
/// `cores` the client's cores ([`client_cores`]).
pub fn to_opts(a: &PerfArgs, target: Option<(SocketAddr, String)>, cores: &[usize]) -> Result<PerfOpts, PerfError> {
    let trid = a.trid.as_deref().map(parse_trid).transpose()?.unwrap_or_default();
    let (addr, default_nqn) = match target {
        Some((addr, nqn)) => (addr, Some(nqn)),
        None => {
            let ip: IpAddr = trid
                .traddr
                .as_deref()
                .ok_or_else(|| PerfError::Options("-r needs traddr (or use --target-conf)".into()))?
                .parse()
                .map_err(|_| PerfError::Options("traddr must be a numeric IP address".into()))?;
            (SocketAddr::new(ip, trid.trsvcid.unwrap_or(4420)), None)
        }
    };
    let subnqn = trid
        .subnqn
        .or(default_nqn)
        .ok_or_else(|| PerfError::Options("-r needs subnqn".into()))?;
    let mut o = PerfOpts::new(addr, &subnqn);
    o.hostnqn = a
        .hostnqn
        .clone()
        .or(trid.hostnqn)
        .unwrap_or_else(|| DEFAULT_HOSTNQN.to_string());
    o.nsid = a.nsid;
    o.queue_depth = a.queue_depth;
    o.io_size = u32::try_from(size("-o", &a.io_size)?).map_err(|_| PerfError::Options("-o above 4 GiB".into()))?;
    o.workload = Workload::parse(&a.workload, a.mix)?;
    o.duration = secs("-t", a.time)?;
    o.warmup = secs("--warmup", a.warmup)?;
    o.ios = a.ios;
    o.cores = cores.iter().map(|&c| (!a.no_pin).then_some(c)).collect();
    o.conns_per_core = a.conns_per_core;
    o.digests = Digests {
        hdgst: a.hdgst,
        ddgst: a.ddgst,
    };
    o.verify = a.verify;
    o.rate = a.rate;
    o.span = a.span.as_deref().map(|s| size("--span", s)).transpose()?;
    o.timeout = secs("--timeout", a.timeout)?;
    o.seed = a.seed;
    o.blocking = a.blocking;
    o.fill = a.fill;
    o.sqflow = a.sqflow;
    o.tls = tls_opts(a)?;
    o.dhchap = dhchap_opts(a)?;
    o.progress = !a.json && std::io::IsTerminal::is_terminal(&std::io::stderr());
    Ok(o)
}

/// The client's cores, and why they are a bad choice when they are: `--cores` as given,
/// else the first core this process may run on that is not in `target` (the in-process
/// target's reactor cores, or the floor server's), else 0 when the target is remote.
///
/// A busy-polling client on the core of a polling reactor takes turns with it in time
/// slices: a QD1 read waits for the other's slice, milliseconds instead of microseconds. So
/// the default never does that (and refuses when every core is the target's), and a
/// `--cores` that does is warned about.
pub fn client_cores(a: &PerfArgs, target: &[usize]) -> Result<(Vec<usize>, Option<String>), PerfError> {
    let unpinned = a.no_pin || target.is_empty();
    if let Some(list) = &a.cores {
        let cores = parse_cores(list)?;
        let shared: Vec<usize> = cores.iter().copied().filter(|c| target.contains(c)).collect();
        let warning = (!unpinned && !shared.is_empty()).then(|| {
            format!(
                "--cores {list} shares core(s) {shared:?} with the target (cores {target:?}): the client and the target take turns on them, so latency will be in milliseconds and IOPS a fraction of what either can do; leave out --cores to choose free cores"
            )
        });
        return Ok((cores, warning));
    }
    if unpinned {
        return Ok((vec![0], None));
    }
    let allowed = pollux_reactor::sys::allowed_cores()
        .map_err(|e| PerfError::Options(format!("cannot read the cores this process may use: {e}")))?;
    match allowed.iter().copied().find(|c| !target.contains(c)) {
        Some(c) => Ok((vec![c], None)),
        None => Err(PerfError::Options(format!(
            "no core left for the client: the target runs on cores {target:?}, all that this process may use ({allowed:?}); a client sharing a core with a polling reactor measures their taking turns, not the target. Use a conf with fewer reactor cores, or give --cores to share one anyway"
        ))),
    }
}

/// Runs `pollux perf` and prints the report: 0 on success, 1 if the run failed, 2 for bad
/// options or conf. `T` is the target `--target-conf` starts.
pub fn main<T: InProcessTarget>(a: &PerfArgs) -> ExitCode {
    match run::<T>(a) {
        Ok(r) => {
            let out = if a.json {
                let mut v = serde_json::to_value(&r).unwrap_or_default();
                let tags: BTreeMap<_, _> = a
                    .tags
                    .iter()
                    .map(|t| t.split_once('=').unwrap_or((t.as_str(), "")))
                    .collect();
                if let Some(m) = v.as_object_mut() {
                    m.insert("tags".into(), serde_json::json!(tags));
                }
                format!("{v}\n")
            } else {
                r.text()
            };
            let mut so = std::io::stdout().lock();
            let _ = so.write_all(out.as_bytes());
            let _ = so.flush();
            ExitCode::SUCCESS
        }
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "pollux perf: {e}");
            ExitCode::from(if matches!(e, CliError::Usage(_)) { 2 } else { 1 })
        }
    }
}

/// Why `pollux perf` failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Bad options or conf (exit status 2).
    #[error("{0}")]
    Usage(String),
    /// The run failed.
    #[error("{0}")]
    Perf(#[from] PerfError),
    /// The in-process target of `--target-conf` did not start or stop.
    #[error("in-process target: {0}")]
    Target(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// What to probe: the client's and the target's core, and whether a failed probe fails the
/// run (asked for with --probe-core) or is only logged (the default).
struct Probe {
    client: usize,
    target: usize,
    required: bool,
}

/// The two cores to probe when both are known, pinned and not the same.
fn probe_cores(a: &PerfArgs, client: usize, target_core: Option<usize>) -> Result<Option<Probe>, CliError> {
    if a.no_probe || a.no_pin {
        return Ok(None);
    }
    Ok(a.probe_core
        .or(target_core)
        .filter(|&t| t != client)
        .map(|target| Probe {
            client,
            target,
            required: a.probe_core.is_some(),
        }))
}

/// Runs `run` between two placement probes (when asked). The probes run while no client or
/// target thread does: a spinning reactor would share the probe's core.
fn bracketed(probe: Option<Probe>, run: impl FnOnce() -> Result<PerfReport, CliError>) -> Result<PerfReport, CliError> {
    let Some(p) = probe else { return run() };
    let once = || match super::probe_placement(p.client, p.target) {
        Ok(ns) => Ok(Some(ns)),
        Err(e) if p.required => Err(CliError::from(e)),
        Err(e) => {
            tracing::warn!(error = %e, "placement probe failed: the report has no placement");
            Ok(None)
        }
    };
    let before = once()?;
    let mut r = run()?;
    let (Some(before_ns), Some(after_ns)) = (before, once()?) else {
        return Ok(r);
    };
    let (client_core, target_core) = (p.client, p.target);
    r.placement = Some(super::Placement {
        client_core,
        target_core,
        before_ns,
        after_ns,
    });
    Ok(r)
}

/// The client's cores for a target on `target` cores, the collision warned about once.
fn cores_for(a: &PerfArgs, target: &[usize]) -> Result<Vec<usize>, CliError> {
    let (cores, warning) = client_cores(a, target).map_err(usage)?;
    if let Some(w) = warning {
        tracing::warn!("{w}");
    }
    Ok(cores)
}

/// Runs `pollux perf` as [`main`] does, returning the report rather than printing it.
pub fn run<T: InProcessTarget>(a: &PerfArgs) -> Result<PerfReport, CliError> {
    if let Some(core) = a.floor {
        let cores = cores_for(a, &[core])?;
        // The floor needs no target: any address satisfies the options' parser.
        let o = to_opts(
            a,
            Some((SocketAddr::from(([127, 0, 0, 1], 0)), "nqn.floor".into())),
            &cores,
        )
        .map_err(usage)?;
        if o.verify {
            return Err(CliError::Usage(
                "--floor answers with fixed bytes, not a namespace: nothing to --verify".into(),
            ));
        }
        if o.tls.is_some() || o.dhchap.is_some() {
            return Err(CliError::Usage(
                "--floor measures plain TCP: no TLS or DH-HMAC-CHAP options".into(),
            ));
        }
        return bracketed(probe_cores(a, cores[0], Some(core))?, || {
            Ok(super::floor::run(&o, core)?)
        });
    }
    let Some(path) = &a.target_conf else {
        let cores = cores_for(a, &[])?;
        let o = to_opts(a, None, &cores).map_err(usage)?;
        return bracketed(probe_cores(a, cores[0], None)?, || Ok(super::run(&o)?));
    };
    let cfg = Config::from_path(path).map_err(|e| CliError::Usage(e.to_string()))?;
    // Unpinned reactors (--no-pin) may run anywhere: nothing to keep apart.
    let reactor_cores = if a.no_pin {
        Vec::new()
    } else {
        cfg.reactors.cores.clone()
    };
    let cores = cores_for(a, &reactor_cores)?;
    let probe = probe_cores(a, cores[0], cfg.reactors.cores.first().copied())?;
    bracketed(probe, || run_target::<T>(a, path, &cfg, &cores))
}

/// Starts the in-process target from `cfg`, runs the job against it, and stops it.
fn run_target<T: InProcessTarget>(
    a: &PerfArgs,
    path: &std::path::Path,
    cfg: &Config,
    cores: &[usize],
) -> Result<PerfReport, CliError> {
    let nqn = cfg
        .subsystems
        .first()
        .map(|s| s.nqn.clone())
        .ok_or_else(|| CliError::Usage(format!("{}: no subsystem", path.display())))?;
    let target = T::start(cfg, !a.no_pin).map_err(|e| CliError::Target(Box::new(e)))?;
    let addr = target.listen_addrs().first().copied();
    let result = match addr {
        None => Err(CliError::Usage(format!("{}: no listener", path.display()))),
        Some(addr) => to_opts(a, Some((addr, nqn)), cores)
            .map_err(usage)
            .and_then(|o| super::run_with_stats(&o, &|| target.reactor_stats()).map_err(CliError::from)),
    };
    target.shutdown().map_err(|e| CliError::Target(Box::new(e)))?;
    result
}

fn usage(e: PerfError) -> CliError {
    CliError::Usage(e.to_string())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn trids_and_core_lists_parse_like_spdk() {
        let t = parse_trid("trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:4421 subnqn:nqn.a:b").unwrap();
        assert_eq!(t.traddr.as_deref(), Some("127.0.0.1"));
        assert_eq!(t.trsvcid, Some(4421));
        assert_eq!(t.subnqn.as_deref(), Some("nqn.a:b"));
        assert!(parse_trid("trtype:rdma traddr:1.2.3.4").is_err());
        assert!(parse_trid("traddr").is_err());
        assert_eq!(parse_cores("0").unwrap(), vec![0]);
        assert_eq!(parse_cores("0,2-4").unwrap(), vec![0, 2, 3, 4]);
        assert!(parse_cores("3-1").is_err());
        assert!(parse_cores("").is_err());
        assert!(Workload::parse("randrw", 70).is_ok_and(|w| w.read_pct == 70));
        assert!(Workload::parse("trim", 0).is_err());
    }

    /// The in-process target of these tests: one that cannot start (the host library has
    /// no server; runs against pollux's own target are pollux-target's `tests/perf.rs`).
    #[derive(Debug)]
    struct NoTarget;

    impl InProcessTarget for NoTarget {
        type Error = std::io::Error;
        fn start(_: &Config, _: bool) -> Result<Self, Self::Error> {
            Err(std::io::Error::other("no target here"))
        }
        fn listen_addrs(&self) -> Vec<SocketAddr> {
            Vec::new()
        }
        fn reactor_stats(&self) -> Vec<ReactorStats> {
            Vec::new()
        }
        fn shutdown(self) -> Result<(), Self::Error> {
            Ok(())
        }
    }

    fn run_cli(a: &PerfArgs) -> Result<PerfReport, CliError> {
        run::<NoTarget>(a)
    }

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        perf: PerfArgs,
    }

    fn args(extra: &[&str]) -> PerfArgs {
        use clap::Parser as _;
        let base = ["perf", "--floor", "1", "--cores", "0", "--ios", "200", "-t", "1"];
        Cli::parse_from(base.iter().chain(extra)).perf
    }

    fn parse(argv: &[&str]) -> PerfArgs {
        use clap::Parser as _;
        Cli::parse_from(["perf"].iter().chain(argv)).perf
    }

    fn two_cores() -> bool {
        pollux_reactor::sys::allowed_cores().is_ok_and(|c| c.len() >= 2)
    }

    #[test]
    fn the_default_client_core_is_one_no_reactor_runs_on_and_a_collision_is_refused_or_warned() {
        if !two_cores() {
            return;
        }
        let allowed = pollux_reactor::sys::allowed_cores().unwrap();
        let first = allowed[0];
        // Remote target: core 0, as always.
        assert_eq!(client_cores(&parse(&[]), &[]).unwrap(), (vec![0], None));
        // In-process target on the first core: the client goes elsewhere.
        let (cores, warning) = client_cores(&parse(&[]), &[first]).unwrap();
        assert_eq!((cores.len(), warning), (1, None));
        assert_ne!(cores[0], first);
        assert!(allowed.contains(&cores[0]));
        // Every core is the target's: refused, with the reason and the way out.
        let e = client_cores(&parse(&[]), &allowed).unwrap_err().to_string();
        assert!(
            e.contains("no core left for the client") && e.contains("--cores"),
            "{e}"
        );
        // Asked for: allowed, with a warning that says why it will be slow.
        let (cores, warning) = client_cores(&parse(&["--cores", &first.to_string()]), &[first]).unwrap();
        assert_eq!(cores, vec![first]);
        let w = warning.expect("a warning");
        assert!(w.contains("take turns") && w.contains("leave out --cores"), "{w}");
        // Apart, or unpinned: nothing to say.
        let other = allowed[1];
        assert_eq!(
            client_cores(&parse(&["--cores", &other.to_string()]), &[first]).unwrap(),
            (vec![other], None)
        );
        assert_eq!(client_cores(&parse(&["--no-pin"]), &allowed).unwrap(), (vec![0], None));
    }

    #[test]
    fn a_run_is_bracketed_by_placement_probes_of_its_two_cores_unless_told_not_to() {
        if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
            return;
        }
        let r = run_cli(&args(&[])).unwrap();
        let p = r.placement.expect("probed");
        assert_eq!((p.client_core, p.target_core), (0, 1));
        assert!(p.before_ns > 0 && p.after_ns > 0, "{p:?}");
        assert!(run_cli(&args(&["--no-probe"])).unwrap().placement.is_none());
        assert!(run_cli(&args(&["--no-pin"])).unwrap().placement.is_none());
        // The client's own core: nothing to measure.
        assert!(run_cli(&args(&["--probe-core", "0"])).unwrap().placement.is_none());
        // A probe asked for that cannot run fails the run; the default one only is left out.
        let e = run_cli(&args(&["--probe-core", "4095"])).unwrap_err();
        assert!(e.to_string().contains("4095"), "{e}");
    }

    #[test]
    fn a_target_conf_whose_target_does_not_start_is_a_target_error_with_its_reason() {
        let dir = std::env::temp_dir().join(format!("pollux-perf-no-target-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let conf = dir.join("ram.toml");
        std::fs::write(
            &conf,
            r#"
[reactors]
cores = [0]

[[listener]]
address = "127.0.0.1:0"

[[subsystem]]
nqn = "nqn.2026-11.io.pollux:perf-no-target"
allow_any_host = true

[[subsystem.namespace]]
nsid = 1
backend = { ram = { size = "4MiB" } }
"#,
        )
        .unwrap();
        let path = conf.to_str().unwrap();
        let e = run_cli(&parse(&["--target-conf", path, "--no-pin", "--ios", "10"])).unwrap_err();
        assert!(matches!(e, CliError::Target(_)), "{e:?}");
        assert_eq!(e.to_string(), "in-process target: no target here");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
