//! Interrupts: one eventfd per MSI-X vector (NVMe 2.0 §3.5.1 step 8; a CQ names its
//! vector in Create I/O Completion Queue's IV field, NVMe 2.0 §5.4).

use std::sync::Arc;

use vmm_sys_util::eventfd::EventFd;

use super::Result;

/// MSI-X vectors wired to eventfds.
///
/// The reactor registers a queue pair's eventfd and sleeps on it in interrupt mode; the
/// eventfd counts interrupts, so a read drains them.
pub trait Interrupts: Send + Sync {
    /// How many MSI-X vectors the function offers (0: none, polled mode only).
    fn max_vectors(&self) -> u16;
    /// Wires vectors `0..count` to fresh eventfds, replacing an earlier wiring; returns them
    /// by vector.
    fn enable(&self, count: u16) -> Result<Vec<Arc<EventFd>>>;
    /// Unwires all vectors.
    fn disable(&self) -> Result<()>;
}

/// A function without interrupts: every queue is polled.
#[derive(Debug, Default)]
pub struct NoInterrupts;

impl Interrupts for NoInterrupts {
    fn max_vectors(&self) -> u16 {
        0
    }
    fn enable(&self, _count: u16) -> Result<Vec<Arc<EventFd>>> {
        Ok(Vec::new())
    }
    fn disable(&self) -> Result<()> {
        Ok(())
    }
}

/// Fresh non-blocking eventfds.
pub(crate) fn eventfds(count: u16, name: &str) -> Result<Vec<Arc<EventFd>>> {
    (0..count)
        .map(|_| {
            EventFd::new(libc::EFD_NONBLOCK | libc::EFD_CLOEXEC)
                .map(Arc::new)
                .map_err(|source| super::PciError::Io {
                    context: format!("{name}: eventfd"),
                    source,
                })
        })
        .collect()
}
