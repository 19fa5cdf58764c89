//! Many threads (more than cores) over a cache with a tiny memory limit: a shared counter
//! block, private blocks rewritten, freed and reallocated, shared read-only blocks, flushes and
//! reclaim all at once. No update may be lost and no lookup may see old or foreign contents.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::HashMap;

use cairn_bufcache::{BufKey, BufferCache, ReadSpec};
use cairn_format::{HEADER_SIZE, MetaHeader, MetaKind, OnDisk};
use common::*;

const THREADS: u64 = 8;
const ROUNDS: u64 = 1500;
const COUNTER_BLOCK: u64 = 2;
const COUNTER_OFFSET: usize = 64;
/// Private blocks per thread, spread over all AGs.
const PRIVATE: u64 = 12;

fn private_block(thread: u64, index: u64) -> u64 {
    // Skip the first 8 blocks of each AG (headers, shared blocks).
    let slot = thread * PRIVATE + index;
    let ag = slot % u64::from(AG_COUNT);
    u64::from(AG_BLOCKS) * ag + 8 + slot / u64::from(AG_COUNT)
}

fn read_u64(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
}

fn bump_counter(cache: &BufferCache, hot: &ReadSpec) {
    let mut guard = cache.get(BufKey::single(COUNTER_BLOCK), hot).unwrap();
    let value = read_u64(&guard, COUNTER_OFFSET).wrapping_add(1);
    guard.write(COUNTER_OFFSET, &value.to_le_bytes()).unwrap();
    guard.queue_delwri();
}

/// Rewrites, or frees and reallocates, a private block; checks what it held before.
fn churn_private(cache: &BufferCache, thread: u64, round: u64, expected: &mut HashMap<u64, u64>) {
    let block = private_block(thread, round % PRIVATE);
    let key = BufKey::single(block);
    let mut guard = cache.get(key, &spec()).unwrap();
    let want = expected.get(&block).copied();
    let have = read_u64(&guard, HEADER_SIZE);
    match want {
        Some(value) => assert_eq!(have, value, "block {block}"),
        None => assert_eq!(guard[HEADER_SIZE], pattern(block, HEADER_SIZE)),
    }
    let stamp = (thread << 32) | round;
    if round.is_multiple_of(5) {
        // Free the block and allocate it again: the new buffer must start zeroed.
        guard.mark_stale();
        drop(guard);
        guard = cache.get_new(key, &spec()).unwrap();
        assert!(
            guard.iter().all(|&b| b == 0),
            "reallocated block {block} not zeroed"
        );
        let header = MetaHeader::new(MetaKind::DirData, block, UUID, 0);
        header.encode(guard.bytes_mut(0..HEADER_SIZE).unwrap());
    }
    guard.write(HEADER_SIZE, &stamp.to_le_bytes()).unwrap();
    guard.queue_delwri();
    expected.insert(block, stamp);
}

fn worker(cache: &BufferCache, thread: u64) -> HashMap<u64, u64> {
    let hot = spec().with_lru_ref(3);
    let mut expected = HashMap::new();
    for round in 0..ROUNDS {
        bump_counter(cache, &hot);
        churn_private(cache, thread, round, &mut expected);
        let shared = 3 + (round + thread) % 5;
        let guard = cache.get(BufKey::single(shared), &spec()).unwrap();
        assert_eq!(guard[HEADER_SIZE + 1], pattern(shared, HEADER_SIZE + 1));
        drop(guard);
        if round % 50 == thread {
            cache.flush_delwri().unwrap();
        }
        if round % 97 == thread {
            cache.reclaim(u64::MAX);
        }
    }
    expected
}

// Runs the workload and checks the counter, every private block on disk and the invariants.
#[test]
fn threads_over_a_tiny_cache() {
    let device = formatted_device();
    let limit = 16 * u64::from(BLOCK_SIZE);
    let cache = cache_on(&device, config().with_memory_limit_bytes(limit));
    let expected: Vec<HashMap<u64, u64>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let cache = &cache;
                scope.spawn(move || worker(cache, t))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    cache.check_invariants().unwrap();
    // Everything queued is written; nothing is pinned or held now.
    while cache.delwri_queued() > 0 {
        let report = cache.flush_delwri().unwrap();
        assert!(report.pinned.is_empty() && report.busy.is_empty());
    }
    cache.reclaim(u64::MAX);
    assert_eq!(cache.cached_count(), 0);
    cache.check_invariants().unwrap();
    let counter = cache.get(BufKey::single(COUNTER_BLOCK), &spec()).unwrap();
    let initial: Vec<u8> = (0..8)
        .map(|i| pattern(COUNTER_BLOCK, COUNTER_OFFSET + i))
        .collect();
    let start = read_u64(&initial, 0);
    assert_eq!(
        read_u64(&counter, COUNTER_OFFSET),
        start.wrapping_add(THREADS * ROUNDS)
    );
    drop(counter);
    for map in expected {
        for (block, stamp) in map {
            let guard = cache.get(BufKey::single(block), &spec()).unwrap();
            assert_eq!(read_u64(&guard, HEADER_SIZE), stamp, "block {block}");
        }
    }
    let stats = cache.stats();
    assert!(stats.reclaims > 0, "{stats:?}");
    assert!(stats.stale_lookups > 0, "{stats:?}");
    cache.check_invariants().unwrap();
}
