//! Admin and fabrics property commands of a controller, as pure functions from the controller
//! state to a [`Reply`]: Identify (base spec §5.17), Get Log Page (§5.16), Get/Set Features
//! (§5.15, §5.27), Property Get/Set (NVMe-oF §6.5, §6.6) and the discovery log (NVMe-oF §5.3).

use std::net::{IpAddr, SocketAddr};

use pollux_conf::DISCOVERY_NQN;
use pollux_nvme::bindings::{nvme_id_ctrl, nvme_id_ns, nvme_smart_log};
use pollux_nvme::spec::{Cap, Cc, Csts, Status, Vs, cns, feature, log_page, opcode, property};
use zerocopy::{FromZeros, IntoBytes};

use crate::ctrl::{AER_LIMIT, Ctrl, ERROR_LOG_ENTRIES};
use crate::subsystem::{Shared, Snapshot};

/// NVMe version this controller reports (as Linux nvmet does).
pub const VERSION: Vs = Vs::V1_3;
/// Keep-alive granularity reported in KAS, in 100 ms units.
pub const KAS_100MS: u16 = 10;
/// Discovery log entries advertise this admin queue size.
pub const ADMIN_QUEUE_SIZE: u16 = 32;

/// The result of a command: status, completion dwords and data for the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// Status.
    pub status: Status,
    /// Completion dword 0.
    pub dw0: u32,
    /// Completion dword 1.
    pub dw1: u32,
    /// Controller-to-host data.
    pub data: Vec<u8>,
}

impl Reply {
    /// Success without data.
    pub fn ok() -> Self {
        Self::dw0(0)
    }
    /// Success with a result dword.
    pub fn dw0(dw0: u32) -> Self {
        Self {
            status: Status::SUCCESS,
            dw0,
            dw1: 0,
            data: Vec::new(),
        }
    }
    /// Success with data.
    pub fn data(data: Vec<u8>) -> Self {
        Self {
            status: Status::SUCCESS,
            dw0: 0,
            dw1: 0,
            data,
        }
    }
    /// An error.
    pub fn err(status: Status) -> Self {
        Self {
            status,
            dw0: 0,
            dw1: 0,
            data: Vec::new(),
        }
    }
}

fn pad_ascii(dst: &mut [u8], s: &str) {
    dst.fill(b' ');
    for (d, c) in dst.iter_mut().zip(s.bytes()) {
        *d = c;
    }
}

fn copy_str(dst: &mut [u8], s: &str) {
    dst.fill(0);
    let n = s.len().min(dst.len().saturating_sub(1));
    dst[..n].copy_from_slice(&s.as_bytes()[..n]);
}

/// MDTS in units of the minimum page size (4 KiB), as a power of two.
pub fn mdts(max_io_size: u32) -> u8 {
    (max_io_size / 4096).max(1).ilog2() as u8
}

/// Identify Controller (CNS 01h), base spec §5.17.2.1, with the fabrics fields of NVMe-oF
/// §4.1 (IOCCSZ, IORCSZ, ICDOFF, FCATT, MSDBD, OFCS).
pub fn identify_controller(ctrl: &Ctrl, shared: &Shared) -> Vec<u8> {
    let t = &shared.transport;
    let mut id = nvme_id_ctrl::new_zeroed();
    let (serial, model, nqn, nn) = match &ctrl.subsys {
        Some(s) => (
            s.serial.as_str(),
            s.model.as_str(),
            s.nqn.as_str(),
            s.namespaces.keys().max().copied().unwrap_or(0).max(1024),
        ),
        None => ("", "pollux discovery", DISCOVERY_NQN, 0),
    };
    pad_ascii(&mut id.sn, serial);
    pad_ascii(&mut id.mn, model);
    pad_ascii(&mut id.fr, env!("CARGO_PKG_VERSION"));
    id.rab = 6;
    // Several hosts may connect to one subsystem: multi-controller (CMIC bit 1).
    id.cmic = if ctrl.is_discovery() { 0 } else { 1 << 1 };
    id.mdts = mdts(t.max_io_size);
    id.cntlid = ctrl.cntlid.to_le();
    id.ver = VERSION.0.to_le();
    // OAES: namespace attribute notices (bit 8), discovery log change notices (bit 31).
    id.oaes = (if ctrl.is_discovery() { 1u32 << 31 } else { 1 << 8 }).to_le();
    id.ctratt = 1u32.to_le(); // 128-bit host identifier
    id.cntrltype = if ctrl.is_discovery() { 2 } else { 1 };
    id.acl = 3;
    id.aerl = (AER_LIMIT - 1) as u8;
    id.frmw = (1 << 1) | 1; // one slot, slot 1 read-only
    id.lpa = (1 << 1) | (1 << 2); // commands supported and effects, extended data
    id.elpe = (ERROR_LOG_ENTRIES - 1) as u8;
    id.kas = KAS_100MS.to_le();
    id.sqes = 0x66;
    id.cqes = 0x44;
    id.maxcmd = (t.io_queue_depth.min(0xFFFF) as u16).to_le();
    id.nn = nn.to_le();
    id.oncs = ((1u16 << 2) | (1 << 3)).to_le(); // Dataset Management, Write Zeroes
    // VWC (base spec §5.17.2.1): files and devices cache writes until a Flush; RAM and the
    // simulated device hold a completed write in the namespace's memory. Bits 2:1 = 10b: a
    // Flush with NSID FFFFFFFFh is not supported (each namespace is flushed by its own).
    id.vwc = if ctrl.subsys.as_ref().is_some_and(|s| s.volatile_cache()) {
        0x1 | (0b10 << 1)
    } else {
        0
    };
    // SGLs supported (bit 0), SGL data block with offset for in-capsule data (bit 20).
    id.sgls = ((1u32 << 0) | (1 << 20)).to_le();
    copy_str(&mut id.subnqn, nqn);
    id.ioccsz = ((64 + t.in_capsule_data_size) / 16).to_le();
    id.iorcsz = 1u32.to_le();
    id.msdbd = 1;
    id.ofcs = 1u16.to_le(); // Disconnect supported
    id.as_bytes().to_vec()
}

/// Identify Namespace (CNS 00h), NVM command set spec §4.1.5.1.
pub fn identify_namespace(ctrl: &Ctrl, nsid: u32) -> Reply {
    let Some(subsys) = &ctrl.subsys else {
        return Reply::err(Status::INVALID_FIELD.with_dnr());
    };
    if nsid == 0 || nsid == u32::MAX {
        return Reply::err(Status::INVALID_NAMESPACE.with_dnr());
    }
    let mut id = nvme_id_ns::new_zeroed();
    // An inactive NSID gets a zero-filled structure (base spec §5.17.2.1).
    if let Some(ns) = subsys.namespace(nsid) {
        id.nsze = ns.blocks.to_le();
        id.ncap = ns.blocks.to_le();
        id.nuse = ns.blocks.to_le();
        id.nlbaf = 0;
        id.flbas = 0;
        id.lbaf[0].ds = ns.block_shift as u8;
        id.nmic = 1; // may be attached to several controllers
        // Deallocated blocks read as zeroes (bits 2:0 = 001b); Write Zeroes may deallocate.
        id.dlfeat = 0x1 | (1 << 3);
        id.nguid = ns.nguid;
        id.eui64 = ns.eui64;
    }
    Reply::data(id.as_bytes().to_vec())
}

/// Active Namespace ID list (CNS 02h): NSIDs greater than `nsid`, ascending, at most 1024.
pub fn active_ns_list(ctrl: &Ctrl, nsid: u32) -> Reply {
    let Some(subsys) = &ctrl.subsys else {
        return Reply::err(Status::INVALID_FIELD.with_dnr());
    };
    if nsid >= 0xFFFF_FFFE {
        return Reply::err(Status::INVALID_NAMESPACE.with_dnr());
    }
    let mut out = vec![0u8; 4096];
    for (slot, id) in subsys.namespaces.keys().filter(|&&n| n > nsid).take(1024).enumerate() {
        out[slot * 4..slot * 4 + 4].copy_from_slice(&id.to_le_bytes());
    }
    Reply::data(out)
}

/// Namespace Identification Descriptor list (CNS 03h), base spec §5.17.2.3.
pub fn ns_id_descriptors(ctrl: &Ctrl, nsid: u32) -> Reply {
    let Some(ns) = ctrl.subsys.as_ref().and_then(|s| s.namespace(nsid)) else {
        return Reply::err(Status::INVALID_NAMESPACE.with_dnr());
    };
    let mut out = Vec::with_capacity(4096);
    let mut push = |nidt: u8, nid: &[u8]| {
        out.extend_from_slice(&[nidt, nid.len() as u8, 0, 0]);
        out.extend_from_slice(nid);
    };
    push(1, &ns.eui64); // IEEE EUI-64
    push(2, &ns.nguid); // NGUID
    push(3, &ns.uuid); // UUID
    push(4, &[0]); // Command Set Identifier: NVM
    out.resize(4096, 0);
    Reply::data(out)
}

/// Identify, by CNS.
pub fn identify(ctrl: &Ctrl, shared: &Shared, cns_value: u8, nsid: u32) -> Reply {
    match cns_value {
        cns::CONTROLLER => Reply::data(identify_controller(ctrl, shared)),
        cns::NAMESPACE if !ctrl.is_discovery() => identify_namespace(ctrl, nsid),
        cns::ACTIVE_NAMESPACE_LIST if !ctrl.is_discovery() => active_ns_list(ctrl, nsid),
        cns::NS_ID_DESCRIPTOR_LIST if !ctrl.is_discovery() => ns_id_descriptors(ctrl, nsid),
        _ => Reply::err(Status::INVALID_FIELD.with_dnr()),
    }
}

fn le128(dst: &mut [u8; 16], v: u64) {
    *dst = u128::from(v).to_le_bytes();
}

/// SMART / Health Information (LID 02h), base spec §5.16.1.3, controller-wide: the sum over
/// the subsystem's namespaces of every reactor's counters.
pub fn smart_log(ctrl: &Ctrl, started: std::time::Instant) -> Vec<u8> {
    let mut log = nvme_smart_log::new_zeroed();
    let (mut rc, mut wc, mut rb, mut wb) = (0u64, 0u64, 0u64, 0u64);
    if let Some(s) = &ctrl.subsys {
        for ns in s.namespaces.values() {
            let t = ns.totals();
            rc += t.read_cmds;
            wc += t.write_cmds;
            rb += t.read_bytes;
            wb += t.write_bytes;
        }
    }
    log.avail_spare = 100;
    log.spare_thresh = 10;
    // Data units are thousands of 512-byte units, rounded up (§5.16.1.3, Figure 207).
    le128(&mut log.data_units_read, (rb / 512).div_ceil(1000));
    le128(&mut log.data_units_written, (wb / 512).div_ceil(1000));
    le128(&mut log.host_reads, rc);
    le128(&mut log.host_writes, wc);
    le128(&mut log.power_cycles, 1);
    le128(&mut log.power_on_hours, started.elapsed().as_secs() / 3600);
    le128(&mut log.num_err_log_entries, ctrl.error_count);
    log.as_bytes().to_vec()
}

/// Error Information (LID 01h): 64-byte entries, newest first.
pub fn error_log(ctrl: &Ctrl) -> Vec<u8> {
    let mut out = vec![0u8; 64 * ERROR_LOG_ENTRIES];
    for (i, e) in ctrl.errors.iter().rev().enumerate() {
        let b = &mut out[i * 64..i * 64 + 64];
        b[0..8].copy_from_slice(&e.count.to_le_bytes());
        b[8..10].copy_from_slice(&e.sqid.to_le_bytes());
        b[10..12].copy_from_slice(&e.cid.to_le_bytes());
        b[12..14].copy_from_slice(&e.status.to_cqe_field().to_le_bytes());
        b[14..16].copy_from_slice(&0xFFFFu16.to_le_bytes()); // parameter error location: n/a
        b[16..24].copy_from_slice(&e.lba.to_le_bytes());
        b[24..28].copy_from_slice(&e.nsid.to_le_bytes());
        b[29] = 3; // transport type: TCP
    }
    out
}

/// Commands Supported and Effects (LID 05h), base spec §5.16.1.6.
pub fn effects_log() -> Vec<u8> {
    use opcode::{admin, io};
    let mut out = vec![0u8; 4096];
    let mut set = |base: usize, op: u8, lbcc: bool| {
        let v: u32 = 1 | if lbcc { 1 << 1 } else { 0 };
        out[base + op as usize * 4..base + op as usize * 4 + 4].copy_from_slice(&v.to_le_bytes());
    };
    for op in [
        admin::GET_LOG_PAGE,
        admin::IDENTIFY,
        admin::ABORT,
        admin::SET_FEATURES,
        admin::GET_FEATURES,
        admin::ASYNC_EVENT_REQUEST,
        admin::KEEP_ALIVE,
    ] {
        set(0, op, false);
    }
    for (op, lbcc) in [
        (io::FLUSH, false),
        (io::WRITE, true),
        (io::READ, false),
        (io::WRITE_ZEROES, true),
        (io::DATASET_MANAGEMENT, true),
    ] {
        set(1024, op, lbcc);
    }
    out
}

/// Firmware Slot Information (LID 03h).
pub fn firmware_log() -> Vec<u8> {
    let mut out = vec![0u8; 512];
    out[0] = 1; // slot 1 active
    pad_ascii(&mut out[8..16], env!("CARGO_PKG_VERSION"));
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

/// The discovery log (LID 70h, NVMe-oF 1.1 §5.3): one entry per subsystem the host may see
/// on each listener. `local` stands in for a listener bound to an unspecified address.
pub fn discovery_log(snapshot: &Snapshot, hostnqn: &str, local: SocketAddr) -> Vec<u8> {
    let visible: Vec<_> = snapshot.subsystems.iter().filter(|s| s.allows(hostnqn)).collect();
    let mut entries = Vec::new();
    for (portid, l) in snapshot.listeners.iter().enumerate() {
        let ip = if l.ip().is_unspecified() { local.ip() } else { l.ip() };
        for s in &visible {
            let mut e = vec![0u8; 1024];
            e[0] = 3; // TRTYPE: TCP
            e[1] = if matches!(ip, IpAddr::V4(_)) { 1 } else { 2 }; // ADRFAM
            e[2] = 2; // SUBTYPE: NVM subsystem
            e[3] = 1 << 2; // TREQ: secure channel not specified; SQ flow control disable supported
            e[4..6].copy_from_slice(&(portid as u16).to_le_bytes());
            e[6..8].copy_from_slice(&0xFFFFu16.to_le_bytes()); // CNTLID: dynamic
            e[8..10].copy_from_slice(&ADMIN_QUEUE_SIZE.to_le_bytes());
            copy_str(&mut e[32..64], &l.port().to_string()); // TRSVCID
            copy_str(&mut e[256..512], &s.nqn);
            copy_str(&mut e[512..768], &ip.to_string());
            // TSAS for TCP: SECTYPE 0 (none), already zero.
            entries.push(e);
        }
    }
    let mut out = vec![0u8; 1024];
    out[0..8].copy_from_slice(&snapshot.genctr.to_le_bytes());
    out[8..16].copy_from_slice(&(entries.len() as u64).to_le_bytes());
    for e in entries {
        out.extend_from_slice(&e);
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

/// Number of Queues result dword: NSQA and NCQA, 0's based (base spec §5.27.1.5).
pub fn queues_dw0(n: u16) -> u32 {
    let z = u32::from(n.max(1) - 1);
    z | (z << 16)
}

/// Get Features.
pub fn get_features(ctrl: &Ctrl, shared: &Shared, fid: u8, cdw11: u32) -> Reply {
    match fid {
        feature::NUMBER_OF_QUEUES => Reply::dw0(queues_dw0(granted_queues(ctrl, shared))),
        feature::KEEP_ALIVE_TIMER => Reply::dw0(ctrl.kato_ms),
        feature::ASYNC_EVENT_CONFIGURATION => Reply::dw0(ctrl.aec),
        feature::VOLATILE_WRITE_CACHE => {
            Reply::dw0(u32::from(ctrl.subsys.as_ref().is_some_and(|s| s.volatile_cache())))
        }
        feature::HOST_IDENTIFIER => {
            // Fabrics use the 128-bit host identifier (EXHID must be set).
            if cdw11 & 1 == 0 {
                Reply::err(Status::INVALID_FIELD.with_dnr())
            } else {
                Reply::data(ctrl.hostid.to_vec())
            }
        }
        _ => Reply::err(Status::INVALID_FIELD.with_dnr()),
    }
}

/// I/O queues a controller may create.
pub fn granted_queues(ctrl: &Ctrl, shared: &Shared) -> u16 {
    if ctrl.io_queues_granted > 0 {
        ctrl.io_queues_granted
    } else {
        shared.transport.max_io_queues.min(0xFFFF) as u16
    }
}

/// What a Set Features changed that the connection must act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FeatureEffect {
    /// Nothing.
    None,
    /// The keep-alive timeout changed: reschedule the check.
    KeepAlive,
}

/// Set Features.
pub fn set_features(ctrl: &mut Ctrl, shared: &Shared, fid: u8, save: bool, cdw11: u32) -> (Reply, FeatureEffect) {
    if save {
        return (Reply::err(Status::FEATURE_NOT_SAVEABLE.with_dnr()), FeatureEffect::None);
    }
    match fid {
        feature::NUMBER_OF_QUEUES if !ctrl.is_discovery() => {
            let (nsqr, ncqr) = (cdw11 & 0xFFFF, cdw11 >> 16);
            if nsqr == 0xFFFF || ncqr == 0xFFFF {
                return (Reply::err(Status::INVALID_FIELD.with_dnr()), FeatureEffect::None);
            }
            let want = (nsqr.min(ncqr) + 1).min(shared.transport.max_io_queues).min(0xFFFF);
            ctrl.io_queues_granted = want as u16;
            (Reply::dw0(queues_dw0(ctrl.io_queues_granted)), FeatureEffect::None)
        }
        feature::KEEP_ALIVE_TIMER => {
            ctrl.kato_ms = shared.keep_alive.clamp(cdw11);
            (Reply::ok(), FeatureEffect::KeepAlive)
        }
        feature::ASYNC_EVENT_CONFIGURATION => {
            ctrl.aec = cdw11;
            (Reply::ok(), FeatureEffect::None)
        }
        // The cache is the kernel's page cache or the device's: it stays on.
        feature::VOLATILE_WRITE_CACHE if ctrl.subsys.as_ref().is_some_and(|s| s.volatile_cache()) => {
            if cdw11 & 1 == 1 {
                (Reply::ok(), FeatureEffect::None)
            } else {
                (
                    Reply::err(Status::FEATURE_NOT_CHANGEABLE.with_dnr()),
                    FeatureEffect::None,
                )
            }
        }
        // Fabrics set the host identifier at Connect (NVMe-oF §6.3).
        feature::HOST_IDENTIFIER => (
            Reply::err(Status::COMMAND_SEQUENCE_ERROR.with_dnr()),
            FeatureEffect::None,
        ),
        _ => (Reply::err(Status::INVALID_FIELD.with_dnr()), FeatureEffect::None),
    }
}

/// The CAP property (base spec §3.1.3.1): MQES, CQR, TO 7.5 s, NVM command set, 4 KiB pages.
pub fn cap(shared: &Shared) -> u64 {
    let mqes = (shared.transport.io_queue_depth.clamp(2, 65536) - 1) as u16;
    Cap(0)
        .with_mqes(mqes)
        .with_cqr(true)
        .with_to(15)
        .with_css(Cap::CSS_NVM)
        .0
}

/// Property Get.
pub fn property_get(ctrl: &Ctrl, shared: &Shared, size8: bool, offset: u32) -> Reply {
    let (value, is8) = match offset {
        property::CAP => (cap(shared), true),
        property::VS => (u64::from(VERSION.0), false),
        property::CC => (u64::from(ctrl.cc), false),
        property::CSTS => (u64::from(ctrl.csts), false),
        _ => return Reply::err(Status::INVALID_FIELD.with_dnr()),
    };
    if size8 != is8 {
        return Reply::err(Status::INVALID_FIELD.with_dnr());
    }
    Reply {
        status: Status::SUCCESS,
        dw0: value as u32,
        dw1: (value >> 32) as u32,
        data: Vec::new(),
    }
}

/// What a Property Set changed that the connection must act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CcEffect {
    /// Nothing beyond the registers.
    None,
    /// Enabled.
    Enabled,
    /// Disabled (reset): I/O queues go away.
    Disabled,
    /// Shutdown requested.
    Shutdown,
}

/// Property Set (only CC is writable): EN 0->1 sets CSTS.RDY if the queue entry sizes, page
/// size and command set are ones we serve, CSTS.CFS otherwise; EN 1->0 resets; SHN sets
/// SHST complete (nothing to flush: completed writes are already in the namespace).
pub fn property_set(ctrl: &mut Ctrl, size8: bool, offset: u32, value: u64) -> (Reply, CcEffect) {
    if offset != property::CC || size8 {
        return (Reply::err(Status::INVALID_FIELD.with_dnr()), CcEffect::None);
    }
    let old = Cc(ctrl.cc);
    let new = Cc(value as u32);
    ctrl.cc = new.0;
    let mut csts = Csts(ctrl.csts);
    let mut effect = CcEffect::None;
    if new.en() && !old.en() {
        let ok = new.iosqes() == 6 && new.iocqes() == 4 && new.mps() == 0 && new.css() == Cc::CSS_NVM;
        csts = if ok { csts.with_rdy(true) } else { csts.with_cfs(true) };
        if ok {
            effect = CcEffect::Enabled;
        }
    } else if !new.en() && old.en() {
        csts = csts.with_rdy(false).with_cfs(false).with_shst(Csts::SHST_NORMAL);
        effect = CcEffect::Disabled;
    }
    if new.shn() != Cc::SHN_NONE && old.shn() == Cc::SHN_NONE {
        csts = csts.with_shst(Csts::SHST_COMPLETE);
        effect = CcEffect::Shutdown;
    } else if new.shn() == Cc::SHN_NONE && old.shn() != Cc::SHN_NONE {
        csts = csts.with_shst(Csts::SHST_NORMAL);
    }
    ctrl.csts = csts.0;
    (Reply::ok(), effect)
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
}

/// Get Log Page for a controller: page `lid`, `len` bytes from byte `offset`.
pub fn get_log_page(ctrl: &mut Ctrl, env: &LogEnv<'_>, lid: u8, rae: bool, offset: u64, len: u32) -> Reply {
    let log = match lid {
        log_page::DISCOVERY if ctrl.is_discovery() => discovery_log(env.snapshot, &ctrl.hostnqn, env.local),
        log_page::ERROR => error_log(ctrl),
        log_page::SMART if !ctrl.is_discovery() => smart_log(ctrl, env.started),
        log_page::FIRMWARE_SLOT if !ctrl.is_discovery() => firmware_log(),
        log_page::CHANGED_NAMESPACE_LIST if !ctrl.is_discovery() => changed_ns_log(ctrl, rae),
        log_page::COMMANDS_SUPPORTED_AND_EFFECTS if !ctrl.is_discovery() => effects_log(),
        _ => return Reply::err(Status::INVALID_LOG_PAGE.with_dnr()),
    };
    log_slice(log, offset, len)
}
