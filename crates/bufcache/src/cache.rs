//! The cache itself: construction, the three lookups and the paths behind them.
//!
//! Lock order: a buffer's lock may be held while taking a shard lock (marking stale does), but
//! a shard lock is never held while waiting for a buffer lock, and no shard lock is held across
//! device I/O. The LRU and delwri queue mutexes are leaf locks, held only to push or pop.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use cairn_blockdev::{AlignedBuf, BlockDevice};
use cairn_format::MetaKind;
use cairn_lockrank::{Mutex, Order, Rank, Token, acquire};
use crossbeam::utils::CachePadded;

use crate::BufCacheError;
use crate::buffer::{BufKey, Buffer};
use crate::config::{AgMap, BUFFER_BYTES_MAX, CacheConfig};
use crate::guard::BufGuard;
use crate::lookaside::{Fill, Lookaside, Source};
use crate::ops::{BufferOps, LRU_REF_MAX, ReadSpec};
use crate::shard::{AgShard, Index};
use crate::state::{DEAD, DELWRI_Q, STALE};
use crate::stats::{Counter, Stats, StatsSnapshot};

/// What a lookup does when the buffer is not cached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Read it from the device and verify it.
    Read,
    /// Hand out zeroed contents without reading (a newly allocated block).
    Create,
}

/// What a lookup does when the buffer is locked by someone else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    Block,
    Try,
}

/// Result of the write-locked slow path.
pub(crate) enum Found<'c> {
    Cached(Arc<Buffer>),
    Inserted(BufGuard<'c>),
}

/// The metadata buffer cache of one filesystem; see the crate documentation.
pub struct BufferCache {
    pub(crate) config: CacheConfig,
    ag_map: AgMap,
    pub(crate) device: Arc<dyn BlockDevice>,
    device_blocks: u64,
    pub(crate) shards: Box<[CachePadded<AgShard>]>,
    pub(crate) lookaside: Lookaside,
    pub(crate) lru: CachePadded<Mutex<VecDeque<Arc<Buffer>>>>,
    pub(crate) reclaim_lock: Mutex<()>,
    pub(crate) delwri: Mutex<Vec<Arc<Buffer>>>,
    pub(crate) memory_bytes: CachePadded<AtomicU64>,
    pub(crate) stats: Stats,
}

impl Drop for BufferCache {
    /// Releases the buffers this thread's lookaside slots own for this cache; other threads
    /// drop theirs when they next make a table (`lookaside.rs`).
    fn drop(&mut self) {
        self.lookaside.forget_this_thread();
    }
}

impl fmt::Debug for BufferCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufferCache")
            .field("config", &self.config)
            .field("device", &self.device)
            .field("memory_bytes", &self.memory_bytes())
            .finish_non_exhaustive()
    }
}

impl BufferCache {
    /// A cache over `device`, or `Config` when `config` does not fit the device.
    pub fn new(config: CacheConfig, device: Arc<dyn BlockDevice>) -> Result<Self, BufCacheError> {
        config.validate(device.size_bytes(), device.logical_sector_size())?;
        let shards = (0..config.ag_count)
            .map(|_| CachePadded::new(AgShard::new()))
            .collect();
        let lookaside = Lookaside::new(config.lookaside_slots, config.ag_count as usize);
        Ok(Self {
            config,
            ag_map: AgMap::new(config.ag_blocks),
            device_blocks: device.size_bytes() / u64::from(config.block_size),
            device,
            shards,
            lookaside,
            lru: CachePadded::new(Mutex::new(Rank::BufferLists, VecDeque::new())),
            reclaim_lock: Mutex::new(Rank::BufferReclaim, ()),
            delwri: Mutex::new(Rank::BufferLists, Vec::new()),
            memory_bytes: CachePadded::new(AtomicU64::new(0)),
            stats: Stats::new(),
        })
    }

    pub fn config(&self) -> &CacheConfig {
        &self.config
    }

    /// Bytes of buffers currently in the index.
    pub fn memory_bytes(&self) -> u64 {
        self.memory_bytes.load(Ordering::Relaxed)
    }

    pub fn stats(&self) -> StatsSnapshot {
        self.stats.snapshot(self.config.lookaside_slots > 0)
    }

    /// Number of buffers in the index (stale ones included).
    pub fn cached_count(&self) -> usize {
        self.shards.iter().map(|s| s.index.read().len()).sum()
    }

    /// The buffer at `key`, held and locked, read from the device and verified with
    /// `spec` if it is not cached. Waits for the lock if another holder has it.
    #[track_caller]
    pub fn get(&self, key: BufKey, spec: &ReadSpec) -> Result<BufGuard<'_>, BufCacheError> {
        self.lookup(key, spec, Mode::Read, Wait::Block)
    }

    /// Like `get`, but fails with `WouldBlock` instead of waiting for a locked buffer.
    #[track_caller]
    pub fn try_get(&self, key: BufKey, spec: &ReadSpec) -> Result<BufGuard<'_>, BufCacheError> {
        self.lookup(key, spec, Mode::Read, Wait::Try)
    }

    /// The buffer at `key` for a newly allocated block: held, locked and zero-filled, never
    /// read. A cached copy is reused and zeroed; `spec.ops` is used for its write-back.
    #[track_caller]
    pub fn get_new(&self, key: BufKey, spec: &ReadSpec) -> Result<BufGuard<'_>, BufCacheError> {
        self.lookup(key, spec, Mode::Create, Wait::Block)
    }

    /// Like `get_new`, but fails with `WouldBlock` instead of waiting for a locked buffer.
    #[track_caller]
    pub fn try_get_new(&self, key: BufKey, spec: &ReadSpec) -> Result<BufGuard<'_>, BufCacheError> {
        self.lookup(key, spec, Mode::Create, Wait::Try)
    }

    /// Whether a live buffer for `key` is cached, found the way `get` finds it (lookaside, then
    /// index) but without taking a hold, locking, reading or counting anything: the lookup
    /// step alone (XFS's `xfs_buf_incore`). The answer can be out of date at once. (It may
    /// drop stale or dead buffers from this thread's lookaside slots, and counts that.)
    pub fn is_cached(&self, key: BufKey) -> bool {
        let Ok((ag, ag_block)) = self.locate(key) else {
            return false;
        };
        let shard = &self.shards[ag];
        let generation = shard.generation();
        if self
            .lookaside
            .peek(ag, ag_block, key, generation, &self.stats)
        {
            return true;
        }
        let live = |buffer: &Arc<Buffer>| buffer.state.is_live();
        shard.index.read().get(&key).is_some_and(live)
    }

    #[track_caller]
    fn lookup(
        &self,
        key: BufKey,
        spec: &ReadSpec,
        mode: Mode,
        wait: Wait,
    ) -> Result<BufGuard<'_>, BufCacheError> {
        let (ag, ag_block) = self.locate(key)?;
        let shard = &self.shards[ag];
        // Each pass either returns or found a buffer that went stale, or whose first read
        // failed, while it waited. Later passes go straight to the write-locked path, which
        // replaces or re-reads it, so a bad entry on the fast paths cannot make us spin.
        let mut fast_path = true;
        loop {
            let cached = if fast_path {
                self.find_cached(shard, ag, key, ag_block)
            } else {
                None
            };
            fast_path = false;
            let (buffer, source) = match cached {
                Some(found) => found,
                None => match self.find_or_insert(shard, ag, key, ag_block, spec)? {
                    Found::Cached(buffer) => {
                        self.offer_slot(ag, ag_block, &buffer, Fill::IndexHit);
                        (buffer, Source::Index)
                    }
                    Found::Inserted(guard) => return self.fill_inserted(guard, spec, mode),
                },
            };
            if let Some(guard) = self.lock_found(key, buffer, spec.ops, wait)? {
                return Ok(self.finish_hit(guard, spec, mode, source));
            }
        }
    }

    /// Records a buffer lock in the lock order (debug builds): every AGI before every AGF,
    /// each kind by ascending AG (XFS's order); every other buffer is ordered by the lock of
    /// its owner.
    /// `wait` is false where the lock was taken without waiting.
    #[track_caller]
    #[inline]
    pub(crate) fn order_token(&self, key: BufKey, ops: &dyn BufferOps, wait: bool) -> Token {
        if !cairn_lockrank::CHECKS_ENABLED {
            return acquire(Rank::Buffer, 0, Order::Ranked, wait);
        }
        let ag = self.ag_map.split(key.block).0;
        let (rank, order_key) = match ops.kind() {
            Some(MetaKind::Agi) => (Rank::AgHeader, ag),
            Some(MetaKind::Agf) => (Rank::AgHeader, u64::from(self.config.ag_count) + ag),
            _ => (Rank::Buffer, key.block.0),
        };
        acquire(rank, order_key, Order::Ranked, wait)
    }

    /// Checks `key` and returns its AG index and AG-relative block.
    #[inline]
    pub(crate) fn locate(&self, key: BufKey) -> Result<(usize, u32), BufCacheError> {
        let bad = |why| BufCacheError::BadAddress {
            block: key.block,
            block_count: key.block_count,
            why,
        };
        let bytes = u64::from(key.block_count) * u64::from(self.config.block_size);
        if key.block_count == 0 || bytes > BUFFER_BYTES_MAX {
            return Err(bad("length must be 1 block to 64 KiB"));
        }
        let (ag, ag_block) = self.ag_map.split(key.block);
        if ag >= u64::from(self.config.ag_count) || key.end() > self.device_blocks {
            return Err(bad("past the end of the filesystem"));
        }
        if u64::from(ag_block) + u64::from(key.block_count) > u64::from(self.config.ag_blocks) {
            return Err(bad("crosses an allocation group boundary"));
        }
        Ok((ag as usize, ag_block))
    }

    /// Takes a hold on `buffer` unless it is stale or dead.
    #[inline]
    fn hold_live(&self, buffer: &Arc<Buffer>) -> bool {
        if !buffer.state.hold_live() {
            self.release(buffer);
            return false;
        }
        true
    }

    /// This thread's lookaside slot (no lock), then the index under the read lock; an index
    /// hit may then take the slot (one thread-local table access for both). Returns a held
    /// buffer.
    #[inline]
    fn find_cached(
        &self,
        shard: &AgShard,
        ag: usize,
        key: BufKey,
        ag_block: u32,
    ) -> Option<(Arc<Buffer>, Source)> {
        if !self.lookaside.is_on() {
            return self
                .index_hit(shard, key)
                .map(|buffer| (buffer, Source::Index));
        }
        let hold = |buffer: &Arc<Buffer>| self.hold_live(buffer);
        let index = || self.index_hit(shard, key);
        let generation = shard.generation();
        self.lookaside
            .find((ag, ag_block), key, generation, &self.stats, hold, index)
    }

    /// The index's live buffer for `key`, held, under the AG's read lock.
    #[inline(always)]
    fn index_hit(&self, shard: &AgShard, key: BufKey) -> Option<Arc<Buffer>> {
        let index = shard.index.read();
        let buffer = index.get(&key)?;
        // A stale entry is replaced by the write-locked path.
        self.hold_live(buffer).then(|| Arc::clone(buffer))
    }

    /// Offers a held buffer to this thread's slot. It may turn stale or dead at any time
    /// after; a slot hit checks that again, so that is harmless.
    #[inline]
    fn offer_slot(&self, ag: usize, ag_block: u32, buffer: &Arc<Buffer>, fill: Fill) {
        let generation = self.shards[ag].generation();
        self.lookaside
            .offer(ag, ag_block, buffer, fill, generation, &self.stats);
    }

    /// Under the write lock: drops stale buffers at `key.block`, refuses a live buffer of
    /// another length there, and returns the cached buffer or inserts a new one, locked.
    #[track_caller]
    pub(crate) fn find_or_insert(
        &self,
        shard: &AgShard,
        ag: usize,
        key: BufKey,
        ag_block: u32,
        spec: &ReadSpec,
    ) -> Result<Found<'_>, BufCacheError> {
        let bytes_len = key.block_count as usize * self.config.block_size as usize;
        // Allocated before the lock so the lock is held only for the index update.
        let bytes = AlignedBuf::zeroed(bytes_len);
        let mut index = shard.index.write();
        let low = BufKey::new(key.block, 0);
        let high = BufKey::new(key.block, u32::MAX);
        let same_start: Vec<Arc<Buffer>> = index
            .range(low..=high)
            .map(|(_, b)| Arc::clone(b))
            .collect();
        for buffer in same_start {
            if buffer.state.load() & STALE != 0 {
                self.remove_locked(shard, &mut index, &buffer);
                self.stats.bump(Counter::StaleLookups);
            } else if buffer.key == key {
                // Live and in the index, and both change only under this write lock.
                buffer.state.hold();
                return Ok(Found::Cached(buffer));
            } else {
                return Err(BufCacheError::LengthMismatch {
                    block: key.block,
                    cached_blocks: buffer.key.block_count,
                    requested_blocks: key.block_count,
                });
            }
        }
        let buffer = Arc::new(Buffer::new(key, ag, bytes, spec.ops));
        buffer
            .lru_ref
            .store(spec.lru_ref.min(LRU_REF_MAX), Ordering::Relaxed);
        // Nobody else can see the buffer yet, so this lock is free (nothing to wait for).
        let locked = buffer.data.lock_arc();
        let rank = self.order_token(key, spec.ops, false);
        index.insert(key, Arc::clone(&buffer));
        self.memory_bytes
            .fetch_add(bytes_len as u64, Ordering::Relaxed);
        drop(index);
        self.offer_slot(ag, ag_block, &buffer, Fill::Insert);
        Ok(Found::Inserted(BufGuard::new(self, buffer, locked, rank)))
    }

    /// Removes `buffer` from the index, marking it dead first, then bumps the AG's
    /// generation (other threads' slots drop it) and clears this thread's slot. Caller holds
    /// the shard's write lock (`index` is its contents).
    pub(crate) fn remove_locked(&self, shard: &AgShard, index: &mut Index, buffer: &Arc<Buffer>) {
        buffer.state.set_flags(DEAD);
        let key = buffer.key;
        if index.get(&key).is_some_and(|b| Arc::ptr_eq(b, buffer)) {
            index.remove(&key);
            let bytes = buffer.len_bytes(self.config.block_size);
            self.memory_bytes.fetch_sub(bytes, Ordering::Relaxed);
        }
        shard.bump_generation();
        self.clear_own_slot(shard, buffer);
    }

    fn clear_own_slot(&self, shard: &AgShard, buffer: &Arc<Buffer>) {
        let (_, ag_block) = self.ag_map.split(buffer.key.block);
        self.lookaside
            .clear(buffer.ag, ag_block, buffer, shard.generation(), &self.stats);
    }

    /// Completes a miss: reads and verifies (or zero-fills) the new buffer, which the caller
    /// holds locked, so concurrent lookups of the same block wait for it instead of reading.
    fn fill_inserted<'c>(
        &'c self,
        mut guard: BufGuard<'c>,
        spec: &ReadSpec,
        mode: Mode,
    ) -> Result<BufGuard<'c>, BufCacheError> {
        self.stats.bump(Counter::Misses);
        if mode == Mode::Read
            && let Err(error) = self.read_into(&mut guard, spec)
        {
            self.stats.bump(Counter::ReadFailures);
            let shard = &self.shards[guard.buffer.ag];
            self.remove_locked(shard, &mut shard.index.write(), &guard.buffer);
            return Err(error);
        }
        guard.data.uptodate = true;
        self.maybe_reclaim();
        Ok(guard)
    }

    fn read_into(&self, guard: &mut BufGuard<'_>, spec: &ReadSpec) -> Result<(), BufCacheError> {
        let key = guard.buffer.key;
        let offset = key.block.0 * u64::from(self.config.block_size);
        self.stats.bump(Counter::Reads);
        self.device
            .read_at(offset, &mut guard.data.bytes)
            .map_err(|source| BufCacheError::Read {
                block: key.block,
                block_count: key.block_count,
                source,
            })?;
        spec.ops
            .verify_read(&guard.data.bytes, key.block, spec)
            .map_err(|source| BufCacheError::Verify {
                block: key.block,
                block_count: key.block_count,
                source,
            })
    }

    /// Locks a held buffer found in the cache. `None` when it turned stale or its first read
    /// failed while we waited (the hold is released and the caller looks again).
    #[track_caller]
    fn lock_found(
        &self,
        key: BufKey,
        buffer: Arc<Buffer>,
        ops: &dyn BufferOps,
        wait: Wait,
    ) -> Result<Option<BufGuard<'_>>, BufCacheError> {
        // Checked before waiting on its lock: a wrong buffer (a broken slot or index) must fail
        // here, not deadlock on a lock the caller holds, nor hand out another block's bytes.
        assert_eq!(buffer.key, key, "lookup of {key:?} found another buffer");
        let (locked, rank) = match wait {
            Wait::Block => {
                let rank = self.order_token(key, ops, true);
                (buffer.data.lock_arc(), rank)
            }
            Wait::Try => match buffer.data.try_lock_arc() {
                Some(locked) => (locked, self.order_token(key, ops, false)),
                None => {
                    self.release(&buffer);
                    self.stats.bump(Counter::LockBusy);
                    return Err(BufCacheError::WouldBlock {
                        block: buffer.key.block,
                    });
                }
            },
        };
        let guard = BufGuard::new(self, buffer, locked, rank);
        // Marking stale needs the buffer lock, and a failed first read leaves the buffer not
        // up to date, so what is checked here cannot change while the guard lives.
        if !guard.buffer.state.is_live() || !guard.data.uptodate {
            return Ok(None);
        }
        Ok(Some(guard))
    }

    #[inline]
    fn finish_hit<'c>(
        &'c self,
        mut guard: BufGuard<'c>,
        spec: &ReadSpec,
        mode: Mode,
        source: Source,
    ) -> BufGuard<'c> {
        self.stats.bump(match source {
            Source::Lookaside => Counter::LookasideHits,
            Source::Index => Counter::IndexHits,
        });
        let lru_ref = spec.lru_ref.min(LRU_REF_MAX);
        if guard.buffer.lru_ref.load(Ordering::Relaxed) != lru_ref {
            guard.buffer.lru_ref.store(lru_ref, Ordering::Relaxed);
        }
        if mode == Mode::Create {
            guard.data.bytes.fill(0);
        }
        guard
    }

    /// Drops one hold; the last one puts the buffer on the LRU if it is not there yet.
    #[inline]
    pub(crate) fn release(&self, buffer: &Arc<Buffer>) {
        if buffer.state.release() {
            self.lru_add(buffer);
        }
    }

    fn lru_add(&self, buffer: &Arc<Buffer>) {
        self.lru.lock().push_back(Arc::clone(buffer));
    }

    /// Marks a buffer stale (the caller holds its lock): it is never written home, its slot is
    /// cleared, and the next lookup of its block replaces it.
    pub(crate) fn invalidate(&self, buffer: &Arc<Buffer>) {
        let shard = &self.shards[buffer.ag];
        let _index = shard.index.write();
        buffer.state.mark_stale();
        shard.bump_generation();
        self.clear_own_slot(shard, buffer);
    }

    /// Puts a buffer on the delayed-write queue unless it is there already.
    pub(crate) fn queue_buffer(&self, buffer: &Arc<Buffer>) -> bool {
        let fresh = buffer.state.claim(DELWRI_Q);
        if fresh {
            self.delwri.lock().push(Arc::clone(buffer));
        }
        fresh
    }

    pub(crate) fn slot_of(&self, block: u64) -> Option<usize> {
        let slots = self.config.lookaside_slots;
        (slots > 0).then(|| (self.ag_map.split(cairn_format::FsBlock(block)).1 % slots) as usize)
    }
}
