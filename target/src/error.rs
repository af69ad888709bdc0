//! The target crate's one error type.

use std::net::SocketAddr;

/// Errors from starting or running the target.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    /// The conf file is invalid.
    #[error(transparent)]
    Conf(#[from] pollux_conf::ConfError),
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
    #[error("subsystem {nqn} namespace {nsid}: {message}")]
    Backend {
        /// Subsystem NQN.
        nqn: String,
        /// Namespace id.
        nsid: u32,
        /// What went wrong.
        message: String,
    },
    /// A reload was asked of a target running the embedded default.
    #[error("running the embedded default configuration: there is no conf file to reload")]
    NoConfFile,
    /// The reactors could not be started or stopped.
    #[error(transparent)]
    Reactor(#[from] pollux_reactor::ReactorError),
}
