//! Turns the raw, spanned deserialization into the public [`Config`],
//! checking every semantic rule and reporting the position of the offending
//! value.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::net::SocketAddr;
use std::ops::Range;

use toml::Spanned;

use crate::error::{ConfError, line_col};
use crate::ids::{derive_ids, derive_serial};
use crate::nqn::{DISCOVERY_NQN, format_uuid, hex, parse_hex, parse_uuid, validate_nqn};
use crate::raw::{
    RawBackend, RawConfig, RawKeepAlive, RawListener, RawNamespace, RawReactors, RawSize, RawSubsystem, RawTransport,
};
use crate::size::parse_size;
use crate::{Backend, Config, KeepAlive, Listener, Namespace, Placement, ReactorMode, Reactors, Subsystem, Transport};

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

/// Parsing context: the text (to turn spans into lines) and its origin.
struct Cx<'a> {
    text: &'a str,
    origin: &'a str,
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
}

/// Parses and validates `text`.
pub(crate) fn build(text: &str, origin: &str) -> Result<Config, ConfError> {
    let cx = Cx { text, origin };
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
    Ok(Reactors {
        cores,
        mode,
        stall_threshold_us,
        placement,
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

/// A namespace identifier already in use, for the uniqueness check.
struct IdOwner {
    nqn: String,
    nsid: u32,
}

/// Namespace identifiers seen so far, across all subsystems: NVMe requires
/// NGUID, EUI64 and UUID to be unique (NVMe Base §4.7).
#[derive(Default)]
struct IdRegistry {
    uuids: HashMap<[u8; 16], IdOwner>,
    nguids: HashMap<[u8; 16], IdOwner>,
    euis: HashMap<[u8; 8], IdOwner>,
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

    let backend = backend(cx, &n.backend, nsid, nsid_span.clone(), block_size)?;

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
    nsid: u32,
    nsid_span: Range<usize>,
    block_size: u32,
) -> Result<Backend, ConfError> {
    let Some(ram) = &b.ram else {
        // toml 0.8 cannot give the span of an (implicit) table, so point at
        // the namespace's nsid.
        return Err(cx.at(
            nsid_span,
            format!(
                "namespace {nsid} has an empty `backend`: give exactly one kind, e.g. `backend = {{ ram = {{ size = \"1GiB\" }} }}`"
            ),
        ));
    };
    let size = cx.size(&ram.size, "size")?;
    if size == 0 {
        return Err(cx.at(ram.size.span(), "RAM `size` must be greater than 0".into()));
    }
    if size % u64::from(block_size) != 0 {
        return Err(cx.at(
            ram.size.span(),
            format!("RAM `size` {size} bytes is not a multiple of block_size {block_size}"),
        ));
    }
    Ok(Backend::Ram { size })
}
