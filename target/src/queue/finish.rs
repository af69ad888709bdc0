//! How every command ends (NVMe 2.0 §4.6): one [`Queue::finish`] sends what the host is
//! owed (data, then the completion queue entry), records a failure in the controller's error
//! log (NVMe 2.0 §5.16.1.2), counts what the command did in its namespace's SMART figures
//! (NVMe 2.0 §5.16.1.3) and latency histograms, and counts the command for `pollux ctl`.
//! Firecracker's block device ends a request the same way (`PendingRequest::finish`).

use std::sync::Arc;

use pollux_nvme::spec::{Cqe, Status};
use pollux_reactor::Reactor;
use pollux_reactor::sys::monotonic_ns;

use super::{Queue, ReadBytes, Role, Transport, admin};
use crate::backend::ReadData;
use crate::controller::reply::Reply;
use crate::counter::bump;
use crate::nvm::Io;
use crate::subsystem::Namespace;

/// What goes to the host before a command's completion.
#[derive(Clone, Copy)]
pub(super) enum Payload<'a> {
    /// Nothing.
    None,
    /// Bytes a controller command returns (sent only when it succeeded).
    Bytes(&'a [u8]),
    /// A read's `len` bytes as its backend gave them; `ns` keeps in-memory bytes mapped while
    /// they are sent from where they lie.
    Read {
        data: ReadData<'a>,
        ns: &'a Arc<Namespace>,
        len: u32,
    },
}

/// What a command did to its namespace, counted when it succeeded.
#[derive(Clone, Copy)]
pub(super) enum Counted<'a> {
    /// Not a read or a write of the medium (admin, fabrics, Flush, DSM, ...).
    Nothing,
    /// A read command of `bytes` (0: Compare, Verify: a command, no data units), arrived at
    /// `started` (CLOCK_MONOTONIC ns; 0: not timed).
    Read {
        ns: &'a Namespace,
        bytes: u32,
        started: u64,
    },
    /// A write command (Write, Write Zeroes) of `bytes` (data units: only Write's), arrived at
    /// `started`.
    Write {
        ns: &'a Namespace,
        bytes: u32,
        started: u64,
    },
}

impl<'a> Counted<'a> {
    /// What NVM command `io`, arrived at `started`, does: Read and Write (and Write Zeroes)
    /// are timed; Compare and Verify count as reads without data units.
    #[inline(always)]
    pub fn of(io: &'a Io, started: u64) -> Self {
        match io {
            Io::Read { ns, len, .. } => Counted::Read {
                ns,
                bytes: *len,
                started,
            },
            Io::Write { ns, len, .. } => Counted::Write {
                ns,
                bytes: *len,
                started,
            },
            Io::WriteZeroes { ns, .. } => Counted::Write { ns, bytes: 0, started },
            Io::Compare { ns, .. } | Io::Verify { ns, .. } => Counted::Read {
                ns,
                bytes: 0,
                started: 0,
            },
            _ => Counted::Nothing,
        }
    }
}

/// How a command ends: its status and completion dwords, what precedes the completion, what
/// it did, and what its error log entry says of it.
pub(super) struct End<'a> {
    status: Status,
    dw0: u32,
    dw1: u32,
    payload: Payload<'a>,
    counted: Counted<'a>,
    /// The namespace and LBA a failure concerns (its error log entry).
    nsid: u32,
    lba: u64,
    /// A failure goes to the error log (see [`End::unlogged`]).
    logged: bool,
}

impl<'a> End<'a> {
    /// A command ends with `status`, nothing else to say.
    #[inline(always)]
    pub fn status(status: Status) -> Self {
        Self {
            status,
            dw0: 0,
            dw1: 0,
            payload: Payload::None,
            counted: Counted::Nothing,
            nsid: 0,
            lba: 0,
            logged: true,
        }
    }

    /// A command succeeds.
    #[inline(always)]
    pub fn ok() -> Self {
        Self::status(Status::SUCCESS)
    }

    /// A controller command's reply: its status, dwords and data, of which at most
    /// `max_len` bytes (what the host's SGL asked for) are sent.
    pub fn reply(rep: &'a Reply, max_len: u32) -> Self {
        let n = rep.data.len().min(max_len as usize);
        Self::status(rep.status)
            .dw(rep.dw0, rep.dw1)
            .payload(Payload::Bytes(&rep.data[..n]))
    }

    /// A successful read of `len` bytes of `ns`: its data, then (with SQ flow control) the
    /// completion.
    #[inline(always)]
    pub fn read(ns: &'a Arc<Namespace>, len: u32, data: ReadData<'a>, started: u64) -> Self {
        Self::ok()
            .payload(Payload::Read { data, ns, len })
            .counted(Counted::Read {
                ns,
                bytes: len,
                started,
            })
    }

    /// Completion dwords 0 and 1.
    #[inline(always)]
    pub fn dw(mut self, dw0: u32, dw1: u32) -> Self {
        (self.dw0, self.dw1) = (dw0, dw1);
        self
    }

    /// What precedes the completion.
    #[inline(always)]
    pub fn payload(mut self, p: Payload<'a>) -> Self {
        self.payload = p;
        self
    }

    /// What the command did.
    #[inline(always)]
    pub fn counted(mut self, c: Counted<'a>) -> Self {
        self.counted = c;
        self
    }

    /// The namespace and LBA a failure concerns.
    #[inline(always)]
    pub fn at(mut self, nsid: u32, lba: u64) -> Self {
        (self.nsid, self.lba) = (nsid, lba);
        self
    }

    /// A failure that is not the error log's: the fabrics exchanges that set a queue up
    /// (Connect, Authentication Send/Receive and the commands refused until they are done),
    /// whose failures the host sees in their status and the target logs with their reason.
    #[inline(always)]
    pub fn unlogged(mut self) -> Self {
        self.logged = false;
        self
    }
}

impl<T: Transport> Queue<T> {
    /// End command `cid` as `end` says: the one place a command completes. Inlined: at each
    /// call the builder's constant fields fold away what does not apply (a read's end is the
    /// data, the completion and two counters, nothing else).
    #[inline(always)]
    pub(super) fn finish(&mut self, r: &mut Reactor, cid: u16, end: &End<'_>) {
        let ok = end.status.is_success();
        let mut cqe = true;
        match end.payload {
            Payload::Bytes(b) if ok && !b.is_empty() => self.t.send_data(cid, b),
            Payload::Read { data, ns, len } => {
                // With SQ flow control disabled at Connect (NVMe-oF 1.1 §3.3) a read's
                // completion carries no SQ head: nothing but success, which the transport may
                // say with the data (whether it does is its own: `Transport::send_read`).
                cqe = !self.t.send_read(cid, ReadBytes::new(data, len, ns), self.sq.flow_off);
            }
            _ => {}
        }
        if cqe {
            let mut e = Cqe::new(cid, self.sq.qid, self.sqhd(), end.status, end.dw0);
            e.dw1.set(end.dw1);
            self.t.send_completion(&e);
        }
        self.completion_queued();
        // A Compare that read its blocks counts as a read command, equal or not (NVMe 2.0
        // §5.16.1.3: Compare commands count as Host Read Commands).
        if ok || end.status == Status::COMPARE_FAILURE {
            self.count(end.counted);
        }
        // The Abort the host asked for is not an error of the command.
        if !ok && end.logged && end.status != Status::ABORT_REQUESTED {
            self.log_error(r, cid, end.status, end.nsid, end.lba);
        }
        self.reqs.finished(ok);
    }

    /// Count what a successful command did in its namespace's figures on this reactor.
    #[inline(always)]
    fn count(&self, c: Counted<'_>) {
        let (ns, bytes, started, read) = match c {
            Counted::Nothing => return,
            Counted::Read { ns, bytes, started } => (ns, bytes, started, true),
            Counted::Write { ns, bytes, started } => (ns, bytes, started, false),
        };
        let c = ns.counters(self.reactor);
        let (cmds, total, latency) = if read {
            (&c.read_cmds, &c.read_bytes, &c.read_latency)
        } else {
            (&c.write_cmds, &c.write_bytes, &c.write_latency)
        };
        bump(cmds, 1);
        if bytes != 0 {
            bump(total, u64::from(bytes));
        }
        if started != 0 {
            latency.record(monotonic_ns().saturating_sub(started));
        }
    }

    /// Record a failed command in its controller's error log (NVMe 2.0 §5.16.1.2).
    #[cold]
    #[inline(never)]
    fn log_error(&mut self, r: &mut Reactor, cid: u16, status: Status, nsid: u32, lba: u64) {
        let sqid = self.sq.qid;
        match &mut self.role {
            Role::Admin(ctrl) => ctrl.log_error(sqid, cid, status, nsid, lba),
            Role::Io(q) => {
                // Errors are rare: one message to the controller's reactor for its log.
                let (cntlid, owner) = (q.cntlid, q.owner);
                r.send(owner, move |r| {
                    admin::with_ctrl::<T, _>(r, cntlid, |ctrl, _| ctrl.log_error(sqid, cid, status, nsid, lba));
                });
            }
            _ => {}
        }
    }

    /// Complete command `cid` with `status` (the common case of [`Self::finish`]).
    #[inline]
    pub(super) fn end(&mut self, r: &mut Reactor, cid: u16, status: Status) {
        self.finish(r, cid, &End::status(status));
    }
}
