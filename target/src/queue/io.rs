//! The I/O side of a connection: a command capsule of an I/O queue is parsed into a validated
//! command ([`crate::nvm::parse`]), gets its data (in the capsule, or fetched by the transport into a
//! buffer), runs inline (RAM) or on this reactor's channel of its
//! namespace, and completes here: its data and completion go out through the transport.

use std::sync::Arc;

use pollux_nvme::spec::{Sqe, Status};
use pollux_reactor::sys::monotonic_ns;
use pollux_reactor::{Polling, Reactor, SourceId};

use super::data::{DataBuf, DataPool, DataProgress, HeapBuf};
use super::fence;
use super::finish::{Counted, End, Payload};
use super::request::{ReqState, Request};
use super::{Queue, Role, Transport};
use crate::backend::{Completion, ReadData, Tag, WriteData, with_channel};
use crate::nvm::{self, DataIn, Io};
use crate::range_lock::Waiter;
use crate::subsystem::{HostView, Namespace};

/// A channel completed a command: hand it to its queue (on transport `T`), which flushes on
/// its next run (one write for all the completions of a poll).
pub fn deliver<T: Transport>(r: &mut Reactor, c: Completion<'_>) {
    let tag = c.tag;
    let done = r.with_source::<Queue<T>, _>(tag.source, |conn, r| {
        conn.serial == tag.serial && {
            conn.complete(r, tag.source, tag.slot, c.status, c.data);
            true
        }
    });
    if done == Some(true) {
        r.wake(tag.source);
    }
}

impl<T: Transport> Queue<T> {
    /// An NVM command on an I/O queue.
    #[inline(always)]
    pub(super) fn on_io(&mut self, r: &mut Reactor, id: SourceId, sqe: &Sqe, data: &[u8]) {
        // A fused command, or the one after the first of a fused pair (`queue::locked`).
        if sqe.fuse() != Sqe::FUSE_NONE || self.locked.open.is_some() {
            return self.on_fused(r, id, sqe, data);
        }
        self.on_plain_io(r, id, sqe, data);
    }

    /// An NVM command that is not part of a fused operation.
    #[inline(always)]
    pub(super) fn on_plain_io(&mut self, r: &mut Reactor, id: SourceId, sqe: &Sqe, data: &[u8]) {
        let (cid, nsid) = (sqe.cid.get(), sqe.nsid.get());
        let cmd = match self.validated(sqe, data) {
            Ok(cmd) => cmd,
            Err((s, lba)) => return self.finish(r, cid, &End::status(s).at(nsid, lba)),
        };
        // A namespace with QoS limits may hold the command (`queue::qos`); one without pays
        // this one load and branch.
        if cmd.io.namespace().is_some_and(|ns| ns.qos.is_on()) && self.qos_held(r, id, cid, &cmd, data) {
            return;
        }
        match cmd.data {
            DataIn::None => self.execute(r, id, cid, cmd.io, WriteData::Bytes(&[]), None),
            DataIn::InCapsule => {
                let need = cmd.io.host_data_len() as usize;
                self.execute(r, id, cid, cmd.io, WriteData::Bytes(&data[..need]), None);
            }
            DataIn::Fetch(len) => {
                self.start_fetch(r, cid, cmd.io, len);
            }
        }
    }

    /// Parse and validate an NVM command against this queue's subsystem and path.
    #[inline(always)]
    pub(super) fn validated(&mut self, sqe: &Sqe, data: &[u8]) -> Result<nvm::IoCmd, nvm::Refusal> {
        let Role::Io(q) = &mut self.role else {
            return Err((Status::COMMAND_SEQUENCE_ERROR.with_dnr(), 0));
        };
        let hostid = q.hostid;
        let max_io = self.shared.transport.max_io_size;
        let mut parsed = nvm::parse(sqe, &q.subsys, max_io, data);
        if matches!(parsed, Err((s, _)) if s == Status::INVALID_NAMESPACE.with_dnr()) {
            // Slow path, on a miss only: the subsystem may have changed (a namespace added,
            // or attached to this host) and the host may have heard of it (AER from the
            // admin queue's reactor) before this queue's reactor got the update by message.
            // The snapshot is the truth: catch up, as this host sees it, and parse again.
            let snap = self.shared.snapshot.load();
            if let Some(now) = snap.subsystem(&q.subsys.nqn)
                && !Arc::ptr_eq(now, q.subsys.subsystem())
            {
                q.subsys = HostView::new(now.clone(), &q.hostnqn);
                parsed = nvm::parse(sqe, &q.subsys, max_io, data);
            }
        }
        let cmd = parsed?;
        // NVMe 2.0 §8.1.3: no I/O on a namespace whose ANA group is inaccessible, lost or in
        // transition on this path; the status (no DNR) sends the host to another path.
        if let Some(ns) = cmd.io.namespace()
            && let Some(s) = self.ana.path_status(ns.ana_group)
        {
            return Err((s, 0));
        }
        // NVMe 2.0 §8.19.2: a reservation held by another host may bar this command. While
        // none is held (the common case) this is one atomic load.
        if let Some(ns) = cmd.io.namespace()
            && let Some(access) = cmd.io.access()
            && let Err(s) = ns.resv.check(&hostid, access)
        {
            return Err((s, 0));
        }
        Ok(cmd)
    }

    /// Run a command whose data is all here: inline on a RAM namespace, else on this
    /// reactor's channel of its namespace. `slot`: its request, when it has one already (its
    /// data was fetched).
    #[inline(always)]
    pub(super) fn execute(
        &mut self,
        r: &mut Reactor,
        id: SourceId,
        cid: u16,
        io: Io,
        data: WriteData<'_>,
        slot: Option<usize>,
    ) {
        // When the command arrived: now, or when its data was fetched.
        let started = match slot.and_then(|s| self.reqs.get_mut(s)) {
            Some(q) if q.started_ns != 0 => q.started_ns,
            _ => monotonic_ns(),
        };
        // An `always` namespace's command: the reactor busy-polls from now until a linger
        // after it (one relaxed load per command; the hold reads no clock).
        if io.namespace().is_some_and(|ns| ns.polling.get() == Polling::Always) {
            r.hold_poll();
        }
        // The data of one command of a fused pair: kept until its partner's is here too.
        if let Some(s) = slot
            && !self.locked.pairs.is_empty()
            && let Some((k, cmp)) = self.locked.pair_of(s)
        {
            return self.pair_data(r, id, k, cmp, s, data);
        }
        // A write to blocks a fused Compare and Write or a Copy has locked waits for it
        // (one atomic load when nothing is locked: `range_lock`).
        let (me, serial) = (self.reactor, self.serial);
        if io.written().is_some_and(|(ns, start, end)| {
            ns.locks.blocked(start, end, || Waiter {
                reactor: me,
                source: id,
                serial,
            })
        }) {
            return self.park(r, cid, io, data, slot);
        }
        // A read of a namespace in memory that completes inline (RAM) has nothing to run: its
        // data goes to the socket from the memory.
        let io = match io {
            Io::Read { ns, off, len } if ns.inline_reads => {
                // A held read has its request still (`queue::qos`).
                self.free(slot);
                return self.send_read(r, cid, ns, off, len, None, started);
            }
            // The host's data is kept for the comparison when the blocks have been read.
            Io::Compare { ns, off, len, .. } => {
                let WriteData::Bytes(bytes) = &data else {
                    self.free(slot);
                    return self.finish(r, cid, &End::status(Status::INTERNAL_ERROR).at(ns.nsid, 0));
                };
                let expect = bytes.to_vec();
                if ns.inline_reads {
                    self.free(slot);
                    let status = compare(&ns, off, len, &expect, None);
                    let counted = Counted::Read {
                        ns: &ns,
                        bytes: 0,
                        started: 0,
                    };
                    return self.finish(r, cid, &End::status(status).at(ns.nsid, 0).counted(counted));
                }
                // Data that was fetched: its request is in `slot` already, and its completion
                // reads the command, and so the data, from there.
                match slot.and_then(|s| self.reqs.get_mut(s)) {
                    Some(q) => {
                        q.io = Io::Compare {
                            ns: ns.clone(),
                            off,
                            len,
                            expect,
                        };
                        Io::Compare {
                            ns,
                            off,
                            len,
                            expect: Vec::new(),
                        }
                    }
                    None => Io::Compare { ns, off, len, expect },
                }
            }
            Io::Reservation { ns, cmd } => {
                self.free(slot);
                let WriteData::Bytes(keys) = &data else {
                    return self.finish(r, cid, &End::status(Status::INTERNAL_ERROR).at(ns.nsid, 0));
                };
                let keys = keys.to_vec();
                return self.reservation(r, id, cid, ns, cmd, &keys);
            }
            Io::ReservationReport { ns, len } => {
                self.free(slot);
                let page = match ns.resv.report_state() {
                    Ok(s) => s.report(len as usize),
                    Err(st) => return self.finish(r, cid, &End::status(st).at(ns.nsid, 0)),
                };
                return self.finish(r, cid, &End::ok().payload(Payload::Bytes(&page)));
            }
            Io::Copy { ns, dst, ranges, fua } => {
                // Parked while it waits for its range and runs.
                let io = Io::Copy {
                    ns: ns.clone(),
                    dst,
                    ranges,
                    fua,
                };
                let held = self.hold(cid, &io, slot);
                return self.start_copy(r, id, cid, ns, dst, ranges, fua, data, held);
            }
            Io::Verify { ns, .. } if ns.inline_reads => {
                // Memory reads back what it holds: the range checked at parse is all.
                self.free(slot);
                let counted = Counted::Read {
                    ns: &ns,
                    bytes: 0,
                    started: 0,
                };
                return self.finish(r, cid, &End::ok().counted(counted));
            }
            io => io,
        };
        let ns = io.namespace().cloned();
        let nsid = ns.as_ref().map_or(u32::MAX, |n| n.nsid);
        let op = match nvm::block_op(&io, data) {
            Ok(Some(op)) => op,
            res => {
                self.free(slot);
                return match res {
                    Err(s) => self.finish(r, cid, &End::status(s).at(nsid, 0)),
                    _ => self.end(r, cid, Status::SUCCESS),
                };
            }
        };
        let Some(ns) = ns else { return };
        if let Some(status) = ns.backend.run_inline(&op) {
            self.free(slot);
            return match io {
                Io::Read { off, len, .. } if status.is_success() => self.send_read(r, cid, ns, off, len, None, started),
                _ if status.is_success() => self.finish(r, cid, &End::ok().counted(Counted::of(&io, started))),
                _ => self.finish(r, cid, &End::status(status).at(nsid, 0)),
            };
        }
        // A request that got its data fetched (or was parked) has its slot already.
        let req = match slot {
            Some(s) => Ok(s),
            None => {
                let mut req = Request::new(cid, io, ReqState::Submitted);
                req.started_ns = started;
                Err(req)
            }
        };
        if let Err(s) = self.submit_op(r, id, &ns, op, req) {
            self.finish(r, cid, &End::status(s).at(nsid, 0));
        }
    }

    /// Submit `op` of namespace `ns` to this reactor's channel of it, for the request in a
    /// slot already (its data was fetched, or it was parked: it becomes Submitted) or a new
    /// one (Submitted). A write in flight is counted for the fences of range locks. On a
    /// refusal the request goes.
    pub(super) fn submit_op(
        &mut self,
        r: &mut Reactor,
        id: SourceId,
        ns: &Arc<Namespace>,
        op: crate::backend::BlockOp<'_>,
        req: Result<usize, Request>,
    ) -> Result<(), Status> {
        let ch = match ns.channel(r) {
            Ok(ch) => ch,
            Err(s) => {
                if let Ok(slot) = req {
                    self.reqs.remove(slot);
                }
                return Err(s);
            }
        };
        let slot = match req {
            Ok(s) => {
                if !self.reqs.is_submitted(s) {
                    self.reqs.set_state(s, ReqState::Submitted);
                }
                s
            }
            Err(req) => self.reqs.insert(req),
        };
        if let Some(q) = self.reqs.get_mut(slot)
            && q.io.written().is_some()
        {
            q.wslot = Some(fence::write_started(ns, self.reactor));
        }
        self.submit_slot(r, id, ch, slot, ns, op)
    }

    /// Submit request `slot` (already in the table) to channel `ch`; on a refusal the
    /// request goes, with the write it counted for its namespace's range locks.
    pub(super) fn submit_slot(
        &mut self,
        r: &mut Reactor,
        id: SourceId,
        ch: SourceId,
        slot: usize,
        ns: &Arc<Namespace>,
        op: crate::backend::BlockOp<'_>,
    ) -> Result<(), Status> {
        let tag = Tag {
            source: id,
            serial: self.serial,
            slot,
        };
        let res = with_channel(r, ch, |c, r| c.submit(r, tag, ns.backend.as_ref(), op))
            .unwrap_or(Err(Status::INTERNAL_ERROR));
        match res {
            // Woken, the channel tells the reactor when the completion is expected (hybrid).
            Ok(()) => {
                r.wake(ch);
                Ok(())
            }
            Err(s) => {
                if let Some(w) = self.reqs.remove(slot).and_then(|q| q.wslot) {
                    fence::write_done(r, ns, w);
                }
                Err(s)
            }
        }
    }

    /// Free a request's slot, if it has one.
    #[inline(always)]
    pub(super) fn free(&mut self, slot: Option<usize>) {
        if let Some(s) = slot {
            self.reqs.remove(s);
        }
    }

    /// A successful read ends with its `len` bytes (see [`End::read`]): `data` is what came
    /// with the completion (a file's buffer, an SSD's DMA buffer); without it the bytes are in
    /// the namespace's memory (RAM, simulated SSD), which the transport may send from where
    /// they lie. `started`: when the command arrived, for its latency histogram.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn send_read(
        &mut self,
        r: &mut Reactor,
        cid: u16,
        ns: Arc<Namespace>,
        off: u64,
        len: u32,
        data: Option<ReadData<'_>>,
        started: u64,
    ) {
        let Some(data) = data.or_else(|| ns.backend.read_in_place(off)) else {
            return self.finish(r, cid, &End::status(Status::INTERNAL_ERROR).at(ns.nsid, 0));
        };
        self.finish(r, cid, &End::read(&ns, len, data, started));
    }

    /// A channel completed the request in `slot`; a read's data comes with it (a file, an
    /// SSD) or is in the namespace's memory (a simulated device).
    fn complete(&mut self, r: &mut Reactor, id: SourceId, slot: usize, status: Status, data: Option<ReadData<'_>>) {
        // Only a submitted request completes: a tag never outlives its submission, and this
        // keeps a stray completion from freeing a request that waits for its data.
        if !self.reqs.is_submitted(slot) {
            return;
        }
        let Some(req) = self.reqs.remove(slot) else { return };
        // A write is out of flight even when its queue has closed: fences wait for it.
        if let (Some(w), Some(ns)) = (req.wslot, req.io.namespace()) {
            fence::write_done(r, &ns.clone(), w);
        }
        if self.closed {
            return;
        }
        if let Some(k) = req.step {
            return self.step_done(r, id, k, &req.io, status, data);
        }
        match req.io {
            Io::Read { ns, off, len } if status.is_success() => {
                self.send_read(r, req.cid, ns, off, len, data, req.started_ns)
            }
            Io::Compare {
                ref ns,
                off,
                len,
                ref expect,
            } if status.is_success() => {
                let status = compare(ns, off, len, expect, data);
                let end = End::status(status).at(ns.nsid, 0);
                self.finish(r, req.cid, &end.counted(Counted::of(&req.io, 0)));
            }
            io if status.is_success() => self.finish(r, req.cid, &End::ok().counted(Counted::of(&io, req.started_ns))),
            io => {
                let nsid = io.namespace().map_or(0, |n| n.nsid);
                self.finish(r, req.cid, &End::status(status).at(nsid, 0));
            }
        }
    }

    /// Abort command `cid` of this I/O queue (NVMe 2.0 §5.1) if it still waits for its data,
    /// or its backend can cancel it: whether it was aborted.
    pub(super) fn abort_pending(&mut self, r: &mut Reactor, id: SourceId, cid: u16) -> bool {
        let Some(slot) = self.reqs.awaiting_by_cid(cid) else {
            // Held by its namespace's QoS limits: it never ran, it ends now.
            return self.abort_held(r, id, cid) || self.abort_submitted(r, id, cid);
        };
        // The command is complete: its CID and queue slot are free now (a host may reuse
        // them at once). Its buffer goes; the request stays only as a tombstone so that data
        // already on its way for this tag is drained, not treated as a protocol error.
        self.complete_early(r, slot, cid, Status::ABORT_REQUESTED);
        self.flush_or_close(r, id);
        true
    }

    /// Complete request `slot` (command `cid`) with `status` while its data still comes: its
    /// buffer goes back to its pool, it stays as a tombstone that drains the rest of its data.
    pub(super) fn complete_early(&mut self, r: &mut Reactor, slot: usize, cid: u16, status: Status) {
        // Its buffer goes back to its pool as it drops.
        drop(self.reqs.complete_early(slot, status));
        self.end(r, cid, status);
        // One command of a fused pair failed before it ran: its partner fails with it.
        if !self.locked.pairs.is_empty()
            && let Some((k, _)) = self.locked.pair_of(slot)
        {
            self.pair_part_failed(r, k, slot);
        }
    }

    /// Abort submitted command `cid` where its channel can cancel it: it then completes
    /// with Command Aborted Requested through the channel, as any completion does.
    pub(super) fn abort_submitted(&mut self, r: &mut Reactor, id: SourceId, cid: u16) -> bool {
        let Some(slot) = self.reqs.submitted_by_cid(cid) else {
            return false;
        };
        let Some(ch) = self
            .reqs
            .get_mut(slot)
            .and_then(|q| q.io.namespace().cloned())
            .and_then(|ns| ns.existing_channel(r))
        else {
            return false;
        };
        let tag = Tag {
            source: id,
            serial: self.serial,
            slot,
        };
        let aborted = with_channel(r, ch, |c, r| c.abort(r, tag)).unwrap_or(false);
        if aborted {
            r.wake(ch);
        }
        aborted
    }

    // ---------------------------------------------------------------- fetched data

    /// Ask the transport for a command's `len` bytes of data, all at once: the slot of its
    /// request (the tag its data comes under), or None when it was refused (and completed).
    pub(super) fn start_fetch(&mut self, r: &mut Reactor, cid: u16, io: Io, len: u32) -> Option<usize> {
        // Command ids are the host's: two commands in flight with one id is a host bug.
        // Completed (aborted) requests kept only to drain late data do not count.
        if self.reqs.awaiting_by_cid(cid).is_some() {
            self.end(r, cid, Status::CID_CONFLICT.with_dnr());
            return None;
        }
        if self.reqs.awaiting_count() >= self.sq.entries as usize {
            self.end(r, cid, Status::COMMAND_SEQUENCE_ERROR);
            return None;
        }
        // Tombstones whose data never came are bounded: beyond a queue's worth, drop the
        // oldest (late data for it then has an unknown tag: fatal, which a host that aborts
        // a command and still sends its data much later has earned).
        if let Some(old) = self.reqs.excess_draining(self.sq.entries as usize) {
            self.reqs.remove(old);
        }
        let buf = self.fetch_buf(r, &io, len);
        let progress = DataProgress { len, received: 0 };
        let state = ReqState::AwaitingData { buf, progress };
        let mut req = Request::new(cid, io, state);
        req.started_ns = monotonic_ns();
        let tag = self.reqs.insert(req);
        self.t.fetch_data(cid, tag as u16, len);
        Some(tag)
    }

    /// A buffer for the `len` bytes of `io`'s data, to be fetched.
    pub(super) fn fetch_buf(&mut self, r: &mut Reactor, io: &Io, len: u32) -> DataBuf {
        let dma = match io {
            Io::Write { ns, .. } if ns.backend.caps().dma_data => ns
                .channel(r)
                .ok()
                .and_then(|ch| with_channel(r, ch, |c, _| c.take_buf(len as usize)))
                .flatten(),
            _ => None,
        };
        // A recycled buffer: no allocation (for large writes an mmap and its page faults).
        // Every reactor of a target has a pool from its start. Either goes back to its pool
        // when dropped, whatever becomes of the command.
        match (dma, r.local::<DataPool>()) {
            (Some(d), _) => DataBuf::Dma(d),
            (None, Some(pool)) => DataBuf::Heap(super::data::take(pool, len as usize)),
            (None, None) => DataBuf::Heap(HeapBuf::detached(vec![0; len as usize])),
        }
    }

    /// `datal` more bytes of the data asked for under `tag` are in its buffer (the
    /// transport put them there): fail the command on a bad digest, run it when all its data
    /// is in.
    pub fn data_received(&mut self, r: &mut Reactor, id: SourceId, tag: usize, datal: u32, digest_ok: bool) {
        let Some(progress) = self.reqs.add_received(tag, datal) else {
            return;
        };
        if !digest_ok && let Some(cid) = self.reqs.get_mut(tag).filter(|q| q.awaiting_data()).map(|q| q.cid) {
            // The transport's digest over the data failed: the command fails, not the queue
            // (NVMe/TCP 1.0 §3.6.2.4 says so of its data digest).
            self.complete_early(r, tag, cid, Status::TRANSIENT_TRANSPORT_ERROR);
        }
        if !progress.complete() {
            return;
        }
        // All the data is in: run the command in the same slot (drained ones just go).
        let Some((cid, io, buf)) = self.reqs.take_data(tag) else {
            self.reqs.remove(tag);
            return;
        };
        let need = io.host_data_len() as usize;
        match buf {
            DataBuf::Dma(d) => {
                let data = WriteData::Dma { buf: d, len: need };
                self.execute(r, id, cid, io, data, Some(tag));
            }
            DataBuf::Heap(v) => {
                self.execute(r, id, cid, io, WriteData::Bytes(&v[..need]), Some(tag));
            }
        }
    }
}

/// Compare's outcome (NVM Command Set 1.0 §3.2.1): the `len` bytes at `off` as read (`data`,
/// or the namespace's memory) against the host's `expect`; Compare Failure on a mismatch.
fn compare(ns: &Namespace, off: u64, len: u32, expect: &[u8], data: Option<ReadData<'_>>) -> Status {
    let Some(data) = data.or_else(|| ns.backend.read_in_place(off)) else {
        return Status::INTERNAL_ERROR;
    };
    let mut actual = Vec::with_capacity(len as usize);
    data.append_to(len as usize, &mut actual);
    if actual.len() == expect.len() && actual == expect {
        Status::SUCCESS
    } else {
        Status::COMPARE_FAILURE
    }
}
