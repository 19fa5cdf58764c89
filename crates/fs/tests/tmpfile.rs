//! O_TMPFILE through the library API: an unnamed file on the unlinked list from birth, its
//! first name by `link`, `O_EXCL`, mode and ACL inheritance, and what a crash leaves.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;

use cairn_blockdev::MemDevice;
use cairn_fs::{Credentials, FileKind, Filesystem, FsError, OpenFile, XattrFlags};
use common::{fsck_clean, make_device, mount, root, user};

fn crash(device: &Arc<MemDevice>) -> (Arc<MemDevice>, Filesystem) {
    let image = MemDevice::from_image(device.durable_image(), common::SECTOR).unwrap();
    let image = Arc::new(image);
    let fs = mount(&image);
    (image, fs)
}

fn names(fs: &Filesystem, dir: u64) -> Vec<Vec<u8>> {
    let entries = fs.readdir(dir, 0, 1000).unwrap();
    entries
        .into_iter()
        .skip(2)
        .map(|entry| entry.name)
        .collect()
}

fn open(fs: &Filesystem, inode: u64) -> OpenFile {
    fs.open(inode, true, false, false, &root()).unwrap()
}

// An unnamed file has no link and no entry, holds data, and gets its one name by `link`:
// then it is an ordinary file with one link, its data intact, fsck clean (before and after
// the link, while it is open).
#[test]
fn a_tmpfile_is_written_then_linked_into_place() {
    let device = make_device(64 << 20);
    let fs = mount(&device);
    let dir = fs.mkdir(fs.root(), b"d", 0o755, &root()).unwrap().inode;
    let attr = fs.tmpfile(dir, 0o600, false, &root()).unwrap();
    assert_eq!(
        (attr.nlink, attr.kind, attr.mode),
        (0, FileKind::Regular, 0o600)
    );
    let file = open(&fs, attr.inode);
    fs.write(attr.inode, 0, &[7; 100_000]).unwrap();
    assert!(names(&fs, dir).is_empty());
    fs.sync().unwrap();
    let linked = fs.link(attr.inode, dir, b"placed", &root()).unwrap();
    assert_eq!(linked.nlink, 1);
    assert_eq!(names(&fs, dir), vec![b"placed".to_vec()]);
    fs.release(file).unwrap();
    let found = fs.lookup(dir, b"placed").unwrap();
    assert_eq!((found.inode, found.size), (attr.inode, 100_000));
    assert!(fs.read(found.inode, 99_990, 10).unwrap() == [7; 10]);
    fs.unmount().unwrap();
    fsck_clean(&device);
}

// Without a link, the last close frees the file and its blocks; an O_EXCL one refuses
// `link` (NotFound, the kernel's ENOENT), and so does a file that had a name and lost it.
#[test]
fn unnamed_files_go_at_their_last_close() {
    let device = make_device(64 << 20);
    let fs = mount(&device);
    let top = fs.root();
    let free = fs.statfs().unwrap().blocks_free;
    let exclusive = fs.tmpfile(top, 0o644, true, &root()).unwrap().inode;
    let file = open(&fs, exclusive);
    fs.write(exclusive, 0, &[1; 1 << 20]).unwrap();
    let refused = fs.link(exclusive, top, b"x", &root()).unwrap_err();
    assert!(matches!(refused, FsError::NotFound), "{refused:?}");
    fs.release(file).unwrap();
    fs.forget(exclusive, 1);
    assert!(fs.getattr(exclusive).is_err());
    assert_eq!(fs.statfs().unwrap().blocks_free, free);
    let once = fs.tmpfile(top, 0o644, false, &root()).unwrap().inode;
    let file = open(&fs, once);
    fs.link(once, top, b"once", &root()).unwrap();
    fs.unlink(top, b"once", &root()).unwrap();
    let again = fs.link(once, top, b"again", &root()).unwrap_err();
    assert!(matches!(again, FsError::NotFound), "{again:?}");
    fs.release(file).unwrap();
    fs.forget(once, 2);
    assert!(names(&fs, top).is_empty());
    fs.unmount().unwrap();
    fsck_clean(&device);
}

// A name that exists refuses the link and the file stays unnamed and linkable. Files
// sharing an unlinked bucket (65 of them: inode numbers 64 apart share one) are linked
// oldest first, so each leaves a list where a newer inode precedes it; then the lists are
// empty again and fsck is clean.
#[test]
fn a_refused_link_leaves_the_file_unnamed() {
    let device = make_device(64 << 20);
    let fs = mount(&device);
    let top = fs.root();
    fs.create(top, b"taken", FileKind::Regular, 0o644, 0, &root())
        .unwrap();
    let unnamed: Vec<u64> = (0..65)
        .map(|_| fs.tmpfile(top, 0o644, false, &root()).unwrap().inode)
        .collect();
    let files: Vec<OpenFile> = unnamed.iter().map(|&inode| open(&fs, inode)).collect();
    let taken = fs.link(unnamed[0], top, b"taken", &root()).unwrap_err();
    assert!(matches!(taken, FsError::Exists), "{taken:?}");
    assert_eq!(fs.getattr(unnamed[0]).unwrap().nlink, 0);
    for (index, &inode) in unnamed.iter().enumerate() {
        let name = format!("f{index}");
        fs.link(inode, top, name.as_bytes(), &root()).unwrap();
    }
    for file in files {
        fs.release(file).unwrap();
    }
    assert_eq!(names(&fs, top).len(), 66);
    fs.unmount().unwrap();
    fsck_clean(&device);
}

// Mode, umask, group and default ACLs apply as for a create: the umask cuts the mode; a
// setgid directory gives its group; a directory's default ACL gives an access ACL and
// replaces the umask.
#[test]
fn a_tmpfile_inherits_as_a_create_does() {
    let device = make_device(64 << 20);
    let fs = mount(&device);
    let top = fs.root();
    let masked = Credentials {
        umask: 0o027,
        ..user(1000)
    };
    let shared = fs.mkdir(top, b"shared", 0o2777, &root()).unwrap().inode;
    let attr = fs.tmpfile(shared, 0o666, false, &masked).unwrap();
    assert_eq!((attr.mode, attr.uid, attr.gid), (0o640, 1000, 0));
    let acl_dir = fs.mkdir(top, b"acl", 0o777, &root()).unwrap().inode;
    // USER_OBJ rwx, USER 1001 r--, GROUP_OBJ r-x, MASK rwx, OTHER ---.
    let default = acl_bytes(&[
        (1, 7, u32::MAX),
        (2, 4, 1001),
        (4, 5, u32::MAX),
        (16, 7, u32::MAX),
        (32, 0, u32::MAX),
    ]);
    fs.setxattr(
        acl_dir,
        b"system.posix_acl_default",
        &default,
        XattrFlags::Any,
        &root(),
    )
    .unwrap();
    let attr = fs.tmpfile(acl_dir, 0o666, false, &masked).unwrap();
    assert_eq!(attr.mode, 0o660, "the ACL's mask, not the umask");
    let access = fs
        .getxattr(attr.inode, b"system.posix_acl_access", &root())
        .unwrap();
    assert_eq!(access.len(), 4 + 5 * 8);
    let closed = fs.mkdir(top, b"closed", 0o755, &root()).unwrap().inode;
    let refused = fs.tmpfile(closed, 0o600, false, &user(1000)).unwrap_err();
    assert!(matches!(refused, FsError::PermissionDenied), "{refused:?}");
    fs.unmount().unwrap();
    fsck_clean(&device);
}

fn acl_bytes(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut out = 2u32.to_le_bytes().to_vec();
    for &(tag, perm, id) in entries {
        out.extend_from_slice(&tag.to_le_bytes());
        out.extend_from_slice(&perm.to_le_bytes());
        out.extend_from_slice(&id.to_le_bytes());
    }
    out
}

// A crash before the link frees the unnamed file at mount, even after it was written and
// synced (nothing of it is left: free space and inode counts are back, fsck clean); a
// crash after the link (and a sync) keeps it under its name with its data.
#[test]
fn a_crash_frees_an_unnamed_file_and_keeps_a_linked_one() {
    let device = make_device(64 << 20);
    let fs = mount(&device);
    let top = fs.root();
    fs.sync().unwrap();
    let before = fs.statfs().unwrap();
    let unnamed = fs.tmpfile(top, 0o644, false, &root()).unwrap().inode;
    let _file = open(&fs, unnamed);
    fs.write(unnamed, 0, &[3; 256 << 10]).unwrap();
    fs.fsync(unnamed, false).unwrap();
    let (image, crashed) = crash(&device);
    assert!(names(&crashed, top).is_empty());
    assert_eq!(crashed.statfs().unwrap(), before);
    crashed.unmount().unwrap();
    fsck_clean(&image);

    let named = fs.tmpfile(top, 0o644, false, &root()).unwrap().inode;
    let _named_file = open(&fs, named);
    fs.write(named, 0, &[4; 64 << 10]).unwrap();
    fs.link(named, top, b"named", &root()).unwrap();
    fs.sync().unwrap();
    let (image, crashed) = crash(&device);
    assert_eq!(names(&crashed, top), vec![b"named".to_vec()]);
    let found = crashed.lookup(top, b"named").unwrap();
    assert_eq!((found.nlink, found.size), (1, 64 << 10));
    assert!(crashed.read(found.inode, 0, 16).unwrap() == [4; 16]);
    crashed.unmount().unwrap();
    fsck_clean(&image);
}
