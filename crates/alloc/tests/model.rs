#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Model-based tests of the allocator: random allocations (all modes) and frees against an
//! interval-set model of the blocks handed out, checking every invariant after every step.

mod support;

use std::collections::BTreeMap;

use cairn_alloc::{Allocation, Allocator, Mode, Request};
use cairn_btree::CacheContext;
use cairn_bufcache::BufferCache;
use cairn_format::{AgNumber, FsBlock, Geometry};
use proptest::prelude::*;
use support::{TestLog, allocator, cache, formatted};

#[derive(Debug, Clone)]
enum Op {
    Alloc {
        mode: Mode,
        target: u64,
        min_len: u32,
        extra: u32,
        alignment: u32,
        len_multiple: u32,
    },
    /// Frees part of an outstanding allocation: (which, offset fraction, length fraction).
    Free(usize, u32, u32),
    Durable,
}

fn op() -> impl Strategy<Value = Op> {
    let mode = prop_oneof![4 => Just(Mode::Near), 1 => Just(Mode::Size), 1 => Just(Mode::Exact)];
    let alloc = (mode, any::<u64>(), 1u32..24, 0u32..40, 0usize..3, 0usize..2).prop_map(
        |(mode, target, min_len, extra, a, m)| Op::Alloc {
            mode,
            target,
            min_len,
            extra,
            alignment: [1, 4, 16][a],
            len_multiple: [1, 2][m],
        },
    );
    prop_oneof![
        5 => alloc,
        4 => (any::<usize>(), 0u32..100, 1u32..101).prop_map(|(i, o, l)| Op::Free(i, o, l)),
        1 => Just(Op::Durable),
    ]
}

/// The world of one run: device, cache, allocator, log and the blocks handed out.
struct World {
    geometry: Geometry,
    cache: BufferCache,
    alloc: Allocator,
    log: TestLog,
    /// Handed-out extents: fs start -> length.
    used: BTreeMap<u64, u32>,
    sequence: u64,
    /// Blocks the allocator owns per AG at the start (free + free list + tree blocks).
    owned: Vec<u64>,
}

impl World {
    fn new() -> World {
        let (device, geometry) = formatted(8 << 20, 512, 2);
        let cache = cache(&device, &geometry);
        let alloc = allocator(&geometry);
        let mut world = World {
            geometry,
            cache,
            alloc,
            log: TestLog::default(),
            used: BTreeMap::new(),
            sequence: 1,
            owned: Vec::new(),
        };
        world.owned = (0..2).map(|ag| world.owned_now(ag)).collect();
        world
    }

    fn owned_now(&self, ag: u32) -> u64 {
        let mut ctx = CacheContext::new(&self.cache);
        let s = self.alloc.check_invariants(&mut ctx, AgNumber(ag)).unwrap();
        u64::from(s.free_blocks) + s.free_list.len() as u64 + s.tree_blocks
    }

    fn allocate(&mut self, request: &Request) -> Option<Allocation> {
        let mut ctx = CacheContext::new(&self.cache);
        self.alloc.allocate(&mut ctx, &self.log, request).unwrap()
    }

    fn overlaps_used(&self, start: u64, length: u32) -> bool {
        let end = start + u64::from(length);
        self.used
            .range(..end)
            .next_back()
            .is_some_and(|(s, l)| s + u64::from(*l) > start)
    }

    fn check(&self) -> Result<(), TestCaseError> {
        for ag in 0..2u32 {
            let mut ctx = CacheContext::new(&self.cache);
            let summary = self.alloc.check_invariants(&mut ctx, AgNumber(ag)).unwrap();
            drop(ctx);
            let base = self.geometry.ag_start(ag);
            for (start, length) in &summary.extents {
                prop_assert!(!self.overlaps_used(base + u64::from(*start), *length));
            }
            for block in &summary.free_list {
                prop_assert!(!self.overlaps_used(base + u64::from(*block), 1));
            }
            let handed: u64 = self
                .used
                .iter()
                .filter(|(s, _)| self.geometry.ag_of(FsBlock(**s)).0 == ag)
                .map(|(_, l)| u64::from(*l))
                .sum();
            prop_assert_eq!(self.owned_now(ag) + handed, self.owned[ag as usize]);
        }
        Ok(())
    }
}

fn run_alloc(world: &mut World, op: &Op) -> Result<(), TestCaseError> {
    let Op::Alloc {
        mode,
        target,
        min_len,
        extra,
        alignment,
        len_multiple,
    } = *op
    else {
        return Ok(());
    };
    let target = FsBlock(target % world.geometry.block_count);
    let min_len = min_len.next_multiple_of(len_multiple);
    let request = Request::near(target, min_len, min_len + extra)
        .with_mode(mode)
        .with_alignment(alignment, len_multiple);
    let busy_before = world.alloc.busy_extents(world.geometry.ag_of(target));
    let Some(got) = world.allocate(&request) else {
        return Ok(());
    };
    prop_assert!(got.length >= request.min_len && got.length <= request.max_len);
    prop_assert_eq!(got.length % len_multiple, 0);
    prop_assert_eq!(got.start % alignment, 0);
    prop_assert!(
        !world.overlaps_used(got.fs_start.0, got.length),
        "handed out twice"
    );
    if mode == Mode::Exact {
        prop_assert_eq!(got.fs_start, target);
    }
    let durable = world.log.durable.get();
    if got.ag == world.geometry.ag_of(target) {
        for busy in busy_before.iter().filter(|b| b.sequence > durable) {
            let apart =
                busy.start + busy.length <= got.start || got.start + got.length <= busy.start;
            prop_assert!(apart, "busy range {:?} reused by {:?}", busy, got);
        }
    }
    world.used.insert(got.fs_start.0, got.length);
    Ok(())
}

fn run_free(world: &mut World, which: usize, offset: u32, length: u32) {
    if world.used.is_empty() {
        return;
    }
    let (start, total) = world
        .used
        .iter()
        .nth(which % world.used.len())
        .map(|(s, l)| (*s, *l))
        .unwrap();
    let skip = total * offset / 100 % total;
    let count = (total - skip).min((total * length).div_ceil(100)).max(1);
    world.used.remove(&start);
    if skip > 0 {
        world.used.insert(start, skip);
    }
    if skip + count < total {
        world
            .used
            .insert(start + u64::from(skip + count), total - skip - count);
    }
    world.sequence += 1;
    let mut ctx = CacheContext::new(&world.cache);
    let at = FsBlock(start + u64::from(skip));
    world
        .alloc
        .free(&mut ctx, &world.log, at, count, world.sequence)
        .unwrap();
}

fn run(ops: &[Op]) -> Result<World, TestCaseError> {
    let mut world = World::new();
    for op in ops {
        match *op {
            Op::Alloc { .. } => run_alloc(&mut world, op)?,
            Op::Free(which, offset, length) => run_free(&mut world, which, offset, length),
            Op::Durable => world.log.durable.set(world.sequence),
        }
        world.check()?;
    }
    Ok(world)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn allocator_matches_model(ops in proptest::collection::vec(op(), 1..120)) {
        run(&ops)?;
    }
}

// Checks that many small allocations and frees grow and shrink the trees past one level,
// that flushing and re-reading gives the same free space, and that exhaustion is `None`.
#[test]
fn fragmentation_grows_trees_and_survives_reread() {
    let (device, geometry) = formatted(8 << 20, 512, 2);
    let cache = cache(&device, &geometry);
    let alloc = allocator(&geometry);
    let log = TestLog::default();
    let mut pieces = Vec::new();
    let mut ctx = CacheContext::new(&cache);
    while let Some(got) = alloc
        .allocate(
            &mut ctx,
            &log,
            &Request::near(FsBlock(0), 1, 1).with_mode(Mode::Size),
        )
        .unwrap()
    {
        pieces.push(got);
        if pieces.len() > 7000 {
            break;
        }
    }
    assert!(pieces.len() > 1000);
    for (index, piece) in pieces.iter().enumerate().filter(|(i, _)| i % 2 == 0) {
        alloc
            .free(&mut ctx, &log, piece.fs_start, 1, index as u64 + 1)
            .unwrap();
    }
    let summary = alloc.check_invariants(&mut ctx, AgNumber(0)).unwrap();
    assert!(summary.tree_blocks > 4, "trees did not grow: {summary:?}");
    ctx.release_all();
    cache.flush_delwri().unwrap();
    let reread = self::cache(&device, &geometry);
    let mut ctx = CacheContext::new(&reread);
    let fresh = allocator(&geometry);
    let again = fresh.check_invariants(&mut ctx, AgNumber(0)).unwrap();
    assert_eq!(again.extents, summary.extents);
}

// Checks that busy ranges are skipped while other space fits, and that the log is forced only
// when nothing else fits.
#[test]
fn busy_extents_force_the_log_only_when_needed() {
    let (device, geometry) = formatted(8 << 20, 512, 2);
    let cache = cache(&device, &geometry);
    let alloc = allocator(&geometry);
    let log = TestLog::default();
    let mut ctx = CacheContext::new(&cache);
    let whole = alloc
        .check_invariants(&mut ctx, AgNumber(1))
        .unwrap()
        .longest_free;
    let target = FsBlock(geometry.ag_start(1));
    let everything = Request::near(target, 1, whole).with_min_left(0);
    let big = alloc
        .allocate(&mut ctx, &log, &everything)
        .unwrap()
        .unwrap();
    alloc.free(&mut ctx, &log, big.fs_start, 64, 7).unwrap();
    let small = Request::near(big.fs_start, 8, 8).with_mode(Mode::Near);
    let forced_before = log.forces.get();
    let got = alloc.allocate(&mut ctx, &log, &small).unwrap().unwrap();
    assert_eq!(got.fs_start, big.fs_start, "only the busy range is free");
    assert_eq!(log.forces.get(), forced_before + 1);
    assert!(alloc.stats().log_forces >= 1);
    alloc.free(&mut ctx, &log, got.fs_start, 8, 9).unwrap();
    alloc.check_invariants(&mut ctx, AgNumber(1)).unwrap();
    let exact = Request::near(got.fs_start, 4, 4).with_mode(Mode::Exact);
    let again = alloc.allocate(&mut ctx, &log, &exact).unwrap().unwrap();
    assert_eq!(again.fs_start, got.fs_start);
    assert_eq!(log.forces.get(), forced_before + 2);
}
