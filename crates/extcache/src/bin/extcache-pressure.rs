//! Memory-pressure workload for the extent status cache, reporting the figures ext4's
//! `es_shrinker_info` reports.
//!
//! It plays a small filesystem: 100,000 inodes, each with a fragmented on-disk map (16 extents
//! of written, unwritten and hole ranges, never physically contiguous) behind a per-inode
//! reader-writer lock that stands in for the fs's inode lock. Every read maps its block through
//! the cache and fills from the map on a miss (the coherence contract of `docs/extcache.md`:
//! fill under the shared lock, edits under the exclusive one); every write allocates holes,
//! converts unwritten ranges or punches, keeping cache and map in step. The cache's target is
//! set below the ~1.6M entries the maps need, so the shrinker runs throughout while the cache
//! holds over a million entries. Each hit is checked against the map.
//!
//! Phases, each run by two worker threads: populate (fill every inode's whole map), mixed
//! (80% reads, 20% writes), random-read and, for reference, uniform-read. Reads and writes pick
//! a hot inode (the first 10%) nine times out of ten, else any inode; the uniform phase picks
//! any inode. Usage: `extcache-pressure [--reclaim direct|background] [--quick]`; direct (the
//! workers call `maybe_shrink` after each edit) is the default.

use cairn_extcache::{CacheConfig, Extent, ExtentCache, ExtentState, InodeExtents, StatsSnapshot};
use parking_lot::RwLock;
use std::error::Error;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

const EXTENTS_PER_INODE: u64 = 16;
const HOT_INODE_PERCENT: u64 = 10;
const HOT_PICK_PERCENT: u64 = 90;
const WORKERS: u64 = 2;

/// One run's sizes.
#[derive(Debug, Clone, Copy)]
struct Plan {
    inodes: u64,
    mixed_ops_per_worker: u64,
    read_ops_per_worker: u64,
    uniform_ops_per_worker: u64,
    high_entries: u64,
    low_entries: u64,
    background: bool,
}

/// One extent of the simulated on-disk map. Boundaries never change; states and physical
/// blocks do.
#[derive(Debug, Clone, Copy)]
struct DiskExtent {
    start: u64,
    block_count: u64,
    state: ExtentState,
}

/// A simulated in-core inode: its on-disk map behind the inode lock, and its cache handle.
#[derive(Debug)]
struct SimInode {
    map: RwLock<Vec<DiskExtent>>,
    cache: InodeExtents,
}

#[derive(Debug)]
struct World {
    cache: ExtentCache,
    inodes: Vec<SimInode>,
    next_physical: AtomicU64,
    mismatches: AtomicU64,
    plan: Plan,
}

/// splitmix64: a tiny deterministic generator, enough for picking blocks.
#[derive(Debug)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound.max(1)
    }
}

/// A fragmented map: lengths 1..=8, no two holes in a row, a physical gap after each extent
/// so that nothing merges in the cache.
fn make_map(rng: &mut Rng, next_physical: &AtomicU64) -> Vec<DiskExtent> {
    let mut map = Vec::with_capacity(EXTENTS_PER_INODE as usize);
    let mut start = 0;
    let mut previous_hole = true;
    for _ in 0..EXTENTS_PER_INODE {
        let block_count = 1 + rng.below(8);
        let pick = rng.below(3);
        let state = if pick == 0 && !previous_hole {
            ExtentState::Hole
        } else {
            let physical_block = next_physical.fetch_add(block_count + 1, Ordering::Relaxed);
            if pick == 1 {
                ExtentState::Unwritten { physical_block }
            } else {
                ExtentState::Written { physical_block }
            }
        };
        previous_hole = state == ExtentState::Hole;
        map.push(DiskExtent {
            start,
            block_count,
            state,
        });
        start += block_count;
    }
    map
}

fn map_end(map: &[DiskExtent]) -> u64 {
    map.last().map_or(0, |e| e.start + e.block_count)
}

fn find(map: &[DiskExtent], block: u64) -> Option<usize> {
    let index = map.partition_point(|e| e.start + e.block_count <= block);
    (index < map.len()).then_some(index)
}

impl World {
    fn new(plan: &Plan) -> Result<Self, Box<dyn Error>> {
        let config = CacheConfig::with_entry_watermarks(plan.high_entries, plan.low_entries);
        let cache = ExtentCache::new(config)?;
        let next_physical = AtomicU64::new(1);
        let mut rng = Rng(42);
        let inodes = (0..plan.inodes)
            .map(|ino| SimInode {
                map: RwLock::new(make_map(&mut rng, &next_physical)),
                cache: cache.open_inode(ino),
            })
            .collect();
        let mismatches = AtomicU64::new(0);
        Ok(World {
            cache,
            inodes,
            next_physical,
            mismatches,
            plan: *plan,
        })
    }

    fn after_edit(&self) {
        if !self.plan.background {
            self.cache.maybe_shrink();
        }
    }

    /// Caches the disk extent at `index` (a miss fill: one extent, holes included).
    fn fill_one(&self, inode: &SimInode, map: &[DiskExtent], index: usize) {
        let Some(disk) = map.get(index) else { return };
        let mapped = match disk.state {
            ExtentState::Hole => Vec::new(),
            state => Extent::new(disk.start, disk.block_count, state)
                .into_iter()
                .collect(),
        };
        if inode
            .cache
            .fill(disk.start, disk.block_count, &mapped)
            .is_err()
        {
            self.mismatches.fetch_add(1, Ordering::Relaxed);
        }
        self.after_edit();
    }

    /// Fills an inode's whole map in one call (what a first open would do).
    fn populate(&self, inode: &SimInode) {
        let map = inode.map.read();
        let mapped: Vec<Extent> = map
            .iter()
            .filter(|e| e.state != ExtentState::Hole)
            .filter_map(|e| Extent::new(e.start, e.block_count, e.state).ok())
            .collect();
        if inode.cache.fill(0, map_end(&map), &mapped).is_err() {
            self.mismatches.fetch_add(1, Ordering::Relaxed);
        }
        drop(map);
        self.after_edit();
    }

    /// Maps `block` through the cache, filling from the map on a miss; checks every hit.
    fn map_block(&self, inode: &SimInode, map: &[DiskExtent], block: u64) -> Option<usize> {
        let index = find(map, block)?;
        match inode.cache.lookup(block) {
            Some(extent) => {
                let disk = map.get(index)?;
                let want = disk
                    .state
                    .physical_block()
                    .map(|p| p + (block - disk.start));
                let found = extent.state_at(block);
                let same_kind = found.map(|s| s.name()) == Some(disk.state.name());
                if !same_kind || found.and_then(ExtentState::physical_block) != want {
                    self.mismatches.fetch_add(1, Ordering::Relaxed);
                }
            }
            None => self.fill_one(inode, map, index),
        }
        Some(index)
    }

    fn read(&self, inode: &SimInode, block: u64) {
        let map = inode.map.read();
        self.map_block(inode, &map, block);
    }

    /// A write: allocate a hole (as unwritten, then convert after the "data write"), convert
    /// an unwritten extent, overwrite a written one in place, or now and then punch it.
    fn write(&self, inode: &SimInode, block: u64, punch: bool) {
        let mut map = inode.map.write();
        let Some(index) = self.map_block(inode, &map, block) else {
            return;
        };
        let Some(disk) = map.get_mut(index) else {
            return;
        };
        let (start, block_count) = (disk.start, disk.block_count);
        let cache = &inode.cache;
        let insert = |state| -> Result<(), Box<dyn Error>> {
            Ok(cache.insert(Extent::new(start, block_count, state)?)?)
        };
        let convert = || -> Result<(), Box<dyn Error>> {
            cache.convert_unwritten(start, block_count)?;
            Ok(())
        };
        let result = match disk.state {
            ExtentState::Written { .. } if punch => {
                disk.state = ExtentState::Hole;
                insert(ExtentState::Hole)
            }
            ExtentState::Hole => {
                let physical_block = self
                    .next_physical
                    .fetch_add(block_count + 1, Ordering::Relaxed);
                disk.state = ExtentState::Written { physical_block };
                insert(ExtentState::Unwritten { physical_block }).and_then(|()| convert())
            }
            ExtentState::Unwritten { physical_block } => {
                disk.state = ExtentState::Written { physical_block };
                convert()
            }
            ExtentState::Written { .. } | ExtentState::Delayed => Ok(()),
        };
        if result.is_err() {
            self.mismatches.fetch_add(1, Ordering::Relaxed);
        }
        drop(map);
        self.after_edit();
    }
}

/// What a worker does in one phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Mixed,
    RandomRead,
    UniformRead,
}

fn pick_inode(rng: &mut Rng, inodes: u64, skewed: bool) -> usize {
    let hot = (inodes * HOT_INODE_PERCENT / 100).max(1);
    let ino = if skewed && rng.below(100) < HOT_PICK_PERCENT {
        rng.below(hot)
    } else {
        rng.below(inodes)
    };
    ino as usize
}

fn run_worker(world: &World, phase: Phase, ops: u64, seed: u64) {
    let mut rng = Rng(seed);
    let count = world.inodes.len() as u64;
    for _ in 0..ops {
        let Some(inode) =
            world
                .inodes
                .get(pick_inode(&mut rng, count, phase != Phase::UniformRead))
        else {
            continue;
        };
        let block = rng.below(map_end(&inode.map.read()));
        let roll = rng.below(100);
        if phase == Phase::Mixed && roll < 20 {
            world.write(inode, block, roll < 1);
        } else {
            world.read(inode, block);
        }
    }
}

/// A phase's work for one worker thread (given its index).
type PhaseWork = fn(&World, u64);

/// Runs `work(worker)` on two threads while sampling the object count; returns the elapsed
/// time and the smallest and largest object counts seen.
fn run_phase(world: &Arc<World>, work: PhaseWork) -> (Duration, u64, u64) {
    let started = Instant::now();
    let handles: Vec<_> = (0..WORKERS)
        .map(|worker| {
            let world = Arc::clone(world);
            thread::spawn(move || work(&world, worker))
        })
        .collect();
    let (mut low, mut high) = (u64::MAX, 0);
    while handles.iter().any(|h| !h.is_finished()) {
        let objects = world.cache.stats().objects;
        (low, high) = (low.min(objects), high.max(objects));
        thread::sleep(Duration::from_millis(10));
    }
    for handle in handles {
        if handle.join().is_err() {
            eprintln!("a worker thread panicked");
        }
    }
    (started.elapsed(), low, high)
}

fn report_phase(name: &str, ops: u64, elapsed: Duration, delta: &StatsSnapshot, range: (u64, u64)) {
    let rate = ops as f64 / elapsed.as_secs_f64().max(1e-9);
    println!(
        "phase {name:<12} {ops:>9} ops {:>7.0} kops/s  hit rate {:.4}  scans {:>7}  \
         avg scan {:>6} ns  objects {}..{}",
        rate / 1e3,
        delta.hit_rate(),
        delta.scans,
        delta.scan_time_avg_ns,
        range.0,
        range.1,
    );
}

fn parse_plan() -> Result<Plan, Box<dyn Error>> {
    let mut plan = Plan {
        inodes: 100_000,
        mixed_ops_per_worker: 1_000_000,
        read_ops_per_worker: 2_000_000,
        uniform_ops_per_worker: 500_000,
        high_entries: 1_100_000,
        low_entries: 1_050_000,
        background: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--reclaim" => match args.next().as_deref() {
                Some("background") => plan.background = true,
                Some("direct") => plan.background = false,
                other => return Err(format!("--reclaim background|direct, not {other:?}").into()),
            },
            "--quick" => {
                plan = Plan {
                    inodes: 10_000,
                    mixed_ops_per_worker: 50_000,
                    read_ops_per_worker: 100_000,
                    uniform_ops_per_worker: 20_000,
                    high_entries: 110_000,
                    low_entries: 105_000,
                    ..plan
                }
            }
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    Ok(plan)
}

fn main() -> Result<(), Box<dyn Error>> {
    let plan = parse_plan()?;
    let world = Arc::new(World::new(&plan)?);
    let shrinker = if plan.background {
        Some(world.cache.start_shrinker()?)
    } else {
        None
    };
    println!(
        "extcache-pressure: {} inodes x {EXTENTS_PER_INODE} disk extents, target {}..{} \
         entries, reclaim {}",
        plan.inodes,
        plan.low_entries,
        plan.high_entries,
        if plan.background {
            "background"
        } else {
            "direct"
        },
    );
    let phases: [(&str, u64, PhaseWork); 4] = [
        ("populate", plan.inodes, |world, worker| {
            let chunk = world.inodes.len().div_ceil(WORKERS as usize);
            let skip = chunk * worker as usize;
            world
                .inodes
                .iter()
                .skip(skip)
                .take(chunk)
                .for_each(|i| world.populate(i));
        }),
        (
            "mixed",
            plan.mixed_ops_per_worker * WORKERS,
            |world, worker| {
                run_worker(
                    world,
                    Phase::Mixed,
                    world.plan.mixed_ops_per_worker,
                    1 + worker,
                )
            },
        ),
        (
            "random-read",
            plan.read_ops_per_worker * WORKERS,
            |world, worker| {
                run_worker(
                    world,
                    Phase::RandomRead,
                    world.plan.read_ops_per_worker,
                    11 + worker,
                )
            },
        ),
        (
            "uniform-read",
            plan.uniform_ops_per_worker * WORKERS,
            |world, worker| {
                run_worker(
                    world,
                    Phase::UniformRead,
                    world.plan.uniform_ops_per_worker,
                    21 + worker,
                )
            },
        ),
    ];
    for (name, ops, work) in phases {
        let before = world.cache.stats();
        let (elapsed, low, high) = run_phase(&world, work);
        let delta = world.cache.stats().since(&before);
        report_phase(name, ops, elapsed, &delta, (low, high));
    }
    drop(shrinker);
    let stats = world.cache.stats();
    println!("{stats}");
    if let Some(worst) = world.cache.worst_inode() {
        println!(
            "  {} inode ({} objects, {} reclaimable)",
            worst.ino, worst.objects, worst.reclaimable_objects
        );
    }
    println!(
        "coherence mismatches: {}",
        world.mismatches.load(Ordering::Relaxed)
    );
    Ok(())
}
