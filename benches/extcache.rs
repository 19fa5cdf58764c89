//! Extent status cache microbenchmarks: lookup hits on one big inode and across many small
//! ones, an overwrite that splits and re-merges, and one bounded shrinker call on a cache of
//! 100,000 fragmented inodes. The memory-pressure workload with two threads is the
//! `extcache-pressure` binary of `crates/extcache` (see docs/benchmarks.md).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use cairn_extcache::{CacheConfig, Extent, ExtentCache, ExtentState, InodeExtents};
use criterion::{Criterion, criterion_group, criterion_main};
use std::hint::black_box;
use std::time::{Duration, Instant};

const FRAGMENTED_EXTENTS: u64 = 16;

/// A cache that never reclaims on its own: the benchmarks drive the shrinker themselves.
fn roomy_cache() -> ExtentCache {
    ExtentCache::new(CacheConfig::with_entry_watermarks(
        u64::MAX / 128,
        u64::MAX / 128,
    ))
    .unwrap()
}

/// `count` entries alternating written (with a physical gap) and hole, so none merge.
fn fill_fragmented(inode: &InodeExtents, count: u64) {
    let mapped: Vec<Extent> = (0..count.div_ceil(2))
        .map(|i| {
            Extent::new(
                i * 8,
                4,
                ExtentState::Written {
                    physical_block: i * 100,
                },
            )
            .unwrap()
        })
        .collect();
    inode.fill(0, count * 4, &mapped).unwrap();
}

/// Pseudo-random sequence (splitmix64) for picking blocks and inodes.
fn sequence(count: usize, bound: u64) -> Vec<u64> {
    let mut state = 7u64;
    (0..count)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            (z ^ (z >> 31)) % bound
        })
        .collect()
}

fn lookup_one_big_inode(c: &mut Criterion) {
    let cache = roomy_cache();
    let inode = cache.open_inode(1);
    fill_fragmented(&inode, 100_000);
    assert_eq!(inode.object_count(), 100_000);
    let blocks = sequence(4096, 100_000 * 4);
    let mut next = 0;
    c.bench_function("extcache/lookup_hit/100k_extents_one_inode", |b| {
        b.iter(|| {
            next = (next + 1) % blocks.len();
            black_box(inode.lookup(blocks[next]).unwrap());
        })
    });
}

fn many_fragmented_inodes(cache: &ExtentCache, inode_count: u64) -> Vec<InodeExtents> {
    let inodes: Vec<_> = (0..inode_count).map(|ino| cache.open_inode(ino)).collect();
    for inode in &inodes {
        fill_fragmented(inode, FRAGMENTED_EXTENTS);
    }
    inodes
}

fn lookup_many_inodes(c: &mut Criterion) {
    let cache = roomy_cache();
    let inodes = many_fragmented_inodes(&cache, 100_000);
    let picks = sequence(1 << 16, 100_000 * FRAGMENTED_EXTENTS * 4);
    let mut next = 0;
    c.bench_function("extcache/lookup_hit/16_extents_x_100k_inodes", |b| {
        b.iter(|| {
            next = (next + 1) % picks.len();
            let pick = picks[next];
            let inode = &inodes[(pick / (FRAGMENTED_EXTENTS * 4)) as usize];
            black_box(inode.lookup(pick % (FRAGMENTED_EXTENTS * 4)).unwrap());
        })
    });
}

fn insert_split_merge(c: &mut Criterion) {
    let cache = roomy_cache();
    let inode = cache.open_inode(1);
    fill_fragmented(&inode, 100_000);
    let starts = sequence(4096, 100_000 / 2);
    let mut next = 0;
    // An unwritten block is cut into a written extent (a split into three), then the
    // written block goes back (a merge into one): the steady state stays at 100k entries.
    c.bench_function(
        "extcache/insert_split_then_merge/100k_extents_one_inode",
        |b| {
            b.iter(|| {
                next = (next + 1) % starts.len();
                let extent_index = starts[next];
                let block = extent_index * 8 + 1;
                let physical_block = extent_index * 100 + 1;
                let cut =
                    Extent::new(block, 1, ExtentState::Unwritten { physical_block: 7 }).unwrap();
                let back = Extent::new(block, 1, ExtentState::Written { physical_block }).unwrap();
                inode.insert(cut).unwrap();
                inode.insert(back).unwrap();
            })
        },
    );
    assert_eq!(inode.object_count(), 100_000);
}

/// Refills every inode that lost entries; run outside the timed region.
fn refill(inodes: &[InodeExtents]) {
    for inode in inodes
        .iter()
        .filter(|i| i.object_count() < FRAGMENTED_EXTENTS)
    {
        fill_fragmented(inode, FRAGMENTED_EXTENTS);
    }
}

fn shrink_scan(c: &mut Criterion) {
    let cache = roomy_cache();
    let inodes = many_fragmented_inodes(&cache, 100_000);
    let mut group = c.benchmark_group("extcache/shrink_scan");
    group.measurement_time(Duration::from_secs(5));
    // One call of the default budget (128 entries, at most 64 inodes) on 1.6M entries.
    group.bench_function("128_entries_of_1.6M_in_100k_inodes", |b| {
        b.iter_custom(|iterations| {
            let mut timed = Duration::ZERO;
            for iteration in 0..iterations {
                if iteration % 512 == 511 {
                    refill(&inodes);
                }
                let started = Instant::now();
                black_box(cache.shrink(128));
                timed += started.elapsed();
            }
            timed
        })
    });
    group.finish();
    let stats = cache.stats();
    println!(
        "shrink_scan: {} calls, avg {} ns, max {} ns, {:.1} shrunk per call",
        stats.scans,
        stats.scan_time_avg_ns,
        stats.scan_time_max_ns,
        stats.shrunk_per_scan_avg()
    );
}

criterion_group!(
    benches,
    lookup_one_big_inode,
    lookup_many_inodes,
    insert_split_merge,
    shrink_scan
);
criterion_main!(benches);
