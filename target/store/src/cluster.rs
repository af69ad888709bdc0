//! The object of a store's cluster that keeps a namespace's reservations for every gateway
//! (an RBD image's `pollux.resv.<image id>`, [`crate::rbd::resv_object`]): what a store with
//! a cluster offers ([`crate::Backend::reservation_object`]) and the target's reservations
//! kept in the cluster (its `resv::cluster`) use, without either knowing the other.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::bell::Bell;

/// The replies to a notify.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NotifyReply {
    /// Watchers that acknowledged (this gateway's own watch included).
    pub acked: usize,
    /// Watchers that did not within the timeout.
    pub timed_out: usize,
}

/// What a watch reports (on the cluster client's thread).
#[derive(Debug)]
pub enum WatchEvent {
    /// A notification, to be acknowledged with its id and cookie.
    Notify {
        /// The notify's id.
        notify_id: u64,
        /// The watch's cookie.
        cookie: u64,
        /// The notifying client.
        notifier: u64,
        /// What it sent.
        payload: Vec<u8>,
    },
    /// The watch is lost (the errno): changes may be missed until it is set up again.
    Lost(i32),
}

/// Where a watch's events wait for the target's reservation watcher, which `bell` wakes.
#[derive(Debug)]
pub struct Inbox {
    events: Mutex<VecDeque<WatchEvent>>,
    bell: &'static Bell,
}

impl Inbox {
    /// An empty inbox whose events ring `bell`.
    pub fn new(bell: &'static Bell) -> Self {
        Self {
            events: Mutex::default(),
            bell,
        }
    }

    /// Queue `e` and wake the watchers.
    pub fn push(&self, e: WatchEvent) {
        self.events.lock().unwrap_or_else(|p| p.into_inner()).push_back(e);
        self.bell.ring();
    }

    /// The events queued, oldest first, taken.
    pub fn drain(&self) -> Vec<WatchEvent> {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
            .collect()
    }
}

/// The object holding a namespace's reservations in its cluster. Every call may block on
/// the cluster; errors are negative errnos.
pub trait ClusterObject: Send + Sync + std::fmt::Debug {
    /// Where it is (pool, namespace, object), for logs and errors.
    fn describe(&self) -> &str;
    /// Its bytes and version; None: it does not exist.
    fn read(&self) -> Result<Option<(Vec<u8>, u64)>, i32>;
    /// Replace its bytes if its version is still `version` (None: create it, if it still
    /// does not exist). Ok(Some(new version)); Ok(None): it changed meanwhile.
    fn write(&self, data: &[u8], version: Option<u64>) -> Result<Option<u64>, i32>;
    /// Send `payload` to every watcher and wait for their acknowledgements, up to `timeout`.
    fn notify(&self, payload: &[u8], timeout: Duration) -> Result<NotifyReply, i32>;
    /// Watch it (again, replacing a watch there was): events go to `inbox`.
    fn watch(&self, inbox: Arc<Inbox>) -> Result<(), i32>;
    /// How long ago the cluster last confirmed the watch; Err: it is lost.
    fn watch_age(&self) -> Result<Duration, i32>;
    /// Acknowledge notification `notify_id` received on watch `cookie`.
    fn ack(&self, notify_id: u64, cookie: u64);
    /// The watch's cookie, while there is one.
    fn cookie(&self) -> Option<u64>;
    /// End the watch and let go of the cluster now (this process hands over or stops): the
    /// cluster stops waiting for this gateway's acknowledgements at once rather than after
    /// the watch timeout, and the process's cluster connection can shut down before it
    /// exits. Later calls fail.
    fn close(&self) {}
}
