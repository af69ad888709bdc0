//! The group configuration's logic over an in-process object with the RADOS one's contract
//! (`resv::cluster_fake`) and gateways that are targets without reactors: a change on one
//! is applied by the others, racing changes all land and count once, a change that no longer
//! validates is refused whole, a future or malformed object applies nothing, an unreachable
//! cluster refuses changes, keys are sealed in the object and open only under the group's
//! key. `target/tests/group_config.rs` runs the same against a real Ceph cluster.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use pollux_conf::Config;
use pollux_nvme::auth::{DhchapKey, HashId};
use toml_edit::DocumentMut;

use super::*;
use crate::resv::cluster_fake::{Fake, Store};
use crate::subsystem::{build_snapshot, no_store_to_adopt};

/// The records beside the object.
#[derive(Clone, Default)]
struct FakeRecords(Arc<Mutex<HashMap<String, Vec<u8>>>>);

impl Records for FakeRecords {
    fn read(&self, oid: &str) -> Result<Option<Vec<u8>>, i32> {
        Ok(self.0.lock().unwrap().get(oid).cloned())
    }

    fn write(&self, oid: &str, data: &[u8]) -> Result<(), i32> {
        self.0.lock().unwrap().insert(oid.to_string(), data.to_vec());
        Ok(())
    }
}

struct Gw {
    svc: Service,
    shared: Arc<Shared>,
    cut: Arc<std::sync::atomic::AtomicBool>,
}

/// Gateway `name` of group `g`, on `store`, with group key material `key`.
fn gateway(name: &str, store: &Arc<Store>, records: &FakeRecords, key: u8) -> Gw {
    let text = format!("[reactors]\ncores = [0]\n[gateway]\ngroup = \"g\"\nname = \"{name}\"\npool = \"rbd\"\n");
    let cfg = Config::parse(&text, pollux_conf::EMBEDDED_ORIGIN).unwrap();
    let snap = build_snapshot(&cfg, 1, Vec::new(), no_store_to_adopt).unwrap();
    let shared = Arc::new(Shared::new(&cfg, 1, snap, std::time::Instant::now(), no_store_to_adopt));
    let fake = Fake::new(store);
    let cut = fake.cut.clone();
    let handed = Mutex::new(Some(fake));
    let (store2, records) = (store.clone(), records.clone());
    let connector: Connector = Box::new(move || {
        // The first connection is the fake made above (the test holds its `cut`); a
        // reconnection gets a new one.
        let obj = handed.lock().unwrap().take().unwrap_or_else(|| Fake::new(&store2));
        Ok(Conn {
            obj: Box::new(obj),
            records: Box::new(records.clone()),
        })
    });
    let key = Ok(Some(Arc::new(GroupKey::from_material(&[key; 32], "g"))));
    let svc = Service::new(
        cfg.gateway.as_ref().unwrap(),
        "fake/pollux.gateway.g.config".into(),
        connector,
        key,
        shared.clone(),
        Arc::from(Vec::<Remote>::new()),
    );
    Gw { svc, shared, cut }
}

fn add_subsystem(doc: &mut DocumentMut, nqn: &str, extra: &str) -> Result<(), GroupConfigError> {
    let t: DocumentMut = format!("nqn = \"{nqn}\"\nallow_any_host = true\n{extra}")
        .parse()
        .unwrap();
    let mut a = doc
        .remove("subsystem")
        .and_then(|i| i.into_array_of_tables().ok())
        .unwrap_or_default();
    a.push(t.as_table().clone());
    doc.insert("subsystem", toml_edit::Item::ArrayOfTables(a));
    Ok(())
}

fn served(g: &Gw) -> Vec<String> {
    g.shared
        .snapshot
        .load()
        .subsystems
        .iter()
        .map(|s| s.nqn.clone())
        .collect()
}

fn version(g: &Gw) -> u64 {
    g.shared.group.lock().unwrap().as_ref().unwrap().version
}

fn stored(store: &Store) -> Stored {
    serde_json::from_slice(&store.data.lock().unwrap().as_ref().unwrap().0).unwrap()
}

const S1: &str = "nqn.2026-12.io.pollux:g1";

#[test]
fn a_change_on_one_gateway_is_applied_by_the_others_in_their_own_slots() {
    let (store, records) = (Arc::new(Store::default()), FakeRecords::default());
    let (a, b) = (gateway("a", &store, &records, 7), gateway("b", &store, &records, 7));
    a.svc.sync();
    b.svc.sync();
    let (_, r) = a.svc.change("add_subsystem", |d| add_subsystem(d, S1, "")).unwrap();
    assert_eq!(r.version, 1);
    assert_eq!(
        served(&a),
        vec![S1.to_string()],
        "the writer applies its change before it answers"
    );
    assert!(served(&b).is_empty());
    b.svc.sync();
    assert_eq!(served(&b), vec![S1.to_string()]);
    assert_eq!(version(&b), 1);
    // Each its own controller IDs.
    let range = |g: &Gw| {
        let s = g.shared.snapshot.load();
        let s = s.subsystem(S1).unwrap();
        (*s.cntlids.start(), *s.cntlids.end())
    };
    assert_eq!(range(&a), pollux_conf::group::cntlid_range(0));
    assert_eq!(range(&b), pollux_conf::group::cntlid_range(1));
    // What each applied is on record.
    let shown = a.svc.show().unwrap();
    let applied: Vec<_> = shown["gateways"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["applied"].clone())
        .collect();
    assert_eq!(applied, vec![serde_json::json!(1), serde_json::json!(1)], "{shown}");
    // Removed on one, removed everywhere.
    a.svc
        .change("remove_subsystem", |d| {
            d.remove("subsystem");
            Ok::<(), GroupConfigError>(())
        })
        .unwrap();
    b.svc.sync();
    assert!(served(&b).is_empty());
}

#[test]
fn racing_changes_all_land_and_count_once() {
    let (store, records) = (Arc::new(Store::default()), FakeRecords::default());
    let (a, b) = (gateway("a", &store, &records, 7), gateway("b", &store, &records, 7));
    a.svc.sync();
    b.svc.sync();
    const N: usize = 25;
    std::thread::scope(|s| {
        for (g, tag) in [(&a, "a"), (&b, "b")] {
            s.spawn(move || {
                for i in 0..N {
                    let nqn = format!("nqn.2026-12.io.pollux:{tag}-{i}");
                    g.svc.change("add_subsystem", |d| add_subsystem(d, &nqn, "")).unwrap();
                }
            });
        }
    });
    assert_eq!(stored(&store).version, 2 * N as u64, "every change counted once");
    a.svc.sync();
    b.svc.sync();
    assert_eq!(served(&a).len(), 2 * N);
    let (mut sa, mut sb) = (served(&a), served(&b));
    sa.sort();
    sb.sort();
    assert_eq!(sa, sb);
}

#[test]
fn a_change_that_no_longer_validates_is_refused_whole() {
    let (store, records) = (Arc::new(Store::default()), FakeRecords::default());
    let a = gateway("a", &store, &records, 7);
    a.svc.sync();
    a.svc.change("add_subsystem", |d| add_subsystem(d, S1, "")).unwrap();
    let before = store.data.lock().unwrap().clone();
    let e = a.svc.change("add_subsystem", |d| add_subsystem(d, S1, "")).unwrap_err();
    assert!(e.to_string().contains(S1), "{e}");
    assert_eq!(*store.data.lock().unwrap(), before, "nothing written");
    // Not a group's table at all.
    let e = a
        .svc
        .change("x", |d| {
            d.insert("reactors", toml_edit::table());
            Ok::<(), GroupConfigError>(())
        })
        .unwrap_err();
    assert!(e.to_string().contains("`reactors`"), "{e}");
    assert_eq!(*store.data.lock().unwrap(), before);
}

#[test]
fn a_future_or_malformed_object_applies_nothing_and_refuses_changes() {
    let (store, records) = (Arc::new(Store::default()), FakeRecords::default());
    let (a, b) = (gateway("a", &store, &records, 7), gateway("b", &store, &records, 7));
    a.svc.sync();
    b.svc.sync();
    a.svc.change("add_subsystem", |d| add_subsystem(d, S1, "")).unwrap();
    b.svc.sync();
    for (bytes, says) in [
        (br#"{"format": 99, "version": 7, "conf": ""}"#.to_vec(), "format 99"),
        (b"not json".to_vec(), "malformed"),
    ] {
        {
            let mut d = store.data.lock().unwrap();
            let v = d.as_ref().unwrap().1 + 1;
            *d = Some((bytes, v));
        }
        b.svc.sync();
        let e = b.svc.error.lock().unwrap().clone().unwrap();
        assert!(e.contains(says) && e.contains("fake/pollux.gateway.g.config"), "{e}");
        assert_eq!(served(&b), vec![S1.to_string()], "nothing of it applied");
        assert_eq!(version(&b), 1);
        let e = a
            .svc
            .change("add_subsystem", |d| add_subsystem(d, "nqn.2026-12.io.pollux:x", ""))
            .unwrap_err();
        assert!(e.to_string().contains(says), "{e}");
    }
}

#[test]
fn an_unreachable_cluster_refuses_changes_and_keeps_what_is_served() {
    let (store, records) = (Arc::new(Store::default()), FakeRecords::default());
    let a = gateway("a", &store, &records, 7);
    a.svc.sync();
    a.svc.change("add_subsystem", |d| add_subsystem(d, S1, "")).unwrap();
    a.cut.store(true, Ordering::Release);
    let e = a
        .svc
        .change("add_subsystem", |d| add_subsystem(d, "nqn.2026-12.io.pollux:x", ""))
        .unwrap_err();
    assert!(e.to_string().contains("cannot reach the cluster"), "{e}");
    a.svc.sync();
    assert!(a.svc.error.lock().unwrap().is_some());
    assert_eq!(served(&a), vec![S1.to_string()]);
    a.cut.store(false, Ordering::Release);
    a.svc.sync();
    assert!(a.svc.error.lock().unwrap().is_none());
}

#[test]
fn keys_are_sealed_in_the_object_and_open_only_under_the_group_key() {
    let (store, records) = (Arc::new(Store::default()), FakeRecords::default());
    let (a, b, stranger) = (
        gateway("a", &store, &records, 7),
        gateway("b", &store, &records, 7),
        gateway("c", &store, &records, 8),
    );
    for g in [&a, &b, &stranger] {
        g.svc.sync();
    }
    let key = DhchapKey::generate(Some(HashId::Sha256), 32).unwrap().encode();
    let host = "nqn.2014-08.org.nvmexpress:uuid:53535353-0000-4000-8000-000000000001";
    let extra = format!("hosts = [{{ nqn = \"{host}\", dhchap_key = \"{}\" }}]\n", key.as_str());
    a.svc.change("add_subsystem", |d| add_subsystem(d, S1, &extra)).unwrap();
    let raw = String::from_utf8(store.data.lock().unwrap().as_ref().unwrap().0.clone()).unwrap();
    assert!(!raw.contains("DHHC-1") && raw.contains(seal::SEALED), "{raw}");
    b.svc.sync();
    let keyed = b.shared.snapshot.load().subsystem(S1).unwrap().keys_of(host).is_some();
    assert!(keyed, "B opened the host's key");
    stranger.svc.sync();
    let e = stranger.svc.error.lock().unwrap().clone().unwrap();
    assert!(e.contains("does not open"), "{e}");
    assert!(served(&stranger).is_empty(), "nothing applied without the key");
    // Shown sealed, exported open.
    assert!(!a.svc.show().unwrap().to_string().contains("DHHC-1"));
    assert!(a.svc.export().unwrap().0.contains(key.as_str()));
}
