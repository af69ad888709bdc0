//! `pollux perf --floor CORE`: the platform's own loopback round trip and throughput over
//! TCP, without NVMe/TCP.
//!
//! A thread pinned to CORE (where a benchmark pins the target's reactor) answers each request
//! with the bytes pollux would return for the same command, and the client sends exactly the
//! bytes a host would: for a read, a 72-byte command capsule (8-byte common header + 64-byte
//! SQE, NVMe/TCP 1.0 §3.6.2.4) answered by a 24-byte C2HData header and the data; for a write,
//! the capsule with the data in it answered by a 24-byte response capsule (8 + 16-byte CQE).
//! Both sides busy-poll non-blocking sockets with TCP_NODELAY, as pollux's poll-mode reactor
//! and client do, and do nothing else: no parsing, no namespace. At a queue depth above 1 the
//! client keeps that many requests in flight and the server answers every complete request
//! that one read brought with one `writev`, reading again once epoll reports new input, as
//! pollux's reactor batches and waits (see `serve`).
//!
//! Without `--span` the data is one cache-hot buffer. With `--span` the server reads (or
//! writes) each block at a random place in a memory region of that size, as a RAM namespace
//! does: the floor then includes the DRAM traffic that pollux's target pays too.
//!
//! On a shared VM the loopback itself drifts by tens of percent from minute to minute, so an
//! absolute figure says little on its own; run next to pollux's run of the same job, this one
//! tells how much of the latency is pollux (its p50 minus the floor's) and what fraction of the
//! platform's throughput pollux reaches.

use std::collections::VecDeque;
use std::io::{ErrorKind, IoSlice, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::Instant;

use hdrhistogram::Histogram;
use pollux_reactor::sys;
use rand::SeedableRng;
use rand::distr::{Distribution, Uniform};
use rand::rngs::Xoshiro256PlusPlus;

use super::report::{LatencySummary, PerfReport};
use super::{Access, PerfError, PerfOpts};

/// A command capsule: common header + SQE.
const CAPSULE_CMD: usize = 8 + 64;
/// A C2HData PDU header.
const C2H_HDR: usize = 24;
/// A response capsule: common header + CQE.
const CAPSULE_RESP: usize = 8 + 16;

/// Request and response sizes of one command of `opts`.
fn sizes(opts: &PerfOpts) -> Result<(usize, usize), PerfError> {
    let bad = |s: &str| Err(PerfError::Options(format!("--floor: {s}")));
    if opts.queue_depth == 0 {
        return bad("a queue depth of at least 1");
    }
    if opts.cores.len() != 1 || opts.conns_per_core != 1 {
        return bad("one client core and one connection");
    }
    if opts.digests.hdgst || opts.digests.ddgst || opts.verify || opts.rate.is_some() || opts.blocking {
        return bad("no digests, --verify, --rate or --blocking");
    }
    let io = opts.io_size as usize;
    if let Some(span) = opts.span
        && span < io as u64
    {
        return bad("--span smaller than one I/O");
    }
    match (opts.workload.access, opts.workload.read_pct) {
        (Access::Idle, _) => bad("an idle workload has no round trips"),
        (_, 100) => Ok((CAPSULE_CMD, C2H_HDR + io)),
        (_, 0) => Ok((CAPSULE_CMD + io, CAPSULE_RESP)),
        _ => bad("reads or writes, not a mix"),
    }
}

/// Writes all of `buf` to a non-blocking socket, spinning while its send buffer is full.
fn write_spin(s: &mut TcpStream, buf: &[u8]) -> std::io::Result<()> {
    writev_spin(s, &mut [IoSlice::new(buf)])
}

/// Writes all of `bufs` with `writev`, spinning while the send buffer is full.
fn writev_spin(s: &mut TcpStream, mut bufs: &mut [IoSlice<'_>]) -> std::io::Result<()> {
    while !bufs.is_empty() {
        match s.write_vectored(bufs) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut bufs, n),
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn io_err(what: &str) -> impl Fn(std::io::Error) -> PerfError + '_ {
    move |e| PerfError::Thread(format!("floor {what}: {e}"))
}

/// The blocks a floor server reads or writes: one hot buffer, or a region with a random
/// block per request (xoshiro256++, cheap per draw; the floor needs no reproducible sequence,
/// so any fixed seed does).
struct Blocks {
    mem: Vec<u8>,
    io: usize,
    rng: Xoshiro256PlusPlus,
    /// A random block of `mem`.
    block: Uniform<usize>,
}

impl Blocks {
    fn new(io: usize, span: Option<u64>) -> std::io::Result<Self> {
        let len = span.map_or(io, |s| (s as usize / io).max(1) * io);
        let mut mem = Vec::with_capacity(len);
        // Transparent huge pages, as pollux's RAM namespace asks for (`ram.rs`): with THP in
        // "madvise" mode a plain allocation gets 4 KiB pages, and a random block then costs a
        // TLB miss that the namespace does not pay. Advice only: failure changes nothing.
        let (base, page) = (mem.as_mut_ptr() as usize, 4096);
        let start = base.div_ceil(page) * page;
        let end = (base + len) / page * page;
        if end > start {
            // SAFETY: [start, end) is page aligned and inside the vector's allocation, which
            // nothing has touched yet; MADV_HUGEPAGE only changes how its pages are backed.
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
        }
        // Non-zero bytes: every page is written now, not faulted in during the run.
        mem.resize(len, 0x5a);
        let block = Uniform::new(0, len / io).map_err(std::io::Error::other)?;
        Ok(Self {
            mem,
            io,
            rng: Xoshiro256PlusPlus::seed_from_u64(0x9e37_79b9_7f4a_7c15),
            block,
        })
    }

    fn next_off(&mut self) -> usize {
        self.block.sample(&mut self.rng) * self.io
    }
}

/// An edge-triggered epoll instance watching one socket for input, polled without blocking.
struct EpollGate(OwnedFd);

impl EpollGate {
    fn new(s: &TcpStream) -> std::io::Result<Self> {
        // SAFETY: epoll_create1 takes no pointers; a non-negative result is a new fd.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if ep < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `ep` is a new descriptor that nothing else owns.
        let gate = Self(unsafe { OwnedFd::from_raw_fd(ep) });
        let mut ev = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLET) as u32,
            u64: 0,
        };
        // SAFETY: both descriptors are open for the call and `ev` is a valid event.
        if unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, s.as_raw_fd(), &mut ev) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(gate)
    }

    /// Whether input arrived since the socket was last read empty.
    fn ready(&self) -> std::io::Result<bool> {
        let mut ev = [libc::epoll_event { events: 0, u64: 0 }];
        // SAFETY: `ev` has room for the one event asked for; timeout 0 never blocks.
        let n = unsafe { libc::epoll_wait(self.0.as_raw_fd(), ev.as_mut_ptr(), 1, 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            return if e.kind() == ErrorKind::Interrupted {
                Ok(false)
            } else {
                Err(e)
            };
        }
        Ok(n > 0)
    }
}

/// The answering side: reads what the socket has, answers every complete request in it.
///
/// With `gated` (queue depth above 1), a socket read empty is read again only when epoll
/// reports new input, as pollux's reactor does: a read spinning on an empty socket takes the
/// socket lock that the client's sends need to deliver into it, which cost a QD32 floor ~12%
/// of its IOPS here. At QD1 it spins on the read itself, the lowest-latency way to wait.
fn serve(
    s: &mut TcpStream,
    req_len: usize,
    read: bool,
    gated: bool,
    mut blocks: Blocks,
    stop: &AtomicBool,
) -> std::io::Result<()> {
    let mut rbuf = vec![0u8; (req_len * 64).max(256 * 1024)];
    let (mut rstart, mut rend) = (0usize, 0usize);
    let hdr = [0x5au8; C2H_HDR];
    let resp = [0x5au8; CAPSULE_RESP];
    let mut offs: Vec<usize> = Vec::new();
    let mut resps: Vec<u8> = Vec::new();
    let gate = if gated { Some(EpollGate::new(s)?) } else { None };
    let mut drained = false;
    loop {
        if drained && let Some(g) = &gate {
            while !g.ready()? {
                if stop.load(Relaxed) {
                    return Ok(());
                }
            }
        }
        let room = rbuf.len() - rend;
        match s.read(&mut rbuf[rend..]) {
            Ok(0) => return Ok(()),
            Ok(n) => {
                rend += n;
                // A short read emptied the socket.
                drained = n < room;
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
                drained = true;
                if stop.load(Relaxed) {
                    return Ok(());
                }
            }
            Err(e) => return Err(e),
        }
        let n = (rend - rstart) / req_len;
        if n == 0 {
            continue;
        }
        if read {
            offs.clear();
            offs.extend((0..n).map(|_| blocks.next_off()));
            let io = blocks.io;
            let mut iov: Vec<IoSlice<'_>> = Vec::with_capacity(2 * n);
            for &off in &offs {
                iov.push(IoSlice::new(&hdr));
                iov.push(IoSlice::new(&blocks.mem[off..off + io]));
            }
            writev_spin(s, &mut iov)?;
        } else {
            for k in 0..n {
                let data = rstart + k * req_len + CAPSULE_CMD;
                let off = blocks.next_off();
                let io = blocks.io;
                blocks.mem[off..off + io].copy_from_slice(&rbuf[data..data + io]);
            }
            resps.clear();
            (0..n).for_each(|_| resps.extend_from_slice(&resp));
            write_spin(s, &resps)?;
        }
        rstart += n * req_len;
        if rstart == rend {
            (rstart, rend) = (0, 0);
        } else if rend > rbuf.len() / 2 {
            rbuf.copy_within(rstart..rend, 0);
            (rstart, rend) = (0, rend - rstart);
        }
    }
}

/// Runs the loopback floor for `opts` (reads or writes of `opts.io_size` at its queue depth),
/// the answering thread pinned to `server_core`.
pub fn run(opts: &PerfOpts, server_core: usize) -> Result<PerfReport, PerfError> {
    let (req_len, resp_len) = sizes(opts)?;
    let listener = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))).map_err(io_err("bind"))?;
    let addr = listener.local_addr().map_err(io_err("bind"))?;
    let stop = Arc::new(AtomicBool::new(false));
    let server_stop = Arc::clone(&stop);
    let read = opts.workload.read_pct == 100;
    let (io, span, gated) = (opts.io_size as usize, opts.span, opts.queue_depth > 1);
    let server = std::thread::Builder::new()
        .name("floor-server".into())
        .spawn(move || -> std::io::Result<()> {
            sys::pin_current_thread(server_core)?;
            let blocks = Blocks::new(io, span)?;
            let (mut s, _) = listener.accept()?;
            s.set_nodelay(true)?;
            s.set_nonblocking(true)?;
            serve(&mut s, req_len, read, gated, blocks, &server_stop)
        })
        .map_err(io_err("spawn"))?;
    let result = client(opts, addr, req_len, resp_len, &stop);
    stop.store(true, Relaxed);
    let served = server.join();
    let report = result?;
    match served {
        Ok(Ok(())) => Ok(report),
        Ok(Err(e)) => Err(io_err("server")(e)),
        Err(_) => Err(PerfError::Thread("floor server panicked".into())),
    }
}

fn client(
    opts: &PerfOpts,
    addr: SocketAddr,
    req_len: usize,
    resp_len: usize,
    stop: &AtomicBool,
) -> Result<PerfReport, PerfError> {
    if let Some(core) = opts.cores.first().copied().flatten() {
        sys::pin_current_thread(core).map_err(io_err("pin"))?;
    }
    let qd = opts.queue_depth;
    let mut s = TcpStream::connect_timeout(&addr, opts.timeout).map_err(io_err("connect"))?;
    s.set_nodelay(true).map_err(io_err("socket"))?;
    s.set_nonblocking(true).map_err(io_err("socket"))?;
    let reqs = vec![0x3cu8; req_len * qd];
    let mut rbuf = vec![0u8; (resp_len * qd).max(64 * 1024)];
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)
        .map_err(|e| PerfError::Thread(format!("histogram: {e}")))?;
    // Send times of the requests in flight: responses come back in order.
    let mut sent: VecDeque<Instant> = VecDeque::with_capacity(qd);
    let t = Instant::now();
    write_spin(&mut s, &reqs).map_err(io_err("send"))?;
    sent.extend(std::iter::repeat_n(t, qd));
    let warm_end = Instant::now() + opts.warmup;
    let mut measuring: Option<(Instant, u64)> = None;
    let (mut ios, mut partial) = (0u64, 0usize);
    // When the measured part ended: its length and the client's CPU then.
    let mut ended: Option<(f64, u64)> = None;
    while !sent.is_empty() {
        let n = match s.read(&mut rbuf) {
            Ok(0) => return Err(PerfError::Thread("floor server closed the connection".into())),
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
                if stop.load(Relaxed) {
                    return Err(PerfError::Thread("floor stopped".into()));
                }
                continue;
            }
            Err(e) => return Err(io_err("recv")(e)),
        };
        partial += n;
        let done = partial / resp_len;
        partial %= resp_len;
        if done == 0 {
            continue;
        }
        let now = Instant::now();
        for t in sent.drain(..done) {
            if measuring.is_some() && ended.is_none() && opts.ios.is_none_or(|n| ios < n) {
                hist.saturating_record(now.duration_since(t).as_nanos().max(1) as u64);
                ios += 1;
            }
        }
        if measuring.is_none() && now >= warm_end {
            measuring = Some((now, sys::thread_cpu_ns()));
        }
        if let Some((start, _)) = measuring
            && ended.is_none()
            && match opts.ios {
                Some(n) => ios >= n,
                None => now >= start + opts.duration,
            }
        {
            ended = Some((now.duration_since(start).as_secs_f64(), sys::thread_cpu_ns()));
        }
        if ended.is_none() {
            // Latency counts from before the send, as a host's does from submission.
            let t = Instant::now();
            write_spin(&mut s, &reqs[..done * req_len]).map_err(io_err("send"))?;
            sent.extend(std::iter::repeat_n(t, done));
        }
    }
    let cpu0 = measuring.map_or(0, |(_, c)| c);
    let (seconds, cpu1) = ended.unwrap_or((0.0, cpu0));
    let seconds = seconds.max(f64::MIN_POSITIVE);
    let cpu_ns = cpu1.saturating_sub(cpu0) as f64;
    let per_io = |x: f64| if ios > 0 { x / ios as f64 } else { 0.0 };
    let reads = if opts.workload.read_pct == 100 { ios } else { 0 };
    Ok(PerfReport {
        workload: format!("floor-{}", opts.workload.name()),
        read_pct: opts.workload.read_pct,
        io_size: opts.io_size,
        queue_depth: qd,
        threads: 1,
        queues: 1,
        hdgst: false,
        ddgst: false,
        tls: false,
        dhchap: false,
        rate: None,
        block_size: 0,
        units: 0,
        seconds,
        ios,
        reads,
        writes: ios - reads,
        iops: ios as f64 / seconds,
        mib_s: ios as f64 * f64::from(opts.io_size) / seconds / f64::from(1u32 << 20),
        latency_ns: LatencySummary::of(&hist),
        client_cpu: cpu_ns / (seconds * 1e9),
        client_busy: 1.0,
        client_ns_per_io: per_io(cpu_ns),
        client_iterations_per_io: 1.0,
        verified_blocks: None,
        readback_blocks: None,
        target: None,
        thread_cpu: Vec::new(),
        placement: None,
        in_place_reads: 0,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::perf::Workload;
    use std::time::Duration;

    fn opts(w: &str) -> PerfOpts {
        let mut o = PerfOpts::new(SocketAddr::from((Ipv4Addr::LOCALHOST, 1)), "nqn.x:y");
        o.workload = Workload::parse(w, 50).unwrap();
        o.duration = Duration::from_millis(50);
        o
    }

    #[test]
    fn sizes_are_a_hosts_bytes_for_the_command() {
        assert_eq!(sizes(&opts("randread")).unwrap(), (72, 24 + 4096));
        assert_eq!(sizes(&opts("write")).unwrap(), (72 + 4096, 24));
        assert!(sizes(&opts("randrw")).is_err());
        assert!(sizes(&opts("idle")).is_err());
        let mut o = opts("randread");
        o.queue_depth = 0;
        assert!(sizes(&o).is_err());
        o.queue_depth = 32;
        o.span = Some(2048);
        assert!(sizes(&o).is_err(), "a span smaller than one I/O");
    }

    #[test]
    fn a_count_based_floor_run_counts_every_round_trip() {
        let mut o = opts("randread");
        o.ios = Some(500);
        let r = run(&o, 0).unwrap();
        assert_eq!(r.ios, 500);
        assert_eq!(r.latency_ns.count, 500);
        assert!(r.latency_ns.min > 0 && r.latency_ns.p50 >= r.latency_ns.min);
        assert_eq!(r.workload, "floor-randread");
    }

    #[test]
    fn a_deep_floor_run_keeps_its_queue_full_and_counts_each_response_once() {
        for w in ["randread", "randwrite"] {
            let mut o = opts(w);
            o.queue_depth = 8;
            o.span = Some(1 << 20);
            o.ios = Some(2000);
            let r = run(&o, 0).unwrap();
            assert_eq!((r.ios, r.latency_ns.count, r.queue_depth), (2000, 2000, 8), "{w}");
            assert!(r.seconds > 0.0 && r.iops > 0.0, "{w}");
        }
    }
}
