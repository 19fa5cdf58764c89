//! One AG's part of the cache: the ordered index and the lookaside array in front of it.
//!
//! Locking: the index and the slots are behind the shard's `RwLock`. A lookup reads the slot
//! under the read lock and, on a slot miss, searches the index under the same read lock, so a
//! slot miss costs nothing extra. (A lock-free `ArcSwapOption` slot was measured too: its load
//! costs about as much as the read lock, and a slot miss then paid both; see
//! `docs/benchmarks.md`.) Slots are written only under the write lock: filled on insert,
//! taken on an index hit only when empty, stale, or after a run of rival hits, and cleared
//! whenever a buffer leaves the index or is marked stale. So a slot names only live buffers
//! in the index, and what a reader finds there cannot change until it drops the read lock.

use std::collections::BTreeMap;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::RwLock;

use crate::buffer::{BufKey, Buffer, DEAD, STALE};
use crate::config::LOOKASIDE_REPLACE_AFTER;

/// The index proper, and the lookaside slots, both behind the shard lock.
#[derive(Debug)]
pub(crate) struct Index {
    map: BTreeMap<BufKey, Arc<Buffer>>,
    slots: Box<[Option<Arc<Buffer>>]>,
}

impl Deref for Index {
    type Target = BTreeMap<BufKey, Arc<Buffer>>;
    fn deref(&self) -> &Self::Target {
        &self.map
    }
}

impl DerefMut for Index {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.map
    }
}

#[derive(Debug)]
pub(crate) struct AgShard {
    pub(crate) index: RwLock<Index>,
    /// Per slot: the last rival (AG block + 1) in the high half, its run of index hits in the
    /// low half; 0 after a slot hit or fill.
    rival: Box<[AtomicU64]>,
}

impl Index {
    #[inline]
    fn slot_index(&self, ag_block: u32) -> Option<usize> {
        let count = self.slots.len() as u32;
        (count != 0).then(|| (ag_block % count) as usize)
    }

    /// The slot's buffer if it matches `key` (block and length).
    #[inline]
    pub(crate) fn lookaside_find(&self, key: BufKey, ag_block: u32) -> Option<&Arc<Buffer>> {
        let slot = self.slot_index(ag_block)?;
        self.slots[slot].as_ref().filter(|b| b.key == key)
    }
}

impl AgShard {
    pub(crate) fn new(slot_count: u32) -> Self {
        Self {
            index: RwLock::new(Index {
                map: BTreeMap::new(),
                slots: (0..slot_count).map(|_| None).collect(),
            }),
            rival: (0..slot_count).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Resets the rivals' count after a slot hit; written only when there is some.
    #[inline]
    pub(crate) fn lookaside_hit(&self, ag_block: u32) {
        let count = self.rival.len() as u32;
        if let Some(rival) = self.rival.get((ag_block % count.max(1)) as usize)
            && rival.load(Ordering::Relaxed) != 0
        {
            rival.store(0, Ordering::Relaxed);
        }
    }

    /// Puts a newly inserted `buffer` in its slot, replacing any occupant. Returns whether the
    /// slot changed.
    pub(crate) fn lookaside_fill(
        &self,
        index: &mut Index,
        buffer: &Arc<Buffer>,
        ag_block: u32,
    ) -> bool {
        let Some(slot) = index.slot_index(ag_block) else {
            return false;
        };
        index.slots[slot] = Some(Arc::clone(buffer));
        self.rival[slot].store(0, Ordering::Relaxed);
        true
    }

    /// Whether an index hit of `buffer` should take its slot: the slot is empty or names a
    /// stale or dead buffer, or rivals had `LOOKASIDE_REPLACE_AFTER` index hits in a row.
    pub(crate) fn lookaside_wants(
        &self,
        index: &Index,
        buffer: &Arc<Buffer>,
        ag_block: u32,
    ) -> bool {
        let Some(slot) = index.slot_index(ag_block) else {
            return false;
        };
        match &index.slots[slot] {
            Some(current) if Arc::ptr_eq(current, buffer) => false,
            Some(current) if current.load_state() & (STALE | DEAD) == 0 => {
                self.rival_hit(slot, ag_block) >= LOOKASIDE_REPLACE_AFTER
            }
            _ => true,
        }
    }

    /// Counts an index hit of the rival at `ag_block` and returns its run length: index hits of
    /// that same block in a row, with no hit of the occupant or another rival between. So a
    /// working set cycling through more buffers than slots never replaces anything, while a
    /// buffer in steady use behind a cold occupant takes over. A heuristic: racing updates
    /// (plain load and store, no read-modify-write) can lose a count, never corrupt a slot.
    fn rival_hit(&self, slot: usize, ag_block: u32) -> u32 {
        let word = &self.rival[slot];
        let tag = u64::from(ag_block) + 1;
        let current = word.load(Ordering::Relaxed);
        let run = if current >> 32 == tag {
            (current as u32).saturating_add(1)
        } else {
            1
        };
        word.store(tag << 32 | u64::from(run), Ordering::Relaxed);
        run
    }

    /// Empties the slot if it names `buffer`. Returns whether the slot changed.
    pub(crate) fn lookaside_clear(
        &self,
        index: &mut Index,
        buffer: &Arc<Buffer>,
        ag_block: u32,
    ) -> bool {
        let Some(slot) = index.slot_index(ag_block) else {
            return false;
        };
        let names_it = index.slots[slot]
            .as_ref()
            .is_some_and(|current| Arc::ptr_eq(current, buffer));
        if names_it {
            index.slots[slot] = None;
        }
        names_it
    }

    /// Every occupied slot with its index, for invariant checks.
    pub(crate) fn lookaside_entries(index: &Index) -> Vec<(usize, Arc<Buffer>)> {
        index
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, slot)| slot.clone().map(|buffer| (i, buffer)))
            .collect()
    }

    pub(crate) fn slot_count(&self) -> usize {
        self.rival.len()
    }
}
