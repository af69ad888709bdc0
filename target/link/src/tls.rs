//! TLS 1.3 with a pre-shared key on an NVMe/TCP connection (NVMe/TCP 1.0 §3.6.1, TP 8011):
//! the handshake comes first, then ICReq/ICResp and every PDU travel inside TLS records.
//! The record layer is OpenSSL's (the `openssl` crate), driven by the connection's reactor
//! like the plain socket: non-blocking, one per connection, no thread of its own.
//!
//! External PSKs are OpenSSL's TLS 1.3 session callbacks (`SSL_CTX_set_psk_find_session_
//! callback` on the controller, `SSL_set_psk_use_session_callback` on the host), as SPDK's
//! posix sock does; the `openssl` crate only wraps the TLS 1.2 PSK callback, which cannot
//! use SHA-384. The key material is [`pollux_nvme::tls`]'s: the TLS PSK derived from the
//! configured PSK for the identity the host offers, with the cipher suite of its hash.
//!
//! Between OpenSSL and the socket sits [`Wire`]: records OpenSSL writes are gathered and
//! sent with one `send` per flush, not one per record; reads take what the socket has in
//! one `recv` and hand it to OpenSSL record by record. The data path copies once more than
//! plain TCP (the encryption itself), so read data is never sent in place on a TLS
//! connection. Kernel TLS (kTLS) would let the kernel encrypt and keep that path; it needs
//! the `tls` upper-layer protocol, which this machine's kernel lacks
//! (`/proc/sys/net/ipv4/tcp_available_ulp` lists only `mptcp`).

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::ptr;
use std::sync::{Arc, OnceLock};

use foreign_types_shared::ForeignTypeRef;
use libc::{c_int, c_uchar, size_t};
use openssl::error::ErrorStack;
use openssl::ex_data::Index;
use openssl::ssl::{
    ClientHelloResponse, ErrorCode, Ssl, SslContext, SslContextBuilder, SslMethod, SslMode, SslOptions, SslRef,
    SslStream, SslVerifyMode, SslVersion,
};
use openssl_sys as ffi;
use pollux_nvme::tcp::{Recv, RxBuf};
use pollux_nvme::tls::{PskHash, PskIdentity, TlsPsk};

use crate::sendq::SendQueue;

/// TLS 1.3's version number (RFC 8446 §4.2.1).
const TLS1_3_VERSION: c_int = 0x0304;
/// Bytes of records gathered before `Wire` refuses more (the socket is not taking them).
const WIRE_HIGH: usize = 4 << 20;
/// Socket bytes read at once for OpenSSL.
const WIRE_READ: usize = 64 * 1024;

/// The session callback types of OpenSSL 1.1.1+ (`ssl.h`).
type FindSessionCb = unsafe extern "C" fn(
    ssl: *mut ffi::SSL,
    id: *const c_uchar,
    len: size_t,
    sess: *mut *mut ffi::SSL_SESSION,
) -> c_int;
type UseSessionCb = unsafe extern "C" fn(
    ssl: *mut ffi::SSL,
    md: *const ffi::EVP_MD,
    id: *mut *const c_uchar,
    len: *mut size_t,
    sess: *mut *mut ffi::SSL_SESSION,
) -> c_int;

// OpenSSL 1.1.1+ functions that openssl-sys does not declare; libssl is linked by it.
unsafe extern "C" {
    fn SSL_CTX_set_psk_find_session_callback(ctx: *mut ffi::SSL_CTX, cb: Option<FindSessionCb>);
    fn SSL_set_psk_use_session_callback(ssl: *mut ffi::SSL, cb: Option<UseSessionCb>);
    fn SSL_SESSION_new() -> *mut ffi::SSL_SESSION;
    fn SSL_SESSION_set1_master_key(sess: *mut ffi::SSL_SESSION, key: *const c_uchar, len: size_t) -> c_int;
    fn SSL_SESSION_set_cipher(sess: *mut ffi::SSL_SESSION, cipher: *const ffi::SSL_CIPHER) -> c_int;
    fn SSL_SESSION_set_protocol_version(sess: *mut ffi::SSL_SESSION, version: c_int) -> c_int;
    fn SSL_CIPHER_find(ssl: *mut ffi::SSL, ptr: *const c_uchar) -> *const ffi::SSL_CIPHER;
    fn EVP_MD_get_size(md: *const ffi::EVP_MD) -> c_int;
}

/// Finds the TLS PSK a controller holds for an offered identity (None: unknown). The
/// identity is checked here against the PSK's own, digest and hash included.
pub type PskLookup = dyn Fn(&PskIdentity) -> Option<TlsPsk> + Send + Sync;

/// A controller connection's PSK state, in its `Ssl`'s ex data.
struct ServerPsk {
    lookup: Arc<PskLookup>,
    /// The identity the handshake's PSK belongs to.
    matched: Option<PskIdentity>,
    /// The identity offered when none matched (for the log).
    refused: Option<String>,
}

/// A host connection's PSK, in its `Ssl`'s ex data.
struct ClientPsk(TlsPsk);

fn server_index() -> Result<Index<Ssl, ServerPsk>, ErrorStack> {
    static I: OnceLock<Index<Ssl, ServerPsk>> = OnceLock::new();
    if let Some(i) = I.get() {
        return Ok(*i);
    }
    let i = Ssl::new_ex_index()?;
    Ok(*I.get_or_init(|| i))
}

fn client_index() -> Result<Index<Ssl, ClientPsk>, ErrorStack> {
    static I: OnceLock<Index<Ssl, ClientPsk>> = OnceLock::new();
    if let Some(i) = I.get() {
        return Ok(*i);
    }
    let i = Ssl::new_ex_index()?;
    Ok(*I.get_or_init(|| i))
}

/// The cipher suites NVMe/TCP uses (NVMe/TCP 1.0 §3.6.1.3), by PSK hash.
fn suite(hash: PskHash) -> (&'static str, [u8; 2]) {
    match hash {
        PskHash::Sha256 => ("TLS_AES_128_GCM_SHA256", [0x13, 0x01]),
        PskHash::Sha384 => ("TLS_AES_256_GCM_SHA384", [0x13, 0x02]),
    }
}

/// A TLS 1.3 session resuming nothing: the external PSK `psk` with its cipher suite.
///
/// # Safety
/// `ssl` must be a live `SSL` (the callback's).
unsafe fn psk_session(ssl: *mut ffi::SSL, psk: &TlsPsk) -> *mut ffi::SSL_SESSION {
    let (_, id) = suite(psk.hash);
    // SAFETY: `ssl` is live (the caller's contract); `id` is the two bytes SSL_CIPHER_find
    // reads. A new session is owned here until returned, freed on failure.
    unsafe {
        let cipher = SSL_CIPHER_find(ssl, id.as_ptr());
        if cipher.is_null() {
            return ptr::null_mut();
        }
        let s = SSL_SESSION_new();
        if s.is_null() {
            return s;
        }
        if SSL_SESSION_set1_master_key(s, psk.psk.as_ptr(), psk.psk.len()) != 1
            || SSL_SESSION_set_cipher(s, cipher) != 1
            || SSL_SESSION_set_protocol_version(s, TLS1_3_VERSION) != 1
        {
            ffi::SSL_SESSION_free(s);
            return ptr::null_mut();
        }
        s
    }
}

/// The controller's lookup of an offered identity (OpenSSL's find-session callback).
/// Returns 1 with no session for an unknown identity: the handshake then needs a
/// certificate, which a controller serving PSKs only does not have, and fails.
unsafe extern "C" fn find_session(
    ssl: *mut ffi::SSL,
    id: *const c_uchar,
    len: size_t,
    sess: *mut *mut ffi::SSL_SESSION,
) -> c_int {
    // SAFETY: OpenSSL calls this with a live SSL, `len` bytes of identity at `id` and a
    // session pointer to set, during a handshake this thread drives.
    unsafe {
        *sess = ptr::null_mut();
        let Ok(idx) = server_index() else { return 0 };
        let ssl_ref = SslRef::from_ptr_mut(ssl);
        let Some(state) = ssl_ref.ex_data_mut(idx) else {
            return 0;
        };
        let offered = if id.is_null() {
            &[][..]
        } else {
            std::slice::from_raw_parts(id, len)
        };
        let found = PskIdentity::parse(offered).and_then(|pid| {
            let psk = (state.lookup)(&pid)?;
            (psk.hash == pid.hash && psk.identity.as_bytes() == offered).then_some((pid, psk))
        });
        match found {
            Some((pid, psk)) => {
                let s = psk_session(ssl, &psk);
                if s.is_null() {
                    return 0;
                }
                *sess = s;
                state.matched = Some(pid);
            }
            None => state.refused = Some(String::from_utf8_lossy(offered).into_owned()),
        }
        1
    }
}

/// The host's PSK for its ClientHello (OpenSSL's use-session callback). With `md` set
/// (after a HelloRetryRequest) only a PSK of that hash may be offered.
unsafe extern "C" fn use_session(
    ssl: *mut ffi::SSL,
    md: *const ffi::EVP_MD,
    id: *mut *const c_uchar,
    len: *mut size_t,
    sess: *mut *mut ffi::SSL_SESSION,
) -> c_int {
    // SAFETY: OpenSSL calls this with a live SSL and out-pointers to set, during a handshake
    // this thread drives. The identity bytes live in the SSL's ex data, as long as the SSL.
    unsafe {
        *sess = ptr::null_mut();
        let Ok(idx) = client_index() else { return 0 };
        let ssl_ref = SslRef::from_ptr_mut(ssl);
        let Some(ClientPsk(psk)) = ssl_ref.ex_data(idx) else {
            return 0;
        };
        if !md.is_null() && EVP_MD_get_size(md) as usize != psk.hash.output_len() {
            return 1;
        }
        let s = psk_session(ssl, psk);
        if s.is_null() {
            return 0;
        }
        *id = psk.identity.as_ptr();
        *len = psk.identity.len();
        *sess = s;
        1
    }
}

/// What TLS 1.3 with PSKs needs on either side: TLS 1.3 only, no tickets (a session is
/// never resumed), records written in part and from a buffer that may move between tries.
fn base_context(method: SslMethod, suites: &str) -> Result<SslContextBuilder, ErrorStack> {
    let mut b = SslContextBuilder::new(method)?;
    b.set_min_proto_version(Some(SslVersion::TLS1_3))?;
    b.set_max_proto_version(Some(SslVersion::TLS1_3))?;
    b.set_ciphersuites(suites)?;
    b.set_options(SslOptions::NO_TICKET);
    b.set_num_tickets(0)?;
    b.set_mode(SslMode::ENABLE_PARTIAL_WRITE | SslMode::ACCEPT_MOVING_WRITE_BUFFER);
    Ok(b)
}

/// The identities of a ClientHello's pre_shared_key extension (RFC 8446 §4.2.11:
/// `identities<7..2^16-1>` of `opaque identity<1..2^16-1>; uint32 age`), as far as they
/// are well formed.
fn offered_identities(ext: &[u8]) -> Vec<&[u8]> {
    let mut ids = Vec::new();
    let Some(total) = ext.get(..2).map(|b| usize::from(u16::from_be_bytes([b[0], b[1]]))) else {
        return ids;
    };
    let mut list = ext.get(2..2 + total).unwrap_or_default();
    while let Some(b) = list.get(..2) {
        let n = usize::from(u16::from_be_bytes([b[0], b[1]]));
        let (Some(id), Some(rest)) = (list.get(2..2 + n), list.get(2 + n + 4..)) else {
            break;
        };
        ids.push(id);
        list = rest;
    }
    ids
}

/// Before the cipher suite is chosen: keep only the suite of the hash the first NVMe
/// identity offered names. OpenSSL picks the suite first and then skips a PSK whose hash
/// differs from it, so a client that prefers TLS_AES_256_GCM_SHA384 (OpenSSL's default
/// order) would otherwise lose its SHA-256 PSK and fall back to a certificate handshake.
fn choose_suite(ssl: &mut SslRef) {
    const PRE_SHARED_KEY: libc::c_uint = 41;
    let mut out: *const c_uchar = ptr::null();
    let mut len: size_t = 0;
    // SAFETY: `ssl` is in its ClientHello callback, where the extensions may be read; OpenSSL
    // sets `out` and `len` to bytes it owns for the rest of the callback.
    let present = unsafe { ffi::SSL_client_hello_get0_ext(ssl.as_ptr(), PRE_SHARED_KEY, &mut out, &mut len) } == 1;
    if !present || out.is_null() {
        return;
    }
    // SAFETY: as above: `len` bytes at `out`, valid while `ssl` is borrowed here.
    let ext = unsafe { std::slice::from_raw_parts(out, len) };
    if let Some(hash) = offered_identities(ext)
        .into_iter()
        .find_map(|id| PskIdentity::parse(id).map(|p| p.hash))
    {
        let _ = ssl.set_ciphersuites(suite(hash).0);
    }
}

fn server_context() -> Result<&'static SslContext, TlsError> {
    static C: OnceLock<Result<SslContext, ErrorStack>> = OnceLock::new();
    C.get_or_init(|| {
        let mut b = base_context(SslMethod::tls_server(), "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384")?;
        b.set_client_hello_callback(|ssl, _alert| {
            choose_suite(ssl);
            Ok(ClientHelloResponse::SUCCESS)
        });
        // SAFETY: the builder's SSL_CTX is live; the callback is a plain function that only
        // touches what OpenSSL hands it.
        unsafe { SSL_CTX_set_psk_find_session_callback(b.as_ptr(), Some(find_session)) };
        Ok(b.build())
    })
    .as_ref()
    .map_err(|e| TlsError::Setup(e.clone()))
}

/// The socket under OpenSSL: reads in large pieces, writes gathered until [`Wire::send`].
struct Wire {
    sock: Arc<TcpStream>,
    rbuf: Box<[u8]>,
    rpos: usize,
    rend: usize,
    /// A read since the last [`Wire::rearm`] found the socket empty: reading it again
    /// before the next readiness edge would only return EAGAIN (a system call for nothing,
    /// once per poll of a busy-polling reactor).
    empty: bool,
    /// Records OpenSSL wrote, sent by the plain path's queue (owned bytes only).
    records: SendQueue,
}

impl Wire {
    fn new(sock: Arc<TcpStream>) -> Self {
        Self {
            sock,
            rbuf: vec![0; WIRE_READ].into_boxed_slice(),
            rpos: 0,
            rend: 0,
            empty: false,
            records: SendQueue::with_capacity(64 * 1024),
        }
    }

    /// Records still to send.
    fn pending(&self) -> usize {
        self.records.pending()
    }

    /// Send gathered records, as many as the socket takes.
    fn send(&mut self) -> io::Result<()> {
        self.records.flush(self.sock.as_raw_fd())
    }

    /// A new readiness edge (or a caller that polls): the socket may be read again.
    fn rearm(&mut self) {
        self.empty = false;
    }
}

impl Read for Wire {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if self.rpos == self.rend {
            if self.empty {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            let n = match (&*self.sock).read(&mut self.rbuf) {
                Ok(n) => n,
                Err(e) => {
                    self.empty = e.kind() == io::ErrorKind::WouldBlock;
                    return Err(e);
                }
            };
            self.empty = n < self.rbuf.len();
            self.rpos = 0;
            self.rend = n;
            if n == 0 {
                return Ok(0);
            }
        }
        let n = out.len().min(self.rend - self.rpos);
        out[..n].copy_from_slice(&self.rbuf[self.rpos..self.rpos + n]);
        self.rpos += n;
        Ok(n)
    }
}

impl Write for Wire {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        if self.pending() >= WIRE_HIGH {
            self.send()?;
            if self.pending() >= WIRE_HIGH {
                return Err(io::ErrorKind::WouldBlock.into());
            }
        }
        self.records.extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// How a TLS operation stopped short.
fn would_block(e: &openssl::ssl::Error) -> bool {
    matches!(e.code(), ErrorCode::WANT_READ | ErrorCode::WANT_WRITE)
}

/// An OpenSSL error for the log (reasons only: never key material).
fn describe(e: &openssl::ssl::Error) -> String {
    if let Some(s) = e.ssl_error() {
        let reasons: Vec<String> = s
            .errors()
            .iter()
            .map(|x| x.reason().unwrap_or("unknown").to_string())
            .collect();
        if !reasons.is_empty() {
            return reasons.join(", ");
        }
    }
    match e.io_error() {
        Some(io) => io.to_string(),
        None if e.code() == ErrorCode::SYSCALL || e.code() == ErrorCode::ZERO_RETURN => {
            "the peer closed the connection".into()
        }
        None => e.to_string(),
    }
}

/// Why a TLS session could not be set up or its handshake failed.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// OpenSSL could not make the context or session.
    #[error("{0}")]
    Setup(#[from] ErrorStack),
    /// Writing handshake records to the socket failed.
    #[error("write: {0}")]
    Write(#[source] io::Error),
    /// The controller found no PSK for the identity the host offered (NVMe/TCP 1.0 §3.6.1.3).
    #[error("no PSK for identity {identity:?} ({why})")]
    NoPsk {
        /// The identity offered.
        identity: String,
        /// OpenSSL's reasons.
        why: String,
    },
    /// The handshake failed otherwise: OpenSSL's reasons, or the socket's.
    #[error("{why}")]
    Handshake {
        /// OpenSSL's reasons.
        why: String,
    },
}

/// One connection's TLS session.
pub struct TlsLink {
    s: SslStream<Wire>,
    server: bool,
    /// The handshake finished.
    pub open: bool,
}

impl std::fmt::Debug for TlsLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsLink")
            .field("server", &self.server)
            .field("open", &self.open)
            .finish_non_exhaustive()
    }
}

impl TlsLink {
    /// The controller's side of a connection whose host began a TLS handshake; `lookup`
    /// finds the PSK of an offered identity.
    pub fn accept(sock: Arc<TcpStream>, lookup: Arc<PskLookup>) -> Result<Self, TlsError> {
        let ctx = server_context()?;
        let mut ssl = Ssl::new(ctx)?;
        ssl.set_ex_data(
            server_index()?,
            ServerPsk {
                lookup,
                matched: None,
                refused: None,
            },
        );
        let s = SslStream::new(ssl, Wire::new(sock))?;
        Ok(Self {
            s,
            server: true,
            open: false,
        })
    }

    /// The host's side, offering `psk` (its identity and key).
    pub fn connect(sock: Arc<TcpStream>, psk: TlsPsk) -> Result<Self, TlsError> {
        let (name, _) = suite(psk.hash);
        let mut b = base_context(SslMethod::tls_client(), name)?;
        // No certificate to verify: the PSK authenticates both ends.
        b.set_verify(SslVerifyMode::NONE);
        let ctx = b.build();
        let mut ssl = Ssl::new(&ctx)?;
        ssl.set_ex_data(client_index()?, ClientPsk(psk));
        // SAFETY: `ssl` is live; the callback is a plain function reading the ex data set
        // above, which lives as long as the SSL.
        unsafe { SSL_set_psk_use_session_callback(ssl.as_ptr(), Some(use_session)) };
        let s = SslStream::new(ssl, Wire::new(sock))?;
        Ok(Self {
            s,
            server: false,
            open: false,
        })
    }

    /// Drive the handshake as far as the socket allows: Ok(true) once it is done. An Err
    /// says why it failed, for the log.
    pub fn handshake(&mut self) -> Result<bool, TlsError> {
        self.s.get_mut().rearm();
        let r = if self.server { self.s.accept() } else { self.s.connect() };
        // Alerts and handshake records go out whatever the outcome.
        let sent = self.s.get_mut().send();
        match r {
            Ok(()) => {
                sent.map_err(TlsError::Write)?;
                self.open = true;
                Ok(true)
            }
            Err(e) if would_block(&e) => sent.map(|()| false).map_err(TlsError::Write),
            Err(e) => {
                let why = describe(&e);
                Err(match self.refused_identity() {
                    Some(identity) => TlsError::NoPsk { identity, why },
                    None => TlsError::Handshake { why },
                })
            }
        }
    }

    fn refused_identity(&self) -> Option<String> {
        let idx = server_index().ok()?;
        self.s.ssl().ex_data(idx)?.refused.clone()
    }

    /// The identity whose PSK the controller's finished handshake used (one found for an
    /// offer whose binder then failed does not count).
    pub fn identity(&self) -> Option<&PskIdentity> {
        if !self.open {
            return None;
        }
        let idx = server_index().ok()?;
        self.s.ssl().ex_data(idx)?.matched.as_ref()
    }

    /// The negotiated cipher suite's name.
    pub fn cipher(&self) -> &str {
        self.s.ssl().current_cipher().map_or("none", |c| c.name())
    }

    /// Decrypted bytes into the room of `rx`, until it is full or the socket is empty.
    /// `drained` in the result means nothing more is buffered anywhere: the next bytes
    /// raise a readiness edge.
    pub fn recv(&mut self, rx: &mut RxBuf) -> io::Result<Recv> {
        self.s.get_mut().rearm();
        let mut got = 0usize;
        loop {
            // Nothing more can come without new socket bytes: stop before OpenSSL's
            // WANT_READ (an error value built and dropped per poll).
            if got > 0 && self.nothing_buffered() {
                return Ok(self.data(got));
            }
            let r = rx.recv_with(|room| match self.s.ssl_read(room) {
                Ok(n) => Ok(n),
                Err(e) if e.code() == ErrorCode::ZERO_RETURN => Ok(0),
                Err(e) if would_block(&e) => Err(io::ErrorKind::WouldBlock.into()),
                // The peer closed without close_notify.
                Err(e) if e.code() == ErrorCode::SYSCALL && e.io_error().is_none() => Ok(0),
                Err(e) => Err(e
                    .into_io_error()
                    .unwrap_or_else(|e| io::Error::other(format!("TLS: {}", describe(&e))))),
            });
            match r? {
                Recv::Data { buffered, .. } => got += buffered,
                Recv::Eof if got == 0 => return Ok(Recv::Eof),
                // EOF after data: the data first; the next call reports the end.
                Recv::Eof => return Ok(self.data(got)),
                Recv::Empty if got == 0 => return Ok(Recv::Empty),
                Recv::Empty => return Ok(self.data(got)),
                Recv::Full if got == 0 => return Ok(Recv::Full),
                Recv::Full => {
                    return Ok(Recv::Data {
                        buffered: got,
                        placed: 0,
                        drained: false,
                    });
                }
            }
        }
    }

    fn data(&self, got: usize) -> Recv {
        Recv::Data {
            buffered: got,
            placed: 0,
            drained: self.nothing_buffered(),
        }
    }

    /// The socket was found empty and no record bytes wait in [`Wire`] or plaintext in
    /// OpenSSL (which, without read-ahead, holds no complete record beyond the one it
    /// returns data of).
    fn nothing_buffered(&self) -> bool {
        let w = self.s.get_ref();
        w.empty && w.rpos == w.rend && self.s.ssl().pending() == 0
    }

    /// Encrypt what `q` holds (owned bytes only: see the module) and send the records, as
    /// many as the socket takes.
    pub fn send(&mut self, q: &mut SendQueue) -> io::Result<()> {
        let s = &mut self.s;
        let r = q.flush_owned_with(|b| match s.ssl_write(b) {
            Ok(n) => Ok(n),
            Err(e) if would_block(&e) => Err(io::ErrorKind::WouldBlock.into()),
            Err(e) => Err(e
                .into_io_error()
                .unwrap_or_else(|e| io::Error::other(format!("TLS: {}", describe(&e))))),
        });
        self.s.get_mut().send()?;
        r
    }

    /// Encrypted bytes waiting for the socket.
    pub fn pending(&self) -> usize {
        self.s.get_ref().pending()
    }

    /// Send close_notify (best effort).
    pub fn close(&mut self) {
        let _ = self.s.shutdown();
        let _ = self.s.get_mut().send();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::net::TcpListener;
    use std::time::{Duration, Instant};

    use pollux_nvme::tls::ConfiguredPsk;

    use super::*;

    const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:host";
    const SUB: &str = "nqn.2026-11.io.pollux:tls";

    fn psk(hash: PskHash) -> ConfiguredPsk {
        ConfiguredPsk::new(Some(hash), &vec![7u8; hash.output_len()]).unwrap()
    }

    fn pair() -> (Arc<TcpStream>, Arc<TcpStream>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        for x in [&c, &s] {
            x.set_nonblocking(true).unwrap();
        }
        (Arc::new(c), Arc::new(s))
    }

    /// Handshake both ends in turn until both finish or one fails.
    fn handshake(c: &mut TlsLink, s: &mut TlsLink) -> Result<(), String> {
        let until = Instant::now() + Duration::from_secs(10);
        while !(c.open && s.open) {
            assert!(Instant::now() < until, "handshake stalled");
            if !c.open {
                c.handshake().map_err(|e| format!("host: {e}"))?;
            }
            if !s.open {
                s.handshake().map_err(|e| format!("controller: {e}"))?;
            }
        }
        Ok(())
    }

    /// `n` bytes from `from` to `to` through their send queue and receive buffer.
    fn carry(from: &mut TlsLink, to: &mut TlsLink, n: usize) -> Vec<u8> {
        let data: Vec<u8> = (0..n).map(|i| (i * 7 % 251) as u8).collect();
        let mut q = SendQueue::with_capacity(n);
        q.extend_from_slice(&data);
        let mut rx = RxBuf::new(n + 1024);
        let until = Instant::now() + Duration::from_secs(10);
        while rx.avail().len() < n {
            assert!(Instant::now() < until, "transfer stalled at {}", rx.avail().len());
            from.send(&mut q).unwrap();
            match to.recv(&mut rx).unwrap() {
                Recv::Eof => panic!("EOF"),
                _ => rx.make_room(0),
            }
        }
        assert_eq!(q.pending() + from.pending(), 0);
        assert_eq!(rx.avail(), &data[..]);
        data
    }

    fn lookup_of(key: ConfiguredPsk) -> Arc<PskLookup> {
        Arc::new(move |id: &PskIdentity| key.tls_psk(&id.hostnqn, &id.subnqn, id.version))
    }

    #[test]
    fn both_hashes_and_identity_versions_handshake_and_carry_data() {
        for (hash, version, suite) in [
            (PskHash::Sha256, 0, "TLS_AES_128_GCM_SHA256"),
            (PskHash::Sha256, 1, "TLS_AES_128_GCM_SHA256"),
            (PskHash::Sha384, 1, "TLS_AES_256_GCM_SHA384"),
        ] {
            let key = psk(hash);
            let (cs, ss) = pair();
            let mut c = TlsLink::connect(cs, key.tls_psk(HOST, SUB, version).unwrap()).unwrap();
            let mut s = TlsLink::accept(ss, lookup_of(key)).unwrap();
            handshake(&mut c, &mut s).unwrap();
            assert_eq!(s.cipher(), suite);
            let id = s.identity().unwrap();
            assert_eq!((&*id.hostnqn, &*id.subnqn, id.version), (HOST, SUB, version));
            // Larger than a record and than Wire's read: many records, partial reads.
            carry(&mut c, &mut s, 300_000);
            carry(&mut s, &mut c, 200_000);
            s.close();
            let mut rx = RxBuf::new(4096);
            let until = Instant::now() + Duration::from_secs(5);
            while !matches!(c.recv(&mut rx).unwrap(), Recv::Eof) {
                assert!(Instant::now() < until);
            }
        }
    }

    #[test]
    fn a_wrong_psk_or_an_unknown_identity_fails_the_handshake() {
        // The host holds another key for the same identity: the binder does not verify.
        let (cs, ss) = pair();
        let mut other = vec![7u8; 32];
        other[0] = 8;
        let wrong = ConfiguredPsk::new(Some(PskHash::Sha256), &other).unwrap();
        let mut c = TlsLink::connect(cs, wrong.tls_psk(HOST, SUB, 0).unwrap()).unwrap();
        let mut s = TlsLink::accept(ss, lookup_of(psk(PskHash::Sha256))).unwrap();
        let e = handshake(&mut c, &mut s).unwrap_err();
        assert!(e.starts_with("controller"), "{e}");
        assert!(s.identity().is_none());

        // An identity the controller has no key for.
        let (cs, ss) = pair();
        let key = psk(PskHash::Sha256);
        let mut c = TlsLink::connect(cs, key.tls_psk(HOST, SUB, 0).unwrap()).unwrap();
        let none: Arc<PskLookup> = Arc::new(|_: &PskIdentity| None);
        let mut s = TlsLink::accept(ss, none).unwrap();
        let e = handshake(&mut c, &mut s).unwrap_err();
        assert!(e.contains("no PSK for identity \"NVMe0R01 "), "{e}");

        // A version-1 identity whose digest is not the one the controller derives.
        let (cs, ss) = pair();
        let mut t = key.tls_psk(HOST, SUB, 1).unwrap();
        t.identity = format!("NVMe1R01 {HOST} {SUB} AAAA");
        let mut c = TlsLink::connect(cs, t).unwrap();
        let mut s = TlsLink::accept(ss, lookup_of(key)).unwrap();
        assert!(handshake(&mut c, &mut s).is_err());
        assert!(s.identity().is_none());
    }

    #[test]
    fn offered_identities_are_read_as_far_as_they_are_well_formed() {
        // Two identities (each: u16 length, bytes, u32 age) in a u16-length list.
        let mut ext = vec![0, 0];
        for id in [&b"NVMe0R01 a b"[..], b"x"] {
            ext.extend_from_slice(&(id.len() as u16).to_be_bytes());
            ext.extend_from_slice(id);
            ext.extend_from_slice(&[0; 4]);
        }
        let n = (ext.len() - 2) as u16;
        ext[..2].copy_from_slice(&n.to_be_bytes());
        assert_eq!(offered_identities(&ext), vec![&b"NVMe0R01 a b"[..], b"x"]);
        // Truncated anywhere: what is whole, never a panic.
        for cut in 0..ext.len() {
            assert!(offered_identities(&ext[..cut]).len() <= 2);
        }
        assert!(offered_identities(&[0xFF, 0xFF, 0, 9, 1]).is_empty());
    }
}
