//! A namespace's `backend`: exactly one kind, and the capacity check
//! shared by the kinds.

use std::ops::Range;

use toml::Spanned;

use super::cx::Cx;
use super::registry::IdRegistry;
use crate::Backend;
use crate::error::ConfError;
use crate::raw::{RawBackend, RawSize};

mod file;
pub(crate) mod nvme;
pub(crate) mod rbd;
mod sim;

use file::file_backend;
use nvme::nvme_backend;
pub(super) use rbd::ImageKey;
use rbd::rbd_backend;
use sim::sim_backend;

pub(super) fn backend(
    cx: &Cx<'_>,
    b: &RawBackend,
    nqn: &str,
    nsid: u32,
    nsid_span: Range<usize>,
    block_size: u32,
    ids: &mut IdRegistry,
) -> Result<Backend, ConfError> {
    match (&b.ram, &b.file, &b.sim, &b.nvme, &b.rbd, &b.null) {
        (Some(ram), None, None, None, None, None) => Ok(Backend::Ram {
            size: capacity(cx, &ram.size, "RAM", block_size)?,
        }),
        (None, Some(file), None, None, None, None) => {
            file_backend(cx, file, nqn, nsid, block_size, &mut ids.files).map(Backend::File)
        }
        (None, None, Some(sim), None, None, None) => {
            sim_backend(cx, sim, nsid, nsid_span, block_size).map(Backend::Sim)
        }
        (None, None, None, Some(nvme), None, None) => {
            nvme_backend(cx, nvme, nqn, nsid, nsid_span, block_size, ids).map(Backend::Nvme)
        }
        (None, None, None, None, Some(rbd), None) => rbd_backend(cx, rbd, nqn, nsid, &mut ids.rbd).map(Backend::Rbd),
        (None, None, None, None, None, Some(null)) => Ok(Backend::Null {
            size: capacity(cx, &null.size, "null", block_size)?,
        }),
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
            if let Some(r) = &b.rbd {
                kinds.push(("rbd", r.pool.span()));
            }
            if let Some(n) = &b.null {
                kinds.push(("null", n.size.span()));
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
