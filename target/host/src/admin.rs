//! Admin and fabrics property helpers on an admin queue: what `nvme connect` does to bring a
//! controller up (NVMe-oF 1.1 §3.5; base spec §3.5.1 controller initialization) and the
//! Identify / Get Log Page / Features commands a host reads.

use std::time::{Duration, Instant};

use pollux_nvme::bindings::{
    nvme_error_log_page, nvme_id_ctrl, nvme_id_ns, nvmf_disc_log_entry, nvmf_discovery_log, nvmf_tsas_tcp,
};
use pollux_nvme::spec::{Cap, Cc, Csts, Health, Status, cns, feature, log_page, property};
use zerocopy::{FromBytes, IntoBytes};

use super::error::HostError;
use super::queue::{Data, HostQueue};
use super::sqe;

/// The Identify Controller fields a host needs (base spec §5.17.2.1; NVMe-oF 1.1 §4.1 for
/// IOCCSZ, IORCSZ, ICDOFF, MSDBD).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdCtrl {
    /// Serial number (trailing spaces removed).
    pub sn: String,
    /// Model number (trailing spaces removed).
    pub mn: String,
    /// Firmware revision.
    pub fr: String,
    /// Maximum data transfer size, a power of two in units of CAP.MPSMIN (0: no limit).
    pub mdts: u8,
    /// Controller ID.
    pub cntlid: u16,
    /// Version.
    pub ver: u32,
    /// Controller type (1 I/O, 2 discovery, 3 administrative).
    pub cntrltype: u8,
    /// Keep Alive Support: granularity in 100 ms units (0: not supported).
    pub kas: u16,
    /// SQ entry sizes (required 3:0, maximum 7:4), log2 bytes.
    pub sqes: u8,
    /// CQ entry sizes.
    pub cqes: u8,
    /// Maximum outstanding commands.
    pub maxcmd: u16,
    /// Number of namespaces (largest NSID).
    pub nn: u32,
    /// Optional NVM command support.
    pub oncs: u16,
    /// Volatile write cache.
    pub vwc: u8,
    /// SGL support.
    pub sgls: u32,
    /// NVM subsystem NQN.
    pub subnqn: String,
    /// I/O queue command capsule supported size, in 16-byte units.
    pub ioccsz: u32,
    /// I/O queue response capsule supported size, in 16-byte units.
    pub iorcsz: u32,
    /// In-capsule data offset, in 16-byte units.
    pub icdoff: u16,
    /// Maximum SGL data block descriptors.
    pub msdbd: u8,
}

fn ascii(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).trim_end().to_string()
}

impl IdCtrl {
    /// Parses the 4096-byte Identify Controller data structure.
    pub fn parse(data: &[u8]) -> Result<Self, HostError> {
        let (id, _) = nvme_id_ctrl::read_from_prefix(data)
            .map_err(|_| HostError::Protocol(format!("Identify Controller data of {} bytes", data.len())))?;
        Ok(Self {
            sn: ascii(&id.sn),
            mn: ascii(&id.mn),
            fr: ascii(&id.fr),
            mdts: id.mdts,
            cntlid: u16::from_le(id.cntlid),
            ver: u32::from_le(id.ver),
            cntrltype: id.cntrltype,
            kas: u16::from_le(id.kas),
            sqes: id.sqes,
            cqes: id.cqes,
            maxcmd: u16::from_le(id.maxcmd),
            nn: u32::from_le(id.nn),
            oncs: u16::from_le(id.oncs),
            vwc: id.vwc,
            sgls: u32::from_le(id.sgls),
            subnqn: ascii(&id.subnqn),
            ioccsz: u32::from_le(id.ioccsz),
            iorcsz: u32::from_le(id.iorcsz),
            icdoff: u16::from_le(id.icdoff),
            msdbd: id.msdbd,
        })
    }

    /// In-capsule data an I/O command may carry: IOCCSZ * 16 minus the 64-byte SQE.
    pub fn in_capsule_data(&self) -> u32 {
        self.ioccsz.saturating_mul(16).saturating_sub(64)
    }

    /// The largest transfer in bytes for memory page size 2^(12 + `mpsmin`), `None` if MDTS
    /// sets no limit.
    pub fn max_transfer(&self, mpsmin: u8) -> Option<u64> {
        (self.mdts != 0).then(|| (4096u64 << mpsmin) << self.mdts.min(40))
    }
}

/// The Identify Namespace fields a host needs (NVM command set spec §4.1.5.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdNs {
    /// Namespace size in logical blocks.
    pub nsze: u64,
    /// Namespace capacity.
    pub ncap: u64,
    /// Namespace utilization.
    pub nuse: u64,
    /// Formatted LBA size (index in bits 3:0).
    pub flbas: u8,
    /// Logical block size in bytes, from the LBA format in use (0 for an inactive NSID).
    pub block_size: u32,
    /// Multi-path I/O and namespace sharing capabilities.
    pub nmic: u8,
    /// Deallocate logical block features.
    pub dlfeat: u8,
    /// Namespace globally unique identifier.
    pub nguid: [u8; 16],
    /// IEEE extended unique identifier.
    pub eui64: [u8; 8],
}

impl IdNs {
    /// Parses the 4096-byte Identify Namespace data structure.
    pub fn parse(data: &[u8]) -> Result<Self, HostError> {
        let (id, _) = nvme_id_ns::read_from_prefix(data)
            .map_err(|_| HostError::Protocol(format!("Identify Namespace data of {} bytes", data.len())))?;
        let lbaf = id.lbaf.get(usize::from(id.flbas & 0xF)).map_or(0, |f| f.ds);
        let nsze = u64::from_le(id.nsze);
        Ok(Self {
            nsze,
            ncap: u64::from_le(id.ncap),
            nuse: u64::from_le(id.nuse),
            flbas: id.flbas,
            block_size: if nsze == 0 || lbaf >= 32 { 0 } else { 1u32 << lbaf },
            nmic: id.nmic,
            dlfeat: id.dlfeat,
            nguid: id.nguid,
            eui64: id.eui64,
        })
    }

    /// Namespace size in bytes.
    pub fn bytes(&self) -> u64 {
        self.nsze.saturating_mul(u64::from(self.block_size))
    }
}

/// Number of Queues granted (base spec §5.27.1.5), as counts (the wire values are 0's based).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NumQueues {
    /// I/O submission queues allocated (NSQA + 1).
    pub sq: u32,
    /// I/O completion queues allocated (NCQA + 1).
    pub cq: u32,
    /// The raw completion dword 0.
    pub dw0: u32,
}

/// One discovery log entry (NVMe-oF 1.1 §5.3, Figure 34): [`nvmf_disc_log_entry`]'s fields
/// a host reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryEntry {
    /// Transport type (3: TCP).
    pub trtype: u8,
    /// Address family (1: IPv4, 2: IPv6).
    pub adrfam: u8,
    /// Subsystem type (1: discovery, 2: NVM).
    pub subtype: u8,
    /// Transport requirements: bits 1:0 the secure channel (0 not specified, 1 required,
    /// 2 not required), bit 2 SQ flow control disable supported.
    pub treq: u8,
    /// Port ID.
    pub portid: u16,
    /// Controller ID (0xFFFF: dynamic).
    pub cntlid: u16,
    /// Admin max SQ size.
    pub asqsz: u16,
    /// Transport service identifier (the TCP port).
    pub trsvcid: String,
    /// Subsystem NQN.
    pub subnqn: String,
    /// Transport address (the IP address).
    pub traddr: String,
    /// TSAS SECTYPE for TCP (NVMe/TCP 1.0 §3.6.1, byte 768 of the entry): 0 no security,
    /// 1 TLS 1.2, 2 TLS 1.3.
    pub sectype: u8,
}

/// The discovery log page (LID 70h).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryLog {
    /// Generation counter.
    pub genctr: u64,
    /// Number of records.
    pub numrec: u64,
    /// Record format.
    pub recfmt: u16,
    /// The entries.
    pub entries: Vec<DiscoveryEntry>,
}

impl DiscoveryLog {
    /// Parses a whole discovery log page: the 1024-byte header ([`nvmf_discovery_log`]), then
    /// NUMREC 1024-byte entries ([`nvmf_disc_log_entry`]), as many as the page holds.
    pub fn parse(data: &[u8]) -> Result<Self, HostError> {
        let (hdr, records) = nvmf_discovery_log::read_from_prefix(data)
            .map_err(|_| HostError::Protocol("discovery log shorter than its header".into()))?;
        let numrec = u64::from_le(hdr.numrec);
        let entries = records
            .chunks_exact(size_of::<nvmf_disc_log_entry>())
            .take(numrec.min(4096) as usize)
            .filter_map(|e| nvmf_disc_log_entry::read_from_bytes(e).ok())
            .map(|e| DiscoveryEntry::from_wire(&e))
            .collect();
        Ok(Self {
            genctr: u64::from_le(hdr.genctr),
            numrec,
            recfmt: u16::from_le(hdr.recfmt),
            entries,
        })
    }
}

impl DiscoveryEntry {
    /// The fields of one entry as the target wrote it.
    fn from_wire(e: &nvmf_disc_log_entry) -> Self {
        // The TCP TSAS is the first byte of the entry's 256 (NVMe/TCP 1.0 §3.6.1): SECTYPE.
        let sectype = nvmf_tsas_tcp::read_from_prefix(e.tsas.as_bytes()).map_or(0, |(t, _)| t.sectype);
        Self {
            trtype: e.trtype,
            adrfam: e.adrfam,
            subtype: e.subtype,
            treq: e.treq,
            portid: u16::from_le(e.portid),
            cntlid: u16::from_le(e.cntlid),
            asqsz: u16::from_le(e.asqsz),
            trsvcid: ascii(&e.trsvcid),
            subnqn: ascii(&e.subnqn),
            traddr: ascii(&e.traddr),
            sectype,
        }
    }
}

/// One Error Information log entry (NVMe 2.0 §5.16.1.2): [`nvme_error_log_page`]'s fields
/// a host reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorLogEntry {
    /// Error Count: unique to this error, increasing (0: an empty entry).
    pub error_count: u64,
    /// Submission queue of the failed command.
    pub sqid: u16,
    /// Command identifier of the failed command.
    pub cmdid: u16,
    /// The status it completed with (the phase tag dropped).
    pub status: Status,
    /// Parameter Error Location (FFFFh: not applicable).
    pub parm_error_location: u16,
    /// The first LBA that failed.
    pub lba: u64,
    /// Namespace.
    pub nsid: u32,
    /// Transport type (3: TCP).
    pub trtype: u8,
}

impl ErrorLogEntry {
    /// Parses an Error Information log page (LID 01h): its 64-byte entries, newest first,
    /// the empty ones (Error Count 0) left out.
    pub fn parse_log(data: &[u8]) -> Vec<Self> {
        data.chunks_exact(size_of::<nvme_error_log_page>())
            .filter_map(|e| nvme_error_log_page::read_from_bytes(e).ok())
            .filter(|e| e.error_count != 0)
            .map(|e| Self {
                error_count: u64::from_le(e.error_count),
                sqid: u16::from_le(e.sqid),
                cmdid: u16::from_le(e.cmdid),
                status: Status::from_cqe_field(u16::from_le(e.status_field)),
                parm_error_location: u16::from_le(e.parm_error_location),
                lba: u64::from_le(e.lba),
                nsid: u32::from_le(e.nsid),
                trtype: e.trtype,
            })
            .collect()
    }
}

impl HostQueue {
    /// Property Get (NVMe-oF 1.1 §6.5); the width comes from the offset (CAP is 8 bytes).
    pub fn property_get(&mut self, offset: u32) -> Result<u64, HostError> {
        let size8 = property::size(offset) == Some(8);
        let c = self.exec_ok(sqe::property_get(offset, size8), Data::None)?;
        Ok(if size8 {
            u64::from(c.dw0) | (u64::from(c.dw1) << 32)
        } else {
            u64::from(c.dw0)
        })
    }

    /// Property Set (NVMe-oF 1.1 §6.6).
    pub fn property_set(&mut self, offset: u32, value: u64) -> Result<(), HostError> {
        let size8 = property::size(offset) == Some(8);
        self.exec_ok(sqe::property_set(offset, value, size8), Data::None)
            .map(drop)
    }

    /// Polls CSTS until `done` holds, at most CAP.TO (500 ms units) or the queue timeout,
    /// whichever is shorter.
    fn wait_csts(&mut self, what: &str, done: impl Fn(Csts) -> bool) -> Result<Csts, HostError> {
        let cap = Cap(self.property_get(property::CAP)?);
        let to = Duration::from_millis(500 * u64::from(cap.to().max(1))).min(self.opts().timeout);
        let start = Instant::now();
        loop {
            let csts = Csts(self.property_get(property::CSTS)? as u32);
            if csts.cfs() {
                return Err(HostError::Controller(format!("CSTS.CFS set while waiting for {what}")));
            }
            if done(csts) {
                return Ok(csts);
            }
            if start.elapsed() >= to {
                return Err(HostError::Controller(format!(
                    "{what} not reached after {:?} (CSTS {:#x})",
                    start.elapsed(),
                    csts.0
                )));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Enables the controller: CC.EN with IOSQES 6 (64-byte SQE), IOCQES 4 (16-byte CQE), MPS 0
    /// and the NVM command set, then waits for CSTS.RDY (base spec §3.5.1).
    pub fn enable(&mut self) -> Result<(), HostError> {
        let cc = Cc(0)
            .with_iosqes(6)
            .with_iocqes(4)
            .with_mps(0)
            .with_css(Cc::CSS_NVM)
            .with_en(true);
        self.property_set(property::CC, u64::from(cc.0))?;
        self.wait_csts("CSTS.RDY", |c| c.rdy()).map(drop)
    }

    /// Normal shutdown: CC.SHN = 01b, then waits for CSTS.SHST = complete (base spec §3.6.1).
    pub fn shutdown_controller(&mut self) -> Result<(), HostError> {
        let cc = Cc(self.property_get(property::CC)? as u32).with_shn(Cc::SHN_NORMAL);
        self.property_set(property::CC, u64::from(cc.0))?;
        self.wait_csts("CSTS.SHST complete", |c| c.shst() == Csts::SHST_COMPLETE)
            .map(drop)
    }

    /// Identify with `cns` for `nsid`: the 4096-byte data structure.
    pub fn identify(&mut self, cns_value: u8, nsid: u32) -> Result<Vec<u8>, HostError> {
        let c = self.exec_ok(sqe::identify(cns_value, nsid), Data::FromCtrl(vec![0u8; 4096]))?;
        Ok(c.buf)
    }

    /// Identify Controller (CNS 01h).
    pub fn identify_controller(&mut self) -> Result<IdCtrl, HostError> {
        IdCtrl::parse(&self.identify(cns::CONTROLLER, 0)?)
    }

    /// Identify Namespace (CNS 00h).
    pub fn identify_namespace(&mut self, nsid: u32) -> Result<IdNs, HostError> {
        IdNs::parse(&self.identify(cns::NAMESPACE, nsid)?)
    }

    /// Active Namespace ID list (CNS 02h): active NSIDs above `after`, ascending.
    pub fn active_namespaces(&mut self, after: u32) -> Result<Vec<u32>, HostError> {
        let d = self.identify(cns::ACTIVE_NAMESPACE_LIST, after)?;
        Ok(d.chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .take_while(|&n| n != 0)
            .collect())
    }

    /// Set Features `fid` = `value`; returns completion dword 0.
    pub fn set_features(&mut self, fid: u8, value: u32) -> Result<u32, HostError> {
        Ok(self.exec_ok(sqe::set_features(fid, value), Data::None)?.dw0)
    }

    /// Get Features `fid` (current value); returns completion dword 0.
    pub fn get_features(&mut self, fid: u8, cdw11: u32) -> Result<u32, HostError> {
        Ok(self.exec_ok(sqe::get_features(fid, 0, cdw11), Data::None)?.dw0)
    }

    /// Set Features Number of Queues asking for `n` I/O submission and completion queues.
    pub fn set_num_queues(&mut self, n: u16) -> Result<NumQueues, HostError> {
        let z = u32::from(n.max(1) - 1);
        let dw0 = self.set_features(feature::NUMBER_OF_QUEUES, z | (z << 16))?;
        Ok(NumQueues {
            sq: (dw0 & 0xFFFF) + 1,
            cq: (dw0 >> 16) + 1,
            dw0,
        })
    }

    /// Keep Alive (base spec §5.19).
    pub fn keep_alive(&mut self) -> Result<(), HostError> {
        self.exec_ok(sqe::keep_alive(), Data::None).map(drop)
    }

    /// Abort command `cid` of queue `sqid` (base spec §5.1): returns dw0, whose bit 0 is 0
    /// when the command was aborted.
    pub fn abort(&mut self, sqid: u16, cid: u16) -> Result<u32, HostError> {
        Ok(self.exec_ok(sqe::abort(sqid, cid), Data::None)?.dw0)
    }

    /// Get Log Page `lid`: `len` bytes (a multiple of 4) from byte `offset`.
    pub fn get_log_page(&mut self, lid: u8, offset: u64, len: u32) -> Result<Vec<u8>, HostError> {
        if len < 4 || !len.is_multiple_of(4) {
            return Err(HostError::Invalid("log page length must be a non-zero multiple of 4"));
        }
        let c = self.exec_ok(
            sqe::get_log_page(lid, len, offset, false),
            Data::FromCtrl(vec![0u8; len as usize]),
        )?;
        Ok(c.buf)
    }

    /// The discovery log (LID 70h; NVMe-oF 1.1 §5.3): the header, then every record, read
    /// as libnvme reads it (`nvme discover`): in pieces of at most 4 KiB (its
    /// `NVME_LOG_PAGE_PDU_SIZE`, the smallest MDTS there is), since a log of 128 records or
    /// more is larger than a controller's MDTS of 128 KiB, which refuses it in one command.
    pub fn discovery_log(&mut self) -> Result<DiscoveryLog, HostError> {
        const PIECE: u32 = 4096;
        let hdr = self.get_log_page(log_page::DISCOVERY, 0, 1024)?;
        let numrec = DiscoveryLog::parse(&hdr)?.numrec.min(1024);
        let len = 1024 + 1024 * numrec as u32;
        let mut page = Vec::with_capacity(len as usize);
        while (page.len() as u32) < len {
            let n = PIECE.min(len - page.len() as u32);
            page.extend(self.get_log_page(log_page::DISCOVERY, page.len() as u64, n)?);
        }
        DiscoveryLog::parse(&page)
    }

    /// The Error Information log (LID 01h): its newest `entries` entries (at most Identify
    /// Controller ELPE + 1), the empty ones left out.
    pub fn error_log(&mut self, entries: u32) -> Result<Vec<ErrorLogEntry>, HostError> {
        let len = entries.saturating_mul(size_of::<nvme_error_log_page>() as u32);
        Ok(ErrorLogEntry::parse_log(&self.get_log_page(log_page::ERROR, 0, len)?))
    }

    /// The SMART / Health Information log (LID 02h).
    pub fn smart_log(&mut self) -> Result<Health, HostError> {
        let page = self.get_log_page(log_page::SMART, 0, 512)?;
        Health::parse(&page).ok_or_else(|| HostError::Protocol(format!("SMART log of {} bytes", page.len())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A discovery log page laid out by hand at the spec's byte offsets (NVMe-oF 1.1 §5.3:
    /// GENCTR 0, NUMREC 8, RECFMT 16, records from 1024; in a record TRTYPE 0, ADRFAM 1,
    /// SUBTYPE 2, TREQ 3, PORTID 4, CNTLID 6, ASQSZ 8, TRSVCID 32, SUBNQN 256, TRADDR 512,
    /// TSAS 768, whose first byte is the TCP SECTYPE), not through the bindgen structs the
    /// parser reads it with.
    #[test]
    fn a_discovery_log_parses_at_the_spec_offsets() {
        let mut page = vec![0u8; 1024 * 3];
        page[0..8].copy_from_slice(&7u64.to_le_bytes());
        page[8..16].copy_from_slice(&2u64.to_le_bytes());
        page[16..18].copy_from_slice(&1u16.to_le_bytes());
        for (i, e) in page[1024..].chunks_exact_mut(1024).enumerate() {
            e[..4].copy_from_slice(&[3, 1, 2, 0x05]);
            e[4..6].copy_from_slice(&(10 + i as u16).to_le_bytes());
            e[6..8].copy_from_slice(&0xFFFFu16.to_le_bytes());
            e[8..10].copy_from_slice(&32u16.to_le_bytes());
            e[32..36].copy_from_slice(b"4420");
            let nqn = format!("nqn.2026-11.io.pollux:d{i}");
            e[256..256 + nqn.len()].copy_from_slice(nqn.as_bytes());
            e[512..521].copy_from_slice(b"10.0.0.21");
            e[768] = 2;
        }
        let log = DiscoveryLog::parse(&page).expect("a whole page");
        assert_eq!((log.genctr, log.numrec, log.recfmt), (7, 2, 1));
        assert_eq!(log.entries.len(), 2);
        let e = &log.entries[1];
        assert_eq!(
            (
                e.trtype, e.adrfam, e.subtype, e.treq, e.portid, e.cntlid, e.asqsz, e.sectype
            ),
            (3, 1, 2, 0x05, 11, 0xFFFF, 32, 2)
        );
        assert_eq!(
            (e.trsvcid.as_str(), e.subnqn.as_str(), e.traddr.as_str()),
            ("4420", "nqn.2026-11.io.pollux:d1", "10.0.0.21")
        );
        // NUMREC above the records the page holds: only the whole records there.
        page[8..16].copy_from_slice(&9u64.to_le_bytes());
        assert_eq!(
            DiscoveryLog::parse(&page[..1024 + 1500]).expect("header").entries.len(),
            1
        );
        assert!(matches!(
            DiscoveryLog::parse(&page[..1023]),
            Err(HostError::Protocol(_))
        ));
    }

    /// Two Error Information entries laid out by hand at the spec's byte offsets (NVMe 2.0
    /// §5.16.1.2: Error Count 0, SQID 8, CID 10, Status Field 12 with the phase tag in bit 0,
    /// Parameter Error Location 14, LBA 16, Namespace 24, Transport Type 29), then an empty
    /// one.
    #[test]
    fn an_error_log_parses_at_the_spec_offsets_and_skips_empty_entries() {
        let mut page = vec![0u8; 64 * 3];
        for (i, e) in page.chunks_exact_mut(64).take(2).enumerate() {
            e[0..8].copy_from_slice(&(9 - i as u64).to_le_bytes());
            e[8..10].copy_from_slice(&2u16.to_le_bytes());
            e[10..12].copy_from_slice(&(40 + i as u16).to_le_bytes());
            e[12..14].copy_from_slice(&((0x80u16 << 1) | 1).to_le_bytes());
            e[14..16].copy_from_slice(&0xFFFFu16.to_le_bytes());
            e[16..24].copy_from_slice(&0x1_0000_0007u64.to_le_bytes());
            e[24..28].copy_from_slice(&1u32.to_le_bytes());
            e[29] = 3;
        }
        let log = ErrorLogEntry::parse_log(&page);
        assert_eq!(log.len(), 2);
        assert_eq!(
            log[1],
            ErrorLogEntry {
                error_count: 8,
                sqid: 2,
                cmdid: 41,
                status: Status::new(0, 0x80),
                parm_error_location: 0xFFFF,
                lba: 0x1_0000_0007,
                nsid: 1,
                trtype: 3,
            }
        );
    }
}
