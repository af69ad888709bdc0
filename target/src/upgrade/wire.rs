//! The handover socket: a `SOCK_SEQPACKET` Unix socket pair between the old and the new
//! process. A message ([`super::state::Msg`]) is JSON cut into packets of at most
//! [`CHUNK`] bytes, its descriptors sent before it in packets of at most [`FDS_PER_PACKET`]
//! (`SCM_RIGHTS`); a packet's first byte says what it is. Sequenced packets keep each
//! packet's descriptors with it (a stream socket can merge or split the bytes they ride on).

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use nix::cmsg_space;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};

use super::UpgradeError;
use super::state::Msg;

/// JSON bytes per packet.
pub const CHUNK: usize = 32 * 1024;
/// Descriptors per packet (the kernel's SCM_MAX_FD is 253).
pub const FDS_PER_PACKET: usize = 250;

const KIND_FDS: u8 = 1;
const KIND_MORE: u8 = 2;
const KIND_LAST: u8 = 3;

/// One end of the handover socket.
#[derive(Debug)]
pub struct Wire {
    fd: OwnedFd,
}

impl Wire {
    /// Wrap one end.
    pub fn new(fd: OwnedFd) -> Self {
        Self { fd }
    }

    /// A connected pair (close-on-exec; the end given to the child is made inheritable
    /// in it only).
    pub fn pair() -> Result<(Self, OwnedFd), UpgradeError> {
        use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
        let (a, b) =
            socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC).map_err(|e| {
                UpgradeError::Io {
                    what: "create the handover socket pair",
                    source: e.into(),
                }
            })?;
        Ok((Self::new(a), b))
    }

    /// Its descriptor.
    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Send `msg` with `fds` (each is duplicated into the peer; they stay open here).
    pub fn send(&self, msg: &Msg, fds: &[RawFd]) -> Result<(), UpgradeError> {
        let io = |source: nix::Error| match source {
            nix::Error::EPIPE | nix::Error::ECONNRESET => UpgradeError::PeerGone,
            source => UpgradeError::Io {
                what: "send on the handover socket",
                source: source.into(),
            },
        };
        for chunk in fds.chunks(FDS_PER_PACKET) {
            let kind = [KIND_FDS];
            let iov = [IoSlice::new(&kind)];
            let cmsg = [ControlMessage::ScmRights(chunk)];
            sendmsg::<()>(self.fd.as_raw_fd(), &iov, &cmsg, MsgFlags::MSG_NOSIGNAL, None).map_err(io)?;
        }
        let json = serde_json::to_vec(msg).map_err(|e| UpgradeError::Encode(e.to_string()))?;
        let mut pieces = json.chunks(CHUNK).peekable();
        if pieces.peek().is_none() {
            return Err(UpgradeError::Encode("an empty message".into()));
        }
        while let Some(piece) = pieces.next() {
            let kind = [if pieces.peek().is_some() { KIND_MORE } else { KIND_LAST }];
            let iov = [IoSlice::new(&kind), IoSlice::new(piece)];
            sendmsg::<()>(self.fd.as_raw_fd(), &iov, &[], MsgFlags::MSG_NOSIGNAL, None).map_err(io)?;
        }
        Ok(())
    }

    /// Receive one message and the descriptors sent with it, waiting at most `timeout`.
    /// The peer closing its end (it exited) is [`UpgradeError::PeerGone`].
    pub fn recv(&self, timeout: Duration) -> Result<(Msg, Vec<OwnedFd>), UpgradeError> {
        let deadline = Instant::now() + timeout;
        let mut fds: Vec<OwnedFd> = Vec::new();
        let mut json: Vec<u8> = Vec::new();
        let mut buf = vec![0u8; CHUNK + 1];
        loop {
            self.wait_readable(deadline)?;
            let mut cmsg = cmsg_space!([RawFd; FDS_PER_PACKET]);
            let (n, got, truncated) = {
                let mut iov = [IoSliceMut::new(&mut buf)];
                let m = recvmsg::<()>(
                    self.fd.as_raw_fd(),
                    &mut iov,
                    Some(&mut cmsg),
                    MsgFlags::MSG_CMSG_CLOEXEC,
                )
                .map_err(|e| match e {
                    nix::Error::ECONNRESET => UpgradeError::PeerGone,
                    e => UpgradeError::Io {
                        what: "receive on the handover socket",
                        source: e.into(),
                    },
                })?;
                let mut got = Vec::new();
                if let Ok(cmsgs) = m.cmsgs() {
                    for c in cmsgs {
                        if let ControlMessageOwned::ScmRights(v) = c {
                            got.extend(v);
                        }
                    }
                }
                let truncated = m.flags.intersects(MsgFlags::MSG_CTRUNC | MsgFlags::MSG_TRUNC);
                (m.bytes, got, truncated)
            };
            // SAFETY: each descriptor was just installed in this process by SCM_RIGHTS and
            // is owned by nothing else here.
            fds.extend(got.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
            if n == 0 {
                return Err(UpgradeError::PeerGone);
            }
            if truncated {
                return Err(UpgradeError::Protocol("a handover packet was truncated".into()));
            }
            match buf[0] {
                KIND_FDS => {}
                KIND_MORE => json.extend_from_slice(&buf[1..n]),
                KIND_LAST => {
                    json.extend_from_slice(&buf[1..n]);
                    let msg = serde_json::from_slice(&json)
                        .map_err(|e| UpgradeError::Protocol(format!("a message that does not parse: {e}")))?;
                    return Ok((msg, fds));
                }
                k => return Err(UpgradeError::Protocol(format!("a packet of unknown kind {k}"))),
            }
        }
    }

    fn wait_readable(&self, deadline: Instant) -> Result<(), UpgradeError> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(UpgradeError::Timeout);
            }
            let ms = u16::try_from(left.as_millis().max(1)).unwrap_or(u16::MAX);
            let mut p = [PollFd::new(self.fd.as_fd(), PollFlags::POLLIN)];
            match poll(&mut p, PollTimeout::from(ms)) {
                Ok(0) => {}
                Ok(_) => return Ok(()),
                Err(nix::Error::EINTR) => {}
                Err(e) => {
                    return Err(UpgradeError::Io {
                        what: "wait on the handover socket",
                        source: e.into(),
                    });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use super::*;
    use crate::handover::{Hello, Msg};

    #[test]
    fn messages_and_descriptors_cross_and_large_messages_are_cut_and_joined() {
        let (a, b) = Wire::pair().expect("pair");
        let b = Wire::new(b);
        let (mut r, mut w) = std::os::unix::net::UnixStream::pair().expect("pair");
        let fds: Vec<RawFd> = std::iter::repeat_n(w.as_raw_fd(), 600).collect();
        let big = "x".repeat(3 * CHUNK + 17);
        let msg = Msg::Refuse(big.clone());
        let t = std::thread::spawn(move || a.send(&msg, &fds).map(|_| a));
        let (got, fds) = b.recv(Duration::from_secs(5)).expect("recv");
        let a = t.join().expect("join").expect("send");
        assert!(matches!(got, Msg::Refuse(s) if s == big));
        assert_eq!(fds.len(), 600);
        // Each is a working duplicate of the socket end.
        let mut f = std::fs::File::from(fds.into_iter().next().expect("fd"));
        f.write_all(b"hi").expect("write");
        drop(w.flush());
        let mut two = [0u8; 2];
        r.read_exact(&mut two).expect("read");
        assert_eq!(&two, b"hi");
        // A peer that goes away is said so; silence is a timeout.
        let hello = Msg::Hello(Hello {
            version: "v".into(),
            commit: "c".into(),
            pid: 1,
            oldest_read: 1,
            newest_read: 1,
        });
        a.send(&hello, &[]).expect("send");
        assert!(matches!(b.recv(Duration::from_secs(5)), Ok((Msg::Hello(_), _))));
        assert!(matches!(b.recv(Duration::from_millis(50)), Err(UpgradeError::Timeout)));
        drop(a);
        assert!(matches!(b.recv(Duration::from_secs(5)), Err(UpgradeError::PeerGone)));
        let _ = w.write(b"");
    }
}
