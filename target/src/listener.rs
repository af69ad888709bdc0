//! Listeners: accept NVMe/TCP connections on reactor 0 and place each on a reactor
//! ([`crate::placement`]).

use std::io::ErrorKind;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use pollux_conf::Placement;
use pollux_reactor::{Next, Progress, Reactor, Source, SourceId, SourceOpts};
use tracing::{info, warn};

use crate::path::Path;
use crate::placement::Placer;
use crate::queue::Queue;
use crate::shared::Shared;
use crate::tcp::{self, RxPool};

/// The transport the target's listeners accept connections on: the one place outside the
/// transport's own module ([`crate::tcp`]) that names it. Everything above the queue that
/// reaches a reactor's queues (run-time changes, the control plane, a hot upgrade, the
/// channels' completions) reaches them as [`Conn`] or through the functions below.
pub type Served = tcp::TcpTransport;

/// A connection the target serves: an NVMe-oF queue carried by [`Served`].
pub type Conn = Queue<Served>;

/// Where this reactor's channels deliver completions (registered at each reactor's start).
pub fn deliver(r: &mut Reactor, c: crate::backend::Completion<'_>) {
    crate::queue::deliver::<Served>(r, c);
}

/// Run `f` on every controller whose admin queue is on reactor `r`.
pub fn for_each_ctrl(r: &mut Reactor, f: impl FnMut(&crate::controller::Ctrl)) {
    crate::queue::for_each_ctrl::<Served>(r, f);
}

/// The clustered reservations' watcher's work ([`crate::queue::tend_clustered_reservations`])
/// for the queues of every reactor.
pub fn tend_clustered_reservations(shared: &Shared, remotes: &[pollux_reactor::Remote]) {
    crate::queue::tend_clustered_reservations::<Served>(shared, remotes);
}

static NEXT_SERIAL: AtomicU64 = AtomicU64::new(1);

/// The serial the next connection gets (a hot upgrade hands it to the next process).
pub fn next_serial() -> u64 {
    NEXT_SERIAL.load(Relaxed)
}

/// Serials from `at` on (the next process of a hot upgrade: its connections' serials go on
/// from the old process's).
pub fn serials_from(at: u64) {
    NEXT_SERIAL.fetch_max(at, Relaxed);
}

/// Connections one run of a listener accepts and hands out at most; with more pending it
/// runs again after the reactor's other sources (a connect storm is taken in slices, so
/// that the established connections on its reactor are served between them).
pub const ACCEPT_BATCH: usize = 16;
/// Refusals (connection limit) are logged at most this often, with the count since.
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(1);

/// A listening socket.
pub struct Listener {
    sock: TcpListener,
    /// Its bound address (its TLS mode and limit are the snapshot's for it).
    addr: Option<SocketAddr>,
    shared: Arc<Shared>,
    placement: Placement,
    started: Instant,
    /// Its connections open now (each decrements it as it closes).
    open: Arc<AtomicU64>,
    /// When a refusal was last logged, and the refusals since.
    refusal_logged: Option<Instant>,
    refused_unlogged: u64,
    /// Not accepting: a hot upgrade is handing the socket over (connections wait in its
    /// backlog for whichever process serves next).
    pub paused: bool,
}

impl Listener {
    /// Wrap a bound, non-blocking listener.
    pub fn new(sock: TcpListener, shared: Arc<Shared>, placement: Placement, started: Instant) -> Self {
        Self {
            addr: sock.local_addr().ok(),
            sock,
            shared,
            placement,
            started,
            open: Arc::new(AtomicU64::new(0)),
            refusal_logged: None,
            refused_unlogged: 0,
            paused: false,
        }
    }

    /// Its listening socket's descriptor.
    pub fn raw_fd(&self) -> std::os::fd::RawFd {
        self.sock.as_raw_fd()
    }

    /// Its bound address.
    pub fn addr(&self) -> Option<SocketAddr> {
        self.addr
    }

    /// The count of its open connections (connections handed over by an upgrade count in
    /// it too).
    pub fn open(&self) -> Arc<AtomicU64> {
        self.open.clone()
    }

    /// Register it on reactor `r`.
    pub fn register(self, r: &mut Reactor) -> pollux_reactor::Result<SourceId> {
        let fd = self.sock.as_raw_fd();
        r.add_sleepable_source(Box::new(self), SourceOpts::readable(fd))
    }

    /// The limit a new connection would break, if any: the listener's own
    /// (`max_connections` of its `[[listener]]`) or the target's (`[transport]`).
    fn over_limit(&self, listener_max: Option<u32>) -> Option<(&'static str, u64)> {
        if let Some(max) = listener_max
            && self.open.load(Relaxed) >= u64::from(max)
        {
            return Some(("listener", u64::from(max)));
        }
        let total: u64 = self.shared.conns_per_reactor.iter().map(|c| c.load(Relaxed)).sum();
        let max = u64::from(self.shared.transport.max_connections);
        (total >= max).then_some(("target", max))
    }

    /// Log a refused connection, at most once per [`REFUSAL_LOG_EVERY`] (a storm of them
    /// must not become a storm of log lines).
    fn log_refusal(&mut self, peer: SocketAddr, scope: &str, max: u64) {
        self.refused_unlogged += 1;
        let now = Instant::now();
        if self.refusal_logged.is_some_and(|t| now - t < REFUSAL_LOG_EVERY) {
            return;
        }
        warn!(
            %peer,
            listener = ?self.addr,
            limit = max,
            refused = self.refused_unlogged,
            "connection limit of the {scope} reached ({max} open): refusing connections (refused since the last report)"
        );
        self.refusal_logged = Some(now);
        self.refused_unlogged = 0;
    }
}

/// Register an accepted socket of a listener (`path`) as a connection on reactor `r`, with
/// its setup deadline: TLS handshake (on a TLS listener), ICReq and Connect must be done
/// `[transport] setup_timeout_ms` after this, or [`Conn::check_setup`] closes it.
pub fn add_connection(r: &mut Reactor, sock: TcpStream, shared: Arc<Shared>, started: Instant, path: Path) {
    let serial = NEXT_SERIAL.fetch_add(1, Relaxed);
    let me = r.id();
    let open = path.open.clone();
    let fail = |shared: &Shared, e: String| {
        shared.conns_per_reactor[me].fetch_sub(1, Relaxed);
        open.fetch_sub(1, Relaxed);
        warn!(reactor = me, error = %e, "cannot serve an accepted connection");
    };
    let rx_pool = r.local::<RxPool>().map(|p| p.clone());
    let conn = match tcp::accept(sock, shared.clone(), me, serial, started, path, rx_pool.as_ref()) {
        Ok(c) => c,
        Err(e) => return fail(&shared, e.to_string()),
    };
    let fd = conn.t.raw_fd();
    match r.add_sleepable_source(Box::new(conn), SourceOpts::socket(fd)) {
        Ok(id) => {
            Conn::arm_setup_deadline(r, id, serial, &shared);
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
        if self.paused {
            return Progress::IDLE;
        }
        let mut did = false;
        let mut accepted = 0;
        while accepted < ACCEPT_BATCH {
            match self.sock.accept() {
                Ok((sock, peer)) => {
                    did = true;
                    accepted += 1;
                    let (path, max) = {
                        let snap = self.shared.snapshot.load();
                        match self.addr.and_then(|a| snap.listener(a)) {
                            Some(l) => (
                                Path {
                                    addr: self.addr,
                                    tls: l.tls,
                                    ana: l.ana.clone(),
                                    open: self.open.clone(),
                                    placed: None,
                                },
                                l.max_connections,
                            ),
                            None => (
                                Path {
                                    addr: self.addr,
                                    open: self.open.clone(),
                                    ..Path::default()
                                },
                                None,
                            ),
                        }
                    };
                    if let Some((scope, max)) = self.over_limit(max) {
                        // Closed at once (dropped): the host sees the connection end before
                        // its ICReq is answered, and the target spends nothing more on it.
                        self.log_refusal(peer, scope, max);
                        continue;
                    }
                    if let Err(e) = sock.set_nonblocking(true).and_then(|_| sock.set_nodelay(true)) {
                        warn!(%peer, error = %e, "cannot configure an accepted socket");
                        continue;
                    }
                    // The listeners' reactor keeps the placement state (set at start; a
                    // reactor without it places round robin from its own state).
                    let (target, placed) = match r.local::<Placer>() {
                        Some(p) => p.place(self.placement, &self.shared, peer.ip()),
                        None => Placer::default().place(Placement::RoundRobin, &self.shared, peer.ip()),
                    };
                    self.open.fetch_add(1, Relaxed);
                    info!(%peer, reactor = target, "connection accepted");
                    let path = Path {
                        placed: placed.map(Arc::new),
                        ..path
                    };
                    let (shared, started) = (self.shared.clone(), self.started);
                    if target == r.id() {
                        add_connection(r, sock, shared, started, path);
                    } else {
                        let open = path.open.clone();
                        if !r.send(target, move |r| add_connection(r, sock, shared, started, path)) {
                            self.shared.conns_per_reactor[target].fetch_sub(1, Relaxed);
                            open.fetch_sub(1, Relaxed);
                        }
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    return Progress {
                        did_work: did,
                        next: Next::Idle,
                    };
                }
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
        // A full batch: more may be pending, which no new edge will report. Run again after
        // the other sources.
        Progress {
            did_work: true,
            next: Next::Asap,
        }
    }
}
