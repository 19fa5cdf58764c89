//! The hash index of a block-form directory: a B+tree of `DirHashRecord`s (`CDB1` blocks,
//! `DirHashKey` = name hash) mapping a name's hash to the data address of its entry, so a
//! lookup, insert or remove reads the tree path and one data block instead of every block.
//!
//! Collisions: the tree's keys are unique, so a name whose hash is taken goes to the next
//! free key (linear probing in the 32-bit key space, wrapping). A lookup probes keys from the
//! name's hash until a missing key; a remove closes the gap by moving later records of the
//! run whose probe path crosses it (backward-shift deletion), so no probe run is ever broken.
//!
//! Placement: tree pointers are filesystem blocks (base 0, so the tree's own header checks
//! hold); each tree block is also mapped in the directory's data fork at file block
//! `INDEX_FILE_BASE + block`, so block accounting (fsck) and freeing the directory see it, and
//! tree blocks allocated next to each other merge into one extent. New tree blocks go after the
//! last one, starting in the middle of the directory's AG, away from its data blocks.
//! Tree blocks are mapped through the directory's `FileMap` like every fork block, so the fork
//! may be inline or an extent tree.
//! The root pointer and height live in the `..index` marker entry of data block 0 (type
//! `Unknown`, like the parent marker): inode field = `root | (free_hint + 1) << 32 | levels <<
//! 56`, where `free_hint` is the lowest data block that may have room left by a removal (0:
//! none known; see `dir.rs`).

use cairn_alloc::Request;
use cairn_btree::{Btree, Buffers, TreeCodec, TreeContext, TreeError, TreeSpec};
use cairn_format::dir::{DirHashKey, DirHashRecord};
use cairn_format::{AgNumber, Extent, FsBlock, MetaKind};

use crate::FsError;
use crate::bmap::FileMap;
use crate::fs::Filesystem;
use crate::glue::{JournalLog, Tx, free_sequence};
use crate::inode::InodeData;

/// File block of the data fork where tree block 0 would be mapped (above every data block
/// a data address can name: those are below `1 << DIR_DATA_BLOCK_BITS`).
pub(crate) const INDEX_FILE_BASE: u64 = 1 << 32;
/// Bits of the marker's inode field holding the tree height.
const LEVELS_SHIFT: u32 = 56;
/// Bits of the marker's inode field holding the free-space hint plus one.
const HINT_SHIFT: u32 = 32;
/// The hint's width: a data block index (19 bits) plus one fits.
const HINT_MASK: u64 = (1 << 24) - 1;
/// Most keys one probe run may span before the index is called corrupt.
const PROBE_MAX: u32 = 1 << 20;

/// The directory hash tree codec.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DirHashCodec;

impl TreeCodec for DirHashCodec {
    type Record = DirHashRecord;
    type Key = DirHashKey;
    const KIND: MetaKind = MetaKind::DirBtree;

    fn key(record: &DirHashRecord) -> DirHashKey {
        DirHashKey { hash: record.hash }
    }
}

/// The `..index` marker's value: the tree root and the free-space hint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IndexMarker {
    pub root: u64,
    pub levels: u32,
    /// The lowest data block that may have room a removal left (`None`: none known).
    pub free_hint: Option<u32>,
}

impl IndexMarker {
    /// Decodes a marker's inode field (directories from before the hint have none).
    pub fn unpack(packed: u64) -> Self {
        let hint = (packed >> HINT_SHIFT) & HINT_MASK;
        Self {
            root: packed & ((1 << HINT_SHIFT) - 1),
            levels: (packed >> LEVELS_SHIFT) as u32,
            free_hint: hint.checked_sub(1).map(|h| h as u32),
        }
    }

    pub fn pack(&self) -> u64 {
        let hint = self.free_hint.map_or(0, |h| (u64::from(h) + 1) & HINT_MASK);
        self.root | (hint << HINT_SHIFT) | (u64::from(self.levels) << LEVELS_SHIFT)
    }

    /// The same marker with the root of `tree`.
    pub fn with_tree(self, tree: &Btree<DirHashCodec>) -> Self {
        Self {
            root: tree.root(),
            levels: tree.levels(),
            ..self
        }
    }
}

fn spec(fs: &Filesystem, dir: u64) -> Result<TreeSpec, FsError> {
    Ok(TreeSpec::file::<DirHashCodec>(&fs.geometry, fs.uuid, dir)?)
}

/// Opens the index whose root the marker holds.
pub(crate) fn open(
    fs: &Filesystem,
    dir: u64,
    marker: IndexMarker,
) -> Result<Btree<DirHashCodec>, FsError> {
    Ok(Btree::open(spec(fs, dir)?, marker.root, marker.levels)?)
}

/// The directory's map, loaded into `slot` on first use (a load reads the whole extent tree,
/// so operations that allocate or free nothing never pay for it).
pub(crate) fn loaded_map<'m>(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    data: &InodeData,
    slot: &'m mut Option<FileMap>,
) -> Result<&'m mut FileMap, FsError> {
    if slot.is_none() {
        *slot = Some(FileMap::load(fs, tx, data.core.header.blkno, data)?);
    }
    slot.as_mut()
        .ok_or_else(|| FsError::corrupt("directory", data.core.header.blkno, "no map"))
}

/// A transaction as the index's context: blocks come from the allocator and are mapped into
/// the directory's data fork (see the module documentation).
pub(crate) struct IndexCtx<'a, 'j> {
    pub tx: &'a mut Tx<'j>,
    pub fs: &'a Filesystem,
    pub data: &'a mut InodeData,
    /// The directory's map, loaded when a block is allocated or freed; stored at once.
    pub map: &'a mut Option<FileMap>,
    /// Why the last block allocation or free failed (the tree passes on only its text).
    failure: Failure,
    /// Index blocks the tree gave back, unmapped but not yet freed (see `free_index_block`).
    freed: Vec<Extent>,
}

impl<'a, 'j> IndexCtx<'a, 'j> {
    pub fn new(
        tx: &'a mut Tx<'j>,
        fs: &'a Filesystem,
        data: &'a mut InodeData,
        map: &'a mut Option<FileMap>,
    ) -> Self {
        Self {
            tx,
            fs,
            data,
            map,
            failure: Failure::default(),
            freed: Vec::new(),
        }
    }

    /// The result of a tree operation run with this context, a failed block allocation or
    /// free reported as the error that made it fail (not as the tree's `NoSpace`).
    fn checked<T>(&mut self, result: Result<T, TreeError>) -> Result<T, FsError> {
        self.failure.checked(result)
    }

    fn allocate_index_block(&mut self) -> Result<FsBlock, FsError> {
        let map = loaded_map(self.fs, self.tx, self.data, self.map)?;
        let mut request = Request::near(goal(self.fs, self.data, map.extents()), 1, 1);
        request.lowest_ag = AgNumber(0);
        let log = JournalLog(&self.fs.journal);
        let found = self
            .fs
            .alloc
            .allocate(self.tx, &log, &request)?
            .ok_or(FsError::NoSpace)?;
        let mapped = Extent::new(INDEX_FILE_BASE + found.fs_start.0, found.fs_start, 1, false);
        let extent = match mapped {
            Ok(extent) if found.fs_start.0 < 1 << 32 => extent,
            _ => {
                // Index pointers are 32 bits: a block above them cannot be used.
                let sequence = free_sequence(&self.fs.journal);
                self.fs
                    .alloc
                    .free(self.tx, &log, found.fs_start, 1, sequence)?;
                return Err(FsError::NoSpace);
            }
        };
        map.insert(extent);
        self.data.core.block_count += 1;
        map.store(self.fs, self.tx, self.data)?;
        Ok(found.fs_start)
    }

    fn free_index_block(&mut self, block: FsBlock) -> Result<(), FsError> {
        let map = loaded_map(self.fs, self.tx, self.data, self.map)?;
        let start = INDEX_FILE_BASE + block.0;
        let removed = map.cut(start, start + 1);
        if removed.len() != 1 {
            let number = self.data.core.header.blkno;
            let detail = format!("index block {} not in the fork", block.0);
            return Err(FsError::corrupt("directory index", number, detail));
        }
        map.store(self.fs, self.tx, self.data)?;
        self.data.core.block_count = self.data.core.block_count.saturating_sub(1);
        self.freed.extend(removed);
        Ok(())
    }

    /// The index blocks unmapped so far, which the caller frees after its transaction
    /// commits (`dir.rs`, deferred frees): a merge may free a block in a lower AG than one
    /// whose header the transaction already holds, which the allocator must refuse.
    pub fn take_freed(&mut self) -> Vec<Extent> {
        std::mem::take(&mut self.freed)
    }
}

/// The typed error behind a failed block allocation or free of the index tree: the tree sees
/// a `TreeError` (its text), the caller gets the `FsError` back from `checked`.
#[derive(Debug, Default)]
pub(crate) struct Failure(Option<FsError>);

impl Failure {
    /// Keeps `error`; returns what the tree sees (`NoSpace` stays `NoSpace`).
    pub fn keep(&mut self, error: FsError) -> TreeError {
        let tree_error = match &error {
            FsError::NoSpace => TreeError::NoSpace {
                why: "no free block for a directory index".into(),
            },
            other => TreeError::Context {
                what: other.to_string(),
            },
        };
        self.0 = Some(error);
        tree_error
    }

    /// `result` of a tree operation, its error replaced by the kept one, if any.
    pub fn checked<T>(&mut self, result: Result<T, TreeError>) -> Result<T, FsError> {
        let kept = self.0.take();
        result.map_err(|error| kept.unwrap_or_else(|| error.into()))
    }
}

impl std::fmt::Debug for IndexCtx<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IndexCtx").finish_non_exhaustive()
    }
}

crate::glue::buffers_through_tx!(IndexCtx);

impl<'j> TreeContext<'j> for IndexCtx<'_, 'j> {
    fn allocate_block(&mut self) -> Result<FsBlock, TreeError> {
        let result = self.allocate_index_block();
        result.map_err(|error| self.failure.keep(error))
    }

    fn free_block(&mut self, block: FsBlock) -> Result<(), TreeError> {
        let result = self.free_index_block(block);
        result.map_err(|error| self.failure.keep(error))
    }
}

/// Where a new index block goes: after the last index block, or the middle of the
/// directory's AG (away from its data blocks).
fn goal(fs: &Filesystem, data: &InodeData, list: &[Extent]) -> FsBlock {
    if let Some(last) = list.iter().rev().find(|e| e.file_block >= INDEX_FILE_BASE) {
        return last.fs_end();
    }
    let geometry = &fs.geometry;
    let ag =
        ((data.core.header.blkno >> geometry.ag_inode_bits()) as u32).min(geometry.ag_count - 1);
    FsBlock(geometry.ag_start(ag) + u64::from(geometry.ag_len(ag) / 2))
}

/// Creates an empty index; returns its marker (no free-space hint).
pub(crate) fn create(ctx: &mut IndexCtx<'_, '_>, dir: u64) -> Result<IndexMarker, FsError> {
    let block = ctx.allocate_block();
    let block = ctx.checked(block)?;
    let created = Btree::<DirHashCodec>::create(ctx, spec(ctx.fs, dir)?, block.0);
    let tree = ctx.checked(created)?;
    let marker = IndexMarker {
        root: 0,
        levels: 0,
        free_hint: None,
    };
    Ok(marker.with_tree(&tree))
}

/// The keys from `hash` on, in probe order, while records exist: calls `visit` with each
/// record until it returns `Some`.
pub(crate) fn probe<'c, X: Buffers<'c>, T>(
    tree: &Btree<DirHashCodec>,
    ctx: &mut X,
    hash: u32,
    mut visit: impl FnMut(&mut X, DirHashRecord) -> Result<Option<T>, FsError>,
) -> Result<Option<T>, FsError> {
    let mut key = hash;
    for _ in 0..PROBE_MAX {
        let Some(record) = tree.get(ctx, &DirHashKey { hash: key })? else {
            return Ok(None);
        };
        if let Some(found) = visit(ctx, record)? {
            return Ok(Some(found));
        }
        key = key.wrapping_add(1);
    }
    Err(FsError::corrupt(
        "directory index",
        tree.root(),
        "probe run too long",
    ))
}

/// Inserts `address` under the first free key from `hash`.
pub(crate) fn insert(
    tree: &mut Btree<DirHashCodec>,
    ctx: &mut IndexCtx<'_, '_>,
    hash: u32,
    address: u32,
) -> Result<(), FsError> {
    let mut key = hash;
    for _ in 0..PROBE_MAX {
        if tree.get(ctx, &DirHashKey { hash: key })?.is_none() {
            let inserted = tree.insert(ctx, &DirHashRecord { hash: key, address });
            return ctx.checked(inserted);
        }
        key = key.wrapping_add(1);
    }
    Err(FsError::corrupt(
        "directory index",
        tree.root(),
        "probe run too long",
    ))
}

/// Removes the record at `key` and closes the gap: a later record of the run moves back into
/// it when its home hash (from `home_of(address)`) does not lie cyclically in `(gap, key]`.
pub(crate) fn remove(
    tree: &mut Btree<DirHashCodec>,
    ctx: &mut IndexCtx<'_, '_>,
    key: u32,
    mut home_of: impl FnMut(&mut IndexCtx<'_, '_>, u32) -> Result<u32, FsError>,
) -> Result<(), FsError> {
    let deleted = tree.delete(ctx, &DirHashKey { hash: key });
    ctx.checked(deleted)?;
    let mut gap = key;
    let mut next = key.wrapping_add(1);
    for _ in 0..PROBE_MAX {
        let Some(record) = tree.get(ctx, &DirHashKey { hash: next })? else {
            return Ok(());
        };
        let home = home_of(ctx, record.address)?;
        // Distances along the probe direction: the record may stay if its home lies after
        // the gap (it never had to pass the gap).
        let stays = next.wrapping_sub(home) < next.wrapping_sub(gap);
        if !stays {
            let deleted = tree.delete(ctx, &DirHashKey { hash: next });
            ctx.checked(deleted)?;
            let moved = DirHashRecord {
                hash: gap,
                address: record.address,
            };
            let inserted = tree.insert(ctx, &moved);
            ctx.checked(inserted)?;
            gap = next;
        }
        next = next.wrapping_add(1);
    }
    Err(FsError::corrupt(
        "directory index",
        tree.root(),
        "probe run too long",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    // A failed allocation's error comes back typed with its text, NoSpace stays NoSpace, a
    // tree error with nothing kept converts as usual, and a kept error is used only once.
    #[test]
    fn failures_come_back_typed() {
        let mut failure = Failure::default();
        let order = FsError::from(cairn_alloc::AllocError::AgOrder { ag: 0, held: 2 });
        let seen = failure.keep(order);
        assert!(matches!(seen, TreeError::Context { .. }), "{seen:?}");
        let back = failure.checked::<()>(Err(seen)).unwrap_err();
        assert!(matches!(back, FsError::Io { .. }), "{back:?}");
        let text = format!("{back}");
        assert!(text.contains("AG locks must ascend"), "{text}");
        let seen = failure.keep(FsError::NoSpace);
        assert!(matches!(seen, TreeError::NoSpace { .. }), "{seen:?}");
        let back = failure.checked::<()>(Err(seen)).unwrap_err();
        assert!(matches!(back, FsError::NoSpace), "{back:?}");
        let plain = TreeError::Corrupt {
            block: 9,
            what: "bad".into(),
        };
        let back = failure.checked::<()>(Err(plain)).unwrap_err();
        assert!(matches!(back, FsError::Corrupt { .. }), "{back:?}");
        failure.keep(FsError::NoSpace);
        assert_eq!(failure.checked(Ok(3)).unwrap(), 3);
        let plain = TreeError::NoSpace { why: "x".into() };
        let back = failure.checked::<()>(Err(plain)).unwrap_err();
        assert!(matches!(back, FsError::NoSpace));
        assert!(failure.0.is_none());
    }

    // Markers round-trip with and without a hint; a marker from before the hint (bits
    // 32..56 zero) reads as having none.
    #[test]
    fn marker_packs_root_levels_and_hint() {
        for free_hint in [None, Some(0), Some(7), Some((1 << 19) - 1)] {
            let marker = IndexMarker {
                root: 0xfedc_ba98,
                levels: 3,
                free_hint,
            };
            assert_eq!(IndexMarker::unpack(marker.pack()), marker);
        }
        let old = 1234 | (2u64 << LEVELS_SHIFT);
        let read = IndexMarker::unpack(old);
        assert_eq!((read.root, read.levels, read.free_hint), (1234, 2, None));
    }
}
