#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Near-mode search bounds, checked with the allocator's work counters (never with time).

mod support;

use cairn_alloc::{Allocator, Request};
use cairn_btree::CacheContext;
use cairn_bufcache::BufferCache;
use cairn_format::{AgNumber, FsBlock, Geometry};
use support::{TestLog, allocator, cache, formatted};

/// AG 1 of a fresh filesystem turned into 3-block free extents at AG blocks 4k+2 (block 4k+1
/// stays used), so with alignment 4 every extent offers exactly one block. Returns the AG's
/// first and last free extents' starts.
fn three_block_extents(
    cache: &BufferCache,
    alloc: &Allocator,
    geometry: &Geometry,
    log: &TestLog,
) -> (u64, u64) {
    let mut ctx = CacheContext::new(cache);
    let whole = alloc
        .check_invariants(&mut ctx, AgNumber(1))
        .unwrap()
        .longest_free;
    let base = geometry.ag_start(1);
    let everything = Request::near(FsBlock(base), 1, whole);
    let big = alloc.allocate(&mut ctx, log, &everything).unwrap().unwrap();
    let end = u64::from(big.start) + u64::from(big.length);
    let first = u64::from(big.start).next_multiple_of(4) + 2;
    let mut at = first;
    let mut sequence = 1;
    while at + 3 <= end {
        alloc
            .free(&mut ctx, log, FsBlock(base + at), 3, sequence)
            .unwrap();
        sequence += 1;
        at += 4;
    }
    log.durable.set(sequence);
    alloc.check_invariants(&mut ctx, AgNumber(1)).unwrap();
    (base + first, base + at - 4)
}

// Regression: when alignment leaves only shorter-than-wanted candidates, the by-block walks
// stop past the nearest one instead of walking every extent up to NEAR_ROUNDS_MAX rounds.
#[test]
fn regression_near_short_candidates_stop_the_walks() {
    let (device, geometry) = formatted(8 << 20, 512, 2);
    let cache = cache(&device, &geometry);
    let alloc = allocator(&geometry);
    let log = TestLog::default();
    let (first, last) = three_block_extents(&cache, &alloc, &geometry, &log);
    let extent_count = (last - first) / 4 + 1;
    assert!(extent_count > 1000, "{extent_count} extents");
    let target = FsBlock(first + (last - first) / 2 + 1);
    let request = Request::near(target, 1, 3).with_alignment(4, 1);
    let mut ctx = CacheContext::new(&cache);
    let (got, counters) = alloc.allocate_traced(&mut ctx, &log, &request).unwrap();
    let got = got.unwrap();
    assert_eq!(got.length, 1, "alignment leaves one block per extent");
    assert_eq!(got.start % 4, 0);
    assert!(
        got.fs_start.0.abs_diff(target.0) <= 4,
        "{got:?} for {target:?}"
    );
    assert_eq!(counters.near_round_caps, 0);
    assert!(
        counters.records_visited < 32,
        "visited {} of {extent_count} extents",
        counters.records_visited
    );
    assert_eq!(alloc.stats().near_round_caps, 0);
    alloc.check_invariants(&mut ctx, AgNumber(1)).unwrap();
}

// Checks that a free-list refill takes its whole shortfall in one search and one carve, and
// that an allocation's counters add up its AG's work.
#[test]
fn refill_is_one_search_and_counters_add_up() {
    let (device, geometry) = formatted(8 << 20, 512, 2);
    let cache = cache(&device, &geometry);
    let alloc = allocator(&geometry);
    let log = TestLog::default();
    let mut ctx = CacheContext::new(&cache);
    let before = alloc.check_invariants(&mut ctx, AgNumber(0)).unwrap();
    let request = Request::near(FsBlock(100), 4, 4);
    let (got, counters) = alloc.allocate_traced(&mut ctx, &log, &request).unwrap();
    assert!(got.is_some());
    assert_eq!(counters.ags_tried, 1);
    assert!(counters.free_list_refills <= 1, "{counters:?}");
    let after = alloc.check_invariants(&mut ctx, AgNumber(0)).unwrap();
    let expected = before.free_list.len() as u64
        + counters.free_list_blocks_added
        + counters.tree_blocks_freed
        - counters.tree_blocks_taken;
    assert_eq!(after.free_list.len() as u64, expected, "{counters:?}");
    let freed = alloc
        .free_traced(&mut ctx, &log, got.unwrap().fs_start, 4, 1)
        .unwrap();
    assert_eq!(freed.ags_tried, 1);
    alloc.check_invariants(&mut ctx, AgNumber(0)).unwrap();
}
