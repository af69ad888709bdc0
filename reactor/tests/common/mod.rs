//! Helpers shared by the reactor's integration tests.
#![allow(missing_docs, clippy::unwrap_used, dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::time::{Duration, Instant};

use pollux_reactor::{Mode, Next, Progress, Reactor, ReactorConfig, Runtime, Source, SourceId};

pub fn cfg(mode: Mode) -> ReactorConfig {
    ReactorConfig {
        mode,
        ..Default::default()
    }
}

pub fn start(modes: &[Mode]) -> Runtime {
    Runtime::start(modes.iter().map(|&m| cfg(m)).collect(), Arc::new(|_| Ok(()))).unwrap()
}

pub fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Echoes what it reads. It did work only when there were bytes: a socket polled outside
/// epoll must say when it found nothing, or it would stay hot forever.
pub struct EchoSource {
    pub sock: TcpStream,
    pub bytes: Arc<AtomicU64>,
}

impl Source for EchoSource {
    fn name(&self) -> &str {
        "test-echo"
    }
    fn run(&mut self, r: &mut Reactor, id: SourceId) -> Progress {
        let mut buf = [0u8; 256];
        let mut did = false;
        loop {
            match self.sock.read(&mut buf) {
                Ok(0) => {
                    r.remove_source(id);
                    return Progress::WORKED;
                }
                Ok(n) => {
                    did = true;
                    self.bytes.fetch_add(n as u64, SeqCst);
                    self.sock.write_all(&buf[..n]).unwrap();
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    return Progress {
                        did_work: did,
                        next: Next::Idle,
                    };
                }
                Err(e) => panic!("{e}"),
            }
        }
    }
}
