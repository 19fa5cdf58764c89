#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use cairn_fs::{Credentials, FileKind, Filesystem, FsError, XattrFlags};
use common::{fsck_clean, make_device, mount, root, user};

fn file(fs: &Filesystem, dir: u64, name: &[u8], mode: u16, who: &Credentials) -> u64 {
    fs.create(dir, name, FileKind::Regular, mode, 0, who)
        .unwrap()
        .inode
}

fn set(fs: &Filesystem, inode: u64, name: &str, value: &[u8]) {
    fs.setxattr(inode, name.as_bytes(), value, XattrFlags::Any, &root())
        .unwrap();
}

fn get(fs: &Filesystem, inode: u64, name: &str) -> Result<Vec<u8>, FsError> {
    fs.getxattr(inode, name.as_bytes(), &root())
}

fn sorted_names(fs: &Filesystem, inode: u64, who: &Credentials) -> Vec<String> {
    let mut names: Vec<String> = fs
        .listxattr(inode, who)
        .unwrap()
        .into_iter()
        .map(|n| String::from_utf8(n).unwrap())
        .collect();
    names.sort();
    names
}

fn value(seed: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 + seed * 7) as u8).collect()
}

// Short-form attributes: set, replace, the create/replace flags, list, remove, and a remount
// with fsck.
#[test]
fn shortform_set_get_list_remove() {
    let device = make_device(64 << 20);
    let fs = mount(&device);
    let f = file(&fs, fs.root(), b"f", 0o644, &root());
    set(&fs, f, "user.a", b"one");
    set(&fs, f, "trusted.b", b"");
    set(&fs, f, "security.c", b"three");
    assert_eq!(get(&fs, f, "user.a").unwrap(), b"one");
    assert_eq!(get(&fs, f, "trusted.b").unwrap(), b"");
    set(&fs, f, "user.a", b"uno");
    assert_eq!(get(&fs, f, "user.a").unwrap(), b"uno");
    let create = fs.setxattr(f, b"user.a", b"x", XattrFlags::Create, &root());
    assert!(matches!(create, Err(FsError::Exists)), "{create:?}");
    let replace = fs.setxattr(f, b"user.new", b"x", XattrFlags::Replace, &root());
    assert!(matches!(replace, Err(FsError::NoData)), "{replace:?}");
    fs.setxattr(f, b"user.new", b"x", XattrFlags::Create, &root())
        .unwrap();
    fs.setxattr(f, b"user.new", b"y", XattrFlags::Replace, &root())
        .unwrap();
    assert_eq!(
        sorted_names(&fs, f, &root()),
        ["security.c", "trusted.b", "user.a", "user.new"]
    );
    fs.removexattr(f, b"user.new", &root()).unwrap();
    let gone = fs.removexattr(f, b"user.new", &root());
    assert!(matches!(gone, Err(FsError::NoData)), "{gone:?}");
    assert!(matches!(get(&fs, f, "user.new"), Err(FsError::NoData)));
    fs.unmount().unwrap();
    fsck_clean(&device);
    let fs = mount(&device);
    assert_eq!(get(&fs, f, "security.c").unwrap(), b"three");
    assert_eq!(
        sorted_names(&fs, f, &root()),
        ["security.c", "trusted.b", "user.a"]
    );
    for name in ["security.c", "trusted.b", "user.a"] {
        fs.removexattr(f, name.as_bytes(), &root()).unwrap();
    }
    assert_eq!(fs.getattr(f).unwrap().blocks_512, 0);
    fs.unmount().unwrap();
    fsck_clean(&device);
}

// Many attributes move the set to a leaf block, large values to remote blocks (up to 64 KiB);
// everything reads back across a remount, fsck claims the blocks, and removing them all
// gives every block back.
#[test]
fn leaf_and_remote_values() {
    let device = make_device(64 << 20);
    let fs = mount(&device);
    let free_before = fs.statfs().unwrap().blocks_free;
    let f = file(&fs, fs.root(), b"f", 0o644, &root());
    for i in 0..40 {
        set(&fs, f, &format!("user.attr{i}"), &value(i, 40));
    }
    set(&fs, f, "user.big", &value(99, 65_536));
    set(&fs, f, "user.medium", &value(98, 3000));
    assert!(fs.getattr(f).unwrap().blocks_512 > 0);
    fs.unmount().unwrap();
    fsck_clean(&device);
    let fs = mount(&device);
    for i in 0..40 {
        assert_eq!(get(&fs, f, &format!("user.attr{i}")).unwrap(), value(i, 40));
    }
    assert_eq!(get(&fs, f, "user.big").unwrap(), value(99, 65_536));
    assert_eq!(get(&fs, f, "user.medium").unwrap(), value(98, 3000));
    assert_eq!(sorted_names(&fs, f, &root()).len(), 42);
    // Replacing a remote value by a small one and a small one by a remote one.
    set(&fs, f, "user.big", b"small now");
    set(&fs, f, "user.attr3", &value(3, 10_000));
    assert_eq!(get(&fs, f, "user.big").unwrap(), b"small now");
    assert_eq!(get(&fs, f, "user.attr3").unwrap(), value(3, 10_000));
    for name in sorted_names(&fs, f, &root()) {
        fs.removexattr(f, name.as_bytes(), &root()).unwrap();
    }
    assert_eq!(fs.getattr(f).unwrap().blocks_512, 0);
    fs.unlink(fs.root(), b"f", &root()).unwrap();
    fs.forget(f, 1);
    fs.sync().unwrap();
    assert_eq!(fs.statfs().unwrap().blocks_free, free_before);
    fs.unmount().unwrap();
    fsck_clean(&device);
}

// Freeing an inode frees its leaf and remote value blocks, over several steps when it has
// many remote values.
#[test]
fn attributes_freed_with_the_inode() {
    let device = make_device(64 << 20);
    let fs = mount(&device);
    fs.sync().unwrap();
    let free_before = fs.statfs().unwrap().blocks_free;
    let f = file(&fs, fs.root(), b"f", 0o644, &root());
    for i in 0..11 {
        set(&fs, f, &format!("user.v{i}"), &value(i, 5000 + i));
    }
    fs.write(f, 0, &value(1, 20_000)).unwrap();
    fs.unlink(fs.root(), b"f", &root()).unwrap();
    fs.forget(f, 1);
    assert!(matches!(fs.getattr(f), Err(FsError::NotFound)));
    fs.sync().unwrap();
    assert_eq!(fs.statfs().unwrap().blocks_free, free_before);
    fs.unmount().unwrap();
    fsck_clean(&device);
}

// Attributes beside every data fork shape: a short-form directory that grows into blocks, a
// file whose extents move into a tree, a symlink and a device node.
#[test]
fn attributes_beside_growing_data_forks() {
    let device = make_device(64 << 20);
    let fs = mount(&device);
    let top = fs.root();
    let dir = fs.mkdir(top, b"d", 0o755, &root()).unwrap().inode;
    set(&fs, dir, "user.dir", &value(1, 100));
    let f = file(&fs, top, b"f", 0o644, &root());
    set(&fs, f, "user.file", &value(2, 150));
    let link = fs.symlink(top, b"l", b"target", &root()).unwrap().inode;
    set(&fs, link, "trusted.link", b"t");
    let node = fs
        .create(top, b"n", FileKind::Fifo, 0o644, 0, &root())
        .unwrap()
        .inode;
    set(&fs, node, "security.node", b"s");
    for i in 0..200 {
        file(&fs, dir, format!("entry-{i:04}").as_bytes(), 0o644, &root());
    }
    // Every other block: extents that cannot merge, beyond the inline list.
    for i in 0..60u64 {
        fs.write(f, i * 8192, &value(i as usize, 4096)).unwrap();
    }
    set(&fs, f, "user.after", &value(3, 60));
    set(&fs, dir, "user.dir", &value(4, 90));
    fs.unmount().unwrap();
    fsck_clean(&device);
    let fs = mount(&device);
    assert_eq!(get(&fs, dir, "user.dir").unwrap(), value(4, 90));
    assert_eq!(get(&fs, f, "user.file").unwrap(), value(2, 150));
    assert_eq!(get(&fs, f, "user.after").unwrap(), value(3, 60));
    assert_eq!(get(&fs, link, "trusted.link").unwrap(), b"t");
    assert_eq!(get(&fs, node, "security.node").unwrap(), b"s");
    assert_eq!(fs.readlink(link).unwrap(), b"target");
    for i in 0..60u64 {
        assert_eq!(fs.read(f, i * 8192, 4096).unwrap(), value(i as usize, 4096));
    }
    assert!(fs.lookup(dir, b"entry-0199").is_ok());
    for name in ["user.file", "user.after"] {
        fs.removexattr(f, name.as_bytes(), &root()).unwrap();
    }
    assert_eq!(fs.read(f, 59 * 8192, 4096).unwrap(), value(59, 4096));
    fs.unmount().unwrap();
    fsck_clean(&device);
}

// Namespace rules for non-root callers: trusted is root-only, security is read-only, user
// needs a regular file or directory, the inode's permissions, and ownership in sticky
// directories; bad names and sizes are refused.
#[test]
fn namespace_and_permission_rules() {
    let device = make_device(64 << 20);
    let fs = mount(&device);
    let top = fs
        .mkdir(fs.root(), b"shared", 0o777, &root())
        .unwrap()
        .inode;
    let alice = user(1000);
    let bob = user(1001);
    let mine = file(&fs, top, b"mine", 0o644, &alice);
    set(&fs, mine, "trusted.t", b"t");
    set(&fs, mine, "security.s", b"s");
    let setx = |who: &Credentials, name: &str| {
        fs.setxattr(mine, name.as_bytes(), b"v", XattrFlags::Any, who)
    };
    assert!(matches!(
        setx(&alice, "trusted.x"),
        Err(FsError::NotPermitted)
    ));
    assert!(matches!(
        setx(&alice, "security.x"),
        Err(FsError::NotPermitted)
    ));
    setx(&alice, "user.x").unwrap();
    assert!(matches!(
        fs.getxattr(mine, b"trusted.t", &alice),
        Err(FsError::NoData)
    ));
    assert_eq!(fs.getxattr(mine, b"security.s", &bob).unwrap(), b"s");
    assert_eq!(fs.getxattr(mine, b"user.x", &bob).unwrap(), b"v");
    assert_eq!(sorted_names(&fs, mine, &alice), ["security.s", "user.x"]);
    assert!(matches!(
        setx(&bob, "user.y"),
        Err(FsError::PermissionDenied)
    ));
    assert!(matches!(
        fs.removexattr(mine, b"user.x", &bob),
        Err(FsError::PermissionDenied)
    ));
    let secret = file(&fs, top, b"secret", 0o600, &alice);
    set(&fs, secret, "user.k", b"k");
    assert!(matches!(
        fs.getxattr(secret, b"user.k", &bob),
        Err(FsError::PermissionDenied)
    ));
    let link = fs.symlink(top, b"l", b"mine", &root()).unwrap().inode;
    let on_link = fs.setxattr(link, b"user.x", b"v", XattrFlags::Any, &root());
    assert!(matches!(on_link, Err(FsError::NotPermitted)), "{on_link:?}");
    assert!(matches!(get(&fs, link, "user.x"), Err(FsError::NoData)));
    let sticky = fs.mkdir(top, b"tmp", 0o1777, &root()).unwrap().inode;
    let sticky_set = fs.setxattr(sticky, b"user.x", b"v", XattrFlags::Any, &alice);
    assert!(
        matches!(sticky_set, Err(FsError::NotPermitted)),
        "{sticky_set:?}"
    );
    let bad =
        |name: &[u8], len: usize| fs.setxattr(mine, name, &vec![0; len], XattrFlags::Any, &root());
    assert!(matches!(bad(b"other.x", 1), Err(FsError::Unsupported)));
    assert!(matches!(
        bad(b"system.posix_acl_access", 1),
        Err(FsError::InvalidArgument(_))
    ));
    assert!(matches!(bad(b"system.other", 1), Err(FsError::Unsupported)));
    assert!(matches!(bad(b"user.", 1), Err(FsError::InvalidArgument(_))));
    assert!(matches!(bad(&[b'u'; 256], 1), Err(FsError::Range)));
    let long: Vec<u8> = [&b"user."[..], &[b'n'; 250]].concat();
    assert!(bad(&long, 1).is_ok());
    assert!(matches!(bad(b"user.big", 65_537), Err(FsError::Range)));
    fs.unmount().unwrap();
    fsck_clean(&device);
}

// A leaf that fills up grows into the index form (it used to refuse with NoSpace): 1,000
// attributes with long names all fit, list and read back, and removing them all takes the
// attr fork away again.
#[test]
fn full_leaf_grows_into_an_index() {
    let device = make_device(64 << 20);
    let fs = mount(&device);
    let f = file(&fs, fs.root(), b"f", 0o644, &root());
    let name = |i: usize| format!("user.{i:04}-{}", "n".repeat(200));
    for i in 0..1000 {
        set(&fs, f, &name(i), format!("value {i}").as_bytes());
    }
    assert_eq!(sorted_names(&fs, f, &root()).len(), 1000);
    assert_eq!(get(&fs, f, &name(777)).unwrap(), b"value 777");
    for i in 0..1000 {
        fs.removexattr(f, name(i).as_bytes(), &root()).unwrap();
    }
    assert!(sorted_names(&fs, f, &root()).is_empty());
    set(&fs, f, "user.again", b"short form again");
    fs.unmount().unwrap();
    fsck_clean(&device);
}
