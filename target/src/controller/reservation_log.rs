//! A controller's side of reservations (NVMe 2.0 §8.19): its Reservation Notification log
//! (LID 80h, §5.16.1.25) and the asynchronous event that announces it, and the Reservation
//! Notification Mask feature (82h, §5.27.1.21) that filters it, per namespace. The
//! reservations themselves are the namespace's ([`crate::resv`]).

use std::collections::{BTreeMap, VecDeque};

use pollux_nvme::spec::resv::{notice, notification_page};

/// AER completion dword 0 (NVMe 2.0 §5.2, Figure 148): I/O Command Specific Status (type
/// 6h), Reservation Log Page Available (info 00h), log page 80h.
pub const AER_RESERVATION_LOG: u32 = 0x6 | (0x80 << 16);

/// Notifications a controller keeps unread at most; beyond, new ones are lost but still
/// counted (the log page count skips, so the host sees the gap).
pub const RESV_LOG_ENTRIES: usize = 64;

/// One unread notification.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Notice {
    count: u64,
    typ: u8,
    nsid: u32,
}

/// A controller's Reservation Notification log and mask.
#[derive(Debug, Default, Clone, serde::Serialize, serde::Deserialize)]
pub struct ResvLog {
    unread: VecDeque<Notice>,
    /// Log page count of the last notification (0: none yet).
    count: u64,
    /// An event was raised and the host has not read the page since (NVMe 2.0 §5.2.1).
    masked: bool,
    /// The mask set for every namespace (NSID FFFFFFFFh).
    mask_all: u32,
    /// Masks set for one namespace.
    masks: BTreeMap<u32, u32>,
}

impl ResvLog {
    /// The notification mask of namespace `nsid` (bits 3:1).
    pub fn mask(&self, nsid: u32) -> u32 {
        self.masks.get(&nsid).copied().unwrap_or(self.mask_all)
    }

    /// Set the mask of `nsid`, or of every namespace (FFFFFFFFh).
    pub fn set_mask(&mut self, nsid: u32, mask: u32) {
        let mask = mask & notice::MASK_ALL;
        if nsid == u32::MAX {
            self.mask_all = mask;
            self.masks.clear();
        } else {
            self.masks.insert(nsid, mask);
        }
    }

    /// Record a notification of type `typ` about `nsid` unless masked: whether to raise the
    /// asynchronous event (none while one is unread).
    pub fn push(&mut self, typ: u8, nsid: u32) -> bool {
        if self.mask(nsid) & (1 << typ) != 0 {
            return false;
        }
        self.count = match self.count.wrapping_add(1) {
            0 => 1,
            n => n,
        };
        if self.unread.len() < RESV_LOG_ENTRIES {
            self.unread.push_back(Notice {
                count: self.count,
                typ,
                nsid,
            });
        }
        !std::mem::replace(&mut self.masked, true)
    }

    /// The log page: the oldest unread notification, taken; an empty page (count 0) when
    /// none is. Read without RAE, events are unmasked.
    pub fn read(&mut self, rae: bool) -> Vec<u8> {
        if !rae {
            self.masked = false;
        }
        match self.unread.pop_front() {
            Some(n) => notification_page(n.count, n.typ, self.unread.len().min(255) as u8, n.nsid),
            None => notification_page(0, 0, 0, 0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notifications_queue_in_order_and_one_event_announces_them() {
        let mut l = ResvLog::default();
        assert!(l.push(notice::REGISTRATION_PREEMPTED, 1), "the first raises an event");
        assert!(!l.push(notice::RESERVATION_RELEASED, 2), "masked until read");
        let p = l.read(false);
        assert_eq!(
            (&p[0..8], p[8], p[9], &p[12..16]),
            (&1u64.to_le_bytes()[..], 1, 1, &1u32.to_le_bytes()[..])
        );
        let p = l.read(false);
        assert_eq!((p[0], p[8], p[9], p[12]), (2, 2, 0, 2));
        assert_eq!(l.read(false)[8], 0, "empty");
        assert!(l.push(notice::RESERVATION_PREEMPTED, 1), "unmasked by the read");
    }

    #[test]
    fn the_mask_filters_per_namespace_and_lost_notices_leave_a_gap() {
        let mut l = ResvLog::default();
        l.set_mask(u32::MAX, 1 << notice::RESERVATION_RELEASED);
        l.set_mask(3, 0);
        assert!(!l.push(notice::RESERVATION_RELEASED, 1));
        assert_eq!(l.mask(3), 0);
        assert!(l.push(notice::RESERVATION_RELEASED, 3));
        for _ in 0..RESV_LOG_ENTRIES + 5 {
            l.push(notice::REGISTRATION_PREEMPTED, 3);
        }
        let mut last = 0;
        for _ in 0..RESV_LOG_ENTRIES {
            let p = l.read(true);
            last = u64::from_le_bytes(p[0..8].try_into().unwrap_or_default());
        }
        assert_eq!(last, RESV_LOG_ENTRIES as u64, "kept the oldest");
        l.push(notice::REGISTRATION_PREEMPTED, 3);
        let p = l.read(false);
        assert_eq!(
            u64::from_le_bytes(p[0..8].try_into().unwrap_or_default()),
            RESV_LOG_ENTRIES as u64 + 7
        );
    }
}
