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
//! AGs buffers per thread and cache. A buffer is offered to a slot only if it is live after
//! the sweep, so a swept table holds no buffer that died before the generation it saw.
//!
//! Finding the thread's table is O(1): each live cache has a small dense id (reused after the
//! cache is dropped) indexing the thread's table vector, and a never-reused serial telling a
//! dropped cache's table from the current one. A thread drops the tables of dropped caches
//! when it makes a new table, and a cache being dropped clears the dropping thread's table, so
//! a thread keeps tables for at most as many caches as were ever alive at once.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use cairn_atomic::AtomicWord;

use crate::buffer::{BufKey, Buffer};
use crate::config::LOOKASIDE_REPLACE_AFTER;
use crate::state::{Generation, StateWord};
use crate::stats::{Counter, Stats};

/// What a slot can hold: a buffer, or in the loom models (`models.rs`) a buffer whose state
/// word is on loom's atomics, so the models run this module's sweep and slot code.
pub(crate) trait Occupant {
    type Word: AtomicWord;
    fn key(&self) -> BufKey;
    fn state(&self) -> &StateWord<Self::Word>;
}

impl Occupant for Buffer {
    type Word = AtomicU64;

    #[inline(always)]
    fn key(&self) -> BufKey {
        self.key
    }

    #[inline(always)]
    fn state(&self) -> &StateWord {
        &self.state
    }
}

/// Cache serials, never reused, so a table left by a dropped cache never matches a new one.
static NEXT_CACHE_SERIAL: AtomicU64 = AtomicU64::new(1);

/// Which dense ids live caches use (`true` = taken); the lowest free one is handed out.
static DENSE_IDS: Mutex<Vec<bool>> = Mutex::new(Vec::new());

fn take_dense_id() -> usize {
    let mut ids = DENSE_IDS.lock().unwrap_or_else(PoisonError::into_inner);
    match ids.iter().position(|taken| !taken) {
        Some(id) => {
            ids[id] = true;
            id
        }
        None => {
            ids.push(true);
            ids.len() - 1
        }
    }
}

fn give_back_dense_id(id: usize) {
    let mut ids = DENSE_IDS.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(taken) = ids.get_mut(id) {
        *taken = false;
    }
}

/// The key of an empty slot: no lookup asks for 0 blocks.
const EMPTY_KEY: BufKey = BufKey {
    block: cairn_format::FsBlock(0),
    block_count: 0,
};

#[derive(Debug)]
struct Slot<B = Buffer> {
    /// A copy of the occupant's key (`EMPTY_KEY` when empty), so a slot miss is decided
    /// without touching the occupant's memory.
    key: BufKey,
    buffer: Option<Arc<B>>,
    /// The last rival (AG block + 1) in the high half, its run of index hits in the low
    /// half; 0 after a hit of the occupant or a fill.
    rival: u64,
}

impl<B: Occupant> Slot<B> {
    const EMPTY: Self = Self {
        key: EMPTY_KEY,
        buffer: None,
        rival: 0,
    };

    fn empty(&mut self) {
        self.key = EMPTY_KEY;
        self.buffer = None;
    }

    fn fill(&mut self, buffer: &Arc<B>) {
        self.key = buffer.key();
        self.buffer = Some(Arc::clone(buffer));
        self.rival = 0;
    }

    /// Offers `buffer`, live and held by the caller, to this slot of a table just swept, so
    /// the occupant (if any) was live at the sweep and is not `buffer` unless keys match.
    fn offer(&mut self, ag_block: u32, buffer: &Arc<B>, fill: Fill, stats: &Stats) {
        let take = match fill {
            Fill::Insert => true,
            Fill::IndexHit if self.buffer.is_none() => true,
            Fill::IndexHit if self.key == buffer.key() => false,
            Fill::IndexHit => rival_hit(&mut self.rival, ag_block) >= LOOKASIDE_REPLACE_AFTER,
        };
        // Checked after the sweep's generation load: a buffer that died before that
        // generation is seen dead here, so it never sits in a table swept past its death.
        if take && buffer.state().is_live() {
            self.fill(buffer);
            stats.bump(Counter::LookasideInserts);
        }
    }
}

#[derive(Debug)]
pub(crate) struct AgTable<B = Buffer> {
    /// The AG's generation when this table was last swept of stale and dead occupants.
    generation_seen: u64,
    /// Empty until the first lookup, so AGs a thread never uses cost nothing.
    slots: Box<[Slot<B>]>,
}

#[derive(Debug)]
struct CacheTable {
    /// The owning cache's serial: a table at the same dense id with another serial is a
    /// dropped cache's.
    serial: u64,
    /// Gone when the cache is dropped.
    alive: Weak<()>,
    ags: Box<[AgTable]>,
}

thread_local! {
    /// This thread's tables, indexed by the caches' dense ids.
    static TABLES: RefCell<Vec<Option<CacheTable>>> = const { RefCell::new(Vec::new()) };
}

/// What offers a buffer to its slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fill {
    /// A buffer just inserted (read or created): about to be used, so it takes the slot.
    Insert,
    /// An index hit: takes the slot only if it is empty, or after `LOOKASIDE_REPLACE_AFTER`
    /// index hits of this block in a row (stale and dead occupants are swept out first).
    IndexHit,
}

/// Where a found buffer came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    Lookaside,
    Index,
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
    dense_id: usize,
    serial: u64,
    slot_count: u32,
    /// `slot_count`'s multiplier for `fast_mod`.
    mod_multiplier: u64,
    ag_count: usize,
    alive: Arc<()>,
}

impl Drop for Lookaside {
    fn drop(&mut self) {
        give_back_dense_id(self.dense_id);
    }
}

/// The multiplier making `fast_mod(n, m, divisor)` equal `n % divisor` (Lemire, Kaser and
/// Kurz, "Faster remainder by direct computation", 2019): a multiply instead of a divide on
/// every lookup. `divisor` 1 gives 0, which `fast_mod` also maps to 0.
fn mod_multiplier(divisor: u32) -> u64 {
    (u64::MAX / u64::from(divisor.max(1))).wrapping_add(1)
}

#[inline]
fn fast_mod(n: u32, multiplier: u64, divisor: u32) -> u32 {
    let low = multiplier.wrapping_mul(u64::from(n));
    ((u128::from(low) * u128::from(divisor)) >> 64) as u32
}

impl<B: Occupant> AgTable<B> {
    /// A table with no slots yet, swept at `generation_seen`.
    pub(crate) fn new(generation_seen: u64) -> Self {
        Self {
            generation_seen,
            slots: Box::default(),
        }
    }

    /// Drops the stale and dead occupants if the AG's generation moved since the last sweep.
    /// The generation is bumped after the flag is set (release), and read here first
    /// (acquire), so a sweep at generation `g` sees every flag set before `g`.
    #[inline]
    pub(crate) fn sweep(&mut self, generation: &Generation<B::Word>, stats: &Stats) {
        let current = generation.load();
        if current == self.generation_seen {
            return;
        }
        let mut dropped = 0;
        for slot in self.slots.iter_mut() {
            if slot.buffer.as_deref().is_some_and(|b| !b.state().is_live()) {
                slot.empty();
                dropped += 1;
            }
        }
        self.generation_seen = current;
        if dropped > 0 {
            stats.add(Counter::LookasideRemoves, dropped);
        }
    }

    fn slots_made(&mut self, slot_count: usize) -> &mut [Slot<B>] {
        if self.slots.is_empty() {
            self.slots = (0..slot_count).map(|_| Slot::EMPTY).collect();
        }
        &mut self.slots
    }

    /// The lookup in a swept table (`Lookaside::find`): the slot at `slot_index` if it holds
    /// `key` and `hold` takes a live hold on it (a refused occupant is dropped), else `index`
    /// (taken out of its `Option`), whose hit is offered to the same slot.
    #[inline(always)]
    pub(crate) fn find(
        &mut self,
        (slot_count, slot_index): (usize, usize),
        (ag_block, key): (u32, BufKey),
        stats: &Stats,
        hold: impl FnOnce(&Arc<B>) -> bool,
        index: &mut Option<impl FnOnce() -> Option<Arc<B>>>,
    ) -> Option<(Arc<B>, Source)> {
        let slot = &mut self.slots_made(slot_count)[slot_index];
        if slot.key == key {
            if let Some(buffer) = slot.buffer.as_ref().filter(|b| hold(b)) {
                let buffer = Arc::clone(buffer);
                slot.rival = 0;
                return Some((buffer, Source::Lookaside));
            }
            slot.empty();
            stats.bump(Counter::LookasideRemoves);
        }
        let buffer = index.take().and_then(|index| index())?;
        slot.offer(ag_block, &buffer, Fill::IndexHit, stats);
        Some((buffer, Source::Index))
    }

    /// Offers `buffer` (held by the caller) to the slot at `slot_index` under the `fill` rule.
    pub(crate) fn offer(
        &mut self,
        (slot_count, slot_index): (usize, usize),
        ag_block: u32,
        buffer: &Arc<B>,
        fill: Fill,
        stats: &Stats,
    ) {
        self.slots_made(slot_count)[slot_index].offer(ag_block, buffer, fill, stats);
    }

    /// The occupant of the slot at `slot_index`, for the models' checks.
    #[cfg(test)]
    pub(crate) fn occupant(&self, slot_index: usize) -> Option<&Arc<B>> {
        self.slots.get(slot_index)?.buffer.as_ref()
    }

    /// The generation of the last sweep, for the models' checks.
    #[cfg(test)]
    pub(crate) fn generation_seen(&self) -> u64 {
        self.generation_seen
    }
}

impl Lookaside {
    pub(crate) fn new(slot_count: u32, ag_count: usize) -> Self {
        Self {
            dense_id: take_dense_id(),
            serial: NEXT_CACHE_SERIAL.fetch_add(1, Ordering::Relaxed),
            slot_count,
            mod_multiplier: mod_multiplier(slot_count),
            ag_count,
            alive: Arc::new(()),
        }
    }

    /// Whether the slots are on (`lookaside_slots` > 0).
    #[inline]
    pub(crate) fn is_on(&self) -> bool {
        self.slot_count != 0
    }

    #[inline]
    fn slot_index(&self, ag_block: u32) -> usize {
        fast_mod(ag_block, self.mod_multiplier, self.slot_count) as usize
    }

    /// Runs `f` on this thread's table for `ag`, swept first. `None` when the slots are off,
    /// when this thread has no table and `create` is false, or during thread exit.
    #[inline(always)]
    fn with_ag<R>(
        &self,
        ag: usize,
        generation: &Generation,
        stats: &Stats,
        create: bool,
        f: impl FnOnce(&mut AgTable) -> R,
    ) -> Option<R> {
        if self.slot_count == 0 {
            return None;
        }
        let run = |tables: &RefCell<Vec<Option<CacheTable>>>| {
            let mut tables = tables.try_borrow_mut().ok()?;
            let ours =
                matches!(tables.get(self.dense_id), Some(Some(t)) if t.serial == self.serial);
            if !ours {
                if !create {
                    return None;
                }
                self.make_table(&mut tables, generation);
            }
            let ag_table = tables.get_mut(self.dense_id)?.as_mut()?.ags.get_mut(ag)?;
            ag_table.sweep(generation, stats);
            Some(f(ag_table))
        };
        TABLES.try_with(run).ok().flatten()
    }

    /// Makes this thread's table for this cache at its dense id, replacing a dropped cache's,
    /// and drops every other dropped cache's table.
    #[cold]
    fn make_table(&self, tables: &mut Vec<Option<CacheTable>>, generation: &Generation) {
        for table in tables.iter_mut() {
            if table.as_ref().is_some_and(|t| t.alive.strong_count() == 0) {
                *table = None;
            }
        }
        if tables.len() <= self.dense_id {
            tables.resize_with(self.dense_id + 1, || None);
        }
        // Empty tables need no sweep: start at the current generation (any AG's value will
        // do, the first sweep just finds nothing to drop).
        let seen = generation.load();
        let ags = (0..self.ag_count).map(|_| AgTable::new(seen)).collect();
        tables[self.dense_id] = Some(CacheTable {
            serial: self.serial,
            alive: Arc::downgrade(&self.alive),
            ags,
        });
    }

    /// Finds a held buffer for `key`: this thread's slot first, held by `hold` (which refuses
    /// stale and dead buffers; a refused occupant is dropped from the slot), else `index`
    /// (which returns a held buffer), whose hit is then offered to the same slot. One table
    /// access for both; a slot miss costs a compare of the slot's key copy.
    #[inline(always)]
    pub(crate) fn find(
        &self,
        (ag, ag_block): (usize, u32),
        key: BufKey,
        generation: &Generation,
        stats: &Stats,
        hold: impl FnOnce(&Arc<Buffer>) -> bool,
        index: impl FnOnce() -> Option<Arc<Buffer>>,
    ) -> Option<(Arc<Buffer>, Source)> {
        let mut index = Some(index);
        let slot_count = self.slot_count as usize;
        let slot_index = self.slot_index_checked(ag_block);
        let found = slot_index.and_then(|slot_index| {
            self.with_ag(ag, generation, stats, true, |table| {
                let at = (slot_count, slot_index);
                table.find(at, (ag_block, key), stats, hold, &mut index)
            })
        });
        match found {
            Some(found) => found,
            // Slots off, or no thread-local table (thread exit): the index alone.
            None => index
                .take()
                .and_then(|index| index())
                .map(|buffer| (buffer, Source::Index)),
        }
    }

    /// Whether this thread's slot names a live buffer for `key` (no hold taken).
    #[inline]
    pub(crate) fn peek(
        &self,
        ag: usize,
        ag_block: u32,
        key: BufKey,
        generation: &Generation,
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
                .is_some_and(|buffer| buffer.state.is_live())
        })
        .unwrap_or(false)
    }

    /// Offers `buffer` (held by the caller) to this thread's slot under the `fill` rule.
    pub(crate) fn offer(
        &self,
        ag: usize,
        ag_block: u32,
        buffer: &Arc<Buffer>,
        fill: Fill,
        generation: &Generation,
        stats: &Stats,
    ) {
        let Some(slot_index) = self.slot_index_checked(ag_block) else {
            return;
        };
        let slot_count = self.slot_count as usize;
        self.with_ag(ag, generation, stats, true, |table| {
            table.offer((slot_count, slot_index), ag_block, buffer, fill, stats);
        });
    }

    /// Empties this thread's slot if it names `buffer` (being removed or marked stale by this
    /// thread); other threads' slots are swept by the generation.
    pub(crate) fn clear(
        &self,
        ag: usize,
        ag_block: u32,
        buffer: &Arc<Buffer>,
        generation: &Generation,
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
    pub(crate) fn thread_slots(&self, ag: usize, generation: &Generation) -> Option<ThreadSlots> {
        if self.slot_count == 0 {
            return None;
        }
        let look = |tables: &RefCell<Vec<Option<CacheTable>>>| {
            let tables = tables.try_borrow().ok()?;
            let table = tables.get(self.dense_id)?.as_ref()?;
            if table.serial != self.serial {
                return None;
            }
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
                swept: ag_table.generation_seen == generation.load(),
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
            if let Ok(mut tables) = tables.try_borrow_mut()
                && let Some(table) = tables.get_mut(self.dense_id)
                && table.as_ref().is_some_and(|t| t.serial == self.serial)
            {
                *table = None;
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        // Checks the multiply-based remainder against `%` for any block and slot count.
        #[test]
        fn fast_mod_is_remainder(n in any::<u32>(), divisor in 1u32..) {
            prop_assert_eq!(fast_mod(n, mod_multiplier(divisor), divisor), n % divisor);
        }
    }

    // Checks the edges: divisor 1, the largest divisor and block numbers.
    #[test]
    fn fast_mod_edges() {
        for divisor in [1u32, 2, 3, 37, 64, u32::MAX - 1, u32::MAX] {
            for n in [0u32, 1, divisor - 1, divisor, u32::MAX - 1, u32::MAX] {
                assert_eq!(fast_mod(n, mod_multiplier(divisor), divisor), n % divisor);
            }
        }
    }

    // Checks that dense ids are reused lowest first once given back, and serials never are.
    #[test]
    fn dense_ids_are_reused_serials_are_not() {
        let first = Lookaside::new(37, 1);
        let second = Lookaside::new(37, 1);
        assert_ne!(first.dense_id, second.dense_id);
        let (id, serial) = (first.dense_id, first.serial);
        assert!(id < 64, "ids stay dense");
        drop(first);
        let third = Lookaside::new(37, 1);
        // Another test may take the freed id in between; live caches never share one.
        assert!(third.serial > serial);
        assert_ne!(third.dense_id, second.dense_id);
    }
}
