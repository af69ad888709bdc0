//! The discovery log page (NVMe-oF 1.1 §5.3, log page 70h) that a discovery controller
//! returns: one entry per subsystem the host may see, on each listener, then one per
//! referral to another target's discovery controller (SPDK: `ctrlr_discovery.c`; nvmet:
//! `discovery.c`).

use std::net::SocketAddr;

use pollux_conf::{DISCOVERY_NQN, TlsMode};
use pollux_nvme::bindings::{
    nvmf_addr_family, nvmf_disc_log_entry, nvmf_discovery_log, nvmf_treq, nvmf_trtype, nvmf_tsas_tcp,
};
use pollux_nvme::spec::text::nul_terminated;
use zerocopy::{FromZeros, IntoBytes};

use crate::subsystem::Snapshot;

/// Discovery log entries advertise this admin queue size.
pub const ADMIN_QUEUE_SIZE: u16 = 32;

/// Discovery log entry SUBTYPE (NVMe-oF 1.1 §5.3, Figure 34): a referral to a discovery
/// subsystem.
pub const SUBTYPE_DISCOVERY: u8 = 1;
/// SUBTYPE: an NVM subsystem.
pub const SUBTYPE_NVM: u8 = 2;
/// SUBTYPE: the current discovery subsystem (NVMe 2.0 §5.16.1.23, Figure 263): the
/// discovery controller the host reads the log from, on the port it came through.
pub const SUBTYPE_CURRENT_DISCOVERY: u8 = 3;

/// One discovery log entry (NVMe-oF 1.1 §5.3, Figure 39) for the TCP transport: TRTYPE 3,
/// ADRFAM of `addr`, CNTLID FFFFh (dynamic), ASQSZ [`ADMIN_QUEUE_SIZE`] (as nvmet), TRSVCID
/// and TRADDR from `addr`, and the TCP TSAS (NVMe/TCP 1.0 §3.6.1) with its SECTYPE.
fn entry(subtype: u8, treq: u8, portid: u16, addr: SocketAddr, subnqn: &str, sectype: u8) -> nvmf_disc_log_entry {
    let mut e = nvmf_disc_log_entry::new_zeroed();
    e.trtype = nvmf_trtype::NVMF_TRTYPE_TCP as u8;
    e.adrfam = if addr.is_ipv4() {
        nvmf_addr_family::NVMF_ADDR_FAMILY_IP4
    } else {
        nvmf_addr_family::NVMF_ADDR_FAMILY_IP6
    } as u8;
    e.subtype = subtype;
    e.treq = treq;
    e.portid = portid.to_le();
    e.cntlid = 0xFFFFu16.to_le();
    e.asqsz = ADMIN_QUEUE_SIZE.to_le();
    nul_terminated(&mut e.trsvcid, &addr.port().to_string());
    nul_terminated(&mut e.subnqn, subnqn);
    nul_terminated(&mut e.traddr, &addr.ip().to_string());
    let tsas = nvmf_tsas_tcp { sectype };
    // The TSAS is 256 bytes and the TCP one its first byte: the prefix always fits.
    let _ = tsas.write_to_prefix(e.tsas.as_mut_bytes());
    e
}

/// The entry of a referral to the discovery controller at `addr`, for tests.
#[cfg(test)]
fn referral_entry(addr: SocketAddr) -> nvmf_disc_log_entry {
    Spec::referral(addr).entry()
}

/// An entry of the discovery log before it is laid out: [`entry`]'s arguments.
struct Spec<'a> {
    subtype: u8,
    treq: u8,
    portid: u16,
    addr: SocketAddr,
    subnqn: &'a str,
    sectype: u8,
}

impl Spec<'_> {
    /// The entry of a referral to the discovery controller at `addr` (NVMe-oF 1.1 §5.3):
    /// SUBTYPE 1 and the discovery NQN, as nvmet and SPDK write theirs. PORTID is the
    /// referred port's, which pollux does not know: 0, as SPDK reports (nvmet the one
    /// configured with the referral). TREQ 0 (secure channel not specified: the conf says
    /// nothing of the other target's TLS), TSAS 0.
    fn referral(addr: SocketAddr) -> Spec<'static> {
        Spec {
            subtype: SUBTYPE_DISCOVERY,
            treq: 0,
            portid: 0,
            addr,
            subnqn: DISCOVERY_NQN,
            sectype: 0,
        }
    }

    fn entry(&self) -> nvmf_disc_log_entry {
        entry(
            self.subtype,
            self.treq,
            self.portid,
            self.addr,
            self.subnqn,
            self.sectype,
        )
    }
}

/// The entries of the discovery log, in order: the current discovery subsystem on the
/// listener the host came through (`local`), as Linux nvmet writes it first; one per
/// subsystem the host may see on each listener that serves it (a subsystem's `listeners`)
/// and that `[discovery] filter` admits for `local`; then one per referral (every host sees
/// every referral). `local` stands in for a listener bound to an unspecified address.
fn specs<'a>(snapshot: &'a Snapshot, hostnqn: &str, local: SocketAddr) -> Vec<Spec<'a>> {
    let visible: Vec<_> = snapshot.subsystems.iter().filter(|s| s.allows(hostnqn)).collect();
    let mut out = Vec::new();
    let filter = snapshot.discovery.filter;
    // NVMe-oF 1.1 §5.3 TREQ bits 1:0 (secure channel: 0 not specified, 1 required, 2 not
    // required) and the TCP TSAS SECTYPE (NVMe/TCP 1.0 §3.6.1: 0 none, 2 TLS 1.3), as nvmet
    // reports a port's TLS; TREQ bit 2: SQ flow control disable supported.
    let security = |tls: TlsMode| {
        let (treq, sectype) = match tls {
            TlsMode::None => (0, 0),
            TlsMode::Required => (1, 2),
            TlsMode::Allowed => (2, 2),
        };
        (treq | nvmf_treq::NVMF_TREQ_DISABLE_SQFLOW as u8, sectype)
    };
    // The listener the host came through: the one on its address (or any) and port.
    let port_of = pollux_conf::DiscoveryFilter {
        address: true,
        svcid: true,
    };
    let came_through = snapshot
        .listeners
        .iter()
        .enumerate()
        .find(|(_, b)| port_of.admits(b.addr, local));
    if let Some((portid, b)) = came_through {
        let (treq, sectype) = security(b.tls);
        out.push(Spec {
            subtype: SUBTYPE_CURRENT_DISCOVERY,
            treq,
            portid: portid as u16,
            addr: local,
            subnqn: DISCOVERY_NQN,
            sectype,
        });
    }
    for (portid, b) in snapshot.listeners.iter().enumerate() {
        let l = b.addr;
        if !filter.admits(l, local) {
            continue;
        }
        let ip = if l.ip().is_unspecified() { local.ip() } else { l.ip() };
        let (treq, sectype) = security(b.tls);
        for s in visible.iter().filter(|s| s.served_on(Some(b))) {
            out.push(Spec {
                subtype: SUBTYPE_NVM,
                treq,
                portid: portid as u16,
                addr: SocketAddr::new(ip, l.port()),
                subnqn: &s.nqn,
                sectype,
            });
        }
    }
    // A gateway group's other gateways: each path to a group subsystem the host may see,
    // as the same filter admits it (NVMe-oF 1.1 §5.3: a discovery log lists every port of
    // the NVM subsystem, and a group subsystem's ports are every gateway's). Their PORTIDs
    // follow this gateway's own.
    for (i, p) in snapshot.peers.iter().enumerate() {
        if !filter.admits(p.address, local) {
            continue;
        }
        let (treq, sectype) = security(p.tls);
        for s in visible.iter().filter(|s| p.subsystems.contains(&s.nqn)) {
            out.push(Spec {
                subtype: SUBTYPE_NVM,
                treq,
                portid: (snapshot.listeners.len() + i) as u16,
                addr: p.address,
                subnqn: &s.nqn,
                sectype,
            });
        }
    }
    out.extend(snapshot.referrals.iter().map(|&addr| Spec::referral(addr)));
    out
}

/// Bytes `[offset, offset + len)` of the discovery log (LID 70h, NVMe-oF 1.1 §5.3), the
/// part past its end read as zeroes; None: `offset` is beyond the log or not a multiple of
/// 4 (NVMe 2.0 §5.16: Invalid Field). Only the entries the range reaches are laid out: a
/// host reads a large log in pieces (libnvme in 4 KiB ones, 33 for 128 subsystems), and
/// laying out the whole log for each piece made reading it quadratic in the subsystems.
pub fn discovery_log_part(
    snapshot: &Snapshot,
    hostnqn: &str,
    local: SocketAddr,
    offset: u64,
    len: u32,
) -> Option<Vec<u8>> {
    const HDR: usize = size_of::<nvmf_discovery_log>();
    const ENT: usize = size_of::<nvmf_disc_log_entry>();
    let specs = specs(snapshot, hostnqn, local);
    let total = HDR + specs.len() * ENT;
    if offset > total as u64 || !offset.is_multiple_of(4) {
        return None;
    }
    let start = offset as usize;
    let end = start.saturating_add(len as usize).min(total);
    let mut out = Vec::with_capacity(len as usize);
    if start < HDR {
        let mut header = nvmf_discovery_log::new_zeroed();
        header.genctr = snapshot.genctr.to_le();
        header.numrec = (specs.len() as u64).to_le();
        out.extend_from_slice(&header.as_bytes()[start..end.min(HDR)]);
    }
    if end > HDR {
        let (first, last) = (start.max(HDR) - HDR, end - HDR);
        let (from, to) = (first / ENT, last.div_ceil(ENT));
        for (i, spec) in specs.iter().enumerate().take(to).skip(from) {
            let e = spec.entry();
            let at = i * ENT;
            out.extend_from_slice(&e.as_bytes()[first.max(at) - at..last.min(at + ENT) - at]);
        }
    }
    out.resize(len as usize, 0);
    Some(out)
}

/// The whole discovery log ([`discovery_log_part`] of all of it).
pub fn discovery_log(snapshot: &Snapshot, hostnqn: &str, local: SocketAddr) -> Vec<u8> {
    const HDR: usize = size_of::<nvmf_discovery_log>();
    const ENT: usize = size_of::<nvmf_disc_log_entry>();
    let n = specs(snapshot, hostnqn, local).len();
    discovery_log_part(snapshot, hostnqn, local, 0, (HDR + n * ENT) as u32).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_referral_entry_sits_where_the_spec_puts_it() {
        let e = referral_entry("10.0.0.2:8009".parse().unwrap_or_else(|_| panic!("address")));
        let b = e.as_bytes();
        // NVMe-oF 1.1 §5.3, Figure 39: TRTYPE TCP, ADRFAM IPv4, SUBTYPE discovery, TREQ 0.
        assert_eq!(b[0..4], [3, 1, SUBTYPE_DISCOVERY, 0]);
        assert_eq!(b[4..6], [0, 0], "PORTID");
        assert_eq!(b[6..8], [0xFF, 0xFF], "CNTLID");
        assert_eq!(b[8..10], ADMIN_QUEUE_SIZE.to_le_bytes());
        assert_eq!(&b[32..37], b"8009\0");
        assert_eq!(&b[256..256 + DISCOVERY_NQN.len()], DISCOVERY_NQN.as_bytes());
        assert_eq!(b[256 + DISCOVERY_NQN.len()], 0);
        assert_eq!(&b[512..521], b"10.0.0.2\0");
        assert!(b[768..].iter().all(|&x| x == 0), "TSAS");
        let v6 = referral_entry("[::1]:8009".parse().unwrap_or_else(|_| panic!("address")));
        assert_eq!(v6.adrfam, 2);
    }

    /// Every piece a host may ask for is the same bytes as the whole log's, wherever it
    /// starts and ends, and a piece past the end is zeroes; an offset beyond the log or not
    /// a multiple of 4 is refused.
    #[test]
    fn a_part_of_the_log_is_the_same_bytes_as_the_whole() {
        use crate::subsystem::{BoundListener, test_subsystem_named};
        let listener = |a: &str, tls| BoundListener {
            addr: a.parse().unwrap_or_else(|_| panic!("address")),
            configured: a.parse().unwrap_or_else(|_| panic!("address")),
            tls,
            ana: Default::default(),
            max_connections: None,
        };
        let subsystems = (0..5)
            .map(|i| test_subsystem_named(&format!("nqn.2026-11.io.pollux:s{i}")))
            .collect();
        let snap = Snapshot::new(
            subsystems,
            vec![
                listener("127.0.0.1:4420", TlsMode::None),
                listener("0.0.0.0:4421", TlsMode::Allowed),
            ],
            7,
            Default::default(),
            vec!["10.0.0.9:8009".parse().unwrap_or_else(|_| panic!("address"))],
        );
        let local = "192.168.1.5:4421".parse().unwrap_or_else(|_| panic!("address"));
        let whole = discovery_log(&snap, "nqn.h", local);
        assert_eq!(
            whole.len(),
            1024 + 12 * 1024,
            "the current discovery subsystem, 5 subsystems on 2 listeners and a referral"
        );
        assert_eq!(whole[8], 12, "NUMREC");
        assert_eq!(
            whole[1024 + 2],
            SUBTYPE_CURRENT_DISCOVERY,
            "first, the listener reached (0.0.0.0:4421)"
        );
        for (offset, len) in [
            (0, 4),
            (0, 1024),
            (4, 2048),
            (1020, 8),
            (1024, 4096),
            (3000, 5000),
            (12 * 1024 - 4, 4),
        ] {
            let part = discovery_log_part(&snap, "nqn.h", local, offset, len).unwrap_or_else(|| panic!("{offset}"));
            assert_eq!(
                part,
                whole[offset as usize..offset as usize + len as usize],
                "[{offset}, +{len})"
            );
        }
        let tail = discovery_log_part(&snap, "nqn.h", local, 12 * 1024, 4096).unwrap_or_else(|| panic!("tail"));
        assert_eq!(tail[..1024], whole[12 * 1024..]);
        assert!(tail[1024..].iter().all(|&b| b == 0), "past the end: zeroes");
        assert!(
            discovery_log_part(&snap, "nqn.h", local, 13 * 1024, 4).is_some(),
            "at the end: all zeroes"
        );
        assert!(
            discovery_log_part(&snap, "nqn.h", local, 13 * 1024 + 4, 4).is_none(),
            "beyond the end"
        );
        assert!(discovery_log_part(&snap, "nqn.h", local, 2, 4).is_none(), "unaligned");
    }
}
