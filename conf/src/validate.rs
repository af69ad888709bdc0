//! Turns the raw, spanned deserialization into the public [`Config`],
//! checking every semantic rule and reporting the position of the offending
//! value.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::net::SocketAddr;
use std::ops::Range;
use std::path::{Component, Path, PathBuf};

use toml::Spanned;

use crate::error::{ConfError, line_col};
use crate::ids::{derive_ids, derive_serial};
use crate::nqn::{DISCOVERY_NQN, format_uuid, hex, parse_hex, parse_uuid, validate_nqn};
use crate::raw::{
    RawBackend, RawConfig, RawControl, RawFile, RawKeepAlive, RawLatency, RawListener, RawNamespace, RawNvme,
    RawReactors, RawSim, RawSize, RawSubsystem, RawTransport,
};
use crate::size::parse_size;
use crate::{
    Backend, Config, Control, FileBackend, KeepAlive, Latency, Listener, Namespace, NvmeBackend, NvmeDevice, Placement,
    ReactorMode, Reactors, SimBackend, SleepPolicyKind, Subsystem, Transport,
};

/// The highest core index accepted: Linux's `cpu_set_t`, which
/// `sched_setaffinity` takes, holds CPUs 0..1024.
const MAX_CORE: i64 = 1023;

/// The highest valid NSID; 0xFFFFFFFF is the broadcast value (NVMe Base
/// §3.2.1.2) and 0 is never a namespace.
const MAX_NSID: i64 = 0xFFFF_FFFE;

/// Identify Controller SN and MN widths (NVMe Base, Identify Controller data
/// structure): ASCII, space padded.
const SERIAL_MAX: usize = 20;
const MODEL_MAX: usize = 40;

/// The model number used when a subsystem gives none.
const DEFAULT_MODEL: &str = "pollux";

/// A simulated backend's read latency when `read` is not given.
const DEFAULT_SIM_READ: Latency = Latency::LogNormal {
    median_us: 80.0,
    sigma: 0.2,
};

/// A simulated backend's write latency when `write` is not given.
const DEFAULT_SIM_WRITE: Latency = Latency::LogNormal {
    median_us: 20.0,
    sigma: 0.2,
};

/// The longest Unix socket path: `sun_path` in Linux's `sockaddr_un` holds
/// 108 bytes including the terminating NUL.
const UNIX_PATH_MAX: usize = 107;

/// The largest lognormal `sigma` accepted: beyond it the distribution's tail
/// is so long that a simulation is dominated by rare, absurd latencies.
const MAX_SIGMA: f64 = 3.0;

/// What relative paths in the configuration are relative to.
pub(crate) enum Base<'a> {
    /// The current directory: the text did not come from a file.
    CurrentDir,
    /// The directory holding this configuration file.
    DirOf(&'a Path),
}

/// Parsing context: the text (to turn spans into lines), its origin, and
/// the base of relative paths.
struct Cx<'a> {
    text: &'a str,
    origin: &'a str,
    base: Base<'a>,
}

impl Cx<'_> {
    fn at(&self, span: Range<usize>, message: String) -> ConfError {
        ConfError::at(self.origin, self.text, span, message)
    }

    fn nowhere(&self, message: String) -> ConfError {
        ConfError::nowhere(self.origin, message)
    }

    fn line(&self, span: &Range<usize>) -> usize {
        line_col(self.text, span.start).0
    }

    /// An integer in `lo..=hi`.
    fn int(&self, v: &Spanned<i64>, key: &str, lo: i64, hi: i64) -> Result<i64, ConfError> {
        let n = *v.get_ref();
        if (lo..=hi).contains(&n) {
            Ok(n)
        } else {
            Err(self.at(v.span(), format!("`{key}` must be between {lo} and {hi}, got {n}")))
        }
    }

    /// An optional integer in `lo..=hi` that fits `u32`, or `default`.
    fn u32_or(&self, v: &Option<Spanned<i64>>, key: &str, lo: i64, hi: i64, default: u32) -> Result<u32, ConfError> {
        match v {
            None => Ok(default),
            Some(v) => {
                let n = self.int(v, key, lo, hi.min(i64::from(u32::MAX)))?;
                u32::try_from(n).map_err(|_| self.at(v.span(), format!("`{key}` is out of range")))
            }
        }
    }

    /// A size in bytes.
    fn size(&self, v: &Spanned<RawSize>, key: &str) -> Result<u64, ConfError> {
        match v.get_ref() {
            RawSize::Int(n) => {
                u64::try_from(*n).map_err(|_| self.at(v.span(), format!("`{key}` must not be negative, got {n}")))
            }
            RawSize::Text(s) => parse_size(s).map_err(|e| self.at(v.span(), format!("invalid `{key}`: {e}"))),
        }
    }

    /// An optional transport byte count fitting `u32`, checked by `rule`
    /// (which returns the reason it fails), or `default`.
    fn transport_bytes(
        &self,
        v: &Option<Spanned<RawSize>>,
        key: &str,
        default: u32,
        rule: impl Fn(u64) -> Option<String>,
    ) -> Result<u32, ConfError> {
        let Some(v) = v else { return Ok(default) };
        let n = self.size(v, key)?;
        if let Some(why) = rule(n) {
            return Err(self.at(v.span(), format!("`{key}` {why}, got {n}")));
        }
        u32::try_from(n).map_err(|_| self.at(v.span(), format!("`{key}` must be at most {}, got {n}", u32::MAX)))
    }

    /// A finite float, checked by `rule` (which returns the reason it
    /// fails).
    fn float(&self, v: &Spanned<f64>, key: &str, rule: impl Fn(f64) -> Option<&'static str>) -> Result<f64, ConfError> {
        let x = *v.get_ref();
        if !x.is_finite() {
            return Err(self.at(v.span(), format!("`{key}` must be a finite number, got {x}")));
        }
        match rule(x) {
            Some(why) => Err(self.at(v.span(), format!("`{key}` {why}, got {x}"))),
            None => Ok(x),
        }
    }

    /// An optional finite float checked by `rule`, or `default`.
    fn float_or(
        &self,
        v: &Option<Spanned<f64>>,
        key: &str,
        default: f64,
        rule: impl Fn(f64) -> Option<&'static str>,
    ) -> Result<f64, ConfError> {
        match v {
            None => Ok(default),
            Some(v) => self.float(v, key, rule),
        }
    }

    /// A path, made absolute: a relative one is joined to the directory of
    /// the configuration file (or the current directory), and `.`
    /// components are dropped. `..` is kept: it cannot be removed without
    /// following symbolic links.
    fn path(&self, v: &Spanned<String>, key: &str) -> Result<PathBuf, ConfError> {
        let s = v.get_ref();
        if s.is_empty() {
            return Err(self.at(v.span(), format!("`{key}` must not be empty")));
        }
        if s.contains('\0') {
            return Err(self.at(v.span(), format!("`{key}` {s:?} must not contain a NUL character")));
        }
        let p = Path::new(s);
        let full = if p.is_absolute() {
            p.to_path_buf()
        } else {
            let dir = match self.base {
                Base::CurrentDir => Path::new(""),
                Base::DirOf(file) => file.parent().unwrap_or(Path::new("")),
            };
            let dir = if dir.is_absolute() {
                dir.to_path_buf()
            } else {
                let cwd = std::env::current_dir().map_err(|e| {
                    self.at(
                        v.span(),
                        format!("cannot resolve the relative `{key}` {s:?}: the current directory is unknown: {e}"),
                    )
                })?;
                cwd.join(dir)
            };
            dir.join(p)
        };
        Ok(full.components().filter(|c| *c != Component::CurDir).collect())
    }
}

/// `rule` for [`Cx::float`]: zero or more.
fn non_negative(x: f64) -> Option<&'static str> {
    (x < 0.0).then_some("must not be negative")
}

/// `rule` for [`Cx::float`]: more than zero.
fn positive(x: f64) -> Option<&'static str> {
    (x <= 0.0).then_some("must be greater than 0")
}

/// Parses and validates `text`.
pub(crate) fn build(text: &str, origin: &str, base: Base<'_>) -> Result<Config, ConfError> {
    let cx = Cx { text, origin, base };
    let raw: RawConfig = toml::from_str(text).map_err(|e| toml_error(&cx, &e))?;

    let reactors = match raw.reactors {
        Some(r) => reactors(&cx, r)?,
        None => {
            return Err(
                cx.nowhere("missing the [reactors] table; add one, e.g. `[reactors]` with `cores = [0]`".into())
            );
        }
    };
    let listeners = listeners(&cx, raw.listener.unwrap_or_default())?;
    let transport = match raw.transport {
        Some(t) => transport(&cx, t)?,
        None => Transport::default(),
    };
    let keep_alive = match raw.keep_alive {
        Some(k) => keep_alive(&cx, k)?,
        None => KeepAlive::default(),
    };
    let control = match raw.control {
        Some(c) => control(&cx, c, &listeners)?,
        None => Control::default(),
    };
    let subsystems = subsystems(&cx, raw.subsystem.unwrap_or_default())?;
    if subsystems.is_empty() {
        tracing::info!(origin, "configuration has no [[subsystem]]: only discovery is served");
    }
    tracing::debug!(
        origin,
        reactors = reactors.cores.len(),
        listeners = listeners.len(),
        subsystems = subsystems.len(),
        "configuration loaded"
    );
    Ok(Config {
        reactors,
        listeners,
        transport,
        keep_alive,
        subsystems,
        control,
        origin: origin.to_owned(),
    })
}

/// A toml syntax or deserialization error, with serde's vocabulary turned
/// into TOML's ("key", not "field") and multi-line messages joined.
fn toml_error(cx: &Cx<'_>, e: &toml::de::Error) -> ConfError {
    let message = e
        .message()
        .trim()
        .replace("unknown field", "unknown key")
        .replace("missing field", "missing key")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(": ");
    match e.span() {
        Some(span) => cx.at(span, message),
        None => cx.nowhere(message),
    }
}

fn reactors(cx: &Cx<'_>, r: RawReactors) -> Result<Reactors, ConfError> {
    if r.cores.get_ref().is_empty() {
        return Err(cx.at(
            r.cores.span(),
            "`cores` is empty: list at least one CPU core, e.g. `cores = [0]`".into(),
        ));
    }
    let mut cores = Vec::with_capacity(r.cores.get_ref().len());
    for c in r.cores.get_ref() {
        let core = cx.int(c, "cores", 0, MAX_CORE)?;
        // In range 0..=1023, so the conversion cannot fail.
        let core = usize::try_from(core).unwrap_or_default();
        if cores.contains(&core) {
            return Err(cx.at(
                c.span(),
                format!("core {core} is listed twice in `cores`; each core runs one reactor"),
            ));
        }
        cores.push(core);
    }
    let mode = match &r.mode {
        None => ReactorMode::default(),
        Some(m) => m.get_ref().parse().map_err(|e| cx.at(m.span(), e))?,
    };
    let stall_threshold_us = match &r.stall_threshold_us {
        None => 2000,
        Some(v) => cx.int(v, "stall_threshold_us", 1, i64::MAX)?.unsigned_abs(),
    };
    let placement = match &r.placement {
        None => Placement::default(),
        Some(p) => p.get_ref().parse().map_err(|e| cx.at(p.span(), e))?,
    };
    let d = Reactors::default();
    let cpu_budget = cx.float_or(&r.cpu_budget, "cpu_budget", d.cpu_budget, |x| {
        (x <= 0.0 || x > 1.0).then_some("must be greater than 0 and at most 1 (a fraction of one core)")
    })?;
    let latency_target_us = match &r.latency_target_us {
        None => None,
        Some(v) => Some(cx.float(v, "latency_target_us", positive)?),
    };
    let policy = match &r.policy {
        None => SleepPolicyKind::default(),
        Some(p) => p.get_ref().parse().map_err(|e| cx.at(p.span(), e))?,
    };
    Ok(Reactors {
        cores,
        mode,
        stall_threshold_us,
        placement,
        cpu_budget,
        latency_target_us,
        policy,
    })
}

fn listeners(cx: &Cx<'_>, raw: Vec<RawListener>) -> Result<Vec<Listener>, ConfError> {
    if raw.is_empty() {
        return Err(cx.nowhere(
            "no [[listener]]: add at least one, e.g. `[[listener]]` with `address = \"127.0.0.1:4420\"`".into(),
        ));
    }
    let mut seen: HashMap<SocketAddr, usize> = HashMap::new();
    let mut out = Vec::with_capacity(raw.len());
    for l in raw {
        let text = l.address.get_ref();
        let address: SocketAddr = text.trim().parse().map_err(|_| {
            cx.at(
                l.address.span(),
                format!(
                    "listener address {text:?} is not of the form \"IPv4:port\" or \"[IPv6]:port\" (numeric, no host names)"
                ),
            )
        })?;
        let line = cx.line(&l.address.span());
        if let Some(first) = seen.insert(address, line) {
            return Err(cx.at(
                l.address.span(),
                format!("listener address {address} is already listed on line {first}"),
            ));
        }
        out.push(Listener { address });
    }
    Ok(out)
}

fn transport(cx: &Cx<'_>, t: RawTransport) -> Result<Transport, ConfError> {
    let d = Transport::default();
    Ok(Transport {
        io_queue_depth: cx.u32_or(&t.io_queue_depth, "io_queue_depth", 2, 65536, d.io_queue_depth)?,
        max_io_queues: cx.u32_or(&t.max_io_queues, "max_io_queues", 1, 65535, d.max_io_queues)?,
        // ICDOFF/IOCCSZ are in 16-byte units (NVMe/TCP §3.6.2.3, ICResp).
        in_capsule_data_size: cx.transport_bytes(
            &t.in_capsule_data_size,
            "in_capsule_data_size",
            d.in_capsule_data_size,
            |n| {
                if !(4096..=131_072).contains(&n) {
                    Some("must be between 4096 and 131072 bytes".into())
                } else if n % 16 != 0 {
                    Some("must be a multiple of 16".into())
                } else {
                    None
                }
            },
        )?,
        // MDTS is a power of two in pages, so only powers of two map exactly.
        max_io_size: cx.transport_bytes(&t.max_io_size, "max_io_size", d.max_io_size, |n| {
            if n < 4096 || !n.is_power_of_two() {
                Some("must be a power of two and at least 4096 bytes".into())
            } else {
                None
            }
        })?,
        // MAXH2CDATA must be a multiple of 4 bytes and at least 4 KiB
        // (NVMe/TCP, ICResp PDU).
        max_h2c_data: cx.transport_bytes(&t.max_h2c_data, "max_h2c_data", d.max_h2c_data, |n| {
            if n < 4096 || n % 4 != 0 {
                Some("must be a multiple of 4 and at least 4096 bytes".into())
            } else {
                None
            }
        })?,
    })
}

fn keep_alive(cx: &Cx<'_>, k: RawKeepAlive) -> Result<KeepAlive, ConfError> {
    let d = KeepAlive::default();
    let min_ms = cx.u32_or(&k.min_ms, "min_ms", 0, i64::from(u32::MAX), d.min_ms)?;
    let max_ms = cx.u32_or(&k.max_ms, "max_ms", 1, i64::from(u32::MAX), d.max_ms)?;
    if min_ms > max_ms {
        // Point at whichever of the two was written (min_ms if both were).
        let span = k.min_ms.as_ref().or(k.max_ms.as_ref()).map(Spanned::span);
        let message = format!("keep_alive `min_ms` ({min_ms}) is greater than `max_ms` ({max_ms})");
        return Err(match span {
            Some(span) => cx.at(span, message),
            None => cx.nowhere(message),
        });
    }
    Ok(KeepAlive { min_ms, max_ms })
}

fn control(cx: &Cx<'_>, c: RawControl, listeners: &[Listener]) -> Result<Control, ConfError> {
    let socket = match &c.socket {
        None => None,
        Some(v) => {
            let path = cx.path(v, "socket")?;
            let len = path.as_os_str().len();
            if len > UNIX_PATH_MAX {
                return Err(cx.at(
                    v.span(),
                    format!(
                        "control `socket` {} is {len} bytes long; a Unix socket path holds at most {UNIX_PATH_MAX}",
                        path.display()
                    ),
                ));
            }
            Some(path)
        }
    };
    let metrics = match &c.metrics {
        None => None,
        Some(v) => {
            let text = v.get_ref();
            let address: SocketAddr = text.trim().parse().map_err(|_| {
                cx.at(
                    v.span(),
                    format!(
                        "`metrics` address {text:?} is not of the form \"127.0.0.1:port\" or \"[::1]:port\" (numeric, no host names)"
                    ),
                )
            })?;
            if !address.ip().is_loopback() {
                return Err(cx.at(
                    v.span(),
                    format!(
                        "`metrics` address {address} is not a loopback address: the metrics endpoint has no authentication, so it may only listen on 127.0.0.0/8 or [::1]"
                    ),
                ));
            }
            if address.port() != 0 && listeners.iter().any(|l| l.address == address) {
                return Err(cx.at(
                    v.span(),
                    format!("`metrics` address {address} is also a [[listener]] address; give it another port"),
                ));
            }
            Some(address)
        }
    };
    Ok(Control { socket, metrics })
}

/// A namespace identifier already in use, for the uniqueness check.
struct IdOwner {
    nqn: String,
    nsid: u32,
}

/// Namespace identifiers seen so far, across all subsystems: NVMe requires
/// NGUID, EUI64 and UUID to be unique (NVMe Base §4.7). Also the files
/// backing namespaces, which must not be shared either.
#[derive(Default)]
struct IdRegistry {
    uuids: HashMap<[u8; 16], IdOwner>,
    nguids: HashMap<[u8; 16], IdOwner>,
    euis: HashMap<[u8; 8], IdOwner>,
    /// Resolved file backend paths, with the line of their `path`.
    files: HashMap<PathBuf, (IdOwner, usize)>,
    /// NVMe (device name, nsid) pairs in use, with the line naming them.
    nvme: HashMap<(String, u32), (IdOwner, usize)>,
    /// Whether each NVMe device name is a PCI function (true) or a fake one.
    nvme_kinds: HashMap<String, (bool, usize)>,
}

fn subsystems(cx: &Cx<'_>, raw: Vec<RawSubsystem>) -> Result<Vec<Subsystem>, ConfError> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut ids = IdRegistry::default();
    let mut out = Vec::with_capacity(raw.len());
    for s in raw {
        let sub = subsystem(cx, s, &mut seen, &mut ids)?;
        out.push(sub);
    }
    Ok(out)
}

/// A printable-ASCII Identify string (SN, MN): 1..=`max` bytes of 0x20..=0x7E.
fn identify_string(cx: &Cx<'_>, v: &Spanned<String>, key: &str, max: usize) -> Result<String, ConfError> {
    let s = v.get_ref();
    if s.is_empty() || s.len() > max || !s.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
        return Err(cx.at(
            v.span(),
            format!("`{key}` {s:?} must be 1 to {max} printable ASCII characters"),
        ));
    }
    if s.trim().is_empty() {
        return Err(cx.at(v.span(), format!("`{key}` must not be blank")));
    }
    Ok(s.clone())
}

fn subsystem(
    cx: &Cx<'_>,
    s: RawSubsystem,
    seen: &mut HashMap<String, usize>,
    ids: &mut IdRegistry,
) -> Result<Subsystem, ConfError> {
    let nqn_span = s.nqn.span();
    let nqn = s.nqn.into_inner();
    if nqn == DISCOVERY_NQN {
        return Err(cx.at(
            nqn_span,
            format!("`nqn` {nqn:?} is the discovery NQN, which pollux serves on every listener by itself; choose another name"),
        ));
    }
    validate_nqn(&nqn).map_err(|e| cx.at(nqn_span.clone(), format!("invalid `nqn`: {e}")))?;
    match seen.entry(nqn.clone()) {
        Entry::Occupied(first) => {
            return Err(cx.at(
                nqn_span,
                format!("subsystem {nqn:?} is already defined on line {}", first.get()),
            ));
        }
        Entry::Vacant(v) => {
            v.insert(cx.line(&nqn_span));
        }
    }

    let serial = match &s.serial {
        Some(v) => identify_string(cx, v, "serial", SERIAL_MAX)?,
        None => derive_serial(&nqn),
    };
    let model = match &s.model {
        Some(v) => identify_string(cx, v, "model", MODEL_MAX)?,
        None => DEFAULT_MODEL.to_owned(),
    };
    let allow_any_host = s.allow_any_host.as_ref().is_some_and(|a| *a.get_ref());

    let mut hosts: Vec<String> = Vec::new();
    if let Some(list) = &s.hosts {
        for h in list.get_ref() {
            validate_nqn(h.get_ref()).map_err(|e| cx.at(h.span(), format!("invalid host NQN in `hosts`: {e}")))?;
            if hosts.contains(h.get_ref()) {
                return Err(cx.at(h.span(), format!("host {:?} is listed twice in `hosts`", h.get_ref())));
            }
            hosts.push(h.get_ref().clone());
        }
    }
    if !allow_any_host && hosts.is_empty() {
        let span = s
            .hosts
            .as_ref()
            .map(Spanned::span)
            .or_else(|| s.allow_any_host.as_ref().map(Spanned::span))
            .unwrap_or(nqn_span);
        return Err(cx.at(
            span,
            format!(
                "subsystem {nqn:?} admits no host: set `allow_any_host = true`, or list the host NQNs allowed to connect in `hosts = [\"nqn...\"]`"
            ),
        ));
    }
    if allow_any_host && !hosts.is_empty() {
        tracing::warn!(
            origin = cx.origin,
            subsystem = %nqn,
            "`hosts` is ignored because `allow_any_host = true`"
        );
    }

    let mut namespaces: Vec<Namespace> = Vec::new();
    let mut nsids: HashMap<u32, usize> = HashMap::new();
    for n in s.namespace.unwrap_or_default() {
        let ns = namespace(cx, &nqn, n, &mut nsids, ids)?;
        namespaces.push(ns);
    }

    Ok(Subsystem {
        nqn,
        serial,
        model,
        allow_any_host,
        hosts,
        namespaces,
    })
}

fn namespace(
    cx: &Cx<'_>,
    nqn: &str,
    n: RawNamespace,
    nsids: &mut HashMap<u32, usize>,
    ids: &mut IdRegistry,
) -> Result<Namespace, ConfError> {
    let nsid_span = n.nsid.span();
    let nsid = cx.int(&n.nsid, "nsid", 1, MAX_NSID)?;
    // 1..=0xFFFFFFFE fits u32.
    let nsid = u32::try_from(nsid).unwrap_or_default();
    if let Some(first) = nsids.insert(nsid, cx.line(&nsid_span)) {
        return Err(cx.at(
            nsid_span,
            format!("nsid {nsid} is already used in subsystem {nqn:?} (line {first})"),
        ));
    }

    let block_size = match &n.block_size {
        None => 512,
        Some(v) => match *v.get_ref() {
            512 => 512,
            4096 => 4096,
            other => {
                return Err(cx.at(v.span(), format!("`block_size` must be 512 or 4096, got {other}")));
            }
        },
    };

    let backend = backend(cx, &n.backend, nqn, nsid, nsid_span.clone(), block_size, ids)?;
    if let (
        Backend::Nvme(NvmeBackend {
            device: NvmeDevice::Pci(bdf),
            ..
        }),
        Some(v),
    ) = (&backend, &n.block_size)
    {
        return Err(cx.at(
            v.span(),
            format!(
                "namespace {nsid}: `block_size` cannot be given for an NVMe device ({bdf}): the namespace's format on the device decides it"
            ),
        ));
    }

    let derived = derive_ids(nqn, nsid);
    let uuid = match &n.uuid {
        None => derived.uuid,
        Some(v) => {
            let u = parse_uuid(v.get_ref()).map_err(|e| cx.at(v.span(), format!("invalid `uuid`: {e}")))?;
            nonzero(cx, v, "uuid", u)?
        }
    };
    let nguid = match &n.nguid {
        None => derived.nguid,
        Some(v) => {
            let g = parse_hex::<16>(v.get_ref()).map_err(|e| cx.at(v.span(), format!("invalid `nguid`: {e}")))?;
            nonzero(cx, v, "nguid", g)?
        }
    };
    let eui64 = match &n.eui64 {
        None => derived.eui64,
        Some(v) => {
            let e = parse_hex::<8>(v.get_ref()).map_err(|e| cx.at(v.span(), format!("invalid `eui64`: {e}")))?;
            nonzero(cx, v, "eui64", e)?
        }
    };

    let span_of = |v: &Option<Spanned<String>>| v.as_ref().map_or(nsid_span.clone(), Spanned::span);
    unique(
        cx,
        &mut ids.uuids,
        uuid,
        "uuid",
        &format_uuid(&uuid),
        span_of(&n.uuid),
        nqn,
        nsid,
    )?;
    unique(
        cx,
        &mut ids.nguids,
        nguid,
        "nguid",
        &hex(&nguid),
        span_of(&n.nguid),
        nqn,
        nsid,
    )?;
    unique(
        cx,
        &mut ids.euis,
        eui64,
        "eui64",
        &hex(&eui64),
        span_of(&n.eui64),
        nqn,
        nsid,
    )?;

    Ok(Namespace {
        nsid,
        block_size,
        backend,
        uuid,
        nguid,
        eui64,
    })
}

/// All-zero identifiers mean "not reported" in Identify Namespace and the
/// Namespace Identification Descriptor list, so they cannot be configured.
fn nonzero<const N: usize>(cx: &Cx<'_>, v: &Spanned<String>, key: &str, id: [u8; N]) -> Result<[u8; N], ConfError> {
    if id == [0; N] {
        Err(cx.at(
            v.span(),
            format!("`{key}` must not be all zero: NVMe reads zero as \"no {key}\""),
        ))
    } else {
        Ok(id)
    }
}

#[allow(clippy::too_many_arguments)]
fn unique<K: std::hash::Hash + Eq>(
    cx: &Cx<'_>,
    seen: &mut HashMap<K, IdOwner>,
    id: K,
    key: &str,
    text: &str,
    span: Range<usize>,
    nqn: &str,
    nsid: u32,
) -> Result<(), ConfError> {
    match seen.entry(id) {
        Entry::Occupied(owner) => {
            let owner = owner.get();
            Err(cx.at(
                span,
                format!(
                    "{key} {text} of namespace {nsid} in {nqn:?} is already used by namespace {} in {:?}; namespace identifiers must be unique",
                    owner.nsid, owner.nqn
                ),
            ))
        }
        Entry::Vacant(v) => {
            v.insert(IdOwner {
                nqn: nqn.to_owned(),
                nsid,
            });
            Ok(())
        }
    }
}

fn backend(
    cx: &Cx<'_>,
    b: &RawBackend,
    nqn: &str,
    nsid: u32,
    nsid_span: Range<usize>,
    block_size: u32,
    ids: &mut IdRegistry,
) -> Result<Backend, ConfError> {
    match (&b.ram, &b.file, &b.sim, &b.nvme) {
        (Some(ram), None, None, None) => Ok(Backend::Ram {
            size: capacity(cx, &ram.size, "RAM", block_size)?,
        }),
        (None, Some(file), None, None) => {
            file_backend(cx, file, nqn, nsid, block_size, &mut ids.files).map(Backend::File)
        }
        (None, None, Some(sim), None) => sim_backend(cx, sim, nsid, nsid_span, block_size).map(Backend::Sim),
        (None, None, None, Some(nvme)) => {
            nvme_backend(cx, nvme, nqn, nsid, nsid_span, block_size, ids).map(Backend::Nvme)
        }
        _ => {
            // None or several. toml 0.8 cannot give the span of an (implicit)
            // table, so each kind is located by its required key.
            let mut kinds: Vec<(&str, Range<usize>)> = Vec::new();
            if let Some(r) = &b.ram {
                kinds.push(("ram", r.size.span()));
            }
            if let Some(f) = &b.file {
                kinds.push(("file", f.path.span()));
            }
            if let Some(s) = &b.sim {
                kinds.push(("sim", s.size.span()));
            }
            if let Some(span) = b.nvme.as_ref().and_then(|n| n.pci.as_ref().or(n.fake.as_ref())) {
                kinds.push(("nvme", span.span()));
            }
            kinds.sort_by_key(|(_, span)| span.start);
            Err(match kinds.as_slice() {
                [(first, _), (second, span), ..] => cx.at(
                    span.clone(),
                    format!("namespace {nsid} has two backends, `{first}` and `{second}`: give exactly one kind"),
                ),
                _ => cx.at(
                    nsid_span,
                    format!(
                        "namespace {nsid} has an empty `backend`: give exactly one kind, e.g. `backend = {{ ram = {{ size = \"1GiB\" }} }}`"
                    ),
                ),
            })
        }
    }
}

/// A backend capacity: > 0 and a multiple of the block size. `what` names
/// the backend kind in messages.
fn capacity(cx: &Cx<'_>, v: &Spanned<RawSize>, what: &str, block_size: u32) -> Result<u64, ConfError> {
    let size = cx.size(v, "size")?;
    if size == 0 {
        return Err(cx.at(v.span(), format!("{what} `size` must be greater than 0")));
    }
    if size % u64::from(block_size) != 0 {
        return Err(cx.at(
            v.span(),
            format!("{what} `size` {size} bytes is not a multiple of block_size {block_size}"),
        ));
    }
    Ok(size)
}

fn file_backend(
    cx: &Cx<'_>,
    f: &RawFile,
    nqn: &str,
    nsid: u32,
    block_size: u32,
    files: &mut HashMap<PathBuf, (IdOwner, usize)>,
) -> Result<FileBackend, ConfError> {
    let path = cx.path(&f.path, "path")?;
    let size = match &f.size {
        None => None,
        Some(v) => Some(capacity(cx, v, "file", block_size)?),
    };
    let direct = f.direct.as_ref().is_none_or(|d| *d.get_ref());
    match files.entry(path.clone()) {
        Entry::Occupied(owner) => {
            let (owner, line) = owner.get();
            return Err(cx.at(
                f.path.span(),
                format!(
                    "file {} is already the backend of namespace {} in {:?} (line {line}); a file can back only one namespace",
                    path.display(),
                    owner.nsid,
                    owner.nqn
                ),
            ));
        }
        Entry::Vacant(v) => {
            v.insert((
                IdOwner {
                    nqn: nqn.to_owned(),
                    nsid,
                },
                cx.line(&f.path.span()),
            ));
        }
    }
    Ok(FileBackend { path, size, direct })
}

/// A PCI address `[DDDD:]BB:DD.F` (hex; domain 0000 when omitted), normalised
/// to lower case `DDDD:BB:DD.F`, or why it is not one.
pub(crate) fn parse_bdf(s: &str) -> Result<String, String> {
    let parts: Vec<&str> = s.split(':').collect();
    let (domain, bus, rest) = match parts.as_slice() {
        [d, b, r] => (*d, *b, *r),
        [b, r] => ("0000", *b, *r),
        _ => return Err("expected DDDD:BB:DD.F, e.g. \"0000:00:04.0\"".into()),
    };
    let (dev, func) = rest.split_once('.').ok_or("no `.function` (e.g. `00:04.0`)")?;
    let hex = |t: &str, max_len: usize, max: u32, what: &str| -> Result<u32, String> {
        if t.is_empty() || t.len() > max_len {
            return Err(format!("bad {what} {t:?}"));
        }
        match u32::from_str_radix(t, 16) {
            Ok(v) if v <= max => Ok(v),
            _ => Err(format!("bad {what} {t:?}")),
        }
    };
    let d = hex(domain, 4, 0xFFFF, "domain")?;
    let b = hex(bus, 2, 0xFF, "bus")?;
    let v = hex(dev, 2, 0x1F, "device")?;
    let f = hex(func, 1, 7, "function")?;
    Ok(format!("{d:04x}:{b:02x}:{v:02x}.{f:x}"))
}

fn nvme_backend(
    cx: &Cx<'_>,
    n: &RawNvme,
    nqn: &str,
    nsid: u32,
    nsid_span: Range<usize>,
    block_size: u32,
    ids: &mut IdRegistry,
) -> Result<NvmeBackend, ConfError> {
    let dev_nsid = match &n.nsid {
        None => 1,
        // 1..=MAX_NSID fits u32.
        Some(v) => u32::try_from(cx.int(v, "nsid", 1, MAX_NSID)?).unwrap_or(1),
    };
    let (device, span) = match (&n.pci, &n.fake) {
        (Some(p), None) => {
            let bdf = parse_bdf(p.get_ref())
                .map_err(|e| cx.at(p.span(), format!("invalid `pci` address {:?}: {e}", p.get_ref())))?;
            for (key, given) in [("size", n.size.is_some()), ("latency_us", n.latency_us.is_some())] {
                if given {
                    return Err(cx.at(
                        p.span(),
                        format!("`{key}` is for a `fake` NVMe device; a PCI device's namespace has the size it has"),
                    ));
                }
            }
            (NvmeDevice::Pci(bdf), p.span())
        }
        (None, Some(f)) => {
            let name = f.get_ref().trim().to_string();
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
                return Err(cx.at(
                    f.span(),
                    format!(
                        "invalid fake device name {:?}: use letters, digits, `-` and `_`",
                        f.get_ref()
                    ),
                ));
            }
            let Some(size) = &n.size else {
                return Err(cx.at(
                    f.span(),
                    format!("fake NVMe device {name:?}: give the namespace's `size`, e.g. size = \"64MiB\""),
                ));
            };
            let size = capacity(cx, size, "fake NVMe", block_size)?;
            let latency_us = cx.float_or(&n.latency_us, "latency_us", 0.0, non_negative)?;
            (NvmeDevice::Fake { name, size, latency_us }, f.span())
        }
        (Some(_), Some(f)) => {
            return Err(cx.at(
                f.span(),
                "an `nvme` backend names either `pci` or `fake`, not both".into(),
            ));
        }
        (None, None) => {
            return Err(cx.at(
                nsid_span,
                format!(
                    "namespace {nsid}: the `nvme` backend needs `pci` (e.g. `nvme = {{ pci = \"0000:00:04.0\", nsid = 1 }}`) or `fake`"
                ),
            ));
        }
    };
    let line = cx.line(&span);
    let is_pci = matches!(device, NvmeDevice::Pci(_));
    let name = device.name().to_string();
    match ids.nvme_kinds.entry(name.clone()) {
        Entry::Occupied(e) if e.get().0 != is_pci => {
            return Err(cx.at(
                span,
                format!(
                    "{name:?} names a {} device here but a {} one on line {}",
                    if is_pci { "PCI" } else { "fake" },
                    if is_pci { "fake" } else { "PCI" },
                    e.get().1
                ),
            ));
        }
        Entry::Occupied(e) if !is_pci => {
            return Err(cx.at(
                span,
                format!(
                    "fake NVMe device {name:?} already backs a namespace (line {}); a fake device has one namespace: name another one",
                    e.get().1
                ),
            ));
        }
        Entry::Occupied(_) => {}
        Entry::Vacant(v) => {
            v.insert((is_pci, line));
        }
    }
    match ids.nvme.entry((name.clone(), dev_nsid)) {
        Entry::Occupied(owner) => {
            let (owner, line) = owner.get();
            return Err(cx.at(
                span,
                format!(
                    "namespace {dev_nsid} of NVMe device {name} is already the backend of namespace {} in {:?} (line {line}); a device namespace can back only one namespace",
                    owner.nsid, owner.nqn
                ),
            ));
        }
        Entry::Vacant(v) => {
            v.insert((
                IdOwner {
                    nqn: nqn.to_owned(),
                    nsid,
                },
                line,
            ));
        }
    }
    Ok(NvmeBackend { device, nsid: dev_nsid })
}

fn sim_backend(
    cx: &Cx<'_>,
    s: &RawSim,
    nsid: u32,
    nsid_span: Range<usize>,
    block_size: u32,
) -> Result<SimBackend, ConfError> {
    let size = capacity(cx, &s.size, "sim", block_size)?;
    let read = latency(cx, &s.read, "read", DEFAULT_SIM_READ, nsid, nsid_span.clone())?;
    let write = latency(cx, &s.write, "write", DEFAULT_SIM_WRITE, nsid, nsid_span)?;
    let per_kib_us = cx.float_or(&s.per_kib_us, "per_kib_us", 0.0, non_negative)?;
    let parallelism = cx.u32_or(&s.parallelism, "parallelism", 1, 65536, 128)?;
    let bandwidth = match &s.bandwidth {
        None => None,
        Some(v) => match cx.size(v, "bandwidth")? {
            0 => {
                return Err(cx.at(
                    v.span(),
                    "`bandwidth` must be greater than 0 bytes per second; leave it out for unlimited".into(),
                ));
            }
            n => Some(n),
        },
    };
    let interrupt_delay_us = cx.float_or(&s.interrupt_delay_us, "interrupt_delay_us", 0.0, non_negative)?;
    let coalesce_count = cx.u32_or(&s.coalesce_count, "coalesce_count", 1, i64::from(u32::MAX), 1)?;
    let coalesce_us = cx.float_or(&s.coalesce_us, "coalesce_us", 0.0, non_negative)?;
    let seed = match &s.seed {
        None => 1,
        // 0..=i64::MAX fits u64.
        Some(v) => cx.int(v, "seed", 0, i64::MAX)?.unsigned_abs(),
    };
    Ok(SimBackend {
        size,
        read,
        write,
        per_kib_us,
        parallelism,
        bandwidth,
        interrupt_delay_us,
        coalesce_count,
        coalesce_us,
        seed,
    })
}

/// The latency distributions, by the keys that select them.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Dist {
    Fixed,
    Uniform,
    LogNormal,
    Bimodal,
}

impl Dist {
    fn name(self) -> &'static str {
        match self {
            Dist::Fixed => "fixed",
            Dist::Uniform => "uniform",
            Dist::LogNormal => "lognormal",
            Dist::Bimodal => "bimodal",
        }
    }
}

/// How to write each distribution, for messages.
const DISTRIBUTIONS: &str = "`{ fixed_us = X }`, `{ min_us = A, max_us = B }`, `{ median_us = M, sigma = S }` or `{ fast_us = F, slow_us = L, slow_fraction = P }`";

/// The `read` or `write` latency of a sim backend (`key` names it), or
/// `default` when absent.
fn latency(
    cx: &Cx<'_>,
    l: &Option<RawLatency>,
    key: &str,
    default: Latency,
    nsid: u32,
    nsid_span: Range<usize>,
) -> Result<Latency, ConfError> {
    let Some(l) = l else { return Ok(default) };
    let all: [(&str, &Option<Spanned<f64>>, Dist); 8] = [
        ("fixed_us", &l.fixed_us, Dist::Fixed),
        ("min_us", &l.min_us, Dist::Uniform),
        ("max_us", &l.max_us, Dist::Uniform),
        ("median_us", &l.median_us, Dist::LogNormal),
        ("sigma", &l.sigma, Dist::LogNormal),
        ("fast_us", &l.fast_us, Dist::Bimodal),
        ("slow_us", &l.slow_us, Dist::Bimodal),
        ("slow_fraction", &l.slow_fraction, Dist::Bimodal),
    ];
    let mut given: Vec<(&str, Range<usize>, Dist)> = all
        .iter()
        .filter_map(|(name, v, dist)| v.as_ref().map(|v| (*name, v.span(), *dist)))
        .collect();
    given.sort_by_key(|(_, span, _)| span.start);
    let Some((first, first_span, dist)) = given.first().cloned() else {
        // An empty table has no span of its own (see raw.rs).
        return Err(cx.at(
            nsid_span,
            format!("namespace {nsid} has an empty `{key}` latency: give one of {DISTRIBUTIONS}"),
        ));
    };
    if let Some((other, span, other_dist)) = given.iter().find(|(_, _, d)| *d != dist) {
        return Err(cx.at(
            span.clone(),
            format!(
                "`{key}` mixes two latency distributions: `{other}` is {} but `{first}` is {}; give exactly one of {DISTRIBUTIONS}",
                other_dist.name(),
                dist.name()
            ),
        ));
    }
    // Every key of `dist`, or an error at the first key given.
    let need = |v: &Option<Spanned<f64>>, name: &str| -> Result<Spanned<f64>, ConfError> {
        v.clone().ok_or_else(|| {
            cx.at(
                first_span.clone(),
                format!(
                    "`{first}` makes `{key}` a {} latency, which also needs `{name}`",
                    dist.name()
                ),
            )
        })
    };
    let k = |name: &str| format!("{key}.{name}");
    Ok(match dist {
        Dist::Fixed => {
            let us = cx.float(&need(&l.fixed_us, "fixed_us")?, &k("fixed_us"), non_negative)?;
            Latency::Fixed { us }
        }
        Dist::Uniform => {
            let (min, max) = (need(&l.min_us, "min_us")?, need(&l.max_us, "max_us")?);
            let min_us = cx.float(&min, &k("min_us"), non_negative)?;
            let max_us = cx.float(&max, &k("max_us"), non_negative)?;
            if min_us > max_us {
                return Err(cx.at(
                    min.span(),
                    format!("`{key}.min_us` ({min_us}) is greater than `{key}.max_us` ({max_us})"),
                ));
            }
            Latency::Uniform { min_us, max_us }
        }
        Dist::LogNormal => {
            let (median, sigma) = (need(&l.median_us, "median_us")?, need(&l.sigma, "sigma")?);
            let median_us = cx.float(&median, &k("median_us"), positive)?;
            let sigma = cx.float(&sigma, &k("sigma"), |x| {
                (!(0.0..=MAX_SIGMA).contains(&x)).then_some("must be between 0 and 3")
            })?;
            Latency::LogNormal { median_us, sigma }
        }
        Dist::Bimodal => {
            let fast = need(&l.fast_us, "fast_us")?;
            let slow = need(&l.slow_us, "slow_us")?;
            let fraction = need(&l.slow_fraction, "slow_fraction")?;
            let fast_us = cx.float(&fast, &k("fast_us"), non_negative)?;
            let slow_us = cx.float(&slow, &k("slow_us"), non_negative)?;
            let slow_fraction = cx.float(&fraction, &k("slow_fraction"), |x| {
                (!(0.0..=1.0).contains(&x)).then_some("must be between 0 and 1")
            })?;
            if fast_us > slow_us {
                return Err(cx.at(
                    fast.span(),
                    format!("`{key}.fast_us` ({fast_us}) is greater than `{key}.slow_us` ({slow_us})"),
                ));
            }
            Latency::Bimodal {
                fast_us,
                slow_us,
                slow_fraction,
            }
        }
    })
}
