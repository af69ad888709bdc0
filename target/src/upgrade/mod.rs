//! Upgrade without downtime (`pollux ctl upgrade`, SIGUSR2): the running process starts the
//! new binary and hands it the listening sockets, every NVMe/TCP connection's socket and
//! each queue's and controller's state, so that hosts stay connected and see a pause, not an
//! error.
//!
//! The handover, old process ([`old`]) and new ([`new`]), over a Unix socket pair
//! ([`wire`]) carrying a versioned format ([`state`]):
//! 1. The old process starts `NEW --takeover 3` with its end of the pair as fd 3. The new
//!    process answers [`state::Msg::Hello`] with the formats it reads; the old one refuses
//!    (nothing paused yet) if its own is not among them.
//! 2. **Prepare** (nothing paused): the running conf (run-time changes included), the
//!    listeners, the control endpoints and the RAM namespaces' memfds go over. The new
//!    process builds its target from them, its reactors running but its listeners and
//!    control endpoints idle, and answers `Prepared`, or `Refuse` with why (a conf it does
//!    not accept, fewer reactors than controllers need).
//! 3. **Pause**: the old process stops accepting, and every queue holds the commands that
//!    arrive while those in flight run to their end ([`crate::queue::handover`]); once every
//!    queue is at that boundary (or [`PAUSE_LIMIT`] passed: the upgrade is refused and
//!    everything resumes), each queue stops reading and its state is taken.
//! 4. **Handover**: NVMe devices (VFIO) are let go of first: with every queue drained, each
//!    reactor closes its channels and each device is shut down and its VFIO handles closed
//!    (a VFIO group opens in one process at a time; the queues' DMA memory is this
//!    process's). The queues' state and sockets and the reservations go over; the new
//!    process brings the devices up (their namespaces join its target as a run-time
//!    change would: it started without them), installs every queue, paused, and answers
//!    `Ready` with how long the devices took ([`Report::device_init_ms`]). A rollback after
//!    this brings the devices up again in the old process.
//! 5. **Commit**: the old process sends `Commit`; the new one answers `Serving` before it
//!    touches any socket, then resumes every queue (held commands first) and its listeners.
//!    Until that answer everything is still the old process's: a new process that dies or
//!    stays silent is killed and the old one takes everything back exactly as it paused it.
//!    Once the answer came, the old process touches no socket again and exits without
//!    closing anything (the sockets live on in the new one).
//!
//! Any failure before `Commit` (the new process refuses, exits, is killed, or does not
//! answer within [`STEP_LIMIT`]) rolls back: the new process is killed and the old one
//! resumes its listeners and queues, running what they held. One upgrade at a time.
//!
//! What does not move: TLS connections (their keys live in this process's OpenSSL; this
//! kernel has no kTLS) and connections still authenticating close with the old process,
//! for their hosts to reconnect; so do the I/O queues of a controller whose admin queue
//! stays. Everything else moves.

pub mod new;
pub mod old;
pub mod reactors;
pub use crate::handover as state;
pub mod wire;

use std::time::Duration;

/// How long the queues may take to reach a command boundary before the upgrade is given up.
pub const PAUSE_LIMIT: Duration = Duration::from_secs(5);
/// How long each step may take the other process.
pub const STEP_LIMIT: Duration = Duration::from_secs(30);
/// How long the old process waits for Ready when the new one brings NVMe devices up first
/// (a controller's enable may take up to CAP.TO, NVMe 2.0 §3.1.3.1).
pub const DEVICE_LIMIT: Duration = Duration::from_secs(60);

/// Why an upgrade did not happen (the old process serves on, as before).
#[derive(Debug, thiserror::Error)]
pub enum UpgradeError {
    /// Another upgrade is under way.
    #[error("an upgrade is already in progress")]
    InProgress,
    /// The new binary could not be started.
    #[error("cannot start {path}: {source}")]
    Spawn {
        /// The binary.
        path: std::path::PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The new process exited (or closed the handover socket) before it was done.
    #[error("the new process ended during the handover{status}")]
    Exited {
        /// Its exit status, when known (", exit status 3").
        status: String,
    },
    /// The other side closed the handover socket.
    #[error("the other process closed the handover socket")]
    PeerGone,
    /// The other side did not answer in time.
    #[error("the other process did not answer within {}s", STEP_LIMIT.as_secs())]
    Timeout,
    /// The new process refused.
    #[error("the new process refused: {0}")]
    Refused(String),
    /// The formats do not meet.
    #[error("state format {ours} is not one the new binary reads ({oldest}..={newest})")]
    Format {
        /// What this binary writes.
        ours: u32,
        /// The oldest it reads.
        oldest: u32,
        /// The newest it reads.
        newest: u32,
    },
    /// The queues did not reach a command boundary in time.
    #[error("{busy} queues were still busy after {}s ({why}): nothing was handed over", PAUSE_LIMIT.as_secs())]
    NotQuiet {
        /// How many.
        busy: usize,
        /// The first one's reason, with its peer.
        why: String,
    },
    /// A reactor did not answer.
    #[error("reactor {0} did not answer")]
    Reactor(usize),
    /// A message out of turn or malformed.
    #[error("handover protocol: {0}")]
    Protocol(String),
    /// A message could not be encoded.
    #[error("handover state: {0}")]
    Encode(String),
    /// A system call failed.
    #[error("cannot {what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// Something this target serves cannot be handed over.
    #[error("{0}")]
    Unsupported(String),
    /// The new process's side: the target could not start from the state.
    #[error("cannot start from the handed state: {0}")]
    Start(String),
}

/// What an upgrade did.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Report {
    /// The new process.
    pub pid: u32,
    /// Its version and commit.
    pub version: String,
    /// Queues handed over.
    pub queues: usize,
    /// Queues that stayed (closed with the old process), and why, by reason.
    pub stayed: Vec<(String, usize)>,
    /// From the pause's start to the new process serving, in ms: the longest any queue
    /// waited.
    pub pause_ms: f64,
    /// From the command to the new process serving, in ms.
    pub total_ms: f64,
    /// NVMe devices let go of by this process and brought up by the new one (the hosts'
    /// queues wait meanwhile: part of `pause_ms`).
    #[serde(default)]
    pub devices: usize,
    /// Shutting them down here, ms.
    #[serde(default)]
    pub device_release_ms: f64,
    /// Bringing them up in the new process (controller reset and enable, Identify, I/O
    /// queues), ms.
    #[serde(default)]
    pub device_init_ms: f64,
}

/// Under systemd (`NOTIFY_SOCKET`), say process `pid` is the service's main process now
/// (`MAINPID`), so that the old one's exit does not end the service (the unit needs
/// `NotifyAccess=all`). The old process says it before it exits (systemd reads
/// notifications before it reaps), the new one once it serves.
pub fn notify_systemd(pid: u32) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let msg = format!("MAINPID={}\nREADY=1\n", pid);
    let sock = match std::os::unix::net::UnixDatagram::unbound() {
        Ok(s) => s,
        Err(e) => return tracing::warn!(error = %e, "upgrade: cannot notify systemd"),
    };
    let bytes = path.as_encoded_bytes();
    let res = if let Some(abs) = bytes.strip_prefix(b"@") {
        use std::os::linux::net::SocketAddrExt;
        std::os::unix::net::SocketAddr::from_abstract_name(abs).and_then(|a| sock.send_to_addr(msg.as_bytes(), &a))
    } else {
        sock.send_to(msg.as_bytes(), &path)
    };
    if let Err(e) = res {
        tracing::warn!(error = %e, "upgrade: cannot notify systemd");
    }
}
