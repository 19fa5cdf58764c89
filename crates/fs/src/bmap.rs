//! File data mapping: the extent list kept inline in the inode's data fork (Extents format).
//! Lookups, allocation of new extents (written or unwritten), conversion of unwritten ranges
//! to written, and freeing everything past a block for truncate and punch.
//!
//! Extents are kept sorted by file block, never overlapping; neighbours that continue each
//! other on disk with the same state are merged, so a sequentially written file stays small.

use cairn_alloc::Request;
use cairn_format::inode::{ForkFormat, fork_extents, put_fork_extents};
use cairn_format::limits::EXTENT_LEN_MAX;
use cairn_format::{AgNumber, Extent, FsBlock};

use crate::FsError;
use crate::fs::Filesystem;
use crate::glue::{JournalLog, Tx, free_sequence};
use crate::inode::InodeData;

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
fn piece(extent: &Extent, from: u64, to: u64) -> Extent {
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
fn target(fs: &Filesystem, list: &[Extent], inode: u64, block: u64) -> FsBlock {
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

/// Frees the physical blocks of `removed` pieces in `tx` and lowers the block count.
pub(crate) fn free_pieces(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    data: &mut InodeData,
    removed: &[Extent],
) -> Result<(), FsError> {
    let sequence = free_sequence(&fs.journal);
    for extent in removed {
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
