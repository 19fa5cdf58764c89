#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Apart mode (a stream whose exact continuation another stream took): the request lands in
//! the middle of the longest free extent, leaving at least as much free before it as it
//! takes; busy ranges and alignment are respected; exact mode never leaves the target's AG.

mod support;

use cairn_alloc::{Mode, Request};
use cairn_btree::{Buffers, CacheContext};
use cairn_format::{AgNumber, FsBlock};
use support::{TestLog, allocator, cache, formatted};

// Two streams back to back at the start of an AG: the second's exact continuation fails
// (the first took it) and apart mode puts it half way along the longest free extent, so
// both have that half to grow into; a shorter free extent elsewhere is passed over.
#[test]
fn apart_takes_the_middle_of_the_longest_free_extent() {
    let (device, geometry) = formatted(64 << 20, 4096, 2);
    let cache = cache(&device, &geometry);
    let alloc = allocator(&geometry);
    let log = TestLog::default();
    let mut ctx = CacheContext::new(&cache);
    let start = FsBlock(geometry.ag_start(0));
    let first = alloc
        .allocate(&mut ctx, &log, &Request::near(start, 16, 16))
        .unwrap()
        .unwrap();
    let second = alloc
        .allocate(&mut ctx, &log, &Request::near(start, 16, 16))
        .unwrap()
        .unwrap();
    assert_eq!(second.fs_start.0, first.fs_start.0 + 16, "back to back");
    // A short free extent near the target: a 16-block hole freed behind both streams.
    let hole = alloc
        .allocate(&mut ctx, &log, &Request::near(start, 64, 64))
        .unwrap()
        .unwrap();
    ctx.release_all();
    let mut ctx = CacheContext::new(&cache);
    alloc.free(&mut ctx, &log, hole.fs_start, 32, 1).unwrap();
    log.durable.set(1);
    let summary = alloc.check_invariants(&mut ctx, AgNumber(0)).unwrap();
    let longest = summary.extents.iter().map(|e| e.1).max().unwrap();
    let (free_start, _) = *summary.extents.iter().find(|e| e.1 == longest).unwrap();

    let continuation = FsBlock(first.fs_start.0 + 16);
    let exact = Request::near(continuation, 1, 64).with_mode(Mode::Exact);
    assert_eq!(alloc.allocate(&mut ctx, &log, &exact).unwrap(), None);
    let apart = Request::near(continuation, 1, 64).with_mode(Mode::Apart);
    let moved = alloc.allocate(&mut ctx, &log, &apart).unwrap().unwrap();
    assert_eq!(moved.ag, AgNumber(0));
    assert_eq!(moved.length, 64);
    assert_eq!(moved.start, free_start + longest / 2, "{moved:?}");
    alloc.check_invariants(&mut ctx, AgNumber(0)).unwrap();
}

// Busy blocks are never handed out: the middle is taken of what the busy ranges leave, and
// alignment holds.
#[test]
fn apart_respects_busy_ranges_and_alignment() {
    let (device, geometry) = formatted(64 << 20, 4096, 1);
    let cache = cache(&device, &geometry);
    let alloc = allocator(&geometry);
    let log = TestLog::default();
    let mut ctx = CacheContext::new(&cache);
    let start = FsBlock(geometry.ag_start(0));
    let summary = alloc.check_invariants(&mut ctx, AgNumber(0)).unwrap();
    let (free_start, free_length) = *summary.extents.iter().max_by_key(|e| e.1).unwrap();
    // Busy: the upper half of the longest free extent, freed by a commit not yet durable.
    let upper = free_length / 2;
    let taken = Request::near(FsBlock(u64::from(free_start + upper)), upper, upper);
    let taken = alloc.allocate(&mut ctx, &log, &taken).unwrap().unwrap();
    assert_eq!(taken.start, free_start + upper);
    alloc
        .free(&mut ctx, &log, taken.fs_start, upper, 5)
        .unwrap();
    let apart = Request::near(start, 8, 8)
        .with_mode(Mode::Apart)
        .with_alignment(8, 8);
    let moved = alloc.allocate(&mut ctx, &log, &apart).unwrap().unwrap();
    assert!(
        moved.start + moved.length <= free_start + upper,
        "busy blocks handed out: {moved:?}"
    );
    assert!(moved.start >= free_start + upper / 2 - 8, "{moved:?}");
    assert_eq!(moved.start % 8, 0);
    alloc.check_invariants(&mut ctx, AgNumber(0)).unwrap();
}

// Exact mode tries the target's AG only: a failure there locks no other AG's header.
#[test]
fn exact_stays_in_the_target_ag() {
    let (device, geometry) = formatted(64 << 20, 4096, 4);
    let cache = cache(&device, &geometry);
    let alloc = allocator(&geometry);
    let log = TestLog::default();
    let mut ctx = CacheContext::new(&cache);
    let header = FsBlock(geometry.ag_start(1));
    let exact = Request::near(header, 1, 1).with_mode(Mode::Exact);
    assert_eq!(alloc.allocate(&mut ctx, &log, &exact).unwrap(), None);
    for ag in 0..geometry.ag_count {
        let agf = FsBlock(geometry.ag_start(ag) + u64::from(cairn_format::limits::AG_AGF_BLOCK));
        assert!(!ctx.holds(agf) || ag == 1, "AG {ag}'s header was locked");
    }
}
