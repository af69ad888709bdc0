//! Reservations on the wire (NVMe 2.0 §8.19, §7.2-§7.6 of the NVM command set's
//! reservation commands): the six reservation types and who they let read and write, the
//! command dword fields of Reservation Register, Acquire and Release, the Reservation Status
//! data structure of Reservation Report (extended form: 128-bit host identifiers) and the
//! Reservation Notification log page (LID 80h).

/// A reservation type (NVMe 2.0 §8.19.2, Figure 473: RTYPE 1h-6h).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResvType {
    /// Write Exclusive: only the holder writes; anyone reads.
    WriteExclusive,
    /// Exclusive Access: only the holder reads or writes.
    ExclusiveAccess,
    /// Write Exclusive - Registrants Only: registrants write; anyone reads.
    WriteExclusiveRegistrantsOnly,
    /// Exclusive Access - Registrants Only: only registrants read or write.
    ExclusiveAccessRegistrantsOnly,
    /// Write Exclusive - All Registrants: every registrant is a holder.
    WriteExclusiveAllRegistrants,
    /// Exclusive Access - All Registrants: every registrant is a holder.
    ExclusiveAccessAllRegistrants,
}

impl ResvType {
    /// Every type, in code order.
    pub const ALL: [ResvType; 6] = [
        ResvType::WriteExclusive,
        ResvType::ExclusiveAccess,
        ResvType::WriteExclusiveRegistrantsOnly,
        ResvType::ExclusiveAccessRegistrantsOnly,
        ResvType::WriteExclusiveAllRegistrants,
        ResvType::ExclusiveAccessAllRegistrants,
    ];

    /// The RTYPE code (1h-6h).
    pub fn code(self) -> u8 {
        match self {
            ResvType::WriteExclusive => 1,
            ResvType::ExclusiveAccess => 2,
            ResvType::WriteExclusiveRegistrantsOnly => 3,
            ResvType::ExclusiveAccessRegistrantsOnly => 4,
            ResvType::WriteExclusiveAllRegistrants => 5,
            ResvType::ExclusiveAccessAllRegistrants => 6,
        }
    }

    /// The type of an RTYPE code; None for 0h and 7h-FFh (reserved).
    pub fn from_code(c: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.code() == c)
    }

    /// Every registrant holds a reservation of this type (NVMe 2.0 §8.19.2).
    pub fn all_registrants(self) -> bool {
        matches!(
            self,
            ResvType::WriteExclusiveAllRegistrants | ResvType::ExclusiveAccessAllRegistrants
        )
    }

    /// Its name for logs and `pollux ctl`.
    pub fn name(self) -> &'static str {
        match self {
            ResvType::WriteExclusive => "write-exclusive",
            ResvType::ExclusiveAccess => "exclusive-access",
            ResvType::WriteExclusiveRegistrantsOnly => "write-exclusive-registrants-only",
            ResvType::ExclusiveAccessRegistrantsOnly => "exclusive-access-registrants-only",
            ResvType::WriteExclusiveAllRegistrants => "write-exclusive-all-registrants",
            ResvType::ExclusiveAccessAllRegistrants => "exclusive-access-all-registrants",
        }
    }

    /// Whether a host that does not hold the reservation may run a command of `access`
    /// (NVMe 2.0 §8.19.2, Figure 474): `registrant` says whether it is registered.
    pub fn allows(self, access: Access, registrant: bool) -> bool {
        use ResvType::*;
        match (self, access) {
            (WriteExclusive, Access::Read) => true,
            (WriteExclusive | ExclusiveAccess, _) => false,
            (WriteExclusiveRegistrantsOnly | WriteExclusiveAllRegistrants, Access::Read) => true,
            _ => registrant,
        }
    }
}

/// The command group a command belongs to for reservation checks (NVMe 2.0 §8.19.2,
/// Figure 474: the read group is Compare, Read and Verify; the write group Copy, Dataset
/// Management, Flush, Write, Write Uncorrectable and Write Zeroes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Reads the namespace.
    Read,
    /// Changes the namespace.
    Write,
}

/// Reservation Register Action (cdw10 bits 2:0, NVM Command Set 1.0 §7.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegisterAction {
    /// 000b: register a key.
    Register,
    /// 001b: unregister.
    Unregister,
    /// 010b: replace the key.
    Replace,
}

/// Reservation Acquire Action (cdw10 bits 2:0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireAction {
    /// 000b: acquire.
    Acquire,
    /// 001b: preempt.
    Preempt,
    /// 010b: preempt and abort.
    PreemptAndAbort,
}

/// Reservation Release Action (cdw10 bits 2:0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseAction {
    /// 000b: release.
    Release,
    /// 001b: clear.
    Clear,
}

/// Change Persist Through Power Loss State (Register cdw10 bits 31:30).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cptpl {
    /// 00b: no change.
    NoChange,
    /// 10b: reservations are released and registrants cleared on a power loss.
    Clear,
    /// 11b: reservations and registrants persist through power loss.
    Set,
}

/// A decoded reservation command's dword 10 (with its data's size: NVM Command Set 1.0
/// §7.3-§7.5, Figures 56-63).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResvCdw10 {
    /// Reservation Register: data CRKEY, NRKEY (16 bytes).
    Register {
        /// What to do.
        action: RegisterAction,
        /// Ignore Existing Key (bit 3).
        iekey: bool,
        /// What to do with PTPL.
        cptpl: Cptpl,
    },
    /// Reservation Acquire: data CRKEY, PRKEY (16 bytes).
    Acquire {
        /// What to do.
        action: AcquireAction,
        /// Ignore Existing Key.
        iekey: bool,
        /// The type to acquire.
        rtype: Option<ResvType>,
    },
    /// Reservation Release: data CRKEY (8 bytes).
    Release {
        /// What to do.
        action: ReleaseAction,
        /// Ignore Existing Key.
        iekey: bool,
        /// The type to release (raw: checked against the reservation held).
        rtype: u8,
    },
}

impl ResvCdw10 {
    /// Decode the dword 10 of opcode `op` (0Dh, 11h, 15h); None for a reserved action or
    /// CPTPL value (Invalid Field).
    pub fn decode(op: u8, cdw10: u32) -> Option<Self> {
        use super::opcode::io;
        let iekey = cdw10 & (1 << 3) != 0;
        let act = cdw10 & 0x7;
        let rtype = ((cdw10 >> 8) & 0xFF) as u8;
        Some(match op {
            io::RESERVATION_REGISTER => ResvCdw10::Register {
                action: match act {
                    0 => RegisterAction::Register,
                    1 => RegisterAction::Unregister,
                    2 => RegisterAction::Replace,
                    _ => return None,
                },
                iekey,
                cptpl: match cdw10 >> 30 {
                    0 => Cptpl::NoChange,
                    2 => Cptpl::Clear,
                    3 => Cptpl::Set,
                    _ => return None,
                },
            },
            io::RESERVATION_ACQUIRE => ResvCdw10::Acquire {
                action: match act {
                    0 => AcquireAction::Acquire,
                    1 => AcquireAction::Preempt,
                    2 => AcquireAction::PreemptAndAbort,
                    _ => return None,
                },
                iekey,
                rtype: ResvType::from_code(rtype),
            },
            io::RESERVATION_RELEASE => ResvCdw10::Release {
                action: match act {
                    0 => ReleaseAction::Release,
                    1 => ReleaseAction::Clear,
                    _ => return None,
                },
                iekey,
                rtype,
            },
            _ => return None,
        })
    }

    /// Bytes of data the command carries (keys, little-endian u64 each).
    pub fn data_len(&self) -> u32 {
        match self {
            ResvCdw10::Register { .. } | ResvCdw10::Acquire { .. } => 16,
            ResvCdw10::Release { .. } => 8,
        }
    }
}

/// Identify Namespace RESCAP (byte 31, NVM Command Set 1.0 §4.1.5.1, Figure 97): the six
/// types (bits 6:1) and Ignore Existing Key (bit 7); bit 0 (PTPL) where `ptpl`.
pub fn rescap(ptpl: bool) -> u8 {
    0x7E | 0x80 | u8::from(ptpl)
}

/// Size of the extended Reservation Status header and of each extended Registrant entry
/// (NVM Command Set 1.0 §7.6, Figures 66-67).
pub const REPORT_EXT_HEADER: usize = 64;
/// Size of one extended registrant entry.
pub const REPORT_EXT_ENTRY: usize = 64;

/// One registrant as Reservation Report lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReportEntry {
    /// Controller id (FFFFh: a host's registration, not one controller's; the dynamic
    /// controller model).
    pub cntlid: u16,
    /// Holds the reservation (RCSTS bit 0).
    pub holder: bool,
    /// Its reservation key.
    pub rkey: u64,
    /// Its 128-bit host identifier.
    pub hostid: [u8; 16],
}

/// The extended Reservation Status data structure (EDS = 1): generation, the type held
/// (0: none), PTPL state, the registrants; `len` bytes of it (the rest of a long buffer is
/// zeroes, a short one holds what fits; REGCTL always counts them all).
pub fn report_ext(generation: u32, rtype: Option<ResvType>, ptpls: bool, regs: &[ReportEntry], len: usize) -> Vec<u8> {
    let mut out = vec![0u8; REPORT_EXT_HEADER + regs.len() * REPORT_EXT_ENTRY];
    out[0..4].copy_from_slice(&generation.to_le_bytes());
    out[4] = rtype.map_or(0, ResvType::code);
    out[5..7].copy_from_slice(&(regs.len().min(0xFFFF) as u16).to_le_bytes());
    out[9] = u8::from(ptpls);
    for (i, r) in regs.iter().enumerate() {
        let e = &mut out[REPORT_EXT_HEADER + i * REPORT_EXT_ENTRY..][..REPORT_EXT_ENTRY];
        e[0..2].copy_from_slice(&r.cntlid.to_le_bytes());
        e[2] = u8::from(r.holder);
        e[8..16].copy_from_slice(&r.rkey.to_le_bytes());
        e[16..32].copy_from_slice(&r.hostid);
    }
    out.resize(len, 0);
    out
}

/// Reservation Notification log page types (NVM Command Set 1.0 §5.x, Figure 86 of NVMe
/// 2.0 §5.16.1.25): bit positions in the Reservation Notification Mask are the same codes.
pub mod notice {
    /// Registration Preempted.
    pub const REGISTRATION_PREEMPTED: u8 = 1;
    /// Reservation Released.
    pub const RESERVATION_RELEASED: u8 = 2;
    /// Reservation Preempted.
    pub const RESERVATION_PREEMPTED: u8 = 3;
    /// The mask bits a host may set (bits 3:1).
    pub const MASK_ALL: u32 = 0b1110;
}

/// The Reservation Notification log page (64 bytes, NVMe 2.0 §5.16.1.25): log page count,
/// type (0: empty), available pages after this one, NSID.
pub fn notification_page(count: u64, typ: u8, left: u8, nsid: u32) -> Vec<u8> {
    let mut out = vec![0u8; 64];
    out[0..8].copy_from_slice(&count.to_le_bytes());
    out[8] = typ;
    out[9] = left;
    out[12..16].copy_from_slice(&nsid.to_le_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::opcode::io;

    #[test]
    fn every_type_lets_the_right_hosts_read_and_write() {
        use Access::*;
        // (type, non-registrant read, non-registrant write, registrant read, registrant write)
        let table = [
            (1, true, false, true, false),
            (2, false, false, false, false),
            (3, true, false, true, true),
            (4, false, false, true, true),
            (5, true, false, true, true),
            (6, false, false, true, true),
        ];
        for (code, nr, nw, rr, rw) in table {
            let t = ResvType::from_code(code).unwrap_or_else(|| panic!("type {code}"));
            assert_eq!(t.code(), code);
            assert_eq!(
                [
                    t.allows(Read, false),
                    t.allows(Write, false),
                    t.allows(Read, true),
                    t.allows(Write, true)
                ],
                [nr, nw, rr, rw],
                "type {code}"
            );
        }
        assert_eq!(ResvType::from_code(0), None);
        assert_eq!(ResvType::from_code(7), None);
    }

    #[test]
    fn dword_10_decodes_or_is_refused() {
        assert_eq!(
            ResvCdw10::decode(io::RESERVATION_REGISTER, 0b1010 | (3 << 30)),
            Some(ResvCdw10::Register {
                action: RegisterAction::Replace,
                iekey: true,
                cptpl: Cptpl::Set
            })
        );
        assert_eq!(ResvCdw10::decode(io::RESERVATION_REGISTER, 3), None, "action 011b");
        assert_eq!(ResvCdw10::decode(io::RESERVATION_REGISTER, 1 << 30), None, "CPTPL 01b");
        assert_eq!(
            ResvCdw10::decode(io::RESERVATION_ACQUIRE, 2 | (6 << 8)),
            Some(ResvCdw10::Acquire {
                action: AcquireAction::PreemptAndAbort,
                iekey: false,
                rtype: Some(ResvType::ExclusiveAccessAllRegistrants)
            })
        );
        assert_eq!(ResvCdw10::decode(io::RESERVATION_ACQUIRE, 3), None);
        assert_eq!(ResvCdw10::decode(io::RESERVATION_RELEASE, 2), None);
        assert_eq!(ResvCdw10::decode(io::READ, 0), None);
    }

    #[test]
    fn the_extended_report_lays_out_its_header_and_entries() {
        let regs = [ReportEntry {
            cntlid: 0xFFFF,
            holder: true,
            rkey: 0x1122,
            hostid: [7; 16],
        }];
        let r = report_ext(5, Some(ResvType::WriteExclusive), true, &regs, 128);
        assert_eq!(r.len(), 128);
        assert_eq!(&r[0..4], &5u32.to_le_bytes());
        assert_eq!(r[4], 1);
        assert_eq!(&r[5..7], &1u16.to_le_bytes());
        assert_eq!(r[9], 1);
        assert_eq!(&r[64..66], &[0xFF, 0xFF]);
        assert_eq!(r[66], 1);
        assert_eq!(&r[72..80], &0x1122u64.to_le_bytes());
        assert_eq!(&r[80..96], &[7; 16]);
        // A short buffer: the header still counts every registrant.
        let short = report_ext(5, None, false, &regs, 64);
        assert_eq!((short.len(), short[4], short[5]), (64, 0, 1));
    }
}
