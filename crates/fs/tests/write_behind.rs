#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

//! Write-behind (`MountOptions::data_cache`): what a user of cached writes relies on. The
//! model test (`model.rs`) and the concurrency test run the whole API with it on as well;
//! the crash explorer checks what a crash leaves.

mod common;

use std::sync::Arc;

use cairn_blockdev::MemDevice;
use cairn_fs::{FileKind, Filesystem, FsError, SeekKind};
use common::{fsck_clean, make_device, mount_with, root, write_behind};

const MIB: u64 = 1 << 20;

fn file(fs: &Filesystem, name: &str) -> u64 {
    fs.create(
        fs.root(),
        name.as_bytes(),
        FileKind::Regular,
        0o644,
        0,
        &root(),
    )
    .unwrap()
    .inode
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| seed.wrapping_add((i / 512) as u8))
        .collect()
}

fn truncate(fs: &Filesystem, inode: u64, size: u64) {
    let changes = cairn_fs::SetAttr {
        size: Some(size),
        ..Default::default()
    };
    fs.setattr(inode, &changes, &root()).unwrap();
}

fn remount(fs: Filesystem, device: &Arc<MemDevice>, cap: u64) -> Filesystem {
    fs.unmount().unwrap();
    fsck_clean(device);
    mount_with(device, write_behind(cap))
}

// A file written whole in small appends before its writeback gets one extent (delayed
// allocation), and its data reads back from the cache, after fsync and after a remount.
#[test]
fn a_file_written_in_small_appends_gets_one_extent() {
    let device = make_device(64 * MIB);
    let fs = mount_with(&device, write_behind(64 * MIB));
    let inode = file(&fs, "f");
    let data = pattern(1, 100 << 10);
    let allocations = fs.stats().alloc;
    for (index, chunk) in data.chunks(4096).enumerate() {
        fs.write(inode, index as u64 * 4096, chunk).unwrap();
    }
    assert_eq!(fs.getattr(inode).unwrap().size, data.len() as u64);
    assert_eq!(fs.read(inode, 0, data.len() as u32).unwrap(), data);
    // Counted in st_blocks before its writeback, as XFS counts delayed allocations.
    assert_eq!(
        fs.getattr(inode).unwrap().blocks_512,
        data.len() as u64 / 512
    );
    assert_eq!(
        fs.stats().alloc,
        allocations,
        "nothing allocated before the writeback"
    );
    fs.fsync(inode, false).unwrap();
    let extents = fs.file_extents(inode).unwrap();
    assert_eq!(extents.len(), 1, "{extents:?}");
    assert!(extents[0].length >= data.len() as u64 && !extents[0].unwritten);
    assert_eq!(fs.read(inode, 0, data.len() as u32).unwrap(), data);
    let fs = remount(fs, &device, 64 * MIB);
    assert_eq!(fs.read(inode, 0, data.len() as u32).unwrap(), data);
    fs.unmount().unwrap();
}

// Unmount writes everything back: many files written and never fsynced all read back.
#[test]
fn unmount_writes_every_cached_file_back() {
    let device = make_device(64 * MIB);
    let fs = mount_with(&device, write_behind(64 * MIB));
    let files: Vec<u64> = (0..50).map(|i| file(&fs, &format!("f{i}"))).collect();
    for (i, &inode) in files.iter().enumerate() {
        fs.write(inode, 0, &pattern(i as u8, 3000 + i * 500))
            .unwrap();
    }
    assert!(fs.stats().write_behind.dirty_bytes > 0);
    let fs = remount(fs, &device, 64 * MIB);
    for (i, &inode) in files.iter().enumerate() {
        let want = pattern(i as u8, 3000 + i * 500);
        assert_eq!(fs.read(inode, 0, 1 << 20).unwrap(), want, "file {i}");
    }
    fs.unmount().unwrap();
}

// Writers over the cap write back first: dirty bytes never pass the cap by more than one
// write, and a sequential file still ends up in few extents.
#[test]
fn dirty_bytes_stay_within_the_cap() {
    let device = make_device(64 * MIB);
    let cap = 256 << 10;
    let fs = mount_with(&device, write_behind(cap));
    let inode = file(&fs, "big");
    let chunk = pattern(7, 64 << 10);
    for step in 0..64u64 {
        fs.write(inode, step * chunk.len() as u64, &chunk).unwrap();
        let dirty = fs.stats().write_behind.dirty_bytes;
        assert!(dirty <= cap + chunk.len() as u64, "{dirty} dirty bytes");
    }
    fs.fsync(inode, false).unwrap();
    let stats = fs.stats().write_behind;
    assert_eq!((stats.dirty_bytes, stats.reserved_blocks), (0, 0));
    assert!(stats.throttled_writes > 0);
    let extents = fs.file_extents(inode).unwrap();
    assert!(extents.len() <= 4, "{extents:?}");
    fs.unmount().unwrap();
    fsck_clean(&device);
}

// A full filesystem is reported to the writer: every write that succeeded reads back after
// sync and a remount, no writeback lost anything, and the reservations were all given back.
#[test]
fn a_full_filesystem_fails_the_write_not_the_writeback() {
    let device = make_device(32 * MIB);
    let fs = mount_with(&device, write_behind(256 * MIB));
    let mut written = Vec::new();
    let error = 'fill: {
        for i in 0..10_000 {
            let inode = file(&fs, &format!("f{i}"));
            let data = pattern(i as u8, 60_000 + (i % 7) * 4096);
            match fs.write(inode, 0, &data) {
                Ok(_) => written.push((inode, data)),
                Err(error) => break 'fill error,
            }
        }
        panic!("the filesystem never filled");
    };
    assert!(matches!(error, FsError::NoSpace), "{error:?}");
    assert!(written.len() > 100, "only {} files fit", written.len());
    fs.sync().unwrap();
    let stats = fs.stats().write_behind;
    assert_eq!(stats.lost_writebacks, 0);
    assert_eq!((stats.dirty_bytes, stats.reserved_blocks), (0, 0));
    let fs = remount(fs, &device, 256 * MIB);
    for (inode, data) in &written {
        assert_eq!(&fs.read(*inode, 0, 1 << 20).unwrap(), data);
    }
    fs.unmount().unwrap();
}

// Space promised to cached writes is not reported free, and a file removed before its
// writeback gives its reservation back.
#[test]
fn reservations_show_in_statfs_and_go_with_the_file() {
    let device = make_device(64 * MIB);
    let fs = mount_with(&device, write_behind(64 * MIB));
    let free = fs.statfs().unwrap().blocks_free;
    let inode = file(&fs, "f");
    fs.write(inode, 0, &pattern(3, MIB as usize)).unwrap();
    let promised = free - fs.statfs().unwrap().blocks_free;
    assert!(promised >= 256, "{promised} blocks promised for 1 MiB");
    fs.unlink(fs.root(), b"f", &root()).unwrap();
    fs.forget(inode, 1);
    let stats = fs.stats().write_behind;
    assert_eq!((stats.dirty_bytes, stats.reserved_blocks), (0, 0));
    assert!(fs.statfs().unwrap().blocks_free >= free - 8);
    fs.unmount().unwrap();
    fsck_clean(&device);
}

// A direct write over cached data wins (the cached pages go to the device first), and
// SEEK_DATA, truncate and fallocate see cached data.
#[test]
fn direct_writes_and_mapping_operations_see_cached_data() {
    let device = make_device(64 * MIB);
    let fs = mount_with(&device, write_behind(64 * MIB));
    let inode = file(&fs, "f");
    fs.write(inode, 0, &[b'a'; 8192]).unwrap();
    fs.write_direct(inode, 4096, &[b'b'; 4096], None).unwrap();
    let read = fs.read(inode, 0, 8192).unwrap();
    assert!(read[..4096].iter().all(|&b| b == b'a') && read[4096..].iter().all(|&b| b == b'b'));
    let sparse = file(&fs, "sparse");
    fs.write(sparse, MIB, b"data").unwrap();
    assert_eq!(fs.seek(sparse, 0, SeekKind::Data).unwrap(), MIB);
    fs.write(sparse, MIB + 4, &[b'x'; 5000]).unwrap();
    truncate(&fs, sparse, MIB + 2);
    truncate(&fs, sparse, MIB + 8192);
    let tail = fs.read(sparse, MIB, 8192).unwrap();
    assert_eq!(&tail[..2], b"da");
    assert!(
        tail[2..].iter().all(|&b| b == 0),
        "bytes past a truncate came back"
    );
    let fs = remount(fs, &device, 64 * MIB);
    assert_eq!(fs.read(sparse, MIB, 8192).unwrap(), tail);
    let read = fs.read(inode, 0, 8192).unwrap();
    assert!(read[..4096].iter().all(|&b| b == b'a') && read[4096..].iter().all(|&b| b == b'b'));
    fs.unmount().unwrap();
}

// A writeback that fails loses that file's cached data and says so: the file's next fsync
// fails (once, as Linux reports a writeback error), the loss is counted, and the filesystem
// goes on working.
#[test]
fn a_failed_writeback_is_reported_by_the_next_fsync() {
    let device = make_device(64 * MIB);
    let fs = mount_with(&device, write_behind(64 * MIB));
    let inode = file(&fs, "f");
    fs.fsync(inode, false).unwrap();
    fs.write(inode, 0, &pattern(5, 8192)).unwrap();
    device.fail_nth_write(1);
    let error = fs.fsync(inode, false).unwrap_err();
    assert!(matches!(error, FsError::Io { .. }), "{error:?}");
    assert_eq!(fs.stats().write_behind.lost_writebacks, 1);
    assert_eq!(fs.stats().write_behind.reserved_blocks, 0);
    fs.fsync(inode, false).unwrap();
    fs.write(inode, 0, b"again").unwrap();
    fs.fsync(inode, false).unwrap();
    assert_eq!(&fs.read(inode, 0, 5).unwrap(), b"again");
    fs.unmount().unwrap();
    fsck_clean(&device);
}
