//! Inode trees and inodes: every chunk the inode tree records is read, every inode in it
//! verifies, allocation agrees with the free mask, and file data is claimed (a symlink's
//! remote target blocks are checked in `symlink.rs`).

use cairn_blockdev::AlignedBuf;
use cairn_format::agi::Agi;
use cairn_format::btree_block::InodeRecord;
use cairn_format::inode::{
    FileType, ForkFormat, InodeCore, clear_inode_reserved, extent_size_hint_max, fork_extents,
};
use cairn_format::limits::{AG_HEADER_BLOCKS, INODES_PER_CHUNK};
use cairn_format::types::NULL_AG_INODE;
use cairn_format::{
    AgBlock, AgNumber, Expected, Extent, InodeNumber, MetaKind, OnDisk, verify_header,
};

use crate::bmap::ForkBlocks;
use crate::check::Checker;
use crate::dir_read::INDEX_FILE_BASE;
use crate::report::Problem;
use crate::tree::AgTree;

impl Checker<'_> {
    /// Checks AG `ag`'s inode and free-inode trees and every inode they cover. Returns the
    /// (inodes, free inodes) the inode tree records.
    pub fn check_inode_trees(&mut self, ag: u32, agi: &Agi) -> (u64, u64) {
        let ino = AgTree {
            kind: MetaKind::InoBtree,
            ag,
            root: agi.ino_root,
            levels: agi.ino_levels,
        };
        let fino = AgTree {
            kind: MetaKind::FinoBtree,
            ag,
            root: agi.fino_root,
            levels: agi.fino_levels,
        };
        let problems = self.report.problems.len();
        let chunks = self
            .walk_ag_tree(ino)
            .map(|raw| self.inode_records(ag, &raw));
        let with_free = self
            .walk_ag_tree(fino)
            .map(|raw| self.inode_records(ag, &raw));
        let suspect = chunks.as_ref().is_some_and(|chunks| {
            self.report.problems.len() != problems
                || self.scan_all
                || chunks.len() as u64 * u64::from(INODES_PER_CHUNK) != u64::from(agi.inode_count)
                || chunks.iter().any(|c| !self.record_is_sane(ag, c))
        });
        let chunks = match chunks {
            // Repair does not trust a damaged inode tree (or one the AGI disagrees with) to
            // know every chunk: a record may have been lost or changed. A scan of the AG
            // finds the chunks.
            Some(chunks) if self.repairing && suspect => self.merge_scanned(ag, chunks),
            Some(chunks) => chunks,
            None if self.repairing => {
                self.findings.scanned_ags.insert(ag);
                self.scan_for_chunks(ag)
            }
            None => return (0, 0),
        };
        for chunk in &chunks {
            self.check_chunk(ag, chunk);
        }
        let expected_free: Vec<InodeRecord> = chunks
            .iter()
            .copied()
            .filter(|c| c.free_count > 0)
            .collect();
        if with_free.is_some_and(|f| f != expected_free) {
            let message = format!("AG {ag}: the free-inode tree disagrees with the inode tree");
            self.report
                .add(Problem::new(MetaKind::FinoBtree.name(), None, message));
        }
        let inodes = chunks.len() as u64 * u64::from(INODES_PER_CHUNK);
        let free = chunks.iter().map(|c| u64::from(c.free_count)).sum();
        let at = Some(agi.header.blkno);
        let newest_known =
            agi.newest_inode == NULL_AG_INODE || chunks.iter().any(|c| c.start == agi.newest_inode);
        if !newest_known {
            let message = format!(
                "newest_inode {} is not a chunk of the inode tree",
                agi.newest_inode
            );
            self.report
                .add(Problem::new(MetaKind::Agi.name(), at, message));
        }
        if u64::from(agi.inode_count) != inodes || u64::from(agi.free_inodes) != free {
            let message = format!(
                "counts {} inodes / {} free, the inode tree holds {inodes} / {free}",
                agi.inode_count, agi.free_inodes
            );
            self.report
                .add(Problem::new(MetaKind::Agi.name(), at, message));
        }
        (inodes, free)
    }

    /// Repair without a readable AGI: finds the AG's chunks by a scan and checks them.
    pub(crate) fn scan_ag_inodes(&mut self, ag: u32) {
        self.findings.scanned_ags.insert(ag);
        for chunk in self.scan_for_chunks(ag) {
            self.check_chunk(ag, &chunk);
        }
    }

    /// Whether an inode tree record could describe a chunk of AG `ag`: aligned, inside the
    /// AG past its headers, its free count that of its mask.
    fn record_is_sane(&self, ag: u32, chunk: &InodeRecord) -> bool {
        let g = self.geometry;
        let first_block = chunk.start >> g.inodes_per_block_log;
        let end = u64::from(first_block) + u64::from(g.chunk_blocks());
        chunk.start.is_multiple_of(INODES_PER_CHUNK)
            && first_block >= AG_HEADER_BLOCKS
            && end <= u64::from(g.ag_len(ag))
            && chunk.free_count == chunk.free_mask.count_ones()
    }

    /// The records of a damaged inode tree that name real chunks, joined by the chunks a
    /// scan of the AG finds (sorted by start, each once).
    fn merge_scanned(&mut self, ag: u32, records: Vec<InodeRecord>) -> Vec<InodeRecord> {
        self.findings.scanned_ags.insert(ag);
        let mut chunks = self.scan_for_chunks(ag);
        let known: std::collections::BTreeSet<u32> = chunks.iter().map(|c| c.start).collect();
        chunks.extend(records.into_iter().filter(|r| !known.contains(&r.start)));
        chunks.sort_by_key(|c| c.start);
        chunks.dedup_by_key(|c| c.start);
        chunks
    }

    /// Finds AG `ag`'s inode chunks without its inode tree: every chunk-aligned place whose
    /// first block's or last block's first inode verifies as the inode of its slot.
    fn scan_for_chunks(&mut self, ag: u32) -> Vec<InodeRecord> {
        let g = self.geometry;
        let blocks = g.chunk_blocks();
        let mut found = Vec::new();
        let mut first = AG_HEADER_BLOCKS.next_multiple_of(blocks);
        while first + blocks <= g.ag_len(ag) {
            let start = first << g.inodes_per_block_log;
            if self.inode_block_verifies(ag, first)
                || self.inode_block_verifies(ag, first + blocks - 1)
            {
                found.push(InodeRecord {
                    start,
                    free_count: 0,
                    free_mask: 0,
                });
            }
            first += blocks;
        }
        found
    }

    /// Whether the first inode of AG block `block` verifies as the inode of its place.
    fn inode_block_verifies(&self, ag: u32, block: u32) -> bool {
        let g = self.geometry;
        let at = g.fs_block(AgNumber(ag), AgBlock(block));
        let number =
            (u64::from(ag) << g.ag_inode_bits()) | u64::from(block << g.inodes_per_block_log);
        let mut buf = AlignedBuf::zeroed(g.block_size as usize);
        let expected = self.inode_expected(number);
        self.device.read_at(g.byte_offset(at), &mut buf).is_ok()
            && verify_header(&buf[..g.inode_size as usize], &expected).is_ok()
    }

    fn inode_records(&mut self, ag: u32, raw: &[Vec<u8>]) -> Vec<InodeRecord> {
        let mut records = Vec::with_capacity(raw.len());
        for bytes in raw {
            match InodeRecord::decode(bytes) {
                Ok(record) => records.push(record),
                Err(err) => {
                    let message = format!("AG {ag}: {err}");
                    self.report
                        .add(Problem::new(MetaKind::InoBtree.name(), None, message));
                }
            }
        }
        records
    }

    /// Reads one chunk and checks each of its inodes against the record's free mask.
    pub(crate) fn check_chunk(&mut self, ag: u32, chunk: &InodeRecord) {
        let g = self.geometry;
        let first_block = chunk.start >> g.inodes_per_block_log;
        let blocks = g.chunk_blocks();
        let misaligned = !chunk.start.is_multiple_of(INODES_PER_CHUNK);
        let end = u64::from(first_block) + u64::from(blocks);
        let outside = misaligned || first_block < AG_HEADER_BLOCKS || end > u64::from(g.ag_len(ag));
        if outside || chunk.free_count != chunk.free_mask.count_ones() {
            let message = format!("AG {ag}: chunk at AG inode {} is malformed", chunk.start);
            self.report
                .add(Problem::new(MetaKind::InoBtree.name(), None, message));
            // Repair trusts the inode cores over the record's counts, if the chunk is one.
            if outside || !self.repairing {
                return;
            }
        }
        let at = g.fs_block(AgNumber(ag), AgBlock(first_block));
        let Some(data) = self.read_blocks(at, blocks, MetaKind::Inode.name()) else {
            self.claim(at.0, u64::from(blocks), "inode chunk");
            return;
        };
        let inode_size = g.inode_size as usize;
        if self.repairing && !holds_an_inode(&data, ag, chunk.start, self) {
            // A record naming blocks that hold no inode of theirs is damage, not a chunk
            // whose every inode is broken: repair must not write inodes over them.
            let message = format!(
                "AG {ag}: no inode verifies in the chunk at AG inode {}",
                chunk.start
            );
            self.report
                .add(Problem::new(MetaKind::InoBtree.name(), None, message));
            return;
        }
        self.claim(at.0, u64::from(blocks), "inode chunk");
        let mut free_mask = 0u64;
        for slot in 0..INODES_PER_CHUNK {
            let number = (u64::from(ag) << g.ag_inode_bits()) | u64::from(chunk.start + slot);
            let raw = &data[slot as usize * inode_size..(slot as usize + 1) * inode_size];
            let free = chunk.free_mask & (1 << slot) != 0;
            self.check_inode(InodeNumber(number), raw, free);
            if !self.inodes.contains_key(&number) {
                free_mask |= 1 << slot;
            }
        }
        if self.repairing {
            let record = InodeRecord {
                start: chunk.start,
                free_count: free_mask.count_ones(),
                free_mask,
            };
            self.findings.chunks.push((ag, record));
        }
    }

    fn check_inode(&mut self, number: InodeNumber, raw: &[u8], free: bool) {
        self.report.inodes_checked += 1;
        let expected = self.inode_expected(number.0);
        let mut salvaged = Vec::new();
        let core = match InodeCore::read(raw, &expected) {
            Ok(core) => core,
            Err(err) => {
                self.report.add(Problem::new(
                    err.structure(),
                    Some(number.0),
                    err.to_string(),
                ));
                let hint_max = extent_size_hint_max(self.geometry.ag_blocks);
                match salvage_reserved(raw, &expected, hint_max) {
                    Some((core, copy)) if self.repairing => {
                        self.findings.restamp_inodes.push(number.0);
                        salvaged = copy;
                        core
                    }
                    _ => {
                        let why = format!("its core is damaged: {err}");
                        self.findings.broken_inodes.insert(number.0, why);
                        return;
                    }
                }
            }
        };
        let raw = if salvaged.is_empty() { raw } else { &salvaged };
        self.check_extent_size_hint(number, &core, !salvaged.is_empty());
        let problem = match (free, core.file_type()) {
            (true, Some(_)) => Some("is in use but the chunk marks it free"),
            (false, None) => Some("is free but the chunk marks it in use"),
            _ => None,
        };
        if let Some(problem) = problem {
            let message = format!("inode {number} {problem}");
            self.report
                .add(Problem::new("inode", Some(number.0), message));
            // Repair trusts the core: the chunk's mask is rebuilt from the cores.
            if !self.repairing {
                return;
            }
        }
        if core.file_type().is_some() {
            self.note_inode(number, raw, &core);
            self.check_special_size(number, &core);
            // The data fork's checks see the block count less the attr fork's blocks.
            let attr_blocks = self.check_attr_fork(number, raw, &core);
            if self.repairing && attr_blocks > 0 {
                self.findings.attr_blocks.insert(number.0, attr_blocks);
            }
            self.check_unmapped_block_count(number, &core, attr_blocks);
            let mut data_core = core;
            data_core.block_count = core.block_count.saturating_sub(attr_blocks);
            self.check_data_fork(number, raw, &data_core);
        }
    }

    /// An extent size hint and a CoW extent size hint no larger than half an AG (the
    /// verifier has no geometry to check that); repair clears a larger one with the
    /// reserved fields.
    fn check_extent_size_hint(&mut self, number: InodeNumber, core: &InodeCore, queued: bool) {
        let hint_max = extent_size_hint_max(self.geometry.ag_blocks);
        if core.file_type().is_none() {
            return;
        }
        let hints = [
            ("extent size hint", core.extent_size_hint),
            ("CoW extent size hint", core.cow_extent_size_hint),
        ];
        let mut queued = queued;
        for (name, hint) in hints.into_iter().filter(|&(_, hint)| hint > hint_max) {
            let message =
                format!("inode {number}: {name} of {hint} blocks is above half an AG ({hint_max})");
            self.report
                .add(Problem::new("inode", Some(number.0), message));
            if self.repairing && !queued {
                self.findings.restamp_inodes.push(number.0);
                queued = true;
            }
        }
    }

    /// A device, FIFO or socket (a whiteout among them: a character device 0/0) holds no
    /// data: its size is 0. Repair sets it so.
    fn check_special_size(&mut self, number: InodeNumber, core: &InodeCore) {
        if core.data_format != ForkFormat::Device || core.size == 0 {
            return;
        }
        let message = format!(
            "inode {number}: a {:?} of size {} (special files hold no data)",
            core.file_type().unwrap_or(FileType::Unknown),
            core.size
        );
        self.report
            .add(Problem::new("inode", Some(number.0), message));
        if self.repairing {
            self.findings.wrong_size.insert(number.0, 0);
        }
    }

    /// Checks a file's extent list or tree (see `bmap.rs`) and claims its blocks.
    fn check_data_fork(&mut self, number: InodeNumber, raw: &[u8], core: &InodeCore) {
        let fork = &raw[core.data_fork_range(self.geometry.inode_size)];
        let found = match core.data_format {
            ForkFormat::Local | ForkFormat::Device => return,
            ForkFormat::Extents => match fork_extents(fork, core.data_extent_count) {
                Ok(extents) => Some(ForkBlocks {
                    extents,
                    tree_blocks: 0,
                }),
                Err(err) => {
                    let message = err.to_string();
                    self.report
                        .add(Problem::new("inode", Some(number.0), message));
                    None
                }
            },
            ForkFormat::Btree => self.walk_bmap_tree(number, fork, core),
        };
        if self.repairing {
            match &found {
                Some(found) => {
                    // A directory's blocks are never unwritten: such an extent is damage,
                    // dropped when the map is stored anew.
                    let directory = core.file_type() == Some(FileType::Directory);
                    if directory && found.extents.iter().any(|e| e.unwritten) {
                        self.findings.rebuild_map.insert(number.0);
                        self.findings.drop_unwritten.insert(number.0);
                    }
                    let extents = found.extents.clone();
                    self.findings.data_extents.insert(number.0, extents);
                }
                None => {
                    let why = "its extent map cannot be read".to_string();
                    self.findings.broken_inodes.insert(number.0, why);
                }
            }
        }
        if let Some(found) = found {
            if core.file_type() == Some(FileType::Symlink) {
                self.check_symlink_blocks(number, core, &found.extents);
            }
            if core.file_type() == Some(FileType::Directory) {
                self.check_directory_size(number, core, &found.extents);
            }
            self.note_directory_extents(number, &found.extents);
            self.check_extents(number, core, found);
        }
    }

    /// A block directory's size spans its data blocks (cairn-fs reads them up to its size).
    fn check_directory_size(&mut self, number: InodeNumber, core: &InodeCore, extents: &[Extent]) {
        let span = extents
            .iter()
            .filter(|e| e.file_block < INDEX_FILE_BASE)
            .map(Extent::file_end)
            .max()
            .unwrap_or(0);
        let size = span * u64::from(self.geometry.block_size);
        if core.size != size {
            let message = format!(
                "directory {number}: size is {}, its data blocks span {size} bytes",
                core.size
            );
            self.report
                .add(Problem::new("inode", Some(number.0), message));
            if self.repairing {
                self.findings.wrong_size.insert(number.0, size);
            }
        }
    }

    /// The root inode is allocated and a directory.
    pub fn check_root_inode(&mut self) {
        let root = InodeNumber(self.superblock.root_inode);
        let Some((at, offset)) = self.geometry.inode_position(root) else {
            return;
        };
        let Some(block) = self.read_block(at, MetaKind::Inode.name()) else {
            return;
        };
        let raw = &block[offset..offset + self.geometry.inode_size as usize];
        let expected = self.inode_expected(root.0);
        match InodeCore::read(raw, &expected) {
            Ok(core) if core.file_type() == Some(FileType::Directory) => {}
            Ok(_) => {
                let message = format!("root inode {root} is not a directory");
                self.report
                    .add(Problem::new("root directory", Some(root.0), message));
            }
            // The chunk walk has already reported a damaged root inode.
            Err(_) => {}
        }
    }
}

/// An inode whose header verifies and whose only faults are in fields a kept inode can do
/// without (nonzero spare bytes, unknown flags, flags or an extent size hint its type may not
/// carry): its core and a copy with those cleared (repair keeps it, rewriting them).
fn salvage_reserved(
    raw: &[u8],
    expected: &Expected,
    hint_max: u32,
) -> Option<(InodeCore, Vec<u8>)> {
    verify_header(raw, expected).ok()?;
    let mut copy = raw.to_vec();
    clear_inode_reserved(&mut copy, hint_max);
    let core = InodeCore::decode(&copy).ok()?;
    core.check(raw.len() as u32).ok()?;
    Some((core, copy))
}

/// Whether any inode of the chunk `data` (AG `ag`, first AG inode `start`) verifies as the
/// inode of its place.
fn holds_an_inode(data: &[u8], ag: u32, start: u32, checker: &Checker<'_>) -> bool {
    let g = checker.geometry;
    data.chunks_exact(g.inode_size as usize)
        .enumerate()
        .any(|(slot, raw)| {
            let number = (u64::from(ag) << g.ag_inode_bits()) | u64::from(start + slot as u32);
            let expected = checker.inode_expected(number);
            verify_header(raw, &expected).is_ok()
        })
}
