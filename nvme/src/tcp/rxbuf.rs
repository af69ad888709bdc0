//! The receive buffer of an NVMe/TCP connection: bytes read from a non-blocking socket that
//! [`super::next_frame`] walks into PDUs, with the data of a large PDU optionally received
//! straight into its destination ([`RxBuf::recv_into`]).

use std::fmt;
use std::io;
use std::os::fd::{AsFd, AsRawFd};

/// A linear receive buffer: the unread bytes are `start..end` of one allocation, read into
/// from `end` on, and moved to the front when room runs short ([`RxBuf::make_room`]). Its
/// capacity is the one it was made with until a caller asks for more ([`RxBuf::make_room`]
/// with a larger need, [`RxBuf::insert`]); the storage stays behind this API, so that a
/// buffer that grows on demand (or shrinks when idle) changes no caller.
#[derive(Default)]
pub struct RxBuf {
    /// Every byte initialised: `buf.len()` is the capacity.
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

/// What one read brought ([`RxBuf::recv`], [`RxBuf::recv_into`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recv {
    /// Bytes arrived: `buffered` of them were appended to the buffer and `placed` went to
    /// the destination of [`RxBuf::recv_into`] (0 for [`RxBuf::recv`]).
    Data {
        /// Bytes appended to the buffer.
        buffered: usize,
        /// Bytes written to the destination.
        placed: usize,
        /// Fewer bytes came than there was room for: the socket's receive queue is empty
        /// now, and more data raises a new readiness edge, so reading again at once would
        /// only return `EAGAIN` (a system call for nothing).
        drained: bool,
    },
    /// Nothing to read (`EAGAIN`): the socket is empty.
    Empty,
    /// No room to read into: nothing was read.
    Full,
    /// The peer closed the connection (end of stream).
    Eof,
}

impl fmt::Debug for RxBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RxBuf")
            .field("capacity", &self.buf.len())
            .field("start", &self.start)
            .field("end", &self.end)
            .finish()
    }
}

/// Runs a read system call until it is not interrupted: its byte count (0 at the end of the
/// stream), `None` for `EAGAIN`, or the error.
#[inline(always)]
fn retry(mut call: impl FnMut() -> isize) -> io::Result<Option<usize>> {
    loop {
        if let Ok(n) = usize::try_from(call()) {
            return Ok(Some(n));
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::Interrupted => {}
            io::ErrorKind::WouldBlock => return Ok(None),
            _ => return Err(e),
        }
    }
}

impl RxBuf {
    /// An empty buffer of `capacity` bytes.
    pub fn new(capacity: usize) -> Self {
        Self {
            buf: vec![0; capacity],
            start: 0,
            end: 0,
        }
    }

    /// The unread bytes.
    #[inline]
    pub fn avail(&self) -> &[u8] {
        self.buf.get(self.start..self.end).unwrap_or_default()
    }

    /// Unread bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.end - self.start
    }

    /// No unread bytes.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }

    /// Bytes the buffer holds in all.
    #[inline]
    pub fn capacity(&self) -> usize {
        self.buf.len()
    }

    /// Bytes a read can append now, without [`RxBuf::make_room`].
    #[inline]
    pub fn room(&self) -> usize {
        self.buf.len() - self.end
    }

    /// Marks the first `n` unread bytes read (all of them if there are fewer).
    #[inline]
    pub fn consume(&mut self, n: usize) {
        self.start = self.start.saturating_add(n).min(self.end);
    }

    /// Drops every unread byte; the next read goes to the front.
    #[inline]
    pub fn clear(&mut self) {
        self.start = 0;
        self.end = 0;
    }

    /// Prepares for a read that must bring the unread bytes to `need` (the PDU at the front
    /// is that long; 0 when that does not matter): an empty buffer starts over at the front;
    /// otherwise the unread bytes move to the front when more than half of the buffer is
    /// used or `need` bytes would not fit where they start; and the buffer grows to `need`
    /// if it is smaller.
    #[inline]
    pub fn make_room(&mut self, need: usize) {
        let cap = self.buf.len();
        if self.start == self.end {
            self.clear();
        } else if self.start > 0 && (self.end > cap / 2 || self.start.saturating_add(need) > cap) {
            self.compact();
        }
        if need > cap {
            self.grow(need);
        }
    }

    /// Moves the unread bytes to another allocation of at least `capacity` bytes: `spare`
    /// (every byte initialised, e.g. a pooled buffer of an earlier connection) if it is large
    /// enough, else a new zeroed one. Returns the storage it had, for a pool or to free.
    /// For a receiver whose buffer starts small and grows to the PDUs it meets.
    pub fn move_to(&mut self, capacity: usize, spare: Option<Vec<u8>>) -> Vec<u8> {
        let n = self.len();
        let capacity = capacity.max(n);
        let mut new = match spare {
            Some(v) if v.len() >= capacity => v,
            _ => vec![0; capacity],
        };
        if let (Some(dst), Some(src)) = (new.get_mut(..n), self.buf.get(self.start..self.end)) {
            dst.copy_from_slice(src);
        }
        self.start = 0;
        self.end = n;
        std::mem::replace(&mut self.buf, new)
    }

    /// The storage, every byte initialised (for a pool), the unread bytes dropped.
    pub fn into_storage(self) -> Vec<u8> {
        self.buf
    }

    /// Moves the unread bytes to the front.
    fn compact(&mut self) {
        self.buf.copy_within(self.start..self.end, 0);
        self.end -= self.start;
        self.start = 0;
    }

    #[cold]
    fn grow(&mut self, capacity: usize) {
        self.buf.reserve_exact(capacity.saturating_sub(self.buf.len()));
        self.buf.resize(capacity, 0);
    }

    /// Inserts `bytes` into the unread bytes at offset `at` (their end if it is beyond),
    /// after moving the ones from `at` on behind them; compacts or grows first if there is no
    /// room. For a receiver that took bytes out of stream order (see [`RxBuf::recv_into`])
    /// and puts them back.
    pub fn insert(&mut self, at: usize, bytes: &[u8]) {
        if self.room() < bytes.len() {
            self.compact();
            if self.room() < bytes.len() {
                self.grow(self.end + bytes.len());
            }
        }
        let pos = self.start + at.min(self.len());
        let n = bytes.len();
        self.buf.copy_within(pos..self.end, pos + n);
        if let Some(dst) = self.buf.get_mut(pos..pos + n) {
            dst.copy_from_slice(bytes);
        }
        self.end += n;
    }

    /// One `recv(2)` from the non-blocking socket `fd` into the room after the unread bytes
    /// (retried when interrupted).
    #[inline(always)]
    pub fn recv(&mut self, fd: impl AsFd) -> io::Result<Recv> {
        let fd = fd.as_fd().as_raw_fd();
        let Some(free) = self.buf.get_mut(self.end..).filter(|f| !f.is_empty()) else {
            return Ok(Recv::Full);
        };
        let (ptr, room) = (free.as_mut_ptr(), free.len());
        // SAFETY: `ptr` and `room` are the free end of this buffer, borrowed mutably for the
        // call; recv writes at most `room` bytes there.
        let Some(n) = retry(|| unsafe { libc::recv(fd, ptr.cast(), room, 0) })? else {
            return Ok(Recv::Empty);
        };
        if n == 0 {
            return Ok(Recv::Eof);
        }
        let n = n.min(room);
        self.end += n;
        Ok(Recv::Data {
            buffered: n,
            placed: 0,
            drained: n < room,
        })
    }

    /// One read by `read` (a TLS session's, say) into the room after the unread bytes: it
    /// returns the bytes it wrote, 0 at the end of the stream, or `WouldBlock`.
    pub fn recv_with(&mut self, read: impl FnOnce(&mut [u8]) -> io::Result<usize>) -> io::Result<Recv> {
        let Some(free) = self.buf.get_mut(self.end..).filter(|f| !f.is_empty()) else {
            return Ok(Recv::Full);
        };
        let room = free.len();
        let n = match read(free) {
            Ok(0) => return Ok(Recv::Eof),
            Ok(n) => n.min(room),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Recv::Empty),
            Err(e) => return Err(e),
        };
        self.end += n;
        Ok(Recv::Data {
            buffered: n,
            placed: 0,
            drained: false,
        })
    }

    /// One `readv(2)` from the non-blocking socket `fd` (retried when interrupted) that puts
    /// the stream's next `head` bytes after the unread ones, the `left` bytes after those at
    /// `dest`, and up to `tail` bytes more after the first `head` (`head` and `tail` are cut
    /// to the room there is). Empty iovecs at either end are left out: the kernel imports
    /// every iovec, empty or not.
    ///
    /// A receiver that knows where the data of the PDU at hand goes receives it in place
    /// with this: a target the rest of a large H2CData's data (`head` 0: its header is
    /// parsed already), a host a lone read's C2HData (its header, `head`, still to come and
    /// to check; should it not be that read's PDU, the placed bytes go back in stream order
    /// with [`RxBuf::insert`]). `dest` is only ever given to the kernel: no Rust reference
    /// is made to it, so it may be memory a device reads by DMA.
    ///
    /// # Safety
    /// `dest` must be valid for writes of `left` bytes for the duration of the call, and
    /// nothing else may read or write those bytes meanwhile; they must not overlap this
    /// buffer.
    #[inline(always)]
    pub unsafe fn recv_into(
        &mut self,
        fd: impl AsFd,
        head: usize,
        dest: *mut u8,
        left: usize,
        tail: usize,
    ) -> io::Result<Recv> {
        let fd = fd.as_fd().as_raw_fd();
        let free = self.buf.get_mut(self.end..).unwrap_or_default();
        let head = head.min(free.len());
        let (h, t) = free.split_at_mut(head);
        let tail = tail.min(t.len());
        let asked = head + left + tail;
        if asked == 0 {
            return Ok(Recv::Full);
        }
        let iov = [
            libc::iovec {
                iov_base: h.as_mut_ptr().cast(),
                iov_len: head,
            },
            libc::iovec {
                iov_base: dest.cast(),
                iov_len: left,
            },
            libc::iovec {
                iov_base: t.as_mut_ptr().cast(),
                iov_len: tail,
            },
        ];
        let first = usize::from(head == 0);
        let last = iov.len() - usize::from(tail == 0);
        let iov = iov.get(first..last.max(first)).unwrap_or_default();
        // SAFETY: the iovecs are disjoint memory the kernel may write for the call: `head`
        // and `tail` bytes of this buffer's free end (borrowed mutably, `h` and `t`), and
        // `left` bytes at `dest`, which the caller guarantees (see # Safety).
        let Some(n) = retry(|| unsafe { libc::readv(fd, iov.as_ptr(), iov.len() as libc::c_int) })? else {
            return Ok(Recv::Empty);
        };
        if n == 0 {
            return Ok(Recv::Eof);
        }
        let n = n.min(asked);
        let placed = n.saturating_sub(head).min(left);
        // The head, then the tail right after it: one run at the end of the unread bytes.
        let buffered = n - placed;
        self.end += buffered;
        Ok(Recv::Data {
            buffered,
            placed,
            drained: n < asked,
        })
    }
}
