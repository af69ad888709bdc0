//! The RADOS object that holds an image's reservations for every gateway
//! ([`crate::cluster::ClusterObject`]): `pollux.resv.<image id>`, beside the image in its pool
//! and RADOS namespace. Changed only by a write that asserts the version read
//! (`rados_write_op_assert_version`), so two gateways' changes never overwrite each other;
//! watched (`rados_watch3`), and every change announced by `rados_notify2`, which returns
//! once every watcher acknowledged or the timeout passed.
//!
//! Every call here blocks on the cluster (bounded by the connection's `rados_osd_op_timeout`):
//! it runs on the reservation threads, never on a reactor.

use std::ffi::{CString, c_char, c_int, c_void};
use std::ptr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pollux_conf::RbdBackend;
use tracing::warn;

use super::client::{Cluster, library, rbd_error};
use super::object::{self, Ioctx, open_ioctx};
use super::sys;
use crate::cluster::{ClusterObject, Inbox, NotifyReply, WatchEvent};
use crate::error::StoreError;

/// How long the OSD keeps a watch whose gateway stopped pinging (a `kill -9`): a change
/// meanwhile waits its notify timeout for that gateway. The client pings every
/// `objecter_tick_interval` (set to 1 s on pollux's connections, [`Cluster`]).
const WATCH_TIMEOUT_S: u32 = 6;

/// Objects larger than this are not a reservation state pollux wrote (a state of 1,000
/// registrants is about 80 KiB).
const MAX_OBJECT: usize = 1 << 20;

/// The reservation object of one image, with this gateway's watch on it.
#[derive(Debug)]
pub struct RadosResvObject {
    /// Its contexts and cluster (None once closed: [`ClusterObject::close`]). An operation
    /// holds a reference for its duration: a close meanwhile frees them after it.
    handles: Mutex<Option<Arc<Handles>>>,
    oid: CString,
    what: String,
    /// The watch: its cookie and the inbox its callback fills (freed after unwatch).
    watch: Mutex<Option<(u64, *mut Arc<Inbox>)>>,
}

/// The object's librados handles, freed (contexts destroyed, then the cluster let go of)
/// when the last reference goes.
#[derive(Debug)]
struct Handles {
    /// Its own I/O context (pool and RADOS namespace of the image): `rados_get_last_version`
    /// is per context, so no other user's operation may come between an operation and it.
    io: Mutex<Ioctx>,
    /// A second context for notifies alone: a notify waits for the other gateways and
    /// records its own last version, so it may not share the first.
    notify_io: Ioctx,
    cluster: Arc<Cluster>,
}

impl Drop for Handles {
    fn drop(&mut self) {
        let Ok(lib) = library() else { return };
        let io = self.io.get_mut().unwrap_or_else(|p| p.into_inner());
        // SAFETY: ours; no operation holds them (this is the last reference) and the watch
        // on them has ended.
        unsafe {
            lib.rados_ioctx_destroy(io.0);
            lib.rados_ioctx_destroy(self.notify_io.0);
        }
    }
}

// SAFETY: a rados_ioctx_t may be used from any thread; pollux uses the first under its lock
// (so that the last version read is the operation's own).
unsafe impl Send for Handles {}
// SAFETY: as above.
unsafe impl Sync for Handles {}

// SAFETY: the watch's raw pointer is ours, handed to librados only as the callback's argument
// and freed after unwatch; the handles are Send and Sync.
unsafe impl Send for RadosResvObject {}
// SAFETY: as above.
unsafe impl Sync for RadosResvObject {}

unsafe extern "C" fn on_notify(
    arg: *mut c_void,
    notify_id: u64,
    cookie: u64,
    notifier: u64,
    data: *mut c_void,
    len: usize,
) {
    // SAFETY: `arg` is the Box<Arc<Inbox>> registered by watch(), freed only after
    // rados_unwatch2 and rados_watch_flush returned (no callback runs after them).
    let inbox = unsafe { &*(arg as *const Arc<Inbox>) };
    let payload = if data.is_null() || len == 0 {
        Vec::new()
    } else {
        // SAFETY: librados passes `len` readable bytes at `data` for the callback's duration.
        unsafe { std::slice::from_raw_parts(data as *const u8, len) }.to_vec()
    };
    // Applying and acknowledging happen on the target's reservation watcher, not on
    // librados' thread: a gateway acknowledges only once its controllers have the change,
    // which may wait for commands to be fenced.
    inbox.push(WatchEvent::Notify {
        notify_id,
        cookie,
        notifier,
        payload,
    });
}

unsafe extern "C" fn on_watch_error(arg: *mut c_void, _cookie: u64, err: c_int) {
    // SAFETY: as in on_notify.
    let inbox = unsafe { &*(arg as *const Arc<Inbox>) };
    inbox.push(WatchEvent::Lost(err));
}

impl RadosResvObject {
    /// The reservation object of image `image_id` of `b` (created empty by the caller if it
    /// does not exist yet).
    pub fn open(cluster: Arc<Cluster>, b: &RbdBackend, image_id: &str) -> Result<Self, StoreError> {
        Self::open_named(cluster, b, format!("pollux.resv.{image_id}"), "the reservation object")
    }

    /// Object `name` of `b`'s pool and RADOS namespace, watched and notified as the
    /// reservation object is (a gateway group's configuration: the target's
    /// `gateway::config`).
    pub fn open_named(
        cluster: Arc<Cluster>,
        b: &RbdBackend,
        name: String,
        what_for: &'static str,
    ) -> Result<Self, StoreError> {
        let lib = library()?;
        let what = match &b.rados_namespace {
            Some(ns) if !ns.is_empty() => format!("{}/{ns}/{name}", b.pool),
            _ => format!("{}/{name}", b.pool),
        };
        let oid = CString::new(name)
            .map_err(|_| rbd_error(b, "the object name contains a NUL character", -i64::from(libc::EINVAL)))?;
        let context = || open_ioctx(&cluster, b, what_for);
        let first = context()?;
        let notify_io = match context() {
            Ok(c) => c,
            Err(e) => {
                // SAFETY: ours, unused.
                unsafe { lib.rados_ioctx_destroy(first.0) };
                return Err(e);
            }
        };
        Ok(Self {
            handles: Mutex::new(Some(Arc::new(Handles {
                io: Mutex::new(first),
                notify_io,
                cluster,
            }))),
            oid,
            what,
            watch: Mutex::new(None),
        })
    }

    /// The handles, unless closed.
    fn handles(&self) -> Result<Arc<Handles>, i32> {
        self.handles
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or(-libc::ESHUTDOWN)
    }

    fn end_watch(&self, lib: &sys::Ceph) {
        let watch = self.watch.lock().unwrap_or_else(|p| p.into_inner()).take();
        let Ok(h) = self.handles() else { return };
        let io = h.io();
        unwatch(lib, io.0, h.cluster.handle(), watch, &self.what);
    }
}

impl Handles {
    fn io(&self) -> std::sync::MutexGuard<'_, Ioctx> {
        self.io.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// End watch `w` (cookie and callback argument) of context `io` on cluster `cluster`, and
/// free its argument once no callback can run.
fn unwatch(
    lib: &sys::Ceph,
    io: sys::rados_ioctx_t,
    cluster: sys::rados_t,
    w: Option<(u64, *mut Arc<Inbox>)>,
    what: &str,
) {
    let Some((cookie, arg)) = w else { return };
    // SAFETY: a live context and the cookie rados_watch3 gave. An error (the watch was
    // already lost) still unregisters it on the client.
    let rc = unsafe { lib.rados_unwatch2(io, cookie) };
    if rc < 0 && rc != -libc::ENOTCONN {
        warn!(object = %what, rc, "rados_unwatch2 failed");
    }
    // SAFETY: waits until no watch callback of this client runs any more.
    unsafe { lib.rados_watch_flush(cluster) };
    // SAFETY: unregistered and flushed: no callback holds the box.
    drop(unsafe { Box::from_raw(arg) });
}

impl ClusterObject for RadosResvObject {
    fn describe(&self) -> &str {
        &self.what
    }

    fn read(&self) -> Result<Option<(Vec<u8>, u64)>, i32> {
        let h = self.handles()?;
        let io = h.io();
        object::read(&io, &self.oid, MAX_OBJECT)
    }

    fn write(&self, data: &[u8], version: Option<u64>) -> Result<Option<u64>, i32> {
        let h = self.handles()?;
        let io = h.io();
        object::write(&io, &self.oid, data, version)
    }

    fn notify(&self, payload: &[u8], timeout: Duration) -> Result<NotifyReply, i32> {
        let lib = library().map_err(|_| -libc::ENOSYS)?;
        let len = c_int::try_from(payload.len()).map_err(|_| -libc::EFBIG)?;
        let (mut reply, mut reply_len): (*mut c_char, usize) = (ptr::null_mut(), 0);
        // Its own context, without the lock: a notify waits for the other gateways, and
        // this gateway's own watcher must be able to read meanwhile.
        let h = self.handles()?;
        let io = h.notify_io.0;
        // SAFETY: a live context (the object outlives the call), a NUL-terminated name, the
        // payload's bytes; librados allocates the reply, freed below.
        let rc = unsafe {
            lib.rados_notify2(
                io,
                self.oid.as_ptr(),
                payload.as_ptr().cast::<c_char>(),
                len,
                u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
                &mut reply,
                &mut reply_len,
            )
        };
        let parsed = if reply.is_null() {
            None
        } else {
            // SAFETY: reply_len bytes at `reply`, from librados.
            let bytes = unsafe { std::slice::from_raw_parts(reply as *const u8, reply_len) };
            let p = parse_reply(bytes);
            // SAFETY: allocated by librados for us.
            unsafe { lib.rados_buffer_free(reply) };
            p
        };
        match (rc, parsed) {
            (0, Some(r)) => Ok(r),
            (0, None) => Ok(NotifyReply::default()),
            (rc, Some(r)) if rc == -libc::ETIMEDOUT => Ok(r),
            (rc, _) => Err(rc),
        }
    }

    fn watch(&self, inbox: Arc<Inbox>) -> Result<(), i32> {
        let lib = library().map_err(|_| -libc::ENOSYS)?;
        self.end_watch(lib);
        let h = self.handles()?;
        let arg = Box::into_raw(Box::new(inbox));
        let mut cookie = 0u64;
        let io = h.io();
        // SAFETY: a live context and name; `arg` stays valid until unwatch frees it.
        let rc = unsafe {
            lib.rados_watch3(
                io.0,
                self.oid.as_ptr(),
                &mut cookie,
                Some(on_notify),
                Some(on_watch_error),
                WATCH_TIMEOUT_S,
                arg.cast(),
            )
        };
        drop(io);
        if rc < 0 {
            // SAFETY: not registered: ours again.
            drop(unsafe { Box::from_raw(arg) });
            return Err(rc);
        }
        *self.watch.lock().unwrap_or_else(|p| p.into_inner()) = Some((cookie, arg));
        Ok(())
    }

    fn watch_age(&self) -> Result<Duration, i32> {
        let lib = library().map_err(|_| -libc::ENOSYS)?;
        let Some((cookie, _)) = *self.watch.lock().unwrap_or_else(|p| p.into_inner()) else {
            return Err(-libc::ENOTCONN);
        };
        let h = self.handles()?;
        let io = h.io();
        // SAFETY: a live context and the watch's cookie.
        let rc = unsafe { lib.rados_watch_check(io.0, cookie) };
        if rc < 0 {
            Err(rc)
        } else {
            Ok(Duration::from_millis(u64::try_from(rc).unwrap_or(0)))
        }
    }

    fn ack(&self, notify_id: u64, cookie: u64) {
        let Ok(lib) = library() else { return };
        let Ok(h) = self.handles() else { return };
        let io = h.io();
        // SAFETY: a live context and name; no payload.
        let rc = unsafe { lib.rados_notify_ack(io.0, self.oid.as_ptr(), notify_id, cookie, ptr::null(), 0) };
        if rc < 0 {
            warn!(object = %self.what, rc, "cannot acknowledge a reservation change");
        }
    }

    fn cookie(&self) -> Option<u64> {
        self.watch.lock().unwrap_or_else(|p| p.into_inner()).map(|(c, _)| c)
    }

    fn close(&self) {
        if let Ok(lib) = library() {
            self.end_watch(lib);
        }
        // The last reference (an operation in progress may hold one) destroys the contexts
        // and lets go of the cluster: a process that stops then shuts its connection down.
        self.handles.lock().unwrap_or_else(|p| p.into_inner()).take();
    }
}

impl Drop for RadosResvObject {
    /// Ending the watch and closing the contexts block on the cluster: done on a closer
    /// thread (the last holder of a namespace may be a reactor).
    fn drop(&mut self) {
        let Ok(lib) = library() else { return };
        let closing = Closing {
            watch: self.watch.lock().unwrap_or_else(|p| p.into_inner()).take(),
            handles: self.handles.lock().unwrap_or_else(|p| p.into_inner()).take(),
            what: self.what.clone(),
        };
        if closing.watch.is_none() && closing.handles.is_none() {
            return;
        }
        super::close_later("a reservation object's watch", move || {
            let c = closing;
            if let Some(h) = &c.handles {
                let io = h.io();
                unwatch(lib, io.0, h.cluster.handle(), c.watch, &c.what);
            }
            drop(c.handles);
        });
    }
}

/// What a dropped object leaves to close.
struct Closing {
    watch: Option<(u64, *mut Arc<Inbox>)>,
    handles: Option<Arc<Handles>>,
    what: String,
}

// SAFETY: the watch's argument is only used by the closer thread once its object is gone;
// the handles are Send.
unsafe impl Send for Closing {}

/// The counts in a notify's reply: Ceph's encoding of `map<(gid, cookie), bufferlist>` (the
/// acknowledgements) then `set<(gid, cookie)>` (the watchers that timed out): a u32 count,
/// then per entry two u64s (and for the map a u32 length and that many bytes), little
/// endian. None if it does not parse.
fn parse_reply(b: &[u8]) -> Option<NotifyReply> {
    let mut at = 0usize;
    let mut take = |n: usize| -> Option<&[u8]> {
        let s = b.get(at..at.checked_add(n)?)?;
        at += n;
        Some(s)
    };
    let u32_of = |s: &[u8]| s.try_into().ok().map(u32::from_le_bytes);
    let acked = u32_of(take(4)?)? as usize;
    for _ in 0..acked {
        take(16)?;
        let len = u32_of(take(4)?)? as usize;
        take(len)?;
    }
    let timed_out = u32_of(take(4)?)? as usize;
    for _ in 0..timed_out {
        take(16)?;
    }
    Some(NotifyReply { acked, timed_out })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notify_reply_counts_acknowledgements_and_timeouts() {
        let mut b = Vec::new();
        b.extend(2u32.to_le_bytes());
        for (gid, len) in [(7u64, 0u32), (9, 3)] {
            b.extend(gid.to_le_bytes());
            b.extend(1u64.to_le_bytes());
            b.extend(len.to_le_bytes());
            b.extend(vec![0xAA; len as usize]);
        }
        b.extend(1u32.to_le_bytes());
        b.extend(5u64.to_le_bytes());
        b.extend(2u64.to_le_bytes());
        assert_eq!(parse_reply(&b), Some(NotifyReply { acked: 2, timed_out: 1 }));
        assert_eq!(parse_reply(&b[..b.len() - 1]), None);
        assert_eq!(parse_reply(&[]), None);
    }
}
