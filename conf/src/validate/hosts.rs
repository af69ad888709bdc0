//! A subsystem's `hosts`: NQNs, the DH-HMAC-CHAP keys of those that must authenticate
//! (inline `DHHC-1:` secrets or key files readable by their owner only), the TLS PSKs of
//! those that secure the channel (`NVMeTLSkey-1:`, likewise), and the hash functions and DH
//! groups the subsystem accepts (and those a host with keys may have of its own).

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use pollux_nvme::auth::KeyError;
use pollux_nvme::tls::{PskDerivation, PskError};
use toml::Spanned;
use zeroize::Zeroizing;

use super::Base;
use super::cx::Cx;
use crate::error::ConfError;
use crate::nqn::validate_nqn;
use crate::raw::{RawHost, RawHostEntry};
use crate::{ConfiguredPsk, DhGroup, Dhchap, DhchapKey, HashId, HostKeys, Secret, TlsKey};

/// Largest key file read (a secret is under 100 bytes).
const KEY_FILE_MAX: u64 = 4096;

/// A `hosts` list: the NQNs and the keys of those that have them.
#[derive(Default)]
pub(super) struct Hosts {
    pub nqns: Vec<String>,
    pub keys: BTreeMap<String, HostKeys>,
    pub tls: BTreeMap<String, TlsKey>,
}

/// The NQNs of `list` and the keys of those that have them; `parent` is the subsystem's
/// (or `[discovery]`'s) hashes and groups, those a host's own lists fall back on.
pub(super) fn hosts(cx: &Cx<'_>, list: &[Spanned<RawHost>], parent: &Dhchap) -> Result<Hosts, ConfError> {
    let mut nqns: Vec<String> = Vec::new();
    let mut keys = BTreeMap::new();
    let mut tls = BTreeMap::new();
    for h in list {
        let (nqn, entry) = match h.get_ref() {
            RawHost::Nqn(n) => (n.clone(), None),
            RawHost::Entry(e) => (e.nqn.get_ref().clone(), Some(e)),
        };
        validate_nqn(&nqn).map_err(|e| cx.at(h.span(), format!("invalid host NQN in `hosts`: {e}")))?;
        if nqns.contains(&nqn) {
            return Err(cx.at(h.span(), format!("host {nqn:?} is listed twice in `hosts`")));
        }
        if let Some(e) = entry {
            if let Some(k) = host_keys(cx, h.span(), e, parent)? {
                keys.insert(nqn.clone(), k);
            }
            if let Some(k) = tls_key(cx, e)? {
                tls.insert(nqn.clone(), k);
            }
        }
        nqns.push(nqn);
    }
    Ok(Hosts { nqns, keys, tls })
}

/// A host's TLS PSK, inline (`tls_key`) or from a file (`tls_key_file`), not both, and how
/// the host derives from it (`tls_key_derivation`, only with a key).
fn tls_key(cx: &Cx<'_>, e: &RawHostEntry) -> Result<Option<TlsKey>, ConfError> {
    let derivation = match &e.tls_key_derivation {
        None => PskDerivation::default(),
        Some(d) => PskDerivation::from_name(d.get_ref()).ok_or_else(|| {
            cx.at(
                d.span(),
                format!(
                    "invalid `tls_key_derivation` {:?}: \"rfc8446\" (libnvme 1.16 and later, the default) or \"libnvme-compat\" (keys inserted by libnvme before 1.16, e.g. nvme-cli 2.13)",
                    d.get_ref()
                ),
            )
        })?,
    };
    let key = secret_of(cx, &e.tls_key, &e.tls_key_file, "tls_key", ConfiguredPsk::parse)?;
    match (key, &e.tls_key_derivation) {
        (Some((key, file)), _) => Ok(Some(TlsKey {
            key: key.with_derivation(derivation),
            file,
        })),
        (None, Some(d)) => Err(cx.at(
            d.span(),
            "`tls_key_derivation` without a `tls_key` or `tls_key_file`: it says how the host derives from its TLS key"
                .into(),
        )),
        (None, None) => Ok(None),
    }
}

/// A host's DH-HMAC-CHAP keys and its own hash and group lists (NVMe 2.0 §8.13.5.1), if
/// it gives any: each a list as the subsystem's, the other one then the subsystem's.
fn host_keys(
    cx: &Cx<'_>,
    span: std::ops::Range<usize>,
    e: &RawHostEntry,
    parent: &Dhchap,
) -> Result<Option<HostKeys>, ConfError> {
    let host = secret(cx, &e.dhchap_key, &e.dhchap_key_file, "dhchap_key")?;
    let ctrl = secret(cx, &e.dhchap_ctrl_key, &e.dhchap_ctrl_key_file, "dhchap_ctrl_key")?;
    let own = match (&e.dhchap_hashes, &e.dhchap_dh_groups) {
        (None, None) => None,
        (hashes, groups) => {
            let mine = dhchap(cx, hashes, groups)?;
            let mut own = parent.clone();
            if hashes.is_some() {
                own.hashes = mine.hashes;
            }
            if groups.is_some() {
                own.dh_groups = mine.dh_groups;
            }
            Some(own)
        }
    };
    match (host, ctrl) {
        (Some(host), ctrl) => Ok(Some(HostKeys { host, ctrl, dhchap: own })),
        (None, Some(_)) => Err(cx.at(
            span,
            "a controller key (`dhchap_ctrl_key`) needs a host key (`dhchap_key` or `dhchap_key_file`): the host authenticates first".into(),
        )),
        (None, None) => match (&e.dhchap_hashes, &e.dhchap_dh_groups) {
            (None, None) => Ok(None),
            (Some(l), _) | (None, Some(l)) => {
                let key = if e.dhchap_hashes.is_some() { "dhchap_hashes" } else { "dhchap_dh_groups" };
                Err(cx.at(
                    l.span(),
                    format!(
                        "`{key}` without a `dhchap_key` or `dhchap_key_file`: a host's own hashes and DH groups apply to its DH-HMAC-CHAP key, so need one"
                    ),
                ))
            }
        },
    }
}

/// One DH-HMAC-CHAP secret, inline (`key`) or from a file (`key_file`), not both.
fn secret(
    cx: &Cx<'_>,
    inline: &Option<Spanned<String>>,
    file: &Option<Spanned<String>>,
    key: &str,
) -> Result<Option<Secret>, ConfError> {
    Ok(secret_of(cx, inline, file, key, DhchapKey::parse)?.map(|(key, file)| Secret { key, file }))
}

/// One secret, inline or from a file, not both: the key and the file it came from.
fn secret_of<K, E: std::fmt::Display>(
    cx: &Cx<'_>,
    inline: &Option<Spanned<String>>,
    file: &Option<Spanned<String>>,
    key: &str,
    parse: impl Fn(&str) -> Result<K, E>,
) -> Result<Option<(K, Option<std::path::PathBuf>)>, ConfError> {
    match (inline, file) {
        (Some(i), Some(_)) => Err(cx.at(i.span(), format!("give `{key}` or `{key}_file`, not both"))),
        // Never echo the value: it is a secret.
        (Some(i), None) => {
            let k = parse(i.get_ref()).map_err(|e| cx.at(i.span(), format!("invalid `{key}`: {e}")))?;
            // A conf file holding a key inline is a key file: the same rule applies to it.
            if let Base::DirOf(conf) = cx.base
                && let Err(why) = check_owner_only(conf)
                && conf.exists()
            {
                return Err(cx.at(
                    i.span(),
                    format!(
                        "`{key}` is given inline, but this conf file {why}; or give the key in a file (`{key}_file`)"
                    ),
                ));
            }
            Ok(Some((k, None)))
        }
        (None, Some(f)) => {
            let path = cx.path(f, &format!("{key}_file"))?;
            let k = read_secret_file(&path, &parse)
                .map_err(|why| cx.at(f.span(), format!("`{key}_file` {}: {why}", path.display())))?;
            Ok(Some((k, Some(path))))
        }
        (None, None) => Ok(None),
    }
}

/// A TLS PSK file's configured PSK (`tls_key_file`; also `pollux perf --tls-key-file`), by
/// the rules of [`read_secret_file`]; the reason names no part of the key.
pub fn read_tls_key_file(path: &Path) -> Result<ConfiguredPsk, KeyFileError<PskError>> {
    read_secret_file(path, &ConfiguredPsk::parse)
}

/// A DH-HMAC-CHAP secret file's key (`dhchap_key_file`; also `pollux perf
/// --dhchap-key-file`), by the rules of [`read_secret_file`]; the reason names no part of
/// the key.
pub fn read_dhchap_key_file(path: &Path) -> Result<DhchapKey, KeyFileError<KeyError>> {
    read_secret_file(path, &DhchapKey::parse)
}

/// Why a file that should hold a secret is refused (see [`check_owner_only`]); names no
/// part of the file's content.
#[derive(Debug, thiserror::Error)]
pub enum SecretFileError {
    /// It could not be read (or stat'ed).
    #[error("cannot be read: {0}")]
    Unreadable(#[source] std::io::Error),
    /// A directory, a device, a socket...
    #[error("is not a regular file")]
    NotRegular,
    /// Group or others may read or write it.
    #[error("is accessible to others (mode {mode:04o}): a key file must be readable by its owner only (chmod 600)")]
    OpenToOthers {
        /// Its permission bits.
        mode: u32,
    },
}

/// Why a key file gives no key: the file is refused, too large to be a key, or its text is
/// not a key (`E`, the key format's error, which never carries the key).
#[derive(Debug, thiserror::Error)]
pub enum KeyFileError<E> {
    /// The file is refused.
    #[error(transparent)]
    File(#[from] SecretFileError),
    /// Larger than any key's text.
    #[error("is {len} bytes: not a key")]
    TooLarge {
        /// Its size.
        len: u64,
    },
    /// Its text is not a key.
    #[error("{0}")]
    Key(E),
}

/// A key file's secret; refused unless it is a regular file that neither group nor others
/// may read or write (as ssh refuses a private key others can read).
fn read_secret_file<K, E>(path: &Path, parse: &dyn Fn(&str) -> Result<K, E>) -> Result<K, KeyFileError<E>> {
    let meta = check_owner_only(path)?;
    if meta.len() > KEY_FILE_MAX {
        return Err(KeyFileError::TooLarge { len: meta.len() });
    }
    let text = Zeroizing::new(std::fs::read_to_string(path).map_err(SecretFileError::Unreadable)?);
    parse(&text).map_err(KeyFileError::Key)
}

/// A file holding a secret (a key file, a Ceph keyring): its metadata, or why it is
/// refused: not a regular file, or one that group or others may read or write (as ssh
/// refuses a private key others can read).
pub fn check_owner_only(path: &Path) -> Result<std::fs::Metadata, SecretFileError> {
    let meta = std::fs::metadata(path).map_err(SecretFileError::Unreadable)?;
    if !meta.is_file() {
        return Err(SecretFileError::NotRegular);
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(SecretFileError::OpenToOthers { mode });
    }
    Ok(meta)
}

/// `dhchap_hashes` and `dhchap_dh_groups`, most preferred first.
pub(super) fn dhchap(
    cx: &Cx<'_>,
    hashes: &Option<Spanned<Vec<Spanned<String>>>>,
    groups: &Option<Spanned<Vec<Spanned<String>>>>,
) -> Result<Dhchap, ConfError> {
    let mut d = Dhchap::default();
    if let Some(list) = hashes {
        d.hashes = names(cx, list, "dhchap_hashes", HashId::from_name, "sha256, sha384 or sha512")?;
    }
    if let Some(list) = groups {
        d.dh_groups = names(
            cx,
            list,
            "dhchap_dh_groups",
            DhGroup::from_name,
            "null, ffdhe2048, ffdhe3072, ffdhe4096, ffdhe6144 or ffdhe8192",
        )?;
    }
    Ok(d)
}

fn names<T: PartialEq>(
    cx: &Cx<'_>,
    list: &Spanned<Vec<Spanned<String>>>,
    key: &str,
    parse: impl Fn(&str) -> Option<T>,
    known: &str,
) -> Result<Vec<T>, ConfError> {
    let mut out = Vec::new();
    for v in list.get_ref() {
        let t = parse(v.get_ref())
            .ok_or_else(|| cx.at(v.span(), format!("unknown {key} entry {:?}: {known}", v.get_ref())))?;
        if out.contains(&t) {
            return Err(cx.at(v.span(), format!("{:?} is listed twice in `{key}`", v.get_ref())));
        }
        out.push(t);
    }
    if out.is_empty() {
        return Err(cx.at(list.span(), format!("`{key}` must not be empty")));
    }
    Ok(out)
}

/// The `[discovery]` table.
pub(super) fn discovery(cx: &Cx<'_>, d: crate::raw::RawDiscovery) -> Result<crate::Discovery, ConfError> {
    let dhchap = dhchap(cx, &d.dhchap_hashes, &d.dhchap_dh_groups)?;
    let Hosts {
        nqns,
        keys: host_keys,
        tls: tls_keys,
    } = match &d.hosts {
        Some(list) => hosts(cx, list.get_ref(), &dhchap)?,
        None => Hosts::default(),
    };
    if let Some(list) = &d.hosts
        && let Some(bare) = nqns
            .iter()
            .find(|n| !host_keys.contains_key(*n) && !tls_keys.contains_key(*n))
    {
        return Err(cx.at(
            list.span(),
            format!(
                "`[discovery]` host {bare:?} has no key: each needs a `dhchap_key[_file]` (must authenticate) or a `tls_key[_file]` (may discover over TLS)"
            ),
        ));
    }
    let require_authentication = d.require_authentication.as_ref().is_some_and(|r| *r.get_ref());
    if require_authentication && host_keys.is_empty() {
        let span = d.require_authentication.as_ref().map(Spanned::span).unwrap_or_default();
        return Err(cx.at(
            span,
            "`require_authentication = true` with no host keys would refuse every host: list hosts with keys in `[discovery]` `hosts`".into(),
        ));
    }
    let filter = match &d.filter {
        None => crate::DiscoveryFilter::default(),
        Some(f) => crate::DiscoveryFilter::parse(f.get_ref()).ok_or_else(|| {
            cx.at(
                f.span(),
                format!(
                    "`filter` {:?}: \"match_any\", or \"transport\", \"address\", \"svcid\" joined by \",\" (SPDK's discovery_filter)",
                    f.get_ref()
                ),
            )
        })?,
    };
    Ok(crate::Discovery {
        filter,
        host_keys,
        tls_keys,
        require_authentication,
        dhchap,
    })
}
