//! The `nvme` backend: a PCI function (and PCI address parsing) or a fake
//! controller, and which device namespaces are in use.

use std::collections::hash_map::Entry;
use std::ops::Range;

use super::capacity;
use crate::error::ConfError;
use crate::raw::RawNvme;
use crate::validate::MAX_NSID;
use crate::validate::cx::{Cx, non_negative};
use crate::validate::registry::{IdRegistry, claim_backend};
use crate::{NvmeBackend, NvmeDevice};

/// A PCI address `[DDDD:]BB:DD.F` (hex; domain 0000 when omitted), normalised
/// to lower case `DDDD:BB:DD.F`, or why it is not one.
pub fn parse_bdf(s: &str) -> Result<String, BdfError> {
    let parts: Vec<&str> = s.split(':').collect();
    let (domain, bus, rest) = match parts.as_slice() {
        [d, b, r] => (*d, *b, *r),
        [b, r] => ("0000", *b, *r),
        _ => return Err(BdfError::Form),
    };
    let (dev, func) = rest.split_once('.').ok_or(BdfError::NoFunction)?;
    let hex = |t: &str, max_len: usize, max: u32, what: &'static str| -> Result<u32, BdfError> {
        let bad = || BdfError::Field {
            what,
            text: t.to_owned(),
        };
        if t.is_empty() || t.len() > max_len {
            return Err(bad());
        }
        match u32::from_str_radix(t, 16) {
            Ok(v) if v <= max => Ok(v),
            _ => Err(bad()),
        }
    };
    let d = hex(domain, 4, 0xFFFF, "domain")?;
    let b = hex(bus, 2, 0xFF, "bus")?;
    let v = hex(dev, 2, 0x1F, "device")?;
    let f = hex(func, 1, 7, "function")?;
    Ok(format!("{d:04x}:{b:02x}:{v:02x}.{f:x}"))
}

/// Why text is not a PCI address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BdfError {
    /// Not two or three `:`-separated parts.
    #[error("expected DDDD:BB:DD.F, e.g. \"0000:00:04.0\"")]
    Form,
    /// No `.` before the function.
    #[error("no `.function` (e.g. `00:04.0`)")]
    NoFunction,
    /// A part that is not hex or out of its range.
    #[error("bad {what} {text:?}")]
    Field {
        /// `domain`, `bus`, `device` or `function`.
        what: &'static str,
        /// The part given.
        text: String,
    },
}

pub(super) fn nvme_backend(
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
    claim_backend(
        &mut ids.nvme,
        (name.clone(), dev_nsid),
        nqn,
        nsid,
        line,
        &format!("namespace {dev_nsid} of NVMe device {name}"),
        "a device namespace",
    )
    .map_err(|m| cx.at(span, m.to_string()))?;
    Ok(NvmeBackend { device, nsid: dev_nsid })
}
