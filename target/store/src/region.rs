//! The memory of a RAM namespace ([`RamDisk`]): a memfd, mapped shared, reached by every
//! reactor. A simulated SSD keeps its data in one too, a null namespace its window of
//! zeroes; a read's data is sent from it in place, and the hot upgrade hands it over. The
//! RAM backend itself is `ram`, the fill that commits its pages ahead of time `prefault`.
//!
//! Why a memfd and not anonymous memory: the hot upgrade (a new pollux binary taking over
//! a running one's connections) hands each RAM namespace's memory to the next process as a
//! descriptor ([`RamDisk::memfd`], [`RamDisk::adopt`]), so that the data a host wrote is
//! there, without a copy, when the new process serves it; anonymous memory dies with its
//! process. The memfd is sealed against resizing (F_SEAL_SHRINK, F_SEAL_GROW): a mapping
//! past a shrunk end would fault with SIGBUS, in whichever process maps it.
//!
//! Several reactors may touch the same blocks at once (two hosts, or one host's queues on two
//! cores), so no Rust reference to the bytes ever exists: the memory is reached only through
//! vm-memory's `VolatileSlice`, the type rust-vmm uses for guest memory that another party
//! writes concurrently. Its bulk copies are one `memcpy` (vm-memory's own rule for copies
//! longer than a word), not a loop of word accesses: a 4 KiB read is ~100 instructions
//! instead of ~1,400, the largest single item of the target's work per I/O. Each copy goes a
//! 4 KiB stripe at a time under a sequence counter ([`Stripes`]), so that a logical block is
//! written and read whole (NVMe 2.0 §2.1.4.1, AWUN): two bare copies of the same bytes on two
//! cores mix them. Pages are
//! committed on first touch, or ahead of time by a filler ([`RamDisk::populated`]), which
//! also makes each 2 MiB of a RAM namespace one transparent huge page where THP is allowed
//! (`collapse`: shmem gets huge pages at fault time only where shmem_enabled says so, which
//! it does not by default; until the filler has reached a 2 MiB, it is in 4 KiB pages, which
//! on a machine whose every core spins can last); deallocated ranges are punched out of the memfd
//! (fallocate PUNCH_HOLE), which makes them read as zeroes in every mapping of it (NVMe
//! DLFEAT "deallocated blocks read as zeroes"). MADV_DONTNEED, which did that for the
//! anonymous mapping before, does not zero a shared mapping: it drops this process's page
//! table entries and the next access maps the file's unchanged page again.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use vm_memory::VolatileSlice;

use crate::error::StoreError;
use crate::prefault::{self, Filled};
use crate::stripes::Stripes;

/// A small page: what a deallocated range releases whole, and what a fill commits first.
pub(crate) const PAGE: u64 = 4096;

/// Zeroes for the partial pages of a deallocated range.
static ZEROES: [u8; PAGE as usize] = [0; PAGE as usize];

/// A RAM disk of `len` bytes (a multiple of 8).
#[derive(Debug)]
pub struct RamDisk {
    /// `map`'s, copied here so that an access reads no pointer more than before.
    base: NonNull<u8>,
    len: u64,
    map: Arc<Mapping>,
    /// Set once the memory is committed, or its fill given up ([`RamDisk::populated`]).
    populating: Option<Arc<Filled>>,
    /// Tells its filler to stop (the disk is going).
    stop: Arc<AtomicBool>,
    /// Makes each logical block atomic against reads and writes on other reactors.
    stripes: Stripes,
}

/// goes: the disk, or its fill job (queued, or with a filler). So dropping a disk (which
/// may happen on a reactor, with the last reference to a removed namespace) never waits
/// for a filler.
#[derive(Debug)]
pub(crate) struct Mapping {
    base: NonNull<u8>,
    len: u64,
    /// The memfd the mapping shows (MAP_SHARED); None for the anonymous private mapping of
    /// [`RamDisk::anonymous`]. Closed after the unmap (fields drop after `Drop::drop`).
    fd: Option<OwnedFd>,
}

/// What the prefault service reads of a mapping (only this module makes one, so that
/// every `Mapping` is one that `map_shared` or `map_anonymous` made).
impl Mapping {
    /// Its first byte, mapped while `self` lives.
    pub(crate) fn base(&self) -> NonNull<u8> {
        self.base
    }

    /// Its length in bytes.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// Whether it shows a memfd (shmem, whose pages the filler can make huge), not
    /// anonymous memory.
    pub(crate) fn is_memfd(&self) -> bool {
        self.fd.is_some()
    }
}

// SAFETY: the mapping is only accessed through VolatileSlice copies (which tolerate concurrent
// access, as guest memory does), madvise and fallocate; it is unmapped in Drop only.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made by map_shared or map_anonymous; the last
        // holder is going, and no RamDisk (whose accesses borrow it) outlives its own Arc.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len as usize) };
    }
}

/// A huge page: the unit of `prefault::populate` and of `prefault::collapse`, and the
/// alignment of a memfd mapping of at least this size ([`map_shared`]).
pub(crate) const HUGE: u64 = 2 << 20;

// SAFETY: the mapping is only accessed through VolatileSlice copies (which tolerate concurrent
// access, as guest memory does) and madvise; it is unmapped by `Mapping` only.
unsafe impl Send for RamDisk {}
// SAFETY: as above.
unsafe impl Sync for RamDisk {}

/// A RAM disk's size: a non-zero multiple of 8 that the address space and `off_t` hold.
fn check_len(len: u64) -> std::io::Result<()> {
    if len == 0 || !len.is_multiple_of(8) || i64::try_from(len).is_err() || usize::try_from(len).is_err() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "RAM size must be a non-zero multiple of 8",
        ));
    }
    Ok(())
}

/// Ask for transparent huge pages over `[p, p + len)` where the system allows them.
///
/// Random 4 KiB reads over a large disk otherwise miss the TLB on nearly every command,
/// and in a VM each miss is a two-dimensional page walk: a RAM namespace over 64 MiB
/// measured ~1.5-2 us slower per QD1 read than one over 16 KiB. SPDK's RAM bdev sits in
/// hugetlbfs memory for the same reason. Advice only: without THP the disk works on 4 KiB
/// pages. For a memfd (shmem) it counts only where
/// /sys/kernel/mm/transparent_hugepage/shmem_enabled is "advise" (or "always"/"within_size",
/// which need no advice); it is "never" by default (and on the machine this was written on):
/// not an error, and the filler makes the pages huge after committing them
/// (`prefault::collapse`).
fn advise_huge(p: *mut libc::c_void, len: u64) {
    // SAFETY: advice on a mapping this module just made; it changes no content.
    if unsafe { libc::madvise(p, len as usize, libc::MADV_HUGEPAGE) } != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "RAM disk: no transparent huge pages");
    }
}

/// Map `len` bytes of `fd` shared, read-write; from a 2 MiB-aligned address when the disk
/// has 2 MiB or more, so that each 2 MiB of the memfd can be one huge page mapped by one
/// page table entry (`prefault::collapse`): the kernel aligns a shared memfd mapping itself
/// only where shmem THP is enabled. The alignment costs a reservation of 2 MiB more address
/// space, trimmed at once.
fn map_shared(fd: BorrowedFd<'_>, len: u64) -> std::io::Result<NonNull<u8>> {
    use std::os::fd::AsRawFd;
    let span = len.next_multiple_of(PAGE) as usize;
    let huge = HUGE as usize;
    let (mut at, mut flags) = (std::ptr::null_mut(), libc::MAP_SHARED | libc::MAP_NORESERVE);
    let mut reserved = None;
    if span >= huge {
        // SAFETY: a fresh anonymous reservation, no access allowed; no existing memory is
        // affected. The result is checked against MAP_FAILED.
        let r = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                span + huge,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if r == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let r = r as usize;
        at = r.next_multiple_of(huge) as *mut libc::c_void;
        flags |= libc::MAP_FIXED;
        reserved = Some(r);
    }
    // SAFETY: a shared mapping of the memfd, either where the kernel picks, or (MAP_FIXED)
    // at `[at, at + span)`, inside the reservation just made, which nothing else uses and
    // which it replaces. The result is checked against MAP_FAILED.
    let p = unsafe { libc::mmap(at, span, libc::PROT_READ | libc::PROT_WRITE, flags, fd.as_raw_fd(), 0) };
    let failed = (p == libc::MAP_FAILED).then(std::io::Error::last_os_error);
    if let Some(r) = reserved {
        if let Some(e) = failed {
            // SAFETY: the whole reservation made above, which nothing maps into now.
            unsafe { libc::munmap(r as *mut libc::c_void, span + huge) };
            return Err(e);
        }
        let (head, a) = (p as usize - r, p as usize);
        // SAFETY: the reservation's parts before and after the memfd's mapping, made
        // above and used by nothing (`head < huge`, and the two add up to `huge`).
        unsafe {
            if head > 0 {
                libc::munmap(r as *mut libc::c_void, head);
            }
            if huge > head {
                libc::munmap((a + span) as *mut libc::c_void, huge - head);
            }
        }
    } else if let Some(e) = failed {
        return Err(e);
    }
    advise_huge(p, len);
    NonNull::new(p.cast::<u8>()).ok_or_else(std::io::Error::last_os_error)
}

/// Map `len` bytes of anonymous private memory (zeroes until written).
fn map_anonymous(len: u64) -> std::io::Result<NonNull<u8>> {
    // SAFETY: a fresh anonymous private mapping; no existing memory is affected. The
    // result is checked against MAP_FAILED.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    advise_huge(p, len);
    NonNull::new(p.cast::<u8>()).ok_or_else(std::io::Error::last_os_error)
}

impl RamDisk {
    /// A disk over `map`, with no fill.
    fn over(map: Mapping) -> Self {
        Self {
            base: map.base,
            len: map.len,
            stripes: Stripes::new(map.len),
            map: Arc::new(map),
            populating: None,
            stop: Arc::new(AtomicBool::new(false)),
        }
    }

    /// `len` bytes of zeroed, lazily committed memory: a new memfd ("pollux-ram" in
    /// /proc/PID/fd and /proc/PID/maps), its size sealed, mapped shared.
    pub fn new(len: u64) -> std::io::Result<Self> {
        use nix::fcntl::{FcntlArg, SealFlag, fcntl};
        use nix::sys::memfd::{MFdFlags, memfd_create};
        check_len(len)?;
        let fd = memfd_create(c"pollux-ram", MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING)?;
        // Fits: check_len.
        nix::unistd::ftruncate(&fd, len as i64)?;
        fcntl(
            &fd,
            FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW),
        )?;
        let base = map_shared(fd.as_fd(), len)?;
        Ok(Self::over(Mapping {
            base,
            len,
            fd: Some(fd),
        }))
    }

    /// Serve the memory another process's disk of `len` bytes handed over ([`RamDisk::memfd`],
    /// the hot upgrade): maps the memfd `fd` shared, as it is. Its content is not touched
    /// (neither zeroed nor filled: the data is exactly what the other process wrote, and the
    /// pages it committed are committed in the memfd, so there is nothing to populate; each
    /// page is mapped into this process at its first access, a minor fault). Err: `fd` is not
    /// `len` bytes ([`StoreError::RamAdoptSize`]), or cannot be mapped.
    pub fn adopt(fd: OwnedFd, len: u64) -> Result<Self, StoreError> {
        let err = |source: std::io::Error| StoreError::Ram { bytes: len, source };
        check_len(len).map_err(err)?;
        let st = nix::sys::stat::fstat(&fd).map_err(|e| err(e.into()))?;
        let found = u64::try_from(st.st_size).unwrap_or(0);
        if found != len {
            return Err(StoreError::RamAdoptSize { expected: len, found });
        }
        let base = map_shared(fd.as_fd(), len).map_err(err)?;
        Ok(Self::over(Mapping {
            base,
            len,
            fd: Some(fd),
        }))
    }

    /// `len` bytes of anonymous private memory, no memfd: the null backend's window of
    /// zeroes (`null::NullDisk`), never written. Reads of never-written anonymous memory map
    /// the kernel's shared zero page, whereas every read fault on a shared memfd commits a
    /// page of its own; and the window holds no data to hand over.
    pub fn anonymous(len: u64) -> std::io::Result<Self> {
        check_len(len)?;
        let base = map_anonymous(len)?;
        Ok(Self::over(Mapping { base, len, fd: None }))
    }

    /// The memfd holding the disk's memory, for the hot upgrade to hand over to the next
    /// process (which [`RamDisk::adopt`]s a duplicate of it). None for [`RamDisk::anonymous`].
    pub fn memfd(&self) -> Option<BorrowedFd<'_>> {
        self.map.fd.as_ref().map(AsFd::as_fd)
    }

    /// Map `len` bytes as [`RamDisk::new`] does, and commit them all in the background
    /// (huge pages where the system allows), so that a host's writes take no page fault:
    /// the first write into each 2 MiB huge page stalled the reactor for 4.3-4.6 ms while
    /// the kernel zeroed it. A filler thread (a few fill every disk, `prefault::Fillers`)
    /// walks the disk a huge page at a time with MADV_POPULATE_WRITE, which faults pages in
    /// without changing their content, and MADV_COLLAPSE, which makes each 2 MiB one huge
    /// page without changing its content (`prefault::populate`), so I/O meanwhile stays
    /// correct (a write that reaches a page first takes its fault as before; one into a 2 MiB
    /// being collapsed waits for the copy). The memory is resident from then on. Where the
    /// kernel cannot populate (before Linux 5.14, or short of memory) the rest stays lazily
    /// committed, with a warning. The fillers run at the lowest priority
    /// (`prefault::give_way`): filling never delays a reactor.
    pub fn populated(len: u64) -> std::io::Result<Self> {
        let mut d = Self::new(len)?;
        d.populating = Some(prefault::start(d.map.clone(), d.stop.clone())?);
        Ok(d)
    }

    /// Wait until the background populate (if any) is over.
    pub fn wait_populated(&mut self) {
        if let Some(f) = self.populating.take() {
            f.wait();
        }
    }

    /// Size in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Always false: a RAM disk has a size.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Callers check ranges against the namespace's size; a range outside the mapping here
    /// is a bug of pollux, not of the host.
    fn check(&self, off: u64, len: usize) {
        assert!(
            off.checked_add(len as u64).is_some_and(|end| end <= self.len),
            "RAM access out of bounds"
        );
    }

    /// The bytes `[off, off + len)` of the disk.
    fn slice(&self, off: u64, len: usize) -> VolatileSlice<'_> {
        self.check(off, len);
        // SAFETY: the range is inside the mapping (checked above), which lives as long as
        // self; VolatileSlice never creates a reference to the bytes.
        unsafe { VolatileSlice::new(self.base.as_ptr().add(off as usize), len) }
    }

    /// Where `[off, off + len)` lives, for the kernel to read in place (a read's data sent
    /// straight from the namespace, see `sendq`). No Rust reference to the bytes is made.
    pub fn range_ptr(&self, off: u64, len: usize) -> NonNull<u8> {
        self.check(off, len);
        // SAFETY: `off <= self.len` (checked), so the pointer stays inside the mapping or
        // one past its end, and the mapping's base is not null.
        unsafe { self.base.add(off as usize) }
    }

    /// Whether a read's bytes may be sent from the memory in place, read by the kernel
    /// whenever the socket takes them: only for memory that is never written (the null
    /// backend's zeroes, [`RamDisk::anonymous`]). A disk that is written could change under
    /// a send still queued, mixing two writes in one block (see [`Stripes`]).
    pub fn sends_in_place(&self) -> bool {
        self.map.fd.is_none()
    }

    /// Copy `out.len()` bytes at `off` into `out` (callers check the range).
    pub fn read(&self, off: u64, out: &mut [u8]) {
        self.stripes.read(off, out.len(), |at, n, to| {
            self.slice(at, n).copy_to(&mut out[to..to + n]);
        });
    }

    /// Append `len` bytes at `off` to `out`: a read's data goes straight from the namespace
    /// into the send buffer, with no zero-fill of the buffer first.
    pub fn read_append(&self, off: u64, len: usize, out: &mut Vec<u8>) {
        let src = self.slice(off, len);
        out.reserve(len);
        let start = out.len();
        let spare = &mut out.spare_capacity_mut()[..len];
        // SAFETY: `spare` is `len` bytes of the vector's capacity, exclusively borrowed here;
        // a VolatileSlice over it only writes through a raw pointer.
        let dst = unsafe { VolatileSlice::new(spare.as_mut_ptr().cast::<u8>(), len) };
        self.stripes.read(off, len, |_, n, to| {
            if let (Ok(s), Ok(d)) = (src.subslice(to, n), dst.subslice(to, n)) {
                s.copy_to_volatile_slice(d);
            }
        });
        // SAFETY: the copies above initialised the `len` bytes after `start`: the pieces
        // cover `[0, len)` of both slices, each copied whole.
        unsafe { out.set_len(start + len) };
    }

    /// Copy `data` to `off`, each logical block of it atomically ([`Stripes`]).
    pub fn write(&self, off: u64, data: &[u8]) {
        self.stripes.write(off, data.len(), |at, n, from| {
            self.slice(at, n).copy_from(&data[from..from + n])
        });
    }

    /// Make `len` bytes at `off` read as zeroes, releasing whole pages to the kernel.
    pub fn zero(&self, off: u64, len: u64) {
        self.check(off, len as usize);
        let end = off + len;
        let first_page = off.div_ceil(PAGE) * PAGE;
        let last_page = end / PAGE * PAGE;
        if last_page > first_page {
            self.store_zero(off, first_page);
            // A page punched out under a reader would hand it old bytes, then zeroes.
            let released = self.stripes.exclusive(first_page, last_page - first_page, || {
                self.release(first_page, last_page)
            });
            if let Err(e) = released {
                tracing::debug!(error = %e, "RAM disk: pages not released, zeroes written instead");
                self.store_zero(first_page, last_page);
            }
            self.store_zero(last_page, end);
        } else {
            self.store_zero(off, end);
        }
    }

    /// Hand the whole pages `[from, to)` back to the kernel, after which they read as zeroes.
    fn release(&self, from: u64, to: u64) -> std::io::Result<()> {
        use nix::fcntl::{FallocateFlags, fallocate};
        match &self.map.fd {
            // The memfd's own pages, and so every mapping of it (this process's, and
            // another's during a hand-over), the way a file's hole reads.
            Some(fd) => Ok(fallocate(
                fd,
                FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE,
                from as i64,
                (to - from) as i64,
            )?),
            None => {
                // SAFETY: [from, to) is page aligned and inside the mapping (callers stay
                // inside `len`); MADV_DONTNEED on a private anonymous mapping only makes
                // pages read as zero.
                let rc = unsafe {
                    libc::madvise(
                        self.base.as_ptr().add(from as usize).cast(),
                        (to - from) as usize,
                        libc::MADV_DONTNEED,
                    )
                };
                if rc == 0 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            }
        }
    }

    fn store_zero(&self, mut from: u64, to: u64) {
        while from < to {
            let n = (to - from).min(PAGE);
            self.write(from, &ZEROES[..n as usize]);
            from += n;
        }
    }
}

impl Drop for RamDisk {
    fn drop(&mut self) {
        // Its filler stops within one huge page and, holding the mapping, unmaps
        // it if it is the last: not waited for here.
        self.stop.store(true, Relaxed);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn write_read_zero_round_trip() {
        round_trip(&RamDisk::new(64 * 1024).unwrap_or_else(|e| panic!("{e}")));
        // The null backend's anonymous window releases pages with MADV_DONTNEED instead.
        round_trip(&RamDisk::anonymous(64 * 1024).unwrap_or_else(|e| panic!("{e}")));
    }

    fn round_trip(d: &RamDisk) {
        let data: Vec<u8> = (0..12_288u32).map(|i| (i * 7 + 3) as u8).collect();
        d.write(4096 - 512, &data);
        let mut back = vec![0u8; data.len()];
        d.read(4096 - 512, &mut back);
        assert_eq!(back, data);
        // zero a range that covers a whole page and two partial ones
        d.zero(4096 - 256, 8192 + 512);
        d.read(4096 - 512, &mut back);
        assert_eq!(&back[..256], &data[..256]);
        assert!(back[256..256 + 8192 + 512].iter().all(|&b| b == 0));
        assert_eq!(&back[256 + 8192 + 512..], &data[256 + 8192 + 512..]);
    }

    #[test]
    fn read_append_appends_exactly_the_bytes() {
        let d = RamDisk::new(8192).unwrap_or_else(|e| panic!("{e}"));
        let data: Vec<u8> = (0..4096u32).map(|i| (i * 31 + 7) as u8).collect();
        d.write(4096, &data);
        let mut out = b"header".to_vec();
        d.read_append(4096, 4096, &mut out);
        assert_eq!(&out[..6], b"header");
        assert_eq!(&out[6..], &data[..]);
    }

    #[test]
    fn zeroing_inside_huge_pages_keeps_the_rest() {
        // 2 MiB-aligned regions may be transparent huge pages: MADV_DONTNEED on part of
        // one splits it, and only the zeroed range may change.
        const MIB: u64 = 1 << 20;
        let d = RamDisk::new(8 * MIB).unwrap_or_else(|e| panic!("{e}"));
        let data: Vec<u8> = (0..4 * MIB).map(|i| (i % 251) as u8).collect();
        d.write(MIB, &data);
        let (zoff, zlen) = (2 * MIB - 4096 + 512, 2 * MIB + 8192);
        d.zero(zoff, zlen);
        let mut back = vec![0u8; data.len()];
        d.read(MIB, &mut back);
        for (i, (&b, &w)) in back.iter().zip(&data).enumerate() {
            let off = MIB + i as u64;
            let want = if (zoff..zoff + zlen).contains(&off) { 0 } else { w };
            assert_eq!(b, want, "byte at {off}");
        }
    }

    /// Dropping a disk mid-fill does not wait for the filling thread (it may be a reactor
    /// that drops it), and the thread lets the memory go when it stops.
    #[test]
    fn a_disk_dropped_while_populating_is_unmapped_by_the_thread() {
        let d = RamDisk::populated(1 << 30).unwrap_or_else(|e| panic!("{e}"));
        let map = Arc::downgrade(&d.map);
        drop(d);
        let t0 = std::time::Instant::now();
        while map.upgrade().is_some() {
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(10),
                "the mapping is never let go"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    #[test]
    fn fresh_memory_reads_as_zero() {
        let d = RamDisk::new(1 << 30).unwrap_or_else(|e| panic!("{e}"));
        let mut b = vec![1u8; 4096];
        d.read((1 << 30) - 4096, &mut b);
        assert!(b.iter().all(|&x| x == 0));
    }

    /// Bytes `i` of a test pattern over a disk (`seed` tells two patterns apart).
    pub(crate) fn pattern(len: usize, seed: u32) -> Vec<u8> {
        (0..len as u32)
            .map(|i| (i.wrapping_mul(31).wrapping_add(seed) % 251) as u8)
            .collect()
    }

    /// A disk adopted from a duplicate of `d`'s memfd, as the next process of a hot upgrade
    /// adopts it.
    pub(crate) fn adopted(d: &RamDisk) -> RamDisk {
        let fd = d
            .memfd()
            .unwrap_or_else(|| panic!("a RAM disk has a memfd"))
            .try_clone_to_owned()
            .unwrap_or_else(|e| panic!("{e}"));
        RamDisk::adopt(fd, d.len()).unwrap_or_else(|e| panic!("{e}"))
    }

    pub(crate) fn contents(d: &RamDisk) -> Vec<u8> {
        let mut b = vec![0u8; d.len() as usize];
        d.read(0, &mut b);
        b
    }

    /// A second disk over a duplicate of the first's memfd (what the hot upgrade hands the
    /// next process) shows what the first wrote, and the first what it writes; after the
    /// first is gone (its mapping unmapped, its descriptor closed) the data is still there.
    #[test]
    fn an_adopted_disk_shares_the_first_ones_data_and_keeps_it() {
        const LEN: u64 = 4 << 20;
        let a = RamDisk::new(LEN).unwrap_or_else(|e| panic!("{e}"));
        let data = pattern(LEN as usize, 7);
        a.write(0, &data);
        let mut b = adopted(&a);
        b.wait_populated(); // nothing to wait for: an adopted disk is not filled
        assert!(contents(&b) == data, "the adopted disk reads what the first wrote");
        assert_ne!(a.base, b.base, "two mappings");
        // Writes either way are seen by the other mapping at once.
        let later = pattern(8192, 99);
        b.write(LEN - 8192 - 100, &later);
        let mut back = vec![0u8; later.len()];
        a.read(LEN - 8192 - 100, &mut back);
        assert_eq!(back, later);
        a.write(4096, &later[..512]);
        b.read(4096, &mut back[..512]);
        assert_eq!(&back[..512], &later[..512]);
        let mut want = data;
        want[LEN as usize - 8192 - 100..LEN as usize - 100].copy_from_slice(&later);
        want[4096..4096 + 512].copy_from_slice(&later[..512]);
        drop(a);
        assert!(contents(&b) == want, "the data outlives the disk that wrote it");
        // And so on down a chain of processes: adopted from an adopted disk.
        let c = adopted(&b);
        drop(b);
        assert!(contents(&c) == want);
    }

    /// Deallocated ranges read as zeroes in both mappings of a memfd, whichever zeroes them:
    /// whole pages are punched out of the memfd (MADV_DONTNEED would only have dropped one
    /// mapping's view of them, the data staying in the file), partial pages written with
    /// zeroes; nothing outside the range changes.
    #[test]
    fn zeroed_ranges_read_as_zeroes_in_every_mapping() {
        const LEN: u64 = 4 << 20;
        let a = RamDisk::new(LEN).unwrap_or_else(|e| panic!("{e}"));
        let b = adopted(&a);
        let mut want = pattern(LEN as usize, 3);
        a.write(0, &want);
        // (disk that zeroes, offset, length): whole pages, a page's middle, a range from the
        // middle of one page to the middle of another, a 2 MiB-aligned 2 MiB, the very end.
        let ranges: [(&RamDisk, u64, u64); 5] = [
            (&a, 8 * PAGE, 4 * PAGE),
            (&b, 20 * PAGE + 100, 1000),
            (&b, 30 * PAGE + 512, 5 * PAGE + 1024),
            (&a, 2 << 20, 2 << 20),
            (&b, LEN - PAGE - 8, PAGE + 8),
        ];
        let allocated = || {
            let st =
                nix::sys::stat::fstat(a.memfd().unwrap_or_else(|| panic!("memfd"))).unwrap_or_else(|e| panic!("{e}"));
            st.st_blocks as u64 * 512
        };
        for (d, off, len) in ranges {
            let before = allocated();
            d.zero(off, len);
            // The whole pages went back to the kernel (until read: a read fault on a hole
            // of a shared memfd commits a page of zeroes).
            let whole = ((off + len) / PAGE).saturating_sub(off.div_ceil(PAGE)) * PAGE;
            assert!(
                allocated() + whole <= before,
                "zeroing {len} bytes at {off}: {before} bytes allocated before, {} after",
                allocated()
            );
            want[off as usize..(off + len) as usize].fill(0);
            for (who, m) in [("first", &a), ("adopted", &b)] {
                let got = contents(m);
                if let Some(i) = (0..want.len()).find(|&i| got[i] != want[i]) {
                    panic!(
                        "after zeroing {len} bytes at {off}: the {who} disk's byte at {i} is {}, not {}",
                        got[i], want[i]
                    );
                }
            }
        }
    }

    #[test]
    fn adopting_a_memfd_of_another_size_is_an_error() {
        let a = RamDisk::new(1 << 20).unwrap_or_else(|e| panic!("{e}"));
        let dup = || {
            a.memfd()
                .unwrap_or_else(|| panic!("memfd"))
                .try_clone_to_owned()
                .unwrap_or_else(|e| panic!("{e}"))
        };
        for len in [(1 << 20) - 4096, (1 << 20) + 8, 2 << 20] {
            match RamDisk::adopt(dup(), len) {
                Err(StoreError::RamAdoptSize { expected, found }) => {
                    assert_eq!((expected, found), (len, 1 << 20));
                }
                other => panic!("adopting 1 MiB as {len} bytes: {other:?}"),
            }
        }
        // Not a size a disk can have at all.
        assert!(matches!(RamDisk::adopt(dup(), 0), Err(StoreError::Ram { .. })));
        // And the error says what happened.
        let e = RamDisk::adopt(dup(), 4096).err().map(|e| e.to_string());
        assert_eq!(
            e.as_deref(),
            Some("the RAM handed over holds 1048576 bytes, the namespace adopting it has 4096: not adopted")
        );
    }

    /// The memfd cannot be resized (by the next process, say): a mapping past a shrunk end
    /// would fault with SIGBUS.
    #[test]
    fn the_memfd_is_sealed_against_resizing() {
        let a = RamDisk::new(1 << 20).unwrap_or_else(|e| panic!("{e}"));
        let fd = a.memfd().unwrap_or_else(|| panic!("memfd"));
        assert!(nix::unistd::ftruncate(fd, 4096).is_err());
        assert!(nix::unistd::ftruncate(fd, 2 << 20).is_err());
        assert!(
            RamDisk::anonymous(4096)
                .unwrap_or_else(|e| panic!("{e}"))
                .memfd()
                .is_none()
        );
    }
}
