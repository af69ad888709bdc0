//! The driver against the fake controller: bring-up, queues, PRPs, MDTS, resets, faults.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::fake::{FakeConfig, FakeController};
use super::*;
use crate::spec::Status;

fn start(fc: FakeConfig, cc: ControllerConfig) -> (FakeController, Hardware, Controller) {
    let (fake, hw) = FakeController::start(fc);
    let ctrl = Controller::new(hw.clone(), cc).unwrap();
    (fake, hw, ctrl)
}

fn quick() -> ControllerConfig {
    ControllerConfig {
        io_queues: 2,
        command_timeout: Duration::from_secs(5),
        ..Default::default()
    }
}

/// A buffer of `len` bytes at byte `offset` of a fresh region.
fn buffer(hw: &Hardware, offset: usize, len: usize) -> DmaBuf {
    let r = Arc::new(hw.dma.allocate(offset + len).unwrap());
    DmaBuf::new(r, offset, len).unwrap()
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Polls until `n` requests completed (or panics after 10 s).
fn wait(qp: &mut QueuePair, n: usize) -> Vec<Completion> {
    let mut out = Vec::new();
    let t = Instant::now();
    while out.len() < n {
        qp.poll(|c| out.push(c));
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "only {} of {n} completions",
            out.len()
        );
        std::hint::spin_loop();
    }
    out
}

fn run(qp: &mut QueuePair, req: IoRequest) -> Completion {
    qp.submit(req).unwrap();
    wait(qp, 1).pop().unwrap()
}

#[test]
fn bring_up_identify_and_shutdown() {
    let (fake, hw, mut ctrl) = start(FakeConfig::default(), quick());
    let info = ctrl.info().clone();
    assert_eq!(info.model, "pollux fake NVMe controller");
    assert_eq!(info.serial, "FAKE0001");
    assert_eq!(info.mdts_bytes, Some(128 << 10));
    assert_eq!(info.max_transfer, 128 << 10);
    assert_eq!(info.io_queues, 2);
    assert_eq!(info.vectors, 3);
    assert_eq!(
        info.namespaces,
        vec![
            Namespace {
                nsid: 1,
                blocks: 32768,
                lba_shift: 9,
                copy: Some(CopyLimits {
                    max_range_blocks: 256,
                    max_blocks: 1024,
                    max_ranges: 8
                })
            },
            Namespace {
                nsid: 2,
                blocks: 2048,
                lba_shift: 12,
                copy: Some(CopyLimits {
                    max_range_blocks: 256,
                    max_blocks: 1024,
                    max_ranges: 8
                })
            }
        ]
    );
    let csts = ctrl.registers().csts();
    assert!(csts.rdy() && !csts.cfs());
    let cc = ctrl.registers().cc();
    assert_eq!((cc.iosqes(), cc.iocqes(), cc.mps(), cc.css()), (6, 4, 0, 0));
    let q1 = ctrl.create_io_queue_pair(64).unwrap();
    let q2 = ctrl.create_io_queue_pair(64).unwrap();
    assert_eq!((q1.qid(), q2.qid()), (1, 2));
    assert!(matches!(
        ctrl.create_io_queue_pair(64),
        Err(PciError::NoQueueLeft { granted: 2, .. })
    ));
    assert!(q1.eventfd().is_some());
    drop(q2);
    let q2 = ctrl.create_io_queue_pair(16).unwrap(); // qid 2 reused after the dropped one is reaped
    assert_eq!(q2.qid(), 2);
    drop((q1, q2));
    let regs = ctrl.registers().clone();
    ctrl.shutdown().unwrap();
    assert_eq!(regs.csts().shst(), crate::spec::Csts::SHST_COMPLETE);
    assert_eq!(fake.stats().enables, 1);
    drop(hw);
    assert_eq!(fake.mappings(), 0, "DMA mappings leaked");
}

#[test]
fn bring_up_times_out_naming_the_register() {
    let (fake, hw) = FakeController::start(FakeConfig {
        cap_to: 1,
        ..Default::default()
    });
    fake.stall_ready(true);
    let t = Instant::now();
    let e = Controller::new(hw, quick()).unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(
            e,
            PciError::RegisterTimeout {
                register: "CSTS",
                awaited: "RDY=1",
                ..
            }
        ),
        "{msg}"
    );
    assert!(
        msg.contains("fake") && msg.contains("CSTS") && msg.contains("RDY=1"),
        "{msg}"
    );
    assert!(t.elapsed() >= Duration::from_millis(500), "CAP.TO = 1 is 500 ms");
}

fn wrap_rounds(depth: u16, rounds: usize) {
    let (fake, hw, mut ctrl) = start(FakeConfig::default(), quick());
    let ns = ctrl.namespaces()[0];
    let mut qp = ctrl.create_io_queue_pair(depth).unwrap();
    assert_eq!(qp.depth(), depth);
    let per = usize::from(depth) - 1;
    let bufs: Vec<DmaBuf> = (0..per).map(|_| buffer(&hw, 0, 512)).collect();
    let mut done = 0u64;
    for round in 0..rounds {
        for (i, b) in bufs.iter().enumerate() {
            let tag = (round * per + i) as u64;
            b.write(&pattern(tag, 512));
            qp.submit(IoRequest::write(&ns, tag % ns.blocks, b.clone(), tag))
                .unwrap();
        }
        qp.flush();
        for c in wait(&mut qp, per) {
            assert_eq!(c.status, Status::SUCCESS);
            done += 1;
        }
    }
    // Read back the last round.
    let last = (rounds - 1) * per;
    for (i, b) in bufs.iter().enumerate() {
        let tag = (last + i) as u64;
        b.write(&[0u8; 512]);
        let c = run(&mut qp, IoRequest::read(&ns, tag % ns.blocks, b.clone(), tag));
        assert!(c.status.is_success());
        let mut got = vec![0u8; 512];
        b.read(&mut got);
        assert_eq!(got, pattern(tag, 512), "tag {tag}");
    }
    assert_eq!(done, (rounds * per) as u64);
    assert_eq!(fake.stats().io_commands, (rounds * per + per) as u64);
    let st = qp.stats();
    assert_eq!(st.completed, st.requests);
    // One doorbell per batch (plus one per single read-back).
    assert_eq!(st.sq_doorbells, rounds as u64 + per as u64);
}

#[test]
fn queue_wrap_and_phase_depth_4() {
    wrap_rounds(4, 1500); // 4500 commands, the 4-entry rings wrap 1125 times
}

#[test]
fn queue_wrap_and_phase_depth_64() {
    wrap_rounds(64, 80); // 5040 commands
}

#[test]
fn batched_doorbell_is_rung_once() {
    let (fake, hw, mut ctrl) = start(FakeConfig::default(), quick());
    let ns = ctrl.namespaces()[0];
    let mut qp = ctrl.create_io_queue_pair(64).unwrap();
    let before = fake.stats().io_sq_doorbells;
    for i in 0..32u64 {
        qp.submit(IoRequest::write(&ns, i, buffer(&hw, 0, 512), i)).unwrap();
    }
    assert_eq!(fake.stats().io_sq_doorbells, before, "no doorbell before flush");
    qp.flush();
    qp.flush();
    assert_eq!(fake.stats().io_sq_doorbells, before + 1);
    assert_eq!(wait(&mut qp, 32).len(), 32);
}

/// Writes `pages` pages from a buffer starting `offset` bytes into its region, checks the
/// namespace, reads back into another misaligned buffer.
fn prp_case(
    fake: &FakeController,
    hw: &Hardware,
    qp: &mut QueuePair,
    ns: &Namespace,
    offset: usize,
    pages: usize,
    lba: u64,
) -> u16 {
    let len = pages * PAGE_SIZE;
    let data = pattern(pages as u64 * 31 + offset as u64, len);
    let w = buffer(hw, offset, len);
    w.write(&data);
    let c = run(qp, IoRequest::write(ns, lba, w, 1));
    assert_eq!(c.status, Status::SUCCESS, "write of {pages} pages at offset {offset}");
    let start = (lba << ns.lba_shift) as usize;
    assert!(
        fake.read_namespace(ns.nsid, start, len) == data,
        "namespace content, {pages} pages at offset {offset}"
    );
    let r = buffer(hw, (offset + 2048) % PAGE_SIZE, len);
    let c2 = run(qp, IoRequest::read(ns, lba, r.clone(), 2));
    assert_eq!(c2.status, Status::SUCCESS);
    let mut got = vec![0u8; len];
    r.read(&mut got);
    assert!(got == data, "read back {pages} pages at offset {offset}");
    c.commands
}

#[test]
fn prp_lists_across_pages_with_offsets() {
    // No MDTS: one command per request, so PRP lists carry everything.
    let fc = FakeConfig {
        mdts: 0,
        ..Default::default()
    };
    let cc = ControllerConfig {
        max_transfer: 4 << 20,
        ..quick()
    };
    let (fake, hw, mut ctrl) = start(fc, cc);
    assert_eq!(ctrl.info().mdts_bytes, None);
    let ns = ctrl.namespaces()[0];
    let mut qp = ctrl.create_io_queue_pair(32).unwrap();
    for offset in [0usize, 512, 4092, 100 * 4] {
        for pages in [1usize, 2, 3, 257] {
            let cmds = prp_case(&fake, &hw, &mut qp, &ns, offset, pages, 64);
            assert_eq!(cmds, 1);
        }
    }
    // 600 pages at an offset: 601 entries, a chained PRP list.
    assert_eq!(prp_case(&fake, &hw, &mut qp, &ns, 8, 600, 0), 1);
    // Not dword aligned: refused before anything reaches the device.
    let bad = buffer(&hw, 2, 512);
    let rej = qp.submit(IoRequest::write(&ns, 0, bad, 9)).unwrap_err();
    assert_eq!(rej.error, QueueError::Invalid("buffer not dword aligned"));
    assert_eq!(rej.request.tag, 9);
}

#[test]
fn mdts_splits_requests() {
    // MDTS 2: 16 KiB per command.
    let (fake, hw, mut ctrl) = start(
        FakeConfig {
            mdts: 2,
            ..Default::default()
        },
        quick(),
    );
    assert_eq!(ctrl.info().max_transfer, 16 << 10);
    let ns = ctrl.namespaces()[0];
    let mut qp = ctrl.create_io_queue_pair(32).unwrap();
    let before = fake.stats().io_commands;
    assert_eq!(prp_case(&fake, &hw, &mut qp, &ns, 0, 16, 8), 4);
    assert_eq!(prp_case(&fake, &hw, &mut qp, &ns, 1024, 17, 100), 5);
    assert_eq!(fake.stats().io_commands - before, 2 * (4 + 5));
    // On the 4 KiB namespace too.
    let ns2 = ctrl.namespaces()[1];
    assert_eq!(prp_case(&fake, &hw, &mut qp, &ns2, 0, 9, 3), 3);
    // More commands than the queue holds: refused whole.
    let mut small = ctrl.create_io_queue_pair(4).unwrap();
    let rej = small
        .submit(IoRequest::write(&ns, 0, buffer(&hw, 0, 64 << 10), 0))
        .unwrap_err();
    assert_eq!(rej.error, QueueError::TooLarge { needed: 4, depth: 3 });
}

#[test]
fn full_queue_depth() {
    let (fake, hw, mut ctrl) = start(FakeConfig::default(), quick());
    fake.set_latency(Duration::from_millis(30));
    let ns = ctrl.namespaces()[0];
    let mut qp = ctrl.create_io_queue_pair(8).unwrap();
    for i in 0..7u64 {
        qp.submit(IoRequest::write(&ns, i, buffer(&hw, 0, 512), i)).unwrap();
    }
    assert_eq!(qp.free_slots(), 0);
    let rej = qp.submit(IoRequest::write(&ns, 7, buffer(&hw, 0, 512), 7)).unwrap_err();
    assert_eq!(rej.error, QueueError::Full { needed: 1, free: 0 });
    qp.flush();
    assert!(qp.oldest_submitted().is_some());
    let t = qp.next_expected(Duration::from_millis(30)).unwrap();
    assert!(t > Instant::now() - Duration::from_millis(1));
    let cs = wait(&mut qp, 7);
    assert!(
        cs.iter()
            .all(|c| c.status.is_success() && c.latency >= Duration::from_millis(25)),
        "{cs:?}"
    );
    // Requeue the rejected one.
    assert!(run(&mut qp, *rej.request).status.is_success());
    assert_eq!(qp.inflight(), 0);
    assert!(qp.oldest_submitted().is_none());
}

#[test]
fn interrupts_signal_the_queue_eventfd() {
    let (fake, hw, mut ctrl) = start(FakeConfig::default(), quick());
    let ns = ctrl.namespaces()[0];
    let mut qp = ctrl.create_io_queue_pair(16).unwrap();
    let fd = qp.eventfd().unwrap();
    qp.submit(IoRequest::write(&ns, 0, buffer(&hw, 0, 512), 0)).unwrap();
    qp.flush();
    // Sleep on the eventfd as the reactor would.
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    let n = unsafe { libc::poll(&mut pfd, 1, 5000) };
    assert_eq!(n, 1);
    assert!(qp.ack_interrupts() >= 1);
    assert_eq!(wait(&mut qp, 1).len(), 1);
    assert!(fake.stats().interrupts >= 1);
    // A polled-only controller gives no eventfd.
    let (_f2, hw2, mut c2) = start(
        FakeConfig::default(),
        ControllerConfig {
            interrupts: false,
            ..quick()
        },
    );
    assert!(c2.create_io_queue_pair(8).unwrap().eventfd().is_none());
    drop(hw2);
}

#[test]
fn error_statuses_are_typed() {
    let (fake, hw, mut ctrl) = start(FakeConfig::default(), quick());
    let ns = ctrl.namespaces()[0];
    let mut qp = ctrl.create_io_queue_pair(16).unwrap();
    fake.fail_io(1, Status::UNRECOVERED_READ_ERROR);
    let c = run(&mut qp, IoRequest::read(&ns, 0, buffer(&hw, 0, 512), 1));
    assert_eq!(c.status, Status::UNRECOVERED_READ_ERROR);
    assert_eq!((c.status.sct(), c.status.sc()), (crate::spec::sct::MEDIA, 0x81));
    let c = run(&mut qp, IoRequest::read(&ns, ns.blocks - 1, buffer(&hw, 0, 1024), 2));
    assert_eq!(c.status, Status::LBA_OUT_OF_RANGE.with_dnr());
    let bogus = Namespace {
        nsid: 7,
        blocks: 10,
        lba_shift: 9,
        copy: None,
    };
    let c = run(&mut qp, IoRequest::read(&bogus, 0, buffer(&hw, 0, 512), 3));
    assert_eq!(c.status, Status::INVALID_NAMESPACE);
    // A split request reports the first failure.
    fake.fail_io(1, Status::WRITE_FAULT);
    let c = run(&mut qp, IoRequest::write(&ns, 0, buffer(&hw, 0, 256 << 10), 4));
    assert_eq!((c.status, c.commands), (Status::WRITE_FAULT, 2));
    // Admin failures name the command.
    let mut sqe = <crate::spec::Sqe as zerocopy::FromZeros>::new_zeroed();
    sqe.opcode = 0xC5;
    let e = ctrl.admin_command(sqe, None, "vendor command").unwrap_err();
    assert!(
        matches!(e, PciError::CommandFailed { opcode: 0xC5, status, .. } if status == Status::INVALID_OPCODE.with_dnr())
    );
    assert!(e.to_string().contains("vendor command"), "{e}");
    // Abort of a command that is not there: not aborted.
    assert!(!ctrl.abort(1, 0).unwrap());
    // Write Zeroes and Flush.
    let w = buffer(&hw, 0, 4096);
    w.write(&[0xAA; 4096]);
    assert!(run(&mut qp, IoRequest::write(&ns, 10, w, 5)).status.is_success());
    assert!(run(&mut qp, IoRequest::write_zeroes(&ns, 11, 2, 6)).status.is_success());
    assert!(run(&mut qp, IoRequest::flush(&ns, 7)).status.is_success());
    let d = fake.read_namespace(1, 10 * 512, 4096);
    assert!(
        d[..512].iter().all(|&b| b == 0xAA)
            && d[512..1536].iter().all(|&b| b == 0)
            && d[1536..].iter().all(|&b| b == 0xAA)
    );
}

#[test]
fn lost_completion_times_out_resets_and_recovers() {
    let cc = ControllerConfig {
        command_timeout: Duration::from_millis(150),
        ..quick()
    };
    let (fake, hw, mut ctrl) = start(FakeConfig::default(), cc);
    let ns = ctrl.namespaces()[0];
    let mut qp = ctrl.create_io_queue_pair(16).unwrap();
    let mut other = ctrl.create_io_queue_pair(16).unwrap();
    let data = buffer(&hw, 0, 512);
    data.write(&pattern(5, 512));
    assert!(
        run(&mut qp, IoRequest::write(&ns, 5, data.clone(), 0))
            .status
            .is_success()
    );

    fake.lose_completions(1);
    let submitted = Instant::now();
    for i in 1..=3u64 {
        qp.submit(IoRequest::read(&ns, 5, buffer(&hw, 0, 512), i)).unwrap();
    }
    qp.flush();
    let ok = wait(&mut qp, 2);
    assert!(ok.iter().all(|c| c.status.is_success()));
    assert_eq!(qp.inflight(), 1);
    let t = Instant::now();
    while !qp.timed_out() {
        assert_eq!(qp.poll(|_| panic!("the lost command completed")), 0);
        assert!(t.elapsed() < Duration::from_secs(5));
    }
    assert!(submitted.elapsed() >= Duration::from_millis(150));
    // The controller's owner notices and resets; the queue fails what it had in flight.
    let out = ctrl.service().unwrap();
    assert!(out.reset);
    assert_eq!(out.pending, 2, "neither queue has acknowledged yet");
    assert!(
        qp.submit(IoRequest::flush(&ns, 9))
            .is_err_and(|r| r.error == QueueError::Resetting)
    );
    let failed = wait(&mut qp, 1);
    assert_eq!(failed[0].status, HOST_ABORTED);
    assert_eq!(qp.inflight(), 0);
    assert!(!qp.is_live());
    let out = ctrl.service().unwrap();
    assert_eq!((out.reset, out.recreated, out.pending), (false, 1, 1));
    assert!(qp.is_live());
    assert!(!qp.timed_out());
    // Data written before the reset is still there; I/O works on both queues.
    let r = buffer(&hw, 0, 512);
    assert!(run(&mut qp, IoRequest::read(&ns, 5, r.clone(), 10)).status.is_success());
    let mut got = vec![0u8; 512];
    r.read(&mut got);
    assert_eq!(got, pattern(5, 512));
    assert_eq!(other.poll(|_| {}), 0); // acknowledges the reset
    assert_eq!(ctrl.service().unwrap().recreated, 1);
    assert!(run(&mut other, IoRequest::flush(&ns, 11)).status.is_success());
    assert_eq!(fake.stats().enables, 2);
    assert_eq!(fake.stats().lost, 1);
}

#[test]
fn controller_fatal_status_resets() {
    let (fake, hw, mut ctrl) = start(FakeConfig::default(), quick());
    let ns = ctrl.namespaces()[0];
    let mut qp = ctrl.create_io_queue_pair(32).unwrap();
    fake.set_latency(Duration::from_millis(200));
    for i in 0..5u64 {
        qp.submit(IoRequest::write(&ns, i, buffer(&hw, 0, 512), i)).unwrap();
    }
    qp.flush();
    std::thread::sleep(Duration::from_millis(20));
    fake.inject_cfs();
    let t = Instant::now();
    while !ctrl.registers().csts().cfs() {
        assert!(t.elapsed() < Duration::from_secs(2));
        std::thread::sleep(Duration::from_millis(1));
    }
    fake.set_latency(Duration::ZERO);
    let out = ctrl.service().unwrap();
    assert!(out.reset);
    assert!(!ctrl.registers().csts().cfs());
    let failed = wait(&mut qp, 5);
    assert!(failed.iter().all(|c| c.status == HOST_ABORTED && c.buf.is_some()));
    assert_eq!(ctrl.service().unwrap().recreated, 1);
    for round in 0..3u64 {
        assert!(
            run(&mut qp, IoRequest::write(&ns, round, buffer(&hw, 0, 512), round))
                .status
                .is_success()
        );
    }
    // Admin keeps working after the reset.
    assert_eq!(ctrl.info().namespaces.len(), 2);
}

#[test]
fn doorbell_stride_is_honoured() {
    let (fake, hw, mut ctrl) = start(
        FakeConfig {
            dstrd: 2,
            ..Default::default()
        },
        quick(),
    );
    assert_eq!(ctrl.registers().dstrd(), 2);
    assert_eq!(regs::sq_tail_doorbell(1, 2), 0x1000 + 2 * 16);
    assert_eq!(regs::cq_head_doorbell(1, 2), 0x1000 + 3 * 16);
    let ns = ctrl.namespaces()[1];
    let mut q1 = ctrl.create_io_queue_pair(8).unwrap();
    let mut q2 = ctrl.create_io_queue_pair(8).unwrap();
    for i in 0..50u64 {
        assert!(
            run(&mut q1, IoRequest::write(&ns, i, buffer(&hw, 0, 4096), i))
                .status
                .is_success()
        );
        assert!(
            run(&mut q2, IoRequest::read(&ns, i, buffer(&hw, 0, 4096), i))
                .status
                .is_success()
        );
    }
    assert_eq!(fake.stats().io_commands, 100);
}

#[test]
fn queue_pairs_run_on_their_own_threads() {
    let (fake, hw, mut ctrl) = start(
        FakeConfig {
            max_io_queues: 4,
            ..Default::default()
        },
        ControllerConfig {
            io_queues: 4,
            ..quick()
        },
    );
    let ns = ctrl.namespaces()[0];
    let handles: Vec<_> = (0..4u64)
        .map(|t| {
            let mut qp = ctrl.create_io_queue_pair(32).unwrap();
            let hw = hw.clone();
            std::thread::spawn(move || {
                let bufs: Vec<DmaBuf> = (0..16).map(|_| buffer(&hw, 0, 4096)).collect();
                for round in 0..50u64 {
                    for (i, b) in bufs.iter().enumerate() {
                        let lba = (t * 16 + i as u64) * 8;
                        qp.submit(IoRequest::write(&ns, lba, b.clone(), round)).unwrap();
                    }
                    qp.flush();
                    assert!(wait(&mut qp, 16).iter().all(|c| c.status.is_success()));
                }
                qp.stats().completed
            })
        })
        .collect();
    let total: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(total, 4 * 50 * 16);
    assert_eq!(fake.stats().io_commands, total);
}

/// Copy source range entries, format 0 (NVM Command Set 1.0 §3.2.2.1): (SLBA, blocks).
fn copy_entries(hw: &Hardware, ranges: &[(u64, u16)]) -> DmaBuf {
    let mut raw = vec![0u8; ranges.len() * queue::COPY_ENTRY];
    for (e, &(slba, nlb)) in raw.chunks_exact_mut(queue::COPY_ENTRY).zip(ranges) {
        e[8..16].copy_from_slice(&slba.to_le_bytes());
        e[16..18].copy_from_slice(&(nlb - 1).to_le_bytes());
    }
    let b = buffer(hw, 0, raw.len());
    b.write(&raw);
    b
}

fn read_back(hw: &Hardware, qp: &mut QueuePair, ns: &Namespace, slba: u64, blocks: usize) -> Vec<u8> {
    let b = buffer(hw, 0, blocks << ns.lba_shift);
    let c = run(qp, IoRequest::read(ns, slba, b.clone(), 99));
    assert_eq!(c.status, Status::SUCCESS);
    let mut out = vec![0u8; b.len()];
    b.read(&mut out);
    out
}

#[test]
fn the_fake_copies_format_0_ranges_itself_within_its_limits() {
    let (fake, hw, mut ctrl) = start(FakeConfig::default(), quick());
    let info = ctrl.info().clone();
    assert_ne!(info.oncs & ONCS_COPY, 0, "ONCS: Copy");
    assert_eq!(info.ocfs & OCFS_FORMAT_0, OCFS_FORMAT_0, "OCFS: format 0");
    let ns = ctrl.namespaces()[0];
    let mut qp = ctrl.create_io_queue_pair(16).unwrap();
    let (a, b) = (pattern(1, 16 * 512), pattern(2, 100 * 512));
    let wr = |qp: &mut QueuePair, slba, data: &[u8]| {
        let buf = buffer(&hw, 0, data.len());
        buf.write(data);
        assert_eq!(run(qp, IoRequest::write(&ns, slba, buf, 1)).status, Status::SUCCESS);
    };
    wr(&mut qp, 100, &a);
    wr(&mut qp, 300, &b);
    let before = fake.stats();
    // Two ranges to 5000, one command.
    let c = run(
        &mut qp,
        IoRequest::copy(&ns, 5000, copy_entries(&hw, &[(100, 16), (300, 100)]), 2, 2),
    );
    assert_eq!((c.status, c.commands), (Status::SUCCESS, 1));
    let after = fake.stats();
    assert_eq!(after.copy_commands - before.copy_commands, 1);
    assert_eq!(after.io_commands - before.io_commands, 1, "one device command");
    assert_eq!(read_back(&hw, &mut qp, &ns, 5000, 116), [a.clone(), b.clone()].concat());
    // Overlapping source and destination: the destination gets the source as it was.
    let mut q = IoRequest::copy(&ns, 350, copy_entries(&hw, &[(300, 100)]), 1, 3);
    q.cdw12_flags |= 1 << 30; // FUA
    assert_eq!(run(&mut qp, q).status, Status::SUCCESS);
    assert_eq!(read_back(&hw, &mut qp, &ns, 350, 100), b);
}

#[test]
fn the_fake_refuses_a_copy_beyond_its_limits_or_the_namespace_changing_nothing() {
    let (fake, hw, mut ctrl) = start(FakeConfig::default(), quick());
    let ns = ctrl.namespaces()[0];
    let mut qp = ctrl.create_io_queue_pair(16).unwrap();
    let size_limit = Status::new(crate::spec::sct::COMMAND_SPECIFIC, 0x83).with_dnr();
    let oor = Status::LBA_OUT_OF_RANGE.with_dnr();
    let before = read_back(&hw, &mut qp, &ns, 8000, 64);
    let stats = fake.stats();
    let nine: Vec<(u64, u16)> = (0..9).map(|i| (i * 8, 8)).collect();
    for (what, sdlba, ranges, want) in [
        ("more ranges than MSRC + 1", 8000, nine, size_limit),
        ("a range beyond MSSRL", 8000, vec![(0, 257)], size_limit),
        (
            "more than MCL",
            8000,
            vec![(0, 256), (256, 256), (512, 256), (768, 256), (1024, 1)],
            size_limit,
        ),
        ("a source beyond the end", 8000, vec![(ns.blocks - 4, 8)], oor),
        ("a destination beyond the end", ns.blocks - 4, vec![(0, 8)], oor),
    ] {
        let n = ranges.len() as u32;
        let c = run(&mut qp, IoRequest::copy(&ns, sdlba, copy_entries(&hw, &ranges), n, 1));
        assert_eq!(c.status, want, "{what}");
    }
    // Another source range format: Invalid Field.
    let mut sqe = <crate::spec::Sqe as zerocopy::FromZeros>::new_zeroed();
    sqe.opcode = crate::spec::opcode::io::COPY;
    sqe.nsid.set(ns.nsid);
    sqe.cdw10.set(8000);
    sqe.cdw12.set(1 << 8);
    qp.submit_raw(sqe, Some(copy_entries(&hw, &[(0, 8)])), 7).unwrap();
    assert_eq!(wait(&mut qp, 1)[0].status, Status::INVALID_FIELD.with_dnr(), "format 1");
    assert_eq!(fake.stats().copy_commands, stats.copy_commands, "nothing copied");
    assert_eq!(
        read_back(&hw, &mut qp, &ns, 8000, 64),
        before,
        "a refused copy changed the data"
    );
    // The queue refuses what cannot be one Copy command.
    let e = qp
        .submit(IoRequest::copy(&ns, 0, buffer(&hw, 0, 64), 3, 8))
        .unwrap_err();
    assert!(matches!(e.error, QueueError::Invalid(_)), "{:?}", e.error);
}

#[test]
fn a_fake_without_copy_says_so() {
    let (_fake, hw, mut ctrl) = start(
        FakeConfig {
            copy: None,
            ..Default::default()
        },
        quick(),
    );
    assert_eq!(ctrl.info().oncs & ONCS_COPY, 0);
    let ns = ctrl.namespaces()[0];
    assert_eq!(ns.copy, None);
    let mut qp = ctrl.create_io_queue_pair(16).unwrap();
    let c = run(&mut qp, IoRequest::copy(&ns, 100, copy_entries(&hw, &[(0, 8)]), 1, 1));
    assert_eq!(c.status, Status::INVALID_OPCODE.with_dnr());
}
