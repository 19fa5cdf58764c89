//! `BufGuard`: a held, locked buffer as returned by a lookup.

use std::fmt;
use std::ops::{Deref, Range};
use std::sync::Arc;

use cairn_format::{FsBlock, Lsn};
use parking_lot::{ArcMutexGuard, RawMutex};

use crate::BufCacheError;
use crate::buffer::{BufData, BufHandle, BufKey, Buffer};
use crate::cache::BufferCache;
use crate::ops::LRU_REF_MAX;
use crate::state::{DIRTY, STALE, pins};

/// A held and locked buffer. Reads go through `Deref<Target = [u8]>`; every write goes through
/// a method that records the dirty byte range, so nothing can change the contents unlogged.
/// Dropping the guard unlocks the buffer and releases the hold.
pub struct BufGuard<'c> {
    cache: &'c BufferCache,
    pub(crate) buffer: Arc<Buffer>,
    // Dropped after `Drop::drop` released the hold: unlocking last is harmless because reclaim
    // only takes clean buffers, whose contents match the disk.
    pub(crate) data: ArcMutexGuard<RawMutex, BufData>,
    // The lock's place in the lock order (debug builds), forgotten after the unlock.
    _rank: cairn_lockrank::Token,
}

impl fmt::Debug for BufGuard<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufGuard")
            .field("key", &self.buffer.key)
            .field("dirty", &self.data.dirty)
            .finish_non_exhaustive()
    }
}

impl Drop for BufGuard<'_> {
    fn drop(&mut self) {
        self.cache.release(&self.buffer);
    }
}

impl Deref for BufGuard<'_> {
    type Target = [u8];

    #[inline]
    fn deref(&self) -> &[u8] {
        &self.data.bytes
    }
}

impl<'c> BufGuard<'c> {
    pub(crate) fn new(
        cache: &'c BufferCache,
        buffer: Arc<Buffer>,
        data: ArcMutexGuard<RawMutex, BufData>,
        rank: cairn_lockrank::Token,
    ) -> Self {
        Self {
            cache,
            buffer,
            data,
            _rank: rank,
        }
    }

    pub fn key(&self) -> BufKey {
        self.buffer.key
    }

    pub fn block(&self) -> FsBlock {
        self.buffer.key.block
    }

    fn check_range(&self, range: &Range<usize>) -> Result<(), BufCacheError> {
        let len_bytes = self.data.bytes.len();
        if range.start > range.end || range.end > len_bytes {
            return Err(BufCacheError::Range {
                block: self.block(),
                start: range.start,
                end: range.end,
                len_bytes,
            });
        }
        Ok(())
    }

    /// Records that `range` changed. The buffer becomes dirty (needs write-back) unless it is
    /// stale, and the range joins those the journal will take.
    pub fn mark_dirty(&mut self, range: Range<usize>) -> Result<(), BufCacheError> {
        self.check_range(&range)?;
        if range.is_empty() {
            return Ok(());
        }
        self.data.dirty.add(range);
        self.buffer.state.mark_dirty();
        Ok(())
    }

    /// The bytes of `range` for writing; the range is marked dirty.
    pub fn bytes_mut(&mut self, range: Range<usize>) -> Result<&mut [u8], BufCacheError> {
        self.mark_dirty(range.clone())?;
        Ok(&mut self.data.bytes[range])
    }

    /// Copies `bytes` in at `offset` and marks that range dirty.
    pub fn write(&mut self, offset: usize, bytes: &[u8]) -> Result<(), BufCacheError> {
        let end = offset
            .checked_add(bytes.len())
            .ok_or(BufCacheError::Range {
                block: self.block(),
                start: offset,
                end: usize::MAX,
                len_bytes: self.data.bytes.len(),
            })?;
        self.bytes_mut(offset..end)?.copy_from_slice(bytes);
        Ok(())
    }

    /// Whether the buffer has changes not yet written home.
    pub fn is_dirty(&self) -> bool {
        self.buffer.state.load() & DIRTY != 0
    }

    /// Byte ranges changed since the journal last took them (sorted, merged).
    pub fn dirty_ranges(&self) -> &[Range<usize>] {
        self.data.dirty.as_slice()
    }

    /// Takes the changed ranges for logging. The buffer stays dirty until written home.
    pub fn take_dirty_ranges(&mut self) -> Vec<Range<usize>> {
        self.data.dirty.take()
    }

    /// Sets the LSN stamped into the block when it is written home.
    pub fn set_lsn(&mut self, lsn: Lsn) {
        self.data.lsn = Some(lsn);
    }

    pub fn lsn(&self) -> Option<Lsn> {
        self.data.lsn
    }

    /// Pins the buffer: its changes are in the log but not checkpointed, so it may not be
    /// written home (nor reclaimed) until the matching `BufHandle::unpin`.
    pub fn pin(&self) {
        self.buffer.state.pin();
    }

    pub fn pin_count(&self) -> u32 {
        pins(self.buffer.state.load())
    }

    /// An unlocked reference for the journal (to unpin later).
    pub fn handle(&self) -> BufHandle {
        BufHandle {
            buffer: Arc::clone(&self.buffer),
        }
    }

    /// Marks the buffer stale: its block was freed. Pending changes are dropped, it is never
    /// written home, its lookaside slot is cleared, and the next lookup of its block gets a
    /// fresh buffer, whatever length it asks for.
    pub fn mark_stale(&mut self) {
        self.data.dirty.clear();
        self.cache.invalidate(&self.buffer);
    }

    pub fn is_stale(&self) -> bool {
        self.buffer.state.load() & STALE != 0
    }

    /// Queues the buffer for delayed write-back; returns false if it was queued already.
    pub fn queue_delwri(&self) -> bool {
        self.cache.queue_buffer(&self.buffer)
    }

    /// Sets how many reclaim passes the buffer survives at zero holds (clamped).
    pub fn set_lru_ref(&self, lru_ref: u32) {
        let lru_ref = lru_ref.min(LRU_REF_MAX);
        self.buffer
            .lru_ref
            .store(lru_ref, std::sync::atomic::Ordering::Relaxed);
    }
}
