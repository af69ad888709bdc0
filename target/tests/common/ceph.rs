//! A throwaway one-node Ceph cluster for the rbd tests (`ci/ceph.sh`): one monitor, one
//! memstore OSD on 127.0.0.1, started and stopped by its own pids.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A one-node cluster in a scratch directory, stopped on drop.
pub struct Ceph {
    /// Its scratch directory.
    pub dir: PathBuf,
    /// Its ceph.conf.
    pub conf: PathBuf,
}

/// ci/ceph.sh.
pub fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../ci/ceph.sh")
}

impl Ceph {
    /// None (after saying why) where this machine has no Ceph and none is required.
    pub fn start(name: &str) -> Option<Ceph> {
        Self::start_with(name, &[])
    }

    /// As [`Ceph::start`], with `ci/ceph.sh`'s settings `env` (`CEPH_AUTH=cephx`, say).
    pub fn start_with(name: &str, env: &[(&str, &str)]) -> Option<Ceph> {
        let have = Command::new("sh")
            .args(["-c", "command -v ceph-mon && command -v ceph-osd && command -v rbd"])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
            && Path::new("/usr/lib/x86_64-linux-gnu/librbd.so.1").exists();
        if !have {
            assert!(
                std::env::var_os("POLLUX_REQUIRE_CEPH").is_none(),
                "POLLUX_REQUIRE_CEPH is set but Ceph (ceph-mon, ceph-osd, rbd, librbd1) is not installed"
            );
            eprintln!(
                "rbd tests: no Ceph on this machine (apt-get install ceph-mon ceph-osd ceph-common librbd1): not run"
            );
            return None;
        }
        let dir = std::env::temp_dir().join(format!("pollux-rbd-{name}-{}", std::process::id()));
        let out = Command::new("bash")
            .arg(script())
            .args(["start", dir.to_str().unwrap()])
            .env("CEPH_IMG_SIZE", "64M")
            .envs(env.iter().copied())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "ci/ceph.sh start failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Some(Ceph {
            conf: dir.join("ceph.conf"),
            dir,
        })
    }

    pub fn run(&self, cmd: &str, args: &[&str]) -> Vec<u8> {
        let out = Command::new(cmd).arg("-c").arg(&self.conf).args(args).output().unwrap();
        assert!(
            out.status.success(),
            "{cmd} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    }

    /// The image's bytes as the cluster has them (`rbd export`), read by no pollux code.
    pub fn export(&self, image: &str) -> Vec<u8> {
        self.run("rbd", &["export", "--no-progress", &format!("rbd/{image}"), "-"])
    }

    pub fn create(&self, image: &str, size: &str) {
        self.run("rbd", &["create", "--size", size, &format!("rbd/{image}")]);
    }

    pub fn fsid(&self) -> String {
        String::from_utf8(self.run("ceph", &["fsid"]))
            .unwrap()
            .trim()
            .to_owned()
    }

    pub fn signal(&self, what: &str) {
        let out = Command::new("bash")
            .args([
                "-c",
                &format!(". '{}' && ceph_{what} '{}'", script().display(), self.dir.display()),
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "ceph_{what}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for Ceph {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(script())
            .args(["stop", self.dir.to_str().unwrap()])
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
