//! The namespace checks on populated images: each kind of damage to directories, link counts,
//! unlinked lists, LSNs and the log is found (exit 4, named), and an undamaged image is clean.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;

use cairn_blockdev::{BlockDevice, MemDevice};
use cairn_format::dir::{ShortformDir, ShortformEntry};
use cairn_format::inode::FileType;
use cairn_format::ondisk::{put_u32, put_u64};
use cairn_format::{AgBlock, AgNumber};
use cairn_fs::{Credentials, FileKind, Filesystem, MountOptions};
use common::{Image, blocks_with_magic, edit_block, edit_inode, populated, text};

fn fsck(args: &[&str]) -> std::process::Output {
    common::run(env!("CARGO_BIN_EXE_fsck-cairn"), args)
}

/// Runs `fsck -n` and expects exit 4 with `want` in the output.
fn expect_found(image: &Image, want: &str) {
    let out = fsck(&["-n", image.path.to_str().unwrap()]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(4), "{said}");
    assert!(said.contains(want), "want {want:?} in\n{said}");
    assert!(!said.contains("panicked"), "{said}");
}

/// Rewrites the short-form directory `dir` with `edit`.
fn edit_shortform(image: &Image, dir: u64, edit: impl FnOnce(&mut ShortformDir)) {
    edit_inode(image, dir, |core, fork| {
        let mut sf = ShortformDir::decode(&fork[..core.size as usize]).unwrap();
        edit(&mut sf);
        let bytes = sf.encode().unwrap();
        fork[..bytes.len()].copy_from_slice(&bytes);
        core.size = bytes.len() as u64;
    });
}

// A populated image (short-form and indexed block directories, hard links, data) is clean.
#[test]
fn populated_image_is_clean() {
    let image = populated();
    let out = fsck(&["-n", image.path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

// A file's link count raised by two is reported against the entries naming it.
#[test]
fn wrong_link_count() {
    let image = populated();
    edit_inode(&image, image.f1, |core, _| core.nlink = 3);
    expect_found(
        &image,
        &format!("inode {} has link count 3, expected 1", image.f1),
    );
}

// An entry pointed at an inode that is not in use is a dangling entry.
#[test]
fn dangling_entry() {
    let image = populated();
    let g = image.geometry;
    let last_ag = g.ag_count - 1;
    let unused = g.inode_number(AgNumber(last_ag), AgBlock(g.ag_len(last_ag) - 1), 0);
    edit_shortform(&image, image.root, |sf| {
        let entry = sf.entries.iter_mut().find(|e| e.name == b"f1").unwrap();
        entry.inode = unused.0;
    });
    expect_found(
        &image,
        &format!("names inode {}, which is not in use", unused.0),
    );
}

// Removing a directory's only entry leaves it disconnected from the root.
#[test]
fn disconnected_directory() {
    let image = populated();
    edit_shortform(&image, image.root, |sf| {
        sf.entries.retain(|e| e.name != b"a")
    });
    expect_found(&image, &format!("directory {} is not reachable", image.a));
}

// A second entry naming a directory gives it two parents.
#[test]
fn directory_with_two_parents() {
    let image = populated();
    edit_shortform(&image, image.root, |sf| {
        let tag = sf.entries.last().unwrap().tag + 64;
        sf.entries.push(ShortformEntry {
            tag,
            file_type: FileType::Directory,
            inode: image.b,
            name: b"b2".to_vec(),
        });
    });
    expect_found(
        &image,
        &format!("directory {}: is named by 2 entries", image.b),
    );
}

// A directory whose '..' names the wrong directory is reported.
#[test]
fn wrong_dotdot() {
    let image = populated();
    edit_shortform(&image, image.b, |sf| sf.parent = image.root);
    expect_found(
        &image,
        &format!("'..' is {}, but its parent is {}", image.root, image.a),
    );
}

// An inode with links on an unlinked list, and one without links off the lists, are found.
#[test]
fn unlinked_list_members() {
    let image = populated();
    let g = image.geometry;
    let ag = (image.f1 >> g.ag_inode_bits()) as u32;
    let ag_inode = (image.f1 & ((1 << g.ag_inode_bits()) - 1)) as u32;
    let agi = g.ag_start(ag) + 2;
    edit_block(&image, agi, |raw| {
        put_u32(raw, 88 + 4 * (ag_inode as usize % 64), ag_inode);
    });
    expect_found(&image, "is on an unlinked list but has links");
    let image = populated();
    edit_inode(&image, image.f2, |core, _| core.nlink = 0);
    expect_found(
        &image,
        &format!("inode {} has link count 0, expected 2", image.f2),
    );
}

// A metadata block stamped with an LSN later than the log's newest record is found.
#[test]
fn lsn_in_the_future() {
    let image = populated();
    let agf = image.geometry.ag_start(1) + 1;
    edit_block(&image, agf, |raw| put_u64(raw, 16, 99 << 32));
    expect_found(&image, "is later than the newest log record");
}

// Damaged directory data and hash index blocks are named by their verifiers.
#[test]
fn damaged_directory_blocks() {
    for (magic, name) in [
        (b"CDD1", "directory data block"),
        (b"CDB1", "directory hash tree block"),
    ] {
        let image = populated();
        let blocks = blocks_with_magic(&image, magic);
        assert!(!blocks.is_empty(), "no {name}");
        let at = blocks[0] * u64::from(image.geometry.block_size) + 200;
        let byte = common::read_bytes(&image.path, at, 1)[0];
        common::write_bytes(&image.path, at, &[byte ^ 0x10]);
        expect_found(&image, name);
    }
}

// A log with committed changes and no unmount record needs recovery: fsck says so.
#[test]
fn dirty_log() {
    let image = populated();
    let bytes = std::fs::read(&image.path).unwrap();
    let device = Arc::new(MemDevice::from_image(bytes, common::SECTOR).unwrap());
    let dyn_device: Arc<dyn BlockDevice> = device.clone();
    let fs = Filesystem::mount(dyn_device, MountOptions::default()).unwrap();
    let who = Credentials::root();
    let file = fs
        .create(fs.root(), b"new", FileKind::Regular, 0o644, 0, &who)
        .unwrap();
    fs.fsync(file.inode, false).unwrap();
    std::fs::write(&image.path, device.durable_image()).unwrap();
    drop(fs);
    expect_found(&image, "never replayed");
}
