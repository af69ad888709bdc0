//! The gateway group's shared state and one member's decisions over it, free of RADOS: the
//! agent ([`super::Agent`]) runs [`Member::tick`] every heartbeat against the cluster (the
//! group's objects, `backend::rbd::group_object`); the unit tests run it against an
//! in-memory cluster with a clock of their own.
//!
//! The group object (`pollux.gateway.<group>`) holds one record per member and is changed
//! only by a write that asserts the version read, so two survivors never both fence one
//! member, nor both take its ANA groups. Each member's heartbeat is an object of its own
//! (`pollux.gateway.<group>.beat.<name>`), rewritten every heartbeat: its object version
//! moves on, and a member whose version stood still for `grace` (as this member saw it,
//! while its own view of the cluster was fresh) is fenced.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tracing::{error, info, warn};

/// The group object's format; a newer one is refused, never rewritten.
pub const FORMAT: u32 = 1;

/// What a member is, as the group object records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Standing {
    /// Registered and heartbeating.
    Alive,
    /// Fenced by a survivor: its cluster clients are (being) blocklisted.
    Fenced,
    /// Fenced, and back with a new incarnation: its ANA groups stay with the survivor
    /// until the failback delay passed.
    Rejoining,
}

/// One member's record in the group object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// Chosen at random each time the process starts: tells a restarted member from the
    /// one that was fenced.
    pub incarnation: u64,
    /// Its NVMe/TCP listeners (for `pollux ctl gateways` and for the hosts' operators).
    pub listeners: Vec<String>,
    /// The ANA groups it owns.
    pub ana_groups: Vec<u32>,
    /// The client addresses of every cluster connection it holds (`rados_getaddrs`): what
    /// fencing blocklists.
    pub addrs: Vec<String>,
    /// Alive, fenced or rejoining.
    pub standing: Standing,
    /// The member that fenced it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fenced_by: Option<String>,
    /// Its addresses are on the cluster's blocklist.
    #[serde(default)]
    pub blocklisted: bool,
    /// The survivor serving its ANA groups meanwhile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub taken_by: Option<String>,
}

/// The group object.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Group {
    /// [`FORMAT`].
    pub format: u32,
    /// Records by member name.
    pub members: BTreeMap<String, Record>,
}

/// What librados returns to a blocklisted client (Ceph's `EBLOCKLISTED` is `ESHUTDOWN`).
pub const EBLOCKLISTED: i32 = libc::ESHUTDOWN;

/// A librados call's negative errno.
pub type Errno = i32;

/// What a member needs from the cluster. Every call may block up to the group connection's
/// operation timeout.
pub trait GroupStore {
    /// The group object and its version (None: not created yet).
    fn read_group(&self) -> Result<Option<(Vec<u8>, u64)>, Errno>;
    /// Replace the group object if its version is still `version` (None: create it): the
    /// version written, or None when someone changed it first.
    fn write_group(&self, data: &[u8], version: Option<u64>) -> Result<Option<u64>, Errno>;
    /// Rewrite this member's heartbeat object.
    fn beat(&self, name: &str, data: &[u8]) -> Result<(), Errno>;
    /// The version of a member's heartbeat object (None: it has none).
    fn beat_version(&self, name: &str) -> Result<Option<u64>, Errno>;
    /// Blocklist a client address for `expiry_s` seconds.
    fn blocklist(&self, addr: &str, expiry_s: u32) -> Result<(), Errno>;
    /// Wait until this client has the cluster's newest OSD map (the blocklists just added
    /// with it).
    fn wait_for_latest_osdmap(&self) -> Result<(), Errno>;
    /// The client addresses of every cluster connection this process holds.
    fn own_addrs(&self) -> Vec<String>;
}

/// The ANA states this member's listeners should report over their conf's, by group.
pub type Overlay = BTreeMap<u32, pollux_conf::AnaState>;

/// What one member saw of another.
#[derive(Debug, Clone)]
struct Seen {
    version: Option<u64>,
    /// When the version last moved (or when watching it was (re)started).
    since: Instant,
}

/// One member of the group: this gateway.
#[derive(Debug)]
pub struct Member {
    /// The conf's `[gateway]`.
    pub conf: pollux_conf::Gateway,
    /// This process's incarnation.
    pub incarnation: u64,
    /// This gateway's listeners, as bound.
    pub listeners: Vec<String>,
    seen: BTreeMap<String, Seen>,
    /// The end of the last tick whose cluster calls all succeeded.
    fresh: Option<Instant>,
    /// When this member first saw each rejoining member it serves the groups of.
    rejoining_since: BTreeMap<String, Instant>,
    /// Members whose newest OSD map this member waited for before taking their groups.
    osdmap_waited: BTreeMap<String, u64>,
    seq: u64,
    /// The last group object read, for `pollux ctl gateways`.
    pub last: Option<Group>,
    /// This member is fenced: it serves none of its groups until it rejoined.
    pub fenced: bool,
    /// Why the cluster refused the last fence this member tried (a missing cap), until one
    /// goes through.
    pub refusal: Option<String>,
}

/// What a tick concluded, for the agent to apply.
#[derive(Debug, Default, PartialEq)]
pub struct Outcome {
    /// The ANA states this member's listeners should report now.
    pub overlay: Overlay,
    /// This member found itself fenced (its clients are blocklisted): it must reconnect.
    pub fenced: bool,
}

impl Member {
    /// Member `conf.name` with a new incarnation.
    pub fn new(conf: pollux_conf::Gateway, incarnation: u64, listeners: Vec<String>) -> Self {
        Self {
            conf,
            incarnation,
            listeners,
            seen: BTreeMap::new(),
            fresh: None,
            rejoining_since: BTreeMap::new(),
            osdmap_waited: BTreeMap::new(),
            refusal: None,
            seq: 0,
            last: None,
            fenced: false,
        }
    }

    fn grace(&self) -> Duration {
        Duration::from_millis(self.conf.grace_ms.into())
    }

    fn heartbeat(&self) -> Duration {
        Duration::from_millis(self.conf.heartbeat_ms.into())
    }

    /// How long a member's heartbeat has stood still, as this member saw it (None: not
    /// watched).
    pub fn silent_for(&self, name: &str, now: Instant) -> Option<Duration> {
        self.seen.get(name).map(|s| now.saturating_duration_since(s.since))
    }

    /// One heartbeat: beat, read the group, register, fence the silent, take over and fail
    /// back. Errors of the cluster end the tick early: a member that cannot reach the
    /// cluster fences nobody.
    pub fn tick(&mut self, store: &dyn GroupStore, now: Instant) -> Result<Outcome, Errno> {
        let result = self.tick_inner(store, now);
        match &result {
            Ok(_) => {
                // A tick that comes late (this process was paused, or the cluster slow)
                // restarts every watch: silence this member did not see is no evidence.
                if self
                    .fresh
                    .is_none_or(|f| now.saturating_duration_since(f) > 2 * self.heartbeat())
                {
                    for s in self.seen.values_mut() {
                        s.since = now;
                    }
                }
                self.fresh = Some(now);
            }
            Err(rc) => {
                self.fresh = None;
                if *rc == -EBLOCKLISTED {
                    return Ok(self.found_fenced());
                }
            }
        }
        result
    }

    /// Only the heartbeat, while a hot upgrade hands this gateway over: the next process
    /// registers itself (the same incarnation, its own client addresses).
    pub fn beat_only(&mut self, store: &dyn GroupStore) -> Result<(), Errno> {
        self.seq += 1;
        let beat = serde_json::json!({"incarnation": self.incarnation, "seq": self.seq}).to_string();
        store.beat(&self.conf.name, beat.as_bytes())
    }

    fn found_fenced(&mut self) -> Outcome {
        if !self.fenced {
            error!(
                group = %self.conf.group, name = %self.conf.name,
                "gateway: this gateway was fenced (its cluster clients are blocklisted): its ANA groups are inaccessible here until it rejoins"
            );
        }
        self.fenced = true;
        Outcome {
            overlay: self.own_overlay(pollux_conf::AnaState::Inaccessible),
            fenced: true,
        }
    }

    fn own_overlay(&self, state: pollux_conf::AnaState) -> Overlay {
        self.conf.ana_groups.iter().map(|&g| (g, state)).collect()
    }

    fn tick_inner(&mut self, store: &dyn GroupStore, now: Instant) -> Result<Outcome, Errno> {
        self.beat_only(store)?;
        let (mut group, version) = read(store)?;
        let addrs = store.own_addrs();
        // Registration, or the record this member's previous incarnation left.
        let mine = group.members.get(&self.conf.name).cloned();
        let need_write = match &mine {
            Some(r) if r.incarnation == self.incarnation => {
                if r.standing == Standing::Fenced {
                    return Ok(self.found_fenced());
                }
                r.addrs != addrs || r.listeners != self.listeners || r.ana_groups != self.conf.ana_groups
            }
            _ => true,
        };
        if need_write {
            let previous = mine;
            // A previous incarnation that was never fenced (a restart within the grace)
            // may still hold the images' locks, and its watches linger for the OSDs' watch
            // timeout: fence it ourselves, at once.
            if let Some(p) = previous
                .as_ref()
                .filter(|p| p.incarnation != self.incarnation && !p.blocklisted)
            {
                for a in &p.addrs {
                    if let Err(rc) = store.blocklist(a, self.conf.blocklist_expiry_s) {
                        warn!(addr = %a, rc, "gateway: cannot blocklist this gateway's previous incarnation");
                    }
                }
            }
            // The same incarnation with new addresses (a hot upgrade's next process) keeps its
            // standing; a new one whose groups a survivor serves rejoins.
            let (standing, taken_by) = match previous {
                Some(p) if p.incarnation == self.incarnation => (p.standing, p.taken_by),
                Some(p) if p.taken_by.is_some() => (Standing::Rejoining, p.taken_by),
                _ => (Standing::Alive, None),
            };
            let rec = Record {
                incarnation: self.incarnation,
                listeners: self.listeners.clone(),
                ana_groups: self.conf.ana_groups.clone(),
                addrs,
                standing,
                fenced_by: None,
                blocklisted: false,
                taken_by,
            };
            group.members.insert(self.conf.name.clone(), rec);
            if !write(store, &group, version)? {
                // Someone else wrote first: next heartbeat.
                return Ok(self.hold());
            }
            info!(group = %self.conf.group, name = %self.conf.name, ?standing, "gateway: registered");
            self.fenced = false;
            self.last = Some(group);
            return Ok(self.hold());
        }
        self.fenced = false;
        // Watch every other live member's heartbeat.
        let names: Vec<String> = group
            .members
            .keys()
            .filter(|n| **n != self.conf.name)
            .cloned()
            .collect();
        self.seen.retain(|n, _| names.contains(n));
        let mut silent = Vec::new();
        let (grace, heartbeat, fresh) = (self.grace(), self.heartbeat(), self.fresh);
        for n in &names {
            let v = store.beat_version(n)?;
            let s = self.seen.entry(n.clone()).or_insert(Seen { version: v, since: now });
            if s.version != v {
                s.version = v;
                s.since = now;
            }
            let alive = group.members[n].standing != Standing::Fenced;
            let watching = fresh.is_some_and(|f| now.saturating_duration_since(f) <= 2 * heartbeat);
            if alive && watching && now.saturating_duration_since(s.since) > grace {
                silent.push(n.clone());
            }
        }
        if !silent.is_empty() {
            self.fence(store, &mut group, version, &silent, now)?;
            self.last = Some(group);
            return Ok(self.hold());
        }
        // Blocklisting owed by this member (a fence whose blocklist failed last time).
        let owed: Vec<String> = group
            .members
            .iter()
            .filter(|(_, r)| {
                r.standing == Standing::Fenced && !r.blocklisted && r.fenced_by.as_deref() == Some(&self.conf.name)
            })
            .map(|(n, _)| n.clone())
            .collect();
        if !owed.is_empty() {
            self.blocklist_members(store, &mut group, version, &owed)?;
            self.last = Some(group);
            return Ok(self.hold());
        }
        // Failback: a member back from a fence gets its groups after the delay.
        let back: Vec<String> = group
            .members
            .iter()
            .filter(|(_, r)| r.standing == Standing::Rejoining && r.taken_by.as_deref() == Some(&self.conf.name))
            .map(|(n, _)| n.clone())
            .collect();
        self.rejoining_since.retain(|n, _| back.contains(n));
        for n in back {
            let since = *self.rejoining_since.entry(n.clone()).or_insert(now);
            if now.saturating_duration_since(since) < Duration::from_millis(self.conf.failback_delay_ms.into()) {
                continue;
            }
            // First this gateway stops reporting the groups optimized (the overlay below no
            // longer has them once the record says so); librbd hands the images' locks to
            // the owner when it asks for them, after what is in flight here completed.
            if let Some(r) = group.members.get_mut(&n) {
                r.standing = Standing::Alive;
                r.taken_by = None;
            }
            if write(store, &group, version)? {
                info!(group = %self.conf.group, member = %n, "gateway: failback: its ANA groups go back to it");
                self.rejoining_since.remove(&n);
            }
            self.last = Some(group);
            return Ok(self.hold());
        }
        // Take over the groups of fenced members this member was chosen for, once their
        // blocklist is in the OSD map this client has.
        for (n, r) in &group.members {
            if matches!(r.standing, Standing::Fenced | Standing::Rejoining)
                && r.blocklisted
                && r.taken_by.as_deref() == Some(&self.conf.name)
                && self.osdmap_waited.get(n) != Some(&r.incarnation)
            {
                store.wait_for_latest_osdmap()?;
                info!(group = %self.conf.group, member = %n, groups = ?r.ana_groups, "gateway: taking over the ANA groups of a fenced member");
                self.osdmap_waited.insert(n.clone(), r.incarnation);
            }
        }
        self.last = Some(group);
        Ok(self.hold())
    }

    /// The overlay as the last group object read says: this member's own groups optimized
    /// unless a survivor still serves them (then non-optimized), and the groups of members
    /// it took over optimized.
    fn hold(&self) -> Outcome {
        let mut overlay = Overlay::new();
        let Some(g) = &self.last else {
            return Outcome::default();
        };
        if let Some(me) = g.members.get(&self.conf.name) {
            let state = if me.taken_by.is_some() {
                pollux_conf::AnaState::NonOptimized
            } else {
                pollux_conf::AnaState::Optimized
            };
            overlay.extend(self.conf.ana_groups.iter().map(|&a| (a, state)));
        }
        for (n, r) in &g.members {
            // A rejoining member's previous incarnation was blocklisted (by its fencer, or
            // by itself as it registered again): its groups stay here until the failback.
            let taken = match r.standing {
                Standing::Fenced => self.osdmap_waited.get(n) == Some(&r.incarnation),
                Standing::Rejoining => true,
                Standing::Alive => false,
            };
            if taken && r.taken_by.as_deref() == Some(&self.conf.name) {
                overlay.extend(r.ana_groups.iter().map(|&a| (a, pollux_conf::AnaState::Optimized)));
            }
        }
        Outcome { overlay, fenced: false }
    }

    /// Mark `victims` fenced in one write (the version-asserted write decides who fences),
    /// choose the survivor with the fewest ANA groups to take their groups (and the groups
    /// they had taken from members fenced before), then blocklist them.
    fn fence(
        &mut self,
        store: &dyn GroupStore,
        group: &mut Group,
        version: Option<u64>,
        victims: &[String],
        now: Instant,
    ) -> Result<(), Errno> {
        let load = |n: &str, r: &Record| {
            r.ana_groups.len()
                + group
                    .members
                    .values()
                    .filter(|o| o.taken_by.as_deref() == Some(n))
                    .map(|o| o.ana_groups.len())
                    .sum::<usize>()
        };
        let taker = group
            .members
            .iter()
            .filter(|(n, r)| !victims.contains(n) && r.standing == Standing::Alive)
            .min_by_key(|(n, r)| (load(n, r), (*n).clone()))
            .map(|(n, _)| n.clone());
        for (n, r) in group.members.iter_mut() {
            if victims.contains(n) {
                r.standing = Standing::Fenced;
                r.fenced_by = Some(self.conf.name.clone());
                r.blocklisted = false;
                r.taken_by = taker.clone();
            } else if r.taken_by.as_ref().is_some_and(|t| victims.contains(t)) {
                r.taken_by = taker.clone();
            }
        }
        let Some(version) = write_versioned(store, group, version)? else {
            info!(members = ?victims, "gateway: another survivor fences them");
            return Ok(());
        };
        for v in victims {
            let silent_ms = self.silent_for(v, now).map_or(0, |d| d.as_millis());
            warn!(
                group = %self.conf.group, member = %v, silent_ms, taken_by = ?taker,
                "gateway: fencing a silent member"
            );
        }
        self.blocklist_members(store, group, Some(version), victims)
    }

    /// Blocklist every client address of `victims`, then record it.
    fn blocklist_members(
        &mut self,
        store: &dyn GroupStore,
        group: &mut Group,
        version: Option<u64>,
        victims: &[String],
    ) -> Result<(), Errno> {
        for victim in victims {
            let addrs = group.members.get(victim).map(|r| r.addrs.clone()).unwrap_or_default();
            for a in &addrs {
                if let Err(rc) = store.blocklist(a, self.conf.blocklist_expiry_s) {
                    if rc == -libc::EACCES || rc == -libc::EPERM {
                        let user = &self.conf.cluster.user;
                        let why = format!(
                            "the cluster refused to fence member {victim} (`osd blocklist add {a}`: {}): Ceph user client.{user} lacks the mon cap for it; grant it with `ceph auth caps client.{user} mon 'profile rbd' osd 'profile rbd'` (`profile rbd` allows `osd blocklist add`); until then nobody takes over {victim}'s ANA groups",
                            std::io::Error::from_raw_os_error(-rc)
                        );
                        // Once per cause, not every heartbeat.
                        if self.refusal.as_deref() != Some(why.as_str()) {
                            error!(member = %victim, addr = %a, user = %user, "gateway: {why}");
                        }
                        self.refusal = Some(why);
                    }
                    return Err(rc);
                }
            }
            self.refusal = None;
            if let Some(r) = group.members.get_mut(victim) {
                r.blocklisted = true;
            }
            info!(member = %victim, addrs = ?addrs, expiry_s = self.conf.blocklist_expiry_s, "gateway: fenced member blocklisted");
        }
        write(store, group, version)?;
        Ok(())
    }
}

fn read(store: &dyn GroupStore) -> Result<(Group, Option<u64>), Errno> {
    match store.read_group()? {
        None => Ok((
            Group {
                format: FORMAT,
                members: BTreeMap::new(),
            },
            None,
        )),
        Some((bytes, v)) => {
            let g: Group = serde_json::from_slice(&bytes).map_err(|e| {
                error!(error = %e, "gateway: the group object is not a group state pollux wrote: nothing is applied from it");
                -libc::EINVAL
            })?;
            if g.format > FORMAT {
                error!(
                    format = g.format,
                    known = FORMAT,
                    "gateway: the group object is of a newer format: nothing is applied from it"
                );
                return Err(-libc::EPROTO);
            }
            Ok((g, Some(v)))
        }
    }
}

fn write(store: &dyn GroupStore, g: &Group, version: Option<u64>) -> Result<bool, Errno> {
    write_versioned(store, g, version).map(|v| v.is_some())
}

/// Write `g` over `version`; the version written (re-read), or None when someone was first.
fn write_versioned(store: &dyn GroupStore, g: &Group, version: Option<u64>) -> Result<Option<u64>, Errno> {
    let data = serde_json::to_vec(g).map_err(|_| -libc::EINVAL)?;
    store.write_group(&data, version)
}
