//! `/lost+found` in block form: when its entries do not fit in the inode (or it is already a
//! block directory that gains entries), it is rewritten whole into newly allocated blocks:
//! data blocks holding the markers and every entry, then a hash index over them (as many
//! levels as the entries need). The blocks come from space no structure claims (the survey's
//! gaps, `BlockSource`); its old blocks, no longer claimed, go back to free space when phase
//! 3 rebuilds the AG trees.

use cairn_format::btree_block::BtreeLayout;
use cairn_format::dir::{
    DirDataHeader, ShortformDir, ShortformEntry, dir_address, dir_data_entries, dir_data_insert,
    init_dir_data_block, name_hash,
};
use cairn_format::inode::{FileType, ForkFormat, put_fork_extents};
use cairn_format::ondisk::put_u64;
use cairn_format::{Extent, FsBlock, MetaHeader, MetaKind, OnDisk};

use super::derived::{LEVELS_SHIFT, index_levels};
use super::fork_map::BlockSource;
use super::names::{Named, next_tag, probe_records};
use super::{RepairError, Repairer};
use crate::dir_read::INDEX_FILE_BASE;

const PARENT_MARKER: &[u8] = b"..parent";
const INDEX_MARKER: &[u8] = b"..index";

impl Repairer<'_> {
    /// Whether `entries` fit directory `dir`'s inode in short form.
    pub(super) fn short_form_fits(&self, dir: u64, entries: &[Named]) -> Result<bool, RepairError> {
        let room = self
            .image(dir)?
            .data_fork_mut(self.geometry.inode_size)
            .len();
        let mut sf = ShortformDir {
            parent: self.superblock.root_inode,
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
        source: &mut BlockSource,
    ) -> Result<Vec<Extent>, RepairError> {
        let (mut blocks, hashes) = self.fill_data_blocks(dir, parent, entries)?;
        let layout = BtreeLayout::for_kind(MetaKind::DirBtree, self.geometry.block_size)
            .ok_or_else(|| RepairError::Stuck("no directory index layout".to_string()))?;
        let records = probe_records(hashes);
        let levels = index_levels(&layout, records.len());
        let index_blocks: u64 = levels.iter().sum();
        let data_count = blocks.len() as u64;
        let Some(start) = source.take_run(data_count + index_blocks) else {
            let why = format!(
                "directory {dir}: no free run of {} blocks for its entries",
                data_count + index_blocks
            );
            return Err(RepairError::Stuck(why));
        };
        let index_at: Vec<u64> = (start + data_count..start + data_count + index_blocks).collect();
        let root = self.write_index(dir, &layout, &records, &levels, &index_at)?;
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

    /// Points directory `dir`'s data fork at `extents` (blocks counted in, old ones out).
    fn point_directory_at(
        &mut self,
        dir: u64,
        extents: &[Extent],
        old_blocks: u64,
    ) -> Result<(), RepairError> {
        let mut image = self.image(dir)?;
        let fork = image.data_fork_mut(self.geometry.inode_size);
        fork.fill(0);
        put_fork_extents(extents, fork)?;
        let core = &mut image.core;
        let blocks: u64 = extents.iter().map(|e| u64::from(e.length)).sum();
        core.data_format = ForkFormat::Extents;
        core.data_extent_count = extents.len() as u32;
        core.size = u64::from(extents[0].length) * u64::from(self.geometry.block_size);
        core.block_count = core.block_count.saturating_sub(old_blocks) + blocks;
        self.write_image(dir, &image)
    }
}
