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

use crate::buffer::Buffer;
use crate::cache::BufferCache;
use crate::ops::LRU_REF_MAX;
use crate::state::Verdict;
use crate::stats::Counter;

/// What one reclaim call freed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReclaimReport {
    pub buffers_freed: u64,
    pub bytes_freed: u64,
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
        let second_chance = || self.second_chance(buffer);
        buffer.state.judge(second_chance, || self.try_free(buffer))
    }

    /// Decrements the reuse count; true if it was above zero (the buffer survives this pass).
    fn second_chance(&self, buffer: &Buffer) -> bool {
        buffer
            .lru_ref
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |r| r.checked_sub(1))
            .is_ok()
    }

    /// Under the shard's write lock, marks the buffer dead if nothing reclaim must respect
    /// has appeared, and removes it from the index and its slot; true if it did.
    fn try_free(&self, buffer: &Arc<Buffer>) -> bool {
        let shard = &self.shards[buffer.ag];
        let mut index = shard.index.write();
        if !buffer.state.try_kill() {
            return false;
        }
        self.remove_locked(shard, &mut index, buffer);
        self.stats.bump(Counter::Reclaims);
        true
    }
}
