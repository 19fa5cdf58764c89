//! Repair, in phases like xfs_repair, each planned from a survey (a repairing check) of the
//! device as the phases before it left it:
//! 0. the primary superblock (`superblock.rs`): rewritten from the secondary copies when it
//!    does not verify or most copies disagree with it (a tie, as with two AGs, goes to the
//!    candidate the AG headers, the root inode and the log agree with); then the log
//!    (`log.rs`): a dirty log is replayed by mounting and unmounting through cairn-fs, or
//!    through the journal alone if the mount fails (the one recovery implementation); with
//!    `-y`, a log that cannot be read or replayed is discarded: replaced by a clean log whose
//!    LSN is above every metadata LSN (a replay failing for a reason outside the log keeps
//!    the log unless `-L`);
//! 1. inodes (`inodes.rs`): LSNs past the log set back, spare bytes and flags or extent size
//!    hints the inode may not carry cleared, inodes whose core cannot be saved cleared;
//!    extents past the device, across an AG or over metadata are dropped, extents over
//!    another file's data get a copy; damaged attr forks keep the attributes that verify and
//!    get their index stored anew (`attrs.rs`); a damaged extent map is stored anew from
//!    the extents that verify (`fork_map.rs`);
//! 2. the namespace (`names.rs`, only when the survey found namespace problems): entries
//!    naming free inodes, of the wrong type or giving a directory a second parent are
//!    removed, damaged directory blocks salvaged or emptied (block 0 keeps its markers), `..`
//!    set, disconnected inodes moved to `/lost+found`, link counts set to the entries;
//! 3. derived data (`derived.rs`): hash indexes that disagree with their directory's entries
//!    rebuilt, block and link counts set to what the forks and entries say;
//! 4. space (`space.rs`): every AG's trees and headers and the superblocks are rebuilt from
//!    what the inodes and headers claim; with the reflink feature the refcount trees are
//!    rebuilt from the regular files' mappings (copy-on-write staging blocks a crash left
//!    become free).
//!
//! A phase that writes nothing leaves the survey it planned from true for the next one, so a
//! repair that only rebuilds space reads the device twice (the first survey and the final
//! check). A final check decides the outcome. Nothing is written unless the first check found
//! problems; `-p` (preen) makes only the repairs that lose nothing (no inode, extent, entry or
//! attribute is dropped).

mod attrs;
mod derived;
mod fork_map;
mod inodes;
mod log;
mod lost_found;
mod names;
mod space;
mod superblock;

use std::collections::BTreeMap;
use std::path::Path;

use cairn_blockdev::{AlignedBuf, BlockDevice, DeviceError};
use cairn_format::header::stamp;
use cairn_format::types::NULL_AG_INODE;
use cairn_format::{FormatError, FsBlock, Geometry, Superblock};

use crate::FsckError;
use crate::check::{Checker, Claim};
use crate::probe;
use crate::progress::Progress;
use crate::report::{Problem, Report};
use superblock::Primary;

/// Most rounds of phases 1 to 3 one repair runs (each round after the first only when the
/// one before changed something).
const REPAIR_ROUNDS_MAX: usize = 3;

/// How far repair may go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `-p`: only repairs that lose no data.
    Preen,
    /// `-y`: every repair.
    Yes,
}

/// What the user allows a repair run to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RepairOptions {
    pub mode: Mode,
    /// `-L`: discard a dirty log even when replay fails for a reason that is not the log's
    /// (its unreplayed changes are lost).
    pub discard_log: bool,
}

/// What a repair run did.
#[derive(Debug, Default)]
pub struct Outcome {
    /// The check before any change.
    pub before: Report,
    /// The check after the repairs (equal to `before` when nothing was written).
    pub after: Report,
    /// One line per repair made, naming what and where.
    pub actions: Vec<String>,
    /// Repairs that were needed but not made (preen mode, or impossible).
    pub skipped: Vec<String>,
    /// Repairs that lost data the user must hear about (a discarded log), also in `actions`.
    pub warnings: Vec<String>,
}

impl Outcome {
    /// The fsck(8) exit code of the run: 4 if problems are left, 1 if anything was changed,
    /// else 0.
    pub fn exit_code(&self) -> u8 {
        let changed = !self.actions.is_empty() || self.after != self.before;
        if !self.after.is_clean() {
            crate::cli::EXIT_UNCORRECTED
        } else if changed {
            crate::cli::EXIT_CORRECTED
        } else {
            crate::cli::EXIT_CLEAN
        }
    }

    /// Problems of the first check that the final check no longer finds.
    pub fn fixed(&self) -> Vec<&Problem> {
        self.before
            .problems
            .iter()
            .filter(|p| !self.after.problems.contains(p))
            .collect()
    }
}

/// Why a repair phase stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RepairError {
    #[error(transparent)]
    Device(#[from] DeviceError),
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error("{0}")]
    Stuck(String),
}

/// The state shared by the repair phases: a writable, exclusively held device.
pub(crate) struct Repairer<'a> {
    pub device: &'a dyn BlockDevice,
    pub geometry: Geometry,
    pub uuid: [u8; 16],
    pub superblock: Superblock,
    pub mode: Mode,
    pub progress: Progress,
    pub actions: Vec<String>,
    pub skipped: Vec<String>,
    /// Blocks written so far: a phase that wrote nothing leaves the last survey true.
    pub writes: u64,
}

impl<'a> Repairer<'a> {
    /// Stamps `block` (its CRC over what is written; the LSN kept) and writes it at `at`.
    pub(crate) fn write_meta(&mut self, at: u64, block: &mut [u8]) -> Result<(), RepairError> {
        stamp(block, None);
        self.write_block_bytes(at, block)
    }

    /// Writes `block` at `at` as it is.
    pub(crate) fn write_block_bytes(&mut self, at: u64, block: &[u8]) -> Result<(), RepairError> {
        let mut buf = AlignedBuf::zeroed(block.len());
        buf.copy_from_slice(block);
        self.device
            .write_at(self.geometry.byte_offset(FsBlock(at)), &buf)?;
        self.writes += 1;
        Ok(())
    }

    /// Reads `count` blocks at `at`.
    pub(crate) fn read_raw(&self, at: u64, count: u32) -> Result<Vec<u8>, RepairError> {
        let mut buf = AlignedBuf::zeroed(count as usize * self.geometry.block_size as usize);
        self.device
            .read_at(self.geometry.byte_offset(FsBlock(at)), &mut buf)?;
        Ok(buf.to_vec())
    }

    /// Whether repairs that lose data may be made.
    pub(crate) fn may_discard(&self) -> bool {
        self.mode == Mode::Yes
    }

    /// Records a repair that preen mode may not make.
    pub(crate) fn skip(&mut self, what: String) {
        self.skipped
            .push(format!("{what}: not repaired in preen mode (run with -y)"));
    }

    fn action(&mut self, what: String) {
        self.actions.push(what);
    }

    /// A check run that keeps what repair needs.
    fn survey(&self) -> Checker<'a> {
        survey(self.device, self.superblock.clone(), &self.progress)
    }

    /// Runs the phases from `survey`, a repairing check of the device as it is now. A phase
    /// plans from the latest survey; the device is surveyed again only after a phase that
    /// wrote something, so a repair that only rebuilds space checks the device twice (once
    /// before, once after).
    fn run_phases(&mut self, mut survey: Checker<'a>) -> Result<(), RepairError> {
        // A phase's repair can leave work for an earlier one (an extent dropped in phase 1
        // can leave a symlink short of its target, seen only by the next survey): the
        // phases run again while a round changes something, a few rounds at most.
        for _ in 0..REPAIR_ROUNDS_MAX {
            let round = self.writes;
            survey = self.phase_round(survey)?;
            if self.writes == round {
                break;
            }
        }
        let mut heads: BTreeMap<u32, Vec<u32>> = survey.unlinked_heads.iter().cloned().collect();
        for &(ag, bucket) in &survey.findings.broken_buckets {
            if let Some(head) = heads.get_mut(&ag).and_then(|list| list.get_mut(bucket)) {
                *head = NULL_AG_INODE;
                self.action(format!("AG {ag}: unlinked bucket {bucket} emptied"));
            }
        }
        let claims = std::mem::take(&mut survey.claims);
        let chunks = std::mem::take(&mut survey.findings.chunks);
        let shared = match survey.superblock.has_reflink() {
            true => {
                let data: Vec<&Claim> = claims.iter().filter(|c| survey.shareable(c)).collect();
                crate::refcount::rebuilt_records(&self.geometry, &data)
            }
            false => BTreeMap::new(),
        };
        drop(survey);
        self.rebuild_space(&claims, &chunks, &heads, &shared)?;
        self.device.flush()?;
        Ok(())
    }
}

impl<'a> Repairer<'a> {
    /// Phases 1 to 3 once, from `survey`; returns a survey of the device as they left it.
    fn phase_round(&mut self, mut survey: Checker<'a>) -> Result<Checker<'a>, RepairError> {
        let plan = self.plan_inode_repairs(&mut survey)?;
        let written = self.writes;
        self.apply_inode_repairs(plan)?;
        if self.writes != written {
            survey = self.survey();
        }
        if survey.findings.namespace_problems > 0 {
            let plan = self.plan_namespace(&survey);
            let written = self.writes;
            self.apply_namespace(plan)?;
            if self.writes != written {
                survey = self.survey();
            }
        }
        let written = self.writes;
        self.repair_derived(&survey)?;
        if self.writes != written {
            survey = self.survey();
        }
        Ok(survey)
    }
}

/// A repairing check of `device`: it keeps what the phases plan from. If an entry names an
/// in-use inode of a chunk no inode tree holds, every AG is checked again with a scan for
/// its chunks.
fn survey<'a>(
    device: &'a dyn BlockDevice,
    superblock: Superblock,
    progress: &Progress,
) -> Checker<'a> {
    let run = |scan_all| {
        let mut checker = Checker::new(device, superblock.clone());
        checker.progress = progress.clone();
        checker.repairing = true;
        checker.scan_all = scan_all;
        checker.run_phases();
        checker
    };
    let checker = run(false);
    if checker.findings.unknown_chunks {
        drop(checker);
        return run(true);
    }
    checker
}

/// Repairs the filesystem on `path` as `mode` allows, showing `progress`. `Err` means the
/// device could not be opened or read at all (a mounted or otherwise held device is refused
/// here).
pub fn repair_path(
    path: &Path,
    buffered: bool,
    options: RepairOptions,
    progress: &Progress,
) -> Result<Outcome, FsckError> {
    let mode = options.mode;
    let opened = probe::open_writable(path, buffered)?;
    let mut outcome = Outcome::default();
    // Problems of the primary superblock that were repaired before the first full check.
    let mut primary_problems = Vec::new();
    let (opened, sb) = match superblock::settle_primary(&opened.device, &opened.primary)? {
        Primary::Kept(sb) => (opened, sb),
        Primary::Rewritten { superblock, why } => {
            let problem = match &opened.primary {
                Err(err) => Problem::from_format(0, err),
                Ok(_) => Problem::new("superblock", Some(0), why.clone()),
            };
            primary_problems.push(problem);
            outcome.actions.push(format!("superblock: primary: {why}"));
            drop(opened);
            (probe::open_writable(path, buffered)?, superblock)
        }
        Primary::Lost => {
            let mut report = Report::default();
            if let Err(err) = &opened.primary {
                report.add(Problem::from_format(0, err));
            }
            report.add(Problem::new(
                "superblock",
                Some(0),
                "no verified secondary copy to rebuild the primary from",
            ));
            return Ok(Outcome {
                before: report.clone(),
                after: report,
                ..Outcome::default()
            });
        }
    };
    let (opened, may_repair) = log::settle_log(path, buffered, opened, &sb, options, &mut outcome)?;
    let sb = match probe::read_primary(&opened.device)? {
        Ok(sb) => sb,
        Err(_) => sb,
    };
    let first = survey(&opened.device, sb.clone(), progress);
    let mut before = first.report.clone();
    for problem in primary_problems.into_iter().rev() {
        before.problems.insert(0, problem);
    }
    let mut outcome = Outcome {
        before: before.clone(),
        after: before,
        ..outcome
    };
    if outcome.before.is_clean() || !may_repair {
        return Ok(outcome);
    }
    let mut repairer = Repairer {
        device: &opened.device,
        geometry: sb.geometry,
        uuid: sb.uuid(),
        superblock: sb,
        mode,
        progress: progress.clone(),
        actions: std::mem::take(&mut outcome.actions),
        skipped: Vec::new(),
        writes: 0,
    };
    if let Err(err) = repairer.run_phases(first) {
        repairer.skipped.push(format!("repair stopped: {err}"));
    }
    outcome.actions = repairer.actions;
    // A later round of the phases meets what preen mode left again: say it once.
    let mut seen = std::collections::BTreeSet::new();
    outcome.skipped = repairer
        .skipped
        .into_iter()
        .filter(|s| seen.insert(s.clone()))
        .collect();
    // The superblock was rewritten: the final check reads it afresh.
    outcome.after = match probe::read_primary(&opened.device)? {
        Ok(sb) => {
            let mut checker = Checker::new(&opened.device, sb);
            checker.progress = progress.clone();
            checker.run()
        }
        Err(err) => {
            let mut report = Report::default();
            report.add(Problem::from_format(0, &err));
            report
        }
    };
    Ok(outcome)
}
