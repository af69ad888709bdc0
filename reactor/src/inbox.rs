//! Cross-reactor messages: a lock-free MPSC queue per reactor plus an eventfd doorbell that a
//! sender rings only when the receiver may be asleep, so busy-polling reactors pay no syscall.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};

use crossbeam_queue::SegQueue;

use crate::reactor::Reactor;
use crate::stats::{StatsCell, bump};
use crate::sys::EventFd;

/// A message: a closure run on the receiving reactor's thread.
pub type Message = Box<dyn FnOnce(&mut Reactor) + Send>;

/// The receiving end of a reactor's messages, shared with every sender.
pub(crate) struct Inbox {
    pub(crate) queue: SegQueue<Message>,
    /// Set by the receiver before it blocks and cleared when it wakes. Sender and receiver use
    /// SeqCst on both this flag and the queue check (a Dekker-style handshake): either the
    /// sender sees the flag and rings, or the receiver sees the message before blocking.
    pub(crate) sleeping: AtomicBool,
    pub(crate) closed: AtomicBool,
    pub(crate) doorbell: EventFd,
}

impl Inbox {
    pub(crate) fn new() -> std::io::Result<Self> {
        Ok(Self {
            queue: SegQueue::new(),
            sleeping: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            doorbell: EventFd::new()?,
        })
    }

    /// Queue a message; false if the reactor has stopped.
    pub(crate) fn push(&self, msg: Message) -> bool {
        if self.closed.load(SeqCst) {
            return false;
        }
        self.queue.push(msg);
        if self.sleeping.load(SeqCst) {
            // A failed ring can only mean the fd is gone, i.e. the reactor is stopping.
            let _ = self.doorbell.notify();
        }
        true
    }
}

/// A handle for sending messages to one reactor from any thread.
#[derive(Clone)]
pub struct Remote {
    pub(crate) id: usize,
    pub(crate) inbox: Arc<Inbox>,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remote").field("id", &self.id).finish()
    }
}

impl Remote {
    /// The receiving reactor's index.
    pub fn id(&self) -> usize {
        self.id
    }

    /// Run `f` on the reactor's thread. Returns false if that reactor has stopped.
    pub fn send(&self, f: impl FnOnce(&mut Reactor) + Send + 'static) -> bool {
        self.inbox.push(Box::new(f))
    }

    /// Like [`Remote::send`], counted as sent by the reactor whose stats are given.
    pub(crate) fn send_counted(&self, from: &StatsCell, msg: Message) -> bool {
        let ok = self.inbox.push(msg);
        if ok {
            bump(&from.msgs_sent, 1);
        }
        ok
    }
}
