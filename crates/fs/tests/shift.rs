//! Collapse and insert range through the library API: XFS's rules and errors, contents
//! and sizes against a byte model (contiguous, fragmented and tree-mapped files, with
//! write-behind data), and a crash at every flush point of a shift leaving the file as it
//! was or as it is after, never in between.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;

use cairn_blockdev::CrashPoint;
use cairn_fs::{FallocateMode, FileKind, Filesystem, FsError, LogMode, MountOptions};
use common::{fsck_clean, make_device, make_small_block_device, mount, mount_with, root};

const COLLAPSE: FallocateMode = FallocateMode::CollapseRange;
const INSERT: FallocateMode = FallocateMode::InsertRange;

fn file(fs: &Filesystem, name: &[u8]) -> u64 {
    fs.create(fs.root(), name, FileKind::Regular, 0o644, 0, &root())
        .unwrap()
        .inode
}

/// Bytes that differ at every offset and between files.
fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u64 * 131 + u64::from(seed) * 7 + (i as u64 >> 12)) as u8)
        .collect()
}

fn read_all(fs: &Filesystem, inode: u64) -> Vec<u8> {
    let size = fs.getattr(inode).unwrap().size;
    let mut out = Vec::new();
    while (out.len() as u64) < size {
        let chunk = fs.read(inode, out.len() as u64, 1 << 20).unwrap();
        assert!(!chunk.is_empty());
        out.extend_from_slice(&chunk);
    }
    out
}

fn shifted(model: &[u8], offset: usize, len: usize, mode: FallocateMode) -> Vec<u8> {
    let mut out = model.to_vec();
    match mode {
        FallocateMode::CollapseRange => drop(out.drain(offset..offset + len)),
        _ => drop(out.splice(offset..offset, std::iter::repeat_n(0, len))),
    }
    out
}

// The example: 1 MiB collapsed at 4 MiB of an 8 MiB file leaves 7 MiB with the tail
// moved down and one MiB of blocks fewer; 1 MiB inserted at 4 MiB leaves 9 MiB with a hole
// there; both survive a remount and fsck.
#[test]
fn collapse_and_insert_a_megabyte() {
    let device = make_device(64 << 20);
    let fs = mount(&device);
    let data = pattern(1, 8 << 20);
    let collapsed = file(&fs, b"collapsed");
    let inserted = file(&fs, b"inserted");
    for inode in [collapsed, inserted] {
        fs.write(inode, 0, &data).unwrap();
    }
    let blocks = fs.getattr(collapsed).unwrap().blocks_512;
    fs.fallocate(collapsed, 4 << 20, 1 << 20, COLLAPSE).unwrap();
    fs.fallocate(inserted, 4 << 20, 1 << 20, INSERT).unwrap();
    let after_collapse = shifted(&data, 4 << 20, 1 << 20, COLLAPSE);
    let after_insert = shifted(&data, 4 << 20, 1 << 20, INSERT);
    let attr = fs.getattr(collapsed).unwrap();
    assert_eq!((attr.size, attr.blocks_512), (7 << 20, blocks - 2048));
    assert_eq!(fs.getattr(inserted).unwrap().size, 9 << 20);
    assert!(read_all(&fs, collapsed) == after_collapse);
    assert!(read_all(&fs, inserted) == after_insert);
    fs.unmount().unwrap();
    fsck_clean(&device);
    let fs = mount(&device);
    assert!(read_all(&fs, collapsed) == after_collapse);
    assert!(read_all(&fs, inserted) == after_insert);
    fs.unmount().unwrap();
}

// XFS's rules: block-aligned offset and length, a collapse ending before the end of the
// file, an insert starting inside it (InvalidArgument, EINVAL), an insert past the largest
// file (FileTooBig, EFBIG), a directory (IsDirectory); a refused call changes nothing.
#[test]
fn refused_ranges_change_nothing() {
    let device = make_device(64 << 20);
    let fs = mount(&device);
    let inode = file(&fs, b"f");
    let data = pattern(2, 40_000);
    fs.write(inode, 0, &data).unwrap();
    let cases = [
        (100, 4096, COLLAPSE),
        (4096, 100, INSERT),
        (8192, 32768, COLLAPSE),
        (8192, 40_000 - 8192, COLLAPSE),
        (40_960, 4096, INSERT),
        (45_056, 4096, INSERT),
    ];
    for (offset, len, mode) in cases {
        let error = fs.fallocate(inode, offset, len, mode).unwrap_err();
        assert!(
            matches!(error, FsError::InvalidArgument(_)),
            "{offset}+{len} {mode:?}: {error:?}"
        );
    }
    let huge = cairn_format::limits::FILE_BLOCK_MAX / 4096 * 4096;
    let error = fs.fallocate(inode, 0, huge, INSERT).unwrap_err();
    assert!(matches!(error, FsError::FileTooBig), "{error:?}");
    let dir = fs.mkdir(fs.root(), b"d", 0o755, &root()).unwrap().inode;
    let error = fs.fallocate(dir, 0, 4096, COLLAPSE).unwrap_err();
    assert!(matches!(error, FsError::IsDirectory), "{error:?}");
    assert!(read_all(&fs, inode) == data);
    // The last block may be partial: collapsing up to it is fine.
    fs.fallocate(inode, 32768, 4096, COLLAPSE).unwrap();
    assert!(read_all(&fs, inode) == shifted(&data, 32768, 4096, COLLAPSE));
    fs.unmount().unwrap();
    fsck_clean(&device);
}

/// A file of `extents` one-block extents with holes between them (its map a tree when
/// there are more than an inode holds), written on `fs`; returns it and its bytes.
fn fragmented(fs: &Filesystem, name: &[u8], extents: u64) -> (u64, Vec<u8>) {
    let inode = file(fs, name);
    let block = u64::from(fs.statfs().unwrap().block_size);
    let mut model = vec![0u8; ((2 * extents - 1) * block) as usize];
    for index in 0..extents {
        let at = 2 * index * block;
        let bytes = pattern(index as u8, block as usize);
        fs.write(inode, at, &bytes).unwrap();
        model[at as usize..(at + block) as usize].copy_from_slice(&bytes);
    }
    (inode, model)
}

// A file of hundreds of extents (a tree of several levels with 1 KiB blocks) goes through a
// series of collapses and inserts at different places and lengths, some splitting an
// extent at the edge: after each, the contents equal the byte model and fsck is clean
// (records rewritten in place, the tree's keys in order, block counts right).
#[test]
fn shifts_of_a_tree_mapped_file_follow_the_model() {
    let device = make_small_block_device(32 << 20, 1024, 2);
    let fs = mount(&device);
    let (inode, mut model) = fragmented(&fs, b"frag", 600);
    let steps = [
        (COLLAPSE, 10 * 1024, 3 * 1024),
        (INSERT, 0, 5 * 1024),
        (COLLAPSE, 0, 7 * 1024),
        (INSERT, 300 * 1024, 64 * 1024),
        (COLLAPSE, 200 * 1024, 301 * 1024),
        (INSERT, 1024, 1024),
        (COLLAPSE, 1024, 1024),
    ];
    for (mode, offset, len) in steps {
        fs.fallocate(inode, offset, len, mode).unwrap();
        model = shifted(&model, offset as usize, len as usize, mode);
        assert!(read_all(&fs, inode) == model, "{mode:?} {offset}+{len}");
    }
    fs.unmount().unwrap();
    fsck_clean(&device);
    let fs = mount(&device);
    assert!(read_all(&fs, inode) == model);
    fs.unmount().unwrap();
}

// With write-behind, cached data goes to the device first and moves with the shift; reads
// through the extent cache after it see the moved extents; speculative blocks past the end
// are given back rather than moved.
#[test]
fn cached_data_and_the_extent_cache_follow_the_shift() {
    let device = make_device(64 << 20);
    let fs = mount_with(&device, common::write_behind(16 << 20));
    let inode = file(&fs, b"f");
    let mut model = pattern(3, 300_000);
    fs.write(inode, 0, &model).unwrap();
    fs.fsync(inode, false).unwrap();
    // Warm the extent cache, then cache a write over the range that moves.
    assert!(read_all(&fs, inode) == model);
    fs.write(inode, 150_000, &[0xab; 20_000]).unwrap();
    model[150_000..170_000].fill(0xab);
    fs.fallocate(inode, 65536, 65536, COLLAPSE).unwrap();
    model = shifted(&model, 65536, 65536, COLLAPSE);
    assert!(read_all(&fs, inode) == model);
    fs.fallocate(inode, 8192, 12288, INSERT).unwrap();
    model = shifted(&model, 8192, 12288, INSERT);
    assert!(read_all(&fs, inode) == model);
    let blocks = fs.getattr(inode).unwrap().blocks_512 / 8;
    assert!(
        blocks <= model.len().div_ceil(4096) as u64,
        "{blocks} blocks"
    );
    fs.unmount().unwrap();
    fsck_clean(&device);
}

// With every transaction durable at its commit (`logmode=sync`), a crash at every flush
// point of a collapse and of an insert of a file of a few hundred extents (dozens of
// steps) recovers the file whole as it was before the call or as it is after: recovery
// finishes a shift whose intent reached the log. fsck is clean at every point.
#[test]
fn a_crash_at_any_point_of_a_shift_leaves_before_or_after() {
    for (mode, offset, len) in [(COLLAPSE, 20 * 1024, 40 * 1024), (INSERT, 3 * 1024, 2048)] {
        let device = make_small_block_device(16 << 20, 1024, 2);
        let options = MountOptions {
            log_mode: LogMode::Sync,
            ..MountOptions::default()
        };
        let fs = mount_with(&device, options.clone());
        let (inode, before) = fragmented(&fs, b"frag", 300);
        fs.sync().unwrap();
        device.clear_log();
        fs.fallocate(inode, offset, len, mode).unwrap();
        let after = shifted(&before, offset as usize, len as usize, mode);
        let flushes = device.flush_count();
        assert!(flushes > 20, "{mode:?}: only {flushes} flushes");
        let (mut saw_before, mut saw_after) = (false, false);
        for flush in 0..=flushes {
            let crashed = Arc::new(device.crash_device(&CrashPoint::at_flush(flush)).unwrap());
            let fs = mount(&crashed);
            let content = read_all(&fs, inode);
            saw_before |= content == before;
            saw_after |= content == after;
            assert!(
                content == before || content == after,
                "{mode:?}: crash at flush {flush}"
            );
            fs.unmount().unwrap();
            fsck_clean(&crashed);
        }
        assert!(saw_before && saw_after, "{mode:?}: both outcomes");
        drop(fs);
    }
}
