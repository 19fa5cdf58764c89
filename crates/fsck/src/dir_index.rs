//! The hash index of a block directory: its tree is walked level by level (verifier with the
//! directory as owner, levels, sibling links), every tree block must be mapped in the data
//! fork at file block 2^32 + block, the record hashes must be strictly increasing, and the
//! records must name exactly the directory's entries, each under a key reached by an unbroken
//! linear-probe run from its name's hash.

use std::collections::{BTreeSet, HashMap};

use cairn_format::btree_block::{BtreeHeader, BtreeLayout};
use cairn_format::dir::{DirHashRecord, name_hash};
use cairn_format::limits::BTREE_LEVELS_MAX;
use cairn_format::types::NULL_BLOCK;
use cairn_format::{Expected, Extent, FsBlock, MetaKind, OnDisk, verify_header};

use crate::check::Checker;
use crate::dir_read::{INDEX_FILE_BASE, Listing, entry_name};

/// Bits of the `..index` marker's inode field that hold the tree height.
const LEVELS_SHIFT: u32 = 56;

impl Checker<'_> {
    /// Checks the index of block directory `dir` against its entries and its data fork;
    /// returns the index records if the tree could be walked.
    pub(crate) fn check_dir_index(
        &mut self,
        dir: u64,
        extents: &[Extent],
        listing: &Listing,
    ) -> Option<Vec<DirHashRecord>> {
        let problems = self.report.problems.len();
        let records = self.check_dir_index_inner(dir, extents, listing);
        if self.repairing && self.report.problems.len() != problems {
            self.findings.bad_index.insert(dir);
        }
        records
    }

    fn check_dir_index_inner(
        &mut self,
        dir: u64,
        extents: &[Extent],
        listing: &Listing,
    ) -> Option<Vec<DirHashRecord>> {
        let Some(packed) = listing.index else {
            let message = "data block 0 has no index marker".to_string();
            self.dir_problem(dir, None, message);
            return None;
        };
        // Bits 32..56 hold the filesystem's free-space hint (docs/fs.md), not the root.
        let root = packed & 0xffff_ffff;
        let levels = (packed >> LEVELS_SHIFT) as u32;
        let (records, visited) =
            self.walk_file_tree(MetaKind::DirBtree, dir, (root, levels), Self::dir_problem)?;
        let mut mapped = BTreeSet::new();
        for extent in extents.iter().filter(|e| e.file_block >= INDEX_FILE_BASE) {
            if extent.file_block - INDEX_FILE_BASE != extent.fs_block.0 {
                let message = format!(
                    "index extent at file block {} is misplaced",
                    extent.file_block
                );
                self.dir_problem(dir, None, message);
            }
            mapped.extend((0..u64::from(extent.length)).map(|i| extent.fs_block.0 + i));
        }
        if mapped != visited {
            let message = format!(
                "the data fork maps {} index blocks, the index tree has {}",
                mapped.len(),
                visited.len()
            );
            self.dir_problem(dir, None, message);
        }
        self.check_index_records(dir, &records, listing);
        Some(records)
    }

    /// Reports names a directory holds twice; repair keeps, of each, the entry the index
    /// files under that name's hash at its address (the other is damage), else the first,
    /// and removes the others.
    pub(crate) fn check_duplicate_names(
        &mut self,
        dir: u64,
        listing: &mut Listing,
        records: Option<&[DirHashRecord]>,
    ) {
        let mut by_name: HashMap<&[u8], Vec<usize>> = HashMap::new();
        for (index, entry) in listing.entries.iter().enumerate() {
            by_name.entry(&entry.name).or_default().push(index);
        }
        let indexed: BTreeSet<(u32, u32)> = records
            .unwrap_or_default()
            .iter()
            .map(|r| (r.address, r.hash))
            .collect();
        let mut dropped = Vec::new();
        for (_, places) in by_name.into_iter().filter(|(_, p)| p.len() > 1) {
            let filed = |&&index: &&usize| {
                let entry = &listing.entries[index];
                let hash = name_hash(&entry.name);
                indexed
                    .range((entry.address, hash)..)
                    .next()
                    .is_some_and(|&(a, key)| {
                        a == entry.address && key.wrapping_sub(hash) < places.len() as u32 + 64
                    })
            };
            let keep = places.iter().find(filed).copied().unwrap_or(places[0]);
            dropped.extend(places.into_iter().filter(|&index| index != keep));
        }
        dropped.sort_unstable();
        for index in dropped.into_iter().rev() {
            let message = format!(
                "name '{}' is held by more than one entry",
                entry_name(&listing.entries[index])
            );
            self.dir_problem(dir, None, message);
            if self.repairing {
                let entry = listing.entries.remove(index);
                listing.drop.push((entry, "its name is another entry's"));
            }
        }
    }

    fn check_index_records(&mut self, dir: u64, records: &[DirHashRecord], listing: &Listing) {
        if records.windows(2).any(|pair| pair[0].hash >= pair[1].hash) {
            let message = "index records are not in strictly increasing hash order".to_string();
            self.dir_problem(dir, None, message);
        }
        let keys: BTreeSet<u32> = records.iter().map(|r| r.hash).collect();
        let mut by_address: HashMap<u32, _> =
            listing.entries.iter().map(|e| (e.address, e)).collect();
        for record in records {
            let Some(entry) = by_address.remove(&record.address) else {
                let message = format!(
                    "index record {:#x} points at address {:#x}, where no entry is",
                    record.hash, record.address
                );
                self.dir_problem(dir, None, message);
                continue;
            };
            let hash = name_hash(&entry.name);
            let run = record.hash.wrapping_sub(hash);
            let unbroken = (run as usize) < records.len()
                && (0..run).all(|step| keys.contains(&hash.wrapping_add(step)));
            if !unbroken {
                let message = format!(
                    "entry '{}' is indexed under {:#x}, unreachable from its hash {hash:#x}",
                    entry_name(entry),
                    record.hash
                );
                self.dir_problem(dir, None, message);
            }
        }
        for entry in by_address.into_values() {
            let message = format!(
                "entry '{}' is missing from the hash index",
                entry_name(entry)
            );
            self.dir_problem(dir, None, message);
        }
    }

    /// Walks a file-owned tree of `kind` rooted at `(root, levels)` (a directory's hash index,
    /// an inode's attribute index): verifier with `owner`, levels, sibling links; returns its
    /// records in order and the blocks it is made of (`None` when it cannot be walked). A block
    /// that fails its verifier is reported by its structure; other problems go to `problem`.
    pub(crate) fn walk_file_tree<R: OnDisk>(
        &mut self,
        kind: MetaKind,
        owner: u64,
        (root, levels): (u64, u32),
        problem: impl Fn(&mut Self, u64, Option<u64>, String) + Copy,
    ) -> Option<(Vec<R>, BTreeSet<u64>)> {
        let layout = BtreeLayout::for_kind(kind, self.geometry.block_size)?;
        if levels == 0 || levels > BTREE_LEVELS_MAX {
            problem(self, owner, None, format!("index records {levels} levels"));
            return None;
        }
        let mut visited = BTreeSet::new();
        let mut records = Vec::new();
        let mut pending = vec![root];
        for level in (0..levels as u16).rev() {
            let mut next = Vec::new();
            for (index, &block) in pending.iter().enumerate() {
                if !visited.insert(block) {
                    problem(
                        self,
                        owner,
                        Some(block),
                        "index block reached twice".to_string(),
                    );
                    return None;
                }
                let left = index.checked_sub(1).map_or(NULL_BLOCK, |i| pending[i]);
                let right = pending.get(index + 1).copied().unwrap_or(NULL_BLOCK);
                let (header, raw) = self.file_tree_block(&layout, owner, block, problem)?;
                let found = (header.level, header.left, header.right);
                if found != (level, left, right) {
                    let message = format!(
                        "index block level/siblings are {found:?}, expected {:?}",
                        (level, left, right)
                    );
                    problem(self, owner, Some(block), message);
                }
                for slot in 0..usize::from(header.record_count) {
                    if header.level == 0 {
                        let raw_record = layout.record(&raw, slot)?;
                        records.push(R::decode(raw_record).ok()?);
                    } else {
                        next.push(layout.pointer(&raw, slot)?);
                    }
                }
            }
            pending = next;
        }
        Some((records, visited))
    }

    fn file_tree_block(
        &mut self,
        layout: &BtreeLayout,
        owner: u64,
        at: u64,
        problem: impl Fn(&mut Self, u64, Option<u64>, String),
    ) -> Option<(BtreeHeader, Vec<u8>)> {
        if at >= self.geometry.block_count {
            problem(
                self,
                owner,
                None,
                format!("index pointer {at} is past the device"),
            );
            return None;
        }
        let block = self.read_block(FsBlock(at), layout.kind.name())?;
        let expected = Expected {
            kind: layout.kind,
            blkno: at,
            uuid: self.uuid,
            owner: Some(owner),
        };
        let valid = layout.pointer_bounds(&self.geometry, owner);
        let header = verify_header(&block, &expected)
            .and_then(|_| BtreeHeader::decode(&block))
            .and_then(|h| h.check(layout, &block, valid).map(|()| h));
        match header {
            Ok(header) => Some((header, block)),
            Err(err) => {
                self.report
                    .add(crate::report::Problem::from_format(at, &err));
                None
            }
        }
    }
}
