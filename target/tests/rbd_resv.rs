//! Reservations of an RBD image kept in its cluster, for every gateway (NVMe 2.0 §8.19),
//! against a real Ceph cluster (`ci/ceph.sh`): two gateways over one image, hosts connected
//! to either; the same results whichever gateway a command arrives at; a host that is one
//! host on both gateways; changes racing from both gateways, none lost; Preempt and Abort
//! fencing writes in flight on the other gateway; a gateway killed with SIGKILL holding up
//! nothing for long and finding the state again at restart; a cluster that cannot be seen
//! admitting no I/O, then catching up; a gateway upgraded with `pollux ctl upgrade` keeping
//! its hosts, their reservation and the image (the old process lets go of its lock).
//!
//! Needs Ceph (`ci/test` installs it); without it the tests say so and pass, unless
//! `POLLUX_REQUIRE_CEPH=1`.
#![allow(clippy::unwrap_used)]

mod common;

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::Child;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::ceph::Ceph;
use pollux_conf::Config;
use pollux_host::{Controller, Data, Digests, sqe};
use pollux_nvme::spec::Status;
use pollux_target::{Options, Target};

const SUB: &str = "nqn.2026-12.io.pollux:gw-resv";
const HOST_1: &str = "nqn.2014-08.org.nvmexpress:uuid:11111111-0000-4000-8000-000000000001";
const HOST_2: &str = "nqn.2014-08.org.nvmexpress:uuid:22222222-0000-4000-8000-000000000002";

const REGISTER: u32 = 0;
const UNREGISTER: u32 = 1;
const REPLACE: u32 = 2;
const ACQUIRE: u32 = 0;
const PREEMPT: u32 = 1;
const PREEMPT_ABORT: u32 = 2;
const RELEASE: u32 = 0;
const WE: u8 = 1;

const OK: (u8, u8) = (0, 0);
const CONFLICT: (u8, u8) = (0, 0x83);
/// Asymmetric Access Transition: a path status (retryable, and a multipath host tries
/// another gateway).
const NOT_READY: (u8, u8) = (3, 3);

fn conf(ceph: &Ceph, listen: SocketAddr, image: &str, cntlid_base: u16) -> String {
    // Distinct controller ID ranges: one host's controllers on both gateways are one NVM
    // subsystem's (NVMe-oF 1.1 §4.2).
    format!(
        "[reactors]\ncores = [0]\nmode = \"interrupt\"\n[[listener]]\naddress = \"{listen}\"\n\
         [[subsystem]]\nnqn = \"{SUB}\"\nallow_any_host = true\nmin_cntlid = {cntlid_base}\nmax_cntlid = {}\n\
         [[subsystem.namespace]]\nnsid = 1\nbackend = {{ rbd = {{ pool = \"rbd\", image = \"{image}\", ceph_conf = \"{}\", op_timeout_s = 10 }} }}\n",
        cntlid_base + 999,
        ceph.conf.display()
    )
}

fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

fn gateway(ceph: &Ceph, image: &str, cntlid_base: u16) -> (Target, SocketAddr) {
    let addr = free_addr();
    let cfg = Config::parse(&conf(ceph, addr, image, cntlid_base), "gw.toml").unwrap();
    let t = Target::start(&cfg, Options { pin: false }).unwrap();
    let a = t.listen_addrs()[0];
    (t, a)
}

/// A gateway as its own process, killed with SIGKILL when dropped (a test that fails midway
/// leaves none behind).
struct GatewayProcess(Child);

impl GatewayProcess {
    fn kill9(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        self.kill9();
    }
}

fn gateway_process(ceph: &Ceph, image: &str, addr: SocketAddr, cntlid_base: u16) -> GatewayProcess {
    let path = ceph.dir.join(format!("gw-{}.toml", addr.port()));
    GatewayProcess(common::spawn_pollux(
        env!("CARGO_BIN_EXE_pollux"),
        &path,
        &conf(ceph, addr, image, cntlid_base),
        addr,
    ))
}

fn host(addr: SocketAddr, nqn: &str) -> Controller {
    let mut c = Controller::connect(addr, SUB, nqn, 1, 32, Digests::NONE).unwrap();
    // A change waits up to the notify timeout for a gateway killed a moment ago; hosts'
    // own command timeouts are 30 s (Linux's default).
    c.io[0].set_timeout(Duration::from_secs(30));
    c
}

fn sc(s: Status) -> (u8, u8) {
    (s.sct(), s.sc())
}

fn run(c: &mut Controller, s: pollux_nvme::spec::Sqe, d: Data) -> (u8, u8) {
    sc(c.io[0].exec(s, d).unwrap().status)
}

fn register(c: &mut Controller, action: u32, crkey: u64, nrkey: u64) -> (u8, u8) {
    run(
        c,
        sqe::resv_register(1, action, false, 0),
        Data::ToCtrl(sqe::resv_keys(&[crkey, nrkey])),
    )
}

fn acquire(c: &mut Controller, action: u32, rtype: u8, crkey: u64, prkey: u64) -> (u8, u8) {
    run(
        c,
        sqe::resv_acquire(1, action, rtype),
        Data::ToCtrl(sqe::resv_keys(&[crkey, prkey])),
    )
}

fn release(c: &mut Controller, rtype: u8, crkey: u64) -> (u8, u8) {
    run(
        c,
        sqe::resv_release(1, RELEASE, rtype),
        Data::ToCtrl(sqe::resv_keys(&[crkey])),
    )
}

fn write(c: &mut Controller, lba: u64, fill: u8) -> (u8, u8) {
    run(c, sqe::write(1, lba, 1), Data::ToCtrl(vec![fill; 512]))
}

/// Reservation Report, extended: (generation, type, registrants (host id, key, holds)).
#[allow(clippy::type_complexity)]
fn report(c: &mut Controller) -> Result<(u32, u8, Vec<([u8; 16], u64, bool)>), (u8, u8)> {
    let done = c.io[0]
        .exec(sqe::resv_report(1, 8192, true), Data::FromCtrl(vec![0; 8192]))
        .unwrap();
    if !done.is_success() {
        return Err(sc(done.status));
    }
    let b = done.buf;
    let n = u16::from_le_bytes([b[5], b[6]]) as usize;
    let regs = (0..n)
        .map(|i| {
            let e = &b[64 + i * 64..128 + i * 64];
            let mut id = [0u8; 16];
            id.copy_from_slice(&e[16..32]);
            (id, u64::from_le_bytes(e[8..16].try_into().unwrap()), e[2] & 1 == 1)
        })
        .collect();
    Ok((u32::from_le_bytes(b[0..4].try_into().unwrap()), b[4], regs))
}

/// The Reservation Notification log page: (count, type).
fn notification(c: &mut Controller) -> (u64, u8) {
    let p = c.admin.get_log_page(0x80, 0, 64).unwrap();
    (u64::from_le_bytes(p[0..8].try_into().unwrap()), p[8])
}

fn id(nqn: &str) -> [u8; 16] {
    pollux_host::hostid_from_nqn(nqn)
}

fn ctx(t: &Target) -> pollux_target::control::rpc::Ctx {
    let cfg = Config::parse(
        "[reactors]\ncores = [0]\n[[listener]]\naddress = \"127.0.0.1:0\"\n",
        "ctx.toml",
    )
    .unwrap();
    pollux_target::control::rpc::Ctx::new(t, &cfg.reactors)
}

/// The `ctl subsystems` view's RESV column for namespace 1.
fn kept(t: &Target) -> String {
    ctx(t)
        .subsystems()
        .iter()
        .find(|s| s.nqn == SUB)
        .and_then(|s| s.namespaces.first())
        .map(|n| n.reservations.clone())
        .unwrap()
}

/// Poll `f` until it is true, up to `limit`.
fn until(limit: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < deadline, "not within {limit:?}: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn reservations_hold_across_gateways() {
    let Some(ceph) = Ceph::start("gw-resv") else { return };
    // Gateway A, its own process; gateway B, in this one.
    let a_addr = free_addr();
    let mut a = gateway_process(&ceph, "img0", a_addr, 1);
    let (b, b_addr) = gateway(&ceph, "img0", 1001);
    assert_eq!(kept(&b), "cluster");

    let mut h1a = host(a_addr, HOST_1);
    let mut h1b = host(b_addr, HOST_1);
    let mut h2b = host(b_addr, HOST_2);

    // Host 1 registers through A: through B it is registered (one host, its host identifier).
    assert_eq!(register(&mut h1a, REGISTER, 0, 0x1A), OK);
    let (generation, _, regs) = report(&mut h2b).unwrap();
    assert_eq!((generation, regs.clone()), (1, vec![(id(HOST_1), 0x1A, false)]));
    assert_eq!(
        register(&mut h1b, REGISTER, 0, 0x1B),
        (0, 0x83),
        "registering again with another key conflicts, through either gateway"
    );

    // Write Exclusive through A: host 2 writes through B conflict, its reads do not; host
    // 1 writes through B (it holds it there too); the report through B names the holder.
    assert_eq!(acquire(&mut h1a, ACQUIRE, WE, 0x1A, 0), OK);
    assert_eq!(write(&mut h2b, 10, 0x22), CONFLICT, "host 2 writes through B under WE");
    assert_eq!(run(&mut h2b, sqe::read(1, 10, 1), Data::FromCtrl(vec![0; 512])), OK);
    assert_eq!(write(&mut h1b, 10, 0x11), OK, "the holder writes through B");
    let (_, rtype, regs) = report(&mut h2b).unwrap();
    assert_eq!((rtype, regs), (WE, vec![(id(HOST_1), 0x1A, true)]));

    // Host 2 registers and preempts through B: host 1's next write through A conflicts,
    // and A's controller of host 1 has its notification (registration preempted).
    assert_eq!(register(&mut h2b, REGISTER, 0, 0x2B), OK);
    assert_eq!(acquire(&mut h2b, PREEMPT, WE, 0x2B, 0x1A), OK);
    assert_eq!(
        write(&mut h1a, 11, 0x11),
        CONFLICT,
        "host 1, preempted through B, writes through A"
    );
    assert_eq!(register(&mut h1a, REGISTER, 0, 0x1C), OK, "host 1 registers again");
    let (count, typ) = notification(&mut h1a);
    assert!(
        count >= 1 && typ == 1,
        "registration preempted on A: count {count}, type {typ}"
    );
    let (generation, rtype, regs) = report(&mut h1a).unwrap();
    assert_eq!(rtype, WE);
    assert!(regs.contains(&(id(HOST_2), 0x2B, true)), "{regs:?}");
    assert_eq!(
        generation, 4,
        "register, register, preempt, register: each counted once"
    );

    // Gateway A killed with SIGKILL: a change through B waits for it at most the notify
    // timeout, then completes.
    a.kill9();
    drop(h1a);
    let t0 = Instant::now();
    assert_eq!(register(&mut h2b, REPLACE, 0x2B, 0x2C), OK);
    let took = t0.elapsed();
    assert!(
        took < Duration::from_secs(12),
        "a change with a killed gateway's watch left took {took:?}"
    );

    // A again: the state is intact, and enforced.
    let mut a = gateway_process(&ceph, "img0", a_addr, 1);
    let mut h1a = host(a_addr, HOST_1);
    assert_eq!(write(&mut h1a, 12, 0x11), CONFLICT, "after A's restart");
    let (generation, rtype, regs) = report(&mut h1a).unwrap();
    assert_eq!((generation, rtype), (5, WE));
    assert!(regs.contains(&(id(HOST_2), 0x2C, true)), "{regs:?}");

    // Release through B, unregister through either.
    assert_eq!(release(&mut h2b, WE, 0x2C), OK);
    assert_eq!(write(&mut h1a, 12, 0x11), OK, "nothing held");
    assert_eq!(register(&mut h1a, UNREGISTER, 0x1C, 0), OK);
    let mut h2a = host(a_addr, HOST_2);
    assert_eq!(register(&mut h2a, UNREGISTER, 0x2C, 0), OK);
    let (generation, rtype, regs) = report(&mut h1b).unwrap();
    assert_eq!((generation, rtype, regs.len()), (7, 0, 0));

    // The cluster cannot be seen (its daemons stopped): within the watch's limit, gateway B
    // admits no I/O and answers Asymmetric Access Transition (a path status); once the cluster answers
    // again it catches up and admits again.
    ceph.signal("pause");
    until(Duration::from_secs(15), "B refuses I/O while blind", || {
        report(&mut h2b) == Err(NOT_READY)
    });
    assert_eq!(kept(&b), "cluster-unseen");
    let s = h2b.io[0]
        .exec(sqe::write(1, 13, 1), Data::ToCtrl(vec![0x22; 512]))
        .unwrap()
        .status;
    assert_eq!((sc(s), s.dnr()), (NOT_READY, false), "a write while blind");
    ceph.signal("resume");
    until(Duration::from_secs(30), "B admits again", || report(&mut h2b).is_ok());
    assert_eq!(kept(&b), "cluster");
    assert_eq!(write(&mut h2b, 13, 0x22), OK);

    drop((h1a, h1b, h2a, h2b));
    a.kill9();
    b.shutdown().unwrap();
}

#[test]
fn racing_changes_and_preempt_and_abort_across_gateways() {
    let Some(ceph) = Ceph::start("gw-race") else { return };
    // A in its own process (its own cluster client and watch), B in this one.
    let a_addr = free_addr();
    let mut a = gateway_process(&ceph, "img0", a_addr, 1);
    let (b, b_addr) = gateway(&ceph, "img0", 1001);

    // Eight hosts, four through each gateway, each registering and then replacing its key
    // ten times, all at once: every change succeeds and the generation counts each once.
    const HOSTS: usize = 8;
    const REPLACES: u64 = 10;
    let nqns: Vec<String> = (0..HOSTS)
        .map(|i| format!("nqn.2014-08.org.nvmexpress:uuid:{i:08x}-1111-4000-8000-000000000000"))
        .collect();
    let gen_before = {
        let mut c = host(a_addr, HOST_1);
        report(&mut c).unwrap().0
    };
    let threads: Vec<_> = nqns
        .iter()
        .enumerate()
        .map(|(i, nqn)| {
            let (nqn, addr) = (nqn.clone(), if i % 2 == 0 { a_addr } else { b_addr });
            std::thread::spawn(move || {
                let mut c = host(addr, &nqn);
                let base = (i as u64 + 1) << 32;
                assert_eq!(register(&mut c, REGISTER, 0, base), OK, "{nqn} registers");
                for k in 0..REPLACES {
                    assert_eq!(
                        register(&mut c, REPLACE, base + k, base + k + 1),
                        OK,
                        "{nqn} replace {k}"
                    );
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let mut ca = host(a_addr, HOST_1);
    let mut cb = host(b_addr, HOST_1);
    let (generation, _, regs) = report(&mut ca).unwrap();
    assert_eq!(
        generation - gen_before,
        (HOSTS as u32) * (1 + REPLACES as u32),
        "every change counted once"
    );
    assert_eq!(
        report(&mut cb).unwrap().0,
        generation,
        "both gateways see the same generation"
    );
    assert_eq!(regs.len(), HOSTS);
    for (i, nqn) in nqns.iter().enumerate() {
        let key = ((i as u64 + 1) << 32) + REPLACES;
        assert!(regs.contains(&(id(nqn), key, false)), "{nqn}'s last key: {regs:?}");
    }
    for (i, nqn) in nqns.iter().enumerate() {
        let mut c = host(if i % 2 == 0 { b_addr } else { a_addr }, nqn);
        let key = ((i as u64 + 1) << 32) + REPLACES;
        assert_eq!(register(&mut c, UNREGISTER, key, 0), OK);
    }

    // Preempt and Abort through A while host 1 keeps writing through B: once it completes,
    // no write of host 1 lands any more, so host 2's data written right after stays.
    let mut h1 = host(b_addr, HOST_1);
    let mut h2 = host(a_addr, HOST_2);
    assert_eq!(register(&mut h1, REGISTER, 0, 0x11), OK);
    assert_eq!(acquire(&mut h1, ACQUIRE, WE, 0x11, 0), OK);
    assert_eq!(register(&mut h2, REGISTER, 0, 0x22), OK);
    let stop = Arc::new(AtomicBool::new(false));
    let (landed, refused) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let writer = {
        let (stop, landed, refused) = (stop.clone(), landed.clone(), refused.clone());
        std::thread::spawn(move || {
            // Eight writes in flight at a time over LBAs 100..164.
            let mut lba = 0u64;
            let mut out = 0usize;
            while !stop.load(Ordering::Relaxed) || out > 0 {
                while out < 8 && !stop.load(Ordering::Relaxed) {
                    h1.io[0]
                        .submit(sqe::write(1, 100 + lba % 64, 1), Data::ToCtrl(vec![0x11; 512]), 0)
                        .unwrap();
                    lba += 1;
                    out += 1;
                }
                h1.io[0]
                    .poll_completions(Some(Duration::from_secs(30)), |d| {
                        out -= 1;
                        if d.is_success() {
                            landed.fetch_add(1, Ordering::Relaxed);
                        } else {
                            refused.fetch_add(1, Ordering::Relaxed);
                        }
                    })
                    .unwrap();
            }
        })
    };
    until(Duration::from_secs(30), "host 1's writes land", || {
        landed.load(Ordering::Relaxed) > 50
    });
    assert_eq!(acquire(&mut h2, PREEMPT_ABORT, WE, 0x22, 0x11), OK);
    for lba in 100..164 {
        assert_eq!(write(&mut h2, lba, 0x22), OK, "host 2 writes after preempting");
    }
    assert_eq!(run(&mut h2, sqe::flush(1), Data::None), OK);
    until(Duration::from_secs(10), "host 1's writes refused", || {
        refused.load(Ordering::Relaxed) > 20
    });
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    for lba in 100..164 {
        let d = h2.io[0]
            .exec(sqe::read(1, lba, 1), Data::FromCtrl(vec![0; 512]))
            .unwrap();
        assert!(d.is_success());
        assert!(
            d.buf.iter().all(|&x| x == 0x22),
            "LBA {lba}: a write of the preempted host landed after the Preempt and Abort completed"
        );
    }
    let (_, rtype, regs) = report(&mut ca).unwrap();
    assert_eq!((rtype, regs), (WE, vec![(id(HOST_2), 0x22, true)]));
    assert_eq!(release(&mut h2, WE, 0x22), OK);
    assert_eq!(register(&mut h2, UNREGISTER, 0x22, 0), OK);

    drop((ca, cb, h2));
    a.kill9();
    b.shutdown().unwrap();
}

#[test]
fn a_second_image_has_its_own_reservations() {
    // Reservations are per image: a reservation on img0 does not touch img1, served by the
    // same gateways; a non-rbd namespace beside them keeps the target's own.
    let Some(ceph) = Ceph::start("gw-two") else { return };
    ceph.create("img1", "16M");
    let addr = free_addr();
    let text = format!(
        "{}[[subsystem]]\nnqn = \"{SUB}-2\"\nallow_any_host = true\n\
         [[subsystem.namespace]]\nnsid = 1\nbackend = {{ rbd = {{ pool = \"rbd\", image = \"img1\", ceph_conf = \"{}\" }} }}\n\
         [[subsystem.namespace]]\nnsid = 2\nbackend = {{ ram = {{ size = \"1MiB\" }} }}\n",
        conf(&ceph, addr, "img0", 1),
        ceph.conf.display()
    );
    let t = Target::start(&Config::parse(&text, "gw.toml").unwrap(), Options { pin: false }).unwrap();
    let a = t.listen_addrs()[0];
    let mut h1 = host(a, HOST_1);
    assert_eq!(register(&mut h1, REGISTER, 0, 1), OK);
    assert_eq!(acquire(&mut h1, ACQUIRE, WE, 1, 0), OK);
    let mut other = Controller::connect(a, &format!("{SUB}-2"), HOST_2, 1, 32, Digests::NONE).unwrap();
    assert_eq!(write(&mut other, 1, 0x22), OK, "img1 has no reservation");
    let subs = ctx(&t).subsystems();
    let two = subs.iter().find(|s| s.nqn == format!("{SUB}-2")).unwrap();
    let kinds: Vec<&str> = two.namespaces.iter().map(|n| n.reservations.as_str()).collect();
    assert_eq!(kinds, ["cluster", "volatile"]);
    assert_eq!(release(&mut h1, WE, 1), OK);
    assert_eq!(register(&mut h1, UNREGISTER, 1, 0), OK);
    drop((h1, other));
    t.shutdown().unwrap();
}

#[test]
fn an_upgraded_gateway_keeps_its_hosts_and_the_cluster_s_reservations() {
    // `pollux ctl upgrade` of a gateway with an rbd namespace: the new process opens the
    // image and the reservation object itself (the cluster's state is the one it reads);
    // the hosts' connections and their reservation carry on without a reconnect.
    let Some(ceph) = Ceph::start("gw-upgrade") else { return };
    let addr = free_addr();
    let sock = ceph.dir.join("gw-ctl.sock");
    let text = format!(
        "{}[control]\nsocket = \"{}\"\n",
        conf(&ceph, addr, "img0", 1),
        sock.display()
    );
    let bin = env!("CARGO_BIN_EXE_pollux");
    let log = ceph.dir.join("gw-upgrade.log");
    let mut gw = common::Spawned::start(bin, &ceph.dir.join("gw-upgrade.toml"), &text, &sock, Some(&log), "info");
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < deadline, "pollux did not listen");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut h1 = host(addr, HOST_1);
    let mut h2 = host(addr, HOST_2);
    assert_eq!(register(&mut h1, REGISTER, 0, 0x1A), OK);
    assert_eq!(acquire(&mut h1, ACQUIRE, WE, 0x1A, 0), OK);
    assert_eq!(write(&mut h1, 20, 0x5A), OK);
    assert_eq!(write(&mut h2, 20, 0x22), CONFLICT);

    let o = gw.ctl(&["upgrade", "--binary", bin]);
    assert!(
        o.status.success(),
        "upgrade: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    // The first process hands over and exits.
    let t0 = Instant::now();
    while gw.first().try_wait().unwrap().is_none() {
        assert!(t0.elapsed() < Duration::from_secs(20), "the old process did not exit");
        std::thread::sleep(Duration::from_millis(50));
    }

    // Same connections: the holder writes, the other host conflicts, data is there.
    assert_eq!(write(&mut h1, 21, 0x5B), OK, "the holder after the upgrade");
    assert_eq!(write(&mut h2, 21, 0x22), CONFLICT, "the reservation after the upgrade");
    let d = h2.io[0]
        .exec(sqe::read(1, 20, 1), Data::FromCtrl(vec![0; 512]))
        .unwrap();
    assert!(
        d.is_success() && d.buf.iter().all(|&b| b == 0x5A),
        "data written before the upgrade"
    );
    let (generation, rtype, regs) = report(&mut h2).unwrap();
    assert_eq!((generation, rtype, regs), (1, WE, vec![(id(HOST_1), 0x1A, true)]));
    let subs = String::from_utf8_lossy(&gw.ctl(&["subsystems"]).stdout).into_owned();
    assert!(subs.contains(" cluster "), "{subs}");

    // A change after the upgrade reaches the cluster: another gateway sees it.
    assert_eq!(release(&mut h1, WE, 0x1A), OK);
    let (b, b_addr) = gateway(&ceph, "img0", 1001);
    let mut h2b = host(b_addr, HOST_2);
    let (_, rtype, regs) = report(&mut h2b).unwrap();
    assert_eq!((rtype, regs), (0, vec![(id(HOST_1), 0x1A, false)]));
    assert_eq!(register(&mut h1, UNREGISTER, 0x1A, 0), OK);
    drop((h1, h2, h2b));
    b.shutdown().unwrap();
    drop(gw);
}
