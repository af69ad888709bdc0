//! A queue's requests and their life (SPDK: `nvmf_tcp_req_state` in `tcp.c`), in one place so
//! that abort, timeouts and teardown have one place to look.
//!
//! A command capsule is *received* and parsed into a validated command ([`crate::io`]) in one
//! step; one that needs no more data runs at once. Those that outlive the PDU that brought
//! them take a slot of the queue's [`Requests`], whose key is the R2T's TTAG and the tag a
//! backend completes with:
//! - [`ReqState::AwaitingData`]: an R2T was sent, H2CData PDUs are arriving into its buffer;
//! - [`ReqState::Draining`]: it completed before all its data came (aborted, or a data digest
//!   error): the rest of its data is drained, not treated as a protocol error, then the slot
//!   goes;
//! - [`ReqState::Submitted`]: its namespace's channel has it.
//!
//! *Completing* and *sending* are not states a request waits in: a completion's C2HData and
//! CapsuleResp go into the send queue as it is handled, and the slot is free (*done*) at
//! once, as the host may reuse the command id as soon as it has the completion.

use pollux_nvme::spec::Status;
use slab::Slab;

use crate::io::Io;
use crate::tcp::h2c::{DataBuf, R2tProgress};

/// Where a request is.
#[derive(Debug)]
pub enum ReqState {
    /// R2T sent: its data arrives into `buf`.
    AwaitingData {
        /// The buffer the data goes into.
        buf: DataBuf,
        /// How much of it came.
        progress: R2tProgress,
    },
    /// Completed early with this status while its data still comes: drained, then dropped.
    Draining {
        /// How much of its data came.
        progress: R2tProgress,
        /// The status it completed with.
        status: Status,
    },
    /// Submitted to its namespace's channel.
    Submitted,
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
    /// the connection's operations (`conn::fused`).
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

    /// Its R2T's progress, while data is still expected (awaited or drained).
    pub fn r2t(&self) -> Option<R2tProgress> {
        match &self.state {
            ReqState::AwaitingData { progress, .. } | ReqState::Draining { progress, .. } => Some(*progress),
            ReqState::Submitted => None,
        }
    }
}

/// A queue's outstanding requests, by slot. Every change of state goes through its methods,
/// which keep count of the requests awaiting data and draining (the R2T checks of every
/// write read them).
#[derive(Debug, Default)]
pub struct Requests {
    slots: Slab<Request>,
    awaiting: usize,
    draining: usize,
}

/// Counts of `state` (awaiting, draining).
fn counts(state: &ReqState) -> (usize, usize) {
    match state {
        ReqState::AwaitingData { .. } => (1, 0),
        ReqState::Draining { .. } => (0, 1),
        ReqState::Submitted => (0, 0),
    }
}

impl Requests {
    /// Add a request; its slot.
    pub fn insert(&mut self, req: Request) -> usize {
        let (a, d) = counts(&req.state);
        self.awaiting += a;
        self.draining += d;
        self.slots.insert(req)
    }

    /// The request in `slot`, to read or to fill its buffer (its state changes only through
    /// the methods of [`Requests`]).
    pub fn get_mut(&mut self, slot: usize) -> Option<&mut Request> {
        self.slots.get_mut(slot)
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

    /// Requests not yet completed: awaiting data or at their backend (the drained
    /// tombstones' completions went already).
    pub fn in_flight(&self) -> usize {
        self.slots.len() - self.draining
    }

    /// Remove the request in `slot`.
    pub fn remove(&mut self, slot: usize) -> Option<Request> {
        let req = self.slots.try_remove(slot)?;
        let (a, d) = counts(&req.state);
        self.awaiting -= a;
        self.draining -= d;
        Some(req)
    }

    /// Remove every request (the queue is closing).
    pub fn drain(&mut self) -> impl Iterator<Item = Request> + '_ {
        (self.awaiting, self.draining) = (0, 0);
        self.slots.drain()
    }

    /// All the data of the request awaiting it in `slot` is in: it becomes Submitted, and
    /// its command id, command and buffer come out. None unless it was awaiting data.
    pub fn take_data(&mut self, slot: usize) -> Option<(u16, Io, DataBuf)> {
        let req = self.slots.get_mut(slot).filter(|r| r.awaiting_data())?;
        let ReqState::AwaitingData { buf, .. } = std::mem::replace(&mut req.state, ReqState::Submitted) else {
            return None;
        };
        self.awaiting -= 1;
        Some((req.cid, req.io.clone(), buf))
    }

    /// Add `n` received bytes to the R2T of the request in `slot`; its progress then.
    pub fn add_received(&mut self, slot: usize, n: u32) -> Option<R2tProgress> {
        match &mut self.slots.get_mut(slot)?.state {
            ReqState::AwaitingData { progress, .. } | ReqState::Draining { progress, .. } => {
                progress.received += n;
                Some(*progress)
            }
            ReqState::Submitted => None,
        }
    }

    /// The slot of the request that R2T `ttag` of command `cccid` asked data for (awaited or
    /// drained): the H2CData header's TTAG and CCCID must both match (NVMe/TCP 1.0 §3.6.2.7).
    pub fn r2t_target(&self, ttag: usize, cccid: u16) -> Option<(usize, R2tProgress)> {
        let req = self.slots.get(ttag).filter(|r| r.cid == cccid)?;
        req.r2t().map(|p| (ttag, p))
    }

    /// The slot of the live (not yet completed) request waiting for data with command id
    /// `cid`.
    pub fn awaiting_by_cid(&self, cid: u16) -> Option<usize> {
        if self.awaiting == 0 {
            return None;
        }
        self.slots
            .iter()
            .find(|(_, r)| r.cid == cid && r.awaiting_data())
            .map(|(k, _)| k)
    }

    /// The slot of the submitted request with command id `cid`.
    pub fn submitted_by_cid(&self, cid: u16) -> Option<usize> {
        self.slots
            .iter()
            .find(|(_, r)| r.cid == cid && matches!(r.state, ReqState::Submitted))
            .map(|(k, _)| k)
    }

    /// The live requests of namespace `nsid` (waiting for data or submitted; not drained
    /// tombstones): (slot, command id, submitted).
    pub fn of_namespace(&self, nsid: u32) -> Vec<(usize, u16, bool)> {
        self.slots
            .iter()
            .filter(|(_, r)| !matches!(r.state, ReqState::Draining { .. }))
            .filter(|(_, r)| r.io.namespace().is_some_and(|n| n.nsid == nsid))
            .map(|(k, r)| (k, r.cid, matches!(r.state, ReqState::Submitted)))
            .collect()
    }

    /// Requests waiting for their data.
    pub fn awaiting_count(&self) -> usize {
        self.awaiting
    }

    /// The oldest drained request (lowest slot), if more than `max` are drained: tombstones
    /// whose data never came are bounded.
    pub fn excess_draining(&self, max: usize) -> Option<usize> {
        if self.draining <= max {
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
        let req = self.slots.get_mut(slot)?;
        let progress = req.r2t()?;
        match std::mem::replace(&mut req.state, ReqState::Draining { progress, status }) {
            ReqState::AwaitingData { buf, .. } => {
                self.awaiting -= 1;
                self.draining += 1;
                Some(buf)
            }
            other => {
                req.state = other;
                None
            }
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
                buf: DataBuf::Heap(crate::tcp::h2c::H2cBuf::detached(vec![0; len as usize])),
                progress: R2tProgress { len, received: 0 },
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
        // The H2CData rules name the request by TTAG and CCCID together.
        assert_eq!(reqs.r2t_target(a, 7).map(|(k, p)| (k, p.len)), Some((a, 4096)));
        assert!(reqs.r2t_target(a, 8).is_none());
        // Completed early: its buffer comes back once, the slot stays to drain late data.
        assert!(matches!(
            reqs.complete_early(a, Status::ABORT_REQUESTED),
            Some(DataBuf::Heap(_))
        ));
        assert!(reqs.complete_early(a, Status::ABORT_REQUESTED).is_none());
        assert_eq!(reqs.awaiting_by_cid(7), None);
        assert_eq!(reqs.awaiting_count(), 1);
        assert!(
            reqs.r2t_target(a, 7).is_some(),
            "a drained request still takes its data"
        );
        // A submitted request takes no more data.
        assert_eq!(reqs.take_data(b).map(|(cid, ..)| cid), Some(8));
        assert!(reqs.is_submitted(b));
        assert_eq!((reqs.awaiting_count(), reqs.take_data(b).is_none()), (0, true));
        assert!(reqs.r2t_target(b, 8).is_none());
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
        reqs.drain().for_each(drop);
        assert_eq!((reqs.awaiting_count(), reqs.excess_draining(0)), (0, None));
    }
}
