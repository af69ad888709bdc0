//! Where a command's data is: the direction of its opcode and its SGL1 (NVMe-oF 1.1 §2.3,
//! NVMe/TCP 1.0 §3.3.1), for admin and I/O commands alike.

use pollux_nvme::spec::{SglDescriptor, Sqe, Status, opcode};

/// Data transfer direction from opcode bits 1:0 (NVMe 2.0 §5.1 / §7.1, NVMe-oF 1.1 §6.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Xfer {
    /// No data.
    None,
    /// Host to controller.
    HostToCtrl,
    /// Controller to host.
    CtrlToHost,
}

/// Direction of an opcode (or fabrics command type).
pub fn xfer_of(code: u8) -> Xfer {
    match code & 3 {
        1 => Xfer::HostToCtrl,
        2 => Xfer::CtrlToHost,
        0 => Xfer::None,
        _ => Xfer::HostToCtrl, // bidirectional: none that we support; treated as a write
    }
}

/// The direction of a command.
pub fn xfer(sqe: &Sqe) -> Xfer {
    if sqe.opcode == opcode::FABRICS {
        xfer_of(sqe.fctype())
    } else {
        xfer_of(sqe.opcode)
    }
}

/// Where a command's data comes from or goes to, from SGL1 (NVMe/TCP 1.0 §3.3.1: in-capsule data
/// is an SGL data block with offset; everything else a transport data block).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataPtr {
    /// No data.
    None,
    /// In-capsule data of this length (offset 0).
    InCapsule(u32),
    /// Transferred by C2HData or R2T/H2CData, this length.
    Transport(u32),
}

/// Decode SGL1 of a command that moves data.
#[inline]
pub fn data_ptr(sqe: &Sqe) -> Result<DataPtr, Status> {
    let sgl = sqe.sgl();
    let len = sgl.length.get();
    match sgl.id {
        SglDescriptor::ID_DATA_BLOCK_OFFSET => {
            if sgl.address.get() != 0 {
                return Err(Status::SGL_OFFSET_INVALID.with_dnr());
            }
            Ok(if len == 0 {
                DataPtr::None
            } else {
                DataPtr::InCapsule(len)
            })
        }
        SglDescriptor::ID_TRANSPORT_DATA_BLOCK => Ok(if len == 0 {
            DataPtr::None
        } else {
            DataPtr::Transport(len)
        }),
        _ => Err(Status::SGL_DESCRIPTOR_TYPE_INVALID.with_dnr()),
    }
}
