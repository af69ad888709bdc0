//! What a connection knows of the path that accepted it (the listener's address, TLS mode,
//! ANA states and open-connection count) and of its place ([`crate::placement`]). Its own
//! module so that the listener (which makes it) and the connection (which keeps it) need
//! not import each other.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use pollux_conf::TlsMode;

use crate::ana::AnaStates;
use crate::placement::Placed;

/// What a connection takes from the listener that accepted it.
#[derive(Debug, Clone, Default)]
pub struct Path {
    /// The listener's bound address (None: unknown), which decides the subsystems a host
    /// may connect to through it ([`crate::subsystem::Subsystem::served_on`]).
    pub addr: Option<SocketAddr>,
    /// The listener's TLS mode.
    pub tls: TlsMode,
    /// The ANA states of its path.
    pub ana: Arc<AnaStates>,
    /// The listener's count of open connections (the connection decrements it as it goes).
    pub open: Arc<AtomicU64>,
    /// Its place among its host address's connections (counted until it drops).
    pub placed: Option<Arc<Placed>>,
}
