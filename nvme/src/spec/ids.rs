//! Identifier values of admin commands: Identify CNS (NVMe 2.0 §5.17.1), log page (NVMe 2.0 §5.16) and feature
//! (NVMe 2.0 §5.27.1) identifiers.

use crate::bindings::{nvme_cmd_get_log_lid as lid, nvme_features_id as fid, nvme_identify_cns as cns_b};

/// Identify CNS values (NVMe 2.0 §5.17.1, Figure 273) a fabrics target serves.
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

/// Log page identifiers (NVMe 2.0 §5.16, Figure 202; NVMe-oF 1.1 §5.4).
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
    /// Reservation Notification.
    pub const RESERVATION_NOTIFICATION: u8 = lid::NVME_LOG_LID_RESERVATION as u8;
}

/// Feature identifiers (NVMe 2.0 §5.27.1, Figure 317).
pub mod feature {
    use super::fid;
    /// Arbitration.
    pub const ARBITRATION: u8 = fid::NVME_FEAT_FID_ARBITRATION as u8;
    /// Power Management.
    pub const POWER_MANAGEMENT: u8 = fid::NVME_FEAT_FID_POWER_MGMT as u8;
    /// Temperature Threshold.
    pub const TEMPERATURE_THRESHOLD: u8 = fid::NVME_FEAT_FID_TEMP_THRESH as u8;
    /// Error Recovery.
    pub const ERROR_RECOVERY: u8 = fid::NVME_FEAT_FID_ERR_RECOVERY as u8;
    /// Write Atomicity Normal.
    pub const WRITE_ATOMICITY_NORMAL: u8 = fid::NVME_FEAT_FID_WRITE_ATOMIC as u8;
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
    /// Reservation Notification Mask.
    pub const RESERVATION_NOTIFICATION_MASK: u8 = fid::NVME_FEAT_FID_RESV_MASK as u8;
    /// Reservation Persistence.
    pub const RESERVATION_PERSISTENCE: u8 = fid::NVME_FEAT_FID_RESV_PERSIST as u8;
}
