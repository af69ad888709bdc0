//! Command opcodes and fabrics command types, as `u8` (the header's enums are `u32`).

use crate::bindings::{nvme_admin_opcode as ao, nvme_fctype as fct, nvme_io_opcode as io_b};

// ---------------------------------------------------------------------------------------------
// Opcodes
// ---------------------------------------------------------------------------------------------

/// Fabrics command opcode (NVMe-oF 1.1 §6.1), valid on admin and I/O queues.
pub const FABRICS: u8 = ao::nvme_admin_fabrics as u8;

/// Admin command opcodes (NVMe 2.0 §5, Figure 138).
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

/// NVM command set I/O opcodes (NVM Command Set 1.0 §3, Figure 17).
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
