//! The `pollux perf` command line: spdk_nvme_perf's options where they exist.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use pollux_conf::Config;
use pollux_nvme::tls::ConfiguredPsk;
use zeroize::Zeroizing;

use super::{DEFAULT_HOSTNQN, PerfError, PerfOpts, PerfReport, Workload};
use crate::host::{Digests, HostTls};
use crate::{Options, Target};

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
    /// Client cores, one pinned thread each: "0", "0,2", "0-3".
    #[arg(long, default_value = "0")]
    pub cores: String,
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
    #[arg(long, value_name = "KEY", value_parser = tls_key_arg, conflicts_with = "tls_key_file")]
    pub tls_key: Option<TlsKeyArg>,
    /// The same from a file, which neither group nor others may access (chmod 600).
    #[arg(long, value_name = "FILE")]
    pub tls_key_file: Option<PathBuf>,
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

/// A `--tls-key` as given, parsed by [`to_opts`]: clap's own error for a value its parser
/// refuses would echo the value, a secret. `Debug` does not show it; zeroed when dropped.
#[derive(Clone)]
pub struct TlsKeyArg(Zeroizing<String>);

impl std::fmt::Debug for TlsKeyArg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TlsKeyArg(..)")
    }
}

fn tls_key_arg(s: &str) -> Result<TlsKeyArg, std::convert::Infallible> {
    Ok(TlsKeyArg(Zeroizing::new(s.to_string())))
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

/// Builds the options; `target` is the in-process target's address and default subsystem.
pub fn to_opts(a: &PerfArgs, target: Option<(SocketAddr, String)>) -> Result<PerfOpts, PerfError> {
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
    let cores = parse_cores(&a.cores)?;
    o.cores = cores.into_iter().map(|c| (!a.no_pin).then_some(c)).collect();
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
    Ok(o)
}

/// Runs `pollux perf` and prints the report: 0 on success, 1 if the run failed, 2 for bad
/// options or conf.
pub fn main(a: &PerfArgs) -> ExitCode {
    match run_cli(a) {
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
enum CliError {
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Perf(#[from] PerfError),
    #[error("in-process target: {0}")]
    Target(String),
}

/// What to probe: the client's and the target's core, and whether a failed probe fails the
/// run (asked for with --probe-core) or is only logged (the default).
struct Probe {
    client: usize,
    target: usize,
    required: bool,
}

/// The two cores to probe when both are known, pinned and not the same.
fn probe_cores(a: &PerfArgs, target_core: Option<usize>) -> Result<Option<Probe>, CliError> {
    if a.no_probe || a.no_pin {
        return Ok(None);
    }
    let client = parse_cores(&a.cores).map_err(usage)?[0];
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

fn run_cli(a: &PerfArgs) -> Result<PerfReport, CliError> {
    if let Some(core) = a.floor {
        // The floor needs no target: any address satisfies the options' parser.
        let o = to_opts(a, Some((SocketAddr::from(([127, 0, 0, 1], 0)), "nqn.floor".into()))).map_err(usage)?;
        if o.tls.is_some() {
            return Err(CliError::Usage("--floor measures plain TCP: no TLS options".into()));
        }
        return bracketed(probe_cores(a, Some(core))?, || Ok(super::floor::run(&o, core)?));
    }
    let Some(path) = &a.target_conf else {
        let o = to_opts(a, None).map_err(usage)?;
        return bracketed(probe_cores(a, None)?, || Ok(super::run(&o)?));
    };
    let cfg = Config::from_path(path).map_err(|e| CliError::Usage(e.to_string()))?;
    let cores = probe_cores(a, cfg.reactors.cores.first().copied())?;
    bracketed(cores, || run_target(a, path, &cfg))
}

/// Starts the in-process target from `cfg`, runs the job against it, and stops it.
fn run_target(a: &PerfArgs, path: &std::path::Path, cfg: &Config) -> Result<PerfReport, CliError> {
    let nqn = cfg
        .subsystems
        .first()
        .map(|s| s.nqn.clone())
        .ok_or_else(|| CliError::Usage(format!("{}: no subsystem", path.display())))?;
    let target = Target::start(cfg, Options { pin: !a.no_pin }).map_err(|e| CliError::Target(e.to_string()))?;
    let addr = target.listen_addrs().first().copied();
    let result = match addr {
        None => Err(CliError::Usage(format!("{}: no listener", path.display()))),
        Some(addr) => to_opts(a, Some((addr, nqn)))
            .map_err(usage)
            .and_then(|o| super::run_with_stats(&o, &|| target.reactor_stats()).map_err(CliError::from)),
    };
    target.shutdown().map_err(|e| CliError::Target(e.to_string()))?;
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
}
