//! A transport that records what the queue sends and lets a test feed capsules and data,
//! and a one-reactor harness that runs an I/O queue over it.

use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, MutexGuard, mpsc};
use std::time::{Duration, Instant};

use pollux_nvme::spec::{Cqe, Sqe, Status};
use pollux_nvme::tls::PskIdentity;
use pollux_reactor::{Progress, Reactor, ReactorConfig, Remote, Runtime, SourceId, SourceOpts};

use super::super::request::ReqState;
use super::super::{IoQueue, Queue, ReadBytes, Role, Sq, Transport, deliver};
use crate::backend::sim::{LatencyDist, SimDisk, SimParams};
use crate::backend::{Channels, RamDisk};
use crate::close::CloseReason;
use crate::path::Path;
use crate::shared::test_shared;
use crate::subsystem::{HostView, Namespace, Snapshot, test_namespace, test_subsystem};

/// The host NQN the harness's queue was connected by.
pub const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:mock-host";

/// What the queue had its transport send, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sent {
    /// A completion.
    Completion {
        cid: u16,
        status: Status,
        sqhd: u16,
        dw0: u32,
    },
    /// A controller command's data.
    Data { cid: u16, bytes: Vec<u8> },
    /// A read's data; `folded`: its completion went with it; `in_place`: the bytes were
    /// offered where they lie.
    Read {
        cid: u16,
        bytes: Vec<u8>,
        folded: bool,
        in_place: bool,
    },
    /// A request for a command's data, to come under `tag`.
    Fetch { cid: u16, tag: u16, len: u32 },
    /// The connection ends for a fault of the protocol.
    Terminated(String),
    /// The connection closed.
    Closed,
}

/// The mock's wire: what was sent and how much of it the network took.
#[derive(Debug, Default)]
pub struct Wire {
    /// Everything sent, oldest first (tests take it).
    pub sent: Vec<Sent>,
    /// Bytes queued in the stream (a completion counts 16 bytes, data its length).
    pub stream: u64,
    /// Bytes the network took.
    pub taken: u64,
    /// The host reads nothing: a flush hands nothing to the network.
    pub stalled: bool,
    /// The transport never folds a read's completion into its data.
    pub never_folds: bool,
}

/// A transport that records (see [`Wire`]).
pub struct MockTransport {
    wire: Arc<Mutex<Wire>>,
}

fn lock(w: &Mutex<Wire>) -> MutexGuard<'_, Wire> {
    w.lock().unwrap_or_else(|p| p.into_inner())
}

impl MockTransport {
    fn push(&self, s: Sent, bytes: u64) {
        let mut w = lock(&self.wire);
        w.sent.push(s);
        w.stream += bytes;
    }
}

impl Transport for MockTransport {
    const NAME: &'static str = "mock-transport";

    fn run(q: &mut Queue<Self>, r: &mut Reactor, id: SourceId) -> Progress {
        // Nothing to receive: the test feeds the queue. Completions delivered by a channel
        // are flushed here, as a transport does on its next run.
        q.flush_or_close(r, id);
        Progress::IDLE
    }

    fn peer(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 2], 50000))
    }

    fn local(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 4420))
    }

    fn tls_identity(&self) -> Option<&PskIdentity> {
        None
    }

    fn setup_pending(&self) -> Option<(&'static str, CloseReason)> {
        None
    }

    fn send_completion(&mut self, cqe: &Cqe) {
        let s = Sent::Completion {
            cid: cqe.cid.get(),
            status: cqe.status(),
            sqhd: cqe.sqhd.get(),
            dw0: cqe.dw0.get(),
        };
        self.push(s, 16);
    }

    fn send_data(&mut self, cid: u16, data: &[u8]) {
        let n = data.len() as u64;
        self.push(
            Sent::Data {
                cid,
                bytes: data.to_vec(),
            },
            n,
        );
    }

    fn send_read(&mut self, cid: u16, data: ReadBytes<'_>, fold: bool) -> bool {
        let mut bytes = Vec::new();
        data.append_to(&mut bytes);
        let folded = fold && !lock(&self.wire).never_folds;
        let n = bytes.len() as u64;
        let in_place = data.fixed().is_some();
        self.push(
            Sent::Read {
                cid,
                bytes,
                folded,
                in_place,
            },
            n,
        );
        folded
    }

    fn fetch_data(&mut self, cid: u16, tag: u16, len: u32) {
        self.push(Sent::Fetch { cid, tag, len }, 0);
    }

    fn stream_end(&self) -> u64 {
        lock(&self.wire).stream
    }

    fn sent_total(&self) -> u64 {
        lock(&self.wire).taken
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let mut w = lock(&self.wire);
        if !w.stalled {
            w.taken = w.stream;
        }
        Ok(())
    }

    fn terminate(&mut self, why: &CloseReason) {
        self.push(Sent::Terminated(why.to_string()), 0);
    }

    fn close(&mut self) {
        self.push(Sent::Closed, 0);
    }

    fn stays(&self) -> Option<&'static str> {
        None
    }

    fn busy(&self) -> Option<&'static str> {
        None
    }
}

/// The queue a harness runs.
pub type MockQueue = Queue<MockTransport>;

/// One reactor running one I/O queue (qid 1, of controller 1, connected by [`HOST`]) over a
/// [`MockTransport`], its subsystem's namespaces given.
pub struct Harness {
    rt: Option<Runtime>,
    remote: Remote,
    /// The queue's source on the reactor.
    pub id: SourceId,
    /// What the queue sent.
    pub wire: Arc<Mutex<Wire>>,
}

/// How long a harness waits for the reactor.
const WAIT: Duration = Duration::from_secs(10);

impl Harness {
    /// An I/O queue of `entries` entries over namespaces `nss`; `flow_off`: SQ flow control
    /// disabled at Connect.
    pub fn new(nss: &[Arc<Namespace>], entries: u32, flow_off: bool) -> Self {
        let shared = Arc::new(test_shared(1));
        let sub = test_subsystem(nss, &[]);
        // The running snapshot holds the subsystem too: a released QoS-held command checks
        // its namespace there.
        let was = shared.snapshot.load_full();
        shared.snapshot.store(Arc::new(Snapshot::new(
            vec![sub.clone()],
            was.listeners.clone(),
            was.genctr + 1,
            was.discovery.clone(),
            was.referrals.clone(),
        )));
        let max_io = shared.transport.max_io_size;
        let rt = Runtime::start(
            vec![ReactorConfig::default()],
            Arc::new(move |r: &mut Reactor| {
                r.set_local(crate::controller::Local::default());
                r.set_local(Channels::new(max_io, deliver::<MockTransport>));
                r.set_local(super::super::data::DataPool::default());
                Ok(())
            }),
        )
        .unwrap_or_else(|e| panic!("a reactor starts: {e}"));
        let remote = rt.remote(0).unwrap_or_else(|| panic!("reactor 0"));
        let wire = Arc::new(Mutex::new(Wire::default()));
        let (tx, rx) = mpsc::channel();
        let (w, sh) = (wire.clone(), shared.clone());
        remote.send(move |r| {
            let t = MockTransport { wire: w };
            let mut q = Queue::new(t, sh.clone(), 0, 1, Instant::now(), Path::default());
            q.role = Role::Io(IoQueue {
                cntlid: 1,
                owner: 0,
                subsys: HostView::new(sub, HOST),
                hostnqn: HOST.into(),
                hostid: [1; 16],
            });
            q.sq = Sq {
                qid: 1,
                entries,
                head: 0,
                flow_off,
            };
            q.unsent = super::super::unsent::Unsent::with_capacity(entries as usize);
            sh.conns_per_reactor[0].fetch_add(1, Relaxed);
            q.listener_open.fetch_add(1, Relaxed);
            let id = r
                .add_source(Box::new(q), SourceOpts::timed())
                .unwrap_or_else(|e| panic!("the queue's source: {e}"));
            let _ = tx.send(id);
        });
        let id = rx
            .recv_timeout(WAIT)
            .unwrap_or_else(|e| panic!("the queue starts: {e}"));
        Self {
            rt: Some(rt),
            remote,
            id,
            wire,
        }
    }

    /// Run `f` on the queue, on its reactor; None when the queue is gone (closed).
    pub fn on<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut MockQueue, &mut Reactor, SourceId) -> R + Send + 'static,
    ) -> Option<R> {
        let (tx, rx) = mpsc::channel();
        let id = self.id;
        self.remote.send(move |r| {
            let _ = tx.send(r.with_source::<MockQueue, _>(id, |q, r| f(q, r, id)));
        });
        rx.recv_timeout(WAIT)
            .unwrap_or_else(|e| panic!("the reactor answers: {e}"))
    }

    /// A command capsule arrives (`data`: in-capsule), and the transport flushes after it.
    pub fn capsule(&self, sqe: Sqe, data: &[u8]) {
        self.capsule_digest(sqe, data, true);
    }

    /// [`Self::capsule`] with the transport's digest over its data good or not.
    pub fn capsule_digest(&self, sqe: Sqe, data: &[u8], digest_ok: bool) {
        let data = data.to_vec();
        self.on(move |q, r, id| {
            q.on_capsule(r, id, &sqe, &data, digest_ok);
            if !q.closed {
                q.flush_or_close(r, id);
            }
        });
    }

    /// `bytes` of the data fetched under `tag` for command `cid` arrive, as a transport puts
    /// them: into the request's buffer after what came before, then the queue is told.
    /// Whether the tag named a request of that command (a transport's fault otherwise).
    pub fn data(&self, tag: u16, cid: u16, bytes: &[u8]) -> bool {
        self.data_digest(tag, cid, bytes, true)
    }

    /// [`Self::data`] with the transport's digest over the bytes good or not.
    pub fn data_digest(&self, tag: u16, cid: u16, bytes: &[u8], digest_ok: bool) -> bool {
        let bytes = bytes.to_vec();
        self.on(move |q, r, id| {
            let Some((slot, progress)) = q.reqs.fetch_target(usize::from(tag), cid) else {
                return false;
            };
            if progress.received as usize + bytes.len() > progress.len as usize {
                return false;
            }
            if let Some(req) = q.reqs.get_mut(slot)
                && let ReqState::AwaitingData { buf, .. } = &mut req.state
            {
                buf.place(progress.received, &bytes);
            }
            q.data_received(r, id, slot, bytes.len() as u32, digest_ok);
            if !q.closed {
                q.flush_or_close(r, id);
            }
            true
        })
        .unwrap_or(false)
    }

    /// Take what was sent so far.
    pub fn sent(&self) -> Vec<Sent> {
        std::mem::take(&mut lock(&self.wire).sent)
    }

    /// The wire, to look at or to change (stall the host, refuse folding).
    pub fn wire(&self) -> MutexGuard<'_, Wire> {
        lock(&self.wire)
    }

    /// Wait until `n` things were sent (a channel completes on its own time); take them.
    pub fn wait_sent(&self, n: usize) -> Vec<Sent> {
        let until = Instant::now() + WAIT;
        loop {
            if lock(&self.wire).sent.len() >= n {
                return self.sent();
            }
            assert!(
                Instant::now() < until,
                "{n} sends awaited; sent: {:?}",
                lock(&self.wire).sent
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// The request states of the queue by command id, lowest slot first.
    pub fn states(&self) -> Vec<(u16, crate::queue::request::ReqKind)> {
        self.on(|q, _, _| {
            (0..64)
                .filter_map(|s| q.reqs.get_mut(s).map(|r| (r.cid, r.state.kind())))
                .collect()
        })
        .unwrap_or_default()
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            let _ = rt.shutdown();
        }
    }
}

/// A RAM namespace `nsid` of `blocks` 512-byte blocks, its reads and writes run inline.
pub fn ram(nsid: u32, blocks: u64) -> Arc<Namespace> {
    test_namespace(nsid, blocks)
}

/// A simulated SSD namespace: RAM data, every command completing `us` microseconds after it
/// was submitted, through its channel (a request is Submitted meanwhile).
pub fn sim(nsid: u32, blocks: u64, us: f64) -> Arc<Namespace> {
    let mut ns = Arc::into_inner(test_namespace(nsid, blocks)).unwrap_or_else(|| unreachable!("just built"));
    let data = RamDisk::new(blocks << 9).unwrap_or_else(|e| panic!("{e}"));
    ns.backend = Box::new(SimDisk {
        data,
        params: SimParams {
            read: LatencyDist::Fixed(us),
            write: LatencyDist::Fixed(us),
            per_kib_us: 0.0,
            parallelism: 64,
            bandwidth: None,
            interrupt_delay: Duration::ZERO,
            coalesce_count: 1,
            coalesce_time: Duration::ZERO,
            seed: 1,
        },
    });
    ns.inline_reads = false;
    Arc::new(ns)
}

/// The null backend's namespace: reads are zeroes, never written memory.
pub fn null(nsid: u32, blocks: u64) -> Arc<Namespace> {
    let mut ns = Arc::into_inner(test_namespace(nsid, blocks)).unwrap_or_else(|| unreachable!("just built"));
    ns.backend = Box::new(crate::backend::null::NullDisk::new(blocks << 9).unwrap_or_else(|e| panic!("{e}")));
    Arc::new(ns)
}
