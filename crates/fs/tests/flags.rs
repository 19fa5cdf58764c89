//! Inode flags and the attributes FS_IOC_FSSETXATTR sets, through the library: a model of
//! what the immutable and append-only flags refuse (XFS's rules, which the mount tests in
//! crates/fuse/tests/flags.rs compare with a kernel XFS), the extent size hint's rules,
//! inheritance, persistence, and the sync flag's durability.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;

use cairn_blockdev::MemDevice;
use cairn_fs::{
    FallocateMode, FileAttributes, FileKind, Filesystem, FsError, InodeFlags, OpenMode, SetAttr,
    TimeOrNow, WriteOrigin, XattrFlags,
};
use common::{fsck_clean, make_device, mount, mount_with, root, user, write_behind};
use proptest::prelude::*;

const MIB: u64 = 1 << 20;

fn new_file(fs: &Filesystem, parent: u64, name: &[u8]) -> u64 {
    fs.create(parent, name, FileKind::Regular, 0o644, 0, &root())
        .unwrap()
        .inode
}

fn set_flags(fs: &Filesystem, inode: u64, change: impl FnOnce(&mut InodeFlags)) {
    let mut attributes = fs.file_attributes(inode).unwrap().attributes;
    change(&mut attributes.flags);
    fs.set_file_attributes(inode, &attributes, &root(), true)
        .unwrap();
}

fn attributes(fs: &Filesystem, inode: u64) -> FileAttributes {
    fs.file_attributes(inode).unwrap().attributes
}

/// One step on the file "f" (also named "g" while `Link` made that name).
#[derive(Debug, Clone)]
enum Op {
    Flags {
        immutable: bool,
        append_only: bool,
    },
    Open {
        write: bool,
        append: bool,
        truncate: bool,
    },
    /// A write that came as `via` says.
    Write {
        offset: u64,
        len: usize,
        byte: u8,
        via: Via,
    },
    /// An append as a writer opened now with O_APPEND makes it, with the cache's whole
    /// page: from below the old end of file, the old bytes then `len` new ones.
    AppendPage {
        back: u64,
        len: usize,
        byte: u8,
    },
    Truncate {
        size: u64,
        through_writer: bool,
    },
    /// Closes the writer opened before the flags, or opens it again (a writer opened now:
    /// the flags may refuse it).
    ToggleWriter,
    Chmod,
    Touch,
    SetTimes,
    SetXattr,
    Link,
    Unlink,
    Rename,
    Fallocate {
        punch: bool,
    },
}

/// How a write reaches the filesystem.
#[derive(Debug, Clone, Copy)]
enum Via {
    /// Through the handle opened before any flag was set.
    Earlier,
    /// From the kernel's writeback cache.
    Cache,
    /// Through a handle opened now (O_APPEND, so an append-only file allows it).
    Now,
    /// A library write with no handle.
    Plain,
}

fn any_via() -> impl Strategy<Value = Via> {
    prop_oneof![
        Just(Via::Earlier),
        Just(Via::Cache),
        Just(Via::Now),
        Just(Via::Plain)
    ]
}

fn any_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (any::<bool>(), any::<bool>())
            .prop_map(|(immutable, append_only)| Op::Flags { immutable, append_only }),
        2 => (any::<bool>(), any::<bool>(), any::<bool>())
            .prop_map(|(write, append, truncate)| Op::Open { write, append, truncate }),
        3 => (0u64..12_000, 1usize..3000, 1u8..255, any_via())
            .prop_map(|(offset, len, byte, via)| Op::Write { offset, len, byte, via }),
        2 => (0u64..5000, 1usize..3000, 1u8..255)
            .prop_map(|(back, len, byte)| Op::AppendPage { back, len, byte }),
        1 => (0u64..10_000, any::<bool>())
            .prop_map(|(size, through_writer)| Op::Truncate { size, through_writer }),
        1 => Just(Op::ToggleWriter),
        1 => Just(Op::Chmod),
        1 => Just(Op::Touch),
        1 => Just(Op::SetTimes),
        1 => Just(Op::SetXattr),
        1 => Just(Op::Link),
        1 => Just(Op::Unlink),
        1 => Just(Op::Rename),
        1 => any::<bool>().prop_map(|punch| Op::Fallocate { punch }),
    ]
}

/// What the file should hold and carry.
#[derive(Debug, Default)]
struct Model {
    data: Vec<u8>,
    immutable: bool,
    append_only: bool,
    linked: bool,
    /// The file's name ("f", or "h" after a rename).
    renamed: bool,
    /// The writer opened before the flags, while it is open.
    writer: Option<u64>,
}

impl Model {
    fn protected(&self) -> bool {
        self.immutable || self.append_only
    }

    /// Whether a write of `bytes` at `offset` by a writer opened now may happen (`earlier`:
    /// one opened before the flags), and applies it.
    fn write(&mut self, offset: u64, bytes: &[u8], earlier: bool) -> bool {
        let offset = offset as usize;
        if self.append_only && !earlier && offset < self.data.len() {
            let overlap = (self.data.len() - offset).min(bytes.len());
            if self.data[offset..offset + overlap] != bytes[..overlap] {
                return false;
            }
        }
        let end = offset + bytes.len();
        if self.data.len() < end {
            self.data.resize(end, 0);
        }
        self.data[offset..end].copy_from_slice(bytes);
        true
    }
}

/// Writes `bytes` as `via` says (`writer`: the handle opened before the flags).
fn write_via(
    fs: &Filesystem,
    file: u64,
    writer: Option<u64>,
    offset: u64,
    bytes: &[u8],
    via: Via,
) -> Result<(), FsError> {
    let mut origin = WriteOrigin::default();
    let now = match via {
        Via::Earlier => {
            origin.handle = writer;
            None
        }
        Via::Cache => {
            origin.from_cache = true;
            None
        }
        Via::Now => {
            let mode = OpenMode {
                write: true,
                append: true,
                ..OpenMode::default()
            };
            let handle = fs.open_with(file, &mode, &root())?;
            origin.handle = Some(handle.handle);
            Some(handle)
        }
        Via::Plain => None,
    };
    let written = fs.write_from(file, offset, bytes, &origin).map(|_| ());
    if let Some(handle) = now {
        fs.release(handle).unwrap();
    }
    written
}

/// Runs `op` on the filesystem and the model, and compares what each allowed and the
/// file's contents.
fn step(fs: &Filesystem, dir: u64, file: u64, model: &mut Model, op: &Op) {
    let writer = model.writer;
    let who = root();
    let name: &[u8] = if model.renamed { b"h" } else { b"f" };
    let (got, want): (Result<(), FsError>, bool) = match *op {
        Op::Flags {
            immutable,
            append_only,
        } => {
            set_flags(fs, file, |f| {
                f.immutable = immutable;
                f.append_only = append_only;
            });
            (model.immutable, model.append_only) = (immutable, append_only);
            (Ok(()), true)
        }
        Op::Open {
            write,
            append,
            truncate,
        } => {
            let mode = OpenMode {
                write,
                append,
                truncate,
                direct: false,
            };
            let opened = fs.open_with(file, &mode, &who);
            let allowed = match () {
                _ if model.immutable => !write && !truncate,
                _ if model.append_only => (!write || append) && !truncate,
                _ => true,
            };
            if allowed && truncate {
                model.data.clear();
            }
            let got = opened.map(|handle| fs.release(handle).unwrap());
            (got, allowed)
        }
        Op::Write {
            offset,
            len,
            byte,
            via,
        } => {
            if matches!(via, Via::Earlier) && writer.is_none() {
                return;
            }
            let bytes = vec![byte; len];
            // The cache's data is an earlier writer's only while one is open.
            let earlier = writer.is_some() && matches!(via, Via::Earlier | Via::Cache);
            let may_open = !model.immutable || earlier || matches!(via, Via::Cache);
            let allowed = may_open && model.write(offset, &bytes, earlier);
            (write_via(fs, file, writer, offset, &bytes, via), allowed)
        }
        Op::AppendPage { back, len, byte } => {
            let start = (model.data.len() as u64).saturating_sub(back);
            let mut bytes = model.data[start as usize..].to_vec();
            bytes.extend(std::iter::repeat_n(byte, len));
            let allowed = !model.immutable && model.write(start, &bytes, false);
            let got = write_via(fs, file, writer, start, &bytes, Via::Now);
            (got, allowed)
        }
        Op::Truncate {
            size,
            through_writer,
        } => {
            let through_writer = through_writer && writer.is_some();
            let changes = SetAttr {
                size: Some(size),
                file: writer.filter(|_| through_writer),
                ..SetAttr::default()
            };
            let allowed = !model.append_only && (!model.immutable || through_writer);
            if allowed {
                model.data.resize(size as usize, 0);
            }
            (fs.setattr(file, &changes, &who).map(|_| ()), allowed)
        }
        Op::ToggleWriter => {
            if let Some(handle) = model.writer.take() {
                let file = cairn_fs::OpenFile {
                    inode: file,
                    handle,
                };
                (fs.release(file), true)
            } else {
                let opened = fs.open(file, true, false, false, &root());
                model.writer = opened.as_ref().ok().map(|file| file.handle);
                (opened.map(|_| ()), !model.protected())
            }
        }
        Op::Chmod => {
            let changes = SetAttr {
                mode: Some(0o600),
                ..SetAttr::default()
            };
            (
                fs.setattr(file, &changes, &who).map(|_| ()),
                !model.protected(),
            )
        }
        Op::Touch => {
            let changes = SetAttr {
                atime: Some(TimeOrNow::Now),
                mtime: Some(TimeOrNow::Now),
                ..SetAttr::default()
            };
            let got = fs.setattr(file, &changes, &who).map(|_| ());
            (got, !model.immutable)
        }
        Op::SetTimes => {
            let then = std::time::UNIX_EPOCH + std::time::Duration::from_secs(5);
            let changes = SetAttr {
                atime: Some(TimeOrNow::Time(then)),
                mtime: Some(TimeOrNow::Time(then)),
                ..SetAttr::default()
            };
            let got = fs.setattr(file, &changes, &who).map(|_| ());
            (got, !model.protected())
        }
        Op::SetXattr => {
            let got = fs.setxattr(file, b"user.x", b"1", XattrFlags::Any, &who);
            (got, !model.protected())
        }
        Op::Link if model.linked => return,
        Op::Link => {
            let got = fs.link(file, dir, b"g", &who).map(|_| fs.forget(file, 1));
            let allowed = !model.protected();
            model.linked |= allowed;
            (got, allowed)
        }
        Op::Unlink if !model.linked => return,
        Op::Unlink => {
            let got = fs.unlink(dir, b"g", &who);
            let allowed = !model.protected();
            model.linked &= !allowed;
            (got, allowed)
        }
        Op::Rename => {
            let to: &[u8] = if model.renamed { b"f" } else { b"h" };
            let got = fs.rename(dir, name, dir, to, cairn_fs::RenameMode::Replace, &who);
            let allowed = !model.protected();
            model.renamed ^= allowed;
            (got, allowed)
        }
        Op::Fallocate { punch } => {
            let size = model.data.len() as u64;
            let (mode, length) = match punch {
                true if size == 0 => return,
                true => (FallocateMode::PunchHole, size),
                false => (FallocateMode::Allocate { keep_size: true }, 8192),
            };
            let allowed = !(model.immutable || (model.append_only && punch));
            if allowed && punch {
                model.data.fill(0);
            }
            (fs.fallocate(file, 0, length, mode), allowed)
        }
    };
    match (got, want) {
        (Ok(()), true) | (Err(FsError::NotPermitted), false) => {}
        (got, want) => panic!("{op:?} on {model:?}: got {got:?}, want allowed {want}"),
    }
    let size = fs.getattr(file).unwrap().size;
    assert_eq!(size, model.data.len() as u64, "size after {op:?}");
    let read = fs.read(file, 0, size as u32).unwrap();
    assert!(read == model.data, "contents after {op:?}");
}

fn run_model(ops: &[Op], options: cairn_fs::MountOptions) {
    let device = make_device(32 << 20);
    let fs = mount_with(&device, options);
    let dir = fs.mkdir(fs.root(), b"d", 0o755, &root()).unwrap().inode;
    let file = new_file(&fs, dir, b"f");
    let writer = fs.open(file, true, false, false, &root()).unwrap();
    let mut model = Model {
        writer: Some(writer.handle),
        ..Model::default()
    };
    for op in ops {
        step(&fs, dir, file, &mut model, op);
    }
    if let Some(handle) = model.writer {
        fs.release(cairn_fs::OpenFile {
            inode: file,
            handle,
        })
        .unwrap();
    }
    set_flags(&fs, file, |f| *f = InodeFlags::default());
    fs.unmount().unwrap();
    fsck_clean(&device);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    // Random flag changes and operations on one file, each checked against the model of
    // what XFS allows, with the contents compared after every step; with and without
    // write-behind. Then fsck.
    #[test]
    fn flags_refuse_what_xfs_refuses(
        ops in proptest::collection::vec(any_op(), 1..40), cached in any::<bool>(),
    ) {
        let options = match cached {
            true => write_behind(4 << 20),
            false => cairn_fs::MountOptions::default(),
        };
        run_model(&ops, options);
    }
}

// An immutable directory takes no entry changes and no attribute changes; its files keep
// their own rules. An append-only directory takes new entries but gives none up, and is
// not renamed itself.
#[test]
fn directory_flags_guard_entries() {
    let device = make_device(32 << 20);
    let fs = mount(&device);
    let who = root();
    let idir = fs.mkdir(fs.root(), b"i", 0o755, &who).unwrap().inode;
    let inside = new_file(&fs, idir, b"in");
    set_flags(&fs, idir, |f| f.immutable = true);
    let refused = |result: Result<(), FsError>| matches!(result, Err(FsError::NotPermitted));
    let create = fs.create(idir, b"new", FileKind::Regular, 0o644, 0, &who);
    assert!(refused(create.map(|_| ())));
    assert!(refused(fs.mkdir(idir, b"sub", 0o755, &who).map(|_| ())));
    assert!(refused(fs.unlink(idir, b"in", &who)));
    let mode = cairn_fs::RenameMode::Replace;
    assert!(refused(fs.rename(
        idir,
        b"in",
        fs.root(),
        b"out",
        mode,
        &who
    )));
    let chmod = SetAttr {
        mode: Some(0o700),
        ..SetAttr::default()
    };
    assert!(refused(fs.setattr(idir, &chmod, &who).map(|_| ())));
    fs.write(inside, 0, b"still writable").unwrap();
    set_flags(&fs, idir, |f| f.immutable = false);
    set_flags(&fs, idir, |f| f.append_only = true);
    new_file(&fs, idir, b"added");
    assert!(refused(fs.unlink(idir, b"added", &who)));
    assert!(refused(fs.rename(idir, b"in", idir, b"in2", mode, &who)));
    assert!(refused(fs.rename(
        fs.root(),
        b"i",
        fs.root(),
        b"i2",
        mode,
        &who
    )));
    set_flags(&fs, idir, |f| f.append_only = false);
    fs.unlink(idir, b"added", &who).unwrap();
    fs.unmount().unwrap();
    fsck_clean(&device);
}

// Only the owner or root changes flags; the immutable and append-only flags need the
// capability; an immutable file still takes other flag changes (as XFS).
#[test]
fn who_may_change_flags() {
    let device = make_device(32 << 20);
    let fs = mount(&device);
    let nobody = user(65534);
    let mine = new_file(&fs, fs.root(), b"mine");
    let chown = SetAttr {
        uid: Some(65534),
        ..SetAttr::default()
    };
    fs.setattr(mine, &chown, &root()).unwrap();
    let theirs = new_file(&fs, fs.root(), b"theirs");
    let mut wanted = attributes(&fs, mine);
    wanted.flags.no_dump = true;
    wanted.flags.sync = true;
    fs.set_file_attributes(mine, &wanted, &nobody, false)
        .unwrap();
    assert_eq!(attributes(&fs, mine), wanted);
    let refused = fs.set_file_attributes(theirs, &wanted, &nobody, false);
    assert!(matches!(refused, Err(FsError::NotPermitted)));
    wanted.flags.immutable = true;
    let refused = fs.set_file_attributes(mine, &wanted, &nobody, false);
    assert!(matches!(refused, Err(FsError::NotPermitted)));
    fs.set_file_attributes(mine, &wanted, &nobody, true)
        .unwrap();
    wanted.flags.no_atime = true;
    fs.set_file_attributes(mine, &wanted, &nobody, false)
        .unwrap();
    assert_eq!(attributes(&fs, mine).flags, wanted.flags);
    let flags = fs.getattr(mine).unwrap().flags;
    assert!(flags.immutable && flags.no_atime && !flags.append_only);
    fs.unmount().unwrap();
    fsck_clean(&device);
}

// The extent size hint: a multiple of the block size, at most half an AG, fixed once a
// file has data, nothing on a symlink; a directory's hint passes to new files and
// directories (the latter pass it on), with the sync, no-atime and no-dump flags and, under
// project inheritance, the project id. All of it survives a remount.
#[test]
fn hints_and_inheritance() {
    let device = make_device(64 << 20);
    let fs = mount(&device);
    let who = root();
    let file = new_file(&fs, fs.root(), b"f");
    let invalid = |inode: u64, hint: u64| {
        let new = FileAttributes {
            extent_size_hint: hint,
            ..attributes(&fs, inode)
        };
        let set = fs.set_file_attributes(inode, &new, &who, true);
        matches!(set, Err(FsError::InvalidArgument(_)))
    };
    assert!(invalid(file, MIB + 512));
    assert!(invalid(file, 1 << 40));
    fs.set_extent_size_hint(file, MIB, false).unwrap();
    assert_eq!(attributes(&fs, file).extent_size_hint, MIB);
    fs.write(file, 0, b"data").unwrap();
    assert!(invalid(file, 2 * MIB));
    fs.set_extent_size_hint(file, MIB, false).unwrap();
    let link = fs.symlink(fs.root(), b"l", b"f", &who).unwrap().inode;
    assert!(invalid(link, MIB));
    let dir = fs.mkdir(fs.root(), b"d", 0o755, &who).unwrap().inode;
    assert!(fs.set_extent_size_hint(dir, MIB, false).is_err());
    let new = FileAttributes {
        flags: InodeFlags {
            sync: true,
            no_atime: true,
            no_dump: true,
            project_inherit: true,
            ..InodeFlags::default()
        },
        extent_size_hint: 4 * MIB,
        project_id: 42,
        cow_extent_size_hint: 0,
    };
    fs.set_file_attributes(dir, &new, &who, true).unwrap();
    let child = new_file(&fs, dir, b"child");
    let sub = fs.mkdir(dir, b"sub", 0o755, &who).unwrap().inode;
    let grandchild = new_file(&fs, sub, b"grandchild");
    let fifo = fs
        .create(dir, b"fifo", FileKind::Fifo, 0o644, 0, &who)
        .unwrap()
        .inode;
    let child_flags = InodeFlags {
        project_inherit: false,
        ..new.flags
    };
    let check = |fs: &Filesystem| {
        for (inode, hint, flags) in [
            (child, 4 * MIB, child_flags),
            (sub, 4 * MIB, new.flags),
            (grandchild, 4 * MIB, child_flags),
            (fifo, 0, child_flags),
        ] {
            let got = attributes(fs, inode);
            assert_eq!((got.extent_size_hint, got.flags), (hint, flags), "{inode}");
            assert_eq!(got.project_id, 42);
        }
        assert_eq!(attributes(fs, dir), new);
    };
    check(&fs);
    fs.unmount().unwrap();
    fsck_clean(&device);
    let fs = mount(&device);
    check(&fs);
    fs.unmount().unwrap();
}

// The no-atime flag keeps a read from moving the access time, which relatime would move.
#[test]
fn no_atime_flag_keeps_access_time() {
    let device = make_device(32 << 20);
    let fs = mount(&device);
    let (plain, kept) = (
        new_file(&fs, fs.root(), b"p"),
        new_file(&fs, fs.root(), b"k"),
    );
    set_flags(&fs, kept, |f| f.no_atime = true);
    let old = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000);
    for inode in [plain, kept] {
        fs.write(inode, 0, b"contents").unwrap();
        let changes = SetAttr {
            atime: Some(TimeOrNow::Time(old)),
            ..SetAttr::default()
        };
        fs.setattr(inode, &changes, &root()).unwrap();
        fs.read(inode, 0, 8).unwrap();
    }
    assert_ne!(fs.getattr(plain).unwrap().atime, old);
    assert_eq!(fs.getattr(kept).unwrap().atime, old);
    fs.unmount().unwrap();
}

/// A copy of what `device` holds durably, as a crash right now would leave it, mounted.
fn crash_and_mount(device: &Arc<MemDevice>) -> Filesystem {
    let image = device.durable_image();
    let crashed = MemDevice::from_image(image, common::SECTOR).unwrap();
    mount(&Arc::new(crashed))
}

// A write to a file with the sync flag is durable when it returns, with write-behind on
// too: a crash right after it keeps the data and the size; its writers get direct handles.
#[test]
fn sync_flag_makes_writes_durable() {
    let device = make_device(32 << 20);
    let fs = mount_with(&device, write_behind(4 << 20));
    let dir = fs.mkdir(fs.root(), b"d", 0o755, &root()).unwrap().inode;
    set_flags(&fs, dir, |f| f.sync = true);
    let file = new_file(&fs, dir, b"journal");
    assert!(attributes(&fs, file).flags.sync);
    let handle = fs.open(file, true, false, false, &root()).unwrap();
    assert!(cairn_fs::handle_is_direct(handle.handle));
    for round in 0..3u64 {
        let record = vec![round as u8 + 1; 1000];
        fs.write(file, round * 1000, &record).unwrap();
        let crashed = crash_and_mount(&device);
        let size = (round + 1) * 1000;
        assert_eq!(crashed.getattr(file).unwrap().size, size);
        let data = crashed.read(file, round * 1000, 1000).unwrap();
        assert_eq!(data, record);
        drop(crashed);
    }
    fs.release(handle).unwrap();
    fs.unmount().unwrap();
}
