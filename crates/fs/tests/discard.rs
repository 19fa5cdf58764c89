//! Freed space goes back to the device: online discard (`MountOptions::discard`) once the
//! free is durable, and `Filesystem::trim` of all free space. The memory device records a
//! discard as zeros, so the freed blocks read back as zeros afterwards.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;

use cairn_blockdev::{AlignedBuf, BlockDevice, MemDevice};
use cairn_fs::{Credentials, FileExtent, FileKind, Filesystem, MountOptions};

const FILE_BYTES: usize = 4 << 20;

fn mount_with(device: &Arc<MemDevice>, discard: bool) -> Filesystem {
    let options = MountOptions {
        discard,
        ..MountOptions::default()
    };
    let dyn_device: Arc<dyn BlockDevice> = device.clone();
    Filesystem::mount(dyn_device, options).unwrap()
}

/// Writes a file of non-zero bytes, syncs, and returns its inode and extents.
fn write_file(fs: &Filesystem, name: &str) -> (u64, Vec<FileExtent>) {
    let who = Credentials::root();
    let attr = fs
        .create(
            fs.root(),
            name.as_bytes(),
            FileKind::Regular,
            0o644,
            0,
            &who,
        )
        .unwrap();
    fs.write(attr.inode, 0, &vec![0xa5; FILE_BYTES]).unwrap();
    fs.fsync(attr.inode, false).unwrap();
    let extents = fs.file_extents(attr.inode).unwrap();
    assert!(!extents.is_empty());
    (attr.inode, extents)
}

/// Unlinks `name` and drops the lookup reference, which frees its blocks.
fn remove_file(fs: &Filesystem, name: &str, inode: u64) {
    fs.unlink(fs.root(), name.as_bytes(), &Credentials::root())
        .unwrap();
    fs.forget(inode, 1);
}

/// Whether every byte of `extents` reads as zero on `device`.
fn all_zero(device: &MemDevice, extents: &[FileExtent]) -> bool {
    extents.iter().all(|extent| {
        let mut buf = AlignedBuf::zeroed(extent.length as usize);
        device.read_at(extent.physical, &mut buf).unwrap();
        buf.iter().all(|&byte| byte == 0)
    })
}

// With online discard, a removed file's blocks are discarded once the removal is durable,
// and the filesystem stays consistent; without it they keep their old bytes.
#[test]
fn online_discard_zeroes_freed_blocks_once_durable() {
    for discard in [false, true] {
        let device = common::make_device(64 << 20);
        let fs = mount_with(&device, discard);
        let (inode, extents) = write_file(&fs, "f");
        remove_file(&fs, "f", inode);
        fs.sync().unwrap();
        fs.sync().unwrap();
        fs.drain_discards();
        assert_eq!(all_zero(&device, &extents), discard, "discard {discard}");
        let (discarded, bytes, failures) = fs.discard_counts();
        assert_eq!(failures, 0);
        if discard {
            assert!(discarded > 0 && bytes >= FILE_BYTES as u64, "{bytes}");
        }
        // The space is usable again.
        write_file(&fs, "g");
        fs.unmount().unwrap();
        common::fsck_clean(&device);
    }
}

// Unmount discards what the last checkpoints freed, and lets go of the device (the discard
// thread and the journal's hook once held each other, and the device, for ever).
#[test]
fn unmount_discards_the_last_frees() {
    let device = common::make_device(64 << 20);
    let fs = mount_with(&device, true);
    let (inode, extents) = write_file(&fs, "f");
    remove_file(&fs, "f", inode);
    fs.unmount().unwrap();
    assert_eq!(Arc::strong_count(&device), 1, "the device is still held");
    assert!(all_zero(&device, &extents));
    common::fsck_clean(&device);
}

// Shared blocks are never discarded: a trim after the original of a clone went leaves the
// clone's blocks alone, and one after the clone went too discards them.
#[test]
fn trim_keeps_blocks_a_clone_still_maps() {
    let device = common::make_device(64 << 20);
    let fs = mount_with(&device, false);
    let (inode, extents) = write_file(&fs, "f");
    let who = cairn_fs::Credentials::root();
    let copy = fs
        .create(
            fs.root(),
            b"copy",
            cairn_fs::FileKind::Regular,
            0o644,
            0,
            &who,
        )
        .unwrap()
        .inode;
    fs.copy_file_range(inode, 0, copy, 0, FILE_BYTES as u64)
        .unwrap();
    remove_file(&fs, "f", inode);
    fs.trim(0).unwrap();
    assert!(
        !all_zero(&device, &extents),
        "a block the clone maps was discarded"
    );
    assert!(fs.read(copy, 0, 4096).unwrap().iter().all(|&b| b == 0xa5));
    remove_file(&fs, "copy", copy);
    fs.trim(0).unwrap();
    assert!(all_zero(&device, &extents));
    fs.unmount().unwrap();
    common::fsck_clean(&device);
}

// A trim discards every free extent, freed-but-durable space included, and reports it.
#[test]
fn trim_discards_free_space() {
    let device = common::make_device(64 << 20);
    let fs = mount_with(&device, false);
    let (inode, extents) = write_file(&fs, "f");
    let kept = write_file(&fs, "kept");
    remove_file(&fs, "f", inode);
    let report = fs.trim(0).unwrap();
    assert!(report.bytes >= FILE_BYTES as u64, "{report:?}");
    assert!(all_zero(&device, &extents));
    assert!(!all_zero(&device, &kept.1), "a live file was discarded");
    let data = fs.read(kept.0, 0, 4096).unwrap();
    assert!(data.iter().all(|&b| b == 0xa5));
    let large_only = fs.trim(u64::MAX).unwrap();
    assert_eq!(large_only.bytes, 0);
    fs.unmount().unwrap();
    common::fsck_clean(&device);
}
