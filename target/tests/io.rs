//! NVM I/O command checks (NVM Command Set 1.0 §3): LBA ranges, namespace IDs, MDTS, both
//! ends of a namespace, SMART counters, and many commands in flight on several queues.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use pollux_host::{Data, DsmRange, HostQueue, SmartLog, sqe};
use pollux_nvme::spec::Sqe;

const LBA_OUT_OF_RANGE: (u8, u8) = (0, 0x80);
const INVALID_NAMESPACE: (u8, u8) = (0, 0x0B);

/// Runs `sqe` with `data`, returning (SCT, SC).
fn status_of(q: &mut HostQueue, s: Sqe, data: Data) -> (u8, u8) {
    code(q.exec(s, data).unwrap().status)
}

#[test]
fn out_of_range_lbas_are_lba_out_of_range() {
    let t = start("");
    let mut c = controller(addr(&t), 1);
    let q = &mut c.io[0];
    let last = BLOCKS - 1;
    for (slba, nlb) in [
        (BLOCKS, 1u32),
        (last, 2),
        (BLOCKS + 1000, 8),
        (u64::MAX, 1),
        (u64::MAX - 3, 8),
    ] {
        let len = nlb as usize * 512;
        let what = format!("slba {slba} nlb {nlb}");
        assert_eq!(
            status_of(q, sqe::read(1, slba, nlb), Data::FromCtrl(vec![0; len])),
            LBA_OUT_OF_RANGE,
            "read {what}"
        );
        // In-capsule write (4 KiB at most) and, for the larger one, a write by R2T.
        assert_eq!(
            status_of(q, sqe::write(1, slba, nlb), Data::ToCtrl(vec![1; len])),
            LBA_OUT_OF_RANGE,
            "write {what}"
        );
        assert_eq!(
            status_of(q, sqe::write_zeroes(1, slba, nlb), Data::None),
            LBA_OUT_OF_RANGE,
            "write zeroes {what}"
        );
        let range = DsmRange { cattr: 0, nlb, slba };
        assert_eq!(
            err_code(q.dataset_management(1, &[range], sqe::DSM_DEALLOCATE)),
            LBA_OUT_OF_RANGE,
            "dsm {what}"
        );
    }
    // A write by R2T (beyond the in-capsule size) that starts in range and ends outside.
    assert_eq!(
        status_of(q, sqe::write(1, BLOCKS - 8, 64), Data::ToCtrl(vec![1; 64 * 512])),
        LBA_OUT_OF_RANGE
    );
    // One bad range among good ones fails the whole Dataset Management.
    let good = DsmRange {
        cattr: 0,
        nlb: 8,
        slba: 0,
    };
    let bad = DsmRange {
        cattr: 0,
        nlb: 2,
        slba: last,
    };
    assert_eq!(
        err_code(q.dataset_management(1, &[good, bad], sqe::DSM_DEALLOCATE)),
        LBA_OUT_OF_RANGE
    );
    // The queue still works.
    q.write(1, 0, 1, &[5; 512]).unwrap();
    drop(c);
    t.shutdown().unwrap();
}

#[test]
fn unknown_namespaces_are_invalid_namespace() {
    let t = start("");
    let mut c = controller(addr(&t), 1);
    let q = &mut c.io[0];
    for nsid in [0u32, 2, 1024, 0xFFFF_FFFE, 0xFFFF_FFFF] {
        assert_eq!(
            status_of(q, sqe::read(nsid, 0, 1), Data::FromCtrl(vec![0; 512])),
            INVALID_NAMESPACE,
            "read nsid {nsid:#x}"
        );
        assert_eq!(
            status_of(q, sqe::write(nsid, 0, 1), Data::ToCtrl(vec![0; 512])),
            INVALID_NAMESPACE,
            "write nsid {nsid:#x}"
        );
        assert_eq!(
            status_of(q, sqe::write_zeroes(nsid, 0, 1), Data::None),
            INVALID_NAMESPACE,
            "write zeroes nsid {nsid:#x}"
        );
        if nsid != 0xFFFF_FFFF {
            // Flush of FFFFFFFFh means every namespace (NVMe 2.0 §7.1).
            assert_eq!(err_code(q.flush(nsid)), INVALID_NAMESPACE, "flush nsid {nsid:#x}");
        }
    }
    q.flush(0xFFFF_FFFF).unwrap();
    q.flush(1).unwrap();
    // Identify Namespace of an unknown NSID is a zero-filled structure, of 0/broadcast an
    // error.
    let id = c.admin.identify_namespace(7).unwrap();
    assert_eq!((id.nsze, id.block_size), (0, 0));
    assert_eq!(
        c.admin.identify_namespace(0).unwrap_err().status().map(code),
        Some(INVALID_NAMESPACE)
    );
    drop(c);
    t.shutdown().unwrap();
}

#[test]
fn transfers_above_mdts_are_refused() {
    let t = start("[transport]\nmax_io_size = \"64KiB\"\n");
    let mut c = controller(addr(&t), 1);
    assert_eq!(c.id.mdts, 4, "64 KiB = 4 KiB << 4");
    let max = c.max_transfer().unwrap() as usize;
    assert_eq!(max, 65536);
    let blocks = (max / 512) as u32;
    let q = &mut c.io[0];
    // Exactly MDTS works both ways.
    let data = pattern(1, 100, max);
    q.write(1, 100, blocks, &data).unwrap();
    let mut back = vec![0u8; max];
    q.read(1, 100, blocks, &mut back).unwrap();
    assert_eq!(back, data);
    // One block more is refused, and nothing is written.
    let (sct, sc) = status_of(q, sqe::read(1, 100, blocks + 1), Data::FromCtrl(vec![0; max + 512]));
    assert!(sct == 0 && sc != 0, "read above MDTS: ({sct}, {sc:#x})");
    let s = q
        .exec(sqe::write(1, 100, blocks + 1), Data::ToCtrl(vec![9; max + 512]))
        .unwrap()
        .status;
    assert!(!s.is_success() && s.sct() == 0 && s.dnr(), "write above MDTS: {s:?}");
    q.read(1, 100, blocks, &mut back).unwrap();
    assert_eq!(back, data);
    // Write Zeroes carries no data: MDTS does not apply to it.
    q.write_zeroes(1, 100, blocks * 4).unwrap();
    drop(c);
    t.shutdown().unwrap();
}

#[test]
fn both_ends_of_the_namespace_work() {
    let t = start("");
    let mut c = controller(addr(&t), 1);
    let q = &mut c.io[0];
    let mut back = vec![0u8; 32 * 512];
    for (slba, nlb) in [(0u64, 1u32), (BLOCKS - 1, 1), (BLOCKS - 32, 32), (0, 32)] {
        let len = nlb as usize * 512;
        let data = pattern(slba, nlb.into(), len);
        q.write(1, slba, nlb, &data).unwrap();
        q.read(1, slba, nlb, &mut back[..len]).unwrap();
        assert_eq!(&back[..len], &data[..], "slba {slba} nlb {nlb}");
    }
    q.write_zeroes(1, BLOCKS - 1, 1).unwrap();
    q.read(1, BLOCKS - 1, 1, &mut back[..512]).unwrap();
    assert!(back[..512].iter().all(|&b| b == 0));
    let range = DsmRange {
        cattr: 0,
        nlb: 32,
        slba: BLOCKS - 32,
    };
    q.dataset_management(1, &[range], sqe::DSM_DEALLOCATE).unwrap();
    q.read(1, BLOCKS - 32, 32, &mut back).unwrap();
    assert!(
        back.iter().all(|&b| b == 0),
        "deallocated blocks read as zeroes (DLFEAT)"
    );
    drop(c);
    t.shutdown().unwrap();
}

#[test]
fn smart_counters_grow_by_exactly_the_commands_issued() {
    let t = start("");
    let mut c = controller(addr(&t), 2);
    let before = c.admin.smart_log().unwrap();
    let mut buf = vec![0u8; 4096];
    for i in 0..5u64 {
        let q = &mut c.io[(i % 2) as usize];
        q.write(1, i * 8, 8, &pattern(i, i, 4096)).unwrap();
    }
    for i in 0..7u64 {
        let q = &mut c.io[(i % 2) as usize];
        q.read(1, i * 8, 8, &mut buf).unwrap();
    }
    // Failed commands and flushes are not host reads or writes.
    c.io[0].flush(1).unwrap();
    assert!(c.io[0].read(1, BLOCKS, 1, &mut buf[..512]).is_err());
    let after = c.admin.smart_log().unwrap();
    assert_eq!(after.host_writes - before.host_writes, 5);
    assert_eq!(after.host_reads - before.host_reads, 7);
    // 7 x 4 KiB = 56 units of 512 bytes: one data unit (thousands, rounded up).
    assert_eq!(after.data_units_read, 1);
    assert_eq!(after.data_units_written, 1);
    // A RAM namespace has no sensor: the host's temperature (or a nominal 25 °C), never 0 K;
    // nothing of RAM wears; the out-of-range read is the one error logged.
    assert!((250..=400).contains(&after.temperature_k), "{} K", after.temperature_k);
    assert_eq!(
        (after.avail_spare, after.spare_thresh, after.percent_used),
        (100, 10, 0)
    );
    assert_eq!(after.critical_warning, 0);
    assert_eq!(after.power_cycles, 1);
    // The I/O queue reports its error to the controller by message: it may trail the read.
    let deadline = Instant::now() + Duration::from_secs(2);
    while c.admin.smart_log().unwrap().error_log_entries == before.error_log_entries {
        assert!(
            Instant::now() < deadline,
            "the failed read never reached the error log count"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        c.admin.smart_log().unwrap().error_log_entries - before.error_log_entries,
        1
    );
    // The Error Information log names the failed read, newest first (NVMe 2.0 §5.16.1.2).
    let errors = c.admin.error_log(1).unwrap();
    let newest = errors.first().expect("the failed read's entry");
    assert_eq!(
        u128::from(newest.error_count),
        c.admin.smart_log().unwrap().error_log_entries
    );
    let sqid = c.io[0].qid();
    assert_eq!(
        (newest.sqid, newest.nsid, newest.lba, newest.trtype),
        (sqid, 1, BLOCKS, 3)
    );
    assert_eq!(code(newest.status), (0, 0x80), "LBA Out of Range");
    // Per namespace (Identify Controller LPA bit 0): namespace 1 did it all; an inactive
    // NSID is Invalid Namespace.
    let id = c.admin.identify(0x01, 0).unwrap();
    assert_eq!(id[261] & 1, 1, "LPA (byte 261): SMART per namespace");
    assert_eq!(
        id[76],
        (1 << 1) | (1 << 3),
        "CMIC (byte 76): multi-controller, ANA reporting, one port (one listener)"
    );
    assert_eq!(
        u16::from_le_bytes([id[520], id[521]]) & (1 << 4),
        1 << 4,
        "ONCS: Save and Select"
    );
    let mut s = sqe::get_log_page(0x02, 512, 0, false);
    s.nsid.set(1);
    let page = c.admin.exec_ok(s, Data::FromCtrl(vec![0; 512])).unwrap().buf;
    let one = SmartLog::parse(&page).unwrap();
    assert_eq!((one.host_reads, one.host_writes), (after.host_reads, after.host_writes));
    let mut s = sqe::get_log_page(0x02, 512, 0, false);
    s.nsid.set(9);
    let e = c.admin.exec_ok(s, Data::FromCtrl(vec![0; 512])).unwrap_err();
    assert_eq!(e.status().map(code), Some(INVALID_NAMESPACE));
    drop(c);
    t.shutdown().unwrap();
}

#[test]
fn deep_queues_on_every_reactor_in_poll_mode_keep_data_intact() {
    let t = start_text(&conf("poll", ""));
    let mut c = controller(addr(&t), 2);
    const PER_QUEUE: u64 = 600;
    let mut pool: Vec<Vec<u8>> = Vec::new();
    // Writes on both queues at once, each queue its own LBA half, 16 in flight each.
    for phase in 0..2 {
        let mut next = [0u64; 2];
        let mut done = [0u64; 2];
        while done.iter().sum::<u64>() < 2 * PER_QUEUE {
            for (qi, q) in c.io.iter_mut().enumerate() {
                let base = qi as u64 * (BLOCKS / 2);
                while next[qi] < PER_QUEUE && q.in_flight() < 16 {
                    let i = next[qi];
                    let mut b = pool.pop().unwrap_or_default();
                    b.clear();
                    if phase == 0 {
                        b.extend_from_slice(&pattern(i, base + i * 8, 4096));
                        q.submit_write(1, base + i * 8, 8, b, i).unwrap();
                    } else {
                        b.resize(4096, 0);
                        q.submit_read(1, base + i * 8, 8, b, i).unwrap();
                    }
                    next[qi] += 1;
                }
                done[qi] += q
                    .poll_completions(Some(Duration::from_millis(1)), |cpl| {
                        assert!(cpl.is_success(), "{:?}", cpl.status);
                        if phase == 1 {
                            assert_eq!(cpl.buf, pattern(cpl.tag, base + cpl.tag * 8, 4096));
                        }
                        pool.push(cpl.buf);
                    })
                    .unwrap() as u64;
            }
        }
    }
    c.shutdown().unwrap();
    t.shutdown().unwrap();
}
