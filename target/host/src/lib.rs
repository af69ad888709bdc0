//! pollux host: a host-side (initiator) NVMe/TCP library, for tests and the `pollux perf`
//! load generator ([`perf`]). The target's server code never uses it; the two share only
//! `pollux_link` (the send queue and the TLS record layer) and `pollux_nvme`'s wire types.
//!
//! It speaks the same wire types as the target ([`pollux_nvme::tcp`], [`pollux_nvme::spec`]):
//! - [`HostQueue`]: one NVMe-oF queue on one TCP connection. ICReq/ICResp (NVMe/TCP 1.0
//!   §3.6.2.2, validated like the Linux host does), Fabrics Connect (NVMe-oF 1.1 §6.3), then
//!   commands. The I/O path keeps many commands in flight ([`HostQueue::submit`] +
//!   [`HostQueue::poll_completions`]): command ids are slots of the queue, buffers are moved
//!   in and handed back with the completion, submissions are batched into one `write`, and
//!   PDUs are read into one reusable buffer, so the steady state allocates nothing.
//! - Admin helpers on an admin queue (Property Get/Set, enable, Identify, Set Features,
//!   Keep Alive, Get Log Page, shutdown) and a [`Controller`] that sets up an admin queue and
//!   N I/O queues like `nvme connect` does; [`discover_all`] walks discovery logs and their
//!   referrals like `nvme connect-all` does.
//! - Raw mode for protocol tests: [`HostQueue::send_raw`] and [`HostQueue::recv_raw`].
//!
//! - TLS 1.3 with a PSK on every queue ([`HostTls`], NVMe/TCP 1.0 §3.6.1), as `nvme connect
//!   --tls` does.
//!
//! Everything that waits has a deadline ([`QueueOpts::timeout`]); anything the target sends
//! that breaks the protocol is a [`HostError`], never a panic.

mod admin;
mod auth;
mod controller;
mod discover;
mod error;
pub mod history;
pub mod perf;
mod queue;
pub mod sqe;
mod tls;

#[cfg(test)]
mod tests;

pub use admin::{DiscoveryEntry, DiscoveryLog, ErrorLogEntry, IdCtrl, IdNs, NumQueues};
pub use auth::{AuthInfo, ExchangeOpts, HostDhchap, RECEIVE_LEN};
pub use controller::{Controller, ControllerOpts, Digests};
pub use discover::{MAX_REFERRAL_DEPTH, SUBTYPE_NVM, SUBTYPE_REFERRAL, Walk, discover_all};
pub use error::HostError;
pub use pollux_nvme::spec::Health as SmartLog;
pub use queue::{Completion, ConnectResult, Data, HostQueue, IcInfo, QueueOpts, RawReply, hostid_from_nqn};
pub use sqe::DsmRange;
pub use tls::{HostPsk, HostTls};
