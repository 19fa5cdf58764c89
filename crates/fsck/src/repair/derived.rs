//! The repair step after the namespace: data derived from other data is rebuilt from what
//! the last survey read. A block directory whose hash index disagrees with its entries (or
//! cannot be walked) gets a new index built from the entries of its data blocks, in its old
//! index blocks and, if those are too few, blocks no structure claims; the data fork maps
//! exactly the new index blocks. Inodes whose block count differs from what their forks
//! hold get the count of the forks; regular files that map shared blocks without the
//! reflink flag get it.

use cairn_format::btree_block::{BtreeHeader, BtreeLayout};
use cairn_format::dir::{DirHashKey, DirHashRecord, dir_address, dir_data_entries, name_hash};
use cairn_format::inode::{FileType, INODE_FLAG_REFLINK, InodeCore};
use cairn_format::limits::EXTENT_LEN_MAX;
use cairn_format::ondisk::put_u64;
use cairn_format::types::NULL_BLOCK;
use cairn_format::{Extent, FsBlock, MetaHeader, MetaKind, OnDisk};

use super::fork_map::BlockSource;
use super::names::probe_records;
use super::{RepairError, Repairer};
use crate::check::Checker;
use crate::dir_read::{DirSource, INDEX_FILE_BASE};
use crate::namespace::InodeSeen;

const INDEX_MARKER: &[u8] = b"..index";
/// Bits of the `..index` marker's inode field that hold the tree height.
pub(crate) const LEVELS_SHIFT: u32 = 56;

/// Where a directory's entries and `..index` marker are, read from its data blocks.
struct DirContents {
    /// (hash, data address) of every entry.
    hashes: Vec<(u32, u32)>,
    /// The block holding data block 0 and the offset of its `..index` marker.
    marker: (u64, u16),
}

impl Repairer<'_> {
    /// Rebuilds the indexes and block counts the survey found wrong.
    pub(crate) fn repair_derived(&mut self, survey: &Checker<'_>) -> Result<(), RepairError> {
        let findings = &survey.findings;
        let mut source = BlockSource::from_survey(survey);
        let mut rebuilt = std::collections::BTreeSet::new();
        for &dir in &findings.bad_index {
            let Some(InodeSeen {
                dir: Some(DirSource::Blocks(extents)),
                ..
            }) = survey.inodes.get(&dir)
            else {
                continue;
            };
            let attr_blocks = findings.attr_blocks.get(&dir).copied().unwrap_or(0);
            // The directory's own extent tree blocks serve its map again, if it changes.
            source.reuse = findings.tree_blocks.get(&dir).cloned().unwrap_or_default();
            let done = self.rebuild_dir_index(dir, extents, attr_blocks, &mut source);
            source.reuse.clear();
            if done? {
                rebuilt.insert(dir);
            }
        }
        for (&inode, &fork_blocks) in &findings.wrong_counts {
            if rebuilt.contains(&inode) {
                continue;
            }
            let attr_blocks = findings.attr_blocks.get(&inode).copied().unwrap_or(0);
            let blocks = fork_blocks + attr_blocks;
            self.set_counts(inode, "block count", |core| {
                (std::mem::replace(&mut core.block_count, blocks), blocks)
            })?;
        }
        for (&inode, &size) in &findings.wrong_size {
            self.set_counts(inode, "size", |core| {
                (std::mem::replace(&mut core.size, size), size)
            })?;
        }
        for &inode in &findings.missing_reflink {
            self.set_counts(inode, "flags (reflink)", |core| {
                let old = core.flags;
                core.flags |= INODE_FLAG_REFLINK;
                (u64::from(old), u64::from(core.flags))
            })?;
        }
        for (&inode, &nlink) in &findings.wrong_nlink {
            self.set_counts(inode, "link count", |core| {
                let old = std::mem::replace(&mut core.nlink, nlink);
                (u64::from(old), u64::from(nlink))
            })?;
        }
        Ok(())
    }

    /// Applies `set` (which returns the old and new value of the counter it sets) to inode
    /// `inode`'s core, writing it back if the counter changed.
    fn set_counts(
        &mut self,
        inode: u64,
        what: &str,
        set: impl FnOnce(&mut InodeCore) -> (u64, u64),
    ) -> Result<(), RepairError> {
        let Some(mut image) = self.read_image(inode)? else {
            return Ok(());
        };
        let (old, new) = set(&mut image.core);
        if old == new {
            return Ok(());
        }
        self.write_image(inode, &image)?;
        self.action(format!("inode {inode}: {what} {old} set to {new}"));
        Ok(())
    }

    /// Rebuilds directory `dir`'s hash index over the entries its data blocks hold; returns
    /// whether it did (false: data block 0 or its marker cannot be read).
    fn rebuild_dir_index(
        &mut self,
        dir: u64,
        extents: &[Extent],
        attr_blocks: u64,
        source: &mut BlockSource,
    ) -> Result<bool, RepairError> {
        let layout = BtreeLayout::for_kind(MetaKind::DirBtree, self.geometry.block_size)
            .ok_or_else(|| RepairError::Stuck("no directory index layout".to_string()))?;
        let Some(contents) = self.dir_contents(extents)? else {
            return Ok(false);
        };
        let records = probe_records(contents.hashes);
        let levels = index_levels(&layout, records.len());
        let needed: u64 = levels.iter().sum();
        let old = index_blocks(extents);
        let mut blocks: Vec<u64> = old.iter().copied().take(needed as usize).collect();
        while (blocks.len() as u64) < needed {
            let Some(block) = source.take_run(1).filter(|&b| b < 1 << 32) else {
                let why = format!("directory {dir}: no free block for its hash index");
                return Err(RepairError::Stuck(why));
            };
            blocks.push(block);
        }
        let root = self.write_index(dir, &layout, &records, &levels, &blocks)?;
        let (at, offset) = contents.marker;
        let mut block0 = self.read_raw(at, 1)?;
        let packed = root | ((levels.len() as u64) << LEVELS_SHIFT);
        put_u64(&mut block0, usize::from(offset) + 2, packed);
        self.write_meta(at, &mut block0)?;
        let mut sorted = blocks.clone();
        sorted.sort_unstable();
        if sorted != old {
            let mut map: Vec<Extent> = extents
                .iter()
                .copied()
                .filter(|e| e.file_block < INDEX_FILE_BASE)
                .collect();
            map.extend(index_extents(&sorted)?);
            self.store_data_map(dir, &map, attr_blocks, source)?;
        }
        self.action(format!(
            "directory {dir}: hash index rebuilt ({} entries, {} levels)",
            records.len(),
            levels.len()
        ));
        Ok(true)
    }

    /// The entries of every data block that decodes, and where the `..index` marker is.
    fn dir_contents(&self, extents: &[Extent]) -> Result<Option<DirContents>, RepairError> {
        let mut hashes = Vec::new();
        let mut marker = None;
        for extent in extents.iter().filter(|e| e.file_block < INDEX_FILE_BASE) {
            if extent.unwritten {
                continue;
            }
            for step in 0..u64::from(extent.length) {
                let index = extent.file_block + step;
                let at = extent.fs_block.0 + step;
                if at >= self.geometry.block_count {
                    continue;
                }
                let block = self.read_raw(at, 1)?;
                let Ok(entries) = dir_data_entries(&block) else {
                    continue;
                };
                for entry in entries {
                    if entry.file_type == FileType::Unknown {
                        if index == 0 && entry.name == INDEX_MARKER {
                            marker = Some((at, entry.offset));
                        }
                        continue;
                    }
                    let address = u32::try_from(index)
                        .ok()
                        .and_then(|i| dir_address(i, entry.offset));
                    if let Some(address) = address {
                        hashes.push((name_hash(&entry.name), address));
                    }
                }
            }
        }
        Ok(marker.map(|marker| DirContents { hashes, marker }))
    }

    /// Writes a directory's hash index over `records` into `blocks` (see `write_file_tree`);
    /// returns the root's block.
    pub(super) fn write_index(
        &mut self,
        dir: u64,
        layout: &BtreeLayout,
        records: &[DirHashRecord],
        levels: &[u64],
        blocks: &[u64],
    ) -> Result<u64, RepairError> {
        let key = |record: &DirHashRecord| DirHashKey { hash: record.hash };
        self.write_file_tree(dir, layout, (records, key), levels, blocks)
    }

    /// Writes a tree owned by inode `owner` (a directory's hash index, an attribute index)
    /// over `records` (sorted by `key`) into `blocks`: full blocks, leaves first, then each
    /// level above, as `levels` counts them, siblings linked; returns the root's block.
    pub(super) fn write_file_tree<R: OnDisk, K: OnDisk + Copy>(
        &mut self,
        owner: u64,
        layout: &BtreeLayout,
        (records, key): (&[R], impl Fn(&R) -> K),
        levels: &[u64],
        blocks: &[u64],
    ) -> Result<u64, RepairError> {
        // (first key, block) of each block of the level below.
        let mut below: Vec<(K, u64)> = Vec::new();
        let mut next = 0usize;
        for (level, &count) in levels.iter().enumerate() {
            let count = count as usize;
            let level_blocks = blocks.get(next..next + count).ok_or_else(|| {
                RepairError::Stuck(format!("inode {owner}: too few index blocks"))
            })?;
            let per_block = layout.capacity(level as u16);
            let items = if level == 0 {
                records.len()
            } else {
                below.len()
            };
            let mut built = Vec::with_capacity(count);
            for (index, &at) in level_blocks.iter().enumerate() {
                let from = (index * per_block).min(items);
                let to = (from + per_block).min(items);
                let mut block = vec![0u8; self.geometry.block_size as usize];
                BtreeHeader {
                    header: MetaHeader::new(layout.kind, at, self.uuid, owner),
                    level: level as u16,
                    record_count: (to - from) as u16,
                    left: index.checked_sub(1).map_or(NULL_BLOCK, |i| level_blocks[i]),
                    right: level_blocks.get(index + 1).copied().unwrap_or(NULL_BLOCK),
                }
                .encode(&mut block);
                let first_key = if level == 0 {
                    for (slot, record) in records[from..to].iter().enumerate() {
                        if let Some(out) = layout.record_mut(&mut block, slot) {
                            record.encode(out);
                        }
                    }
                    records.get(from).map(&key)
                } else {
                    for (slot, &(child_key, child)) in below[from..to].iter().enumerate() {
                        if let Some(out) = layout.key_mut(&mut block, slot) {
                            child_key.encode(out);
                        }
                        layout.set_pointer(&mut block, slot, child)?;
                    }
                    below.get(from).map(|b| b.0)
                };
                self.write_meta(at, &mut block)?;
                if let Some(first_key) = first_key {
                    built.push((first_key, at));
                }
            }
            // An empty tree is one empty leaf, which the level above (if any) never names.
            if built.is_empty() {
                return level_blocks
                    .first()
                    .copied()
                    .ok_or_else(|| RepairError::Stuck(format!("inode {owner}: an empty index")));
            }
            below = built;
            next += count;
        }
        below
            .first()
            .map(|b| b.1)
            .ok_or_else(|| RepairError::Stuck(format!("inode {owner}: an empty index")))
    }
}

/// Blocks of each index level (leaves first) for `records` records; at least one leaf.
pub(super) fn index_levels(layout: &BtreeLayout, records: usize) -> Vec<u64> {
    let mut levels = vec![records.div_ceil(layout.leaf_capacity()).max(1) as u64];
    while let Some(&top) = levels.last()
        && top > 1
    {
        levels.push((top as usize).div_ceil(layout.node_capacity()) as u64);
    }
    levels
}

/// The index blocks a directory's data fork maps (where the mapping is the documented one:
/// file block 2^32 + block), sorted.
fn index_blocks(extents: &[Extent]) -> Vec<u64> {
    let mut blocks: Vec<u64> = extents
        .iter()
        .filter(|e| e.file_block >= INDEX_FILE_BASE)
        .filter(|e| e.file_block - INDEX_FILE_BASE == e.fs_block.0)
        .flat_map(|e| e.fs_block.0..e.fs_end().0)
        .collect();
    blocks.sort_unstable();
    blocks.dedup();
    blocks
}

/// The data fork extents mapping index blocks `sorted` (each at file block 2^32 + block).
pub(super) fn index_extents(sorted: &[u64]) -> Result<Vec<Extent>, RepairError> {
    let mut extents: Vec<Extent> = Vec::new();
    for &block in sorted {
        if let Some(last) = extents.last_mut()
            && last.fs_end().0 == block
            && last.length < EXTENT_LEN_MAX
        {
            last.length += 1;
            continue;
        }
        extents.push(Extent::new(
            INDEX_FILE_BASE + block,
            FsBlock(block),
            1,
            false,
        )?);
    }
    Ok(extents)
}
