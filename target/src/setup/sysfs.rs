//! The sysfs (and /dev) tree a setup command works on: what it shows of PCI functions,
//! hugepages, the IOMMU and vfio-pci, its paths and writes, and PCI address parsing.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use pollux_nvme::pci::vfio::normalize_bdf;

use super::{NVME_CLASS, SetupError, VFIO_PCI};

/// One PCI function as sysfs shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Function {
    /// `0000:00:04.0`.
    pub bdf: String,
    /// Class code, `0x010802`.
    pub class: String,
    /// Vendor id, 4 hex digits.
    pub vendor: String,
    /// Device id, 4 hex digits.
    pub device: String,
    /// The bound driver, if any.
    pub driver: Option<String>,
    /// The IOMMU group, if any.
    pub iommu_group: Option<String>,
    /// Whether `/dev/vfio/<group>` exists.
    pub vfio_node: bool,
    /// The kernel's NVMe controllers on it (`nvme0`), while the nvme driver has it.
    pub controllers: Vec<String>,
}

/// 2 MiB hugepage counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hugepages {
    /// Reserved (`nr_hugepages`).
    pub nr: u64,
    /// Not in use (`free_hugepages`).
    pub free: u64,
}

/// What `pollux setup status` shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// Every NVMe function, by address.
    pub functions: Vec<Function>,
    /// 2 MiB hugepages (None: the kernel has no such pool).
    pub hugepages: Option<Hugepages>,
    /// Number of IOMMU groups (0: the IOMMU is off).
    pub iommu_groups: usize,
    /// Whether vfio-pci is loaded.
    pub vfio_pci_loaded: bool,
}

/// The sysfs (and /dev) tree a setup command works on.
#[derive(Debug, Clone)]
pub struct Sysfs {
    /// `/`, or a fake tree.
    pub root: PathBuf,
    /// Where `dev/vfio` lives (`/`).
    pub dev_root: PathBuf,
    /// Check the kernel's result after a write (off for fake trees: nothing acts on them).
    pub verify: bool,
    /// The command run to load vfio-pci (program and arguments; `vfio-pci` is appended).
    pub modprobe: Vec<String>,
}

/// The last path component of a symlink's target (a driver or group name).
fn link_name(p: &Path) -> Option<String> {
    std::fs::read_link(p)
        .ok()
        .and_then(|t| t.file_name().and_then(|n| n.to_str()).map(str::to_owned))
}

pub(super) fn read_trim(p: &Path) -> Option<String> {
    std::fs::read_to_string(p).ok().map(|s| s.trim().to_string())
}

/// A PCI address in sysfs form (`0000:00:04.0`), from `0000:00:04.0` or `00:04.0`.
pub fn parse_bdf(s: &str) -> Result<String, SetupError> {
    let b = normalize_bdf(s.trim()).to_ascii_lowercase();
    let bad = || SetupError::BadBdf { bdf: s.to_string() };
    let (dom, rest) = b.split_once(':').ok_or_else(bad)?;
    let (bus, rest) = rest.split_once(':').ok_or_else(bad)?;
    let (dev, func) = rest.split_once('.').ok_or_else(bad)?;
    let hex = |x: &str, n: usize| x.len() == n && x.chars().all(|c| c.is_ascii_hexdigit());
    let ok = hex(dom, 4)
        && hex(bus, 2)
        && hex(dev, 2)
        && u8::from_str_radix(dev, 16).is_ok_and(|d| d < 32)
        && func.len() == 1
        && matches!(func.as_bytes()[0], b'0'..=b'7');
    if ok { Ok(b) } else { Err(bad()) }
}

impl Sysfs {
    /// A tree rooted at `root` (`root/sys/...`) and `dev_root` (`dev_root/dev/vfio`); results
    /// are verified only when `root` is `/`.
    pub fn new(root: impl Into<PathBuf>, dev_root: impl Into<PathBuf>) -> Self {
        let root = root.into();
        Self {
            verify: root == Path::new("/"),
            root,
            dev_root: dev_root.into(),
            modprobe: vec!["modprobe".into()],
        }
    }

    pub(super) fn devices(&self) -> PathBuf {
        self.root.join("sys/bus/pci/devices")
    }

    pub(super) fn device(&self, bdf: &str) -> PathBuf {
        self.devices().join(bdf)
    }

    pub(super) fn driver_dir(&self, name: &str) -> PathBuf {
        self.root.join("sys/bus/pci/drivers").join(name)
    }

    pub(super) fn hugepages_dir(&self) -> PathBuf {
        self.root.join("sys/kernel/mm/hugepages/hugepages-2048kB")
    }

    pub(super) fn vfio_node(&self, group: &str) -> PathBuf {
        self.dev_root.join("dev/vfio").join(group)
    }

    /// The function at `bdf` (already in sysfs form).
    pub fn function(&self, bdf: &str) -> Result<Function, SetupError> {
        let p = self.device(bdf);
        if !p.exists() {
            return Err(SetupError::NoDevice { bdf: bdf.to_string() });
        }
        let hex = |f: &str| {
            read_trim(&p.join(f))
                .map(|s| s.trim_start_matches("0x").to_string())
                .unwrap_or_else(|| "?".into())
        };
        let iommu_group = link_name(&p.join("iommu_group"));
        let mut controllers: Vec<String> = std::fs::read_dir(p.join("nvme"))
            .map(|d| d.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect())
            .unwrap_or_default();
        controllers.sort();
        Ok(Function {
            bdf: bdf.to_string(),
            class: read_trim(&p.join("class")).unwrap_or_else(|| "?".into()),
            vendor: hex("vendor"),
            device: hex("device"),
            driver: link_name(&p.join("driver")),
            vfio_node: iommu_group.as_deref().is_some_and(|g| self.vfio_node(g).exists()),
            iommu_group,
            controllers,
        })
    }

    /// Every NVMe function, by address.
    pub fn nvme_functions(&self) -> Vec<Function> {
        let mut bdfs: Vec<String> = std::fs::read_dir(self.devices())
            .map(|d| d.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect())
            .unwrap_or_default();
        bdfs.sort();
        bdfs.iter()
            .filter_map(|b| self.function(b).ok())
            .filter(|f| f.class == NVME_CLASS)
            .collect()
    }

    /// Hugepages, IOMMU, vfio-pci and every NVMe function.
    pub fn status(&self) -> Status {
        let hp = self.hugepages_dir();
        let num = |f: &str| read_trim(&hp.join(f)).and_then(|s| s.parse().ok());
        let hugepages = match (num("nr_hugepages"), num("free_hugepages")) {
            (Some(nr), Some(free)) => Some(Hugepages { nr, free }),
            (Some(nr), None) => Some(Hugepages { nr, free: 0 }),
            _ => None,
        };
        Status {
            functions: self.nvme_functions(),
            hugepages,
            iommu_groups: std::fs::read_dir(self.root.join("sys/kernel/iommu_groups")).map_or(0, |d| d.count()),
            vfio_pci_loaded: self.driver_dir(VFIO_PCI).is_dir(),
        }
    }

    pub(super) fn write(&self, bdf: &str, path: &Path, value: &str) -> Result<(), SetupError> {
        std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(path)
            .and_then(|mut f| f.write_all(value.as_bytes()))
            .map_err(|source| SetupError::Io {
                bdf: bdf.to_string(),
                what: format!("write {value:?} to {}", path.display()),
                source,
            })
    }
}
