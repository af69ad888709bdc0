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
//!
//! Here: the fused pairs and the types every locked operation shares. [`locked`] runs a
//! locked operation step by step and parks the writes that meet a locked range; [`copy`]
//! turns a Copy into a locked operation.

use std::sync::Arc;

use pollux_nvme::spec::{Sqe, Status, opcode, sct};
use pollux_reactor::{Reactor, SourceId};
use slab::Slab;

mod copy;
mod locked;

use super::{Queue, Transport};
use crate::backend::{PooledDma, WriteData};
use crate::io::{self, DataIn, Io};
use crate::queue::finish::End;
use crate::range_lock::Waiter;
use crate::subsystem::Namespace;

/// Command Aborted due to Failed Fused Command (NVMe 2.0 §4.6.1.2.1, SC 09h).
pub const FAILED_FUSED: Status = Status::new(sct::GENERIC, 0x09);
/// Command Aborted due to Missing Fused Command (NVMe 2.0 §4.6.1.2.1, SC 0Ah).
pub const MISSING_FUSED: Status = Status::new(sct::GENERIC, 0x0A);

/// Write data kept past the PDU that brought it (a DMA buffer goes back to its channel's
/// pool when dropped).
#[derive(Debug)]
pub(super) enum Owned {
    /// In memory.
    Heap(Vec<u8>),
    /// In a DMA buffer of this reactor's channel, its first `len` bytes.
    Dma(PooledDma, usize),
}

impl Owned {
    fn keep(data: WriteData<'_>) -> Self {
        match data {
            WriteData::Bytes(b) => Owned::Heap(b.to_vec()),
            WriteData::Dma { buf, len } => Owned::Dma(buf, len),
        }
    }

    /// The data, copied out (a DMA buffer goes back to its pool).
    fn bytes(data: WriteData<'_>) -> Vec<u8> {
        match data {
            WriteData::Bytes(b) => b.to_vec(),
            WriteData::Dma { buf, len } => {
                let mut v = vec![0; len];
                buf.read(&mut v);
                v
            }
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
fn wake<T: Transport>(r: &mut Reactor, w: Waiter) {
    r.with_source::<Queue<T>, _>(w.source, |c, r| {
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

impl<T: Transport> Queue<T> {
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
            Some(Open::Failed) if second => return self.finish(r, cid, End::status(FAILED_FUSED).at(nsid, 0)),
            _ => {}
        }
        match fuse {
            Sqe::FUSE_NONE => self.on_plain_io(r, id, sqe, data),
            Sqe::FUSE_FIRST if sqe.opcode == opcode::io::COMPARE => self.first(r, sqe, data),
            _ if second => self.finish(r, cid, End::status(MISSING_FUSED).at(nsid, 0)),
            // FUSE 11b is reserved; no other command is part of a fused operation.
            _ => self.finish(r, cid, End::status(Status::INVALID_FIELD.with_dnr()).at(nsid, 0)),
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
                return self.finish(r, cid, End::status(s).at(nsid, lba));
            }
        };
        let Io::Compare { ns, off, len, .. } = &cmd.io else {
            self.fused.open = Some(Open::Failed);
            return self.finish(r, cid, End::status(Status::INTERNAL_ERROR).at(nsid, 0));
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
                return self.finish(r, cid, End::status(s).at(nsid, lba));
            }
        };
        let Io::Write { len, fua, .. } = &cmd.io else {
            self.drop_pair(r, k, FAILED_FUSED);
            return self.finish(r, cid, End::status(Status::INTERNAL_ERROR).at(nsid, 0));
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
            let bytes = Owned::bytes(data);
            p.expect = Some(bytes[..(p.len as usize).min(bytes.len())].to_vec());
            p.cmp_slot = None;
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
            None => self.finish(r, p.cmp_cid, End::status(status).at(nsid, 0)),
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
            (None, _) => {
                self.finish(r, w.cid, End::status(status).at(ns.nsid, 0));
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
                None => self.finish(r, p.cmp_cid, End::status(FAILED_FUSED).at(nsid, 0)),
            }
        }
    }
}
