//! File data mapping: a data fork's extents, kept inline in the inode (Extents format) or, once
//! they no longer fit, in a B+tree (Btree format, `bmap_tree`), and back inline when they
//! shrink to half the inline capacity. Lookups, allocation of new extents (written or
//! unwritten), conversion of unwritten ranges to written, and freeing ranges for truncate and
//! punch.
//!
//! Extents are kept sorted by file block, never overlapping; neighbours that continue each
//! other on disk with the same state are merged, so a sequentially written file stays small.
//!
//! # The API for every fork user (files, directories, symlinks): `FileMap`
//!
//! ```text
//! let mut map = FileMap::load(fs, &mut tx, number, &data)?;   // inside a transaction
//! let map = FileMap::read(fs, number, &data)?;                // outside one (readers)
//! let mut map = FileMap::load_around(fs, &mut tx, number, &data, &[(first, last)])?;
//!                       // only the extents near the ranges: the write paths, O(log n) a step
//! map.lookup(block) -> Mapping                  // logical block -> Hole{length} | Mapped(extent)
//! map.allocate(fs, &mut tx, &mut data, start, length, Placement::near(false))?  // one extent
//! map.map_range(fs, &mut tx, &mut data, start, end, unwritten)?  // fill every hole
//! map.cut_step(start, end) + map.free(fs, &mut tx, &mut data, &pieces)?  // unmap in tx
//! fallocate::unmap_blocks(fs, number, &mut data, start, end)?  // own transactions, intents
//! map.store(fs, &mut tx, &mut data)?            // write back: inline, tree, or tree -> inline
//! ```
//! Load, change and store within one transaction, under the inode's metadata lock; the map is
//! a copy, and `store` applies only the difference to the tree. A map loaded around ranges
//! must be changed only inside them (a full load reads every leaf, which made each write to
//! a file of 30,000 extents cost milliseconds: 4 KiB random writes into a preallocated
//! 256 MiB file ran at 1,371 IOPS, 46,190 with maps loaded around the writes). Keep the
//! number of extents changed per transaction small (the reservations assume
//! `EXTENTS_PER_STEP`).
//! The free functions on `&[Extent]` below (`extents`, `store`, `allocate`, ...) are the
//! older inline-only interface, kept for callers not yet moved to `FileMap`.

use cairn_alloc::{Mode, Request};
use cairn_btree::{Buffers, CacheContext};
use cairn_bufcache::{BufKey, ReadSpec};
use cairn_format::inode::{ForkFormat, INODE_FLAG_REFLINK, fork_extents, put_fork_extents};
use cairn_format::limits::{BTREE_LEVELS_MAX, EXTENT_LEN_MAX};
use cairn_format::{AgNumber, BtreeLayout, Extent, FsBlock, MetaKind};
use cairn_journal::{FreeExtent, IntentId, Reservation};

use crate::FsError;
use crate::bmap_tree::{self, BmapCtx};
use crate::fs::Filesystem;
use crate::glue::{JournalLog, Tx, free_sequence};
use crate::inode::InodeData;

/// Extents allocated, converted or freed per transaction by the data paths.
pub(crate) const EXTENTS_PER_STEP: usize = 4;

/// The reservation of one mapping step: the inode, one intent or done item; per extent the
/// AGF, AGFL and both free-space tree paths (`2 + 2 * (free_levels + 1)`: a split at every
/// level and a new root); and the extent tree: a split path (`bmap_levels + 1`) plus the AG
/// headers and free-space paths of its new blocks (`2 + 2 * (free_levels + 1)`). Tree heights
/// are the most the geometry allows (`levels_bound`), not `BTREE_LEVELS_MAX`, which would ask
/// for more log space than a small log has.
pub(crate) fn step_reservation(fs: &Filesystem) -> Reservation {
    let free_levels = free_tree_levels(fs);
    let per_extent = 2 + 2 * (free_levels + 1);
    let tree = 2 * (bmap_tree_levels(fs) + 1) + per_extent;
    let buffers = EXTENTS_PER_STEP as u32 * per_extent + tree;
    Reservation::for_items(&fs.geometry, buffers, fs.geometry.block_size, 1, 1)
}

/// The second transaction of a freeing step (after the one that unmapped `removed` and logged
/// `intent`): frees `removed` in ascending block order (ascending AGs, the allocator's lock
/// order) and logs the intent's done item.
pub(crate) fn free_intent(
    fs: &Filesystem,
    intent: IntentId,
    removed: &[Extent],
) -> Result<(), FsError> {
    let mut tx = fs.begin_finishing(step_reservation(fs))?;
    let sequence = free_sequence(&fs.journal);
    let mut sorted = removed.to_vec();
    sorted.sort_by_key(|piece| piece.fs_block.0);
    for piece in &sorted {
        let log = JournalLog(&fs.journal);
        fs.alloc
            .free(&mut tx, &log, piece.fs_block, piece.length, sequence)?;
    }
    tx.tx.log_free_done(intent);
    tx.tx.commit()?;
    fs.blocks_freed();
    Ok(())
}

/// Most levels a tree of `kind` holding `records` records can have when every block but
/// the root is half full.
pub(crate) fn levels_bound(kind: MetaKind, block_size: u32, records: u64) -> u32 {
    let Some(layout) = BtreeLayout::for_kind(kind, block_size) else {
        return BTREE_LEVELS_MAX;
    };
    let leaf_min = (layout.capacity(0) as u64 / 2).max(2);
    let node_min = (layout.capacity(1) as u64 / 2).max(2);
    let mut blocks = records.div_ceil(leaf_min);
    let mut levels = 1;
    while blocks > 1 && levels < BTREE_LEVELS_MAX {
        blocks = blocks.div_ceil(node_min);
        levels += 1;
    }
    levels
}

/// Height bound of an AG's free-space trees (at most one record per two blocks).
pub(crate) fn free_tree_levels(fs: &Filesystem) -> u32 {
    let records = u64::from(fs.geometry.ag_blocks).div_ceil(2);
    levels_bound(MetaKind::BnoBtree, fs.geometry.block_size, records)
}

/// Height bound of a file extent tree (at most one record per device block).
fn bmap_tree_levels(fs: &Filesystem) -> u32 {
    levels_bound(
        MetaKind::BmapBtree,
        fs.geometry.block_size,
        fs.geometry.block_count,
    ) + 1
}

/// How to place a new extent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Placement {
    /// Map the blocks unwritten (read as zeros until converted).
    pub unwritten: bool,
    /// Fewest blocks acceptable (the rest of the hole is mapped by later calls).
    pub min_len: u32,
    /// Start and length multiple, in blocks (1: any).
    pub alignment: u32,
    /// Try to continue the previous extent on disk exactly before searching near it.
    pub exact_first: bool,
    /// A growing stream (an extending write with speculative preallocation): when a file
    /// still being extended took the blocks right after its previous extent, it moves to
    /// the middle of the longest free extent (`Mode::Apart`) instead of the nearest free
    /// blocks, which are that file's room to grow; back to back, the two would leapfrog
    /// each other.
    pub apart: bool,
    /// An extending write: the blocks it takes are the file's growing tail
    /// (`Preallocs::note_tail`), which other streams move away from.
    pub extending: bool,
}

impl Placement {
    /// One or more blocks near the previous extent.
    pub fn near(unwritten: bool) -> Self {
        Self {
            unwritten,
            min_len: 1,
            alignment: 1,
            exact_first: false,
            apart: false,
            extending: false,
        }
    }
}

/// A fork's extent map loaded for one operation; see the module documentation.
#[derive(Debug)]
pub(crate) struct FileMap {
    number: u64,
    list: Vec<Extent>,
    /// The extents as stored, to diff against.
    original: Vec<Extent>,
    /// Lowest AG the transaction may still lock.
    floor: u32,
    /// Extents `allocate` took since the last `store`: freed again if the store fails.
    allocated: Vec<Extent>,
    /// For a map loaded around ranges (`load_around`): what the list leaves out.
    window: Option<Window>,
    /// Extents `move_extents` gave new file blocks since the last `store`, each `(old, new)`.
    moved: Vec<(Extent, Extent)>,
}

/// A `FileMap` holding only the extents around some ranges of a tree-format fork.
#[derive(Debug, Clone, Copy)]
struct Window {
    /// Records of the tree outside the window.
    outside: usize,
    /// Whether the window starts at the tree's first record.
    from_start: bool,
}

impl FileMap {
    /// Loads the map of inode `number` through `ctx` (a transaction, or a cache context).
    pub fn load<'c, X: Buffers<'c>>(
        fs: &Filesystem,
        ctx: &mut X,
        number: u64,
        data: &InodeData,
    ) -> Result<Self, FsError> {
        let list = match data.core.data_format {
            ForkFormat::Extents => fork_extents(data.data_fork(), data.core.data_extent_count)
                .map_err(|e| FsError::corrupt("inode extents", number, e.to_string()))?,
            ForkFormat::Btree => bmap_tree::records(fs, number, data, ctx)?,
            _ => Vec::new(),
        };
        check_list(number, &list)?;
        Ok(Self::loaded(number, list, None))
    }

    /// A map of `list` as loaded, nothing changed yet.
    fn loaded(number: u64, list: Vec<Extent>, window: Option<Window>) -> Self {
        Self {
            number,
            original: list.clone(),
            list,
            floor: 0,
            allocated: Vec::new(),
            window,
            moved: Vec::new(),
        }
    }

    /// Loads only what changes to file blocks `ranges` (each `first..last`) can touch: the
    /// extents that overlap each range and one more on each side (the whole map when it is
    /// inline). Its `lookup` and `extents` know only those, and only inside the ranges;
    /// `store` writes the change into the tree without reading the rest, so a write to a
    /// file of many extents costs a few leaves per range.
    pub fn load_around<'c, X: Buffers<'c>>(
        fs: &Filesystem,
        ctx: &mut X,
        number: u64,
        data: &InodeData,
        ranges: &[(u64, u64)],
    ) -> Result<Self, FsError> {
        if data.core.data_format != ForkFormat::Btree {
            return Self::load(fs, ctx, number, data);
        }
        let mut list = Vec::new();
        let mut from_start = false;
        for &range in ranges {
            let (around, first) = bmap_tree::records_around(fs, number, data, ctx, range)?;
            from_start |= first;
            list.extend(around);
        }
        list.sort_by_key(|e| e.file_block);
        list.dedup_by_key(|e| e.file_block);
        Self::windowed(number, data, list, from_start)
    }

    /// Loads up to `count` extents from file block `from` on (`forward`), or the `count`
    /// before it, and one more on each side (the whole map when it is inline): what a shift
    /// step moves (`shift.rs`). Change only the extents strictly inside what it holds.
    pub fn load_span<'c, X: Buffers<'c>>(
        fs: &Filesystem,
        ctx: &mut X,
        number: u64,
        data: &InodeData,
        span: (u64, usize, bool),
    ) -> Result<Self, FsError> {
        if data.core.data_format != ForkFormat::Btree {
            return Self::load(fs, ctx, number, data);
        }
        let (list, from_start) = bmap_tree::records_span(fs, number, data, ctx, span)?;
        Self::windowed(number, data, list, from_start)
    }

    /// A map of `list`, part of the tree of `data` (`from_start`: its first record is).
    fn windowed(
        number: u64,
        data: &InodeData,
        list: Vec<Extent>,
        from_start: bool,
    ) -> Result<Self, FsError> {
        check_list(number, &list)?;
        let total = data.core.data_extent_count as usize;
        let outside = total.checked_sub(list.len()).ok_or_else(|| {
            let detail = format!("the inode counts {total} extents, the tree holds more");
            FsError::corrupt("extent tree", number, detail)
        })?;
        let window = Window {
            outside,
            from_start,
        };
        Ok(Self::loaded(number, list, Some(window)))
    }

    /// `load_around` outside a transaction (readers that need one range).
    pub fn read_around(
        fs: &Filesystem,
        number: u64,
        data: &InodeData,
        range: (u64, u64),
    ) -> Result<Self, FsError> {
        let mut ctx = CacheContext::new(&fs.cache);
        Self::load_around(fs, &mut ctx, number, data, &[range])
    }

    /// Turns a windowed map into a whole one, the windows' changes kept: the tree (not yet
    /// changed by this map) is read whole, the windows' old extents replaced by their new.
    fn widen(&mut self, fs: &Filesystem, tx: &mut Tx<'_>, data: &InodeData) -> Result<(), FsError> {
        if self.window.take().is_none() {
            return Ok(());
        }
        let whole = bmap_tree::records(fs, self.number, data, tx)?;
        let index_of =
            |list: &[Extent], block: u64| list.binary_search_by_key(&block, |e| e.file_block).ok();
        let loaded = |e: &Extent| index_of(&self.original, e.file_block).is_some();
        if !self
            .original
            .iter()
            .all(|e| index_of(&whole, e.file_block).is_some_and(|i| whole[i] == *e))
        {
            let detail = "the tree changed under a loaded map".to_string();
            return Err(FsError::corrupt("extent tree", self.number, detail));
        }
        let mut list: Vec<Extent> = whole.iter().filter(|e| !loaded(e)).copied().collect();
        list.extend(self.list.iter().copied());
        list.sort_by_key(|e| e.file_block);
        check_list(self.number, &list)?;
        self.original = whole;
        self.list = list;
        Ok(())
    }

    /// Whether the extents differ from those stored.
    pub fn is_changed(&self) -> bool {
        self.list != self.original
    }

    /// Loads the map outside any transaction (no buffer stays held afterwards).
    pub fn read(fs: &Filesystem, number: u64, data: &InodeData) -> Result<Self, FsError> {
        let mut ctx = CacheContext::new(&fs.cache);
        Self::load(fs, &mut ctx, number, data)
    }

    pub fn extents(&self) -> &[Extent] {
        &self.list
    }

    /// The mapping of file block `block`.
    pub fn lookup(&self, block: u64) -> Mapping {
        map(&self.list, block)
    }

    /// Puts back an extent cut out earlier (its blocks still belong to the file).
    pub fn insert(&mut self, extent: Extent) {
        insert(&mut self.list, extent);
    }

    /// Marks file blocks `start..end` written (they are mapped).
    pub fn mark_written(&mut self, start: u64, end: u64) {
        mark_written(&mut self.list, start, end);
    }

    /// Marks the mapped blocks of `start..end` unwritten (they read as zeros; zero range).
    pub fn mark_unwritten(&mut self, start: u64, end: u64) {
        let mut pieces = cut(&mut self.list, start, end);
        for piece in &mut pieces {
            piece.unwritten = true;
        }
        for piece in pieces {
            insert(&mut self.list, piece);
        }
    }

    /// Gives extents new file blocks (a collapse or insert range, `shift.rs`): each
    /// `(old, new)` keeps its disk blocks, length and state. The extents keep their order,
    /// and none is merged with a neighbour, so `store` rewrites tree records in place and
    /// never needs a block. All moves of one call go the same way.
    pub fn move_extents(&mut self, moves: &[(Extent, Extent)]) -> Result<(), FsError> {
        let mut ordered = moves.to_vec();
        ordered.sort_by_key(|(old, _)| old.file_block);
        if ordered
            .first()
            .is_some_and(|(old, new)| new.file_block > old.file_block)
        {
            // Moved up from the highest, so the list stays sorted as each is replaced.
            ordered.reverse();
        }
        for &(old, new) in &ordered {
            let index = self
                .list
                .binary_search_by_key(&old.file_block, |e| e.file_block)
                .ok()
                .filter(|&index| self.list[index] == old)
                .ok_or_else(|| FsError::corrupt("file extent map", self.number, "moved a gap"))?;
            debug_assert_eq!(
                (old.fs_block, old.length, old.unwritten),
                (new.fs_block, new.length, new.unwritten)
            );
            self.list[index] = new;
        }
        check_list(self.number, &self.list)?;
        self.moved.extend_from_slice(moves);
        Ok(())
    }

    /// Cuts the extent holding file block `block` in two there, not merging the pieces back:
    /// the same blocks, one more record (a shift moves one piece and not the other).
    pub fn split_at(&mut self, block: u64) {
        let index = self.list.partition_point(|e| e.file_end() <= block);
        if let Some(&extent) = self.list.get(index)
            && extent.file_block < block
        {
            self.list[index] = piece(&extent, extent.file_block, block);
            let upper = piece(&extent, block, extent.file_end());
            self.list.insert(index + 1, upper);
        }
    }

    /// Removes file blocks `start..end` from the map; returns the pieces (not yet freed).
    pub fn cut(&mut self, start: u64, end: u64) -> Vec<Extent> {
        cut(&mut self.list, start, end)
    }

    /// Maps file blocks `start..start + length` (a hole) with one new extent of at least
    /// `placement.min_len` blocks, possibly fewer than asked; returns it.
    pub fn allocate(
        &mut self,
        fs: &Filesystem,
        tx: &mut Tx<'_>,
        data: &mut InodeData,
        start: u64,
        length: u64,
        placement: Placement,
    ) -> Result<Extent, FsError> {
        let wanted = length
            .min(u64::from(EXTENT_LEN_MAX))
            .min(u64::from(fs.geometry.ag_blocks)) as u32;
        let min_len = placement.min_len.clamp(1, wanted.max(1));
        let goal = target(fs, &self.list, self.number, start);
        let log = JournalLog(&fs.journal);
        let mut request = Request::near(goal, min_len, wanted.max(min_len))
            .with_min_left(self.tree_reserve(fs, data));
        if placement.alignment > 1 && wanted.is_multiple_of(placement.alignment) {
            request = request.with_alignment(placement.alignment, placement.alignment);
        }
        request.lowest_ag = AgNumber(self.floor);
        let mut found = None;
        if placement.exact_first && !self.list.is_empty() {
            let exact = request.with_mode(Mode::Exact).with_alignment(1, 1);
            found = fs.alloc.allocate(tx, &log, &exact)?;
            let collided = found.is_none()
                && placement.apart
                && self.continues_an_extent(start)
                && fs.preallocs.growing_at(goal.0, self.number);
            if collided {
                found = fs
                    .alloc
                    .allocate(tx, &log, &request.with_mode(Mode::Apart))?;
            }
        }
        if found.is_none() {
            found = fs.alloc.allocate(tx, &log, &request)?;
        }
        let found = found.ok_or(FsError::NoSpace)?;
        if placement.extending {
            let end = found.fs_start.0 + u64::from(found.length);
            fs.preallocs.note_tail(self.number, found.fs_start.0, end);
        }
        self.floor = self.floor.max(found.ag.0);
        let extent = Extent::new(start, found.fs_start, found.length, placement.unwritten)
            .map_err(|e| FsError::corrupt("extent", found.fs_start.0, e.to_string()))?;
        insert(&mut self.list, extent);
        self.allocated.push(extent);
        data.core.block_count += u64::from(found.length);
        Ok(extent)
    }

    /// Whether file block `block` comes right after a mapped extent (an append to it).
    fn continues_an_extent(&self, block: u64) -> bool {
        let index = self.list.partition_point(|e| e.file_end() <= block);
        index > 0 && self.list[index - 1].file_end() == block
    }

    /// Blocks `store` may allocate for the extent tree after this step's allocations: none
    /// while the list stays well inside the fork, else a split at every level and a new root.
    /// Each allocation leaves that many free in its AG (XFS's minleft), held by the transaction
    /// until commit, so a full filesystem fails the allocation rather than the store after it.
    /// The tree seeks its blocks from the inode's AG upward and may miss them; then `store`
    /// gives back what was allocated.
    fn tree_reserve(&self, fs: &Filesystem, data: &InodeData) -> u32 {
        let inline = data.core.data_format != ForkFormat::Btree;
        let room = self.list.len() + 2 * EXTENTS_PER_STEP <= inline_capacity(data);
        if inline && room {
            0
        } else {
            bmap_tree_levels(fs) + 1
        }
    }

    /// Maps every hole in file blocks `start..end`, at most `EXTENTS_PER_STEP` new extents,
    /// fewer when the AGs this step holds run out; returns the first block not yet mapped
    /// (`end` when done).
    pub fn map_range(
        &mut self,
        fs: &Filesystem,
        tx: &mut Tx<'_>,
        data: &mut InodeData,
        start: u64,
        end: u64,
        placement: Placement,
    ) -> Result<u64, FsError> {
        let mut block = start;
        let mut allocated = 0;
        while block < end && allocated < EXTENTS_PER_STEP {
            match self.lookup(block) {
                Mapping::Mapped(extent) => block = extent.file_end(),
                Mapping::Hole { length } => {
                    let want = length.min(end - block);
                    match self.allocate(fs, tx, data, block, want, placement) {
                        Ok(extent) => block = extent.file_end(),
                        // This step's allocations hold their AGs, and AGs ascend within a
                        // transaction: the next step, in a new one, may look below them.
                        Err(FsError::NoSpace) if allocated > 0 => break,
                        Err(error) => return Err(error),
                    }
                    allocated += 1;
                }
            }
        }
        Ok(block.min(end))
    }

    /// Cuts file blocks `start..end` out of the map, at most `EXTENTS_PER_STEP` extents
    /// from the end of the range backwards. Returns where the range now ends (`start` when
    /// done) and the pieces cut, whose blocks the caller frees (`free`, or an intent).
    pub fn cut_step(&mut self, start: u64, end: u64) -> (u64, Vec<Extent>) {
        let inside: Vec<&Extent> = self
            .list
            .iter()
            .filter(|e| e.file_end() > start && e.file_block < end)
            .collect();
        let step_start = match inside.len().checked_sub(EXTENTS_PER_STEP) {
            Some(first) if first > 0 => inside[first].file_block.max(start),
            _ => start,
        };
        (step_start, self.cut(step_start, end))
    }

    /// Writes the map back into the fork: inline when it fits (freeing a tree that shrank to
    /// half the inline capacity), else into the tree (created when the list outgrows the fork).
    pub fn store(
        &mut self,
        fs: &Filesystem,
        tx: &mut Tx<'_>,
        data: &mut InodeData,
    ) -> Result<(), FsError> {
        if self.list == self.original {
            return Ok(());
        }
        let capacity = inline_capacity(data);
        let outside = self.window.map_or(0, |w| w.outside);
        if outside > 0 && outside + self.list.len() <= capacity {
            // It may go back inline: that takes the whole list.
            self.widen(fs, tx, data)?;
        }
        let is_tree = data.core.data_format == ForkFormat::Btree;
        let total = self.list.len() + self.window.map_or(0, |w| w.outside);
        let first = match self.window {
            Some(window) if !window.from_start => bmap_tree::first_block(self.number, data)?,
            _ => self.list.first().map_or(0, |e| e.file_block),
        };
        let mut ctx = BmapCtx {
            tx,
            fs,
            target: bmap_tree::home_target(fs, self.number),
            floor: &mut self.floor,
            blocks_delta: 0,
        };
        let result = match (is_tree, total) {
            (false, count) if count <= capacity => store(data, &self.list),
            (false, _) => bmap_tree::create(&mut ctx, self.number, data, &self.list),
            (true, count) if count <= capacity / 2 => {
                bmap_tree::destroy(&mut ctx, self.number, data, &self.original)
                    .and_then(|()| store(data, &self.list))
            }
            (true, _) if !self.moved.is_empty() => {
                bmap_tree::move_records(&mut ctx, self.number, data, &self.moved, (first, total))
            }
            (true, _) => bmap_tree::apply(
                &mut ctx,
                self.number,
                data,
                (&self.original, &self.list),
                (first, total),
            ),
        };
        self.moved.clear();
        let delta = ctx.blocks_delta;
        data.core.block_count = data.core.block_count.saturating_add_signed(delta);
        if let Err(error) = result {
            // The tree is as it was; the blocks allocated for the new mapping go back, and
            // any this transaction logged (a new directory block) get cancel records.
            let allocated = std::mem::take(&mut self.allocated);
            for block in allocated.iter().flat_map(|e| e.fs_block.0..e.fs_end().0) {
                let key = BufKey::single(block);
                if tx.tx.buf_mut(key).is_some() {
                    tx.tx.invalidate_buf(key)?;
                }
            }
            free_pieces(fs, tx, data, &allocated)?;
            self.list = self.original.clone();
            return Err(error);
        }
        self.allocated.clear();
        if let Some(cached) = fs.data_cache.cached(self.number, data.core.generation) {
            crate::extents::note_change(&cached, &self.original, &self.list)?;
        }
        self.original = self.list.clone();
        Ok(())
    }
}

/// Extents sorted, non-empty and not overlapping, or the fork is corrupt.
fn check_list(number: u64, list: &[Extent]) -> Result<(), FsError> {
    for pair in list.windows(2) {
        if pair[0].file_end() > pair[1].file_block {
            let detail = format!(
                "extents at file blocks {} and {} overlap or are out of order",
                pair[0].file_block, pair[1].file_block
            );
            return Err(FsError::corrupt("file extent map", number, detail));
        }
    }
    Ok(())
}

/// What one file block range maps to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mapping {
    /// No blocks for `length` blocks (or to the end of the mapping when `u64::MAX`).
    Hole { length: u64 },
    /// `extent` covers the block asked for (it may start before it).
    Mapped(Extent),
}

/// The extents of a data fork (none for Local or Device forks).
pub(crate) fn extents(data: &InodeData) -> Result<Vec<Extent>, FsError> {
    match data.core.data_format {
        ForkFormat::Extents => fork_extents(data.data_fork(), data.core.data_extent_count)
            .map_err(|e| FsError::corrupt("inode extents", data.core.header.blkno, e.to_string())),
        // Tree forks need a buffer context: callers use `FileMap`.
        ForkFormat::Btree => Err(FsError::Unsupported),
        _ => Ok(Vec::new()),
    }
}

/// Stores `list` (sorted, merged) as the data fork. `NoSpace` when it outgrows the inode:
/// converting to an extent tree is not done yet, so the change is refused before it happens.
pub(crate) fn store(data: &mut InodeData, list: &[Extent]) -> Result<(), FsError> {
    let fork_bytes = data.data_fork().len();
    if list.len() * 16 > fork_bytes {
        return Err(FsError::NoSpace);
    }
    data.core.data_format = ForkFormat::Extents;
    put_fork_extents(list, data.data_fork_mut())
        .map_err(|e| FsError::corrupt("inode extents", data.core.header.blkno, e.to_string()))?;
    data.core.data_extent_count = list.len() as u32;
    Ok(())
}

/// Extents that fit inline in this inode.
pub(crate) fn inline_capacity(data: &InodeData) -> usize {
    data.data_fork().len() / 16
}

/// The mapping of file block `block`.
pub(crate) fn map(list: &[Extent], block: u64) -> Mapping {
    let index = list.partition_point(|e| e.file_end() <= block);
    match list.get(index) {
        Some(extent) if extent.file_block <= block => Mapping::Mapped(*extent),
        Some(extent) => Mapping::Hole {
            length: extent.file_block - block,
        },
        None => Mapping::Hole { length: u64::MAX },
    }
}

/// Inserts `new` (not overlapping anything) and merges it with neighbours that continue it.
pub(crate) fn insert(list: &mut Vec<Extent>, new: Extent) {
    let index = list.partition_point(|e| e.file_block < new.file_block);
    list.insert(index, new);
    merge_around(list, index);
}

fn continues(left: &Extent, right: &Extent) -> bool {
    left.file_end() == right.file_block
        && left.fs_block.0 + u64::from(left.length) == right.fs_block.0
        && left.unwritten == right.unwritten
        && left.length + right.length <= EXTENT_LEN_MAX
}

fn merge_around(list: &mut Vec<Extent>, index: usize) {
    let mut index = index;
    if index > 0 && continues(&list[index - 1], &list[index]) {
        list[index - 1].length += list[index].length;
        list.remove(index);
        index -= 1;
    }
    if index + 1 < list.len() && continues(&list[index], &list[index + 1]) {
        list[index].length += list[index + 1].length;
        list.remove(index + 1);
    }
}

/// Removes file blocks `start..end` from the list and returns the physical pieces removed.
pub(crate) fn cut(list: &mut Vec<Extent>, start: u64, end: u64) -> Vec<Extent> {
    let mut removed = Vec::new();
    let mut kept = Vec::with_capacity(list.len() + 1);
    for extent in list.drain(..) {
        let (from, to) = (extent.file_block, extent.file_end());
        if to <= start || from >= end {
            kept.push(extent);
            continue;
        }
        if from < start {
            kept.push(piece(&extent, from, start));
        }
        removed.push(piece(&extent, from.max(start), to.min(end)));
        if to > end {
            kept.push(piece(&extent, end, to));
        }
    }
    *list = kept;
    removed
}

/// The part of `extent` covering file blocks `from..to` (inside it).
pub(crate) fn piece(extent: &Extent, from: u64, to: u64) -> Extent {
    Extent {
        file_block: from,
        fs_block: FsBlock(extent.fs_block.0 + (from - extent.file_block)),
        length: (to - from) as u32,
        unwritten: extent.unwritten,
    }
}

/// Marks file blocks `start..end` written (they are mapped).
pub(crate) fn mark_written(list: &mut Vec<Extent>, start: u64, end: u64) {
    let mut pieces = cut(list, start, end);
    for piece in &mut pieces {
        piece.unwritten = false;
    }
    for piece in pieces {
        insert(list, piece);
    }
}

/// Where to put new blocks for file block `block`: after the previous extent, or in the
/// inode's own AG.
pub(crate) fn target(fs: &Filesystem, list: &[Extent], inode: u64, block: u64) -> FsBlock {
    let index = list.partition_point(|e| e.file_end() <= block);
    if index > 0 {
        let prev = &list[index - 1];
        return FsBlock(prev.fs_block.0 + u64::from(prev.length) + (block - prev.file_end()));
    }
    let ag = (inode >> fs.geometry.ag_inode_bits()) as u32;
    FsBlock(fs.geometry.ag_start(ag.min(fs.geometry.ag_count - 1)))
}

/// Allocates blocks for the hole at file blocks `start..start + length` (at least one block,
/// possibly fewer than asked) and maps them; returns the new extent.
pub(crate) fn allocate(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    data: &mut InodeData,
    list: &mut Vec<Extent>,
    start: u64,
    length: u64,
    unwritten: bool,
) -> Result<Extent, FsError> {
    if list.len() >= inline_capacity(data) {
        return Err(FsError::NoSpace);
    }
    let wanted = length
        .min(u64::from(EXTENT_LEN_MAX))
        .min(u64::from(fs.geometry.ag_blocks)) as u32;
    let goal = target(fs, list, data.core.header.blkno, start);
    let mut request = Request::near(goal, 1, wanted);
    request.lowest_ag = AgNumber(0);
    let log = JournalLog(&fs.journal);
    let found = fs
        .alloc
        .allocate(tx, &log, &request)?
        .ok_or(FsError::NoSpace)?;
    let extent = Extent::new(start, found.fs_start, found.length, unwritten)
        .map_err(|e| FsError::corrupt("extent", found.fs_start.0, e.to_string()))?;
    insert(list, extent);
    if list.len() > inline_capacity(data) {
        // The merge did not absorb it and the list is full: give the blocks back.
        cut(list, start, extent.file_end());
        let sequence = free_sequence(&fs.journal);
        fs.alloc.free(
            tx,
            &JournalLog(&fs.journal),
            found.fs_start,
            found.length,
            sequence,
        )?;
        return Err(FsError::NoSpace);
    }
    data.core.block_count += u64::from(found.length);
    Ok(extent)
}

/// `extents` as a free intent names them.
pub(crate) fn free_extents(extents: &[Extent]) -> Vec<FreeExtent> {
    extents
        .iter()
        .map(|e| FreeExtent {
            start: e.fs_block,
            length: e.length,
        })
        .collect()
}

/// Finishes a step that cut `removed` out of `map` in `tx`: stores the map first (a split
/// extent may need an extent-tree block a full filesystem lacks; then the step commits what
/// changed, unmaps nothing, and no intent may free blocks still mapped), logs an intent for
/// `removed` (a free intent; for a file that may share blocks, `INODE_FLAG_REFLINK`, a
/// refcount intent dropping one mapping of each block, which frees only the blocks no other
/// file maps), lowers the block count and commits; a second transaction does the work.
/// A reflink file whose map this empties loses its flag.
pub(crate) fn commit_unmap(
    fs: &Filesystem,
    mut tx: Tx<'_>,
    number: u64,
    data: &mut InodeData,
    map: &mut FileMap,
    removed: &[Extent],
) -> Result<(), FsError> {
    if let Err(error) = map.store(fs, &mut tx, data) {
        Filesystem::log_inode(&mut tx, number, data);
        fs.commit(tx, &mut [data])?;
        return Err(error);
    }
    let shared = data.core.flags & INODE_FLAG_REFLINK != 0;
    let updates = crate::reflink::decrease_updates(removed);
    let intent = match shared {
        true => tx.tx.log_refcount_intent(&updates),
        false => tx.tx.log_free_intent(&free_extents(removed)),
    };
    if shared && data.core.data_extent_count == 0 {
        data.core.flags &= !INODE_FLAG_REFLINK;
    }
    let released: u64 = removed.iter().map(|e| u64::from(e.length)).sum();
    data.core.block_count = data.core.block_count.saturating_sub(released);
    Filesystem::log_inode(&mut tx, number, data);
    fs.commit(tx, &mut [data])?;
    match shared {
        true => crate::reflink::finish_refcount_intent(fs, intent, &updates),
        false => free_intent(fs, intent, removed),
    }
}

/// Joins and invalidates the buffers of `extents` (logged metadata blocks about to be freed:
/// directory or symlink blocks), so that no stale copy is written over the blocks' next owner,
/// live or by recovery (each invalidation logs a cancel record).
pub(crate) fn invalidate_extents(
    tx: &mut Tx<'_>,
    extents: &[Extent],
    spec: &ReadSpec,
) -> Result<(), FsError> {
    for block in extents.iter().flat_map(|e| e.fs_block.0..e.fs_end().0) {
        tx.invalidate(FsBlock(block), spec)?;
    }
    Ok(())
}

/// Unmaps, invalidates and frees in `tx` every block of an inline extent list of logged
/// metadata blocks (a directory's failed move to blocks, a new symlink's failed create): the
/// blocks were allocated in `tx`, whose AG locks the frees reuse.
pub(crate) fn release_inline(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    data: &mut InodeData,
    spec: &ReadSpec,
) -> Result<(), FsError> {
    if data.core.data_format != ForkFormat::Extents {
        return Ok(());
    }
    let mut list = extents(data)?;
    let removed = cut(&mut list, 0, u64::MAX);
    invalidate_extents(tx, &removed, spec)?;
    free_pieces(fs, tx, data, &removed)?;
    store(data, &list)
}

/// Frees the physical blocks of `removed` pieces in `tx` and lowers the block count.
pub(crate) fn free_pieces(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    data: &mut InodeData,
    removed: &[Extent],
) -> Result<(), FsError> {
    let sequence = free_sequence(&fs.journal);
    // Ascending block order is ascending AG order: the allocator locks AG headers in that
    // order only (docs/alloc.md, lock order).
    let mut sorted: Vec<&Extent> = removed.iter().collect();
    sorted.sort_by_key(|extent| extent.fs_block.0);
    for extent in sorted {
        // One AG per free call: an extent never crosses an AG (allocations come from one).
        fs.alloc.free(
            tx,
            &JournalLog(&fs.journal),
            extent.fs_block,
            extent.length,
            sequence,
        )?;
        data.core.block_count = data
            .core
            .block_count
            .saturating_sub(u64::from(extent.length));
    }
    if !removed.is_empty() {
        fs.blocks_freed();
    }
    Ok(())
}
