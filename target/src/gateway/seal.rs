//! The group's secrets at rest in the cluster: DH-HMAC-CHAP and TLS keys in the group's
//! configuration are sealed (AES-256-GCM, OpenSSL's) under a key every gateway of the group
//! holds in an owner-only file (`[gateway] key_file`), so that a reader of the pool (any
//! client with `profile rbd` on it: every hypervisor that maps an image) reads ciphertext.
//!
//! Why this of the three ways Ceph offers: the `config-key` store needs a mon cap beyond
//! `profile rbd` and puts the keys where `ceph config-key dump` shows them to any admin;
//! files each gateway holds would make a key rotation through one gateway impossible. A
//! group key is one file to distribute once (as the keyring already is), and a change
//! through any gateway carries its keys to all of them.
//!
//! A sealed value is `pollux-sealed:1:` and the base64 of a random 96-bit nonce, the
//! ciphertext and the 128-bit tag; the group's name is the additional data, so a value
//! copied into another group's object does not open there.

use base64::Engine;
use hkdf::Hkdf;
use openssl::symm::{Cipher, decrypt_aead, encrypt_aead};
use sha2::Sha256;
use toml_edit::{DocumentMut, Item, Value};
use zeroize::Zeroizing;

/// What a sealed value starts with.
pub const SEALED: &str = "pollux-sealed:1:";

/// The keys of a conf document whose values are secrets.
const SECRET_KEYS: [&str; 3] = ["dhchap_key", "dhchap_ctrl_key", "tls_key"];

/// Why a value or a key file does not seal or open.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    /// The group key file is refused or unreadable.
    #[error("the group key {path}: {why}")]
    KeyFile {
        /// The file.
        path: String,
        /// Why (never its content).
        why: String,
    },
    /// A secret to seal or open and no group key.
    #[error(
        "the group's configuration holds DH-HMAC-CHAP or TLS keys, and this gateway has no group key: set `[gateway] key_file` (the same file on every gateway)"
    )]
    NoKey,
    /// A sealed value that does not open: another group key, or a damaged value.
    #[error(
        "a sealed key of the group's configuration does not open with this gateway's group key (`[gateway] key_file` differs from the gateway that sealed it, or the value is damaged)"
    )]
    Open,
    /// OpenSSL refused to seal (never seen).
    #[error("sealing failed: {0}")]
    Seal(#[from] openssl::error::ErrorStack),
    /// A key file named in a change cannot be read on this gateway.
    #[error("key file {path}: {why}")]
    SecretFile {
        /// The file.
        path: String,
        /// Why.
        why: String,
    },
}

/// The group key: AES-256 key material derived from the key file.
pub struct GroupKey {
    key: Zeroizing<[u8; 32]>,
    aad: Vec<u8>,
}

impl std::fmt::Debug for GroupKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GroupKey(..)")
    }
}

impl GroupKey {
    /// The key of group `group` from file `path` (owner-only, at least 32 bytes: the conf
    /// checked both at start; checked again, the file may have changed since). HKDF-SHA256
    /// over its whole content, so any file of enough random bytes is a key.
    pub fn load(path: &std::path::Path, group: &str) -> Result<Self, SealError> {
        let bad = |why: String| SealError::KeyFile {
            path: path.display().to_string(),
            why,
        };
        pollux_conf::check_owner_only(path).map_err(|e| bad(e.to_string()))?;
        let ikm = Zeroizing::new(std::fs::read(path).map_err(|e| bad(e.to_string()))?);
        if ikm.len() < 32 {
            return Err(bad(format!(
                "holds {} bytes: a group key is at least 32 random bytes",
                ikm.len()
            )));
        }
        Ok(Self::from_material(&ikm, group))
    }

    /// The key of group `group` from key material `ikm`.
    pub fn from_material(ikm: &[u8], group: &str) -> Self {
        let mut key = Zeroizing::new([0u8; 32]);
        // 32 bytes is far below HKDF-SHA256's limit (255 * 32): expand cannot fail.
        let _ = Hkdf::<Sha256>::new(Some(b"pollux gateway group key"), ikm).expand(group.as_bytes(), &mut key[..]);
        Self {
            key,
            aad: format!("pollux.gateway.{group}").into_bytes(),
        }
    }

    /// `plain`, sealed.
    pub fn seal(&self, plain: &str) -> Result<String, SealError> {
        let mut nonce = [0u8; 12];
        getrandom::fill(&mut nonce).map_err(|e| SealError::KeyFile {
            path: "(the OS's randomness)".into(),
            why: e.to_string(),
        })?;
        let mut tag = [0u8; 16];
        let ct = encrypt_aead(
            Cipher::aes_256_gcm(),
            &self.key[..],
            Some(&nonce),
            &self.aad,
            plain.as_bytes(),
            &mut tag,
        )?;
        let mut all = Vec::with_capacity(12 + ct.len() + 16);
        all.extend_from_slice(&nonce);
        all.extend_from_slice(&ct);
        all.extend_from_slice(&tag);
        Ok(format!(
            "{SEALED}{}",
            base64::engine::general_purpose::STANDARD.encode(all)
        ))
    }

    /// The value `sealed` seals.
    pub fn open(&self, sealed: &str) -> Result<Zeroizing<String>, SealError> {
        let b64 = sealed.strip_prefix(SEALED).ok_or(SealError::Open)?;
        let all = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|_| SealError::Open)?;
        if all.len() < 28 {
            return Err(SealError::Open);
        }
        let (nonce, rest) = all.split_at(12);
        let (ct, tag) = rest.split_at(rest.len() - 16);
        let plain = Zeroizing::new(
            decrypt_aead(Cipher::aes_256_gcm(), &self.key[..], Some(nonce), &self.aad, ct, tag)
                .map_err(|_| SealError::Open)?,
        );
        String::from_utf8(plain.to_vec())
            .map(Zeroizing::new)
            .map_err(|_| SealError::Open)
    }
}

/// Put string `s` in `v`'s place, keeping its spacing.
fn replace(v: &mut Value, s: &str) {
    let decor = v.decor().clone();
    *v = Value::from(s);
    *v.decor_mut() = decor;
}

impl crate::resv::seal::KeySeal for GroupKey {
    fn seal(&self, key: u64) -> Option<String> {
        GroupKey::seal(self, &key.to_string()).ok()
    }

    fn open(&self, sealed: &str) -> Option<u64> {
        GroupKey::open(self, sealed).ok()?.parse().ok()
    }
}

/// Every string value under `item` (tables, inline tables, arrays), with its key.
fn each_value(item: &mut Item, f: &mut dyn FnMut(&str, &mut Value) -> Result<(), SealError>) -> Result<(), SealError> {
    fn in_table(
        t: &mut toml_edit::Table,
        f: &mut dyn FnMut(&str, &mut Value) -> Result<(), SealError>,
    ) -> Result<(), SealError> {
        for (k, v) in t.iter_mut() {
            if let Item::Value(val) = v {
                f(k.get(), val)?;
                nested(val, f)?;
            } else {
                each_value(v, f)?;
            }
        }
        Ok(())
    }
    match item {
        Item::Table(t) => in_table(t, f)?,
        Item::ArrayOfTables(a) => {
            for t in a.iter_mut() {
                in_table(t, f)?;
            }
        }
        Item::Value(v) => nested(v, f)?,
        Item::None => {}
    }
    Ok(())
}

fn nested(v: &mut Value, f: &mut dyn FnMut(&str, &mut Value) -> Result<(), SealError>) -> Result<(), SealError> {
    match v {
        Value::InlineTable(t) => {
            for (k, v) in t.iter_mut() {
                f(k.get(), v)?;
                nested(v, f)?;
            }
        }
        Value::Array(a) => {
            for v in a.iter_mut() {
                nested(v, f)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// Turn every key file a change named (`dhchap_key_file`, `dhchap_ctrl_key_file`,
/// `tls_key_file`) into the key it holds, read here: a path names a file of this
/// gateway's machine, the key is the group's.
pub fn inline_key_files(doc: &mut DocumentMut) -> Result<(), SealError> {
    fn walk(t: &mut dyn toml_edit::TableLike) -> Result<(), SealError> {
        let files: Vec<String> = t
            .iter()
            .filter(|(k, _)| k.ends_with("_key_file"))
            .map(|(k, _)| k.to_string())
            .collect();
        for k in files {
            let Some(path) = t.get(&k).and_then(Item::as_str).map(str::to_string) else {
                continue;
            };
            let bad = |why: String| SealError::SecretFile {
                path: path.clone(),
                why,
            };
            let meta = pollux_conf::check_owner_only(std::path::Path::new(&path)).map_err(|e| bad(e.to_string()))?;
            if meta.len() > 4096 {
                return Err(bad(format!("is {} bytes: not a key", meta.len())));
            }
            let text = Zeroizing::new(std::fs::read_to_string(&path).map_err(|e| bad(e.to_string()))?);
            t.remove(&k);
            t.insert(k.trim_end_matches("_file"), toml_edit::value(text.trim()));
        }
        for (_, v) in t.iter_mut() {
            match v {
                Item::Table(c) => walk(c)?,
                Item::ArrayOfTables(a) => {
                    for c in a.iter_mut() {
                        walk(c)?;
                    }
                }
                Item::Value(Value::InlineTable(c)) => walk(c)?,
                Item::Value(Value::Array(a)) => {
                    for c in a.iter_mut() {
                        if let Value::InlineTable(c) = c {
                            walk(c)?;
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }
    walk(doc.as_table_mut())
}

/// Run `f` on every value of `doc` with its key (the whole document walked: tables, arrays
/// of tables, inline tables, arrays).
fn map_values(
    doc: &mut DocumentMut,
    f: &mut dyn FnMut(&str, &mut Value) -> Result<(), SealError>,
) -> Result<(), SealError> {
    let mut root = Item::Table(std::mem::take(doc.as_table_mut()));
    let r = each_value(&mut root, f);
    if let Item::Table(t) = root {
        *doc.as_table_mut() = t;
    }
    r
}

/// Seal every secret of `doc` still in clear (a document with none needs no key).
pub fn seal_doc(doc: &mut DocumentMut, key: Option<&GroupKey>) -> Result<(), SealError> {
    map_values(doc, &mut |k, v| {
        if !SECRET_KEYS.contains(&k) {
            return Ok(());
        }
        let Some(s) = v.as_str() else { return Ok(()) };
        if s.starts_with(SEALED) {
            return Ok(());
        }
        let sealed = key.ok_or(SealError::NoKey)?.seal(s)?;
        replace(v, &sealed);
        Ok(())
    })
}

/// `doc` with every sealed value opened (zeroed when dropped).
pub fn open_doc(text: &str, key: Option<&GroupKey>) -> Result<Zeroizing<String>, SealError> {
    if !text.contains(SEALED) {
        return Ok(Zeroizing::new(text.to_string()));
    }
    let mut doc: DocumentMut = text.parse().map_err(|_| SealError::Open)?;
    map_values(&mut doc, &mut |_, v| {
        let Some(s) = v.as_str() else { return Ok(()) };
        if !s.starts_with(SEALED) {
            return Ok(());
        }
        let plain = key.ok_or(SealError::NoKey)?.open(s)?;
        replace(v, &plain);
        Ok(())
    })?;
    Ok(Zeroizing::new(doc.to_string()))
}

/// `doc` with every secret in clear replaced by `(secret)`, for showing.
pub fn redact(text: &str) -> String {
    let Ok(mut doc) = text.parse::<DocumentMut>() else {
        return String::new();
    };
    let _ = map_values(&mut doc, &mut |k, v| {
        if SECRET_KEYS.contains(&k) && v.as_str().is_some_and(|s| !s.starts_with(SEALED)) {
            replace(v, "(secret)");
        }
        Ok(())
    });
    doc.to_string()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const DOC: &str = "[[subsystem]]\nnqn = \"nqn.2026-12.io.pollux:s\"\n\
        hosts = [{ nqn = \"nqn.2014-08.org.nvmexpress:uuid:1\", dhchap_key = \"DHHC-1:00:c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0aHNvbQ==:\" }]\n";

    #[test]
    fn sealed_keys_open_with_the_group_key_only() {
        let k = GroupKey::from_material(&[7u8; 32], "g1");
        let mut doc: DocumentMut = DOC.parse().unwrap();
        seal_doc(&mut doc, Some(&k)).unwrap();
        let sealed = doc.to_string();
        assert!(!sealed.contains("DHHC-1"), "{sealed}");
        assert!(sealed.contains(SEALED));
        assert_eq!(open_doc(&sealed, Some(&k)).unwrap().as_str(), DOC);
        let other = GroupKey::from_material(&[8u8; 32], "g1");
        assert!(matches!(open_doc(&sealed, Some(&other)), Err(SealError::Open)));
        let other_group = GroupKey::from_material(&[7u8; 32], "g2");
        assert!(matches!(open_doc(&sealed, Some(&other_group)), Err(SealError::Open)));
        assert!(matches!(open_doc(&sealed, None), Err(SealError::NoKey)));
        // Sealing twice seals nothing twice.
        seal_doc(&mut doc, Some(&k)).unwrap();
        assert_eq!(open_doc(&doc.to_string(), Some(&k)).unwrap().as_str(), DOC);
    }

    #[test]
    fn a_secret_without_a_key_is_refused_and_none_needs_none() {
        let mut doc: DocumentMut = DOC.parse().unwrap();
        assert!(matches!(seal_doc(&mut doc, None), Err(SealError::NoKey)));
        let mut plain: DocumentMut = "[[subsystem]]\nnqn = \"nqn.2026-12.io.pollux:s\"\n".parse().unwrap();
        seal_doc(&mut plain, None).unwrap();
        assert!(!redact(DOC).contains("DHHC-1"));
    }

    #[test]
    fn a_damaged_value_does_not_open() {
        let k = GroupKey::from_material(&[7u8; 32], "g1");
        let s = k.seal("DHHC-1:00:x:").unwrap();
        let mut b = s.into_bytes();
        let n = b.len() - 3;
        b[n] = if b[n] == b'A' { b'B' } else { b'A' };
        assert!(k.open(&String::from_utf8(b).unwrap()).is_err());
        assert!(k.open("pollux-sealed:1:AAAA").is_err());
    }
}
