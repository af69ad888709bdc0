//! [`NsResv`]: what every reactor reads (the state as a snapshot swapped whole, and a flag
//! that none is held), and the `pollux-resv` owner thread that applies every change.

use std::fs;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::mpsc;

use arc_swap::ArcSwap;
use pollux_nvme::spec::Status;
use pollux_nvme::spec::resv::Access;
use tracing::{info, warn};

use super::cluster::Clustered;
use super::file::{load, store};
use super::state::{Effects, HostId, ResvOp, ResvState, conflict};
use crate::error::TargetError;

/// The reservations of one namespace as every reactor sees them.
#[derive(Debug)]
pub struct NsResv {
    /// What the I/O path looks at first: [`FREE`] (every command is allowed, it looks no
    /// further), [`HELD`] (a reservation is held: the state decides) or [`UNCERTAIN`].
    gate: AtomicU8,
    /// The state, swapped whole by the owner.
    state: ArcSwap<ResvState>,
    /// Where the state is kept while PTPL is set (None: it cannot be, RESCAP bit 0 clear).
    file: Option<PathBuf>,
    /// Kept in the cluster instead, for every gateway ([`super::cluster`]).
    cluster: Option<Clustered>,
}

/// No reservation is held.
const FREE: u8 = 0;
/// A reservation is held.
const HELD: u8 = 1;
/// The state kept in the cluster cannot be seen now: no I/O is admitted.
const UNCERTAIN: u8 = 2;
/// As [`UNCERTAIN`], because this gateway's cluster client is blocklisted (its gateway group
/// fenced it): no I/O is admitted, with a path status.
const FENCED: u8 = 3;

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
            gate: AtomicU8::new(if state.holder.is_some() { HELD } else { FREE }),
            state: ArcSwap::from_pointee(state),
            file,
            cluster: None,
        })
    }

    /// Reservations that are not persistent (RAM, simulated devices, tests).
    pub fn volatile() -> Self {
        Self {
            gate: AtomicU8::new(FREE),
            state: ArcSwap::from_pointee(ResvState::default()),
            file: None,
            cluster: None,
        }
    }

    pub(super) fn with_cluster(state: ResvState, c: Clustered) -> Self {
        Self {
            gate: AtomicU8::new(if state.holder.is_some() { HELD } else { FREE }),
            state: ArcSwap::from_pointee(state),
            file: None,
            cluster: Some(c),
        }
    }

    pub(super) fn cluster(&self) -> Option<&Clustered> {
        self.cluster.as_ref()
    }

    /// Swap in `state` and set the gate (`held`: it holds a reservation; `uncertain`: the
    /// cluster's state cannot be seen).
    pub(super) fn publish_state(&self, state: ResvState, held: bool, uncertain: bool) {
        self.state.store(Arc::new(state));
        self.set_gate(held, uncertain);
    }

    pub(super) fn set_gate(&self, held: bool, uncertain: bool) {
        let g = if uncertain {
            UNCERTAIN
        } else if held {
            HELD
        } else {
            FREE
        };
        self.gate.store(g, Ordering::Release);
    }

    /// Where the state is kept, for `ctl subsystems`: "cluster" (every gateway of the
    /// store's cluster shares it), "target" (this target's own, persisted in its state
    /// directory while PTPL is set) or "volatile" (this target's own, lost at exit).
    pub fn kind(&self) -> &'static str {
        if self.cluster.is_some() {
            "cluster"
        } else if self.file.is_some() {
            "target"
        } else {
            "volatile"
        }
    }

    /// Take `state` as this namespace's (a hot upgrade: the old process's state, newer than
    /// any file), persisting it where PTPL asks.
    pub fn restore(&self, state: ResvState) {
        if self.cluster.is_some() {
            // The cluster's object is the state: the new process read it at open.
            return;
        }
        if state.ptpl
            && let Some(f) = &self.file
            && let Err(e) = store(f, &state)
        {
            warn!(path = %f.display(), error = %e, "reservations handed over could not be persisted");
        }
        let held = state.holder.is_some();
        self.publish_state(state, held, false);
    }

    /// Whether the state can persist through power loss (RESCAP bit 0): kept in a file or
    /// in the cluster.
    pub fn ptpl_capable(&self) -> bool {
        self.file.is_some() || self.cluster.is_some()
    }

    /// The state now.
    pub fn state(&self) -> Arc<ResvState> {
        self.state.load_full()
    }

    /// The state for a Reservation Report: Asymmetric Access Transition while the cluster's
    /// state cannot be seen.
    pub fn report_state(&self) -> Result<Arc<ResvState>, Status> {
        match self.gate.load(Ordering::Acquire) {
            UNCERTAIN => Err(super::UNSEEN),
            FENCED => Err(Status::ANA_INACCESSIBLE),
            _ => Ok(self.state()),
        }
    }

    /// This gateway's cluster client is blocklisted: admit nothing, with ANA Inaccessible, a
    /// path status a multipath host retries on another gateway at once (Namespace Not Ready
    /// is no path error: Linux's multipath fails the I/O with it).
    pub(super) fn set_fenced(&self) {
        self.gate.store(FENCED, Ordering::Release);
    }

    /// Whether I/O is refused for want of the cluster (its state unseen, or this gateway's
    /// client blocklisted), not for a reservation.
    pub fn cut_off(&self) -> bool {
        matches!(self.gate.load(Ordering::Acquire), UNCERTAIN | FENCED)
    }

    /// The I/O path's check: whether `host` may run a command of `access`; Reservation
    /// Conflict if not, [`super::UNSEEN`] (a path status) while a cluster's state cannot be
    /// seen. One atomic load while no reservation is held.
    #[inline(always)]
    pub fn check(&self, host: &HostId, access: Access) -> Result<(), Status> {
        match self.gate.load(Ordering::Acquire) {
            FREE => Ok(()),
            HELD if self.state.load().allows(host, access) => Ok(()),
            HELD => Err(conflict()),
            FENCED => Err(Status::ANA_INACCESSIBLE),
            _ => Err(super::UNSEEN),
        }
    }

    /// Apply `op` of `host` (on the owner thread only): persist, then publish.
    pub(super) fn change(&self, host: &HostId, op: &ResvOp) -> Result<Effects, Status> {
        if let Some(c) = &self.cluster {
            return self.change_clustered(c, host, op);
        }
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
        self.publish_state(next, held, false);
        Ok(fx)
    }
}

/// A change's outcome, handed back to the command's connection.
pub type ResvDone = Result<Effects, Status>;
pub(super) type Job = Box<dyn FnOnce() + Send>;

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

/// Apply `op` of `host` to `ns` on its owner thread; `back` gets the outcome there (it sends
/// it on to the connection's reactor). A namespace kept in a cluster has an owner thread of
/// its own: its changes wait on the cluster and the other gateways, and must not hold up
/// other namespaces' (nor another in-process target's acknowledgement).
pub fn submit(ns: Arc<NsResv>, host: HostId, op: ResvOp, back: impl FnOnce(ResvDone) + Send + 'static) {
    let tx: Option<mpsc::Sender<Job>> = match ns.cluster().and_then(|c| c.owner()) {
        Some(tx) => Some(tx.clone()),
        None => owner().cloned(),
    };
    let job = move || back(ns.change(&host, &op));
    match tx {
        Some(tx) => {
            if let Err(mpsc::SendError(job)) = tx.send(Box::new(job)) {
                job();
            }
        }
        None => job(),
    }
}
