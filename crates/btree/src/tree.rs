//! The tree handle (`Btree`), its description (`TreeSpec`), block loading and searches.

use std::marker::PhantomData;
use std::ops::Range;

use cairn_bufcache::{BufGuard, ReadSpec};
use cairn_format::limits::BTREE_LEVELS_MAX;
use cairn_format::{BtreeLayout, FsBlock, Geometry, MetaHeader, OnDisk};

use crate::cursor::{Cursor, Step};
use crate::node::{ENTRY_BYTES_MAX, Node, Slots, node};
use crate::{Buffers, TreeCodec, TreeError, ops_for};

/// Reuse count given to tree buffers: they are looked up on every allocation.
const TREE_LRU_REF: u32 = 4;

/// Everything a tree needs to know besides its root: block layout, identity stamped in each
/// header, and how pointers map to filesystem blocks.
#[derive(Debug, Clone)]
pub struct TreeSpec {
    pub layout: BtreeLayout,
    pub uuid: [u8; 16],
    /// AG number for AG trees, inode number for file trees.
    pub owner: u64,
    /// Filesystem block of pointer value 0: the AG's first block for AG trees (pointers are
    /// AG blocks), 0 for file trees (pointers are filesystem blocks).
    pub base: u64,
    /// Values child and sibling pointers may take.
    pub bounds: Range<u64>,
    /// Entries per block, at most the layout's capacity; tests lower it to force splits.
    pub capacity_limit: usize,
    pub read_spec: ReadSpec,
}

impl TreeSpec {
    /// The spec of the `C` tree of AG `ag`.
    pub fn ag<C: TreeCodec>(
        geometry: &Geometry,
        uuid: [u8; 16],
        ag: u32,
    ) -> Result<TreeSpec, TreeError> {
        let base = geometry.ag_start(ag);
        Self::build::<C>(geometry, uuid, u64::from(ag), base)
    }

    /// The spec of the `C` tree of a file owned by inode `inode`.
    pub fn file<C: TreeCodec>(
        geometry: &Geometry,
        uuid: [u8; 16],
        inode: u64,
    ) -> Result<TreeSpec, TreeError> {
        Self::build::<C>(geometry, uuid, inode, 0)
    }

    fn build<C: TreeCodec>(
        geometry: &Geometry,
        uuid: [u8; 16],
        owner: u64,
        base: u64,
    ) -> Result<TreeSpec, TreeError> {
        let spec_error = |why| TreeError::Spec { why };
        let layout = BtreeLayout::for_kind(C::KIND, geometry.block_size)
            .ok_or(spec_error("not a B+tree kind"))?;
        if layout.record_size != C::Record::SIZE || layout.key_size != C::Key::SIZE {
            return Err(spec_error("codec sizes differ from the kind's layout"));
        }
        if layout.record_size > ENTRY_BYTES_MAX || layout.key_size > ENTRY_BYTES_MAX {
            return Err(spec_error("records or keys longer than ENTRY_BYTES_MAX"));
        }
        let ops = ops_for(C::KIND).ok_or(spec_error("no verifier for the kind"))?;
        Ok(TreeSpec {
            bounds: layout.pointer_bounds(geometry, owner),
            layout,
            uuid,
            owner,
            base,
            capacity_limit: usize::MAX,
            read_spec: ReadSpec::new(ops, uuid)
                .with_owner(owner)
                .with_lru_ref(TREE_LRU_REF),
        })
    }

    /// Limits entries per block to `limit` (at least 4, so splits and merges stay well
    /// defined: a split leaves two non-empty halves, a merge of a minimal pair fits).
    pub fn with_capacity_limit(mut self, limit: usize) -> Result<TreeSpec, TreeError> {
        if limit < 4 {
            return Err(TreeError::Spec {
                why: "capacity limit below 4",
            });
        }
        self.capacity_limit = limit;
        Ok(self)
    }

    /// Entries a block at `level` may hold.
    pub fn capacity(&self, level: u16) -> usize {
        self.layout.capacity(level).min(self.capacity_limit)
    }

    /// Fewest entries a block other than the root may hold.
    pub fn min_entries(&self, level: u16) -> usize {
        self.capacity(level) / 2
    }

    pub fn fs_block(&self, pointer: u64) -> FsBlock {
        FsBlock(self.base.saturating_add(pointer))
    }

    pub fn pointer_of(&self, block: FsBlock) -> u64 {
        block.0.wrapping_sub(self.base)
    }
}

/// Which record a lookup lands on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// The record with exactly this key.
    Eq,
    /// The record with the largest key at or below this one.
    Le,
    /// The record with the smallest key at or above this one.
    Ge,
}

/// A B+tree: its spec, root pointer and height. Callers that keep the root elsewhere (the AGF,
/// an inode) copy `root()` and `levels()` back after each change.
#[derive(Debug, Clone)]
pub struct Btree<C: TreeCodec> {
    pub(crate) spec: TreeSpec,
    pub(crate) root: u64,
    pub(crate) levels: u32,
    codec: PhantomData<C>,
}

impl<C: TreeCodec> Btree<C> {
    /// The tree whose root is pointer `root` and which has `levels` levels (1: root is a leaf).
    pub fn open(spec: TreeSpec, root: u64, levels: u32) -> Result<Btree<C>, TreeError> {
        if !(1..=BTREE_LEVELS_MAX).contains(&levels) {
            return Err(TreeError::TooDeep { levels });
        }
        if !spec.bounds.contains(&root) {
            return Err(TreeError::corrupt(
                spec.fs_block(root).0,
                "tree root outside the tree's address space",
            ));
        }
        Ok(Btree {
            spec,
            root,
            levels,
            codec: PhantomData,
        })
    }

    /// Writes an empty root leaf into block `root` and opens the tree.
    pub fn create<'c, X: Buffers<'c>>(
        ctx: &mut X,
        spec: TreeSpec,
        root: u64,
    ) -> Result<Btree<C>, TreeError> {
        let tree = Self::open(spec, root, 1)?;
        tree.init_block(ctx, root, 0)?;
        Ok(tree)
    }

    pub fn spec(&self) -> &TreeSpec {
        &self.spec
    }

    pub fn root(&self) -> u64 {
        self.root
    }

    pub fn levels(&self) -> u32 {
        self.levels
    }

    pub(crate) fn root_level(&self) -> u16 {
        (self.levels - 1) as u16
    }

    pub(crate) fn slots(&self, level: u16) -> Slots {
        Slots {
            layout: self.spec.layout,
            level,
        }
    }

    /// Loads block `pointer`, expected at `level`, and reads its node header.
    pub(crate) fn load<'g, 'c, X: Buffers<'c>>(
        &self,
        ctx: &'g mut X,
        pointer: u64,
        level: u16,
    ) -> Result<(&'g mut BufGuard<'c>, Node), TreeError> {
        let block = self.spec.fs_block(pointer);
        if !self.spec.bounds.contains(&pointer) {
            return Err(TreeError::corrupt(block.0, "pointer outside the tree"));
        }
        let guard = ctx.buffer(block, &self.spec.read_spec, false)?;
        let found = node(guard, self.spec.layout.capacity(level), block.0)?;
        if found.level != level {
            let what = format!("level {} where the walk expected {level}", found.level);
            return Err(TreeError::corrupt(block.0, what));
        }
        Ok((guard, found))
    }

    /// Creates block `pointer` as an empty block at `level`.
    pub(crate) fn init_block<'c, X: Buffers<'c>>(
        &self,
        ctx: &mut X,
        pointer: u64,
        level: u16,
    ) -> Result<(), TreeError> {
        let block = self.spec.fs_block(pointer);
        let kind = self.spec.layout.kind;
        let header = MetaHeader::new(kind, block.0, self.spec.uuid, self.spec.owner);
        let guard = ctx.buffer(block, &self.spec.read_spec, true)?;
        crate::node::init(guard, header, level)
    }

    /// The key of entry `index` of a block at `level`.
    pub(crate) fn key_at(
        &self,
        buf: &[u8],
        level: u16,
        index: usize,
        block: u64,
    ) -> Result<C::Key, TreeError> {
        let raw = self.slots(level).raw(buf, index);
        let format = |source| TreeError::Format { block, source };
        if level == 0 {
            C::Record::decode(raw).map(|r| C::key(&r)).map_err(format)
        } else {
            C::Key::decode(raw).map_err(format)
        }
    }

    /// Encoded key of entry `index` (the record's key in leaves).
    pub(crate) fn key_entry(
        &self,
        buf: &[u8],
        level: u16,
        index: usize,
        block: u64,
    ) -> Result<crate::node::Entry, TreeError> {
        let key = self.key_at(buf, level, index, block)?;
        Ok(crate::node::Entry::encode(&key, 0))
    }

    /// Leaf: first index whose key is >= `key`. Node: last index whose key is <= `key`
    /// (0 when all are greater).
    fn search(
        &self,
        buf: &[u8],
        found: &Node,
        key: &C::Key,
        block: u64,
    ) -> Result<usize, TreeError> {
        let (mut low, mut high) = (0, found.count);
        while low < high {
            let mid = (low + high) / 2;
            let probe = self.key_at(buf, found.level, mid, block)?;
            let go_right = if found.level == 0 {
                probe < *key
            } else {
                probe <= *key
            };
            if go_right {
                low = mid + 1;
            } else {
                high = mid;
            }
        }
        Ok(if found.level == 0 {
            low
        } else {
            low.saturating_sub(1)
        })
    }

    /// The path from the root to the leaf slot where `key` is or would be inserted.
    pub(crate) fn descend<'c, X: Buffers<'c>>(
        &self,
        ctx: &mut X,
        key: &C::Key,
    ) -> Result<Cursor, TreeError> {
        let mut path = vec![Step::default(); self.levels as usize];
        let mut pointer = self.root;
        for level in (0..=self.root_level()).rev() {
            let block = self.spec.fs_block(pointer).0;
            let (guard, found) = self.load(ctx, pointer, level)?;
            let index = self.search(guard, &found, key, block)?;
            path[usize::from(level)] = Step {
                block: pointer,
                index,
                count: found.count,
            };
            if level > 0 {
                if found.count == 0 {
                    return Err(TreeError::corrupt(block, "empty node"));
                }
                pointer = self.slots(level).pointer(guard, index);
            }
        }
        Ok(Cursor { path })
    }

    /// Positions a cursor on the record `mode` selects for `key`, or `None` if there is none.
    pub fn lookup<'c, X: Buffers<'c>>(
        &self,
        ctx: &mut X,
        key: &C::Key,
        mode: Lookup,
    ) -> Result<Option<Cursor>, TreeError> {
        let mut cursor = self.descend(ctx, key)?;
        let leaf = cursor.leaf();
        let at_end = leaf.index >= leaf.count;
        let exact = !at_end && self.cursor_key(ctx, &cursor)? == *key;
        let found = match mode {
            Lookup::Eq => exact,
            Lookup::Ge if at_end => {
                cursor.path[0].index = leaf.count.saturating_sub(1);
                leaf.count > 0 && self.next(ctx, &mut cursor)?
            }
            Lookup::Ge => true,
            Lookup::Le if exact => true,
            Lookup::Le if leaf.index > 0 => {
                cursor.path[0].index -= 1;
                true
            }
            Lookup::Le => self.prev(ctx, &mut cursor)?,
        };
        Ok(found.then_some(cursor))
    }

    /// The record with key `key`, if any.
    pub fn get<'c, X: Buffers<'c>>(
        &self,
        ctx: &mut X,
        key: &C::Key,
    ) -> Result<Option<C::Record>, TreeError> {
        match self.lookup(ctx, key, Lookup::Eq)? {
            Some(cursor) => self.record(ctx, &cursor).map(Some),
            None => Ok(None),
        }
    }

    /// Sets the key of entry `path[level].index` of the node at `level` to `key`, and goes on
    /// up while that entry is its node's first.
    pub(crate) fn fix_keys<'c, X: Buffers<'c>>(
        &self,
        ctx: &mut X,
        path: &[Step],
        from_level: u16,
        key: &crate::node::Entry,
    ) -> Result<(), TreeError> {
        for level in from_level..=self.root_level() {
            let step = path[usize::from(level)];
            let (guard, _) = self.load(ctx, step.block, level)?;
            self.slots(level).set_raw(guard, step.index, key.bytes())?;
            if step.index != 0 {
                break;
            }
        }
        Ok(())
    }
}
