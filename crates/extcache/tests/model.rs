//! Model-based test: random insert/fill/convert/punch/remove/truncate/pin/lookup/shrink
//! sequences on a few inodes, run against the cache and against a per-block model of the
//! block map. After every step the cache must agree with the map for every block it caches,
//! hold exactly what was cached minus what a shrink may drop, and never drop delayed or pinned
//! entries.

#![allow(
    clippy::unwrap_used,
    clippy::panic,
    reason = "test helpers outside #[test] functions may fail loudly"
)]

use cairn_extcache::{CacheConfig, Extent, ExtentCache, ExtentState, InodeExtents, RangePin};
use proptest::prelude::*;
use std::collections::BTreeSet;

const INODES: usize = 3;
const SPACE: u64 = 48;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    Written(u64),
    Unwritten(u64),
    Delayed,
    Hole,
}

#[derive(Debug, Clone)]
enum Op {
    Lookup {
        inode: usize,
        block: u64,
    },
    Fill {
        inode: usize,
        start: u64,
        count: u64,
    },
    Allocate {
        inode: usize,
        start: u64,
        count: u64,
        unwritten: bool,
        shift: u64,
    },
    Delay {
        inode: usize,
        start: u64,
        count: u64,
    },
    Convert {
        inode: usize,
        start: u64,
        count: u64,
    },
    Punch {
        inode: usize,
        start: u64,
        count: u64,
    },
    Remove {
        inode: usize,
        start: u64,
        count: u64,
    },
    Truncate {
        inode: usize,
        start: u64,
    },
    Pin {
        inode: usize,
        start: u64,
        count: u64,
    },
    Unpin {
        index: usize,
    },
    Shrink {
        nr_to_scan: u32,
    },
    Reopen {
        inode: usize,
    },
}

fn range() -> impl Strategy<Value = (u64, u64)> {
    (0..SPACE).prop_flat_map(|start| (Just(start), 1..=(SPACE - start).min(12)))
}

/// An edit kind that takes an inode and a range.
type RangeOp = fn(usize, u64, u64) -> Op;

fn range_op(kind: RangeOp) -> impl Strategy<Value = Op> {
    (0..INODES, range()).prop_map(move |(inode, (start, count))| kind(inode, start, count))
}

fn op() -> impl Strategy<Value = Op> {
    let inode = 0..INODES;
    let allocate = (inode.clone(), range(), any::<bool>(), 0..3u64).prop_map(
        |(inode, (start, count), unwritten, shift)| Op::Allocate {
            inode,
            start,
            count,
            unwritten,
            shift,
        },
    );
    prop_oneof![
        4 => (inode.clone(), 0..SPACE).prop_map(|(inode, block)| Op::Lookup { inode, block }),
        3 => range_op(|inode, start, count| Op::Fill { inode, start, count }),
        3 => allocate,
        1 => range_op(|inode, start, count| Op::Delay { inode, start, count }),
        2 => range_op(|inode, start, count| Op::Convert { inode, start, count }),
        1 => range_op(|inode, start, count| Op::Punch { inode, start, count }),
        1 => range_op(|inode, start, count| Op::Remove { inode, start, count }),
        1 => (inode.clone(), 0..SPACE).prop_map(|(inode, start)| Op::Truncate { inode, start }),
        1 => range_op(|inode, start, count| Op::Pin { inode, start, count }),
        1 => (0..4usize).prop_map(|index| Op::Unpin { index }),
        2 => (1..40u32).prop_map(|nr_to_scan| Op::Shrink { nr_to_scan }),
        1 => inode.prop_map(|inode| Op::Reopen { inode }),
    ]
}

struct Harness {
    cache: ExtentCache,
    inodes: Vec<InodeExtents>,
    truth: Vec<Vec<Block>>,
    cached: Vec<BTreeSet<u64>>,
    pins: Vec<(usize, u64, u64, RangePin)>,
    lookups: (u64, u64),
}

impl Harness {
    fn new() -> Self {
        let config = CacheConfig {
            inodes_walked_per_call: 4,
            ..CacheConfig::default()
        };
        let cache = ExtentCache::new(config).unwrap();
        let inodes = (0..INODES)
            .map(|ino| cache.open_inode(ino as u64 + 100))
            .collect();
        Harness {
            cache,
            inodes,
            truth: vec![vec![Block::Hole; SPACE as usize]; INODES],
            cached: vec![BTreeSet::new(); INODES],
            pins: Vec::new(),
            lookups: (0, 0),
        }
    }

    fn set_truth(&mut self, inode: usize, start: u64, count: u64, block: impl Fn(u64) -> Block) {
        for b in start..start + count {
            self.truth[inode][b as usize] = block(b - start);
        }
    }

    fn mark_cached(&mut self, inode: usize, start: u64, count: u64, cached: bool) {
        for b in start..start + count {
            if cached {
                self.cached[inode].insert(b);
            } else {
                self.cached[inode].remove(&b);
            }
        }
    }

    /// What the on-disk map says for a range: runs of mapped blocks (delayed ones are not on
    /// disk yet, so they read as holes).
    fn disk_mappings(&self, inode: usize, start: u64, count: u64) -> Vec<Extent> {
        let mut out: Vec<Extent> = Vec::new();
        for b in start..start + count {
            let state = match self.truth[inode][b as usize] {
                Block::Written(p) => ExtentState::Written { physical_block: p },
                Block::Unwritten(p) => ExtentState::Unwritten { physical_block: p },
                Block::Delayed | Block::Hole => continue,
            };
            if let Some(last) = out.last_mut()
                && last.end_block() == b
                && last
                    .state_at(b - 1)
                    .map(|s| s.physical_block().map(|p| p + 1))
                    == Some(state.physical_block())
                && std::mem::discriminant(&last.state) == std::mem::discriminant(&state)
            {
                last.block_count += 1;
                continue;
            }
            out.push(Extent::new(b, 1, state).unwrap());
        }
        out
    }

    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Lookup { inode, block } => {
                let found = self.inodes[inode].lookup(block);
                assert_eq!(
                    found.is_some(),
                    self.cached[inode].contains(&block),
                    "{op:?}"
                );
                if let Some(extent) = found {
                    assert!(extent.contains(block));
                    self.lookups.0 += 1;
                } else {
                    self.lookups.1 += 1;
                }
            }
            Op::Fill {
                inode,
                start,
                count,
            } => {
                let mapped = self.disk_mappings(inode, start, count);
                self.inodes[inode].fill(start, count, &mapped).unwrap();
                self.mark_cached(inode, start, count, true);
            }
            Op::Allocate {
                inode,
                start,
                count,
                unwritten,
                shift,
            } => {
                let physical_block = 1000 + start + shift;
                let state = if unwritten {
                    ExtentState::Unwritten { physical_block }
                } else {
                    ExtentState::Written { physical_block }
                };
                self.inodes[inode]
                    .insert(Extent::new(start, count, state).unwrap())
                    .unwrap();
                let block = |i| {
                    if unwritten {
                        Block::Unwritten(physical_block + i)
                    } else {
                        Block::Written(physical_block + i)
                    }
                };
                self.set_truth(inode, start, count, block);
                self.mark_cached(inode, start, count, true);
            }
            Op::Delay {
                inode,
                start,
                count,
            } => {
                self.inodes[inode]
                    .insert(Extent::new(start, count, ExtentState::Delayed).unwrap())
                    .unwrap();
                self.set_truth(inode, start, count, |_| Block::Delayed);
                self.mark_cached(inode, start, count, true);
            }
            Op::Convert {
                inode,
                start,
                count,
            } => {
                self.inodes[inode].convert_unwritten(start, count).unwrap();
                for b in start..start + count {
                    if let Block::Unwritten(p) = self.truth[inode][b as usize] {
                        self.truth[inode][b as usize] = Block::Written(p);
                    }
                }
            }
            Op::Punch {
                inode,
                start,
                count,
            } => {
                self.inodes[inode]
                    .insert(Extent::new(start, count, ExtentState::Hole).unwrap())
                    .unwrap();
                self.set_truth(inode, start, count, |_| Block::Hole);
                self.mark_cached(inode, start, count, true);
            }
            Op::Remove {
                inode,
                start,
                count,
            } => {
                self.inodes[inode].remove_range(start, count).unwrap();
                self.set_truth(inode, start, count, |_| Block::Hole);
                self.mark_cached(inode, start, count, false);
            }
            Op::Truncate { inode, start } => {
                self.inodes[inode].truncate(start);
                self.set_truth(inode, start, SPACE - start, |_| Block::Hole);
                self.mark_cached(inode, start, SPACE - start, false);
            }
            Op::Pin {
                inode,
                start,
                count,
            } => {
                let pin = self.inodes[inode].pin_range(start, count).unwrap();
                self.pins.push((inode, start, count, pin));
            }
            Op::Unpin { index } => {
                if index < self.pins.len() {
                    self.pins.remove(index);
                }
            }
            Op::Shrink { nr_to_scan } => {
                let outcome = self.cache.shrink(nr_to_scan);
                assert!(outcome.examined <= nr_to_scan);
                assert!(outcome.inodes_walked <= 4);
                for inode in 0..INODES {
                    let actual = self.actual_blocks(inode);
                    assert!(
                        actual.is_subset(&self.cached[inode]),
                        "shrink added entries"
                    );
                    self.cached[inode] = actual;
                }
            }
            Op::Reopen { inode } => {
                self.pins.retain(|pin| pin.0 != inode);
                // Eviction comes after writeback, so no delayed allocation survives it.
                for block in &mut self.truth[inode] {
                    if *block == Block::Delayed {
                        *block = Block::Hole;
                    }
                }
                self.inodes[inode] = self.cache.open_inode(inode as u64 + 100);
                self.cached[inode].clear();
            }
        }
    }

    fn actual_blocks(&self, inode: usize) -> BTreeSet<u64> {
        let extents = self.inodes[inode].cached_extents(0, SPACE).unwrap();
        extents
            .iter()
            .flat_map(|e| e.logical_block..e.end_block())
            .collect()
    }

    fn check(&self) {
        self.cache.check_invariants().unwrap();
        for inode in 0..INODES {
            self.inodes[inode].check_invariants().unwrap();
            for extent in self.inodes[inode].cached_extents(0, SPACE).unwrap() {
                assert!(
                    extent.end_block() <= SPACE,
                    "entry past the space: {extent:?}"
                );
                for b in extent.logical_block..extent.end_block() {
                    let want = match self.truth[inode][b as usize] {
                        Block::Written(p) => ExtentState::Written { physical_block: p },
                        Block::Unwritten(p) => ExtentState::Unwritten { physical_block: p },
                        Block::Delayed => ExtentState::Delayed,
                        Block::Hole => ExtentState::Hole,
                    };
                    assert_eq!(extent.state_at(b), Some(want), "inode {inode} block {b}");
                }
            }
            assert_eq!(
                self.actual_blocks(inode),
                self.cached[inode],
                "inode {inode} cached set"
            );
            for (b, block) in self.truth[inode].iter().enumerate() {
                if *block == Block::Delayed {
                    assert!(
                        self.cached[inode].contains(&(b as u64)),
                        "delayed block {b} dropped"
                    );
                }
            }
        }
        let stats = self.cache.stats();
        assert_eq!((stats.hits, stats.misses), self.lookups);
        let total: u64 = self.inodes.iter().map(|i| i.object_count()).sum();
        assert_eq!(stats.objects, total);
    }

    /// Blocks that must survive a shrink: cached ones under a live pin.
    fn pinned_cached(&self) -> Vec<(usize, u64)> {
        let mut out = Vec::new();
        for (inode, start, count, _) in &self.pins {
            for b in *start..start + count {
                if self.cached[*inode].contains(&b) {
                    out.push((*inode, b));
                }
            }
        }
        out
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn cache_matches_block_map(ops in prop::collection::vec(op(), 1..80)) {
        let mut harness = Harness::new();
        for op in &ops {
            let pinned = harness.pinned_cached();
            harness.apply(op);
            if matches!(op, Op::Shrink { .. }) {
                for (inode, b) in pinned {
                    prop_assert!(harness.cached[inode].contains(&b), "pinned {b} dropped");
                }
            }
            harness.check();
        }
    }
}
