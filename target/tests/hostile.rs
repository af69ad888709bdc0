//! Hostile and heavy clients (issue #26): the PDU rules a host may not bend (PSDT other than
//! SGL, H2CData whose LAST_PDU flag lies about the end of its data, more commands than the
//! queue holds), the connection limits and the setup deadline, and a storm of connections.
//! Each case runs beside a healthy host doing verified I/O on its own connections, which
//! must see no error.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::*;
use pollux_host::{HostQueue, RawReply, sqe};
use pollux_nvme::spec::{SglDescriptor, Sqe};
use pollux_nvme::tcp::{PduHeader, fes};

/// Runs `case` against a target with `extra` conf tables while a healthy host does verified
/// I/O on the first listener: rounds before, during and after.
fn with_healthy(extra: &str, case: impl FnOnce(&pollux_target::Target, &mut Healthy)) {
    let t = start(extra);
    let mut h = Healthy::start(addr(&t), 30000);
    h.progress(3);
    case(&t, &mut h);
    h.progress(3);
    h.finish();
    t.shutdown().unwrap();
}

/// (SCT, SC) of Invalid Field in Command.
const INVALID_FIELD: (u8, u8) = (0, 0x02);

#[test]
fn a_command_with_prps_is_an_invalid_field() {
    with_healthy("", |t, _| {
        let mut c = controller(addr(t), 1);
        // NVMe-oF 1.1 §2.3.1: PSDT 00b (PRPs) and 10b (SGL segment as MPTR) on the I/O queue.
        for (cid, psdt) in [(7u16, Sqe::PSDT_PRP), (8, Sqe::PSDT_SGL_MPTR_SGL)] {
            let mut s = sqe::read(1, 0, 1);
            s.cid.set(cid);
            s.set_psdt(psdt);
            s.set_sgl(&SglDescriptor::transport_data_block(512));
            let pdu = c.io[0].capsule_pdu(&s, &[]);
            c.io[0].send_raw(&pdu).unwrap();
            assert_eq!(expect_resp(&mut c.io[0], cid), INVALID_FIELD, "PSDT {psdt}");
        }
        // And on the admin queue (a Keep Alive).
        let mut s = sqe::keep_alive();
        s.cid.set(9);
        s.set_psdt(Sqe::PSDT_PRP);
        let pdu = c.admin.capsule_pdu(&s, &[]);
        c.admin.send_raw(&pdu).unwrap();
        assert_eq!(expect_resp(&mut c.admin, 9), INVALID_FIELD);
        // The queues go on: a read with an SGL works.
        let mut back = vec![1u8; 512];
        c.io[0].read(1, 0, 1, &mut back).unwrap();
        c.shutdown().unwrap();
    });
}

#[test]
fn the_final_h2c_data_without_last_pdu_is_fatal() {
    with_healthy("", |t, _| {
        // Whole PDUs, and one whose data mostly comes after its header (received in place).
        for pieces in [false, true] {
            let mut c = controller(addr(t), 1);
            let q = &mut c.io[0];
            let ttag = r2t_write(q, 3, 100, 16384);
            let pdu = q.h2c_data_pdu(3, ttag, 0, &[0xAB; 16384], false);
            if pieces {
                send_in_pieces(q, &pdu, &[24]);
            } else {
                q.send_raw(&pdu).unwrap();
            }
            expect_term(q, fes::INVALID_HEADER_FIELD, Some(1));
        }
        // The data never reached the namespace.
        let mut c = controller(addr(t), 1);
        let mut back = vec![1u8; 16384];
        c.io[0].read(1, 100, 32, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 0));
        c.shutdown().unwrap();
    });
}

#[test]
fn h2c_data_with_last_pdu_before_the_end_is_fatal_not_a_hang() {
    with_healthy("", |t, _| {
        let mut c = controller(addr(t), 1);
        let q = &mut c.io[0];
        let ttag = r2t_write(q, 4, 200, 8192);
        // Half the data, flagged as the last of it.
        let pdu = q.h2c_data_pdu(4, ttag, 0, &[0xCD; 4096], true);
        q.send_raw(&pdu).unwrap();
        expect_term(q, fes::INVALID_HEADER_FIELD, Some(1));
        // Two PDUs flagged right are a write.
        let mut c = controller(addr(t), 1);
        let q = &mut c.io[0];
        let ttag = r2t_write(q, 5, 200, 8192);
        q.send_raw(&q.h2c_data_pdu(5, ttag, 0, &[0xCD; 4096], false)).unwrap();
        q.send_raw(&q.h2c_data_pdu(5, ttag, 4096, &[0xCE; 4096], true)).unwrap();
        assert_eq!(expect_resp(q, 5), (0, 0));
        let mut back = vec![0u8; 8192];
        q.read(1, 200, 16, &mut back).unwrap();
        assert!(back[..4096].iter().all(|&b| b == 0xCD) && back[4096..].iter().all(|&b| b == 0xCE));
        c.shutdown().unwrap();
    });
}

/// `n` one-block reads (CIDs 0..n) as one burst of bytes.
fn read_burst(q: &HostQueue, n: u16) -> Vec<u8> {
    let mut bytes = Vec::new();
    for cid in 0..n {
        let mut s = sqe::read(1, u64::from(cid), 1);
        s.cid.set(cid);
        s.set_psdt(Sqe::PSDT_SGL_MPTR_CONTIGUOUS);
        s.set_sgl(&SglDescriptor::transport_data_block(512));
        bytes.extend_from_slice(&q.capsule_pdu(&s, &[]));
    }
    bytes
}

#[test]
fn more_commands_than_the_queue_holds_end_the_queue() {
    with_healthy("", |t, _| {
        // controller() makes 32-entry I/O queues. A burst of 32 reads, twice, is within the
        // queue's size: every one completes.
        let mut c = controller(addr(t), 1);
        for _ in 0..2 {
            let burst = read_burst(&c.io[0], 32);
            c.io[0].send_raw(&burst).unwrap();
            let mut done = 0;
            while done < 32 {
                match c.io[0].recv_raw(WAIT).unwrap() {
                    RawReply::Pdu {
                        hdr: Some(PduHeader::CapsuleResp { cqe }),
                        ..
                    } => {
                        assert_eq!(code(cqe.status()), (0, 0));
                        done += 1;
                    }
                    RawReply::Pdu {
                        hdr: Some(PduHeader::C2HData { .. }),
                        ..
                    } => {}
                    other => panic!("within the queue's size: {other:?}"),
                }
            }
        }
        c.shutdown().unwrap();
        // 200 at once on a 32-entry queue: at most 32 run, then C2HTermReq and the end.
        let mut c = controller(addr(t), 1);
        let burst = read_burst(&c.io[0], 200);
        c.io[0].send_raw(&burst).unwrap();
        let mut done = 0;
        loop {
            match c.io[0].recv_raw(WAIT).unwrap() {
                RawReply::Pdu {
                    hdr: Some(PduHeader::CapsuleResp { .. }),
                    ..
                } => done += 1,
                RawReply::Pdu {
                    hdr: Some(PduHeader::C2HData { .. }),
                    ..
                } => {}
                RawReply::TermReq { fes: f, .. } => {
                    assert_eq!(f, fes::PDU_SEQUENCE_ERROR);
                    break;
                }
                other => panic!("expected completions then C2HTermReq, got {other:?}"),
            }
        }
        assert!(done <= 32, "{done} commands of a 32-entry queue ran");
        expect_eof(&mut c.io[0]);
    });
}

/// The target closes `s` without a byte (within [`WAIT`]).
fn expect_closed(mut s: TcpStream, what: &str) -> Duration {
    let t0 = Instant::now();
    s.set_read_timeout(Some(WAIT)).unwrap();
    let mut b = [0u8; 8];
    match s.read(&mut b) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("{what}: expected the connection closed, got {other:?}"),
    }
    t0.elapsed()
}

#[test]
fn a_listener_refuses_connections_beyond_its_limit() {
    let extra = "[[listener]]\naddress = \"127.0.0.2:0\"\nmax_connections = 4\n";
    with_healthy(extra, |t, h| {
        let limited: SocketAddr = t.listen_addrs()[1];
        let mut held: Vec<HostQueue> = (0..4).map(|_| raw_queue(limited, false, false)).collect();
        // The fifth is accepted by the kernel and closed by the target before its ICReq.
        expect_closed(TcpStream::connect(limited).unwrap(), "fifth connection");
        h.progress(3);
        // The other listener is not limited by this one's count.
        let other = raw_queue(addr(t), false, false);
        // One goes: room for one more.
        held.pop().unwrap().close();
        let t0 = Instant::now();
        let again = loop {
            match HostQueue::initialized(limited, pollux_host::QueueOpts::admin(NQN, HOST)) {
                Ok(q) => break q,
                Err(e) => assert!(t0.elapsed() < WAIT, "no room after a close: {e}"),
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        drop((held, other, again));
    });
}

#[test]
fn the_target_refuses_connections_beyond_its_total() {
    // The healthy host holds two connections (admin and I/O queue).
    with_healthy("[transport]\nmax_connections = 5\n", |t, h| {
        let held: Vec<HostQueue> = (0..3).map(|_| raw_queue(addr(t), false, false)).collect();
        expect_closed(TcpStream::connect(addr(t)).unwrap(), "sixth connection");
        h.progress(3);
        drop(held);
    });
}

#[test]
fn a_connection_that_does_not_set_up_in_time_is_closed() {
    // A deadline a loaded machine meets: the ICReq below must be answered within it.
    with_healthy("[transport]\nsetup_timeout_ms = 1000\n", |t, h| {
        // No ICReq.
        let took = expect_closed(TcpStream::connect(addr(t)).unwrap(), "no ICReq");
        assert!(
            took >= Duration::from_millis(900),
            "closed after {took:?}, before the deadline"
        );
        // ICReq, then no Connect.
        let mut q = raw_queue(addr(t), false, false);
        expect_eof(&mut q);
        // The healthy host's connections, set up long ago, stay.
        std::thread::sleep(Duration::from_millis(1200));
        h.progress(5);
    });
}

#[test]
fn a_storm_of_connections_leaves_the_neighbour_alone() {
    with_healthy("", |t, h| {
        for _cycle in 0..3 {
            // Bare sockets, sockets past ICReq, and whole controllers.
            let bare: Vec<TcpStream> = (0..100).map(|_| TcpStream::connect(addr(t)).unwrap()).collect();
            let init: Vec<HostQueue> = (0..50).map(|_| raw_queue(addr(t), false, false)).collect();
            let ctrls: Vec<_> = (0..10).map(|_| controller(addr(t), 1)).collect();
            h.progress(3);
            drop((bare, init));
            for c in ctrls {
                c.shutdown().unwrap();
            }
            h.progress(3);
        }
    });
}
