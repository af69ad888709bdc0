//! The RADOS objects of a gateway group (the target's `gateway`): plain objects in one pool
//! and RADOS namespace, read with their version and replaced by writes that assert it, over a
//! cluster connection of the group's own ([`Cluster::private`]).
//!
//! Every call blocks on the cluster, at most the connection's operation timeout: it runs on
//! the gateway agent's thread, never on a reactor.

use std::ffi::{CString, c_int};
use std::sync::{Arc, Mutex};

use pollux_conf::RbdBackend;

use super::client::{Cluster, library};
use super::object::{self, Ioctx, open_ioctx};
use crate::error::StoreError;

/// Group objects larger than this are not a group state pollux wrote.
const MAX_OBJECT: usize = 1 << 20;

/// A pool's objects, through one I/O context (whose `rados_get_last_version` is why it is
/// behind a lock: no other operation may come between an operation and that call).
#[derive(Debug)]
pub struct GroupObjects {
    io: Mutex<Ioctx>,
    /// The connection (its clients' addresses are what fencing this gateway blocklists).
    pub cluster: Arc<Cluster>,
}

impl GroupObjects {
    /// Connect (a new client of the cluster) and open `b`'s pool and RADOS namespace.
    pub fn open(b: &RbdBackend) -> Result<Self, StoreError> {
        Self::on(Cluster::private(b)?, b)
    }

    /// `b`'s pool and RADOS namespace through connection `cluster`.
    pub fn on(cluster: Arc<Cluster>, b: &RbdBackend) -> Result<Self, StoreError> {
        let io = open_ioctx(&cluster, b, "the gateway group")?;
        Ok(Self {
            io: Mutex::new(io),
            cluster,
        })
    }

    fn io(&self) -> std::sync::MutexGuard<'_, Ioctx> {
        self.io.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Object `oid` and its version (None: it does not exist).
    pub fn read(&self, oid: &str) -> Result<Option<(Vec<u8>, u64)>, c_int> {
        let oid = CString::new(oid).map_err(|_| -libc::EINVAL)?;
        object::read(&self.io(), &oid, MAX_OBJECT)
    }

    /// Replace object `oid` with `data` ([`object::write`]: `version` None creates it,
    /// `Some(0)` writes whatever its version). The version written, or None when someone
    /// else changed or created it first.
    pub fn write(&self, oid: &str, data: &[u8], version: Option<u64>) -> Result<Option<u64>, c_int> {
        let oid = CString::new(oid).map_err(|_| -libc::EINVAL)?;
        object::write(&self.io(), &oid, data, version)
    }
}

impl Drop for GroupObjects {
    fn drop(&mut self) {
        if let Ok(lib) = library() {
            // SAFETY: ours; no operation runs (we are dropped).
            unsafe { lib.rados_ioctx_destroy(self.io().0) };
        }
    }
}
