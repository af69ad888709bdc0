//! `pollux setup ...`: prepare NVMe PCI functions for pollux's userspace driver
//! ([`pollux_nvme::pci`]), like SPDK's `scripts/setup.sh`.
//!
//! - `status`: every NVMe function (PCI class 0x010802) with its driver, IOMMU group and
//!   `/dev/vfio/<group>` node; 2 MiB hugepages; whether the IOMMU is on and vfio-pci loaded.
//! - `bind BDF...|--all`: hand functions to vfio-pci (`driver_override`, unbind from the
//!   current driver, `drivers_probe`), loading vfio-pci first when it is missing.
//! - `unbind BDF...|--all`: give them back to the kernel (clear `driver_override`, unbind from
//!   vfio-pci, `drivers_probe`).
//! - `hugepages N`: reserve N 2 MiB pages.
//!
//! Everything goes through sysfs below a root directory (`/` normally; a fake tree in the
//! tests, where the kernel does not act on what is written, so the result is only checked
//! against the real `/`).

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use pollux_nvme::pci::vfio::normalize_bdf;

/// PCI class code of an NVMe controller (mass storage, non-volatile memory, NVMe).
pub const NVME_CLASS: &str = "0x010802";
/// The kernel driver that gives a PCI function to userspace.
pub const VFIO_PCI: &str = "vfio-pci";
/// How long a bind or unbind waits for the kernel's result (driver link, `/dev/vfio` node).
const SETTLE: Duration = Duration::from_secs(5);

/// `pollux setup`: prepare NVMe PCI functions for pollux's userspace driver.
#[derive(Debug, clap::Args)]
pub struct SetupArgs {
    /// Root of the sysfs tree (`<root>/sys/...`); tests use a fake one.
    #[arg(long, value_name = "DIR", default_value = "/", global = true, hide = true)]
    pub sysfs_root: PathBuf,
    /// Root of the device nodes (`<root>/dev/vfio/...`).
    #[arg(long, value_name = "DIR", default_value = "/", global = true, hide = true)]
    pub dev_root: PathBuf,
    /// What to do.
    #[command(subcommand)]
    pub command: SetupCommand,
}

/// `pollux setup` commands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum SetupCommand {
    /// NVMe PCI functions, their drivers and IOMMU groups; hugepages, IOMMU, vfio-pci.
    Status,
    /// Bind NVMe functions to vfio-pci (loads vfio-pci when needed).
    Bind(Targets),
    /// Give functions bound to vfio-pci back to their kernel driver.
    Unbind(Targets),
    /// Reserve N 2 MiB hugepages (reports how many the kernel actually gave).
    Hugepages {
        /// Number of 2 MiB pages.
        count: u64,
    },
}

/// The functions a bind or unbind acts on.
#[derive(Debug, Clone, clap::Args)]
pub struct Targets {
    /// PCI addresses, `0000:00:04.0` or `00:04.0`.
    #[arg(value_name = "BDF", required_unless_present = "all", conflicts_with = "all")]
    pub bdfs: Vec<String>,
    /// Every NVMe function.
    #[arg(long)]
    pub all: bool,
}

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

fn read_trim(p: &Path) -> Option<String> {
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

    fn devices(&self) -> PathBuf {
        self.root.join("sys/bus/pci/devices")
    }

    fn device(&self, bdf: &str) -> PathBuf {
        self.devices().join(bdf)
    }

    fn driver_dir(&self, name: &str) -> PathBuf {
        self.root.join("sys/bus/pci/drivers").join(name)
    }

    fn hugepages_dir(&self) -> PathBuf {
        self.root.join("sys/kernel/mm/hugepages/hugepages-2048kB")
    }

    fn vfio_node(&self, group: &str) -> PathBuf {
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

    fn write(&self, bdf: &str, path: &Path, value: &str) -> Result<(), SetupError> {
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

    /// Reserve `n` 2 MiB hugepages; how many the kernel reserved.
    pub fn hugepages(&self, n: u64) -> Result<Hugepages, SetupError> {
        let dir = self.hugepages_dir();
        let io = |what: String| {
            move |source| SetupError::Io {
                bdf: "hugepages".into(),
                what,
                source,
            }
        };
        let nr_path = dir.join("nr_hugepages");
        self.write("hugepages", &nr_path, &n.to_string())?;
        let read = |p: PathBuf| -> Result<u64, SetupError> {
            let s = std::fs::read_to_string(&p).map_err(io(format!("read {}", p.display())))?;
            s.trim().parse().map_err(|_| SetupError::Io {
                bdf: "hugepages".into(),
                what: format!("read {}", p.display()),
                source: std::io::Error::new(std::io::ErrorKind::InvalidData, format!("not a number: {s:?}")),
            })
        };
        let nr = read(nr_path)?;
        let free = read(dir.join("free_hugepages")).unwrap_or(0);
        Ok(Hugepages { nr, free })
    }
}

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

/// Run a setup command on `sys`: the report lines and the errors (one per failed function).
pub fn run(sys: &Sysfs, cmd: &SetupCommand) -> (String, Vec<SetupError>) {
    let mut out = String::new();
    let mut errs = Vec::new();
    match cmd {
        SetupCommand::Status => out = format_status(&sys.status()),
        SetupCommand::Bind(t) | SetupCommand::Unbind(t) => {
            let bdfs: Vec<String> = if t.all {
                sys.nvme_functions().into_iter().map(|f| f.bdf).collect()
            } else {
                t.bdfs.clone()
            };
            if bdfs.is_empty() {
                errs.push(SetupError::NoNvme);
            }
            for b in bdfs {
                let r = match cmd {
                    SetupCommand::Bind(_) => sys.bind(&b),
                    _ => sys.unbind(&b),
                };
                match r {
                    Ok(line) => {
                        out.push_str(&line);
                        out.push('\n');
                    }
                    Err(e) => errs.push(e),
                }
            }
        }
        SetupCommand::Hugepages { count } => match sys.hugepages(*count) {
            Ok(h) => {
                let _ = writeln!(
                    out,
                    "hugepages 2048kB: asked {count}, reserved {} ({} free)",
                    h.nr, h.free
                );
                if h.nr < *count {
                    errs.push(SetupError::Hugepages {
                        want: *count,
                        got: h.nr,
                    });
                }
            }
            Err(e) => errs.push(e),
        },
    }
    (out, errs)
}

/// `pollux setup`: 0 on success, 1 if anything failed (one line per error on stderr).
pub fn main(args: &SetupArgs) -> ExitCode {
    let sys = Sysfs::new(&args.sysfs_root, &args.dev_root);
    let (out, errs) = run(&sys, &args.command);
    let _ = std::io::stdout().lock().write_all(out.as_bytes());
    let mut se = std::io::stderr().lock();
    for e in &errs {
        let _ = writeln!(se, "pollux setup: {e}");
    }
    if errs.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use std::os::unix::fs::symlink;

    /// A fake sysfs tree in a temp dir, removed on drop.
    struct Tree {
        root: PathBuf,
    }

    impl Drop for Tree {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }

    impl Tree {
        fn new(name: &str) -> Self {
            let root = std::env::temp_dir().join(format!("pollux-setup-test-{}-{name}", std::process::id()));
            let _ = std::fs::remove_dir_all(&root);
            for d in [
                "sys/bus/pci/devices",
                "sys/devices/pci0000:00",
                "sys/kernel/iommu_groups",
                "sys/kernel/mm/hugepages/hugepages-2048kB",
                "sys/class/block",
                "dev/vfio",
                "proc",
            ] {
                std::fs::create_dir_all(root.join(d)).unwrap();
            }
            let t = Self { root };
            t.file("sys/bus/pci/drivers_probe", "");
            t.file("sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages", "0\n");
            t.file("sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages", "0\n");
            t.driver("nvme");
            t.driver(VFIO_PCI);
            t
        }

        fn p(&self, rel: &str) -> PathBuf {
            self.root.join(rel)
        }

        fn file(&self, rel: &str, content: &str) {
            std::fs::write(self.p(rel), content).unwrap();
        }

        fn read(&self, rel: &str) -> String {
            std::fs::read_to_string(self.p(rel)).unwrap()
        }

        fn driver(&self, name: &str) {
            let d = format!("sys/bus/pci/drivers/{name}");
            std::fs::create_dir_all(self.p(&d)).unwrap();
            self.file(&format!("{d}/bind"), "");
            self.file(&format!("{d}/unbind"), "");
        }

        /// A function like the kernel shows it: the device dir under sys/devices, the
        /// bus/pci/devices symlink, and driver / iommu_group symlinks.
        fn function(&self, bdf: &str, class: &str, driver: Option<&str>, group: Option<&str>) {
            let rel = format!("sys/devices/pci0000:00/{bdf}");
            std::fs::create_dir_all(self.p(&rel)).unwrap();
            symlink(
                format!("../../../devices/pci0000:00/{bdf}"),
                self.p(&format!("sys/bus/pci/devices/{bdf}")),
            )
            .unwrap();
            self.file(&format!("{rel}/class"), &format!("{class}\n"));
            self.file(&format!("{rel}/vendor"), "0x1b36\n");
            self.file(&format!("{rel}/device"), "0x0010\n");
            self.file(&format!("{rel}/driver_override"), "(null)\n");
            if let Some(d) = driver {
                symlink(
                    format!("../../../bus/pci/drivers/{d}"),
                    self.p(&format!("{rel}/driver")),
                )
                .unwrap();
                if d == "nvme" {
                    std::fs::create_dir_all(self.p(&format!("{rel}/nvme/nvme0"))).unwrap();
                }
            }
            if let Some(g) = group {
                let gd = format!("sys/kernel/iommu_groups/{g}/devices");
                std::fs::create_dir_all(self.p(&gd)).unwrap();
                symlink(
                    format!("../../../../devices/pci0000:00/{bdf}"),
                    self.p(&format!("{gd}/{bdf}")),
                )
                .unwrap();
                symlink(
                    format!("../../../kernel/iommu_groups/{g}"),
                    self.p(&format!("{rel}/iommu_group")),
                )
                .unwrap();
            }
        }

        fn sys(&self) -> Sysfs {
            let s = Sysfs::new(&self.root, &self.root);
            assert!(!s.verify, "a fake tree is never verified");
            s
        }
    }

    #[test]
    fn setup_parse_bdf() {
        assert_eq!(parse_bdf("00:04.0").unwrap(), "0000:00:04.0");
        assert_eq!(parse_bdf("0000:00:04.0").unwrap(), "0000:00:04.0");
        assert_eq!(parse_bdf("0000:AF:1f.7").unwrap(), "0000:af:1f.7");
        for bad in [
            "",
            "04.0",
            "00:04",
            "00:04.8",
            "00:20.0",
            "0000:00:04.0/../x",
            "../../x:0.0",
            "zz:04.0",
        ] {
            let e = parse_bdf(bad).unwrap_err().to_string();
            assert!(e.contains("not a PCI address"), "{bad}: {e}");
        }
    }

    #[test]
    fn setup_status_lists_nvme_functions() {
        let t = Tree::new("status");
        t.function("0000:00:04.0", NVME_CLASS, Some("nvme"), Some("3"));
        t.function("0000:00:05.0", NVME_CLASS, Some(VFIO_PCI), Some("4"));
        t.function("0000:00:06.0", NVME_CLASS, None, None);
        t.function("0000:00:02.0", "0x020000", Some("e1000e"), Some("1"));
        t.file("dev/vfio/4", "");
        t.file("sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages", "512\n");
        t.file("sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages", "500\n");
        let s = t.sys().status();
        let f = &s.functions;
        assert_eq!(f.len(), 3, "{f:?}");
        assert_eq!(
            f[0],
            Function {
                bdf: "0000:00:04.0".into(),
                class: NVME_CLASS.into(),
                vendor: "1b36".into(),
                device: "0010".into(),
                driver: Some("nvme".into()),
                iommu_group: Some("3".into()),
                vfio_node: false,
                controllers: vec!["nvme0".into()],
            }
        );
        assert_eq!(f[1].driver.as_deref(), Some(VFIO_PCI));
        assert!(f[1].vfio_node);
        assert_eq!((f[2].driver.as_deref(), f[2].iommu_group.as_deref()), (None, None));
        assert_eq!(s.hugepages, Some(Hugepages { nr: 512, free: 500 }));
        assert_eq!(s.iommu_groups, 3);
        assert!(s.vfio_pci_loaded);
        let text = format_status(&s);
        assert!(text.contains("0000:00:04.0  1b36:0010      nvme      3"), "{text}");
        assert!(text.contains("/dev/vfio/4"), "{text}");
        assert!(text.contains("0000:00:06.0  1b36:0010      none      none"), "{text}");
        assert!(!text.contains("0000:00:02.0"), "{text}");
        assert!(text.contains("hugepages 2048kB: 512 reserved, 500 free"), "{text}");
        assert!(text.contains("IOMMU: on (3 groups)"), "{text}");
        assert!(text.contains("vfio-pci: loaded"), "{text}");
    }

    #[test]
    fn setup_status_iommu_off_no_vfio() {
        let t = Tree::new("off");
        std::fs::remove_dir_all(t.p("sys/bus/pci/drivers/vfio-pci")).unwrap();
        std::fs::remove_dir_all(t.p("sys/kernel/mm/hugepages")).unwrap();
        let text = format_status(&t.sys().status());
        assert!(text.contains("no NVMe PCI functions"), "{text}");
        assert!(text.contains("IOMMU: off"), "{text}");
        assert!(text.contains("vfio-pci: not loaded"), "{text}");
        assert!(text.contains("hugepages 2048kB: not supported"), "{text}");
    }

    #[test]
    fn setup_bind_writes_override_unbind_probe() {
        let t = Tree::new("bind");
        t.function("0000:00:04.0", NVME_CLASS, Some("nvme"), Some("3"));
        let line = t.sys().bind("00:04.0").unwrap();
        assert_eq!(
            t.read("sys/devices/pci0000:00/0000:00:04.0/driver_override"),
            "vfio-pci"
        );
        assert_eq!(t.read("sys/bus/pci/drivers/nvme/unbind"), "0000:00:04.0");
        assert_eq!(t.read("sys/bus/pci/drivers_probe"), "0000:00:04.0");
        assert_eq!(t.read("sys/bus/pci/drivers/vfio-pci/unbind"), "");
        assert!(
            line.contains("0000:00:04.0: nvme -> vfio-pci requested (IOMMU group 3"),
            "{line}"
        );
    }

    #[test]
    fn setup_bind_without_driver_and_group_peer_warning() {
        let t = Tree::new("peer");
        t.function("0000:00:04.0", NVME_CLASS, None, Some("3"));
        t.function("0000:00:04.1", "0x020000", Some("e1000e"), Some("3"));
        let line = t.sys().bind("0000:00:04.0").unwrap();
        assert_eq!(t.read("sys/bus/pci/drivers_probe"), "0000:00:04.0");
        assert_eq!(t.read("sys/bus/pci/drivers/nvme/unbind"), "");
        assert!(line.contains("no driver -> vfio-pci requested"), "{line}");
        assert!(
            line.contains("warning: IOMMU group 3 also holds 0000:00:04.1 (driver e1000e)"),
            "{line}"
        );
    }

    #[test]
    fn setup_bind_already_bound_is_a_success_that_writes_nothing() {
        let t = Tree::new("already");
        t.function("0000:00:05.0", NVME_CLASS, Some(VFIO_PCI), Some("4"));
        let line = t.sys().bind("0000:00:05.0").unwrap();
        assert!(
            line.contains("0000:00:05.0: already bound to vfio-pci (IOMMU group 4"),
            "{line}"
        );
        assert_eq!(
            t.read("sys/devices/pci0000:00/0000:00:05.0/driver_override"),
            "(null)\n"
        );
        assert_eq!(t.read("sys/bus/pci/drivers_probe"), "");
    }

    #[test]
    fn setup_bind_errors_name_the_bdf() {
        let t = Tree::new("errors");
        t.function("0000:00:04.0", NVME_CLASS, Some("nvme"), None);
        t.function("0000:00:02.0", "0x020000", Some("e1000e"), Some("1"));
        let sys = t.sys();
        let e = sys.bind("00:04.0").unwrap_err().to_string();
        assert_eq!(
            e,
            "0000:00:04.0: no IOMMU group: boot with intel_iommu=on / amd_iommu=on (and VT-d / AMD-Vi on in the firmware)"
        );
        let e = sys.bind("00:09.0").unwrap_err().to_string();
        assert!(e.starts_with("0000:00:09.0: no such PCI function"), "{e}");
        let e = sys.bind("00:02.0").unwrap_err().to_string();
        assert!(
            e.starts_with("0000:00:02.0: not an NVMe function (class 0x020000"),
            "{e}"
        );
        let e = sys.unbind("00:09.0").unwrap_err().to_string();
        assert!(e.starts_with("0000:00:09.0: no such PCI function"), "{e}");
        // Nothing was written on the way.
        assert_eq!(
            t.read("sys/devices/pci0000:00/0000:00:04.0/driver_override"),
            "(null)\n"
        );
        assert_eq!(t.read("sys/bus/pci/drivers_probe"), "");
    }

    #[test]
    fn setup_bind_refuses_mounted_namespace() {
        let t = Tree::new("mounted");
        t.function("0000:00:04.0", NVME_CLASS, Some("nvme"), Some("3"));
        let ns = "sys/devices/pci0000:00/0000:00:04.0/nvme/nvme0/nvme0n1/nvme0n1p1";
        std::fs::create_dir_all(t.p(ns)).unwrap();
        symlink(
            "../../devices/pci0000:00/0000:00:04.0/nvme/nvme0/nvme0n1/nvme0n1p1",
            t.p("sys/class/block/nvme0n1p1"),
        )
        .unwrap();
        t.file(
            "proc/mounts",
            "proc /proc proc rw 0 0\n/dev/nvme0n1p1 /srv\\040data ext4 rw 0 0\n",
        );
        let e = t.sys().bind("00:04.0").unwrap_err().to_string();
        assert_eq!(
            e,
            "0000:00:04.0: /dev/nvme0n1p1 is mounted on /srv data: unmount it before binding the function to vfio-pci"
        );
        assert_eq!(t.read("sys/bus/pci/drivers/nvme/unbind"), "");
    }

    #[test]
    fn setup_bind_loads_vfio_pci_or_says_why_not() {
        let t = Tree::new("modprobe");
        t.function("0000:00:04.0", NVME_CLASS, Some("nvme"), Some("3"));
        std::fs::remove_dir_all(t.p("sys/bus/pci/drivers/vfio-pci")).unwrap();
        let mut sys = t.sys();
        sys.modprobe = vec![t.p("no-such-modprobe").display().to_string()];
        let e = sys.bind("00:04.0").unwrap_err().to_string();
        assert!(
            e.starts_with("vfio-pci is not loaded and `modprobe vfio-pci` failed: cannot run"),
            "{e}"
        );
        // A modprobe that fails, with its message (sh -c: no script file to exec, which could
        // race with a fork in another test thread: ETXTBSY).
        let sh = |script: &str| vec!["sh".into(), "-c".into(), script.into(), "modprobe".into()];
        sys.modprobe = sh("echo \"modprobe: FATAL: Module $1 not found\" >&2; exit 1");
        let e = sys.bind("00:04.0").unwrap_err().to_string();
        assert!(e.contains("modprobe: FATAL: Module vfio-pci not found"), "{e}");
        assert_eq!(t.read("sys/bus/pci/drivers/nvme/unbind"), "", "nothing unbound");
        // One that loads it (creates the driver dir).
        let drv = t.p("sys/bus/pci/drivers/vfio-pci");
        sys.modprobe = sh(&format!("[ \"$1\" = vfio-pci ] && mkdir -p '{}'", drv.display()));
        sys.bind("00:04.0").unwrap();
        assert_eq!(t.read("sys/bus/pci/drivers_probe"), "0000:00:04.0");
    }

    #[test]
    fn setup_unbind_writes_and_is_idempotent() {
        let t = Tree::new("unbind");
        t.function("0000:00:05.0", NVME_CLASS, Some(VFIO_PCI), Some("4"));
        t.function("0000:00:04.0", NVME_CLASS, Some("nvme"), Some("3"));
        t.file("sys/devices/pci0000:00/0000:00:05.0/driver_override", "vfio-pci\n");
        let sys = t.sys();
        let line = sys.unbind("00:05.0").unwrap();
        assert_eq!(t.read("sys/devices/pci0000:00/0000:00:05.0/driver_override"), "\n");
        assert_eq!(t.read("sys/bus/pci/drivers/vfio-pci/unbind"), "0000:00:05.0");
        assert_eq!(t.read("sys/bus/pci/drivers_probe"), "0000:00:05.0");
        assert!(
            line.contains("0000:00:05.0: vfio-pci -> kernel driver probe requested"),
            "{line}"
        );
        let line = sys.unbind("00:04.0").unwrap();
        assert_eq!(line, "0000:00:04.0: not bound to vfio-pci (driver nvme): nothing to do");
        assert_eq!(t.read("sys/bus/pci/drivers/nvme/unbind"), "");
    }

    #[test]
    fn setup_all_and_exit_errors() {
        let t = Tree::new("all");
        t.function("0000:00:04.0", NVME_CLASS, Some("nvme"), Some("3"));
        t.function("0000:00:05.0", NVME_CLASS, Some("nvme"), None);
        t.function("0000:00:02.0", "0x020000", Some("e1000e"), Some("1"));
        let all = Targets {
            bdfs: vec![],
            all: true,
        };
        let (out, errs) = run(&t.sys(), &SetupCommand::Bind(all));
        assert!(out.contains("0000:00:04.0: nvme -> vfio-pci requested"), "{out}");
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(errs[0].to_string().starts_with("0000:00:05.0: no IOMMU group"));
        assert_eq!(t.read("sys/bus/pci/drivers_probe"), "0000:00:04.0");
        let empty = Tree::new("all-empty");
        let (_, errs) = run(
            &empty.sys(),
            &SetupCommand::Unbind(Targets {
                bdfs: vec![],
                all: true,
            }),
        );
        assert_eq!(
            errs[0].to_string(),
            "no NVMe PCI function (class 0x010802) on this machine"
        );
    }

    #[test]
    fn setup_hugepages() {
        let t = Tree::new("hugepages");
        let (out, errs) = run(&t.sys(), &SetupCommand::Hugepages { count: 64 });
        assert!(errs.is_empty(), "{errs:?}");
        assert_eq!(t.read("sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages"), "64");
        assert!(out.contains("asked 64, reserved 64"), "{out}");
        std::fs::remove_dir_all(t.p("sys/kernel/mm/hugepages/hugepages-2048kB")).unwrap();
        let (_, errs) = run(&t.sys(), &SetupCommand::Hugepages { count: 64 });
        assert!(
            errs[0].to_string().starts_with("hugepages: write \"64\" to"),
            "{errs:?}"
        );
    }

    #[test]
    fn setup_cli_parses() {
        use clap::Parser;
        #[derive(Debug, Parser)]
        struct Cli {
            #[command(flatten)]
            a: SetupArgs,
        }
        let c = Cli::try_parse_from(["x", "bind", "--all"]).unwrap();
        assert!(matches!(c.a.command, SetupCommand::Bind(Targets { all: true, .. })));
        let c = Cli::try_parse_from(["x", "--sysfs-root", "/tmp/t", "unbind", "00:04.0", "00:05.0"]).unwrap();
        assert_eq!(c.a.sysfs_root, PathBuf::from("/tmp/t"));
        assert!(matches!(&c.a.command, SetupCommand::Unbind(t) if t.bdfs.len() == 2));
        assert!(Cli::try_parse_from(["x", "bind"]).is_err(), "bind needs a BDF or --all");
        assert!(Cli::try_parse_from(["x", "bind", "--all", "00:04.0"]).is_err());
        assert!(Cli::try_parse_from(["x", "hugepages", "-1"]).is_err());
    }
}
