//! The target crate's one error type.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;

/// Errors from starting or running the target.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    /// The conf file is invalid.
    #[error(transparent)]
    Conf(#[from] pollux_conf::ConfError),
    /// A gateway group's configuration cannot be merged into this gateway's.
    #[error(transparent)]
    Group(#[from] pollux_conf::group::GroupError),
    /// A listener could not be bound.
    #[error("listener {addr}: {source}")]
    Listen {
        /// The configured address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A namespace backend could not be opened.
    #[error("subsystem {nqn} namespace {nsid}: {source}")]
    Backend {
        /// Subsystem NQN.
        nqn: String,
        /// Namespace id.
        nsid: u32,
        /// What went wrong.
        #[source]
        source: Box<TargetError>,
    },
    /// A namespace's reservation state file could not be read: the target does not start
    /// rather than drop a reservation (NVMe 2.0 §8.19.4, Persist Through Power Loss).
    #[error("reservation state {}: {why}", path.display())]
    ReservationState {
        /// The state file.
        path: std::path::PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// The object in a cluster that holds a namespace's reservations for every gateway
    /// could not be set up.
    #[error("reservation object {object}: {why}")]
    ReservationCluster {
        /// Pool, RADOS namespace and object.
        object: String,
        /// What failed.
        why: String,
    },
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
    /// A referral leads back to one of this target's own listeners (known once bound).
    #[error(
        "referral {referral} is this target's own listener {listener}: a referral points hosts at another target's discovery controller"
    )]
    SelfReferral {
        /// The referral's address.
        referral: SocketAddr,
        /// The listener it reaches, as bound.
        listener: SocketAddr,
    },
    /// A subsystem's controller id range holds fewer ids than the target runs reactors (the
    /// conf's `cores` changed, which takes effect only at the next start).
    #[error(
        "subsystem {nqn}: the controller ID range {min}..={max} holds fewer IDs than the {reactors} running reactors, one each at least"
    )]
    CntlidRange {
        /// The subsystem.
        nqn: String,
        /// `min_cntlid`.
        min: u16,
        /// `max_cntlid`.
        max: u16,
        /// Reactors running.
        reactors: usize,
    },
    /// A run-time change while a hot upgrade hands the target over.
    #[error("an upgrade is in progress: try again when it is done")]
    Upgrading,
    /// A reload was asked of a target running the embedded default.
    #[error("running the embedded default configuration: there is no conf file to reload")]
    NoConfFile,
    /// The reactors could not be started or stopped.
    #[error(transparent)]
    Reactor(#[from] pollux_reactor::ReactorError),
}

/// A librados/librbd return code (a negative errno) as text.
fn errno_text(errno: i32) -> String {
    // "Connection timed out (os error 110)": the reason and the errno.
    io::Error::from_raw_os_error(errno.saturating_abs()).to_string()
}
