//! The control thread: accepts control-socket clients and metrics scrapes, samples the
//! reactors' accounting once a second, and stops (removing the socket file) when dropped.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

use super::rpc::{Ctx, INVALID_REQUEST, PARSE_ERROR, error_response};
use super::{ControlError, MAX_LINE};
use crate::Target;

/// How often blocked control threads look at the stop flag.
const TICK: Duration = Duration::from_millis(200);
/// Clients (socket and HTTP) served at once; more are refused.
pub const MAX_CLIENTS: usize = 64;
/// Largest HTTP request head accepted by the metrics endpoint.
const MAX_HTTP_HEAD: usize = 8 * 1024;

/// The endpoints of a `[control]` table, bound but not yet served: bind them before the
/// target starts, so a second pollux on the same socket fails early and clearly.
#[derive(Debug)]
pub struct Bound {
    socket: Option<(UnixListener, PathBuf)>,
    metrics: Option<TcpListener>,
}

/// Bind the Unix socket at `path` with mode 0600, removing a stale socket file first.
fn bind_socket(path: &Path) -> Result<UnixListener, ControlError> {
    let endpoint = |what: &str, source| ControlError::Endpoint {
        what: format!("{what} {}", path.display()),
        source,
    };
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => match UnixStream::connect(path) {
            Ok(_) => {
                return Err(ControlError::SocketInUse {
                    path: path.to_path_buf(),
                });
            }
            Err(_) => {
                info!(path = %path.display(), "removing the stale control socket");
                std::fs::remove_file(path).map_err(|e| endpoint("remove the stale control socket", e))?;
            }
        },
        Ok(_) => {
            return Err(ControlError::NotASocket {
                path: path.to_path_buf(),
            });
        }
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(endpoint("inspect the control socket path", e)),
    }
    // The socket is created 0600 (owner only) rather than chmod-ed after the fact, so no
    // other user can ever connect to it. The umask is process-wide: this runs before the
    // reactors start, and is restored at once.
    // SAFETY: umask has no memory-safety preconditions.
    let old = unsafe { libc::umask(0o177) };
    let bound = UnixListener::bind(path);
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    let l = bound.map_err(|e| endpoint("bind the control socket", e))?;
    // Belt and braces, should the umask have been raced.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| endpoint("set the mode of the control socket", e))?;
    l.set_nonblocking(true)
        .map_err(|e| endpoint("make non-blocking the control socket", e))?;
    Ok(l)
}

impl Bound {
    /// Bind the endpoints `c` asks for (none: nothing to serve).
    pub fn bind(c: &pollux_conf::Control) -> Result<Self, ControlError> {
        let socket = match &c.socket {
            Some(p) => match bind_socket(p) {
                Ok(l) => Some((l, p.clone())),
                // The conf named no socket: this target serves without one, saying why
                // (a second target on the machine, or a user who cannot write /run).
                Err(e) if c.socket_is_default => {
                    warn!(
                        "no control socket: {e}; `pollux ctl` reaches this target only through a [control] socket of its own (`socket = \"none\"` to say so)"
                    );
                    None
                }
                Err(e) => return Err(e),
            },
            None => None,
        };
        let metrics = match c.metrics {
            Some(a) => {
                let err = |source| ControlError::Endpoint {
                    what: format!("listen for metrics on {a}"),
                    source,
                };
                let l = TcpListener::bind(a).map_err(err)?;
                l.set_nonblocking(true).map_err(err)?;
                Some(l)
            }
            None => None,
        };
        Ok(Self { socket, metrics })
    }

    /// The endpoints a hot upgrade's old process handed over (`socket`, `metrics`); one the
    /// conf `c` names that did not come is bound here (a warning if it cannot be).
    pub fn inherited(
        socket: Option<(UnixListener, PathBuf)>,
        metrics: Option<TcpListener>,
        c: &pollux_conf::Control,
    ) -> Self {
        let fresh = if (socket.is_none() && c.socket.is_some()) || (metrics.is_none() && c.metrics.is_some()) {
            let only = pollux_conf::Control {
                socket: if socket.is_none() { c.socket.clone() } else { None },
                socket_is_default: c.socket_is_default,
                metrics: if metrics.is_none() { c.metrics } else { None },
            };
            match Self::bind(&only) {
                Ok(b) => b,
                Err(e) => {
                    warn!("control endpoints: {e}");
                    Self {
                        socket: None,
                        metrics: None,
                    }
                }
            }
        } else {
            Self {
                socket: None,
                metrics: None,
            }
        };
        Self {
            socket: socket.or(fresh.socket),
            metrics: metrics.or(fresh.metrics),
        }
    }

    /// Serve the endpoints for `target` (its conf's `[reactors]` table gives the adaptive
    /// policy settings) on a new control thread.
    pub fn serve(self, target: &Target, reactors: &pollux_conf::Reactors) -> Result<ControlServer, ControlError> {
        let ctx = Arc::new(Ctx::new(target, reactors));
        let stop = Arc::new(AtomicBool::new(false));
        let socket_path = self.socket.as_ref().map(|(_, p)| p.clone());
        // A hot upgrade hands these descriptors to the next process (they stay open while
        // the control thread lives, as long as the process).
        let _ = crate::upgrade::old::CONTROL_FDS.set(crate::upgrade::old::ControlFds {
            socket: self.socket.as_ref().map(|(l, p)| (p.clone(), l.as_raw_fd())),
            metrics: self.metrics.as_ref().map(|l| l.as_raw_fd()),
        });
        let metrics_addr = match &self.metrics {
            Some(l) => Some(l.local_addr().map_err(|source| ControlError::Endpoint {
                what: "read the metrics address".into(),
                source,
            })?),
            None => None,
        };
        let thread = if self.socket.is_some() || self.metrics.is_some() {
            let (c, s) = (ctx.clone(), stop.clone());
            Some(
                std::thread::Builder::new()
                    .name("control".into())
                    .spawn(move || control_loop(self, c, s))
                    .map_err(|source| ControlError::Endpoint {
                        what: "start the control thread".into(),
                        source,
                    })?,
            )
        } else {
            None
        };
        if let Some(p) = &socket_path {
            info!(path = %p.display(), "control socket (JSON-RPC 2.0, one request per line)");
        }
        if let Some(a) = metrics_addr {
            info!(address = %a, "metrics (Prometheus text, GET /metrics)");
        }
        Ok(ControlServer {
            ctx,
            stop,
            thread,
            socket_path,
            metrics_addr,
        })
    }
}

/// A hot upgrade's new process serves the endpoints its predecessor handed over with these.
impl crate::upgrade::new::TakeoverControl for Bound {
    type Server = ControlServer;
    type Error = ControlError;

    fn inherited(
        socket: Option<(UnixListener, PathBuf)>,
        metrics: Option<TcpListener>,
        c: &pollux_conf::Control,
    ) -> Self {
        Bound::inherited(socket, metrics, c)
    }

    fn serve(self, target: &Target, reactors: &pollux_conf::Reactors) -> Result<ControlServer, ControlError> {
        Bound::serve(self, target, reactors)
    }
}

/// The running control plane; dropping it stops it and removes the socket file.
#[derive(Debug)]
pub struct ControlServer {
    ctx: Arc<Ctx>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    socket_path: Option<PathBuf>,
    metrics_addr: Option<SocketAddr>,
}

impl ControlServer {
    /// Bind and serve `cfg`'s `[control]` endpoints for `target`.
    pub fn start(target: &Target, cfg: &pollux_conf::Config) -> Result<Self, ControlError> {
        Bound::bind(&cfg.control)?.serve(target, &cfg.reactors)
    }

    /// The control socket's path, if one is served.
    pub fn socket_path(&self) -> Option<&Path> {
        self.socket_path.as_deref()
    }

    /// The metrics endpoint's address (port resolved), if one is served.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// The methods, callable in-process.
    pub fn ctx(&self) -> &Arc<Ctx> {
        &self.ctx
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.stop.store(true, SeqCst);
        if let Some(t) = self.thread.take()
            && t.join().is_err()
        {
            warn!("control thread panicked");
        }
        if let Some(p) = &self.socket_path {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Wait up to [`TICK`] for either listener to be readable.
fn wait_readable(fds: &[i32]) {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // SAFETY: `pfds` is a valid array of `pfds.len()` initialised pollfd structs that lives
    // across the call.
    unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, TICK.as_millis() as i32) };
}

fn control_loop(b: Bound, ctx: Arc<Ctx>, stop: Arc<AtomicBool>) {
    let clients = Arc::new(AtomicUsize::new(0));
    let mut fds = Vec::new();
    if let Some((l, _)) = &b.socket {
        fds.push(l.as_raw_fd());
    }
    if let Some(l) = &b.metrics {
        fds.push(l.as_raw_fd());
    }
    let mut last_sample = Instant::now();
    while !stop.load(SeqCst) {
        wait_readable(&fds);
        if let Some((l, _)) = &b.socket {
            while let Ok((s, _)) = l.accept() {
                let c = ctx.clone();
                spawn_client(&clients, &stop, "control-client", move |stop| serve_client(s, &c, stop));
            }
        }
        if let Some(l) = &b.metrics {
            while let Ok((s, _)) = l.accept() {
                let c = ctx.clone();
                spawn_client(&clients, &stop, "control-http", move |_| serve_http(s, &c));
            }
        }
        if last_sample.elapsed() >= Duration::from_secs(1) {
            last_sample = Instant::now();
            ctx.sample();
        }
    }
    debug!("control thread stopped");
}

/// Run `f` on a client thread, unless [`MAX_CLIENTS`] are already being served.
fn spawn_client(
    clients: &Arc<AtomicUsize>,
    stop: &Arc<AtomicBool>,
    name: &str,
    f: impl FnOnce(&AtomicBool) + Send + 'static,
) {
    if clients.fetch_add(1, SeqCst) >= MAX_CLIENTS {
        clients.fetch_sub(1, SeqCst);
        warn!(limit = MAX_CLIENTS, "control: too many clients; connection refused");
        return;
    }
    let (c, s) = (clients.clone(), stop.clone());
    let spawned = std::thread::Builder::new().name(name.into()).spawn(move || {
        f(&s);
        c.fetch_sub(1, SeqCst);
    });
    if let Err(e) = spawned {
        clients.fetch_sub(1, SeqCst);
        warn!("control: cannot start a client thread: {e}");
    }
}

/// What reading the next request gave.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// A complete JSON value is in the buffer (its bytes, nothing around them).
    Request,
    /// Bytes that are no JSON value, up to the end of their line (dropped from the stream):
    /// the parse error to answer.
    Malformed(String),
    /// The peer closed (a partial request is dropped).
    Closed,
    /// The request exceeds [`MAX_LINE`] bytes; the rest was not read.
    TooLong,
    /// The server is stopping.
    Stopped,
}

/// The requests of one control client, as they arrive: each a JSON value, with or without
/// a newline after it. `pollux ctl` sends one per line; SPDK's Python client
/// (`spdk.rpc.client`) sends its requests pretty-printed over several lines with nothing
/// after them, and reads its replies as concatenated JSON values.
#[derive(Debug, Default)]
pub struct Requests {
    /// Received and not yet taken.
    pending: Vec<u8>,
}

impl Requests {
    /// The next request from `r` into `buf` (cleared first). `r`'s stream has a read
    /// timeout, so `stop` is looked at every [`TICK`].
    pub fn next(&mut self, r: &mut impl Read, buf: &mut Vec<u8>, stop: &AtomicBool) -> std::io::Result<Next> {
        buf.clear();
        let mut chunk = [0u8; 16 * 1024];
        loop {
            // Whitespace between requests (their newlines included) is no request.
            let ws = self.pending.iter().take_while(|b| b.is_ascii_whitespace()).count();
            self.pending.drain(..ws);
            if !self.pending.is_empty() {
                let mut values =
                    serde_json::Deserializer::from_slice(&self.pending).into_iter::<serde::de::IgnoredAny>();
                match values.next() {
                    Some(Ok(_)) => {
                        let end = values.byte_offset();
                        buf.extend(self.pending.drain(..end));
                        return Ok(Next::Request);
                    }
                    Some(Err(e)) if !e.is_eof() => {
                        // Not JSON: answered once its line is in, and the stream goes on at
                        // the next line, as a line-based client expects.
                        if let Some(i) = self.pending.iter().position(|&b| b == b'\n') {
                            self.pending.drain(..=i);
                            return Ok(Next::Malformed(format!("parse error: {e}")));
                        }
                        if self.pending.len() > MAX_LINE {
                            return Ok(Next::TooLong);
                        }
                    }
                    _ if self.pending.len() > MAX_LINE => return Ok(Next::TooLong),
                    _ => {}
                }
            }
            match r.read(&mut chunk) {
                Ok(0) => return Ok(Next::Closed),
                Ok(n) => self.pending.extend_from_slice(&chunk[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                    ) =>
                {
                    if stop.load(SeqCst) {
                        return Ok(Next::Stopped);
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }
}

fn serve_client(s: UnixStream, ctx: &Ctx, stop: &AtomicBool) {
    if s.set_nonblocking(false).is_err()
        || s.set_read_timeout(Some(TICK)).is_err()
        || s.set_write_timeout(Some(Duration::from_secs(5))).is_err()
    {
        return;
    }
    let Ok(mut w) = s.try_clone() else { return };
    let mut r = s;
    let mut requests = Requests::default();
    let mut buf = Vec::new();
    loop {
        let resp = match requests.next(&mut r, &mut buf, stop) {
            Ok(Next::Request) => ctx.handle_line(&buf),
            Ok(Next::Malformed(why)) => Some(error_response(&serde_json::Value::Null, PARSE_ERROR, &why)),
            Ok(Next::TooLong) => {
                let mut resp = error_response(
                    &serde_json::Value::Null,
                    INVALID_REQUEST,
                    &format!("request longer than {MAX_LINE} bytes; closing the connection"),
                );
                resp.push('\n');
                let _ = w.write_all(resp.as_bytes());
                let _ = w.shutdown(std::net::Shutdown::Both);
                return;
            }
            Ok(Next::Closed | Next::Stopped) | Err(_) => return,
        };
        if let Some(mut resp) = resp {
            resp.push('\n');
            let written = w.write_all(resp.as_bytes());
            if crate::upgrade::old::EXIT_AFTER_REPLY.load(SeqCst) {
                // An upgrade committed: the new process serves.
                crate::upgrade::old::exit_upgraded();
            }
            if written.is_err() {
                return;
            }
        }
    }
}

/// Headers accepted in a metrics request (more: 431). Scrapers send a handful.
const MAX_HTTP_HEADERS: usize = 64;
/// The type of the endpoint's own short answers.
const TEXT: &str = "text/plain";

/// Serve one HTTP/1.1 request on the metrics endpoint, then close.
fn serve_http(mut s: TcpStream, ctx: &Ctx) {
    if s.set_nonblocking(false).is_err()
        || s.set_read_timeout(Some(Duration::from_secs(2))).is_err()
        || s.set_write_timeout(Some(Duration::from_secs(5))).is_err()
    {
        return;
    }
    const TOO_LARGE: &str = "431 Request Header Fields Too Large";
    let mut head = Vec::new();
    let mut chunk = [0u8; 1024];
    // Write errors are the client's loss: it has gone or stopped reading.
    let _ = loop {
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&chunk[..n]),
        }
        let mut headers = [httparse::EMPTY_HEADER; MAX_HTTP_HEADERS];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&head) {
            Ok(httparse::Status::Complete(len)) if len <= MAX_HTTP_HEAD => {
                break match (req.method, req.path) {
                    (Some(method), Some(target)) => answer(&mut s, ctx, method, target),
                    // httparse fills both in a complete request: this arm only keeps an
                    // unwrap out.
                    _ => respond(&mut s, "400 Bad Request", TEXT, "", "bad request\n"),
                };
            }
            Ok(httparse::Status::Partial) if head.len() <= MAX_HTTP_HEAD => {}
            Ok(_) | Err(httparse::Error::TooManyHeaders) => {
                break respond(&mut s, TOO_LARGE, TEXT, "", "request too large\n");
            }
            Err(e) => {
                debug!("metrics: bad HTTP request: {e}");
                break respond(&mut s, "400 Bad Request", TEXT, "", &format!("bad request: {e}\n"));
            }
        }
    };
}

/// Answer a parsed request for `target` (path and query).
fn answer(s: &mut TcpStream, ctx: &Ctx, method: &str, target: &str) -> std::io::Result<()> {
    let path = target.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET" | "HEAD", "/metrics") => match ctx.metrics() {
            Ok(body) => {
                let body = if method == "GET" { body } else { String::new() };
                respond(s, "200 OK", super::metrics::CONTENT_TYPE, "", &body)
            }
            Err(e) => {
                warn!("metrics: cannot encode the metrics: {e}");
                respond(s, "500 Internal Server Error", TEXT, "", "cannot encode the metrics\n")
            }
        },
        ("GET" | "HEAD", _) => respond(s, "404 Not Found", TEXT, "", "not found: try /metrics\n"),
        _ => respond(s, "405 Method Not Allowed", TEXT, "Allow: GET, HEAD\r\n", "only GET\n"),
    }
}

/// Write a response (the connection closes when `s` is dropped); `extra` is more header
/// lines, each ending in CRLF.
fn respond(s: &mut TcpStream, status: &str, ctype: &str, extra: &str, body: &str) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n{extra}\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())?;
    s.write_all(body.as_bytes())?;
    s.flush()
}
