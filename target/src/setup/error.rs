//! Why a setup command failed: [`SetupError`], one message per function naming what to do.

/// Why a setup command failed. Each message names the function and what to do.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// The argument is not a PCI address.
    #[error("{bdf}: not a PCI address (want DDDD:BB:DD.F or BB:DD.F, e.g. 0000:00:04.0)")]
    BadBdf {
        /// As given.
        bdf: String,
    },
    /// No such function in sysfs.
    #[error("{bdf}: no such PCI function (`pollux setup status` lists the NVMe ones)")]
    NoDevice {
        /// The function.
        bdf: String,
    },
    /// The function is not an NVMe controller.
    #[error("{bdf}: not an NVMe function (class {class}, NVMe is 0x010802): not binding it")]
    NotNvme {
        /// The function.
        bdf: String,
        /// Its class code.
        class: String,
    },
    /// The function has no IOMMU group, so VFIO cannot give it to userspace.
    #[error("{bdf}: no IOMMU group: boot with intel_iommu=on / amd_iommu=on (and VT-d / AMD-Vi on in the firmware)")]
    NoIommuGroup {
        /// The function.
        bdf: String,
    },
    /// A filesystem on one of the function's namespaces is mounted.
    #[error("{bdf}: {source_dev} is mounted on {mountpoint}: unmount it before binding the function to vfio-pci")]
    Mounted {
        /// The function.
        bdf: String,
        /// The mounted block device.
        source_dev: String,
        /// Where.
        mountpoint: String,
    },
    /// vfio-pci is not loaded and could not be.
    #[error(
        "vfio-pci is not loaded and `modprobe vfio-pci` failed: {detail} (install the kernel's modules, or load vfio-pci by hand)"
    )]
    Modprobe {
        /// What modprobe said.
        detail: String,
    },
    /// A sysfs read or write failed.
    #[error("{bdf}: {what}: {source}{hint}", hint = permission_hint(source))]
    Io {
        /// The function (or "hugepages").
        bdf: String,
        /// What was being done, with the path.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// After the probe the function is not bound to vfio-pci.
    #[error(
        "{bdf}: bound to {driver} after the probe, not vfio-pci (dmesg says why; `pollux setup unbind {bdf}` returns it to the kernel)"
    )]
    BindFailed {
        /// The function.
        bdf: String,
        /// Its driver now ("no driver" if none).
        driver: String,
    },
    /// Bound to vfio-pci, but the group's device node did not appear.
    #[error("{bdf}: bound to vfio-pci but {node} did not appear (is udev or devtmpfs running?)")]
    NoVfioNode {
        /// The function.
        bdf: String,
        /// `/dev/vfio/<group>`.
        node: String,
    },
    /// `--all` found nothing to act on.
    #[error("no NVMe PCI function (class 0x010802) on this machine")]
    NoNvme,
    /// The kernel reserved fewer hugepages than asked.
    #[error(
        "only {got} of {want} 2 MiB hugepages reserved (memory is fragmented: reserve them early after boot, or boot with hugepages={want})"
    )]
    Hugepages {
        /// Asked for.
        want: u64,
        /// Reserved.
        got: u64,
    },
}

fn permission_hint(e: &std::io::Error) -> &'static str {
    if e.kind() == std::io::ErrorKind::PermissionDenied {
        " (run pollux setup as root)"
    } else {
        ""
    }
}
