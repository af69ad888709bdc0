//! One NVMe-oF queue (NVMe-oF 1.1 §2.4: a submission queue and its completion queue, paired
//! on one connection), whatever transport carries it: the command routing, the admin queue's
//! controller and what it needs of the reactor ([`admin`]), authentication ([`auth`]), the
//! I/O path ([`io`]), fused and locked operations ([`locked`]), QoS holds ([`qos`]),
//! reservations ([`reservation`]) and every request's life ([`request`]). SPDK keeps the
//! same apart from its transports (`ctrlr.c`, `ctrlr_bdev.c` vs `tcp.c`).
//!
//! The queue knows no transport: it is generic over one ([`Transport`]), which receives
//! capsules and data and hands them to [`Queue::on_capsule`] and [`Queue::data_received`],
//! and sends what the queue asks it to (completions, data, data requests). NVMe/TCP
//! (`crate::tcp`) is one; which one the target serves is wired in one place
//! (`crate::listener::Served`).
//!
//! The controller logic itself is pure ([`crate::controller`]); what needs the reactor (timers,
//! messages to other reactors' queues) is done here.

mod admin;
mod auth;
pub mod data;
pub mod fence;
pub(crate) mod finish;
pub mod handover;
mod io;
mod locked;
mod qos;
pub mod request;
mod reservation;
#[cfg(test)]
mod tests;
mod transport;
mod unsent;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use pollux_nvme::spec::{Sqe, Status, opcode};
use pollux_reactor::{Progress, Reactor, Source, SourceId, TimerId};
use tracing::info;

pub use admin::for_each_ctrl;
pub use io::deliver;
pub use reservation::tend_clustered_reservations;
pub use transport::{FixedBytes, ReadBytes, Transport};

use crate::ana::AnaStates;
use crate::close::CloseReason;
use crate::controller::auth::QueueAuth;
use crate::controller::{Ctrl, QueueRef};
use crate::path::Path;
use crate::queue::finish::End;
use crate::shared::Shared;
use crate::subsystem::HostView;
use request::Requests;

/// What a queue is.
enum Role {
    /// No Connect yet.
    Unbound,
    /// An I/O queue Connect waits for its controller's answer.
    Connecting,
    /// Admin queue: owns the controller.
    Admin(Box<Ctrl>),
    /// I/O queue of a controller on reactor `owner`.
    Io(IoQueue),
}

struct IoQueue {
    cntlid: u16,
    owner: usize,
    /// Its controller's view of the subsystem (its host's namespaces), sent by the
    /// controller when it changes.
    subsys: HostView,
    /// The host NQN of its Connect (its controller's): to see the subsystem as that host
    /// when it catches up with a change by itself.
    hostnqn: String,
    /// The host identifier of its Connect (its controller's): reservations know hosts by it.
    hostid: [u8; 16],
}

/// The submission queue's state that completions report (NVMe-oF 1.1 §3.3, NVMe 2.0 §4.6).
struct Sq {
    qid: u16,
    entries: u32,
    head: u32,
    /// SQ flow control disabled at Connect: SQHD is reserved (0).
    flow_off: bool,
}

/// One NVMe-oF queue on its reactor, carried by transport `T`: a reactor source.
pub struct Queue<T: Transport> {
    serial: u64,
    shared: Arc<Shared>,
    reactor: usize,
    /// Closed: the source is being removed; nothing more is sent or run.
    pub(crate) closed: bool,
    /// The transport that carries it.
    pub(crate) t: T,
    role: Role,
    sq: Sq,
    /// Its requests that outlive the capsule that brought them.
    pub(crate) reqs: Requests,
    started: Instant,
    /// DH-HMAC-CHAP of this queue.
    auth: QueueAuth,
    /// Closes the queue if it has not authenticated by then.
    auth_timer: Option<TimerId>,
    /// An Authentication Receive waiting for DH work: (cid, bytes).
    auth_held: Option<(u16, u32)>,
    /// The ANA states of the listener's path.
    ana: Arc<AnaStates>,
    /// Fused pairs, locked operations (Compare and Write, Copy) and writes waiting for a
    /// locked range.
    locked: locked::Locked,
    /// Commands held by their namespace's QoS limits, in arrival order, and their timer.
    qos: qos::QosHeld,
    /// Where each completion of an I/O queue not yet known to be handed to the network ends
    /// in the transport's stream (see [`Queue::sq_overflow`]).
    unsent: unsent::Unsent,
    /// Open connections of the listener that accepted this one (this one included).
    listener_open: Arc<AtomicU64>,
    /// The bound address of the listener that accepted it (None: unknown).
    listener: Option<std::net::SocketAddr>,
    /// Counts it among its host address's connections on its reactor while it lives
    /// ([`crate::placement`]).
    placed: Option<Arc<crate::placement::Placed>>,
    /// Paused, or pausing, for a hot upgrade ([`handover`]); None: serving.
    handover: Option<Box<handover::Pausing>>,
}

impl<T: Transport> Queue<T> {
    /// A queue on transport `t`, accepted at `started` on `path`.
    pub fn new(t: T, shared: Arc<Shared>, reactor: usize, serial: u64, started: Instant, path: Path) -> Self {
        Self {
            serial,
            reqs: Requests::new(shared.requests.get(reactor).cloned().unwrap_or_default()),
            shared,
            reactor,
            closed: false,
            t,
            role: Role::Unbound,
            sq: Sq {
                qid: 0,
                entries: 32,
                head: 0,
                flow_off: false,
            },
            started,
            auth: QueueAuth::new("", false),
            auth_timer: None,
            auth_held: None,
            ana: path.ana,
            locked: locked::Locked::default(),
            qos: qos::QosHeld::default(),
            unsent: unsent::Unsent::default(),
            listener_open: path.open,
            listener: path.addr,
            placed: path.placed,
            handover: None,
        }
    }

    /// Arm queue `id`'s (`serial`) setup deadline: `[transport] setup_timeout_ms` from now,
    /// [`Queue::check_setup`] runs.
    pub fn arm_setup_deadline(r: &mut Reactor, id: SourceId, serial: u64, shared: &Shared) {
        let deadline = Duration::from_millis(u64::from(shared.transport.setup_timeout_ms));
        r.add_timer(Instant::now() + deadline, move |r| {
            r.with_source::<Self, _>(id, |c, r| c.check_setup(r, id, serial));
        });
    }

    /// The setup deadline (`[transport] setup_timeout_ms` after the accept) has come: close
    /// the connection if it has not finished its transport's setup (a TLS handshake on a TLS
    /// listener, an ICReq) or its Connect, saying which; `serial` names it. A host that
    /// connects and then says nothing costs a socket and a few KiB until then, not forever.
    pub fn check_setup(&mut self, r: &mut Reactor, id: SourceId, serial: u64) {
        if self.serial != serial || self.closed || self.pausing() {
            // Paused for an upgrade: the deadline starts again when it serves.
            return;
        }
        let (what, reason) = match self.t.setup_pending() {
            Some(p) => p,
            None if matches!(self.role, Role::Unbound) => ("Connect", CloseReason::ConnectTimeout),
            None => return,
        };
        let ms = self.shared.transport.setup_timeout_ms;
        tracing::warn!(peer = %self.t.peer(), reactor = self.reactor, timeout_ms = ms, "{what} not completed in time: closing the connection");
        self.close(r, id, reason);
    }

    /// The queue's serial number (unique in this process).
    pub fn serial(&self) -> u64 {
        self.serial
    }

    /// An I/O queue (bound to its controller).
    #[inline]
    pub fn is_io(&self) -> bool {
        matches!(self.role, Role::Io(_))
    }

    /// Count the queue's role in its reactor's [`crate::shared::QueueRoles`] as it binds
    /// (`bound`), or no longer as it closes.
    fn count_role(&self, bound: bool) {
        let Some(roles) = self.shared.queue_roles.get(self.reactor) else {
            return;
        };
        let c = match self.role {
            Role::Admin(_) => &roles.admin,
            Role::Io(_) => &roles.io,
            Role::Unbound | Role::Connecting => return,
        };
        if bound {
            c.fetch_add(1, Relaxed);
        } else {
            c.fetch_sub(1, Relaxed);
        }
    }

    /// Count the AERs its controller holds now in its reactor's figures (after anything
    /// that may have taken or completed one).
    fn sync_aers(&mut self) {
        let n = match &self.role {
            Role::Admin(ctrl) => ctrl.aers.len() as u64,
            _ => 0,
        };
        self.reqs.aers_held(n);
    }

    fn me(&self, id: SourceId) -> QueueRef {
        QueueRef {
            reactor: self.reactor,
            source: id,
            serial: self.serial,
        }
    }
    // ---------------------------------------------------------------- responses

    #[inline(always)]
    fn sqhd(&self) -> u16 {
        if self.sq.flow_off { 0 } else { self.sq.head as u16 }
    }

    /// Flush the send queue; close on a socket error.
    fn flush_or_close(&mut self, r: &mut Reactor, id: SourceId) {
        if let Err(e) = self.t.flush() {
            self.close(r, id, CloseReason::Write(e));
        }
    }

    // ---------------------------------------------------------------- teardown

    /// A fault of the protocol ends the connection: the transport tells the host why
    /// (if its protocol has a way to), then it closes.
    fn fatal(&mut self, r: &mut Reactor, id: SourceId, why: CloseReason) {
        self.t.terminate(&why);
        self.close(r, id, why);
    }

    /// Close the connection: tear down its controller (admin queue) or leave it (I/O queue).
    pub fn close(&mut self, r: &mut Reactor, id: SourceId, reason: CloseReason) {
        if self.closed {
            return;
        }
        self.closed = true;
        self.shared.closes[self.reactor].count(reason.kind());
        if let Some(t) = self.auth_timer.take() {
            r.cancel_timer(t);
        }
        // Writes still waiting for their data never run: their buffers go back to the pools
        // as they drop, or a host that reconnects in a loop mid-write would have the target
        // allocate anew.
        self.reqs.drain();
        // What it received and did not end never will: counted as dropped, not open.
        self.reqs.forget_open();
        // Locked ranges are unlocked (their waiters woken), parked writes dropped; held
        // commands went with the requests.
        self.fused_teardown(r);
        self.qos_teardown(r);
        self.count_role(false);
        match std::mem::replace(&mut self.role, Role::Unbound) {
            Role::Admin(ctrl) => admin::teardown_ctrl::<T>(r, ctrl, &reason),
            Role::Io(q) => admin::detach_io::<T>(r, &q, self.sq.qid, self.serial),
            _ => {}
        }
        self.shared.conns_per_reactor[self.reactor].fetch_sub(1, Relaxed);
        self.listener_open.fetch_sub(1, Relaxed);
        // Its receive buffer goes to the reactor's pool (as it drops) for the next connection.
        self.t.close();
        // The reason as a string field, as the log has always shown it.
        let reason = reason.to_string();
        info!(peer = %self.t.peer(), reactor = self.reactor, qid = self.sq.qid, reason = reason.as_str(), "connection closed");
        r.remove_source(id);
    }

    /// A command capsule arrived: its SQE and in-capsule `data`; `digest_ok`: the
    /// transport's data digest over `data` matched (or there was none).
    #[inline(always)]
    pub fn on_capsule(&mut self, r: &mut Reactor, id: SourceId, sqe: &Sqe, data: &[u8], digest_ok: bool) {
        self.reqs.received(1);
        self.sq.head = (self.sq.head + 1) % self.sq.entries.max(1);
        if matches!(self.role, Role::Io(_)) && self.sq_overflow() {
            // More commands outstanding than the queue has entries (its size agreed at
            // Connect, NVMe-oF 1.1 §3.3.1): a full queue takes no command. There is no status
            // for a command the queue has no entry for; nvmet-tcp ("out of commands") and
            // SPDK ("Cannot allocate tcp_req") end the queue, and so does this, its transport telling the
            // host why ([`Transport::terminate`]).
            let why = CloseReason::SqOverflow {
                entries: self.sq.entries,
            };
            return self.fatal(r, id, why);
        }
        if !digest_ok {
            // The transport's digest over the data failed: the command fails, not the queue
            // (NVMe/TCP 1.0 §3.6.2.4 says so of its data digest).
            self.finish(
                r,
                sqe.cid.get(),
                &End::status(Status::TRANSIENT_TRANSPORT_ERROR).at(sqe.nsid.get(), 0),
            );
            return;
        }
        if sqe.psdt() != Sqe::PSDT_SGL_MPTR_CONTIGUOUS {
            // NVMe-oF 1.1 §2.3.1: fabrics commands use SGLs, PSDT 01b; PRPs mean nothing on
            // a fabric. nvmet answers Invalid Field too.
            let status = Status::INVALID_FIELD.with_dnr();
            return self.finish(r, sqe.cid.get(), &End::status(status).at(sqe.nsid.get(), 0));
        }
        self.route(r, id, sqe, data);
    }

    /// A new command would make more outstanding on this I/O queue than it has entries:
    /// requests in flight (awaiting data or at their backend; not the drained tombstones,
    /// whose completion went) plus completions queued but not yet written to the socket,
    /// which the host cannot have seen. A host that keeps SQ flow control never gets here.
    #[inline(always)]
    fn sq_overflow(&mut self) -> bool {
        let entries = self.sq.entries as usize;
        if self.reqs.in_flight() + self.unsent.len() < entries {
            return false;
        }
        let sent = self.t.sent_total();
        self.unsent.drop_sent(sent);
        self.reqs.in_flight() + self.unsent.len() >= entries
    }

    /// A completion of this I/O queue was queued: remember where it ends in the stream
    /// (see [`Self::sq_overflow`]).
    #[inline(always)]
    fn completion_queued(&mut self) {
        if matches!(self.role, Role::Io(_)) {
            self.unsent.push(self.t.stream_end());
        }
    }

    /// Route a command by the queue it arrived on.
    #[inline(always)]
    fn route(&mut self, r: &mut Reactor, id: SourceId, sqe: &Sqe, data: &[u8]) {
        let cid = sqe.cid.get();
        if self.handover.is_some() {
            // A hot upgrade is pausing the queue: the command runs after it (here again,
            // or in the next process).
            return self.hold_for_handover(sqe, data);
        }
        if sqe.opcode == opcode::FABRICS {
            return self.on_fabrics(r, id, sqe, data);
        }
        if !self.auth.allows_commands() {
            // NVMe 2.0 §8.13.5: until the queue authenticates, only Authentication Send and
            // Receive run. DNR: the Linux host would otherwise retry instead of
            // authenticating.
            return self.finish(r, cid, &End::status(Status::AUTH_REQUIRED.with_dnr()).unlogged());
        }
        match self.role {
            Role::Unbound | Role::Connecting => self.end(r, cid, Status::COMMAND_SEQUENCE_ERROR.with_dnr()),
            Role::Admin(_) => self.on_admin(r, id, sqe),
            Role::Io(_) => self.on_io(r, id, sqe, data),
        }
    }
}

impl<T: Transport> Source for Queue<T> {
    fn name(&self) -> &str {
        T::NAME
    }

    fn run(&mut self, r: &mut Reactor, id: SourceId) -> Progress {
        if self.closed || self.paused() {
            return Progress::IDLE;
        }
        T::run(self, r, id)
    }

    fn shutdown(&mut self, _r: &mut Reactor, _id: SourceId) {
        // The target is stopping: send what is queued, then close. Commands waiting for data
        // are never completed; the host sees the connection close and retries elsewhere.
        self.t.close();
        self.count_role(false);
        self.shared.conns_per_reactor[self.reactor].fetch_sub(1, Relaxed);
        self.listener_open.fetch_sub(1, Relaxed);
        tracing::debug!(peer = %self.t.peer(), "connection closed at shutdown");
    }
}
