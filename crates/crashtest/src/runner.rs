//! Runs a workload on the real filesystem and the model side by side, recording for every
//! step the device flush count before and after it and the namespace after it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_blockdev::MemDevice;
use cairn_fs::{Credentials, FileKind, Filesystem, FsError, SeekKind, SetAttr, XattrFlags};

use crate::CrashError;
use crate::image::WorkloadMount;
use crate::model::{Model, NodeId, Path, name_of, parent_of, pattern};
use crate::op::{self, Op};

/// How much later than the commit window `Op::Wait`'s pass runs: the window's promise is
/// for what arrived longer ago than the window.
const WAIT_MARGIN: Duration = Duration::from_secs(1);

/// What the explorer needs to know about one executed step.
#[derive(Debug, Clone)]
pub struct StepRecord {
    pub op: Op,
    /// Device flushes completed before the op started: its writes are in later epochs.
    pub start_flush: usize,
    /// Device flushes completed when the op returned: its promise holds from this point on.
    pub end_flush: usize,
    /// The node a persist op covered (resolved when it ran).
    pub node: Option<NodeId>,
    /// The namespace after the step.
    pub names: Arc<BTreeMap<Path, NodeId>>,
}

/// A finished run: the model with every node version, the namespace before the first step,
/// and each step.
#[derive(Debug, Clone)]
pub struct Trace {
    pub model: Model,
    pub base_names: Arc<BTreeMap<Path, NodeId>>,
    pub steps: Vec<StepRecord>,
    /// The workload ran with write-behind on (`MountOptions::data_cache` > 0): a file's
    /// size may have been logged before its data reached the device (see the oracle).
    pub write_behind: bool,
}

fn op_failed(op: &Op, error: &FsError) -> CrashError {
    CrashError::OpFailed {
        op: op.to_string(),
        error: error.to_string(),
    }
}

/// The inode named by `path`, by lookups from the root (dropping each lookup reference).
pub fn resolve(fs: &Filesystem, path: &str) -> Result<u64, FsError> {
    let mut inode = fs.root();
    for component in path.split('/').filter(|part| !part.is_empty()) {
        let attr = fs.lookup(inode, component.as_bytes())?;
        fs.forget(attr.inode, 1);
        inode = attr.inode;
    }
    Ok(inode)
}

/// Performs `op` on the real filesystem; returns the inode it created (0 if none).
pub fn perform(fs: &Filesystem, op: &Op) -> Result<u64, FsError> {
    let who = Credentials::root();
    let parent = |path: &str| resolve(fs, parent_of(path));
    let name = |path: &str| name_of(path).as_bytes().to_vec();
    let created = |attr: cairn_fs::Attr| {
        fs.forget(attr.inode, 1);
        attr.inode
    };
    match op {
        Op::Create(path) => {
            let attr = fs.create(
                parent(path)?,
                &name(path),
                FileKind::Regular,
                0o644,
                0,
                &who,
            )?;
            Ok(created(attr))
        }
        Op::Mkdir(path) => Ok(created(fs.mkdir(
            parent(path)?,
            &name(path),
            0o755,
            &who,
        )?)),
        Op::Symlink { path, target } => Ok(created(fs.symlink(
            parent(path)?,
            &name(path),
            target,
            &who,
        )?)),
        Op::Write {
            path,
            offset,
            len,
            id,
        }
        | Op::WriteDirect {
            path,
            offset,
            len,
            id,
        } => {
            let data = pattern(*id, *offset, *len as usize);
            let inode = resolve(fs, path)?;
            let written = match op {
                Op::WriteDirect { .. } => fs.write_direct(inode, *offset, &data, None)?,
                _ => fs.write(inode, *offset, &data)?,
            };
            if u64::from(written) != *len {
                return Err(FsError::InvalidArgument("short write"));
            }
            Ok(0)
        }
        Op::Writeback => {
            fs.background_pass();
            Ok(0)
        }
        Op::Wait => {
            fs.background_pass_at(Instant::now() + fs.commit_window() + WAIT_MARGIN);
            Ok(0)
        }
        Op::Rewrite { path, len, id } => {
            let inode = resolve(fs, path)?;
            let file = fs.open(inode, true, true, false, &who)?;
            let written = fs.write(inode, 0, &pattern(*id, 0, *len as usize));
            fs.release(file)?;
            if u64::from(written?) != *len {
                return Err(FsError::InvalidArgument("short write"));
            }
            Ok(0)
        }
        Op::SeekHole(path) => match fs.seek(resolve(fs, path)?, 0, SeekKind::Hole) {
            // An empty file has no offset 0 to seek from; the writeback happened anyway.
            Ok(_) | Err(FsError::NoSuchOffset) => Ok(0),
            Err(error) => Err(error),
        },
        Op::Truncate { path, size } => {
            let changes = SetAttr {
                size: Some(*size),
                ..SetAttr::default()
            };
            fs.setattr(resolve(fs, path)?, &changes, &who)?;
            Ok(0)
        }
        Op::Clone {
            from,
            to,
            from_offset,
            to_offset,
            len,
        } => {
            let (source, target) = (resolve(fs, from)?, resolve(fs, to)?);
            fs.copy_file_range(source, *from_offset, target, *to_offset, *len)?;
            Ok(0)
        }
        Op::Link { from, to } => {
            let attr = fs.link(resolve(fs, from)?, parent(to)?, &name(to), &who)?;
            fs.forget(attr.inode, 1);
            Ok(0)
        }
        Op::Unlink(path) => fs.unlink(parent(path)?, &name(path), &who).map(|()| 0),
        Op::Rmdir(path) => fs.rmdir(parent(path)?, &name(path), &who).map(|()| 0),
        Op::Rename { from, to, mode } => {
            let (old_dir, new_dir) = (parent(from)?, parent(to)?);
            fs.rename(old_dir, &name(from), new_dir, &name(to), *mode, &who)
                .map(|()| 0)
        }
        Op::RenameWhiteout { from, to, mode } => {
            let (old_dir, new_dir) = (parent(from)?, parent(to)?);
            fs.rename_whiteout(old_dir, &name(from), new_dir, &name(to), *mode, &who)?;
            resolve(fs, from)
        }
        Op::Tmpfile { path, len, id } => {
            let dir = parent(path)?;
            let inode = fs.tmpfile(dir, 0o644, false, &who)?.inode;
            let file = fs.open(inode, true, false, false, &who)?;
            let written = fs
                .write(inode, 0, &pattern(*id, 0, *len as usize))
                .and_then(|written| fs.fsync(inode, false).map(|()| written))
                .and_then(|written| fs.link(inode, dir, &name(path), &who).map(|_| written));
            fs.release(file)?;
            fs.forget(inode, 1 + u64::from(written.is_ok()));
            if u64::from(written?) != *len {
                return Err(FsError::InvalidArgument("short write"));
            }
            Ok(inode)
        }
        Op::SetXattr {
            path,
            name,
            len,
            id,
        } => {
            let value = pattern(*id, 0, *len as usize);
            let inode = resolve(fs, path)?;
            fs.setxattr(inode, name.as_bytes(), &value, XattrFlags::Any, &who)
                .map(|()| 0)
        }
        Op::RemoveXattr { path, name } => fs
            .removexattr(resolve(fs, path)?, name.as_bytes(), &who)
            .map(|()| 0),
        Op::Fallocate {
            path,
            offset,
            len,
            mode,
        } => fs
            .fallocate(resolve(fs, path)?, *offset, *len, *mode)
            .map(|()| 0),
        Op::Fsync(path) => fs.fsync(resolve(fs, path)?, false).map(|()| 0),
        Op::Fdatasync(path) => fs.fsync(resolve(fs, path)?, true).map(|()| 0),
        Op::Sync => fs.sync().map(|()| 0),
        Op::Unmount => Err(FsError::InvalidArgument("unmount is run by the runner")),
    }
}

/// Mounts `device`, runs `setup` and syncs it, restarts the device's op log, then runs `ops`
/// one by one and finally unmounts. Every op must be valid on the model.
pub fn run(device: &Arc<MemDevice>, setup: &[Op], ops: &[Op]) -> Result<Trace, CrashError> {
    run_with(device, setup, ops, WorkloadMount::default())
}

/// `run`, on a mount set up as `options` asks. With online discard, after each op the
/// runner waits for the discards the durable frees allow, so they land between steps (the
/// discard thread may still issue some inside a step, which crash points then cover too).
/// With write-behind, nothing runs between steps (no background thread): cached data stays
/// in memory until an op writes it back, so crash points see it missing.
pub fn run_with(
    device: &Arc<MemDevice>,
    setup: &[Op],
    ops: &[Op],
    options: WorkloadMount,
) -> Result<Trace, CrashError> {
    let fs = crate::image::mount_with(device, options).map_err(|e| op_failed(&Op::Sync, &e))?;
    let mut model = Model::default();
    for setup_op in setup {
        let inode = perform(&fs, setup_op).map_err(|e| op_failed(setup_op, &e))?;
        op::apply(&mut model, setup_op, None, inode);
    }
    fs.sync().map_err(|e| op_failed(&Op::Sync, &e))?;
    device.clear_log();
    let base_names = Arc::new(model.names.clone());
    let mut steps = Vec::with_capacity(ops.len() + 1);
    for (step, step_op) in ops.iter().enumerate() {
        if !op::valid(&model, step_op) {
            return Err(CrashError::Setup(format!(
                "invalid op {step_op} at step {step}"
            )));
        }
        let start_flush = device.flush_count();
        let inode = perform(&fs, step_op).map_err(|e| op_failed(step_op, &e))?;
        fs.drain_discards();
        check_write_behind(&fs, step_op)?;
        let node = op::apply(&mut model, step_op, Some(step), inode);
        steps.push(StepRecord {
            op: step_op.clone(),
            start_flush,
            end_flush: device.flush_count(),
            node,
            names: Arc::new(model.names.clone()),
        });
    }
    let start_flush = device.flush_count();
    fs.unmount().map_err(|e| op_failed(&Op::Unmount, &e))?;
    steps.push(StepRecord {
        op: Op::Unmount,
        start_flush,
        end_flush: device.flush_count(),
        node: None,
        names: Arc::new(model.names.clone()),
    });
    Ok(Trace {
        model,
        base_names,
        steps,
        write_behind: options.data_cache > 0,
    })
}

/// Write-behind's books on the live filesystem after `done`: no writeback failed (the
/// device never fails and space never runs out in these runs, so a failure would lose an
/// acknowledged write), and after a `sync` or a `wait` no page and no reservation is left (a leaked
/// reservation would shrink the free space for good).
fn check_write_behind(fs: &Filesystem, done: &Op) -> Result<(), CrashError> {
    let stats = fs.stats().write_behind;
    let synced = matches!(done, Op::Sync | Op::Wait);
    let leaked = synced && (stats.dirty_bytes > 0 || stats.reserved_blocks > 0);
    if stats.lost_writebacks == 0 && !leaked {
        return Ok(());
    }
    Err(CrashError::OpFailed {
        op: done.to_string(),
        error: format!("write-behind books after it: {stats:?}"),
    })
}
