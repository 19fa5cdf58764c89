//! `verify`: walks a whole tree and reports every broken invariant it can see, block by block,
//! without stopping at the first. `fsck.cairn` and the tests use it.

use std::collections::HashSet;
use std::fmt;

use cairn_format::types::NULL_BLOCK;
use cairn_format::{BtreeHeader, MetaHeader, OnDisk};

use crate::{Btree, Buffers, TreeCodec, TreeError};

/// One broken invariant, at one block (filesystem block number).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeProblem {
    pub block: u64,
    pub what: String,
}

impl fmt::Display for TreeProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "block {}: {}", self.block, self.what)
    }
}

/// What `verify` found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerifyReport {
    pub problems: Vec<TreeProblem>,
    pub records: u64,
    pub blocks: u64,
}

impl VerifyReport {
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Walk state: per level, the previous block seen and its right pointer.
struct Walk<K> {
    report: VerifyReport,
    seen: HashSet<u64>,
    previous: Vec<Option<(u64, u64)>>,
    last_key: Option<K>,
}

impl<K> Walk<K> {
    fn problem(&mut self, block: u64, what: impl Into<String>) {
        self.report.problems.push(TreeProblem {
            block,
            what: what.into(),
        });
    }
}

impl<C: TreeCodec> Btree<C> {
    /// Checks the whole tree: each block's header (kind, own address, owner, UUID and CRC as
    /// the buffer's read verifier sees them), level, count and fill; keys strictly increasing
    /// across all leaves; node keys equal to their child's first key and within the parent's
    /// bounds; sibling links matching the order of each level; no block reached twice.
    pub fn verify<'c, X: Buffers<'c>>(&self, ctx: &mut X) -> VerifyReport {
        let mut walk = Walk {
            report: VerifyReport::default(),
            seen: HashSet::new(),
            previous: vec![None; self.levels as usize],
            last_key: None,
        };
        self.walk(ctx, &mut walk, self.root, self.root_level(), None);
        for (level, previous) in walk.previous.clone().into_iter().enumerate() {
            if let Some((block, right)) = previous
                && right != NULL_BLOCK
            {
                let what = format!("last block of level {level} has right sibling {right}");
                walk.problem(self.spec.fs_block(block).0, what);
            }
        }
        walk.report
    }

    /// Visits block `pointer` at `level`; `first_key` is the parent's key for it.
    fn walk<'c, X: Buffers<'c>>(
        &self,
        ctx: &mut X,
        walk: &mut Walk<C::Key>,
        pointer: u64,
        level: u16,
        first_key: Option<C::Key>,
    ) {
        let block = self.spec.fs_block(pointer).0;
        if !walk.seen.insert(pointer) {
            walk.problem(block, "block reached twice");
            return;
        }
        let (entries, children) = match self.check_block(ctx, walk, pointer, level) {
            Ok(found) => found,
            Err(error) => {
                walk.problem(block, error.to_string());
                return;
            }
        };
        walk.report.blocks += 1;
        if let (Some(expected), Some(first)) = (first_key, entries.first())
            && expected != *first
        {
            let what = format!("first key {first:?}, parent says {expected:?}");
            walk.problem(block, what);
        }
        for key in &entries {
            if level == 0 {
                walk.report.records += 1;
            }
            if level == 0 && walk.last_key.is_some_and(|last| last >= *key) {
                walk.problem(block, format!("key {key:?} out of order"));
            }
            if level == 0 {
                walk.last_key = Some(*key);
            }
        }
        for (key, child) in entries.iter().zip(children) {
            self.walk(ctx, walk, child, level - 1, Some(*key));
        }
    }

    /// Checks one block on its own and against its left neighbour at the same level; returns
    /// its keys and (for nodes) children.
    fn check_block<'c, X: Buffers<'c>>(
        &self,
        ctx: &mut X,
        walk: &mut Walk<C::Key>,
        pointer: u64,
        level: u16,
    ) -> Result<(Vec<C::Key>, Vec<u64>), TreeError> {
        let block = self.spec.fs_block(pointer).0;
        let (guard, node) = self.load(ctx, pointer, level)?;
        let header =
            BtreeHeader::decode(guard).map_err(|source| TreeError::Format { block, source })?;
        let meta =
            MetaHeader::decode(guard).map_err(|source| TreeError::Format { block, source })?;
        let mut problems = Vec::new();
        if meta.owner != self.spec.owner || meta.blkno != block || meta.uuid != self.spec.uuid {
            problems.push("owner, address or UUID differs from the tree's".to_string());
        }
        if let Err(error) = header.check(&self.spec.layout, guard, self.spec.bounds.clone()) {
            problems.push(error.to_string());
        }
        let is_root = pointer == self.root;
        if !is_root && node.count < self.spec.min_entries(level) {
            problems.push(format!("{} entries, fewer than half full", node.count));
        }
        if is_root && level > 0 && node.count < 2 {
            problems.push("node root with fewer than two children".to_string());
        }
        let mut keys = Vec::with_capacity(node.count);
        let mut children = Vec::new();
        for index in 0..node.count {
            keys.push(self.key_at(guard, level, index, block)?);
            if level > 0 {
                children.push(self.slots(level).pointer(guard, index));
            }
        }
        if keys.windows(2).any(|pair| pair[0] >= pair[1]) {
            problems.push("keys not strictly increasing".to_string());
        }
        let expected_left = walk.previous[usize::from(level)].map_or(NULL_BLOCK, |(b, _)| b);
        if node.left != expected_left {
            problems.push(format!("left sibling {} (want {expected_left})", node.left));
        }
        if let Some((previous, right)) = walk.previous[usize::from(level)]
            && right != pointer
        {
            let at = self.spec.fs_block(previous).0;
            walk.problem(at, format!("right sibling {right} (want {pointer})"));
        }
        walk.previous[usize::from(level)] = Some((pointer, node.right));
        for what in problems {
            walk.problem(block, what);
        }
        Ok((keys, children))
    }
}
