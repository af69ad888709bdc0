//! One reactor: the loop of a pinned thread that owns its work sources.
//!
//! Each iteration: run messages from other reactors, due timers, and the sources that are due
//! (every polled source in busy-poll mode); then wait for fd readiness with a timeout chosen by
//! the mode (zero when polling or when work was found, until the next deadline otherwise) and
//! run the sources whose fds became ready.
//!
//! Parts: [`source`] (sources, their registration and scheduling), [`hot`] (busy-poll's
//! sockets outside epoll), [`timer`], [`messages`] (from other reactors), [`wait`] (what the
//! mode makes an idle iteration do: poll, sleep until a deadline, or block) and [`run`] (the
//! loop, its accounting and the policy evaluation).

mod hot;
mod messages;
mod run;
mod source;
mod timer;
mod wait;

use std::any::{Any, TypeId};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use slab::Slab;
use tracing::{debug, warn};

use crate::adaptive::{MarginSleep, ModePolicy, ModelKind, PolicyConfig, Turnaround, TurnaroundSpin};
use crate::error::{ReactorError, Result};
use crate::inbox::{Inbox, Remote};
use crate::load::DeviceLoad;
use crate::mode::{FractionSleep, Mode, SleepPolicy};
pub use crate::next::Next;
use crate::polling::SpinHold;
use crate::stats::{ReactorStats, StatsCell, bump};
use crate::sys::TimerFd;
pub use source::{Progress, Source, SourceOpts};
use timer::TimerFn;
pub use timer::TimerId;

/// Index of a source within its reactor.
pub type SourceId = usize;

/// At most this many sources per reactor are polled outside epoll at once: each costs a
/// system call per iteration even when it has nothing, and with many connections one
/// `epoll_wait` that names the ready ones is cheaper than trying them all.
const HOT_MAX: usize = 8;
/// By default, a hot source that found no work for this long goes back to epoll
/// ([`ReactorConfig::cold_after`]).
pub const COLD_AFTER: Duration = Duration::from_millis(1);

const TIMER_TOKEN: Token = Token(usize::MAX - 1);
const INBOX_TOKEN: Token = Token(usize::MAX - 2);

struct Slot {
    src: Option<Box<dyn Source>>,
    fd: Option<RawFd>,
    interest: Interest,
    polled: bool,
    pollable: bool,
    /// Out of the epoll set and run every iteration (a pollable source in busy-poll mode).
    hot: bool,
    /// When a hot source that finds no work goes back to epoll: `cold_after` after it
    /// last found work (a deadline, so that an idle iteration compares instead of
    /// subtracting).
    cold_at: Instant,
    next: Next,
    scheduled: bool,
    removed: bool,
}

/// Settings of one reactor.
#[derive(Debug, Clone)]
pub struct ReactorConfig {
    /// Core to pin to; None leaves the thread unpinned (tests).
    pub core: Option<usize>,
    /// Initial mode.
    pub mode: Mode,
    /// A callback running longer than this is logged as a stall.
    pub stall_threshold: Duration,
    /// While some (not all eight, `HOT_MAX`) sources are hot, a busy-polling reactor checks its
    /// epoll set (the listener, idle connections, eventfds) at most this often instead of
    /// every iteration (zero: every iteration).
    ///
    /// Why: at QD1 an iteration is a hot `recv` (~0.5 us here) plus an `epoll_wait(0)` that
    /// nearly always finds nothing (~0.25 us with the clock reads around it), and a capsule
    /// that arrives meanwhile waits for the iteration to end: checking every 5 us halved the
    /// `epoll_wait` calls per QD1 I/O (4.0 to 1.9). A connection idle in epoll waits at most
    /// this long once, then is hot itself. With `HOT_MAX` hot sources others may be busy in
    /// epoll, so then every iteration checks it.
    pub fd_poll_interval: Duration,
    /// A hot source (busy-poll mode) that found no work for this long goes back to epoll
    /// ([`COLD_AFTER`] by default). Tests that drive a socket from a thread which the
    /// scheduler may keep off the CPU for milliseconds set it longer, so that the socket
    /// stays hot between their messages.
    pub cold_after: Duration,
    /// Let the adaptive policy choose the mode (`mode` is then only the starting mode).
    pub adaptive: Option<PolicyConfig>,
    /// How device channels estimate completion times, and so how hybrid mode sleeps:
    /// `Robust` with the margin sleep (pollux), or `LinuxMean` with a half-time sleep (the
    /// Linux 4.10 baseline).
    pub model: ModelKind,
    /// A fixed hybrid wake margin before each predicted completion (`Robust` only; None: the
    /// measured p99 lateness of timed wake-ups, [`MarginSleep`]).
    pub hybrid_margin: Option<Duration>,
    /// Whether hybrid mode spins through a closed-loop host's turnaround ([`TurnaroundSpin`]).
    pub turnaround: Turnaround,
}

impl Default for ReactorConfig {
    fn default() -> Self {
        Self {
            core: None,
            mode: Mode::Interrupt,
            stall_threshold: Duration::from_millis(2),
            fd_poll_interval: Duration::from_micros(5),
            cold_after: COLD_AFTER,
            adaptive: None,
            model: ModelKind::Robust,
            hybrid_margin: None,
            turnaround: Turnaround::Spin,
        }
    }
}

/// A reactor: owned by its thread; sources get `&mut Reactor` to add sources, set timers,
/// send messages and reach their reactor-local state.
pub struct Reactor {
    id: usize,
    mode: Mode,
    poll: Poll,
    events: Events,
    slots: Slab<Slot>,
    sched: Vec<SourceId>,
    sched_spare: Vec<SourceId>,
    ready: Vec<SourceId>,
    fdless_polled: usize,
    /// Sources that are hot (see [`SourceOpts::pollable`]).
    hot: usize,
    timers: BinaryHeap<Reverse<(Instant, u64)>>,
    timer_fns: HashMap<u64, TimerFn>,
    timer_seq: u64,
    /// The heap top's timer when last seen live (0: unknown): the loop then checks it with
    /// one compare, not a hash lookup per iteration.
    timer_top_live: u64,
    timerfd: TimerFd,
    timerfd_deadline: Option<Instant>,
    inbox: Arc<Inbox>,
    peers: Arc<[Remote]>,
    stats: Arc<StatsCell>,
    stop: bool,
    stall_threshold: Duration,
    fd_poll_interval: Duration,
    cold_after: Duration,
    /// While sources are hot, the epoll set is checked again from this time on (the last
    /// check plus `fd_poll_interval`).
    next_fd_poll: Instant,
    sleep_policy: Box<dyn SleepPolicy>,
    hybrid_slept_for: Option<Instant>,
    locals: HashMap<TypeId, Box<dyn Any>>,
    /// Stall warnings are rate limited: the last one logged, and how many were not.
    last_stall_log: Option<Instant>,
    stalls_unlogged: u64,
    model: ModelKind,
    policy: Option<ModePolicy>,
    load: DeviceLoad,
    eval: EvalMark,
    wake_cost_ns: f64,
    busy_ewma: f64,
    /// The `always` hold ([`Reactor::hold_poll`]).
    hold: SpinHold,
    /// The hold was on at the start of this iteration: the loop runs as in poll mode.
    held: bool,
    /// Hybrid mode's spin through a closed-loop host's turnaround ([`TurnaroundSpin`]).
    turnaround: TurnaroundSpin,
    /// Device commands outstanding at the end of the last iteration.
    prev_outstanding: u64,
    /// Time of the iterations run in hybrid mode and not held, and of those among them that
    /// neither found work nor slept: what hybrid spins, for the policy.
    hybrid_ns: u64,
    hybrid_spin_ns: u64,
    /// When the device queues last went idle after a completion of a channel that is not
    /// `never` (None: since then a command was submitted, or they never were busy).
    idle_since: Option<Instant>,
    /// The time the loop read last (an iteration's start): what [`Reactor::hold_poll`] dates
    /// its note with, so that the I/O path reads no clock for it.
    now_hint: Instant,
}

/// Counters at the last policy evaluation.
#[derive(Debug, Clone, Copy)]
struct EvalMark {
    at: Instant,
    busy_ns: u64,
    cpu_ns: u64,
    completions: u64,
    quiet_completions: u64,
    outstanding: u64,
    hybrid_ns: u64,
    hybrid_spin_ns: u64,
}

impl Reactor {
    pub(crate) fn new(
        id: usize,
        cfg: &ReactorConfig,
        inbox: Arc<Inbox>,
        peers: Arc<[Remote]>,
        stats: Arc<StatsCell>,
    ) -> Result<Self> {
        let sys = |what: &'static str| {
            move |source| ReactorError::Sys {
                reactor: id,
                what,
                source,
            }
        };
        let poll = Poll::new().map_err(sys("epoll_create"))?;
        let timerfd = TimerFd::new().map_err(sys("timerfd_create"))?;
        poll.registry()
            .register(&mut SourceFd(&timerfd.as_raw_fd()), TIMER_TOKEN, Interest::READABLE)
            .map_err(sys("register timerfd"))?;
        poll.registry()
            .register(
                &mut SourceFd(&inbox.doorbell.as_raw_fd()),
                INBOX_TOKEN,
                Interest::READABLE,
            )
            .map_err(sys("register message doorbell"))?;
        stats.mode.store(cfg.mode.index(), Relaxed);
        stats.adaptive.store(u64::from(cfg.adaptive.is_some()), Relaxed);
        bump(&stats.mode_entries[cfg.mode.index()], 1);
        Ok(Self {
            id,
            mode: cfg.mode,
            poll,
            events: Events::with_capacity(256),
            slots: Slab::new(),
            sched: Vec::new(),
            sched_spare: Vec::new(),
            ready: Vec::with_capacity(256),
            fdless_polled: 0,
            hot: 0,
            timers: BinaryHeap::new(),
            timer_fns: HashMap::new(),
            timer_seq: 0,
            timer_top_live: 0,
            timerfd,
            timerfd_deadline: None,
            inbox,
            peers,
            stats,
            stop: false,
            stall_threshold: cfg.stall_threshold,
            fd_poll_interval: cfg.fd_poll_interval,
            cold_after: cfg.cold_after,
            next_fd_poll: Instant::now(),
            sleep_policy: match cfg.model {
                ModelKind::Robust => Box::new(MarginSleep::with_margin(cfg.hybrid_margin)) as Box<dyn SleepPolicy>,
                ModelKind::LinuxMean => Box::new(FractionSleep {
                    fraction: 0.5,
                    min_sleep: Duration::ZERO,
                }),
            },
            hybrid_slept_for: None,
            locals: HashMap::new(),
            last_stall_log: None,
            stalls_unlogged: 0,
            model: cfg.model,
            policy: cfg.adaptive.map(|p| ModePolicy::new(p, cfg.mode)),
            load: DeviceLoad::default(),
            eval: EvalMark {
                at: Instant::now(),
                busy_ns: 0,
                cpu_ns: 0,
                completions: 0,
                quiet_completions: 0,
                outstanding: 0,
                hybrid_ns: 0,
                hybrid_spin_ns: 0,
            },
            hybrid_ns: 0,
            hybrid_spin_ns: 0,
            wake_cost_ns: 10_000.0,
            busy_ewma: 0.0,
            hold: SpinHold::default(),
            turnaround: TurnaroundSpin::with_rule(cfg.turnaround),
            prev_outstanding: 0,
            idle_since: None,
            held: false,
            now_hint: Instant::now(),
        })
    }

    /// This reactor's index.
    pub fn id(&self) -> usize {
        self.id
    }

    /// Number of reactors in the runtime.
    pub fn reactor_count(&self) -> usize {
        self.peers.len()
    }

    /// The configured mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The mode the loop really runs: interrupt mode with a polled source that has no fd
    /// must poll, and so must a reactor that an `always` namespace holds
    /// ([`Reactor::hold_poll`]).
    pub fn effective_mode(&self) -> Mode {
        if self.held || (self.mode != Mode::Poll && self.fdless_polled > 0) {
            Mode::Poll
        } else {
            self.mode
        }
    }

    /// Switch mode at run time.
    pub fn set_mode(&mut self, mode: Mode) {
        if mode == self.mode {
            return;
        }
        debug!(reactor = self.id, from = %self.mode, to = %mode, "reactor mode switch");
        self.mode = mode;
        self.hybrid_slept_for = None;
        self.stats.mode.store(mode.index(), Relaxed);
        bump(&self.stats.mode_entries[mode.index()], 1);
        self.warn_if_forced_poll();
        // Run every source once in the new mode: a device channel must arm its interrupt when
        // entering interrupt mode (or it would never wake the reactor) and may disarm it when
        // leaving.
        let ids: Vec<SourceId> = self.slots.iter().map(|(id, _)| id).collect();
        for id in ids {
            self.wake(id);
        }
    }

    /// An `always` namespace has a command in flight (being submitted, running, completing):
    /// busy-poll, whatever the mode, until [`crate::ALWAYS_LINGER`] after the latest such
    /// call. Cheap enough for every command: no clock read (it dates the note with the
    /// iteration's start) and, once the hold is on, no other work.
    pub fn hold_poll(&mut self) {
        self.hold.note(self.now_hint);
        if !self.held {
            self.held = true;
            bump(&self.stats.hold_entries, 1);
            self.stats.held.store(1, Relaxed);
        }
    }

    /// The loop's check at each iteration's start (`now`): the hold lapsed, so the reactor
    /// goes back to its mode, and every source runs once in it (as at a mode switch: a device
    /// channel must arm its interrupt again or nothing would wake the reactor for it).
    fn check_hold(&mut self, now: Instant) {
        self.now_hint = now;
        if self.held && !self.hold.active(now) {
            self.held = false;
            self.stats.held.store(0, Relaxed);
            self.hybrid_slept_for = None;
            let ids: Vec<SourceId> = self.slots.iter().map(|(id, _)| id).collect();
            for id in ids {
                self.wake(id);
            }
        }
    }

    /// Whether an `always` namespace holds this reactor in busy-poll now.
    pub fn held(&self) -> bool {
        self.held
    }

    /// How device channels on this reactor estimate completion times.
    pub fn model_kind(&self) -> ModelKind {
        self.model
    }

    /// Device load that channels keep up to date (outstanding, completions, estimates per
    /// channel and class).
    pub fn device_load(&mut self) -> &mut DeviceLoad {
        &mut self.load
    }

    /// Let the adaptive policy choose this reactor's mode (None: fixed mode).
    pub fn set_adaptive(&mut self, cfg: Option<PolicyConfig>) {
        self.policy = cfg.map(|p| ModePolicy::new(p, self.mode));
        self.stats.adaptive.store(u64::from(self.policy.is_some()), Relaxed);
    }

    /// Replace the hybrid-mode sleep policy (a sleep already taken for an expected
    /// completion is the old policy's: the new one decides afresh).
    pub fn set_sleep_policy(&mut self, policy: Box<dyn SleepPolicy>) {
        self.sleep_policy = policy;
        self.hybrid_slept_for = None;
    }

    /// Whether hybrid mode spins through a closed-loop host's turnaround; what it learnt of
    /// the host's turnarounds is kept.
    pub fn set_turnaround(&mut self, rule: Turnaround) {
        self.turnaround.rule = rule;
    }

    /// Change the stall threshold.
    pub fn set_stall_threshold(&mut self, d: Duration) {
        self.stall_threshold = d;
    }

    /// A snapshot of this reactor's accounting.
    pub fn stats(&self) -> ReactorStats {
        self.stats.snapshot(self.id)
    }

    /// Ask the loop to stop after the current iteration.
    pub fn stop(&mut self) {
        self.stop = true;
    }

    fn warn_if_forced_poll(&self) {
        let forced = self.mode != Mode::Poll && self.fdless_polled > 0;
        self.stats.forced_poll.store(u64::from(forced), Relaxed);
        if forced {
            let names: Vec<&str> = self
                .slots
                .iter()
                .filter(|(_, s)| s.polled && s.fd.is_none())
                .filter_map(|(_, s)| s.src.as_ref().map(|x| x.name()))
                .collect();
            warn!(
                reactor = self.id,
                mode = %self.mode,
                sources = ?names,
                "a polled source has no fd to wake on: this reactor must poll (100% of a core)"
            );
        }
    }

    /// Reactor-local state of type T, if set.
    pub fn local<T: Any>(&mut self) -> Option<&mut T> {
        self.locals
            .get_mut(&TypeId::of::<T>())
            .and_then(|b| b.downcast_mut::<T>())
    }

    /// Set reactor-local state of type T (replacing any).
    pub fn set_local<T: Any>(&mut self, v: T) {
        self.locals.insert(TypeId::of::<T>(), Box::new(v));
    }

    /// Take reactor-local state of type T out.
    pub fn take_local<T: Any>(&mut self) -> Option<T> {
        self.locals
            .remove(&TypeId::of::<T>())
            .and_then(|b| b.downcast::<T>().ok())
            .map(|b| *b)
    }

    /// Run `f` with the local state T and the reactor both borrowed mutably (the state is
    /// taken out for the call). None if there is no T.
    pub fn with_local<T: Any, R>(&mut self, f: impl FnOnce(&mut T, &mut Reactor) -> R) -> Option<R> {
        let mut v = self.locals.remove(&TypeId::of::<T>())?;
        let out = v.downcast_mut::<T>().map(|t| f(t, self));
        // The taken-out value is the one to keep: a T that `f` set meanwhile is replaced.
        self.locals.insert(TypeId::of::<T>(), v);
        out
    }

    /// Count a stall and log it, at most once a second per reactor (wall time also grows when
    /// the thread is preempted, so bursts are common on a loaded machine).
    fn stall(&mut self, name: &str, took: Duration) {
        bump(&self.stats.stalls, 1);
        let now = Instant::now();
        if self
            .last_stall_log
            .is_some_and(|t| now.duration_since(t) < Duration::from_secs(1))
        {
            self.stalls_unlogged += 1;
            return;
        }
        warn!(
            reactor = self.id,
            source = name,
            took_us = took.as_micros() as u64,
            threshold_us = self.stall_threshold.as_micros() as u64,
            not_logged_since_last = self.stalls_unlogged,
            "stall: a callback ran longer than the threshold"
        );
        self.last_stall_log = Some(now);
        self.stalls_unlogged = 0;
    }
}
