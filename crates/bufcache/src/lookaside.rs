//! The lookaside slots: per thread, per cache, per AG, direct-mapped (AG block % slot count),
//! in front of the AG's index.
//!
//! Why per thread: a slot shared by all threads must be read under the AG's lock or through
//! an atomic `Arc` load, and both cost a shared atomic read-modify-write, about as much as the
//! index search the slot saves (measured, `docs/benchmarks.md`). A thread's own slots are plain
//! memory: finding a buffer there is a thread-local access and a key compare.
//!
//! Why a slot can never hand out a wrong buffer, however old it is: a hit must match block and
//! length (a buffer's key never changes), and it then takes its hold exactly as an index hit
//! does: the hold's previous state must have neither `STALE` nor `DEAD`. Every removal from the
//! index sets `DEAD` first, reclaim cannot kill a held buffer (both change the state word), and
//! the lookup re-checks `STALE` and up-to-date under the buffer lock. So a slot naming a
//! reclaimed, invalidated or replaced buffer misses at once, and correctness never depends on
//! the slots being current.
//!
//! Releasing memory (a slot owns an `Arc`, so it keeps a dead buffer's memory): each AG has a
//! generation, bumped under the AG's write lock after every removal from the index and every
//! stale marking. A thread's AG table remembers the generation it last swept at; its next
//! lookup in that AG that sees a newer one first drops every stale or dead occupant. The
//! thread that removes or invalidates a buffer also clears its own slot at once. So only a
//! thread that has not looked in an AG since keeps dead buffers of it: at most slot count x
//! AGs buffers per thread and cache. A thread keeps tables for at most `CACHES_PER_THREAD`
//! caches, drops the tables of dropped caches when it makes a new one, and a cache being
//! dropped clears the dropping thread's table.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use crate::buffer::{BufKey, Buffer, DEAD, STALE};
use crate::config::LOOKASIDE_REPLACE_AFTER;
use crate::stats::{Counter, Stats};

/// Caches a thread keeps slot tables for; the least recently used one goes first.
const CACHES_PER_THREAD: usize = 8;

/// Cache ids, never reused, so a table left by a dropped cache never matches a new one.
static NEXT_CACHE_ID: AtomicU64 = AtomicU64::new(1);

/// The key of an empty slot: no lookup asks for 0 blocks.
const EMPTY_KEY: BufKey = BufKey {
    block: cairn_format::FsBlock(0),
    block_count: 0,
};

#[derive(Debug)]
struct Slot {
    /// A copy of the occupant's key (`EMPTY_KEY` when empty), so a slot miss is decided
    /// without touching the occupant's memory.
    key: BufKey,
    buffer: Option<Arc<Buffer>>,
    /// The last rival (AG block + 1) in the high half, its run of index hits in the low
    /// half; 0 after a hit of the occupant or a fill.
    rival: u64,
}

impl Slot {
    const EMPTY: Self = Self {
        key: EMPTY_KEY,
        buffer: None,
        rival: 0,
    };

    fn empty(&mut self) {
        self.key = EMPTY_KEY;
        self.buffer = None;
    }

    fn fill(&mut self, buffer: &Arc<Buffer>) {
        self.key = buffer.key;
        self.buffer = Some(Arc::clone(buffer));
        self.rival = 0;
    }
}

#[derive(Debug, Default)]
struct AgTable {
    /// The AG's generation when this table was last swept of stale and dead occupants.
    generation_seen: u64,
    /// Empty until the first fill, so AGs a thread never uses cost nothing.
    slots: Box<[Slot]>,
}

#[derive(Debug)]
struct CacheTable {
    cache_id: u64,
    /// Gone when the cache is dropped.
    alive: Weak<()>,
    ags: Box<[AgTable]>,
}

thread_local! {
    /// This thread's tables, the most recently used cache first.
    static TABLES: RefCell<Vec<CacheTable>> = const { RefCell::new(Vec::new()) };
}

/// What offers a buffer to its slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fill {
    /// A buffer just inserted (read or created): about to be used, so it takes the slot.
    Insert,
    /// An index hit: takes the slot only if it is empty, names a stale or dead buffer, or
    /// after `LOOKASIDE_REPLACE_AFTER` index hits of this block in a row.
    IndexHit,
}

/// One thread's view of its slots for one AG, for invariant checks.
#[derive(Debug)]
pub(crate) struct ThreadSlots {
    /// Swept at the AG's current generation: no occupant may be stale or dead.
    pub(crate) swept: bool,
    pub(crate) slot_count: usize,
    /// Every slot's key copy is its occupant's key (`EMPTY_KEY` when empty).
    pub(crate) keys_match: bool,
    pub(crate) entries: Vec<(usize, Arc<Buffer>)>,
}

/// A cache's handle on its threads' slot tables.
#[derive(Debug)]
pub(crate) struct Lookaside {
    cache_id: u64,
    slot_count: u32,
    ag_count: usize,
    alive: Arc<()>,
}

fn is_live(buffer: &Buffer) -> bool {
    buffer.load_state() & (STALE | DEAD) == 0
}

impl AgTable {
    /// Drops the stale and dead occupants if the AG's generation moved since the last sweep.
    /// The generation is bumped after the flag is set (release), and read here first
    /// (acquire), so a sweep at generation `g` sees every flag set before `g`.
    #[inline]
    fn sweep(&mut self, generation: &AtomicU64, stats: &Stats) {
        let current = generation.load(Ordering::Acquire);
        if current == self.generation_seen {
            return;
        }
        let mut dropped = 0;
        for slot in self.slots.iter_mut() {
            if slot.buffer.as_deref().is_some_and(|b| !is_live(b)) {
                slot.empty();
                dropped += 1;
            }
        }
        self.generation_seen = current;
        if dropped > 0 {
            stats.add(Counter::LookasideRemoves, dropped);
        }
    }
}

impl Lookaside {
    pub(crate) fn new(slot_count: u32, ag_count: usize) -> Self {
        Self {
            cache_id: NEXT_CACHE_ID.fetch_add(1, Ordering::Relaxed),
            slot_count,
            ag_count,
            alive: Arc::new(()),
        }
    }

    #[inline]
    fn slot_index(&self, ag_block: u32) -> usize {
        (ag_block % self.slot_count) as usize
    }

    /// Runs `f` on this thread's table for `ag`, swept first. `None` when the slots are off,
    /// when this thread has no table and `create` is false, or during thread exit.
    #[inline]
    fn with_ag<R>(
        &self,
        ag: usize,
        generation: &AtomicU64,
        stats: &Stats,
        create: bool,
        f: impl FnOnce(&mut AgTable) -> R,
    ) -> Option<R> {
        if self.slot_count == 0 {
            return None;
        }
        let run = |tables: &RefCell<Vec<CacheTable>>| {
            let mut tables = tables.try_borrow_mut().ok()?;
            let table = self.table(&mut tables, generation, create)?;
            let ag_table = &mut table.ags[ag];
            ag_table.sweep(generation, stats);
            Some(f(ag_table))
        };
        TABLES.try_with(run).ok().flatten()
    }

    /// This thread's table for this cache, moved to the front; made if `create`.
    #[inline]
    fn table<'t>(
        &self,
        tables: &'t mut Vec<CacheTable>,
        generation: &AtomicU64,
        create: bool,
    ) -> Option<&'t mut CacheTable> {
        match tables.iter().position(|t| t.cache_id == self.cache_id) {
            Some(0) => {}
            Some(at) => tables[..=at].rotate_right(1),
            None if !create => return None,
            None => {
                tables.retain(|t| t.alive.strong_count() > 0);
                tables.truncate(CACHES_PER_THREAD - 1);
                // Empty tables need no sweep: start at the current generation (any AG's
                // value will do, the first sweep just finds nothing to drop).
                let seen = generation.load(Ordering::Acquire);
                let ags = (0..self.ag_count)
                    .map(|_| AgTable {
                        generation_seen: seen,
                        slots: Box::default(),
                    })
                    .collect();
                tables.insert(
                    0,
                    CacheTable {
                        cache_id: self.cache_id,
                        alive: Arc::downgrade(&self.alive),
                        ags,
                    },
                );
            }
        }
        tables.first_mut()
    }

    /// The buffer in this thread's slot for `key`, held by `hold` (which refuses stale and
    /// dead buffers). A refused occupant is dropped from the slot.
    #[inline]
    pub(crate) fn hit(
        &self,
        ag: usize,
        ag_block: u32,
        key: BufKey,
        generation: &AtomicU64,
        stats: &Stats,
        hold: impl FnOnce(&Arc<Buffer>) -> bool,
    ) -> Option<Arc<Buffer>> {
        let slot_index = self.slot_index_checked(ag_block)?;
        self.with_ag(ag, generation, stats, false, |table| {
            let slot = table.slots.get_mut(slot_index)?;
            if slot.key != key {
                return None;
            }
            let buffer = slot.buffer.as_ref()?;
            if hold(buffer) {
                let buffer = Arc::clone(buffer);
                if slot.rival != 0 {
                    slot.rival = 0;
                }
                return Some(buffer);
            }
            slot.empty();
            stats.bump(Counter::LookasideRemoves);
            None
        })
        .flatten()
    }

    /// Whether this thread's slot names a live buffer for `key` (no hold taken).
    #[inline]
    pub(crate) fn peek(
        &self,
        ag: usize,
        ag_block: u32,
        key: BufKey,
        generation: &AtomicU64,
        stats: &Stats,
    ) -> bool {
        let Some(slot_index) = self.slot_index_checked(ag_block) else {
            return false;
        };
        self.with_ag(ag, generation, stats, false, |table| {
            table
                .slots
                .get(slot_index)
                .filter(|slot| slot.key == key)
                .and_then(|slot| slot.buffer.as_deref())
                .is_some_and(is_live)
        })
        .unwrap_or(false)
    }

    /// Offers `buffer` to this thread's slot under the `fill` rule; counts a fill.
    pub(crate) fn offer(
        &self,
        ag: usize,
        ag_block: u32,
        buffer: &Arc<Buffer>,
        fill: Fill,
        generation: &AtomicU64,
        stats: &Stats,
    ) {
        let Some(slot_index) = self.slot_index_checked(ag_block) else {
            return;
        };
        let slot_count = self.slot_count as usize;
        self.with_ag(ag, generation, stats, true, |table| {
            if table.slots.is_empty() {
                table.slots = (0..slot_count).map(|_| Slot::EMPTY).collect();
            }
            let slot = &mut table.slots[slot_index];
            let take = match (&slot.buffer, fill) {
                (_, Fill::Insert) | (None, _) => true,
                (Some(current), Fill::IndexHit) if Arc::ptr_eq(current, buffer) => false,
                (Some(current), Fill::IndexHit) if is_live(current) => {
                    rival_hit(&mut slot.rival, ag_block) >= LOOKASIDE_REPLACE_AFTER
                }
                (Some(_), Fill::IndexHit) => {
                    stats.bump(Counter::LookasideRemoves);
                    true
                }
            };
            if take {
                slot.fill(buffer);
                stats.bump(Counter::LookasideInserts);
            }
        });
    }

    /// Empties this thread's slot if it names `buffer` (being removed or marked stale by this
    /// thread); other threads' slots are swept by the generation.
    pub(crate) fn clear(
        &self,
        ag: usize,
        ag_block: u32,
        buffer: &Arc<Buffer>,
        generation: &AtomicU64,
        stats: &Stats,
    ) {
        let Some(slot_index) = self.slot_index_checked(ag_block) else {
            return;
        };
        self.with_ag(ag, generation, stats, false, |table| {
            if let Some(slot) = table.slots.get_mut(slot_index)
                && slot.buffer.as_ref().is_some_and(|b| Arc::ptr_eq(b, buffer))
            {
                slot.empty();
                stats.bump(Counter::LookasideRemoves);
            }
        });
    }

    /// This thread's slots for `ag` (none if it has no table), without sweeping.
    pub(crate) fn thread_slots(&self, ag: usize, generation: &AtomicU64) -> Option<ThreadSlots> {
        if self.slot_count == 0 {
            return None;
        }
        let look = |tables: &RefCell<Vec<CacheTable>>| {
            let tables = tables.try_borrow().ok()?;
            let table = tables.iter().find(|t| t.cache_id == self.cache_id)?;
            let ag_table = &table.ags[ag];
            let entries = ag_table
                .slots
                .iter()
                .enumerate()
                .filter_map(|(i, slot)| slot.buffer.clone().map(|b| (i, b)))
                .collect();
            let keys_match = ag_table
                .slots
                .iter()
                .all(|slot| slot.key == slot.buffer.as_ref().map_or(EMPTY_KEY, |b| b.key));
            Some(ThreadSlots {
                swept: ag_table.generation_seen == generation.load(Ordering::Acquire),
                slot_count: ag_table.slots.len(),
                keys_match,
                entries,
            })
        };
        TABLES.try_with(look).ok().flatten()
    }

    /// Drops this thread's table for this cache (the cache is being dropped).
    pub(crate) fn forget_this_thread(&self) {
        let _ = TABLES.try_with(|tables| {
            if let Ok(mut tables) = tables.try_borrow_mut() {
                tables.retain(|t| t.cache_id != self.cache_id);
            }
        });
    }

    #[inline]
    fn slot_index_checked(&self, ag_block: u32) -> Option<usize> {
        (self.slot_count != 0).then(|| self.slot_index(ag_block))
    }
}

/// Counts an index hit of the rival at `ag_block` in `word` and returns its run length:
/// index hits of that same block in a row, with no hit of the occupant or another rival
/// between. So a working set cycling through more buffers than slots never replaces
/// anything, while a buffer in steady use behind a cold occupant takes over.
fn rival_hit(word: &mut u64, ag_block: u32) -> u32 {
    let tag = u64::from(ag_block) + 1;
    let run = if *word >> 32 == tag {
        (*word as u32).saturating_add(1)
    } else {
        1
    };
    *word = tag << 32 | u64::from(run);
    run
}
