//! The target crate's one error type.

use std::net::SocketAddr;

/// Errors from starting or running the target.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    /// The conf file is invalid.
    #[error(transparent)]
    Conf(#[from] pollux_conf::ConfError),
    /// A gateway group's configuration cannot be merged into this gateway's.
    #[error(transparent)]
    Group(#[from] pollux_conf::group::GroupError),
    /// A listener could not be bound.
    #[error("listener {addr}: {source}")]
    Listen {
        /// The configured address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A namespace backend could not be opened.
    #[error("subsystem {nqn} namespace {nsid}: {source}")]
    Backend {
        /// Subsystem NQN.
        nqn: String,
        /// Namespace id.
        nsid: u32,
        /// What went wrong.
        #[source]
        source: Box<TargetError>,
    },
    /// A namespace's reservation state file could not be read: the target does not start
    /// rather than drop a reservation (NVMe 2.0 §8.19.4, Persist Through Power Loss).
    #[error("reservation state {}: {why}", path.display())]
    ReservationState {
        /// The state file.
        path: std::path::PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// The object in a cluster that holds a namespace's reservations for every gateway
    /// could not be set up.
    #[error("reservation object {object}: {why}")]
    ReservationCluster {
        /// Pool, RADOS namespace and object.
        object: String,
        /// What failed.
        why: String,
    },
    /// A namespace's store could not be opened or used (memory, a file, an NVMe device, an
    /// RBD image, a thread or a channel of it).
    #[error(transparent)]
    Store(#[from] pollux_store::StoreError),
    /// A referral leads back to one of this target's own listeners (known once bound).
    #[error(
        "referral {referral} is this target's own listener {listener}: a referral points hosts at another target's discovery controller"
    )]
    SelfReferral {
        /// The referral's address.
        referral: SocketAddr,
        /// The listener it reaches, as bound.
        listener: SocketAddr,
    },
    /// A subsystem's controller id range holds fewer ids than the target runs reactors (the
    /// conf's `cores` changed, which takes effect only at the next start).
    #[error(
        "subsystem {nqn}: the controller ID range {min}..={max} holds fewer IDs than the {reactors} running reactors, one each at least"
    )]
    CntlidRange {
        /// The subsystem.
        nqn: String,
        /// `min_cntlid`.
        min: u16,
        /// `max_cntlid`.
        max: u16,
        /// Reactors running.
        reactors: usize,
    },
    /// A run-time change while a hot upgrade hands the target over.
    #[error("an upgrade is in progress: try again when it is done")]
    Upgrading,
    /// A reload was asked of a target running the embedded default.
    #[error("running the embedded default configuration: there is no conf file to reload")]
    NoConfFile,
    /// A thread of the target's own (the gateway agent) could not be started.
    #[error("cannot start thread {name}: {source}")]
    Thread {
        /// The thread's name.
        name: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The reactors could not be started or stopped.
    #[error(transparent)]
    Reactor(#[from] pollux_reactor::ReactorError),
}
