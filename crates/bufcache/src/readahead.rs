//! Read-ahead: several adjacent blocks read with one device read and cached as single-block
//! buffers, such as an inode chunk on its first miss (XFS reads inode clusters whole for the
//! same reason: the neighbours of a cold inode are usually wanted next, and one read of 32 KiB
//! costs about what one read of 4 KiB does).

use cairn_blockdev::AlignedBuf;

use crate::buffer::BufKey;
use crate::cache::{BufferCache, Found};
use crate::guard::BufGuard;
use crate::ops::ReadSpec;
use crate::stats::Counter;

impl BufferCache {
    /// Caches the blocks of `range` that are not cached: one device read of the span from
    /// the first to the last of them, and each block that verifies with `spec` becomes a clean
    /// single-block buffer. Cached blocks are left alone (they may be newer than the disk).
    /// Best effort: a block that does not verify is not cached, a failed read caches nothing,
    /// and the lookup that needs such a block reads it again and reports the error. A range
    /// longer than a buffer may be is cut to that length. Returns the blocks cached.
    pub fn read_ahead(&self, range: BufKey, spec: &ReadSpec) -> u32 {
        let block_size = u64::from(self.config.block_size);
        let most = (crate::config::BUFFER_BYTES_MAX / block_size) as u32;
        let range = BufKey::new(range.block, range.block_count.min(most));
        let Ok((ag, ag_block)) = self.locate(range) else {
            return 0;
        };
        let guards = self.insert_missing(range, ag, ag_block, spec);
        let (Some(first), Some(last)) = (guards.first(), guards.last()) else {
            return 0;
        };
        let span_first = first.buffer.key.block.0;
        let span_blocks = last.buffer.key.block.0 - span_first + 1;
        let mut span = AlignedBuf::zeroed((span_blocks * block_size) as usize);
        let read = self.device.read_at(span_first * block_size, &mut span);
        self.stats.bump(Counter::ReadAheads);
        let mut cached = 0;
        for mut guard in guards {
            let at = ((guard.buffer.key.block.0 - span_first) * block_size) as usize;
            let bytes = &span[at..at + block_size as usize];
            let key = guard.buffer.key;
            if read.is_ok() && spec.ops.verify_read(bytes, key.block, spec).is_ok() {
                guard.data.bytes.copy_from_slice(bytes);
                guard.data.uptodate = true;
                self.stats.bump(Counter::Reads);
                cached += 1;
            } else {
                let shard = &self.shards[guard.buffer.ag];
                self.remove_locked(shard, &mut shard.index.write(), &guard.buffer);
            }
        }
        self.maybe_reclaim();
        cached
    }

    /// New, locked, not yet read buffers for the blocks of `range` that no lookup finds
    /// cached, in block order. Their locks are free when taken (nobody else can see a new
    /// buffer), so holding several breaks no lock order.
    fn insert_missing(
        &self,
        range: BufKey,
        ag: usize,
        ag_block: u32,
        spec: &ReadSpec,
    ) -> Vec<BufGuard<'_>> {
        let shard = &self.shards[ag];
        let mut guards = Vec::new();
        for i in 0..range.block_count {
            let key = BufKey::single(range.block.0 + u64::from(i));
            if self.is_cached(key) {
                continue;
            }
            match self.find_or_insert(shard, ag, key, ag_block + i, spec) {
                Ok(Found::Inserted(guard)) => guards.push(guard),
                Ok(Found::Cached(buffer)) => self.release(&buffer),
                // A longer buffer starts there: not ours to shadow.
                Err(_) => {}
            }
        }
        guards
    }
}
