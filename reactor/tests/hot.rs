//! Busy-poll mode's hot sockets: taken out of epoll while busy, put back when idle or when
//! the mode changes. In their own test binary: their spinning reactors would take the CPU
//! from the timing-sensitive tests of `runtime.rs` if they ran beside them.
#![allow(missing_docs, clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::sync::mpsc;
use std::time::{Duration, Instant};

mod common;
use common::{EchoSource, wait_for};
use pollux_reactor::{Mode, ReactorConfig, Runtime, SourceOpts};

/// A hot socket goes cold after 100 ms without work, not the default 1 ms: the test's client
/// thread shares two CPUs with spinning reactors and may wait a scheduler slice (milliseconds)
/// between a reply and its next message; with 1 ms the socket would go cold in that wait
/// and whether it is hot would say how this thread was scheduled, not what the reactor does.
const COLD_AFTER: Duration = Duration::from_millis(100);

fn start(modes: &[Mode]) -> Runtime {
    let cfgs = modes
        .iter()
        .map(|&m| ReactorConfig {
            cold_after: COLD_AFTER,
            ..common::cfg(m)
        })
        .collect();
    Runtime::start(cfgs, Arc::new(|_| Ok(()))).unwrap()
}

/// Connected clients whose server ends are pollable sockets on reactor 0.
fn pollable_echoes(rt: &Runtime, n: usize) -> Vec<TcpStream> {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let mut clients = Vec::new();
    for _ in 0..n {
        let client = TcpStream::connect(addr).unwrap();
        client.set_nodelay(true).unwrap();
        let (server, _) = listener.accept().unwrap();
        server.set_nonblocking(true).unwrap();
        let (tx, rx) = mpsc::channel();
        rt.remote(0).unwrap().send(move |r| {
            let fd = server.as_raw_fd();
            let echo = EchoSource {
                sock: server,
                bytes: Arc::new(AtomicU64::new(0)),
            };
            r.add_sleepable_source(Box::new(echo), SourceOpts::socket(fd)).unwrap();
            tx.send(()).unwrap();
        });
        rx.recv_timeout(Duration::from_secs(5)).unwrap();
        clients.push(client);
    }
    clients
}

fn echo(c: &mut TcpStream, msg: &[u8]) {
    c.write_all(msg).unwrap();
    let mut back = vec![0u8; msg.len()];
    c.read_exact(&mut back).unwrap();
    assert_eq!(back, msg);
}

#[test]
fn busy_poll_takes_a_busy_socket_out_of_epoll_and_puts_it_back() {
    let rt = start(&[Mode::Poll]);
    let mut c = pollable_echoes(&rt, 1).pop().unwrap();
    // The cumulative count of entries says that the socket went hot (the gauge is 1 only
    // until it goes cold again).
    let hot = |rt: &Runtime| rt.stats()[0].hot_sources;
    let entries = |rt: &Runtime| rt.stats()[0].hot_entries;
    let serve_until_hot = |c: &mut TcpStream, what: &str| {
        let (t0, before) = (Instant::now(), entries(&rt));
        loop {
            echo(c, what.as_bytes());
            if entries(&rt) > before {
                return;
            }
            assert!(t0.elapsed() < Duration::from_secs(5), "never hot while serving {what}");
        }
    };
    serve_until_hot(&mut c, "served by polling");
    // Idle for longer than the cold threshold: back into epoll, and still served from there.
    wait_for("the idle socket to go back into epoll", Duration::from_secs(5), || {
        hot(&rt) == 0
    });
    let before = entries(&rt);
    echo(&mut c, b"served through epoll");
    wait_for("the socket to be hot again", Duration::from_secs(5), || {
        entries(&rt) > before
    });
    // Leaving busy-poll mode puts it back, so that the reactor can sleep and still hear it.
    rt.set_mode(0, Mode::Interrupt).unwrap();
    wait_for("interrupt mode, nothing hot", Duration::from_secs(5), || {
        let s = &rt.stats()[0];
        s.mode == Mode::Interrupt && s.hot_sources == 0
    });
    std::thread::sleep(Duration::from_millis(20));
    let (slept, before) = (rt.stats()[0].sleep_ns, entries(&rt));
    echo(&mut c, b"woke a sleeping reactor");
    wait_for("the sleep to be counted", Duration::from_secs(5), || {
        rt.stats()[0].sleep_ns > slept
    });
    assert_eq!(entries(&rt), before, "nothing goes hot outside busy-poll mode");
    // Back to busy-poll; a hot source that closes leaves the count right.
    rt.set_mode(0, Mode::Poll).unwrap();
    wait_for("poll mode", Duration::from_secs(5), || rt.stats()[0].mode == Mode::Poll);
    serve_until_hot(&mut c, "hot again in busy-poll mode");
    drop(c);
    wait_for("the closed source to be gone", Duration::from_secs(5), || {
        let s = &rt.stats()[0];
        s.hot_sources == 0 && s.sources == 0
    });
    assert!(entries(&rt) >= 3, "hot at least three times: {}", entries(&rt));
    rt.shutdown().unwrap();
}

#[test]
fn only_a_few_sockets_are_polled_outside_epoll_and_all_are_served() {
    let rt = start(&[Mode::Poll]);
    let mut clients = pollable_echoes(&rt, 12);
    let mut most = 0;
    for round in 0..50u32 {
        for (i, c) in clients.iter_mut().enumerate() {
            echo(c, format!("round {round} client {i}").as_bytes());
        }
        most = most.max(rt.stats()[0].hot_sources);
    }
    assert!(rt.stats()[0].hot_entries >= 1, "busy sockets were polled");
    assert!(most <= 8, "at most 8 polled outside epoll, saw {most}");
    rt.shutdown().unwrap();
}

#[test]
fn with_a_hot_socket_epoll_is_checked_less_often_and_idle_sockets_are_still_served() {
    // A long interval, so that the count below does not depend on how fast iterations are.
    let cfg = ReactorConfig {
        fd_poll_interval: Duration::from_millis(1),
        cold_after: COLD_AFTER,
        ..common::cfg(Mode::Poll)
    };
    let rt = Runtime::start(vec![cfg], Arc::new(|_| Ok(()))).unwrap();
    let mut clients = pollable_echoes(&rt, 2);
    let mut cold = clients.pop().unwrap();
    let mut busy = clients.pop().unwrap();
    let stats = |rt: &Runtime| rt.stats()[0].clone();
    let t0 = Instant::now();
    while stats(&rt).hot_entries == 0 {
        echo(&mut busy, b"warm up");
        assert!(t0.elapsed() < Duration::from_secs(5), "the busy socket never went hot");
    }
    // Keep one socket hot; the other, idle in epoll since it was registered, must still be
    // served (it waits for the next epoll check, at most the interval).
    let before = stats(&rt);
    for round in 0..200u32 {
        echo(&mut busy, format!("busy {round}").as_bytes());
        if round % 50 == 0 {
            echo(&mut cold, format!("cold {round}").as_bytes());
        }
    }
    let after = stats(&rt);
    let (iters, polls) = (after.iterations - before.iterations, after.fd_polls - before.fd_polls);
    assert!(iters > 0 && polls > 0, "iterations {iters}, epoll checks {polls}");
    // Not far fewer: the busy socket goes cold if this thread is kept off the CPU for longer
    // than COLD_AFTER (other tests spin too), and then every iteration checks epoll.
    assert!(
        polls * 10 < iters * 9,
        "with a hot socket some iterations skip epoll: checked on {polls} of {iters}"
    );
    rt.shutdown().unwrap();

    // Without hot sockets (interrupt mode), every iteration checks epoll.
    let rt = start(&[Mode::Interrupt]);
    let mut c = pollable_echoes(&rt, 1).pop().unwrap();
    let before = stats(&rt);
    for round in 0..50u32 {
        echo(&mut c, format!("interrupt {round}").as_bytes());
    }
    let after = stats(&rt);
    let (iters, polls) = (after.iterations - before.iterations, after.fd_polls - before.fd_polls);
    // Give or take the iteration in progress when a snapshot was taken.
    assert!(polls.abs_diff(iters) <= 1, "epoll checks {polls}, iterations {iters}");
    rt.shutdown().unwrap();
}
