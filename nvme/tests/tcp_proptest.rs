//! Property tests: the parser never panics on arbitrary bytes, a header digest catches any
//! corrupted header byte, and encode -> parse round-trips arbitrary field values.

use pollux_nvme::spec::{Cqe, Sqe};
use pollux_nvme::tcp::*;
use proptest::prelude::*;
use zerocopy::FromBytes;

fn any_dir() -> impl Strategy<Value = Direction> {
    prop_oneof![Just(Direction::HostToController), Just(Direction::ControllerToHost)]
}

fn any_limits() -> impl Strategy<Value = PduLimits> {
    (
        any::<bool>(),
        any::<bool>(),
        prop_oneof![Just(0u32), Just(4096), Just(8192), any::<u32>()],
    )
        .prop_map(|(hdgst, ddgst, max_data)| PduLimits { hdgst, ddgst, max_data })
}

/// Both stages over the start of `bytes`, the way a receiver calls them.
fn parse(bytes: &[u8], limits: &PduLimits, dir: Direction) -> Option<Result<PduHeader, PduError>> {
    let first: [u8; 8] = bytes.get(..8)?.try_into().ok()?;
    let ch = match CommonHeader::parse(&first) {
        Ok(ch) => ch,
        Err(e) => return Some(Err(e)),
    };
    let hdr = bytes.get(..ch.header_len(limits))?;
    Some(parse_pdu_header(&ch, hdr, limits, dir))
}

fn check_error(e: &PduError) {
    // Every error maps to a FES; the FEI of a field error lies inside a header.
    let _ = e.to_string();
    if e.is_fatal() {
        assert!((1..=6).contains(&e.fes()), "{e:?}");
        assert!(e.fei() < 128, "{e:?}");
    }
}

fn lim(hdgst: bool, ddgst: bool) -> PduLimits {
    PduLimits {
        hdgst,
        ddgst,
        max_data: u32::MAX,
    }
}

fn parse_ok(pdu: &[u8], limits: &PduLimits, dir: Direction) -> PduHeader {
    match parse(pdu, limits, dir) {
        Some(Ok(h)) => h,
        other => panic!("{other:?}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200),
                                   limits in any_limits(), dir in any_dir()) {
        if let Some(Err(e)) = parse(&bytes, &limits, dir) {
            check_error(&e);
        }
    }

    /// Headers that look plausible: a known type and its HLEN, random everything else, so
    /// the type-specific checks are reached.
    #[test]
    fn plausible_headers_never_panic(ty in prop::sample::select(vec![0u8, 1, 2, 3, 4, 5, 6, 7, 9]),
                                     rest in proptest::collection::vec(any::<u8>(), 132),
                                     fl in any::<u8>(), pdo in any::<u8>(), plen in 0u32..400,
                                     limits in any_limits(), dir in any_dir()) {
        let hlen = PduType::from_u8(ty).map_or(24, PduType::hlen);
        let mut bytes = vec![ty, fl, hlen, pdo];
        bytes.extend_from_slice(&plen.to_le_bytes());
        bytes.extend_from_slice(&rest);
        if let Some(Err(e)) = parse(&bytes, &limits, dir) {
            check_error(&e);
        }
    }

    /// The second stage with an unvalidated common header and a slice of any length.
    #[test]
    fn second_stage_never_panics(ch in proptest::collection::vec(any::<u8>(), 8),
                                 bytes in proptest::collection::vec(any::<u8>(), 0..200),
                                 limits in any_limits(), dir in any_dir()) {
        let ch = CommonHeader::read_from_bytes(&ch).expect("8 bytes");
        if let Err(e) = parse_pdu_header(&ch, &bytes, &limits, dir) {
            check_error(&e);
        }
    }

    /// With header digests on, any single corrupted byte of a header or its digest is an
    /// error (CRC32C detects every burst of up to 32 bits).
    #[test]
    fn header_digest_catches_corruption(which in 0usize..4, pos in 0usize..76, flip in 1u8..=255) {
        let sqe = Sqe::read_from_bytes(&[0x5Au8; 64]).expect("64 bytes");
        let (pdu, dir) = match which {
            0 => { let (b, n) = encode_capsule_cmd(&sqe, 0, true, false); (b[..n].to_vec(), Direction::HostToController) }
            1 => { let (b, n) = encode_capsule_resp(&Cqe::success(1, 2, 3), true); (b[..n].to_vec(), Direction::ControllerToHost) }
            2 => { let (b, n) = encode_r2t(1, 2, 3, 4, true); (b[..n].to_vec(), Direction::ControllerToHost) }
            _ => { let (b, n) = encode_h2c_data_hdr(1, 2, 3, 4, true, true, false); (b[..n].to_vec(), Direction::HostToController) }
        };
        let limits = PduLimits { hdgst: true, ddgst: false, max_data: 1 << 20 };
        prop_assert!(matches!(parse(&pdu, &limits, dir), Some(Ok(_))));
        let mut bad = pdu.clone();
        let pos = pos % bad.len();
        bad[pos] ^= flip;
        match parse(&bad, &limits, dir) {
            Some(Ok(h)) => prop_assert!(false, "corruption at {} accepted: {:?}", pos, h),
            Some(Err(e)) => check_error(&e),
            None => {} // the corrupted PLEN/HLEN asks for more bytes than there are
        }
    }

    #[test]
    fn capsule_cmd_round_trip(sqe_bytes in proptest::collection::vec(any::<u8>(), 64),
                              data_len in prop_oneof![Just(0u32), 1u32..=65536, any::<u32>()],
                              hdgst: bool, ddgst: bool) {
        let data_len = data_len.min(u32::MAX - 100);
        let sqe = Sqe::read_from_bytes(&sqe_bytes).expect("64 bytes");
        let (buf, n) = encode_capsule_cmd(&sqe, data_len, hdgst, ddgst);
        let h = parse_ok(&buf[..n], &lim(hdgst, ddgst), Direction::HostToController);
        let has = data_len > 0;
        prop_assert_eq!(h, PduHeader::CapsuleCmd {
            sqe, pdo: if has { n as u8 } else { 0 }, data_len, ddgst: ddgst && has });
        prop_assert_eq!(h.data_offset(), if has { n } else { 0 });
    }

    /// The bare-capsule shortcut accepts exactly what the full parse accepts as a capsule
    /// without data or header digest, and gives the same SQE; any other header goes to the
    /// full parse.
    #[test]
    fn bare_capsule_cmd_agrees_with_the_full_parse(
        sqe_bytes in proptest::collection::vec(any::<u8>(), 64),
        data_len in prop_oneof![Just(0u32), 1u32..=8192],
        hdgst: bool, ddgst: bool,
        flip in proptest::option::of((0usize..8, 1u8..=255)),
        tail in proptest::collection::vec(any::<u8>(), 0..16),
    ) {
        let sqe = Sqe::read_from_bytes(&sqe_bytes).expect("64 bytes");
        let (buf, n) = encode_capsule_cmd(&sqe, data_len, hdgst, ddgst);
        let mut pdu = buf[..n].to_vec();
        if let Some((pos, x)) = flip {
            pdu[pos] ^= x;
        }
        pdu.extend_from_slice(&tail);
        let fast = parse_bare_capsule_cmd(&pdu);
        let full = parse(&pdu, &lim(hdgst, ddgst), Direction::HostToController);
        if let Some(fast) = fast {
            prop_assert!(!hdgst && data_len == 0 && flip.is_none());
            prop_assert_eq!(full.and_then(Result::ok), Some(PduHeader::CapsuleCmd {
                sqe: fast, pdo: 0, data_len: 0, ddgst: false }));
            prop_assert_eq!(fast, sqe);
        } else {
            prop_assert!(hdgst || data_len > 0 || flip.is_some());
        }
        // Too short: never taken.
        prop_assert_eq!(parse_bare_capsule_cmd(&pdu[..pdu.len().min(BARE_CAPSULE_CMD_LEN - 1)]), None);
    }

    #[test]
    fn capsule_resp_round_trip(cqe_bytes in proptest::collection::vec(any::<u8>(), 16), hdgst: bool) {
        let cqe = Cqe::read_from_bytes(&cqe_bytes).expect("16 bytes");
        let (buf, n) = encode_capsule_resp(&cqe, hdgst);
        let h = parse_ok(&buf[..n], &lim(hdgst, true), Direction::ControllerToHost);
        prop_assert_eq!(h, PduHeader::CapsuleResp { cqe });
    }

    #[test]
    fn c2h_data_round_trip(cccid: u16, datao: u32, datal in 1u32..=(u32::MAX - 100),
                           last: bool, success: bool, hdgst: bool, ddgst: bool) {
        let (buf, n) = encode_c2h_data_hdr(cccid, datao, datal, last, success, hdgst, ddgst);
        let h = parse_ok(&buf[..n], &lim(hdgst, ddgst), Direction::ControllerToHost);
        let PduHeader::C2HData { hdr, data_len, last: l, success: s, ddgst: d } = h else {
            return Err(TestCaseError::fail(format!("{h:?}")));
        };
        prop_assert_eq!((hdr.cccid.get(), hdr.datao.get(), hdr.datal.get()), (cccid, datao, datal));
        prop_assert_eq!((data_len, l, s, d), (datal, last || success, success, ddgst));
        prop_assert_eq!(h.data_offset(), n);
    }

    #[test]
    fn h2c_data_round_trip(cccid: u16, ttag: u16, datao: u32, datal in 1u32..=(u32::MAX - 100),
                           last: bool, hdgst: bool, ddgst: bool) {
        let (buf, n) = encode_h2c_data_hdr(cccid, ttag, datao, datal, last, hdgst, ddgst);
        let h = parse_ok(&buf[..n], &lim(hdgst, ddgst), Direction::HostToController);
        let PduHeader::H2CData { hdr, data_len, last: l, ddgst: d } = h else {
            return Err(TestCaseError::fail(format!("{h:?}")));
        };
        prop_assert_eq!((hdr.cccid.get(), hdr.ttag.get(), hdr.datao.get()), (cccid, ttag, datao));
        prop_assert_eq!((data_len, l, d), (datal, last, ddgst));
    }

    #[test]
    fn r2t_round_trip(cccid: u16, ttag: u16, r2to: u32, r2tl in 1u32.., hdgst: bool) {
        let (buf, n) = encode_r2t(cccid, ttag, r2to, r2tl, hdgst);
        let h = parse_ok(&buf[..n], &lim(hdgst, false), Direction::ControllerToHost);
        let PduHeader::R2T(r) = h else { return Err(TestCaseError::fail(format!("{h:?}"))) };
        prop_assert_eq!((r.cccid.get(), r.ttag.get(), r.r2to.get(), r.r2tl.get()), (cccid, ttag, r2to, r2tl));
    }

    #[test]
    fn ic_round_trip(hdgst: bool, ddgst: bool, maxr2t: u32, pda in 0u8..=31,
                     maxh2cdata in (1024u32..=(u32::MAX / 4)).prop_map(|m| m * 4)) {
        let req = parse_ok(&encode_ic_req(hdgst, ddgst, maxr2t, pda), &lim(false, false), Direction::HostToController);
        let PduHeader::IcReq(r) = req else { return Err(TestCaseError::fail(format!("{req:?}"))) };
        prop_assert_eq!((r.hdgst(), r.ddgst(), r.maxr2t.get(), r.hpda), (hdgst, ddgst, maxr2t, pda));
        let resp = parse_ok(&encode_ic_resp(hdgst, ddgst, maxh2cdata, pda), &lim(false, false), Direction::ControllerToHost);
        let PduHeader::IcResp(r) = resp else { return Err(TestCaseError::fail(format!("{resp:?}"))) };
        prop_assert_eq!((r.hdgst(), r.ddgst(), r.maxh2cdata.get(), r.cpda), (hdgst, ddgst, maxh2cdata, pda));
    }

    #[test]
    fn term_req_round_trip(c2h: bool, fes: u16, fei: u32,
                           data in proptest::collection::vec(any::<u8>(), 0..300)) {
        let (buf, n) = encode_term_req(c2h, fes, fei, &data);
        let dir = if c2h { Direction::ControllerToHost } else { Direction::HostToController };
        let h = parse_ok(&buf[..n], &lim(true, true), dir);
        let PduHeader::TermReq { c2h: c, hdr, data_len } = h else {
            return Err(TestCaseError::fail(format!("{h:?}")));
        };
        let kept = data.len().min(128);
        prop_assert_eq!((c, hdr.fes.get(), hdr.fei.get(), data_len as usize), (c2h, fes, fei, kept));
        prop_assert_eq!(&buf[24..n], &data[..kept]);
    }

    #[test]
    fn incremental_crc_matches(data in proptest::collection::vec(any::<u8>(), 0..600), cut in 0usize..600) {
        let cut = cut.min(data.len());
        let mut c = Crc32c::new();
        c.update(&data[..cut]);
        c.update(&data[cut..]);
        prop_assert_eq!(c.finish(), crc32c(&data));
        prop_assert!(check_data_digest(&data, crc32c(&data)).is_ok());
    }
}
