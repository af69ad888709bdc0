//! The NVMe/TCP transport's part of a hot upgrade ([`crate::upgrade`]): a paused
//! connection's state (negotiated digests, ICReq done, the bytes read and not yet a whole
//! PDU) and the connection rebuilt from it, around the same socket, in the next process.

use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use pollux_reactor::{Reactor, SourceId, SourceOpts};

use super::{Conn, RxPool, TcpTransport};
use crate::handover::{Bytes, ConnState, TcpState};
use crate::path::Path;
use crate::queue::Queue;
use crate::queue::handover::ResumeError;
use crate::shared::Shared;

impl Conn {
    /// The paused connection's state; `fd` is its socket's index among the descriptors sent.
    pub fn handover_state(&self, fd: usize) -> ConnState {
        ConnState {
            queue: self.export(),
            transport: TcpState {
                fd,
                hdgst: self.t.hdgst,
                ddgst: self.t.ddgst,
                ic_done: self.t.ic_done,
                rx: Bytes(self.t.rx.avail().to_vec()),
            },
        }
    }
}

/// Why a handed-over connection could not be installed.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// The socket could not be wrapped.
    #[error("socket: {0}")]
    Socket(#[from] std::io::Error),
    /// Its state does not fit this process.
    #[error("{0}")]
    State(#[from] ResumeError),
    /// The reactor refused the source.
    #[error("reactor: {0}")]
    Reactor(#[from] pollux_reactor::ReactorError),
}

/// Install handed-over connection `s` (its socket `sock`) on reactor `r`, paused: the
/// source id, or why not (the socket is then closed). Counted as its listener's and its
/// reactor's connection; an admin queue's controller is registered with its reactor.
pub fn install(
    r: &mut Reactor,
    sock: TcpStream,
    s: &ConnState,
    shared: &Arc<Shared>,
    started: Instant,
    path: Path,
) -> Result<SourceId, InstallError> {
    sock.set_nonblocking(true)?;
    let me = r.id();
    let rx_pool = r.local::<RxPool>().map(|p| p.clone());
    let mut t = TcpTransport::new(
        sock,
        &shared.transport,
        pollux_conf::TlsMode::None,
        || Arc::new(|_| None),
        rx_pool.as_ref(),
    )?;
    let (ts, s) = (&s.transport, &s.queue);
    t.hdgst = ts.hdgst;
    t.ddgst = ts.ddgst;
    t.ic_done = ts.ic_done;
    if !ts.rx.0.is_empty() {
        t.rx.insert(0, &ts.rx.0);
    }
    let open = path.open.clone();
    let mut q = Queue::new(t, shared.clone(), me, s.serial, started, path);
    q.import(s, &shared.snapshot.load())?;
    let fd = q.t.sock.as_raw_fd();
    let id = r.add_sleepable_source(Box::new(q), SourceOpts::socket(fd))?;
    shared.conns_per_reactor[me].fetch_add(1, Relaxed);
    open.fetch_add(1, Relaxed);
    r.with_source::<Conn, _>(id, |c, r| c.installed(r, id));
    Ok(id)
}
