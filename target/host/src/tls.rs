//! The host's side of NVMe/TCP over TLS 1.3 with a PSK (NVMe/TCP 1.0 §3.6.1, TP 8011), as
//! `nvme connect --tls` runs it: right after the TCP connect, before ICReq, every queue of
//! the controller ([`HostQueue`]) does a TLS 1.3 handshake offering the PSK identity (and the TLS PSK
//! derived, NVMe/TCP 1.0 §3.6.1.3) of its host and subsystem; ICReq/ICResp and every PDU
//! then travel inside TLS records ([`pollux_link::tls::TlsLink`], the same record layer as
//! the target's).
//!
//! What changes on a TLS queue: reads decrypt into the receive buffer (no receive in place,
//! the bytes must pass through OpenSSL), write data is copied into the send queue (the
//! record layer encrypts owned bytes only), and before waiting for the socket the queue
//! first empties what OpenSSL may already have decrypted.

use pollux_nvme::tls::{ConfiguredPsk, GeneratedPsk, TlsPsk};

use super::error::HostError;
#[cfg(doc)]
use super::queue::HostQueue;

/// Where a host's TLS PSK comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPsk {
    /// A configured PSK (`NVMeTLSkey-1:hh:...:`, `nvme connect --tls-key`).
    Configured(ConfiguredPsk),
    /// A PSK the admin queue's DH-HMAC-CHAP generated (secure channel concatenation, TP
    /// 8018): its identity is always version 1, type `G`.
    Generated(GeneratedPsk),
}

/// A host's TLS configuration: the PSK it shares with the subsystem, and the identity
/// version to offer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostTls {
    /// The PSK.
    pub psk: HostPsk,
    /// PSK identity format (NVMe/TCP 1.0 §3.6.1.3): 0 (`NVMe0R<hh> <hostnqn> <subnqn>`,
    /// nvme-cli's default) or 1 (with the PSK digest appended, `--identity 1`).
    pub identity_version: u8,
    /// Derive the PSK and identity for this host NQN instead of the one the queue's Connect
    /// carries (None: the same). For tests of a controller that must refuse a queue secured
    /// for one host but connecting as another.
    pub identity_hostnqn: Option<String>,
}

impl HostTls {
    /// `psk` with identity version 0, for the Connect's host NQN.
    pub fn new(psk: ConfiguredPsk) -> Self {
        Self {
            psk: HostPsk::Configured(psk),
            identity_version: 0,
            identity_hostnqn: None,
        }
    }

    /// A generated PSK's (identity version 1).
    pub fn generated(psk: GeneratedPsk) -> Self {
        Self {
            psk: HostPsk::Generated(psk),
            identity_version: 1,
            identity_hostnqn: None,
        }
    }

    /// With identity version `v` (0 or 1).
    pub fn identity(mut self, v: u8) -> Self {
        self.identity_version = v;
        self
    }

    /// The identity and TLS PSK a queue of `hostnqn` on `subnqn` offers.
    pub fn tls_psk(&self, hostnqn: &str, subnqn: &str) -> Result<TlsPsk, HostError> {
        let host = self.identity_hostnqn.as_deref().unwrap_or(hostnqn);
        let psk = match &self.psk {
            HostPsk::Configured(p) => p.tls_psk(host, subnqn, self.identity_version),
            HostPsk::Generated(g) => g.tls_psk(host, subnqn),
        };
        psk.ok_or_else(|| {
            HostError::Tls(format!(
                "no TLS PSK for identity version {} (0 or 1)",
                self.identity_version
            ))
        })
    }
}
