//! CQE status values (NVMe 2.0 §4.6.1.2): the status code types and the [`Status`]
//! field.

use crate::bindings::nvme_status_field as sf;

/// Status Code Type values (NVMe 2.0 §4.6.1.2.1, Figure 93).
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

/// The 15-bit status field of a CQE (NVMe 2.0 §4.6.1, Figure 92): SC (bits 7:0),
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
    /// Generic 0x18: Host Identifier Inconsistent Format (a Reservation Report without the
    /// extended data structure where host identifiers are 128-bit, NVMe 2.0 §7.6).
    pub const HOST_ID_INCONSISTENT: Self = sc(sct::GENERIC, sf::NVME_SC_HOSTID_FORMAT);
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
    /// Generic (NVM command set) 0x83: Reservation Conflict (NVMe 2.0 §8.19).
    pub const RESERVATION_CONFLICT: Self = sc(sct::GENERIC, sf::NVME_SC_RESERVATION_CONFLICT);

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
    /// Authentication Required (NVMe 2.0 §8.13.5): the queue has not
    /// completed in-band authentication (SCT 1h, SC 91h).
    pub const AUTH_REQUIRED: Self = sc(sct::COMMAND_SPECIFIC, sf::NVME_SC_AUTH_REQUIRED);

    /// Path 0x01: Asymmetric Access Persistent Loss (NVMe 2.0 §8.1.3.4): the namespace is not
    /// reachable through this controller again.
    pub const ANA_PERSISTENT_LOSS: Self = sc(sct::PATH, sf::NVME_SC_ANA_PERSISTENT_LOSS);
    /// Path 0x02: Asymmetric Access Inaccessible: not through this controller now.
    pub const ANA_INACCESSIBLE: Self = sc(sct::PATH, sf::NVME_SC_ANA_INACCESSIBLE);
    /// Path 0x03: Asymmetric Access Transition: the group's state is changing.
    pub const ANA_TRANSITION: Self = sc(sct::PATH, sf::NVME_SC_ANA_TRANSITION);

    /// Media 0x80: Write Fault.
    pub const WRITE_FAULT: Self = sc(sct::MEDIA, sf::NVME_SC_WRITE_FAULT);
    /// Media 0x81: Unrecovered Read Error.
    pub const UNRECOVERED_READ_ERROR: Self = sc(sct::MEDIA, sf::NVME_SC_READ_ERROR);
    /// Media 0x85: Compare Failure.
    pub const COMPARE_FAILURE: Self = sc(sct::MEDIA, sf::NVME_SC_COMPARE_FAILED);
}

#[cfg(test)]
mod tests {
    use super::*;

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
            (Status::RESERVATION_CONFLICT, 0x83),
            (Status::HOST_ID_INCONSISTENT, 0x18),
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
}
