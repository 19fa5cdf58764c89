//! The image the repair sweep damages: 1 KiB blocks and 512-byte inodes in four AGs (three
//! superblock copies outvote a damaged primary), so that
//! every tree has more than one level: a directory of 4,000 entries (data blocks and a
//! two-level hash index, a chunk every 64 inodes: a two-level inode tree, and one free
//! inode per chunk: a two-level free-inode tree), a file of 1,500 separate extents (an
//! extent tree with node and leaf blocks), free space cut into 150 holes (two-level
//! free-space trees), short-form and leaf-block attributes and a remote attribute value,
//! inline and remote symlinks, a FIFO, hard links and nested directories.
//!
//! It also takes the reference the sweep compares a repaired image with: every inode the
//! walk reaches with its contents, target and attributes, and every (directory, name, inode)
//! entry.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use cairn_blockdev::MemDevice;
use cairn_format::{Geometry, Superblock};
use cairn_fs::{Credentials, FileKind, Filesystem, FsError, MountOptions, XattrFlags};

use crate::CrashError;
use crate::image::{self, SECTOR_BYTES};
use crate::model::pattern;
use crate::walk::{self, Seen};

/// Size of the image: small enough to copy and check in milliseconds.
pub const BASE_DEVICE_BYTES: u64 = 16 << 20;
/// Entries of the big directory.
const BIG_DIR_ENTRIES: usize = 4000;
/// Every this many entries of the big directory one is removed (a free inode per chunk).
const BIG_DIR_REMOVE_EVERY: usize = 64;
/// Separate extents of the fragmented file (each one block, with a hole after it).
const FRAG_EXTENTS: u64 = 1500;
/// One-block files made and every other one removed, leaving holes in free space.
const HOLE_FILES: usize = 300;

/// What the walk saw of a filesystem: inodes by number and every entry.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Every inode reached, as the walk saw it (under its first name).
    pub inodes: BTreeMap<u64, Seen>,
    /// (directory, name, inode) of every entry.
    pub names: BTreeSet<(u64, String, u64)>,
    pub root: u64,
}

/// The base image, its geometry, its reference and the inodes of its interesting objects.
#[derive(Debug, Clone)]
pub struct Base {
    pub bytes: Vec<u8>,
    pub geometry: Geometry,
    pub reference: Snapshot,
    /// Inode numbers by role ("big", "frag", "long-link", ...).
    pub roles: BTreeMap<&'static str, u64>,
}

fn fs_error(what: &str) -> impl FnOnce(FsError) -> CrashError + '_ {
    move |error| CrashError::Setup(format!("{what}: {error}"))
}

/// Builds the base image (unmounted cleanly) and its reference.
pub fn build_base() -> Result<Base, CrashError> {
    let request = cairn_mkfs::Request {
        block_size: 1024,
        inode_size: Some(512),
        ag_count: Some(4),
        fs_bytes: Some(BASE_DEVICE_BYTES),
        ..cairn_mkfs::Request::default()
    };
    let device = Arc::new(image::format_with(BASE_DEVICE_BYTES, &request)?);
    let options = MountOptions {
        // One block of preallocation: the fragmented file's extents stay apart.
        alloc_size: Some(1024),
        // Every commit its own checkpoint: the log, and so the list of units, does not
        // depend on when the background push runs.
        log_mode: cairn_fs::LogMode::Sync,
        ..MountOptions::default()
    };
    let fs = Filesystem::mount(device.clone(), options).map_err(fs_error("mount"))?;
    let roles = populate(&fs)?;
    fs.unmount().map_err(fs_error("unmount"))?;
    let bytes = device.snapshot();
    let geometry = Superblock::read_primary(&bytes[..65536])
        .map_err(|error| CrashError::Setup(error.to_string()))?
        .geometry;
    let reference = snapshot_of(&bytes)?;
    Ok(Base {
        bytes,
        geometry,
        reference,
        roles,
    })
}

/// Mounts a copy of `bytes`, walks it (reading no file past the device's size: a damaged
/// size may be huge) and unmounts it.
pub fn snapshot_of(bytes: &[u8]) -> Result<Snapshot, CrashError> {
    let device = Arc::new(MemDevice::from_image(bytes.to_vec(), SECTOR_BYTES)?);
    let fs = image::mount(&device).map_err(fs_error("mount"))?;
    let root = fs.root();
    let tree = walk::walk_any_names(&fs, BASE_DEVICE_BYTES)
        .map_err(|e| CrashError::Setup(format!("walk: {e}")))?;
    fs.unmount().map_err(fs_error("unmount"))?;
    let mut snapshot = Snapshot {
        root,
        ..Snapshot::default()
    };
    for (path, seen) in &tree.entries {
        let (parent_path, name) = match path.rsplit_once('/') {
            Some((parent, name)) => (Some(parent), name),
            None => (None, path.as_str()),
        };
        let parent = match parent_path {
            None => root,
            Some(parent) => tree.entries.get(parent).map_or(0, |p| p.inode),
        };
        snapshot
            .names
            .insert((parent, name.to_string(), seen.inode));
        snapshot
            .inodes
            .entry(seen.inode)
            .or_insert_with(|| seen.clone());
    }
    Ok(snapshot)
}

/// Makes everything the base image holds; returns the inodes by role.
fn populate(fs: &Filesystem) -> Result<BTreeMap<&'static str, u64>, CrashError> {
    let who = Credentials::root();
    let root = fs.root();
    let mut roles = BTreeMap::from([("root", root)]);
    let mkdir = |parent, name: &str| {
        fs.mkdir(parent, name.as_bytes(), 0o755, &who)
            .map(|a| a.inode)
            .map_err(fs_error("mkdir"))
    };
    let create = |parent, name: &str, kind| {
        fs.create(parent, name.as_bytes(), kind, 0o644, 0, &who)
            .map(|a| a.inode)
            .map_err(fs_error("create"))
    };
    let a = mkdir(root, "A")?;
    let b = mkdir(root, "B")?;
    let c = mkdir(a, "C")?;
    let e = mkdir(root, "E")?;
    roles.extend([("A", a), ("B", b), ("C", c), ("E", e)]);
    let plain = create(root, "foo", FileKind::Regular)?;
    fs.write(plain, 0, &pattern(1, 0, 16384))
        .map_err(fs_error("write"))?;
    let bar = create(a, "bar", FileKind::Regular)?;
    fs.write(bar, 0, &pattern(2, 0, 6000))
        .map_err(fs_error("write"))?;
    fs.link(bar, b, b"bar2", &who).map_err(fs_error("link"))?;
    create(c, "baz", FileKind::Regular)?;
    let fifo = create(e, "pipe", FileKind::Fifo)?;
    let short_link = fs
        .symlink(root, b"ln", b"foo", &who)
        .map_err(fs_error("symlink"))?
        .inode;
    let long_target: Vec<u8> = (0..2500).map(|i| b'a' + (i % 26) as u8).collect();
    let long_link = fs
        .symlink(c, b"long", &long_target, &who)
        .map_err(fs_error("symlink"))?
        .inode;
    let set = |inode, name: &str, len: usize, id| {
        let value = pattern(id, 0, len);
        fs.setxattr(inode, name.as_bytes(), &value, XattrFlags::Any, &who)
            .map_err(fs_error("setxattr"))
    };
    set(plain, "user.s", 16, 3)?;
    set(a, "user.big", 600, 4)?;
    set(a, "user.more", 300, 5)?;
    set(b, "user.huge", 5000, 6)?;
    set(b, "user.small", 8, 7)?;
    roles.extend([
        ("foo", plain),
        ("bar", bar),
        ("pipe", fifo),
        ("ln", short_link),
        ("long-link", long_link),
    ]);
    roles.insert("big", big_directory(fs)?);
    roles.insert("frag", fragmented_file(fs)?);
    cut_free_space(fs, e)?;
    Ok(roles)
}

/// The big directory: `BIG_DIR_ENTRIES` files and a few subdirectories, then every
/// `BIG_DIR_REMOVE_EVERY`-th file removed.
fn big_directory(fs: &Filesystem) -> Result<u64, CrashError> {
    let who = Credentials::root();
    let big = fs
        .mkdir(fs.root(), b"big", 0o755, &who)
        .map_err(fs_error("mkdir"))?
        .inode;
    for index in 0..BIG_DIR_ENTRIES {
        let name = format!("entry-{index:05}");
        if index % 1000 == 500 {
            fs.mkdir(big, name.as_bytes(), 0o755, &who)
                .map_err(fs_error("mkdir"))?;
            continue;
        }
        let inode = fs
            .create(big, name.as_bytes(), FileKind::Regular, 0o644, 0, &who)
            .map_err(fs_error("create"))?
            .inode;
        fs.forget(inode, 1);
    }
    for index in (7..BIG_DIR_ENTRIES).step_by(BIG_DIR_REMOVE_EVERY) {
        let name = format!("entry-{index:05}");
        fs.unlink(big, name.as_bytes(), &who)
            .map_err(fs_error("unlink"))?;
    }
    Ok(big)
}

/// A file of `FRAG_EXTENTS` one-block extents with a one-block hole after each.
fn fragmented_file(fs: &Filesystem) -> Result<u64, CrashError> {
    let who = Credentials::root();
    let frag = fs
        .create(fs.root(), b"frag", FileKind::Regular, 0o644, 0, &who)
        .map_err(fs_error("create"))?
        .inode;
    let block = 1024u64;
    for index in 0..FRAG_EXTENTS {
        let offset = 2 * index * block;
        fs.write(frag, offset, &pattern(100 + index, offset, block as usize))
            .map_err(fs_error("write"))?;
    }
    Ok(frag)
}

/// One-block files in `dir`, every other one removed again.
fn cut_free_space(fs: &Filesystem, dir: u64) -> Result<(), CrashError> {
    let who = Credentials::root();
    for index in 0..HOLE_FILES {
        let name = format!("hole-{index:04}");
        let inode = fs
            .create(dir, name.as_bytes(), FileKind::Regular, 0o644, 0, &who)
            .map_err(fs_error("create"))?
            .inode;
        fs.write(inode, 0, &pattern(5000 + index as u64, 0, 1024))
            .map_err(fs_error("write"))?;
        fs.forget(inode, 1);
    }
    for index in (0..HOLE_FILES).step_by(2) {
        let name = format!("hole-{index:04}");
        fs.unlink(dir, name.as_bytes(), &who)
            .map_err(fs_error("unlink"))?;
    }
    Ok(())
}
