//! Fused Compare and Write (NVMe 2.0 §3.4.2) and Copy (NVM Command Set 1.0 §3.2.2): a pair
//! writes only when its compare matches and is never torn by other writers on other queues
//! and reactors; broken pairs get the fused statuses; Copy copies on RAM, file, NVMe (the
//! fake controller) and simulated namespaces and refuses what is beyond the namespace or
//! its limits, changing nothing; Identify and the effects log report both. On an NVMe
//! namespace whose device has its own Copy, a Copy within the device's limits is one device
//! Copy command; beyond them it is read and written through pollux.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;

use common::*;
use pollux_host::sqe::{self, CopyRange};
use pollux_host::{Controller, Data, Digests};
use pollux_nvme::spec::{Sqe, Status};
use pollux_target::control::rpc::Ctx;

const F_NQN: &str = "nqn.2026-11.io.pollux:fused";
const BLOCKS8M: u64 = 16384;

fn target(backend: &str) -> pollux_target::Target {
    start_text(&conf_with(
        "interrupt",
        "",
        F_NQN,
        &format!("[[subsystem.namespace]]\nnsid = 1\nblock_size = 512\nbackend = {backend}"),
    ))
}

const SIM: &str = "{ sim = { size = \"8MiB\", read = { median_us = 20.0, sigma = 0.2 }, write = { median_us = 20.0, sigma = 0.2 } } }";
const RAM: &str = "{ ram = { size = \"8MiB\" } }";

/// Submit `cmds` back to back on `q` and wait for all their statuses, in order.
fn read(c: &mut Controller, slba: u64, nlb: u32) -> Vec<u8> {
    let mut back = vec![0u8; nlb as usize * 512];
    // In reads of at most 128 blocks (64 KiB, below the transport's limit).
    for (i, part) in back.chunks_mut(128 * 512).enumerate() {
        let n = (part.len() / 512) as u32;
        c.io[0].read(1, slba + i as u64 * 128, n, part).unwrap();
    }
    back
}

fn exercise(c: &mut Controller, what: &str) {
    // 4 KiB in the capsule, 64 KiB by R2T and H2CData.
    for (slba, nlb) in [(8u64, 8u32), (1000, 128)] {
        let len = nlb as usize * 512;
        let old = pattern(1, slba, len);
        let new = pattern(2, slba, len);
        c.io[0].write(1, slba, nlb, &old).unwrap();
        let (a, b) = caw(&mut c.io[0], 1, slba, nlb, &old, &new);
        assert_eq!((a, b), (Status::SUCCESS, Status::SUCCESS), "{what}: equal, written");
        assert_eq!(read(c, slba, nlb), new, "{what}: the write of the pair landed");
        // A miscompare: Compare Failure and Failed Fused Command, nothing written.
        let (a, b) = caw(&mut c.io[0], 1, slba, nlb, &old, &pattern(3, slba, len));
        assert_eq!((code(a), code(b)), ((2, 0x85), (0, 0x09)), "{what}: miscompare");
        assert_eq!(read(c, slba, nlb), new, "{what}: a miscompare changed the data");
    }
    // Copy: two ranges (one by R2T-sized data) to a destination, read back.
    let a = pattern(4, 100, 16 * 512);
    let b = pattern(5, 300, 100 * 512);
    c.io[0].write(1, 100, 16, &a).unwrap();
    c.io[0].write(1, 300, 100, &b).unwrap();
    let ranges = [CopyRange { slba: 100, nlb: 16 }, CopyRange { slba: 300, nlb: 100 }];
    let s = c.io[0]
        .exec(sqe::copy(1, 5000, 2, false), Data::ToCtrl(CopyRange::data(&ranges)))
        .unwrap();
    assert_eq!(s.status, Status::SUCCESS, "{what}: copy");
    assert_eq!(
        read(c, 5000, 116),
        [a.clone(), b.clone()].concat(),
        "{what}: copied data"
    );
    // Overlapping source and destination: the destination gets the source as it was.
    let ranges = [CopyRange { slba: 300, nlb: 100 }];
    let s = c.io[1]
        .exec(sqe::copy(1, 350, 1, true), Data::ToCtrl(CopyRange::data(&ranges)))
        .unwrap();
    assert_eq!(s.status, Status::SUCCESS, "{what}: overlapping copy");
    assert_eq!(read(c, 350, 100), b, "{what}: overlapping copy reads the source first");
    // Refused, with nothing changed: beyond the namespace (source, destination), beyond
    // MSSRL / MCL / MSRC, another source range format.
    let before = read(c, 8000, 64);
    let bad = |c: &mut Controller, s: Sqe, ranges: &[CopyRange]| {
        c.io[0].exec(s, Data::ToCtrl(CopyRange::data(ranges))).unwrap().status
    };
    let one = [CopyRange { slba: 0, nlb: 8 }];
    let s = bad(
        c,
        sqe::copy(1, 8000, 1, false),
        &[CopyRange {
            slba: BLOCKS8M - 4,
            nlb: 8,
        }],
    );
    assert_eq!((code(s), s.dnr()), ((0, 0x80), true), "{what}: source beyond the end");
    let s = bad(c, sqe::copy(1, BLOCKS8M - 4, 1, false), &one);
    assert_eq!(code(s), (0, 0x80), "{what}: destination beyond the end");
    let s = bad(c, sqe::copy(1, 8000, 1, false), &[CopyRange { slba: 0, nlb: 4096 }]);
    assert_eq!(code(s), (1, 0x83), "{what}: a range beyond MSSRL");
    let many: Vec<CopyRange> = (0..3)
        .map(|i| CopyRange {
            slba: i * 2048,
            nlb: 1024,
        })
        .collect();
    let s = bad(c, sqe::copy(1, 8000, 3, false), &many);
    assert_eq!(code(s), (1, 0x83), "{what}: more than MCL");
    let s = bad(c, sqe::copy(1, 8000, 129, false), &vec![one[0]; 129]);
    assert_eq!(code(s), (1, 0x83), "{what}: more ranges than MSRC");
    let mut fmt1 = sqe::copy(1, 8000, 1, false);
    fmt1.cdw12.set(fmt1.cdw12.get() | (1 << 8));
    let s = bad(c, fmt1, &one);
    assert_eq!((code(s), s.dnr()), ((0, 0x02), true), "{what}: format 1");
    assert_eq!(read(c, 8000, 64), before, "{what}: a refused copy changed the data");
}

#[test]
fn compare_and_write_and_copy_on_ram_file_nvme_and_sim_namespaces() {
    let dir = std::env::temp_dir().join(format!("pollux-fused-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("ns.img");
    let _ = std::fs::remove_file(&file);
    for (what, backend) in [
        ("ram", RAM.to_string()),
        (
            "file",
            format!(
                "{{ file = {{ path = \"{}\", size = \"8MiB\", direct = false }} }}",
                file.display()
            ),
        ),
        (
            "nvme",
            "{ nvme = { fake = \"fused0\", size = \"8MiB\", latency_us = 5.0 } }".to_string(),
        ),
        ("sim", SIM.to_string()),
    ] {
        let t = target(&backend);
        let mut c = Controller::connect(addr(&t), F_NQN, HOST, 2, 32, Digests::NONE).unwrap();
        exercise(&mut c, what);
        c.shutdown().unwrap();
        t.shutdown().unwrap();
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn identify_and_the_effects_log_report_fused_and_copy() {
    let t = target(RAM);
    let mut c = Controller::connect(addr(&t), F_NQN, HOST, 1, 32, Digests::NONE).unwrap();
    let id = c.admin.identify(1, 0).unwrap();
    let word = |at: usize| u16::from_le_bytes([id[at], id[at + 1]]);
    assert_eq!(word(520) & (1 << 8), 1 << 8, "ONCS: Copy");
    assert_eq!(word(522), 1, "FUSES: Compare and Write");
    assert_eq!(word(534), 1, "OCFS: format 0");
    let ns = c.admin.identify(0, 1).unwrap();
    assert_eq!(u16::from_le_bytes([ns[74], ns[75]]), 2048, "MSSRL");
    assert_eq!(u32::from_le_bytes([ns[76], ns[77], ns[78], ns[79]]), 2048, "MCL");
    assert_eq!(ns[80], 127, "MSRC");
    let log = c.admin.get_log_page(0x05, 0, 4096).unwrap();
    let at = 1024 + 0x19 * 4;
    assert_eq!(log[at] & 0x3, 0x3, "effects: Copy supported, changes content");
    c.shutdown().unwrap();
    t.shutdown().unwrap();
}

#[test]
fn broken_fused_pairs_get_the_missing_and_failed_statuses() {
    let t = target(RAM);
    let mut c = Controller::connect(addr(&t), F_NQN, HOST, 1, 32, Digests::NONE).unwrap();
    let data = pattern(7, 40, 4096);
    c.io[0].write(1, 40, 8, &data).unwrap();
    let q = &mut c.io[0];
    let (first, second) = sqe::compare_and_write(1, 40, 8);
    let to = |d: &[u8]| Data::ToCtrl(d.to_vec());
    // A second without a first.
    let s = run_all(q, vec![(second, to(&[9; 4096]))]);
    assert_eq!(code(s[0]), (0, 0x0A), "second alone");
    // A first followed by a plain command: the first is missing its second; the plain
    // command runs.
    let s = run_all(
        q,
        vec![(first, to(&data)), (sqe::read(1, 40, 8), Data::FromCtrl(vec![0; 4096]))],
    );
    assert_eq!((code(s[0]), s[1]), ((0, 0x0A), Status::SUCCESS), "first, then a read");
    // Wrong order: second then first; then a plain write settles the first.
    let s = run_all(
        q,
        vec![
            (second, to(&[9; 4096])),
            (first, to(&data)),
            (sqe::write(1, 2000, 1), to(&[1; 512])),
        ],
    );
    assert_eq!(
        (code(s[0]), code(s[1]), s[2]),
        ((0, 0x0A), (0, 0x0A), Status::SUCCESS),
        "wrong order"
    );
    // A second of other blocks, or of another namespace.
    let (_, other) = sqe::compare_and_write(1, 48, 8);
    let s = run_all(q, vec![(first, to(&data)), (other, to(&[9; 4096]))]);
    assert_eq!((code(s[0]), code(s[1])), ((0, 0x0A), (0, 0x0A)), "mismatched range");
    let mut other_ns = second;
    other_ns.nsid.set(2);
    let s = run_all(q, vec![(first, to(&data)), (other_ns, to(&[9; 4096]))]);
    assert_eq!((code(s[0]), code(s[1])), ((0, 0x0A), (0, 0x0A)), "mismatched namespace");
    // A first that fails its own checks: its second fails with it.
    let (bad_first, bad_second) = sqe::compare_and_write(1, BLOCKS8M - 1, 8);
    let s = run_all(q, vec![(bad_first, to(&data)), (bad_second, to(&[9; 4096]))]);
    assert_eq!((code(s[0]), code(s[1])), ((0, 0x80), (0, 0x09)), "failed first");
    // Commands that cannot be fused, and FUSE 11b: Invalid Field.
    for s in [
        sqe::fused(sqe::read(1, 40, 8), Sqe::FUSE_FIRST),
        sqe::fused(sqe::write(1, 40, 8), Sqe::FUSE_FIRST),
        sqe::fused(sqe::compare(1, 40, 8), 3),
        sqe::fused(sqe::flush(1), Sqe::FUSE_SECOND),
    ] {
        let d = if s.opcode == 0 || s.opcode == 2 {
            Data::FromCtrl(vec![0; 4096])
        } else {
            to(&data)
        };
        let d = if s.opcode == 0 { Data::None } else { d };
        let st = run_all(q, vec![(s, d)]);
        assert_eq!(
            (code(st[0]), st[0].dnr()),
            ((0, 0x02), true),
            "opcode {:#x} fused",
            s.opcode
        );
    }
    // Nothing of all that changed the blocks.
    assert_eq!(read(&mut c, 40, 8), data);
    c.shutdown().unwrap();
    t.shutdown().unwrap();
}

/// Many queues on both reactors increment a counter in block 0 with Compare and Write
/// (test-and-set), while other queues keep writing block 1, inside the pairs' range: the
/// final count equals the successes (no two pairs both compared and wrote; none was torn by
/// another), and no queue stalls.
fn counter_race(backend: &str, what: &str) {
    let t = target(backend);
    let a = addr(&t);
    let mut c = Controller::connect(a, F_NQN, HOST, 1, 32, Digests::NONE).unwrap();
    let block = |n: u64| {
        let mut b = vec![0u8; 1024];
        b[..8].copy_from_slice(&n.to_le_bytes());
        b
    };
    c.io[0].write(1, 0, 2, &block(0)).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let successes = Arc::new(AtomicU64::new(0));
    let mut incs = Vec::new();
    for k in 0..4u64 {
        let successes = successes.clone();
        incs.push(thread::spawn(move || {
            let mut c = Controller::connect(a, F_NQN, HOST, 2, 32, Digests::NONE).unwrap();
            let mut mine = 0;
            for i in 0..150u64 {
                let q = &mut c.io[(i % 2) as usize];
                let mut cur = vec![0u8; 1024];
                q.read(1, 0, 2, &mut cur).unwrap();
                let n = u64::from_le_bytes(cur[..8].try_into().unwrap());
                let mut next = cur.clone();
                next[..8].copy_from_slice(&(n + 1).to_le_bytes());
                next[512..520].copy_from_slice(&(k << 32 | i).to_le_bytes());
                let (s1, s2) = caw(q, 1, 0, 2, &cur, &next);
                if s1.is_success() {
                    assert!(s2.is_success(), "a matching compare's write failed: {s2:?}");
                    mine += 1;
                } else {
                    assert_eq!((code(s1), code(s2)), ((2, 0x85), (0, 0x09)));
                }
            }
            successes.fetch_add(mine, Ordering::Relaxed);
            c.shutdown().unwrap();
        }));
    }
    let mut writers = Vec::new();
    for k in 0..2u64 {
        let stop = stop.clone();
        writers.push(thread::spawn(move || {
            let mut c = Controller::connect(a, F_NQN, HOST, 1, 32, Digests::NONE).unwrap();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let b = pattern(k, n, 512);
                c.io[0].write(1, 1, 1, &b).unwrap();
                n += 1;
            }
            c.shutdown().unwrap();
            n
        }));
    }
    for h in incs {
        h.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let writes: u64 = writers.into_iter().map(|h| h.join().unwrap()).sum();
    let mut back = vec![0u8; 1024];
    c.io[0].read(1, 0, 2, &mut back).unwrap();
    let count = u64::from_le_bytes(back[..8].try_into().unwrap());
    let ok = successes.load(Ordering::Relaxed);
    assert_eq!(count, ok, "{what}: the counter equals the successful pairs");
    assert!(
        ok > 0 && writes > 0,
        "{what}: both sides made progress ({ok} pairs, {writes} writes)"
    );
    c.shutdown().unwrap();
    t.shutdown().unwrap();
}

#[test]
fn compare_and_write_is_atomic_against_other_queues_and_reactors_on_ram() {
    counter_race(RAM, "ram");
}

#[test]
fn compare_and_write_is_atomic_against_other_queues_and_reactors_on_sim() {
    counter_race(SIM, "sim");
}

/// (Copies pollux sent as device Copy commands, Copy commands the fake executed, I/O commands
/// it executed.)
fn device_counts(ctx: &Ctx, name: &str) -> (u64, u64, u64) {
    let d = nvme_device(ctx, name);
    let n = |k: &str| d[k].as_u64().unwrap_or_else(|| panic!("{k} in {d}"));
    (n("offloaded_copies"), n("fake_copy_commands"), n("fake_io_commands"))
}

#[test]
fn copy_on_an_nvme_backend_is_the_devices_own_copy_within_its_limits() {
    // The fake device's limits (FakeCopyLimits::default): 256 blocks per range, 1024 in all,
    // 8 ranges; pollux's own: 2048, 2048, 128.
    let text = conf_with(
        "interrupt",
        "",
        F_NQN,
        "[[subsystem.namespace]]\nnsid = 1\nblock_size = 512\n\
         backend = { nvme = { fake = \"ncopy0\", size = \"8MiB\", latency_us = 5.0 } }",
    );
    let (t, ctx) = start_with_ctx(&text);
    assert_eq!(nvme_device(&ctx, "ncopy0")["copy_offload"], true);
    let mut c = Controller::connect(addr(&t), F_NQN, HOST, 2, 32, Digests::NONE).unwrap();
    let copy = |c: &mut Controller, dst: u64, ranges: &[CopyRange], fua: bool| {
        let s = sqe::copy(1, dst, ranges.len() as u32, fua);
        c.io[0].exec(s, Data::ToCtrl(CopyRange::data(ranges))).unwrap().status
    };
    let a = pattern(11, 100, 16 * 512);
    let b = pattern(12, 300, 200 * 512);
    c.io[0].write(1, 100, 16, &a).unwrap();
    c.io[0].write(1, 300, 200, &b).unwrap();

    // Within the device's limits: one device Copy, no device reads or writes.
    let smart = c.admin.smart_log().unwrap();
    let before = device_counts(&ctx, "ncopy0");
    let ranges = [CopyRange { slba: 100, nlb: 16 }, CopyRange { slba: 300, nlb: 200 }];
    assert_eq!(copy(&mut c, 5000, &ranges, false), Status::SUCCESS);
    let after = device_counts(&ctx, "ncopy0");
    assert_eq!(
        (after.0 - before.0, after.1 - before.1, after.2 - before.2),
        (1, 1, 1),
        "one device Copy command and nothing else"
    );
    assert_eq!(
        c.admin.smart_log().unwrap().host_writes - smart.host_writes,
        1,
        "one write in SMART"
    );
    assert_eq!(
        read(&mut c, 5000, 216),
        [a.clone(), b.clone()].concat(),
        "copied by the device"
    );

    // Overlapping source and destination: the device's result, the source as it was.
    let before = device_counts(&ctx, "ncopy0");
    assert_eq!(
        copy(&mut c, 350, &[CopyRange { slba: 300, nlb: 200 }], true),
        Status::SUCCESS
    );
    assert_eq!(
        device_counts(&ctx, "ncopy0").1 - before.1,
        1,
        "overlapping: a device Copy"
    );
    assert_eq!(read(&mut c, 350, 200), b, "overlapping copy: the source as it was");
    c.io[0].write(1, 300, 200, &b).unwrap();

    // Beyond the device's limits, within pollux's: read and written through pollux.
    let nine: Vec<CopyRange> = (0..9)
        .map(|i| CopyRange {
            slba: 300 + i * 8,
            nlb: 8,
        })
        .collect();
    let five: Vec<CopyRange> = (0..5)
        .map(|i| CopyRange {
            slba: 2000 + i * 220,
            nlb: 220,
        })
        .collect();
    let big = pattern(13, 2000, 1100 * 512);
    for (i, part) in big.chunks(220 * 512).enumerate() {
        c.io[0].write(1, 2000 + i as u64 * 220, 220, part).unwrap();
    }
    for (what, dst, ranges, want) in [
        (
            "a range beyond MSSRL",
            6000u64,
            vec![CopyRange { slba: 300, nlb: 200 }, CopyRange { slba: 2000, nlb: 300 }],
            [b.clone(), big[..300 * 512].to_vec()].concat(),
        ),
        ("more ranges than MSRC + 1", 6000, nine, b[..72 * 512].to_vec()),
        ("more than MCL", 4000, five, big.clone()),
    ] {
        let before = device_counts(&ctx, "ncopy0");
        let smart = c.admin.smart_log().unwrap();
        assert_eq!(copy(&mut c, dst, &ranges, false), Status::SUCCESS, "{what}");
        let after = device_counts(&ctx, "ncopy0");
        assert_eq!((after.0, after.1), (before.0, before.1), "{what}: no device Copy");
        assert!(after.2 - before.2 >= 2, "{what}: read and written by pollux");
        assert_eq!(
            c.admin.smart_log().unwrap().host_writes - smart.host_writes,
            1,
            "{what}: one write in SMART"
        );
        let n = (want.len() / 512) as u32;
        assert_eq!(read(&mut c, dst, n), want, "{what}: copied through pollux");
    }

    // Bad ranges: LBA Out of Range, nothing sent to the device, nothing changed.
    let before = device_counts(&ctx, "ncopy0");
    let old = read(&mut c, 7000, 8);
    let s = copy(
        &mut c,
        7000,
        &[CopyRange {
            slba: BLOCKS8M - 4,
            nlb: 8,
        }],
        false,
    );
    assert_eq!((code(s), s.dnr()), ((0, 0x80), true), "source beyond the end");
    let s = copy(&mut c, BLOCKS8M - 4, &[CopyRange { slba: 0, nlb: 8 }], false);
    assert_eq!((code(s), s.dnr()), ((0, 0x80), true), "destination beyond the end");
    let after = device_counts(&ctx, "ncopy0");
    assert_eq!(
        (after.0, after.1),
        (before.0, before.1),
        "a refused copy reached the device"
    );
    assert_eq!(read(&mut c, 7000, 8), old);

    // A device error status reaches the host as the Copy's status.
    ctx.call(
        "nvme_fault",
        &serde_json::json!({"device": "ncopy0", "kind": "fail", "count": 1, "status": 0x286}),
    )
    .unwrap();
    let s = copy(&mut c, 5000, &[CopyRange { slba: 100, nlb: 16 }], false);
    assert_eq!(code(s), (2, 0x86), "the device's status");
    c.shutdown().unwrap();
    t.shutdown().unwrap();
}

/// The parked requests of the reactors, by `reactors` (summed).
fn parked(ctx: &Ctx) -> u64 {
    let v = ctx.call("reactors", &serde_json::Value::Null).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|r| r["requests"]["parked"].as_u64().unwrap())
        .sum()
}

#[test]
fn a_first_waiting_for_its_second_is_a_parked_request_until_the_pair_ends() {
    let text = conf_with(
        "interrupt",
        "",
        F_NQN,
        &format!("[[subsystem.namespace]]\nnsid = 1\nblock_size = 512\nbackend = {RAM}"),
    );
    let (t, ctx) = start_with_ctx(&text);
    let mut c = Controller::connect(addr(&t), F_NQN, HOST, 1, 32, Digests::NONE).unwrap();
    let data = pattern(7, 40, 4096);
    c.io[0].write(1, 40, 8, &data).unwrap();
    assert_eq!(parked(&ctx), 0);
    let q = &mut c.io[0];
    let (first, second) = sqe::compare_and_write(1, 40, 8);
    // The first (its data in the capsule) waits for the next command: one Parked request.
    let cid = q.submit(first, Data::ToCtrl(data.clone()), 0).unwrap();
    let deadline = std::time::Instant::now() + WAIT;
    while parked(&ctx) != 1 {
        assert!(std::time::Instant::now() < deadline, "the first never showed as parked");
        // Sends what the queue holds (nothing completes: the first waits).
        q.poll_completions(Some(std::time::Duration::from_millis(5)), |c| {
            panic!("nothing should complete yet: {c:?}")
        })
        .unwrap();
    }
    // Its second: the pair runs and both end; nothing stays parked.
    let cid2 = q.submit(second, Data::ToCtrl(pattern(8, 40, 4096)), 0).unwrap();
    let (mut s1, mut s2) = (None, None);
    while s1.is_none() || s2.is_none() {
        assert!(std::time::Instant::now() < deadline, "the pair never completed");
        q.poll_completions(Some(std::time::Duration::from_millis(100)), |c| {
            if c.cid == cid {
                s1 = Some(c.status);
            } else if c.cid == cid2 {
                s2 = Some(c.status);
            }
        })
        .unwrap();
    }
    assert_eq!((s1, s2), (Some(Status::SUCCESS), Some(Status::SUCCESS)));
    assert_eq!(parked(&ctx), 0, "the pair's requests went when it ended");
    drop(c);
    t.shutdown().unwrap();
}
