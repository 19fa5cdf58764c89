//! Running out of space: several writers fill the filesystem to 100%, then every byte each
//! writer was told was written must read back, the free count must return to where it started
//! once everything is deleted, and fsck must be clean after each round.
//!
//! With write-behind on, a write only reserves space; the writers fsync every file once
//! the filesystem is full. A full filesystem must be reported by a write call: an fsync
//! failing after its writes were accepted means a writeback ran out of space and lost
//! acknowledged data, which is a problem, and so is any failed writeback.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use cairn_blockdev::MemDevice;
use cairn_fs::{Credentials, FileKind, Filesystem, FsError, XattrFlags};

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

impl Written {
    /// A file just created, nothing written yet.
    fn empty(name: String, inode: u64, id: u64) -> Self {
        Self {
            name,
            inode,
            id,
            len: 0,
        }
    }
}

/// Fills files until space runs out; with write-behind (`data_cache`) then fsyncs each of
/// them, so every byte acknowledged is on the device (or the fsync reports it lost).
fn writer(
    fs: &Filesystem,
    dir: u64,
    writer_index: u64,
    file_bytes: u64,
    enospc: &AtomicU64,
    data_cache: u64,
) -> Result<Vec<Written>, String> {
    let made = fill_files(fs, dir, writer_index, file_bytes, enospc)?;
    if data_cache > 0 {
        for file in &made {
            if let Err(error) = fs.fsync(file.inode, false) {
                return Err(format!(
                    "fsync {} after {} bytes were accepted: {error}",
                    file.name, file.len
                ));
            }
        }
    }
    Ok(made)
}

fn fill_files(
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
        let mut file = Written::empty(name, attr.inode, id);
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

/// Fills `fs` (mounted with write-behind cap `data_cache`, 0: off) from `writers` threads in
/// directory `fill`, verifies, remounts the same way and verifies again; returns the outcome
/// and the remounted filesystem.
pub fn fill_round(
    device: &Arc<MemDevice>,
    fs: Filesystem,
    writers: u64,
    file_bytes: u64,
    data_cache: u64,
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
                scope.spawn(move || writer(fs, dir, index, file_bytes, enospc, data_cache))
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
    let lost = fs.stats().write_behind.lost_writebacks;
    if lost > 0 {
        let problem = format!("{lost} writebacks failed: accepted writes were lost");
        outcome.problems.push(problem);
    }
    let remounted = remount_and_verify(device, fs, &files, &mut outcome, data_cache);
    (outcome, remounted)
}

fn remount_and_verify(
    device: &Arc<MemDevice>,
    fs: Filesystem,
    files: &[Written],
    outcome: &mut FillOutcome,
    data_cache: u64,
) -> Option<Filesystem> {
    if let Err(error) = fs.unmount() {
        outcome.problems.push(format!("unmount when full: {error}"));
        return None;
    }
    if let Err(error) = crate::image::fsck(device.as_ref()) {
        outcome.problems.push(format!("fsck when full: {error}"));
    }
    let choice = crate::image::WorkloadMount {
        data_cache,
        ..Default::default()
    };
    let fs = match crate::image::mount_with(device, choice) {
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

/// Bytes of attribute value each hog file of `reserve_round` carries (a block of its own).
const HOG_XATTR_BYTES: usize = 3000;
/// Bytes per write of the large-write hog: write-behind sends writes this large straight to
/// the device (allocating at once, without a reservation).
const HOG_WRITE_BYTES: usize = 512 << 10;

/// What takes the space left in `reserve_round` without a reservation of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hog {
    /// Files each holding a large attribute (inode chunks and attribute blocks).
    Attributes,
    /// One file written in large writes (write-through data extents).
    LargeWrites,
}
/// `reserve_round` stops caching data when the free blocks not reserved for cached data
/// fall below this: room for the hogs, more than write-behind keeps aside for metadata.
const UNRESERVED_BLOCKS_MIN: u64 = 192;

/// Write-behind's reservations against allocations that take none: caches data in files
/// of `file_bytes` until little unreserved space is left (none of it written back, so the
/// reservations are outstanding), then lets `hog` allocate until the filesystem is full,
/// then fsyncs the data files. Every accepted write must reach the device: the hog must
/// get ENOSPC first, not the writeback. Returns the problems found.
pub fn reserve_round(fs: &Filesystem, file_bytes: u64, hog: Hog) -> Vec<String> {
    let who = Credentials::root();
    let dir = match fs.mkdir(fs.root(), b"reserve", 0o755, &who) {
        Ok(attr) => attr.inode,
        Err(error) => return vec![format!("mkdir reserve: {error}")],
    };
    let files = match cache_until_reserved(fs, dir, file_bytes) {
        Ok(files) => files,
        Err(problem) => return vec![problem],
    };
    let mut problems = Vec::new();
    let hogged = match hog {
        Hog::Attributes => hog_attributes(fs, dir),
        Hog::LargeWrites => hog_large_writes(fs, dir),
    };
    if let Err(problem) = hogged {
        problems.push(problem);
    }
    for file in &files {
        if let Err(error) = fs.fsync(file.inode, false) {
            problems.push(format!(
                "fsync {} after {} bytes were accepted: {error}",
                file.name, file.len
            ));
        }
    }
    if problems.is_empty() {
        problems.extend(verify(fs, dir, &files));
    }
    problems
}

/// Writes files in `dir` while more than `UNRESERVED_BLOCKS_MIN` free blocks are not
/// reserved for cached data (a write refused for space would write everything back).
fn cache_until_reserved(
    fs: &Filesystem,
    dir: u64,
    file_bytes: u64,
) -> Result<Vec<Written>, String> {
    let who = Credentials::root();
    let unreserved = || -> Result<u64, String> {
        let free = fs
            .statfs()
            .map_err(|error| format!("statfs: {error}"))?
            .blocks_free;
        Ok(free.saturating_sub(fs.stats().write_behind.reserved_blocks))
    };
    let mut files = Vec::new();
    for file_index in 0..FILES_PER_WRITER_MAX {
        let name = format!("d{file_index}");
        let attr = fs
            .create(dir, name.as_bytes(), FileKind::Regular, 0o644, 0, &who)
            .map_err(|error| format!("create {name}: {error}"))?;
        fs.forget(attr.inode, 1);
        let id = (1 << 30) | file_index as u64;
        let mut file = Written::empty(name, attr.inode, id);
        while file.len < file_bytes {
            if unreserved()? < UNRESERVED_BLOCKS_MIN {
                files.push(file);
                return Ok(files);
            }
            let data = pattern(id, file.len, FILL_WRITE_BYTES as usize);
            let written = fs
                .write(file.inode, file.len, &data)
                .map_err(|error| format!("write {} before full: {error}", file.name))?;
            file.len += u64::from(written);
        }
        files.push(file);
    }
    Ok(files)
}

/// Writes one file in `dir` in large writes until the filesystem refuses one.
fn hog_large_writes(fs: &Filesystem, dir: u64) -> Result<(), String> {
    let who = Credentials::root();
    let attr = fs
        .create(dir, b"hog", FileKind::Regular, 0o644, 0, &who)
        .map_err(|error| format!("create hog: {error}"))?;
    fs.forget(attr.inode, 1);
    let data = pattern(8, 0, HOG_WRITE_BYTES);
    let mut len = 0u64;
    for _ in 0..FILES_PER_WRITER_MAX {
        match fs.write(attr.inode, len, &data) {
            Ok(written) => len += u64::from(written),
            Err(FsError::NoSpace) => return Ok(()),
            Err(error) => return Err(format!("write hog at {len}: {error}")),
        }
    }
    Err("the large writes never filled the filesystem".into())
}

/// Creates files with a large attribute in `dir` until the filesystem refuses one.
fn hog_attributes(fs: &Filesystem, dir: u64) -> Result<(), String> {
    let who = Credentials::root();
    let value = pattern(7, 0, HOG_XATTR_BYTES);
    for index in 0..FILES_PER_WRITER_MAX * 16 {
        let name = format!("hog{index}");
        let attr = match fs.create(dir, name.as_bytes(), FileKind::Regular, 0o644, 0, &who) {
            Ok(attr) => attr,
            Err(FsError::NoSpace) => return Ok(()),
            Err(error) => return Err(format!("create {name}: {error}")),
        };
        fs.forget(attr.inode, 1);
        let set = fs.setxattr(attr.inode, b"user.hog", &value, XattrFlags::Any, &who);
        match set {
            Ok(()) => {}
            Err(FsError::NoSpace) => return Ok(()),
            Err(error) => return Err(format!("setxattr {name}: {error}")),
        }
    }
    Err("the hogs never filled the filesystem".into())
}
