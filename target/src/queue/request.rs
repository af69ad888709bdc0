//! A queue's requests and their life (SPDK: `nvmf_tcp_req_state` in `tcp.c`), in one place so
//! that abort, timeouts, teardown and `pollux ctl` have one place to look.
//!
//! A command capsule is *received* and parsed into a validated command ([`crate::nvm`]) in one
//! step; one that needs no more data and completes at once (a read of memory, a refusal)
//! goes straight to its end (`Queue::finish`). Those that outlive the capsule that brought
//! them take a slot of the queue's [`Requests`], whose key is the tag the transport's fetched
//! data comes under and the tag a backend completes with, and are in one [`ReqState`]:
//! - [`ReqState::AwaitingData`]: its data was asked for (fetched) and arrives into its
//!   buffer;
//! - [`ReqState::Parked`]: it has its data and waits: a write behind a range a locked
//!   operation holds ([`crate::range_lock`]), a command of a fused pair for its partner, or
//!   a fused pair or Copy while its locked operation waits for its range and runs (its steps
//!   are requests of their own);
//! - [`ReqState::Held`]: its namespace's QoS budget ([`crate::qos`]) lets it run only later:
//!   it waits in its queue's arrival order for its time (`queue::qos`), a write's data not
//!   yet asked for;
//! - [`ReqState::Submitted`]: its namespace's channel has it;
//! - [`ReqState::Draining`]: it completed before all its data came (aborted, or a data digest
//!   error): the rest of its data is drained, not treated as a protocol error, then the slot
//!   goes.
//!
//! Every change of state goes through [`Requests`], which keeps the count of each state, for
//! the queue (data fetch checks, SQ accounting) and for its reactor ([`RequestStats`], shown by
//! `pollux ctl reactors`). *Completing* and *sending* are not states a request waits in: its
//! data and completion go to the transport as it ends, and its slot is free (*done*) at once,
//! as the host may reuse the command id as soon as it has the completion.

use std::sync::Arc;

use pollux_nvme::spec::Status;
use slab::Slab;

use super::data::{DataBuf, DataProgress};
use crate::nvm::Io;
pub use crate::shared::requests::{ReqKind, RequestCounts, RequestStats};

/// Where a request is.
#[derive(Debug)]
pub enum ReqState {
    /// Its data was asked for: it arrives into `buf`.
    AwaitingData {
        /// The buffer the data goes into.
        buf: DataBuf,
        /// How much of it came.
        progress: DataProgress,
    },
    /// Completed early with this status while its data still comes: drained, then dropped.
    Draining {
        /// How much of its data came.
        progress: DataProgress,
        /// The status it completed with.
        status: Status,
    },
    /// Has its data and waits for a locked range, its fused partner or its locked operation
    /// (the data is kept by the locked operations, `queue::locked`).
    Parked,
    /// Submitted to its namespace's channel.
    Submitted,
    /// Over its namespace's QoS budget: waits for its time (`queue::qos`), with what it needs
    /// to run then.
    Held(HeldData),
}

/// What a held command keeps until it runs: its data, when it came in the capsule (the
/// receive buffer it lies in is reused), or the length to fetch once it runs (a
/// held write costs no buffer).
#[derive(Debug, Default)]
pub enum HeldData {
    /// No data (a read), or taken already.
    #[default]
    None,
    /// The in-capsule data.
    Capsule(Vec<u8>),
    /// The bytes to fetch.
    Fetch(u32),
}

impl ReqState {
    /// Its kind.
    #[inline]
    pub fn kind(&self) -> ReqKind {
        match self {
            ReqState::AwaitingData { .. } => ReqKind::AwaitingData,
            ReqState::Draining { .. } => ReqKind::Draining,
            ReqState::Parked => ReqKind::Parked,
            ReqState::Submitted => ReqKind::Submitted,
            ReqState::Held(_) => ReqKind::Held,
        }
    }
}

/// One request.
#[derive(Debug)]
pub struct Request {
    /// The host's command id.
    pub cid: u16,
    /// The command.
    pub io: Io,
    /// Where it is.
    pub state: ReqState,
    /// The locked operation (fused Compare and Write, Copy) whose step this is: its key in
    /// the connection's operations (`queue::locked`).
    pub step: Option<usize>,
    /// The fence slot a write was counted in while in flight ([`crate::range_lock`]).
    pub wslot: Option<u8>,
    /// When the command arrived (CLOCK_MONOTONIC, ns; 0: not timed), for its namespace's
    /// latency histogram ([`crate::latency`]).
    pub started_ns: u64,
}

impl Request {
    /// A request of command `cid`, not a step, not counted.
    pub fn new(cid: u16, io: Io, state: ReqState) -> Self {
        Self {
            cid,
            io,
            state,
            step: None,
            wslot: None,
            started_ns: 0,
        }
    }

    /// Waiting for its data (not completed yet).
    pub fn awaiting_data(&self) -> bool {
        matches!(self.state, ReqState::AwaitingData { .. })
    }

    /// Its fetched data's progress, while data is still expected (awaited or drained).
    pub fn fetch_progress(&self) -> Option<DataProgress> {
        match &self.state {
            ReqState::AwaitingData { progress, .. } | ReqState::Draining { progress, .. } => Some(*progress),
            ReqState::Submitted | ReqState::Parked | ReqState::Held(_) => None,
        }
    }
}

/// A queue's outstanding requests, by slot. Every change of state goes through its methods
/// (one function, [`Requests::moved`], counts them), which keep the count of each state (the
/// data fetch checks of every write read them) and their reactor's [`RequestStats`].
#[derive(Debug, Default)]
pub struct Requests {
    slots: Slab<Request>,
    counts: [usize; 5],
    stats: Arc<RequestStats>,
    /// Commands of the queue received and not yet ended (held AERs and commands waiting
    /// for another reactor or thread included): each must end in exactly one completion,
    /// or be counted dropped when the queue closes.
    open: u64,
    /// The AERs of the queue's controller counted in its reactor's figures.
    aers: u64,
}

impl Requests {
    /// A queue's requests, counted in its reactor's `stats`.
    pub fn new(stats: Arc<RequestStats>) -> Self {
        Self {
            stats,
            ..Self::default()
        }
    }

    /// The one place a request changes state: from `from` (None: just received) to `to`
    /// (None: done).
    #[inline]
    fn moved(&mut self, from: Option<ReqKind>, to: Option<ReqKind>) {
        if let Some(f) = from {
            self.counts[f as usize] -= 1;
        }
        if let Some(t) = to {
            self.counts[t as usize] += 1;
        }
        self.stats.moved(from, to);
    }

    /// A command of the queue ended (`ok`: successfully), counted for its reactor.
    #[inline]
    pub fn finished(&mut self, ok: bool) {
        self.open = self.open.saturating_sub(1);
        self.stats.finished(ok);
    }

    /// `n` commands arrived on the queue (or came with it from the previous process).
    #[inline]
    pub fn received(&mut self, n: u64) {
        self.open += n;
        self.stats.received(n);
    }

    /// Commands received and not yet ended.
    pub fn open(&self) -> u64 {
        self.open
    }

    /// The queue's controller holds `n` AERs now.
    pub fn aers_held(&mut self, n: u64) {
        if n != self.aers {
            self.stats.aers_held(self.aers, n);
            self.aers = n;
        }
    }

    /// The queue closed or left the process: its open commands never end here, its AERs
    /// are no longer held here.
    pub fn forget_open(&mut self) {
        self.stats.dropped(std::mem::take(&mut self.open));
        self.aers_held(0);
    }

    /// Add a request; its slot.
    pub fn insert(&mut self, req: Request) -> usize {
        self.moved(None, Some(req.state.kind()));
        self.slots.insert(req)
    }

    /// Put the request in `slot` in `state`; its state before (None: no such request).
    pub fn set_state(&mut self, slot: usize, state: ReqState) -> Option<ReqState> {
        let req = self.slots.get_mut(slot)?;
        let (from, to) = (req.state.kind(), state.kind());
        let old = std::mem::replace(&mut req.state, state);
        self.moved(Some(from), Some(to));
        Some(old)
    }

    /// The request in `slot`, to read or to fill its buffer (its state changes only through
    /// the methods of [`Requests`]).
    pub fn get_mut(&mut self, slot: usize) -> Option<&mut Request> {
        self.slots.get_mut(slot)
    }

    /// The request that has waited longest, described for a person (`cid 7: Write of NSID
    /// 1, submitted for 2.31 s`): why a queue is still busy.
    pub fn oldest(&self, now_ns: u64) -> Option<String> {
        let (_, req) = self
            .slots
            .iter()
            .min_by_key(|(_, r)| if r.started_ns == 0 { u64::MAX } else { r.started_ns })?;
        let nsid = req.io.namespace().map_or(0, |n| n.nsid);
        let state = match req.state.kind() {
            ReqKind::AwaitingData => "awaiting its data",
            ReqKind::Draining => "completed, its data still coming",
            ReqKind::Parked => "parked (a locked range or its fused partner)",
            ReqKind::Submitted => "submitted to its backend",
            ReqKind::Held => "held by QoS",
        };
        let age = match req.started_ns {
            0 => String::new(),
            t => format!(" for {:.2} s", now_ns.saturating_sub(t) as f64 / 1e9),
        };
        Some(format!(
            "cid {}: {} of NSID {nsid}, {state}{age}",
            req.cid,
            req.io.name()
        ))
    }

    /// Whether the request in `slot` was submitted to its backend.
    pub fn is_submitted(&self, slot: usize) -> bool {
        matches!(
            self.slots.get(slot),
            Some(Request {
                state: ReqState::Submitted,
                ..
            })
        )
    }

    /// No request at all, draining ones included: nothing of the queue's commands is left
    /// in the stream or at a backend (a hot upgrade hands a queue over only then).
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Requests not yet completed: awaiting data, parked, held or at their backend (the
    /// drained tombstones' completions went already).
    pub fn in_flight(&self) -> usize {
        self.slots.len() - self.counts[ReqKind::Draining as usize]
    }

    /// Remove the request in `slot`.
    pub fn remove(&mut self, slot: usize) -> Option<Request> {
        let req = self.slots.try_remove(slot)?;
        self.moved(Some(req.state.kind()), None);
        Some(req)
    }

    /// Remove every request (the queue is closing).
    pub fn drain(&mut self) -> Vec<Request> {
        let all: Vec<Request> = self.slots.drain().collect();
        for req in &all {
            self.moved(Some(req.state.kind()), None);
        }
        all
    }

    /// All the data of the request awaiting it in `slot` is in: it becomes Submitted, and
    /// its command id, command and buffer come out. None unless it was awaiting data.
    pub fn take_data(&mut self, slot: usize) -> Option<(u16, Io, DataBuf)> {
        self.slots.get(slot).filter(|r| r.awaiting_data())?;
        let Some(ReqState::AwaitingData { buf, .. }) = self.set_state(slot, ReqState::Submitted) else {
            return None;
        };
        let req = self.slots.get(slot)?;
        Some((req.cid, req.io.clone(), buf))
    }

    /// Add `n` received bytes to the fetched data of the request in `slot`; its progress then.
    pub fn add_received(&mut self, slot: usize, n: u32) -> Option<DataProgress> {
        match &mut self.slots.get_mut(slot)?.state {
            ReqState::AwaitingData { progress, .. } | ReqState::Draining { progress, .. } => {
                progress.received += n;
                Some(*progress)
            }
            ReqState::Submitted | ReqState::Parked | ReqState::Held(_) => None,
        }
    }

    /// The slot of the request whose data was fetched under `tag` for command `cid` (awaited
    /// or drained): a transport's data names both, and both must match.
    pub fn fetch_target(&self, tag: usize, cid: u16) -> Option<(usize, DataProgress)> {
        let req = self.slots.get(tag).filter(|r| r.cid == cid)?;
        req.fetch_progress().map(|p| (tag, p))
    }

    /// The slot of the live (not yet completed) request waiting for data with command id
    /// `cid`.
    pub fn awaiting_by_cid(&self, cid: u16) -> Option<usize> {
        if self.counts[ReqKind::AwaitingData as usize] == 0 {
            return None;
        }
        self.slots
            .iter()
            .find(|(_, r)| r.cid == cid && r.awaiting_data())
            .map(|(k, _)| k)
    }

    /// The slot of the held request with command id `cid`.
    pub fn held_by_cid(&self, cid: u16) -> Option<usize> {
        if self.counts[ReqKind::Held as usize] == 0 {
            return None;
        }
        self.slots
            .iter()
            .find(|(_, r)| r.cid == cid && matches!(r.state, ReqState::Held(_)))
            .map(|(k, _)| k)
    }

    /// Whether the request in `slot` is held.
    pub fn is_held(&self, slot: usize) -> bool {
        matches!(
            self.slots.get(slot),
            Some(Request {
                state: ReqState::Held(_),
                ..
            })
        )
    }

    /// The slot of the submitted request with command id `cid`.
    pub fn submitted_by_cid(&self, cid: u16) -> Option<usize> {
        self.slots
            .iter()
            .find(|(_, r)| r.cid == cid && matches!(r.state, ReqState::Submitted))
            .map(|(k, _)| k)
    }

    /// The live requests of namespace `nsid` waiting for data or submitted (not drained
    /// tombstones, nor Parked ones, which their locked operations or parked-write lists end):
    /// (slot, command id, submitted).
    pub fn of_namespace(&self, nsid: u32) -> Vec<(usize, u16, bool)> {
        self.slots
            .iter()
            .filter(|(_, r)| matches!(r.state, ReqState::AwaitingData { .. } | ReqState::Submitted))
            .filter(|(_, r)| r.io.namespace().is_some_and(|n| n.nsid == nsid))
            .map(|(k, r)| (k, r.cid, matches!(r.state, ReqState::Submitted)))
            .collect()
    }

    /// Requests waiting for their data.
    pub fn awaiting_count(&self) -> usize {
        self.counts[ReqKind::AwaitingData as usize]
    }

    /// The oldest drained request (lowest slot), if more than `max` are drained: tombstones
    /// whose data never came are bounded.
    pub fn excess_draining(&self, max: usize) -> Option<usize> {
        if self.counts[ReqKind::Draining as usize] <= max {
            return None;
        }
        let mut draining = self
            .slots
            .iter()
            .filter(|(_, r)| matches!(r.state, ReqState::Draining { .. }));
        let first = draining.next()?.0;
        (draining.count() + 1 > max).then_some(first)
    }

    /// Complete the request in `slot` early with `status` while its data is still coming:
    /// its buffer is returned, it stays as a tombstone that drains the rest of its data.
    pub fn complete_early(&mut self, slot: usize, status: Status) -> Option<DataBuf> {
        let req = self.slots.get(slot).filter(|r| r.awaiting_data())?;
        let progress = req.fetch_progress()?;
        match self.set_state(slot, ReqState::Draining { progress, status })? {
            ReqState::AwaitingData { buf, .. } => Some(buf),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::subsystem::test_namespace;

    fn write(cid: u16, len: u32) -> Request {
        let ns = test_namespace(1, 64);
        Request::new(
            cid,
            Io::Write {
                ns,
                off: 0,
                len,
                fua: false,
            },
            ReqState::AwaitingData {
                buf: DataBuf::Heap(crate::queue::data::HeapBuf::detached(vec![0; len as usize])),
                progress: DataProgress { len, received: 0 },
            },
        )
    }

    #[test]
    fn an_aborted_request_drains_its_data_and_no_longer_counts_as_awaiting() {
        let mut reqs = Requests::default();
        let a = reqs.insert(write(7, 4096));
        let b = reqs.insert(write(8, 4096));
        assert_eq!(reqs.awaiting_by_cid(7), Some(a));
        assert_eq!(reqs.awaiting_count(), 2);
        // Fetched data names the request by tag and command id together.
        assert_eq!(reqs.fetch_target(a, 7).map(|(k, p)| (k, p.len)), Some((a, 4096)));
        assert!(reqs.fetch_target(a, 8).is_none());
        // Completed early: its buffer comes back once, the slot stays to drain late data.
        assert!(matches!(
            reqs.complete_early(a, Status::ABORT_REQUESTED),
            Some(DataBuf::Heap(_))
        ));
        assert!(reqs.complete_early(a, Status::ABORT_REQUESTED).is_none());
        assert_eq!(reqs.awaiting_by_cid(7), None);
        assert_eq!(reqs.awaiting_count(), 1);
        assert!(
            reqs.fetch_target(a, 7).is_some(),
            "a drained request still takes its data"
        );
        // A submitted request takes no more data.
        assert_eq!(reqs.take_data(b).map(|(cid, ..)| cid), Some(8));
        assert!(reqs.is_submitted(b));
        assert_eq!((reqs.awaiting_count(), reqs.take_data(b).is_none()), (0, true));
        assert!(reqs.fetch_target(b, 8).is_none());
        assert!(reqs.complete_early(b, Status::ABORT_REQUESTED).is_none());
    }

    #[test]
    fn drained_requests_beyond_the_bound_go_oldest_first() {
        let mut reqs = Requests::default();
        let slots: Vec<usize> = (0..4).map(|i| reqs.insert(write(i, 512))).collect();
        for &s in &slots {
            reqs.complete_early(s, Status::ABORT_REQUESTED);
        }
        assert_eq!(reqs.excess_draining(4), None);
        assert_eq!(reqs.excess_draining(3), Some(slots[0]));
        reqs.remove(slots[0]);
        assert_eq!(reqs.excess_draining(3), None);
        reqs.drain();
        assert_eq!((reqs.awaiting_count(), reqs.excess_draining(0)), (0, None));
    }
    #[test]
    fn every_change_of_state_is_counted_for_the_queue_and_its_reactor() {
        let stats = Arc::new(RequestStats::default());
        let mut reqs = Requests::new(stats.clone());
        let a = reqs.insert(write(1, 4096));
        let b = reqs.insert(write(2, 4096));
        let snap = stats.snapshot();
        assert_eq!((snap.awaiting_data, snap.submitted), (2, 0));
        // Its data in: Submitted; then parked behind a lock, then submitted again.
        reqs.take_data(a);
        reqs.set_state(a, ReqState::Parked);
        assert_eq!((stats.snapshot().parked, stats.snapshot().submitted), (1, 0));
        reqs.set_state(a, ReqState::Submitted);
        reqs.complete_early(b, Status::ABORT_REQUESTED);
        let snap = stats.snapshot();
        assert_eq!(
            (snap.awaiting_data, snap.parked, snap.submitted, snap.draining),
            (0, 0, 1, 1)
        );
        assert_eq!(reqs.in_flight(), 1, "a drained tombstone is not in flight");
        // Held by QoS: in flight (it takes a queue entry), counted apart, found by its id.
        let h = reqs.insert(Request::new(
            3,
            Io::Read {
                ns: test_namespace(1, 64),
                off: 0,
                len: 512,
            },
            ReqState::Held(HeldData::None),
        ));
        assert_eq!((stats.snapshot().held, reqs.in_flight()), (1, 2));
        assert_eq!((reqs.held_by_cid(3), reqs.held_by_cid(1)), (Some(h), None));
        assert!(reqs.is_held(h) && !reqs.is_held(a));
        assert!(
            reqs.fetch_target(h, 3).is_none(),
            "a held command asked for no data yet"
        );
        reqs.set_state(h, ReqState::Submitted);
        assert_eq!((stats.snapshot().held, stats.snapshot().submitted), (0, 2));
        reqs.remove(h);
        reqs.remove(a);
        reqs.finished(true);
        reqs.finished(false);
        reqs.drain();
        assert_eq!(
            stats.snapshot(),
            RequestCounts {
                ended: 2,
                failed: 1,
                ..RequestCounts::default()
            }
        );
    }
}
