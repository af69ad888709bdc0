//! The hot upgrade's hand-over state as the new process takes it (`upgrade::wire`,
//! `handover`, `upgrade::reactors`): the input's bytes go as packets over a real handover
//! socket (a `SOCK_SEQPACKET` pair; the first byte of each packet its kind, the packets cut
//! where the input says), are reassembled and parsed into a message, and a Handover's queue
//! states are installed on a running in-process target's reactor, each around a fresh
//! loopback connection, committed (I/O queues relinked to their admin queues, held commands
//! run) and closed again by their host. Whatever the bytes: an error or queues that serve,
//! never a panic, and the reactor answers after each input.
//!
//! Seeds: `POLLUX_FUZZ_SEEDS=DIR` makes the first run write there the Handover of real
//! queues (a host connected with an admin and an I/O queue, one holding a write) as a
//! running target pauses and takes them: the corpus in target/fuzz/corpus/handover started
//! from those.
#![no_main]

use std::collections::HashMap;
use std::io::Write as _;
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::mpsc;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use pollux_target::handover::{ConnState, Handover, Msg};
use pollux_target::upgrade::{reactors, wire::Wire};
use pollux_target::{Options, Target};

const NQN: &str = "nqn.2026-12.io.pollux.fuzz:ram";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:0c0c0c0c-0000-4000-8000-000000000002";
/// Queue states installed per input, at most.
const MAX_QUEUES: usize = 4;
/// Packets per input, at most (the kinds of `upgrade::wire`: 2 more follows, 3 the last).
const MAX_PACKETS: usize = 8;

fn conf() -> String {
    format!(
        r#"
[reactors]
cores = [0]
mode = "interrupt"

[[listener]]
address = "127.0.0.1:0"

[[subsystem]]
nqn = "{NQN}"
allow_any_host = true
[[subsystem.namespace]]
nsid = 1
backend = {{ ram = {{ size = "1MiB" }} }}
"#
    )
}

struct World {
    target: Target,
    /// Where the fuzzer's hosts connect from: accepted here, the other end installed.
    loopback: TcpListener,
}

fn world() -> &'static World {
    static W: OnceLock<World> = OnceLock::new();
    W.get_or_init(|| {
        let cfg = pollux_conf::Config::parse(&conf(), "fuzz").expect("the fuzz conf parses");
        let target = Target::start(&cfg, Options { pin: false }).expect("the target starts");
        let loopback = TcpListener::bind("127.0.0.1:0").expect("a loopback listener");
        let w = World { target, loopback };
        if let Ok(dir) = std::env::var("POLLUX_FUZZ_SEEDS") {
            write_seeds(&w, std::path::Path::new(&dir));
        }
        w
    })
}

/// Run `f` on reactor 0 and wait for it: None if the reactor did not answer.
fn on_reactor<T: Send + 'static>(t: &Target, f: impl FnOnce(&mut pollux_reactor::Reactor) -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = mpsc::channel();
    let remotes = t.runtime().remotes();
    if !remotes.first()?.send(move |r| {
        let _ = tx.send(f(r));
    }) {
        return None;
    }
    rx.recv_timeout(Duration::from_secs(10)).ok()
}

/// An input that sends `json` as one packet: no cut, plain kinds.
fn packets(json: &[u8]) -> Vec<u8> {
    let mut v = vec![0u8, 0u8];
    v.extend_from_slice(json);
    v
}

/// The Handover of real queues: a host with an admin and an I/O queue, the I/O queue
/// holding a write that arrived while paused, taken as a running target takes them (then
/// given back to serve), written to `dir` as inputs.
fn write_seeds(w: &World, dir: &std::path::Path) {
    let addr = w.target.listen_addrs()[0];
    let mut c = pollux_host::Controller::connect(addr, NQN, HOST, 1, 32, pollux_host::Digests::default())
        .expect("a host connects");
    on_reactor(&w.target, |r| {
        let _ = reactors::pause(r);
    })
    .expect("the reactor pauses its queues");
    let q = &mut c.io[0];
    q.submit_write(1, 0, 1, vec![0x5a; 512], 7).expect("a write is queued");
    let _ = q.poll_completions(None, |_| {});
    std::thread::sleep(Duration::from_millis(50));
    let states = on_reactor(&w.target, |r| {
        let taken = reactors::take(r).map(|t| t.queues.into_iter().map(|(s, _)| s).collect::<Vec<ConnState>>());
        reactors::resume(r);
        taken
    })
    .flatten()
    .expect("the queues are taken");
    let _ = q.poll_completions(Some(Duration::from_secs(2)), |_| {});
    let _ = std::fs::create_dir_all(dir);
    let msg = |queues: Vec<ConnState>| {
        let m = Msg::Handover(Box::new(Handover {
            format: pollux_target::handover::FORMAT,
            queues,
            reservations: Vec::new(),
        }));
        packets(&serde_json::to_vec(&m).expect("a Handover encodes"))
    };
    for (i, s) in states.iter().enumerate() {
        let _ = std::fs::write(dir.join(format!("seed-queue-{i}")), msg(vec![s.clone()]));
    }
    let _ = std::fs::write(dir.join("seed-all"), msg(states));
    let _ = c.shutdown();
}

fuzz_target!(|input: &[u8]| {
    let w = world();
    // [n][n cut points][flags][bytes]: the bytes cut into up to MAX_PACKETS packets.
    let (&n, rest) = input.split_first().unwrap_or((&0, &[]));
    let n = usize::from(n) % MAX_PACKETS;
    let (cuts, rest) = rest.split_at(n.min(rest.len()));
    let (&flags, body) = rest.split_first().unwrap_or((&0, &[]));
    let mut at: Vec<usize> = cuts.iter().map(|&c| usize::from(c) * body.len() / 256).collect();
    at.push(body.len());
    at.sort_unstable();
    let Ok((wire, peer)) = Wire::pair() else { return };
    let mut from = 0;
    for (k, &to) in at.iter().enumerate() {
        let last = k + 1 == at.len();
        let mut p = Vec::with_capacity(to - from + 1);
        // Raw kinds (flags 0x80): the piece's first byte is its kind, whatever it is.
        if flags & 0x80 == 0 {
            p.push(if last { 3 } else { 2 });
        }
        p.extend_from_slice(&body[from..to]);
        from = to;
        if p.is_empty() {
            continue;
        }
        // SAFETY: send(2) of an owned, connected socket's descriptor and a live buffer.
        let sent = unsafe { libc::send(peer.as_raw_fd(), p.as_ptr().cast(), p.len(), libc::MSG_DONTWAIT) };
        if sent < 0 {
            break;
        }
    }
    drop(peer);
    let Ok((Msg::Handover(h), _)) = wire.recv(Duration::from_millis(200)) else {
        return;
    };
    let mut hosts = Vec::new();
    let mut queues: Vec<(ConnState, OwnedFd)> = Vec::new();
    for s in h.queues.into_iter().take(MAX_QUEUES) {
        let Ok(host) = TcpStream::connect(w.loopback.local_addr().expect("bound")) else { return };
        let Ok((ours, _)) = w.loopback.accept() else { return };
        hosts.push(host);
        queues.push((s, OwnedFd::from(ours)));
    }
    let shared = Arc::clone(w.target.shared());
    let started = shared.started;
    let answered = on_reactor(&w.target, move |r| {
        let (done, _refused) = reactors::install(r, queues, &shared, started, &HashMap::new());
        let at = done.into_iter().collect::<HashMap<_, _>>();
        reactors::commit(r, &at);
    });
    assert!(answered.is_some(), "the reactor did not answer after installing the handed queues");
    // The hosts send a little and go: their queues close.
    for mut h in hosts {
        let _ = h.write_all(&[0u8; 8]);
    }
    assert!(
        on_reactor(&w.target, |_| ()).is_some(),
        "the reactor did not answer after the handed queues' hosts left"
    );
});
