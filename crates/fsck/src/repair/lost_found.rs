//! `/lost+found` in block form: when its entries do not fit in the inode (or it is already a
//! block directory that gains entries), it is rewritten whole into newly allocated blocks:
//! data blocks holding the markers and every entry, then a hash index over them (as many
//! levels as the entries need). The blocks come from space no structure claims (the survey's
//! gaps); its old blocks, no longer claimed, go back to free space when phase 3 rebuilds
//! the AG trees.

use cairn_format::btree_block::{BtreeHeader, BtreeLayout};
use cairn_format::dir::{
    DirDataHeader, DirHashKey, ShortformDir, ShortformEntry, dir_address, dir_data_entries,
    dir_data_insert, init_dir_data_block, name_hash,
};
use cairn_format::inode::{FileType, ForkFormat, INODE_CORE_SIZE, InodeCore, put_fork_extents};
use cairn_format::ondisk::put_u64;
use cairn_format::types::NULL_BLOCK;
use cairn_format::{Extent, FsBlock, MetaHeader, MetaKind, OnDisk};

use super::names::{Named, next_tag, probe_records};
use super::{RepairError, Repairer, space};
use crate::check::Checker;
use crate::dir_read::INDEX_FILE_BASE;

const PARENT_MARKER: &[u8] = b"..parent";
const INDEX_MARKER: &[u8] = b"..index";
/// Bits of the `..index` marker's inode field that hold the tree height.
const LEVELS_SHIFT: u32 = 56;

/// Runs of blocks (start, length) no structure claims, each inside one AG, in block order.
/// Free space and the AG trees and free lists do not count: phase 3 rebuilds them around
/// what the inodes claim.
pub(super) fn free_runs(survey: &Checker<'_>) -> Vec<(u64, u64)> {
    let g = survey.geometry;
    let mut claims: Vec<(u64, u64)> = survey
        .claims
        .iter()
        .filter(|c| !space::is_rebuilt(c))
        .map(|c| (c.start, c.start.saturating_add(c.length)))
        .collect();
    claims.sort_unstable();
    let mut gaps = Vec::new();
    let mut cursor = 0;
    for (start, end) in claims.into_iter().chain([(g.block_count, g.block_count)]) {
        let mut from = cursor;
        while from < start.min(g.block_count) {
            let ag_end = g.ag_start(g.ag_of(FsBlock(from)).0 + 1);
            let to = start.min(ag_end).min(g.block_count);
            gaps.push((from, to - from));
            from = to;
        }
        cursor = cursor.max(end);
    }
    gaps
}

/// Takes `count` contiguous blocks from `runs` (the first run long enough).
fn take_run(runs: &mut [(u64, u64)], count: u64) -> Option<u64> {
    let run = runs.iter_mut().find(|(_, len)| *len >= count)?;
    let start = run.0;
    *run = (start + count, run.1 - count);
    Some(start)
}

impl Repairer<'_> {
    /// Whether `entries` fit directory `dir`'s inode in short form.
    pub(super) fn short_form_fits(&self, dir: u64, entries: &[Named]) -> Result<bool, RepairError> {
        let (_, offset, block) = self.read_inode(dir)?;
        let raw = &block[offset..offset + self.geometry.inode_size as usize];
        let core = InodeCore::decode(raw)?;
        let room = core.data_fork_range(self.geometry.inode_size).len();
        let mut sf = ShortformDir {
            parent: 0,
            entries: Vec::with_capacity(entries.len()),
        };
        for entry in entries {
            let Some(tag) = next_tag(&sf, entry.name.len(), self.geometry.block_size) else {
                return Ok(false);
            };
            sf.entries.push(ShortformEntry {
                tag,
                file_type: entry.file_type,
                inode: entry.inode,
                name: entry.name.clone(),
            });
        }
        Ok(sf.encode().is_ok_and(|bytes| bytes.len() <= room))
    }

    /// Rewrites directory `dir` (parent `parent`) as data blocks holding `entries` plus a hash
    /// index, in blocks taken from `runs`; `old_blocks` are the blocks its data fork held.
    /// Returns the new data fork extents.
    pub(super) fn write_block_directory(
        &mut self,
        dir: u64,
        parent: u64,
        entries: &[Named],
        old_blocks: u64,
        runs: &mut [(u64, u64)],
    ) -> Result<Vec<Extent>, RepairError> {
        let (mut blocks, hashes) = self.fill_data_blocks(dir, parent, entries)?;
        let layout = BtreeLayout::for_kind(MetaKind::DirBtree, self.geometry.block_size)
            .ok_or_else(|| RepairError::Stuck("no directory index layout".to_string()))?;
        let records = probe_records(hashes);
        let levels = index_levels(&layout, records.len());
        let index_blocks: u64 = levels.iter().sum();
        let data_count = blocks.len() as u64;
        let Some(start) = take_run(runs, data_count + index_blocks) else {
            let why = format!(
                "directory {dir}: no free run of {} blocks for its entries",
                data_count + index_blocks
            );
            return Err(RepairError::Stuck(why));
        };
        let root = self.write_index(dir, &layout, &records, &levels, start + data_count)?;
        let packed = root | ((levels.len() as u64) << LEVELS_SHIFT);
        for (index, block) in blocks.iter_mut().enumerate() {
            let at = start + index as u64;
            let mut header = DirDataHeader::decode(block)?;
            header.header = MetaHeader::new(MetaKind::DirData, at, self.uuid, dir);
            header.encode(block);
            if index == 0 {
                let marker = dir_data_entries(block)?
                    .into_iter()
                    .find(|e| e.file_type == FileType::Unknown && e.name == INDEX_MARKER);
                if let Some(marker) = marker {
                    put_u64(block, usize::from(marker.offset) + 2, packed);
                }
            }
            self.write_meta(at, block)?;
        }
        let extents = vec![
            Extent::new(0, FsBlock(start), data_count as u32, false)?,
            Extent::new(
                INDEX_FILE_BASE + start + data_count,
                FsBlock(start + data_count),
                index_blocks as u32,
                false,
            )?,
        ];
        self.point_directory_at(dir, &extents, old_blocks)?;
        Ok(extents)
    }

    /// Data blocks (headers not yet placed) holding the two markers and `entries`, and the
    /// (hash, address) of each entry.
    #[allow(clippy::type_complexity)]
    fn fill_data_blocks(
        &self,
        dir: u64,
        parent: u64,
        entries: &[Named],
    ) -> Result<(Vec<Vec<u8>>, Vec<(u32, u32)>), RepairError> {
        let fresh = || -> Result<Vec<u8>, RepairError> {
            let mut block = vec![0u8; self.geometry.block_size as usize];
            init_dir_data_block(
                &mut block,
                MetaHeader::new(MetaKind::DirData, 0, self.uuid, dir),
            )?;
            Ok(block)
        };
        let mut first = fresh()?;
        dir_data_insert(&mut first, parent, FileType::Unknown, PARENT_MARKER)?;
        dir_data_insert(&mut first, 1, FileType::Unknown, INDEX_MARKER)?;
        let mut blocks = vec![first];
        let mut hashes = Vec::with_capacity(entries.len());
        for entry in entries {
            let mut placed = None;
            for _ in 0..2 {
                let index = blocks.len() - 1;
                let block = &mut blocks[index];
                if let Some(offset) =
                    dir_data_insert(block, entry.inode, entry.file_type, &entry.name)?
                {
                    placed = u32::try_from(index)
                        .ok()
                        .and_then(|i| dir_address(i, offset));
                    break;
                }
                blocks.push(fresh()?);
            }
            let Some(address) = placed else {
                let why = format!("directory {dir}: an entry does not fit a fresh block");
                return Err(RepairError::Stuck(why));
            };
            hashes.push((name_hash(&entry.name), address));
        }
        Ok((blocks, hashes))
    }

    /// Writes the index tree over `records` into blocks from `first` on, leaves first, then
    /// each level above; returns the root's block.
    fn write_index(
        &mut self,
        dir: u64,
        layout: &BtreeLayout,
        records: &[cairn_format::dir::DirHashRecord],
        levels: &[u64],
        first: u64,
    ) -> Result<u64, RepairError> {
        // (first key, block) of each block of the level below.
        let mut below: Vec<(u32, u64)> = Vec::new();
        let mut next = first;
        for (level, &count) in levels.iter().enumerate() {
            let mut built = Vec::with_capacity(count as usize);
            let per_block = if level == 0 {
                layout.leaf_capacity()
            } else {
                layout.node_capacity()
            };
            let items = if level == 0 {
                records.len()
            } else {
                below.len()
            };
            for index in 0..count {
                let at = next + index;
                let from = index as usize * per_block;
                let to = (from + per_block).min(items);
                let mut block = vec![0u8; self.geometry.block_size as usize];
                let left = if index == 0 { NULL_BLOCK } else { at - 1 };
                let right = if index + 1 == count {
                    NULL_BLOCK
                } else {
                    at + 1
                };
                BtreeHeader {
                    header: MetaHeader::new(MetaKind::DirBtree, at, self.uuid, dir),
                    level: level as u16,
                    record_count: (to - from) as u16,
                    left,
                    right,
                }
                .encode(&mut block);
                let first_key = if level == 0 {
                    for (slot, record) in records[from..to].iter().enumerate() {
                        if let Some(out) = layout.record_mut(&mut block, slot) {
                            record.encode(out);
                        }
                    }
                    records.get(from).map_or(0, |r| r.hash)
                } else {
                    for (slot, &(key, child)) in below[from..to].iter().enumerate() {
                        if let Some(out) = layout.key_mut(&mut block, slot) {
                            DirHashKey { hash: key }.encode(out);
                        }
                        layout.set_pointer(&mut block, slot, child)?;
                    }
                    below.get(from).map_or(0, |b| b.0)
                };
                self.write_meta(at, &mut block)?;
                built.push((first_key, at));
            }
            below = built;
            next += count;
        }
        Ok(below.first().map_or(first, |b| b.1))
    }

    /// Points directory `dir`'s data fork at `extents` (blocks counted in, old ones out).
    fn point_directory_at(
        &mut self,
        dir: u64,
        extents: &[Extent],
        old_blocks: u64,
    ) -> Result<(), RepairError> {
        let (_, offset, block) = self.read_inode(dir)?;
        let raw = &block[offset..offset + self.geometry.inode_size as usize];
        let mut core = InodeCore::decode(raw)?;
        let mut literal = raw[INODE_CORE_SIZE..].to_vec();
        let range = core.data_fork_range(self.geometry.inode_size);
        let fork = &mut literal[range.start - INODE_CORE_SIZE..range.end - INODE_CORE_SIZE];
        fork.fill(0);
        put_fork_extents(extents, fork)?;
        let blocks: u64 = extents.iter().map(|e| u64::from(e.length)).sum();
        core.data_format = ForkFormat::Extents;
        core.data_extent_count = extents.len() as u32;
        core.size = u64::from(extents[0].length) * u64::from(self.geometry.block_size);
        core.block_count = core.block_count.saturating_sub(old_blocks) + blocks;
        self.write_inode(dir, &core, &literal)
    }
}

/// Blocks of each index level (leaves first) for `records` records; at least one leaf.
fn index_levels(layout: &BtreeLayout, records: usize) -> Vec<u64> {
    let mut levels = vec![records.div_ceil(layout.leaf_capacity()).max(1) as u64];
    while let Some(&top) = levels.last()
        && top > 1
    {
        levels.push((top as usize).div_ceil(layout.node_capacity()) as u64);
    }
    levels
}
