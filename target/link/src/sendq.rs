//! A connection's send queue: PDU bytes the target built (headers, responses, copied data)
//! interleaved with read data that stays where it is, in a RAM namespace, until the kernel
//! copies it into the socket.
//!
//! Why: a 4 KiB random read over a large RAM namespace used to be copied twice on the
//! target, once by pollux from the namespace into the send buffer and once by the kernel
//! from the send buffer into socket buffers. In a CPU profile of the poll-mode reactor at
//! QD32 (`perf record -e cpu-clock`) each copy took about a quarter of the core. Handing
//! the kernel an iovec that points into the namespace (`sendmsg`, as SPDK's sock layer
//! does with `writev`) leaves one copy.
//!
//! What that changes: the kernel reads the namespace when the bytes are sent, not when the
//! command ran. The bytes are still in this connection's stream before the command's
//! completion (the C2HData SUCCESS flag or the CQE that follows them), so the host sees its
//! completion only after the data was taken; a write to the same blocks that the host
//! submitted while the read was outstanding may or may not be seen, which NVMe allows for
//! commands outstanding together (NVMe 2.0 §3.4.1: commands of a queue are independent,
//! and their order of execution is not defined). With a data digest the digest must cover
//! exactly the bytes sent, so `Conn` copies in that case.

use std::any::Any;
use std::collections::VecDeque;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::RawFd;
use std::ptr::NonNull;
use std::sync::Arc;

/// iovecs per `sendmsg`: at QD32 a flush holds a header and a data segment per read.
const MAX_IOV: usize = 128;

/// Compact the owned buffer when this much of it has been sent but not all (a slow reader).
const COMPACT_AT: usize = 1 << 20;

/// Bytes that live outside the queue, sent in place.
struct External {
    /// Position in `buf` the bytes go before (everything in `buf` before it is sent first).
    at: usize,
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: `base` points into memory owned by one of the queue's `keeps` (Send + Sync), or
// by the caller of `push_borrowed`, who keeps it valid until the bytes are sent wherever the
// queue goes; it is only passed to the kernel (never dereferenced by Rust code), so the
// segment may move between threads with its owner.
unsafe impl Send for External {}

/// What keeps the memory of external segments mapped (the namespace that owns it) until the
/// stream has sent up to `until`. Consecutive segments of one owner share one entry: a run
/// of reads of one namespace holds it once, not once per read (no reference count taken and
/// dropped per command).
struct Keep {
    owner: Arc<dyn Any + Send + Sync>,
    /// The stream position after the last byte it keeps.
    until: u64,
}

/// Ordered bytes waiting for the socket.
#[derive(Default)]
pub struct SendQueue {
    buf: Vec<u8>,
    /// Bytes of `buf` already sent.
    sent: usize,
    ext: VecDeque<External>,
    /// The owner of the newest external segments not yet sent (at QD1 the only one: no
    /// queue to push to and pop from per read).
    keep_last: Option<Keep>,
    /// Owners of older external segments not yet sent, in stream order.
    keeps: VecDeque<Keep>,
    /// Bytes of the front external segment already sent.
    ext_sent: usize,
    /// Bytes of external segments not yet sent.
    ext_pending: usize,
    /// Bytes sent since the queue was made: a position in the stream.
    sent_total: u64,
}

impl std::fmt::Debug for SendQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendQueue")
            .field("pending", &self.pending())
            .field("external_segments", &self.ext.len())
            .field("sent_total", &self.sent_total)
            .finish()
    }
}

impl SendQueue {
    /// An empty queue whose owned buffer starts with `cap` bytes of room.
    pub fn with_capacity(cap: usize) -> Self {
        Self {
            buf: Vec::with_capacity(cap),
            ..Self::default()
        }
    }

    /// Bytes queued and not yet sent.
    #[inline]
    pub fn pending(&self) -> usize {
        self.buf.len() - self.sent + self.ext_pending
    }

    /// Append bytes the queue owns.
    #[inline]
    pub fn extend_from_slice(&mut self, b: &[u8]) {
        self.buf.extend_from_slice(b);
    }

    /// The owned tail, to append to in place (a copy of read data that needs a digest).
    #[inline]
    pub fn owned(&mut self) -> &mut Vec<u8> {
        &mut self.buf
    }

    /// Append `len` bytes at `base` to be sent in place, without a copy.
    ///
    /// # Safety
    /// `base..base + len` must stay mapped and readable while `keep` lives (the queue holds
    /// a reference to `keep` until the bytes are sent). Others may write to the bytes
    /// meanwhile: the kernel sends whatever they hold when it copies them.
    #[inline]
    pub unsafe fn push_external<K: Any + Send + Sync>(&mut self, base: NonNull<u8>, len: usize, keep: &Arc<K>) {
        if len == 0 {
            return;
        }
        self.keep_until_sent(len, Arc::as_ptr(keep).cast(), || keep.clone());
        self.push_segment(base, len);
    }

    /// [`Self::push_external`] with a keeper whose type is not known (a transport given a
    /// read's bytes and whatever keeps them mapped).
    ///
    /// # Safety
    /// As [`Self::push_external`]'s.
    #[inline]
    pub unsafe fn push_external_dyn(&mut self, base: NonNull<u8>, len: usize, keep: &Arc<dyn Any + Send + Sync>) {
        if len == 0 {
            return;
        }
        self.keep_until_sent(len, Arc::as_ptr(keep).cast(), || keep.clone());
        self.push_segment(base, len);
    }

    /// The owner `owner` (at address `at`) is kept until the `len` bytes about to be queued
    /// are sent.
    #[inline]
    fn keep_until_sent(&mut self, len: usize, at: *const (), owner: impl FnOnce() -> Arc<dyn Any + Send + Sync>) {
        let until = self.stream_end() + len as u64;
        match &mut self.keep_last {
            // The same owner as the segment before: it is kept until this one is sent too.
            Some(k) if std::ptr::addr_eq(Arc::as_ptr(&k.owner), at) => k.until = until,
            last => {
                let new = Keep { owner: owner(), until };
                if let Some(older) = last.replace(new) {
                    self.keeps.push_back(older);
                }
            }
        }
    }

    /// Append `len` bytes at `base` to be sent in place, the caller keeping them alive;
    /// returns the stream position at their end, which [`SendQueue::sent_total`] reaches
    /// once they are sent.
    ///
    /// # Safety
    /// `base..base + len` must stay allocated and readable until `sent_total()` reaches the
    /// returned position, or until the queue is dropped or no longer flushed. Writes to the
    /// bytes meanwhile change what is sent.
    pub unsafe fn push_borrowed(&mut self, base: NonNull<u8>, len: usize) -> u64 {
        self.push_segment(base, len);
        self.stream_end()
    }

    /// Queue an external segment after the owned bytes queued so far (callers hold the
    /// safety contract of `push_external` or `push_borrowed`).
    #[inline]
    fn push_segment(&mut self, base: NonNull<u8>, len: usize) {
        if len == 0 {
            return;
        }
        self.ext.push_back(External {
            at: self.buf.len(),
            base,
            len,
        });
        self.ext_pending += len;
    }

    /// Bytes sent since the queue was made.
    #[inline]
    pub fn sent_total(&self) -> u64 {
        self.sent_total
    }

    /// The stream position after everything queued so far.
    #[inline]
    pub fn stream_end(&self) -> u64 {
        self.sent_total + self.pending() as u64
    }

    /// Send as much as the socket takes. Ok when everything went or the socket is full
    /// (`pending` says which); an error is the connection's end.
    pub fn flush(&mut self, fd: RawFd) -> io::Result<()> {
        while self.pending() > 0 {
            let rc = if self.ext.is_empty() {
                // Only owned bytes (capsules, responses): a plain send, no iovec to build.
                let rest = &self.buf[self.sent..];
                // SAFETY: `rest` is a live slice of `buf` for the whole call; the kernel
                // only reads it.
                unsafe {
                    libc::send(
                        fd,
                        rest.as_ptr().cast(),
                        rest.len(),
                        libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
                    )
                }
            } else {
                let mut iov = [MaybeUninit::<libc::iovec>::uninit(); MAX_IOV];
                let n = self.gather(&mut iov);
                // SAFETY: a zeroed msghdr is valid (no name, no control data); its iovec
                // array is the first `n` entries of `iov`, initialised by `gather`, each
                // pointing at queued bytes that stay valid for this call (owned by `buf` or
                // kept alive by an `External`). The kernel only reads them.
                unsafe {
                    let mut msg: libc::msghdr = std::mem::zeroed();
                    msg.msg_iov = iov.as_mut_ptr().cast::<libc::iovec>();
                    msg.msg_iovlen = n;
                    libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT)
                }
            };
            if rc < 0 {
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::WouldBlock => break,
                    io::ErrorKind::Interrupted => continue,
                    _ => return Err(e),
                }
            }
            if rc == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            self.advance(rc as usize);
        }
        // The owners of what was sent may go.
        while self.keeps.front().is_some_and(|k| k.until <= self.sent_total) {
            self.keeps.pop_front();
        }
        if self.keep_last.as_ref().is_some_and(|k| k.until <= self.sent_total) {
            self.keep_last = None;
        }
        self.settle();
        Ok(())
    }

    /// Hand the queued bytes to `write` (a TLS session) until it has taken them all or
    /// returns `WouldBlock`. Only for a queue of owned bytes: bytes sent in place are the
    /// kernel's to read, never a Rust slice's.
    pub fn flush_owned_with(&mut self, mut write: impl FnMut(&[u8]) -> io::Result<usize>) -> io::Result<()> {
        if !self.ext.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "data queued in place on a connection that copies",
            ));
        }
        while self.sent < self.buf.len() {
            match write(&self.buf[self.sent..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.advance(n.min(self.buf.len() - self.sent)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        self.settle();
        Ok(())
    }

    /// Reset an emptied queue, or compact one a slow reader left mostly sent.
    fn settle(&mut self) {
        if self.pending() == 0 {
            self.buf.clear();
            self.sent = 0;
        } else if self.sent > COMPACT_AT {
            self.buf.drain(..self.sent);
            for e in &mut self.ext {
                e.at -= self.sent;
            }
            self.sent = 0;
        }
    }

    /// Fill `iov` with the next segments in stream order; returns how many.
    fn gather(&self, iov: &mut [MaybeUninit<libc::iovec>]) -> usize {
        let mut n = 0;
        let mut pos = self.sent;
        let mut ext = self.ext.iter().enumerate();
        let mut next = ext.next();
        while n < iov.len() {
            let until = next.map_or(self.buf.len(), |(_, e)| e.at);
            if pos < until {
                iov[n] = MaybeUninit::new(libc::iovec {
                    iov_base: self.buf[pos..until].as_ptr().cast_mut().cast(),
                    iov_len: until - pos,
                });
                n += 1;
                pos = until;
            } else if let Some((i, e)) = next {
                // Only the front segment can be partly sent.
                let skip = if i == 0 { self.ext_sent } else { 0 };
                // SAFETY: `skip < e.len` (a fully sent segment is popped), so the pointer
                // stays inside the segment.
                let base = unsafe { e.base.as_ptr().add(skip) };
                iov[n] = MaybeUninit::new(libc::iovec {
                    iov_base: base.cast(),
                    iov_len: e.len - skip,
                });
                n += 1;
                next = ext.next();
            } else {
                break;
            }
        }
        n
    }

    /// Account `n` bytes as sent.
    fn advance(&mut self, mut n: usize) {
        self.sent_total += n as u64;
        while n > 0 {
            let until = self.ext.front().map_or(self.buf.len(), |e| e.at);
            if self.sent < until {
                let k = n.min(until - self.sent);
                self.sent += k;
                n -= k;
            } else if let Some(e) = self.ext.front() {
                let k = n.min(e.len - self.ext_sent);
                self.ext_sent += k;
                self.ext_pending -= k;
                n -= k;
                if self.ext_sent == e.len {
                    self.ext.pop_front();
                    self.ext_sent = 0;
                }
            } else {
                debug_assert!(false, "sendmsg reported more bytes than were queued");
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::io::Read;
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    fn external(q: &mut SendQueue, mem: &Arc<Vec<u8>>, range: std::ops::Range<usize>) {
        let base = NonNull::new(mem[range.clone()].as_ptr().cast_mut()).unwrap();
        // SAFETY: the bytes belong to `mem`, which the queue keeps alive and nobody writes.
        unsafe { q.push_external(base, range.len(), mem) };
    }

    /// Bytes come out in the order they were queued, owned and external interleaved, across
    /// partial sends (a small socket buffer and a reader that drains it bit by bit).
    #[test]
    fn order_is_kept_across_partial_sends() {
        let (a, mut b) = UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        // SAFETY: setsockopt on a socket this test owns, with a valid int.
        unsafe {
            let v: libc::c_int = 4096;
            libc::setsockopt(
                a.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_SNDBUF,
                (&v as *const libc::c_int).cast(),
                4,
            );
        }
        let mem: Arc<Vec<u8>> = Arc::new((0..200_000u32).map(|i| (i % 251) as u8).collect());
        let mut q = SendQueue::with_capacity(16);
        let mut want = Vec::new();
        for i in 0..40usize {
            let hdr = [i as u8; 24];
            q.extend_from_slice(&hdr);
            want.extend_from_slice(&hdr);
            let r = i * 4000..i * 4000 + 3000 + i;
            external(&mut q, &mem, r.clone());
            want.extend_from_slice(&mem[r]);
            if i % 3 == 0 {
                let resp = [0xC0 | i as u8; 16];
                q.extend_from_slice(&resp);
                want.extend_from_slice(&resp);
            }
        }
        assert_eq!(q.pending(), want.len());
        let mut got = Vec::new();
        let mut chunk = vec![0u8; 1500];
        while q.pending() > 0 {
            q.flush(a.as_raw_fd()).unwrap();
            let n = b.read(&mut chunk).unwrap();
            got.extend_from_slice(&chunk[..n]);
        }
        drop(a);
        b.read_to_end(&mut got).unwrap();
        assert_eq!(got.len(), want.len());
        assert!(got == want, "stream differs from what was queued");
        // The namespace stand-in is released once its bytes are sent.
        assert_eq!(Arc::strong_count(&mem), 1);
    }

    /// Consecutive segments of one owner hold it once; it is held until the last of them is
    /// sent, not released when the first one is (a partial send), and another owner's
    /// segments in between keep their own.
    #[test]
    fn an_owner_is_held_once_per_run_until_its_last_segment_is_sent() {
        let (a, mut b) = UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        let one: Arc<Vec<u8>> = Arc::new(vec![1; 300_000]);
        let two: Arc<Vec<u8>> = Arc::new(vec![2; 1000]);
        let mut q = SendQueue::default();
        for i in 0..3 {
            external(&mut q, &one, i * 1000..(i + 1) * 1000);
        }
        // Three reads of one namespace: one reference.
        assert_eq!(Arc::strong_count(&one), 2);
        external(&mut q, &two, 0..1000);
        external(&mut q, &one, 3000..300_000);
        assert_eq!((Arc::strong_count(&one), Arc::strong_count(&two)), (3, 2));
        let total = q.pending() as u64;
        let mut got = 0u64;
        let mut chunk = vec![0u8; 64 * 1024];
        let mut seen_partial = false;
        while q.pending() > 0 {
            q.flush(a.as_raw_fd()).unwrap();
            let sent = q.sent_total();
            // `two` goes once its bytes (3000..4000 of the stream) are out; `one` once all is.
            assert_eq!(Arc::strong_count(&two), if sent >= 4000 { 1 } else { 2 });
            if sent < total {
                assert!(Arc::strong_count(&one) >= 2, "released at {sent} of {total}");
                seen_partial |= sent >= 4000;
            }
            got += b.read(&mut chunk).unwrap() as u64;
        }
        assert!(seen_partial, "the socket took the data in several calls");
        assert_eq!((Arc::strong_count(&one), Arc::strong_count(&two)), (1, 1));
        drop(a);
        let mut rest = Vec::new();
        b.read_to_end(&mut rest).unwrap();
        assert_eq!(got + rest.len() as u64, total);
    }

    /// A borrowed segment's returned position is where `sent_total` says it has gone: not
    /// before its last byte is sent, and exactly then.
    #[test]
    fn borrowed_bytes_are_sent_by_the_position_returned() {
        let (a, mut b) = UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 253) as u8).collect();
        let mut q = SendQueue::default();
        q.extend_from_slice(&[1; 10]);
        // SAFETY: `data` outlives the queue and nothing writes to it.
        let by = unsafe { q.push_borrowed(NonNull::from(&data[..]).cast(), data.len()) };
        q.extend_from_slice(&[2; 5]);
        assert_eq!(by, 10 + data.len() as u64);
        assert_eq!(q.stream_end(), by + 5);
        let mut got = Vec::new();
        let mut chunk = vec![0u8; 64 * 1024];
        let mut seen_partial = false;
        while q.pending() > 0 {
            q.flush(a.as_raw_fd()).unwrap();
            assert_eq!(q.sent_total() + q.pending() as u64, by + 5);
            seen_partial |= q.sent_total() < by && q.pending() > 0;
            let n = b.read(&mut chunk).unwrap();
            got.extend_from_slice(&chunk[..n]);
            // What the reader has is at most what was sent; the borrowed bytes are all out
            // once `sent_total` reaches `by`.
            assert!(got.len() as u64 <= q.sent_total());
        }
        assert!(seen_partial, "the socket took the data in several calls");
        assert_eq!(q.sent_total(), by + 5);
        drop(a);
        b.read_to_end(&mut got).unwrap();
        let mut want = vec![1u8; 10];
        want.extend_from_slice(&data);
        want.extend_from_slice(&[2; 5]);
        assert!(got == want);
    }

    /// More segments than one sendmsg takes go out in several calls, still in order.
    #[test]
    fn more_segments_than_one_call_takes() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let mem: Arc<Vec<u8>> = Arc::new((0..=255u8).cycle().take(64 * 1024).collect());
        let mut q = SendQueue::default();
        let mut want = Vec::new();
        for i in 0..3 * MAX_IOV {
            q.extend_from_slice(&[i as u8]);
            want.push(i as u8);
            let r = (i * 7) % 1000..(i * 7) % 1000 + 9;
            external(&mut q, &mem, r.clone());
            want.extend_from_slice(&mem[r]);
        }
        q.flush(a.as_raw_fd()).unwrap();
        assert_eq!(q.pending(), 0);
        drop(a);
        let mut got = Vec::new();
        b.read_to_end(&mut got).unwrap();
        assert!(got == want);
    }

    /// A peer that went away is an error, not a signal that kills the process.
    #[test]
    fn closed_peer_is_an_error() {
        let (a, b) = UnixStream::pair().unwrap();
        drop(b);
        let mut q = SendQueue::default();
        q.extend_from_slice(b"gone");
        let e = q.flush(a.as_raw_fd()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::BrokenPipe);
    }
}
