//! Work sources: what they are and say ([`Source`], [`Progress`], [`Next`]), how they are
//! registered ([`SourceOpts`]), removed, borrowed, woken, and run when due.

use std::any::Any;
use std::os::fd::RawFd;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use mio::unix::SourceFd;
use mio::{Interest, Token};

use super::{Reactor, Slot, SourceId};
use crate::error::{ReactorError, Result};
use crate::mode::Mode;
use crate::next::Next;
use crate::stats::bump;

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

impl Reactor {
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

    pub(super) fn finish_removal(&mut self, id: SourceId) -> Option<Box<dyn Source>> {
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

    /// The ids of the sources registered now (those being removed excluded): to visit every
    /// source of a kind with [`Self::with_source`] (a hot upgrade visits every connection).
    pub fn source_ids(&self) -> Vec<SourceId> {
        self.slots
            .iter()
            .filter(|(_, s)| !s.removed)
            .map(|(id, _)| id)
            .collect()
    }

    /// Make a source run as soon as possible (e.g. after work was submitted to it).
    pub fn wake(&mut self, id: SourceId) {
        if let Some(slot) = self.slots.get_mut(id) {
            slot.next = Next::Asap;
            self.schedule(id);
        }
    }

    pub(super) fn schedule(&mut self, id: SourceId) {
        if let Some(slot) = self.slots.get_mut(id)
            && !slot.scheduled
        {
            slot.scheduled = true;
            self.sched.push(id);
        }
    }

    /// Runs source `id`, which starts at `t0` (the time read last: after the previous source
    /// or the `epoll_wait`); returns whether it did work and the time it ended, the next
    /// source's start. One clock read per run: at QD1 a busy-poll iteration is little more
    /// than one hot `recv`, and reading the clock twice per source and three more times
    /// per iteration took 8 % of the reactor's core (a `perf record` of it).
    pub(super) fn run_source(&mut self, id: SourceId, t0: Instant) -> (bool, Instant) {
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
    pub(super) fn run_scheduled(&mut self, mut now: Instant) -> (bool, Instant) {
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
}
