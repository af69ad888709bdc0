//! Hand-written NVMe base spec 2.0 wire structures and constants: the submission queue entry
//! (SQE, §4.2), the completion queue entry (CQE, §4.6), the SGL descriptor (§4.3.2), status
//! values (§4.6.1.2), opcodes (§5, NVM command set spec §3, NVMe-oF 1.1 §6) and the
//! controller properties a fabrics target exposes (§3.1.3).
//!
//! Multi-byte fields use `zerocopy::little_endian` types: the structs have alignment 1, can be
//! read from any offset of a receive buffer, and are correct on any host.

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::bindings::{
    nvme_admin_opcode as ao, nvme_cmd_get_log_lid as lid, nvme_fctype as fct, nvme_features_id as fid,
    nvme_identify_cns as cns_b, nvme_io_opcode as io_b, nvme_register_offsets as reg, nvme_status_field as sf,
};

// ---------------------------------------------------------------------------------------------
// SGL descriptor (§4.3.2)
// ---------------------------------------------------------------------------------------------

/// SGL descriptor (NVMe base spec 2.0 §4.3.2, 16 bytes).
///
/// Byte 15 is the SGL identifier: descriptor type in bits 7:4, subtype in bits 3:0. For a
/// Keyed SGL Data Block (RDMA) bytes 8..11 are a 3-byte length and 11..15 the key; NVMe/TCP
/// only uses the unkeyed forms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct SglDescriptor {
    /// Address (or, for subtype Offset, the offset into the in-capsule data).
    pub address: U64,
    /// Length in bytes.
    pub length: U32,
    /// Reserved (type specific).
    pub rsvd: [u8; 3],
    /// SGL identifier: type (7:4) and subtype (3:0).
    pub id: u8,
}
const _: () = assert!(size_of::<SglDescriptor>() == 16);

impl SglDescriptor {
    /// Descriptor type: SGL Data Block (§4.3.2.1, Figure 118).
    pub const TYPE_DATA_BLOCK: u8 = 0x0;
    /// Descriptor type: SGL Bit Bucket.
    pub const TYPE_BIT_BUCKET: u8 = 0x1;
    /// Descriptor type: SGL Segment.
    pub const TYPE_SEGMENT: u8 = 0x2;
    /// Descriptor type: SGL Last Segment.
    pub const TYPE_LAST_SEGMENT: u8 = 0x3;
    /// Descriptor type: Keyed SGL Data Block.
    pub const TYPE_KEYED_DATA_BLOCK: u8 = 0x4;
    /// Descriptor type: Transport SGL Data Block.
    pub const TYPE_TRANSPORT_DATA_BLOCK: u8 = 0x5;

    /// Subtype: Address (Figure 119).
    pub const SUBTYPE_ADDRESS: u8 = 0x0;
    /// Subtype: Offset (the address is an offset into the in-capsule data).
    pub const SUBTYPE_OFFSET: u8 = 0x1;
    /// Subtype: Transport specific.
    pub const SUBTYPE_TRANSPORT_SPECIFIC: u8 = 0xA;
    /// Subtype: Invalidate Key (keyed data block only).
    pub const SUBTYPE_INVALIDATE_KEY: u8 = 0xF;

    /// Identifier of an SGL Data Block with Offset subtype: in-capsule data (NVMe/TCP 1.0
    /// §3.3.2: the data follows the SQE in the CapsuleCmd PDU).
    pub const ID_DATA_BLOCK_OFFSET: u8 = 0x01;
    /// Identifier of an SGL Data Block with Address subtype.
    pub const ID_DATA_BLOCK_ADDRESS: u8 = 0x00;
    /// Identifier of a Last Segment descriptor with Offset subtype.
    pub const ID_LAST_SEGMENT_OFFSET: u8 = 0x31;
    /// Identifier of a Keyed SGL Data Block with Address subtype (RDMA).
    pub const ID_KEYED_DATA_BLOCK: u8 = 0x40;
    /// Identifier of a Keyed SGL Data Block with Invalidate Key subtype (RDMA).
    pub const ID_KEYED_DATA_BLOCK_INVALIDATE: u8 = 0x4F;
    /// Identifier of a Transport SGL Data Block with transport specific subtype: the data is
    /// moved by R2T/H2CData (writes) or C2HData (reads) on NVMe/TCP.
    pub const ID_TRANSPORT_DATA_BLOCK: u8 = 0x5A;

    /// A descriptor with the given fields.
    pub const fn new(address: u64, length: u32, id: u8) -> Self {
        Self {
            address: U64::new(address),
            length: U32::new(length),
            rsvd: [0; 3],
            id,
        }
    }

    /// In-capsule data: SGL Data Block, Offset subtype, `offset` into the in-capsule data.
    pub const fn in_capsule(offset: u64, length: u32) -> Self {
        Self::new(offset, length, Self::ID_DATA_BLOCK_OFFSET)
    }

    /// Transport SGL Data Block (0x5A) of `length` bytes, address 0.
    pub const fn transport_data_block(length: u32) -> Self {
        Self::new(0, length, Self::ID_TRANSPORT_DATA_BLOCK)
    }

    /// Descriptor type (identifier bits 7:4).
    pub const fn sgl_type(&self) -> u8 {
        self.id >> 4
    }

    /// Descriptor subtype (identifier bits 3:0).
    pub const fn subtype(&self) -> u8 {
        self.id & 0xF
    }
}

// ---------------------------------------------------------------------------------------------
// Submission queue entry (§4.2)
// ---------------------------------------------------------------------------------------------

/// Submission queue entry, common command format (NVMe base spec 2.0 §4.2, Figure 88; 64
/// bytes). Fabrics commands (opcode 0x7F, NVMe-oF 1.1 §6.1) keep FCTYPE in byte 4, where
/// NSID is: see [`Sqe::fctype`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct Sqe {
    /// CDW0 bits 7:0: opcode.
    pub opcode: u8,
    /// CDW0 bits 15:8: FUSE (bits 1:0) and PSDT (bits 7:6).
    pub flags: u8,
    /// CDW0 bits 31:16: command identifier (CID), chosen by the host.
    pub cid: U16,
    /// Namespace identifier; fabrics commands: FCTYPE in byte 0 of this field.
    pub nsid: U32,
    /// Command dword 2.
    pub cdw2: U32,
    /// Command dword 3.
    pub cdw3: U32,
    /// Metadata pointer.
    pub mptr: U64,
    /// Data pointer: PRP entry 1 and 2, or an SGL descriptor (SGL1).
    pub dptr: [u8; 16],
    /// Command dword 10.
    pub cdw10: U32,
    /// Command dword 11.
    pub cdw11: U32,
    /// Command dword 12.
    pub cdw12: U32,
    /// Command dword 13.
    pub cdw13: U32,
    /// Command dword 14.
    pub cdw14: U32,
    /// Command dword 15.
    pub cdw15: U32,
}
const _: () = assert!(size_of::<Sqe>() == 64);

impl Sqe {
    /// FUSE: normal operation (flags bits 1:0).
    pub const FUSE_NONE: u8 = 0;
    /// FUSE: first command of a fused operation.
    pub const FUSE_FIRST: u8 = 1;
    /// FUSE: second command of a fused operation.
    pub const FUSE_SECOND: u8 = 2;
    /// PSDT (flags bits 7:6): PRPs.
    pub const PSDT_PRP: u8 = 0;
    /// PSDT: SGLs, MPTR is a contiguous buffer. Required for fabrics (NVMe-oF 1.1 §2.3.1),
    /// what Linux calls `NVME_CMD_SGL_METABUF`.
    pub const PSDT_SGL_MPTR_CONTIGUOUS: u8 = 1;
    /// PSDT: SGLs, MPTR is an SGL segment.
    pub const PSDT_SGL_MPTR_SGL: u8 = 2;

    /// FUSE field (flags bits 1:0).
    pub const fn fuse(&self) -> u8 {
        self.flags & 0x3
    }

    /// PSDT field (flags bits 7:6).
    pub const fn psdt(&self) -> u8 {
        self.flags >> 6
    }

    /// Sets the FUSE field (flags bits 1:0).
    pub fn set_fuse(&mut self, fuse: u8) {
        self.flags = (self.flags & !0x3) | (fuse & 0x3);
    }

    /// Sets the PSDT field (flags bits 7:6).
    pub fn set_psdt(&mut self, psdt: u8) {
        self.flags = (self.flags & 0x3F) | ((psdt & 0x3) << 6);
    }

    /// Fabrics command type (byte 4), meaningful when `opcode == opcode::FABRICS`.
    pub fn fctype(&self) -> u8 {
        self.nsid.to_bytes()[0]
    }

    /// Sets the fabrics command type (byte 4); bytes 5..8 are reserved and cleared.
    pub fn set_fctype(&mut self, fctype: u8) {
        self.nsid = U32::new(u32::from(fctype));
    }

    /// DPTR read as an SGL descriptor (SGL1).
    pub fn sgl(&self) -> SglDescriptor {
        zerocopy::transmute!(self.dptr)
    }

    /// Stores an SGL descriptor in DPTR.
    pub fn set_sgl(&mut self, sgl: &SglDescriptor) {
        self.dptr.copy_from_slice(sgl.as_bytes());
    }

    /// PRP entry 1 (DPTR bytes 0..8).
    pub fn prp1(&self) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.dptr[..8]);
        u64::from_le_bytes(b)
    }

    /// PRP entry 2 (DPTR bytes 8..16).
    pub fn prp2(&self) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.dptr[8..]);
        u64::from_le_bytes(b)
    }

    /// Stores PRP entries 1 and 2 in DPTR.
    pub fn set_prps(&mut self, prp1: u64, prp2: u64) {
        self.dptr[..8].copy_from_slice(&prp1.to_le_bytes());
        self.dptr[8..].copy_from_slice(&prp2.to_le_bytes());
    }
}

// ---------------------------------------------------------------------------------------------
// Completion queue entry and status (§4.6)
// ---------------------------------------------------------------------------------------------

/// Completion queue entry (NVMe base spec 2.0 §4.6, Figure 89; 16 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct Cqe {
    /// DW0: command specific result (Connect: controller ID in bits 15:0; Property Get:
    /// low 32 bits of the value).
    pub dw0: U32,
    /// DW1: command specific (Property Get of an 8-byte property: high 32 bits).
    pub dw1: U32,
    /// SQ head pointer.
    pub sqhd: U16,
    /// SQ identifier.
    pub sqid: U16,
    /// Command identifier of the completed command.
    pub cid: U16,
    /// Phase tag (bit 0) and status field (bits 15:1).
    pub status: U16,
}
const _: () = assert!(size_of::<Cqe>() == 16);

impl Cqe {
    /// A completion with the given status and DW0 result; DW1 and phase are 0 (fabrics
    /// transports do not use the phase tag).
    pub const fn new(cid: u16, sqid: u16, sqhd: u16, status: Status, dw0: u32) -> Self {
        Self {
            dw0: U32::new(dw0),
            dw1: U32::new(0),
            sqhd: U16::new(sqhd),
            sqid: U16::new(sqid),
            cid: U16::new(cid),
            status: U16::new(status.to_cqe_field()),
        }
    }

    /// A successful completion with DW0 = 0.
    pub const fn success(cid: u16, sqid: u16, sqhd: u16) -> Self {
        Self::new(cid, sqid, sqhd, Status::SUCCESS, 0)
    }

    /// A completion carrying a 64-bit result in DW0 (low) and DW1 (high), e.g. Property Get
    /// of CAP.
    pub const fn with_result64(cid: u16, sqid: u16, sqhd: u16, status: Status, result: u64) -> Self {
        let mut cqe = Self::new(cid, sqid, sqhd, status, result as u32);
        cqe.dw1 = U32::new((result >> 32) as u32);
        cqe
    }

    /// The 64-bit result DW1:DW0.
    pub fn result64(&self) -> u64 {
        (u64::from(self.dw1.get()) << 32) | u64::from(self.dw0.get())
    }

    /// The status field (bits 15:1 of the status word).
    pub fn status(&self) -> Status {
        Status::from_cqe_field(self.status.get())
    }

    /// The phase tag (bit 0 of the status word).
    pub fn phase(&self) -> bool {
        self.status.get() & 1 != 0
    }

    /// Sets the phase tag.
    pub fn set_phase(&mut self, phase: bool) {
        self.status = U16::new((self.status.get() & !1) | u16::from(phase));
    }
}

/// Status Code Type values (§4.6.1.2.1, Figure 93).
pub mod sct {
    use super::sf;
    /// Generic command status.
    pub const GENERIC: u8 = sf::NVME_SCT_GENERIC as u8;
    /// Command specific status.
    pub const COMMAND_SPECIFIC: u8 = sf::NVME_SCT_CMD_SPECIFIC as u8;
    /// Media and data integrity errors.
    pub const MEDIA: u8 = sf::NVME_SCT_MEDIA as u8;
    /// Path related status.
    pub const PATH: u8 = sf::NVME_SCT_PATH as u8;
    /// Vendor specific.
    pub const VENDOR: u8 = sf::NVME_SCT_VS as u8;
}

/// The 15-bit status field of a CQE (NVMe base spec 2.0 §4.6.1, Figure 92): SC (bits 7:0),
/// SCT (10:8), CRD (12:11), More (13), DNR (14). In the CQE status word it sits in bits
/// 15:1, above the phase tag.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Status(u16);

impl std::fmt::Debug for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Status(sct={:#x}, sc={:#04x}", self.sct(), self.sc())?;
        if self.more() {
            f.write_str(", more")?;
        }
        if self.dnr() {
            f.write_str(", dnr")?;
        }
        f.write_str(")")
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self, f)
    }
}

const fn sc(sct: u8, sc: u32) -> Status {
    Status::new(sct, sc as u8)
}

impl Status {
    const SCT_SHIFT: u16 = sf::NVME_SCT_SHIFT as u16;
    const MORE_BIT: u16 = sf::NVME_SC_MORE as u16;
    const DNR_BIT: u16 = sf::NVME_SC_DNR as u16;

    /// A status from its code type (3 bits) and code.
    pub const fn new(sct: u8, sc: u8) -> Self {
        Self((((sct & 0x7) as u16) << Self::SCT_SHIFT) | sc as u16)
    }

    /// From the 15-bit status field (bits 14:0; bit 15 is ignored).
    pub const fn from_field(field: u16) -> Self {
        Self(field & 0x7FFF)
    }

    /// From a CQE status word (bits 15:1; the phase tag is dropped).
    pub const fn from_cqe_field(word: u16) -> Self {
        Self(word >> 1)
    }

    /// The 15-bit status field.
    pub const fn field(self) -> u16 {
        self.0
    }

    /// The status field shifted into the CQE status word (phase tag 0).
    pub const fn to_cqe_field(self) -> u16 {
        self.0 << 1
    }

    /// Status Code Type.
    pub const fn sct(self) -> u8 {
        ((self.0 >> Self::SCT_SHIFT) & 0x7) as u8
    }

    /// Status Code.
    pub const fn sc(self) -> u8 {
        (self.0 & 0xFF) as u8
    }

    /// Do Not Retry.
    pub const fn dnr(self) -> bool {
        self.0 & Self::DNR_BIT != 0
    }

    /// More (more status information in the Error Information log page).
    pub const fn more(self) -> bool {
        self.0 & Self::MORE_BIT != 0
    }

    /// The same status with Do Not Retry set.
    pub const fn with_dnr(self) -> Self {
        Self(self.0 | Self::DNR_BIT)
    }

    /// The same status with More set.
    pub const fn with_more(self) -> Self {
        Self(self.0 | Self::MORE_BIT)
    }

    /// SCT 0, SC 0.
    pub const fn is_success(self) -> bool {
        self.0 & 0x7FF == 0
    }

    /// Successful Completion.
    pub const SUCCESS: Self = sc(sct::GENERIC, sf::NVME_SC_SUCCESS);
    /// Generic 0x01: Invalid Command Opcode.
    pub const INVALID_OPCODE: Self = sc(sct::GENERIC, sf::NVME_SC_INVALID_OPCODE);
    /// Generic 0x02: Invalid Field in Command.
    pub const INVALID_FIELD: Self = sc(sct::GENERIC, sf::NVME_SC_INVALID_FIELD);
    /// Generic 0x03: Command ID Conflict.
    pub const CID_CONFLICT: Self = sc(sct::GENERIC, sf::NVME_SC_CMDID_CONFLICT);
    /// Generic 0x04: Data Transfer Error.
    pub const DATA_TRANSFER_ERROR: Self = sc(sct::GENERIC, sf::NVME_SC_DATA_XFER_ERROR);
    /// Generic 0x06: Internal Error.
    pub const INTERNAL_ERROR: Self = sc(sct::GENERIC, sf::NVME_SC_INTERNAL);
    /// Generic 0x07: Command Abort Requested.
    pub const ABORT_REQUESTED: Self = sc(sct::GENERIC, sf::NVME_SC_ABORT_REQ);
    /// Generic 0x08: Command Aborted due to SQ Deletion.
    pub const ABORTED_SQ_DELETION: Self = sc(sct::GENERIC, sf::NVME_SC_ABORT_QUEUE);
    /// Generic 0x0B: Invalid Namespace or Format.
    pub const INVALID_NAMESPACE: Self = sc(sct::GENERIC, sf::NVME_SC_INVALID_NS);
    /// Generic 0x0C: Command Sequence Error.
    pub const COMMAND_SEQUENCE_ERROR: Self = sc(sct::GENERIC, sf::NVME_SC_CMD_SEQ_ERROR);
    /// Generic 0x0D: Invalid SGL Segment Descriptor.
    pub const INVALID_SGL_SEG_DESCRIPTOR: Self = sc(sct::GENERIC, sf::NVME_SC_SGL_INVALID_LAST);
    /// Generic 0x0F: Data SGL Length Invalid.
    pub const DATA_SGL_LENGTH_INVALID: Self = sc(sct::GENERIC, sf::NVME_SC_SGL_INVALID_DATA);
    /// Generic 0x11: SGL Descriptor Type Invalid.
    pub const SGL_DESCRIPTOR_TYPE_INVALID: Self = sc(sct::GENERIC, sf::NVME_SC_SGL_INVALID_TYPE);
    /// Generic 0x16: SGL Offset Invalid.
    pub const SGL_OFFSET_INVALID: Self = sc(sct::GENERIC, sf::NVME_SC_SGL_INVALID_OFFSET);
    /// Generic 0x1A: Keep Alive Timeout Invalid.
    pub const KEEP_ALIVE_TIMEOUT_INVALID: Self = sc(sct::GENERIC, sf::NVME_SC_KAT_INVALID);
    /// Generic 0x22: Transient Transport Error (what a command completes with when its data
    /// failed the NVMe/TCP data digest (NVMe/TCP 1.0, data digest error handling).
    pub const TRANSIENT_TRANSPORT_ERROR: Self = sc(sct::GENERIC, sf::NVME_SC_TRAN_TPORT_ERROR);
    /// Generic (NVM command set) 0x80: LBA Out of Range.
    pub const LBA_OUT_OF_RANGE: Self = sc(sct::GENERIC, sf::NVME_SC_LBA_RANGE);
    /// Generic (NVM command set) 0x81: Capacity Exceeded.
    pub const CAPACITY_EXCEEDED: Self = sc(sct::GENERIC, sf::NVME_SC_CAP_EXCEEDED);
    /// Generic (NVM command set) 0x82: Namespace Not Ready.
    pub const NAMESPACE_NOT_READY: Self = sc(sct::GENERIC, sf::NVME_SC_NS_NOT_READY);

    /// Command specific 0x01: Invalid Queue Identifier.
    pub const INVALID_QUEUE_IDENTIFIER: Self = sc(sct::COMMAND_SPECIFIC, sf::NVME_SC_QID_INVALID);
    /// Command specific 0x02: Invalid Queue Size.
    pub const INVALID_QUEUE_SIZE: Self = sc(sct::COMMAND_SPECIFIC, sf::NVME_SC_QUEUE_SIZE);
    /// Command specific 0x03: Abort Command Limit Exceeded.
    pub const ABORT_COMMAND_LIMIT_EXCEEDED: Self = sc(sct::COMMAND_SPECIFIC, sf::NVME_SC_ABORT_LIMIT);
    /// Command specific 0x05: Asynchronous Event Request Limit Exceeded.
    pub const ASYNC_EVENT_REQUEST_LIMIT_EXCEEDED: Self = sc(sct::COMMAND_SPECIFIC, sf::NVME_SC_ASYNC_LIMIT);
    /// Command specific 0x09: Invalid Log Page.
    pub const INVALID_LOG_PAGE: Self = sc(sct::COMMAND_SPECIFIC, sf::NVME_SC_INVALID_LOG_PAGE);
    /// Command specific 0x0D: Feature Identifier Not Saveable.
    pub const FEATURE_NOT_SAVEABLE: Self = sc(sct::COMMAND_SPECIFIC, sf::NVME_SC_FEATURE_NOT_SAVEABLE);
    /// Command specific 0x0E: Feature Not Changeable.
    pub const FEATURE_NOT_CHANGEABLE: Self = sc(sct::COMMAND_SPECIFIC, sf::NVME_SC_FEATURE_NOT_CHANGEABLE);
    /// Fabrics Connect 0x80: Incompatible Format (NVMe-oF 1.1 §3.3, Figure 22).
    pub const CONNECT_INCOMPATIBLE_FORMAT: Self = sc(sct::COMMAND_SPECIFIC, sf::NVME_SC_CONNECT_FORMAT);
    /// Fabrics Connect 0x81: Controller Busy.
    pub const CONNECT_CONTROLLER_BUSY: Self = sc(sct::COMMAND_SPECIFIC, sf::NVME_SC_CONNECT_CTRL_BUSY);
    /// Fabrics Connect 0x82: Connect Invalid Parameters (DW0 of the CQE says which: IATTR
    /// bit 0 = in the data, IPO = byte offset).
    pub const CONNECT_INVALID_PARAMETERS: Self = sc(sct::COMMAND_SPECIFIC, sf::NVME_SC_CONNECT_INVALID_PARAM);
    /// Fabrics Connect 0x83: Connect Restart Discovery.
    pub const CONNECT_RESTART_DISCOVERY: Self = sc(sct::COMMAND_SPECIFIC, sf::NVME_SC_CONNECT_RESTART_DISC);
    /// Fabrics Connect 0x84: Connect Invalid Host.
    pub const CONNECT_INVALID_HOST: Self = sc(sct::COMMAND_SPECIFIC, sf::NVME_SC_CONNECT_INVALID_HOST);

    /// Media 0x80: Write Fault.
    pub const WRITE_FAULT: Self = sc(sct::MEDIA, sf::NVME_SC_WRITE_FAULT);
    /// Media 0x81: Unrecovered Read Error.
    pub const UNRECOVERED_READ_ERROR: Self = sc(sct::MEDIA, sf::NVME_SC_READ_ERROR);
    /// Media 0x85: Compare Failure.
    pub const COMPARE_FAILURE: Self = sc(sct::MEDIA, sf::NVME_SC_COMPARE_FAILED);
}

// ---------------------------------------------------------------------------------------------
// Opcodes
// ---------------------------------------------------------------------------------------------

/// Command opcodes and fabrics command types, as `u8` (the header's enums are `u32`).
pub mod opcode {
    use super::{ao, fct, io_b};

    /// Fabrics command opcode (NVMe-oF 1.1 §6.1), valid on admin and I/O queues.
    pub const FABRICS: u8 = ao::nvme_admin_fabrics as u8;

    /// Admin command opcodes (NVMe base spec 2.0 §5, Figure 138).
    pub mod admin {
        use super::ao;
        /// Delete I/O Submission Queue.
        pub const DELETE_SQ: u8 = ao::nvme_admin_delete_sq as u8;
        /// Create I/O Submission Queue.
        pub const CREATE_SQ: u8 = ao::nvme_admin_create_sq as u8;
        /// Get Log Page.
        pub const GET_LOG_PAGE: u8 = ao::nvme_admin_get_log_page as u8;
        /// Delete I/O Completion Queue.
        pub const DELETE_CQ: u8 = ao::nvme_admin_delete_cq as u8;
        /// Create I/O Completion Queue.
        pub const CREATE_CQ: u8 = ao::nvme_admin_create_cq as u8;
        /// Identify.
        pub const IDENTIFY: u8 = ao::nvme_admin_identify as u8;
        /// Abort.
        pub const ABORT: u8 = ao::nvme_admin_abort_cmd as u8;
        /// Set Features.
        pub const SET_FEATURES: u8 = ao::nvme_admin_set_features as u8;
        /// Get Features.
        pub const GET_FEATURES: u8 = ao::nvme_admin_get_features as u8;
        /// Asynchronous Event Request.
        pub const ASYNC_EVENT_REQUEST: u8 = ao::nvme_admin_async_event as u8;
        /// Namespace Management.
        pub const NS_MANAGEMENT: u8 = ao::nvme_admin_ns_mgmt as u8;
        /// Firmware Commit.
        pub const FW_COMMIT: u8 = ao::nvme_admin_fw_commit as u8;
        /// Firmware Image Download.
        pub const FW_DOWNLOAD: u8 = ao::nvme_admin_fw_download as u8;
        /// Device Self-test.
        pub const DEVICE_SELF_TEST: u8 = ao::nvme_admin_dev_self_test as u8;
        /// Namespace Attachment.
        pub const NS_ATTACHMENT: u8 = ao::nvme_admin_ns_attach as u8;
        /// Keep Alive.
        pub const KEEP_ALIVE: u8 = ao::nvme_admin_keep_alive as u8;
        /// Directive Send.
        pub const DIRECTIVE_SEND: u8 = ao::nvme_admin_directive_send as u8;
        /// Directive Receive.
        pub const DIRECTIVE_RECEIVE: u8 = ao::nvme_admin_directive_recv as u8;
        /// Doorbell Buffer Config.
        pub const DOORBELL_BUFFER_CONFIG: u8 = ao::nvme_admin_dbbuf as u8;
        /// Fabrics commands.
        pub const FABRICS: u8 = ao::nvme_admin_fabrics as u8;
        /// Format NVM.
        pub const FORMAT_NVM: u8 = ao::nvme_admin_format_nvm as u8;
        /// Security Send.
        pub const SECURITY_SEND: u8 = ao::nvme_admin_security_send as u8;
        /// Security Receive.
        pub const SECURITY_RECEIVE: u8 = ao::nvme_admin_security_recv as u8;
        /// Sanitize.
        pub const SANITIZE: u8 = ao::nvme_admin_sanitize_nvm as u8;
        /// Get LBA Status.
        pub const GET_LBA_STATUS: u8 = ao::nvme_admin_get_lba_status as u8;
    }

    /// NVM command set I/O opcodes (NVM command set spec 1.0 §3, Figure 17).
    pub mod io {
        use super::io_b;
        /// Flush.
        pub const FLUSH: u8 = io_b::nvme_cmd_flush as u8;
        /// Write.
        pub const WRITE: u8 = io_b::nvme_cmd_write as u8;
        /// Read.
        pub const READ: u8 = io_b::nvme_cmd_read as u8;
        /// Write Uncorrectable.
        pub const WRITE_UNCORRECTABLE: u8 = io_b::nvme_cmd_write_uncor as u8;
        /// Compare.
        pub const COMPARE: u8 = io_b::nvme_cmd_compare as u8;
        /// Write Zeroes.
        pub const WRITE_ZEROES: u8 = io_b::nvme_cmd_write_zeroes as u8;
        /// Dataset Management.
        pub const DATASET_MANAGEMENT: u8 = io_b::nvme_cmd_dsm as u8;
        /// Verify.
        pub const VERIFY: u8 = io_b::nvme_cmd_verify as u8;
        /// Reservation Register.
        pub const RESERVATION_REGISTER: u8 = io_b::nvme_cmd_resv_register as u8;
        /// Reservation Report.
        pub const RESERVATION_REPORT: u8 = io_b::nvme_cmd_resv_report as u8;
        /// Reservation Acquire.
        pub const RESERVATION_ACQUIRE: u8 = io_b::nvme_cmd_resv_acquire as u8;
        /// Reservation Release.
        pub const RESERVATION_RELEASE: u8 = io_b::nvme_cmd_resv_release as u8;
        /// Copy.
        pub const COPY: u8 = io_b::nvme_cmd_copy as u8;
    }

    /// Fabrics command types, byte 4 of a fabrics SQE (NVMe-oF 1.1 §6, Figure 18).
    pub mod fctype {
        use super::fct;
        /// Property Set.
        pub const PROPERTY_SET: u8 = fct::nvme_fabrics_type_property_set as u8;
        /// Connect.
        pub const CONNECT: u8 = fct::nvme_fabrics_type_connect as u8;
        /// Property Get.
        pub const PROPERTY_GET: u8 = fct::nvme_fabrics_type_property_get as u8;
        /// Authentication Send.
        pub const AUTHENTICATION_SEND: u8 = fct::nvme_fabrics_type_auth_send as u8;
        /// Authentication Receive.
        pub const AUTHENTICATION_RECEIVE: u8 = fct::nvme_fabrics_type_auth_receive as u8;
        /// Disconnect.
        pub const DISCONNECT: u8 = fct::nvme_fabrics_type_disconnect as u8;
    }
}

/// Identify CNS values (NVMe base spec 2.0 §5.17.1, Figure 273) a fabrics target serves.
pub mod cns {
    use super::cns_b;
    /// Identify Namespace data structure for the NSID.
    pub const NAMESPACE: u8 = cns_b::NVME_IDENTIFY_CNS_NS as u8;
    /// Identify Controller data structure.
    pub const CONTROLLER: u8 = cns_b::NVME_IDENTIFY_CNS_CTRL as u8;
    /// Active Namespace ID list.
    pub const ACTIVE_NAMESPACE_LIST: u8 = cns_b::NVME_IDENTIFY_CNS_NS_ACTIVE_LIST as u8;
    /// Namespace Identification Descriptor list.
    pub const NS_ID_DESCRIPTOR_LIST: u8 = cns_b::NVME_IDENTIFY_CNS_NS_DESC_LIST as u8;
}

/// Log page identifiers (NVMe base spec 2.0 §5.16, Figure 202; NVMe-oF 1.1 §5.4).
pub mod log_page {
    use super::lid;
    /// Error Information.
    pub const ERROR: u8 = lid::NVME_LOG_LID_ERROR as u8;
    /// SMART / Health Information.
    pub const SMART: u8 = lid::NVME_LOG_LID_SMART as u8;
    /// Firmware Slot Information.
    pub const FIRMWARE_SLOT: u8 = lid::NVME_LOG_LID_FW_SLOT as u8;
    /// Changed Namespace List.
    pub const CHANGED_NAMESPACE_LIST: u8 = lid::NVME_LOG_LID_CHANGED_NS as u8;
    /// Commands Supported and Effects.
    pub const COMMANDS_SUPPORTED_AND_EFFECTS: u8 = lid::NVME_LOG_LID_CMD_EFFECTS as u8;
    /// Asymmetric Namespace Access.
    pub const ANA: u8 = lid::NVME_LOG_LID_ANA as u8;
    /// Discovery (NVMe-oF).
    pub const DISCOVERY: u8 = lid::NVME_LOG_LID_DISCOVER as u8;
}

/// Feature identifiers (NVMe base spec 2.0 §5.27.1, Figure 317).
pub mod feature {
    use super::fid;
    /// Volatile Write Cache.
    pub const VOLATILE_WRITE_CACHE: u8 = fid::NVME_FEAT_FID_VOLATILE_WC as u8;
    /// Number of Queues.
    pub const NUMBER_OF_QUEUES: u8 = fid::NVME_FEAT_FID_NUM_QUEUES as u8;
    /// Asynchronous Event Configuration.
    pub const ASYNC_EVENT_CONFIGURATION: u8 = fid::NVME_FEAT_FID_ASYNC_EVENT as u8;
    /// Keep Alive Timer.
    pub const KEEP_ALIVE_TIMER: u8 = fid::NVME_FEAT_FID_KATO as u8;
    /// Host Identifier.
    pub const HOST_IDENTIFIER: u8 = fid::NVME_FEAT_FID_HOST_ID as u8;
}

// ---------------------------------------------------------------------------------------------
// Controller properties (§3.1.3; NVMe-oF Property Get/Set)
// ---------------------------------------------------------------------------------------------

/// Controller property offsets (NVMe base spec 2.0 §3.1.3, Figure 33).
pub mod property {
    use super::reg;
    /// Controller Capabilities (8 bytes).
    pub const CAP: u32 = reg::NVME_REG_CAP;
    /// Version (4 bytes).
    pub const VS: u32 = reg::NVME_REG_VS;
    /// Controller Configuration (4 bytes).
    pub const CC: u32 = reg::NVME_REG_CC;
    /// Controller Status (4 bytes).
    pub const CSTS: u32 = reg::NVME_REG_CSTS;
    /// NVM Subsystem Reset (4 bytes).
    pub const NSSR: u32 = reg::NVME_REG_NSSR;

    /// Width in bytes of the property at `offset` (4 or 8), `None` for an offset a fabrics
    /// controller does not define. Property Get's ATTRIB bit 0 must match (1 = 8 bytes).
    pub const fn size(offset: u32) -> Option<u8> {
        match offset {
            CAP => Some(8),
            VS | CC | CSTS | NSSR => Some(4),
            _ => None,
        }
    }
}

const fn field32(v: u32, shift: u32, width: u32) -> u32 {
    (v >> shift) & ((1 << width) - 1)
}

const fn set32(v: u32, shift: u32, width: u32, x: u32) -> u32 {
    let mask = ((1u32 << width) - 1) << shift;
    (v & !mask) | ((x << shift) & mask)
}

const fn field64(v: u64, shift: u32, width: u32) -> u64 {
    (v >> shift) & ((1 << width) - 1)
}

const fn set64(v: u64, shift: u32, width: u32, x: u64) -> u64 {
    let mask = ((1u64 << width) - 1) << shift;
    (v & !mask) | ((x << shift) & mask)
}

/// Controller Capabilities (CAP, §3.1.3.1, Figure 36).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Cap(pub u64);

impl Cap {
    /// CAP.CSS bit 0 (bit 37): NVM command set.
    pub const CSS_NVM: u8 = 1 << 0;
    /// CAP.CSS bit 6 (bit 43): one or more I/O command sets.
    pub const CSS_IO_COMMAND_SETS: u8 = 1 << 6;
    /// CAP.CSS bit 7 (bit 44): no I/O command set (admin only / discovery).
    pub const CSS_NO_IO: u8 = 1 << 7;

    /// Maximum Queue Entries Supported, 0's based (bits 15:0).
    pub const fn mqes(self) -> u16 {
        field64(self.0, 0, 16) as u16
    }
    /// Sets MQES (0's based).
    pub const fn with_mqes(self, mqes: u16) -> Self {
        Self(set64(self.0, 0, 16, mqes as u64))
    }
    /// Contiguous Queues Required (bit 16).
    pub const fn cqr(self) -> bool {
        field64(self.0, 16, 1) != 0
    }
    /// Sets CQR.
    pub const fn with_cqr(self, cqr: bool) -> Self {
        Self(set64(self.0, 16, 1, cqr as u64))
    }
    /// Arbitration Mechanism Supported (bits 18:17).
    pub const fn ams(self) -> u8 {
        field64(self.0, 17, 2) as u8
    }
    /// Timeout in 500 ms units (bits 31:24).
    pub const fn to(self) -> u8 {
        field64(self.0, 24, 8) as u8
    }
    /// Sets TO (500 ms units).
    pub const fn with_to(self, to: u8) -> Self {
        Self(set64(self.0, 24, 8, to as u64))
    }
    /// Doorbell Stride (bits 35:32).
    pub const fn dstrd(self) -> u8 {
        field64(self.0, 32, 4) as u8
    }
    /// Command Sets Supported (bits 44:37); see `CSS_*`.
    pub const fn css(self) -> u8 {
        field64(self.0, 37, 8) as u8
    }
    /// Sets CSS (bits 44:37).
    pub const fn with_css(self, css: u8) -> Self {
        Self(set64(self.0, 37, 8, css as u64))
    }
    /// Memory Page Size Minimum, 2^(12 + MPSMIN) (bits 51:48).
    pub const fn mpsmin(self) -> u8 {
        field64(self.0, 48, 4) as u8
    }
    /// Sets MPSMIN.
    pub const fn with_mpsmin(self, mpsmin: u8) -> Self {
        Self(set64(self.0, 48, 4, mpsmin as u64))
    }
    /// Memory Page Size Maximum, 2^(12 + MPSMAX) (bits 55:52).
    pub const fn mpsmax(self) -> u8 {
        field64(self.0, 52, 4) as u8
    }
    /// Sets MPSMAX.
    pub const fn with_mpsmax(self, mpsmax: u8) -> Self {
        Self(set64(self.0, 52, 4, mpsmax as u64))
    }
}

/// Version (VS, §3.1.3.2): major (31:16), minor (15:8), tertiary (7:0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Vs(pub u32);

impl Vs {
    /// NVMe 1.3, what Linux's nvmet reports for fabrics controllers.
    pub const V1_3: Self = Self::new(1, 3, 0);
    /// NVMe 1.4.
    pub const V1_4: Self = Self::new(1, 4, 0);
    /// NVMe 2.0.
    pub const V2_0: Self = Self::new(2, 0, 0);

    /// A version value.
    pub const fn new(major: u16, minor: u8, tertiary: u8) -> Self {
        Self(((major as u32) << 16) | ((minor as u32) << 8) | tertiary as u32)
    }
}

/// Controller Configuration (CC, §3.1.3.5, Figure 41).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Cc(pub u32);

impl Cc {
    /// CC.SHN: no notification.
    pub const SHN_NONE: u8 = 0;
    /// CC.SHN: normal shutdown.
    pub const SHN_NORMAL: u8 = 1;
    /// CC.SHN: abrupt shutdown.
    pub const SHN_ABRUPT: u8 = 2;
    /// CC.CSS: NVM command set.
    pub const CSS_NVM: u8 = 0;
    /// CC.CSS: all supported I/O command sets.
    pub const CSS_ALL: u8 = 6;
    /// CC.CSS: admin command set only.
    pub const CSS_ADMIN_ONLY: u8 = 7;

    /// Enable (bit 0).
    pub const fn en(self) -> bool {
        field32(self.0, 0, 1) != 0
    }
    /// Sets EN.
    pub const fn with_en(self, en: bool) -> Self {
        Self(set32(self.0, 0, 1, en as u32))
    }
    /// I/O Command Set Selected (bits 6:4).
    pub const fn css(self) -> u8 {
        field32(self.0, 4, 3) as u8
    }
    /// Sets CSS.
    pub const fn with_css(self, css: u8) -> Self {
        Self(set32(self.0, 4, 3, css as u32))
    }
    /// Memory Page Size, 2^(12 + MPS) (bits 10:7).
    pub const fn mps(self) -> u8 {
        field32(self.0, 7, 4) as u8
    }
    /// Sets MPS.
    pub const fn with_mps(self, mps: u8) -> Self {
        Self(set32(self.0, 7, 4, mps as u32))
    }
    /// Arbitration Mechanism Selected (bits 13:11).
    pub const fn ams(self) -> u8 {
        field32(self.0, 11, 3) as u8
    }
    /// Sets AMS.
    pub const fn with_ams(self, ams: u8) -> Self {
        Self(set32(self.0, 11, 3, ams as u32))
    }
    /// Shutdown Notification (bits 15:14); see `SHN_*`.
    pub const fn shn(self) -> u8 {
        field32(self.0, 14, 2) as u8
    }
    /// Sets SHN.
    pub const fn with_shn(self, shn: u8) -> Self {
        Self(set32(self.0, 14, 2, shn as u32))
    }
    /// I/O Submission Queue Entry Size, 2^n bytes (bits 19:16); 6 (64 bytes) for NVMe.
    pub const fn iosqes(self) -> u8 {
        field32(self.0, 16, 4) as u8
    }
    /// Sets IOSQES.
    pub const fn with_iosqes(self, iosqes: u8) -> Self {
        Self(set32(self.0, 16, 4, iosqes as u32))
    }
    /// I/O Completion Queue Entry Size, 2^n bytes (bits 23:20); 4 (16 bytes) for NVMe.
    pub const fn iocqes(self) -> u8 {
        field32(self.0, 20, 4) as u8
    }
    /// Sets IOCQES.
    pub const fn with_iocqes(self, iocqes: u8) -> Self {
        Self(set32(self.0, 20, 4, iocqes as u32))
    }
}

/// Controller Status (CSTS, §3.1.3.6, Figure 42).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Csts(pub u32);

impl Csts {
    /// CSTS.SHST: normal operation.
    pub const SHST_NORMAL: u8 = 0;
    /// CSTS.SHST: shutdown processing occurring.
    pub const SHST_OCCURRING: u8 = 1;
    /// CSTS.SHST: shutdown processing complete.
    pub const SHST_COMPLETE: u8 = 2;

    /// Ready (bit 0).
    pub const fn rdy(self) -> bool {
        field32(self.0, 0, 1) != 0
    }
    /// Sets RDY.
    pub const fn with_rdy(self, rdy: bool) -> Self {
        Self(set32(self.0, 0, 1, rdy as u32))
    }
    /// Controller Fatal Status (bit 1).
    pub const fn cfs(self) -> bool {
        field32(self.0, 1, 1) != 0
    }
    /// Sets CFS.
    pub const fn with_cfs(self, cfs: bool) -> Self {
        Self(set32(self.0, 1, 1, cfs as u32))
    }
    /// Shutdown Status (bits 3:2); see `SHST_*`.
    pub const fn shst(self) -> u8 {
        field32(self.0, 2, 2) as u8
    }
    /// Sets SHST.
    pub const fn with_shst(self, shst: u8) -> Self {
        Self(set32(self.0, 2, 2, shst as u32))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;
    use zerocopy::FromZeros;

    #[test]
    fn wire_struct_sizes() {
        assert_eq!(size_of::<Sqe>(), 64);
        assert_eq!(size_of::<Cqe>(), 16);
        assert_eq!(size_of::<SglDescriptor>(), 16);
        assert_eq!(align_of::<Sqe>(), 1);
        assert_eq!(offset_of!(Sqe, nsid), 4);
        assert_eq!(offset_of!(Sqe, mptr), 16);
        assert_eq!(offset_of!(Sqe, dptr), 24);
        assert_eq!(offset_of!(Sqe, cdw10), 40);
        assert_eq!(offset_of!(Sqe, cdw15), 60);
        assert_eq!(offset_of!(Cqe, sqhd), 8);
        assert_eq!(offset_of!(Cqe, cid), 12);
        assert_eq!(offset_of!(Cqe, status), 14);
        assert_eq!(offset_of!(SglDescriptor, length), 8);
        assert_eq!(offset_of!(SglDescriptor, id), 15);
    }

    #[test]
    fn sqe_fields() {
        let mut raw = [0u8; 64];
        raw[0] = opcode::FABRICS;
        raw[1] = 0x40; // PSDT 01b
        raw[2..4].copy_from_slice(&0x1234u16.to_le_bytes());
        raw[4] = opcode::fctype::CONNECT;
        raw[24..32].copy_from_slice(&0u64.to_le_bytes());
        raw[32..36].copy_from_slice(&1024u32.to_le_bytes());
        raw[39] = SglDescriptor::ID_DATA_BLOCK_OFFSET;
        let sqe = Sqe::read_from_bytes(&raw).expect("64 bytes");
        assert_eq!(sqe.opcode, 0x7F);
        assert_eq!(sqe.psdt(), Sqe::PSDT_SGL_MPTR_CONTIGUOUS);
        assert_eq!(sqe.fuse(), Sqe::FUSE_NONE);
        assert_eq!(sqe.cid.get(), 0x1234);
        assert_eq!(sqe.fctype(), 0x01);
        let sgl = sqe.sgl();
        assert_eq!(sgl, SglDescriptor::in_capsule(0, 1024));
        assert_eq!(sgl.sgl_type(), SglDescriptor::TYPE_DATA_BLOCK);
        assert_eq!(sgl.subtype(), SglDescriptor::SUBTYPE_OFFSET);

        let mut s = Sqe::new_zeroed();
        s.set_fctype(opcode::fctype::PROPERTY_GET);
        s.set_psdt(Sqe::PSDT_SGL_MPTR_CONTIGUOUS);
        s.set_fuse(Sqe::FUSE_FIRST);
        assert_eq!(s.flags, 0x41);
        assert_eq!(s.as_bytes()[4], 0x04);
        s.set_sgl(&SglDescriptor::transport_data_block(8192));
        assert_eq!(s.as_bytes()[39], 0x5A);
        assert_eq!(s.sgl().sgl_type(), SglDescriptor::TYPE_TRANSPORT_DATA_BLOCK);
        assert_eq!(s.sgl().subtype(), SglDescriptor::SUBTYPE_TRANSPORT_SPECIFIC);
        s.set_prps(0x1122_3344_5566_7788, 0x99);
        assert_eq!((s.prp1(), s.prp2()), (0x1122_3344_5566_7788, 0x99));
    }

    #[test]
    fn status_encoding() {
        assert_eq!(Status::SUCCESS.to_cqe_field(), 0);
        assert!(Status::SUCCESS.is_success());
        assert_eq!(Status::INVALID_FIELD.to_cqe_field(), 0x2 << 1);
        assert_eq!(Status::INVALID_FIELD.with_dnr().to_cqe_field(), (0x4000 | 0x2) << 1);
        assert_eq!(Status::CONNECT_INVALID_HOST.field(), 0x184);
        assert_eq!(Status::CONNECT_INVALID_HOST.sct(), sct::COMMAND_SPECIFIC);
        assert_eq!(Status::UNRECOVERED_READ_ERROR.field(), 0x281);
        assert_eq!(Status::LBA_OUT_OF_RANGE.field(), 0x080);
        let s = Status::INVALID_LOG_PAGE.with_dnr().with_more();
        assert!(s.dnr() && s.more() && !s.is_success());
        assert_eq!((s.sct(), s.sc()), (1, 0x09));
        assert_eq!(Status::from_cqe_field(s.to_cqe_field() | 1), s);
        assert_eq!(
            format!("{:?}", Status::INVALID_OPCODE.with_dnr()),
            "Status(sct=0x0, sc=0x01, dnr)"
        );
    }

    #[test]
    fn status_codes_match_the_brief() {
        let generic = [
            (Status::INVALID_OPCODE, 0x01),
            (Status::INVALID_FIELD, 0x02),
            (Status::CID_CONFLICT, 0x03),
            (Status::DATA_TRANSFER_ERROR, 0x04),
            (Status::INTERNAL_ERROR, 0x06),
            (Status::ABORT_REQUESTED, 0x07),
            (Status::INVALID_NAMESPACE, 0x0B),
            (Status::COMMAND_SEQUENCE_ERROR, 0x0C),
            (Status::INVALID_SGL_SEG_DESCRIPTOR, 0x0D),
            (Status::DATA_SGL_LENGTH_INVALID, 0x0F),
            (Status::SGL_DESCRIPTOR_TYPE_INVALID, 0x11),
            (Status::SGL_OFFSET_INVALID, 0x16),
            (Status::TRANSIENT_TRANSPORT_ERROR, 0x22),
            (Status::LBA_OUT_OF_RANGE, 0x80),
            (Status::CAPACITY_EXCEEDED, 0x81),
            (Status::NAMESPACE_NOT_READY, 0x82),
        ];
        for (s, code) in generic {
            assert_eq!((s.sct(), s.sc()), (0, code), "{s:?}");
        }
        let specific = [
            (Status::INVALID_QUEUE_IDENTIFIER, 0x01),
            (Status::INVALID_QUEUE_SIZE, 0x02),
            (Status::ABORT_COMMAND_LIMIT_EXCEEDED, 0x03),
            (Status::ASYNC_EVENT_REQUEST_LIMIT_EXCEEDED, 0x05),
            (Status::INVALID_LOG_PAGE, 0x09),
            (Status::FEATURE_NOT_SAVEABLE, 0x0D),
            (Status::FEATURE_NOT_CHANGEABLE, 0x0E),
            (Status::CONNECT_INCOMPATIBLE_FORMAT, 0x80),
            (Status::CONNECT_CONTROLLER_BUSY, 0x81),
            (Status::CONNECT_INVALID_PARAMETERS, 0x82),
            (Status::CONNECT_RESTART_DISCOVERY, 0x83),
            (Status::CONNECT_INVALID_HOST, 0x84),
        ];
        for (s, code) in specific {
            assert_eq!((s.sct(), s.sc()), (1, code), "{s:?}");
        }
        assert_eq!((Status::WRITE_FAULT.sct(), Status::WRITE_FAULT.sc()), (2, 0x80));
        assert_eq!((Status::COMPARE_FAILURE.sct(), Status::COMPARE_FAILURE.sc()), (2, 0x85));
    }

    #[test]
    fn cqe_layout() {
        let cqe = Cqe::new(0xABCD, 0, 5, Status::INVALID_FIELD.with_dnr(), 0x77);
        let b = cqe.as_bytes();
        assert_eq!(&b[0..4], &0x77u32.to_le_bytes());
        assert_eq!(&b[8..10], &5u16.to_le_bytes());
        assert_eq!(&b[12..14], &0xABCDu16.to_le_bytes());
        assert_eq!(u16::from_le_bytes([b[14], b[15]]), 0x4002 << 1);
        assert_eq!(cqe.status(), Status::INVALID_FIELD.with_dnr());
        assert!(!cqe.phase());
        let mut c = Cqe::with_result64(1, 2, 3, Status::SUCCESS, 0x1_0000_0002);
        assert_eq!((c.dw0.get(), c.dw1.get(), c.result64()), (2, 1, 0x1_0000_0002));
        c.set_phase(true);
        assert!(c.phase() && c.status().is_success());
        assert_eq!(Cqe::success(7, 1, 2).status(), Status::SUCCESS);
    }

    #[test]
    fn opcodes() {
        assert_eq!(opcode::FABRICS, 0x7F);
        assert_eq!(opcode::admin::KEEP_ALIVE, 0x18);
        assert_eq!(opcode::admin::ASYNC_EVENT_REQUEST, 0x0C);
        assert_eq!(opcode::io::WRITE_ZEROES, 0x08);
        assert_eq!(opcode::io::COPY, 0x19);
        let fc = [
            opcode::fctype::PROPERTY_SET,
            opcode::fctype::CONNECT,
            opcode::fctype::PROPERTY_GET,
            opcode::fctype::AUTHENTICATION_SEND,
            opcode::fctype::AUTHENTICATION_RECEIVE,
            opcode::fctype::DISCONNECT,
        ];
        assert_eq!(fc, [0x00, 0x01, 0x04, 0x05, 0x06, 0x08]);
        assert_eq!(log_page::DISCOVERY, 0x70);
        assert_eq!(feature::KEEP_ALIVE_TIMER, 0x0F);
        assert_eq!(cns::NS_ID_DESCRIPTOR_LIST, 3);
    }

    #[test]
    fn properties() {
        assert_eq!(
            (property::CAP, property::VS, property::CC, property::CSTS),
            (0, 8, 0x14, 0x1C)
        );
        assert_eq!(property::size(property::CAP), Some(8));
        assert_eq!(property::size(property::CSTS), Some(4));
        assert_eq!(property::size(0x28), None);

        // What nvmet reports: MQES = 127, TO = 15, CSS NVM.
        let cap = Cap::default()
            .with_mqes(127)
            .with_cqr(true)
            .with_to(15)
            .with_css(Cap::CSS_NVM);
        assert_eq!(cap.0, 127 | 1 << 16 | 15 << 24 | 1 << 37);
        assert_eq!((cap.mqes(), cap.cqr(), cap.to(), cap.css()), (127, true, 15, 1));
        let cap = cap.with_mpsmin(0).with_mpsmax(4);
        assert_eq!((cap.mpsmin(), cap.mpsmax()), (0, 4));
        assert_eq!(cap.0 >> 52 & 0xF, 4);

        // Linux's host writes CC = EN | IOSQES 6 | IOCQES 4 (MPS 0, CSS NVM).
        let cc = Cc(0x0046_0001);
        assert!(cc.en());
        assert_eq!(
            (cc.iosqes(), cc.iocqes(), cc.mps(), cc.css(), cc.shn()),
            (6, 4, 0, 0, 0)
        );
        let cc = cc
            .with_shn(Cc::SHN_NORMAL)
            .with_ams(0)
            .with_mps(1)
            .with_css(Cc::CSS_ALL);
        assert_eq!((cc.shn(), cc.mps(), cc.css()), (1, 1, 6));
        assert_eq!(cc.0 & (3 << 14), 1 << 14);
        assert_eq!(Cc::default().with_en(true).with_iosqes(6).with_iocqes(4).0, 0x0046_0001);

        let csts = Csts::default().with_rdy(true).with_shst(Csts::SHST_COMPLETE);
        assert_eq!(csts.0, 0b1001);
        assert!(csts.rdy() && !csts.cfs());
        assert_eq!(csts.with_cfs(true).with_rdy(false).0, 0b1010);

        assert_eq!(Vs::V1_3.0, 0x0001_0300);
        assert_eq!(Vs::new(2, 0, 0).0, 0x0002_0000);
    }
}
