//! pollux reactors: one pinned thread per configured core, each owning its work sources
//! (sockets, device completion queues, timers) and never sharing them through locks.
//!
//! - [`Runtime`] starts the threads, pins them, sets a 1 ns timer slack, and stops them.
//! - [`Reactor`] is the loop of one thread; [`Source`]s are its units of work.
//! - Cross-reactor work goes by message ([`Remote::send`], [`Reactor::send`]): a lock-free
//!   queue per reactor with an eventfd doorbell rung only when the receiver may sleep.
//! - Three [`Mode`]s: busy-poll, hybrid (timed sleep before an expected completion, then poll)
//!   and interrupt (block in epoll), switchable at run time.
//! - Per-namespace [`Polling`]: `always` holds a reactor in busy-poll while a namespace is
//!   in use, `never` keeps a namespace's commands from making it spin ([`polling`]).
//! - [`ReactorStats`] snapshots: busy/idle time, thread CPU time, iterations, per-mode time,
//!   wake-up lateness, messages, and the device channels' completion time estimates per
//!   (channel, operation class) ([`DeviceLoad`]).
//!
//! This crate knows nothing of NVMe.

pub mod adaptive;
mod error;
mod inbox;
mod load;
mod mode;
mod next;
pub mod polling;
mod reactor;
mod runtime;
mod stats;
pub mod sys;

pub use adaptive::{LatencyModel, MarginSleep, ModePolicy, ModelKind, PolicyConfig, PolicyInputs, Turnaround};
pub use error::{ReactorError, Result, UnknownSpelling};
pub use inbox::{Message, Remote};
pub use load::{ChannelKey, ClassStats, DeviceLoad};
pub use mode::{FractionSleep, Mode, SleepPolicy};
pub use next::Next;
pub use polling::{ALWAYS_LINGER, DeviceWait, Polling, PollingCell, SpinHold};
pub use reactor::{COLD_AFTER, Progress, Reactor, ReactorConfig, Source, SourceId, SourceOpts, TimerId};
pub use runtime::{InitError, InitFn, Runtime};
pub use stats::{ReactorStats, StatsCell, WAKE_BUCKETS};
