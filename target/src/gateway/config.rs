//! A gateway group's configuration, kept in the cluster: one RADOS object,
//! `pollux.gateway.<group>.config`, holds the group-scoped part of every gateway's
//! configuration (`pollux_conf::group`: subsystems, their hosts and keys, rbd namespaces,
//! per-gateway listeners) as a TOML document with its secrets sealed ([`super::seal`]), the
//! version of the last change, and each gateway's slot (its controller IDs), as Ceph's
//! NVMe-oF gateway keeps `nvmeof.<group>.state`.
//!
//! A change, through any gateway ([`Service::change`]), reads the object, edits the
//! document, validates it as this gateway would run it, and writes it back with the object
//! version it read asserted (`rados_write_op_assert_version`): a change that raced another
//! is made again on the newer document (both land) or refused if it no longer validates,
//! never lost. The writer applies it, then notifies the object's watchers: every gateway's
//! follower ([`Service::sync`], on its own thread, also every second without a notify)
//! reads the object, applies the difference with the same reconciliation as `ctl reload`
//! (controllers the change does not concern stay), records the version it applied in
//! `pollux.gateway.<group>.applied.<name>`, and acknowledges; the notify returns once every
//! live gateway did, so the change's answer says how many have it.
//!
//! A gateway that cannot reach the cluster refuses changes (the object is the only place
//! they land) and serves on what it applied last. An object of a newer format, or one that
//! does not parse, is refused with its name and version, and nothing of it is applied.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pollux_conf::RbdBackend;
use pollux_reactor::Remote;
use serde::{Deserialize, Serialize};
use toml_edit::DocumentMut;
use tracing::{info, warn};

use super::seal::{self, GroupKey, SealError};
use crate::backend::StoreError;
use crate::backend::cluster::{ClusterObject, Inbox, NotifyReply, WatchEvent};
use crate::backend::rbd::client::Cluster;
use crate::backend::rbd::group_object::GroupObjects;
use crate::backend::rbd::resv_object::RadosResvObject;
use crate::bell::{Bell, BellThread};
use crate::error::TargetError;
use crate::shared::Shared;

/// The object's format; a newer one is refused, never rewritten.
pub const FORMAT: u32 = 1;

/// How often a follower reads the object without a notify (a missed notify, a lost watch).
const POLL: Duration = Duration::from_secs(1);

/// How long a change waits for the other gateways to acknowledge it (a gateway killed
/// meanwhile is waited for this long, until its watch times out).
const NOTIFY_TIMEOUT: Duration = Duration::from_secs(3);

/// How many times a change is made again on a newer document before it gives up.
const TRIES: u32 = 32;

/// Rung by the watch's notifies.
static BELL: Bell = Bell::new();

/// The group's configuration object, as stored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stored {
    /// [`FORMAT`].
    pub format: u32,
    /// Changes made to the group's configuration since it was created, each counted once.
    pub version: u64,
    /// Each gateway's slot: its controller IDs (`pollux_conf::group::cntlid_range`).
    #[serde(default)]
    pub slots: BTreeMap<String, u16>,
    /// The group-scoped conf document, its secrets sealed.
    #[serde(default)]
    pub conf: String,
    /// The gateway that made the last change.
    #[serde(default)]
    pub changed_by: String,
    /// What the last change was (the control method).
    #[serde(default)]
    pub change: String,
}

/// What a gateway records once it applied a version (or failed to).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    /// The version it runs.
    pub version: u64,
    /// Why the newest version it read is not applied (None: it is).
    #[serde(default)]
    pub error: Option<String>,
}

/// Why the group's configuration cannot be read, changed or applied.
#[derive(Debug, thiserror::Error)]
pub enum GroupConfigError {
    /// The cluster did not answer, or refused.
    #[error(
        "the group's configuration {object}: {}: group changes are refused while this gateway cannot reach the cluster (it serves on what it applied last)",
        std::io::Error::from_raw_os_error(- .rc)
    )]
    Cluster {
        /// The object.
        object: String,
        /// librados' negative errno.
        rc: i32,
    },
    /// A change's write timed out: the cluster may apply it or not.
    #[error(
        "the group's configuration {object}: the cluster did not confirm the change (version {version}) in time: it may land or not (`pollux ctl group` shows which once the cluster answers); nothing is half-applied"
    )]
    Unsure {
        /// The object.
        object: String,
        /// The version the change would make.
        version: u64,
    },
    /// The cluster connection could not be made.
    #[error("the group's configuration {object}: {source}")]
    Connect {
        /// The object.
        object: String,
        /// Why.
        #[source]
        source: Box<StoreError>,
    },
    /// Written by a newer pollux.
    #[error(
        "the group's configuration {object} (object version {version}) is format {format}, this pollux reads format {FORMAT}: nothing of it is applied (upgrade this gateway)"
    )]
    Future {
        /// The object.
        object: String,
        /// Its RADOS version.
        version: u64,
        /// Its format.
        format: u32,
    },
    /// Not a group configuration pollux wrote.
    #[error(
        "the group's configuration {object} (object version {version}) is malformed: {why}; nothing of it is applied"
    )]
    Malformed {
        /// The object.
        object: String,
        /// Its RADOS version.
        version: u64,
        /// Why.
        why: String,
    },
    /// Other gateways changed the group as often as this change was tried.
    #[error("the group's configuration changed {0} times while this change was made: try again")]
    Busy(u32),
    /// The group has a slot for every gateway it may have.
    #[error("the group has {max} gateways already: no slot (controller IDs) for gateway {name}")]
    Full {
        /// The gateway.
        name: String,
        /// The most a group may have.
        max: u16,
    },
    /// A secret does not seal or open.
    #[error(transparent)]
    Seal(#[from] SealError),
    /// The document is not right for a group.
    #[error(transparent)]
    Group(#[from] pollux_conf::group::GroupError),
    /// The configuration it makes is refused, or applying it failed.
    #[error(transparent)]
    Target(#[from] TargetError),
}

/// What a change did.
#[derive(Debug, Clone)]
pub struct Report {
    /// The group's version now.
    pub version: u64,
    /// What this gateway's reconciliation changed.
    pub changes: crate::mutate::Changes,
    /// Gateways that acknowledged the change (this one included).
    pub notify: NotifyReply,
    /// Attempts (more than one: it raced other changes).
    pub tries: u32,
}

/// The object's name.
pub fn oid(group: &str) -> String {
    format!("pollux.gateway.{group}.config")
}

fn applied_oid(group: &str, name: &str) -> String {
    format!("pollux.gateway.{group}.applied.{name}")
}

/// The per-gateway records beside the object (what each gateway applied).
pub trait Records: Send + Sync {
    /// Object `oid`'s bytes (None: it does not exist).
    fn read(&self, oid: &str) -> Result<Option<Vec<u8>>, i32>;
    /// Replace object `oid` with `data`.
    fn write(&self, oid: &str, data: &[u8]) -> Result<(), i32>;
}

impl Records for GroupObjects {
    fn read(&self, oid: &str) -> Result<Option<Vec<u8>>, i32> {
        Ok(GroupObjects::read(self, oid)?.map(|(b, _)| b))
    }

    fn write(&self, oid: &str, data: &[u8]) -> Result<(), i32> {
        GroupObjects::write(self, oid, data, Some(0)).map(|_| ())
    }
}

/// The connection to the group's objects: the configuration object (watched, version-
/// asserted writes, notify) and the records beside it. RADOS's, or a test's.
pub struct Conn {
    /// The configuration object.
    pub obj: Box<dyn ClusterObject>,
    /// The gateways' records.
    pub records: Box<dyn Records>,
}

/// Makes a connection (blocking on the cluster).
pub type Connector = Box<dyn Fn() -> Result<Conn, GroupConfigError> + Send + Sync>;

/// The RADOS connection of the group of `cluster` (a new client of the cluster).
fn rados(cluster: RbdBackend, group: String, object: String) -> Connector {
    Box::new(move || {
        let wrap = |e: StoreError| GroupConfigError::Connect {
            object: object.clone(),
            source: Box::new(e),
        };
        let c = Cluster::private(&cluster).map_err(wrap)?;
        let obj =
            RadosResvObject::open_named(c.clone(), &cluster, oid(&group), "the group's configuration").map_err(wrap)?;
        let records = GroupObjects::on(c, &cluster).map_err(wrap)?;
        Ok(Conn {
            obj: Box::new(obj),
            records: Box::new(records),
        })
    })
}

/// This gateway's part in the group's configuration: the follower and the changes.
pub struct Service {
    group: String,
    me: String,
    object: String,
    connector: Connector,
    key: Result<Option<Arc<GroupKey>>, String>,
    conn: Mutex<Option<Arc<Conn>>>,
    inbox: Arc<Inbox>,
    /// One change at a time from this gateway.
    changing: Mutex<()>,
    /// The last error following the group (None: the last read was applied).
    error: Mutex<Option<String>>,
    /// The record this gateway wrote last (rewritten only when it changes).
    recorded: Mutex<Option<Applied>>,
    shared: Arc<Shared>,
    remotes: Arc<[Remote]>,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("object", &self.object)
            .finish_non_exhaustive()
    }
}

/// The follower's thread (stopped when dropped) and the service it runs.
#[derive(Debug)]
pub struct Follower {
    service: Arc<Service>,
    _thread: BellThread,
}

/// The group key of gateway `conf` (None: it has none; Err: it does not load, why).
fn load_key(conf: &pollux_conf::Gateway) -> Result<Option<Arc<GroupKey>>, String> {
    match &conf.key_file {
        None => Ok(None),
        Some(p) => GroupKey::load(p, &conf.group)
            .map(|k| Some(Arc::new(k)))
            .map_err(|e| e.to_string()),
    }
}

/// Seal the reservation objects' keys of this process's namespaces under gateway `conf`'s
/// group key (before any namespace opens: a new process of an upgrade, a restart, opens
/// sealed states).
pub fn install_sealer(conf: &pollux_conf::Gateway) {
    if let Ok(Some(k)) = load_key(conf) {
        crate::resv::seal::set_sealer(Some(k));
    }
}

impl Follower {
    /// Start following the group's configuration of gateway `conf`.
    pub fn start(
        conf: &pollux_conf::Gateway,
        shared: Arc<Shared>,
        remotes: Arc<[Remote]>,
    ) -> Result<Self, TargetError> {
        let key = load_key(conf);
        // The reservation objects of the group's images seal their keys as well.
        if let Ok(Some(k)) = &key {
            crate::resv::seal::set_sealer(Some(k.clone()));
        }
        if let Err(e) = &key {
            warn!(error = %e, "gateway: the group key does not load: the group's keys cannot be opened here");
        }
        let object = match &conf.cluster.rados_namespace {
            Some(ns) => format!("{}/{ns}/{}", conf.cluster.pool, oid(&conf.group)),
            None => format!("{}/{}", conf.cluster.pool, oid(&conf.group)),
        };
        // A change is an operator waiting at a prompt: a cluster that has not answered in
        // 5 s is said to be unreachable (the heartbeat's connection waits the grace).
        let mut cluster = conf.cluster.clone();
        cluster.op_timeout_s = cluster.op_timeout_s.min(5);
        let connector = rados(cluster, conf.group.clone(), object.clone());
        let service = Arc::new(Service::new(conf, object, connector, key, shared, remotes));
        let s = service.clone();
        let thread = BellThread::spawn("group-config", &BELL, Some(POLL), move || s.sync())?;
        // The first read now, not a second from now.
        BELL.ring();
        Ok(Self {
            service,
            _thread: thread,
        })
    }

    /// The service (the control plane changes the group through it).
    pub fn service(&self) -> Arc<Service> {
        self.service.clone()
    }
}

impl Service {
    /// The service of gateway `conf`, reaching object `object` through `connector`.
    pub fn new(
        conf: &pollux_conf::Gateway,
        object: String,
        connector: Connector,
        key: Result<Option<Arc<GroupKey>>, String>,
        shared: Arc<Shared>,
        remotes: Arc<[Remote]>,
    ) -> Self {
        Service {
            group: conf.group.clone(),
            me: conf.name.clone(),
            object,
            connector,
            key,
            conn: Mutex::new(None),
            inbox: Arc::new(Inbox::new(&BELL)),
            changing: Mutex::new(()),
            error: Mutex::new(None),
            recorded: Mutex::new(None),
            shared,
            remotes,
        }
    }

    fn key(&self) -> Result<Option<&GroupKey>, GroupConfigError> {
        match &self.key {
            Ok(k) => Ok(k.as_deref()),
            Err(e) => Err(GroupConfigError::Seal(SealError::KeyFile {
                path: "[gateway] key_file".into(),
                why: e.clone(),
            })),
        }
    }

    fn cluster_error(&self, rc: i32) -> GroupConfigError {
        GroupConfigError::Cluster {
            object: self.object.clone(),
            rc,
        }
    }

    /// The connection, made (and the object watched) if there is none.
    fn connect(&self) -> Result<Arc<Conn>, GroupConfigError> {
        let mut c = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = c.as_ref() {
            return Ok(c.clone());
        }
        let Conn { obj, records } = (self.connector)()?;
        let mut watched = obj.watch(self.inbox.clone());
        if watched == Err(-libc::ENOENT) {
            // A watch needs the object: the first gateway creates it empty (version 0 is
            // written by whoever reads it first, `read_with_slot`).
            obj.write(b"", None).map_err(|rc| self.cluster_error(rc))?;
            watched = obj.watch(self.inbox.clone());
        }
        watched.map_err(|rc| self.cluster_error(rc))?;
        let conn = Arc::new(Conn { obj, records });
        *c = Some(conn.clone());
        Ok(conn)
    }

    /// Drop the connection (the cluster refused it: blocklisted, or the watch is lost):
    /// the next sync makes a new one.
    fn disconnect(&self) {
        if let Some(c) = self.conn.lock().unwrap_or_else(|p| p.into_inner()).take() {
            // Ending the watch and the client waits on the cluster (up to its timeouts):
            // not on the follower's or a control client's time.
            let _ = std::thread::Builder::new()
                .name("group-config-close".into())
                .spawn(move || c.obj.close());
        }
    }

    /// The object as stored and its RADOS version (None: not created yet).
    fn read(&self, conn: &Conn) -> Result<Option<(Stored, u64)>, GroupConfigError> {
        let Some((bytes, version)) = conn.obj.read().map_err(|rc| self.cluster_error(rc))? else {
            return Ok(None);
        };
        // An object created by `rados create` and never written: not created yet.
        if bytes.is_empty() {
            return Ok(Some((Stored::default(), version)));
        }
        let s: Stored = serde_json::from_slice(&bytes).map_err(|e| GroupConfigError::Malformed {
            object: self.object.clone(),
            version,
            why: e.to_string(),
        })?;
        if s.format > FORMAT {
            return Err(GroupConfigError::Future {
                object: self.object.clone(),
                version,
                format: s.format,
            });
        }
        if s.format == 0 {
            return Err(GroupConfigError::Malformed {
                object: self.object.clone(),
                version,
                why: "format 0".into(),
            });
        }
        Ok(Some((s, version)))
    }

    /// Write `s` if the object's version is still `version` (None: create it); false: it
    /// changed first.
    fn write(&self, conn: &Conn, s: &Stored, version: Option<u64>) -> Result<bool, GroupConfigError> {
        let bytes = serde_json::to_vec(s).map_err(|e| GroupConfigError::Malformed {
            object: self.object.clone(),
            version: version.unwrap_or(0),
            why: e.to_string(),
        })?;
        Ok(conn
            .obj
            .write(&bytes, version)
            .map_err(|rc| self.cluster_error(rc))?
            .is_some())
    }

    /// The object, created (version 0, this gateway in slot 0) if it is not there, with a
    /// slot for this gateway.
    fn read_with_slot(&self, conn: &Conn) -> Result<(Stored, u64), GroupConfigError> {
        for _ in 0..TRIES {
            let (mut s, v) = match self.read(conn)? {
                Some((s, v)) if s.format != 0 => (s, Some(v)),
                Some((_, v)) => (Stored::default(), Some(v)),
                None => (Stored::default(), None),
            };
            s.format = FORMAT;
            if let Some(v) = v
                && s.slots.contains_key(&self.me)
            {
                return Ok((s, v));
            }
            if !s.slots.contains_key(&self.me) {
                let free = (0..pollux_conf::group::MAX_SLOTS)
                    .find(|n| !s.slots.values().any(|x| x == n))
                    .ok_or_else(|| GroupConfigError::Full {
                        name: self.me.clone(),
                        max: pollux_conf::group::MAX_SLOTS,
                    })?;
                s.slots.insert(self.me.clone(), free);
                info!(group = %self.group, slot = free, "gateway: joining the group's configuration");
            }
            // Joining is not a change of the configuration: the version stays.
            self.write(conn, &s, v)?;
        }
        Err(GroupConfigError::Busy(TRIES))
    }

    /// One follower round: read the object and apply what changed, then acknowledge the
    /// notifies that woke it.
    fn sync(&self) {
        let events = self.inbox.drain();
        let mut acks = Vec::new();
        let mut lost = false;
        for e in events {
            match e {
                WatchEvent::Notify { notify_id, cookie, .. } => acks.push((notify_id, cookie)),
                WatchEvent::Lost(rc) => {
                    warn!(object = %self.object, rc, "gateway: the watch on the group's configuration is lost: watching again");
                    lost = true;
                }
            }
        }
        if lost {
            self.disconnect();
        }
        let r = self.connect().and_then(|conn| {
            let r = self.follow(&conn);
            for (id, cookie) in acks {
                conn.obj.ack(id, cookie);
            }
            r
        });
        let mut err = self.error.lock().unwrap_or_else(|p| p.into_inner());
        match r {
            Ok(()) => {
                if err.take().is_some() {
                    info!(object = %self.object, "gateway: the group's configuration is applied again");
                }
            }
            Err(e) => {
                // A blocklisted or shut-down client never answers again: a new one. A slow
                // cluster is waited for on the same.
                let cluster = matches!(e, GroupConfigError::Cluster { rc, .. } if rc == -libc::ESHUTDOWN || rc == -libc::ENOTCONN);
                let e = e.to_string();
                if err.as_deref() != Some(e.as_str()) {
                    warn!(error = %e, "gateway: the group's configuration");
                }
                *err = Some(e);
                drop(err);
                if cluster {
                    self.disconnect();
                }
            }
        }
    }

    fn follow(&self, conn: &Conn) -> Result<(), GroupConfigError> {
        let (s, _) = self.read_with_slot(conn)?;
        let r = self.apply(&s);
        self.record(conn, r.as_ref().err().map(ToString::to_string));
        r.map(|_| ())
    }

    /// Record the version this gateway runs, and why the newest is not applied (`error`).
    fn record(&self, conn: &Conn, error: Option<String>) {
        let record = Applied {
            version: self.applied_version(),
            error,
        };
        let mut last = self.recorded.lock().unwrap_or_else(|p| p.into_inner());
        if last.as_ref() == Some(&record) {
            return;
        }
        // A failed write is only a stale `ctl group` line: the next round writes it again.
        if let Ok(bytes) = serde_json::to_vec(&record)
            && conn.records.write(&applied_oid(&self.group, &self.me), &bytes).is_ok()
        {
            *last = Some(record);
        }
    }

    /// The version this gateway runs.
    pub fn applied_version(&self) -> u64 {
        self.shared
            .group
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map_or(0, |g| g.version)
    }

    /// Apply `s` unless this gateway runs it already: the changes made (None: nothing to do).
    fn apply(&self, s: &Stored) -> Result<Option<crate::mutate::Changes>, GroupConfigError> {
        let mut g = self.shared.group.lock().unwrap_or_else(|p| p.into_inner());
        let Some(gc) = g.as_mut() else { return Ok(None) };
        let slot = s.slots.get(&self.me).copied();
        // A new process has no slot yet: it applies once whatever the version.
        if gc.version == s.version && gc.slot == slot {
            return Ok(None);
        }
        if gc.version > s.version {
            // Only a group recreated (deleted and made anew) goes back: say so, apply it.
            warn!(object = %self.object, running = gc.version, stored = s.version, "gateway: the group's configuration went back in version (recreated?): applying it");
        }
        let doc = seal::open_doc(&s.conf, self.key()?)?;
        let origin = self.shared.origin();
        let (mut cfg, merged) = gc.compose(&gc.local, &doc, slot, &origin)?;
        crate::mutate::apply_control_socket_arg(&mut cfg);
        let ch = crate::mutate::reconcile(&self.shared, &self.remotes, cfg)?;
        if !ch.hosts_changed.is_empty() {
            crate::mutate::settle(&self.remotes, Duration::from_secs(2));
        }
        gc.doc = doc;
        gc.version = s.version;
        gc.slot = slot;
        gc.took(merged);
        info!(group = %self.group, version = s.version, by = %s.changed_by, change = %s.change, "gateway: the group's configuration applied");
        Ok(Some(ch))
    }

    /// Change the group's configuration: `edit` the document (run again on a newer one when
    /// another change raced this one), validate, write, apply here, and tell the others.
    /// `what` names the change (the control method).
    pub fn change<T, E>(
        &self,
        what: &str,
        mut edit: impl FnMut(&mut DocumentMut) -> Result<T, E>,
    ) -> Result<(T, Report), E>
    where
        E: From<GroupConfigError>,
    {
        let _one = self.changing.lock().unwrap_or_else(|p| p.into_inner());
        let conn = self.connect()?;
        for tries in 1..=TRIES {
            let (s, objver) = self.read_with_slot(&conn)?;
            let key = self.key()?;
            let opened = seal::open_doc(&s.conf, key).map_err(GroupConfigError::from)?;
            let mut doc: DocumentMut = opened.parse().map_err(|e| GroupConfigError::Malformed {
                object: self.object.clone(),
                version: objver,
                why: format!("its document: {e}"),
            })?;
            let out = edit(&mut doc)?;
            seal::inline_key_files(&mut doc).map_err(GroupConfigError::from)?;
            let text = zeroize::Zeroizing::new(doc.to_string());
            pollux_conf::group::check(&text).map_err(GroupConfigError::from)?;
            // Validated as this gateway would run it: every rule of a conf file applies.
            {
                let g = self.shared.group.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(gc) = g.as_ref() {
                    let origin = self.shared.origin();
                    gc.compose(&gc.local, &text, s.slots.get(&self.me).copied(), &origin)
                        .map_err(GroupConfigError::from)?;
                }
            }
            seal::seal_doc(&mut doc, key).map_err(GroupConfigError::from)?;
            let next = Stored {
                format: FORMAT,
                version: s.version + 1,
                slots: s.slots.clone(),
                conf: doc.to_string(),
                changed_by: self.me.clone(),
                change: what.to_string(),
            };
            match self.write(&conn, &next, Some(objver)) {
                Ok(true) => {}
                Ok(false) => continue,
                // The write may still be applied by the OSD: the follower finds out.
                Err(GroupConfigError::Cluster { rc, .. }) if rc == -libc::ETIMEDOUT => {
                    BELL.ring();
                    return Err(GroupConfigError::Unsure {
                        object: self.object.clone(),
                        version: next.version,
                    }
                    .into());
                }
                Err(e) => return Err(e.into()),
            }
            info!(group = %self.group, version = next.version, change = what, tries, "gateway: the group's configuration changed");
            let applied = self.apply(&next);
            self.record(&conn, applied.as_ref().err().map(ToString::to_string));
            let changes = applied?.unwrap_or_default();
            let notify = conn
                .obj
                .notify(next.version.to_string().as_bytes(), NOTIFY_TIMEOUT)
                .unwrap_or_else(|rc| {
                    warn!(object = %self.object, rc, "gateway: notifying the group of its new configuration failed: the others read it within a second");
                    NotifyReply::default()
                });
            return Ok((
                out,
                Report {
                    version: next.version,
                    changes,
                    notify,
                    tries,
                },
            ));
        }
        Err(GroupConfigError::Busy(TRIES).into())
    }

    /// The group's configuration for `pollux ctl group`: the object (its secrets left
    /// sealed), this gateway's view, and what every gateway applied.
    pub fn show(&self) -> Result<serde_json::Value, GroupConfigError> {
        let conn = self.connect()?;
        let (s, objver) = self.read_with_slot(&conn)?;
        let mut gateways = Vec::new();
        for (name, slot) in &s.slots {
            let applied: Option<Applied> = conn
                .records
                .read(&applied_oid(&self.group, name))
                .ok()
                .flatten()
                .and_then(|b| serde_json::from_slice(&b).ok());
            let (lo, hi) = pollux_conf::group::cntlid_range(*slot);
            gateways.push(serde_json::json!({
                "name": name,
                "self": *name == self.me,
                "slot": slot,
                "cntlid": [lo, hi],
                "applied": applied.as_ref().map(|a| a.version),
                "error": applied.and_then(|a| a.error),
            }));
        }
        let g = self.shared.group.lock().unwrap_or_else(|p| p.into_inner());
        let (running, peers, subsystems) = g.as_ref().map_or((0, Vec::new(), Vec::new()), |gc| {
            (
                gc.version,
                gc.peers
                    .iter()
                    .map(|p| {
                        serde_json::json!({
                            "gateway": p.gateway,
                            "address": p.address.to_string(),
                            "subsystems": p.subsystems,
                            "listed": !gc.down.contains(&p.gateway),
                        })
                    })
                    .collect(),
                gc.subsystems.clone(),
            )
        });
        Ok(serde_json::json!({
            "group": self.group,
            "name": self.me,
            "object": self.object,
            "object_version": objver,
            "format": s.format,
            "version": s.version,
            "running": running,
            "changed_by": s.changed_by,
            "change": s.change,
            "subsystems": subsystems,
            "peer_listeners": peers,
            "gateways": gateways,
            "error": self.error.lock().unwrap_or_else(|p| p.into_inner()).clone(),
            "conf": seal::redact(&s.conf),
        }))
    }

    /// The group's document with its secrets opened, and its version (`ctl group export`).
    pub fn export(&self) -> Result<(zeroize::Zeroizing<String>, u64), GroupConfigError> {
        let conn = self.connect()?;
        let (s, _) = self.read_with_slot(&conn)?;
        Ok((seal::open_doc(&s.conf, self.key()?)?, s.version))
    }
}

/// The gateways of the group that are fenced now are `down`: their listeners leave the
/// discovery log (and come back when they are not), with a Discovery Log Change event to
/// the hosts' discovery controllers (NVMe-oF 1.1 §5.3) and nothing else disturbed.
pub fn set_down(shared: &Arc<Shared>, remotes: &[Remote], down: std::collections::BTreeSet<String>) {
    let mut g = shared.group.lock().unwrap_or_else(|p| p.into_inner());
    let Some(gc) = g.as_mut() else { return };
    if gc.down == down {
        return;
    }
    info!(
        ?down,
        "gateway: the group's gateways that serve changed: the discovery log follows"
    );
    let before = std::mem::replace(&mut gc.down, down);
    let origin = shared.origin();
    let r = gc
        .compose(&gc.local, &gc.doc, gc.slot, &origin)
        .and_then(|(mut cfg, _)| {
            crate::mutate::apply_control_socket_arg(&mut cfg);
            crate::mutate::reconcile(shared, remotes, cfg)
        });
    if let Err(e) = r {
        warn!(error = %e, "gateway: the discovery log could not follow the group's membership");
        gc.down = before;
    }
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
