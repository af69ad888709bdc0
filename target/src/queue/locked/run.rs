//! Locked operations (a fused Compare and Write, a Copy) on an I/O queue: lock the range,
//! fence every reactor, read, (compare,) write, unlock; and the writes parked behind a
//! locked range until it unlocks.

use pollux_nvme::spec::Status;
use pollux_reactor::{Reactor, SourceId};

use super::super::request::{ReqState, Request};
use super::super::{Queue, Transport};
use super::{FAILED_FUSED, OpKind, Owned, Parked, wake};
use crate::backend::{BlockOp, ReadData, WriteData};
use crate::nvm::Io;
use crate::queue::fence::{fence_all, unlock_and_wake};
use crate::queue::finish::{Counted, End};

impl<T: Transport> Queue<T> {
    /// Lock operation `key`'s range and fence every reactor; it runs when all answered. A
    /// range already locked: it waits to be woken.
    pub(super) fn try_start(&mut self, r: &mut Reactor, id: SourceId, key: usize) {
        let w = self.waiter(id);
        let Some(op) = self.locked.ops.get_mut(key) else { return };
        if op.lock.is_some() {
            return;
        }
        let Some(lock) = op.ns.locks.try_lock(op.start, op.end, w) else {
            return;
        };
        op.lock = Some(lock);
        let (ns, serial) = (op.ns.clone(), self.serial);
        let home = self.reactor;
        let fenced_ns = ns.clone();
        fence_all(r, &ns, home, move |r| {
            let ran = r.with_source::<Self, _>(id, |c, r| c.op_fenced(r, id, serial, key, lock));
            if ran != Some(true) {
                // The queue is gone: its lock must not outlive it.
                unlock_and_wake(r, &fenced_ns, lock, wake::<T>);
            }
        });
    }

    /// Every reactor answered operation `key`'s fence: run it. False if it is not this
    /// queue's any more.
    fn op_fenced(&mut self, r: &mut Reactor, id: SourceId, serial: u64, key: usize, lock: u64) -> bool {
        if self.serial != serial || self.closed || self.locked.ops.get(key).and_then(|o| o.lock) != Some(lock) {
            return false;
        }
        self.op_step(r, id, key);
        self.flush_or_close(r, id);
        true
    }

    /// Run operation `key` until it waits for a channel or is done.
    pub(super) fn op_step(&mut self, r: &mut Reactor, id: SourceId, key: usize) {
        loop {
            let Some(op) = self.locked.ops.get_mut(key) else { return };
            let ns = op.ns.clone();
            if op.next < op.reads.len() {
                let (off, len) = op.reads[op.next];
                if ns.inline_reads
                    && let Some(d) = ns.backend.read_in_place(off)
                {
                    d.append_to(len as usize, &mut op.got);
                    op.next += 1;
                    continue;
                }
                let cid = match &op.kind {
                    OpKind::Caw { cmp_cid, .. } => *cmp_cid,
                    OpKind::Copy { cid, .. } => *cid,
                };
                let io = Io::Read {
                    ns: ns.clone(),
                    off,
                    len,
                };
                if let Err(s) = self.submit_step(r, id, key, cid, io, BlockOp::Read { off, len }) {
                    return self.op_done(r, key, s, FAILED_FUSED);
                }
                return;
            }
            // Every read is in: compare (Compare and Write), then write.
            let write_len = match &mut op.kind {
                OpKind::Caw { expect, device, .. } => {
                    if !*device && op.written == 0 && op.got != *expect {
                        return self.op_done(r, key, Status::COMPARE_FAILURE, FAILED_FUSED);
                    }
                    expect.len() as u64
                }
                OpKind::Copy { device: Some(_), .. } => op.end - op.start,
                OpKind::Copy { .. } => op.got.len() as u64,
            };
            if op.written >= write_len {
                return self.op_done(r, key, Status::SUCCESS, Status::SUCCESS);
            }
            if let OpKind::Caw {
                wr_cid,
                fua,
                expect,
                data,
                device: true,
                ..
            } = &mut op.kind
            {
                let (cid, fua, off) = (*wr_cid, *fua, op.start);
                let expect = std::mem::take(expect);
                let Some(d) = data.take() else {
                    return self.op_done(r, key, Status::SUCCESS, Status::INTERNAL_ERROR);
                };
                op.written = write_len;
                let bytes = match d {
                    Owned::Heap(v) => v,
                    Owned::Dma(buf, len) => Owned::bytes(WriteData::Dma { buf, len }),
                };
                let io = Io::Write {
                    ns: ns.clone(),
                    off,
                    len: write_len as u32,
                    fua,
                };
                let op = BlockOp::CompareAndWrite {
                    off,
                    expect: &expect,
                    data: &bytes,
                    fua,
                };
                if let Err(s) = self.submit_step(r, id, key, cid, io, op) {
                    return self.op_done(r, key, s, FAILED_FUSED);
                }
                return;
            }
            if let OpKind::Copy {
                cid,
                fua,
                device: Some(ranges),
            } = &op.kind
            {
                let (cid, fua, ranges, dst) = (*cid, *fua, ranges.clone(), op.start);
                op.written = write_len;
                // The device's Copy writes the destination: in flight as a write of it, for
                // the fences of other locks (at most COPY_MAX_BYTES: it fits the length).
                let io = Io::Write {
                    ns: ns.clone(),
                    off: dst,
                    len: write_len as u32,
                    fua,
                };
                if let Err(s) = self.submit_step(r, id, key, cid, io, BlockOp::Copy { ranges, dst, fua }) {
                    return self.op_done(r, key, Status::SUCCESS, s);
                }
                return;
            }
            let off = op.start + op.written;
            let (cid, fua, data) = match &mut op.kind {
                OpKind::Caw { wr_cid, fua, data, .. } => {
                    let Some(d) = data.take() else {
                        return self.op_done(r, key, Status::SUCCESS, Status::INTERNAL_ERROR);
                    };
                    (*wr_cid, *fua, d)
                }
                OpKind::Copy { cid, fua, .. } => {
                    let chunk = u64::from(self.shared.transport.max_io_size.max(ns.block_size));
                    let n = (write_len - op.written).min(chunk) as usize;
                    let at = op.written as usize;
                    (*cid, *fua, Owned::Heap(op.got[at..at + n].to_vec()))
                }
            };
            let n = match &data {
                Owned::Heap(v) => v.len(),
                Owned::Dma(_, l) => *l,
            } as u64;
            if let Some(o) = self.locked.ops.get_mut(key) {
                o.written += n;
            }
            let io = Io::Write {
                ns: ns.clone(),
                off,
                len: n as u32,
                fua,
            };
            let res = match data {
                Owned::Heap(v) => self.write_step(r, id, key, cid, io, WriteData::Bytes(&v)),
                Owned::Dma(buf, len) => self.write_step(r, id, key, cid, io, WriteData::Dma { buf, len }),
            };
            match res {
                Ok(true) => continue,
                Ok(false) => return,
                Err(s) => return self.op_done(r, key, Status::SUCCESS, s),
            }
        }
    }

    /// One write of operation `key`: Ok(true) when it completed inline (RAM), Ok(false) when
    /// a channel has it.
    fn write_step(
        &mut self,
        r: &mut Reactor,
        id: SourceId,
        key: usize,
        cid: u16,
        io: Io,
        data: WriteData<'_>,
    ) -> Result<bool, Status> {
        let Io::Write { ns, off, fua, .. } = &io else {
            return Err(Status::INTERNAL_ERROR);
        };
        let (ns, off, fua) = (ns.clone(), *off, *fua);
        let op = BlockOp::Write { off, data, fua };
        if let Some(status) = ns.backend.run_inline(&op) {
            return if status.is_success() { Ok(true) } else { Err(status) };
        }
        self.submit_step(r, id, key, cid, io, op).map(|()| false)
    }

    /// Submit one step of operation `key` to this reactor's channel of its namespace.
    fn submit_step(
        &mut self,
        r: &mut Reactor,
        id: SourceId,
        key: usize,
        cid: u16,
        io: Io,
        op: BlockOp<'_>,
    ) -> Result<(), Status> {
        let Some(ns) = io.namespace().cloned() else {
            return Err(Status::INTERNAL_ERROR);
        };
        let mut req = Request::new(cid, io, ReqState::Submitted);
        req.step = Some(key);
        self.submit_op(r, id, &ns, op, Err(req))
    }

    /// A channel completed a step (`io`) of operation `key`.
    pub(in crate::queue) fn step_done(
        &mut self,
        r: &mut Reactor,
        id: SourceId,
        key: usize,
        io: &Io,
        status: Status,
        data: Option<ReadData<'_>>,
    ) {
        let Some(op) = self.locked.ops.get_mut(key) else { return };
        match io {
            Io::Read { len, off, .. } => {
                if !status.is_success() {
                    return self.op_done(r, key, status, FAILED_FUSED);
                }
                let data = data.or_else(|| op.ns.backend.read_in_place(*off));
                match data {
                    Some(d) => d.append_to(*len as usize, &mut op.got),
                    None => return self.op_done(r, key, Status::INTERNAL_ERROR, FAILED_FUSED),
                }
                op.next += 1;
            }
            // The store's own compare-and-write: a miscompare is the Compare's, and so is any
            // other failure (whether it compared is unknown); the Write did not run.
            _ if !status.is_success() && matches!(op.kind, OpKind::Caw { device: true, .. }) => {
                return self.op_done(r, key, status, FAILED_FUSED);
            }
            _ if !status.is_success() => return self.op_done(r, key, Status::SUCCESS, status),
            _ => {}
        }
        // The channel that completed the step is running (it called us): the next step is
        // submitted from a message to this reactor, once it has returned.
        let (me, serial) = (self.reactor, self.serial);
        r.send(me, move |r| {
            r.with_source::<Self, _>(id, |c, r| {
                if c.serial == serial && !c.closed {
                    c.op_step(r, id, key);
                    c.flush_or_close(r, id);
                }
            });
        });
    }

    /// Operation `key` is done: complete its commands (a Compare and Write's Compare with
    /// `first`, its Write with `second`; a Copy with `first` unless it failed writing),
    /// count them and unlock its range.
    pub(super) fn op_done(&mut self, r: &mut Reactor, key: usize, first: Status, second: Status) {
        let Some(op) = self.locked.ops.try_remove(key) else {
            return;
        };
        for &s in &op.held {
            self.reqs.remove(s);
        }
        if let Some(l) = op.lock {
            unlock_and_wake(r, &op.ns, l, wake::<T>);
        }
        let nsid = op.ns.nsid;
        // The bytes written (a Write's, a Copy's destination).
        let written = Counted::Write {
            ns: &op.ns,
            bytes: (op.end - op.start) as u32,
            started: 0,
        };
        match op.kind {
            OpKind::Caw {
                cmp_cid,
                wr_cid,
                device,
                ..
            } => {
                // A Compare counts as a read once it compared, its Write as a write (NVMe
                // 2.0 §5.16.1.3).
                let compared = Counted::Read {
                    ns: &op.ns,
                    bytes: 0,
                    started: 0,
                };
                let compared = if op.next > 0 || device {
                    compared
                } else {
                    Counted::Nothing
                };
                self.finish(r, cmp_cid, &End::status(first).at(nsid, 0).counted(compared));
                self.finish(r, wr_cid, &End::status(second).at(nsid, 0).counted(written));
            }
            OpKind::Copy { cid, .. } => {
                let status = if !first.is_success() { first } else { second };
                let status = if status == FAILED_FUSED {
                    Status::INTERNAL_ERROR
                } else {
                    status
                };
                // A Copy writes its destination: a write command in SMART.
                self.finish(r, cid, &End::status(status).at(nsid, 0).counted(written));
            }
        }
    }

    /// Keep a write that met a locked range until it is unlocked: its request is Parked (one
    /// is made for a write whose data came in its capsule), its data kept here.
    pub(in crate::queue) fn park(
        &mut self,
        _r: &mut Reactor,
        cid: u16,
        io: Io,
        data: WriteData<'_>,
        slot: Option<usize>,
    ) {
        let slot = self.hold(cid, &io, slot);
        self.locked.parked.push(Parked {
            cid,
            io,
            data: Owned::keep(data),
            slot,
        });
    }

    /// A range this queue waited for was unlocked: parked writes and waiting operations
    /// try again (and may wait again).
    pub(super) fn retry_blocked(&mut self, r: &mut Reactor, id: SourceId) {
        if self.closed {
            return;
        }
        for p in std::mem::take(&mut self.locked.parked) {
            match p.data {
                Owned::Heap(v) => self.execute(r, id, p.cid, p.io, WriteData::Bytes(&v), Some(p.slot)),
                Owned::Dma(buf, len) => self.execute(r, id, p.cid, p.io, WriteData::Dma { buf, len }, Some(p.slot)),
            }
        }
        let waiting: Vec<usize> = self
            .locked
            .ops
            .iter()
            .filter(|(_, o)| o.lock.is_none())
            .map(|(k, _)| k)
            .collect();
        for k in waiting {
            self.try_start(r, id, k);
        }
        self.flush_or_close(r, id);
    }

    /// A Preempt and Abort fenced this queue's host on namespace `nsid` (`queue::reservation`):
    /// what has not started writing yet ends now with Command Abort Requested — parked
    /// writes, pairs gathering their data, locked operations still waiting for their range.
    /// Locked operations already running end as usual ([`Fused::running_on`] counts them).
    pub(in crate::queue) fn fence_fused(&mut self, r: &mut Reactor, nsid: u32) {
        let aborted = Status::ABORT_REQUESTED;
        let (mine, keep): (Vec<Parked>, Vec<Parked>) = std::mem::take(&mut self.locked.parked)
            .into_iter()
            .partition(|p| p.io.namespace().is_some_and(|n| n.nsid == nsid));
        self.locked.parked = keep;
        for p in mine {
            self.unhold(Some(p.slot));
            self.finish(r, p.cid, &End::status(aborted).at(nsid, 0));
        }
        let pairs: Vec<usize> = self
            .locked
            .pairs
            .iter()
            .filter(|(_, p)| p.ns.nsid == nsid)
            .map(|(k, _)| k)
            .collect();
        for k in pairs {
            self.drop_pair(r, k, aborted);
        }
        let waiting: Vec<usize> = self
            .locked
            .ops
            .iter()
            .filter(|(_, o)| o.ns.nsid == nsid && o.lock.is_none())
            .map(|(k, _)| k)
            .collect();
        for k in waiting {
            self.op_done(r, k, aborted, aborted);
        }
    }

    /// The queue is closing: unlock what it holds (waking the waiters), drop what waits
    /// (data buffers go back to their pools as they drop).
    pub(in crate::queue) fn fused_teardown(&mut self, r: &mut Reactor) {
        self.locked.open = None;
        for (_, op) in std::mem::take(&mut self.locked.ops) {
            if let Some(l) = op.lock {
                unlock_and_wake(r, &op.ns, l, wake::<T>);
            }
        }
        self.locked.parked.clear();
        self.locked.pairs.clear();
    }
}
