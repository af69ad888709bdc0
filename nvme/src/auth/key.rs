//! DH-HMAC-CHAP secrets in their interchange representation, `DHHC-1:XX:<base64>:`, as
//! `nvme gen-dhchap-key` writes them (NVMe 2.0 §8.13.5.8): XX names the hash that transforms
//! the key (00 none), the base64 text holds the key (32, 48 or 64 bytes) followed by the
//! little-endian CRC-32 (zlib's) of the key.

use thiserror::Error;
use zeroize::Zeroizing;

use super::HashId;
use crate::interchange::{self, Bad};

const PREFIX: &str = "DHHC-1:";

/// Why a secret's representation is refused (it never carries the secret itself).
#[derive(Debug, Error, PartialEq, Eq)]
pub enum KeyError {
    /// Not `DHHC-1:XX:...:`.
    #[error("not a DH-HMAC-CHAP secret: expected DHHC-1:XX:<base64>: (as nvme gen-dhchap-key writes)")]
    Format,
    /// XX is not 00..03.
    #[error("unknown key transformation hash {0:?}: 00 (none), 01 (SHA-256), 02 (SHA-384) or 03 (SHA-512)")]
    Hash(String),
    /// The base64 text does not decode.
    #[error("the key is not valid base64")]
    Base64,
    /// Wrong key length for its hash.
    #[error("a {len}-byte key: {want}")]
    Length {
        /// Key bytes found.
        len: usize,
        /// What was expected.
        want: &'static str,
    },
    /// The CRC-32 does not match the key: a copy and paste error.
    #[error("the key's CRC-32 does not match (mistyped or truncated?)")]
    Crc,
}

/// A DH-HMAC-CHAP secret: the key and the hash that transforms it (None: used as is). Its
/// memory is zeroed when dropped, and `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct DhchapKey {
    hash: Option<HashId>,
    key: Zeroizing<Vec<u8>>,
}

impl std::fmt::Debug for DhchapKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DhchapKey")
            .field("hash", &self.hash)
            .field("len", &self.key.len())
            .finish_non_exhaustive()
    }
}

impl DhchapKey {
    /// Parse `DHHC-1:XX:<base64>:` (surrounding whitespace allowed, as in a key file).
    pub fn parse(text: &str) -> Result<Self, KeyError> {
        let (xx, b64) = interchange::split(text, PREFIX).ok_or(KeyError::Format)?;
        let hash = match xx {
            "00" => None,
            other => Some(
                other
                    .parse::<u8>()
                    .ok()
                    .and_then(HashId::from_id)
                    .ok_or_else(|| KeyError::Hash(other.to_string()))?,
            ),
        };
        let key = interchange::decode(b64, |len| match hash {
            None => matches!(len, 32 | 48 | 64),
            Some(h) => len == h.output_len(),
        })
        .map_err(|e| match e {
            Bad::Base64 => KeyError::Base64,
            Bad::Crc => KeyError::Crc,
            Bad::Length(len) => KeyError::Length {
                len,
                want: match hash {
                    None => "32, 48 or 64 bytes",
                    Some(HashId::Sha256) => "32 bytes for SHA-256",
                    Some(HashId::Sha384) => "48 bytes for SHA-384",
                    Some(HashId::Sha512) => "64 bytes for SHA-512",
                },
            },
        })?;
        Ok(Self { hash, key })
    }

    /// A new random secret of `len` bytes (32, 48 or 64) transformed with `hash`.
    pub fn generate(hash: Option<HashId>, len: usize) -> Option<Self> {
        let mut key = Zeroizing::new(vec![0u8; len]);
        (matches!(len, 32 | 48 | 64) && hash.is_none_or(|h| h.output_len() == len) && super::random(&mut key))
            .then_some(Self { hash, key })
    }

    /// The representation `DHHC-1:XX:<base64>:` (a secret: never log it).
    pub fn encode(&self) -> Zeroizing<String> {
        interchange::encode(PREFIX, self.hash.map_or(0, HashId::id), &self.key)
    }

    /// The transformation hash (None: the key is used as is).
    pub fn hash(&self) -> Option<HashId> {
        self.hash
    }

    /// The transformed key K' = HMAC_XX(key, nqn || "NVMe-over-Fabrics"), or the key itself
    /// when XX is 00 (NVMe 2.0 §8.13.5.8): the host key with the host NQN, the controller key
    /// with the subsystem NQN.
    pub fn transform(&self, nqn: &str) -> Zeroizing<Vec<u8>> {
        match self.hash {
            None => self.key.clone(),
            Some(h) => h.hmac(&self.key, &[nqn.as_bytes(), b"NVMe-over-Fabrics"]),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD;

    use super::*;

    #[test]
    fn keys_round_trip_and_check_their_crc_and_length() {
        for (hash, len) in [
            (None, 32),
            (None, 64),
            (Some(HashId::Sha256), 32),
            (Some(HashId::Sha512), 64),
        ] {
            let k = DhchapKey::generate(hash, len).unwrap();
            let text = k.encode();
            assert!(text.starts_with(&format!("DHHC-1:{:02}:", hash.map_or(0, HashId::id))));
            assert_eq!(DhchapKey::parse(&format!("  {}\n", *text)).unwrap(), k);
        }
        assert!(DhchapKey::generate(Some(HashId::Sha384), 32).is_none());
        let good = DhchapKey::generate(Some(HashId::Sha256), 32).unwrap().encode();
        // One base64 character changed: the CRC catches it.
        let mut bad = good.to_string();
        let i = 12;
        let c = if &bad[i..=i] == "A" { "B" } else { "A" };
        bad.replace_range(i..=i, c);
        assert_eq!(DhchapKey::parse(&bad), Err(KeyError::Crc));
        assert_eq!(DhchapKey::parse("DHHC-1:01:"), Err(KeyError::Format));
        assert_eq!(DhchapKey::parse("DHHC-2:00:AAAA:"), Err(KeyError::Format));
        assert_eq!(DhchapKey::parse("DHHC-1:07:AAAA:"), Err(KeyError::Hash("07".into())));
        assert_eq!(DhchapKey::parse("DHHC-1:00:%%%%:"), Err(KeyError::Base64));
        // A SHA-384 key of 32 bytes.
        let k32 = DhchapKey::generate(None, 32)
            .unwrap()
            .encode()
            .replace("DHHC-1:00:", "DHHC-1:02:");
        assert!(matches!(DhchapKey::parse(&k32), Err(KeyError::Length { len: 32, .. })));
    }

    #[test]
    fn a_known_secret_decodes_and_transforms() {
        // 32 bytes 00..1f with their CRC-32, no transformation.
        let key: Vec<u8> = (0u8..32).collect();
        let mut raw = key.clone();
        raw.extend_from_slice(&crc32fast::hash(&key).to_le_bytes());
        let text = format!("DHHC-1:00:{}:", STANDARD.encode(&raw));
        let k = DhchapKey::parse(&text).unwrap();
        assert_eq!(*k.transform("nqn.any"), key);
        assert_eq!(*k.encode(), text);
        // With SHA-256: HMAC(key, nqn || "NVMe-over-Fabrics").
        let text = text.replace("DHHC-1:00:", "DHHC-1:01:");
        let k = DhchapKey::parse(&text).unwrap();
        assert_eq!(
            *k.transform("nqn.h"),
            *HashId::Sha256.hmac(&key, &[b"nqn.hNVMe-over-Fabrics"])
        );
        // Debug shows no key material.
        assert!(!format!("{k:?}").contains("0, 1, 2"));
    }
}
