//! Tests of `pollux setup` against fake sysfs trees.

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
