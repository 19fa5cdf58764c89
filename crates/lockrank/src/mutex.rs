//! A `parking_lot::Mutex` with a rank.

use std::fmt;
use std::time::Duration;

use parking_lot::{Condvar, WaitTimeoutResult};

use crate::held::{Token, acquire};
use crate::{Order, Rank};

/// A mutex of rank `rank`; `lock` checks the order in debug builds.
pub struct Mutex<T: ?Sized> {
    rank: Rank,
    /// The key `lock` reports and, for `Ascending` ranks, orders by.
    key: u64,
    inner: parking_lot::Mutex<T>,
}

/// The guard of a ranked mutex; dropping it unlocks and forgets the lock.
pub struct MutexGuard<'a, T: ?Sized> {
    // Unlocked before the token forgets it: fields drop in declaration order.
    guard: parking_lot::MutexGuard<'a, T>,
    _token: Token,
}

impl<T> Mutex<T> {
    pub const fn new(rank: Rank, value: T) -> Self {
        Self::keyed(rank, 0, value)
    }

    /// A mutex whose acquisitions carry `key` (an inode number, an AG).
    pub const fn keyed(rank: Rank, key: u64, value: T) -> Self {
        Self {
            rank,
            key,
            inner: parking_lot::Mutex::new(value),
        }
    }

    pub fn into_inner(self) -> T {
        self.inner.into_inner()
    }
}

impl<T: ?Sized> Mutex<T> {
    /// The lock's rank.
    pub fn rank(&self) -> Rank {
        self.rank
    }

    /// Locks, checking the rank order.
    #[track_caller]
    #[inline]
    pub fn lock(&self) -> MutexGuard<'_, T> {
        self.lock_ranked(self.rank, self.key, Order::Ranked)
    }

    /// Locks as a further lock of a `Declared` rank, naming the rule that makes it safe.
    #[track_caller]
    #[inline]
    pub fn lock_nested(&self, rule: &'static str) -> MutexGuard<'_, T> {
        self.lock_ranked(self.rank, self.key, Order::Declared(rule))
    }

    /// Locks with `key` (the order among locks of an `Ascending` rank) and `order`.
    #[track_caller]
    #[inline]
    pub fn lock_with(&self, key: u64, order: Order) -> MutexGuard<'_, T> {
        self.lock_ranked(self.rank, key, order)
    }

    /// Locks in the role of `rank` rather than the mutex's own (one inode's lock is taken as
    /// a directory's or as an entry's).
    #[track_caller]
    #[inline]
    pub fn lock_ranked(&self, rank: Rank, key: u64, order: Order) -> MutexGuard<'_, T> {
        let token = acquire(rank, key, order, true);
        MutexGuard {
            guard: self.inner.lock(),
            _token: token,
        }
    }

    /// Locks if free, without waiting (so without an order check).
    #[track_caller]
    #[inline]
    pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        let guard = self.inner.try_lock()?;
        Some(MutexGuard {
            guard,
            _token: acquire(self.rank, self.key, Order::Ranked, false),
        })
    }

    pub fn get_mut(&mut self) -> &mut T {
        self.inner.get_mut()
    }

    /// Whether some thread holds the lock (an answer that may be out of date at once).
    pub fn is_locked(&self) -> bool {
        self.inner.is_locked()
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for Mutex<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mutex")
            .field("rank", &self.rank)
            .field("inner", &&self.inner)
            .finish()
    }
}

impl<'a, T: ?Sized> MutexGuard<'a, T> {
    /// Waits on `condvar`, releasing the lock meanwhile. The lock stays recorded as held:
    /// a waiting thread takes no other lock.
    pub fn wait(&mut self, condvar: &Condvar) {
        condvar.wait(&mut self.guard);
    }

    /// Runs `f` with the lock released (parking_lot's `MutexGuard::unlocked`), for a short
    /// wait such as a sleep. The lock stays recorded as held: `f` must take no ranked lock.
    pub fn unlocked<U>(guard: &mut Self, f: impl FnOnce() -> U) -> U {
        parking_lot::MutexGuard::unlocked(&mut guard.guard, f)
    }

    /// `wait`, for at most `timeout`.
    pub fn wait_for(&mut self, condvar: &Condvar, timeout: Duration) -> WaitTimeoutResult {
        condvar.wait_for(&mut self.guard, timeout)
    }
}

crate::guard_traits!(MutexGuard, DerefMut);
