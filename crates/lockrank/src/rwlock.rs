//! A `parking_lot::RwLock` with a rank.

use std::fmt;

use crate::held::{Token, acquire};
use crate::{Order, Rank};

/// A reader-writer lock of rank `rank`; both modes check the order in debug builds (a
/// reader waits for a writer as a writer waits for readers).
pub struct RwLock<T: ?Sized> {
    rank: Rank,
    /// The key acquisitions report and, for `Ascending` ranks, order by.
    key: u64,
    inner: parking_lot::RwLock<T>,
}

/// A shared guard; dropping it unlocks and forgets the lock.
pub struct RwLockReadGuard<'a, T: ?Sized> {
    guard: parking_lot::RwLockReadGuard<'a, T>,
    _token: Token,
}

/// An exclusive guard; dropping it unlocks and forgets the lock.
pub struct RwLockWriteGuard<'a, T: ?Sized> {
    guard: parking_lot::RwLockWriteGuard<'a, T>,
    _token: Token,
}

impl<T> RwLock<T> {
    pub const fn new(rank: Rank, value: T) -> Self {
        Self::keyed(rank, 0, value)
    }

    /// A lock whose acquisitions carry `key` (an inode number).
    pub const fn keyed(rank: Rank, key: u64, value: T) -> Self {
        Self {
            rank,
            key,
            inner: parking_lot::RwLock::new(value),
        }
    }

    pub fn into_inner(self) -> T {
        self.inner.into_inner()
    }
}

impl<T: ?Sized> RwLock<T> {
    /// The lock's rank.
    pub fn rank(&self) -> Rank {
        self.rank
    }

    #[track_caller]
    #[inline]
    pub fn read(&self) -> RwLockReadGuard<'_, T> {
        self.read_with(self.key, Order::Ranked)
    }

    #[track_caller]
    #[inline]
    pub fn read_with(&self, key: u64, order: Order) -> RwLockReadGuard<'_, T> {
        let token = acquire(self.rank, key, order, true);
        RwLockReadGuard {
            guard: self.inner.read(),
            _token: token,
        }
    }

    #[track_caller]
    #[inline]
    pub fn write(&self) -> RwLockWriteGuard<'_, T> {
        self.write_with(self.key, Order::Ranked)
    }

    #[track_caller]
    #[inline]
    pub fn write_with(&self, key: u64, order: Order) -> RwLockWriteGuard<'_, T> {
        let token = acquire(self.rank, key, order, true);
        RwLockWriteGuard {
            guard: self.inner.write(),
            _token: token,
        }
    }

    /// Shared if free of writers, without waiting.
    #[track_caller]
    #[inline]
    pub fn try_read(&self) -> Option<RwLockReadGuard<'_, T>> {
        let guard = self.inner.try_read()?;
        Some(RwLockReadGuard {
            guard,
            _token: acquire(self.rank, self.key, Order::Ranked, false),
        })
    }

    /// Exclusive if free, without waiting.
    #[track_caller]
    #[inline]
    pub fn try_write(&self) -> Option<RwLockWriteGuard<'_, T>> {
        let guard = self.inner.try_write()?;
        Some(RwLockWriteGuard {
            guard,
            _token: acquire(self.rank, self.key, Order::Ranked, false),
        })
    }

    pub fn get_mut(&mut self) -> &mut T {
        self.inner.get_mut()
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for RwLock<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RwLock")
            .field("rank", &self.rank)
            .field("inner", &&self.inner)
            .finish()
    }
}

crate::guard_traits!(RwLockReadGuard);
crate::guard_traits!(RwLockWriteGuard, DerefMut);
