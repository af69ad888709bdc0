//! Subsystems and namespaces as the reactors see them: an immutable snapshot shared by all
//! reactors and swapped whole on change, so readers never lock. A controller sees its
//! subsystem through a [`HostView`]: the namespaces attached to its host (host masking).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::ops::RangeInclusive;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use pollux_conf::{Config, DISCOVERY_NQN, Dhchap, HostKeys, TlsKey, TlsMode};
use pollux_nvme::spec::Status;
use pollux_nvme::tls::{PskIdentity, TlsPsk};
use pollux_reactor::{Reactor, SourceId};

use crate::ana::AnaStates;
use crate::backend::{Backend, ChannelNs, StoreError};
use crate::error::TargetError;
use crate::latency::{Latencies, LatencyHistogram};
use crate::resv::{NsResv, state_file};

mod nstable;
use nstable::NsTable;

/// I/O counters of one namespace on one reactor: written by that reactor only (relaxed
/// load + store, no locked instruction), summed by readers. Padded to a cache line so
/// reactors never share one.
#[derive(Debug, Default)]
#[repr(align(64))]
pub struct NsCounters {
    /// Read commands completed.
    pub read_cmds: AtomicU64,
    /// Write commands completed.
    pub write_cmds: AtomicU64,
    /// Bytes read.
    pub read_bytes: AtomicU64,
    /// Bytes written.
    pub write_bytes: AtomicU64,
    /// Writes started and not completed on this reactor, by the slot they were counted in
    /// (the fences of [`crate::range_lock`]).
    pub writes: [AtomicU64; 2],
    /// The fence epoch of this reactor: its low bit is the slot new writes count in.
    pub write_epoch: AtomicU64,
    /// Completion latency of its Read commands, from arrival to completion.
    pub read_latency: LatencyHistogram,
    /// Completion latency of its Write and Write Zeroes commands, from arrival (before an R2T
    /// data transfer) to completion.
    pub write_latency: LatencyHistogram,
}

/// Summed namespace counters.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct NsTotals {
    /// Read commands.
    pub read_cmds: u64,
    /// Write commands.
    pub write_cmds: u64,
    /// Bytes read.
    pub read_bytes: u64,
    /// Bytes written.
    pub write_bytes: u64,
}

/// One namespace.
#[derive(Debug)]
pub struct Namespace {
    /// Namespace id.
    pub nsid: u32,
    /// Logical block size in bytes (512 or 4096).
    pub block_size: u32,
    /// log2(block_size).
    pub block_shift: u32,
    /// Size in logical blocks: read relaxed on every command ([`Namespace::blocks`]),
    /// changed when the store is resized ([`crate::mutate::namespace_resized`]).
    pub blocks: AtomicU64,
    /// RFC 4122 UUID.
    pub uuid: [u8; 16],
    /// Namespace globally unique identifier.
    pub nguid: [u8; 16],
    /// IEEE extended unique identifier.
    pub eui64: [u8; 8],
    /// ANA group id.
    pub ana_group: u32,
    /// Data store.
    pub backend: Box<dyn Backend>,
    /// Per-reactor counters (index: reactor id).
    pub counters: Box<[NsCounters]>,
    /// The backend's [`crate::backend::Caps::inline_reads`], read once here: the I/O path
    /// tests it on every read without a call through the backend.
    pub inline_reads: bool,
    /// Its reservations (NVMe 2.0 §8.19), shared by every reactor.
    pub resv: Arc<NsResv>,
    /// Its LBA range locks (fused Compare and Write, Copy).
    pub locks: crate::range_lock::RangeLocks,
    /// Its QoS limits and their budget, shared by every reactor ([`crate::qos`]): set by the
    /// conf's `qos` and `pollux ctl set-qos`, in place.
    pub qos: crate::qos::NsQos,
    /// Its polling policy (`polling`: its own, else its subsystem's): read relaxed by the
    /// reactors on each command and channel run, set by the conf and `pollux ctl
    /// set-polling` ([`pollux_reactor::polling`]).
    pub polling: Arc<pollux_reactor::PollingCell>,
}

impl Namespace {
    /// Size in logical blocks now.
    #[inline]
    pub fn blocks(&self) -> u64 {
        self.blocks.load(Relaxed)
    }

    /// Size in bytes now.
    pub fn bytes(&self) -> u64 {
        self.blocks() << self.block_shift
    }

    /// Counters of reactor `r`.
    pub fn counters(&self, r: usize) -> &NsCounters {
        &self.counters[r % self.counters.len()]
    }

    /// Sum of every reactor's counters.
    pub fn totals(&self) -> NsTotals {
        let mut t = NsTotals::default();
        for c in self.counters.iter() {
            t.read_cmds += c.read_cmds.load(Relaxed);
            t.write_cmds += c.write_cmds.load(Relaxed);
            t.read_bytes += c.read_bytes.load(Relaxed);
            t.write_bytes += c.write_bytes.load(Relaxed);
        }
        t
    }

    /// What a channel of this namespace keeps of it: not the namespace (a channel depends
    /// on its store, not on the subsystem's model).
    pub fn channel_ns(&self) -> ChannelNs {
        ChannelNs {
            nsid: self.nsid,
            polling: self.polling.clone(),
        }
    }

    /// The key of this namespace's channel on a reactor ([`Backend::channel_key`]).
    #[inline]
    fn channel_key(&self) -> usize {
        self.backend.channel_key(ChannelNs::key(&self.polling))
    }

    /// This reactor's channel on the namespace, if it has opened one.
    pub fn existing_channel(&self, r: &mut Reactor) -> Option<SourceId> {
        crate::backend::existing_channel(r, self.channel_key())
    }

    /// This reactor's channel on the namespace, opened on first use.
    pub fn channel(&self, r: &mut Reactor) -> Result<SourceId, Status> {
        crate::backend::channel_for(r, &*self.backend, self.channel_key(), || self.channel_ns())
    }

    /// The read and write latency histograms, summed over reactors.
    pub fn latencies(&self) -> (Latencies, Latencies) {
        let (mut read, mut write) = (Latencies::default(), Latencies::default());
        for c in self.counters.iter() {
            c.read_latency.add_to(&mut read);
            c.write_latency.add_to(&mut write);
        }
        (read, write)
    }
}

/// One NVM subsystem.
#[derive(Debug)]
pub struct Subsystem {
    /// NQN.
    pub nqn: String,
    /// Serial number (Identify Controller SN).
    pub serial: String,
    /// Model number (Identify Controller MN).
    pub model: String,
    /// Any host may connect.
    pub allow_any_host: bool,
    /// Host NQNs allowed to connect (when not allow_any_host).
    pub hosts: Vec<String>,
    /// DH-HMAC-CHAP keys of the hosts that must authenticate, by host NQN.
    pub host_keys: BTreeMap<String, HostKeys>,
    /// Configured TLS PSKs, by host NQN.
    pub tls_keys: BTreeMap<String, TlsKey>,
    /// The hash functions and DH groups accepted, most preferred first.
    pub dhchap: Dhchap,
    /// Namespaces by nsid, attached to a host or not: a controller finds its own through
    /// its [`HostView`], the one place an NSID resolves for a host, so that no command path
    /// can forget the masks. Found in constant time (every I/O command looks one up).
    namespaces: NsTable<Arc<Namespace>>,
    /// The hosts each masked namespace is attached to (its conf's `hosts`), by nsid; a
    /// namespace not here is attached to every host the subsystem admits.
    masks: BTreeMap<u32, BTreeSet<String>>,
    /// The controller ids its controllers get (`min_cntlid..=max_cntlid` of the conf), so
    /// that targets exporting the same subsystem never hand out the same id.
    pub cntlids: RangeInclusive<u16>,
    /// The listeners that serve it, by configured address (its conf's `listeners`); None:
    /// every listener.
    pub listeners: Option<Vec<SocketAddr>>,
    /// Hosts may secure their queues with a PSK their admin queue's DH-HMAC-CHAP generates
    /// (secure channel concatenation, TP 8018).
    pub secure_concat: bool,
}

impl Subsystem {
    /// Every namespace, whatever its hosts, by ascending nsid: for the control plane and
    /// the target's own upkeep, never to answer a host (that is [`HostView::namespaces`]).
    pub fn all_namespaces(&self) -> impl Iterator<Item = &Arc<Namespace>> {
        self.namespaces.iter()
    }

    /// Namespace `nsid` whatever its hosts (None: there is none): for the control plane and
    /// the target's own upkeep, never to answer a host (that is [`HostView::namespace`]).
    pub fn namespace_ignoring_masks(&self, nsid: u32) -> Option<&Arc<Namespace>> {
        self.namespaces.get(nsid)
    }

    /// The largest nsid of any namespace (0: none): Identify Controller NN and MNAN, which
    /// are the subsystem's whoever asks.
    pub fn max_nsid(&self) -> u32 {
        self.namespaces.max_nsid().unwrap_or(0)
    }

    /// The hosts namespace `nsid` is attached to; None: every host (it is not masked).
    pub fn masked_to(&self, nsid: u32) -> Option<&BTreeSet<String>> {
        self.masks.get(&nsid)
    }

    /// Whether `hostnqn` may connect and see this subsystem in the discovery log.
    pub fn allows(&self, hostnqn: &str) -> bool {
        self.allow_any_host || self.hosts.iter().any(|h| h == hostnqn)
    }

    /// The keys host `hostnqn` must authenticate with (None: it need not).
    pub fn keys_of(&self, hostnqn: &str) -> Option<&HostKeys> {
        self.host_keys.get(hostnqn)
    }

    /// Whether listener `l` serves this subsystem: a host discovers it there (NVMe-oF 1.1
    /// §5.3) and may connect to it there (SPDK's `spdk_nvmf_subsystem_listener_allowed`,
    /// nvmet's port-to-subsystem links). A connection whose listener is gone (None) still
    /// reaches the subsystems every listener serves.
    pub fn served_on(&self, l: Option<&BoundListener>) -> bool {
        match (&self.listeners, l) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(ls), Some(l)) => ls.contains(&l.configured) || ls.contains(&l.addr),
        }
    }
}

/// A subsystem as the controllers of one host see it: the namespaces attached to that host
/// (NVMe 2.0 §3.2.1.5). A namespace masked from the host is, for its controllers, an
/// inactive NSID like one that does not exist: left out of the Active Namespace ID list,
/// a zero-filled Identify Namespace, Invalid Namespace or Format for its I/O and its
/// per-namespace log pages and features, absent from the ANA log. Built when a controller
/// is created and whenever its subsystem changes, never per command: a lookup costs one
/// branch more than the subsystem's own while none of its namespaces is masked from the
/// host, and one bit test otherwise (no string compared, nothing searched).
#[derive(Debug, Clone)]
pub struct HostView {
    subsys: Arc<Subsystem>,
    /// A bit per slot of the subsystem's namespace table, set for the namespaces masked
    /// from the host; None: none is (the common case).
    hidden: Option<Arc<[u64]>>,
}

impl HostView {
    /// What host `hostnqn` sees of `subsys`.
    pub fn new(subsys: Arc<Subsystem>, hostnqn: &str) -> Self {
        let mut hidden: Option<Vec<u64>> = None;
        for (nsid, hosts) in &subsys.masks {
            if hosts.contains(hostnqn) {
                continue;
            }
            // A mask of an nsid without a namespace hides nothing.
            let Some((slot, _)) = subsys.namespaces.find(*nsid) else {
                continue;
            };
            let bits = hidden.get_or_insert_with(|| vec![0; subsys.namespaces.slots().div_ceil(64)]);
            bits[slot / 64] |= 1 << (slot % 64);
        }
        Self {
            hidden: hidden.map(Into::into),
            subsys,
        }
    }

    /// The subsystem itself.
    pub fn subsystem(&self) -> &Arc<Subsystem> {
        &self.subsys
    }

    /// Whether the namespace in slot `slot` of the subsystem's table is attached to the host.
    #[inline(always)]
    fn attached(&self, slot: usize) -> bool {
        match &self.hidden {
            None => true,
            Some(h) => h.get(slot / 64).is_none_or(|w| w >> (slot % 64) & 1 == 0),
        }
    }

    /// Namespace `nsid` if it is active for this host's controllers: it exists and is
    /// attached to the host. Every command that names an NSID resolves it here, in
    /// constant time.
    #[inline(always)]
    pub fn namespace(&self, nsid: u32) -> Option<&Arc<Namespace>> {
        let (slot, ns) = self.subsys.namespaces.find(nsid)?;
        self.attached(slot).then_some(ns)
    }

    /// The active namespaces of this host's controllers, by ascending nsid.
    pub fn namespaces(&self) -> impl Iterator<Item = &Arc<Namespace>> {
        self.active(self.subsys.namespaces.iter())
    }

    /// The active namespaces of this host's controllers with an nsid above `nsid`, by
    /// ascending nsid (the Active Namespace ID list, NVMe 2.0 §5.17.2.2): the first found
    /// by a binary search, not by walking those below.
    pub fn namespaces_above(&self, nsid: u32) -> impl Iterator<Item = &Arc<Namespace>> {
        self.active(self.subsys.namespaces.above(nsid))
    }

    fn active<'a>(&'a self, it: impl Iterator<Item = &'a Arc<Namespace>>) -> impl Iterator<Item = &'a Arc<Namespace>> {
        it.filter(|n| self.hidden.is_none() || self.namespace(n.nsid).is_some())
    }

    /// The nsids masked from the host, ascending.
    #[cfg(test)]
    fn hidden_nsids(&self) -> Vec<u32> {
        let all = self.subsys.namespaces.iter().map(|n| n.nsid);
        all.filter(|&n| self.namespace(n).is_none()).collect()
    }

    /// Some active namespace has a volatile write cache (Identify Controller VWC, Flush of
    /// every namespace).
    pub fn volatile_cache(&self) -> bool {
        self.namespaces().any(|n| n.backend.caps().volatile_cache)
    }

    /// The same subsystem object and the same namespaces masked.
    pub fn same_as(&self, other: &HostView) -> bool {
        Arc::ptr_eq(&self.subsys, &other.subsys) && self.hidden == other.hidden
    }
}

/// The subsystem's identity, hosts and keys, which are the same whoever asks. Its
/// namespaces are not reachable through this: [`Subsystem`]'s own accessors say that they
/// ignore the masks, and the view's shadow them.
impl std::ops::Deref for HostView {
    type Target = Subsystem;
    fn deref(&self) -> &Subsystem {
        &self.subsys
    }
}

/// Everything a connect or discovery request reads, swapped whole on change.
#[derive(Debug)]
pub struct Snapshot {
    /// Subsystems in conf order (a snapshot is never changed once made: [`Snapshot::new`]
    /// indexes them by NQN).
    pub subsystems: Vec<Arc<Subsystem>>,
    /// Bound listeners (ports resolved), in conf order.
    pub listeners: Vec<BoundListener>,
    /// Discovery log generation counter: changes whenever what a host may discover changes.
    pub genctr: u64,
    /// Who must authenticate to the discovery controller.
    pub discovery: Arc<pollux_conf::Discovery>,
    /// Other targets' discovery controllers, listed after the subsystems in the discovery
    /// log, in conf order.
    pub referrals: Vec<SocketAddr>,
    /// A gateway group's other gateways' listeners and the group subsystems each serves
    /// (listed in the discovery log after this target's own listeners).
    pub peers: Vec<pollux_conf::group::GroupPeer>,
    /// Index in `subsystems` by NQN: a connect, every controller at each change and a
    /// released QoS-held command find their subsystem by name, which a walk of 128
    /// subsystems' NQNs (alike for their first 30 bytes) made linear in their number.
    by_nqn: HashMap<String, usize>,
}

/// A listener as bound.
#[derive(Debug, Clone)]
pub struct BoundListener {
    /// Its address (the port resolved).
    pub addr: SocketAddr,
    /// Its address as configured (a port 0 unresolved): what a subsystem's `listeners`
    /// names.
    pub configured: SocketAddr,
    /// Its TLS mode.
    pub tls: TlsMode,
    /// The ANA states of its path, shared with its connections.
    pub ana: Arc<AnaStates>,
    /// Connections it serves at once (None: only the target's total bounds them).
    pub max_connections: Option<u32>,
}

impl Snapshot {
    /// A snapshot of `subsystems` (NQNs unique, the conf's rule), `listeners` as bound,
    /// discovery log generation `genctr`, `discovery`'s keys and `referrals`.
    pub fn new(
        subsystems: Vec<Arc<Subsystem>>,
        listeners: Vec<BoundListener>,
        genctr: u64,
        discovery: Arc<pollux_conf::Discovery>,
        referrals: Vec<SocketAddr>,
    ) -> Self {
        let by_nqn = subsystems.iter().enumerate().map(|(i, s)| (s.nqn.clone(), i)).collect();
        Self {
            subsystems,
            listeners,
            genctr,
            discovery,
            referrals,
            peers: Vec::new(),
            by_nqn,
        }
    }

    /// This snapshot with the group's `peers` (a gateway group's member).
    pub fn with_peers(mut self, peers: Vec<pollux_conf::group::GroupPeer>) -> Self {
        self.peers = peers;
        self
    }

    /// The subsystem `nqn`.
    pub fn subsystem(&self, nqn: &str) -> Option<&Arc<Subsystem>> {
        self.by_nqn.get(nqn).and_then(|&i| self.subsystems.get(i))
    }

    /// The listener bound to `addr` (None if it is gone).
    pub fn listener(&self, addr: SocketAddr) -> Option<&BoundListener> {
        self.listeners.iter().find(|l| l.addr == addr)
    }

    /// The TLS PSK configured for the host and subsystem (or discovery) an identity names,
    /// derived for that identity's version (NVMe/TCP 1.0 §3.6.1.3).
    pub fn tls_psk(&self, id: &PskIdentity) -> Option<TlsPsk> {
        let key = if id.subnqn == DISCOVERY_NQN {
            self.discovery.tls_keys.get(&id.hostnqn)
        } else {
            self.subsystem(&id.subnqn)?.tls_keys.get(&id.hostnqn)
        }?;
        key.key.tls_psk(&id.hostnqn, &id.subnqn, id.version)
    }
}

/// The reservations of a namespace: persistent (restored from its state file) for file and
/// nvme namespaces when the conf has a `state_dir`; RAM and simulated namespaces lose their
/// data at exit, and their reservations with it.
fn open_reservations(n: &pollux_conf::Namespace, state_dir: Option<&Path>) -> Result<NsResv, TargetError> {
    let persistent = matches!(n.backend, pollux_conf::Backend::File(_) | pollux_conf::Backend::Nvme(_));
    let Some(dir) = state_dir.filter(|_| persistent) else {
        return Ok(NsResv::volatile());
    };
    std::fs::create_dir_all(dir).map_err(|e| TargetError::ReservationState {
        path: dir.to_path_buf(),
        why: format!("cannot create the state directory: {e}"),
    })?;
    NsResv::open(Some(state_file(dir, &n.nguid)))
}

/// Where namespace `n` of subsystem `nqn` takes its store from before the conf is asked: a
/// store the target already holds open for it (a hot upgrade's new process takes over its
/// predecessor's, [`crate::upgrade::new::inherited_store`]); None: it is opened as the conf
/// says ([`crate::backend::open`]). Passed in by whoever starts the target, which this layer
/// does not know.
pub type AdoptStore = fn(nqn: &str, n: &pollux_conf::Namespace) -> Option<Result<Box<dyn Backend>, StoreError>>;

/// No store to adopt: each is opened as the conf says.
pub fn no_store_to_adopt(_nqn: &str, _n: &pollux_conf::Namespace) -> Option<Result<Box<dyn Backend>, StoreError>> {
    None
}

/// Open a namespace's backend (`adopt`'s if it has one) and build the namespace
/// (`reactors` sets its counters; `state_dir`: where persistent reservations are kept;
/// `polling`: its effective policy).
pub fn build_namespace(
    nqn: &str,
    n: &pollux_conf::Namespace,
    polling: pollux_conf::Polling,
    reactors: usize,
    state_dir: Option<&Path>,
    adopt: AdoptStore,
) -> Result<Arc<Namespace>, TargetError> {
    let backend = match adopt(nqn, n) {
        Some(b) => b,
        None => crate::backend::open(n, reactors),
    }
    .map_err(|e| TargetError::Backend {
        nqn: nqn.to_string(),
        nsid: n.nsid,
        source: Box::new(e.into()),
    })?;
    // An RBD image's reservations live in its cluster, for every gateway; other stores'
    // with the target.
    let resv = match backend.reservation_object() {
        Some(object) => object.map_err(TargetError::from).and_then(NsResv::clustered),
        None => open_reservations(n, state_dir),
    }
    .map_err(|e| TargetError::Backend {
        nqn: nqn.to_string(),
        nsid: n.nsid,
        source: Box::new(e),
    })?;
    let resv = Arc::new(resv);
    // An NVMe namespace has its device format's block size.
    let block_size = backend.block_size().unwrap_or(n.block_size);
    let bytes = backend.len();
    // The store's own identifiers (an RBD image's, the same on every gateway) replace the
    // ones derived from this conf, except where the conf gave them.
    let (mut uuid, mut nguid, mut eui64) = (n.uuid, n.nguid, n.eui64);
    if let Some(ids) = backend.ids() {
        if !n.given_ids.uuid {
            uuid = ids.uuid;
        }
        if !n.given_ids.nguid {
            nguid = ids.nguid;
        }
        if !n.given_ids.eui64 {
            eui64 = ids.eui64;
        }
    }
    Ok(Arc::new(Namespace {
        nsid: n.nsid,
        block_size,
        block_shift: block_size.trailing_zeros(),
        blocks: AtomicU64::new(bytes / u64::from(block_size)),
        uuid,
        nguid,
        eui64,
        ana_group: n.ana_group,
        inline_reads: backend.caps().inline_reads,
        backend,
        counters: (0..reactors.max(1)).map(|_| NsCounters::default()).collect(),
        resv,
        locks: Default::default(),
        qos: crate::qos::NsQos::new(&n.qos),
        polling: Arc::new(pollux_reactor::PollingCell::new(polling)),
    }))
}

/// Build a subsystem of a conf, reusing the namespaces `keep` offers (by nsid) instead of
/// opening them again: their data and counters carry over (a kept namespace's `polling`
/// and `qos` are the caller's to set, once the change can no longer fail: [`crate::mutate`]).
/// New namespaces' stores come from `adopt` first ([`AdoptStore`]).
pub fn build_subsystem(
    s: &pollux_conf::Subsystem,
    reactors: usize,
    state_dir: Option<&Path>,
    adopt: AdoptStore,
    keep: impl Fn(u32) -> Option<Arc<Namespace>>,
) -> Result<Arc<Subsystem>, TargetError> {
    let mut namespaces = Vec::with_capacity(s.namespaces.len());
    let mut masks = BTreeMap::new();
    for n in &s.namespaces {
        let ns = match keep(n.nsid) {
            Some(ns) => ns,
            None => build_namespace(&s.nqn, n, s.polling_of(n), reactors, state_dir, adopt)?,
        };
        namespaces.push(ns);
        if let Some(hosts) = &n.hosts {
            masks.insert(n.nsid, hosts.iter().cloned().collect());
        }
    }
    Ok(Arc::new(Subsystem {
        nqn: s.nqn.clone(),
        serial: s.serial.clone(),
        model: s.model.clone(),
        allow_any_host: s.allow_any_host,
        hosts: s.hosts.clone(),
        host_keys: s.host_keys.clone(),
        tls_keys: s.tls_keys.clone(),
        dhchap: s.dhchap.clone(),
        namespaces: NsTable::new(namespaces),
        masks,
        cntlids: s.min_cntlid..=s.max_cntlid,
        listeners: s.listeners.clone(),
        secure_concat: s.secure_concat,
    }))
}

/// Build the namespaces and subsystems of a conf (`listeners`: as bound; `adopt`: where
/// stores come from before the conf is asked).
pub fn build_snapshot(
    cfg: &Config,
    reactors: usize,
    listeners: Vec<BoundListener>,
    adopt: AdoptStore,
) -> Result<Snapshot, TargetError> {
    let subsystems = cfg
        .subsystems
        .iter()
        .map(|s| build_subsystem(s, reactors, cfg.state_dir.as_deref(), adopt, |_| None))
        .collect::<Result<_, _>>()?;
    Ok(Snapshot::new(
        subsystems,
        listeners,
        1,
        Arc::new(cfg.discovery.clone()),
        cfg.referrals.iter().map(|r| r.address).collect(),
    )
    .with_peers(cfg.group_peers.clone()))
}

/// A RAM namespace of `blocks` 512-byte blocks, for unit tests of what reads namespaces.
#[cfg(test)]
pub(crate) fn test_namespace(nsid: u32, blocks: u64) -> Arc<Namespace> {
    let backend = crate::backend::RamDisk::new(blocks << 9).unwrap_or_else(|e| panic!("{e}"));
    Arc::new(Namespace {
        nsid,
        block_size: 512,
        block_shift: 9,
        blocks: blocks.into(),
        uuid: [nsid as u8; 16],
        nguid: [0; 16],
        eui64: [0; 8],
        ana_group: 1,
        backend: Box::new(backend),
        counters: vec![NsCounters::default()].into_boxed_slice(),
        inline_reads: true,
        resv: Arc::new(NsResv::volatile()),
        locks: Default::default(),
        qos: Default::default(),
        polling: Default::default(),
    })
}

/// A subsystem of `namespaces`, open to any host when `hosts` is empty, for unit tests.
#[cfg(test)]
pub(crate) fn test_subsystem(namespaces: &[Arc<Namespace>], hosts: &[&str]) -> Arc<Subsystem> {
    Arc::new(Subsystem {
        nqn: "nqn.2026-11.io.pollux:s".into(),
        serial: "S".into(),
        model: "M".into(),
        allow_any_host: hosts.is_empty(),
        hosts: hosts.iter().map(|h| h.to_string()).collect(),
        host_keys: BTreeMap::new(),
        tls_keys: BTreeMap::new(),
        dhchap: Dhchap::default(),
        namespaces: NsTable::new(namespaces.to_vec()),
        masks: BTreeMap::new(),
        cntlids: pollux_conf::MIN_CNTLID..=pollux_conf::MAX_CNTLID,
        listeners: None,
        secure_concat: false,
    })
}

/// A subsystem named `nqn`, open to any host, without namespaces, for unit tests.
#[cfg(test)]
pub(crate) fn test_subsystem_named(nqn: &str) -> Arc<Subsystem> {
    let mut s = Arc::into_inner(test_subsystem(&[], &[])).unwrap_or_else(|| unreachable!("just built"));
    s.nqn = nqn.to_string();
    Arc::new(s)
}

/// [`test_subsystem`] with namespaces masked: `masks` gives, by nsid, the hosts each is
/// attached to.
#[cfg(test)]
pub(crate) fn test_subsystem_masked(
    namespaces: &[Arc<Namespace>],
    hosts: &[&str],
    masks: &[(u32, &[&str])],
) -> Arc<Subsystem> {
    let mut s = Arc::into_inner(test_subsystem(namespaces, hosts)).unwrap_or_else(|| unreachable!("just built"));
    s.masks = masks
        .iter()
        .map(|(nsid, hosts)| (*nsid, hosts.iter().map(|h| h.to_string()).collect()))
        .collect();
    Arc::new(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nsids<'a>(it: impl Iterator<Item = &'a Arc<Namespace>>) -> Vec<u32> {
        it.map(|n| n.nsid).collect()
    }

    #[test]
    fn a_channel_sees_its_namespace_polling_changes_without_holding_the_namespace() {
        use pollux_reactor::Polling;
        let ns = test_namespace(3, 64);
        let kept = ns.channel_ns();
        assert_eq!(kept.nsid, 3);
        ns.polling.set(Polling::Always);
        assert_eq!(kept.polling.get(), Polling::Always);
        drop(ns);
        // It outlives the namespace: nothing of the subsystem's model is kept.
        assert_eq!(kept.polling.get(), Polling::Always);
    }

    #[test]
    fn a_view_holds_the_namespaces_attached_to_its_host() {
        let nss: Vec<_> = (1..=4).map(|n| test_namespace(n, 8)).collect();
        let s = test_subsystem_masked(&nss, &[], &[(2, &["nqn.a"]), (3, &["nqn.a", "nqn.b"]), (4, &[])]);
        let a = HostView::new(s.clone(), "nqn.a");
        let b = HostView::new(s.clone(), "nqn.b");
        let c = HostView::new(s.clone(), "nqn.c");
        assert_eq!(nsids(a.namespaces()), [1, 2, 3]);
        assert_eq!(nsids(b.namespaces()), [1, 3]);
        assert_eq!(nsids(c.namespaces()), [1]);
        assert!(a.namespace(2).is_some_and(|n| Arc::ptr_eq(n, &nss[1])));
        assert!(b.namespace(2).is_none() && c.namespace(3).is_none());
        // Attached to no host: nobody's, though it is there.
        assert!(a.namespace(4).is_none());
        assert!(s.namespace_ignoring_masks(4).is_some());
        assert_eq!(nsids(s.all_namespaces()), [1, 2, 3, 4]);
        assert_eq!(s.max_nsid(), 4);
        assert_eq!(s.masked_to(1), None);
        assert_eq!(s.masked_to(2).map(|h| h.len()), Some(1));
        // No namespace masked from a host: no bits to test.
        assert!(a.hidden_nsids() == [4] && c.hidden_nsids() == [2, 3, 4]);
        assert!(a.hidden.is_some() && c.hidden.is_some());
        let open = HostView::new(test_subsystem(&nss, &[]), "nqn.c");
        assert!(open.hidden.is_none());
        assert_eq!(nsids(open.namespaces()), [1, 2, 3, 4]);
        // The identity is the subsystem's whoever asks.
        assert_eq!(a.nqn, c.nqn);
        assert!(a.same_as(&HostView::new(s.clone(), "nqn.a")));
        assert!(!a.same_as(&b));
    }
}
