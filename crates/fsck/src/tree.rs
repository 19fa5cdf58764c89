//! Walking one per-AG B+tree level by level, checking every block on the way: verifier,
//! node header, level, sibling links and key order across the whole tree.

use std::collections::HashSet;

use cairn_format::btree_block::{BtreeHeader, BtreeLayout};
use cairn_format::limits::BTREE_LEVELS_MAX;
use cairn_format::ondisk::get_u32;
use cairn_format::types::NULL_BLOCK;
use cairn_format::{AgBlock, AgNumber, Expected, MetaKind, OnDisk, verify_header};

use crate::check::Checker;
use crate::report::Problem;

/// The sort key of a node key of an AG tree, as one integer.
fn sort_key(kind: MetaKind, raw: &[u8]) -> u64 {
    match kind {
        // By-length keys are (length, start).
        MetaKind::CntBtree => (u64::from(get_u32(raw, 0)) << 32) | u64::from(get_u32(raw, 4)),
        _ => u64::from(get_u32(raw, 0)),
    }
}

/// By-length records are (start, length) on disk but sorted by (length, start).
fn record_sort_key(kind: MetaKind, record: &[u8]) -> u64 {
    match kind {
        MetaKind::CntBtree => (u64::from(get_u32(record, 4)) << 32) | u64::from(get_u32(record, 0)),
        _ => u64::from(get_u32(record, 0)),
    }
}

/// One block of a level still to visit, with the key range its parent allows.
#[derive(Clone, Copy)]
struct Pending {
    block: u64,
    low: u64,
    high: Option<u64>,
}

/// A checked block on its way to `collect`.
#[derive(Clone, Copy)]
struct Leaf<'a> {
    header: &'a BtreeHeader,
    block: &'a [u8],
    item: Pending,
}

/// A tree to walk.
#[derive(Debug, Clone, Copy)]
pub struct AgTree {
    pub kind: MetaKind,
    pub ag: u32,
    pub root: AgBlock,
    pub levels: u32,
}

impl Checker<'_> {
    /// Walks `tree` and returns its records in key order, or `None` (with problems recorded)
    /// when a block is unreadable or inconsistent enough that the records cannot be trusted.
    pub fn walk_ag_tree(&mut self, tree: AgTree) -> Option<Vec<Vec<u8>>> {
        let name = tree.kind.name();
        let layout = BtreeLayout::for_kind(tree.kind, self.geometry.block_size)?;
        if tree.levels == 0 || tree.levels > BTREE_LEVELS_MAX {
            let message = format!("AG {} records {} levels", tree.ag, tree.levels);
            self.report.add(Problem::new(name, None, message));
            return None;
        }
        let mut visited = HashSet::new();
        let mut pending = vec![Pending {
            block: u64::from(tree.root.0),
            low: 0,
            high: None,
        }];
        let mut records = Vec::new();
        for level in (0..tree.levels as u16).rev() {
            let mut next = Vec::new();
            for (index, item) in pending.iter().enumerate() {
                let left = index
                    .checked_sub(1)
                    .map_or(NULL_BLOCK, |i| pending[i].block);
                let right = pending.get(index + 1).map_or(NULL_BLOCK, |p| p.block);
                if !visited.insert(item.block) {
                    let message = format!("block {} is reached twice (a cycle)", item.block);
                    self.report.add(Problem::new(name, None, message));
                    return None;
                }
                let (header, block) =
                    self.tree_block(&tree, &layout, *item, level, (left, right))?;
                let leaf = Leaf {
                    header: &header,
                    block: &block,
                    item: *item,
                };
                self.collect(&tree, &layout, leaf, &mut next, &mut records)?;
            }
            pending = next;
        }
        Some(records)
    }

    /// Reads and checks one block; `siblings` are the expected left and right neighbours.
    fn tree_block(
        &mut self,
        tree: &AgTree,
        layout: &BtreeLayout,
        item: Pending,
        level: u16,
        siblings: (u64, u64),
    ) -> Option<(BtreeHeader, Vec<u8>)> {
        let ag = AgNumber(tree.ag);
        let at = self.geometry.fs_block(ag, AgBlock(item.block as u32));
        let block = self.read_block(at, tree.kind.name())?;
        let expected = Expected {
            kind: tree.kind,
            blkno: at.0,
            uuid: self.uuid,
            owner: Some(u64::from(tree.ag)),
        };
        let valid = layout.pointer_bounds(&self.geometry, u64::from(tree.ag));
        let header = verify_header(&block, &expected)
            .and_then(|_| BtreeHeader::decode(&block))
            .and_then(|h| h.check(layout, &block, valid).map(|()| h));
        let header = match header {
            Ok(header) => header,
            Err(err) => {
                self.report.add(Problem::from_format(at.0, &err));
                return None;
            }
        };
        let mut wrong = |what: &str, found: u64, want: u64| {
            let message = format!("{what} is {found}, expected {want}");
            self.report
                .add(Problem::new(tree.kind.name(), Some(at.0), message));
        };
        if header.level != level {
            wrong("level", header.level.into(), level.into());
        }
        if header.left != siblings.0 {
            wrong("left sibling", header.left, siblings.0);
        }
        if header.right != siblings.1 {
            wrong("right sibling", header.right, siblings.1);
        }
        self.claim(at.0, 1, tree.kind.name());
        Some((header, block))
    }

    /// Gathers a node's children (with their key ranges) or a leaf's records, checking order.
    fn collect(
        &mut self,
        tree: &AgTree,
        layout: &BtreeLayout,
        leaf: Leaf<'_>,
        next: &mut Vec<Pending>,
        records: &mut Vec<Vec<u8>>,
    ) -> Option<()> {
        let Leaf {
            header,
            block,
            item,
        } = leaf;
        let count = usize::from(header.record_count);
        let at = item.block;
        let mut previous: Option<u64> = None;
        for index in 0..count {
            let key = if header.level == 0 {
                let record = layout.record(block, index)?;
                records.push(record.to_vec());
                record_sort_key(tree.kind, record)
            } else {
                sort_key(tree.kind, layout.key(block, index)?)
            };
            let ordered = previous.is_none_or(|p| p < key);
            let in_range = key >= item.low && item.high.is_none_or(|h| key < h);
            if !ordered || !in_range {
                let message = format!("key {index} ({key}) is out of order in AG block {at}");
                self.report
                    .add(Problem::new(tree.kind.name(), None, message));
            }
            previous = Some(key);
        }
        if header.level > 0 {
            for index in 0..count {
                let low = sort_key(tree.kind, layout.key(block, index)?);
                let high = match layout.key(block, index + 1) {
                    Some(raw) if index + 1 < count => Some(sort_key(tree.kind, raw)),
                    _ => item.high,
                };
                next.push(Pending {
                    block: layout.pointer(block, index)?,
                    low,
                    high,
                });
            }
        }
        Some(())
    }
}
