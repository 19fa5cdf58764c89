//! The per-inode half of the cache: the shared tree object and the handle the fs holds.
//!
//! Locking: `InodeTree::inner` is a reader-writer lock per inode. Lookups take it shared and
//! set referenced bits with relaxed atomics; edits take it exclusive. The shrinker only ever
//! `try_write`s it, so a lookup or edit waits for the shrinker at most while the shrinker works
//! on this very inode, for one bounded visit. Lock order when both are held: tree, then the
//! reclaim list.

use crate::cache::Shared;
use crate::error::ExtCacheError;
use crate::extent::{Extent, ExtentState, check_range};
use crate::reclaim::NO_SLOT;
use crate::tree::TreeInner;
use cairn_lockrank::{Rank, RwLock};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

/// One inode's tree plus what the shrinker and the statistics read without its lock.
#[derive(Debug)]
pub(crate) struct InodeTree {
    pub(crate) ino: u64,
    pub(crate) inner: RwLock<TreeInner>,
    /// Mirror of the tree's entry count, written under the write lock.
    pub(crate) object_count: AtomicU64,
    /// Mirror of the tree's delayed-entry count, written under the write lock.
    pub(crate) delayed_count: AtomicU64,
    /// Set on every use; the shrinker clears it and passes the inode over once.
    pub(crate) referenced: AtomicBool,
    /// Slot on the reclaim list, or `NO_SLOT`. Written only under the list lock.
    pub(crate) list_slot: AtomicU32,
}

impl InodeTree {
    fn new(ino: u64) -> Self {
        InodeTree {
            ino,
            inner: RwLock::new(Rank::ExtentTree, TreeInner::default()),
            object_count: AtomicU64::new(0),
            delayed_count: AtomicU64::new(0),
            referenced: AtomicBool::new(false),
            list_slot: AtomicU32::new(NO_SLOT),
        }
    }

    #[cfg(test)]
    pub(crate) fn new_for_test(ino: u64) -> Self {
        InodeTree::new(ino)
    }

    pub(crate) fn mark_referenced(&self) {
        if !self.referenced.load(Ordering::Relaxed) {
            self.referenced.store(true, Ordering::Relaxed);
        }
    }

    /// After an edit under the write lock: publishes the new counts, and links the inode to
    /// the reclaim list when it gained its first entry or unlinks it when it lost its last.
    pub(crate) fn settle(
        self: &Arc<Self>,
        shared: &Shared,
        inner: &TreeInner,
        objects_before: u64,
        delayed_before: u64,
    ) {
        let (objects_after, delayed_after) = (inner.len(), inner.delayed_count());
        self.object_count.store(objects_after, Ordering::Relaxed);
        self.delayed_count.store(delayed_after, Ordering::Relaxed);
        shared
            .stats
            .apply_delta(objects_before, objects_after, delayed_before, delayed_after);
        if objects_before == 0 && objects_after > 0 {
            shared.link(self);
        } else if objects_before > 0 && objects_after == 0 {
            shared.unlink(self);
        }
    }
}

/// The fs's handle on one inode's extent status tree. Held by the in-core inode, one per
/// inode; dropping it (inode eviction) frees the inode's entries and takes it off the list.
#[derive(Debug)]
pub struct InodeExtents {
    tree: Arc<InodeTree>,
    shared: Arc<Shared>,
}

/// A pin on a logical range of one inode: while it lives, the shrinker keeps every entry that
/// overlaps the range. Taken by an operation that relies on cached entries staying cached.
#[derive(Debug)]
pub struct RangePin {
    tree: Arc<InodeTree>,
    pin_id: u64,
}

impl Drop for RangePin {
    fn drop(&mut self) {
        self.tree.inner.write().unpin(self.pin_id);
    }
}

impl InodeExtents {
    pub(crate) fn new(ino: u64, shared: Arc<Shared>) -> Self {
        InodeExtents {
            tree: Arc::new(InodeTree::new(ino)),
            shared,
        }
    }

    /// The inode number given to `ExtentCache::open_inode`.
    pub fn ino(&self) -> u64 {
        self.tree.ino
    }

    /// Entries cached for this inode.
    pub fn object_count(&self) -> u64 {
        self.tree.object_count.load(Ordering::Relaxed)
    }

    /// What is cached at `block`: the whole entry holding it (start, length, state), so the
    /// caller sees how far the answer extends. `None` is a miss: ask the on-disk map, then
    /// `fill`. Counts a hit or a miss and marks the entry and the inode as recently used.
    pub fn lookup(&self, block: u64) -> Option<Extent> {
        let inner = self.tree.inner.read();
        let found = inner.lookup(block).map(|(start, entry)| {
            entry.mark_referenced();
            entry.to_extent(start)
        });
        drop(inner);
        self.tree.mark_referenced();
        match found {
            Some(_) => self.shared.stats.hits.add(1),
            None => self.shared.stats.misses.add(1),
        }
        found
    }

    /// Cached entries overlapping `[start, start + block_count)`, whole and in order (for
    /// FIEMAP and SEEK_DATA/SEEK_HOLE). Gaps between them are not cached. Counts no hit/miss.
    pub fn cached_extents(
        &self,
        start: u64,
        block_count: u64,
    ) -> Result<Vec<Extent>, ExtCacheError> {
        let end = check_range(start, block_count)?;
        Ok(self.tree.inner.read().overlapping(start, end).collect())
    }

    /// Runs an edit under the write lock and publishes its effect on the counts.
    fn edit<R>(&self, change: impl FnOnce(&mut TreeInner) -> R) -> R {
        let mut inner = self.tree.inner.write();
        let (objects_before, delayed_before) = (inner.len(), inner.delayed_count());
        let result = change(&mut inner);
        self.tree
            .settle(&self.shared, &inner, objects_before, delayed_before);
        drop(inner);
        self.tree.mark_referenced();
        self.shared.note_growth();
        result
    }

    /// Caches what the on-disk map says for `[start, start + block_count)` after a miss:
    /// `mapped` holds the written/unwritten (or explicit hole) extents found there, sorted
    /// and disjoint; every gap between them is cached as a hole. Delayed entries in the range
    /// are kept, since they are newer than the disk. Returns the blocks cached.
    pub fn fill(
        &self,
        start: u64,
        block_count: u64,
        mapped: &[Extent],
    ) -> Result<u64, ExtCacheError> {
        let end = check_range(start, block_count)?;
        validate_fill(start, block_count, mapped)?;
        Ok(self.edit(|inner| inner.fill(start, end, mapped)))
    }

    /// Caches `extent` over whatever was cached in its range, merging with compatible
    /// neighbours. Used after allocation (written or unwritten), for delayed allocation, for
    /// punching (`ExtentState::Hole`) and when a conversion's physical blocks are known.
    pub fn insert(&self, extent: Extent) -> Result<(), ExtCacheError> {
        extent.validate()?;
        self.edit(|inner| inner.insert(extent));
        Ok(())
    }

    /// Turns the cached unwritten blocks of the range into written blocks at the same
    /// physical address (unwritten conversion after the data write). Uncached parts stay
    /// uncached. Returns the blocks converted.
    pub fn convert_unwritten(&self, start: u64, block_count: u64) -> Result<u64, ExtCacheError> {
        let end = check_range(start, block_count)?;
        Ok(self.edit(|inner| inner.convert_unwritten(start, end)))
    }

    /// Forgets everything cached in the range, splitting entries at its ends; later lookups
    /// there miss and go to disk. Returns the blocks that were cached.
    pub fn remove_range(&self, start: u64, block_count: u64) -> Result<u64, ExtCacheError> {
        let end = check_range(start, block_count)?;
        Ok(self.edit(|inner| inner.cut(start, end)))
    }

    /// Forgets everything from `first_removed_block` on (truncate). Returns the blocks that
    /// were cached there.
    pub fn truncate(&self, first_removed_block: u64) -> u64 {
        let block_count = u64::MAX - first_removed_block;
        if block_count == 0 {
            return 0;
        }
        self.edit(|inner| inner.cut(first_removed_block, u64::MAX))
    }

    /// Pins `[start, start + block_count)` against the shrinker until the pin is dropped.
    pub fn pin_range(&self, start: u64, block_count: u64) -> Result<RangePin, ExtCacheError> {
        let end = check_range(start, block_count)?;
        let pin_id = self.tree.inner.write().pin(start, end);
        Ok(RangePin {
            tree: Arc::clone(&self.tree),
            pin_id,
        })
    }

    /// Pins currently held on this inode.
    pub fn pin_count(&self) -> usize {
        self.tree.inner.read().pin_count()
    }

    /// The tree's own invariants, and that its published counts and its place on the reclaim
    /// list agree with it. Call when no other thread edits this inode.
    pub fn check_invariants(&self) -> Result<(), ExtCacheError> {
        let inner = self.tree.inner.read();
        inner.check_invariants()?;
        let broken = |what: String| Err(ExtCacheError::Invariant { what });
        let published = self.tree.object_count.load(Ordering::Relaxed);
        if published != inner.len() {
            return broken(format!(
                "inode {}: {published} objects published, {} held",
                self.ino(),
                inner.len()
            ));
        }
        if self.tree.delayed_count.load(Ordering::Relaxed) != inner.delayed_count() {
            return broken(format!("inode {}: delayed count not published", self.ino()));
        }
        let linked = self.tree.list_slot.load(Ordering::Relaxed) != NO_SLOT;
        if linked != (inner.len() > 0) {
            return broken(format!(
                "inode {}: on list {linked} with {} objects",
                self.ino(),
                inner.len()
            ));
        }
        Ok(())
    }
}

impl Drop for InodeExtents {
    /// Takes the inode off the reclaim list first (so the shrinker stops finding it), then
    /// frees its entries and returns them to the global count.
    fn drop(&mut self) {
        let list_reference = self.shared.list.lock().remove(&self.tree);
        if list_reference.is_some() {
            self.shared
                .stats
                .inodes_on_list
                .fetch_sub(1, Ordering::Relaxed);
        }
        drop(list_reference);
        let mut inner = self.tree.inner.write();
        let (objects_before, delayed_before) = (inner.len(), inner.delayed_count());
        inner.clear();
        self.tree.object_count.store(0, Ordering::Relaxed);
        self.tree.delayed_count.store(0, Ordering::Relaxed);
        self.shared
            .stats
            .apply_delta(objects_before, 0, delayed_before, 0);
    }
}

/// Checks `fill` input: each mapping valid, from disk (not delayed), inside the range,
/// sorted and disjoint.
fn validate_fill(start: u64, block_count: u64, mapped: &[Extent]) -> Result<(), ExtCacheError> {
    let end = check_range(start, block_count)?;
    let mut previous_end = start;
    for extent in mapped {
        extent.validate()?;
        if matches!(extent.state, ExtentState::Delayed) {
            return Err(ExtCacheError::FillNotOnDisk {
                start: extent.logical_block,
                state: "delayed",
            });
        }
        if extent.logical_block < start || extent.end_block() > end {
            return Err(ExtCacheError::FillOutsideRange {
                range_start: start,
                range_count: block_count,
                start: extent.logical_block,
                block_count: extent.block_count,
            });
        }
        if extent.logical_block < previous_end {
            return Err(ExtCacheError::FillUnsorted {
                start: extent.logical_block,
                previous_end,
            });
        }
        previous_end = extent.end_block();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::{CacheConfig, Extent, ExtentCache, ExtentState};

    #[test]
    fn the_shrinker_skips_a_locked_inode_instead_of_waiting() {
        // While a reader holds an inode's tree lock, a shrink call passes it by as busy.
        let cache = ExtentCache::new(CacheConfig::default()).unwrap();
        let inode = cache.open_inode(9);
        for i in 0..10 {
            let state = ExtentState::Written {
                physical_block: i * 10,
            };
            inode.insert(Extent::new(i * 2, 1, state).unwrap()).unwrap();
        }
        inode
            .tree
            .referenced
            .store(false, std::sync::atomic::Ordering::Relaxed);
        let reader = inode.tree.inner.read();
        let outcome = cache.shrink(128);
        drop(reader);
        assert_eq!(
            (outcome.inodes_walked, outcome.inodes_scanned, outcome.freed),
            (1, 0, 0)
        );
        assert_eq!(cache.stats().inodes_skipped_busy, 1);
        assert_eq!(cache.shrink(128).freed, 10);
        inode.check_invariants().unwrap();
        cache.check_invariants().unwrap();
    }
}
