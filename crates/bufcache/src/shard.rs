//! One AG's part of the cache: the ordered index and the lookaside array in front of it.
//!
//! Locking: the index is behind the shard's `RwLock`. Lookaside slots are read without any
//! lock (an atomic load of a reference-counted pointer); they are written only under the
//! shard lock: filled under the read or write lock, cleared under the write lock. Every removal
//! from the index happens under the write lock, marks the buffer `DEAD` first and clears its
//! slot, so a slot never names a buffer that is out of the index once the remover's lock is
//! released. A reader that loaded the slot just before that still checks `DEAD` after taking
//! its hold (see `Buffer::try_hold_live`), so it can never keep a removed buffer.

use std::collections::BTreeMap;
use std::sync::Arc;

use arc_swap::ArcSwapOption;
use parking_lot::RwLock;

use crate::buffer::{BufKey, Buffer};

pub(crate) type Index = BTreeMap<BufKey, Arc<Buffer>>;

#[derive(Debug)]
pub(crate) struct AgShard {
    pub(crate) index: RwLock<Index>,
    slots: Box<[ArcSwapOption<Buffer>]>,
}

impl AgShard {
    pub(crate) fn new(slot_count: u32) -> Self {
        Self {
            index: RwLock::new(BTreeMap::new()),
            slots: (0..slot_count).map(|_| ArcSwapOption::empty()).collect(),
        }
    }

    pub(crate) fn lookaside_enabled(&self) -> bool {
        !self.slots.is_empty()
    }

    #[inline]
    fn slot_of(&self, ag_block: u32) -> Option<&ArcSwapOption<Buffer>> {
        let count = self.slots.len() as u32;
        if count == 0 {
            return None;
        }
        self.slots.get((ag_block % count) as usize)
    }

    /// The slot's buffer, held, if it matches `key` (block and length) and `hold_live` takes a
    /// hold on it (it refuses stale and dead buffers).
    #[inline]
    pub(crate) fn lookaside_get(
        &self,
        key: BufKey,
        ag_block: u32,
        hold_live: impl FnOnce(&Arc<Buffer>) -> bool,
    ) -> Option<Arc<Buffer>> {
        let slot = self.slot_of(ag_block)?;
        let loaded = slot.load();
        let buffer = loaded.as_ref()?;
        if buffer.key != key {
            return None;
        }
        // The hold comes before the liveness check; see the module comment.
        if !hold_live(buffer) {
            return None;
        }
        Some(Arc::clone(buffer))
    }

    /// Puts `buffer` in its slot. Caller holds the shard lock (read or write) and `buffer` is
    /// in the index and live. Returns whether the slot changed.
    pub(crate) fn lookaside_fill(&self, buffer: &Arc<Buffer>, ag_block: u32) -> bool {
        let Some(slot) = self.slot_of(ag_block) else {
            return false;
        };
        slot.store(Some(Arc::clone(buffer)));
        true
    }

    /// Empties the slot if it names `buffer`. Caller holds the shard write lock. Returns
    /// whether the slot changed.
    pub(crate) fn lookaside_clear(&self, buffer: &Arc<Buffer>, ag_block: u32) -> bool {
        let Some(slot) = self.slot_of(ag_block) else {
            return false;
        };
        let names_it = slot
            .load()
            .as_ref()
            .is_some_and(|current| Arc::ptr_eq(current, buffer));
        if names_it {
            slot.store(None);
        }
        names_it
    }

    /// Every occupied slot with its index, for invariant checks.
    pub(crate) fn lookaside_entries(&self) -> Vec<(usize, Arc<Buffer>)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, slot)| slot.load_full().map(|buffer| (i, buffer)))
            .collect()
    }

    pub(crate) fn slot_count(&self) -> usize {
        self.slots.len()
    }
}
