//! The control plane: a JSON-RPC 2.0 Unix socket (`[control] socket`), a Prometheus text
//! endpoint (`[control] metrics`), and their clients `pollux ctl` and `pollux top`.
//!
//! Both endpoints are served by one dedicated control thread (plus a short-lived thread per
//! connected client), never by a reactor: the control plane is not the I/O path. It reads
//! reactor accounting from the reactors' [`StatsCell`](pollux_reactor::StatsCell)s and the
//! namespace counters from the shared snapshot (both lock-free reads), and reaches reactor
//! state (controllers, modes) only by message ([`Remote::send`](pollux_reactor::Remote::send)),
//! waiting for the reply on a std channel with a timeout. The only locks it takes are its own.
//!
//! Protocol: JSON-RPC 2.0 requests, each a JSON value of at most [`MAX_LINE`] bytes, one per
//! line or simply one after another (SPDK's client sends them pretty-printed, without a
//! newline), one response per line; a request without an `id` is a notification and gets no
//! response. SPDK's methods are answered too ([`rpc`]'s `spdk`). Methods:
//! `version`, `reactors`, `subsystems`, `controllers`, `set_mode {reactor, mode}`,
//! `set_cpu_budget {reactor, budget}` (see [`rpc`]).

pub mod cli;
pub mod client;
pub mod format;
pub mod methods;
pub mod metrics;
pub mod rpc;
pub mod server;
pub mod top;
pub mod verbs;
pub mod view;

use std::path::PathBuf;

pub use client::Client;
pub use server::{Bound, ControlServer};

/// Longest request line accepted on the control socket, in bytes (newline excluded).
pub const MAX_LINE: usize = 64 * 1024;

/// The socket `pollux ctl` and `pollux top` use when neither `--socket` nor a conf names one.
pub const DEFAULT_SOCKET: &str = pollux_conf::DEFAULT_CONTROL_SOCKET;

/// Errors of the control plane, its server and its clients.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// A live pollux already accepts connections on the socket path.
    #[error("another pollux is already serving the control socket {path} (stop it, or set another [control] socket)")]
    SocketInUse {
        /// The socket path.
        path: PathBuf,
    },
    /// The socket path exists and is not a socket: it is not ours to remove.
    #[error("control socket path {path} exists and is not a socket; refusing to remove it")]
    NotASocket {
        /// The path.
        path: PathBuf,
    },
    /// Binding or preparing an endpoint failed.
    #[error("control: cannot {what}: {source}")]
    Endpoint {
        /// What was being done, e.g. `bind the control socket /run/pollux.sock`.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A client could not reach the control socket.
    #[error("cannot connect to the control socket {path}: {source} (is pollux running with [control] socket set?)")]
    Connect {
        /// The socket path.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// An I/O error on an established control connection.
    #[error("control connection: {0}")]
    Io(#[from] std::io::Error),
    /// The peer broke the protocol (not JSON, not JSON-RPC 2.0, closed without answering).
    #[error("control protocol: {0}")]
    Protocol(String),
    /// The server answered with a JSON-RPC error.
    #[error("{message} (JSON-RPC error {code})")]
    Rpc {
        /// JSON-RPC error code.
        code: i64,
        /// Its message.
        message: String,
    },
    /// A conf file named by `--config` named no socket, or a command line is no request.
    #[error("{0}")]
    Conf(String),
}
