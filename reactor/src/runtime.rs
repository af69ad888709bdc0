//! Starting, addressing and stopping the reactor threads.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc;
use std::thread::JoinHandle;

use tracing::{info, warn};

use crate::error::{ReactorError, Result};
use crate::inbox::{Inbox, Remote};
use crate::mode::Mode;
use crate::reactor::{Reactor, ReactorConfig};
use crate::stats::{ReactorStats, StatsCell};
use crate::sys;

/// What each reactor runs once on its own thread before its loop starts (register listeners,
/// open device queues, set reactor-local state).
pub type InitFn = dyn Fn(&mut Reactor) -> std::result::Result<(), InitError> + Send + Sync;

/// Why a reactor's init function failed (the caller's own error type).
pub type InitError = Box<dyn std::error::Error + Send + Sync>;

/// The set of running reactors. The thread that owns it only supervises.
pub struct Runtime {
    threads: Vec<Option<JoinHandle<()>>>,
    remotes: Arc<[Remote]>,
    stats: Vec<Arc<StatsCell>>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("reactors", &self.remotes.len())
            .finish()
    }
}

impl Runtime {
    /// Start one thread per config, pinned to its core, and run `init` on each. Returns once
    /// every reactor has initialised, or the first error (all started threads are stopped).
    pub fn start(configs: Vec<ReactorConfig>, init: Arc<InitFn>) -> Result<Self> {
        if configs.is_empty() {
            return Err(ReactorError::NoReactors);
        }
        let allowed = sys::allowed_cores().map_err(|source| ReactorError::Sys {
            reactor: usize::MAX,
            what: "sched_getaffinity",
            source,
        })?;
        let mut seen = Vec::new();
        for (i, c) in configs.iter().enumerate() {
            if let Some(core) = c.core {
                if !allowed.contains(&core) {
                    return Err(ReactorError::CoreNotAllowed {
                        reactor: i,
                        core,
                        allowed,
                    });
                }
                if seen.contains(&core) {
                    return Err(ReactorError::DuplicateCore { core });
                }
                seen.push(core);
            }
        }
        // The origin of the reactors' iteration times, before any of them reads a clock
        // (`stats::mono_ns_at`).
        crate::stats::epoch();
        let mut stats = Vec::new();
        let mut inboxes = Vec::new();
        for (i, c) in configs.iter().enumerate() {
            let cell = Arc::new(StatsCell::default());
            cell.core.store(c.core.unwrap_or(usize::MAX), Relaxed);
            let inbox = Inbox::new().map_err(|source| ReactorError::Sys {
                reactor: i,
                what: "eventfd",
                source,
            })?;
            stats.push(cell);
            inboxes.push(Arc::new(inbox));
        }
        let remotes: Arc<[Remote]> = inboxes
            .iter()
            .enumerate()
            .map(|(id, inbox)| Remote {
                id,
                inbox: inbox.clone(),
            })
            .collect();
        let (ready_tx, ready_rx) = mpsc::channel::<(usize, Result<()>)>();
        let mut rt = Runtime {
            threads: Vec::new(),
            remotes: remotes.clone(),
            stats: stats.clone(),
        };
        for (i, cfg) in configs.into_iter().enumerate() {
            let inbox = inboxes[i].clone();
            let peers = remotes.clone();
            let cell = stats[i].clone();
            let init = init.clone();
            let tx = ready_tx.clone();
            let spawned = std::thread::Builder::new().name(format!("reactor-{i}")).spawn(move || {
                // SAFETY: gettid(2) has no preconditions.
                cell.tid.store(unsafe { libc::gettid() } as u64, Relaxed);
                match prepare(i, &cfg, inbox, peers, cell.clone(), &*init) {
                    Ok(mut r) => {
                        let _ = tx.send((i, Ok(())));
                        drop(tx);
                        r.run();
                        cell.final_cpu_ns.store(sys::thread_cpu_ns(), Relaxed);
                        cell.exited.store(true, Relaxed);
                    }
                    Err(e) => {
                        cell.exited.store(true, Relaxed);
                        let _ = tx.send((i, Err(e)));
                    }
                }
            });
            match spawned {
                Ok(h) => rt.threads.push(Some(h)),
                Err(e) => {
                    rt.stop_all();
                    return Err(ReactorError::Thread {
                        reactor: i,
                        message: e.to_string(),
                    });
                }
            }
        }
        drop(ready_tx);
        let mut first_err = None;
        for _ in 0..rt.threads.len() {
            match ready_rx.recv() {
                Ok((_, Ok(()))) => {}
                Ok((_, Err(e))) => {
                    first_err.get_or_insert(e);
                }
                Err(_) => {
                    first_err.get_or_insert(ReactorError::Thread {
                        reactor: usize::MAX,
                        message: "a reactor died during init".into(),
                    });
                    break;
                }
            }
        }
        if let Some(e) = first_err {
            rt.stop_all();
            return Err(e);
        }
        info!(reactors = rt.threads.len(), "reactors running");
        Ok(rt)
    }

    /// Number of reactors.
    pub fn len(&self) -> usize {
        self.remotes.len()
    }

    /// Always false: a runtime has at least one reactor.
    pub fn is_empty(&self) -> bool {
        self.remotes.is_empty()
    }

    /// A handle to reactor `id`.
    pub fn remote(&self, id: usize) -> Option<Remote> {
        self.remotes.get(id).cloned()
    }

    /// Handles to every reactor.
    pub fn remotes(&self) -> Arc<[Remote]> {
        self.remotes.clone()
    }

    /// Accounting snapshots of every reactor, read without disturbing them.
    pub fn stats(&self) -> Vec<ReactorStats> {
        self.stats.iter().enumerate().map(|(i, s)| s.snapshot(i)).collect()
    }

    /// The accounting cells of every reactor, for readers on other threads (a control plane):
    /// [`StatsCell::snapshot`] reads them without disturbing the reactors.
    pub fn stats_cells(&self) -> Vec<Arc<StatsCell>> {
        self.stats.clone()
    }

    /// Switch reactor `id` to `mode` (applied by a message on its own thread).
    pub fn set_mode(&self, id: usize, mode: Mode) -> Result<()> {
        let r = self.remote(id).ok_or(ReactorError::NotRunning { reactor: id })?;
        if r.send(move |r| r.set_mode(mode)) {
            Ok(())
        } else {
            Err(ReactorError::NotRunning { reactor: id })
        }
    }

    fn stop_all(&mut self) {
        for r in self.remotes.iter() {
            r.send(|r| r.stop());
        }
        for (i, t) in self.threads.iter_mut().enumerate() {
            if let Some(h) = t.take()
                && h.join().is_err()
            {
                warn!(reactor = i, "reactor thread panicked");
            }
        }
    }

    /// Stop every reactor (each shuts its sources down) and join the threads.
    pub fn shutdown(mut self) -> Result<()> {
        for r in self.remotes.iter() {
            r.send(|r| r.stop());
        }
        let mut err = None;
        for (i, t) in self.threads.iter_mut().enumerate() {
            if let Some(h) = t.take()
                && h.join().is_err()
            {
                err.get_or_insert(ReactorError::Thread {
                    reactor: i,
                    message: "panicked".into(),
                });
            }
        }
        err.map_or(Ok(()), Err)
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.stop_all();
    }
}

fn prepare(
    id: usize,
    cfg: &ReactorConfig,
    inbox: Arc<Inbox>,
    peers: Arc<[Remote]>,
    cell: Arc<StatsCell>,
    init: &InitFn,
) -> Result<Reactor> {
    if let Some(core) = cfg.core {
        sys::pin_current_thread(core).map_err(|source| ReactorError::Sys {
            reactor: id,
            what: "sched_setaffinity",
            source,
        })?;
    }
    // Precise sleeps need a precise timer: the default 50 us slack would swamp them.
    sys::set_timer_slack_ns(1).map_err(|source| ReactorError::Sys {
        reactor: id,
        what: "PR_SET_TIMERSLACK",
        source,
    })?;
    let clock = sys::current_thread_cpu_clock().map_err(|source| ReactorError::Sys {
        reactor: id,
        what: "pthread_getcpuclockid",
        source,
    })?;
    cell.cpu_clock.store(clock as i64 as u64, Relaxed);
    let mut r = Reactor::new(id, cfg, inbox, peers, cell)?;
    init(&mut r).map_err(|source| ReactorError::Init { reactor: id, source })?;
    Ok(r)
}
