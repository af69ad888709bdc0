//! The connection's side of reservations (NVMe 2.0 §8.19): a reservation command of an I/O
//! queue, or Set Features Reservation Persistence of an admin queue, goes to the
//! namespace's owner ([`crate::resv::submit`]); its outcome comes back here by message.
//! Then the notifications it caused go to the controllers of the hosts concerned (on their
//! reactors), and a Preempt and Abort fences the preempted hosts before it completes: each
//! of their I/O queues aborts what it can of that namespace's commands and reports when the
//! rest has completed, so that once the host that preempted sees success, no command of a
//! preempted host is still writing (nvmet waits the same way).

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use pollux_nvme::spec::Status;
use pollux_nvme::spec::resv::ResvCdw10;
use pollux_reactor::{Reactor, Remote, SourceId};
use tracing::{info, warn};

use super::{Queue, Role, Transport};
use crate::controller::{Local, QueueRef};
use crate::queue::finish::End;
use crate::resv::{Effects, FENCE_TIMEOUT, HostId, ResvDone, ResvOp};
use crate::shared::Shared;
use crate::subsystem::Namespace;

/// How often a queue being fenced looks again at its commands in flight.
const FENCE_POLL: Duration = Duration::from_millis(1);

/// What answers a reservation change: an I/O queue's command, or an admin queue's Set
/// Features.
#[derive(Debug, Clone, Copy)]
struct Asker {
    id: SourceId,
    serial: u64,
    cid: u16,
}

impl<T: Transport> Queue<T> {
    /// A Reservation Register, Acquire or Release with its keys (`keys`: the command's
    /// data, [`ResvCdw10::data_len`] bytes).
    pub(super) fn reservation(
        &mut self,
        r: &mut Reactor,
        id: SourceId,
        cid: u16,
        ns: Arc<Namespace>,
        cmd: ResvCdw10,
        keys: &[u8],
    ) {
        let Role::Io(q) = &self.role else { return };
        let (hostid, nqn) = (q.hostid, q.subsys.nqn.clone());
        let key = |i: usize| {
            keys.get(i * 8..i * 8 + 8)
                .and_then(|b| b.try_into().ok())
                .map_or(0, u64::from_le_bytes)
        };
        let op = match cmd {
            ResvCdw10::Register { action, iekey, cptpl } => ResvOp::Register {
                action,
                iekey,
                cptpl,
                crkey: key(0),
                nrkey: key(1),
            },
            ResvCdw10::Acquire { action, iekey, rtype } => ResvOp::Acquire {
                action,
                iekey,
                rtype,
                crkey: key(0),
                prkey: key(1),
            },
            ResvCdw10::Release { action, iekey, rtype } => ResvOp::Release {
                action,
                iekey,
                rtype,
                crkey: key(0),
            },
        };
        self.change_reservations(r, id, cid, ns, nqn, hostid, op);
    }

    /// Send `op` of host `hostid` on `ns` (of subsystem `nqn`) to the owner; command `cid`
    /// completes when it is done (and durable).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn change_reservations(
        &mut self,
        r: &mut Reactor,
        id: SourceId,
        cid: u16,
        ns: Arc<Namespace>,
        nqn: String,
        hostid: HostId,
        op: ResvOp,
    ) {
        let Some(remote) = r.remote(self.reactor) else {
            return self.finish(r, cid, &End::status(Status::INTERNAL_ERROR).at(ns.nsid, 0));
        };
        let asker = Asker {
            id,
            serial: self.serial,
            cid,
        };
        let resv = ns.resv.clone();
        crate::resv::submit(resv, hostid, op, move |done: ResvDone| {
            let back = remote.clone();
            remote.send(move |r| settle::<T>(r, back, asker, ns, nqn, hostid, done));
        });
    }

    /// Abort what can be of this I/O queue's commands on namespace `nsid` (a Preempt and
    /// Abort fenced its host): those waiting for data or held by QoS complete now with
    /// Command Abort Requested, submitted ones are cancelled where their backend can. The
    /// number still submitted, which will complete as usual.
    fn fence(&mut self, r: &mut Reactor, id: SourceId, nsid: u32) -> usize {
        self.fence_fused(r, nsid);
        self.fence_held(r, nsid);
        let live = self.reqs.of_namespace(nsid);
        for &(slot, cid, submitted) in &live {
            if !submitted {
                self.complete_early(r, slot, cid, Status::ABORT_REQUESTED);
            } else {
                self.abort_submitted(r, id, cid);
            }
        }
        self.flush_or_close(r, id);
        self.in_flight_on(nsid)
    }

    /// Commands of this queue on namespace `nsid` still running: requests at their backend
    /// or waiting for data, and locked operations (fused pairs, Copy) holding their range.
    fn in_flight_on(&self, nsid: u32) -> usize {
        self.reqs.of_namespace(nsid).len() + self.locked.running_on(nsid)
    }
}

/// On the asking connection's reactor: a change is done. Its notifications go out, a
/// Preempt and Abort fences the preempted, and the command completes (if its connection is
/// still there).
fn settle<T: Transport>(
    r: &mut Reactor,
    back: Remote,
    asker: Asker,
    ns: Arc<Namespace>,
    nqn: String,
    hostid: HostId,
    done: ResvDone,
) {
    let nsid = ns.nsid;
    let finish = move |r: &mut Reactor, status: Status| {
        r.with_source::<Queue<T>, _>(asker.id, |c, r| {
            if c.serial == asker.serial && !c.closed {
                if status.is_success() {
                    c.end(r, asker.cid, status);
                } else {
                    c.finish(r, asker.cid, &End::status(status).at(nsid, 0));
                }
                c.flush_or_close(r, asker.id);
            }
        });
    };
    let fx: Effects = match done {
        Ok(fx) => fx,
        Err(s) => return finish(r, s),
    };
    let then = Box::new(move |r: &mut Reactor| finish(r, Status::SUCCESS));
    effects::<T>(r, back, &nqn, nsid, fx, Some(hostid), then);
}

/// Tend every namespace of `shared` whose reservations its cluster keeps
/// (`NsResv::tend`): the work of the target's reservation watcher
/// ([`crate::resv::cluster::watcher`]), whose effects reach the queues (of transport `T`)
/// on the reactors of `remotes`.
pub fn tend_clustered_reservations<T: Transport>(shared: &Shared, remotes: &[Remote]) {
    let snap = shared.snapshot.load();
    for sub in &snap.subsystems {
        for ns in sub.all_namespaces() {
            if ns.resv.cluster_object().is_none() {
                continue;
            }
            let (nqn, nsid) = (sub.nqn.as_str(), ns.nsid);
            ns.resv
                .tend(&|fx| deliver_reservation_effects::<T>(remotes, nqn, nsid, fx));
        }
    }
}

/// Another gateway changed the reservations of namespace `nsid` of subsystem `nqn` (kept in
/// their cluster, [`crate::resv::cluster`]): its notifications go to this target's
/// controllers (their queues of transport `T`) and its preempted hosts are fenced here. The
/// receiver answers once that is done (None: the reactors are gone).
fn deliver_reservation_effects<T: Transport>(
    remotes: &[Remote],
    nqn: &str,
    nsid: u32,
    fx: Effects,
) -> Option<std::sync::mpsc::Receiver<()>> {
    let remote = remotes.first()?.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    let (back, nqn) = (remote.clone(), nqn.to_string());
    let sent = remote.send(move |r| {
        let then = Box::new(move |_: &mut Reactor| {
            let _ = tx.send(());
        });
        effects::<T>(r, back, &nqn, nsid, fx, None, then);
    });
    sent.then_some(rx)
}

/// What a change caused, on this target: its notifications go out and the hosts it
/// preempted with abort (but `except`, the host that preempted) are fenced; then `then`
/// runs on `back`'s reactor.
fn effects<T: Transport>(
    r: &mut Reactor,
    back: Remote,
    nqn: &str,
    nsid: u32,
    fx: Effects,
    except: Option<HostId>,
    then: Then,
) {
    notify::<T>(r, nqn, nsid, &fx.notices);
    let aborted: Vec<HostId> = fx.aborted.into_iter().filter(|h| Some(*h) != except).collect();
    if aborted.is_empty() {
        return then(r);
    }
    info!(nqn = %nqn, nsid, hosts = aborted.len(), "preempt and abort: fencing the preempted hosts");
    let join = Join::new(back, then);
    let aborted = Arc::new(aborted);
    let n = r.reactor_count();
    join.add(n);
    for i in 0..n {
        let (part, aborted, nqn) = (join.clone(), aborted.clone(), nqn.to_string());
        let sent = r.send(i, move |r| {
            for q in io_queues_of::<T>(r, &nqn, &aborted) {
                part.add(1);
                let j = part.clone();
                if !r.send(q.reactor, move |r| {
                    watch::<T>(r, q, nsid, j, Instant::now() + FENCE_TIMEOUT, true)
                }) {
                    part.done(1);
                }
            }
            part.done(1);
        });
        if !sent {
            join.done(1);
        }
    }
}

/// The I/O queues of this reactor's controllers of subsystem `nqn` whose hosts are in
/// `hosts`.
fn io_queues_of<T: Transport>(r: &mut Reactor, nqn: &str, hosts: &[HostId]) -> Vec<QueueRef> {
    let mut out = Vec::new();
    super::for_each_ctrl::<T>(r, |c| {
        if c.subsys.as_ref().is_some_and(|s| s.nqn == nqn) && hosts.contains(&c.hostid) {
            out.extend(c.io_queues.values().copied());
        }
    });
    out
}

/// On an I/O queue's reactor: fence it (the first time), then wait until none of its
/// commands on `nsid` is in flight, or the deadline.
fn watch<T: Transport>(r: &mut Reactor, q: QueueRef, nsid: u32, join: Arc<Join>, deadline: Instant, first: bool) {
    let left = r
        .with_source::<Queue<T>, _>(q.source, |c, r| {
            if c.serial != q.serial || c.closed {
                return 0;
            }
            if first {
                c.fence(r, q.source, nsid)
            } else {
                c.in_flight_on(nsid)
            }
        })
        .unwrap_or(0);
    if left == 0 {
        return join.done(1);
    }
    if Instant::now() >= deadline {
        warn!(
            nsid,
            left, "preempt and abort: commands of a preempted host still in flight; completing anyway"
        );
        return join.done(1);
    }
    r.add_timer(Instant::now() + FENCE_POLL, move |r| {
        watch::<T>(r, q, nsid, join, deadline, false)
    });
}

/// Send notifications (host, type) about namespace `nsid` of subsystem `nqn` to every
/// controller of those hosts, on whichever reactor owns it.
fn notify<T: Transport>(r: &mut Reactor, nqn: &str, nsid: u32, notices: &[(HostId, u8)]) {
    if notices.is_empty() {
        return;
    }
    let notices: Arc<Vec<(HostId, u8)>> = Arc::new(notices.to_vec());
    for i in 0..r.reactor_count() {
        let (notices, nqn) = (notices.clone(), nqn.to_string());
        r.send(i, move |r| {
            let ctrls: Vec<QueueRef> = r
                .local::<Local>()
                .map(|l| l.ctrls.values().copied().collect())
                .unwrap_or_default();
            for q in ctrls {
                r.with_source::<Queue<T>, _>(q.source, |c, r| {
                    if c.serial != q.serial {
                        return;
                    }
                    let Role::Admin(ctrl) = &mut c.role else { return };
                    // A namespace detached from the host since it registered is not its
                    // news: its controllers do not have it (NVMe 2.0 §8.19.3 notifies the
                    // controllers a namespace is attached to).
                    if ctrl
                        .subsys
                        .as_ref()
                        .is_none_or(|s| s.nqn != nqn || s.namespace(nsid).is_none())
                    {
                        return;
                    }
                    for (h, typ) in notices.iter() {
                        if *h == ctrl.hostid {
                            ctrl.reservation_notice(*typ, nsid);
                        }
                    }
                    c.complete_events(r);
                });
            }
        });
    }
}

/// Work spread over reactors whose end runs a closure on one reactor: a count of parts
/// still out, and what to run when it reaches zero.
struct Join {
    left: AtomicUsize,
    to: Remote,
    then: Mutex<Option<Then>>,
}

/// What a [`Join`] runs at its end.
type Then = Box<dyn FnOnce(&mut Reactor) + Send>;

impl Join {
    /// Nothing out yet: the caller adds its parts before the first can finish.
    fn new(to: Remote, then: Then) -> Arc<Self> {
        Arc::new(Self {
            left: AtomicUsize::new(0),
            to,
            then: Mutex::new(Some(then)),
        })
    }

    fn add(&self, n: usize) {
        self.left.fetch_add(n, Ordering::AcqRel);
    }

    fn done(&self, n: usize) {
        if self.left.fetch_sub(n, Ordering::AcqRel) == n {
            let then = self.then.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some(f) = then {
                self.to.send(f);
            }
        }
    }
}
