//! The admin side of a connection: fabrics commands and Connect, the admin queue's controller
//! and what it needs of the reactor — its keep-alive timer, held AERs, Abort of a command on
//! another reactor's queue, the attachment and teardown of its I/O queues by message, and its
//! update when the subsystems change.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use pollux_nvme::spec::{Sqe, Status, StatusContext};
use pollux_reactor::{Reactor, SourceId};
use tracing::{debug, info, warn};

use super::{IoQueue, Queue, Role, Transport};
use crate::close::CloseReason;
use crate::controller::admin::{self, AdminEnv, Outcome};
use crate::controller::connect::{self, ConnectCmd, Fabrics, Refusal, decode_fabrics};
use crate::controller::property::{self, CcEffect};
use crate::controller::{Ctrl, FULL_CNTLID_RANGE, Local, SubsystemUpdate, owner_of};
use crate::health;
use crate::queue::finish::End;
use crate::subsystem::{HostView, Snapshot, Subsystem};

/// An I/O queue's attachment: its controller's view of the subsystem, its host NQN and
/// identifier, or the refusal.
type AttachResult = Result<(HostView, String, [u8; 16]), Refusal>;

/// How often a controller with SMART events enabled looks at its subsystem's health (a
/// device's page is read every 2 s by its admin thread).
const HEALTH_CHECK: Duration = Duration::from_secs(1);

/// Connect's completion dword 0 (NVMe-oF 1.1 §6.3, Figure 22): the controller id, and
/// AUTHREQ bit 17 (ATR) when the queue must authenticate (NVMe 2.0 §8.13.5).
fn connect_dw0(cntlid: u16, atr: bool) -> u32 {
    u32::from(cntlid) | (u32::from(atr) << 17)
}

impl<T: Transport> Queue<T> {
    /// A fabrics command (NVMe-oF 1.1 §6).
    pub(super) fn on_fabrics(&mut self, r: &mut Reactor, id: SourceId, sqe: &Sqe, data: &[u8]) {
        let cid = sqe.cid.get();
        match decode_fabrics(sqe) {
            Fabrics::Connect {
                recfmt,
                qid,
                sqsize,
                cattr,
                kato,
            } => {
                if !matches!(self.role, Role::Unbound) {
                    return self.end(r, cid, Status::COMMAND_SEQUENCE_ERROR.with_dnr());
                }
                let c = ConnectCmd {
                    recfmt,
                    qid,
                    sqsize,
                    cattr,
                    kato,
                };
                self.connect(r, id, cid, sqe, c, data);
            }
            Fabrics::AuthSend { cdw10, tl } => self.auth_send(r, id, sqe, cdw10, tl, data),
            Fabrics::AuthReceive { cdw10, al } => self.auth_receive(r, id, sqe, cdw10, al),
            _ if !matches!(self.role, Role::Unbound | Role::Connecting) && !self.auth.allows_commands() => {
                // NVMe 2.0 §8.13.5: Property Get/Set and Disconnect wait for authentication too.
                self.finish(r, cid, &End::status(Status::AUTH_REQUIRED.with_dnr()).unlogged())
            }
            Fabrics::PropertyGet { size8, offset } => match &self.role {
                Role::Admin(ctrl) => {
                    let rep = property::property_get(ctrl, &self.shared, size8, offset);
                    self.finish(r, cid, &End::reply(&rep, 0).unlogged());
                }
                _ => self.end(r, cid, Status::INVALID_OPCODE.with_dnr()),
            },
            Fabrics::PropertySet { size8, offset, value } => {
                let Role::Admin(ctrl) = &mut self.role else {
                    return self.end(r, cid, Status::INVALID_OPCODE.with_dnr());
                };
                let (rep, effect) = property::property_set(ctrl, size8, offset, value);
                let cntlid = ctrl.cntlid;
                match effect {
                    CcEffect::Enabled => info!(cntlid, peer = %self.t.peer(), "controller enabled"),
                    CcEffect::Disabled => {
                        info!(cntlid, "controller disabled (reset): deleting its I/O queues");
                        close_io_queues::<T>(r, ctrl, || CloseReason::ControllerReset);
                    }
                    CcEffect::Shutdown => info!(cntlid, "controller shutdown"),
                    CcEffect::None => {}
                }
                self.finish(r, cid, &End::reply(&rep, 0).unlogged());
            }
            Fabrics::Disconnect { recfmt } => {
                if recfmt != 0 {
                    // NVMe-oF 1.1 §6.4: a record format the controller does not support is
                    // refused with Incompatible Format, and the queue stays. A Disconnect is
                    // the one command that deletes its queue: one that carries garbage (SPDK's
                    // nvme_fuzz sends random fabrics commands) must not end it.
                    self.end(r, cid, Status::CONNECT_INCOMPATIBLE_FORMAT.with_dnr());
                } else if matches!(self.role, Role::Io(_)) {
                    self.end(r, cid, Status::SUCCESS);
                    self.close(r, id, CloseReason::Disconnect);
                } else {
                    self.end(r, cid, Status::INVALID_FIELD.with_dnr());
                }
            }
            Fabrics::Other(_) => self.end(r, cid, Status::INVALID_OPCODE.with_dnr()),
        }
    }

    /// Connect (NVMe-oF 1.1 §6.3): an admin queue creates its controller here; an I/O queue
    /// asks its controller's reactor to attach it and is answered when that replies.
    fn connect(&mut self, r: &mut Reactor, id: SourceId, cid: u16, sqe: &Sqe, c: ConnectCmd, data: &[u8]) {
        let refuse = |c: &mut Self, r: &mut Reactor, no: Refusal, qid: u16| {
            info!(peer = %c.t.peer(), qid, status = %no.status.in_context(StatusContext::Fabrics), "connect refused: {}", no.why);
            c.finish(r, cid, &End::status(no.status).dw(no.dw0, 0).unlogged());
        };
        let req = match connect::check(&self.shared, sqe, c, data, self.t.tls_identity(), self.listener) {
            Ok(req) => req,
            Err(no) => return refuse(self, r, no, c.qid),
        };
        self.sq.qid = req.qid;
        self.sq.entries = req.entries;
        self.unsent = super::unsent::Unsent::with_capacity(req.entries as usize);
        self.sq.head = 1 % req.entries; // the Connect itself was consumed
        self.sq.flow_off = req.sqflow_off;
        if let Err(no) = connect::check_dynamic_cntlid(&req) {
            return refuse(self, r, no, req.qid);
        }
        let d = req.data;
        if req.qid == 0 {
            let (n, me) = (r.reactor_count(), self.reactor);
            // A subsystem's controllers get ids of its range only (another target may export
            // the same subsystem with another range); discovery controllers any id.
            let range = req.subsys.as_ref().map_or(FULL_CNTLID_RANGE, |s| s.cntlids.clone());
            let Some(cntlid) = r.local::<Local>().and_then(|l| l.alloc_cntlid(me, n, range.clone())) else {
                info!(
                    peer = %self.t.peer(), qid = 0, subnqn = %d.subnqn, reactor = me,
                    cntlids = format_args!("{}..={}", range.start(), range.end()),
                    "connect refused: no controller id of the range left on this reactor"
                );
                return self.finish(r, cid, &End::status(Status::CONNECT_CONTROLLER_BUSY).unlogged());
            };
            let me_ref = self.me(id);
            if let Some(l) = r.local::<Local>() {
                l.ctrls.insert(cntlid, me_ref);
            }
            let kato = self.shared.keep_alive.clamp(req.kato);
            let subsys_of_req = req.subsys.clone();
            let mut ctrl = Ctrl::new(cntlid, req.subsys, d.hostnqn.clone(), d.hostid, kato);
            ctrl.set_ana(self.ana.clone());
            if let Some(id) = self.t.tls_identity().filter(|id| id.generated) {
                // Authenticated by the exchange that generated the PSK securing this queue.
                let hash = if id.hash.id() == 1 { "sha256" } else { "sha384" };
                ctrl.authenticated = Some(format!("generated-psk/{hash}"));
            }
            info!(
                cntlid, reactor = me, peer = %self.t.peer(), subnqn = %d.subnqn, hostnqn = %d.hostnqn, kato_ms = kato,
                "controller created"
            );
            self.shared.controllers_created.fetch_add(1, Relaxed);
            self.role = Role::Admin(Box::new(ctrl));
            self.count_role(true);
            if let Some(p) = &self.placed {
                p.uncount();
            }
            self.schedule_keep_alive(r, id);
            let atr = self.auth_required(&d.hostnqn, subsys_of_req.as_deref());
            self.start_auth(r, id, &d.hostnqn, atr);
            self.finish(r, cid, &End::status(Status::SUCCESS).dw(connect_dw0(cntlid, atr), 0));
            return;
        }
        let (qid, cntlid) = (req.qid, d.cntlid);
        let owner = owner_of(cntlid, r.reactor_count());
        let me = self.me(id);
        self.role = Role::Connecting;
        let sent = r.send(owner, move |r| {
            let res = with_ctrl::<T, _>(r, cntlid, |ctrl, _| connect::attach_io(ctrl, qid, &d, me))
                .unwrap_or_else(|| Err(connect::no_such_controller()))
                .map(|s| (s, d.hostnqn, d.hostid));
            r.send(me.reactor, move |r| {
                r.with_source::<Self, _>(me.source, |c, r| {
                    if c.serial == me.serial {
                        c.io_connected(r, me.source, cid, cntlid, owner, res);
                    }
                });
            });
        });
        if !sent {
            self.role = Role::Unbound;
            self.finish(r, cid, &End::status(Status::CONNECT_CONTROLLER_BUSY).unlogged());
        }
    }

    fn io_connected(&mut self, r: &mut Reactor, id: SourceId, cid: u16, cntlid: u16, owner: usize, res: AttachResult) {
        if self.closed {
            return;
        }
        match res {
            Ok((mut subsys, hostnqn, hostid)) => {
                debug!(cntlid, qid = self.sq.qid, reactor = self.reactor, peer = %self.t.peer(), "I/O queue connected");
                // A change of the subsystem its controller sent while this queue was still
                // connecting found no I/O queue here and was dropped: the snapshot (swapped
                // before any such message is sent) is the truth. A detached namespace must
                // not stay visible on this queue.
                if let Some(now) = self.shared.snapshot.load().subsystem(&subsys.nqn)
                    && !Arc::ptr_eq(now, subsys.subsystem())
                {
                    subsys = HostView::new(now.clone(), &hostnqn);
                }
                let atr = self.auth_required(&hostnqn, Some(&subsys));
                self.role = Role::Io(IoQueue {
                    cntlid,
                    owner,
                    subsys,
                    hostnqn: hostnqn.clone(),
                    hostid,
                });
                self.count_role(true);
                self.start_auth(r, id, &hostnqn, atr);
                self.finish(r, cid, &End::status(Status::SUCCESS).dw(connect_dw0(cntlid, atr), 0));
            }
            Err(no) => {
                info!(peer = %self.t.peer(), qid = self.sq.qid, cntlid, status = %no.status.in_context(StatusContext::Fabrics), "I/O queue connect refused: {}", no.why);
                self.role = Role::Unbound;
                self.finish(r, cid, &End::status(no.status).dw(no.dw0, 0).unlogged());
            }
        }
        self.flush_or_close(r, id);
    }

    /// Whether host `hostnqn` must authenticate its queues to `subsys` (None: the discovery
    /// controller): it has keys there, and the queue is not secured by a PSK an earlier
    /// DH-HMAC-CHAP exchange generated (secure channel concatenation, TP 8018: that key
    /// proves the exchange; the Linux host authenticates none of those queues, and nvmet
    /// asks it to on none).
    fn auth_required(&self, hostnqn: &str, subsys: Option<&Subsystem>) -> bool {
        if self.t.tls_identity().is_some_and(|id| id.generated) {
            return false;
        }
        match subsys {
            Some(s) => s.keys_of(hostnqn).is_some(),
            None => self.shared.snapshot.load().discovery.host_keys.contains_key(hostnqn),
        }
    }

    // ---------------------------------------------------------------- keep-alive

    /// (Re)arm the keep-alive check at the controller's deadline (NVMe 2.0 §3.9).
    pub(super) fn schedule_keep_alive(&mut self, r: &mut Reactor, id: SourceId) {
        let Role::Admin(ctrl) = &mut self.role else { return };
        if let Some(t) = ctrl.ka_timer.take() {
            r.cancel_timer(t);
        }
        let Some(at) = ctrl.keep_alive_deadline() else { return };
        let serial = self.serial;
        ctrl.ka_timer = Some(r.add_timer(at, move |r| {
            r.with_source::<Self, _>(id, |c, r| {
                if c.serial == serial {
                    c.keep_alive_check(r, id);
                }
            });
        }));
    }

    fn keep_alive_check(&mut self, r: &mut Reactor, id: SourceId) {
        let Role::Admin(ctrl) = &mut self.role else { return };
        ctrl.ka_timer = None;
        if self.handover.is_some() {
            // Paused for an upgrade: its Keep Alive commands are held, not missed.
            ctrl.last_keep_alive = Instant::now();
        }
        if !self.auth.allows_commands() {
            // Authenticating: a host sends no Keep Alive before it may (the Linux host's first
            // use of a large DH group is seconds of its CPU); the authentication deadline
            // bounds a host that stalls.
            ctrl.last_keep_alive = Instant::now();
        }
        if ctrl.keep_alive_deadline().is_some_and(|d| Instant::now() >= d) {
            warn!(cntlid = ctrl.cntlid, peer = %self.t.peer(), kato_ms = ctrl.kato_ms, "keep-alive timeout: deleting the controller");
            self.close(r, id, CloseReason::KeepAliveTimeout);
        } else {
            self.schedule_keep_alive(r, id);
        }
    }

    // ---------------------------------------------------------------- health

    /// Look at the subsystem's health every [`HEALTH_CHECK`] while the host has SMART events
    /// enabled (AEC bits 7:0), raising the event a new critical warning calls for (NVMe 2.0
    /// §5.2). No timer otherwise: a timer costs every reactor iteration a little.
    pub(super) fn schedule_health_check(&mut self, r: &mut Reactor, id: SourceId) {
        let Role::Admin(ctrl) = &mut self.role else { return };
        if ctrl.is_discovery() || ctrl.aec & 0xFF == 0 || ctrl.health_timer.is_some() {
            return;
        }
        let serial = self.serial;
        ctrl.health_timer = Some(r.add_timer(Instant::now() + HEALTH_CHECK, move |r| {
            r.with_source::<Self, _>(id, |c, r| {
                if c.serial == serial {
                    c.health_check(r, id);
                }
            });
        }));
    }

    fn health_check(&mut self, r: &mut Reactor, id: SourceId) {
        let Role::Admin(ctrl) = &mut self.role else { return };
        ctrl.health_timer = None;
        if self.handover.is_some() {
            // No event while paused for an upgrade: it would complete an AER the state
            // handed over still lists.
            return self.schedule_health_check(r, id);
        }
        if let Some(s) = &ctrl.subsys {
            let h = health::gather(s, None, health::host_k());
            if ctrl.check_health(&h) {
                self.complete_events(r);
            }
        }
        self.schedule_health_check(r, id);
    }

    // ---------------------------------------------------------------- admin commands

    /// An admin command (NVMe 2.0 §5) on the admin queue.
    pub(super) fn on_admin(&mut self, r: &mut Reactor, id: SourceId, sqe: &Sqe) {
        let (cid, nsid) = (sqe.cid.get(), sqe.nsid.get());
        let Role::Admin(ctrl) = &mut self.role else { return };
        let env = AdminEnv {
            shared: &self.shared,
            local: self.t.local(),
            started: self.started,
            host_k: health::host_k(),
        };
        let (rep, max_len) = match admin::execute(ctrl, &env, sqe) {
            Outcome::Reply { rep, max_len } => (rep, max_len),
            Outcome::KeepAlive(rep) => {
                self.schedule_keep_alive(r, id);
                (rep, 0)
            }
            Outcome::Held => return self.sync_aers(),
            Outcome::Abort { sqid, cid: target } => return self.abort(r, id, cid, sqid, target),
            Outcome::SetPtpl { ns, ptpl } => {
                let (nqn, hostid) = (
                    ctrl.subsys.as_ref().map(|s| s.nqn.clone()).unwrap_or_default(),
                    ctrl.hostid,
                );
                let op = crate::resv::ResvOp::SetPtpl(ptpl);
                return self.change_reservations(r, id, cid, ns, nqn, hostid, op);
            }
        };
        self.finish(r, cid, &End::reply(&rep, max_len).at(nsid, 0));
        // Set Features may have enabled SMART events.
        self.schedule_health_check(r, id);
    }

    /// Abort (NVMe 2.0 §5.1): dw0 bit 0 is 0 if the command was aborted, 1 if not.
    fn abort(&mut self, r: &mut Reactor, id: SourceId, cid: u16, sqid: u16, target: u16) {
        let Role::Admin(ctrl) = &mut self.role else { return };
        if sqid == 0 {
            if ctrl.abort_aer(target) {
                self.sync_aers();
                self.end(r, target, Status::ABORT_REQUESTED);
                self.end(r, cid, Status::SUCCESS);
            } else {
                self.finish(r, cid, &End::status(Status::SUCCESS).dw(1, 0));
            }
            return;
        }
        let Some(q) = ctrl.io_queues.get(&sqid).copied() else {
            return self.finish(r, cid, &End::status(Status::SUCCESS).dw(1, 0));
        };
        let (me, serial) = (self.reactor, self.serial);
        let sent = r.send(q.reactor, move |r| {
            let aborted = r
                .with_source::<Self, _>(q.source, |c, r| {
                    c.serial == q.serial && c.abort_pending(r, q.source, target)
                })
                .unwrap_or(false);
            r.send(me, move |r| {
                r.with_source::<Self, _>(id, |c, r| {
                    if c.serial == serial {
                        c.finish(r, cid, &End::status(Status::SUCCESS).dw(u32::from(!aborted), 0));
                        c.flush_or_close(r, id);
                    }
                });
            });
        });
        if !sent {
            self.finish(r, cid, &End::status(Status::SUCCESS).dw(1, 0));
        }
    }

    /// Complete held AERs with queued events (called when an event is raised).
    pub fn complete_events(&mut self, r: &mut Reactor) {
        let Role::Admin(ctrl) = &mut self.role else { return };
        let ready = ctrl.ready_events();
        if !ready.is_empty() {
            self.sync_aers();
        }
        for (cid, ev) in ready {
            self.finish(r, cid, &End::status(Status::SUCCESS).dw(ev, 0));
        }
        let _ = self.t.flush();
    }

    /// The subsystems changed (a new snapshot was swapped in): bring this admin queue's
    /// controller up to date — delete it if its subsystem is gone or its host no longer
    /// allowed; otherwise hand the new subsystem to its I/O queues and raise the AER the
    /// host enabled.
    pub fn refresh_ctrl(&mut self, r: &mut Reactor, id: SourceId, snap: &Snapshot, discovery_changed: bool) {
        // A subsystem no longer served on this controller's listener loses the controller
        // there, as SPDK's `nvmf_subsystem_remove_listener` disconnects its queue pairs.
        let listener = self.listener.and_then(|a| snap.listener(a));
        if let Role::Admin(ctrl) = &self.role
            && ctrl
                .subsys
                .as_ref()
                .and_then(|s| snap.subsystem(&s.nqn))
                .is_some_and(|s| !s.served_on(listener))
        {
            return self.close(r, id, CloseReason::ListenerRemoved);
        }
        let Role::Admin(ctrl) = &mut self.role else { return };
        match ctrl.update_subsystem(snap, discovery_changed) {
            SubsystemUpdate::Delete(why) => return self.close(r, id, why),
            SubsystemUpdate::Changed(new) => {
                for q in ctrl.io_queues.values().copied() {
                    let new = new.clone();
                    r.send(q.reactor, move |r| {
                        r.with_source::<Self, _>(q.source, |c, _| {
                            if c.serial == q.serial
                                && let Role::Io(io) = &mut c.role
                            {
                                io.subsys = new;
                            }
                        });
                    });
                }
            }
            SubsystemUpdate::Unchanged => {}
        }
        self.complete_events(r);
    }
}

impl<T: Transport> Queue<T> {
    /// Namespace `nsid` of subsystem `nqn` changed in place (resized): an admin queue of a
    /// controller of that subsystem tells its host.
    pub fn namespace_changed(&mut self, r: &mut Reactor, nqn: &str, nsid: u32) {
        let Role::Admin(ctrl) = &mut self.role else { return };
        if ctrl.subsys.as_ref().is_some_and(|s| s.nqn == nqn) {
            ctrl.namespace_changed(nsid);
            self.complete_events(r);
        }
    }
}

/// Run `f` on controller `cntlid` owned by this reactor, if it exists.
pub(super) fn with_ctrl<T: Transport, R>(
    r: &mut Reactor,
    cntlid: u16,
    f: impl FnOnce(&mut Ctrl, &mut Reactor) -> R,
) -> Option<R> {
    let aref = r.local::<Local>()?.ctrls.get(&cntlid).copied()?;
    r.with_source::<Queue<T>, _>(aref.source, |c, r| {
        if c.serial != aref.serial {
            return None;
        }
        match &mut c.role {
            Role::Admin(ctrl) => Some(f(ctrl, r)),
            _ => None,
        }
    })
    .flatten()
}

/// Tell I/O queue `qid`'s controller (on its reactor) that the queue is gone.
pub(super) fn detach_io<T: Transport>(r: &mut Reactor, q: &IoQueue, qid: u16, serial: u64) {
    let cntlid = q.cntlid;
    r.send(q.owner, move |r| {
        with_ctrl::<T, _>(r, cntlid, |ctrl, _| {
            if ctrl.io_queues.get(&qid).is_some_and(|x| x.serial == serial) {
                ctrl.io_queues.remove(&qid);
            }
        });
    });
}

/// Ask every I/O queue of `ctrl` to close.
fn close_io_queues<T: Transport>(r: &mut Reactor, ctrl: &mut Ctrl, reason: fn() -> CloseReason) {
    for (_, q) in std::mem::take(&mut ctrl.io_queues) {
        r.send(q.reactor, move |r| {
            r.with_source::<Queue<T>, _>(q.source, |c, r| {
                if c.serial == q.serial {
                    c.close(r, q.source, reason());
                }
            });
        });
    }
}

/// Delete a controller: its timer, its registry entry, its I/O queues.
pub(super) fn teardown_ctrl<T: Transport>(r: &mut Reactor, mut ctrl: Box<Ctrl>, reason: &CloseReason) {
    for t in [ctrl.ka_timer.take(), ctrl.health_timer.take()].into_iter().flatten() {
        r.cancel_timer(t);
    }
    if let Some(l) = r.local::<Local>() {
        l.ctrls.remove(&ctrl.cntlid);
    }
    close_io_queues::<T>(r, &mut ctrl, || CloseReason::ControllerDeleted);
    // The reason as a string field, as the log has always shown it.
    let reason = reason.to_string();
    info!(cntlid = ctrl.cntlid, hostnqn = %ctrl.hostnqn, reason = reason.as_str(), lifetime_s = ctrl.created.elapsed().as_secs(), "controller deleted");
}

/// Run `f` on every controller this reactor owns (the control socket's `controllers`).
pub fn for_each_ctrl<T: Transport>(r: &mut Reactor, mut f: impl FnMut(&Ctrl)) {
    let ids: Vec<u16> = r
        .local::<Local>()
        .map(|l| l.ctrls.keys().copied().collect())
        .unwrap_or_default();
    for id in ids {
        with_ctrl::<T, _>(r, id, |c, _| f(c));
    }
}
