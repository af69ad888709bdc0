//! Which reactor a new connection (an NVMe-oF queue) goes to.
//!
//! The listeners accept on reactor 0 and hand each socket to a reactor at once, before its
//! ICReq and Connect say which controller it will belong to (moving a live connection later
//! would carry its TLS session and buffers across threads). What is known then is the
//! reactors' measured load and the host's address, and a host connects one controller's
//! queues one after another from one address (the Linux host: the admin queue, then I/O
//! queues 1..N, each waiting for the previous Connect). So [`Placement::Measured`] places a
//! connection on the reactor of least score, where the score is the reactor's load (its busy
//! share, its share of the commands per second and of the open queues, sampled every
//! [`SAMPLE_EVERY`]) plus [`SAME_HOST_WEIGHT`] for each open connection from the same
//! address already there. A controller's queues then spread over the reactors (round robin
//! would stack them on one reactor whenever two hosts connect at once: SPDK #3137, #2636),
//! and a reactor kept busy by another tenant takes new queues only when the others are as
//! loaded.
//!
//! Only I/O queues count among a host's: an admin queue stops counting once its Connect
//! says what it is ([`Placed::uncount`]), before the host connects its I/O queues.
//!
//! The per-address counts live in handles the connections keep ([`Placed`]) and give back
//! as they drop, on whatever reactor they close; the listeners' reactor alone reads and
//! prunes the table (its reactor-local state: no lock).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::Relaxed};
use std::time::{Duration, Instant};

use pollux_conf::Placement;

use crate::shared::Shared;

/// Score of one open connection from the same host address on a reactor, in the units of
/// [`ReactorLoad::score`] (per mille of a reactor's busy share): half a fully busy reactor.
/// A host's queues spread over idle reactors; next to a reactor saturated by another tenant
/// (1000 busy + 500 of commands) the idle one takes three of them before the busy one
/// takes one.
pub const SAME_HOST_WEIGHT: u64 = 500;
/// How often the reactors' load is sampled (at most: only when a connection arrives).
pub const SAMPLE_EVERY: Duration = Duration::from_millis(200);
/// Addresses kept in the table before the ones with no open connection are pruned.
const PRUNE_AT: usize = 4096;

/// A reactor's load as placement sees it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReactorLoad {
    /// Busy share over the last window, per mille (iterations that found work / wall time).
    pub busy_permille: u64,
    /// Commands ended per second over the last window.
    pub cmds_per_s: u64,
    /// Open connections (queues) now.
    pub queues: u64,
    /// Open connections from the new connection's host address.
    pub same_host: u64,
}

impl ReactorLoad {
    /// The reactor's score among `all` (lower is better): busy share (0-1000), half its share
    /// of the commands per second (0-500), a quarter of its share of the open queues (0-250),
    /// and [`SAME_HOST_WEIGHT`] per connection of the same host.
    pub fn score(&self, all: &[ReactorLoad]) -> u64 {
        let share = |mine: u64, total: u64| (mine * 1000).checked_div(total).unwrap_or(0);
        let cmds: u64 = all.iter().map(|l| l.cmds_per_s).sum();
        let queues: u64 = all.iter().map(|l| l.queues).sum();
        self.busy_permille.min(1000)
            + share(self.cmds_per_s, cmds) / 2
            + share(self.queues, queues) / 4
            + SAME_HOST_WEIGHT * self.same_host
    }
}

/// The reactor of least score among `loads`; ties go to the first from `start` on (in turn,
/// so that equal reactors share arrivals).
pub fn choose(loads: &[ReactorLoad], start: usize) -> usize {
    let n = loads.len();
    if n == 0 {
        return 0;
    }
    let mut best = start % n;
    let mut best_score = loads[best].score(loads);
    for k in 1..n {
        let i = (start + k) % n;
        let s = loads[i].score(loads);
        if s < best_score {
            (best, best_score) = (i, s);
        }
    }
    best
}

/// Open connections from one host address, per reactor.
#[derive(Debug)]
pub struct HostConns {
    per_reactor: Box<[AtomicU32]>,
}

/// A connection's place: kept by the connection, it counts it among its host address's on
/// its reactor until it drops, or until it turns out to be an admin queue
/// ([`Placed::uncount`]).
#[derive(Debug)]
pub struct Placed {
    host: Arc<HostConns>,
    reactor: usize,
    counted: AtomicBool,
}

impl Placed {
    /// The connection is an admin queue: it no longer counts among its host's, so that the
    /// host's I/O queues, which carry the I/O, spread evenly (with the admin queue counted
    /// a host's 4 I/O queues on 2 reactors would often go 3 and 1).
    pub fn uncount(&self) {
        if self.counted.swap(false, Relaxed)
            && let Some(c) = self.host.per_reactor.get(self.reactor)
        {
            c.fetch_sub(1, Relaxed);
        }
    }
}

impl Drop for Placed {
    fn drop(&mut self) {
        self.uncount();
    }
}

/// The reactors' counters at one instant.
#[derive(Debug, Clone)]
struct Sample {
    at: Instant,
    busy_ns: Vec<u64>,
    ended: Vec<u64>,
}

/// The placement state of the listeners' reactor (reactor-local: every listener of the
/// target places through it, so that they see one another's connections).
#[derive(Debug, Default)]
pub struct Placer {
    next: usize,
    hosts: HashMap<IpAddr, Arc<HostConns>>,
    last: Option<Sample>,
    /// Busy share and commands per second of each reactor over the last window.
    rates: Vec<(u64, u64)>,
}

impl Placer {
    /// The reactor for a new connection from `peer` under `how`, and its place handle
    /// ([`Placed`], for [`Placement::Measured`]). Counts the connection in
    /// [`Shared::conns_per_reactor`].
    pub fn place(&mut self, how: Placement, shared: &Shared, peer: IpAddr) -> (usize, Option<Placed>) {
        let n = shared.reactors.max(1);
        let (target, placed) = match how {
            Placement::RoundRobin => {
                self.next = (self.next + 1) % n;
                (self.next, None)
            }
            Placement::LeastLoaded => (
                (0..n)
                    .min_by_key(|&i| shared.conns_per_reactor[i].load(Relaxed))
                    .unwrap_or(0),
                None,
            ),
            Placement::Measured => {
                self.sample(shared, Instant::now());
                let host = self.host(peer, n);
                let loads: Vec<ReactorLoad> = (0..n)
                    .map(|i| {
                        let (busy_permille, cmds_per_s) = self.rates.get(i).copied().unwrap_or_default();
                        ReactorLoad {
                            busy_permille,
                            cmds_per_s,
                            queues: shared.conns_per_reactor[i].load(Relaxed),
                            same_host: u64::from(host.per_reactor[i].load(Relaxed)),
                        }
                    })
                    .collect();
                self.next = (self.next + 1) % n;
                let target = choose(&loads, self.next);
                host.per_reactor[target].fetch_add(1, Relaxed);
                let placed = Placed {
                    host,
                    reactor: target,
                    counted: AtomicBool::new(true),
                };
                (target, Some(placed))
            }
        };
        shared.conns_per_reactor[target].fetch_add(1, Relaxed);
        (target, placed)
    }

    /// The counts of `peer`'s connections (pruning the addresses with none left when the
    /// table is large: a storm from many addresses does not grow it forever).
    fn host(&mut self, peer: IpAddr, n: usize) -> Arc<HostConns> {
        if self.hosts.len() >= PRUNE_AT && !self.hosts.contains_key(&peer) {
            self.hosts.retain(|_, h| Arc::strong_count(h) > 1);
        }
        self.hosts
            .entry(peer)
            .or_insert_with(|| {
                Arc::new(HostConns {
                    per_reactor: (0..n).map(|_| AtomicU32::new(0)).collect(),
                })
            })
            .clone()
    }

    /// Take a new sample of the reactors' counters if the last is [`SAMPLE_EVERY`] old, and
    /// the rates over the window since.
    fn sample(&mut self, shared: &Shared, now: Instant) {
        if self.last.as_ref().is_some_and(|s| now - s.at < SAMPLE_EVERY) {
            return;
        }
        let Some(cells) = shared.stats_cells.get() else {
            return;
        };
        let cur = Sample {
            at: now,
            busy_ns: cells.iter().map(|c| c.booked_busy_ns()).collect(),
            ended: shared.requests.iter().map(|q| q.snapshot().ended).collect(),
        };
        if let Some(prev) = &self.last {
            let wall = (cur.at - prev.at).as_nanos().max(1) as u64;
            self.rates = (0..cur.busy_ns.len())
                .map(|i| {
                    let busy = cur.busy_ns[i].saturating_sub(prev.busy_ns.get(i).copied().unwrap_or(0));
                    let ended = cur
                        .ended
                        .get(i)
                        .copied()
                        .unwrap_or(0)
                        .saturating_sub(prev.ended.get(i).copied().unwrap_or(0));
                    (
                        (busy.saturating_mul(1000) / wall).min(1000),
                        ended.saturating_mul(1_000_000_000) / wall,
                    )
                })
                .collect();
        }
        self.last = Some(cur);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn idle(n: usize) -> Vec<ReactorLoad> {
        vec![ReactorLoad::default(); n]
    }

    /// Places `queues` connections of one host, one after another, on `loads` (counting
    /// each), and says how many went to each reactor.
    fn connect_host(loads: &mut [ReactorLoad], queues: usize, start: &mut usize) -> Vec<u64> {
        let mut got = vec![0; loads.len()];
        for l in loads.iter_mut() {
            l.same_host = 0;
        }
        for _ in 0..queues {
            *start += 1;
            let i = choose(loads, *start);
            loads[i].queues += 1;
            loads[i].same_host += 1;
            got[i] += 1;
        }
        got
    }

    #[test]
    fn one_hosts_queues_spread_over_idle_reactors() {
        let mut loads = idle(4);
        let mut start = 0;
        // The admin queue and 8 I/O queues: at most one more on any reactor than another.
        let got = connect_host(&mut loads, 9, &mut start);
        assert_eq!(got.iter().sum::<u64>(), 9);
        assert!(got.iter().max().unwrap() - got.iter().min().unwrap() <= 1, "{got:?}");
    }

    #[test]
    fn two_hosts_connecting_at_once_both_spread() {
        // Interleaved arrivals, A B A B ...: round robin on two reactors puts every queue of
        // A on one reactor and every queue of B on the other.
        let mut loads = idle(2);
        let (mut a, mut b) = (vec![0u64; 2], vec![0u64; 2]);
        let mut start = 0;
        for k in 0..10 {
            start += 1;
            let mine = if k % 2 == 0 { &mut a } else { &mut b };
            for (i, l) in loads.iter_mut().enumerate() {
                l.same_host = mine[i];
            }
            let i = choose(&loads, start);
            loads[i].queues += 1;
            mine[i] += 1;
        }
        for h in [&a, &b] {
            assert!(h[0] >= 2 && h[1] >= 2, "a host's queues on one reactor: {h:?}");
        }
    }

    #[test]
    fn a_saturated_reactor_takes_new_queues_last() {
        let mut loads = idle(2);
        // Reactor 1 serves another tenant flat out.
        loads[1] = ReactorLoad {
            busy_permille: 1000,
            cmds_per_s: 200_000,
            queues: 4,
            same_host: 0,
        };
        let mut start = 0;
        let got = connect_host(&mut loads, 6, &mut start);
        // Most go to the idle reactor, but not all: a host's queues on one reactor
        // contend there too.
        assert_eq!(got, vec![5, 1]);
    }

    #[test]
    fn load_is_measured_not_counted() {
        // Two reactors with one queue each, one of them busy: the next host goes to the idle.
        let mut loads = idle(2);
        loads[0].queues = 1;
        loads[1].queues = 1;
        loads[0].busy_permille = 600;
        loads[0].cmds_per_s = 100_000;
        loads[1].cmds_per_s = 10;
        for start in 0..4 {
            assert_eq!(choose(&loads, start), 1);
        }
    }

    #[test]
    fn ties_rotate() {
        let loads = idle(3);
        let picks: Vec<usize> = (0..3).map(|s| choose(&loads, s)).collect();
        assert_eq!(picks, vec![0, 1, 2]);
        assert_eq!(choose(&[], 5), 0);
    }

    #[test]
    fn places_drop_their_counts_and_the_table_is_pruned() {
        let shared = crate::shared::test_shared(2);
        let mut p = Placer::default();
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        let (a, pa) = p.place(Placement::Measured, &shared, ip);
        let (b, pb) = p.place(Placement::Measured, &shared, ip);
        assert_ne!(a, b, "one host's two queues on two idle reactors");
        assert_eq!(shared.conns_per_reactor[a].load(Relaxed), 1);
        let host = p.hosts[&ip].clone();
        assert_eq!(host.per_reactor[a].load(Relaxed), 1);
        drop(pa);
        drop(pb);
        assert_eq!(host.per_reactor[a].load(Relaxed) + host.per_reactor[b].load(Relaxed), 0);
        drop(host);
        for k in 0..PRUNE_AT as u32 {
            let ip = IpAddr::from(std::net::Ipv4Addr::from(0x0A00_0000 + k));
            let _ = p.place(Placement::Measured, &shared, ip);
        }
        let _ = p.place(Placement::Measured, &shared, "192.0.2.9".parse().unwrap());
        assert!(
            p.hosts.len() < 16,
            "addresses with no connection pruned: {}",
            p.hosts.len()
        );
    }
}
