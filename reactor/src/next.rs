//! [`Next`]: when a source next needs to run. Its own module at the crate's root, because
//! both the reactor (which schedules by it) and what the reactor is built from (the
//! adaptive latency model, the polling policy) speak it: kept in `reactor`, the model and
//! the reactor imported each other.

use std::time::Instant;

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
    /// Nothing to do until its fd becomes ready or someone calls [`crate::Reactor::wake`].
    Idle,
}
