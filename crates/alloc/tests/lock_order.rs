#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! AG lock order: several threads run "transactions" (a `CacheContext`, which holds every
//! buffer until `release_all`, as a journal transaction holds joined buffers until commit)
//! that allocate in a high AG, then ask for a low one, allocate twice in one AG and free.
//! Before the fix these deadlocked (AG state mutex against AGF buffer, and AGFs locked
//! descending across calls). A watchdog fails the test instead of hanging CI.

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use cairn_alloc::{AllocError, Allocation, Allocator, LogSequence, Request};
use cairn_btree::CacheContext;
use cairn_bufcache::BufferCache;
use cairn_format::{AgNumber, FsBlock, Geometry};
use support::{TestLog, allocator, cache, formatted};

/// Generous: the whole test takes well under a second when nothing deadlocks.
const WATCHDOG: Duration = Duration::from_secs(120);
const THREADS: u64 = 4;
const ROUNDS: u64 = 60;

/// A log usable from several threads: forcing makes the sequence durable at once.
#[derive(Debug, Default)]
struct SharedLog {
    durable: AtomicU64,
}

impl LogSequence for SharedLog {
    fn durable_sequence(&self) -> u64 {
        self.durable.load(Ordering::Relaxed)
    }

    fn force(&self, sequence: u64) -> Result<(), String> {
        self.durable.fetch_max(sequence, Ordering::Relaxed);
        Ok(())
    }
}

/// A small deterministic generator (xorshift), one per thread.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// One transaction: allocations in the pattern that deadlocked, then every extent freed
/// (ascending, so the frees stay in AG order).
fn transaction(
    shared: (&BufferCache, &Allocator, &SharedLog, &Geometry),
    seed: &mut u64,
    sequence: u64,
) -> Vec<Allocation> {
    let (cache, alloc, log, geometry) = shared;
    let mut ctx = CacheContext::new(cache);
    let ags = u64::from(geometry.ag_count);
    let mut got = Vec::new();
    for _ in 0..3 {
        let ag = (next(seed) % ags) as u32;
        let target = FsBlock(geometry.ag_start(ag) + 64 + next(seed) % 256);
        let length = 1 + (next(seed) % 6) as u32;
        // A directory-index style request: any AG from 0 up, near `target`.
        let request = Request::near(target, 1, length);
        if let Some(found) = alloc.allocate(&mut ctx, log, &request).unwrap() {
            got.push(found);
        }
    }
    for pair in got.windows(2) {
        assert!(
            pair[0].ag.0 <= pair[1].ag.0,
            "AGs locked descending within one transaction: {got:?}"
        );
    }
    let kept = got.clone();
    got.sort_by_key(|a| a.fs_start.0);
    for found in &got {
        alloc
            .free(&mut ctx, log, found.fs_start, found.length, sequence)
            .unwrap();
    }
    ctx.release_all();
    kept
}

// Four threads, 60 transactions each, over 4 AGs; then every AG's invariants hold.
#[test]
fn regression_many_transactions_no_ag_deadlock() {
    let (device, geometry) = formatted(8 << 20, 512, 4);
    let cache = cache(&device, &geometry);
    let alloc = allocator(&geometry);
    let log = SharedLog::default();
    let (done_tx, done_rx) = mpsc::channel();
    std::thread::scope(|scope| {
        for thread in 0..THREADS {
            let done_tx = done_tx.clone();
            let shared = (&cache, &alloc, &log, &geometry);
            scope.spawn(move || {
                let mut seed = 0x9E37_79B9_7F4A_7C15 ^ (thread + 1);
                for round in 0..ROUNDS {
                    transaction(shared, &mut seed, round * THREADS + thread + 1);
                }
                done_tx.send(thread).unwrap();
            });
        }
        for _ in 0..THREADS {
            if done_rx.recv_timeout(WATCHDOG).is_err() {
                // The scope would join the stuck threads and hang: end the process instead.
                eprintln!("deadlock: allocator threads did not finish");
                std::process::exit(101);
            }
        }
    });
    let mut ctx = CacheContext::new(&cache);
    for ag in 0..geometry.ag_count {
        alloc.check_invariants(&mut ctx, AgNumber(ag)).unwrap();
    }
}

// A context holding AG 1's header gets nothing below AG 1, even when the request allows AG 0.
#[test]
fn allocate_never_locks_below_a_held_ag() {
    let (device, geometry) = formatted(8 << 20, 512, 4);
    let cache = cache(&device, &geometry);
    let alloc = allocator(&geometry);
    let log = TestLog::default();
    let mut ctx = CacheContext::new(&cache);
    let high = Request::near(FsBlock(geometry.ag_start(1) + 100), 1, 1);
    let first = alloc.allocate(&mut ctx, &log, &high).unwrap().unwrap();
    assert_eq!(first.ag, AgNumber(1));
    let low = Request::near(FsBlock(geometry.ag_start(0) + 100), 1, 1);
    assert_eq!(low.lowest_ag, AgNumber(0));
    let second = alloc.allocate(&mut ctx, &log, &low).unwrap().unwrap();
    assert!(
        second.ag.0 >= 1,
        "locked AG {} below held AG 1",
        second.ag.0
    );
    ctx.release_all();
    // A fresh context may use AG 0 again.
    let mut fresh = CacheContext::new(&cache);
    let third = alloc.allocate(&mut fresh, &log, &low).unwrap().unwrap();
    assert_eq!(third.ag, AgNumber(0));
}

// A free below a held AG header is refused (nothing changed) instead of risking a deadlock.
#[test]
fn free_below_a_held_ag_is_refused() {
    let (device, geometry) = formatted(8 << 20, 512, 4);
    let cache = cache(&device, &geometry);
    let alloc = allocator(&geometry);
    let log = TestLog::default();
    let low = Request::near(FsBlock(geometry.ag_start(0) + 100), 1, 1);
    let mut ctx = CacheContext::new(&cache);
    let in_low = alloc.allocate(&mut ctx, &log, &low).unwrap().unwrap();
    ctx.release_all();
    let mut ctx = CacheContext::new(&cache);
    let high = Request::near(FsBlock(geometry.ag_start(2) + 100), 1, 1);
    alloc.allocate(&mut ctx, &log, &high).unwrap().unwrap();
    let refused = alloc.free(&mut ctx, &log, in_low.fs_start, in_low.length, 1);
    assert!(
        matches!(refused, Err(AllocError::AgOrder { ag: 0, held: 2 })),
        "{refused:?}"
    );
    ctx.release_all();
    let mut ctx = CacheContext::new(&cache);
    alloc
        .free(&mut ctx, &log, in_low.fs_start, in_low.length, 1)
        .unwrap();
    alloc.check_invariants(&mut ctx, AgNumber(0)).unwrap();
}
