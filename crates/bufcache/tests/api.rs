//! Behaviour of each public operation on a small formatted memory device.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Barrier;

use cairn_blockdev::BlockDevice;
use cairn_bufcache::{BufCacheError, BufKey, CacheConfig, ReadSpec};
use cairn_format::{FormatError, FsBlock, HEADER_SIZE, Lsn, block_lsn};
use common::*;

// Checks that a miss reads and verifies once, and hits reuse the buffer without reading.
#[test]
fn get_reads_once_then_hits() {
    let device = formatted_device();
    let cache = cache_on(&device, config());
    for round in 0..3 {
        let guard = cache.get(BufKey::single(70), &spec()).unwrap();
        assert_eq!(guard[HEADER_SIZE + 3], pattern(70, HEADER_SIZE + 3));
        assert_eq!(guard.key(), BufKey::single(70));
        assert_eq!(guard.block(), FsBlock(70));
        drop(guard);
        cache.check_invariants().unwrap();
        let stats = cache.stats();
        assert_eq!((stats.reads, stats.misses, stats.hits), (1, 1, round));
    }
    // The miss filled the slot, so both later lookups were lookaside hits.
    assert_eq!(cache.stats().lookaside_hits, 2);
    assert_eq!(device.stats().reads, 1);
}

// Checks that a block failing its verifier, or a failing read, is reported and not cached.
#[test]
fn read_failures_are_typed_and_not_cached() {
    let device = formatted_device();
    let cache = cache_on(&device, config());
    let wrong_owner = spec().with_owner(9);
    match cache.get(BufKey::single(5), &wrong_owner) {
        Err(BufCacheError::Verify { block, source, .. }) => {
            assert_eq!(block, FsBlock(5));
            assert!(matches!(source, FormatError::WrongOwner { .. }));
        }
        other => panic!("{other:?}"),
    }
    cache.check_invariants().unwrap();
    assert_eq!(cache.cached_count(), 0);
    device.fail_reads_in(6 * 512..7 * 512);
    assert!(matches!(
        cache.get(BufKey::single(6), &spec()),
        Err(BufCacheError::Read {
            block: FsBlock(6),
            ..
        })
    ));
    cache.check_invariants().unwrap();
    device.clear_faults();
    assert_eq!(
        cache.get(BufKey::single(6), &spec()).unwrap()[100],
        pattern(6, 100)
    );
    assert_eq!(cache.stats().read_failures, 2);
    cache.check_invariants().unwrap();
}

// Checks that get_new hands out zeroes without reading, even over a cached copy.
#[test]
fn get_new_is_zeroed_and_unread() {
    let device = formatted_device();
    let cache = cache_on(&device, config());
    let fresh = cache.get_new(BufKey::single(9), &spec()).unwrap();
    assert!(fresh.iter().all(|&b| b == 0));
    drop(fresh);
    assert_eq!(cache.stats().reads, 0);
    let mut cached = cache.get(BufKey::single(10), &spec()).unwrap();
    cached.write(60, &[1, 2, 3]).unwrap();
    drop(cached);
    let again = cache.get_new(BufKey::single(10), &spec()).unwrap();
    assert!(again.iter().all(|&b| b == 0));
    drop(again);
    cache.check_invariants().unwrap();
}

// Checks that try_get fails with WouldBlock on a locked buffer and succeeds once it is free.
#[test]
fn try_get_does_not_wait() {
    let device = formatted_device();
    let cache = cache_on(&device, config());
    let held = cache.get(BufKey::single(3), &spec()).unwrap();
    std::thread::scope(|scope| {
        scope.spawn(|| {
            assert!(matches!(
                cache.try_get(BufKey::single(3), &spec()),
                Err(BufCacheError::WouldBlock { block: FsBlock(3) })
            ));
        });
    });
    drop(held);
    assert!(cache.try_get(BufKey::single(3), &spec()).is_ok());
    assert_eq!(cache.stats().lock_busy, 1);
    cache.check_invariants().unwrap();
}

// Checks that concurrent misses on one block read it once and share one buffer.
#[test]
fn concurrent_misses_read_once() {
    let device = formatted_device();
    let cache = cache_on(&device, config());
    let barrier = Barrier::new(6);
    std::thread::scope(|scope| {
        for _ in 0..6 {
            scope.spawn(|| {
                barrier.wait();
                let guard = cache.get(BufKey::single(77), &spec()).unwrap();
                assert_eq!(guard[200], pattern(77, 200));
            });
        }
    });
    assert_eq!(cache.stats().reads, 1);
    assert_eq!(cache.stats().gets, 6);
    assert_eq!(cache.cached_count(), 1);
    cache.check_invariants().unwrap();
}

// Checks address validation: zero length, too long, past the end, crossing an AG.
#[test]
fn bad_addresses_are_refused() {
    let device = formatted_device();
    let cache = cache_on(&device, config());
    for key in [
        BufKey::new(FsBlock(1), 0),
        BufKey::new(FsBlock(1), 129),
        BufKey::single(u64::from(AG_BLOCKS * AG_COUNT)),
        BufKey::new(FsBlock(63), 2),
    ] {
        assert!(
            matches!(
                cache.get(key, &spec()),
                Err(BufCacheError::BadAddress { .. })
            ),
            "{key:?}"
        );
    }
    let dyn_device: std::sync::Arc<dyn BlockDevice> = device.clone();
    let too_many_ags = CacheConfig::new(BLOCK_SIZE, AG_BLOCKS, AG_COUNT + 1);
    assert!(matches!(
        cache_on_result(dyn_device, too_many_ags),
        Err(BufCacheError::Config {
            field: "ag_count",
            ..
        })
    ));
}

fn cache_on_result(
    device: std::sync::Arc<dyn BlockDevice>,
    config: CacheConfig,
) -> Result<cairn_bufcache::BufferCache, BufCacheError> {
    cairn_bufcache::BufferCache::new(config, device)
}

// Checks dirty range recording, merging, taking, and range errors.
#[test]
fn dirty_ranges_are_recorded() {
    let device = formatted_device();
    let cache = cache_on(&device, config());
    let mut guard = cache.get(BufKey::single(12), &spec()).unwrap();
    assert!(!guard.is_dirty());
    guard.write(100, &[1; 10]).unwrap();
    guard.bytes_mut(110..120).unwrap().fill(2);
    guard.mark_dirty(200..210).unwrap();
    guard.mark_dirty(300..300).unwrap();
    assert!(guard.is_dirty());
    assert_eq!(guard.dirty_ranges(), &[100..120, 200..210]);
    assert_eq!(guard[115], 2);
    assert!(matches!(
        guard.write(510, &[0; 4]),
        Err(BufCacheError::Range { .. })
    ));
    assert!(matches!(
        guard.write(usize::MAX, &[0; 4]),
        Err(BufCacheError::Range { .. })
    ));
    assert_eq!(guard.take_dirty_ranges(), vec![100..120, 200..210]);
    assert!(guard.dirty_ranges().is_empty());
    assert!(
        guard.is_dirty(),
        "taking ranges for the log does not write the buffer home"
    );
    guard.set_lsn(Lsn::new(3, 4));
    assert_eq!(guard.lsn(), Some(Lsn::new(3, 4)));
    drop(guard);
    cache.check_invariants().unwrap();
}

fn dirty(cache: &cairn_bufcache::BufferCache, block: u64, byte: u8) {
    let mut guard = cache.get(BufKey::single(block), &spec()).unwrap();
    guard.write(HEADER_SIZE, &[byte; 8]).unwrap();
    guard.set_lsn(Lsn::new(1, block as u32));
    assert!(guard.queue_delwri());
    assert!(!guard.queue_delwri());
}

// Checks write-back in disk order with adjacent buffers joined, LSN and CRC stamped.
#[test]
fn delwri_writes_in_order_and_joins_adjacent() {
    let device = formatted_device();
    let cache = cache_on(&device, config());
    for block in [22u64, 20, 21, 30] {
        dirty(&cache, block, block as u8);
    }
    assert_eq!(cache.delwri_queued(), 4);
    let writes_before = device.stats().writes;
    let report = cache.flush_delwri().unwrap();
    assert_eq!(report.buffers_written, 4);
    assert_eq!(report.write_ops, 2);
    assert_eq!(report.bytes_written, 4 * 512);
    assert_eq!(device.stats().writes - writes_before, 2);
    assert_eq!(cache.delwri_queued(), 0);
    cache.check_invariants().unwrap();
    // Reclaim everything and read back through the verifier: CRC and LSN were stamped.
    cache.reclaim(u64::MAX);
    assert_eq!(cache.cached_count(), 0);
    for block in [20u64, 21, 22, 30] {
        let guard = cache.get(BufKey::single(block), &spec()).unwrap();
        assert_eq!(guard[HEADER_SIZE..HEADER_SIZE + 8], [block as u8; 8]);
        assert_eq!(block_lsn(&guard), Some(Lsn::new(1, block as u32)));
        assert!(!guard.is_dirty());
    }
    cache.check_invariants().unwrap();
}

// Checks that the batch size limit splits a run of adjacent buffers.
#[test]
fn delwri_batches_are_bounded() {
    let device = formatted_device();
    let cache = cache_on(&device, config().with_delwri_batch_bytes_max(1024));
    for block in 40..45 {
        dirty(&cache, block, 1);
    }
    let report = cache.flush_delwri().unwrap();
    assert_eq!((report.buffers_written, report.write_ops), (5, 3));
    cache.check_invariants().unwrap();
}

// Checks that pinned and locked buffers are skipped, reported and written later.
#[test]
fn delwri_skips_pinned_and_locked() {
    let device = formatted_device();
    let cache = cache_on(&device, config());
    dirty(&cache, 50, 5);
    dirty(&cache, 52, 5);
    let pinned = cache.get(BufKey::single(50), &spec()).unwrap();
    pinned.pin();
    assert_eq!(pinned.pin_count(), 1);
    let handle = pinned.handle();
    drop(pinned);
    let locked = cache.get(BufKey::single(52), &spec()).unwrap();
    let report = cache.flush_delwri().unwrap();
    assert_eq!(report.buffers_written, 0);
    assert_eq!(report.pinned, vec![BufKey::single(50)]);
    assert_eq!(report.busy, vec![BufKey::single(52)]);
    drop(locked);
    // Pinned and dirty buffers survive reclaim.
    cache.reclaim(u64::MAX);
    assert_eq!(cache.cached_count(), 2);
    handle.unpin().unwrap();
    assert!(matches!(
        handle.unpin(),
        Err(BufCacheError::NotPinned { .. })
    ));
    assert_eq!(handle.pin_count(), 0);
    assert!(handle.is_dirty());
    let report = cache.flush_delwri().unwrap();
    assert_eq!(report.buffers_written, 2);
    assert!(!handle.is_dirty());
    assert_eq!(handle.key(), BufKey::single(50));
    cache.check_invariants().unwrap();
}

// Checks that a failed write leaves the buffers dirty and queued, and a retry writes them.
#[test]
fn delwri_write_error_keeps_buffers_dirty() {
    let device = formatted_device();
    let cache = cache_on(&device, config());
    dirty(&cache, 60, 6);
    dirty(&cache, 61, 6);
    dirty(&cache, 90, 9);
    device.fail_writes_in(60 * 512..61 * 512);
    match cache.flush_delwri() {
        Err(BufCacheError::Write {
            block, block_count, ..
        }) => {
            assert_eq!((block, block_count), (FsBlock(60), 2));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(cache.delwri_queued(), 3);
    cache.reclaim(u64::MAX);
    assert_eq!(cache.cached_count(), 3, "dirty buffers are never reclaimed");
    cache.check_invariants().unwrap();
    device.clear_faults();
    assert_eq!(cache.flush_delwri().unwrap().buffers_written, 3);
    cache.check_invariants().unwrap();
}

// Checks that a buffer failing its write check is not written and stays queued.
#[test]
fn delwri_write_check_failure_is_reported() {
    let device = formatted_device();
    let cache = cache_on(&device, config());
    let mut guard = cache.get(BufKey::single(33), &spec()).unwrap();
    guard.write(0, &[0xee; 4]).unwrap(); // breaks the magic
    guard.queue_delwri();
    drop(guard);
    let writes_before = device.stats().writes;
    match cache.flush_delwri() {
        Err(BufCacheError::WriteVerify { block, source, .. }) => {
            assert_eq!(block, FsBlock(33));
            assert!(matches!(source, FormatError::BadMagic { .. }));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(device.stats().writes, writes_before);
    assert_eq!(cache.delwri_queued(), 1);
    cache.check_invariants().unwrap();
}

// Checks lookup statistics for the index path when the lookaside array is off.
#[test]
fn lookaside_off_uses_the_index() {
    let device = formatted_device();
    let cache = cache_on(&device, config().with_lookaside_slots(0));
    for _ in 0..3 {
        drop(cache.get(BufKey::single(8), &spec()).unwrap());
        cache.check_invariants().unwrap();
    }
    let stats = cache.stats();
    assert_eq!((stats.index_hits, stats.lookaside_hits), (2, 0));
    assert_eq!((stats.lookaside_misses, stats.lookaside_inserts), (0, 0));
}

// Checks that a high reuse count keeps a hot buffer cached while one-shot buffers stream by.
#[test]
fn reuse_count_keeps_hot_buffers() {
    let device = formatted_device();
    let limit = 8 * u64::from(BLOCK_SIZE);
    let cache = cache_on(&device, config().with_memory_limit_bytes(limit));
    let hot = ReadSpec::new(&DIR_OPS, UUID).with_lru_ref(3);
    drop(cache.get(BufKey::single(1), &hot).unwrap());
    let reads_before = cache.stats().reads;
    for block in 100..200u64 {
        drop(cache.get(BufKey::single(block), &spec()).unwrap());
        if block % 4 == 0 {
            drop(cache.get(BufKey::single(1), &hot).unwrap());
        }
        cache.check_invariants().unwrap();
        assert!(cache.memory_bytes() <= limit);
    }
    // The hot buffer was read once at the start and never again.
    assert_eq!(cache.stats().reads - reads_before, 100);
    assert!(cache.stats().reclaims >= 90);
}

// Checks that held buffers are never reclaimed, even far over the memory limit.
#[test]
fn held_buffers_are_never_reclaimed() {
    let device = formatted_device();
    let cache = cache_on(&device, config().with_memory_limit_bytes(512));
    let held: Vec<_> = (0..10u64)
        .map(|b| cache.get(BufKey::single(b), &spec()).unwrap())
        .collect();
    assert_eq!(cache.reclaim(u64::MAX).buffers_freed, 0);
    assert_eq!(cache.cached_count(), 10);
    cache.check_invariants().unwrap();
    drop(held);
    cache.check_invariants().unwrap();
    assert_eq!(cache.reclaim(u64::MAX).buffers_freed, 10);
    assert_eq!(cache.memory_bytes(), 0);
    cache.check_invariants().unwrap();
}

// Checks that read-ahead caches a range's missing blocks with one device read, leaves a cached
// block (and its unwritten change) alone, and serves the later lookups without reading.
#[test]
fn read_ahead_caches_missing_blocks_with_one_read() {
    let device = formatted_device();
    let cache = cache_on(&device, config());
    let mut changed = cache.get(BufKey::single(10), &spec()).unwrap();
    changed.write(HEADER_SIZE, &[0xAB; 4]).unwrap();
    drop(changed);
    assert_eq!(cache.read_ahead(BufKey::new(FsBlock(8), 8), &spec()), 7);
    assert_eq!(device.stats().reads, 2);
    for block in 8..16 {
        let guard = cache.get(BufKey::single(block), &spec()).unwrap();
        let want = if block == 10 {
            0xAB
        } else {
            pattern(block, HEADER_SIZE)
        };
        assert_eq!(guard[HEADER_SIZE], want, "block {block}");
    }
    assert_eq!(device.stats().reads, 2, "the lookups were hits");
    let stats = cache.stats();
    assert_eq!((stats.reads, stats.read_aheads, stats.misses), (8, 1, 1));
    // All cached now: nothing to read.
    assert_eq!(cache.read_ahead(BufKey::new(FsBlock(8), 8), &spec()), 0);
    assert_eq!(device.stats().reads, 2);
    cache.check_invariants().unwrap();
}

// Checks that read-ahead is best effort: a block that fails its verifier is left out, a failed
// read or a range crossing an AG caches nothing, and the lookup then reports the error itself.
#[test]
fn read_ahead_leaves_out_what_it_cannot_verify() {
    let device = formatted_device();
    let cache = cache_on(&device, config());
    let mut wrong = cairn_blockdev::AlignedBuf::zeroed(BLOCK_SIZE as usize);
    device
        .read_at(20 * u64::from(BLOCK_SIZE), &mut wrong)
        .unwrap();
    wrong[HEADER_SIZE] ^= 1; // the CRC no longer matches
    device.write_at(20 * u64::from(BLOCK_SIZE), &wrong).unwrap();
    assert_eq!(cache.read_ahead(BufKey::new(FsBlock(18), 4), &spec()), 3);
    assert!(matches!(
        cache.get(BufKey::single(20), &spec()),
        Err(BufCacheError::Verify {
            block: FsBlock(20),
            ..
        })
    ));
    device.fail_reads_in(30 * 512..31 * 512);
    assert_eq!(cache.read_ahead(BufKey::new(FsBlock(28), 4), &spec()), 0);
    assert_eq!(cache.read_ahead(BufKey::new(FsBlock(62), 4), &spec()), 0);
    assert!(!cache.is_cached(BufKey::single(29)));
    assert!(!cache.is_cached(BufKey::single(62)));
    device.clear_faults();
    assert_eq!(
        cache.get(BufKey::single(30), &spec()).unwrap()[100],
        pattern(30, 100)
    );
    cache.check_invariants().unwrap();
}
