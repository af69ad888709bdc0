//! The discovery log page (NVMe-oF 1.1 §5.3, log page 70h) that a discovery controller
//! returns: one entry per subsystem the host may see, on each listener, then one per
//! referral to another target's discovery controller (SPDK: `ctrlr_discovery.c`; nvmet:
//! `discovery.c`).

use std::net::{IpAddr, SocketAddr};

use pollux_conf::{DISCOVERY_NQN, TlsMode};

use crate::subsystem::Snapshot;

/// Discovery log entries advertise this admin queue size.
pub const ADMIN_QUEUE_SIZE: u16 = 32;

fn copy_str(dst: &mut [u8], s: &str) {
    dst.fill(0);
    let n = s.len().min(dst.len().saturating_sub(1));
    dst[..n].copy_from_slice(&s.as_bytes()[..n]);
}

/// Discovery log entry SUBTYPE (NVMe-oF 1.1 §5.3, Figure 34): a referral to a discovery
/// subsystem.
pub const SUBTYPE_DISCOVERY: u8 = 1;
/// SUBTYPE: an NVM subsystem.
pub const SUBTYPE_NVM: u8 = 2;

/// The entry of a referral to the discovery controller at `addr` (NVMe-oF 1.1 §5.3): SUBTYPE
/// 1 and the discovery NQN, as nvmet and SPDK write theirs. PORTID is the referred port's,
/// which pollux does not know: 0, as SPDK reports (nvmet the one configured with the
/// referral). CNTLID FFFFh (dynamic), TREQ 0 (secure channel not specified: the conf says
/// nothing of the other target's TLS), TSAS 0.
fn referral_entry(addr: SocketAddr) -> Vec<u8> {
    let mut e = vec![0u8; 1024];
    e[0] = 3; // TRTYPE: TCP
    e[1] = if addr.is_ipv4() { 1 } else { 2 }; // ADRFAM
    e[2] = SUBTYPE_DISCOVERY;
    e[6..8].copy_from_slice(&0xFFFFu16.to_le_bytes()); // CNTLID: dynamic
    e[8..10].copy_from_slice(&ADMIN_QUEUE_SIZE.to_le_bytes()); // ASQSZ, as nvmet
    copy_str(&mut e[32..64], &addr.port().to_string()); // TRSVCID
    copy_str(&mut e[256..512], DISCOVERY_NQN);
    copy_str(&mut e[512..768], &addr.ip().to_string()); // TRADDR
    e
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
        for s in visible.iter().filter(|s| s.served_on(Some(b))) {
            let mut e = vec![0u8; 1024];
            e[0] = 3; // TRTYPE: TCP
            e[1] = if matches!(ip, IpAddr::V4(_)) { 1 } else { 2 }; // ADRFAM
            e[2] = SUBTYPE_NVM;
            e[3] = treq | 1 << 2; // TREQ; bit 2: SQ flow control disable supported
            e[4..6].copy_from_slice(&(portid as u16).to_le_bytes());
            e[6..8].copy_from_slice(&0xFFFFu16.to_le_bytes()); // CNTLID: dynamic
            e[8..10].copy_from_slice(&ADMIN_QUEUE_SIZE.to_le_bytes());
            copy_str(&mut e[32..64], &l.port().to_string()); // TRSVCID
            copy_str(&mut e[256..512], &s.nqn);
            copy_str(&mut e[512..768], &ip.to_string());
            e[768] = sectype; // TSAS for TCP: SECTYPE
            entries.push(e);
        }
    }
    entries.extend(snapshot.referrals.iter().map(|r| referral_entry(*r)));
    let mut out = vec![0u8; 1024];
    out[0..8].copy_from_slice(&snapshot.genctr.to_le_bytes());
    out[8..16].copy_from_slice(&(entries.len() as u64).to_le_bytes());
    for e in entries {
        out.extend_from_slice(&e);
    }
    out
}
