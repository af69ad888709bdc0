//! A namespace's `backend` table: the storage behind it, one struct per kind.

use std::path::PathBuf;

/// The storage behind a namespace. More kinds may be added; match on it
/// with that in mind.
#[derive(Debug, Clone, PartialEq)]
pub enum Backend {
    /// Memory, zero-filled at start, lost at exit.
    Ram {
        /// Capacity in bytes: > 0 and a multiple of the block size.
        size: u64,
    },
    /// A file or block device.
    File(FileBackend),
    /// A simulated SSD: memory with modelled latencies, parallelism,
    /// bandwidth and interrupts.
    Sim(SimBackend),
    /// A namespace of an NVMe controller driven by pollux's userspace
    /// driver: a PCI function bound to vfio-pci, or the in-process fake
    /// controller (testing).
    Nvme(NvmeBackend),
    /// A Ceph RBD image, reached through librbd (loaded at run time): pollux as a gateway
    /// to a distributed store.
    Rbd(RbdBackend),
    /// No store (SPDK's null bdev): writes are discarded and reads return zeroes, for
    /// benchmarks of the target itself.
    Null {
        /// Capacity in bytes: > 0 and a multiple of the block size.
        size: u64,
    },
}

impl Backend {
    /// The configuration name of the backend kind (`"ram"`, `"file"`, `"sim"`, `"nvme"`,
    /// `"rbd"` or `"null"`), for logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Backend::Ram { .. } => "ram",
            Backend::File(_) => "file",
            Backend::Sim(_) => "sim",
            Backend::Nvme(_) => "nvme",
            Backend::Rbd(_) => "rbd",
            Backend::Null { .. } => "null",
        }
    }
}

/// The default `op_timeout_s` of an `rbd` backend.
pub const RBD_OP_TIMEOUT_S: u32 = 10;

/// An `rbd` backend: a Ceph RBD image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RbdBackend {
    /// The RADOS pool.
    pub pool: String,
    /// The image's name.
    pub image: String,
    /// The RADOS namespace within the pool (None: the default one).
    pub rados_namespace: Option<String>,
    /// The cluster's configuration file (absolute; default `/etc/ceph/ceph.conf`).
    pub ceph_conf: PathBuf,
    /// The Ceph user, without `client.` (default `admin`).
    pub user: String,
    /// A keyring file (owner-only), when not the one `ceph_conf` names.
    pub keyring: Option<PathBuf>,
    /// librbd's writeback cache: writes complete once cached in this gateway, the
    /// namespace reports a volatile write cache, and Flush and FUA writes reach the
    /// cluster. Off (the default): a write completes once the cluster has it.
    pub write_cache: bool,
    /// Seconds a command may wait on the cluster before it fails with a retryable status
    /// (librados' `rados_osd_op_timeout`; also bounds connecting), 1..=300.
    pub op_timeout_s: u32,
    /// The gateway group serving the image (the conf's `[gateway] group`): the image is
    /// marked as that group's, and an image another group marked is refused.
    pub gateway_group: Option<String>,
    /// Serve an image another gateway group marked, marking it this group's (an operator
    /// moving the image between groups).
    pub take_over_group: bool,
}

impl RbdBackend {
    /// `pool[/rados_namespace]/image`, as `rbd` writes an image spec.
    pub fn spec(&self) -> String {
        match &self.rados_namespace {
            Some(ns) => format!("{}/{ns}/{}", self.pool, self.image),
            None => format!("{}/{}", self.pool, self.image),
        }
    }
}

/// An `nvme` backend: namespace `nsid` of an NVMe controller.
#[derive(Debug, Clone, PartialEq)]
pub struct NvmeBackend {
    /// The controller.
    pub device: NvmeDevice,
    /// The controller's namespace ID (default 1); the pair (device, nsid) is
    /// unique across the configuration.
    pub nsid: u32,
}

/// The NVMe controller of an [`NvmeBackend`].
#[derive(Debug, Clone, PartialEq)]
pub enum NvmeDevice {
    /// A PCI function bound to vfio-pci, by its address, normalised to
    /// `DDDD:BB:DD.F` (lower-case hex). Its namespace's block size is the
    /// device's format, so `block_size` is not given for it.
    Pci(String),
    /// The driver's in-process fake controller (registers and queues in
    /// memory, served by a thread): the whole userspace-driver path without
    /// hardware, with fault injection over the control socket. Namespaces
    /// naming the same fake device are namespaces of one controller.
    Fake {
        /// The device's name, for the control socket.
        name: String,
        /// This namespace's capacity in bytes (> 0, a multiple of the block
        /// size).
        size: u64,
        /// Command latency in microseconds (finite, >= 0).
        latency_us: f64,
    },
}

impl NvmeDevice {
    /// The name the device goes by: its BDF, or the fake device's name.
    pub fn name(&self) -> &str {
        match self {
            NvmeDevice::Pci(b) => b,
            NvmeDevice::Fake { name, .. } => name,
        }
    }
}

/// A `file` backend: data lives in a file (or block device).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileBackend {
    /// The file, absolute: a relative path in the configuration is resolved
    /// against the configuration file's directory (or the current directory
    /// for [`Config::parse`]), and `.` components are removed. Unique across
    /// the configuration.
    pub path: PathBuf,
    /// The capacity in bytes, if given: > 0 and a multiple of the block
    /// size. Needed only when the file does not exist yet; the target checks
    /// that at start.
    pub size: Option<u64>,
    /// Open with `O_DIRECT`, bypassing the page cache.
    pub direct: bool,
    /// Other pollux targets serve the same store too (one subsystem exported by several
    /// targets in front of shared storage): take a shared lock instead of an exclusive
    /// one, so only targets that all say so open it together.
    pub shared: bool,
}

/// A `sim` backend: a simulated SSD.
#[derive(Debug, Clone, PartialEq)]
pub struct SimBackend {
    /// Capacity in bytes: > 0 and a multiple of the block size.
    pub size: u64,
    /// Service time of a read of up to 4 KiB.
    pub read: Latency,
    /// Service time of a write of up to 4 KiB.
    pub write: Latency,
    /// Extra service time per KiB beyond the first 4 KiB of a command,
    /// microseconds; finite, >= 0.
    pub per_kib_us: f64,
    /// Commands in service at once (further commands wait), 1..=65536.
    pub parallelism: u32,
    /// Bytes per second the device transfers at most; `None`: unlimited.
    /// Always > 0.
    pub bandwidth: Option<u64>,
    /// Delay from a command's completion to its interrupt, microseconds;
    /// finite, >= 0.
    pub interrupt_delay_us: f64,
    /// Interrupt coalescing: raise one interrupt per this many completions,
    /// >= 1 (1: no coalescing by count).
    pub coalesce_count: u32,
    /// Interrupt coalescing: raise the interrupt at most this long after the
    /// first pending completion, microseconds; finite, >= 0.
    pub coalesce_us: f64,
    /// Seed of the latency random number generator, `0..=i64::MAX` (TOML
    /// integers are signed 64-bit).
    pub seed: u64,
}

/// A latency distribution of a simulated backend, in microseconds. Every
/// value is finite and >= 0.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Latency {
    /// Always `us`. Written `{ fixed_us = X }`.
    Fixed {
        /// The latency.
        us: f64,
    },
    /// Uniform in `min_us..=max_us`. Written `{ min_us = A, max_us = B }`.
    Uniform {
        /// The lower bound, <= `max_us`.
        min_us: f64,
        /// The upper bound.
        max_us: f64,
    },
    /// Lognormal: `median_us * exp(sigma * N(0, 1))`. Written
    /// `{ median_us = M, sigma = S }`.
    LogNormal {
        /// The median, > 0.
        median_us: f64,
        /// The standard deviation of the underlying normal, `0..=3`.
        sigma: f64,
    },
    /// `slow_us` with probability `slow_fraction`, else `fast_us`. Written
    /// `{ fast_us = F, slow_us = L, slow_fraction = P }`.
    Bimodal {
        /// The common latency, <= `slow_us`.
        fast_us: f64,
        /// The occasional latency.
        slow_us: f64,
        /// The probability of `slow_us`, `0..=1`.
        slow_fraction: f64,
    },
}
