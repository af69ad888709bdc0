//! What a hot upgrade does on each reactor (sent as messages by [`super::old`] and
//! [`super::new`]; the driver waits for the answers): pause and resume the listeners, pause
//! the connections and see where they stand, take their state, install handed-over
//! connections and resume them.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use pollux_reactor::{Reactor, Remote, SourceId};

use super::UpgradeError;
use super::state::{ConnState, IoQueueRef, RoleState};
use crate::controller::QueueRef;
use crate::listener::Conn;
use crate::listener::Listener;
use crate::mutate::Listeners;
use crate::path::Path;
use crate::queue::handover::PauseCheck;
use crate::shared::Shared;

/// Run `f` on every reactor and gather the answers, waiting at most `within` in all.
pub fn on_all<R: Send + 'static>(
    remotes: &[Remote],
    within: Duration,
    f: impl Fn(&mut Reactor) -> R + Send + Sync + 'static,
) -> Result<Vec<R>, UpgradeError> {
    let f = Arc::new(f);
    let (tx, rx) = mpsc::channel();
    for (i, remote) in remotes.iter().enumerate() {
        let (tx, f) = (tx.clone(), f.clone());
        if !remote.send(move |r| {
            let _ = tx.send((i, f(r)));
        }) {
            return Err(UpgradeError::Reactor(i));
        }
    }
    drop(tx);
    let deadline = Instant::now() + within;
    let mut out: Vec<Option<R>> = (0..remotes.len()).map(|_| None).collect();
    for _ in 0..remotes.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        let (i, v) = rx.recv_timeout(left).map_err(|_| {
            let missing = out.iter().position(Option::is_none).unwrap_or(0);
            UpgradeError::Reactor(missing)
        })?;
        out[i] = Some(v);
    }
    Ok(out.into_iter().flatten().collect())
}

/// Run `f` on reactor `i` and wait for its answer.
pub fn on_one<R: Send + 'static>(
    remotes: &[Remote],
    i: usize,
    within: Duration,
    f: impl FnOnce(&mut Reactor) -> R + Send + 'static,
) -> Result<R, UpgradeError> {
    let (tx, rx) = mpsc::channel();
    let remote = remotes.get(i).ok_or(UpgradeError::Reactor(i))?;
    if !remote.send(move |r| {
        let _ = tx.send(f(r));
    }) {
        return Err(UpgradeError::Reactor(i));
    }
    rx.recv_timeout(within).map_err(|_| UpgradeError::Reactor(i))
}

/// Visit every connection of reactor `r`.
pub fn each_conn(r: &mut Reactor, mut f: impl FnMut(&mut Conn, &mut Reactor, SourceId)) {
    for id in r.source_ids() {
        r.with_source::<Conn, _>(id, |c, r| f(c, r, id));
    }
}

/// The listeners (on reactor 0): pause or resume accepting; their bound addresses and
/// descriptors.
pub fn listeners(r: &mut Reactor, paused: bool) -> Vec<(SocketAddr, RawFd, Arc<AtomicU64>)> {
    let ids: Vec<SourceId> = r
        .local::<Listeners>()
        .map(|l| l.by_addr.values().copied().collect())
        .unwrap_or_default();
    let mut out = Vec::new();
    for id in ids {
        r.with_source::<Listener, _>(id, |l, r| {
            l.paused = paused;
            if !paused {
                // Connections may wait in the backlog, which no new edge reports.
                r.wake(id);
            }
            if let Some(a) = l.addr() {
                out.push((a, l.raw_fd(), l.open()));
            }
        });
    }
    out
}

/// Where a reactor's connections stand in a pause: quiet ones, and the busy ones' first
/// reason (with the peer). Pauses the ones not pausing yet.
#[derive(Debug, Default)]
pub struct Standing {
    /// Connections at a boundary.
    pub quiet: usize,
    /// Busy connections.
    pub busy: usize,
    /// The first busy one's reason.
    pub why: Option<String>,
}

/// Pause every connection of `r` (idempotent) and say where they stand.
pub fn pause(r: &mut Reactor) -> Standing {
    let mut s = Standing::default();
    each_conn(r, |c, _, _| {
        c.pause_begin();
        match c.pause_check() {
            PauseCheck::Quiet => s.quiet += 1,
            PauseCheck::Stays(_) => {}
            PauseCheck::Busy(why) => {
                s.busy += 1;
                if s.why.is_none() {
                    // The command that holds it, where it is one: what to look at first.
                    let oldest = c.oldest_request().map(|o| format!("; oldest {o}")).unwrap_or_default();
                    s.why = Some(format!("{why} ({}{oldest})", crate::queue::Transport::peer(&c.t)));
                }
            }
        }
    });
    s
}

/// A reactor's connections taken for the handover: their states (descriptor indexes not
/// yet assigned) with their sockets, and those that stay, by reason.
#[derive(Debug, Default)]
pub struct Taken {
    /// State and socket of each connection that moves.
    pub queues: Vec<(ConnState, RawFd)>,
    /// Reasons of those that stay.
    pub stayed: Vec<&'static str>,
}

/// Take the state of every connection of `r`, stopping each from reading; None (nothing
/// changed) if one is not at a boundary after all.
pub fn take(r: &mut Reactor) -> Option<Taken> {
    let mut all_quiet = true;
    each_conn(r, |c, _, _| {
        if matches!(c.pause_check(), PauseCheck::Busy(_)) {
            all_quiet = false;
        }
    });
    if !all_quiet {
        return None;
    }
    let mut t = Taken::default();
    each_conn(r, |c, _, _| match c.pause_check() {
        PauseCheck::Quiet => {
            c.pause();
            t.queues.push((c.handover_state(0), c.t.raw_fd()));
        }
        PauseCheck::Stays(why) => t.stayed.push(why),
        PauseCheck::Busy(_) => {}
    });
    Some(t)
}

/// Resume every connection of `r` (a rollback, or the new process's commit): held commands
/// run, then reading starts again.
pub fn resume(r: &mut Reactor) {
    each_conn(r, |c, r, id| c.resume(r, id));
}

/// The new process: connections installed on a reactor, paused, and what their admin
/// queues must learn at commit.
#[derive(Default)]
pub struct Installed {
    /// Admin queues' source ids and their I/O queues as the old process had them.
    relink: Vec<(SourceId, Vec<IoQueueRef>)>,
}

/// Install handed-over connections `queues` (state and socket) on `r`, paused: the queues
/// installed, by serial, and those refused, with why.
pub fn install(
    r: &mut Reactor,
    queues: Vec<(ConnState, OwnedFd)>,
    shared: &Arc<Shared>,
    started: Instant,
    opens: &HashMap<SocketAddr, Arc<AtomicU64>>,
) -> (Vec<(u64, QueueRef)>, Vec<String>) {
    let (mut done, mut refused) = (Vec::new(), Vec::new());
    let mut inst = r.take_local::<Installed>().unwrap_or_default();
    let snap = shared.snapshot.load_full();
    for (s, fd) in queues {
        let sock = TcpStream::from(fd);
        let (ana, tls) = match s.queue.listener.and_then(|a| snap.listener(a)) {
            Some(l) => (l.ana.clone(), l.tls),
            None => (Arc::default(), pollux_conf::TlsMode::None),
        };
        let open = s
            .queue
            .listener
            .and_then(|a| opens.get(&a).cloned())
            .unwrap_or_else(|| Arc::new(AtomicU64::new(0)));
        let path = Path {
            addr: s.queue.listener,
            tls,
            ana,
            open,
            placed: None,
        };
        tracing::debug!(
            serial = s.queue.serial,
            reactor = r.id(),
            qid = s.queue.sq.qid,
            sq_head = s.queue.sq.head,
            rx = s.transport.rx.0.len(),
            held = s.queue.held.len(),
            role = match &s.queue.role {
                RoleState::Unbound => "unbound",
                RoleState::Admin(_) => "admin",
                RoleState::Io { .. } => "io",
            },
            "upgrade: installing a queue"
        );
        match crate::tcp::handover::install(r, sock, &s, shared, started, path) {
            Ok(id) => {
                done.push((
                    s.queue.serial,
                    QueueRef {
                        reactor: r.id(),
                        source: id,
                        serial: s.queue.serial,
                    },
                ));
                if let RoleState::Admin(c) = &s.queue.role {
                    inst.relink.push((id, c.io_queues.clone()));
                }
            }
            Err(e) => refused.push(format!("queue {} (serial {}): {e}", s.queue.sq.qid, s.queue.serial)),
        }
    }
    r.set_local(inst);
    (done, refused)
}

/// The new process's commit on `r`: admin queues learn where their I/O queues are (`at`),
/// then every connection resumes.
pub fn commit(r: &mut Reactor, at: &HashMap<u64, QueueRef>) {
    if let Some(inst) = r.take_local::<Installed>() {
        for (id, was) in inst.relink {
            r.with_source::<Conn, _>(id, |c, _| c.relink_io_queues(&was, at));
        }
    }
    resume(r);
}
