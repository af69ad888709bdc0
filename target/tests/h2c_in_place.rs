//! H2CData whose data has not all arrived when its header is parsed is received from the
//! socket straight into the command's buffer (`readv`), not through the receive buffer. These
//! tests make a host send R2T data in pieces, pausing between them, so that the target sees a
//! header with most of its data still to come, data cut anywhere (inside the data, inside its
//! digest, together with the next PDU's header), and check what ends up in the namespace: the
//! data whole, nothing of a write whose digest is wrong or that was aborted mid-transfer, and
//! other hosts unaffected by one that vanishes mid-transfer; and, for any split of a write
//! into PDUs and of the stream into pieces, the data whole.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use pollux_host::{Controller, Digests, HostQueue};
use proptest::prelude::*;
use proptest::test_runner::{Config as PropConfig, TestRunner};

const ALL_DIGESTS: [Digests; 4] = [
    Digests::NONE,
    Digests {
        hdgst: true,
        ddgst: false,
    },
    Digests {
        hdgst: false,
        ddgst: true,
    },
    Digests::BOTH,
];

/// Length of an H2CData header (and header digest) on `d`'s connection.
fn h2c_header_len(d: Digests) -> usize {
    24 + if d.hdgst { 4 } else { 0 }
}

/// Two H2CData PDUs carrying `data` for R2T `ttag` of CID `cid`: the first 40 KiB, then the
/// rest. Returns the stream and where the second PDU starts.
fn two_pdus(q: &HostQueue, cid: u16, ttag: u16, data: &[u8]) -> (Vec<u8>, usize) {
    let mut stream = q.h2c_data_pdu(cid, ttag, 0, &data[..40960], false);
    let second = stream.len();
    stream.extend(q.h2c_data_pdu(cid, ttag, 40960, &data[40960..], true));
    (stream, second)
}

/// Writes `len` bytes of old data at `slba`, then starts a write of new data there with CID
/// `cid` and returns the old data and the whole H2CData PDU of the new, not yet sent.
fn old_data_and_new_pdu(q: &mut HostQueue, cid: u16, slba: u64, len: u32, seed: u64) -> (Vec<u8>, Vec<u8>) {
    let old = pattern(seed, slba, len as usize);
    q.write(1, slba, len / 512, &old).unwrap();
    let ttag = r2t_write(q, cid, slba, len);
    let pdu = q.h2c_data_pdu(cid, ttag, 0, &pattern(seed + 1, slba, len as usize), true);
    (old, pdu)
}

fn read_back(q: &mut HostQueue, slba: u64, len: usize) -> Vec<u8> {
    let mut back = vec![0u8; len];
    q.read(1, slba, (len / 512) as u32, &mut back).unwrap();
    back
}

#[test]
fn data_arriving_in_pieces_is_written_whole_with_and_without_digests() {
    let t = start("");
    for (i, d) in ALL_DIGESTS.into_iter().enumerate() {
        let mut c = Controller::connect(addr(&t), NQN, HOST, 1, 32, d).unwrap();
        let q = &mut c.io[0];
        let h = h2c_header_len(d);
        let digest = if d.ddgst { 4 } else { 0 };
        let slba = 1000 + 200 * i as u64;
        let data = pattern(i as u64, slba, 65536);
        let (stream, second) = {
            let ttag = r2t_write(q, 7, slba, 65536);
            two_pdus(q, 7, ttag, &data)
        };
        // The first header with 10 bytes of data, 20000 more, the rest of the first PDU
        // with the second's header and 100 of its bytes, then the rest.
        send_in_pieces(q, &stream, &[h + 10, h + 20010, second + h + 100]);
        assert_eq!(expect_resp(q, 7), (0, 0), "{d:?}");
        assert_eq!(read_back(q, slba, 65536), data, "{d:?}");

        // Cut inside the first PDU's digest (or right at its data's end), and right after
        // the second PDU's header.
        let data = pattern(10 + i as u64, slba, 65536);
        let ttag = r2t_write(q, 8, slba, 65536);
        let (stream, second) = two_pdus(q, 8, ttag, &data);
        send_in_pieces(q, &stream, &[h + 4096, second - digest / 2, second + h]);
        assert_eq!(expect_resp(q, 8), (0, 0), "{d:?}");
        assert_eq!(read_back(q, slba, 65536), data, "{d:?}");

        // The whole stream at once, as a fast host sends it.
        let data = pattern(20 + i as u64, slba, 65536);
        let ttag = r2t_write(q, 9, slba, 65536);
        let (stream, _) = two_pdus(q, 9, ttag, &data);
        q.send_raw(&stream).unwrap();
        assert_eq!(expect_resp(q, 9), (0, 0), "{d:?}");
        assert_eq!(read_back(q, slba, 65536), data, "{d:?}");
        c.shutdown().unwrap();
    }
    t.shutdown().unwrap();
}

#[test]
fn a_bad_digest_on_data_received_in_place_fails_the_write_and_keeps_the_old_data() {
    let t = start("");
    for d in [ALL_DIGESTS[2], ALL_DIGESTS[3]] {
        let mut c = Controller::connect(addr(&t), NQN, HOST, 1, 32, d).unwrap();
        let q = &mut c.io[0];
        let h = h2c_header_len(d);
        let slba = 3000;
        let old = pattern(1, slba, 65536);
        q.write(1, slba, 128, &old).unwrap();
        // One flipped bit in a part of the first PDU's data that goes in place, then one in
        // the second PDU's digest itself.
        for flip in [h + 30000, 0] {
            let ttag = r2t_write(q, 9, slba, 65536);
            let (mut stream, second) = two_pdus(q, 9, ttag, &pattern(2, slba, 65536));
            let at = if flip == 0 { stream.len() - 1 } else { flip };
            stream[at] ^= 0x10;
            send_in_pieces(q, &stream, &[h + 10, second + h + 100]);
            assert_eq!(expect_resp(q, 9), (0, 0x22), "{d:?}: Transient Transport Error");
            assert_eq!(read_back(q, slba, 65536), old, "{d:?}: flip at {at}");
        }
        // The connection keeps working.
        let new = pattern(3, slba, 65536);
        q.write(1, slba, 128, &new).unwrap();
        assert_eq!(read_back(q, slba, 65536), new);
        c.shutdown().unwrap();
    }
    t.shutdown().unwrap();
}

#[test]
fn abort_while_data_is_received_in_place_drops_the_rest_of_it() {
    let t = start("");
    let mut c = controller(addr(&t), 1);
    let slba = 5000;
    let (old, pdu) = old_data_and_new_pdu(&mut c.io[0], 42, slba, 131072, 4);
    // The header and some data: the rest would go in place.
    send_in_pieces(&mut c.io[0], &pdu[..24 + 5000], &[]);
    assert_eq!(c.admin.abort(1, 42).unwrap() & 1, 0, "Abort dw0 bit 0: 0 = aborted");
    assert_eq!(expect_resp(&mut c.io[0], 42), (0, 0x07), "Abort Requested");
    // The rest of the data still comes; the target drains it.
    send_in_pieces(&mut c.io[0], &pdu[24 + 5000..], &[55000]);
    assert_eq!(read_back(&mut c.io[0], slba, 131072), old);
    let new = pattern(6, slba, 131072);
    c.io[0].write(1, slba, 256, &new).unwrap();
    assert_eq!(read_back(&mut c.io[0], slba, 131072), new);
    drop(c);
    t.shutdown().unwrap();
}

#[test]
fn data_for_a_command_aborted_before_any_of_it_came_is_drained_in_pieces() {
    // A drained command has no buffer: its PDU, far larger than a new connection's receive
    // buffer, streams through that buffer and is dropped piece by piece (it once waited
    // whole in a buffer that never grew to it, and the queue stalled).
    let t = start("");
    let mut c = controller(addr(&t), 1);
    let slba = 6000;
    let (old, pdu) = old_data_and_new_pdu(&mut c.io[0], 43, slba, 131072, 8);
    assert_eq!(c.admin.abort(1, 43).unwrap() & 1, 0, "Abort dw0 bit 0: 0 = aborted");
    assert_eq!(expect_resp(&mut c.io[0], 43), (0, 0x07), "Abort Requested");
    send_in_pieces(&mut c.io[0], &pdu, &[24 + 100, 40000, 90000]);
    assert_eq!(read_back(&mut c.io[0], slba, 131072), old);
    let new = pattern(9, slba, 131072);
    c.io[0].write(1, slba, 256, &new).unwrap();
    assert_eq!(read_back(&mut c.io[0], slba, 131072), new);
    drop(c);
    t.shutdown().unwrap();
}

#[test]
fn a_host_that_vanishes_mid_data_leaves_other_hosts_working() {
    let t = start("");
    let a = addr(&t);
    let mut h = Healthy::start(a, 30000);
    h.progress(3);
    let mut c = controller(a, 1);
    let slba = 7000;
    let (old, pdu) = old_data_and_new_pdu(&mut c.io[0], 5, slba, 65536, 7);
    send_in_pieces(&mut c.io[0], &pdu[..30000], &[24 + 100]);
    c.io[0].close();
    h.progress(3);
    // The write never completed: nothing of it is visible.
    let mut c = controller(a, 1);
    assert_eq!(read_back(&mut c.io[0], slba, 65536), old);
    h.finish();
    drop(c);
    t.shutdown().unwrap();
}

/// A write of `blocks` 512-byte blocks sent as H2CData PDUs of `pdu` bytes at most, the stream
/// cut at `cuts` (fractions of its length) with a pause after each piece.
#[derive(Debug, Clone)]
struct Split {
    digests: usize,
    blocks: u32,
    pdu: u32,
    cuts: Vec<f64>,
}

fn split() -> impl Strategy<Value = Split> {
    (
        0..4usize,
        1..=256u32,
        1..=32u32,
        proptest::collection::vec(0.0..1.0f64, 0..6),
    )
        .prop_map(|(digests, blocks, pdu_kib, mut cuts)| {
            cuts.sort_by(f64::total_cmp);
            Split {
                digests,
                blocks,
                // Not a multiple of anything: PDUs may end anywhere in a block.
                pdu: pdu_kib * 4096 - 100,
                cuts,
            }
        })
}

#[test]
fn any_split_of_the_data_into_pdus_and_pieces_writes_it_whole() {
    let t = start("");
    // One connection per digest setting for all cases (the runner's closure is `Fn`).
    let conns: std::cell::RefCell<Vec<Controller>> = std::cell::RefCell::new(
        ALL_DIGESTS
            .iter()
            .map(|&d| Controller::connect(addr(&t), NQN, HOST, 1, 32, d).unwrap())
            .collect(),
    );
    let mut runner = TestRunner::new(PropConfig {
        cases: 24,
        failure_persistence: None,
        ..PropConfig::default()
    });
    let case = std::cell::Cell::new(0u64);
    runner
        .run(&split(), |s| {
            let seed = case.get() + 1;
            case.set(seed);
            let mut conns = conns.borrow_mut();
            let q = &mut conns[s.digests].io[0];
            let len = s.blocks * 512;
            let slba = 10000 + 300 * seed % 9000;
            let data = pattern(seed, slba, len as usize);
            let ttag = r2t_write(q, 11, slba, len);
            let mut stream = Vec::new();
            let mut at = 0;
            while at < len {
                let n = s.pdu.min(len - at);
                let last = at + n == len;
                stream.extend(q.h2c_data_pdu(11, ttag, at, &data[at as usize..(at + n) as usize], last));
                at += n;
            }
            let mut cuts: Vec<usize> = s.cuts.iter().map(|c| (c * stream.len() as f64) as usize).collect();
            cuts.retain(|&c| c > 0 && c < stream.len());
            cuts.dedup();
            send_in_pieces(q, &stream, &cuts);
            prop_assert_eq!(expect_resp(q, 11), (0, 0));
            prop_assert!(read_back(q, slba, len as usize) == data, "{:?}: data differs", s);
            Ok(())
        })
        .unwrap();
    drop(conns);
    t.shutdown().unwrap();
}
