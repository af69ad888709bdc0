//! pollux link: the byte stream under an NVMe/TCP queue, the same at both ends of a
//! connection. The target's transport (`pollux_target::tcp`) and the host library
//! (`pollux_host`) share it, and nothing else of each other.
//!
//! - [`sendq`]: ordered PDU bytes waiting for the socket, with data sent in place.
//! - [`tls`]: TLS 1.3 with a pre-shared key (NVMe/TCP 1.0 §3.6.1), the handshake and the
//!   record layer over a non-blocking socket, for the controller and for the host.
//!
//! It holds sockets and OpenSSL, so it is not part of `pollux_nvme` (the NVMe world without
//! sockets or threads, which `pollux_conf` depends on too); the PDUs and the PSK
//! derivations it carries are `pollux_nvme`'s.

pub mod sendq;
pub mod tls;
