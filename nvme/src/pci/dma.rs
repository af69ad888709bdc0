//! DMA memory: anonymous, locked host memory with an IOVA the device uses.
//!
//! All access to DMA memory is volatile (or atomic) through raw pointers, never through a
//! Rust reference: the device reads and writes it concurrently (the rule of
//! `vfio_ioctls::VfioContainer::vfio_dma_map` and of vm-memory's `VolatileSlice`).

use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use vm_memory::VolatileSlice;
use vm_memory::bitmap::BS;

use super::{PciError, Result};

/// The memory page size the driver uses (CC.MPS = 0: 4 KiB, NVMe 2.0 §3.1.3.5) and the granule of
/// DMA allocations.
pub const PAGE_SIZE: usize = 4096;
/// A huge page (x86-64 2 MiB): allocations of at least this size try `MAP_HUGETLB` first.
pub const HUGE_PAGE_SIZE: usize = 2 << 20;

/// Allocates memory a device can reach by DMA.
pub trait DmaAllocator: Send + Sync {
    /// Allocates at least `len` bytes, zeroed, page aligned in host and IOVA space and
    /// contiguous in IOVA space.
    fn allocate(&self, len: usize) -> Result<DmaRegion>;
}

/// Undoes an IOVA mapping when its [`DmaRegion`] is dropped (before the host memory is
/// unmapped).
pub trait DmaUnmap: Send + Sync {
    /// Removes the mapping `[iova, iova + len)`.
    fn unmap(&self, iova: u64, len: usize);
}

/// Anonymous host memory, `mmap`ed and `mlock`ed; `munmap`ed on drop.
#[derive(Debug)]
pub struct HostMemory {
    ptr: NonNull<u8>,
    len: usize,
    huge: bool,
}

// SAFETY: HostMemory owns a private anonymous mapping; the pointer is only handed out as a raw
// pointer, whose users (DmaRegion) do volatile accesses only.
unsafe impl Send for HostMemory {}
// SAFETY: as above: no shared-reference access to the memory exists.
unsafe impl Sync for HostMemory {}

impl HostMemory {
    /// Maps `len` bytes (rounded up to 4 KiB, or to 2 MiB when huge pages are used), zeroed.
    /// Tries 2 MiB huge pages for 2 MiB and more, falls back to 4 KiB pages. The memory is
    /// locked (a failure to lock is logged: VFIO pins mapped pages itself).
    pub fn new(len: usize) -> Result<Self> {
        if len == 0 {
            return Err(PciError::Invalid("DMA allocation of 0 bytes".into()));
        }
        let base = libc::PROT_READ | libc::PROT_WRITE;
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE;
        if len >= HUGE_PAGE_SIZE {
            let hlen = len.div_ceil(HUGE_PAGE_SIZE) * HUGE_PAGE_SIZE;
            // SAFETY: an anonymous mapping at an address of the kernel's choosing: it aliases
            // nothing; the result is checked.
            let p = unsafe { libc::mmap(std::ptr::null_mut(), hlen, base, flags | libc::MAP_HUGETLB, -1, 0) };
            if p != libc::MAP_FAILED {
                return Ok(Self::locked(p, hlen, true));
            }
        }
        let plen = len.div_ceil(PAGE_SIZE) * PAGE_SIZE;
        // SAFETY: as above.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), plen, base, flags, -1, 0) };
        if p == libc::MAP_FAILED {
            return Err(PciError::Io {
                context: format!("mmap of {plen} bytes of DMA memory"),
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(Self::locked(p, plen, false))
    }

    fn locked(p: *mut libc::c_void, len: usize, huge: bool) -> Self {
        // SAFETY: p..p+len is the mapping just made.
        if unsafe { libc::mlock(p, len) } != 0 {
            tracing::debug!(len, err = %std::io::Error::last_os_error(), "mlock of DMA memory failed");
        }
        Self {
            ptr: NonNull::new(p.cast()).unwrap_or(NonNull::dangling()),
            len,
            huge,
        }
    }

    /// Start of the mapping.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false (a mapping has at least one page).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether 2 MiB huge pages back it.
    pub fn is_huge(&self) -> bool {
        self.huge
    }
}

impl Drop for HostMemory {
    fn drop(&mut self) {
        // SAFETY: the mapping made in new(); nothing refers to it any more (DmaRegion drops
        // its IOVA mapping first).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// A DMA region: host memory with the IOVA the device uses for it. Dropping it removes the
/// IOVA mapping, then frees the memory.
pub struct DmaRegion {
    mem: HostMemory,
    iova: u64,
    unmap: Option<Arc<dyn DmaUnmap>>,
}

impl std::fmt::Debug for DmaRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DmaRegion")
            .field("iova", &format_args!("{:#x}", self.iova))
            .field("len", &self.mem.len)
            .field("huge", &self.mem.huge)
            .finish()
    }
}

impl DmaRegion {
    /// A region over `mem` mapped at `iova`; `unmap` is called on drop.
    pub fn new(mem: HostMemory, iova: u64, unmap: Option<Arc<dyn DmaUnmap>>) -> Self {
        Self { mem, iova, unmap }
    }

    /// The IOVA of the first byte.
    pub fn iova(&self) -> u64 {
        self.iova
    }

    /// Length in bytes (a multiple of 4 KiB).
    pub fn len(&self) -> usize {
        self.mem.len
    }

    /// Always false.
    pub fn is_empty(&self) -> bool {
        self.mem.len == 0
    }

    /// Host address of the first byte: only for volatile/atomic access or system calls.
    pub fn as_ptr(&self) -> *mut u8 {
        self.mem.as_ptr()
    }

    /// Whether huge pages back it.
    pub fn is_huge(&self) -> bool {
        self.mem.huge
    }

    fn check(&self, offset: usize, len: usize) {
        assert!(
            offset.checked_add(len).is_some_and(|e| e <= self.mem.len),
            "DMA access {offset}+{len} beyond a region of {}",
            self.mem.len
        );
    }

    /// The bytes `[offset, offset + len)` as a vm-memory `VolatileSlice` (volatile copies,
    /// object reads and writes). Panics when out of bounds.
    pub fn volatile_slice(&self, offset: usize, len: usize) -> VolatileSlice<'_, BS<'_, ()>> {
        self.check(offset, len);
        // SAFETY: the range is inside the mapping (checked), which lives as long as &self;
        // VolatileSlice only does volatile accesses, which is what DMA memory allows.
        unsafe { VolatileSlice::new(self.as_ptr().add(offset), len) }
    }

    /// Volatile read of a little-endian u16 at `offset` (2-byte aligned).
    #[inline]
    pub fn read_u16(&self, offset: usize) -> u16 {
        self.check(offset, 2);
        assert!(offset.is_multiple_of(2));
        // SAFETY: in bounds and aligned (checked); volatile as DMA memory requires.
        u16::from_le(unsafe { std::ptr::read_volatile(self.as_ptr().add(offset).cast::<u16>()) })
    }

    /// Volatile read of a little-endian u32 at `offset` (4-byte aligned).
    #[inline]
    pub fn read_u32(&self, offset: usize) -> u32 {
        self.check(offset, 4);
        assert!(offset.is_multiple_of(4));
        // SAFETY: in bounds and aligned (checked); volatile.
        u32::from_le(unsafe { std::ptr::read_volatile(self.as_ptr().add(offset).cast::<u32>()) })
    }

    /// Volatile read of a little-endian u64 at `offset` (8-byte aligned).
    #[inline]
    pub fn read_u64(&self, offset: usize) -> u64 {
        self.check(offset, 8);
        assert!(offset.is_multiple_of(8));
        // SAFETY: in bounds and aligned (checked); volatile.
        u64::from_le(unsafe { std::ptr::read_volatile(self.as_ptr().add(offset).cast::<u64>()) })
    }

    /// Volatile write of a little-endian u16 at `offset` (2-byte aligned).
    #[inline]
    pub fn write_u16(&self, offset: usize, v: u16) {
        self.check(offset, 2);
        assert!(offset.is_multiple_of(2));
        // SAFETY: in bounds and aligned (checked); volatile.
        unsafe { std::ptr::write_volatile(self.as_ptr().add(offset).cast::<u16>(), v.to_le()) }
    }

    /// Volatile write of a little-endian u32 at `offset` (4-byte aligned).
    #[inline]
    pub fn write_u32(&self, offset: usize, v: u32) {
        self.check(offset, 4);
        assert!(offset.is_multiple_of(4));
        // SAFETY: in bounds and aligned (checked); volatile.
        unsafe { std::ptr::write_volatile(self.as_ptr().add(offset).cast::<u32>(), v.to_le()) }
    }

    /// Volatile write of a little-endian u64 at `offset` (8-byte aligned).
    #[inline]
    pub fn write_u64(&self, offset: usize, v: u64) {
        self.check(offset, 8);
        assert!(offset.is_multiple_of(8));
        // SAFETY: in bounds and aligned (checked); volatile.
        unsafe { std::ptr::write_volatile(self.as_ptr().add(offset).cast::<u64>(), v.to_le()) }
    }

    /// Copies `src` into the region at `offset` (volatile).
    pub fn write_bytes(&self, offset: usize, src: &[u8]) {
        self.volatile_slice(offset, src.len()).copy_from(src);
    }

    /// Copies `dst.len()` bytes from the region at `offset` into `dst` (volatile).
    pub fn read_bytes(&self, offset: usize, dst: &mut [u8]) {
        self.volatile_slice(offset, dst.len()).copy_to(dst);
    }

    /// Fills `[offset, offset + len)` with `byte` (volatile).
    pub fn fill(&self, offset: usize, len: usize, byte: u8) {
        let chunk = [byte; 512];
        let mut done = 0;
        while done < len {
            let n = (len - done).min(chunk.len());
            self.write_bytes(offset + done, &chunk[..n]);
            done += n;
        }
    }
}

impl Drop for DmaRegion {
    fn drop(&mut self) {
        if let Some(u) = self.unmap.take() {
            u.unmap(self.iova, self.mem.len);
        }
    }
}

/// A byte range of a shared [`DmaRegion`]: what an I/O command transfers. Holding the `Arc`
/// keeps the memory mapped while the device may still reach it.
#[derive(Clone, Debug)]
pub struct DmaBuf {
    region: Arc<DmaRegion>,
    offset: usize,
    len: usize,
}

impl DmaBuf {
    /// `[offset, offset + len)` of `region`; `None` when out of bounds.
    pub fn new(region: Arc<DmaRegion>, offset: usize, len: usize) -> Option<Self> {
        (offset.checked_add(len)? <= region.len()).then_some(Self { region, offset, len })
    }

    /// The whole region.
    pub fn whole(region: Arc<DmaRegion>) -> Self {
        let len = region.len();
        Self { region, offset: 0, len }
    }

    /// IOVA of the first byte.
    pub fn iova(&self) -> u64 {
        self.region.iova() + self.offset as u64
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Offset in the region.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The region.
    pub fn region(&self) -> &Arc<DmaRegion> {
        &self.region
    }

    /// Copies `src` to the start of the buffer (volatile); panics when too long.
    pub fn write(&self, src: &[u8]) {
        assert!(src.len() <= self.len);
        self.region.write_bytes(self.offset, src);
    }

    /// Copies the start of the buffer to `dst` (volatile); panics when too long.
    pub fn read(&self, dst: &mut [u8]) {
        assert!(dst.len() <= self.len);
        self.region.read_bytes(self.offset, dst);
    }
}

/// A first-fit IOVA allocator over `[base, limit)`, page granular, with coalescing frees.
#[derive(Debug)]
pub struct IovaAllocator {
    free: Vec<(u64, u64)>,
}

impl IovaAllocator {
    /// Default base: 4 GiB, above the x86 MSI window (FEE0_0000h) and low PCI holes.
    pub const DEFAULT_BASE: u64 = 1 << 32;
    /// Default limit: 2^39, what a 39-bit (3-level) VT-d address width reaches (QEMU's
    /// intel-iommu default).
    pub const DEFAULT_LIMIT: u64 = 1 << 39;

    /// An allocator over `[base, limit)`.
    pub fn new(base: u64, limit: u64) -> Self {
        Self {
            free: vec![(base, limit.saturating_sub(base))],
        }
    }

    /// Allocates `len` bytes aligned to `align` (a power of two).
    pub fn alloc(&mut self, len: u64, align: u64) -> Option<u64> {
        for i in 0..self.free.len() {
            let (start, size) = self.free[i];
            let a = start.checked_add(align - 1)? & !(align - 1);
            let pad = a - start;
            if size < pad + len {
                continue;
            }
            let rest = size - pad - len;
            self.free.remove(i);
            let mut at = i;
            if pad > 0 {
                self.free.insert(at, (start, pad));
                at += 1;
            }
            if rest > 0 {
                self.free.insert(at, (a + len, rest));
            }
            return Some(a);
        }
        None
    }

    /// Returns `[iova, iova + len)`.
    pub fn free(&mut self, iova: u64, len: u64) {
        let i = self.free.partition_point(|&(s, _)| s < iova);
        self.free.insert(i, (iova, len));
        // Coalesce with the next, then the previous.
        if i + 1 < self.free.len() && self.free[i].0 + self.free[i].1 == self.free[i + 1].0 {
            self.free[i].1 += self.free[i + 1].1;
            self.free.remove(i + 1);
        }
        if i > 0 && self.free[i - 1].0 + self.free[i - 1].1 == self.free[i].0 {
            self.free[i - 1].1 += self.free[i].1;
            self.free.remove(i);
        }
    }

    /// Free ranges, for tests.
    pub fn free_ranges(&self) -> &[(u64, u64)] {
        &self.free
    }
}

/// Allocates from an [`IovaAllocator`] behind a lock (allocation is not on the I/O path:
/// buffer pools are allocated up front).
pub(crate) fn alloc_iova(alloc: &Mutex<IovaAllocator>, mem: &HostMemory) -> Result<u64> {
    let align = if mem.is_huge() { HUGE_PAGE_SIZE } else { PAGE_SIZE } as u64;
    alloc
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .alloc(mem.len() as u64, align)
        .ok_or(PciError::IovaExhausted { len: mem.len() })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn iova_allocator_first_fit_and_coalesce() {
        let mut a = IovaAllocator::new(0x1000, 0x10_0000);
        let x = a.alloc(0x2000, 0x1000).unwrap();
        let y = a.alloc(0x1000, 0x1000).unwrap();
        let z = a.alloc(0x20_0000, 0x1000);
        assert_eq!((x, y, z), (0x1000, 0x3000, None));
        let h = a.alloc(0x1000, 0x8_0000).unwrap();
        assert_eq!(h, 0x8_0000);
        a.free(y, 0x1000);
        a.free(x, 0x2000);
        a.free(h, 0x1000);
        assert_eq!(a.free_ranges(), &[(0x1000, 0xF_F000)]);
    }

    #[test]
    fn region_volatile_access() {
        let r = DmaRegion::new(HostMemory::new(100).unwrap(), 0x1_0000, None);
        assert_eq!(r.len(), PAGE_SIZE);
        r.write_u64(8, 0x1122_3344_5566_7788);
        assert_eq!(r.read_u32(8), 0x5566_7788);
        assert_eq!(r.read_u16(14), 0x1122);
        r.write_bytes(100, b"hello");
        let mut b = [0u8; 5];
        r.read_bytes(100, &mut b);
        assert_eq!(&b, b"hello");
        r.fill(0, PAGE_SIZE, 0xAB);
        assert_eq!(r.read_u64(4088), 0xABAB_ABAB_ABAB_ABAB);
        let buf = DmaBuf::new(Arc::new(r), 16, 32).unwrap();
        assert_eq!(buf.iova(), 0x1_0010);
        assert!(DmaBuf::new(buf.region().clone(), 4090, 7).is_none());
    }
}
