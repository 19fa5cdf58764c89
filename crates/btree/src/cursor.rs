//! Cursors: a root-to-leaf path that steps left and right through the records.
//!
//! A cursor stays valid until the tree changes; after `insert`, `delete` or `update_at`, look
//! up again (the `_at` operations consume the position they were given).

use cairn_format::OnDisk;

use crate::{Btree, Buffers, TreeCodec, TreeError};

/// One level of a cursor's path: the block (as a tree pointer), the entry index in it, and the
/// block's entry count when the path was taken.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Step {
    pub block: u64,
    pub index: usize,
    pub count: usize,
}

/// A position on one record of a tree; `path[0]` is the leaf.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    pub(crate) path: Vec<Step>,
}

impl Cursor {
    pub(crate) fn leaf(&self) -> Step {
        self.path.first().copied().unwrap_or_default()
    }

    /// Whether the cursor is in the tree's last leaf (every level on its block's last entry
    /// above the leaf).
    pub fn in_last_leaf(&self) -> bool {
        self.path
            .iter()
            .skip(1)
            .all(|step| step.index + 1 == step.count)
    }

    /// Records after the cursor's in its leaf.
    pub fn leaf_records_after(&self) -> usize {
        let leaf = self.leaf();
        leaf.count.saturating_sub(leaf.index + 1)
    }

    /// The leaf block (tree pointer) and index the cursor is on.
    pub fn position(&self) -> (u64, usize) {
        let leaf = self.leaf();
        (leaf.block, leaf.index)
    }
}

impl<C: TreeCodec> Btree<C> {
    /// The record under the cursor.
    pub fn record<'c, X: Buffers<'c>>(
        &self,
        ctx: &mut X,
        cursor: &Cursor,
    ) -> Result<C::Record, TreeError> {
        let leaf = cursor.leaf();
        let block = self.spec.fs_block(leaf.block).0;
        let (guard, found) = self.load(ctx, leaf.block, 0)?;
        if leaf.index >= found.count {
            return Err(TreeError::corrupt(block, "cursor past the leaf's records"));
        }
        let raw = self.slots(0).raw(guard, leaf.index);
        C::Record::decode(raw).map_err(|source| TreeError::Format { block, source })
    }

    pub(crate) fn cursor_key<'c, X: Buffers<'c>>(
        &self,
        ctx: &mut X,
        cursor: &Cursor,
    ) -> Result<C::Key, TreeError> {
        self.record(ctx, cursor).map(|r| C::key(&r))
    }

    /// Moves to the next record; false (cursor unchanged) at the last one.
    pub fn next<'c, X: Buffers<'c>>(
        &self,
        ctx: &mut X,
        cursor: &mut Cursor,
    ) -> Result<bool, TreeError> {
        let Some(level) = cursor.path.iter().position(|s| s.index + 1 < s.count) else {
            return Ok(false);
        };
        cursor.path[level].index += 1;
        self.descend_edge(ctx, cursor, level, false)?;
        Ok(true)
    }

    /// Moves to the previous record; false (cursor unchanged) at the first one.
    pub fn prev<'c, X: Buffers<'c>>(
        &self,
        ctx: &mut X,
        cursor: &mut Cursor,
    ) -> Result<bool, TreeError> {
        let Some(level) = cursor.path.iter().position(|s| s.index > 0) else {
            return Ok(false);
        };
        cursor.path[level].index -= 1;
        self.descend_edge(ctx, cursor, level, true)?;
        Ok(true)
    }

    /// Refills the path below `level` with the leftmost (or rightmost) entries.
    fn descend_edge<'c, X: Buffers<'c>>(
        &self,
        ctx: &mut X,
        cursor: &mut Cursor,
        level: usize,
        rightmost: bool,
    ) -> Result<(), TreeError> {
        for below in (0..level).rev() {
            let parent = cursor.path[below + 1];
            let (guard, _) = self.load(ctx, parent.block, (below + 1) as u16)?;
            let pointer = self.slots((below + 1) as u16).pointer(guard, parent.index);
            let (_, found) = self.load(ctx, pointer, below as u16)?;
            if found.count == 0 {
                let block = self.spec.fs_block(pointer).0;
                return Err(TreeError::corrupt(block, "empty block below the root"));
            }
            let index = if rightmost { found.count - 1 } else { 0 };
            cursor.path[below] = crate::cursor::Step {
                block: pointer,
                index,
                count: found.count,
            };
        }
        Ok(())
    }

    /// A cursor on the first record, or `None` for an empty tree.
    pub fn first<'c, X: Buffers<'c>>(&self, ctx: &mut X) -> Result<Option<Cursor>, TreeError> {
        self.edge(ctx, false)
    }

    /// A cursor on the last record, or `None` for an empty tree.
    pub fn last<'c, X: Buffers<'c>>(&self, ctx: &mut X) -> Result<Option<Cursor>, TreeError> {
        self.edge(ctx, true)
    }

    fn edge<'c, X: Buffers<'c>>(
        &self,
        ctx: &mut X,
        rightmost: bool,
    ) -> Result<Option<Cursor>, TreeError> {
        let levels = self.levels as usize;
        let (_, root) = self.load(ctx, self.root, self.root_level())?;
        if root.count == 0 {
            return Ok(None);
        }
        let mut path = vec![Step::default(); levels];
        path[levels - 1] = Step {
            block: self.root,
            index: if rightmost { root.count - 1 } else { 0 },
            count: root.count,
        };
        let mut cursor = Cursor { path };
        self.descend_edge(ctx, &mut cursor, levels - 1, rightmost)?;
        Ok(Some(cursor))
    }

    /// Every record in key order (for tests, tools and small trees).
    pub fn records<'c, X: Buffers<'c>>(&self, ctx: &mut X) -> Result<Vec<C::Record>, TreeError> {
        let mut out = Vec::new();
        let Some(mut cursor) = self.first(ctx)? else {
            return Ok(out);
        };
        loop {
            out.push(self.record(ctx, &cursor)?);
            if !self.next(ctx, &mut cursor)? {
                return Ok(out);
            }
        }
    }
}
