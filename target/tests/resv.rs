//! Persistent reservations (NVMe 2.0 §8.19) between hosts sharing a namespace, through the
//! host library: registration and keys, the access rules of each type on I/O, Reservation
//! Report (extended only), preempt and its notifications and event, preempt-and-abort with
//! I/O in flight (a fenced host's write never lands after the preempter's), persistence
//! through a restart with PTPL on a file namespace (and a corrupt state file refusing to
//! start), and bad input answered with the right status and nothing changed.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use pollux_conf::Config;
use pollux_host::{Controller, Data, Digests, sqe};
use pollux_nvme::spec::Status;
use pollux_target::{Options, Target};

const SUB: &str = "nqn.2026-11.io.pollux:shared";
const HOST_A: &str = "nqn.2014-08.org.nvmexpress:uuid:aaaaaaaa-0000-4000-8000-00000000000a";
const HOST_B: &str = "nqn.2014-08.org.nvmexpress:uuid:bbbbbbbb-0000-4000-8000-00000000000b";
const HOST_C: &str = "nqn.2014-08.org.nvmexpress:uuid:cccccccc-0000-4000-8000-00000000000c";

const REGISTER: u32 = 0;
const UNREGISTER: u32 = 1;
const ACQUIRE: u32 = 0;
const PREEMPT: u32 = 1;
const PREEMPT_ABORT: u32 = 2;
const RELEASE: u32 = 0;
const CLEAR: u32 = 1;
const WE: u8 = 1;
const EA: u8 = 2;

fn conf(backend: &str, state_dir: Option<&Path>) -> String {
    let dir = state_dir.map_or(String::new(), |d| format!("state_dir = \"{}\"\n", d.display()));
    format!(
        "{dir}{}",
        conf_with(
            "interrupt",
            "",
            SUB,
            &format!("[[subsystem.namespace]]\nnsid = 1\nblock_size = 512\nbackend = {backend}")
        )
    )
}

fn start_conf(text: &str) -> Target {
    Target::start(&Config::parse(text, "resv.toml").unwrap(), Options { pin: false }).unwrap()
}

fn host(t: &Target, nqn: &str) -> Controller {
    Controller::connect(addr(t), SUB, nqn, 1, 32, Digests::NONE).unwrap()
}

fn run(c: &mut Controller, s: pollux_nvme::spec::Sqe, d: Data) -> Status {
    c.io[0].exec(s, d).unwrap().status
}

fn sc(s: Status) -> (u8, u8) {
    (s.sct(), s.sc())
}

const CONFLICT: (u8, u8) = (0, 0x83);
const INVALID: (u8, u8) = (0, 0x02);
const OK: (u8, u8) = (0, 0);

fn register(c: &mut Controller, key: u64) -> Status {
    run(
        c,
        sqe::resv_register(1, REGISTER, false, 0),
        Data::ToCtrl(sqe::resv_keys(&[0, key])),
    )
}

fn acquire(c: &mut Controller, action: u32, rtype: u8, crkey: u64, prkey: u64) -> Status {
    run(
        c,
        sqe::resv_acquire(1, action, rtype),
        Data::ToCtrl(sqe::resv_keys(&[crkey, prkey])),
    )
}

fn release(c: &mut Controller, action: u32, rtype: u8, crkey: u64) -> Status {
    run(
        c,
        sqe::resv_release(1, action, rtype),
        Data::ToCtrl(sqe::resv_keys(&[crkey])),
    )
}

fn write(c: &mut Controller, lba: u64, fill: u8) -> Status {
    run(c, sqe::write(1, lba, 1), Data::ToCtrl(vec![fill; 512]))
}

fn read(c: &mut Controller, lba: u64) -> (Status, Vec<u8>) {
    let done = c.io[0]
        .exec(sqe::read(1, lba, 1), Data::FromCtrl(vec![0; 512]))
        .unwrap();
    (done.status, done.buf)
}

/// A registrant as reported: (host identifier, key, holds the reservation).
type Reg = ([u8; 16], u64, bool);

/// Reservation Report, extended: (generation, type, registrants, PTPLS).
fn report(c: &mut Controller) -> (u32, u8, Vec<Reg>, bool) {
    let done = c.io[0]
        .exec(sqe::resv_report(1, 4096, true), Data::FromCtrl(vec![0; 4096]))
        .unwrap();
    assert!(done.is_success(), "report: {:?}", done.status);
    let b = done.buf;
    let n = u16::from_le_bytes([b[5], b[6]]) as usize;
    let regs = (0..n)
        .map(|i| {
            let e = &b[64 + i * 64..128 + i * 64];
            assert_eq!(&e[0..2], &[0xFF, 0xFF], "dynamic controller id");
            let mut id = [0u8; 16];
            id.copy_from_slice(&e[16..32]);
            (id, u64::from_le_bytes(e[8..16].try_into().unwrap()), e[2] & 1 == 1)
        })
        .collect();
    (
        u32::from_le_bytes(b[0..4].try_into().unwrap()),
        b[4],
        regs,
        b[9] & 1 == 1,
    )
}

fn reservation_log(c: &mut Controller) -> (u64, u8, u8, u32) {
    let p = c.admin.get_log_page(0x80, 0, 64).unwrap();
    (
        u64::from_le_bytes(p[0..8].try_into().unwrap()),
        p[8],
        p[9],
        u32::from_le_bytes(p[12..16].try_into().unwrap()),
    )
}

fn ram() -> String {
    "{ ram = { size = \"1MiB\" } }".into()
}

#[test]
fn write_exclusive_and_exclusive_access_between_two_hosts() {
    let t = start_conf(&conf(&ram(), None));
    let (mut a, mut b, mut c) = (host(&t, HOST_A), host(&t, HOST_B), host(&t, HOST_C));
    let id = c.admin.identify(1, 0).unwrap();
    assert_eq!(
        u16::from_le_bytes([id[520], id[521]]) & (1 << 5),
        1 << 5,
        "ONCS: reservations"
    );
    let ns = c.admin.identify(0, 1).unwrap();
    assert_eq!(ns[31], 0xFE, "RESCAP: every type and IEKEY; no PTPL on RAM");

    // No reservation: everyone reads and writes, registered or not.
    assert_eq!(sc(register(&mut a, 0xA1)), OK);
    assert_eq!(sc(register(&mut b, 0xB1)), OK);
    assert_eq!(sc(write(&mut c, 1, 0xC0)), OK);

    // A takes Write Exclusive: B (registered) and C (not) read, neither writes.
    assert_eq!(sc(acquire(&mut a, ACQUIRE, WE, 0xA1, 0)), OK);
    assert_eq!(sc(acquire(&mut b, ACQUIRE, WE, 0xB1, 0)), CONFLICT, "held by A");
    for (who, h) in [("B", &mut b), ("C", &mut c)] {
        assert_eq!(sc(write(h, 1, 0x11)), CONFLICT, "{who} writes under WE");
        assert_eq!(
            sc(run(h, sqe::write_zeroes(1, 1, 1), Data::None)),
            CONFLICT,
            "{who}: write zeroes"
        );
        assert_eq!(
            sc(run(h, sqe::flush(1), Data::None)),
            CONFLICT,
            "{who}: flush is in the write group"
        );
        let copy = Data::ToCtrl(sqe::CopyRange::data(&[sqe::CopyRange { slba: 1, nlb: 1 }]));
        assert_eq!(
            sc(run(h, sqe::copy(1, 3, 1, false), copy)),
            CONFLICT,
            "{who}: copy writes"
        );
        let (cmp, w) = sqe::compare_and_write(1, 1, 1);
        let first = h.io[0].submit(cmp, Data::ToCtrl(vec![0xC0; 512]), 0).unwrap();
        let second = h.io[0].submit(w, Data::ToCtrl(vec![0x12; 512]), 0).unwrap();
        let mut got = Vec::new();
        while got.len() < 2 {
            h.io[0]
                .poll_completions(Some(WAIT), |d| got.push((d.cid, sc(d.status))))
                .unwrap();
        }
        assert!(
            got.iter().all(|&(cid, s)| (cid == first || cid == second) && s != OK),
            "{who}: a fused compare and write under WE: {got:?}"
        );
        let (s, data) = read(h, 1);
        assert_eq!((sc(s), data[0]), (OK, 0xC0), "{who} reads under WE");
    }
    assert_eq!(sc(write(&mut a, 1, 0xA0)), OK, "the holder writes");

    // The report: both registrants, A the holder; without EDS: Host Identifier Inconsistent.
    let (generation, rtype, regs, ptpls) = report(&mut c);
    assert_eq!((rtype, regs.len(), ptpls), (WE, 2, false));
    assert!(generation >= 2);
    let a_id = pollux_host::hostid_from_nqn(HOST_A);
    assert!(regs.contains(&(a_id, 0xA1, true)), "{regs:?}");
    assert!(regs.iter().any(|r| r.1 == 0xB1 && !r.2));
    let s = run(&mut c, sqe::resv_report(1, 4096, false), Data::FromCtrl(vec![0; 4096]));
    assert_eq!(
        sc(s),
        (0, 0x18),
        "EDS=0: 64-bit host identifiers do not exist over fabrics"
    );

    // `pollux ctl subsystems` shows it: type, holder, registrants, never the keys.
    let cfg = Config::parse(&conf(&ram(), None), "resv.toml").unwrap();
    let ctx = pollux_target::control::rpc::Ctx::new(&t, &cfg.reactors);
    let views: Vec<pollux_target::control::view::SubsystemView> =
        serde_json::from_value(ctx.call("subsystems", &serde_json::Value::Null).unwrap()).unwrap();
    let text = pollux_target::control::format::format_subsystems(&views);
    let a_text = uuid::Uuid::from_bytes(a_id).hyphenated().to_string();
    assert!(
        text.contains(&format!(
            "namespace 1 reservation: write-exclusive held by host {a_text}; 2 registrant(s)"
        )),
        "{text}"
    );

    // A second controller of host A shares its registration and its reservation.
    let mut a2 = host(&t, HOST_A);
    assert_eq!(sc(write(&mut a2, 2, 0xA2)), OK, "A's other controller holds it too");

    // Exclusive Access: B may not even read. A changes its type by preempting itself.
    assert_eq!(sc(acquire(&mut a, PREEMPT, EA, 0xA1, 0xA1)), OK);
    let (s, _) = read(&mut b, 1);
    assert_eq!(sc(s), CONFLICT, "B reads under EA");
    assert_eq!(report(&mut c).1, EA);

    // Release with the wrong type is invalid; with the right one everyone may write again.
    assert_eq!(sc(release(&mut a, RELEASE, WE, 0xA1)), INVALID);
    assert_eq!(sc(release(&mut a, RELEASE, EA, 0xA1)), OK);
    assert_eq!(sc(write(&mut c, 1, 0xC1)), OK);
    for h in [a, a2, b, c] {
        h.shutdown().unwrap();
    }
    t.shutdown().unwrap();
}

#[test]
fn preempt_moves_the_reservation_and_notifies_the_preempted() {
    let t = start_conf(&conf(&ram(), None));
    let (mut a, mut b) = (host(&t, HOST_A), host(&t, HOST_B));
    register(&mut a, 1);
    register(&mut b, 2);
    assert_eq!(sc(acquire(&mut a, ACQUIRE, EA, 1, 0)), OK);
    let aer = a.admin.submit(sqe::async_event_request(), Data::None, 5).unwrap();
    let gen_before = report(&mut b).0;

    // B preempts A's key: B holds it, A is no longer registered and may not read.
    assert_eq!(sc(acquire(&mut b, PREEMPT, WE, 2, 1)), OK);
    let (generation, rtype, regs, _) = report(&mut b);
    assert_eq!((generation, rtype, regs.len()), (gen_before + 1, WE, 1));
    assert_eq!(sc(write(&mut a, 0, 1)), CONFLICT);
    assert_eq!(sc(read(&mut a, 0).0), OK, "WE: anyone reads");
    assert_eq!(sc(acquire(&mut a, ACQUIRE, WE, 1, 0)), CONFLICT, "A's key is gone");

    // A's controller gets the event (type 6, log page 80h) and the log: Registration
    // Preempted on namespace 1; then an empty page.
    let mut dw0 = None;
    let t0 = Instant::now();
    while dw0.is_none() && t0.elapsed() < WAIT {
        a.admin
            .poll_completions(Some(Duration::from_millis(100)), |d| {
                if d.cid == aer {
                    dw0 = Some(d.dw0);
                }
            })
            .unwrap();
    }
    assert_eq!(dw0, Some(0x0080_0006));
    let (count, typ, left, nsid) = reservation_log(&mut a);
    assert_eq!((typ, left, nsid), (1, 0, 1));
    assert!(count >= 1);
    assert_eq!(reservation_log(&mut a).1, 0, "read once");
    // B's controller heard nothing: it preempted.
    assert_eq!(reservation_log(&mut b).1, 0);

    // The notification mask silences a type: A registers again, B preempts it again.
    let mut set = sqe::set_features(0x82, 1 << 1);
    set.nsid.set(1);
    assert!(a.admin.exec(set, Data::None).unwrap().is_success());
    let mut get = sqe::get_features(0x82, 0, 0);
    get.nsid.set(1);
    assert_eq!(a.admin.exec(get, Data::None).unwrap().dw0, 1 << 1);
    register(&mut a, 3);
    assert_eq!(sc(acquire(&mut b, PREEMPT, WE, 2, 3)), OK, "B removes A's new key");
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(reservation_log(&mut a).1, 0, "masked");

    // Clear: everything goes; the others hear Reservation Preempted.
    register(&mut a, 4);
    let mut unmask = sqe::set_features(0x82, 0);
    unmask.nsid.set(u32::MAX);
    assert!(a.admin.exec(unmask, Data::None).unwrap().is_success());
    assert_eq!(sc(release(&mut b, CLEAR, 0, 2)), OK);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(reservation_log(&mut a).1, 3, "Reservation Preempted");
    assert_eq!(report(&mut b).2.len(), 0);
    assert_eq!(sc(write(&mut a, 0, 9)), OK);
    a.shutdown().unwrap();
    b.shutdown().unwrap();
    t.shutdown().unwrap();
}

#[test]
fn preempt_and_abort_fences_the_preempted_hosts_writes_in_flight() {
    // Slow writes (20 ms): A's are still in flight when B preempts and aborts.
    let sim = "{ sim = { size = \"1MiB\", read = { median_us = 100.0, sigma = 0.1 }, write = { median_us = 20000.0, sigma = 0.1 } } }";
    let t = start_conf(&conf(sim, None));
    let (mut a, mut b) = (host(&t, HOST_A), host(&t, HOST_B));
    register(&mut a, 1);
    register(&mut b, 2);
    assert_eq!(sc(acquire(&mut a, ACQUIRE, WE, 1, 0)), OK);
    let mut cids = Vec::new();
    for i in 0..8 {
        cids.push(a.io[0].submit_write(1, 7, 1, vec![0xAA; 512], i).unwrap());
    }
    // Get A's commands onto the target.
    a.io[0]
        .poll_completions(Some(Duration::from_millis(2)), |_| {})
        .unwrap();
    let t0 = Instant::now();
    assert_eq!(sc(acquire(&mut b, PREEMPT_ABORT, WE, 2, 1)), OK);
    let fenced_in = t0.elapsed();
    // Now B's write is the last to land: none of A's was still running.
    assert_eq!(sc(write(&mut b, 7, 0xBB)), OK);
    let (mut done, mut aborted) = (0, 0);
    let t1 = Instant::now();
    while done < cids.len() && t1.elapsed() < WAIT {
        a.io[0]
            .poll_completions(Some(Duration::from_millis(100)), |d| {
                let s = sc(d.status);
                assert!(s == OK || s == (0, 0x07), "A's write ended {s:?}");
                aborted += usize::from(s == (0, 0x07));
                done += 1;
            })
            .unwrap();
    }
    assert_eq!(done, cids.len(), "every write of A completed");
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        read(&mut b, 7).1[0],
        0xBB,
        "a fenced write landed after the preempter's"
    );
    assert_eq!(sc(write(&mut a, 7, 0xAA)), CONFLICT);
    // Each of A's writes (20 ms) was either aborted by the fence or waited for.
    assert!(
        aborted > 0 || fenced_in >= Duration::from_millis(10),
        "neither aborted nor waited for: fenced in {fenced_in:?}"
    );
    assert!(fenced_in < Duration::from_secs(5), "fenced in {fenced_in:?}");
    a.shutdown().unwrap();
    b.shutdown().unwrap();
    t.shutdown().unwrap();
}

fn temp_dir(what: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("pollux-resv-{what}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn a_ptpl_reservation_survives_a_restart_and_a_corrupt_state_is_an_error() {
    let dir = temp_dir("ptpl");
    let state = dir.join("state");
    let img = dir.join("ns.img");
    let text = conf(
        &format!(
            "{{ file = {{ path = \"{}\", size = \"1MiB\", direct = false }} }}",
            img.display()
        ),
        Some(&state),
    );
    let t = start_conf(&text);
    let (mut a, mut b) = (host(&t, HOST_A), host(&t, HOST_B));
    assert_eq!(
        a.admin.identify(0, 1).unwrap()[31],
        0xFF,
        "RESCAP: PTPL on a file namespace"
    );
    // A registers with CPTPL = 11b (persist), B without; A takes Exclusive Access.
    let s = run(
        &mut a,
        sqe::resv_register(1, REGISTER, false, 3),
        Data::ToCtrl(sqe::resv_keys(&[0, 0xAA])),
    );
    assert_eq!(sc(s), OK);
    register(&mut b, 0xBB);
    assert_eq!(sc(acquire(&mut a, ACQUIRE, EA, 0xAA, 0)), OK);
    let mut get = sqe::get_features(0x83, 0, 0);
    get.nsid.set(1);
    assert_eq!(a.admin.exec(get, Data::None).unwrap().dw0 & 1, 1, "PTPL set");
    let before = report(&mut b);
    assert!(before.3, "PTPLS");
    a.shutdown().unwrap();
    b.shutdown().unwrap();
    t.shutdown().unwrap();

    // Restarted: the same registrants, the same reservation, B still barred.
    let t = start_conf(&text);
    let mut b = host(&t, HOST_B);
    assert_eq!(report(&mut b), before);
    assert_eq!(sc(write(&mut b, 0, 1)), CONFLICT);
    let mut a = host(&t, HOST_A);
    assert_eq!(sc(write(&mut a, 0, 1)), OK);
    // PTPL cleared by Set Features: a restart forgets.
    let mut set = sqe::set_features(0x83, 0);
    set.nsid.set(1);
    assert!(a.admin.exec(set, Data::None).unwrap().is_success());
    a.shutdown().unwrap();
    b.shutdown().unwrap();
    t.shutdown().unwrap();
    let t = start_conf(&text);
    let mut b = host(&t, HOST_B);
    assert_eq!(report(&mut b).2.len(), 0, "not persistent: gone");
    // Set again, then the file is damaged: the target refuses to start and names it.
    register(&mut b, 0xBB);
    let mut set = sqe::set_features(0x83, 1);
    set.nsid.set(1);
    assert!(b.admin.exec(set, Data::None).unwrap().is_success());
    b.shutdown().unwrap();
    t.shutdown().unwrap();
    let file = std::fs::read_dir(&state).unwrap().next().unwrap().unwrap().path();
    std::fs::write(&file, "{ \"version\": 1, \"generation\": ").unwrap();
    let err = Target::start(&Config::parse(&text, "resv.toml").unwrap(), Options { pin: false })
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains(&file.display().to_string()), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_reservation_commands_get_their_status_and_change_nothing() {
    let t = start_conf(&conf(&ram(), None));
    let (mut a, mut b) = (host(&t, HOST_A), host(&t, HOST_B));
    // Reserved actions, CPTPL 01b, reserved types: Invalid Field.
    let keys = || Data::ToCtrl(sqe::resv_keys(&[0, 5]));
    assert_eq!(sc(run(&mut a, sqe::resv_register(1, 3, false, 0), keys())), INVALID);
    assert_eq!(
        sc(run(&mut a, sqe::resv_register(1, REGISTER, false, 1), keys())),
        INVALID
    );
    assert_eq!(
        sc(run(&mut a, sqe::resv_register(1, REGISTER, false, 3), keys())),
        INVALID,
        "no PTPL on RAM"
    );
    register(&mut a, 5);
    assert_eq!(sc(acquire(&mut a, 3, WE, 5, 0)), INVALID, "acquire action 011b");
    assert_eq!(sc(acquire(&mut a, ACQUIRE, 0, 5, 0)), INVALID, "type 0");
    assert_eq!(sc(acquire(&mut a, ACQUIRE, 7, 5, 0)), INVALID, "type 7");
    assert_eq!(sc(release(&mut a, 2, WE, 5)), INVALID, "release action 010b");
    // Wrong keys, unregistered hosts: Reservation Conflict.
    assert_eq!(sc(acquire(&mut a, ACQUIRE, WE, 6, 0)), CONFLICT);
    assert_eq!(sc(acquire(&mut b, ACQUIRE, WE, 0, 0)), CONFLICT, "B is not registered");
    assert_eq!(sc(register(&mut a, 6)), CONFLICT, "registered with another key");
    let unreg = run(
        &mut a,
        sqe::resv_register(1, UNREGISTER, false, 0),
        Data::ToCtrl(sqe::resv_keys(&[9, 0])),
    );
    assert_eq!(sc(unreg), CONFLICT);
    assert_eq!(sc(release(&mut b, RELEASE, WE, 0)), CONFLICT);
    // A short data buffer, a report too small or of another namespace.
    let s = run(&mut a, sqe::resv_acquire(1, ACQUIRE, WE), Data::ToCtrl(vec![0; 8]));
    assert_eq!(sc(s), (0, 0x0F), "keys cut short");
    let s = run(&mut a, sqe::resv_report(1, 32, true), Data::FromCtrl(vec![0; 32]));
    assert_eq!(sc(s), INVALID, "smaller than the header");
    let s = run(&mut a, sqe::resv_report(2, 4096, true), Data::FromCtrl(vec![0; 4096]));
    assert_eq!(sc(s), (0, 0x0B));
    // Nothing changed: A registered with 5, no reservation, B writes.
    let (_, rtype, regs, _) = report(&mut b);
    assert_eq!((rtype, regs.len(), regs[0].1), (0, 1, 5));
    assert_eq!(sc(write(&mut b, 0, 1)), OK);
    // Reservation Persistence on a namespace that cannot persist: Invalid Field; FFFFFFFFh:
    // no value to read.
    let mut set = sqe::set_features(0x83, 1);
    set.nsid.set(1);
    assert_eq!(sc(a.admin.exec(set, Data::None).unwrap().status), INVALID);
    let mut get = sqe::get_features(0x83, 0, 0);
    get.nsid.set(u32::MAX);
    assert_eq!(sc(a.admin.exec(get, Data::None).unwrap().status), (0, 0x0B));
    a.shutdown().unwrap();
    b.shutdown().unwrap();
    t.shutdown().unwrap();
}

#[test]
fn preempt_and_abort_also_fences_writes_parked_behind_a_fused_pair() {
    // Slow writes: B's compare and write holds its range while A's write to it waits.
    let sim = "{ sim = { size = \"1MiB\", read = { median_us = 5000.0, sigma = 0.1 }, write = { median_us = 20000.0, sigma = 0.1 } } }";
    let t = start_conf(&conf(sim, None));
    let (mut a, mut b) = (host(&t, HOST_A), host(&t, HOST_B));
    register(&mut a, 1);
    register(&mut b, 2);
    assert_eq!(sc(write(&mut b, 7, 0x00)), OK);
    let (cmp, w) = sqe::compare_and_write(1, 7, 1);
    let caw = [
        b.io[0].submit(cmp, Data::ToCtrl(vec![0x00; 512]), 0).unwrap(),
        b.io[0].submit(w, Data::ToCtrl(vec![0xCA; 512]), 0).unwrap(),
    ];
    b.io[0]
        .poll_completions(Some(Duration::from_millis(2)), |_| {})
        .unwrap();
    let parked = a.io[0].submit_write(1, 7, 1, vec![0xAA; 512], 0).unwrap();
    a.io[0]
        .poll_completions(Some(Duration::from_millis(2)), |_| {})
        .unwrap();
    // B preempts A's key (no reservation is held: the registrants of the key go) and aborts.
    let pa = b.io[0].submit(
        sqe::resv_acquire(1, PREEMPT_ABORT, WE),
        Data::ToCtrl(sqe::resv_keys(&[2, 1])),
        0,
    );
    let pa = pa.unwrap();
    let mut b_done = Vec::new();
    let t0 = Instant::now();
    while b_done.len() < 3 && t0.elapsed() < WAIT {
        for q in b.io.iter_mut() {
            q.poll_completions(Some(Duration::from_millis(20)), |d| b_done.push((d.cid, sc(d.status))))
                .unwrap();
        }
    }
    assert!(b_done.contains(&(pa, OK)), "{b_done:?}");
    assert!(
        caw.iter().all(|c| b_done.contains(&(*c, OK))),
        "the pair compared equal: {b_done:?}"
    );
    let mut a_status = None;
    let t0 = Instant::now();
    while a_status.is_none() && t0.elapsed() < WAIT {
        a.io[0]
            .poll_completions(Some(Duration::from_millis(20)), |d| {
                if d.cid == parked {
                    a_status = Some(sc(d.status));
                }
            })
            .unwrap();
    }
    let a_status = a_status.unwrap_or_else(|| panic!("A's write never completed"));
    assert!(a_status == OK || a_status == (0, 0x07), "A's write: {a_status:?}");
    // The pair compared equal, so A's write had not landed before it; after it, A's write
    // (fenced by the preempt) must not land either: the block holds the pair's data.
    std::thread::sleep(Duration::from_millis(60));
    assert_eq!(
        read(&mut b, 7).1[0],
        0xCA,
        "A's write landed after the preempt (A: {a_status:?})"
    );
    a.shutdown().unwrap();
    b.shutdown().unwrap();
    t.shutdown().unwrap();
}
