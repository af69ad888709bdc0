//! Log pages of a controller (NVMe 2.0 §5.16): SMART / Health, Error Information, Firmware
//! Slot, Changed Namespace List, Commands Supported and Effects, Asymmetric Namespace Access,
//! and the discovery log
//! ([`super::discovery`]) of a discovery controller.

use std::net::SocketAddr;

use pollux_nvme::bindings::{nvme_error_log_page, nvmf_trtype};
use pollux_nvme::spec::text::ascii_padded;
use pollux_nvme::spec::{Status, command, log_page};
use zerocopy::{FromZeros, IntoBytes};

use super::discovery::discovery_log_part;
use super::reply::Reply;
use super::{Ctrl, ERROR_LOG_ENTRIES};
use crate::health;
use crate::shared::Shared;
use crate::subsystem::Snapshot;

/// SMART / Health Information (LID 02h), NVMe 2.0 §5.16.1.3: the health of the stores
/// behind the subsystem ([`crate::health`]), or behind namespace `nsid` (Identify Controller
/// LPA bit 0), with this controller's own Critical Warning (its temperature thresholds),
/// error-log count and power-on time. None: `nsid` is not an active namespace.
pub fn smart_log(ctrl: &Ctrl, env: &LogEnv<'_>, nsid: u32) -> Option<Vec<u8>> {
    let one = (nsid != 0 && nsid != u32::MAX).then_some(nsid);
    let s = ctrl.subsys.as_ref()?;
    if one.is_some_and(|n| s.namespace(n).is_none()) {
        return None;
    }
    let mut h = health::gather(s, one, env.host_k);
    h.critical_warning = health::warning(&h, ctrl.features.temp_over, ctrl.features.temp_under);
    // This controller's store has been powered at least this once.
    h.power_cycles = h.power_cycles.max(1);
    h.power_on_hours = u128::from(env.started.elapsed().as_secs() / 3600);
    h.error_log_entries = u128::from(ctrl.error_count);
    Some(h.to_page())
}

/// Error Information (LID 01h, NVMe 2.0 §5.16.1.2): 64-byte entries, newest first.
pub fn error_log(ctrl: &Ctrl) -> Vec<u8> {
    let mut out = vec![0u8; size_of::<nvme_error_log_page>() * ERROR_LOG_ENTRIES];
    let slots = out.chunks_exact_mut(size_of::<nvme_error_log_page>());
    for (slot, e) in slots.zip(ctrl.errors.iter().rev()) {
        let mut page = nvme_error_log_page::new_zeroed();
        page.error_count = e.count.to_le();
        page.sqid = e.sqid.to_le();
        page.cmdid = e.cid.to_le();
        page.status_field = e.status.to_cqe_field().to_le();
        page.parm_error_location = 0xFFFFu16.to_le(); // not applicable
        page.lba = e.lba.to_le();
        page.nsid = e.nsid.to_le();
        page.trtype = nvmf_trtype::NVMF_TRTYPE_TCP as u8;
        slot.copy_from_slice(page.as_bytes());
    }
    out
}

/// Commands Supported and Effects (LID 05h), NVMe 2.0 §5.16.1.6: the commands served
/// ([`command`]).
pub fn effects_log() -> Vec<u8> {
    command::effects().to_vec()
}

/// Firmware Slot Information (LID 03h).
pub fn firmware_log() -> Vec<u8> {
    let mut out = vec![0u8; 512];
    out[0] = 1; // slot 1 active
    ascii_padded(&mut out[8..16], env!("CARGO_PKG_VERSION"));
    out
}

/// Changed Namespace List (LID 04h): up to 1024 NSIDs; FFFFFFFFh first if more changed.
pub fn changed_ns_log(ctrl: &mut Ctrl, rae: bool) -> Vec<u8> {
    let mut out = vec![0u8; 4096];
    if ctrl.changed_ns.len() > 1024 {
        out[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
    } else {
        for (i, n) in ctrl.changed_ns.iter().enumerate() {
            out[i * 4..i * 4 + 4].copy_from_slice(&n.to_le_bytes());
        }
    }
    if !rae {
        ctrl.changed_ns.clear();
    }
    out
}

/// Slice `[offset, offset + len)` out of a whole log page.
pub fn log_slice(log: Vec<u8>, offset: u64, len: u32) -> Reply {
    if offset > log.len() as u64 || !offset.is_multiple_of(4) {
        return Reply::err(Status::INVALID_FIELD.with_dnr());
    }
    let start = offset as usize;
    let end = (start + len as usize).min(log.len());
    let mut data = log[start..end].to_vec();
    // A host may ask for more than the page holds: the rest reads as zeroes.
    data.resize(len as usize, 0);
    Reply::data(data)
}

/// What a log page may depend on besides the controller.
#[derive(Debug, Clone, Copy)]
pub struct LogEnv<'a> {
    /// Target-wide state.
    pub shared: &'a Shared,
    /// The subsystems now.
    pub snapshot: &'a Snapshot,
    /// The connection's local address (stands in for unspecified listener addresses).
    pub local: SocketAddr,
    /// When the target started (power-on hours).
    pub started: std::time::Instant,
    /// The host's temperature, kelvin (for namespaces without a device of their own).
    pub host_k: u16,
}

/// Asymmetric Namespace Access (LID 0Ch), NVMe 2.0 §5.16.1.13: one descriptor per ANA
/// group of the subsystem's namespaces, with the group's state on this controller's port
/// and, unless `rgo` (LSP bit 0, Return Groups Only), its namespaces.
pub fn ana_log(ctrl: &Ctrl, rgo: bool) -> Vec<u8> {
    let mut groups: std::collections::BTreeMap<u32, Vec<u32>> = std::collections::BTreeMap::new();
    if let Some(s) = &ctrl.subsys {
        // The host's active namespaces: one masked from it is not attached here.
        for ns in s.namespaces() {
            groups.entry(ns.ana_group).or_default().push(ns.nsid);
        }
    }
    let chgcnt = ctrl.ana.chgcnt();
    let mut out = vec![0u8; 16];
    out[0..8].copy_from_slice(&chgcnt.to_le_bytes());
    out[8..10].copy_from_slice(&(groups.len() as u16).to_le_bytes());
    for (grp, nsids) in &groups {
        let mut d = [0u8; 32];
        d[0..4].copy_from_slice(&grp.to_le_bytes());
        let listed = if rgo { 0 } else { nsids.len() as u32 };
        d[4..8].copy_from_slice(&listed.to_le_bytes());
        d[8..16].copy_from_slice(&chgcnt.to_le_bytes());
        d[16] = ctrl.ana.state(*grp).code();
        out.extend_from_slice(&d);
        if !rgo {
            for n in nsids {
                out.extend_from_slice(&n.to_le_bytes());
            }
        }
    }
    out
}

/// Get Log Page for a controller: page `lid` (of namespace `nsid`, where the page has one,
/// with log specific field `lsp`), `len` bytes from byte `offset`.
#[allow(clippy::too_many_arguments)]
pub fn get_log_page(
    ctrl: &mut Ctrl,
    env: &LogEnv<'_>,
    lid: u8,
    lsp: u8,
    nsid: u32,
    rae: bool,
    offset: u64,
    len: u32,
) -> Reply {
    let log = match lid {
        // Only the part asked for is laid out (a host reads a large log in pieces).
        log_page::DISCOVERY if ctrl.is_discovery() => {
            return match discovery_log_part(env.snapshot, &ctrl.hostnqn, env.local, offset, len) {
                Some(part) => Reply::data(part),
                None => Reply::err(Status::INVALID_FIELD.with_dnr()),
            };
        }
        log_page::ERROR => error_log(ctrl),
        log_page::SMART if !ctrl.is_discovery() => {
            // Reading it (without Retain Asynchronous Event) unmasks SMART events (NVMe 2.0 §5.2.1).
            let Some(page) = smart_log(ctrl, env, nsid) else {
                return Reply::err(Status::INVALID_NAMESPACE.with_dnr());
            };
            if !rae {
                ctrl.smart_masked = false;
            }
            page
        }
        log_page::FIRMWARE_SLOT if !ctrl.is_discovery() => firmware_log(),
        log_page::CHANGED_NAMESPACE_LIST if !ctrl.is_discovery() => changed_ns_log(ctrl, rae),
        log_page::COMMANDS_SUPPORTED_AND_EFFECTS if !ctrl.is_discovery() => effects_log(),
        log_page::ANA if !ctrl.is_discovery() => {
            // Reading it (without RAE) unmasks ANA change events (NVMe 2.0 §5.2.1).
            if !rae {
                ctrl.ana_masked = false;
                ctrl.ana_seen = ctrl.ana.chgcnt();
            }
            ana_log(ctrl, lsp & 1 != 0)
        }
        log_page::RESERVATION_NOTIFICATION if !ctrl.is_discovery() => ctrl.resv_log.read(rae),
        _ => return Reply::err(Status::INVALID_LOG_PAGE.with_dnr()),
    };
    log_slice(log, offset, len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_effects_log_lists_todays_commands() {
        let dword = |log: &[u8], at: usize| u32::from_le_bytes([log[at], log[at + 1], log[at + 2], log[at + 3]]);
        let log = effects_log();
        assert_eq!(log.len(), 4096);
        // Admin (ACS): Get Log Page, Identify, Abort, Set/Get Features, AER, Keep Alive.
        let admin = [0x02, 0x06, 0x08, 0x09, 0x0A, 0x0C, 0x18];
        // I/O (IOCS): CSUPP, and LBCC for Write, Write Zeroes, Dataset Management, Copy.
        let io = [
            (0x00, 1),
            (0x01, 3),
            (0x02, 1),
            (0x05, 1),
            (0x08, 3),
            (0x09, 3),
            (0x0C, 1),
            (0x0D, 1),
            (0x0E, 1),
            (0x11, 1),
            (0x15, 1),
            (0x19, 3),
        ];
        for op in 0..256usize {
            let want = u32::from(admin.contains(&op));
            assert_eq!(dword(&log, op * 4), want, "ACS {op:#x}");
            let want = io.iter().find(|(o, _)| *o == op).map_or(0, |(_, v)| *v);
            assert_eq!(dword(&log, 1024 + op * 4), want, "IOCS {op:#x}");
        }
        assert!(log[2048..].iter().all(|&b| b == 0));
    }

    #[test]
    fn the_ana_log_lists_the_hosts_namespaces_only() {
        use std::sync::Arc;

        use crate::subsystem::{test_namespace, test_subsystem_masked};
        let in_group = |nsid, grp| {
            let mut n = Arc::into_inner(test_namespace(nsid, 8)).unwrap_or_else(|| unreachable!("just built"));
            n.ana_group = grp;
            Arc::new(n)
        };
        let nss = [in_group(1, 1), in_group(2, 2), in_group(3, 1)];
        let s = test_subsystem_masked(&nss, &[], &[(2, &["nqn.a"]), (3, &["nqn.a"])]);
        let a = Ctrl::new(1, Some(s.clone()), "nqn.a".into(), [0; 16], 0);
        let b = Ctrl::new(2, Some(s), "nqn.b".into(), [0; 16], 0);
        // (group, its NSIDs) of each descriptor (NVMe 2.0 §5.16.1.13, Figure 224).
        let groups = |log: &[u8]| -> Vec<(u32, Vec<u32>)> {
            let dword = |at: usize| u32::from_le_bytes([log[at], log[at + 1], log[at + 2], log[at + 3]]);
            let n = u16::from_le_bytes([log[8], log[9]]);
            let mut at = 16;
            (0..n)
                .map(|_| {
                    let (grp, count) = (dword(at), dword(at + 4) as usize);
                    let ids = (0..count).map(|i| dword(at + 32 + 4 * i)).collect();
                    at += 32 + 4 * count;
                    (grp, ids)
                })
                .collect()
        };
        assert_eq!(groups(&ana_log(&a, false)), [(1, vec![1, 3]), (2, vec![2])]);
        // b sees namespace 1 only: group 2 has none of its namespaces and is left out.
        assert_eq!(groups(&ana_log(&b, false)), [(1, vec![1])]);
    }

    #[test]
    fn error_log_entries_sit_where_the_spec_puts_them() {
        let mut c = Ctrl::new(1, None, "nqn.h".into(), [0; 16], 0);
        for count in [7, 8] {
            c.errors.push_back(super::super::ErrorEntry {
                count,
                sqid: 2,
                cid: 0x1234,
                status: Status::LBA_OUT_OF_RANGE,
                nsid: 5,
                lba: 0x0102_0304_0506_0708,
            });
        }
        let log = error_log(&c);
        assert_eq!(log.len(), 64 * ERROR_LOG_ENTRIES);
        // Newest first (NVMe 2.0 §5.16.1.2, Figure 205).
        let e = &log[..64];
        assert_eq!(e[0..8], 8u64.to_le_bytes());
        assert_eq!(e[8..10], 2u16.to_le_bytes());
        assert_eq!(e[10..12], 0x1234u16.to_le_bytes());
        assert_eq!(e[12..14], Status::LBA_OUT_OF_RANGE.to_cqe_field().to_le_bytes());
        assert_eq!(e[14..16], [0xFF, 0xFF]);
        assert_eq!(e[16..24], 0x0102_0304_0506_0708u64.to_le_bytes());
        assert_eq!(e[24..28], 5u32.to_le_bytes());
        assert_eq!((e[28], e[29]), (0, 3), "TRTYPE: TCP");
        assert!(e[30..].iter().all(|&b| b == 0));
        assert_eq!(log[64..72], 7u64.to_le_bytes());
        assert!(log[128..].iter().all(|&b| b == 0));
    }
}
