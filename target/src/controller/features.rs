//! Features of a controller (NVMe 2.0 §5.27.1, Figure 317): Get Features with its select
//! field (NVMe 2.0 §5.15: current, default, saved, supported capabilities) and Set Features
//! where a feature is changeable, for every feature the base specification makes mandatory
//! for an I/O controller over fabrics, and those a discovery controller has.
//!
//! No feature is saveable (there is no non-volatile controller state: a controller is
//! created at Connect), so a saved value reads as the default (NVMe 2.0 §5.15.1) and Set
//! Features with SV is Feature Identifier Not Saveable. A feature the target cannot honour
//! otherwise is Feature Not Changeable; an unknown one is Invalid Field.

use pollux_nvme::spec::{Status, feature};

use std::sync::Arc;

use super::Ctrl;
use super::reply::Reply;
use crate::shared::Shared;
use crate::subsystem::Namespace;

/// Warning Composite Temperature Threshold reported in Identify Controller (WCTEMP, kelvin)
/// and the default over-temperature threshold of the composite sensor (NVMe 2.0 §5.27.1.3).
pub const WCTEMP_K: u16 = 343;
/// Critical Composite Temperature Threshold (CCTEMP, kelvin).
pub const CCTEMP_K: u16 = 358;

/// Get Features select field (NVMe 2.0 §5.15, Figure 200).
pub mod sel {
    /// The current value.
    pub const CURRENT: u8 = 0;
    /// The default value.
    pub const DEFAULT: u8 = 1;
    /// The saved value.
    pub const SAVED: u8 = 2;
    /// What may be done with the feature (dw0: bit 0 saveable, 1 per namespace, 2 changeable).
    pub const SUPPORTED_CAPABILITIES: u8 = 3;
}

/// Supported capabilities bit: changeable (NVMe 2.0 §5.15.2, Figure 202).
const CAP_CHANGEABLE: u32 = 1 << 2;

/// The values of a controller's changeable features that no other state holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Features {
    /// Arbitration (01h): AB, LPW, MPW, HPW. Kept as set: one SQ per connection, so nothing
    /// to arbitrate between on the target.
    pub arbitration: u32,
    /// Power Management (02h): WH (bits 7:5); PS is always 0, the only power state.
    pub power_management: u32,
    /// Temperature Threshold (04h) of the composite sensor: over and under, kelvin.
    pub temp_over: u16,
    /// Under-temperature threshold, kelvin (0: none).
    pub temp_under: u16,
    /// Error Recovery (05h): TLER (bits 15:0, 100 ms units); DULBE is not supported.
    pub error_recovery: u32,
    /// Write Atomicity Normal (0Ah): DN (bit 0).
    pub write_atomicity: u32,
}

impl Default for Features {
    fn default() -> Self {
        Self {
            arbitration: DEFAULT_ARBITRATION,
            power_management: 0,
            temp_over: WCTEMP_K,
            temp_under: 0,
            error_recovery: 0,
            write_atomicity: 0,
        }
    }
}

/// Arbitration burst 111b: no limit (NVMe 2.0 §5.27.1.1).
const DEFAULT_ARBITRATION: u32 = 0b111;
/// The temperature sensor selected by TMPSEL: 0 is the composite, Fh all sensors (the
/// composite is the only one).
const TMPSEL_COMPOSITE: u32 = 0x0;
const TMPSEL_ALL: u32 = 0xF;
/// THSEL: over (00b) or under (01b) temperature threshold.
const THSEL_OVER: u32 = 0;
const THSEL_UNDER: u32 = 1;

/// Number of Queues result dword: NSQA and NCQA, 0's based (NVMe 2.0 §5.27.1.5).
pub fn queues_dw0(n: u16) -> u32 {
    let v = u32::from(n.max(1) - 1);
    v | (v << 16)
}

/// I/O queues a controller may create.
pub fn granted_queues(ctrl: &Ctrl, shared: &Shared) -> u16 {
    if ctrl.io_queues_granted > 0 {
        ctrl.io_queues_granted
    } else {
        shared.io_queues_max()
    }
}

/// Whether feature `fid` exists on this controller, and whether Set Features may change it.
fn describe(ctrl: &Ctrl, fid: u8) -> Option<bool> {
    let io = !ctrl.is_discovery();
    let cached = ctrl.subsys.as_ref().is_some_and(|s| s.volatile_cache());
    Some(match fid {
        feature::KEEP_ALIVE_TIMER | feature::ASYNC_EVENT_CONFIGURATION => true,
        feature::HOST_IDENTIFIER => false,
        feature::ARBITRATION
        | feature::POWER_MANAGEMENT
        | feature::TEMPERATURE_THRESHOLD
        | feature::ERROR_RECOVERY
        | feature::WRITE_ATOMICITY_NORMAL
        | feature::NUMBER_OF_QUEUES
            if io =>
        {
            true
        }
        // Reported only where Identify Controller says a volatile cache is present; the
        // cache is the kernel's page cache or the device's, and stays on.
        feature::VOLATILE_WRITE_CACHE if io && cached => false,
        feature::RESERVATION_NOTIFICATION_MASK | feature::RESERVATION_PERSISTENCE if io => true,
        _ => return None,
    })
}

/// Get Features (NVMe 2.0 §5.15) of `fid` (of namespace `nsid` for a namespace-specific
/// one) with select `sel`; `cdw11` is feature specific.
pub fn get_features(ctrl: &Ctrl, shared: &Shared, fid: u8, nsid: u32, sel: u8, cdw11: u32) -> Reply {
    let Some(changeable) = describe(ctrl, fid) else {
        return Reply::err(Status::INVALID_FIELD.with_dnr());
    };
    if per_namespace(fid).is_some() {
        return match (sel, namespace_of(ctrl, nsid)) {
            (sel::SUPPORTED_CAPABILITIES, _) => Reply::dw0(CAP_CHANGEABLE | CAP_PER_NAMESPACE),
            (_, Err(s)) => Reply::err(s),
            (sel::CURRENT, Ok(n)) => ns_value(ctrl, fid, nsid, n, false),
            (sel::DEFAULT | sel::SAVED, Ok(n)) => ns_value(ctrl, fid, nsid, n, true),
            _ => Reply::err(Status::INVALID_FIELD.with_dnr()),
        };
    }
    match sel {
        sel::CURRENT => value(ctrl, shared, fid, cdw11, false),
        // Not saveable: the saved value is the default.
        sel::DEFAULT | sel::SAVED => value(ctrl, shared, fid, cdw11, true),
        sel::SUPPORTED_CAPABILITIES => Reply::dw0(if changeable { CAP_CHANGEABLE } else { 0 }),
        _ => Reply::err(Status::INVALID_FIELD.with_dnr()),
    }
}

/// Supported capabilities bit: namespace specific (NVMe 2.0 §5.15.2, Figure 202).
const CAP_PER_NAMESPACE: u32 = 1 << 1;

/// Whether `fid` is one of the namespace-specific reservation features (NVMe 2.0
/// §5.27.1.21-22).
fn per_namespace(fid: u8) -> Option<()> {
    matches!(
        fid,
        feature::RESERVATION_NOTIFICATION_MASK | feature::RESERVATION_PERSISTENCE
    )
    .then_some(())
}

/// The namespace a namespace-specific feature names: an active one, or None for every
/// namespace (FFFFFFFFh); anything else is Invalid Namespace.
fn namespace_of(ctrl: &Ctrl, nsid: u32) -> Result<Option<Arc<Namespace>>, Status> {
    if nsid == u32::MAX {
        return Ok(None);
    }
    ctrl.subsys
        .as_ref()
        .and_then(|s| s.namespace(nsid))
        .cloned()
        .map(Some)
        .ok_or(Status::INVALID_NAMESPACE.with_dnr())
}

/// A reservation feature's value for `nsid` (`ns`: None for FFFFFFFFh).
fn ns_value(ctrl: &Ctrl, fid: u8, nsid: u32, ns: Option<Arc<Namespace>>, default: bool) -> Reply {
    match (fid, ns) {
        (feature::RESERVATION_NOTIFICATION_MASK, _) if default => Reply::dw0(0),
        (feature::RESERVATION_NOTIFICATION_MASK, _) => Reply::dw0(ctrl.resv_log.mask(nsid)),
        // PTPL is one namespace's state: there is no value for all of them.
        (feature::RESERVATION_PERSISTENCE, None) => Reply::err(Status::INVALID_NAMESPACE.with_dnr()),
        (feature::RESERVATION_PERSISTENCE, Some(_)) if default => Reply::dw0(0),
        (feature::RESERVATION_PERSISTENCE, Some(n)) => Reply::dw0(u32::from(n.resv.state().ptpl)),
        _ => Reply::err(Status::INVALID_FIELD.with_dnr()),
    }
}

/// The temperature threshold `cdw11` names (TMPSEL bits 19:16, THSEL bits 21:20), over
/// (false) or under (true); None for a sensor or kind that does not exist.
fn threshold_select(cdw11: u32) -> Option<bool> {
    let (tmpsel, thsel) = ((cdw11 >> 16) & 0xF, (cdw11 >> 20) & 0x3);
    if tmpsel != TMPSEL_COMPOSITE && tmpsel != TMPSEL_ALL {
        return None;
    }
    match thsel {
        THSEL_OVER => Some(false),
        THSEL_UNDER => Some(true),
        _ => None,
    }
}

/// The current value of `fid`, or its default (`default`: what a new controller has).
fn value(ctrl: &Ctrl, shared: &Shared, fid: u8, cdw11: u32, default: bool) -> Reply {
    let f = if default { Features::default() } else { ctrl.features };
    match fid {
        feature::ARBITRATION => Reply::dw0(f.arbitration),
        feature::POWER_MANAGEMENT => Reply::dw0(f.power_management),
        feature::TEMPERATURE_THRESHOLD => match threshold_select(cdw11) {
            Some(under) => Reply::dw0(u32::from(if under { f.temp_under } else { f.temp_over })),
            None => Reply::err(Status::INVALID_FIELD.with_dnr()),
        },
        feature::ERROR_RECOVERY => Reply::dw0(f.error_recovery),
        feature::WRITE_ATOMICITY_NORMAL => Reply::dw0(f.write_atomicity),
        feature::NUMBER_OF_QUEUES if default => Reply::dw0(queues_dw0(shared.io_queues_max())),
        feature::NUMBER_OF_QUEUES => Reply::dw0(queues_dw0(granted_queues(ctrl, shared))),
        // A new controller has the KATO its Connect asked for; the feature's own default is
        // 0 (no keep-alive timer) and no asynchronous event enabled.
        feature::KEEP_ALIVE_TIMER if default => Reply::dw0(0),
        feature::KEEP_ALIVE_TIMER => Reply::dw0(ctrl.kato_ms),
        feature::ASYNC_EVENT_CONFIGURATION if default => Reply::dw0(0),
        feature::ASYNC_EVENT_CONFIGURATION => Reply::dw0(ctrl.aec),
        feature::VOLATILE_WRITE_CACHE => Reply::dw0(1),
        feature::HOST_IDENTIFIER => host_identifier(ctrl, cdw11),
        _ => Reply::err(Status::INVALID_FIELD.with_dnr()),
    }
}

/// Host Identifier (81h): fabrics use the 128-bit identifier (EXHID must be set), given at
/// Connect (NVMe-oF 1.1 §6.3).
fn host_identifier(ctrl: &Ctrl, cdw11: u32) -> Reply {
    if cdw11 & 1 == 0 {
        Reply::err(Status::INVALID_FIELD.with_dnr())
    } else {
        Reply::data(ctrl.hostid.to_vec())
    }
}

/// What a Set Features changed that the connection must act on.
#[derive(Debug, Clone)]
pub enum FeatureEffect {
    /// Nothing.
    None,
    /// The keep-alive timeout changed: reschedule the check.
    KeepAlive,
    /// Reservation Persistence: the namespace's reservations change PTPL (through their
    /// owner; the reply waits for it).
    SetPtpl(Arc<Namespace>, bool),
}

/// Set Features (NVMe 2.0 §5.27); `nsid` names the namespace of a namespace-specific one.
pub fn set_features(
    ctrl: &mut Ctrl,
    shared: &Shared,
    fid: u8,
    nsid: u32,
    save: bool,
    cdw11: u32,
) -> (Reply, FeatureEffect) {
    let done = |rep: Reply| (rep, FeatureEffect::None);
    let invalid = || done(Reply::err(Status::INVALID_FIELD.with_dnr()));
    let Some(changeable) = describe(ctrl, fid) else {
        return invalid();
    };
    if save {
        return done(Reply::err(Status::FEATURE_NOT_SAVEABLE.with_dnr()));
    }
    if per_namespace(fid).is_some() {
        let ns = match namespace_of(ctrl, nsid) {
            Ok(ns) => ns,
            Err(s) => return done(Reply::err(s)),
        };
        return match (fid, ns) {
            (feature::RESERVATION_NOTIFICATION_MASK, _) if cdw11 & !pollux_nvme::spec::resv::notice::MASK_ALL != 0 => {
                invalid()
            }
            (feature::RESERVATION_NOTIFICATION_MASK, _) => {
                ctrl.resv_log.set_mask(nsid, cdw11);
                done(Reply::ok())
            }
            (feature::RESERVATION_PERSISTENCE, Some(n)) if cdw11 & 1 == 0 || n.resv.ptpl_capable() => {
                (Reply::ok(), FeatureEffect::SetPtpl(n, cdw11 & 1 != 0))
            }
            _ => invalid(),
        };
    }
    if !changeable {
        return match fid {
            // Fabrics set the host identifier at Connect (NVMe-oF 1.1 §6.3).
            feature::HOST_IDENTIFIER => done(Reply::err(Status::COMMAND_SEQUENCE_ERROR.with_dnr())),
            // Setting the cache to what it is changes nothing.
            feature::VOLATILE_WRITE_CACHE if cdw11 & 1 == 1 => done(Reply::ok()),
            _ => done(Reply::err(Status::FEATURE_NOT_CHANGEABLE.with_dnr())),
        };
    }
    let f = &mut ctrl.features;
    match fid {
        feature::ARBITRATION => f.arbitration = cdw11,
        // Only power state 0 exists (Identify Controller NPSS 0).
        feature::POWER_MANAGEMENT if cdw11 & 0x1F != 0 => return invalid(),
        feature::POWER_MANAGEMENT => f.power_management = cdw11 & 0xFF,
        feature::TEMPERATURE_THRESHOLD => match threshold_select(cdw11) {
            Some(true) => f.temp_under = cdw11 as u16,
            Some(false) => f.temp_over = cdw11 as u16,
            None => return invalid(),
        },
        // DULBE (bit 16) needs deallocated-block errors, which no namespace reports.
        feature::ERROR_RECOVERY if cdw11 & (1 << 16) != 0 => return invalid(),
        feature::ERROR_RECOVERY => f.error_recovery = cdw11 & 0xFFFF,
        feature::WRITE_ATOMICITY_NORMAL => f.write_atomicity = cdw11 & 1,
        feature::NUMBER_OF_QUEUES => {
            let (nsqr, ncqr) = (cdw11 & 0xFFFF, cdw11 >> 16);
            if nsqr == 0xFFFF || ncqr == 0xFFFF {
                return invalid();
            }
            // NVMe 2.0 §5.27.1.5: at most what the target grants; the host shares them.
            let want = (nsqr.min(ncqr) + 1).min(u32::from(shared.io_queues_max()));
            ctrl.io_queues_granted = want as u16;
            return done(Reply::dw0(queues_dw0(ctrl.io_queues_granted)));
        }
        feature::KEEP_ALIVE_TIMER => {
            ctrl.kato_ms = shared.keep_alive.clamp(cdw11);
            return (Reply::ok(), FeatureEffect::KeepAlive);
        }
        feature::ASYNC_EVENT_CONFIGURATION => ctrl.aec = cdw11,
        _ => return invalid(),
    }
    done(Reply::ok())
}
