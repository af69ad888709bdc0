//! Ceph RBD images: pollux as a gateway to a distributed store (SPDK: `module/bdev/rbd`;
//! the Ceph NVMe-oF gateway builds on it).
//!
//! librbd is loaded at run time ([`client::library`], from bindgen's dynamic-loading
//! bindings in [`sys`]): building pollux never needs Ceph, and an rbd namespace on a machine
//! without librbd fails to open with an error naming the library while the rest serves.
//!
//! One image handle per namespace, shared by the reactors. librbd's handles are
//! thread-safe, and a handle per reactor would make the reactors of one gateway separate
//! clients of the image: with the exclusive-lock feature (on by default) their writes
//! would pass the lock back and forth between them. Each reactor has its own channel:
//! its commands' `rbd_aio_*` completions carry a pointer to that channel's inbox, and the
//! completion callback (on librbd's thread) only pushes the finished operation onto the
//! inbox's lock-free queue and writes its eventfd. The reactor drains the queue when it
//! polls (busy-poll, hybrid) or when the eventfd wakes it (interrupt), so every mode works
//! and the adaptive policy sees librbd's latency like any device's. This is librbd's
//! `rbd_set_image_notification` mechanism with the queue per reactor instead of per image:
//! with one notification eventfd per image, every reactor would be woken for every other
//! reactor's completions.
//!
//! Connecting, opening, closing and resizing block on the cluster: they run on the thread
//! that opens the namespace (start, a control client) and on a closer thread, never on a
//! reactor. Every wait is bounded by `op_timeout_s` (librados' op timeouts; the open also
//! waits at most twice that long for its thread); a command still unanswered twice that
//! long after its submission completes with Namespace Not Ready (retryable) anyway, so the
//! host retries rather than times out.

pub mod client;
#[rustfmt::skip]
pub mod sys;
mod channel;
pub mod group_object;
mod object;
pub mod resv_object;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pollux_conf::{DerivedIds, RbdBackend};
use tracing::{info, warn};

use super::{Backend, Caps, Channel, ChannelEnv, ChannelNs};
use crate::counter::bump;
use crate::error::StoreError;
use channel::RbdChannel;
use client::{Cluster, Image, SizeWatch, library, rbd_error};

/// What librbd compares and writes atomically: one sector (`ImageCompareAndWriteRequest`'s
/// limit in Ceph Pacific).
const CAW_UNIT: u64 = 512;
/// How often a channel with commands in flight runs even without a completion: it answers
/// the commands the cluster has kept past their bound.
const WATCHDOG: Duration = Duration::from_millis(250);
/// How often at most an image whose operations fail as a deleted one's is looked for.
const VANISH_CHECK: Duration = Duration::from_secs(2);
/// A completion seen within this long of the previous poll was seen when it happened
/// (busy polling): its latency is exact.
const EXACT_GAP: Duration = Duration::from_micros(5);

/// An operation count written by one reactor only (relaxed load + store, no locked
/// instruction), padded to a cache line so reactors never share one.
#[derive(Debug, Default)]
#[repr(align(64))]
struct ReactorOps(AtomicU64);

/// The health of a namespace's connection to its cluster, as the I/O sees it.
#[derive(Debug, Default)]
pub struct RbdHealth {
    /// Operations completed by librbd, per reactor (index: reactor id): [`RbdHealth::ops`].
    ops: Box<[ReactorOps]>,
    /// Of them, those that failed because the cluster did not answer in time or was
    /// unreachable (ETIMEDOUT, ESHUTDOWN, ...): answered with Namespace Not Ready.
    pub unavailable: AtomicU64,
    /// Other failed operations.
    pub errors: AtomicU64,
    /// Commands answered by pollux's own bound before librbd completed them.
    pub overdue: AtomicU64,
    /// The last operation failed for the cluster's unavailability (cleared by a success).
    pub degraded: AtomicBool,
    /// An operation failed as it would had the image been deleted (the client blocklisted,
    /// whereupon an image loses its watch and `rbd rm` may remove it; or ENOENT): the
    /// image's existence is checked off the reactors ([`RbdDisk::vanished`]).
    pub maybe_gone: AtomicBool,
}

impl RbdHealth {
    fn new(reactors: usize) -> Self {
        Self {
            ops: (0..reactors.max(1)).map(|_| ReactorOps::default()).collect(),
            ..Self::default()
        }
    }

    /// Operations librbd completed, all reactors together.
    pub fn ops(&self) -> u64 {
        self.ops.iter().map(|o| o.0.load(Ordering::Relaxed)).sum()
    }

    /// One more completed on reactor `reactor` (only that reactor calls this for it).
    fn count_op(&self, reactor: usize) {
        bump(&self.ops[reactor % self.ops.len()].0, 1);
    }

    /// The cluster answered: healthy again. Written only on a change, so that reactors
    /// completing operations do not pass the flag's cache line between them.
    fn answered(&self) {
        if self.degraded.load(Ordering::Relaxed) {
            self.degraded.store(false, Ordering::Relaxed);
        }
    }
}

/// An RBD image served as a namespace.
#[derive(Debug)]
pub struct RbdDisk {
    /// The conf that opened it.
    pub conf: RbdBackend,
    /// None once closed ([`RbdDisk::close`]). Locked only to open a channel or close.
    image: Mutex<Option<Arc<Image>>>,
    /// Its size as last read (at open, a resize, a header update).
    len: AtomicU64,
    /// The watch's update count when the size was last read.
    seen_updates: AtomicU64,
    /// Whether this gateway held the exclusive lock when last asked ([`RbdDisk::owns_lock`]).
    lock_owner: Arc<AtomicBool>,
    /// A lock question is out, unanswered.
    lock_query: Arc<AtomicBool>,
    /// The cluster's fsid.
    pub fsid: String,
    /// The image's id.
    pub image_id: String,
    /// The image has the exclusive-lock feature.
    pub exclusive_lock: bool,
    /// Header updates (resizes) seen by the watch.
    pub watch: Arc<SizeWatch>,
    /// The connection's health.
    pub health: Arc<RbdHealth>,
    /// When the image's existence was last checked ([`RbdDisk::vanished`]).
    vanish_checked: Mutex<Option<Instant>>,
}

impl RbdDisk {
    /// Connect (or reuse the connection to) `b`'s cluster and open its image. Blocks on the
    /// cluster, within `op_timeout_s`.
    /// `reactors`: how many count its operations.
    pub fn open(b: &RbdBackend, block_size: u32, reactors: usize) -> Result<Self, StoreError> {
        library()?;
        let cluster = Cluster::get(b)?;
        let (mut image, len) = open_bounded(cluster, b)?;
        if len == 0 || len % u64::from(block_size) != 0 {
            return Err(rbd_error(
                b,
                format!("the image's size, {len} bytes, is not a positive multiple of the block size {block_size}"),
                -i64::from(libc::EINVAL),
            ));
        }
        let watch = Arc::new(SizeWatch::default());
        if let Err(rc) = image.watch(watch.clone()) {
            warn!(image = %b.spec(), rc, "cannot watch the image's header: a resize by another client is not noticed");
        }
        let exclusive_lock = image.features & u64::from(sys::RBD_FEATURE_EXCLUSIVE_LOCK) != 0;
        if exclusive_lock {
            // Two clients writing an image with exclusive-lock pass the lock to and fro, each
            // write waiting for the other gateway to release it. With ANA groups one
            // gateway is optimized for the namespace and the hosts write through it; the
            // others take the lock only on failover.
            info!(image = %b.spec(), "the image has exclusive-lock: write it through one gateway at a time (its optimized ANA group); writes through two gateways at once pass the lock between them");
        }
        info!(
            image = %b.spec(),
            fsid = %image.cluster.fsid,
            id = %image.id,
            bytes = len,
            write_cache = b.write_cache,
            "rbd namespace opened"
        );
        Ok(Self {
            conf: b.clone(),
            len: AtomicU64::new(len),
            seen_updates: AtomicU64::new(0),
            fsid: image.cluster.fsid.clone(),
            image_id: image.id.clone(),
            exclusive_lock,
            image: Mutex::new(Some(Arc::new(image))),
            lock_owner: Arc::new(AtomicBool::new(false)),
            lock_query: Arc::new(AtomicBool::new(false)),
            watch,
            health: Arc::new(RbdHealth::new(reactors)),
            vanish_checked: Mutex::new(None),
        })
    }

    /// The identifiers every gateway serving this image presents: derived from the
    /// cluster's fsid, the pool's id, the RADOS namespace and the image's id (which a
    /// rename keeps), never from the subsystem or nsid of one gateway's conf.
    pub fn derived_ids(&self) -> DerivedIds {
        let pool_id = self.image().map_or(0, |i| i.pool_id);
        let key = format!(
            "rbd:{}/{}/{}/{}",
            self.fsid,
            pool_id,
            self.conf.rados_namespace.as_deref().unwrap_or(""),
            self.image_id
        );
        pollux_conf::derive_ids(&key, 0)
    }

    /// Whether this gateway holds the image's exclusive lock, as last known: librbd's
    /// answer can wait on the cluster (its lock state machine), so it is asked on a thread
    /// of its own and waited for briefly; while a question is unanswered the last answer
    /// stands, and `pollux ctl subsystems` never hangs on a cluster that does not answer.
    pub fn owns_lock(&self) -> bool {
        let Some(image) = self.image() else { return false };
        if !self.lock_query.swap(true, Ordering::AcqRel) {
            let (owner, query) = (self.lock_owner.clone(), self.lock_query.clone());
            let asked = std::thread::Builder::new()
                .name("pollux-rbd-lock".into())
                .spawn(move || {
                    owner.store(image.owns_lock(), Ordering::Release);
                    query.store(false, Ordering::Release);
                });
            if asked.is_err() {
                self.lock_query.store(false, Ordering::Release);
            }
            let t0 = Instant::now();
            while self.lock_query.load(Ordering::Acquire) && t0.elapsed() < LOCK_QUERY_WAIT {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        self.lock_owner.load(Ordering::Acquire)
    }

    fn image(&self) -> Option<Arc<Image>> {
        self.image.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The image, or an error once it is closed (the target stopping).
    fn open_image(&self) -> Result<Arc<Image>, StoreError> {
        self.image()
            .ok_or_else(|| rbd_error(&self.conf, "the image is closed", -i64::from(libc::ESHUTDOWN)))
    }

    /// Close the image now (on a closer thread, once the channels that still hold it are
    /// gone: [`wait_closed`]); channels can no longer be opened on it. At stop, after the
    /// reactors: the image's exclusive lock is released before the process exits.
    pub fn close(&self) {
        drop(ImageRef(self.image.lock().unwrap_or_else(|p| p.into_inner()).take()));
    }
}

impl Drop for RbdDisk {
    /// Closing the image flushes and releases its lock on the cluster: it happens on a
    /// closer thread, whichever thread (a reactor, say) drops the namespace. Channels hold
    /// the image too; the last holder closes it ([`ImageRef`]).
    fn drop(&mut self) {
        self.close();
    }
}

/// A holder of the image that, when it is the last, closes it on a closer thread.
struct ImageRef(Option<Arc<Image>>);

impl Drop for ImageRef {
    fn drop(&mut self) {
        let Some(img) = self.0.take().and_then(Arc::into_inner) else {
            return;
        };
        close_later("an rbd image", move || drop(img));
    }
}

/// Run `close` (which blocks on the cluster) on a closer thread that [`wait_closed`]
/// waits for: never on the thread dropping the last holder, which may be a reactor.
pub(super) fn close_later(what: &str, close: impl FnOnce() + Send + 'static) {
    let spawned = std::thread::Builder::new().name("rbd-close".into()).spawn(close);
    match spawned {
        Ok(h) => CLOSERS.lock().unwrap_or_else(|p| p.into_inner()).push(h),
        Err(e) => warn!(error = %e, "cannot start a thread to close {what}: its handle is leaked"),
    }
}

/// Closer threads not yet joined.
static CLOSERS: Mutex<Vec<JoinHandle<()>>> = Mutex::new(Vec::new());

/// Wait, up to `limit`, until every image dropped so far is closed (at stop: off the
/// reactors, which have stopped).
pub fn wait_closed(limit: Duration) {
    let deadline = Instant::now() + limit;
    let mut closers = std::mem::take(&mut *CLOSERS.lock().unwrap_or_else(|p| p.into_inner()));
    while !closers.is_empty() {
        closers.retain(|h| !h.is_finished());
        if Instant::now() >= deadline {
            warn!(
                images = closers.len(),
                "rbd images still closing at exit: their exclusive locks and watches wait for the cluster to time this gateway out"
            );
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

impl Backend for RbdDisk {
    fn kind(&self) -> &'static str {
        "rbd"
    }

    /// Whether the image was deleted, asked only while the namespace is cut off from the
    /// cluster or after an operation failed as if it had been, at most every
    /// [`VANISH_CHECK`]: through a new client of the cluster (this
    /// gateway's may be blocklisted, which is how an image served with a watch can be
    /// removed at all), the image's header object by its id, which a rename or a move to
    /// the trash keeps and a removal deletes.
    fn vanished(&self, cut_off: bool) -> Option<String> {
        if !cut_off && !self.health.maybe_gone.load(Ordering::Relaxed) {
            return None;
        }
        {
            let mut at = self.vanish_checked.lock().unwrap_or_else(|p| p.into_inner());
            if at.is_some_and(|t| t.elapsed() < VANISH_CHECK) {
                return None;
            }
            *at = Some(Instant::now());
        }
        let exists = Cluster::private(&self.conf).and_then(|c| {
            client::header_exists(&c, &self.conf, &self.image_id)
                .map_err(|rc| rbd_error(&self.conf, "cannot look for the image's header", rc.into()))
        });
        match exists {
            Ok(true) => {
                self.health.maybe_gone.store(false, Ordering::Relaxed);
                None
            }
            Ok(false) => Some(format!(
                "image {} (id {}) was deleted from the cluster while served",
                self.conf.spec(),
                self.image_id
            )),
            Err(e) => {
                warn!(image = %self.conf.spec(), error = %e, "cannot tell whether the image still exists");
                None
            }
        }
    }

    fn len(&self) -> u64 {
        self.len.load(Ordering::Relaxed)
    }

    fn io_path(&self) -> &'static str {
        "librbd"
    }

    /// `rbd_resize`: other gateways and clients see the new size through their watch.
    /// Shrinking is refused: the blocks past the new end would be lost to every host.
    fn resize(&self, bytes: u64) -> Result<(), StoreError> {
        let image = self.open_image()?;
        let now = image
            .size()
            .map_err(|rc| rbd_error(&self.conf, "cannot read the image's size", rc.into()))?;
        if bytes < now {
            return Err(rbd_error(
                &self.conf,
                format!(
                    "shrinking the image from {now} to {bytes} bytes is refused: the data past {bytes} would be lost (shrink it with `rbd resize --allow-shrink` if you mean it)"
                ),
                -i64::from(libc::EINVAL),
            ));
        }
        image.resize(bytes).map_err(|rc| {
            rbd_error(
                &self.conf,
                format!("cannot resize the image to {bytes} bytes"),
                rc.into(),
            )
        })?;
        self.len.store(bytes, Ordering::Relaxed);
        info!(image = %self.conf.spec(), bytes, "rbd image resized");
        Ok(())
    }

    /// After a header update (the watch's callback counted one): the image's size now.
    fn refresh_size(&self) -> Option<u64> {
        let updates = self.watch.updates.load(Ordering::Acquire);
        if self.seen_updates.swap(updates, Ordering::AcqRel) == updates {
            return None;
        }
        let size = match self.image()?.size() {
            Ok(s) => s,
            Err(rc) => {
                warn!(image = %self.conf.spec(), rc, "cannot read the image's size after an update");
                return None;
            }
        };
        self.len.store(size, Ordering::Relaxed);
        Some(size)
    }

    /// With librbd's writeback cache a write completes once cached in this gateway:
    /// a volatile write cache, made durable by Flush (and FUA writes).
    /// Fused Compare and Write is librbd's compare-and-write, atomic in the cluster (so
    /// across gateways too), where librbd takes it: within one 512-byte sector (Pacific's
    /// librbd refuses anything longer with EINVAL; later ones take up to a stripe unit).
    /// That is the one-block Compare and Write of a 512-byte-block namespace, what VMware's
    /// ATS locking sends; longer ones are pollux's, under its range lock.
    fn caps(&self) -> Caps {
        Caps {
            volatile_cache: self.conf.write_cache,
            compare_and_write: Some(CAW_UNIT),
            ..Caps::default()
        }
    }

    fn ids(&self) -> Option<DerivedIds> {
        Some(self.derived_ids())
    }

    fn reservation_object(&self) -> Option<Result<Box<dyn crate::cluster::ClusterObject>, StoreError>> {
        let open = || -> Result<Box<dyn crate::cluster::ClusterObject>, StoreError> {
            let image = self.open_image()?;
            let o = resv_object::RadosResvObject::open(image.cluster.clone(), &self.conf, &self.image_id)?;
            Ok(Box::new(o))
        };
        Some(open())
    }

    /// Close the image (releasing its exclusive lock) before the process exits.
    fn stop(&self) {
        self.close();
    }

    fn open_channel(&self, ns: ChannelNs, env: &ChannelEnv) -> Result<Box<dyn Channel>, StoreError> {
        let image = self.open_image()?;
        let ch = RbdChannel::new(ns, image, self, env).map_err(|e| {
            rbd_error(
                &self.conf,
                format!("cannot open a channel: {e}"),
                -i64::from(libc::EMFILE),
            )
        })?;
        Ok(Box::new(ch))
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// How long `owns_lock` waits for librbd's answer before giving the last one.
const LOCK_QUERY_WAIT: Duration = Duration::from_millis(200);

/// Open `b`'s image and read its size on a thread of their own, waiting at most twice
/// `op_timeout_s`: librbd's open runs several operations in turn, each bounded by
/// librados, so their sum is not; a cluster that does not answer must not hang the start
/// or a control client. An open that completes after the wait closes its image again
/// (dropped on that thread).
fn open_bounded(cluster: Arc<Cluster>, b: &RbdBackend) -> Result<(Image, u64), StoreError> {
    let (tx, rx) = std::sync::mpsc::channel();
    let conf = b.clone();
    std::thread::Builder::new()
        .name("pollux-rbd-open".into())
        .spawn(move || {
            let opened = Image::open(cluster, &conf).and_then(|image| {
                let len = image
                    .size()
                    .map_err(|rc| rbd_error(&conf, "cannot read the image's size", rc.into()))?;
                Ok((image, len))
            });
            // The receiver gave up: the image (if any) is dropped, so closed, here.
            let _ = tx.send(opened);
        })
        .map_err(|e| {
            rbd_error(
                b,
                format!("cannot start the open thread: {e}"),
                -i64::from(libc::EAGAIN),
            )
        })?;
    let wait = Duration::from_secs(2 * u64::from(b.op_timeout_s));
    rx.recv_timeout(wait).unwrap_or_else(|_| {
        Err(rbd_error(
            b,
            format!("the cluster's OSDs did not answer the open within {} s", wait.as_secs()),
            -i64::from(libc::ETIMEDOUT),
        ))
    })
}
