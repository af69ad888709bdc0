//! Persistent reservations of a namespace (NVMe 2.0 §8.19; the commands: NVM Command Set 1.0
//! §7.3-§7.6). SPDK: `lib/nvmf/ctrlr.c` (`nvmf_ns_reservation_*`); Linux: `target/pr.c`.
//!
//! Three parts, kept apart so that each can be tested alone:
//! - [`ResvState`], a pure state machine: the registrants (by 128-bit host identifier, so two
//!   controllers of one host share a registration), the reservation held, the generation,
//!   PTPL; each command is a method that returns its status and what it caused (the hosts
//!   to notify, the hosts whose commands are to be aborted).
//! - [`NsResv`], what every reactor reads: the state as an immutable snapshot swapped whole,
//!   and a flag that no reservation is held. The I/O path's check is one atomic load while
//!   nothing is held (the common case), and a snapshot load otherwise: never a lock.
//! - One owner: every change runs on the `pollux-resv` thread, which applies it to a copy,
//!   writes the copy to the namespace's state file first when PTPL is set (so a completed
//!   command is durable: a `kill -9` right after loses nothing), then swaps it in. A change
//!   that cannot be written fails with Internal Error and changes nothing. Reactors never
//!   wait for it: a reservation command's completion comes back by message.
//!
//! Reservations of most namespaces are per target: two targets exporting the same file (the
//! HA issue's `shared = true`) each keep their own, as nvmet and SPDK do. Those of an RBD
//! image are kept in its cluster for every gateway ([`cluster`]): the same owner thread
//! then changes the cluster's object instead of a file.
//!
//! One file per part: [`state`] (the state machine), [`shared`] (the snapshot the reactors
//! read, and the owner thread that changes it), [`file`] (the PTPL state file), [`cluster`]
//! (the state kept in a cluster object, watched).

pub mod cluster;
#[cfg(test)]
pub(crate) mod cluster_fake;
mod file;
pub mod seal;
mod shared;
mod state;

pub use crate::backend::cluster::{ClusterObject, Inbox, NotifyReply, WatchEvent};
pub use file::state_file;
pub use shared::{NsResv, ResvDone, submit};
pub use state::{Effects, Holder, HostId, Registrant, ResvOp, ResvState};

/// What a command gets while this gateway cannot see the reservation state the cluster
/// keeps: Asymmetric Access Transition (NVMe 2.0 §8.1.3.3), a path status, retryable. A
/// multipath host sends it down another gateway's path, or holds it until this one can
/// serve again; Namespace Not Ready is no path error, and Linux's multipath fails the I/O
/// with it.
pub const UNSEEN: pollux_nvme::spec::Status = pollux_nvme::spec::Status::ANA_TRANSITION;

/// How long a Preempt and Abort waits for a preempted host's commands that could not be
/// aborted (a device that never completes them): then it completes anyway, logged. The
/// queue's fence waits this long; a clustered change waits for the other gateways' fences
/// up to it.
pub const FENCE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

#[cfg(test)]
mod cluster_tests;
#[cfg(test)]
mod tests;
