//! Copy (NVM Command Set 1.0 §3.2.2) on an I/O queue: a locked operation on its
//! destination, read and written here or handed whole to a backend that copies itself.

use std::sync::Arc;

use pollux_nvme::spec::Status;
use pollux_reactor::{Reactor, SourceId};

use super::super::{Queue, Transport};
use super::{LockedOp, OpKind, Owned};
use crate::backend::WriteData;
use crate::nvm;
use crate::queue::finish::End;
use crate::subsystem::Namespace;

impl<T: Transport> Queue<T> {
    /// A Copy whose source range entries are `data`: a locked operation on its destination.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::queue) fn start_copy(
        &mut self,
        r: &mut Reactor,
        id: SourceId,
        cid: u16,
        ns: Arc<Namespace>,
        dst: u64,
        ranges: u32,
        fua: bool,
        data: WriteData<'_>,
        held: usize,
    ) {
        let bytes = Owned::bytes(data);
        let need = (ranges * nvm::COPY_RANGE_LEN) as usize;
        let srcs = match bytes.get(..need).map(|b| nvm::copy_ranges(b, &ns)) {
            Some(Ok(s)) => s,
            refused => {
                self.unhold(Some(held));
                let s = match refused {
                    Some(Err(s)) => s,
                    _ => Status::DATA_SGL_LENGTH_INVALID.with_dnr(),
                };
                return self.finish(r, cid, &End::status(s).at(ns.nsid, 0));
            }
        };
        let total: u64 = srcs.iter().map(|s| s.1).sum();
        if dst.checked_add(total).is_none_or(|end| end > ns.bytes()) {
            self.unhold(Some(held));
            let end = End::status(Status::LBA_OUT_OF_RANGE.with_dnr()).at(ns.nsid, dst >> ns.block_shift);
            return self.finish(r, cid, &end);
        }
        // The backend's own copy (an NVMe device's Copy) when it has one and the copy is
        // within its limits: one command, under the same lock and fence, and no reads.
        // Otherwise reads no larger than a channel's buffers (MDTS), then the writes.
        let (reads, got, device) = if ns.backend.caps().copy_offload.is_some_and(|l| l.fits(&srcs)) {
            (Vec::new(), Vec::new(), Some(srcs))
        } else {
            let chunk = u64::from(self.shared.transport.max_io_size.max(ns.block_size));
            let mut reads = Vec::new();
            for (off, len) in srcs {
                let mut at = 0;
                while at < len {
                    let n = (len - at).min(chunk);
                    reads.push((off + at, n as u32));
                    at += n;
                }
            }
            (reads, Vec::with_capacity(total as usize), None)
        };
        let op = LockedOp {
            start: dst,
            end: dst + total,
            lock: None,
            reads,
            next: 0,
            got,
            written: 0,
            kind: OpKind::Copy { cid, fua, device },
            ns,
            held: vec![held],
        };
        let key = self.locked.ops.insert(op);
        self.try_start(r, id, key);
    }
}
