//! The identifiers, files and NVMe device namespaces in use across the
//! configuration, and the checks that namespace identifiers are nonzero and
//! unique.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::ops::Range;
use std::path::PathBuf;

use toml::Spanned;

use super::cx::Cx;
use crate::error::ConfError;

/// A namespace identifier already in use, for the uniqueness check.
pub(super) struct IdOwner {
    pub(super) nqn: String,
    pub(super) nsid: u32,
}

/// Namespace identifiers seen so far, across all subsystems: NVMe requires
/// NGUID, EUI64 and UUID to be unique (NVMe 2.0 §4.7). Also the files
/// backing namespaces, which must not be shared either.
#[derive(Default)]
pub(super) struct IdRegistry {
    pub(super) uuids: HashMap<[u8; 16], IdOwner>,
    pub(super) nguids: HashMap<[u8; 16], IdOwner>,
    pub(super) euis: HashMap<[u8; 8], IdOwner>,
    /// Resolved file backend paths, with the line of their `path`.
    pub(super) files: HashMap<PathBuf, (IdOwner, usize)>,
    /// NVMe (device name, nsid) pairs in use, with the line naming them.
    pub(super) nvme: HashMap<(String, u32), (IdOwner, usize)>,
    /// Whether each NVMe device name is a PCI function (true) or a fake one.
    pub(super) nvme_kinds: HashMap<String, (bool, usize)>,
    /// RBD images in use, with the line naming them.
    pub(super) rbd: HashMap<super::backend::ImageKey, (IdOwner, usize)>,
}

/// A backend (a file, a device namespace, an image) already claimed by another namespace.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{what} is already the backend of namespace {nsid} in {nqn:?} (line {line}); {kind} can back only one namespace"
)]
pub(super) struct BackendTaken {
    /// The backend, e.g. `file /srv/a.img`.
    what: String,
    /// The namespace that has it.
    nsid: u32,
    /// Its subsystem.
    nqn: String,
    /// The conf line naming it there.
    line: usize,
    /// What kind of backend, e.g. `a file`.
    kind: &'static str,
}

/// Claim `key` (a file, a device namespace, an image) for namespace `nsid` of `nqn`, named
/// on conf line `line`. Err: `what` is already the backend of another namespace: the
/// message says which, and that `what` can back only one.
pub(super) fn claim_backend<K: std::hash::Hash + Eq>(
    seen: &mut HashMap<K, (IdOwner, usize)>,
    key: K,
    nqn: &str,
    nsid: u32,
    line: usize,
    what: &str,
    kind: &'static str,
) -> Result<(), BackendTaken> {
    match seen.entry(key) {
        Entry::Occupied(o) => {
            let (owner, line) = o.get();
            Err(BackendTaken {
                what: what.to_owned(),
                nsid: owner.nsid,
                nqn: owner.nqn.clone(),
                line: *line,
                kind,
            })
        }
        Entry::Vacant(v) => {
            v.insert((
                IdOwner {
                    nqn: nqn.to_owned(),
                    nsid,
                },
                line,
            ));
            Ok(())
        }
    }
}

/// All-zero identifiers mean "not reported" in Identify Namespace and the
/// Namespace Identification Descriptor list, so they cannot be configured.
pub(super) fn nonzero<const N: usize>(
    cx: &Cx<'_>,
    v: &Spanned<String>,
    key: &str,
    id: [u8; N],
) -> Result<[u8; N], ConfError> {
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
pub(super) fn unique<K: std::hash::Hash + Eq>(
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
