//! Phase 1's salvage of a damaged attr fork: the attributes that still verify are kept, the
//! rest dropped, and what indexes them is stored anew. A short form keeps its entries that
//! are valid. A leaf (the leaf form's one leaf, or any leaf of the index form) that does not
//! verify, or whose block another structure keeps, loses its attributes; one that verifies
//! keeps every attribute but those held twice, those whose remote value lies outside the
//! device or an AG or in blocks another structure keeps, and invalid POSIX ACLs. A remote
//! value whose blocks another file's data also maps gets a copy (as file data does). The
//! index form's leaves are the ones its records and fill leaf name, and, because a damaged
//! index tree hides which leaves it named, every leaf of the inode in blocks nothing claims
//! (a scan of those blocks: none, on a filesystem without leaks). Its index tree is then
//! built anew over the kept leaves, in its old blocks and free space. An attr fork left
//! without attributes is removed.

use std::collections::{BTreeMap, BTreeSet};

use cairn_format::btree_block::BtreeLayout;
use cairn_format::dir::name_hash;
use cairn_format::inode::{FileType, ForkFormat, INODE_CORE_SIZE};
use cairn_format::xattr::{
    Namespace, XattrIndexRecord, XattrIndexRoot, XattrLeaf, XattrValue, decode_shortform_xattrs,
    encode_shortform_xattrs,
};
use cairn_format::{Expected, FsBlock, MetaHeader, MetaKind, OnDisk, verify_header};

use super::derived::index_levels;
use super::fork_map::BlockSource;
use super::inodes::InodeImage;
use super::{RepairError, Repairer};
use crate::check::Checker;
use crate::xattr::system_attr_fault;

/// Block ranges, (start, length).
type Ranges = Vec<(u64, u64)>;

/// Blocks read at once by the scan for unclaimed leaves.
const SCAN_BLOCKS_MAX: u64 = 256;

/// Blocks of an inode's attr fork that phase 1 decided it may not keep as they are.
#[derive(Debug, Default, Clone)]
pub(crate) struct AttrFaults {
    /// Blocks another structure keeps, or outside the device or an AG: a leaf or remote
    /// value there is lost.
    pub lost: Ranges,
    /// Remote value blocks another file's data also maps: the value gets a copy.
    pub shared: Ranges,
}

/// What phase 1 read of a damaged attr fork before changing anything.
#[derive(Debug, Default)]
pub(crate) struct AttrFound {
    /// The leaves that verify, (block, leaf), in block order.
    leaves: Vec<(u64, XattrLeaf)>,
    /// Leaves named by the fork that cannot be kept, with why (their attributes are lost).
    broken: Vec<(u64, &'static str)>,
    /// Leaves found by the scan of unclaimed blocks: their values were claimed by nothing
    /// and must lie in unclaimed blocks too.
    scanned: BTreeSet<u64>,
    /// The old index tree's blocks, for the new tree.
    tree: Vec<u64>,
    /// Blocks nothing claimed (sorted runs).
    unclaimed: Ranges,
}

/// The outcome of a salvage, before anything is written.
#[derive(Debug, Default)]
struct Salvaged {
    /// The leaves that keep attributes: (block, leaf, whether it must be rewritten).
    leaves: Vec<(u64, XattrLeaf, bool)>,
    /// What is lost, one line each.
    dropped: Vec<String>,
    /// Remote values to copy: (from, to, blocks).
    copies: Vec<(u64, u64, u64)>,
    /// The remote values kept so far.
    values: Ranges,
    remote_blocks: u64,
}

fn overlaps(ranges: &[(u64, u64)], start: u64, length: u64) -> bool {
    ranges
        .iter()
        .any(|&(from, len)| from < start + length && start < from + len)
}

fn inside(ranges: &[(u64, u64)], start: u64, length: u64) -> bool {
    ranges
        .iter()
        .any(|&(from, len)| from <= start && start + length <= from + len)
}

/// The runs of blocks no claim of `survey` covers (free space counts as a claim).
fn unclaimed_runs(survey: &Checker<'_>) -> Ranges {
    let mut claims: Vec<(u64, u64)> = survey
        .claims
        .iter()
        .map(|c| (c.start, c.start.saturating_add(c.length)))
        .collect();
    claims.sort_unstable();
    let end = survey.geometry.block_count;
    let mut runs = Vec::new();
    let mut cursor = 0;
    for (start, stop) in claims.into_iter().chain([(end, end)]) {
        let start = start.min(end);
        if start > cursor {
            runs.push((cursor, start - cursor));
        }
        cursor = cursor.max(stop);
    }
    runs
}

fn attr_name(namespace: Namespace, name: &[u8]) -> String {
    let prefix = match namespace {
        Namespace::User => "user",
        Namespace::Trusted => "trusted",
        Namespace::Security => "security",
        Namespace::System => "system",
    };
    format!("{prefix}.{}", String::from_utf8_lossy(name))
}

impl Repairer<'_> {
    /// Reads, before phase 1 writes anything, the leaves of the damaged attr forks of
    /// `inodes` (see the module documentation) and takes the blocks they keep out of
    /// `source`.
    pub(crate) fn find_attr_leaves(
        &self,
        survey: &Checker<'_>,
        inodes: &BTreeMap<u64, AttrFaults>,
        source: &mut BlockSource,
    ) -> Result<BTreeMap<u64, AttrFound>, RepairError> {
        let mut index_form = BTreeSet::new();
        for &inode in inodes.keys() {
            let image = self.read_image(inode)?;
            if image.is_some_and(|i| i.core.attr_format == Some(ForkFormat::Btree)) {
                index_form.insert(inode);
            }
        }
        let unclaimed = if index_form.is_empty() {
            Vec::new()
        } else {
            unclaimed_runs(survey)
        };
        let scanned = self.scan_for_leaves(&unclaimed, &index_form)?;
        let mut found = BTreeMap::new();
        for (&inode, faults) in inodes {
            let mut candidates: BTreeSet<u64> = survey
                .findings
                .attr_leaves
                .get(&inode)
                .map(|l| l.iter().copied().collect())
                .unwrap_or_default();
            let from_scan = scanned.get(&inode).cloned().unwrap_or_default();
            candidates.extend(&from_scan);
            let mut attr = AttrFound {
                scanned: from_scan,
                unclaimed: unclaimed.clone(),
                ..AttrFound::default()
            };
            for leaf in candidates {
                if overlaps(&faults.lost, leaf, 1) {
                    attr.broken
                        .push((leaf, "its block belongs to something else"));
                    continue;
                }
                match self.read_leaf(inode, leaf)? {
                    Some(decoded) => {
                        source.exclude(leaf, 1);
                        for entry in &decoded.entries {
                            if let XattrValue::Remote { block, length } = entry.value {
                                source.exclude(block.0, self.value_blocks(length));
                            }
                        }
                        attr.leaves.push((leaf, decoded));
                    }
                    None => attr.broken.push((leaf, "it does not verify")),
                }
            }
            attr.tree = survey
                .findings
                .attr_tree_blocks
                .get(&inode)
                .map(|t| t.iter().copied().filter(|&b| !overlaps(&faults.lost, b, 1)))
                .into_iter()
                .flatten()
                .collect();
            found.insert(inode, attr);
        }
        Ok(found)
    }

    /// The attr leaves of `owners` in the `unclaimed` runs, by owner.
    fn scan_for_leaves(
        &self,
        unclaimed: &[(u64, u64)],
        owners: &BTreeSet<u64>,
    ) -> Result<BTreeMap<u64, BTreeSet<u64>>, RepairError> {
        let mut found: BTreeMap<u64, BTreeSet<u64>> = BTreeMap::new();
        let block_size = self.geometry.block_size as usize;
        for &(start, length) in unclaimed {
            let mut at = start;
            while at < start + length {
                let count = (start + length - at).min(SCAN_BLOCKS_MAX);
                let raw = self.read_raw(at, count as u32)?;
                for (index, block) in raw.chunks_exact(block_size).enumerate() {
                    let Ok(header) = MetaHeader::decode(block) else {
                        continue;
                    };
                    let leaf = at + index as u64;
                    let ours = MetaKind::from_magic(header.magic) == Some(MetaKind::AttrBlock)
                        && owners.contains(&header.owner)
                        && self.leaf_verifies(header.owner, leaf, block).is_some();
                    if ours {
                        found.entry(header.owner).or_default().insert(leaf);
                    }
                }
                at += count;
            }
        }
        Ok(found)
    }

    /// Leaf block `leaf` of inode `inode`, decoded, if it verifies as one.
    fn read_leaf(&self, inode: u64, leaf: u64) -> Result<Option<XattrLeaf>, RepairError> {
        if leaf >= self.geometry.block_count {
            return Ok(None);
        }
        let raw = self.read_raw(leaf, 1)?;
        Ok(self.leaf_verifies(inode, leaf, &raw))
    }

    fn leaf_verifies(&self, inode: u64, leaf: u64, raw: &[u8]) -> Option<XattrLeaf> {
        let expected = Expected {
            kind: MetaKind::AttrBlock,
            blkno: leaf,
            uuid: self.uuid,
            owner: Some(inode),
        };
        verify_header(raw, &expected).ok()?;
        XattrLeaf::decode_block(raw).ok()
    }

    /// Blocks a remote value of `length` bytes fills.
    fn value_blocks(&self, length: u32) -> u64 {
        u64::from(length.div_ceil(self.geometry.block_size).max(1))
    }

    /// Salvages inode `inode`'s attr fork (see the module documentation); returns the blocks
    /// the fork holds afterwards, or `None` if the mode forbids the loss and the fork is left
    /// as it is. `move_root`: a data fork tree root moves if the fork goes.
    pub(crate) fn salvage_attr_fork(
        &mut self,
        inode: u64,
        faults: &AttrFaults,
        found: AttrFound,
        source: &mut BlockSource,
        move_root: bool,
    ) -> Result<Option<u64>, RepairError> {
        let image = self.image(inode)?;
        let format = image.core.attr_format;
        if format == Some(ForkFormat::Local) {
            return self.salvage_short_form(inode, image, move_root);
        }
        let is_dir = image.core.file_type() == Some(FileType::Directory);
        let salvaged = self.salvage_leaves(faults, &found, is_dir, source)?;
        let loses = !salvaged.dropped.is_empty() || !found.broken.is_empty();
        let keeps = !salvaged.leaves.is_empty() && format == Some(ForkFormat::Btree)
            || salvaged.leaves.len() == 1 && format == Some(ForkFormat::Extents);
        if (loses || !keeps) && !self.may_discard() {
            self.skip(format!("inode {inode}: its attributes are damaged"));
            return Ok(None);
        }
        for (leaf, why) in &found.broken {
            self.action(format!(
                "inode {inode}: attribute leaf {leaf} dropped with its attributes: {why}"
            ));
        }
        for what in &salvaged.dropped {
            self.action(format!("inode {inode}: {what}"));
        }
        if !keeps {
            self.drop_attr_fork(inode, move_root)?;
            return Ok(Some(0));
        }
        self.write_salvaged(inode, &salvaged)?;
        let mut blocks = salvaged.leaves.len() as u64 + salvaged.remote_blocks;
        if format == Some(ForkFormat::Btree) {
            blocks += self.rebuild_attr_index(inode, image, &salvaged, found.tree, source)?;
        }
        Ok(Some(blocks))
    }

    /// Decides what each leaf keeps (reading remote ACL values to check them).
    fn salvage_leaves(
        &self,
        faults: &AttrFaults,
        found: &AttrFound,
        is_dir: bool,
        source: &mut BlockSource,
    ) -> Result<Salvaged, RepairError> {
        let mut salvaged = Salvaged::default();
        let mut seen = BTreeSet::new();
        for (block, leaf) in &found.leaves {
            let scanned = found.scanned.contains(block);
            let mut kept = leaf.clone();
            kept.entries.clear();
            for mut entry in leaf.entries.clone() {
                let shown = attr_name(entry.namespace, &entry.name);
                let fault = if !seen.insert((entry.namespace, entry.name.clone())) {
                    Some("held by another leaf too".to_string())
                } else {
                    let context = (faults, found, scanned, is_dir);
                    self.entry_fault(&mut entry, context, &mut salvaged, source)?
                };
                match fault {
                    Some(why) => salvaged
                        .dropped
                        .push(format!("dropped attribute {shown}: {why}")),
                    None => kept.entries.push(entry),
                }
            }
            let changed = kept.entries != leaf.entries;
            if !kept.entries.is_empty() {
                salvaged.leaves.push((*block, kept, changed));
            }
        }
        Ok(salvaged)
    }

    /// Why `entry` cannot be kept, or `None`; a remote value that shares blocks with another
    /// file's data is pointed at a copy (planned in `salvaged`).
    fn entry_fault(
        &self,
        entry: &mut cairn_format::xattr::XattrLeafEntry,
        (faults, found, scanned, is_dir): (&AttrFaults, &AttrFound, bool, bool),
        salvaged: &mut Salvaged,
        source: &mut BlockSource,
    ) -> Result<Option<String>, RepairError> {
        let system = entry.namespace == Namespace::System;
        let (start, length) = match &entry.value {
            XattrValue::Local(value) => {
                return Ok(system
                    .then(|| system_attr_fault(&entry.name, value, is_dir))
                    .flatten());
            }
            XattrValue::Remote { block, length } => (block.0, *length),
        };
        let count = self.value_blocks(length);
        let g = self.geometry;
        let end = start.saturating_add(count);
        if end > g.block_count || g.ag_of(FsBlock(start)) != g.ag_of(FsBlock(end - 1)) {
            return Ok(Some(
                "its value lies outside the device or an AG".to_string(),
            ));
        }
        if overlaps(&faults.lost, start, count)
            || scanned && !inside(&found.unclaimed, start, count)
        {
            return Ok(Some(
                "its value's blocks belong to something else".to_string(),
            ));
        }
        if system {
            let raw = self.read_raw(start, count as u32)?;
            if let Some(fault) = system_attr_fault(&entry.name, &raw[..length as usize], is_dir) {
                return Ok(Some(fault));
            }
        }
        if overlaps(&faults.shared, start, count) || overlaps(&salvaged.values, start, count) {
            let Some(to) = source.take_run(count) else {
                return Ok(Some("no free blocks for a copy of its value".to_string()));
            };
            salvaged.copies.push((start, to, count));
            entry.value = XattrValue::Remote {
                block: FsBlock(to),
                length,
            };
            salvaged.values.push((to, count));
        } else {
            salvaged.values.push((start, count));
        }
        salvaged.remote_blocks += count;
        Ok(None)
    }

    /// Copies the shared values and rewrites the leaves that changed.
    fn write_salvaged(&mut self, inode: u64, salvaged: &Salvaged) -> Result<(), RepairError> {
        for &(from, to, count) in &salvaged.copies {
            let data = self.read_raw(from, count as u32)?;
            self.write_block_bytes(to, &data)?;
            self.action(format!(
                "inode {inode}: attribute value at blocks {from}..{} is another file's too: \
                 copied to block {to}",
                from + count
            ));
        }
        for (block, leaf, changed) in &salvaged.leaves {
            if !changed {
                continue;
            }
            let mut raw = vec![0u8; self.geometry.block_size as usize];
            leaf.encode_block(&mut raw)?;
            self.write_meta(*block, &mut raw)?;
        }
        Ok(())
    }

    /// Builds inode `inode`'s attribute index anew over the salvaged leaves (in its old tree
    /// blocks, then free space) and points the fork at it; returns the tree's blocks.
    fn rebuild_attr_index(
        &mut self,
        inode: u64,
        mut image: InodeImage,
        salvaged: &Salvaged,
        old_tree: Vec<u64>,
        source: &mut BlockSource,
    ) -> Result<u64, RepairError> {
        let layout = BtreeLayout::for_kind(MetaKind::AttrBtree, self.geometry.block_size)
            .ok_or_else(|| RepairError::Stuck("no attribute index layout".to_string()))?;
        let mut records: Vec<XattrIndexRecord> = Vec::new();
        for (block, leaf, _) in &salvaged.leaves {
            records.extend(leaf.entries.iter().map(|entry| XattrIndexRecord {
                hash: name_hash(&entry.name),
                seq: 0,
                leaf: FsBlock(*block),
            }));
        }
        records.sort_by_key(|r| (r.hash, r.leaf.0));
        for index in 1..records.len() {
            if records[index].hash == records[index - 1].hash {
                records[index].seq = records[index - 1].seq + 1;
            }
        }
        let levels = index_levels(&layout, records.len());
        let needed: u64 = levels.iter().sum();
        let mut blocks: Vec<u64> = old_tree.into_iter().take(needed as usize).collect();
        while (blocks.len() as u64) < needed {
            let block = source.take_one().ok_or_else(|| {
                RepairError::Stuck(format!(
                    "inode {inode}: no free block for its attribute index"
                ))
            })?;
            blocks.push(block);
        }
        let key = |record: &XattrIndexRecord| record.key();
        let root = self.write_file_tree(inode, &layout, (&records, key), &levels, &blocks)?;
        let old_fill = self
            .attr_fork(&mut image)
            .and_then(|fork| XattrIndexRoot::decode(fork).ok().and_then(|r| r.fill));
        let kept: BTreeSet<u64> = salvaged.leaves.iter().map(|l| l.0).collect();
        let root = XattrIndexRoot {
            root: FsBlock(root),
            levels: levels.len() as u32,
            fill: old_fill.filter(|fill| kept.contains(&fill.0)),
        };
        if let Some(fork) = self.attr_fork(&mut image) {
            fork.fill(0);
            root.encode(fork);
        }
        self.write_image(inode, &image)?;
        self.action(format!(
            "inode {inode}: attribute index rebuilt ({} attributes in {} leaves, {} levels)",
            records.len(),
            kept.len(),
            levels.len()
        ));
        Ok(needed)
    }

    /// The attr fork's bytes in `image`'s literal area.
    fn attr_fork<'i>(&self, image: &'i mut InodeImage) -> Option<&'i mut [u8]> {
        let range = image.core.attr_fork_range(self.geometry.inode_size)?;
        image
            .literal
            .get_mut(range.start - INODE_CORE_SIZE..range.end - INODE_CORE_SIZE)
    }

    /// A short-form fork keeps its valid entries (none: the fork goes).
    fn salvage_short_form(
        &mut self,
        inode: u64,
        mut image: InodeImage,
        move_root: bool,
    ) -> Result<Option<u64>, RepairError> {
        let is_dir = image.core.file_type() == Some(FileType::Directory);
        let decoded = self
            .attr_fork(&mut image)
            .map(|fork| decode_shortform_xattrs(fork));
        let Some(Ok(mut attrs)) = decoded else {
            if !self.may_discard() {
                self.skip(format!("inode {inode}: its attributes are damaged"));
                return Ok(None);
            }
            self.drop_attr_fork(inode, move_root)?;
            return Ok(Some(0));
        };
        let before = attrs.len();
        attrs.retain(|a| {
            a.namespace != Namespace::System
                || system_attr_fault(&a.name, &a.value, is_dir).is_none()
        });
        if attrs.len() == before {
            return Ok(Some(0));
        }
        if !self.may_discard() {
            self.skip(format!("inode {inode}: an attribute is not a valid ACL"));
            return Ok(None);
        }
        self.action(format!(
            "inode {inode}: dropped {} attributes that are not valid ACLs",
            before - attrs.len()
        ));
        if attrs.is_empty() {
            self.drop_attr_fork(inode, move_root)?;
            return Ok(Some(0));
        }
        let encoded = encode_shortform_xattrs(&attrs)?;
        if let Some(fork) = self.attr_fork(&mut image)
            && let Some(place) = fork.get_mut(..encoded.len())
        {
            place.copy_from_slice(&encoded);
            fork[encoded.len()..].fill(0);
        }
        self.write_image(inode, &image)?;
        Ok(Some(0))
    }
}
