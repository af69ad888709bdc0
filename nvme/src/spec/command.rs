//! One table of commands per command set: the admin commands (NVMe 2.0 §5), the NVM command
//! set's I/O commands (NVM Command Set 1.0 §3) and the fabrics commands (NVMe-oF 1.1 §6)
//! that pollux serves, each with the spec's facts about it: opcode, name, data direction,
//! the Commands Supported and Effects bits it reports (NVMe 2.0 §5.16.1.6), the Identify
//! Controller ONCS or OACS bit that advertises it (NVMe 2.0 §5.17.2.1), and what it needs
//! to run.
//!
//! What the target reports and accepts is derived from these tables, so that they cannot
//! disagree: the I/O decoder's accepted opcodes ([`NVM_OPCODES`]), the Commands Supported and
//! Effects log ([`effects`]) and the ONCS and OACS bits ([`ONCS`], [`OACS`]). Adding a
//! command is one entry here, its decoder and its executor.
//!
//! A backend capability never changes what is advertised: where a backend lacks one that a
//! command can use ([`Offload`]), pollux runs the command itself.

use super::opcode::{admin, fctype, io};
use crate::bindings::{nvme_cmd_effects as cse, nvme_id_ctrl_oncs as oncs};

/// Direction of a command's data, the opcode's bits 1:0 (NVMe 2.0 §5, Figure 138; fabrics
/// command types alike, NVMe-oF 1.1 §6, Figure 18).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataDir {
    /// No data.
    None,
    /// Host to controller.
    HostToCtrl,
    /// Controller to host.
    CtrlToHost,
    /// Both ways.
    Bidirectional,
}

impl DataDir {
    /// The direction an opcode (or fabrics command type) encodes in its bits 1:0.
    pub const fn of(opcode: u8) -> Self {
        match opcode & 0x3 {
            0 => Self::None,
            1 => Self::HostToCtrl,
            2 => Self::CtrlToHost,
            _ => Self::Bidirectional,
        }
    }
}

/// A backend capability a command can use to run in the backend itself; without it pollux
/// runs the command (reads, compares and writes under its range lock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offload {
    /// The backend copies blocks itself (Copy, NVM Command Set 1.0 §3.2.2).
    Copy,
    /// The backend compares and writes atomically itself (a fused Compare and Write, NVMe
    /// 2.0 §3.4.2).
    CompareAndWrite,
}

/// What a command needs to run, besides its queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Needs {
    /// It addresses a namespace by NSID (NVMe 2.0 §3.2.1).
    pub namespace: bool,
    /// NSID FFFFFFFFh (every namespace) is allowed (Flush, NVMe 2.0 §7.1).
    pub all_namespaces: bool,
    /// The backend capability it can use.
    pub offload: Option<Offload>,
}

impl Needs {
    /// Nothing but its queue.
    pub const NOTHING: Self = Self {
        namespace: false,
        all_namespaces: false,
        offload: None,
    };
    /// A namespace.
    pub const NAMESPACE: Self = Self {
        namespace: true,
        ..Self::NOTHING
    };
}

/// One command of a command set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Command {
    /// Opcode (for a fabrics command: its command type, FCTYPE).
    pub opcode: u8,
    /// Its name in the spec.
    pub name: &'static str,
    /// Direction of its data.
    pub dir: DataDir,
    /// Its Commands Supported and Effects bits besides CSUPP (LBCC, NCC, NIC, CCC, CSE;
    /// NVMe 2.0 §5.16.1.6, Figure 210).
    pub effects: u32,
    /// The Identify Controller ONCS bits it sets.
    pub oncs: u16,
    /// The Identify Controller OACS bits it sets.
    pub oacs: u16,
    /// What it needs.
    pub needs: Needs,
}

impl Command {
    const fn new(opcode: u8, name: &'static str) -> Self {
        Self {
            opcode,
            name,
            dir: DataDir::of(opcode),
            effects: 0,
            oncs: 0,
            oacs: 0,
            needs: Needs::NOTHING,
        }
    }
    /// Logical Block Content Change (LBCC).
    const fn lbcc(mut self) -> Self {
        self.effects |= cse::NVME_CMD_EFFECTS_LBCC;
        self
    }
    const fn oncs(mut self, bits: u32) -> Self {
        self.oncs |= bits as u16;
        self
    }
    const fn namespace(mut self) -> Self {
        self.needs.namespace = true;
        self
    }
    const fn all_namespaces(mut self) -> Self {
        self.needs.all_namespaces = true;
        self
    }
    const fn offload(mut self, o: Offload) -> Self {
        self.needs.offload = Some(o);
        self
    }

    /// Its Commands Supported and Effects dword: CSUPP and its effects.
    pub const fn effects_dword(&self) -> u32 {
        cse::NVME_CMD_EFFECTS_CSUPP | self.effects
    }
}

/// Admin commands served (NVMe 2.0 §5): none is optional in OACS. Get and Set Features carry
/// ONCS bit 4: every feature answers Select and Save (none is saveable).
pub const ADMIN: &[Command] = &[
    Command::new(admin::GET_LOG_PAGE, "Get Log Page"),
    Command::new(admin::IDENTIFY, "Identify"),
    Command::new(admin::ABORT, "Abort"),
    Command::new(admin::SET_FEATURES, "Set Features").oncs(oncs::NVME_CTRL_ONCS_SAVE_FEATURES),
    Command::new(admin::GET_FEATURES, "Get Features").oncs(oncs::NVME_CTRL_ONCS_SAVE_FEATURES),
    Command::new(admin::ASYNC_EVENT_REQUEST, "Asynchronous Event Request"),
    Command::new(admin::KEEP_ALIVE, "Keep Alive"),
];

/// NVM command set I/O commands served (NVM Command Set 1.0 §3, NVMe 2.0 §7).
pub const NVM: &[Command] = &[
    Command::new(io::FLUSH, "Flush").namespace().all_namespaces(),
    Command::new(io::WRITE, "Write").namespace().lbcc(),
    Command::new(io::READ, "Read").namespace(),
    Command::new(io::COMPARE, "Compare")
        .namespace()
        .oncs(oncs::NVME_CTRL_ONCS_COMPARE)
        .offload(Offload::CompareAndWrite),
    Command::new(io::WRITE_ZEROES, "Write Zeroes")
        .namespace()
        .lbcc()
        .oncs(oncs::NVME_CTRL_ONCS_WRITE_ZEROES),
    Command::new(io::DATASET_MANAGEMENT, "Dataset Management")
        .namespace()
        .lbcc()
        .oncs(oncs::NVME_CTRL_ONCS_DSM),
    Command::new(io::VERIFY, "Verify")
        .namespace()
        .oncs(oncs::NVME_CTRL_ONCS_VERIFY),
    Command::new(io::RESERVATION_REGISTER, "Reservation Register")
        .namespace()
        .oncs(oncs::NVME_CTRL_ONCS_RESERVATIONS),
    Command::new(io::RESERVATION_REPORT, "Reservation Report")
        .namespace()
        .oncs(oncs::NVME_CTRL_ONCS_RESERVATIONS),
    Command::new(io::RESERVATION_ACQUIRE, "Reservation Acquire")
        .namespace()
        .oncs(oncs::NVME_CTRL_ONCS_RESERVATIONS),
    Command::new(io::RESERVATION_RELEASE, "Reservation Release")
        .namespace()
        .oncs(oncs::NVME_CTRL_ONCS_RESERVATIONS),
    Command::new(io::COPY, "Copy")
        .namespace()
        .lbcc()
        .oncs(oncs::NVME_CTRL_ONCS_COPY)
        .offload(Offload::Copy),
];

/// Fabrics commands served (NVMe-oF 1.1 §6), by command type. They are not in the Commands
/// Supported and Effects log, which lists opcodes (all of them are opcode 7Fh).
pub const FABRICS: &[Command] = &[
    Command::new(fctype::PROPERTY_SET, "Property Set"),
    Command::new(fctype::CONNECT, "Connect"),
    Command::new(fctype::PROPERTY_GET, "Property Get"),
    Command::new(fctype::AUTHENTICATION_SEND, "Authentication Send"),
    Command::new(fctype::AUTHENTICATION_RECEIVE, "Authentication Receive"),
    Command::new(fctype::DISCONNECT, "Disconnect"),
];

/// A set of opcodes, one bit each: a lookup without a branch per opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opcodes([u64; 4]);

impl Opcodes {
    /// The opcodes of a table.
    pub const fn of(table: &[Command]) -> Self {
        let mut bits = [0u64; 4];
        let mut i = 0;
        while i < table.len() {
            let op = table[i].opcode as usize;
            bits[op >> 6] |= 1 << (op & 63);
            i += 1;
        }
        Self(bits)
    }

    /// Whether `opcode` is in the set.
    #[inline(always)]
    pub const fn contains(&self, opcode: u8) -> bool {
        self.0[(opcode >> 6) as usize] & (1 << (opcode & 63)) != 0
    }
}

/// The NVM opcodes the I/O decoder accepts.
pub const NVM_OPCODES: Opcodes = Opcodes::of(NVM);
/// The admin opcodes served.
pub const ADMIN_OPCODES: Opcodes = Opcodes::of(ADMIN);

/// The ONCS (`oacs` false) or OACS (`oacs` true) bits of some tables.
const fn advertised(tables: &[&[Command]], oacs: bool) -> u16 {
    let mut bits = 0;
    let mut t = 0;
    while t < tables.len() {
        let mut i = 0;
        while i < tables[t].len() {
            let c = &tables[t][i];
            bits |= if oacs { c.oacs } else { c.oncs };
            i += 1;
        }
        t += 1;
    }
    bits
}

/// Identify Controller ONCS (Optional NVM Command Support, NVMe 2.0 §5.17.2.1).
pub const ONCS: u16 = advertised(&[ADMIN, NVM], false);
/// Identify Controller OACS (Optional Admin Command Support, NVMe 2.0 §5.17.2.1).
pub const OACS: u16 = advertised(&[ADMIN, NVM], true);

/// Commands Supported and Effects (LID 05h, NVMe 2.0 §5.16.1.6, Figure 209): 256 ACS dwords
/// (admin), 256 IOCS dwords (the NVM command set), 2048 reserved bytes.
pub fn effects() -> [u8; 4096] {
    let mut out = [0u8; 4096];
    for (base, table) in [(0, ADMIN), (1024, NVM)] {
        for c in table {
            let at = base + usize::from(c.opcode) * 4;
            out[at..at + 4].copy_from_slice(&c.effects_dword().to_le_bytes());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opcodes_are_unique_and_their_set_holds_exactly_them() {
        for table in [ADMIN, NVM, FABRICS] {
            let set = Opcodes::of(table);
            for op in 0..=255u8 {
                let n = table.iter().filter(|c| c.opcode == op).count();
                assert!(n <= 1, "opcode {op:#x} twice");
                assert_eq!(set.contains(op), n == 1, "opcode {op:#x}");
            }
        }
    }

    #[test]
    fn directions_and_needs_are_the_specs() {
        // Opcode bits 1:0, spelled out for the data-carrying commands.
        let dir = |t: &[Command], op| t.iter().find(|c| c.opcode == op).map(|c| c.dir);
        assert_eq!(dir(NVM, io::WRITE), Some(DataDir::HostToCtrl));
        assert_eq!(dir(NVM, io::READ), Some(DataDir::CtrlToHost));
        assert_eq!(dir(NVM, io::RESERVATION_REPORT), Some(DataDir::CtrlToHost));
        assert_eq!(dir(NVM, io::COPY), Some(DataDir::HostToCtrl));
        assert_eq!(dir(ADMIN, admin::GET_LOG_PAGE), Some(DataDir::CtrlToHost));
        assert_eq!(dir(FABRICS, fctype::CONNECT), Some(DataDir::HostToCtrl));
        assert_eq!(dir(FABRICS, fctype::PROPERTY_GET), Some(DataDir::None));
        assert!(NVM.iter().all(|c| c.needs.namespace));
        assert!(NVM.iter().all(|c| c.needs.all_namespaces == (c.opcode == io::FLUSH)));
    }
}
