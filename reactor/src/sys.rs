//! The few Linux system calls the reactor needs, each wrapped once with its safety argument.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// Cores this process may run on (sched_getaffinity).
pub fn allowed_cores() -> io::Result<Vec<usize>> {
    // SAFETY: cpu_set_t is a plain bitmask for which all-zero is a valid (empty) value.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, writable cpu_set_t of the size passed.
    let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let max = 8 * std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: CPU_ISSET reads bit `c` of a valid set; c < CPU_SETSIZE.
    Ok((0..max).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect())
}

/// Pin the calling thread to one core.
pub fn pin_current_thread(core: usize) -> io::Result<()> {
    if core >= 8 * std::mem::size_of::<libc::cpu_set_t>() {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: all-zero is a valid empty cpu_set_t.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: core < CPU_SETSIZE, checked above.
    unsafe { libc::CPU_SET(core, &mut set) };
    // SAFETY: `set` is a valid cpu_set_t of the size passed; pid 0 is the calling thread.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Let the calling thread run on `cores` only (sched_setaffinity); an empty list is refused.
pub fn confine_current_thread(cores: &[usize]) -> io::Result<()> {
    let max = 8 * std::mem::size_of::<libc::cpu_set_t>();
    if cores.is_empty() || cores.iter().any(|&c| c >= max) {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: all-zero is a valid empty cpu_set_t.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cores {
        // SAFETY: c < CPU_SETSIZE, checked above.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: `set` is a valid cpu_set_t of the size passed; pid 0 is the calling thread.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Run the calling thread at the lowest priority Linux has: SCHED_IDLE, which any other
/// thread preempts at once and which gets only what a core leaves unused (sched(7)), or
/// where that is refused, nice 19.
pub fn lowest_priority_current_thread() -> io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 is the calling thread (Linux schedules threads, not processes); `param`
    // is a valid sched_param, read only.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } == 0 {
        return Ok(());
    }
    // SAFETY: on Linux, PRIO_PROCESS with who = 0 is the calling thread; no memory touched.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 19) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// What [`reserve_fd_table`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FdReserve {
    /// The soft RLIMIT_NOFILE before.
    pub limit_before: u64,
    /// The soft RLIMIT_NOFILE now (raised towards the hard limit when it was below `want`).
    pub limit: u64,
    /// Descriptors the process's table holds now without growing (at least).
    pub table: u64,
}

/// Make room for `want` open descriptors ahead of time: raise the soft RLIMIT_NOFILE towards
/// the hard limit if it is lower, then make the kernel grow the process's descriptor table
/// to it once (a descriptor duplicated at the top, closed at once).
///
/// Why ahead of time: the kernel grows a process's descriptor table by doubling it as
/// descriptors are opened (`expand_fdtable`), and in a process of several threads each
/// growth waits for an RCU grace period (`synchronize_rcu`), milliseconds, on the thread
/// that opened the descriptor: the reactor accepting the connections of the first storm
/// (64 -> 128 -> ... -> 2048 for 1,000 connections), never again once the table is big.
pub fn reserve_fd_table(want: u64) -> io::Result<FdReserve> {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `rl` is a valid out pointer for getrlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let limit_before: u64 = rl.rlim_cur;
    if rl.rlim_cur < want && rl.rlim_cur != libc::RLIM_INFINITY {
        let raised = libc::rlimit {
            rlim_cur: want.min(rl.rlim_max),
            rlim_max: rl.rlim_max,
        };
        // SAFETY: `raised` is a valid rlimit, read only; the soft limit stays within the hard.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            rl = raised;
        }
    }
    let limit: u64 = rl.rlim_cur;
    // The highest descriptor the limit allows, at most `want`.
    let top = want.min(limit.saturating_sub(1)).min(i32::MAX as u64) as libc::c_int;
    // SAFETY: F_DUPFD duplicates descriptor 0 (or fails, e.g. if it is closed) to the lowest
    // free descriptor >= `top`; no memory of ours is touched.
    let fd = unsafe { libc::fcntl(0, libc::F_DUPFD_CLOEXEC, top) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just created by this function and is owned by nothing else.
    unsafe { libc::close(fd) };
    Ok(FdReserve {
        limit_before,
        limit,
        table: fd as u64 + 1,
    })
}

/// Set the calling thread's timer slack (the kernel's default 50 us would swamp microsecond sleeps).
pub fn set_timer_slack_ns(ns: u64) -> io::Result<()> {
    // SAFETY: PR_SET_TIMERSLACK takes an unsigned long by value and touches no memory of ours.
    let rc = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, ns as libc::c_ulong, 0, 0, 0) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The CPU-time clock of the calling thread, readable from any thread of the process.
pub fn current_thread_cpu_clock() -> io::Result<libc::clockid_t> {
    let mut id: libc::clockid_t = 0;
    // SAFETY: pthread_self() is always a valid thread; `id` is a valid out pointer.
    let rc = unsafe { libc::pthread_getcpuclockid(libc::pthread_self(), &mut id) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(id)
}

/// Read a clock in nanoseconds (0 if the clock is gone, e.g. the thread exited).
pub fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid out pointer; an invalid clock id only yields EINVAL.
    let rc = unsafe { libc::clock_gettime(clock, &mut ts) };
    if rc != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// CLOCK_MONOTONIC (the clock `Instant` reads) in nanoseconds. A loop that needs only
/// differences subtracts two of these (one instruction) instead of two `Instant`s (~25).
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// CPU time of the calling thread in nanoseconds.
pub fn thread_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// A non-blocking Linux eventfd used as a doorbell.
#[derive(Debug)]
pub struct EventFd(OwnedFd);

impl EventFd {
    /// Create a non-blocking, close-on-exec eventfd.
    pub fn new() -> io::Result<Self> {
        // SAFETY: eventfd takes plain integers; a non-negative return is a new fd we own.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by eventfd and is owned by nobody else.
        Ok(Self(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Add one to the counter (wakes an epoll waiting on it).
    pub fn notify(&self) -> io::Result<()> {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64 to our own fd.
        let rc = unsafe { libc::write(self.0.as_raw_fd(), (&one as *const u64).cast(), 8) };
        if rc == 8 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        // EAGAIN means the counter is saturated: a wake-up is pending anyway.
        if err.kind() == io::ErrorKind::WouldBlock {
            Ok(())
        } else {
            Err(err)
        }
    }

    /// Reset the counter; returns its value (0 if it was not signalled).
    pub fn drain(&self) -> u64 {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a valid u64 from our own fd.
        let rc = unsafe { libc::read(self.0.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
        if rc == 8 { v } else { 0 }
    }
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// A non-blocking CLOCK_MONOTONIC timerfd armed for one-shot relative deadlines with
/// nanosecond resolution (mio's own timeout rounds up to whole milliseconds).
#[derive(Debug)]
pub struct TimerFd {
    fd: OwnedFd,
    armed: bool,
}

impl TimerFd {
    /// Create a disarmed timer.
    pub fn new() -> io::Result<Self> {
        // SAFETY: plain integer arguments; a non-negative return is a new fd we own.
        let fd = unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_NONBLOCK | libc::TFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            // SAFETY: `fd` was just created and is owned by nobody else.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            armed: false,
        })
    }

    /// Arm to fire once after `after` (at least 1 ns: a zero value would disarm).
    pub fn arm(&mut self, after: Duration) -> io::Result<()> {
        let after = after.max(Duration::from_nanos(1));
        let spec = libc::itimerspec {
            it_interval: libc::timespec { tv_sec: 0, tv_nsec: 0 },
            it_value: libc::timespec {
                tv_sec: after.as_secs() as libc::time_t,
                tv_nsec: after.subsec_nanos() as libc::c_long,
            },
        };
        // SAFETY: `spec` is a valid itimerspec; a null old-value pointer is allowed.
        let rc = unsafe { libc::timerfd_settime(self.fd.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        self.armed = true;
        Ok(())
    }

    /// Disarm if armed.
    pub fn disarm(&mut self) -> io::Result<()> {
        if !self.armed {
            return Ok(());
        }
        // SAFETY: all-zero itimerspec disarms; valid pointer, null old value.
        let zero: libc::itimerspec = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let rc = unsafe { libc::timerfd_settime(self.fd.as_raw_fd(), 0, &zero, std::ptr::null_mut()) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        self.armed = false;
        Ok(())
    }

    /// Consume an expiry, if any. Returns whether the timer had fired.
    pub fn consume(&mut self) -> bool {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a valid u64 from our own fd.
        let rc = unsafe { libc::read(self.fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
        if rc == 8 {
            self.armed = false;
            true
        } else {
            false
        }
    }
}

impl AsRawFd for TimerFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Sleep with nanosleep for `d` (used by the wake-up benchmark for comparison).
pub fn nanosleep(d: Duration) {
    let ts = libc::timespec {
        tv_sec: d.as_secs() as libc::time_t,
        tv_nsec: d.subsec_nanos() as libc::c_long,
    };
    // SAFETY: valid timespec; a null remainder pointer is allowed.
    unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
}

/// epoll_pwait2 on a raw epoll fd with a nanosecond timeout; returns the number of events.
pub fn epoll_pwait2(epfd: RawFd, timeout: Duration) -> io::Result<usize> {
    let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 8];
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `evs` is a valid writable array of the length passed; `ts` valid; null sigmask.
    let n = unsafe { libc::epoll_pwait2(epfd, evs.as_mut_ptr(), evs.len() as i32, &ts, std::ptr::null()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The process's descriptor table size (FDSize of /proc/self/status).
    fn fd_table() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("FDSize:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }

    #[test]
    fn the_descriptor_table_is_grown_ahead_of_time() {
        let want = 3000;
        let r = reserve_fd_table(want).unwrap_or_else(|e| panic!("{e}"));
        assert!(r.limit >= r.limit_before);
        // The kernel grows tables in powers of two: at least `want` (or what the limit
        // allows), and the descriptor used for it is closed again.
        let expect = want.min(r.limit);
        assert!(fd_table() >= expect, "FDSize {} < {expect}", fd_table());
        assert!(r.table >= expect);
        // SAFETY: F_GETFD on a descriptor number only reads the table.
        assert_eq!(unsafe { libc::fcntl((r.table - 1) as libc::c_int, libc::F_GETFD) }, -1);
    }
}
