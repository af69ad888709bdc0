//! Reservations' tests: the state machine command by command, the state file, the cell.

use std::fs;
use std::os::unix::fs::PermissionsExt;

use pollux_nvme::spec::Status;
use pollux_nvme::spec::resv::{Access, AcquireAction, Cptpl, RegisterAction, ReleaseAction, ResvType, notice};

use super::file::{load, store};
use super::state::{conflict, invalid};
use super::*;

const A: HostId = [0xA; 16];
const B: HostId = [0xB; 16];
const C: HostId = [0xC; 16];

fn reg(s: &mut ResvState, h: &HostId, key: u64) -> Result<Effects, Status> {
    s.apply(
        h,
        &ResvOp::Register {
            action: RegisterAction::Register,
            iekey: false,
            cptpl: Cptpl::NoChange,
            crkey: 0,
            nrkey: key,
        },
        false,
    )
}

fn acq(s: &mut ResvState, h: &HostId, action: AcquireAction, t: u8, crkey: u64, prkey: u64) -> Result<Effects, Status> {
    s.apply(
        h,
        &ResvOp::Acquire {
            action,
            iekey: false,
            rtype: ResvType::from_code(t),
            crkey,
            prkey,
        },
        false,
    )
}

fn rel(s: &mut ResvState, h: &HostId, action: ReleaseAction, t: u8, crkey: u64) -> Result<Effects, Status> {
    s.apply(
        h,
        &ResvOp::Release {
            action,
            iekey: false,
            rtype: t,
            crkey,
        },
        false,
    )
}

#[test]
fn register_unregister_replace_and_their_keys() {
    let mut s = ResvState::default();
    assert!(reg(&mut s, &A, 1).is_ok());
    assert!(reg(&mut s, &A, 1).is_ok(), "the same key again");
    assert_eq!(reg(&mut s, &A, 2), Err(conflict()), "another key");
    let replace = |crkey, iekey| ResvOp::Register {
        action: RegisterAction::Replace,
        iekey,
        cptpl: Cptpl::NoChange,
        crkey,
        nrkey: 9,
    };
    assert_eq!(s.apply(&A, &replace(5, false), false), Err(conflict()));
    assert!(s.apply(&A, &replace(5, true), false).is_ok(), "IEKEY");
    assert_eq!(s.registrant(&A).map(|r| r.key), Some(9));
    assert_eq!(s.apply(&B, &replace(0, true), false), Err(conflict()), "not registered");
    let gen_before = s.generation;
    let unreg = ResvOp::Register {
        action: RegisterAction::Unregister,
        iekey: false,
        cptpl: Cptpl::NoChange,
        crkey: 9,
        nrkey: 0,
    };
    assert!(s.apply(&A, &unreg, false).is_ok());
    assert_eq!(s.generation, gen_before + 1);
    assert!(s.registrants.is_empty());
    // PTPL only where the namespace can keep it.
    let ptpl = ResvOp::Register {
        action: RegisterAction::Register,
        iekey: false,
        cptpl: Cptpl::Set,
        crkey: 0,
        nrkey: 3,
    };
    assert_eq!(s.apply(&A, &ptpl, false), Err(invalid()));
    assert!(s.registrants.is_empty(), "nothing changed");
    assert!(s.apply(&A, &ptpl, true).is_ok());
    assert!(s.ptpl);
}

#[test]
fn write_exclusive_lets_others_read_only_and_release_reopens() {
    let mut s = ResvState::default();
    reg(&mut s, &A, 1).ok();
    reg(&mut s, &B, 2).ok();
    assert_eq!(
        acq(&mut s, &A, AcquireAction::Acquire, 1, 7, 0),
        Err(conflict()),
        "wrong key"
    );
    assert_eq!(
        acq(&mut s, &C, AcquireAction::Acquire, 1, 0, 0),
        Err(conflict()),
        "not registered"
    );
    assert!(acq(&mut s, &A, AcquireAction::Acquire, 1, 1, 0).is_ok());
    assert!(
        acq(&mut s, &A, AcquireAction::Acquire, 1, 1, 0).is_ok(),
        "again: no change"
    );
    assert_eq!(
        acq(&mut s, &A, AcquireAction::Acquire, 2, 1, 0),
        Err(conflict()),
        "another type"
    );
    assert_eq!(acq(&mut s, &B, AcquireAction::Acquire, 1, 2, 0), Err(conflict()));
    assert!(s.allows(&A, Access::Write));
    assert!(s.allows(&B, Access::Read) && !s.allows(&B, Access::Write));
    assert!(s.allows(&C, Access::Read) && !s.allows(&C, Access::Write));
    // A non-holder's release changes nothing; the holder's with the wrong type is invalid.
    assert!(rel(&mut s, &B, ReleaseAction::Release, 1, 2).is_ok());
    assert!(s.holder.is_some());
    assert_eq!(rel(&mut s, &A, ReleaseAction::Release, 2, 1), Err(invalid()));
    assert_eq!(
        rel(&mut s, &A, ReleaseAction::Release, 1, 5),
        Err(conflict()),
        "wrong key"
    );
    let fx = rel(&mut s, &A, ReleaseAction::Release, 1, 1);
    assert_eq!(fx, Ok(Effects::default()), "type 1: no notices");
    assert!(s.holder.is_none() && s.allows(&C, Access::Write));
}

#[test]
fn registrants_only_types_and_their_release_notices() {
    let mut s = ResvState::default();
    reg(&mut s, &A, 1).ok();
    reg(&mut s, &B, 2).ok();
    assert!(acq(&mut s, &A, AcquireAction::Acquire, 4, 1, 0).is_ok());
    assert!(s.allows(&B, Access::Write) && s.allows(&B, Access::Read));
    assert!(!s.allows(&C, Access::Read));
    let fx = rel(&mut s, &A, ReleaseAction::Release, 4, 1);
    assert_eq!(fx.map(|f| f.notices), Ok(vec![(B, notice::RESERVATION_RELEASED)]));
    // Unregistering the holder of a type-3 reservation releases it, with notices.
    assert!(acq(&mut s, &A, AcquireAction::Acquire, 3, 1, 0).is_ok());
    let unreg = ResvOp::Register {
        action: RegisterAction::Unregister,
        iekey: true,
        cptpl: Cptpl::NoChange,
        crkey: 0,
        nrkey: 0,
    };
    let fx = s.apply(&A, &unreg, false);
    assert_eq!(fx.map(|f| f.notices), Ok(vec![(B, notice::RESERVATION_RELEASED)]));
    assert!(s.holder.is_none());
}

#[test]
fn all_registrants_types_outlive_their_acquirer() {
    let mut s = ResvState::default();
    reg(&mut s, &A, 1).ok();
    reg(&mut s, &B, 2).ok();
    assert!(acq(&mut s, &A, AcquireAction::Acquire, 6, 1, 0).is_ok());
    assert!(s.holds(&B), "every registrant holds it");
    assert!(
        acq(&mut s, &B, AcquireAction::Acquire, 6, 2, 0).is_ok(),
        "B holds it already"
    );
    assert!(!s.allows(&C, Access::Read));
    let unreg = |k| ResvOp::Register {
        action: RegisterAction::Unregister,
        iekey: false,
        cptpl: Cptpl::NoChange,
        crkey: k,
        nrkey: 0,
    };
    assert!(s.apply(&A, &unreg(1), false).is_ok());
    assert_eq!(s.holder.map(|h| h.rtype.code()), Some(6), "B still holds it");
    assert!(s.apply(&B, &unreg(2), false).is_ok());
    assert!(s.holder.is_none(), "gone with the last registrant");
    // Any registrant's release releases it.
    reg(&mut s, &A, 1).ok();
    reg(&mut s, &B, 2).ok();
    acq(&mut s, &A, AcquireAction::Acquire, 5, 1, 0).ok();
    let fx = rel(&mut s, &B, ReleaseAction::Release, 5, 2);
    assert_eq!(fx.map(|f| f.notices), Ok(vec![(A, notice::RESERVATION_RELEASED)]));
    assert!(s.holder.is_none());
}

#[test]
fn preempt_moves_the_reservation_and_removes_the_preempted() {
    let mut s = ResvState::default();
    reg(&mut s, &A, 1).ok();
    reg(&mut s, &B, 2).ok();
    reg(&mut s, &C, 3).ok();
    acq(&mut s, &A, AcquireAction::Acquire, 1, 1, 0).ok();
    let g = s.generation;
    // B preempts A (its key) and asks for abort: A is out, notified, its commands aborted.
    let fx = acq(&mut s, &B, AcquireAction::PreemptAndAbort, 2, 2, 1).unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(
        s.holder,
        Some(Holder {
            hostid: B,
            rtype: ResvType::ExclusiveAccess
        })
    );
    assert!(s.registrant(&A).is_none());
    assert_eq!(fx.aborted, vec![A]);
    assert!(fx.notices.contains(&(A, notice::REGISTRATION_PREEMPTED)));
    assert!(fx.notices.contains(&(C, notice::RESERVATION_RELEASED)), "type changed");
    assert_eq!(s.generation, g + 1);
    assert!(!s.allows(&A, Access::Read) && !s.allows(&C, Access::Read));
    // Preempting a key no one has conflicts; key 0 against a single holder is invalid.
    assert_eq!(acq(&mut s, &C, AcquireAction::Preempt, 2, 3, 99), Err(conflict()));
    assert_eq!(acq(&mut s, &C, AcquireAction::Preempt, 2, 3, 0), Err(invalid()));
    // A key other than the holder's removes only those registrants.
    reg(&mut s, &A, 7).ok();
    let fx = acq(&mut s, &C, AcquireAction::Preempt, 2, 3, 7);
    assert_eq!(fx.map(|f| f.notices), Ok(vec![(A, notice::REGISTRATION_PREEMPTED)]));
    assert_eq!(s.holder.map(|h| h.hostid), Some(B));
    // Without a reservation, preempt removes by key.
    let mut t = ResvState::default();
    reg(&mut t, &A, 1).ok();
    reg(&mut t, &B, 2).ok();
    assert!(acq(&mut t, &B, AcquireAction::Preempt, 1, 2, 1).is_ok());
    assert!(t.registrant(&A).is_none() && t.holder.is_none());
}

#[test]
fn clear_removes_everything_and_tells_the_others() {
    let mut s = ResvState::default();
    reg(&mut s, &A, 1).ok();
    reg(&mut s, &B, 2).ok();
    acq(&mut s, &B, AcquireAction::Acquire, 2, 2, 0).ok();
    assert_eq!(
        rel(&mut s, &A, ReleaseAction::Clear, 0, 9),
        Err(conflict()),
        "wrong key"
    );
    let fx = rel(&mut s, &A, ReleaseAction::Clear, 0, 1);
    assert_eq!(fx.map(|f| f.notices), Ok(vec![(B, notice::RESERVATION_PREEMPTED)]));
    assert!(s.registrants.is_empty() && s.holder.is_none());
}

#[test]
fn reserved_types_and_ignore_key_on_acquire_are_invalid() {
    let mut s = ResvState::default();
    reg(&mut s, &A, 1).ok();
    assert_eq!(acq(&mut s, &A, AcquireAction::Acquire, 0, 1, 0), Err(invalid()));
    assert_eq!(acq(&mut s, &A, AcquireAction::Acquire, 7, 1, 0), Err(invalid()));
    let iekey = ResvOp::Acquire {
        action: AcquireAction::Acquire,
        iekey: true,
        rtype: Some(ResvType::WriteExclusive),
        crkey: 1,
        prkey: 0,
    };
    assert_eq!(s.apply(&A, &iekey, false), Err(invalid()));
    assert!(s.holder.is_none());
}

#[test]
fn the_state_file_round_trips_and_a_bad_one_is_named() {
    let dir = std::env::temp_dir().join(format!("pollux-resv-{}", std::process::id()));
    fs::create_dir_all(&dir).ok();
    let path = state_file(&dir, &[1; 16]);
    let mut s = ResvState::default();
    reg(&mut s, &A, 1).ok();
    reg(&mut s, &B, u64::MAX).ok();
    acq(&mut s, &B, AcquireAction::Acquire, 3, u64::MAX, 0).ok();
    s.ptpl = true;
    store(&path, &s).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(load(&path).ok(), Some(s.clone()));
    let mode = fs::metadata(&path).map(|m| m.permissions().mode()).unwrap_or(0o777);
    assert_eq!(mode & 0o077, 0, "the keys are readable by others: {mode:o}");
    fs::write(&path, "{\"version\": 1, \"generation\": 3").ok();
    let err = load(&path).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains(&path.display().to_string()), "{err}");
    assert!(NsResv::open(Some(path.clone())).is_err());
    fs::remove_dir_all(&dir).ok();
}

#[test]
fn the_shared_cell_persists_before_it_publishes() {
    let dir = std::env::temp_dir().join(format!("pollux-resv-cell-{}", std::process::id()));
    fs::create_dir_all(&dir).ok();
    let path = state_file(&dir, &[2; 16]);
    let ns = NsResv::open(Some(path.clone())).unwrap_or_else(|e| panic!("{e}"));
    let register = ResvOp::Register {
        action: RegisterAction::Register,
        iekey: false,
        cptpl: Cptpl::Set,
        crkey: 0,
        nrkey: 5,
    };
    assert!(ns.change(&A, &register).is_ok());
    let acquire = ResvOp::Acquire {
        action: AcquireAction::Acquire,
        iekey: false,
        rtype: Some(ResvType::WriteExclusive),
        crkey: 5,
        prkey: 0,
    };
    assert!(ns.change(&A, &acquire).is_ok());
    assert_eq!(ns.check(&B, Access::Write), Err(conflict()));
    assert_eq!(ns.check(&B, Access::Read), Ok(()));
    // A restart finds it all.
    let again = NsResv::open(Some(path.clone())).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(again.state(), ns.state());
    assert_eq!(again.check(&B, Access::Write), Err(conflict()));
    // PTPL cleared: the file goes.
    assert!(ns.change(&A, &ResvOp::SetPtpl(false)).is_ok());
    assert!(!path.exists());
    // A directory that cannot be written: the change fails and nothing changes.
    let stuck = NsResv::open(Some(dir.join("missing").join("x.json"))).unwrap_or_else(|e| panic!("{e}"));
    let before = stuck.state();
    assert_eq!(stuck.change(&A, &register), Err(Status::INTERNAL_ERROR));
    assert_eq!(stuck.state(), before);
    fs::remove_dir_all(&dir).ok();
}
