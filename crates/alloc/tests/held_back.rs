#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Blocks held back for promised writes (write-behind's reservations): no allocation outside
//! a `ReservedScope` takes them, and one inside may.

mod support;

use cairn_alloc::{Mode, Request, ReservedScope};
use cairn_btree::CacheContext;
use cairn_format::FsBlock;
use support::{TestLog, allocator, cache, formatted};

// With all but 100 blocks held back, an ordinary request gets at most those 100 (a larger
// one is cut down to them, then nothing is left), while a request inside a reserved scope
// still gets the held-back blocks.
#[test]
fn held_back_blocks_go_only_to_reserved_scopes() {
    let (device, geometry) = formatted(64 << 20, 4096, 4);
    let cache = cache(&device, &geometry);
    let alloc = allocator(&geometry);
    let log = TestLog::default();
    let mut ctx = CacheContext::new(&cache);
    let start = FsBlock(geometry.ag_start(0));
    // Read every AG once, so the allocator knows their free counts.
    for ag in 0..geometry.ag_count {
        let one = Request::near(FsBlock(geometry.ag_start(ag)), 1, 1).in_target_ag_only();
        alloc.allocate(&mut ctx, &log, &one).unwrap().unwrap();
    }
    let free: u64 = (0..geometry.ag_count)
        .map(|ag| u64::from(alloc.free_blocks_hint(ag).unwrap() - alloc.ag_reserve()))
        .sum();
    alloc.hold_back(free - 100);
    let big = Request::near(start, 1, 4096).with_mode(Mode::Size);
    let mut taken = 0u64;
    while let Some(found) = alloc.allocate(&mut ctx, &log, &big).unwrap() {
        taken += u64::from(found.length);
    }
    assert_eq!(taken, 100, "ordinary requests took held-back blocks");
    let _scope = ReservedScope::enter();
    let found = alloc.allocate(&mut ctx, &log, &big).unwrap();
    assert!(found.is_some_and(|found| found.length > 100));
}
