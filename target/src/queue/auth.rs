//! Authentication Send and Receive on a queue (NVMe-oF 1.1 §6.1, §6.2) and what DH-HMAC-CHAP
//! needs of the reactor: the deadline by which a queue that must authenticate has, and the
//! log of every outcome (host NQN, hash, group; never a key). The exchange itself is
//! [`crate::controller::auth`].

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use pollux_nvme::spec::{Sqe, Status};
use pollux_reactor::{Reactor, SourceId};
use tracing::{info, warn};

use super::finish::End;
use super::{Queue, Role, Transport};
use crate::controller::admin::to_host_len;
use crate::controller::auth::{AuthCtx, Concat, DhDone, DhJob, MAX_MESSAGE, Outcome, QueueAuth, check_command};
use crate::controller::reply::Reply;

/// How long a queue that must authenticate may take to (after its Connect, or after a
/// failed exchange), before it is closed: a host that stalls mid-exchange holds nothing for
/// long. Not less: the Linux host's first use of ffdhe8192 runs a crypto self-test that
/// takes 12 s of an emulated (TCG) CPU.
pub const AUTH_TIMEOUT: Duration = Duration::from_secs(30);

impl<T: Transport> Queue<T> {
    /// The queue was connected for `hostnqn`; `required`: it must authenticate (the Connect
    /// response carries ATR). Arms the deadline.
    pub(super) fn start_auth(&mut self, r: &mut Reactor, id: SourceId, hostnqn: &str, required: bool) {
        self.auth = QueueAuth::new(hostnqn, required);
        if required {
            self.arm_auth_deadline(r, id);
        }
    }

    fn arm_auth_deadline(&mut self, r: &mut Reactor, id: SourceId) {
        if let Some(t) = self.auth_timer.take() {
            r.cancel_timer(t);
        }
        let serial = self.serial;
        self.auth_timer = Some(r.add_timer(Instant::now() + AUTH_TIMEOUT, move |r| {
            r.with_source::<Self, _>(id, |c, r| {
                if c.serial != serial {
                    return;
                }
                c.auth_timer = None;
                if !c.auth.allows_commands() {
                    warn!(peer = %c.t.peer(), qid = c.sq.qid, hostnqn = %c.auth.hostnqn,
                        "authentication not completed in time: closing the queue");
                    c.close(r, id, crate::close::CloseReason::AuthTimeout);
                }
            });
        }));
    }

    /// Authentication Send: the host's message, in-capsule (`data`), `tl` bytes.
    pub(super) fn auth_send(&mut self, r: &mut Reactor, id: SourceId, sqe: &Sqe, cdw10: u32, tl: u32, data: &[u8]) {
        let cid = sqe.cid.get();
        if let Err(s) = check_command(cdw10, tl) {
            return self.finish(r, cid, &End::status(s).unlogged());
        }
        // Every message fits the in-capsule data of any queue (at least 4 KiB).
        if data.len() < tl as usize {
            return self.finish(r, cid, &End::status(Status::INVALID_FIELD.with_dnr()).unlogged());
        }
        let Some(outcome) = self.auth_step(|a, ctx| a.send(ctx, &data[..tl as usize])) else {
            return self.finish(
                r,
                cid,
                &End::status(Status::COMMAND_SEQUENCE_ERROR.with_dnr()).unlogged(),
            );
        };
        self.end(r, cid, Status::SUCCESS);
        self.auth_outcome(r, id, outcome);
    }

    /// Run `f` on this queue's exchange with what it needs of the controller: the keys and
    /// lists of its subsystem now (or of `[discovery]`). None: the queue is not connected.
    fn auth_step(&mut self, f: impl FnOnce(&mut QueueAuth, &AuthCtx<'_>) -> Outcome) -> Option<Outcome> {
        let subsys = match &self.role {
            Role::Admin(ctrl) => ctrl.subsys.clone(),
            Role::Io(io) => Some(io.subsys.clone()),
            _ => return None,
        };
        let snap = self.shared.snapshot.load();
        // The subsystem as the running configuration has it now: the controller's own copy
        // is replaced by a message the control plane sends after it answers, so a host that
        // re-authenticates right after a change of its keys or lists could otherwise still
        // be offered the old ones.
        // Keys and lists only: the subsystem itself, not the host's view of its namespaces.
        let subsys = subsys.map(|s| snap.subsystem(&s.nqn).cloned().unwrap_or_else(|| s.subsystem().clone()));
        // The context borrows a copy of the host NQN, so the exchange itself can change.
        let hostnqn = self.auth.hostnqn.clone();
        let mut ctx = auth_ctx(&hostnqn, subsys.as_deref(), &snap.discovery);
        let listener_tls = self.listener.and_then(|a| snap.listener(a)).map(|l| l.tls);
        ctx.concat = Concat {
            refused: concat_refused(self.sq.qid, subsys.as_deref(), listener_tls),
            tls: self.t.tls_identity(),
        };
        Some(f(&mut self.auth, &ctx))
    }

    /// Authentication Receive: the controller's next message, at most `al` bytes.
    pub(super) fn auth_receive(&mut self, r: &mut Reactor, id: SourceId, sqe: &Sqe, cdw10: u32, al: u32) {
        let cid = sqe.cid.get();
        if let Err(s) = check_command(cdw10, al) {
            return self.finish(r, cid, &End::status(s).unlogged());
        }
        if !matches!(self.role, Role::Admin(_) | Role::Io(_)) {
            return self.finish(
                r,
                cid,
                &End::status(Status::COMMAND_SEQUENCE_ERROR.with_dnr()).unlogged(),
            );
        }
        let buf = match to_host_len(sqe, MAX_MESSAGE) {
            Ok(n) if n >= al => al,
            Ok(_) => {
                return self.finish(
                    r,
                    cid,
                    &End::status(Status::DATA_SGL_LENGTH_INVALID.with_dnr()).unlogged(),
                );
            }
            Err(s) => return self.finish(r, cid, &End::status(s).unlogged()),
        };
        if self.auth.computing() {
            // The message depends on DH work still running: answered when it is done. One
            // Receive per message: a second one meanwhile is out of sequence.
            if self.auth_held.is_some() {
                return self.finish(
                    r,
                    cid,
                    &End::status(Status::COMMAND_SEQUENCE_ERROR.with_dnr()).unlogged(),
                );
            }
            self.auth_held = Some((cid, buf));
            return;
        }
        self.answer_receive(r, id, cid, buf);
    }

    /// Answer Authentication Receive `cid` with the message due, `buf` bytes.
    fn answer_receive(&mut self, r: &mut Reactor, id: SourceId, cid: u16, buf: u32) {
        match self.auth.receive(buf) {
            Ok((data, outcome)) => {
                self.finish(r, cid, &End::reply(&Reply::data(data), buf).unlogged());
                self.auth_outcome(r, id, outcome);
            }
            Err(s) => {
                self.finish(r, cid, &End::status(s).unlogged());
                self.auth_outcome(
                    r,
                    id,
                    Outcome::Failed {
                        reason: format!("Authentication Receive of {buf} bytes: too small for the message due"),
                    },
                );
            }
        }
    }

    fn auth_outcome(&mut self, r: &mut Reactor, id: SourceId, outcome: Outcome) {
        let (peer, qid) = (self.t.peer(), self.sq.qid);
        match outcome {
            Outcome::Continue => {}
            Outcome::Compute(job) => self.offload(r, id, job),
            Outcome::Authenticated {
                hash,
                dh,
                bidirectional,
                generated,
            } => {
                if let Some(t) = self.auth_timer.take() {
                    r.cancel_timer(t);
                }
                if let Some(psk) = generated {
                    self.keep_generated(&psk);
                }
                // The keep-alive window starts now, not at the Connect.
                if let Role::Admin(ctrl) = &mut self.role {
                    ctrl.last_keep_alive = Instant::now();
                    ctrl.authenticated = Some(format!("{hash}/{dh}{}", if bidirectional { "+ctrl" } else { "" }));
                }
                info!(%peer, qid, hostnqn = %self.auth.hostnqn, %hash, dhgroup = %dh, bidirectional,
                    "queue authenticated (DH-HMAC-CHAP)");
            }
            Outcome::Failed { reason } => {
                warn!(%peer, qid, hostnqn = %self.auth.hostnqn, "authentication failed: {reason}");
                if let Role::Admin(ctrl) = &mut self.role {
                    ctrl.authenticated = None;
                }
                if self.auth.required && self.auth_timer.is_none() {
                    // Nothing but a new exchange runs now; the queue goes if none succeeds in
                    // time. A deadline already running is kept: failing again and again
                    // does not buy time.
                    self.arm_auth_deadline(r, id);
                }
            }
        }
    }
}

impl<T: Transport> Queue<T> {
    /// Keep the PSK this admin queue's exchange generated for the TLS connections that
    /// follow, and revoke the one it replaces (REPLACETLSPSK on a queue a generated PSK
    /// secures: live connections keep their sessions, new ones need the new key).
    fn keep_generated(&mut self, psk: &pollux_nvme::tls::GeneratedPsk) {
        let subnqn = match &self.role {
            Role::Admin(ctrl) => ctrl.subsys.as_ref().map(|s| s.nqn.clone()),
            _ => None,
        };
        let Some(subnqn) = subnqn else { return };
        let hostnqn = &self.auth.hostnqn;
        if self.shared.generated.insert(hostnqn, &subnqn, psk).is_none() {
            warn!(peer = %self.t.peer(), %hostnqn, %subnqn, "the generated PSK derives no TLS PSK: not kept");
            return;
        }
        let replaced = self
            .t
            .tls_identity()
            .is_some_and(|old| old.generated && self.shared.generated.revoke(old));
        info!(peer = %self.t.peer(), %hostnqn, %subnqn, hash = psk.hash().id(), replaced,
            "secure channel concatenation: PSK generated for the queues' TLS connections");
    }

    /// Run `job` on the DH worker; its result comes back to this connection by message.
    fn offload(&mut self, r: &mut Reactor, id: SourceId, job: DhJob) {
        let (serial, me) = (self.serial, self.reactor);
        let Some(remote) = r.remote(me) else { return };
        let back = move |done: DhDone| {
            remote.send(move |r| {
                r.with_source::<Self, _>(id, |c, r| {
                    if c.serial == serial {
                        c.auth_computed(r, id, done);
                    }
                });
            });
        };
        match dh_worker().submit(job, Box::new(back)) {
            Ok(()) => {}
            Err(Refused::NoWorker(job)) => {
                // No worker thread: do it here (slower for neighbours, never wrong).
                let done = job.run();
                self.auth_computed(r, id, done);
            }
            Err(Refused::Full) => {
                // A connect storm with large groups: refuse this exchange rather than queue
                // work (and memory) without bound; the host retries.
                let o = self.auth.overloaded();
                self.auth_outcome(r, id, o);
                if let Some((cid, buf)) = self.auth_held.take() {
                    self.answer_receive(r, id, cid, buf);
                }
            }
        }
    }

    fn auth_computed(&mut self, r: &mut Reactor, id: SourceId, done: DhDone) {
        let Some(outcome) = self.auth_step(|a, ctx| a.computed(ctx, done)) else {
            return;
        };
        self.auth_outcome(r, id, outcome);
        if !self.auth.computing()
            && let Some((cid, buf)) = self.auth_held.take()
        {
            self.answer_receive(r, id, cid, buf);
        }
        self.flush_or_close(r, id);
    }
}

/// What an exchange of `hostnqn` on `subsys` needs; None: the discovery controller, whose
/// keys are the `[discovery]` table's (`disc`). The hashes and DH groups negotiated are the
/// host's own when its entry gives them, else the subsystem's (NVMe 2.0 §8.13.5.1); both
/// are read from the snapshot at each AUTH_Negotiate, so a change at run time applies to
/// the next (re-)authentication of a live queue.
fn auth_ctx<'a>(
    hostnqn: &'a str,
    subsys: Option<&'a crate::subsystem::Subsystem>,
    disc: &'a pollux_conf::Discovery,
) -> AuthCtx<'a> {
    let (subnqn, keys, parent) = match subsys {
        Some(s) => (s.nqn.as_str(), s.keys_of(hostnqn), &s.dhchap),
        None => (pollux_conf::DISCOVERY_NQN, disc.host_keys.get(hostnqn), &disc.dhchap),
    };
    AuthCtx {
        hostnqn,
        subnqn,
        keys,
        policy: keys.map_or(parent, |k| k.policy(parent)),
        concat: Concat::default(),
    }
}

/// Why queue `qid` of `subsys` (None: discovery), which came through a listener of TLS
/// mode `listener_tls` (None: the listener is gone), may not generate a PSK (TP 8018): only
/// an admin queue may, of a subsystem that allows it, through a listener that will take the
/// TLS connections that follow (`tls = "allowed"`, or `"required"` for a queue TLS already
/// secures).
fn concat_refused(
    qid: u16,
    subsys: Option<&crate::subsystem::Subsystem>,
    listener_tls: Option<pollux_conf::TlsMode>,
) -> Option<&'static str> {
    if qid != 0 {
        return Some("only an admin queue may generate a PSK");
    }
    match subsys {
        None => return Some("the discovery controller does not generate PSKs"),
        Some(s) if !s.secure_concat => return Some("the subsystem does not allow it (secure_concat)"),
        Some(_) => {}
    }
    match listener_tls {
        None | Some(pollux_conf::TlsMode::None) => Some("the listener takes no TLS connections"),
        Some(_) => None,
    }
}

type DhReply = Box<dyn FnOnce(DhDone) + Send>;

/// One thread for the DH exponentiations of every queue: a connect of an ffdhe8192 host
/// costs tens of milliseconds of a core, which a reactor would otherwise take from the
/// queues it serves.
struct DhWorker {
    tx: Option<std::sync::mpsc::Sender<(DhJob, DhReply)>>,
    /// Jobs queued or running.
    queued: Arc<AtomicUsize>,
}

/// Jobs the DH worker holds at most: beyond, exchanges are refused (each is at most a few
/// tens of milliseconds of work; this bounds a connect storm's wait and memory).
const DH_QUEUE_MAX: usize = 256;

enum Refused {
    /// No worker thread: the caller runs the job itself.
    NoWorker(DhJob),
    /// The queue is full.
    Full,
}

impl DhWorker {
    fn submit(&self, job: DhJob, reply: DhReply) -> Result<(), Refused> {
        let Some(tx) = &self.tx else {
            return Err(Refused::NoWorker(job));
        };
        if self.queued.fetch_add(1, Ordering::AcqRel) >= DH_QUEUE_MAX {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            return Err(Refused::Full);
        }
        tx.send((job, reply)).map_err(|e| {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            Refused::NoWorker(e.0.0)
        })
    }
}

fn dh_worker() -> &'static DhWorker {
    static W: std::sync::OnceLock<DhWorker> = std::sync::OnceLock::new();
    W.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<(DhJob, DhReply)>();
        let queued = Arc::new(AtomicUsize::new(0));
        let q = queued.clone();
        let spawned = std::thread::Builder::new().name("pollux-dh".into()).spawn(move || {
            for (job, reply) in rx {
                let done = job.run();
                q.fetch_sub(1, Ordering::AcqRel);
                reply(done);
            }
        });
        match spawned {
            Ok(_) => DhWorker { tx: Some(tx), queued },
            Err(e) => {
                warn!("no DH worker thread ({e}): DH-HMAC-CHAP exponentiations run on the reactors");
                DhWorker { tx: None, queued }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use pollux_conf::DhGroup;

    fn job() -> DhJob {
        DhJob::KeyPair {
            token: 7,
            group: DhGroup::Ffdhe2048,
        }
    }

    /// The worker's queue holds DH_QUEUE_MAX jobs: one more is refused (the exchange then
    /// fails as overloaded and the host retries), a job that ran makes room, and without a
    /// worker the job comes back to run on the reactor.
    #[test]
    fn the_dh_queue_is_bounded_and_frees_room_as_jobs_run() {
        let (tx, rx) = std::sync::mpsc::channel::<(DhJob, DhReply)>();
        let w = DhWorker {
            tx: Some(tx),
            queued: Arc::new(AtomicUsize::new(0)),
        };
        for _ in 0..DH_QUEUE_MAX {
            assert!(w.submit(job(), Box::new(|_| {})).is_ok());
        }
        assert!(matches!(w.submit(job(), Box::new(|_| {})), Err(Refused::Full)));
        assert_eq!(
            w.queued.load(Ordering::Acquire),
            DH_QUEUE_MAX,
            "a refusal holds no slot"
        );
        // What the worker thread does with one job: run it, free its slot.
        let (j, _reply) = rx.recv().unwrap();
        drop(j);
        w.queued.fetch_sub(1, Ordering::AcqRel);
        assert!(w.submit(job(), Box::new(|_| {})).is_ok());
        // The worker gone (its queue drained): the job comes back, holding no slot.
        drop(rx);
        w.queued.store(0, Ordering::Release);
        assert!(matches!(w.submit(job(), Box::new(|_| {})), Err(Refused::NoWorker(_))));
        assert_eq!(w.queued.load(Ordering::Acquire), 0);
        let none = DhWorker {
            tx: None,
            queued: Arc::new(AtomicUsize::new(0)),
        };
        assert!(matches!(
            none.submit(job(), Box::new(|_| {})),
            Err(Refused::NoWorker(_))
        ));
    }
}
