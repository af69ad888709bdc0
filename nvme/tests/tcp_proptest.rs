//! Property tests: the parser never panics on arbitrary bytes, a header digest catches any
//! corrupted header byte, encode -> parse round-trips arbitrary field values, and the framer
//! agrees with the parser however its input is split.

use std::io::Write;
use std::os::unix::net::UnixStream;

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

// ---------------------------------------------------------------------------------------------
// The framer (next_frame) and the receive buffer (RxBuf)
// ---------------------------------------------------------------------------------------------

/// What `next_frame` must say about `bytes`, from the two parsing stages as a receiver calls
/// them.
fn reference(bytes: &[u8], limits: &PduLimits, dir: Direction, max_plen: usize) -> Result<Framed, FrameError<()>> {
    let Some(first) = bytes.first_chunk::<8>() else {
        return Ok(Framed::Need(8));
    };
    let pdu_error = |e, header_len| FrameError {
        kind: FrameErrorKind::Pdu(e),
        header_len,
    };
    let ch = CommonHeader::parse(first).map_err(|e| pdu_error(e, bytes.len().min(128)))?;
    let hl = ch.header_len(limits);
    let Some(header) = bytes.get(..hl) else {
        return Ok(Framed::Need(hl));
    };
    let hdr = parse_pdu_header(&ch, header, limits, dir).map_err(|e| pdu_error(e, hl))?;
    let plen = ch.plen.get() as usize;
    if plen > max_plen {
        return Err(FrameError {
            kind: FrameErrorKind::TooLarge { plen, max: max_plen },
            header_len: hl,
        });
    }
    let f = Frame { hdr, hl, plen };
    Ok(if bytes.len() < plen {
        Framed::Header(f)
    } else {
        Framed::Pdu(f)
    })
}

fn frame_with(bytes: &[u8], limits: PduLimits, dir: Direction, max_plen: usize) -> Result<Framed, FrameError<()>> {
    next_frame(bytes, dir, max_plen, |_, _| Ok(limits))
}

/// One valid PDU of kind `which` for direction `dir` with digests as negotiated.
fn build_pdu(dir: Direction, which: u8, data: &[u8], n: u16, hdgst: bool, ddgst: bool) -> Vec<u8> {
    let data = if data.is_empty() { &[0x5A][..] } else { data };
    let with = |(h, len): ([u8; 28], usize)| {
        let mut v = h[..len].to_vec();
        v.extend_from_slice(data);
        if ddgst {
            v.extend_from_slice(&crc32c(data).to_le_bytes());
        }
        v
    };
    match (dir, which % 5) {
        (Direction::HostToController, 0) => {
            let sqe = Sqe::read_from_bytes(&[n as u8; 64]).expect("64 bytes");
            let (h, len) = encode_capsule_cmd(
                &sqe,
                if n.is_multiple_of(2) { 0 } else { data.len() as u32 },
                hdgst,
                ddgst,
            );
            let mut v = h[..len].to_vec();
            if !n.is_multiple_of(2) {
                v.extend_from_slice(data);
                if ddgst {
                    v.extend_from_slice(&crc32c(data).to_le_bytes());
                }
            }
            v
        }
        (Direction::HostToController, 1) => with(encode_h2c_data_hdr(
            n,
            n ^ 1,
            u32::from(n),
            data.len() as u32,
            n.is_multiple_of(2),
            hdgst,
            ddgst,
        )),
        (Direction::HostToController, 2) => {
            let (b, len) = encode_term_req(false, fes::PDU_SEQUENCE_ERROR, u32::from(n), data);
            b[..len].to_vec()
        }
        (Direction::HostToController, _) => encode_ic_req(hdgst, ddgst, u32::from(n), (n % 32) as u8).to_vec(),
        (Direction::ControllerToHost, 0) => {
            let (b, len) = encode_capsule_resp(&Cqe::success(n, n ^ 7, n), hdgst);
            b[..len].to_vec()
        }
        (Direction::ControllerToHost, 1) => with(encode_c2h_data_hdr(
            n,
            u32::from(n),
            data.len() as u32,
            n.is_multiple_of(2),
            n.is_multiple_of(4),
            hdgst,
            ddgst,
        )),
        (Direction::ControllerToHost, 2) => {
            let (b, len) = encode_r2t(n, n ^ 3, u32::from(n), u32::from(n) + 1, hdgst);
            b[..len].to_vec()
        }
        (Direction::ControllerToHost, 3) => {
            let (b, len) = encode_term_req(true, fes::INVALID_HEADER_FIELD, u32::from(n), data);
            b[..len].to_vec()
        }
        (Direction::ControllerToHost, _) => encode_ic_resp(hdgst, ddgst, 4096 * (u32::from(n) + 1), 0).to_vec(),
    }
}

/// A stream of valid PDUs, then maybe one corrupted byte and some garbage; with the number
/// of PDUs when it is neither corrupted nor followed by garbage.
fn any_stream() -> impl Strategy<Value = (Direction, PduLimits, Vec<u8>, Option<usize>)> {
    (
        any_dir(),
        any::<bool>(),
        any::<bool>(),
        proptest::collection::vec(
            (
                any::<u8>(),
                proptest::collection::vec(any::<u8>(), 0..200),
                any::<u16>(),
            ),
            0..12,
        ),
        proptest::option::of((any::<usize>(), 1u8..=255)),
        proptest::collection::vec(any::<u8>(), 0..40),
    )
        .prop_map(|(dir, hdgst, ddgst, pdus, flip, garbage)| {
            let mut s: Vec<u8> = pdus
                .iter()
                .flat_map(|(w, d, n)| build_pdu(dir, *w, d, *n, hdgst, ddgst))
                .collect();
            let flip = flip.filter(|_| !s.is_empty());
            if let Some((pos, x)) = flip {
                let pos = pos % s.len();
                s[pos] ^= x;
            }
            s.extend_from_slice(&garbage);
            let clean = (flip.is_none() && garbage.is_empty()).then_some(pdus.len());
            (
                dir,
                PduLimits {
                    hdgst,
                    ddgst,
                    max_data: 1 << 20,
                },
                s,
                clean,
            )
        })
}

/// A whole PDU as a receiver sees it: its frame, its data and whether the digest checks.
type Seen = (Frame, Vec<u8>, bool);

fn seen(f: Frame, pdu: &[u8]) -> Seen {
    (f, f.data(pdu).to_vec(), f.digest_ok(pdu))
}

/// Frames `stream` held whole: the PDUs, then what stopped the walk and where.
fn frame_whole(
    stream: &[u8],
    limits: PduLimits,
    dir: Direction,
    max_plen: usize,
) -> (Vec<Seen>, Result<Framed, FrameError<()>>, usize) {
    let mut out = Vec::new();
    let mut at = 0;
    loop {
        let rest = &stream[at..];
        match frame_with(rest, limits, dir, max_plen) {
            Ok(Framed::Pdu(f)) => {
                out.push(seen(f, rest));
                at += f.plen;
            }
            other => return (out, other, at),
        }
    }
}

/// The end of two walks of one stream agree: an error in a common header comes with the
/// bytes there were then, up to 128; the rest is the same.
fn same_end(
    a: &Result<Framed, FrameError<()>>,
    a_avail: usize,
    b: &Result<Framed, FrameError<()>>,
    b_avail: usize,
) -> Result<(), TestCaseError> {
    match (a, b) {
        (Err(x), Err(y)) => {
            prop_assert_eq!(&x.kind, &y.kind);
            let ch_error = x.header_len != y.header_len;
            if ch_error {
                prop_assert_eq!((x.header_len, y.header_len), (a_avail.min(128), b_avail.min(128)));
            }
        }
        _ => prop_assert_eq!(a, b),
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    /// On any bytes the framer says what the two parsing stages say, in their order.
    #[test]
    fn framer_agrees_with_the_two_stage_parse(
        bytes in prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..300),
            (prop::sample::select(vec![0u8, 1, 2, 3, 4, 5, 6, 7, 9]), any::<u8>(), any::<u8>(), 0u32..400,
             proptest::collection::vec(any::<u8>(), 0..300))
                .prop_map(|(ty, fl, pdo, plen, rest)| {
                    let hlen = PduType::from_u8(ty).map_or(24, PduType::hlen);
                    let mut v = vec![ty, fl, hlen, pdo];
                    v.extend_from_slice(&plen.to_le_bytes());
                    v.extend_from_slice(&rest);
                    v
                }),
        ],
        limits in any_limits(), dir in any_dir(), max_plen in prop_oneof![Just(usize::MAX), 0usize..400],
    ) {
        let got = frame_with(&bytes, limits, dir, max_plen);
        prop_assert_eq!(&got, &reference(&bytes, &limits, dir, max_plen));
        match got {
            Ok(Framed::Pdu(f)) => {
                let (off, len) = (f.hdr.data_offset(), f.hdr.data_len() as usize);
                prop_assert!(f.plen <= bytes.len());
                if len > 0 {
                    prop_assert_eq!(f.data(&bytes), &bytes[off..off + len]);
                }
                if f.hdr.has_data_digest() {
                    let d = u32::from_le_bytes(bytes[off + len..off + len + 4].try_into().expect("4 bytes"));
                    prop_assert_eq!(f.digest_ok(&bytes), check_data_digest(&bytes[off..off + len], d).is_ok());
                } else {
                    prop_assert!(f.digest_ok(&bytes));
                }
            }
            Ok(Framed::Header(f)) => prop_assert!(f.hl <= bytes.len() && bytes.len() < f.plen),
            Ok(Framed::Need(n)) => prop_assert!(n > bytes.len()),
            Err(e) => prop_assert!(e.header_len <= bytes.len().min(TERM_REQ_MAX_DATA)),
        }
    }

    /// However a stream is cut into reads, the framer finds the same PDUs and stops at the
    /// same place for the same reason; before a PDU is whole it asks for more bytes than
    /// there are, or announces the header it then completes.
    #[test]
    fn framer_gives_the_same_frames_however_the_stream_is_split(
        (dir, limits, stream, clean) in any_stream(),
        cuts in proptest::collection::vec(1usize..64, 0..40),
    ) {
        let (whole, end, at) = frame_whole(&stream, limits, dir, usize::MAX);
        if let Some(n) = clean {
            // Valid PDUs, all found, data digests right.
            prop_assert_eq!((whole.len(), at, &end), (n, stream.len(), &Ok(Framed::Need(8))));
            prop_assert!(whole.iter().all(|(_, _, ok)| *ok));
        }
        let mut buf = Vec::new();
        let (mut start, mut out, mut err) = (0, Vec::new(), None);
        let mut header: Option<Frame> = None;
        let mut pos = 0;
        let mut sizes = cuts.into_iter().chain(std::iter::repeat(usize::MAX));
        while pos < stream.len() && err.is_none() {
            let n = sizes.next().unwrap_or(usize::MAX).min(stream.len() - pos);
            buf.extend_from_slice(&stream[pos..pos + n]);
            pos += n;
            loop {
                let avail = &buf[start..];
                match frame_with(avail, limits, dir, usize::MAX) {
                    Ok(Framed::Pdu(f)) => {
                        if let Some(h) = header.take() {
                            prop_assert_eq!(h, f);
                        }
                        out.push(seen(f, avail));
                        start += f.plen;
                    }
                    Ok(Framed::Header(f)) => {
                        if let Some(h) = header {
                            prop_assert_eq!(h, f);
                        }
                        header = Some(f);
                        break;
                    }
                    Ok(Framed::Need(n)) => {
                        prop_assert!(n > avail.len());
                        break;
                    }
                    Err(e) => {
                        err = Some((Err(e), avail.len()));
                        break;
                    }
                }
            }
        }
        prop_assert_eq!(&out, &whole);
        prop_assert_eq!(start, at);
        let (last, avail) = err.unwrap_or_else(|| (frame_with(&buf[start..], limits, dir, usize::MAX), buf.len() - start));
        same_end(&last, avail, &end, stream.len() - at)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// The same over a socket: a writer sends the stream in pieces, a receiver reads it into a
    /// small RxBuf (compacting and growing it as its PDUs need) and frames what is there.
    #[test]
    fn rxbuf_and_framer_over_a_socket_see_what_the_whole_stream_holds(
        (dir, limits, stream, _) in any_stream(),
        cuts in proptest::collection::vec(1usize..300, 1..30),
        cap in 64usize..600,
    ) {
        const MAX_PLEN: usize = 1024;
        let (whole, end, at) = frame_whole(&stream, limits, dir, MAX_PLEN);
        let (reader, mut writer) = UnixStream::pair().expect("socketpair");
        let s = stream.clone();
        let w = std::thread::spawn(move || {
            let mut pos = 0;
            for c in cuts.into_iter().chain(std::iter::repeat(usize::MAX)) {
                if pos == s.len() {
                    break;
                }
                let n = c.min(s.len() - pos);
                // The reader stops at an error: what it does not read may not go.
                if writer.write_all(&s[pos..pos + n]).is_err() {
                    break;
                }
                pos += n;
            }
        });
        let mut rx = RxBuf::new(cap);
        let (mut out, mut last) = (Vec::new(), None);
        let mut consumed = 0;
        'read: loop {
            let need = loop {
                let avail = rx.avail();
                match frame_with(avail, limits, dir, MAX_PLEN) {
                    Ok(Framed::Pdu(f)) => {
                        out.push(seen(f, avail));
                        rx.consume(f.plen);
                        consumed += f.plen;
                    }
                    Ok(Framed::Header(f)) => break f.plen,
                    Ok(Framed::Need(n)) => break n,
                    Err(e) => {
                        last = Some((Err(e), avail.len()));
                        break 'read;
                    }
                }
            };
            rx.make_room(need);
            prop_assert!(rx.capacity() >= need && rx.room() > 0);
            match rx.recv(&reader).expect("recv") {
                Recv::Data { buffered, placed, .. } => prop_assert!(buffered > 0 && placed == 0),
                Recv::Eof => break,
                other => prop_assert!(false, "{:?} from a blocking socket with room", other),
            }
        }
        let _ = reader.shutdown(std::net::Shutdown::Both);
        w.join().expect("writer");
        prop_assert_eq!(&out, &whole);
        prop_assert_eq!(consumed, at);
        let (last, avail) = last.unwrap_or_else(|| (frame_with(rx.avail(), limits, dir, MAX_PLEN), rx.len()));
        same_end(&last, avail, &end, stream.len() - at)?;
        prop_assert!(rx.capacity() <= cap.max(MAX_PLEN));
    }
}
