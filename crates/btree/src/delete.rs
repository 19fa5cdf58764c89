//! Deletion with borrowing from, and merging into, a sibling under the same parent, and root
//! collapse.

use cairn_format::types::NULL_BLOCK;

use crate::cursor::{Cursor, Step};
use crate::node::{set_left, set_right};
use crate::{Btree, Lookup, TreeCodec, TreeContext, TreeError};

/// What rebalancing an under-full block did.
enum Rebalanced {
    /// Entries moved from a sibling; the parent lost nothing.
    Borrowed,
    /// Two blocks became one; the parent must drop the entry at this index.
    Merged { parent_index: usize },
}

impl<C: TreeCodec> Btree<C> {
    /// Deletes and returns the record with key `key`; `NotFound` if there is none.
    pub fn delete<'c, X: TreeContext<'c>>(
        &mut self,
        ctx: &mut X,
        key: &C::Key,
    ) -> Result<C::Record, TreeError> {
        let cursor = self
            .lookup(ctx, key, Lookup::Eq)?
            .ok_or_else(|| TreeError::NotFound {
                key: format!("{key:?}"),
            })?;
        let record = self.record(ctx, &cursor)?;
        self.delete_at(ctx, cursor)?;
        Ok(record)
    }

    /// Deletes the record under `cursor`. Blocks left under half full borrow from or merge
    /// with a sibling; a node root left with one child is replaced by that child.
    pub fn delete_at<'c, X: TreeContext<'c>>(
        &mut self,
        ctx: &mut X,
        cursor: Cursor,
    ) -> Result<(), TreeError> {
        let mut path = cursor.path;
        let mut level = 0u16;
        loop {
            let step = path[usize::from(level)];
            let block = self.spec.fs_block(step.block).0;
            let (guard, found) = self.load(ctx, step.block, level)?;
            if step.index >= found.count {
                return Err(TreeError::corrupt(block, "delete past the block's entries"));
            }
            self.slots(level).remove(guard, step.index, found.count)?;
            let count = found.count - 1;
            path[usize::from(level)].count = count;
            if level == self.root_level() {
                return self.collapse_root(ctx, count);
            }
            if step.index == 0 && count > 0 {
                let first = self.key_entry(guard, level, 0, block)?;
                self.fix_keys(ctx, &path, level + 1, &first)?;
            }
            if count >= self.spec.min_entries(level) {
                return Ok(());
            }
            match self.rebalance(ctx, &path, level)? {
                Rebalanced::Borrowed => return Ok(()),
                Rebalanced::Merged { parent_index } => {
                    level += 1;
                    path[usize::from(level)].index = parent_index;
                }
            }
        }
    }

    /// A node root with a single child hands the root over to that child.
    fn collapse_root<'c, X: TreeContext<'c>>(
        &mut self,
        ctx: &mut X,
        count: usize,
    ) -> Result<(), TreeError> {
        let level = self.root_level();
        if level == 0 || count != 1 {
            return Ok(());
        }
        let old_root = self.root;
        let (guard, _) = self.load(ctx, old_root, level)?;
        let child = self.slots(level).pointer(guard, 0);
        self.load(ctx, child, level - 1)?;
        self.root = child;
        self.levels -= 1;
        self.release_block(ctx, old_root)
    }

    fn release_block<'c, X: TreeContext<'c>>(
        &self,
        ctx: &mut X,
        pointer: u64,
    ) -> Result<(), TreeError> {
        let block = self.spec.fs_block(pointer);
        ctx.invalidate(block, &self.spec.read_spec)?;
        ctx.free_block(block)
    }

    /// Evens out or merges the under-full block at `path[level]` with its right sibling
    /// under the same parent, or its left one when it is the parent's last child.
    fn rebalance<'c, X: TreeContext<'c>>(
        &mut self,
        ctx: &mut X,
        path: &[Step],
        level: u16,
    ) -> Result<Rebalanced, TreeError> {
        let parent = path[usize::from(level) + 1];
        let (parent_guard, parent_node) = self.load(ctx, parent.block, level + 1)?;
        let parent_slots = self.slots(level + 1);
        let left_index = if parent.index + 1 < parent_node.count {
            parent.index
        } else if parent.index > 0 {
            parent.index - 1
        } else {
            let block = self.spec.fs_block(parent.block).0;
            return Err(TreeError::corrupt(
                block,
                "non-root node with a single child",
            ));
        };
        let left = parent_slots.pointer(parent_guard, left_index);
        let right = parent_slots.pointer(parent_guard, left_index + 1);
        let slots = self.slots(level);
        let (guard, left_node) = self.load(ctx, left, level)?;
        let mut entries = slots.entries(guard, left_node.count);
        let (guard, right_node) = self.load(ctx, right, level)?;
        entries.extend(slots.entries(guard, right_node.count));
        if left_node.right != right || right_node.left != left {
            let block = self.spec.fs_block(left).0;
            return Err(TreeError::corrupt(
                block,
                "sibling pointers disagree with parent",
            ));
        }
        let mut parent_path = path[usize::from(level) + 1..].to_vec();
        parent_path[0].index = left_index;
        if entries.len() <= self.spec.capacity(level) {
            let (guard, _) = self.load(ctx, left, level)?;
            slots.write_all(guard, &entries)?;
            set_right(guard, right_node.right)?;
            if right_node.right != NULL_BLOCK {
                let (guard, _) = self.load(ctx, right_node.right, level)?;
                set_left(guard, left)?;
            }
            self.release_block(ctx, right)?;
            self.refresh_parent_key(ctx, &parent_path, left, level)?;
            return Ok(Rebalanced::Merged {
                parent_index: left_index + 1,
            });
        }
        let split = entries.len() / 2;
        let (guard, _) = self.load(ctx, left, level)?;
        slots.write_all(guard, &entries[..split])?;
        let (guard, _) = self.load(ctx, right, level)?;
        slots.write_all(guard, &entries[split..])?;
        self.refresh_parent_key(ctx, &parent_path, left, level)?;
        parent_path[0].index = left_index + 1;
        self.refresh_parent_key(ctx, &parent_path, right, level)?;
        Ok(Rebalanced::Borrowed)
    }

    /// Sets the parent key of `child` (at `parent_path[0]`) to the child's first key.
    fn refresh_parent_key<'c, X: TreeContext<'c>>(
        &self,
        ctx: &mut X,
        parent_path: &[Step],
        child: u64,
        level: u16,
    ) -> Result<(), TreeError> {
        let block = self.spec.fs_block(child).0;
        let (guard, _) = self.load(ctx, child, level)?;
        let first = self.key_entry(guard, level, 0, block)?;
        let mut full = vec![Step::default(); usize::from(level) + 1];
        full.extend_from_slice(parent_path);
        self.fix_keys(ctx, &full, level + 1, &first)
    }
}
