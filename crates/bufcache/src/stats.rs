//! Counters cheap enough to leave on: striped per thread, each stripe on its own cache lines.
//!
//! A thread picks a stripe once (round robin) and only ever adds to that stripe, so two threads
//! hitting the cache at once do not bounce one counter's cache line between cores. A snapshot
//! sums the stripes; it is not atomic across counters, which is fine for monitoring.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crossbeam::utils::CachePadded;

/// Number of stripes: a power of two at least the number of cores we expect to share a cache.
const STRIPE_COUNT: usize = 16;

/// One counter per event; the discriminant is the index in a stripe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Counter {
    LookasideHits,
    LookasideMisses,
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
    /// Lookups that consulted an enabled lookaside slot and did not hit.
    pub lookaside_misses: u64,
    /// Times a slot was filled (after an index hit or an insert).
    pub lookaside_inserts: u64,
    /// Times a slot was cleared because its buffer was reclaimed, invalidated or replaced.
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

static NEXT_STRIPE: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static STRIPE: Cell<usize> = const { Cell::new(usize::MAX) };
}

fn my_stripe() -> usize {
    STRIPE.with(|cell| {
        let mut stripe = cell.get();
        if stripe == usize::MAX {
            stripe = NEXT_STRIPE.fetch_add(1, Ordering::Relaxed) % STRIPE_COUNT;
            cell.set(stripe);
        }
        stripe
    })
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
        self.stripes[my_stripe()][counter as usize].fetch_add(count, Ordering::Relaxed);
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

    pub(crate) fn snapshot(&self) -> StatsSnapshot {
        let lookaside_hits = self.sum(Counter::LookasideHits);
        let index_hits = self.sum(Counter::IndexHits);
        let misses = self.sum(Counter::Misses);
        StatsSnapshot {
            gets: lookaside_hits + index_hits + misses,
            hits: lookaside_hits + index_hits,
            misses,
            lookaside_hits,
            lookaside_misses: self.sum(Counter::LookasideMisses),
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
        }
    }
}

const _: () = assert!(Counter::LockBusy as usize + 1 == COUNTER_COUNT);
const _: () = assert!(STRIPE_COUNT.is_power_of_two());

#[cfg(test)]
mod tests {
    use super::*;

    // Checks that counts from several threads all land in the snapshot and derive gets/hits.
    #[test]
    fn counts_from_threads_are_summed() {
        let stats = Stats::new();
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
        let snap = stats.snapshot();
        assert_eq!(snap.lookaside_hits, 4000);
        assert_eq!(snap.index_hits, 20);
        assert_eq!(snap.hits, 4020);
        assert_eq!(snap.gets, 8020);
        assert!((snap.lookaside_hit_rate() - 4000.0 / 8020.0).abs() < 1e-12);
        assert_eq!(StatsSnapshot::default().lookaside_hit_rate(), 0.0);
    }
}
