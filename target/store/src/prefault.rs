//! The prefault service: a few threads, shared by every RAM disk of the process, that
//! commit a disk's memory ahead of its first writes ([`crate::RamDisk::populated`]), a huge
//! page at a time and at the lowest priority, making each 2 MiB of a memfd one transparent
//! huge page where the system allows. Why ahead of time: the first write into each 2 MiB
//! huge page stalled the reactor for 4.3-4.6 ms while the kernel zeroed it; why a few
//! threads for every disk and not one per disk, and why the lowest priority on any core:
//! see [`Fillers`] and [`give_way`].

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, PoisonError};

use crate::region::{HUGE, Mapping, PAGE};

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
        at.checked_add(HUGE).is_some_and(|end| end <= map.len()),
        "collapse out of bounds"
    );
    // SAFETY: `[at, at + HUGE)` is inside `map` (checked above), which stays mapped while
    // it is borrowed; MADV_COLLAPSE changes no content.
    let p = unsafe { map.base().as_ptr().add(at as usize) };
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
        at.checked_add(n).is_some_and(|end| end <= map.len()),
        "populate out of bounds"
    );
    // SAFETY: `[at, at + n)` is inside `map` (checked above), which stays mapped while it
    // is borrowed.
    let p = unsafe { map.base().as_ptr().add(at as usize) };
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
    let (base, len) = (map.base().as_ptr() as u64, map.len());
    let mut huge = map.is_memfd() && collapse_allowed();
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

/// Whether a disk's fill is over (done, stopped or given up), for
/// [`RamDisk::wait_populated`](crate::RamDisk::wait_populated).
#[derive(Debug, Default)]
pub(crate) struct Filled {
    over: Mutex<bool>,
    cv: Condvar,
}

impl Filled {
    fn set(&self) {
        *self.over.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.cv.notify_all();
    }

    /// Wait until the fill is over.
    pub(crate) fn wait(&self) {
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

/// Commit `map` in the background (see [`populate`]) until done or `stop`: queued for a
/// filler. The fill is over (done, stopped or given up) when the returned [`Filled`] says
/// so. Err: no filler runs and none could be started.
pub(crate) fn start(map: Arc<Mapping>, stop: Arc<AtomicBool>) -> std::io::Result<Arc<Filled>> {
    let filled = Arc::new(Filled::default());
    enqueue(FillJob {
        map,
        stop,
        filled: filled.clone(),
    })?;
    Ok(filled)
}

#[cfg(test)]
mod tests {
    use std::ptr::NonNull;

    use super::*;
    use crate::RamDisk;
    use crate::region::tests::{adopted, contents, pattern};

    /// Where the disk's mapping starts.
    fn base(d: &RamDisk) -> NonNull<u8> {
        d.range_ptr(0, 0)
    }

    #[test]
    fn a_populated_disk_is_resident_and_reads_as_zero() {
        let len = 8u64 << 20;
        let mut d = RamDisk::populated(len).unwrap_or_else(|e| panic!("{e}"));
        d.wait_populated();
        let pages = (len / PAGE) as usize;
        let mut vec = vec![0u8; pages];
        // SAFETY: mincore over the disk's own mapping, one status byte per page into `vec`.
        let rc = unsafe { libc::mincore(base(&d).as_ptr().cast(), len as usize, vec.as_mut_ptr()) };
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
            assert_eq!(base(d).as_ptr() as u64 % HUGE, 0, "{:?} is not 2 MiB-aligned", base(d));
        }
        let data = pattern(LEN as usize, 5);
        a.write(0, &data);
        assert!(contents(&b) == data);
        let shmem = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/shmem_enabled").unwrap_or_default();
        if collapse_allowed() && has_collapse() && !shmem.contains("[deny]") {
            for (who, d) in [("first", &a), ("adopted", &b)] {
                assert_eq!(pmd_mapped_kib(base(d)), 8 * 1024, "the {who} mapping's huge pages");
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
