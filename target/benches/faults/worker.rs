//! A host of the workload: its paths (a controller through one listener each), the commands
//! it keeps in flight, and how each ends in the history.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use pollux_host::history::{self, History, Nanos, Outcome, Stamp};
use pollux_host::{Completion, Controller, ControllerOpts};
use pollux_nvme::spec::Status;
use rand::RngExt;
use rand::rngs::Xoshiro256PlusPlus;

use super::*;

#[derive(Debug, Clone, Copy)]
pub(crate) enum OpKind {
    Write { lba: u64, nlb: u32, id: u64, fua: bool },
    Read { lba: u64, nlb: u32, rs: Nanos },
    Flush { start: Nanos },
}

pub(crate) struct Op {
    pub(crate) kind: OpKind,
    pub(crate) at: Instant,
}

/// What a write's error status says about its effect: refused before it took effect, or
/// unknown. Statuses pollux returns from its checks before the backend sees the command.
pub(crate) fn write_outcome(s: Status) -> Outcome {
    pub(crate) const REFUSED: [Status; 7] = [
        Status::RESERVATION_CONFLICT,
        Status::INVALID_NAMESPACE,
        Status::INVALID_FIELD,
        Status::LBA_OUT_OF_RANGE,
        Status::ANA_INACCESSIBLE,
        Status::ANA_PERSISTENT_LOSS,
        Status::ANA_TRANSITION,
    ];
    let plain = Status::new(s.sct(), s.sc());
    if REFUSED.contains(&plain) {
        Outcome::Refused
    } else {
        Outcome::Unknown
    }
}

/// One path of a worker: a controller through one listener, its commands in flight.
pub(crate) struct PathState {
    pub(crate) addr: usize,
    pub(crate) ctrl: Option<Controller>,
    pub(crate) next_try: Instant,
    /// No new commands on this path until then: it answered that it cannot serve them now
    /// (an inaccessible ANA group, a masked namespace), and a host's path selector backs
    /// off rather than spin on the refusals.
    pub(crate) hold: Instant,
    pub(crate) pending: HashMap<u64, Op>,
    pub(crate) tag: u64,
}

pub(crate) struct Worker {
    pub(crate) c: Arc<Shared>,
    pub(crate) w: usize,
    pub(crate) ns: usize,
    pub(crate) nsid: u32,
    pub(crate) nqn: &'static str,
    pub(crate) blocks: u64,
    pub(crate) rng: Xoshiro256PlusPlus,
    pub(crate) paths: Vec<PathState>,
    pub(crate) turn: usize,
    /// Sends on its first live path only (a multipath host on ANA: the optimized gateway
    /// while it serves), the next one while the first refuses or is gone.
    pub(crate) prefer_first: bool,
    /// How long a command may be outstanding before it is a hang.
    pub(crate) hang: Duration,
}

impl Worker {
    pub(crate) fn connect(&mut self, p: usize) {
        let now = Instant::now();
        let path = &mut self.paths[p];
        if path.ctrl.is_some() || now < path.next_try {
            return;
        }
        let mut o = ControllerOpts::new(self.nqn, &host_nqn(self.w), 1, 64);
        // Short: while it waits, its other path sends nothing (one thread per host).
        o.timeout = Duration::from_secs(1);
        match Controller::connect_with(self.c.addrs[path.addr], &o) {
            Ok(ctrl) => {
                self.c.counts.connects.fetch_add(1, Ordering::Relaxed);
                path.ctrl = Some(ctrl);
            }
            Err(_) => {
                self.c.counts.connect_failures.fetch_add(1, Ordering::Relaxed);
                path.next_try = now + Duration::from_millis(100 + self.rng.random_range(0..200));
            }
        }
    }

    /// The path's connection is gone: what it had in flight ends unknown.
    pub(crate) fn drop_path(&mut self, p: usize) {
        let path = &mut self.paths[p];
        path.ctrl = None;
        path.next_try = Instant::now() + Duration::from_millis(self.rng.random_range(0..100));
        let t = self.c.now();
        let ops: Vec<Op> = path.pending.drain().map(|(_, o)| o).collect();
        let mut h = self.c.hist[self.ns].lock().unwrap();
        for op in ops {
            if let OpKind::Write { lba, nlb, id, .. } = op.kind {
                h.end_write(lba, nlb, id, t, Outcome::Unknown);
                self.c.counts.writes_unknown.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.publish_floor(&h);
    }

    /// The oldest outstanding read's start (MAX: none), published under the history lock.
    pub(crate) fn publish_floor(&self, _h: &History) {
        let floor = self
            .paths
            .iter()
            .flat_map(|p| p.pending.values())
            .filter_map(|o| match o.kind {
                OpKind::Read { rs, .. } => Some(rs),
                _ => None,
            })
            .min()
            .unwrap_or(u64::MAX);
        self.c.read_floor[self.w].store(floor, Ordering::SeqCst);
    }

    pub(crate) fn submit(&mut self, p: usize) -> bool {
        let block = self.c.block;
        let roll = self.rng.random_range(0..100u32);
        let path = &mut self.paths[p];
        let Some(ctrl) = path.ctrl.as_mut() else { return false };
        let q = &mut ctrl.io[0];
        path.tag += 1;
        let tag = path.tag;
        let (kind, r) = if roll < 55 {
            let nlb = self.rng.random_range(1..=8u32);
            let lba = self.rng.random_range(0..=self.blocks - u64::from(nlb));
            let id = self.c.next_id.fetch_add(1, Ordering::Relaxed);
            let fua = self.rng.random_range(0..10) == 0;
            let mut buf = vec![0u8; nlb as usize * block];
            history::fill(
                &mut buf,
                lba,
                block,
                Stamp {
                    ns: self.ns as u32,
                    write_id: id,
                    writer: self.w as u32,
                },
            );
            self.c.hist[self.ns]
                .lock()
                .unwrap()
                .begin_write(lba, nlb, id, self.w as u32, self.c.now());
            let mut sqe = pollux_host::sqe::write(self.nsid, lba, nlb);
            if fua {
                sqe.cdw12.set(sqe.cdw12.get() | 1 << 30);
            }
            let r = q.submit(sqe, pollux_host::Data::ToCtrl(buf), tag);
            (OpKind::Write { lba, nlb, id, fua }, r)
        } else if roll < 95 {
            let nlb = self.rng.random_range(1..=16u32);
            let lba = self.rng.random_range(0..=self.blocks - u64::from(nlb));
            let rs = {
                let h = self.c.hist[self.ns].lock().unwrap();
                let rs = self.c.now();
                self.c.read_floor[self.w].fetch_min(rs, Ordering::SeqCst);
                drop(h);
                rs
            };
            let r = q.submit_read(self.nsid, lba, nlb, vec![0u8; nlb as usize * block], tag);
            (OpKind::Read { lba, nlb, rs }, r)
        } else {
            let start = self.c.now();
            (
                OpKind::Flush { start },
                q.submit(pollux_host::sqe::flush(self.nsid), pollux_host::Data::None, tag),
            )
        };
        path.pending.insert(
            tag,
            Op {
                kind,
                at: Instant::now(),
            },
        );
        if r.is_err() {
            self.drop_path(p);
            return false;
        }
        true
    }

    pub(crate) fn complete(&mut self, p: usize, cpl: Completion) {
        if !cpl.is_success() {
            let back_off = Duration::from_millis(self.rng.random_range(1..10));
            self.paths[p].hold = Instant::now() + back_off;
        }
        let Some(op) = self.paths[p].pending.remove(&cpl.tag) else {
            return;
        };
        let t = self.c.now();
        let c = Arc::clone(&self.c);
        match op.kind {
            OpKind::Write { lba, nlb, id, fua } => {
                let outcome = if cpl.is_success() {
                    c.counts.writes_acked.fetch_add(1, Ordering::Relaxed);
                    Outcome::Acked { fua }
                } else {
                    c.status("write", cpl.status);
                    let o = write_outcome(cpl.status);
                    let n = if o == Outcome::Refused {
                        &c.counts.writes_refused
                    } else {
                        &c.counts.writes_unknown
                    };
                    n.fetch_add(1, Ordering::Relaxed);
                    o
                };
                c.hist[self.ns].lock().unwrap().end_write(lba, nlb, id, t, outcome);
            }
            OpKind::Read { lba, nlb, rs } => {
                let h = c.hist[self.ns].lock().unwrap();
                if cpl.is_success() && cpl.buf.len() == nlb as usize * c.block {
                    c.counts.reads_checked.fetch_add(1, Ordering::Relaxed);
                    for (i, b) in cpl.buf.chunks_exact(c.block).enumerate() {
                        c.counts.blocks_checked.fetch_add(1, Ordering::Relaxed);
                        if let Err(v) = h.check(lba + i as u64, b, rs, t) {
                            c.violation(v);
                        }
                    }
                } else {
                    c.counts.reads_failed.fetch_add(1, Ordering::Relaxed);
                    c.status("read", cpl.status);
                }
                self.publish_floor(&h);
            }
            OpKind::Flush { start } => {
                if cpl.is_success() {
                    c.counts.flushes.fetch_add(1, Ordering::Relaxed);
                    c.hist[self.ns].lock().unwrap().flushed(start, t);
                } else {
                    c.status("flush", cpl.status);
                }
            }
        }
    }

    pub(crate) fn poll(&mut self, p: usize, wait: Duration) {
        let mut done = Vec::new();
        let r = match self.paths[p].ctrl.as_mut() {
            Some(ctrl) => ctrl.io[0].poll_completions(Some(wait), |c| done.push(c)),
            None => return,
        };
        for c in done {
            self.complete(p, c);
        }
        if r.is_err() {
            self.drop_path(p);
            return;
        }
        let oldest = self.paths[p].pending.values().map(|o| o.at).min();
        if let Some(at) = oldest.filter(|at| at.elapsed() > self.hang) {
            self.c.counts.hangs.fetch_add(1, Ordering::Relaxed);
            let what = self.paths[p].pending.values().find(|o| o.at == at).map(|o| o.kind);
            let mut g = self.c.hang_first.lock().unwrap();
            let first = g.is_none();
            // Where to look in the target's log: when it was sent (UTC) and on which
            // controller and connection (the I/O queue's local port).
            let port = self.paths[p]
                .ctrl
                .as_ref()
                .and_then(|c| c.io[0].local_addr().ok())
                .map_or(0, |a| a.port());
            if first {
                let sent = std::time::SystemTime::now() - at.elapsed();
                let ms = sent
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_millis()
                    % 86_400_000;
                let conn = self.paths[p].ctrl.as_ref().map(|c| {
                    format!(
                        "cntlid {}, I/O queue from port {port}, {} in flight",
                        c.cntlid,
                        c.io[0].in_flight()
                    )
                });
                let s = format!(
                    "host {} via {}: {:?} outstanding for {:?}, sent at {:02}:{:02}:{:02}.{:03} UTC on {}",
                    self.w,
                    self.c.addrs[self.paths[p].addr],
                    what,
                    at.elapsed(),
                    ms / 3_600_000,
                    ms / 60_000 % 60,
                    ms / 1000 % 60,
                    ms % 1000,
                    conn.unwrap_or_default()
                );
                eprintln!("faults: HANG {s}");
                *g = Some(s);
            }
            // The diagnostics take seconds (an upgrade waits up to 5 s for its queues): not
            // under the lock every other host's hang takes.
            drop(g);
            if first && !self.c.nss[self.ns].gateway {
                eprintln!("faults: HANG: the connection's sockets (ss): {}", sockets(port));
                eprintln!(
                    "faults: HANG: the disk (a write and fdatasync beside the file namespace): {}",
                    self.c.disk_since(at)
                );
                let (f, began) = *self.c.nemesis_log.lock().unwrap();
                eprintln!(
                    "faults: HANG: the nemesis's last fault: {f}, begun {:?} ago",
                    began.elapsed()
                );
                eprintln!("faults: HANG: what the target holds: {}", self.c.held_by_target());
            }
            self.drop_path(p);
        }
    }

    pub(crate) fn order(&mut self) {
        let o = self.c.orders[self.w].swap(0, Ordering::Relaxed);
        if o == 0 {
            return;
        }
        let live: Vec<usize> = (0..self.paths.len())
            .filter(|&p| self.paths[p].ctrl.is_some())
            .collect();
        if live.is_empty() {
            return;
        }
        let p = live[self.rng.random_range(0..live.len())];
        if o == 2 {
            // A controller reset as a host does it: CC.EN cleared with commands in flight
            // (NVMe 2.0 §3.7.2), then the queues are gone and it connects anew.
            if let Some(ctrl) = self.paths[p].ctrl.as_mut() {
                let _ = ctrl.admin.property_set(0x14, 0);
            }
        }
        // Either way the connection is closed under the commands in flight.
        self.drop_path(p);
    }

    pub(crate) fn run(mut self) {
        while !self.c.stop.load(Ordering::Relaxed) {
            self.order();
            for p in 0..self.paths.len() {
                self.connect(p);
            }
            let live: Vec<usize> = (0..self.paths.len())
                .filter(|&p| self.paths[p].ctrl.is_some())
                .collect();
            if live.is_empty() {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            self.turn += 1;
            let p = if self.prefer_first {
                let now = Instant::now();
                live.iter()
                    .copied()
                    .find(|&p| now >= self.paths[p].hold)
                    .unwrap_or(live[0])
            } else {
                live[self.turn % live.len()]
            };
            while self.paths[p].pending.len() < QD
                && self.paths[p].ctrl.is_some()
                && Instant::now() >= self.paths[p].hold
            {
                if !self.submit(p) {
                    break;
                }
            }
            for &q in &live {
                self.poll(q, Duration::from_millis(2));
            }
        }
        // Drain: what is in flight completes (or ends unknown).
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until && self.paths.iter().any(|p| !p.pending.is_empty()) {
            for p in 0..self.paths.len() {
                self.poll(p, Duration::from_millis(5));
            }
        }
        for p in 0..self.paths.len() {
            if !self.paths[p].pending.is_empty() {
                self.drop_path(p);
            }
            if let Some(ctrl) = self.paths[p].ctrl.take() {
                let _ = ctrl.shutdown();
            }
        }
    }
}

/// Both ends of the connection from local `port`, as the kernel sees them (`ss`): bytes
/// queued unread (Recv-Q) and unsent (Send-Q) on either side say who stopped.
fn sockets(port: u16) -> String {
    let filter = format!("( sport = :{port} or dport = :{port} )");
    match std::process::Command::new("ss")
        .args(["-tnio", "state", "all", &filter])
        .output()
    {
        Ok(o) => String::from_utf8_lossy(&o.stdout)
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" "),
        Err(e) => format!("cannot run ss: {e}"),
    }
}
