//! Counters cheap enough to leave on: striped per thread, each stripe on its own cache lines.
//!
//! The first `OWNED_STRIPES` threads to count each claim a stripe of their own (the claim is
//! process-wide and given back when the thread exits), and add to it with a plain load and
//! store: no read-modify-write on the lookup path, and no cache line shared with another
//! thread. Threads beyond that share `SHARED_STRIPES` stripes with atomic adds. An owned
//! stripe is written only by its owner, so no update is lost; the next owner sees the values
//! through the claim's release/acquire. A snapshot sums the stripes; it is not atomic across
//! counters, which is fine for monitoring.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use cairn_atomic::{AtomicFlag, AtomicWord};
use crossbeam::utils::CachePadded;

/// Stripes a thread can own: a power of two at least the number of cores we expect.
const OWNED_STRIPES: usize = 16;
/// Stripes shared, with atomic adds, by the threads that found no stripe to own.
const SHARED_STRIPES: usize = 4;
const STRIPE_COUNT: usize = OWNED_STRIPES + SHARED_STRIPES;

/// One counter per event; the discriminant is the index in a stripe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Counter {
    LookasideHits,
    LookasideInserts,
    LookasideRemoves,
    IndexHits,
    Misses,
    Reads,
    ReadFailures,
    Writes,
    WriteOps,
    Reclaims,
    StaleLookups,
    LockBusy,
    ReadAheads,
}

const COUNTER_COUNT: usize = 13;

/// A point-in-time copy of the counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Lookups (`get`, `get_new`, `try_get`) that returned a buffer: `hits + misses`.
    pub gets: u64,
    /// Lookups that found the buffer cached: `lookaside_hits + index_hits`.
    pub hits: u64,
    /// Lookups that inserted a new buffer (read from disk or created).
    pub misses: u64,
    /// Hits served by the lookaside slot without touching the index.
    pub lookaside_hits: u64,
    /// Lookups that did not hit an enabled lookaside slot: `index_hits + misses` with the
    /// lookaside on, 0 with it off (derived, so a hit counts one event, not two).
    pub lookaside_misses: u64,
    /// Times a slot was filled (on an insert, or an index hit that took the slot).
    pub lookaside_inserts: u64,
    /// Times a thread's slot let go of a stale or dead buffer: cleared by the thread that
    /// reclaimed or invalidated it, swept after the AG's generation moved, or refused at a hit.
    pub lookaside_removes: u64,
    /// Hits served by the per-AG index.
    pub index_hits: u64,
    /// Buffers read from the device.
    pub reads: u64,
    /// Reads that failed (device error or verifier).
    pub read_failures: u64,
    /// Buffers written back.
    pub writes: u64,
    /// Device write calls made by write-back (adjacent buffers share one).
    pub write_ops: u64,
    /// Buffers freed by reclaim.
    pub reclaims: u64,
    /// Lookups that met a stale buffer and replaced it.
    pub stale_lookups: u64,
    /// `try_get` calls and write-back attempts that found a buffer locked.
    pub lock_busy: u64,
    /// Device reads made by `read_ahead`, each for several blocks (the buffers they cached
    /// are counted in `reads`).
    pub read_aheads: u64,
}

impl StatsSnapshot {
    /// Fraction of lookups served by the lookaside slots, or 0 with no lookups.
    pub fn lookaside_hit_rate(&self) -> f64 {
        if self.gets == 0 {
            return 0.0;
        }
        self.lookaside_hits as f64 / self.gets as f64
    }
}

type Stripe = CachePadded<[AtomicU64; COUNTER_COUNT]>;

/// The striped counters of one cache.
#[derive(Debug)]
pub(crate) struct Stats {
    stripes: Box<[Stripe]>,
}

/// Which owned stripes a thread holds, process-wide (the same index in every cache).
static STRIPE_CLAIMED: [AtomicBool; OWNED_STRIPES] =
    [const { AtomicBool::new(false) }; OWNED_STRIPES];
static NEXT_SHARED: AtomicUsize = AtomicUsize::new(0);

/// A thread's stripe: owned (plain adds) or shared (atomic adds). Gives an owned one back
/// when the thread exits.
#[derive(Debug)]
struct StripeClaim {
    index: usize,
    owned: bool,
}

/// The stripe protocol, generic over the atomics so the loom model in `models.rs` runs it.
/// Claims the first free flag of `claimed`: its index, or `None` if every one is taken. The
/// acquire pairs with `give_back`'s release, so the new owner's plain loads see the last
/// owner's last stores.
pub(crate) fn claim_first<F: AtomicFlag>(claimed: &[F]) -> Option<usize> {
    claimed.iter().position(|flag| {
        flag.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    })
}

/// Gives a claimed stripe back (its owner exits).
pub(crate) fn give_back<F: AtomicFlag>(flag: &F) {
    flag.store(false, Ordering::Release);
}

/// Adds to a counter of a stripe: an owned one (only its owner writes it) with a load and a
/// store, which lose nothing there and take no read-modify-write; a shared one atomically.
#[inline]
pub(crate) fn add_to<W: AtomicWord>(cell: &W, count: u64, owned: bool) {
    if owned {
        cell.store(cell.load(Ordering::Relaxed) + count, Ordering::Relaxed);
    } else {
        cell.fetch_add(count, Ordering::Relaxed);
    }
}

impl StripeClaim {
    fn take() -> Self {
        if let Some(index) = claim_first(&STRIPE_CLAIMED) {
            return Self { index, owned: true };
        }
        let shared = NEXT_SHARED.fetch_add(1, Ordering::Relaxed) % SHARED_STRIPES;
        Self {
            index: OWNED_STRIPES + shared,
            owned: false,
        }
    }
}

impl Drop for StripeClaim {
    fn drop(&mut self) {
        if self.owned {
            give_back(&STRIPE_CLAIMED[self.index]);
        }
    }
}

thread_local! {
    static STRIPE: StripeClaim = StripeClaim::take();
}

impl Stats {
    pub(crate) fn new() -> Self {
        let stripes = (0..STRIPE_COUNT)
            .map(|_| CachePadded::new(std::array::from_fn(|_| AtomicU64::new(0))))
            .collect();
        Self { stripes }
    }

    #[inline]
    pub(crate) fn add(&self, counter: Counter, count: u64) {
        let add = |claim: &StripeClaim| {
            add_to(
                &self.stripes[claim.index][counter as usize],
                count,
                claim.owned,
            );
        };
        // During thread exit, after the claim is gone, count in a shared stripe.
        if STRIPE.try_with(add).is_err() {
            let shared = StripeClaim {
                index: OWNED_STRIPES,
                owned: false,
            };
            add(&shared);
        }
    }

    #[inline]
    pub(crate) fn bump(&self, counter: Counter) {
        self.add(counter, 1);
    }

    fn sum(&self, counter: Counter) -> u64 {
        let index = counter as usize;
        self.stripes
            .iter()
            .map(|s| s[index].load(Ordering::Relaxed))
            .sum()
    }

    /// The counters summed; `lookaside_on` says whether lookups consult slots.
    pub(crate) fn snapshot(&self, lookaside_on: bool) -> StatsSnapshot {
        let lookaside_hits = self.sum(Counter::LookasideHits);
        let index_hits = self.sum(Counter::IndexHits);
        let misses = self.sum(Counter::Misses);
        StatsSnapshot {
            gets: lookaside_hits + index_hits + misses,
            hits: lookaside_hits + index_hits,
            misses,
            lookaside_hits,
            lookaside_misses: if lookaside_on { index_hits + misses } else { 0 },
            lookaside_inserts: self.sum(Counter::LookasideInserts),
            lookaside_removes: self.sum(Counter::LookasideRemoves),
            index_hits,
            reads: self.sum(Counter::Reads),
            read_failures: self.sum(Counter::ReadFailures),
            writes: self.sum(Counter::Writes),
            write_ops: self.sum(Counter::WriteOps),
            reclaims: self.sum(Counter::Reclaims),
            stale_lookups: self.sum(Counter::StaleLookups),
            lock_busy: self.sum(Counter::LockBusy),
            read_aheads: self.sum(Counter::ReadAheads),
        }
    }
}

const _: () = assert!(Counter::ReadAheads as usize + 1 == COUNTER_COUNT);
const _: () = assert!(OWNED_STRIPES.is_power_of_two());

#[cfg(test)]
mod tests {
    use super::*;

    // Checks that counts from more threads than owned stripes (some owning, some sharing a
    // stripe, some exiting and handing theirs on) all land in the snapshot; derived fields.
    #[test]
    fn counts_from_threads_are_summed() {
        let stats = Stats::new();
        std::thread::scope(|scope| {
            for _ in 0..OWNED_STRIPES + 8 {
                scope.spawn(|| stats.bump(Counter::Reads));
            }
        });
        assert_eq!(stats.snapshot(true).reads, OWNED_STRIPES as u64 + 8);
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for _ in 0..1000 {
                        stats.bump(Counter::LookasideHits);
                        stats.bump(Counter::Misses);
                    }
                    stats.add(Counter::IndexHits, 5);
                });
            }
        });
        let snap = stats.snapshot(true);
        assert_eq!(snap.lookaside_hits, 4000);
        assert_eq!(snap.index_hits, 20);
        assert_eq!(snap.hits, 4020);
        assert_eq!(snap.gets, 8020);
        assert_eq!(snap.lookaside_misses, 4020);
        assert_eq!(stats.snapshot(false).lookaside_misses, 0);
        assert!((snap.lookaside_hit_rate() - 4000.0 / 8020.0).abs() < 1e-12);
        assert_eq!(StatsSnapshot::default().lookaside_hit_rate(), 0.0);
    }
}
