//! Growing a filesystem: the last AG extended and new AGs added, every file intact, the new
//! space allocatable, fsck clean; and a crash at any point of the grow leaves the old or the
//! new size, never a broken filesystem.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;

use cairn_blockdev::{BlockDevice, MemDevice};
use cairn_fs::{Credentials, FileKind, Filesystem, MountOptions};
use cairn_mkfs::{FormatOptions, Request};

const BLOCK: u64 = 4096;

/// A `device_bytes` device holding a filesystem of `fs_bytes` in AGs of 12 MiB (so the last
/// is short unless `fs_bytes` is a multiple) with a file "f" of `len` bytes, unmounted.
fn small_fs_on_big_device(device_bytes: u64, fs_bytes: u64, len: usize) -> Arc<MemDevice> {
    let device = MemDevice::new(device_bytes, 4096);
    let request = Request {
        fs_bytes: Some(fs_bytes),
        ag_bytes: Some(12 << 20),
        ..Request::default()
    };
    let plan = cairn_mkfs::plan(device_bytes, 4096, &request).unwrap();
    let options = FormatOptions {
        uuid: Some([5; 16]),
        discard: false,
        now_secs: 1_700_000_000,
    };
    cairn_mkfs::format(&device, &plan, &options).unwrap();
    let device = Arc::new(device);
    let fs = common::mount(&device);
    let who = Credentials::root();
    let attr = fs
        .create(fs.root(), b"f", FileKind::Regular, 0o644, 0, &who)
        .unwrap();
    fs.write(attr.inode, 0, &pattern(len)).unwrap();
    fs.unmount().unwrap();
    device
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 / 7) as u8).collect()
}

fn mount(device: &Arc<MemDevice>) -> Filesystem {
    let dyn_device: Arc<dyn BlockDevice> = device.clone();
    Filesystem::mount(dyn_device, MountOptions::default()).unwrap()
}

fn read_f(fs: &Filesystem, len: usize) -> Vec<u8> {
    let inode = fs.lookup(fs.root(), b"f").unwrap().inode;
    let mut data = Vec::new();
    while data.len() < len {
        let chunk = fs.read(inode, data.len() as u64, 1 << 20).unwrap();
        assert!(!chunk.is_empty());
        data.extend_from_slice(&chunk);
    }
    data
}

// A short last AG is extended and new AGs added; the file survives, statfs shows the new
// size, the new space takes a file larger than the old filesystem, fsck is clean.
#[test]
fn grow_extends_the_last_ag_and_adds_new_ones() {
    let len = 3 << 20;
    let device = small_fs_on_big_device(96 << 20, 21 << 20, len);
    let fs = mount(&device);
    let before = fs.statfs().unwrap();
    let report = fs.grow(u64::MAX).unwrap();
    assert_eq!(report.old_blocks, before.blocks);
    assert_eq!(report.new_blocks, (96 << 20) / BLOCK);
    assert!(report.new_ags > report.old_ags, "{report:?}");
    common::fsck_clean(&device);
    let fs = mount(&device);
    let after = fs.statfs().unwrap();
    assert_eq!(after.blocks, report.new_blocks);
    assert!(after.blocks_free > before.blocks_free + (60 << 20) / BLOCK);
    assert!(read_f(&fs, len) == pattern(len));
    let who = Credentials::root();
    let big = fs
        .create(fs.root(), b"big", FileKind::Regular, 0o644, 0, &who)
        .unwrap();
    // Written as the kernel sends it, 1 MiB a request.
    for (index, chunk) in pattern(40 << 20).chunks(1 << 20).enumerate() {
        fs.write(big.inode, (index as u64) << 20, chunk).unwrap();
    }
    fs.fsync(big.inode, false).unwrap();
    fs.unmount().unwrap();
    common::fsck_clean(&device);
    // Nothing to grow into: refused, nothing changed.
    let fs = mount(&device);
    assert!(fs.grow(u64::MAX).is_err());
    common::fsck_clean(&device);
}

// A crash at every flush point of a grow (and sampled subsets and torn writes after it):
// the next mount recovers, fsck is clean, the size is the old or the new one, the file is
// intact.
#[test]
fn crash_during_grow_leaves_the_old_or_the_new_size() {
    let len = 1 << 20;
    let device = small_fs_on_big_device(48 << 20, 19 << 20, len);
    let old_blocks = mount(&device).statfs().unwrap().blocks;
    device.clear_log();
    let report = mount(&device).grow(u64::MAX).unwrap();
    let mut sizes = std::collections::BTreeSet::new();
    for point in device.crash_points(2, 21) {
        let crashed = Arc::new(device.crash_device(&point).unwrap());
        let fs = mount(&crashed);
        let blocks = fs.statfs().unwrap().blocks;
        assert!(
            blocks == old_blocks || blocks == report.new_blocks,
            "{point:?}: {blocks} blocks"
        );
        sizes.insert(blocks);
        assert!(read_f(&fs, len) == pattern(len), "{point:?}: file differs");
        fs.unmount().unwrap();
        common::fsck_clean(&crashed);
    }
    assert_eq!(sizes.len(), 2, "both outcomes reached: {sizes:?}");
}

// Grow with shared blocks (reflink): the clone and the file still share after the grow,
// the new AGs start without refcount trees, a clone into the new space works, fsck is clean.
#[test]
fn grow_keeps_shared_blocks() {
    let len = 3 << 20;
    let device = small_fs_on_big_device(96 << 20, 21 << 20, len);
    let fs = mount(&device);
    let who = Credentials::root();
    let f = fs.lookup(fs.root(), b"f").unwrap().inode;
    let copy = fs
        .create(fs.root(), b"copy", FileKind::Regular, 0o644, 0, &who)
        .unwrap()
        .inode;
    fs.copy_file_range(f, 0, copy, 0, len as u64).unwrap();
    fs.grow(u64::MAX).unwrap();
    common::fsck_clean(&device);
    let fs = mount(&device);
    let big = fs
        .create(fs.root(), b"big", FileKind::Regular, 0o644, 0, &who)
        .unwrap()
        .inode;
    for (index, chunk) in pattern(40 << 20).chunks(1 << 20).enumerate() {
        fs.write(big, (index as u64) << 20, chunk).unwrap();
    }
    let second = fs
        .create(fs.root(), b"second", FileKind::Regular, 0o644, 0, &who)
        .unwrap()
        .inode;
    fs.copy_file_range(big, 0, second, 0, 40 << 20).unwrap();
    assert_eq!(fs.read(copy, 0, 4096).unwrap(), pattern(4096));
    fs.unmount().unwrap();
    common::fsck_clean(&device);
}
