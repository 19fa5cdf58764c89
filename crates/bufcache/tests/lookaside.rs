//! The lookaside array at each place the published prototype crashed: stale buffers, length
//! mismatches, slot collisions, and buffers reclaimed while a slot or a reader still had them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use cairn_bufcache::{BufCacheError, BufKey, BufferOps, LOOKASIDE_REPLACE_AFTER, ReadSpec};
use cairn_format::{FormatError, FsBlock, HEADER_SIZE, Lsn};
use common::*;

/// Accepts any bytes: for multi-block reads of the single-block test image.
#[derive(Debug)]
struct RawOps;

impl BufferOps for RawOps {
    fn name(&self) -> &'static str {
        "raw test block"
    }
    fn verify_read(&self, _: &[u8], _: FsBlock, _: &ReadSpec) -> Result<(), FormatError> {
        Ok(())
    }
    fn prepare_write(&self, _: &mut [u8], _: FsBlock, _: Option<Lsn>) -> Result<(), FormatError> {
        Ok(())
    }
}

static RAW: RawOps = RawOps;

fn raw() -> ReadSpec {
    ReadSpec::new(&RAW, UUID)
}

// Checks that a stale buffer sitting in a slot is never returned; the next get re-reads.
#[test]
fn stale_buffer_in_slot_is_not_returned() {
    let device = formatted_device();
    let cache = cache_on(&device, config());
    let mut guard = cache.get(BufKey::single(11), &spec()).unwrap();
    guard.write(HEADER_SIZE, &[0xaa; 16]).unwrap();
    guard.queue_delwri();
    guard.mark_stale();
    assert!(guard.is_stale());
    assert!(!guard.is_dirty());
    drop(guard);
    cache.check_invariants().unwrap();
    assert_eq!(cache.stats().lookaside_removes, 1);
    // The stale buffer is never written home.
    assert_eq!(cache.flush_delwri().unwrap().buffers_written, 0);
    let fresh = cache.get(BufKey::single(11), &spec()).unwrap();
    assert_eq!(fresh[HEADER_SIZE], pattern(11, HEADER_SIZE));
    assert_eq!(cache.stats().stale_lookups, 1);
    assert_eq!(cache.stats().reads, 2);
    drop(fresh);
    cache.check_invariants().unwrap();
}

// Checks that a holder of a stale buffer keeps its copy while a new lookup gets a fresh one.
#[test]
fn stale_buffer_still_held_is_replaced() {
    let device = formatted_device();
    let cache = cache_on(&device, config());
    let mut old = cache.get(BufKey::single(12), &spec()).unwrap();
    old.write(HEADER_SIZE, &[0xbb; 4]).unwrap();
    old.mark_stale();
    std::thread::scope(|scope| {
        scope.spawn(|| {
            // `try_get`: nobody holds the fresh buffer, and if the stale one (locked by this
            // test) came back, waiting for it would deadlock instead of failing.
            let fresh = cache.try_get(BufKey::single(12), &spec()).unwrap();
            assert_eq!(fresh[HEADER_SIZE], pattern(12, HEADER_SIZE));
            assert!(!fresh.is_stale());
        });
    });
    assert_eq!(old[HEADER_SIZE], 0xbb);
    drop(old);
    cache.check_invariants().unwrap();
    assert_eq!(cache.cached_count(), 1);
}

// Checks that a slot holding (block, 1) never answers a lookup of (block, 2).
#[test]
fn slot_hit_must_match_length() {
    let device = formatted_device();
    let cache = cache_on(&device, config());
    drop(cache.get(BufKey::single(20), &raw()).unwrap());
    match cache.get(BufKey::new(FsBlock(20), 2), &raw()) {
        Err(BufCacheError::LengthMismatch {
            block,
            cached_blocks,
            requested_blocks,
        }) => assert_eq!(
            (block, cached_blocks, requested_blocks),
            (FsBlock(20), 1, 2)
        ),
        other => panic!("{other:?}"),
    }
    cache.check_invariants().unwrap();
    // Once the one-block buffer is freed, the two-block view reads fresh from disk.
    let mut one = cache.get(BufKey::single(20), &raw()).unwrap();
    one.write(HEADER_SIZE, &[0xcc; 8]).unwrap();
    one.mark_stale();
    drop(one);
    let two = cache.get(BufKey::new(FsBlock(20), 2), &raw()).unwrap();
    assert_eq!(two.len(), 1024);
    assert_eq!(two[HEADER_SIZE], pattern(20, HEADER_SIZE));
    assert_eq!(two[512 + 100], pattern(21, 100));
    drop(two);
    cache.check_invariants().unwrap();
    // And a one-block lookup now meets the live two-block buffer.
    assert!(matches!(
        cache.get(BufKey::single(20), &raw()),
        Err(BufCacheError::LengthMismatch {
            cached_blocks: 2,
            ..
        })
    ));
}

// Checks that blocks sharing one slot each get their own buffer back, and that rivals do not
// rewrite the slot on every index hit: the last inserted (7) keeps it and hits every third get.
#[test]
fn colliding_blocks_get_their_own_buffers() {
    let device = formatted_device();
    let cache = cache_on(&device, config().with_lookaside_slots(1));
    for round in 0..20u64 {
        let block = 5 + round % 3;
        let guard = cache.get(BufKey::single(block), &spec()).unwrap();
        assert_eq!(guard.key(), BufKey::single(block));
        assert_eq!(guard[300], pattern(block, 300));
        drop(guard);
        cache.check_invariants().unwrap();
    }
    let stats = cache.stats();
    assert_eq!((stats.lookaside_hits, stats.index_hits), (5, 12));
    assert_eq!(
        stats.lookaside_inserts, 3,
        "filled on the three inserts only"
    );
}

// Checks the slot replacement rule: a live occupant gives way to a rival only after
// LOOKASIDE_REPLACE_AFTER rival index hits in a row, and an occupant hit resets the count.
#[test]
fn rival_takes_slot_after_repeated_index_hits() {
    let device = formatted_device();
    let cache = cache_on(&device, config().with_lookaside_slots(1));
    let get = |block: u64| drop(cache.get(BufKey::single(block), &spec()).unwrap());
    get(6);
    get(5); // Inserted last: 5 holds the slot.
    for _ in 1..LOOKASIDE_REPLACE_AFTER {
        get(6);
    }
    get(5); // Still a slot hit; resets the rivals' count.
    assert_eq!(cache.stats().lookaside_hits, 1);
    for _ in 0..LOOKASIDE_REPLACE_AFTER {
        get(6);
    }
    let stats = cache.stats();
    assert_eq!(
        stats.lookaside_inserts, 3,
        "two inserts, then 6 took the slot"
    );
    assert_eq!(stats.lookaside_hits, 1);
    get(6);
    assert_eq!(cache.stats().lookaside_hits, 2);
    cache.check_invariants().unwrap();
}

// Checks that an empty slot, or one naming a stale buffer, is filled by the next index hit.
#[test]
fn index_hit_fills_empty_or_stale_slot() {
    let device = formatted_device();
    let cache = cache_on(&device, config().with_lookaside_slots(1));
    let get = |block: u64| drop(cache.get(BufKey::single(block), &spec()).unwrap());
    get(6);
    get(5);
    // A slot hit on 5, then 5 is freed and its slot emptied.
    cache.get(BufKey::single(5), &spec()).unwrap().mark_stale();
    get(6); // Index hit: fills the empty slot.
    get(6); // Slot hit.
    let stats = cache.stats();
    assert_eq!((stats.lookaside_hits, stats.index_hits), (2, 1));
    assert_eq!(stats.lookaside_removes, 1);
    cache.check_invariants().unwrap();
}

// Checks that reclaim clears the slot, and a handle taken before still owns live memory.
#[test]
fn reclaimed_buffer_leaves_its_slot() {
    let device = formatted_device();
    let cache = cache_on(&device, config());
    let guard = cache.get(BufKey::single(40), &spec()).unwrap();
    let handle = guard.handle();
    drop(guard);
    assert_eq!(cache.reclaim(u64::MAX).buffers_freed, 1);
    cache.check_invariants().unwrap();
    assert_eq!(cache.stats().lookaside_removes, 1);
    // The handle still reaches the (now uncached) buffer's memory safely.
    assert_eq!(handle.key(), BufKey::single(40));
    assert_eq!(handle.pin_count(), 0);
    assert!(!handle.is_stale());
    let again = cache.get(BufKey::single(40), &spec()).unwrap();
    assert_eq!(again[400], pattern(40, 400));
    assert_eq!(cache.stats().reads, 2);
    drop(again);
    cache.check_invariants().unwrap();
}

// Checks lookaside readers racing reclaim and invalidation: every lookup returns the right,
// current contents, and the cache ends consistent.
#[test]
fn readers_racing_reclaim_and_invalidation() {
    let device = formatted_device();
    let cache = cache_on(&device, config().with_lookaside_slots(3));
    let rounds = 3000u64;
    std::thread::scope(|scope| {
        for reader in 0..3u64 {
            let cache = &cache;
            scope.spawn(move || {
                for round in 0..rounds {
                    let block = (round * 7 + reader) % 6;
                    let guard = cache.get(BufKey::single(block), &spec()).unwrap();
                    assert!(!guard.is_stale());
                    assert_eq!(guard[HEADER_SIZE + 9], pattern(block, HEADER_SIZE + 9));
                }
            });
        }
        let cache = &cache;
        scope.spawn(move || {
            for round in 0..rounds / 4 {
                cache.reclaim(u64::MAX);
                if round % 8 == 0 {
                    // Freed and reallocated without changes: contents on disk stay valid.
                    let mut guard = cache.get(BufKey::single(round % 6), &spec()).unwrap();
                    guard.mark_stale();
                }
            }
        });
    });
    cache.check_invariants().unwrap();
    let stats = cache.stats();
    assert_eq!(stats.gets, 3 * rounds + (rounds / 4).div_ceil(8));
    assert!(stats.reclaims > 0);
}

/// Fills the calling thread's slot for `block` (a miss inserts it, a second get hits it).
fn fill_own_slot(cache: &cairn_bufcache::BufferCache, block: u64) {
    drop(cache.get(BufKey::single(block), &raw()).unwrap());
    let hits = cache.stats().lookaside_hits;
    drop(cache.get(BufKey::single(block), &raw()).unwrap());
    assert_eq!(cache.stats().lookaside_hits, hits + 1, "the slot is filled");
}

/// Runs `f` on another thread, to completion.
fn on_other_thread(f: impl FnOnce() + Send) {
    std::thread::scope(|scope| {
        scope.spawn(f);
    });
}

// Checks a slot filled by one thread whose buffer another thread reclaims, after which the
// disk changes: the first thread misses, re-reads the new contents, and its next lookup in
// the AG drops the dead buffer from its slot (the generation moved).
#[test]
fn slot_of_buffer_reclaimed_by_another_thread_misses() {
    use cairn_blockdev::{AlignedBuf, BlockDevice};
    let device = formatted_device();
    let cache = cache_on(&device, config());
    fill_own_slot(&cache, 30);
    on_other_thread(|| {
        assert_eq!(cache.reclaim(u64::MAX).buffers_freed, 1);
        let new_bytes = AlignedBuf::from_slice(&[0x5a; BLOCK_SIZE as usize]);
        device
            .write_at(30 * u64::from(BLOCK_SIZE), &new_bytes)
            .unwrap();
    });
    // Not swept yet: the dead occupant is allowed, and not counted as removed.
    cache.check_invariants().unwrap();
    let before = cache.stats();
    let guard = cache.get(BufKey::single(30), &raw()).unwrap();
    assert!(guard.iter().all(|&b| b == 0x5a), "fresh contents");
    drop(guard);
    let after = cache.stats();
    assert_eq!(after.lookaside_hits, before.lookaside_hits, "a miss");
    assert_eq!(
        (after.misses, after.reads),
        (before.misses + 1, before.reads + 1)
    );
    assert_eq!(after.lookaside_removes, before.lookaside_removes + 1);
    cache.check_invariants().unwrap();
}

// Checks that a lookup in the AG by the slot's thread releases the dead buffer at once, even
// for another block: the sweep on a generation change.
#[test]
fn generation_change_sweeps_dead_buffers_from_slots() {
    let device = formatted_device();
    let cache = cache_on(&device, config());
    fill_own_slot(&cache, 31);
    on_other_thread(|| {
        let mut guard = cache.get(BufKey::single(31), &raw()).unwrap();
        guard.mark_stale();
    });
    let removes = cache.stats().lookaside_removes;
    drop(cache.get(BufKey::single(32), &raw()).unwrap());
    assert_eq!(cache.stats().lookaside_removes, removes + 1, "swept");
    cache.check_invariants().unwrap();
}

// Checks a slot filled by one thread whose buffer another thread changes and marks stale:
// the first thread misses and sees the disk contents, never the dropped change.
#[test]
fn slot_of_buffer_marked_stale_by_another_thread_misses() {
    let device = formatted_device();
    let cache = cache_on(&device, config());
    fill_own_slot(&cache, 33);
    on_other_thread(|| {
        let mut guard = cache.get(BufKey::single(33), &raw()).unwrap();
        guard.write(HEADER_SIZE, &[0xee; 32]).unwrap();
        guard.mark_stale();
    });
    let before = cache.stats();
    let guard = cache.get(BufKey::single(33), &raw()).unwrap();
    assert_eq!(guard[HEADER_SIZE], pattern(33, HEADER_SIZE));
    assert!(!guard.is_stale());
    drop(guard);
    let after = cache.stats();
    assert_eq!(after.lookaside_hits, before.lookaside_hits, "a miss");
    assert_eq!(after.stale_lookups, before.stale_lookups + 1);
    cache.check_invariants().unwrap();
}

// Checks a slot filled by one thread with (block, 1) while another thread frees it and
// re-reads the block as (block, 2): the first thread's one-block lookup must meet the live
// two-block buffer (LengthMismatch), not its slot's dead one; once that is freed too, it
// reads fresh contents.
#[test]
fn slot_of_buffer_reread_with_another_length_misses() {
    let device = formatted_device();
    let cache = cache_on(&device, config());
    fill_own_slot(&cache, 34);
    on_other_thread(|| {
        let mut one = cache.get(BufKey::single(34), &raw()).unwrap();
        one.write(HEADER_SIZE, &[0xdd; 8]).unwrap();
        one.mark_stale();
        drop(one);
        let mut two = cache.get(BufKey::new(FsBlock(34), 2), &raw()).unwrap();
        assert_eq!(two[512 + HEADER_SIZE], pattern(35, HEADER_SIZE));
        two.write(HEADER_SIZE, &[0xcc; 8]).unwrap();
        drop(two);
    });
    let hits = cache.stats().lookaside_hits;
    assert!(matches!(
        cache.get(BufKey::single(34), &raw()),
        Err(BufCacheError::LengthMismatch {
            cached_blocks: 2,
            ..
        })
    ));
    let two = cache.get(BufKey::new(FsBlock(34), 2), &raw()).unwrap();
    assert_eq!(two[HEADER_SIZE], 0xcc, "the other thread's live buffer");
    drop(two);
    on_other_thread(|| {
        let mut two = cache.get(BufKey::new(FsBlock(34), 2), &raw()).unwrap();
        two.mark_stale();
    });
    let one = cache.get(BufKey::single(34), &raw()).unwrap();
    assert_eq!(one.len(), 512);
    assert_eq!(one[HEADER_SIZE], pattern(34, HEADER_SIZE));
    drop(one);
    assert_eq!(cache.stats().lookaside_hits, hits, "no slot hit on the way");
    cache.check_invariants().unwrap();
}

// Checks that a thread's slot is filled by its own lookups only: another thread's insert
// does not make this thread hit, and this thread's index hit then fills its own slot.
#[test]
fn slots_are_per_thread() {
    let device = formatted_device();
    let cache = cache_on(&device, config());
    on_other_thread(|| fill_own_slot(&cache, 36));
    let before = cache.stats();
    drop(cache.get(BufKey::single(36), &raw()).unwrap());
    drop(cache.get(BufKey::single(36), &raw()).unwrap());
    let after = cache.stats();
    assert_eq!(after.index_hits, before.index_hits + 1);
    assert_eq!(after.lookaside_hits, before.lookaside_hits + 1);
    assert_eq!(after.lookaside_inserts, before.lookaside_inserts + 1);
    cache.check_invariants().unwrap();
}

// Checks a thread whose slots still own a dropped cache's buffers (that cache dropped on
// another thread) using a new cache, which takes the freed table id whenever no other test
// took it first: the new cache never sees the old cache's slots (they are another cache's
// by serial) and reads its own device.
#[test]
fn dropped_cache_slots_are_not_seen_by_a_new_cache() {
    use std::sync::{Arc, mpsc};
    let (jobs, job_queue) = mpsc::channel::<(Arc<cairn_bufcache::BufferCache>, bool)>();
    let (done, done_queue) = mpsc::channel();
    let helper = std::thread::spawn(move || {
        for (cache, fill) in job_queue {
            if fill {
                fill_own_slot(&cache, 40);
            } else {
                assert!(!cache.is_cached(BufKey::single(40)));
                let guard = cache.get(BufKey::single(40), &raw()).unwrap();
                assert!(
                    guard.iter().all(|&b| b == 0x5a),
                    "the new device's contents"
                );
                drop(guard);
                let stats = cache.stats();
                assert_eq!((stats.lookaside_hits, stats.misses), (0, 1));
                cache.check_invariants().unwrap();
            }
            drop(cache);
            done.send(()).unwrap();
        }
    });
    let first = Arc::new(cache_on(&formatted_device(), config()));
    jobs.send((Arc::clone(&first), true)).unwrap();
    done_queue.recv().unwrap();
    // Dropped here, on this thread: the helper's table for it stays.
    drop(first);
    let device = Arc::new(cairn_blockdev::MemDevice::new(
        u64::from(AG_BLOCKS * AG_COUNT) * u64::from(BLOCK_SIZE),
        BLOCK_SIZE,
    ));
    let bytes = cairn_blockdev::AlignedBuf::from_slice(&[0x5a; BLOCK_SIZE as usize]);
    cairn_blockdev::BlockDevice::write_at(&*device, 40 * u64::from(BLOCK_SIZE), &bytes).unwrap();
    let second = Arc::new(cache_on(&device, config()));
    jobs.send((second, false)).unwrap();
    done_queue.recv().unwrap();
    drop(jobs);
    helper.join().unwrap();
}
