//! Fused Compare and Write (NVMe 2.0 §3.4.2, NVM Command Set 1.0 §3.2.1, §3.2.6) and Copy
//! (NVM Command Set 1.0 §3.2.2) on an I/O queue: both are *locked operations*, which lock
//! their destination's LBA range ([`crate::range_lock`]), fence every reactor, read,
//! (compare,) write and unlock; and writes that meet a locked range park here until it is
//! unlocked. A Copy on a backend that copies itself ([`crate::backend::Caps::copy_offload`]:
//! an NVMe device's own Copy), within its limits, is one backend command between the fence
//! and the unlock instead of the reads and writes; beyond them it is read and written. So
//! is a Compare and Write on a backend that compares and writes atomically itself
//! ([`crate::backend::Caps::compare_and_write`]: an RBD image, atomic across gateways).
//!
//! Fused pairs: the first command (FUSE 01b) must be a Compare and the second (FUSE 10b) a
//! Write, submitted next on the same queue, with the same namespace and LBA range. A first
//! whose next command is not its second, and a second without a first just before it,
//! complete with Command Aborted due to Missing Fused Command (SC 0Ah); when one of a pair
//! fails before the pair runs (its own checks, a data digest error, an Abort), its partner
//! completes with Command Aborted due to Failed Fused Command (SC 09h); a miscompare
//! completes the Compare with Compare Failure and the Write with SC 09h, the blocks
//! unchanged. FUSE 11b, and FUSE on any other command, is Invalid Field. A first waits for
//! the next command to decide (SPDK does the same): a host that never sends one leaves it
//! outstanding. Either command's data may come in the capsule or by R2T; the pair runs when
//! both have it.

use std::sync::Arc;

use pollux_nvme::pci::DmaBuf;
use pollux_nvme::spec::{Sqe, Status, opcode, sct};
use pollux_reactor::{Reactor, SourceId};
use slab::Slab;

use super::Conn;
use super::io::recycle_buf;
use crate::backend::{BlockOp, ReadData, WriteData, channel_for};
use crate::io::{self, DataIn, Io};
use crate::range_lock::{self, Waiter, fence_all, unlock_and_wake};
use crate::request::{ReqState, Request};
use crate::subsystem::{Namespace, bump};
use crate::tcp::h2c::DataBuf;

/// Command Aborted due to Failed Fused Command (NVMe 2.0 §4.6.1.2.1, SC 09h).
pub const FAILED_FUSED: Status = Status::new(sct::GENERIC, 0x09);
/// Command Aborted due to Missing Fused Command (NVMe 2.0 §4.6.1.2.1, SC 0Ah).
pub const MISSING_FUSED: Status = Status::new(sct::GENERIC, 0x0A);

/// Write data kept past the PDU that brought it.
#[derive(Debug)]
pub(super) enum Owned {
    /// In memory.
    Heap(Vec<u8>),
    /// In a DMA buffer of this reactor's channel, its first `len` bytes.
    Dma(DmaBuf, usize),
}

impl Owned {
    fn keep(data: WriteData<'_>) -> Self {
        match data {
            WriteData::Bytes(b) => Owned::Heap(b.to_vec()),
            WriteData::Dma { buf, len } => Owned::Dma(buf, len),
        }
    }

    fn bytes(data: WriteData<'_>) -> (Vec<u8>, Option<DmaBuf>) {
        match data {
            WriteData::Bytes(b) => (b.to_vec(), None),
            WriteData::Dma { buf, len } => {
                let mut v = vec![0; len];
                buf.read(&mut v);
                (v, Some(buf))
            }
        }
    }

    fn recycle(self, r: &mut Reactor, ns: &Arc<Namespace>) {
        if let Owned::Dma(d, _) = self {
            recycle_buf(r, Some(ns), DataBuf::Dma(d));
        }
    }
}

/// A write that met a locked range, with its data: it runs again when the range unlocks.
#[derive(Debug)]
pub(super) struct Parked {
    cid: u16,
    io: Io,
    data: Owned,
    slot: Option<usize>,
}

/// What the next command decides for a first command of a fused pair.
#[derive(Debug, Clone, Copy)]
pub(super) enum Open {
    /// The pair `k` waits for its second.
    Pair(usize),
    /// The first failed its checks: its second fails too.
    Failed,
}

/// The Write of a fused pair.
#[derive(Debug)]
struct PairWrite {
    cid: u16,
    fua: bool,
    data: Option<Owned>,
    slot: Option<usize>,
}

/// A fused pair gathering its commands and their data.
#[derive(Debug)]
pub(super) struct Pair {
    ns: Arc<Namespace>,
    off: u64,
    len: u32,
    /// NSID, SLBA (CDW10-11) and NLB (CDW12 15:0): the second must name the same.
    key: (u32, u32, u32, u32),
    cmp_cid: u16,
    expect: Option<Vec<u8>>,
    cmp_slot: Option<usize>,
    wr: Option<PairWrite>,
}

/// What a locked operation does once its reads are in.
#[derive(Debug)]
enum OpKind {
    /// Compare the blocks with `expect`; equal, write `data`. With `device`, the store does
    /// both in one command ([`BlockOp::CompareAndWrite`], no reads).
    Caw {
        cmp_cid: u16,
        wr_cid: u16,
        expect: Vec<u8>,
        data: Option<Owned>,
        fua: bool,
        device: bool,
    },
    /// Write what was read at the start of the locked range; or, with `device`, have the
    /// backend copy these source ranges itself (one [`BlockOp::Copy`], no reads).
    Copy {
        cid: u16,
        fua: bool,
        device: Option<Vec<(u64, u64)>>,
    },
}

/// An operation on a locked range: its reads, then its writes, one step at a time.
#[derive(Debug)]
pub(super) struct LockedOp {
    ns: Arc<Namespace>,
    start: u64,
    end: u64,
    lock: Option<u64>,
    reads: Vec<(u64, u32)>,
    next: usize,
    got: Vec<u8>,
    /// Bytes written so far.
    written: u64,
    kind: OpKind,
}

/// A queue's fused pairs, locked operations and parked writes.
#[derive(Debug, Default)]
pub(super) struct Fused {
    /// A first command waiting for the next one.
    pub(super) open: Option<Open>,
    /// Pairs gathering their data.
    pub(super) pairs: Slab<Pair>,
    ops: Slab<LockedOp>,
    parked: Vec<Parked>,
}

impl Fused {
    /// Locked operations on namespace `nsid` holding their range (running).
    pub(super) fn running_on(&self, nsid: u32) -> usize {
        self.ops
            .iter()
            .filter(|(_, o)| o.ns.nsid == nsid && o.lock.is_some())
            .count()
    }

    /// The pair whose command waits for its data in request `slot`, and whether it is the
    /// Compare.
    pub(super) fn pair_of(&self, slot: usize) -> Option<(usize, bool)> {
        self.pairs.iter().find_map(|(k, p)| {
            if p.cmp_slot == Some(slot) {
                Some((k, true))
            } else if p.wr.as_ref().is_some_and(|w| w.slot == Some(slot)) {
                Some((k, false))
            } else {
                None
            }
        })
    }
}

/// Wake a connection that waited for a range: its parked writes and operations try again.
fn wake(r: &mut Reactor, w: Waiter) {
    r.with_source::<Conn, _>(w.source, |c, r| {
        if c.serial == w.serial {
            c.retry_blocked(r, w.source);
        }
    });
}

fn sqe_key(sqe: &Sqe) -> (u32, u32, u32, u32) {
    (
        sqe.nsid.get(),
        sqe.cdw10.get(),
        sqe.cdw11.get(),
        sqe.cdw12.get() & 0xFFFF,
    )
}

impl Conn {
    fn waiter(&self, id: SourceId) -> Waiter {
        Waiter {
            reactor: self.reactor,
            source: id,
            serial: self.serial,
        }
    }

    /// A command with FUSE set, or any command after the first of a fused pair.
    pub(super) fn on_fused(&mut self, r: &mut Reactor, id: SourceId, sqe: &Sqe, data: &[u8]) {
        let (cid, nsid, fuse) = (sqe.cid.get(), sqe.nsid.get(), sqe.fuse());
        let second = fuse == Sqe::FUSE_SECOND && sqe.opcode == opcode::io::WRITE;
        match self.fused.open.take() {
            Some(Open::Pair(k)) => {
                if second && self.fused.pairs.get(k).is_some_and(|p| p.key == sqe_key(sqe)) {
                    return self.second(r, id, k, sqe, data);
                }
                self.drop_pair(r, k, MISSING_FUSED);
            }
            Some(Open::Failed) if second => return self.fail(r, cid, FAILED_FUSED, nsid, 0),
            _ => {}
        }
        match fuse {
            Sqe::FUSE_NONE => self.on_plain_io(r, id, sqe, data),
            Sqe::FUSE_FIRST if sqe.opcode == opcode::io::COMPARE => self.first(r, sqe, data),
            _ if second => self.fail(r, cid, MISSING_FUSED, nsid, 0),
            // FUSE 11b is reserved; no other command is part of a fused operation.
            _ => self.fail(r, cid, Status::INVALID_FIELD.with_dnr(), nsid, 0),
        }
    }

    /// Validate a fused command as the plain command it is.
    fn fused_cmd(&mut self, sqe: &Sqe, data: &[u8]) -> Result<io::IoCmd, io::Refusal> {
        let mut plain = *sqe;
        plain.set_fuse(Sqe::FUSE_NONE);
        self.validated(&plain, data)
    }

    /// The first command of a fused pair: a Compare.
    fn first(&mut self, r: &mut Reactor, sqe: &Sqe, data: &[u8]) {
        let (cid, nsid) = (sqe.cid.get(), sqe.nsid.get());
        let cmd = match self.fused_cmd(sqe, data) {
            Ok(c) => c,
            Err((s, lba)) => {
                self.fused.open = Some(Open::Failed);
                return self.fail(r, cid, s, nsid, lba);
            }
        };
        let Io::Compare { ns, off, len, .. } = &cmd.io else {
            self.fused.open = Some(Open::Failed);
            return self.fail(r, cid, Status::INTERNAL_ERROR, nsid, 0);
        };
        let mut pair = Pair {
            ns: ns.clone(),
            off: *off,
            len: *len,
            key: sqe_key(sqe),
            cmp_cid: cid,
            expect: None,
            cmp_slot: None,
            wr: None,
        };
        match cmd.data {
            DataIn::InCapsule => pair.expect = Some(data[..*len as usize].to_vec()),
            DataIn::R2t(l) => match self.start_r2t(r, cid, cmd.io, l) {
                Some(s) => pair.cmp_slot = Some(s),
                None => {
                    self.fused.open = Some(Open::Failed);
                    return;
                }
            },
            DataIn::None => pair.expect = Some(Vec::new()),
        }
        self.fused.open = Some(Open::Pair(self.fused.pairs.insert(pair)));
    }

    /// The second command of fused pair `k`: a Write of the same blocks.
    fn second(&mut self, r: &mut Reactor, id: SourceId, k: usize, sqe: &Sqe, data: &[u8]) {
        let (cid, nsid) = (sqe.cid.get(), sqe.nsid.get());
        let cmd = match self.fused_cmd(sqe, data) {
            Ok(c) => c,
            Err((s, lba)) => {
                self.drop_pair(r, k, FAILED_FUSED);
                return self.fail(r, cid, s, nsid, lba);
            }
        };
        let Io::Write { len, fua, .. } = &cmd.io else {
            self.drop_pair(r, k, FAILED_FUSED);
            return self.fail(r, cid, Status::INTERNAL_ERROR, nsid, 0);
        };
        let mut wr = PairWrite {
            cid,
            fua: *fua,
            data: None,
            slot: None,
        };
        match cmd.data {
            DataIn::InCapsule => wr.data = Some(Owned::Heap(data[..*len as usize].to_vec())),
            DataIn::R2t(l) => match self.start_r2t(r, cid, cmd.io, l) {
                Some(s) => wr.slot = Some(s),
                None => return self.drop_pair(r, k, FAILED_FUSED),
            },
            DataIn::None => wr.data = Some(Owned::Heap(Vec::new())),
        }
        if let Some(p) = self.fused.pairs.get_mut(k) {
            p.wr = Some(wr);
        }
        self.pair_ready(r, id, k);
    }

    /// Data of a pair's command came by R2T into request `slot`.
    pub(super) fn pair_data(
        &mut self,
        r: &mut Reactor,
        id: SourceId,
        k: usize,
        cmp: bool,
        slot: usize,
        data: WriteData<'_>,
    ) {
        self.reqs.remove(slot);
        let Some(p) = self.fused.pairs.get_mut(k) else { return };
        if cmp {
            let (bytes, dma) = Owned::bytes(data);
            p.expect = Some(bytes[..(p.len as usize).min(bytes.len())].to_vec());
            p.cmp_slot = None;
            let ns = p.ns.clone();
            if let Some(d) = dma {
                recycle_buf(r, Some(&ns), DataBuf::Dma(d));
            }
        } else if let Some(w) = p.wr.as_mut() {
            w.data = Some(Owned::keep(data));
            w.slot = None;
        }
        self.pair_ready(r, id, k);
    }

    /// Run pair `k` if both its commands have their data.
    fn pair_ready(&mut self, r: &mut Reactor, id: SourceId, k: usize) {
        let ready = self
            .fused
            .pairs
            .get(k)
            .is_some_and(|p| p.expect.is_some() && p.wr.as_ref().is_some_and(|w| w.data.is_some()));
        if !ready {
            return;
        }
        if matches!(self.fused.open, Some(Open::Pair(o)) if o == k) {
            self.fused.open = None;
        }
        let p = self.fused.pairs.remove(k);
        let Some(wr) = p.wr else { return };
        // A store that compares and writes atomically itself does it in one command, within
        // one of its units: atomic for all its clients, not only this target's.
        let end = p.off + u64::from(p.len);
        let device = (p.ns.backend.caps().compare_and_write).is_some_and(|unit| p.off / unit == (end - 1) / unit);
        let op = LockedOp {
            start: p.off,
            end,
            lock: None,
            reads: if device { Vec::new() } else { vec![(p.off, p.len)] },
            next: 0,
            got: Vec::with_capacity(p.len as usize),
            written: 0,
            kind: OpKind::Caw {
                cmp_cid: p.cmp_cid,
                wr_cid: wr.cid,
                expect: p.expect.unwrap_or_default(),
                data: wr.data,
                fua: wr.fua,
                device,
            },
            ns: p.ns,
        };
        let key = self.fused.ops.insert(op);
        self.try_start(r, id, key);
    }

    /// Complete both commands of pair `k` (those that have come) with `status`.
    fn drop_pair(&mut self, r: &mut Reactor, k: usize, status: Status) {
        if matches!(self.fused.open, Some(Open::Pair(o)) if o == k) {
            self.fused.open = None;
        }
        let Some(p) = self.fused.pairs.try_remove(k) else {
            return;
        };
        let nsid = p.ns.nsid;
        match p.cmp_slot {
            Some(s) => self.complete_early(r, s, p.cmp_cid, status),
            None => self.fail(r, p.cmp_cid, status, nsid, 0),
        }
        if let Some(w) = p.wr {
            self.end_pair_write(r, &p.ns, w, status);
        }
    }

    /// Complete the Write of a pair with `status` (its data waits in its request, or came
    /// in the capsule and is kept here).
    fn end_pair_write(&mut self, r: &mut Reactor, ns: &Arc<Namespace>, w: PairWrite, status: Status) {
        match (w.slot, w.data) {
            (Some(s), _) => self.complete_early(r, s, w.cid, status),
            (None, data) => {
                if let Some(d) = data {
                    d.recycle(r, ns);
                }
                self.fail(r, w.cid, status, ns.nsid, 0);
            }
        }
    }

    /// The command of pair `k` in request `slot` completed early (an Abort, a data digest
    /// error): its partner fails with Failed Fused Command.
    pub(super) fn pair_part_failed(&mut self, r: &mut Reactor, k: usize, slot: usize) {
        if matches!(self.fused.open, Some(Open::Pair(o)) if o == k) {
            self.fused.open = Some(Open::Failed);
        }
        let Some(mut p) = self.fused.pairs.try_remove(k) else {
            return;
        };
        let nsid = p.ns.nsid;
        if p.cmp_slot == Some(slot) {
            p.cmp_slot = None;
            if let Some(w) = p.wr.take() {
                self.end_pair_write(r, &p.ns, w, FAILED_FUSED);
            }
        } else {
            match p.cmp_slot {
                Some(s) => self.complete_early(r, s, p.cmp_cid, FAILED_FUSED),
                None => self.fail(r, p.cmp_cid, FAILED_FUSED, nsid, 0),
            }
        }
    }

    /// A Copy whose source range entries are `data`: a locked operation on its destination.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn start_copy(
        &mut self,
        r: &mut Reactor,
        id: SourceId,
        cid: u16,
        ns: Arc<Namespace>,
        dst: u64,
        ranges: u32,
        fua: bool,
        data: WriteData<'_>,
    ) {
        let (bytes, dma) = Owned::bytes(data);
        if let Some(d) = dma {
            recycle_buf(r, Some(&ns), DataBuf::Dma(d));
        }
        let need = (ranges * io::COPY_RANGE_LEN) as usize;
        let srcs = match bytes.get(..need).map(|b| io::copy_ranges(b, &ns)) {
            Some(Ok(s)) => s,
            Some(Err(s)) => return self.fail(r, cid, s, ns.nsid, 0),
            None => return self.fail(r, cid, Status::DATA_SGL_LENGTH_INVALID.with_dnr(), ns.nsid, 0),
        };
        let total: u64 = srcs.iter().map(|s| s.1).sum();
        if dst.checked_add(total).is_none_or(|end| end > ns.bytes()) {
            return self.fail(
                r,
                cid,
                Status::LBA_OUT_OF_RANGE.with_dnr(),
                ns.nsid,
                dst >> ns.block_shift,
            );
        }
        // The backend's own copy (an NVMe device's Copy) when it has one and the copy is
        // within its limits: one command, under the same lock and fence, and no reads.
        // Otherwise reads no larger than a channel's buffers (MDTS), then the writes.
        let (reads, got, device) = if ns.backend.caps().copy_offload.is_some_and(|l| l.fits(&srcs)) {
            (Vec::new(), Vec::new(), Some(srcs))
        } else {
            let chunk = u64::from(self.shared.transport.max_io_size.max(ns.block_size));
            let mut reads = Vec::new();
            for (off, len) in srcs {
                let mut at = 0;
                while at < len {
                    let n = (len - at).min(chunk);
                    reads.push((off + at, n as u32));
                    at += n;
                }
            }
            (reads, Vec::with_capacity(total as usize), None)
        };
        let op = LockedOp {
            start: dst,
            end: dst + total,
            lock: None,
            reads,
            next: 0,
            got,
            written: 0,
            kind: OpKind::Copy { cid, fua, device },
            ns,
        };
        let key = self.fused.ops.insert(op);
        self.try_start(r, id, key);
    }

    /// Lock operation `key`'s range and fence every reactor; it runs when all answered. A
    /// range already locked: it waits to be woken.
    fn try_start(&mut self, r: &mut Reactor, id: SourceId, key: usize) {
        let w = self.waiter(id);
        let Some(op) = self.fused.ops.get_mut(key) else { return };
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
            let ran = r.with_source::<Conn, _>(id, |c, r| c.op_fenced(r, id, serial, key, lock));
            if ran != Some(true) {
                // The queue is gone: its lock must not outlive it.
                unlock_and_wake(r, &fenced_ns, lock, wake);
            }
        });
    }

    /// Every reactor answered operation `key`'s fence: run it. False if it is not this
    /// queue's any more.
    fn op_fenced(&mut self, r: &mut Reactor, id: SourceId, serial: u64, key: usize, lock: u64) -> bool {
        if self.serial != serial || self.closed || self.fused.ops.get(key).and_then(|o| o.lock) != Some(lock) {
            return false;
        }
        self.op_step(r, id, key);
        self.flush_or_close(r, id);
        true
    }

    /// Run operation `key` until it waits for a channel or is done.
    fn op_step(&mut self, r: &mut Reactor, id: SourceId, key: usize) {
        loop {
            let Some(op) = self.fused.ops.get_mut(key) else { return };
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
                    return self.finish(r, key, s, FAILED_FUSED);
                }
                return;
            }
            // Every read is in: compare (Compare and Write), then write.
            let write_len = match &mut op.kind {
                OpKind::Caw { expect, device, .. } => {
                    if !*device && op.written == 0 && op.got != *expect {
                        return self.finish(r, key, Status::COMPARE_FAILURE, FAILED_FUSED);
                    }
                    expect.len() as u64
                }
                OpKind::Copy { device: Some(_), .. } => op.end - op.start,
                OpKind::Copy { .. } => op.got.len() as u64,
            };
            if op.written >= write_len {
                return self.finish(r, key, Status::SUCCESS, Status::SUCCESS);
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
                    return self.finish(r, key, Status::SUCCESS, Status::INTERNAL_ERROR);
                };
                op.written = write_len;
                let (bytes, dma) = match d {
                    Owned::Heap(v) => (v, None),
                    Owned::Dma(buf, len) => Owned::bytes(WriteData::Dma { buf, len }),
                };
                if let Some(b) = dma {
                    recycle_buf(r, Some(&ns), DataBuf::Dma(b));
                }
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
                    return self.finish(r, key, s, FAILED_FUSED);
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
                    return self.finish(r, key, Status::SUCCESS, s);
                }
                return;
            }
            let off = op.start + op.written;
            let (cid, fua, data) = match &mut op.kind {
                OpKind::Caw { wr_cid, fua, data, .. } => {
                    let Some(d) = data.take() else {
                        return self.finish(r, key, Status::SUCCESS, Status::INTERNAL_ERROR);
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
            if let Some(o) = self.fused.ops.get_mut(key) {
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
                Err(s) => return self.finish(r, key, Status::SUCCESS, s),
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
        let ch = channel_for(r, &ns)?;
        let wslot = io.written().map(|_| range_lock::write_started(&ns, self.reactor));
        let mut req = Request::new(cid, io, ReqState::Submitted);
        req.step = Some(key);
        req.wslot = wslot;
        let slot = self.reqs.insert(req);
        self.submit_slot(r, id, ch, slot, &ns, op)
    }

    /// A channel completed a step (`io`) of operation `key`.
    pub(super) fn step_done(
        &mut self,
        r: &mut Reactor,
        id: SourceId,
        key: usize,
        io: &Io,
        status: Status,
        data: Option<ReadData<'_>>,
    ) {
        let Some(op) = self.fused.ops.get_mut(key) else { return };
        match io {
            Io::Read { len, off, .. } => {
                if !status.is_success() {
                    return self.finish(r, key, status, FAILED_FUSED);
                }
                let data = data.or_else(|| op.ns.backend.read_in_place(*off));
                match data {
                    Some(d) => d.append_to(*len as usize, &mut op.got),
                    None => return self.finish(r, key, Status::INTERNAL_ERROR, FAILED_FUSED),
                }
                op.next += 1;
            }
            // The store's own compare-and-write: a miscompare is the Compare's, and so is any
            // other failure (whether it compared is unknown); the Write did not run.
            _ if !status.is_success() && matches!(op.kind, OpKind::Caw { device: true, .. }) => {
                return self.finish(r, key, status, FAILED_FUSED);
            }
            _ if !status.is_success() => return self.finish(r, key, Status::SUCCESS, status),
            _ => {}
        }
        // The channel that completed the step is running (it called us): the next step is
        // submitted from a message to this reactor, once it has returned.
        let (me, serial) = (self.reactor, self.serial);
        r.send(me, move |r| {
            r.with_source::<Conn, _>(id, |c, r| {
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
    fn finish(&mut self, r: &mut Reactor, key: usize, first: Status, second: Status) {
        let Some(op) = self.fused.ops.try_remove(key) else {
            return;
        };
        if let Some(l) = op.lock {
            unlock_and_wake(r, &op.ns, l, wake);
        }
        let nsid = op.ns.nsid;
        let c = op.ns.counters(self.reactor);
        match op.kind {
            OpKind::Caw {
                cmp_cid,
                wr_cid,
                data,
                device,
                ..
            } => {
                if let Some(d) = data {
                    d.recycle(r, &op.ns);
                }
                // A Compare counts as a read, its Write as a write (NVMe 2.0 §5.16.1.3).
                if op.next > 0 || device {
                    bump(&c.read_cmds, 1);
                }
                if second.is_success() {
                    bump(&c.write_cmds, 1);
                    bump(&c.write_bytes, op.end - op.start);
                }
                self.resp_or_fail(r, cmp_cid, first, nsid);
                self.resp_or_fail(r, wr_cid, second, nsid);
            }
            OpKind::Copy { cid, .. } => {
                let status = if !first.is_success() { first } else { second };
                // A Copy writes its destination: a write command in SMART.
                if status.is_success() {
                    bump(&c.write_cmds, 1);
                    bump(&c.write_bytes, op.end - op.start);
                }
                let status = if status == FAILED_FUSED {
                    Status::INTERNAL_ERROR
                } else {
                    status
                };
                self.resp_or_fail(r, cid, status, nsid);
            }
        }
    }

    /// Keep a write that met a locked range until it is unlocked.
    pub(super) fn park(&mut self, _r: &mut Reactor, cid: u16, io: Io, data: WriteData<'_>, slot: Option<usize>) {
        self.fused.parked.push(Parked {
            cid,
            io,
            data: Owned::keep(data),
            slot,
        });
    }

    /// A range this queue waited for was unlocked: parked writes and waiting operations
    /// try again (and may wait again).
    fn retry_blocked(&mut self, r: &mut Reactor, id: SourceId) {
        if self.closed {
            return;
        }
        for p in std::mem::take(&mut self.fused.parked) {
            match p.data {
                Owned::Heap(v) => self.execute(r, id, p.cid, p.io, WriteData::Bytes(&v), p.slot),
                Owned::Dma(buf, len) => self.execute(r, id, p.cid, p.io, WriteData::Dma { buf, len }, p.slot),
            }
        }
        let waiting: Vec<usize> = self
            .fused
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

    /// A Preempt and Abort fenced this queue's host on namespace `nsid` (`conn::resv`):
    /// what has not started writing yet ends now with Command Abort Requested — parked
    /// writes, pairs gathering their data, locked operations still waiting for their range.
    /// Locked operations already running end as usual ([`Fused::running_on`] counts them).
    pub(super) fn fence_fused(&mut self, r: &mut Reactor, nsid: u32) {
        let aborted = Status::ABORT_REQUESTED;
        let (mine, keep): (Vec<Parked>, Vec<Parked>) = std::mem::take(&mut self.fused.parked)
            .into_iter()
            .partition(|p| p.io.namespace().is_some_and(|n| n.nsid == nsid));
        self.fused.parked = keep;
        for p in mine {
            if let Some(ns) = p.io.namespace().cloned() {
                p.data.recycle(r, &ns);
            }
            if let Some(s) = p.slot {
                self.reqs.remove(s);
            }
            self.fail(r, p.cid, aborted, nsid, 0);
        }
        let pairs: Vec<usize> = self
            .fused
            .pairs
            .iter()
            .filter(|(_, p)| p.ns.nsid == nsid)
            .map(|(k, _)| k)
            .collect();
        for k in pairs {
            self.drop_pair(r, k, aborted);
        }
        let waiting: Vec<usize> = self
            .fused
            .ops
            .iter()
            .filter(|(_, o)| o.ns.nsid == nsid && o.lock.is_none())
            .map(|(k, _)| k)
            .collect();
        for k in waiting {
            self.finish(r, k, aborted, aborted);
        }
    }

    /// The queue is closing: unlock what it holds (waking the waiters), drop what waits.
    pub(super) fn fused_teardown(&mut self, r: &mut Reactor) {
        self.fused.open = None;
        for (_, op) in std::mem::take(&mut self.fused.ops) {
            if let Some(l) = op.lock {
                unlock_and_wake(r, &op.ns, l, wake);
            }
            if let OpKind::Caw { data: Some(d), .. } = op.kind {
                d.recycle(r, &op.ns);
            }
        }
        for p in std::mem::take(&mut self.fused.parked) {
            if let Some(ns) = p.io.namespace().cloned() {
                p.data.recycle(r, &ns);
            }
        }
        for (_, p) in std::mem::take(&mut self.fused.pairs) {
            if let Some(d) = p.wr.and_then(|w| w.data) {
                d.recycle(r, &p.ns);
            }
        }
    }
}
