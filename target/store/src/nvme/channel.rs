//! One reactor's queue pair on an NVMe device ([`SsdChannel`]): target commands become
//! device commands (split at MDTS, Write Zeroes emulated where the device lacks it), their
//! data moves through the channel's pool of DMA buffers, and their completions feed the
//! latency model.

use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use pollux_nvme::pci::{
    self, Completion as DeviceCompletion, DmaAllocator, DmaBuf, DmaRegion, IoRequest, QueueError, QueuePair,
};
use pollux_nvme::spec::Status;
use pollux_reactor::{LatencyModel, Mode, Next, Progress, Reactor};
use tracing::warn;

use super::{
    CHUNK, DEAC, EXACT_GAP, FUA, MAX_TRANSFER, ONCS_WRITE_ZEROES, SsdDevice, SsdNamespace, WATCHDOG, lock, short,
};
use crate::dma::DmaShelf;
use crate::error::StoreError;
use crate::{
    Backend, BlockOp, Channel, ChannelEnv, Completer, Completion, DmaPool, PooledDma, ReadData, Tag, WriteData,
};

/// DMA buffers of one channel: power-of-two size classes from 4 KiB, carved from 2 MiB
/// regions and recycled (each goes back to its class when dropped, [`DmaShelf`]), so the
/// steady state allocates (and maps) nothing.
struct Pool {
    dma: Arc<dyn DmaAllocator>,
    shelf: DmaPool,
    chunk: Option<Arc<DmaRegion>>,
    used: usize,
    zeroes: Option<DmaBuf>,
    /// The device's [`SsdDevice::data_dma_bytes`].
    allocated: Arc<AtomicU64>,
}

impl Pool {
    fn new(dma: Arc<dyn DmaAllocator>, allocated: Arc<AtomicU64>) -> Self {
        Self {
            dma,
            allocated,
            shelf: DmaPool::default(),
            chunk: None,
            used: 0,
            zeroes: None,
        }
    }

    /// A buffer of at least `len` bytes (its class size).
    fn take(&mut self, len: usize) -> pci::Result<PooledDma> {
        let (size, idx) = DmaShelf::class(len);
        if let Some(b) = self.shelf.with(|s| s.pop(idx)).flatten() {
            return Ok(self.shelf.lend(b));
        }
        let room = self.chunk.as_ref().map_or(0, |c| c.len() - self.used);
        if room < size {
            let chunk = self.dma.allocate(size.max(CHUNK))?;
            self.allocated.fetch_add(chunk.len() as u64, Ordering::Relaxed);
            self.chunk = Some(Arc::new(chunk));
            self.used = 0;
        }
        let chunk = self.chunk.clone().ok_or(pci::PciError::IovaExhausted { len: size })?;
        let b = DmaBuf::new(chunk, self.used, size).ok_or(pci::PciError::IovaExhausted { len: size })?;
        self.used += size;
        Ok(self.shelf.lend(b))
    }

    /// A zero-filled buffer of MAX_TRANSFER bytes the device only reads (Write Zeroes on a
    /// device without it).
    fn zeroes(&mut self) -> pci::Result<DmaBuf> {
        if let Some(z) = &self.zeroes {
            return Ok(z.clone());
        }
        let z = DmaBuf::whole(Arc::new(self.dma.allocate(MAX_TRANSFER)?));
        self.zeroes = Some(z.clone());
        Ok(z)
    }
}

/// One operation of a target command on an SSD namespace, in logical blocks.
#[derive(Debug)]
pub enum SsdOp<'a> {
    /// Read `blocks` from `slba`.
    Read {
        /// First LBA.
        slba: u64,
        /// Number of blocks.
        blocks: u64,
    },
    /// Write `data` at `slba`.
    Write {
        /// First LBA.
        slba: u64,
        /// The data (a whole number of blocks).
        data: &'a [u8],
        /// Force unit access.
        fua: bool,
    },
    /// Write the first `len` bytes of `buf` (from [`SsdChannel::take_buf`], the host's data
    /// received straight into it) at `slba`.
    WriteBuf {
        /// First LBA.
        slba: u64,
        /// The buffer.
        buf: PooledDma,
        /// Bytes (a whole number of blocks).
        len: usize,
        /// Force unit access.
        fua: bool,
    },
    /// Flush the device's volatile write cache.
    Flush,
    /// Zero (and, with `deallocate`, deallocate) the (slba, blocks) ranges.
    Zero {
        /// The ranges.
        ranges: &'a [(u64, u64)],
        /// Deallocate them too (Dataset Management deallocate).
        deallocate: bool,
    },
    /// Copy the (slba, blocks) source ranges to `sdlba` with the device's own Copy (NVM
    /// Command Set 1.0 §3.2.2): one command, within the namespace's limits
    /// ([`pci::Namespace::copy`]).
    Copy {
        /// The source ranges.
        ranges: &'a [(u64, u64)],
        /// Destination LBA.
        sdlba: u64,
        /// Force unit access.
        fua: bool,
    },
}

/// The source range entries (format 0, NVM Command Set 1.0 §3.2.2.1, Figure 50) of a device
/// Copy of `ranges`, if it is one the device takes: within its limits and one page of entries.
fn copy_entries(ns: &pci::Namespace, ranges: &[(u64, u64)]) -> Option<Vec<u8>> {
    let limits = super::copy_offload(ns)?;
    // Each entry's NLB is 16 bits of blocks - 1: the limits never allow more, but the cast
    // below must not wrap whatever they say.
    if ranges.is_empty() || !ranges.iter().all(|&(_, n)| n > 0 && n <= pci::queue::MAX_NLB) {
        return None;
    }
    let shift = ns.lba_shift;
    let bytes: Vec<(u64, u64)> = ranges.iter().map(|&(slba, n)| (slba << shift, n << shift)).collect();
    if !limits.fits(&bytes) {
        return None;
    }
    let mut raw = vec![0u8; ranges.len() * pci::queue::COPY_ENTRY];
    for (e, &(slba, blocks)) in raw.chunks_exact_mut(pci::queue::COPY_ENTRY).zip(ranges) {
        e[8..16].copy_from_slice(&slba.to_le_bytes());
        e[16..18].copy_from_slice(&((blocks - 1) as u16).to_le_bytes());
    }
    Some(raw)
}

struct Cmd {
    tag: Tag,
    /// Its data buffer: back to the pool when the command is dropped.
    buf: Option<PooledDma>,
    read_len: usize,
    pending: u32,
    status: Status,
    submitted: Instant,
    class: usize,
    /// A host aborted it: it completes with Command Aborted Requested, whether or not the
    /// device aborted its commands (the host was told it is aborted).
    aborted: bool,
}

/// One reactor's queue pair on a device: a source of its reactor.
pub struct SsdChannel {
    dev: Arc<SsdDevice>,
    reactor: usize,
    qp: Option<QueuePair>,
    cmds: slab::Slab<Cmd>,
    backlog: VecDeque<IoRequest>,
    pool: Pool,
    end: Completer,
    done: Vec<DeviceCompletion>,
    /// Largest target command, bytes (the queue splits it by MDTS).
    max_io: usize,
    /// Device commands refused at submission, completed on the next run.
    deferred: Vec<(usize, Status)>,
    last_poll: Instant,
    name: String,
}

impl SsdChannel {
    /// Take reactor `reactor`'s queue pair on `dev`.
    pub fn new(dev: Arc<SsdDevice>, env: &ChannelEnv) -> Result<Self, StoreError> {
        let (reactor, max_io) = (env.reactor, env.max_io as usize);
        let dma = dev.dma().ok_or_else(|| StoreError::NvmeUnfit {
            device: dev.name.clone(),
            reason: "released for another process (a hot upgrade)".into(),
        })?;
        let qp = lock(&dev.queues)
            .get_mut(reactor)
            .and_then(Option::take)
            .ok_or_else(|| StoreError::NvmeUnfit {
                device: dev.name.clone(),
                reason: format!("no I/O queue pair for reactor {reactor}"),
            })?;
        Ok(Self {
            name: format!("nvme-{}-q{}", short(&dev.name), qp.qid()),
            pool: Pool::new(dma, dev.data_dma_bytes.clone()),
            dev,
            reactor,
            qp: Some(qp),
            cmds: slab::Slab::new(),
            backlog: VecDeque::new(),
            end: Completer::new(env),
            done: Vec::new(),
            max_io: max_io.max(pci::PAGE_SIZE),
            deferred: Vec::new(),
            last_poll: Instant::now(),
        })
    }

    /// Submit one target command; it completes (through the completion function, never from
    /// within this call) when all of its device commands have. Wake the channel afterwards.
    pub fn submit_op(&mut self, r: &mut Reactor, tag: Tag, ns: &pci::Namespace, op: SsdOp<'_>) -> Result<(), Status> {
        if self.dev.failed() {
            return Err(Status::NAMESPACE_NOT_READY);
        }
        let shift = ns.lba_shift;
        let (is_read, bytes) = match &op {
            SsdOp::Read { blocks, .. } => (true, (blocks << shift) as usize),
            SsdOp::Write { data, .. } => (false, data.len()),
            SsdOp::WriteBuf { len, .. } => (false, *len),
            SsdOp::Copy { ranges, .. } => (false, (ranges.iter().map(|r| r.1).sum::<u64>() << shift) as usize),
            _ => (false, 0),
        };
        let key = self.cmds.vacant_key();
        let mut reqs: Vec<IoRequest> = Vec::with_capacity(1);
        let mut buf = None;
        match op {
            SsdOp::Read { slba, .. } | SsdOp::Write { slba, .. } | SsdOp::WriteBuf { slba, .. } => {
                if bytes == 0 || bytes > self.max_io || bytes % ns.block_size() != 0 {
                    return Err(Status::INVALID_FIELD.with_dnr());
                }
                let (class, fua, data) = match op {
                    SsdOp::WriteBuf { buf, fua, .. } if buf.len() >= bytes => (buf, fua, None),
                    SsdOp::WriteBuf { .. } => return Err(Status::INTERNAL_ERROR),
                    SsdOp::Write { fua, data, .. } => (self.alloc(bytes)?, fua, Some(data)),
                    _ => (self.alloc(bytes)?, false, None),
                };
                let sub = DmaBuf::new(class.region().clone(), class.offset(), bytes).ok_or(Status::INTERNAL_ERROR)?;
                let req = if is_read {
                    IoRequest::read(ns, slba, sub, key as u64)
                } else {
                    if let Some(data) = data {
                        sub.write(data);
                    }
                    let mut q = IoRequest::write(ns, slba, sub, key as u64);
                    if fua {
                        q.cdw12_flags |= FUA;
                    }
                    q
                };
                reqs.push(req);
                buf = Some(class);
            }
            SsdOp::Flush => reqs.push(IoRequest::flush(ns, key as u64)),
            SsdOp::Copy { ranges, sdlba, fua } => {
                // The caller checked the limits (Caps::copy_offload): beyond them is a bug.
                let Some(raw) = copy_entries(ns, ranges) else {
                    warn!(channel = %self.name, ranges = ranges.len(), "a Copy beyond the device's limits");
                    return Err(Status::INTERNAL_ERROR);
                };
                // A pool buffer is page aligned (size classes from 4 KiB): PRP1 names it.
                let class = self.alloc(raw.len())?;
                let sub =
                    DmaBuf::new(class.region().clone(), class.offset(), raw.len()).ok_or(Status::INTERNAL_ERROR)?;
                sub.write(&raw);
                let mut q = IoRequest::copy(ns, sdlba, sub, ranges.len() as u32, key as u64);
                if fua {
                    q.cdw12_flags |= FUA;
                }
                reqs.push(q);
                buf = Some(class);
                self.dev.offloaded_copies.fetch_add(1, Ordering::Relaxed);
            }
            SsdOp::Zero { ranges, deallocate } => {
                if self.dev.info.oncs & ONCS_WRITE_ZEROES != 0 {
                    for &(slba, blocks) in ranges.iter().filter(|r| r.1 > 0) {
                        let mut q = IoRequest::write_zeroes(ns, slba, blocks, key as u64);
                        if deallocate {
                            q.cdw12_flags |= DEAC;
                        }
                        reqs.push(q);
                    }
                } else {
                    // No Write Zeroes on the device: write zero-filled buffers.
                    let z = self.pool.zeroes().map_err(|_| Status::INTERNAL_ERROR)?;
                    let per = (MAX_TRANSFER >> shift) as u64;
                    for &(slba, blocks) in ranges {
                        let mut done = 0;
                        while done < blocks {
                            let n = per.min(blocks - done);
                            let sub = DmaBuf::new(z.region().clone(), 0, (n << shift) as usize)
                                .ok_or(Status::INTERNAL_ERROR)?;
                            reqs.push(IoRequest::write(ns, slba + done, sub, key as u64));
                            done += n;
                        }
                    }
                }
            }
        }
        if reqs.is_empty() {
            return Err(Status::INTERNAL_ERROR);
        }
        self.cmds.insert(Cmd {
            tag,
            buf,
            read_len: if is_read { bytes } else { 0 },
            pending: reqs.len() as u32,
            status: Status::SUCCESS,
            submitted: Instant::now(),
            class: LatencyModel::class(is_read, bytes as u32),
            aborted: false,
        });
        r.device_load().outstanding += 1;
        // Behind a backlog, keep the order: queue behind it.
        self.backlog.extend(reqs);
        self.drain_backlog();
        Ok(())
    }

    fn alloc(&mut self, bytes: usize) -> Result<PooledDma, Status> {
        self.pool.take(bytes).map_err(|e| {
            warn!(channel = %self.name, error = %e, "no DMA memory for a command");
            Status::INTERNAL_ERROR
        })
    }

    /// One device command of target command `key` finished with `status`.
    fn part_done(&mut self, r: &mut Reactor, key: usize, status: Status, now: Instant, exact: bool) {
        let Some(c) = self.cmds.get_mut(key) else { return };
        if c.status.is_success() && !status.is_success() {
            c.status = status;
        }
        c.pending = c.pending.saturating_sub(1);
        if c.pending > 0 {
            return;
        }
        // Its buffer goes back to the pool as `c` drops, after the completion was handled.
        let mut c = self.cmds.remove(key);
        if c.aborted {
            c.status = Status::ABORT_REQUESTED;
        }
        let data = (c.read_len > 0 && c.status.is_success())
            .then(|| {
                c.buf
                    .as_ref()
                    .and_then(|b| DmaBuf::new(b.region().clone(), b.offset(), c.read_len))
            })
            .flatten();
        let done = Completion {
            tag: c.tag,
            status: c.status,
            data: data.as_ref().map(ReadData::Dma),
        };
        self.end
            .finish(r, done, c.class, now.saturating_duration_since(c.submitted), exact);
    }

    /// Submit what waits for queue slots or for the end of a reset, in order, and ring the
    /// doorbell. Refused commands complete on the next run (the caller's source may be the
    /// connection that is submitting: it cannot take a completion now).
    fn drain_backlog(&mut self) {
        if self.dev.failed() {
            self.deferred.extend(
                self.backlog
                    .drain(..)
                    .map(|q| (q.tag as usize, Status::NAMESPACE_NOT_READY)),
            );
            return;
        }
        let Some(qp) = self.qp.as_mut() else { return };
        while let Some(req) = self.backlog.pop_front() {
            match qp.submit(req) {
                Ok(()) => {}
                Err(rej) => match rej.error {
                    QueueError::Full { .. } | QueueError::Resetting => {
                        self.backlog.push_front(*rej.request);
                        break;
                    }
                    e => {
                        warn!(channel = %self.name, error = %e, "the queue refused a command");
                        self.deferred.push((rej.request.tag as usize, Status::INTERNAL_ERROR));
                    }
                },
            }
        }
        qp.flush();
    }
}

impl Channel for SsdChannel {
    fn name(&self) -> &str {
        &self.name
    }

    /// Byte ranges become LBA ranges of the device's namespace. Write data is copied into a
    /// DMA buffer (unless it was received into one); read data goes to the send buffer from
    /// the DMA buffer at completion.
    fn submit(&mut self, r: &mut Reactor, tag: Tag, store: &dyn Backend, op: BlockOp<'_>) -> Result<(), Status> {
        let Some(dev_ns) = store.as_any().downcast_ref::<SsdNamespace>() else {
            return Err(Status::INTERNAL_ERROR);
        };
        // The namespace's block size is its device namespace's (`Backend::block_size`).
        let shift = u32::from(dev_ns.ns.lba_shift);
        let ranges: Vec<(u64, u64)>;
        let op = match op {
            BlockOp::Read { off, len } => SsdOp::Read {
                slba: off >> shift,
                blocks: u64::from(len) >> shift,
            },
            BlockOp::Write {
                off,
                data: WriteData::Bytes(data),
                fua,
            } => SsdOp::Write {
                slba: off >> shift,
                data,
                fua,
            },
            BlockOp::Write {
                off,
                data: WriteData::Dma { buf, len },
                fua,
            } => SsdOp::WriteBuf {
                slba: off >> shift,
                buf,
                len,
                fua,
            },
            BlockOp::WriteZeroes { off, len } => {
                ranges = vec![(off >> shift, len >> shift)];
                SsdOp::Zero {
                    ranges: &ranges,
                    deallocate: false,
                }
            }
            BlockOp::Deallocate { ranges: r } => {
                ranges = r.iter().map(|&(off, len)| (off >> shift, len >> shift)).collect();
                SsdOp::Zero {
                    ranges: &ranges,
                    deallocate: true,
                }
            }
            BlockOp::Flush => SsdOp::Flush,
            BlockOp::Copy { ranges: r, dst, fua } => {
                ranges = r.iter().map(|&(off, len)| (off >> shift, len >> shift)).collect();
                SsdOp::Copy {
                    ranges: &ranges,
                    sdlba: dst >> shift,
                    fua,
                }
            }
            // Not offered (Caps::compare_and_write): pollux compares under its range lock.
            BlockOp::CompareAndWrite { .. } => return Err(Status::INTERNAL_ERROR),
        };
        let dev_ns = dev_ns.ns;
        self.submit_op(r, tag, &dev_ns, op)
    }

    fn interrupt_fd(&self) -> Option<RawFd> {
        self.qp.as_ref().and_then(QueuePair::eventfd)
    }

    fn outstanding(&self) -> usize {
        self.cmds.len() + self.backlog.len()
    }

    fn watchdog(&self) -> Option<Duration> {
        Some(WATCHDOG)
    }

    /// Commands still in the backlog are taken out; those on the device get the device's
    /// Abort from the admin thread (NVMe 2.0 §5.1). Either way the command completes with
    /// Command Aborted Requested once nothing of it is left on the device.
    fn abort(&mut self, _r: &mut Reactor, tag: Tag) -> bool {
        let Some((key, c)) = self.cmds.iter_mut().find(|(_, c)| c.tag == tag && !c.aborted) else {
            return false;
        };
        c.aborted = true;
        let before = self.backlog.len();
        self.backlog.retain(|q| q.tag != key as u64);
        for _ in self.backlog.len()..before {
            self.deferred.push((key, Status::ABORT_REQUESTED));
        }
        if let Some(qp) = self.qp.as_ref() {
            let cids = qp.cids_of(key as u64);
            if !cids.is_empty() {
                self.dev.request_abort(qp.qid(), &cids);
            }
        }
        true
    }

    /// A DMA buffer of at least `len` bytes for a write's data to be received into: the
    /// data is copied once, from the socket into DMA memory. `None` beyond the transfer limit
    /// or without DMA memory.
    fn take_buf(&mut self, len: usize) -> Option<PooledDma> {
        (len > 0 && len <= self.max_io)
            .then(|| self.pool.take(len).ok())
            .flatten()
    }

    fn poll(&mut self, r: &mut Reactor) -> Progress {
        let Some(qp) = self.qp.as_mut() else {
            return Progress {
                did_work: false,
                next: Next::Idle,
            };
        };
        // Busy-poll never sleeps on the eventfd: no read() per iteration there. Edge-triggered
        // epoll reports every new interrupt whether or not the counter was drained.
        if r.effective_mode() != Mode::Poll {
            qp.ack_interrupts();
        }
        let now = Instant::now();
        let exact = now.duration_since(self.last_poll) <= EXACT_GAP;
        self.last_poll = now;
        let mut done = std::mem::take(&mut self.done);
        qp.poll(|c| done.push(c));
        let completed = !done.is_empty();
        for c in done.drain(..) {
            self.part_done(r, c.tag as usize, c.status, now, exact);
        }
        self.done = done;
        if !self.backlog.is_empty() {
            self.drain_backlog();
        }
        let did = completed || !self.deferred.is_empty();
        for (key, status) in std::mem::take(&mut self.deferred) {
            self.part_done(r, key, status, now, false);
        }
        let next = if !self.deferred.is_empty() {
            Next::Asap
        } else if !self.backlog.is_empty() {
            // Waiting for a reset to finish or for slots: look again soon.
            Next::At(now + Duration::from_millis(1))
        } else {
            self.end
                .model
                .next_run(self.cmds.iter().map(|(_, c)| (c.submitted, c.class)))
        };
        Progress { did_work: did, next }
    }

    fn shutdown(&mut self) {
        // Wait (bounded) for what the device still holds, so no buffer is reused under it.
        let Some(qp) = self.qp.as_mut() else { return };
        let deadline = Instant::now() + Duration::from_secs(5);
        while qp.inflight() > 0 && Instant::now() < deadline {
            qp.poll(|_| {});
            std::thread::sleep(Duration::from_micros(50));
        }
        self.backlog.clear();
        self.cmds.clear();
    }
}

impl Drop for SsdChannel {
    fn drop(&mut self) {
        // An idle queue pair goes back to the device for a later channel of this reactor; one
        // with commands in flight is dropped (the controller deletes it and frees its buffers
        // once the device can no longer reach them).
        if let Some(qp) = self.qp.take()
            && qp.inflight() == 0
            && let Some(slot) = lock(&self.dev.queues).get_mut(self.reactor)
        {
            *slot = Some(qp);
        }
    }
}
