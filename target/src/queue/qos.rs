//! QoS on an I/O queue (issue 38): a command of a namespace with limits takes its cost from the
//! namespace's budget as it arrives ([`crate::qos`]), which tells it when it may run; one that
//! may not run yet is *held*: a request in [`ReqState::Held`], with its in-capsule data or the
//! length of the data it will ask for, and an entry in the queue's arrival order. One reactor
//! timer per queue, armed for the earliest of its held commands, releases every held command
//! whose time has come, oldest first, and arms itself again for the next. A held command runs
//! as it would have on arrival (a write asks for its data then), after the checks that may
//! have changed meanwhile (the namespace, ANA, reservations); it is never failed for being
//! held, but an Abort, a Preempt and Abort or its queue closing end it, as they end a command
//! waiting for its data.
//!
//! Every queue that reaches a namespace takes from the one budget, in the order its commands
//! arrive; times are handed out in the order commands reach the budget, across queues and
//! reactors, so a queue's held commands are never overtaken forever by another's. When the
//! limits change the queue times what it holds again under the new ones: at its next timer,
//! which is armed at most [`RECHECK_NS`] ahead while it holds anything.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use pollux_nvme::spec::Status;
use pollux_reactor::sys::monotonic_ns;
use pollux_reactor::{Reactor, SourceId, TimerId};

use super::data::DataProgress;
use super::finish::End;
use super::request::{HeldData, ReqState, Request};
use super::{Queue, Role, Transport};
use crate::backend::WriteData;
use crate::nvm::{self, DataIn, Io};
use crate::qos::RECHECK_NS;

/// A held command in its queue's arrival order.
#[derive(Debug)]
struct Held {
    /// Its request.
    slot: usize,
    /// When it may run (CLOCK_MONOTONIC ns).
    at: u64,
    /// The generation of its namespace's limits `at` was taken under.
    generation: u64,
}

/// A queue's held commands and the timer that releases them.
#[derive(Debug, Default)]
pub(super) struct QosHeld {
    order: VecDeque<Held>,
    /// The timer armed, and for when.
    timer: Option<(TimerId, u64)>,
}

impl<T: Transport> Queue<T> {
    /// A validated command of a namespace with QoS limits takes its cost from the budget:
    /// whether it is held (false: it runs now, as any command). Out of line, and the command
    /// by reference (cloned only when held): the I/O path of a namespace without limits never
    /// comes here, and keeps the command where it is.
    #[cold]
    #[inline(never)]
    pub(super) fn qos_held(&mut self, r: &mut Reactor, id: SourceId, cid: u16, cmd: &nvm::IoCmd, data: &[u8]) -> bool {
        let (Some(ns), Some(cost)) = (cmd.io.namespace(), cmd.io.qos_cost()) else {
            return false;
        };
        let now = monotonic_ns();
        let generation = ns.qos.generation();
        let at = ns.qos.take(cost, now);
        if at <= now {
            return false;
        }
        let ns = ns.clone();
        let held = match cmd.data {
            DataIn::None => HeldData::None,
            DataIn::InCapsule => match data.get(..cmd.io.host_data_len() as usize) {
                Some(d) => HeldData::Capsule(d.to_vec()),
                // `nvm::parse` checked the capsule holds the data: never here.
                None => {
                    self.end(r, cid, Status::INTERNAL_ERROR);
                    return true;
                }
            },
            DataIn::Fetch(len) => HeldData::Fetch(len),
        };
        let mut req = Request::new(cid, cmd.io.clone(), ReqState::Held(held));
        // Its latency counts from its arrival: the host waits while it is held.
        req.started_ns = now;
        let slot = self.reqs.insert(req);
        ns.qos.count_held();
        self.qos.order.push_back(Held { slot, at, generation });
        self.arm_qos_timer(r, id, at.min(now + RECHECK_NS));
        true
    }

    /// Run every held command whose time has come, in arrival order; time again those held
    /// under limits that changed since; arm the timer for the next.
    fn release_held(&mut self, r: &mut Reactor, id: SourceId) {
        let now = monotonic_ns();
        let mut next: Option<u64> = None;
        let mut k = 0;
        while k < self.qos.order.len() && !self.closed {
            let h = &mut self.qos.order[k];
            let Some(req) = self
                .reqs
                .get_mut(h.slot)
                .filter(|q| matches!(q.state, ReqState::Held(_)))
            else {
                // Ended meanwhile (its entry goes with it; this is a safety net).
                self.qos.order.remove(k);
                continue;
            };
            if let Some(ns) = req.io.namespace() {
                let generation = ns.qos.generation();
                if generation != h.generation {
                    // New limits: its place under the old ones means nothing now.
                    h.generation = generation;
                    h.at = match req.io.qos_cost() {
                        Some(c) if ns.qos.is_on() => ns.qos.take(c, now),
                        _ => 0,
                    };
                }
            }
            if h.at <= now {
                let slot = h.slot;
                self.qos.order.remove(k);
                self.run_held(r, id, slot);
            } else {
                next = Some(next.map_or(h.at, |n| n.min(h.at)));
                k += 1;
            }
        }
        if let Some(at) = next
            && !self.closed
        {
            self.arm_qos_timer(r, id, at.min(now + RECHECK_NS));
        }
        self.flush_or_close(r, id);
    }

    /// Run held request `slot` as it would have run on arrival.
    fn run_held(&mut self, r: &mut Reactor, id: SourceId, slot: usize) {
        let Some(req) = self.reqs.get_mut(slot) else { return };
        let ReqState::Held(data) = &mut req.state else { return };
        let data = std::mem::take(data);
        let (cid, io) = (req.cid, req.io.clone());
        if let Some(s) = self.refused_now(&io) {
            self.reqs.remove(slot);
            let nsid = io.namespace().map_or(0, |n| n.nsid);
            return self.finish(r, cid, &End::status(s).at(nsid, 0));
        }
        match data {
            HeldData::None => self.execute(r, id, cid, io, WriteData::Bytes(&[]), Some(slot)),
            HeldData::Capsule(v) => self.execute(r, id, cid, io, WriteData::Bytes(&v), Some(slot)),
            HeldData::Fetch(len) => {
                // Its data is asked for now, into the same slot (its tag).
                let buf = self.fetch_buf(r, &io, len);
                let progress = DataProgress { len, received: 0 };
                self.reqs.set_state(slot, ReqState::AwaitingData { buf, progress });
                self.t.fetch_data(cid, slot as u16, len);
            }
        }
    }

    /// What may have changed while a command was held, checked again as on arrival
    /// (`Queue::validated`): its namespace is still there and attached to the host
    /// (removed or detached meanwhile, it is not written after that), its path's ANA state (NVMe 2.0 §8.1.3) and its namespace's
    /// reservation (NVMe 2.0 §8.19.2: another host may have acquired one that bars it). The
    /// status to end it with, if it may not run now.
    fn refused_now(&self, io: &Io) -> Option<Status> {
        let Role::Io(q) = &self.role else {
            return Some(Status::COMMAND_SEQUENCE_ERROR.with_dnr());
        };
        let ns = io.namespace()?;
        // The running snapshot, not the queue's copy, which its reactor learns of by message.
        let snap = self.shared.snapshot.load();
        // Still attached to this host too: a detach (ns_remove_host) reaches every
        // reactor's views before the control plane answers.
        if snap
            .subsystem(&q.subsys.nqn)
            .and_then(|s| s.namespace_ignoring_masks(ns.nsid))
            .is_none()
            || q.subsys.namespace(ns.nsid).is_none()
        {
            return Some(Status::INVALID_NAMESPACE.with_dnr());
        }
        if let Some(s) = self.ana.path_status(ns.ana_group) {
            return Some(s);
        }
        ns.resv.check(&q.hostid, io.access()?).err()
    }

    /// Have the timer run at `at` (CLOCK_MONOTONIC ns) at the latest.
    fn arm_qos_timer(&mut self, r: &mut Reactor, id: SourceId, at: u64) {
        if let Some((t, when)) = self.qos.timer {
            if when <= at {
                return;
            }
            r.cancel_timer(t);
        }
        let serial = self.serial;
        let wait = Duration::from_nanos(at.saturating_sub(monotonic_ns()));
        let t = r.add_timer(Instant::now() + wait, move |r| {
            r.with_source::<Self, _>(id, |c, r| {
                if c.serial == serial && !c.closed {
                    c.qos.timer = None;
                    c.release_held(r, id);
                }
            });
        });
        self.qos.timer = Some((t, at));
    }

    /// Abort held command `cid` (NVMe 2.0 §5.1): it completes with Command Abort Requested.
    /// Whether there was one.
    pub(super) fn abort_held(&mut self, r: &mut Reactor, id: SourceId, cid: u16) -> bool {
        let Some(slot) = self.reqs.held_by_cid(cid) else {
            return false;
        };
        self.drop_held(slot);
        self.end(r, cid, Status::ABORT_REQUESTED);
        self.flush_or_close(r, id);
        true
    }

    /// A Preempt and Abort fenced this queue's host on namespace `nsid`
    /// (`queue::reservation`): its held commands there never ran, and end now with Command
    /// Abort Requested.
    pub(super) fn fence_held(&mut self, r: &mut Reactor, nsid: u32) {
        let mine: Vec<(usize, u16)> = self
            .qos
            .order
            .iter()
            .filter_map(|h| {
                let req = self.reqs.get_mut(h.slot)?;
                req.io
                    .namespace()
                    .is_some_and(|n| n.nsid == nsid)
                    .then_some((h.slot, req.cid))
            })
            .collect();
        for (slot, cid) in mine {
            self.drop_held(slot);
            self.end(r, cid, Status::ABORT_REQUESTED);
        }
    }

    /// Held request `slot` goes, with its place in the order.
    fn drop_held(&mut self, slot: usize) {
        self.qos.order.retain(|h| h.slot != slot);
        self.reqs.remove(slot);
    }

    /// The queue is closing: what it holds goes (its requests with the others), and its
    /// timer.
    pub(super) fn qos_teardown(&mut self, r: &mut Reactor) {
        self.qos.order.clear();
        if let Some((t, _)) = self.qos.timer.take() {
            r.cancel_timer(t);
        }
    }
}
