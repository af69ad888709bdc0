//! Submission queue entries as a host builds them. Command ID, PSDT and SGL1 are filled in by
//! [`HostQueue::submit`](super::HostQueue::submit) (fabrics require SGLs, NVMe-oF 1.1 §2.3.1;
//! NVMe/TCP places data in-capsule or moves it by R2T/H2CData/C2HData, §3.3); raw-mode tests
//! fill them themselves.

use pollux_nvme::bindings::nvmf_connect_data;
use pollux_nvme::spec::text::nul_terminated;
use pollux_nvme::spec::{Sqe, opcode};
use zerocopy::FromZeros;
use zerocopy::little_endian::U32;

fn new(op: u8, nsid: u32) -> Sqe {
    let mut s = Sqe::new_zeroed();
    s.opcode = op;
    s.nsid = U32::new(nsid);
    s
}

/// NLB field (0's based, 16 bits) from a block count in 1..=65536; 0 reads as 65536.
fn nlb0(nlb: u32) -> u32 {
    nlb.wrapping_sub(1) & 0xFFFF
}

fn lba_cmd(op: u8, nsid: u32, slba: u64, nlb: u32) -> Sqe {
    let mut s = new(op, nsid);
    s.cdw10 = U32::new(slba as u32);
    s.cdw11 = U32::new((slba >> 32) as u32);
    s.cdw12 = U32::new(nlb0(nlb));
    s
}

/// Read (NVM command set §3.3.4): `nlb` blocks (1..=65536) from `slba`.
pub fn read(nsid: u32, slba: u64, nlb: u32) -> Sqe {
    lba_cmd(opcode::io::READ, nsid, slba, nlb)
}

/// Write (NVM command set §3.3.6): `nlb` blocks (1..=65536) at `slba`.
pub fn write(nsid: u32, slba: u64, nlb: u32) -> Sqe {
    lba_cmd(opcode::io::WRITE, nsid, slba, nlb)
}

/// Compare (NVM command set §3.2.1): `nlb` blocks at `slba` against the command's data.
pub fn compare(nsid: u32, slba: u64, nlb: u32) -> Sqe {
    lba_cmd(opcode::io::COMPARE, nsid, slba, nlb)
}

/// Verify (NVM command set §3.2.4): `nlb` blocks at `slba`, no data.
pub fn verify(nsid: u32, slba: u64, nlb: u32) -> Sqe {
    lba_cmd(opcode::io::VERIFY, nsid, slba, nlb)
}

/// Reservation Register (NVM Command Set 1.0 §7.3): RREGA `action` (0 register, 1
/// unregister, 2 replace), IEKEY, CPTPL (0 no change, 2 clear, 3 set); data
/// [`resv_keys`]`(crkey, nrkey)`.
pub fn resv_register(nsid: u32, action: u32, iekey: bool, cptpl: u32) -> Sqe {
    let mut s = new(opcode::io::RESERVATION_REGISTER, nsid);
    s.cdw10 = U32::new(action | (u32::from(iekey) << 3) | (cptpl << 30));
    s
}

/// Reservation Acquire (§7.4): RACQA `action` (0 acquire, 1 preempt, 2 preempt and abort)
/// of type `rtype`; data [`resv_keys`]`(crkey, prkey)`.
pub fn resv_acquire(nsid: u32, action: u32, rtype: u8) -> Sqe {
    let mut s = new(opcode::io::RESERVATION_ACQUIRE, nsid);
    s.cdw10 = U32::new(action | (u32::from(rtype) << 8));
    s
}

/// Reservation Release (§7.5): RRELA `action` (0 release, 1 clear) of type `rtype`; data
/// `crkey` (8 bytes, [`resv_keys`] with one key).
pub fn resv_release(nsid: u32, action: u32, rtype: u8) -> Sqe {
    let mut s = new(opcode::io::RESERVATION_RELEASE, nsid);
    s.cdw10 = U32::new(action | (u32::from(rtype) << 8));
    s
}

/// Reservation Report (§7.6) into a buffer of `len` bytes (a multiple of 4), with the
/// extended data structure when `eds`.
pub fn resv_report(nsid: u32, len: u32, eds: bool) -> Sqe {
    let mut s = new(opcode::io::RESERVATION_REPORT, nsid);
    s.cdw10 = U32::new((len / 4).saturating_sub(1));
    s.cdw11 = U32::new(u32::from(eds));
    s
}

/// The data of a reservation command: its keys, little-endian.
pub fn resv_keys(keys: &[u64]) -> Vec<u8> {
    keys.iter().flat_map(|k| k.to_le_bytes()).collect()
}

/// Write Zeroes (NVM command set §3.3.7): `nlb` blocks (1..=65536) at `slba`.
pub fn write_zeroes(nsid: u32, slba: u64, nlb: u32) -> Sqe {
    lba_cmd(opcode::io::WRITE_ZEROES, nsid, slba, nlb)
}

/// Flush (base spec §7.1); `nsid` FFFFFFFFh flushes every namespace.
pub fn flush(nsid: u32) -> Sqe {
    new(opcode::io::FLUSH, nsid)
}

/// Dataset Management attribute: Deallocate (AD, CDW11 bit 2).
pub const DSM_DEALLOCATE: u32 = 1 << 2;

/// Dataset Management (NVM command set §3.2.3) over `nr` ranges (1..=256) of 16 bytes that
/// travel as host-to-controller data; `attributes` is CDW11 (e.g. [`DSM_DEALLOCATE`]).
pub fn dsm(nsid: u32, nr: u32, attributes: u32) -> Sqe {
    let mut s = new(opcode::io::DATASET_MANAGEMENT, nsid);
    s.cdw10 = U32::new(nr.wrapping_sub(1) & 0xFF);
    s.cdw11 = U32::new(attributes);
    s
}

/// One Dataset Management range (NVM command set §3.2.3, Figure 39).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DsmRange {
    /// Context attributes.
    pub cattr: u32,
    /// Length in logical blocks (1's based; 0 is an empty range).
    pub nlb: u32,
    /// Starting LBA.
    pub slba: u64,
}

impl DsmRange {
    /// The 16-byte wire form.
    pub fn to_bytes(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[0..4].copy_from_slice(&self.cattr.to_le_bytes());
        b[4..8].copy_from_slice(&self.nlb.to_le_bytes());
        b[8..16].copy_from_slice(&self.slba.to_le_bytes());
        b
    }
}

/// A fused Compare and Write (NVMe 2.0 §3.4.2): the Compare (FUSE 01b) and the Write (FUSE
/// 10b) of `nlb` blocks at `slba`, to submit one after the other on one queue; the Compare
/// carries the expected data, the Write the new data.
pub fn compare_and_write(nsid: u32, slba: u64, nlb: u32) -> (Sqe, Sqe) {
    let mut first = compare(nsid, slba, nlb);
    first.set_fuse(Sqe::FUSE_FIRST);
    let mut second = write(nsid, slba, nlb);
    second.set_fuse(Sqe::FUSE_SECOND);
    (first, second)
}

/// `s` with its FUSE field (flags bits 1:0) set to `fuse`.
pub fn fused(mut s: Sqe, fuse: u8) -> Sqe {
    s.set_fuse(fuse);
    s
}

/// Copy (NVM command set §3.2.2) of `nr` source ranges (1..=256, format 0, as
/// host-to-controller data: [`CopyRange`]) to `sdlba`; `fua` forces unit access.
pub fn copy(nsid: u32, sdlba: u64, nr: u32, fua: bool) -> Sqe {
    let mut s = new(opcode::io::COPY, nsid);
    s.cdw10 = U32::new(sdlba as u32);
    s.cdw11 = U32::new((sdlba >> 32) as u32);
    s.cdw12 = U32::new((nr.wrapping_sub(1) & 0xFF) | if fua { 1 << 30 } else { 0 });
    s
}

/// One Copy source range, format 0 (NVM command set §3.2.2.1, Figure 50).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CopyRange {
    /// Starting LBA.
    pub slba: u64,
    /// Length in logical blocks (1..=65536).
    pub nlb: u32,
}

impl CopyRange {
    /// The 32-byte wire form.
    pub fn to_bytes(&self) -> [u8; 32] {
        let mut b = [0u8; 32];
        b[8..16].copy_from_slice(&self.slba.to_le_bytes());
        b[16..18].copy_from_slice(&(nlb0(self.nlb) as u16).to_le_bytes());
        b
    }

    /// The data of a Copy of `ranges`.
    pub fn data(ranges: &[CopyRange]) -> Vec<u8> {
        ranges.iter().flat_map(|r| r.to_bytes()).collect()
    }
}

/// Identify (base spec §5.17) with `cns`, for `nsid`.
pub fn identify(cns: u8, nsid: u32) -> Sqe {
    let mut s = new(opcode::admin::IDENTIFY, nsid);
    s.cdw10 = U32::new(u32::from(cns));
    s
}

/// Get Log Page (base spec §5.16): `len` bytes (a multiple of 4, >= 4) of log `lid` from
/// byte `offset`; `rae` retains the asynchronous event.
pub fn get_log_page(lid: u8, len: u32, offset: u64, rae: bool) -> Sqe {
    let mut s = new(opcode::admin::GET_LOG_PAGE, 0);
    // NUMD is 0's based dwords, split in NUMDL (CDW10 31:16) and NUMDU (CDW11 15:0).
    let numd = (len / 4).saturating_sub(1);
    s.cdw10 = U32::new(u32::from(lid) | (u32::from(rae) << 15) | ((numd & 0xFFFF) << 16));
    s.cdw11 = U32::new(numd >> 16);
    s.cdw12 = U32::new(offset as u32);
    s.cdw13 = U32::new((offset >> 32) as u32);
    s
}

/// Set Features (base spec §5.27) `fid` with CDW11 `value`.
pub fn set_features(fid: u8, value: u32) -> Sqe {
    let mut s = new(opcode::admin::SET_FEATURES, 0);
    s.cdw10 = U32::new(u32::from(fid));
    s.cdw11 = U32::new(value);
    s
}

/// Get Features (base spec §5.15) `fid`, select `sel` (0: current), CDW11 `cdw11`.
pub fn get_features(fid: u8, sel: u8, cdw11: u32) -> Sqe {
    let mut s = new(opcode::admin::GET_FEATURES, 0);
    s.cdw10 = U32::new(u32::from(fid) | (u32::from(sel & 7) << 8));
    s.cdw11 = U32::new(cdw11);
    s
}

/// Keep Alive (base spec §5.19).
pub fn keep_alive() -> Sqe {
    new(opcode::admin::KEEP_ALIVE, 0)
}

/// Asynchronous Event Request (base spec §5.2).
pub fn async_event_request() -> Sqe {
    new(opcode::admin::ASYNC_EVENT_REQUEST, 0)
}

/// Abort (base spec §5.1) of command `cid` on submission queue `sqid`.
pub fn abort(sqid: u16, cid: u16) -> Sqe {
    let mut s = new(opcode::admin::ABORT, 0);
    s.cdw10 = U32::new(u32::from(sqid) | (u32::from(cid) << 16));
    s
}

/// A fabrics command of type `fctype`, fields zero.
pub fn fabrics_cmd(fctype: u8) -> Sqe {
    fabrics(fctype)
}

fn fabrics(fctype: u8) -> Sqe {
    let mut s = new(opcode::FABRICS, 0);
    s.set_fctype(fctype);
    s
}

/// Property Get (NVMe-oF 1.1 §6.5) of the property at `offset`; `size8` for 8-byte ones.
pub fn property_get(offset: u32, size8: bool) -> Sqe {
    let mut s = fabrics(opcode::fctype::PROPERTY_GET);
    s.cdw10 = U32::new(u32::from(size8));
    s.cdw11 = U32::new(offset);
    s
}

/// Property Set (NVMe-oF 1.1 §6.6) of the property at `offset` to `value`.
pub fn property_set(offset: u32, value: u64, size8: bool) -> Sqe {
    let mut s = fabrics(opcode::fctype::PROPERTY_SET);
    s.cdw10 = U32::new(u32::from(size8));
    s.cdw11 = U32::new(offset);
    s.cdw12 = U32::new(value as u32);
    s.cdw13 = U32::new((value >> 32) as u32);
    s
}

/// Connect (NVMe-oF 1.1 §6.3): RECFMT 0, queue `qid`, 0's based `sqsize`, `cattr`, KATO in
/// ms. The 1024-byte Connect data travels in-capsule.
pub fn connect(qid: u16, sqsize: u16, cattr: u8, kato_ms: u32) -> Sqe {
    let mut s = fabrics(opcode::fctype::CONNECT);
    s.cdw10 = U32::new(u32::from(qid) << 16);
    s.cdw11 = U32::new(u32::from(sqsize) | (u32::from(cattr) << 16));
    s.cdw12 = U32::new(kato_ms);
    s
}

/// Disconnect (NVMe-oF 1.1 §6.4) of the I/O queue it is sent on.
pub fn disconnect() -> Sqe {
    fabrics(opcode::fctype::DISCONNECT)
}

/// The 1024-byte Connect data (NVMe-oF 1.1 §6.3, Figure 20), [`nvmf_connect_data`]: HOSTID,
/// CNTLID, SUBNQN, HOSTNQN. NQNs longer than 255 bytes are cut (they would be invalid
/// anyway): the fields stay NUL-terminated.
pub fn connect_data(hostid: &[u8; 16], cntlid: u16, subnqn: &str, hostnqn: &str) -> [u8; 1024] {
    let mut d = nvmf_connect_data::new_zeroed();
    d.hostid = *hostid;
    d.cntlid = cntlid.to_le();
    nul_terminated(&mut d.subsysnqn, subnqn);
    nul_terminated(&mut d.hostnqn, hostnqn);
    // The sizes are checked at compile time: the structure is 1024 bytes.
    zerocopy::transmute!(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Connect data at the spec's byte offsets (NVMe-oF 1.1 §6.3, Figure 20: HOSTID 0,
    /// CNTLID 16, SUBNQN 256, HOSTNQN 512), not through the bindgen struct that builds it.
    #[test]
    fn connect_data_sits_at_the_spec_offsets_and_its_nqns_stay_terminated() {
        let d = connect_data(&[7; 16], 0x1234, "nqn.a", "nqn.b");
        assert_eq!(d[..16], [7; 16]);
        assert_eq!(d[16..18], [0x34, 0x12]);
        assert_eq!(&d[256..262], b"nqn.a\0");
        assert_eq!(&d[512..518], b"nqn.b\0");
        assert!(d[18..256].iter().chain(&d[262..512]).chain(&d[518..]).all(|&b| b == 0));
        // An NQN longer than its field is cut to 255 bytes, the last one NUL.
        let long = "n".repeat(300);
        let d = connect_data(&[0; 16], 0, &long, &long);
        assert!(d[256..511].iter().chain(&d[512..767]).all(|&b| b == b'n'));
        assert_eq!((d[511], d[767]), (0, 0));
    }
}
