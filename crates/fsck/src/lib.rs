//! fsck.cairn: checks a cairn filesystem and reports every inconsistency it finds, and
//! repairs it (`repair`, for `-y` and `-p`).
//!
//! Owns: the consistency rules that span blocks (verifiers check single blocks): superblock
//! copies agree, both free-space trees hold the same merged extents, AG and superblock
//! counters match what the trees hold, inode trees agree with the inodes, every block of the
//! device belongs to exactly one owner, the log is clean and no block's LSN is past it, every
//! directory entry names an in-use inode, every inode is reachable from the root (or on an
//! unlinked list) and its link count equals the entries naming it.
//! Repair owns the phases that bring a damaged filesystem back: the primary superblock
//! (rebuilt from the copies most superblocks agree on), log replay (through cairn-fs, or the
//! journal alone if the mount fails; a log that cannot be replayed is discarded with `-y`,
//! replaced by a clean log whose LSN is above every metadata LSN; a replay failing for a
//! reason outside the log keeps the log unless `-L`), inodes, the namespace (with
//! `/lost+found`), then every AG's trees and headers rebuilt from what the inodes claim (see
//! `repair/mod.rs`). While it runs, a progress line (phase, AGs done, inodes checked) is drawn
//! on stderr if it is a terminal.
//! Invariants:
//! - checking never writes to the device (it is opened read-only);
//! - repair writes only after a check found problems, only to a device it holds exclusively
//!   (a mounted or otherwise held device is refused), and judges its work by a fresh check;
//!   `-p` never drops data (inodes, extents, entries, attributes);
//! - any damage is reported as a `Problem` naming the structure and block, never a panic; a
//!   structure too damaged to follow is reported and skipped, and the check goes on.

mod bmap;
pub mod check;
pub mod cli;
pub mod db;
mod dir_index;
mod dir_read;
mod inodes;
mod log_check;
mod logprint;
mod namespace;
pub mod probe;
pub mod progress;
mod refcount;
pub mod repair;
pub mod report;
pub mod snoop;
mod space;
mod symlink;
mod tree;
mod xattr;

use std::path::Path;

use cairn_blockdev::DeviceError;

pub use progress::Progress;
pub use report::{Problem, Report};

/// Why a check could not run at all (as opposed to finding problems).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FsckError {
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// The superblock names incompatible features this build does not know.
    #[error(
        "the filesystem uses features this fsck.cairn does not know (incompatible feature \
         bits {incompat:#x}); check it with a newer fsck.cairn"
    )]
    UnsupportedFeatures { incompat: u64 },
}

/// Checks the filesystem on `path`, showing `progress`. Problems are in the report; `Err`
/// means the device could not be read at all.
pub fn check_path(path: &Path, buffered: bool, progress: &Progress) -> Result<Report, FsckError> {
    let opened = probe::open(path, buffered)?;
    Ok(check_opened(&opened, progress))
}

/// Checks an opened device whose primary superblock has been read.
pub fn check_opened(opened: &probe::Opened, progress: &Progress) -> Report {
    match &opened.primary {
        Ok(sb) => {
            let mut checker = check::Checker::new(&opened.device, sb.clone());
            checker.progress = progress.clone();
            checker.run()
        }
        Err(err) => {
            let mut report = Report::default();
            report.add(Problem::from_format(0, err));
            report
        }
    }
}
