//! The attribute checks: POSIX ACLs in the System namespace must decode and be valid lists;
//! a broken one is found (`-n`, exit 4) and the attributes dropped by `-y`, after which the
//! image is clean and mounts. A damaged attr fork keeps the attributes that verify.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use cairn_blockdev::MemDevice;
use cairn_format::MetaKind;
use cairn_format::acl::{Acl, AclEntry, AclTag};
use cairn_fs::{Credentials, FileKind, Filesystem, MountOptions, XattrFlags};
use common::{SECTOR, edit_inode, populated, text};

fn fsck(args: &[&str]) -> std::process::Output {
    common::run(env!("CARGO_BIN_EXE_fsck-cairn"), args)
}

// A file whose access ACL (short form, in the inode) has an unknown tag in its mask entry.
#[test]
fn broken_acl_is_found_and_dropped() {
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
    let (image, f) = image_with_file(b"acl", |fs, f| {
        let who = Credentials::root();
        fs.setxattr(f, b"system.posix_acl_access", &raw, XattrFlags::Any, &who)
            .unwrap();
    });
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

/// The populated image plus file `name`, given to `fill` (through cairn-fs) before the
/// image is written back.
fn image_with_file(name: &[u8], fill: impl FnOnce(&Filesystem, u64)) -> (common::Image, u64) {
    let image = populated();
    let bytes = std::fs::read(&image.path).unwrap();
    let device = Arc::new(MemDevice::from_image(bytes, SECTOR).unwrap());
    let fs = Filesystem::mount(device.clone(), MountOptions::default()).unwrap();
    let who = Credentials::root();
    let f = fs
        .create(fs.root(), name, FileKind::Regular, 0o640, 0, &who)
        .unwrap()
        .inode;
    fill(&fs, f);
    fs.unmount().unwrap();
    std::fs::write(&image.path, device.snapshot()).unwrap();
    (image, f)
}

/// An image with file `many` holding 300 attributes (the index form: leaves and a tree).
fn index_form_image() -> (common::Image, u64) {
    image_with_file(b"many", |fs, f| {
        let who = Credentials::root();
        for i in 0..300 {
            let name = format!("user.attribute-number-{i:04}");
            let value = format!("value {i}").repeat(i % 5 + 1);
            fs.setxattr(f, name.as_bytes(), value.as_bytes(), XattrFlags::Any, &who)
                .unwrap();
        }
    })
}

/// `-n` finds `want`, `-y` repairs, `-n` is clean, and the image mounts with `many`
/// still there.
fn found_and_repaired(image: &common::Image, want: &str) {
    let path = image.path.to_str().unwrap();
    let found = fsck(&["-n", path]);
    let said = text(&found);
    assert_eq!(found.status.code(), Some(4), "{said}");
    assert!(said.contains(want), "want {want:?} in\n{said}");
    let repaired = fsck(&["-y", path]);
    assert_eq!(repaired.status.code(), Some(1), "{}", text(&repaired));
    assert_eq!(fsck(&["-n", path]).status.code(), Some(0));
    common::mounts(&image.path);
}

/// The attributes of inode `f` of the image, by name.
fn attributes(image: &common::Image, f: u64) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let bytes = std::fs::read(&image.path).unwrap();
    let device = Arc::new(MemDevice::from_image(bytes, SECTOR).unwrap());
    let fs = Filesystem::mount(device, MountOptions::default()).unwrap();
    let who = Credentials::root();
    let names = fs.listxattr(f, &who).unwrap();
    let all = names
        .into_iter()
        .map(|name| {
            let value = fs.getxattr(f, &name, &who).unwrap();
            (name, value)
        })
        .collect();
    fs.unmount().unwrap();
    all
}

// The index form is clean as written; a damaged index tree block is found by its verifier,
// and -y builds the index anew over the leaves: every attribute is kept.
#[test]
fn damaged_index_tree_block() {
    let (image, f) = index_form_image();
    let before = attributes(&image, f);
    assert_eq!(before.len(), 300);
    let path = image.path.to_str().unwrap();
    assert_eq!(
        fsck(&["-n", path]).status.code(),
        Some(0),
        "clean index form"
    );
    let magic = MetaKind::AttrBtree.magic().to_le_bytes();
    let block = common::blocks_with_magic(&image, &magic)[0];
    let at = block * u64::from(image.geometry.block_size) + 100;
    let mut byte = common::read_bytes(&image.path, at, 1);
    byte[0] ^= 0x40;
    common::write_bytes(&image.path, at, &byte);
    found_and_repaired(&image, MetaKind::AttrBtree.name());
    assert_eq!(attributes(&image, f), before);
}

// A damaged leaf of the index form loses its own attributes only: the other leaves keep
// theirs, under an index built anew.
#[test]
fn damaged_index_form_leaf() {
    let (image, f) = index_form_image();
    let before = attributes(&image, f);
    let leaves = common::blocks_with_magic(&image, &MetaKind::AttrBlock.magic().to_le_bytes());
    assert!(leaves.len() >= 3, "300 attributes fill several leaves");
    let at = leaves[1] * u64::from(image.geometry.block_size) + 100;
    let mut byte = common::read_bytes(&image.path, at, 1);
    byte[0] ^= 0x40;
    common::write_bytes(&image.path, at, &byte);
    found_and_repaired(&image, MetaKind::AttrBlock.name());
    let after = attributes(&image, f);
    assert!(
        !after.is_empty() && after.len() < before.len(),
        "{}",
        after.len()
    );
    for (name, value) in &after {
        assert_eq!(
            before.get(name),
            Some(value),
            "{}",
            String::from_utf8_lossy(name)
        );
    }
}

// An index record pointing at a leaf that does not hold its attribute (CRC re-stamped, so
// only the cross-check between the tree and the leaves sees it).
#[test]
fn index_record_pointing_at_the_wrong_leaf() {
    let (image, _) = index_form_image();
    let leaves = common::blocks_with_magic(&image, &MetaKind::AttrBlock.magic().to_le_bytes());
    let trees = common::blocks_with_magic(&image, &MetaKind::AttrBtree.magic().to_le_bytes());
    assert!(leaves.len() >= 2, "300 attributes fill more than one leaf");
    let tree_leaf = trees
        .into_iter()
        .find(|&b| {
            common::read_bytes(
                &image.path,
                b * u64::from(image.geometry.block_size) + 48,
                2,
            ) == [0, 0]
        })
        .expect("no index tree leaf");
    common::edit_block(&image, tree_leaf, |raw| {
        // Record 0 (from offset 72: hash u32, seq u32, leaf u64): point it elsewhere.
        let leaf = u64::from_le_bytes(raw[80..88].try_into().unwrap());
        let other = leaves.iter().copied().find(|&b| b != leaf).unwrap();
        raw[80..88].copy_from_slice(&other.to_le_bytes());
    });
    found_and_repaired(&image, "the index names");
}
