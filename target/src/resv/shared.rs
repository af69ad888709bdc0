//! [`NsResv`]: what every reactor reads (the state as a snapshot swapped whole, and a flag
//! that none is held), and the `pollux-resv` owner thread that applies every change.

use std::fs;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;

use arc_swap::ArcSwap;
use pollux_nvme::spec::Status;
use pollux_nvme::spec::resv::Access;
use tracing::{info, warn};

use super::file::{load, store};
use super::state::{Effects, HostId, ResvOp, ResvState, conflict};
use crate::error::TargetError;

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

    /// Take `state` as this namespace's (a hot upgrade: the old process's state, newer than
    /// any file), persisting it where PTPL asks.
    pub fn restore(&self, state: ResvState) {
        if state.ptpl
            && let Some(f) = &self.file
            && let Err(e) = store(f, &state)
        {
            warn!(path = %f.display(), error = %e, "reservations handed over could not be persisted");
        }
        self.held.store(state.holder.is_some(), Ordering::Release);
        self.state.store(Arc::new(state));
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
    pub(super) fn change(&self, host: &HostId, op: &ResvOp) -> Result<Effects, Status> {
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
