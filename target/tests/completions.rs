//! Every command a queue receives ends in exactly one completion (issue 54): every admin
//! opcode 0x00-0xFF and every I/O opcode, each with every PSDT value, random reserved fields,
//! random SGL descriptors and in-capsule data, sent as raw capsules at full queue depth. The
//! host here is a raw one: it answers R2Ts with data, counts each CapsuleResp against the
//! command ids it has outstanding (a completion for an id not outstanding, a second one, a
//! C2HTermReq or a close fails the test) and, at the end, holds nothing but the AERs the
//! controller may keep (NVMe 2.0 §5.2). The target's own figures must agree: its reactors'
//! open commands are exactly their held AERs.
//!
//! SPDK's `nvme_fuzz` found the need (its admin queue "timed out" against pollux); what it
//! found is in `ci/BENCHMARKS.md` (`ci/bench fuzz` runs it as a standing tool).
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::*;
use pollux_host::{HostQueue, RawReply};
use pollux_nvme::spec::{SglDescriptor, Sqe, opcode};
use pollux_nvme::tcp::PduHeader;
use pollux_target::Target;
use zerocopy::{FromZeros, IntoBytes};

/// xorshift64*: a reproducible stream from a seed (the test prints the seed it used).
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn fill(&mut self, b: &mut [u8]) {
        for c in b.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
    }
}

/// The seeds a test runs: a fixed one, and one from the clock (printed, so that a failure is
/// replayed with `POLLUX_COMPLETIONS_SEED`).
fn seeds() -> Vec<u64> {
    if let Some(s) = std::env::var("POLLUX_COMPLETIONS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        return vec![s];
    }
    let clock = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64);
    vec![0x5eed_0054, clock]
}

/// A random command of `op` with PSDT `psdt`. Half are garbage: every field random but the
/// command id (set when sent), SGL1 of one of the shapes a host may send or garble, and
/// in-capsule data to go with it. Half are plausible: an existing namespace (`nsids`: id and
/// block size), small LBAs and counts, small CDW10 values for admin commands, and an SGL that
/// says the transfer the opcode's direction implies, so that commands reach their handlers
/// and backends.
fn random_command(rng: &mut Rng, op: u8, psdt: u8, nsids: &[(u32, u32)]) -> (Sqe, Vec<u8>) {
    let garbage = rng.below(2) == 0;
    command(rng, op, psdt, nsids, garbage)
}

/// A command of `op` with PSDT `psdt`: garbage, or plausible (see [`random_command`]).
fn command(rng: &mut Rng, op: u8, psdt: u8, nsids: &[(u32, u32)], garbage: bool) -> (Sqe, Vec<u8>) {
    let mut sqe = Sqe::new_zeroed();
    let mut data = Vec::new();
    if garbage {
        rng.fill(sqe.as_mut_bytes());
        sqe.opcode = op;
        // FUSE (bits 9:8) random too: a fused command without its partner ends all the same.
        sqe.set_psdt(psdt);
        match rng.below(6) {
            // A transport data block of a length that may or may not fit the command.
            0 | 1 => {
                let len = [0, 512, 4096, 8192, rng.below(1 << 17) as u32][rng.below(5) as usize];
                sqe.set_sgl(&SglDescriptor::transport_data_block(len));
            }
            // In-capsule data, the SGL saying its length or not.
            2 | 3 => {
                data = vec![0; rng.below(4097) as usize];
                rng.fill(&mut data);
                let said = if rng.below(4) == 0 {
                    rng.below(8192) as u32
                } else {
                    data.len() as u32
                };
                sqe.set_sgl(&SglDescriptor::in_capsule(0, said));
            }
            // Whatever 16 bytes (other descriptor types, keyed, segments, reserved bits).
            _ => {}
        }
    } else {
        sqe.opcode = op;
        sqe.set_psdt(psdt);
        let (nsid, bs) = nsids[rng.below(nsids.len() as u64) as usize];
        sqe.nsid.set([nsid, nsid, 0, u32::MAX][rng.below(4) as usize]);
        let nlb = rng.below(8) as u32;
        // I/O: SLBA in CDW10-11, NLB in CDW12; admin: CNS, LID, FID and the like in CDW10.
        sqe.cdw10
            .set(rng.below(64) as u32 | (((rng.below(4) as u32) << 16) * rng.below(2) as u32));
        sqe.cdw11.set(rng.below(2) as u32);
        sqe.cdw12.set(nlb);
        sqe.cdw13.set(rng.below(4) as u32);
        // Admin commands with the fields their handlers look at in range (NVMe 2.0 §5):
        // Identify's CNS, Get Log Page's LID and NUMDL, a feature identifier.
        match op {
            0x06 => sqe.cdw10.set(rng.below(4) as u32),
            0x02 => sqe
                .cdw10
                .set([0x01, 0x02, 0x03, 0x04, 0x0C, 0x70, 0x80, 0x81][rng.below(8) as usize] | (1023 << 16)),
            0x09 | 0x0A => sqe.cdw10.set(
                [
                    0x01, 0x02, 0x04, 0x05, 0x06, 0x07, 0x08, 0x0B, 0x0F, 0x80, 0x81, 0x82, 0x83,
                ][rng.below(13) as usize],
            ),
            _ => {}
        }
        let len = (nlb + 1) * bs;
        match op & 3 {
            // Host to controller (and bidirectional): in the capsule, or by R2T.
            1 | 3 if rng.below(2) == 0 && len <= 8192 => {
                data = vec![0; len as usize];
                rng.fill(&mut data);
                sqe.set_sgl(&SglDescriptor::in_capsule(0, len));
            }
            1 | 3 => sqe.set_sgl(&SglDescriptor::transport_data_block(len)),
            2 => sqe.set_sgl(&SglDescriptor::transport_data_block(len.max(4096))),
            _ => sqe.set_sgl(&SglDescriptor::transport_data_block(0)),
        }
    }
    // The commands that legitimately end a queue or a controller are kept from doing so:
    // a Disconnect in the only record format (NVMe-oF 1.1 §6.4) closes its I/O queue, and
    // a short Keep Alive Timer (NVMe 2.0 §5.27.1.12) would delete the controller mid-test.
    if op == opcode::FABRICS && sqe.fctype() == opcode::fctype::DISCONNECT && sqe.cdw10.get() as u16 == 0 {
        sqe.cdw10.set(sqe.cdw10.get() | 1);
    }
    if op == 0x09 && sqe.cdw10.get() & 0xFF == 0x0F {
        sqe.cdw11.set(120_000);
    }
    (sqe, data)
}

/// `n` plausible commands of the opcodes `ops` in turn, PSDT 01b (SGL), appended to `cmds`.
fn plausible(rng: &mut Rng, ops: &[u8], n: usize, cmds: &mut Vec<(Sqe, Vec<u8>)>) {
    for i in 0..n {
        let op = ops[i % ops.len()];
        cmds.push(command(
            rng,
            op,
            Sqe::PSDT_SGL_MPTR_CONTIGUOUS,
            &[(1, 512), (2, 4096)],
            false,
        ));
    }
}

/// `cmds` in a random order (Fisher-Yates).
fn shuffle(rng: &mut Rng, cmds: &mut [(Sqe, Vec<u8>)]) {
    for i in (1..cmds.len()).rev() {
        cmds.swap(i, rng.below(i as u64 + 1) as usize);
    }
}

/// What a storm of commands left: the commands still outstanding (id -> opcode).
struct Tally {
    completed: usize,
    /// Of which successful.
    succeeded: usize,
    /// R2Ts answered, C2HData PDUs received.
    r2ts: usize,
    c2hs: usize,
    outstanding: HashMap<u16, u8>,
}

/// Sends `cmds` on `q` as raw capsules, keeping up to `depth` outstanding, and receives
/// until every command ended, or only AERs (opcode 0x0C on the admin queue, `admin`) are
/// left. Any reply that is not the one completion of an outstanding command fails.
fn storm(q: &mut HostQueue, cmds: Vec<(Sqe, Vec<u8>)>, depth: u16, admin: bool, what: &str) -> Tally {
    let mut free: Vec<u16> = (0..depth).rev().collect();
    let mut out: HashMap<u16, u8> = HashMap::new();
    let mut sent: Vec<(u16, u8, u8)> = Vec::new();
    let mut cmds = cmds.into_iter();
    let (mut completed, mut succeeded, mut r2ts, mut c2hs) = (0, 0, 0, 0);
    let is_aer = |op: u8| admin && op == 0x0C;
    let mut fence_sent = false;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let mut batch = Vec::new();
        while let Some(cid) = free.pop() {
            let Some((mut sqe, data)) = cmds.next() else {
                free.push(cid);
                break;
            };
            sqe.cid.set(cid);
            out.insert(cid, sqe.opcode);
            sent.push((cid, sqe.opcode, sqe.psdt()));
            if std::env::var("POLLUX_COMPLETIONS_DEBUG").is_ok() {
                eprintln!("{what}: sent cid {cid} {sqe:?} data {}", data.len());
            }
            batch.extend_from_slice(&q.capsule_pdu(&sqe, &data));
        }
        if !batch.is_empty() {
            q.send_raw(&batch).unwrap();
        }
        if out.values().all(|&op| is_aer(op)) && cmds.len() == 0 && !fence_sent {
            // Only AERs left: one may still be on its way to Limit Exceeded. A Keep Alive
            // sent last is answered after every command before it was (a queue's commands
            // are taken in order), so once it is, what is left is held.
            let cid = free.pop().unwrap();
            let mut ka = Sqe::new_zeroed();
            ka.opcode = 0x18;
            ka.cid.set(cid);
            ka.set_psdt(Sqe::PSDT_SGL_MPTR_CONTIGUOUS);
            ka.set_sgl(&SglDescriptor::transport_data_block(0));
            out.insert(cid, ka.opcode);
            q.send_raw(&q.capsule_pdu(&ka, &[])).unwrap();
            fence_sent = true;
        }
        if fence_sent && out.values().all(|&op| is_aer(op)) {
            eprintln!(
                "{what}: {completed} completions ({succeeded} successful), {r2ts} R2Ts answered, {c2hs} C2HData, {} AERs held",
                out.len()
            );
            return Tally {
                completed,
                succeeded,
                r2ts,
                c2hs,
                outstanding: out,
            };
        }
        assert!(Instant::now() < deadline, "{what}: still waiting after 120 s");
        let reply = q.recv_raw(WAIT).unwrap();
        let last = || sent.iter().rev().take(8).collect::<Vec<_>>();
        match reply {
            RawReply::Pdu {
                hdr: Some(PduHeader::CapsuleResp { cqe }),
                ..
            } => {
                let cid = cqe.cid.get();
                if std::env::var("POLLUX_COMPLETIONS_DEBUG").is_ok() {
                    eprintln!("{what}: cid {cid} opcode {:?} {:?}", out.get(&cid), cqe.status());
                }
                assert!(
                    out.remove(&cid).is_some(),
                    "{what}: a completion for command id {cid}, which is not outstanding ({:?}); last sent (cid, opcode, psdt): {:?}",
                    cqe.status(),
                    last()
                );
                free.push(cid);
                completed += 1;
                succeeded += usize::from(cqe.status().is_success());
            }
            RawReply::Pdu {
                hdr: Some(PduHeader::C2HData {
                    hdr, success, last: l, ..
                }),
                ..
            } => {
                let cid = hdr.cccid.get();
                assert!(
                    out.contains_key(&cid),
                    "{what}: C2HData for command id {cid}, not outstanding"
                );
                // SUCCESS is only set without SQ flow control, which this host keeps.
                assert!(!(success && l), "{what}: C2HData with SUCCESS under SQ flow control");
                c2hs += 1;
            }
            RawReply::Pdu {
                hdr: Some(PduHeader::R2T(r)),
                ..
            } => {
                let cid = r.cccid.get();
                assert!(
                    out.contains_key(&cid),
                    "{what}: R2T for command id {cid}, not outstanding"
                );
                let data = vec![0xA5; r.r2tl.get() as usize];
                let pdu = q.h2c_data_pdu(cid, r.ttag.get(), r.r2to.get(), &data, true);
                q.send_raw(&pdu).unwrap();
                r2ts += 1;
            }
            RawReply::Eof | RawReply::TermReq { .. } | RawReply::Garbage(_) | RawReply::Pdu { .. } => {
                let waiting: Vec<_> = out.iter().collect();
                panic!(
                    "{what}: the target sent {reply:?} with {} commands outstanding {waiting:?}; last sent (cid, opcode, psdt): {:?}",
                    out.len(),
                    last()
                );
            }
        }
    }
}

/// The reactors' figures, summed: (open commands, held AERs).
fn open_and_aers(t: &Target) -> (u64, u64) {
    t.shared().requests.iter().fold((0, 0), |(o, a), r| {
        let s = r.snapshot();
        (o + s.open(), a + s.aers)
    })
}

/// The reactors' figures settle (a completion is counted just after it is queued).
fn settled(t: &Target, want: (u64, u64)) -> (u64, u64) {
    let end = Instant::now() + WAIT;
    loop {
        let got = open_and_aers(t);
        if got == want || Instant::now() >= end {
            return got;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn target(dir: &std::path::Path) -> Target {
    std::fs::create_dir_all(dir).unwrap();
    let namespaces = format!(
        r#"
[[subsystem.namespace]]
nsid = 1
block_size = 512
backend = {{ ram = {{ size = "16MiB" }} }}

[[subsystem.namespace]]
nsid = 2
block_size = 4096
backend = {{ file = {{ path = "{}", size = "16MiB", direct = false }} }}
"#,
        dir.join("ns2.img").display()
    );
    start_text(&conf_with("interrupt", "", NQN, &namespaces))
}

#[test]
fn every_admin_opcode_with_every_psdt_gets_one_completion() {
    let dir = std::env::temp_dir().join(format!("pollux-completions-admin-{}", std::process::id()));
    let t = target(&dir);
    for seed in seeds() {
        eprintln!("admin storm, seed {seed} (POLLUX_COMPLETIONS_SEED={seed} replays it)");
        let mut rng = Rng::new(seed);
        // A controller of its own: a Property Set may disable or shut it down, which ends
        // the I/O queues of its controller (as it must), not this test's others.
        let mut c = controller(addr(&t), 0);
        let mut cmds = Vec::new();
        for round in 0..2 {
            for op in 0..=255u8 {
                for psdt in 0..4 {
                    let _ = round;
                    cmds.push(random_command(&mut rng, op, psdt, &[(1, 512), (2, 4096)]));
                }
            }
        }
        // And plausible admin commands (NVMe 2.0 §5): Identify, Get Log Page, Get and Set
        // Features, Keep Alive, Abort, AERs (the held ones end with the test).
        plausible(&mut rng, &[0x02, 0x06, 0x08, 0x09, 0x0A, 0x0C, 0x18], 1024, &mut cmds);
        // Shuffled: AERs, Aborts and Set Features meet every other opcode.
        shuffle(&mut rng, &mut cmds);
        let n = cmds.len();
        let tally = storm(&mut c.admin, cmds, 31, true, &format!("admin, seed {seed}"));
        let aers = tally.outstanding.len() as u64;
        assert!(aers <= 4, "more AERs held than the AER limit: {:?}", tally.outstanding);
        assert_eq!(
            tally.completed + tally.outstanding.len(),
            n + 1,
            "the commands and the fence"
        );
        assert!(
            tally.succeeded > 0 && tally.c2hs > 0,
            "seed {seed}: {} ok, {} C2H",
            tally.succeeded,
            tally.c2hs
        );
        // The target counts the same: only the AERs are open.
        assert_eq!(settled(&t, (aers, aers)), (aers, aers), "seed {seed}: (open, AERs)");
        // Aborting each held AER completes it, and the Abort (NVMe 2.0 §5.1).
        let mut aborts = Vec::new();
        for (i, cid) in tally.outstanding.keys().enumerate() {
            let mut s = Sqe::new_zeroed();
            s.opcode = 0x08;
            s.cdw10.set(u32::from(*cid) << 16);
            s.cid.set(100 + i as u16);
            s.set_psdt(Sqe::PSDT_SGL_MPTR_CONTIGUOUS);
            aborts.push(c.admin.capsule_pdu(&s, &[]));
        }
        for a in &aborts {
            c.admin.send_raw(a).unwrap();
        }
        for _ in 0..2 * aborts.len() {
            match c.admin.recv_raw(WAIT).unwrap() {
                RawReply::Pdu {
                    hdr: Some(PduHeader::CapsuleResp { .. }),
                    ..
                } => {}
                other => panic!("expected a completion, got {other:?}"),
            }
        }
        assert_eq!(
            settled(&t, (0, 0)),
            (0, 0),
            "seed {seed}: nothing open after the aborts"
        );
        drop(c);
    }
    t.shutdown().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn every_io_opcode_with_every_psdt_gets_one_completion_at_full_depth() {
    let dir = std::env::temp_dir().join(format!("pollux-completions-io-{}", std::process::id()));
    let t = target(&dir);
    for seed in seeds() {
        eprintln!("I/O storm, seed {seed} (POLLUX_COMPLETIONS_SEED={seed} replays it)");
        let mut rng = Rng::new(seed);
        let mut c = controller(addr(&t), 2);
        for (qi, q) in c.io.iter_mut().enumerate() {
            let mut cmds = Vec::new();
            for _ in 0..4 {
                for op in 0..=255u8 {
                    for psdt in 0..4 {
                        cmds.push(random_command(&mut rng, op, psdt, &[(1, 512), (2, 4096)]));
                    }
                }
            }
            // And as many plausible NVM commands (NVMe 2.0 NVM Command Set §3): the data
            // paths, reservations and Copy run beside the refusals at full depth.
            const NVM: [u8; 13] = [
                0x00, 0x01, 0x02, 0x04, 0x05, 0x08, 0x09, 0x0C, 0x0D, 0x0E, 0x11, 0x15, 0x19,
            ];
            plausible(&mut rng, &NVM, 4096, &mut cmds);
            shuffle(&mut rng, &mut cmds);
            let n = cmds.len();
            // 31 of the queue's 32 entries: a host may not have more outstanding (NVMe-oF
            // 1.1 §3.3.1), and this one has that many all along.
            let tally = storm(q, cmds, 31, false, &format!("I/O queue {qi}, seed {seed}"));
            assert!(tally.outstanding.is_empty(), "{:?}", tally.outstanding);
            assert_eq!(tally.completed, n + 1, "the commands and the fence");
            // The storm reached the data paths, not only the refusals.
            assert!(
                tally.succeeded > 0 && tally.r2ts > 0 && tally.c2hs > 0,
                "seed {seed}: {} ok, {} R2T, {} C2H",
                tally.succeeded,
                tally.r2ts,
                tally.c2hs
            );
        }
        assert_eq!(settled(&t, (0, 0)), (0, 0), "seed {seed}: (open, AERs)");
        // The queues still serve.
        let data = pattern(seed, 7, 4096);
        c.io[0].write(1, 7, 8, &data).unwrap();
        let mut back = vec![0; 4096];
        c.io[1].read(1, 7, 8, &mut back).unwrap();
        assert_eq!(back, data);
        c.shutdown().unwrap();
    }
    t.shutdown().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_disconnect_in_another_record_format_is_refused_and_the_queue_stays() {
    let t = start("");
    let mut c = controller(addr(&t), 1);
    // NVMe-oF 1.1 §6.4: RECFMT (CDW10 bits 15:0) 0 is the only format; another is refused
    // with Incompatible Format (SCT 1h, SC 80h), DNR set, and deletes nothing.
    let mut s = pollux_host::sqe::disconnect();
    s.cdw10.set(0x0003);
    s.cid.set(9);
    s.set_psdt(Sqe::PSDT_SGL_MPTR_CONTIGUOUS);
    let pdu = c.io[0].capsule_pdu(&s, &[]);
    c.io[0].send_raw(&pdu).unwrap();
    assert_eq!(expect_resp(&mut c.io[0], 9), (1, 0x80));
    let mut back = vec![1u8; 512];
    c.io[0].read(1, 0, 1, &mut back).unwrap();
    // In the only format, it ends the queue after its completion.
    let q = c.io.pop().unwrap();
    q.disconnect().unwrap();
    c.shutdown().unwrap();
    t.shutdown().unwrap();
}
