//! The crash-state explorer: run a workload on a recording memory device, then for every
//! crash point chosen from the op log build the crash image, mount it (recovery runs), walk
//! the tree, unmount, run fsck and ask the oracle whether the state is one the workload's
//! fsync/fdatasync/sync calls allow.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use cairn_blockdev::{CrashPoint, MemDevice};

use crate::image::{self, SECTOR_BYTES};
use crate::op::Op;
use crate::oracle::Expectation;
use crate::runner::{self, Trace};
use crate::{CrashError, Violation};

/// How many crash points to look at per workload.
#[derive(Debug, Clone, Copy)]
pub struct ExploreConfig {
    /// Random subsets (half with a torn write) per flush point, besides the systematic ones.
    pub random_per_flush: usize,
    /// Seed of the random subsets.
    pub seed: u64,
    /// At most this many points besides the plain flush points (`None`: all of them).
    pub extra_points_max: Option<usize>,
    /// Run the workload on a mount with online discard (freed blocks zeroed on the memory
    /// device once their free is durable).
    pub discard: bool,
    /// Run the workload on a mount with write-behind holding up to this many bytes of
    /// written data in memory (0: off). Recovery mounts after the crash use the defaults.
    pub data_cache: u64,
    /// Run the workload with `logmode=sync` (every transaction durable at its commit).
    pub log_sync: bool,
}

/// What exploring one workload found.
#[derive(Debug, Default)]
pub struct WorkloadOutcome {
    pub crash_states: u64,
    pub flushes: u64,
    pub violations: Vec<Violation>,
}

/// A formatted image to start every workload from (formatting once is cheaper).
pub fn base_image(device_bytes: u64) -> Result<Vec<u8>, CrashError> {
    Ok(image::formatted_device(device_bytes)?.snapshot())
}

/// The crash points to check: every plain flush point, plus the others (kept subsets and torn
/// writes) thinned evenly to `extra_points_max`.
fn choose_points(device: &MemDevice, config: &ExploreConfig) -> Vec<CrashPoint> {
    let all = device.crash_points(config.random_per_flush, config.seed);
    let (plain, extra): (Vec<CrashPoint>, Vec<CrashPoint>) = all
        .into_iter()
        .partition(|point| point.kept_after.is_empty() && point.torn.is_none());
    let keep = config
        .extra_points_max
        .unwrap_or(extra.len())
        .min(extra.len());
    let mut points = plain;
    if keep > 0 {
        let stride = extra.len() as f64 / keep as f64;
        points.extend((0..keep).map(|index| extra[(index as f64 * stride) as usize].clone()));
    }
    points
}

/// Runs `ops` after `setup` on a copy of `base`, then checks every chosen crash point.
pub fn explore(
    name: &str,
    base: &[u8],
    setup: &[Op],
    ops: &[Op],
    config: &ExploreConfig,
) -> Result<WorkloadOutcome, CrashError> {
    let device = Arc::new(MemDevice::from_image(base.to_vec(), SECTOR_BYTES)?);
    let options = image::WorkloadMount {
        discard: config.discard,
        data_cache: config.data_cache,
        log_sync: config.log_sync,
    };
    let trace = runner::run_with(&device, setup, ops, options)?;
    let mut outcome = WorkloadOutcome {
        flushes: device.flush_count() as u64,
        ..WorkloadOutcome::default()
    };
    for point in choose_points(&device, config) {
        outcome.crash_states += 1;
        let problems = check_point(&device, &trace, &point);
        if !problems.is_empty() {
            outcome.violations.push(Violation {
                workload: name.to_string(),
                point: format!("{point:?}"),
                problems,
            });
        }
    }
    Ok(outcome)
}

/// Checks one crash point; the problems found (a panic is one too).
pub fn check_point(device: &MemDevice, trace: &Trace, point: &CrashPoint) -> Vec<String> {
    let image = match device.crash_image(point) {
        Ok(image) => image,
        Err(error) => return vec![format!("crash image: {error}")],
    };
    let checked = catch_unwind(AssertUnwindSafe(|| {
        recover_and_check(image, trace, point.flush_index)
    }));
    match checked {
        Ok(problems) => problems,
        Err(panic) => vec![format!("panic: {}", crate::panic_message(panic.as_ref()))],
    }
}

fn recover_and_check(image: Vec<u8>, trace: &Trace, flush_index: usize) -> Vec<String> {
    let crashed = match MemDevice::from_image(image, SECTOR_BYTES) {
        Ok(device) => Arc::new(device),
        Err(error) => return vec![format!("crash device: {error}")],
    };
    let fs = match image::mount(&crashed) {
        Ok(fs) => fs,
        Err(error) => return vec![format!("mount (recovery) failed: {error}")],
    };
    let tree = crate::walk::walk(&fs, u64::MAX);
    let mut problems = match &tree {
        Ok(tree) => Expectation::new(trace, flush_index).check(tree),
        Err(error) => vec![format!("walk: {error}")],
    };
    if let Err(error) = fs.unmount() {
        problems.push(format!("unmount: {error}"));
    }
    if let Err(error) = image::fsck(crashed.as_ref()) {
        problems.push(format!("fsck: {error}"));
    }
    problems
}
