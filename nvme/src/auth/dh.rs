//! The Diffie-Hellman exchange of DH-HMAC-CHAP (NVMe 2.0 §8.13.5.1): groups by identifier,
//! ephemeral private values, public values and the shared secret, big-endian and padded to
//! the prime's length as both ends exchange them.
//!
//! Exponentiation is `crypto-bigint`'s constant-time Montgomery ladder; the private exponent
//! has 512 bits, above twice the security strength RFC 7919 §5.2 asks of the largest group
//! (ffdhe8192: 200 bits), which keeps an 8192-bit exchange to milliseconds.

use std::sync::OnceLock;

use crypto_bigint::modular::{BoxedMontyForm, BoxedMontyParams};
use crypto_bigint::{BoxedUint, Odd};
use thiserror::Error;
use zeroize::{Zeroize, Zeroizing};

use super::ffdhe_primes::{FFDHE2048, FFDHE3072, FFDHE4096, FFDHE6144, FFDHE8192};

/// Bits of a private exponent.
const PRIVATE_BITS: u32 = 512;

/// A DH group of DH-HMAC-CHAP (NVMe 2.0 §8.13.5.1, Figure 561: identifiers 0..5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DhGroup {
    /// No Diffie-Hellman exchange (00h).
    Null,
    /// RFC 7919 ffdhe2048 (01h).
    Ffdhe2048,
    /// ffdhe3072 (02h).
    Ffdhe3072,
    /// ffdhe4096 (03h).
    Ffdhe4096,
    /// ffdhe6144 (04h).
    Ffdhe6144,
    /// ffdhe8192 (05h).
    Ffdhe8192,
}

/// A DH value refused.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum DhError {
    /// The null group has no exchange.
    #[error("the null DH group has no exchange")]
    NullGroup,
    /// A public value of the wrong length.
    #[error("a DH value of {got} bytes, {want} expected")]
    Length {
        /// Bytes received.
        got: usize,
        /// The prime's length.
        want: usize,
    },
    /// A public value outside 2..p-2 (RFC 7919 §5.1): it would force a known secret.
    #[error("a DH value outside 2..p-2")]
    Range,
    /// No random source.
    #[error("no random source for a private value")]
    Random,
}

impl DhGroup {
    /// Every group, in identifier order.
    pub const ALL: [DhGroup; 6] = [
        DhGroup::Null,
        DhGroup::Ffdhe2048,
        DhGroup::Ffdhe3072,
        DhGroup::Ffdhe4096,
        DhGroup::Ffdhe6144,
        DhGroup::Ffdhe8192,
    ];

    /// The group with identifier `id`.
    pub fn from_id(id: u8) -> Option<Self> {
        Self::ALL.get(usize::from(id)).copied()
    }

    /// Its identifier.
    pub fn id(self) -> u8 {
        Self::ALL.iter().position(|g| *g == self).unwrap_or(0) as u8
    }

    /// Its configuration spelling: `null`, `ffdhe2048` ... `ffdhe8192`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Null => "null",
            Self::Ffdhe2048 => "ffdhe2048",
            Self::Ffdhe3072 => "ffdhe3072",
            Self::Ffdhe4096 => "ffdhe4096",
            Self::Ffdhe6144 => "ffdhe6144",
            Self::Ffdhe8192 => "ffdhe8192",
        }
    }

    /// The group spelled `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|g| g.name() == name)
    }

    /// Bits of its prime (0: null).
    pub fn bits(self) -> u32 {
        match self {
            Self::Null => 0,
            Self::Ffdhe2048 => 2048,
            Self::Ffdhe3072 => 3072,
            Self::Ffdhe4096 => 4096,
            Self::Ffdhe6144 => 6144,
            Self::Ffdhe8192 => 8192,
        }
    }

    /// Bytes of a DH value (DHVLEN; 0: null).
    pub fn value_len(self) -> usize {
        self.bits() as usize / 8
    }

    fn prime_hex(self) -> &'static str {
        match self {
            Self::Null => "",
            Self::Ffdhe2048 => FFDHE2048,
            Self::Ffdhe3072 => FFDHE3072,
            Self::Ffdhe4096 => FFDHE4096,
            Self::Ffdhe6144 => FFDHE6144,
            Self::Ffdhe8192 => FFDHE8192,
        }
    }

    /// The prime, big-endian.
    pub fn prime(self) -> Vec<u8> {
        let h = self.prime_hex().as_bytes();
        h.chunks(2)
            .map(|c| {
                let d = |b: u8| (b as char).to_digit(16).unwrap_or(0) as u8;
                (d(c[0]) << 4) | d(c[1])
            })
            .collect()
    }

    /// Montgomery parameters of the prime, computed once per group.
    fn params(self) -> Option<&'static BoxedMontyParams> {
        static PARAMS: [OnceLock<Option<BoxedMontyParams>>; 6] = [const { OnceLock::new() }; 6];
        let bits = self.bits();
        if bits == 0 {
            return None;
        }
        PARAMS[usize::from(self.id())]
            .get_or_init(|| {
                let p = BoxedUint::from_be_slice(&self.prime(), bits).ok()?;
                let odd: Option<Odd<BoxedUint>> = Odd::new(p).into();
                // The prime is public: variable time is fine here.
                odd.map(BoxedMontyParams::new_vartime)
            })
            .as_ref()
    }
}

impl std::fmt::Display for DhGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// An ephemeral private value of one exchange; zeroed when dropped.
pub struct DhPrivate {
    group: DhGroup,
    x: BoxedUint,
}

impl std::fmt::Debug for DhPrivate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DhPrivate")
            .field("group", &self.group)
            .finish_non_exhaustive()
    }
}

impl Drop for DhPrivate {
    fn drop(&mut self) {
        self.x.zeroize();
    }
}

impl DhPrivate {
    /// A new random private value in `group`.
    pub fn generate(group: DhGroup) -> Result<Self, DhError> {
        if group == DhGroup::Null {
            return Err(DhError::NullGroup);
        }
        let mut bytes = Zeroizing::new([0u8; (PRIVATE_BITS / 8) as usize]);
        if !super::random(&mut bytes[..]) {
            return Err(DhError::Random);
        }
        // Never 0 or 1.
        bytes[0] |= 0x80;
        let x = BoxedUint::from_be_slice(&bytes[..], PRIVATE_BITS).map_err(|_| DhError::Random)?;
        Ok(Self { group, x })
    }

    /// Its group.
    pub fn group(&self) -> DhGroup {
        self.group
    }

    /// base^x mod p, big-endian, padded to the prime's length.
    fn pow(&self, base: BoxedUint) -> Result<Vec<u8>, DhError> {
        let params = self.group.params().ok_or(DhError::NullGroup)?;
        let r = BoxedMontyForm::new(base, params).pow(&self.x).retrieve();
        Ok(r.to_be_bytes().to_vec())
    }

    /// The public value g^x mod p (g = 2) to send.
    pub fn public(&self) -> Result<Vec<u8>, DhError> {
        self.pow(BoxedUint::from_be_slice(&[2], self.group.bits()).map_err(|_| DhError::Range)?)
    }

    /// The shared secret Z = y^x mod p of the peer's public value `y`; refused unless `y` has
    /// the prime's length and lies in 2..p-2.
    pub fn shared(&self, y: &[u8]) -> Result<Zeroizing<Vec<u8>>, DhError> {
        let want = self.group.value_len();
        if y.len() != want {
            return Err(DhError::Length { got: y.len(), want });
        }
        // 2 <= y <= p - 2, compared as big-endian byte strings of one length (public data).
        let mut p_minus_1 = self.group.prime();
        if let Some(last) = p_minus_1.last_mut() {
            *last = last.wrapping_sub(1); // p is odd: no borrow
        }
        let below_two = y[..want - 1].iter().all(|&b| b == 0) && y[want - 1] < 2;
        if below_two || y >= &p_minus_1[..] {
            return Err(DhError::Range);
        }
        let base = BoxedUint::from_be_slice(y, self.group.bits()).map_err(|_| DhError::Range)?;
        self.pow(base).map(Zeroizing::new)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn every_prime_has_the_shape_rfc_7919_gives() {
        // p = 2^b - 2^(b-64) + {[2^(b-130) e] + X} * 2^64 - 1: 64 one bits at each end, and
        // the bits of e between them, so every group starts with ffdhe2048's digits.
        let base = DhGroup::Ffdhe2048.prime_hex();
        for g in DhGroup::ALL.into_iter().skip(1) {
            let h = g.prime_hex();
            assert_eq!(h.len() * 4, g.bits() as usize, "{g}");
            assert!(
                h.starts_with("FFFFFFFFFFFFFFFF") && h.ends_with("FFFFFFFFFFFFFFFF"),
                "{g}"
            );
            assert_eq!(&h[16..400], &base[16..400], "{g}: the digits of e");
            assert_eq!(g.prime().len(), g.value_len());
            assert_eq!(DhGroup::from_name(g.name()), Some(g));
            assert_eq!(DhGroup::from_id(g.id()), Some(g));
        }
    }

    #[test]
    fn both_ends_derive_one_secret_and_bad_values_are_refused() {
        for g in [DhGroup::Ffdhe2048, DhGroup::Ffdhe3072] {
            let (a, b) = (DhPrivate::generate(g).unwrap(), DhPrivate::generate(g).unwrap());
            let (pa, pb) = (a.public().unwrap(), b.public().unwrap());
            assert_eq!(pa.len(), g.value_len());
            assert_ne!(pa, pb);
            let (za, zb) = (a.shared(&pb).unwrap(), b.shared(&pa).unwrap());
            assert_eq!(*za, *zb, "{g}");
            assert_eq!(za.len(), g.value_len());
            // Values that force a known secret, and wrong lengths.
            let n = g.value_len();
            let mut one = vec![0u8; n];
            one[n - 1] = 1;
            assert_eq!(a.shared(&one), Err(DhError::Range));
            assert_eq!(a.shared(&vec![0u8; n]), Err(DhError::Range));
            let mut pm1 = g.prime();
            pm1[n - 1] -= 1;
            assert_eq!(a.shared(&pm1), Err(DhError::Range));
            assert_eq!(a.shared(&g.prime()), Err(DhError::Range));
            assert_eq!(a.shared(&[0xFF; 3]), Err(DhError::Length { got: 3, want: n }));
            assert_eq!(
                a.shared(&vec![0x42; n + 1]).unwrap_err(),
                DhError::Length { got: n + 1, want: n }
            );
        }
        assert_eq!(DhPrivate::generate(DhGroup::Null).unwrap_err(), DhError::NullGroup);
    }

    #[test]
    fn known_powers_of_two() {
        let g = DhGroup::Ffdhe2048;
        let n = g.value_len();
        let with = |x: u64| {
            let mut b = [0u8; 64];
            b[56..].copy_from_slice(&x.to_be_bytes());
            DhPrivate {
                group: g,
                x: BoxedUint::from_be_slice(&b, PRIVATE_BITS).unwrap(),
            }
            .public()
            .unwrap()
        };
        // 2^10 = 1024 < p.
        let mut want = vec![0u8; n];
        want[n - 2] = 0x04;
        assert_eq!(with(10), want);
        // 2^2048 mod p = 2^2048 - p (p < 2^2048 < 2p): the two's complement of p.
        let p = g.prime();
        let mut neg: Vec<u8> = p.iter().map(|b| !b).collect();
        for b in neg.iter_mut().rev() {
            let (v, carry) = b.overflowing_add(1);
            *b = v;
            if !carry {
                break;
            }
        }
        assert_eq!(with(2048), neg);
    }
}
