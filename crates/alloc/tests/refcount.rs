#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Model-based tests of the refcount tree (reflink): random allocations, shares (increase),
//! drops (decrease), copy-on-write staging, unstaging and staged frees against a per-block
//! model of mapping counts, checking after every step that the tree's records are exactly
//! the model's shared and staging runs, that free space is exactly the blocks nobody maps,
//! and every allocator invariant.

mod support;

use std::collections::BTreeMap;

use cairn_alloc::{Allocator, Request};
use cairn_btree::CacheContext;
use cairn_bufcache::BufferCache;
use cairn_format::log::RefcountOp;
use cairn_format::{AgNumber, FsBlock, Geometry, RefcountRecord};
use proptest::prelude::*;
use support::{TestLog, allocator, cache, formatted};

const AGS: u32 = 2;

#[derive(Debug, Clone)]
enum Op {
    /// Allocates `length` blocks near a target (a file maps them once).
    Alloc(u64, u32),
    /// Applies an op to a piece of a known run: (which run, offset %, length %).
    Increase(usize, u32, u32),
    Decrease(usize, u32, u32),
    /// Allocates and stages `length` blocks (a copy-on-write starting).
    Stage(u64, u32),
    /// Unstages or frees a piece of a staged run.
    Unstage(usize, u32, u32),
    FreeStaged(usize, u32, u32),
    Durable,
}

fn op() -> impl Strategy<Value = Op> {
    let piece = || (any::<usize>(), 0u32..100, 1u32..101);
    prop_oneof![
        3 => (any::<u64>(), 1u32..40).prop_map(|(t, l)| Op::Alloc(t, l)),
        4 => piece().prop_map(|(w, o, l)| Op::Increase(w, o, l)),
        4 => piece().prop_map(|(w, o, l)| Op::Decrease(w, o, l)),
        2 => (any::<u64>(), 1u32..20).prop_map(|(t, l)| Op::Stage(t, l)),
        2 => piece().prop_map(|(w, o, l)| Op::Unstage(w, o, l)),
        1 => piece().prop_map(|(w, o, l)| Op::FreeStaged(w, o, l)),
        1 => Just(Op::Durable),
    ]
}

/// The world of one run: the allocator and the model of every block handed out.
struct World {
    geometry: Geometry,
    cache: BufferCache,
    alloc: Allocator,
    log: TestLog,
    /// Mapping count of every mapped block (absent: free or staged).
    counts: BTreeMap<u64, u32>,
    /// Staged blocks.
    staged: BTreeMap<u64, ()>,
    sequence: u64,
    /// Blocks the allocator owns per AG at the start (free + free list + tree blocks).
    owned: Vec<u64>,
}

impl World {
    fn new() -> World {
        let (device, geometry) = formatted(8 << 20, 512, AGS);
        let cache = cache(&device, &geometry);
        let alloc = allocator(&geometry);
        let mut world = World {
            geometry,
            cache,
            alloc,
            log: TestLog::default(),
            counts: BTreeMap::new(),
            staged: BTreeMap::new(),
            sequence: 1,
            owned: Vec::new(),
        };
        world.owned = (0..AGS).map(|ag| world.owned_now(ag)).collect();
        world
    }

    fn owned_now(&self, ag: u32) -> u64 {
        let mut ctx = CacheContext::new(&self.cache);
        let s = self.alloc.check_invariants(&mut ctx, AgNumber(ag)).unwrap();
        u64::from(s.free_blocks) + s.free_list.len() as u64 + s.tree_blocks + s.refcount_blocks
    }

    fn allocate(&mut self, target: u64, length: u32) -> Option<(u64, u32)> {
        let mut ctx = CacheContext::new(&self.cache);
        let target = FsBlock(target % self.geometry.block_count);
        let request = Request::near(target, 1, length);
        let got = self
            .alloc
            .allocate(&mut ctx, &self.log, &request)
            .unwrap()?;
        Some((got.fs_start.0, got.length))
    }

    /// A piece of the `which`-th run of `blocks` (consecutive keys), by percentages.
    fn piece<V>(
        blocks: &BTreeMap<u64, V>,
        which: usize,
        offset: u32,
        length: u32,
    ) -> Option<(u64, u32)> {
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for &block in blocks.keys() {
            match runs.last_mut() {
                Some(run) if run.1 == block => run.1 += 1,
                _ => runs.push((block, block + 1)),
            }
        }
        let (start, end) = *runs.get(which % runs.len().max(1))?;
        let total = (end - start) as u32;
        let skip = total * offset / 100 % total;
        let count = (total - skip).min((total * length).div_ceil(100)).max(1);
        Some((start + u64::from(skip), count))
    }

    /// Applies `op` in calls that may rewrite two records each (so the cut-short path runs
    /// all the time), as a caller spreading the work over transactions does.
    fn change(&mut self, (start, length): (u64, u32), op: RefcountOp) {
        self.sequence += 1;
        let mut done = 0;
        while done < length {
            let mut ctx = CacheContext::new(&self.cache);
            let range = (FsBlock(start + u64::from(done)), length - done);
            let step = self
                .alloc
                .change_references(&mut ctx, &self.log, range, op, (self.sequence, 2))
                .unwrap();
            assert!(step > 0, "no progress");
            done += step;
        }
    }

    /// The records the model says each AG's tree holds.
    fn model_records(&self, ag: u32) -> Vec<RefcountRecord> {
        let base = self.geometry.ag_start(ag);
        let end = base + u64::from(self.geometry.ag_len(ag));
        let mut records: Vec<RefcountRecord> = Vec::new();
        let shared = self
            .counts
            .range(base..end)
            .filter(|(_, c)| **c >= 2)
            .map(|(b, c)| (*b, *c, false));
        let staged = self.staged.range(base..end).map(|(b, _)| (*b, 1, true));
        for (block, count, staging) in shared.chain(staged) {
            let at = (block - base) as u32;
            match records.last_mut() {
                Some(r)
                    if r.staging == staging && r.end() == u64::from(at) && r.refcount == count =>
                {
                    r.length += 1
                }
                _ => records.push(RefcountRecord {
                    start: cairn_format::AgBlock(at),
                    length: 1,
                    refcount: count,
                    staging,
                }),
            }
        }
        records
    }

    fn check(&self) -> Result<(), TestCaseError> {
        for ag in 0..AGS {
            let mut ctx = CacheContext::new(&self.cache);
            let summary = self.alloc.check_invariants(&mut ctx, AgNumber(ag)).unwrap();
            drop(ctx);
            prop_assert_eq!(&summary.refcount_records, &self.model_records(ag));
            let base = self.geometry.ag_start(ag);
            let end = base + u64::from(self.geometry.ag_len(ag));
            for (start, length) in &summary.extents {
                let from = base + u64::from(*start);
                let to = from + u64::from(*length);
                prop_assert!(
                    self.counts.range(from..to).next().is_none(),
                    "mapped block free"
                );
                prop_assert!(
                    self.staged.range(from..to).next().is_none(),
                    "staged block free"
                );
            }
            let handed = (self.counts.range(base..end).count()
                + self.staged.range(base..end).count()) as u64;
            prop_assert_eq!(self.owned_now(ag) + handed, self.owned[ag as usize]);
        }
        Ok(())
    }
}

fn run_op(world: &mut World, op: &Op) {
    match *op {
        Op::Alloc(target, length) => {
            if let Some((start, got)) = world.allocate(target, length) {
                world
                    .counts
                    .extend((start..start + u64::from(got)).map(|b| (b, 1)));
            }
        }
        Op::Increase(which, offset, length) | Op::Decrease(which, offset, length) => {
            let Some(piece) = World::piece(&world.counts, which, offset, length) else {
                return;
            };
            let piece = within_ag(&world.geometry, piece);
            let increase = matches!(op, Op::Increase(..));
            let op = if increase {
                RefcountOp::Increase
            } else {
                RefcountOp::Decrease
            };
            world.change(piece, op);
            for block in piece.0..piece.0 + u64::from(piece.1) {
                let count = world.counts.get_mut(&block).unwrap();
                match increase {
                    true => *count += 1,
                    false if *count == 1 => {
                        world.counts.remove(&block);
                    }
                    false => *count -= 1,
                }
            }
        }
        Op::Stage(target, length) => {
            if let Some((start, got)) = world.allocate(target, length) {
                let mut ctx = CacheContext::new(&world.cache);
                world
                    .alloc
                    .stage(&mut ctx, &world.log, (FsBlock(start), got), world.sequence)
                    .unwrap();
                world
                    .staged
                    .extend((start..start + u64::from(got)).map(|b| (b, ())));
            }
        }
        Op::Unstage(which, offset, length) | Op::FreeStaged(which, offset, length) => {
            let Some(piece) = World::piece(&world.staged, which, offset, length) else {
                return;
            };
            let piece = within_ag(&world.geometry, piece);
            let unstage = matches!(op, Op::Unstage(..));
            if unstage {
                world.change(piece, RefcountOp::Unstage);
            } else {
                world.sequence += 1;
                let mut ctx = CacheContext::new(&world.cache);
                let range = (FsBlock(piece.0), piece.1);
                world
                    .alloc
                    .free_staged(&mut ctx, &world.log, range, world.sequence)
                    .unwrap();
            }
            for block in piece.0..piece.0 + u64::from(piece.1) {
                world.staged.remove(&block);
                if unstage {
                    world.counts.insert(block, 1);
                }
            }
        }
        Op::Durable => world.log.durable.set(world.sequence),
    }
}

/// `piece` cut at the end of its first block's AG.
fn within_ag(geometry: &Geometry, (start, length): (u64, u32)) -> (u64, u32) {
    let ag = geometry.ag_of(FsBlock(start)).0;
    let ag_end = geometry.ag_start(ag) + u64::from(geometry.ag_len(ag));
    (start, length.min((ag_end - start) as u32))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn refcount_tree_matches_model(ops in proptest::collection::vec(op(), 1..150)) {
        let mut world = World::new();
        for op in &ops {
            run_op(&mut world, op);
            world.check()?;
        }
    }
}

// Checks that thousands of distinct shared runs grow the refcount tree past one level and
// that dropping every share and every mapping frees it all again.
#[test]
fn many_shared_runs_grow_the_tree_and_free_it_all() {
    let mut world = World::new();
    let mut runs = Vec::new();
    while let Some(run) = world.allocate(0, 1) {
        runs.push(run);
        if runs.len() >= 3000 {
            break;
        }
    }
    for (start, _) in &runs {
        world.counts.insert(*start, 1);
    }
    // Every other block shared, so no two records merge.
    for &(start, length) in runs.iter().step_by(2) {
        world.change((start, length), RefcountOp::Increase);
        world.counts.insert(start, 2);
    }
    let mut ctx = CacheContext::new(&world.cache);
    let summary = world.alloc.check_invariants(&mut ctx, AgNumber(0)).unwrap();
    drop(ctx);
    assert!(
        summary.refcount_blocks > 2,
        "the tree did not grow: {summary:?}"
    );
    world.check().unwrap();
    for &(start, length) in &runs {
        let shared = world.counts[&start] == 2;
        world.change((start, length), RefcountOp::Decrease);
        if shared {
            world.change((start, length), RefcountOp::Decrease);
        }
        world.counts.remove(&start);
    }
    world.check().unwrap();
}

// Found by the model test: a change starting where a record ends did not see that record
// (the search began at the record starting at the change), so equal counts stayed unmerged.
#[test]
fn regression_a_record_ending_where_a_change_starts_merges() {
    let mut world = World::new();
    let (start, length) = world.allocate(0, 13).unwrap();
    world
        .counts
        .extend((start..start + u64::from(length)).map(|b| (b, 1)));
    world.change((start, 13), RefcountOp::Increase);
    world.change((start + 12, 1), RefcountOp::Increase);
    for block in start..start + 13 {
        world
            .counts
            .insert(block, if block == start + 12 { 3 } else { 2 });
    }
    world.check().unwrap();
    world.change((start + 12, 1), RefcountOp::Decrease);
    world.counts.insert(start + 12, 2);
    world.check().unwrap();
    let mut ctx = CacheContext::new(&world.cache);
    let ag = world.geometry.ag_of(FsBlock(start));
    let summary = world.alloc.check_invariants(&mut ctx, ag).unwrap();
    assert_eq!(summary.refcount_records.len(), 1);
}
