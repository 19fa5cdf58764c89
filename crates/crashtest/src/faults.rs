//! Fault injection: a workload runs while the device fails one write, stops accepting writes
//! (power cut without warning), fails a flush, or fails reads. The filesystem must return an
//! I/O error (or refuse with `ShutDown`) rather than panic, and the durable image must recover
//! to a state the oracle accepts, with fsck clean.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use cairn_blockdev::{CrashPoint, MemDevice};
use cairn_fs::{Filesystem, FsError};

use crate::explore::check_point;
use crate::image::SECTOR_BYTES;
use crate::model::Model;
use crate::op::{self, Op};
use crate::runner::{StepRecord, Trace, perform};
use crate::{CrashError, panic_message};

/// A fault armed before the workload starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The n-th write from now fails once.
    FailWrite(u64),
    /// The device accepts n more writes, then refuses every write and flush.
    StopAfter(u64),
    /// The next flush fails (after `writes` more writes succeeded, armed by a stop-free run).
    FailFlush,
}

/// What one faulted run showed.
#[derive(Debug, Default)]
pub struct FaultOutcome {
    /// Whether the fault fired (some op saw an error).
    pub fired: bool,
    pub problems: Vec<String>,
}

fn arm(device: &MemDevice, fault: Fault) {
    match fault {
        Fault::FailWrite(n) => device.fail_nth_write(n),
        Fault::StopAfter(n) => device.stop_after_writes(n),
        Fault::FailFlush => device.fail_flushes(1),
    }
}

fn acceptable(error: &FsError) -> bool {
    matches!(error, FsError::Io { .. } | FsError::ShutDown)
}

/// Runs `ops` after `setup` on a copy of `base` with `fault` armed after the setup, stops at
/// the first failed op (which may or may not have happened), and checks the durable image.
pub fn run_with_fault(base: &[u8], setup: &[Op], ops: &[Op], fault: Fault) -> FaultOutcome {
    let result = catch_unwind(AssertUnwindSafe(|| faulted_run(base, setup, ops, fault)));
    match result {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(error)) => FaultOutcome {
            fired: true,
            problems: vec![format!("run: {error}")],
        },
        Err(panic) => FaultOutcome {
            fired: true,
            problems: vec![format!("panic: {}", panic_message(panic.as_ref()))],
        },
    }
}

fn faulted_run(
    base: &[u8],
    setup: &[Op],
    ops: &[Op],
    fault: Fault,
) -> Result<FaultOutcome, CrashError> {
    let device = Arc::new(MemDevice::from_image(base.to_vec(), SECTOR_BYTES)?);
    let fs = crate::image::mount(&device).map_err(|e| CrashError::Setup(e.to_string()))?;
    let mut model = Model::default();
    for setup_op in setup {
        let inode = perform(&fs, setup_op).map_err(|e| CrashError::Setup(e.to_string()))?;
        op::apply(&mut model, setup_op, None, inode);
    }
    fs.sync().map_err(|e| CrashError::Setup(e.to_string()))?;
    device.clear_log();
    let mut trace = Trace {
        base_names: Arc::new(model.names.clone()),
        model,
        steps: Vec::new(),
        write_behind: false,
    };
    arm(&device, fault);
    let mut outcome = FaultOutcome::default();
    for (step, next) in ops.iter().chain(std::iter::once(&Op::Unmount)).enumerate() {
        let start_flush = device.flush_count();
        let result = match next {
            Op::Unmount => fs.sync().map(|()| 0),
            other => perform(&fs, other),
        };
        let failed = result.as_ref().err().map(ToString::to_string);
        if let Err(error) = &result
            && !acceptable(error)
        {
            outcome
                .problems
                .push(format!("{next}: error is not EIO: {error}"));
        }
        // A failed op may have happened in part: the model takes it as a step with no promise.
        let node = op::apply(
            &mut trace.model,
            next,
            Some(step),
            *result.as_ref().unwrap_or(&0),
        );
        let end_flush = if failed.is_some() {
            usize::MAX
        } else {
            device.flush_count()
        };
        trace.steps.push(StepRecord {
            op: next.clone(),
            start_flush,
            end_flush,
            node,
            names: Arc::new(trace.model.names.clone()),
        });
        if failed.is_some() {
            outcome.fired = true;
            break;
        }
    }
    finish(fs, &device, &trace, &mut outcome);
    Ok(outcome)
}

/// After the fault: a refused or successful sync, an unmount attempt, then the durable image
/// (what a power cut now leaves) must recover to an accepted state.
fn finish(fs: Filesystem, device: &Arc<MemDevice>, trace: &Trace, outcome: &mut FaultOutcome) {
    if let Err(error) = fs.sync()
        && !acceptable(&error)
    {
        outcome
            .problems
            .push(format!("sync after the fault: {error}"));
    }
    // Unmount may fail on a stopped device; the durable image is checked either way.
    let _ = fs.unmount();
    device.clear_faults();
    let point = CrashPoint::at_flush(device.flush_count());
    outcome.problems.extend(check_point(device, trace, &point));
}

/// Mounts an unmounted populated image with reads failing in `range` and walks it: errors must
/// be I/O errors, nothing may panic, and after the faults are cleared the image must be clean.
pub fn run_with_read_fault(image: &[u8], range: std::ops::Range<u64>) -> Vec<String> {
    let checked = catch_unwind(AssertUnwindSafe(|| read_faulted(image, range)));
    checked.unwrap_or_else(|panic| vec![format!("panic: {}", panic_message(panic.as_ref()))])
}

fn read_faulted(image: &[u8], range: std::ops::Range<u64>) -> Vec<String> {
    let mut problems = Vec::new();
    let device = match MemDevice::from_image(image.to_vec(), SECTOR_BYTES) {
        Ok(device) => Arc::new(device),
        Err(error) => return vec![format!("device: {error}")],
    };
    device.fail_reads_in(range);
    match crate::image::mount(&device) {
        Ok(fs) => {
            if let Err(crate::walk::WalkError::Fs { source, what, path }) =
                crate::walk::walk(&fs, u64::MAX)
                && !acceptable(&source)
                && !matches!(source, FsError::Corrupt { .. })
            {
                problems.push(format!("{what} of {path}: not EIO: {source}"));
            }
            let _ = fs.unmount();
        }
        Err(error) if !acceptable(&error) => problems.push(format!("mount: not EIO: {error}")),
        Err(_) => {}
    }
    device.clear_faults();
    if let Err(error) = crate::image::fsck(device.as_ref()) {
        problems.push(format!("fsck after read faults: {error}"));
    }
    problems
}
