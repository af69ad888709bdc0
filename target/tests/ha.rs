//! High availability and scale-out against in-process targets: one subsystem exported by two
//! targets (the same identity, disjoint controller IDs), and discovery referrals (the log
//! entry, run-time changes with their asynchronous event, a connect-all walk over two
//! targets).
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use pollux_conf::{Config, DISCOVERY_NQN};
use pollux_host::{
    Controller, ControllerOpts, Data, DiscoveryEntry, DiscoveryLog, HostError, SUBTYPE_NVM, SUBTYPE_REFERRAL,
    discover_all, sqe,
};
use pollux_nvme::spec::{Status, cns, feature};
use pollux_target::control::cli::{CtlCommand, run};
use pollux_target::control::{Client, ControlError, ControlServer};
use pollux_target::{Options, Target, TargetError};
use serde_json::json;

const SHARED: &str = "nqn.2026-11.io.pollux:shared";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:0c0c0c0c-0000-4000-8000-0000000000ha";
const WAIT: Duration = Duration::from_secs(5);

static SEQ: AtomicU64 = AtomicU64::new(0);

/// A conf: two reactors, a listener on 127.0.0.1:0, `extra` (referrals, control), and
/// subsystem `nqn` (any host) with `subsys_keys` and two namespaces.
fn conf(nqn: &str, subsys_keys: &str, extra: &str) -> String {
    format!(
        r#"
[reactors]
cores = [0, 1]
mode = "interrupt"

[[listener]]
address = "127.0.0.1:0"

{extra}

[[subsystem]]
nqn = "{nqn}"
allow_any_host = true
{subsys_keys}

[[subsystem.namespace]]
nsid = 1
backend = {{ ram = {{ size = "4MiB" }} }}

[[subsystem.namespace]]
nsid = 2
block_size = 4096
backend = {{ ram = {{ size = "4MiB" }} }}
"#
    )
}

fn start(text: &str) -> Target {
    Target::start(&Config::parse(text, "ha.toml").unwrap(), Options { pin: false }).unwrap()
}

fn addr(t: &Target) -> SocketAddr {
    t.listen_addrs()[0]
}

/// An admin-only controller on `nqn`.
fn admin(a: SocketAddr, nqn: &str) -> Result<Controller, HostError> {
    Controller::connect_with(a, &ControllerOpts::new(nqn, HOST, 0, 32))
}

fn discovery_log(a: SocketAddr) -> DiscoveryLog {
    let mut d = admin(a, DISCOVERY_NQN).unwrap();
    let log = d.admin.discovery_log().unwrap();
    d.shutdown().unwrap();
    log
}

fn referrals(log: &DiscoveryLog) -> Vec<&DiscoveryEntry> {
    log.entries.iter().filter(|e| e.subtype == SUBTYPE_REFERRAL).collect()
}

/// The UUID of namespace `nsid` from its Namespace Identification Descriptor list (Identify
/// CNS 03h, NVMe 2.0 §5.17.2.3: NIDT 3, NIDL 16).
fn ns_uuid(c: &mut Controller, nsid: u32) -> [u8; 16] {
    let d = c.admin.identify(cns::NS_ID_DESCRIPTOR_LIST, nsid).unwrap();
    let mut at = 0;
    while at + 4 <= d.len() && d[at] != 0 {
        let (nidt, nidl) = (d[at], usize::from(d[at + 1]));
        if nidt == 3 && nidl == 16 {
            return d[at + 4..at + 20].try_into().unwrap();
        }
        at += 4 + nidl;
    }
    panic!("no UUID descriptor for namespace {nsid}: {:?}", &d[..64]);
}

/// A namespace's NGUID, EUI-64 and UUID.
type NsIds = ([u8; 16], [u8; 8], [u8; 16]);

/// What a host compares between two paths to one subsystem (Linux `nvme_init_subsystem`,
/// `nvme_global_check_duplicate_ids`): SN, MN, and per namespace NGUID, EUI-64 and UUID.
fn identity(c: &mut Controller) -> (String, String, Vec<NsIds>) {
    let ns = [1, 2]
        .iter()
        .map(|&nsid| {
            let id = c.admin.identify_namespace(nsid).unwrap();
            (id.nguid, id.eui64, ns_uuid(c, nsid))
        })
        .collect();
    (c.id.sn.clone(), c.id.mn.clone(), ns)
}

#[test]
fn two_targets_exporting_one_subsystem_give_it_one_identity_and_disjoint_controller_ids() {
    // Two confs parsed apart, as two machines would: the same subsystem and namespaces, each
    // its own controller ID range.
    let one = start(&conf(SHARED, "min_cntlid = 1\nmax_cntlid = 100", ""));
    let two = start(&conf(SHARED, "min_cntlid = 101\nmax_cntlid = 200", ""));
    let mut a: Vec<Controller> = (0..6).map(|_| admin(addr(&one), SHARED).unwrap()).collect();
    let mut b: Vec<Controller> = (0..6).map(|_| admin(addr(&two), SHARED).unwrap()).collect();
    let (ia, ib) = (identity(&mut a[0]), identity(&mut b[0]));
    assert_eq!(ia, ib, "the two paths differ in SN, MN or a namespace identifier");
    assert!(
        !ia.0.is_empty()
            && ia
                .2
                .iter()
                .all(|(g, e, u)| g != &[0; 16] && e != &[0; 8] && u != &[0; 16])
    );
    assert_ne!(ia.2[0], ia.2[1], "the two namespaces have distinct identifiers");
    // Derived from the conf, so what pollux-conf says.
    let derived = pollux_conf::derive_ids(SHARED, 2);
    assert_eq!(ia.2[1], (derived.nguid, derived.eui64, derived.uuid));
    assert_eq!(ia.0, pollux_conf::derive_serial(SHARED));
    // Controller IDs: from each target's range, unique, on both reactors.
    let ids = |cs: &[Controller]| -> Vec<u16> {
        let mut v: Vec<u16> = cs.iter().map(|c| c.cntlid).collect();
        v.sort_unstable();
        v
    };
    let (ida, idb) = (ids(&a), ids(&b));
    assert!(ida.iter().all(|id| (1..=100).contains(id)), "{ida:?}");
    assert!(idb.iter().all(|id| (101..=200).contains(id)), "{idb:?}");
    for v in [&ida, &idb] {
        let mut d = v.clone();
        d.dedup();
        assert_eq!(&d, v, "an ID handed out twice");
        assert!(
            v.iter().any(|id| id % 2 == 0) && v.iter().any(|id| id % 2 == 1),
            "both reactors: {v:?}"
        );
    }
    // Identify Controller reports the same ID as Connect, and I/O queues find their
    // controller by it (the owning reactor is encoded in it).
    let mut c = Controller::connect_with(addr(&two), &ControllerOpts::new(SHARED, HOST, 2, 32)).unwrap();
    assert!((101..=200).contains(&c.cntlid) && c.id.cntlid == c.cntlid);
    c.io[1].write(1, 0, 1, &[7; 512]).unwrap();
    let mut back = [0u8; 512];
    c.io[0].read(1, 0, 1, &mut back).unwrap();
    assert_eq!(back, [7; 512]);
    c.shutdown().unwrap();
    // The discovery controller is not held to the range.
    let d = admin(addr(&two), DISCOVERY_NQN).unwrap();
    assert!(d.cntlid >= 1 && d.cntlid <= 0xFFEF);
    d.shutdown().unwrap();
    for c in a.drain(..).chain(b.drain(..)) {
        c.shutdown().unwrap();
    }
    one.shutdown().unwrap();
    two.shutdown().unwrap();
}

#[test]
fn an_exhausted_range_answers_controller_busy_and_a_freed_id_is_handed_out_again() {
    // Two IDs for two reactors: one each.
    let t = start(&conf(SHARED, "min_cntlid = 7\nmax_cntlid = 8", ""));
    let a = addr(&t);
    let mut held = Vec::new();
    let mut busy = 0;
    // Connections are placed round robin: within a few tries both IDs are taken and a
    // further Connect on each reactor is refused.
    for _ in 0..6 {
        match admin(a, SHARED) {
            Ok(c) => held.push(c),
            Err(HostError::ConnectRefused { status, .. }) => {
                assert_eq!(
                    (status.sct(), status.sc()),
                    (1, 0x81),
                    "Connect Controller Busy: {status:?}"
                );
                busy += 1;
            }
            Err(e) => panic!("{e}"),
        }
    }
    let mut ids: Vec<u16> = held.iter().map(|c| c.cntlid).collect();
    ids.sort_unstable();
    assert_eq!(ids, [7, 8]);
    assert_eq!(busy, 4);
    // Another subsystem (the discovery controller) still connects.
    admin(a, DISCOVERY_NQN).unwrap().shutdown().unwrap();
    // Freeing 7 lets its reactor hand it out again.
    let seven = held.iter().position(|c| c.cntlid == 7).unwrap();
    held.remove(seven).shutdown().unwrap();
    let t0 = Instant::now();
    let again = loop {
        match admin(a, SHARED) {
            Ok(c) => break c,
            Err(HostError::ConnectRefused { .. }) if t0.elapsed() < WAIT => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(again.cntlid, 7);
    again.shutdown().unwrap();
    for c in held {
        c.shutdown().unwrap();
    }
    t.shutdown().unwrap();
}

#[test]
fn the_discovery_log_lists_referrals_after_the_subsystems() {
    let t = start(&conf(
        SHARED,
        "",
        "[[referral]]\naddress = \"10.0.0.2:8009\"\n[[referral]]\naddress = \"[fd00::2]:4420\"\n",
    ));
    let log = discovery_log(addr(&t));
    assert_eq!(log.numrec, 4, "{log:#?}");
    assert_eq!(log.entries[0].subtype, 3, "the current discovery subsystem first");
    assert_eq!(log.entries[1].subtype, SUBTYPE_NVM);
    assert_eq!(log.entries[1].subnqn, SHARED);
    let want = [("10.0.0.2", "8009", 1u8), ("fd00::2", "4420", 2)];
    for (e, (traddr, trsvcid, adrfam)) in log.entries[2..].iter().zip(want) {
        assert_eq!(e.subtype, SUBTYPE_REFERRAL, "{e:?}");
        assert_eq!(e.subnqn, DISCOVERY_NQN);
        assert_eq!((e.trtype, e.adrfam), (3, adrfam), "TCP, {traddr}");
        assert_eq!((e.traddr.as_str(), e.trsvcid.as_str()), (traddr, trsvcid));
        assert_eq!((e.portid, e.cntlid, e.treq), (0, 0xFFFF, 0));
        assert_eq!(
            e.tcp_addr(),
            Some(
                format!(
                    "{}:{trsvcid}",
                    if adrfam == 1 {
                        traddr.to_string()
                    } else {
                        format!("[{traddr}]")
                    }
                )
                .parse()
                .unwrap()
            )
        );
    }
    t.shutdown().unwrap();
}

/// A target with a control socket.
struct Env {
    ctl: Option<ControlServer>,
    target: Option<Target>,
    sock: PathBuf,
}

impl Env {
    fn start(extra: &str) -> Env {
        let n = SEQ.fetch_add(1, Relaxed);
        let sock = std::env::temp_dir().join(format!("pollux-ha-{}-{n}.sock", std::process::id()));
        let _ = std::fs::remove_file(&sock);
        let text = conf(
            SHARED,
            "",
            &format!("{extra}\n[control]\nsocket = \"{}\"\n", sock.display()),
        );
        let cfg = Config::parse(&text, "ha.toml").unwrap();
        let target = Target::start(&cfg, Options { pin: false }).unwrap();
        let ctl = ControlServer::start(&target, &cfg).unwrap();
        Env {
            ctl: Some(ctl),
            target: Some(target),
            sock,
        }
    }

    fn t(&self) -> &Target {
        self.target.as_ref().unwrap()
    }

    fn call(&self, method: &str, params: serde_json::Value) -> Result<serde_json::Value, ControlError> {
        Client::connect(&self.sock).unwrap().call(method, params)
    }

    fn ctl_discovery(&self) -> String {
        run(Path::new(&self.sock), &CtlCommand::Discovery, false).unwrap()
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        drop(self.ctl.take());
        if let Some(t) = self.target.take() {
            let _ = t.shutdown();
        }
    }
}

/// A discovery controller that asked for discovery log change notices (AEC bit 31, NVMe
/// 2.0 §5.27.1.7) and holds an AER.
struct Watcher {
    c: Controller,
    aer: u16,
}

impl Watcher {
    fn new(a: SocketAddr) -> Watcher {
        let mut c = admin(a, DISCOVERY_NQN).unwrap();
        c.admin
            .set_features(feature::ASYNC_EVENT_CONFIGURATION, 1 << 31)
            .unwrap();
        let aer = c.admin.submit(sqe::async_event_request(), Data::None, 1).unwrap();
        Watcher { c, aer }
    }

    /// The held AER's completion (status, dw0) within `wait`, then a new AER is held.
    fn event(&mut self, wait: Duration) -> Option<(Status, u32)> {
        let mut got = None;
        let t0 = Instant::now();
        while got.is_none() && t0.elapsed() < wait {
            let aer = self.aer;
            self.c
                .admin
                .poll_completions(Some(Duration::from_millis(50)), |done| {
                    if done.cid == aer {
                        got = Some((done.status, done.dw0));
                    }
                })
                .unwrap();
        }
        if got.is_some() {
            self.aer = self.c.admin.submit(sqe::async_event_request(), Data::None, 1).unwrap();
        }
        got
    }
}

/// Notice (type 2), Discovery Log Page Change (info F0h), log page 70h (NVMe-oF 1.1 §5.3).
const DISCOVERY_CHANGED: u32 = 0x0070_F002;

#[test]
fn referrals_change_at_run_time_with_an_event_and_a_new_genctr() {
    let env = Env::start("");
    let a = addr(env.t());
    assert!(
        env.ctl_discovery().contains("referrals none"),
        "{}",
        env.ctl_discovery()
    );
    let mut w = Watcher::new(a);
    let before = w.c.admin.discovery_log().unwrap();
    assert!(referrals(&before).is_empty());

    let r = env.call("add_referral", json!({"address": "10.0.0.2:8009"})).unwrap();
    assert_eq!(r["added_referrals"], json!(["10.0.0.2:8009"]), "{r}");
    assert_eq!(w.event(WAIT), Some((Status::SUCCESS, DISCOVERY_CHANGED)));
    let added = w.c.admin.discovery_log().unwrap();
    assert!(
        added.genctr > before.genctr,
        "GENCTR {} then {}",
        before.genctr,
        added.genctr
    );
    let refs = referrals(&added);
    assert_eq!(refs.len(), 1, "{added:#?}");
    assert_eq!(
        (refs[0].traddr.as_str(), refs[0].trsvcid.as_str()),
        ("10.0.0.2", "8009")
    );
    assert!(
        env.ctl_discovery().contains("referrals 10.0.0.2:8009"),
        "{}",
        env.ctl_discovery()
    );
    assert!(
        env.t()
            .running_config()
            .contains("[[referral]]\naddress = \"10.0.0.2:8009\"")
    );

    // A second one, then the first removed (named in another spelling).
    env.call("add_referral", json!({"address": "[fd00::2]:8009"})).unwrap();
    assert_eq!(w.event(WAIT), Some((Status::SUCCESS, DISCOVERY_CHANGED)));
    let r = env
        .call("remove_referral", json!({"address": "10.0.0.2:08009"}))
        .unwrap();
    assert_eq!(r["removed_referrals"], json!(["10.0.0.2:8009"]), "{r}");
    assert_eq!(w.event(WAIT), Some((Status::SUCCESS, DISCOVERY_CHANGED)));
    let removed = w.c.admin.discovery_log().unwrap();
    assert!(removed.genctr > added.genctr);
    let refs = referrals(&removed);
    assert_eq!(refs.len(), 1);
    assert_eq!(refs[0].traddr, "fd00::2");
    let e = env
        .call("remove_referral", json!({"address": "10.0.0.2:8009"}))
        .unwrap_err();
    assert!(e.to_string().contains("no referral '10.0.0.2:8009'"), "{e}");

    // Refused: nothing changes, no event, the same log.
    let conf_before = env.t().running_config();
    let own = a.to_string();
    for (params, why) in [
        (json!({"address": own}), "this target's own listener"),
        (json!({"address": "127.0.0.1:0"}), "port 0"),
        (json!({"address": "target2:8009"}), "numeric"),
        (json!({"address": "[fd00::2]:8009"}), "already listed"),
        (json!({}), "missing string param 'address'"),
    ] {
        let e = env.call("add_referral", params.clone()).unwrap_err();
        assert!(e.to_string().contains(why), "{params}: {e}");
    }
    assert_eq!(
        env.t().running_config(),
        conf_before,
        "a refused referral changed the conf"
    );
    assert_eq!(
        w.event(Duration::from_millis(300)),
        None,
        "an event for a refused change"
    );
    assert_eq!(w.c.admin.discovery_log().unwrap(), removed);
    w.c.shutdown().unwrap();
}

#[test]
fn a_referral_reaching_a_bound_listener_is_refused_at_start_and_at_run_time() {
    // The conf cannot know the port a `:0` listener gets; the target can.
    let t = start(&conf(SHARED, "", ""));
    let own = addr(&t);
    let mut next = Config::parse(&t.running_config(), "next.toml").unwrap();
    next.referrals.push(pollux_conf::Referral { address: own });
    let before = t.running_config();
    match t.apply(next) {
        Err(TargetError::SelfReferral { referral, listener }) => assert_eq!((referral, listener), (own, own)),
        other => panic!("expected a self referral, got {other:?}"),
    }
    assert_eq!(t.running_config(), before);
    assert!(referrals(&discovery_log(own)).is_empty());
    t.shutdown().unwrap();

    // A listener on every address is reached through any local address, which only the
    // target knows: refused at start. (The address of the default route's interface; a
    // machine without one has no other address to try.)
    let udp = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    let Some(ip) = udp
        .connect("192.0.2.1:9")
        .and_then(|()| udp.local_addr())
        .ok()
        .map(|a| a.ip())
        .filter(|ip| !ip.is_loopback() && !ip.is_unspecified())
    else {
        eprintln!("no non-loopback local address: the start-time check is not exercised");
        return;
    };
    let port = std::net::TcpListener::bind("0.0.0.0:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let text = conf(SHARED, "", "")
        .replace("127.0.0.1:0", &format!("0.0.0.0:{port}"))
        .replace(
            "[[subsystem]]",
            &format!("[[referral]]\naddress = \"{ip}:{port}\"\n\n[[subsystem]]"),
        );
    match Target::start(&Config::parse(&text, "t.toml").unwrap(), Options { pin: false }) {
        Err(e @ TargetError::SelfReferral { .. }) => assert!(e.to_string().contains("own listener"), "{e}"),
        other => panic!("expected a self referral to {ip}:{port}, got {other:?}"),
    }
    // Another port of the same machine is another target.
    let text = text.replace(
        &format!("{ip}:{port}\""),
        &format!("{ip}:{}\"", port.wrapping_add(1).max(1)),
    );
    Target::start(&Config::parse(&text, "t.toml").unwrap(), Options { pin: false })
        .unwrap()
        .shutdown()
        .unwrap();
}

#[test]
fn a_reload_picks_referrals_up() {
    let dir = std::env::temp_dir().join(format!("pollux-ha-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("pollux.toml");
    std::fs::write(&path, conf(SHARED, "", "")).unwrap();
    let t = Target::start(&Config::from_path(&path).unwrap(), Options { pin: false }).unwrap();
    let port = addr(&t).port();
    let mut w = Watcher::new(addr(&t));
    let genctr = w.c.admin.discovery_log().unwrap().genctr;
    let text = |extra: &str| conf(SHARED, "", extra).replace("127.0.0.1:0", &format!("127.0.0.1:{port}"));
    std::fs::write(&path, text("[[referral]]\naddress = \"10.1.1.1:8009\"\n")).unwrap();
    let ch = t.reload().unwrap();
    assert_eq!(ch.added_referrals, vec!["10.1.1.1:8009".parse::<SocketAddr>().unwrap()]);
    assert_eq!(w.event(WAIT), Some((Status::SUCCESS, DISCOVERY_CHANGED)));
    let log = w.c.admin.discovery_log().unwrap();
    assert!(log.genctr > genctr);
    assert_eq!(referrals(&log)[0].traddr, "10.1.1.1");
    // A file referring to the target itself changes nothing.
    std::fs::write(&path, text(&format!("[[referral]]\naddress = \"127.0.0.1:{port}\"\n"))).unwrap();
    let e = t.reload().unwrap_err().to_string();
    assert!(e.contains("pollux.toml:") && e.contains("own listener"), "{e}");
    assert_eq!(w.c.admin.discovery_log().unwrap(), log);
    w.c.shutdown().unwrap();
    t.shutdown().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_connect_all_walk_follows_a_referral_to_the_second_target() {
    const FIRST: &str = "nqn.2026-11.io.pollux:first";
    const SECOND: &str = "nqn.2026-11.io.pollux:second";
    let second = Env::start("");
    // `second` exports SHARED; give it a second subsystem of its own.
    second
        .call(
            "add_subsystem",
            json!({"nqn": SECOND, "allow_any_host": true,
                   "namespace": [{"nsid": 1, "backend": {"ram": {"size": "1MiB"}}}]}),
        )
        .unwrap();
    let b = addr(second.t());
    let first = start(&conf(FIRST, "", &format!("[[referral]]\naddress = \"{b}\"\n")));
    let a = addr(&first);

    let walk = discover_all(a, HOST).unwrap();
    let read: Vec<SocketAddr> = walk.logs.iter().map(|(at, _)| *at).collect();
    assert_eq!(
        read,
        [a, b],
        "discovered at the first target, then at the one it refers to"
    );
    assert!(walk.unreachable.is_empty(), "{:?}", walk.unreachable);
    let found: Vec<(String, SocketAddr)> = walk
        .subsystems
        .iter()
        .map(|e| (e.subnqn.clone(), e.tcp_addr().unwrap()))
        .collect();
    assert_eq!(
        found,
        [(FIRST.to_string(), a), (SHARED.to_string(), b), (SECOND.to_string(), b)],
        "{walk:#?}"
    );
    // Every subsystem found is reachable where the log says.
    for (nqn, at) in &found {
        let mut c = Controller::connect_with(*at, &ControllerOpts::new(nqn, HOST, 1, 32)).unwrap();
        assert_eq!(c.id.subnqn, *nqn);
        let mut block = vec![0u8; 512];
        c.io[0].read(1, 0, 1, &mut block).unwrap();
        c.shutdown().unwrap();
    }

    // The second target refers back to the first, and to one that is not there: the walk
    // reads each discovery controller once and reports the missing one.
    let gone = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    second.call("add_referral", json!({"address": a.to_string()})).unwrap();
    second
        .call("add_referral", json!({"address": gone.to_string()}))
        .unwrap();
    let walk = discover_all(a, HOST).unwrap();
    let read: Vec<SocketAddr> = walk.logs.iter().map(|(at, _)| *at).collect();
    assert_eq!(read, [a, b]);
    assert_eq!(walk.subsystems.len(), 3);
    assert_eq!(walk.unreachable.len(), 1, "{:?}", walk.unreachable);
    assert_eq!(walk.unreachable[0].0, gone);
    // A walk from a target that is not there fails.
    assert!(discover_all(gone, HOST).is_err());
    first.shutdown().unwrap();
}

#[test]
fn two_targets_serve_one_shared_file_coherently() {
    let dir = std::env::temp_dir().join(format!("pollux-ha-shared-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("shared.img");
    let _ = std::fs::remove_file(&path);
    // direct = false: the temporary directory may be a tmpfs, which has no O_DIRECT; on one
    // machine both targets then share the page cache.
    let text = |shared: &str, range: &str| {
        format!(
            r#"
[reactors]
cores = [0, 1]
mode = "interrupt"

[[listener]]
address = "127.0.0.1:0"

[[subsystem]]
nqn = "{SHARED}"
allow_any_host = true
{range}

[[subsystem.namespace]]
nsid = 1
backend = {{ file = {{ path = "{}", size = "4MiB", direct = false{shared} }} }}
"#,
            path.display()
        )
    };
    let one = start(&text(", shared = true", "max_cntlid = 100"));
    let two = start(&text(", shared = true", "min_cntlid = 101"));
    // A target that wants the file alone is refused while the others serve it.
    let e = Target::start(&Config::parse(&text("", ""), "t.toml").unwrap(), Options { pin: false })
        .unwrap_err()
        .to_string();
    assert!(e.contains("already in use") && e.contains("shared = true"), "{e}");
    let mut a = Controller::connect_with(addr(&one), &ControllerOpts::new(SHARED, HOST, 1, 32)).unwrap();
    let mut b = Controller::connect_with(addr(&two), &ControllerOpts::new(SHARED, HOST, 1, 32)).unwrap();
    assert_ne!(a.cntlid, b.cntlid);
    let (ia, ib) = (
        a.admin.identify_namespace(1).unwrap(),
        b.admin.identify_namespace(1).unwrap(),
    );
    assert_eq!((ia.nguid, ia.eui64, ia.nsze), (ib.nguid, ib.eui64, ib.nsze));
    // What one path writes, the other reads, both ways, with nothing cached in between.
    let mut back = vec![0u8; 4096];
    for round in 0..4u8 {
        let (w, r) = if round % 2 == 0 {
            (&mut a, &mut b)
        } else {
            (&mut b, &mut a)
        };
        let data = vec![round + 1; 4096];
        w.io[0].write(1, 8, 8, &data).unwrap();
        w.io[0].flush(1).unwrap();
        r.io[0].read(1, 8, 8, &mut back).unwrap();
        assert_eq!(back, data, "round {round}");
    }
    a.shutdown().unwrap();
    b.shutdown().unwrap();
    one.shutdown().unwrap();
    two.shutdown().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
