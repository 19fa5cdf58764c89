//! Edits on one inode's tree through the public API: lookups, merging, splitting, fill with
//! holes, unwritten conversion, punch, truncate, and the typed errors for bad input. Every
//! test checks the invariants after each step.

#![allow(
    clippy::unwrap_used,
    clippy::panic,
    reason = "test helpers outside #[test] functions may fail loudly"
)]

use cairn_extcache::{CacheConfig, ExtCacheError, Extent, ExtentCache, ExtentState, InodeExtents};

fn written(start: u64, count: u64, physical_block: u64) -> Extent {
    Extent::new(start, count, ExtentState::Written { physical_block }).unwrap()
}

fn unwritten(start: u64, count: u64, physical_block: u64) -> Extent {
    Extent::new(start, count, ExtentState::Unwritten { physical_block }).unwrap()
}

fn state(start: u64, count: u64, state: ExtentState) -> Extent {
    Extent::new(start, count, state).unwrap()
}

fn setup() -> (ExtentCache, InodeExtents) {
    let cache = ExtentCache::new(CacheConfig::default()).unwrap();
    let inode = cache.open_inode(7);
    (cache, inode)
}

fn all(inode: &InodeExtents) -> Vec<Extent> {
    inode.cached_extents(0, u64::MAX).unwrap()
}

fn check(cache: &ExtentCache, inode: &InodeExtents) {
    inode.check_invariants().unwrap();
    cache.check_invariants().unwrap();
}

#[test]
fn lookup_returns_whole_entry_and_misses_outside() {
    // A hit gives the entry's start and length; blocks around it miss and count as misses.
    let (cache, inode) = setup();
    inode.insert(written(10, 10, 100)).unwrap();
    check(&cache, &inode);
    assert_eq!(inode.lookup(15), Some(written(10, 10, 100)));
    assert_eq!(inode.lookup(10), Some(written(10, 10, 100)));
    assert_eq!(inode.lookup(9), None);
    assert_eq!(inode.lookup(20), None);
    let stats = cache.stats();
    assert_eq!((stats.hits, stats.misses, stats.objects), (2, 2, 1));
    assert_eq!(
        written(10, 10, 100).state_at(15),
        Some(ExtentState::Written {
            physical_block: 105
        })
    );
}

#[test]
fn compatible_neighbours_merge_and_others_do_not() {
    // Physically contiguous written extents merge, holes merge, other pairs stay apart.
    let (cache, inode) = setup();
    inode.insert(written(0, 4, 100)).unwrap();
    inode.insert(written(4, 4, 104)).unwrap();
    check(&cache, &inode);
    assert_eq!(all(&inode), vec![written(0, 8, 100)]);
    inode.insert(written(8, 4, 200)).unwrap();
    inode.insert(unwritten(12, 4, 204)).unwrap();
    inode.insert(state(16, 2, ExtentState::Hole)).unwrap();
    inode.insert(state(18, 2, ExtentState::Hole)).unwrap();
    inode.insert(state(20, 2, ExtentState::Delayed)).unwrap();
    inode.insert(state(22, 2, ExtentState::Delayed)).unwrap();
    check(&cache, &inode);
    let want = vec![
        written(0, 8, 100),
        written(8, 4, 200),
        unwritten(12, 4, 204),
        state(16, 4, ExtentState::Hole),
        state(20, 4, ExtentState::Delayed),
    ];
    assert_eq!(all(&inode), want);
    // Filling the gap between two written pieces with the matching blocks joins all three.
    inode.insert(written(30, 2, 300)).unwrap();
    inode.insert(written(34, 2, 304)).unwrap();
    inode.insert(written(32, 2, 302)).unwrap();
    check(&cache, &inode);
    assert_eq!(inode.lookup(31), Some(written(30, 6, 300)));
}

#[test]
fn overwrite_splits_and_adjusts_physical_blocks() {
    // Inserting inside an extent leaves two remainders whose physical blocks follow the split.
    let (cache, inode) = setup();
    inode.insert(written(0, 100, 1000)).unwrap();
    inode.insert(unwritten(40, 10, 5000)).unwrap();
    check(&cache, &inode);
    assert_eq!(
        all(&inode),
        vec![
            written(0, 40, 1000),
            unwritten(40, 10, 5000),
            written(50, 50, 1050)
        ]
    );
    // Overwriting across two entries trims both.
    inode.insert(state(45, 10, ExtentState::Hole)).unwrap();
    check(&cache, &inode);
    let want = vec![
        written(0, 40, 1000),
        unwritten(40, 5, 5000),
        state(45, 10, ExtentState::Hole),
        written(55, 45, 1055),
    ];
    assert_eq!(all(&inode), want);
    // Putting the original mapping back merges everything into one entry again.
    inode.insert(written(40, 15, 1040)).unwrap();
    check(&cache, &inode);
    assert_eq!(all(&inode), vec![written(0, 100, 1000)]);
    assert_eq!(cache.stats().objects, 1);
}

#[test]
fn fill_caches_holes_in_gaps_and_keeps_delayed() {
    // A fill from disk turns gaps into holes, overwrites stale entries, keeps delayed ones.
    let (cache, inode) = setup();
    inode.insert(state(12, 2, ExtentState::Delayed)).unwrap();
    inode.insert(written(30, 5, 9999)).unwrap();
    let mapped = [written(5, 3, 500), unwritten(20, 4, 700)];
    let filled = inode.fill(0, 32, &mapped).unwrap();
    check(&cache, &inode);
    assert_eq!(filled, 30);
    let want = vec![
        state(0, 5, ExtentState::Hole),
        written(5, 3, 500),
        state(8, 4, ExtentState::Hole),
        state(12, 2, ExtentState::Delayed),
        state(14, 6, ExtentState::Hole),
        unwritten(20, 4, 700),
        state(24, 8, ExtentState::Hole),
        written(32, 3, 10001),
    ];
    assert_eq!(all(&inode), want);
    let stats = cache.stats();
    assert_eq!((stats.objects, stats.reclaimable_objects), (8, 7));
}

#[test]
fn convert_unwritten_turns_cached_blocks_written() {
    // Conversion flips only the cached unwritten blocks in range and merges the result.
    let (cache, inode) = setup();
    inode.insert(written(0, 10, 100)).unwrap();
    inode.insert(unwritten(10, 10, 110)).unwrap();
    inode.insert(state(20, 5, ExtentState::Hole)).unwrap();
    assert_eq!(inode.convert_unwritten(10, 5).unwrap(), 5);
    check(&cache, &inode);
    assert_eq!(
        all(&inode),
        vec![
            written(0, 15, 100),
            unwritten(15, 5, 115),
            state(20, 5, ExtentState::Hole)
        ]
    );
    assert_eq!(inode.convert_unwritten(0, 100).unwrap(), 5);
    check(&cache, &inode);
    assert_eq!(
        all(&inode),
        vec![written(0, 20, 100), state(20, 5, ExtentState::Hole)]
    );
    assert_eq!(inode.convert_unwritten(50, 10).unwrap(), 0);
}

#[test]
fn remove_range_and_truncate_forget_entries() {
    // Punching out of the cache splits the straddling entries; truncate drops the tail.
    let (cache, inode) = setup();
    inode.insert(written(0, 100, 1000)).unwrap();
    assert_eq!(inode.remove_range(10, 20).unwrap(), 20);
    check(&cache, &inode);
    assert_eq!(
        all(&inode),
        vec![written(0, 10, 1000), written(30, 70, 1030)]
    );
    assert_eq!(inode.lookup(15), None);
    assert_eq!(inode.truncate(50), 50);
    check(&cache, &inode);
    assert_eq!(
        all(&inode),
        vec![written(0, 10, 1000), written(30, 20, 1030)]
    );
    assert_eq!(inode.truncate(u64::MAX), 0);
    assert_eq!(inode.truncate(0), 30);
    check(&cache, &inode);
    assert!(all(&inode).is_empty());
    let stats = cache.stats();
    assert_eq!((stats.objects, stats.inodes_on_list), (0, 0));
}

#[test]
fn cached_extents_reports_overlapping_entries() {
    // The range query returns whole entries overlapping the range, in order.
    let (_cache, inode) = setup();
    inode.fill(0, 40, &[written(10, 10, 100)]).unwrap();
    let found = inode.cached_extents(15, 10).unwrap();
    assert_eq!(
        found,
        vec![written(10, 10, 100), state(20, 20, ExtentState::Hole)]
    );
    assert_eq!(inode.cached_extents(50, 10).unwrap(), vec![]);
}

#[test]
fn bad_input_is_refused_with_typed_errors() {
    // Empty and overflowing ranges, bad fills and bad configs are errors; nothing changes.
    let (cache, inode) = setup();
    assert_eq!(
        Extent::new(5, 0, ExtentState::Hole),
        Err(ExtCacheError::EmptyRange { start: 5 })
    );
    assert!(matches!(
        Extent::new(u64::MAX - 1, 2, ExtentState::Hole),
        Err(ExtCacheError::LogicalOverflow { .. })
    ));
    assert!(matches!(
        Extent::new(
            0,
            2,
            ExtentState::Written {
                physical_block: u64::MAX
            }
        ),
        Err(ExtCacheError::PhysicalOverflow { .. })
    ));
    let raw = Extent {
        logical_block: 0,
        block_count: 0,
        state: ExtentState::Hole,
    };
    assert!(matches!(
        inode.insert(raw),
        Err(ExtCacheError::EmptyRange { .. })
    ));
    assert!(matches!(
        inode.remove_range(u64::MAX, 1),
        Err(ExtCacheError::LogicalOverflow { .. })
    ));
    assert!(matches!(
        inode.convert_unwritten(3, 0),
        Err(ExtCacheError::EmptyRange { .. })
    ));
    assert!(matches!(
        inode.pin_range(3, 0),
        Err(ExtCacheError::EmptyRange { .. })
    ));
    assert!(matches!(
        inode.cached_extents(3, 0),
        Err(ExtCacheError::EmptyRange { .. })
    ));
    let outside = inode.fill(10, 10, &[written(5, 10, 100)]);
    assert!(matches!(
        outside,
        Err(ExtCacheError::FillOutsideRange { .. })
    ));
    let unsorted = inode.fill(0, 100, &[written(50, 10, 100), written(10, 10, 200)]);
    assert!(matches!(
        unsorted,
        Err(ExtCacheError::FillUnsorted {
            start: 10,
            previous_end: 60
        })
    ));
    let delayed = inode.fill(0, 100, &[state(10, 10, ExtentState::Delayed)]);
    assert!(matches!(
        delayed,
        Err(ExtCacheError::FillNotOnDisk { start: 10, .. })
    ));
    assert_eq!(cache.stats().objects, 0);
    check(&cache, &inode);
    let inverted = CacheConfig {
        memory_low_bytes: 10,
        memory_high_bytes: 5,
        ..CacheConfig::default()
    };
    assert!(matches!(
        ExtentCache::new(inverted),
        Err(ExtCacheError::BadConfig { .. })
    ));
    let no_scan = CacheConfig {
        scan_entries_per_call: 0,
        ..CacheConfig::default()
    };
    assert!(matches!(
        ExtentCache::new(no_scan),
        Err(ExtCacheError::BadConfig { .. })
    ));
    let no_walk = CacheConfig {
        inodes_walked_per_call: 100_000,
        ..CacheConfig::default()
    };
    assert!(matches!(
        ExtentCache::new(no_walk),
        Err(ExtCacheError::BadConfig { .. })
    ));
}

#[test]
fn dropping_the_handle_frees_entries_and_unlinks() {
    // Evicting an inode returns its entries to the global count and leaves the reclaim list.
    let cache = ExtentCache::new(CacheConfig::default()).unwrap();
    let keep = cache.open_inode(1);
    keep.insert(written(0, 1, 5)).unwrap();
    {
        let gone = cache.open_inode(2);
        for i in 0..50 {
            gone.insert(written(i * 2, 1, i * 10)).unwrap();
        }
        let pin = gone.pin_range(0, 10).unwrap();
        assert_eq!(gone.pin_count(), 1);
        drop(pin);
        assert_eq!(gone.pin_count(), 0);
        assert_eq!(cache.stats().objects, 51);
        assert_eq!(
            cache.worst_inode().map(|w| (w.ino, w.objects)),
            Some((2, 50))
        );
        cache.check_invariants().unwrap();
    }
    cache.check_invariants().unwrap();
    let stats = cache.stats();
    assert_eq!((stats.objects, stats.inodes_on_list), (1, 1));
    assert_eq!(cache.worst_inode().map(|w| w.ino), Some(1));
    assert_eq!(keep.ino(), 1);
}
