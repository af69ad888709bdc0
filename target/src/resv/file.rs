//! The state file of a namespace whose reservations persist through power loss (PTPL,
//! NVMe 2.0 §8.19.8): JSON, written atomically and durably before a change is published.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use pollux_nvme::spec::resv::ResvType;
use serde::{Deserialize, Serialize};

use super::state::{Holder, HostId, Registrant, ResvState};
use crate::error::TargetError;

/// The state's form in a file or a cluster object (JSON; host identifiers as UUID text).
#[derive(Serialize, Deserialize)]
pub(super) struct StateDoc {
    version: u32,
    generation: u32,
    registrants: Vec<DocRegistrant>,
    holder: Option<DocHolder>,
    /// PTPL (absent from a state file: a file exists only while PTPL is set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ptpl: Option<bool>,
}

#[derive(Serialize, Deserialize)]
struct DocRegistrant {
    hostid: String,
    /// The reservation key in clear (a state file; a cluster object without a sealer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    key: Option<u64>,
    /// The reservation key sealed ([`super::seal`]): a cluster object whose gateways hold a
    /// group key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sealed_key: Option<String>,
}

/// Where a state's document is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kept {
    /// A PTPL state file on this machine (owner-only).
    File,
    /// The cluster's object, or an announcement to the other gateways: readable by any
    /// reader of the pool, so its keys are sealed where a sealer is set.
    Cluster,
}

#[derive(Serialize, Deserialize)]
struct DocHolder {
    hostid: String,
    rtype: u8,
}

const STATE_VERSION: u32 = 1;

pub(super) fn hostid_text(h: &HostId) -> String {
    uuid::Uuid::from_bytes(*h).hyphenated().to_string()
}

/// What is wrong with a reservation state's document (a state file, or the cluster's
/// object).
#[derive(Debug, thiserror::Error)]
pub(super) enum StateDocError {
    #[error("not a reservation state: {0}")]
    NotAState(#[source] serde_json::Error),
    #[error("version {0} (this pollux reads {STATE_VERSION})")]
    Version(u32),
    #[error("host identifier {text:?}: {source}")]
    HostId {
        text: String,
        #[source]
        source: uuid::Error,
    },
    #[error("host {0} registered twice")]
    RegisteredTwice(String),
    #[error("reservation type {0}")]
    Type(u8),
    #[error("holder {0} is not a registrant")]
    HolderNotRegistered(String),
    #[error("cannot read it: {0}")]
    Read(#[source] std::io::Error),
    #[error(
        "host {0}'s reservation key is sealed, and this gateway cannot open it (it needs the group's key: `[gateway] key_file`)"
    )]
    Sealed(String),
    #[error("host {0} has no reservation key")]
    NoKey(String),
}

pub(super) fn hostid_of(s: &str) -> Result<HostId, StateDocError> {
    uuid::Uuid::parse_str(s)
        .map(|u| *u.as_bytes())
        .map_err(|source| StateDocError::HostId {
            text: s.to_owned(),
            source,
        })
}

/// A state from its document; any fault is said.
pub(super) fn from_doc(f: StateDoc) -> Result<ResvState, StateDocError> {
    if f.version != STATE_VERSION {
        return Err(StateDocError::Version(f.version));
    }
    let mut registrants = Vec::with_capacity(f.registrants.len());
    for r in &f.registrants {
        let hostid = hostid_of(&r.hostid)?;
        if registrants.iter().any(|x: &Registrant| x.hostid == hostid) {
            return Err(StateDocError::RegisteredTwice(r.hostid.clone()));
        }
        let key = match (&r.key, &r.sealed_key) {
            (Some(k), _) => *k,
            (None, Some(sealed)) => super::seal::sealer()
                .and_then(|s| s.open(sealed))
                .ok_or_else(|| StateDocError::Sealed(r.hostid.clone()))?,
            (None, None) => return Err(StateDocError::NoKey(r.hostid.clone())),
        };
        registrants.push(Registrant { hostid, key });
    }
    let holder = match &f.holder {
        None => None,
        Some(h) => {
            let rtype = ResvType::from_code(h.rtype).ok_or(StateDocError::Type(h.rtype))?;
            let hostid = hostid_of(&h.hostid)?;
            if !registrants.iter().any(|r| r.hostid == hostid) {
                return Err(StateDocError::HolderNotRegistered(h.hostid.clone()));
            }
            Some(Holder { hostid, rtype })
        }
    };
    Ok(ResvState {
        generation: f.generation,
        registrants,
        holder,
        ptpl: f.ptpl.unwrap_or(true),
    })
}

/// A state's document, to be kept `kept` (a cluster's says PTPL, which a state file leaves
/// out, and seals its keys where a sealer is set).
pub(super) fn to_doc(s: &ResvState, kept: Kept) -> StateDoc {
    let sealer = (kept == Kept::Cluster).then(super::seal::sealer).flatten();
    StateDoc {
        version: STATE_VERSION,
        generation: s.generation,
        registrants: s
            .registrants
            .iter()
            .map(|r| {
                let sealed_key = sealer.as_ref().and_then(|s| s.seal(r.key));
                DocRegistrant {
                    hostid: hostid_text(&r.hostid),
                    key: sealed_key.is_none().then_some(r.key),
                    sealed_key,
                }
            })
            .collect(),
        holder: s.holder.map(|h| DocHolder {
            hostid: hostid_text(&h.hostid),
            rtype: h.rtype.code(),
        }),
        ptpl: (kept == Kept::Cluster).then_some(s.ptpl),
    }
}

/// Read a state file; any fault is an error naming it.
pub(super) fn load(path: &Path) -> Result<ResvState, TargetError> {
    let bad = |why: String| TargetError::ReservationState {
        path: path.to_path_buf(),
        why,
    };
    let text = fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let f: StateDoc = serde_json::from_str(&text).map_err(|e| bad(StateDocError::NotAState(e).to_string()))?;
    from_doc(f).map_err(|e| bad(e.to_string()))
}

/// Write a state file atomically and durably: a temporary file beside it, flushed, renamed
/// over it, the directory flushed. Readable by pollux's user alone: it holds the
/// registrants' keys, the secret each host preempts the others with.
pub(super) fn store(path: &Path, s: &ResvState) -> std::io::Result<()> {
    let text = serde_json::to_string_pretty(&to_doc(s, Kept::File)).map_err(std::io::Error::other)?;
    let tmp = path.with_extension("tmp");
    {
        let mut out = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        // A temporary file left by a crash keeps the mode it was created with.
        out.set_permissions(fs::Permissions::from_mode(0o600))?;
        out.write_all(text.as_bytes())?;
        out.sync_all()?;
    }
    fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// The state file of namespace `nguid` in `dir`.
pub fn state_file(dir: &Path, nguid: &[u8; 16]) -> PathBuf {
    let hex: String = nguid.iter().map(|b| format!("{b:02x}")).collect();
    dir.join(format!("resv-{hex}.json"))
}
