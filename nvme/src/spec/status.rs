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

/// The name of a status and its codes, as nvme-cli shows them: `Connect Invalid Host (sct
/// 0x1, sc 0x84, dnr)`. Without a context, command-specific codes 80h..BFh are read as an
/// NVM command set (or admin) command's; [`Status::in_context`] says which command it was.
impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.in_context(StatusContext::Nvm), f)
    }
}

/// What kind of command a status completed: command-specific status codes 80h..BFh
/// (SCT 1h) are defined per command set (NVMe 2.0 §4.6.1.2.2), so their name depends on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StatusContext {
    /// An admin command or an NVM command set I/O command (NVM Command Set 1.0 §3.1.2.2).
    Nvm,
    /// A Fabrics command: Connect, Property Get/Set, Authentication Send/Receive
    /// (NVMe-oF 1.1 §3.3, Figure 22 and §2.1).
    Fabrics,
}

/// Which commands an entry of [`NAMES`] names a status of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scope {
    /// Every command.
    Any,
    /// Only [`StatusContext::Nvm`].
    Nvm,
    /// Only [`StatusContext::Fabrics`].
    Fabrics,
}

/// The one table of status names (SCT, SC, scope, name), spelled as nvme-cli (libnvme's
/// `nvme_status_to_string`) and Linux (`drivers/nvme/host/constants.c`) spell them: the
/// generic (NVMe 2.0 §4.6.1.2.1, Figure 100; NVM Command Set 1.0 §3.1.2.1.2),
/// command-specific (NVMe 2.0 §4.6.1.2.2, Figure 101; NVM Command Set 1.0 §3.1.2.2;
/// NVMe-oF 1.1 §3.3 Figure 22 for Fabrics commands), media and data integrity
/// (NVMe 2.0 §4.6.1.2.3, Figure 102) and path related (NVMe 2.0 §4.6.1.2.4, Figure 103)
/// statuses. Looked up only when a status is shown, never on the I/O path.
const NAMES: &[(u8, u8, Scope, &str)] = {
    use Scope::{Any, Fabrics, Nvm};
    const G: u8 = sct::GENERIC;
    const C: u8 = sct::COMMAND_SPECIFIC;
    const M: u8 = sct::MEDIA;
    const P: u8 = sct::PATH;
    &[
        (G, 0x00, Any, "Successful Completion"),
        (G, 0x01, Any, "Invalid Command Opcode"),
        (G, 0x02, Any, "Invalid Field in Command"),
        (G, 0x03, Any, "Command ID Conflict"),
        (G, 0x04, Any, "Data Transfer Error"),
        (G, 0x05, Any, "Commands Aborted due to Power Loss Notification"),
        (G, 0x06, Any, "Internal Error"),
        (G, 0x07, Any, "Command Abort Requested"),
        (G, 0x08, Any, "Command Aborted due to SQ Deletion"),
        (G, 0x09, Any, "Command Aborted due to Failed Fused Command"),
        (G, 0x0A, Any, "Command Aborted due to Missing Fused Command"),
        (G, 0x0B, Any, "Invalid Namespace or Format"),
        (G, 0x0C, Any, "Command Sequence Error"),
        (G, 0x0D, Any, "Invalid SGL Segment Descriptor"),
        (G, 0x0E, Any, "Invalid Number of SGL Descriptors"),
        (G, 0x0F, Any, "Data SGL Length Invalid"),
        (G, 0x10, Any, "Metadata SGL Length Invalid"),
        (G, 0x11, Any, "SGL Descriptor Type Invalid"),
        (G, 0x12, Any, "Invalid Use of Controller Memory Buffer"),
        (G, 0x13, Any, "PRP Offset Invalid"),
        (G, 0x14, Any, "Atomic Write Unit Exceeded"),
        (G, 0x15, Any, "Operation Denied"),
        (G, 0x16, Any, "SGL Offset Invalid"),
        (G, 0x18, Any, "Host Identifier Inconsistent Format"),
        (G, 0x19, Any, "Keep Alive Timeout Expired"),
        (G, 0x1A, Any, "Keep Alive Timeout Invalid"),
        (G, 0x1B, Any, "Command Aborted due to Preempt and Abort"),
        (G, 0x1C, Any, "Sanitize Failed"),
        (G, 0x1D, Any, "Sanitize In Progress"),
        (G, 0x1E, Any, "SGL Data Block Granularity Invalid"),
        (G, 0x1F, Any, "Command Not Supported for Queue in CMB"),
        (G, 0x20, Any, "Namespace is Write Protected"),
        (G, 0x21, Any, "Command Interrupted"),
        (G, 0x22, Any, "Transient Transport Error"),
        (G, 0x23, Any, "Command Prohibited by Command and Feature Lockdown"),
        (G, 0x24, Any, "Admin Command Media Not Ready"),
        (G, 0x80, Any, "LBA Out of Range"),
        (G, 0x81, Any, "Capacity Exceeded"),
        (G, 0x82, Any, "Namespace Not Ready"),
        (G, 0x83, Any, "Reservation Conflict"),
        (G, 0x84, Any, "Format In Progress"),
        (C, 0x00, Any, "Completion Queue Invalid"),
        (C, 0x01, Any, "Invalid Queue Identifier"),
        (C, 0x02, Any, "Invalid Queue Size"),
        (C, 0x03, Any, "Abort Command Limit Exceeded"),
        (C, 0x05, Any, "Asynchronous Event Request Limit Exceeded"),
        (C, 0x06, Any, "Invalid Firmware Slot"),
        (C, 0x07, Any, "Invalid Firmware Image"),
        (C, 0x08, Any, "Invalid Interrupt Vector"),
        (C, 0x09, Any, "Invalid Log Page"),
        (C, 0x0A, Any, "Invalid Format"),
        (C, 0x0B, Any, "Firmware Activation Requires Conventional Reset"),
        (C, 0x0C, Any, "Invalid Queue Deletion"),
        (C, 0x0D, Any, "Feature Identifier Not Saveable"),
        (C, 0x0E, Any, "Feature Not Changeable"),
        (C, 0x0F, Any, "Feature Not Namespace Specific"),
        (C, 0x10, Any, "Firmware Activation Requires NVM Subsystem Reset"),
        (C, 0x11, Any, "Firmware Activation Requires Reset"),
        (C, 0x12, Any, "Firmware Activation Requires Maximum Time Violation"),
        (C, 0x13, Any, "Firmware Activation Prohibited"),
        (C, 0x14, Any, "Overlapping Range"),
        (C, 0x15, Any, "Namespace Insufficient Capacity"),
        (C, 0x16, Any, "Namespace Identifier Unavailable"),
        (C, 0x18, Any, "Namespace Already Attached"),
        (C, 0x19, Any, "Namespace Is Private"),
        (C, 0x1A, Any, "Namespace Not Attached"),
        (C, 0x1B, Any, "Thin Provisioning Not Supported"),
        (C, 0x1C, Any, "Controller List Invalid"),
        (C, 0x1D, Any, "Device Self-test In Progress"),
        (C, 0x1E, Any, "Boot Partition Write Prohibited"),
        (C, 0x1F, Any, "Invalid Controller Identifier"),
        (C, 0x20, Any, "Invalid Secondary Controller State"),
        (C, 0x21, Any, "Invalid Number of Controller Resources"),
        (C, 0x22, Any, "Invalid Resource Identifier"),
        (
            C,
            0x23,
            Any,
            "Sanitize Prohibited While Persistent Memory Region is Enabled",
        ),
        (C, 0x24, Any, "ANA Group Identifier Invalid"),
        (C, 0x25, Any, "ANA Attach Failed"),
        (C, 0x80, Nvm, "Conflicting Attributes"),
        (C, 0x81, Nvm, "Invalid Protection Information"),
        (C, 0x82, Nvm, "Attempted Write to Read Only Range"),
        (C, 0x83, Nvm, "Command Size Limit Exceeded"),
        (C, 0x80, Fabrics, "Incompatible Format"),
        (C, 0x81, Fabrics, "Controller Busy"),
        (C, 0x82, Fabrics, "Connect Invalid Parameters"),
        (C, 0x83, Fabrics, "Connect Restart Discovery"),
        (C, 0x84, Fabrics, "Connect Invalid Host"),
        (C, 0x85, Fabrics, "Invalid Queue Type"),
        // Also the answer to any other command on a queue that has not authenticated
        // (NVMe 2.0 §8.13.5); no I/O command set defines these two codes.
        (C, 0x90, Any, "Discover Restart"),
        (C, 0x91, Any, "Authentication Required"),
        (M, 0x80, Any, "Write Fault"),
        (M, 0x81, Any, "Unrecovered Read Error"),
        (M, 0x82, Any, "End-to-end Guard Check Error"),
        (M, 0x83, Any, "End-to-end Application Tag Check Error"),
        (M, 0x84, Any, "End-to-end Reference Tag Check Error"),
        (M, 0x85, Any, "Compare Failure"),
        (M, 0x86, Any, "Access Denied"),
        (M, 0x87, Any, "Deallocated or Unwritten Logical Block"),
        (M, 0x88, Any, "End-to-end Storage Tag Check Error"),
        (P, 0x00, Any, "Internal Pathing Error"),
        (P, 0x01, Any, "Asymmetric Access Persistent Loss"),
        (P, 0x02, Any, "Asymmetric Access Inaccessible"),
        (P, 0x03, Any, "Asymmetric Access Transition"),
        (P, 0x60, Any, "Controller Pathing Error"),
        (P, 0x70, Any, "Host Pathing Error"),
        (P, 0x71, Any, "Command Aborted By Host"),
    ]
};

/// A [`Status`] shown with the name it has for one kind of command ([`Status::in_context`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatusIn {
    status: Status,
    cx: StatusContext,
}

impl std::fmt::Display for StatusIn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.status;
        match s.name(self.cx) {
            Some(name) => f.write_str(name)?,
            None if s.sct() == sct::VENDOR => f.write_str("Vendor Specific")?,
            None => f.write_str("Unknown Status")?,
        }
        write!(f, " (sct {:#x}, sc {:#04x}", s.sct(), s.sc())?;
        if s.more() {
            f.write_str(", more")?;
        }
        if s.dnr() {
            f.write_str(", dnr")?;
        }
        f.write_str(")")
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

    /// The status's name for a command of kind `cx` (None: a reserved or vendor specific
    /// code), from the one table of names.
    pub fn name(self, cx: StatusContext) -> Option<&'static str> {
        let (t, c) = (self.sct(), self.sc());
        NAMES
            .iter()
            .find(|&&(st, sc, scope, _)| {
                st == t
                    && sc == c
                    && match scope {
                        Scope::Any => true,
                        Scope::Nvm => cx == StatusContext::Nvm,
                        Scope::Fabrics => cx == StatusContext::Fabrics,
                    }
            })
            .map(|e| e.3)
    }

    /// This status, displayed with its name for a command of kind `cx`:
    /// `Connect Invalid Host (sct 0x1, sc 0x84, dnr)`.
    pub const fn in_context(self, cx: StatusContext) -> StatusIn {
        StatusIn { status: self, cx }
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
    fn statuses_are_shown_by_name_as_nvme_cli_names_them() {
        let invalid_host = Status::CONNECT_INVALID_HOST.with_dnr();
        assert_eq!(
            invalid_host.in_context(StatusContext::Fabrics).to_string(),
            "Connect Invalid Host (sct 0x1, sc 0x84, dnr)"
        );
        // The same code answering an NVM command set command is something else.
        assert_eq!(
            Status::new(sct::COMMAND_SPECIFIC, 0x82).to_string(),
            "Attempted Write to Read Only Range (sct 0x1, sc 0x82)"
        );
        assert_eq!(
            Status::CONNECT_INVALID_PARAMETERS
                .in_context(StatusContext::Fabrics)
                .to_string(),
            "Connect Invalid Parameters (sct 0x1, sc 0x82)"
        );
        assert_eq!(
            Status::AUTH_REQUIRED.with_dnr().to_string(),
            "Authentication Required (sct 0x1, sc 0x91, dnr)"
        );
        assert_eq!(
            Status::LBA_OUT_OF_RANGE.with_dnr().with_more().to_string(),
            "LBA Out of Range (sct 0x0, sc 0x80, more, dnr)"
        );
        assert_eq!(
            Status::UNRECOVERED_READ_ERROR.to_string(),
            "Unrecovered Read Error (sct 0x2, sc 0x81)"
        );
        assert_eq!(
            Status::ANA_INACCESSIBLE.in_context(StatusContext::Fabrics).to_string(),
            "Asymmetric Access Inaccessible (sct 0x3, sc 0x02)"
        );
        assert_eq!(Status::new(0, 0x7F).to_string(), "Unknown Status (sct 0x0, sc 0x7f)");
        assert_eq!(
            Status::new(sct::VENDOR, 0xC0).to_string(),
            "Vendor Specific (sct 0x7, sc 0xc0)"
        );
        // A Fabrics-only code has no NVM name, and the reverse.
        assert_eq!(Status::CONNECT_INVALID_HOST.name(StatusContext::Nvm), None);
        assert_eq!(
            Status::new(sct::COMMAND_SPECIFIC, 0x83).name(StatusContext::Fabrics),
            Some("Connect Restart Discovery")
        );
    }

    #[test]
    fn every_named_constant_has_a_name_and_the_table_no_duplicate() {
        let fabrics = [
            Status::CONNECT_INCOMPATIBLE_FORMAT,
            Status::CONNECT_CONTROLLER_BUSY,
            Status::CONNECT_INVALID_PARAMETERS,
            Status::CONNECT_RESTART_DISCOVERY,
            Status::CONNECT_INVALID_HOST,
        ];
        for s in fabrics {
            assert!(s.name(StatusContext::Fabrics).is_some(), "{s:?}");
        }
        let all = [
            Status::SUCCESS,
            Status::INVALID_OPCODE,
            Status::INVALID_FIELD,
            Status::CID_CONFLICT,
            Status::DATA_TRANSFER_ERROR,
            Status::INTERNAL_ERROR,
            Status::ABORT_REQUESTED,
            Status::ABORTED_SQ_DELETION,
            Status::INVALID_NAMESPACE,
            Status::COMMAND_SEQUENCE_ERROR,
            Status::INVALID_SGL_SEG_DESCRIPTOR,
            Status::DATA_SGL_LENGTH_INVALID,
            Status::SGL_DESCRIPTOR_TYPE_INVALID,
            Status::SGL_OFFSET_INVALID,
            Status::HOST_ID_INCONSISTENT,
            Status::KEEP_ALIVE_TIMEOUT_INVALID,
            Status::TRANSIENT_TRANSPORT_ERROR,
            Status::LBA_OUT_OF_RANGE,
            Status::CAPACITY_EXCEEDED,
            Status::NAMESPACE_NOT_READY,
            Status::RESERVATION_CONFLICT,
            Status::INVALID_QUEUE_IDENTIFIER,
            Status::INVALID_QUEUE_SIZE,
            Status::ABORT_COMMAND_LIMIT_EXCEEDED,
            Status::ASYNC_EVENT_REQUEST_LIMIT_EXCEEDED,
            Status::INVALID_LOG_PAGE,
            Status::FEATURE_NOT_SAVEABLE,
            Status::FEATURE_NOT_CHANGEABLE,
            Status::AUTH_REQUIRED,
            Status::ANA_PERSISTENT_LOSS,
            Status::ANA_INACCESSIBLE,
            Status::ANA_TRANSITION,
            Status::WRITE_FAULT,
            Status::UNRECOVERED_READ_ERROR,
            Status::COMPARE_FAILURE,
        ];
        for s in all {
            assert!(s.name(StatusContext::Nvm).is_some(), "{s:?}");
            assert_eq!(s.name(StatusContext::Nvm), s.name(StatusContext::Fabrics), "{s:?}");
        }
        for (i, a) in NAMES.iter().enumerate() {
            for b in &NAMES[i + 1..] {
                let overlap = a.2 == b.2 || a.2 == Scope::Any || b.2 == Scope::Any;
                assert!(!(a.0 == b.0 && a.1 == b.1 && overlap), "{a:?} and {b:?}");
            }
        }
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
