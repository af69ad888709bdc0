//! The rbd part of the campaign (`FAULTS_RBD=1`): a one-node Ceph cluster (`ci/ceph.sh`, a
//! real monitor and OSD) and two pollux gateways, A and B, in one gateway group serving the
//! same image under one subsystem: namespace 1 is in ANA group 1, which A owns (optimized
//! there, non-optimized on B) and B takes over when it fences A. The nemesis kills and
//! pauses the gateways, pauses the monitor and the OSD, and grows the image, while two hosts
//! write through A (B while A does not serve) and the checker holds every block to its
//! history: the group's fencing is what keeps a paused A's writes from landing later.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::cluster;
use super::process::Target;

/// The gateways' subsystem.
pub(crate) const NQN: &str = "nqn.2026-12.io.pollux.faults:rbd";
/// A command may wait this long: an OSD operation's own bound (`op_timeout_s`, 10 s) twice,
/// plus the group's grace and a gateway's re-execution after its fence.
pub(crate) const HANG: Duration = Duration::from_secs(60);

pub(crate) struct Rbd {
    pub(crate) cluster: cluster::Cluster,
    /// Gateway A (index 0) and B (index 1).
    pub(crate) gws: Vec<Target>,
    pub(crate) addrs: [SocketAddr; 2],
    /// A gateway's pid while it is paused (SIGSTOP), to continue it.
    pub(crate) paused: [Option<i32>; 2],
    /// A gateway killed and not yet restarted.
    pub(crate) dead: [bool; 2],
}

/// Gateway `name`'s conf: it owns ANA group `owns` and reports the other non-optimized.
fn conf(name: &str, addr: SocketAddr, sock: &Path, owns: u32, core: u32, cntlid: u16, ceph_conf: &Path) -> String {
    format!(
        "[reactors]\ncores = [{core}]\nmode = \"interrupt\"\n\n[control]\nsocket = \"{}\"\n\n\
         [gateway]\ngroup = \"faults\"\nname = \"{name}\"\nana_groups = [{owns}]\nfailback_delay_ms = 2000\n\n\
         [[listener]]\naddress = \"{addr}\"\nana = {{ {} = \"non-optimized\" }}\n\n\
         [[subsystem]]\nnqn = \"{NQN}\"\nallow_any_host = true\nmin_cntlid = {cntlid}\nmax_cntlid = {}\n\n\
         [[subsystem.namespace]]\nnsid = 1\nana_group = 1\n\
         backend = {{ rbd = {{ pool = \"rbd\", image = \"img0\", ceph_conf = \"{}\" }} }}\n",
        sock.display(),
        3 - owns,
        cntlid + 99,
        ceph_conf.display()
    )
}

impl Rbd {
    /// The cluster and both gateways, serving.
    pub(crate) fn start(dir: &Path, bin: &Path) -> Self {
        let cluster = cluster::Cluster::start("faults");
        let addrs = [cluster::free_addr(), cluster::free_addr()];
        let mut gws = Vec::new();
        for (i, name) in ["a", "b"].into_iter().enumerate() {
            let sock = dir.join(format!("gw-{name}.sock"));
            let path = dir.join(format!("gw-{name}.toml"));
            let text = conf(
                name,
                addrs[i],
                &sock,
                i as u32 + 1,
                i as u32,
                1 + 100 * i as u16,
                &cluster.conf,
            );
            std::fs::write(&path, text).unwrap();
            let mut t = Target {
                bin: bin.to_path_buf(),
                conf: path,
                sock,
                log: dir.join(format!("gw-{name}.log")),
                child: None,
                starts: 0,
                seen: Vec::new(),
            };
            t.start(&[addrs[i]]);
            gws.push(t);
        }
        Self {
            cluster,
            gws,
            addrs,
            paused: [None, None],
            dead: [false, false],
        }
    }

    /// `kill -9` of gateway `i` (every process of it).
    pub(crate) fn kill(&mut self, i: usize) {
        self.cont(i);
        self.gws[i].kill9();
        self.dead[i] = true;
    }

    /// Starts gateway `i` again after a kill.
    pub(crate) fn restart(&mut self, i: usize) {
        if self.dead[i] {
            self.gws[i].start(&[self.addrs[i]]);
            self.dead[i] = false;
        }
    }

    /// SIGSTOP of gateway `i`: a hung VM, its connections open and silent.
    pub(crate) fn pause(&mut self, i: usize) -> bool {
        if self.dead[i] || self.paused[i].is_some() {
            return false;
        }
        let Some(pid) = self.gws[i].pid() else { return false };
        // SAFETY: kill(2) of a gateway process this campaign runs.
        unsafe { libc::kill(pid, libc::SIGSTOP) };
        self.paused[i] = Some(pid);
        true
    }

    /// SIGCONT of gateway `i` if paused (fenced meanwhile, it re-executes itself).
    pub(crate) fn cont(&mut self, i: usize) {
        if let Some(pid) = self.paused[i].take() {
            // SAFETY: kill(2) of a gateway process this campaign runs.
            unsafe { libc::kill(pid, libc::SIGCONT) };
        }
    }

    /// `ci/ceph.sh pause|resume DIR [mon|osd]`.
    pub(crate) fn ceph(&self, verb: &str, which: &str) -> bool {
        let mut c = Command::new("bash");
        c.arg(format!("{}/ci/ceph.sh", cluster::ROOT))
            .arg(verb)
            .arg(&self.cluster.dir);
        if !which.is_empty() {
            c.arg(which);
        }
        c.output().is_ok_and(|o| o.status.success())
    }

    /// Grows the image by `mib` MiB under the running namespace.
    pub(crate) fn grow(&self, mib: u64) -> bool {
        // Bounded: a cluster that does not answer makes it fail, not wait.
        let info = Command::new("timeout")
            .args(["30", "rbd", "-c"])
            .arg(&self.cluster.conf)
            .args(["info", "--format", "json", "rbd/img0"])
            .output();
        let Some(size) = info
            .ok()
            .and_then(|o| serde_json::from_slice::<serde_json::Value>(&o.stdout).ok())
            .and_then(|v| v["size"].as_u64())
        else {
            return false;
        };
        let to = (size >> 20) + mib;
        Command::new("timeout")
            .args(["30", "rbd", "-c"])
            .arg(&self.cluster.conf)
            .args(["resize", "--size", &format!("{to}M"), "rbd/img0"])
            .output()
            .is_ok_and(|o| o.status.success())
    }

    /// Everything back as it was: the cluster running, both gateways serving.
    pub(crate) fn heal(&mut self) {
        self.ceph("resume", "");
        for i in 0..2 {
            self.cont(i);
            self.restart(i);
        }
    }

    /// Both gateways stopped (SIGTERM); whether they stopped cleanly.
    pub(crate) fn stop(&mut self) -> bool {
        self.heal();
        self.gws.iter_mut().map(Target::stop).fold(true, |a, b| a & b)
    }

    /// The gateways' logs, for panics.
    pub(crate) fn logs(&self) -> String {
        self.gws
            .iter()
            .map(|g| std::fs::read_to_string(&g.log).unwrap_or_default())
            .collect()
    }
}
