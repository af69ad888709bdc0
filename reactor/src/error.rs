//! The reactor crate's one error type.

use std::io;

/// Errors from starting, configuring or running reactors.
#[derive(Debug, thiserror::Error)]
pub enum ReactorError {
    /// The configured core does not exist or the process may not run on it.
    #[error("reactor {reactor}: core {core} is not available to this process (allowed cores: {allowed:?})")]
    CoreNotAllowed {
        /// Reactor index.
        reactor: usize,
        /// The requested core.
        core: usize,
        /// The cores this process may use (sched_getaffinity).
        allowed: Vec<usize>,
    },
    /// Two reactors were configured on the same core.
    #[error("core {core} is configured for more than one reactor")]
    DuplicateCore {
        /// The duplicated core.
        core: usize,
    },
    /// No reactor was configured.
    #[error("no reactor configured")]
    NoReactors,
    /// A system call failed.
    #[error("reactor {reactor}: {what}: {source}")]
    Sys {
        /// Reactor index (usize::MAX before any reactor exists).
        reactor: usize,
        /// What was being done.
        what: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A work source cannot run in the requested mode.
    #[error("reactor {reactor}: source '{source_name}' cannot run in interrupt mode: it has no fd to wake on")]
    NeedsPolling {
        /// Reactor index.
        reactor: usize,
        /// The source's name.
        source_name: String,
    },
    /// The reactor's init function failed.
    #[error("reactor {reactor}: init failed: {source}")]
    Init {
        /// Reactor index.
        reactor: usize,
        /// Why.
        #[source]
        source: crate::runtime::InitError,
    },
    /// A reactor thread panicked or could not be spawned/joined.
    #[error("reactor {reactor}: thread failed: {message}")]
    Thread {
        /// Reactor index.
        reactor: usize,
        /// What happened.
        message: String,
    },
    /// The addressed reactor does not exist or has stopped.
    #[error("reactor {reactor} is not running")]
    NotRunning {
        /// Reactor index.
        reactor: usize,
    },
}

/// A configuration spelling that names none of an enum's values (`"sometimes"` for a
/// [`crate::Polling`]); the conf's own error message, shown as the conf gives it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {given:?}: expected {expected}")]
pub struct UnknownSpelling {
    /// What was being named (`"polling"`, `"sleep policy"`).
    pub what: &'static str,
    /// The spelling given.
    pub given: String,
    /// The accepted spellings, as a sentence (`"\"spin\" or \"sleep\""`).
    pub expected: &'static str,
}

/// Result alias for this crate.
pub type Result<T, E = ReactorError> = std::result::Result<T, E>;
