//! The rbd backend against a real Ceph cluster (one monitor, one memstore OSD on 127.0.0.1,
//! started and stopped by `ci/ceph.sh` by its own pids): data round trips and zeroing,
//! identifiers shared by every gateway, durability of acknowledged writes through a
//! `kill -9`, with and without librbd's cache, clear errors for a wrong pool, image, or
//! cluster, and a cluster that stops answering mid-I/O.
//!
//! Needs Ceph's daemons and librbd (`ci/test` installs them). Without them the test says
//! so and passes, unless `POLLUX_REQUIRE_CEPH=1` (set by `ci/test`), which makes it fail.
#![allow(clippy::unwrap_used)]

mod common;

use common::ceph::Ceph;

use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::time::{Duration, Instant};

use common::{HOST, pattern, start_text};
use pollux_conf::Config;
use pollux_host::{Controller, Data, Digests, sqe};
use pollux_nvme::spec::Status;
use pollux_target::{Options, Target};
use zerocopy::byteorder::little_endian::U32;

const NQN: &str = "nqn.2026-12.io.pollux:rbd-test";
const BS: usize = 512;

/// A conf with one reactor, a listener on `listen`, subsystem [`NQN`] holding `namespaces`.
fn conf(listen: &str, namespaces: &str) -> String {
    format!(
        "[reactors]\ncores = [0]\nmode = \"adaptive\"\n[[listener]]\naddress = \"{listen}\"\n\
         [[subsystem]]\nnqn = \"{NQN}\"\nallow_any_host = true\n{namespaces}"
    )
}

fn rbd_ns(nsid: u32, ceph: &Ceph, image: &str, extra: &str) -> String {
    format!(
        "[[subsystem.namespace]]\nnsid = {nsid}\nbackend = {{ rbd = {{ pool = \"rbd\", image = \"{image}\", ceph_conf = \"{}\"{extra} }} }}\n",
        ceph.conf.display()
    )
}

fn connect(addr: SocketAddr, queues: u16) -> Controller {
    Controller::connect(addr, NQN, HOST, queues, 32, Digests::NONE).unwrap()
}

fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

#[test]
fn rbd_namespaces_against_a_real_cluster() {
    let Some(ceph) = Ceph::start("main") else { return };
    let fsid = ceph.fsid();
    let ram = "[[subsystem.namespace]]\nnsid = 9\nbackend = { ram = { size = \"1MiB\" } }\n";

    // Data: patterns in and out on two queues, across an object boundary (4 MiB), then
    // Write Zeroes and Deallocate read back zeroes, and the cluster has what was written.
    let t = start_text(&conf("127.0.0.1:0", &format!("{}{ram}", rbd_ns(1, &ceph, "img0", ""))));
    let addr = t.listen_addrs()[0];
    let mut c = connect(addr, 2);
    assert_eq!(c.id.vwc & 1, 0, "no volatile write cache without librbd's cache");
    let object = (4 << 20) / BS as u64;
    common::assert_round_trips(
        &mut c,
        BS,
        &[1, 8, 256, 16],
        |k| [0, 100, object - 128, 7000][k],
        11,
        "rbd",
    );
    common::assert_zeroing_reads_zeroes(&mut c, 20_000, "rbd");
    let data = pattern(5, 3000, 8 * BS);
    c.io[0].write(1, 3000, 8, &data).unwrap();
    c.io[0].flush(1).unwrap();
    let id1 = c.admin.identify_namespace(1).unwrap();
    assert_eq!(id1.nsze * BS as u64, 64 << 20, "the image's size");
    c.shutdown().ok();
    t.shutdown().unwrap();
    let img = ceph.export("img0");
    assert_eq!(
        &img[3000 * BS..3008 * BS],
        &data[..],
        "the data is in Ceph, not in pollux"
    );

    // Identity: another gateway serving the image as another nsid of another subsystem
    // presents the same namespace; it is derived from the fsid and image id.
    let other = format!(
        "[reactors]\ncores = [0]\n[[listener]]\naddress = \"127.0.0.1:0\"\n[[subsystem]]\nnqn = \"nqn.2026-12.io.pollux:other\"\nallow_any_host = true\n{}",
        rbd_ns(5, &ceph, "img0", "")
    );
    let t = Target::start(&Config::parse(&other, "o.toml").unwrap(), Options { pin: false }).unwrap();
    let mut c2 = Controller::connect(
        t.listen_addrs()[0],
        "nqn.2026-12.io.pollux:other",
        HOST,
        1,
        8,
        Digests::NONE,
    )
    .unwrap();
    let id5 = c2.admin.identify_namespace(5).unwrap();
    assert_eq!(
        (id5.nguid, id5.eui64),
        (id1.nguid, id1.eui64),
        "one image, one namespace identity"
    );
    assert_ne!(
        id5.nguid,
        pollux_conf::derive_ids("nqn.2026-12.io.pollux:other", 5).nguid
    );
    assert!(!fsid.is_empty());
    let mut back = vec![0u8; 8 * BS];
    c2.io[0].read(5, 3000, 8, &mut back).unwrap();
    assert_eq!(back, data, "the other gateway reads what the first wrote");
    c2.shutdown().ok();
    t.shutdown().unwrap();

    // At run time: `add_namespace` of a missing image is refused with the reason while the
    // target goes on serving; the image added, it serves what was written, and Compare runs
    // on it (pollux reads and compares under its range lock).
    let (t, ctx) = common::start_with_ctx(&conf("127.0.0.1:0", ram));
    let add = |image: &str| {
        ctx.call(
            "add_namespace",
            &serde_json::json!({"nqn": NQN, "nsid": 3, "backend": {"rbd": {"pool": "rbd", "image": image, "ceph_conf": ceph.conf}}}),
        )
    };
    let e = add("nosuch").unwrap_err().message;
    assert!(e.contains("image \"nosuch\" does not exist"), "{e}");
    let mut c = connect(t.listen_addrs()[0], 1);
    c.io[0].write(9, 0, 1, &[3u8; BS]).unwrap();
    add("img0").unwrap();
    c.io[0].read(3, 3000, 8, &mut back).unwrap();
    assert_eq!(back, data, "the namespace added at run time serves the image");
    let same = c.io[0]
        .exec(sqe::compare(3, 3000, 8), Data::ToCtrl(data.clone()))
        .unwrap();
    assert!(same.status.is_success(), "Compare of equal data: {:?}", same.status);
    let mut other = data.clone();
    other[100] ^= 1;
    let differs = c.io[0].exec(sqe::compare(3, 3000, 8), Data::ToCtrl(other)).unwrap();
    assert_eq!(
        (differs.status.sct(), differs.status.sc()),
        (Status::COMPARE_FAILURE.sct(), Status::COMPARE_FAILURE.sc())
    );
    // A one-sector fused Compare and Write is librbd's compare-and-write (atomic in the
    // cluster, across gateways): one librbd operation. A longer one is pollux's own: read,
    // compare and write under its range lock (two operations).
    let ops = || {
        let v = ctx.call("subsystems", &serde_json::Value::Null).unwrap();
        let ns = v[0]["namespaces"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["nsid"] == 3)
            .cloned()
            .unwrap();
        ns["rbd"]["ops"].as_u64().unwrap()
    };
    for (nlb, librbd_ops) in [(1u32, 1u64), (8, 2)] {
        let len = nlb as usize * BS;
        let (old, new) = (&data[..len], pattern(6, 3000, len));
        let before = ops();
        assert_eq!(
            common::caw(&mut c.io[0], 3, 3000, nlb, old, &new),
            (Status::SUCCESS, Status::SUCCESS)
        );
        assert_eq!(ops() - before, librbd_ops, "{nlb} blocks: librbd operations");
        let mut back = vec![0u8; len];
        c.io[0].read(3, 3000, nlb, &mut back).unwrap();
        assert_eq!(back, new, "{nlb} blocks: the write of the pair landed");
        let (cmp, wr) = common::caw(&mut c.io[0], 3, 3000, nlb, old, &pattern(7, 3000, len));
        assert_eq!(
            (cmp.sct(), cmp.sc()),
            (Status::COMPARE_FAILURE.sct(), Status::COMPARE_FAILURE.sc())
        );
        assert_eq!(
            (wr.sct(), wr.sc()),
            (0, 0x09),
            "the Write: Command Aborted due to Failed Fused Command"
        );
        c.io[0].read(3, 3000, nlb, &mut back).unwrap();
        assert_eq!(back, new, "{nlb} blocks: a miscompare writes nothing");
        c.io[0].write(3, 3000, 8, &data).unwrap();
    }
    // A block never written compares as zeroes.
    assert_eq!(
        common::caw(&mut c.io[0], 3, 100_000, 1, &[0; BS], &pattern(8, 100_000, BS)),
        (Status::SUCCESS, Status::SUCCESS)
    );
    c.shutdown().ok();
    t.shutdown().unwrap();

    resizes_reach_the_host(&ceph);

    // Bad input: each a clear error at start, naming what is wrong.
    let bad = |ns: String, needle: &str| {
        let started = Instant::now();
        let e = Target::start(
            &Config::parse(&conf("127.0.0.1:0", &ns), "bad.toml").unwrap(),
            Options { pin: false },
        )
        .err()
        .unwrap_or_else(|| panic!("started with {ns}"))
        .to_string();
        assert!(e.contains(needle), "{e} lacks {needle:?}");
        started.elapsed()
    };
    bad(
        rbd_ns(1, &ceph, "nosuch", ""),
        "image \"nosuch\" does not exist in pool \"rbd\"",
    );
    bad(
        rbd_ns(1, &ceph, "img0", "").replace("pool = \"rbd\"", "pool = \"nopool\""),
        "pool \"nopool\" does not exist",
    );
    let dir = std::env::temp_dir().join(format!("pollux-rbd-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let dead = dir.join("dead.conf");
    let port = free_addr().port();
    std::fs::write(
        &dead,
        format!("[global]\nmon host = v2:127.0.0.1:{port}\nauth client required = none\n"),
    )
    .unwrap();
    let dead_ns = format!(
        "[[subsystem.namespace]]\nnsid = 1\nbackend = {{ rbd = {{ pool = \"rbd\", image = \"img0\", ceph_conf = \"{}\", op_timeout_s = 2 }} }}\n",
        dead.display()
    );
    let took = bad(dead_ns, "cannot connect to the cluster within 2 s");
    assert!(
        took < Duration::from_secs(15),
        "an unreachable cluster is given up in bounded time: {took:?}"
    );

    durability_through_kill_9(&ceph, &dir, false);
    durability_through_kill_9(&ceph, &dir, true);
    cluster_stops_answering(&ceph);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The image grows by `rbd resize` (another client) and by `pollux ctl resize-namespace`:
/// each time the host gets a Namespace Attribute Changed event naming the namespace, and
/// Identify and I/O follow the new size. Shrinking through pollux, or resizing a RAM
/// namespace, is refused with the reason.
fn resizes_reach_the_host(ceph: &Ceph) {
    let ram = "[[subsystem.namespace]]\nnsid = 9\nbackend = { ram = { size = \"1MiB\" } }\n";
    let (t, ctx) = common::start_with_ctx(&conf("127.0.0.1:0", &format!("{}{ram}", rbd_ns(1, ceph, "img0", ""))));
    let mut c = connect(t.listen_addrs()[0], 1);
    // Namespace attribute notices on (the Linux host does this at connect).
    c.admin.set_features(0x0B, 1 << 8).unwrap();
    let expect_resize = |c: &mut Controller, bytes: u64, what: &str| {
        let aer = c.admin.submit(sqe::async_event_request(), Data::None, 7).unwrap();
        let t0 = Instant::now();
        let mut got = None;
        while got.is_none() && t0.elapsed() < Duration::from_secs(20) {
            c.admin
                .poll_completions(Some(Duration::from_millis(100)), |done| {
                    if done.cid == aer {
                        got = Some((done.status, done.dw0));
                    }
                })
                .unwrap();
        }
        // Notice, Namespace Attribute Changed, log page 04h (NVMe 2.0 §5.2).
        assert_eq!(got, Some((Status::SUCCESS, 0x0004_0002)), "{what}: no event");
        let log = c.admin.get_log_page(0x04, 0, 4096).unwrap();
        assert_eq!(
            &log[0..8],
            &[1, 0, 0, 0, 0, 0, 0, 0],
            "{what}: the changed namespace list names nsid 1"
        );
        assert_eq!(
            c.admin.identify_namespace(1).unwrap().nsze * BS as u64,
            bytes,
            "{what}: Identify"
        );
        let last = bytes / BS as u64 - 8;
        let d = pattern(41, last, 8 * BS);
        c.io[0].write(1, last, 8, &d).unwrap();
        let mut back = vec![0u8; 8 * BS];
        c.io[0].read(1, last, 8, &mut back).unwrap();
        assert_eq!(back, d, "{what}: I/O at the new end");
        let past = c.io[0]
            .exec(sqe::read(1, bytes / BS as u64, 1), Data::FromCtrl(vec![0; BS]))
            .unwrap();
        assert_eq!(
            (past.status.sct(), past.status.sc()),
            (0, 0x80),
            "{what}: LBA Out of Range past it"
        );
    };
    ceph.run("rbd", &["resize", "--size", "80M", "rbd/img0"]);
    expect_resize(&mut c, 80 << 20, "rbd resize by another client");
    let r = ctx
        .call(
            "resize_namespace",
            &serde_json::json!({"nqn": NQN, "nsid": 1, "size": "96MiB"}),
        )
        .unwrap();
    assert_eq!(r["size"], 96 << 20);
    expect_resize(&mut c, 96 << 20, "pollux ctl resize-namespace");
    let info = String::from_utf8(ceph.run("rbd", &["info", "--format", "json", "rbd/img0"])).unwrap();
    assert!(
        info.contains(&format!("\"size\":{}", 96 << 20)),
        "the image itself grew: {info}"
    );
    let e = ctx
        .call(
            "resize_namespace",
            &serde_json::json!({"nqn": NQN, "nsid": 1, "size": "32MiB"}),
        )
        .unwrap_err()
        .message;
    assert!(e.contains("shrinking the image") && e.contains("refused"), "{e}");
    let e = ctx
        .call(
            "resize_namespace",
            &serde_json::json!({"nqn": NQN, "nsid": 9, "size": "2MiB"}),
        )
        .unwrap_err()
        .message;
    assert!(e.contains("a ram namespace cannot be resized"), "{e}");
    c.shutdown().ok();
    t.shutdown().unwrap();
}

/// Writes acknowledged as durable (FUA, or before a completed Flush) are in Ceph even when
/// the gateway is killed with SIGKILL the next instant.
fn durability_through_kill_9(ceph: &Ceph, dir: &Path, write_cache: bool) {
    let image = if write_cache { "cached" } else { "direct" };
    ceph.create(image, "16M");
    let addr = free_addr();
    let extra = if write_cache { ", write_cache = true" } else { "" };
    let mut child = common::spawn_pollux(
        env!("CARGO_BIN_EXE_pollux"),
        &dir.join("gateway.toml"),
        &conf(&addr.to_string(), &rbd_ns(1, ceph, image, extra)),
        addr,
    );
    let mut c = Controller::connect(addr, NQN, HOST, 1, 64, Digests::NONE).unwrap();
    assert_eq!(c.id.vwc & 1, u8::from(write_cache), "VWC follows write_cache");
    // librbd's cache writes through until the first flush (rbd_cache_writethrough_until_flush):
    // one first, so that what follows goes through the writeback cache.
    c.io[0].flush(1).unwrap();
    let flushed = pattern(22, 4096, 8 * BS);
    c.io[0].write(1, 4096, 8, &flushed).unwrap();
    c.io[0].flush(1).unwrap();
    // Last, FUA writes in flight together (128 KiB each): acknowledged only once each is in
    // the cluster. Without that, librbd (writearound or writeback) acknowledges them while
    // they are still on their way, and the kill below catches some.
    let fua: Vec<Vec<u8>> = (0..FUA_WRITES)
        .map(|i| pattern(21 + i, fua_lba(i), FUA_BLOCKS as usize * BS))
        .collect();
    for (i, d) in fua.iter().enumerate() {
        let mut s = sqe::write(1, fua_lba(i as u64), FUA_BLOCKS);
        s.cdw12 = U32::new(s.cdw12.get() | 1 << 30);
        c.io[0].submit(s, Data::ToCtrl(d.clone()), i as u64).unwrap();
    }
    let mut acked = 0;
    while acked < FUA_WRITES {
        acked += c.io[0]
            .poll_completions(Some(Duration::from_secs(5)), |done| {
                assert!(done.status.is_success(), "FUA write: {:?}", done.status)
            })
            .unwrap() as u64;
    }
    // The next instant: no chance to flush anything at exit.
    child.kill().unwrap();
    child.wait().unwrap();
    let img = ceph.export(image);
    assert_eq!(
        &img[4096 * BS..4104 * BS],
        &flushed[..],
        "{image}: a write followed by a completed Flush is in Ceph"
    );
    for (i, d) in fua.iter().enumerate() {
        let at = fua_lba(i as u64) as usize * BS;
        assert!(
            img[at..at + d.len()] == d[..],
            "{image}: acknowledged FUA write {i} is not in Ceph"
        );
    }
}

const FUA_WRITES: u64 = 48;
const FUA_BLOCKS: u32 = 256;

fn fua_lba(i: u64) -> u64 {
    8192 + i * u64::from(FUA_BLOCKS)
}

/// The cluster stops answering (its daemons stopped with SIGSTOP) during I/O: commands to
/// the rbd namespace end with Namespace Not Ready (retryable) within a bounded time, the
/// RAM namespace beside it keeps serving, and once the cluster answers again I/O resumes.
fn cluster_stops_answering(ceph: &Ceph) {
    let ram = "[[subsystem.namespace]]\nnsid = 9\nbackend = { ram = { size = \"1MiB\" } }\n";
    let text = conf(
        "127.0.0.1:0",
        &format!("{}{ram}", rbd_ns(1, ceph, "img0", ", op_timeout_s = 3")),
    );
    let (t, ctx) = common::start_with_ctx(&text);
    let rbd_view = || {
        let v = ctx.call("subsystems", &serde_json::Value::Null).unwrap();
        v[0]["namespaces"][0]["rbd"].clone()
    };
    let v = rbd_view();
    assert_eq!(v["image"], "rbd/img0", "{v}");
    assert_eq!(v["fsid"], ceph.fsid(), "{v}");
    assert_eq!(v["health"], "ok", "{v}");
    let mut c = connect(t.listen_addrs()[0], 2);
    c.io[0].set_timeout(Duration::from_secs(30));
    let data = pattern(31, 500, 8 * BS);
    c.io[0].write(1, 500, 8, &data).unwrap();
    ceph.signal("pause");
    let started = Instant::now();
    let mut stuck = c.io[0]
        .exec(sqe::write(1, 600, 8), Data::ToCtrl(vec![0x5a; 8 * BS]))
        .unwrap();
    let waited = started.elapsed();
    // librados' op timeout (3 s) or pollux's own bound (twice that).
    assert!(
        waited >= Duration::from_secs(2) && waited < Duration::from_secs(12),
        "answered after {waited:?}"
    );
    assert_eq!(
        (stuck.status.sct(), stuck.status.sc()),
        (Status::NAMESPACE_NOT_READY.sct(), Status::NAMESPACE_NOT_READY.sc()),
        "{:?}",
        stuck.status
    );
    assert!(!stuck.status.dnr(), "retryable: Do Not Retry is clear");
    let v = rbd_view();
    assert_eq!(v["health"], "unavailable", "{v}");
    assert!(
        v["unavailable"].as_u64().unwrap() + v["overdue"].as_u64().unwrap() >= 1,
        "{v}"
    );
    // The neighbour serves meanwhile.
    let mut back = vec![0u8; BS];
    c.io[1].write(9, 0, 1, &[7u8; BS]).unwrap();
    c.io[1].read(9, 0, 1, &mut back).unwrap();
    assert_eq!(back, [7u8; BS]);
    ceph.signal("resume");
    // I/O resumes by itself (the host's retry, here by hand).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        stuck = c.io[0]
            .exec(sqe::write(1, 600, 8), Data::ToCtrl(vec![0x5a; 8 * BS]))
            .unwrap();
        if stuck.status.is_success() {
            break;
        }
        assert!(Instant::now() < deadline, "I/O did not resume: {:?}", stuck.status);
        std::thread::sleep(Duration::from_millis(200));
    }
    let mut back = vec![0u8; 8 * BS];
    c.io[0].read(1, 500, 8, &mut back).unwrap();
    assert_eq!(back, data, "nothing written before the outage was lost");
    assert_eq!(rbd_view()["health"], "ok", "healthy again once the cluster answers");
    assert_eq!(rbd_view()["lock_owner"], true, "this gateway wrote: it holds the lock");
    c.shutdown().ok();
    t.shutdown().unwrap();
}
