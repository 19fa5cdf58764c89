//! The file extent B+tree (`CMB1` blocks, `BmapCodec`): a data fork whose extents no longer
//! fit inline keeps them in a tree whose blocks come from the allocator near the inode and
//! carry the inode number as owner.
//!
//! Root placement: the inode fork holds a `BmapRoot` with exactly one child, the root block of
//! a `cairn_btree::Btree` (so the generic tree code, which keeps its root in a block, manages
//! every block); `BmapRoot.level` is the tree's height and its one key is the first file block
//! mapped. The fork's extent count is the number of records in the tree.
//!
//! Every change is made in the caller's transaction through `BmapCtx`, which also keeps the
//! lowest AG the transaction may still lock (AG headers are locked in ascending order) and the
//! number of tree blocks gained or lost, for the inode's block count.

use cairn_alloc::Request;
use cairn_btree::{BmapCodec, Btree, Buffers, Lookup, TreeContext, TreeError, TreeSpec};
use cairn_format::inode::{BmapRoot, ForkFormat};
use cairn_format::{AgNumber, Extent, FsBlock, InodeNumber};

use crate::FsError;
use crate::fs::Filesystem;
use crate::glue::{JournalLog, Tx, free_sequence};
use crate::inode::InodeData;

/// A transaction seen as a bmap tree's context: tree blocks from the allocator near `target`.
pub(crate) struct BmapCtx<'a, 'j> {
    pub tx: &'a mut Tx<'j>,
    pub fs: &'a Filesystem,
    /// Where new tree blocks go (the inode's cluster, then the last tree block allocated).
    pub target: FsBlock,
    /// Lowest AG this transaction may still lock.
    pub floor: &'a mut u32,
    /// Tree blocks allocated minus tree blocks freed.
    pub blocks_delta: i64,
}

impl std::fmt::Debug for BmapCtx<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BmapCtx")
            .field("target", &self.target)
            .field("floor", &self.floor)
            .finish()
    }
}

crate::glue::buffers_through_tx!(BmapCtx);

impl<'j> TreeContext<'j> for BmapCtx<'_, 'j> {
    fn allocate_block(&mut self) -> Result<FsBlock, TreeError> {
        let mut request = Request::near(self.target, 1, 1);
        request.lowest_ag = AgNumber(*self.floor);
        let log = JournalLog(&self.fs.journal);
        let found = self
            .fs
            .alloc
            .allocate(self.tx, &log, &request)
            .map_err(|error| TreeError::NoSpace {
                why: error.to_string(),
            })?
            .ok_or_else(|| TreeError::NoSpace {
                why: "no free block for a file extent tree".into(),
            })?;
        *self.floor = (*self.floor).max(found.ag.0);
        self.blocks_delta += 1;
        self.target = found.fs_start;
        Ok(found.fs_start)
    }

    fn free_block(&mut self, block: FsBlock) -> Result<(), TreeError> {
        let sequence = free_sequence(&self.fs.journal);
        let log = JournalLog(&self.fs.journal);
        let freed = self.fs.alloc.free(self.tx, &log, block, 1, sequence);
        match freed {
            Ok(_) => *self.floor = (*self.floor).max(self.fs.geometry.ag_of(block).0),
            // A block in a lower AG than an AGF the transaction holds (a merge after an
            // allocation higher up): freed after the commit, under a free intent.
            Err(cairn_alloc::AllocError::AgOrder { .. }) => {
                let tree_block = Extent::new(0, block, 1, false)
                    .map_err(|e| TreeError::NoSpace { why: e.to_string() })?;
                self.tx.defer_free(vec![tree_block]);
            }
            Err(error) => {
                return Err(TreeError::NoSpace {
                    why: error.to_string(),
                });
            }
        }
        self.blocks_delta -= 1;
        Ok(())
    }
}

/// The tree description of inode `number`'s extent tree.
pub(crate) fn spec(fs: &Filesystem, number: u64) -> Result<TreeSpec, FsError> {
    Ok(TreeSpec::file::<BmapCodec>(&fs.geometry, fs.uuid, number)?)
}

/// Where the first tree block of inode `number` goes: its own cluster block.
pub(crate) fn home_target(fs: &Filesystem, number: u64) -> FsBlock {
    fs.geometry
        .inode_position(InodeNumber(number))
        .map_or(FsBlock(fs.geometry.ag_start(0)), |(block, _)| block)
}

/// Opens the tree whose root the (Btree format) data fork of `data` holds.
pub(crate) fn open(
    fs: &Filesystem,
    number: u64,
    data: &InodeData,
) -> Result<Btree<BmapCodec>, FsError> {
    let corrupt = |detail: String| FsError::corrupt("extent tree root", number, detail);
    let root = BmapRoot::decode(data.data_fork()).map_err(|e| corrupt(e.to_string()))?;
    let [pointer] = root.pointers[..] else {
        return Err(corrupt(format!(
            "{} children, cairn roots have one",
            root.pointers.len()
        )));
    };
    Ok(Btree::open(
        spec(fs, number)?,
        pointer,
        u32::from(root.level),
    )?)
}

/// Every record of the tree, in order, read through `ctx`.
pub(crate) fn records<'c, X: Buffers<'c>>(
    fs: &Filesystem,
    number: u64,
    data: &InodeData,
    ctx: &mut X,
) -> Result<Vec<Extent>, FsError> {
    let tree = open(fs, number, data)?;
    let list = tree.records(ctx)?;
    if list.len() as u64 != u64::from(data.core.data_extent_count) {
        let detail = format!(
            "the inode counts {} extents, the tree holds {}",
            data.core.data_extent_count,
            list.len()
        );
        return Err(FsError::corrupt("extent tree", number, detail));
    }
    Ok(list)
}

/// The records of the tree that a change to file blocks `first..last` can touch, read
/// through `ctx`: from the record before the last one starting at or before `first` (an
/// allocation's goal and a merge look one extent left) to the first one starting at or
/// after `last` (a merge looks one right). Also whether the tree's first record is among
/// them. A few leaves instead of all of them: a fragmented file's map is not read whole for
/// every write.
pub(crate) fn records_around<'c, X: Buffers<'c>>(
    fs: &Filesystem,
    number: u64,
    data: &InodeData,
    ctx: &mut X,
    (first, last): (u64, u64),
) -> Result<(Vec<Extent>, bool), FsError> {
    let tree = open(fs, number, data)?;
    let key = cairn_format::BmapKey { file_block: first };
    let found = match tree.lookup(ctx, &key, Lookup::Le)? {
        Some(cursor) => Some(cursor),
        None => tree.first(ctx)?,
    };
    let Some(mut cursor) = found else {
        return Ok((Vec::new(), true));
    };
    tree.prev(ctx, &mut cursor)?;
    let from_start = !tree.prev(ctx, &mut cursor.clone())?;
    let mut list = vec![tree.record(ctx, &cursor)?];
    while list.last().is_some_and(|e| e.file_block < last) && tree.next(ctx, &mut cursor)? {
        list.push(tree.record(ctx, &cursor)?);
    }
    Ok((list, from_start))
}

/// Up to `count` records from file block `from` on (`forward`), or the `count` before it,
/// with one more on each side (the neighbours a windowed change must see), read through
/// `ctx`; and whether the tree's first record is among them. What a shift step moves
/// (`FileMap::load_span`): `records_around` needs the range's end, which depends on the
/// records.
pub(crate) fn records_span<'c, X: Buffers<'c>>(
    fs: &Filesystem,
    number: u64,
    data: &InodeData,
    ctx: &mut X,
    (from, count, forward): (u64, usize, bool),
) -> Result<(Vec<Extent>, bool), FsError> {
    let tree = open(fs, number, data)?;
    let before = match from.checked_sub(1) {
        Some(file_block) => {
            let key = cairn_format::BmapKey { file_block };
            tree.lookup(ctx, &key, Lookup::Le)?
        }
        None => None,
    };
    let Some(anchor) = before.map_or_else(|| tree.first(ctx), |cursor| Ok(Some(cursor)))? else {
        return Ok((Vec::new(), true));
    };
    let mut list = vec![tree.record(ctx, &anchor)?];
    let (mut low, mut high) = (anchor.clone(), anchor);
    let (below, above) = match forward {
        true => (0, count + 1),
        false => (count, 1),
    };
    for _ in 0..below {
        if !tree.prev(ctx, &mut low)? {
            break;
        }
        list.push(tree.record(ctx, &low)?);
    }
    for _ in 0..above {
        if !tree.next(ctx, &mut high)? {
            break;
        }
        list.push(tree.record(ctx, &high)?);
    }
    let from_start = !tree.prev(ctx, &mut low)?;
    list.sort_by_key(|e| e.file_block);
    Ok((list, from_start))
}

/// The first mapped file block, from the fork root's key.
pub(crate) fn first_block(number: u64, data: &InodeData) -> Result<u64, FsError> {
    let root = BmapRoot::decode(data.data_fork())
        .map_err(|e| FsError::corrupt("extent tree root", number, e.to_string()))?;
    root.keys
        .first()
        .copied()
        .ok_or_else(|| FsError::corrupt("extent tree root", number, "no key".to_string()))
}

/// Writes the fork root for `tree` (first mapped block `first`) and the record count.
fn write_root(
    data: &mut InodeData,
    tree: &Btree<BmapCodec>,
    first: u64,
    count: usize,
) -> Result<(), FsError> {
    let root = BmapRoot {
        level: tree.levels() as u16,
        keys: vec![first],
        pointers: vec![tree.root()],
    };
    let at = data.core.header.blkno;
    root.encode(data.data_fork_mut())
        .map_err(|e| FsError::corrupt("extent tree root", at, e.to_string()))?;
    data.core.data_format = ForkFormat::Btree;
    data.core.data_extent_count = count as u32;
    Ok(())
}

/// Moves an inline extent list into a new tree holding `list`.
pub(crate) fn create(
    ctx: &mut BmapCtx<'_, '_>,
    number: u64,
    data: &mut InodeData,
    list: &[Extent],
) -> Result<(), FsError> {
    let root = ctx.allocate_block()?;
    let mut tree = Btree::<BmapCodec>::create(ctx, spec(ctx.fs, number)?, root.0)?;
    for extent in list {
        tree.insert(ctx, extent)?;
    }
    let first = list.first().map_or(0, |e| e.file_block);
    write_root(data, &tree, first, list.len())
}

/// Turns the tree holding `old` into the tree holding `new`: inserts new records first (the
/// only changes that may need a block; an insert that finds none takes back the ones before
/// it, so a failed apply leaves the tree as it was), then rewrites records whose key stayed
/// but whose extent changed, then deletes records that went. `old` and `new` may be a window
/// of the map (the same file range before and after); the root then gets the map's first
/// block `first` and its record count `count`.
pub(crate) fn apply(
    ctx: &mut BmapCtx<'_, '_>,
    number: u64,
    data: &mut InodeData,
    (old, new): (&[Extent], &[Extent]),
    (first, count): (u64, usize),
) -> Result<(), FsError> {
    let mut tree = open(ctx.fs, number, data)?;
    let (deleted, updated, inserted) = diff(old, new);
    let key = |extent: &Extent| cairn_format::BmapKey {
        file_block: extent.file_block,
    };
    for (done, extent) in inserted.iter().enumerate() {
        if let Err(error) = tree.insert(ctx, extent) {
            for earlier in &inserted[..done] {
                tree.delete(ctx, &key(earlier))?;
            }
            return Err(error.into());
        }
    }
    for extent in &updated {
        tree.update(ctx, &key(extent), extent)?;
    }
    for extent in &deleted {
        tree.delete(ctx, &key(extent))?;
    }
    write_root(data, &tree, first, count)
}

/// Rewrites the records `moves` names (each `(old, new)`: the same extent at a new file
/// block, no record passing another) in place, so the tree's shape, and its blocks, stay:
/// a collapse or insert range never needs a block for its map. Records moving down are
/// rewritten from the lowest, records moving up from the highest, so each new key lies
/// between its neighbours' when it is written. The root gets the map's first block `first`
/// and its record count `count`.
pub(crate) fn move_records(
    ctx: &mut BmapCtx<'_, '_>,
    number: u64,
    data: &mut InodeData,
    moves: &[(Extent, Extent)],
    (first, count): (u64, usize),
) -> Result<(), FsError> {
    let mut tree = open(ctx.fs, number, data)?;
    let mut ordered = moves.to_vec();
    ordered.sort_by_key(|(old, _)| old.file_block);
    if ordered
        .first()
        .is_some_and(|(old, new)| new.file_block > old.file_block)
    {
        ordered.reverse();
    }
    for (old, new) in &ordered {
        let key = cairn_format::BmapKey {
            file_block: old.file_block,
        };
        tree.update(ctx, &key, new)?;
    }
    write_root(data, &tree, first, count)
}

/// Empties the tree holding `old` and frees all of its blocks; the caller then stores the
/// extents inline.
pub(crate) fn destroy(
    ctx: &mut BmapCtx<'_, '_>,
    number: u64,
    data: &InodeData,
    old: &[Extent],
) -> Result<(), FsError> {
    let mut tree = open(ctx.fs, number, data)?;
    // Deleting records merges and collapses blocks back to a single root leaf.
    for extent in old {
        tree.delete(
            ctx,
            &cairn_format::BmapKey {
                file_block: extent.file_block,
            },
        )?;
    }
    let root = tree.spec().fs_block(tree.root());
    let read_spec = tree.spec().read_spec;
    ctx.invalidate(root, &read_spec)?;
    ctx.free_block(root)?;
    Ok(())
}

/// Records of `old` to delete, to update in place (same key) and to insert, to reach `new`.
/// Both lists are sorted by file block with distinct keys.
pub(crate) fn diff(old: &[Extent], new: &[Extent]) -> (Vec<Extent>, Vec<Extent>, Vec<Extent>) {
    let (mut deleted, mut updated, mut inserted) = (Vec::new(), Vec::new(), Vec::new());
    let (mut i, mut j) = (0, 0);
    while i < old.len() || j < new.len() {
        match (old.get(i), new.get(j)) {
            (Some(a), Some(b)) if a.file_block == b.file_block => {
                if a != b {
                    updated.push(*b);
                }
                i += 1;
                j += 1;
            }
            (Some(a), Some(b)) if a.file_block < b.file_block => {
                deleted.push(*a);
                i += 1;
            }
            (Some(a), None) => {
                deleted.push(*a);
                i += 1;
            }
            (_, Some(b)) => {
                inserted.push(*b);
                j += 1;
            }
            (None, None) => break,
        }
    }
    (deleted, updated, inserted)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use cairn_blockdev::BlockDevice;

    use super::*;
    use crate::types::MountOptions;

    fn extent(file_block: u64, fs_block: u64, length: u32) -> Extent {
        Extent::new(file_block, FsBlock(fs_block), length, false).unwrap()
    }

    // Checks the diff on overlapping edits: a kept, an updated, a deleted and an inserted key.
    #[test]
    fn diff_splits_changes_by_kind() {
        let old = [extent(0, 100, 4), extent(10, 200, 2), extent(20, 300, 1)];
        let new = [extent(0, 100, 4), extent(10, 200, 5), extent(15, 400, 1)];
        let (deleted, updated, inserted) = diff(&old, &new);
        assert_eq!(deleted, vec![old[2]]);
        assert_eq!(updated, vec![new[1]]);
        assert_eq!(inserted, vec![new[2]]);
    }

    // A tree block in a lower AG than an AGF the transaction holds (a merge after an
    // allocation higher up) is freed after the commit, under a free intent, instead of
    // failing the change: the concurrency stress saw writes fail with NoSpace that way on a
    // filesystem 89% free.
    #[test]
    fn a_tree_block_below_a_held_agf_is_freed_after_the_commit() {
        let device = Arc::new(crate::test_device::formatted(64 << 20, [7; 16]));
        let dyn_device: Arc<dyn BlockDevice> = device;
        let fs = Filesystem::mount(dyn_device, MountOptions::default()).unwrap();
        assert!(fs.geometry.ag_count >= 2);
        let free_at_start = fs.statfs().unwrap().blocks_free;
        let allocate_in = |tx: &mut Tx<'_>, ag: u32| {
            let target = FsBlock(fs.geometry.ag_start(ag) + 100);
            let request = Request::near(target, 1, 1).in_target_ag_only();
            let log = JournalLog(&fs.journal);
            let found = fs.alloc.allocate(tx, &log, &request).unwrap().unwrap();
            assert_eq!(found.ag.0, ag);
            found.fs_start
        };
        let mut tx = fs.begin(crate::bmap::step_reservation(&fs)).unwrap();
        let low = allocate_in(&mut tx, 0);
        fs.commit(tx, &mut []).unwrap();
        let mut tx = fs.begin(crate::bmap::step_reservation(&fs)).unwrap();
        let high = allocate_in(&mut tx, 1);
        let mut floor = 1;
        let mut ctx = BmapCtx {
            tx: &mut tx,
            fs: &fs,
            target: high,
            floor: &mut floor,
            blocks_delta: 0,
        };
        ctx.free_block(low).unwrap();
        assert_eq!(ctx.blocks_delta, -1);
        assert_eq!(tx.deferred_frees.len(), 1, "the free waits for the commit");
        fs.commit(tx, &mut []).unwrap();
        assert_eq!(fs.statfs().unwrap().blocks_free, free_at_start - 1);
        let mut tx = fs.begin(crate::bmap::step_reservation(&fs)).unwrap();
        let log = JournalLog(&fs.journal);
        let sequence = free_sequence(&fs.journal);
        fs.alloc.free(&mut tx, &log, high, 1, sequence).unwrap();
        fs.commit(tx, &mut []).unwrap();
        assert_eq!(fs.statfs().unwrap().blocks_free, free_at_start);
        fs.unmount().unwrap();
    }
}
