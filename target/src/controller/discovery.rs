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

/// The entry of a referral to the discovery controller at `addr` (NVMe-oF 1.1 §5.3): SUBTYPE
/// 1 and the discovery NQN, as nvmet and SPDK write theirs. PORTID is the referred port's,
/// which pollux does not know: 0, as SPDK reports (nvmet the one configured with the
/// referral). TREQ 0 (secure channel not specified: the conf says nothing of the other
/// target's TLS), TSAS 0.
fn referral_entry(addr: SocketAddr) -> nvmf_disc_log_entry {
    entry(SUBTYPE_DISCOVERY, 0, 0, addr, DISCOVERY_NQN, 0)
}

/// The discovery log (LID 70h, NVMe-oF 1.1 §5.3): one entry per subsystem the host may see
/// on each listener that serves it (a subsystem's `listeners`), then one per referral (every
/// host sees every referral). `local` stands in for a listener bound to an unspecified
/// address.
pub fn discovery_log(snapshot: &Snapshot, hostnqn: &str, local: SocketAddr) -> Vec<u8> {
    let visible: Vec<_> = snapshot.subsystems.iter().filter(|s| s.allows(hostnqn)).collect();
    let mut entries = Vec::new();
    for (portid, b) in snapshot.listeners.iter().enumerate() {
        let l = b.addr;
        let ip = if l.ip().is_unspecified() { local.ip() } else { l.ip() };
        // NVMe-oF 1.1 §5.3 TREQ bits 1:0 (secure channel: 0 not specified, 1 required, 2
        // not required) and the TCP TSAS SECTYPE (NVMe/TCP 1.0 §3.6.1: 0 none, 2 TLS 1.3),
        // as nvmet reports a port's TLS.
        let (treq, sectype) = match b.tls {
            TlsMode::None => (0, 0),
            TlsMode::Required => (1, 2),
            TlsMode::Allowed => (2, 2),
        };
        // TREQ bit 2: SQ flow control disable supported.
        let treq = treq | nvmf_treq::NVMF_TREQ_DISABLE_SQFLOW as u8;
        for s in visible.iter().filter(|s| s.served_on(Some(b))) {
            let addr = SocketAddr::new(ip, l.port());
            entries.push(entry(SUBTYPE_NVM, treq, portid as u16, addr, &s.nqn, sectype));
        }
    }
    entries.extend(snapshot.referrals.iter().map(|r| referral_entry(*r)));
    let mut header = nvmf_discovery_log::new_zeroed();
    header.genctr = snapshot.genctr.to_le();
    header.numrec = (entries.len() as u64).to_le();
    let mut out =
        Vec::with_capacity(size_of::<nvmf_discovery_log>() + entries.len() * size_of::<nvmf_disc_log_entry>());
    out.extend_from_slice(header.as_bytes());
    for e in &entries {
        out.extend_from_slice(e.as_bytes());
    }
    out
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
}
