//! Crash-consistency, fault-injection, corruption and out-of-space testing for cairn.
//!
//! The explorer records every block write and flush of a workload on a `MemDevice`, then
//! rebuilds the device at every flush point (and at sampled subsets and torn sectors of the
//! writes after it), mounts it so recovery runs, walks the tree, runs the fsck checker and
//! asks a persisted-state oracle whether the result is allowed (CrashMonkey's method).
//! Workloads are generated systematically (one and two operations, each followed by fsync,
//! fdatasync or sync, ACE-style) and at random (long sequences). They run with the default
//! mount, with online discard, or with write-behind (`ExploreConfig::data_cache`), where
//! data sits in memory until writeback and a crash may find a size logged before its data.
//!
//! Owns: the model filesystem and its version history (`model`), workload operations
//! (`op`, `workload`), the runner that records flush counts per step (`runner`), the tree
//! walker (`walk`), the oracle (`oracle`), the explorer (`explore`), fault injection
//! (`faults`), the image mutator (`fuzz`) and the out-of-space checks (`space`).
//! Invariants:
//! - a crash state is accepted only if every promise of a completed fsync-family call made
//!   before the crash point holds, every name the tree shows was that inode's name at a step
//!   whose writes may have reached the device, every file's size and every sector of its
//!   contents come from some version of that same file (with write-behind, a sector past
//!   the end of such a version may read as that version's bytes then zeros), link counts
//!   match the names, fsck finds nothing and no call panicked;
//! - everything is deterministic given its seed, so each violation can be replayed.

pub mod explore;
pub mod faults;
pub mod fields;
pub mod fuzz;
pub mod image;
pub mod model;
pub mod op;
pub mod oracle;
pub mod repair_base;
pub mod repair_fuzz;
pub mod runner;
pub mod space;
pub mod suite;
pub mod walk;
pub mod workload;

use cairn_blockdev::DeviceError;

/// Errors that stop a run (as opposed to violations, which are collected and counted).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CrashError {
    #[error("device: {0}")]
    Device(#[from] DeviceError),
    #[error("setup: {0}")]
    Setup(String),
    #[error("{op} failed on the live filesystem: {error}")]
    OpFailed { op: String, error: String },
    #[error("fsck found {} problems: {}", .0.len(), .0.join("; "))]
    Fsck(Vec<String>),
}

/// One state the oracle, fsck, the walk or recovery refused.
#[derive(Debug, Clone)]
pub struct Violation {
    pub workload: String,
    pub point: String,
    pub problems: Vec<String>,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "[{}] at {}: {}",
            self.workload,
            self.point,
            self.problems.join("; ")
        )
    }
}

/// The text of a caught panic.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        return (*text).to_string();
    }
    payload
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_else(|| "non-text panic".into())
}
