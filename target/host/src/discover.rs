//! What `nvme connect-all` does before it connects (nvme-cli / libnvme `fabrics.c`): read
//! the discovery log of a discovery controller, and follow its referral entries (SUBTYPE 1,
//! NVMe-oF 1.1 §5.3) to the discovery controllers of other targets, recursively, collecting
//! every NVM subsystem entry on the way.

use std::net::{IpAddr, SocketAddr};

use pollux_conf::DISCOVERY_NQN;

use super::admin::{DiscoveryEntry, DiscoveryLog};
use super::controller::{Controller, ControllerOpts};
use super::error::HostError;

/// How deep referrals are followed: libnvme stops at 8 as well.
pub const MAX_REFERRAL_DEPTH: usize = 8;

/// Discovery log entry SUBTYPE of a referral (NVMe-oF 1.1 §5.3, Figure 34).
pub const SUBTYPE_REFERRAL: u8 = 1;
/// SUBTYPE of an NVM subsystem.
pub const SUBTYPE_NVM: u8 = 2;

impl DiscoveryEntry {
    /// The TCP address the entry names (TRTYPE 3, ADRFAM IPv4 or IPv6, a numeric TRADDR and
    /// TRSVCID); None for another transport or an address that does not parse.
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        if self.trtype != 3 {
            return None;
        }
        let ip: IpAddr = self.traddr.trim().parse().ok()?;
        match (self.adrfam, ip) {
            (1, IpAddr::V4(_)) | (2, IpAddr::V6(_)) => {}
            _ => return None,
        }
        Some(SocketAddr::new(ip, self.trsvcid.trim().parse().ok()?))
    }
}

/// What a walk found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Walk {
    /// Every discovery log read, in the order read, with the address it was read from.
    pub logs: Vec<(SocketAddr, DiscoveryLog)>,
    /// The NVM subsystem entries of all of them, without repeats (the same subsystem at the
    /// same address listed by two targets counts once), in the order found.
    pub subsystems: Vec<DiscoveryEntry>,
    /// Discovery controllers that a referral named but that could not be read, and why (the
    /// walk goes on without them, as nvme-cli does).
    pub unreachable: Vec<(SocketAddr, String)>,
}

/// Read the discovery log at `start` as `hostnqn` and follow referrals breadth first, each
/// discovery controller once, at most [`MAX_REFERRAL_DEPTH`] referrals deep. An error at
/// `start` itself is returned; one at a referred controller is recorded in
/// [`Walk::unreachable`].
pub fn discover_all(start: SocketAddr, hostnqn: &str) -> Result<Walk, HostError> {
    let mut walk = Walk::default();
    let mut visited = vec![start];
    let mut level = vec![start];
    for depth in 0..=MAX_REFERRAL_DEPTH {
        let mut next = Vec::new();
        for addr in level {
            let log = match read_log(addr, hostnqn) {
                Ok(log) => log,
                Err(e) if depth == 0 => return Err(e),
                Err(e) => {
                    walk.unreachable.push((addr, e.to_string()));
                    continue;
                }
            };
            for e in &log.entries {
                match e.subtype {
                    SUBTYPE_NVM if !walk.subsystems.contains(e) => walk.subsystems.push(e.clone()),
                    SUBTYPE_REFERRAL => {
                        if let Some(a) = e.tcp_addr()
                            && !visited.contains(&a)
                        {
                            visited.push(a);
                            next.push(a);
                        }
                    }
                    // Already listed, or the current discovery subsystem (SUBTYPE 3).
                    _ => {}
                }
            }
            walk.logs.push((addr, log));
        }
        if next.is_empty() {
            break;
        }
        level = next;
    }
    Ok(walk)
}

/// Connect to the discovery controller at `addr`, read its whole log, disconnect.
fn read_log(addr: SocketAddr, hostnqn: &str) -> Result<DiscoveryLog, HostError> {
    let mut c = Controller::connect_with(addr, &ControllerOpts::new(DISCOVERY_NQN, hostnqn, 0, 32))?;
    let log = c.admin.discovery_log()?;
    c.shutdown()?;
    Ok(log)
}
