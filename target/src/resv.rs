//! Persistent reservations of a namespace (NVMe 2.0 §8.19; the commands: NVM Command Set 1.0
//! §7.3-§7.6). SPDK: `lib/nvmf/ctrlr.c` (`nvmf_ns_reservation_*`); Linux: `target/pr.c`.
//!
//! Three parts, kept apart so that each can be tested alone:
//! - [`ResvState`], a pure state machine: the registrants (by 128-bit host identifier, so two
//!   controllers of one host share a registration), the reservation held, the generation,
//!   PTPL; each command is a method that returns its status and what it caused (the hosts
//!   to notify, the hosts whose commands are to be aborted).
//! - [`NsResv`], what every reactor reads: the state as an immutable snapshot swapped whole,
//!   and a flag that no reservation is held. The I/O path's check is one atomic load while
//!   nothing is held (the common case), and a snapshot load otherwise: never a lock.
//! - One owner: every change runs on the `pollux-resv` thread, which applies it to a copy,
//!   writes the copy to the namespace's state file first when PTPL is set (so a completed
//!   command is durable: a `kill -9` right after loses nothing), then swaps it in. A change
//!   that cannot be written fails with Internal Error and changes nothing. Reactors never
//!   wait for it: a reservation command's completion comes back by message.
//!
//! Reservations are per target: two targets exporting the same namespace (the HA issue's
//! `shared = true`) each keep their own, as nvmet and SPDK do.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;

use arc_swap::ArcSwap;
use pollux_nvme::spec::Status;
use pollux_nvme::spec::resv::{
    Access, AcquireAction, Cptpl, RegisterAction, ReleaseAction, ReportEntry, ResvType, notice, report_ext,
};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::error::TargetError;

/// A host identifier (NVMe-oF 1.1 §3.3: 128 bits, from Connect).
pub type HostId = [u8; 16];

/// One registrant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registrant {
    /// Its host.
    pub hostid: HostId,
    /// Its reservation key.
    pub key: u64,
}

/// The reservation held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holder {
    /// The host that acquired it (for the all-registrants types every registrant holds it;
    /// this is then one of them).
    pub hostid: HostId,
    /// Its type.
    pub rtype: ResvType,
}

/// The reservation state of one namespace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResvState {
    /// Reservation Report's generation: counts Register, Unregister, Replace, Preempt and
    /// Clear that succeeded.
    pub generation: u32,
    /// Registrants, in order of registration.
    pub registrants: Vec<Registrant>,
    /// The reservation, if one is held.
    pub holder: Option<Holder>,
    /// Persist Through Power Loss: the state survives a restart.
    pub ptpl: bool,
}

/// What a reservation command did beyond its status.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Effects {
    /// Notifications for the Reservation Notification log (host, [`notice`] type).
    pub notices: Vec<(HostId, u8)>,
    /// Hosts whose commands on the namespace are aborted (Preempt and Abort).
    pub aborted: Vec<HostId>,
}

/// A reservation command that changes state, decoded and with its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResvOp {
    /// Reservation Register.
    Register {
        /// Action.
        action: RegisterAction,
        /// Ignore Existing Key.
        iekey: bool,
        /// PTPL change.
        cptpl: Cptpl,
        /// Current key.
        crkey: u64,
        /// New key.
        nrkey: u64,
    },
    /// Reservation Acquire.
    Acquire {
        /// Action.
        action: AcquireAction,
        /// Ignore Existing Key.
        iekey: bool,
        /// The type (None: a reserved code).
        rtype: Option<ResvType>,
        /// Current key.
        crkey: u64,
        /// Preempt key.
        prkey: u64,
    },
    /// Reservation Release.
    Release {
        /// Action.
        action: ReleaseAction,
        /// Ignore Existing Key.
        iekey: bool,
        /// The type given (raw).
        rtype: u8,
        /// Current key.
        crkey: u64,
    },
    /// Set Features Reservation Persistence (NVMe 2.0 §5.27.1.22).
    SetPtpl(bool),
}

impl ResvOp {
    /// Whether it asks to abort the commands of the hosts it preempts.
    pub fn aborts(&self) -> bool {
        matches!(
            self,
            ResvOp::Acquire {
                action: AcquireAction::PreemptAndAbort,
                ..
            }
        )
    }
}

fn conflict() -> Status {
    Status::RESERVATION_CONFLICT.with_dnr()
}

fn invalid() -> Status {
    Status::INVALID_FIELD.with_dnr()
}

impl ResvState {
    /// The registration of `host`.
    pub fn registrant(&self, host: &HostId) -> Option<&Registrant> {
        self.registrants.iter().find(|r| &r.hostid == host)
    }

    /// Whether `host` holds the reservation (every registrant does for the all-registrants
    /// types).
    pub fn holds(&self, host: &HostId) -> bool {
        match self.holder {
            Some(h) if h.rtype.all_registrants() => self.registrant(host).is_some(),
            Some(h) => &h.hostid == host,
            None => false,
        }
    }

    /// Whether `host` may run a command of `access` (NVMe 2.0 §8.19.2, Figure 474).
    pub fn allows(&self, host: &HostId, access: Access) -> bool {
        match self.holder {
            None => true,
            Some(_) if self.holds(host) => true,
            Some(h) => h.rtype.allows(access, self.registrant(host).is_some()),
        }
    }

    /// Run `op` for `host`: its status and effects. `ptpl_capable`: the namespace can persist
    /// its reservations (RESCAP bit 0). On failure nothing changed.
    pub fn apply(&mut self, host: &HostId, op: &ResvOp, ptpl_capable: bool) -> Result<Effects, Status> {
        let mut next = self.clone();
        let fx = match *op {
            ResvOp::Register {
                action,
                iekey,
                cptpl,
                crkey,
                nrkey,
            } => {
                if cptpl == Cptpl::Set && !ptpl_capable {
                    return Err(invalid());
                }
                let fx = next.register(host, action, iekey, crkey, nrkey)?;
                match cptpl {
                    Cptpl::Set => next.ptpl = true,
                    Cptpl::Clear => next.ptpl = false,
                    Cptpl::NoChange => {}
                }
                next.generation = next.generation.wrapping_add(1);
                fx
            }
            ResvOp::Acquire {
                action,
                iekey,
                rtype,
                crkey,
                prkey,
            } => {
                // IEKEY has no meaning for Acquire and Release since NVMe 1.3 (RESCAP bit 7);
                // nvmet and SPDK refuse it alike.
                let Some(rtype) = rtype.filter(|_| !iekey) else {
                    return Err(invalid());
                };
                next.check_key(host, crkey)?;
                match action {
                    AcquireAction::Acquire => next.acquire(host, rtype)?,
                    AcquireAction::Preempt | AcquireAction::PreemptAndAbort => {
                        let mut fx = next.preempt(host, rtype, prkey)?;
                        next.generation = next.generation.wrapping_add(1);
                        if action == AcquireAction::PreemptAndAbort {
                            fx.aborted = fx
                                .notices
                                .iter()
                                .filter(|(_, t)| *t == notice::REGISTRATION_PREEMPTED)
                                .map(|(h, _)| *h)
                                .collect();
                        }
                        fx
                    }
                }
            }
            ResvOp::Release {
                action,
                iekey,
                rtype,
                crkey,
            } => {
                if iekey {
                    return Err(invalid());
                }
                next.check_key(host, crkey)?;
                match action {
                    ReleaseAction::Release => next.release(host, rtype)?,
                    ReleaseAction::Clear => {
                        let fx = Effects {
                            notices: next
                                .registrants
                                .iter()
                                .filter(|r| &r.hostid != host)
                                .map(|r| (r.hostid, notice::RESERVATION_PREEMPTED))
                                .collect(),
                            aborted: Vec::new(),
                        };
                        next.registrants.clear();
                        next.holder = None;
                        next.generation = next.generation.wrapping_add(1);
                        fx
                    }
                }
            }
            ResvOp::SetPtpl(on) => {
                if on && !ptpl_capable {
                    return Err(invalid());
                }
                next.ptpl = on;
                Effects::default()
            }
        };
        *self = next;
        Ok(fx)
    }

    /// The host is a registrant with key `crkey` (else Reservation Conflict).
    fn check_key(&self, host: &HostId, crkey: u64) -> Result<(), Status> {
        match self.registrant(host) {
            Some(r) if r.key == crkey => Ok(()),
            _ => Err(conflict()),
        }
    }

    fn register(
        &mut self,
        host: &HostId,
        action: RegisterAction,
        iekey: bool,
        crkey: u64,
        nrkey: u64,
    ) -> Result<Effects, Status> {
        let pos = self.registrants.iter().position(|r| &r.hostid == host);
        match (action, pos) {
            // Registering again with the key it has is no change (NVM Command Set 1.0 §7.3).
            (RegisterAction::Register, Some(i)) if self.registrants[i].key == nrkey => Ok(Effects::default()),
            (RegisterAction::Register, Some(_)) => Err(conflict()),
            (RegisterAction::Register, None) => {
                self.registrants.push(Registrant {
                    hostid: *host,
                    key: nrkey,
                });
                Ok(Effects::default())
            }
            (RegisterAction::Unregister | RegisterAction::Replace, Some(i))
                if iekey || self.registrants[i].key == crkey =>
            {
                if action == RegisterAction::Replace {
                    self.registrants[i].key = nrkey;
                    return Ok(Effects::default());
                }
                Ok(self.unregister(i))
            }
            _ => Err(conflict()),
        }
    }

    /// Remove registrant `i`; the reservation goes with it when it was its only holder
    /// (NVMe 2.0 §8.19.6): the other registrants hear of it for the registrants-only types.
    fn unregister(&mut self, i: usize) -> Effects {
        let gone = self.registrants.remove(i);
        let mut fx = Effects::default();
        match self.holder {
            Some(h) if h.rtype.all_registrants() => {
                if self.registrants.is_empty() {
                    self.holder = None;
                } else if h.hostid == gone.hostid {
                    self.holder = Some(Holder {
                        hostid: self.registrants[0].hostid,
                        rtype: h.rtype,
                    });
                }
            }
            Some(h) if h.hostid == gone.hostid => {
                self.holder = None;
                if matches!(
                    h.rtype,
                    ResvType::WriteExclusiveRegistrantsOnly | ResvType::ExclusiveAccessRegistrantsOnly
                ) {
                    fx.notices = self.released_notices(&gone.hostid);
                }
            }
            _ => {}
        }
        fx
    }

    /// Reservation Released notices for every registrant but `host`.
    fn released_notices(&self, host: &HostId) -> Vec<(HostId, u8)> {
        self.registrants
            .iter()
            .filter(|r| &r.hostid != host)
            .map(|r| (r.hostid, notice::RESERVATION_RELEASED))
            .collect()
    }

    fn acquire(&mut self, host: &HostId, rtype: ResvType) -> Result<Effects, Status> {
        match self.holder {
            None => {
                self.holder = Some(Holder { hostid: *host, rtype });
                Ok(Effects::default())
            }
            // Acquiring what it holds already is no change; anything else conflicts.
            Some(h) if self.holds(host) && h.rtype == rtype => Ok(Effects::default()),
            Some(_) => Err(conflict()),
        }
    }

    /// Remove every registrant with key `prkey` but `host` (and `host` too when `all`), as
    /// preempted: their Registration Preempted notices. None removed: Reservation Conflict.
    fn remove_by_key(&mut self, host: &HostId, prkey: u64, with_self: bool) -> Result<Effects, Status> {
        let mut fx = Effects::default();
        let mut found = false;
        let mut i = 0;
        while i < self.registrants.len() {
            let r = self.registrants[i];
            if r.key == prkey && (with_self || &r.hostid != host) {
                found = true;
                let more = self.unregister(i);
                fx.notices.extend(more.notices);
                if &r.hostid != host {
                    fx.notices.push((r.hostid, notice::REGISTRATION_PREEMPTED));
                }
            } else {
                i += 1;
            }
        }
        if found { Ok(fx) } else { Err(conflict()) }
    }

    /// Preempt (NVMe 2.0 §8.19.5, Figure 477).
    fn preempt(&mut self, host: &HostId, rtype: ResvType, prkey: u64) -> Result<Effects, Status> {
        let Some(h) = self.holder else {
            // No reservation: only the registrants of that key go.
            return self.remove_by_key(host, prkey, true);
        };
        if h.rtype.all_registrants() {
            if prkey != 0 {
                return self.remove_by_key(host, prkey, true);
            }
            // Key 0: every other registrant goes and this host holds a reservation of the
            // new type. It becomes holder first, so the removal cannot release it.
            self.holder = Some(Holder { hostid: *host, rtype });
            let others: Vec<HostId> = self
                .registrants
                .iter()
                .map(|r| r.hostid)
                .filter(|id| id != host)
                .collect();
            self.registrants.retain(|r| &r.hostid == host);
            return Ok(Effects {
                notices: others
                    .into_iter()
                    .map(|id| (id, notice::REGISTRATION_PREEMPTED))
                    .collect(),
                aborted: Vec::new(),
            });
        }
        if h.hostid == *host {
            // Preempting itself changes the type; the others hear of a release when it did.
            self.holder = Some(Holder { hostid: *host, rtype });
            let notices = if h.rtype != rtype {
                self.released_notices(host)
            } else {
                Vec::new()
            };
            return Ok(Effects {
                notices,
                aborted: Vec::new(),
            });
        }
        let holder_key = self.registrant(&h.hostid).map(|r| r.key);
        if holder_key == Some(prkey) {
            self.holder = Some(Holder { hostid: *host, rtype });
            let mut fx = self.remove_by_key(host, prkey, false)?;
            if h.rtype != rtype {
                fx.notices.extend(self.released_notices(host));
            }
            return Ok(fx);
        }
        if prkey == 0 {
            return Err(invalid());
        }
        self.remove_by_key(host, prkey, true)
    }

    fn release(&mut self, host: &HostId, rtype: u8) -> Result<Effects, Status> {
        let Some(h) = self.holder else {
            return Ok(Effects::default());
        };
        // A registrant that does not hold it releases nothing (NVMe 2.0 §8.19.7).
        if !self.holds(host) {
            return Ok(Effects::default());
        }
        if h.rtype.code() != rtype {
            return Err(invalid());
        }
        self.holder = None;
        let notices = match h.rtype {
            ResvType::WriteExclusive | ResvType::ExclusiveAccess => Vec::new(),
            _ => self.released_notices(host),
        };
        Ok(Effects {
            notices,
            aborted: Vec::new(),
        })
    }

    /// The extended Reservation Status data structure (NVM Command Set 1.0 §7.6), `len`
    /// bytes.
    pub fn report(&self, len: usize) -> Vec<u8> {
        let regs: Vec<ReportEntry> = self
            .registrants
            .iter()
            .map(|r| ReportEntry {
                // Dynamic controller model: a registration is the host's, not a controller's.
                cntlid: 0xFFFF,
                holder: self.holds(&r.hostid),
                rkey: r.key,
                hostid: r.hostid,
            })
            .collect();
        report_ext(self.generation, self.holder.map(|h| h.rtype), self.ptpl, &regs, len)
    }
}

/// The reservations of one namespace as every reactor sees them.
#[derive(Debug)]
pub struct NsResv {
    /// A reservation is held (false: every command is allowed, the I/O path looks no
    /// further).
    held: AtomicBool,
    /// The state, swapped whole by the owner.
    state: ArcSwap<ResvState>,
    /// Where the state is kept while PTPL is set (None: it cannot be, RESCAP bit 0 clear).
    file: Option<PathBuf>,
}

impl NsResv {
    /// Reservations of a namespace whose state is kept in `file` (None: not persistent),
    /// restored from it when it exists. A file that cannot be read is an error naming it:
    /// a reservation is never silently dropped.
    pub fn open(file: Option<PathBuf>) -> Result<Self, TargetError> {
        let state = match &file {
            Some(p) if p.exists() => {
                let s = load(p)?;
                info!(
                    path = %p.display(),
                    registrants = s.registrants.len(),
                    held = ?s.holder.map(|h| h.rtype.name()),
                    "reservations restored"
                );
                s
            }
            _ => ResvState::default(),
        };
        Ok(Self {
            held: AtomicBool::new(state.holder.is_some()),
            state: ArcSwap::from_pointee(state),
            file,
        })
    }

    /// Reservations that are not persistent (RAM, simulated devices, tests).
    pub fn volatile() -> Self {
        Self {
            held: AtomicBool::new(false),
            state: ArcSwap::from_pointee(ResvState::default()),
            file: None,
        }
    }

    /// Whether the state can persist through power loss (RESCAP bit 0).
    pub fn ptpl_capable(&self) -> bool {
        self.file.is_some()
    }

    /// The state now.
    pub fn state(&self) -> Arc<ResvState> {
        self.state.load_full()
    }

    /// The I/O path's check: whether `host` may run a command of `access`; Reservation
    /// Conflict if not. One atomic load while no reservation is held.
    #[inline(always)]
    pub fn check(&self, host: &HostId, access: Access) -> Result<(), Status> {
        if !self.held.load(Ordering::Acquire) {
            return Ok(());
        }
        if self.state.load().allows(host, access) {
            Ok(())
        } else {
            Err(conflict())
        }
    }

    /// Apply `op` of `host` (on the owner thread only): persist, then publish.
    fn change(&self, host: &HostId, op: &ResvOp) -> Result<Effects, Status> {
        let mut next = ResvState::clone(&self.state.load());
        let was_ptpl = next.ptpl;
        let fx = next.apply(host, op, self.ptpl_capable())?;
        if let Some(path) = &self.file {
            let written = if next.ptpl {
                store(path, &next)
            } else if was_ptpl {
                fs::remove_file(path).or_else(|e| {
                    if e.kind() == std::io::ErrorKind::NotFound {
                        Ok(())
                    } else {
                        Err(e)
                    }
                })
            } else {
                Ok(())
            };
            if let Err(e) = written {
                warn!(path = %path.display(), "reservation state not written, command failed: {e}");
                return Err(Status::INTERNAL_ERROR);
            }
        }
        let held = next.holder.is_some();
        self.state.store(Arc::new(next));
        self.held.store(held, Ordering::Release);
        Ok(fx)
    }
}

/// The state file's form (JSON; host identifiers as UUID text).
#[derive(Serialize, Deserialize)]
struct StateFile {
    version: u32,
    generation: u32,
    registrants: Vec<FileRegistrant>,
    holder: Option<FileHolder>,
}

#[derive(Serialize, Deserialize)]
struct FileRegistrant {
    hostid: String,
    key: u64,
}

#[derive(Serialize, Deserialize)]
struct FileHolder {
    hostid: String,
    rtype: u8,
}

const STATE_VERSION: u32 = 1;

fn hostid_text(h: &HostId) -> String {
    uuid::Uuid::from_bytes(*h).hyphenated().to_string()
}

/// Read a state file; any fault is an error naming it.
fn load(path: &Path) -> Result<ResvState, TargetError> {
    let bad = |why: String| TargetError::ReservationState {
        path: path.to_path_buf(),
        why,
    };
    let text = fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let f: StateFile = serde_json::from_str(&text).map_err(|e| bad(format!("not a reservation state: {e}")))?;
    if f.version != STATE_VERSION {
        return Err(bad(format!(
            "version {} (this pollux reads {STATE_VERSION})",
            f.version
        )));
    }
    let id = |s: &str| {
        uuid::Uuid::parse_str(s)
            .map(|u| *u.as_bytes())
            .map_err(|e| bad(format!("host identifier {s:?}: {e}")))
    };
    let mut registrants = Vec::with_capacity(f.registrants.len());
    for r in &f.registrants {
        let hostid = id(&r.hostid)?;
        if registrants.iter().any(|x: &Registrant| x.hostid == hostid) {
            return Err(bad(format!("host {} registered twice", r.hostid)));
        }
        registrants.push(Registrant { hostid, key: r.key });
    }
    let holder = match &f.holder {
        None => None,
        Some(h) => {
            let rtype = ResvType::from_code(h.rtype).ok_or_else(|| bad(format!("reservation type {}", h.rtype)))?;
            let hostid = id(&h.hostid)?;
            if !registrants.iter().any(|r| r.hostid == hostid) {
                return Err(bad(format!("holder {} is not a registrant", h.hostid)));
            }
            Some(Holder { hostid, rtype })
        }
    };
    Ok(ResvState {
        generation: f.generation,
        registrants,
        holder,
        ptpl: true,
    })
}

/// Write a state file atomically and durably: a temporary file beside it, flushed, renamed
/// over it, the directory flushed. Readable by pollux's user alone: it holds the
/// registrants' keys, the secret each host preempts the others with.
fn store(path: &Path, s: &ResvState) -> std::io::Result<()> {
    let f = StateFile {
        version: STATE_VERSION,
        generation: s.generation,
        registrants: s
            .registrants
            .iter()
            .map(|r| FileRegistrant {
                hostid: hostid_text(&r.hostid),
                key: r.key,
            })
            .collect(),
        holder: s.holder.map(|h| FileHolder {
            hostid: hostid_text(&h.hostid),
            rtype: h.rtype.code(),
        }),
    };
    let text = serde_json::to_string_pretty(&f).map_err(std::io::Error::other)?;
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

/// A change's outcome, handed back to the command's connection.
pub type ResvDone = Result<Effects, Status>;
type Job = Box<dyn FnOnce() + Send>;

/// The owner thread's queue (None: it could not start; changes then run on the caller).
fn owner() -> Option<&'static mpsc::Sender<Job>> {
    static OWNER: OnceLock<Option<mpsc::Sender<Job>>> = OnceLock::new();
    OWNER
        .get_or_init(|| {
            let (tx, rx) = mpsc::channel::<Job>();
            match std::thread::Builder::new()
                .name("pollux-resv".into())
                .spawn(move || rx.into_iter().for_each(|job| job()))
            {
                Ok(_) => Some(tx),
                Err(e) => {
                    warn!("no reservation thread ({e}): reservation changes run on the reactors");
                    None
                }
            }
        })
        .as_ref()
}

/// Apply `op` of `host` to `ns` on the owner thread; `back` gets the outcome there (it sends
/// it on to the connection's reactor).
pub fn submit(ns: Arc<NsResv>, host: HostId, op: ResvOp, back: impl FnOnce(ResvDone) + Send + 'static) {
    let job = move || back(ns.change(&host, &op));
    match owner() {
        Some(tx) => {
            if let Err(mpsc::SendError(job)) = tx.send(Box::new(job)) {
                job();
            }
        }
        None => job(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: HostId = [0xA; 16];
    const B: HostId = [0xB; 16];
    const C: HostId = [0xC; 16];

    fn reg(s: &mut ResvState, h: &HostId, key: u64) -> Result<Effects, Status> {
        s.apply(
            h,
            &ResvOp::Register {
                action: RegisterAction::Register,
                iekey: false,
                cptpl: Cptpl::NoChange,
                crkey: 0,
                nrkey: key,
            },
            false,
        )
    }

    fn acq(
        s: &mut ResvState,
        h: &HostId,
        action: AcquireAction,
        t: u8,
        crkey: u64,
        prkey: u64,
    ) -> Result<Effects, Status> {
        s.apply(
            h,
            &ResvOp::Acquire {
                action,
                iekey: false,
                rtype: ResvType::from_code(t),
                crkey,
                prkey,
            },
            false,
        )
    }

    fn rel(s: &mut ResvState, h: &HostId, action: ReleaseAction, t: u8, crkey: u64) -> Result<Effects, Status> {
        s.apply(
            h,
            &ResvOp::Release {
                action,
                iekey: false,
                rtype: t,
                crkey,
            },
            false,
        )
    }

    #[test]
    fn register_unregister_replace_and_their_keys() {
        let mut s = ResvState::default();
        assert!(reg(&mut s, &A, 1).is_ok());
        assert!(reg(&mut s, &A, 1).is_ok(), "the same key again");
        assert_eq!(reg(&mut s, &A, 2), Err(conflict()), "another key");
        let replace = |crkey, iekey| ResvOp::Register {
            action: RegisterAction::Replace,
            iekey,
            cptpl: Cptpl::NoChange,
            crkey,
            nrkey: 9,
        };
        assert_eq!(s.apply(&A, &replace(5, false), false), Err(conflict()));
        assert!(s.apply(&A, &replace(5, true), false).is_ok(), "IEKEY");
        assert_eq!(s.registrant(&A).map(|r| r.key), Some(9));
        assert_eq!(s.apply(&B, &replace(0, true), false), Err(conflict()), "not registered");
        let gen_before = s.generation;
        let unreg = ResvOp::Register {
            action: RegisterAction::Unregister,
            iekey: false,
            cptpl: Cptpl::NoChange,
            crkey: 9,
            nrkey: 0,
        };
        assert!(s.apply(&A, &unreg, false).is_ok());
        assert_eq!(s.generation, gen_before + 1);
        assert!(s.registrants.is_empty());
        // PTPL only where the namespace can keep it.
        let ptpl = ResvOp::Register {
            action: RegisterAction::Register,
            iekey: false,
            cptpl: Cptpl::Set,
            crkey: 0,
            nrkey: 3,
        };
        assert_eq!(s.apply(&A, &ptpl, false), Err(invalid()));
        assert!(s.registrants.is_empty(), "nothing changed");
        assert!(s.apply(&A, &ptpl, true).is_ok());
        assert!(s.ptpl);
    }

    #[test]
    fn write_exclusive_lets_others_read_only_and_release_reopens() {
        let mut s = ResvState::default();
        reg(&mut s, &A, 1).ok();
        reg(&mut s, &B, 2).ok();
        assert_eq!(
            acq(&mut s, &A, AcquireAction::Acquire, 1, 7, 0),
            Err(conflict()),
            "wrong key"
        );
        assert_eq!(
            acq(&mut s, &C, AcquireAction::Acquire, 1, 0, 0),
            Err(conflict()),
            "not registered"
        );
        assert!(acq(&mut s, &A, AcquireAction::Acquire, 1, 1, 0).is_ok());
        assert!(
            acq(&mut s, &A, AcquireAction::Acquire, 1, 1, 0).is_ok(),
            "again: no change"
        );
        assert_eq!(
            acq(&mut s, &A, AcquireAction::Acquire, 2, 1, 0),
            Err(conflict()),
            "another type"
        );
        assert_eq!(acq(&mut s, &B, AcquireAction::Acquire, 1, 2, 0), Err(conflict()));
        assert!(s.allows(&A, Access::Write));
        assert!(s.allows(&B, Access::Read) && !s.allows(&B, Access::Write));
        assert!(s.allows(&C, Access::Read) && !s.allows(&C, Access::Write));
        // A non-holder's release changes nothing; the holder's with the wrong type is invalid.
        assert!(rel(&mut s, &B, ReleaseAction::Release, 1, 2).is_ok());
        assert!(s.holder.is_some());
        assert_eq!(rel(&mut s, &A, ReleaseAction::Release, 2, 1), Err(invalid()));
        assert_eq!(
            rel(&mut s, &A, ReleaseAction::Release, 1, 5),
            Err(conflict()),
            "wrong key"
        );
        let fx = rel(&mut s, &A, ReleaseAction::Release, 1, 1);
        assert_eq!(fx, Ok(Effects::default()), "type 1: no notices");
        assert!(s.holder.is_none() && s.allows(&C, Access::Write));
    }

    #[test]
    fn registrants_only_types_and_their_release_notices() {
        let mut s = ResvState::default();
        reg(&mut s, &A, 1).ok();
        reg(&mut s, &B, 2).ok();
        assert!(acq(&mut s, &A, AcquireAction::Acquire, 4, 1, 0).is_ok());
        assert!(s.allows(&B, Access::Write) && s.allows(&B, Access::Read));
        assert!(!s.allows(&C, Access::Read));
        let fx = rel(&mut s, &A, ReleaseAction::Release, 4, 1);
        assert_eq!(fx.map(|f| f.notices), Ok(vec![(B, notice::RESERVATION_RELEASED)]));
        // Unregistering the holder of a type-3 reservation releases it, with notices.
        assert!(acq(&mut s, &A, AcquireAction::Acquire, 3, 1, 0).is_ok());
        let unreg = ResvOp::Register {
            action: RegisterAction::Unregister,
            iekey: true,
            cptpl: Cptpl::NoChange,
            crkey: 0,
            nrkey: 0,
        };
        let fx = s.apply(&A, &unreg, false);
        assert_eq!(fx.map(|f| f.notices), Ok(vec![(B, notice::RESERVATION_RELEASED)]));
        assert!(s.holder.is_none());
    }

    #[test]
    fn all_registrants_types_outlive_their_acquirer() {
        let mut s = ResvState::default();
        reg(&mut s, &A, 1).ok();
        reg(&mut s, &B, 2).ok();
        assert!(acq(&mut s, &A, AcquireAction::Acquire, 6, 1, 0).is_ok());
        assert!(s.holds(&B), "every registrant holds it");
        assert!(
            acq(&mut s, &B, AcquireAction::Acquire, 6, 2, 0).is_ok(),
            "B holds it already"
        );
        assert!(!s.allows(&C, Access::Read));
        let unreg = |k| ResvOp::Register {
            action: RegisterAction::Unregister,
            iekey: false,
            cptpl: Cptpl::NoChange,
            crkey: k,
            nrkey: 0,
        };
        assert!(s.apply(&A, &unreg(1), false).is_ok());
        assert_eq!(s.holder.map(|h| h.rtype.code()), Some(6), "B still holds it");
        assert!(s.apply(&B, &unreg(2), false).is_ok());
        assert!(s.holder.is_none(), "gone with the last registrant");
        // Any registrant's release releases it.
        reg(&mut s, &A, 1).ok();
        reg(&mut s, &B, 2).ok();
        acq(&mut s, &A, AcquireAction::Acquire, 5, 1, 0).ok();
        let fx = rel(&mut s, &B, ReleaseAction::Release, 5, 2);
        assert_eq!(fx.map(|f| f.notices), Ok(vec![(A, notice::RESERVATION_RELEASED)]));
        assert!(s.holder.is_none());
    }

    #[test]
    fn preempt_moves_the_reservation_and_removes_the_preempted() {
        let mut s = ResvState::default();
        reg(&mut s, &A, 1).ok();
        reg(&mut s, &B, 2).ok();
        reg(&mut s, &C, 3).ok();
        acq(&mut s, &A, AcquireAction::Acquire, 1, 1, 0).ok();
        let g = s.generation;
        // B preempts A (its key) and asks for abort: A is out, notified, its commands aborted.
        let fx = acq(&mut s, &B, AcquireAction::PreemptAndAbort, 2, 2, 1).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(
            s.holder,
            Some(Holder {
                hostid: B,
                rtype: ResvType::ExclusiveAccess
            })
        );
        assert!(s.registrant(&A).is_none());
        assert_eq!(fx.aborted, vec![A]);
        assert!(fx.notices.contains(&(A, notice::REGISTRATION_PREEMPTED)));
        assert!(fx.notices.contains(&(C, notice::RESERVATION_RELEASED)), "type changed");
        assert_eq!(s.generation, g + 1);
        assert!(!s.allows(&A, Access::Read) && !s.allows(&C, Access::Read));
        // Preempting a key no one has conflicts; key 0 against a single holder is invalid.
        assert_eq!(acq(&mut s, &C, AcquireAction::Preempt, 2, 3, 99), Err(conflict()));
        assert_eq!(acq(&mut s, &C, AcquireAction::Preempt, 2, 3, 0), Err(invalid()));
        // A key other than the holder's removes only those registrants.
        reg(&mut s, &A, 7).ok();
        let fx = acq(&mut s, &C, AcquireAction::Preempt, 2, 3, 7);
        assert_eq!(fx.map(|f| f.notices), Ok(vec![(A, notice::REGISTRATION_PREEMPTED)]));
        assert_eq!(s.holder.map(|h| h.hostid), Some(B));
        // Without a reservation, preempt removes by key.
        let mut t = ResvState::default();
        reg(&mut t, &A, 1).ok();
        reg(&mut t, &B, 2).ok();
        assert!(acq(&mut t, &B, AcquireAction::Preempt, 1, 2, 1).is_ok());
        assert!(t.registrant(&A).is_none() && t.holder.is_none());
    }

    #[test]
    fn clear_removes_everything_and_tells_the_others() {
        let mut s = ResvState::default();
        reg(&mut s, &A, 1).ok();
        reg(&mut s, &B, 2).ok();
        acq(&mut s, &B, AcquireAction::Acquire, 2, 2, 0).ok();
        assert_eq!(
            rel(&mut s, &A, ReleaseAction::Clear, 0, 9),
            Err(conflict()),
            "wrong key"
        );
        let fx = rel(&mut s, &A, ReleaseAction::Clear, 0, 1);
        assert_eq!(fx.map(|f| f.notices), Ok(vec![(B, notice::RESERVATION_PREEMPTED)]));
        assert!(s.registrants.is_empty() && s.holder.is_none());
    }

    #[test]
    fn reserved_types_and_ignore_key_on_acquire_are_invalid() {
        let mut s = ResvState::default();
        reg(&mut s, &A, 1).ok();
        assert_eq!(acq(&mut s, &A, AcquireAction::Acquire, 0, 1, 0), Err(invalid()));
        assert_eq!(acq(&mut s, &A, AcquireAction::Acquire, 7, 1, 0), Err(invalid()));
        let iekey = ResvOp::Acquire {
            action: AcquireAction::Acquire,
            iekey: true,
            rtype: Some(ResvType::WriteExclusive),
            crkey: 1,
            prkey: 0,
        };
        assert_eq!(s.apply(&A, &iekey, false), Err(invalid()));
        assert!(s.holder.is_none());
    }

    #[test]
    fn the_state_file_round_trips_and_a_bad_one_is_named() {
        let dir = std::env::temp_dir().join(format!("pollux-resv-{}", std::process::id()));
        fs::create_dir_all(&dir).ok();
        let path = state_file(&dir, &[1; 16]);
        let mut s = ResvState::default();
        reg(&mut s, &A, 1).ok();
        reg(&mut s, &B, u64::MAX).ok();
        acq(&mut s, &B, AcquireAction::Acquire, 3, u64::MAX, 0).ok();
        s.ptpl = true;
        store(&path, &s).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(load(&path).ok(), Some(s.clone()));
        let mode = fs::metadata(&path).map(|m| m.permissions().mode()).unwrap_or(0o777);
        assert_eq!(mode & 0o077, 0, "the keys are readable by others: {mode:o}");
        fs::write(&path, "{\"version\": 1, \"generation\": 3").ok();
        let err = load(&path).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains(&path.display().to_string()), "{err}");
        assert!(NsResv::open(Some(path.clone())).is_err());
        fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn the_shared_cell_persists_before_it_publishes() {
        let dir = std::env::temp_dir().join(format!("pollux-resv-cell-{}", std::process::id()));
        fs::create_dir_all(&dir).ok();
        let path = state_file(&dir, &[2; 16]);
        let ns = NsResv::open(Some(path.clone())).unwrap_or_else(|e| panic!("{e}"));
        let register = ResvOp::Register {
            action: RegisterAction::Register,
            iekey: false,
            cptpl: Cptpl::Set,
            crkey: 0,
            nrkey: 5,
        };
        assert!(ns.change(&A, &register).is_ok());
        let acquire = ResvOp::Acquire {
            action: AcquireAction::Acquire,
            iekey: false,
            rtype: Some(ResvType::WriteExclusive),
            crkey: 5,
            prkey: 0,
        };
        assert!(ns.change(&A, &acquire).is_ok());
        assert_eq!(ns.check(&B, Access::Write), Err(conflict()));
        assert_eq!(ns.check(&B, Access::Read), Ok(()));
        // A restart finds it all.
        let again = NsResv::open(Some(path.clone())).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(again.state(), ns.state());
        assert_eq!(again.check(&B, Access::Write), Err(conflict()));
        // PTPL cleared: the file goes.
        assert!(ns.change(&A, &ResvOp::SetPtpl(false)).is_ok());
        assert!(!path.exists());
        // A directory that cannot be written: the change fails and nothing changes.
        let stuck = NsResv::open(Some(dir.join("missing").join("x.json"))).unwrap_or_else(|e| panic!("{e}"));
        let before = stuck.state();
        assert_eq!(stuck.change(&A, &register), Err(Status::INTERNAL_ERROR));
        assert_eq!(stuck.state(), before);
        fs::remove_dir_all(&dir).ok();
    }
}
