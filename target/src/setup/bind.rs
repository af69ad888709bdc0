//! `pollux setup bind` / `unbind`: handing NVMe functions to vfio-pci (loading it when
//! missing, refusing mounted namespaces, warning about IOMMU group peers) and back.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use super::sysfs::read_trim;
use super::{Function, NVME_CLASS, SetupError, Sysfs, VFIO_PCI, parse_bdf};

/// How long a bind or unbind waits for the kernel's result (driver link, `/dev/vfio` node).
const SETTLE: Duration = Duration::from_secs(5);

impl Sysfs {
    /// Load vfio-pci unless its driver directory exists.
    pub fn ensure_vfio_pci(&self) -> Result<(), SetupError> {
        let dir = self.driver_dir(VFIO_PCI);
        if dir.is_dir() {
            return Ok(());
        }
        let (prog, args) = self.modprobe.split_first().ok_or_else(|| SetupError::Modprobe {
            detail: "no modprobe command".into(),
        })?;
        tracing::info!(modprobe = %prog, "vfio-pci is not loaded: loading it");
        let out = std::process::Command::new(prog)
            .args(args)
            .arg(VFIO_PCI)
            .output()
            .map_err(|e| SetupError::Modprobe {
                detail: format!("cannot run {prog}: {e}"),
            })?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            let last = err.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").trim();
            return Err(SetupError::Modprobe {
                detail: format!("{}{}{last}", out.status, if last.is_empty() { "" } else { ": " }),
            });
        }
        if !dir.is_dir() {
            return Err(SetupError::Modprobe {
                detail: format!("it succeeded, but {} is still missing", dir.display()),
            });
        }
        Ok(())
    }

    /// A mounted filesystem on one of the block devices below this function, as
    /// `(device, mountpoint)`.
    fn mounted(&self, bdf: &str) -> Option<(String, String)> {
        let mounts = std::fs::read_to_string(self.root.join("proc/mounts")).ok()?;
        let class_block = self.root.join("sys/class/block");
        mounts.lines().find_map(|l| {
            let mut it = l.split_whitespace();
            let (src, dst) = (it.next()?, it.next()?);
            let name = src.strip_prefix("/dev/")?;
            if name.contains('/') {
                return None;
            }
            let real = std::fs::canonicalize(class_block.join(name)).ok()?;
            real.components()
                .any(|c| c.as_os_str() == bdf)
                .then(|| (src.to_string(), dst.replace("\\040", " ")))
        })
    }

    /// Other functions in `group` that keep VFIO from opening it: bound to a driver that is
    /// not vfio-pci (PCI bridges and their pcieport driver excepted).
    fn group_blockers(&self, bdf: &str, group: &str) -> Vec<(String, String)> {
        let dir = self.root.join("sys/kernel/iommu_groups").join(group).join("devices");
        let mut out: Vec<(String, String)> = std::fs::read_dir(dir)
            .map(|d| {
                d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .filter(|b| b != bdf)
                    .filter_map(|b| {
                        let f = self.function(&b).ok()?;
                        let drv = f.driver?;
                        (drv != VFIO_PCI && drv != "pcieport" && !f.class.starts_with("0x0604")).then_some((b, drv))
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.sort();
        out
    }

    /// Wait (when verifying) until `ok` holds of the function, up to [`SETTLE`].
    fn settle(&self, bdf: &str, ok: impl Fn(&Function) -> bool) -> Result<Function, SetupError> {
        let t0 = Instant::now();
        loop {
            let f = self.function(bdf)?;
            if ok(&f) || t0.elapsed() >= SETTLE {
                return Ok(f);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Bind one NVMe function to vfio-pci; the line to report.
    pub fn bind(&self, bdf: &str) -> Result<String, SetupError> {
        let bdf = parse_bdf(bdf)?;
        let f = self.function(&bdf)?;
        if f.class != NVME_CLASS {
            return Err(SetupError::NotNvme { bdf, class: f.class });
        }
        let group = f
            .iommu_group
            .clone()
            .ok_or_else(|| SetupError::NoIommuGroup { bdf: bdf.clone() })?;
        let node = self.vfio_node(&group);
        let mut line = if f.driver.as_deref() == Some(VFIO_PCI) {
            if self.verify && !self.settle(&bdf, |f| f.vfio_node)?.vfio_node {
                return Err(SetupError::NoVfioNode {
                    bdf,
                    node: node.display().to_string(),
                });
            }
            format!(
                "{bdf}: already bound to vfio-pci (IOMMU group {group}, {})",
                node.display()
            )
        } else {
            if f.driver.is_some()
                && let Some((source_dev, mountpoint)) = self.mounted(&bdf)
            {
                return Err(SetupError::Mounted {
                    bdf,
                    source_dev,
                    mountpoint,
                });
            }
            self.ensure_vfio_pci()?;
            let dev = self.device(&bdf);
            self.write(&bdf, &dev.join("driver_override"), VFIO_PCI)?;
            if let Some(d) = &f.driver {
                self.write(&bdf, &self.driver_dir(d).join("unbind"), &bdf)?;
            }
            self.write(&bdf, &self.root.join("sys/bus/pci/drivers_probe"), &bdf)?;
            let from = f.driver.as_deref().unwrap_or("no driver");
            if self.verify {
                let now = self.settle(&bdf, |f| f.driver.as_deref() == Some(VFIO_PCI) && f.vfio_node)?;
                if now.driver.as_deref() != Some(VFIO_PCI) {
                    return Err(SetupError::BindFailed {
                        bdf,
                        driver: now.driver.unwrap_or_else(|| "no driver".into()),
                    });
                }
                if !now.vfio_node {
                    return Err(SetupError::NoVfioNode {
                        bdf,
                        node: node.display().to_string(),
                    });
                }
                format!("{bdf}: {from} -> vfio-pci (IOMMU group {group}, {})", node.display())
            } else {
                format!("{bdf}: {from} -> vfio-pci requested (IOMMU group {group}; not verified)")
            }
        };
        for (other, drv) in self.group_blockers(&bdf, &group) {
            let _ = write!(
                line,
                "\n{bdf}: warning: IOMMU group {group} also holds {other} (driver {drv}): VFIO cannot open the group until it is unbound or bound to vfio-pci too"
            );
        }
        Ok(line)
    }

    /// Give one function bound to vfio-pci back to the kernel; the line to report.
    pub fn unbind(&self, bdf: &str) -> Result<String, SetupError> {
        let bdf = parse_bdf(bdf)?;
        let f = self.function(&bdf)?;
        let dev = self.device(&bdf);
        let override_path = dev.join("driver_override");
        let overridden = read_trim(&override_path).is_some_and(|o| o == VFIO_PCI);
        match f.driver.as_deref() {
            Some(VFIO_PCI) => {
                self.write(&bdf, &override_path, "\n")?;
                self.write(&bdf, &self.driver_dir(VFIO_PCI).join("unbind"), &bdf)?;
            }
            Some(d) if overridden => {
                // Bound elsewhere, only our override was left behind.
                self.write(&bdf, &override_path, "\n")?;
                return Ok(format!("{bdf}: driver override cleared (driver {d})"));
            }
            Some(d) => return Ok(format!("{bdf}: not bound to vfio-pci (driver {d}): nothing to do")),
            None => {
                if overridden {
                    self.write(&bdf, &override_path, "\n")?;
                }
            }
        }
        self.write(&bdf, &self.root.join("sys/bus/pci/drivers_probe"), &bdf)?;
        let from = f.driver.as_deref().unwrap_or("no driver");
        if !self.verify {
            return Ok(format!("{bdf}: {from} -> kernel driver probe requested (not verified)"));
        }
        let now = self.settle(&bdf, |f| f.driver.as_deref().is_some_and(|d| d != VFIO_PCI))?;
        Ok(match now.driver.as_deref() {
            Some(VFIO_PCI) => {
                return Err(SetupError::BindFailed {
                    bdf,
                    driver: VFIO_PCI.into(),
                });
            }
            Some(d) => format!("{bdf}: {from} -> {d}"),
            None => format!("{bdf}: {from} -> no driver (no kernel driver claimed it: is the nvme module loaded?)"),
        })
    }
}
