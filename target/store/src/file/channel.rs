//! One reactor's channel to a file namespace: its io_uring (or, where there is none, a
//! worker thread), the commands in flight on it, and the aligned buffers O_DIRECT needs.

use std::alloc::Layout;
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, RawFd};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crossbeam_queue::SegQueue;
use io_uring::{IoUring, opcode, types};
use pollux_nvme::spec::Status;
use pollux_reactor::sys::EventFd;
use pollux_reactor::{LatencyModel, Progress, Reactor};
use tracing::warn;

use super::super::{Backend, BlockOp, Channel, ChannelEnv, ChannelNs, Completer, Completion, ReadData, Tag, WriteData};
use super::{ALIGN, EXACT_GAP, RING_ENTRIES};

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
    ns: ChannelNs,
    fd: RawFd,
    engine: Engine,
    efd: Arc<EventFd>,
    cmds: slab::Slab<Cmd>,
    pool: Vec<AlignedBuf>,
    max_io: usize,
    end: Completer,
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
    pub fn new(ns: ChannelNs, fd: RawFd, uring: &AtomicBool, env: &ChannelEnv) -> std::io::Result<Self> {
        let (reactor, max_io) = (env.reactor, env.max_io);
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
            end: Completer::new(env),
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
        let data = (is_read && c.status.is_success())
            .then(|| c.buf.as_ref().map(|b| ReadData::Bytes(b.slice(c.read_len as usize))))
            .flatten();
        let done = Completion {
            tag: c.tag,
            status: c.status,
            data,
        };
        self.end
            .finish(r, done, c.class, now.saturating_duration_since(c.submitted), exact);
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
    fn submit(&mut self, r: &mut Reactor, tag: Tag, _store: &dyn Backend, op: BlockOp<'_>) -> Result<(), Status> {
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
                .end
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
