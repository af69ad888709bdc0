//! NVMe/TCP TLS key material (NVMe/TCP 1.0 §3.6.1, TP 8011 and TP 8018): configured PSKs in
//! the `NVMeTLSkey-1:hh:<base64>:` interchange format that `nvme gen-tls-key` writes, the
//! retained PSK derived from one for a host, the PSK identity a host offers in its TLS 1.3
//! ClientHello (`NVMe<v>R<hh> <hostnqn> <subnqn>[ <digest>]`), and the TLS PSK itself. Pure:
//! the TLS record layer is the transport's.
//!
//! The derivations are HKDF (RFC 5869, the `hkdf` crate) with TLS 1.3's HKDF-Expand-Label
//! encoding (RFC 8446 §7.1: a big-endian length, then the label `tls13 <label>` and the
//! context, each after its length byte), as libnvme 1.16+, the Linux kernel and SPDK do.
//! libnvme before 1.16 (nvme-cli 2.15 and older: Debian 13's nvme-cli 2.13 with libnvme
//! 1.13, say) encoded that label wrongly, and a Linux host whose keys it inserted holds TLS
//! PSKs (and version 1 identities) that differ; [`PskDerivation::LibnvmeCompat`] derives
//! those, as newer nvme-cli's `--compat` does.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hkdf::Hkdf;
use sha2::{Sha256, Sha384};
use thiserror::Error;
use zeroize::Zeroizing;

use crate::auth::HashId;
use crate::interchange::{self, Bad};

const PREFIX: &str = "NVMeTLSkey-1:";

/// A PSK's representation refused (never carrying the key).
#[derive(Debug, Error, PartialEq, Eq)]
pub enum PskError {
    /// Not `NVMeTLSkey-1:hh:...:`.
    #[error("not a TLS PSK: expected NVMeTLSkey-1:hh:<base64>: (as nvme gen-tls-key writes)")]
    Format,
    /// hh is not 00, 01 or 02.
    #[error("unknown PSK hash {0:?}: 00 (none), 01 (SHA-256) or 02 (SHA-384)")]
    Hash(String),
    /// The base64 text does not decode.
    #[error("the PSK is not valid base64")]
    Base64,
    /// A PSK of the wrong length for its hash.
    #[error("a {0}-byte PSK: 32 (SHA-256) or 48 (SHA-384) bytes")]
    Length(usize),
    /// The CRC-32 does not match.
    #[error("the PSK's CRC-32 does not match (mistyped or truncated?)")]
    Crc,
}

/// How a host derived its retained and TLS PSKs from the configured PSK (the HKDF-Expand-Label
/// encoding of the `info` input; everything else is the same).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum PskDerivation {
    /// RFC 8446 §7.1's HkdfLabel: a big-endian 16-bit length, then `tls13 <label>` and the
    /// context, each after a length byte. libnvme 1.16+, the Linux kernel, SPDK.
    #[default]
    Rfc8446,
    /// libnvme before 1.16: the length in host (little-endian) byte order, then `tls13 `,
    /// the label and the context with no length bytes (libnvme's `derive_retained_key` and
    /// `derive_tls_key` before the fix; nvme-cli 2.16+ `--compat`).
    LibnvmeCompat,
}

impl PskDerivation {
    /// Its name in conf files: `rfc8446` or `libnvme-compat`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Rfc8446 => "rfc8446",
            Self::LibnvmeCompat => "libnvme-compat",
        }
    }

    /// The derivation named `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        [Self::Rfc8446, Self::LibnvmeCompat]
            .into_iter()
            .find(|d| d.name() == name)
    }

    /// The HKDF `info` for HKDF-Expand-Label(secret, label, context, len).
    fn info(self, label: &str, context: &[u8], len: usize) -> Option<Vec<u8>> {
        let len = u16::try_from(len).ok()?;
        let mut info = Vec::with_capacity(10 + label.len() + context.len());
        match self {
            Self::Rfc8446 => {
                let full = format!("tls13 {label}");
                info.extend_from_slice(&len.to_be_bytes());
                info.push(u8::try_from(full.len()).ok()?);
                info.extend_from_slice(full.as_bytes());
                info.push(u8::try_from(context.len()).ok()?);
            }
            Self::LibnvmeCompat => {
                info.extend_from_slice(&len.to_le_bytes());
                info.extend_from_slice(b"tls13 ");
                info.extend_from_slice(label.as_bytes());
            }
        }
        info.extend_from_slice(context);
        Some(info)
    }
}

/// The hash of a PSK and of the cipher suite it is used with (NVMe/TCP 1.0 §3.6.1.3):
/// TLS_AES_128_GCM_SHA256 (01) or TLS_AES_256_GCM_SHA384 (02).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PskHash {
    /// SHA-256, 32-byte PSKs.
    Sha256,
    /// SHA-384, 48-byte PSKs.
    Sha384,
}

impl PskHash {
    /// The identifier, 1 or 2.
    pub fn id(self) -> u8 {
        match self {
            Self::Sha256 => 1,
            Self::Sha384 => 2,
        }
    }

    /// Its output (and PSK) length.
    pub fn output_len(self) -> usize {
        match self {
            Self::Sha256 => 32,
            Self::Sha384 => 48,
        }
    }

    /// The hash of a PSK of `len` bytes.
    pub fn for_len(len: usize) -> Option<Self> {
        match len {
            32 => Some(Self::Sha256),
            48 => Some(Self::Sha384),
            _ => None,
        }
    }

    fn hmac(self) -> HashId {
        match self {
            Self::Sha256 => HashId::Sha256,
            Self::Sha384 => HashId::Sha384,
        }
    }

    /// HKDF-Expand-Label(HKDF-Extract(0, ikm), label, context, len), its label encoded as
    /// `how` says.
    fn expand_label(
        self,
        how: PskDerivation,
        ikm: &[u8],
        label: &str,
        context: &[u8],
        len: usize,
    ) -> Option<Zeroizing<Vec<u8>>> {
        let info = how.info(label, context, len)?;
        let mut out = Zeroizing::new(vec![0u8; len]);
        let ok = match self {
            Self::Sha256 => Hkdf::<Sha256>::new(None, ikm).expand(&info, &mut out).is_ok(),
            Self::Sha384 => Hkdf::<Sha384>::new(None, ikm).expand(&info, &mut out).is_ok(),
        };
        ok.then_some(out)
    }
}

/// A configured PSK (NVMe/TCP 1.0 §3.6.1.5): the key, the hash (hh) that derives the
/// retained PSK from it (None: the configured PSK is the retained PSK) and how the host
/// derives (its libnvme's HKDF label encoding). Zeroed when dropped; `Debug` shows no key.
#[derive(Clone, PartialEq, Eq)]
pub struct ConfiguredPsk {
    hash: Option<PskHash>,
    key: Zeroizing<Vec<u8>>,
    derivation: PskDerivation,
}

impl std::fmt::Debug for ConfiguredPsk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConfiguredPsk")
            .field("hash", &self.hash)
            .field("len", &self.key.len())
            .field("derivation", &self.derivation)
            .finish_non_exhaustive()
    }
}

/// The PSK identity and TLS PSK of one host and subsystem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsPsk {
    /// The identity the host offers (`NVMe1R01 <hostnqn> <subnqn> <digest>`).
    pub identity: String,
    /// The cipher suite's hash.
    pub hash: PskHash,
    /// The TLS 1.3 external PSK (a secret).
    pub psk: Zeroizing<Vec<u8>>,
}

impl ConfiguredPsk {
    /// Parse `NVMeTLSkey-1:hh:<base64>:` (surrounding whitespace allowed).
    pub fn parse(text: &str) -> Result<Self, PskError> {
        let (hh, b64) = interchange::split(text, PREFIX).ok_or(PskError::Format)?;
        let hash = match hh {
            "00" => None,
            "01" => Some(PskHash::Sha256),
            "02" => Some(PskHash::Sha384),
            other => return Err(PskError::Hash(other.to_string())),
        };
        let key = interchange::decode(b64, |len| {
            PskHash::for_len(len).is_some() && hash.is_none_or(|h| h.output_len() == len)
        })
        .map_err(|e| match e {
            Bad::Base64 => PskError::Base64,
            Bad::Length(len) => PskError::Length(len),
            Bad::Crc => PskError::Crc,
        })?;
        Ok(Self {
            hash,
            key,
            derivation: PskDerivation::default(),
        })
    }

    /// A configured PSK of `key` (32 or 48 bytes) with hash `hash`.
    pub fn new(hash: Option<PskHash>, key: &[u8]) -> Result<Self, PskError> {
        if PskHash::for_len(key.len()).is_none() || hash.is_some_and(|h| h.output_len() != key.len()) {
            return Err(PskError::Length(key.len()));
        }
        Ok(Self {
            hash,
            key: Zeroizing::new(key.to_vec()),
            derivation: PskDerivation::default(),
        })
    }

    /// The same key, derived from as `derivation` says.
    pub fn with_derivation(mut self, derivation: PskDerivation) -> Self {
        self.derivation = derivation;
        self
    }

    /// How the retained and TLS PSKs are derived from this key.
    pub fn derivation(&self) -> PskDerivation {
        self.derivation
    }

    /// The interchange representation (a secret: never log it).
    pub fn encode(&self) -> Zeroizing<String> {
        interchange::encode(PREFIX, self.hash.map_or(0, PskHash::id), &self.key)
    }

    /// The cipher suite hash this PSK is used with: its own, or by its length.
    pub fn cipher(&self) -> PskHash {
        self.hash
            .or(PskHash::for_len(self.key.len()))
            .unwrap_or(PskHash::Sha256)
    }

    /// The retained PSK for host `hostnqn` (TP 8018): HKDF-Expand-Label(HKDF-Extract(0,
    /// configured), "HostNQN", hostnqn, length), or the configured PSK itself with hash 00.
    pub fn retained(&self, hostnqn: &str) -> Option<Zeroizing<Vec<u8>>> {
        match self.hash {
            None => Some(self.key.clone()),
            Some(h) => h.expand_label(
                self.derivation,
                &self.key,
                "HostNQN",
                hostnqn.as_bytes(),
                self.key.len(),
            ),
        }
    }

    /// The identity (version 0, or 1 with its digest) and TLS PSK of `hostnqn` with `subnqn`
    /// (NVMe/TCP 1.0 §3.6.1.3): TLS PSK = HKDF-Expand-Label(HKDF-Extract(0, retained),
    /// "nvme-tls-psk", context, length), the context being the identity (version 0) or
    /// "<hh> <digest>" (version 1), digest = base64(HMAC(retained, hostnqn " " subnqn
    /// " NVMe-over-Fabrics")).
    pub fn tls_psk(&self, hostnqn: &str, subnqn: &str, version: u8) -> Option<TlsPsk> {
        let cipher = self.cipher();
        let retained = self.retained(hostnqn)?;
        let (identity, context) = match version {
            0 => {
                let id = format!("NVMe0R{:02} {hostnqn} {subnqn}", cipher.id());
                (id.clone(), id)
            }
            1 => {
                let mac = cipher.hmac().hmac(
                    &retained,
                    &[hostnqn.as_bytes(), b" ", subnqn.as_bytes(), b" NVMe-over-Fabrics"],
                );
                let digest = STANDARD.encode(&*mac);
                (
                    format!("NVMe1R{:02} {hostnqn} {subnqn} {digest}", cipher.id()),
                    format!("{:02} {digest}", cipher.id()),
                )
            }
            _ => return None,
        };
        let psk = cipher.expand_label(
            self.derivation,
            &retained,
            "nvme-tls-psk",
            context.as_bytes(),
            self.key.len(),
        )?;
        Some(TlsPsk {
            identity,
            hash: cipher,
            psk,
        })
    }
}

/// A PSK generated by secure channel concatenation (NVMe 2.0 §8.13.5.9 as TP 8018 adds it): after
/// DH-HMAC-CHAP with SC_C set, host and controller each compute HMAC(KS, C1 || C2) with the
/// exchange's hash, KS being the session key H(g^xy mod p); the TLS PSK of the admin and I/O
/// queues' new TLS connections derives from it as from a retained PSK, with a version 1
/// identity whose type is `G`. Only SHA-256 and SHA-384 exchanges can generate one (the
/// cipher suites NVMe/TCP has). Zeroed when dropped; `Debug` shows no key.
#[derive(Clone, PartialEq, Eq)]
pub struct GeneratedPsk {
    hash: PskHash,
    key: Zeroizing<Vec<u8>>,
}

impl std::fmt::Debug for GeneratedPsk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GeneratedPsk")
            .field("hash", &self.hash)
            .finish_non_exhaustive()
    }
}

impl GeneratedPsk {
    /// HMAC_hash(ks, c1 || c2); None when `hash` has no TLS cipher suite (SHA-512).
    pub fn generate(hash: HashId, ks: &[u8], c1: &[u8], c2: &[u8]) -> Option<Self> {
        let hash = match hash {
            HashId::Sha256 => PskHash::Sha256,
            HashId::Sha384 => PskHash::Sha384,
            HashId::Sha512 => return None,
        };
        Some(Self {
            hash,
            key: hash.hmac().hmac(ks, &[c1, c2]),
        })
    }

    /// The hash of the exchange that generated it, and of its cipher suite.
    pub fn hash(&self) -> PskHash {
        self.hash
    }

    /// The generated PSK itself (a secret).
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    /// The PSK digest: base64(HMAC(PSK, hostnqn " " subnqn " NVMe-over-Fabrics")).
    pub fn digest(&self, hostnqn: &str, subnqn: &str) -> String {
        let mac = self.hash.hmac().hmac(
            &self.key,
            &[hostnqn.as_bytes(), b" ", subnqn.as_bytes(), b" NVMe-over-Fabrics"],
        );
        STANDARD.encode(&*mac)
    }

    /// The identity `NVMe1G<hh> <hostnqn> <subnqn> <digest>` and the TLS PSK,
    /// HKDF-Expand-Label(HKDF-Extract(0, PSK), "nvme-tls-psk", "<hh> <digest>", length)
    /// (NVMe/TCP 1.0 §3.6.1.3 as TP 8018 amends it; RFC 8446's label encoding, as the
    /// kernel, which derives it on both sides for Linux hosts and nvmet).
    pub fn tls_psk(&self, hostnqn: &str, subnqn: &str) -> Option<TlsPsk> {
        let digest = self.digest(hostnqn, subnqn);
        let hh = self.hash.id();
        let psk = self.hash.expand_label(
            PskDerivation::Rfc8446,
            &self.key,
            "nvme-tls-psk",
            format!("{hh:02} {digest}").as_bytes(),
            self.hash.output_len(),
        )?;
        Some(TlsPsk {
            identity: format!("NVMe1G{hh:02} {hostnqn} {subnqn} {digest}"),
            hash: self.hash,
            psk,
        })
    }
}

/// The parts of a PSK identity a host offers (NVMe/TCP 1.0 §3.6.1.3, TP 8018):
/// `NVMe<v>R<hh> <hostnqn> <subnqn>`, version 1 appending ` <digest>`; `R` names a retained
/// PSK (derived from a configured one), `G` a PSK generated by secure channel concatenation,
/// whose identity is always version 1 (its digest tells one generated PSK from the next).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PskIdentity {
    /// Identity format version, 0 or 1.
    pub version: u8,
    /// The cipher suite hash the identity names.
    pub hash: PskHash,
    /// The host NQN.
    pub hostnqn: String,
    /// The subsystem NQN.
    pub subnqn: String,
    /// A generated PSK (`G`), not a retained one (`R`).
    pub generated: bool,
    /// The PSK digest of a version 1 identity.
    pub digest: Option<String>,
}

impl PskIdentity {
    /// Parse an identity; None if it is not a well-formed one (NQNs hold no spaces).
    pub fn parse(id: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(id).ok()?;
        let (head, rest) = text.split_once(' ')?;
        let b = head.as_bytes();
        if b.len() != 8 || &b[..4] != b"NVMe" {
            return None;
        }
        let version = match b[4] {
            b'0' => 0,
            b'1' => 1,
            _ => return None,
        };
        let generated = match b[5] {
            b'R' => false,
            b'G' if version == 1 => true,
            _ => return None,
        };
        let hash = match &head[6..] {
            "01" => PskHash::Sha256,
            "02" => PskHash::Sha384,
            _ => return None,
        };
        let mut parts = rest.split(' ');
        let (hostnqn, subnqn) = (parts.next()?, parts.next()?);
        // Version 1 carries the digest last; its value is checked by comparing the whole
        // identity with the one derived from the configured (or generated) PSK.
        let digest = match version {
            1 => Some(parts.next().filter(|d| !d.is_empty())?.to_string()),
            _ => None,
        };
        if parts.next().is_some() || hostnqn.is_empty() || subnqn.is_empty() {
            return None;
        }
        Some(Self {
            version,
            hash,
            hostnqn: hostnqn.to_string(),
            subnqn: subnqn.to_string(),
            generated,
            digest,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    // libnvme's test/psk.c vectors (libnvme 1.16+, the corrected HkdfLabel).
    const PSK32: [u8; 32] = [
        0x55, 0x12, 0xDB, 0xB6, 0x73, 0x7D, 0x01, 0x06, 0xF6, 0x59, 0x75, 0xB7, 0x73, 0xDF, 0xB0, 0x11, 0xFF, 0xC3,
        0x44, 0xBC, 0xF4, 0x42, 0xE2, 0xDD, 0x6D, 0x8B, 0xC4, 0x87, 0x0B, 0x5D, 0x5B, 0x03,
    ];

    fn psk48() -> Vec<u8> {
        let mut k = PSK32.to_vec();
        k.extend_from_slice(&PSK32[16..]);
        k
    }

    #[test]
    fn interchange_matches_libnvmes_vectors() {
        let cases: [(Option<PskHash>, Vec<u8>, &str); 3] = [
            (
                None,
                PSK32.to_vec(),
                "NVMeTLSkey-1:00:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:",
            ),
            (
                Some(PskHash::Sha256),
                PSK32.to_vec(),
                "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:",
            ),
            (
                Some(PskHash::Sha384),
                psk48(),
                "NVMeTLSkey-1:02:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwP/w0S89ELi3W2LxIcLXVsDn8kXZQ==:",
            ),
        ];
        for (hash, key, text) in cases {
            let p = ConfiguredPsk::new(hash, &key).unwrap();
            assert_eq!(*p.encode(), text);
            assert_eq!(ConfiguredPsk::parse(text).unwrap(), p);
        }
    }

    #[test]
    fn identities_match_libnvmes_vectors() {
        let (h, s) = ("nqn.psk-test-host", "nqn.psk-test-subsys");
        let p = ConfiguredPsk::new(Some(PskHash::Sha256), &PSK32).unwrap();
        let t = p.tls_psk(h, s, 1).unwrap();
        assert_eq!(
            t.identity,
            "NVMe1R01 nqn.psk-test-host nqn.psk-test-subsys iSbjiStwJ/1TrTvDlt2fjFmzvsytOJelidNnA+X5lEU="
        );
        assert_eq!((t.hash, t.psk.len()), (PskHash::Sha256, 32));
        let p = ConfiguredPsk::new(Some(PskHash::Sha384), &psk48()).unwrap();
        let t = p.tls_psk(h, s, 1).unwrap();
        assert_eq!(
            t.identity,
            "NVMe1R02 nqn.psk-test-host nqn.psk-test-subsys QhW2+Rp6RzHlNtCslyRxMnwJ11tKKhz8JCAQpQ+XUD8f9td1VeH5h53yz2wKJG1a"
        );
        assert_eq!((t.hash, t.psk.len()), (PskHash::Sha384, 48));
        // Version 0: no digest; the TLS PSK differs with the identity.
        let v0 = p.tls_psk(h, s, 0).unwrap();
        assert_eq!(v0.identity, "NVMe0R02 nqn.psk-test-host nqn.psk-test-subsys");
        assert_ne!(*v0.psk, *t.psk);
        assert!(p.tls_psk(h, s, 2).is_none());
        // Another host gets another retained PSK.
        assert_ne!(*p.retained(h).unwrap(), *p.retained("nqn.other").unwrap());
        // Hash 00: the configured PSK is retained as is, its cipher by its length.
        let p0 = ConfiguredPsk::new(None, &psk48()).unwrap();
        assert_eq!(*p0.retained(h).unwrap(), psk48());
        assert_eq!(p0.cipher(), PskHash::Sha384);
    }

    /// libnvme 1.13's own derivation (Debian 13's nvme-cli 2.13, `nvme check-tls-key
    /// --insert --keytype=user` into a keyring, read back with `keyctl pipe`; the Linux host
    /// uses what it inserts): the TLS PSKs of both identity versions, and the version 1
    /// identity, whose digest comes from the (differently derived) retained PSK.
    #[test]
    fn the_compat_derivation_matches_libnvme_1_13() {
        let h = "nqn.2014-08.org.nvmexpress:uuid:f81d4fae-7dec-11d0-a765-00a0c91e6bf6";
        let s = "nqn.2014-08.org.nvmexpress:uuid:e5df7ba0-c13f-4a61-9d72-2e0f4bbbd9ac";
        let p = ConfiguredPsk::parse("NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:")
            .unwrap()
            .with_derivation(PskDerivation::LibnvmeCompat);
        let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
        let v0 = p.tls_psk(h, s, 0).unwrap();
        assert_eq!(v0.identity, format!("NVMe0R01 {h} {s}"));
        assert_eq!(
            hex(&v0.psk),
            "3350163105a981d8ebfcaff245a34c7811e41d4c25999e2c705b6775f93dea22"
        );
        let v1 = p.tls_psk(h, s, 1).unwrap();
        assert_eq!(
            v1.identity,
            format!("NVMe1R01 {h} {s} Wsypc1u26YumpAoyhXuB7rtdl23KFRw7+K6FUT6imsU=")
        );
        assert_eq!(
            hex(&v1.psk),
            "06a65e2007b2593b867905290f62bc50c6c04154c4687bf3d21e56672d6ef6b9"
        );
        // The RFC 8446 encoding (libnvme 1.16+) gives other keys for the same input.
        let rfc = p.clone().with_derivation(PskDerivation::Rfc8446);
        assert_ne!(*rfc.tls_psk(h, s, 0).unwrap().psk, *v0.psk);
        assert_eq!(
            PskDerivation::from_name("libnvme-compat"),
            Some(PskDerivation::LibnvmeCompat)
        );
        assert_eq!(
            PskDerivation::from_name(PskDerivation::Rfc8446.name()),
            Some(PskDerivation::Rfc8446)
        );
        assert_eq!(PskDerivation::from_name("compat"), None);
    }

    #[test]
    fn bad_interchange_is_refused_with_the_reason() {
        assert_eq!(ConfiguredPsk::parse("DHHC-1:00:AAAA:"), Err(PskError::Format));
        assert_eq!(
            ConfiguredPsk::parse("NVMeTLSkey-1:03:AAAA:"),
            Err(PskError::Hash("03".into()))
        );
        assert_eq!(ConfiguredPsk::parse("NVMeTLSkey-1:01:%%%:"), Err(PskError::Base64));
        let k48 = ConfiguredPsk::new(None, &psk48())
            .unwrap()
            .encode()
            .replace(":00:", ":01:");
        assert_eq!(ConfiguredPsk::parse(&k48), Err(PskError::Length(48)));
        let mut bad = ConfiguredPsk::new(None, &PSK32).unwrap().encode().to_string();
        bad.replace_range(20..21, if &bad[20..21] == "A" { "B" } else { "A" });
        assert_eq!(ConfiguredPsk::parse(&bad), Err(PskError::Crc));
        assert_eq!(ConfiguredPsk::new(None, &[0; 16]).unwrap_err(), PskError::Length(16));
        assert!(!format!("{:?}", ConfiguredPsk::new(None, &PSK32).unwrap()).contains("85"));
    }

    #[test]
    fn identities_parse_into_their_parts() {
        let id = PskIdentity::parse(b"NVMe0R01 nqn.h nqn.s").unwrap();
        assert_eq!(
            (id.version, id.hash, &*id.hostnqn, &*id.subnqn),
            (0, PskHash::Sha256, "nqn.h", "nqn.s")
        );
        let id = PskIdentity::parse(b"NVMe1R02 nqn.h nqn.s ZGlnZXN0").unwrap();
        assert_eq!((id.version, id.hash, id.generated), (1, PskHash::Sha384, false));
        assert_eq!(id.digest.as_deref(), Some("ZGlnZXN0"));
        let id = PskIdentity::parse(b"NVMe1G01 nqn.h nqn.s ZGlnZXN0").unwrap();
        assert_eq!((id.version, id.hash, id.generated), (1, PskHash::Sha256, true));
        for bad in [
            &b"NVMe0R01 nqn.h"[..],
            b"NVMe0R01 nqn.h nqn.s extra",
            b"NVMe1R01 nqn.h nqn.s",
            b"NVMe0G01 nqn.h nqn.s",
            b"NVMe1G01 nqn.h nqn.s",
            b"NVMe1X01 nqn.h nqn.s ZGlnZXN0",
            b"NVMe2R01 nqn.h nqn.s",
            b"NVMe0R03 nqn.h nqn.s",
            b"Client_identity",
            b"",
            b"NVMe0R01  nqn.s",
            b"\xff\xfe",
        ] {
            assert_eq!(PskIdentity::parse(bad), None, "{bad:?}");
        }
        // What tls_psk derives parses back.
        let p = ConfiguredPsk::new(Some(PskHash::Sha256), &PSK32).unwrap();
        let t = p.tls_psk("nqn.h", "nqn.s", 1).unwrap();
        let id = PskIdentity::parse(t.identity.as_bytes()).unwrap();
        assert_eq!((&*id.hostnqn, &*id.subnqn, id.version), ("nqn.h", "nqn.s", 1));
    }

    /// The Linux kernel's own vectors (drivers/nvme/common/tests/auth_kunit.c): KS is
    /// 'A', 'B', ... (hash length bytes), C1 0, 1, ..., C2 FFh, FEh, ..., with host NQN
    /// "hostnqn" and subsystem NQN "subsysnqn".
    #[test]
    fn generated_psks_match_the_kernels_vectors() {
        let ks: Vec<u8> = (0..64u8).map(|i| b'A' + i).collect();
        let c1: Vec<u8> = (0..64u8).collect();
        let c2: Vec<u8> = (0..64u8).map(|i| 0xff - i).collect();
        let g = GeneratedPsk::generate(HashId::Sha256, &ks[..32], &c1[..32], &c2[..32]).unwrap();
        assert_eq!(
            g.key(),
            [
                0x17, 0x33, 0xc5, 0x9f, 0xa7, 0xf4, 0x8f, 0xcf, 0x37, 0xf5, 0xf2, 0x6f, 0xc4, 0xff, 0x02, 0x68, 0xad,
                0x4f, 0x78, 0xe0, 0x30, 0xf4, 0xf3, 0xb0, 0xbf, 0xd1, 0xd4, 0x7e, 0x7b, 0xb1, 0x44, 0x7a,
            ]
        );
        assert_eq!(
            g.digest("hostnqn", "subsysnqn"),
            "OldoKuTfKddMuyCznAZojkWD7P4D9/AtzDzLimtOxqI="
        );
        let t = g.tls_psk("hostnqn", "subsysnqn").unwrap();
        assert_eq!(
            *t.psk,
            [
                0x3c, 0x17, 0xda, 0x62, 0x84, 0x74, 0xa0, 0x4d, 0x22, 0x47, 0xc4, 0xca, 0xb4, 0x79, 0x68, 0xc9, 0x15,
                0x38, 0x81, 0x93, 0xf7, 0xc0, 0x71, 0xbd, 0x94, 0x89, 0xcc, 0x36, 0x66, 0xcd, 0x7c, 0xc8,
            ]
        );
        assert_eq!(
            t.identity,
            "NVMe1G01 hostnqn subsysnqn OldoKuTfKddMuyCznAZojkWD7P4D9/AtzDzLimtOxqI="
        );
        let id = PskIdentity::parse(t.identity.as_bytes()).unwrap();
        assert!(id.generated && id.version == 1 && id.hash == PskHash::Sha256);

        let g = GeneratedPsk::generate(HashId::Sha384, &ks[..48], &c1[..48], &c2[..48]).unwrap();
        assert_eq!(
            g.key(),
            [
                0xf1, 0x4b, 0x2d, 0xd3, 0x23, 0x4c, 0x45, 0x96, 0x94, 0xd3, 0xbc, 0x63, 0xf8, 0x96, 0x8b, 0xd6, 0xb3,
                0x7c, 0x2c, 0x6d, 0xe8, 0x49, 0xe2, 0x2e, 0x11, 0x87, 0x49, 0x00, 0x1c, 0xe4, 0xbb, 0xe8, 0x64, 0x0b,
                0x9e, 0x3a, 0x74, 0x8c, 0xb1, 0x1c, 0xe4, 0xb1, 0xd7, 0x1d, 0x35, 0x9c, 0xce, 0x39,
            ]
        );
        assert_eq!(
            g.digest("hostnqn", "subsysnqn"),
            "cffMWk8TSS7HOQebjgYEIkrPrjWPV4JE5cdPB8WhEvY4JBW5YynKyv66XscN4A9n"
        );
        assert_eq!(
            *g.tls_psk("hostnqn", "subsysnqn").unwrap().psk,
            [
                0x27, 0x74, 0x75, 0x32, 0x33, 0x53, 0x7b, 0x3f, 0xa5, 0x0e, 0xb7, 0xd1, 0x6a, 0x8e, 0x43, 0x45, 0x7d,
                0x85, 0xf4, 0x90, 0x6c, 0x00, 0x5b, 0x22, 0x36, 0x61, 0x6c, 0x5d, 0x80, 0x93, 0x9d, 0x08, 0x98, 0xff,
                0xf1, 0x5b, 0xb8, 0xb7, 0x71, 0x19, 0xd2, 0xbe, 0x0a, 0xac, 0x42, 0x3e, 0x75, 0x90,
            ]
        );
        // SHA-512 has no TLS cipher suite: no PSK (the kernel refuses its digest too).
        assert!(GeneratedPsk::generate(HashId::Sha512, &ks, &c1, &c2).is_none());
        assert!(!format!("{g:?}").contains("f1"), "Debug shows no key");
    }
}
