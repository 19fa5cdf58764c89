//! The shrinker through the public API: bounded work per call, second-chance aging, LRU order
//! over inodes, delayed and pinned entries kept, watermark hysteresis, the background thread,
//! and a concurrent run with invariants checked at the end.

#![allow(
    clippy::unwrap_used,
    clippy::panic,
    reason = "test helpers outside #[test] functions may fail loudly"
)]

use cairn_extcache::{CacheConfig, ExtCacheError, Extent, ExtentCache, ExtentState, InodeExtents};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// Caches `count` separate one-block written entries (gaps keep them from merging).
fn populate(inode: &InodeExtents, count: u64) {
    for i in 0..count {
        let extent = Extent::new(
            i * 2,
            1,
            ExtentState::Written {
                physical_block: i * 10,
            },
        );
        inode.insert(extent.unwrap()).unwrap();
    }
}

fn cache_with(config: CacheConfig) -> ExtentCache {
    ExtentCache::new(config).unwrap()
}

#[test]
fn a_call_never_exceeds_its_budgets() {
    // However many entries and inodes there are, one call examines <= nr_to_scan entries
    // over <= inodes_walked_per_call inodes.
    let cache = cache_with(CacheConfig {
        inodes_walked_per_call: 5,
        ..CacheConfig::default()
    });
    let inodes: Vec<_> = (0..40).map(|ino| cache.open_inode(ino)).collect();
    for inode in &inodes {
        populate(inode, 30);
    }
    for nr_to_scan in [1, 7, 128, 100_000] {
        let outcome = cache.shrink(nr_to_scan);
        assert!(
            outcome.examined <= nr_to_scan.min(cairn_extcache::limits::SCAN_ENTRIES_PER_CALL_MAX)
        );
        assert!(outcome.inodes_walked <= 5);
        assert!(outcome.freed <= outcome.examined);
        cache.check_invariants().unwrap();
        inodes
            .iter()
            .try_for_each(|i| i.check_invariants())
            .unwrap();
    }
}

#[test]
fn referenced_entries_get_a_second_chance() {
    // Entries looked up since the last visit survive one scan (their bit is cleared), and go
    // on the next one; the inode itself is passed over once after being used.
    let cache = cache_with(CacheConfig::default());
    let inode = cache.open_inode(1);
    populate(&inode, 10);
    for block in [0, 4, 8] {
        assert!(inode.lookup(block).is_some());
    }
    let first = cache.shrink(128);
    assert_eq!(
        (first.inodes_walked, first.inodes_scanned, first.freed),
        (1, 0, 0)
    );
    let second = cache.shrink(128);
    assert_eq!(
        (second.inodes_scanned, second.examined, second.freed),
        (1, 10, 7)
    );
    inode.check_invariants().unwrap();
    let kept: Vec<u64> = inode
        .cached_extents(0, 100)
        .unwrap()
        .iter()
        .map(|e| e.logical_block)
        .collect();
    assert_eq!(kept, vec![0, 4, 8]);
    let third = cache.shrink(128);
    assert_eq!(third.freed, 3);
    cache.check_invariants().unwrap();
    let stats = cache.stats();
    assert_eq!(
        (
            stats.objects,
            stats.inodes_on_list,
            stats.shrunk_objects_total
        ),
        (0, 0, 10)
    );
    assert_eq!(stats.scans, 3);
    assert!(stats.scan_time_max_ns >= stats.scan_time_avg_ns);
}

#[test]
fn least_recently_used_inode_is_shrunk_first() {
    // After a pass clears every inode's referenced flag, a used inode is passed over and the
    // least recently used one loses its entries.
    let cache = cache_with(CacheConfig {
        inodes_walked_per_call: 3,
        ..CacheConfig::default()
    });
    let inodes: Vec<_> = (0..3).map(|ino| cache.open_inode(ino)).collect();
    for inode in &inodes {
        populate(inode, 5);
    }
    let aging = cache.shrink(128);
    assert_eq!((aging.inodes_walked, aging.freed), (3, 0));
    assert!(inodes[0].lookup(0).is_some());
    let outcome = cache.shrink(5);
    assert_eq!(outcome.freed, 5);
    let counts: Vec<u64> = inodes.iter().map(|i| i.object_count()).collect();
    assert_eq!(counts, vec![5, 0, 5]);
    cache.check_invariants().unwrap();
    assert_eq!(cache.stats().inodes_on_list, 2);
}

#[test]
fn delayed_and_pinned_entries_are_never_dropped() {
    // Shrinking to exhaustion leaves exactly the delayed entries and those under a pin.
    let cache = cache_with(CacheConfig::default());
    let inode = cache.open_inode(3);
    populate(&inode, 20);
    inode
        .insert(Extent::new(100, 5, ExtentState::Delayed).unwrap())
        .unwrap();
    let pin = inode.pin_range(10, 5).unwrap();
    for _ in 0..10 {
        cache.shrink(128);
        inode.check_invariants().unwrap();
    }
    let kept: Vec<u64> = inode
        .cached_extents(0, 200)
        .unwrap()
        .iter()
        .map(|e| e.logical_block)
        .collect();
    assert_eq!(kept, vec![10, 12, 14, 100]);
    let stats = cache.stats();
    assert_eq!((stats.objects, stats.reclaimable_objects), (4, 3));
    drop(pin);
    for _ in 0..3 {
        cache.shrink(128);
    }
    assert_eq!(inode.cached_extents(0, 200).unwrap().len(), 1);
    cache.check_invariants().unwrap();
}

#[test]
fn maybe_shrink_runs_between_the_watermarks() {
    // Nothing happens below the high watermark; once above it, calls shrink until the low one.
    let cache = cache_with(CacheConfig::with_entry_watermarks(100, 50));
    let inodes: Vec<_> = (0..10).map(|ino| cache.open_inode(ino)).collect();
    for inode in &inodes {
        populate(inode, 9);
    }
    assert_eq!(cache.maybe_shrink(), None);
    populate(&inodes[0], 30);
    assert!(cache.stats().objects > 100);
    let mut calls = 0;
    while cache.maybe_shrink().is_some() {
        calls += 1;
        assert!(calls < 100, "reclaim did not converge");
        cache.check_invariants().unwrap();
    }
    assert!(cache.stats().objects <= 50);
    assert_eq!(cache.maybe_shrink(), None);
}

#[test]
fn background_shrinker_brings_the_cache_under_the_low_watermark() {
    // Inserting past the high watermark wakes the thread, which reclaims down to the low one.
    let cache = cache_with(CacheConfig::with_entry_watermarks(1000, 600));
    let shrinker = cache.start_shrinker().unwrap();
    assert!(matches!(
        cache.start_shrinker(),
        Err(ExtCacheError::ShrinkerRunning)
    ));
    let inodes: Vec<_> = (0..20).map(|ino| cache.open_inode(ino)).collect();
    for inode in &inodes {
        populate(inode, 100);
    }
    // Generous bound: this waits for progress, it does not time anything.
    let deadline = Instant::now() + Duration::from_secs(30);
    while cache.stats().objects > 600 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(5));
    }
    shrinker.stop();
    assert!(cache.stats().objects <= 600, "{}", cache.stats());
    cache.check_invariants().unwrap();
    let restarted = cache.start_shrinker().unwrap();
    drop(restarted);
}

#[test]
fn concurrent_edits_lookups_and_shrinks_stay_consistent() {
    // Two editors, a direct shrinker and the background thread run together; afterwards every
    // tree and the global totals check out and nothing delayed was lost.
    let cache = cache_with(CacheConfig::with_entry_watermarks(2000, 1500));
    let shrinker = cache.start_shrinker().unwrap();
    let workers: Vec<_> = (0..2u64)
        .map(|worker| {
            let cache = cache.clone();
            thread::spawn(move || run_editor(&cache, worker))
        })
        .collect();
    let direct = {
        let cache = cache.clone();
        thread::spawn(move || {
            for _ in 0..2000 {
                cache.shrink(64);
                let _ = cache.worst_inode();
            }
        })
    };
    let survivors: Vec<InodeExtents> = workers
        .into_iter()
        .flat_map(|w| w.join().unwrap())
        .collect();
    direct.join().unwrap();
    shrinker.stop();
    for inode in &survivors {
        inode.check_invariants().unwrap();
        assert_eq!(
            inode.cached_extents(1_000_000, 4).unwrap().len(),
            1,
            "delayed entry lost"
        );
    }
    cache.check_invariants().unwrap();
    let stats = cache.stats();
    assert!(stats.scans > 0 && stats.hits + stats.misses > 0);
}

/// One editor thread: inodes opened, filled, edited, looked up, some evicted.
fn run_editor(cache: &ExtentCache, worker: u64) -> Vec<InodeExtents> {
    let inodes: Vec<_> = (0..16)
        .map(|i| cache.open_inode(worker * 1000 + i))
        .collect();
    for inode in &inodes {
        let delayed = Extent::new(1_000_000, 4, ExtentState::Delayed).unwrap();
        inode.insert(delayed).unwrap();
    }
    let inodes = Arc::new(inodes);
    for round in 0..3000u64 {
        let inode = &inodes[(round % 16) as usize];
        let block = (round * 7919) % 500;
        if inode.lookup(block).is_none() {
            let mapped = [Extent::new(
                block,
                1,
                ExtentState::Written {
                    physical_block: block * 3,
                },
            )
            .unwrap()];
            inode.fill(block, 2, &mapped).unwrap();
        }
        if round % 5 == 0 {
            inode
                .insert(
                    Extent::new(
                        block,
                        3,
                        ExtentState::Unwritten {
                            physical_block: round,
                        },
                    )
                    .unwrap(),
                )
                .unwrap();
            inode.convert_unwritten(block, 2).unwrap();
        }
        if round % 97 == 0 {
            inode.remove_range(block, 50).unwrap();
        }
        if round % 501 == 0 {
            let evicted = cache.open_inode(worker * 1000 + 999);
            populate(&evicted, 20);
        }
    }
    Arc::try_unwrap(inodes).unwrap()
}
