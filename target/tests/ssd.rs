//! The `nvme` backend end to end without hardware: the target serves a namespace of the
//! userspace driver's fake controller (registers and queues in memory, a thread playing the
//! device) to the host library over NVMe/TCP. Data integrity at every size class and across
//! MDTS splits, Write Zeroes and deallocate, reactor modes, and fault injection through the
//! control socket's methods: error statuses reach the host, a controller fatal status and
//! lost completions lead to a reset after which I/O works again.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use pollux_host::{Controller, Data, Digests, sqe};
use pollux_nvme::spec::Status;
use pollux_target::Target;
use pollux_target::control::rpc::Ctx;
use serde_json::{Value, json};

const SSD_NQN: &str = "nqn.2026-11.io.pollux:ssd";
/// 32 MiB of 512-byte blocks.
const SSD_BLOCKS: u64 = 65536;

fn ssd_conf(mode: &str, device: &str, latency_us: f64) -> String {
    conf_with(
        mode,
        // 1 MiB commands: the driver splits them by the fake controller's 128 KiB MDTS.
        "[transport]\nmax_io_size = \"1MiB\"",
        SSD_NQN,
        &format!(
            "[[subsystem.namespace]]\nnsid = 1\nblock_size = 512\n\
             backend = {{ nvme = {{ fake = \"{device}\", size = \"32MiB\", latency_us = {latency_us:?} }} }}"
        ),
    )
}

/// A target from `text` and its control-socket methods.
fn start_ssd(mode: &str, device: &str, latency_us: f64) -> (Target, Ctx) {
    start_with_ctx(&ssd_conf(mode, device, latency_us))
}

fn connect(t: &Target, io: u16) -> Controller {
    Controller::connect(addr(t), SSD_NQN, HOST, io, 64, Digests::NONE).unwrap()
}

#[test]
fn data_round_trips_through_the_userspace_driver_in_every_mode() {
    for (i, mode) in ["poll", "hybrid", "interrupt", "adaptive"].into_iter().enumerate() {
        let name = format!("rt{i}");
        let (t, ctx) = start_ssd(mode, &name, 0.0);
        let mut c = connect(&t, 2);
        let id = c.admin.identify_namespace(1).unwrap();
        assert_eq!(id.nsze, SSD_BLOCKS, "{mode}");
        // 512 B to 1 MiB (beyond the fake's 128 KiB MDTS: split into several commands), on
        // both queues, at block offsets that are not aligned to anything.
        let sizes = [1u32, 7, 8, 64, 255, 256, 1024, 2048];
        assert_round_trips(&mut c, 512, &sizes, |k| 3 + k as u64 * 4099, i as u64, mode);
        // The last block, and one past it.
        let last = SSD_BLOCKS - 1;
        c.io[0].write(1, last, 1, &[0xA5; 512]).unwrap();
        let e = c.io[0].write(1, last, 2, &[0xA5; 1024]).unwrap_err();
        assert_eq!(e.status().map(code), Some((0, 0x80)), "{mode}: LBA out of range");
        // Write Zeroes and deallocate read back zeroes.
        assert_zeroing_reads_zeroes(&mut c, 100, mode);
        c.io[0].flush(1).unwrap();
        let d = nvme_device(&ctx, &name);
        assert_eq!(d["kind"], "fake");
        assert_eq!(d["io_queues"], 2, "one queue pair per reactor");
        assert_eq!(d["state"], "ok");
        c.shutdown().unwrap();
        t.shutdown().unwrap();
    }
}

#[test]
fn write_data_in_pieces_goes_in_place_into_dma_buffers_and_is_digest_checked() {
    let (t, _ctx) = start_ssd("poll", "inplace", 0.0);
    for d in [Digests::NONE, Digests::BOTH] {
        let mut c = Controller::connect(addr(&t), SSD_NQN, HOST, 1, 32, d).unwrap();
        let q = &mut c.io[0];
        let h = if d.hdgst { 28 } else { 24 };
        let slba = 4000;
        let old = pattern(1, slba, 131072);
        q.write(1, slba, 256, &old).unwrap();
        // A 128 KiB write in one H2CData PDU: the header with a little data, then the rest,
        // received into the DMA buffer of the write (and its digest computed there).
        let data = pattern(2, slba, 131072);
        let ttag = r2t_write(q, 3, slba, 131072);
        let pdu = q.h2c_data_pdu(3, ttag, 0, &data, true);
        send_in_pieces(q, &pdu, &[h + 100, h + 70000]);
        assert_eq!(expect_resp(q, 3), (0, 0), "{d:?}");
        let mut back = vec![0u8; 131072];
        q.read(1, slba, 256, &mut back).unwrap();
        assert!(back == data, "{d:?}: the write did not arrive whole");
        if d.ddgst {
            // A flipped bit in the part that went in place: the write fails, the device
            // keeps the data it had.
            let ttag = r2t_write(q, 4, slba, 131072);
            let mut pdu = q.h2c_data_pdu(4, ttag, 0, &pattern(3, slba, 131072), true);
            pdu[h + 90000] ^= 0x02;
            send_in_pieces(q, &pdu, &[h + 100]);
            assert_eq!(expect_resp(q, 4), (0, 0x22), "Transient Transport Error");
            q.read(1, slba, 256, &mut back).unwrap();
            assert!(back == data, "a write with a bad digest reached the device");
        }
        c.shutdown().unwrap();
    }
    t.shutdown().unwrap();
}

#[test]
fn writes_cut_off_before_their_data_give_their_dma_buffers_back() {
    let (t, ctx) = start_ssd("poll", "churn", 0.0);
    let name = "churn";
    // A host that connects, asks for 8 x 128 KiB of R2T writes, aborts one and vanishes
    // before sending any data, over and over: each round's buffers are reused by the next,
    // so the DMA memory the channels allocate stays at one round's worth.
    const ROUNDS: u16 = 24;
    for round in 0..ROUNDS {
        let mut c = connect(&t, 1);
        for cid in 1..=8 {
            r2t_write(&mut c.io[0], cid, u64::from(cid) * 256, 131072);
        }
        // Aborted: its R2T stays to drain data that never comes.
        assert_eq!(c.admin.abort(1, 1 + round % 8).unwrap() & 1, 0, "round {round}");
        drop(c);
    }
    // The device still serves a clean connection.
    let mut c = connect(&t, 1);
    let data = pattern(9, 0, 131072);
    c.io[0].write(1, 0, 256, &data).unwrap();
    let mut back = vec![0u8; 131072];
    c.io[0].read(1, 0, 256, &mut back).unwrap();
    assert!(back == data);
    c.shutdown().unwrap();
    // Two reactors, a 2 MiB chunk each for a round's 1 MiB, and slack for a connection's
    // close that lands after the next one's writes; without recycling it is ROUNDS MiB.
    let allocated = nvme_device(&ctx, name)["data_dma_bytes"].as_u64().unwrap();
    assert!(
        allocated > 0 && allocated <= 8 << 20,
        "{allocated} bytes of DMA data buffers"
    );
    t.shutdown().unwrap();
}

#[test]
fn many_commands_in_flight_on_both_reactors() {
    let (t, _ctx) = start_ssd("interrupt", "qd", 20.0);
    let mut c = connect(&t, 2);
    // 2 x 48 commands in flight, 4 KiB each, then read everything back.
    for q in 0..2usize {
        for k in 0..48u64 {
            let slba = (q as u64 * 48 + k) * 8;
            let data = pattern(7, slba, 4096);
            c.io[q].submit_write(1, slba, 8, data, k).unwrap();
        }
    }
    for q in 0..2usize {
        let mut done = 0;
        let deadline = Instant::now() + WAIT;
        while done < 48 {
            assert!(Instant::now() < deadline, "queue {q}: {done} of 48 completed");
            c.io[q]
                .poll_completions(Some(Duration::from_millis(100)), |cqe| {
                    assert!(cqe.is_success(), "{:?}", cqe.status);
                    done += 1;
                })
                .unwrap();
        }
    }
    for slba in (0..96u64).map(|i| i * 8) {
        let mut back = vec![0u8; 4096];
        c.io[(slba % 2) as usize].read(1, slba, 8, &mut back).unwrap();
        assert!(back == pattern(7, slba, 4096), "block {slba}");
    }
    c.shutdown().unwrap();
    t.shutdown().unwrap();
}

#[test]
fn injected_errors_reach_the_host_and_the_namespace_recovers() {
    let (t, ctx) = start_ssd("interrupt", "faulty", 0.0);
    let mut c = connect(&t, 1);
    let q = &mut c.io[0];
    q.write(1, 0, 8, &pattern(1, 0, 4096)).unwrap();

    // An error status of the device reaches the host as it is.
    ctx.call("nvme_fault", &json!({"device": "faulty", "kind": "fail", "count": 1}))
        .unwrap();
    let mut back = vec![0u8; 4096];
    let e = q.read(1, 0, 8, &mut back).unwrap_err();
    assert_eq!(e.status(), Some(Status::UNRECOVERED_READ_ERROR), "{e}");
    q.read(1, 0, 8, &mut back).unwrap();
    assert!(back == pattern(1, 0, 4096));

    // Controller fatal status: the admin thread resets the controller; the next commands
    // wait for the queue to come back and succeed.
    ctx.call("nvme_fault", &json!({"device": "faulty", "kind": "cfs"}))
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while nvme_device(&ctx, "faulty")["resets"] == 0 {
        assert!(Instant::now() < deadline, "no reset after CSTS.CFS");
        std::thread::sleep(Duration::from_millis(10));
    }
    q.write(1, 8, 8, &pattern(2, 8, 4096)).unwrap();
    q.read(1, 8, 8, &mut back).unwrap();
    assert!(back == pattern(2, 8, 4096), "data after the reset");

    // Bad requests are refused with JSON-RPC errors, not panics.
    for bad in [
        json!({"device": "nope", "kind": "cfs"}),
        json!({"device": "faulty", "kind": "melt"}),
        json!({"device": "faulty"}),
        json!({"device": "faulty", "kind": "fail", "status": 0}),
    ] {
        assert!(ctx.call("nvme_fault", &bad).is_err(), "{bad}");
    }
    c.shutdown().unwrap();
    t.shutdown().unwrap();
}

#[test]
fn a_lost_completion_times_out_resets_and_the_host_sees_an_abort() {
    let (t, ctx) = start_ssd("interrupt", "lossy", 0.0);
    let mut c = connect(&t, 1);
    let q = &mut c.io[0];
    q.set_timeout(Duration::from_secs(30));
    ctx.call("nvme_fault", &json!({"device": "lossy", "kind": "lose", "count": 1}))
        .unwrap();
    // The command whose completion is lost: the driver's command timeout (10 s) resets the
    // controller and the command completes with Command Aborted By Host (the kernel host
    // retries those), not never.
    let t0 = Instant::now();
    let r = q.write(1, 0, 8, &pattern(3, 0, 4096));
    let e = r.unwrap_err();
    assert_eq!(e.status().map(|s| (s.sct(), s.sc())), Some((3, 0x71)), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(20), "took {:?}", t0.elapsed());
    // The command fails when its queue notices the reset, the counter follows when the
    // admin thread is done.
    let deadline = Instant::now() + Duration::from_secs(5);
    while nvme_device(&ctx, "lossy")["resets"] == 0 {
        assert!(Instant::now() < deadline, "no reset counted");
        std::thread::sleep(Duration::from_millis(10));
    }
    // And the queue works again.
    q.write(1, 0, 8, &pattern(4, 0, 4096)).unwrap();
    let mut back = vec![0u8; 4096];
    q.read(1, 0, 8, &mut back).unwrap();
    assert!(back == pattern(4, 0, 4096));
    c.shutdown().unwrap();
    t.shutdown().unwrap();
}

#[test]
fn several_devices_behind_one_subsystem_keep_their_data_apart() {
    let text = conf_with(
        "adaptive",
        "",
        SSD_NQN,
        r#"
[[subsystem.namespace]]
nsid = 1
block_size = 512
backend = { nvme = { fake = "pair-a", size = "8MiB" } }

[[subsystem.namespace]]
nsid = 2
block_size = 4096
backend = { nvme = { fake = "pair-b", size = "16MiB", nsid = 7 } }
"#,
    );
    let (t, ctx) = start_with_ctx(&text);
    let mut c = connect(&t, 2);
    assert_eq!(c.admin.identify_namespace(1).unwrap().nsze, 16384);
    assert_eq!(
        c.admin.identify_namespace(2).unwrap().nsze,
        4096,
        "4 KiB blocks of device nsid 7"
    );
    // The same LBAs on both namespaces, different data, from both queues.
    let a = pattern(11, 0, 8 * 512);
    let b = pattern(12, 0, 8 * 4096);
    c.io[0].write(1, 0, 8, &a).unwrap();
    c.io[1].write(2, 0, 8, &b).unwrap();
    let mut back = vec![0u8; 8 * 512];
    c.io[1].read(1, 0, 8, &mut back).unwrap();
    assert!(back == a);
    let mut back = vec![0u8; 8 * 4096];
    c.io[0].read(2, 0, 8, &mut back).unwrap();
    assert!(back == b);
    let v = ctx.call("nvme_devices", &Value::Null).unwrap();
    let names: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|d| d["name"].as_str())
        .collect();
    assert_eq!(names, ["pair-a", "pair-b"]);
    c.shutdown().unwrap();
    t.shutdown().unwrap();
}

/// Wait up to `secs` for the AER `cid` of `c`'s admin queue: (status, dw0).
fn await_aer(c: &mut Controller, cid: u16, secs: u64) -> Option<(Status, u32)> {
    let mut got = None;
    let t0 = Instant::now();
    while got.is_none() && t0.elapsed() < Duration::from_secs(secs) {
        c.admin
            .poll_completions(Some(Duration::from_millis(100)), |done| {
                if done.cid == cid {
                    got = Some((done.status, done.dw0));
                }
            })
            .unwrap();
    }
    got
}

#[test]
fn smart_reports_the_devices_health_and_its_critical_warnings_raise_events() {
    let (t, ctx) = start_ssd("interrupt", "health", 0.0);
    let mut c = connect(&t, 1);
    c.io[0].write(1, 0, 8, &pattern(1, 0, 4096)).unwrap();
    // The device's own page (the admin thread reads it every 2 s): its temperature and the
    // data units it counted, not the target's.
    let deadline = Instant::now() + Duration::from_secs(8);
    let h = loop {
        let h = c.admin.smart_log().unwrap();
        if h.data_units_written >= 1 && h.temperature_k == 310 {
            break h;
        }
        assert!(
            Instant::now() < deadline,
            "the device's page never showed the write: {h:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(h.temperature_k, 310, "the fake device's composite temperature");
    assert_eq!((h.avail_spare, h.spare_thresh, h.critical_warning), (100, 10, 0));
    assert_eq!(h.host_writes, 1);

    // SMART events on for every critical warning (as SPDK's initiator does; NVMe 2.0
    // §5.27.1.7), one AER held.
    c.admin.set_features(0x0B, 0xFF).unwrap();
    let aer = c.admin.submit(sqe::async_event_request(), Data::None, 7).unwrap();
    ctx.call(
        "nvme_fault",
        &json!({"device": "health", "kind": "critical_warning", "count": 4}),
    )
    .unwrap();
    // SMART / Health status (type 1), NVM subsystem reliability (00h), log page 02h.
    assert_eq!(await_aer(&mut c, aer, 10), Some((Status::SUCCESS, 0x0002_0001)));
    assert_eq!(c.admin.smart_log().unwrap().critical_warning, 4);

    // The page was read (unmasked): an over-temperature device raises the next one, with
    // the controller's threshold (WCTEMP 343 K by default).
    let aer = c.admin.submit(sqe::async_event_request(), Data::None, 8).unwrap();
    ctx.call(
        "nvme_fault",
        &json!({"device": "health", "kind": "temperature", "count": 350}),
    )
    .unwrap();
    assert_eq!(await_aer(&mut c, aer, 10), Some((Status::SUCCESS, 0x0002_0101)));
    let h = c.admin.smart_log().unwrap();
    assert_eq!((h.temperature_k, h.critical_warning), (350, 4 | 2));
    // A warning already reported raises nothing more while it stays set.
    let aer = c.admin.submit(sqe::async_event_request(), Data::None, 9).unwrap();
    assert_eq!(await_aer(&mut c, aer, 3), None);
    c.shutdown().unwrap();
    t.shutdown().unwrap();
}

#[test]
fn abort_cancels_a_command_on_the_device_with_the_devices_abort() {
    // 1.5 s per command: the Abort arrives while the read is on the device.
    let (t, _ctx) = start_ssd("interrupt", "slow", 1_500_000.0);
    let mut c = connect(&t, 1);
    assert_abort_of_running_read(&mut c, Duration::from_millis(1200));
    c.shutdown().unwrap();
    t.shutdown().unwrap();
}

/// SPDK's `bdev_nvme_attach_controller` on a device pollux drives (the fake controller stands
/// for a PCI function here; `pollux-nvme`'s guest does it with QEMU's NVMe behind vfio-pci):
/// a bdev per namespace, named and shaped as SPDK's; served once the conf's namespace on the
/// same device namespace is gone; bad requests refused with nothing changed; detach removes
/// what it served.
#[test]
fn spdk_attaches_an_nvme_controller_as_bdevs_and_serves_them() {
    let (t, ctx) = start_ssd("interrupt", "spdk-ssd", 0.0);
    let attach = |name: &str, trtype: &str, traddr: &str| {
        ctx.call(
            "bdev_nvme_attach_controller",
            &json!({"name": name, "trtype": trtype, "traddr": traddr}),
        )
    };
    assert_eq!(attach("Nvme0", "PCIe", "spdk-ssd").unwrap(), json!(["Nvme0n1"]));
    let b = &ctx.call("bdev_get_bdevs", &json!({"name": "Nvme0n1"})).unwrap()[0];
    assert_eq!(
        (&b["product_name"], &b["block_size"], &b["num_blocks"], &b["claimed"]),
        (&json!("NVMe disk"), &json!(512), &json!(SSD_BLOCKS), &json!(false)),
        "{b}"
    );
    for (what, r) in [
        ("the same controller name", attach("Nvme0", "PCIe", "spdk-ssd")),
        ("an NVMe-oF controller", attach("Nvme1", "TCP", "127.0.0.1")),
        ("no such device", attach("Nvme1", "PCIe", "not-a-device")),
    ] {
        let e = r.expect_err(what);
        assert_eq!(e.code, -32602, "{what}: {e:?}");
    }
    // While the conf's namespace serves the same device namespace, a second is refused.
    let add = |nsid: u32| {
        ctx.call(
            "nvmf_subsystem_add_ns",
            &json!({"nqn": SSD_NQN, "namespace": {"bdev_name": "Nvme0n1", "nsid": nsid}}),
        )
    };
    add(2).expect_err("one device namespace served twice");
    ctx.call("remove_namespace", &json!({"nqn": SSD_NQN, "nsid": 1}))
        .unwrap();
    assert_eq!(add(1).unwrap(), json!(1));
    let mut c = Controller::connect(addr(&t), SSD_NQN, HOST, 1, 32, Digests::NONE).unwrap();
    let data = vec![0x5eu8; 8192];
    c.io[0].write(1, 64, 16, &data).unwrap();
    let mut back = vec![0u8; 8192];
    c.io[0].read(1, 64, 16, &mut back).unwrap();
    assert_eq!(back, data, "served through the SPDK bdev");
    ctx.call("bdev_nvme_detach_controller", &json!({"name": "Nvme0"}))
        .unwrap();
    // The reactors apply the removal by message: the controller sees it shortly.
    let t0 = Instant::now();
    while !c.admin.active_namespaces(0).unwrap().is_empty() {
        assert!(t0.elapsed() < Duration::from_secs(5), "detach removes what it served");
        std::thread::sleep(Duration::from_millis(20));
    }
    ctx.call("bdev_nvme_detach_controller", &json!({"name": "Nvme0"}))
        .expect_err("a controller detached");
    drop(c);
    t.shutdown().unwrap();
}
