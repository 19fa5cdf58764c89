//! Buffer cache benchmarks, lookaside array on and off, for working sets of 8, 37 and 1,000
//! buffers per AG over 4 and 16 AGs, on 1 and 2 threads: `bufcache/lookup` is a full cached
//! `get` + release (hold, lock, unlock, release included); `bufcache/lookup_step` is
//! `is_cached`, the find step alone (slot read, or index lock + search), which is the part the
//! lookaside replaces. Each thread (helpers live for the whole benchmark) first does one pass
//! of `get`s, so its own slots are filled before timing. Times are on-CPU time (wall less
//! run-queue wait, `/proc/thread-self/schedstat`) of the slowest thread, so other processes
//! on shared cores count less (their cache pollution still counts). Then the lookaside hit
//! rates of the replayed "create 100k files" and "unlink them" traces (printed; wall time).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::hint::black_box;
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use cairn_blockdev::{BlockDevice, MemDevice};
use cairn_bufcache::trace::{TraceBuilder, replay};
use cairn_bufcache::{BufKey, BufferCache, BufferOps, CacheConfig, ReadSpec};
use cairn_format::{FormatError, FsBlock, Lsn};
use criterion::{Criterion, criterion_group, criterion_main};

/// Verifier that accepts anything: the benchmark measures lookups, not verification.
#[derive(Debug)]
struct RawOps;

impl BufferOps for RawOps {
    fn name(&self) -> &'static str {
        "bench block"
    }
    fn verify_read(&self, _: &[u8], _: FsBlock, _: &ReadSpec) -> Result<(), FormatError> {
        Ok(())
    }
    fn prepare_write(&self, _: &mut [u8], _: FsBlock, _: Option<Lsn>) -> Result<(), FormatError> {
        Ok(())
    }
}

static RAW: RawOps = RawOps;
const BLOCK_SIZE: u32 = 4096;
const AG_BLOCKS: u32 = 2048;

fn spec() -> ReadSpec {
    ReadSpec::new(&RAW, [0; 16])
}

fn cache(ag_count: u32, slots: u32, ag_blocks: u32) -> BufferCache {
    let bytes = u64::from(ag_blocks) * u64::from(ag_count) * u64::from(BLOCK_SIZE);
    let device = MemDevice::new(bytes, 4096);
    device.set_recording(false);
    let device: Arc<dyn BlockDevice> = Arc::new(device);
    let config = CacheConfig::new(BLOCK_SIZE, ag_blocks, ag_count)
        .with_lookaside_slots(slots)
        .with_memory_limit_bytes(1 << 30);
    BufferCache::new(config, device).unwrap()
}

/// The working set, AG-interleaved: `per_ag` consecutive blocks from the start of each AG.
fn working_set(cache: &BufferCache, per_ag: u32, ag_count: u32) -> Vec<BufKey> {
    let mut keys = Vec::new();
    for block in 0..per_ag {
        for ag in 0..ag_count {
            let key = BufKey::single(u64::from(ag * AG_BLOCKS + block));
            drop(cache.get_new(key, &spec()).unwrap());
            keys.push(key);
        }
    }
    keys
}

/// What one benchmark iteration does with a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// `get` and release.
    Get,
    /// `is_cached`: the find step alone.
    Find,
}

/// `iters` lookups over `keys` starting at `start`; each `get` is released at once.
fn lookups(cache: &BufferCache, keys: &[Vec<BufKey>], start: usize, iters: u64, step: Step) {
    let spec = spec();
    let keys = &keys[start % keys.len()];
    let mut index = 0;
    for _ in 0..iters {
        match step {
            Step::Get => black_box(cache.get(keys[index], &spec).unwrap()[0]),
            Step::Find => black_box(u8::from(cache.is_cached(keys[index]))),
        };
        index += 1;
        if index == keys.len() {
            index = 0;
        }
    }
}

/// Time this thread has waited for a CPU, in ns (`/proc/thread-self/schedstat`, second
/// field; accounted each time the thread gets a CPU back, so exact while it runs).
fn run_queue_wait_ns() -> u64 {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
    text.split_whitespace()
        .nth(1)
        .and_then(|field| field.parse().ok())
        .unwrap_or(0)
}

/// This thread's on-CPU time for `iters` lookups: wall time less run-queue wait, so other
/// processes on the shared cores do not count.
fn timed_lookups(
    cache: &BufferCache,
    keys: &[Vec<BufKey>],
    thread: usize,
    iters: u64,
    step: Step,
) -> Duration {
    let waited_before = run_queue_wait_ns();
    let start = Instant::now();
    lookups(cache, keys, thread, iters, step);
    let wall = start.elapsed();
    let waited = run_queue_wait_ns().saturating_sub(waited_before);
    wall.saturating_sub(Duration::from_nanos(waited))
}

/// The slowest thread's on-CPU time for `iters` lookups each (the per-lookup cost under
/// sharing): this thread runs its share while each helper in `helpers` (spawned once per
/// benchmark, so its thread-local slots stay warm) runs its own.
fn run_round(
    cache: &BufferCache,
    keys: &[Vec<BufKey>],
    helpers: &[mpsc::Sender<u64>],
    done: &mpsc::Receiver<Duration>,
    iters: u64,
    step: Step,
) -> Duration {
    for helper in helpers {
        helper.send(iters).unwrap();
    }
    let mut slowest = timed_lookups(cache, keys, 0, iters, step);
    for _ in helpers {
        slowest = slowest.max(done.recv().unwrap());
    }
    slowest
}

fn lookup_benches(c: &mut Criterion) {
    for (group_name, step) in [
        ("bufcache/lookup", Step::Get),
        ("bufcache/lookup_step", Step::Find),
    ] {
        let mut group = c.benchmark_group(group_name);
        group.warm_up_time(Duration::from_millis(300));
        group.measurement_time(Duration::from_secs(1));
        group.sample_size(20);
        for per_ag in [8u32, 37, 1000] {
            for ag_count in [4u32, 16] {
                for threads in [1usize, 2] {
                    lookup_pair(&mut group, per_ag, ag_count, threads, step);
                }
            }
        }
        group.finish();
    }
}

/// On and off side by side, so each pair is measured seconds apart.
fn lookup_pair(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    per_ag: u32,
    ag_count: u32,
    threads: usize,
    step: Step,
) {
    for (label, slots) in [("lookaside_on", 37u32), ("lookaside_off", 0)] {
        let cache = cache(ag_count, slots, AG_BLOCKS);
        let keys = working_set(&cache, per_ag, ag_count);
        // Each thread walks the same set from its own offset.
        let mut rotated = Vec::new();
        for thread in 0..threads {
            let mut own = keys.clone();
            own.rotate_left(thread * keys.len() / threads.max(1) / 2);
            rotated.push(own);
        }
        let warm_up = 2 * keys.len() as u64;
        let name = format!("{label}/{per_ag}_per_ag/{ag_count}_ags/{threads}_thread");
        let (cache, rotated) = (&cache, &rotated);
        std::thread::scope(|scope| {
            let (done_send, done) = mpsc::channel();
            let mut helpers = Vec::new();
            for thread in 1..threads {
                let (send, rounds) = mpsc::channel::<u64>();
                let done_send = done_send.clone();
                scope.spawn(move || {
                    // A pass of `get`s fills this thread's slots, as the main thread's are.
                    lookups(cache, rotated, thread, warm_up, Step::Get);
                    done_send.send(Duration::ZERO).unwrap();
                    for iters in rounds {
                        let time = timed_lookups(cache, rotated, thread, iters, step);
                        done_send.send(time).unwrap();
                    }
                });
                helpers.push(send);
            }
            lookups(cache, rotated, 0, warm_up, Step::Get);
            for _ in &helpers {
                done.recv().unwrap();
            }
            group.bench_function(name, |b| {
                b.iter_custom(|iters| run_round(cache, rotated, &helpers, &done, iters, step));
            });
            // Dropping the senders ends the helpers.
            drop(helpers);
        });
    }
}

/// Prints the lookaside hit rates of the replayed traces for several slot counts.
fn trace_hit_rates(_: &mut Criterion) {
    let mut builder = TraceBuilder::new(4, 1 << 16, 1);
    let create = builder.create(100_000).take();
    let unlink = builder.unlink_all().take();
    for slots in [0u32, 13, 37, 64, 128] {
        let cache = cache(4, slots, 1 << 16);
        let mut rates = Vec::new();
        for trace in [&create, &unlink] {
            let before = cache.stats();
            let start = Instant::now();
            replay(&cache, trace, &spec()).unwrap();
            let elapsed = start.elapsed();
            let after = cache.stats();
            let gets = after.gets - before.gets;
            let hits = (after.lookaside_hits - before.lookaside_hits) as f64 / gets as f64;
            let all = (after.hits - before.hits) as f64 / gets as f64;
            let ns = elapsed.as_nanos() as f64 / gets as f64;
            rates.push(format!(
                "{gets} gets, lookaside {hits:.3}, all hits {all:.3}, {ns:.0} ns/op"
            ));
        }
        println!(
            "bufcache/trace/{slots}_slots: create_100k: {}; unlink: {}",
            rates[0], rates[1]
        );
    }
}

criterion_group!(benches, lookup_benches, trace_hit_rates);
criterion_main!(benches);
