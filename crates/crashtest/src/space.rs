//! Running out of space: several writers fill the filesystem to 100%, then every byte each
//! writer was told was written must read back, the free count must return to where it started
//! once everything is deleted, and fsck must be clean after each round.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use cairn_blockdev::MemDevice;
use cairn_fs::{Credentials, FileKind, Filesystem, FsError};

use crate::model::pattern;

/// Bytes per write call of the fill writers.
const FILL_WRITE_BYTES: u64 = 48 * 1024;
/// Files each writer creates before it stops (it stops earlier when space runs out).
const FILES_PER_WRITER_MAX: usize = 4096;

/// What one fill round found.
#[derive(Debug, Default)]
pub struct FillOutcome {
    pub files: usize,
    pub bytes_acknowledged: u64,
    pub enospc_seen: u64,
    pub problems: Vec<String>,
}

/// One file a writer made: its name, inode, pattern id and acknowledged length.
#[derive(Debug, Clone)]
struct Written {
    name: String,
    inode: u64,
    id: u64,
    len: u64,
}

fn writer(
    fs: &Filesystem,
    dir: u64,
    writer_index: u64,
    file_bytes: u64,
    enospc: &AtomicU64,
) -> Result<Vec<Written>, String> {
    let who = Credentials::root();
    let mut made = Vec::new();
    for file_index in 0..FILES_PER_WRITER_MAX {
        let name = format!("w{writer_index}-{file_index}");
        let attr = match fs.create(dir, name.as_bytes(), FileKind::Regular, 0o644, 0, &who) {
            Ok(attr) => attr,
            Err(FsError::NoSpace) => {
                enospc.fetch_add(1, Ordering::Relaxed);
                return Ok(made);
            }
            Err(error) => return Err(format!("create {name}: {error}")),
        };
        fs.forget(attr.inode, 1);
        let id = (writer_index << 20) | file_index as u64;
        let mut file = Written {
            name,
            inode: attr.inode,
            id,
            len: 0,
        };
        while file.len < file_bytes {
            let data = pattern(id, file.len, FILL_WRITE_BYTES as usize);
            match fs.write(file.inode, file.len, &data) {
                Ok(written) => file.len += u64::from(written),
                Err(FsError::NoSpace) => {
                    enospc.fetch_add(1, Ordering::Relaxed);
                    made.push(file);
                    return Ok(made);
                }
                Err(error) => return Err(format!("write {}: {error}", file.name)),
            }
        }
        made.push(file);
    }
    Ok(made)
}

fn verify(fs: &Filesystem, dir: u64, files: &[Written]) -> Vec<String> {
    let mut problems = Vec::new();
    for file in files {
        let inode = match fs.lookup(dir, file.name.as_bytes()) {
            Ok(attr) => {
                fs.forget(attr.inode, 1);
                if attr.size != file.len {
                    problems.push(format!(
                        "{}: size {} of {} acknowledged",
                        file.name, attr.size, file.len
                    ));
                }
                attr.inode
            }
            Err(error) => {
                problems.push(format!("{}: lost: {error}", file.name));
                continue;
            }
        };
        match fs.read(inode, 0, file.len as u32) {
            Ok(data) if data == pattern(file.id, 0, file.len as usize) => {}
            Ok(_) => problems.push(format!("{}: contents differ", file.name)),
            Err(error) => problems.push(format!("{}: read: {error}", file.name)),
        }
    }
    problems
}

/// Fills `fs` from `writers` threads in directory `fill`, verifies, remounts and verifies
/// again; returns the outcome and the remounted filesystem.
pub fn fill_round(
    device: &Arc<MemDevice>,
    fs: Filesystem,
    writers: u64,
    file_bytes: u64,
) -> (FillOutcome, Option<Filesystem>) {
    let mut outcome = FillOutcome::default();
    let who = Credentials::root();
    let dir = match fs.mkdir(fs.root(), b"fill", 0o755, &who) {
        Ok(attr) => attr.inode,
        Err(error) => {
            outcome.problems.push(format!("mkdir fill: {error}"));
            return (outcome, Some(fs));
        }
    };
    let enospc = AtomicU64::new(0);
    let results: Vec<Result<Vec<Written>, String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..writers)
            .map(|index| {
                let (fs, enospc) = (&fs, &enospc);
                scope.spawn(move || writer(fs, dir, index, file_bytes, enospc))
            })
            .collect();
        handles
            .into_iter()
            .map(|handle| {
                handle
                    .join()
                    .unwrap_or_else(|_| Err("writer panicked".into()))
            })
            .collect()
    });
    let mut files = Vec::new();
    for result in results {
        match result {
            Ok(made) => files.extend(made),
            Err(problem) => outcome.problems.push(problem),
        }
    }
    outcome.files = files.len();
    outcome.bytes_acknowledged = files.iter().map(|file| file.len).sum();
    outcome.problems.extend(verify(&fs, dir, &files));
    outcome.enospc_seen = enospc.load(Ordering::Relaxed);
    let remounted = remount_and_verify(device, fs, &files, &mut outcome);
    (outcome, remounted)
}

fn remount_and_verify(
    device: &Arc<MemDevice>,
    fs: Filesystem,
    files: &[Written],
    outcome: &mut FillOutcome,
) -> Option<Filesystem> {
    if let Err(error) = fs.unmount() {
        outcome.problems.push(format!("unmount when full: {error}"));
        return None;
    }
    if let Err(error) = crate::image::fsck(device.as_ref()) {
        outcome.problems.push(format!("fsck when full: {error}"));
    }
    let fs = match crate::image::mount(device) {
        Ok(fs) => fs,
        Err(error) => {
            outcome.problems.push(format!("mount when full: {error}"));
            return None;
        }
    };
    let dir = crate::runner::resolve(&fs, "fill").unwrap_or(0);
    outcome.problems.extend(verify(&fs, dir, files));
    Some(fs)
}

/// Deletes the fill directory; the free block count must return to `free_before`.
pub fn empty_round(fs: &Filesystem, free_before: u64) -> Vec<String> {
    let who = Credentials::root();
    let mut problems = Vec::new();
    let dir = match crate::runner::resolve(fs, "fill") {
        Ok(dir) => dir,
        Err(error) => return vec![format!("fill directory: {error}")],
    };
    match crate::walk::walk(fs, 0) {
        Ok(tree) => {
            for path in tree.entries.keys().filter(|path| path.starts_with("fill/")) {
                if let Err(error) = fs.unlink(dir, &path.as_bytes()["fill/".len()..], &who) {
                    problems.push(format!("unlink {path}: {error}"));
                }
            }
        }
        Err(error) => problems.push(format!("walk: {error}")),
    }
    if let Err(error) = fs.rmdir(fs.root(), b"fill", &who) {
        problems.push(format!("rmdir fill: {error}"));
    }
    match fs.statfs() {
        Ok(stat) if stat.blocks_free != free_before => problems.push(format!(
            "free blocks {} after deleting everything, {free_before} before filling",
            stat.blocks_free
        )),
        Ok(_) => {}
        Err(error) => problems.push(format!("statfs: {error}")),
    }
    problems
}
