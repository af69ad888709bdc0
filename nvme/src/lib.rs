//! pollux-nvme: the NVMe world without sockets or threads.
//!
//! - [`bindings`]: bindgen output over Debian libnvme-dev's `<nvme/types.h>` (Identify,
//!   log pages, discovery log, Connect data, opcode/status/feature/CNS/log-id constants).
//!   Regenerate with `nvme/gen-bindings.sh`; the output is committed.
//! - [`spec`]: hand-written NVMe base spec 2.0 wire structs (SQE, CQE, SGL descriptor),
//!   status codes, opcodes and controller properties (CAP/VS/CC/CSTS).
//! - [`pci`]: the userspace NVMe-over-PCIe driver: the hardware seam (registers, DMA memory,
//!   MSI-X eventfds) with a VFIO implementation and a fake controller for tests, controller
//!   bring-up/reset/shutdown and single-owner queue pairs (PRP lists, MDTS splitting).
//! - [`auth`]: DH-HMAC-CHAP in-band authentication: secrets, hashes, FFDHE groups, the
//!   responses and the Authentication Send/Receive messages.
//! - [`tls`]: NVMe/TCP TLS key material: configured PSKs, retained PSKs, PSK identities.
//! - [`tcp`]: the NVMe/TCP transport 1.0 PDUs, an incremental receive-side parser with typed
//!   errors, allocation-free encoders and CRC32C digests.
//!
//! # Byte order
//! Every multi-byte NVMe and NVMe/TCP field is little-endian on the wire. The hand-written
//! structs in [`spec`] and [`tcp`] use `zerocopy::little_endian` types and are correct on any
//! host; the generated [`bindings`] keep plain integer fields, so this crate only builds on
//! little-endian hosts (writing `.to_le()` into those fields is then a no-op, but keep
//! writing it: it documents the wire order).

#[cfg(target_endian = "big")]
compile_error!(
    "pollux-nvme only supports little-endian hosts: the generated bindings use plain \
     integer fields for little-endian wire data"
);

pub mod auth;
pub mod bindings;
mod interchange;
pub mod pci;
pub mod spec;
pub mod tcp;
pub mod tls;

pub use tcp::PduError;
