//! The `[[subsystem]]` entries and their `[[subsystem.namespace]]`s:
//! NQNs, Identify strings, allowed hosts, nsids and namespace identifiers.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::net::SocketAddr;

use toml::Spanned;

use super::MAX_NSID;
use super::backend::backend;
use super::cx::Cx;
use super::listeners::{once, socket_addr};
use super::registry::{IdRegistry, nonzero, unique};
use crate::ANAGRPMAX;
use crate::error::ConfError;
use crate::ids::{derive_ids, derive_serial};
use crate::nqn::{DISCOVERY_NQN, format_uuid, hex, parse_hex, parse_uuid, validate_nqn};
use crate::raw::{RawNamespace, RawQos, RawSubsystem};
use crate::{
    Backend, GivenIds, Listener, MAX_CNTLID, MIN_CNTLID, Namespace, NvmeBackend, NvmeDevice, Polling, Qos, Subsystem,
};

/// Identify Controller SN and MN widths (NVMe Base, Identify Controller data
/// structure): ASCII, space padded.
const SERIAL_MAX: usize = 20;
const MODEL_MAX: usize = 40;

/// The model number used when a subsystem gives none.
const DEFAULT_MODEL: &str = "pollux";

/// `reactors`: how many reactors the conf runs (each hands out controller IDs of its own).
/// `listeners`: the conf's listeners, which a subsystem's `listeners` names.
pub(super) fn subsystems(
    cx: &Cx<'_>,
    raw: Vec<RawSubsystem>,
    reactors: usize,
    listeners: &[Listener],
) -> Result<Vec<Subsystem>, ConfError> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut ids = IdRegistry::default();
    let mut out: Vec<Subsystem> = Vec::with_capacity(raw.len());
    // The line of each subsystem's explicit controller ID range, by index in `out`.
    let mut range_lines: HashMap<usize, usize> = HashMap::new();
    for s in raw {
        let range_span = s.min_cntlid.as_ref().or(s.max_cntlid.as_ref()).map(Spanned::span);
        let sub = subsystem(cx, s, &mut seen, &mut ids, reactors, listeners)?;
        if let (false, Some(span)) = (sub.default_cntlid_range(), range_span) {
            // Controller IDs are unique across the target whatever the ranges; disjoint
            // explicit ranges are what an operator splitting the ID space means, so an
            // overlap is a mistake worth stopping at. A subsystem keeping the default range
            // shares the whole space, and subsystems given the same range share it (a
            // gateway group's subsystems all take the gateway's slot, `crate::group`).
            let clash = out.iter().enumerate().find(|(_, o)| {
                !o.default_cntlid_range()
                    && (o.min_cntlid, o.max_cntlid) != (sub.min_cntlid, sub.max_cntlid)
                    && o.min_cntlid <= sub.max_cntlid
                    && sub.min_cntlid <= o.max_cntlid
            });
            if let Some((i, o)) = clash {
                let line = range_lines.get(&i).copied().unwrap_or_default();
                return Err(cx.at(
                    span,
                    format!(
                        "the controller ID range {}..={} of subsystem {:?} overlaps the range {}..={} of subsystem {:?} (line {line}): give the subsystems of one conf disjoint `min_cntlid`..`max_cntlid` ranges, or leave the keys out to share the whole ID space",
                        sub.min_cntlid, sub.max_cntlid, sub.nqn, o.min_cntlid, o.max_cntlid, o.nqn
                    ),
                ));
            }
            range_lines.insert(out.len(), cx.line(&span));
        }
        out.push(sub);
    }
    Ok(out)
}

/// A subsystem's controller ID range, `min_cntlid..=max_cntlid` (SPDK's min/max_cntlid,
/// nvmet's attr_cntlid_min/max): within [`MIN_CNTLID`]..=[`MAX_CNTLID`], not empty, and
/// holding at least one ID per reactor, since reactor `r` of `n` hands out only the IDs with
/// `(id - 1) % n == r` (an I/O queue's Connect finds its controller's reactor from the ID).
fn cntlid_range(
    cx: &Cx<'_>,
    min_cntlid: &Option<Spanned<i64>>,
    max_cntlid: &Option<Spanned<i64>>,
    nqn: &str,
    reactors: usize,
) -> Result<(u16, u16), ConfError> {
    let (lo, hi) = (i64::from(MIN_CNTLID), i64::from(MAX_CNTLID));
    let get = |v: &Option<Spanned<i64>>, key: &str, default: u16| -> Result<u16, ConfError> {
        match v {
            None => Ok(default),
            // Within MIN_CNTLID..=MAX_CNTLID once checked, so it fits u16.
            Some(v) => Ok(u16::try_from(cx.int(v, key, lo, hi)?).unwrap_or(default)),
        }
    };
    let min = get(min_cntlid, "min_cntlid", MIN_CNTLID)?;
    let max = get(max_cntlid, "max_cntlid", MAX_CNTLID)?;
    // Report at `max_cntlid` when given (the end that is too low), else at `min_cntlid`.
    let span = max_cntlid.as_ref().or(min_cntlid.as_ref()).map(Spanned::span);
    let fail = |message: String| match &span {
        Some(span) => cx.at(span.clone(), message),
        None => cx.nowhere(message),
    };
    if min > max {
        return Err(fail(format!(
            "subsystem {nqn:?}: `min_cntlid` {min} is above `max_cntlid` {max}"
        )));
    }
    let ids = usize::from(max - min) + 1;
    if ids < reactors {
        return Err(fail(format!(
            "the controller ID range {min}..={max} of subsystem {nqn:?} holds {ids} ID(s) but the conf runs {reactors} reactors; each reactor hands out IDs of its own ((ID - 1) % reactors = its index), so the range needs at least {reactors}"
        )));
    }
    Ok((min, max))
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
    reactors: usize,
    listeners: &[Listener],
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
    // Not checked against the hosts' keys: a host with keys may be added at run time, and
    // a host without them never reaches the Negotiate that asks for concatenation.
    let secure_concat = s.secure_concat.as_ref().is_some_and(|a| *a.get_ref());

    let dhchap = super::hosts::dhchap(cx, &s.dhchap_hashes, &s.dhchap_dh_groups)?;
    let super::hosts::Hosts {
        nqns: hosts,
        keys: host_keys,
        tls: tls_keys,
    } = match &s.hosts {
        Some(list) => super::hosts::hosts(cx, list.get_ref(), &dhchap)?,
        None => Default::default(),
    };
    let (min_cntlid, max_cntlid) = cntlid_range(cx, &s.min_cntlid, &s.max_cntlid, &nqn, reactors)?;
    // An explicit `hosts = []` admits no host yet, deliberately: SPDK's subsystem between
    // nvmf_create_subsystem and nvmf_subsystem_add_host, or after its last host was removed.
    // Neither key given is a mistake.
    if !allow_any_host && hosts.is_empty() && s.hosts.is_none() {
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
    if allow_any_host
        && hosts
            .iter()
            .any(|h| !host_keys.contains_key(h) && !tls_keys.contains_key(h))
    {
        tracing::warn!(
            origin = cx.origin,
            subsystem = %nqn,
            "hosts without keys in `hosts` change nothing because `allow_any_host = true` (hosts with keys must still authenticate)"
        );
    }

    let polling = polling(cx, &s.polling)?;
    let served_on = served_on(cx, &s.listeners, &nqn, listeners)?;
    let mut namespaces: Vec<Namespace> = Vec::new();
    let mut nsids: HashMap<u32, usize> = HashMap::new();
    // A namespace's `hosts` name hosts the subsystem admits (any, with `allow_any_host`).
    let admitted = (!allow_any_host).then_some(hosts.as_slice());
    for n in s.namespace.unwrap_or_default() {
        let ns = namespace(cx, &nqn, n, &mut nsids, ids, admitted)?;
        namespaces.push(ns);
    }

    Ok(Subsystem {
        nqn,
        serial,
        model,
        allow_any_host,
        hosts,
        host_keys,
        tls_keys,
        dhchap,
        secure_concat,
        namespaces,
        min_cntlid,
        max_cntlid,
        polling,
        listeners: served_on,
    })
}

/// A subsystem's `listeners`: the listeners that serve it, each named by its configured
/// `address` (None: not given, every listener; empty: none yet).
fn served_on(
    cx: &Cx<'_>,
    v: &Option<Spanned<Vec<Spanned<String>>>>,
    nqn: &str,
    listeners: &[Listener],
) -> Result<Option<Vec<SocketAddr>>, ConfError> {
    // Empty: served on no listener yet, as an SPDK subsystem between nvmf_create_subsystem
    // and nvmf_subsystem_add_listener, or an nvmet subsystem linked to no port.
    let Some(list) = v else { return Ok(None) };
    let mut seen = HashMap::new();
    let mut out = Vec::with_capacity(list.get_ref().len());
    for a in list.get_ref() {
        let address = socket_addr(cx, a, "listener")?;
        if !listeners.iter().any(|l| l.address == address) {
            let known: Vec<String> = listeners.iter().map(|l| format!("\"{}\"", l.address)).collect();
            return Err(cx.at(
                a.span(),
                format!(
                    "subsystem {nqn:?}: `listeners` names {address}, which is not a [[listener]] address of this conf (they are {})",
                    known.join(", ")
                ),
            ));
        }
        once(cx, &mut seen, address, a, "listener")?;
        out.push(address);
    }
    Ok(Some(out))
}

/// A `polling` value, subsystem or namespace (None: not given).
fn polling(cx: &Cx<'_>, v: &Option<Spanned<String>>) -> Result<Option<Polling>, ConfError> {
    v.as_ref()
        .map(|p| {
            p.get_ref()
                .parse::<Polling>()
                .map_err(|e| cx.at(p.span(), format!("`polling`: {e}")))
        })
        .transpose()
}

/// A namespace's `hosts` (host masking): each a valid NQN, listed once, and one of
/// `admitted` (the subsystem's `hosts`; None: it admits any host). None: not given.
fn namespace_hosts(
    cx: &Cx<'_>,
    v: &Option<Spanned<Vec<Spanned<String>>>>,
    nqn: &str,
    nsid: u32,
    admitted: Option<&[String]>,
) -> Result<Option<Vec<String>>, ConfError> {
    let Some(list) = v else { return Ok(None) };
    let mut out: Vec<String> = Vec::with_capacity(list.get_ref().len());
    for h in list.get_ref() {
        let host = h.get_ref();
        validate_nqn(host)
            .map_err(|e| cx.at(h.span(), format!("invalid host NQN in namespace {nsid}'s `hosts`: {e}")))?;
        if out.contains(host) {
            return Err(cx.at(
                h.span(),
                format!("host {host:?} is listed twice in namespace {nsid}'s `hosts`"),
            ));
        }
        if admitted.is_some_and(|a| !a.contains(host)) {
            return Err(cx.at(
                h.span(),
                format!(
                    "namespace {nsid}'s `hosts` names {host:?}, which subsystem {nqn:?} does not admit: add it to the subsystem's `hosts` (or set `allow_any_host = true`)"
                ),
            ));
        }
        out.push(host.clone());
    }
    Ok(Some(out))
}

fn namespace(
    cx: &Cx<'_>,
    nqn: &str,
    n: RawNamespace,
    nsids: &mut HashMap<u32, usize>,
    ids: &mut IdRegistry,
    admitted: Option<&[String]>,
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
    let ana_group = match &n.ana_group {
        None => 1,
        Some(v) => u32::try_from(*v.get_ref())
            .ok()
            .filter(|g| (1..=ANAGRPMAX).contains(g))
            .ok_or_else(|| {
                cx.at(
                    v.span(),
                    format!(
                        "`ana_group` must be an ANA group id, 1 to {ANAGRPMAX}, got {}",
                        v.get_ref()
                    ),
                )
            })?,
    };

    let polling = polling(cx, &n.polling)?;
    let hosts = namespace_hosts(cx, &n.hosts, nqn, nsid, admitted)?;
    let qos = match &n.qos {
        Some(q) => qos(cx, q)?,
        None => Qos::default(),
    };

    Ok(Namespace {
        nsid,
        block_size,
        backend,
        uuid,
        nguid,
        eui64,
        given_ids: GivenIds {
            uuid: n.uuid.is_some(),
            nguid: n.nguid.is_some(),
            eui64: n.eui64.is_some(),
        },
        ana_group,
        polling,
        hosts,
        qos,
    })
}

/// A namespace's `qos`: each limit given a positive integer, at most [`Qos::MAX`] (an empty
/// table sets none, as no key). A zero is refused rather than read as "no limit": a namespace
/// that serves nothing is never what an operator means, and leaving the key out says "none".
fn qos(cx: &Cx<'_>, q: &RawQos) -> Result<Qos, ConfError> {
    let max = i64::try_from(Qos::MAX).unwrap_or(i64::MAX);
    let one = |v: &Option<Spanned<i64>>, key: &str, unit: &str| -> Result<Option<u64>, ConfError> {
        let Some(v) = v else { return Ok(None) };
        let n = *v.get_ref();
        if !(1..=max).contains(&n) {
            return Err(cx.at(
                v.span(),
                format!(
                    "`qos.{key}` must be a positive number of {unit}, 1 to {max}, got {n} (leave the key out for no limit)"
                ),
            ));
        }
        Ok(u64::try_from(n).ok())
    };
    Ok(Qos {
        iops: one(&q.iops, "iops", "commands per second")?,
        mbps: one(&q.mbps, "mbps", "MiB/s")?,
        read_mbps: one(&q.read_mbps, "read_mbps", "MiB/s")?,
        write_mbps: one(&q.write_mbps, "write_mbps", "MiB/s")?,
    })
}
