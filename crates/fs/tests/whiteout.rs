//! RENAME_WHITEOUT through the library API: the source's name becomes a whiteout (a
//! character device 0/0) in the rename's transaction, with every kind of target, across
//! directories, refused pairs and failures leaving nothing behind, and crashes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;

use cairn_blockdev::MemDevice;
use cairn_fs::{Attr, Credentials, FileKind, Filesystem, FsError, RenameMode};
use common::{fsck_clean, make_device, mount, root, user};

fn is_whiteout(attr: &Attr) -> bool {
    attr.kind == FileKind::CharDevice && attr.rdev == 0 && attr.mode == 0 && attr.nlink == 1
}

fn file(fs: &Filesystem, dir: u64, name: &[u8]) -> u64 {
    fs.create(dir, name, FileKind::Regular, 0o644, 0, &root())
        .unwrap()
        .inode
}

/// Inodes in use (the free-inode count moves with every allocation and free).
fn inodes_used(fs: &Filesystem) -> u64 {
    let statfs = fs.statfs().unwrap();
    statfs.inodes - statfs.inodes_free
}

// A file moves to a new name (in the same directory, then into another one, replacing a
// file there) and leaves a whiteout under its old name: a character device 0/0 of mode 0,
// owned by the caller, one link; the moved file keeps its inode and data.
#[test]
fn the_source_name_becomes_a_whiteout() {
    let device = make_device(64 << 20);
    let fs = mount(&device);
    let top = fs.root();
    let other = fs.mkdir(top, b"other", 0o777, &root()).unwrap().inode;
    let moved = file(&fs, top, b"a");
    fs.write(moved, 0, b"data").unwrap();
    fs.rename_whiteout(top, b"a", top, b"b", RenameMode::Replace, &root())
        .unwrap();
    let whiteout = fs.lookup(top, b"a").unwrap();
    assert!(is_whiteout(&whiteout), "{whiteout:?}");
    assert_eq!(fs.lookup(top, b"b").unwrap().inode, moved);
    let replaced = file(&fs, other, b"c");
    fs.forget(replaced, 1);
    fs.rename_whiteout(top, b"b", other, b"c", RenameMode::Replace, &user(0))
        .unwrap();
    assert!(is_whiteout(&fs.lookup(top, b"b").unwrap()));
    assert_eq!(fs.lookup(other, b"c").unwrap().inode, moved);
    assert!(fs.getattr(replaced).is_err(), "the replaced file is freed");
    assert_eq!(fs.read(moved, 0, 10).unwrap(), b"data");
    fs.unmount().unwrap();
    fsck_clean(&device);
}

// A directory moved to another parent leaves a whiteout: the old parent loses the
// directory's link, the new one gains it (fsck checks the counts), and the whiteout is a
// file, not a directory. No-replace works with a whiteout too.
#[test]
fn a_directory_leaves_a_whiteout() {
    let device = make_device(64 << 20);
    let fs = mount(&device);
    let top = fs.root();
    let from = fs.mkdir(top, b"from", 0o755, &root()).unwrap().inode;
    let to = fs.mkdir(top, b"to", 0o755, &root()).unwrap().inode;
    let moved = fs.mkdir(from, b"d", 0o755, &root()).unwrap().inode;
    file(&fs, moved, b"inside");
    let before = fs.getattr(from).unwrap().nlink;
    fs.rename_whiteout(from, b"d", to, b"d", RenameMode::NoReplace, &root())
        .unwrap();
    assert_eq!(fs.getattr(from).unwrap().nlink, before - 1);
    assert_eq!(fs.getattr(to).unwrap().nlink, 3);
    assert!(is_whiteout(&fs.lookup(from, b"d").unwrap()));
    assert_eq!(fs.lookup(to, b"d").unwrap().inode, moved);
    fs.unmount().unwrap();
    fsck_clean(&device);
}

// Refused renames leave no whiteout and no inode behind: no-replace over an existing name
// (Exists), a missing source (NotFound), a caller who may not write the directory, an
// exchange (InvalidArgument, as Linux refuses RENAME_EXCHANGE | RENAME_WHITEOUT), and a
// rename between two names of one inode (which does nothing).
#[test]
fn refused_renames_leave_no_whiteout() {
    let device = make_device(64 << 20);
    let fs = mount(&device);
    let top = fs.root();
    let closed = fs.mkdir(top, b"closed", 0o755, &root()).unwrap().inode;
    let a = file(&fs, top, b"a");
    file(&fs, top, b"b");
    file(&fs, closed, b"mine");
    fs.link(a, top, b"a2", &root()).unwrap();
    let used = inodes_used(&fs);
    let whiteout = |parent: u64, name: &[u8], new: &[u8], mode, who: &Credentials| {
        fs.rename_whiteout(parent, name, top, new, mode, who)
    };
    let cases = [
        (top, &b"a"[..], &b"b"[..], RenameMode::NoReplace, root()),
        (top, b"missing", b"x", RenameMode::Replace, root()),
        (closed, b"mine", b"x", RenameMode::Replace, user(1000)),
        (top, b"a", b"b", RenameMode::Exchange, root()),
    ];
    for (parent, name, new, mode, who) in cases {
        let error = whiteout(parent, name, new, mode, &who).unwrap_err();
        let expected = match mode {
            RenameMode::Exchange => matches!(error, FsError::InvalidArgument(_)),
            _ => matches!(
                error,
                FsError::Exists | FsError::NotFound | FsError::PermissionDenied
            ),
        };
        assert!(
            expected,
            "{mode:?} {:?}: {error:?}",
            String::from_utf8_lossy(name)
        );
        assert_eq!(inodes_used(&fs), used);
    }
    whiteout(top, b"a", b"a2", RenameMode::Replace, &root()).unwrap();
    assert_eq!(fs.lookup(top, b"a").unwrap().inode, a);
    assert_eq!(inodes_used(&fs), used);
    fs.unmount().unwrap();
    fsck_clean(&device);
}

// A rename that fails half way (the new directory cannot grow on a full filesystem) keeps
// both names as they were and frees its whiteout.
#[test]
fn a_failed_rename_frees_its_whiteout() {
    let device = common::make_small_block_device(16 << 20, 1024, 2);
    let fs = mount(&device);
    let top = fs.root();
    let from = fs.mkdir(top, b"from", 0o755, &root()).unwrap().inode;
    let to = fs.mkdir(top, b"to", 0o755, &root()).unwrap().inode;
    let moved = file(&fs, from, b"moved");
    let filler = file(&fs, top, b"filler");
    let statfs = fs.statfs().unwrap();
    let free = statfs.blocks_available * u64::from(statfs.block_size);
    let keep = cairn_fs::FallocateMode::Allocate { keep_size: false };
    fs.fallocate(filler, 0, free, keep).unwrap();
    // Links fill the target directory until it needs a block nobody has.
    let name = |index: u32| format!("{index:04}-a-name-long-enough-to-fill-a-directory-soon");
    let mut index = 0;
    while fs.link(moved, to, name(index).as_bytes(), &root()).is_ok() {
        index += 1;
    }
    let used = inodes_used(&fs);
    let error = fs
        .rename_whiteout(
            from,
            b"moved",
            to,
            name(index).as_bytes(),
            RenameMode::Replace,
            &root(),
        )
        .unwrap_err();
    assert!(matches!(error, FsError::NoSpace), "{error:?}");
    assert_eq!(fs.lookup(from, b"moved").unwrap().inode, moved);
    assert!(fs.lookup(to, name(index).as_bytes()).is_err());
    assert_eq!(inodes_used(&fs), used);
    fs.unmount().unwrap();
    fsck_clean(&device);
}

// After a sync the whiteout and the moved name survive a crash together; a whiteout rename
// not yet in the log is lost whole (the old name, no whiteout, no stray inode).
#[test]
fn whiteout_renames_survive_a_crash_whole() {
    let device = make_device(64 << 20);
    let fs = mount(&device);
    let top = fs.root();
    let moved = file(&fs, top, b"a");
    file(&fs, top, b"x");
    fs.rename_whiteout(top, b"a", top, b"b", RenameMode::Replace, &root())
        .unwrap();
    fs.sync().unwrap();
    let used = inodes_used(&fs);
    fs.rename_whiteout(top, b"x", top, b"y", RenameMode::Replace, &root())
        .unwrap();
    let image = MemDevice::from_image(device.durable_image(), common::SECTOR).unwrap();
    let image = Arc::new(image);
    let crashed = mount(&image);
    assert!(is_whiteout(&crashed.lookup(top, b"a").unwrap()));
    assert_eq!(crashed.lookup(top, b"b").unwrap().inode, moved);
    assert_eq!(crashed.lookup(top, b"x").unwrap().kind, FileKind::Regular);
    assert!(crashed.lookup(top, b"y").is_err());
    assert_eq!(inodes_used(&crashed), used);
    crashed.unmount().unwrap();
    fsck_clean(&image);
    drop(fs);
}
