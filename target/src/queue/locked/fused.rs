//! Fused Compare and Write (NVMe 2.0 §3.4.2, NVM Command Set 1.0 §3.2.1, §3.2.6): the pair
//! of commands gathered here becomes one locked operation ([`super::run`]).
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
//! outstanding. Either command's data may come in the capsule or be fetched; the pair runs when
//! both have it.

use std::sync::Arc;

use pollux_nvme::spec::{Sqe, Status, opcode, sct};
use pollux_reactor::{Reactor, SourceId};

use super::super::request::ReqState;
use super::{LockedOp, OpKind, Owned, Queue, Transport};
use crate::backend::WriteData;
use crate::nvm::{self, DataIn, Io};
use crate::queue::finish::End;
use crate::subsystem::Namespace;

/// Command Aborted due to Failed Fused Command (NVMe 2.0 §4.6.1.2.1, SC 09h).
pub const FAILED_FUSED: Status = Status::new(sct::GENERIC, 0x09);
/// Command Aborted due to Missing Fused Command (NVMe 2.0 §4.6.1.2.1, SC 0Ah).
pub const MISSING_FUSED: Status = Status::new(sct::GENERIC, 0x0A);

/// What the next command decides for a first command of a fused pair.
#[derive(Debug, Clone, Copy)]
pub(in crate::queue) enum Open {
    /// The pair `k` waits for its second.
    Pair(usize),
    /// The first failed its checks: its second fails too.
    Failed,
}

/// The Write of a fused pair.
#[derive(Debug)]
pub(in crate::queue) struct PairWrite {
    pub(super) cid: u16,
    pub(super) fua: bool,
    pub(super) data: Option<Owned>,
    pub(super) slot: Option<usize>,
    /// Its Parked request once its data is here.
    pub(super) held: Option<usize>,
}

/// A fused pair gathering its commands and their data.
#[derive(Debug)]
pub(in crate::queue) struct Pair {
    pub(super) ns: Arc<Namespace>,
    pub(super) off: u64,
    pub(super) len: u32,
    /// NSID, SLBA (CDW10-11) and NLB (CDW12 15:0): the second must name the same.
    pub(super) key: (u32, u32, u32, u32),
    pub(super) cmp_cid: u16,
    pub(super) expect: Option<Vec<u8>>,
    pub(super) cmp_slot: Option<usize>,
    /// The Compare's Parked request once its data is here.
    pub(super) cmp_held: Option<usize>,
    pub(super) wr: Option<PairWrite>,
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
    /// A command with FUSE set, or any command after the first of a fused pair.
    pub(in crate::queue) fn on_fused(&mut self, r: &mut Reactor, id: SourceId, sqe: &Sqe, data: &[u8]) {
        let (cid, nsid, fuse) = (sqe.cid.get(), sqe.nsid.get(), sqe.fuse());
        let second = fuse == Sqe::FUSE_SECOND && sqe.opcode == opcode::io::WRITE;
        match self.locked.open.take() {
            Some(Open::Pair(k)) => {
                if second && self.locked.pairs.get(k).is_some_and(|p| p.key == sqe_key(sqe)) {
                    return self.second(r, id, k, sqe, data);
                }
                self.drop_pair(r, k, MISSING_FUSED);
            }
            Some(Open::Failed) if second => return self.finish(r, cid, &End::status(FAILED_FUSED).at(nsid, 0)),
            _ => {}
        }
        match fuse {
            Sqe::FUSE_NONE => self.on_plain_io(r, id, sqe, data),
            Sqe::FUSE_FIRST if sqe.opcode == opcode::io::COMPARE => self.first(r, sqe, data),
            _ if second => self.finish(r, cid, &End::status(MISSING_FUSED).at(nsid, 0)),
            // FUSE 11b is reserved; no other command is part of a fused operation.
            _ => self.finish(r, cid, &End::status(Status::INVALID_FIELD.with_dnr()).at(nsid, 0)),
        }
    }

    /// Validate a fused command as the plain command it is.
    fn fused_cmd(&mut self, sqe: &Sqe, data: &[u8]) -> Result<nvm::IoCmd, nvm::Refusal> {
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
                self.locked.open = Some(Open::Failed);
                return self.finish(r, cid, &End::status(s).at(nsid, lba));
            }
        };
        let Io::Compare { ns, off, len, .. } = &cmd.io else {
            self.locked.open = Some(Open::Failed);
            return self.finish(r, cid, &End::status(Status::INTERNAL_ERROR).at(nsid, 0));
        };
        let mut pair = Pair {
            ns: ns.clone(),
            off: *off,
            len: *len,
            key: sqe_key(sqe),
            cmp_cid: cid,
            expect: None,
            cmp_slot: None,
            cmp_held: None,
            wr: None,
        };
        match cmd.data {
            DataIn::InCapsule => {
                pair.expect = Some(data[..*len as usize].to_vec());
                pair.cmp_held = Some(self.hold(cid, &cmd.io, None));
            }
            DataIn::Fetch(l) => match self.start_fetch(r, cid, cmd.io, l) {
                Some(s) => pair.cmp_slot = Some(s),
                None => {
                    self.locked.open = Some(Open::Failed);
                    return;
                }
            },
            DataIn::None => {
                pair.expect = Some(Vec::new());
                pair.cmp_held = Some(self.hold(cid, &cmd.io, None));
            }
        }
        self.locked.open = Some(Open::Pair(self.locked.pairs.insert(pair)));
    }

    /// The second command of fused pair `k`: a Write of the same blocks.
    fn second(&mut self, r: &mut Reactor, id: SourceId, k: usize, sqe: &Sqe, data: &[u8]) {
        let (cid, nsid) = (sqe.cid.get(), sqe.nsid.get());
        let cmd = match self.fused_cmd(sqe, data) {
            Ok(c) => c,
            Err((s, lba)) => {
                self.drop_pair(r, k, FAILED_FUSED);
                return self.finish(r, cid, &End::status(s).at(nsid, lba));
            }
        };
        let Io::Write { len, fua, .. } = &cmd.io else {
            self.drop_pair(r, k, FAILED_FUSED);
            return self.finish(r, cid, &End::status(Status::INTERNAL_ERROR).at(nsid, 0));
        };
        let mut wr = PairWrite {
            cid,
            fua: *fua,
            data: None,
            slot: None,
            held: None,
        };
        match cmd.data {
            DataIn::InCapsule => {
                wr.data = Some(Owned::Heap(data[..*len as usize].to_vec()));
                wr.held = Some(self.hold(cid, &cmd.io, None));
            }
            DataIn::Fetch(l) => match self.start_fetch(r, cid, cmd.io, l) {
                Some(s) => wr.slot = Some(s),
                None => return self.drop_pair(r, k, FAILED_FUSED),
            },
            DataIn::None => {
                wr.data = Some(Owned::Heap(Vec::new()));
                wr.held = Some(self.hold(cid, &cmd.io, None));
            }
        }
        if let Some(p) = self.locked.pairs.get_mut(k) {
            p.wr = Some(wr);
        }
        self.pair_ready(r, id, k);
    }

    /// Data of a pair's command was fetched into request `slot`.
    pub(in crate::queue) fn pair_data(
        &mut self,
        r: &mut Reactor,
        id: SourceId,
        k: usize,
        cmp: bool,
        slot: usize,
        data: WriteData<'_>,
    ) {
        // It waits for its partner, Parked in its slot.
        self.reqs.set_state(slot, ReqState::Parked);
        let Some(p) = self.locked.pairs.get_mut(k) else { return };
        if cmp {
            let bytes = Owned::bytes(data);
            p.expect = Some(bytes[..(p.len as usize).min(bytes.len())].to_vec());
            p.cmp_slot = None;
            p.cmp_held = Some(slot);
        } else if let Some(w) = p.wr.as_mut() {
            w.data = Some(Owned::keep(data));
            w.slot = None;
            w.held = Some(slot);
        }
        self.pair_ready(r, id, k);
    }

    /// Run pair `k` if both its commands have their data.
    fn pair_ready(&mut self, r: &mut Reactor, id: SourceId, k: usize) {
        let ready = self
            .locked
            .pairs
            .get(k)
            .is_some_and(|p| p.expect.is_some() && p.wr.as_ref().is_some_and(|w| w.data.is_some()));
        if !ready {
            return;
        }
        if matches!(self.locked.open, Some(Open::Pair(o)) if o == k) {
            self.locked.open = None;
        }
        let p = self.locked.pairs.remove(k);
        let Some(wr) = p.wr else { return };
        // A store that compares and writes atomically itself does it in one command, within
        // one of its units: atomic for all its clients, not only this target's.
        let end = p.off + u64::from(p.len);
        let device = (p.ns.backend.caps().compare_and_write).is_some_and(|unit| p.off / unit == (end - 1) / unit);
        let held = [p.cmp_held, wr.held].into_iter().flatten().collect();
        let op = LockedOp {
            held,
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
        let key = self.locked.ops.insert(op);
        self.try_start(r, id, key);
    }

    /// Complete both commands of pair `k` (those that have come) with `status`.
    pub(in crate::queue) fn drop_pair(&mut self, r: &mut Reactor, k: usize, status: Status) {
        if matches!(self.locked.open, Some(Open::Pair(o)) if o == k) {
            self.locked.open = None;
        }
        let Some(p) = self.locked.pairs.try_remove(k) else {
            return;
        };
        let nsid = p.ns.nsid;
        match p.cmp_slot {
            Some(s) => self.complete_early(r, s, p.cmp_cid, status),
            None => {
                self.unhold(p.cmp_held);
                self.finish(r, p.cmp_cid, &End::status(status).at(nsid, 0));
            }
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
                self.unhold(w.held);
                self.finish(r, w.cid, &End::status(status).at(ns.nsid, 0));
            }
        }
    }

    /// The command of pair `k` in request `slot` completed early (an Abort, a data digest
    /// error): its partner fails with Failed Fused Command.
    pub(in crate::queue) fn pair_part_failed(&mut self, r: &mut Reactor, k: usize, slot: usize) {
        if matches!(self.locked.open, Some(Open::Pair(o)) if o == k) {
            self.locked.open = Some(Open::Failed);
        }
        let Some(mut p) = self.locked.pairs.try_remove(k) else {
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
                None => {
                    self.unhold(p.cmp_held);
                    self.finish(r, p.cmp_cid, &End::status(FAILED_FUSED).at(nsid, 0));
                }
            }
        }
    }
}
