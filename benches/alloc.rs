#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Allocator benchmarks: near allocations on a clean AG and on the adversarial layout of the
//! published near-mode rework (an AG whose free space is 1,000,000 extents of random lengths
//! and positions), against a plain by-block span search implemented here as the reference;
//! frees and the busy-extent check under the same layout.
//!
//! Besides criterion's timings, the fragmented run prints per-allocation time (median, p99,
//! max), free-space records visited, and distance from the target (median, p90).

use std::cell::Cell;
use std::collections::HashMap;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use cairn_alloc::{Allocator, BusyExtents, LogSequence, Mode, Request};
use cairn_blockdev::{AlignedBuf, BlockDevice, DeviceError};
use cairn_btree::{BnoCodec, Btree, Buffers, CacheContext, Lookup, TreeSpec};
use cairn_bufcache::{BufferCache, CacheConfig, HeaderOps, ReadSpec};
use cairn_format::limits::AG_AGF_BLOCK;
use cairn_format::{AgBlock, Agf, BnoKey, FsBlock, Geometry, MetaKind, OnDisk};
use criterion::{Criterion, criterion_group, criterion_main};
use parking_lot::Mutex;

const UUID: [u8; 16] = [3; 16];
const BLOCK: u32 = 4096;
const AG_BLOCKS: u64 = 1 << 26;
const EXTENTS: u32 = 1_000_000;
const SAMPLES: usize = 20_000;

/// A sparse in-memory device: only written blocks take memory (the bench AG spans 64 GiB).
#[derive(Debug, Default)]
struct SparseDevice {
    blocks: Mutex<HashMap<u64, Vec<u8>>>,
}

impl BlockDevice for SparseDevice {
    fn read_at(&self, offset: u64, buf: &mut AlignedBuf) -> Result<(), DeviceError> {
        let blocks = self.blocks.lock();
        for (i, chunk) in buf.chunks_mut(BLOCK as usize).enumerate() {
            let at = offset / u64::from(BLOCK) + i as u64;
            match blocks.get(&at) {
                Some(data) => chunk.copy_from_slice(&data[..chunk.len()]),
                None => chunk.fill(0),
            }
        }
        Ok(())
    }
    fn write_at(&self, offset: u64, buf: &AlignedBuf) -> Result<(), DeviceError> {
        let mut blocks = self.blocks.lock();
        for (i, chunk) in buf.chunks(BLOCK as usize).enumerate() {
            blocks.insert(offset / u64::from(BLOCK) + i as u64, chunk.to_vec());
        }
        Ok(())
    }
    fn flush(&self) -> Result<(), DeviceError> {
        Ok(())
    }
    fn discard(&self, _offset: u64, _len: u64) -> Result<bool, DeviceError> {
        Ok(false)
    }
    fn size_bytes(&self) -> u64 {
        2 * AG_BLOCKS * u64::from(BLOCK)
    }
    fn logical_sector_size(&self) -> u32 {
        512
    }
    fn physical_sector_size(&self) -> u32 {
        512
    }
    fn read_only(&self) -> bool {
        false
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), DeviceError> {
        let first = offset / u64::from(BLOCK);
        let mut blocks = self.blocks.lock();
        for at in first..first + len / u64::from(BLOCK) {
            blocks.remove(&at);
        }
        Ok(())
    }
}

/// A log that is always durable (busy ranges clear at once) unless told otherwise.
#[derive(Debug, Default)]
struct BenchLog {
    durable: Cell<u64>,
}

impl LogSequence for BenchLog {
    fn durable_sequence(&self) -> u64 {
        self.durable.get()
    }
    fn force(&self, sequence: u64) -> Result<(), String> {
        self.durable.set(self.durable.get().max(sequence));
        Ok(())
    }
}

/// xorshift64*: deterministic and cheap.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

struct Fs {
    geometry: Geometry,
    cache: BufferCache,
    alloc: Allocator,
    log: BenchLog,
}

fn format_fs() -> Fs {
    let device: Arc<dyn BlockDevice> = Arc::new(SparseDevice::default());
    let bytes = device.size_bytes();
    let request = cairn_mkfs::Request {
        block_size: BLOCK,
        ag_count: Some(2),
        ..Default::default()
    };
    let plan = cairn_mkfs::plan(bytes, 512, &request).unwrap();
    let options = cairn_mkfs::FormatOptions {
        uuid: Some(UUID),
        discard: false,
        now_secs: 0,
    };
    cairn_mkfs::format(device.as_ref(), &plan, &options).unwrap();
    let geometry = plan.geometry;
    let config = CacheConfig::from_geometry(&geometry).with_memory_limit_bytes(1 << 30);
    Fs {
        cache: BufferCache::new(config, device).unwrap(),
        alloc: Allocator::new(geometry, UUID),
        log: BenchLog::default(),
        geometry,
    }
}

/// AG 0 made of `EXTENTS` free extents of 1..=64 blocks separated by used gaps of 1..=8,
/// freed in random order (so both trees are built by random inserts).
fn fragment(fs: &Fs) -> Vec<(u64, u32)> {
    let mut ctx = CacheContext::new(&fs.cache);
    let whole = Request::near(FsBlock(0), 1, u32::MAX >> 1).with_mode(Mode::Size);
    let big = fs
        .alloc
        .allocate(&mut ctx, &fs.log, &whole)
        .unwrap()
        .unwrap();
    let mut rng = Rng(0x1234_5678);
    let mut pieces = Vec::with_capacity(EXTENTS as usize);
    let mut at = big.fs_start.0 + 4;
    let end = big.fs_start.0 + u64::from(big.length);
    while pieces.len() < EXTENTS as usize {
        let length = 1 + rng.below(64) as u32;
        if at + u64::from(length) + 8 > end {
            break;
        }
        pieces.push((at, length));
        at += u64::from(length) + 1 + rng.below(8);
    }
    for i in (1..pieces.len()).rev() {
        pieces.swap(i, rng.below(i as u64 + 1) as usize);
    }
    for (n, (start, length)) in pieces.iter().enumerate() {
        fs.alloc
            .free(&mut ctx, &fs.log, FsBlock(*start), *length, n as u64 + 1)
            .unwrap();
        if n % 4096 == 0 {
            ctx.release_all();
        }
    }
    fs.log.durable.set(u64::MAX >> 1);
    pieces
}

/// The reference: a plain by-block span search, walking left and right from the target until
/// each side finds an extent of `length` blocks; the nearer wins. Returns (start, records).
fn span_search<'c, B: Buffers<'c>>(
    ctx: &mut B,
    tree: &Btree<BnoCodec>,
    target: u32,
    length: u32,
) -> Option<(u32, u64)> {
    let key = BnoKey {
        start: AgBlock(target),
    };
    let mut visited = 0;
    let mut left = tree.lookup(ctx, &key, Lookup::Le).unwrap();
    let mut right = tree.lookup(ctx, &key, Lookup::Ge).unwrap();
    let (mut found_left, mut found_right) = (None, None);
    while found_left.is_none() && left.is_some() || found_right.is_none() && right.is_some() {
        if let (None, Some(cursor)) = (found_left, left.as_mut()) {
            let r = tree.record(ctx, cursor).unwrap();
            visited += 1;
            if r.length >= length {
                let end = r.start.0 + r.length;
                found_left = Some(if end > target {
                    r.start.0.max(target.min(end - length))
                } else {
                    end - length
                });
            } else if !tree.prev(ctx, cursor).unwrap() {
                left = None;
            }
        }
        if let (None, Some(cursor)) = (found_right, right.as_mut()) {
            let r = tree.record(ctx, cursor).unwrap();
            visited += 1;
            if r.length >= length {
                found_right = Some(r.start.0);
            } else if !tree.next(ctx, cursor).unwrap() {
                right = None;
            }
        }
    }
    let best = match (found_left, found_right) {
        (Some(l), Some(r)) => Some(if target.abs_diff(l) <= r.abs_diff(target) {
            l
        } else {
            r
        }),
        (l, r) => l.or(r),
    };
    best.map(|start| (start, visited))
}

fn bno_tree<'c, B: Buffers<'c>>(ctx: &mut B, fs: &Fs) -> Btree<BnoCodec> {
    static AGF_OPS: HeaderOps = HeaderOps::new(MetaKind::Agf);
    let spec = ReadSpec::new(&AGF_OPS, UUID).with_owner(0);
    let agf_block = FsBlock(u64::from(AG_AGF_BLOCK));
    let agf = Agf::decode(ctx.buffer(agf_block, &spec, false).unwrap()).unwrap();
    let tree_spec = TreeSpec::ag::<BnoCodec>(&fs.geometry, UUID, 0).unwrap();
    Btree::open(tree_spec, u64::from(agf.bno_root.0), agf.bno_levels).unwrap()
}

/// Summary line: median, p99, max of `values`.
fn summary(values: &mut [u64]) -> (u64, u64, u64, u64) {
    values.sort_unstable();
    let at = |q: f64| values[((values.len() - 1) as f64 * q) as usize];
    (at(0.5), at(0.9), at(0.99), values[values.len() - 1])
}

fn distance(start: u64, length: u32, target: u64) -> u64 {
    if target < start {
        start - target
    } else {
        target.saturating_sub(start + u64::from(length) - 1)
    }
}

/// Allocates and frees back `SAMPLES` random near requests, timing each allocation.
fn measure_ours(fs: &Fs, rng: &mut Rng) {
    let (mut times, mut visits, mut distances) = (Vec::new(), Vec::new(), Vec::new());
    for n in 0..SAMPLES {
        let mut ctx = CacheContext::new(&fs.cache);
        let target = FsBlock(8 + rng.below(AG_BLOCKS - 16));
        let length = 1 + rng.below(64) as u32;
        let started = Instant::now();
        let got = fs
            .alloc
            .allocate(&mut ctx, &fs.log, &Request::near(target, length, length));
        times.push(started.elapsed().as_nanos() as u64);
        let got = got.unwrap().unwrap();
        visits.push(fs.alloc.stats().last_records_visited);
        distances.push(distance(got.fs_start.0, got.length, target.0));
        fs.alloc
            .free(&mut ctx, &fs.log, got.fs_start, got.length, n as u64)
            .unwrap();
    }
    report(
        "near (combined search)",
        &mut times,
        &mut visits,
        &mut distances,
    );
}

fn measure_span(fs: &Fs, rng: &mut Rng) {
    let (mut times, mut visits, mut distances) = (Vec::new(), Vec::new(), Vec::new());
    for n in 0..SAMPLES {
        let mut ctx = CacheContext::new(&fs.cache);
        let target = 8 + rng.below(AG_BLOCKS - 16);
        let length = 1 + rng.below(64) as u32;
        let started = Instant::now();
        let tree = bno_tree(&mut ctx, fs);
        let (start, visited) = span_search(&mut ctx, &tree, target as u32, length).unwrap();
        let exact = Request::near(FsBlock(u64::from(start)), length, length).with_mode(Mode::Exact);
        let got = fs
            .alloc
            .allocate(&mut ctx, &fs.log, &exact)
            .unwrap()
            .unwrap();
        times.push(started.elapsed().as_nanos() as u64);
        visits.push(visited);
        distances.push(distance(got.fs_start.0, got.length, target));
        fs.alloc
            .free(&mut ctx, &fs.log, got.fs_start, got.length, n as u64)
            .unwrap();
    }
    report(
        "span search (reference)",
        &mut times,
        &mut visits,
        &mut distances,
    );
}

fn report(name: &str, times: &mut [u64], visits: &mut [u64], distances: &mut [u64]) {
    let (t50, _, t99, tmax) = summary(times);
    let (v50, _, v99, vmax) = summary(visits);
    let (d50, d90, _, _) = summary(distances);
    println!(
        "{name}: time ns median {t50} p99 {t99} max {tmax}; records median {v50} p99 {v99} \
         max {vmax}; distance median {d50} p90 {d90}"
    );
}

fn benches(c: &mut Criterion) {
    let clean = format_fs();
    let mut rng = Rng(99);
    c.bench_function("alloc/near/clean_ag", |b| {
        b.iter(|| {
            let mut ctx = CacheContext::new(&clean.cache);
            let target = FsBlock(8 + rng.below(AG_BLOCKS - 16));
            let got = clean
                .alloc
                .allocate(&mut ctx, &clean.log, &Request::near(target, 8, 8));
            let got = black_box(got.unwrap().unwrap());
            clean
                .alloc
                .free(&mut ctx, &clean.log, got.fs_start, got.length, 0)
                .unwrap();
        })
    });
    let fs = format_fs();
    let started = Instant::now();
    let pieces = fragment(&fs);
    println!(
        "built {} free extents in {:?}",
        pieces.len(),
        started.elapsed()
    );
    measure_ours(&fs, &mut Rng(7));
    measure_span(&fs, &mut Rng(7));
    let mut rng = Rng(11);
    c.bench_function("alloc/near/1M_free", |b| {
        b.iter(|| {
            let mut ctx = CacheContext::new(&fs.cache);
            let target = FsBlock(8 + rng.below(AG_BLOCKS - 16));
            let length = 1 + rng.below(64) as u32;
            let got = fs
                .alloc
                .allocate(&mut ctx, &fs.log, &Request::near(target, length, length));
            let got = black_box(got.unwrap().unwrap());
            fs.alloc
                .free(&mut ctx, &fs.log, got.fs_start, got.length, 0)
                .unwrap();
        })
    });
    c.bench_function("alloc/span_search/1M_free", |b| {
        b.iter(|| {
            let mut ctx = CacheContext::new(&fs.cache);
            let tree = bno_tree(&mut ctx, &fs);
            let target = 8 + rng.below(AG_BLOCKS - 16) as u32;
            black_box(span_search(
                &mut ctx,
                &tree,
                target,
                1 + rng.below(64) as u32,
            ));
        })
    });
    let mut index = 0usize;
    c.bench_function("alloc/free_and_realloc_exact/1M_free", |b| {
        b.iter(|| {
            let mut ctx = CacheContext::new(&fs.cache);
            let (start, length) = pieces[index % pieces.len()];
            index += 1;
            let exact = Request::near(FsBlock(start), length, length).with_mode(Mode::Exact);
            let got = fs
                .alloc
                .allocate(&mut ctx, &fs.log, &exact)
                .unwrap()
                .unwrap();
            fs.alloc
                .free(&mut ctx, &fs.log, got.fs_start, got.length, 0)
                .unwrap();
        })
    });
    let mut busy = BusyExtents::new();
    for (n, (start, length)) in pieces.iter().enumerate() {
        busy.insert(*start as u32, *length, n as u64);
    }
    c.bench_function("alloc/busy_trim/1M_busy", |b| {
        b.iter(|| {
            let mut visited = 0;
            let start = rng.below(AG_BLOCKS - 128) as u32;
            black_box(busy.trim(start, 128, &mut visited))
        })
    });
}

criterion_group!(alloc, benches);
criterion_main!(alloc);
