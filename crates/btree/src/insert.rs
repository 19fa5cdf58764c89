//! Insertion with splits and root growth, and in-place record updates.

use cairn_format::limits::BTREE_LEVELS_MAX;
use cairn_format::{FsBlock, OnDisk};

use crate::cursor::{Cursor, Step};
use crate::node::{Entry, set_left, set_right};
use crate::{Btree, TreeCodec, TreeContext, TreeError};

impl<C: TreeCodec> Btree<C> {
    /// Inserts `record`; `Duplicate` if its key is present. Full blocks split (the upper half
    /// moves to a new right sibling from `ctx.allocate_block`), up to a new root. Every block
    /// the splits need is allocated before anything changes, so a tree that runs out of space
    /// fails the insert whole instead of leaving a half-split tree behind.
    pub fn insert<'c, X: TreeContext<'c>>(
        &mut self,
        ctx: &mut X,
        record: &C::Record,
    ) -> Result<(), TreeError> {
        let key = C::key(record);
        let mut cursor = self.descend(ctx, &key)?;
        let leaf = cursor.leaf();
        if leaf.index < leaf.count && self.cursor_key(ctx, &cursor)? == key {
            return Err(TreeError::Duplicate {
                key: format!("{key:?}"),
            });
        }
        let mut spare = self.split_blocks(ctx, &cursor.path)?.into_iter();
        let mut entry = Entry::encode(record, 0);
        for level in 0..=self.root_level() {
            let split = self.insert_into(ctx, &cursor.path, level, &entry, &mut spare)?;
            let Some(right) = split else {
                return Ok(());
            };
            if level == self.root_level() {
                return self.grow_root(ctx, right, &mut spare);
            }
            entry = right;
            cursor.path[usize::from(level) + 1].index += 1;
        }
        Ok(())
    }

    /// Allocates the blocks an insert below `path` splits into: one per full level from the
    /// leaf up, and a new root when every level is full. On failure the blocks already taken
    /// go back and the tree is untouched.
    fn split_blocks<'c, X: TreeContext<'c>>(
        &self,
        ctx: &mut X,
        path: &[Step],
    ) -> Result<Vec<FsBlock>, TreeError> {
        let levels = usize::from(self.root_level()) + 1;
        let full = (0..levels)
            .take_while(|&level| path[level].count >= self.spec.capacity(level as u16))
            .count();
        let new_root = full == levels;
        if new_root && self.levels >= BTREE_LEVELS_MAX {
            return Err(TreeError::TooDeep {
                levels: self.levels + 1,
            });
        }
        let mut blocks = Vec::with_capacity(full + usize::from(new_root));
        for _ in 0..blocks.capacity() {
            match ctx.allocate_block() {
                Ok(block) => blocks.push(block),
                Err(error) => {
                    for block in blocks {
                        ctx.free_block(block)?;
                    }
                    return Err(error);
                }
            }
        }
        Ok(blocks)
    }

    /// Inserts `entry` at `path[level].index`. Returns the entry for the parent (first key of
    /// the new right block, and its pointer) if the block had to split.
    fn insert_into<'c, X: TreeContext<'c>>(
        &self,
        ctx: &mut X,
        path: &[Step],
        level: u16,
        entry: &Entry,
        spare: &mut impl Iterator<Item = FsBlock>,
    ) -> Result<Option<Entry>, TreeError> {
        let step = path[usize::from(level)];
        let slots = self.slots(level);
        let block = self.spec.fs_block(step.block).0;
        let (guard, found) = self.load(ctx, step.block, level)?;
        if found.count < self.spec.capacity(level) {
            slots.insert(guard, step.index, found.count, entry)?;
            if step.index == 0 {
                let first = self.key_entry(guard, level, 0, block)?;
                self.fix_keys(ctx, path, level + 1, &first)?;
            }
            return Ok(None);
        }
        let mut entries = slots.entries(guard, found.count);
        entries.insert(step.index, *entry);
        let mid = entries.len() / 2;
        let new_block = self.spec.pointer_of(take_block(ctx, spare)?);
        self.init_block(ctx, new_block, level)?;
        let (guard, _) = self.load(ctx, step.block, level)?;
        slots.write_all(guard, &entries[..mid])?;
        set_right(guard, new_block)?;
        let (new_guard, _) = self.load(ctx, new_block, level)?;
        slots.write_all(new_guard, &entries[mid..])?;
        set_left(new_guard, step.block)?;
        set_right(new_guard, found.right)?;
        if found.right != cairn_format::types::NULL_BLOCK {
            let (right_guard, _) = self.load(ctx, found.right, level)?;
            set_left(right_guard, new_block)?;
        }
        if step.index == 0 {
            let (guard, _) = self.load(ctx, step.block, level)?;
            let first = self.key_entry(guard, level, 0, block)?;
            self.fix_keys(ctx, path, level + 1, &first)?;
        }
        let (new_guard, _) = self.load(ctx, new_block, level)?;
        let new_block_fs = self.spec.fs_block(new_block).0;
        let mut up = self.key_entry(new_guard, level, 0, new_block_fs)?;
        up.ptr = new_block;
        Ok(Some(up))
    }

    /// Puts a new root above the old root and its new right sibling `right`.
    fn grow_root<'c, X: TreeContext<'c>>(
        &mut self,
        ctx: &mut X,
        right: Entry,
        spare: &mut impl Iterator<Item = FsBlock>,
    ) -> Result<(), TreeError> {
        if self.levels >= BTREE_LEVELS_MAX {
            return Err(TreeError::TooDeep {
                levels: self.levels + 1,
            });
        }
        let old_level = self.root_level();
        let block = self.spec.fs_block(self.root).0;
        let (guard, _) = self.load(ctx, self.root, old_level)?;
        let mut left = self.key_entry(guard, old_level, 0, block)?;
        left.ptr = self.root;
        let new_root = self.spec.pointer_of(take_block(ctx, spare)?);
        self.init_block(ctx, new_root, old_level + 1)?;
        let (guard, _) = self.load(ctx, new_root, old_level + 1)?;
        self.slots(old_level + 1).write_all(guard, &[left, right])?;
        self.root = new_root;
        self.levels += 1;
        Ok(())
    }

    /// Replaces the record under `cursor` with `record`. Its key may change only within the
    /// gap between its neighbours (`OutOfOrder` otherwise), so no record moves.
    pub fn update_at<'c, X: TreeContext<'c>>(
        &mut self,
        ctx: &mut X,
        cursor: &Cursor,
        record: &C::Record,
    ) -> Result<(), TreeError> {
        let key = C::key(record);
        let leaf = cursor.leaf();
        let block = self.spec.fs_block(leaf.block).0;
        let out_of_order = || TreeError::OutOfOrder {
            block,
            key: format!("{key:?}"),
        };
        let mut probe = cursor.clone();
        if self.prev(ctx, &mut probe)? && self.cursor_key(ctx, &probe)? >= key {
            return Err(out_of_order());
        }
        let mut probe = cursor.clone();
        if self.next(ctx, &mut probe)? && self.cursor_key(ctx, &probe)? <= key {
            return Err(out_of_order());
        }
        let old_key = self.cursor_key(ctx, cursor)?;
        let (guard, _) = self.load(ctx, leaf.block, 0)?;
        self.slots(0)
            .set_raw(guard, leaf.index, &record.to_bytes())?;
        if leaf.index == 0 && old_key != key {
            self.fix_keys(ctx, &cursor.path, 1, &Entry::encode(&key, 0))?;
        }
        Ok(())
    }

    /// Replaces the record with key `key` by `record` (see `update_at`).
    pub fn update<'c, X: TreeContext<'c>>(
        &mut self,
        ctx: &mut X,
        key: &C::Key,
        record: &C::Record,
    ) -> Result<(), TreeError> {
        let cursor =
            self.lookup(ctx, key, crate::Lookup::Eq)?
                .ok_or_else(|| TreeError::NotFound {
                    key: format!("{key:?}"),
                })?;
        self.update_at(ctx, &cursor, record)
    }
}

/// The next block `split_blocks` took (a fresh allocation should the count ever fall short).
fn take_block<'c, X: TreeContext<'c>>(
    ctx: &mut X,
    spare: &mut impl Iterator<Item = FsBlock>,
) -> Result<FsBlock, TreeError> {
    match spare.next() {
        Some(block) => Ok(block),
        None => ctx.allocate_block(),
    }
}
