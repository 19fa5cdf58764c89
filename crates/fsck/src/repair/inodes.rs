//! Phase 1 of repair: inodes. Inodes whose core or extent tree cannot be read are cleared.
//! Every block an inode's forks claim must lie inside the device and inside one AG and be
//! claimed by nothing else: static metadata wins, then the lowest inode; a losing data extent
//! is dropped from its file (an extent tree that loses a block, or cannot hold the remaining
//! extents inline, clears the inode), a losing xattr block drops the attr fork. Block counts
//! are then set to what the forks keep. A symlink target block whose header is damaged but
//! whose piece of the target is intact gets its header rewritten; a symlink whose target
//! cannot be read is cleared.

use std::collections::{BTreeMap, BTreeSet};

use cairn_format::inode::{
    BmapRoot, ForkFormat, INODE_CORE_SIZE, InodeCore, free_inode_core, put_fork_extents,
};
use cairn_format::symlink::SymlinkHeader;
use cairn_format::{Extent, FsBlock, InodeNumber, MetaHeader, MetaKind, OnDisk};

use super::{RepairError, Repairer, space};
use crate::check::{Checker, Claim};

/// What repair changes in one inode.
#[derive(Debug, Default, Clone)]
struct InodeFix {
    /// Data extents (fs block, length) to drop, with why.
    drop_extents: Vec<(u64, u32, String)>,
    /// An extent tree block was lost: the extents must go inline.
    tree_lost: bool,
    drop_attr: bool,
    /// Blocks the kept forks hold: data, tree, attr.
    data_blocks: u64,
    tree_blocks: u64,
    attr_blocks: u64,
}

/// Phase 1's decisions, made from one survey.
#[derive(Debug, Default)]
pub(crate) struct InodePlan {
    clear: BTreeMap<u64, String>,
    fixes: BTreeMap<u64, InodeFix>,
    extents: BTreeMap<u64, Vec<Extent>>,
    block_counts: BTreeMap<u64, u64>,
    /// Symlink blocks (block, symlink) whose header is rewritten, their target kept.
    restamp_symlinks: Vec<(u64, u64)>,
}

/// A block range already owned, and by whom.
struct Owned {
    end: u64,
    owner: String,
}

fn owner_text(claim: &Claim) -> String {
    match claim.inode {
        Some(inode) => format!("{} of inode {inode}", claim.owner),
        None => claim.owner.to_string(),
    }
}

impl Repairer<'_> {
    /// Why `claim` cannot be honoured, if it cannot.
    fn claim_fault(&self, claim: &Claim, owned: &BTreeMap<u64, Owned>) -> Option<String> {
        let g = self.geometry;
        let end = claim.start.saturating_add(claim.length);
        if claim.length == 0 || end > g.block_count {
            return Some("it ends past the end of the device".to_string());
        }
        if g.ag_of(FsBlock(claim.start)) != g.ag_of(FsBlock(end - 1)) {
            return Some("it crosses an AG boundary".to_string());
        }
        let (_, before) = owned.range(..end).next_back()?;
        (before.end > claim.start).then(|| format!("its blocks belong to {}", before.owner))
    }

    pub(crate) fn plan_inode_repairs(&self, survey: &Checker<'_>) -> InodePlan {
        let findings = &survey.findings;
        let mut plan = InodePlan {
            clear: findings.broken_inodes.clone(),
            extents: findings.data_extents.clone(),
            restamp_symlinks: findings.restamp_symlink_blocks.clone(),
            ..InodePlan::default()
        };
        let mut owned: BTreeMap<u64, Owned> = BTreeMap::new();
        for claim in survey.claims.iter().filter(|c| c.inode.is_none()) {
            if !space::is_rebuilt(claim) {
                let end = claim.start.saturating_add(claim.length);
                let owner = owner_text(claim);
                owned.insert(claim.start, Owned { end, owner });
            }
        }
        let mut by_inode: Vec<&Claim> = survey
            .claims
            .iter()
            .filter(|c| c.inode.is_some_and(|i| !plan.clear.contains_key(&i)))
            .collect();
        by_inode.sort_by_key(|c| (c.inode, c.start));
        for claim in by_inode {
            let Some(inode) = claim.inode else { continue };
            let fix = plan.fixes.entry(inode).or_default();
            let fault = self.claim_fault(claim, &owned);
            match (fault, claim.owner) {
                (None, owner) => {
                    let end = claim.start + claim.length;
                    owned.insert(
                        claim.start,
                        Owned {
                            end,
                            owner: owner_text(claim),
                        },
                    );
                    match owner {
                        "file data" => fix.data_blocks += claim.length,
                        "file extent tree" => fix.tree_blocks += claim.length,
                        _ => fix.attr_blocks += claim.length,
                    }
                }
                (Some(why), "file data") => {
                    fix.drop_extents
                        .push((claim.start, claim.length as u32, why));
                }
                (Some(_), "file extent tree") => fix.tree_lost = true,
                (Some(_), _) => fix.drop_attr = true,
            }
        }
        for &inode in &findings.broken_attr {
            if !plan.clear.contains_key(&inode) {
                plan.fixes.entry(inode).or_default().drop_attr = true;
            }
        }
        for (&inode, seen) in &survey.inodes {
            plan.block_counts.insert(inode, seen.block_count);
        }
        plan
    }

    pub(crate) fn apply_inode_repairs(&mut self, plan: InodePlan) -> Result<(), RepairError> {
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
        for (&inode, fix) in &plan.fixes {
            let recorded = plan.block_counts.get(&inode).copied();
            let extents = plan.extents.get(&inode).map_or(&[][..], Vec::as_slice);
            self.fix_inode(inode, fix, extents, recorded)?;
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

    pub(crate) fn write_block_bytes(&mut self, at: u64, block: &[u8]) -> Result<(), RepairError> {
        let mut buf = cairn_blockdev::AlignedBuf::zeroed(block.len());
        buf.copy_from_slice(block);
        self.device
            .write_at(self.geometry.byte_offset(FsBlock(at)), &buf)?;
        Ok(())
    }

    /// Makes inode `inode` free, as a new chunk's inodes are.
    pub(crate) fn clear_inode(&mut self, inode: u64) -> Result<(), RepairError> {
        let header = MetaHeader::new(MetaKind::Inode, inode, self.uuid, inode);
        let core = free_inode_core(header, 0);
        let literal = vec![0u8; self.geometry.inode_size as usize - INODE_CORE_SIZE];
        self.write_inode(inode, &core, &literal)
    }

    fn fix_inode(
        &mut self,
        inode: u64,
        fix: &InodeFix,
        extents: &[Extent],
        recorded: Option<u64>,
    ) -> Result<(), RepairError> {
        let discards = !fix.drop_extents.is_empty() || fix.tree_lost || fix.drop_attr;
        if discards && !self.may_discard() {
            self.skip(format!(
                "inode {inode}: its forks claim blocks they may not"
            ));
            return Ok(());
        }
        let (_, offset, block) = self.read_inode(inode)?;
        let size = self.geometry.inode_size as usize;
        let raw = block[offset..offset + size].to_vec();
        let Ok(mut core) = InodeCore::decode(&raw) else {
            return Ok(());
        };
        let mut literal = raw[INODE_CORE_SIZE..].to_vec();
        let mut blocks = fix.data_blocks + fix.tree_blocks + fix.attr_blocks;
        if fix.drop_attr {
            self.drop_attr_fork(inode, &mut core, &mut literal)?;
            blocks -= fix.attr_blocks;
        }
        if !fix.drop_extents.is_empty() || fix.tree_lost {
            let dropped: BTreeSet<(u64, u32)> =
                fix.drop_extents.iter().map(|(s, l, _)| (*s, *l)).collect();
            let kept: Vec<Extent> = extents
                .iter()
                .copied()
                .filter(|e| !dropped.contains(&(e.fs_block.0, e.length)))
                .collect();
            for (start, length, why) in &fix.drop_extents {
                let what = format!(
                    "inode {inode}: dropped extent at block {start} ({length} blocks): {why}"
                );
                self.action(what);
            }
            let range = core.data_fork_range(self.geometry.inode_size);
            let fork = &mut literal[range.start - INODE_CORE_SIZE..range.end - INODE_CORE_SIZE];
            fork.fill(0);
            if put_fork_extents(&kept, fork).is_err() {
                self.clear_inode(inode)?;
                let what = "cleared, its remaining extents do not fit in the inode";
                self.action(format!("inode {inode}: {what}"));
                return Ok(());
            }
            if core.data_format == ForkFormat::Btree {
                blocks -= fix.tree_blocks;
                let what = "extent tree replaced by an extent list in the inode";
                self.action(format!("inode {inode}: {what}"));
            }
            core.data_format = ForkFormat::Extents;
            core.data_extent_count = kept.len() as u32;
        }
        if !discards && recorded == Some(blocks) {
            return Ok(());
        }
        if core.block_count != blocks {
            let what = format!("block count {} set to {blocks}", core.block_count);
            self.action(format!("inode {inode}: {what}"));
            core.block_count = blocks;
        }
        self.write_inode(inode, &core, &literal)
    }

    /// Removes the attr fork: the data fork takes the whole literal area.
    fn drop_attr_fork(
        &mut self,
        inode: u64,
        core: &mut InodeCore,
        literal: &mut [u8],
    ) -> Result<(), RepairError> {
        let inode_size = self.geometry.inode_size;
        let old = core.data_fork_range(inode_size);
        let shift = |r: std::ops::Range<usize>| r.start - INODE_CORE_SIZE..r.end - INODE_CORE_SIZE;
        let old_fork = literal[shift(old.clone())].to_vec();
        let root = (core.data_format == ForkFormat::Btree)
            .then(|| BmapRoot::decode(&old_fork))
            .transpose()?;
        literal[shift(old.end..inode_size as usize)].fill(0);
        core.attr_format = None;
        core.attr_offset = 0;
        core.attr_extent_count = 0;
        if let Some(root) = root {
            let new = shift(core.data_fork_range(inode_size));
            literal[new.clone()].fill(0);
            root.encode(&mut literal[new])?;
        }
        self.action(format!(
            "inode {inode}: dropped its damaged extended attributes"
        ));
        Ok(())
    }
}

/// Recomputes an inode's CRC (its LSN is kept).
pub(crate) fn stamp_inode(raw: &mut [u8]) {
    cairn_format::header::stamp(raw, None);
}
