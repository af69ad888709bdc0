//! Where each completion of an I/O queue not yet known to be handed to the network ends in
//! its transport's stream, oldest first (the SQ accounting of `Queue::sq_overflow`): a ring
//! whose push is a store and two additions, on every completion.

/// The ends, in a ring of a power-of-two size that grows if it must (it never must: no more
/// completions can be unsent than the queue has entries, and it starts at that size).
#[derive(Debug)]
pub(super) struct Unsent {
    ends: Box<[u64]>,
    /// Index of the oldest.
    head: usize,
    len: usize,
}

impl Default for Unsent {
    fn default() -> Self {
        Self::with_capacity(32)
    }
}

impl Unsent {
    /// Room for `n` ends before it grows.
    pub(super) fn with_capacity(n: usize) -> Self {
        Self {
            ends: vec![0; n.max(1).next_power_of_two()].into_boxed_slice(),
            head: 0,
            len: 0,
        }
    }

    /// Completions recorded and not yet dropped by [`Self::drop_sent`].
    #[inline]
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// A completion that ends at stream position `end` was queued.
    #[inline(always)]
    pub(super) fn push(&mut self, end: u64) {
        if self.len == self.ends.len() {
            self.grow();
        }
        let mask = self.ends.len() - 1;
        self.ends[(self.head + self.len) & mask] = end;
        self.len += 1;
    }

    /// Drop the completions whose end is at or before `sent` (the stream position handed to
    /// the network): the host may have them.
    pub(super) fn drop_sent(&mut self, sent: u64) {
        let mask = self.ends.len() - 1;
        while self.len > 0 && self.ends[self.head] <= sent {
            self.head = (self.head + 1) & mask;
            self.len -= 1;
        }
    }

    #[cold]
    fn grow(&mut self) {
        let mut bigger = vec![0; self.ends.len() * 2].into_boxed_slice();
        let mask = self.ends.len() - 1;
        for (i, slot) in bigger.iter_mut().take(self.len).enumerate() {
            *slot = self.ends[(self.head + i) & mask];
        }
        (self.ends, self.head) = (bigger, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ends_drop_oldest_first_across_the_wrap_and_growth() {
        let mut u = Unsent::with_capacity(4);
        for end in [10, 20, 30] {
            u.push(end);
        }
        u.drop_sent(20);
        assert_eq!(u.len(), 1);
        // Wraps: 30 is at index 2, the next go to 3, 0, 1.
        for end in [40, 50, 60] {
            u.push(end);
        }
        assert_eq!(u.len(), 4);
        // Full: grows, keeping the order.
        u.push(70);
        assert_eq!(u.len(), 5);
        u.drop_sent(45);
        assert_eq!(u.len(), 3);
        u.drop_sent(69);
        assert_eq!(u.len(), 1);
        u.drop_sent(u64::MAX);
        assert_eq!(u.len(), 0);
    }
}
