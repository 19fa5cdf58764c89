//! The delayed-write queue: dirty buffers written home in disk order, adjacent ones joined.

use std::sync::Arc;

use cairn_blockdev::AlignedBuf;
use cairn_format::FsBlock;

use crate::BufCacheError;
use crate::buffer::{BufKey, Buffer};
use crate::cache::BufferCache;
use crate::guard::BufGuard;
use crate::state::{DELWRI_Q, DIRTY, STALE, WriteCheck};
use crate::stats::Counter;

/// What one `flush_delwri` did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FlushReport {
    pub buffers_written: u64,
    /// Device writes issued (adjacent buffers share one).
    pub write_ops: u64,
    pub bytes_written: u64,
    /// Pinned buffers skipped (their changes are not checkpointed); they stay queued.
    pub pinned: Vec<BufKey>,
    /// Buffers locked by someone else, skipped; they stay queued.
    pub busy: Vec<BufKey>,
}

impl BufferCache {
    /// Writes the queued dirty buffers home in disk order, joining adjacent buffers into one
    /// device write of at most `delwri_batch_bytes_max`. Stale and clean buffers leave the
    /// queue unwritten; pinned and locked ones stay queued and are reported. On a write error
    /// the buffers not written stay dirty and queued, and the error names the failed range.
    pub fn flush_delwri(&self) -> Result<FlushReport, BufCacheError> {
        let mut queue = std::mem::take(&mut *self.delwri.lock());
        queue.sort_by_key(|buffer| buffer.key);
        let mut report = FlushReport::default();
        let mut batch: Vec<BufGuard<'_>> = Vec::new();
        let mut batch_bytes = 0usize;
        for (position, buffer) in queue.iter().enumerate() {
            buffer.state.clear_flags(DELWRI_Q);
            let prepared = match self.prepare(buffer, &mut report) {
                Ok(Some(guard)) => guard,
                Ok(None) => continue,
                Err(error) => return Err(self.requeue_after(error, batch, &queue[position..])),
            };
            let joins = batch.last().is_some_and(|last| {
                last.key().end() == prepared.block().0
                    && batch_bytes + prepared.len() <= self.config.delwri_batch_bytes_max as usize
            });
            if !joins && let Err(error) = self.submit(&mut batch, &mut report) {
                return Err(self.requeue_after(error, batch, &queue[position..]));
            }
            if !joins {
                batch_bytes = 0;
            }
            batch_bytes += prepared.len();
            batch.push(prepared);
        }
        if let Err(error) = self.submit(&mut batch, &mut report) {
            return Err(self.requeue_after(error, batch, &[]));
        }
        Ok(report)
    }

    /// Requeues the batch and the unvisited rest of the queue after `error`.
    fn requeue_after(
        &self,
        error: BufCacheError,
        batch: Vec<BufGuard<'_>>,
        rest: &[Arc<Buffer>],
    ) -> BufCacheError {
        for guard in &batch {
            self.queue_buffer(&guard.buffer);
        }
        for buffer in rest {
            self.queue_buffer(buffer);
        }
        error
    }

    /// Locks a queued buffer without waiting and runs its write check and stamp. `None` when
    /// there is nothing to write now (clean, stale, pinned or locked).
    fn prepare(
        &self,
        buffer: &Arc<Buffer>,
        report: &mut FlushReport,
    ) -> Result<Option<BufGuard<'_>>, BufCacheError> {
        buffer.state.hold();
        let Some(locked) = buffer.data.try_lock_arc() else {
            self.release(buffer);
            self.stats.bump(Counter::LockBusy);
            report.busy.push(buffer.key);
            self.queue_buffer(buffer);
            return Ok(None);
        };
        let rank = self.order_token(buffer.key, locked.ops, false);
        let mut guard = BufGuard::new(self, Arc::clone(buffer), locked, rank);
        match buffer.state.write_check() {
            WriteCheck::Nothing => return Ok(None),
            WriteCheck::Pinned => {
                report.pinned.push(buffer.key);
                self.queue_buffer(buffer);
                return Ok(None);
            }
            WriteCheck::Write => {}
        }
        let key = buffer.key;
        let lsn = guard.data.lsn;
        let ops = guard.data.ops;
        if let Err(source) = ops.prepare_write(&mut guard.data.bytes, key.block, lsn) {
            self.queue_buffer(buffer);
            return Err(BufCacheError::WriteVerify {
                block: key.block,
                block_count: key.block_count,
                source,
            });
        }
        Ok(Some(guard))
    }

    /// Writes a run of adjacent prepared buffers with one device write, then marks them clean.
    fn submit(
        &self,
        batch: &mut Vec<BufGuard<'_>>,
        report: &mut FlushReport,
    ) -> Result<(), BufCacheError> {
        let Some(first) = batch.first() else {
            return Ok(());
        };
        let start: FsBlock = first.block();
        let block_count: u32 = batch.iter().map(|g| g.key().block_count).sum();
        let offset = start.0 * u64::from(self.config.block_size);
        for guard in batch.iter() {
            // Stale buffers are filtered in `prepare` and cannot turn stale while locked;
            // writing one would put freed metadata back on disk.
            assert!(
                guard.buffer.state.load() & STALE == 0,
                "stale buffer in write-back"
            );
        }
        let result = if batch.len() == 1 {
            self.device.write_at(offset, &first.data.bytes)
        } else {
            let total: usize = batch.iter().map(|g| g.len()).sum();
            let mut joined = AlignedBuf::zeroed(total);
            let mut at = 0;
            for guard in batch.iter() {
                joined[at..at + guard.len()].copy_from_slice(guard);
                at += guard.len();
            }
            self.device.write_at(offset, &joined)
        };
        if let Err(source) = result {
            return Err(BufCacheError::Write {
                block: start,
                block_count,
                source,
            });
        }
        let written = batch.len() as u64;
        for guard in batch.drain(..) {
            report.bytes_written += guard.len() as u64;
            guard.buffer.state.clear_flags(DIRTY);
        }
        report.buffers_written += written;
        report.write_ops += 1;
        self.stats.add(Counter::Writes, written);
        self.stats.bump(Counter::WriteOps);
        Ok(())
    }

    /// Buffers waiting in the delayed-write queue.
    pub fn delwri_queued(&self) -> usize {
        self.delwri.lock().len()
    }
}
