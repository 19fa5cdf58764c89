#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The per-AG reserve: ordinary requests leave it free, `use_reserve` requests may take it.

mod support;

use cairn_alloc::Request;
use cairn_btree::CacheContext;
use cairn_format::{AgNumber, FsBlock};
use support::{TestLog, allocator, cache, formatted};

// Ordinary single-block requests fill a one-AG filesystem down to the reserve and then get
// nothing; requests with `use_reserve` get exactly the reserved blocks after that.
#[test]
fn ordinary_requests_leave_the_reserve_to_reserve_users() {
    const RESERVE: u32 = 12;
    let (device, geometry) = formatted(4 << 20, 512, 1);
    let cache = cache(&device, &geometry);
    let alloc = allocator(&geometry).with_ag_reserve(RESERVE);
    assert_eq!(alloc.ag_reserve(), RESERVE);
    let log = TestLog::default();
    let mut ctx = CacheContext::new(&cache);
    let target = FsBlock(geometry.ag_start(0));
    let ordinary = Request::near(target, 1, 64);
    while alloc.allocate(&mut ctx, &log, &ordinary).unwrap().is_some() {}
    let free = alloc
        .check_invariants(&mut ctx, AgNumber(0))
        .unwrap()
        .free_blocks;
    assert!(
        free > 0 && free <= RESERVE,
        "{free} free, {RESERVE} reserved"
    );
    let single = Request::near(target, 1, 1);
    assert!(alloc.allocate(&mut ctx, &log, &single).unwrap().is_none());
    let mut taken = 0;
    while let Some(found) = alloc
        .allocate(&mut ctx, &log, &single.with_reserve())
        .unwrap()
    {
        taken += found.length;
        assert!(taken <= free, "took {taken} of {free} free blocks");
    }
    assert!(taken + 8 >= free, "took {taken} of {free} free blocks");
    alloc.check_invariants(&mut ctx, AgNumber(0)).unwrap();
}
