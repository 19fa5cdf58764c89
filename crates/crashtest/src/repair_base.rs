//! The image the repair sweep damages: 1 KiB blocks and 512-byte inodes in four AGs (three
//! superblock copies outvote a damaged primary), so that
//! every tree has more than one level: a directory of 4,000 entries (data blocks and a
//! two-level hash index, a chunk every 64 inodes: a two-level inode tree, and one free
//! inode per chunk: a two-level free-inode tree), a file of 1,500 separate extents (an
//! extent tree with node and leaf blocks), free space cut into 150 holes (two-level
//! free-space trees), short-form and leaf-block attributes and a remote attribute value,
//! inline and remote symlinks, a FIFO, hard links and nested directories, and the attribute
//! forms of issue 19: a file of 400 attributes (the index form: a two-level index tree over
//! some twenty leaves, with remote values and an ACL among them) and POSIX ACLs in an
//! inode's short form (a file's access ACL, a directory's access and default ACLs) and in a
//! leaf block; issue 31's inode flags, an inherited extent size hint and project ids;
//! and a whiteout and an unnamed O_TMPFILE file on its unlinked list (issue 32).
//!
//! It also takes the reference the sweep compares a repaired image with: every inode the
//! walk reaches with its contents, target and attributes, and every (directory, name, inode)
//! entry.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use cairn_blockdev::MemDevice;
use cairn_format::acl::{Acl, AclEntry, AclTag};
use cairn_format::{Geometry, Superblock};
use cairn_fs::{
    Credentials, FileAttributes, FileKind, Filesystem, FsError, InodeFlags, MountOptions,
    XattrFlags,
};

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
/// Attributes of the file in index form (with 1 KiB blocks: about twenty leaves, and an
/// index tree of seven leaves under a root).
const INDEX_FORM_ATTRS: usize = 400;
const ACCESS_ACL: &[u8] = b"system.posix_acl_access";
const DEFAULT_ACL: &[u8] = b"system.posix_acl_default";

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

/// Mounts a copy of `bytes`, walks it (see `walk_snapshot`) and unmounts it.
pub fn snapshot_of(bytes: &[u8]) -> Result<Snapshot, CrashError> {
    let device = Arc::new(MemDevice::from_image(bytes.to_vec(), SECTOR_BYTES)?);
    let fs = image::mount(&device).map_err(fs_error("mount"))?;
    let snapshot = walk_snapshot(&fs)?;
    fs.unmount().map_err(fs_error("unmount"))?;
    Ok(snapshot)
}

/// What the walk of the mounted `fs` sees (reading no file past the base device's size: a
/// damaged size may be huge).
pub fn walk_snapshot(fs: &Filesystem) -> Result<Snapshot, CrashError> {
    let root = fs.root();
    let tree = walk::walk_any_names(fs, BASE_DEVICE_BYTES)
        .map_err(|e| CrashError::Setup(format!("walk: {e}")))?;
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
    roles.extend(acl_holders(fs, b)?);
    roles.insert("many-attrs", index_form_file(fs)?);
    roles.insert("big", big_directory(fs)?);
    let frag = fragmented_file(fs)?;
    roles.insert("frag", frag);
    roles.insert("frag-clone", cloned_file(fs, frag)?);
    roles.extend(container_objects(fs, e)?);
    cut_free_space(fs, e)?;
    roles.insert("flagged", flagged_inodes(fs, e, fifo)?);
    Ok(roles)
}

/// The inode flags, extent size hints and project ids of issue 31: directory `dir` gets
/// sync, no-atime, no-dump, project inheritance, a 32 KiB hint, a 64 KiB CoW extent size
/// hint (#30) and project id 42, which
/// the file made in it then inherits (and holds data under); `fifo` becomes immutable.
/// Set last, so the files made before allocate as they always did.
fn flagged_inodes(fs: &Filesystem, dir: u64, fifo: u64) -> Result<u64, CrashError> {
    let who = Credentials::root();
    let attributes = FileAttributes {
        flags: InodeFlags {
            sync: true,
            no_atime: true,
            no_dump: true,
            project_inherit: true,
            ..InodeFlags::default()
        },
        extent_size_hint: 32 << 10,
        project_id: 42,
        cow_extent_size_hint: 64 << 10,
    };
    fs.set_file_attributes(dir, &attributes, &who, true)
        .map_err(fs_error("set_file_attributes"))?;
    let flagged = fs
        .create(dir, b"flagged", FileKind::Regular, 0o644, 0, &who)
        .map_err(fs_error("create"))?
        .inode;
    fs.write(flagged, 0, &pattern(9, 0, 5000))
        .map_err(fs_error("write"))?;
    let mut fixed = fs
        .file_attributes(fifo)
        .map_err(fs_error("file_attributes"))?
        .attributes;
    fixed.flags.immutable = true;
    fs.set_file_attributes(fifo, &fixed, &who, true)
        .map_err(fs_error("set_file_attributes"))?;
    Ok(flagged)
}

/// Container storage's objects (issue 32): a whiteout (`rename_whiteout` leaves a character
/// device 0/0 under the old name) and an unnamed O_TMPFILE file holding data, left open, so
/// that the clean unmount leaves it on its unlinked list as a crash would (the next mount
/// frees it; nothing names it, so the reference never holds it).
fn container_objects(fs: &Filesystem, dir: u64) -> Result<Vec<(&'static str, u64)>, CrashError> {
    let who = Credentials::root();
    fs.create(dir, b"moved-away", FileKind::Regular, 0o644, 0, &who)
        .map_err(fs_error("create"))?;
    let mode = cairn_fs::RenameMode::Replace;
    fs.rename_whiteout(dir, b"moved-away", dir, b"moved", mode, &who)
        .map_err(fs_error("rename_whiteout"))?;
    let whiteout = fs
        .lookup(dir, b"moved-away")
        .map_err(fs_error("lookup"))?
        .inode;
    let unnamed = fs
        .tmpfile(fs.root(), 0o600, false, &who)
        .map_err(fs_error("tmpfile"))?
        .inode;
    // Never released: open at the unmount.
    fs.open(unnamed, true, false, false, &who)
        .map_err(fs_error("open"))?;
    fs.write(unnamed, 0, &pattern(12, 0, 5000))
        .map_err(fs_error("write"))?;
    Ok(vec![("whiteout", whiteout), ("unnamed", unnamed)])
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

/// A clone of `frag` (reflink: its 1,500 extents shared, a refcount record each, so the
/// refcount trees have node levels) and a clone of the clone's first half at another place
/// (those blocks counted 3).
fn cloned_file(fs: &Filesystem, frag: u64) -> Result<u64, CrashError> {
    let who = Credentials::root();
    let clone = fs
        .create(fs.root(), b"frag-clone", FileKind::Regular, 0o644, 0, &who)
        .map_err(fs_error("create"))?
        .inode;
    let size = 2 * FRAG_EXTENTS * 1024;
    fs.copy_file_range(frag, 0, clone, 0, size)
        .map_err(fs_error("copy_file_range"))?;
    fs.copy_file_range(clone, 0, clone, size + 4096, size / 2)
        .map_err(fs_error("copy_file_range"))?;
    Ok(clone)
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

/// An ACL granting a named user and a named group, with its mask (`extra`: more entries,
/// to tell values apart).
fn acl_value(user: u32, group: u32, extra: u32) -> Result<Vec<u8>, CrashError> {
    let mut entries = vec![AclEntry {
        tag: AclTag::UserObj,
        perm: 7,
    }];
    entries.extend((0..=extra).map(|index| AclEntry {
        tag: AclTag::User(user + index),
        perm: 6,
    }));
    entries.extend([
        AclEntry {
            tag: AclTag::GroupObj,
            perm: 5,
        },
        AclEntry {
            tag: AclTag::Group(group),
            perm: 4,
        },
        AclEntry {
            tag: AclTag::Mask,
            perm: 7,
        },
        AclEntry {
            tag: AclTag::Other,
            perm: 1,
        },
    ]);
    Acl { entries }
        .encode()
        .map_err(|e| CrashError::Setup(format!("acl: {e}")))
}

/// ACLs in inodes' short forms (a file's access ACL; a directory's access and default ACLs)
/// and in `leaf_dir`'s attribute leaf block (its access and default ACLs).
fn acl_holders(fs: &Filesystem, leaf_dir: u64) -> Result<Vec<(&'static str, u64)>, CrashError> {
    let who = Credentials::root();
    let set = |inode, name: &[u8], value: Vec<u8>| {
        fs.setxattr(inode, name, &value, XattrFlags::Any, &who)
            .map_err(fs_error("setxattr"))
    };
    let file = fs
        .create(fs.root(), b"acl-file", FileKind::Regular, 0o640, 0, &who)
        .map_err(fs_error("create"))?
        .inode;
    fs.write(file, 0, &pattern(8, 0, 3000))
        .map_err(fs_error("write"))?;
    set(file, ACCESS_ACL, acl_value(1000, 100, 0)?)?;
    let dir = fs
        .mkdir(fs.root(), b"acl-dir", 0o750, &who)
        .map_err(fs_error("mkdir"))?
        .inode;
    set(dir, ACCESS_ACL, acl_value(2000, 200, 1)?)?;
    set(dir, DEFAULT_ACL, acl_value(3000, 300, 2)?)?;
    set(leaf_dir, ACCESS_ACL, acl_value(4000, 400, 3)?)?;
    set(leaf_dir, DEFAULT_ACL, acl_value(5000, 500, 4)?)?;
    Ok(vec![("acl-file", file), ("acl-dir", dir)])
}

/// A file whose attributes need the index form: `INDEX_FORM_ATTRS` short values, two remote
/// ones and an access ACL.
fn index_form_file(fs: &Filesystem) -> Result<u64, CrashError> {
    let who = Credentials::root();
    let file = fs
        .create(fs.root(), b"many-attrs", FileKind::Regular, 0o644, 0, &who)
        .map_err(fs_error("create"))?
        .inode;
    let set = |name: &[u8], value: &[u8]| {
        fs.setxattr(file, name, value, XattrFlags::Any, &who)
            .map_err(fs_error("setxattr"))
    };
    for index in 0..INDEX_FORM_ATTRS {
        let name = format!("user.attr-{index:04}");
        set(name.as_bytes(), &pattern(10_000 + index as u64, 0, 24))?;
        if index == INDEX_FORM_ATTRS / 3 {
            set(b"user.remote-a", &pattern(9, 0, 3000))?;
            set(ACCESS_ACL, &acl_value(6000, 600, 5)?)?;
        }
    }
    set(b"user.remote-b", &pattern(11, 0, 1500))?;
    Ok(file)
}
