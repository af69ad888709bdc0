//! The host's side of DH-HMAC-CHAP (NVMe 2.0 §8.13.5), as the Linux host runs it: after a
//! Connect whose response asks for authentication (ATR), Negotiate, Challenge, Reply,
//! Success1 and, when the host asked the controller to prove itself, Success2. A target's
//! controller is checked against the controller key; any failure is a
//! [`HostError::Auth`].

use pollux_nvme::auth::msg::{Message, Negotiate, Reason, Reply};
use pollux_nvme::auth::{self, DhGroup, DhPrivate, DhchapKey, HashId, SECP, SPSP, Transaction, sc_c};
use pollux_nvme::spec::StatusContext;
use pollux_nvme::tls::GeneratedPsk;

use super::queue::{Data, HostQueue};
use super::{HostError, sqe};

/// AL of every Authentication Receive (as the Linux host).
pub const RECEIVE_LEN: u32 = 4096;

/// A host's DH-HMAC-CHAP configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostDhchap {
    /// The host's secret (`nvme connect --dhchap-secret`).
    pub host_key: DhchapKey,
    /// The controller's secret (`--dhchap-ctrl-secret`): ask the controller to prove itself.
    pub ctrl_key: Option<DhchapKey>,
    /// Hashes offered, in order.
    pub hashes: Vec<HashId>,
    /// DH groups offered, in order.
    pub dh_groups: Vec<DhGroup>,
    /// Secure channel concatenation (`nvme connect --concat`, TP 8018): the admin queue's
    /// exchange generates a PSK, and the controller's queues are then opened over TLS with
    /// it ([`crate::Controller::connect_with`]).
    pub concat: bool,
}

impl HostDhchap {
    /// Offer every hash and group, as the Linux host does.
    pub fn new(host_key: DhchapKey, ctrl_key: Option<DhchapKey>) -> Self {
        Self {
            host_key,
            ctrl_key,
            hashes: HashId::ALL.to_vec(),
            dh_groups: DhGroup::ALL.to_vec(),
            concat: false,
        }
    }
}

/// What an authentication agreed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuthInfo {
    /// The hash the controller chose.
    pub hash: HashId,
    /// The DH group it chose.
    pub dh: DhGroup,
    /// The controller proved itself.
    pub bidirectional: bool,
}

/// What one exchange asked and produced beyond [`AuthInfo`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ExchangeOpts {
    /// SC_C of the Negotiate ([`sc_c`]).
    pub sc_c: u8,
    /// Send C2 with S2 = 0 (the controller need not prove itself), as the Linux host does
    /// with concatenation.
    pub c2_only: bool,
}

/// CDW10 of Authentication Send / Receive: SECP E9h, SPSP1 01h, SPSP0 01h.
pub fn auth_cdw10() -> u32 {
    (u32::from(SECP) << 24) | (u32::from(SPSP) << 16) | (u32::from(SPSP) << 8)
}

impl HostQueue {
    /// Authentication Send of `msg` (in-capsule); the completion's status is returned.
    pub fn auth_send(&mut self, msg: &[u8]) -> Result<super::Completion, HostError> {
        let mut s = sqe::fabrics_cmd(pollux_nvme::spec::opcode::fctype::AUTHENTICATION_SEND);
        s.cdw10.set(auth_cdw10());
        s.cdw11.set(msg.len() as u32);
        self.exec_in_capsule(s, msg.to_vec())
    }

    /// Authentication Receive of `al` bytes.
    pub fn auth_receive(&mut self, al: u32) -> Result<Vec<u8>, HostError> {
        let mut s = sqe::fabrics_cmd(pollux_nvme::spec::opcode::fctype::AUTHENTICATION_RECEIVE);
        s.cdw10.set(auth_cdw10());
        s.cdw11.set(al);
        Ok(self.exec_ok(s, Data::FromCtrl(vec![0; al as usize]))?.buf)
    }

    /// Run DH-HMAC-CHAP on this queue with transaction id `t_id` and sequence number `s2`
    /// for the controller's response.
    pub fn authenticate(&mut self, cfg: &HostDhchap, t_id: u16, s2: u32) -> Result<AuthInfo, HostError> {
        self.exchange(cfg, t_id, s2, ExchangeOpts::default())
            .map(|(info, _)| info)
    }

    /// Run DH-HMAC-CHAP as `x` says; with SC_C set, the PSK the exchange generated comes
    /// back too (HMAC(KS, C1 || C2), TP 8018).
    pub fn exchange(
        &mut self,
        cfg: &HostDhchap,
        t_id: u16,
        s2: u32,
        x: ExchangeOpts,
    ) -> Result<(AuthInfo, Option<GeneratedPsk>), HostError> {
        let (hostnqn, subnqn) = (self.opts().hostnqn.clone(), self.opts().subnqn.clone());
        let fail = |why: String| HostError::Auth(why);
        let sent = self.auth_send(
            &Message::Negotiate(Negotiate {
                t_id,
                sc_c: x.sc_c,
                hashes: cfg.hashes.iter().map(|h| h.id()).collect(),
                dh_groups: cfg.dh_groups.iter().map(|g| g.id()).collect(),
            })
            .encode(),
        )?;
        if !sent.status.is_success() {
            return Err(fail(format!(
                "Negotiate: {}",
                sent.status.in_context(StatusContext::Fabrics)
            )));
        }
        let ch = match Message::parse(&self.auth_receive(RECEIVE_LEN)?) {
            Ok(Message::Challenge(c)) if c.t_id == t_id => c,
            Ok(Message::Failure { explanation, .. }) => return Err(fail(failure_text("Challenge", explanation))),
            other => return Err(fail(format!("expected a Challenge, got {other:?}"))),
        };
        let private = match ch.dh {
            DhGroup::Null => None,
            g => Some(DhPrivate::generate(g).map_err(|e| fail(e.to_string()))?),
        };
        let shared = match &private {
            None => None,
            Some(p) => Some(
                p.shared(&ch.dhv)
                    .map_err(|e| fail(format!("the controller's DH value: {e}")))?,
            ),
        };
        let dhv = match &private {
            None => Vec::new(),
            Some(p) => p.public().map_err(|e| fail(e.to_string()))?,
        };
        // R1 hashes the negotiated SC_C (as Linux 6.18+ does).
        let tx = Transaction {
            hash: ch.hash,
            t_id,
            sc_c: x.sc_c,
            hostnqn: &hostnqn,
            subnqn: &subnqn,
        };
        let ca1 = auth::augmented_challenge(ch.hash, &ch.c, shared.as_deref().map(Vec::as_slice));
        let r1 = tx.host_response(&cfg.host_key.transform(&hostnqn), &ca1, ch.seq);
        let mut c2 = vec![0u8; ch.hash.output_len()];
        let bidirectional = cfg.ctrl_key.is_some() && !x.c2_only;
        let cvalid = bidirectional || x.c2_only;
        if cvalid && !auth::random(&mut c2) {
            return Err(fail("no random source".into()));
        }
        let sent = self.auth_send(
            &Message::Reply(Reply {
                t_id,
                r: r1.to_vec(),
                cvalid,
                seq: if bidirectional { s2.max(1) } else { 0 },
                c2: c2.clone(),
                dhv,
            })
            .encode(),
        )?;
        if !sent.status.is_success() {
            return Err(fail(format!(
                "Reply: {}",
                sent.status.in_context(StatusContext::Fabrics)
            )));
        }
        let r2 = match Message::parse(&self.auth_receive(RECEIVE_LEN)?) {
            Ok(Message::Success1 { t_id: got, r2, .. }) if got == t_id => r2,
            Ok(Message::Failure { explanation, .. }) => return Err(fail(failure_text("Success1", explanation))),
            other => return Err(fail(format!("expected Success1, got {other:?}"))),
        };
        if let Some(ck) = cfg.ctrl_key.as_ref().filter(|_| bidirectional) {
            let ca2 = auth::augmented_challenge(ch.hash, &c2, shared.as_deref().map(Vec::as_slice));
            let want = tx.ctrl_response(&ck.transform(&subnqn), &ca2, s2.max(1));
            let ok = r2.as_deref().is_some_and(|r| auth::responses_equal(r, &want));
            let end = if ok {
                Message::Success2 { t_id }
            } else {
                Message::Failure {
                    t_id,
                    from_host: true,
                    explanation: Reason::Failed as u8,
                }
            };
            self.auth_send(&end.encode())?;
            if !ok {
                return Err(fail("the controller's response does not match its key".into()));
            }
        }
        let generated = if x.sc_c == sc_c::NONE {
            None
        } else {
            let z = shared
                .as_deref()
                .ok_or_else(|| fail("concatenation with the null DH group".into()))?;
            Some(
                GeneratedPsk::generate(ch.hash, z, &ch.c, &c2)
                    .ok_or_else(|| fail(format!("no PSK generated with {}", ch.hash)))?,
            )
        };
        Ok((
            AuthInfo {
                hash: ch.hash,
                dh: ch.dh,
                bidirectional,
            },
            generated,
        ))
    }
}

fn failure_text(step: &str, explanation: u8) -> String {
    let why = Reason::from_code(explanation).map_or("unknown reason", Reason::describe);
    format!("AUTH_Failure1 instead of {step}: {why}")
}
