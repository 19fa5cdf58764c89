#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

//! Deleting files from a full filesystem always works. Freeing an inode can grow its AG's
//! free-inode tree (a chunk's first free inode adds a record), so the AG must keep blocks for
//! it: without them, unlinking from an AG filled with inode chunks and data failed with
//! `NoSpace` once a free-inode tree leaf split (the million-entry directory's removal did).

mod common;

use std::sync::Arc;

use cairn_blockdev::MemDevice;
use cairn_fs::{FileKind, Filesystem, FsError};
use common::{fsck_clean, mount, root};

/// Inodes per inode chunk (the format's).
const CHUNK_INODES: usize = 64;

/// A small filesystem of 1 KiB blocks in one AG.
fn small_device() -> Arc<MemDevice> {
    common::make_small_block_device(6 << 20, 1024, 1)
}

fn name(index: usize) -> Vec<u8> {
    format!("f{index:06}").into_bytes()
}

// Fills the filesystem with empty files (inode chunks), then the rest with one file's data,
// then unlinks the files one per inode chunk first (each adds a free-inode tree record):
// every unlink succeeds, the space comes back, and fsck is clean.
#[test]
fn unlink_from_a_full_filesystem_frees_every_inode() {
    let device = small_device();
    let fs = mount(&device);
    let (top, who) = (fs.root(), root());
    let dir = fs.mkdir(top, b"d", 0o755, &who).unwrap().inode;
    let filler = fs
        .create(top, b"filler", FileKind::Regular, 0o644, 0, &who)
        .unwrap()
        .inode;
    let mut count = 0;
    let error = loop {
        match fs.create(dir, &name(count), FileKind::Regular, 0o644, 0, &who) {
            Ok(made) => fs.forget(made.inode, 1),
            Err(error) => break error,
        }
        count += 1;
        assert!(count < 1 << 20, "the filesystem never filled");
    };
    assert!(matches!(error, FsError::NoSpace), "{error:?}");
    assert!(count > 20 * CHUNK_INODES, "only {count} files");
    fill_with_data(&fs, filler);
    let order = (0..CHUNK_INODES).flat_map(|first| (first..count).step_by(CHUNK_INODES));
    for index in order {
        fs.unlink(dir, &name(index), &who)
            .unwrap_or_else(|e| panic!("unlink {index} of {count}: {e}"));
    }
    fs.rmdir(top, b"d", &who).unwrap();
    fs.unlink(top, b"filler", &who).unwrap();
    fs.forget(filler, 1);
    let again = fs
        .create(top, b"again", FileKind::Regular, 0o644, 0, &who)
        .unwrap()
        .inode;
    // Inode chunks stay allocated; the filler's space is usable again.
    let free = fs.statfs().unwrap().blocks_free;
    assert!(free >= 64, "{free} blocks free");
    fs.write(again, 0, &[3; 64 << 10]).unwrap();
    fs.unmount().unwrap();
    fsck_clean(&device);
}

/// Writes one block at a time at the end of `inode` until the filesystem is full.
fn fill_with_data(fs: &Filesystem, inode: u64) {
    let block = [0x5a; 1024];
    let mut size = 0;
    loop {
        match fs.write(inode, size, &block) {
            Ok(written) => size += u64::from(written),
            Err(FsError::NoSpace) => return,
            Err(error) => panic!("filling: {error}"),
        }
        assert!(size < 1 << 30, "the filesystem never filled");
    }
}
