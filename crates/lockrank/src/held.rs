//! The per-thread record of held locks and the order check (debug builds only).

use std::panic::Location;

use crate::{Nesting, Order, Rank};

/// One lock a thread holds, as reported by `held_locks`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldLock {
    pub rank: Rank,
    pub key: u64,
    pub site: &'static Location<'static>,
}

/// Proof that an acquisition was recorded; dropping it forgets the lock. A zero-sized
/// value in release builds.
#[derive(Debug)]
#[must_use = "dropping the token forgets the lock at once"]
pub struct Token {
    #[cfg(debug_assertions)]
    id: u64,
}

#[cfg(debug_assertions)]
mod record {
    use std::cell::RefCell;

    use super::HeldLock;

    thread_local! {
        pub(super) static HELD: RefCell<(u64, Vec<(u64, HeldLock)>)> =
            const { RefCell::new((0, Vec::new())) };
    }
}

/// Checks that `rank` (with `key`) may be taken now, panicking with both sites if not, and
/// records it as held. `wait` is false for a `try_lock` that succeeded: it waited for
/// nothing, so only later acquisitions are checked against it.
#[track_caller]
#[inline]
pub fn acquire(rank: Rank, key: u64, order: Order, wait: bool) -> Token {
    #[cfg(debug_assertions)]
    {
        let site = Location::caller();
        let lock = HeldLock { rank, key, site };
        record::HELD.with(|held| {
            let mut held = held.borrow_mut();
            if wait
                && !matches!(order, Order::Exempt(_))
                && let Some(why) = conflict(&held.1, &lock, order)
            {
                drop(held);
                violation(&lock, &why);
            }
            held.0 += 1;
            let id = held.0;
            held.1.push((id, lock));
            Token { id }
        })
    }
    #[cfg(not(debug_assertions))]
    {
        let _ = (rank, key, order, wait);
        Token {}
    }
}

/// Checks that the thread may wait for `rank` without taking a lock (log space): it holds
/// nothing at or above it.
#[track_caller]
#[inline]
pub fn check_may_wait(rank: Rank) {
    #[cfg(debug_assertions)]
    {
        let lock = HeldLock {
            rank,
            key: 0,
            site: Location::caller(),
        };
        let found = record::HELD.with(|held| {
            held.borrow()
                .1
                .iter()
                .find(|(_, other)| other.rank >= rank)
                .map(|(_, other)| *other)
        });
        if let Some(other) = found {
            violation(
                &lock,
                &describe(&other, "a lock that may keep it waiting forever"),
            );
        }
    }
    #[cfg(not(debug_assertions))]
    let _ = rank;
}

impl Drop for Token {
    #[inline]
    fn drop(&mut self) {
        #[cfg(debug_assertions)]
        {
            let id = self.id;
            // A thread's record may already be gone while it exits; then nothing is held.
            let _ = record::HELD.try_with(|held| {
                let mut held = held.borrow_mut();
                if let Some(index) = held.1.iter().rposition(|(held_id, _)| *held_id == id) {
                    held.1.remove(index);
                }
            });
        }
    }
}

/// The locks this thread holds, oldest first (empty in release builds).
pub fn held_locks() -> Vec<HeldLock> {
    #[cfg(debug_assertions)]
    {
        record::HELD.with(|held| held.borrow().1.iter().map(|(_, lock)| *lock).collect())
    }
    #[cfg(not(debug_assertions))]
    Vec::new()
}

/// Why taking `next` conflicts with a lock in `held`, if it does.
#[cfg_attr(not(debug_assertions), allow(dead_code))]
fn conflict(held: &[(u64, HeldLock)], next: &HeldLock, order: Order) -> Option<String> {
    for (_, other) in held {
        if other.rank > next.rank && !other.rank.is_transparent_to(next.rank) {
            return Some(describe(other, "a lock of a higher rank"));
        }
        if other.rank != next.rank {
            continue;
        }
        let broken = match (next.rank.nesting(), order) {
            (Nesting::Any, _) | (_, Order::Exempt(_)) => None,
            (Nesting::Declared, Order::Declared(_)) => None,
            (Nesting::Ascending, _) if other.key < next.key => None,
            (Nesting::Ascending, _) => Some("a lock of the same rank with a key not below"),
            (Nesting::Single, _) => Some("another lock of a rank held one at a time"),
            (Nesting::Declared, Order::Ranked) => {
                Some("another lock of the same rank, and no rule was declared for nesting")
            }
        };
        if let Some(why) = broken {
            return Some(describe(other, why));
        }
    }
    None
}

#[cfg_attr(not(debug_assertions), allow(dead_code))]
fn describe(other: &HeldLock, why: &str) -> String {
    format!(
        "while holding {why}: {:?} (key {}) taken at {}",
        other.rank, other.key, other.site
    )
}

#[cfg_attr(not(debug_assertions), allow(dead_code))]
#[track_caller]
fn violation(next: &HeldLock, why: &str) -> ! {
    #[expect(
        clippy::panic,
        reason = "a lock order violation is a bug that can deadlock; debug builds stop at once"
    )]
    {
        panic!(
            "lock order violation: taking {:?} (key {}) at {} {why}",
            next.rank, next.key, next.site
        )
    }
}
