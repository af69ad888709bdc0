//! File and block-device namespaces: one io_uring per reactor (a channel, like an SSD queue
//! pair), O_DIRECT by default with aligned buffers from the channel's pool.
//!
//! Flush is fdatasync, FUA is RWF_DSYNC, Write Zeroes is fallocate(ZERO_RANGE), deallocate is
//! fallocate(PUNCH_HOLE) (reads back zeroes). Completions are reaped from the ring in memory
//! when polling and through a registered eventfd in interrupt mode. Where io_uring is not
//! available (an old kernel, a seccomp filter) the channel hands its commands to a worker
//! thread instead, so a reactor never blocks on the file.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use io_uring::IoUring;
use tracing::{debug, info, warn};

mod channel;

use super::{Backend, Caps, Channel, ChannelEnv, ChannelNs};
use crate::error::StoreError;
pub use channel::{AlignedBuf, FileChannel, FileOp};

/// Buffer alignment for O_DIRECT (covers 512- and 4096-byte logical blocks).
pub const ALIGN: usize = 4096;
const RING_ENTRIES: u32 = 256;
const EXACT_GAP: Duration = Duration::from_micros(5);
/// How long a held lock on the backing store is retried at open (see `FileDisk::open`).
const LOCK_WAIT: Duration = Duration::from_secs(3);

/// An open, locked backing file or block device.
#[derive(Debug)]
pub struct FileDisk {
    /// The open file.
    pub file: File,
    /// Its path.
    pub path: PathBuf,
    /// Size in bytes.
    pub len: u64,
    /// Opened with O_DIRECT.
    pub direct: bool,
    /// A block device rather than a regular file.
    pub block_device: bool,
    /// Its channels reach it through io_uring (probed at open; cleared if a channel could
    /// not make a ring and fell back to a worker thread).
    pub uring: Arc<AtomicBool>,
    /// Starts and unsafe shutdowns of this store under pollux (None: the store keeps no
    /// extended attributes, e.g. a block device).
    pub record: Option<ShutdownRecord>,
}

/// The extended attribute that records a store's starts and unsafe shutdowns.
const RECORD_XATTR: &std::ffi::CStr = c"user.pollux.shutdowns";

/// How often pollux opened a store, and how often it did not close it cleanly (SMART Power
/// Cycles and Unsafe Shutdowns, NVMe 2.0 §5.16.1.3): kept in an extended attribute of the
/// file, `open` while pollux serves it and `clean` once it closed it. Found `open` at start,
/// the last run ended without closing it (killed, crashed, power lost).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShutdownRecord {
    /// Opens by pollux, this one included.
    pub starts: u64,
    /// Opens that found the store still marked open.
    pub unsafe_shutdowns: u64,
}

impl ShutdownRecord {
    fn parse(v: &str) -> Option<(Self, bool)> {
        let mut it = v.split_whitespace();
        if it.next()? != "v1" {
            return None;
        }
        let starts = it.next()?.strip_prefix("starts=")?.parse().ok()?;
        let unsafe_shutdowns = it.next()?.strip_prefix("unsafe=")?.parse().ok()?;
        let open = match it.next()? {
            "open" => true,
            "clean" => false,
            _ => return None,
        };
        Some((
            Self {
                starts,
                unsafe_shutdowns,
            },
            open,
        ))
    }

    fn write(&self, fd: std::os::fd::RawFd, open: bool) -> std::io::Result<()> {
        let v = format!(
            "v1 starts={} unsafe={} {}",
            self.starts,
            self.unsafe_shutdowns,
            if open { "open" } else { "clean" }
        );
        // SAFETY: fsetxattr reads `v.len()` bytes from `v` and the NUL-terminated name, both
        // live for the call; fd is ours.
        let rc = unsafe { libc::fsetxattr(fd, RECORD_XATTR.as_ptr(), v.as_ptr().cast(), v.len(), 0) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// The record of `file` as it is, counting nothing: a hot upgrade's new process goes on
    /// with the run its old one started (the store stays marked open).
    fn resume(file: &File) -> Option<Self> {
        let mut buf = [0u8; 128];
        // SAFETY: fgetxattr writes at most `buf.len()` bytes into `buf`; fd is ours.
        let n = unsafe {
            libc::fgetxattr(
                file.as_raw_fd(),
                RECORD_XATTR.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        let n = usize::try_from(n).ok()?;
        std::str::from_utf8(&buf[..n])
            .ok()
            .and_then(Self::parse)
            .map(|(r, _)| r)
    }

    /// Read the record of `file`, count this start (and an unsafe shutdown if it was left
    /// open) and mark it open. None where the store has no extended attributes.
    fn start(file: &File) -> Option<Self> {
        let fd = file.as_raw_fd();
        let mut buf = [0u8; 128];
        // SAFETY: fgetxattr writes at most `buf.len()` bytes into `buf`; fd is ours.
        let n = unsafe { libc::fgetxattr(fd, RECORD_XATTR.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        // No record yet (or one pollux cannot read): a store never opened by pollux.
        let (mut rec, was_open) = usize::try_from(n)
            .ok()
            .and_then(|n| std::str::from_utf8(&buf[..n]).ok())
            .and_then(Self::parse)
            .unwrap_or((
                Self {
                    starts: 0,
                    unsafe_shutdowns: 0,
                },
                false,
            ));
        rec.starts += 1;
        if was_open {
            rec.unsafe_shutdowns += 1;
        }
        match rec.write(fd, true) {
            Ok(()) => Some(rec),
            Err(e) => {
                debug!(error = %e, "no extended attributes on this store: its unsafe shutdowns are not counted");
                None
            }
        }
    }
}

impl Drop for FileDisk {
    fn drop(&mut self) {
        if let Some(r) = &self.record
            && let Err(e) = r.write(self.file.as_raw_fd(), false)
        {
            warn!(path = %self.path.display(), error = %e, "could not mark the store closed cleanly");
        }
    }
}

fn block_device_size(f: &File) -> std::io::Result<u64> {
    // BLKGETSIZE64 = _IOR(0x12, 114, size_t)
    const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
    let mut size: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which points to `size`.
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), BLKGETSIZE64, &mut size as *mut u64) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(size)
}

impl FileDisk {
    /// Open (creating a regular file of `size` if it is missing), lock and size-check the
    /// backing store; `shared`: other pollux targets serve it too (a shared lock). Errors
    /// are sentences for the operator.
    pub fn open(
        path: &Path,
        size: Option<u64>,
        direct: bool,
        shared: bool,
        block_size: u32,
    ) -> Result<Self, StoreError> {
        Self::open_or_adopt(path, size, direct, shared, block_size, None)
    }

    /// [`Self::open`], or, with `inherited` (a hot upgrade's new process), take the file the
    /// old process had open: the same open file, so its lock is already this process's,
    /// and the store's shutdown record goes on from the old process's start.
    pub fn open_or_adopt(
        path: &Path,
        size: Option<u64>,
        direct: bool,
        shared: bool,
        block_size: u32,
        inherited: Option<File>,
    ) -> Result<Self, StoreError> {
        let adopted = inherited.is_some();
        let path_buf = || path.to_path_buf();
        let io = |what: &'static str| {
            move |source| StoreError::FileIo {
                path: path.to_path_buf(),
                what,
                source,
            }
        };
        let exists = adopted || path.exists();
        if !exists && size.is_none() {
            return Err(StoreError::FileMissing { path: path_buf() });
        }
        let mut opts = OpenOptions::new();
        opts.read(true).write(true).create(!exists);
        if direct {
            opts.custom_flags(libc::O_DIRECT);
        }
        let file = match inherited {
            Some(f) => Ok(f),
            None => opts.open(path),
        }
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::EINVAL) && direct {
                StoreError::FileNoDirect { path: path_buf() }
            } else {
                io("cannot open")(e)
            }
        })?;
        // One pollux per backing store, unless every one that opens it says it is shared: a
        // second pollux that does not know of the first would corrupt it, while targets
        // exporting one subsystem over shared storage write it through the hosts' multipath,
        // which sends each write down one path (pollux caches no data, so each sees the
        // others' writes). A shared lock keeps out a pollux that wants it alone, and the
        // other way round. A pollux that was just killed may still hold the lock for a
        // moment after its process is gone: the kernel drops the file (and its lock) only
        // once the io_uring requests it had in flight, an fdatasync say, have finished. So a
        // held lock is retried for a short while before it counts as another process's.
        let lock = if shared { libc::LOCK_SH } else { libc::LOCK_EX };
        let deadline = Instant::now() + LOCK_WAIT;
        loop {
            // SAFETY: flock on our own open fd; no memory is involved.
            if unsafe { libc::flock(file.as_raw_fd(), lock | libc::LOCK_NB) } == 0 {
                break;
            }
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(io("cannot lock")(e));
            }
            if Instant::now() >= deadline {
                return Err(StoreError::FileLocked { path: path_buf() });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let meta = file.metadata().map_err(io("cannot read its metadata"))?;
        let block_device = meta.file_type().is_block_device();
        let len = if block_device {
            block_device_size(&file).map_err(io("cannot read the device size"))?
        } else if !exists {
            let want = size.unwrap_or(0);
            file.set_len(want).map_err(io("cannot size the new file"))?;
            info!(path = %path.display(), bytes = want, "created the backing file");
            want
        } else if meta.is_file() {
            meta.len()
        } else {
            return Err(StoreError::FileKind { path: path_buf() });
        };
        if len == 0 || len % u64::from(block_size) != 0 {
            return Err(StoreError::FileSize {
                path: path_buf(),
                size: len,
                block_size,
            });
        }
        if let Some(s) = size
            && exists
            && s != len
        {
            warn!(path = %path.display(), conf = s, actual = len, "the conf size differs from the file's: serving the file's");
        }
        // The same probe a channel makes: an old kernel or a seccomp filter refuses io_uring
        // for the whole process. Said once here, at start, rather than at the first I/O.
        let uring = match IoUring::new(2) {
            Ok(_) => true,
            Err(e) => {
                warn!(path = %path.display(), error = %e, "io_uring is unavailable: this file namespace uses a worker thread per reactor");
                false
            }
        };
        // The record counts one pollux's starts: with several serving the store, each would
        // find it marked open by another and count an unsafe shutdown.
        let record = match (shared, adopted) {
            (true, _) => None,
            (false, true) => ShutdownRecord::resume(&file),
            (false, false) => ShutdownRecord::start(&file),
        };
        if let Some(r) = record
            && r.unsafe_shutdowns > 0
            && r.starts > 1
        {
            info!(path = %path.display(), starts = r.starts, unsafe_shutdowns = r.unsafe_shutdowns, "the store was not closed cleanly before (counted in SMART Unsafe Shutdowns)");
        }
        info!(path = %path.display(), bytes = len, direct, shared, io = if uring { "io_uring" } else { "worker thread" }, "file namespace opened");
        Ok(Self {
            record,
            file,
            path: path.to_path_buf(),
            len,
            direct,
            block_device,
            uring: Arc::new(AtomicBool::new(uring)),
        })
    }
}

impl Backend for FileDisk {
    fn kind(&self) -> &'static str {
        "file"
    }

    fn handover_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        Some(std::os::fd::AsFd::as_fd(&self.file))
    }

    fn shutdown_record(&self) -> Option<(u64, u64)> {
        self.record.map(|r| (r.starts, r.unsafe_shutdowns))
    }

    fn len(&self) -> u64 {
        self.len
    }

    fn io_path(&self) -> &'static str {
        if self.uring.load(Ordering::Relaxed) {
            "io_uring"
        } else {
            "worker thread"
        }
    }

    /// The page cache (and the device's own cache below it) holds writes until a Flush.
    fn caps(&self) -> Caps {
        Caps {
            volatile_cache: true,
            dma_data: false,
            inline_reads: false,
            copy_offload: None,
            compare_and_write: None,
        }
    }

    fn open_channel(&self, ns: ChannelNs, env: &ChannelEnv) -> Result<Box<dyn Channel>, StoreError> {
        let ch =
            FileChannel::new(ns, self.file.as_raw_fd(), &self.uring, env).map_err(|source| StoreError::FileIo {
                path: self.path.clone(),
                what: "cannot open a channel (io_uring or its worker thread)",
                source,
            })?;
        Ok(Box::new(ch))
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn open_creates_sizes_locks_and_refuses_bad_input() {
        let dir = std::env::temp_dir().join(format!("pollux-file-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let p = dir.join("disk.img");
        let _ = std::fs::remove_file(&p);
        let e = FileDisk::open(&p, None, false, false, 512).unwrap_err().to_string();
        assert!(e.contains("does not exist"), "{e}");
        let d = FileDisk::open(&p, Some(1 << 20), false, false, 512).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(d.len, 1 << 20);
        // A second opener (another pollux) is refused while the first holds the lock.
        let e = FileDisk::open(&p, None, false, false, 512).unwrap_err().to_string();
        assert!(e.contains("already in use"), "{e}");
        drop(d);
        let d = FileDisk::open(&p, None, false, false, 512).unwrap_or_else(|e| panic!("{e}"));
        drop(d);
        // Shared: several openers that all say so; one that wants the store alone is refused.
        let a = FileDisk::open(&p, None, false, true, 512).unwrap_or_else(|e| panic!("{e}"));
        let b = FileDisk::open(&p, None, false, true, 512).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            a.record.is_none() && b.record.is_none(),
            "no shutdown record for a shared store"
        );
        let e = FileDisk::open(&p, None, false, false, 512).unwrap_err().to_string();
        assert!(e.contains("already in use") && e.contains("shared = true"), "{e}");
        drop((a, b));
        std::fs::write(dir.join("odd.img"), vec![0u8; 1000]).unwrap_or_else(|e| panic!("{e}"));
        let e = FileDisk::open(&dir.join("odd.img"), None, false, false, 512)
            .unwrap_err()
            .to_string();
        assert!(e.contains("multiple of the block size"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
