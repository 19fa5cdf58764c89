//! The checks, phase by phase: the log, superblocks, AG headers, free-space and inode trees,
//! inodes, block accounting, summary counters, then the namespace (directories, link counts,
//! unlinked lists).

use std::collections::{BTreeMap, BTreeSet};

use cairn_blockdev::{AlignedBuf, BlockDevice};
use cairn_format::agf::Agf;
use cairn_format::agfl::{Agfl, agfl_capacity};
use cairn_format::agi::Agi;
use cairn_format::btree_block::InodeRecord;
use cairn_format::limits::{AG_AGF_BLOCK, AG_AGFL_BLOCK, AG_AGI_BLOCK, AG_HEADER_BLOCKS};
use cairn_format::{
    AgBlock, AgNumber, Expected, Extent, FsBlock, Geometry, Lsn, MetaKind, Superblock,
};

use crate::namespace::{InodeSeen, Names};
use crate::progress::Progress;
use crate::report::{Problem, Report};

/// A range of blocks some structure says it owns.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Claim {
    pub start: u64,
    pub length: u64,
    pub owner: &'static str,
    /// The inode whose fork holds the blocks (file data, extent tree, xattr blocks).
    pub inode: Option<u64>,
}

/// What a check run learned that repair acts on (filled as the check goes).
#[derive(Debug, Default)]
pub struct Findings {
    /// Inodes that cannot be saved (core or extent tree unreadable), with the reason.
    pub(crate) broken_inodes: BTreeMap<u64, String>,
    /// Inodes whose attr fork is damaged.
    pub(crate) broken_attr: BTreeSet<u64>,
    /// The data fork extents of every in-use inode that maps blocks.
    pub(crate) data_extents: BTreeMap<u64, Vec<Extent>>,
    /// Every inode chunk found, per AG, with the free mask the inode cores say.
    pub(crate) chunks: Vec<(u32, InodeRecord)>,
    /// AGs whose inode tree could not be walked (their chunks were found by a scan).
    pub(crate) scanned_ags: BTreeSet<u32>,
    /// The namespace as read (directories, references, parents, unlinked members).
    pub(crate) names: Names,
    pub(crate) unlinked: BTreeSet<u64>,
    /// Directory data blocks (block, directory) whose entries decode but whose header does
    /// not verify: repair rewrites the header.
    pub(crate) restamp_dir_blocks: Vec<(u64, u64)>,
    /// Directory data blocks (block, directory, data block index) that cannot be decoded:
    /// repair empties them (block 0 keeps its markers).
    pub(crate) lost_dir_blocks: Vec<(u64, u64, u64)>,
    /// Remote symlink blocks (block, symlink) whose header does not verify but whose piece of
    /// the target does: repair rewrites the header.
    pub(crate) restamp_symlink_blocks: Vec<(u64, u64)>,
    /// Metadata pieces (block, byte offset, length) whose verified header carries an LSN
    /// past the log: repair sets it to the log's newest.
    pub(crate) future_lsns: Vec<(u64, usize, usize)>,
    /// Link counts to set (inode, the entries naming it).
    pub(crate) wrong_nlink: BTreeMap<u64, u32>,
    /// An entry names an in-use inode of a chunk no inode tree holds: survey again with
    /// `scan_all`.
    pub(crate) unknown_chunks: bool,
    /// Problems the namespace phase found (none: repair leaves the namespace alone).
    pub(crate) namespace_problems: usize,
    /// Inodes whose only faults are reserved fields (spare bytes, flags or a hint the
    /// inode may not carry): repair clears them.
    pub(crate) restamp_inodes: Vec<u64>,
    /// Block directories whose hash index disagrees with their entries or cannot be
    /// walked: repair rebuilds it.
    pub(crate) bad_index: BTreeSet<u64>,
    /// Regular files that map shared blocks without `INODE_FLAG_REFLINK`: repair sets it.
    pub(crate) missing_reflink: BTreeSet<u64>,
    /// Inodes whose block count is not what their forks hold, with the blocks of the data
    /// fork (data and extent tree; the attr fork's are in `attr_blocks`).
    pub(crate) wrong_counts: BTreeMap<u64, u64>,
    /// Inodes whose extent map is damaged but partly readable: repair stores the extents
    /// that verified anew.
    pub(crate) rebuild_map: BTreeSet<u64>,
    /// Inodes whose size is impossible, with the size that fits: a block directory's that
    /// does not span its data blocks, a device's, FIFO's or socket's that is not 0.
    pub(crate) wrong_size: BTreeMap<u64, u64>,
    /// Unlinked buckets (AG, bucket) whose chain holds an inode it may not (free, linked,
    /// named, twice): repair empties them, and their members become orphans.
    pub(crate) broken_buckets: BTreeSet<(u32, usize)>,
    /// Inodes whose map is cut to this many file blocks (a symlink mapping more blocks than
    /// its target needs).
    pub(crate) trim_map: BTreeMap<u64, u64>,
    /// Directories with unwritten extents: repair drops those extents.
    pub(crate) drop_unwritten: BTreeSet<u64>,
    /// Blocks of each inode's attr fork (inodes that have any).
    pub(crate) attr_blocks: BTreeMap<u64, u64>,
    /// The leaf blocks each inode's attr fork names (the leaf form's one leaf; the index
    /// form's fill leaf and the leaves its records name), for salvaging a damaged fork.
    pub(crate) attr_leaves: BTreeMap<u64, Vec<u64>>,
    /// The index tree blocks of each inode whose attr fork is in index form, as walked.
    pub(crate) attr_tree_blocks: BTreeMap<u64, Vec<u64>>,
    /// The extent tree blocks of each inode whose data fork is a tree, as walked.
    pub(crate) tree_blocks: BTreeMap<u64, Vec<u64>>,
}

/// The state of one check run.
#[derive(Debug)]
pub struct Checker<'a> {
    pub device: &'a dyn BlockDevice,
    pub geometry: Geometry,
    pub uuid: [u8; 16],
    pub superblock: Superblock,
    pub report: Report,
    pub claims: Vec<Claim>,
    /// Every in-use inode the chunk walk met, for the namespace phase.
    pub inodes: BTreeMap<u64, InodeSeen>,
    /// Each AG's unlinked bucket heads (AG inode numbers or `NULL_AG_INODE`).
    pub unlinked_heads: Vec<(u32, Vec<u32>)>,
    /// The highest LSN the log holds: no metadata block may carry a later one.
    pub lsn_limit: Lsn,
    /// (inode, extent count) of every regular file with data, for `cairn-db frag`.
    pub file_extent_counts: Vec<(u64, u64)>,
    /// Repair mode: trust inode cores over chunk masks, scan for chunks when an inode tree
    /// cannot be walked, and keep `findings`.
    pub repairing: bool,
    /// Repair mode: scan every AG for chunks, whatever its inode tree says (set when an
    /// earlier survey found an entry naming a verified inode in no known chunk).
    pub scan_all: bool,
    pub(crate) findings: Findings,
    /// What the refcount trees hold (reflink), checked against the files' mappings.
    pub(crate) refcounts: crate::refcount::RefcountSeen,
    /// The progress line (hidden unless the caller gives one).
    pub progress: Progress,
}

/// Per-AG totals gathered for the superblock counter check.
#[derive(Debug, Default, Clone, Copy)]
pub struct AgTotals {
    pub free_blocks: u64,
    pub inodes: u64,
    pub free_inodes: u64,
}

impl<'a> Checker<'a> {
    pub fn new(device: &'a dyn BlockDevice, superblock: Superblock) -> Self {
        Self {
            device,
            geometry: superblock.geometry,
            uuid: superblock.uuid(),
            superblock,
            report: Report::default(),
            claims: Vec::new(),
            inodes: BTreeMap::new(),
            unlinked_heads: Vec::new(),
            lsn_limit: Lsn::ZERO,
            file_extent_counts: Vec::new(),
            repairing: false,
            scan_all: false,
            findings: Findings::default(),
            refcounts: Default::default(),
            progress: Progress::hidden(),
        }
    }

    /// Runs every phase and returns what was found.
    pub fn run(mut self) -> Report {
        self.run_phases();
        self.report
    }

    /// Runs every phase, keeping what was gathered (claims, inodes, findings).
    pub(crate) fn run_phases(&mut self) {
        self.progress.phase("log", self.geometry.ag_count);
        self.check_log();
        let totals = self.scan_ags();
        let log_start = self.geometry.log_start;
        self.claim(log_start, u64::from(self.geometry.log_blocks), "log");
        self.check_root_inode();
        self.progress.label("namespace");
        self.check_namespace();
        self.progress.label("accounting");
        self.check_claims();
        self.check_counters(totals);
    }

    /// Checks every AG's headers, trees and inodes; returns the summed totals.
    pub(crate) fn scan_ags(&mut self) -> AgTotals {
        let mut totals = AgTotals::default();
        self.progress.phase("AGs, inodes", self.geometry.ag_count);
        for ag in 0..self.geometry.ag_count {
            let ag_totals = self.check_ag(ag);
            self.progress.ags_done(ag + 1, self.report.inodes_checked);
            totals.free_blocks += ag_totals.free_blocks;
            totals.inodes += ag_totals.inodes;
            totals.free_inodes += ag_totals.free_inodes;
        }
        totals
    }

    /// Reads one filesystem block, recording a problem (and returning `None`) on failure.
    pub fn read_block(&mut self, at: FsBlock, what: &str) -> Option<Vec<u8>> {
        self.read_blocks(at, 1, what)
    }

    pub fn read_blocks(&mut self, at: FsBlock, count: u32, what: &str) -> Option<Vec<u8>> {
        let mut buf = AlignedBuf::zeroed(count as usize * self.geometry.block_size as usize);
        match self.device.read_at(self.geometry.byte_offset(at), &mut buf) {
            Ok(()) => {
                self.report.blocks_checked += u64::from(count);
                self.check_lsns(at, what, &buf);
                Some(buf.to_vec())
            }
            Err(err) => {
                self.report.add(Problem::new(
                    what,
                    Some(at.0),
                    format!("cannot read: {err}"),
                ));
                None
            }
        }
    }

    pub fn claim(&mut self, start: u64, length: u64, owner: &'static str) {
        self.claims.push(Claim {
            start,
            length,
            owner,
            inode: None,
        });
    }

    /// Claims blocks held by inode `inode`'s forks.
    pub fn claim_for(&mut self, inode: u64, start: u64, length: u64, owner: &'static str) {
        self.claims.push(Claim {
            start,
            length,
            owner,
            inode: Some(inode),
        });
    }

    /// What inode `number` must say of itself to verify.
    pub(crate) fn inode_expected(&self, number: u64) -> Expected {
        Expected {
            kind: MetaKind::Inode,
            blkno: number,
            uuid: self.uuid,
            owner: Some(number),
        }
    }

    fn expected(&self, kind: MetaKind, ag: u32, block: u32) -> Expected {
        let at = self.geometry.fs_block(AgNumber(ag), AgBlock(block));
        Expected {
            kind,
            blkno: at.0,
            uuid: self.uuid,
            owner: Some(u64::from(ag)),
        }
    }

    fn check_ag(&mut self, ag: u32) -> AgTotals {
        let start = self.geometry.ag_start(ag);
        self.claim(start, u64::from(AG_HEADER_BLOCKS), "AG headers");
        if ag > 0 {
            self.check_superblock_copy(ag);
        }
        let mut totals = AgTotals::default();
        if let Some(agf) = self.read_agf(ag) {
            self.check_free_list(ag, &agf);
            totals.free_blocks = self.check_free_space(ag, &agf);
            self.check_refcount_tree(ag, &agf);
        }
        if let Some(agi) = self.read_agi(ag) {
            self.unlinked_heads.push((ag, agi.unlinked.to_vec()));
            let (inodes, free) = self.check_inode_trees(ag, &agi);
            totals.inodes = inodes;
            totals.free_inodes = free;
        } else if self.repairing {
            self.scan_ag_inodes(ag);
        }
        totals
    }

    fn check_superblock_copy(&mut self, ag: u32) {
        let expected = self.expected(MetaKind::Superblock, ag, 0);
        let Some(block) = self.read_block(FsBlock(expected.blkno), MetaKind::Superblock.name())
        else {
            return;
        };
        match Superblock::read(&block, &expected) {
            Ok(copy) if copy.geometry != self.geometry => {
                let message = format!("copy in AG {ag} disagrees with the primary's geometry");
                self.report
                    .add(Problem::new("superblock", Some(expected.blkno), message));
            }
            Ok(copy) if !same_settings(&copy, &self.superblock) => {
                let message = format!(
                    "copy in AG {ag} disagrees with the primary (root inode, features, label, \
                     creation time or extent size hint)"
                );
                self.report
                    .add(Problem::new("superblock", Some(expected.blkno), message));
            }
            Ok(_) => {}
            Err(err) => self.report.add(Problem::from_format(expected.blkno, &err)),
        }
    }

    pub(crate) fn read_agf(&mut self, ag: u32) -> Option<Agf> {
        let expected = self.expected(MetaKind::Agf, ag, AG_AGF_BLOCK);
        let block = self.read_block(FsBlock(expected.blkno), MetaKind::Agf.name())?;
        Agf::read(&block, &expected, &self.geometry)
            .map_err(|err| self.report.add(Problem::from_format(expected.blkno, &err)))
            .ok()
    }

    fn read_agi(&mut self, ag: u32) -> Option<Agi> {
        let expected = self.expected(MetaKind::Agi, ag, AG_AGI_BLOCK);
        let block = self.read_block(FsBlock(expected.blkno), MetaKind::Agi.name())?;
        Agi::read(&block, &expected, &self.geometry)
            .map_err(|err| self.report.add(Problem::from_format(expected.blkno, &err)))
            .ok()
    }

    /// The AGFL verifies and the blocks the AGF says are on the free list are owned by it.
    fn check_free_list(&mut self, ag: u32, agf: &Agf) {
        let expected = self.expected(MetaKind::Agfl, ag, AG_AGFL_BLOCK);
        let Some(block) = self.read_block(FsBlock(expected.blkno), MetaKind::Agfl.name()) else {
            return;
        };
        let agfl = match Agfl::read(&block, &expected, &self.geometry) {
            Ok(agfl) => agfl,
            Err(err) => return self.report.add(Problem::from_format(expected.blkno, &err)),
        };
        let ag_len = self.geometry.ag_len(ag);
        for slot in agf.free_list_slots(agfl_capacity(self.geometry.block_size)) {
            let entry = agfl.slots.get(slot as usize).copied().unwrap_or(u32::MAX);
            if entry < AG_HEADER_BLOCKS || entry >= ag_len {
                let message = format!("slot {slot} holds {entry}, outside the AG");
                self.report.add(Problem::new(
                    MetaKind::Agfl.name(),
                    Some(expected.blkno),
                    message,
                ));
                continue;
            }
            let at = self.geometry.fs_block(AgNumber(ag), AgBlock(entry));
            self.claim(at.0, 1, "AG free list");
        }
    }

    fn check_counters(&mut self, totals: AgTotals) {
        let sb = &self.superblock;
        let pairs = [
            ("free_blocks", sb.free_blocks, totals.free_blocks),
            ("inode_count", sb.inode_count, totals.inodes),
            ("free_inodes", sb.free_inodes, totals.free_inodes),
        ];
        for (field, recorded, counted) in pairs {
            if recorded != counted {
                let message = format!("{field} is {recorded}, but the AGs hold {counted}");
                self.report
                    .add(Problem::new("superblock", Some(0), message));
            }
        }
        self.report.free_blocks = totals.free_blocks;
        self.report.allocated_inodes = totals.inodes - totals.free_inodes.min(totals.inodes);
    }

    /// Every block is claimed exactly once, none twice, none lost; with the reflink feature,
    /// regular files' data may be claimed several times, as the refcount trees count.
    fn check_claims(&mut self) {
        let mut claims = std::mem::take(&mut self.claims);
        claims.sort();
        if !self.superblock.has_reflink() {
            self.check_exclusive(&claims);
            self.claims = claims;
            return;
        }
        let (data, others): (Vec<&Claim>, Vec<&Claim>) =
            claims.iter().partition(|claim| self.shareable(claim));
        self.check_shared(&data);
        let mut exclusive: Vec<Claim> = others.into_iter().cloned().collect();
        for (start, end, _) in crate::refcount::mapping_counts(&data) {
            exclusive.push(Claim {
                start,
                length: end - start,
                owner: "file data",
                inode: None,
            });
        }
        exclusive.sort();
        self.check_exclusive(&exclusive);
        self.claims = claims;
    }

    /// `claims` (sorted) cover the device exactly once.
    fn check_exclusive(&mut self, claims: &[Claim]) {
        let mut cursor = 0u64;
        let mut last_owner = "start of the device";
        for claim in claims {
            if claim.start < cursor {
                let message = format!(
                    "blocks {}..{} are claimed by both {} and {}",
                    claim.start,
                    cursor.min(claim.start + claim.length),
                    last_owner,
                    claim.owner
                );
                self.report
                    .add(Problem::new("block accounting", Some(claim.start), message));
            } else if claim.start > cursor {
                self.report_lost(cursor, claim.start);
            }
            if claim.start + claim.length > cursor {
                cursor = claim.start + claim.length;
                last_owner = claim.owner;
            }
        }
        if cursor < self.geometry.block_count {
            self.report_lost(cursor, self.geometry.block_count);
        }
    }

    fn report_lost(&mut self, start: u64, end: u64) {
        let message = format!(
            "blocks {start}..{end} ({} blocks) belong to nothing",
            end - start
        );
        self.report
            .add(Problem::new("block accounting", Some(start), message));
    }
}

/// Whether two superblocks agree on everything but their place and the counters (which only
/// the primary keeps current).
fn same_settings(a: &Superblock, b: &Superblock) -> bool {
    a.features_compat == b.features_compat
        && a.features_ro_compat == b.features_ro_compat
        && a.features_incompat == b.features_incompat
        && a.root_inode == b.root_inode
        && a.label == b.label
        && a.created_secs == b.created_secs
        && a.extent_size_hint == b.extent_size_hint
}
