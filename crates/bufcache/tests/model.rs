//! Model-based test: random interleavings of several actors' get / create / modify / release /
//! stale / pin / delwri / flush / reclaim / read-ahead steps, run on the cache and on a plain
//! map model.
//! Every lookup must return the model's contents (so never stale or another block's data).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;

use cairn_bufcache::{
    BufCacheError, BufGuard, BufHandle, BufKey, BufferCache, BufferOps, ReadSpec,
};
use cairn_format::{FormatError, FsBlock, Lsn};
use common::*;
use proptest::prelude::*;

#[derive(Debug)]
struct RawOps;

impl BufferOps for RawOps {
    fn name(&self) -> &'static str {
        "raw test block"
    }
    fn verify_read(&self, _: &[u8], _: FsBlock, _: &ReadSpec) -> Result<(), FormatError> {
        Ok(())
    }
    fn prepare_write(&self, _: &mut [u8], _: FsBlock, _: Option<Lsn>) -> Result<(), FormatError> {
        Ok(())
    }
}

static RAW: RawOps = RawOps;

/// Start blocks exercised: slot collisions at 37 slots (0/37, 1/38) and several AGs.
const BLOCKS: [u64; 8] = [0, 1, 37, 38, 64, 65, 101, 130];
const ACTORS: usize = 3;

#[derive(Debug, Clone)]
enum Op {
    Get {
        actor: usize,
        block: usize,
        two: bool,
    },
    Create {
        actor: usize,
        block: usize,
        two: bool,
    },
    Modify {
        actor: usize,
        guard: usize,
        offset: usize,
        byte: u8,
    },
    Release {
        actor: usize,
        guard: usize,
    },
    MarkStale {
        actor: usize,
        guard: usize,
    },
    Queue {
        actor: usize,
        guard: usize,
    },
    Pin {
        actor: usize,
        guard: usize,
    },
    Unpin {
        handle: usize,
    },
    Flush,
    Reclaim,
    ReadAhead {
        block: usize,
        count: u32,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let actor = 0..ACTORS;
    prop_oneof![
        4 => (actor.clone(), 0..BLOCKS.len(), prop::bool::weighted(0.2))
            .prop_map(|(actor, block, two)| Op::Get { actor, block, two }),
        1 => (actor.clone(), 0..BLOCKS.len(), prop::bool::weighted(0.2))
            .prop_map(|(actor, block, two)| Op::Create { actor, block, two }),
        3 => (actor.clone(), 0..4usize, 0..1020usize, any::<u8>())
            .prop_map(|(actor, guard, offset, byte)| Op::Modify { actor, guard, offset, byte }),
        4 => (actor.clone(), 0..4usize).prop_map(|(actor, guard)| Op::Release { actor, guard }),
        1 => (actor.clone(), 0..4usize).prop_map(|(actor, guard)| Op::MarkStale { actor, guard }),
        2 => (actor.clone(), 0..4usize).prop_map(|(actor, guard)| Op::Queue { actor, guard }),
        1 => (actor, 0..4usize).prop_map(|(actor, guard)| Op::Pin { actor, guard }),
        1 => (0..4usize).prop_map(|handle| Op::Unpin { handle }),
        1 => Just(Op::Flush),
        1 => Just(Op::Reclaim),
        2 => (0..BLOCKS.len(), 1..4u32).prop_map(|(block, count)| Op::ReadAhead { block, count }),
    ]
}

/// The model of one buffer (live in the index, or detached after stale replacement/reclaim).
#[derive(Debug)]
struct Entry {
    key: BufKey,
    data: Vec<u8>,
    dirty: bool,
    stale: bool,
    dead: bool,
    pins: u32,
    queued: bool,
    holder: Option<usize>,
}

struct World<'c> {
    cache: &'c BufferCache,
    disk: Vec<u8>,
    entries: Vec<Entry>,
    /// Index model: key -> entry id of buffers in the cache.
    cached: BTreeMap<BufKey, usize>,
    queue: Vec<usize>,
    guards: Vec<Vec<(usize, BufGuard<'c>)>>,
    handles: Vec<(usize, BufHandle)>,
}

fn byte_range(key: BufKey) -> std::ops::Range<usize> {
    let bs = BLOCK_SIZE as usize;
    key.block.0 as usize * bs..key.end() as usize * bs
}

impl<'c> World<'c> {
    /// Drops stale entries at `key`'s start block; returns a live entry there, if any.
    fn live_at(&mut self, key: BufKey) -> Option<usize> {
        let at: Vec<(BufKey, usize)> = self
            .cached
            .iter()
            .filter(|(k, _)| k.block == key.block)
            .map(|(k, id)| (*k, *id))
            .collect();
        let mut live = None;
        for (k, id) in at {
            if self.entries[id].stale {
                self.entries[id].dead = true;
                self.cached.remove(&k);
            } else {
                live = Some(id);
            }
        }
        live
    }

    /// A new clean entry for `key` with the disk's contents, in the index model.
    fn cache_from_disk(&mut self, key: BufKey) -> usize {
        self.entries.push(Entry {
            key,
            data: self.disk[byte_range(key)].to_vec(),
            dirty: false,
            stale: false,
            dead: false,
            pins: 0,
            queued: false,
            holder: None,
        });
        self.cached.insert(key, self.entries.len() - 1);
        self.entries.len() - 1
    }

    fn lookup(&mut self, actor: usize, key: BufKey, create: bool) {
        let spec = ReadSpec::new(&RAW, UUID);
        let live = self.live_at(key);
        match live {
            Some(id) if self.entries[id].key != key => {
                let result = self.cache.try_get(key, &spec);
                assert!(
                    matches!(result, Err(BufCacheError::LengthMismatch { .. })),
                    "{key:?}: {result:?}"
                );
                return;
            }
            Some(id) if self.entries[id].holder.is_some() => {
                let result = if create {
                    self.cache.try_get_new(key, &spec)
                } else {
                    self.cache.try_get(key, &spec)
                };
                assert!(
                    matches!(result, Err(BufCacheError::WouldBlock { .. })),
                    "{key:?}: {result:?}"
                );
                return;
            }
            _ => {}
        }
        // The model knows nobody holds the buffer, so the non-waiting lookups must succeed: a
        // wrong buffer handed out (say, one this test holds) fails here instead of deadlocking.
        let result = if create {
            self.cache.try_get_new(key, &spec)
        } else {
            self.cache.try_get(key, &spec)
        };
        let guard = match result {
            Ok(guard) => guard,
            Err(error) => panic!("lookup of {key:?}: {error}"),
        };
        assert_eq!(guard.key(), key, "lookup returned another buffer");
        let id = match live {
            Some(id) => id,
            None => self.cache_from_disk(key),
        };
        let entry = &mut self.entries[id];
        if create {
            entry.data.iter_mut().for_each(|b| *b = 0);
        }
        assert_eq!(&guard[..], &entry.data[..], "contents of {key:?}");
        assert!(!guard.is_stale());
        entry.holder = Some(actor);
        self.guards[actor].push((id, guard));
    }

    fn with_guard(&mut self, actor: usize, index: usize) -> Option<usize> {
        let held = &self.guards[actor];
        (!held.is_empty()).then(|| index % held.len())
    }

    fn step(&mut self, op: &Op) {
        match *op {
            Op::Get { actor, block, two } | Op::Create { actor, block, two } => {
                let key = BufKey::new(FsBlock(BLOCKS[block]), if two { 2 } else { 1 });
                self.lookup(actor, key, matches!(op, Op::Create { .. }));
            }
            Op::Modify {
                actor,
                guard,
                offset,
                byte,
            } => {
                let Some(i) = self.with_guard(actor, guard) else {
                    return;
                };
                let (id, guard) = &mut self.guards[actor][i];
                let entry = &mut self.entries[*id];
                let offset = offset % (entry.data.len() - 4);
                guard.write(offset, &[byte; 4]).unwrap();
                entry.data[offset..offset + 4].fill(byte);
                entry.dirty |= !entry.stale;
                assert_eq!(guard.is_dirty(), entry.dirty);
            }
            Op::Release { actor, guard } => {
                let Some(i) = self.with_guard(actor, guard) else {
                    return;
                };
                let (id, _) = self.guards[actor].swap_remove(i);
                self.entries[id].holder = None;
            }
            Op::MarkStale { actor, guard } => {
                let Some(i) = self.with_guard(actor, guard) else {
                    return;
                };
                let (id, guard) = &mut self.guards[actor][i];
                guard.mark_stale();
                self.entries[*id].stale = true;
                self.entries[*id].dirty = false;
            }
            Op::Queue { actor, guard } => {
                let Some(i) = self.with_guard(actor, guard) else {
                    return;
                };
                let (id, guard) = &self.guards[actor][i];
                let fresh = guard.queue_delwri();
                assert_eq!(fresh, !self.entries[*id].queued);
                if fresh {
                    self.entries[*id].queued = true;
                    self.queue.push(*id);
                }
            }
            Op::Pin { actor, guard } => {
                let Some(i) = self.with_guard(actor, guard) else {
                    return;
                };
                let (id, guard) = &self.guards[actor][i];
                guard.pin();
                self.entries[*id].pins += 1;
                self.handles.push((*id, guard.handle()));
            }
            Op::Unpin { handle } => {
                if self.handles.is_empty() {
                    return;
                }
                let (id, handle) = self.handles.swap_remove(handle % self.handles.len());
                handle.unpin().unwrap();
                self.entries[id].pins -= 1;
            }
            Op::Flush => self.flush(),
            Op::Reclaim => self.reclaim(),
            Op::ReadAhead { block, count } => self.read_ahead(BLOCKS[block], count),
        }
    }

    /// Read-ahead caches, from the disk, each block of a range inside one AG at which no live
    /// buffer starts (a held or longer one included), as a lookup of it would.
    fn read_ahead(&mut self, first: u64, count: u32) {
        let spec = ReadSpec::new(&RAW, UUID);
        let cached = self
            .cache
            .read_ahead(BufKey::new(FsBlock(first), count), &spec);
        let last = first + u64::from(count) - 1;
        let in_one_ag = first / u64::from(AG_BLOCKS) == last / u64::from(AG_BLOCKS)
            && last < u64::from(AG_BLOCKS * AG_COUNT);
        let mut expected = 0;
        for block in (first..=last).filter(|_| in_one_ag) {
            let key = BufKey::single(block);
            if self.live_at(key).is_some() {
                continue;
            }
            self.cache_from_disk(key);
            expected += 1;
        }
        assert_eq!(cached, expected, "blocks read ahead at {first}+{count}");
    }

    fn flush(&mut self) {
        let report = self.cache.flush_delwri().unwrap();
        let mut order = std::mem::take(&mut self.queue);
        order.sort_by_key(|id| self.entries[*id].key);
        let (mut written, mut pinned, mut busy) = (0, Vec::new(), Vec::new());
        for id in order {
            let entry = &mut self.entries[id];
            entry.queued = false;
            if entry.holder.is_some() {
                busy.push(entry.key);
            } else if entry.dead || entry.stale || !entry.dirty {
                continue;
            } else if entry.pins > 0 {
                pinned.push(entry.key);
            } else {
                self.disk[byte_range(entry.key)].copy_from_slice(&entry.data);
                entry.dirty = false;
                written += 1;
                continue;
            }
            entry.queued = true;
            self.queue.push(id);
        }
        assert_eq!(report.buffers_written, written);
        assert_eq!(report.pinned, pinned);
        assert_eq!(report.busy, busy);
    }

    fn reclaim(&mut self) {
        self.cache.reclaim(u64::MAX);
        let entries = &mut self.entries;
        self.cached.retain(|_, id| {
            let e = &mut entries[*id];
            let keep = e.holder.is_some() || e.dirty || e.pins > 0;
            e.dead |= !keep;
            keep
        });
    }
}

fn run(slots: u32, ops: &[Op]) {
    let device = formatted_device();
    let cache = cache_on(&device, config().with_lookaside_slots(slots));
    let mut world = World {
        cache: &cache,
        disk: device.snapshot(),
        entries: Vec::new(),
        cached: BTreeMap::new(),
        queue: Vec::new(),
        guards: (0..ACTORS).map(|_| Vec::new()).collect(),
        handles: Vec::new(),
    };
    for op in ops {
        world.step(op);
        cache.check_invariants().unwrap();
        assert_eq!(cache.cached_count(), world.cached.len(), "after {op:?}");
    }
    // Release everything, unpin, write back, and compare the disk with the model's.
    world.guards.iter_mut().for_each(Vec::clear);
    world.entries.iter_mut().for_each(|e| e.holder = None);
    for (id, handle) in world.handles.drain(..) {
        handle.unpin().unwrap();
        world.entries[id].pins -= 1;
    }
    world.flush();
    let disk = device.snapshot();
    for (i, (got, want)) in disk.iter().zip(&world.disk).enumerate() {
        assert_eq!(
            got,
            want,
            "disk byte {i} (block {})",
            i / BLOCK_SIZE as usize
        );
    }
    cache.check_invariants().unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn cache_matches_model(
        slots in prop_oneof![Just(0u32), Just(1), Just(3), Just(37)],
        ops in proptest::collection::vec(op(), 1..80),
    ) {
        run(slots, &ops);
    }
}

// Regression-style fixed sequence: stale one-block buffer replaced by a two-block lookup while
// a slot still named it, then flushed and reclaimed.
#[test]
fn stale_then_longer_lookup_then_flush() {
    let ops = [
        Op::Get {
            actor: 0,
            block: 2,
            two: false,
        },
        Op::Modify {
            actor: 0,
            guard: 0,
            offset: 10,
            byte: 9,
        },
        Op::Queue { actor: 0, guard: 0 },
        Op::MarkStale { actor: 0, guard: 0 },
        Op::Get {
            actor: 1,
            block: 2,
            two: true,
        },
        Op::Modify {
            actor: 1,
            guard: 0,
            offset: 600,
            byte: 3,
        },
        Op::Queue { actor: 1, guard: 0 },
        Op::Release { actor: 1, guard: 0 },
        Op::Flush,
        Op::Release { actor: 0, guard: 0 },
        Op::Reclaim,
        Op::Get {
            actor: 2,
            block: 2,
            two: true,
        },
    ];
    run(37, &ops);
}
