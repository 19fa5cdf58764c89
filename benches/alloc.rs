#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Allocator benchmarks: near allocations on a clean AG and on the adversarial layout of the
//! published near-mode rework (an AG whose free space is 1,000,000 extents of random lengths
//! and positions), against a plain by-block span search implemented here as the reference;
//! frees and the busy-extent check under the same layout.
//!
//! Besides criterion's timings, the fragmented run prints per-operation time (median, p99,
//! max), free-space records visited, and distance from the target (median, p90), in rounds
//! that interleave our search with the reference. Wall-clock maxima on a shared machine are
//! mostly scheduling, so each operation also records deterministic work counters (the
//! allocator's `OpCounters`, buffer-cache misses) and the time the thread spent waiting for a
//! CPU (`/proc/thread-self/schedstat`); the slowest operations are printed with them.

use std::cell::Cell;
use std::collections::HashMap;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use cairn_alloc::{Allocator, BusyExtents, LogSequence, Mode, OpCounters, Request};
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
/// Used gaps between free extents are 1..=GAP_MAX blocks: with lengths 1..=64 the 1,000,000
/// extents then spread over about 66 M of the AG's 67 M blocks, so random targets land among
/// them (with gaps of 1..=8 they covered only the first 37 M blocks).
const GAP_MAX: u64 = 66;
/// Interleaved rounds (ours, then the reference) and samples per round.
const ROUNDS: usize = 5;
const ROUND_SAMPLES: usize = 4_000;
/// Untimed near allocations before the rounds (see `compare_near`).
const WARMUP_SAMPLES: usize = 2_000;
/// Free extents made busy (freed again by a commit not yet durable) for the busy phase.
const BUSY_EXTENTS: usize = 250_000;
const BUSY_SAMPLES: usize = 5_000;

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

/// AG 0 made of `EXTENTS` free extents of 1..=64 blocks separated by used gaps of
/// 1..=`GAP_MAX`, freed in random order (so both trees are built by random inserts).
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
        at += u64::from(length) + 1 + rng.below(GAP_MAX);
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

/// Quantiles of `values`: median, p90, p99, max.
fn summary(values: &mut [u64]) -> (u64, u64, u64, u64) {
    if values.is_empty() {
        return (0, 0, 0, 0);
    }
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

/// This thread's time on a CPU and waiting for one, in ns (`/proc/thread-self/schedstat`).
fn sched() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
    let mut fields = text.split_whitespace().map(|f| f.parse().unwrap_or(0));
    (fields.next().unwrap_or(0), fields.next().unwrap_or(0))
}

/// One measured operation: wall time, its work, and what the scheduler did meanwhile.
#[derive(Debug, Clone, Copy, Default)]
struct Sample {
    time_ns: u64,
    /// Records visited (the allocator's count, or the span search's).
    records: u64,
    distance: u64,
    counters: OpCounters,
    cache_misses: u64,
    cache_reads: u64,
    /// Time spent waiting for a CPU across the operation (0: never descheduled).
    wait_ns: u64,
}

/// Runs `op` and fills in time, cache and scheduler figures; `op` fills in the rest.
fn measured(fs: &Fs, op: impl FnOnce(&mut Sample)) -> Sample {
    let mut sample = Sample::default();
    let cache_before = fs.cache.stats();
    let (_, wait_before) = sched();
    let started = Instant::now();
    op(&mut sample);
    sample.time_ns = started.elapsed().as_nanos() as u64;
    let (_, wait_after) = sched();
    let cache_after = fs.cache.stats();
    sample.wait_ns = wait_after - wait_before;
    sample.cache_misses = cache_after.misses - cache_before.misses;
    sample.cache_reads = cache_after.reads - cache_before.reads;
    sample
}

/// `count` random near requests with our search; each allocation is freed back. Returns the
/// allocation samples and the free samples.
fn measure_ours(fs: &Fs, rng: &mut Rng, count: usize) -> (Vec<Sample>, Vec<Sample>) {
    let (mut allocs, mut frees) = (Vec::new(), Vec::new());
    for n in 0..count {
        let mut ctx = CacheContext::new(&fs.cache);
        let target = FsBlock(8 + rng.below(AG_BLOCKS - 16));
        let length = 1 + rng.below(64) as u32;
        let request = Request::near(target, length, length);
        let mut got = None;
        allocs.push(measured(fs, |s| {
            let (found, counters) = fs
                .alloc
                .allocate_traced(&mut ctx, &fs.log, &request)
                .unwrap();
            let found = found.unwrap();
            (s.counters, s.records) = (counters, counters.records_visited);
            s.distance = distance(found.fs_start.0, found.length, target.0);
            got = Some(found);
        }));
        let got = got.unwrap();
        ctx.release_all();
        frees.push(measured(fs, |s| {
            s.counters = fs
                .alloc
                .free_traced(&mut ctx, &fs.log, got.fs_start, got.length, n as u64)
                .unwrap();
            s.records = s.counters.records_visited;
        }));
    }
    (allocs, frees)
}

/// The same requests through the reference span search, then an exact allocation there.
fn measure_span(fs: &Fs, rng: &mut Rng, count: usize) -> Vec<Sample> {
    let mut samples = Vec::new();
    for n in 0..count {
        let mut ctx = CacheContext::new(&fs.cache);
        let target = 8 + rng.below(AG_BLOCKS - 16);
        let length = 1 + rng.below(64) as u32;
        let mut got = None;
        samples.push(measured(fs, |s| {
            let tree = bno_tree(&mut ctx, fs);
            let (start, visited) = span_search(&mut ctx, &tree, target as u32, length).unwrap();
            let at = FsBlock(u64::from(start));
            let exact = Request::near(at, length, length).with_mode(Mode::Exact);
            let (found, counters) = fs.alloc.allocate_traced(&mut ctx, &fs.log, &exact).unwrap();
            let found = found.unwrap();
            (s.counters, s.records) = (counters, visited);
            s.distance = distance(found.fs_start.0, found.length, target);
            got = Some(found);
        }));
        let got = got.unwrap();
        fs.alloc
            .free(&mut ctx, &fs.log, got.fs_start, got.length, n as u64)
            .unwrap();
    }
    samples
}

/// One summary line: time, records and distance quantiles, and how many operations were
/// descheduled (waited for a CPU) and the slowest of those that were not.
fn report(name: &str, samples: &[Sample]) {
    let mut times: Vec<u64> = samples.iter().map(|s| s.time_ns).collect();
    let mut records: Vec<u64> = samples.iter().map(|s| s.records).collect();
    let mut distances: Vec<u64> = samples.iter().map(|s| s.distance).collect();
    let (t50, _, t99, tmax) = summary(&mut times);
    // Wall time less the time spent waiting for a CPU: what the operation cost on a shared
    // machine whose other tenants preempt it.
    let mut on_cpu: Vec<u64> = samples
        .iter()
        .map(|s| s.time_ns.saturating_sub(s.wait_ns))
        .collect();
    let (c50, _, c99, cmax) = summary(&mut on_cpu);
    let (r50, _, r99, rmax) = summary(&mut records);
    let (d50, d90, _, _) = summary(&mut distances);
    let waited = samples.iter().filter(|s| s.wait_ns > 0).count();
    let calm_max = samples
        .iter()
        .filter(|s| s.wait_ns == 0)
        .map(|s| s.time_ns)
        .max()
        .unwrap_or(0);
    println!(
        "{name}: n {} time ns median {t50} p99 {t99} max {tmax} (max undisturbed {calm_max}, \
         {waited} descheduled); on-cpu ns median {c50} p99 {c99} max {cmax}; records median \
         {r50} p99 {r99} max {rmax}; distance median {d50} p90 {d90}",
        samples.len()
    );
}

/// The `count` slowest operations with their work counters, to tell work from noise.
fn report_slowest(name: &str, samples: &[Sample], count: usize) {
    let mut sorted: Vec<&Sample> = samples.iter().collect();
    sorted.sort_by_key(|s| std::cmp::Reverse(s.time_ns));
    for s in sorted.iter().take(count) {
        let c = &s.counters;
        println!(
            "  slowest {name}: {} ns, waited {} ns; records {} busy {} rounds {} caps {}; \
             refills {} (+{} -{} blocks), tree blocks +{} -{}, cleared {}, forces {}; cache \
             misses {} reads {}",
            s.time_ns,
            s.wait_ns,
            s.records,
            c.busy_ranges_visited,
            c.near_rounds,
            c.near_round_caps,
            c.free_list_refills,
            c.free_list_blocks_added,
            c.free_list_blocks_returned,
            c.tree_blocks_taken,
            c.tree_blocks_freed,
            c.busy_cleared,
            c.log_forces,
            s.cache_misses,
            s.cache_reads
        );
    }
}

/// Medians of the work counters, for comparison with the slowest operations.
fn report_typical(name: &str, samples: &[Sample]) {
    let median = |f: &dyn Fn(&Sample) -> u64| {
        let mut v: Vec<u64> = samples.iter().map(f).collect();
        summary(&mut v).0
    };
    let share = |f: &dyn Fn(&Sample) -> bool| samples.iter().filter(|s| f(s)).count();
    println!(
        "  typical {name}: records {} rounds {}; ops with refills {}, tree splits {}, tree \
         merges {}, cache misses {}, round caps {}",
        median(&|s| s.records),
        median(&|s| s.counters.near_rounds),
        share(&|s| s.counters.free_list_refills > 0),
        share(&|s| s.counters.tree_blocks_taken > 0),
        share(&|s| s.counters.tree_blocks_freed > 0),
        share(&|s| s.cache_misses > 0),
        share(&|s| s.counters.near_round_caps > 0),
    );
}

/// Interleaved rounds of our search and the reference on the same requests, per-round lines
/// and then pooled figures.
fn compare_near(fs: &Fs) {
    let (mut ours, mut frees, mut span) = (Vec::new(), Vec::new(), Vec::new());
    // Unrecorded warm-up: building the layout left ~127,000 busy ranges, which allocations
    // drop 128 at a time (`BUSY_CLEAR_BATCH_MAX`); whichever search ran first would pay it.
    measure_ours(fs, &mut Rng(1), WARMUP_SAMPLES);
    for round in 0..ROUNDS {
        let seed = 7 + round as u64;
        // Alternate which goes first, so neither always finds the trees warmed by the other.
        let (a, f, s) = if round % 2 == 0 {
            let (a, f) = measure_ours(fs, &mut Rng(seed), ROUND_SAMPLES);
            (a, f, measure_span(fs, &mut Rng(seed), ROUND_SAMPLES))
        } else {
            let s = measure_span(fs, &mut Rng(seed), ROUND_SAMPLES);
            let (a, f) = measure_ours(fs, &mut Rng(seed), ROUND_SAMPLES);
            (a, f, s)
        };
        report(&format!("round {round} near (combined search)"), &a);
        report(&format!("round {round} span search (reference)"), &s);
        ours.extend(a);
        frees.extend(f);
        span.extend(s);
    }
    report("all rounds near (combined search)", &ours);
    report_typical("near", &ours);
    report_slowest("near", &ours, 5);
    report("all rounds span search (reference)", &span);
    report_slowest("span", &span, 3);
    report("free (after each near allocation)", &frees);
    report_typical("free", &frees);
    report_slowest("free", &frees, 3);
}

/// Frees of isolated extents (used on both sides, so no merge) and exact re-allocations of
/// them: random layout extents, taken out untimed first. Extents the free list has since
/// taken blocks from are skipped.
fn free_and_exact(fs: &Fs, pieces: &[(u64, u32)]) {
    let (mut frees, mut allocs) = (Vec::new(), Vec::new());
    let mut rng = Rng(23);
    for n in 0..ROUND_SAMPLES * 2 {
        let (start, length) = pieces[rng.below(pieces.len() as u64) as usize];
        let mut ctx = CacheContext::new(&fs.cache);
        let exact = Request::near(FsBlock(start), length, length).with_mode(Mode::Exact);
        if fs
            .alloc
            .allocate(&mut ctx, &fs.log, &exact)
            .unwrap()
            .is_none()
        {
            continue;
        }
        ctx.release_all();
        frees.push(measured(fs, |s| {
            s.counters = fs
                .alloc
                .free_traced(&mut ctx, &fs.log, FsBlock(start), length, n as u64)
                .unwrap();
            s.records = s.counters.records_visited;
        }));
        ctx.release_all();
        allocs.push(measured(fs, |s| {
            let (found, counters) = fs.alloc.allocate_traced(&mut ctx, &fs.log, &exact).unwrap();
            assert!(found.is_some(), "the extent just freed is free");
            (s.counters, s.records) = (counters, counters.records_visited);
        }));
        fs.alloc
            .free(&mut ctx, &fs.log, FsBlock(start), length, n as u64)
            .unwrap();
    }
    report("free (isolated extent)", &frees);
    report_slowest("free isolated", &frees, 3);
    report("exact re-allocation", &allocs);
    report_slowest("exact", &allocs, 3);
}

/// Near allocations while `BUSY_EXTENTS` of the free extents are busy (freed by a commit
/// not yet durable): candidates are trimmed around them. Then the log catches up and the
/// next allocation drops every busy range at once.
fn busy_phase(fs: &Fs, pieces: &[(u64, u32)]) {
    let busy_sequence = fs.log.durable.get() + 1;
    let mut rng = Rng(31);
    let mut ctx = CacheContext::new(&fs.cache);
    // Distinct extents (the layout is in random order): an exact request on a busy one would
    // force the log and clear them all.
    for (start, length) in pieces.iter().take(BUSY_EXTENTS).copied() {
        let exact = Request::near(FsBlock(start), length, length).with_mode(Mode::Exact);
        if fs
            .alloc
            .allocate(&mut ctx, &fs.log, &exact)
            .unwrap()
            .is_some()
        {
            let at = FsBlock(start);
            fs.alloc
                .free(&mut ctx, &fs.log, at, length, busy_sequence)
                .unwrap();
        }
        ctx.release_all();
    }
    let busy_count = fs.alloc.busy_extents(cairn_format::AgNumber(0)).len();
    let mut samples = Vec::new();
    for _ in 0..BUSY_SAMPLES {
        let target = FsBlock(8 + rng.below(AG_BLOCKS - 16));
        let length = 1 + rng.below(64) as u32;
        let request = Request::near(target, length, length);
        let mut got = None;
        samples.push(measured(fs, |s| {
            let (found, counters) = fs
                .alloc
                .allocate_traced(&mut ctx, &fs.log, &request)
                .unwrap();
            let found = found.unwrap();
            (s.counters, s.records) = (counters, counters.records_visited);
            s.distance = distance(found.fs_start.0, found.length, target.0);
            got = Some(found);
        }));
        let got = got.unwrap();
        fs.alloc
            .free(&mut ctx, &fs.log, got.fs_start, got.length, busy_sequence)
            .unwrap();
        ctx.release_all();
    }
    println!("busy phase: {busy_count} busy ranges in AG 0");
    report("near with busy ranges", &samples);
    report_typical("near busy", &samples);
    report_slowest("near busy", &samples, 3);
    fs.log.durable.set(busy_sequence);
    let request = Request::near(FsBlock(AG_BLOCKS / 2), 8, 8);
    let clearing = measured(fs, |s| {
        let (_, counters) = fs
            .alloc
            .allocate_traced(&mut ctx, &fs.log, &request)
            .unwrap();
        (s.counters, s.records) = (counters, counters.records_visited);
    });
    report_slowest("allocation clearing the busy ranges", &[clearing], 1);
    fs.log.durable.set(u64::MAX >> 1);
}

/// `BusyExtents::trim` of random 128-block ranges against one busy range per layout extent.
fn busy_trim(pieces: &[(u64, u32)]) -> BusyExtents {
    let mut busy = BusyExtents::new();
    for (n, (start, length)) in pieces.iter().enumerate() {
        busy.insert(*start as u32, *length, n as u64, false);
    }
    let mut rng = Rng(41);
    let (mut times, mut visits) = (Vec::new(), Vec::new());
    for _ in 0..ROUND_SAMPLES * 5 {
        let mut visited = 0;
        let start = rng.below(AG_BLOCKS - 128) as u32;
        let started = Instant::now();
        black_box(busy.trim(start, 128, &mut visited));
        times.push(started.elapsed().as_nanos() as u64);
        visits.push(visited);
    }
    let (t50, _, t99, tmax) = summary(&mut times);
    let (v50, _, v99, vmax) = summary(&mut visits);
    println!(
        "busy trim (1M busy ranges): time ns median {t50} p99 {t99} max {tmax}; ranges \
         visited median {v50} p99 {v99} max {vmax}"
    );
    busy
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
    compare_near(&fs);
    free_and_exact(&fs, &pieces);
    let busy = busy_trim(&pieces);
    busy_phase(&fs, &pieces);
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
            // The free list may have taken blocks of this extent since the layout was built.
            if let Some(got) = fs.alloc.allocate(&mut ctx, &fs.log, &exact).unwrap() {
                fs.alloc
                    .free(&mut ctx, &fs.log, got.fs_start, got.length, 0)
                    .unwrap();
            }
        })
    });
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
