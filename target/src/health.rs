//! Health of what backs a subsystem: the SMART / Health Information page of its controllers
//! (NVMe 2.0 §5.16.1.3) and the critical warnings behind SMART asynchronous events (NVMe 2.0
//! §5.2).
//!
//! A subsystem's controllers are virtual; their health is that of the stores behind the
//! namespaces:
//! - NVMe SSDs (the `nvme` backend) report their own page, read by each device's admin thread.
//!   Over the distinct devices: the highest temperature and percentage used, the lowest
//!   available spare (with the highest threshold), the sum of media errors, unsafe shutdowns
//!   and data units, and every critical warning bit any of them sets.
//! - RAM, file and simulated namespaces have no sensor of their own: their temperature is
//!   the host's (its hottest hwmon or thermal-zone sensor), their data units the bytes the
//!   target moved for them, and nothing of them wears (spare 100 %, used 0 %). A file keeps
//!   a record of its starts and unsafe shutdowns under pollux (an extended attribute); RAM
//!   and the simulated device start anew each run (one power cycle, no unsafe shutdown).
//!
//! Host read and write commands are always the target's own counters: they are what hosts of
//! this subsystem did. Power cycles and power-on hours are those of the target process (a
//! controller exists from its Connect; the subsystem from the target's start).

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use pollux_nvme::spec::{Health, critical_warning};
use tracing::info;

use crate::subsystem::HostView;

/// Kelvin at 0 °C, rounded as NVMe temperatures are (NVMe 2.0 §5.16.1.3: kelvin, integer).
const ZERO_C_K: i64 = 273;
/// What a host without any temperature sensor reports: a nominal 25 °C room.
pub const NOMINAL_K: u16 = 298;
/// How often the host's sensors are read.
const SENSOR_PERIOD: Duration = Duration::from_secs(5);

/// The host's hottest temperature sensor, kelvin: None when it exposes none (many VMs), or
/// before the first reading.
///
/// Read by a thread of its own every [`SENSOR_PERIOD`], never by a reactor: reading a
/// sensor may block, and an NVMe controller's hwmon sensor is read by the kernel with a Get
/// Log Page to that controller, which may be one of this target's own (a host connected
/// on the same machine): a reactor blocked on it would wait for itself.
pub fn host_temperature_k() -> Option<u16> {
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| {
        let spawned = std::thread::Builder::new().name("pollux-sensors".into()).spawn(|| {
            let mut first = true;
            loop {
                let v = read_sensors(Path::new("/sys/class"));
                if first {
                    first = false;
                    match v {
                        Some(k) => info!(kelvin = k, "host temperature sensors found: RAM, file and sim namespaces report them"),
                        None => info!(
                            kelvin = NOMINAL_K,
                            "no host temperature sensor (hwmon, thermal): RAM, file and sim namespaces report a nominal 25 °C"
                        ),
                    }
                }
                HOST_K.store(v.map_or(0, u32::from), Ordering::Relaxed);
                std::thread::sleep(SENSOR_PERIOD);
            }
        });
        if let Err(e) = spawned {
            info!("no sensor thread ({e}): RAM, file and sim namespaces report a nominal 25 °C");
        }
    });
    match HOST_K.load(Ordering::Relaxed) {
        0 => None,
        k => Some(k as u16),
    }
}

/// [`host_temperature_k`], or [`NOMINAL_K`] without a reading.
pub fn host_k() -> u16 {
    host_temperature_k().unwrap_or(NOMINAL_K)
}

/// The last reading of [`host_temperature_k`] (0: none).
static HOST_K: AtomicU32 = AtomicU32::new(0);

/// The highest millidegree Celsius reading of `<class>/hwmon/*/temp*_input` and
/// `<class>/thermal/thermal_zone*/temp`, in kelvin.
fn read_sensors(class: &Path) -> Option<u16> {
    let mut best: Option<i64> = None;
    let mut consider = |p: &Path| {
        if let Ok(t) = std::fs::read_to_string(p)
            && let Ok(m) = t.trim().parse::<i64>()
            // Plausible sensor values only: a disconnected one reads -273 °C or 255 °C+.
            && (-40_000..=150_000).contains(&m)
        {
            best = Some(best.map_or(m, |b| b.max(m)));
        }
    };
    for dir in ["hwmon", "thermal"] {
        let Ok(rd) = std::fs::read_dir(class.join(dir)) else {
            continue;
        };
        for e in rd.flatten() {
            let d = e.path();
            if dir == "thermal" {
                consider(&d.join("temp"));
                continue;
            }
            // Not NVMe controllers' sensors: the kernel reads them with a command to the
            // controller (which may be this target's own, or a slow device).
            if std::fs::read_to_string(d.join("name")).is_ok_and(|n| n.trim() == "nvme") {
                continue;
            }
            let Ok(files) = std::fs::read_dir(&d) else { continue };
            for f in files.flatten() {
                let n = f.file_name();
                let n = n.to_string_lossy();
                if n.starts_with("temp") && n.ends_with("_input") {
                    consider(&f.path());
                }
            }
        }
    }
    best.map(|m| (m.div_euclid(1000) + ZERO_C_K).clamp(1, i64::from(u16::MAX)) as u16)
}

/// The health of subsystem `s` as a host sees it, or of its namespace `nsid` only (fields a controller adds of
/// its own, such as the error-log count, are left 0). `host_k` is the host's temperature for
/// namespaces without a device.
pub fn gather(s: &HostView, nsid: Option<u32>, host_k: u16) -> Health {
    let mut h = Health {
        avail_spare: 100,
        spare_thresh: 10,
        ..Health::default()
    };
    let mut devices = BTreeSet::new();
    // The namespaces the controller's host sees: another host's counters are not its own.
    let mut hosted = s.namespaces().next().is_none();
    for ns in s.namespaces().filter(|ns| nsid.is_none_or(|n| n == ns.nsid)) {
        let t = ns.totals();
        h.host_reads += u128::from(t.read_cmds);
        h.host_writes += u128::from(t.write_cmds);
        match ns.backend.device_health() {
            Some((name, d)) => {
                let first = devices.is_empty();
                if !devices.insert(name.to_string()) {
                    continue;
                }
                // The devices replace the defaults: the lowest spare, the highest threshold.
                if first {
                    (h.avail_spare, h.spare_thresh) = (d.avail_spare, d.spare_thresh);
                } else {
                    h.avail_spare = h.avail_spare.min(d.avail_spare);
                    h.spare_thresh = h.spare_thresh.max(d.spare_thresh);
                }
                h.critical_warning |= d.critical_warning;
                h.temperature_k = h.temperature_k.max(d.temperature_k);
                h.percent_used = h.percent_used.max(d.percent_used);
                h.data_units_read += d.data_units_read;
                h.data_units_written += d.data_units_written;
                h.media_errors += d.media_errors;
                h.unsafe_shutdowns += d.unsafe_shutdowns;
            }
            None => {
                hosted = true;
                h.data_units_read += Health::data_units(t.read_bytes);
                h.data_units_written += Health::data_units(t.write_bytes);
                if let Some((starts, unsafe_shutdowns)) = ns.backend.shutdown_record() {
                    h.power_cycles = h.power_cycles.max(u128::from(starts));
                    h.unsafe_shutdowns += u128::from(unsafe_shutdowns);
                }
            }
        }
    }
    if hosted || h.temperature_k == 0 {
        h.temperature_k = h.temperature_k.max(host_k);
    }
    h
}

/// The Critical Warning of a controller with temperature thresholds `over` and `under`
/// (Set Features Temperature Threshold, NVMe 2.0 §5.27.1.3; 0: none) over health `h`.
pub fn warning(h: &Health, over: u16, under: u16) -> u8 {
    let mut w = h.critical_warning;
    let t = h.temperature_k;
    if t != 0 && (t > over || (under != 0 && t < under)) {
        w |= critical_warning::TEMPERATURE;
    }
    if h.avail_spare < h.spare_thresh {
        w |= critical_warning::SPARE;
    }
    w
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn sensors_give_the_hottest_plausible_reading_in_kelvin() {
        let d = std::env::temp_dir().join(format!("pollux-sensors-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("hwmon/hwmon0")).unwrap();
        std::fs::create_dir_all(d.join("thermal/thermal_zone0")).unwrap();
        assert_eq!(read_sensors(&d), None);
        std::fs::write(d.join("hwmon/hwmon0/temp1_input"), "41500\n").unwrap();
        std::fs::write(d.join("hwmon/hwmon0/temp2_input"), "-273000\n").unwrap(); // disconnected
        std::fs::write(d.join("hwmon/hwmon0/temp3_max"), "99000\n").unwrap(); // not a reading
        std::fs::write(d.join("thermal/thermal_zone0/temp"), "38000\n").unwrap();
        assert_eq!(read_sensors(&d), Some(41 + 273));
        // An NVMe controller's sensor is never read (it would be a command to it).
        std::fs::create_dir_all(d.join("hwmon/hwmon1")).unwrap();
        std::fs::write(d.join("hwmon/hwmon1/name"), "nvme\n").unwrap();
        std::fs::write(d.join("hwmon/hwmon1/temp1_input"), "90000\n").unwrap();
        assert_eq!(read_sensors(&d), Some(41 + 273));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn thresholds_and_spare_raise_warning_bits() {
        let h = Health {
            temperature_k: 320,
            avail_spare: 100,
            spare_thresh: 10,
            ..Health::default()
        };
        assert_eq!(warning(&h, 343, 0), 0);
        assert_eq!(warning(&h, 310, 0), critical_warning::TEMPERATURE);
        assert_eq!(warning(&h, 343, 330), critical_warning::TEMPERATURE);
        let worn = Health {
            avail_spare: 5,
            critical_warning: critical_warning::READ_ONLY,
            ..h
        };
        assert_eq!(
            warning(&worn, 343, 0),
            critical_warning::SPARE | critical_warning::READ_ONLY
        );
    }
}
