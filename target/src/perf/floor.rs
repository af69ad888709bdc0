//! `pollux perf --floor CORE`: the platform's own QD1 round trip over loopback TCP, without
//! NVMe/TCP.
//!
//! A thread pinned to CORE (where a benchmark pins the target's reactor) answers each request
//! with the bytes pollux would return for the same command, and the client sends exactly the
//! bytes a host would: for a read, a 72-byte command capsule (8-byte common header + 64-byte
//! SQE, NVMe/TCP §3.6.2.4) answered by a 24-byte C2HData header and the data; for a write,
//! the capsule with the data in it answered by a 24-byte response capsule (8 + 16-byte CQE).
//! Both sides busy-poll non-blocking sockets with TCP_NODELAY, as pollux's poll-mode reactor
//! and client do, and do nothing else: no parsing, no epoll, no copy out of a namespace.
//!
//! On a shared VM the loopback round trip itself drifts by tens of percent from minute to
//! minute, so an absolute QD1 latency says little on its own; run next to pollux's QD1 run,
//! this one tells how much of it is pollux (its p50 minus the floor's).

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::Instant;

use hdrhistogram::Histogram;
use pollux_reactor::sys;

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
    if opts.queue_depth != 1 {
        return bad("measures QD1 round trips only (-q 1)");
    }
    if opts.cores.len() != 1 || opts.conns_per_core != 1 {
        return bad("one client core and one connection");
    }
    if opts.digests.hdgst || opts.digests.ddgst || opts.verify || opts.rate.is_some() || opts.blocking {
        return bad("no digests, --verify, --rate or --blocking");
    }
    let io = opts.io_size as usize;
    match (opts.workload.access, opts.workload.read_pct) {
        (Access::Idle, _) => bad("an idle workload has no round trips"),
        (_, 100) => Ok((CAPSULE_CMD, C2H_HDR + io)),
        (_, 0) => Ok((CAPSULE_CMD + io, CAPSULE_RESP)),
        _ => bad("reads or writes, not a mix"),
    }
}

/// Reads exactly `buf.len()` bytes from a non-blocking socket, spinning; false when the peer
/// closed or `stop` was raised.
fn read_spin(s: &mut TcpStream, buf: &mut [u8], stop: &AtomicBool) -> std::io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match s.read(&mut buf[got..]) {
            Ok(0) => return Ok(false),
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
                if stop.load(Relaxed) {
                    return Ok(false);
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// Writes all of `buf` to a non-blocking socket, spinning while its send buffer is full.
fn write_spin(s: &mut TcpStream, buf: &[u8]) -> std::io::Result<()> {
    let mut off = 0;
    while off < buf.len() {
        match s.write(&buf[off..]) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => off += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn io_err(what: &str) -> impl Fn(std::io::Error) -> PerfError + '_ {
    move |e| PerfError::Thread(format!("floor {what}: {e}"))
}

/// Runs the loopback floor for `opts` (QD1, reads or writes of `opts.io_size`), the answering
/// thread pinned to `server_core`.
pub fn run(opts: &PerfOpts, server_core: usize) -> Result<PerfReport, PerfError> {
    let (req_len, resp_len) = sizes(opts)?;
    let listener = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))).map_err(io_err("bind"))?;
    let addr = listener.local_addr().map_err(io_err("bind"))?;
    let stop = Arc::new(AtomicBool::new(false));
    let server_stop = Arc::clone(&stop);
    let server = std::thread::Builder::new()
        .name("floor-server".into())
        .spawn(move || -> std::io::Result<()> {
            sys::pin_current_thread(server_core)?;
            let (mut s, _) = listener.accept()?;
            s.set_nodelay(true)?;
            s.set_nonblocking(true)?;
            let mut req = vec![0u8; req_len];
            let resp = vec![0x5au8; resp_len];
            while read_spin(&mut s, &mut req, &server_stop)? {
                write_spin(&mut s, &resp)?;
            }
            Ok(())
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
    let mut s = TcpStream::connect_timeout(&addr, opts.timeout).map_err(io_err("connect"))?;
    s.set_nodelay(true).map_err(io_err("socket"))?;
    s.set_nonblocking(true).map_err(io_err("socket"))?;
    let req = vec![0x3cu8; req_len];
    let mut resp = vec![0u8; resp_len];
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)
        .map_err(|e| PerfError::Thread(format!("histogram: {e}")))?;
    let mut round_trip = |s: &mut TcpStream| -> Result<u64, PerfError> {
        let t0 = Instant::now();
        write_spin(s, &req).map_err(io_err("send"))?;
        if !read_spin(s, &mut resp, stop).map_err(io_err("recv"))? {
            return Err(PerfError::Thread("floor server closed the connection".into()));
        }
        Ok(t0.elapsed().as_nanos() as u64)
    };
    let warm_end = Instant::now() + opts.warmup;
    while Instant::now() < warm_end {
        round_trip(&mut s)?;
    }
    let cpu0 = sys::thread_cpu_ns();
    let start = Instant::now();
    let end = start + opts.duration;
    let mut ios = 0u64;
    loop {
        let done = match opts.ios {
            Some(n) => ios >= n,
            None => Instant::now() >= end,
        };
        if done {
            break;
        }
        hist.saturating_record(round_trip(&mut s)?.max(1));
        ios += 1;
    }
    let seconds = start.elapsed().as_secs_f64().max(f64::MIN_POSITIVE);
    let cpu_ns = sys::thread_cpu_ns().saturating_sub(cpu0) as f64;
    let per_io = |x: f64| if ios > 0 { x / ios as f64 } else { 0.0 };
    let reads = if opts.workload.read_pct == 100 { ios } else { 0 };
    Ok(PerfReport {
        workload: format!("floor-{}", opts.workload.name()),
        read_pct: opts.workload.read_pct,
        io_size: opts.io_size,
        queue_depth: 1,
        threads: 1,
        queues: 1,
        hdgst: false,
        ddgst: false,
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
        target: None,
        thread_cpu: Vec::new(),
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
        o.queue_depth = 2;
        assert!(sizes(&o).is_err());
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
}
