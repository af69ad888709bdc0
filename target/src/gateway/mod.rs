//! Gateway groups (`[gateway]`): the members of a group share rbd images and watch each
//! other through the cluster, as Ceph's NVMe-oF gateway monitor does (`NVMeofGwMap.cc`:
//! beacons, a grace, `osd blocklist` of a failed gateway's clients, ANA groups moved to the
//! survivor with the fewest) without a monitor daemon: the group's state is one RADOS
//! object changed by version-asserted writes ([`state`]), and each member's agent thread
//! ([`Agent`]) heartbeats, fences a silent member (blocklisting every client address it
//! registered, so librbd may break its image locks at once rather than after the OSDs'
//! 30 s watch timeout), and reports the ANA groups it took over optimized on its listeners
//! (an ANA change event to the hosts' controllers) until the member is back and the
//! failback delay passed.
//!
//! The agent runs on its own thread, never on a reactor: every call blocks on the cluster
//! (bounded by the group connection's operation timeout, about the grace).

pub mod config;
pub mod seal;
pub mod state;
#[cfg(test)]
mod tests;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pollux_reactor::Remote;
use tracing::{info, warn};

use crate::backend::rbd::client::all_addrs;
use crate::backend::rbd::group_object::GroupObjects;
use crate::shared::Shared;
use state::{Errno, Group, GroupStore, Member};

/// The group's objects in the cluster.
struct RadosStore {
    objs: GroupObjects,
    group: String,
}

impl RadosStore {
    fn beat_oid(&self, name: &str) -> String {
        format!("pollux.gateway.{}.beat.{name}", self.group)
    }
}

impl GroupStore for RadosStore {
    fn read_group(&self) -> Result<Option<(Vec<u8>, u64)>, Errno> {
        self.objs.read(&format!("pollux.gateway.{}", self.group))
    }

    fn write_group(&self, data: &[u8], version: Option<u64>) -> Result<Option<u64>, Errno> {
        self.objs
            .write(&format!("pollux.gateway.{}", self.group), data, version)
    }

    fn beat(&self, name: &str, data: &[u8]) -> Result<(), Errno> {
        self.objs.write(&self.beat_oid(name), data, Some(0)).map(|_| ())
    }

    fn beat_version(&self, name: &str) -> Result<Option<u64>, Errno> {
        Ok(self.objs.read(&self.beat_oid(name))?.map(|(_, v)| v))
    }

    fn blocklist(&self, addr: &str, expiry_s: u32) -> Result<(), Errno> {
        self.objs.cluster.blocklist_add(addr, expiry_s)
    }

    fn wait_for_latest_osdmap(&self) -> Result<(), Errno> {
        self.objs.cluster.wait_for_latest_osdmap()
    }

    fn own_addrs(&self) -> Vec<String> {
        all_addrs()
    }
}

/// What `pollux ctl gateways` shows: the group as this member last read it.
#[derive(Debug, Clone, Default)]
pub struct View {
    /// The group's name and this member's.
    pub group: String,
    /// This gateway's name.
    pub name: String,
    /// The group object last read.
    pub last: Option<Group>,
    /// How long each other member's heartbeat has stood still, as seen here.
    pub silent_ms: Vec<(String, u128)>,
    /// The last error talking to the cluster (None: the last heartbeat went through).
    pub error: Option<String>,
    /// This gateway found itself fenced.
    pub fenced: bool,
}

/// A gateway's member thread: stopped and joined when dropped.
#[derive(Debug)]
pub struct Agent {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    view: Arc<Mutex<View>>,
    /// The group's configuration, followed.
    config: config::Follower,
}

impl Agent {
    /// Start the member thread of `conf` for the target of `shared` and `remotes`.
    pub fn start(conf: pollux_conf::Gateway, shared: Arc<Shared>, remotes: Arc<[Remote]>) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let view = Arc::new(Mutex::new(View {
            group: conf.group.clone(),
            name: conf.name.clone(),
            ..View::default()
        }));
        let listeners = shared
            .snapshot
            .load()
            .listeners
            .iter()
            .map(|l| l.addr.to_string())
            .collect();
        // A hot upgrade's new process is the same member (the old one passed its
        // incarnation on); a fenced member's re-execution is a new one.
        let incarnation = passed_incarnation().unwrap_or_else(incarnation);
        crate::upgrade::old::pass_to_successor(INCARNATION_ENV, incarnation.to_string());
        let config = config::Follower::start(&conf, shared.clone(), remotes.clone()).map_err(std::io::Error::other)?;
        let mut member = Member::new(conf, incarnation, listeners);
        let (s, v) = (stop.clone(), view.clone());
        let thread = std::thread::Builder::new()
            .name("gateway".into())
            .spawn(move || run(&mut member, &shared, &remotes, &s, &v))?;
        Ok(Self {
            stop,
            thread: Some(thread),
            view,
            config,
        })
    }

    /// The group's configuration service (the control plane changes the group through it).
    pub fn config(&self) -> Arc<config::Service> {
        self.config.service()
    }

    /// The view, shared (the control plane reads it).
    pub fn view_handle(&self) -> Arc<Mutex<View>> {
        self.view.clone()
    }

    /// The group as this member last saw it.
    pub fn view(&self) -> View {
        self.view.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Where a hot upgrade's new process finds the incarnation it goes on with.
const INCARNATION_ENV: &str = "POLLUX_GATEWAY_INCARNATION";

/// The incarnation a hot upgrade's old process passed on (None: a new member, or one
/// re-executed after its fence, which rejoins as a new incarnation).
fn passed_incarnation() -> Option<u64> {
    std::env::var(INCARNATION_ENV).ok().and_then(|v| v.parse().ok())
}

/// Whether this process goes on as the member a hot upgrade handed over (its listeners'
/// ANA states stay as they were until its first heartbeat).
pub fn continues_member() -> bool {
    passed_incarnation().is_some()
}

/// How long a fenced gateway waits before it tries to re-execute itself again.
const RECOVER_RETRY: Duration = Duration::from_secs(30);

/// A fenced gateway recovers by re-executing itself through the hot-upgrade path (SIGUSR2 to
/// its own process, whose supervisor upgrades to the binary it was started from): the next
/// process connects to the cluster as new clients, with a new incarnation, while the
/// hosts' connections are handed over as in any upgrade. Only where the process's
/// supervisor waits for SIGUSR2 (it is blocked in this thread, as `pollux` blocks it
/// before starting the target); elsewhere the operator restarts the gateway.
fn recover_by_reexec() -> bool {
    // SAFETY: sigset_t is plain data, filled in by pthread_sigmask.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: a null new set only reads this thread's mask into `set`.
    let blocked = unsafe {
        libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut set) == 0
            && libc::sigismember(&set, libc::SIGUSR2) == 1
    };
    if !blocked || crate::upgrade::old::default_binary().is_none() {
        return false;
    }
    // No incarnation passed on: the next process is a new one, and rejoins.
    crate::upgrade::old::pass_to_successor(INCARNATION_ENV, String::new());
    // SAFETY: kill(2) of this process; SIGUSR2 is blocked in every thread and taken by the
    // supervisor's sigwait.
    unsafe { libc::kill(libc::getpid(), libc::SIGUSR2) == 0 }
}

/// A new incarnation: random, so a restarted member is never taken for the one fenced.
fn incarnation() -> u64 {
    let mut b = [0u8; 8];
    // A clock-based value if the OS has no randomness to give (never seen).
    if getrandom::fill(&mut b).is_err() {
        return std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64);
    }
    u64::from_le_bytes(b)
}

fn run(member: &mut Member, shared: &Arc<Shared>, remotes: &Arc<[Remote]>, stop: &AtomicBool, view: &Mutex<View>) {
    let beat = Duration::from_millis(member.conf.heartbeat_ms.into());
    let mut store: Option<RadosStore> = None;
    let mut last_error: Option<String> = None;
    let mut recovering: Option<Instant> = None;
    while !stop.load(Ordering::Acquire) {
        let t0 = Instant::now();
        if store.is_none() {
            match GroupObjects::open(&member.conf.cluster) {
                Ok(objs) => {
                    info!(group = %member.conf.group, name = %member.conf.name, "gateway: connected to the group's cluster");
                    store = Some(RadosStore {
                        objs,
                        group: member.conf.group.clone(),
                    });
                }
                Err(e) => note_error(&mut last_error, e.to_string()),
            }
        }
        // The ANA groups it owns may be the group's configuration's, changed at run time:
        // the next heartbeat registers them.
        let owned = shared
            .config
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .gateway
            .as_ref()
            .map(|g| g.ana_groups.clone());
        if let Some(owned) = owned.filter(|o| *o != member.conf.ana_groups) {
            info!(from = ?member.conf.ana_groups, to = ?owned, "gateway: the ANA groups this gateway owns changed");
            member.conf.ana_groups = owned;
        }
        if let Some(s) = store.as_ref().filter(|_| crate::upgrade::old::in_progress()) {
            if let Err(rc) = member.beat_only(s) {
                note_error(&mut last_error, describe(rc, &member.conf));
            }
        } else if let Some(s) = &store {
            match member.tick(s, Instant::now()) {
                Ok(out) => {
                    if out.fenced {
                        note_error(&mut last_error, "this gateway is fenced".into());
                        if recovering.is_none_or(|t| t.elapsed() > RECOVER_RETRY) {
                            recovering = Some(Instant::now());
                            if recover_by_reexec() {
                                info!(
                                    "gateway: fenced: re-executing as new cluster clients (a hot upgrade to this binary) to rejoin"
                                );
                            } else {
                                warn!("gateway: fenced: restart this gateway to rejoin the group");
                            }
                        }
                    } else if last_error.take().is_some() {
                        info!(group = %member.conf.group, "gateway: the group's cluster answers again");
                    }
                    crate::mutate::set_ana_overlay(shared, remotes, out.overlay);
                    let down = member
                        .last
                        .iter()
                        .flat_map(|g| &g.members)
                        .filter(|(_, r)| r.standing == state::Standing::Fenced)
                        .map(|(n, _)| n.clone())
                        .collect();
                    config::set_down(shared, remotes, down);
                }
                // A refused fence (a permission error) was logged once where it was refused;
                // any other error is said as itself.
                Err(rc) if (rc == -libc::EACCES || rc == -libc::EPERM) && member.refusal.is_some() => {
                    last_error = member.refusal.clone()
                }
                Err(rc) => note_error(&mut last_error, describe(rc, &member.conf)),
            }
        }
        {
            let now = Instant::now();
            let mut v = view.lock().unwrap_or_else(|p| p.into_inner());
            v.last = member.last.clone();
            v.fenced = member.fenced;
            v.error = last_error.clone();
            v.silent_ms = v
                .last
                .iter()
                .flat_map(|g| g.members.keys())
                .filter_map(|n| member.silent_for(n, now).map(|d| (n.clone(), d.as_millis())))
                .collect();
        }
        let spent = t0.elapsed();
        let mut left = beat.saturating_sub(spent);
        while !left.is_zero() && !stop.load(Ordering::Acquire) {
            let step = left.min(Duration::from_millis(50));
            std::thread::sleep(step);
            left -= step;
        }
    }
}

/// A failed call to the group's cluster, said so that an operator knows what to change.
fn describe(rc: Errno, conf: &pollux_conf::Gateway) -> String {
    let e = std::io::Error::from_raw_os_error(-rc);
    if rc == -libc::EACCES || rc == -libc::EPERM {
        let (user, pool) = (&conf.cluster.user, &conf.cluster.pool);
        format!(
            "the group's objects in pool {pool}: {e}: Ceph user client.{user} needs osd caps to read and write them (`osd 'profile rbd pool={pool}'`)"
        )
    } else {
        format!("the group's cluster: {e}")
    }
}

/// Log an error the first time it is seen (not every heartbeat).
fn note_error(last: &mut Option<String>, e: String) {
    if last.as_deref() != Some(e.as_str()) {
        warn!(error = %e, "gateway: the group's heartbeat failed (this gateway fences nobody while it cannot reach the cluster)");
    }
    *last = Some(e);
}
