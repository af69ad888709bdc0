//! Asymmetric Namespace Access (NVMe 2.0 §8.1.3): the state of an ANA group as seen through a
//! controller, its code in the ANA log page (Figure 204), its name in a conf file, and the
//! path status an I/O command gets in it.

use super::Status;

/// ANA group ids a subsystem may use: 1..=ANAGRPMAX (Identify Controller ANAGRPMAX and
/// NANAGRPID; nvmet allows as many).
pub const ANAGRPMAX: u32 = 128;
/// ANA Transition Time, seconds (Identify Controller ANATT): how long a group may stay in the
/// change state before a host gives up on the path.
pub const ANATT_S: u8 = 10;

/// The state of an ANA group on one path (NVMe 2.0 §8.1.3.1 to §8.1.3.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum AnaState {
    /// Optimized: the preferred path.
    #[default]
    Optimized,
    /// Non-optimized: usable, not preferred.
    NonOptimized,
    /// Inaccessible: not usable now; may come back.
    Inaccessible,
    /// Persistent loss: not usable again through this controller.
    PersistentLoss,
    /// Change: in transition (at most ANATT seconds).
    Change,
}

impl AnaState {
    /// Every state, in code order.
    pub const ALL: [AnaState; 5] = [
        AnaState::Optimized,
        AnaState::NonOptimized,
        AnaState::Inaccessible,
        AnaState::PersistentLoss,
        AnaState::Change,
    ];

    /// The ANA log page code (Figure 204: 01h, 02h, 03h, 04h, 0Fh).
    pub fn code(self) -> u8 {
        match self {
            AnaState::Optimized => 0x01,
            AnaState::NonOptimized => 0x02,
            AnaState::Inaccessible => 0x03,
            AnaState::PersistentLoss => 0x04,
            AnaState::Change => 0x0F,
        }
    }

    /// The state of a code.
    pub fn from_code(c: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.code() == c)
    }

    /// Its name in a conf file or `pollux ctl`.
    pub fn name(self) -> &'static str {
        match self {
            AnaState::Optimized => "optimized",
            AnaState::NonOptimized => "non-optimized",
            AnaState::Inaccessible => "inaccessible",
            AnaState::PersistentLoss => "persistent-loss",
            AnaState::Change => "change",
        }
    }

    /// The state of a name.
    pub fn from_name(n: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.name() == n)
    }

    /// The path status of an I/O command on a namespace of a group in this state (NVMe 2.0
    /// §8.1.3: without DNR, so the host retries on another path); None where I/O runs.
    #[inline]
    pub fn path_status(self) -> Option<Status> {
        match self {
            AnaState::Optimized | AnaState::NonOptimized => None,
            AnaState::Inaccessible => Some(Status::ANA_INACCESSIBLE),
            AnaState::PersistentLoss => Some(Status::ANA_PERSISTENT_LOSS),
            AnaState::Change => Some(Status::ANA_TRANSITION),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_names_and_statuses_round_trip() {
        for s in AnaState::ALL {
            assert_eq!(AnaState::from_code(s.code()), Some(s));
            assert_eq!(AnaState::from_name(s.name()), Some(s));
        }
        assert_eq!(AnaState::from_code(0), None);
        assert_eq!(AnaState::from_name("up"), None);
        assert_eq!(
            AnaState::Inaccessible.path_status().map(|s| (s.sct(), s.sc())),
            Some((3, 2))
        );
        assert!(AnaState::Change.path_status().is_some_and(|s| !s.dnr()));
        assert_eq!(AnaState::NonOptimized.path_status(), None);
    }
}
