//! How a tree gets its buffers and blocks: the `Buffers` and `TreeContext` traits, and
//! `CacheContext`, a context over a plain buffer cache.
//!
//! A journal transaction implements `Buffers` in a few lines: `buffer(block, spec, false)` is
//! `get_buf(BufKey::single(block), spec)`, `buffer(block, spec, true)` is `get_new_buf(..)`, and
//! `invalidate(block)` is `invalidate_buf(..)`. Each tree family supplies `TreeContext` on top
//! (the AG trees take blocks from the AG free list, file trees from the allocator).

use rustc_hash::FxHashMap;

use cairn_bufcache::{BufGuard, BufKey, BufferCache, ReadSpec};
use cairn_format::FsBlock;

use crate::TreeError;

/// Buffer access for one operation or transaction. Buffers handed out stay held and locked
/// by the context until it ends, so one block is never locked twice by the same operation.
pub trait Buffers<'c> {
    /// The buffer of block `block`: read and verified with `spec`, or, when `new`, created
    /// zero-filled without reading.
    fn buffer(
        &mut self,
        block: FsBlock,
        spec: &ReadSpec,
        new: bool,
    ) -> Result<&mut BufGuard<'c>, TreeError>;

    /// Marks the buffer of a freed block stale: it is never written home and its pending
    /// changes are dropped.
    fn invalidate(&mut self, block: FsBlock, spec: &ReadSpec) -> Result<(), TreeError>;

    /// Whether this context already holds (locks) the buffer of `block`. The allocator asks it
    /// for AG headers, so a transaction that holds an AG's header never waits for a lower AG's
    /// (AG locks ascend across the whole transaction, not only within one call). Contexts
    /// that keep buffers past one call must answer truthfully; the default suits wrappers whose
    /// owner passes its own context to the allocator.
    fn holds(&mut self, block: FsBlock) -> bool {
        let _ = block;
        false
    }

    /// How many buffers the context holds now: a mark for `release_unchanged_since`.
    fn joined_mark(&mut self) -> usize {
        0
    }

    /// Gives back (unlocks) every buffer taken after `mark` that the context has not
    /// changed (one that cannot tell its own changes may keep more); true when none is left
    /// held. The allocator calls it after an AG it locked could not serve a request, so the
    /// transaction may still lock a lower AG (AG locks ascend over what is held, and that AG
    /// is no longer held). The default keeps everything: safe, but such a failure then ends
    /// the search at the AGs above.
    fn release_unchanged_since(&mut self, mark: usize) -> bool {
        let _ = mark;
        false
    }
}

/// Buffers plus the blocks a tree grows into and shrinks out of.
pub trait TreeContext<'c>: Buffers<'c> {
    /// A block for a split or a new root.
    fn allocate_block(&mut self) -> Result<FsBlock, TreeError>;

    /// Takes back a block a merge or root collapse emptied (`invalidate` was called on it),
    /// or one `allocate_block` gave for an insert that then failed before using it.
    fn free_block(&mut self, block: FsBlock) -> Result<(), TreeError>;
}

/// A context over a `BufferCache` that holds every buffer it hands out until `finish`, and
/// hands out tree blocks from a pool given by its owner (tools and tests; the AG trees wrap
/// its `Buffers` and take blocks from the AG free list instead).
#[derive(Debug)]
pub struct CacheContext<'c> {
    cache: &'c BufferCache,
    /// Keyed by block number; Fx rather than SipHash because a lookup per tree step is on
    /// every search's path and the keys are our own block numbers, not hostile input.
    held: FxHashMap<u64, BufGuard<'c>>,
    /// Blocks in the order they were first handed out, for `release_unchanged_since`.
    joined: Vec<u64>,
    pool: Vec<FsBlock>,
    freed: Vec<FsBlock>,
}

impl<'c> CacheContext<'c> {
    /// A context with no blocks to give.
    pub fn new(cache: &'c BufferCache) -> Self {
        Self::with_pool(cache, Vec::new())
    }

    /// A context that gives out the blocks of `pool` (last first).
    pub fn with_pool(cache: &'c BufferCache, pool: Vec<FsBlock>) -> Self {
        Self {
            cache,
            held: FxHashMap::default(),
            joined: Vec::new(),
            pool,
            freed: Vec::new(),
        }
    }

    pub fn cache(&self) -> &'c BufferCache {
        self.cache
    }

    /// Blocks still in the pool.
    pub fn pool(&self) -> &[FsBlock] {
        &self.pool
    }

    /// Blocks the tree gave back, in order.
    pub fn freed(&self) -> &[FsBlock] {
        &self.freed
    }

    /// Moves freed blocks back into the pool (they are reusable once the free is durable;
    /// tests without a journal may reuse them at once).
    pub fn recycle_freed(&mut self) {
        self.pool.append(&mut self.freed);
    }

    /// Number of buffers held.
    pub fn held_count(&self) -> usize {
        self.held.len()
    }

    /// Ends the operation: dirty buffers are queued for write-back, all are released.
    pub fn release_all(&mut self) {
        self.joined.clear();
        for (_, guard) in self.held.drain() {
            if guard.is_dirty() {
                guard.queue_delwri();
            }
        }
    }
}

impl Drop for CacheContext<'_> {
    fn drop(&mut self) {
        self.release_all();
    }
}

fn buffer_error(block: FsBlock) -> impl FnOnce(cairn_bufcache::BufCacheError) -> TreeError {
    move |source| TreeError::Buffer {
        block: block.0,
        source,
    }
}

impl<'c> Buffers<'c> for CacheContext<'c> {
    fn buffer(
        &mut self,
        block: FsBlock,
        spec: &ReadSpec,
        new: bool,
    ) -> Result<&mut BufGuard<'c>, TreeError> {
        use std::collections::hash_map::Entry;
        let key = BufKey::single(block.0);
        match self.held.entry(block.0) {
            Entry::Occupied(slot) => {
                let guard = slot.into_mut();
                if new {
                    let len = guard.len();
                    guard
                        .bytes_mut(0..len)
                        .map_err(buffer_error(block))?
                        .fill(0);
                }
                Ok(guard)
            }
            Entry::Vacant(slot) => {
                let guard = if new {
                    self.cache.get_new(key, spec)
                } else {
                    self.cache.get(key, spec)
                }
                .map_err(buffer_error(block))?;
                self.joined.push(block.0);
                Ok(slot.insert(guard))
            }
        }
    }

    fn invalidate(&mut self, block: FsBlock, spec: &ReadSpec) -> Result<(), TreeError> {
        let mut guard = match self.held.remove(&block.0) {
            Some(guard) => guard,
            None => self
                .cache
                .get_new(BufKey::single(block.0), spec)
                .map_err(buffer_error(block))?,
        };
        guard.mark_stale();
        Ok(())
    }

    fn holds(&mut self, block: FsBlock) -> bool {
        self.held.contains_key(&block.0)
    }

    fn joined_mark(&mut self) -> usize {
        self.joined.len()
    }

    /// Without a journal this context cannot tell its own changes from earlier ones, so
    /// it gives back only clean buffers (nothing waiting to be written home).
    fn release_unchanged_since(&mut self, mark: usize) -> bool {
        let from = mark.min(self.joined.len());
        let mut kept = Vec::new();
        for block in self.joined.drain(from..).collect::<Vec<_>>() {
            match self.held.get(&block) {
                Some(guard) if guard.is_dirty() || guard.is_stale() => kept.push(block),
                Some(_) => drop(self.held.remove(&block)),
                None => {}
            }
        }
        let all_released = kept.is_empty();
        self.joined.extend(kept);
        all_released
    }
}

impl<'c> TreeContext<'c> for CacheContext<'c> {
    fn allocate_block(&mut self) -> Result<FsBlock, TreeError> {
        self.pool.pop().ok_or_else(|| TreeError::NoSpace {
            why: "the context's block pool is empty".into(),
        })
    }

    fn free_block(&mut self, block: FsBlock) -> Result<(), TreeError> {
        self.freed.push(block);
        Ok(())
    }
}
