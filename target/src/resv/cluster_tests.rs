//! The cluster-kept reservations' logic over an in-process object with the same contract as
//! the RADOS one (versioned read, version-asserted write, notify to every watch, watch
//! health): racing changes lose none, another gateway's change is installed and its effects
//! delivered before the acknowledgement, a lost or stale watch admits no I/O until caught
//! up. `target/tests/rbd_resv.rs` runs the same against a real Ceph cluster.
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use pollux_nvme::spec::Status;
use pollux_nvme::spec::resv::{Access, AcquireAction, Cptpl, RegisterAction, ResvType};

use super::cluster::UNCERTAIN_AFTER;
use super::*;

use crate::resv::cluster_fake::{Fake, Store};

fn gateway(store: &Arc<Store>) -> (NsResv, Arc<AtomicBool>, Arc<AtomicU64>) {
    let f = Fake::new(store);
    let (cut, age) = (f.cut.clone(), f.age.clone());
    (NsResv::clustered(Box::new(f)).unwrap(), cut, age)
}

fn register(key: u64, action: RegisterAction, crkey: u64) -> ResvOp {
    ResvOp::Register {
        action,
        iekey: false,
        cptpl: Cptpl::NoChange,
        crkey,
        nrkey: key,
    }
}

fn acquire(action: AcquireAction, crkey: u64, prkey: u64) -> ResvOp {
    ResvOp::Acquire {
        action,
        iekey: false,
        rtype: ResvType::from_code(1),
        crkey,
        prkey,
    }
}

/// Tend `ns` as the watcher would, collecting the effects delivered.
fn tend(ns: &NsResv) -> Vec<Effects> {
    let got = Mutex::new(Vec::new());
    ns.tend(&|fx| {
        got.lock().unwrap().push(fx);
        None
    });
    got.into_inner().unwrap()
}

const H1: HostId = [1; 16];
const H2: HostId = [2; 16];

#[test]
fn a_change_on_one_gateway_is_installed_on_the_other_with_its_effects_before_the_ack() {
    let store = Arc::new(Store::default());
    let (a, _, _) = gateway(&store);
    let (b, _, _) = gateway(&store);
    assert_eq!(a.kind(), "cluster");
    assert!(a.ptpl_capable());
    a.change(&H1, &register(0x1A, RegisterAction::Register, 0)).unwrap();
    a.change(&H1, &acquire(AcquireAction::Acquire, 0x1A, 0)).unwrap();
    // B has not looked yet: its copy is old, but a change through it reads the cluster's.
    assert_eq!(b.state().generation, 0);
    assert_eq!(
        b.change(&H2, &acquire(AcquireAction::Acquire, 0x2B, 0)),
        Err(Status::RESERVATION_CONFLICT.with_dnr()),
        "an unregistered host acquires a held reservation"
    );
    b.change(&H2, &register(0x2B, RegisterAction::Register, 0)).unwrap();
    assert_eq!(b.state().generation, 2);
    tend(&a);
    assert_eq!(a.state().generation, 2, "A installed B's change");
    assert_eq!(
        a.check(&H2, Access::Write),
        Err(Status::RESERVATION_CONFLICT.with_dnr())
    );
    assert_eq!(a.check(&H2, Access::Read), Ok(()));

    // A preempt and abort through B: A gets the preempted host's abort and notification,
    // and acknowledges after delivering them.
    let acks_before = store.acks.lock().unwrap().len();
    b.change(&H2, &acquire(AcquireAction::PreemptAndAbort, 0x2B, 0x1A))
        .unwrap();
    let fx = tend(&a);
    assert_eq!(fx.len(), 1);
    assert_eq!(fx[0].aborted, vec![H1]);
    assert!(fx[0].notices.iter().any(|(h, _)| *h == H1), "{:?}", fx[0].notices);
    assert_eq!(
        a.check(&H1, Access::Write),
        Err(Status::RESERVATION_CONFLICT.with_dnr())
    );
    assert!(store.acks.lock().unwrap().len() > acks_before, "A acknowledged");
    // B's own announcement comes back to B: installed already, acknowledged, nothing done.
    assert!(tend(&b).is_empty());
}

#[test]
fn racing_changes_from_two_gateways_lose_none() {
    for round in 0..20 {
        let store = Arc::new(Store::default());
        let gws: Vec<Arc<NsResv>> = (0..2).map(|_| Arc::new(gateway(&store).0)).collect();
        let threads: Vec<_> = (0..8u8)
            .map(|h| {
                let g = gws[usize::from(h) % 2].clone();
                std::thread::spawn(move || {
                    let host = [h + 1; 16];
                    let base = u64::from(h + 1) << 32;
                    g.change(&host, &register(base, RegisterAction::Register, 0)).unwrap();
                    for k in 0..10 {
                        g.change(&host, &register(base + k + 1, RegisterAction::Replace, base + k))
                            .unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let (bytes, _) = store.data.lock().unwrap().clone().unwrap();
        let doc: super::file::StateDoc = serde_json::from_slice(&bytes).unwrap();
        let s = super::file::from_doc(doc).unwrap();
        assert_eq!(s.generation, 88, "round {round}: every change counted once");
        assert_eq!(s.registrants.len(), 8);
        for r in &s.registrants {
            assert_eq!(r.key, (u64::from(r.hostid[0]) << 32) + 10, "round {round}");
        }
        assert_eq!(store.writes.load(Ordering::Relaxed), 89, "88 changes and the creation");
    }
}

#[test]
fn a_gateway_that_cannot_see_the_cluster_admits_nothing_until_it_catches_up() {
    let store = Arc::new(Store::default());
    let (a, a_cut, a_age) = gateway(&store);
    let (b, _, _) = gateway(&store);
    assert_eq!(a.check(&H1, Access::Write), Ok(()));

    // A stale watch: nothing admitted, not even where no reservation is held.
    a_age.store(UNCERTAIN_AFTER.as_millis() as u64 + 1, Ordering::Release);
    tend(&a);
    assert!(a.uncertain());
    assert_eq!(a.check(&H1, Access::Read), Err(Status::ANA_TRANSITION));
    assert!(!Status::ANA_TRANSITION.dnr(), "retryable");
    assert_eq!(a.report_state().err(), Some(Status::ANA_TRANSITION));

    // Meanwhile B takes a reservation (A misses the announcement: its watch is replaced
    // while it catches up, the cluster unreachable for it).
    a_cut.store(true, Ordering::Release);
    b.change(&H2, &register(0x2B, RegisterAction::Register, 0)).unwrap();
    b.change(&H2, &acquire(AcquireAction::Acquire, 0x2B, 0)).unwrap();
    a.cluster().unwrap().inbox.drain();
    a.cluster().unwrap().inbox.push(WatchEvent::Lost(-libc::ENOTCONN));
    tend(&a);
    assert!(a.uncertain(), "it cannot watch again while cut off");
    assert_eq!(
        a.change(&H1, &register(1, RegisterAction::Register, 0)),
        Err(Status::ANA_TRANSITION),
        "a change it cannot write is retryable"
    );

    // The cluster again: A watches, reads B's reservation, and admits by it.
    a_cut.store(false, Ordering::Release);
    a_age.store(0, Ordering::Release);
    *a.cluster().unwrap().last_try.lock().unwrap() = None;
    tend(&a);
    assert!(!a.uncertain());
    assert_eq!(
        a.check(&H1, Access::Write),
        Err(Status::RESERVATION_CONFLICT.with_dnr())
    );
    assert_eq!(a.check(&H1, Access::Read), Ok(()));
    assert_eq!(a.state().generation, 1);
}

#[test]
fn a_bad_announcement_or_object_is_not_installed() {
    let store = Arc::new(Store::default());
    let (a, _, _) = gateway(&store);
    let cookie = a.cluster().unwrap().object.cookie().unwrap();
    a.cluster().unwrap().inbox.push(WatchEvent::Notify {
        notify_id: 7,
        cookie,
        notifier: 0,
        payload: b"{not json".to_vec(),
    });
    tend(&a);
    assert!(
        store.acks.lock().unwrap().contains(&(7, cookie)),
        "acknowledged all the same"
    );
    // It could not tell what changed: it reads the object again, which is sound.
    *a.cluster().unwrap().last_try.lock().unwrap() = None;
    tend(&a);
    assert!(!a.uncertain());

    // An object that is not a reservation state refuses to open (never read as empty).
    *store.data.lock().unwrap() = Some((b"garbage".to_vec(), 9));
    let f = Fake::new(&store);
    let e = NsResv::clustered(Box::new(f)).unwrap_err().to_string();
    assert!(
        e.contains("fake/pollux.object") && e.contains("not a reservation state"),
        "{e}"
    );
}
