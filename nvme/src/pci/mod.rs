//! The userspace NVMe-over-PCIe driver core: what pollux needs to drive a local SSD itself.
//!
//! Layers, from the hardware up:
//! - The **hardware seam** ([`regs`], [`dma`], [`irq`]): three traits, [`RegisterAccess`]
//!   (BAR0 reads and writes), [`DmaAllocator`] (memory the device can reach, with a host
//!   address and an IOVA) and [`Interrupts`] (an eventfd per MSI-X vector), bundled as a
//!   [`Hardware`]. Two implementations: [`vfio`] (a PCI function bound to vfio-pci: container,
//!   group, device, BAR0 mmap, `VFIO_IOMMU_MAP_DMA`, `VFIO_DEVICE_SET_IRQS`) and [`fake`] (a
//!   controller in process memory served by a thread: the test peer).
//! - [`Registers`]: the typed register layer over a [`RegisterAccess`] (CAP, VS, CC, CSTS,
//!   AQA, ASQ, ACQ and the doorbells with CAP.DSTRD stride, NVMe 2.0 §3.1.3/§3.1.4).
//! - [`QueuePair`]: one submission and one completion queue, owned by one thread, no locks:
//!   batched doorbells, phase-bit completion, PRP1/PRP2/PRP lists, MDTS splitting,
//!   per-command latency.
//! - [`Controller`]: bring-up by the spec (NVMe 2.0 §3.5.1), Identify, queue creation, shutdown
//!   (NVMe 2.0 §3.6.1) and reset (NVMe 2.0 §3.7) with in-flight commands failed.
//!
//! # DMA memory discipline
//! Memory the device can write is never reached through a Rust reference: every access is a
//! volatile or atomic access through a raw pointer (see [`DmaRegion`]), as for guest memory in
//! rust-vmm's vm-memory. A buffer given to the device is held (an `Arc`) by the command until
//! it completes, and by the queue until the device can no longer reach it if the queue is
//! dropped with commands in flight.

pub mod ctrl;
pub mod dma;
pub mod fake;
pub mod irq;
pub mod prp;
pub mod queue;
pub mod regs;
pub mod vfio;

use std::sync::Arc;
use std::time::Duration;

use crate::spec::Status;

pub use ctrl::{Controller, ControllerConfig, ControllerInfo, CopyLimits, Namespace, OCFS_FORMAT_0, ONCS_COPY};
pub use dma::{DmaAllocator, DmaBuf, DmaRegion, IovaAllocator, PAGE_SIZE};
pub use irq::Interrupts;
pub use queue::{Completion, IoRequest, QueueError, QueuePair, Rejected};
pub use regs::{RegisterAccess, Registers};

/// Status a command completes with when the host gave up on it: the controller was reset
/// (timeout, CSTS.CFS) or the queue went away. NVMe 2.0 §4.6.1.2.4, Figure 103:
/// path related status 71h, Command Aborted By Host.
pub const HOST_ABORTED: Status = Status::new(crate::spec::sct::PATH, 0x71);

/// A PCI function as the driver sees it: registers, DMA memory and interrupts.
#[derive(Clone)]
pub struct Hardware {
    /// What the function is called in messages (a BDF, or "fake").
    pub name: String,
    /// BAR0.
    pub regs: Arc<dyn RegisterAccess>,
    /// Memory the function can reach.
    pub dma: Arc<dyn DmaAllocator>,
    /// MSI-X vectors as eventfds.
    pub irqs: Arc<dyn Interrupts>,
}

impl std::fmt::Debug for Hardware {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hardware")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// Errors of the PCIe driver: opening the function, DMA memory, controller bring-up and
/// admin commands. Each names the function (BDF) or the register and what was awaited.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PciError {
    /// No such PCI function in sysfs.
    #[error("{bdf}: no such PCI function (/sys/bus/pci/devices/{bdf} is missing)")]
    NoDevice {
        /// The function.
        bdf: String,
    },
    /// The function has no IOMMU group: no (v)IOMMU, or it is off.
    #[error(
        "{bdf}: no IOMMU group (is the IOMMU on? intel_iommu=on / amd_iommu=on; \
         VFIO needs one: no-IOMMU mode is not supported)"
    )]
    NoIommuGroup {
        /// The function.
        bdf: String,
    },
    /// The function is bound to a driver other than vfio-pci, or to none.
    #[error(
        "{bdf}: bound to {driver}, not vfio-pci (echo vfio-pci > /sys/bus/pci/devices/{bdf}/driver_override, \
         unbind it, then echo {bdf} > /sys/bus/pci/drivers_probe)"
    )]
    WrongDriver {
        /// The function.
        bdf: String,
        /// Its driver ("no driver" when unbound).
        driver: String,
    },
    /// No permission on a VFIO node.
    #[error("{bdf}: no permission to open {path} (run as root or give this user the group's node)")]
    Permission {
        /// The function.
        bdf: String,
        /// The node.
        path: String,
    },
    /// A VFIO operation failed.
    #[error("{bdf}: VFIO {op}: {source}")]
    Vfio {
        /// The function.
        bdf: String,
        /// What was being done.
        op: &'static str,
        /// The VFIO error.
        #[source]
        source: vfio_ioctls::VfioError,
    },
    /// A system call failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done, with the function's name.
        context: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// BAR0 cannot be used.
    #[error("{bdf}: BAR0: {reason}")]
    Bar {
        /// The function.
        bdf: String,
        /// Why.
        reason: String,
    },
    /// No IOVA space left for a DMA mapping.
    #[error("no IOVA space left for {len} bytes of DMA memory")]
    IovaExhausted {
        /// The size asked for.
        len: usize,
    },
    /// The controller does not support what the driver needs.
    #[error("{name}: unsupported controller: {what}")]
    Unsupported {
        /// The function.
        name: String,
        /// What is missing.
        what: String,
    },
    /// A register did not reach the awaited value in time.
    #[error("{name}: timed out after {waited:?} waiting for {register} ({awaited}); last value {last:#x}")]
    RegisterTimeout {
        /// The function.
        name: String,
        /// The register (e.g. "CSTS").
        register: &'static str,
        /// What was awaited (e.g. "RDY=1").
        awaited: &'static str,
        /// How long.
        waited: Duration,
        /// The register's last value.
        last: u32,
    },
    /// CSTS.CFS is set: the controller hit a fatal error (NVMe 2.0 §3.1.3.6) and must be reset.
    #[error("{name}: controller fatal status (CSTS.CFS=1, CSTS={csts:#x})")]
    ControllerFatal {
        /// The function.
        name: String,
        /// CSTS.
        csts: u32,
    },
    /// An admin command completed with an error status.
    #[error("{name}: admin command {opcode:#04x} ({what}) failed: {status}")]
    CommandFailed {
        /// The function.
        name: String,
        /// Opcode.
        opcode: u8,
        /// What it was for.
        what: &'static str,
        /// Its status.
        status: Status,
    },
    /// An admin command did not complete in time.
    #[error("{name}: admin command {opcode:#04x} ({what}) timed out after {waited:?}")]
    CommandTimeout {
        /// The function.
        name: String,
        /// Opcode.
        opcode: u8,
        /// What it was for.
        what: &'static str,
        /// How long.
        waited: Duration,
    },
    /// No I/O queue left: every queue the controller granted is in use.
    #[error("{name}: no I/O queue left ({granted} granted by Set Features Number of Queues)")]
    NoQueueLeft {
        /// The function.
        name: String,
        /// Queues granted.
        granted: u16,
    },
    /// A queue could not take a command (full, resetting, invalid request).
    #[error("{name}: {error}")]
    Queue {
        /// The function.
        name: String,
        /// Why.
        error: QueueError,
    },
    /// A bad argument.
    #[error("invalid argument: {0}")]
    Invalid(String),
}

/// The pci module's result type.
pub type Result<T, E = PciError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests;
