//! A verifying workload's history and its checker (the fault campaign, `ci/bench faults`).
//!
//! Every block a writer writes describes itself: the namespace, its LBA, the write's unique
//! id, the writer, and a CRC32C over the rest, so a block read back is known exactly (which
//! write put it there), known misplaced (another block's or namespace's), torn (its bytes
//! from more than one write: NVMe 2.0 §5.2.1 makes one logical block the smallest atomic
//! write unit, AWUN/AWUPF 0's based), or zeroes (never written).
//!
//! The history keeps, per block, the writes that a read could still return, each with its
//! start and end as the host saw them. A read of `[rs, re]` may return a write `w` when `w`
//! started before the read ended and no later write superseded it before the read started:
//! `w2` supersedes `w` when `w2` was acknowledged before `rs` and started after `w` ended.
//! A write whose outcome the host never learnt (the connection dropped, the target was
//! killed) may have landed at any time: it never ends and supersedes nothing. A write the
//! target refused before it took effect (Reservation Conflict, an inactive namespace, an
//! inaccessible ANA group) is removed. After a crash of the target, a namespace whose
//! contents do not survive one (RAM) starts again from zeroes; on one that reports a
//! volatile write cache (Identify Controller VWC), a write acknowledged but covered by no
//! Flush or FUA before the crash supersedes nothing any more (the device may have lost it).

use std::collections::HashMap;
use std::fmt::{self, Write as _};

use pollux_nvme::tcp::crc32c;

/// "plxh" in the upper half of word 0.
const MAGIC: u64 = 0x706C_7868;
const K_FILL: u64 = 0x9E37_79B9_7F4A_7C15;
const K_WORD: u64 = 0xC2B2_AE3D_27D4_EB4F;
/// Bytes before the filler: magic|nsid, LBA, write id, writer|nlb|index.
const HEADER: usize = 32;

/// What one write puts in every block it covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    /// The namespace's tag (the campaign's index of it, not the NSID alone: two subsystems
    /// may both have an NSID 1).
    pub ns: u32,
    /// The write's id: unique over the whole campaign, never 0.
    pub write_id: u64,
    /// The writer (a host of the workload).
    pub writer: u32,
}

fn filler(write_id: u64, lba: u64, i: usize) -> u64 {
    (write_id.wrapping_mul(K_FILL) ^ lba.rotate_left(17)) ^ (i as u64).wrapping_mul(K_WORD)
}

/// Fills `buf` (whole blocks of `block` bytes, `block` a multiple of 8 and at least 64, the
/// first at `lba`) with `stamp`.
pub fn fill(buf: &mut [u8], lba: u64, block: usize, stamp: Stamp) {
    let nlb = buf.len() / block;
    for (k, b) in buf.chunks_exact_mut(block).enumerate() {
        let l = lba + k as u64;
        let head = [
            MAGIC << 32 | u64::from(stamp.ns),
            l,
            stamp.write_id,
            u64::from(stamp.writer) << 32 | (nlb as u64 & 0xFFFF) << 16 | (k as u64 & 0xFFFF),
        ];
        let crc_at = block - 8;
        for (i, w) in b[..crc_at].chunks_exact_mut(8).enumerate() {
            let v = head.get(i).copied().unwrap_or_else(|| filler(stamp.write_id, l, i));
            w.copy_from_slice(&v.to_le_bytes());
        }
        let crc = crc32c(&b[..crc_at]);
        b[crc_at..].copy_from_slice(&u64::from(crc).to_le_bytes());
    }
}

/// What a block read back holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Content {
    /// All zeroes: never written (or deallocated).
    Zeroes,
    /// Exactly what write `write_id` of `writer` put there.
    Written {
        /// The write.
        write_id: u64,
        /// Its writer.
        writer: u32,
    },
    /// A whole, valid block of another place: `ns` and `lba` are where it belongs.
    Misplaced {
        /// The namespace tag it carries.
        ns: u32,
        /// The LBA it carries.
        lba: u64,
        /// The write that put it there.
        write_id: u64,
    },
    /// Bytes of more than one write, or of none: its checksum or its filler is wrong.
    Torn,
}

fn word(b: &[u8], i: usize) -> u64 {
    b.get(i * 8..i * 8 + 8)
        .and_then(|w| w.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

/// Decodes a block read back from `lba` of namespace `ns`.
pub fn decode(b: &[u8], ns: u32, lba: u64) -> Content {
    if b.iter().all(|&x| x == 0) {
        return Content::Zeroes;
    }
    if b.len() < 64 || !b.len().is_multiple_of(8) {
        return Content::Torn;
    }
    let crc_at = b.len() - 8;
    if word(b, crc_at / 8) != u64::from(crc32c(&b[..crc_at])) || word(b, 0) >> 32 != MAGIC {
        return Content::Torn;
    }
    let (bns, blba, id) = (word(b, 0) as u32, word(b, 1), word(b, 2));
    let whole = (HEADER / 8..crc_at / 8).all(|i| word(b, i) == filler(id, blba, i));
    if !whole {
        return Content::Torn;
    }
    if bns != ns || blba != lba {
        return Content::Misplaced {
            ns: bns,
            lba: blba,
            write_id: id,
        };
    }
    Content::Written {
        write_id: id,
        writer: (word(b, 3) >> 32) as u32,
    }
}

/// A time: nanoseconds since the campaign began (one clock for every thread).
pub type Nanos = u64;
/// A write not yet (or never) known to have ended.
const OPEN: Nanos = Nanos::MAX;

/// How a write ended, as the host saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Completed with success; `fua`: with Force Unit Access (durable at once).
    Acked {
        /// FUA was set.
        fua: bool,
    },
    /// Refused before it took effect (the status says the command was not executed).
    Refused,
    /// Unknown: an error status that does not say, a dropped connection, a killed target.
    Unknown,
}

#[derive(Debug, Clone)]
struct Write {
    id: u64,
    writer: u32,
    start: Nanos,
    end: Nanos,
    acked: bool,
    /// When it was made durable (FUA, no volatile cache, or a covering Flush), if yet.
    durable: Option<Nanos>,
    /// Acknowledged, but a crash came before it was durable: it may be gone.
    maybe_lost: bool,
    /// Gone with the memory that held it, in the crash at this time (a RAM namespace): a
    /// read that began before may still have it, one that began after may not.
    gone: Option<Nanos>,
}

impl Write {
    /// Whether it may still be there for a read starting at `rs`.
    fn live_at(&self, rs: Nanos) -> bool {
        self.gone.is_none_or(|g| rs < g)
    }

    /// Whether `self` supersedes `w` for a read starting at `rs`.
    fn supersedes(&self, w_end: Nanos, rs: Nanos) -> bool {
        self.acked && !self.maybe_lost && self.end < rs && self.live_at(rs) && w_end != OPEN && self.start > w_end
    }
}

#[derive(Debug, Clone, Default)]
struct Block {
    /// Writes a read could still return, in start order.
    writes: Vec<Write>,
    /// Superseded writes already forgotten: a read returning one is stale.
    forgotten_upto: u64,
    /// Zeroes superseded for good (an acknowledged, durable write ended before any read
    /// still outstanding began, and was forgotten since).
    zeroes_gone: bool,
}

/// A violation: the first the checker saw is reported with its block's history.
#[derive(Debug, Clone)]
pub struct Violation {
    /// lost, stale, torn, misplaced, phantom.
    pub kind: &'static str,
    /// The namespace tag.
    pub ns: u32,
    /// The block.
    pub lba: u64,
    /// What the read returned, and when it ran.
    pub detail: String,
    /// The block's history as the checker held it.
    pub history: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} block: namespace {} LBA {}: {}\n{}",
            self.kind, self.ns, self.lba, self.detail, self.history
        )
    }
}

/// One namespace's history.
#[derive(Debug)]
pub struct History {
    ns: u32,
    blocks: Vec<Block>,
    /// Identify Controller VWC: writes are durable only once flushed (or FUA).
    volatile_cache: bool,
    /// Its contents survive a crash of the target (file, rbd), or not (RAM).
    survives_crash: bool,
    /// Ids of writes refused, so a read of one (the refusal lied) is told apart.
    refused: HashMap<u64, Nanos>,
    /// The highest write id begun.
    max_id: u64,
    /// Crashes seen (their times).
    crashes: Vec<Nanos>,
}

/// A read's verdict on one block.
pub type Check = Result<(), Violation>;

impl History {
    /// A namespace of `blocks` logical blocks, tagged `ns`, all zeroes.
    pub fn new(ns: u32, blocks: u64, volatile_cache: bool, survives_crash: bool) -> Self {
        Self {
            ns,
            blocks: vec![Block::default(); blocks as usize],
            volatile_cache,
            survives_crash,
            refused: HashMap::new(),
            max_id: 0,
            crashes: Vec::new(),
        }
    }

    /// Logical blocks.
    pub fn len(&self) -> u64 {
        self.blocks.len() as u64
    }

    /// No blocks.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// A write of `nlb` blocks at `lba` with id `id` by `writer` is submitted at `t`.
    pub fn begin_write(&mut self, lba: u64, nlb: u32, id: u64, writer: u32, t: Nanos) {
        self.max_id = self.max_id.max(id);
        for b in self.range(lba, nlb) {
            b.writes.push(Write {
                id,
                writer,
                start: t,
                end: OPEN,
                acked: false,
                durable: None,
                maybe_lost: false,
                gone: None,
            });
        }
    }

    /// Write `id` (of `nlb` blocks at `lba`) ended at `t` with `outcome`.
    pub fn end_write(&mut self, lba: u64, nlb: u32, id: u64, t: Nanos, outcome: Outcome) {
        let vwc = self.volatile_cache;
        if outcome == Outcome::Refused {
            self.refused.insert(id, t);
        }
        for b in self.range(lba, nlb) {
            let Some(i) = b.writes.iter().position(|w| w.id == id) else {
                continue;
            };
            match outcome {
                Outcome::Acked { fua } => {
                    let w = &mut b.writes[i];
                    w.end = t;
                    w.acked = true;
                    if fua || !vwc {
                        w.durable = Some(t);
                    }
                }
                Outcome::Refused => {
                    b.writes.remove(i);
                }
                Outcome::Unknown => {}
            }
        }
    }

    /// A Flush that started at `start` completed with success at `end`: every write
    /// acknowledged before `start` is durable (NVMe 2.0 §7.1 of the NVM Command Set: Flush
    /// commits what was completed before it to non-volatile media).
    pub fn flushed(&mut self, start: Nanos, end: Nanos) {
        if !self.volatile_cache {
            return;
        }
        for b in &mut self.blocks {
            for w in &mut b.writes {
                if w.acked && w.durable.is_none() && w.end <= start {
                    w.durable = Some(end);
                }
            }
        }
    }

    /// The target crashed (was killed) at `t`: what it held in memory only is gone.
    pub fn crashed(&mut self, t: Nanos) {
        self.crashes.push(t);
        for b in &mut self.blocks {
            if !self.survives_crash {
                // Everything is gone for reads that begin from now on; a read in flight may
                // still bring what was there. Zeroes are what a new process serves.
                for w in &mut b.writes {
                    w.gone.get_or_insert(t);
                }
                b.zeroes_gone = false;
                continue;
            }
            for w in &mut b.writes {
                if w.acked && w.durable.is_none_or(|d| d > t) {
                    w.maybe_lost = true;
                }
            }
        }
    }

    /// Forgets what no read starting at or after `watermark` can return: writes superseded
    /// by an acknowledged write that is durable (or on a namespace that loses everything in a
    /// crash anyway) and ended before `watermark`.
    pub fn prune(&mut self, watermark: Nanos) {
        let survives = self.survives_crash;
        for b in &mut self.blocks {
            // Gone in a crash before any read still outstanding began.
            let mut gone = 0u64;
            b.writes.retain(|w| {
                let keep = w.gone.is_none_or(|g| g > watermark);
                if !keep {
                    gone = gone.max(w.id);
                }
                keep
            });
            b.forgotten_upto = b.forgotten_upto.max(gone);
            let Some(last) = b
                .writes
                .iter()
                .filter(|w| {
                    w.acked
                        && !w.maybe_lost
                        && w.gone.is_none()
                        && w.end < watermark
                        && (!survives || w.durable.is_some())
                })
                .max_by_key(|w| w.end)
                .map(|w| w.start)
            else {
                continue;
            };
            let before = b.writes.len();
            let mut dropped = 0u64;
            b.writes.retain(|w| {
                let keep = w.end == OPEN || w.end >= last;
                if !keep {
                    dropped = dropped.max(w.id);
                }
                keep
            });
            if b.writes.len() != before {
                b.forgotten_upto = b.forgotten_upto.max(dropped);
            }
            b.zeroes_gone = true;
        }
    }

    /// Checks one block that a read of `[rs, re]` returned.
    pub fn check(&self, lba: u64, data: &[u8], rs: Nanos, re: Nanos) -> Check {
        let Some(b) = self.blocks.get(lba as usize) else {
            return Err(self.violation("misplaced", lba, format!("a block beyond the namespace ({lba})")));
        };
        let when = format!("read [{}, {}] ns", rs, re);
        match decode(data, self.ns, lba) {
            Content::Torn => Err(self.violation("torn", lba, format!("{when}: a block of more than one write"))),
            Content::Misplaced { ns, lba: at, write_id } => Err(self.violation(
                "misplaced",
                lba,
                format!("{when}: write #{write_id} of namespace {ns} LBA {at}"),
            )),
            Content::Zeroes => {
                let superseded = b.zeroes_gone
                    || b.writes
                        .iter()
                        .any(|w2| w2.acked && !w2.maybe_lost && w2.end < rs && w2.live_at(rs));
                if superseded {
                    Err(self.violation("lost", lba, format!("{when}: zeroes, after an acknowledged write")))
                } else {
                    Ok(())
                }
            }
            Content::Written { write_id, writer } => {
                let Some(w) = b.writes.iter().find(|w| w.id == write_id) else {
                    let kind = if let Some(t) = self.refused.get(&write_id) {
                        return Err(self.violation(
                            "phantom",
                            lba,
                            format!("{when}: write #{write_id} (writer {writer}), which was refused at {t}"),
                        ));
                    } else if write_id > self.max_id {
                        "phantom"
                    } else {
                        "stale"
                    };
                    return Err(self.violation(
                        kind,
                        lba,
                        format!("{when}: write #{write_id} (writer {writer}), superseded and forgotten"),
                    ));
                };
                if w.start >= re {
                    return Err(self.violation(
                        "phantom",
                        lba,
                        format!("{when}: write #{write_id}, which began after the read ended"),
                    ));
                }
                if !w.live_at(rs) {
                    return Err(self.violation(
                        "stale",
                        lba,
                        format!("{when}: write #{write_id} (writer {writer}), gone in a crash before the read began"),
                    ));
                }
                if let Some(w2) = b.writes.iter().find(|w2| w2.supersedes(w.end, rs)) {
                    return Err(self.violation(
                        "stale",
                        lba,
                        format!("{when}: write #{write_id} (writer {writer}), superseded by #{}", w2.id),
                    ));
                }
                Ok(())
            }
        }
    }

    /// The block's history, for a report.
    pub fn describe(&self, lba: u64) -> String {
        let mut s = String::new();
        let Some(b) = self.blocks.get(lba as usize) else {
            return s;
        };
        let _ = writeln!(
            s,
            "  history of namespace {} LBA {lba}: forgotten up to #{}, zeroes {}, crashes at {:?}",
            self.ns,
            b.forgotten_upto,
            if b.zeroes_gone { "gone" } else { "possible" },
            self.crashes
        );
        for w in &b.writes {
            let end = if w.end == OPEN {
                "open".to_string()
            } else {
                w.end.to_string()
            };
            let _ = writeln!(
                s,
                "    #{} writer {} [{} .. {end}] {}{}{}",
                w.id,
                w.writer,
                w.start,
                if w.acked { "acked" } else { "unknown" },
                w.durable.map(|d| format!(", durable at {d}")).unwrap_or_default(),
                match (w.maybe_lost, w.gone) {
                    (_, Some(g)) => format!(", gone in the crash at {g}"),
                    (true, None) => ", maybe lost in a crash".to_string(),
                    (false, None) => String::new(),
                }
            );
        }
        s
    }

    fn violation(&self, kind: &'static str, lba: u64, detail: String) -> Violation {
        Violation {
            kind,
            ns: self.ns,
            lba,
            detail,
            history: self.describe(lba),
        }
    }

    fn range(&mut self, lba: u64, nlb: u32) -> impl Iterator<Item = &mut Block> {
        let from = (lba as usize).min(self.blocks.len());
        let to = (lba as usize).saturating_add(nlb as usize).min(self.blocks.len());
        self.blocks[from..to].iter_mut()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: usize = 512;

    fn block(ns: u32, lba: u64, id: u64) -> Vec<u8> {
        let mut b = vec![0u8; B];
        fill(
            &mut b,
            lba,
            B,
            Stamp {
                ns,
                write_id: id,
                writer: 7,
            },
        );
        b
    }

    #[test]
    fn blocks_describe_themselves() {
        let mut b = vec![0u8; 3 * B];
        fill(
            &mut b,
            10,
            B,
            Stamp {
                ns: 2,
                write_id: 99,
                writer: 7,
            },
        );
        assert_eq!(
            decode(&b[B..2 * B], 2, 11),
            Content::Written {
                write_id: 99,
                writer: 7
            }
        );
        assert_eq!(
            decode(&b[B..2 * B], 2, 12),
            Content::Misplaced {
                ns: 2,
                lba: 11,
                write_id: 99
            }
        );
        assert_eq!(
            decode(&b[B..2 * B], 3, 11),
            Content::Misplaced {
                ns: 2,
                lba: 11,
                write_id: 99
            }
        );
        assert_eq!(decode(&vec![0; B], 2, 11), Content::Zeroes);
        // Half of one write, half of another: torn.
        let mut t = block(2, 11, 5);
        t[256..].copy_from_slice(&block(2, 11, 6)[256..]);
        assert_eq!(decode(&t, 2, 11), Content::Torn);
        let mut t = block(2, 11, 5);
        t[100] ^= 1;
        assert_eq!(decode(&t, 2, 11), Content::Torn);
    }

    #[test]
    fn a_read_sees_the_newest_acknowledged_or_an_overlapping_write() {
        let mut h = History::new(0, 4, false, true);
        h.begin_write(1, 1, 1, 0, 10);
        h.end_write(1, 1, 1, 20, Outcome::Acked { fua: false });
        // Zeroes before the write completed are fine; after, lost.
        assert!(h.check(1, &vec![0; B], 5, 15).is_ok());
        assert_eq!(h.check(1, &vec![0; B], 25, 30).err().map_or("ok", |v| v.kind), "lost");
        h.begin_write(1, 1, 2, 0, 30);
        // In flight: either.
        assert!(h.check(1, &block(0, 1, 1), 31, 35).is_ok());
        assert!(h.check(1, &block(0, 1, 2), 31, 35).is_ok());
        h.end_write(1, 1, 2, 40, Outcome::Acked { fua: false });
        assert_eq!(
            h.check(1, &block(0, 1, 1), 45, 50).err().map_or("ok", |v| v.kind),
            "stale"
        );
        assert!(h.check(1, &block(0, 1, 2), 45, 50).is_ok());
        // A read that started before #2 ended may still return #1.
        assert!(h.check(1, &block(0, 1, 1), 35, 50).is_ok());
        // A write that began after the read ended cannot be in it.
        h.begin_write(1, 1, 3, 0, 60);
        assert_eq!(
            h.check(1, &block(0, 1, 3), 45, 50).err().map_or("ok", |v| v.kind),
            "phantom"
        );
    }

    #[test]
    fn refused_writes_must_not_land_and_unknown_ones_may() {
        let mut h = History::new(0, 4, false, true);
        h.begin_write(0, 2, 1, 0, 10);
        h.end_write(0, 2, 1, 20, Outcome::Refused);
        assert_eq!(
            h.check(0, &block(0, 0, 1), 30, 40).err().map_or("ok", |v| v.kind),
            "phantom"
        );
        assert!(h.check(0, &vec![0; B], 30, 40).is_ok());
        h.begin_write(0, 1, 2, 0, 50);
        h.end_write(0, 1, 2, 60, Outcome::Unknown);
        h.begin_write(0, 1, 3, 0, 70);
        h.end_write(0, 1, 3, 80, Outcome::Acked { fua: false });
        // #2's outcome is unknown: it may land after #3 (it never ended).
        assert!(h.check(0, &block(0, 0, 2), 90, 95).is_ok());
        assert!(h.check(0, &block(0, 0, 3), 90, 95).is_ok());
    }

    #[test]
    fn a_crash_forgets_ram_and_unflushed_writes_behind_a_volatile_cache() {
        let mut ram = History::new(0, 2, false, false);
        ram.begin_write(0, 1, 1, 0, 10);
        ram.end_write(0, 1, 1, 20, Outcome::Acked { fua: false });
        ram.crashed(30);
        // A read in flight across the crash may bring what was there, and not zeroes.
        assert!(ram.check(0, &block(0, 0, 1), 25, 35).is_ok());
        assert_eq!(ram.check(0, &vec![0; B], 25, 35).err().map_or("ok", |v| v.kind), "lost");
        assert!(ram.check(0, &vec![0; B], 40, 50).is_ok());
        ram.prune(40);
        assert_eq!(
            ram.check(0, &block(0, 0, 1), 40, 50).err().map_or("ok", |v| v.kind),
            "stale"
        );

        let mut vwc = History::new(1, 2, true, true);
        vwc.begin_write(0, 1, 1, 0, 10);
        vwc.end_write(0, 1, 1, 20, Outcome::Acked { fua: false });
        vwc.flushed(25, 30);
        vwc.begin_write(0, 1, 2, 0, 40);
        vwc.end_write(0, 1, 2, 50, Outcome::Acked { fua: false });
        assert_eq!(
            vwc.check(0, &block(1, 0, 1), 60, 70).err().map_or("ok", |v| v.kind),
            "stale"
        );
        vwc.crashed(55);
        // #2 was never flushed: the crash may have lost it, #1 was flushed.
        assert!(vwc.check(0, &block(1, 0, 1), 60, 70).is_ok());
        assert!(vwc.check(0, &block(1, 0, 2), 60, 70).is_ok());
        assert_eq!(vwc.check(0, &vec![0; B], 60, 70).err().map_or("ok", |v| v.kind), "lost");

        let mut file = History::new(2, 2, false, true);
        file.begin_write(0, 1, 1, 0, 10);
        file.end_write(0, 1, 1, 20, Outcome::Acked { fua: false });
        file.crashed(30);
        assert_eq!(
            file.check(0, &vec![0; B], 40, 50).err().map_or("ok", |v| v.kind),
            "lost"
        );
    }

    #[test]
    fn pruning_keeps_what_a_read_may_still_return() {
        let mut h = History::new(0, 1, false, true);
        for id in 1..=10u64 {
            h.begin_write(0, 1, id, 0, id * 10);
            h.end_write(0, 1, id, id * 10 + 5, Outcome::Acked { fua: false });
        }
        h.prune(200);
        assert_eq!(h.blocks[0].writes.len(), 1);
        assert!(h.check(0, &block(0, 0, 10), 210, 220).is_ok());
        let e = h.check(0, &block(0, 0, 3), 210, 220).expect_err("a stale block");
        assert_eq!(e.kind, "stale");
        assert_eq!(h.check(0, &vec![0; B], 210, 220).err().map_or("ok", |v| v.kind), "lost");
        assert!(e.to_string().contains("#10 writer 0"), "{e}");
    }
}
