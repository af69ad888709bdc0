//! Why a connection closed: one typed value per cause, with the context the log needs
//! ([`CloseReason`]), and per-reactor counts of closes by kind ([`CloseCounts`]) that the
//! control plane exports as `pollux_connections_closed_total{reactor, reason}`.
//!
//! A fatal NVMe/TCP error (NVMe/TCP 1.0 §3.6.2.3) carries one of these as the reason for its
//! C2HTermReq ([`crate::tcp::Fatal`]); the queue's own reasons (keep-alive, Disconnect,
//! a deleted controller) end the connection without one.

use std::io;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;

use pollux_nvme::tcp::{PduError, PduType};

use pollux_link::tls::TlsError;

/// Why a connection closed. Display is the log's reason text. Small (the TLS errors are
/// boxed): the receive path returns it in every `fill`'s `Result`.
#[derive(Debug, thiserror::Error)]
pub enum CloseReason {
    // ------------------------------------------------------------- the socket and TLS
    /// The host closed its side (EOF).
    #[error("peer closed the connection")]
    PeerClosed,
    /// Reading the socket failed.
    #[error("read: {0}")]
    Read(#[source] io::Error),
    /// Writing the socket failed.
    #[error("write: {0}")]
    Write(#[source] io::Error),
    /// A TLS session could not be set up for a host that began a handshake.
    #[error("TLS: {0}")]
    TlsSetup(#[source] Box<TlsError>),
    /// The TLS handshake failed (NVMe/TCP 1.0 §3.6.1.3, RFC 8446).
    #[error("TLS handshake failed: {0}")]
    TlsHandshake(#[source] Box<TlsError>),
    /// Plaintext NVMe/TCP on a listener whose TLS is required.
    #[error("plaintext NVMe/TCP on a listener that requires TLS")]
    TlsRequired,

    // ------------------------------------------------------------- fatal NVMe/TCP errors
    /// A PDU the framing rejects: bad header field, header digest error, data limit
    /// exceeded (NVMe/TCP 1.0 §3.6.2.3, §3.6.2.4).
    #[error("{0}")]
    BadPdu(PduError),
    /// A PDU out of sequence: ICReq not first, or twice (NVMe/TCP 1.0 §3.6.2.1).
    #[error("{0}")]
    PduSequence(&'static str),
    /// A PDU larger than the receive buffer (cannot happen once the header bounded it).
    #[error("PDU larger than the buffer")]
    PduTooLarge,
    /// ICReq asked for a host PDU data alignment other than 0 (NVMe/TCP 1.0 §3.6.2.2).
    #[error("HPDA other than 0")]
    HpdaUnsupported,
    /// A controller-to-host PDU from the host.
    #[error("{0:?} is not a host-to-controller PDU")]
    NotHostToController(PduType),
    /// More commands outstanding than the queue has entries (NVMe-oF 1.1 §3.3.1).
    #[error("more than {entries} commands outstanding on a queue of that size")]
    SqOverflow {
        /// The queue's size agreed at Connect.
        entries: u32,
    },
    /// H2CData outside the R2T it answers (NVMe/TCP 1.0 §3.6.2.7).
    #[error("H2CData outside its R2T")]
    DataOutOfRange,
    /// H2CData with LAST_PDU before the end of its R2T (NVMe/TCP 1.0 §3.6.2.7).
    #[error("H2CData with LAST_PDU before the end of its R2T")]
    LastPduEarly,
    /// H2CData ending its R2T without LAST_PDU (NVMe/TCP 1.0 §3.6.2.7).
    #[error("H2CData ending its R2T without LAST_PDU")]
    LastPduMissing,
    /// H2CData whose TTAG names no outstanding R2T (NVMe/TCP 1.0 §3.6.2.7).
    #[error("H2CData for no outstanding R2T")]
    UnknownTtag,
    /// The host sent H2CTermReq (NVMe/TCP 1.0 §3.6.2.3).
    #[error("host terminated the connection")]
    HostTermReq,

    // ------------------------------------------------------------- deadlines
    /// The TLS handshake did not finish within `[transport] setup_timeout_ms`.
    #[error("TLS handshake timeout")]
    TlsHandshakeTimeout,
    /// No ICReq within `[transport] setup_timeout_ms`.
    #[error("ICReq timeout")]
    IcReqTimeout,
    /// No Connect within `[transport] setup_timeout_ms`.
    #[error("Connect timeout")]
    ConnectTimeout,
    /// The queue did not authenticate in time (NVMe 2.0 §8.13).
    #[error("authentication timeout")]
    AuthTimeout,
    /// No command within the Keep Alive Timeout (NVMe 2.0 §3.9).
    #[error("keep-alive timeout")]
    KeepAliveTimeout,

    // ------------------------------------------------------------- the queue and controller
    /// Disconnect on an I/O queue (NVMe-oF 1.1 §6.4).
    #[error("Disconnect command")]
    Disconnect,
    /// The controller was reset (CC.EN cleared, NVMe 2.0 §3.7.2): its I/O queues go.
    #[error("controller reset")]
    ControllerReset,
    /// The controller of this I/O queue was deleted.
    #[error("controller deleted")]
    ControllerDeleted,
    /// The listener the queue came through no longer serves its subsystem.
    #[error("listener no longer serves the subsystem")]
    ListenerRemoved,
    /// The queue's subsystem was removed.
    #[error("subsystem removed")]
    SubsystemRemoved,
    /// The queue's host is no longer allowed on its subsystem.
    #[error("host no longer allowed")]
    HostNotAllowed,
}

/// The kind of a [`CloseReason`], without its context: what the close counters are
/// indexed by and what the metric's `reason` label says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CloseKind {
    /// [`CloseReason::PeerClosed`].
    PeerClosed,
    /// [`CloseReason::Read`] and [`CloseReason::Write`].
    SocketError,
    /// [`CloseReason::TlsSetup`] and [`CloseReason::TlsHandshake`].
    TlsError,
    /// [`CloseReason::TlsRequired`].
    TlsRequired,
    /// [`CloseReason::BadPdu`] for an invalid header field or unknown PDU type
    /// (NVMe/TCP 1.0 §3.6.2.3).
    BadPduHeader,
    /// [`CloseReason::BadPdu`] with a header digest error (NVMe/TCP 1.0 §3.6.2.4).
    HeaderDigest,
    /// [`CloseReason::BadPdu`] over a data transfer limit, [`CloseReason::PduTooLarge`].
    DataLimitExceeded,
    /// [`CloseReason::PduSequence`].
    PduSequence,
    /// [`CloseReason::HpdaUnsupported`].
    UnsupportedParameter,
    /// [`CloseReason::NotHostToController`].
    WrongDirection,
    /// [`CloseReason::SqOverflow`].
    SqOverflow,
    /// [`CloseReason::DataOutOfRange`], [`CloseReason::LastPduEarly`],
    /// [`CloseReason::LastPduMissing`].
    DataOutOfRange,
    /// [`CloseReason::UnknownTtag`].
    UnknownTtag,
    /// [`CloseReason::HostTermReq`].
    HostTermReq,
    /// [`CloseReason::TlsHandshakeTimeout`], [`CloseReason::IcReqTimeout`],
    /// [`CloseReason::ConnectTimeout`].
    SetupTimeout,
    /// [`CloseReason::AuthTimeout`].
    AuthTimeout,
    /// [`CloseReason::KeepAliveTimeout`].
    KeepAliveTimeout,
    /// [`CloseReason::Disconnect`].
    Disconnect,
    /// [`CloseReason::ControllerReset`].
    ControllerReset,
    /// [`CloseReason::ControllerDeleted`].
    ControllerDeleted,
    /// [`CloseReason::ListenerRemoved`], [`CloseReason::SubsystemRemoved`],
    /// [`CloseReason::HostNotAllowed`].
    SubsystemChanged,
}

impl CloseKind {
    /// Every kind, in counter order.
    pub const ALL: [CloseKind; 21] = [
        CloseKind::PeerClosed,
        CloseKind::SocketError,
        CloseKind::TlsError,
        CloseKind::TlsRequired,
        CloseKind::BadPduHeader,
        CloseKind::HeaderDigest,
        CloseKind::DataLimitExceeded,
        CloseKind::PduSequence,
        CloseKind::UnsupportedParameter,
        CloseKind::WrongDirection,
        CloseKind::SqOverflow,
        CloseKind::DataOutOfRange,
        CloseKind::UnknownTtag,
        CloseKind::HostTermReq,
        CloseKind::SetupTimeout,
        CloseKind::AuthTimeout,
        CloseKind::KeepAliveTimeout,
        CloseKind::Disconnect,
        CloseKind::ControllerReset,
        CloseKind::ControllerDeleted,
        CloseKind::SubsystemChanged,
    ];
    /// Number of kinds.
    pub const COUNT: usize = Self::ALL.len();

    /// The metric label value.
    pub fn name(self) -> &'static str {
        match self {
            CloseKind::PeerClosed => "peer_closed",
            CloseKind::SocketError => "socket_error",
            CloseKind::TlsError => "tls_error",
            CloseKind::TlsRequired => "tls_required",
            CloseKind::BadPduHeader => "bad_pdu_header",
            CloseKind::HeaderDigest => "header_digest",
            CloseKind::DataLimitExceeded => "data_limit_exceeded",
            CloseKind::PduSequence => "pdu_sequence",
            CloseKind::UnsupportedParameter => "unsupported_parameter",
            CloseKind::WrongDirection => "wrong_direction",
            CloseKind::SqOverflow => "sq_overflow",
            CloseKind::DataOutOfRange => "data_out_of_range",
            CloseKind::UnknownTtag => "unknown_ttag",
            CloseKind::HostTermReq => "host_term_req",
            CloseKind::SetupTimeout => "setup_timeout",
            CloseKind::AuthTimeout => "auth_timeout",
            CloseKind::KeepAliveTimeout => "keep_alive_timeout",
            CloseKind::Disconnect => "disconnect",
            CloseKind::ControllerReset => "controller_reset",
            CloseKind::ControllerDeleted => "controller_deleted",
            CloseKind::SubsystemChanged => "subsystem_changed",
        }
    }
}

impl CloseReason {
    /// Its kind (what is counted).
    pub fn kind(&self) -> CloseKind {
        use CloseReason as R;
        match self {
            R::PeerClosed => CloseKind::PeerClosed,
            R::Read(_) | R::Write(_) => CloseKind::SocketError,
            R::TlsSetup(_) | R::TlsHandshake(_) => CloseKind::TlsError,
            R::TlsRequired => CloseKind::TlsRequired,
            R::BadPdu(PduError::HeaderDigest { .. }) => CloseKind::HeaderDigest,
            R::BadPdu(PduError::DataLimitExceeded { .. }) | R::PduTooLarge => CloseKind::DataLimitExceeded,
            R::BadPdu(PduError::DataOutOfRange { .. }) => CloseKind::DataOutOfRange,
            R::BadPdu(PduError::Sequence { .. }) | R::PduSequence(_) => CloseKind::PduSequence,
            R::BadPdu(PduError::WrongDirection { .. }) | R::NotHostToController(_) => CloseKind::WrongDirection,
            R::BadPdu(PduError::UnsupportedParameter { .. }) | R::HpdaUnsupported => CloseKind::UnsupportedParameter,
            R::BadPdu(_) => CloseKind::BadPduHeader,
            R::SqOverflow { .. } => CloseKind::SqOverflow,
            R::DataOutOfRange | R::LastPduEarly | R::LastPduMissing => CloseKind::DataOutOfRange,
            R::UnknownTtag => CloseKind::UnknownTtag,
            R::HostTermReq => CloseKind::HostTermReq,
            R::TlsHandshakeTimeout | R::IcReqTimeout | R::ConnectTimeout => CloseKind::SetupTimeout,
            R::AuthTimeout => CloseKind::AuthTimeout,
            R::KeepAliveTimeout => CloseKind::KeepAliveTimeout,
            R::Disconnect => CloseKind::Disconnect,
            R::ControllerReset => CloseKind::ControllerReset,
            R::ControllerDeleted => CloseKind::ControllerDeleted,
            R::ListenerRemoved | R::SubsystemRemoved | R::HostNotAllowed => CloseKind::SubsystemChanged,
        }
    }
}

/// One reactor's closes by kind. Only that reactor's connections add to it (a relaxed
/// add on cache lines no other reactor writes: no lock, no false sharing between the
/// reactors' counts, which lie side by side); the control plane reads it.
#[derive(Debug, Default)]
#[repr(align(128))]
pub struct CloseCounts([AtomicU64; CloseKind::COUNT]);

impl CloseCounts {
    /// Count one close of `kind`.
    #[inline]
    pub fn count(&self, kind: CloseKind) {
        self.0[kind as usize].fetch_add(1, Relaxed);
    }

    /// Closes of `kind` so far.
    pub fn get(&self, kind: CloseKind) -> u64 {
        self.0[kind as usize].load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_in_counter_order_with_distinct_names() {
        for (i, k) in CloseKind::ALL.iter().enumerate() {
            assert_eq!(*k as usize, i, "{k:?}");
        }
        let mut names: Vec<_> = CloseKind::ALL.iter().map(|k| k.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), CloseKind::COUNT);
    }

    #[test]
    fn display_is_the_log_text() {
        assert_eq!(CloseReason::KeepAliveTimeout.to_string(), "keep-alive timeout");
        assert_eq!(
            CloseReason::SqOverflow { entries: 32 }.to_string(),
            "more than 32 commands outstanding on a queue of that size"
        );
        assert_eq!(
            CloseReason::NotHostToController(PduType::C2HData).to_string(),
            "C2HData is not a host-to-controller PDU"
        );
        let e = io::Error::from(io::ErrorKind::BrokenPipe);
        assert_eq!(CloseReason::Write(e).to_string(), "write: broken pipe");
    }

    #[test]
    fn no_larger_than_the_string_it_replaces() {
        // The receive path returns it in every fill's Result, an H2CData check in a Fatal.
        assert!(std::mem::size_of::<CloseReason>() <= std::mem::size_of::<String>());
        assert!(std::mem::size_of::<Result<crate::tcp::Filled, CloseReason>>() <= std::mem::size_of::<String>());
    }

    #[test]
    fn counts_by_kind() {
        let c = CloseCounts::default();
        c.count(CloseReason::UnknownTtag.kind());
        c.count(CloseKind::UnknownTtag);
        assert_eq!(c.get(CloseKind::UnknownTtag), 2);
        assert_eq!(c.get(CloseKind::PeerClosed), 0);
    }
}
