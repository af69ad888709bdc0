//! The pollux process under test: started, killed, upgraded and asked through `pollux ctl`.
//!
//! An upgrade makes the serving process a child of the one before it, and a `kill -9` can
//! land while an upgrade is under way, so every pid this harness has seen serve is kept and
//! a kill ends all of them that are alive: the restart then finds the control socket free.

use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub(crate) struct Target {
    pub(crate) bin: PathBuf,
    pub(crate) conf: PathBuf,
    pub(crate) sock: PathBuf,
    pub(crate) log: PathBuf,
    pub(crate) child: Option<Child>,
    pub(crate) starts: u64,
    /// Every pid seen serving (children and the processes upgrades started).
    pub(crate) seen: Vec<i32>,
}

#[derive(Debug)]
pub(crate) struct CtlFailed(pub(crate) String);

/// The environment variable that marks the processes of this run (its log's path).
const MARK: &str = "POLLUX_FAULTS_RUN";

/// Every process whose environment carries `MARK=value`: whatever an upgrade started,
/// which the harness may not have seen serve (one asked for outside the nemesis).
fn marked(value: &std::path::Path) -> Vec<i32> {
    let want = format!("{MARK}={}", value.display()).into_bytes();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| env.split(|&b| b == 0).any(|v| v == want))
        })
        .collect()
}

/// `pollux ctl ARGS` on control socket `sock` with binary `bin`: its output, or its error.
pub(crate) fn ctl(bin: &std::path::Path, sock: &std::path::Path, args: &[&str]) -> Result<String, CtlFailed> {
    let out = Command::new(bin)
        .arg("ctl")
        .arg("--socket")
        .arg(sock)
        .args(args)
        .output()
        .map_err(|e| CtlFailed(e.to_string()))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(CtlFailed(format!(
            "pollux ctl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

fn alive(pid: i32) -> bool {
    // A zombie (a killed child not yet waited for) is as good as gone.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| s.rsplit(')').next().and_then(|r| r.split_whitespace().next()) != Some("Z"))
}

impl Target {
    /// Starts pollux on its conf and waits until it listens on `addrs` and answers on its
    /// control socket as itself.
    pub(crate) fn start(&mut self, addrs: &[SocketAddr]) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(&self.bin)
            .arg("--config")
            .arg(&self.conf)
            .env("NO_COLOR", "1")
            // Inherited by every process an upgrade starts: `kill9` finds them all by it.
            .env(MARK, &self.log)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        self.seen.push(pid);
        self.child = Some(child);
        self.starts += 1;
        let t0 = Instant::now();
        let deadline = Duration::from_secs(60);
        loop {
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(st)) = c.try_wait()
            {
                panic!("pollux exited at start ({st}): see {}", self.log.display());
            }
            let listening = addrs.iter().all(|a| TcpStream::connect(a).is_ok());
            if listening && self.pid() == Some(pid) {
                return;
            }
            assert!(
                t0.elapsed() < deadline,
                "pollux did not serve within {deadline:?}: see {}",
                self.log.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub(crate) fn ctl(&self, args: &[&str]) -> Result<String, CtlFailed> {
        ctl(&self.bin, &self.sock, args)
    }

    /// The pid of the process serving now (an upgrade replaces it), remembered.
    pub(crate) fn pid(&mut self) -> Option<i32> {
        let v: serde_json::Value = serde_json::from_str(&self.ctl(&["--json", "version"]).ok()?).ok()?;
        let pid = v["pid"].as_i64()? as i32;
        if !self.seen.contains(&pid) {
            self.seen.push(pid);
        }
        Some(pid)
    }

    pub(crate) fn rss_kib(&mut self) -> Option<u64> {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.pid()?)).ok()?;
        s.lines()
            .find(|l| l.starts_with("VmRSS:"))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    }

    /// `kill -9` of every pollux process this run has seen that is alive, and waits until
    /// they are gone.
    pub(crate) fn kill9(&mut self) {
        let _ = self.pid();
        for pid in marked(&self.log) {
            if !self.seen.contains(&pid) {
                self.seen.push(pid);
            }
        }
        for &pid in &self.seen {
            if alive(pid) {
                // SAFETY: kill(2) of a pollux process this campaign runs.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        let t0 = Instant::now();
        while self.seen.iter().any(|&p| alive(p)) && t0.elapsed() < Duration::from_secs(10) {
            if let Some(c) = self.child.as_mut() {
                let _ = c.try_wait();
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
        self.seen.retain(|&p| alive(p));
    }

    /// SIGTERM to the serving process; whether it and every other seen are gone within 20 s.
    pub(crate) fn stop(&mut self) -> bool {
        let Some(pid) = self.pid() else { return false };
        // SAFETY: kill(2) of the pollux process this campaign runs.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let t0 = Instant::now();
        while self.seen.iter().any(|&p| alive(p)) && t0.elapsed() < Duration::from_secs(20) {
            if let Some(c) = self.child.as_mut() {
                let _ = c.try_wait();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.child.take();
        !self.seen.iter().any(|&p| alive(p))
    }
}
