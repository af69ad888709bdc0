//! The pollux process under test: started, killed, upgraded and asked through `pollux ctl`.

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub(crate) struct Target {
    pub(crate) bin: PathBuf,
    pub(crate) conf: PathBuf,
    pub(crate) sock: PathBuf,
    pub(crate) log: PathBuf,
    pub(crate) child: Option<Child>,
    pub(crate) starts: u64,
}

#[derive(Debug)]
pub(crate) struct CtlFailed(pub(crate) String);

impl Target {
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
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
        self.starts += 1;
        let t0 = Instant::now();
        for a in addrs {
            while TcpStream::connect(a).is_err() {
                assert!(
                    t0.elapsed() < Duration::from_secs(60),
                    "pollux did not listen on {a}: see {}",
                    self.log.display()
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    pub(crate) fn ctl(&self, args: &[&str]) -> Result<String, CtlFailed> {
        let out = Command::new(&self.bin)
            .arg("ctl")
            .arg("--socket")
            .arg(&self.sock)
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

    /// The pid of the process serving now (an upgrade replaces it).
    pub(crate) fn pid(&self) -> Option<i32> {
        let v: serde_json::Value = serde_json::from_str(&self.ctl(&["--json", "version"]).ok()?).ok()?;
        v["pid"].as_i64().map(|p| p as i32)
    }

    pub(crate) fn rss_kib(&self) -> Option<u64> {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.pid()?)).ok()?;
        s.lines()
            .find(|l| l.starts_with("VmRSS:"))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    }

    pub(crate) fn kill9(&mut self) {
        let pid = self.pid().or_else(|| self.child.as_ref().map(|c| c.id() as i32));
        if let Some(pid) = pid {
            // SAFETY: kill(2) of the pollux process this campaign runs.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            // Wait until it is gone (it may be the child, or a process an upgrade started).
            let t0 = Instant::now();
            while Path::new(&format!("/proc/{pid}")).exists() && t0.elapsed() < Duration::from_secs(10) {
                if let Some(c) = self.child.as_mut() {
                    let _ = c.try_wait();
                }
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                if stat.split_whitespace().nth(2) == Some("Z") {
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
    }

    pub(crate) fn stop(&mut self) -> bool {
        let Some(pid) = self.pid() else { return false };
        // SAFETY: kill(2) of the pollux process this campaign runs.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let t0 = Instant::now();
        while Path::new(&format!("/proc/{pid}")).exists() && t0.elapsed() < Duration::from_secs(20) {
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(_)) = c.try_wait()
            {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.child.take();
        !Path::new(&format!("/proc/{pid}")).exists()
    }
}
