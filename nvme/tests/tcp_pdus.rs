//! NVMe/TCP PDU encode/parse round trips and the FES/FEI of every validation error.

use std::mem::size_of;

use pollux_nvme::spec::{Cqe, SglDescriptor, Sqe, Status, opcode};
use pollux_nvme::tcp::*;
use zerocopy::little_endian::{U16, U32};
use zerocopy::{FromZeros, IntoBytes};

const H2C: Direction = Direction::HostToController;
const C2H: Direction = Direction::ControllerToHost;

fn limits(hdgst: bool, ddgst: bool) -> PduLimits {
    PduLimits {
        hdgst,
        ddgst,
        max_data: 8192,
    }
}

/// Both parsing stages over the start of `pdu`.
fn parse(pdu: &[u8], limits: &PduLimits, dir: Direction) -> Result<PduHeader, PduError> {
    let first: [u8; 8] = pdu[..8].try_into().expect("8 bytes");
    let ch = CommonHeader::parse(&first)?;
    let n = ch.header_len(limits);
    parse_pdu_header(&ch, &pdu[..n.min(pdu.len())], limits, dir)
}

/// Parses a whole PDU like a receiver would, checking PLEN against the bytes, and returns
/// the header and its data part (data digest checked).
fn parse_full<'a>(pdu: &'a [u8], limits: &PduLimits, dir: Direction) -> (PduHeader, &'a [u8]) {
    let hdr = parse(pdu, limits, dir).expect("valid PDU");
    let plen = u32::from_le_bytes(pdu[4..8].try_into().expect("4 bytes")) as usize;
    assert_eq!(plen, pdu.len(), "PLEN covers the whole PDU");
    let off = hdr.data_offset();
    let len = hdr.data_len() as usize;
    let data = &pdu[off..off + len];
    let mut end = off + len;
    if hdr.has_data_digest() {
        let d = u32::from_le_bytes(pdu[end..end + 4].try_into().expect("4 bytes"));
        check_data_digest(data, d).expect("data digest");
        end += 4;
    }
    if len == 0 {
        end = pdu.len();
    }
    assert_eq!(end, pdu.len(), "nothing after the data digest");
    (hdr, data)
}

/// Builds header + data + data digest.
fn with_data(hdr: &[u8], data: &[u8], ddgst: bool) -> Vec<u8> {
    let mut v = hdr.to_vec();
    v.extend_from_slice(data);
    if ddgst && !data.is_empty() {
        v.extend_from_slice(&crc32c(data).to_le_bytes());
    }
    v
}

fn assert_fes(err: PduError, fes: u16, fei: u32) {
    assert_eq!((err.fes(), err.fei()), (fes, fei), "{err}");
    assert!(err.is_fatal());
}

/// Recomputes the header digest after a test modified the header.
fn redigest(pdu: &mut [u8], hlen: usize) {
    let d = crc32c(&pdu[..hlen]).to_le_bytes();
    pdu[hlen..hlen + 4].copy_from_slice(&d);
}

fn sample_sqe() -> Sqe {
    let mut sqe = Sqe::new_zeroed();
    sqe.opcode = opcode::io::WRITE;
    sqe.set_psdt(Sqe::PSDT_SGL_MPTR_CONTIGUOUS);
    sqe.cid = U16::new(0x1234);
    sqe.nsid = U32::new(1);
    sqe.cdw10 = U32::new(0xdead_beef);
    sqe.cdw12 = U32::new(7);
    sqe.set_sgl(&SglDescriptor::in_capsule(0, 4096));
    sqe
}

#[test]
fn wire_struct_sizes() {
    assert_eq!(size_of::<CommonHeader>(), 8);
    assert_eq!(size_of::<IcReq>(), 128);
    assert_eq!(size_of::<IcResp>(), 128);
    assert_eq!(size_of::<TermReqHdr>(), 24);
    assert_eq!(size_of::<CapsuleCmdHdr>(), 72);
    assert_eq!(size_of::<CapsuleRespHdr>(), 24);
    assert_eq!(size_of::<DataHdr>(), 24);
    assert_eq!(size_of::<R2tHdr>(), 24);
    for (ty, hlen) in [
        (PduType::IcReq, 128),
        (PduType::IcResp, 128),
        (PduType::H2CTermReq, 24),
        (PduType::C2HTermReq, 24),
        (PduType::CapsuleCmd, 72),
        (PduType::CapsuleResp, 24),
        (PduType::H2CData, 24),
        (PduType::C2HData, 24),
        (PduType::R2T, 24),
    ] {
        assert_eq!(ty.hlen(), hlen);
        assert_eq!(PduType::from_u8(ty as u8), Some(ty));
    }
    assert_eq!(PduType::from_u8(0x08), None);
    assert_eq!(PduType::R2T as u8, 0x09);
}

#[test]
fn fes_values() {
    assert_eq!(fes::INVALID_HEADER_FIELD, 0x01);
    assert_eq!(fes::PDU_SEQUENCE_ERROR, 0x02);
    assert_eq!(fes::HEADER_DIGEST_ERROR, 0x03);
    assert_eq!(fes::DATA_TRANSFER_OUT_OF_RANGE, 0x04);
    assert_eq!(fes::DATA_TRANSFER_LIMIT_EXCEEDED, 0x05);
    assert_eq!(fes::R2T_LIMIT_EXCEEDED, 0x05);
    assert_eq!(fes::UNSUPPORTED_PARAMETER, 0x06);
}

#[test]
fn crc32c_known_values() {
    // RFC 3720 B.4 test vectors.
    assert_eq!(crc32c(&[0u8; 32]), 0x8a91_36aa);
    assert_eq!(crc32c(&[0xffu8; 32]), 0x62a8_ab43);
    assert_eq!(crc32c(b"123456789"), 0xe306_9283);
    let mut inc = Crc32c::new();
    inc.update(b"1234");
    inc.update(b"");
    inc.update(b"56789");
    assert_eq!(inc.finish(), 0xe306_9283);
    assert_eq!(Crc32c::new().finish(), crc32c(b""));
}

// ----- round trips ---------------------------------------------------------------------------

#[test]
fn ic_req_round_trip() {
    for (h, d) in [(false, false), (true, false), (false, true), (true, true)] {
        let pdu = encode_ic_req(h, d, 3, 0);
        assert_eq!(&pdu[..8], &[0, 0, 128, 0, 128, 0, 0, 0]);
        // ICReq comes before the negotiation: limits have no digests, and it never has any.
        for lim in [limits(false, false), limits(true, true)] {
            let (hdr, data) = parse_full(&pdu, &lim, H2C);
            assert!(data.is_empty());
            let PduHeader::IcReq(ic) = hdr else { panic!("{hdr:?}") };
            assert_eq!(
                (ic.hdgst(), ic.ddgst(), ic.maxr2t.get(), ic.hpda, ic.pfv.get()),
                (h, d, 3, 0, 0)
            );
        }
    }
}

#[test]
fn ic_resp_round_trip() {
    let pdu = encode_ic_resp(true, false, 131072, 0);
    let (hdr, _) = parse_full(&pdu, &limits(false, false), C2H);
    let PduHeader::IcResp(ic) = hdr else { panic!("{hdr:?}") };
    assert!(ic.hdgst() && !ic.ddgst());
    assert_eq!((ic.maxh2cdata.get(), ic.cpda), (131072, 0));
    assert_eq!(hdr.pdu_type(), PduType::IcResp);
}

#[test]
fn capsule_cmd_round_trip() {
    let sqe = sample_sqe();
    let data: Vec<u8> = (0..4096u32).map(|i| i as u8).collect();
    for (h, d) in [(false, false), (true, false), (false, true), (true, true)] {
        let lim = limits(h, d);
        // Without in-capsule data: PDO 0, PLEN = HLEN + HDGST, no DDGSTF.
        let (buf, n) = encode_capsule_cmd(&sqe, 0, h, d);
        assert_eq!(n, 72 + if h { 4 } else { 0 });
        assert_eq!(buf[3], 0);
        assert_eq!(buf[1] & flags::DDGSTF, 0);
        let (hdr, _) = parse_full(&buf[..n], &lim, H2C);
        assert_eq!(
            hdr,
            PduHeader::CapsuleCmd {
                sqe,
                pdo: 0,
                data_len: 0,
                ddgst: false
            }
        );

        // With in-capsule data.
        let (buf, n) = encode_capsule_cmd(&sqe, 4096, h, d);
        let pdu = with_data(&buf[..n], &data, d);
        let (hdr, got) = parse_full(&pdu, &lim, H2C);
        assert_eq!(
            hdr,
            PduHeader::CapsuleCmd {
                sqe,
                pdo: n as u8,
                data_len: 4096,
                ddgst: d
            }
        );
        assert_eq!(got, &data[..]);
        assert_eq!(hdr.pdu_type(), PduType::CapsuleCmd);
    }
}

#[test]
fn capsule_resp_round_trip() {
    let cqe = Cqe::new(0x1234, 3, 17, Status::LBA_OUT_OF_RANGE.with_dnr(), 0x55);
    for h in [false, true] {
        let (buf, n) = encode_capsule_resp(&cqe, h);
        assert_eq!(n, 24 + if h { 4 } else { 0 });
        let (hdr, _) = parse_full(&buf[..n], &limits(h, true), C2H);
        assert_eq!(hdr, PduHeader::CapsuleResp { cqe });
        assert_eq!(hdr.data_offset(), 0);
    }
}

#[test]
fn c2h_data_round_trip() {
    let data = vec![0xA5u8; 1000];
    for (h, d) in [(false, false), (true, false), (false, true), (true, true)] {
        for (last, success) in [(false, false), (true, false), (true, true)] {
            let (buf, n) = encode_c2h_data_hdr(9, 4096, 1000, last, success, h, d);
            let pdu = with_data(&buf[..n], &data, d);
            let (hdr, got) = parse_full(&pdu, &limits(h, d), C2H);
            let PduHeader::C2HData {
                hdr: dh,
                data_len,
                last: l,
                success: s,
                ddgst,
            } = hdr
            else {
                panic!("{hdr:?}")
            };
            assert_eq!((dh.cccid.get(), dh.datao.get(), dh.datal.get()), (9, 4096, 1000));
            assert_eq!((data_len, l, s, ddgst), (1000, last, success, d));
            assert_eq!(got, &data[..]);
        }
    }
    // SUCCESS implies LAST_PDU.
    let (buf, _) = encode_c2h_data_hdr(1, 0, 1, false, true, false, false);
    assert_eq!(buf[1], flags::DATA_LAST | flags::DATA_SUCCESS);
}

#[test]
fn h2c_data_round_trip() {
    let data = vec![0x3Cu8; 777];
    for (h, d) in [(false, false), (true, false), (false, true), (true, true)] {
        for last in [false, true] {
            let (buf, n) = encode_h2c_data_hdr(0xBEEF, 0x0102, 8192, 777, last, h, d);
            let pdu = with_data(&buf[..n], &data, d);
            let (hdr, got) = parse_full(&pdu, &limits(h, d), H2C);
            let PduHeader::H2CData {
                hdr: dh,
                data_len,
                last: l,
                ddgst,
            } = hdr
            else {
                panic!("{hdr:?}")
            };
            assert_eq!((dh.cccid.get(), dh.ttag.get(), dh.datao.get()), (0xBEEF, 0x0102, 8192));
            assert_eq!((data_len, l, ddgst), (777, last, d));
            assert_eq!(got, &data[..]);
            assert_eq!(dh.ch.pdo as usize, n);
        }
    }
}

#[test]
fn r2t_round_trip() {
    for h in [false, true] {
        let (buf, n) = encode_r2t(5, 77, 4096, 65536, h);
        let (hdr, _) = parse_full(&buf[..n], &limits(h, true), C2H);
        let PduHeader::R2T(r) = hdr else { panic!("{hdr:?}") };
        assert_eq!(
            (r.cccid.get(), r.ttag.get(), r.r2to.get(), r.r2tl.get()),
            (5, 77, 4096, 65536)
        );
    }
}

#[test]
fn term_req_round_trip() {
    let offending = [0x42u8; 200];
    for c2h in [false, true] {
        for take in [0usize, 24, 72, 128, 200] {
            let (buf, n) = encode_term_req(c2h, fes::INVALID_HEADER_FIELD, 2, &offending[..take]);
            assert_eq!(n, 24 + take.min(128));
            let dir = if c2h { C2H } else { H2C };
            // Digests negotiated or not, TermReqs carry none.
            let (hdr, data) = parse_full(&buf[..n], &limits(true, true), dir);
            let PduHeader::TermReq {
                c2h: c,
                hdr: t,
                data_len,
            } = hdr
            else {
                panic!("{hdr:?}")
            };
            assert_eq!(
                (c, t.fes.get(), t.fei.get(), data_len as usize),
                (c2h, 1, 2, take.min(128))
            );
            assert_eq!(data, &offending[..take.min(128)]);
        }
    }
}

#[test]
fn term_req_for_an_error() {
    let err = PduError::HeaderDigest {
        computed: 1,
        received: 2,
    };
    let (buf, n) = encode_term_req_for(&err, C2H, &[1, 2, 3]).expect("fatal");
    let (hdr, data) = parse_full(&buf[..n], &limits(false, false), C2H);
    let PduHeader::TermReq { c2h: true, hdr: t, .. } = hdr else {
        panic!("{hdr:?}")
    };
    assert_eq!((t.fes.get(), t.fei.get()), (fes::HEADER_DIGEST_ERROR, 0));
    assert_eq!(data, &[1, 2, 3]);
    let dd = PduError::DataDigest {
        computed: 1,
        received: 2,
    };
    assert!(encode_term_req_for(&dd, C2H, &[]).is_none());
}

// ----- validation errors ---------------------------------------------------------------------

#[test]
fn wrong_hlen() {
    let (mut buf, n) = encode_capsule_resp(&Cqe::success(1, 0, 0), false);
    buf[2] = 72;
    assert_fes(
        parse(&buf[..n], &limits(false, false), C2H).expect_err("invalid"),
        fes::INVALID_HEADER_FIELD,
        2,
    );
    let mut ic = encode_ic_req(false, false, 0, 0);
    ic[2] = 24;
    let e = CommonHeader::parse(&ic[..8].try_into().expect("8")).expect_err("invalid");
    assert_fes(e, fes::INVALID_HEADER_FIELD, 2);
}

#[test]
fn unknown_type() {
    for t in [0x08u8, 0x0A, 0x7F, 0xFF] {
        let e = CommonHeader::parse(&[t, 0, 24, 0, 24, 0, 0, 0]).expect_err("invalid");
        assert_eq!(e, PduError::UnknownType { pdu_type: t });
        assert_fes(e, fes::INVALID_HEADER_FIELD, 0);
    }
}

#[test]
fn plen_less_than_hlen() {
    let e = CommonHeader::parse(&[0x04, 0, 72, 0, 71, 0, 0, 0]).expect_err("invalid");
    assert_fes(e, fes::INVALID_HEADER_FIELD, 4);
    // With a header digest, PLEN must cover it too.
    let (mut buf, n) = encode_capsule_cmd(&sample_sqe(), 0, true, false);
    buf[4] = 72;
    redigest(&mut buf, 72);
    assert_fes(
        parse(&buf[..n], &limits(true, false), H2C).expect_err("invalid"),
        fes::INVALID_HEADER_FIELD,
        4,
    );
}

#[test]
fn plen_too_large() {
    // A PDU without data whose PLEN claims more.
    let (mut buf, n) = encode_r2t(1, 1, 0, 4096, false);
    buf[4] = 100;
    assert_fes(
        parse(&buf[..n], &limits(false, false), C2H).expect_err("invalid"),
        fes::INVALID_HEADER_FIELD,
        4,
    );
    // In-capsule data above the in-capsule size.
    let (buf, n) = encode_capsule_cmd(&sample_sqe(), 8193, false, false);
    let e = parse(&buf[..n], &limits(false, false), H2C).expect_err("invalid");
    assert_eq!(
        e,
        PduError::DataLimitExceeded {
            pdu_type: 4,
            len: 8193,
            max: 8192
        }
    );
    assert_fes(e, fes::DATA_TRANSFER_LIMIT_EXCEEDED, 0);
    // H2CData above MAXH2CDATA.
    let (buf, n) = encode_h2c_data_hdr(1, 1, 0, 9000, true, false, false);
    assert_fes(
        parse(&buf[..n], &limits(false, false), H2C).expect_err("invalid"),
        fes::DATA_TRANSFER_LIMIT_EXCEEDED,
        0,
    );
    // A CapsuleCmd with data bytes but PDO 0.
    let (mut buf, n) = encode_capsule_cmd(&sample_sqe(), 0, false, false);
    buf[4] = 80;
    assert_fes(
        parse(&buf[..n], &limits(false, false), H2C).expect_err("invalid"),
        fes::INVALID_HEADER_FIELD,
        4,
    );
    // TermReq above 152.
    let (mut buf, n) = encode_term_req(false, 1, 0, &[0; 128]);
    buf[4] = 153;
    assert_fes(
        parse(&buf[..n], &limits(false, false), H2C).expect_err("invalid"),
        fes::INVALID_HEADER_FIELD,
        4,
    );
}

#[test]
fn bad_pdo() {
    // Data PDU with PDO inside the header.
    let (mut buf, n) = encode_h2c_data_hdr(1, 1, 0, 512, true, false, false);
    buf[3] = 10;
    assert_fes(
        parse(&buf[..n], &limits(false, false), H2C).expect_err("invalid"),
        fes::INVALID_HEADER_FIELD,
        3,
    );
    // PDO inside the header digest.
    let (mut buf, n) = encode_h2c_data_hdr(1, 1, 0, 512, true, true, false);
    buf[3] = 26;
    redigest(&mut buf, 24);
    assert_fes(
        parse(&buf[..n], &limits(true, false), H2C).expect_err("invalid"),
        fes::INVALID_HEADER_FIELD,
        3,
    );
    // Data PDU with PDO 0.
    let (mut buf, n) = encode_c2h_data_hdr(1, 0, 512, true, false, false, false);
    buf[3] = 0;
    assert_fes(
        parse(&buf[..n], &limits(false, false), C2H).expect_err("invalid"),
        fes::INVALID_HEADER_FIELD,
        3,
    );
    // PDU without data and PDO != 0.
    let (mut buf, n) = encode_capsule_resp(&Cqe::success(1, 0, 0), false);
    buf[3] = 24;
    assert_fes(
        parse(&buf[..n], &limits(false, false), C2H).expect_err("invalid"),
        fes::INVALID_HEADER_FIELD,
        3,
    );
    // PDO past PLEN.
    let (mut buf, n) = encode_capsule_cmd(&sample_sqe(), 4, false, false);
    buf[3] = 200;
    assert_fes(
        parse(&buf[..n], &limits(false, false), H2C).expect_err("invalid"),
        fes::INVALID_HEADER_FIELD,
        4,
    );
}

#[test]
fn padding_before_pdo_is_accepted() {
    // A sender that aligns data to 32 bytes (CPDA 7): PDO 96, PLEN 96 + 16.
    let (mut buf, _) = encode_capsule_cmd(&sample_sqe(), 16, false, false);
    buf[3] = 96;
    buf[4] = 96 + 16;
    let mut pdu = buf[..72].to_vec();
    pdu.resize(96, 0);
    pdu.extend_from_slice(&[7u8; 16]);
    let (hdr, data) = parse_full(&pdu, &limits(false, false), H2C);
    assert_eq!(hdr.data_offset(), 96);
    assert_eq!(data, &[7u8; 16]);
}

#[test]
fn bad_header_digest() {
    let (mut buf, n) = encode_capsule_cmd(&sample_sqe(), 0, true, false);
    buf[72] ^= 1;
    let e = parse(&buf[..n], &limits(true, false), H2C).expect_err("invalid");
    assert!(matches!(e, PduError::HeaderDigest { .. }));
    assert_fes(e, fes::HEADER_DIGEST_ERROR, 0);
    // A corrupted header byte is caught by the digest too.
    let (mut buf, n) = encode_capsule_cmd(&sample_sqe(), 0, true, false);
    buf[40] ^= 0x80;
    assert_fes(
        parse(&buf[..n], &limits(true, false), H2C).expect_err("invalid"),
        fes::HEADER_DIGEST_ERROR,
        0,
    );
}

#[test]
fn bad_data_digest() {
    let data = [1u8, 2, 3, 4];
    let good = crc32c(&data);
    assert_eq!(check_data_digest(&data, good), Ok(()));
    let e = check_data_digest(&data, good ^ 1).expect_err("invalid");
    assert_eq!(
        e,
        PduError::DataDigest {
            computed: good,
            received: good ^ 1
        }
    );
    assert!(!e.is_fatal());
    assert_eq!(e.command_status(), Some(Status::TRANSIENT_TRANSPORT_ERROR));
    assert_eq!((e.fes(), e.fei()), (0, 0));
}

#[test]
fn digest_flag_not_negotiated() {
    // HDGSTF set, header digests not negotiated (the caller reads HLEN bytes).
    let (buf, _) = encode_capsule_resp(&Cqe::success(1, 0, 0), true);
    let e = parse(&buf[..24], &limits(false, false), C2H).expect_err("invalid");
    assert_fes(e, fes::INVALID_HEADER_FIELD, 1);
    // HDGSTF clear, header digests negotiated.
    let (buf, n) = encode_capsule_resp(&Cqe::success(1, 0, 0), false);
    let mut pdu = buf[..n].to_vec();
    pdu.extend_from_slice(&crc32c(&pdu).to_le_bytes());
    assert_fes(
        parse(&pdu, &limits(true, false), C2H).expect_err("invalid"),
        fes::INVALID_HEADER_FIELD,
        1,
    );
    // DDGSTF set, data digests not negotiated.
    let (buf, n) = encode_h2c_data_hdr(1, 1, 0, 16, true, false, true);
    assert_fes(
        parse(&buf[..n], &limits(false, false), H2C).expect_err("invalid"),
        fes::INVALID_HEADER_FIELD,
        1,
    );
    // DDGSTF clear on a data PDU, data digests negotiated.
    let (buf, n) = encode_h2c_data_hdr(1, 1, 0, 16, true, false, false);
    assert_fes(
        parse(&buf[..n], &limits(false, true), H2C).expect_err("invalid"),
        fes::INVALID_HEADER_FIELD,
        1,
    );
    // DDGSTF on a PDU without data.
    let (mut buf, n) = encode_capsule_cmd(&sample_sqe(), 0, false, false);
    buf[1] |= flags::DDGSTF;
    assert_fes(
        parse(&buf[..n], &limits(false, true), H2C).expect_err("invalid"),
        fes::INVALID_HEADER_FIELD,
        1,
    );
    // Digest flags on ICReq / TermReq.
    let mut ic = encode_ic_req(true, true, 0, 0);
    ic[1] = flags::HDGSTF;
    assert_fes(
        parse(&ic, &limits(true, false), H2C).expect_err("invalid"),
        fes::INVALID_HEADER_FIELD,
        1,
    );
    let (mut t, n) = encode_term_req(false, 1, 0, &[]);
    t[1] = flags::DDGSTF;
    assert_fes(
        parse(&t[..n], &limits(false, true), H2C).expect_err("invalid"),
        fes::INVALID_HEADER_FIELD,
        1,
    );
}

#[test]
fn wrong_direction() {
    let (buf, n) = encode_capsule_resp(&Cqe::success(1, 0, 0), false);
    let e = parse(&buf[..n], &limits(false, false), H2C).expect_err("invalid");
    assert_eq!(
        e,
        PduError::WrongDirection {
            pdu_type: PduType::CapsuleResp,
            dir: H2C
        }
    );
    assert_fes(e, fes::INVALID_HEADER_FIELD, 0);
    for pdu in [
        encode_r2t(1, 1, 0, 1, false).0.to_vec(),
        encode_c2h_data_hdr(1, 0, 1, true, false, false, false).0.to_vec(),
        encode_ic_resp(false, false, 4096, 0).to_vec(),
        encode_term_req(true, 1, 0, &[]).0.to_vec(),
    ] {
        assert_fes(
            parse(&pdu, &limits(false, false), H2C).expect_err("invalid"),
            fes::INVALID_HEADER_FIELD,
            0,
        );
    }
    let ic = encode_ic_req(false, false, 0, 0);
    assert_fes(
        parse(&ic, &limits(false, false), C2H).expect_err("invalid"),
        fes::INVALID_HEADER_FIELD,
        0,
    );
}

#[test]
fn ic_req_bad_fields() {
    let mut ic = encode_ic_req(false, false, 0, 0);
    ic[8] = 1;
    let e = parse(&ic, &limits(false, false), H2C).expect_err("invalid");
    assert_eq!(e.fes(), fes::UNSUPPORTED_PARAMETER);
    assert_eq!(e.fei(), 8);
    let ic = encode_ic_req(false, false, 0, 32);
    assert_fes(
        parse(&ic, &limits(false, false), H2C).expect_err("invalid"),
        fes::UNSUPPORTED_PARAMETER,
        10,
    );
    let mut ic = encode_ic_req(false, false, 0, 0);
    ic[4] = 132;
    assert_fes(
        parse(&ic, &limits(false, false), H2C).expect_err("invalid"),
        fes::INVALID_HEADER_FIELD,
        4,
    );
}

#[test]
fn ic_resp_bad_fields() {
    for (m, ok) in [(4096, true), (4095, false), (4100, true), (4098, false), (0, false)] {
        let r = parse(&encode_ic_resp(false, false, m, 0), &limits(false, false), C2H);
        match r {
            Ok(_) => assert!(ok, "{m}"),
            Err(e) => {
                assert!(!ok, "{m}");
                assert_fes(e, fes::INVALID_HEADER_FIELD, 12);
            }
        }
    }
    let r = parse(&encode_ic_resp(false, false, 4096, 32), &limits(false, false), C2H);
    assert_fes(r.expect_err("invalid"), fes::UNSUPPORTED_PARAMETER, 10);
}

#[test]
fn datal_mismatch() {
    let (mut buf, n) = encode_h2c_data_hdr(1, 1, 0, 512, true, false, false);
    buf[16..20].copy_from_slice(&511u32.to_le_bytes());
    assert_fes(
        parse(&buf[..n], &limits(false, false), H2C).expect_err("invalid"),
        fes::INVALID_HEADER_FIELD,
        16,
    );
}

#[test]
fn c2h_success_without_last() {
    let (mut buf, n) = encode_c2h_data_hdr(1, 0, 512, true, true, false, false);
    buf[1] &= !flags::DATA_LAST;
    assert_fes(
        parse(&buf[..n], &limits(false, false), C2H).expect_err("invalid"),
        fes::INVALID_HEADER_FIELD,
        1,
    );
}

#[test]
fn r2t_zero_length() {
    let (buf, n) = encode_r2t(1, 1, 0, 0, false);
    assert_fes(
        parse(&buf[..n], &limits(false, false), C2H).expect_err("invalid"),
        fes::INVALID_HEADER_FIELD,
        16,
    );
}

#[test]
fn header_buffer_of_wrong_length() {
    let (buf, n) = encode_capsule_cmd(&sample_sqe(), 0, true, false);
    let ch = CommonHeader::parse(&buf[..8].try_into().expect("8")).expect("valid");
    assert_eq!(ch.header_len(&limits(true, false)), 76);
    assert_eq!(ch.header_len(&limits(false, false)), 72);
    let e = parse_pdu_header(&ch, &buf[..n - 1], &limits(true, false), H2C).expect_err("invalid");
    assert_eq!(e, PduError::HeaderLength { expected: 76, got: 75 });
    assert_fes(e, fes::INVALID_HEADER_FIELD, 2);
}

#[test]
fn state_machine_errors_map_to_fes() {
    let seq = PduError::Sequence {
        pdu_type: 0,
        reason: "second ICReq",
    };
    assert_fes(seq, fes::PDU_SEQUENCE_ERROR, 0);
    let oor = PduError::DataOutOfRange {
        offset: 8192,
        len: 4096,
        expected_offset: 4096,
        total: 8192,
    };
    assert_fes(oor, fes::DATA_TRANSFER_OUT_OF_RANGE, 0);
}

#[test]
fn header_bytes_are_what_the_spec_says() {
    // CapsuleResp with header digest: flags HDGSTF, hlen 24, pdo 0, plen 28.
    let (buf, n) = encode_capsule_resp(&Cqe::success(0x0102, 0, 1), true);
    assert_eq!(&buf[..8], &[0x05, 0x01, 24, 0, 28, 0, 0, 0]);
    assert_eq!(&buf[24..28], &crc32c(&buf[..24]).to_le_bytes());
    assert_eq!(n, 28);
    // C2HData with both digests and 100 bytes: pdo 28, plen 28 + 100 + 4.
    let (buf, _) = encode_c2h_data_hdr(7, 0, 100, true, false, true, true);
    assert_eq!(&buf[..8], &[0x07, 0x07, 24, 28, 132, 0, 0, 0]);
    // CapsuleCmd with 1024 bytes in-capsule, no digests: pdo 72, plen 1096.
    let (buf, _) = encode_capsule_cmd(&sample_sqe(), 1024, false, false);
    assert_eq!(&buf[..8], &[0x04, 0x00, 72, 72, 0x48, 0x04, 0, 0]);
    assert_eq!(&buf[8..72], sample_sqe().as_bytes());
}

// ---------------------------------------------------------------------------------------------
// The framer (next_frame)
// ---------------------------------------------------------------------------------------------

/// `next_frame` with fixed limits that never refuse.
fn frame(avail: &[u8], limits: PduLimits, dir: Direction) -> Result<Framed, FrameError<&'static str>> {
    next_frame(avail, dir, usize::MAX, |_, _| Ok(limits))
}

/// A C2HData PDU with `data`, digests as given.
fn c2h_pdu(data: &[u8], hdgst: bool, ddgst: bool) -> Vec<u8> {
    let (h, n) = encode_c2h_data_hdr(9, 0, data.len() as u32, true, false, hdgst, ddgst);
    with_data(&h[..n], data, ddgst)
}

#[test]
fn framer_waits_for_the_common_header_then_the_header_then_the_data() {
    let data: Vec<u8> = (0..100u8).collect();
    for (hdgst, ddgst) in [(false, false), (true, false), (false, true), (true, true)] {
        let pdu = c2h_pdu(&data, hdgst, ddgst);
        let hl = if hdgst { 28 } else { 24 };
        let lim = limits(hdgst, ddgst);
        for cut in 0..=pdu.len() {
            let got = frame(&pdu[..cut], lim, C2H).expect("valid so far");
            match got {
                Framed::Need(n) if cut < 8 => assert_eq!(n, 8),
                Framed::Need(n) => assert_eq!((n, cut < hl), (hl, true), "cut {cut}"),
                Framed::Header(f) => {
                    assert!((hl..pdu.len()).contains(&cut), "cut {cut}");
                    assert_eq!((f.hl, f.plen), (hl, pdu.len()));
                    // What arrived of the data, and no digest yet to check.
                    let have = cut.saturating_sub(hl).min(data.len());
                    assert_eq!(f.data(&pdu[..cut]), &data[..have]);
                    assert_eq!(f.digest_ok(&pdu[..cut]), !ddgst);
                }
                Framed::Pdu(f) => {
                    assert_eq!(cut, pdu.len());
                    assert_eq!((f.hl, f.plen), (hl, pdu.len()));
                    assert_eq!(f.hdr, parse(&pdu, &lim, C2H).expect("valid"));
                    assert_eq!(f.data(&pdu), &data[..]);
                    assert!(f.digest_ok(&pdu));
                    assert_eq!(f.data_digest(&pdu), ddgst.then(|| crc32c(&data)));
                }
            }
        }
        // Bytes after the PDU change nothing.
        let mut more = pdu.clone();
        more.extend_from_slice(&[0xAA; 40]);
        assert_eq!(frame(&more, lim, C2H), frame(&pdu, lim, C2H));
    }
}

#[test]
fn framer_frames_pdus_without_data_whole_at_their_header() {
    let (b, n) = encode_capsule_resp(&Cqe::success(3, 0, 1), true);
    let lim = limits(true, true);
    let Ok(Framed::Pdu(f)) = frame(&b[..n], lim, C2H) else {
        panic!()
    };
    assert_eq!((f.hl, f.plen), (28, 28));
    assert_eq!(f.data(&b[..n]), &[] as &[u8]);
    assert!(f.digest_ok(&b[..n]));
    assert_eq!(f.data_digest(&b[..n]), None);
    let (b, n) = encode_capsule_cmd(&sample_sqe(), 0, false, false);
    // Without the header digest the limits call for, the framer waits for its 4 bytes.
    assert_eq!(frame(&b[..n], lim, H2C), Ok(Framed::Need(76)));
    let Ok(Framed::Pdu(f)) = frame(&b[..n], limits(false, false), H2C) else {
        panic!()
    };
    assert_eq!((f.hl, f.plen), (72, 72));
}

#[test]
fn framer_reports_a_bad_data_digest_without_failing() {
    let data = [7u8; 64];
    let mut pdu = c2h_pdu(&data, false, true);
    let last = pdu.len() - 1;
    pdu[last] ^= 1;
    let Ok(Framed::Pdu(f)) = frame(&pdu, limits(false, true), C2H) else {
        panic!()
    };
    assert_eq!(f.data(&pdu), &data[..]);
    assert!(!f.digest_ok(&pdu));
    // A frame someone built over fewer bytes than it says: no digest, no panic.
    assert!(!f.digest_ok(&pdu[..30]));
    assert_eq!(f.data(&pdu[..10]), &[] as &[u8]);
}

#[test]
fn framer_errors_carry_the_offending_headers_length() {
    let lim = limits(true, true);
    // The common header: every byte there was, up to 128, as soon as 8 are there.
    let mut bad = vec![0x0Au8, 0, 24, 0, 24, 0, 0, 0];
    for len in [8usize, 30, 128, 300] {
        bad.resize(len, 0x55);
        let e = frame(&bad, lim, C2H).expect_err("unknown type");
        assert_eq!(e.kind, FrameErrorKind::Pdu(PduError::UnknownType { pdu_type: 0x0A }));
        assert_eq!(e.header_len, len.min(TERM_REQ_MAX_DATA));
        assert_eq!(e.offending_header(&bad), &bad[..len.min(128)]);
    }
    // PLEN < HLEN.
    let mut pdu = c2h_pdu(&[1, 2, 3, 4], true, true);
    pdu[4..8].copy_from_slice(&20u32.to_le_bytes());
    let e = frame(&pdu[..8], lim, C2H).expect_err("PLEN below HLEN");
    assert_eq!(
        (e.header_len, e.kind.clone()),
        (8, FrameErrorKind::Pdu(parse(&pdu, &lim, C2H).expect_err("bad")))
    );

    // The header: HLEN plus the header digest; not before all of it is there.
    let mut pdu = c2h_pdu(&[1, 2, 3, 4], true, true);
    pdu[26] ^= 0xFF;
    assert_eq!(frame(&pdu[..27], lim, C2H), Ok(Framed::Need(28)));
    let e = frame(&pdu, lim, C2H).expect_err("header digest");
    assert_eq!(e.header_len, 28);
    assert!(matches!(e.kind, FrameErrorKind::Pdu(PduError::HeaderDigest { .. })));
    let FrameErrorKind::Pdu(err) = &e.kind else { panic!() };
    let (t, n) = encode_term_req_for(err, H2C, e.offending_header(&pdu)).expect("fatal");
    assert_eq!(&t[24..n], &pdu[..28]);
    assert_eq!(u16::from_le_bytes([t[8], t[9]]), fes::HEADER_DIGEST_ERROR);

    // A type in the wrong direction is a header error too (HLEN bytes, no digest: a TermReq
    // type carries none).
    let (t, n) = encode_term_req(false, fes::PDU_SEQUENCE_ERROR, 0, &[0; 10]);
    let e = frame(&t[..n], lim, C2H).expect_err("H2CTermReq to a host");
    assert_eq!(e.header_len, 24);
    assert!(matches!(e.kind, FrameErrorKind::Pdu(PduError::WrongDirection { .. })));

    // Too large for the receiver: after the header is valid, with its length.
    let pdu = c2h_pdu(&[9; 200], false, false);
    let e = next_frame(&pdu[..24], C2H, 100, |_, _| Ok::<_, ()>(limits(false, false))).expect_err("too large");
    assert_eq!(
        (e.kind, e.header_len),
        (FrameErrorKind::TooLarge { plen: 224, max: 100 }, 24)
    );
    assert!(matches!(
        next_frame(&pdu, C2H, 224, |_, _| Ok::<_, ()>(limits(false, false))),
        Ok(Framed::Pdu(_))
    ));
}

#[test]
fn framer_asks_the_limits_after_the_common_header_and_before_the_rest() {
    // The target's rule: ICReq first and only once, on the first 8 bytes (NVMe/TCP 1.0
    // §3.6.2.1), before the header is complete or parsed.
    let (cmd, n) = encode_capsule_cmd(&sample_sqe(), 0, false, false);
    let mut calls = Vec::new();
    let e = next_frame(&cmd[..8], H2C, usize::MAX, |ch, ty| {
        calls.push((ch.pdu_type, ty));
        Err("a PDU before ICReq")
    })
    .expect_err("refused");
    assert_eq!(e.offending_header(&cmd[..n]), &cmd[..8]);
    assert_eq!(
        (e.kind, e.header_len),
        (FrameErrorKind::Refused("a PDU before ICReq"), 8)
    );
    assert_eq!(calls, [(PduType::CapsuleCmd as u8, PduType::CapsuleCmd)]);
    // Refused even though the rest of the header is broken.
    let mut broken = cmd[..n].to_vec();
    broken[20] ^= 1;
    broken[1] = flags::HDGSTF;
    let e = next_frame(&broken, H2C, usize::MAX, |_, _| Err::<PduLimits, _>("no")).expect_err("refused");
    assert_eq!(e.kind, FrameErrorKind::Refused("no"));
    // Not asked about a common header that is itself invalid.
    let mut called = false;
    let e = next_frame(&[0xFFu8; 8], H2C, usize::MAX, |_, _| {
        called = true;
        Ok::<_, ()>(limits(false, false))
    })
    .expect_err("unknown type");
    assert!(!called);
    assert!(matches!(
        e.kind,
        FrameErrorKind::Pdu(PduError::UnknownType { pdu_type: 0xFF })
    ));
    // The limits decide the header length: with header digests a capsule needs 76 bytes.
    let (cmd, n) = encode_capsule_cmd(&sample_sqe(), 0, true, false);
    assert_eq!(frame(&cmd[..72], limits(true, false), H2C), Ok(Framed::Need(76)));
    assert!(matches!(frame(&cmd[..n], limits(true, false), H2C), Ok(Framed::Pdu(f)) if f.hl == 76));
}
