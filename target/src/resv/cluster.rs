//! Reservations kept in the cluster, for a namespace every gateway of a cluster serves (an
//! RBD image): the state lives in one object beside the store ([`ClusterObject`]; for RBD,
//! `backend::rbd::resv_object`), so that a host's reservation taken through one gateway is
//! enforced by all of them (NVMe 2.0 §8.19 within one NVM subsystem, which the gateways
//! together present).
//!
//! - **Change**: read the object and its version, apply the command to that state, write it
//!   back asserting the version read. Another gateway's change in between makes the write
//!   fail; the command is then applied again to the newer state. No change is lost and the
//!   generation counts each once.
//! - **Publish**: the gateway that changed it installs the new state, then notifies the
//!   object's watchers with the new state and what the change caused (the hosts to notify,
//!   the hosts whose commands to abort). Each other gateway installs it, hands the
//!   notifications to its controllers and fences the preempted hosts' commands, and only
//!   then acknowledges. The command completes when every gateway acknowledged or
//!   [`NOTIFY_TIMEOUT`] passed (a gateway that did not acknowledge has by then lost the
//!   cluster and admits nothing, below).
//! - **Fail safe**: a gateway whose watch is lost, or not confirmed by the cluster for
//!   [`UNCERTAIN_AFTER`], cannot know the holder now. It then admits no read or write of the
//!   namespace at all (any of them could be forbidden by a reservation another gateway
//!   took meanwhile, even where none was held before): they complete with Namespace Not
//!   Ready, Do Not Retry clear, which hosts retry. Once it watches again it reads the object
//!   and admits again. A gateway killed outright leaves only its watch, which the cluster
//!   drops after the watch timeout; until then a change waits [`NOTIFY_TIMEOUT`] for it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, mpsc};
use std::time::{Duration, Instant};

use pollux_nvme::spec::Status;
use serde::{Deserialize, Serialize};
use tracing::{debug, info, warn};

use super::file::{Kept, StateDoc, StateDocError, from_doc, hostid_of, hostid_text, to_doc};
use super::shared::{Job, NsResv};
use super::state::{Effects, HostId, ResvOp, ResvState};
use crate::backend::cluster::{ClusterObject, Inbox, WatchEvent};
use crate::bell::{Bell, BellThread};
use crate::error::TargetError;

/// A watch not confirmed by the cluster for this long may have missed a change: the
/// gateway stops admitting I/O. The client confirms every second (`objecter_tick_interval`).
pub const UNCERTAIN_AFTER: Duration = Duration::from_secs(4);
/// How long a change waits for the other gateways' acknowledgements. Not less than
/// [`UNCERTAIN_AFTER`]: a gateway that has not acknowledged by then no longer admits I/O.
pub const NOTIFY_TIMEOUT: Duration = Duration::from_secs(5);
/// The same for a Preempt and Abort, whose acknowledgement waits for the preempted hosts'
/// commands on that gateway (up to the fence's own limit).
pub const NOTIFY_ABORT_TIMEOUT: Duration =
    Duration::from_secs(super::FENCE_TIMEOUT.as_secs() + NOTIFY_TIMEOUT.as_secs());
/// How often a gateway that cannot see the state tries to catch up.
const CATCH_UP_EVERY: Duration = Duration::from_secs(1);
/// A change that keeps losing the race to other gateways gives up (with a retryable
/// status) after this many attempts.
const ATTEMPTS: usize = 64;

/// A change as announced to the other gateways.
#[derive(Serialize, Deserialize)]
struct Announcement {
    /// The announcing gateway's namespace ([`Clustered::token`]).
    from: u64,
    /// The object's version the state is.
    version: u64,
    state: StateDoc,
    /// Reservation notifications (host, log page type).
    notices: Vec<(String, u8)>,
    /// Hosts whose commands are aborted.
    aborted: Vec<String>,
}

/// The cluster side of a namespace's [`NsResv`].
#[derive(Debug)]
pub(super) struct Clustered {
    pub(super) object: Box<dyn ClusterObject>,
    pub(super) inbox: Arc<Inbox>,
    /// The object's version the installed state is (0: none yet).
    version: AtomicU64,
    /// Names this namespace's announcements, so that it knows its own.
    token: u64,
    /// The gateway may have missed a change: no I/O is admitted.
    uncertain: AtomicBool,
    /// The watch must be set up again before catching up.
    rewatch: AtomicBool,
    /// When it last tried to catch up.
    pub(super) last_try: Mutex<Option<Instant>>,
    /// Serialises installing a state and the gate with it.
    publish: Mutex<()>,
    /// Its owner thread's queue (started at the first change; None: it could not start).
    owner: OnceLock<Option<mpsc::Sender<Job>>>,
}

fn io_error() -> Status {
    super::UNSEEN
}

impl NsResv {
    /// Reservations kept in `object`, for every gateway of its cluster: the object is
    /// created (empty) if it does not exist, watched, and read.
    pub fn clustered(object: Box<dyn ClusterObject>) -> Result<Self, TargetError> {
        let fail = |o: &dyn ClusterObject, what: &str, rc: i32| TargetError::ReservationCluster {
            object: o.describe().to_string(),
            why: format!("{what}: {}", std::io::Error::from_raw_os_error(-rc)),
        };
        if object
            .read()
            .map_err(|rc| fail(&*object, "cannot read it", rc))?
            .is_none()
        {
            let empty = serde_json::to_vec(&to_doc(&ResvState::default(), Kept::Cluster)).unwrap_or_default();
            // Ok(None): another gateway created it first; its state is read below.
            object
                .write(&empty, None)
                .map_err(|rc| fail(&*object, "cannot create it", rc))?;
        }
        let inbox = Arc::new(Inbox::new(&BELL));
        object
            .watch(inbox.clone())
            .map_err(|rc| fail(&*object, "cannot watch it", rc))?;
        let c = Clustered {
            object,
            inbox,
            version: AtomicU64::new(0),
            token: token(),
            uncertain: AtomicBool::new(false),
            rewatch: AtomicBool::new(false),
            last_try: Mutex::new(None),
            publish: Mutex::new(()),
            owner: OnceLock::new(),
        };
        let (state, version) = c.read_state().map_err(|why| TargetError::ReservationCluster {
            object: c.object.describe().to_string(),
            why: why.to_string(),
        })?;
        info!(
            object = %c.object.describe(),
            version,
            registrants = state.registrants.len(),
            held = ?state.holder.map(|h| h.rtype.name()),
            "reservations kept in the cluster"
        );
        c.version.store(version, Ordering::Release);
        Ok(Self::with_cluster(state, c))
    }

    /// Apply `op` of `host` to the cluster's state (on the owner thread only): read, apply,
    /// write if the version is unchanged (else again), install, announce.
    pub(super) fn change_clustered(&self, c: &Clustered, host: &HostId, op: &ResvOp) -> Result<Effects, Status> {
        for attempt in 0..ATTEMPTS {
            let (state, version) = c.read_state().map_err(|why| {
                warn!(object = %c.object.describe(), "reservation change failed: {why}");
                io_error()
            })?;
            let mut next = state.clone();
            let fx = match next.apply(host, op, true) {
                Ok(fx) => fx,
                Err(s) => {
                    self.install(c, state, version);
                    return Err(s);
                }
            };
            if next == state {
                self.install(c, state, version);
                return Ok(fx);
            }
            let bytes = serde_json::to_vec(&to_doc(&next, Kept::Cluster)).map_err(|_| Status::INTERNAL_ERROR)?;
            let expected = (version != 0).then_some(version);
            match c.object.write(&bytes, expected) {
                Ok(Some(v)) => {
                    self.install(c, next.clone(), v);
                    self.announce(c, host, op, v, &next, &fx);
                    return Ok(fx);
                }
                Ok(None) => {
                    debug!(object = %c.object.describe(), attempt, "reservation change raced another gateway's: again");
                    // Random, growing backoff: gateways that keep colliding spread out.
                    let cap = 100u64 << attempt.min(8);
                    let us = u64::from(getrandom::u32().unwrap_or(0)) % cap;
                    std::thread::sleep(Duration::from_micros(us));
                }
                Err(rc) => {
                    warn!(object = %c.object.describe(), rc, "reservation change not written: command failed");
                    return Err(io_error());
                }
            }
        }
        warn!(object = %c.object.describe(), "reservation change lost the race {ATTEMPTS} times: command failed");
        Err(io_error())
    }

    /// Tell the other gateways: the new state and what the change caused. Waits for their
    /// acknowledgements (each has applied it: notified its controllers, fenced the
    /// preempted hosts), up to the timeout.
    fn announce(&self, c: &Clustered, host: &HostId, op: &ResvOp, version: u64, next: &ResvState, fx: &Effects) {
        let a = Announcement {
            from: c.token,
            version,
            state: to_doc(next, Kept::Cluster),
            notices: fx.notices.iter().map(|(h, t)| (hostid_text(h), *t)).collect(),
            aborted: fx.aborted.iter().filter(|h| *h != host).map(hostid_text).collect(),
        };
        let Ok(payload) = serde_json::to_vec(&a) else { return };
        let timeout = if op.aborts() {
            NOTIFY_ABORT_TIMEOUT
        } else {
            NOTIFY_TIMEOUT
        };
        let started = Instant::now();
        match c.object.notify(&payload, timeout) {
            Ok(r) if r.timed_out > 0 => warn!(
                object = %c.object.describe(),
                acknowledged = r.acked,
                silent = r.timed_out,
                "gateways did not acknowledge a reservation change within {timeout:?}: they have lost the cluster and admit no I/O until they catch up"
            ),
            Ok(r) => {
                debug!(object = %c.object.describe(), acknowledged = r.acked, took_us = started.elapsed().as_micros() as u64, "reservation change announced")
            }
            Err(rc) => warn!(
                object = %c.object.describe(),
                rc,
                "reservation change could not be announced: the other gateways catch up when their watch is confirmed"
            ),
        }
    }

    /// Install `state` (the object's `version`) unless a newer one is installed.
    fn install(&self, c: &Clustered, state: ResvState, version: u64) {
        let _g = c.publish.lock().unwrap_or_else(|p| p.into_inner());
        if version < c.version.load(Ordering::Acquire) {
            return;
        }
        c.version.store(version, Ordering::Release);
        let held = state.holder.is_some();
        self.publish_state(state, held, c.uncertain.load(Ordering::Acquire));
    }

    /// This gateway may have missed a change: admit no I/O until it catches up.
    fn lose(&self, c: &Clustered, why: &str) {
        self.lose_as(c, why, false);
    }

    /// As [`Self::lose`]; `fenced`: because this gateway's client is blocklisted (its gateway
    /// group fenced it), which refuses I/O with a path status instead.
    fn lose_as(&self, c: &Clustered, why: &str, fenced: bool) {
        let _g = c.publish.lock().unwrap_or_else(|p| p.into_inner());
        if !c.uncertain.swap(true, Ordering::AcqRel) {
            warn!(object = %c.object.describe(), "cannot see the cluster's reservation state ({why}): no I/O admitted until it can");
        }
        if fenced {
            self.set_fenced();
        } else {
            self.set_gate(false, true);
        }
    }

    /// The watch was lost with `rc` (Ceph's EBLOCKLISTED is ESHUTDOWN: this gateway was
    /// fenced).
    fn lose_watch(&self, c: &Clustered, rc: i32) {
        c.rewatch.store(true, Ordering::Release);
        let why = format!("watch lost: {}", std::io::Error::from_raw_os_error(-rc));
        self.lose_as(c, &why, rc == -libc::ESHUTDOWN);
    }

    /// On the target's reservation watcher: apply the other gateways' changes (their
    /// effects through `deliver`, which answers once the controllers have them), acknowledge,
    /// check the watch, catch up after a loss.
    pub(crate) fn tend(&self, deliver: &dyn Fn(Effects) -> Option<std::sync::mpsc::Receiver<()>>) {
        let Some(c) = self.cluster() else { return };
        for e in c.inbox.drain() {
            match e {
                WatchEvent::Notify {
                    notify_id,
                    cookie,
                    payload,
                    ..
                } => {
                    if c.object.cookie() == Some(cookie) {
                        self.apply_announcement(c, &payload, deliver);
                    }
                    // A notification to a watch since replaced is acknowledged too: its
                    // notifier waits for it.
                    c.object.ack(notify_id, cookie);
                }
                WatchEvent::Lost(rc) => self.lose_watch(c, rc),
            }
        }
        match c.object.watch_age() {
            Err(rc) => self.lose_watch(c, rc),
            Ok(age) if age > UNCERTAIN_AFTER => self.lose(c, &format!("watch not confirmed for {age:?}")),
            Ok(_) => {}
        }
        if c.uncertain.load(Ordering::Acquire) {
            self.catch_up(c);
        }
    }

    fn apply_announcement(
        &self,
        c: &Clustered,
        payload: &[u8],
        deliver: &dyn Fn(Effects) -> Option<std::sync::mpsc::Receiver<()>>,
    ) {
        let a: Announcement = match serde_json::from_slice(payload) {
            Ok(a) => a,
            Err(e) => return self.lose(c, &format!("a change announced in an unknown form: {e}")),
        };
        if a.from == c.token {
            return;
        }
        match from_doc(a.state) {
            Ok(s) => self.install(c, s, a.version),
            Err(why) => return self.lose(c, &format!("a change announced with a bad state: {why}")),
        }
        let hosts = |v: Vec<String>| -> Vec<HostId> { v.iter().filter_map(|h| hostid_of(h).ok()).collect() };
        let fx = Effects {
            notices: a
                .notices
                .into_iter()
                .filter_map(|(h, t)| hostid_of(&h).ok().map(|h| (h, t)))
                .collect(),
            aborted: hosts(a.aborted),
        };
        if fx.notices.is_empty() && fx.aborted.is_empty() {
            return;
        }
        if let Some(done) = deliver(fx) {
            let limit = super::FENCE_TIMEOUT + Duration::from_secs(1);
            if done.recv_timeout(limit).is_err() {
                warn!(object = %c.object.describe(), "a reservation change's effects did not finish within {limit:?}: acknowledged anyway");
            }
        }
    }

    /// Watch again if the watch was lost, read the state, and admit again.
    fn catch_up(&self, c: &Clustered) {
        {
            let mut last = c.last_try.lock().unwrap_or_else(|p| p.into_inner());
            if last.is_some_and(|t| t.elapsed() < CATCH_UP_EVERY) {
                return;
            }
            *last = Some(Instant::now());
        }
        if c.rewatch.load(Ordering::Acquire) {
            if let Err(rc) = c.object.watch(c.inbox.clone()) {
                debug!(object = %c.object.describe(), rc, "cannot watch the reservation object yet");
                // A lost watch says ENOTCONN; the OSD tells a blocklisted client so when it
                // asks again.
                if rc == -libc::ESHUTDOWN {
                    self.lose_as(c, "this gateway's cluster client is blocklisted", true);
                }
                return;
            }
            c.rewatch.store(false, Ordering::Release);
        }
        // Watching first, then reading: a change after the read is announced to the watch.
        let (state, version) = match c.read_state() {
            Ok(s) => s,
            Err(why) => return debug!(object = %c.object.describe(), "cannot read the reservation object yet: {why}"),
        };
        if !c.object.watch_age().is_ok_and(|age| age <= UNCERTAIN_AFTER) {
            return;
        }
        let _g = c.publish.lock().unwrap_or_else(|p| p.into_inner());
        if version >= c.version.load(Ordering::Acquire) {
            c.version.store(version, Ordering::Release);
            let held = state.holder.is_some();
            self.publish_state(state, held, false);
        } else {
            self.set_gate(self.state().holder.is_some(), false);
        }
        c.uncertain.store(false, Ordering::Release);
        info!(object = %c.object.describe(), version, "reservation state caught up: I/O admitted again");
    }

    /// End this gateway's watch on the cluster's state and let go of the cluster (a stop,
    /// or a hot upgrade's old process, which serves no more): the other gateways' changes
    /// no longer wait for it.
    pub fn release_cluster(&self) {
        if let Some(c) = self.cluster() {
            c.object.close();
        }
    }

    /// The cluster object's description (None: reservations not kept in a cluster).
    pub fn cluster_object(&self) -> Option<&str> {
        self.cluster().map(|c| c.object.describe())
    }

    /// Whether I/O is refused because this gateway cannot see the cluster's state.
    pub fn uncertain(&self) -> bool {
        self.cluster().is_some_and(|c| c.uncertain.load(Ordering::Acquire))
    }
}

/// A token naming one namespace's announcements: random, else the time and process.
fn token() -> u64 {
    getrandom::u64().unwrap_or_else(|_| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        t ^ (u64::from(std::process::id()) << 40)
    })
}

impl Clustered {
    /// The queue of this namespace's owner thread (it ends with the namespace).
    pub(super) fn owner(&self) -> Option<&mpsc::Sender<Job>> {
        self.owner
            .get_or_init(|| {
                let (tx, rx) = mpsc::channel::<Job>();
                match std::thread::Builder::new()
                    .name("pollux-resv-rbd".into())
                    .spawn(move || rx.into_iter().for_each(|job| job()))
                {
                    Ok(_) => Some(tx),
                    Err(e) => {
                        warn!(object = %self.object.describe(), "no reservation thread of its own ({e}): changes share the target's");
                        None
                    }
                }
            })
            .as_ref()
    }

    /// The object's state and version (an absent object: the empty state, version 0).
    fn read_state(&self) -> Result<(ResvState, u64), StateDocError> {
        match self.object.read() {
            Ok(None) => Ok((ResvState::default(), 0)),
            Ok(Some((bytes, version))) => {
                let doc: StateDoc = serde_json::from_slice(&bytes).map_err(StateDocError::NotAState)?;
                Ok((from_doc(doc)?, version))
            }
            Err(rc) => Err(StateDocError::Read(std::io::Error::from_raw_os_error(-rc))),
        }
    }
}

/// Rung when a watch has an event.
static BELL: Bell = Bell::new();

/// How often the watcher looks at the watches' health without an event.
const TICK: Duration = Duration::from_millis(200);

/// A target's reservation watcher thread: each time a watch has an event, and every
/// `TICK`, it runs `tend_all`, which tends each of the target's namespaces kept in a
/// cluster (`NsResv::tend`: applies other gateways' changes, their effects delivered to
/// the target's reactors, and keeps their watches healthy). The caller walks the
/// namespaces and delivers the effects: this layer knows neither.
pub fn watcher(tend_all: impl FnMut() + Send + 'static) -> Result<BellThread, TargetError> {
    Ok(BellThread::spawn("resv-watch", &BELL, Some(TICK), tend_all)?)
}
