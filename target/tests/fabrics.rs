//! Fabrics and admin behaviour a host relies on: Connect errors (NVMe-oF 1.1 §6.3), commands
//! before CC.EN, keep-alive (NVMe 2.0 §5.19, KATO), Abort (NVMe 2.0 §5.1), the discovery log
//! (NVMe-oF 1.1 §5.3), Identify fields the Linux host checks, Number of Queues, and target
//! shutdown with hosts connected.
#![allow(clippy::unwrap_used)]

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use pollux_conf::DISCOVERY_NQN;
use pollux_host::{Controller, ControllerOpts, Data, HostError, HostQueue, QueueOpts, RawReply, sqe};
use pollux_nvme::spec::{SglDescriptor, Sqe, feature, property};
use pollux_nvme::tcp::PduHeader;

/// Connect Invalid Parameters / Invalid Host with IATTR = 1 (the offset is in the Connect
/// data) and IPO `offset` (NVMe-oF 1.1 §6.3, Figure 21).
fn refused(r: Result<HostQueue, HostError>, sc: u8, offset: u32) {
    match r {
        Err(HostError::ConnectRefused { status, dw0 }) => {
            assert_eq!(code(status), (1, sc), "{status:?}");
            assert_eq!(dw0, (1 << 16) | offset, "dw0 {dw0:#x}");
        }
        Err(e) => panic!("expected a refused Connect, got {e}"),
        Ok(_) => panic!("expected a refused Connect, it succeeded"),
    }
}

#[test]
fn any_terminated_host_nqn_connects_where_any_host_may() {
    let t = start("");
    let a = addr(&t);
    // SPDK's initiator sends an empty host NQN by default; SPDK's and Linux's targets take it
    // on a subsystem open to any host and on the discovery controller.
    for nqn in [NQN, DISCOVERY_NQN] {
        for host in ["", "not an NQN"] {
            let q = HostQueue::connect(a, QueueOpts::admin(nqn, host));
            assert!(q.is_ok(), "{nqn} with host NQN {host:?}: {:?}", q.err());
        }
    }
    // A host list names exact strings: an empty NQN is none of them.
    refused(HostQueue::connect(a, QueueOpts::admin(NQN_PRIVATE, "")), 0x84, 512);
    // A field without its terminator within 256 bytes: Invalid Parameters at that field.
    for (field, off) in [(512..768, 512u32), (256..512, 256)] {
        let mut q = raw_queue(a, false, false);
        let mut data = sqe::connect_data(&[7; 16], 0xFFFF, NQN, HOST);
        data[field].fill(b'a');
        let mut s = sqe::connect(0, 31, 0, 0);
        s.set_psdt(Sqe::PSDT_SGL_MPTR_CONTIGUOUS);
        s.set_sgl(&SglDescriptor::in_capsule(0, 1024));
        q.send_raw(&q.capsule_pdu(&s, &data)).unwrap();
        match q.recv_raw(Duration::from_secs(5)).unwrap() {
            RawReply::Pdu {
                hdr: Some(PduHeader::CapsuleResp { cqe }),
                ..
            } => {
                assert_eq!(code(cqe.status()), (1, 0x82), "{:?}", cqe.status());
                assert_eq!(cqe.dw0.get(), (1 << 16) | off);
            }
            other => panic!("expected a CapsuleResp, got {other:?}"),
        }
    }
    t.shutdown().unwrap();
}

#[test]
fn connect_errors_point_at_the_offending_field() {
    let t = start("");
    let a = addr(&t);
    // Unknown subsystem: Invalid Parameters at SUBNQN (byte 256).
    refused(
        HostQueue::connect(a, QueueOpts::admin("nqn.2026-11.io.pollux:unknown", HOST)),
        0x82,
        256,
    );
    // A host the subsystem does not allow: Invalid Host, HOSTNQN (byte 512).
    refused(HostQueue::connect(a, QueueOpts::admin(NQN_PRIVATE, HOST)), 0x84, 512);
    HostQueue::connect(a, QueueOpts::admin(NQN_PRIVATE, OTHER_HOST)).unwrap();
    // I/O queue naming a controller that does not exist: Invalid Parameters at CNTLID (16).
    let c = controller(a, 0);
    refused(
        HostQueue::connect(a, QueueOpts::io(NQN, HOST, 1, c.cntlid.wrapping_add(100), 32)),
        0x82,
        16,
    );
    // ... or that belongs to another host: at HOSTNQN.
    refused(
        HostQueue::connect(a, QueueOpts::io(NQN, OTHER_HOST, 1, c.cntlid, 32)),
        0x82,
        512,
    );
    // The right one works and returns the controller ID.
    let q = HostQueue::connect(a, QueueOpts::io(NQN, HOST, 1, c.cntlid, 32)).unwrap();
    assert_eq!(q.cntlid(), c.cntlid);
    drop((q, c));
    t.shutdown().unwrap();
}

#[test]
fn before_cc_en_admin_commands_and_io_queue_connects_are_refused() {
    let t = start("");
    let a = addr(&t);
    let mut admin = HostQueue::connect(a, QueueOpts::admin(NQN, HOST)).unwrap();
    let cntlid = admin.cntlid();
    // Fabrics Property Get works; CSTS.RDY is 0.
    assert_eq!(admin.property_get(property::CSTS).unwrap() & 1, 0);
    // An admin command: Command Sequence Error.
    let e = admin.identify_controller().unwrap_err();
    assert_eq!(e.status().map(code), Some((0, 0x0C)), "{e}");
    let e = admin.keep_alive().unwrap_err();
    assert_eq!(e.status().map(code), Some((0, 0x0C)), "{e}");
    // An I/O queue Connect: refused with an error status.
    match HostQueue::connect(a, QueueOpts::io(NQN, HOST, 1, cntlid, 32)) {
        Err(HostError::ConnectRefused { status, .. }) => assert!(!status.is_success()),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("I/O queue connected to a disabled controller"),
    }
    // After CC.EN both work.
    admin.enable().unwrap();
    assert_eq!(admin.identify_controller().unwrap().cntlid, cntlid);
    let mut q = HostQueue::connect(a, QueueOpts::io(NQN, HOST, 1, cntlid, 32)).unwrap();
    q.write(1, 0, 1, &[3; 512]).unwrap();
    t.shutdown().unwrap();
}

fn keep_alive_conf() -> &'static str {
    "[keep_alive]\nmin_ms = 100\nmax_ms = 60000\n"
}

#[test]
fn a_host_that_vanishes_mid_write_loses_its_controller_after_kato() {
    let t = start(keep_alive_conf());
    let a = addr(&t);
    let mut h = Healthy::start(a, 30000);
    let mut o = ControllerOpts::new(NQN, HOST, 2, 32);
    o.kato_ms = 1000;
    // The controller (and its keep-alive clock) is created after this instant.
    let before_connect = Instant::now();
    let mut c = Controller::connect_with(a, &o).unwrap();
    let cntlid = c.cntlid;
    assert_eq!(c.admin.get_features(feature::KEEP_ALIVE_TIMER, 0).unwrap(), 1000);
    c.io[0].write(1, 0, 8, &[1; 4096]).unwrap();
    // Half a write: the header and 1000 of 4096 bytes of in-capsule data; then silence on
    // every queue, sockets left open.
    let mut s = sqe::write(1, 0, 8);
    s.cid.set(3);
    s.set_psdt(Sqe::PSDT_SGL_MPTR_CONTIGUOUS);
    s.set_sgl(&SglDescriptor::in_capsule(0, 4096));
    let pdu = c.io[0].capsule_pdu(&s, &[0xAB; 4096]);
    c.io[0].send_raw(&pdu[..72 + 1000]).unwrap();
    // The target deletes the controller after KATO: every queue's connection is closed.
    let Controller { mut admin, mut io, .. } = c;
    for q in io.iter_mut().chain([&mut admin]) {
        expect_eof(q);
    }
    let gone = before_connect.elapsed();
    assert!(
        gone >= Duration::from_millis(1000) && gone < Duration::from_secs(4),
        "controller deleted {gone:?} after Connect with KATO 1 s"
    );
    // A new I/O queue naming the old controller is refused.
    refused(HostQueue::connect(a, QueueOpts::io(NQN, HOST, 1, cntlid, 32)), 0x82, 16);
    // Other hosts never noticed.
    h.progress(3);
    h.finish();
    t.shutdown().unwrap();
}

#[test]
fn keep_alive_every_half_kato_keeps_the_controller() {
    let t = start(keep_alive_conf());
    let mut o = ControllerOpts::new(NQN, HOST, 1, 32);
    o.kato_ms = 1000;
    let mut c = Controller::connect_with(addr(&t), &o).unwrap();
    let start = Instant::now();
    let mut sent = 0;
    while start.elapsed() < Duration::from_millis(2600) {
        if c.keep_alive_if_due().unwrap() {
            sent += 1;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(sent >= 4, "{sent} Keep Alives in 2.6 s");
    let data = pattern(5, 10, 4096);
    c.io[0].write(1, 10, 8, &data).unwrap();
    let mut back = vec![0u8; 4096];
    c.io[0].read(1, 10, 8, &mut back).unwrap();
    assert_eq!(back, data);
    assert_eq!(c.admin.identify_controller().unwrap().cntlid, c.cntlid);
    c.shutdown().unwrap();
    t.shutdown().unwrap();
}

#[test]
fn abort_completes_a_write_waiting_for_its_data() {
    let t = start("");
    let mut c = controller(addr(&t), 1);
    r2t_write(&mut c.io[0], 42, 100, 8192);
    let dw0 = c.admin.abort(1, 42).unwrap();
    assert_eq!(dw0 & 1, 0, "Abort dw0 bit 0: 0 = aborted");
    assert_eq!(expect_resp(&mut c.io[0], 42), (0, 0x07), "Abort Requested");
    // Commands that are not (or no longer) outstanding are not aborted: dw0 bit 0 = 1.
    assert_eq!(c.admin.abort(1, 42).unwrap() & 1, 1);
    assert_eq!(c.admin.abort(1, 999).unwrap() & 1, 1);
    assert_eq!(c.admin.abort(0, 77).unwrap() & 1, 1);
    assert_eq!(c.admin.abort(9, 1).unwrap() & 1, 1);
    // The queue keeps working.
    let data = pattern(1, 200, 4096);
    c.io[0].write(1, 200, 8, &data).unwrap();
    let mut back = vec![0u8; 4096];
    c.io[0].read(1, 200, 8, &mut back).unwrap();
    assert_eq!(back, data);
    drop(c);
    t.shutdown().unwrap();
}

#[test]
fn abort_cancels_a_read_in_service_on_a_simulated_ssd() {
    // A device that takes 400 ms per read: an Abort arrives while the read is in service.
    let ns = "[[subsystem.namespace]]\nnsid = 1\nbackend = { sim = { size = \"1MiB\", \
              read = { fixed_us = 400000.0 }, write = { fixed_us = 5.0 } } }\n";
    let t = start_text(&conf_with("interrupt", "", NQN, ns));
    let mut c = controller(addr(&t), 1);
    assert_abort_of_running_read(&mut c, Duration::from_millis(350));
    drop(c);
    t.shutdown().unwrap();
}

#[test]
fn an_aborted_commands_cid_is_free_again() {
    let t = start("");
    let mut c = controller(addr(&t), 1);
    r2t_write(&mut c.io[0], 42, 100, 8192);
    assert_eq!(c.admin.abort(1, 42).unwrap() & 1, 0);
    assert_eq!(expect_resp(&mut c.io[0], 42), (0, 0x07));
    // The command completed: the host may reuse CID 42 (NVMe 2.0 §4.2: a CID is unique
    // among the commands outstanding on the queue).
    let ttag = r2t_write(&mut c.io[0], 42, 300, 8192);
    let data = pattern(2, 300, 8192);
    let pdu = c.io[0].h2c_data_pdu(42, ttag, 0, &data, true);
    c.io[0].send_raw(&pdu).unwrap();
    assert_eq!(expect_resp(&mut c.io[0], 42), (0, 0));
    let mut back = vec![0u8; 8192];
    c.io[0].read(1, 300, 16, &mut back).unwrap();
    assert_eq!(back, data);
    drop(c);
    t.shutdown().unwrap();
}

#[test]
fn discovery_log_lists_what_each_host_may_see_on_each_listener() {
    let t = start("[[listener]]\naddress = \"127.0.0.2:0\"\n");
    let listeners: Vec<SocketAddr> = t.listen_addrs().to_vec();
    assert_eq!(listeners.len(), 2);
    for (host, visible) in [(HOST, vec![NQN]), (OTHER_HOST, vec![NQN, NQN_PRIVATE])] {
        // Discovery is served on every listener.
        for &at in &listeners {
            let mut d = HostQueue::connect(at, QueueOpts::admin(DISCOVERY_NQN, host)).unwrap();
            d.enable().unwrap();
            let id = d.identify_controller().unwrap();
            assert_eq!((id.cntrltype, id.subnqn.as_str()), (2, DISCOVERY_NQN));
            let log = d.discovery_log().unwrap();
            assert_ne!(log.genctr, 0, "GENCTR");
            assert_eq!(log.recfmt, 0);
            assert_eq!(log.numrec as usize, log.entries.len());
            // First the current discovery subsystem: this controller, on the listener it
            // was reached through (SUBTYPE 3, NVMe 2.0 §5.16.1.23), as Linux nvmet lists it.
            let cur = &log.entries[0];
            assert_eq!(
                (
                    cur.subtype,
                    cur.subnqn.as_str(),
                    cur.trsvcid.clone(),
                    cur.traddr.clone()
                ),
                (3, DISCOVERY_NQN, at.port().to_string(), at.ip().to_string()),
                "{host}: {log:#?}"
            );
            assert_eq!(
                log.entries.len(),
                1 + listeners.len() * visible.len(),
                "{host}: {log:#?}"
            );
            for l in &listeners {
                for nqn in &visible {
                    let e = log
                        .entries
                        .iter()
                        .find(|e| e.subnqn == *nqn && e.traddr == l.ip().to_string())
                        .unwrap_or_else(|| panic!("{host}: no entry for {nqn} on {l}: {log:#?}"));
                    assert_eq!(e.trsvcid, l.port().to_string());
                    assert_eq!((e.trtype, e.adrfam, e.subtype), (3, 1, 2), "TCP, IPv4, NVM subsystem");
                    assert_eq!(e.cntlid, 0xFFFF);
                }
            }
            assert!(
                host != HOST || log.entries.iter().all(|e| e.subnqn != NQN_PRIVATE),
                "a subsystem the host may not use is listed"
            );
            // The log is stable while nothing changes.
            assert_eq!(d.discovery_log().unwrap().genctr, log.genctr);
            d.shutdown_controller().unwrap();
        }
    }
    t.shutdown().unwrap();
}

#[test]
fn identify_and_number_of_queues_give_what_the_linux_host_checks() {
    let t = start("[transport]\nmax_io_queues = 4\n");
    let a = addr(&t);
    let mut c = controller(a, 0);
    let id = c.id.clone();
    assert_eq!(id.cntlid, c.cntlid, "CNTLID equals Connect's");
    assert_eq!(c.admin.cntlid(), c.cntlid);
    assert_ne!(id.kas, 0, "KAS");
    assert!(id.ioccsz >= 4, "IOCCSZ {}", id.ioccsz);
    assert!(id.iorcsz >= 1, "IORCSZ {}", id.iorcsz);
    assert_ne!(id.maxcmd, 0, "MAXCMD");
    assert_eq!(id.subnqn, NQN);
    assert_eq!((id.sqes & 0xF, id.cqes & 0xF), (6, 4));
    assert_eq!(id.cntrltype, 1);
    assert!(!id.sn.is_empty() && !id.mn.is_empty());
    assert!(id.nn >= 1);
    assert_eq!(id.in_capsule_data(), 8192);
    // Number of Queues: NSQA and NCQA are 0's based (NVMe 2.0 §5.27.1.5).
    let n = c.admin.set_num_queues(2).unwrap();
    assert_eq!((n.dw0, n.sq, n.cq), (1 | 1 << 16, 2, 2));
    let n = c.admin.set_num_queues(16).unwrap();
    assert_eq!((n.dw0, n.sq, n.cq), (3 | 3 << 16, 4, 4), "clamped to max_io_queues");
    assert_eq!(c.admin.get_features(feature::NUMBER_OF_QUEUES, 0).unwrap(), 3 | 3 << 16);
    // Queue IDs above the granted count are refused; the last one works and returns the
    // same controller ID.
    match HostQueue::connect(a, QueueOpts::io(NQN, HOST, 5, c.cntlid, 32)) {
        Err(HostError::ConnectRefused { status, .. }) => assert_eq!(code(status), (1, 0x82)),
        other => panic!("qid 5 of 4: {other:?}"),
    }
    let q = HostQueue::connect(a, QueueOpts::io(NQN, HOST, 4, c.cntlid, 32)).unwrap();
    assert_eq!(q.cntlid(), c.cntlid);
    // Identify Namespace and the active list.
    let ns = c.admin.identify_namespace(1).unwrap();
    assert_eq!((ns.nsze, ns.block_size), (BLOCKS, 512));
    assert_eq!(c.admin.active_namespaces(0).unwrap(), vec![1]);
    assert!(c.admin.active_namespaces(1).unwrap().is_empty());
    drop((q, c));
    t.shutdown().unwrap();
}

#[test]
fn shutdown_with_hosts_connected_is_prompt_and_hosts_see_eof() {
    let t = start("");
    let a = addr(&t);
    let mut c = controller(a, 2);
    r2t_write(&mut c.io[1], 7, 0, 8192);
    let mut d = HostQueue::connect(a, QueueOpts::admin(DISCOVERY_NQN, HOST)).unwrap();
    d.enable().unwrap();
    let mut idle = HostQueue::tcp(a, QueueOpts::admin(NQN, HOST)).unwrap();
    let mut half = raw_queue(a, false, false);
    let pdu = half.capsule_pdu(&sqe::keep_alive(), &[0; 64]);
    half.send_raw(&pdu[..50]).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let t0 = Instant::now();
    t.shutdown().unwrap();
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(2), "shutdown took {took:?}");
    let Controller { mut admin, mut io, .. } = c;
    let t1 = Instant::now();
    for q in io.iter_mut().chain([&mut admin, &mut d, &mut idle, &mut half]) {
        expect_eof(q);
    }
    assert!(t1.elapsed() < Duration::from_secs(1), "EOF took {:?}", t1.elapsed());
}

/// Get Features (NVMe 2.0 §5.15) of `fid` with select `sel`: (SCT, SC) and dw0.
fn get_feature(q: &mut HostQueue, fid: u8, sel: u8, cdw11: u32) -> ((u8, u8), u32) {
    let c = q.exec(sqe::get_features(fid, sel, cdw11), Data::None).unwrap();
    (code(c.status), c.dw0)
}

#[test]
fn every_mandatory_feature_answers_each_select_and_changes_where_it_may() {
    let t = start("");
    let mut c = controller(addr(&t), 1);
    let q = &mut c.admin;
    const OK: (u8, u8) = (0, 0);
    const INVALID_FIELD: (u8, u8) = (0, 0x02);
    // What an initiator's Identify pass asks (SPDK's asks 01h, 02h and 04h): current, default,
    // saved (not saveable: the default) and supported capabilities (bit 2: changeable).
    let mandatory = [
        (feature::ARBITRATION, 0, true),
        (feature::POWER_MANAGEMENT, 0, true),
        (feature::TEMPERATURE_THRESHOLD, 0, true),
        (feature::ERROR_RECOVERY, 0, true),
        (feature::NUMBER_OF_QUEUES, 0, true),
        (feature::WRITE_ATOMICITY_NORMAL, 0, true),
        (feature::ASYNC_EVENT_CONFIGURATION, 0, true),
        (feature::KEEP_ALIVE_TIMER, 0, true),
        (feature::HOST_IDENTIFIER, 1, false),
    ];
    for (fid, cdw11, changeable) in mandatory {
        for sel in 0..3 {
            let (st, _) = get_feature(q, fid, sel, cdw11);
            assert_eq!(st, OK, "feature {fid:#x} select {sel}");
        }
        let (st, caps) = get_feature(q, fid, 3, cdw11);
        assert_eq!(
            (st, caps),
            (OK, if changeable { 1 << 2 } else { 0 }),
            "feature {fid:#x} capabilities"
        );
        assert_eq!(get_feature(q, fid, 4, cdw11).0, INVALID_FIELD, "select 4 of {fid:#x}");
    }
    // The composite temperature threshold: over by default at Identify's WCTEMP, under 0;
    // a set value reads back as current, the default stays.
    let over = get_feature(q, feature::TEMPERATURE_THRESHOLD, 0, 0).1;
    assert!(over > 273, "over-temperature threshold {over} K");
    q.set_features(feature::TEMPERATURE_THRESHOLD, 330).unwrap();
    assert_eq!(get_feature(q, feature::TEMPERATURE_THRESHOLD, 0, 0).1, 330);
    assert_eq!(get_feature(q, feature::TEMPERATURE_THRESHOLD, 1, 0).1, over);
    q.set_features(feature::TEMPERATURE_THRESHOLD, (1 << 20) | 250).unwrap();
    assert_eq!(get_feature(q, feature::TEMPERATURE_THRESHOLD, 0, 1 << 20).1, 250);
    // A sensor that does not exist, a power state that does not, DULBE without support.
    assert_eq!(
        err_code(
            q.set_features(feature::TEMPERATURE_THRESHOLD, (1 << 16) | 300)
                .map(drop)
        ),
        INVALID_FIELD
    );
    assert_eq!(
        get_feature(q, feature::TEMPERATURE_THRESHOLD, 0, 2 << 16).0,
        INVALID_FIELD
    );
    assert_eq!(
        err_code(q.set_features(feature::POWER_MANAGEMENT, 1).map(drop)),
        INVALID_FIELD
    );
    assert_eq!(
        err_code(q.set_features(feature::ERROR_RECOVERY, 1 << 16).map(drop)),
        INVALID_FIELD
    );
    // Changeable ones keep what was set.
    q.set_features(feature::ARBITRATION, 0x0302_0103).unwrap();
    assert_eq!(get_feature(q, feature::ARBITRATION, 0, 0).1, 0x0302_0103);
    q.set_features(feature::ERROR_RECOVERY, 25).unwrap();
    assert_eq!(get_feature(q, feature::ERROR_RECOVERY, 0, 0).1, 25);
    q.set_features(feature::WRITE_ATOMICITY_NORMAL, 1).unwrap();
    assert_eq!(get_feature(q, feature::WRITE_ATOMICITY_NORMAL, 0, 0).1, 1);
    // Unknown, fixed, not saveable: the statuses the spec gives.
    assert_eq!(get_feature(q, 0x7E, 0, 0).0, INVALID_FIELD);
    assert_eq!(err_code(q.set_features(0x7E, 0).map(drop)), INVALID_FIELD);
    // No volatile cache on a RAM namespace: the feature is not reported at all.
    assert_eq!(get_feature(q, feature::VOLATILE_WRITE_CACHE, 0, 0).0, INVALID_FIELD);
    assert_eq!(
        err_code(q.set_features(feature::HOST_IDENTIFIER, 1).map(drop)),
        (0, 0x0C)
    );
    let mut save = sqe::set_features(feature::ARBITRATION, 7);
    save.cdw10.set(save.cdw10.get() | 1 << 31);
    assert_eq!(code(q.exec(save, Data::None).unwrap().status), (1, 0x0D));
    drop(c);
    t.shutdown().unwrap();
}
