//! Repair, in phases like xfs_repair, each driven by a fresh check of the device:
//! 0. the primary superblock (`superblock.rs`): rewritten from the secondary copies when it
//!    does not verify or most copies disagree with it; then the log (`log.rs`): a dirty log is
//!    replayed by mounting and unmounting through cairn-fs, or through the journal alone if
//!    the mount fails (the one recovery implementation); with `-y`, a log that cannot be read
//!    or replayed is discarded: replaced by a clean log whose LSN is above every metadata LSN
//!    (a replay failing for a reason outside the log keeps the log unless `-L`);
//! 1. inodes (`inodes.rs`): inodes that cannot be saved are cleared; extents past the device,
//!    across an AG or over blocks already owned (metadata, or a lower inode) are dropped;
//!    damaged attr forks are dropped; block counts are set to what the forks hold;
//! 2. the namespace (`names.rs`): entries naming free inodes, of the wrong type or giving a
//!    directory a second parent are removed, `..` is set, indexes rebuilt, disconnected inodes
//!    moved to `/lost+found`, and link counts set to the entries naming each inode;
//! 3. space (`space.rs`): every AG's trees and headers and the superblocks are rebuilt from
//!    what the inodes and headers claim.
//!
//! A final check decides the outcome. Nothing is written unless the first check found
//! problems; `-p` (preen) makes only the repairs that lose nothing (no inode, extent, entry or
//! attr fork is dropped).

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
use cairn_format::{FormatError, FsBlock, Geometry, Superblock};

use crate::FsckError;
use crate::check::Checker;
use crate::probe;
use crate::progress::Progress;
use crate::report::{Problem, Report};
use superblock::Primary;

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
}

impl Repairer<'_> {
    /// Stamps `block` (its CRC over what is written; the LSN kept) and writes it at `at`.
    pub(crate) fn write_meta(&mut self, at: u64, block: &mut [u8]) -> Result<(), RepairError> {
        stamp(block, None);
        let mut buf = AlignedBuf::zeroed(block.len());
        buf.copy_from_slice(block);
        self.device
            .write_at(self.geometry.byte_offset(FsBlock(at)), &buf)?;
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
    fn survey(&self) -> Checker<'_> {
        let mut checker = Checker::new(self.device, self.superblock.clone());
        checker.progress = self.progress.clone();
        checker.repairing = true;
        checker.run_phases();
        checker
    }

    fn run_phases(&mut self) -> Result<(), RepairError> {
        let survey = self.survey();
        let plan = self.plan_inode_repairs(&survey);
        drop(survey);
        self.apply_inode_repairs(plan)?;
        let survey = self.survey();
        let plan = self.plan_namespace(&survey);
        drop(survey);
        self.apply_namespace(plan)?;
        let survey = self.survey();
        let heads: BTreeMap<u32, Vec<u32>> = survey.unlinked_heads.iter().cloned().collect();
        let claims = survey.claims.clone();
        let chunks = survey.findings.chunks.clone();
        drop(survey);
        self.rebuild_space(&claims, &chunks, &heads)?;
        self.device.flush()?;
        Ok(())
    }
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
    let mut before = crate::check_opened(&opened, progress);
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
    };
    if let Err(err) = repairer.run_phases() {
        repairer.skipped.push(format!("repair stopped: {err}"));
    }
    outcome.actions = repairer.actions;
    outcome.skipped = repairer.skipped;
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
