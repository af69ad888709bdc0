//! An in-process cluster object with the RADOS one's contract (versioned read,
//! version-asserted write, notify to every watch, watch health), shared by the "gateways" of
//! a unit test: the cluster-kept reservations' tests and the group configuration's.
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::backend::cluster::{ClusterObject, Inbox, NotifyReply, WatchEvent};

/// The object as the cluster would hold it, shared by the "gateways".
#[derive(Debug, Default)]
pub(crate) struct Store {
    pub(crate) data: Mutex<Option<(Vec<u8>, u64)>>,
    pub(crate) watches: Mutex<Vec<(u64, Arc<Inbox>)>>,
    pub(crate) acks: Mutex<Vec<(u64, u64)>>,
    pub(crate) next: AtomicU64,
    pub(crate) writes: AtomicU64,
    pub(crate) raced: AtomicU64,
}

/// One gateway's handle on it.
#[derive(Debug)]
pub(crate) struct Fake {
    pub(crate) store: Arc<Store>,
    pub(crate) cookie: Mutex<Option<u64>>,
    /// Reads and writes fail (the cluster cannot be reached).
    pub(crate) cut: Arc<AtomicBool>,
    /// The watch's age as reported.
    pub(crate) age: Arc<AtomicU64>,
}

impl Fake {
    pub(crate) fn new(store: &Arc<Store>) -> Self {
        Self {
            store: store.clone(),
            cookie: Mutex::new(None),
            cut: Arc::default(),
            age: Arc::default(),
        }
    }
}

impl ClusterObject for Fake {
    fn describe(&self) -> &str {
        "fake/pollux.object"
    }

    fn read(&self) -> Result<Option<(Vec<u8>, u64)>, i32> {
        if self.cut.load(Ordering::Acquire) {
            return Err(-libc::ETIMEDOUT);
        }
        Ok(self.store.data.lock().unwrap().clone())
    }

    fn write(&self, data: &[u8], version: Option<u64>) -> Result<Option<u64>, i32> {
        if self.cut.load(Ordering::Acquire) {
            return Err(-libc::ETIMEDOUT);
        }
        // Widen the window between a read and its write, as a cluster round trip does.
        std::thread::yield_now();
        let mut d = self.store.data.lock().unwrap();
        let now = d.as_ref().map(|(_, v)| *v);
        if now != version {
            self.store.raced.fetch_add(1, Ordering::Relaxed);
            return Ok(None);
        }
        let v = now.unwrap_or(0) + 1;
        *d = Some((data.to_vec(), v));
        self.store.writes.fetch_add(1, Ordering::Relaxed);
        Ok(Some(v))
    }

    fn notify(&self, payload: &[u8], _timeout: Duration) -> Result<NotifyReply, i32> {
        let watches = self.store.watches.lock().unwrap().clone();
        for (i, (cookie, inbox)) in watches.iter().enumerate() {
            inbox.push(WatchEvent::Notify {
                notify_id: i as u64,
                cookie: *cookie,
                notifier: 0,
                payload: payload.to_vec(),
            });
        }
        // Acknowledgements are counted by the test, not awaited here.
        Ok(NotifyReply {
            acked: watches.len(),
            timed_out: 0,
        })
    }

    fn watch(&self, inbox: Arc<Inbox>) -> Result<(), i32> {
        if self.cut.load(Ordering::Acquire) {
            return Err(-libc::ENOTCONN);
        }
        let cookie = self.store.next.fetch_add(1, Ordering::Relaxed) + 1;
        let mut w = self.store.watches.lock().unwrap();
        if let Some(old) = self.cookie.lock().unwrap().replace(cookie) {
            w.retain(|(c, _)| *c != old);
        }
        w.push((cookie, inbox));
        Ok(())
    }

    fn watch_age(&self) -> Result<Duration, i32> {
        if self.cookie.lock().unwrap().is_none() {
            return Err(-libc::ENOTCONN);
        }
        Ok(Duration::from_millis(self.age.load(Ordering::Acquire)))
    }

    fn ack(&self, notify_id: u64, cookie: u64) {
        self.store.acks.lock().unwrap().push((notify_id, cookie));
    }

    fn cookie(&self) -> Option<u64> {
        *self.cookie.lock().unwrap()
    }
}
