#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Shared extents through `copy_file_range`: what a clone shares and copies, what it costs in
//! space, what removing either copy frees, and fsck's view of the refcount trees.

mod common;

use cairn_fs::{FileKind, Filesystem, FsError};
use common::{fsck_clean, make_device, mount, root};

const MIB: u64 = 1 << 20;

/// Bytes unique to (`seed`, offset): a stale or foreign block never matches.
fn pattern(seed: u64, offset: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| {
            let at = offset + i;
            (at.wrapping_mul(31).wrapping_add(seed.wrapping_mul(131)) >> 3) as u8 ^ (at as u8)
        })
        .collect()
}

fn create(fs: &Filesystem, name: &str) -> u64 {
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

fn read_all(fs: &Filesystem, inode: u64) -> Vec<u8> {
    let size = fs.getattr(inode).unwrap().size;
    let mut out = Vec::new();
    while (out.len() as u64) < size {
        let chunk = fs.read(
            inode,
            out.len() as u64,
            (size - out.len() as u64).min(MIB) as u32,
        );
        let chunk = chunk.unwrap();
        assert!(!chunk.is_empty());
        out.extend_from_slice(&chunk);
    }
    out
}

/// Unmounts, checks the image with fsck, and mounts it again.
fn remount_checked(
    fs: Filesystem,
    device: &std::sync::Arc<cairn_blockdev::MemDevice>,
) -> Filesystem {
    fs.unmount().unwrap();
    fsck_clean(device);
    mount(device)
}

fn used_blocks(fs: &Filesystem) -> u64 {
    let statfs = fs.statfs().unwrap();
    statfs.blocks - statfs.blocks_free
}

// A clone of a 4 MiB file maps the source's blocks (no data copied, a handful of blocks of
// metadata), reads the same, and fsck counts the sharing; removing the source frees
// nothing, removing the copy too frees everything.
#[test]
fn clone_shares_and_removal_frees_only_the_unshared() {
    let device = make_device(64 * MIB);
    let fs = mount(&device);
    let initial = used_blocks(&fs);
    let source = create(&fs, "source");
    let data = pattern(1, 0, (4 * MIB) as usize + 1000);
    fs.write(source, 0, &data).unwrap();
    fs.sync().unwrap();
    let before = used_blocks(&fs);
    let copy = create(&fs, "copy");
    let len = data.len() as u64;
    assert_eq!(fs.copy_file_range(source, 0, copy, 0, len).unwrap(), len);
    assert_eq!(read_all(&fs, copy), data);
    let grown = used_blocks(&fs) - before;
    assert!(grown <= 4, "a clone took {grown} blocks");
    let stats = fs.stats().reflink;
    assert_eq!(stats.clones, 1);
    assert_eq!(stats.shared_blocks, 1025, "{stats:?}");
    assert_eq!(stats.copied_bytes, 0);
    let source_map = fs.file_extents(source).unwrap();
    let copy_map = fs.file_extents(copy).unwrap();
    assert_eq!(source_map[0].physical, copy_map[0].physical);
    let fs = remount_checked(fs, &device);
    fs.unlink(fs.root(), b"source", &root()).unwrap();
    fs.sync().unwrap();
    // Only metadata goes (the refcount tree, now empty): every data block stays the copy's.
    let used = used_blocks(&fs);
    assert!(
        used >= before && used <= before + grown,
        "{used} used, {before} before"
    );
    assert_eq!(read_all(&fs, copy), data);
    let fs = remount_checked(fs, &device);
    fs.unlink(fs.root(), b"copy", &root()).unwrap();
    fs.sync().unwrap();
    assert_eq!(used_blocks(&fs), initial, "removing both left blocks used");
    fs.unmount().unwrap();
    fsck_clean(&device);
}

// Unaligned ranges: the head and tail are copied, the blocks between shared; offsets that
// differ within a block copy everything; a copy reaching past the source's end stops there;
// ranges of one file may not overlap; the destination grows.
#[test]
fn copy_file_range_heads_tails_and_limits() {
    let device = make_device(64 * MIB);
    let fs = mount(&device);
    let source = create(&fs, "source");
    let data = pattern(2, 0, (2 * MIB + 777) as usize);
    fs.write(source, 0, &data).unwrap();
    let copy = create(&fs, "copy");
    let old = pattern(3, 0, 20_000);
    fs.write(copy, 0, &old).unwrap();
    // 100 bytes into a block on both sides: head and tail copied, 254 blocks shared.
    let copied = fs.copy_file_range(source, 4196, copy, 8292, MIB).unwrap();
    assert_eq!(copied, MIB);
    let mut want = old.clone();
    want.resize((8292 + MIB) as usize, 0);
    want[8292..(8292 + MIB) as usize].copy_from_slice(&data[4196..(4196 + MIB) as usize]);
    assert_eq!(read_all(&fs, copy), want);
    let stats = fs.stats().reflink;
    assert_eq!(stats.shared_blocks, 255, "{stats:?}");
    // Offsets apart within a block: a plain copy.
    let other = create(&fs, "other");
    assert_eq!(
        fs.copy_file_range(source, 1, other, 0, 10_000).unwrap(),
        10_000
    );
    assert_eq!(read_all(&fs, other), data[1..10_001].to_vec());
    // Past the source's end: what exists.
    let tail = create(&fs, "tail");
    let left = data.len() as u64 - MIB;
    assert_eq!(
        fs.copy_file_range(source, MIB, tail, 0, 10 * MIB).unwrap(),
        left
    );
    assert_eq!(read_all(&fs, tail), data[MIB as usize..].to_vec());
    let stats = fs.stats().reflink;
    assert_eq!(
        stats.shared_blocks,
        255 + 257,
        "the partial last block is shared too"
    );
    assert_eq!(fs.copy_file_range(source, 10 * MIB, tail, 0, 5).unwrap(), 0);
    // Within one file: apart works, overlapping is refused.
    assert_eq!(
        fs.copy_file_range(source, 0, source, 3 * MIB, 8192)
            .unwrap(),
        8192
    );
    assert_eq!(
        fs.read(source, 3 * MIB, 8192).unwrap(),
        data[..8192].to_vec()
    );
    assert!(matches!(
        fs.copy_file_range(source, 0, source, 4096, 8192),
        Err(FsError::InvalidArgument(_))
    ));
    let dir = fs.mkdir(fs.root(), b"d", 0o755, &root()).unwrap().inode;
    assert!(fs.copy_file_range(source, 0, dir, 0, 10).is_err());
    fs.unmount().unwrap();
    fsck_clean(&device);
}
