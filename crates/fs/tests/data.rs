#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use cairn_fs::{FileKind, Filesystem};
use common::{fsck_clean, make_device, mount, root};

const BLOCK: u64 = 4096;

/// Writes one distinct block at every other file block `0, 2, 4, ..` up to `count` blocks,
/// so each becomes its own extent.
fn write_sparse(fs: &Filesystem, inode: u64, count: u64) {
    for index in 0..count {
        let fill = (index % 251) as u8 + 1;
        let block = vec![fill; BLOCK as usize];
        fs.write(inode, index * 2 * BLOCK, &block).unwrap();
    }
}

fn check_sparse(fs: &Filesystem, inode: u64, count: u64) {
    for index in 0..count {
        let fill = (index % 251) as u8 + 1;
        let data = fs.read(inode, index * 2 * BLOCK, 2 * BLOCK as u32).unwrap();
        assert!(
            data[..BLOCK as usize].iter().all(|&b| b == fill),
            "block {index}"
        );
        if index + 1 < count {
            assert!(
                data[BLOCK as usize..].iter().all(|&b| b == 0),
                "hole {index}"
            );
        }
    }
}

fn new_file(fs: &Filesystem, name: &[u8]) -> u64 {
    let attr = fs
        .create(fs.root(), name, FileKind::Regular, 0o644, 0, &root())
        .unwrap();
    attr.inode
}

// Writes enough sparse blocks to move the extent list into a two-level tree, reads back,
// remounts, checks fsck, then truncates back until the list is inline again.
#[test]
fn sparse_file_grows_a_tree_and_shrinks_back() {
    let device = make_device(64 << 20);
    let fs = mount(&device);
    let inode = new_file(&fs, b"sparse");
    let count = 600;
    write_sparse(&fs, inode, count);
    check_sparse(&fs, inode, count);
    let attr = fs.getattr(inode).unwrap();
    assert!(attr.blocks_512 >= count * 8, "tree blocks counted too");
    fs.unmount().unwrap();
    fsck_clean(&device);

    let fs = mount(&device);
    check_sparse(&fs, inode, count);
    let mut size = count * 2 * BLOCK;
    for keep in [400u64, 120, 5, 0] {
        size = size.min(keep * 2 * BLOCK);
        let changes = cairn_fs::SetAttr {
            size: Some(size),
            ..Default::default()
        };
        fs.setattr(inode, &changes, &root()).unwrap();
        check_sparse(&fs, inode, keep);
        fs.sync().unwrap();
    }
    assert_eq!(fs.getattr(inode).unwrap().blocks_512, 0);
    fs.unmount().unwrap();
    fsck_clean(&device);
}

// Removes a file whose map is a tree: every data and tree block goes back to free space.
#[test]
fn unlinking_a_tree_file_frees_everything() {
    let device = make_device(64 << 20);
    let fs = mount(&device);
    let before = fs.statfs().unwrap().blocks_free;
    let inode = new_file(&fs, b"doomed");
    write_sparse(&fs, inode, 300);
    fs.forget(inode, 1);
    fs.unlink(fs.root(), b"doomed", &root()).unwrap();
    fs.sync().unwrap();
    assert_eq!(fs.statfs().unwrap().blocks_free, before);
    fs.unmount().unwrap();
    fsck_clean(&device);
}

// Fills holes of a tree-mapped file one by one (records merge and the tree shrinks), with
// overwrites in place in between; reads check every byte and fsck the result.
#[test]
fn filling_holes_merges_records() {
    let device = make_device(64 << 20);
    let fs = mount(&device);
    let inode = new_file(&fs, b"holes");
    let count = 100;
    write_sparse(&fs, inode, count);
    for index in 0..count - 1 {
        let block = vec![0xee; BLOCK as usize];
        fs.write(inode, (index * 2 + 1) * BLOCK, &block).unwrap();
    }
    fs.write(inode, 10, b"in place").unwrap();
    let data = fs.read(inode, 0, (2 * count * BLOCK) as u32).unwrap();
    assert_eq!(&data[10..18], b"in place");
    for index in 0..count - 1 {
        let at = ((index * 2 + 1) * BLOCK) as usize;
        assert!(data[at..at + BLOCK as usize].iter().all(|&b| b == 0xee));
    }
    fs.unmount().unwrap();
    fsck_clean(&device);
}
