//! What the benches against a Ceph cluster share (`resv`, `failover`): their settings, the
//! one-node cluster of `ci/ceph.sh`, and gateway processes. (Each bench compiles it as a
//! module of its own and uses part of it.)
#![allow(dead_code)]

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The workspace's root.
pub const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

/// POLLUX_BIN (default the workspace's build/release/pollux) and POLLUX_BENCH_OUT_DIR
/// (default build/bench, created).
pub fn bin_and_out() -> (String, PathBuf) {
    let bin = std::env::var("POLLUX_BIN").unwrap_or_else(|_| format!("{ROOT}/build/release/pollux"));
    let out = PathBuf::from(std::env::var("POLLUX_BENCH_OUT_DIR").unwrap_or_else(|_| format!("{ROOT}/build/bench")));
    std::fs::create_dir_all(&out).unwrap();
    (bin, out)
}

/// Env `k` as a number, `d` without it; `quick` instead under BENCH_QUICK.
pub fn setting(k: &str, d: usize, quick: usize) -> usize {
    if std::env::var_os("BENCH_QUICK").is_some() {
        return quick;
    }
    std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d)
}

pub fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

/// A one-node cluster (ci/ceph.sh) with pool rbd and a 64 MiB rbd/img0, stopped and wiped
/// when dropped.
pub struct Cluster {
    pub dir: PathBuf,
    pub conf: PathBuf,
}

impl Cluster {
    pub fn start(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("pollux-bench-{name}-{}", std::process::id()));
        let out = Command::new("bash")
            .arg(format!("{ROOT}/ci/ceph.sh"))
            .args(["start", dir.to_str().unwrap()])
            .env("CEPH_IMG_SIZE", "64M")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "ci/ceph.sh start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Self {
            conf: dir.join("ceph.conf"),
            dir,
        }
    }

    /// `rbd ARGS` on this cluster.
    pub fn rbd(&self, args: &[&str]) {
        let o = Command::new("rbd")
            .arg("-c")
            .arg(&self.conf)
            .args(args)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "rbd {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(format!("{ROOT}/ci/ceph.sh"))
            .args(["stop", self.dir.to_str().unwrap()])
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `bin --config DIR/NAME.toml` serving `text` (no control socket: a bench never takes the
/// machine's), its log appended to DIR/NAME.log; once it listens on `addr`.
pub fn gateway(bin: &str, dir: &Path, name: &str, text: &str, addr: SocketAddr) -> Child {
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).unwrap();
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(format!("{name}.log")))
        .unwrap();
    let mut child = Command::new(bin)
        .arg("--config")
        .arg(&path)
        .args(["--control-socket", "none"])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while TcpStream::connect(addr).is_err() {
        if let Ok(Some(s)) = child.try_wait() {
            panic!(
                "gateway {name} exited ({s}): see {}",
                dir.join(format!("{name}.log")).display()
            );
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "gateway {name} did not listen");
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

/// SIGTERM to a gateway this program started, and wait for it.
pub fn stop(g: &mut Child) {
    // SAFETY: kill(2) of a process this program started.
    unsafe { libc::kill(g.id() as i32, libc::SIGTERM) };
    let _ = g.wait();
}
