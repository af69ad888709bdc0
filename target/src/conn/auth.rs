//! Authentication Send and Receive on a queue (NVMe-oF 1.1 §6.1, §6.2) and what DH-HMAC-CHAP
//! needs of the reactor: the deadline by which a queue that must authenticate has, and the
//! log of every outcome (host NQN, hash, group; never a key). The exchange itself is
//! [`crate::ctrl::auth`].

use std::time::{Duration, Instant};

use pollux_nvme::spec::{Sqe, Status};
use pollux_reactor::{Reactor, SourceId};
use tracing::{info, warn};

use super::{Conn, Queue};
use crate::ctrl::admin::{Reply, c2h_len};
use crate::ctrl::auth::{AuthCtx, MAX_MESSAGE, Outcome, QueueAuth, check_command};

/// How long a queue that must authenticate may take to (after its Connect, or after a
/// failed exchange), before it is closed: a host that stalls mid-exchange holds nothing.
pub const AUTH_TIMEOUT: Duration = Duration::from_secs(10);

impl Conn {
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
            r.with_source::<Conn, _>(id, |c, r| {
                if c.serial != serial {
                    return;
                }
                c.auth_timer = None;
                if !c.auth.allows_commands() {
                    warn!(peer = %c.tcp.peer, qid = c.sq.qid, hostnqn = %c.auth.hostnqn,
                        "authentication not completed in time: closing the queue");
                    c.close(r, id, "authentication timeout");
                }
            });
        }));
    }

    /// Authentication Send: the host's message, in-capsule (`data`), `tl` bytes.
    pub(super) fn auth_send(&mut self, r: &mut Reactor, id: SourceId, sqe: &Sqe, cdw10: u32, tl: u32, data: &[u8]) {
        let cid = sqe.cid.get();
        if let Err(s) = check_command(cdw10, tl) {
            return self.resp(cid, s, 0, 0);
        }
        // Every message fits the in-capsule data of any queue (at least 4 KiB).
        if data.len() < tl as usize {
            return self.resp(cid, Status::INVALID_FIELD.with_dnr(), 0, 0);
        }
        let subsys = match &self.q {
            Queue::Admin(ctrl) => ctrl.subsys.clone(),
            Queue::Io(io) => Some(io.subsys.clone()),
            _ => return self.resp(cid, Status::COMMAND_SEQUENCE_ERROR.with_dnr(), 0, 0),
        };
        let mut auth = std::mem::replace(&mut self.auth, QueueAuth::new("", false));
        let ctx = AuthCtx {
            hostnqn: &auth.hostnqn.clone(),
            subnqn: subsys.as_ref().map_or(pollux_conf::DISCOVERY_NQN, |s| s.nqn.as_str()),
            keys: subsys.as_ref().and_then(|s| s.keys_of(&auth.hostnqn)),
            policy: subsys.as_ref().map_or(&DEFAULT_POLICY, |s| &s.dhchap),
        };
        let outcome = auth.send(&ctx, &data[..tl as usize]);
        self.auth = auth;
        self.resp(cid, Status::SUCCESS, 0, 0);
        self.auth_outcome(r, id, outcome);
    }

    /// Authentication Receive: the controller's next message, at most `al` bytes.
    pub(super) fn auth_receive(&mut self, r: &mut Reactor, id: SourceId, sqe: &Sqe, cdw10: u32, al: u32) {
        let cid = sqe.cid.get();
        if let Err(s) = check_command(cdw10, al) {
            return self.resp(cid, s, 0, 0);
        }
        if !matches!(self.q, Queue::Admin(_) | Queue::Io(_)) {
            return self.resp(cid, Status::COMMAND_SEQUENCE_ERROR.with_dnr(), 0, 0);
        }
        let buf = match c2h_len(sqe, MAX_MESSAGE) {
            Ok(n) if n >= al => al,
            Ok(_) => return self.resp(cid, Status::DATA_SGL_LENGTH_INVALID.with_dnr(), 0, 0),
            Err(s) => return self.resp(cid, s, 0, 0),
        };
        match self.auth.receive(buf) {
            Ok((data, outcome)) => {
                self.reply(cid, Reply::data(data), buf);
                self.auth_outcome(r, id, outcome);
            }
            Err(s) => {
                self.resp(cid, s, 0, 0);
                self.auth_outcome(
                    r,
                    id,
                    Outcome::Failed {
                        reason: format!("Authentication Receive of {al} bytes: too small for the message due"),
                    },
                );
            }
        }
    }

    fn auth_outcome(&mut self, r: &mut Reactor, id: SourceId, outcome: Outcome) {
        let (peer, qid) = (self.tcp.peer, self.sq.qid);
        match outcome {
            Outcome::Continue => {}
            Outcome::Authenticated {
                hash,
                dh,
                bidirectional,
            } => {
                if let Some(t) = self.auth_timer.take() {
                    r.cancel_timer(t);
                }
                info!(%peer, qid, hostnqn = %self.auth.hostnqn, %hash, dhgroup = %dh, bidirectional,
                    "queue authenticated (DH-HMAC-CHAP)");
            }
            Outcome::Failed { reason } => {
                warn!(%peer, qid, hostnqn = %self.auth.hostnqn, "authentication failed: {reason}");
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

/// The lists a discovery controller would use (it has no keys, so no exchange succeeds).
static DEFAULT_POLICY: std::sync::LazyLock<pollux_conf::Dhchap> = std::sync::LazyLock::new(Default::default);
