//! Namespaces whose store changes size or vanishes: `pollux ctl resize-namespace`, and stores resized by
//! someone else (an RBD image resized by `rbd resize` or another gateway, which librbd's
//! header watch reports). Reading a store's size may block on it, so it happens here, on a
//! watcher thread of its own or the control thread, never on a reactor; the new size then
//! reaches the hosts as a Namespace Attribute Changed event (NVMe 2.0 §5.27.1.3) through
//! [`crate::mutate::namespace_resized`].

use std::sync::Arc;
use std::time::Duration;

use pollux_reactor::Remote;

use crate::backend::{SIZE_BELL, StoreError};
use crate::bell::BellThread;
use crate::error::TargetError;
use crate::shared::Shared;

/// How often, besides each ring, the watcher looks: a store whose I/O failed as a deleted
/// one's would is checked (by the store, at most this often), so that its hosts get
/// retryable statuses for a few seconds at most, then Invalid Namespace, never a hang.
const VANISH_CHECK: Duration = Duration::from_secs(1);

/// A target's resize watcher thread: it looks at the namespaces of `shared` for size
/// changes each time a store rings ([`SIZE_BELL`]), telling the reactors of `remotes`.
pub fn watcher(shared: Arc<Shared>, remotes: Arc<[Remote]>) -> Result<BellThread, TargetError> {
    let thread = BellThread::spawn("resize-watch", &SIZE_BELL, Some(VANISH_CHECK), move || {
        check(&shared, &remotes)
    })?;
    Ok(thread)
}

/// Every namespace whose store's size changed: served at the new size, its hosts told;
/// every namespace whose store vanished: removed.
fn check(shared: &Arc<Shared>, remotes: &[Remote]) {
    // A resize comes with a burst of header notifications: let it settle.
    std::thread::sleep(Duration::from_millis(20));
    let snap = shared.snapshot.load_full();
    for s in &snap.subsystems {
        for ns in s.all_namespaces() {
            if let Some(why) = ns.backend.vanished(ns.resv.cut_off()) {
                crate::mutate::namespace_vanished(shared, remotes, &s.nqn, ns.nsid, &why);
                continue;
            }
            if let Some(bytes) = ns.backend.refresh_size()
                && bytes >> ns.block_shift != ns.blocks()
            {
                crate::mutate::namespace_resized(shared, remotes, &s.nqn, ns.nsid, bytes);
            }
        }
    }
}

/// `pollux ctl resize-namespace`: resize namespace `nsid` of `nqn`'s store to `bytes` (a
/// multiple of its block size, not smaller than now) and serve the new size.
pub fn resize_namespace(
    shared: &Shared,
    remotes: &[Remote],
    nqn: &str,
    nsid: u32,
    bytes: u64,
) -> Result<u64, ResizeError> {
    let snap = shared.snapshot.load();
    let ns = snap
        .subsystem(nqn)
        .ok_or_else(|| ResizeError::Params(format!("no subsystem '{nqn}'")))?
        .namespace_ignoring_masks(nsid)
        .ok_or_else(|| ResizeError::Params(format!("subsystem '{nqn}' has no namespace {nsid}")))?
        .clone();
    if bytes == 0 || !bytes.is_multiple_of(u64::from(ns.block_size)) {
        return Err(ResizeError::Params(format!(
            "size {bytes} is not a positive multiple of the namespace's block size {}",
            ns.block_size
        )));
    }
    ns.backend.resize(bytes).map_err(ResizeError::Store)?;
    crate::mutate::namespace_resized(shared, remotes, nqn, nsid, bytes);
    Ok(bytes)
}

/// Why a resize was refused.
#[derive(Debug, thiserror::Error)]
pub enum ResizeError {
    /// The request names no namespace or a bad size.
    #[error("{0}")]
    Params(String),
    /// The store refused or failed.
    #[error(transparent)]
    Store(StoreError),
}
