//! File and block-device namespaces: one io_uring per reactor (a channel, like an SSD queue
//! pair), O_DIRECT by default with aligned buffers from the channel's pool.
//!
//! Flush is fdatasync, FUA is RWF_DSYNC, Write Zeroes is fallocate(ZERO_RANGE), deallocate is
//! fallocate(PUNCH_HOLE) (reads back zeroes). Completions are reaped from the ring in memory
//! when polling and through a registered eventfd in interrupt mode. Where io_uring is not
//! available (an old kernel, a seccomp filter) the channel hands its commands to a worker
//! thread instead, so a reactor never blocks on the file.

use std::alloc::Layout;
use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crossbeam_queue::SegQueue;
use io_uring::{IoUring, opcode, types};
use pollux_nvme::spec::Status;
use pollux_reactor::sys::EventFd;
use pollux_reactor::{ChannelKey, LatencyModel, Progress, Reactor};
use tracing::{debug, info, warn};

use super::{
    Backend, BlockOp, Caps, Channel, ChannelEnv, CompleteFn, Completion, ReadData, Tag, WriteData, account_completion,
};
use crate::error::TargetError;
use crate::subsystem::Namespace;

/// Buffer alignment for O_DIRECT (covers 512- and 4096-byte logical blocks).
pub const ALIGN: usize = 4096;
const RING_ENTRIES: u32 = 256;
const EXACT_GAP: Duration = Duration::from_micros(5);
/// How long a held lock on the backing store is retried at open (see `FileDisk::open`).
const LOCK_WAIT: Duration = Duration::from_secs(3);

/// An open, locked backing file or block device.
#[derive(Debug)]
pub struct FileDisk {
    /// The open file.
    pub file: File,
    /// Its path.
    pub path: PathBuf,
    /// Size in bytes.
    pub len: u64,
    /// Opened with O_DIRECT.
    pub direct: bool,
    /// A block device rather than a regular file.
    pub block_device: bool,
    /// Its channels reach it through io_uring (probed at open; cleared if a channel could
    /// not make a ring and fell back to a worker thread).
    pub uring: Arc<AtomicBool>,
    /// Starts and unsafe shutdowns of this store under pollux (None: the store keeps no
    /// extended attributes, e.g. a block device).
    pub record: Option<ShutdownRecord>,
}

/// The extended attribute that records a store's starts and unsafe shutdowns.
const RECORD_XATTR: &std::ffi::CStr = c"user.pollux.shutdowns";

/// How often pollux opened a store, and how often it did not close it cleanly (SMART Power
/// Cycles and Unsafe Shutdowns, NVMe 2.0 §5.16.1.3): kept in an extended attribute of the
/// file, `open` while pollux serves it and `clean` once it closed it. Found `open` at start,
/// the last run ended without closing it (killed, crashed, power lost).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShutdownRecord {
    /// Opens by pollux, this one included.
    pub starts: u64,
    /// Opens that found the store still marked open.
    pub unsafe_shutdowns: u64,
}

impl ShutdownRecord {
    fn parse(v: &str) -> Option<(Self, bool)> {
        let mut it = v.split_whitespace();
        if it.next()? != "v1" {
            return None;
        }
        let starts = it.next()?.strip_prefix("starts=")?.parse().ok()?;
        let unsafe_shutdowns = it.next()?.strip_prefix("unsafe=")?.parse().ok()?;
        let open = match it.next()? {
            "open" => true,
            "clean" => false,
            _ => return None,
        };
        Some((
            Self {
                starts,
                unsafe_shutdowns,
            },
            open,
        ))
    }

    fn write(&self, fd: std::os::fd::RawFd, open: bool) -> std::io::Result<()> {
        let v = format!(
            "v1 starts={} unsafe={} {}",
            self.starts,
            self.unsafe_shutdowns,
            if open { "open" } else { "clean" }
        );
        // SAFETY: fsetxattr reads `v.len()` bytes from `v` and the NUL-terminated name, both
        // live for the call; fd is ours.
        let rc = unsafe { libc::fsetxattr(fd, RECORD_XATTR.as_ptr(), v.as_ptr().cast(), v.len(), 0) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Read the record of `file`, count this start (and an unsafe shutdown if it was left
    /// open) and mark it open. None where the store has no extended attributes.
    fn start(file: &File) -> Option<Self> {
        let fd = file.as_raw_fd();
        let mut buf = [0u8; 128];
        // SAFETY: fgetxattr writes at most `buf.len()` bytes into `buf`; fd is ours.
        let n = unsafe { libc::fgetxattr(fd, RECORD_XATTR.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        // No record yet (or one pollux cannot read): a store never opened by pollux.
        let (mut rec, was_open) = usize::try_from(n)
            .ok()
            .and_then(|n| std::str::from_utf8(&buf[..n]).ok())
            .and_then(Self::parse)
            .unwrap_or((
                Self {
                    starts: 0,
                    unsafe_shutdowns: 0,
                },
                false,
            ));
        rec.starts += 1;
        if was_open {
            rec.unsafe_shutdowns += 1;
        }
        match rec.write(fd, true) {
            Ok(()) => Some(rec),
            Err(e) => {
                debug!(error = %e, "no extended attributes on this store: its unsafe shutdowns are not counted");
                None
            }
        }
    }
}

impl Drop for FileDisk {
    fn drop(&mut self) {
        if let Some(r) = &self.record
            && let Err(e) = r.write(self.file.as_raw_fd(), false)
        {
            warn!(path = %self.path.display(), error = %e, "could not mark the store closed cleanly");
        }
    }
}

fn block_device_size(f: &File) -> std::io::Result<u64> {
    // BLKGETSIZE64 = _IOR(0x12, 114, size_t)
    const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
    let mut size: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which points to `size`.
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), BLKGETSIZE64, &mut size as *mut u64) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(size)
}

impl FileDisk {
    /// Open (creating a regular file of `size` if it is missing), lock and size-check the
    /// backing store; `shared`: other pollux targets serve it too (a shared lock). Errors
    /// are sentences for the operator.
    pub fn open(
        path: &Path,
        size: Option<u64>,
        direct: bool,
        shared: bool,
        block_size: u32,
    ) -> Result<Self, TargetError> {
        let path_buf = || path.to_path_buf();
        let io = |what: &'static str| {
            move |source| TargetError::FileIo {
                path: path.to_path_buf(),
                what,
                source,
            }
        };
        let exists = path.exists();
        if !exists && size.is_none() {
            return Err(TargetError::FileMissing { path: path_buf() });
        }
        let mut opts = OpenOptions::new();
        opts.read(true).write(true).create(!exists);
        if direct {
            opts.custom_flags(libc::O_DIRECT);
        }
        let file = opts.open(path).map_err(|e| {
            if e.raw_os_error() == Some(libc::EINVAL) && direct {
                TargetError::FileNoDirect { path: path_buf() }
            } else {
                io("cannot open")(e)
            }
        })?;
        // One pollux per backing store, unless every one that opens it says it is shared: a
        // second pollux that does not know of the first would corrupt it, while targets
        // exporting one subsystem over shared storage write it through the hosts' multipath,
        // which sends each write down one path (pollux caches no data, so each sees the
        // others' writes). A shared lock keeps out a pollux that wants it alone, and the
        // other way round. A pollux that was just killed may still hold the lock for a
        // moment after its process is gone: the kernel drops the file (and its lock) only
        // once the io_uring requests it had in flight, an fdatasync say, have finished. So a
        // held lock is retried for a short while before it counts as another process's.
        let lock = if shared { libc::LOCK_SH } else { libc::LOCK_EX };
        let deadline = Instant::now() + LOCK_WAIT;
        loop {
            // SAFETY: flock on our own open fd; no memory is involved.
            if unsafe { libc::flock(file.as_raw_fd(), lock | libc::LOCK_NB) } == 0 {
                break;
            }
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(io("cannot lock")(e));
            }
            if Instant::now() >= deadline {
                return Err(TargetError::FileLocked { path: path_buf() });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let meta = file.metadata().map_err(io("cannot read its metadata"))?;
        let block_device = meta.file_type().is_block_device();
        let len = if block_device {
            block_device_size(&file).map_err(io("cannot read the device size"))?
        } else if !exists {
            let want = size.unwrap_or(0);
            file.set_len(want).map_err(io("cannot size the new file"))?;
            info!(path = %path.display(), bytes = want, "created the backing file");
            want
        } else if meta.is_file() {
            meta.len()
        } else {
            return Err(TargetError::FileKind { path: path_buf() });
        };
        if len == 0 || len % u64::from(block_size) != 0 {
            return Err(TargetError::FileSize {
                path: path_buf(),
                size: len,
                block_size,
            });
        }
        if let Some(s) = size
            && exists
            && s != len
        {
            warn!(path = %path.display(), conf = s, actual = len, "the conf size differs from the file's: serving the file's");
        }
        // The same probe a channel makes: an old kernel or a seccomp filter refuses io_uring
        // for the whole process. Said once here, at start, rather than at the first I/O.
        let uring = match IoUring::new(2) {
            Ok(_) => true,
            Err(e) => {
                warn!(path = %path.display(), error = %e, "io_uring is unavailable: this file namespace uses a worker thread per reactor");
                false
            }
        };
        // The record counts one pollux's starts: with several serving the store, each would
        // find it marked open by another and count an unsafe shutdown.
        let record = if shared { None } else { ShutdownRecord::start(&file) };
        if let Some(r) = record
            && r.unsafe_shutdowns > 0
            && r.starts > 1
        {
            info!(path = %path.display(), starts = r.starts, unsafe_shutdowns = r.unsafe_shutdowns, "the store was not closed cleanly before (counted in SMART Unsafe Shutdowns)");
        }
        info!(path = %path.display(), bytes = len, direct, shared, io = if uring { "io_uring" } else { "worker thread" }, "file namespace opened");
        Ok(Self {
            record,
            file,
            path: path.to_path_buf(),
            len,
            direct,
            block_device,
            uring: Arc::new(AtomicBool::new(uring)),
        })
    }
}

impl Backend for FileDisk {
    fn kind(&self) -> &'static str {
        "file"
    }

    fn shutdown_record(&self) -> Option<(u64, u64)> {
        self.record.map(|r| (r.starts, r.unsafe_shutdowns))
    }

    fn len(&self) -> u64 {
        self.len
    }

    fn io_path(&self) -> &'static str {
        if self.uring.load(Ordering::Relaxed) {
            "io_uring"
        } else {
            "worker thread"
        }
    }

    /// The page cache (and the device's own cache below it) holds writes until a Flush.
    fn caps(&self) -> Caps {
        Caps {
            volatile_cache: true,
            dma_data: false,
            inline_reads: false,
            copy_offload: None,
            compare_and_write: None,
        }
    }

    fn open_channel(&self, ns: &Arc<Namespace>, env: &ChannelEnv) -> Result<Box<dyn Channel>, TargetError> {
        let ch = FileChannel::new(ns.clone(), self.file.as_raw_fd(), &self.uring, env).map_err(|source| {
            TargetError::FileIo {
                path: self.path.clone(),
                what: "cannot open a channel (io_uring or its worker thread)",
                source,
            }
        })?;
        Ok(Box::new(ch))
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// A heap buffer aligned for O_DIRECT.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    cap: usize,
}

// SAFETY: the buffer is owned uniquely; moving it between threads moves the ownership.
unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    fn new(cap: usize) -> Self {
        let cap = cap.max(ALIGN).next_multiple_of(ALIGN);
        let layout = Layout::from_size_align(cap, ALIGN).unwrap_or(Layout::new::<u8>());
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(p).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        Self { ptr, cap }
    }

    /// The first `len` bytes (len <= capacity).
    pub fn slice(&self, len: usize) -> &[u8] {
        // SAFETY: the allocation holds `cap` initialised bytes and len is clamped to it.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), len.min(self.cap)) }
    }

    fn slice_mut(&mut self, len: usize) -> &mut [u8] {
        // SAFETY: as above, and we own the buffer exclusively.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), len.min(self.cap)) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = Layout::from_size_align(self.cap, ALIGN).unwrap_or(Layout::new::<u8>());
        // SAFETY: allocated in new() with this same layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) };
    }
}

/// One operation on the backing file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileOp {
    /// Read `len` bytes at `off` into the command's buffer.
    Read {
        /// Byte offset.
        off: u64,
        /// Length.
        len: u32,
    },
    /// Write the command's buffer at `off`; `fua`: durable on completion (RWF_DSYNC).
    Write {
        /// Byte offset.
        off: u64,
        /// Length.
        len: u32,
        /// Force unit access.
        fua: bool,
    },
    /// fdatasync.
    Flush,
    /// fallocate(ZERO_RANGE).
    Zero {
        /// Byte offset.
        off: u64,
        /// Length.
        len: u64,
    },
    /// fallocate(PUNCH_HOLE).
    Deallocate {
        /// Byte offset.
        off: u64,
        /// Length.
        len: u64,
    },
}

impl FileOp {
    fn is_read(&self) -> bool {
        matches!(self, FileOp::Read { .. })
    }
    fn len(&self) -> u32 {
        match *self {
            FileOp::Read { len, .. } | FileOp::Write { len, .. } => len,
            _ => 0,
        }
    }
}

struct Cmd {
    tag: Tag,
    buf: Option<AlignedBuf>,
    read_len: u32,
    pending: u32,
    status: Status,
    submitted: Instant,
    class: usize,
    /// The host aborted it: it completes with Command Aborted Requested, however its
    /// operations end.
    aborted: bool,
}

/// The user data of an io_uring cancellation (no command's key: slab keys stay far below).
const CANCEL_USER_DATA: u64 = u64::MAX;

/// Work for the fallback worker thread.
struct Job {
    key: usize,
    op: FileOp,
    buf: Option<AlignedBuf>,
}

struct Done {
    key: usize,
    res: i64,
    buf: Option<AlignedBuf>,
}

enum Engine {
    Ring(Box<IoUring>),
    Worker {
        jobs: std::sync::mpsc::Sender<Job>,
        done: Arc<SegQueue<Done>>,
    },
}

/// One reactor's channel on a file namespace.
pub struct FileChannel {
    /// The namespace: its address is the channel's key, so it must outlive the channel.
    ns: Arc<Namespace>,
    fd: RawFd,
    engine: Engine,
    efd: Arc<EventFd>,
    cmds: slab::Slab<Cmd>,
    pool: Vec<AlignedBuf>,
    max_io: usize,
    complete: CompleteFn,
    model: LatencyModel,
    /// Its key in the reactor's device load.
    key: ChannelKey,
    last_poll: Instant,
    name: String,
}

fn errno_status(op_is_read: bool) -> Status {
    if op_is_read {
        Status::UNRECOVERED_READ_ERROR
    } else {
        Status::WRITE_FAULT
    }
}

/// fallocate(mode | KEEP_SIZE): the file never grows past the namespace.
fn fallocate(fd: RawFd, mode: libc::c_int, off: u64, len: u64) -> i64 {
    // SAFETY: a plain syscall on our own fd; no memory is passed.
    unsafe { libc::fallocate(fd, mode | libc::FALLOC_FL_KEEP_SIZE, off as i64, len as i64) as i64 }
}

fn run_job(fd: RawFd, job: &mut Job) -> i64 {
    let ret = match job.op {
        FileOp::Read { off, len } => {
            let Some(b) = job.buf.as_mut() else {
                return -i64::from(libc::EINVAL);
            };
            let s = b.slice_mut(len as usize);
            // SAFETY: reads at most s.len() bytes into the buffer we own.
            unsafe { libc::pread(fd, s.as_mut_ptr().cast(), s.len(), off as libc::off_t) as i64 }
        }
        FileOp::Write { off, len, fua } => {
            let Some(b) = job.buf.as_ref() else {
                return -i64::from(libc::EINVAL);
            };
            let s = b.slice(len as usize);
            let iov = libc::iovec {
                iov_base: s.as_ptr() as *mut libc::c_void,
                iov_len: s.len(),
            };
            let flags = if fua { libc::RWF_DSYNC } else { 0 };
            // SAFETY: one iovec over our own buffer; the kernel only reads it.
            unsafe { libc::pwritev2(fd, &iov, 1, off as libc::off_t, flags) as i64 }
        }
        // SAFETY: plain syscalls on our fd.
        FileOp::Flush => unsafe { libc::fdatasync(fd) as i64 },
        FileOp::Zero { off, len } => fallocate(fd, libc::FALLOC_FL_ZERO_RANGE, off, len),
        FileOp::Deallocate { off, len } => fallocate(fd, libc::FALLOC_FL_PUNCH_HOLE, off, len),
    };
    if ret < 0 {
        -i64::from(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO))
    } else {
        ret
    }
}

impl FileChannel {
    /// A channel for `ns` (a file namespace) on reactor `reactor`.
    pub fn new(ns: Arc<Namespace>, fd: RawFd, uring: &AtomicBool, env: &ChannelEnv) -> std::io::Result<Self> {
        let (reactor, max_io, model, complete) = (env.reactor, env.max_io, env.model.clone(), env.complete);
        let efd = Arc::new(EventFd::new()?);
        let ring = if uring.load(Ordering::Relaxed) {
            IoUring::new(RING_ENTRIES)
        } else {
            Err(std::io::Error::from(std::io::ErrorKind::Unsupported))
        };
        let engine = match ring {
            Ok(ring) => {
                ring.submitter().register_eventfd(efd.as_raw_fd())?;
                Engine::Ring(Box::new(ring))
            }
            Err(e) => {
                if uring.swap(false, Ordering::Relaxed) {
                    warn!(error = %e, reactor, "io_uring failed for a channel: this file namespace now uses worker threads");
                }
                let (tx, rx) = std::sync::mpsc::channel::<Job>();
                let done = Arc::new(SegQueue::new());
                let (d, e2) = (done.clone(), efd.clone());
                std::thread::Builder::new()
                    .name(format!("file-worker-{reactor}"))
                    .spawn(move || {
                        while let Ok(mut job) = rx.recv() {
                            let res = run_job(fd, &mut job);
                            d.push(Done {
                                key: job.key,
                                res,
                                buf: job.buf,
                            });
                            let _ = e2.notify();
                        }
                    })?;
                Engine::Worker { jobs: tx, done }
            }
        };
        Ok(Self {
            name: format!("file-ns{}-r{reactor}", ns.nsid),
            ns,
            fd,
            engine,
            efd,
            cmds: slab::Slab::new(),
            pool: Vec::new(),
            max_io: max_io as usize,
            complete,
            model,
            key: env.key,
            last_poll: Instant::now(),
        })
    }

    fn take_buf(&mut self) -> AlignedBuf {
        self.pool.pop().unwrap_or_else(|| AlignedBuf::new(self.max_io))
    }

    /// Submit the operations of one command; it completes when all of them have.
    fn submit_ops(&mut self, r: &mut Reactor, tag: Tag, ops: &[FileOp], data: Option<&[u8]>) -> Result<(), Status> {
        if ops.is_empty() {
            return Err(Status::INTERNAL_ERROR);
        }
        let first = ops[0];
        let needs_buf = ops
            .iter()
            .any(|o| matches!(o, FileOp::Read { .. } | FileOp::Write { .. }));
        let mut buf = needs_buf.then(|| self.take_buf());
        if let (Some(b), Some(d)) = (buf.as_mut(), data) {
            let n = d.len().min(b.cap);
            b.slice_mut(n).copy_from_slice(&d[..n]);
        }
        let key = self.cmds.insert(Cmd {
            tag,
            buf: None,
            read_len: if first.is_read() { first.len() } else { 0 },
            pending: ops.len() as u32,
            status: Status::SUCCESS,
            submitted: Instant::now(),
            class: LatencyModel::class(first.is_read(), first.len()),
            aborted: false,
        });
        r.device_load().outstanding += 1;
        match &mut self.engine {
            Engine::Ring(ring) => {
                for op in ops {
                    let fd = types::Fd(self.fd);
                    let ptr = buf.as_mut().map_or(std::ptr::null_mut(), |b| b.ptr.as_ptr());
                    let sqe = match *op {
                        FileOp::Read { off, len } => opcode::Read::new(fd, ptr, len).offset(off).build(),
                        FileOp::Write { off, len, fua } => opcode::Write::new(fd, ptr, len)
                            .offset(off)
                            .rw_flags(if fua { libc::RWF_DSYNC } else { 0 })
                            .build(),
                        FileOp::Flush => opcode::Fsync::new(fd).flags(types::FsyncFlags::DATASYNC).build(),
                        FileOp::Zero { off, len } => opcode::Fallocate::new(fd, len)
                            .offset(off)
                            .mode(libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE)
                            .build(),
                        FileOp::Deallocate { off, len } => opcode::Fallocate::new(fd, len)
                            .offset(off)
                            .mode(libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE)
                            .build(),
                    }
                    .user_data(key as u64);
                    // SAFETY: the buffer the SQE points to is kept in `cmds[key]` (moved below,
                    // its heap address unchanged) until the completion of every SQE of the
                    // command, so the kernel never sees freed memory.
                    while unsafe { ring.submission().push(&sqe) }.is_err() {
                        ring.submit().map_err(|_| Status::INTERNAL_ERROR)?;
                    }
                }
                if let Some(c) = self.cmds.get_mut(key) {
                    c.buf = buf;
                }
                if let Err(e) = ring.submit() {
                    warn!(channel = %self.name, error = %e, "io_uring submit failed");
                }
            }
            Engine::Worker { jobs, .. } => {
                // The worker owns the buffer while it works and hands it back.
                for (i, op) in ops.iter().enumerate() {
                    let b = if i == 0 { buf.take() } else { None };
                    if jobs.send(Job { key, op: *op, buf: b }).is_err() {
                        return Err(Status::INTERNAL_ERROR);
                    }
                }
            }
        }
        Ok(())
    }

    fn finish_one(
        &mut self,
        r: &mut Reactor,
        key: usize,
        res: i64,
        buf: Option<AlignedBuf>,
        now: Instant,
        exact: bool,
    ) -> bool {
        let Some(c) = self.cmds.get_mut(key) else { return false };
        if buf.is_some() {
            c.buf = buf;
        }
        let is_read = c.read_len > 0;
        if c.aborted {
            // Cancelled (-ECANCELED) or run to its end before the cancellation reached it:
            // either way the host was told it is aborted.
            c.status = Status::ABORT_REQUESTED;
        } else if res < 0 {
            let err = std::io::Error::from_raw_os_error((-res) as i32);
            warn!(channel = %self.name, error = %err, "I/O error on the backing file");
            c.status = errno_status(is_read);
        } else if is_read && (res as u64) < u64::from(c.read_len) {
            c.status = Status::UNRECOVERED_READ_ERROR;
        }
        c.pending -= 1;
        if c.pending > 0 {
            return false;
        }
        let c = self.cmds.remove(key);
        account_completion(
            r,
            self.key,
            &mut self.model,
            c.class,
            now.saturating_duration_since(c.submitted),
            exact,
        );
        let data = (is_read && c.status.is_success())
            .then(|| c.buf.as_ref().map(|b| ReadData::Bytes(b.slice(c.read_len as usize))))
            .flatten();
        let done = Completion {
            tag: c.tag,
            status: c.status,
            data,
        };
        (self.complete)(r, done);
        if let Some(b) = c.buf {
            self.pool.push(b);
        }
        true
    }
}

impl Channel for FileChannel {
    fn name(&self) -> &str {
        &self.name
    }

    /// Write data is copied into an aligned buffer of the channel (O_DIRECT); read data
    /// comes back with the completion.
    fn submit(&mut self, r: &mut Reactor, tag: Tag, _ns: &Namespace, op: BlockOp<'_>) -> Result<(), Status> {
        let mut ops: Vec<FileOp> = Vec::with_capacity(1);
        let mut payload: Option<&[u8]> = None;
        match op {
            BlockOp::Read { off, len } => ops.push(FileOp::Read { off, len }),
            BlockOp::Write {
                off,
                data: WriteData::Bytes(data),
                fua,
            } => {
                ops.push(FileOp::Write {
                    off,
                    len: data.len() as u32,
                    fua,
                });
                payload = Some(data);
            }
            // DMA buffers come from NVMe channels only.
            BlockOp::Write { .. } => return Err(Status::INTERNAL_ERROR),
            BlockOp::WriteZeroes { off, len } => ops.push(FileOp::Zero { off, len }),
            BlockOp::Deallocate { ranges } => {
                ops.extend(ranges.iter().map(|&(off, len)| FileOp::Deallocate { off, len }));
            }
            BlockOp::Flush => ops.push(FileOp::Flush),
            // No copy offload (Caps::copy_offload): a Copy is read and written through pollux.
            BlockOp::Copy { .. } | BlockOp::CompareAndWrite { .. } => return Err(Status::INTERNAL_ERROR),
        }
        self.submit_ops(r, tag, &ops, payload)
    }

    /// io_uring cancels what has not reached the file yet (IORING_OP_ASYNC_CANCEL); what
    /// has (an O_DIRECT transfer in the block layer, a job in the worker thread) runs to its
    /// end. Either way the command completes with Command Aborted Requested and no data.
    fn abort(&mut self, _r: &mut Reactor, tag: Tag) -> bool {
        let Some((key, c)) = self.cmds.iter_mut().find(|(_, c)| c.tag == tag && !c.aborted) else {
            return false;
        };
        c.aborted = true;
        if let Engine::Ring(ring) = &mut self.engine {
            let cancel = opcode::AsyncCancel::new(key as u64).build().user_data(CANCEL_USER_DATA);
            // SAFETY: a cancellation carries no buffer: it names another entry by user data.
            let queued = unsafe { ring.submission().push(&cancel) }.is_ok();
            if !queued || ring.submit().is_err() {
                warn!(channel = %self.name, "could not queue an io_uring cancellation; the aborted command runs to its end");
            }
        }
        true
    }

    fn interrupt_fd(&self) -> Option<RawFd> {
        Some(self.efd.as_raw_fd())
    }

    fn polling(&self) -> pollux_reactor::Polling {
        self.ns.polling.get()
    }

    fn outstanding(&self) -> usize {
        self.cmds.len()
    }

    fn poll(&mut self, r: &mut Reactor) -> Progress {
        self.efd.drain();
        let now = Instant::now();
        let exact = now.duration_since(self.last_poll) <= EXACT_GAP;
        self.last_poll = now;
        let mut done: VecDeque<(usize, i64, Option<AlignedBuf>)> = VecDeque::new();
        match &mut self.engine {
            Engine::Ring(ring) => {
                for cqe in ring.completion() {
                    if cqe.user_data() != CANCEL_USER_DATA {
                        done.push_back((cqe.user_data() as usize, i64::from(cqe.result()), None));
                    }
                }
            }
            Engine::Worker { done: q, .. } => {
                while let Some(d) = q.pop() {
                    done.push_back((d.key, d.res, d.buf));
                }
            }
        }
        let did = !done.is_empty();
        for (key, res, buf) in done {
            self.finish_one(r, key, res, buf, now, exact);
        }
        Progress {
            did_work: did,
            next: self
                .model
                .next_run(self.cmds.iter().map(|(_, c)| (c.submitted, c.class))),
        }
    }

    fn shutdown(&mut self) {
        // Wait for what the kernel still holds buffers of, so none is freed under it.
        if let Engine::Ring(ring) = &mut self.engine {
            let deadline = Instant::now() + Duration::from_secs(5);
            while !self.cmds.is_empty() && Instant::now() < deadline {
                let _ = ring.submit_and_wait(1);
                let keys: Vec<usize> = ring.completion().map(|c| c.user_data() as usize).collect();
                for k in keys {
                    if let Some(c) = self.cmds.get_mut(k) {
                        c.pending = c.pending.saturating_sub(1);
                        if c.pending == 0 {
                            self.cmds.remove(k);
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn open_creates_sizes_locks_and_refuses_bad_input() {
        let dir = std::env::temp_dir().join(format!("pollux-file-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let p = dir.join("disk.img");
        let _ = std::fs::remove_file(&p);
        let e = FileDisk::open(&p, None, false, false, 512).unwrap_err().to_string();
        assert!(e.contains("does not exist"), "{e}");
        let d = FileDisk::open(&p, Some(1 << 20), false, false, 512).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(d.len, 1 << 20);
        // A second opener (another pollux) is refused while the first holds the lock.
        let e = FileDisk::open(&p, None, false, false, 512).unwrap_err().to_string();
        assert!(e.contains("already in use"), "{e}");
        drop(d);
        let d = FileDisk::open(&p, None, false, false, 512).unwrap_or_else(|e| panic!("{e}"));
        drop(d);
        // Shared: several openers that all say so; one that wants the store alone is refused.
        let a = FileDisk::open(&p, None, false, true, 512).unwrap_or_else(|e| panic!("{e}"));
        let b = FileDisk::open(&p, None, false, true, 512).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            a.record.is_none() && b.record.is_none(),
            "no shutdown record for a shared store"
        );
        let e = FileDisk::open(&p, None, false, false, 512).unwrap_err().to_string();
        assert!(e.contains("already in use") && e.contains("shared = true"), "{e}");
        drop((a, b));
        std::fs::write(dir.join("odd.img"), vec![0u8; 1000]).unwrap_or_else(|e| panic!("{e}"));
        let e = FileDisk::open(&dir.join("odd.img"), None, false, false, 512)
            .unwrap_err()
            .to_string();
        assert!(e.contains("multiple of the block size"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
