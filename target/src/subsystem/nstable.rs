//! A subsystem's namespaces by NSID: found in constant time on every command, and walked in
//! ascending NSID order where the spec lists them (the Active Namespace ID list, NVMe 2.0
//! §5.17.2.2, is "in increasing order").
//!
//! Every I/O command resolves its NSID here (through its host's view), so the lookup is
//! kept to a few instructions: a multiply, a shift, a load and a compare (13 per I/O by
//! callgrind). The `BTreeMap` it replaces took 28 with 1 namespace and 400 with 4,096 (a
//! linear search of each node on the way down). NSIDs may be any of 1..=FFFFFFFEh, so
//! the table is an open-addressed hash table whose hash is the NSID itself while the NSIDs
//! are dense (the usual 1..=N: each sits in slot NSID, no collision, one probe) and
//! Fibonacci hashing otherwise; the longest probe sequence is measured when the table is
//! built, so a miss (an inactive NSID) looks at no more slots than a hit ever needs.

/// What the table keys on.
pub(crate) trait HasNsid {
    fn nsid(&self) -> u32;
}

impl HasNsid for std::sync::Arc<super::Namespace> {
    #[inline(always)]
    fn nsid(&self) -> u32 {
        self.nsid
    }
}

/// 2^64 / the golden ratio: Fibonacci hashing's multiplier, which spreads keys in any
/// arithmetic progression (NSIDs 1000, 2000, ...) evenly over a power-of-two table.
const FIBONACCI: u64 = 0x9E37_79B9_7F4A_7C15;

/// The namespaces of one subsystem by NSID (immutable: a changed subsystem is a new one).
#[derive(Debug)]
pub(crate) struct NsTable<T> {
    /// Every entry, by ascending NSID.
    sorted: Box<[T]>,
    /// The hash table: a power-of-two number of slots, at most half of them used in the
    /// hashed layout.
    slots: Box<[Option<T>]>,
    /// Slot of `nsid`: `(nsid * mult) >> shift`, masked. Dense layout: 1 and 0 (the NSID is
    /// its slot).
    mult: u64,
    shift: u32,
    mask: usize,
    /// The most slots past its home slot any entry sits (0 in the dense layout).
    max_probe: usize,
}

impl<T> Default for NsTable<T> {
    fn default() -> Self {
        Self {
            sorted: Box::default(),
            slots: Box::new([None]),
            mult: 1,
            shift: 0,
            mask: 0,
            max_probe: 0,
        }
    }
}

impl<T: HasNsid + Clone> NsTable<T> {
    /// A table of `entries`, whose NSIDs are unique (the conf's rule); a later duplicate
    /// would never be found.
    pub(crate) fn new(mut entries: Vec<T>) -> Self {
        entries.sort_by_key(HasNsid::nsid);
        let n = entries.len();
        let Some(max) = entries.last().map(HasNsid::nsid) else {
            return Self::default();
        };
        // Dense when a slot per NSID up to the largest takes at most 4 slots per entry
        // (always for 1..=N); else hashed at a load of at most 1/2.
        let direct = (max as usize + 1).next_power_of_two();
        let (len, mult, shift) = if direct <= (4 * n).max(64) {
            (direct, 1, 0)
        } else {
            let len = (2 * n).next_power_of_two().max(2);
            (len, FIBONACCI, 64 - len.trailing_zeros())
        };
        let mut t = Self {
            sorted: Box::default(),
            slots: std::iter::repeat_with(|| None).take(len).collect(),
            mult,
            shift,
            mask: len - 1,
            max_probe: 0,
        };
        for e in &entries {
            let mut i = t.home(e.nsid());
            let mut probe = 0;
            // At most half the slots are used: an empty one is always found.
            while t.slots[i].is_some() {
                i = (i + 1) & t.mask;
                probe += 1;
            }
            t.slots[i] = Some(e.clone());
            t.max_probe = t.max_probe.max(probe);
        }
        t.sorted = entries.into_boxed_slice();
        t
    }
}

impl<T: HasNsid> NsTable<T> {
    #[inline(always)]
    fn home(&self, nsid: u32) -> usize {
        (u64::from(nsid).wrapping_mul(self.mult) >> self.shift) as usize & self.mask
    }

    /// The entry of `nsid` and its slot (for per-slot marks such as a host's masks), in
    /// constant time.
    #[inline(always)]
    pub(crate) fn find(&self, nsid: u32) -> Option<(usize, &T)> {
        let mut i = self.home(nsid);
        for _ in 0..=self.max_probe {
            match self.slots.get(i)? {
                Some(e) if e.nsid() == nsid => return Some((i, e)),
                // Nothing was ever placed past an empty slot on its way.
                None => return None,
                Some(_) => i = (i + 1) & self.mask,
            }
        }
        None
    }

    /// The entry of `nsid`.
    #[inline(always)]
    pub(crate) fn get(&self, nsid: u32) -> Option<&T> {
        self.find(nsid).map(|(_, e)| e)
    }

    /// Every entry by ascending NSID.
    pub(crate) fn iter(&self) -> std::slice::Iter<'_, T> {
        self.sorted.iter()
    }

    /// The entries with an NSID above `nsid`, ascending (CNS 02h starts there): a binary
    /// search for the first.
    pub(crate) fn above(&self, nsid: u32) -> std::slice::Iter<'_, T> {
        let from = self.sorted.partition_point(|e| e.nsid() <= nsid);
        self.sorted[from..].iter()
    }

    /// The largest NSID (None: empty).
    pub(crate) fn max_nsid(&self) -> Option<u32> {
        self.sorted.last().map(HasNsid::nsid)
    }

    /// The number of slots: per-slot marks ([`NsTable::find`]) take an index below it.
    pub(crate) fn slots(&self) -> usize {
        self.slots.len()
    }

    #[cfg(test)]
    fn probes(&self) -> usize {
        self.max_probe
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    impl HasNsid for u32 {
        fn nsid(&self) -> u32 {
            *self
        }
    }

    fn check(ids: &[u32], probes: &[u32]) {
        let t = NsTable::new(ids.to_vec());
        let mut sorted = ids.to_vec();
        sorted.sort_unstable();
        assert_eq!(t.iter().copied().collect::<Vec<_>>(), sorted);
        assert_eq!(t.max_nsid(), sorted.last().copied());
        let mut slots = std::collections::HashSet::new();
        for &id in ids {
            let (slot, e) = t.find(id).unwrap_or_else(|| panic!("nsid {id} not found"));
            assert_eq!(*e, id);
            assert!(
                slot < t.slots() && slots.insert(slot),
                "nsid {id}: slot {slot} reused or out of range"
            );
        }
        for &p in probes {
            assert_eq!(t.get(p).is_some(), ids.contains(&p), "nsid {p}");
        }
        for &p in probes.iter().chain(ids) {
            let want: Vec<u32> = sorted.iter().copied().filter(|&x| x > p).collect();
            assert_eq!(t.above(p).copied().collect::<Vec<_>>(), want, "above {p}");
        }
    }

    #[test]
    fn dense_nsids_sit_in_their_own_slot() {
        let ids: Vec<u32> = (1..=16384).collect();
        let t = NsTable::new(ids.clone());
        assert_eq!(t.probes(), 0, "one probe per lookup");
        assert_eq!((t.mult, t.shift), (1, 0));
        assert!(ids.iter().all(|&i| t.find(i).map(|(s, _)| s) == Some(i as usize)));
        assert!(t.get(0).is_none() && t.get(16385).is_none() && t.get(u32::MAX).is_none());
        // Beyond the table: the slot wraps onto another NSID's, which does not match.
        assert!(t.get(32768 + 5).is_none());
        check(&[1, 2, 3, 7, 100], &[0, 4, 99, 101, 0xFFFF_FFFE, u32::MAX]);
    }

    #[test]
    fn sparse_nsids_are_hashed_with_short_probes() {
        // Arithmetic progressions, the high end of the range and a cluster: what a
        // conf could hold.
        let every_1000: Vec<u32> = (1..=4096).map(|i| i * 1000).collect();
        let high: Vec<u32> = (0..1024).map(|i| 0xFFFF_FFFE - i * 7).collect();
        for ids in [&every_1000, &high] {
            let t = NsTable::new(ids.clone());
            assert_eq!(t.mult, FIBONACCI);
            assert!(t.slots() <= 4 * ids.len(), "{} slots for {}", t.slots(), ids.len());
            assert!(t.probes() <= 8, "longest probe {}", t.probes());
            check(ids, &[0, 1, 999, 1001, 0xFFFF_FFFE, u32::MAX]);
        }
        check(&[5, 0xFFFF_FFFE], &[0, 4, 6, 0xFFFF_FFFD, u32::MAX]);
    }

    #[test]
    fn an_empty_table_finds_nothing() {
        let t: NsTable<u32> = NsTable::new(Vec::new());
        assert!(t.get(0).is_none() && t.get(1).is_none() && t.get(u32::MAX).is_none());
        assert_eq!(t.max_nsid(), None);
        assert_eq!(t.above(0).count(), 0);
        assert_eq!(t.slots(), 1);
    }

    proptest! {
        #[test]
        fn finds_exactly_its_entries(
            ids in prop::collection::hash_set(1u32..=0xFFFF_FFFE, 0..300),
            dense in prop::collection::hash_set(1u32..600, 0..300),
            probes in prop::collection::vec(any::<u32>(), 0..50),
        ) {
            let ids: Vec<u32> = ids.into_iter().collect();
            check(&ids, &probes);
            let dense: Vec<u32> = dense.into_iter().collect();
            check(&dense, &probes);
        }
    }
}
