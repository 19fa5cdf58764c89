//! The index form of an attr fork, for more attributes than one leaf block holds: leaf blocks
//! (`CXA1`, any subset of the attributes each) and an index B+tree (`CXB1`) with one record
//! per attribute, mapping the name's hash to the leaf that holds it. A lookup, set or remove
//! reads the tree path and one leaf, so its cost does not grow with the number of
//! attributes; a list reads every leaf once.
//!
//! Collisions: records are keyed by (hash, seq), seq telling apart names that share a hash
//! (a new record takes one past the highest seq of its hash), so a lookup walks the records
//! of its hash in key order and reads only their leaves; a removal deletes its record and
//! nothing moves.
//!
//! Leaves: a new attribute goes to the fill leaf (`XattrIndexRoot::fill`, the leaf that last
//! took one or lost one) if it has room, else to a new leaf, which becomes the fill leaf. A
//! leaf that loses its last attribute is freed; the index tree's merges free tree blocks;
//! the last attribute's removal frees the tree, and the fork goes away. Blocks a change
//! unreferences are named in a free intent in its transaction and freed after the commit
//! (`xattr_store::free_unused`), which keeps AG locks in order.
//!
//! Every change is one transaction: allocations (a remote value, a new leaf, split blocks,
//! which the tree takes before it changes anything) come first, so a change that finds no
//! space changes nothing but those allocations, which `xattr_store` gives back.

use cairn_alloc::Request;
use cairn_btree::Lookup;
use cairn_btree::{Btree, Buffers, TreeCodec, TreeContext, TreeError, TreeSpec};
use cairn_bufcache::{HeaderOps, ReadSpec};
use cairn_format::dir::name_hash;
use cairn_format::xattr::{
    Namespace, XattrIndexKey, XattrIndexRecord, XattrIndexRoot, XattrLeaf, XattrLeafEntry,
    XattrValue,
};
use cairn_format::{AgNumber, FsBlock, MetaHeader, MetaKind};

use crate::FsError;
use crate::bmap_tree::home_target;
use crate::dir_index::Failure;
use crate::fs::Filesystem;
use crate::glue::{JournalLog, Tx};

static ATTR_LEAF_OPS: HeaderOps = HeaderOps::new(MetaKind::AttrBlock);

/// The attribute index tree codec.
#[derive(Debug, Clone, Copy)]
pub(crate) struct XattrIndexCodec;

impl TreeCodec for XattrIndexCodec {
    type Record = XattrIndexRecord;
    type Key = XattrIndexKey;
    const KIND: MetaKind = MetaKind::AttrBtree;

    fn key(record: &XattrIndexRecord) -> XattrIndexKey {
        record.key()
    }
}

/// The read spec of inode `number`'s attribute leaves.
pub(crate) fn leaf_spec(fs: &Filesystem, number: u64) -> ReadSpec {
    ReadSpec::new(&ATTR_LEAF_OPS, fs.uuid).with_owner(number)
}

/// The index tree of `root`.
pub(crate) fn open(
    fs: &Filesystem,
    number: u64,
    root: &XattrIndexRoot,
) -> Result<Btree<XattrIndexCodec>, FsError> {
    let spec = TreeSpec::file::<XattrIndexCodec>(&fs.geometry, fs.uuid, number)?;
    Ok(Btree::open(spec, root.root.0, root.levels)?)
}

/// Reads and decodes leaf `block` of inode `number`.
pub(crate) fn read_leaf<'c, X: Buffers<'c>>(
    fs: &Filesystem,
    ctx: &mut X,
    number: u64,
    block: FsBlock,
) -> Result<XattrLeaf, FsError> {
    if block.0 >= fs.geometry.block_count {
        return Err(FsError::corrupt(
            "xattr index",
            number,
            "leaf past the device",
        ));
    }
    let guard = ctx.buffer(block, &leaf_spec(fs, number), false)?;
    XattrLeaf::decode_block(guard)
        .map_err(|e| FsError::corrupt("xattr block", block.0, e.to_string()))
}

/// The attribute `(namespace, name)`: its record and its leaf.
pub(crate) fn find<'c, X: Buffers<'c>>(
    fs: &Filesystem,
    ctx: &mut X,
    number: u64,
    tree: &Btree<XattrIndexCodec>,
    (namespace, name): (Namespace, &[u8]),
) -> Result<Option<(XattrIndexRecord, XattrLeaf)>, FsError> {
    let hash = name_hash(name);
    let first = XattrIndexKey { hash, seq: 0 };
    let Some(mut cursor) = tree.lookup(ctx, &first, Lookup::Ge)? else {
        return Ok(None);
    };
    loop {
        let record = tree.record(ctx, &cursor)?;
        if record.hash != hash {
            return Ok(None);
        }
        let leaf = read_leaf(fs, ctx, number, record.leaf)?;
        if leaf.find(namespace, name).is_some() {
            return Ok(Some((record, leaf)));
        }
        if !tree.next(ctx, &mut cursor)? {
            return Ok(None);
        }
    }
}

/// The value of `(namespace, name)`, if the inode has it.
pub(crate) fn get<'c, X: Buffers<'c>>(
    fs: &Filesystem,
    ctx: &mut X,
    number: u64,
    root: &XattrIndexRoot,
    key: (Namespace, &[u8]),
) -> Result<Option<XattrValue>, FsError> {
    let tree = open(fs, number, root)?;
    let Some((_, leaf)) = find(fs, ctx, number, &tree, key)? else {
        return Ok(None);
    };
    Ok(leaf
        .find(key.0, key.1)
        .map(|index| leaf.entries[index].value.clone()))
}

/// Every leaf of the index, each once, in block order.
pub(crate) fn leaves<'c, X: Buffers<'c>>(
    fs: &Filesystem,
    ctx: &mut X,
    number: u64,
    root: &XattrIndexRoot,
) -> Result<Vec<FsBlock>, FsError> {
    let tree = open(fs, number, root)?;
    let mut blocks: Vec<FsBlock> = tree.records(ctx)?.iter().map(|r| r.leaf).collect();
    blocks.sort_by_key(|block| block.0);
    blocks.dedup();
    Ok(blocks)
}

/// Every attribute of the index (leaf by leaf).
pub(crate) fn entries<'c, X: Buffers<'c>>(
    fs: &Filesystem,
    ctx: &mut X,
    number: u64,
    root: &XattrIndexRoot,
) -> Result<Vec<XattrLeafEntry>, FsError> {
    let mut out = Vec::new();
    for block in leaves(fs, ctx, number, root)? {
        out.extend(read_leaf(fs, ctx, number, block)?.entries);
    }
    Ok(out)
}

/// One change's context: the transaction, the inode, the AG floor its allocations keep to
/// (ascending AG locks), and the blocks it allocated and unreferenced.
pub(crate) struct AttrCtx<'a, 'j> {
    pub tx: &'a mut Tx<'j>,
    pub fs: &'a Filesystem,
    pub number: u64,
    floor: u32,
    /// Blocks this change allocated, with whether they are metadata buffers (leaves, tree
    /// blocks), which a failed change invalidates before giving them back.
    pub allocated: Vec<(FsBlock, u32, bool)>,
    /// Blocks no longer referenced, freed after the commit under a free intent.
    pub unused: Vec<(FsBlock, u32)>,
    failure: Failure,
}

impl std::fmt::Debug for AttrCtx<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttrCtx").finish_non_exhaustive()
    }
}

crate::glue::buffers_through_tx!(AttrCtx);

impl<'j> TreeContext<'j> for AttrCtx<'_, 'j> {
    fn allocate_block(&mut self) -> Result<FsBlock, TreeError> {
        let result = self.allocate(1, true);
        result.map_err(|error| self.failure.keep(error))
    }

    fn free_block(&mut self, block: FsBlock) -> Result<(), TreeError> {
        self.unused.push((block, 1));
        Ok(())
    }
}

impl<'a, 'j> AttrCtx<'a, 'j> {
    pub fn new(tx: &'a mut Tx<'j>, fs: &'a Filesystem, number: u64) -> Self {
        Self {
            tx,
            fs,
            number,
            floor: 0,
            allocated: Vec::new(),
            unused: Vec::new(),
            failure: Failure::default(),
        }
    }

    /// Allocates `length` contiguous blocks near the inode, at or above the AG floor.
    pub fn allocate(&mut self, length: u32, metadata: bool) -> Result<FsBlock, FsError> {
        let mut request = Request::near(home_target(self.fs, self.number), length, length);
        request.lowest_ag = AgNumber(self.floor);
        let found = self
            .fs
            .alloc
            .allocate(self.tx, &JournalLog(&self.fs.journal), &request)?
            .ok_or(FsError::NoSpace)?;
        self.floor = self.floor.max(found.ag.0);
        self.allocated.push((found.fs_start, length, metadata));
        Ok(found.fs_start)
    }

    fn checked<T>(&mut self, result: Result<T, TreeError>) -> Result<T, FsError> {
        self.failure.checked(result)
    }

    /// Writes `entries` (sorted here) as leaf `block`; `new` for a block this change made.
    pub fn write_leaf(
        &mut self,
        block: FsBlock,
        mut entries: Vec<XattrLeafEntry>,
        new: bool,
    ) -> Result<(), FsError> {
        entries.sort_by(|a, b| sort_key(a).cmp(&sort_key(b)));
        let leaf = XattrLeaf {
            header: MetaHeader::new(MetaKind::AttrBlock, block.0, self.fs.uuid, self.number),
            entries,
        };
        let mut bytes = vec![0u8; self.fs.geometry.block_size as usize];
        leaf.encode_block(&mut bytes)
            .map_err(|e| FsError::corrupt("xattr block", block.0, e.to_string()))?;
        let spec = leaf_spec(self.fs, self.number);
        let guard = self.tx.buffer(block, &spec, new)?;
        guard.write(0, &bytes)?;
        Ok(())
    }

    /// Gives back leaf `block`, emptied by this change.
    fn drop_leaf(&mut self, block: FsBlock) -> Result<(), FsError> {
        self.tx
            .invalidate(block, &leaf_spec(self.fs, self.number))?;
        self.unused.push((block, 1));
        Ok(())
    }

    /// Unreferences the remote blocks of a value that goes.
    pub fn drop_value(&mut self, value: &XattrValue) {
        if let XattrValue::Remote { block, length } = value {
            let blocks = length.div_ceil(self.fs.geometry.block_size).max(1);
            self.unused.push((*block, blocks));
        }
    }
}

fn sort_key(entry: &XattrLeafEntry) -> (u32, Namespace, &[u8]) {
    (name_hash(&entry.name), entry.namespace, &entry.name)
}

/// Whether `entries` fit one leaf block.
pub(crate) fn fits(fs: &Filesystem, entries: Vec<XattrLeafEntry>) -> bool {
    let leaf = XattrLeaf {
        header: MetaHeader::new(MetaKind::AttrBlock, 0, fs.uuid, 0),
        entries,
    };
    leaf.used_bytes() <= fs.geometry.block_size as usize
}

/// Inserts a record for an attribute of `hash` in `leaf`, one past the highest seq of its
/// hash.
fn insert_record(
    tree: &mut Btree<XattrIndexCodec>,
    ctx: &mut AttrCtx<'_, '_>,
    hash: u32,
    leaf: FsBlock,
) -> Result<(), FsError> {
    let last = XattrIndexKey {
        hash,
        seq: u32::MAX,
    };
    let seq = match tree.lookup(ctx, &last, Lookup::Le)? {
        Some(cursor) => {
            let record = tree.record(ctx, &cursor)?;
            match record.hash == hash {
                true => record.seq.checked_add(1).ok_or(FsError::NoSpace)?,
                false => 0,
            }
        }
        None => 0,
    };
    let inserted = tree.insert(ctx, &XattrIndexRecord { hash, seq, leaf });
    ctx.checked(inserted)
}

/// The leaf a new attribute `entry` goes to: the fill leaf if it has room (other than
/// `avoid`), else a new one. Returns the block, its current entries, and whether it is new.
fn leaf_for(
    ctx: &mut AttrCtx<'_, '_>,
    root: &XattrIndexRoot,
    entry: &XattrLeafEntry,
    avoid: Option<FsBlock>,
) -> Result<(FsBlock, Vec<XattrLeafEntry>, bool), FsError> {
    if let Some(fill) = root.fill.filter(|&fill| Some(fill) != avoid) {
        let leaf = read_leaf(ctx.fs, ctx, ctx.number, fill)?;
        let mut with = leaf.entries.clone();
        with.push(entry.clone());
        if fits(ctx.fs, with) {
            return Ok((fill, leaf.entries, false));
        }
    }
    Ok((ctx.allocate(1, true)?, Vec::new(), true))
}

/// Sets `entry` (its value placed already: local, or remote blocks this change allocated and
/// wrote) in the index form `root`; `existing` is what `find` found for its name. It stays
/// in its leaf if it still fits there, else it goes where a new attribute goes. Updates
/// `root`.
pub(crate) fn put(
    ctx: &mut AttrCtx<'_, '_>,
    root: &mut XattrIndexRoot,
    entry: XattrLeafEntry,
    existing: Option<(XattrIndexRecord, XattrLeaf)>,
) -> Result<(), FsError> {
    let mut tree = open(ctx.fs, ctx.number, root)?;
    if let Some((record, leaf)) = &existing {
        let mut replaced = leaf.entries.clone();
        let old = replace(&mut replaced, &entry);
        if fits(ctx.fs, replaced.clone()) {
            ctx.write_leaf(record.leaf, replaced, false)?;
            ctx.drop_value(&old);
            return Ok(());
        }
    }
    // A new attribute, or one that outgrew its leaf: a record first (the fallible part),
    // then the leaves.
    let avoid = existing.as_ref().map(|(record, _)| record.leaf);
    let (block, mut target, new) = leaf_for(ctx, root, &entry, avoid)?;
    insert_record(&mut tree, ctx, name_hash(&entry.name), block)?;
    target.push(entry.clone());
    ctx.write_leaf(block, target, new)?;
    root.fill = Some(block);
    if let Some((record, leaf)) = existing {
        remove_entry(
            ctx,
            root,
            &mut tree,
            record,
            leaf,
            (entry.namespace, &entry.name),
        )?;
    }
    *root = XattrIndexRoot {
        root: FsBlock(tree.root()),
        levels: tree.levels(),
        ..*root
    };
    Ok(())
}

/// Replaces the entry of `entry`'s name in `entries`; returns the old value.
fn replace(entries: &mut [XattrLeafEntry], entry: &XattrLeafEntry) -> XattrValue {
    for slot in entries.iter_mut() {
        if slot.namespace == entry.namespace && slot.name == entry.name {
            return std::mem::replace(&mut slot.value, entry.value.clone());
        }
    }
    XattrValue::Local(Vec::new())
}

/// Removes `key` (found as `record` in `leaf`) from its leaf and the tree, unreferencing its
/// value and, if it was the leaf's last, the leaf.
fn remove_entry(
    ctx: &mut AttrCtx<'_, '_>,
    root: &mut XattrIndexRoot,
    tree: &mut Btree<XattrIndexCodec>,
    record: XattrIndexRecord,
    mut leaf: XattrLeaf,
    key: (Namespace, &[u8]),
) -> Result<(), FsError> {
    let index = leaf
        .find(key.0, key.1)
        .ok_or_else(|| FsError::corrupt("xattr index", ctx.number, "entry left its leaf"))?;
    let gone = leaf.entries.remove(index);
    ctx.drop_value(&gone.value);
    let deleted = tree.delete(ctx, &record.key());
    ctx.checked(deleted)?;
    if leaf.entries.is_empty() {
        ctx.drop_leaf(record.leaf)?;
        if root.fill == Some(record.leaf) {
            root.fill = None;
        }
    } else {
        ctx.write_leaf(record.leaf, leaf.entries, false)?;
        root.fill = Some(record.leaf);
    }
    Ok(())
}

/// Removes the attribute `key`, found by `find` as `found`. Updates `root`; returns `None`
/// when it was the last (the tree is given back too, and the fork must go).
pub(crate) fn remove(
    ctx: &mut AttrCtx<'_, '_>,
    root: &XattrIndexRoot,
    found: (XattrIndexRecord, XattrLeaf),
    key: (Namespace, &[u8]),
) -> Result<Option<XattrIndexRoot>, FsError> {
    let mut tree = open(ctx.fs, ctx.number, root)?;
    let mut root = *root;
    remove_entry(ctx, &mut root, &mut tree, found.0, found.1, key)?;
    if tree.first(ctx)?.is_none() {
        // An empty tree is its root leaf alone.
        let spec = TreeSpec::file::<XattrIndexCodec>(&ctx.fs.geometry, ctx.fs.uuid, ctx.number)?;
        ctx.tx.invalidate(FsBlock(tree.root()), &spec.read_spec)?;
        ctx.unused.push((FsBlock(tree.root()), 1));
        return Ok(None);
    }
    Ok(Some(XattrIndexRoot {
        root: FsBlock(tree.root()),
        levels: tree.levels(),
        ..root
    }))
}

/// Builds the index form from `entries` (values placed), which one leaf no longer holds:
/// leaves filled in hash order (the first one at `reuse`, the old leaf, if given), a tree
/// whose root leaf holds every record (a leaf block holds fewer attributes than a tree leaf
/// holds records, so this needs no split). Allocates everything before writing anything.
pub(crate) fn build(
    ctx: &mut AttrCtx<'_, '_>,
    mut entries: Vec<XattrLeafEntry>,
    reuse: Option<FsBlock>,
) -> Result<XattrIndexRoot, FsError> {
    entries.sort_by(|a, b| sort_key(a).cmp(&sort_key(b)));
    let mut groups: Vec<Vec<XattrLeafEntry>> = vec![Vec::new()];
    for entry in entries {
        let mut with = groups.last().cloned().unwrap_or_default();
        with.push(entry.clone());
        match fits(ctx.fs, with) {
            true => groups.last_mut().map(|g| g.push(entry)).unwrap_or_default(),
            false => groups.push(vec![entry]),
        }
    }
    let mut blocks = Vec::with_capacity(groups.len());
    for index in 0..groups.len() {
        match (index, reuse) {
            (0, Some(block)) => blocks.push((block, false)),
            _ => blocks.push((ctx.allocate(1, true)?, true)),
        }
    }
    let root_block = ctx.allocate(1, true)?;
    let spec = TreeSpec::file::<XattrIndexCodec>(&ctx.fs.geometry, ctx.fs.uuid, ctx.number)?;
    let created = Btree::<XattrIndexCodec>::create(ctx, spec, root_block.0);
    let mut tree = ctx.checked(created)?;
    for (group, &(block, _)) in groups.iter().zip(&blocks) {
        for entry in group {
            insert_record(&mut tree, ctx, name_hash(&entry.name), block)?;
        }
    }
    let fill = blocks.last().map(|&(block, _)| block);
    for (group, (block, new)) in groups.into_iter().zip(blocks) {
        ctx.write_leaf(block, group, new)?;
    }
    Ok(XattrIndexRoot {
        root: FsBlock(tree.root()),
        levels: tree.levels(),
        fill,
    })
}

/// Removes up to `count` attributes (in key order), for freeing an unlinked inode's
/// attributes a few at a time. Returns the new root, `None` once none is left.
pub(crate) fn remove_some(
    ctx: &mut AttrCtx<'_, '_>,
    root: &XattrIndexRoot,
    count: usize,
) -> Result<Option<XattrIndexRoot>, FsError> {
    let mut root = *root;
    for _ in 0..count {
        let tree = open(ctx.fs, ctx.number, &root)?;
        let Some(cursor) = tree.first(ctx)? else {
            return Ok(None);
        };
        let record = tree.record(ctx, &cursor)?;
        let leaf = read_leaf(ctx.fs, ctx, ctx.number, record.leaf)?;
        let Some(entry) = leaf
            .entries
            .iter()
            .find(|e| name_hash(&e.name) == record.hash)
        else {
            return Err(FsError::corrupt(
                "xattr index",
                ctx.number,
                "record without entry",
            ));
        };
        let key = (entry.namespace, entry.name.clone());
        let found = find(ctx.fs, ctx, ctx.number, &tree, (key.0, &key.1))?
            .ok_or_else(|| FsError::corrupt("xattr index", ctx.number, "entry not found"))?;
        match remove(ctx, &root, found, (key.0, &key.1))? {
            Some(next) => root = next,
            None => return Ok(None),
        }
    }
    Ok(Some(root))
}
