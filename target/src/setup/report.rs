//! The `pollux setup status` report, for people.

use std::fmt::Write as _;

use super::Status;

/// The status report, for people.
pub fn format_status(s: &Status) -> String {
    let mut rows = vec![
        ["BDF", "VENDOR:DEVICE", "DRIVER", "IOMMU_GROUP", "/dev/vfio", "KERNEL"]
            .map(String::from)
            .to_vec(),
    ];
    for f in &s.functions {
        rows.push(vec![
            f.bdf.clone(),
            format!("{}:{}", f.vendor, f.device),
            f.driver.clone().unwrap_or_else(|| "none".into()),
            f.iommu_group.clone().unwrap_or_else(|| "none".into()),
            match (&f.iommu_group, f.vfio_node) {
                (Some(g), true) => format!("/dev/vfio/{g}"),
                _ => "no".into(),
            },
            if f.controllers.is_empty() {
                "-".into()
            } else {
                f.controllers.join(",")
            },
        ]);
    }
    let mut out = if s.functions.is_empty() {
        "no NVMe PCI functions (class 0x010802)\n".to_string()
    } else {
        crate::control::cli::table(&rows)
    };
    match s.hugepages {
        Some(h) => {
            let _ = writeln!(out, "hugepages 2048kB: {} reserved, {} free", h.nr, h.free);
        }
        None => out.push_str("hugepages 2048kB: not supported by this kernel\n"),
    }
    if s.iommu_groups > 0 {
        let _ = writeln!(out, "IOMMU: on ({} groups)", s.iommu_groups);
    } else {
        out.push_str("IOMMU: off (no IOMMU groups: boot with intel_iommu=on / amd_iommu=on)\n");
    }
    out.push_str(if s.vfio_pci_loaded {
        "vfio-pci: loaded\n"
    } else {
        "vfio-pci: not loaded (pollux setup bind loads it)\n"
    });
    out
}
