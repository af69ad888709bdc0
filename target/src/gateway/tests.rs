//! The group's decisions against an in-memory cluster with versioned objects and a
//! blocklist, on a clock of the test's own.
#![allow(clippy::unwrap_used)]

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::time::{Duration, Instant};

use pollux_conf::AnaState::{Inaccessible, NonOptimized, Optimized};

use super::state::{Errno, GroupStore, Member, Outcome, Standing};

/// One cluster: objects with versions, the blocklist, whether it answers.
#[derive(Default)]
struct Cluster {
    objects: BTreeMap<String, (Vec<u8>, u64)>,
    next_version: u64,
    blocklist: BTreeSet<String>,
    down: bool,
}

/// One member's client of the cluster: its address.
struct FakeStore {
    cluster: Rc<RefCell<Cluster>>,
    addr: String,
}

impl FakeStore {
    fn check(&self) -> Result<(), Errno> {
        let c = self.cluster.borrow();
        if c.down {
            return Err(-libc::ETIMEDOUT);
        }
        if c.blocklist.contains(&self.addr) {
            return Err(-super::state::EBLOCKLISTED);
        }
        Ok(())
    }

    fn put(&self, oid: &str, data: &[u8], version: Option<u64>) -> Result<Option<u64>, Errno> {
        self.check()?;
        let mut c = self.cluster.borrow_mut();
        let current = c.objects.get(oid).map(|(_, v)| *v);
        let ok = match version {
            Some(0) => true,
            None => current.is_none(),
            Some(v) => current == Some(v),
        };
        if !ok {
            return Ok(None);
        }
        c.next_version += 1;
        let v = c.next_version;
        c.objects.insert(oid.to_owned(), (data.to_vec(), v));
        Ok(Some(v))
    }
}

impl GroupStore for FakeStore {
    fn read_group(&self) -> Result<Option<(Vec<u8>, u64)>, Errno> {
        self.check()?;
        Ok(self.cluster.borrow().objects.get("group").cloned())
    }

    fn write_group(&self, data: &[u8], version: Option<u64>) -> Result<Option<u64>, Errno> {
        self.put("group", data, version)
    }

    fn beat(&self, name: &str, data: &[u8]) -> Result<(), Errno> {
        self.put(&format!("beat.{name}"), data, Some(0)).map(|_| ())
    }

    fn beat_version(&self, name: &str) -> Result<Option<u64>, Errno> {
        self.check()?;
        Ok(self
            .cluster
            .borrow()
            .objects
            .get(&format!("beat.{name}"))
            .map(|(_, v)| *v))
    }

    fn blocklist(&self, addr: &str, _expiry_s: u32) -> Result<(), Errno> {
        self.check()?;
        self.cluster.borrow_mut().blocklist.insert(addr.to_owned());
        Ok(())
    }

    fn wait_for_latest_osdmap(&self) -> Result<(), Errno> {
        self.check()
    }

    fn own_addrs(&self) -> Vec<String> {
        vec![self.addr.clone()]
    }
}

fn conf(name: &str, groups: &[u32]) -> pollux_conf::Gateway {
    pollux_conf::Gateway {
        group: "g".into(),
        name: name.into(),
        ana_groups: groups.to_vec(),
        heartbeat_ms: 100,
        grace_ms: 300,
        blocklist_expiry_s: 3600,
        failback_delay_ms: 1000,
        cluster: pollux_conf::RbdBackend {
            pool: "rbd".into(),
            image: String::new(),
            rados_namespace: None,
            ceph_conf: "/etc/ceph/ceph.conf".into(),
            user: "admin".into(),
            keyring: None,
            write_cache: false,
            op_timeout_s: 1,
            gateway_group: None,
            take_over_group: false,
        },
        key_file: None,
    }
}

struct Node {
    member: Member,
    store: FakeStore,
    last: Outcome,
}

impl Node {
    fn new(cluster: &Rc<RefCell<Cluster>>, name: &str, groups: &[u32], incarnation: u64) -> Self {
        Self {
            member: Member::new(conf(name, groups), incarnation, vec![format!("{name}:4420")]),
            store: FakeStore {
                cluster: cluster.clone(),
                addr: format!("v2:{name}:0/{incarnation}"),
            },
            last: Outcome::default(),
        }
    }

    fn tick(&mut self, now: Instant) {
        if let Ok(o) = self.member.tick(&self.store, now) {
            self.last = o;
        }
    }

    fn state(&self, g: u32) -> Option<pollux_conf::AnaState> {
        self.last.overlay.get(&g).copied()
    }
}

/// Run `nodes` (those `up`) for `ms` milliseconds of heartbeats from `t`.
fn run(nodes: &mut [&mut Node], up: &[bool], t: &mut Instant, ms: u64) {
    for _ in 0..ms / 100 {
        *t += Duration::from_millis(100);
        for (n, &u) in nodes.iter_mut().zip(up) {
            if u {
                n.tick(*t);
            }
        }
    }
}

#[test]
fn a_silent_member_is_fenced_once_and_its_groups_taken_by_the_least_loaded_survivor() {
    let cluster = Rc::new(RefCell::new(Cluster::default()));
    let mut a = Node::new(&cluster, "a", &[1], 11);
    let mut b = Node::new(&cluster, "b", &[2, 4], 12);
    let mut c = Node::new(&cluster, "c", &[3], 13);
    let mut t = Instant::now();
    run(&mut [&mut a, &mut b, &mut c], &[true; 3], &mut t, 1000);
    assert_eq!(
        (a.state(1), b.state(2), c.state(3)),
        (Some(Optimized), Some(Optimized), Some(Optimized))
    );
    assert!(cluster.borrow().blocklist.is_empty(), "nobody fenced while all beat");

    // `a` stops (kill -9): within the grace and a few heartbeats, it is fenced exactly once,
    // its address blocklisted, and `c` (one group, against b's two) reports group 1 optimized.
    run(&mut [&mut a, &mut b, &mut c], &[false, true, true], &mut t, 800);
    let g: super::state::Group = serde_json::from_slice(&cluster.borrow().objects["group"].0).unwrap();
    let ra = &g.members["a"];
    assert_eq!(
        (ra.standing, ra.blocklisted, ra.taken_by.as_deref()),
        (Standing::Fenced, true, Some("c"))
    );
    assert_eq!(cluster.borrow().blocklist, BTreeSet::from(["v2:a:0/11".to_owned()]));
    assert_eq!(
        c.state(1),
        Some(Optimized),
        "the taker reports the fenced member's group optimized"
    );
    assert_eq!(b.state(1), None, "the other survivor leaves it as its conf says");

    // `a` runs again (it was only paused): its client is blocklisted, it knows it is
    // fenced and reports its group inaccessible, and writes nothing.
    a.tick(t);
    assert!(a.last.fenced);
    assert_eq!(a.state(1), Some(Inaccessible));

    // Back as a new incarnation (a new client): it rejoins, holds its group non-optimized
    // while `c` serves it, and gets it back after the failback delay.
    let mut a2 = Node::new(&cluster, "a", &[1], 21);
    run(&mut [&mut a2, &mut b, &mut c], &[true; 3], &mut t, 500);
    assert_eq!((a2.state(1), c.state(1)), (Some(NonOptimized), Some(Optimized)));
    run(&mut [&mut a2, &mut b, &mut c], &[true; 3], &mut t, 1500);
    assert_eq!(a2.state(1), Some(Optimized), "failback");
    assert_eq!(c.state(1), None, "the taker gave the group back");
    assert_eq!(cluster.borrow().blocklist.len(), 1, "no one else fenced");
}

#[test]
fn a_cluster_outage_or_a_paused_observer_fences_nobody() {
    let cluster = Rc::new(RefCell::new(Cluster::default()));
    let mut a = Node::new(&cluster, "a", &[1], 1);
    let mut b = Node::new(&cluster, "b", &[2], 2);
    let mut t = Instant::now();
    run(&mut [&mut a, &mut b], &[true; 2], &mut t, 500);
    // The cluster stops answering for longer than the grace: nobody can beat, nobody fences.
    cluster.borrow_mut().down = true;
    run(&mut [&mut a, &mut b], &[true; 2], &mut t, 2000);
    cluster.borrow_mut().down = false;
    run(&mut [&mut a, &mut b], &[true; 2], &mut t, 1000);
    assert!(
        cluster.borrow().blocklist.is_empty(),
        "an outage is no member's silence"
    );
    // `b` itself is paused for longer than the grace: on resuming, the silence it did not
    // watch is no evidence against `a`.
    t += Duration::from_secs(5);
    b.tick(t);
    a.tick(t);
    run(&mut [&mut a, &mut b], &[true; 2], &mut t, 500);
    assert!(cluster.borrow().blocklist.is_empty(), "a paused observer fences nobody");
}

#[test]
fn a_member_restarted_within_the_grace_fences_its_previous_incarnation_itself() {
    let cluster = Rc::new(RefCell::new(Cluster::default()));
    let mut a = Node::new(&cluster, "a", &[1], 1);
    let mut b = Node::new(&cluster, "b", &[2], 2);
    let mut t = Instant::now();
    run(&mut [&mut a, &mut b], &[true; 2], &mut t, 500);
    let mut a2 = Node::new(&cluster, "a", &[1], 3);
    run(&mut [&mut a2, &mut b], &[true; 2], &mut t, 500);
    assert_eq!(
        cluster.borrow().blocklist,
        BTreeSet::from(["v2:a:0/1".to_owned()]),
        "the old incarnation's locks go at once"
    );
    assert_eq!(a2.state(1), Some(Optimized));
    let g: super::state::Group = serde_json::from_slice(&cluster.borrow().objects["group"].0).unwrap();
    assert_eq!(g.members["a"].standing, Standing::Alive);
}

#[test]
fn a_group_object_of_a_newer_format_is_refused() {
    let cluster = Rc::new(RefCell::new(Cluster::default()));
    cluster
        .borrow_mut()
        .objects
        .insert("group".into(), (br#"{"format": 9, "members": {}}"#.to_vec(), 1));
    let mut a = Node::new(&cluster, "a", &[1], 1);
    let r = a.member.tick(&a.store, Instant::now());
    assert_eq!(r, Err(-libc::EPROTO));
    assert_eq!(cluster.borrow().objects["group"].1, 1, "nothing written over it");
}

#[test]
fn two_members_silent_at_once_leave_every_group_with_the_survivor() {
    let cluster = Rc::new(RefCell::new(Cluster::default()));
    let mut a = Node::new(&cluster, "a", &[1], 1);
    let mut b = Node::new(&cluster, "b", &[2], 2);
    let mut c = Node::new(&cluster, "c", &[3], 3);
    let mut t = Instant::now();
    run(&mut [&mut a, &mut b, &mut c], &[true; 3], &mut t, 500);
    run(&mut [&mut a, &mut b, &mut c], &[false, false, true], &mut t, 1000);
    let g: super::state::Group = serde_json::from_slice(&cluster.borrow().objects["group"].0).unwrap();
    for n in ["a", "b"] {
        let r = &g.members[n];
        assert_eq!(
            (r.standing, r.blocklisted, r.taken_by.as_deref()),
            (Standing::Fenced, true, Some("c")),
            "{n}"
        );
    }
    assert_eq!(
        (c.state(1), c.state(2), c.state(3)),
        (Some(Optimized), Some(Optimized), Some(Optimized))
    );
}

#[test]
fn a_taker_that_dies_passes_what_it_took_to_the_next_survivor() {
    let cluster = Rc::new(RefCell::new(Cluster::default()));
    let mut a = Node::new(&cluster, "a", &[1], 1);
    let mut b = Node::new(&cluster, "b", &[2], 2);
    let mut c = Node::new(&cluster, "c", &[3, 4], 3);
    let mut t = Instant::now();
    run(&mut [&mut a, &mut b, &mut c], &[true; 3], &mut t, 500);
    run(&mut [&mut a, &mut b, &mut c], &[false, true, true], &mut t, 1000);
    assert_eq!(b.state(1), Some(Optimized), "b (one group) took a's");
    run(&mut [&mut a, &mut b, &mut c], &[false, false, true], &mut t, 1000);
    let g: super::state::Group = serde_json::from_slice(&cluster.borrow().objects["group"].0).unwrap();
    assert_eq!(
        g.members["a"].taken_by.as_deref(),
        Some("c"),
        "a's groups moved on with b's"
    );
    assert_eq!((c.state(1), c.state(2)), (Some(Optimized), Some(Optimized)));
}

#[test]
fn a_rejoining_member_whose_addresses_change_stays_rejoining() {
    // A hot upgrade's next process goes on as the same incarnation with new client
    // addresses: it registers them, and keeps waiting for the failback.
    let cluster = Rc::new(RefCell::new(Cluster::default()));
    let mut a = Node::new(&cluster, "a", &[1], 1);
    let mut b = Node::new(&cluster, "b", &[2], 2);
    let mut t = Instant::now();
    run(&mut [&mut a, &mut b], &[true; 2], &mut t, 500);
    run(&mut [&mut a, &mut b], &[false, true], &mut t, 1000);
    let mut a2 = Node::new(&cluster, "a", &[1], 3);
    run(&mut [&mut a2, &mut b], &[true; 2], &mut t, 300);
    a2.store.addr = "v2:a:0/33".into();
    run(&mut [&mut a2, &mut b], &[true; 2], &mut t, 300);
    let g: super::state::Group = serde_json::from_slice(&cluster.borrow().objects["group"].0).unwrap();
    let r = &g.members["a"];
    assert_eq!(r.addrs, vec!["v2:a:0/33".to_owned()]);
    assert_eq!((r.standing, r.taken_by.as_deref()), (Standing::Rejoining, Some("b")));
    assert_eq!((a2.state(1), b.state(1)), (Some(NonOptimized), Some(Optimized)));
}
