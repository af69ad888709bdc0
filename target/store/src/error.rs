//! The store's one error type: what opening or running a namespace's store can fail with.
//! The target wraps it whole (its `TargetError::Store`), so the messages operators see are
//! these.

use std::io;
use std::path::PathBuf;

/// Errors from opening or running a store (and the threads and channels it starts).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Memory for a RAM or simulated namespace (address space for a null one's zeroes)
    /// could not be mapped.
    #[error("cannot map {bytes} bytes of RAM: {source}")]
    Ram {
        /// The size asked for.
        bytes: u64,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A RAM namespace's memory handed over by another process (a memfd, the hot upgrade)
    /// is not the size of the namespace that adopts it: the two processes disagree on the
    /// namespace, and its data is not served rather than served cut short or padded.
    #[error("the RAM handed over holds {found} bytes, the namespace adopting it has {expected}: not adopted")]
    RamAdoptSize {
        /// The adopting namespace's size.
        expected: u64,
        /// The memfd's size (fstat).
        found: u64,
    },
    /// The namespace's store cannot be resized.
    #[error("a {kind} namespace cannot be resized (only rbd namespaces can)")]
    ResizeUnsupported {
        /// The backend kind.
        kind: &'static str,
    },
    /// librbd could not be loaded: an rbd namespace cannot be served on this machine.
    #[error("cannot load {lib} ({why}): install Ceph's librbd (Debian: apt-get install librbd1) to serve RBD images")]
    RbdLibrary {
        /// The library file.
        lib: &'static str,
        /// The loader's reason.
        why: String,
    },
    /// A librados or librbd call on an image failed.
    #[error("rbd image {image} (ceph conf {}): {what}: {}", conf.display(), errno_text(*errno))]
    Rbd {
        /// The image, `pool[/namespace]/image`.
        image: String,
        /// The cluster's configuration file.
        conf: PathBuf,
        /// What pollux was doing, and what it means.
        what: String,
        /// The negative errno librados or librbd returned.
        errno: i32,
    },
    /// A backing file is missing and the conf gives no size to create it.
    #[error("{} does not exist and no `size` is given to create it", path.display())]
    FileMissing {
        /// The file.
        path: PathBuf,
    },
    /// A backing file is locked by another process (another pollux serving it).
    #[error("{} is already in use by another process (it holds the lock; targets serving one store together all set `shared = true`)", path.display())]
    FileLocked {
        /// The file.
        path: PathBuf,
    },
    /// O_DIRECT was asked of a filesystem without it.
    #[error("{}: the filesystem does not support O_DIRECT (e.g. tmpfs): set `direct = false`", path.display())]
    FileNoDirect {
        /// The file.
        path: PathBuf,
    },
    /// The backing store is neither a regular file nor a block device.
    #[error("{} is neither a regular file nor a block device", path.display())]
    FileKind {
        /// The path.
        path: PathBuf,
    },
    /// The backing store's size does not fit the block size.
    #[error("{}: size {size} is not a non-zero multiple of the block size {block_size}", path.display())]
    FileSize {
        /// The file.
        path: PathBuf,
        /// Its size.
        size: u64,
        /// The namespace's block size.
        block_size: u32,
    },
    /// A system call on a backing file failed.
    #[error("{}: {what}: {source}", path.display())]
    FileIo {
        /// The file.
        path: PathBuf,
        /// What was being done.
        what: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// An NVMe device could not be brought up or used.
    #[error("NVMe device {device}: {source}")]
    Nvme {
        /// BDF or fake device name.
        device: String,
        /// The driver's error.
        #[source]
        source: pollux_nvme::pci::PciError,
    },
    /// An NVMe device cannot serve this target as configured.
    #[error("NVMe device {device}: {reason}")]
    NvmeUnfit {
        /// BDF or fake device name.
        device: String,
        /// Why (no such namespace, too few queue pairs, ...).
        reason: String,
    },
    /// A thread could not be started.
    #[error("cannot start thread {name}: {source}")]
    Thread {
        /// The thread's name.
        name: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A per-reactor channel on a namespace could not be opened.
    #[error("namespace {nsid}: cannot open a channel on reactor {reactor}: {reason}")]
    Channel {
        /// Namespace id.
        nsid: u32,
        /// Reactor id.
        reactor: usize,
        /// Why.
        reason: String,
    },
    /// A channel could not be added to its reactor as a source.
    #[error(transparent)]
    Reactor(#[from] pollux_reactor::ReactorError),
}

/// A librados/librbd return code (a negative errno) as text.
fn errno_text(errno: i32) -> String {
    // "Connection timed out (os error 110)": the reason and the errno.
    io::Error::from_raw_os_error(errno.saturating_abs()).to_string()
}
