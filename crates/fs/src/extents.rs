//! The extent status cache (`cairn_extcache`) plugged into the data path: one `ExtentCache`
//! per mounted filesystem, one `InodeExtents` per inode whose data was mapped.
//!
//! Coherence (docs/extcache.md): reads and writes look blocks up under the inode's I/O lock
//! (shared or exclusive); on a miss the whole on-disk map is read and `fill`ed, holes
//! included, still under that lock, so no change can race the fill. Every change to a map
//! goes through `FileMap::store` under the exclusive I/O lock (or, for directories and
//! symlinks, which never read through the cache, the metadata lock), which rewrites the
//! changed ranges in the cache (`note_change`: a hole over each changed range, then the new
//! extents there) before the lock is released. Handles are keyed by inode number and
//! generation, so a freed and reused inode never sees its predecessor's entries.

use std::collections::HashMap;
use std::sync::Arc;

use cairn_extcache::{CacheConfig, ExtentCache, ExtentState, InodeExtents};
use cairn_format::limits::{EXTENT_LEN_MAX, FILE_BLOCK_MAX};
use cairn_format::{Extent, FsBlock};
use cairn_lockrank::{Mutex, Rank};

use crate::FsError;
use crate::bmap::{Mapping, piece};

/// Inode handles kept before idle ones (whose entries the shrinker emptied) are dropped.
const CACHED_INODES_TARGET: usize = 16_384;

/// The filesystem's extent cache and its per-inode handles.
#[derive(Debug)]
pub(crate) struct DataCache {
    pub cache: ExtentCache,
    inodes: Mutex<HashMap<u64, (u32, Arc<InodeExtents>)>>,
}

fn cache_error(error: cairn_extcache::ExtCacheError) -> FsError {
    FsError::corrupt("extent cache", 0, error.to_string())
}

impl DataCache {
    pub fn new() -> Result<Self, FsError> {
        Ok(Self {
            cache: ExtentCache::new(CacheConfig::default()).map_err(cache_error)?,
            inodes: Mutex::new(Rank::ExtentHandles, HashMap::new()),
        })
    }

    /// The handle of inode `number` at `generation` (a new, empty one after reuse).
    pub fn inode(&self, number: u64, generation: u32) -> Arc<InodeExtents> {
        let mut inodes = self.inodes.lock();
        if let Some((cached, handle)) = inodes.get(&number)
            && *cached == generation
        {
            return Arc::clone(handle);
        }
        // Handles leave the map under its lock but are dropped after it: dropping the last
        // reference takes the extent cache's own locks, which rank below this one.
        let mut dropped = Vec::new();
        if inodes.len() >= CACHED_INODES_TARGET {
            let idle: Vec<u64> = inodes
                .iter()
                .filter(|(_, (_, handle))| handle.object_count() == 0)
                .map(|(&number, _)| number)
                .collect();
            dropped.extend(idle.iter().filter_map(|number| inodes.remove(number)));
            if inodes.len() >= CACHED_INODES_TARGET {
                dropped.extend(inodes.drain().map(|(_, entry)| entry));
            }
        }
        let handle = Arc::new(self.cache.open_inode(number));
        dropped.extend(inodes.insert(number, (generation, Arc::clone(&handle))));
        drop(inodes);
        drop(dropped);
        handle
    }

    /// The handle of inode `number` if one is cached for `generation`.
    pub fn cached(&self, number: u64, generation: u32) -> Option<Arc<InodeExtents>> {
        let inodes = self.inodes.lock();
        let (cached, handle) = inodes.get(&number)?;
        (*cached == generation).then(|| Arc::clone(handle))
    }
}

/// The cache entry for an extent.
fn cache_extent(extent: &Extent) -> Result<cairn_extcache::Extent, FsError> {
    let physical_block = extent.fs_block.0;
    let state = match extent.unwritten {
        true => ExtentState::Unwritten { physical_block },
        false => ExtentState::Written { physical_block },
    };
    cairn_extcache::Extent::new(extent.file_block, u64::from(extent.length), state)
        .map_err(cache_error)
}

/// The mapping of `block` from a cached entry holding it.
fn mapping_of(entry: &cairn_extcache::Extent, block: u64) -> Mapping {
    let skip = block - entry.logical_block;
    let left = entry.block_count - skip;
    let physical = |start: u64| FsBlock(start + skip);
    match entry.state {
        ExtentState::Written { physical_block } | ExtentState::Unwritten { physical_block } => {
            Mapping::Mapped(Extent {
                file_block: block,
                fs_block: physical(physical_block),
                length: left.min(u64::from(EXTENT_LEN_MAX)) as u32,
                unwritten: matches!(entry.state, ExtentState::Unwritten { .. }),
            })
        }
        ExtentState::Hole | ExtentState::Delayed => Mapping::Hole { length: left },
    }
}

/// The mapping of file block `block` through the cache; on a miss `load` reads the whole
/// on-disk map, which is cached (holes included) before answering.
pub(crate) fn lookup(
    extents: &InodeExtents,
    block: u64,
    load: impl FnOnce() -> Result<Vec<Extent>, FsError>,
) -> Result<Mapping, FsError> {
    if let Some(entry) = extents.lookup(block) {
        return Ok(mapping_of(&entry, block));
    }
    let list = load()?;
    let mapped = list
        .iter()
        .map(cache_extent)
        .collect::<Result<Vec<_>, _>>()?;
    extents
        .fill(0, FILE_BLOCK_MAX + 1, &mapped)
        .map_err(cache_error)?;
    Ok(crate::bmap::map(&list, block))
}

/// Brings the cache up to date after a map went from `old` to `new`: each changed range
/// becomes a hole, then the new extents in it are inserted.
pub(crate) fn note_change(
    extents: &InodeExtents,
    old: &[Extent],
    new: &[Extent],
) -> Result<(), FsError> {
    let (deleted, updated, inserted) = crate::bmap_tree::diff(old, new);
    let mut ranges: Vec<(u64, u64)> = deleted
        .iter()
        .chain(&updated)
        .chain(&inserted)
        .map(|e| (e.file_block, e.file_end()))
        .collect();
    // An updated record may have been shorter before: cover its old extent too.
    for extent in &updated {
        if let Some(before) = old.iter().find(|o| o.file_block == extent.file_block) {
            ranges.push((before.file_block, before.file_end()));
        }
    }
    ranges.sort_unstable();
    for (start, end) in merge(ranges) {
        let hole = cairn_extcache::Extent::new(start, end - start, ExtentState::Hole)
            .map_err(cache_error)?;
        extents.insert(hole).map_err(cache_error)?;
        let from = new.partition_point(|e| e.file_end() <= start);
        for extent in new[from..].iter().take_while(|e| e.file_block < end) {
            let clipped = piece(
                extent,
                extent.file_block.max(start),
                extent.file_end().min(end),
            );
            extents
                .insert(cache_extent(&clipped)?)
                .map_err(cache_error)?;
        }
    }
    Ok(())
}

/// Sorted ranges with overlapping or touching ones joined.
fn merge(ranges: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (start, end) in ranges {
        match out.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(end),
            _ => out.push((start, end)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn extent(file_block: u64, fs_block: u64, length: u32, unwritten: bool) -> Extent {
        Extent::new(file_block, FsBlock(fs_block), length, unwritten).unwrap()
    }

    // Replays map changes (allocate, convert, punch, truncate) into the cache and checks each
    // block against the map after every step.
    #[test]
    fn cache_follows_map_changes() {
        let data = DataCache::new().unwrap();
        let inode = data.inode(7, 1);
        let steps: Vec<Vec<Extent>> = vec![
            vec![],
            vec![extent(0, 100, 8, true)],
            vec![extent(0, 100, 4, false), extent(4, 104, 4, true)],
            vec![extent(0, 100, 2, false), extent(6, 106, 2, true)],
            vec![extent(0, 100, 2, false), extent(20, 300, 5, false)],
            vec![extent(0, 100, 1, false)],
        ];
        let first = lookup(&inode, 0, || Ok(steps[0].clone())).unwrap();
        assert!(matches!(first, Mapping::Hole { .. }));
        for pair in steps.windows(2) {
            note_change(&inode, &pair[0], &pair[1]).unwrap();
            for block in 0..30 {
                let cached = lookup(&inode, block, || Ok(pair[1].clone())).unwrap();
                let want = crate::bmap::map(&pair[1], block);
                match (cached, want) {
                    (Mapping::Mapped(a), Mapping::Mapped(b)) => {
                        assert_eq!(a.fs_block.0, b.fs_block.0 + (block - b.file_block));
                        assert_eq!(a.unwritten, b.unwritten);
                    }
                    (Mapping::Hole { .. }, Mapping::Hole { .. }) => {}
                    other => panic!("block {block}: {other:?}"),
                }
            }
        }
        assert!(data.cached(7, 1).is_some());
        assert!(data.cached(7, 2).is_none());
        data.cache.check_invariants().unwrap();
    }
}
