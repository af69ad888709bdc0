//! Host masking per namespace (a namespace's `hosts`, `ns_add_host`, `ns_remove_host`)
//! against an in-process target with two reactors: a namespace masked from a host is an
//! inactive NSID to that host's controllers (NVMe 2.0 §3.2.1.5, §5.17.2.1), attaching and
//! detaching at run time raise the Namespace Attribute Changed event and the Changed
//! Namespace List (NVMe 2.0 §5.16.1.5) of the controllers concerned only, and a detach
//! with I/O in flight loses nothing.
#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::{addr, pattern, start_with_ctx};
use pollux_host::{Controller, Data, Digests, HostError, sqe};
use pollux_nvme::spec::Status;
use pollux_target::Target;
use pollux_target::control::rpc::{Ctx, INVALID_PARAMS, RpcError};
use serde_json::{Value, json};

const NQN: &str = "nqn.2026-11.io.pollux:tenants";
const A: &str = "nqn.2014-08.org.nvmexpress:uuid:0c0c0c0c-0000-4000-8000-00000000000a";
const B: &str = "nqn.2014-08.org.nvmexpress:uuid:0c0c0c0c-0000-4000-8000-00000000000b";
/// A host the subsystem does not admit.
const STRANGER: &str = "nqn.2014-08.org.nvmexpress:uuid:0c0c0c0c-0000-4000-8000-00000000000c";
/// Invalid Namespace or Format (SCT 0h, SC 0Bh): what an NSID with no namespace gets.
const INACTIVE: (u8, u8) = (0, 0x0B);
/// AER completion dword 0: Notice, Namespace Attribute Changed, log page 04h (NVMe 2.0 §5.2).
const NS_CHANGED: u32 = 0x0004_0002;

/// Two reactors; a subsystem admitting hosts A and B; namespace 1 attached to `ns1_hosts`
/// (16 MiB), namespace 2 to every host (8 MiB).
fn conf(ns1_hosts: &str) -> String {
    format!(
        r#"
[reactors]
cores = [0, 1]
mode = "interrupt"

[[listener]]
address = "127.0.0.1:0"

[[subsystem]]
nqn = "{NQN}"
hosts = ["{A}", "{B}"]

[[subsystem.namespace]]
nsid = 1
hosts = {ns1_hosts}
backend = {{ ram = {{ size = "16MiB" }} }}

[[subsystem.namespace]]
nsid = 2
backend = {{ ram = {{ size = "8MiB" }} }}
"#
    )
}

/// A controller of `host` with `io` I/O queues of 64 entries, namespace attribute notices
/// enabled (as the Linux host does at connect).
fn connect(t: &Target, host: &str, io: u16) -> Controller {
    let mut c = Controller::connect(addr(t), NQN, host, io, 64, Digests::NONE).unwrap();
    c.admin.set_features(0x0B, 1 << 8).unwrap();
    c
}

fn code(r: Result<(), HostError>) -> (u8, u8) {
    match r {
        Err(e) => e
            .status()
            .map(|s| (s.sct(), s.sc()))
            .unwrap_or_else(|| panic!("not a status: {e}")),
        Ok(()) => panic!("succeeded"),
    }
}

fn dnr(r: Result<(), HostError>) -> bool {
    r.unwrap_err().status().is_some_and(|s| s.dnr())
}

fn call(ctx: &Ctx, method: &str, nsid: u32, host: &str) -> Result<Value, RpcError> {
    ctx.call(method, &json!({"nqn": NQN, "nsid": nsid, "host": host}))
}

/// The dword 0 of the AER `cid` if it completes within `within`.
fn aer_within(c: &mut Controller, cid: u16, within: Duration) -> Option<u32> {
    let mut got = None;
    let t0 = Instant::now();
    while got.is_none() && t0.elapsed() < within {
        c.admin
            .poll_completions(Some(Duration::from_millis(50)), |done| {
                if done.cid == cid {
                    assert_eq!(done.status, Status::SUCCESS);
                    got = Some(done.dw0);
                }
            })
            .unwrap();
    }
    got
}

/// The Changed Namespace List (LID 04h), read without RAE (which clears it).
fn changed_list(c: &mut Controller) -> Vec<u32> {
    c.admin
        .get_log_page(0x04, 0, 4096)
        .unwrap()
        .chunks_exact(4)
        .map(|d| u32::from_le_bytes([d[0], d[1], d[2], d[3]]))
        .take_while(|&n| n != 0)
        .collect()
}

#[test]
fn a_masked_namespace_is_attached_to_its_hosts_only() {
    let (t, _ctx) = start_with_ctx(&conf(&format!("[\"{A}\"]")));
    let mut a = connect(&t, A, 1);
    let mut b = connect(&t, B, 1);

    // A has it among its active namespaces and does I/O on it.
    assert_eq!(a.admin.active_namespaces(0).unwrap(), vec![1, 2]);
    let data = pattern(1, 0, 8 * 512);
    a.io[0].write(1, 0, 8, &data).unwrap();
    let mut back = vec![0u8; data.len()];
    a.io[0].read(1, 0, 8, &mut back).unwrap();
    assert!(back == data);
    assert_eq!(a.admin.identify_namespace(1).unwrap().nsze, 32768);

    // B does not see it: not listed, a zero-filled Identify Namespace, like NSID 7 which
    // has no namespace at all.
    assert_eq!(b.admin.active_namespaces(0).unwrap(), vec![2]);
    let id = b.admin.identify(0x00, 1).unwrap();
    assert!(
        id.iter().all(|&x| x == 0),
        "Identify Namespace of a masked NSID is zero-filled"
    );
    assert_eq!(id, b.admin.identify(0x00, 7).unwrap());
    // The descriptor list and the namespace's SMART page: as for NSID 7.
    let desc = b
        .admin
        .exec(sqe::identify(0x03, 1), Data::FromCtrl(vec![0; 4096]))
        .unwrap();
    let none = b
        .admin
        .exec(sqe::identify(0x03, 7), Data::FromCtrl(vec![0; 4096]))
        .unwrap();
    assert_eq!(desc.status, none.status);
    assert_eq!((desc.status.sct(), desc.status.sc()), INACTIVE);
    let mut smart_of_1 = sqe::get_log_page(0x02, 512, 0, true);
    smart_of_1.nsid.set(1);
    let smart = b.admin.exec(smart_of_1, Data::FromCtrl(vec![0; 512])).unwrap();
    assert_eq!((smart.status.sct(), smart.status.sc()), INACTIVE);

    // Its I/O fails with the status of an NSID that does not exist, DNR set.
    let mut buf = vec![0u8; 4096];
    assert_eq!(code(b.io[0].read(1, 0, 8, &mut buf)), INACTIVE);
    assert_eq!(code(b.io[0].read(7, 0, 8, &mut buf)), INACTIVE);
    assert!(dnr(b.io[0].read(1, 0, 8, &mut buf)));
    assert_eq!(code(b.io[0].write(1, 0, 8, &[0xEE; 4096])), INACTIVE);
    assert_eq!(code(b.io[0].write_zeroes(1, 0, 8)), INACTIVE);
    assert_eq!(code(b.io[0].flush(1)), INACTIVE);
    // Nothing B tried reached A's data.
    a.io[0].read(1, 0, 8, &mut back).unwrap();
    assert!(back == data, "B's refused writes changed nothing");
    // Both share namespace 2.
    b.io[0].write(2, 0, 8, &data).unwrap();
    a.io[0].read(2, 0, 8, &mut back).unwrap();
    assert!(back == data);
    t.shutdown().unwrap();
}

#[test]
fn attaching_at_run_time_tells_the_host_and_serves_it() {
    let (t, ctx) = start_with_ctx(&conf(&format!("[\"{A}\"]")));
    let mut a = connect(&t, A, 1);
    let mut b = connect(&t, B, 2);
    let data = pattern(2, 100, 16 * 512);
    a.io[0].write(1, 100, 16, &data).unwrap();
    let aer_a = a.admin.submit(sqe::async_event_request(), Data::None, 1).unwrap();
    let aer_b = b.admin.submit(sqe::async_event_request(), Data::None, 1).unwrap();
    a.admin.send_pending().unwrap();
    b.admin.send_pending().unwrap();
    let mut buf = vec![0u8; data.len()];
    assert_eq!(code(b.io[1].read(1, 100, 16, &mut buf)), INACTIVE);

    let r = call(&ctx, "ns_add_host", 1, B).unwrap();
    assert_eq!(r["hosts_changed"], json!([[NQN, 1]]), "{r}");
    assert_eq!(r["added_namespaces"], json!([]), "nothing reopened: {r}");
    assert_eq!(r["removed_namespaces"], json!([]), "{r}");

    // B's controller hears of namespace 1, then has it, with A's data, on every queue.
    assert_eq!(aer_within(&mut b, aer_b, Duration::from_secs(5)), Some(NS_CHANGED));
    assert_eq!(changed_list(&mut b), vec![1]);
    assert_eq!(b.admin.active_namespaces(0).unwrap(), vec![1, 2]);
    for q in 0..2 {
        b.io[q].read(1, 100, 16, &mut buf).unwrap();
        assert!(buf == data, "queue {q} reads A's data");
    }
    // A's view did not change: no event, an empty list.
    assert_eq!(aer_within(&mut a, aer_a, Duration::from_millis(300)), None);
    assert!(changed_list(&mut a).is_empty());

    // Saved as written: both hosts in the namespace's `hosts`.
    let running = t.running_config();
    assert!(running.contains(&format!("hosts = [\"{A}\", \"{B}\"]")), "{running}");
    t.shutdown().unwrap();
}

/// B has writes waiting for their data (R2T) and 4 MiB of reads waiting for it to read them
/// when it is detached: every one completes with its data, A finds B's writes, and B's next
/// commands fail as for an inactive NSID.
#[test]
fn detaching_with_io_in_flight_loses_nothing_and_refuses_what_follows() {
    const CHUNK: usize = 128 * 1024;
    const READS: u64 = 32;
    const WRITES: u64 = 16;
    let (t, ctx) = start_with_ctx(&conf(&format!("[\"{A}\", \"{B}\"]")));
    let mut a = connect(&t, A, 1);
    let mut b = connect(&t, B, 1);
    let nlb = (CHUNK / 512) as u32;
    let lba = |i: u64| i * u64::from(nlb);
    // Reads of what A wrote in the first half; writes of B's into the second.
    for i in 0..READS {
        a.io[0].write(1, lba(i), nlb, &pattern(3, lba(i), CHUNK)).unwrap();
    }
    let aer_a = a.admin.submit(sqe::async_event_request(), Data::None, 1).unwrap();
    let aer_b = b.admin.submit(sqe::async_event_request(), Data::None, 1).unwrap();
    a.admin.send_pending().unwrap();
    b.admin.send_pending().unwrap();

    // Writes first: larger than the in-capsule size, their data goes only once B answers
    // the target's R2Ts, which it does not until it polls (after the detach).
    for w in 0..WRITES {
        let at = lba(READS + w);
        b.io[0]
            .submit_write(1, at, nlb, pattern(4, at, CHUNK), 1000 + w)
            .unwrap();
    }
    for i in 0..READS {
        b.io[0].submit_read(1, lba(i), nlb, vec![0u8; CHUNK], i).unwrap();
    }
    b.io[0].send_pending().unwrap();
    std::thread::sleep(Duration::from_millis(100));

    let r = call(&ctx, "ns_remove_host", 1, B).unwrap();
    assert_eq!(r["hosts_changed"], json!([[NQN, 1]]), "{r}");

    let (mut reads, mut writes) = (0, 0);
    let t0 = Instant::now();
    while reads + writes < READS + WRITES && t0.elapsed() < Duration::from_secs(20) {
        b.io[0]
            .poll_completions(Some(Duration::from_millis(100)), |cpl| {
                assert!(cpl.is_success(), "command {} failed: {:?}", cpl.tag, cpl.status);
                if cpl.tag >= 1000 {
                    writes += 1;
                } else {
                    assert!(
                        cpl.buf == pattern(3, lba(cpl.tag), CHUNK),
                        "read {} returned other bytes",
                        cpl.tag
                    );
                    reads += 1;
                }
            })
            .unwrap();
    }
    assert_eq!((reads, writes), (READS, WRITES), "every command in flight completed");
    // B's writes are in the namespace: A reads them.
    let mut back = vec![0u8; CHUNK];
    for w in 0..WRITES {
        let at = lba(READS + w);
        a.io[0].read(1, at, nlb, &mut back).unwrap();
        assert!(back == pattern(4, at, CHUNK), "B's write {w} is there");
    }

    // The call returned once every queue had the change: B's next commands fail.
    assert_eq!(code(b.io[0].read(1, 0, 8, &mut back[..4096])), INACTIVE);
    assert_eq!(code(b.io[0].write(1, 0, 8, &[0x55; 4096])), INACTIVE);
    assert_eq!(aer_within(&mut b, aer_b, Duration::from_secs(5)), Some(NS_CHANGED));
    assert_eq!(changed_list(&mut b), vec![1]);
    assert_eq!(b.admin.active_namespaces(0).unwrap(), vec![2]);
    // A keeps it, untold, its data as it was.
    assert_eq!(aer_within(&mut a, aer_a, Duration::from_millis(300)), None);
    a.io[0].read(1, 0, 8, &mut back[..4096]).unwrap();
    assert!(back[..4096] == pattern(3, 0, CHUNK)[..4096]);

    // The last host gone: attached to no host (not back to every host).
    call(&ctx, "ns_remove_host", 1, A).unwrap();
    assert_eq!(aer_within(&mut a, aer_a, Duration::from_secs(5)), Some(NS_CHANGED));
    assert_eq!(a.admin.active_namespaces(0).unwrap(), vec![2]);
    assert_eq!(code(a.io[0].read(1, 0, 8, &mut back[..4096])), INACTIVE);
    let running = t.running_config();
    assert!(running.contains("hosts = []"), "{running}");
    // Attached again: the data is where it was.
    call(&ctx, "ns_add_host", 1, A).unwrap();
    a.io[0].read(1, 0, 8, &mut back[..4096]).unwrap();
    assert!(back[..4096] == pattern(3, 0, CHUNK)[..4096]);
    t.shutdown().unwrap();
}

#[test]
fn the_first_host_of_an_unmasked_namespace_masks_it_from_the_others() {
    let (t, ctx) = start_with_ctx(&conf("[]").replace("hosts = []\n", ""));
    let mut a = connect(&t, A, 1);
    let mut b = connect(&t, B, 1);
    assert_eq!(b.admin.active_namespaces(0).unwrap(), vec![1, 2]);
    let aer_b = b.admin.submit(sqe::async_event_request(), Data::None, 1).unwrap();
    b.admin.send_pending().unwrap();

    call(&ctx, "ns_add_host", 1, A).unwrap();
    assert_eq!(aer_within(&mut b, aer_b, Duration::from_secs(5)), Some(NS_CHANGED));
    assert_eq!(b.admin.active_namespaces(0).unwrap(), vec![2]);
    assert_eq!(a.admin.active_namespaces(0).unwrap(), vec![1, 2]);
    let mut buf = vec![0u8; 4096];
    assert_eq!(code(b.io[0].read(1, 0, 8, &mut buf)), INACTIVE);
    a.io[0].read(1, 0, 8, &mut buf).unwrap();

    // The subsystem stops admitting A: A's controller goes, and so does A from the
    // namespace's hosts (attached to no host now).
    ctx.call("remove_host", &json!({"nqn": NQN, "host": A})).unwrap();
    let running = t.running_config();
    assert!(running.contains("hosts = []"), "{running}");
    assert!(!running.contains(A), "{running}");
    t.shutdown().unwrap();
}

#[test]
fn bad_input_gets_a_clear_error_and_changes_nothing() {
    let (t, ctx) = start_with_ctx(&conf(&format!("[\"{A}\"]")));
    let before = t.running_config();
    let refused = |r: Result<Value, RpcError>, needles: &[&str]| {
        let e = r.expect_err("refused");
        assert_eq!(e.code, INVALID_PARAMS, "{e:?}");
        for n in needles {
            assert!(e.message.contains(n), "{:?} lacks {n:?}", e.message);
        }
    };
    refused(
        call(&ctx, "ns_add_host", 1, "not-an-nqn"),
        &["'host'", "not-an-nqn", "not a valid host NQN"],
    );
    refused(
        call(&ctx, "ns_add_host", 1, STRANGER),
        &[STRANGER, "does not admit", NQN],
    );
    refused(call(&ctx, "ns_add_host", 9, B), &["has no namespace 9"]);
    refused(call(&ctx, "ns_add_host", 1, A), &["already attached"]);
    refused(call(&ctx, "ns_remove_host", 1, B), &["is not attached to namespace 1"]);
    refused(call(&ctx, "ns_remove_host", 2, A), &["no hosts of its own"]);
    refused(
        ctx.call(
            "ns_add_host",
            &json!({"nqn": "nqn.2026-11.io.pollux:nope", "nsid": 1, "host": B}),
        ),
        &["no subsystem 'nqn.2026-11.io.pollux:nope'"],
    );
    refused(ctx.call("ns_add_host", &json!({"nqn": NQN, "host": B})), &["'nsid'"]);
    refused(ctx.call("ns_remove_host", &json!({"nqn": NQN, "nsid": 1})), &["'host'"]);
    assert_eq!(t.running_config(), before, "nothing changed");
    // A still sees it, B still does not.
    let mut a = connect(&t, A, 1);
    let mut b = connect(&t, B, 1);
    assert_eq!(a.admin.active_namespaces(0).unwrap(), vec![1, 2]);
    assert_eq!(b.admin.active_namespaces(0).unwrap(), vec![2]);
    t.shutdown().unwrap();
}

/// The call returns once every queue judges by the new hosts: a command sent right after a
/// detach returned fails, whichever of the controller's queues (on either reactor) takes
/// it, and one sent right after an attach succeeds.
#[test]
fn a_change_is_in_force_on_every_queue_when_the_call_returns() {
    let (t, ctx) = start_with_ctx(&conf(&format!("[\"{A}\", \"{B}\"]")));
    let mut b = connect(&t, B, 2);
    let mut buf = vec![0u8; 4096];
    for round in 0..20 {
        let q = round % 2;
        call(&ctx, "ns_remove_host", 1, B).unwrap();
        assert_eq!(
            code(b.io[q].read(1, 0, 8, &mut buf)),
            INACTIVE,
            "round {round}, queue {q}"
        );
        assert_eq!(code(b.io[1 - q].write(1, 0, 8, &[1; 4096])), INACTIVE, "round {round}");
        call(&ctx, "ns_add_host", 1, B).unwrap();
        b.io[q].read(1, 0, 8, &mut buf).unwrap();
        b.io[1 - q].write(1, 0, 8, &[1; 4096]).unwrap();
    }
    t.shutdown().unwrap();
}
