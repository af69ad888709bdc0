//! One reactor's channel to an RBD image: its commands' `rbd_aio_*` operations, the inbox
//! librbd's completion callback pushes them onto, and the bound that answers a command the
//! cluster has not answered in time.

use std::ffi::c_void;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crossbeam_queue::SegQueue;
use pollux_nvme::spec::Status;
use pollux_reactor::sys::EventFd;
use pollux_reactor::{LatencyModel, Progress, Reactor};
use tracing::warn;

use super::super::{BlockOp, Channel, ChannelEnv, Completer, Completion, ReadData, Tag, WriteData};
use super::client::{Image, library};
use super::sys;
use super::{EXACT_GAP, ImageRef, RbdDisk, RbdHealth, WATCHDOG};
use crate::{Backend, ChannelNs};

/// Where librbd's completion callback leaves a channel's finished operations.
struct Inbox {
    done: SegQueue<usize>,
    efd: EventFd,
}

/// The argument of one operation's completion: boxed, so its address is stable while
/// librbd holds it.
struct Slot {
    inbox: Arc<Inbox>,
    aio: usize,
    /// Where librbd writes a compare-and-write's first mismatching offset.
    mismatch: u64,
}

/// librbd's completion callback, on one of librbd's threads: it only hands the operation
/// to its channel's reactor.
unsafe extern "C" fn on_complete(_c: sys::rbd_completion_t, arg: *mut c_void) {
    // SAFETY: `arg` is the Slot of a live Aio: the channel frees neither the Slot nor the
    // Aio before this operation is popped from the inbox, which happens after this push.
    let slot = unsafe { &*(arg as *const Slot) };
    slot.inbox.done.push(slot.aio);
    // A full eventfd counter only means a wake-up is already pending.
    let _ = slot.inbox.efd.notify();
}

/// One librbd operation of a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AioOp {
    Read {
        off: u64,
        len: u32,
    },
    Write {
        off: u64,
        len: u32,
    },
    Flush,
    Zero {
        off: u64,
        len: u64,
    },
    /// The command's buffer holds what to expect, then (as long) what to write.
    CompareAndWrite {
        off: u64,
        len: u32,
    },
}

/// An operation librbd holds: its completion, and the callback's argument.
struct Aio {
    cmd: usize,
    op: AioOp,
    comp: sys::rbd_completion_t,
    slot: Box<Slot>,
}

/// One command: one or more operations (a Deallocate's ranges), then perhaps a flush (a
/// FUA write through the writeback cache).
struct Cmd {
    tag: Tag,
    /// A read's destination or a write's source: librbd reads or writes it until the
    /// operation completes, so it lives here until then.
    buf: Vec<u8>,
    read_len: u32,
    pending: u32,
    then_flush: bool,
    status: Status,
    submitted: Instant,
    class: usize,
    /// Already answered by the bound ([`RbdChannel::answer_overdue`]): its operations
    /// still run, and their end only frees it.
    answered: bool,
}

impl Cmd {
    /// A command not yet started (`answered`: one nobody waits for).
    fn new(tag: Tag, buf: Vec<u8>, read_len: u32, then_flush: bool, class: usize, answered: bool) -> Self {
        Self {
            tag,
            buf,
            read_len,
            pending: 0,
            then_flush,
            status: Status::SUCCESS,
            submitted: Instant::now(),
            class,
            answered,
        }
    }
}

/// One reactor's channel on an rbd namespace.
pub struct RbdChannel {
    /// The namespace: its address is the channel's key, so it must outlive the channel.
    ns: ChannelNs,
    image: ImageRef,
    inbox: Arc<Inbox>,
    cmds: slab::Slab<Cmd>,
    aios: slab::Slab<Aio>,
    /// Slots and buffers of finished operations, reused. Boxed: a slot's address is what
    /// librbd holds, and it must not move when it goes back into an Aio.
    #[allow(clippy::vec_box)]
    free_slots: Vec<Box<Slot>>,
    free_bufs: Vec<Vec<u8>>,
    max_io: usize,
    write_cache: bool,
    /// A command unanswered this long after its submission is answered anyway.
    bound: Duration,
    end: Completer,
    health: Arc<RbdHealth>,
    /// This channel's reactor (its slot in the health's operation counts).
    reactor: usize,
    /// The operations of the command being submitted, kept so that submitting allocates
    /// nothing.
    ops: Vec<AioOp>,
    /// When the commands are next checked against the bound ([`RbdChannel::answer_overdue`]).
    next_overdue_check: Instant,
    last_poll: Instant,
    name: String,
}

/// Whether a librbd error means the cluster is (for now) unreachable or too slow, which a
/// retry later may get past: the monitor or OSDs down, a timeout, the client blocklisted
/// or its lock taken away.
fn unavailable(errno: i32) -> bool {
    matches!(
        errno,
        libc::ETIMEDOUT
            | libc::EAGAIN
            | libc::ESHUTDOWN
            | libc::ENOTCONN
            | libc::ECONNREFUSED
            | libc::ECONNRESET
            | libc::EROFS
            | libc::EBUSY
            | libc::EINTR
    )
}

impl RbdChannel {
    pub(super) fn new(ns: ChannelNs, image: Arc<Image>, disk: &RbdDisk, env: &ChannelEnv) -> std::io::Result<Self> {
        let inbox = Arc::new(Inbox {
            done: SegQueue::new(),
            efd: EventFd::new()?,
        });
        Ok(Self {
            name: format!("rbd-ns{}-r{}", ns.nsid, env.reactor),
            ns,
            image: ImageRef(Some(image)),
            inbox,
            cmds: slab::Slab::new(),
            aios: slab::Slab::new(),
            free_slots: Vec::new(),
            free_bufs: Vec::new(),
            max_io: env.max_io as usize,
            write_cache: disk.conf.write_cache,
            bound: Duration::from_secs(2 * u64::from(disk.conf.op_timeout_s)),
            end: Completer::new(env),
            health: disk.health.clone(),
            reactor: env.reactor,
            ops: Vec::with_capacity(1),
            next_overdue_check: Instant::now() + WATCHDOG,
            last_poll: Instant::now(),
        })
    }

    fn handle(&self) -> sys::rbd_image_t {
        self.image.0.as_ref().map_or(std::ptr::null_mut(), |i| i.handle)
    }

    fn take_buf(&mut self, len: usize) -> Vec<u8> {
        let mut b = self.free_bufs.pop().unwrap_or_else(|| Vec::with_capacity(self.max_io));
        b.clear();
        b.resize(len, 0);
        b
    }

    /// Start operation `op` of command `cmd`. Err: librbd refused it (a negative errno),
    /// nothing is pending for it.
    fn start(&mut self, cmd: usize, op: AioOp) -> Result<(), i32> {
        let lib = library().map_err(|_| -libc::ENOSYS)?;
        let image = self.handle();
        let entry = self.aios.vacant_entry();
        let aio = entry.key();
        let mut slot = self.free_slots.pop().unwrap_or_else(|| {
            Box::new(Slot {
                inbox: self.inbox.clone(),
                aio,
                mismatch: 0,
            })
        });
        slot.aio = aio;
        slot.mismatch = 0;
        let arg = std::ptr::from_ref::<Slot>(&slot).cast_mut().cast::<c_void>();
        let mismatch = std::ptr::from_mut::<u64>(&mut slot.mismatch);
        let mut comp: sys::rbd_completion_t = std::ptr::null_mut();
        // SAFETY: `arg` points to the boxed Slot, kept in the Aio until the completion is
        // popped from the inbox; writes the completion through the pointer.
        let rc = unsafe { lib.rbd_aio_create_completion(arg, Some(on_complete), &mut comp) };
        if rc < 0 {
            self.free_slots.push(slot);
            return Err(rc);
        }
        let Some(c) = self.cmds.get_mut(cmd) else {
            // SAFETY: never submitted: ours to release.
            unsafe { lib.rbd_aio_release(comp) };
            self.free_slots.push(slot);
            return Err(-libc::EINVAL);
        };
        let buf = c.buf.as_mut_ptr();
        // SAFETY: (every arm) a live image; the buffer is the command's, which stays in
        // `cmds` (its heap block unmoved: it is never resized while an operation is
        // pending) until every operation of the command has completed; its length covers
        // `len` (sized by submit).
        let rc = unsafe {
            match op {
                AioOp::Read { off, len } => lib.rbd_aio_read(image, off, len as usize, buf.cast(), comp) as i64,
                AioOp::Write { off, len } => lib.rbd_aio_write(image, off, len as usize, buf.cast(), comp) as i64,
                AioOp::Flush => i64::from(lib.rbd_aio_flush(image, comp)),
                AioOp::Zero { off, len } => i64::from(lib.rbd_aio_write_zeroes(image, off, len as usize, comp, 0, 0)),
                // The mismatch offset goes to the boxed Slot, kept with the Aio.
                AioOp::CompareAndWrite { off, len } => lib.rbd_aio_compare_and_write(
                    image,
                    off,
                    len as usize,
                    buf.cast_const().cast(),
                    buf.add(len as usize).cast_const().cast(),
                    comp,
                    mismatch,
                    0,
                ) as i64,
            }
        };
        if rc < 0 {
            // SAFETY: librbd did not take the completion: ours to release.
            unsafe { lib.rbd_aio_release(comp) };
            self.free_slots.push(slot);
            return Err(i32::try_from(rc).unwrap_or(-libc::EIO));
        }
        c.pending += 1;
        entry.insert(Aio { cmd, op, comp, slot });
        Ok(())
    }

    /// Operation `aio` completed (popped from the inbox).
    fn finish_aio(&mut self, r: &mut Reactor, aio: usize, now: Instant, exact: bool) {
        let Some(a) = self.aios.try_remove(aio) else {
            warn!(channel = %self.name, aio, "a completion for no operation: ignored");
            return;
        };
        let Ok(lib) = library() else { return };
        // SAFETY: the completion has completed (its callback ran): its value is final.
        let ret = unsafe { lib.rbd_aio_get_return_value(a.comp) } as i64;
        // SAFETY: completed and no longer referenced by librbd or pollux.
        unsafe { lib.rbd_aio_release(a.comp) };
        self.free_slots.push(a.slot);
        self.health.count_op(self.reactor);
        let Some(c) = self.cmds.get_mut(a.cmd) else { return };
        c.pending -= 1;
        if ret < 0 && matches!(a.op, AioOp::CompareAndWrite { .. }) && -ret == i64::from(libc::EILSEQ) {
            // A miscompare: an answer, not an error of the cluster.
            if c.status.is_success() {
                c.status = Status::COMPARE_FAILURE;
            }
        } else if ret < 0 {
            let errno = i32::try_from(-ret).unwrap_or(libc::EIO);
            if matches!(errno, libc::ESHUTDOWN | libc::ENOENT) {
                self.health.maybe_gone.store(true, Ordering::Relaxed);
            }
            let status = if unavailable(errno) || errno == libc::ENOENT {
                self.health.unavailable.fetch_add(1, Ordering::Relaxed);
                self.health.degraded.store(true, Ordering::Relaxed);
                if errno == libc::ESHUTDOWN {
                    // This gateway's client is blocklisted (Ceph's EBLOCKLISTED): fenced by
                    // its gateway group, it cannot reach the image until it reconnects. A path
                    // status (NVMe 2.0 §8.1.3.3), which a multipath host retries on another
                    // gateway at once; Namespace Not Ready is not a path error, and Linux's
                    // multipath fails the I/O with it.
                    Status::ANA_INACCESSIBLE
                } else {
                    Status::NAMESPACE_NOT_READY
                }
            } else {
                self.health.errors.fetch_add(1, Ordering::Relaxed);
                match (errno, a.op) {
                    (libc::EINVAL, _) => Status::LBA_OUT_OF_RANGE,
                    (_, AioOp::Read { .. }) => Status::UNRECOVERED_READ_ERROR,
                    _ => Status::WRITE_FAULT,
                }
            };
            if !c.answered {
                warn!(channel = %self.name, image = %self.ns.nsid, op = ?a.op, error = %std::io::Error::from_raw_os_error(errno), %status, "rbd operation failed");
            }
            if c.status.is_success() {
                c.status = status;
            }
        } else {
            self.health.answered();
            if let AioOp::Read { len, .. } = a.op
                && ret < i64::from(len)
                && c.status.is_success()
            {
                // Past the image's end: it shrank under the namespace.
                c.status = Status::LBA_OUT_OF_RANGE;
            }
        }
        if c.pending > 0 {
            return;
        }
        if c.then_flush && c.status.is_success() {
            // A FUA write through the writeback cache: durable once flushed.
            c.then_flush = false;
            if let Err(rc) = self.start(a.cmd, AioOp::Flush)
                && let Some(c) = self.cmds.get_mut(a.cmd)
            {
                warn!(channel = %self.name, rc, "cannot start the flush of a FUA write");
                c.status = Status::WRITE_FAULT;
            } else {
                return;
            }
        }
        let c = self.cmds.remove(a.cmd);
        if !c.answered {
            let data =
                (c.read_len > 0 && c.status.is_success()).then(|| ReadData::Bytes(&c.buf[..c.read_len as usize]));
            let took = now.saturating_duration_since(c.submitted);
            self.answer(r, c.tag, c.status, data, c.class, took, exact);
        }
        self.free_bufs.push(c.buf);
    }

    /// Tell the command's connection it ended, and the latency model how long it took.
    #[allow(clippy::too_many_arguments)]
    fn answer(
        &mut self,
        r: &mut Reactor,
        tag: Tag,
        status: Status,
        data: Option<ReadData<'_>>,
        class: usize,
        took: Duration,
        exact: bool,
    ) {
        self.end.finish(r, Completion { tag, status, data }, class, took, exact);
    }

    /// Answer, with Namespace Not Ready, the commands the cluster has kept past the bound
    /// (librados' op timeout did not end them: a lock wait, say). Their operations still
    /// run; their buffers stay until librbd is done with them.
    fn answer_overdue(&mut self, r: &mut Reactor, now: Instant) -> bool {
        let bound = self.bound;
        let overdue: Vec<usize> = self
            .cmds
            .iter()
            .filter(|(_, c)| !c.answered && now.saturating_duration_since(c.submitted) > bound)
            .map(|(k, _)| k)
            .collect();
        for k in &overdue {
            let Some(c) = self.cmds.get_mut(*k) else { continue };
            c.answered = true;
            self.health.overdue.fetch_add(1, Ordering::Relaxed);
            self.health.degraded.store(true, Ordering::Relaxed);
            warn!(channel = %self.name, waited_ms = now.saturating_duration_since(c.submitted).as_millis() as u64, "the cluster has not completed a command: answering Namespace Not Ready");
            let (tag, class, took) = (c.tag, c.class, now.saturating_duration_since(c.submitted));
            self.answer(r, tag, Status::NAMESPACE_NOT_READY, None, class, took, false);
        }
        !overdue.is_empty()
    }
}

impl Channel for RbdChannel {
    fn name(&self) -> &str {
        &self.name
    }

    /// A write's data is copied into the command's buffer (librbd reads it until the
    /// write completes); a read's data comes back with the completion. Write Zeroes and
    /// Deallocate are librbd's write_zeroes (whole objects are removed, partial ones
    /// zeroed), so deallocated blocks read back as zeroes; a discard would leave partial
    /// objects' data (`rbd_skip_partial_discard`).
    fn submit(&mut self, r: &mut Reactor, tag: Tag, _store: &dyn Backend, op: BlockOp<'_>) -> Result<(), Status> {
        let mut ops = std::mem::take(&mut self.ops);
        ops.clear();
        let (buf, read_len, then_flush, class) = match op {
            BlockOp::Read { off, len } => {
                ops.push(AioOp::Read { off, len });
                (self.take_buf(len as usize), len, false, LatencyModel::class(true, len))
            }
            BlockOp::Write {
                off,
                data: WriteData::Bytes(data),
                fua,
            } => {
                let len = u32::try_from(data.len()).map_err(|_| Status::INTERNAL_ERROR)?;
                let mut b = self.take_buf(0);
                b.extend_from_slice(data);
                ops.push(AioOp::Write { off, len });
                // Without the cache every write is durable when it completes.
                (b, 0, fua && self.write_cache, LatencyModel::class(false, len))
            }
            // DMA buffers come from NVMe channels only.
            BlockOp::Write { .. } => return Err(Status::INTERNAL_ERROR),
            BlockOp::WriteZeroes { off, len } => {
                ops.push(AioOp::Zero { off, len });
                (Vec::new(), 0, false, LatencyModel::class(false, 0))
            }
            BlockOp::Deallocate { ranges } => {
                ops.extend(ranges.iter().map(|&(off, len)| AioOp::Zero { off, len }));
                (Vec::new(), 0, false, LatencyModel::class(false, 0))
            }
            BlockOp::Flush => {
                ops.push(AioOp::Flush);
                (Vec::new(), 0, false, LatencyModel::class(false, 0))
            }
            BlockOp::CompareAndWrite { off, expect, data, fua } => {
                let len = u32::try_from(expect.len()).map_err(|_| Status::INTERNAL_ERROR)?;
                if data.len() != expect.len() {
                    return Err(Status::INTERNAL_ERROR);
                }
                let mut b = self.take_buf(0);
                b.extend_from_slice(expect);
                b.extend_from_slice(data);
                ops.push(AioOp::CompareAndWrite { off, len });
                (b, 0, fua && self.write_cache, LatencyModel::class(false, len))
            }
            // No copy offload (Caps::copy_offload): a Copy is read and written through pollux.
            BlockOp::Copy { .. } => return Err(Status::INTERNAL_ERROR),
        };
        let cmd = self.cmds.insert(Cmd::new(tag, buf, read_len, then_flush, class, false));
        let mut refused = None;
        for &op in &ops {
            if let Err(rc) = self.start(cmd, op) {
                warn!(channel = %self.name, ?op, error = %std::io::Error::from_raw_os_error(-rc), "librbd refused an operation");
                let Some(c) = self.cmds.get_mut(cmd) else { break };
                if c.pending == 0 {
                    // Nothing of it runs: refused whole.
                    let c = self.cmds.remove(cmd);
                    self.free_bufs.push(c.buf);
                    refused = Some(if unavailable(-rc) {
                        Status::NAMESPACE_NOT_READY
                    } else {
                        Status::INTERNAL_ERROR
                    });
                } else {
                    // Some ranges run: the command fails when they end.
                    c.status = Status::WRITE_FAULT;
                }
                break;
            }
        }
        self.ops = ops;
        if let Some(status) = refused {
            return Err(status);
        }
        r.device_load().outstanding += 1;
        Ok(())
    }

    fn interrupt_fd(&self) -> Option<RawFd> {
        Some(self.inbox.efd.as_raw_fd())
    }

    fn polling(&self) -> pollux_reactor::Polling {
        self.ns.polling.get()
    }

    fn outstanding(&self) -> usize {
        self.cmds.iter().filter(|(_, c)| !c.answered).count()
    }

    fn watchdog(&self) -> Option<Duration> {
        Some(WATCHDOG)
    }

    fn poll(&mut self, r: &mut Reactor) -> Progress {
        self.inbox.efd.drain();
        let now = Instant::now();
        let exact = now.duration_since(self.last_poll) <= EXACT_GAP;
        self.last_poll = now;
        let mut did = false;
        while let Some(aio) = self.inbox.done.pop() {
            self.finish_aio(r, aio, now, exact);
            did = true;
        }
        // The bound is seconds: checked at the watchdog's pace, not on every poll.
        if now >= self.next_overdue_check {
            self.next_overdue_check = now + WATCHDOG;
            did |= self.answer_overdue(r, now);
        }
        Progress {
            did_work: did,
            next: self.end.model.next_run(
                self.cmds
                    .iter()
                    .filter(|(_, c)| !c.answered)
                    .map(|(_, c)| (c.submitted, c.class)),
            ),
        }
    }

    /// Waits (bounded) for what librbd still holds buffers of, then, with the writeback
    /// cache, flushes it: a clean stop leaves nothing of an acknowledged write behind.
    fn shutdown(&mut self) {
        let deadline = Instant::now() + self.bound + Duration::from_secs(1);
        if self.write_cache && self.start_shutdown_flush().is_err() {
            warn!(channel = %self.name, "cannot flush librbd's cache at stop");
        }
        while !self.aios.is_empty() && Instant::now() < deadline {
            self.inbox.efd.drain();
            while let Some(aio) = self.inbox.done.pop() {
                self.forget_aio(aio);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

impl RbdChannel {
    /// A flush of the whole cache, answered to nobody (at stop).
    fn start_shutdown_flush(&mut self) -> Result<(), i32> {
        let nobody = Tag {
            source: pollux_reactor::SourceId::default(),
            serial: u64::MAX,
            slot: usize::MAX,
        };
        let cmd = self.cmds.insert(Cmd::new(nobody, Vec::new(), 0, false, 0, true));
        self.start(cmd, AioOp::Flush)
    }

    /// Free a completed operation without answering anyone (at stop).
    fn forget_aio(&mut self, aio: usize) {
        let Some(a) = self.aios.try_remove(aio) else { return };
        if let Ok(lib) = library() {
            // SAFETY: completed; no longer referenced.
            unsafe { lib.rbd_aio_release(a.comp) };
        }
        self.free_slots.push(a.slot);
        if let Some(c) = self.cmds.get_mut(a.cmd) {
            c.pending = c.pending.saturating_sub(1);
            if c.pending == 0 {
                self.cmds.remove(a.cmd);
            }
        }
    }
}

impl Drop for RbdChannel {
    /// Operations librbd still holds (a cluster that never answered within the stop's
    /// bound) keep their slot and buffer: leaked, never freed under librbd.
    fn drop(&mut self) {
        if self.aios.is_empty() {
            return;
        }
        warn!(channel = %self.name, pending = self.aios.len(), "librbd still holds operations at close: their buffers are leaked, not freed");
        for a in self.aios.drain() {
            std::mem::forget(a.slot);
        }
        for c in self.cmds.drain() {
            std::mem::forget(c.buf);
        }
    }
}
