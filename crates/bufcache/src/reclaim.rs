//! Reclaim: an LRU with second chances, bounded by the memory limit.
//!
//! A buffer joins the LRU when its last hold is released (and stays there while it is reused,
//! so hits never touch the LRU lock). Reclaim pops from the front: a held buffer leaves the
//! LRU (its next release puts it back); a dirty or pinned one goes to the back; one with a
//! reuse count above zero has it decremented and goes to the back; only a buffer at zero,
//! unheld, clean and unpinned is freed. Stale buffers skip the second chance. Buffers reused
//! between passes get their reuse count back from the lookup, so hot buffers (AG headers, given
//! higher counts) outlive one-shot ones.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::buffer::{Buffer, DEAD, DIRTY, ON_LRU, PIN_MASK, STALE, UNRECLAIMABLE, holds};
use crate::cache::BufferCache;
use crate::ops::LRU_REF_MAX;
use crate::stats::Counter;

/// What one reclaim call freed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReclaimReport {
    pub buffers_freed: u64,
    pub bytes_freed: u64,
}

/// What to do with a buffer popped from the LRU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Freed,
    /// Keep it: back of the queue.
    Rotate,
    /// Off the queue: dead, or held (its last release re-queues it).
    Leave,
}

impl BufferCache {
    /// Frees unheld, clean, unpinned buffers from the LRU until `bytes_wanted` are freed or
    /// every candidate has used up its second chances. `u64::MAX` frees all it can.
    pub fn reclaim(&self, bytes_wanted: u64) -> ReclaimReport {
        let mut report = ReclaimReport::default();
        // Enough pops to take every buffer's reuse count down to zero and then free it.
        let mut budget = self.lru.lock().len() * (LRU_REF_MAX as usize + 2);
        while report.bytes_freed < bytes_wanted && budget > 0 {
            budget -= 1;
            let Some(buffer) = self.lru.lock().pop_front() else {
                break;
            };
            match self.judge(&buffer) {
                Verdict::Freed => {
                    report.buffers_freed += 1;
                    report.bytes_freed += buffer.len_bytes(self.config.block_size);
                }
                Verdict::Rotate => self.lru.lock().push_back(buffer),
                Verdict::Leave => {}
            }
        }
        report
    }

    /// Reclaims down to the memory limit if it is exceeded and no other thread is at it.
    pub(crate) fn maybe_reclaim(&self) {
        let used = self.memory_bytes();
        let limit = self.config.memory_limit_bytes;
        if used <= limit {
            return;
        }
        if let Some(_only_one) = self.reclaim_lock.try_lock() {
            self.reclaim(used - limit);
        }
    }

    fn judge(&self, buffer: &Arc<Buffer>) -> Verdict {
        loop {
            let state = buffer.load_state();
            if state & DEAD != 0 {
                return Verdict::Leave;
            }
            if holds(state) > 0 {
                // Clearing ON_LRU must not race with the last release, which re-queues only if
                // ON_LRU is clear: the exchange fails if the hold count moved, and we look again.
                let cleared = state & !ON_LRU;
                let exchange = buffer.state.compare_exchange(
                    state,
                    cleared,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                );
                if exchange.is_ok() {
                    return Verdict::Leave;
                }
                continue;
            }
            if state & (PIN_MASK | DIRTY) != 0 {
                return Verdict::Rotate;
            }
            if state & STALE == 0 && self.second_chance(buffer) {
                return Verdict::Rotate;
            }
            return self.try_free(buffer);
        }
    }

    /// Decrements the reuse count; true if it was above zero (the buffer survives this pass).
    fn second_chance(&self, buffer: &Buffer) -> bool {
        buffer
            .lru_ref
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |r| r.checked_sub(1))
            .is_ok()
    }

    /// Under the shard's write lock, marks the buffer dead if nothing reclaim must respect
    /// has appeared, and removes it from the index and its slot.
    fn try_free(&self, buffer: &Arc<Buffer>) -> Verdict {
        let shard = &self.shards[buffer.ag];
        let mut index = shard.index.write();
        let state = buffer.load_state();
        if state & UNRECLAIMABLE != 0 {
            return Verdict::Rotate;
        }
        // A reader's hold is a change to the same word, so this exchange
        // and that hold cannot both succeed.
        let exchange =
            buffer
                .state
                .compare_exchange(state, state | DEAD, Ordering::AcqRel, Ordering::Acquire);
        if exchange.is_err() {
            return Verdict::Rotate;
        }
        self.remove_locked(shard, &mut index, buffer);
        self.stats.bump(Counter::Reclaims);
        Verdict::Freed
    }
}
