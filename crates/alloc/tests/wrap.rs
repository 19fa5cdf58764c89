#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! An AG near the target that is locked but cannot serve a request must not end the search:
//! when the attempt changed nothing, its buffers are given back and the lower AGs are tried.

mod support;

use cairn_alloc::{Mode, Request};
use cairn_btree::{Buffers, CacheContext};
use cairn_format::FsBlock;
use support::{TestLog, allocator, cache, formatted};

// The last AG's only free extent is 70 blocks long but holds no 64-aligned run of 64: the
// hint lets a request for one in, the search fails, and AG 0 serves it. Before the give-back
// the locked AG kept the allocator from wrapping and the request got nothing.
#[test]
fn a_failed_ag_above_lets_the_search_wrap_below() {
    let (device, geometry) = formatted(64 << 20, 4096, 4);
    let cache = cache(&device, &geometry);
    let alloc = allocator(&geometry);
    let log = TestLog::default();
    let last_ag = geometry.ag_count - 1;
    let last = FsBlock(geometry.ag_start(last_ag));
    let mut setup = CacheContext::new(&cache);
    let everything = Request::near(last, 1, 4096)
        .with_mode(Mode::Size)
        .in_target_ag_only();
    while alloc
        .allocate(&mut setup, &log, &everything)
        .unwrap()
        .is_some()
    {}
    // AG blocks 1025..1095: 64-aligned starts in it (1088) leave too few blocks.
    alloc
        .free(&mut setup, &log, FsBlock(last.0 + 1025), 70, 1)
        .unwrap();
    setup.release_all();
    cache.flush_delwri().unwrap(); // a context gives back only clean buffers
    log.durable.set(1);

    let mut ctx = CacheContext::new(&cache);
    let aligned = Request::near(last, 64, 64).with_alignment(64, 64);
    let found = alloc.allocate(&mut ctx, &log, &aligned).unwrap();
    let found = found.expect("an aligned extent in a lower AG");
    assert!(found.ag.0 < last_ag, "{found:?}");
    assert_eq!(found.start % 64, 0);
    let last_agf = FsBlock(last.0 + u64::from(cairn_format::limits::AG_AGF_BLOCK));
    assert!(!ctx.holds(last_agf), "the failed AG's header is still held");
}
