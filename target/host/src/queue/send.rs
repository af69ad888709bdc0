//! The send path: the send queue to the socket, waiting on the socket, and queueing data
//! (copied or in place).

use std::io::ErrorKind;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::time::Instant;

use super::{HostQueue, io_err};
use crate::error::HostError;
use pollux_link::sendq::SendQueue;
use pollux_link::tls::TlsLink;

impl HostQueue {
    /// Writes what the socket takes now, without blocking.
    pub(super) fn send_some(&mut self) -> Result<(), HostError> {
        let r = match &mut self.tls {
            None => {
                if self.out.pending() == 0 && self.parked.is_empty() {
                    return Ok(());
                }
                self.out.flush(self.sock.as_raw_fd())
            }
            // Nothing is parked over TLS: all data is copied into the queue.
            Some(link) => {
                if self.out.pending() == 0 && link.pending() == 0 {
                    return Ok(());
                }
                link.send(&mut self.out)
            }
        };
        if let Err(e) = r {
            self.closed = true;
            return Err(match e.kind() {
                ErrorKind::WriteZero => HostError::Closed,
                _ => io_err(e),
            });
        }
        if !self.parked.is_empty() {
            let sent = self.out.sent_total();
            self.parked.retain(|&(by, _)| by > sent);
        }
        Ok(())
    }

    /// Bytes queued for the socket and not yet taken by it (over TLS, records encrypted and
    /// not yet sent too).
    pub fn queued_bytes(&self) -> usize {
        self.out.pending() + self.tls.as_deref().map_or(0, TlsLink::pending)
    }

    /// Sends everything queued, waiting for the socket up to the timeout.
    pub fn send_pending(&mut self) -> Result<(), HostError> {
        let start = Instant::now();
        let deadline = start + self.opts.timeout;
        loop {
            self.send_some()?;
            if self.queued_bytes() == 0 {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(HostError::Timeout {
                    waited: start.elapsed(),
                    what: "the socket to take our data",
                });
            }
            self.wait_fd(deadline, false, true)?;
        }
    }

    /// Waits until the socket is readable (`read`) or writable (`write`), or `deadline`.
    /// Over TLS a wait for input returns at once while decrypted bytes may be buffered above
    /// the socket (see `tls_unread`): poll(2) would not see them, and the caller reads next.
    pub(super) fn wait_fd(&self, deadline: Instant, read: bool, write: bool) -> Result<(), HostError> {
        if read && self.tls_unread {
            return Ok(());
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let ms = left.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
        let mut events = 0;
        if read {
            events |= libc::POLLIN;
        }
        if write {
            events |= libc::POLLOUT;
        }
        let mut pfd = libc::pollfd {
            fd: self.sock.as_raw_fd(),
            events,
            revents: 0,
        };
        // SAFETY: `pfd` is a valid pollfd that lives on the stack for the whole call and the
        // count passed is 1; poll only writes its `revents`.
        let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
        if rc < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != ErrorKind::Interrupted {
                return Err(HostError::Io(e));
            }
        }
        Ok(())
    }
}

/// Queues `data` for sending: in place when it is at least `borrow_min` bytes long (worth an
/// iovec: [`super::BORROW_MIN`], or never over TLS), else copied. Returns the stream
/// position its last byte is sent by (0 when copied).
pub(super) fn queue_data(out: &mut SendQueue, data: &[u8], borrow_min: usize) -> u64 {
    if data.len() < borrow_min {
        out.extend_from_slice(data);
        return 0;
    }
    // SAFETY: `data` is (part of) the buffer of a command in flight, held in its slot, which
    // nothing resizes or writes while the command is in flight; when the command completes,
    // `complete` parks the buffer until `sent_total` passes the position returned here, and
    // a dropped `HostQueue` drops its send queue unflushed.
    unsafe { out.push_borrowed(NonNull::from(data).cast(), data.len()) }
}
