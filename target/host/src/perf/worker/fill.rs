//! `--fill` and `--verify`'s read-back: every I/O unit of a thread's share written once in
//! order before the run, and read back and checked after it.

use std::time::{Duration, Instant};

use super::QState;
use crate::perf::{PerfError, PerfOpts, verify};
use crate::{Completion, HostQueue};

pub(super) struct FillGeometry {
    pub(super) index: usize,
    pub(super) total_queues: usize,
    pub(super) bs: usize,
    pub(super) nlb: u32,
}

/// Commands in flight per queue during --fill (the queues are opened at least this deep).
pub(in crate::perf) const FILL_DEPTH: usize = 16;

/// Largest write of the fill.
const FILL_CHUNK: u32 = 128 * 1024;

/// `--fill`: writes every I/O unit of this thread's share of the range once, in order,
/// `queue_depth` at a time per queue (so reads later touch written memory, not holes).
pub(super) fn fill(
    opts: &PerfOpts,
    queues: &mut [HostQueue],
    qs: &mut [QState],
    max_transfer: u32,
    g: FillGeometry,
) -> Result<(), PerfError> {
    let nq = queues.len();
    // Whole I/O units per write, up to 128 KiB (the pattern is per block, so a write of k
    // units leaves what k single-unit writes would).
    let k = (FILL_CHUNK.min(max_transfer.max(opts.io_size)) / opts.io_size).max(1);
    let chunk = (k * opts.io_size) as usize;
    let depth = queues
        .iter()
        .map(HostQueue::depth)
        .min()
        .unwrap_or(1)
        .clamp(1, FILL_DEPTH);
    let mut pool: Vec<Vec<u8>> = (0..nq * depth).map(|_| vec![0u8; chunk]).collect();
    // [next, end) per queue, relative to the queue's base.
    let mut ranges: Vec<(u64, u64)> = qs
        .iter()
        .enumerate()
        .map(|(i, q)| {
            if opts.verify {
                (0, q.units)
            } else {
                let gq = (g.index * nq + i) as u64;
                let tq = g.total_queues as u64;
                (q.units * gq / tq, q.units * (gq + 1) / tq)
            }
        })
        .collect();
    let mut in_flight = vec![0usize; nq];
    let start = Instant::now();
    let mut last = start;
    loop {
        let mut busy = false;
        for (qi, hq) in queues.iter_mut().enumerate() {
            let q = &mut qs[qi];
            let (next, end) = &mut ranges[qi];
            while in_flight[qi] < depth && *next < *end {
                let Some(mut buf) = pool.pop() else { break };
                let units = (*end - *next).min(u64::from(k));
                buf.resize(units as usize * opts.io_size as usize, 0);
                let slba = (q.base + *next) * u64::from(g.nlb);
                verify::fill(&mut buf, slba, g.bs, 1);
                for u in *next..*next + units {
                    if let Some(gn) = q.gens.get_mut(u as usize) {
                        *gn = 1;
                    }
                }
                let nlb = g.nlb * units as u32;
                *next += units - 1;
                hq.submit_write(opts.nsid, slba, nlb, buf, slba)
                    .map_err(|source| PerfError::Queue {
                        qid: q.qid,
                        ios: 0,
                        source,
                    })?;
                *next += 1;
                in_flight[qi] += 1;
            }
            if in_flight[qi] == 0 {
                continue;
            }
            busy = true;
            let mut failed = None;
            let n = hq
                .poll_completions(None, |c: Completion| {
                    if !c.is_success() && failed.is_none() {
                        failed = Some((c.tag, c.status));
                    }
                    pool.push(c.buf);
                })
                .map_err(|source| PerfError::Queue {
                    qid: q.qid,
                    ios: 0,
                    source,
                })?;
            if let Some((lba, status)) = failed {
                return Err(PerfError::IoFailed {
                    op: "fill write",
                    lba,
                    nlb: g.nlb,
                    qid: q.qid,
                    status,
                });
            }
            in_flight[qi] -= n;
            progressed(n, &mut last, opts.timeout, q.qid, in_flight[qi])?;
        }
        if !busy {
            return Ok(());
        }
    }
}

/// `--verify` after the run: reads back every unit a write of the run completed on, up to
/// `queue_depth` reads in flight per queue, and checks each block against the generation
/// last written there. Returns the blocks checked.
pub(super) fn read_back(
    opts: &PerfOpts,
    queues: &mut [HostQueue],
    qs: &[QState],
    mut pool: Vec<Vec<u8>>,
    bs: usize,
    nlb: u32,
) -> Result<u64, PerfError> {
    let nq = queues.len();
    let depth = opts.queue_depth.min(pool.len() / nq.max(1)).max(1);
    let mut todo: Vec<_> = qs.iter().map(|q| q.written_units().peekable()).collect();
    let mut in_flight = vec![0usize; nq];
    let mut checked = 0u64;
    let mut last = Instant::now();
    loop {
        let mut busy = false;
        for (qi, hq) in queues.iter_mut().enumerate() {
            let q = &qs[qi];
            while in_flight[qi] < depth {
                let Some(&u) = todo[qi].peek() else { break };
                let Some(buf) = pool.pop() else { break };
                todo[qi].next();
                let slba = (q.base + u) * u64::from(nlb);
                hq.submit_read(opts.nsid, slba, nlb, buf, u)
                    .map_err(|source| PerfError::Queue {
                        qid: q.qid,
                        ios: checked,
                        source,
                    })?;
                in_flight[qi] += 1;
            }
            if in_flight[qi] == 0 {
                continue;
            }
            busy = true;
            let mut err = None;
            let n = hq
                .poll_completions(None, |c: Completion| {
                    let u = c.tag;
                    let slba = (q.base + u) * u64::from(nlb);
                    let gen_ = q.gens.get(u as usize).copied().unwrap_or(0);
                    if err.is_none() {
                        if !c.is_success() {
                            err = Some(PerfError::IoFailed {
                                op: "verify read-back",
                                lba: slba,
                                nlb,
                                qid: q.qid,
                                status: c.status,
                            });
                        } else if let Err(m) = verify::check(&c.buf, slba, bs, gen_) {
                            err = Some(PerfError::Verify {
                                lba: m.lba,
                                qid: q.qid,
                                expected_gen: gen_,
                                found: m.found,
                            });
                        } else {
                            checked += u64::from(nlb);
                        }
                    }
                    pool.push(c.buf);
                })
                .map_err(|source| PerfError::Queue {
                    qid: q.qid,
                    ios: checked,
                    source,
                })?;
            if let Some(e) = err {
                return Err(e);
            }
            in_flight[qi] -= n;
            progressed(n, &mut last, opts.timeout, q.qid, in_flight[qi])?;
        }
        if !busy {
            return Ok(checked);
        }
    }
}

/// A poll of queue `qid` completed `n` commands: note the progress, or fail the run when
/// none has come for `timeout` with `in_flight` commands out (a fill's or a read-back's
/// stall, as the measured phase's).
fn progressed(n: usize, last: &mut Instant, timeout: Duration, qid: u16, in_flight: usize) -> Result<(), PerfError> {
    if n > 0 {
        *last = Instant::now();
    } else if last.elapsed() > timeout {
        return Err(PerfError::Stalled {
            qid,
            in_flight,
            waited: last.elapsed(),
        });
    }
    Ok(())
}
