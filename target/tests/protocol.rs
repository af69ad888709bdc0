//! NVMe/TCP protocol errors (NVMe/TCP 1.0 §3.6): every malformed PDU ends its connection with
//! C2HTermReq (FES/FEI checked where the spec defines FEI) or leaves it waiting, while a
//! healthy host on another connection keeps doing verified I/O before, during and after.
//! Data digest errors fail only the command (NVMe/TCP 1.0 §3.6.2: Transient Transport Error). Random bytes
//! after ICReq never bring the target down.
#![allow(clippy::unwrap_used)]

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use pollux_host::{Controller, Digests, HostError, HostQueue, QueueOpts, RawReply, sqe};
use pollux_nvme::spec::{Cqe, SglDescriptor, Sqe};
use pollux_nvme::tcp::{
    PduHeader, encode_c2h_data_hdr, encode_capsule_resp, encode_ic_req, encode_ic_resp, encode_r2t, encode_term_req,
    fes,
};
use proptest::prelude::*;
use proptest::test_runner::{Config as PropConfig, TestRunner};

/// Runs `case` against a fresh target while a healthy host does verified I/O on another
/// connection: some rounds before, rounds during (it runs concurrently) and some after.
fn with_healthy(case: impl FnOnce(SocketAddr, &mut Healthy)) {
    let t = start("");
    let a = addr(&t);
    let mut h = Healthy::start(a, 30000);
    h.progress(3);
    case(a, &mut h);
    h.progress(3);
    h.finish();
    t.shutdown().unwrap();
}

/// A harmless command (Keep Alive, CID 1, no data) to wrap in malformed PDUs.
fn cmd() -> Sqe {
    let mut s = sqe::keep_alive();
    s.cid.set(1);
    s.set_psdt(Sqe::PSDT_SGL_MPTR_CONTIGUOUS);
    s.set_sgl(&SglDescriptor::transport_data_block(0));
    s
}

/// Sends `pdu` on a fresh initialized connection and expects C2HTermReq `fes`/`fei` + EOF.
fn term_after_icreq(a: SocketAddr, pdu: &[u8], fes: u16, fei: Option<u32>) {
    let mut q = raw_queue(a, false, false);
    q.send_raw(pdu).unwrap();
    expect_term(&mut q, fes, fei);
}

#[test]
fn wrong_hlen_is_an_invalid_header_field_at_byte_2() {
    with_healthy(|a, _| {
        let mut pdu = raw_queue(a, false, false).capsule_pdu(&cmd(), &[]);
        pdu[2] = 70;
        term_after_icreq(a, &pdu, fes::INVALID_HEADER_FIELD, Some(2));
        // An H2CData header claiming a CapsuleCmd's length.
        let q = raw_queue(a, false, false);
        let mut h2c = q.h2c_data_pdu(1, 0, 0, &[0; 16], true);
        h2c[2] = 72;
        term_after_icreq(a, &h2c, fes::INVALID_HEADER_FIELD, Some(2));
    });
}

#[test]
fn wrong_plen_is_an_invalid_header_field_at_byte_4() {
    with_healthy(|a, _| {
        // No data (PDO 0) but PLEN 80: PLEN must be HLEN.
        let mut pdu = raw_queue(a, false, false).capsule_pdu(&cmd(), &[]);
        pdu[4..8].copy_from_slice(&80u32.to_le_bytes());
        term_after_icreq(a, &pdu, fes::INVALID_HEADER_FIELD, Some(4));
        // Data at PDO 72 but PLEN leaves none.
        let mut pdu = raw_queue(a, false, false).capsule_pdu(&cmd(), &[]);
        pdu[3] = 72;
        pdu[4..8].copy_from_slice(&72u32.to_le_bytes());
        term_after_icreq(a, &pdu, fes::INVALID_HEADER_FIELD, Some(4));
    });
}

#[test]
fn zero_plen_is_an_invalid_header_field_at_byte_4() {
    with_healthy(|a, _| {
        let mut pdu = raw_queue(a, false, false).capsule_pdu(&cmd(), &[]);
        pdu[4..8].copy_from_slice(&0u32.to_le_bytes());
        term_after_icreq(a, &pdu, fes::INVALID_HEADER_FIELD, Some(4));
    });
}

#[test]
fn huge_plen_is_refused_before_any_data_is_read() {
    with_healthy(|a, _| {
        // In-capsule data far beyond the in-capsule data size: Data Transfer Limit Exceeded.
        let mut pdu = raw_queue(a, false, false).capsule_pdu(&cmd(), &[]);
        pdu[3] = 72;
        pdu[4..8].copy_from_slice(&0xFFFF_FFF0u32.to_le_bytes());
        term_after_icreq(a, &pdu, fes::DATA_TRANSFER_LIMIT_EXCEEDED, None);
        // No data (PDO 0) but a huge PLEN: invalid PLEN.
        let mut pdu = raw_queue(a, false, false).capsule_pdu(&cmd(), &[]);
        pdu[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        term_after_icreq(a, &pdu, fes::INVALID_HEADER_FIELD, Some(4));
    });
}

#[test]
fn wrong_pdo_is_an_invalid_header_field_at_byte_3() {
    with_healthy(|a, _| {
        // PDO inside the header.
        let mut pdu = raw_queue(a, false, false).capsule_pdu(&cmd(), &[7; 16]);
        assert_eq!((pdu[3], pdu.len()), (72, 88));
        pdu[3] = 40;
        term_after_icreq(a, &pdu, fes::INVALID_HEADER_FIELD, Some(3));
        // An H2CData with PDO 0 (it always carries data).
        let q = raw_queue(a, false, false);
        let mut h2c = q.h2c_data_pdu(1, 0, 0, &[0; 16], true);
        h2c[3] = 0;
        term_after_icreq(a, &h2c, fes::INVALID_HEADER_FIELD, Some(3));
    });
}

#[test]
fn unknown_pdu_types_are_an_invalid_header_field_at_byte_0() {
    with_healthy(|a, _| {
        for ty in [0x08u8, 0x0A, 0x7F, 0xFF] {
            let mut pdu = vec![ty, 0, 24, 0, 24, 0, 0, 0];
            pdu.resize(24, 0);
            term_after_icreq(a, &pdu, fes::INVALID_HEADER_FIELD, Some(0));
        }
    });
}

#[test]
fn a_bad_header_digest_is_a_header_digest_error() {
    with_healthy(|a, _| {
        let mut q = raw_queue(a, true, false);
        assert!(q.ic_info().hdgst);
        let mut pdu = q.capsule_pdu(&cmd(), &[]);
        assert_eq!(pdu.len(), 76);
        pdu[73] ^= 0x40;
        q.send_raw(&pdu).unwrap();
        expect_term(&mut q, fes::HEADER_DIGEST_ERROR, None);
        // A PDU without the negotiated digest (HDGSTF clear): invalid FLAGS.
        let mut q = raw_queue(a, true, false);
        let mut s = HostQueue::tcp(a, QueueOpts::admin(NQN, HOST)).unwrap();
        let mut plain = s.capsule_pdu(&cmd(), &[]);
        s.close();
        // HLEN + 4 bytes: what the target reads before parsing when header digests are on.
        plain.extend_from_slice(&[0; 4]);
        q.send_raw(&plain).unwrap();
        expect_term(&mut q, fes::INVALID_HEADER_FIELD, Some(1));
    });
}

#[test]
fn icreq_fields_the_target_does_not_support_are_unsupported_parameters() {
    with_healthy(|a, _| {
        // PFV 1 (byte 8) and HPDA 1 (byte 10): the target places C2H data right after the
        // header, so only HPDA 0 is served.
        for (pdu, fei) in [
            (encode_ic_req(false, false, 0, 0), 8u32),
            (encode_ic_req(false, false, 0, 1), 10),
        ] {
            let mut pdu = pdu;
            if fei == 8 {
                pdu[8] = 1;
            }
            let mut q = HostQueue::tcp(a, QueueOpts::admin(NQN, HOST)).unwrap();
            q.send_raw(&pdu).unwrap();
            expect_term(&mut q, fes::UNSUPPORTED_PARAMETER, Some(fei));
        }
    });
}

#[test]
fn an_h2c_term_req_closes_the_connection_without_a_reply() {
    with_healthy(|a, _| {
        let mut q = HostQueue::connect(a, QueueOpts::admin(NQN, HOST)).unwrap();
        let (b, n) = encode_term_req(false, fes::PDU_SEQUENCE_ERROR, 0, &[0; 8]);
        q.send_raw(&b[..n]).unwrap();
        expect_eof(&mut q);
    });
}

#[test]
fn a_capsule_before_icreq_is_a_pdu_sequence_error() {
    with_healthy(|a, _| {
        let mut q = HostQueue::tcp(a, QueueOpts::admin(NQN, HOST)).unwrap();
        let pdu = q.capsule_pdu(&cmd(), &[]);
        q.send_raw(&pdu).unwrap();
        expect_term(&mut q, fes::PDU_SEQUENCE_ERROR, None);
    });
}

#[test]
fn a_second_icreq_is_a_pdu_sequence_error() {
    with_healthy(|a, _| {
        term_after_icreq(a, &encode_ic_req(false, false, 0, 0), fes::PDU_SEQUENCE_ERROR, None);
        // Also after a Connect.
        let mut q = HostQueue::connect(a, QueueOpts::admin(NQN, HOST)).unwrap();
        q.send_raw(&encode_ic_req(false, false, 0, 0)).unwrap();
        expect_term(&mut q, fes::PDU_SEQUENCE_ERROR, None);
    });
}

#[test]
fn controller_to_host_pdus_from_the_host_are_an_invalid_header_field_at_byte_0() {
    with_healthy(|a, _| {
        let (resp, n) = encode_capsule_resp(&Cqe::success(1, 0, 0), false);
        let (r2t, rn) = encode_r2t(1, 0, 0, 512, false);
        let (c2h, cn) = encode_c2h_data_hdr(1, 0, 16, true, false, false, false);
        let mut c2h = c2h[..cn].to_vec();
        c2h.extend_from_slice(&[0; 16]);
        let (term, tn) = encode_term_req(true, fes::PDU_SEQUENCE_ERROR, 0, &[0; 8]);
        let icresp = encode_ic_resp(false, false, 131072, 0);
        for pdu in [&resp[..n], &r2t[..rn], &c2h[..], &term[..tn], &icresp[..]] {
            term_after_icreq(a, pdu, fes::INVALID_HEADER_FIELD, Some(0));
        }
    });
}

#[test]
fn a_truncated_pdu_then_silence_does_not_stall_other_hosts() {
    with_healthy(|a, h| {
        let mut q = raw_queue(a, false, false);
        let pdu = q.capsule_pdu(&cmd(), &[9; 512]);
        q.send_raw(&pdu[..40]).unwrap();
        let mut q2 = HostQueue::connect(a, QueueOpts::admin(NQN, HOST)).unwrap();
        q2.send_raw(&pdu[..100]).unwrap();
        // The healthy host keeps going while both connections sit on half a PDU.
        h.progress(20);
        // The silent connections may stay open (no reply) or be closed; never a reply PDU.
        for q in [&mut q, &mut q2] {
            match q.recv_raw(Duration::from_millis(200)) {
                Err(HostError::Timeout { .. }) | Ok(RawReply::Eof) | Ok(RawReply::TermReq { .. }) => {}
                other => panic!("reply to half a PDU: {other:?}"),
            }
        }
    });
}

/// Opens a controller with one I/O queue, sends a 8 KiB write by transport SGL (CID 42) and
/// returns the controller and the R2T's TTAG.
fn write_waiting_for_data(a: SocketAddr) -> (Controller, u16) {
    let mut c = controller(a, 1);
    let ttag = r2t_write(&mut c.io[0], 42, 5000, 8192);
    (c, ttag)
}

#[test]
fn h2c_data_outside_its_r2t_is_refused() {
    with_healthy(|a, _| {
        // Wrong offset: the first H2CData must start at R2TO (NVMe/TCP 1.0 §3.6.2.7).
        let (mut c, ttag) = write_waiting_for_data(a);
        let pdu = c.io[0].h2c_data_pdu(42, ttag, 4096, &[1; 4096], true);
        c.io[0].send_raw(&pdu).unwrap();
        expect_term(&mut c.io[0], fes::DATA_TRANSFER_OUT_OF_RANGE, None);

        // Too long: more data than the R2T asked for.
        let (mut c, ttag) = write_waiting_for_data(a);
        let pdu = c.io[0].h2c_data_pdu(42, ttag, 0, &[1; 12288], true);
        c.io[0].send_raw(&pdu).unwrap();
        expect_term(&mut c.io[0], fes::DATA_TRANSFER_OUT_OF_RANGE, None);

        // Unknown TTAG, and the right TTAG with another CCCID: FEI points at TTAG.
        let (mut c, ttag) = write_waiting_for_data(a);
        let pdu = c.io[0].h2c_data_pdu(42, ttag.wrapping_add(7), 0, &[1; 4096], false);
        c.io[0].send_raw(&pdu).unwrap();
        expect_term(&mut c.io[0], fes::INVALID_HEADER_FIELD, Some(10));
        let (mut c, ttag) = write_waiting_for_data(a);
        let pdu = c.io[0].h2c_data_pdu(43, ttag, 0, &[1; 4096], false);
        c.io[0].send_raw(&pdu).unwrap();
        expect_term(&mut c.io[0], fes::INVALID_HEADER_FIELD, Some(10));

        // H2CData with no R2T outstanding at all.
        let mut c = controller(a, 1);
        let pdu = c.io[0].h2c_data_pdu(1, 0, 0, &[1; 512], true);
        c.io[0].send_raw(&pdu).unwrap();
        expect_term(&mut c.io[0], fes::INVALID_HEADER_FIELD, Some(10));
        drop(c);
    });
}

#[test]
fn a_bad_data_digest_fails_only_its_command_with_transient_transport_error() {
    with_healthy(|a, _| {
        for digests in [
            Digests {
                hdgst: false,
                ddgst: true,
            },
            Digests::BOTH,
        ] {
            let mut c = Controller::connect(a, NQN, HOST, 1, 32, digests).unwrap();
            let q = &mut c.io[0];
            let lba = 7000;
            let old = pattern(1, lba, 4096);
            q.write(1, lba, 8, &old).unwrap();

            // In-capsule write whose data digest is wrong.
            let mut s = sqe::write(1, lba, 8);
            s.cid.set(9);
            s.set_psdt(Sqe::PSDT_SGL_MPTR_CONTIGUOUS);
            s.set_sgl(&SglDescriptor::in_capsule(0, 4096));
            let mut pdu = q.capsule_pdu(&s, &pattern(2, lba, 4096));
            let n = pdu.len();
            pdu[n - 1] ^= 0xFF;
            q.send_raw(&pdu).unwrap();
            match q.recv_raw(WAIT).unwrap() {
                RawReply::Pdu {
                    hdr: Some(PduHeader::CapsuleResp { cqe }),
                    ..
                } => {
                    assert_eq!(cqe.cid.get(), 9);
                    assert_eq!(code(cqe.status()), (0, 0x22), "{:?}", cqe.status());
                }
                other => panic!("{digests:?}: expected a CapsuleResp, got {other:?}"),
            }
            // Nothing was written, and the connection keeps working.
            let mut back = vec![0u8; 4096];
            q.read(1, lba, 8, &mut back).unwrap();
            assert_eq!(back, old, "{digests:?}: the write with a bad digest changed the data");

            // The same through R2T/H2CData.
            let mut s = sqe::write(1, lba, 16);
            s.cid.set(10);
            s.set_psdt(Sqe::PSDT_SGL_MPTR_CONTIGUOUS);
            s.set_sgl(&SglDescriptor::transport_data_block(8192));
            let pdu = q.capsule_pdu(&s, &[]);
            q.send_raw(&pdu).unwrap();
            let ttag = match q.recv_raw(WAIT).unwrap() {
                RawReply::Pdu {
                    hdr: Some(PduHeader::R2T(r)),
                    ..
                } => r.ttag.get(),
                other => panic!("expected R2T, got {other:?}"),
            };
            let mut pdu = q.h2c_data_pdu(10, ttag, 0, &pattern(3, lba, 8192), true);
            let n = pdu.len();
            pdu[n - 2] ^= 0x01;
            q.send_raw(&pdu).unwrap();
            match q.recv_raw(WAIT).unwrap() {
                RawReply::Pdu {
                    hdr: Some(PduHeader::CapsuleResp { cqe }),
                    ..
                } => {
                    assert_eq!(cqe.cid.get(), 10);
                    assert_eq!(code(cqe.status()), (0, 0x22));
                }
                other => panic!("expected a CapsuleResp, got {other:?}"),
            }
            q.read(1, lba, 8, &mut back).unwrap();
            assert_eq!(back, old);
            let new = pattern(4, lba, 4096);
            q.write(1, lba, 8, &new).unwrap();
            q.read(1, lba, 8, &mut back).unwrap();
            assert_eq!(back, new);
            c.shutdown().unwrap();
        }
    });
}

/// What a fuzz case sends after ICReq.
#[derive(Debug, Clone)]
enum Fuzz {
    /// Any bytes.
    Bytes(Vec<u8>),
    /// A common header of a known type with the right HLEN, then anything.
    Header {
        ty: u8,
        flags: u8,
        pdo: u8,
        plen: u32,
        rest: Vec<u8>,
    },
    /// A well-formed CapsuleCmd with an arbitrary SQE and in-capsule data, optionally after
    /// an admin Connect (so admin commands run).
    Capsule {
        sqe: Vec<u8>,
        data: Vec<u8>,
        connected: bool,
    },
}

fn fuzz() -> impl Strategy<Value = Fuzz> {
    let hlen_types = prop::sample::select(vec![0u8, 2, 4, 6, 1, 3, 5, 7, 9]);
    prop_oneof![
        prop::collection::vec(any::<u8>(), 1..600).prop_map(Fuzz::Bytes),
        (
            hlen_types,
            any::<u8>(),
            any::<u8>(),
            prop_oneof![0u32..400, any::<u32>()],
            prop::collection::vec(any::<u8>(), 0..400)
        )
            .prop_map(|(ty, flags, pdo, plen, rest)| Fuzz::Header {
                ty,
                flags,
                pdo,
                plen,
                rest
            }),
        (
            prop::collection::vec(any::<u8>(), 64),
            prop::collection::vec(any::<u8>(), 0..1100),
            any::<bool>()
        )
            .prop_map(|(sqe, data, connected)| Fuzz::Capsule { sqe, data, connected }),
    ]
}

/// Random bytes after a valid ICReq (64 cases): the target answers, terminates or waits, but
/// never panics. A reactor that panicked would stop serving its connections: the healthy host
/// (on the other subsystem) keeps going, new controllers on both reactors still work, and
/// `Target::shutdown` joins every reactor without a panic.
#[test]
fn random_bytes_after_icreq_never_bring_the_target_down() {
    let t = start("");
    let a = addr(&t);
    let mut h = Healthy::start_on(a, NQN_PRIVATE, OTHER_HOST, 100);
    h.progress(3);
    let mut runner = TestRunner::new(PropConfig {
        cases: 64,
        failure_persistence: None,
        ..PropConfig::default()
    });
    runner
        .run(&fuzz(), |f| {
            let mut q = match &f {
                Fuzz::Capsule { connected: true, .. } => HostQueue::connect(a, QueueOpts::admin(NQN, HOST)).unwrap(),
                _ => raw_queue(a, false, false),
            };
            let bytes = match f {
                Fuzz::Bytes(b) => b,
                Fuzz::Header {
                    ty,
                    flags,
                    pdo,
                    plen,
                    rest,
                } => {
                    let hlen = match ty {
                        0 | 1 => 128,
                        4 => 72,
                        _ => 24,
                    };
                    let mut v = vec![ty, flags, hlen, pdo];
                    v.extend_from_slice(&plen.to_le_bytes());
                    v.extend_from_slice(&rest);
                    v
                }
                Fuzz::Capsule { sqe, data, .. } => {
                    let sqe = <Sqe as zerocopy::FromBytes>::read_from_bytes(&sqe).unwrap();
                    q.capsule_pdu(&sqe, &data)
                }
            };
            // The target may close while we send: that is an answer too.
            let _ = q.send_raw(&bytes);
            for _ in 0..4 {
                match q.recv_raw(Duration::from_millis(30)) {
                    Ok(RawReply::Eof) | Err(_) => break,
                    Ok(_) => {}
                }
            }
            Ok(())
        })
        .unwrap();
    h.progress(3);
    for _ in 0..4 {
        let mut c = controller(a, 1);
        let data = pattern(9, 1, 512);
        c.io[0].write(1, 1, 1, &data).unwrap();
        c.admin.identify_controller().unwrap();
    }
    h.finish();
    t.shutdown().expect("no reactor panicked");
}
