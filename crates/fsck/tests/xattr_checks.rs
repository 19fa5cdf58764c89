//! The attribute checks: POSIX ACLs in the System namespace must decode and be valid lists;
//! a broken one is found (`-n`, exit 4) and the attributes dropped by `-y`, after which the
//! image is clean and mounts.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;

use cairn_blockdev::MemDevice;
use cairn_format::acl::{Acl, AclEntry, AclTag};
use cairn_fs::{Credentials, FileKind, Filesystem, MountOptions, XattrFlags};
use common::{SECTOR, edit_inode, populated, text};

fn fsck(args: &[&str]) -> std::process::Output {
    common::run(env!("CARGO_BIN_EXE_fsck-cairn"), args)
}

// A file whose access ACL (short form, in the inode) has an unknown tag in its mask entry.
#[test]
fn broken_acl_is_found_and_dropped() {
    let image = populated();
    let bytes = std::fs::read(&image.path).unwrap();
    let device = Arc::new(MemDevice::from_image(bytes, SECTOR).unwrap());
    let fs = Filesystem::mount(device.clone(), MountOptions::default()).unwrap();
    let who = Credentials::root();
    let f = fs
        .create(fs.root(), b"acl", FileKind::Regular, 0o640, 0, &who)
        .unwrap()
        .inode;
    let entries = [
        (AclTag::UserObj, 6),
        (AclTag::User(7), 6),
        (AclTag::GroupObj, 4),
        (AclTag::Mask, 6),
        (AclTag::Other, 0),
    ];
    let acl = Acl {
        entries: entries
            .iter()
            .map(|&(tag, perm)| AclEntry { tag, perm })
            .collect(),
    };
    let raw = acl.encode().unwrap();
    fs.setxattr(f, b"system.posix_acl_access", &raw, XattrFlags::Any, &who)
        .unwrap();
    fs.unmount().unwrap();
    std::fs::write(&image.path, device.snapshot()).unwrap();
    let path = image.path.to_str().unwrap();
    assert_eq!(
        fsck(&["-n", path]).status.code(),
        Some(0),
        "clean with a valid ACL"
    );
    edit_inode(&image, f, |_, literal| {
        let at = literal
            .windows(raw.len())
            .position(|w| w == raw.as_slice())
            .expect("ACL not in the inode");
        literal[at + 4 + 3 * 8] = 0x40; // the mask entry's tag
    });
    let found = fsck(&["-n", path]);
    let said = text(&found);
    assert_eq!(found.status.code(), Some(4), "{said}");
    assert!(said.contains("system.posix_acl_access"), "{said}");
    let repaired = fsck(&["-y", path]);
    assert_eq!(repaired.status.code(), Some(1), "{}", text(&repaired));
    assert_eq!(fsck(&["-n", path]).status.code(), Some(0));
    common::mounts(&image.path);
}
