//! The fake's admin commands: Identify, Set/Get Features Number of Queues, Create/Delete I/O
//! CQ/SQ, Get Log Page (SMART) and Abort.

use std::sync::atomic::Ordering;

use zerocopy::{FromZeros, IntoBytes};

use super::{Engine, FCq, FSq};
use crate::bindings::{nvme_id_ctrl, nvme_id_ns};
use crate::pci::dma::PAGE_SIZE;
use crate::pci::fake::{CQ_INVALID, INVALID_INTERRUPT_VECTOR, INVALID_QUEUE_DELETION};
use crate::pci::regs::{cq_head_doorbell, sq_tail_doorbell};
use crate::spec::{Health, Sqe, Status, Vs, cns, feature, log_page, opcode};

impl Engine {
    pub(super) fn admin(&mut self, sqe: &Sqe) -> (Status, u32) {
        let cdw10 = sqe.cdw10.get();
        let cdw11 = sqe.cdw11.get();
        let max_q = self.inner.cfg.max_io_queues;
        match sqe.opcode {
            opcode::admin::IDENTIFY => (self.identify(sqe), 0),
            opcode::admin::SET_FEATURES | opcode::admin::GET_FEATURES => {
                if (cdw10 & 0xFF) as u8 != feature::NUMBER_OF_QUEUES {
                    return (Status::SUCCESS, 0);
                }
                if sqe.opcode == opcode::admin::SET_FEATURES {
                    let nsqr = (cdw11 & 0xFFFF) as u16;
                    let ncqr = (cdw11 >> 16) as u16;
                    if nsqr == 0xFFFF || ncqr == 0xFFFF {
                        return (Status::INVALID_FIELD, 0);
                    }
                    self.granted = nsqr.min(ncqr).min(max_q - 1) + 1;
                }
                let g = u32::from(self.granted.max(1) - 1);
                (Status::SUCCESS, (g << 16) | g)
            }
            opcode::admin::CREATE_CQ => {
                let qid = (cdw10 & 0xFFFF) as u16;
                let size = (cdw10 >> 16) + 1;
                if qid == 0 || qid > max_q || self.cqs[usize::from(qid)].is_some() {
                    return (Status::INVALID_QUEUE_IDENTIFIER, 0);
                }
                if size < 2 || size > u32::from(self.inner.cfg.mqes) + 1 {
                    return (Status::INVALID_QUEUE_SIZE, 0);
                }
                if cdw11 & 1 == 0 || !sqe.prp1().is_multiple_of(PAGE_SIZE as u64) {
                    return (Status::INVALID_FIELD, 0);
                }
                let ien = cdw11 & 2 != 0;
                let iv = (cdw11 >> 16) as u16;
                if ien && iv >= self.inner.cfg.vectors {
                    return (INVALID_INTERRUPT_VECTOR, 0);
                }
                self.cqs[usize::from(qid)] = Some(FCq {
                    iova: sqe.prp1(),
                    size: size as u16,
                    tail: 0,
                    phase: true,
                    ien,
                    iv,
                });
                (Status::SUCCESS, 0)
            }
            opcode::admin::CREATE_SQ => {
                let qid = (cdw10 & 0xFFFF) as u16;
                let size = (cdw10 >> 16) + 1;
                let cqid = (cdw11 >> 16) as u16;
                if qid == 0 || qid > max_q || self.sqs[usize::from(qid)].is_some() {
                    return (Status::INVALID_QUEUE_IDENTIFIER, 0);
                }
                if size < 2 || size > u32::from(self.inner.cfg.mqes) + 1 {
                    return (Status::INVALID_QUEUE_SIZE, 0);
                }
                if cqid == 0 || cqid > max_q || self.cqs[usize::from(cqid)].is_none() {
                    return (CQ_INVALID, 0);
                }
                if cdw11 & 1 == 0 || !sqe.prp1().is_multiple_of(PAGE_SIZE as u64) {
                    return (Status::INVALID_FIELD, 0);
                }
                // The doorbell may hold a stale tail from an earlier queue of this ID.
                self.inner.set_reg(sq_tail_doorbell(qid, self.inner.cfg.dstrd), 0);
                self.sqs[usize::from(qid)] = Some(FSq {
                    iova: sqe.prp1(),
                    size: size as u16,
                    cqid,
                    head: 0,
                });
                (Status::SUCCESS, 0)
            }
            opcode::admin::DELETE_SQ => {
                let qid = (cdw10 & 0xFFFF) as u16;
                if qid == 0 || qid > max_q || self.sqs[usize::from(qid)].is_none() {
                    return (Status::INVALID_QUEUE_IDENTIFIER, 0);
                }
                self.sqs[usize::from(qid)] = None;
                for p in self.pending.iter_mut().filter(|p| p.sqid == qid) {
                    p.status = Status::ABORTED_SQ_DELETION;
                }
                (Status::SUCCESS, 0)
            }
            opcode::admin::DELETE_CQ => {
                let qid = (cdw10 & 0xFFFF) as u16;
                if qid == 0 || qid > max_q || self.cqs[usize::from(qid)].is_none() {
                    return (Status::INVALID_QUEUE_IDENTIFIER, 0);
                }
                if self.sqs.iter().flatten().any(|s| s.cqid == qid) {
                    return (INVALID_QUEUE_DELETION, 0);
                }
                self.cqs[usize::from(qid)] = None;
                self.pending.retain(|p| p.cqid != qid);
                self.inner.set_reg(cq_head_doorbell(qid, self.inner.cfg.dstrd), 0);
                (Status::SUCCESS, 0)
            }
            opcode::admin::GET_LOG_PAGE => (self.get_log_page(sqe), 0),
            opcode::admin::ABORT => {
                let sqid = (cdw10 & 0xFFFF) as u16;
                let cid = (cdw10 >> 16) as u16;
                match self.pending.iter_mut().find(|p| p.sqid == sqid && p.cid == cid) {
                    Some(p) => {
                        // An aborted command completes now, not when its latency is up.
                        p.status = Status::ABORT_REQUESTED;
                        p.due = std::time::Instant::now();
                        (Status::SUCCESS, 0)
                    }
                    None => (Status::SUCCESS, 1),
                }
            }
            _ => (Status::INVALID_OPCODE.with_dnr(), 0),
        }
    }

    /// Get Log Page: SMART / Health Information only (NVMe 2.0 §5.16.1.3), for the controller
    /// (NSID FFFFFFFFh or 0).
    fn get_log_page(&mut self, sqe: &Sqe) -> Status {
        let cdw10 = sqe.cdw10.get();
        let lid = (cdw10 & 0xFF) as u8;
        let dwords = ((cdw10 >> 16) as usize | ((sqe.cdw11.get() as usize & 0xFFFF) << 16)) + 1;
        if lid != log_page::SMART || !matches!(sqe.nsid.get(), 0 | u32::MAX) {
            return Status::INVALID_LOG_PAGE.with_dnr();
        }
        let i = &self.inner;
        let health = Health {
            critical_warning: i.critical_warning.load(Ordering::Acquire) as u8,
            temperature_k: i.temperature_k.load(Ordering::Acquire) as u16,
            avail_spare: 100,
            spare_thresh: 10,
            data_units_read: Health::data_units(i.bytes_read.load(Ordering::Relaxed)),
            data_units_written: Health::data_units(i.bytes_written.load(Ordering::Relaxed)),
            power_cycles: 1,
            ..Health::default()
        };
        let mut page = health.to_page();
        page.resize(dwords * 4, 0);
        self.transfer_out(sqe, &page)
    }

    fn identify(&mut self, sqe: &Sqe) -> Status {
        let cns_v = (sqe.cdw10.get() & 0xFF) as u8;
        let nsid = sqe.nsid.get();
        let mut page = vec![0u8; PAGE_SIZE];
        let ram = self.inner.ram();
        match cns_v {
            cns::CONTROLLER => {
                let mut id = nvme_id_ctrl::new_zeroed();
                id.vid = 0x1b36;
                id.ssvid = 0x1af4;
                id.sn[..8].copy_from_slice(b"FAKE0001");
                id.sn[8..].fill(b' ');
                let mn = b"pollux fake NVMe controller";
                id.mn.fill(b' ');
                id.mn[..mn.len()].copy_from_slice(mn);
                id.fr.copy_from_slice(b"1.0     ");
                id.mdts = self.inner.cfg.mdts;
                id.ver = Vs::V2_0.0;
                id.sqes = 0x66;
                id.cqes = 0x44;
                id.nn = ram.iter().map(|r| r.ns.nsid).max().unwrap_or(0);
                id.oncs = 0x8; // Write Zeroes
                if self.inner.cfg.copy.is_some() {
                    id.oncs |= crate::pci::ONCS_COPY;
                    id.ocfs = crate::pci::OCFS_FORMAT_0;
                }
                page.copy_from_slice(id.as_bytes());
            }
            cns::NAMESPACE => {
                let Some(r) = ram.iter().find(|r| r.ns.nsid == nsid) else {
                    return Status::INVALID_NAMESPACE;
                };
                let mut id = nvme_id_ns::new_zeroed();
                id.nsze = r.ns.blocks;
                id.ncap = r.ns.blocks;
                id.nuse = r.ns.blocks;
                id.nlbaf = 0;
                id.flbas = 0;
                id.lbaf[0].ds = r.ns.lba_shift;
                if let Some(l) = self.inner.cfg.copy {
                    id.mssrl = l.mssrl;
                    id.mcl = l.mcl;
                    id.msrc = l.msrc;
                }
                page.copy_from_slice(id.as_bytes());
            }
            cns::ACTIVE_NAMESPACE_LIST => {
                let mut ids: Vec<u32> = ram.iter().map(|r| r.ns.nsid).filter(|&n| n > nsid).collect();
                ids.sort_unstable();
                for (i, id) in ids.iter().take(1024).enumerate() {
                    page[i * 4..i * 4 + 4].copy_from_slice(&id.to_le_bytes());
                }
            }
            _ => return Status::INVALID_FIELD,
        }
        drop(ram);
        self.transfer_out(sqe, &page)
    }
}
