//! DH-HMAC-CHAP on one queue, the controller's side (NVMe 2.0 §8.13.5; SPDK: `auth.c`, Linux:
//! `fabrics-cmd-auth.c`). Every queue, admin and I/O, authenticates by itself after its
//! Connect when its host has keys; until it has, only Authentication Send and Receive are
//! served. Pure: the connection feeds it commands and applies the outcome (timers, logs,
//! closing).
//!
//! The exchange: the host sends AUTH_Negotiate; the controller picks the first hash and DH
//! group of the subsystem's lists that the host offers and returns DH-HMAC-CHAP_Challenge
//! (C1, sequence number S1, its DH value); the host sends DH-HMAC-CHAP_Reply (R1, and C2 and
//! S2 when it wants the controller to prove itself); the controller checks R1 and returns
//! Success1 (with R2) or AUTH_Failure1; a host that asked for R2 ends with Success2 or
//! AUTH_Failure2. A new Negotiate on an authenticated queue re-authenticates it (the host
//! does so after a key change); the keys are looked up at each Negotiate, so a rotated key
//! applies to the next exchange.
//!
//! Secure channel concatenation (TP 8018): a Negotiate with SC_C NEWTLSPSK on a plain
//! admin queue, or REPLACETLSPSK on an admin queue a generated PSK secures, asks that the
//! exchange generate a PSK, HMAC(KS, C1 || C2), from which the queues' TLS connections
//! then take their key ([`pollux_nvme::tls::GeneratedPsk`]). It needs a DH group (KS is the
//! DH shared secret), SHA-256 or SHA-384 (a TLS cipher suite's hash), the host's C2, a
//! subsystem that allows it and a listener that takes TLS; anything else is refused with
//! AUTH_Failure1 "concatenation mismatch" and no PSK.

use std::sync::atomic::{AtomicU32, Ordering};

use pollux_conf::{Dhchap, HostKeys};
use pollux_nvme::auth::msg::{Challenge, Message, Negotiate, Reason, Reply};
use pollux_nvme::auth::{self, DhError, DhGroup, DhPrivate, HashId, SECP, SPSP, Transaction, sc_c};
use pollux_nvme::spec::Status;
use pollux_nvme::tls::{GeneratedPsk, PskIdentity};
use zeroize::Zeroizing;

/// Largest message accepted or returned: a Reply with SHA-512 and ffdhe8192 is 1168 bytes.
pub const MAX_MESSAGE: u32 = 4096;

/// What an Authentication Send or Receive changed.
#[derive(Debug)]
pub enum Outcome {
    /// The exchange goes on.
    Continue,
    /// Diffie-Hellman work to run off the reactor (milliseconds per exponentiation with the
    /// larger groups); its result goes to [`QueueAuth::computed`].
    Compute(DhJob),
    /// The queue is authenticated (`hash`, `dh`, `bidirectional` for the log).
    Authenticated {
        /// The hash used.
        hash: HashId,
        /// The DH group used.
        dh: DhGroup,
        /// The controller proved itself too.
        bidirectional: bool,
        /// The PSK it generated (secure channel concatenation asked): the target keeps it
        /// for the TLS connections that follow.
        generated: Option<GeneratedPsk>,
    },
    /// The exchange failed: the queue is not (or no longer) authenticated.
    Failed {
        /// Why, for the log.
        reason: String,
    },
}

/// Where one queue's exchange stands.
enum Step {
    /// No exchange under way.
    Idle,
    /// Negotiate accepted; the controller's DH value is being computed.
    KeyPairPending(Box<Exchange>),
    /// Negotiate accepted: the Challenge goes out at the next Receive.
    ChallengeDue(Box<Exchange>),
    /// The Reply arrived; the shared secret is being computed.
    SharedPending(Box<Exchange>, Reply),
    /// Challenge sent: the Reply is awaited.
    AwaitReply(Box<Exchange>),
    /// Reply checked: Success1 goes out at the next Receive.
    Success1Due {
        t_id: u16,
        hash: HashId,
        dh: DhGroup,
        r2: Option<Vec<u8>>,
        generated: Option<GeneratedPsk>,
    },
    /// Success1 with R2 sent: the host's Success2 (or Failure2) is awaited.
    AwaitSuccess2 {
        t_id: u16,
        hash: HashId,
        dh: DhGroup,
        generated: Option<GeneratedPsk>,
    },
    /// A failure: AUTH_Failure1 goes out at the next Receive.
    Failure1Due { t_id: u16, reason: Reason, why: String },
}

/// One exchange in flight.
struct Exchange {
    t_id: u16,
    sc_c: u8,
    hash: HashId,
    dh: DhGroup,
    seq: u32,
    c1: Vec<u8>,
    private: Option<DhPrivate>,
    /// The controller's DH value (empty for the null group).
    public: Vec<u8>,
}

/// Diffie-Hellman work of one exchange, identified by its token (results of an exchange a
/// new Negotiate replaced are dropped).
pub enum DhJob {
    /// A private value and its public value in `group`.
    KeyPair {
        /// The exchange.
        token: u64,
        /// The group.
        group: DhGroup,
    },
    /// The shared secret of `private` and the host's value `peer`.
    Shared {
        /// The exchange.
        token: u64,
        /// The controller's private value.
        private: DhPrivate,
        /// The host's public value.
        peer: Vec<u8>,
    },
}

impl std::fmt::Debug for DhJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::KeyPair { token, group } => write!(f, "KeyPair({token}, {group})"),
            Self::Shared { token, .. } => write!(f, "Shared({token})"),
        }
    }
}

/// A finished [`DhJob`].
pub enum DhDone {
    /// The private value and its public value.
    KeyPair {
        /// The exchange.
        token: u64,
        /// Them, or why not.
        result: Result<(DhPrivate, Vec<u8>), DhError>,
    },
    /// The shared secret.
    Shared {
        /// The exchange.
        token: u64,
        /// It, or why the host's value is refused.
        result: Result<Zeroizing<Vec<u8>>, DhError>,
    },
}

impl DhJob {
    /// Do the work (on a worker thread).
    pub fn run(self) -> DhDone {
        match self {
            Self::KeyPair { token, group } => DhDone::KeyPair {
                token,
                result: DhPrivate::generate(group).and_then(|p| p.public().map(|v| (p, v))),
            },
            Self::Shared { token, private, peer } => DhDone::Shared {
                token,
                result: private.shared(&peer),
            },
        }
    }
}

/// What an exchange needs of its controller: who is talking, the keys and the lists.
#[derive(Debug, Clone, Copy)]
pub struct AuthCtx<'a> {
    /// Host NQN of the queue's Connect.
    pub hostnqn: &'a str,
    /// Subsystem NQN.
    pub subnqn: &'a str,
    /// The host's keys now (None: it has none, so it cannot authenticate).
    pub keys: Option<&'a HostKeys>,
    /// The hash functions and DH groups to negotiate: the host's own, else the subsystem's.
    pub policy: &'a Dhchap,
    /// What secure channel concatenation may do on this queue.
    pub concat: Concat<'a>,
}

/// Where a queue stands for secure channel concatenation (TP 8018).
#[derive(Debug, Clone, Copy, Default)]
pub struct Concat<'a> {
    /// Why this queue may not generate a PSK whatever it asks (an I/O queue, the discovery
    /// controller, a subsystem or listener that does not allow it); None: it may.
    pub refused: Option<&'static str>,
    /// The PSK identity the queue's TLS session was secured with (None: plain TCP).
    pub tls: Option<&'a PskIdentity>,
}

/// Why secure channel concatenation (TP 8018) is refused on a queue.
#[derive(Debug, thiserror::Error)]
enum ConcatRefused {
    #[error("secure channel concatenation value {0:#04x} is not one this target knows")]
    UnknownValue(u8),
    #[error("secure channel concatenation asked: {0}")]
    NotAllowed(&'static str),
    #[error("a new generated PSK asked on a queue TLS already secures (REPLACETLSPSK replaces one)")]
    AlreadySecured,
    #[error("replacing the generated PSK asked on a queue no generated PSK secures")]
    NothingToReplace,
}

impl Concat<'_> {
    /// Whether SC_C `v` may be honoured on this queue (the reason when not).
    fn check(&self, v: u8) -> Result<(), ConcatRefused> {
        if v != sc_c::NEW_TLS_PSK && v != sc_c::REPLACE_TLS_PSK {
            return Err(ConcatRefused::UnknownValue(v));
        }
        if let Some(why) = self.refused {
            return Err(ConcatRefused::NotAllowed(why));
        }
        match (v, self.tls) {
            (sc_c::NEW_TLS_PSK, Some(_)) => Err(ConcatRefused::AlreadySecured),
            (sc_c::REPLACE_TLS_PSK, tls) if !tls.is_some_and(|i| i.generated) => Err(ConcatRefused::NothingToReplace),
            _ => Ok(()),
        }
    }
}

/// DH-HMAC-CHAP state of one queue.
pub struct QueueAuth {
    /// The host NQN of the queue's Connect.
    pub hostnqn: String,
    /// The host must authenticate this queue (its Connect said so, ATR).
    pub required: bool,
    /// It has, with the last exchange.
    pub authenticated: bool,
    step: Step,
    /// The current exchange's token.
    token: u64,
}

impl std::fmt::Debug for QueueAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueAuth")
            .field("required", &self.required)
            .field("authenticated", &self.authenticated)
            .finish_non_exhaustive()
    }
}

/// Sequence numbers S1: one counter for the target, from a random start, never 0 (NVMe 2.0
/// §8.13.5.5).
fn next_seq() -> u32 {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let mut cur = SEQ.load(Ordering::Relaxed);
    loop {
        let next = if cur == 0 {
            let mut b = [0u8; 4];
            auth::random(&mut b);
            u32::from_le_bytes(b).max(1)
        } else {
            cur.wrapping_add(1).max(1)
        };
        match SEQ.compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return next,
            Err(v) => cur = v,
        }
    }
}

/// The Authentication Send / Receive command fields (NVMe-oF 1.1 §6.1, §6.2): SECP E9h,
/// SPSP0 and SPSP1 01h, a non-zero length within [`MAX_MESSAGE`].
pub fn check_command(cdw10: u32, len: u32) -> Result<(), Status> {
    let (spsp0, spsp1, secp) = ((cdw10 >> 8) as u8, (cdw10 >> 16) as u8, (cdw10 >> 24) as u8);
    if secp != SECP || spsp0 != SPSP || spsp1 != SPSP || len == 0 || len > MAX_MESSAGE {
        return Err(Status::INVALID_FIELD.with_dnr());
    }
    Ok(())
}

impl QueueAuth {
    /// A queue of host `hostnqn`, which must (`required`) or need not authenticate.
    pub fn new(hostnqn: &str, required: bool) -> Self {
        Self {
            hostnqn: hostnqn.to_owned(),
            required,
            authenticated: false,
            step: Step::Idle,
            token: 0,
        }
    }

    /// The queue of a hot upgrade's new process: authenticated (if it had to be) by the
    /// exchange it ran with the old one (only queues between exchanges are handed over).
    pub fn resumed(hostnqn: &str, required: bool) -> Self {
        Self {
            authenticated: required,
            ..Self::new(hostnqn, required)
        }
    }

    /// No exchange is under way.
    pub fn idle(&self) -> bool {
        matches!(self.step, Step::Idle)
    }

    /// Commands other than Authentication Send / Receive may run.
    pub fn allows_commands(&self) -> bool {
        !self.required || self.authenticated
    }

    /// DH work is running: an Authentication Receive waits for [`QueueAuth::computed`].
    pub fn computing(&self) -> bool {
        matches!(self.step, Step::KeyPairPending(_) | Step::SharedPending(..))
    }

    /// The DH work of the exchange could not be queued (too many exchanges at once): it
    /// fails, and the host may try again.
    pub fn overloaded(&mut self) -> Outcome {
        let t_id = match &self.step {
            Step::KeyPairPending(x) | Step::SharedPending(x, _) => x.t_id,
            _ => 0,
        };
        self.fail(
            t_id,
            Reason::Failed,
            "too many authentications in progress on this target",
        )
    }

    /// The result of an [`Outcome::Compute`] job.
    pub fn computed(&mut self, ctx: &AuthCtx<'_>, done: DhDone) -> Outcome {
        match (std::mem::replace(&mut self.step, Step::Idle), done) {
            (Step::KeyPairPending(mut x), DhDone::KeyPair { token, result }) if token == self.token => match result {
                Ok((private, public)) => {
                    x.private = Some(private);
                    x.public = public;
                    self.step = Step::ChallengeDue(x);
                    Outcome::Continue
                }
                Err(e) => self.fail(x.t_id, Reason::Failed, e.to_string()),
            },
            (Step::SharedPending(x, r), DhDone::Shared { token, result }) if token == self.token => match result {
                Ok(z) => self.verify(ctx, *x, r, Some(z)),
                Err(e) => self.fail(x.t_id, Reason::IncorrectPayload, format!("the host's DH value: {e}")),
            },
            // A result of an exchange since replaced: nothing to do.
            (step, _) => {
                self.step = step;
                Outcome::Continue
            }
        }
    }

    fn fail(&mut self, t_id: u16, reason: Reason, why: impl Into<String>) -> Outcome {
        let why = why.into();
        self.step = Step::Failure1Due {
            t_id,
            reason,
            why: why.clone(),
        };
        self.authenticated = false;
        Outcome::Continue
    }

    /// Authentication Send carrying `data`. The command itself succeeds whatever the message
    /// says: a refusal is the Failure1 the next Receive returns (NVMe 2.0 §8.13.5.7).
    pub fn send(&mut self, ctx: &AuthCtx<'_>, data: &[u8]) -> Outcome {
        let msg = match Message::parse(data) {
            Ok(m) => m,
            Err(reason) => {
                let t_id = if data.len() >= 6 {
                    u16::from_le_bytes([data[4], data[5]])
                } else {
                    0
                };
                return self.fail(t_id, reason, format!("bad message: {}", reason.describe()));
            }
        };
        match (std::mem::replace(&mut self.step, Step::Idle), msg) {
            // A Negotiate starts an exchange whatever came before (a retry, or re-authentication).
            (_, Message::Negotiate(n)) => self.negotiate(ctx, n),
            (Step::AwaitReply(x), Message::Reply(r)) => self.reply(ctx, *x, r),
            (
                Step::AwaitSuccess2 {
                    t_id,
                    hash,
                    dh,
                    generated,
                },
                Message::Success2 { t_id: got },
            ) if got == t_id => {
                self.authenticated = true;
                Outcome::Authenticated {
                    hash,
                    dh,
                    bidirectional: true,
                    generated,
                }
            }
            (
                _,
                Message::Failure {
                    from_host: true,
                    explanation,
                    ..
                },
            ) => {
                self.authenticated = false;
                let why = Reason::from_code(explanation).map_or("unknown reason", Reason::describe);
                Outcome::Failed {
                    reason: format!("the host ended the exchange (AUTH_Failure2: {why})"),
                }
            }
            (_, m) => {
                let t_id = match &m {
                    Message::Reply(r) => r.t_id,
                    Message::Success2 { t_id } => *t_id,
                    _ => 0,
                };
                self.fail(t_id, Reason::IncorrectMessage, "a message out of order")
            }
        }
    }

    fn negotiate(&mut self, ctx: &AuthCtx<'_>, n: Negotiate) -> Outcome {
        let t_id = n.t_id;
        if ctx.keys.is_none() {
            return self.fail(t_id, Reason::Failed, "no key is configured for this host");
        }
        let concat = n.sc_c != sc_c::NONE;
        if concat && let Err(why) = ctx.concat.check(n.sc_c) {
            return self.fail(t_id, Reason::ConcatMismatch, why.to_string());
        }
        // A generated PSK is a TLS PSK: its hash must be a cipher suite's (not SHA-512),
        // and its key the DH shared secret (not the null group).
        let (no_hash, no_group) = if concat {
            (
                " (concatenation needs SHA-256 or SHA-384)",
                " (concatenation needs a DH group other than null)",
            )
        } else {
            ("", "")
        };
        let Some(hash) = first_offered(&ctx.policy.hashes, &n.hashes, HashId::id, |h| {
            !(concat && h == HashId::Sha512)
        }) else {
            let why = format!("the host offers hashes {:?}{no_hash}", n.hashes);
            return self.fail(t_id, Reason::HashUnusable, why);
        };
        let Some(dh) = first_offered(&ctx.policy.dh_groups, &n.dh_groups, DhGroup::id, |g| {
            !(concat && g == DhGroup::Null)
        }) else {
            let why = format!("the host offers DH groups {:?}{no_group}", n.dh_groups);
            return self.fail(t_id, Reason::DhGroupUnusable, why);
        };
        let mut c1 = vec![0u8; hash.output_len()];
        if !auth::random(&mut c1) {
            return self.fail(t_id, Reason::Failed, "no random source");
        }
        self.token += 1;
        let x = Box::new(Exchange {
            t_id,
            sc_c: n.sc_c,
            hash,
            dh,
            seq: next_seq(),
            c1,
            private: None,
            public: Vec::new(),
        });
        if dh == DhGroup::Null {
            self.step = Step::ChallengeDue(x);
            return Outcome::Continue;
        }
        self.step = Step::KeyPairPending(x);
        Outcome::Compute(DhJob::KeyPair {
            token: self.token,
            group: dh,
        })
    }

    fn reply(&mut self, ctx: &AuthCtx<'_>, mut x: Exchange, r: Reply) -> Outcome {
        let t_id = x.t_id;
        let hl = x.hash.output_len();
        if r.t_id != t_id {
            return self.fail(t_id, Reason::IncorrectPayload, "the Reply's transaction id differs");
        }
        if r.r.len() != hl || r.dhv.len() != x.dh.value_len() {
            return self.fail(
                t_id,
                Reason::IncorrectPayload,
                "the Reply's response or DH value has the wrong length",
            );
        }
        match x.private.take() {
            None => self.verify(ctx, x, r, None),
            Some(private) => {
                let peer = r.dhv.clone();
                self.step = Step::SharedPending(Box::new(x), r);
                Outcome::Compute(DhJob::Shared {
                    token: self.token,
                    private,
                    peer,
                })
            }
        }
    }

    /// Check the host's response with the shared secret (None: the null group).
    fn verify(&mut self, ctx: &AuthCtx<'_>, x: Exchange, r: Reply, shared: Option<Zeroizing<Vec<u8>>>) -> Outcome {
        let t_id = x.t_id;
        let Some(keys) = ctx.keys else {
            return self.fail(t_id, Reason::Failed, "the host's key was removed");
        };
        let tx = Transaction {
            hash: x.hash,
            t_id,
            sc_c: x.sc_c,
            hostnqn: ctx.hostnqn,
            subnqn: ctx.subnqn,
        };
        let ca1 = auth::augmented_challenge(x.hash, &x.c1, shared.as_deref().map(Vec::as_slice));
        let host_key = keys.host.key.transform(ctx.hostnqn);
        let mut matches = auth::responses_equal(&tx.host_response(&host_key, &ca1, x.seq), &r.r);
        if !matches && x.sc_c != sc_c::NONE {
            // Linux hosts before 6.18 hash 00h where SC_C goes, whatever they negotiated.
            let tx0 = Transaction { sc_c: sc_c::NONE, ..tx };
            matches = auth::responses_equal(&tx0.host_response(&host_key, &ca1, x.seq), &r.r);
        }
        if !matches {
            return self.fail(t_id, Reason::Failed, "the host's response does not match its key");
        }
        let generated = if x.sc_c == sc_c::NONE {
            None
        } else {
            // The PSK is HMAC(KS, C1 || C2): the host must have sent its C2, which a host
            // that does not ask the controller to prove itself sends with S2 = 0.
            if !r.cvalid {
                return self.fail(
                    t_id,
                    Reason::IncorrectPayload,
                    "secure channel concatenation without the host's challenge C2",
                );
            }
            let Some(g) = shared
                .as_deref()
                .and_then(|z| GeneratedPsk::generate(x.hash, z, &x.c1, &r.c2))
            else {
                return self.fail(t_id, Reason::Failed, "no PSK can be generated from this exchange");
            };
            Some(g)
        };
        // CVALID with S2 = 0: C2 is given (for a generated PSK) and the controller need not
        // prove itself (NVMe 2.0 §8.13.5.6).
        let r2 = if r.cvalid && r.seq != 0 {
            let Some(ctrl) = &keys.ctrl else {
                return self.fail(
                    t_id,
                    Reason::Failed,
                    "the host asks the controller to authenticate, and no controller key is configured",
                );
            };
            let ca2 = auth::augmented_challenge(x.hash, &r.c2, shared.as_deref().map(Vec::as_slice));
            Some(tx.ctrl_response(&ctrl.key.transform(ctx.subnqn), &ca2, r.seq).to_vec())
        } else {
            None
        };
        self.step = Step::Success1Due {
            t_id,
            hash: x.hash,
            dh: x.dh,
            r2,
            generated,
        };
        Outcome::Continue
    }

    /// Authentication Receive of at most `al` bytes: the message due, zero-padded to `al`
    /// (as the Linux host expects), or Invalid Field when it does not fit.
    pub fn receive(&mut self, al: u32) -> Result<(Vec<u8>, Outcome), Status> {
        let (msg, outcome) = match std::mem::replace(&mut self.step, Step::Idle) {
            Step::ChallengeDue(x) => {
                let dhv = x.public.clone();
                let m = Message::Challenge(Challenge {
                    t_id: x.t_id,
                    hash: x.hash,
                    dh: x.dh,
                    seq: x.seq,
                    c: x.c1.clone(),
                    dhv,
                })
                .encode();
                self.step = Step::AwaitReply(x);
                (m, Outcome::Continue)
            }
            Step::Success1Due {
                t_id,
                hash,
                dh,
                r2,
                generated,
            } => {
                let bidirectional = r2.is_some();
                let m = Message::Success1 {
                    t_id,
                    hl: hash.output_len() as u8,
                    r2,
                }
                .encode();
                if bidirectional {
                    self.step = Step::AwaitSuccess2 {
                        t_id,
                        hash,
                        dh,
                        generated,
                    };
                    (m, Outcome::Continue)
                } else {
                    self.authenticated = true;
                    (
                        m,
                        Outcome::Authenticated {
                            hash,
                            dh,
                            bidirectional: false,
                            generated,
                        },
                    )
                }
            }
            Step::Failure1Due { t_id, reason, why } => {
                self.authenticated = false;
                (
                    failure1(t_id, reason),
                    Outcome::Failed {
                        reason: format!("{why} (AUTH_Failure1: {})", reason.describe()),
                    },
                )
            }
            // Nothing is due: a Receive out of order fails the exchange.
            _ => {
                self.authenticated = false;
                (
                    failure1(0, Reason::IncorrectMessage),
                    Outcome::Failed {
                        reason: "Authentication Receive with no message due".into(),
                    },
                )
            }
        };
        if msg.len() > al as usize {
            // Too small a buffer for the message due: the exchange is over.
            self.step = Step::Idle;
            self.authenticated = false;
            return Err(Status::INVALID_FIELD.with_dnr());
        }
        let mut data = msg;
        data.resize(al as usize, 0);
        Ok((data, outcome))
    }
}

/// The first of `ours` (most preferred first) whose identifier the host offers and that
/// `usable` allows (NVMe 2.0 §8.13.5.4: the controller chooses among the host's offer).
fn first_offered<T: Copy>(ours: &[T], offered: &[u8], id: impl Fn(T) -> u8, usable: impl Fn(T) -> bool) -> Option<T> {
    ours.iter().copied().find(|&x| offered.contains(&id(x)) && usable(x))
}

fn failure1(t_id: u16, reason: Reason) -> Vec<u8> {
    Message::Failure {
        t_id,
        from_host: false,
        explanation: reason as u8,
    }
    .encode()
}
