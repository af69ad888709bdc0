//! Locked operations (NVMe 2.0 §3.4.2, NVM Command Set 1.0 §3.2): a fused Compare and Write
//! ([`fused`]) and a Copy ([`copy`]) each lock their destination's LBA range
//! ([`crate::range_lock`]), fence every reactor, read, (compare,) write and unlock, one step at
//! a time ([`run`]); writes that meet a locked range park until it is unlocked. A Copy on a
//! backend that copies itself ([`crate::backend::Caps::copy_offload`]: an NVMe device's own
//! Copy), within its limits, is one backend command between the fence and the unlock instead
//! of the reads and writes; beyond them it is read and written. So is a Compare and Write on a
//! backend that compares and writes atomically itself
//! ([`crate::backend::Caps::compare_and_write`]: an RBD image, atomic across gateways).
//!
//! Here: the state every locked operation shares, and what the queue keeps of them.

use std::sync::Arc;

use pollux_reactor::sys::monotonic_ns;
use pollux_reactor::{Reactor, SourceId};
use slab::Slab;

mod copy;
mod fused;
mod run;

pub use fused::FAILED_FUSED;

use super::request::{ReqState, Request};
use super::{Queue, Transport};
use crate::backend::{PooledDma, WriteData};
use crate::nvm::Io;
use crate::range_lock::Waiter;
use crate::subsystem::Namespace;
use fused::{Open, Pair};

/// Write data kept past the transport's receive that brought it (a DMA buffer goes back to its channel's
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
    /// Its Parked request.
    slot: usize,
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
    /// The slots of the Parked requests of the commands it ends (freed when it ends).
    held: Vec<usize>,
}

/// A queue's fused pairs, locked operations and parked writes.
#[derive(Debug, Default)]
pub(super) struct Locked {
    /// A first command waiting for the next one.
    pub(super) open: Option<Open>,
    /// Pairs gathering their data.
    pub(super) pairs: Slab<Pair>,
    ops: Slab<LockedOp>,
    parked: Vec<Parked>,
}

impl Locked {
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

impl<T: Transport> Queue<T> {
    /// Keep command `cid` (`io`) as a Parked request while a locked operation or its fused
    /// partner holds it: in `slot` (its data was fetched) or a new slot. Its slot.
    pub(in crate::queue) fn hold(&mut self, cid: u16, io: &Io, slot: Option<usize>) -> usize {
        match slot {
            Some(s) => {
                self.reqs.set_state(s, ReqState::Parked);
                s
            }
            None => {
                let mut req = Request::new(cid, io.clone(), ReqState::Parked);
                // Arrived now: a parked write's latency counts from here.
                req.started_ns = monotonic_ns();
                self.reqs.insert(req)
            }
        }
    }

    /// A held command ends: its Parked request goes.
    pub(super) fn unhold(&mut self, slot: Option<usize>) {
        if let Some(s) = slot {
            self.reqs.remove(s);
        }
    }

    fn waiter(&self, id: SourceId) -> Waiter {
        Waiter {
            reactor: self.reactor,
            source: id,
            serial: self.serial,
        }
    }
}
