//! What device channels tell their reactor: commands outstanding, completions, and one
//! completion time estimate per (channel, operation class), which the adaptive policy sees as
//! their mean weighted by completions.
//!
//! Why per class: a reactor serves several channels (two namespaces, a RAM-fast one and an
//! 80 us one) and several classes per channel (reads and writes, small and large), and a
//! single "latest estimate" is whichever completed last. What the reactor waits per I/O is the
//! mean of the classes' estimates weighted by their completions in the window,
//! `sum(n_i * e_i) / sum(n_i)`; with it the policy's spinning cost (completions x predicted /
//! window, [`crate::ModePolicy::desired`]) is exactly the sum of every class's waits. A class
//! that completed nothing in a window has no weight in it.
//!
//! The table is a `Vec` with one entry per (channel, class) that ever completed: it grows
//! when a new pair appears and is otherwise updated in place (no allocation per completion).

use std::sync::Arc;
use std::time::Duration;

use crate::adaptive::{SIZE_CLASS_NAMES, SIZE_CLASSES};

/// Identifies a device channel among its reactor's: chosen by the channel's owner, unique on
/// the reactor while the channel lives (pollux-target: the backend's channel key).
pub type ChannelKey = usize;

/// Name of a channel that was never named ([`DeviceLoad::name_channel`]).
const UNNAMED: &str = "?";

/// One (channel, class) of the table.
#[derive(Debug, Clone)]
struct Entry {
    channel: ChannelKey,
    class: usize,
    name: Arc<str>,
    /// The channel's latest estimate for the class, ns (0: none yet).
    estimate_ns: u64,
    /// Completions, cumulative.
    completions: u64,
    /// Completions since the last evaluation (the weight of `estimate_ns` in it).
    window: u64,
    /// Completions in the window the last evaluation closed.
    last_window: u64,
    /// The channel is `never` ([`DeviceLoad::set_quiet`]): its completions are no reason to
    /// spin, so its estimate has no weight in the window's mean.
    quiet: bool,
}

/// One (channel, class) estimate as published in [`crate::ReactorStats::classes`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClassStats {
    /// The channel's name ([`DeviceLoad::name_channel`]; `?` if it has none).
    pub channel: Arc<str>,
    /// The class, as [`crate::LatencyModel::class`] numbers them.
    pub class: usize,
    /// The channel's latest completion time estimate for the class, ns (0: none yet).
    pub estimate_ns: u64,
    /// Completions of the class, cumulative.
    pub completions: u64,
    /// Completions in the last evaluation window: the estimate's weight in `predicted_ns`.
    pub window_completions: u64,
}

impl ClassStats {
    /// A read class (else a write, or a command without data).
    pub fn is_read(&self) -> bool {
        self.class < SIZE_CLASSES
    }

    /// The size class (0: <= 4 KiB ... 4: > 256 KiB).
    pub fn size_class(&self) -> usize {
        self.class % SIZE_CLASSES
    }

    /// The size class's name ("<=4KiB" ... ">256KiB").
    pub fn size_name(&self) -> &'static str {
        SIZE_CLASS_NAMES[self.size_class()]
    }
}

/// What device channels tell their reactor, for the adaptive policy and for visibility.
#[derive(Debug, Clone, Default)]
pub struct DeviceLoad {
    /// Commands outstanding on this reactor's channels.
    pub outstanding: u64,
    /// Completions seen (cumulative).
    pub completions: u64,
    /// Of `completions`, those of `never` channels ([`DeviceLoad::set_quiet`]).
    pub quiet_completions: u64,
    /// The channels set quiet.
    quiet: Vec<ChannelKey>,
    /// The last completion was a quiet channel's.
    pub last_quiet: bool,
    entries: Vec<Entry>,
    names: Vec<(ChannelKey, Arc<str>)>,
    /// The entry that completed last: a channel completes runs of one class, so it is
    /// usually the next one too.
    last_hit: usize,
    /// The smoothed weighted estimate the last evaluation gave, ns (0: none yet).
    smoothed_ns: f64,
}

impl DeviceLoad {
    /// Name channel `channel` in the published per-class list (once, when it opens).
    pub fn name_channel(&mut self, channel: ChannelKey, name: &str) {
        let name: Arc<str> = Arc::from(name);
        for e in self.entries.iter_mut().filter(|e| e.channel == channel) {
            e.name = name.clone();
        }
        match self.names.iter_mut().find(|(k, _)| *k == channel) {
            Some((_, n)) => *n = name,
            None => self.names.push((channel, name)),
        }
    }

    /// Mark `channel` quiet (its namespace is `never`, [`crate::Polling::Never`]) or not:
    /// a quiet channel's completions are counted apart ([`DeviceLoad::quiet_completions`])
    /// and its estimates leave the policy's prediction, so its load alone never makes the
    /// adaptive policy poll or choose hybrid. Called when the setting changes, not per
    /// completion.
    pub fn set_quiet(&mut self, channel: ChannelKey, quiet: bool) {
        for e in self.entries.iter_mut().filter(|e| e.channel == channel) {
            e.quiet = quiet;
        }
        self.quiet.retain(|&k| k != channel);
        if quiet {
            self.quiet.push(channel);
        }
    }

    /// A command of `class` on `channel` completed; `estimate` is the channel's estimate for
    /// the class now (None: it has none, the completion then only counts as a completion).
    pub fn complete(&mut self, channel: ChannelKey, class: usize, estimate: Option<Duration>) {
        self.outstanding = self.outstanding.saturating_sub(1);
        self.completions += 1;
        let i = self.entry(channel, class);
        if let Some(e) = self.entries.get_mut(i) {
            if e.quiet {
                self.quiet_completions += 1;
            }
            self.last_quiet = e.quiet;
            e.completions += 1;
            e.window += 1;
            if let Some(est) = estimate {
                e.estimate_ns = est.as_nanos().min(u128::from(u64::MAX)) as u64;
            }
        }
    }

    /// The index of the entry of (`channel`, `class`), added if it is new.
    fn entry(&mut self, channel: ChannelKey, class: usize) -> usize {
        if let Some(e) = self.entries.get(self.last_hit)
            && e.channel == channel
            && e.class == class
        {
            return self.last_hit;
        }
        let i = match self
            .entries
            .iter()
            .position(|e| e.channel == channel && e.class == class)
        {
            Some(i) => i,
            None => {
                let name = self
                    .names
                    .iter()
                    .find(|(k, _)| *k == channel)
                    .map_or_else(|| Arc::from(UNNAMED), |(_, n)| n.clone());
                let quiet = self.quiet.contains(&channel);
                self.entries.push(Entry {
                    channel,
                    class,
                    name,
                    estimate_ns: 0,
                    completions: 0,
                    window: 0,
                    last_window: 0,
                    quiet,
                });
                self.entries.len() - 1
            }
        };
        self.last_hit = i;
        i
    }

    /// The completion-weighted mean estimate of the window so far: each (channel, class)
    /// estimate weighted by its completions since the last evaluation (None: no completion
    /// of a class with an estimate). Quiet channels' classes are left out.
    pub fn window_mean(&self) -> Option<Duration> {
        let (mut sum, mut n) = (0u128, 0u128);
        for e in self
            .entries
            .iter()
            .filter(|e| e.window > 0 && e.estimate_ns > 0 && !e.quiet)
        {
            sum += u128::from(e.estimate_ns) * u128::from(e.window);
            n += u128::from(e.window);
        }
        (n > 0).then(|| Duration::from_nanos((sum / n).min(u128::from(u64::MAX)) as u64))
    }

    /// Close the window: fold its weighted mean into the smoothed estimate with weight
    /// `ewma` (the first one is taken as it is; a window without completions leaves it as it
    /// was) and start the next window. Returns the smoothed estimate (None: none yet).
    pub fn evaluate(&mut self, ewma: f64) -> Option<Duration> {
        if let Some(m) = self.window_mean() {
            let m = m.as_nanos() as f64;
            if self.smoothed_ns == 0.0 {
                self.smoothed_ns = m;
            }
            self.smoothed_ns += ewma * (m - self.smoothed_ns);
        }
        for e in &mut self.entries {
            e.last_window = e.window;
            e.window = 0;
        }
        self.predicted()
    }

    /// The smoothed completion-weighted estimate of the last evaluation (None: none yet):
    /// what the adaptive policy gets as [`crate::PolicyInputs::predicted`].
    pub fn predicted(&self) -> Option<Duration> {
        (self.smoothed_ns >= 1.0).then(|| Duration::from_nanos(self.smoothed_ns as u64))
    }

    /// Per (channel, class) estimates, in the order they first completed.
    pub fn classes(&self) -> impl ExactSizeIterator<Item = ClassStats> + '_ {
        self.entries.iter().map(|e| ClassStats {
            channel: e.name.clone(),
            class: e.class,
            estimate_ns: e.estimate_ns,
            completions: e.completions,
            window_completions: e.last_window,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adaptive::LatencyModel;

    const US: Duration = Duration::from_micros(1);
    const EWMA: f64 = 0.25;

    fn us(d: Option<Duration>) -> f64 {
        d.map_or(0.0, |d| d.as_secs_f64() * 1e6)
    }

    #[test]
    fn alternating_classes_give_the_weighted_mean_not_the_last_one() {
        let mut l = DeviceLoad::default();
        let (ram, slow) = (1, 2);
        l.name_channel(ram, "ram-fast");
        l.name_channel(slow, "sim-slow");
        let c = LatencyModel::class(true, 4096);
        // Each window: three 10 us completions, then one 80 us: the slow one completes last.
        for _ in 0..50 {
            for _ in 0..3 {
                l.complete(ram, c, Some(10 * US));
            }
            l.complete(slow, c, Some(80 * US));
            assert_eq!(l.window_mean(), Some(Duration::from_nanos(27_500)));
            l.evaluate(EWMA);
        }
        let p = us(l.predicted());
        assert!((p - 27.5).abs() < 0.01, "weighted mean 27.5 us, got {p}");
        // Reads and writes of one channel are separate classes too.
        let mut rw = DeviceLoad::default();
        let (r, w) = (LatencyModel::class(true, 4096), LatencyModel::class(false, 4096));
        for _ in 0..4 {
            rw.complete(7, w, Some(20 * US));
            rw.complete(7, r, Some(100 * US));
            rw.complete(7, w, Some(20 * US));
            rw.complete(7, w, Some(20 * US));
        }
        assert_eq!(rw.evaluate(EWMA), Some(40 * US), "(3 x 20 + 100) / 4");
        let classes: Vec<ClassStats> = rw.classes().collect();
        assert_eq!(classes.len(), 2);
        assert!(!classes[0].is_read() && classes[1].is_read());
        assert_eq!((classes[0].size_class(), classes[0].size_name()), (0, "<=4KiB"));
        assert_eq!((classes[0].completions, classes[0].window_completions), (12, 12));
        assert_eq!((classes[1].estimate_ns, classes[1].window_completions), (100_000, 4));
        assert_eq!(&*classes[0].channel, UNNAMED);
        assert_eq!(rw.outstanding, 0);
        assert_eq!(rw.completions, 16);
    }

    #[test]
    fn an_idle_class_stops_counting() {
        let mut l = DeviceLoad::default();
        let (fast, slow) = (LatencyModel::class(true, 4096), LatencyModel::class(true, 1 << 20));
        for _ in 0..20 {
            l.complete(1, fast, Some(10 * US));
            l.complete(1, slow, Some(90 * US));
            l.evaluate(EWMA);
        }
        assert!((us(l.predicted()) - 50.0).abs() < 0.01);
        // The slow class goes idle: its stale 90 us estimate has no weight any more, and the
        // smoothed value converges on the fast class alone.
        for _ in 0..60 {
            l.complete(1, fast, Some(10 * US));
            l.evaluate(EWMA);
        }
        assert!((us(l.predicted()) - 10.0).abs() < 0.01, "{:?}", l.predicted());
        let slow_entry = l.classes().find(|c| c.class == slow).map(|c| c.window_completions);
        assert_eq!(slow_entry, Some(0));
        // A window with no completion at all keeps the last value (nothing to learn from).
        let before = l.predicted();
        l.evaluate(EWMA);
        assert_eq!(l.predicted(), before);
        assert_eq!(l.window_mean(), None);
    }

    #[test]
    fn no_upward_drift() {
        use crate::adaptive::ModelKind;
        let (a, b) = (LatencyModel::class(true, 4096), LatencyModel::class(false, 65536));
        let (mut fast, mut slow) = (
            LatencyModel::new(ModelKind::Robust),
            LatencyModel::new(ModelKind::Robust),
        );
        let mut l = DeviceLoad::default();
        // Channel 1 completes 10 us reads, seen exactly; channel 2 80 us writes, seen exactly
        // at first and then only after oversleeps (120 us upper bounds), in mixes of varying
        // size whose true weighted mean is constant, every window ending on the slow class.
        let want = (3.0 * 10.0 + 80.0) / 4.0;
        let mut max: f64 = 0.0;
        for k in 0..10_000u32 {
            for _ in 0..(3 * (1 + k % 3)) {
                fast.observe(a, 10 * US, true);
                l.complete(1, a, fast.estimate(a));
            }
            for _ in 0..(1 + k % 3) {
                let (seen, exact) = if k < 64 { (80 * US, true) } else { (120 * US, false) };
                slow.observe(b, seen, exact);
                l.complete(2, b, slow.estimate(b));
            }
            l.evaluate(EWMA);
            max = max.max(us(l.predicted()));
        }
        assert!(max <= want + 0.01, "max {max} us over {want}");
        assert!((us(l.predicted()) - want).abs() < 0.01);
        // The estimates fall: the smoothed value follows them down and stays there.
        for _ in 0..100 {
            l.complete(1, a, Some(5 * US));
            l.complete(2, b, Some(15 * US));
            l.evaluate(EWMA);
        }
        assert!((us(l.predicted()) - 10.0).abs() < 0.01, "{:?}", l.predicted());
    }

    #[test]
    fn a_quiet_channel_has_no_weight_in_the_prediction() {
        let mut l = DeviceLoad::default();
        let c = LatencyModel::class(true, 4096);
        l.set_quiet(2, true);
        for _ in 0..10 {
            l.complete(1, c, Some(5 * US));
            l.complete(2, c, Some(80 * US));
            l.complete(2, c, Some(80 * US));
            l.evaluate(EWMA);
        }
        assert_eq!(l.predicted(), Some(5 * US), "the never channel's 80 us is left out");
        assert_eq!((l.completions, l.quiet_completions), (30, 20));
        // Back to auto: it counts again, entries that exist already included.
        l.set_quiet(2, false);
        l.complete(1, c, Some(5 * US));
        l.complete(2, c, Some(80 * US));
        assert_eq!(l.window_mean(), Some(Duration::from_nanos(42_500)));
        assert_eq!(l.quiet_completions, 20);
    }

    #[test]
    fn completions_without_an_estimate_have_no_weight_and_names_stick() {
        let mut l = DeviceLoad {
            outstanding: 3,
            ..DeviceLoad::default()
        };
        l.complete(4, 0, None);
        assert_eq!(l.window_mean(), None);
        l.complete(4, 0, Some(30 * US));
        l.complete(4, 1, None);
        assert_eq!(l.window_mean(), Some(30 * US));
        assert_eq!(l.outstanding, 0);
        // Named after its first completion: its entries take the name.
        l.name_channel(4, "nvme-0000:01:00.0-q1");
        assert!(l.classes().all(|c| &*c.channel == "nvme-0000:01:00.0-q1"));
        assert_eq!(l.classes().len(), 2);
    }
}
