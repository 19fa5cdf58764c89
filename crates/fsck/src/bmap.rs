//! File data forks: inline extent lists and file extent (bmap) trees. Every tree block is
//! read and verified (kind, own address, owner = the inode, UUID, CRC), levels and sibling
//! links checked level by level, keys checked for order and against their parent's range,
//! and the extents checked for order, overlap and the device's end. Tree blocks and data
//! extents are claimed, and the inode's block count must equal their sum.

use std::collections::HashSet;

use cairn_format::btree_block::{BtreeHeader, BtreeLayout};
use cairn_format::inode::{BmapRoot, InodeCore};
use cairn_format::types::NULL_BLOCK;
use cairn_format::{
    BmapKey, Expected, Extent, FsBlock, InodeNumber, MetaKind, OnDisk, verify_header,
};

use crate::check::Checker;
use crate::report::Problem;

/// One tree block still to visit, with the key range its parent allows.
#[derive(Clone, Copy)]
struct Pending {
    block: u64,
    low: u64,
    high: Option<u64>,
}

/// What a walk of one fork found.
#[derive(Default)]
pub(crate) struct ForkBlocks {
    pub extents: Vec<Extent>,
    pub tree_blocks: u64,
}

impl Checker<'_> {
    fn fork_problem(&mut self, number: InodeNumber, block: Option<u64>, message: String) {
        self.report.add(Problem::new(
            "file extent map",
            block.or(Some(number.0)),
            message,
        ));
    }

    /// Checks inline or tree extents (sorted, disjoint, inside the device), claims them, and
    /// checks the inode's block count against data plus tree blocks.
    pub(crate) fn check_extents(
        &mut self,
        number: InodeNumber,
        core: &InodeCore,
        found: ForkBlocks,
    ) {
        let mut end = 0u64;
        let mut data_blocks = 0u64;
        for (index, extent) in found.extents.iter().enumerate() {
            if index > 0 && extent.file_block < end {
                let message = format!(
                    "inode {number}: extent at file block {} overlaps or is out of order",
                    extent.file_block
                );
                self.fork_problem(number, None, message);
                if self.repairing {
                    self.findings.rebuild_map.insert(number.0);
                }
            }
            end = extent.file_end();
            if extent.fs_end().0 > self.geometry.block_count {
                let message = format!("inode {number}: an extent ends past the device");
                self.fork_problem(number, None, message);
                if self.repairing {
                    // Repair drops it as a claim that cannot be honoured.
                    let (start, length) = (extent.fs_block.0, u64::from(extent.length));
                    self.claim_for(number.0, start, length, "file data");
                }
                continue;
            }
            data_blocks += u64::from(extent.length);
            self.claim_for(
                number.0,
                extent.fs_block.0,
                u64::from(extent.length),
                "file data",
            );
        }
        let counted = data_blocks + found.tree_blocks;
        if core.block_count != counted {
            if self.repairing {
                self.findings.wrong_counts.insert(number.0, counted);
            }
            let message = format!(
                "inode {number}: block count is {}, its extents and tree hold {counted}",
                core.block_count
            );
            self.report
                .add(Problem::new("inode", Some(number.0), message));
        }
    }

    /// Walks the extent tree whose root is in `fork`; `None` when it cannot be followed.
    pub(crate) fn walk_bmap_tree(
        &mut self,
        number: InodeNumber,
        fork: &[u8],
        core: &InodeCore,
    ) -> Option<ForkBlocks> {
        let root = match BmapRoot::decode(fork) {
            Ok(root) => root,
            Err(err) => {
                self.fork_problem(number, None, format!("inode {number}: {err}"));
                return None;
            }
        };
        let layout = BtreeLayout::for_kind(MetaKind::BmapBtree, self.geometry.block_size)?;
        if root.keys.is_empty() {
            let message = format!("inode {number}: extent tree root has no children");
            self.fork_problem(number, None, message);
            return None;
        }
        let problems = self.report.problems.len();
        if root.keys.len() > 1 {
            // cairn-fs keeps the tree's one top block under the root; repair stores the
            // extents of every child anew.
            let message = format!(
                "inode {number}: extent tree root has {} children, cairn keeps one",
                root.keys.len()
            );
            self.fork_problem(number, None, message);
        }
        let mut pending: Vec<Pending> = (0..root.keys.len())
            .map(|index| Pending {
                block: root.pointers[index],
                low: root.keys[index],
                high: root.keys.get(index + 1).copied(),
            })
            .collect();
        let mut found = ForkBlocks::default();
        let mut visited = HashSet::new();
        // Repair reads past a block that cannot be used (its records are lost) and rebuilds
        // the map from the rest; a check stops at it.
        let mut lost = false;
        for level in (0..root.level).rev() {
            let mut next = Vec::new();
            for index in 0..pending.len() {
                let item = pending[index];
                let left = index
                    .checked_sub(1)
                    .map_or(NULL_BLOCK, |i| pending[i].block);
                let right = pending.get(index + 1).map_or(NULL_BLOCK, |p| p.block);
                if !visited.insert(item.block) {
                    let message =
                        format!("inode {number}: tree block {} reached twice", item.block);
                    self.fork_problem(number, Some(item.block), message);
                    lost = true;
                    continue;
                }
                let walked = self
                    .bmap_block(number, &layout, item.block, level, (left, right))
                    .and_then(|(header, block)| {
                        found.tree_blocks += 1;
                        let leaf = (&header, block.as_slice());
                        self.bmap_entries(number, &layout, leaf, item, &mut next, &mut found)
                    });
                lost |= walked.is_none();
            }
            if lost && !self.repairing {
                return None;
            }
            pending = next;
        }
        self.check_root_key(number, &root, &found);
        if found.extents.len() as u64 != u64::from(core.data_extent_count) {
            let message = format!(
                "inode {number}: counts {} extents, its tree holds {}",
                core.data_extent_count,
                found.extents.len()
            );
            self.fork_problem(number, None, message);
        }
        if self.repairing && self.report.problems.len() != problems {
            self.findings.rebuild_map.insert(number.0);
        }
        Some(found)
    }

    /// The root's first key is the first file block mapped.
    fn check_root_key(&mut self, number: InodeNumber, root: &BmapRoot, found: &ForkBlocks) {
        let first = found.extents.first().map(|e| e.file_block);
        if first.is_some_and(|first| root.keys.first() != Some(&first)) {
            let message = format!(
                "inode {number}: tree root key {:?} is not the first mapped block {first:?}",
                root.keys.first()
            );
            self.fork_problem(number, None, message);
        }
    }

    /// Reads and checks one tree block; `siblings` are the expected neighbours.
    fn bmap_block(
        &mut self,
        number: InodeNumber,
        layout: &BtreeLayout,
        at: u64,
        level: u16,
        siblings: (u64, u64),
    ) -> Option<(BtreeHeader, Vec<u8>)> {
        let valid = layout.pointer_bounds(&self.geometry, number.0);
        if !valid.contains(&at) {
            let message = format!("inode {number}: tree pointer {at} is outside the device");
            self.fork_problem(number, None, message);
            return None;
        }
        let block = self.read_block(FsBlock(at), MetaKind::BmapBtree.name())?;
        let expected = Expected {
            kind: MetaKind::BmapBtree,
            blkno: at,
            uuid: self.uuid,
            owner: Some(number.0),
        };
        let header = verify_header(&block, &expected)
            .and_then(|_| BtreeHeader::decode(&block))
            .and_then(|h| h.check(layout, &block, valid).map(|()| h));
        let header = match header {
            Ok(header) => header,
            Err(err) => {
                self.report.add(Problem::from_format(at, &err));
                return None;
            }
        };
        let checks = [
            ("level", u64::from(header.level), u64::from(level)),
            ("left sibling", header.left, siblings.0),
            ("right sibling", header.right, siblings.1),
        ];
        for (what, found, want) in checks {
            if found != want {
                let message = format!("inode {number}: {what} is {found}, expected {want}");
                self.fork_problem(number, Some(at), message);
            }
        }
        self.claim_for(number.0, at, 1, "file extent tree");
        if self.repairing {
            self.findings
                .tree_blocks
                .entry(number.0)
                .or_default()
                .push(at);
        }
        Some((header, block))
    }

    /// A node's children (with key ranges) or a leaf's extents, checking key order.
    fn bmap_entries(
        &mut self,
        number: InodeNumber,
        layout: &BtreeLayout,
        (header, block): (&BtreeHeader, &[u8]),
        item: Pending,
        next: &mut Vec<Pending>,
        found: &mut ForkBlocks,
    ) -> Option<()> {
        let count = usize::from(header.record_count);
        let mut keys = Vec::with_capacity(count);
        for index in 0..count {
            let key = if header.level == 0 {
                let raw = layout.record(block, index)?;
                match Extent::decode(raw) {
                    Ok(extent) => {
                        found.extents.push(extent);
                        extent.file_block
                    }
                    Err(err) => {
                        self.report.add(Problem::from_format(item.block, &err));
                        if self.repairing && header.level == 0 {
                            continue;
                        }
                        return None;
                    }
                }
            } else {
                let raw = layout.key(block, index)?;
                BmapKey::decode(raw).ok()?.file_block
            };
            let ordered = keys.last().is_none_or(|&p| p < key);
            let in_range = key >= item.low && item.high.is_none_or(|h| key < h);
            let first_matches = index > 0 || key == item.low;
            if !ordered || !in_range || !first_matches {
                let message = format!("inode {number}: key {index} ({key}) is out of order");
                self.fork_problem(number, Some(item.block), message);
            }
            keys.push(key);
        }
        if header.level > 0 {
            for index in 0..count {
                next.push(Pending {
                    block: layout.pointer(block, index)?,
                    low: keys[index],
                    high: keys.get(index + 1).copied().or(item.high),
                });
            }
        }
        Some(())
    }
}
