//! `check_invariants`: the cache's consistency rules, checked by tests after every step.

use std::collections::HashSet;
use std::sync::Arc;

use crate::BufCacheError;
use crate::buffer::Buffer;
use crate::cache::BufferCache;
use crate::state::{DEAD, DELWRI_Q, ON_LRU, STALE, holds};

fn broken(what: String) -> Result<(), BufCacheError> {
    Err(BufCacheError::Invariant { what })
}

impl BufferCache {
    /// Checks, with every shard read-locked (so call it between operations):
    /// - every index entry is keyed by its buffer's key, lives in its AG's shard, is not dead,
    ///   and no two live entries share a start block;
    /// - the byte total of the index equals `memory_bytes`;
    /// - this thread's lookaside slots: each occupant is in its right slot, a live one is the
    ///   index's entry for its key, and none is stale or dead after a sweep;
    /// - every unheld, live buffer in the index is on the LRU queue;
    /// - every delwri queue entry is flagged as queued; an unlocked live buffer is up to date.
    pub fn check_invariants(&self) -> Result<(), BufCacheError> {
        let lru: HashSet<*const Buffer> = self.lru.lock().iter().map(Arc::as_ptr).collect();
        let guards: Vec<_> = self.shards.iter().map(|s| s.index.read()).collect();
        let mut total_bytes = 0u64;
        for (ag, index) in guards.iter().enumerate() {
            let mut previous_live_block = None;
            for (key, buffer) in index.iter() {
                let state = buffer.state.load();
                if buffer.key != *key || buffer.ag != ag || state & DEAD != 0 {
                    return broken(format!("index entry {key:?} in AG {ag} is {buffer:?}"));
                }
                if state & STALE == 0 {
                    if previous_live_block == Some(key.block) {
                        return broken(format!("two live buffers start at block {}", key.block));
                    }
                    previous_live_block = Some(key.block);
                }
                if holds(state) == 0 && (state & ON_LRU == 0 || !lru.contains(&Arc::as_ptr(buffer)))
                {
                    return broken(format!("unheld buffer {buffer:?} is not on the LRU"));
                }
                if let Some(data) = buffer.data.try_lock() {
                    let want = buffer.len_bytes(self.config.block_size) as usize;
                    if !data.uptodate || data.bytes.len() != want || !data.dirty.is_well_formed() {
                        return broken(format!("unlocked buffer {buffer:?} is not up to date"));
                    }
                }
                total_bytes += buffer.len_bytes(self.config.block_size);
            }
            self.check_slots(ag, index)?;
        }
        if total_bytes != self.memory_bytes() {
            return broken(format!(
                "index holds {total_bytes} bytes, counted {}",
                self.memory_bytes()
            ));
        }
        if let Some(buffer) = self
            .delwri
            .lock()
            .iter()
            .find(|b| b.state.load() & DELWRI_Q == 0)
        {
            return broken(format!("queued buffer {buffer:?} is not flagged"));
        }
        Ok(())
    }

    /// This thread's slots for `ag` (other threads' are not reachable from here): each is the
    /// right slot for its buffer and keeps a copy of its key; a live occupant is the index's
    /// entry for its key; after a sweep at the current generation no occupant is stale or dead.
    fn check_slots(&self, ag: usize, index: &crate::shard::Index) -> Result<(), BufCacheError> {
        let generation = self.shards[ag].generation();
        let Some(slots) = self.lookaside.thread_slots(ag, generation) else {
            return Ok(());
        };
        if slots.slot_count != 0 && slots.slot_count != self.config.lookaside_slots as usize {
            return broken(format!("AG {ag} has the wrong number of slots"));
        }
        if !slots.keys_match {
            return broken(format!("AG {ag} has a slot whose key is not its buffer's"));
        }
        for (slot, buffer) in slots.entries {
            let live = buffer.state.is_live();
            let in_index = index
                .get(&buffer.key)
                .is_some_and(|b| Arc::ptr_eq(b, &buffer));
            let right_slot = self.slot_of(buffer.key.block.0) == Some(slot);
            if !right_slot || (live && !in_index) || (slots.swept && !live) {
                return broken(format!("AG {ag} slot {slot} holds {buffer:?}"));
            }
        }
        Ok(())
    }
}
