//! Controllers: the state of an admin queue and what its I/O queues need from it.
//!
//! A controller lives inside its admin queue's connection, on that connection's reactor. Its
//! I/O queues may be on other reactors; they reach it by message (connect, disconnect, abort,
//! errors) and it reaches them the same way (teardown). The controller id encodes the reactor
//! that owns it (`(cntlid - 1) % reactors`), so no shared registry or lock is needed to find
//! it.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use pollux_nvme::spec::Status;
use pollux_reactor::{SourceId, TimerId};

use crate::subsystem::Subsystem;

/// Largest controller id (NVMe-oF 1.1 §4.2: FFF0h..FFFFh are reserved).
pub const MAX_CNTLID: u32 = 0xFFEF;
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

/// One error log entry (base spec §5.16.1.2), kept compact.
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
    /// The subsystem (None: the discovery controller).
    pub subsys: Option<Arc<Subsystem>>,
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
    /// Created at.
    pub created: Instant,
}

impl Ctrl {
    /// A new, disabled controller.
    pub fn new(cntlid: u16, subsys: Option<Arc<Subsystem>>, hostnqn: String, hostid: [u8; 16], kato_ms: u32) -> Self {
        let now = Instant::now();
        Self {
            cntlid,
            subsys,
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
            created: now,
        }
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

/// Per-reactor registry of the controllers it owns, and its controller id sequence.
#[derive(Debug, Default)]
pub struct Local {
    /// Controller id -> its admin connection.
    pub ctrls: HashMap<u16, QueueRef>,
    next_seq: u32,
}

impl Local {
    /// Allocate a controller id owned by `reactor` (of `n`): ids with (id - 1) % n == reactor.
    pub fn alloc_cntlid(&mut self, reactor: usize, n: usize) -> Option<u16> {
        let n = n as u32;
        let slots = (MAX_CNTLID - reactor as u32) / n;
        for _ in 0..slots {
            let seq = self.next_seq % slots.max(1);
            self.next_seq = self.next_seq.wrapping_add(1);
            let id = (seq * n + reactor as u32 + 1) as u16;
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

    #[test]
    fn cntlids_encode_their_reactor_and_are_unique() {
        let mut l = Local::default();
        let mut seen = std::collections::HashSet::new();
        for _ in 0..1000 {
            let id = l.alloc_cntlid(1, 3).unwrap_or_else(|| panic!("ran out"));
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
        while let Some(id) = l.alloc_cntlid(0, 1) {
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
}
