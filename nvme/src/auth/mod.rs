//! DH-HMAC-CHAP in-band authentication (NVMe 2.0 §8.13.5, TP 8006): the secret
//! representation `nvme gen-dhchap-key` writes, the hash functions and Diffie-Hellman groups,
//! the key transformation and the responses both sides compute, and the messages carried by
//! Authentication Send and Receive ([`msg`]). Both ends use it: the target's controller and
//! the host library.
//!
//! All crypto comes from well-kept crates: `hmac` and `sha2` for the hashes, `crypto-bigint`
//! for the constant-time modular exponentiation of the FFDHE groups, `getrandom` for
//! challenges and private values, `zeroize` for every secret's memory.

mod dh;
mod ffdhe_primes;
mod key;
pub mod msg;

pub use dh::{DhError, DhGroup, DhPrivate};
pub use key::{DhchapKey, KeyError};

use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256, Sha384, Sha512};
use zeroize::Zeroizing;

/// The Authentication Send / Receive security protocol for NVMe in-band authentication
/// (SECP E9h, SPSP0 01h, SPSP1 01h: NVMe 2.0 §8.13.5.2, NVMe-oF 1.1 §6.1).
pub const SECP: u8 = 0xE9;
/// SPSP0 and SPSP1 of DH-HMAC-CHAP.
pub const SPSP: u8 = 0x01;

/// SC_C, the secure channel concatenation field of AUTH_Negotiate (NVMe 2.0 §8.13.5.4 as
/// TP 8018 amends it); also the byte the responses R1 and R2 hash after T_ID. Value 01h
/// (NVMe 2.0's "secure channel") is obsolete.
pub mod sc_c {
    /// No concatenation.
    pub const NONE: u8 = 0x00;
    /// Generate a PSK, then secure the queues with TLS: on a queue without TLS.
    pub const NEW_TLS_PSK: u8 = 0x02;
    /// Generate a PSK replacing the one that secures this TLS queue.
    pub const REPLACE_TLS_PSK: u8 = 0x03;
}

/// A hash function of DH-HMAC-CHAP (NVMe 2.0 §8.13.5.1, Figure 560: identifiers 1..3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HashId {
    /// SHA-256 (01h).
    Sha256,
    /// SHA-384 (02h).
    Sha384,
    /// SHA-512 (03h).
    Sha512,
}

impl HashId {
    /// Every hash, in identifier order.
    pub const ALL: [HashId; 3] = [HashId::Sha256, HashId::Sha384, HashId::Sha512];

    /// The hash with identifier `id`.
    pub fn from_id(id: u8) -> Option<Self> {
        match id {
            1 => Some(Self::Sha256),
            2 => Some(Self::Sha384),
            3 => Some(Self::Sha512),
            _ => None,
        }
    }

    /// Its identifier.
    pub fn id(self) -> u8 {
        match self {
            Self::Sha256 => 1,
            Self::Sha384 => 2,
            Self::Sha512 => 3,
        }
    }

    /// Its output length, bytes (the challenge and response length HL).
    pub fn output_len(self) -> usize {
        match self {
            Self::Sha256 => 32,
            Self::Sha384 => 48,
            Self::Sha512 => 64,
        }
    }

    /// Its configuration spelling: `sha256`, `sha384`, `sha512`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Sha256 => "sha256",
            Self::Sha384 => "sha384",
            Self::Sha512 => "sha512",
        }
    }

    /// The hash spelled `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|h| h.name() == name)
    }

    /// H(data).
    pub fn digest(self, data: &[u8]) -> Zeroizing<Vec<u8>> {
        Zeroizing::new(match self {
            Self::Sha256 => Sha256::digest(data).to_vec(),
            Self::Sha384 => Sha384::digest(data).to_vec(),
            Self::Sha512 => Sha512::digest(data).to_vec(),
        })
    }

    /// HMAC_H(key, parts[0] || parts[1] || ...).
    pub fn hmac(self, key: &[u8], parts: &[&[u8]]) -> Zeroizing<Vec<u8>> {
        fn run<M: Mac + KeyInit>(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
            // HMAC takes a key of any length (RFC 2104 §2): this cannot fail.
            let Ok(mut m) = <M as KeyInit>::new_from_slice(key) else {
                return Vec::new();
            };
            for p in parts {
                m.update(p);
            }
            m.finalize().into_bytes().to_vec()
        }
        Zeroizing::new(match self {
            Self::Sha256 => run::<Hmac<Sha256>>(key, parts),
            Self::Sha384 => run::<Hmac<Sha384>>(key, parts),
            Self::Sha512 => run::<Hmac<Sha512>>(key, parts),
        })
    }
}

impl std::fmt::Display for HashId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The challenge a response is computed over: with a DH group, the augmented challenge
/// Ca = HMAC_H(H(Z), C) of the shared secret Z (NVMe 2.0 §8.13.5.3); without, C itself.
pub fn augmented_challenge(hash: HashId, challenge: &[u8], shared: Option<&[u8]>) -> Zeroizing<Vec<u8>> {
    match shared {
        Some(z) => hash.hmac(&hash.digest(z), &[challenge]),
        None => Zeroizing::new(challenge.to_vec()),
    }
}

/// What both responses are computed over besides the key and the challenge.
#[derive(Debug, Clone, Copy)]
pub struct Transaction<'a> {
    /// The hash negotiated.
    pub hash: HashId,
    /// Transaction identifier of the exchange.
    pub t_id: u16,
    /// Secure channel concatenation (SC_C) of the Negotiate message.
    pub sc_c: u8,
    /// Host NQN.
    pub hostnqn: &'a str,
    /// Subsystem NQN.
    pub subnqn: &'a str,
}

impl Transaction<'_> {
    /// The host's response R1 = HMAC_H(Kh', Ca1 || S1 || T_ID || SC_C || "HostHost" ||
    /// hostnqn || 00h || subnqn) to challenge `ca` with sequence number `seq` (NVMe 2.0
    /// §8.13.5.3; little-endian integers). `key` is the host key transformed with the host NQN.
    pub fn host_response(&self, key: &[u8], ca: &[u8], seq: u32) -> Zeroizing<Vec<u8>> {
        self.response(key, ca, seq, b"HostHost", self.hostnqn, self.subnqn)
    }

    /// The controller's response R2 = HMAC_H(Kc', Ca2 || S2 || T_ID || SC_C || "Controller" ||
    /// subnqn || 00h || hostnqn) to the host's challenge `ca` (augmented) with its sequence
    /// number `seq`. `key` is the controller key transformed with the subsystem NQN.
    pub fn ctrl_response(&self, key: &[u8], ca: &[u8], seq: u32) -> Zeroizing<Vec<u8>> {
        self.response(key, ca, seq, b"Controller", self.subnqn, self.hostnqn)
    }

    fn response(&self, key: &[u8], ca: &[u8], seq: u32, who: &[u8], a: &str, b: &str) -> Zeroizing<Vec<u8>> {
        self.hash.hmac(
            key,
            &[
                ca,
                &seq.to_le_bytes(),
                &self.t_id.to_le_bytes(),
                &[self.sc_c],
                who,
                a.as_bytes(),
                &[0],
                b.as_bytes(),
            ],
        )
    }
}

/// Fill `buf` from the operating system's random source (challenges, private values,
/// sequence number starts). False when there is none, which callers treat as an internal
/// error: a predictable challenge would be worse than none.
pub fn random(buf: &mut [u8]) -> bool {
    getrandom::fill(buf).is_ok()
}

/// Constant-time equality of two responses.
pub fn responses_equal(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    a.len() == b.len() && bool::from(a.ct_eq(b))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn hmac_matches_rfc_4231_test_case_2() {
        // RFC 4231 §4.3: key "Jefe", data "what do ya want for nothing?".
        let h = HashId::Sha256.hmac(b"Jefe", &[b"what do ya want ", b"for nothing?"]);
        let hex: String = h.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
        assert_eq!(HashId::Sha384.hmac(b"Jefe", &[b"x"]).len(), 48);
        assert_eq!(HashId::Sha512.digest(b"").len(), 64);
    }

    #[test]
    fn responses_differ_by_role_sequence_and_transaction() {
        let t = Transaction {
            hash: HashId::Sha256,
            t_id: 7,
            sc_c: 0,
            hostnqn: "nqn.host",
            subnqn: "nqn.sub",
        };
        let (k, c) = ([1u8; 32], [2u8; 32]);
        let r1 = t.host_response(&k, &c, 5);
        assert_eq!(r1.len(), 32);
        assert_ne!(*r1, *t.ctrl_response(&k, &c, 5));
        assert_ne!(*r1, *t.host_response(&k, &c, 6));
        assert_ne!(*r1, *Transaction { t_id: 8, ..t }.host_response(&k, &c, 5));
        assert!(responses_equal(&r1, &t.host_response(&k, &c, 5)));
        assert!(!responses_equal(&r1, &r1[..31]));
        // The augmented challenge depends on the shared secret.
        let a = augmented_challenge(HashId::Sha256, &c, Some(b"z1"));
        assert_ne!(*a, *augmented_challenge(HashId::Sha256, &c, Some(b"z2")));
        assert_eq!(*augmented_challenge(HashId::Sha256, &c, None), c.to_vec());
    }
}
