//! Safe handles over librados and librbd, loaded at run time ([`library`]): a cluster
//! connection ([`Cluster`], shared by the images of one cluster and user) and an open image
//! ([`Image`]). Everything here may block for up to the backend's `op_timeout_s` (the
//! monitor or OSDs answering): it runs on the thread that opens a namespace (start, or a
//! control client's), never on a reactor. Asynchronous I/O is in the channel
//! ([`super::RbdChannel`]), which calls the `rbd_aio_*` functions through [`library`].

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::path::PathBuf;
use std::ptr;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use pollux_conf::RbdBackend;
use tracing::{debug, info, warn};

use super::sys;
use crate::error::StoreError;

/// The image-meta key naming the gateway group that serves an image (`rbd image-meta get
/// POOL/IMAGE pollux.gateway_group`).
pub const GROUP_KEY: &str = "pollux.gateway_group";

/// The library loaded; its dependencies (librados.so.2) come with it.
pub const LIBRBD: &str = "librbd.so.1";

/// librados and librbd, loaded once per process: the loader's reason is kept, so every
/// rbd namespace of a machine without Ceph gets the same clear error.
pub fn library() -> Result<&'static sys::Ceph, StoreError> {
    static LIB: OnceLock<Result<sys::Ceph, libloading::Error>> = OnceLock::new();
    let lib = LIB.get_or_init(|| {
        // SAFETY: loading librbd runs its (and librados') initialisers, which only set up
        // their own state; every symbol is then checked against the bindings' signatures
        // by name (bindgen's --dynamic-link-require-all: a missing one fails the load).
        let l = unsafe { sys::Ceph::new(LIBRBD) };
        if let Ok(l) = &l {
            let (mut maj, mut min, mut extra) = (0, 0, 0);
            // SAFETY: rbd_version writes three ints through the pointers given.
            unsafe { l.rbd_version(&mut maj, &mut min, &mut extra) };
            info!(version = %format!("{maj}.{min}.{extra}"), "loaded {LIBRBD}");
        }
        l
    });
    lib.as_ref().map_err(|why| StoreError::RbdLibrary {
        lib: LIBRBD,
        why: why.to_string(),
    })
}

/// An rbd call's error, with the image and conf it concerns.
pub fn rbd_error(b: &RbdBackend, what: impl Into<String>, rc: i64) -> StoreError {
    StoreError::Rbd {
        image: b.spec(),
        conf: b.ceph_conf.clone(),
        what: what.into(),
        errno: i32::try_from(rc).unwrap_or(-libc::EIO),
    }
}

fn cstring(b: &RbdBackend, what: &str, s: &str) -> Result<CString, StoreError> {
    CString::new(s).map_err(|_| rbd_error(b, format!("{what} contains a NUL character"), -i64::from(libc::EINVAL)))
}

/// What makes two namespaces' cluster connections interchangeable.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ClusterKey {
    conf: PathBuf,
    user: String,
    keyring: Option<PathBuf>,
    write_cache: bool,
    op_timeout_s: u32,
}

/// A connection to a Ceph cluster (`rados_t`): its monitor session, messengers and
/// threads. Shared by every image opened with the same conf, user, keyring and options.
#[derive(Debug)]
pub struct Cluster {
    handle: sys::rados_t,
    /// The cluster's fsid.
    pub fsid: String,
}

// SAFETY: a rados_t is thread-safe (librados serialises its own state); pollux only
// passes the handle to librados functions.
unsafe impl Send for Cluster {}
// SAFETY: as above.
unsafe impl Sync for Cluster {}

impl Cluster {
    /// The librados handle (for the reservation object's contexts).
    pub(super) fn handle(&self) -> sys::rados_t {
        self.handle
    }

    /// The connection for `b`: an existing one with the same options, or a new one.
    pub fn get(b: &RbdBackend) -> Result<Arc<Cluster>, StoreError> {
        static OPEN: Mutex<Option<HashMap<ClusterKey, Weak<Cluster>>>> = Mutex::new(None);
        let key = ClusterKey {
            conf: b.ceph_conf.clone(),
            user: b.user.clone(),
            keyring: b.keyring.clone(),
            write_cache: b.write_cache,
            op_timeout_s: b.op_timeout_s,
        };
        // Held while connecting: two namespaces of one cluster opened at once connect once.
        // Only the threads that open namespaces take it.
        let mut open = OPEN.lock().unwrap_or_else(|p| p.into_inner());
        let map = open.get_or_insert_with(HashMap::new);
        map.retain(|_, w| w.strong_count() > 0);
        if let Some(c) = map.get(&key).and_then(Weak::upgrade) {
            return Ok(c);
        }
        let c = Arc::new(Self::connect(b)?);
        map.insert(key, Arc::downgrade(&c));
        remember(&c);
        Ok(c)
    }

    /// A connection of its own, shared with nobody (a gateway group's: when the group
    /// fences this gateway, it reconnects as a new client without waiting for the images).
    pub fn private(b: &RbdBackend) -> Result<Arc<Cluster>, StoreError> {
        let c = Arc::new(Self::connect(b)?);
        remember(&c);
        Ok(c)
    }

    /// This client's addresses, as the cluster knows them (`rados_getaddrs`): an address
    /// vector such as `[v2:10.0.0.1:0/1234,v1:10.0.0.1:0/1234]`, split into its addresses.
    pub fn addrs(&self) -> Vec<String> {
        let Ok(lib) = library() else { return Vec::new() };
        let mut out: *mut c_char = ptr::null_mut();
        // SAFETY: a connected handle; librados allocates the string (strdup) into `out`.
        let rc = unsafe { lib.rados_getaddrs(self.handle, &mut out) };
        if rc < 0 || out.is_null() {
            return Vec::new();
        }
        // SAFETY: NUL-terminated by librados.
        let text = unsafe { CStr::from_ptr(out) }.to_string_lossy().into_owned();
        // SAFETY: allocated by strdup in librados, freed once, here.
        unsafe { libc::free(out.cast()) };
        text.trim_matches(|c| c == '[' || c == ']')
            .split(',')
            .filter(|a| !a.is_empty())
            .map(str::to_owned)
            .collect()
    }

    /// Blocklist client address `addr` for `expiry_s` seconds (`osd blocklist add`).
    pub fn blocklist_add(&self, addr: &str, expiry_s: u32) -> Result<(), c_int> {
        let lib = library().map_err(|_| -libc::ENOSYS)?;
        let a = CString::new(addr).map_err(|_| -libc::EINVAL)?;
        // SAFETY: a connected handle and a NUL-terminated address; librados only reads it
        // (its prototype lacks the const).
        let rc = unsafe { lib.rados_blocklist_add(self.handle, a.as_ptr().cast_mut(), expiry_s) };
        if rc < 0 { Err(rc) } else { Ok(()) }
    }

    /// Wait until this client has the cluster's newest OSD map.
    pub fn wait_for_latest_osdmap(&self) -> Result<(), c_int> {
        let lib = library().map_err(|_| -libc::ENOSYS)?;
        // SAFETY: a connected handle.
        let rc = unsafe { lib.rados_wait_for_latest_osdmap(self.handle) };
        if rc < 0 { Err(rc) } else { Ok(()) }
    }

    fn connect(b: &RbdBackend) -> Result<Cluster, StoreError> {
        let lib = library()?;
        let mut handle: sys::rados_t = ptr::null_mut();
        let name = cstring(b, "`user`", &format!("client.{}", b.user))?;
        // SAFETY: rados_create2 writes the new handle through `handle`; the strings are
        // NUL-terminated and live for the call.
        let rc = unsafe { lib.rados_create2(&mut handle, c"ceph".as_ptr(), name.as_ptr(), 0) };
        if rc < 0 {
            return Err(rbd_error(b, "cannot create a cluster handle", rc.into()));
        }
        // From here the handle is shut down on every path (Drop).
        let mut c = Cluster {
            handle,
            fsid: String::new(),
        };
        let conf = cstring(b, "`ceph_conf`", &b.ceph_conf.to_string_lossy())?;
        // SAFETY: a live handle and a NUL-terminated path.
        let rc = unsafe { lib.rados_conf_read_file(c.handle, conf.as_ptr()) };
        if rc < 0 {
            return Err(rbd_error(b, "cannot read the Ceph configuration file", rc.into()));
        }
        let timeout = b.op_timeout_s.to_string();
        let mut opts: Vec<(&str, String)> = vec![
            // Every wait on the cluster is bounded: connecting, monitor commands, and each
            // OSD operation, which then fails with ETIMEDOUT (a retryable status) instead
            // of waiting for the cluster forever. (Without the OSD bound, an OSD that
            // comes back from a 15 s SIGSTOP was seen holding one write 'delayed' for
            // good, and every later write of that object behind it.)
            ("client_mount_timeout", timeout.clone()),
            ("rados_mon_op_timeout", timeout.clone()),
            ("rados_osd_op_timeout", timeout),
            // Watches are confirmed by a ping each tick: at 1 s (default 5 s) a gateway that
            // lost the cluster knows within a few seconds that it cannot see reservation
            // changes (the target's resv::cluster, UNCERTAIN_AFTER).
            ("objecter_tick_interval", "1".to_owned()),
            ("rbd_cache", b.write_cache.to_string()),
            // librbd's safety net for clients that never flush (write through until the first
            // flush) is not needed: the namespace reports its volatile cache (VWC) and the
            // hosts flush. Without this the cache stays write-through until they do.
            ("rbd_cache_writethrough_until_flush", "false".to_owned()),
        ];
        if let Some(k) = &b.keyring {
            opts.push(("keyring", k.to_string_lossy().into_owned()));
        }
        for (k, v) in &opts {
            let (ck, cv) = (cstring(b, k, k)?, cstring(b, k, v)?);
            // SAFETY: a live handle and NUL-terminated strings.
            let rc = unsafe { lib.rados_conf_set(c.handle, ck.as_ptr(), cv.as_ptr()) };
            if rc < 0 {
                return Err(rbd_error(b, format!("cannot set {k}"), rc.into()));
            }
        }
        // SAFETY: a configured, not yet connected handle.
        let rc = unsafe { lib.rados_connect(c.handle) };
        if rc < 0 {
            let what = match -rc {
                libc::ETIMEDOUT => format!(
                    "cannot connect to the cluster within {} s (no monitor answered: is it running, and is `mon host` in the conf right?)",
                    b.op_timeout_s
                ),
                libc::EACCES | libc::EPERM => format!("the cluster refused user client.{} (wrong key?)", b.user),
                libc::ENOENT => "cannot connect to the cluster (a keyring or monitor address is missing)".to_owned(),
                _ => "cannot connect to the cluster".to_owned(),
            };
            return Err(rbd_error(b, what, rc.into()));
        }
        let mut fsid = [0 as c_char; 64];
        // SAFETY: writes at most fsid.len() bytes, NUL-terminated, into the buffer.
        let rc = unsafe { lib.rados_cluster_fsid(c.handle, fsid.as_mut_ptr(), fsid.len()) };
        if rc < 0 {
            return Err(rbd_error(b, "cannot read the cluster's fsid", rc.into()));
        }
        // SAFETY: NUL-terminated by rados_cluster_fsid, within the buffer.
        c.fsid = unsafe { CStr::from_ptr(fsid.as_ptr()) }.to_string_lossy().into_owned();
        info!(conf = %b.ceph_conf.display(), user = %b.user, fsid = %c.fsid, "connected to the Ceph cluster");
        Ok(c)
    }
}

/// Whether the header object of image `id` (format 2: `rbd_header.<id>`) exists in `b`'s
/// pool and RADOS namespace, asked through `c`.
pub fn header_exists(c: &Cluster, b: &RbdBackend, id: &str) -> Result<bool, c_int> {
    let lib = library().map_err(|_| -libc::ENOSYS)?;
    let io = super::object::open_ioctx(c, b, "the image's header").map_err(|_| -libc::EIO)?;
    let oid = CString::new(format!("rbd_header.{id}")).map_err(|_| -libc::EINVAL)?;
    // The header keeps everything in omap: its data is empty (a byte back says it exists).
    let found = super::object::read(&io, &oid, 1);
    // SAFETY: ours, and nothing else uses it.
    unsafe { lib.rados_ioctx_destroy(io.0) };
    match found {
        Ok(v) => Ok(v.is_some()),
        Err(rc) if rc == -libc::EFBIG => Ok(true),
        Err(rc) => Err(rc),
    }
}

/// Every cluster connection of this process, for [`all_addrs`].
static EVERY: Mutex<Vec<Weak<Cluster>>> = Mutex::new(Vec::new());

fn remember(c: &Arc<Cluster>) {
    let mut every = EVERY.lock().unwrap_or_else(|p| p.into_inner());
    every.retain(|w| w.strong_count() > 0);
    every.push(Arc::downgrade(c));
}

/// The client addresses of every cluster connection this process holds now: what a gateway
/// group blocklists to fence it.
pub fn all_addrs() -> Vec<String> {
    let live: Vec<Arc<Cluster>> = EVERY
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter_map(Weak::upgrade)
        .collect();
    let mut out: Vec<String> = live.iter().flat_map(|c| c.addrs()).collect();
    out.sort();
    out.dedup();
    out
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Ok(lib) = library() {
            // SAFETY: the handle is ours and no ioctx or image of it is left (each holds an
            // Arc of the cluster).
            unsafe { lib.rados_shutdown(self.handle) };
        }
    }
}

/// An open image (`rbd_image_t` and the pool's `rados_ioctx_t`).
#[derive(Debug)]
pub struct Image {
    /// The handle the channels submit to.
    pub handle: sys::rbd_image_t,
    ioctx: sys::rados_ioctx_t,
    /// The cluster's connection, kept while the image is open.
    pub cluster: Arc<Cluster>,
    /// The pool's id.
    pub pool_id: i64,
    /// The image's id (stable across renames).
    pub id: String,
    /// Its feature bits (`RBD_FEATURE_*`).
    pub features: u64,
    /// Where the size watch's callback records a change ([`Image::watch`]).
    watch: Option<(u64, *mut Arc<SizeWatch>)>,
}

// SAFETY: librbd's image handles are thread-safe: ImageCtx serialises its own state, and
// the aio functions may be called from any thread (the reactors each submit to it).
unsafe impl Send for Image {}
// SAFETY: as above.
unsafe impl Sync for Image {}

/// What the image's update watch tells pollux: that its header changed (a resize, a
/// snapshot, a feature change), for the backend to read the size again off the reactors.
#[derive(Debug, Default)]
pub struct SizeWatch {
    /// Header updates seen.
    pub updates: std::sync::atomic::AtomicU64,
}

unsafe extern "C" fn on_update(arg: *mut c_void) {
    // SAFETY: `arg` is the Box<Arc<SizeWatch>> registered by Image::watch, freed only after
    // rbd_update_unwatch returned (no callback runs after it).
    let w = unsafe { &*(arg as *const Arc<SizeWatch>) };
    w.updates.fetch_add(1, std::sync::atomic::Ordering::Release);
    // Reading the size here (librbd's own thread, inside its notification) could deadlock:
    // the resize watcher reads it.
    crate::SIZE_BELL.ring();
}

impl Image {
    /// Open `b`'s image on cluster `c`.
    pub fn open(c: Arc<Cluster>, b: &RbdBackend) -> Result<Image, StoreError> {
        let lib = library()?;
        let pool = cstring(b, "`pool`", &b.pool)?;
        let mut ioctx: sys::rados_ioctx_t = ptr::null_mut();
        // SAFETY: a connected cluster handle; writes the new ioctx through the pointer.
        let rc = unsafe { lib.rados_ioctx_create(c.handle, pool.as_ptr(), &mut ioctx) };
        if rc < 0 {
            let what = if -rc == libc::ENOENT {
                format!("pool {:?} does not exist", b.pool)
            } else {
                format!("cannot open pool {:?}", b.pool)
            };
            return Err(rbd_error(b, what, rc.into()));
        }
        let ns = cstring(b, "`rados_namespace`", b.rados_namespace.as_deref().unwrap_or(""))?;
        // SAFETY: a live ioctx and a NUL-terminated name ("" is the default namespace).
        unsafe { lib.rados_ioctx_set_namespace(ioctx, ns.as_ptr()) };
        // SAFETY: a live ioctx.
        let pool_id = unsafe { lib.rados_ioctx_get_id(ioctx) };
        let name = cstring(b, "`image`", &b.image)?;
        let mut handle: sys::rbd_image_t = ptr::null_mut();
        // SAFETY: a live ioctx, a NUL-terminated name, no snapshot; writes the handle.
        let rc = unsafe { lib.rbd_open(ioctx, name.as_ptr(), &mut handle, ptr::null()) };
        if rc < 0 {
            // SAFETY: the ioctx is ours and nothing uses it.
            unsafe { lib.rados_ioctx_destroy(ioctx) };
            let what = match -rc {
                libc::ENOENT => format!("image {:?} does not exist in pool {:?}", b.image, b.pool),
                libc::EACCES | libc::EPERM => format!("user client.{} may not open the image", b.user),
                _ => "cannot open the image".to_owned(),
            };
            return Err(rbd_error(b, what, rc.into()));
        }
        let mut img = Image {
            handle,
            ioctx,
            cluster: c,
            pool_id,
            id: String::new(),
            features: 0,
            watch: None,
        };
        let mut id = [0 as c_char; 128];
        // SAFETY: writes at most id.len() bytes, NUL-terminated, into the buffer.
        let rc = unsafe { lib.rbd_get_id(img.handle, id.as_mut_ptr(), id.len()) };
        if rc < 0 {
            return Err(rbd_error(b, "cannot read the image's id", rc.into()));
        }
        // SAFETY: NUL-terminated by rbd_get_id, within the buffer.
        img.id = unsafe { CStr::from_ptr(id.as_ptr()) }.to_string_lossy().into_owned();
        // SAFETY: writes one u64.
        let rc = unsafe { lib.rbd_get_features(img.handle, &mut img.features) };
        if rc < 0 {
            return Err(rbd_error(b, "cannot read the image's features", rc.into()));
        }
        if let Some(g) = &b.gateway_group {
            img.claim_for_group(b, g)?;
        }
        Ok(img)
    }

    /// Mark the image as gateway group `group`'s (its image-meta [`GROUP_KEY`]), refusing
    /// one another group marked unless `b` says to take it over: two groups serving one
    /// image each fence, fail over and hand its lock about without the other, which
    /// corrupts it (ceph-nvmeof #833, #1209).
    fn claim_for_group(&self, b: &RbdBackend, group: &str) -> Result<(), StoreError> {
        let held = self
            .metadata(GROUP_KEY)
            .map_err(|rc| rbd_error(b, format!("cannot read the image-meta {GROUP_KEY}"), rc.into()))?;
        match held.as_deref() {
            Some(g) if g == group => return Ok(()),
            Some(other) if !b.take_over_group => {
                return Err(rbd_error(
                    b,
                    format!(
                        "the image is served by gateway group {other:?} (its image-meta {GROUP_KEY}), not this gateway's group {group:?}: two groups on one image would corrupt it; serve it from {other:?}, or set take_over_group = true on this namespace once {other:?} no longer serves it"
                    ),
                    -i64::from(libc::EBUSY),
                ));
            }
            Some(other) => {
                warn!(image = %b.spec(), from = %other, to = %group, "rbd: taking the image over from another gateway group")
            }
            None => {}
        }
        self.set_metadata(GROUP_KEY, group)
            .map_err(|rc| rbd_error(b, format!("cannot set the image-meta {GROUP_KEY}"), rc.into()))?;
        info!(image = %b.spec(), group, "rbd: the image is marked as this gateway group's");
        Ok(())
    }

    /// The image-meta value of `key` (None: unset).
    pub fn metadata(&self, key: &str) -> Result<Option<String>, c_int> {
        let lib = library().map_err(|_| -libc::ENOSYS)?;
        let k = CString::new(key).map_err(|_| -libc::EINVAL)?;
        let mut buf = vec![0u8; 256];
        loop {
            let mut len = buf.len();
            // SAFETY: a live image, a NUL-terminated key, a buffer of `len` bytes; librbd
            // writes at most `len` bytes and the length it needs into `len`.
            let rc = unsafe { lib.rbd_metadata_get(self.handle, k.as_ptr(), buf.as_mut_ptr().cast(), &mut len) };
            match rc {
                0 => {
                    let end = buf.iter().position(|&c| c == 0).unwrap_or(buf.len().min(len));
                    return Ok(Some(String::from_utf8_lossy(&buf[..end]).into_owned()));
                }
                rc if rc == -libc::ENOENT => return Ok(None),
                rc if rc == -libc::ERANGE && len > buf.len() && len <= 64 << 10 => buf.resize(len, 0),
                rc => return Err(rc),
            }
        }
    }

    /// Set the image-meta `key` to `value`.
    pub fn set_metadata(&self, key: &str, value: &str) -> Result<(), c_int> {
        let lib = library().map_err(|_| -libc::ENOSYS)?;
        let (k, v) = (
            CString::new(key).map_err(|_| -libc::EINVAL)?,
            CString::new(value).map_err(|_| -libc::EINVAL)?,
        );
        // SAFETY: a live image and NUL-terminated strings.
        let rc = unsafe { lib.rbd_metadata_set(self.handle, k.as_ptr(), v.as_ptr()) };
        if rc < 0 { Err(rc) } else { Ok(()) }
    }

    /// The image's size in bytes, as the cluster has it now (blocks on the cluster).
    pub fn size(&self) -> Result<u64, c_int> {
        let lib = library().map_err(|_| -libc::ENOSYS)?;
        let mut size = 0u64;
        // SAFETY: a live image; writes one u64.
        let rc = unsafe { lib.rbd_get_size(self.handle, &mut size) };
        if rc < 0 { Err(rc) } else { Ok(size) }
    }

    /// Resize the image (blocks on the cluster).
    pub fn resize(&self, bytes: u64) -> Result<(), c_int> {
        let lib = library().map_err(|_| -libc::ENOSYS)?;
        // SAFETY: a live image.
        let rc = unsafe { lib.rbd_resize(self.handle, bytes) };
        if rc < 0 { Err(rc) } else { Ok(()) }
    }

    /// Whether this gateway holds the image's exclusive lock now (false without the
    /// feature).
    pub fn owns_lock(&self) -> bool {
        if self.features & u64::from(sys::RBD_FEATURE_EXCLUSIVE_LOCK) == 0 {
            return false;
        }
        let Ok(lib) = library() else { return false };
        let mut owner: c_int = 0;
        // SAFETY: a live image; writes one int.
        let rc = unsafe { lib.rbd_is_exclusive_lock_owner(self.handle, &mut owner) };
        rc == 0 && owner != 0
    }

    /// Have `w` count the image's header updates (resizes by anyone).
    pub fn watch(&mut self, w: Arc<SizeWatch>) -> Result<(), c_int> {
        let lib = library().map_err(|_| -libc::ENOSYS)?;
        let arg = Box::into_raw(Box::new(w));
        let mut h = 0u64;
        // SAFETY: a live image; `arg` stays valid until unwatch (Drop) returns.
        let rc = unsafe { lib.rbd_update_watch(self.handle, &mut h, Some(on_update), arg.cast()) };
        if rc < 0 {
            // SAFETY: not registered: ours again.
            drop(unsafe { Box::from_raw(arg) });
            return Err(rc);
        }
        self.watch = Some((h, arg));
        Ok(())
    }
}

impl Drop for Image {
    /// Blocks on the cluster (closing flushes the cache and releases the lock): the backend
    /// drops its image on a closer thread, never on a reactor.
    fn drop(&mut self) {
        let Ok(lib) = library() else { return };
        if let Some((h, arg)) = self.watch.take() {
            // SAFETY: a live image and the handle rbd_update_watch gave.
            let rc = unsafe { lib.rbd_update_unwatch(self.handle, h) };
            if rc == 0 {
                // SAFETY: no callback runs after unwatch returned: the box is ours.
                drop(unsafe { Box::from_raw(arg) });
            } else {
                warn!(
                    rc,
                    "rbd_update_unwatch failed: its callback's state is leaked, not freed"
                );
            }
        }
        // SAFETY: no channel submits any more (each holds the backend, whose drop is ours)
        // and every completion was reaped or its buffers leaked (RbdChannel::drop).
        let rc = unsafe { lib.rbd_close(self.handle) };
        if rc < 0 {
            warn!(rc, "rbd_close failed");
        }
        // SAFETY: the image on it is closed.
        unsafe { lib.rados_ioctx_destroy(self.ioctx) };
        debug!(id = %self.id, "rbd image closed");
    }
}
