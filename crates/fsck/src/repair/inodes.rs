//! Phase 1 of repair: inodes. Inodes whose core cannot be read are cleared. Every block an
//! inode's forks claim must lie inside the device and inside one AG and be claimed by
//! nothing else: static metadata wins, then inodes' tree and xattr blocks (the lowest inode
//! first), then file data. A data extent that overlaps static metadata or another inode's
//! tree or xattr blocks is dropped from its file; one that overlaps another file's data is
//! given a copy of those blocks in space nobody claims (as e2fsck clones multiply-claimed
//! blocks), so neither file loses what it reads. A losing xattr block drops the attr fork.
//! An extent map that was damaged (a tree block that does not verify, keys out of order,
//! siblings or counts that disagree) or lost extents is rebuilt from the extents that
//! verified (overlapping ones dropped) and stored inline or as a new tree. Block counts are
//! then set to what the forks keep. A symlink target block whose header is damaged but
//! whose piece of the target is intact gets its header rewritten; a symlink whose target
//! cannot be read is cleared.

use std::collections::BTreeMap;

use cairn_format::header::stamp;
use cairn_format::inode::{
    BmapRoot, ForkFormat, INODE_CORE_SIZE, InodeCore, clear_inode_reserved, extent_size_hint_max,
    free_inode_core,
};
use cairn_format::symlink::SymlinkHeader;
use cairn_format::{Extent, FsBlock, InodeNumber, Lsn, MetaHeader, MetaKind, OnDisk};

use super::attrs::{AttrFaults, AttrFound};
use super::fork_map::BlockSource;
use super::{RepairError, Repairer, space};
use crate::check::{Checker, Claim};

/// What repair changes in one inode.
#[derive(Debug, Default, Clone)]
struct InodeFix {
    /// Data extents (fs block, length) to drop, with why.
    drop_extents: Vec<(u64, u32, String)>,
    /// Data extents (fs block, length) whose blocks another file owns: given a copy.
    clone_extents: Vec<(u64, u32)>,
    /// The extent map must be stored anew (a tree block was lost or the map is damaged).
    rebuild_map: bool,
    /// Tree blocks that belong to something else (not reused by the rebuild).
    lost_tree_blocks: Vec<u64>,
    /// Unwritten extents are dropped (a directory's).
    drop_unwritten: bool,
    /// The map keeps only file blocks below this (a symlink's blocks past its target).
    keep_below: Option<u64>,
    /// The attr fork is damaged or claims blocks it may not keep: it is salvaged.
    attr: Option<AttrFaults>,
}

/// Phase 1's decisions, made from one survey.
#[derive(Debug, Default)]
pub(crate) struct InodePlan {
    clear: BTreeMap<u64, String>,
    fixes: BTreeMap<u64, InodeFix>,
    /// The data extents of the inodes in `fixes`.
    extents: BTreeMap<u64, Vec<Extent>>,
    /// The extent tree blocks and attr fork blocks of the inodes in `fixes`.
    tree_blocks: BTreeMap<u64, Vec<u64>>,
    attr_blocks: BTreeMap<u64, u64>,
    /// Symlink blocks (block, symlink) whose header is rewritten, their target kept.
    restamp_symlinks: Vec<(u64, u64)>,
    /// Inodes whose reserved fields are cleared (`clear_inode_reserved`).
    restamp_inodes: Vec<u64>,
    /// Pieces (block, offset, length) whose LSN is set to `lsn_limit`.
    future_lsns: Vec<(u64, usize, usize)>,
    lsn_limit: Lsn,
    /// Space for copies of shared blocks and new extent trees.
    source: BlockSource,
    /// What was read of the attr forks to salvage.
    attr_found: BTreeMap<u64, AttrFound>,
}

/// Whether a claim is unverifiable data (file data or a remote xattr value): nothing in the
/// blocks says whose they are.
fn is_data(claim: &Claim) -> bool {
    claim.inode.is_some() && matches!(claim.owner, "file data" | "xattr value")
}

/// Who may keep contested blocks, first to last: static metadata, then inodes' extent tree
/// and xattr leaf blocks (lowest inode first), then data (lowest inode first).
fn priority(claim: &Claim) -> (u8, Option<u64>, u64) {
    let rank = match claim.inode {
        None => 0,
        Some(_) if !is_data(claim) => 1,
        Some(_) => 2,
    };
    (rank, claim.inode, claim.start)
}

fn owner_text(claim: &Claim) -> String {
    match claim.inode {
        Some(inode) => format!("{} of inode {inode}", claim.owner),
        None => claim.owner.to_string(),
    }
}

/// What an inode keeps of its forks, as phase 1 found them.
struct KeptForks {
    extents: Vec<Extent>,
    /// Its extent tree blocks that belong to it alone (reused by a rebuilt tree).
    tree: Vec<u64>,
    attr_blocks: u64,
    /// What was read of its attr fork, when that is salvaged.
    attr: AttrFound,
}

impl InodePlan {
    /// Records that inode `inode` may not keep `claim` (`why`; `shared`: another file's data
    /// holds the blocks, so a copy resolves it).
    fn fault(&mut self, inode: u64, claim: &Claim, why: String, shared: bool) {
        let fix = self.fixes.entry(inode).or_default();
        match claim.owner {
            "file data" if shared => fix.clone_extents.push((claim.start, claim.length as u32)),
            "file data" => fix
                .drop_extents
                .push((claim.start, claim.length as u32, why)),
            "file extent tree" => {
                fix.rebuild_map = true;
                fix.lost_tree_blocks.push(claim.start);
            }
            // An attr fork's leaves, index tree and remote values.
            owner => {
                let faults = fix.attr.get_or_insert_default();
                let range = (claim.start, claim.length);
                if owner == "xattr value" && shared {
                    faults.shared.push(range);
                } else {
                    faults.lost.push(range);
                }
            }
        }
    }

    /// Decides a run of overlapping claims: in priority order, each keeps its blocks unless
    /// one kept earlier overlaps them, or all that overlap them and it are `shareable`
    /// (regular files' data on a reflink filesystem: the refcount tree is rebuilt to count
    /// them).
    fn resolve(&mut self, run: &[&Claim], shareable: &dyn Fn(&Claim) -> bool) {
        let mut ordered = run.to_vec();
        ordered.sort_by_key(|c| priority(c));
        let mut kept: Vec<&Claim> = Vec::new();
        for claim in ordered {
            let end = claim.start + claim.length;
            let taken: Vec<&&Claim> = kept
                .iter()
                .filter(|k| k.start < end && claim.start < k.start + k.length)
                .collect();
            let (Some(first), Some(inode)) = (taken.first(), claim.inode) else {
                kept.push(claim);
                continue;
            };
            if shareable(claim) && taken.iter().all(|k| shareable(k)) {
                kept.push(claim);
                continue;
            }
            let shared = taken.iter().all(|k| is_data(k));
            let why = format!("its blocks belong to {}", owner_text(first));
            self.fault(inode, claim, why, shared);
        }
    }
}

impl Repairer<'_> {
    /// Why an inode's `claim` cannot be honoured wherever it lies: outside the device or
    /// across an AG boundary.
    fn invalid_claim(&self, claim: &Claim) -> Option<&'static str> {
        let g = self.geometry;
        let end = claim.start.saturating_add(claim.length);
        if claim.length == 0 || end > g.block_count {
            return Some("it ends past the end of the device");
        }
        (g.ag_of(FsBlock(claim.start)) != g.ag_of(FsBlock(end - 1)))
            .then_some("it crosses an AG boundary")
    }

    pub(crate) fn plan_inode_repairs(
        &self,
        survey: &mut Checker<'_>,
    ) -> Result<InodePlan, RepairError> {
        let findings = &mut survey.findings;
        let mut plan = InodePlan {
            clear: std::mem::take(&mut findings.broken_inodes),
            restamp_symlinks: std::mem::take(&mut findings.restamp_symlink_blocks),
            restamp_inodes: std::mem::take(&mut findings.restamp_inodes),
            future_lsns: std::mem::take(&mut findings.future_lsns),
            lsn_limit: survey.lsn_limit,
            ..InodePlan::default()
        };
        let cleared = std::mem::take(&mut plan.clear);
        let live =
            |c: &&Claim| !space::is_rebuilt(c) && c.inode.is_none_or(|i| !cleared.contains_key(&i));
        // Claims are sorted by start: only runs of overlapping ones need a decision.
        let mut valid: Vec<&Claim> = Vec::new();
        for claim in survey.claims.iter().filter(live) {
            match claim.inode.zip(self.invalid_claim(claim)) {
                Some((inode, why)) => plan.fault(inode, claim, why.to_string(), false),
                None => valid.push(claim),
            }
        }
        let mut first = 0;
        while first < valid.len() {
            let mut end = valid[first].start + valid[first].length;
            let mut last = first + 1;
            while last < valid.len() && valid[last].start < end {
                end = end.max(valid[last].start + valid[last].length);
                last += 1;
            }
            if last - first > 1 {
                let reflink = survey.superblock.has_reflink();
                let shareable = |claim: &Claim| reflink && survey.shareable(claim);
                plan.resolve(&valid[first..last], &shareable);
            }
            first = last;
        }
        plan.clear = cleared;
        for &inode in &survey.findings.broken_attr {
            if !plan.clear.contains_key(&inode) {
                let fix = plan.fixes.entry(inode).or_default();
                fix.attr.get_or_insert_default();
            }
        }
        for &inode in &survey.findings.rebuild_map {
            if !plan.clear.contains_key(&inode) {
                let fix = plan.fixes.entry(inode).or_default();
                fix.rebuild_map = true;
                fix.drop_unwritten = survey.findings.drop_unwritten.contains(&inode);
                fix.keep_below = survey.findings.trim_map.get(&inode).copied();
            }
        }
        if !plan.fixes.is_empty() {
            plan.source = BlockSource::from_survey(survey);
        }
        let attr_faults: BTreeMap<u64, AttrFaults> = plan
            .fixes
            .iter()
            .filter_map(|(&inode, fix)| fix.attr.clone().map(|faults| (inode, faults)))
            .collect();
        if !attr_faults.is_empty() {
            // Read before anything is written: a leaf may lie in blocks a copy could take.
            plan.attr_found = self.find_attr_leaves(survey, &attr_faults, &mut plan.source)?;
        }
        let findings = &mut survey.findings;
        for &inode in plan.fixes.keys() {
            if let Some(extents) = findings.data_extents.remove(&inode) {
                plan.extents.insert(inode, extents);
            }
            if let Some(blocks) = findings.tree_blocks.get(&inode) {
                plan.tree_blocks.insert(inode, blocks.clone());
            }
            if let Some(&blocks) = findings.attr_blocks.get(&inode) {
                plan.attr_blocks.insert(inode, blocks);
            }
        }
        Ok(plan)
    }

    pub(crate) fn apply_inode_repairs(&mut self, mut plan: InodePlan) -> Result<(), RepairError> {
        for &(at, offset, length) in &plan.future_lsns {
            let mut block = self.read_raw(at, 1)?;
            if let Some(piece) = block.get_mut(offset..offset + length) {
                stamp(piece, Some(plan.lsn_limit));
                self.write_block_bytes(at, &block)?;
                self.action(format!(
                    "block {at}: LSN past the log set to the log's newest"
                ));
            }
        }
        for &inode in &plan.restamp_inodes {
            let (at, offset, mut block) = self.read_inode(inode)?;
            let raw = &mut block[offset..offset + self.geometry.inode_size as usize];
            let hint_max = extent_size_hint_max(self.geometry.ag_blocks);
            let cleared = clear_inode_reserved(raw, hint_max).join(", ");
            stamp_inode(raw);
            self.write_block_bytes(at, &block)?;
            self.action(format!("inode {inode}: {cleared} cleared"));
        }
        for &(at, inode) in &plan.restamp_symlinks {
            self.restamp_symlink_block(at, inode)?;
        }
        for (inode, why) in &plan.clear {
            if self.may_discard() {
                self.clear_inode(*inode)?;
                self.action(format!("inode {inode}: cleared, {why}"));
            } else {
                self.skip(format!("inode {inode}: {why}"));
            }
        }
        let fixes = std::mem::take(&mut plan.fixes);
        for (&inode, fix) in &fixes {
            let extents = plan.extents.remove(&inode).unwrap_or_default();
            let mut tree = plan.tree_blocks.remove(&inode).unwrap_or_default();
            tree.retain(|b| !fix.lost_tree_blocks.contains(b));
            let attr_blocks = plan.attr_blocks.get(&inode).copied().unwrap_or(0);
            let kept = KeptForks {
                extents,
                tree,
                attr_blocks,
                attr: plan.attr_found.remove(&inode).unwrap_or_default(),
            };
            self.fix_inode(inode, fix, kept, &mut plan.source)?;
        }
        Ok(())
    }

    /// Rewrites the header of symlink `inode`'s target block `at`, keeping its piece.
    fn restamp_symlink_block(&mut self, at: u64, inode: u64) -> Result<(), RepairError> {
        let mut block = self.read_raw(at, 1)?;
        let mut piece = SymlinkHeader::decode(&block)?;
        piece.header = MetaHeader::new(MetaKind::SymlinkBlock, at, self.uuid, inode);
        piece.encode(&mut block);
        self.write_meta(at, &mut block)?;
        self.action(format!("symlink {inode}: target block {at} salvaged"));
        Ok(())
    }

    /// Reads inode `inode`: the block holding it, the offset within and the raw inode.
    pub(crate) fn read_inode(&self, inode: u64) -> Result<(u64, usize, Vec<u8>), RepairError> {
        let (at, offset) = self
            .geometry
            .inode_position(InodeNumber(inode))
            .ok_or_else(|| RepairError::Stuck(format!("inode {inode} is not a valid number")))?;
        let block = self.read_raw(at.0, 1)?;
        Ok((at.0, offset, block))
    }

    /// Writes `core` and `literal` (the bytes after the core) as inode `inode`.
    pub(crate) fn write_inode(
        &mut self,
        inode: u64,
        core: &InodeCore,
        literal: &[u8],
    ) -> Result<(), RepairError> {
        let (at, offset, mut block) = self.read_inode(inode)?;
        let size = self.geometry.inode_size as usize;
        let raw = &mut block[offset..offset + size];
        core.encode(&mut raw[..INODE_CORE_SIZE]);
        raw[INODE_CORE_SIZE..].copy_from_slice(literal);
        stamp_inode(raw);
        self.write_block_bytes(at, &block)
    }

    /// Makes inode `inode` free, as a new chunk's inodes are.
    pub(crate) fn clear_inode(&mut self, inode: u64) -> Result<(), RepairError> {
        let header = MetaHeader::new(MetaKind::Inode, inode, self.uuid, inode);
        let core = free_inode_core(header, 0);
        let literal = vec![0u8; self.geometry.inode_size as usize - INODE_CORE_SIZE];
        self.write_inode(inode, &core, &literal)
    }

    /// Makes inode `inode`'s forks claim only what `fix` leaves them (its block count, if
    /// only the attr fork went, is set by the next survey's count repair).
    fn fix_inode(
        &mut self,
        inode: u64,
        fix: &InodeFix,
        kept: KeptForks,
        source: &mut BlockSource,
    ) -> Result<(), RepairError> {
        let remap =
            !fix.drop_extents.is_empty() || !fix.clone_extents.is_empty() || fix.rebuild_map;
        let discards = !fix.drop_extents.is_empty() || fix.rebuild_map;
        if discards && !self.may_discard() {
            self.skip(format!(
                "inode {inode}: its forks claim blocks they may not"
            ));
            return Ok(());
        }
        let salvaged = match &fix.attr {
            Some(faults) => self.salvage_attr_fork(inode, faults, kept.attr, source, !remap)?,
            None => None,
        };
        // A fork left as it is keeps its blocks.
        let attr_blocks = salvaged.unwrap_or(kept.attr_blocks);
        if !remap {
            return Ok(());
        }
        let extents = self.remap_extents(inode, fix, kept.extents, source)?;
        source.reuse = kept.tree;
        let stored = self.store_data_map(inode, &extents, attr_blocks, source);
        source.reuse.clear();
        match stored {
            Ok(_) => self.action(format!(
                "inode {inode}: extent map rebuilt ({} extents)",
                extents.len()
            )),
            Err(RepairError::Stuck(why)) => {
                self.clear_inode(inode)?;
                self.action(format!("inode {inode}: cleared, {why}"));
            }
            Err(err) => return Err(err),
        }
        Ok(())
    }

    /// The extents inode `inode` keeps: dropped ones left out, shared ones copied, sorted
    /// by file block with any that overlap an earlier one dropped.
    fn remap_extents(
        &mut self,
        inode: u64,
        fix: &InodeFix,
        mut extents: Vec<Extent>,
        source: &mut BlockSource,
    ) -> Result<Vec<Extent>, RepairError> {
        extents.sort_by_key(|e| (e.file_block, e.fs_block.0));
        if let Some(end) = fix.keep_below {
            extents = clip_extents(extents, end)?;
        }
        let mut kept: Vec<Extent> = Vec::with_capacity(extents.len());
        for extent in extents {
            let key = (extent.fs_block.0, extent.length);
            if let Some((_, _, why)) = fix.drop_extents.iter().find(|d| (d.0, d.1) == key) {
                let (start, length) = key;
                self.action(format!(
                    "inode {inode}: dropped extent at block {start} ({length} blocks): {why}"
                ));
                continue;
            }
            if fix.drop_unwritten && extent.unwritten {
                self.action(format!(
                    "inode {inode}: dropped unwritten extent at file block {}",
                    extent.file_block
                ));
                continue;
            }
            if kept
                .last()
                .is_some_and(|last| last.file_end() > extent.file_block)
            {
                self.action(format!(
                    "inode {inode}: dropped extent at file block {} (overlaps another)",
                    extent.file_block
                ));
                continue;
            }
            if fix.clone_extents.contains(&key) {
                kept.extend(self.clone_extent(inode, &extent, source)?);
                continue;
            }
            kept.push(extent);
        }
        Ok(kept)
    }

    /// Copies the blocks of `extent` (which another file also maps) into unclaimed space;
    /// returns the extents mapping the copy (none if there is no room: the range is dropped).
    fn clone_extent(
        &mut self,
        inode: u64,
        extent: &Extent,
        source: &mut BlockSource,
    ) -> Result<Vec<Extent>, RepairError> {
        let runs = source.take_blocks(u64::from(extent.length));
        let mut copies = Vec::new();
        let mut file_block = extent.file_block;
        let mut from = extent.fs_block.0;
        for (start, length) in runs {
            let data = self.read_raw(from, length as u32)?;
            self.write_block_bytes(start, &data)?;
            copies.push(Extent::new(
                file_block,
                FsBlock(start),
                length as u32,
                extent.unwritten,
            )?);
            file_block += length;
            from += length;
        }
        let copied = file_block - extent.file_block;
        self.action(format!(
            "inode {inode}: blocks {}..{} are another file's too: copied {copied} of {} blocks",
            extent.fs_block.0,
            extent.fs_end().0,
            extent.length
        ));
        Ok(copies)
    }

    /// Removes the attr fork of inode `inode`: the data fork takes the whole literal area
    /// (a tree root moves with its end when `move_root`; else the map is stored anew after).
    pub(super) fn drop_attr_fork(
        &mut self,
        inode: u64,
        move_root: bool,
    ) -> Result<(), RepairError> {
        let Some(InodeImage {
            mut core,
            mut literal,
        }) = self.read_image(inode)?
        else {
            return Ok(());
        };
        let inode_size = self.geometry.inode_size;
        let old = core.data_fork_range(inode_size);
        let shift = |r: std::ops::Range<usize>| r.start - INODE_CORE_SIZE..r.end - INODE_CORE_SIZE;
        let root = (move_root && core.data_format == ForkFormat::Btree)
            .then(|| BmapRoot::decode(&literal[shift(old.clone())]).ok())
            .flatten();
        literal[shift(old.end..inode_size as usize)].fill(0);
        core.attr_format = None;
        core.attr_offset = 0;
        core.attr_extent_count = 0;
        if let Some(root) = root {
            let new = shift(core.data_fork_range(inode_size));
            root.encode(&mut literal[new])?;
        }
        self.write_inode(inode, &core, &literal)?;
        self.action(format!(
            "inode {inode}: dropped its damaged extended attributes"
        ));
        Ok(())
    }
}

/// `extents` without the file blocks from `end` on (one that crosses `end` is shortened).
fn clip_extents(extents: Vec<Extent>, end: u64) -> Result<Vec<Extent>, RepairError> {
    let mut clipped = Vec::with_capacity(extents.len());
    for extent in extents.into_iter().filter(|e| e.file_block < end) {
        let length = extent.length.min((end - extent.file_block) as u32);
        clipped.push(Extent::new(
            extent.file_block,
            extent.fs_block,
            length,
            extent.unwritten,
        )?);
    }
    Ok(clipped)
}

/// An inode as repair edits it: the core, and the literal area after it.
pub(crate) struct InodeImage {
    pub core: InodeCore,
    pub literal: Vec<u8>,
}

impl InodeImage {
    /// The data fork's bytes in the literal area.
    pub(crate) fn data_fork_mut(&mut self, inode_size: u32) -> &mut [u8] {
        let range = self.core.data_fork_range(inode_size);
        &mut self.literal[range.start - INODE_CORE_SIZE..range.end - INODE_CORE_SIZE]
    }
}

impl Repairer<'_> {
    /// Inode `inode`'s core and literal area; `None` if its core does not decode.
    pub(crate) fn read_image(&self, inode: u64) -> Result<Option<InodeImage>, RepairError> {
        let (_, offset, block) = self.read_inode(inode)?;
        let raw = &block[offset..offset + self.geometry.inode_size as usize];
        Ok(InodeCore::decode(raw).ok().map(|core| InodeImage {
            core,
            literal: raw[INODE_CORE_SIZE..].to_vec(),
        }))
    }

    /// Inode `inode`'s image, or the error that its core does not decode.
    pub(crate) fn image(&self, inode: u64) -> Result<InodeImage, RepairError> {
        self.read_image(inode)?
            .ok_or_else(|| RepairError::Stuck(format!("inode {inode}: its core does not decode")))
    }

    /// Writes `image` as inode `inode`.
    pub(crate) fn write_image(
        &mut self,
        inode: u64,
        image: &InodeImage,
    ) -> Result<(), RepairError> {
        self.write_inode(inode, &image.core, &image.literal)
    }
}

/// Recomputes an inode's CRC (its LSN is kept).
pub(crate) fn stamp_inode(raw: &mut [u8]) {
    cairn_format::header::stamp(raw, None);
}
