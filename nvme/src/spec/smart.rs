//! SMART / Health Information (Log Page 02h, NVMe 2.0 §5.16.1.3): the fields a target reads from
//! a device and aggregates into its own controllers' page.

use zerocopy::{FromBytes, FromZeros, IntoBytes};

use crate::bindings::nvme_smart_log;

/// Critical Warning bits (NVMe 2.0 §5.16.1.3, Figure 207, byte 0).
pub mod critical_warning {
    /// Available spare capacity fell below its threshold.
    pub const SPARE: u8 = 1 << 0;
    /// A temperature is above an over-temperature or below an under-temperature threshold.
    pub const TEMPERATURE: u8 = 1 << 1;
    /// NVM subsystem reliability degraded (media errors, internal errors).
    pub const RELIABILITY: u8 = 1 << 2;
    /// All of the media were placed in read-only mode.
    pub const READ_ONLY: u8 = 1 << 3;
    /// The volatile memory backup device failed.
    pub const VOLATILE_BACKUP: u8 = 1 << 4;
    /// The persistent memory region became read-only or unreliable.
    pub const PMR_READ_ONLY: u8 = 1 << 5;
}

/// The health fields of one SMART / Health Information page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Health {
    /// Critical Warning ([`critical_warning`] bits).
    pub critical_warning: u8,
    /// Composite Temperature, kelvin (0: not reported).
    pub temperature_k: u16,
    /// Available Spare, percent.
    pub avail_spare: u8,
    /// Available Spare Threshold, percent.
    pub spare_thresh: u8,
    /// Percentage Used (may exceed 100).
    pub percent_used: u8,
    /// Data Units Read: thousands of 512-byte units.
    pub data_units_read: u128,
    /// Data Units Written: thousands of 512-byte units.
    pub data_units_written: u128,
    /// Host Read Commands.
    pub host_reads: u128,
    /// Host Write Commands.
    pub host_writes: u128,
    /// Power Cycles.
    pub power_cycles: u128,
    /// Power On Hours.
    pub power_on_hours: u128,
    /// Unsafe Shutdowns.
    pub unsafe_shutdowns: u128,
    /// Media and Data Integrity Errors.
    pub media_errors: u128,
    /// Number of Error Information Log Entries.
    pub error_log_entries: u128,
}

fn le128(b: &[u8; 16]) -> u128 {
    u128::from_le_bytes(*b)
}

impl Health {
    /// Parse the first 512 bytes of a log page; None when shorter.
    pub fn parse(page: &[u8]) -> Option<Self> {
        let (l, _) = nvme_smart_log::read_from_prefix(page).ok()?;
        Some(Self {
            critical_warning: l.critical_warning,
            temperature_k: u16::from_le_bytes(l.temperature),
            avail_spare: l.avail_spare,
            spare_thresh: l.spare_thresh,
            percent_used: l.percent_used,
            data_units_read: le128(&l.data_units_read),
            data_units_written: le128(&l.data_units_written),
            host_reads: le128(&l.host_reads),
            host_writes: le128(&l.host_writes),
            power_cycles: le128(&l.power_cycles),
            power_on_hours: le128(&l.power_on_hours),
            unsafe_shutdowns: le128(&l.unsafe_shutdowns),
            media_errors: le128(&l.media_errors),
            error_log_entries: le128(&l.num_err_log_entries),
        })
    }

    /// The 512-byte page these fields make (other fields zero).
    pub fn to_page(&self) -> Vec<u8> {
        let mut l = nvme_smart_log::new_zeroed();
        l.critical_warning = self.critical_warning;
        l.temperature = self.temperature_k.to_le_bytes();
        l.avail_spare = self.avail_spare;
        l.spare_thresh = self.spare_thresh;
        l.percent_used = self.percent_used;
        l.data_units_read = self.data_units_read.to_le_bytes();
        l.data_units_written = self.data_units_written.to_le_bytes();
        l.host_reads = self.host_reads.to_le_bytes();
        l.host_writes = self.host_writes.to_le_bytes();
        l.power_cycles = self.power_cycles.to_le_bytes();
        l.power_on_hours = self.power_on_hours.to_le_bytes();
        l.unsafe_shutdowns = self.unsafe_shutdowns.to_le_bytes();
        l.media_errors = self.media_errors.to_le_bytes();
        l.num_err_log_entries = self.error_log_entries.to_le_bytes();
        l.as_bytes().to_vec()
    }

    /// Data units (thousands of 512-byte units, rounded up: NVMe 2.0 §5.16.1.3) for `bytes`.
    pub fn data_units(bytes: u64) -> u128 {
        u128::from(bytes.div_ceil(512).div_ceil(1000))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_round_trips_and_puts_fields_where_the_spec_does() {
        let h = Health {
            critical_warning: critical_warning::SPARE | critical_warning::TEMPERATURE,
            temperature_k: 310,
            avail_spare: 7,
            spare_thresh: 10,
            percent_used: 3,
            data_units_read: 5,
            data_units_written: 6,
            host_reads: 7,
            host_writes: 8,
            power_cycles: 9,
            power_on_hours: 10,
            unsafe_shutdowns: 11,
            media_errors: 12,
            error_log_entries: 13,
        };
        let p = h.to_page();
        assert_eq!(p.len(), 512);
        assert_eq!(p[0], 3);
        assert_eq!(u16::from_le_bytes([p[1], p[2]]), 310);
        assert_eq!((p[3], p[4], p[5]), (7, 10, 3));
        assert_eq!(p[32], 5); // Data Units Read at byte 32
        assert_eq!(p[160], 12); // Media and Data Integrity Errors at byte 160
        assert_eq!(Health::parse(&p), Some(h));
        assert_eq!(Health::parse(&p[..100]), None);
    }

    #[test]
    fn data_units_round_up_to_thousands_of_sectors() {
        assert_eq!(Health::data_units(0), 0);
        assert_eq!(Health::data_units(1), 1);
        assert_eq!(Health::data_units(512_000), 1);
        assert_eq!(Health::data_units(512_001), 2);
    }
}
