#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Model-based tests of the generic B+tree: random inserts, deletes and updates against a
//! `BTreeMap`, at depths of one to four levels forced by tiny capacity limits.

use std::collections::BTreeMap;
use std::sync::Arc;

use cairn_blockdev::{BlockDevice, MemDevice};
use cairn_btree::{
    BmapCodec, BnoCodec, Btree, Buffers, CacheContext, Lookup, TreeCodec, TreeContext, TreeError,
    TreeSpec,
};
use cairn_bufcache::{BufferCache, CacheConfig};
use cairn_format::{AgBlock, BnoKey, Extent, FreeSpaceRecord, FsBlock, Geometry};
use proptest::prelude::*;

const UUID: [u8; 16] = [7; 16];
const BLOCKS: u64 = 4096;
const ROOT: u64 = 8;

fn geometry() -> Geometry {
    Geometry::new(512, 512, 256, BLOCKS, BLOCKS as u32, 100, 64).unwrap()
}

fn device() -> Arc<dyn BlockDevice> {
    Arc::new(MemDevice::new(BLOCKS * 512, 512))
}

fn cache(device: &Arc<dyn BlockDevice>) -> BufferCache {
    BufferCache::new(CacheConfig::from_geometry(&geometry()), Arc::clone(device)).unwrap()
}

fn pool() -> Vec<FsBlock> {
    (200..BLOCKS).rev().map(FsBlock).collect()
}

fn bno_spec(limit: usize) -> TreeSpec {
    TreeSpec::ag::<BnoCodec>(&geometry(), UUID, 0)
        .unwrap()
        .with_capacity_limit(limit)
        .unwrap()
}

fn record(start: u32, length: u32) -> FreeSpaceRecord {
    FreeSpaceRecord {
        start: AgBlock(start),
        length,
    }
}

fn key(start: u32) -> BnoKey {
    BnoKey {
        start: AgBlock(start),
    }
}

#[derive(Debug, Clone)]
enum Op {
    Insert(u32, u32),
    Delete(u32),
    Update(u32, u32),
    Seek(u32),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (8u32..400, 1u32..50).prop_map(|(k, v)| Op::Insert(k, v)),
        3 => (8u32..400).prop_map(Op::Delete),
        1 => (8u32..400, 1u32..50).prop_map(|(k, v)| Op::Update(k, v)),
        1 => (0u32..420).prop_map(Op::Seek),
    ]
}

/// Checks records, order and a clean verify against the model.
fn check<'c>(
    tree: &Btree<BnoCodec>,
    ctx: &mut CacheContext<'c>,
    model: &BTreeMap<u32, u32>,
) -> Result<(), TestCaseError> {
    let report = tree.verify(ctx);
    prop_assert!(report.is_clean(), "{:?}", report.problems);
    let records = tree.records(ctx).unwrap();
    let expected: Vec<_> = model.iter().map(|(k, v)| record(*k, *v)).collect();
    prop_assert_eq!(records, expected);
    prop_assert_eq!(report.records, model.len() as u64);
    Ok(())
}

fn apply<'c>(
    tree: &mut Btree<BnoCodec>,
    ctx: &mut CacheContext<'c>,
    model: &mut BTreeMap<u32, u32>,
    op: &Op,
) -> Result<(), TestCaseError> {
    match *op {
        Op::Insert(k, v) => {
            let result = tree.insert(ctx, &record(k, v));
            if let std::collections::btree_map::Entry::Vacant(slot) = model.entry(k) {
                result.unwrap();
                slot.insert(v);
            } else {
                let duplicate = matches!(result, Err(TreeError::Duplicate { .. }));
                prop_assert!(duplicate);
            }
        }
        Op::Delete(k) => match model.remove(&k) {
            Some(v) => prop_assert_eq!(tree.delete(ctx, &key(k)).unwrap(), record(k, v)),
            None => {
                let missing = matches!(tree.delete(ctx, &key(k)), Err(TreeError::NotFound { .. }));
                prop_assert!(missing);
            }
        },
        Op::Update(k, v) => match model.get_mut(&k) {
            Some(old) => {
                tree.update(ctx, &key(k), &record(k, v)).unwrap();
                *old = v;
            }
            None => prop_assert!(tree.update(ctx, &key(k), &record(k, v)).is_err()),
        },
        Op::Seek(k) => check_seeks(tree, ctx, model, k)?,
    }
    Ok(())
}

fn check_seeks<'c>(
    tree: &Btree<BnoCodec>,
    ctx: &mut CacheContext<'c>,
    model: &BTreeMap<u32, u32>,
    k: u32,
) -> Result<(), TestCaseError> {
    let mut found = |mode| {
        let cursor = tree.lookup(ctx, &key(k), mode).unwrap();
        cursor.map(|c| tree.record(ctx, &c).unwrap().start.0)
    };
    prop_assert_eq!(found(Lookup::Eq), model.contains_key(&k).then_some(k));
    prop_assert_eq!(
        found(Lookup::Le),
        model.range(..=k).next_back().map(|(k, _)| *k)
    );
    prop_assert_eq!(found(Lookup::Ge), model.range(k..).next().map(|(k, _)| *k));
    Ok(())
}

/// Runs `ops` on a fresh tree, checking after every step, then re-reads it from the device.
fn run(limit: usize, ops: &[Op]) -> Result<u32, TestCaseError> {
    let device = device();
    let cache = cache(&device);
    let mut ctx = CacheContext::with_pool(&cache, pool());
    let mut tree = Btree::<BnoCodec>::create(&mut ctx, bno_spec(limit), ROOT).unwrap();
    let mut model = BTreeMap::new();
    let mut levels_max = 1;
    for op in ops {
        apply(&mut tree, &mut ctx, &mut model, op)?;
        check(&tree, &mut ctx, &model)?;
        levels_max = levels_max.max(tree.levels());
        let tree_blocks = tree.verify(&mut ctx).blocks as usize;
        prop_assert_eq!(
            tree_blocks + ctx.pool().len() + ctx.freed().len(),
            pool().len() + 1
        );
        ctx.recycle_freed();
    }
    ctx.release_all();
    cache.flush_delwri().unwrap();
    let reread = self::cache(&device);
    let mut ctx = CacheContext::new(&reread);
    let again = Btree::<BnoCodec>::open(bno_spec(limit), tree.root(), tree.levels()).unwrap();
    check(&again, &mut ctx, &model)?;
    Ok(levels_max)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn tree_matches_model(limit in 4usize..9, ops in proptest::collection::vec(op(), 1..250)) {
        run(limit, &ops)?;
    }
}

// Checks that ascending inserts then deletes from both ends reach four levels and shrink
// back to an empty root leaf, verifying after every step.
#[test]
fn grows_to_four_levels_and_back() {
    let mut ops: Vec<Op> = (0..120).map(|i| Op::Insert(8 + i * 3, 1)).collect();
    ops.extend((0..60).map(|i| Op::Delete(8 + i * 3)));
    ops.extend((60..120).rev().map(|i| Op::Delete(8 + i * 3)));
    let levels_max = run(4, &ops).unwrap();
    assert!(levels_max >= 4, "reached only {levels_max} levels");
}

// Checks a file-extent tree: 8-byte pointers, filesystem-block addressing, cursor stepping.
#[test]
fn wide_pointer_tree_steps_both_ways() {
    let device = device();
    let cache = cache(&device);
    let mut ctx = CacheContext::with_pool(&cache, pool());
    let spec = TreeSpec::file::<BmapCodec>(&geometry(), UUID, 1234)
        .unwrap()
        .with_capacity_limit(4)
        .unwrap();
    let mut tree = Btree::<BmapCodec>::create(&mut ctx, spec, 150).unwrap();
    for i in (0..60u64).rev() {
        let extent = Extent::new(i * 10, FsBlock(1000 + i), 5, false).unwrap();
        tree.insert(&mut ctx, &extent).unwrap();
    }
    assert!(tree.levels() >= 3);
    assert!(tree.verify(&mut ctx).is_clean());
    let mut cursor = tree.first(&mut ctx).unwrap().unwrap();
    let mut seen = vec![tree.record(&mut ctx, &cursor).unwrap().file_block];
    while tree.next(&mut ctx, &mut cursor).unwrap() {
        seen.push(tree.record(&mut ctx, &cursor).unwrap().file_block);
    }
    assert_eq!(seen, (0..60).map(|i| i * 10).collect::<Vec<_>>());
    let mut back = Vec::new();
    let mut cursor = tree.last(&mut ctx).unwrap().unwrap();
    loop {
        back.push(tree.record(&mut ctx, &cursor).unwrap().file_block);
        if !tree.prev(&mut ctx, &mut cursor).unwrap() {
            break;
        }
    }
    back.reverse();
    assert_eq!(back, seen);
    assert_eq!(
        <BmapCodec as TreeCodec>::KIND.name(),
        "file extent tree block"
    );
}

// Checks update_at: a key may move within its gap but not past a neighbour.
#[test]
fn update_keeps_order() {
    let device = device();
    let cache = cache(&device);
    let mut ctx = CacheContext::with_pool(&cache, pool());
    let mut tree = Btree::<BnoCodec>::create(&mut ctx, bno_spec(4), ROOT).unwrap();
    for k in [10, 20, 30, 40, 50, 60, 70] {
        tree.insert(&mut ctx, &record(k, 2)).unwrap();
    }
    let cursor = tree
        .lookup(&mut ctx, &key(40), Lookup::Eq)
        .unwrap()
        .unwrap();
    tree.update_at(&mut ctx, &cursor, &record(35, 7)).unwrap();
    assert!(tree.verify(&mut ctx).is_clean());
    let cursor = tree
        .lookup(&mut ctx, &key(35), Lookup::Eq)
        .unwrap()
        .unwrap();
    let moved = tree.update_at(&mut ctx, &cursor, &record(30, 1));
    assert!(matches!(moved, Err(TreeError::OutOfOrder { .. })));
    let moved = tree.update_at(&mut ctx, &cursor, &record(55, 1));
    assert!(matches!(moved, Err(TreeError::OutOfOrder { .. })));
    assert_eq!(tree.get(&mut ctx, &key(35)).unwrap(), Some(record(35, 7)));
}

// Checks that a corrupt block on disk comes back as errors naming it, from verify and from
// lookups, and that a block pool running dry is an error, not a panic.
#[test]
fn corruption_and_exhaustion_are_errors() {
    let device = device();
    let cache = cache(&device);
    let mut ctx = CacheContext::with_pool(&cache, pool());
    let mut tree = Btree::<BnoCodec>::create(&mut ctx, bno_spec(4), ROOT).unwrap();
    for k in 0..40 {
        tree.insert(&mut ctx, &record(10 + k * 2, 1)).unwrap();
    }
    let leaf = FsBlock(
        tree.spec().base
            + tree
                .lookup(&mut ctx, &key(50), Lookup::Eq)
                .unwrap()
                .unwrap()
                .position()
                .0,
    );
    ctx.release_all();
    cache.flush_delwri().unwrap();
    let mut raw = cairn_blockdev::AlignedBuf::zeroed(512);
    device.read_at(leaf.0 * 512, &mut raw).unwrap();
    raw[100] ^= 0xff;
    device.write_at(leaf.0 * 512, &raw).unwrap();
    let reread = self::cache(&device);
    let mut ctx = CacheContext::new(&reread);
    let report = tree.verify(&mut ctx);
    assert!(
        report.problems.iter().any(|p| p.block == leaf.0),
        "{:?}",
        report.problems
    );
    let error = tree.lookup(&mut ctx, &key(50), Lookup::Eq).unwrap_err();
    assert!(error.to_string().contains(&leaf.0.to_string()), "{error}");
    let mut empty = CacheContext::new(&reread);
    let mut small = Btree::<BnoCodec>::create(&mut empty, bno_spec(4), 170).unwrap();
    let mut outcome = Ok(());
    for k in 0..10 {
        outcome = outcome.and_then(|()| small.insert(&mut empty, &record(10 + k, 1)));
    }
    assert!(matches!(outcome, Err(TreeError::NoSpace { .. })));
    assert!(empty.allocate_block().is_err());
    empty
        .invalidate(FsBlock(170), &small.spec().read_spec)
        .unwrap();
}

// Inserts with a pool of a few blocks until one insert finds no block for its splits: that
// insert fails with NoSpace and changes nothing (every earlier record is found, the tree
// verifies clean, the blocks it took are handed back), whatever level the splits reached.
// A split that ran out of blocks half way used to leave a leaf split with no parent entry.
#[test]
fn insert_without_blocks_for_its_splits_changes_nothing() {
    for blocks in 1..8 {
        let device = device();
        let cache = cache(&device);
        let mut ctx = CacheContext::with_pool(&cache, pool()[..blocks].to_vec());
        let mut tree = Btree::<BnoCodec>::create(&mut ctx, bno_spec(4), ROOT).unwrap();
        let mut inserted = Vec::new();
        let failed = (0..1000).find_map(|k| {
            let made = tree.insert(&mut ctx, &record(10 + k * 2, 1));
            made.map(|()| inserted.push(10 + k * 2))
                .err()
                .map(|e| (k, e))
        });
        let (k, error) = failed.expect("the pool never ran dry");
        assert!(matches!(error, TreeError::NoSpace { .. }), "{error}");
        assert!(tree.verify(&mut ctx).problems.is_empty(), "{blocks} blocks");
        for start in &inserted {
            assert_eq!(
                tree.get(&mut ctx, &key(*start)).unwrap(),
                Some(record(*start, 1))
            );
        }
        assert_eq!(tree.get(&mut ctx, &key(10 + k * 2)).unwrap(), None);
        let tree_blocks = tree.verify(&mut ctx).blocks as usize;
        assert_eq!(
            tree_blocks + ctx.pool().len() + ctx.freed().len(),
            blocks + 1
        );
    }
}
