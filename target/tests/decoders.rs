//! Property tests of the command decoders (`pollux_target::nvm`, `ctrl`, `sgl`) over arbitrary SQE bytes
//! and data: they never panic, and `decode_io` never yields a range outside the namespace
//! (NVM Command Set 1.0 §3: SLBA + NLB within NSZE) or a transfer above MDTS.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::OnceLock;

use common::*;
use pollux_conf::Config;
use pollux_host::sqe as host_sqe;
use pollux_nvme::spec::resv::ResvCdw10;
use pollux_nvme::spec::{SglDescriptor, Sqe, opcode};
use pollux_target::controller::admin::{Admin, decode_admin};
use pollux_target::controller::connect::{Fabrics, decode_fabrics, parse_connect_data};
use pollux_target::nvm::{Io, decode_io, dsm_ranges};
use pollux_target::sgl::{DataPtr, data_ptr, xfer};
use pollux_target::subsystem::{HostView, build_snapshot, no_store_to_adopt};
use proptest::prelude::*;
use zerocopy::FromBytes;
use zerocopy::little_endian::{U16, U32};

/// [`NQN`] of the common conf, as [`HOST`] sees it: one namespace of 16 MiB in 512-byte
/// blocks.
fn subsystem() -> HostView {
    static S: OnceLock<HostView> = OnceLock::new();
    S.get_or_init(|| {
        let cfg = Config::parse(&conf("interrupt", ""), "decoders.toml").unwrap();
        let s = build_snapshot(&cfg, 1, Vec::new(), no_store_to_adopt)
            .unwrap()
            .subsystem(NQN)
            .unwrap()
            .clone();
        HostView::new(s, HOST)
    })
    .clone()
}

fn lba() -> impl Strategy<Value = u64> {
    prop_oneof![
        0..BLOCKS + 16,
        BLOCKS - 70..BLOCKS + 70,
        u64::MAX - 70..=u64::MAX,
        (u32::MAX as u64 - 70)..(u32::MAX as u64 + 70),
        any::<u64>(),
    ]
}

/// SQEs: random bytes, or NVM/admin/fabrics commands with interesting fields.
fn sqe() -> impl Strategy<Value = Sqe> {
    let random = prop::collection::vec(any::<u8>(), 64).prop_map(|b| Sqe::read_from_bytes(&b).unwrap());
    let opcodes = prop_oneof![
        prop::sample::select(vec![
            opcode::io::FLUSH,
            opcode::io::WRITE,
            opcode::io::READ,
            opcode::io::WRITE_ZEROES,
            opcode::io::DATASET_MANAGEMENT,
            opcode::io::COMPARE,
            opcode::io::VERIFY,
            opcode::io::COPY,
            opcode::io::RESERVATION_REGISTER,
            opcode::io::RESERVATION_ACQUIRE,
            opcode::io::RESERVATION_RELEASE,
            opcode::io::RESERVATION_REPORT,
            opcode::FABRICS,
            opcode::admin::IDENTIFY,
            opcode::admin::GET_LOG_PAGE,
            opcode::admin::ABORT,
        ]),
        any::<u8>(),
    ];
    let nsid = prop_oneof![Just(1u32), Just(0), Just(2), Just(u32::MAX), any::<u32>()];
    let sgl_id = prop_oneof![
        Just(SglDescriptor::ID_DATA_BLOCK_OFFSET),
        Just(SglDescriptor::ID_TRANSPORT_DATA_BLOCK),
        any::<u8>()
    ];
    let structured = (
        opcodes,
        prop_oneof![Just(0x40u8), any::<u8>()],
        nsid,
        lba(),
        any::<u16>(),
        (
            sgl_id,
            prop_oneof![Just(0u64), any::<u64>()],
            prop_oneof![0u32..200_000, any::<u32>()],
        ),
        (any::<u32>(), any::<u32>(), any::<u32>()),
    )
        .prop_map(|(op, flags, nsid, slba, nlb, (id, addr, len), (cdw13, cdw14, cdw15))| {
            let mut s = Sqe::read_from_bytes(&[0u8; 64]).unwrap();
            s.opcode = op;
            s.flags = flags;
            s.cid = U16::new(1);
            s.nsid = U32::new(nsid);
            s.cdw10 = U32::new(slba as u32);
            s.cdw11 = U32::new((slba >> 32) as u32);
            s.cdw12 = U32::new(u32::from(nlb) | (cdw15 & 0xFFFF_0000));
            s.cdw13 = U32::new(cdw13);
            s.cdw14 = U32::new(cdw14);
            s.set_sgl(&SglDescriptor::new(addr, len, id));
            s
        });
    prop_oneof![random, structured]
}

/// Dataset Management range data: random, or ranges near the end of the namespace.
fn dsm_data() -> impl Strategy<Value = Vec<u8>> {
    let range = (any::<u32>(), prop_oneof![0u32..64, any::<u32>()], lba()).prop_map(|(cattr, nlb, slba)| {
        let mut b = [0u8; 16];
        b[0..4].copy_from_slice(&cattr.to_le_bytes());
        b[4..8].copy_from_slice(&nlb.to_le_bytes());
        b[8..16].copy_from_slice(&slba.to_le_bytes());
        b
    });
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..600),
        prop::collection::vec(range, 0..40).prop_map(|v| v.concat()),
    ]
}

fn max_io() -> impl Strategy<Value = u32> {
    prop_oneof![Just(4096u32), Just(131072), Just(1 << 20), Just(u32::MAX), any::<u32>()]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn decode_io_never_yields_a_range_outside_the_namespace(s in sqe(), max in max_io()) {
        let subsys = subsystem();
        let ns = subsys.namespace(1).unwrap();
        let bs = u64::from(ns.block_size);
        let slba = u64::from(s.cdw10.get()) | (u64::from(s.cdw11.get()) << 32);
        let nlb = u64::from(s.cdw12.get() & 0xFFFF) + 1;
        match decode_io(&s, &subsys, max) {
            Err(status) => prop_assert!(!status.is_success()),
            Ok(Io::Read { ns: n, off, len })
            | Ok(Io::Write { ns: n, off, len, .. })
            | Ok(Io::Compare { ns: n, off, len, .. })
            | Ok(Io::Verify { ns: n, off, len }) => {
                prop_assert_eq!(n.nsid, s.nsid.get());
                prop_assert!(matches!(
                    s.opcode,
                    opcode::io::READ | opcode::io::WRITE | opcode::io::COMPARE | opcode::io::VERIFY
                ));
                prop_assert_eq!((off, u64::from(len)), (slba * bs, nlb * bs));
                prop_assert!(off + u64::from(len) <= n.bytes(), "off {} len {}", off, len);
                prop_assert!(len <= max, "len {} above max_io {}", len, max);
            }
            Ok(Io::WriteZeroes { ns: n, off, len }) => {
                prop_assert_eq!(n.nsid, s.nsid.get());
                prop_assert_eq!((off, len), (slba * bs, nlb * bs));
                prop_assert!(off.checked_add(len).is_some_and(|end| end <= n.bytes()));
            }
            Ok(Io::Flush { ns: n }) => {
                prop_assert_eq!(s.opcode, opcode::io::FLUSH);
                prop_assert_eq!(n.is_none(), s.nsid.get() == u32::MAX);
            }
            Ok(Io::DatasetManagement { ns: n, ranges, .. }) => {
                prop_assert_eq!(n.nsid, s.nsid.get());
                prop_assert_eq!(ranges, (s.cdw10.get() & 0xFF) + 1);
            }
            Ok(Io::Reservation { ns: n, cmd }) => {
                prop_assert_eq!(n.nsid, s.nsid.get());
                prop_assert_eq!(Some(cmd), ResvCdw10::decode(s.opcode, s.cdw10.get()));
            }
            // Only the extended structure, at least its header, at most MDTS.
            Ok(Io::ReservationReport { ns: n, len }) => {
                prop_assert_eq!(n.nsid, s.nsid.get());
                prop_assert!(s.cdw11.get() & 1 == 1);
                prop_assert!((64..=max).contains(&len), "report of {} bytes", len);
            }
            Ok(Io::Copy { ns: n, dst, ranges, .. }) => {
                prop_assert_eq!(s.opcode, opcode::io::COPY);
                prop_assert_eq!(n.nsid, s.nsid.get());
                prop_assert_eq!(dst, slba * bs);
                prop_assert!(dst < n.bytes());
                prop_assert_eq!((s.cdw12.get() >> 8) & 0xF, 0, "only format 0");
                prop_assert!((1..=128).contains(&ranges));
            }
        }
    }

    #[test]
    fn the_other_decoders_never_panic(s in sqe(), data in prop::collection::vec(any::<u8>(), 0..1100)) {
        let _ = decode_fabrics(&s);
        let _ = decode_admin(&s);
        let _ = xfer(&s);
        match data_ptr(&s) {
            Ok(DataPtr::InCapsule(len)) => {
                prop_assert_eq!(s.sgl().id, SglDescriptor::ID_DATA_BLOCK_OFFSET);
                prop_assert!(len > 0 && s.sgl().address.get() == 0);
            }
            Ok(DataPtr::Transport(len)) => prop_assert!(len > 0),
            Ok(DataPtr::None) => prop_assert_eq!(s.sgl().length.get(), 0),
            Err(status) => prop_assert!(!status.is_success()),
        }
        match parse_connect_data(&data) {
            Ok(d) => {
                prop_assert!(data.len() >= 1024);
                prop_assert_eq!(d.cntlid, u16::from_le_bytes([data[16], data[17]]));
            }
            Err(off) => prop_assert!(matches!(off, 0 | 256 | 512), "offset {}", off),
        }
    }

    #[test]
    fn dsm_ranges_stay_inside_the_namespace(data in dsm_data()) {
        let subsys = subsystem();
        let ns = subsys.namespace(1).unwrap();
        if let Ok(ranges) = dsm_ranges(&data, ns) {
            prop_assert!(ranges.len() <= data.len() / 16);
            for (off, len) in ranges {
                prop_assert!(len > 0 && off % 512 == 0 && len % 512 == 0);
                prop_assert!(off.checked_add(len).is_some_and(|end| end <= ns.bytes()), "{} + {}", off, len);
            }
        }
    }
}

#[test]
fn connect_data_with_a_valid_layout_parses() {
    let mut d = vec![0u8; 1024];
    d[16..18].copy_from_slice(&0xFFFFu16.to_le_bytes());
    d[256..256 + NQN.len()].copy_from_slice(NQN.as_bytes());
    d[512..512 + HOST.len()].copy_from_slice(HOST.as_bytes());
    let c = parse_connect_data(&d).unwrap();
    assert_eq!((c.cntlid, c.subnqn.as_str(), c.hostnqn.as_str()), (0xFFFF, NQN, HOST));
    // Invalid UTF-8 in SUBNQN points at SUBNQN.
    d[256] = 0xFF;
    assert_eq!(parse_connect_data(&d), Err(256));
}

/// The host library's command and Connect data builders, read back by the target's own
/// decoders (they lived in the host library before it left pollux-target).
#[test]
fn host_builders_decode_as_the_target_reads_them() {
    assert_eq!(
        decode_fabrics(&host_sqe::connect(3, 127, 4, 5000)),
        Fabrics::Connect {
            recfmt: 0,
            qid: 3,
            sqsize: 127,
            cattr: 4,
            kato: 5000
        }
    );
    assert_eq!(
        decode_fabrics(&host_sqe::property_set(0x14, 0x46_0001, false)),
        Fabrics::PropertySet {
            size8: false,
            offset: 0x14,
            value: 0x46_0001
        }
    );
    assert_eq!(
        decode_admin(&host_sqe::get_log_page(0x70, 0x4_0000 + 8, 1024, true)),
        Admin::GetLogPage {
            lid: 0x70,
            lsp: 0,
            rae: true,
            offset: 1024,
            len: 0x4_0000 + 8
        }
    );
    assert_eq!(decode_admin(&host_sqe::abort(2, 77)), Admin::Abort { sqid: 2, cid: 77 });
    let r = host_sqe::read(1, 0x1_0000_0002, 65536);
    assert_eq!((r.cdw10.get(), r.cdw11.get(), r.cdw12.get()), (2, 1, 0xFFFF));
    let d = host_sqe::DsmRange {
        cattr: 0,
        nlb: 8,
        slba: 3,
    }
    .to_bytes();
    assert_eq!(&d[4..8], &8u32.to_le_bytes());
    assert_eq!(&d[8..16], &3u64.to_le_bytes());
    let cd = host_sqe::connect_data(&[7; 16], 0xFFFF, "nqn.a", "nqn.b");
    let parsed = parse_connect_data(&cd).expect("valid");
    assert_eq!(
        (
            parsed.hostid,
            parsed.cntlid,
            parsed.subnqn.as_str(),
            parsed.hostnqn.as_str()
        ),
        ([7; 16], 0xFFFF, "nqn.a", "nqn.b")
    );
}
