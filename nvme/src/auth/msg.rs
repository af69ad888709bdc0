//! The DH-HMAC-CHAP messages of Authentication Send and Receive (NVMe 2.0 §8.13.5.4 -
//! §8.13.5.7, Figures 562-568): parsed and written by both ends. Each starts with AUTH_TYPE
//! (00h common, 01h DH-HMAC-CHAP), AUTH_ID and the transaction identifier T_ID at byte 4.
//! A message that does not parse yields the failure reason the receiver answers with.

use super::{DhGroup, HashId};

/// AUTH_TYPE: common messages (Negotiate, failures).
pub const TYPE_COMMON: u8 = 0x00;
/// AUTH_TYPE: DH-HMAC-CHAP messages.
pub const TYPE_DHCHAP: u8 = 0x01;

/// AUTH_ID values.
pub mod id {
    /// AUTH_Negotiate (host).
    pub const NEGOTIATE: u8 = 0x00;
    /// DH-HMAC-CHAP_Challenge (controller).
    pub const CHALLENGE: u8 = 0x01;
    /// DH-HMAC-CHAP_Reply (host).
    pub const REPLY: u8 = 0x02;
    /// DH-HMAC-CHAP_Success1 (controller).
    pub const SUCCESS1: u8 = 0x03;
    /// DH-HMAC-CHAP_Success2 (host).
    pub const SUCCESS2: u8 = 0x04;
    /// AUTH_Failure2 (host).
    pub const FAILURE2: u8 = 0xF0;
    /// AUTH_Failure1 (controller).
    pub const FAILURE1: u8 = 0xF1;
}

/// Reason code explanations of AUTH_Failure1/2 (NVMe 2.0 §8.13.5.7, Figure 568).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// Authentication failed (a wrong response).
    Failed = 0x01,
    /// Authentication protocol not usable.
    ProtocolUnusable = 0x02,
    /// Secure channel concatenation mismatch.
    ConcatMismatch = 0x03,
    /// No hash function in common.
    HashUnusable = 0x04,
    /// No DH group in common.
    DhGroupUnusable = 0x05,
    /// A malformed message.
    IncorrectPayload = 0x06,
    /// A message out of order.
    IncorrectMessage = 0x07,
}

impl Reason {
    /// The reason with explanation code `v`.
    pub fn from_code(v: u8) -> Option<Self> {
        use Reason::*;
        [
            Failed,
            ProtocolUnusable,
            ConcatMismatch,
            HashUnusable,
            DhGroupUnusable,
            IncorrectPayload,
            IncorrectMessage,
        ]
        .into_iter()
        .find(|r| *r as u8 == v)
    }

    /// What it means, for logs.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Failed => "authentication failed",
            Self::ProtocolUnusable => "authentication protocol not usable",
            Self::ConcatMismatch => "secure channel concatenation mismatch",
            Self::HashUnusable => "no hash function in common",
            Self::DhGroupUnusable => "no DH group in common",
            Self::IncorrectPayload => "malformed message",
            Self::IncorrectMessage => "message out of order",
        }
    }
}

/// The failure reason code (REASON CODE 01h: "authentication failure").
const RESCODE: u8 = 0x01;
/// The DH-HMAC-CHAP protocol identifier in a Negotiate descriptor.
const AUTHID_DHCHAP: u8 = 0x01;
/// Bytes of one Negotiate protocol descriptor.
const DESCRIPTOR: usize = 64;

/// AUTH_Negotiate (NVMe 2.0 §8.13.5.4): what the host offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiate {
    /// Transaction identifier.
    pub t_id: u16,
    /// Secure channel concatenation requested (0: none).
    pub sc_c: u8,
    /// Hash identifiers offered, in the host's order.
    pub hashes: Vec<u8>,
    /// DH group identifiers offered.
    pub dh_groups: Vec<u8>,
}

/// DH-HMAC-CHAP_Challenge (NVMe 2.0 §8.13.5.5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Challenge {
    /// Transaction identifier.
    pub t_id: u16,
    /// The hash chosen.
    pub hash: HashId,
    /// The DH group chosen.
    pub dh: DhGroup,
    /// Sequence number S1.
    pub seq: u32,
    /// Challenge C1 (hash length).
    pub c: Vec<u8>,
    /// The controller's DH public value (empty for the null group).
    pub dhv: Vec<u8>,
}

/// DH-HMAC-CHAP_Reply (NVMe 2.0 §8.13.5.6).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// Transaction identifier.
    pub t_id: u16,
    /// Response R1 (HL bytes).
    pub r: Vec<u8>,
    /// The host asks the controller to authenticate itself (bidirectional).
    pub cvalid: bool,
    /// Sequence number S2 (0: no controller authentication).
    pub seq: u32,
    /// Challenge C2 (HL bytes; meaningful with `cvalid`).
    pub c2: Vec<u8>,
    /// The host's DH public value.
    pub dhv: Vec<u8>,
}

/// Any message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// AUTH_Negotiate.
    Negotiate(Negotiate),
    /// DH-HMAC-CHAP_Challenge.
    Challenge(Challenge),
    /// DH-HMAC-CHAP_Reply.
    Reply(Reply),
    /// DH-HMAC-CHAP_Success1 with R2 when the host asked for it.
    Success1 {
        /// Transaction identifier.
        t_id: u16,
        /// The hash length HL (always set: the Linux host checks it).
        hl: u8,
        /// Response R2.
        r2: Option<Vec<u8>>,
    },
    /// DH-HMAC-CHAP_Success2.
    Success2 {
        /// Transaction identifier.
        t_id: u16,
    },
    /// AUTH_Failure1 (from the controller) or AUTH_Failure2 (from the host).
    Failure {
        /// Transaction identifier.
        t_id: u16,
        /// From the host (Failure2) or the controller (Failure1).
        from_host: bool,
        /// Reason code explanation (raw: a peer may send any).
        explanation: u8,
    },
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn header(t: u8, id: u8, t_id: u16, len: usize) -> Vec<u8> {
    let mut m = vec![0u8; len];
    m[0] = t;
    m[1] = id;
    m[4..6].copy_from_slice(&t_id.to_le_bytes());
    m
}

impl Message {
    /// Parse a message. Trailing bytes beyond the message are ignored (a receive buffer is
    /// zero-padded); anything short, inconsistent or unknown is [`Reason::IncorrectPayload`].
    pub fn parse(b: &[u8]) -> Result<Self, Reason> {
        use Reason::IncorrectPayload as Bad;
        if b.len() < 8 {
            return Err(Bad);
        }
        let t_id = le16(b, 4);
        let hl_of = |v: u8| -> Result<usize, Reason> {
            HashId::ALL
                .iter()
                .map(|h| h.output_len())
                .find(|&l| l == usize::from(v))
                .ok_or(Bad)
        };
        Ok(match (b[0], b[1]) {
            (TYPE_COMMON, id::NEGOTIATE) => {
                let (sc_c, napd) = (b[6], usize::from(b[7]));
                if napd == 0 || b.len() < 8 + napd * DESCRIPTOR {
                    return Err(Bad);
                }
                // The DH-HMAC-CHAP descriptor; other protocols are not ours.
                let Some(d) = b[8..8 + napd * DESCRIPTOR]
                    .chunks_exact(DESCRIPTOR)
                    .find(|d| d[0] == AUTHID_DHCHAP)
                else {
                    return Err(Reason::ProtocolUnusable);
                };
                let (halen, dhlen) = (usize::from(d[2]), usize::from(d[3]));
                if halen > 30 || dhlen > 30 {
                    return Err(Bad);
                }
                Message::Negotiate(Negotiate {
                    t_id,
                    sc_c,
                    hashes: d[4..4 + halen].to_vec(),
                    dh_groups: d[34..34 + dhlen].to_vec(),
                })
            }
            (TYPE_DHCHAP, id::CHALLENGE) => {
                if b.len() < 16 {
                    return Err(Bad);
                }
                let hl = hl_of(b[6])?;
                let hash = HashId::from_id(b[8]).ok_or(Bad)?;
                let dh = DhGroup::from_id(b[9]).ok_or(Bad)?;
                let dhvlen = usize::from(le16(b, 10));
                if hl != hash.output_len() || dhvlen != dh.value_len() || b.len() < 16 + hl + dhvlen {
                    return Err(Bad);
                }
                Message::Challenge(Challenge {
                    t_id,
                    hash,
                    dh,
                    seq: le32(b, 12),
                    c: b[16..16 + hl].to_vec(),
                    dhv: b[16 + hl..16 + hl + dhvlen].to_vec(),
                })
            }
            (TYPE_DHCHAP, id::REPLY) => {
                if b.len() < 16 {
                    return Err(Bad);
                }
                let hl = hl_of(b[6])?;
                let dhvlen = usize::from(le16(b, 10));
                if b.len() < 16 + 2 * hl + dhvlen || b[8] > 1 {
                    return Err(Bad);
                }
                Message::Reply(Reply {
                    t_id,
                    cvalid: b[8] == 1,
                    seq: le32(b, 12),
                    r: b[16..16 + hl].to_vec(),
                    c2: b[16 + hl..16 + 2 * hl].to_vec(),
                    dhv: b[16 + 2 * hl..16 + 2 * hl + dhvlen].to_vec(),
                })
            }
            (TYPE_DHCHAP, id::SUCCESS1) => {
                if b.len() < 16 {
                    return Err(Bad);
                }
                let hl = hl_of(b[6])?;
                let r2 = match b[8] {
                    0 => None,
                    1 if b.len() >= 16 + hl => Some(b[16..16 + hl].to_vec()),
                    _ => return Err(Bad),
                };
                Message::Success1 { t_id, hl: b[6], r2 }
            }
            (TYPE_DHCHAP, id::SUCCESS2) => Message::Success2 { t_id },
            (TYPE_COMMON | TYPE_DHCHAP, f @ (id::FAILURE1 | id::FAILURE2)) => Message::Failure {
                t_id,
                from_host: f == id::FAILURE2,
                explanation: b[7],
            },
            _ => return Err(Reason::IncorrectMessage),
        })
    }

    /// The message's bytes.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Message::Negotiate(n) => {
                let mut m = header(TYPE_COMMON, id::NEGOTIATE, n.t_id, 8 + DESCRIPTOR);
                m[6] = n.sc_c;
                m[7] = 1;
                let (h, d) = (
                    &n.hashes[..n.hashes.len().min(30)],
                    &n.dh_groups[..n.dh_groups.len().min(30)],
                );
                m[8] = AUTHID_DHCHAP;
                m[10] = h.len() as u8;
                m[11] = d.len() as u8;
                m[12..12 + h.len()].copy_from_slice(h);
                m[42..42 + d.len()].copy_from_slice(d);
                m
            }
            Message::Challenge(c) => {
                let hl = c.c.len();
                let mut m = header(TYPE_DHCHAP, id::CHALLENGE, c.t_id, 16 + hl + c.dhv.len());
                m[6] = hl as u8;
                m[8] = c.hash.id();
                m[9] = c.dh.id();
                m[10..12].copy_from_slice(&(c.dhv.len() as u16).to_le_bytes());
                m[12..16].copy_from_slice(&c.seq.to_le_bytes());
                m[16..16 + hl].copy_from_slice(&c.c);
                m[16 + hl..].copy_from_slice(&c.dhv);
                m
            }
            Message::Reply(r) => {
                let hl = r.r.len();
                let mut m = header(TYPE_DHCHAP, id::REPLY, r.t_id, 16 + 2 * hl + r.dhv.len());
                m[6] = hl as u8;
                m[8] = u8::from(r.cvalid);
                m[10..12].copy_from_slice(&(r.dhv.len() as u16).to_le_bytes());
                m[12..16].copy_from_slice(&r.seq.to_le_bytes());
                m[16..16 + hl].copy_from_slice(&r.r);
                let c2 = &r.c2[..r.c2.len().min(hl)];
                m[16 + hl..16 + hl + c2.len()].copy_from_slice(c2);
                m[16 + 2 * hl..].copy_from_slice(&r.dhv);
                m
            }
            Message::Success1 { t_id, hl, r2 } => {
                let mut m = header(TYPE_DHCHAP, id::SUCCESS1, *t_id, 16 + r2.as_ref().map_or(0, Vec::len));
                m[6] = *hl;
                if let Some(r2) = r2 {
                    m[8] = 1;
                    m[16..].copy_from_slice(r2);
                }
                m
            }
            Message::Success2 { t_id } => header(TYPE_DHCHAP, id::SUCCESS2, *t_id, 16),
            Message::Failure {
                t_id,
                from_host,
                explanation,
            } => {
                let f = if *from_host { id::FAILURE2 } else { id::FAILURE1 };
                let mut m = header(TYPE_COMMON, f, *t_id, 8);
                m[6] = RESCODE;
                m[7] = *explanation;
                m
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn every_message_round_trips() {
        let msgs = [
            Message::Negotiate(Negotiate {
                t_id: 3,
                sc_c: 0,
                hashes: vec![1, 2, 3],
                dh_groups: vec![0, 1, 2, 3, 4, 5],
            }),
            Message::Challenge(Challenge {
                t_id: 3,
                hash: HashId::Sha384,
                dh: DhGroup::Ffdhe2048,
                seq: 77,
                c: vec![9; 48],
                dhv: vec![5; 256],
            }),
            Message::Reply(Reply {
                t_id: 3,
                r: vec![1; 32],
                cvalid: true,
                seq: 8,
                c2: vec![2; 32],
                dhv: vec![],
            }),
            Message::Success1 {
                t_id: 3,
                hl: 64,
                r2: Some(vec![4; 64]),
            },
            Message::Success1 {
                t_id: 3,
                hl: 32,
                r2: None,
            },
            Message::Success2 { t_id: 3 },
            Message::Failure {
                t_id: 3,
                from_host: false,
                explanation: Reason::Failed as u8,
            },
            Message::Failure {
                t_id: 3,
                from_host: true,
                explanation: Reason::HashUnusable as u8,
            },
        ];
        for m in msgs {
            let mut b = m.encode();
            assert_eq!(Message::parse(&b), Ok(m.clone()));
            // Zero padding after it (a receive buffer) changes nothing.
            b.resize(b.len() + 100, 0);
            assert_eq!(Message::parse(&b), Ok(m.clone()));
        }
    }

    #[test]
    fn layouts_match_the_spec_figures() {
        let c = Message::Challenge(Challenge {
            t_id: 0x0102,
            hash: HashId::Sha256,
            dh: DhGroup::Null,
            seq: 0x0A0B0C0D,
            c: vec![0xCC; 32],
            dhv: vec![],
        })
        .encode();
        // AUTH_TYPE, AUTH_ID, rsvd, T_ID, HL, rsvd, HASHID, DHGID, DHVLEN, SEQNUM, C1.
        assert_eq!(&c[..16], &[1, 1, 0, 0, 2, 1, 32, 0, 1, 0, 0, 0, 0x0D, 0x0C, 0x0B, 0x0A]);
        assert_eq!(c.len(), 48);
        let f = Message::Failure {
            t_id: 9,
            from_host: false,
            explanation: 1,
        }
        .encode();
        assert_eq!(f, [0, 0xF1, 0, 0, 9, 0, 1, 1]);
    }

    #[test]
    fn malformed_messages_give_their_reason() {
        use Reason::*;
        assert_eq!(Message::parse(&[]), Err(IncorrectPayload));
        assert_eq!(
            Message::parse(&[0, 0, 0, 0, 0, 0, 0, 0]),
            Err(IncorrectPayload),
            "napd 0"
        );
        assert_eq!(Message::parse(&[7, 7, 0, 0, 0, 0, 0, 0]), Err(IncorrectMessage));
        // A Negotiate whose only descriptor is not DH-HMAC-CHAP.
        let mut n = vec![0u8; 72];
        n[7] = 1;
        n[8] = 9;
        assert_eq!(Message::parse(&n), Err(ProtocolUnusable));
        // halen beyond its 30-byte list.
        n[8] = 1;
        n[10] = 31;
        assert_eq!(Message::parse(&n), Err(IncorrectPayload));
        // A Reply shorter than its HL and DHVLEN say, and one with HL 33.
        let mut r = Message::Reply(Reply {
            t_id: 1,
            r: vec![1; 32],
            cvalid: false,
            seq: 0,
            c2: vec![0; 32],
            dhv: vec![7; 256],
        })
        .encode();
        assert_eq!(Message::parse(&r[..r.len() - 1]), Err(IncorrectPayload));
        r[6] = 33;
        assert_eq!(Message::parse(&r), Err(IncorrectPayload));
        // DHVLEN 65535 with no value behind it.
        r[6] = 32;
        r[10] = 0xFF;
        r[11] = 0xFF;
        assert_eq!(Message::parse(&r), Err(IncorrectPayload));
    }
}
