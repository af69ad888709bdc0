//! Plain RADOS objects read with their version and replaced by writes that assert it: the
//! reservation object beside an image ([`super::resv_object`]) and a gateway group's objects
//! ([`super::group_object`]).
//!
//! `rados_get_last_version` is per I/O context: each caller holds its context under a lock
//! for the operation and that call, so the version is the operation's own.

use std::ffi::{CStr, CString, c_char, c_int};
use std::ptr;

use pollux_conf::RbdBackend;

use super::client::{Cluster, library, rbd_error};
use super::sys;
use crate::error::StoreError;

/// An I/O context (pool and RADOS namespace), destroyed by its owner.
#[derive(Debug)]
pub(super) struct Ioctx(pub(super) sys::rados_ioctx_t);

// SAFETY: a rados_ioctx_t may be used from any thread; its owners use it under a lock.
unsafe impl Send for Ioctx {}

/// A context on `c` for `b`'s pool and RADOS namespace, for `purpose` (said in errors).
pub(super) fn open_ioctx(c: &Cluster, b: &RbdBackend, purpose: &str) -> Result<Ioctx, StoreError> {
    let lib = library()?;
    let bad = |what: &str| rbd_error(b, format!("{what} contains a NUL character"), -i64::from(libc::EINVAL));
    let pool = CString::new(b.pool.as_str()).map_err(|_| bad("`pool`"))?;
    let ns = CString::new(b.rados_namespace.as_deref().unwrap_or("")).map_err(|_| bad("`rados_namespace`"))?;
    let mut io: sys::rados_ioctx_t = ptr::null_mut();
    // SAFETY: a connected cluster handle; writes the new context through the pointer.
    let rc = unsafe { lib.rados_ioctx_create(c.handle(), pool.as_ptr(), &mut io) };
    if rc < 0 {
        return Err(rbd_error(
            b,
            format!("cannot open pool {:?} for {purpose}", b.pool),
            rc.into(),
        ));
    }
    // SAFETY: a live context and a NUL-terminated name ("": the default namespace).
    unsafe { lib.rados_ioctx_set_namespace(io, ns.as_ptr()) };
    Ok(Ioctx(io))
}

/// Object `oid` through `io` and its version (None: it does not exist); larger than `max`
/// bytes: EFBIG.
pub(super) fn read(io: &Ioctx, oid: &CStr, max: usize) -> Result<Option<(Vec<u8>, u64)>, c_int> {
    let lib = library().map_err(|_| -libc::ENOSYS)?;
    let mut buf = vec![0u8; max];
    // SAFETY: a live context, a NUL-terminated name, a buffer of buf.len() bytes.
    let rc = unsafe { lib.rados_read(io.0, oid.as_ptr(), buf.as_mut_ptr().cast::<c_char>(), buf.len(), 0) };
    if rc == -libc::ENOENT {
        return Ok(None);
    }
    if rc < 0 {
        return Err(rc);
    }
    // SAFETY: a live context; the version of the read just done (the caller holds it).
    let version = unsafe { lib.rados_get_last_version(io.0) };
    let n = usize::try_from(rc).unwrap_or(0);
    if n == buf.len() {
        return Err(-libc::EFBIG);
    }
    buf.truncate(n);
    Ok(Some((buf, version)))
}

/// Replace object `oid` with `data`: if its version is still `version` (None: create it,
/// failing if it exists; `Some(0)`: whatever its version). The version written, or None
/// when someone else changed or created it first.
pub(super) fn write(io: &Ioctx, oid: &CStr, data: &[u8], version: Option<u64>) -> Result<Option<u64>, c_int> {
    let lib = library().map_err(|_| -libc::ENOSYS)?;
    // SAFETY: returns a new operation (or null), released below on every path.
    let op = unsafe { lib.rados_create_write_op() };
    if op.is_null() {
        return Err(-libc::ENOMEM);
    }
    // SAFETY: a live operation; `data` is copied by write_full before operate returns.
    let rc = unsafe {
        match version {
            Some(0) => {}
            Some(v) => lib.rados_write_op_assert_version(op, v),
            None => lib.rados_write_op_create(op, sys::LIBRADOS_CREATE_EXCLUSIVE as c_int, ptr::null()),
        }
        lib.rados_write_op_write_full(op, data.as_ptr().cast::<c_char>(), data.len());
        lib.rados_write_op_operate(op, io.0, oid.as_ptr(), ptr::null_mut(), 0)
    };
    // SAFETY: a live context; the version the write just made (the caller holds it).
    let written = unsafe { lib.rados_get_last_version(io.0) };
    // SAFETY: ours, operated; not used again.
    unsafe { lib.rados_release_write_op(op) };
    match rc {
        0 => Ok(Some(written)),
        // The version moved (ERANGE: the object is newer than read; EOVERFLOW: older, a
        // recreated object) or someone created it first: read again.
        rc if rc == -libc::ERANGE || rc == -libc::EOVERFLOW || rc == -libc::EEXIST => Ok(None),
        rc => Err(rc),
    }
}
