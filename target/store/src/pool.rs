//! Buffers that go home by themselves: a reactor-local pool ([`Pool`]) lends its buffers as
//! [`Pooled`] values, each of which carries a handle to its pool and gives itself back when
//! it is dropped, as ixy's packet buffers return to their mempool. Whatever path a buffer
//! leaves by (a write run, an Abort, a data digest error, a connection closed mid-write, a
//! channel completion), it is back in its pool without a hand-written return on that path.
//!
//! A pool is reactor-local (one thread): `Rc` and `RefCell`, no lock and no atomic on the
//! I/O path. A buffer holds a `Weak` handle, so a buffer that outlives its pool (the
//! reactor is stopping) is simply freed. What a pool keeps, and how much of it, is its
//! [`Shelf`]'s business: each keeps the bound it had.

use std::cell::RefCell;
use std::fmt;
use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};
use std::rc::{Rc, Weak};

/// What a pool keeps and its bound: the policy of one kind of pool.
pub trait Shelf: 'static {
    /// The buffers it keeps.
    type Item;
    /// Keep `item` for reuse, or drop (free) it when the shelf is at its bound.
    fn keep(&mut self, item: Self::Item);
}

/// A reactor-local pool of buffers. Cloning it clones the handle, not the buffers.
pub struct Pool<S>(Rc<RefCell<S>>);

impl<S> Clone for Pool<S> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<S: Shelf + Default> Default for Pool<S> {
    fn default() -> Self {
        Self::new(S::default())
    }
}

impl<S: Shelf + fmt::Debug> fmt::Debug for Pool<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.try_borrow() {
            Ok(s) => f.debug_tuple("Pool").field(&*s).finish(),
            Err(_) => f.write_str("Pool(<in use>)"),
        }
    }
}

impl<S: Shelf> Pool<S> {
    /// A pool keeping what `shelf` keeps.
    pub fn new(shelf: S) -> Self {
        Self(Rc::new(RefCell::new(shelf)))
    }

    /// Run `f` on the shelf (to take from it, or to look at it). None only if the shelf is
    /// already in use further up this thread's stack, which a shelf's own code never causes.
    pub fn with<R>(&self, f: impl FnOnce(&mut S) -> R) -> Option<R> {
        self.0.try_borrow_mut().ok().map(|mut s| f(&mut s))
    }

    /// Lend `item`: it comes back to this pool when dropped.
    pub fn lend(&self, item: S::Item) -> Pooled<S> {
        Pooled {
            item: ManuallyDrop::new(item),
            home: self.home(),
        }
    }

    /// A handle that gives buffers back to this pool while it exists, for an owner that keeps
    /// a buffer of its own (a connection's receive buffer) rather than a [`Pooled`] one.
    pub fn home(&self) -> Home<S> {
        Home(Rc::downgrade(&self.0))
    }
}

/// A weak handle to a pool: what a lent buffer goes back to.
pub struct Home<S>(Weak<RefCell<S>>);

impl<S> Default for Home<S> {
    /// No pool: what is given to it is freed.
    fn default() -> Self {
        Self(Weak::new())
    }
}

impl<S> Clone for Home<S> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<S> fmt::Debug for Home<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.strong_count() > 0 {
            "Home(pool)"
        } else {
            "Home(none)"
        })
    }
}

impl<S: Shelf> Home<S> {
    /// Give `item` back to the pool, or free it when the pool is gone (the reactor stops).
    pub fn keep(&self, item: S::Item) {
        if let Some(pool) = self.0.upgrade()
            && let Ok(mut shelf) = pool.try_borrow_mut()
        {
            shelf.keep(item);
        }
    }

    /// Run `f` on the pool's shelf, if the pool still exists.
    pub fn with<R>(&self, f: impl FnOnce(&mut S) -> R) -> Option<R> {
        let pool = self.0.upgrade()?;
        let mut shelf = pool.try_borrow_mut().ok()?;
        Some(f(&mut shelf))
    }
}

/// A buffer lent by a [`Pool`]: it derefs to the buffer and goes back to its pool when
/// dropped (or is freed, its pool gone).
pub struct Pooled<S: Shelf> {
    /// Taken out only in `drop`.
    item: ManuallyDrop<S::Item>,
    home: Home<S>,
}

impl<S: Shelf> Pooled<S> {
    /// A buffer of no pool: freed when dropped (a reactor without a pool, a test).
    pub fn detached(item: S::Item) -> Self {
        Self {
            item: ManuallyDrop::new(item),
            home: Home::default(),
        }
    }
}

impl<S: Shelf> Drop for Pooled<S> {
    fn drop(&mut self) {
        // SAFETY: `item` is initialised until here, and `drop` runs once: nothing reads it
        // after it is taken out.
        let item = unsafe { ManuallyDrop::take(&mut self.item) };
        self.home.keep(item);
    }
}

impl<S: Shelf> Deref for Pooled<S> {
    type Target = S::Item;

    #[inline]
    fn deref(&self) -> &S::Item {
        &self.item
    }
}

impl<S: Shelf> DerefMut for Pooled<S> {
    #[inline]
    fn deref_mut(&mut self) -> &mut S::Item {
        &mut self.item
    }
}

impl<S: Shelf> fmt::Debug for Pooled<S>
where
    S::Item: fmt::Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pooled")
            .field("item", &*self.item)
            .field("home", &self.home)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keeps at most two items.
    #[derive(Debug, Default)]
    struct Two(Vec<u32>);

    impl Shelf for Two {
        type Item = u32;
        fn keep(&mut self, item: u32) {
            if self.0.len() < 2 {
                self.0.push(item);
            }
        }
    }

    fn kept(p: &Pool<Two>) -> Vec<u32> {
        p.with(|s| s.0.clone()).unwrap_or_default()
    }

    #[test]
    fn a_dropped_buffer_goes_back_to_its_pool_within_its_bound() {
        let pool = Pool::<Two>::default();
        let (a, b, c) = (pool.lend(1), pool.lend(2), pool.lend(3));
        assert_eq!((*a, *b, *c), (1, 2, 3));
        drop(b);
        assert_eq!(kept(&pool), [2]);
        drop(a);
        drop(c);
        // The shelf's bound holds: the third is freed, not kept.
        assert_eq!(kept(&pool), [2, 1]);
    }

    #[test]
    fn a_buffer_outliving_its_pool_or_of_none_is_freed() {
        let pool = Pool::<Two>::default();
        let a = pool.lend(1);
        drop(pool);
        drop(a);
        let home = Home::<Two>::default();
        home.keep(5);
        assert!(home.with(|_| ()).is_none());
        drop(Pooled::<Two>::detached(7));
    }

    #[test]
    fn a_home_gives_back_to_its_pool() {
        let pool = Pool::<Two>::default();
        let home = pool.home();
        home.keep(9);
        assert_eq!(kept(&pool), [9]);
        assert_eq!(home.with(|s| s.0.pop()), Some(Some(9)));
    }
}
