//! A queue's part of a hot upgrade ([`crate::upgrade`]): pausing at a command boundary, its
//! state as plain data for the next process, and resuming (in the new process once it
//! serves, or in the old one when the upgrade is rolled back).
//!
//! Pausing: from [`Queue::pause_begin`] on, every command the queue receives is held (its SQE
//! and in-capsule data, consumed from the stream as usual: the SQ head counts it) instead
//! of run, while the commands already in flight run to their end, their data still
//! received and their completions sent. The queue is at a boundary ([`PauseCheck::Quiet`])
//! when no request is left (none awaiting data, parked, held by QoS, at a backend or
//! draining), no I/O queue Connect waits for its controller, and the transport has sent
//! everything. The upgrade then stops the queue reading ([`Queue::pause`]) and takes its
//! state ([`Queue::export`]): what remains of the stream is the transport's (bytes read but
//! not yet a whole unit of its framing), and the held commands, which the next process runs first, in order. Nothing
//! runs twice and nothing is lost: a command is either completed here or held and handed
//! over, never both.
//!
//! An Asynchronous Event Request is not in flight in that sense: it waits for an event,
//! possibly forever, so its command id travels in the controller's state and the next
//! process completes it.

use std::time::{Duration, Instant};

use pollux_nvme::spec::Sqe;
use pollux_reactor::{Reactor, SourceId};
use zerocopy::FromBytes;

use super::{IoQueue, Queue, Role, Sq, Transport};
use crate::controller::auth::QueueAuth;
use crate::controller::{Ctrl, ErrorEntry, Local, QueueRef};
use crate::handover::{Bytes, CtrlState, ErrorState, HeldCmd, IoQueueRef, QueueState, RoleState, SqState};
use crate::subsystem::{HostView, Snapshot};

/// A queue's pause for a hot upgrade.
#[derive(Debug, Default)]
pub(crate) struct Pausing {
    /// Commands received since the pause began, in order.
    held: Vec<HeldCmd>,
    /// It no longer reads its socket.
    paused: bool,
}

/// Where a queue stands in a pause.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PauseCheck {
    /// At a command boundary: it can be handed over.
    Quiet,
    /// Not yet: this is still under way.
    Busy(&'static str),
    /// It cannot be handed over, and why (it stays, and closes with the old process).
    Stays(&'static str),
}

/// Why a queue's state cannot be resumed in this process.
#[derive(Debug, thiserror::Error)]
pub enum ResumeError {
    /// Its subsystem is not in this process's conf.
    #[error("subsystem {0} is not configured")]
    NoSubsystem(String),
    /// A held command is not a 64-byte SQE.
    #[error("a held command of {0} bytes is not an SQE")]
    BadSqe(usize),
}

fn ms_since(t: Instant) -> u64 {
    u64::try_from(t.elapsed().as_millis()).unwrap_or(u64::MAX)
}

fn ago(ms: u64) -> Instant {
    let now = Instant::now();
    now.checked_sub(Duration::from_millis(ms)).unwrap_or(now)
}

impl<T: Transport> Queue<T> {
    /// Whether (and why) this queue cannot move to another process.
    fn stays(&self) -> Option<&'static str> {
        if self.closed {
            return Some("closed");
        }
        if let Some(why) = self.t.stays() {
            return Some(why);
        }
        if !self.auth.idle() || !self.auth.allows_commands() || self.auth_held.is_some() {
            // The exchange's secrets and transcript live here: the host authenticates
            // again on the connection it makes next.
            return Some("authenticating");
        }
        None
    }

    /// Begin the pause: hold every command that arrives from now on. A queue that cannot
    /// move is left serving (it closes with the old process).
    pub fn pause_begin(&mut self) {
        if self.stays().is_none() && self.handover.is_none() {
            self.handover = Some(Box::default());
        }
    }

    /// Where the queue stands.
    pub fn pause_check(&self) -> PauseCheck {
        if let Some(why) = self.stays() {
            return PauseCheck::Stays(why);
        }
        if self.handover.is_none() {
            // Accepted after the pause began (on its way from the listeners' reactor).
            return PauseCheck::Busy("not pausing yet");
        }
        if matches!(self.role, Role::Connecting) {
            return PauseCheck::Busy("an I/O queue Connect waits for its controller");
        }
        if !self.reqs.is_empty() {
            return PauseCheck::Busy("commands in flight");
        }
        if let Some(why) = self.t.busy() {
            return PauseCheck::Busy(why);
        }
        PauseCheck::Quiet
    }

    /// Its request that has waited longest, described (why it is still busy).
    pub fn oldest_request(&self) -> Option<String> {
        self.reqs.oldest(pollux_reactor::sys::monotonic_ns())
    }

    /// Stop reading: the queue stays as it is until [`Self::resume`] or the process ends.
    pub fn pause(&mut self) {
        if let Some(h) = &mut self.handover {
            h.paused = true;
        }
    }

    /// Paused for a handover (it does not run).
    #[inline(always)]
    pub fn paused(&self) -> bool {
        self.handover.as_ref().is_some_and(|h| h.paused)
    }

    /// Pausing (holding commands) or paused.
    #[inline(always)]
    pub(crate) fn pausing(&self) -> bool {
        self.handover.is_some()
    }

    /// A command arrived while pausing: hold it.
    pub(super) fn hold_for_handover(&mut self, sqe: &Sqe, data: &[u8]) {
        if let Some(h) = &mut self.handover {
            h.held.push(HeldCmd {
                sqe: Bytes(zerocopy::IntoBytes::as_bytes(sqe).to_vec()),
                data: Bytes(data.to_vec()),
            });
        }
    }

    /// The queue's state (paused, quiet): its own part; the transport's (a socket's index,
    /// what it negotiated, unread bytes) is the transport's to add.
    pub fn export(&self) -> QueueState {
        let role = match &self.role {
            Role::Unbound | Role::Connecting => RoleState::Unbound,
            Role::Admin(c) => RoleState::Admin(Box::new(ctrl_state(c))),
            Role::Io(q) => RoleState::Io {
                cntlid: q.cntlid,
                owner: q.owner,
                subnqn: q.subsys.nqn.clone(),
                hostnqn: q.hostnqn.clone(),
                hostid: q.hostid,
            },
        };
        QueueState {
            serial: self.serial,
            reactor: self.reactor,
            listener: self.listener,
            sq: SqState {
                qid: self.sq.qid,
                entries: self.sq.entries,
                head: self.sq.head,
                flow_off: self.sq.flow_off,
            },
            role,
            auth_hostnqn: self.auth.hostnqn.clone(),
            auth_required: self.auth.required,
            held: self.handover.as_ref().map(|h| h.held.clone()).unwrap_or_default(),
            age_ms: ms_since(self.started),
        }
    }

    /// Take the state of a queue handed over (`s`, seen through this process's `snap`)
    /// into this new queue, paused: it runs from [`Self::resume`] on.
    pub(crate) fn import(&mut self, s: &QueueState, snap: &Snapshot) -> Result<(), ResumeError> {
        for h in &s.held {
            if h.sqe.0.len() != 64 {
                return Err(ResumeError::BadSqe(h.sqe.0.len()));
            }
        }
        self.sq = Sq {
            qid: s.sq.qid,
            entries: s.sq.entries.max(1),
            head: s.sq.head,
            flow_off: s.sq.flow_off,
        };
        self.unsent = super::unsent::Unsent::with_capacity(self.sq.entries as usize);
        self.started = ago(s.age_ms);
        self.auth = QueueAuth::resumed(&s.auth_hostnqn, s.auth_required);
        let view = |nqn: &str, host: &str| {
            snap.subsystem(nqn)
                .cloned()
                .map(|sub| HostView::new(sub, host))
                .ok_or_else(|| ResumeError::NoSubsystem(nqn.to_owned()))
        };
        self.role = match &s.role {
            RoleState::Unbound => Role::Unbound,
            RoleState::Io {
                cntlid,
                owner,
                subnqn,
                hostnqn,
                hostid,
            } => Role::Io(IoQueue {
                cntlid: *cntlid,
                owner: *owner,
                subsys: view(subnqn, hostnqn)?,
                hostnqn: hostnqn.clone(),
                hostid: *hostid,
            }),
            RoleState::Admin(c) => {
                let sub = match &c.subnqn {
                    Some(n) => Some(view(n, &c.hostnqn)?.subsystem().clone()),
                    None => None,
                };
                let mut ctrl = Ctrl::new(c.cntlid, sub, c.hostnqn.clone(), c.hostid, c.kato_ms);
                ctrl.set_ana(self.ana.clone());
                apply_ctrl_state(&mut ctrl, c);
                Role::Admin(Box::new(ctrl))
            }
        };
        // The commands it brings (held while pausing, and its controller's AERs) were
        // received by the old process: they end here.
        let aers = match &self.role {
            Role::Admin(ctrl) => ctrl.aers.len(),
            _ => 0,
        };
        self.reqs.received((s.held.len() + aers) as u64);
        self.sync_aers();
        self.handover = Some(Box::new(Pausing {
            held: s.held.clone(),
            paused: true,
        }));
        Ok(())
    }

    /// The queue was installed as source `id` (paused): its controller is registered with
    /// this reactor, its role counted, its controller's timers armed.
    pub(crate) fn installed(&mut self, r: &mut Reactor, id: SourceId) {
        let me = self.me(id);
        if let Role::Admin(ctrl) = &self.role
            && let Some(l) = r.local::<Local>()
        {
            l.ctrls.insert(ctrl.cntlid, me);
        }
        self.count_role(true);
        self.schedule_keep_alive(r, id);
        self.schedule_health_check(r, id);
    }

    /// An admin queue handed over learns where its I/O queues are now (`at`: by serial),
    /// once every queue is installed.
    pub(crate) fn relink_io_queues(&mut self, was: &[IoQueueRef], at: &std::collections::HashMap<u64, QueueRef>) {
        if let Role::Admin(ctrl) = &mut self.role {
            ctrl.io_queues = was
                .iter()
                .filter_map(|q| at.get(&q.serial).map(|r| (q.qid, *r)))
                .collect();
        }
    }

    /// The reactor it lives on.
    pub fn reactor(&self) -> usize {
        self.reactor
    }

    /// Serve again: run the held commands in order, then read the socket. In the new
    /// process once the old one committed; in the old one when the upgrade is rolled back.
    pub fn resume(&mut self, r: &mut Reactor, id: SourceId) {
        let Some(h) = self.handover.take() else {
            return;
        };
        for cmd in h.held {
            if self.closed {
                break;
            }
            let Ok(sqe) = Sqe::read_from_bytes(&cmd.sqe.0) else {
                continue;
            };
            self.route(r, id, &sqe, &cmd.data.0);
        }
        if self.closed {
            return;
        }
        if matches!(self.role, Role::Unbound) {
            // The setup deadline, which a pause let pass, starts again.
            Self::arm_setup_deadline(r, id, self.serial, &self.shared);
        }
        self.flush_or_close(r, id);
        r.wake(id);
    }
}

/// A controller's state as data.
fn ctrl_state(c: &Ctrl) -> CtrlState {
    CtrlState {
        cntlid: c.cntlid,
        subnqn: c.subsys.as_ref().map(|s| s.nqn.clone()),
        hostnqn: c.hostnqn.clone(),
        hostid: c.hostid,
        cc: c.cc,
        csts: c.csts,
        kato_ms: c.kato_ms,
        io_queues_granted: c.io_queues_granted,
        aec: c.aec,
        aers: c.aers.iter().copied().collect(),
        events: c.events.iter().copied().collect(),
        io_queues: c
            .io_queues
            .iter()
            .map(|(&qid, q)| IoQueueRef { qid, serial: q.serial })
            .collect(),
        errors: c
            .errors
            .iter()
            .map(|e| ErrorState {
                count: e.count,
                sqid: e.sqid,
                cid: e.cid,
                status: e.status.field(),
                nsid: e.nsid,
                lba: e.lba,
            })
            .collect(),
        error_count: c.error_count,
        changed_ns: c.changed_ns.clone(),
        features: c.features,
        smart_reported: c.smart_reported,
        smart_masked: c.smart_masked,
        authenticated: c.authenticated.clone(),
        ana_seen: c.ana_seen,
        ana_masked: c.ana_masked,
        resv_log: c.resv_log.clone(),
        age_ms: ms_since(c.created),
    }
}

/// Set a new controller's fields from a handed-over state (its I/O queues are filled in
/// once they are installed, by serial).
fn apply_ctrl_state(ctrl: &mut Ctrl, c: &CtrlState) {
    ctrl.cc = c.cc;
    ctrl.csts = c.csts;
    ctrl.io_queues_granted = c.io_queues_granted;
    ctrl.aec = c.aec;
    ctrl.aers = c.aers.iter().copied().collect();
    ctrl.events = c.events.iter().copied().collect();
    ctrl.errors = c
        .errors
        .iter()
        .map(|e| ErrorEntry {
            count: e.count,
            sqid: e.sqid,
            cid: e.cid,
            status: pollux_nvme::spec::Status::from_field(e.status),
            nsid: e.nsid,
            lba: e.lba,
        })
        .collect();
    ctrl.error_count = c.error_count;
    ctrl.changed_ns = c.changed_ns.clone();
    ctrl.features = c.features;
    ctrl.smart_reported = c.smart_reported;
    ctrl.smart_masked = c.smart_masked;
    ctrl.authenticated = c.authenticated.clone();
    ctrl.ana_seen = c.ana_seen;
    ctrl.ana_masked = c.ana_masked;
    ctrl.resv_log = c.resv_log.clone();
    ctrl.created = ago(c.age_ms);
    // Keep-alive starts again from now: the pause is not the host's silence.
    ctrl.last_keep_alive = Instant::now();
}
