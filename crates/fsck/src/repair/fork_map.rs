//! Storing a rebuilt data fork map: the extents inline when they fit the fork, else a file
//! extent B+tree bulk-loaded bottom-up (full leaves and nodes, siblings linked, the owner
//! the inode) under a root in the inode. Tree blocks come first from the inode's old tree
//! blocks, then from space no structure claims (`BlockSource`); the block count is set to
//! what the forks hold. Blocks of the old tree left over go back to free space when phase 3
//! rebuilds the AG trees.

use cairn_format::btree_block::{BtreeHeader, BtreeLayout};
use cairn_format::inode::{BmapRoot, ForkFormat, put_fork_extents};
use cairn_format::types::NULL_BLOCK;
use cairn_format::{BmapKey, Extent, FsBlock, MetaHeader, MetaKind, OnDisk};

use super::{RepairError, Repairer};
use crate::check::Checker;

/// Blocks repair may allocate: ones to reuse first, then runs no structure claims.
#[derive(Debug, Clone, Default)]
pub(crate) struct BlockSource {
    pub reuse: Vec<u64>,
    /// (start, length) runs, each inside one AG, in block order.
    pub runs: Vec<(u64, u64)>,
}

impl BlockSource {
    /// The runs of `survey` that nothing but free space claims, each inside one AG, in block
    /// order. The AG trees and free lists keep their blocks: the next survey must still read
    /// them (an inode tree it could not walk would cost a scan for chunks).
    pub(crate) fn from_survey(survey: &Checker<'_>) -> Self {
        let g = survey.geometry;
        let mut claims: Vec<(u64, u64)> = survey
            .claims
            .iter()
            .filter(|c| c.owner != "free space")
            .map(|c| (c.start, c.start.saturating_add(c.length)))
            .collect();
        claims.sort_unstable();
        let mut runs = Vec::new();
        let mut cursor = 0;
        for (start, end) in claims.into_iter().chain([(g.block_count, g.block_count)]) {
            let mut from = cursor;
            while from < start.min(g.block_count) {
                let ag_end = g.ag_start(g.ag_of(FsBlock(from)).0 + 1);
                let to = start.min(ag_end).min(g.block_count);
                runs.push((from, to - from));
                from = to;
            }
            cursor = cursor.max(end);
        }
        BlockSource {
            reuse: Vec::new(),
            runs,
        }
    }

    /// Takes blocks `start..start + length` out of the runs (repair keeps what they hold).
    pub(crate) fn exclude(&mut self, start: u64, length: u64) {
        let end = start.saturating_add(length);
        let mut runs = Vec::with_capacity(self.runs.len() + 1);
        for &(from, len) in &self.runs {
            let to = from + len;
            if to <= start || end <= from {
                runs.push((from, len));
                continue;
            }
            if from < start {
                runs.push((from, start - from));
            }
            if end < to {
                runs.push((end, to - end));
            }
        }
        self.runs = runs;
        self.reuse.retain(|&b| b < start || b >= end);
    }

    /// One block: a reused one first.
    pub(crate) fn take_one(&mut self) -> Option<u64> {
        if let Some(block) = self.reuse.pop() {
            return Some(block);
        }
        self.take_run(1)
    }

    /// `count` contiguous blocks from the first run long enough.
    pub(crate) fn take_run(&mut self, count: u64) -> Option<u64> {
        let run = self.runs.iter_mut().find(|(_, len)| *len >= count)?;
        let start = run.0;
        *run = (start + count, run.1 - count);
        Some(start)
    }

    /// Up to `count` blocks as runs of at most `count` (first fit, then the longest left).
    pub(crate) fn take_blocks(&mut self, count: u64) -> Vec<(u64, u64)> {
        if let Some(start) = self.take_run(count) {
            return vec![(start, count)];
        }
        let mut taken = Vec::new();
        let mut wanted = count;
        while wanted > 0 {
            let Some(run) = self.runs.iter_mut().filter(|r| r.1 > 0).max_by_key(|r| r.1) else {
                break;
            };
            let length = run.1.min(wanted);
            taken.push((run.0, length));
            *run = (run.0 + length, run.1 - length);
            wanted -= length;
        }
        taken
    }
}

/// A tree level being built: (first key, block) of each block.
type Level = Vec<(u64, u64)>;

impl Repairer<'_> {
    /// Stores `extents` (sorted, disjoint) as the data fork of inode `inode` and sets its
    /// block count to the extents, the tree and `attr_blocks`. Returns the tree blocks used.
    pub(crate) fn store_data_map(
        &mut self,
        inode: u64,
        extents: &[Extent],
        attr_blocks: u64,
        source: &mut BlockSource,
    ) -> Result<Vec<u64>, RepairError> {
        let mut image = self.image(inode)?;
        let fork = image.data_fork_mut(self.geometry.inode_size);
        fork.fill(0);
        let tree = if put_fork_extents(extents, fork).is_ok() {
            image.core.data_format = ForkFormat::Extents;
            Vec::new()
        } else {
            let (root, tree) = self.bulk_load_bmap(inode, extents, source)?;
            root.encode(image.data_fork_mut(self.geometry.inode_size))?;
            image.core.data_format = ForkFormat::Btree;
            tree
        };
        let data: u64 = extents.iter().map(|e| u64::from(e.length)).sum();
        image.core.data_extent_count = extents.len() as u32;
        image.core.block_count = data + tree.len() as u64 + attr_blocks;
        self.write_image(inode, &image)?;
        Ok(tree)
    }

    /// Writes an extent tree holding `extents` (up to one top block, as cairn-fs keeps it)
    /// and returns the root for the inode's fork and every tree block.
    fn bulk_load_bmap(
        &mut self,
        inode: u64,
        extents: &[Extent],
        source: &mut BlockSource,
    ) -> Result<(BmapRoot, Vec<u64>), RepairError> {
        let layout = BtreeLayout::for_kind(MetaKind::BmapBtree, self.geometry.block_size)
            .ok_or_else(|| RepairError::Stuck("no extent tree layout".to_string()))?;
        let mut used = Vec::new();
        let mut level: Level = Vec::new();
        let mut height = 0u16;
        for group in extents.chunks(layout.leaf_capacity()) {
            let at = self.tree_block(inode, source, &mut used)?;
            level.push((group.first().map_or(0, |e| e.file_block), at));
        }
        let total = extents.len();
        self.write_bmap_level(
            inode,
            &layout,
            (&level, height, total),
            |raw, slot, index| {
                let extent = extents[slot * layout.leaf_capacity() + index];
                if let Some(out) = layout.record_mut(raw, index) {
                    extent.encode(out);
                }
                Ok(())
            },
        )?;
        // cairn-fs keeps one child under the root in the inode: the tree's top block.
        while level.len() > 1 {
            height += 1;
            let below = std::mem::take(&mut level);
            for group in below.chunks(layout.node_capacity()) {
                let at = self.tree_block(inode, source, &mut used)?;
                level.push((group[0].0, at));
            }
            let total = below.len();
            self.write_bmap_level(
                inode,
                &layout,
                (&level, height, total),
                |raw, slot, index| {
                    let (key, child) = below[slot * layout.node_capacity() + index];
                    if let Some(out) = layout.key_mut(raw, index) {
                        BmapKey { file_block: key }.encode(out);
                    }
                    layout.set_pointer(raw, index, child)?;
                    Ok(())
                },
            )?;
        }
        let root = BmapRoot {
            level: height + 1,
            keys: level.iter().map(|l| l.0).collect(),
            pointers: level.iter().map(|l| l.1).collect(),
        };
        Ok((root, used))
    }

    fn tree_block(
        &self,
        inode: u64,
        source: &mut BlockSource,
        used: &mut Vec<u64>,
    ) -> Result<u64, RepairError> {
        let at = source.take_one().ok_or_else(|| {
            RepairError::Stuck(format!("inode {inode}: no free block for its extent tree"))
        })?;
        used.push(at);
        Ok(at)
    }

    /// Writes the blocks of one level (`level` at `height`, holding `total` entries packed
    /// `capacity` to a block); `fill(raw, block index, slot)` fills one slot.
    fn write_bmap_level(
        &mut self,
        inode: u64,
        layout: &BtreeLayout,
        (level, height, total): (&Level, u16, usize),
        fill: impl Fn(&mut [u8], usize, usize) -> Result<(), RepairError>,
    ) -> Result<(), RepairError> {
        let capacity = layout.capacity(height);
        for (index, &(_, at)) in level.iter().enumerate() {
            let count = (total - index * capacity).min(capacity);
            let mut raw = vec![0u8; self.geometry.block_size as usize];
            BtreeHeader {
                header: MetaHeader::new(MetaKind::BmapBtree, at, self.uuid, inode),
                level: height,
                record_count: count as u16,
                left: index.checked_sub(1).map_or(NULL_BLOCK, |i| level[i].1),
                right: level.get(index + 1).map_or(NULL_BLOCK, |l| l.1),
            }
            .encode(&mut raw);
            for slot in 0..count {
                fill(&mut raw, index, slot)?;
            }
            self.write_meta(at, &mut raw)?;
        }
        Ok(())
    }
}
