//! The representation both NVMe secrets share: a DH-HMAC-CHAP secret `DHHC-1:XX:<base64>:`
//! (NVMe 2.0 §8.13.5.8) and a TLS PSK `NVMeTLSkey-1:hh:<base64>:` (NVMe/TCP 1.0 §3.6.1.5). A
//! prefix, a two-digit hash code, and the base64 of the key followed by the little-endian
//! CRC-32 (zlib's) of the key.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use zeroize::Zeroizing;

/// Why the key part is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bad {
    /// Not base64.
    Base64,
    /// A key of this many bytes, which the caller's length rule refuses.
    Length(usize),
    /// The CRC-32 does not match the key.
    Crc,
}

/// `text` (surrounding whitespace allowed) as its two-digit code and base64 text, if it is
/// `<prefix><code>:<base64>:`.
pub(crate) fn split<'a>(text: &'a str, prefix: &str) -> Option<(&'a str, &'a str)> {
    let rest = text.trim().strip_prefix(prefix)?;
    let (code, rest) = rest.split_once(':')?;
    let b64 = rest.strip_suffix(':')?;
    (code.len() == 2 && !b64.is_empty() && !b64.contains(':')).then_some((code, b64))
}

/// The key that `b64` holds, checked against its CRC-32, if `ok_len` takes its length.
pub(crate) fn decode(b64: &str, ok_len: impl Fn(usize) -> bool) -> Result<Zeroizing<Vec<u8>>, Bad> {
    let raw = Zeroizing::new(STANDARD.decode(b64).map_err(|_| Bad::Base64)?);
    let len = raw.len().saturating_sub(4);
    if raw.len() < 4 || !ok_len(len) {
        return Err(Bad::Length(len));
    }
    let (key, crc) = raw.split_at(len);
    if crc32fast::hash(key).to_le_bytes() != crc {
        return Err(Bad::Crc);
    }
    Ok(Zeroizing::new(key.to_vec()))
}

/// `<prefix><code>:<base64 of key || CRC-32>:` (a secret: never log it).
pub(crate) fn encode(prefix: &str, code: u8, key: &[u8]) -> Zeroizing<String> {
    let mut raw = Zeroizing::new(key.to_vec());
    raw.extend_from_slice(&crc32fast::hash(key).to_le_bytes());
    Zeroizing::new(format!("{prefix}{code:02}:{}:", STANDARD.encode(&*raw)))
}
