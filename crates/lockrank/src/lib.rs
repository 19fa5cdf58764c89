//! Ranked locks: cairn's lock order as code, checked in debug builds.
//!
//! Owns: the lock ranks (`Rank`), the per-thread record of held locks, and the `Mutex` and
//! `RwLock` wrappers over `parking_lot` that consult it.
//! Invariants (checked when `debug_assertions` are on; release builds compile the checks
//! away and the wrappers are plain `parking_lot` locks):
//! - a thread never waits for a lock whose rank is below the rank of a lock it holds;
//! - locks of one rank nest only as their rank's `Nesting` allows (ascending keys for AG
//!   headers, a declared reason for a second inode lock, never for single ranks);
//! - a thread waiting for log space holds no buffer lock (`check_may_wait`).
//!
//! With the `deadlock-detection` feature, `lock_cycles` also reports the cycles parking_lot's
//! detector finds among the threads that are blocked right now (the hang watchdogs use it).
//!
//! A violation panics naming both sites: the acquisition that broke the order and the one
//! it conflicts with. `try_lock` never waits, so it is never a violation itself, but what it
//! takes is recorded and checked against later waits.

/// `Deref` (and `DerefMut` when asked) to the inner guard's value, and `Debug` as it.
macro_rules! guard_traits {
    ($guard:ident $(, $mutable:ident)?) => {
        impl<T: ?Sized> std::ops::Deref for $guard<'_, T> {
            type Target = T;

            fn deref(&self) -> &T {
                &self.guard
            }
        }

        $(
            impl<T: ?Sized> std::ops::$mutable for $guard<'_, T> {
                fn deref_mut(&mut self) -> &mut T {
                    &mut self.guard
                }
            }
        )?

        impl<T: ?Sized + std::fmt::Debug> std::fmt::Debug for $guard<'_, T> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                std::fmt::Debug::fmt(&*self.guard, f)
            }
        }
    };
}
pub(crate) use guard_traits;

mod cycles;
mod held;
mod mutex;
mod rank;
mod rwlock;

pub use cycles::{DETECTOR_ENABLED, lock_cycles};
pub use held::{HeldLock, Token, acquire, check_may_wait, held_locks};
pub use mutex::{Mutex, MutexGuard};
pub use rank::{Nesting, Rank};
pub use rwlock::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Whether this build checks lock order (debug assertions on).
pub const CHECKS_ENABLED: bool = cfg!(debug_assertions);

/// How an acquisition nests within the locks of its own rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// The rank's own rule (`Nesting`) decides.
    Ranked,
    /// A second lock of a `Declared` rank, with the rule that makes this nesting safe: it is
    /// shown in reports, and it is the reviewer's promise, not something the checker proves.
    Declared(&'static str),
    /// Not checked at all, only recorded, with the rule that makes waiting here safe whatever
    /// the thread holds: for a lock whose holders wait for nothing (a newly allocated inode's,
    /// which only brief lookups of a free inode can hold). Keep these few.
    Exempt(&'static str),
}
