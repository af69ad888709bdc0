//! The `[[subsystem]]` entries and their `[[subsystem.namespace]]`s:
//! NQNs, Identify strings, allowed hosts, nsids and namespace identifiers.

use std::collections::HashMap;
use std::collections::hash_map::Entry;

use toml::Spanned;

use super::MAX_NSID;
use super::backend::backend;
use super::cx::Cx;
use super::registry::{IdRegistry, nonzero, unique};
use crate::ANAGRPMAX;
use crate::error::ConfError;
use crate::ids::{derive_ids, derive_serial};
use crate::nqn::{DISCOVERY_NQN, format_uuid, hex, parse_hex, parse_uuid, validate_nqn};
use crate::raw::{RawNamespace, RawSubsystem};
use crate::{Backend, Namespace, NvmeBackend, NvmeDevice, Subsystem};

/// Identify Controller SN and MN widths (NVMe Base, Identify Controller data
/// structure): ASCII, space padded.
const SERIAL_MAX: usize = 20;
const MODEL_MAX: usize = 40;

/// The model number used when a subsystem gives none.
const DEFAULT_MODEL: &str = "pollux";

pub(super) fn subsystems(cx: &Cx<'_>, raw: Vec<RawSubsystem>) -> Result<Vec<Subsystem>, ConfError> {
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

    let super::hosts::Hosts {
        nqns: hosts,
        keys: host_keys,
        tls: tls_keys,
    } = match &s.hosts {
        Some(list) => super::hosts::hosts(cx, list.get_ref())?,
        None => Default::default(),
    };
    let dhchap = super::hosts::dhchap(cx, &s.dhchap_hashes, &s.dhchap_dh_groups)?;
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
        host_keys,
        tls_keys,
        dhchap,
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

    Ok(Namespace {
        nsid,
        block_size,
        backend,
        uuid,
        nguid,
        eui64,
        ana_group,
    })
}
