//! The host library (`pollux_host`) against a real target started in-process on
//! 127.0.0.1:0. Its tests against a fake target (what a real one never sends) are the
//! library's own unit tests; these need pollux-target, which pollux-host cannot depend on.
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::time::Duration;

use pollux_conf::Config;
use pollux_host::{Controller, ControllerOpts, Digests, HostError, HostQueue, QueueOpts, RawReply, sqe};
use pollux_nvme::tcp;
use pollux_target::{Options, Target};

const NQN: &str = "nqn.2026-11.io.pollux:host-test";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-000000000001";

fn start(transport: &str) -> Target {
    let text = format!(
        r#"
[reactors]
cores = [0, 1]
mode = "interrupt"

[[listener]]
address = "127.0.0.1:0"

{transport}

[[subsystem]]
nqn = "{NQN}"
allow_any_host = true

[[subsystem.namespace]]
nsid = 1
block_size = 512
backend = {{ ram = {{ size = "16MiB" }} }}
"#
    );
    let cfg = Config::parse(&text, "host-test.toml").unwrap();
    Target::start(&cfg, Options { pin: false }).unwrap()
}

fn addr(t: &Target) -> SocketAddr {
    t.listen_addrs()[0]
}

/// A deterministic pattern for block `lba` written by `who`.
fn pattern(who: u8, lba: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u64 ^ lba.wrapping_mul(0x9E37_79B9) ^ u64::from(who) << 3) as u8)
        .collect()
}

#[test]
fn controller_connects_enables_and_moves_data_on_every_queue() {
    let t = start("");
    let mut c = Controller::connect(addr(&t), NQN, HOST, 2, 32, Digests::NONE).unwrap();
    assert_eq!(c.io.len(), 2);
    assert_eq!(c.id.subnqn, NQN);
    assert!(c.id.in_capsule_data() >= 4096);
    let ns = c.admin.identify_namespace(1).unwrap();
    assert_eq!((ns.block_size, ns.nsze), (512, 32768));
    assert_eq!(c.admin.active_namespaces(0).unwrap(), vec![1]);
    for (i, q) in c.io.iter_mut().enumerate() {
        let lba = 100 * i as u64;
        let data = pattern(i as u8, lba, 4096);
        q.write(1, lba, 8, &data).unwrap();
        let mut back = vec![0u8; 4096];
        q.read(1, lba, 8, &mut back).unwrap();
        assert_eq!(back, data);
        assert_eq!(q.in_place_reads(), 1, "a lone 4 KiB read is received in place");
        q.flush(1).unwrap();
        q.write_zeroes(1, lba, 8).unwrap();
        q.read(1, lba, 8, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 0));
    }
    c.shutdown().unwrap();
    t.shutdown().unwrap();
}

#[test]
fn many_commands_in_flight_complete_with_their_own_data() {
    let t = start("");
    let mut c = Controller::connect(addr(&t), NQN, HOST, 1, 64, Digests::NONE).unwrap();
    let q = &mut c.io[0];
    const QD: usize = 32;
    const N: u64 = 2000;
    // Writes of 1..=16 blocks (some in-capsule, some by R2T) at distinct LBAs.
    let nlb = |i: u64| (i % 16 + 1) as u32;
    let lba = |i: u64| i * 16;
    let mut next = 0u64;
    let mut done = 0u64;
    let mut max_in_flight = 0;
    let mut pool: Vec<Vec<u8>> = Vec::new();
    while done < N {
        while next < N && q.free_slots() > 0 && q.in_flight() < QD {
            let mut b = pool.pop().unwrap_or_default();
            b.clear();
            b.extend_from_slice(&pattern(7, lba(next), 512 * nlb(next) as usize));
            q.submit_write(1, lba(next), nlb(next), b, next).unwrap();
            next += 1;
        }
        max_in_flight = max_in_flight.max(q.in_flight());
        done += q
            .poll_completions(Some(Duration::from_secs(5)), |c| {
                assert!(c.is_success(), "{:?}", c.status);
                pool.push(c.buf);
            })
            .unwrap() as u64;
    }
    assert!(max_in_flight > 1, "queue depth never exceeded 1");
    // Read everything back, QD 32, verifying each buffer against its tag.
    let (mut next, mut done) = (0u64, 0u64);
    while done < N {
        while next < N && q.free_slots() > 0 && q.in_flight() < QD {
            let mut b = pool.pop().unwrap_or_default();
            b.clear();
            b.resize(512 * nlb(next) as usize, 0);
            q.submit_read(1, lba(next), nlb(next), b, next).unwrap();
            next += 1;
        }
        done += q
            .poll_completions(Some(Duration::from_secs(5)), |c| {
                assert!(c.is_success());
                assert_eq!(c.buf, pattern(7, lba(c.tag), c.buf.len()), "read of tag {}", c.tag);
                pool.push(c.buf);
            })
            .unwrap() as u64;
    }
    assert_eq!(q.in_flight(), 0);
    drop(c);
    t.shutdown().unwrap();
}

#[test]
fn r2t_writes_split_at_maxh2cdata_with_and_without_digests() {
    let t = start("[transport]\nin_capsule_data_size = 4096\nmax_h2c_data = 4096\n");
    for digests in [
        Digests::NONE,
        Digests::BOTH,
        Digests {
            hdgst: true,
            ddgst: false,
        },
    ] {
        let mut c = Controller::connect(addr(&t), NQN, HOST, 1, 16, digests).unwrap();
        let q = &mut c.io[0];
        assert_eq!(q.ic_info().maxh2cdata, 4096);
        assert_eq!((q.ic_info().hdgst, q.ic_info().ddgst), (digests.hdgst, digests.ddgst));
        // 64 KiB: one R2T, 16 H2CData PDUs; 4 KiB: in-capsule; 3 KiB: in-capsule.
        for (lba, len) in [(0u64, 65536usize), (512, 4096), (1024, 3072)] {
            let data = pattern(3, lba, len);
            q.write(1, lba, (len / 512) as u32, &data).unwrap();
            let mut back = vec![0u8; len];
            q.read(1, lba, (len / 512) as u32, &mut back).unwrap();
            assert_eq!(back, data, "{digests:?} lba {lba}");
        }
    }
    t.shutdown().unwrap();
}

#[test]
fn reads_complete_on_data_success_when_sq_flow_control_is_off() {
    let t = start("");
    let mut o = ControllerOpts::new(NQN, HOST, 1, 16);
    o.io_cattr = 1 << 2;
    let mut c = Controller::connect_with(addr(&t), &o).unwrap();
    let q = &mut c.io[0];
    let data = pattern(5, 9, 8192);
    q.write(1, 9, 16, &data).unwrap();
    // The reply is one C2HData with LAST_PDU | SUCCESS and no CapsuleResp.
    let sqe = sqe::read(1, 9, 16);
    let mut raw = sqe;
    raw.cid.set(77);
    raw.set_psdt(pollux_nvme::spec::Sqe::PSDT_SGL_MPTR_CONTIGUOUS);
    raw.set_sgl(&pollux_nvme::spec::SglDescriptor::transport_data_block(8192));
    let pdu = q.capsule_pdu(&raw, &[]);
    q.send_raw(&pdu).unwrap();
    match q.recv_raw(Duration::from_secs(5)).unwrap() {
        RawReply::Pdu {
            hdr: Some(tcp::PduHeader::C2HData { last, success, .. }),
            bytes,
        } => {
            assert!(last && success);
            assert_eq!(&bytes[24..], &data[..]);
        }
        other => panic!("expected C2HData with SUCCESS, got {other:?}"),
    }
    assert!(matches!(
        q.recv_raw(Duration::from_millis(200)),
        Err(HostError::Timeout { .. })
    ));
    // And the library completes such reads, the data received in place.
    let mut back = vec![0u8; 8192];
    let before = q.in_place_reads();
    q.read(1, 9, 16, &mut back).unwrap();
    assert_eq!(back, data);
    assert_eq!(q.in_place_reads(), before + 1);
    drop(c);
    t.shutdown().unwrap();
}

#[test]
fn refused_connect_carries_status_and_dw0() {
    let t = start("");
    let e = HostQueue::connect(addr(&t), QueueOpts::admin("nqn.2026-11.io.pollux:nope", HOST)).unwrap_err();
    match e {
        HostError::ConnectRefused { status, dw0 } => {
            assert_eq!((status.sct(), status.sc()), (1, 0x82));
            assert_eq!(dw0, (1 << 16) | 256);
        }
        other => panic!("{other}"),
    }
    // A command failing is typed too, and the queue stays usable.
    let mut a = HostQueue::connect(addr(&t), QueueOpts::admin(NQN, HOST)).unwrap();
    a.enable().unwrap();
    let e = a.get_log_page(0x7E, 0, 512).unwrap_err();
    assert_eq!(e.status().map(|s| (s.sct(), s.sc())), Some((1, 0x09)));
    assert!(!e.is_fatal());
    a.keep_alive().unwrap();
    a.shutdown_controller().unwrap();
    t.shutdown().unwrap();
}
