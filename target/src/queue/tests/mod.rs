//! The queue without a transport: an I/O queue over [`mock::MockTransport`], which records
//! what the queue sends (completions, data, data fetches, closes) and lets a test feed it
//! capsules and fetched data. What `tests/io.rs`, `fused.rs`, `qos.rs` and `protocol.rs`
//! see through NVMe/TCP, seen here from the queue's side: every request state and move
//! ([`super::request::ReqState`]), abort, QoS holds, fused Compare and Write and Copy, SQ
//! flow control and the accounting of fetched data.

mod mock;

use pollux_host::sqe;
use pollux_nvme::spec::{SglDescriptor, Sqe, Status};

use super::request::ReqKind;
use mock::{Harness, Sent, null, ram, sim};

/// `s` as command `cid` with SGL1 for `len` bytes: in the capsule, or to fetch.
fn cmd(mut s: Sqe, cid: u16, len: u32, in_capsule: bool) -> Sqe {
    let id = if in_capsule {
        SglDescriptor::ID_DATA_BLOCK_OFFSET
    } else {
        SglDescriptor::ID_TRANSPORT_DATA_BLOCK
    };
    s.set_sgl(&SglDescriptor::new(0, len, id));
    s.set_psdt(Sqe::PSDT_SGL_MPTR_CONTIGUOUS);
    s.cid.set(cid);
    s
}

/// A read of `nlb` blocks at `slba` of namespace 1 as command `cid`.
fn read(cid: u16, slba: u64, nlb: u32) -> Sqe {
    cmd(sqe::read(1, slba, nlb), cid, nlb * 512, false)
}

/// A write of `nlb` blocks at `slba` of namespace 1 as command `cid`, its data to fetch.
fn write_fetched(cid: u16, slba: u64, nlb: u32) -> Sqe {
    cmd(sqe::write(1, slba, nlb), cid, nlb * 512, false)
}

/// A write of `nlb` blocks at `slba` of namespace 1 as command `cid`, its data in the capsule.
fn write_in_capsule(cid: u16, slba: u64, nlb: u32) -> Sqe {
    cmd(sqe::write(1, slba, nlb), cid, nlb * 512, true)
}

/// Bytes that say where they are.
fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// The completion of `cid` with `status`, whatever its SQ head.
fn completed(s: &Sent, cid: u16, status: Status) -> bool {
    matches!(s, Sent::Completion { cid: c, status: st, .. } if *c == cid && *st == status)
}

/// The statuses of the completions among `sent`, by command id, in order.
fn statuses(sent: &[Sent]) -> Vec<(u16, Status)> {
    sent.iter()
        .filter_map(|s| match s {
            Sent::Completion { cid, status, .. } => Some((*cid, *status)),
            _ => None,
        })
        .collect()
}

/// The tag the last data fetch of `sent` named for `cid`, and its length.
fn fetch_of(sent: &[Sent], cid: u16) -> (u16, u32) {
    sent.iter()
        .rev()
        .find_map(|s| match s {
            Sent::Fetch { cid: c, tag, len } if *c == cid => Some((*tag, *len)),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no data fetch for {cid} in {sent:?}"))
}

/// Read `nlb` blocks at `slba` back through the queue (RAM: at once).
fn read_back(h: &Harness, cid: u16, slba: u64, nlb: u32) -> Vec<u8> {
    h.capsule(read(cid, slba, nlb), &[]);
    let sent = h.wait_sent(2);
    match &sent[0] {
        Sent::Read { bytes, .. } => bytes.clone(),
        other => panic!("a read's data first, got {other:?}"),
    }
}

// ------------------------------------------------------------------ request states
//
// Every move of a request ([`super::request::ReqState`]; "new" is a capsule just received,
// "done" its slot freed), and the tests that make it:
// - new -> AwaitingData -> Submitted -> done: `a_fetched_write_awaits_its_data_then_is_submitted_then_done`
// - new -> Submitted -> done: `a_read_of_a_device_is_submitted_then_sends_its_data_and_completion`
// - AwaitingData -> Draining -> done: `a_bad_digest_on_fetched_data_drains_the_rest_and_fails_the_command`,
//   `abort_of_a_command_awaiting_data_completes_it_and_drains_its_data`
// - new -> Held -> done (run inline when released, or aborted):
//   `qos_holds_commands_over_budget_and_runs_them_in_arrival_order`,
//   `abort_of_a_held_command_ends_it_before_it_runs`
// - Held -> AwaitingData: `a_held_write_fetches_its_data_only_when_released`
// - Held -> Submitted: `a_held_read_of_a_device_is_submitted_when_released`
// - new -> Parked -> done (a fused first, then the pair on RAM):
//   `fused_compare_and_write_writes_when_equal_and_fails_both_when_not`
// - AwaitingData -> Parked: `a_fused_first_with_fetched_data_is_parked_once_its_data_came`
// - new -> Parked -> Submitted -> done (a write behind a locked range on a device):
//   `a_write_to_blocks_a_fused_pair_holds_is_parked_until_the_pair_ends`

/// A write whose data is fetched: AwaitingData from its capsule, still AwaitingData with part
/// of its data, Submitted at its backend (a simulated SSD) once all came, done at its
/// completion.
#[test]
fn a_fetched_write_awaits_its_data_then_is_submitted_then_done() {
    let h = Harness::new(&[sim(1, 1024, 300_000.0)], 32, false);
    h.capsule(write_fetched(7, 16, 8), &[]);
    let sent = h.sent();
    let (tag, len) = fetch_of(&sent, 7);
    assert_eq!(
        (sent.len(), len),
        (1, 4096),
        "one fetch of all its data, nothing else: {sent:?}"
    );
    assert_eq!(h.states(), vec![(7, ReqKind::AwaitingData)]);
    let data = pattern(3, 4096);
    assert!(h.data(tag, 7, &data[..1024]));
    assert_eq!(h.states(), vec![(7, ReqKind::AwaitingData)], "a part of its data");
    assert!(h.sent().is_empty());
    assert!(h.data(tag, 7, &data[1024..]));
    assert_eq!(h.states(), vec![(7, ReqKind::Submitted)], "at its backend");
    let sent = h.wait_sent(1);
    assert!(completed(&sent[0], 7, Status::SUCCESS), "{sent:?}");
    assert!(h.states().is_empty(), "its slot is free at its completion");
    let back = read_back(&h, 8, 16, 8);
    assert_eq!(back, data);
}

/// A read of a device: Submitted from its capsule, done when its channel completes it, its
/// data then its completion sent.
#[test]
fn a_read_of_a_device_is_submitted_then_sends_its_data_and_completion() {
    let h = Harness::new(&[sim(1, 1024, 200_000.0)], 32, false);
    h.capsule(read(3, 0, 8), &[]);
    assert_eq!(h.states(), vec![(3, ReqKind::Submitted)]);
    assert!(h.sent().is_empty());
    let sent = h.wait_sent(2);
    assert!(
        matches!(&sent[0], Sent::Read { cid: 3, bytes, folded: false, in_place: false } if bytes.len() == 4096),
        "{sent:?}"
    );
    assert!(completed(&sent[1], 3, Status::SUCCESS), "{sent:?}");
    assert!(h.states().is_empty());
}

/// A read of RAM takes no request: its bytes are copied and sent at once (block atomicity:
/// never in place), and its completion follows.
#[test]
fn a_read_of_ram_is_copied_at_once_without_a_request() {
    let h = Harness::new(&[ram(1, 1024)], 32, false);
    let data = pattern(9, 512);
    h.capsule(write_in_capsule(1, 5, 1), &data);
    assert!(completed(&h.sent()[0], 1, Status::SUCCESS));
    h.capsule(read(2, 5, 1), &[]);
    assert!(h.states().is_empty(), "no request outlives the capsule");
    let sent = h.sent();
    assert_eq!(
        sent[0],
        Sent::Read {
            cid: 2,
            bytes: data,
            folded: false,
            in_place: false
        }
    );
    assert!(completed(&sent[1], 2, Status::SUCCESS));
}

/// Memory never written (the null backend's zeroes) is offered in place.
#[test]
fn a_read_of_never_written_memory_is_offered_in_place() {
    let h = Harness::new(&[null(1, 1024)], 32, false);
    h.capsule(read(1, 0, 8), &[]);
    let sent = h.sent();
    assert!(
        matches!(&sent[0], Sent::Read { cid: 1, bytes, in_place: true, .. } if bytes == &vec![0; 4096]),
        "{sent:?}"
    );
}

/// A transport's digest over fetched data failed: the command completes at once with a
/// transient transport error and its request drains the rest of its data (Draining), then
/// goes; nothing is written.
#[test]
fn a_bad_digest_on_fetched_data_drains_the_rest_and_fails_the_command() {
    let h = Harness::new(&[ram(1, 1024)], 32, false);
    h.capsule(write_fetched(4, 0, 8), &[]);
    let (tag, _) = fetch_of(&h.sent(), 4);
    assert!(h.data_digest(tag, 4, &[0xAA; 2048], false));
    let sent = h.sent();
    assert!(completed(&sent[0], 4, Status::TRANSIENT_TRANSPORT_ERROR), "{sent:?}");
    assert_eq!(h.states(), vec![(4, ReqKind::Draining)]);
    assert!(
        h.data(tag, 4, &[0xAA; 2048]),
        "the rest of its data is drained, not refused"
    );
    assert!(h.states().is_empty(), "the tombstone goes when its data is all in");
    assert!(h.sent().is_empty(), "one completion, no more");
    assert_eq!(read_back(&h, 5, 0, 8), vec![0; 4096], "nothing written");
}

/// A digest error on the capsule's own data fails the command, not the queue.
#[test]
fn a_bad_digest_on_in_capsule_data_fails_the_command_only() {
    let h = Harness::new(&[ram(1, 1024)], 32, false);
    h.capsule_digest(write_in_capsule(6, 0, 1), &[1; 512], false);
    assert_eq!(statuses(&h.sent()), vec![(6, Status::TRANSIENT_TRANSPORT_ERROR)]);
    h.capsule(write_in_capsule(7, 0, 1), &[1; 512]);
    assert_eq!(statuses(&h.sent()), vec![(7, Status::SUCCESS)]);
}

// ------------------------------------------------------------------ abort

/// Abort of a command awaiting its data: Abort Requested at once, its request a Draining
/// tombstone until its data (already on its way) came; nothing written.
#[test]
fn abort_of_a_command_awaiting_data_completes_it_and_drains_its_data() {
    let h = Harness::new(&[ram(1, 1024)], 32, false);
    h.capsule(write_fetched(9, 0, 8), &[]);
    let (tag, _) = fetch_of(&h.sent(), 9);
    assert_eq!(h.on(|q, r, id| q.abort_pending(r, id, 9)), Some(true));
    assert_eq!(statuses(&h.sent()), vec![(9, Status::ABORT_REQUESTED)]);
    assert_eq!(h.states(), vec![(9, ReqKind::Draining)]);
    // Its command id is the host's again: a new command with it is no conflict.
    h.capsule(write_in_capsule(9, 100, 1), &[5; 512]);
    assert_eq!(statuses(&h.sent()), vec![(9, Status::SUCCESS)]);
    assert!(h.data(tag, 9, &[0xEE; 4096]));
    assert!(h.states().is_empty());
    assert!(h.sent().is_empty());
    assert_eq!(read_back(&h, 10, 0, 8), vec![0; 4096]);
}

/// Abort of a command at a backend that can cancel it (a simulated SSD): it completes with
/// Abort Requested through its channel, once.
#[test]
fn abort_of_a_submitted_command_completes_it_through_its_channel() {
    let h = Harness::new(&[sim(1, 1024, 2_000_000.0)], 32, false);
    h.capsule(read(11, 0, 8), &[]);
    assert_eq!(h.states(), vec![(11, ReqKind::Submitted)]);
    assert_eq!(h.on(|q, r, id| q.abort_pending(r, id, 11)), Some(true));
    let sent = h.wait_sent(1);
    assert_eq!(statuses(&sent), vec![(11, Status::ABORT_REQUESTED)], "{sent:?}");
    assert!(h.states().is_empty());
}

/// Abort of a command the queue does not have: nothing aborted, nothing sent.
#[test]
fn abort_of_an_unknown_command_aborts_nothing() {
    let h = Harness::new(&[ram(1, 1024)], 32, false);
    assert_eq!(h.on(|q, r, id| q.abort_pending(r, id, 77)), Some(false));
    assert!(h.sent().is_empty());
}

// ------------------------------------------------------------------ SQ flow control

/// Each completion reports the SQ head after its command (NVMe 2.0 §4.6), wrapping at the
/// queue's size.
#[test]
fn completions_report_the_sq_head_wrapping_at_the_queue_size() {
    let h = Harness::new(&[ram(1, 1024)], 4, false);
    let mut heads = Vec::new();
    for cid in 0..6u16 {
        h.capsule(write_in_capsule(cid, 0, 1), &[1; 512]);
        for s in h.sent() {
            if let Sent::Completion { sqhd, .. } = s {
                heads.push(sqhd);
            }
        }
    }
    assert_eq!(heads, vec![1, 2, 3, 0, 1, 2]);
}

/// SQ flow control off: SQHD is reserved (0), and a read's completion, which then says
/// nothing but success, is folded into its data when the transport offers to.
#[test]
fn without_sq_flow_control_sqhd_is_zero_and_a_read_may_fold_its_completion() {
    let h = Harness::new(&[ram(1, 1024)], 8, true);
    h.capsule(write_in_capsule(1, 0, 1), &[1; 512]);
    assert!(matches!(h.sent()[..], [Sent::Completion { cid: 1, sqhd: 0, .. }]));
    h.capsule(read(2, 0, 1), &[]);
    let sent = h.sent();
    assert!(
        matches!(
            sent[..],
            [Sent::Read {
                cid: 2,
                folded: true,
                ..
            }]
        ),
        "{sent:?}"
    );
    // A transport that does not fold: the completion follows.
    h.wire().never_folds = true;
    h.capsule(read(3, 0, 1), &[]);
    let sent = h.sent();
    assert!(
        matches!(
            sent[..],
            [
                Sent::Read {
                    cid: 3,
                    folded: false,
                    ..
                },
                Sent::Completion { cid: 3, sqhd: 0, .. }
            ]
        ),
        "{sent:?}"
    );
}

/// With SQ flow control a read never folds its completion (it carries the SQ head).
#[test]
fn with_sq_flow_control_a_read_keeps_its_completion() {
    let h = Harness::new(&[ram(1, 1024)], 8, false);
    h.capsule(read(2, 0, 1), &[]);
    let sent = h.sent();
    assert!(
        matches!(
            sent[..],
            [
                Sent::Read {
                    cid: 2,
                    folded: false,
                    ..
                },
                Sent::Completion { cid: 2, sqhd: 1, .. }
            ]
        ),
        "{sent:?}"
    );
}

/// A full queue takes no command: with every entry a command in flight or a completion the
/// network has not taken, the next command ends the queue (the transport told why first).
#[test]
fn a_command_beyond_a_full_queue_ends_it() {
    let h = Harness::new(&[ram(1, 1024)], 4, false);
    h.wire().stalled = true;
    for cid in 0..4u16 {
        h.capsule(write_in_capsule(cid, 0, 1), &[1; 512]);
    }
    assert_eq!(statuses(&h.sent()).len(), 4, "four completions queued, none taken");
    h.capsule(write_in_capsule(4, 0, 1), &[1; 512]);
    let sent = h.sent();
    assert!(
        matches!(&sent[..], [Sent::Terminated(why), Sent::Closed] if why.contains('4')),
        "{sent:?}"
    );
    assert!(h.on(|_, _, _| ()).is_none(), "the queue's source is gone");
}

/// Completions the network took free their entries: the same commands on a host that reads
/// go on forever; requests in flight count as much as completions not taken.
#[test]
fn entries_come_back_as_completions_go_out() {
    let h = Harness::new(&[ram(1, 1024)], 4, false);
    for cid in 0..40u16 {
        h.capsule(write_in_capsule(cid % 8, 0, 1), &[1; 512]);
    }
    assert_eq!(statuses(&h.sent()).len(), 40);
    // Three awaiting their data and one completion not taken: full.
    h.wire().stalled = true;
    for cid in 0..3u16 {
        h.capsule(write_fetched(100 + cid, 0, 1), &[]);
    }
    h.capsule(write_in_capsule(200, 0, 1), &[1; 512]);
    assert!(h.sent().iter().all(|s| !matches!(s, Sent::Terminated(_))));
    h.capsule(write_in_capsule(201, 0, 1), &[1; 512]);
    assert!(matches!(h.sent()[..], [Sent::Terminated(_), Sent::Closed]));
}

// ------------------------------------------------------------------ fetched data accounting

/// One fetch per command, for all its data, under the tag of its request; data under a tag
/// of another command, or past what was fetched, is not taken.
#[test]
fn each_fetch_asks_all_a_commands_data_under_its_own_tag() {
    let h = Harness::new(&[ram(1, 1024)], 32, false);
    h.capsule(write_fetched(1, 0, 8), &[]);
    h.capsule(write_fetched(2, 8, 16), &[]);
    let sent = h.sent();
    let ((t1, l1), (t2, l2)) = (fetch_of(&sent, 1), fetch_of(&sent, 2));
    assert_eq!((l1, l2, sent.len()), (4096, 8192, 2));
    assert_ne!(t1, t2);
    assert!(!h.data(t1, 2, &[0; 512]), "a tag names its command");
    assert!(!h.data(t2, 2, &[0; 8193]), "no more than was fetched");
    assert!(h.data(t2, 2, &pattern(1, 8192)));
    assert_eq!(statuses(&h.sent()), vec![(2, Status::SUCCESS)]);
    assert_eq!(h.states(), vec![(1, ReqKind::AwaitingData)], "the other still waits");
    assert!(h.data(t1, 1, &pattern(2, 4096)));
    assert_eq!(statuses(&h.sent()), vec![(1, Status::SUCCESS)]);
    assert_eq!(read_back(&h, 3, 8, 16), pattern(1, 8192));
}

/// Two commands awaiting data under one command id: the second is a conflict (the host's
/// bug), and the first goes on.
#[test]
fn a_command_id_awaiting_data_twice_is_a_conflict() {
    let h = Harness::new(&[ram(1, 1024)], 32, false);
    h.capsule(write_fetched(5, 0, 1), &[]);
    let (tag, _) = fetch_of(&h.sent(), 5);
    h.capsule(write_fetched(5, 1, 1), &[]);
    assert_eq!(statuses(&h.sent()), vec![(5, Status::CID_CONFLICT.with_dnr())]);
    assert!(h.data(tag, 5, &[1; 512]));
    assert_eq!(statuses(&h.sent()), vec![(5, Status::SUCCESS)]);
}

/// Tombstones of aborted commands whose data never comes are bounded by the queue's size:
/// a new fetch beyond that drops the oldest (its late data is then refused).
#[test]
fn drained_tombstones_are_bounded_by_the_queue_size() {
    let h = Harness::new(&[ram(1, 1024)], 4, false);
    let mut tags = Vec::new();
    for cid in 0..6u16 {
        h.capsule(write_fetched(cid, 0, 1), &[]);
        tags.push(fetch_of(&h.sent(), cid).0);
        assert_eq!(h.on(move |q, r, id| q.abort_pending(r, id, cid)), Some(true));
        assert_eq!(statuses(&h.sent()), vec![(cid, Status::ABORT_REQUESTED)]);
    }
    // Checked as each fetch starts: at most the queue's size before it, and its own.
    let draining: Vec<u16> = h
        .states()
        .iter()
        .filter(|(_, k)| *k == ReqKind::Draining)
        .map(|(c, _)| *c)
        .collect();
    assert_eq!(draining.len(), 5, "{draining:?}");
    assert!(!draining.contains(&0));
    assert!(!h.data(tags[0], 0, &[0; 512]), "the oldest tombstone went");
    assert!(h.data(tags[5], 5, &[0; 512]));
    assert!(h.sent().is_empty());
}

// ------------------------------------------------------------------ QoS holds

/// Namespace 1 of RAM limited to `iops` commands a second.
fn limited(iops: u64) -> std::sync::Arc<crate::subsystem::Namespace> {
    let ns = ram(1, 1024);
    ns.qos.set(&pollux_conf::Qos {
        iops: Some(iops),
        ..Default::default()
    });
    ns
}

/// Send reads (cids from `first`) until one is held; the cids sent.
fn until_held(h: &Harness, first: u16) -> Vec<u16> {
    let mut cids = Vec::new();
    for cid in first..first + 50 {
        h.capsule(read(cid, 0, 1), &[]);
        cids.push(cid);
        if h.states().iter().any(|(c, k)| *c == cid && *k == ReqKind::Held) {
            return cids;
        }
    }
    panic!("no read was held under the limit");
}

/// Commands over a namespace's budget are held (a request in Held, nothing sent), then run
/// in arrival order as the budget allows.
#[test]
fn qos_holds_commands_over_budget_and_runs_them_in_arrival_order() {
    let h = Harness::new(&[limited(5)], 32, false);
    let mut cids = until_held(&h, 0);
    for cid in 100..103u16 {
        h.capsule(read(cid, 0, 1), &[]);
        cids.push(cid);
    }
    let held = h.states();
    assert!(
        held.len() >= 4 && held.iter().all(|(_, k)| *k == ReqKind::Held),
        "{held:?}"
    );
    let mut done = Vec::new();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while done.len() < cids.len() {
        assert!(std::time::Instant::now() < until, "held commands never ran: {done:?}");
        done.extend(statuses(&h.sent()).into_iter().map(|(c, s)| {
            assert_eq!(s, Status::SUCCESS);
            c
        }));
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(done, cids, "in arrival order");
    assert!(h.states().is_empty());
}

/// A held write asks for its data only when it is released (a held write costs no buffer):
/// Held, then AwaitingData with its fetch sent, then done.
#[test]
fn a_held_write_fetches_its_data_only_when_released() {
    let h = Harness::new(&[limited(5)], 32, false);
    let reads = until_held(&h, 0);
    h.capsule(write_fetched(500, 0, 1), &[]);
    assert!(h.states().contains(&(500, ReqKind::Held)));
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let tag = loop {
        let sent = h.sent();
        if let Some(t) = sent.iter().find_map(|s| match s {
            Sent::Fetch { cid: 500, tag, .. } => Some(*tag),
            _ => None,
        }) {
            break t;
        }
        assert!(
            std::time::Instant::now() < until,
            "the held write never asked for its data"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    assert!(h.states().contains(&(500, ReqKind::AwaitingData)));
    assert!(h.data(tag, 500, &[7; 512]));
    let sent = h.sent();
    assert!(
        sent.iter().any(|s| completed(s, 500, Status::SUCCESS)),
        "{sent:?} after reads {reads:?}"
    );
}

/// Abort of a held command ends it at once, before it ever runs.
#[test]
fn abort_of_a_held_command_ends_it_before_it_runs() {
    let h = Harness::new(&[limited(5)], 32, false);
    let cids = until_held(&h, 0);
    let last = *cids.last().unwrap_or_else(|| unreachable!());
    h.sent();
    assert_eq!(h.on(move |q, r, id| q.abort_pending(r, id, last)), Some(true));
    assert_eq!(statuses(&h.sent()), vec![(last, Status::ABORT_REQUESTED)]);
    assert!(!h.states().iter().any(|(c, _)| *c == last));
}

// ------------------------------------------------------------------ fused and Copy

/// The two commands of a fused Compare and Write as commands `cid` and `cid + 1`, their data
/// in the capsule.
fn caw(cid: u16, slba: u64, nlb: u32) -> (Sqe, Sqe) {
    let (first, second) = sqe::compare_and_write(1, slba, nlb);
    (cmd(first, cid, nlb * 512, true), cmd(second, cid + 1, nlb * 512, true))
}

/// (SCT, SC) of a status.
fn code(s: Status) -> (u8, u8) {
    (s.sct(), s.sc())
}

/// A fused Compare and Write: the first waits for its second (Parked); equal, both succeed
/// and the write lands; a miscompare is Compare Failure and Failed Fused Command, nothing
/// written (`tests/fused.rs` over NVMe/TCP).
#[test]
fn fused_compare_and_write_writes_when_equal_and_fails_both_when_not() {
    let h = Harness::new(&[ram(1, 1024)], 32, false);
    let (old, new) = (pattern(1, 4096), pattern(2, 4096));
    h.capsule(write_in_capsule(1, 8, 8), &old);
    h.sent();
    let (first, second) = caw(10, 8, 8);
    h.capsule(first, &old);
    assert!(h.sent().is_empty(), "the first waits for its second");
    assert_eq!(h.states(), vec![(10, ReqKind::Parked)]);
    h.capsule(second, &new);
    // The pair runs under its range lock, in steps the reactor runs.
    assert_eq!(
        statuses(&h.wait_sent(2)),
        vec![(10, Status::SUCCESS), (11, Status::SUCCESS)]
    );
    assert!(h.states().is_empty());
    assert_eq!(read_back(&h, 2, 8, 8), new);
    let (first, second) = caw(20, 8, 8);
    h.capsule(first, &old);
    h.capsule(second, &pattern(3, 4096));
    let s = statuses(&h.wait_sent(2));
    assert_eq!(
        s.iter().map(|(c, s)| (*c, code(*s))).collect::<Vec<_>>(),
        vec![(20, (2, 0x85)), (21, (0, 0x09))]
    );
    assert_eq!(read_back(&h, 3, 8, 8), new, "a miscompare wrote nothing");
}

/// A second without its first, and a first followed by a plain command, are Missing Fused
/// Command; the plain command runs.
#[test]
fn broken_fused_pairs_are_missing_their_partner() {
    let h = Harness::new(&[ram(1, 1024)], 32, false);
    let (first, second) = caw(30, 40, 1);
    h.capsule(second, &[9; 512]);
    assert_eq!(
        statuses(&h.sent())
            .iter()
            .map(|(c, s)| (*c, code(*s)))
            .collect::<Vec<_>>(),
        vec![(31, (0, 0x0A))]
    );
    h.capsule(first, &[0; 512]);
    h.capsule(read(32, 40, 1), &[]);
    let s = statuses(&h.sent());
    assert_eq!(
        s.iter().map(|(c, s)| (*c, code(*s))).collect::<Vec<_>>(),
        vec![(30, (0, 0x0A)), (32, (0, 0))]
    );
    assert!(h.states().is_empty());
}

/// A write to blocks a fused pair on a device holds waits for them (Parked), then runs.
#[test]
fn a_write_to_blocks_a_fused_pair_holds_is_parked_until_the_pair_ends() {
    let h = Harness::new(&[sim(1, 1024, 300_000.0)], 32, false);
    let (first, second) = caw(40, 0, 8);
    h.capsule(first, &[0; 4096]);
    h.capsule(second, &pattern(4, 4096));
    h.capsule(write_in_capsule(42, 4, 1), &[6; 512]);
    let states = h.states();
    assert!(states.contains(&(42, ReqKind::Parked)), "{states:?}");
    let sent = h.wait_sent(3);
    let s = statuses(&sent);
    assert_eq!(s.len(), 3, "{sent:?}");
    assert!(s.iter().all(|(_, st)| *st == Status::SUCCESS), "{s:?}");
    assert_eq!(
        s.last().map(|(c, _)| *c),
        Some(42),
        "the parked write ran after the pair"
    );
    assert!(h.states().is_empty());
}

/// Copy of two ranges, its descriptors in the capsule: the blocks land at the destination.
#[test]
fn copy_moves_its_ranges_to_the_destination() {
    use pollux_host::sqe::CopyRange;
    let h = Harness::new(&[ram(1, 1024)], 32, false);
    let (a, b) = (pattern(4, 1024), pattern(5, 1536));
    h.capsule(write_in_capsule(1, 100, 2), &a);
    h.capsule(write_in_capsule(2, 300, 3), &b);
    h.sent();
    let ranges = [CopyRange { slba: 100, nlb: 2 }, CopyRange { slba: 300, nlb: 3 }];
    let data = CopyRange::data(&ranges);
    h.capsule(cmd(sqe::copy(1, 500, 2, false), 3, data.len() as u32, true), &data);
    let sent = h.wait_sent(1);
    assert_eq!(statuses(&sent), vec![(3, Status::SUCCESS)]);
    assert!(h.states().is_empty());
    let mut want = a;
    want.extend_from_slice(&b);
    assert_eq!(read_back(&h, 4, 500, 5), want);
}

/// Wait until command `cid`'s request is in state `k`.
fn wait_state(h: &Harness, cid: u16, k: ReqKind) {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !h.states().contains(&(cid, k)) {
        assert!(std::time::Instant::now() < until, "{cid} never {k:?}: {:?}", h.states());
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// Held, then Submitted at its device when released, then done.
#[test]
fn a_held_read_of_a_device_is_submitted_when_released() {
    let ns = sim(1, 1024, 300_000.0);
    ns.qos.set(&pollux_conf::Qos {
        iops: Some(5),
        ..Default::default()
    });
    let h = Harness::new(&[ns], 32, false);
    let cids = until_held(&h, 0);
    let last = *cids.last().unwrap_or_else(|| unreachable!());
    wait_state(&h, last, ReqKind::Submitted);
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut done = Vec::new();
    while !done.contains(&last) {
        assert!(std::time::Instant::now() < until, "never completed: {done:?}");
        done.extend(statuses(&h.sent()).into_iter().map(|(c, _)| c));
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(done, cids, "in arrival order");
}

/// The first of a fused pair whose data is fetched: AwaitingData, then Parked for its
/// second once its data came; the pair then runs.
#[test]
fn a_fused_first_with_fetched_data_is_parked_once_its_data_came() {
    let h = Harness::new(&[ram(1, 1024)], 32, false);
    let (first, second) = sqe::compare_and_write(1, 8, 1);
    h.capsule(cmd(first, 50, 512, false), &[]);
    let (tag, _) = fetch_of(&h.sent(), 50);
    assert_eq!(h.states(), vec![(50, ReqKind::AwaitingData)]);
    assert!(h.data(tag, 50, &[0; 512]));
    assert_eq!(h.states(), vec![(50, ReqKind::Parked)]);
    h.capsule(cmd(second, 51, 512, true), &[3; 512]);
    assert_eq!(
        statuses(&h.wait_sent(2)),
        vec![(50, Status::SUCCESS), (51, Status::SUCCESS)]
    );
    assert!(h.states().is_empty());
    assert_eq!(read_back(&h, 52, 8, 1), vec![3; 512]);
}
