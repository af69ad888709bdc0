//! Helpers shared by the target tests: confs, an in-process target, a healthy host that keeps
//! doing verified I/O in the background, and raw-PDU expectations.
#![allow(dead_code, clippy::unwrap_used)]

pub mod ceph;

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pollux_conf::Config;
use pollux_host::{Controller, Data, Digests, HostError, HostQueue, QueueOpts, RawReply, sqe};
use pollux_nvme::spec::{SglDescriptor, Sqe, Status};
use pollux_nvme::tcp::PduHeader;
use pollux_target::control::rpc::Ctx;
use pollux_target::{Options, Target};

/// The subsystem every test connects to (any host).
pub const NQN: &str = "nqn.2026-11.io.pollux:test0";
/// A second subsystem, open only to [`OTHER_HOST`].
pub const NQN_PRIVATE: &str = "nqn.2026-11.io.pollux:private";
/// The host the tests are.
pub const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:0c0c0c0c-0000-4000-8000-000000000001";
/// Another host, the only one allowed on [`NQN_PRIVATE`].
pub const OTHER_HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:0c0c0c0c-0000-4000-8000-000000000002";
/// Blocks of the 16 MiB, 512-byte-block namespaces.
pub const BLOCKS: u64 = 32768;
/// How long a test waits for any one reply.
pub const WAIT: Duration = Duration::from_secs(5);

/// A conf: reactors on cores 0 and 1 in `mode`, one listener on 127.0.0.1:0, the `extra`
/// tables (transport, keep_alive, more listeners), [`NQN`] with a 16 MiB namespace and
/// [`NQN_PRIVATE`] with one too.
pub fn conf(mode: &str, extra: &str) -> String {
    let namespaces = format!(
        r#"
[[subsystem.namespace]]
nsid = 1
block_size = 512
backend = {{ ram = {{ size = "16MiB" }} }}

[[subsystem]]
nqn = "{NQN_PRIVATE}"
hosts = ["{OTHER_HOST}"]

[[subsystem.namespace]]
nsid = 1
block_size = 4096
backend = {{ ram = {{ size = "16MiB" }} }}
"#
    );
    conf_with(mode, extra, NQN, &namespaces)
}

/// Starts a target from conf text (unpinned reactors, ports chosen by the OS).
pub fn start_text(text: &str) -> Target {
    let cfg = Config::parse(text, "test.toml").unwrap();
    Target::start(&cfg, Options { pin: false }).unwrap()
}

/// A conf with reactors on cores 0 and 1 in `mode`, one listener on 127.0.0.1:0, the
/// `extra` tables, and subsystem `nqn` (any host) holding the `namespaces` tables.
pub fn conf_with(mode: &str, extra: &str, nqn: &str, namespaces: &str) -> String {
    format!(
        r#"
[reactors]
cores = [0, 1]
mode = "{mode}"

[[listener]]
address = "127.0.0.1:0"

{extra}

[[subsystem]]
nqn = "{nqn}"
allow_any_host = true

{namespaces}
"#
    )
}

/// Writes data of `nlbs` blocks (`block` bytes each) at `slba(k)` on namespace 1 by one
/// queue and reads it back by the other (`c` has two I/O queues); `what` names the case.
pub fn assert_round_trips(
    c: &mut Controller,
    block: usize,
    nlbs: &[u32],
    slba: impl Fn(usize) -> u64,
    seed: u64,
    what: &str,
) {
    for (k, &nlb) in nlbs.iter().enumerate() {
        let lba = slba(k);
        let data = pattern(seed, lba, nlb as usize * block);
        c.io[k % 2].write(1, lba, nlb, &data).unwrap();
        let mut back = vec![0u8; data.len()];
        c.io[(k + 1) % 2].read(1, lba, nlb, &mut back).unwrap();
        assert!(back == data, "{what}: {nlb} blocks at {lba} differ");
    }
}

/// Fills 16 blocks of 512 bytes at `slba` on namespace 1, zeroes the first 8 with Write
/// Zeroes and deallocates the next 8 (Dataset Management): all 16 must read back as zeroes.
pub fn assert_zeroing_reads_zeroes(c: &mut Controller, slba: u64, what: &str) {
    c.io[0].write(1, slba, 16, &[0xEE; 16 * 512]).unwrap();
    c.io[0].write_zeroes(1, slba, 8).unwrap();
    let range = pollux_host::DsmRange {
        cattr: 0,
        nlb: 8,
        slba: slba + 8,
    };
    c.io[1]
        .dataset_management(1, &[range], pollux_host::sqe::DSM_DEALLOCATE)
        .unwrap();
    let mut back = vec![1u8; 16 * 512];
    c.io[0].read(1, slba, 16, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 0), "{what}: zeroed blocks read back non-zero");
}

/// Starts a target with [`conf`] in interrupt mode.
/// A target started from `text` and an in-process control context on it, as `pollux ctl`
/// would reach it.
pub fn start_with_ctx(text: &str) -> (Target, Ctx) {
    let t = start_text(text);
    let cfg = Config::parse(text, "test.toml").unwrap();
    let ctx = Ctx::new(&t, &cfg.reactors);
    (t, ctx)
}

/// The `nvme_devices` view of (fake) device `name`.
pub fn nvme_device(ctx: &Ctx, name: &str) -> serde_json::Value {
    let v = ctx.call("nvme_devices", &serde_json::Value::Null).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("no device {name} in {v}"))
}

pub fn start(extra: &str) -> Target {
    start_text(&conf("interrupt", extra))
}

/// The first listener.
pub fn addr(t: &Target) -> SocketAddr {
    t.listen_addrs()[0]
}

/// A deterministic pattern for `len` bytes at `lba`, varied by `seed`.
pub fn pattern(seed: u64, lba: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ lba.wrapping_mul(0xC2B2_AE3D_27D4_EB4F) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// An enabled controller on [`NQN`] with `io` I/O queues of 32 entries.
pub fn controller(addr: SocketAddr, io: u16) -> Controller {
    Controller::connect(addr, NQN, HOST, io, 32, Digests::NONE).unwrap()
}

/// A queue with ICReq/ICResp done (no Connect), for raw PDUs.
pub fn raw_queue(addr: SocketAddr, hdgst: bool, ddgst: bool) -> HostQueue {
    HostQueue::initialized(addr, QueueOpts::admin(NQN, HOST).digests(hdgst, ddgst)).unwrap()
}

/// Reads the next PDU and expects a C2HTermReq with `fes` (and `fei` when given), then EOF.
/// Returns the offending header the target echoed.
pub fn expect_term(q: &mut HostQueue, fes: u16, fei: Option<u32>) -> Vec<u8> {
    let offending = match q.recv_raw(WAIT).unwrap() {
        RawReply::TermReq {
            fes: f,
            fei: i,
            offending,
        } => {
            assert_eq!(f, fes, "FES (FEI {i})");
            if let Some(fei) = fei {
                assert_eq!(i, fei, "FEI");
            }
            offending
        }
        other => panic!("expected C2HTermReq FES {fes:#x}, got {other:?}"),
    };
    expect_eof(q);
    offending
}

/// The target closes the connection (within [`WAIT`]).
pub fn expect_eof(q: &mut HostQueue) {
    match q.recv_raw(WAIT) {
        Ok(RawReply::Eof) | Err(HostError::Closed) => {}
        other => panic!("expected EOF, got {other:?}"),
    }
}

/// Sends a write of `len` bytes at `slba` (512-byte blocks) on namespace 1 with a transport
/// SGL (no in-capsule data), CID `cid`, and returns the TTAG of the target's R2T for it.
pub fn r2t_write(q: &mut HostQueue, cid: u16, slba: u64, len: u32) -> u16 {
    let mut s = sqe::write(1, slba, len / 512);
    s.cid.set(cid);
    s.set_psdt(Sqe::PSDT_SGL_MPTR_CONTIGUOUS);
    s.set_sgl(&SglDescriptor::transport_data_block(len));
    let pdu = q.capsule_pdu(&s, &[]);
    q.send_raw(&pdu).unwrap();
    match q.recv_raw(WAIT).unwrap() {
        RawReply::Pdu {
            hdr: Some(PduHeader::R2T(r)),
            ..
        } => {
            assert_eq!((r.cccid.get(), r.r2to.get(), r.r2tl.get()), (cid, 0, len));
            r.ttag.get()
        }
        other => panic!("expected R2T, got {other:?}"),
    }
}

/// Sends a 4 KiB read of LBA `slba` on namespace 1 with CID `cid` and a transport SGL,
/// without waiting for it (to abort it while it runs, say); returns when it was sent.
pub fn send_read(q: &mut HostQueue, cid: u16, slba: u64) -> Instant {
    let mut s = sqe::read(1, slba, 8);
    s.cid.set(cid);
    s.set_psdt(Sqe::PSDT_SGL_MPTR_CONTIGUOUS);
    s.set_sgl(&SglDescriptor::transport_data_block(4096));
    let sent = Instant::now();
    let pdu = q.capsule_pdu(&s, &[]);
    q.send_raw(&pdu).unwrap();
    sent
}

/// Aborts a 4 KiB read of LBA 0 while its backend serves it (the backend must take longer
/// than 50 ms per read): the Abort says aborted, the read completes with Command Aborted
/// Requested within `within` of its submission, a second Abort finds nothing, and the queue
/// then reads LBA 8 (zeroes).
pub fn assert_abort_of_running_read(c: &mut Controller, within: Duration) {
    let sent = send_read(&mut c.io[0], 42, 0);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(c.admin.abort(1, 42).unwrap() & 1, 0, "Abort dw0 bit 0: 0 = aborted");
    assert_eq!(expect_resp(&mut c.io[0], 42), (0, 0x07), "Command Aborted Requested");
    let took = sent.elapsed();
    assert!(took < within, "the aborted read completed after {took:?}");
    assert_eq!(c.admin.abort(1, 42).unwrap() & 1, 1, "nothing of it is left to abort");
    let mut back = vec![1u8; 4096];
    c.io[0].read(1, 8, 8, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 0));
}

/// Reads the next PDU and expects the CapsuleResp of `cid`; returns its (SCT, SC).
pub fn expect_resp(q: &mut HostQueue, cid: u16) -> (u8, u8) {
    match q.recv_raw(WAIT).unwrap() {
        RawReply::Pdu {
            hdr: Some(PduHeader::CapsuleResp { cqe }),
            ..
        } => {
            assert_eq!(cqe.cid.get(), cid);
            code(cqe.status())
        }
        other => panic!("expected a CapsuleResp for CID {cid}, got {other:?}"),
    }
}

/// Sends `bytes` cut at the offsets `cuts`, pausing after each piece so that the target
/// reads it on its own: a PDU header arrives before (most of) its data.
pub fn send_in_pieces(q: &mut HostQueue, bytes: &[u8], cuts: &[usize]) {
    let mut at = 0;
    for &cut in cuts.iter().chain([&bytes.len()]) {
        q.send_raw(&bytes[at..cut]).unwrap();
        at = cut;
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// (SCT, SC) of a status, ignoring DNR/More.
pub fn code(s: Status) -> (u8, u8) {
    (s.sct(), s.sc())
}

/// (SCT, SC) of a failed command.
pub fn err_code(r: Result<(), HostError>) -> (u8, u8) {
    match r {
        Err(e) => code(e.status().unwrap_or_else(|| panic!("expected an NVMe status, got {e}"))),
        Ok(()) => panic!("expected an error status, got success"),
    }
}

/// A host doing verified I/O (write a pattern, read it back, compare) on its own controller
/// and LBA range, in a thread, until finished.
pub struct Healthy {
    stop: Arc<AtomicBool>,
    rounds: Arc<AtomicU64>,
    handle: Option<JoinHandle<Result<(), String>>>,
}

impl Healthy {
    /// Starts on [`NQN`] namespace 1, LBAs `first_lba..first_lba + 64`.
    pub fn start(addr: SocketAddr, first_lba: u64) -> Self {
        Self::start_on(addr, NQN, HOST, first_lba)
    }

    /// Starts on `subnqn` as `hostnqn`.
    pub fn start_on(addr: SocketAddr, subnqn: &str, hostnqn: &str, first_lba: u64) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let rounds = Arc::new(AtomicU64::new(0));
        let (s, r) = (stop.clone(), rounds.clone());
        let (subnqn, hostnqn) = (subnqn.to_string(), hostnqn.to_string());
        let handle = std::thread::spawn(move || -> Result<(), String> {
            let mut c =
                Controller::connect(addr, &subnqn, &hostnqn, 1, 32, Digests::NONE).map_err(|e| e.to_string())?;
            let bs = c.admin.identify_namespace(1).map_err(|e| e.to_string())?.block_size as usize;
            let q = &mut c.io[0];
            let mut back = vec![0u8; 8 * bs];
            let mut i = 0u64;
            while !s.load(Relaxed) {
                let lba = first_lba + (i % 8) * 8;
                let nlb = (i % 8 + 1) as u32;
                let len = nlb as usize * bs;
                let data = pattern(i, lba, len);
                q.write(1, lba, nlb, &data).map_err(|e| format!("write {i}: {e}"))?;
                q.read(1, lba, nlb, &mut back[..len])
                    .map_err(|e| format!("read {i}: {e}"))?;
                if back[..len] != data[..] {
                    return Err(format!("round {i}: data read back differs from data written"));
                }
                i += 1;
                r.store(i, Relaxed);
                std::thread::sleep(Duration::from_millis(1));
            }
            c.shutdown().map_err(|e| e.to_string())
        });
        Self {
            stop,
            rounds,
            handle: Some(handle),
        }
    }

    /// Waits until `n` more rounds completed (panics after [`WAIT`], reporting the thread's
    /// error if it stopped).
    pub fn progress(&mut self, n: u64) {
        let start = self.rounds.load(Relaxed);
        let t0 = Instant::now();
        while self.rounds.load(Relaxed) < start + n {
            if self.handle.as_ref().is_some_and(|h| h.is_finished()) {
                let r = self.handle.take().map(|h| h.join());
                panic!("the healthy host stopped: {r:?}");
            }
            assert!(t0.elapsed() < WAIT, "the healthy host made no progress for {WAIT:?}");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Stops and checks the host never saw an error; returns its rounds.
    pub fn finish(mut self) -> u64 {
        self.stop.store(true, Relaxed);
        let h = self.handle.take().unwrap();
        h.join().unwrap().unwrap();
        self.rounds.load(Relaxed)
    }
}

impl Drop for Healthy {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
    }
}

/// Submit `cmds` together (a fused pair, say) and wait for all: their statuses, in order.
pub fn run_all(q: &mut HostQueue, cmds: Vec<(Sqe, Data)>) -> Vec<Status> {
    let mut cids = Vec::new();
    for (s, d) in cmds {
        cids.push(q.submit(s, d, 0).unwrap());
    }
    let mut got: Vec<Option<Status>> = vec![None; cids.len()];
    let deadline = Instant::now() + WAIT;
    while got.iter().any(Option::is_none) {
        assert!(Instant::now() < deadline, "completions did not come");
        q.poll_completions(Some(Duration::from_millis(100)), |c| {
            if let Some(i) = cids.iter().position(|&x| x == c.cid) {
                got[i] = Some(c.status);
            }
        })
        .unwrap();
    }
    got.into_iter().map(Option::unwrap).collect()
}

/// A fused Compare and Write of `nlb` blocks at `slba` of namespace `nsid`: the statuses of
/// the Compare and of the Write.
pub fn caw(q: &mut HostQueue, nsid: u32, slba: u64, nlb: u32, expect: &[u8], new: &[u8]) -> (Status, Status) {
    let (c, w) = sqe::compare_and_write(nsid, slba, nlb);
    let s = run_all(
        q,
        vec![(c, Data::ToCtrl(expect.to_vec())), (w, Data::ToCtrl(new.to_vec()))],
    );
    (s[0], s[1])
}

/// The next DH-HMAC-CHAP message on `q` (Authentication Receive), which must be
/// AUTH_Failure1 with `reason`.
#[track_caller]
pub fn expect_auth_failure(q: &mut HostQueue, reason: pollux_nvme::auth::msg::Reason) {
    use pollux_nvme::auth::msg::{Message, Reason};
    let m = Message::parse(&q.auth_receive(pollux_host::RECEIVE_LEN).unwrap()).unwrap();
    match m {
        Message::Failure {
            from_host: false,
            explanation,
            ..
        } => assert_eq!(Reason::from_code(explanation), Some(reason), "{m:?}"),
        other => panic!("expected AUTH_Failure1 ({reason:?}), got {other:?}"),
    }
}

/// The pollux binary (`bin`, the test crate's `CARGO_BIN_EXE_pollux`) serving conf `text`,
/// written to `path`, listening on `addr` once this returns. Without a control socket
/// (`-r none`) unless the conf names one: a test never takes the machine's default one.
pub fn spawn_pollux(bin: &str, path: &Path, text: &str, addr: SocketAddr) -> Child {
    std::fs::write(path, text).unwrap();
    let mut cmd = Command::new(bin);
    cmd.arg("--config").arg(path);
    if !text.contains("[control]") {
        cmd.args(["--control-socket", "none"]);
    }
    let child = cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < deadline, "pollux did not listen on {addr}");
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

/// A `pollux --config` process with a control socket, as an operator runs it: [`Spawned::ctl`]
/// runs `pollux ctl` on its socket. Dropped, SIGTERM goes to whichever process serves the
/// socket then (after `ctl upgrade`, a successor) and the first is waited for.
pub struct Spawned {
    first: Child,
    /// Its control socket.
    pub sock: PathBuf,
    /// Its conf file.
    pub conf: PathBuf,
    bin: &'static str,
}

impl Spawned {
    /// `bin` serving `text`, written to `conf` (whose `[control] socket` is `sock`), with
    /// `RUST_LOG=level` and its stderr to `log` (None: discarded); once the socket accepts.
    pub fn start(bin: &'static str, conf: &Path, text: &str, sock: &Path, log: Option<&Path>, level: &str) -> Self {
        Self::start_with(bin, conf, text, sock, log, level, &[])
    }

    /// [`Spawned::start`] with more command-line arguments.
    pub fn start_with(
        bin: &'static str,
        conf: &Path,
        text: &str,
        sock: &Path,
        log: Option<&Path>,
        level: &str,
        args: &[&str],
    ) -> Self {
        std::fs::write(conf, text).unwrap();
        let stderr = match log {
            Some(p) => Stdio::from(std::fs::File::create(p).unwrap()),
            None => Stdio::null(),
        };
        let first = Command::new(bin)
            .arg("--config")
            .arg(conf)
            .args(args)
            .env("RUST_LOG", level)
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap();
        let t0 = Instant::now();
        while std::os::unix::net::UnixStream::connect(sock).is_err() {
            assert!(t0.elapsed() < Duration::from_secs(20), "pollux did not open its socket");
            std::thread::sleep(Duration::from_millis(50));
        }
        Self {
            first,
            sock: sock.to_path_buf(),
            conf: conf.to_path_buf(),
            bin,
        }
    }

    /// `pollux ctl --socket SOCK ARGS`.
    pub fn ctl(&self, args: &[&str]) -> Output {
        Command::new(self.bin)
            .arg("ctl")
            .arg("--socket")
            .arg(&self.sock)
            .args(args)
            .output()
            .unwrap()
    }

    /// The pid of the process serving the socket now (`ctl --json version`).
    pub fn pid(&self) -> Option<i64> {
        let o = self.ctl(&["--json", "version"]);
        serde_json::from_slice::<serde_json::Value>(&o.stdout).ok()?["pid"].as_i64()
    }

    /// The process this started (after an upgrade it has exited).
    pub fn first(&mut self) -> &mut Child {
        &mut self.first
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        if let Some(pid) = self.pid() {
            // SAFETY: kill(2) of the pollux process this test started (or its successor).
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        }
        let t0 = Instant::now();
        while matches!(self.first.try_wait(), Ok(None)) && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.first.kill();
        let _ = self.first.wait();
    }
}
