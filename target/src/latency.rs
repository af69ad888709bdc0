//! Per-namespace completion latency histograms, kept per reactor without a lock or an
//! allocation on the I/O path: quarter-octave buckets (each power of two of nanoseconds cut in
//! four, so a bucket's bounds are within 25 % of each other) as atomics that only their
//! reactor writes (a relaxed load and store, no locked instruction), summed by the control
//! thread when it reads them. `/metrics` exports them as Prometheus histograms at octave
//! bounds, `pollux ctl subsystems` as p50 and p99.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::counter::bump;

/// Sub-buckets per octave: `1 << SUB_BITS`.
const SUB_BITS: u32 = 2;
const SUBS: usize = 1 << SUB_BITS;
/// The highest octave kept apart: `2^40` ns (about 18 minutes); longer ones share the last
/// bucket.
const MAX_OCTAVE: u32 = 40;
/// Buckets: one per value below `SUBS`, then `SUBS` per octave from `SUB_BITS` to
/// `MAX_OCTAVE`, then the overflow bucket.
pub const BUCKETS: usize = SUBS + (MAX_OCTAVE - SUB_BITS + 1) as usize * SUBS + 1;

/// The bucket of a latency of `ns` nanoseconds: a count of leading zeros, a shift and a mask.
#[inline(always)]
pub fn bucket(ns: u64) -> usize {
    if ns < SUBS as u64 {
        return ns as usize;
    }
    let k = 63 - ns.leading_zeros();
    if k > MAX_OCTAVE {
        return BUCKETS - 1;
    }
    let sub = (ns >> (k - SUB_BITS)) as usize & (SUBS - 1);
    SUBS + (k - SUB_BITS) as usize * SUBS + sub
}

/// The exclusive upper bound, in ns, of bucket `i` (u64::MAX for the overflow bucket).
pub fn upper_ns(i: usize) -> u64 {
    if i < SUBS {
        return i as u64 + 1;
    }
    if i >= BUCKETS - 1 {
        return u64::MAX;
    }
    let k = (i - SUBS) / SUBS + SUB_BITS as usize;
    let sub = ((i - SUBS) % SUBS) as u64;
    (SUBS as u64 + sub + 1) << (k - SUB_BITS as usize)
}

/// The bounds `/metrics` reports (`le`), in ns: every octave from 1.024 us to 17.2 s. They
/// are bucket bounds, so each cumulative count is exact.
pub const EXPORT_OCTAVES: std::ops::RangeInclusive<u32> = 10..=34;

/// One reactor's histogram of one kind of command on one namespace.
#[derive(Debug)]
pub struct LatencyHistogram {
    buckets: [AtomicU64; BUCKETS],
    /// The sum of every latency recorded, ns.
    sum_ns: AtomicU64,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_ns: AtomicU64::new(0),
        }
    }
}

impl LatencyHistogram {
    /// Record a completion `ns` after its command arrived. Only the owning reactor calls it.
    #[inline(always)]
    pub fn record(&self, ns: u64) {
        bump(&self.buckets[bucket(ns)], 1);
        bump(&self.sum_ns, ns);
    }

    /// Add this histogram's counts to `into`.
    pub fn add_to(&self, into: &mut Latencies) {
        for (a, b) in into.counts.iter_mut().zip(&self.buckets) {
            *a += b.load(Relaxed);
        }
        into.sum_ns += self.sum_ns.load(Relaxed);
    }
}

/// Histograms summed over reactors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Latencies {
    /// Per-bucket counts.
    pub counts: Vec<u64>,
    /// The sum of the latencies, ns.
    pub sum_ns: u64,
}

impl Default for Latencies {
    fn default() -> Self {
        Self {
            counts: vec![0; BUCKETS],
            sum_ns: 0,
        }
    }
}

impl Latencies {
    /// Completions recorded.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The `q` quantile (0..=1), as the upper bound of its bucket, ns; 0 when empty.
    pub fn quantile_ns(&self, q: f64) -> u64 {
        let n = self.count();
        if n == 0 {
            return 0;
        }
        // The rank of the quantile, 1-based: at least the first completion.
        let rank = ((q * n as f64).ceil() as u64).clamp(1, n);
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return upper_ns(i);
            }
        }
        u64::MAX
    }

    /// Counts at the exported octave bounds, cumulative: `(le_ns, completions below it)`.
    pub fn cumulative(&self) -> Vec<(u64, u64)> {
        EXPORT_OCTAVES
            .map(|k| {
                let le = 1u64 << k;
                let below = (0..BUCKETS)
                    .take_while(|&i| upper_ns(i) <= le)
                    .map(|i| self.counts[i])
                    .sum();
                (le, below)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_every_value_in_order_within_a_quarter_octave() {
        let mut last = 0;
        for v in (0..5000u64).chain([1 << 20, (1 << 20) + 1, 3 << 30, u64::MAX / 2, u64::MAX]) {
            let i = bucket(v);
            assert!(i < BUCKETS, "{v}");
            assert!(i >= last || v >= 5000, "{v}: bucket {i} before {last}");
            last = i;
            assert!(
                v < upper_ns(i) || i == BUCKETS - 1,
                "{v} not below the upper bound {} of {i}",
                upper_ns(i)
            );
            if i > 0 && i < BUCKETS - 1 {
                assert!(v >= upper_ns(i - 1), "{v} below bucket {i}'s lower bound");
                // Quarter-octave: the upper bound is at most 25 % above the value.
                assert!(
                    upper_ns(i) as f64 <= (v.max(4) as f64) * 1.25 + 1.0,
                    "{v}: {}",
                    upper_ns(i)
                );
            }
        }
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn quantiles_and_cumulative_counts() {
        let (h, mut all) = (LatencyHistogram::default(), Latencies::default());
        // 98 completions at 10 us, 2 at 5 ms.
        for _ in 0..98 {
            h.record(10_000);
        }
        h.record(5_000_000);
        h.record(5_000_000);
        h.add_to(&mut all);
        assert_eq!(all.count(), 100);
        assert_eq!(all.sum_ns, 98 * 10_000 + 2 * 5_000_000);
        let p50 = all.quantile_ns(0.5);
        assert!((10_000..=12_500).contains(&p50), "{p50}");
        let p99 = all.quantile_ns(0.99);
        assert!((5_000_000..=6_250_000).contains(&p99), "{p99}");
        let cum = all.cumulative();
        assert_eq!(cum.first(), Some(&(1024, 0)));
        assert_eq!(cum.iter().find(|(le, _)| *le == 16_384), Some(&(16_384, 98)));
        assert_eq!(cum.last(), Some(&(1 << 34, 100)));
        assert!(cum.windows(2).all(|w| w[0].1 <= w[1].1));
        assert_eq!(Latencies::default().quantile_ns(0.99), 0);
    }

    /// The I/O path's cost: a bucket and two relaxed adds, a few ns (checked loosely, so that
    /// a slow or busy CI machine does not fail it; run with `--nocapture` for the figure).
    #[test]
    fn recording_costs_a_few_nanoseconds() {
        let h = LatencyHistogram::default();
        let n = 2_000_000u64;
        let t = std::time::Instant::now();
        for i in 0..n {
            h.record(std::hint::black_box(i.wrapping_mul(7919) % 10_000_000));
        }
        let per = t.elapsed().as_nanos() as f64 / n as f64;
        let mut all = Latencies::default();
        h.add_to(&mut all);
        assert_eq!(all.count(), n);
        tracing::info!(ns_per_record = per, "latency histogram update");
        assert!(per < 200.0, "{per} ns per record");
    }
}
