//! Controllers: the state of an admin queue and what its I/O queues need from it (SPDK:
//! `ctrlr.c`). Fabrics commands and queue creation are in [`connect`], admin commands,
//! features and properties in [`admin`], what a command answers in [`reply`], log pages in [`log`], the discovery log in
//! [`discovery`]. Everything here is controller state and decisions, without sockets or
//! reactors: the NVMe-oF queue ([`crate::queue`]) applies them.
//!
//! A controller lives inside its admin queue's connection, on that connection's reactor. Its
//! I/O queues may be on other reactors; they reach it by message (connect, disconnect, abort,
//! errors) and it reaches them the same way (teardown). The controller id encodes the reactor
//! that owns it (`(cntlid - 1) % reactors`), so no shared registry or lock is needed to find
//! it.

pub mod admin;
pub mod auth;
pub mod connect;
pub mod discovery;
pub mod features;
pub mod log;
pub mod property;
pub mod reply;
pub mod reservation_log;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::RangeInclusive;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pollux_nvme::spec::{Health, Status};
use pollux_reactor::{SourceId, TimerId};
use tracing::{info, warn};

use crate::ana::AnaStates;
use crate::close::CloseReason;
use crate::subsystem::{HostView, Snapshot, Subsystem};

/// Largest controller id (NVMe-oF 1.1 §4.2: FFF0h..FFFFh are reserved).
pub const MAX_CNTLID: u32 = pollux_conf::MAX_CNTLID as u32;
/// Outstanding AERs allowed (Identify Controller AERL is 0's based).
pub const AER_LIMIT: usize = 4;
/// Error log entries kept (Identify Controller ELPE is 0's based).
pub const ERROR_LOG_ENTRIES: usize = 64;

/// Where one of a controller's I/O queues lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueRef {
    /// Reactor of the connection.
    pub reactor: usize,
    /// Its source id there.
    pub source: SourceId,
    /// Its connection serial (guards against source id reuse).
    pub serial: u64,
}

/// One error log entry (NVMe 2.0 §5.16.1.2), kept compact.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorEntry {
    /// Error count at the time (unique, increasing).
    pub count: u64,
    /// Queue.
    pub sqid: u16,
    /// Command id.
    pub cid: u16,
    /// Status field (without phase).
    pub status: Status,
    /// Namespace.
    pub nsid: u32,
    /// First LBA of the command, if any.
    pub lba: u64,
}

/// A controller (I/O or discovery).
#[derive(Debug)]
pub struct Ctrl {
    /// Controller id.
    pub cntlid: u16,
    /// The subsystem as its host sees it (None: the discovery controller): every NSID a
    /// command names resolves through it ([`HostView::namespace`]).
    pub subsys: Option<HostView>,
    /// Host NQN from Connect.
    pub hostnqn: String,
    /// Host identifier from Connect.
    pub hostid: [u8; 16],
    /// Controller Configuration property.
    pub cc: u32,
    /// Controller Status property.
    pub csts: u32,
    /// Keep-alive timeout in ms (0: disabled).
    pub kato_ms: u32,
    /// Last keep-alive (or connect).
    pub last_keep_alive: Instant,
    /// The pending keep-alive check.
    pub ka_timer: Option<TimerId>,
    /// I/O queues granted by Set Features Number of Queues (0: not negotiated yet).
    pub io_queues_granted: u16,
    /// Asynchronous Event Configuration.
    pub aec: u32,
    /// Outstanding AER command ids.
    pub aers: VecDeque<u16>,
    /// Events waiting for an AER (completion dword 0).
    pub events: VecDeque<u32>,
    /// Connected I/O queues by qid.
    pub io_queues: BTreeMap<u16, QueueRef>,
    /// Error log, newest last.
    pub errors: VecDeque<ErrorEntry>,
    /// Errors ever logged.
    pub error_count: u64,
    /// Namespaces changed since the log was last read.
    pub changed_ns: Vec<u32>,
    /// Changeable feature values (Set Features).
    pub features: features::Features,
    /// Critical Warning bits already reported by a SMART event (a bit that clears may be
    /// reported again).
    pub smart_reported: u8,
    /// A SMART event was reported and the host has not read the SMART / Health page since
    /// (NVMe 2.0 §5.2.1: events of that type are masked until it does).
    pub smart_masked: bool,
    /// The pending health check.
    pub health_timer: Option<TimerId>,
    /// How the admin queue last authenticated (DH-HMAC-CHAP: "sha384/ffdhe2048", "+ctrl"
    /// when bidirectional); None: it did not need to.
    pub authenticated: Option<String>,
    /// The ANA states of the listener the admin queue connected through (its port).
    pub ana: Arc<AnaStates>,
    /// The ANA Change Count the host was last told about (an event) or read (the page).
    pub ana_seen: u64,
    /// An ANA change event was reported and the host has not read the ANA page since.
    pub ana_masked: bool,
    /// Reservation notifications and their mask.
    pub resv_log: reservation_log::ResvLog,
    /// Created at.
    pub created: Instant,
}

impl Ctrl {
    /// A new, disabled controller of host `hostnqn` on `subsys`.
    pub fn new(cntlid: u16, subsys: Option<Arc<Subsystem>>, hostnqn: String, hostid: [u8; 16], kato_ms: u32) -> Self {
        let now = Instant::now();
        Self {
            cntlid,
            subsys: subsys.map(|s| HostView::new(s, &hostnqn)),
            hostnqn,
            hostid,
            cc: 0,
            csts: 0,
            kato_ms,
            last_keep_alive: now,
            ka_timer: None,
            io_queues_granted: 0,
            aec: 0,
            aers: VecDeque::new(),
            events: VecDeque::new(),
            io_queues: BTreeMap::new(),
            errors: VecDeque::new(),
            error_count: 0,
            changed_ns: Vec::new(),
            features: features::Features::default(),
            smart_reported: 0,
            smart_masked: false,
            health_timer: None,
            authenticated: None,
            ana: Arc::new(AnaStates::default()),
            ana_seen: 1,
            ana_masked: false,
            resv_log: reservation_log::ResvLog::default(),
            created: now,
        }
    }

    /// The controller's port's ANA states.
    pub fn set_ana(&mut self, ana: Arc<AnaStates>) {
        self.ana_seen = ana.chgcnt();
        self.ana = ana;
    }

    /// A discovery controller.
    pub fn is_discovery(&self) -> bool {
        self.subsys.is_none()
    }

    /// CC.EN and CSTS.RDY are set.
    pub fn ready(&self) -> bool {
        self.csts & 1 != 0
    }

    /// Log a failed command in the error log.
    pub fn log_error(&mut self, sqid: u16, cid: u16, status: Status, nsid: u32, lba: u64) {
        self.error_count += 1;
        if self.errors.len() == ERROR_LOG_ENTRIES {
            self.errors.pop_front();
        }
        self.errors.push_back(ErrorEntry {
            count: self.error_count,
            sqid,
            cid,
            status,
            nsid,
            lba,
        });
    }
}

/// AER completion dword 0 of a SMART / Health status event (type 1, NVMe 2.0 §5.2, Figure
/// 147) for Critical Warning bits `bits`, log page 02h: the most severe cause first
/// (reliability 00h, temperature threshold 01h, spare below threshold 02h).
pub fn aer_smart(bits: u8) -> u32 {
    use pollux_nvme::spec::critical_warning as cw;
    let info: u32 = if bits & (cw::RELIABILITY | cw::READ_ONLY | cw::VOLATILE_BACKUP | cw::PMR_READ_ONLY) != 0 {
        0x00
    } else if bits & cw::TEMPERATURE != 0 {
        0x01
    } else {
        0x02
    };
    0x1 | (info << 8) | (u32::from(pollux_nvme::spec::log_page::SMART) << 16)
}
/// AER completion dword 0 (NVMe 2.0 §5.2, Figures 146-148): Notice (type 2), Namespace
/// Attribute Changed (info 00h, so bits 15:8 are zero), log page Changed Namespace List (04h).
pub const AER_NS_ATTR_CHANGED: u32 = 0x2 | (0x04 << 16);
/// Notice, Discovery Log Page Change (info F0h), log page Discovery (70h) (NVMe-oF 1.1 §5.3).
pub const AER_DISCOVERY_CHANGED: u32 = 0x2 | (0xF0 << 8) | (0x70 << 16);
/// Notice, Asymmetric Namespace Access Change (info 03h), log page ANA (0Ch) (NVMe 2.0 §5.2).
pub const AER_ANA_CHANGED: u32 = 0x2 | (0x03 << 8) | (0x0C << 16);

/// What a controller does about a new snapshot of the subsystems.
#[derive(Debug)]
pub enum SubsystemUpdate {
    /// Nothing changed for it.
    Unchanged,
    /// It must go: its subsystem is gone or its host no longer allowed.
    Delete(CloseReason),
    /// Its subsystem, or what its host sees of it, changed: its I/O queues must get the
    /// new view.
    Changed(HostView),
}

impl Ctrl {
    /// The subsystems changed (a new snapshot was swapped in): record the changed
    /// namespaces and queue the asynchronous event the host enabled (masked while one of
    /// the kind is pending), or say the controller must go.
    pub fn update_subsystem(&mut self, snap: &Snapshot, discovery_changed: bool) -> SubsystemUpdate {
        let mut event = None;
        let mut update = SubsystemUpdate::Unchanged;
        match self.subsys.clone() {
            None => {
                if discovery_changed && self.aec & (1 << 31) != 0 {
                    event = Some(AER_DISCOVERY_CHANGED);
                }
            }
            Some(old) => {
                let Some(new) = snap.subsystem(&old.nqn).cloned() else {
                    return SubsystemUpdate::Delete(CloseReason::SubsystemRemoved);
                };
                if !new.allows(&self.hostnqn) {
                    return SubsystemUpdate::Delete(CloseReason::HostNotAllowed);
                }
                self.check_ana();
                if Arc::ptr_eq(&new, old.subsystem()) {
                    return SubsystemUpdate::Unchanged;
                }
                let new = HostView::new(new, &self.hostnqn);
                // What changed for this host: namespaces added or removed, attached to it or
                // detached from it (host masking, NVMe 2.0 §5.16.1.5), or replaced. One
                // whose mask changed without concerning this host is not its news.
                let mut changed: Vec<u32> = old
                    .all_namespaces()
                    .chain(new.all_namespaces())
                    .map(|n| n.nsid)
                    .collect();
                changed.sort_unstable();
                changed.dedup();
                changed.retain(|nsid| match (old.namespace(*nsid), new.namespace(*nsid)) {
                    (Some(a), Some(b)) => !Arc::ptr_eq(a, b),
                    (None, None) => false,
                    _ => true,
                });
                event = self.note_changed_namespaces(&changed);
                if !changed.is_empty() {
                    info!(cntlid = self.cntlid, changed = ?changed, "controller sees a changed subsystem");
                }
                self.subsys = Some(new.clone());
                update = SubsystemUpdate::Changed(new);
            }
        }
        if let Some(ev) = event
            && !self.events.contains(&ev)
        {
            self.events.push_back(ev);
        }
        update
    }

    /// Namespaces `changed` (added, removed, or their attributes, such as the size, changed):
    /// listed in the Changed Namespace List log; the Namespace Attribute Changed event, if
    /// the host enabled it (AEC bit 8, NVMe 2.0 §5.27.1.3).
    fn note_changed_namespaces(&mut self, changed: &[u32]) -> Option<u32> {
        if changed.is_empty() {
            return None;
        }
        for nsid in changed {
            if !self.changed_ns.contains(nsid) {
                self.changed_ns.push(*nsid);
            }
        }
        (self.aec & (1 << 8) != 0).then_some(AER_NS_ATTR_CHANGED)
    }

    /// Namespace `nsid` of this controller's subsystem changed in place (its size): the
    /// host is told as for any namespace change.
    pub fn namespace_changed(&mut self, nsid: u32) {
        if self.subsys.as_ref().is_none_or(|s| s.namespace(nsid).is_none()) {
            return;
        }
        if let Some(ev) = self.note_changed_namespaces(&[nsid])
            && !self.events.contains(&ev)
        {
            self.events.push_back(ev);
        }
        info!(cntlid = self.cntlid, nsid, "controller sees a changed namespace");
    }

    /// The port's ANA states changed since the host last heard: queue an ANA change event if
    /// it enabled them (AEC bit 11) and none is unread (NVMe 2.0 §5.2.1: masked until it
    /// reads the ANA page without RAE).
    pub fn check_ana(&mut self) {
        let now = self.ana.chgcnt();
        if now == self.ana_seen || self.aec & (1 << 11) == 0 || self.ana_masked {
            return;
        }
        self.ana_seen = now;
        self.ana_masked = true;
        info!(cntlid = self.cntlid, chgcnt = now, "ANA change event raised");
        self.events.push_back(AER_ANA_CHANGED);
    }

    /// The subsystem's health now reads `h` (host temperature included): queue a SMART /
    /// Health event for Critical Warning bits newly set that the host enabled (AEC bits 7:0,
    /// NVMe 2.0 §5.27.1.7), unless one is already reported and unread. Whether one was queued.
    pub fn check_health(&mut self, h: &Health) -> bool {
        let warning = crate::health::warning(h, self.features.temp_over, self.features.temp_under);
        // A bit that cleared may be reported again when it sets again.
        self.smart_reported &= warning;
        let fresh = warning & !self.smart_reported & (self.aec & 0xFF) as u8;
        if fresh == 0 || self.smart_masked {
            return false;
        }
        self.smart_reported |= fresh;
        self.smart_masked = true;
        let ev = aer_smart(fresh);
        warn!(
            cntlid = self.cntlid,
            critical_warning = format_args!("{warning:#04x}"),
            "SMART / Health event raised"
        );
        self.events.push_back(ev);
        true
    }

    /// A reservation notification of type `typ` about namespace `nsid` (NVMe 2.0 §8.19.3):
    /// into the log, and an event when none is unread.
    pub fn reservation_notice(&mut self, typ: u8, nsid: u32) {
        if self.resv_log.push(typ, nsid) {
            self.events.push_back(reservation_log::AER_RESERVATION_LOG);
        }
    }

    /// Pair held AERs with queued events: (AER command id, completion dword 0) to complete.
    pub fn ready_events(&mut self) -> Vec<(u16, u32)> {
        let mut done = Vec::new();
        while !self.aers.is_empty() && !self.events.is_empty() {
            if let (Some(cid), Some(ev)) = (self.aers.pop_front(), self.events.pop_front()) {
                done.push((cid, ev));
            }
        }
        done
    }

    /// Abort a held AER (the only commands ever pending on the admin queue): whether `cid`
    /// was one.
    pub fn abort_aer(&mut self, cid: u16) -> bool {
        match self.aers.iter().position(|&c| c == cid) {
            Some(pos) => {
                self.aers.remove(pos);
                true
            }
            None => false,
        }
    }

    /// When the keep-alive timer expires (NVMe 2.0 §3.9): None when KATO is 0 (disabled).
    pub fn keep_alive_deadline(&self) -> Option<Instant> {
        (self.kato_ms != 0).then(|| self.last_keep_alive + Duration::from_millis(u64::from(self.kato_ms)))
    }
}

/// Per-reactor registry of the controllers it owns, and its controller id sequence.
#[derive(Debug, Default)]
pub struct Local {
    /// Controller id -> its admin connection.
    pub ctrls: HashMap<u16, QueueRef>,
    next_seq: u32,
}

/// The controller ids a discovery controller may get: all of them.
pub const FULL_CNTLID_RANGE: RangeInclusive<u16> = 1..=MAX_CNTLID as u16;

impl Local {
    /// Allocate a controller id in `range` owned by `reactor` (of `n`): ids with
    /// `(id - 1) % n == reactor`, so an I/O queue's Connect finds its controller's reactor
    /// from the id alone ([`owner_of`]). Ids are unique among this reactor's controllers
    /// (so across the target); taken in turn, so a freed id is not reused at once. None:
    /// every such id in `range` is in use (or there is none).
    pub fn alloc_cntlid(&mut self, reactor: usize, n: usize, range: RangeInclusive<u16>) -> Option<u16> {
        let (n, r) = (n.max(1) as u32, reactor as u32);
        let lo = u32::from(*range.start()).max(1);
        let hi = u32::from(*range.end()).min(MAX_CNTLID);
        if lo > hi || r >= n {
            return None;
        }
        // Ids owned by the reactor: k * n + r + 1 for k in first..=last.
        let first = (lo - 1).saturating_sub(r).div_ceil(n);
        let last = (hi - 1).checked_sub(r)? / n;
        let slots = (last + 1).checked_sub(first)?;
        for _ in 0..slots {
            let seq = first + self.next_seq % slots;
            self.next_seq = self.next_seq.wrapping_add(1);
            // At most MAX_CNTLID, so it fits u16.
            let id = (seq * n + r + 1) as u16;
            if !self.ctrls.contains_key(&id) {
                return Some(id);
            }
        }
        None
    }
}

/// The reactor that owns controller `cntlid`.
pub fn owner_of(cntlid: u16, reactors: usize) -> usize {
    (usize::from(cntlid).saturating_sub(1)) % reactors.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::subsystem::{Namespace, test_namespace, test_subsystem};

    fn ns(nsid: u32) -> Arc<Namespace> {
        test_namespace(nsid, 8)
    }

    fn snapshot(subsystems: Vec<Arc<Subsystem>>) -> Snapshot {
        Snapshot::new(subsystems, Vec::new(), 1, Default::default(), Vec::new())
    }

    #[test]
    fn a_changed_subsystem_records_its_namespaces_and_raises_one_event() {
        let one = ns(1);
        let old = test_subsystem(std::slice::from_ref(&one), &[]);
        let mut c = Ctrl::new(1, Some(old.clone()), "nqn.h".into(), [0; 16], 0);
        // Unchanged: the same subsystem object.
        assert!(matches!(
            c.update_subsystem(&snapshot(vec![old.clone()]), false),
            SubsystemUpdate::Unchanged
        ));
        // Namespace 2 added, namespace 1 kept: only 2 changed; no event until AEC enables it.
        let new = test_subsystem(&[one.clone(), ns(2)], &[]);
        assert!(matches!(
            c.update_subsystem(&snapshot(vec![new.clone()]), false),
            SubsystemUpdate::Changed(_)
        ));
        assert_eq!(c.changed_ns, vec![2]);
        assert!(c.events.is_empty());
        c.aec = 1 << 8;
        let newer = test_subsystem(&[one, ns(3)], &[]);
        c.update_subsystem(&snapshot(vec![newer.clone()]), false);
        assert_eq!(c.changed_ns, vec![2, 3]);
        assert_eq!(c.events, [AER_NS_ATTR_CHANGED]);
        // Masked while pending: a second change queues no second event.
        c.update_subsystem(&snapshot(vec![test_subsystem(&[ns(4)], &[])]), false);
        assert_eq!(c.events.len(), 1);
        // A held AER takes it.
        c.aers.push_back(9);
        assert_eq!(c.ready_events(), vec![(9, AER_NS_ATTR_CHANGED)]);
        assert!(c.ready_events().is_empty());
    }

    #[test]
    fn a_mask_change_is_news_only_to_the_controllers_whose_view_changed() {
        use crate::subsystem::test_subsystem_masked;
        let (one, two) = (ns(1), ns(2));
        let both = [one.clone(), two.clone()];
        let ctrl = |id, host: &str, s: &Arc<Subsystem>| {
            let mut c = Ctrl::new(id, Some(s.clone()), host.into(), [0; 16], 0);
            c.aec = 1 << 8;
            c
        };
        let only_a = test_subsystem_masked(&both, &[], &[(2, &["nqn.a"])]);
        let (mut a, mut b, mut c) = (
            ctrl(1, "nqn.a", &only_a),
            ctrl(2, "nqn.b", &only_a),
            ctrl(3, "nqn.c", &only_a),
        );
        let sees = |x: &Ctrl, nsid| x.subsys.as_ref().is_some_and(|v| v.namespace(nsid).is_some());
        assert!(sees(&a, 2) && !sees(&b, 2) && !sees(&c, 2));
        assert!(sees(&b, 1));

        // Attached to b too: b hears of namespace 2, a and c hear nothing but take the view.
        let a_and_b = test_subsystem_masked(&both, &[], &[(2, &["nqn.a", "nqn.b"])]);
        let snap = snapshot(vec![a_and_b]);
        for x in [&mut a, &mut b, &mut c] {
            assert!(matches!(x.update_subsystem(&snap, false), SubsystemUpdate::Changed(_)));
        }
        assert!(sees(&b, 2) && !sees(&c, 2));
        assert_eq!(b.changed_ns, vec![2]);
        assert_eq!(b.events, [AER_NS_ATTR_CHANGED]);
        assert!(a.changed_ns.is_empty() && a.events.is_empty());
        assert!(c.changed_ns.is_empty() && c.events.is_empty());

        // Detached from a (attached to b only): a hears of it and loses it.
        let only_b = test_subsystem_masked(&both, &[], &[(2, &["nqn.b"])]);
        let snap = snapshot(vec![only_b]);
        for x in [&mut a, &mut b, &mut c] {
            x.update_subsystem(&snap, false);
        }
        assert!(!sees(&a, 2) && sees(&b, 2));
        assert_eq!(a.changed_ns, vec![2]);
        assert_eq!(a.events, [AER_NS_ATTR_CHANGED]);
        assert_eq!(b.events.len(), 1, "b's view did not change again");
        assert!(c.events.is_empty());

        // Unmasked: every host has it; only those that lacked it are told.
        let open = test_subsystem(&both, &[]);
        let snap = snapshot(vec![open]);
        for x in [&mut a, &mut b, &mut c] {
            x.update_subsystem(&snap, false);
        }
        assert!(sees(&a, 2) && sees(&b, 2) && sees(&c, 2));
        assert_eq!(c.changed_ns, vec![2]);
        assert_eq!(b.changed_ns, vec![2], "already listed once");

        // A resize of a namespace a host does not see is not its news.
        let mut d = ctrl(4, "nqn.d", &only_a_again(&both));
        d.namespace_changed(2);
        assert!(d.changed_ns.is_empty() && d.events.is_empty());
        d.namespace_changed(1);
        assert_eq!(d.changed_ns, vec![1]);
    }

    fn only_a_again(both: &[Arc<Namespace>]) -> Arc<Subsystem> {
        crate::subsystem::test_subsystem_masked(both, &[], &[(2, &["nqn.a"])])
    }

    #[test]
    fn a_controller_goes_with_its_subsystem_or_its_host() {
        let s = test_subsystem(&[ns(1)], &["nqn.h"]);
        let mut c = Ctrl::new(1, Some(s), "nqn.h".into(), [0; 16], 0);
        assert!(matches!(
            c.update_subsystem(&snapshot(vec![]), false),
            SubsystemUpdate::Delete(CloseReason::SubsystemRemoved)
        ));
        let other = test_subsystem(&[ns(1)], &["nqn.other"]);
        assert!(matches!(
            c.update_subsystem(&snapshot(vec![other]), false),
            SubsystemUpdate::Delete(CloseReason::HostNotAllowed)
        ));
    }

    #[test]
    fn a_discovery_controller_hears_of_discovery_changes_when_it_asked() {
        let mut c = Ctrl::new(1, None, "nqn.h".into(), [0; 16], 0);
        c.update_subsystem(&snapshot(vec![]), true);
        assert!(c.events.is_empty());
        c.aec = 1 << 31;
        c.update_subsystem(&snapshot(vec![]), true);
        c.update_subsystem(&snapshot(vec![]), true);
        assert_eq!(c.events, [AER_DISCOVERY_CHANGED]);
        // Abort of a held AER.
        c.aers.push_back(5);
        assert!(c.abort_aer(5));
        assert!(!c.abort_aer(5));
    }

    #[test]
    fn the_keep_alive_deadline_is_kato_after_the_last_keep_alive() {
        let mut c = Ctrl::new(1, None, "nqn.h".into(), [0; 16], 0);
        assert_eq!(c.keep_alive_deadline(), None);
        c.kato_ms = 1500;
        assert_eq!(
            c.keep_alive_deadline(),
            Some(c.last_keep_alive + Duration::from_millis(1500))
        );
    }

    #[test]
    fn cntlids_encode_their_reactor_and_are_unique() {
        let mut l = Local::default();
        let mut seen = std::collections::HashSet::new();
        for _ in 0..1000 {
            let id = l
                .alloc_cntlid(1, 3, FULL_CNTLID_RANGE)
                .unwrap_or_else(|| panic!("ran out"));
            assert_eq!(owner_of(id, 3), 1);
            assert!((1..=MAX_CNTLID as u16).contains(&id));
            l.ctrls.insert(
                id,
                QueueRef {
                    reactor: 1,
                    source: 0,
                    serial: 0,
                },
            );
            assert!(seen.insert(id));
        }
    }

    #[test]
    fn cntlid_space_exhaustion_is_reported() {
        let mut l = Local::default();
        let mut n = 0;
        while let Some(id) = l.alloc_cntlid(0, 1, FULL_CNTLID_RANGE) {
            l.ctrls.insert(
                id,
                QueueRef {
                    reactor: 0,
                    source: 0,
                    serial: 0,
                },
            );
            n += 1;
        }
        assert_eq!(n, MAX_CNTLID);
    }

    fn fill(l: &mut Local, reactor: usize, n: usize, range: RangeInclusive<u16>) -> Vec<u16> {
        let mut got = Vec::new();
        while let Some(id) = l.alloc_cntlid(reactor, n, range.clone()) {
            l.ctrls.insert(
                id,
                QueueRef {
                    reactor,
                    source: 0,
                    serial: 0,
                },
            );
            got.push(id);
        }
        got.sort_unstable();
        got
    }

    #[test]
    fn a_range_gives_each_reactor_exactly_its_ids_in_it() {
        for n in 1..=5usize {
            for (lo, hi) in [(1u16, 1u16), (1, 10), (7, 23), (100, 100), (65_500, 65_519), (30, 29)] {
                let mut l = Local::default();
                let mut all = Vec::new();
                for r in 0..n {
                    let got = fill(&mut l, r, n, lo..=hi);
                    let want: Vec<u16> = (lo..=hi).filter(|id| owner_of(*id, n) == r).collect();
                    assert_eq!(got, want, "reactor {r} of {n}, range {lo}..={hi}");
                    all.extend(got);
                }
                all.sort_unstable();
                let every: Vec<u16> = (lo..=hi).collect();
                assert_eq!(all, every, "{n} reactors share {lo}..={hi} out");
            }
        }
    }

    #[test]
    fn ranges_share_one_registry_without_duplicates() {
        // Two subsystems' ranges on one reactor: a default-range one takes ids in the other's
        // range too, but never an id in use.
        let mut l = Local::default();
        let small = fill(&mut l, 0, 2, 11..=20);
        assert_eq!(small, [11, 13, 15, 17, 19]);
        assert_eq!(l.alloc_cntlid(0, 2, 11..=20), None, "exhausted");
        let mut seen: std::collections::HashSet<u16> = small.iter().copied().collect();
        for _ in 0..50 {
            let id = l
                .alloc_cntlid(0, 2, FULL_CNTLID_RANGE)
                .unwrap_or_else(|| panic!("ran out"));
            assert!(seen.insert(id), "{id} handed out twice");
            l.ctrls.insert(
                id,
                QueueRef {
                    reactor: 0,
                    source: 0,
                    serial: 0,
                },
            );
        }
        // A freed id of the small range is found again.
        l.ctrls.remove(&15);
        assert_eq!(l.alloc_cntlid(0, 2, 11..=20), Some(15));
    }
}
