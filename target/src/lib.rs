//! pollux: a polled-mode NVMe-over-TCP target.
//!
//! Data path (one direction): socket bytes -> PDU ([`pollux_nvme::tcp`], parsed once by the
//! NVMe/TCP transport, [`tcp`]) -> the NVMe-oF queue ([`queue`]) routes the command ->
//! controller ([`controller`]) or validated NVM command ([`nvm`]) -> the namespace's backend
//! channel on this reactor ([`backend`]) -> the queue's one exit (`Queue::finish`) -> the
//! transport sends CapsuleResp / C2HData. Each connection lives on one reactor for its life;
//! a controller lives on its admin queue's reactor and its I/O queues reach it by message.
//!
//! # Where each spec concept lives (after SPDK's `lib/nvmf`)
//! | concept | module | SPDK |
//! |---|---|---|
//! | An NVMe-oF queue, whatever carries it: routing, Connect and the admin queue's controller on the reactor, authentication, the I/O path, locked operations, reservations, every request's state and its one exit | [`queue`] | `nvmf.c`, `ctrlr.c`, `ctrlr_bdev.c` |
//! | What a queue asks of its transport (send a completion, send data, send a read's data and maybe its completion with it, fetch a command's data, close), in the queue's terms: no namespace, no NVMe/TCP flag; a read's bytes as [`queue::ReadBytes`] | [`queue::Transport`] | `spdk_nvmf_transport_ops` |
//! | The transport the target serves, named once for the layers above the queue (the channels' completions, run-time changes, the control plane, the upgrade reach queues as [`listener::Conn`]) | [`listener::Served`] | |
//! | A request's life: awaiting data, parked behind a lock, held by QoS, submitted, draining; counted per state | [`queue::request`] | `nvmf_tcp_req_state` |
//! | Per-namespace QoS limits: one lock-free budget per namespace shared by every reactor; commands over it held in their queue | [`qos`] | `bdev.c` (QoS) |
//! | NVMe/TCP transport: receive loop and framing, ICReq/ICResp, CapsuleResp, C2HData, R2T, TermReq, digests, TLS (NVMe/TCP 1.0 §3) | [`tcp`] | `tcp.c` |
//! | H2CData after R2T: the NVMe/TCP 1.0 §3.6.2.7 rules, in-place receive | [`tcp::h2c`] | `tcp.c` |
//! | A command's host data while it arrives: its buffer (heap or an SSD's DMA memory), its progress, the per-reactor pool | [`queue::data`] | `spdk_nvmf_request` iovs, transport buffers |
//! | Reactor-local buffer pools whose buffers go back by themselves when dropped (R2T, receive, DMA buffers), the block store's | [`pool`] | `spdk_mempool` (ixy's mempool) |
//! | SGL1 and data direction of a command (NVMe-oF 1.1 §2.3) | [`sgl`] | `nvmf.c` |
//! | Controller state, AER events, keep-alive deadline, subsystem changes (NVMe 2.0 §3, §5.2) | [`controller`] | `ctrlr.c` |
//! | Fabrics commands, Connect checks, I/O queue attach (NVMe-oF 1.1 §3.3, §6) | [`controller::connect`] | `ctrlr.c` |
//! | Admin commands: Identify, Get/Set Features, Keep Alive, AER, Abort (NVMe 2.0 §5) | [`controller::admin`] | `ctrlr.c` |
//! | What a controller command answers: status, completion dwords, data | [`controller::reply`] | `spdk_nvmf_request` rsp |
//! | The commands served, one table per command set (opcode, name, data direction, effects, ONCS/OACS bit): the I/O decoder's opcodes, the Commands Supported and Effects log and Identify's ONCS/OACS derive from it (NVMe 2.0 §5.16.1.6) | [`pollux_nvme::spec::command`] | `g_cmds_and_effect_log_page` |
//! | Properties CAP/VS/CC/CSTS (NVMe-oF 1.1 §6.5-6.6) | [`controller::property`] | `ctrlr.c` |
//! | Log pages (NVMe 2.0 §5.16) | [`controller::log`] | `ctrlr.c` |
//! | Discovery log (NVMe-oF 1.1 §5.3), referrals to other targets | [`controller::discovery`], [`referral`] | `ctrlr_discovery.c` |
//! | NVM commands: SQE -> validated [`nvm::IoCmd`] -> [`backend::BlockOp`] (NVM Command Set 1.0 §3) | [`nvm`] | `ctrlr_bdev.c` |
//! | Reservations: a namespace's state, its persistence, who may do what (NVMe 2.0 §8.19) | [`resv`] | `subsystem.c` (reservations) |
//! | LBA range locks of fused Compare and Write and Copy: a namespace's lock table, and the fences of the writes in flight | [`range_lock`], [`queue::fence`] | `bdev.c` (LBA range lock) |
//! | Backends behind one [`backend::Backend`] / [`backend::Channel`] trait: RAM, simulated SSD, null, file (io_uring), NVMe SSD (VFIO), RBD; a channel is opened for a [`backend::ChannelNs`], the cluster object a store offers for reservations is [`backend::cluster`]; their errors are [`backend::StoreError`] | [`backend`]: the crate `pollux_store` (`target/store/`) | `bdev` + io_channel |
//! | Subsystems, namespaces, hosts: an immutable snapshot swapped whole | [`subsystem`] | `subsystem.c` |
//! | What the running target holds: the snapshot, the conf running, per-reactor counts (connections, closes, requests, queues), the PSKs secure channel concatenation generated | [`shared`] | `spdk_nvmf_tgt` |
//! | Accepting connections and placing them on reactors; what a connection knows of its path | [`listener`], [`path`] | `tcp.c` (acceptor) |
//! | Why a connection closed, counted per reactor | [`close`] | `spdk_nvmf_qpair_disconnect` |
//! | Run-time changes (`pollux ctl` add/remove) and the control plane | [`mutate`], [`control`] | `nvmf_rpc.c` |
//! | Hot upgrade: the handover to a new process, and the versioned state handed over (a connection's [`handover::ConnState`]: the queue's part, [`handover::QueueState`], beside NVMe/TCP's, [`handover::TcpState`]) | [`upgrade`], [`handover`] | |
//! | Gateway groups: membership, fencing (blocklisting), ANA takeover and failback through the cluster | [`gateway`] | ceph-nvmeof's monitor (`NVMeofGwMap.cc`) |
//!
//! # Layers
//! Imports point one way, down (`modcycles.py target/src` finds no circle between the
//! modules); a lower layer that needs something of a higher one is given it (a function, a
//! trait object, a type parameter), never names it:
//! 1. The crates below: `pollux_reactor`, `pollux_nvme` (the spec, NVMe/TCP PDUs and their
//!    constants), `pollux_conf`, `pollux_link`.
//! 2. The block store, the crate `pollux_store` (`target/store/`, here [`backend`]): stores
//!    and their channels, knowing nothing of NVMe-oF, which the compiler checks (the crate
//!    depends on `pollux_nvme`, `pollux_reactor` and `pollux_conf`, never on this one). With
//!    it, below everything here, the [`counter`]s, [`bell`]s and buffer [`pool`]s the
//!    backends use too. A channel gets the little it keeps of its namespace
//!    ([`backend::ChannelNs`]); a store with a cluster offers an object there
//!    ([`backend::cluster`]) and rings a bell when its size changes ([`backend::SIZE_BELL`]),
//!    which the layers above wait on.
//! 3. Leaves: [`error`] (which wraps the store's, [`backend::StoreError`]), [`log`],
//!    [`sgl`], [`ana`], [`latency`], [`close`].
//! 4. What a namespace holds beside its store: [`resv`] (its reservations; the watcher of
//!    those its cluster keeps runs what it is given), [`qos`], [`range_lock`].
//! 5. [`subsystem`]: namespaces, subsystems and their snapshot (where a store comes from at
//!    an upgrade is passed in, [`subsystem::AdoptStore`]); beside it, reading it, [`nvm`],
//!    [`health`], [`referral`].
//! 6. [`shared`]: what the running target holds.
//! 7. [`controller`], [`placement`], [`path`], and [`handover`] (the state an upgrade hands
//!    over, which queues and transports write and read).
//! 8. [`queue`], generic over its transport, and beside it the transport [`tcp`], which
//!    implements [`queue::Transport`] (tcp imports queue, never the other way; queue names
//!    no transport).
//! 9. [`listener`], then [`mutate`] (run-time changes; it holds the upgrade-under-way flag
//!    the upgrade sets, [`mutate::Upgrading`]), then [`resize`].
//! 10. [`upgrade`] (its new process serves the control endpoints through what the control
//!     plane gives it, [`upgrade::new::TakeoverControl`]), then [`gateway`] (which passes its
//!     incarnation to the next process), then [`control`] on top ([`setup`] uses it;
//!     [`check`] stands alone); [`Target`] (this file) wires the layers together.
//!
//! # Where a new thing goes
//! - **A new transport** (RDMA, ...): a type that implements [`queue::Transport`] (its
//!   `run` is the receive loop that hands capsules to `Queue::on_capsule` and data to
//!   `Queue::data_received`; the rest is what the queue sends, a read's data included, which
//!   it sends as it likes, folding the completion in when the queue lets it), and a listener
//!   that accepts its connections as `Queue<ThatTransport>`. The wiring is in
//!   [`listener`], the one place outside [`tcp`] that names the transport served
//!   ([`listener::Served`]): its functions that reach a reactor's queues
//!   ([`listener::deliver`], registered with every reactor's channels;
//!   [`listener::for_each_ctrl`]; [`listener::tend_clustered_reservations`]) look for the
//!   new transport's queues too, as do the two visitors that run a queue's methods on every
//!   queue of a reactor through [`listener::Conn`] (`mutate`'s refresh of its controllers,
//!   `upgrade::reactors::each_conn`). A hot upgrade hands a connection over as its queue's
//!   [`handover::QueueState`] beside its transport's state ([`handover::ConnState`]; a
//!   transport that cannot move its connections says so, `Transport::stays`, and they
//!   close). Nothing in [`queue`], [`controller`] or [`nvm`] changes; `queue`'s unit tests
//!   run it over a mock transport (`queue/tests/mock.rs`).
//! - **A new admin command**: its row in the admin table ([`pollux_nvme::spec::command`]),
//!   its decoding and execution in [`controller::admin`] (pure: a [`controller::reply::Reply`]
//!   or an outcome the queue acts on).
//! - **A new backend**: a file in the store crate (`target/store/src/`) implementing
//!   [`backend::Backend`] (and [`backend::Channel`] if it completes asynchronously), its
//!   line in [`backend::open`], and its errors in [`backend::StoreError`].
//! - **A new I/O command**: its row in the NVM table ([`pollux_nvme::spec::command`]), its
//!   variant in the decoder ([`nvm::Io`], parsed and validated in [`nvm::parse`], mapped to a
//!   [`backend::BlockOp`]), and its executor's arm in the queue's I/O path
//!   (`queue/io.rs`: `execute` and, for a backend completion, `complete`), ending in
//!   `Queue::finish`.
//!
//! The other side, an NVMe/TCP host library for tests and the `pollux perf` load generator,
//! is its own crate, `pollux_host` (`target/host/`); the target's server code never uses it.
//! Both ends share `pollux_link` (`target/link/`): the send queue and the TLS record layer,
//! which [`tcp`] re-exports as [`tcp::sendq`] and [`tcp::tls`]. [`Target`] is the target
//! `pollux perf --target-conf` starts in-process
//! ([`InProcessTarget`](pollux_host::perf::cli::InProcessTarget)).

pub mod ana;
pub mod check;
pub mod close;
pub mod control;
pub mod controller;
pub mod error;
pub mod gateway;
pub mod handover;
pub mod health;
pub mod latency;
pub mod listener;
pub mod log;
pub mod mutate;
pub mod nvm;
pub mod path;
pub mod placement;
pub mod qos;
pub mod queue;
pub mod range_lock;
pub mod referral;
pub mod resize;
pub mod resv;
pub mod setup;
pub mod sgl;
pub mod shared;
pub mod subsystem;
pub mod tcp;
pub mod upgrade;

// The block store is its own crate (pollux-store), which knows nothing of the target: these
// keep the target's paths to it (`crate::backend::ram`, `crate::bell::Bell`, ...).
pub use pollux_store as backend;
pub use pollux_store::{bell, counter, pool};

/// pollux's version (the crate's, `CARGO_PKG_VERSION`).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The commit pollux was built from (`git rev-parse --short HEAD` at build time, with
/// `-dirty` when the tree had changes), or `unknown` when built outside a git checkout.
pub const BUILD_COMMIT: &str = env!("POLLUX_BUILD_COMMIT");

use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pollux_conf::{Config, ReactorMode};
use pollux_reactor::{Mode, PolicyConfig, ReactorConfig, ReactorStats, Runtime, Turnaround};
use tracing::{info, warn};

pub use error::TargetError;
use shared::Shared;
use subsystem::{BoundListener, build_snapshot};

/// How to run the reactors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// Pin reactors to their configured cores (off in tests, which run many targets at once).
    pub pin: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self { pin: true }
    }
}

/// A running target.
#[derive(Debug)]
pub struct Target {
    runtime: Runtime,
    shared: Arc<Shared>,
    /// Notices stores resized by someone else (dropped, it stops).
    resize_watch: bell::BellThread,
    /// Applies other gateways' reservation changes (dropped, it stops).
    resv_watch: bell::BellThread,
    /// This gateway's member thread in its gateway group (dropped, it stops).
    gateway: Option<gateway::Agent>,
}

/// The starting mode and the adaptive policy (if any) of a conf's reactors.
pub(crate) fn modes_of(r: &pollux_conf::Reactors) -> (Mode, Option<PolicyConfig>) {
    let policy = PolicyConfig {
        cpu_budget: r.cpu_budget,
        latency_target: r.latency_target_us.map(|us| Duration::from_nanos((us * 1000.0) as u64)),
        ..PolicyConfig::default()
    };
    match r.mode {
        ReactorMode::Poll => (Mode::Poll, None),
        ReactorMode::Hybrid => (Mode::Hybrid, None),
        ReactorMode::Interrupt => (Mode::Interrupt, None),
        // Start asleep: an idle target costs nothing until load shows up.
        ReactorMode::Adaptive => (Mode::Interrupt, Some(policy)),
    }
}

/// A conf's fixed hybrid wake margin (None: measured) and turnaround rule.
pub(crate) fn hybrid_of(r: &pollux_conf::Reactors) -> (Option<Duration>, Turnaround) {
    // Validated finite and within 0..=1e6 us: the conversion is exact to the nanosecond.
    let margin = r.hybrid_margin_us.map(|us| Duration::from_nanos((us * 1000.0) as u64));
    (margin, r.hybrid_turnaround)
}

impl Target {
    /// Bind the listeners, build the namespaces, start the reactors.
    pub fn start(cfg: &Config, opts: Options) -> Result<Self, TargetError> {
        Self::start_with(cfg, opts, upgrade::new::Inherited::default())
    }

    /// [`Self::start`], taking the listening sockets `inherited` has (a hot upgrade's new
    /// process) instead of binding them, and with its listeners paused if it says so.
    pub fn start_with(
        cfg: &Config,
        opts: Options,
        mut inherited: upgrade::new::Inherited,
    ) -> Result<Self, TargetError> {
        // Room for every connection the conf allows (and the target's own files), made
        // before the reactors run: growing the descriptor table later stalls the reactor
        // that accepts (pollux_reactor::sys::reserve_fd_table). A namespace holds a
        // descriptor too (a RAM or simulated namespace its memfd, a file namespace its
        // file): a conf of 16,384 RAM namespaces needs 16,384 more.
        // A gateway group's reservation objects keep their keys sealed: the key is needed
        // before the first namespace opens its image's.
        if let Some(g) = &cfg.gateway {
            gateway::config::install_sealer(g);
        }
        let stores = cfg
            .subsystems
            .iter()
            .flat_map(|s| &s.namespaces)
            .filter(|n| !matches!(n.backend, pollux_conf::Backend::Null { .. }))
            .count() as u64;
        let want = u64::from(cfg.transport.max_connections) + stores + 256;
        match pollux_reactor::sys::reserve_fd_table(want) {
            Ok(r) if r.limit < want => warn!(
                limit = r.limit,
                max_connections = cfg.transport.max_connections,
                namespace_files = stores,
                "the open file limit (RLIMIT_NOFILE) is below max_connections plus the namespaces' and the target's own files: connections beyond it are refused by accept (EMFILE)"
            ),
            Ok(r) => tracing::debug!(
                limit_before = r.limit_before,
                limit = r.limit,
                table = r.table,
                "descriptor table reserved"
            ),
            Err(e) => {
                warn!(error = %e, "cannot reserve the descriptor table ahead of time: the first connections may stall their reactor as it grows")
            }
        }
        let started = Instant::now();
        let (mode, adaptive) = modes_of(&cfg.reactors);
        let model = cfg.reactors.policy;
        let (hybrid_margin, turnaround) = hybrid_of(&cfg.reactors);
        let n = cfg.reactors.cores.len();
        let mut socks = Vec::new();
        let mut addrs = Vec::new();
        // A gateway group's member serves its own ANA groups non-optimized until it has
        // registered and the group says no survivor serves them (a member killed before it
        // registered could not be fenced: hosts must not have written through it).
        // A hot upgrade's new process goes on as the same member: its states stay as they were.
        let overlay: ana::Overlay = cfg
            .gateway
            .iter()
            .filter(|_| !gateway::continues_member())
            .flat_map(|g| &g.ana_groups)
            .map(|&g| (g, pollux_conf::AnaState::NonOptimized))
            .collect();
        for l in &cfg.listeners {
            let err = |source| TargetError::Listen {
                addr: l.address,
                source,
            };
            let s = match inherited.listeners.remove(&l.address) {
                Some(s) => s,
                None => TcpListener::bind(l.address).map_err(err)?,
            };
            s.set_nonblocking(true).map_err(err)?;
            addrs.push(BoundListener {
                addr: s.local_addr().map_err(err)?,
                configured: l.address,
                tls: l.tls,
                ana: Arc::new({
                    let a = ana::AnaStates::new(l);
                    a.apply_over(l, &overlay);
                    a
                }),
                max_connections: l.max_connections,
            });
            socks.push(s);
        }
        let referrals: Vec<SocketAddr> = cfg.referrals.iter().map(|r| r.address).collect();
        if let Some((referral, listener)) = referral::self_referral(&referrals, &addrs) {
            return Err(TargetError::SelfReferral { referral, listener });
        }
        // A new process of a hot upgrade takes over its predecessor's stores.
        let adopt: subsystem::AdoptStore = upgrade::new::inherited_store;
        let snapshot = build_snapshot(cfg, n, addrs.clone(), adopt)?;
        let shared = Arc::new(Shared::new(cfg, n, snapshot, started, adopt));
        *shared.ana_overlay.lock().unwrap_or_else(|p| p.into_inner()) = overlay;
        let reactors = cfg
            .reactors
            .cores
            .iter()
            .map(|&core| ReactorConfig {
                core: opts.pin.then_some(core),
                mode,
                stall_threshold: Duration::from_micros(cfg.reactors.stall_threshold_us),
                adaptive,
                model,
                hybrid_margin,
                turnaround,
                ..Default::default()
            })
            .collect();
        let pending = Mutex::new(Some(socks));
        let paused = inherited.paused;
        let (sh, placement) = (shared.clone(), cfg.reactors.placement);
        let max_io = cfg.transport.max_io_size;
        let runtime = Runtime::start(
            reactors,
            Arc::new(move |r: &mut pollux_reactor::Reactor| {
                r.set_local(controller::Local::default());
                r.set_local(backend::Channels::new(max_io, listener::deliver));
                r.set_local(queue::data::DataPool::default());
                r.set_local(tcp::RxPool::default());
                if r.id() == 0 {
                    r.set_local(placement::Placer::default());
                    let socks = pending
                        .lock()
                        .map_err(|_| "listener hand-off poisoned")?
                        .take()
                        .unwrap_or_default();
                    for s in socks {
                        let addr = s.local_addr()?;
                        let mut l = listener::Listener::new(s, sh.clone(), placement, started);
                        l.paused = paused;
                        let id = l.register(r)?;
                        let mut set = r.take_local::<mutate::Listeners>().unwrap_or_default();
                        set.by_addr.insert(addr, id);
                        r.set_local(set);
                    }
                }
                Ok(())
            }),
        )?;
        let _ = shared.stats_cells.set(runtime.stats_cells());
        for a in &addrs {
            info!(address = %a.addr, tls = a.tls.as_str(), "listening (NVMe/TCP, discovery and subsystems)");
        }
        let resize_watch = resize::watcher(shared.clone(), runtime.remotes())?;
        let resv_watch = {
            let (shared, remotes) = (shared.clone(), runtime.remotes());
            resv::cluster::watcher(move || listener::tend_clustered_reservations(&shared, &remotes))?
        };
        let gateway = match &cfg.gateway {
            Some(g) => Some(
                gateway::Agent::start(g.clone(), shared.clone(), runtime.remotes()).map_err(|source| {
                    TargetError::Thread {
                        name: "gateway".into(),
                        source,
                    }
                })?,
            ),
            None => None,
        };
        Ok(Self {
            runtime,
            shared,
            resize_watch,
            resv_watch,
            gateway,
        })
    }

    /// The bound listener addresses, in conf order (ports resolved).
    pub fn listen_addrs(&self) -> Vec<SocketAddr> {
        self.shared.snapshot.load().listeners.iter().map(|l| l.addr).collect()
    }

    /// Accounting of every reactor.
    pub fn reactor_stats(&self) -> Vec<ReactorStats> {
        self.runtime.stats()
    }

    /// The reactors (for the control plane: their handles and accounting cells).
    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    /// Pause or resume accepting connections on every listener (those accepted go on; a
    /// paused listener's backlog waits, and is taken when it resumes).
    pub fn pause_listeners(&self, paused: bool) {
        if let Some(r0) = self.runtime.remotes().first() {
            r0.send(move |r| {
                upgrade::reactors::listeners(r, paused);
            });
        }
    }

    /// This gateway's member of its gateway group, if the conf has a `[gateway]`.
    pub fn gateway(&self) -> Option<&gateway::Agent> {
        self.gateway.as_ref()
    }

    /// State shared by the reactors.
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Apply a new configuration without a restart (see [`mutate`]); on error nothing changes.
    pub fn apply(&self, cfg: Config) -> Result<mutate::Changes, TargetError> {
        mutate::reconcile(&self.shared, &self.runtime.remotes(), cfg)
    }

    /// Re-read the conf file the target runs from and apply the difference. An invalid file
    /// changes nothing; the error names file, line and column.
    pub fn reload(&self) -> Result<mutate::Changes, TargetError> {
        mutate::reload(&self.shared, &self.runtime.remotes())
    }

    /// Upgrade to `binary` without downtime ([`upgrade`]): Ok once the new process serves
    /// (end this one with [`upgrade::old::exit_upgraded`]); Err: this one serves on.
    pub fn upgrade(&self, binary: &std::path::Path) -> Result<upgrade::Report, upgrade::UpgradeError> {
        upgrade::old::upgrade(&self.shared, &self.runtime.remotes(), binary)
    }

    /// The running configuration as TOML (it loads back to the same state).
    pub fn running_config(&self) -> String {
        self.shared.config.lock().unwrap_or_else(|p| p.into_inner()).to_toml()
    }

    /// Stop accepting, close every connection, join the reactors.
    pub fn shutdown(self) -> Result<(), TargetError> {
        let before = self.runtime.stats();
        drop(self.gateway);
        drop(self.resize_watch);
        drop(self.resv_watch);
        self.runtime.shutdown()?;
        // The reactors gave their channels back: let go of the stores now rather than
        // whenever the last namespace reference goes. An NVMe controller is shut down
        // (CC.SHN, NVMe 2.0 §3.6.1); an RBD image is closed on a closer thread (it flushes
        // and releases its exclusive lock), waited for below, or the process would exit
        // holding the lock and another gateway's writes would wait for the cluster to time
        // this one's watch out.
        for s in &self.shared.snapshot.load().subsystems {
            for ns in s.all_namespaces() {
                ns.backend.stop();
                // Its cluster connection shuts down before the process exits (librados'
                // threads must not outlive it).
                ns.resv.release_cluster();
            }
        }
        for st in before {
            // Every iteration is booked whole to its mode and to busy or idle (sleep_ns is
            // part of those, not beside them), so either sum is the reactor's wall time.
            let wall: u64 = st.mode_ns.iter().sum::<u64>().max(st.busy_ns + st.idle_ns).max(1);
            info!(
                reactor = st.id,
                mode = %st.mode,
                adaptive = st.adaptive,
                switches = st.switches,
                cpu_pct = format!("{:.1}", 100.0 * st.cpu_ns as f64 / wall as f64),
                poll_pct = format!("{:.1}", 100.0 * st.mode_ns[0] as f64 / wall as f64),
                hybrid_pct = format!("{:.1}", 100.0 * st.mode_ns[1] as f64 / wall as f64),
                interrupt_pct = format!("{:.1}", 100.0 * st.mode_ns[2] as f64 / wall as f64),
                completions = st.completions,
                predicted_us = st.predicted_ns / 1000,
                wakeups = st.wakeups(),
                hot_entries = st.hot_entries,
                hold_entries = st.hold_entries,
                stalls = st.stalls,
                "reactor summary"
            );
        }
        backend::rbd::wait_closed(std::time::Duration::from_secs(30));
        info!("target stopped");
        Ok(())
    }
}

/// `pollux perf --target-conf`: the target it starts in this process.
impl pollux_host::perf::cli::InProcessTarget for Target {
    type Error = TargetError;

    fn start(cfg: &Config, pin: bool) -> Result<Self, TargetError> {
        Target::start(cfg, Options { pin })
    }

    fn listen_addrs(&self) -> Vec<SocketAddr> {
        Target::listen_addrs(self)
    }

    fn reactor_stats(&self) -> Vec<ReactorStats> {
        Target::reactor_stats(self)
    }

    fn shutdown(self) -> Result<(), TargetError> {
        Target::shutdown(self)
    }
}
