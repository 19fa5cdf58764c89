//! POSIX ACLs through the library: stored as system.posix_acl_* attributes, enforced for
//! named users and groups, rewritten by chmod, inherited from default ACLs (which replace the
//! umask), refused when invalid or set by a non-owner; all of it survives a remount and
//! passes fsck.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use cairn_format::acl::{Acl, AclEntry, AclTag};
use cairn_fs::{Credentials, FileKind, Filesystem, FsError, SetAttr, XattrFlags};
use common::{fsck_clean, make_device, mount, root, user};

const ACCESS: &[u8] = b"system.posix_acl_access";
const DEFAULT: &[u8] = b"system.posix_acl_default";

fn acl(entries: &[(AclTag, u8)]) -> Vec<u8> {
    let entries = entries
        .iter()
        .map(|&(tag, perm)| AclEntry { tag, perm })
        .collect();
    Acl { entries }.encode().unwrap()
}

/// u::rwx, u:<uid>:rw-, g::r--, m::<mask>, o::---
fn named_user(uid: u32, mask: u8) -> Vec<u8> {
    acl(&[
        (AclTag::UserObj, 7),
        (AclTag::User(uid), 6),
        (AclTag::GroupObj, 4),
        (AclTag::Mask, mask),
        (AclTag::Other, 0),
    ])
}

fn mode(fs: &Filesystem, inode: u64) -> u16 {
    fs.getattr(inode).unwrap().mode
}

fn can_write(fs: &Filesystem, inode: u64, who: &Credentials) -> bool {
    match fs.open(inode, true, false, false, who) {
        Ok(file) => fs.release(file).map(|()| true).unwrap(),
        Err(FsError::PermissionDenied) => false,
        Err(error) => panic!("open: {error}"),
    }
}

fn chmod(fs: &Filesystem, inode: u64, bits: u16, who: &Credentials) {
    let change = SetAttr {
        mode: Some(bits),
        ..SetAttr::default()
    };
    fs.setattr(inode, &change, who).unwrap();
}

// An access ACL grants a named user what the mode alone does not; the mask bounds it and
// stands for the group bits; chmod rewrites the mask; a list equivalent to a mode is not
// stored; only the owner sets ACLs, and invalid ones are refused.
#[test]
fn access_acls_are_enforced_and_follow_chmod() {
    let device = make_device(64 << 20);
    let fs = mount(&device);
    let alice = user(1000);
    let bob = user(1001);
    let dir = fs.mkdir(fs.root(), b"d", 0o777, &root()).unwrap().inode;
    let f = fs
        .create(dir, b"f", FileKind::Regular, 0o600, 0, &alice)
        .unwrap()
        .inode;
    assert!(!can_write(&fs, f, &bob));
    let not_owner = fs.setxattr(f, ACCESS, &named_user(1001, 6), XattrFlags::Any, &bob);
    assert!(
        matches!(not_owner, Err(FsError::NotPermitted)),
        "{not_owner:?}"
    );
    fs.setxattr(f, ACCESS, &named_user(1001, 6), XattrFlags::Any, &alice)
        .unwrap();
    assert_eq!(mode(&fs, f), 0o760);
    assert!(can_write(&fs, f, &bob));
    assert!(!can_write(&fs, f, &user(1002)));
    assert_eq!(fs.getxattr(f, ACCESS, &bob).unwrap(), named_user(1001, 6));
    let names = fs.listxattr(f, &bob).unwrap();
    assert_eq!(names, vec![ACCESS.to_vec()]);
    // chmod g-w: the mask loses write, so bob does too; the named entry keeps its bits.
    chmod(&fs, f, 0o740, &alice);
    assert!(!can_write(&fs, f, &bob));
    assert_eq!(
        fs.getxattr(f, ACCESS, &root()).unwrap(),
        named_user(1001, 4)
    );
    chmod(&fs, f, 0o770, &alice);
    assert!(can_write(&fs, f, &bob));
    // Three entries are just a mode: it is set and nothing is stored.
    let plain = acl(&[
        (AclTag::UserObj, 6),
        (AclTag::GroupObj, 4),
        (AclTag::Other, 4),
    ]);
    fs.setxattr(f, ACCESS, &plain, XattrFlags::Any, &alice)
        .unwrap();
    assert_eq!(mode(&fs, f), 0o644);
    assert!(matches!(
        fs.getxattr(f, ACCESS, &root()),
        Err(FsError::NoData)
    ));
    assert!(!can_write(&fs, f, &bob));
    let invalid = fs.setxattr(f, ACCESS, b"\x02\0\0\0\x01\0", XattrFlags::Any, &alice);
    assert!(
        matches!(invalid, Err(FsError::InvalidArgument(_))),
        "{invalid:?}"
    );
    // u::rw-, u:5:rw-, g::r--, o::r-- (a named entry needs a mask).
    let mut no_mask = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in [
        (1u16, 6u16, u32::MAX),
        (2, 6, 5),
        (4, 4, u32::MAX),
        (32, 4, u32::MAX),
    ] {
        no_mask.extend_from_slice(&tag.to_le_bytes());
        no_mask.extend_from_slice(&perm.to_le_bytes());
        no_mask.extend_from_slice(&id.to_le_bytes());
    }
    let invalid = fs.setxattr(f, ACCESS, &no_mask, XattrFlags::Any, &alice);
    assert!(
        matches!(invalid, Err(FsError::InvalidArgument(_))),
        "{invalid:?}"
    );
    let on_file = fs.setxattr(f, DEFAULT, &named_user(5, 7), XattrFlags::Any, &alice);
    assert!(
        matches!(on_file, Err(FsError::PermissionDenied)),
        "{on_file:?}"
    );
    fs.unmount().unwrap();
    fsck_clean(&device);
}

// A default ACL on a directory: new files get an access ACL cut to the requested mode and
// the mode cut to it, with no umask; new subdirectories inherit it as their default too;
// symlinks take nothing. Without one the umask applies.
#[test]
fn default_acls_are_inherited() {
    let device = make_device(64 << 20);
    let fs = mount(&device);
    let alice = Credentials {
        umask: 0o077,
        ..user(1000)
    };
    let dir = fs
        .mkdir(fs.root(), b"shared", 0o777, &root())
        .unwrap()
        .inode;
    let default = acl(&[
        (AclTag::UserObj, 7),
        (AclTag::User(1001), 7),
        (AclTag::GroupObj, 5),
        (AclTag::Mask, 7),
        (AclTag::Other, 5),
    ]);
    fs.setxattr(dir, DEFAULT, &default, XattrFlags::Any, &root())
        .unwrap();
    assert_eq!(mode(&fs, dir), 0o777, "a default ACL leaves the mode");
    let f = fs
        .create(dir, b"f", FileKind::Regular, 0o666, 0, &alice)
        .unwrap();
    assert_eq!(
        f.mode, 0o664,
        "the umask does not apply under a default ACL"
    );
    let access = Acl::decode(&fs.getxattr(f.inode, ACCESS, &root()).unwrap()).unwrap();
    assert_eq!(access.entry(AclTag::Mask).unwrap().perm, 6);
    assert_eq!(access.entry(AclTag::User(1001)).unwrap().perm, 7);
    assert!(can_write(&fs, f.inode, &user(1001)));
    assert!(!can_write(&fs, f.inode, &user(1002)));
    let sub = fs.mkdir(dir, b"sub", 0o750, &alice).unwrap();
    assert_eq!(sub.mode, 0o750);
    assert_eq!(fs.getxattr(sub.inode, DEFAULT, &root()).unwrap(), default);
    let deeper = fs
        .create(sub.inode, b"g", FileKind::Regular, 0o640, 0, &alice)
        .unwrap();
    assert_eq!(deeper.mode, 0o640);
    let link = fs.symlink(dir, b"l", b"f", &alice).unwrap();
    assert!(matches!(
        fs.getxattr(link.inode, ACCESS, &root()),
        Err(FsError::NoData)
    ));
    fs.removexattr(dir, DEFAULT, &root()).unwrap();
    let masked = fs
        .create(dir, b"plain", FileKind::Regular, 0o666, 0, &alice)
        .unwrap();
    assert_eq!(masked.mode, 0o600, "the umask applies again");
    fs.unmount().unwrap();
    fsck_clean(&device);
    let fs = mount(&device);
    let sub = fs.lookup(fs.lookup(fs.root(), b"shared").unwrap().inode, b"sub");
    assert_eq!(
        fs.getxattr(sub.unwrap().inode, DEFAULT, &root()).unwrap(),
        default
    );
    assert!(can_write(&fs, f.inode, &user(1001)));
    fs.unmount().unwrap();
    fsck_clean(&device);
}
