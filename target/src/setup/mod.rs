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
use std::path::PathBuf;
use std::process::ExitCode;

mod bind;
mod error;
mod hugepages;
mod report;
mod sysfs;

pub use error::SetupError;
pub use report::format_status;
pub use sysfs::{Function, Hugepages, Status, Sysfs, parse_bdf};

/// PCI class code of an NVMe controller (mass storage, non-volatile memory, NVMe).
pub const NVME_CLASS: &str = "0x010802";
/// The kernel driver that gives a PCI function to userspace.
pub const VFIO_PCI: &str = "vfio-pci";

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
mod tests;
