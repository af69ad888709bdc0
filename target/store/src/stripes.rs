//! Logical-block atomicity for namespaces kept in memory (RAM, the simulated SSD), which
//! every reactor reads and writes with plain copies.
//!
//! NVMe 2.0 §2.1.4.1: a write of at most AWUN blocks (0's based: 0 is one block, what
//! pollux reports) is atomic with respect to other commands: a read, or another write,
//! overlapping it sees all of the old data or all of the new, never a mix. Two copies into
//! and out of the same bytes on two cores give exactly that mix (the fault campaign, `ci/bench
//! faults`, found torn 512-byte blocks read while another host wrote them).
//!
//! Each 4 KiB stripe of the disk (a page: no logical block, 512 or 4096 bytes, crosses one)
//! maps to a sequence counter (a table of at most [`MAX_ENTRIES`], stripes wrapping around
//! it, so a namespace of any size costs at most 16 KiB). A writer takes its stripe's counter
//! from even to odd, copies, and makes it even again (the next even number); a reader copies
//! between two loads of the counter and copies again if it was odd or moved (a seqlock, as
//! Linux's `seqcount_t`). A writer holds one counter at a time, for one copy of at most
//! 4 KiB, so writers never wait for each other in a cycle; an operation on whole pages that
//! must exclude readers of all of them at once (punching a hole) takes its counters in table
//! order ([`Stripes::exclusive`]). Readers never block writers, and nothing here sleeps.

use std::sync::atomic::{AtomicU32, Ordering, fence};

/// Bytes per stripe: a page, a multiple of every logical block size pollux serves.
pub const STRIPE: u64 = 4096;
/// Counters per disk at most.
pub const MAX_ENTRIES: usize = 4096;

/// The sequence counters of one disk.
#[derive(Debug)]
pub struct Stripes {
    seq: Box<[AtomicU32]>,
}

impl Stripes {
    /// Counters for a disk of `len` bytes.
    pub fn new(len: u64) -> Self {
        let n = usize::try_from(len.div_ceil(STRIPE))
            .unwrap_or(MAX_ENTRIES)
            .clamp(1, MAX_ENTRIES);
        Self {
            seq: (0..n).map(|_| AtomicU32::new(0)).collect(),
        }
    }

    fn index(&self, stripe: u64) -> usize {
        (stripe % self.seq.len() as u64) as usize
    }

    /// The pieces of `[off, off + len)` that fall in one stripe each: (disk offset, length,
    /// offset into the caller's buffer).
    fn pieces(off: u64, len: usize) -> impl Iterator<Item = (u64, usize, usize)> {
        let end = off + len as u64;
        let mut at = off;
        std::iter::from_fn(move || {
            if at >= end {
                return None;
            }
            let next = ((at / STRIPE + 1) * STRIPE).min(end);
            let piece = (at, (next - at) as usize, (at - off) as usize);
            at = next;
            Some(piece)
        })
    }

    fn lock(seq: &AtomicU32) -> u32 {
        loop {
            let s = seq.load(Ordering::Relaxed);
            if s & 1 == 0
                && seq
                    .compare_exchange_weak(s, s.wrapping_add(1), Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                // The data stores that follow must not be seen before the odd count.
                fence(Ordering::Release);
                return s;
            }
            std::hint::spin_loop();
        }
    }

    /// Writes `[off, off + len)` a stripe at a time: `copy(disk_off, len, buf_off)` for each
    /// piece, with the piece's stripe held against readers and other writers.
    pub fn write(&self, off: u64, len: usize, mut copy: impl FnMut(u64, usize, usize)) {
        for (at, n, from) in Self::pieces(off, len) {
            let seq = &self.seq[self.index(at / STRIPE)];
            let s = Self::lock(seq);
            copy(at, n, from);
            seq.store(s.wrapping_add(2), Ordering::Release);
        }
    }

    /// Reads `[off, off + len)` a stripe at a time: `copy(disk_off, len, buf_off)` for each
    /// piece, again until no writer touched the stripe meanwhile (so `copy` must overwrite
    /// the same bytes of its buffer each time).
    pub fn read(&self, off: u64, len: usize, mut copy: impl FnMut(u64, usize, usize)) {
        for (at, n, to) in Self::pieces(off, len) {
            let seq = &self.seq[self.index(at / STRIPE)];
            loop {
                let s = seq.load(Ordering::Acquire);
                if s & 1 == 1 {
                    std::hint::spin_loop();
                    continue;
                }
                copy(at, n, to);
                // The copy's loads must not be seen after the second count.
                fence(Ordering::Acquire);
                if seq.load(Ordering::Relaxed) == s {
                    break;
                }
            }
        }
    }

    /// Runs `f` once with every stripe of `[off, off + len)` held against readers and
    /// writers (taken in table order, each once, so two of these never wait for each other
    /// in a cycle, and a writer holds one at most).
    pub fn exclusive<R>(&self, off: u64, len: u64, f: impl FnOnce() -> R) -> R {
        let first = off / STRIPE;
        let last = (off + len).div_ceil(STRIPE);
        let n = self.seq.len();
        let mut held: Vec<usize> = if last - first >= n as u64 {
            (0..n).collect()
        } else {
            (first..last).map(|s| self.index(s)).collect()
        };
        held.sort_unstable();
        held.dedup();
        let counts: Vec<u32> = held.iter().map(|&i| Self::lock(&self.seq[i])).collect();
        let r = f();
        for (&i, s) in held.iter().zip(counts) {
            self.seq[i].store(s.wrapping_add(2), Ordering::Release);
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_split_at_stripes() {
        let p: Vec<_> = Stripes::pieces(4000, 5000).collect();
        assert_eq!(p, vec![(4000, 96, 0), (4096, 4096, 96), (8192, 808, 4192)]);
        assert_eq!(Stripes::pieces(8192, 512).collect::<Vec<_>>(), vec![(8192, 512, 0)]);
    }

    #[test]
    fn exclusive_takes_wrapped_counters_once() {
        let s = Stripes::new(2 * STRIPE);
        // Six stripes over a two-entry table: each counter taken once, no self-deadlock.
        assert_eq!(s.exclusive(0, 6 * STRIPE, || 7), 7);
        assert!(s.seq.iter().all(|c| c.load(Ordering::Relaxed) == 2));
    }

    /// Two threads write whole blocks of one value each while a third reads: every block
    /// read is all one value.
    #[test]
    fn readers_never_see_a_mix() {
        use std::sync::Arc;
        use std::sync::atomic::AtomicBool;
        const LEN: usize = 2 * STRIPE as usize;
        struct Disk {
            bytes: Vec<std::sync::atomic::AtomicU8>,
            stripes: Stripes,
        }
        let d = Arc::new(Disk {
            bytes: (0..LEN).map(|_| std::sync::atomic::AtomicU8::new(0)).collect(),
            stripes: Stripes::new(LEN as u64),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let writers: Vec<_> = (1..=2u8)
            .map(|v| {
                let (d, stop) = (Arc::clone(&d), Arc::clone(&stop));
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        d.stripes.write(512, 512, |at, n, _| {
                            for b in &d.bytes[at as usize..at as usize + n] {
                                b.store(v, Ordering::Relaxed);
                            }
                        });
                        std::thread::yield_now();
                    }
                })
            })
            .collect();
        let mut out = [0u8; 512];
        for _ in 0..3_000 {
            d.stripes.read(512, 512, |at, n, to| {
                for (o, b) in out[to..to + n].iter_mut().zip(&d.bytes[at as usize..]) {
                    *o = b.load(Ordering::Relaxed);
                }
            });
            assert!(out.iter().all(|&b| b == out[0]), "a torn block: {:?}", &out[..16]);
        }
        stop.store(true, Ordering::Relaxed);
        for w in writers {
            w.join().unwrap_or_else(|_| panic!("writer panicked"));
        }
    }
}
