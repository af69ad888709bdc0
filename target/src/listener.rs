//! Listeners: accept NVMe/TCP connections on reactor 0 and place each on a reactor.

use std::io::ErrorKind;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use pollux_conf::{Placement, TlsMode};
use pollux_reactor::{Next, Progress, Reactor, Source, SourceId, SourceOpts};
use tracing::{info, warn};

use crate::ana::AnaStates;
use crate::conn::Conn;
use crate::subsystem::Shared;

static NEXT_SERIAL: AtomicU64 = AtomicU64::new(1);

/// A listening socket.
pub struct Listener {
    sock: TcpListener,
    /// Its bound address (its TLS mode is the snapshot's for it).
    addr: Option<SocketAddr>,
    shared: Arc<Shared>,
    placement: Placement,
    next: usize,
    started: Instant,
}

impl Listener {
    /// Wrap a bound, non-blocking listener.
    pub fn new(sock: TcpListener, shared: Arc<Shared>, placement: Placement, started: Instant) -> Self {
        Self {
            addr: sock.local_addr().ok(),
            sock,
            shared,
            placement,
            next: 0,
            started,
        }
    }

    /// Register it on reactor `r`.
    pub fn register(self, r: &mut Reactor) -> pollux_reactor::Result<SourceId> {
        let fd = self.sock.as_raw_fd();
        r.add_sleepable_source(Box::new(self), SourceOpts::readable(fd))
    }

    fn pick(&mut self) -> usize {
        let n = self.shared.reactors.max(1);
        match self.placement {
            Placement::RoundRobin => {
                self.next = (self.next + 1) % n;
                self.next
            }
            Placement::LeastLoaded => (0..n)
                .min_by_key(|&i| self.shared.conns_per_reactor[i].load(Relaxed))
                .unwrap_or(0),
        }
    }
}

/// A TLS handshake not finished this long after the connection was accepted closes it
/// (nvmet-tcp and the Linux host wait 10 s).
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// What a connection takes from the listener that accepted it.
#[derive(Debug, Clone, Default)]
pub struct Path {
    /// The listener's TLS mode.
    pub tls: TlsMode,
    /// The ANA states of its path.
    pub ana: Arc<AnaStates>,
}

/// Register an accepted socket of a listener (`path`) as a connection on reactor `r`.
pub fn add_connection(r: &mut Reactor, sock: TcpStream, shared: Arc<Shared>, started: Instant, path: Path) {
    let tls = path.tls;
    let serial = NEXT_SERIAL.fetch_add(1, Relaxed);
    let me = r.id();
    let fail = |shared: &Shared, e: String| {
        shared.conns_per_reactor[me].fetch_sub(1, Relaxed);
        warn!(reactor = me, error = %e, "cannot serve an accepted connection");
    };
    let conn = match Conn::new(sock, shared.clone(), me, serial, started, path) {
        Ok(c) => c,
        Err(e) => return fail(&shared, e.to_string()),
    };
    let fd = conn.raw_fd();
    match r.add_sleepable_source(Box::new(conn), SourceOpts::socket(fd)) {
        Ok(id) => {
            if tls != TlsMode::None {
                r.add_timer(Instant::now() + TLS_HANDSHAKE_TIMEOUT, move |r| {
                    r.with_source::<Conn, _>(id, |c, r| c.check_secured(r, id, serial));
                });
            }
            // Bytes may have arrived before registration: run it once now.
            r.wake(id)
        }
        Err(e) => fail(&shared, e.to_string()),
    }
}

impl Source for Listener {
    fn name(&self) -> &str {
        "nvme-tcp-listener"
    }

    fn run(&mut self, r: &mut Reactor, _id: SourceId) -> Progress {
        let mut did = false;
        loop {
            match self.sock.accept() {
                Ok((sock, peer)) => {
                    did = true;
                    if let Err(e) = sock.set_nonblocking(true).and_then(|_| sock.set_nodelay(true)) {
                        warn!(%peer, error = %e, "cannot configure an accepted socket");
                        continue;
                    }
                    let target = self.pick();
                    self.shared.conns_per_reactor[target].fetch_add(1, Relaxed);
                    info!(%peer, reactor = target, "connection accepted");
                    let (shared, started) = (self.shared.clone(), self.started);
                    let path = {
                        let snap = shared.snapshot.load();
                        match self.addr.and_then(|a| snap.listener(a)) {
                            Some(l) => Path {
                                tls: l.tls,
                                ana: l.ana.clone(),
                            },
                            None => Path::default(),
                        }
                    };
                    if target == r.id() {
                        add_connection(r, sock, shared, started, path);
                    } else if !r.send(target, move |r| add_connection(r, sock, shared, started, path)) {
                        self.shared.conns_per_reactor[target].fetch_sub(1, Relaxed);
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    // E.g. EMFILE: the pending connection stays queued; retry shortly rather
                    // than spin (edge-triggered epoll will not report it again).
                    warn!(error = %e, "accept failed");
                    return Progress {
                        did_work: did,
                        next: Next::At(Instant::now() + Duration::from_millis(100)),
                    };
                }
            }
        }
        Progress {
            did_work: did,
            next: Next::Idle,
        }
    }
}
