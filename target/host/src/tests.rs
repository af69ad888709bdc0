//! Host library tests against a fake target (a plain listener thread) for what a real one
//! never sends. The tests against a real target are pollux-target's `tests/host.rs`.
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pollux_nvme::spec::{Cqe, Status};
use pollux_nvme::tcp::{self, encode_c2h_data_hdr, encode_capsule_resp, encode_ic_resp, encode_term_req, fes};
use proptest::prelude::*;

use super::*;

const NQN: &str = "nqn.2026-11.io.pollux:host-test";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-000000000001";

/// A deterministic pattern for block `lba` written by `who`.
fn pattern(who: u8, lba: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u64 ^ lba.wrapping_mul(0x9E37_79B9) ^ u64::from(who) << 3) as u8)
        .collect()
}

/// Write data goes out from the command's own buffer. A controller that completes a write
/// before it has read the data (none should) must not make the host send a buffer it has
/// handed back: the caller gets a copy, and the bytes sent afterwards are still the ones
/// submitted even after the caller scribbles over and drops what it got back.
#[test]
fn a_write_completed_before_its_data_was_sent_still_sends_the_submitted_bytes() {
    const LEN: usize = 32 << 20; // more than loopback's socket buffers take unread
    const CHUNK: usize = 128 << 10;
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let (a, h) = fake(move |s| {
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s.write_all(&encode_ic_resp(false, false, CHUNK as u32, 0)).unwrap();
        let mut cmd = [0u8; 72];
        s.read_exact(&mut cmd).unwrap();
        let cid = u16::from_le_bytes([cmd[10], cmd[11]]);
        let (r2t, n) = tcp::encode_r2t(cid, 7, 0, LEN as u32, false);
        s.write_all(&r2t[..n]).unwrap();
        let (resp, n) = encode_capsule_resp(&Cqe::new(cid, 0, 0, Status::SUCCESS, 0), false);
        s.write_all(&resp[..n]).unwrap();
        // Read nothing until the host has its completion.
        rx.recv_timeout(Duration::from_secs(20)).unwrap();
        let mut data = Vec::with_capacity(LEN);
        let mut hdr = [0u8; 24];
        while data.len() < LEN {
            s.read_exact(&mut hdr).unwrap();
            assert_eq!(hdr[0], 0x06, "H2CData");
            let dl = u32::from_le_bytes([hdr[16], hdr[17], hdr[18], hdr[19]]) as usize; // DATAL
            let at = data.len();
            data.resize(at + dl, 0);
            s.read_exact(&mut data[at..]).unwrap();
        }
        assert!(data == pattern(9, 0, LEN), "the bytes sent are not the ones submitted");
    });
    let mut o = opts();
    o.timeout = Duration::from_secs(20);
    let mut q = HostQueue::initialized(a, o).unwrap();
    q.submit_write(1, 0, (LEN / 512) as u32, pattern(9, 0, LEN), 0).unwrap();
    let mut done = None;
    while done.is_none() {
        q.poll_completions(Some(Duration::from_secs(20)), |c| done = Some(c))
            .unwrap();
    }
    let mut c = done.unwrap();
    assert!(c.is_success());
    assert!(
        q.queued_bytes() > 0,
        "the data must still be queued for this test to mean anything"
    );
    assert!(c.buf == pattern(9, 0, LEN), "the caller gets the bytes it submitted");
    c.buf.fill(0xEE);
    drop(c);
    tx.send(()).unwrap();
    q.send_pending().unwrap();
    assert_eq!(q.queued_bytes(), 0);
    h.join().unwrap();
}

// ------------------------------------------------------------------------- fake target

/// A one-connection fake target: reads the ICReq, then runs `script` on the socket.
fn fake(script: impl FnOnce(&mut TcpStream) + Send + 'static) -> (SocketAddr, JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = l.local_addr().unwrap();
    let h = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut icreq = [0u8; 128];
        if s.read_exact(&mut icreq).is_err() {
            return;
        }
        script(&mut s);
    });
    (a, h)
}

fn opts() -> QueueOpts {
    let mut o = QueueOpts::admin(NQN, HOST);
    o.timeout = Duration::from_secs(2);
    o
}

fn bad_icresp(mutate: impl FnOnce(&mut [u8; 128]) + Send + 'static, o: QueueOpts) -> HostError {
    let (a, h) = fake(move |s| {
        let mut r = encode_ic_resp(false, false, 131072, 0);
        mutate(&mut r);
        let _ = s.write_all(&r);
        std::thread::sleep(Duration::from_millis(100));
    });
    let e = HostQueue::initialized(a, o).unwrap_err();
    h.join().unwrap();
    e
}

#[test]
fn icresp_is_validated_like_linux() {
    let e = bad_icresp(|r| r[12..16].copy_from_slice(&1000u32.to_le_bytes()), opts());
    assert!(matches!(e, HostError::IcResp(_)), "{e}");
    let e = bad_icresp(|r| r[12..16].copy_from_slice(&4098u32.to_le_bytes()), opts());
    assert!(matches!(e, HostError::IcResp(_)), "{e}");
    let e = bad_icresp(|r| r[10] = 1, opts()); // CPDA 1
    assert!(matches!(e, HostError::IcResp(_)), "{e}");
    let e = bad_icresp(|r| r[8] = 1, opts()); // PFV 1
    assert!(matches!(e, HostError::IcResp(_)), "{e}");
    let e = bad_icresp(|r| r[11] = 1, opts()); // header digest not asked for
    assert!(matches!(e, HostError::IcResp(_)), "{e}");
    let e = bad_icresp(|_| {}, opts().digests(false, true)); // data digest refused
    assert!(matches!(e, HostError::IcResp(_)), "{e}");
    // PLEN 132: a whole 132-byte PDU.
    let (a, h) = fake(|s| {
        let mut r = encode_ic_resp(false, false, 131072, 0).to_vec();
        r[4] = 132;
        r.extend_from_slice(&[0; 4]);
        s.write_all(&r).unwrap();
        std::thread::sleep(Duration::from_millis(100));
    });
    let e = HostQueue::initialized(a, opts()).unwrap_err();
    assert!(matches!(e, HostError::IcResp(_)), "{e}");
    h.join().unwrap();
    let e = bad_icresp(|r| r[0] = 5, opts()); // a CapsuleResp type with HLEN 128
    assert!(matches!(e, HostError::IcResp(_)), "{e}");
    // A C2HTermReq instead.
    let (a, h) = fake(|s| {
        let (b, n) = encode_term_req(true, fes::UNSUPPORTED_PARAMETER, 10, &[0; 8]);
        s.write_all(&b[..n]).unwrap();
    });
    let e = HostQueue::initialized(a, opts()).unwrap_err();
    assert!(matches!(e, HostError::TermReq { fes: 6, fei: 10 }), "{e}");
    h.join().unwrap();
    // EOF and silence.
    let (a, h) = fake(|_| {});
    assert!(matches!(
        HostQueue::initialized(a, opts()).unwrap_err(),
        HostError::Closed
    ));
    h.join().unwrap();
    let (a, h) = fake(|_| std::thread::sleep(Duration::from_millis(700)));
    let mut o = opts();
    o.timeout = Duration::from_millis(300);
    let e = HostQueue::initialized(a, o).unwrap_err();
    assert!(matches!(e, HostError::Timeout { what: "ICResp", .. }), "{e}");
    h.join().unwrap();
}

/// A fake target that answers ICResp, reads one command capsule, and then sends `reply`.
fn after_one_command(reply: Vec<u8>) -> HostError {
    let (a, h) = fake(move |s| {
        s.write_all(&encode_ic_resp(false, false, 131072, 0)).unwrap();
        let mut cmd = [0u8; 72];
        if s.read_exact(&mut cmd).is_ok() {
            let _ = s.write_all(&reply);
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    let mut q = HostQueue::initialized(a, opts()).unwrap();
    let cid = q.submit_read(1, 0, 1, vec![0u8; 512], 0).unwrap();
    assert_eq!(cid, 0, "command ids are handed out from 0");
    let mut got = Vec::new();
    let e = loop {
        match q.poll_completions(Some(Duration::from_secs(2)), |c| got.push(c.cid)) {
            Ok(0) => break HostError::Invalid("no error"),
            Ok(_) => continue,
            Err(e) => break e,
        }
    };
    h.join().unwrap();
    assert!(q.is_closed());
    e
}

#[test]
fn what_a_broken_target_sends_is_a_typed_error() {
    let (b, n) = encode_term_req(true, fes::PDU_SEQUENCE_ERROR, 0, &[1, 2, 3]);
    let e = after_one_command(b[..n].to_vec());
    assert!(matches!(e, HostError::TermReq { fes: 2, fei: 0 }), "{e}");

    let (b, n) = encode_capsule_resp(&Cqe::success(5, 0, 0), false);
    let e = after_one_command(b[..n].to_vec());
    assert!(matches!(e, HostError::Protocol(_)), "unknown cid: {e}");

    // C2HData beyond the 512-byte buffer.
    let (b, n) = encode_c2h_data_hdr(0, 0, 1024, true, false, false, false);
    let mut v = b[..n].to_vec();
    v.extend_from_slice(&[0u8; 1024]);
    let e = after_one_command(v);
    assert!(matches!(e, HostError::Protocol(_)), "overlong C2HData: {e}");

    // C2HData at the wrong offset.
    let (b, n) = encode_c2h_data_hdr(0, 8, 16, true, false, false, false);
    let mut v = b[..n].to_vec();
    v.extend_from_slice(&[0u8; 16]);
    let e = after_one_command(v);
    assert!(matches!(e, HostError::Protocol(_)), "offset: {e}");

    // R2T for a read.
    let (b, n) = tcp::encode_r2t(0, 0, 0, 512, false);
    let e = after_one_command(b[..n].to_vec());
    assert!(matches!(e, HostError::Protocol(_)), "R2T for a read: {e}");

    // An H2C PDU type, an unknown type, a header digest the host did not ask for.
    let e = after_one_command(tcp::encode_ic_req(false, false, 0, 0).to_vec());
    assert!(matches!(e, HostError::BadPdu(_)), "ICReq from the target: {e}");
    let e = after_one_command(vec![0x0B, 0, 24, 0, 24, 0, 0, 0]);
    assert!(matches!(e, HostError::BadPdu(_)), "{e}");
    let (b, n) = encode_capsule_resp(&Cqe::success(0, 0, 0), true);
    let e = after_one_command(b[..n].to_vec());
    assert!(matches!(e, HostError::BadPdu(_)), "{e}");

    // The target goes away mid-command.
    let e = after_one_command(Vec::new());
    assert!(matches!(e, HostError::Closed), "{e}");
}

#[test]
fn data_digest_errors_on_c2h_data_fail_the_command_only() {
    let (a, h) = fake(|s| {
        s.write_all(&encode_ic_resp(false, true, 131072, 0)).unwrap();
        let mut cmd = [0u8; 72];
        s.read_exact(&mut cmd).unwrap();
        let (b, n) = encode_c2h_data_hdr(0, 0, 8, true, false, false, true);
        s.write_all(&b[..n]).unwrap();
        s.write_all(&[9u8; 8]).unwrap();
        s.write_all(&0xDEAD_BEEFu32.to_le_bytes()).unwrap();
        let (b, n) = encode_capsule_resp(&Cqe::success(0, 1, 0), false);
        s.write_all(&b[..n]).unwrap();
        std::thread::sleep(Duration::from_millis(100));
    });
    let mut q = HostQueue::initialized(a, opts().digests(false, true)).unwrap();
    let e = q.read(1, 0, 1, &mut [0u8; 8]).unwrap_err();
    assert_eq!(e.status(), Some(Status::DATA_TRANSFER_ERROR), "{e}");
    h.join().unwrap();
}

/// How a fake target answers a 4 KiB read of `data` (command id `cid`); each inner vector is
/// one `write`, with a pause before the next.
fn c2h_replies(cid: u16, data: &[u8], (hdgst, ddgst): (bool, bool), how: &str) -> Vec<Vec<u8>> {
    let hl = if hdgst { 28 } else { 24 };
    let c2h = |off: usize, len: usize, last: bool, success: bool| {
        let (b, n) = encode_c2h_data_hdr(cid, off as u32, len as u32, last, success, hdgst, ddgst);
        let mut v = b[..n].to_vec();
        v.extend_from_slice(&data[off..off + len]);
        if ddgst {
            v.extend_from_slice(&tcp::crc32c(&data[off..off + len]).to_le_bytes());
        }
        v
    };
    let resp = |status: Status| {
        let (b, n) = encode_capsule_resp(&Cqe::new(cid, 1, 0, status, 0), hdgst);
        b[..n].to_vec()
    };
    let len = data.len();
    match how {
        // One C2HData and the CapsuleResp, in one segment.
        "whole" => vec![[c2h(0, len, true, false), resp(Status::SUCCESS)].concat()],
        // One C2HData with DATA_SUCCESS: no CapsuleResp.
        "success" => vec![c2h(0, len, true, true)],
        // Two C2HData PDUs of half the data each, in one segment.
        "split" => vec![
            [
                c2h(0, len / 2, false, false),
                c2h(len / 2, len / 2, true, false),
                resp(Status::SUCCESS),
            ]
            .concat(),
        ],
        // An error and no data.
        "error" => vec![resp(Status::LBA_OUT_OF_RANGE)],
        // The header alone, then the rest.
        "header-first" => {
            let v = [c2h(0, len, true, false), resp(Status::SUCCESS)].concat();
            vec![v[..hl].to_vec(), v[hl..].to_vec()]
        }
        // The header and part of the data, then the rest.
        "partial" => {
            let v = [c2h(0, len, true, false), resp(Status::SUCCESS)].concat();
            vec![v[..hl + 1000].to_vec(), v[hl + 1000..].to_vec()]
        }
        // A data digest that does not match.
        "bad-digest" => {
            let mut v = c2h(0, len, true, false);
            let at = v.len() - 1;
            v[at] ^= 1;
            vec![[v, resp(Status::SUCCESS)].concat()]
        }
        other => panic!("no reply {other}"),
    }
}

/// A lone read's data goes straight into its buffer when it comes as one C2HData PDU; every
/// other shape of reply (split data, no data, a short read, a bad digest) is handled as
/// before, with the same data and status.
#[test]
fn a_lone_reads_data_lands_in_its_buffer_and_any_other_reply_is_read_in_order() {
    for (hdgst, ddgst) in [(false, false), (false, true), (true, false), (true, true)] {
        let mut shapes = vec!["whole", "success", "split", "error", "header-first", "partial"];
        if ddgst {
            shapes.push("bad-digest");
        }
        let script = shapes.clone();
        let data = pattern(7, 3, 4096);
        let d = data.clone();
        let (a, h) = fake(move |s| {
            s.write_all(&encode_ic_resp(hdgst, ddgst, 131072, 0)).unwrap();
            for how in script {
                let mut cmd = vec![0u8; if hdgst { 76 } else { 72 }];
                s.read_exact(&mut cmd).unwrap();
                let cid = u16::from_le_bytes([cmd[10], cmd[11]]);
                for w in c2h_replies(cid, &d, (hdgst, ddgst), how) {
                    s.write_all(&w).unwrap();
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        });
        let mut q = HostQueue::initialized(a, opts().digests(hdgst, ddgst)).unwrap();
        let mut landed = 0;
        for &how in &shapes {
            let mut back = vec![0u8; 4096];
            let r = q.read(1, 24, 8, &mut back);
            match how {
                "error" => assert_eq!(r.unwrap_err().status(), Some(Status::LBA_OUT_OF_RANGE), "{how}"),
                "bad-digest" => assert_eq!(r.unwrap_err().status(), Some(Status::DATA_TRANSFER_ERROR), "{how}"),
                _ => {
                    r.unwrap_or_else(|e| panic!("{how} (digests {hdgst} {ddgst}): {e}"));
                    assert!(back == data, "{how} (digests {hdgst} {ddgst}): data differs");
                }
            }
            // Only a whole C2HData that came in one read lands in place (a bad digest too: it
            // is checked over the data where it landed).
            if matches!(how, "whole" | "success" | "bad-digest") {
                landed += 1;
            }
            assert_eq!(q.in_place_reads(), landed, "{how} (digests {hdgst} {ddgst})");
            assert_eq!(q.in_flight(), 0);
        }
        h.join().unwrap();
    }
}

fn arbitrary_reply() -> impl Strategy<Value = Vec<u8>> {
    let header = (
        prop::sample::select(vec![1u8, 3, 5, 7, 9, 0, 2, 4, 6, 8, 0x0A]),
        any::<u8>(),
        prop::sample::select(vec![24u8, 128, 72, 0, 23]),
        any::<u8>(),
        prop_oneof![0u32..200, any::<u32>()],
        prop::collection::vec(any::<u8>(), 0..300),
    )
        .prop_map(|(ty, flags, hlen, pdo, plen, rest)| {
            let mut v = vec![ty, flags & 0x0F, hlen, pdo];
            v.extend_from_slice(&plen.to_le_bytes());
            v.extend_from_slice(&rest);
            v
        });
    prop_oneof![prop::collection::vec(any::<u8>(), 0..400), header]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    /// Whatever a target sends after ICResp, the host library returns (an error or
    /// completions) and never panics or hangs past its deadline.
    #[test]
    fn arbitrary_target_bytes_never_panic_the_host(reply in arbitrary_reply(), big in any::<bool>()) {
        let (a, h) = fake(move |s| {
            s.write_all(&encode_ic_resp(false, false, 131072, 0)).unwrap();
            let mut cmd = [0u8; 72];
            if s.read_exact(&mut cmd).is_ok() {
                let _ = s.write_all(&reply);
            }
        });
        let mut o = opts();
        o.timeout = Duration::from_millis(500);
        let mut q = HostQueue::initialized(a, o).unwrap();
        // 4 KiB is received in place (see `fill_in_place`), 512 bytes through the buffer.
        q.submit_read(1, 0, 1, vec![0u8; if big { 4096 } else { 512 }], 0).unwrap();
        let start = Instant::now();
        loop {
            match q.poll_completions(Some(Duration::from_millis(300)), |_| {}) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            prop_assert!(start.elapsed() < Duration::from_secs(3));
        }
        let _ = q.recv_raw(Duration::from_millis(10));
        h.join().unwrap();
    }
}

/// The byte-for-byte C2HData check accepts exactly what the full parse makes of the same
/// header, and nothing else: a header that differs in any byte takes the parse.
#[test]
fn expected_c2h_agrees_with_the_full_parse() {
    for ddgst in [false, true] {
        let limits = tcp::PduLimits {
            hdgst: false,
            ddgst,
            max_data: 1 << 20,
        };
        for (cid, len) in [(0u16, 4096u32), (77, 512), (0xFFFE, 131072)] {
            for success in [false, true] {
                let (b, n) = encode_c2h_data_hdr(cid, 0, len, true, success, false, ddgst);
                let ch = tcp::CommonHeader::parse(b[..8].try_into().unwrap()).unwrap();
                let parsed = tcp::parse_pdu_header(&ch, &b[..n], &limits, tcp::Direction::ControllerToHost).unwrap();
                assert_eq!(super::queue::expected_c2h(&b[..n], cid, len, ddgst), Some(parsed));
                // Another command, another length, or any changed byte: not this read's PDU.
                assert_eq!(super::queue::expected_c2h(&b[..n], cid ^ 1, len, ddgst), None);
                assert_eq!(super::queue::expected_c2h(&b[..n], cid, len + 512, ddgst), None);
                for i in 0..n {
                    let mut m = b;
                    m[i] ^= 0x10;
                    assert_eq!(super::queue::expected_c2h(&m[..n], cid, len, ddgst), None, "byte {i}");
                }
            }
        }
    }
}
