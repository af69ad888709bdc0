//! The RAM backend: a memfd, mapped shared, reached by every reactor.
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

use std::any::Any;
use std::collections::VecDeque;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, PoisonError};

use pollux_nvme::spec::Status;
use vm_memory::VolatileSlice;

use super::stripes::Stripes;
use super::{Backend, BlockOp, Caps, Channel, ChannelEnv, ChannelNs, WriteData};
use crate::error::StoreError;

const PAGE: u64 = 4096;

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

/// The disk's memory, one mapping, unmapped (and its memfd closed) when its last holder
/// goes: the disk, or its fill job (queued, or with a filler). So dropping a disk (which
/// may happen on a reactor, with the last reference to a removed namespace) never waits
/// for a filler.
#[derive(Debug)]
struct Mapping {
    base: NonNull<u8>,
    len: u64,
    /// The memfd the mapping shows (MAP_SHARED); None for the anonymous private mapping of
    /// [`RamDisk::anonymous`]. Closed after the unmap (fields drop after `Drop::drop`).
    fd: Option<OwnedFd>,
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

/// Make the calling (populating) thread give way to everything else: the lowest priority
/// there is, on any core the process may use.
///
/// Why the lowest priority: filling a 3 GiB namespace is seconds of CPU in the kernel
/// (zeroing each huge page), and a thread of normal priority on a reactor's core took its
/// share of it: connects timed out waiting for ICResp under load and the reactor logged
/// 11-22 ms stalls on a quiet machine. At SCHED_IDLE any reactor preempts it on wake-up and
/// leaves it only the time the core would be idle.
///
/// Why any core, the reactors' included: the thread holds the process's mmap lock while it
/// faults a huge page in, and a reactor that faults behind a waiting mmap writer (an
/// allocation, a thread start) waits for that lock. Kept off the reactors' cores (as it
/// once was), the fill could only run on the other cores; where those were busy (a client
/// polling on the same machine) SCHED_IDLE left it almost no time there, and the blocked
/// reactor's own core sat idle: one reactor callback waited 5,025 ms with the fill half
/// done (`pollux perf` QD32 4K reads on a 256 MiB namespace, 1 run in 8). Allowed on the
/// reactor's core, it runs the moment the reactor blocks and lets the lock go.
fn give_way() {
    if let Err(e) = pollux_reactor::sys::lowest_priority_current_thread() {
        tracing::debug!(error = %e, "RAM disk populate: cannot lower its priority");
    }
}

/// A huge page: the unit of [`populate`] and of [`collapse`], and the alignment of a memfd
/// mapping of at least this size ([`map_shared`]).
const HUGE: u64 = 2 << 20;

/// madvise(2) MADV_COLLAPSE (Linux 6.1, include/uapi/asm-generic/mman-common.h), not in
/// every libc crate target.
const MADV_COLLAPSE: libc::c_int = 25;

/// Whether the filler makes a memfd's pages huge ([`collapse`]): wherever the system allows
/// transparent huge pages at all (/sys/kernel/mm/transparent_hugepage/enabled not "never"),
/// the setting under which the anonymous mapping had them with MADV_HUGEPAGE.
fn collapse_allowed() -> bool {
    static ALLOWED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ALLOWED.get_or_init(|| {
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").is_ok_and(|s| !s.contains("[never]"))
    })
}

/// Make the 2 MiB at `p` one transparent huge page, mapped by one page table entry:
/// MADV_COLLAPSE copies the small pages there are into a huge page (zeroes where there are
/// none) and maps it, the data unchanged (concurrent accesses wait on the pages' locks for
/// the copy, as they do for khugepaged).
///
/// Why: a memfd's memory is shmem, whose huge pages follow
/// /sys/kernel/mm/transparent_hugepage/shmem_enabled, "never" by default (and on the
/// machine this was written on, where MADV_HUGEPAGE on the memfd then does nothing), so the
/// disk would be in 4 KiB pages where the anonymous mapping before it had 2 MiB ones: a
/// random 4 KiB copy out of 256 MiB took 662 instead of 473 ns (a TLB miss and a page walk,
/// two-dimensional in a VM, per command). MADV_COLLAPSE works whatever shmem_enabled says
/// (but "deny"), as khugepaged would, and with it the same copy took 468 ns. Huge pages live
/// in the memfd: the next process (hot upgrade) maps them huge too (its mapping is aligned).
fn collapse(map: &Mapping, at: u64) -> std::io::Result<()> {
    assert!(
        at.checked_add(HUGE).is_some_and(|end| end <= map.len),
        "collapse out of bounds"
    );
    // SAFETY: `[at, at + HUGE)` is inside `map` (checked above), which stays mapped while
    // it is borrowed; MADV_COLLAPSE changes no content.
    let p = unsafe { map.base.as_ptr().add(at as usize) };
    // SAFETY: as above.
    if unsafe { libc::madvise(p.cast(), HUGE as usize, MADV_COLLAPSE) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Fault `[at, at + n)` of `map` in writable (MADV_POPULATE_WRITE), committing its pages.
fn populate_range(map: &Mapping, at: u64, n: u64) -> std::io::Result<()> {
    assert!(
        at.checked_add(n).is_some_and(|end| end <= map.len),
        "populate out of bounds"
    );
    // SAFETY: `[at, at + n)` is inside `map` (checked above), which stays mapped while it
    // is borrowed.
    let p = unsafe { map.base.as_ptr().add(at as usize) };
    // SAFETY: as above; MADV_POPULATE_WRITE only faults the pages in writable, it changes
    // no content.
    if unsafe { libc::madvise(p.cast(), n as usize, libc::MADV_POPULATE_WRITE) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Commit the mapping a huge page at a time until done or `stop`: MADV_POPULATE_WRITE holds
/// the process's mmap lock while it faults a range in, so one call per huge page (the least
/// a fault commits with THP) lets a reactor's own mmap or munmap in between.
///
/// Each whole, aligned 2 MiB of a memfd is made one huge page where allowed ([`collapse`]):
/// its first page is committed, and MADV_COLLAPSE makes the 2 MiB one huge page, zeroes
/// where nothing was written (it refuses a range of holes only). Committing all 512 small
/// pages first, only for the collapse to copy and free them, took 4-10 times as long (256
/// MiB: 214-243 instead of 17-65 ms on a quiet machine). Where the kernel refuses a
/// collapse the rest of the 2 MiB is committed in small pages; after EINVAL (no
/// MADV_COLLAPSE, or shmem_enabled "deny") or 16 refusals the filler stops trying, with a
/// debug line. Returns the bytes committed.
fn populate(map: &Mapping, stop: &AtomicBool) -> u64 {
    let (base, len) = (map.base.as_ptr() as u64, map.len);
    let mut huge = map.fd.is_some() && collapse_allowed();
    let (mut at, mut refused) = (0, 0u32);
    while at < len && !stop.load(Relaxed) {
        let n = HUGE.min(len - at);
        let whole = huge && n == HUGE && (base + at).is_multiple_of(HUGE);
        let mut done = populate_range(map, at, if whole { PAGE } else { n });
        if whole
            && done.is_ok()
            && let Err(e) = collapse(map, at)
        {
            refused += 1;
            if e.raw_os_error() == Some(libc::EINVAL) || refused >= 16 {
                tracing::debug!(
                    bytes = len,
                    at,
                    refused,
                    error = %e,
                    "RAM disk: no more huge pages (MADV_COLLAPSE: EINVAL before Linux 6.1 or with shmem_enabled \"deny\", EAGAIN/ENOMEM without a free huge page); the rest is in 4 KiB pages"
                );
                huge = false;
            }
            done = populate_range(map, at + PAGE, n - PAGE);
        }
        if let Err(e) = done {
            tracing::warn!(
                bytes = len,
                populated = at,
                error = %e,
                "RAM disk not populated: its other pages are committed on first write (a reactor stall per page)"
            );
            return at;
        }
        at += n;
    }
    at
}

/// Whether a disk's fill is over (done, stopped or given up), for [`RamDisk::wait_populated`].
#[derive(Debug, Default)]
struct Filled {
    over: Mutex<bool>,
    cv: Condvar,
}

impl Filled {
    fn set(&self) {
        *self.over.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.cv.notify_all();
    }

    fn wait(&self) {
        let mut over = self.over.lock().unwrap_or_else(PoisonError::into_inner);
        while !*over {
            over = self.cv.wait(over).unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// A disk waiting for a filler, or being filled. It holds the mapping, so that a disk
/// dropped meanwhile is unmapped by whoever lets the job go; the fill is over when it goes.
struct FillJob {
    map: Arc<Mapping>,
    stop: Arc<AtomicBool>,
    filled: Arc<Filled>,
}

impl Drop for FillJob {
    fn drop(&mut self) {
        self.filled.set();
    }
}

/// The disks waiting to be filled and the number of fillers at work: a few threads fill
/// every RAM disk of the process, not one thread per disk. A thread per disk cost a thread
/// start, a stack and a log line per namespace: most of the 2.6 s a target with 16,384
/// small RAM namespaces took to start. Disks are filled in the order they were made, by
/// at most [`max_fillers`] threads at once, which end when none has come for [`LINGER`].
struct Fillers {
    queue: VecDeque<FillJob>,
    /// Fillers started and not ended.
    running: usize,
    /// Of those, the ones waiting for a disk.
    waiting: usize,
}

static FILLERS: Mutex<Fillers> = Mutex::new(Fillers {
    queue: VecDeque::new(),
    running: 0,
    waiting: 0,
});

/// Wakes a waiting filler when a disk is queued.
static QUEUED: Condvar = Condvar::new();

/// How long a filler waits for another disk before it ends: a target opening thousands of
/// small namespaces makes them more slowly than a filler fills them, and a filler ending at
/// every gap was started again for the next disk.
const LINGER: std::time::Duration = std::time::Duration::from_millis(200);

/// Fillers at once: one per core the process may use (each takes only the time its core
/// would leave idle, see [`give_way`]), so that large disks still fill in parallel.
fn max_fillers() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

/// Queue `job`, and start a filler if fewer than [`max_fillers`] run. Err: no filler runs
/// and none could be started (the job is dropped: its fill is over).
fn enqueue(job: FillJob) -> std::io::Result<()> {
    let mut f = FILLERS.lock().unwrap_or_else(PoisonError::into_inner);
    f.queue.push_back(job);
    if f.waiting > 0 {
        QUEUED.notify_one();
        return Ok(());
    }
    if f.running >= max_fillers() {
        return Ok(());
    }
    match std::thread::Builder::new()
        .name("pollux-ram-populate".into())
        .spawn(filler)
    {
        Ok(_) => {
            f.running += 1;
            Ok(())
        }
        Err(e) if f.running > 0 => {
            tracing::debug!(error = %e, "RAM disk populate: no more fillers; those running fill this disk too");
            Ok(())
        }
        Err(e) => {
            f.queue.pop_back();
            Err(e)
        }
    }
}

/// The next disk to fill, waiting up to [`LINGER`] for one; None: the filler ends (and is
/// no longer counted as running).
fn next_job() -> Option<FillJob> {
    let mut f = FILLERS.lock().unwrap_or_else(PoisonError::into_inner);
    if f.queue.is_empty() {
        f.waiting += 1;
        let deadline = std::time::Instant::now() + LINGER;
        while f.queue.is_empty() {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            f = QUEUED.wait_timeout(f, left).unwrap_or_else(PoisonError::into_inner).0;
        }
        f.waiting -= 1;
    }
    let job = f.queue.pop_front();
    if job.is_none() {
        f.running -= 1;
    }
    job
}

/// One filler: fills queued disks until none comes, then logs what it did (one line for
/// however many disks).
fn filler() {
    give_way();
    let (mut disks, mut bytes, mut busy) = (0u64, 0u64, std::time::Duration::ZERO);
    while let Some(job) = next_job() {
        let t0 = std::time::Instant::now();
        let at = populate(&job.map, &job.stop);
        tracing::debug!(bytes = at, ms = t0.elapsed().as_millis() as u64, "RAM disk populated");
        busy += t0.elapsed();
        disks += 1;
        bytes += at;
    }
    if disks > 0 {
        tracing::info!(disks, bytes, ms = busy.as_millis() as u64, "RAM disks populated");
    }
}

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
/// not an error, and the filler makes the pages huge after committing them ([`collapse`]).
fn advise_huge(p: *mut libc::c_void, len: u64) {
    // SAFETY: advice on a mapping this module just made; it changes no content.
    if unsafe { libc::madvise(p, len as usize, libc::MADV_HUGEPAGE) } != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "RAM disk: no transparent huge pages");
    }
}

/// Map `len` bytes of `fd` shared, read-write; from a 2 MiB-aligned address when the disk
/// has 2 MiB or more, so that each 2 MiB of the memfd can be one huge page mapped by one
/// page table entry ([`collapse`]): the kernel aligns a shared memfd mapping itself only
/// where shmem THP is enabled. The alignment costs a reservation of 2 MiB more address
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
    /// the kernel zeroed it. A filler thread (a few fill every disk, [`Fillers`]) walks the
    /// disk a huge page at a time with MADV_POPULATE_WRITE, which faults pages in without
    /// changing their content, and MADV_COLLAPSE, which makes each 2 MiB one huge page
    /// without changing its content ([`populate`]), so I/O meanwhile stays correct (a write
    /// that reaches a page first takes its fault as before; one into a 2 MiB being collapsed
    /// waits for the copy). The memory is resident from then on. Where the kernel cannot populate
    /// (before Linux 5.14, or short of memory) the rest stays lazily committed, with a
    /// warning. The fillers run at the lowest priority ([`give_way`]): filling never
    /// delays a reactor.
    pub fn populated(len: u64) -> std::io::Result<Self> {
        let mut d = Self::new(len)?;
        let filled = Arc::new(Filled::default());
        enqueue(FillJob {
            map: d.map.clone(),
            stop: d.stop.clone(),
            filled: filled.clone(),
        })?;
        d.populating = Some(filled);
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

impl RamDisk {
    /// Apply a write-side operation to the memory (a RAM namespace inline, a simulated SSD
    /// at submission: its data is visible at once, its completion comes later). Reads and
    /// flushes change nothing: a read's data is sent from the memory, and there is no
    /// volatile cache to flush.
    #[inline]
    pub fn apply(&self, op: &BlockOp<'_>) -> Status {
        match op {
            BlockOp::Write {
                off,
                data: WriteData::Bytes(b),
                ..
            } => self.write(*off, b),
            // DMA buffers come from NVMe channels only.
            BlockOp::Write { .. } => return Status::INTERNAL_ERROR,
            BlockOp::WriteZeroes { off, len } => self.zero(*off, *len),
            BlockOp::Deallocate { ranges } => ranges.iter().for_each(|&(off, len)| self.zero(off, len)),
            BlockOp::Read { .. } | BlockOp::Flush => {}
            // No copy offload (Caps::copy_offload): a Copy is read and written through pollux.
            BlockOp::Copy { .. } | BlockOp::CompareAndWrite { .. } => return Status::INTERNAL_ERROR,
        }
        Status::SUCCESS
    }
}

/// A RAM namespace: every command completes inline, on the reactor that received it.
impl Backend for RamDisk {
    fn kind(&self) -> &'static str {
        "ram"
    }

    fn len(&self) -> u64 {
        self.len
    }

    fn io_path(&self) -> &'static str {
        "inline"
    }

    fn memory(&self) -> Option<&RamDisk> {
        Some(self)
    }

    fn caps(&self) -> Caps {
        Caps {
            inline_reads: true,
            ..Caps::default()
        }
    }

    fn run_inline(&self, op: &BlockOp<'_>) -> Option<Status> {
        Some(self.apply(op))
    }

    fn open_channel(&self, ns: ChannelNs, env: &ChannelEnv) -> Result<Box<dyn Channel>, StoreError> {
        Err(StoreError::Channel {
            nsid: ns.nsid,
            reactor: env.reactor,
            reason: "a RAM namespace completes inline and has no channel".into(),
        })
    }

    fn as_any(&self) -> &dyn Any {
        self
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
mod tests {
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

    #[test]
    fn a_populated_disk_is_resident_and_reads_as_zero() {
        let len = 8u64 << 20;
        let mut d = RamDisk::populated(len).unwrap_or_else(|e| panic!("{e}"));
        d.wait_populated();
        let pages = (len / PAGE) as usize;
        let mut vec = vec![0u8; pages];
        // SAFETY: mincore over the disk's own mapping, one status byte per page into `vec`.
        let rc = unsafe { libc::mincore(d.base.as_ptr().cast(), len as usize, vec.as_mut_ptr()) };
        assert_eq!(rc, 0);
        assert!(
            vec.iter().all(|&v| v & 1 == 1),
            "every page is resident before any write"
        );
        let mut b = vec![1u8; 4096];
        d.read(len - 4096, &mut b);
        assert!(b.iter().all(|&x| x == 0));
    }

    /// The populating threads of this process, by their (truncated) name.
    fn populating_threads() -> Vec<libc::pid_t> {
        let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
            return Vec::new();
        };
        tasks
            .filter_map(|t| {
                let t = t.ok()?;
                let comm = std::fs::read_to_string(t.path().join("comm")).ok()?;
                (comm.trim_end() == "pollux-ram-popu").then(|| t.file_name().to_str()?.parse().ok())?
            })
            .collect()
    }

    fn cores_of(tid: libc::pid_t) -> Vec<usize> {
        // SAFETY: all-zero is a valid empty cpu_set_t.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is a valid, writable cpu_set_t of the size passed.
        let rc = unsafe { libc::sched_getaffinity(tid, size_of::<libc::cpu_set_t>(), &mut set) };
        if rc != 0 {
            return Vec::new(); // the thread is gone
        }
        // SAFETY: CPU_ISSET reads bit `c` of a valid set; c < CPU_SETSIZE.
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
            .collect()
    }

    /// Defects: the thread filling a RAM disk ran at normal priority wherever the scheduler
    /// put it, a reactor's core included, and took its share of that core (connects timed
    /// out and reactors stalled 11-22 ms while a 3 GiB namespace filled); then, kept off the
    /// reactors' cores, it could starve on busy other cores while holding the mmap lock a
    /// reactor waited for (a 5 s stall). It runs SCHED_IDLE on every core the process may use.
    #[test]
    fn the_populating_thread_gives_way_to_the_reactors_on_any_core() {
        let allowed = pollux_reactor::sys::allowed_cores().unwrap_or_else(|e| panic!("{e}"));
        let d = RamDisk::populated(1 << 30).unwrap_or_else(|e| panic!("{e}"));
        let t0 = std::time::Instant::now();
        let mut seen: Vec<(libc::pid_t, i32, Vec<usize>)>;
        let gave_way = loop {
            let threads = populating_threads();
            seen = threads
                .iter()
                // SAFETY: sched_getscheduler reads a thread's policy; -1 if it is gone.
                .map(|&tid| (tid, unsafe { libc::sched_getscheduler(tid) }, cores_of(tid)))
                .collect();
            if !seen.is_empty()
                && seen
                    .iter()
                    .all(|(_, policy, cores)| *policy == libc::SCHED_IDLE && *cores == allowed)
            {
                break true;
            }
            if t0.elapsed() > std::time::Duration::from_secs(5) {
                break false;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        };
        drop(d);
        assert!(
            gave_way,
            "populating threads (tid, policy, cores) {seen:?}: SCHED_IDLE ({}) on cores {allowed:?} expected",
            libc::SCHED_IDLE
        );
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
    fn pattern(len: usize, seed: u32) -> Vec<u8> {
        (0..len as u32)
            .map(|i| (i.wrapping_mul(31).wrapping_add(seed) % 251) as u8)
            .collect()
    }

    /// A disk adopted from a duplicate of `d`'s memfd, as the next process of a hot upgrade
    /// adopts it.
    fn adopted(d: &RamDisk) -> RamDisk {
        let fd = d
            .memfd()
            .unwrap_or_else(|| panic!("a RAM disk has a memfd"))
            .try_clone_to_owned()
            .unwrap_or_else(|e| panic!("{e}"));
        RamDisk::adopt(fd, d.len()).unwrap_or_else(|e| panic!("{e}"))
    }

    fn contents(d: &RamDisk) -> Vec<u8> {
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

    /// ShmemPmdMapped of the mapping that starts at `base`, in KiB (/proc/self/smaps).
    fn pmd_mapped_kib(base: NonNull<u8>) -> u64 {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap_or_else(|e| panic!("{e}"));
        let start = format!("{:x}-", base.as_ptr() as usize);
        let mut lines = smaps.lines().skip_while(|l| !l.starts_with(&start)).skip(1);
        lines
            .find_map(|l| l.strip_prefix("ShmemPmdMapped:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("no mapping at {base:?} in /proc/self/smaps"))
    }

    /// Linux 6.1 or later (MADV_COLLAPSE).
    fn has_collapse() -> bool {
        let r = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let mut v = r.split(['.', '-']).map(|x| x.parse::<u32>().unwrap_or(0));
        (v.next().unwrap_or(0), v.next().unwrap_or(0)) >= (6, 1)
    }

    /// A disk of 2 MiB or more is mapped from a 2 MiB boundary, in this process and in the
    /// one that adopts its memfd. Where THP is allowed, a populated disk's whole 2 MiB are
    /// huge pages once filled (MADV_COLLAPSE, whatever shmem_enabled says but "deny"), which
    /// an adopted mapping maps huge too; and zeroing inside huge pages changes only the range
    /// zeroed, in both mappings.
    #[test]
    fn a_populated_disk_is_in_huge_pages_and_zeroes_inside_them() {
        const MIB: u64 = 1 << 20;
        const LEN: u64 = 8 * MIB + 4096;
        let mut a = RamDisk::populated(LEN).unwrap_or_else(|e| panic!("{e}"));
        a.wait_populated();
        let b = adopted(&a);
        for d in [&a, &b] {
            assert_eq!(d.base.as_ptr() as u64 % HUGE, 0, "{:?} is not 2 MiB-aligned", d.base);
        }
        let data = pattern(LEN as usize, 5);
        a.write(0, &data);
        assert!(contents(&b) == data);
        let shmem = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/shmem_enabled").unwrap_or_default();
        if collapse_allowed() && has_collapse() && !shmem.contains("[deny]") {
            for (who, d) in [("first", &a), ("adopted", &b)] {
                assert_eq!(pmd_mapped_kib(d.base), 8 * 1024, "the {who} mapping's huge pages");
            }
        }
        // Deallocate across a huge page boundary: a partial page, whole pages on both sides
        // of the boundary, a partial page.
        let (zoff, zlen) = (2 * MIB - 4096 + 512, 2 * MIB + 8192);
        b.zero(zoff, zlen);
        let mut want = data;
        want[zoff as usize..(zoff + zlen) as usize].fill(0);
        for (who, d) in [("first", &a), ("adopted", &b)] {
            let got = contents(d);
            if let Some(i) = (0..want.len()).find(|&i| got[i] != want[i]) {
                panic!("the {who} disk's byte at {i} is {}, not {}", got[i], want[i]);
            }
        }
    }

    /// Writes that land while the filler commits the disk and collapses it into huge pages
    /// (copying the pages written so far, zero-filling the rest) are all kept, and the
    /// pages never written read as zeroes.
    #[test]
    fn writes_during_the_fill_are_kept() {
        const LEN: u64 = 64 << 20;
        let mut d = RamDisk::populated(LEN).unwrap_or_else(|e| panic!("{e}"));
        let mut want = vec![0u8; LEN as usize];
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for i in 0..20_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // 512-byte writes anywhere, some straddling pages and 2 MiB boundaries.
            let off = x % (LEN - 512) / 8 * 8;
            let data = pattern(512, i);
            d.write(off, &data);
            want[off as usize..off as usize + 512].copy_from_slice(&data);
        }
        d.wait_populated();
        let got = contents(&d);
        if let Some(i) = (0..want.len()).find(|&i| got[i] != want[i]) {
            panic!("byte at {i} is {}, not {}", got[i], want[i]);
        }
    }
}
