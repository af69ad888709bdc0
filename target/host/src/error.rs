//! The host library's one error type.

use std::time::Duration;

use pollux_nvme::PduError;
use pollux_nvme::spec::{Status, StatusContext};

/// What can go wrong talking to a target.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// A socket error other than the peer closing.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// Nothing arrived within the deadline.
    #[error("timed out after {waited:?} waiting for {what}")]
    Timeout {
        /// How long we waited.
        waited: Duration,
        /// What we waited for.
        what: &'static str,
    },
    /// The target closed the connection (EOF or reset) or it was already closed.
    #[error("the target closed the connection")]
    Closed,
    /// The target sent C2HTermReq (NVMe/TCP 1.0 §3.6.2.3): the connection is dead.
    #[error("target sent C2HTermReq: FES {fes:#x}, FEI {fei:#x}")]
    TermReq {
        /// Fatal Error Status.
        fes: u16,
        /// Fatal Error Information.
        fei: u32,
    },
    /// The target sent a PDU that fails the NVMe/TCP header rules.
    #[error("bad PDU from the target: {0}")]
    BadPdu(#[from] PduError),
    /// The target sent a well-formed PDU that makes no sense now (unknown command id, data
    /// outside the command's buffer, an R2T for a read, ...).
    #[error("protocol error from the target: {0}")]
    Protocol(String),
    /// The ICResp is one the Linux host would refuse.
    #[error("ICResp rejected: {0}")]
    IcResp(String),
    /// Fabrics Connect completed with an error status (NVMe-oF 1.1 §6.3). `dw0` carries
    /// IATTR/IPO for Connect Invalid Parameters. The status is named as a Fabrics
    /// command's (`Connect Invalid Host (sct 0x1, sc 0x84, dnr)`).
    #[error("connect refused: {}, dw0 {dw0:#x}", status.in_context(StatusContext::Fabrics))]
    ConnectRefused {
        /// The completion status.
        status: Status,
        /// Completion dword 0.
        dw0: u32,
    },
    /// A command completed with an error status, named for its kind of command (a Fabrics
    /// command's command-specific codes are not an I/O command's).
    #[error("command (opcode {opcode:#04x}) failed: {}, dw0 {dw0:#x}", status.in_context(context_of(*opcode)))]
    Command {
        /// The command's opcode (0x7F for fabrics).
        opcode: u8,
        /// The completion status.
        status: Status,
        /// Completion dword 0.
        dw0: u32,
    },
    /// Every command id of the queue is in use.
    #[error("queue full: {0} commands in flight")]
    QueueFull(usize),
    /// The caller asked for something the library cannot do (e.g. a buffer too large).
    #[error("invalid request: {0}")]
    Invalid(&'static str),
    /// DH-HMAC-CHAP failed or was refused (NVMe 2.0 §8.13.5).
    #[error("authentication: {0}")]
    Auth(String),
    /// The TLS 1.3 secure channel could not be set up (NVMe/TCP 1.0 §3.6.1): no PSK for the
    /// identity, a handshake the controller refused (a wrong PSK, a listener without TLS)
    /// or broke off. The reason never carries key material.
    #[error("TLS: {0}")]
    Tls(String),
    /// The controller did not become ready / shut down as asked.
    #[error("controller state: {0}")]
    Controller(String),
}

/// The kind of command an opcode is, for naming its status: 0x7F is every Fabrics command
/// (NVMe-oF 1.1 §2.1).
fn context_of(opcode: u8) -> StatusContext {
    if opcode == pollux_nvme::spec::opcode::FABRICS {
        StatusContext::Fabrics
    } else {
        StatusContext::Nvm
    }
}

impl HostError {
    /// The NVMe status of a failed command or refused Connect, if that is what this is.
    pub fn status(&self) -> Option<Status> {
        match self {
            Self::Command { status, .. } | Self::ConnectRefused { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// Whether the connection is gone (closed, terminated or broken by a bad PDU).
    pub fn is_fatal(&self) -> bool {
        matches!(
            self,
            Self::Io(_)
                | Self::Closed
                | Self::TermReq { .. }
                | Self::BadPdu(_)
                | Self::Protocol(_)
                | Self::IcResp(_)
                | Self::Tls(_)
        )
    }
}
