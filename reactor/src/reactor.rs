//! One reactor: the loop of a pinned thread that owns its work sources.
//!
//! Each iteration: run messages from other reactors, due timers, and the sources that are due
//! (every polled source in busy-poll mode); then wait for fd readiness with a timeout chosen by
//! the mode (zero when polling or when work was found, until the next deadline otherwise) and
//! run the sources whose fds became ready.

use std::any::{Any, TypeId};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use slab::Slab;
use tracing::{debug, warn};

use crate::adaptive::{MarginSleep, ModePolicy, ModelKind, PolicyConfig, PolicyInputs};
use crate::error::{ReactorError, Result};
use crate::inbox::{Inbox, Message, Remote};
use crate::load::DeviceLoad;
use crate::mode::{FractionSleep, Mode, SleepPolicy};

/// How often the adaptive policy evaluates.
const EVAL_INTERVAL: Duration = Duration::from_millis(2);
/// Weight of the newest window in the smoothed policy inputs (a time constant of ~4 windows:
/// one burst, or one preemption of the thread, must not flip the mode).
const EWMA: f64 = 0.25;
use crate::stats::{ReactorStats, StatsCell, bump};
use crate::sys::TimerFd;

/// Index of a source within its reactor.
pub type SourceId = usize;

/// At most this many sources per reactor are polled outside epoll at once: each costs a
/// system call per iteration even when it has nothing, and with many connections one
/// `epoll_wait` that names the ready ones is cheaper than trying them all.
const HOT_MAX: usize = 8;
/// A hot source that found no work for this long goes back to epoll.
const COLD_AFTER: Duration = Duration::from_millis(1);

const TIMER_TOKEN: Token = Token(usize::MAX - 1);
const INBOX_TOKEN: Token = Token(usize::MAX - 2);

/// When a source next needs to run, as it says after each run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Run again as soon as possible (more work is ready, e.g. a per-run budget was used up).
    Asap,
    /// Run at this time at the latest, even if its fd stays quiet.
    At(Instant),
    /// Work is in flight and expected to complete at this time: hybrid mode sleeps until
    /// shortly before it and then polls; busy-poll polls; interrupt mode waits for the fd (or
    /// this time, for a source without an fd).
    Expect(Instant),
    /// Nothing to do until its fd becomes ready or someone calls [`Reactor::wake`].
    Idle,
}

/// What a source's run achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// It did useful work (accounting: busy iteration; loop: do not block yet).
    pub did_work: bool,
    /// When it needs to run next.
    pub next: Next,
}

impl Progress {
    /// Did nothing; wake me on my fd.
    pub const IDLE: Progress = Progress {
        did_work: false,
        next: Next::Idle,
    };
    /// Did work; wake me on my fd.
    pub const WORKED: Progress = Progress {
        did_work: true,
        next: Next::Idle,
    };
}

/// A unit of work owned by one reactor: a socket, a device queue's completions, a listener...
///
/// `run` is called when its fd is ready, when it is due (see [`Next`]), and — for sources
/// registered as `polled` — on every iteration of a busy-polling reactor.
pub trait Source: Any {
    /// A name for logs and the stall detector.
    fn name(&self) -> &str;
    /// Do the work that is ready. Must not block.
    fn run(&mut self, r: &mut Reactor, id: SourceId) -> Progress;
    /// Called once when the reactor stops, before the source is dropped.
    fn shutdown(&mut self, _r: &mut Reactor, _id: SourceId) {}
}

/// How a source is registered.
#[derive(Debug, Clone, Copy)]
pub struct SourceOpts {
    /// The fd whose readiness runs the source (edge-triggered), if any.
    pub fd: Option<RawFd>,
    /// Read and/or write interest for `fd`.
    pub interest: Interest,
    /// Poll it every iteration in busy-poll mode (device completion queues). A polled source
    /// without an fd cannot sleep: in interrupt mode it forces polling, with a warning.
    pub polled: bool,
    /// Running it without an event is a valid way to look for work (a non-blocking socket
    /// that the source reads until EAGAIN). In busy-poll mode such a source, once it finds
    /// work, leaves the epoll set and runs every iteration ("hot") until it has found none
    /// for 1 ms (why: `Reactor::update_heat`).
    pub pollable: bool,
}

impl SourceOpts {
    /// An fd-driven source (sockets, listeners, eventfds) that is not polled.
    pub fn fd(fd: RawFd) -> Self {
        Self {
            fd: Some(fd),
            interest: Interest::READABLE | Interest::WRITABLE,
            polled: false,
            pollable: false,
        }
    }
    /// A non-blocking socket, read and written until EAGAIN: fd-driven, and polled outside
    /// epoll while it is busy in busy-poll mode.
    pub fn socket(fd: RawFd) -> Self {
        Self {
            pollable: true,
            ..Self::fd(fd)
        }
    }
    /// A readable-only fd-driven source.
    pub fn readable(fd: RawFd) -> Self {
        Self {
            fd: Some(fd),
            interest: Interest::READABLE,
            polled: false,
            pollable: false,
        }
    }
    /// A polled source that can also be woken by `fd` (e.g. an MSI-X eventfd).
    pub fn polled_with_fd(fd: RawFd) -> Self {
        Self {
            fd: Some(fd),
            interest: Interest::READABLE,
            polled: true,
            pollable: false,
        }
    }
    /// A polled source without an fd.
    pub fn polled() -> Self {
        Self {
            fd: None,
            interest: Interest::READABLE,
            polled: true,
            pollable: false,
        }
    }
    /// A source with neither fd nor polling: run only when woken or due.
    pub fn timed() -> Self {
        Self {
            fd: None,
            interest: Interest::READABLE,
            polled: false,
            pollable: false,
        }
    }
}

struct Slot {
    src: Option<Box<dyn Source>>,
    fd: Option<RawFd>,
    interest: Interest,
    polled: bool,
    pollable: bool,
    /// Out of the epoll set and run every iteration (a pollable source in busy-poll mode).
    hot: bool,
    /// When a hot source that finds no work goes back to epoll: [`COLD_AFTER`] after it
    /// last found work (a deadline, so that an idle iteration compares instead of
    /// subtracting).
    cold_at: Instant,
    next: Next,
    scheduled: bool,
    removed: bool,
}

/// Handle of a pending timer, for [`Reactor::cancel_timer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TimerId(u64);

type TimerFn = Box<dyn FnOnce(&mut Reactor)>;

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
    /// Let the adaptive policy choose the mode (`mode` is then only the starting mode).
    pub adaptive: Option<PolicyConfig>,
    /// How device channels estimate completion times, and so how hybrid mode sleeps:
    /// `Robust` with the margin sleep (pollux), or `LinuxMean` with a half-time sleep (the
    /// Linux 4.10 baseline).
    pub model: ModelKind,
}

impl Default for ReactorConfig {
    fn default() -> Self {
        Self {
            core: None,
            mode: Mode::Interrupt,
            stall_threshold: Duration::from_millis(2),
            fd_poll_interval: Duration::from_micros(5),
            adaptive: None,
            model: ModelKind::Robust,
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
    timerfd: TimerFd,
    timerfd_deadline: Option<Instant>,
    inbox: Arc<Inbox>,
    peers: Arc<[Remote]>,
    stats: Arc<StatsCell>,
    stop: bool,
    stall_threshold: Duration,
    fd_poll_interval: Duration,
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
}

/// Counters at the last policy evaluation.
#[derive(Debug, Clone, Copy)]
struct EvalMark {
    at: Instant,
    busy_ns: u64,
    cpu_ns: u64,
    completions: u64,
    outstanding: u64,
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
            timerfd,
            timerfd_deadline: None,
            inbox,
            peers,
            stats,
            stop: false,
            stall_threshold: cfg.stall_threshold,
            fd_poll_interval: cfg.fd_poll_interval,
            next_fd_poll: Instant::now(),
            sleep_policy: match cfg.model {
                ModelKind::Robust => Box::new(MarginSleep::default()) as Box<dyn SleepPolicy>,
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
                outstanding: 0,
            },
            wake_cost_ns: 10_000.0,
            busy_ewma: 0.0,
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
    /// must poll.
    pub fn effective_mode(&self) -> Mode {
        if self.mode != Mode::Poll && self.fdless_polled > 0 {
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

    /// Replace the hybrid-mode sleep policy.
    pub fn set_sleep_policy(&mut self, policy: Box<dyn SleepPolicy>) {
        self.sleep_policy = policy;
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

    /// Register a source. Its fd (if any) is registered edge-triggered; the source owns the fd
    /// and must keep it open until it is removed.
    pub fn add_source(&mut self, src: Box<dyn Source>, opts: SourceOpts) -> Result<SourceId> {
        let entry = self.slots.vacant_entry();
        let id = entry.key();
        if let Some(fd) = opts.fd {
            self.poll
                .registry()
                .register(&mut SourceFd(&fd), Token(id), opts.interest)
                .map_err(|source| ReactorError::Sys {
                    reactor: self.id,
                    what: "register source fd",
                    source,
                })?;
        }
        entry.insert(Slot {
            src: Some(src),
            fd: opts.fd,
            interest: opts.interest,
            polled: opts.polled,
            pollable: opts.pollable && opts.fd.is_some(),
            hot: false,
            cold_at: Instant::now(),
            next: if opts.polled { Next::Asap } else { Next::Idle },
            scheduled: false,
            removed: false,
        });
        bump(&self.stats.sources, 1);
        if opts.polled {
            self.schedule(id);
            if opts.fd.is_none() {
                self.fdless_polled += 1;
                self.warn_if_forced_poll();
            }
        }
        Ok(id)
    }

    /// Register a source that must be able to sleep: refused when it has no fd and is polled.
    pub fn add_sleepable_source(&mut self, src: Box<dyn Source>, opts: SourceOpts) -> Result<SourceId> {
        if opts.polled && opts.fd.is_none() {
            return Err(ReactorError::NeedsPolling {
                reactor: self.id,
                source_name: src.name().to_string(),
            });
        }
        self.add_source(src, opts)
    }

    /// Remove a source. Returns it, or None if it is running right now (it is then dropped
    /// when its run returns) or does not exist.
    pub fn remove_source(&mut self, id: SourceId) -> Option<Box<dyn Source>> {
        let slot = self.slots.get_mut(id)?;
        if slot.removed {
            return None;
        }
        slot.removed = true;
        // A running source (taken out of its slot) is finished in run_source.
        slot.src.as_ref()?;
        self.finish_removal(id)
    }

    fn finish_removal(&mut self, id: SourceId) -> Option<Box<dyn Source>> {
        let slot = self.slots.try_remove(id)?;
        if slot.hot {
            self.hot -= 1;
            self.stats.hot_sources.store(self.hot as u64, Relaxed);
        } else if let Some(fd) = slot.fd {
            // The fd may already be closed by its owner: then epoll has dropped it already.
            let _ = self.poll.registry().deregister(&mut SourceFd(&fd));
        }
        if slot.polled && slot.fd.is_none() {
            self.fdless_polled -= 1;
            self.warn_if_forced_poll();
        }
        self.stats.sources.store(self.slots.len() as u64, Relaxed);
        slot.src
    }

    /// Borrow a source by id with its concrete type (None if absent, running, or another type).
    pub fn source_mut<T: Source>(&mut self, id: SourceId) -> Option<&mut T> {
        let slot = self.slots.get_mut(id)?;
        if slot.removed {
            return None;
        }
        let src: &mut dyn Any = slot.src.as_deref_mut()?;
        src.downcast_mut::<T>()
    }

    /// Run `f` with a source (by concrete type) and the reactor both borrowed mutably: the
    /// source is taken out of its slot for the call, as during its own run. None if the
    /// source is absent, running, removed, or of another type. A source removed by `f` is
    /// dropped afterwards.
    pub fn with_source<T: Source, R>(&mut self, id: SourceId, f: impl FnOnce(&mut T, &mut Reactor) -> R) -> Option<R> {
        let slot = self.slots.get_mut(id)?;
        if slot.removed {
            return None;
        }
        let mut src = slot.src.take()?;
        let out = {
            let any: &mut dyn Any = &mut *src;
            any.downcast_mut::<T>().map(|t| f(t, self))
        };
        match self.slots.get_mut(id) {
            Some(s) if s.removed => {
                drop(self.finish_removal(id));
                drop(src);
            }
            Some(s) => s.src = Some(src),
            None => {}
        }
        out
    }

    /// Make a source run as soon as possible (e.g. after work was submitted to it).
    pub fn wake(&mut self, id: SourceId) {
        if let Some(slot) = self.slots.get_mut(id) {
            slot.next = Next::Asap;
            self.schedule(id);
        }
    }

    fn schedule(&mut self, id: SourceId) {
        if let Some(slot) = self.slots.get_mut(id)
            && !slot.scheduled
        {
            slot.scheduled = true;
            self.sched.push(id);
        }
    }

    /// Run `f` on this reactor at `at` (microsecond precision: the timerfd is armed in ns).
    pub fn add_timer(&mut self, at: Instant, f: impl FnOnce(&mut Reactor) + 'static) -> TimerId {
        self.timer_seq += 1;
        let seq = self.timer_seq;
        self.timers.push(Reverse((at, seq)));
        self.timer_fns.insert(seq, Box::new(f));
        TimerId(seq)
    }

    /// Cancel a pending timer; false if it already ran or was cancelled.
    pub fn cancel_timer(&mut self, t: TimerId) -> bool {
        self.timer_fns.remove(&t.0).is_some()
    }

    /// A handle to send messages to reactor `to`.
    pub fn remote(&self, to: usize) -> Option<Remote> {
        self.peers.get(to).cloned()
    }

    /// Run `f` on reactor `to` (may be this one: it then runs on a later iteration). False if
    /// that reactor does not exist or has stopped.
    pub fn send(&mut self, to: usize, f: impl FnOnce(&mut Reactor) + Send + 'static) -> bool {
        match self.peers.get(to) {
            Some(r) => r.send_counted(&self.stats, Box::new(f)),
            None => false,
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

    /// Runs source `id`, which starts at `t0` (the time read last: after the previous source
    /// or the `epoll_wait`); returns whether it did work and the time it ended, the next
    /// source's start. One clock read per run: at QD1 a busy-poll iteration is little more
    /// than one hot `recv`, and reading the clock twice per source and three more times
    /// per iteration took 8 % of the reactor's core (a `perf record` of it).
    fn run_source(&mut self, id: SourceId, t0: Instant) -> (bool, Instant) {
        let mut src = match self.slots.get_mut(id) {
            Some(s) if !s.removed => match s.src.take() {
                Some(src) => src,
                None => return (false, t0), // re-entrant run of a running source: skip
            },
            _ => return (false, t0),
        };
        let p = src.run(self, id);
        let t1 = Instant::now();
        let took = t1.saturating_duration_since(t0);
        if took > self.stall_threshold {
            self.stall(src.name(), took);
        }
        match self.slots.get_mut(id) {
            Some(s) if s.removed => {
                // Removed while it ran: deregister its fd before the source (and fd) drops.
                drop(self.finish_removal(id));
                drop(src);
            }
            Some(s) => {
                s.src = Some(src);
                s.next = p.next;
                let pollable = s.pollable;
                if p.next != Next::Idle {
                    self.schedule(id);
                }
                if pollable {
                    self.update_heat(id, p.did_work, t0);
                }
            }
            None => {}
        }
        (p.did_work, t1)
    }

    /// Busy-poll mode takes a pollable source that finds work out of epoll and runs it every
    /// iteration; it goes back when it has been idle for [`COLD_AFTER`] or the mode changes.
    ///
    /// Why: a socket in an epoll set has epoll's wake-up callback on its data-ready path, so
    /// the peer's `send` (which on loopback runs this socket's receive in its own softirq)
    /// takes the epoll lock and queues the socket on the ready list, and this reactor needs
    /// an `epoll_wait` before its `recv`. A polling reactor needs neither: measured on a QD1
    /// 4 KiB read over loopback (alternating pairs against the build before, medians of the
    /// pairs' differences), the p50 fell by 1.33 us (16 pairs) and 1.14 us (20 pairs) and the
    /// target's CPU per I/O by 4.8 % and 6.5 %, where skipping only the `epoll_wait` (the
    /// socket still registered) gained 0.3 us.
    fn update_heat(&mut self, id: SourceId, did_work: bool, now: Instant) {
        let polling = self.effective_mode() == Mode::Poll;
        let Some(s) = self.slots.get_mut(id) else { return };
        if did_work {
            s.cold_at = now + COLD_AFTER;
        }
        if s.hot {
            if !polling || now >= s.cold_at {
                self.cool(id);
            }
        } else if did_work && polling && self.hot < HOT_MAX {
            self.heat(id);
        }
    }

    fn heat(&mut self, id: SourceId) {
        let Some(s) = self.slots.get_mut(id) else { return };
        let Some(fd) = s.fd else { return };
        match self.poll.registry().deregister(&mut SourceFd(&fd)) {
            Ok(()) => {
                s.hot = true;
                self.hot += 1;
                self.stats.hot_sources.store(self.hot as u64, Relaxed);
                bump(&self.stats.hot_entries, 1);
                self.schedule(id);
            }
            Err(e) => debug!(reactor = self.id, error = %e, "cannot take a socket out of epoll: it stays there"),
        }
    }

    /// Back into epoll. Registering reports readiness that is already there (the kernel polls
    /// the file when it is added), so bytes that arrived meanwhile are not missed.
    fn cool(&mut self, id: SourceId) {
        let Some(s) = self.slots.get_mut(id) else { return };
        let Some(fd) = s.fd else { return };
        match self.poll.registry().register(&mut SourceFd(&fd), Token(id), s.interest) {
            Ok(()) => {
                s.hot = false;
                self.hot -= 1;
                self.stats.hot_sources.store(self.hot as u64, Relaxed);
            }
            // It stays hot, and a reactor with a hot source polls: nothing is lost.
            Err(e) => warn!(reactor = self.id, error = %e, "cannot put a socket back into epoll: it stays polled"),
        }
    }

    /// Put every hot source back into epoll (the reactor stopped busy-polling).
    fn cool_all(&mut self) {
        let ids: Vec<SourceId> = self.slots.iter().filter(|(_, s)| s.hot).map(|(id, _)| id).collect();
        for id in ids {
            self.cool(id);
        }
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

    fn drain_inbox(&mut self) -> bool {
        let mut n = 0u64;
        while let Some(msg) = self.inbox.queue.pop() {
            n += 1;
            self.run_message(msg);
            if self.stop {
                break;
            }
        }
        if n > 0 {
            bump(&self.stats.msgs_received, n);
        }
        n > 0
    }

    fn run_message(&mut self, msg: Message) {
        let t0 = Instant::now();
        msg(self);
        let took = t0.elapsed();
        if took > self.stall_threshold {
            self.stall("message", took);
        }
    }

    fn run_timers(&mut self, now: Instant) -> bool {
        let mut ran = false;
        while let Some(Reverse((at, seq))) = self.timers.peek().copied() {
            if at > now {
                break;
            }
            self.timers.pop();
            if let Some(f) = self.timer_fns.remove(&seq) {
                ran = true;
                let t0 = Instant::now();
                f(self);
                let took = t0.elapsed();
                if took > self.stall_threshold {
                    self.stall("timer", took);
                }
            }
        }
        // Drop cancelled timers at the top so they do not arm the timerfd.
        while let Some(Reverse((_, seq))) = self.timers.peek() {
            if self.timer_fns.contains_key(seq) {
                break;
            }
            self.timers.pop();
        }
        ran
    }

    fn due(&self, slot: &Slot, mode: Mode, now: Instant) -> bool {
        if slot.hot {
            return true;
        }
        match slot.next {
            Next::Asap => true,
            Next::At(t) => t <= now || (mode == Mode::Poll && slot.polled),
            Next::Expect(t) => match mode {
                Mode::Poll | Mode::Hybrid => true,
                Mode::Interrupt => slot.fd.is_none() && t <= now,
            },
            Next::Idle => mode == Mode::Poll && slot.polled,
        }
    }

    /// Runs the scheduled sources that are due; returns whether any did work and the time
    /// read last (`now` if none ran).
    fn run_scheduled(&mut self, mut now: Instant) -> (bool, Instant) {
        let mode = self.effective_mode();
        if self.hot > 0 && mode != Mode::Poll {
            self.cool_all();
        }
        // Two buffers swapped every pass: no allocation per iteration.
        let mut list = std::mem::take(&mut self.sched);
        let mut keep = std::mem::take(&mut self.sched_spare);
        keep.clear();
        let mut work = false;
        for id in list.drain(..) {
            let Some(slot) = self.slots.get(id) else { continue };
            if slot.removed {
                continue;
            }
            if self.due(slot, mode, now) {
                let (w, t) = self.run_source(id, now);
                work |= w;
                now = t;
            }
            match self.slots.get_mut(id) {
                Some(s) if !s.removed && (s.polled || s.hot || s.next != Next::Idle) => keep.push(id),
                Some(s) => s.scheduled = false,
                None => {}
            }
        }
        // Sources scheduled during this pass were appended to self.sched.
        keep.append(&mut self.sched);
        self.sched = keep;
        self.sched_spare = list;
        (work, now)
    }

    /// The earliest deadline of timers and `At` sources (and `Expect` sources without an fd
    /// in interrupt mode).
    fn next_deadline(&self, mode: Mode) -> (Option<Instant>, bool, Option<Instant>) {
        let mut deadline = self.timers.peek().map(|Reverse((t, _))| *t);
        let mut asap = false;
        let mut expect: Option<Instant> = None;
        for &id in &self.sched {
            let Some(s) = self.slots.get(id) else { continue };
            match s.next {
                Next::Asap => asap = true,
                Next::At(t) => deadline = Some(deadline.map_or(t, |d| d.min(t))),
                Next::Expect(t) => {
                    if mode == Mode::Interrupt && s.fd.is_none() {
                        deadline = Some(deadline.map_or(t, |d| d.min(t)));
                    } else {
                        expect = Some(expect.map_or(t, |e| e.min(t)));
                    }
                }
                Next::Idle => {}
            }
        }
        (deadline, asap, expect)
    }

    /// How long to wait for events when the iteration found no work: Some(ZERO) to poll,
    /// Some(deadline) to sleep until then, None to block until an fd is ready.
    fn plan_wait(&mut self) -> WaitPlan {
        let mode = self.effective_mode();
        // A hot source left over (it could not go back into epoll) is only found by polling.
        if mode == Mode::Poll || self.hot > 0 {
            return WaitPlan::Poll;
        }
        // About to sleep: a fresh time, so that the sleep is not longer by this iteration's
        // work (polling needs none).
        let now = Instant::now();
        let (deadline, asap, expect) = self.next_deadline(mode);
        if asap {
            return WaitPlan::Poll;
        }
        let mut plan = match deadline {
            Some(d) if d <= now => return WaitPlan::Poll,
            Some(d) => WaitPlan::Until(d, false),
            None => WaitPlan::Block,
        };
        if mode == Mode::Hybrid
            && let Some(e) = expect
        {
            if self.hybrid_slept_for == Some(e) {
                return WaitPlan::Poll; // slept once for this completion: now spin until it lands
            }
            self.hybrid_slept_for = Some(e);
            match self.sleep_policy.wake_at(now, e) {
                None => return WaitPlan::Poll,
                Some(w) => {
                    if !matches!(plan, WaitPlan::Until(d, _) if d <= w) {
                        plan = WaitPlan::Until(w, true);
                    }
                }
            }
        }
        plan
    }

    fn arm_timer(&mut self, at: Instant, now: Instant) {
        if self.timerfd_deadline == Some(at) {
            return;
        }
        if let Err(e) = self.timerfd.arm(at.saturating_duration_since(now)) {
            warn!(reactor = self.id, error = %e, "timerfd arm failed");
        }
        self.timerfd_deadline = Some(at);
    }

    /// Checks the epoll set as `plan` says (`now`: the time read last) and runs the sources
    /// it names; returns whether they did work, how long the reactor slept, and the time
    /// read last.
    fn wait_and_dispatch(&mut self, plan: WaitPlan, now: Instant) -> (bool, Duration, Instant) {
        let timeout = match plan {
            WaitPlan::Poll => {
                if self.hot > 0 && self.hot < HOT_MAX && now < self.next_fd_poll {
                    return (false, Duration::ZERO, now);
                }
                Some(Duration::ZERO)
            }
            WaitPlan::Until(at, _) => {
                self.arm_timer(at, Instant::now());
                None
            }
            WaitPlan::Block => None,
        };
        let blocking = timeout.is_none();
        let mut t_wait = now;
        if blocking {
            self.inbox.sleeping.store(true, SeqCst);
            if !self.inbox.queue.is_empty() {
                self.inbox.sleeping.store(false, SeqCst);
                return (true, Duration::ZERO, now);
            }
            t_wait = Instant::now();
        }
        bump(&self.stats.fd_polls, 1);
        let res = self.poll.poll(&mut self.events, timeout);
        let woke = Instant::now();
        let slept = if blocking { woke - t_wait } else { Duration::ZERO };
        if blocking {
            self.inbox.sleeping.store(false, SeqCst);
        }
        self.next_fd_poll = woke + self.fd_poll_interval;
        if let Err(e) = res {
            if e.kind() != std::io::ErrorKind::Interrupted {
                warn!(reactor = self.id, error = %e, "epoll_wait failed");
            }
            return (false, slept, woke);
        }
        let mut ready = std::mem::take(&mut self.ready);
        ready.clear();
        let mut timer_fired = false;
        for ev in self.events.iter() {
            match ev.token() {
                TIMER_TOKEN => timer_fired = true,
                INBOX_TOKEN => {
                    self.inbox.doorbell.drain();
                }
                Token(id) => ready.push(id),
            }
        }
        if timer_fired && self.timerfd.consume() {
            if let (WaitPlan::Until(at, hybrid), Some(_)) = (plan, self.timerfd_deadline) {
                let late = woke.saturating_duration_since(at);
                self.stats.record_wake_lateness(late.as_nanos() as u64);
                self.wake_cost_ns += 0.125 * (late.as_nanos() as f64 - self.wake_cost_ns);
                if hybrid {
                    self.sleep_policy.observe_wakeup(at, woke);
                }
            }
            self.timerfd_deadline = None;
        }
        let (mut work, mut t) = (false, woke);
        for &id in &ready {
            let (w, t1) = self.run_source(id, t);
            work |= w;
            t = t1;
        }
        self.ready = ready;
        (work, slept, t)
    }

    /// Run the loop until [`Reactor::stop`].
    pub(crate) fn run(&mut self) {
        // One clock subtraction per iteration (`Instant` to ns, for the published start):
        // the accounting subtracts those ns and the evaluation compares with a deadline.
        // A busy-poll iteration at QD1 is little more than one hot `recv`, and each
        // `Instant` difference costs ~25 instructions.
        let mut t_iter = Instant::now();
        let mut iter_start_ns = crate::stats::mono_ns_at(t_iter);
        self.stats.iter_start_ns.store(iter_start_ns, Relaxed);
        let mut eval_due = self.eval.at + EVAL_INTERVAL;
        while !self.stop {
            let mut work = self.drain_inbox();
            work |= self.run_timers(t_iter);
            // Messages or timers ran: a fresh time, or the first source's run would seem to
            // include theirs (and a stall be blamed on it).
            let t_sched = if work { Instant::now() } else { t_iter };
            let (w, now) = self.run_scheduled(t_sched);
            work |= w;
            let plan = if work || self.stop {
                WaitPlan::Poll
            } else {
                self.plan_wait()
            };
            // The iteration ends at the time read last (after the last source that ran or
            // the epoll_wait): what follows it is counted in the next one.
            let (w, slept, t_end) = self.wait_and_dispatch(plan, now);
            work |= w;
            let end_ns = crate::stats::mono_ns_at(t_end);
            let iter_ns = end_ns.saturating_sub(iter_start_ns);
            let s = &self.stats;
            bump(&s.iterations, 1);
            bump(&s.mode_ns[self.mode.index()], iter_ns);
            if work {
                bump(&s.busy_iterations, 1);
                bump(&s.busy_ns, iter_ns);
            } else {
                bump(&s.idle_ns, iter_ns);
            }
            if !slept.is_zero() {
                bump(&s.sleep_ns, slept.as_nanos() as u64);
            }
            if t_end >= eval_due {
                self.evaluate_policy(t_end);
                eval_due = self.eval.at + EVAL_INTERVAL;
            }
            t_iter = t_end;
            iter_start_ns = end_ns;
            self.stats.iter_start_ns.store(end_ns, Relaxed);
        }
        self.shutdown_sources();
    }

    /// Publish the device load and, for an adaptive reactor, let the policy pick the mode.
    fn evaluate_policy(&mut self, now: Instant) {
        // The completion-weighted mean of the (channel, class) estimates of this window,
        // smoothed over windows like the busy fraction.
        let predicted = self.load.evaluate(EWMA);
        let s = &self.stats;
        s.outstanding.store(self.load.outstanding, Relaxed);
        s.completions.store(self.load.completions, Relaxed);
        s.predicted_ns
            .store(predicted.map_or(0, |p| p.as_nanos() as u64), Relaxed);
        s.publish_classes(self.load.classes());
        s.wake_cost_ns.store(self.wake_cost_ns as u64, Relaxed);
        let busy_ns = s.busy_ns.load(Relaxed);
        let window = now.duration_since(self.eval.at).as_nanos().max(1) as f64;
        let cpu_ns = crate::sys::thread_cpu_ns();
        let wall_busy = busy_ns.saturating_sub(self.eval.busy_ns) as f64 / window;
        let cpu = cpu_ns.saturating_sub(self.eval.cpu_ns) as f64 / window;
        let busy = wall_busy.min(cpu).min(1.0);
        self.busy_ewma += EWMA * (busy - self.busy_ewma);
        let inputs = PolicyInputs {
            now,
            busy_fraction: self.busy_ewma,
            completions: self.load.completions - self.eval.completions,
            outstanding: (self.load.outstanding + self.eval.outstanding) as f64 / 2.0,
            predicted,
            wake_cost: Duration::from_nanos(self.wake_cost_ns as u64),
            window: now.duration_since(self.eval.at),
        };
        self.eval = EvalMark {
            at: now,
            busy_ns,
            cpu_ns,
            completions: self.load.completions,
            outstanding: self.load.outstanding,
        };
        let Some(policy) = &mut self.policy else { return };
        if let Some(mode) = policy.evaluate(&inputs) {
            bump(&self.stats.switches, 1);
            debug!(reactor = self.id, ?inputs, to = %mode, "adaptive policy switches mode");
            self.set_mode(mode);
        }
    }

    fn shutdown_sources(&mut self) {
        self.inbox.closed.store(true, SeqCst);
        let ids: Vec<SourceId> = self.slots.iter().map(|(id, _)| id).collect();
        for id in ids {
            if let Some(mut src) = self.slots.get_mut(id).and_then(|s| s.src.take()) {
                src.shutdown(self, id);
                if let Some(s) = self.slots.get_mut(id) {
                    s.src = Some(src);
                }
            }
        }
        // Messages that arrived late may hold resources (e.g. sockets): drop them here.
        while self.inbox.queue.pop().is_some() {}
        let ids: Vec<SourceId> = self.slots.iter().map(|(id, _)| id).collect();
        for id in ids {
            drop(self.finish_removal(id));
        }
        self.timer_fns.clear();
        self.timers.clear();
        self.locals.clear();
    }
}

#[derive(Debug, Clone, Copy)]
enum WaitPlan {
    /// Check fds without blocking.
    Poll,
    /// Block until this time (true: a hybrid sleep before an expected completion).
    Until(Instant, bool),
    /// Block until an fd is ready.
    Block,
}
