#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use cairn_fs::{Credentials, FileKind, Filesystem, FsError, RenameMode, SetAttr, TimeOrNow};
use common::{fsck_clean, make_device, mount, root, user};

fn create(fs: &Filesystem, dir: u64, name: &[u8], mode: u16, who: &Credentials) -> u64 {
    fs.create(dir, name, FileKind::Regular, mode, 0, who)
        .unwrap()
        .inode
}

fn mode(fs: &Filesystem, inode: u64) -> u16 {
    fs.getattr(inode).unwrap().mode
}

fn chmod(fs: &Filesystem, inode: u64, bits: u16, who: &Credentials) -> Result<(), FsError> {
    let change = SetAttr {
        mode: Some(bits),
        ..SetAttr::default()
    };
    fs.setattr(inode, &change, who).map(|_| ())
}

fn chown(
    fs: &Filesystem,
    inode: u64,
    uid: Option<u32>,
    gid: Option<u32>,
    who: &Credentials,
) -> Result<(), FsError> {
    let change = SetAttr {
        uid,
        gid,
        ..SetAttr::default()
    };
    fs.setattr(inode, &change, who).map(|_| ())
}

fn denied<T: std::fmt::Debug>(result: Result<T, FsError>) {
    assert!(
        matches!(result, Err(FsError::PermissionDenied)),
        "{result:?}"
    );
}

fn not_permitted<T: std::fmt::Debug>(result: Result<T, FsError>) {
    assert!(matches!(result, Err(FsError::NotPermitted)), "{result:?}");
}

// Directory write and search permission: creating, removing and renaming need write and
// search on the directory; a directory without search refuses even its owner's creates.
#[test]
fn directory_write_and_search_permission() {
    let device = make_device(64 << 20);
    let fs = mount(&device);
    let top = fs.root();
    let alice = user(1000);
    let bob = user(1001);
    let home = fs.mkdir(top, b"home", 0o755, &root()).unwrap().inode;
    chown(&fs, home, Some(1000), Some(1000), &root()).unwrap();
    denied(fs.create(top, b"x", FileKind::Regular, 0o644, 0, &alice));
    denied(fs.mkdir(top, b"x", 0o755, &alice));
    let f = create(&fs, home, b"f", 0o644, &alice);
    denied(fs.create(home, b"g", FileKind::Regular, 0o644, 0, &bob));
    denied(fs.unlink(home, b"f", &bob));
    denied(fs.rename(home, b"f", home, b"f2", RenameMode::Replace, &bob));
    denied(fs.link(f, home, b"f3", &bob));
    denied(fs.symlink(home, b"s", b"f", &bob));
    fs.access(home, 4 | 1, &bob).unwrap();
    denied(fs.access(home, 2, &bob));
    // No search permission: even the owner cannot create, and others cannot look in.
    chmod(&fs, home, 0o600, &alice).unwrap();
    denied(fs.create(home, b"g", FileKind::Regular, 0o644, 0, &alice));
    denied(fs.unlink(home, b"f", &alice));
    denied(fs.access(home, 1, &bob));
    chmod(&fs, home, 0o700, &alice).unwrap();
    fs.rename(home, b"f", home, b"f2", RenameMode::Replace, &alice)
        .unwrap();
    // A read-only file in a writable directory can still be removed (POSIX).
    chmod(&fs, f, 0o444, &alice).unwrap();
    fs.unlink(home, b"f2", &alice).unwrap();
    // Root bypasses directory permissions.
    create(&fs, home, b"by-root", 0o644, &root());
    fs.unmount().unwrap();
    fsck_clean(&device);
}

// The sticky bit: in a 1777 directory only the entry's owner, the directory's owner or root
// may remove or rename an entry.
#[test]
fn sticky_directory() {
    let device = make_device(64 << 20);
    let fs = mount(&device);
    let top = fs.root();
    let alice = user(1000);
    let bob = user(1001);
    let carol = user(1002);
    let tmp = fs.mkdir(top, b"tmp", 0o1777, &root()).unwrap().inode;
    chown(&fs, tmp, Some(1002), None, &root()).unwrap();
    assert_eq!(mode(&fs, tmp), 0o1777);
    create(&fs, tmp, b"a1", 0o666, &alice);
    create(&fs, tmp, b"a2", 0o666, &alice);
    create(&fs, tmp, b"a3", 0o666, &alice);
    create(&fs, tmp, b"b1", 0o666, &bob);
    denied(fs.unlink(tmp, b"a1", &bob));
    denied(fs.rename(tmp, b"a1", tmp, b"mine", RenameMode::Replace, &bob));
    // Replacing someone else's entry by rename is refused too.
    denied(fs.rename(tmp, b"b1", tmp, b"a1", RenameMode::Replace, &bob));
    fs.unlink(tmp, b"a1", &alice).unwrap();
    fs.unlink(tmp, b"a2", &carol).unwrap();
    fs.unlink(tmp, b"a3", &root()).unwrap();
    fs.rename(tmp, b"b1", tmp, b"b2", RenameMode::Replace, &bob)
        .unwrap();
    let d = fs.mkdir(tmp, b"dir", 0o777, &alice).unwrap().inode;
    assert!(d > 0);
    denied(fs.rmdir(tmp, b"dir", &bob));
    fs.rmdir(tmp, b"dir", &alice).unwrap();
    fs.unmount().unwrap();
    fsck_clean(&device);
}

// setuid and setgid: a write by a process without CAP_FSETID clears setuid, and setgid when
// group-executable or when the writer is outside the file's group; a plain write (a
// privileged writer) keeps them; chown clears them (root's too); a truncate by a non-owner
// with write permission clears them, root's keeps them.
#[test]
fn setuid_setgid_clearing() {
    let device = make_device(64 << 20);
    let fs = mount(&device);
    let top = fs.root();
    let alice = user(1000);
    let dir = fs.mkdir(top, b"d", 0o777, &root()).unwrap().inode;
    let f = create(&fs, dir, b"prog", 0o755, &alice);
    chmod(&fs, f, 0o6755, &alice).unwrap();
    assert_eq!(mode(&fs, f), 0o6755);
    fs.write(f, 0, b"data").unwrap();
    assert_eq!(mode(&fs, f), 0o6755);
    fs.write_clearing_set_id(f, 0, b"data", &alice).unwrap();
    assert_eq!(mode(&fs, f), 0o755);
    // Setgid without group execute stays for a writer in the group, not for one outside.
    chmod(&fs, f, 0o6745, &alice).unwrap();
    fs.write_clearing_set_id(f, 4, b"more", &alice).unwrap();
    assert_eq!(mode(&fs, f), 0o2745);
    fs.write_clearing_set_id(f, 4, b"more", &user(1001))
        .unwrap();
    assert_eq!(mode(&fs, f), 0o745);
    chmod(&fs, f, 0o6755, &alice).unwrap();
    chown(&fs, f, Some(1001), None, &root()).unwrap();
    assert_eq!(mode(&fs, f), 0o755);
    chmod(&fs, f, 0o6755, &root()).unwrap();
    chown(&fs, f, None, None, &root()).unwrap();
    assert_eq!(mode(&fs, f), 0o6755, "no uid or gid: not a chown");
    // chmod keeps what it sets, even when the owner changes with it.
    let change = SetAttr {
        mode: Some(0o4755),
        uid: Some(1000),
        ..SetAttr::default()
    };
    fs.setattr(f, &change, &root()).unwrap();
    assert_eq!(mode(&fs, f), 0o4755);
    let size = SetAttr {
        size: Some(2),
        ..SetAttr::default()
    };
    chmod(&fs, f, 0o4777, &alice).unwrap();
    fs.setattr(f, &size, &root()).unwrap();
    assert_eq!(mode(&fs, f), 0o4777);
    fs.setattr(f, &size, &user(1001)).unwrap();
    assert_eq!(fs.getattr(f).unwrap().size, 2);
    assert_eq!(mode(&fs, f), 0o777);
    fs.unmount().unwrap();
    fsck_clean(&device);
}

// What the kernel sends on a writer's behalf is accepted from a non-owner who may write:
// a mode that only clears set-ID bits, times (a writeback's stamps), and a size change
// through a descriptor opened for writing even without write permission on the inode.
#[test]
fn changes_on_a_writers_behalf() {
    let device = make_device(64 << 20);
    let fs = mount(&device);
    let top = fs.root();
    let (alice, bob) = (user(1000), user(1001));
    let dir = fs.mkdir(top, b"d", 0o777, &root()).unwrap().inode;
    let f = create(&fs, dir, b"f", 0o6777, &alice);
    not_permitted(chmod(&fs, f, 0o777 | 0o1000, &bob));
    chmod(&fs, f, 0o2777, &bob).unwrap();
    assert_eq!(mode(&fs, f), 0o2777);
    let epoch = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
    let stamp = SetAttr {
        mtime: Some(TimeOrNow::Time(epoch)),
        ctime: Some(epoch),
        ..SetAttr::default()
    };
    assert_eq!(fs.setattr(f, &stamp, &bob).unwrap().mtime, epoch);
    // A file created with mode 0: its creator's open handle still truncates it.
    let g = create(&fs, dir, b"g", 0, &bob);
    let handle = fs.open(g, true, false, false, &root()).unwrap();
    let mut through = SetAttr {
        size: Some(0),
        file: Some(handle.handle),
        ..SetAttr::default()
    };
    fs.setattr(g, &through, &bob).unwrap();
    let reader = fs.open(g, false, false, false, &root()).unwrap();
    through.file = Some(reader.handle);
    denied(fs.setattr(g, &through, &bob));
    through.file = None;
    denied(fs.setattr(g, &through, &bob));
    fs.release(handle).unwrap();
    fs.release(reader).unwrap();
    // ctime alone (a chown that changes nothing) needs nothing.
    let ctime = SetAttr {
        ctime: Some(epoch),
        ..SetAttr::default()
    };
    fs.setattr(g, &ctime, &alice).unwrap();
    fs.unmount().unwrap();
    fsck_clean(&device);
}

// chmod, chown and explicit times are for the owner (or root); a non-root owner may change
// the group only to one of its own groups; a chmod by someone outside the file's group drops
// setgid; times set to now need only write permission.
#[test]
fn owner_only_changes() {
    let device = make_device(64 << 20);
    let fs = mount(&device);
    let top = fs.root();
    let alice = Credentials {
        uid: 1000,
        gid: 1000,
        groups: vec![50],
        umask: 0,
    };
    let bob = user(1001);
    let dir = fs.mkdir(top, b"d", 0o777, &root()).unwrap().inode;
    let f = create(&fs, dir, b"f", 0o666, &alice);
    not_permitted(chmod(&fs, f, 0o777, &bob));
    not_permitted(chown(&fs, f, Some(1001), None, &bob));
    not_permitted(chown(&fs, f, Some(1001), None, &alice));
    not_permitted(chown(&fs, f, None, Some(60), &alice));
    chown(&fs, f, None, Some(50), &alice).unwrap();
    assert_eq!(fs.getattr(f).unwrap().gid, 50);
    chown(&fs, f, Some(1001), Some(60), &root()).unwrap();
    // Bob owns it now but is not in group 60: his setgid request is dropped.
    chmod(&fs, f, 0o2775, &bob).unwrap();
    assert_eq!(mode(&fs, f), 0o775);
    chmod(&fs, f, 0o2775, &root()).unwrap();
    assert_eq!(mode(&fs, f), 0o2775);
    let epoch = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
    let explicit = SetAttr {
        mtime: Some(TimeOrNow::Time(epoch)),
        ..SetAttr::default()
    };
    not_permitted(fs.setattr(f, &explicit, &alice));
    assert_eq!(fs.setattr(f, &explicit, &bob).unwrap().mtime, epoch);
    let touch = SetAttr {
        mtime: Some(TimeOrNow::Now),
        ..SetAttr::default()
    };
    // 0o2775: others may not write, so alice (group 1000) cannot touch; after 0o2777 she can.
    denied(fs.setattr(f, &touch, &alice));
    chmod(&fs, f, 0o2777, &bob).unwrap();
    assert!(fs.setattr(f, &touch, &alice).unwrap().mtime > epoch);
    // open for writing needs write permission; for reading, read permission.
    chmod(&fs, f, 0o640, &bob).unwrap();
    denied(fs.open(f, true, false, false, &alice));
    denied(fs.open(f, false, false, false, &alice));
    let handle = fs.open(f, true, false, false, &bob).unwrap();
    fs.release(handle).unwrap();
    fs.unmount().unwrap();
    fsck_clean(&device);
}

// Setgid directories hand their group down, and setgid itself to subdirectories.
#[test]
fn setgid_directory_inheritance() {
    let device = make_device(64 << 20);
    let fs = mount(&device);
    let top = fs.root();
    let alice = user(1000);
    let shared = fs.mkdir(top, b"shared", 0o777, &root()).unwrap().inode;
    chown(&fs, shared, None, Some(77), &root()).unwrap();
    chmod(&fs, shared, 0o2777, &root()).unwrap();
    let f = fs
        .create(shared, b"f", FileKind::Regular, 0o644, 0, &alice)
        .unwrap();
    assert_eq!((f.gid, f.mode), (77, 0o644));
    let sub = fs.mkdir(shared, b"sub", 0o755, &alice).unwrap();
    assert_eq!((sub.gid, sub.mode), (77, 0o2755));
    fs.unmount().unwrap();
    fsck_clean(&device);
}
