//! A PCI function bound to vfio-pci: the [`Hardware`] of a real NVMe controller.
//!
//! Container (`/dev/vfio/vfio`, type1 v2 IOMMU), group (`/dev/vfio/N`), device; BAR0 is
//! mmapped where VFIO allows it (region flags, sparse-mmap areas), keeping off the MSI-X
//! table and PBA, with `pread`/`pwrite` on the device fd for anything else; DMA memory is
//! anonymous (2 MiB huge pages when available, else 4 KiB), locked, and mapped with
//! `VFIO_IOMMU_MAP_DMA` at IOVAs from an [`IovaAllocator`]; MSI-X vectors are wired to
//! eventfds with `VFIO_DEVICE_SET_IRQS`. Built on rust-vmm's vfio-ioctls without its KVM
//! feature: no hypervisor is involved.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use vfio_bindings::bindings::vfio::{
    VFIO_PCI_BAR0_REGION_INDEX, VFIO_PCI_CONFIG_REGION_INDEX, VFIO_PCI_MSIX_IRQ_INDEX, VFIO_REGION_INFO_FLAG_MMAP,
};
use vfio_ioctls::{VfioContainer, VfioDevice, VfioOps, VfioRegionInfoCap};
use vmm_sys_util::eventfd::EventFd;

use super::dma::{DmaAllocator, DmaRegion, DmaUnmap, HostMemory, IovaAllocator, PAGE_SIZE, alloc_iova};
use super::irq::Interrupts;
use super::regs::RegisterAccess;
use super::{Hardware, PciError, Result};

/// PCI configuration space: Command register (PCI 3.0 §6.2.2).
const PCI_COMMAND: u64 = 0x04;
const PCI_COMMAND_MEMORY: u16 = 1 << 1;
const PCI_COMMAND_MASTER: u16 = 1 << 2;
const PCI_STATUS: u64 = 0x06;
const PCI_STATUS_CAP_LIST: u16 = 1 << 4;
const PCI_CAPABILITY_LIST: u64 = 0x34;
const PCI_CAP_ID_MSIX: u8 = 0x11;

/// `0000:00:04.0` from `00:04.0` or `0000:00:04.0`.
pub fn normalize_bdf(bdf: &str) -> String {
    if bdf.matches(':').count() == 1 {
        format!("0000:{bdf}")
    } else {
        bdf.to_string()
    }
}

/// Where the MSI-X table and PBA live (PCI 3.0 §6.8.2).
#[derive(Clone, Copy, Debug, Default)]
struct Msix {
    vectors: u16,
    table_bir: u8,
    table_off: u64,
    pba_bir: u8,
    pba_off: u64,
}

fn cfg_read<const N: usize>(dev: &VfioDevice, off: u64) -> [u8; N] {
    let mut b = [0u8; N];
    dev.region_read(VFIO_PCI_CONFIG_REGION_INDEX, &mut b, off);
    b
}

fn find_msix(dev: &VfioDevice) -> Option<Msix> {
    let status = u16::from_le_bytes(cfg_read(dev, PCI_STATUS));
    if status & PCI_STATUS_CAP_LIST == 0 {
        return None;
    }
    let mut ptr = u64::from(cfg_read::<1>(dev, PCI_CAPABILITY_LIST)[0] & !3);
    for _ in 0..48 {
        if ptr == 0 {
            break;
        }
        let [id, next] = cfg_read::<2>(dev, ptr);
        if id == PCI_CAP_ID_MSIX {
            let ctrl = u16::from_le_bytes(cfg_read(dev, ptr + 2));
            let table = u32::from_le_bytes(cfg_read(dev, ptr + 4));
            let pba = u32::from_le_bytes(cfg_read(dev, ptr + 8));
            return Some(Msix {
                vectors: (ctrl & 0x7FF) + 1,
                table_bir: (table & 7) as u8,
                table_off: u64::from(table & !7),
                pba_bir: (pba & 7) as u8,
                pba_off: u64::from(pba & !7),
            });
        }
        ptr = u64::from(next & !3);
    }
    None
}

/// Opens the PCI function `bdf` (bound to vfio-pci) as [`Hardware`]: checks the IOMMU group,
/// the driver and the permissions with errors that say what to do, enables memory space and
/// bus mastering, maps BAR0.
pub fn open(bdf: &str) -> Result<Hardware> {
    let bdf = normalize_bdf(bdf);
    let sysfs = PathBuf::from(format!("/sys/bus/pci/devices/{bdf}"));
    if !sysfs.exists() {
        return Err(PciError::NoDevice { bdf });
    }
    let group = std::fs::read_link(sysfs.join("iommu_group"))
        .ok()
        .and_then(|p| p.file_name().and_then(|n| n.to_str()).map(str::to_owned))
        .ok_or_else(|| PciError::NoIommuGroup { bdf: bdf.clone() })?;
    let driver = std::fs::read_link(sysfs.join("driver"))
        .ok()
        .and_then(|p| p.file_name().and_then(|n| n.to_str()).map(str::to_owned))
        .unwrap_or_else(|| "no driver".into());
    if driver != "vfio-pci" {
        return Err(PciError::WrongDriver { bdf, driver });
    }
    for node in ["/dev/vfio/vfio".to_string(), format!("/dev/vfio/{group}")] {
        // Probe permissions first for a clear message (the group node is exclusive: close it
        // before vfio-ioctls opens it).
        match std::fs::OpenOptions::new().read(true).write(true).open(&node) {
            Ok(f) => drop(f),
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                return Err(PciError::Permission { bdf, path: node });
            }
            Err(source) => {
                return Err(PciError::Io {
                    context: format!("{bdf}: open {node} (is another process using it?)"),
                    source,
                });
            }
        }
    }
    let vfio = |op| {
        let bdf = bdf.clone();
        move |source| PciError::Vfio { bdf, op, source }
    };
    let container = Arc::new(VfioContainer::new(None).map_err(vfio("container"))?);
    let ops: Arc<dyn VfioOps> = container.clone();
    let dev = Arc::new(VfioDevice::new(Path::new(&sysfs), ops, false).map_err(vfio("device"))?);

    // Memory space and bus master (the device must be able to DMA).
    let cmd = u16::from_le_bytes(cfg_read(&dev, PCI_COMMAND));
    let want = cmd | PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER;
    if want != cmd {
        dev.region_write(VFIO_PCI_CONFIG_REGION_INDEX, &want.to_le_bytes(), PCI_COMMAND);
    }
    let msix = find_msix(&dev);
    let bar = VfioBar::map(dev.clone(), &bdf, msix)?;
    let irq_count = dev.get_irq_info(VFIO_PCI_MSIX_IRQ_INDEX).map_or(0, |i| i.count);
    tracing::info!(%bdf, group, bar0 = bar.size, mapped = ?bar.areas.iter().map(|a| (a.off, a.len)).collect::<Vec<_>>(),
        msix = irq_count, "VFIO function open");
    Ok(Hardware {
        name: bdf.clone(),
        regs: Arc::new(bar),
        dma: Arc::new(VfioDma(Arc::new(VfioDmaInner {
            container,
            _dev: dev.clone(),
            iova: Mutex::new(IovaAllocator::new(
                IovaAllocator::DEFAULT_BASE,
                IovaAllocator::DEFAULT_LIMIT,
            )),
            bdf: bdf.clone(),
        }))),
        irqs: Arc::new(VfioIrqs {
            dev,
            bdf,
            max: irq_count.min(u32::from(u16::MAX)) as u16,
        }),
    })
}

struct Area {
    off: usize,
    len: usize,
    ptr: *mut u8,
}

/// BAR0: mmapped areas, and the device fd for the rest.
struct VfioBar {
    dev: Arc<VfioDevice>,
    size: u64,
    areas: Vec<Area>,
}

// SAFETY: the raw pointers are MMIO mappings owned by VfioBar, accessed only with volatile
// reads and writes (MMIO registers are safe to access from any thread).
unsafe impl Send for VfioBar {}
// SAFETY: as above; no Rust reference to the mapped memory is ever made.
unsafe impl Sync for VfioBar {}

/// `ranges` minus `[start, end)`.
fn subtract(ranges: Vec<(u64, u64)>, start: u64, end: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for (s, e) in ranges {
        if end <= s || start >= e {
            out.push((s, e));
            continue;
        }
        if s < start {
            out.push((s, start));
        }
        if end < e {
            out.push((end, e));
        }
    }
    out
}

impl VfioBar {
    fn map(dev: Arc<VfioDevice>, bdf: &str, msix: Option<Msix>) -> Result<Self> {
        let idx = VFIO_PCI_BAR0_REGION_INDEX;
        let size = dev.get_region_size(idx);
        if size < 0x2000 {
            return Err(PciError::Bar {
                bdf: bdf.into(),
                reason: format!("{size} bytes, too small for NVMe registers"),
            });
        }
        let flags = dev.get_region_flags(idx);
        let base = dev.get_region_offset(idx);
        let mut ranges = Vec::new();
        if flags & VFIO_REGION_INFO_FLAG_MMAP != 0 {
            let sparse = dev.get_region_caps(idx).into_iter().find_map(|c| match c {
                VfioRegionInfoCap::SparseMmap(s) => Some(s.areas),
                _ => None,
            });
            match sparse {
                Some(a) => ranges.extend(a.iter().map(|a| (a.offset, a.offset + a.size))),
                None => ranges.push((0, size)),
            }
        }
        // Never map the MSI-X table or PBA: VFIO owns them.
        let page = PAGE_SIZE as u64;
        if let Some(m) = msix {
            if m.table_bir == 0 {
                let end = m.table_off + u64::from(m.vectors) * 16;
                ranges = subtract(ranges, m.table_off & !(page - 1), end.div_ceil(page) * page);
            }
            if m.pba_bir == 0 {
                let end = m.pba_off + u64::from(m.vectors).div_ceil(64) * 8;
                ranges = subtract(ranges, m.pba_off & !(page - 1), end.div_ceil(page) * page);
            }
        }
        let mut areas = Vec::new();
        for (s, e) in ranges {
            let (s, e) = (s.div_ceil(page) * page, e & !(page - 1));
            if e <= s {
                continue;
            }
            let len = (e - s) as usize;
            // SAFETY: a shared mapping of the device fd at the region's offset, of a range
            // VFIO reports as mmappable; the result is checked. It aliases no Rust memory.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    dev.as_raw_fd(),
                    (base + s) as libc::off_t,
                )
            };
            if p == libc::MAP_FAILED {
                let err = std::io::Error::last_os_error();
                tracing::warn!(%bdf, off = s, len, %err, "BAR0 mmap failed; using pread/pwrite");
                continue;
            }
            areas.push(Area {
                off: s as usize,
                len,
                ptr: p.cast(),
            });
        }
        if !areas.iter().any(|a| a.off == 0 && a.len >= 0x1000) {
            tracing::warn!(%bdf, "BAR0 registers not mmapped: every access is a system call");
        }
        Ok(Self { dev, size, areas })
    }

    fn find(&self, off: usize) -> Option<*mut u8> {
        self.areas
            .iter()
            .find(|a| off >= a.off && off + 4 <= a.off + a.len)
            // SAFETY: off - a.off + 4 <= a.len: inside the mapping.
            .map(|a| unsafe { a.ptr.add(off - a.off) })
    }
}

impl RegisterAccess for VfioBar {
    fn read32(&self, off: usize) -> u32 {
        match self.find(off) {
            // SAFETY: an aligned (register offsets are multiples of 4; the mapping is page
            // aligned) address inside a live MMIO mapping; volatile, as device memory needs.
            Some(p) => u32::from_le(unsafe { std::ptr::read_volatile(p.cast::<u32>()) }),
            None => {
                let mut b = [0u8; 4];
                self.dev.region_read(VFIO_PCI_BAR0_REGION_INDEX, &mut b, off as u64);
                u32::from_le_bytes(b)
            }
        }
    }

    fn write32(&self, off: usize, value: u32) {
        match self.find(off) {
            // SAFETY: as in read32.
            Some(p) => unsafe { std::ptr::write_volatile(p.cast::<u32>(), value.to_le()) },
            None => self
                .dev
                .region_write(VFIO_PCI_BAR0_REGION_INDEX, &value.to_le_bytes(), off as u64),
        }
    }
}

impl Drop for VfioBar {
    fn drop(&mut self) {
        for a in &self.areas {
            // SAFETY: a mapping made in map(), not used after this.
            unsafe { libc::munmap(a.ptr.cast(), a.len) };
        }
    }
}

struct VfioDmaInner {
    container: Arc<VfioContainer>,
    /// Held so the device (its group in the container) outlives every mapping: dropping the
    /// device detaches the group, which takes the container's IOMMU mappings with it, and a
    /// later VFIO_IOMMU_UNMAP_DMA of a region dropped after it fails with EINVAL.
    _dev: Arc<VfioDevice>,
    iova: Mutex<IovaAllocator>,
    bdf: String,
}

impl DmaUnmap for VfioDmaInner {
    fn unmap(&self, iova: u64, len: usize) {
        match self.container.vfio_dma_unmap(iova, len) {
            Ok(()) => self
                .iova
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .free(iova, len as u64),
            // The IOVA stays reserved: the device may still reach the old mapping.
            Err(e) => tracing::error!(bdf = %self.bdf, iova, len, "VFIO_IOMMU_UNMAP_DMA: {e}"),
        }
    }
}

struct VfioDma(Arc<VfioDmaInner>);

impl DmaAllocator for VfioDma {
    fn allocate(&self, len: usize) -> Result<DmaRegion> {
        let mem = HostMemory::new(len)?;
        let iova = alloc_iova(&self.0.iova, &mem)?;
        // SAFETY: the memory is a fresh anonymous mapping owned by the DmaRegion built below,
        // which only allows volatile access to it and unmaps the IOVA range (this same iova
        // and len) before it unmaps the memory.
        let r = unsafe { self.0.container.vfio_dma_map(iova, mem.len(), mem.as_ptr()) };
        if let Err(source) = r {
            self.0
                .iova
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .free(iova, mem.len() as u64);
            return Err(PciError::Vfio {
                bdf: self.0.bdf.clone(),
                op: "VFIO_IOMMU_MAP_DMA",
                source,
            });
        }
        let unmap: Arc<dyn DmaUnmap> = self.0.clone();
        Ok(DmaRegion::new(mem, iova, Some(unmap)))
    }
}

struct VfioIrqs {
    dev: Arc<VfioDevice>,
    bdf: String,
    max: u16,
}

impl Interrupts for VfioIrqs {
    fn max_vectors(&self) -> u16 {
        self.max
    }

    fn enable(&self, count: u16) -> Result<Vec<Arc<EventFd>>> {
        let count = count.min(self.max);
        if count == 0 {
            return Ok(Vec::new());
        }
        let _ = self.dev.disable_msix();
        let fds = super::irq::eventfds(count, &self.bdf)?;
        let refs: Vec<&EventFd> = fds.iter().map(|e| e.as_ref()).collect();
        self.dev.enable_msix(refs).map_err(|source| PciError::Vfio {
            bdf: self.bdf.clone(),
            op: "VFIO_DEVICE_SET_IRQS (MSI-X)",
            source,
        })?;
        Ok(fds)
    }

    fn disable(&self) -> Result<()> {
        self.dev.disable_msix().map_err(|source| PciError::Vfio {
            bdf: self.bdf.clone(),
            op: "VFIO_DEVICE_SET_IRQS (disable)",
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn bdf_and_ranges() {
        assert_eq!(normalize_bdf("00:04.0"), "0000:00:04.0");
        assert_eq!(normalize_bdf("0000:00:04.0"), "0000:00:04.0");
        assert_eq!(
            subtract(vec![(0, 0x4000)], 0x2000, 0x3000),
            vec![(0, 0x2000), (0x3000, 0x4000)]
        );
        assert_eq!(subtract(vec![(0, 0x4000)], 0, 0x4000), vec![]);
        assert_eq!(subtract(vec![(0, 0x1000)], 0x2000, 0x3000), vec![(0, 0x1000)]);
    }

    #[test]
    fn open_missing_function_names_it() {
        let e = open("ffff:ff:1f.7").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("ffff:ff:1f.7") && e.contains("no such PCI function"), "{e}");
    }
}
