//! The lookaside array at each place the published prototype crashed: stale buffers, length
//! mismatches, slot collisions, and buffers reclaimed while a slot or a reader still had them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use cairn_bufcache::{BufCacheError, BufKey, BufferOps, ReadSpec};
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
            let fresh = cache.get(BufKey::single(12), &spec()).unwrap();
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

// Checks that blocks sharing one slot each get their own buffer back.
#[test]
fn colliding_blocks_get_their_own_buffers() {
    let device = formatted_device();
    let cache = cache_on(&device, config().with_lookaside_slots(1));
    for round in 0..20u64 {
        let block = 5 + round % 3;
        let guard = cache.get(BufKey::single(block), &spec()).unwrap();
        assert_eq!(guard[300], pattern(block, 300));
        drop(guard);
        cache.check_invariants().unwrap();
    }
    let stats = cache.stats();
    assert_eq!(
        stats.lookaside_hits, 0,
        "three blocks alternating through one slot"
    );
    assert_eq!(stats.index_hits, 17);
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
