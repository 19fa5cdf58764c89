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

/// Fails naming the first differing byte (not printing megabytes).
#[track_caller]
fn same(found: &[u8], want: &[u8]) {
    let differs = found.iter().zip(want).position(|(a, b)| a != b);
    assert!(
        found.len() == want.len() && differs.is_none(),
        "lengths {} and {}, first difference at {differs:?}",
        found.len(),
        want.len()
    );
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
    same(&read_all(&fs, copy), &data);
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
    same(&read_all(&fs, copy), &data);
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
    same(&read_all(&fs, copy), &want);
    let stats = fs.stats().reflink;
    assert_eq!(stats.shared_blocks, 255, "{stats:?}");
    // Offsets apart within a block: a plain copy.
    let other = create(&fs, "other");
    assert_eq!(
        fs.copy_file_range(source, 1, other, 0, 10_000).unwrap(),
        10_000
    );
    same(&read_all(&fs, other), &data[1..10_001]);
    // Past the source's end: what exists.
    let tail = create(&fs, "tail");
    let left = data.len() as u64 - MIB;
    assert_eq!(
        fs.copy_file_range(source, MIB, tail, 0, 10 * MIB).unwrap(),
        left
    );
    same(&read_all(&fs, tail), &data[MIB as usize..]);
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

fn resize(fs: &Filesystem, inode: u64, size: u64) {
    let change = cairn_fs::SetAttr {
        size: Some(size),
        ..Default::default()
    };
    fs.setattr(inode, &change, &root()).unwrap();
}

/// Writes into a clone through every path that lands on its blocks; returns what the copy
/// must read afterwards (the original is untouched).
fn write_every_way(fs: &Filesystem, copy: u64, mut want: Vec<u8>) -> Vec<u8> {
    use cairn_fs::FallocateMode;
    let put = |want: &mut Vec<u8>, at: usize, bytes: &[u8]| {
        if want.len() < at + bytes.len() {
            want.resize(at + bytes.len(), 0);
        }
        want[at..at + bytes.len()].copy_from_slice(bytes);
    };
    // A small write (cached with write-behind on), a large one (written through), an
    // O_DIRECT one.
    let small = pattern(10, 5000, 100);
    fs.write(copy, 5000, &small).unwrap();
    put(&mut want, 5000, &small);
    let large = pattern(11, 65536, 300 << 10);
    fs.write(copy, 65536, &large).unwrap();
    put(&mut want, 65536, &large);
    let direct = pattern(12, MIB, 8192);
    fs.write_direct(copy, MIB, &direct, None).unwrap();
    put(&mut want, MIB as usize, &direct);
    // Punch and zero range with partial edges.
    fs.fallocate(copy, 2 * MIB + 100, 3 * 4096, FallocateMode::PunchHole)
        .unwrap();
    put(&mut want, (2 * MIB + 100) as usize, &[0; 3 * 4096]);
    let zero = FallocateMode::ZeroRange { keep_size: true };
    fs.fallocate(copy, 3 * MIB + 700, 10_000, zero).unwrap();
    put(&mut want, (3 * MIB + 700) as usize, &[0; 10_000]);
    // A shrink to the middle of a block, then a growth: the tail of that block reads zeros.
    let size = want.len() as u64 - 12_345;
    resize(fs, copy, size);
    want.truncate(size as usize);
    resize(fs, copy, size + 5000);
    want.resize((size + 5000) as usize, 0);
    want
}

// Every way of writing into a clone changes the clone only; the bytes, and fsck's counts,
// hold across a remount; with write-behind off and on.
#[test]
fn writes_into_a_clone_change_only_the_clone() {
    for options in [
        cairn_fs::MountOptions::default(),
        common::write_behind(4 * MIB),
    ] {
        let device = make_device(64 * MIB);
        let fs = common::mount_with(&device, options.clone());
        let source = create(&fs, "source");
        let data = pattern(4, 0, (4 * MIB + 3000) as usize);
        fs.write(source, 0, &data).unwrap();
        let copy = create(&fs, "copy");
        fs.copy_file_range(source, 0, copy, 0, data.len() as u64)
            .unwrap();
        let want = write_every_way(&fs, copy, data.clone());
        fs.sync().unwrap();
        same(&read_all(&fs, source), &data);
        same(&read_all(&fs, copy), &want);
        assert!(fs.stats().reflink.cow_writes > 0);
        fs.unmount().unwrap();
        fsck_clean(&device);
        let fs = common::mount_with(&device, options);
        same(&read_all(&fs, source), &data);
        same(&read_all(&fs, copy), &want);
        fs.unmount().unwrap();
    }
}

// A 4 KiB write into a 4 MiB clone copies one block: the space it takes is a few blocks,
// and the original reads as before.
#[test]
fn a_small_write_into_a_clone_costs_a_block() {
    let device = make_device(64 * MIB);
    let fs = mount(&device);
    let source = create(&fs, "source");
    let data = pattern(5, 0, (4 * MIB) as usize);
    fs.write(source, 0, &data).unwrap();
    let copy = create(&fs, "copy");
    fs.copy_file_range(source, 0, copy, 0, 4 * MIB).unwrap();
    fs.sync().unwrap();
    let before = used_blocks(&fs);
    let block = pattern(6, 0, 4096);
    fs.write_direct(copy, 8192, &block, None).unwrap();
    fs.sync().unwrap();
    let cost = used_blocks(&fs) - before;
    assert!((1..=4).contains(&cost), "a 4 KiB write took {cost} blocks");
    assert_eq!(fs.stats().reflink.cow_blocks, 1);
    same(&read_all(&fs, source), &data);
    let mut want = data.clone();
    want[8192..12288].copy_from_slice(&block);
    same(&read_all(&fs, copy), &want);
    fs.unmount().unwrap();
    fsck_clean(&device);
}

// A CoW extent size hint inherited from the directory: a 4 KiB write into a clone copies a
// whole aligned 16 KiB unit, and both files read right.
#[test]
fn cow_extent_size_hint_widens_the_copy() {
    let device = make_device(64 * MIB);
    let fs = mount(&device);
    let dir = fs.mkdir(fs.root(), b"d", 0o755, &root()).unwrap().inode;
    fs.set_cow_extent_size_hint(dir, 16384, true).unwrap();
    let make = |name: &[u8]| {
        fs.create(dir, name, FileKind::Regular, 0o644, 0, &root())
            .unwrap()
            .inode
    };
    let (source, copy) = (make(b"source"), make(b"copy"));
    let data = pattern(7, 0, 65536);
    fs.write(source, 0, &data).unwrap();
    fs.copy_file_range(source, 0, copy, 0, 65536).unwrap();
    let block = pattern(8, 0, 4096);
    fs.write_direct(copy, 20480, &block, None).unwrap();
    assert_eq!(fs.stats().reflink.cow_blocks, 4);
    let mut want = data.clone();
    want[20480..24576].copy_from_slice(&block);
    same(&read_all(&fs, copy), &want);
    same(&read_all(&fs, source), &data);
    fs.unmount().unwrap();
    fsck_clean(&device);
}

// A full filesystem: writes into a clone that need a copy fail with NoSpace at the write
// (cached writes too: their copy is reserved when they are accepted), the original and
// everything written before stay, and fsck is clean.
#[test]
fn no_space_for_a_copy_reaches_the_writer() {
    for options in [
        cairn_fs::MountOptions::default(),
        common::write_behind(4 * MIB),
    ] {
        let device = make_device(16 * MIB);
        let fs = common::mount_with(&device, options);
        let source = create(&fs, "source");
        let data = pattern(9, 0, (8 * MIB) as usize);
        fs.write(source, 0, &data).unwrap();
        let copy = create(&fs, "copy");
        fs.copy_file_range(source, 0, copy, 0, 8 * MIB).unwrap();
        fs.sync().unwrap();
        let mut want = data.clone();
        let mut refused = false;
        // 64 KiB writes, then 1 MiB ones (written through, copied straight from the write's
        // bytes); a write that runs out of space part way returns what it wrote (a short
        // count), and the next one starts there.
        let mut at = 0;
        while at < 8 * MIB && !refused {
            let len = if at < 4 * MIB { 65536 } else { MIB };
            let chunk = pattern(10 + at, at, len as usize);
            match fs.write(copy, at, &chunk) {
                Ok(wrote) => {
                    let wrote = wrote as usize;
                    want[at as usize..at as usize + wrote].copy_from_slice(&chunk[..wrote]);
                    at += wrote as u64;
                }
                Err(FsError::NoSpace) => refused = true,
                Err(other) => panic!("write: {other}"),
            }
        }
        assert!(
            refused,
            "8 MiB of copies fit in a 16 MiB filesystem holding 8 MiB"
        );
        fs.fsync(copy, false).unwrap();
        same(&read_all(&fs, source), &data);
        same(&read_all(&fs, copy), &want);
        fs.unmount().unwrap();
        fsck_clean(&device);
    }
}

/// Sets inode `inode`'s flags as `change` says (as root, who may set i and a).
fn set_flags(fs: &Filesystem, inode: u64, change: impl FnOnce(&mut cairn_fs::InodeFlags)) {
    let mut attributes = fs.file_attributes(inode).unwrap().attributes;
    change(&mut attributes.flags);
    fs.set_file_attributes(inode, &attributes, &root(), true)
        .unwrap();
}

// A clone obeys the destination's flags as a write does: none into an immutable file,
// into an append-only one only past its end; a sync-flagged side makes it durable at once
// (a crash right after it shows the copy). The source's flags do not stop it.
#[test]
fn clones_follow_the_destinations_flags() {
    let device = make_device(32 * MIB);
    let fs = mount(&device);
    let source = create(&fs, "source");
    let data = pattern(3, 0, 65536);
    fs.write(source, 0, &data).unwrap();
    set_flags(&fs, source, |f| f.immutable = true);
    let frozen = create(&fs, "frozen");
    set_flags(&fs, frozen, |f| f.immutable = true);
    let refused = fs.copy_file_range(source, 0, frozen, 0, 65536);
    assert!(matches!(refused, Err(FsError::NotPermitted)), "{refused:?}");
    assert_eq!(fs.getattr(frozen).unwrap().size, 0);
    let log = create(&fs, "log");
    fs.write(log, 0, &data[..8192]).unwrap();
    set_flags(&fs, log, |f| f.append_only = true);
    let refused = fs.copy_file_range(source, 0, log, 0, 65536);
    assert!(matches!(refused, Err(FsError::NotPermitted)), "{refused:?}");
    assert_eq!(
        fs.copy_file_range(source, 0, log, 8192, 65536).unwrap(),
        65536
    );
    let mut want = data[..8192].to_vec();
    want.extend_from_slice(&data);
    same(&read_all(&fs, log), &want);
    let synced = create(&fs, "synced");
    set_flags(&fs, synced, |f| f.sync = true);
    assert_eq!(
        fs.copy_file_range(source, 0, synced, 0, 65536).unwrap(),
        65536
    );
    let image = device.durable_image();
    let crashed = cairn_blockdev::MemDevice::from_image(image, common::SECTOR).unwrap();
    let crashed = mount(&std::sync::Arc::new(crashed));
    same(&read_all(&crashed, synced), &data);
    drop(crashed);
    assert_eq!(fs.stats().reflink.clones, 2);
    set_flags(&fs, source, |f| f.immutable = false);
    set_flags(&fs, frozen, |f| f.immutable = false);
    set_flags(&fs, log, |f| f.append_only = false);
    let fs = remount_checked(fs, &device);
    same(&read_all(&fs, log), &want);
    fs.unmount().unwrap();
}

// The CoW extent size hint as `FS_IOC_FSSETXATTR` sets it (`set_file_attributes`): whole
// blocks up to half an AG, on regular files and directories only, changeable while a file
// has data; a directory passes it on to new files and directories; it survives a remount
// (fsck clean). Without the reflink feature any nonzero hint is refused.
#[test]
fn cow_hint_through_the_attributes() {
    let device = make_device(64 * MIB);
    let fs = mount(&device);
    let with_cow_hint = |inode: u64, bytes: u64| {
        let new = cairn_fs::FileAttributes {
            cow_extent_size_hint: bytes,
            ..fs.file_attributes(inode).unwrap().attributes
        };
        fs.set_file_attributes(inode, &new, &root(), false)
    };
    let cow_hint = |inode: u64| {
        let attributes = fs.file_attributes(inode).unwrap().attributes;
        attributes.cow_extent_size_hint
    };
    let file = create(&fs, "file");
    fs.write(file, 0, &pattern(1, 0, 8192)).unwrap();
    with_cow_hint(file, 65536).unwrap();
    assert_eq!(cow_hint(file), 65536);
    for refused in [65536 + 512, 64 * MIB] {
        let set = with_cow_hint(file, refused);
        assert!(matches!(set, Err(FsError::InvalidArgument(_))), "{set:?}");
    }
    let link = fs.symlink(fs.root(), b"l", b"file", &root()).unwrap().inode;
    assert!(with_cow_hint(link, 65536).is_err());
    let dir = fs.mkdir(fs.root(), b"d", 0o755, &root()).unwrap().inode;
    with_cow_hint(dir, 32768).unwrap();
    let sub = fs.mkdir(dir, b"sub", 0o755, &root()).unwrap().inode;
    let inner = fs
        .create(sub, b"inner", FileKind::Regular, 0o644, 0, &root())
        .unwrap()
        .inode;
    let plain = fs.mkdir(fs.root(), b"plain", 0o755, &root()).unwrap().inode;
    let outside = fs
        .create(plain, b"outside", FileKind::Regular, 0o644, 0, &root())
        .unwrap()
        .inode;
    assert_eq!(
        (cow_hint(sub), cow_hint(inner), cow_hint(outside)),
        (32768, 32768, 0)
    );
    with_cow_hint(sub, 0).unwrap();
    let later = fs
        .create(sub, b"later", FileKind::Regular, 0o644, 0, &root())
        .unwrap()
        .inode;
    assert_eq!(cow_hint(later), 0);
    let fs = remount_checked(fs, &device);
    let hints: Vec<u64> = [file, dir, sub, inner]
        .into_iter()
        .map(|inode| {
            fs.file_attributes(inode)
                .unwrap()
                .attributes
                .cow_extent_size_hint
        })
        .collect();
    assert_eq!(hints, [65536, 32768, 0, 32768]);
    fs.unmount().unwrap();
    let plain_device =
        std::sync::Arc::new(cairn_blockdev::MemDevice::new(32 * MIB, common::SECTOR));
    let request = cairn_mkfs::Request {
        fs_bytes: Some(32 * MIB),
        reflink: false,
        ..cairn_mkfs::Request::default()
    };
    let plan = cairn_mkfs::plan(32 * MIB, common::SECTOR, &request).unwrap();
    let options = cairn_mkfs::FormatOptions {
        uuid: Some([6; 16]),
        discard: false,
        now_secs: 1_700_000_000,
    };
    cairn_mkfs::format(&*plain_device, &plan, &options).unwrap();
    let fs = mount(&plain_device);
    let file = create(&fs, "file");
    let new = cairn_fs::FileAttributes {
        cow_extent_size_hint: 65536,
        ..fs.file_attributes(file).unwrap().attributes
    };
    let set = fs.set_file_attributes(file, &new, &root(), false);
    assert!(matches!(set, Err(FsError::InvalidArgument(_))), "{set:?}");
    fs.unmount().unwrap();
}

// Collapse and insert range move file offsets only, so on files sharing blocks they keep
// every count right: a clone's shared blocks shift with it (the original unchanged, nothing
// freed that the original maps), a collapse of a shared range frees nothing the other file
// maps, a write into shifted shared blocks still copies, fsck agrees after a remount, and
// removing both files gives everything back.
#[test]
fn collapse_and_insert_keep_shared_blocks_counted() {
    use cairn_fs::FallocateMode::{CollapseRange, InsertRange};
    let device = make_device(64 * MIB);
    let fs = mount(&device);
    let empty = used_blocks(&fs);
    let source = create(&fs, "source");
    let data = pattern(11, 0, 64 * 4096);
    fs.write(source, 0, &data).unwrap();
    fs.fsync(source, false).unwrap();
    let copy = create(&fs, "copy");
    fs.copy_file_range(source, 0, copy, 0, data.len() as u64)
        .unwrap();
    let shared = used_blocks(&fs);
    let mut want = data.clone();
    fs.fallocate(copy, 8 * 4096, 8 * 4096, CollapseRange)
        .unwrap();
    want.drain(8 * 4096..16 * 4096);
    assert_eq!(
        used_blocks(&fs),
        shared,
        "a collapse of shared blocks freed some"
    );
    fs.fallocate(copy, 4 * 4096, 4 * 4096, InsertRange).unwrap();
    want.splice(4 * 4096..4 * 4096, vec![0; 4 * 4096]);
    let block = pattern(12, 0, 4096);
    fs.write_direct(copy, 20 * 4096, &block, None).unwrap();
    want[20 * 4096..21 * 4096].copy_from_slice(&block);
    same(&read_all(&fs, copy), &want);
    same(&read_all(&fs, source), &data);
    // The source collapses a range the copy still maps: its blocks stay for the copy.
    fs.fallocate(source, 0, 16 * 4096, CollapseRange).unwrap();
    let fs = remount_checked(fs, &device);
    same(&read_all(&fs, source), &data[16 * 4096..]);
    same(&read_all(&fs, copy), &want);
    fs.unlink(fs.root(), b"source", &root()).unwrap();
    same(&read_all(&fs, copy), &want);
    fs.unlink(fs.root(), b"copy", &root()).unwrap();
    let fs = remount_checked(fs, &device);
    assert_eq!(used_blocks(&fs), empty);
    fs.unmount().unwrap();
}

// A direct write over a shared block and then a hole, on a filesystem with room for the
// hole's block but not for the shared block's copy: it fails with NoSpace and gives back
// the block it mapped in the hole (issue 32's rule for failed allocations), without
// touching the shared blocks: both files read as before, the free space is what it was,
// and fsck is clean.
#[test]
fn a_write_whose_copy_finds_no_space_gives_its_blocks_back() {
    let device = make_device(64 * MIB);
    let fs = mount(&device);
    let source = create(&fs, "source");
    let data = pattern(13, 0, 16 * 4096);
    fs.write(source, 0, &data).unwrap();
    fs.fsync(source, false).unwrap();
    let copy = create(&fs, "copy");
    fs.copy_file_range(source, 0, copy, 0, data.len() as u64)
        .unwrap();
    let punch = cairn_fs::FallocateMode::PunchHole;
    fs.fallocate(copy, 8 * 4096, 8 * 4096, punch).unwrap();
    let mut want = data.clone();
    want[8 * 4096..].fill(0);
    let statfs = fs.statfs().unwrap();
    let big = create(&fs, "big");
    let fill = (statfs.blocks_available - 1) * u64::from(statfs.block_size);
    let allocate = cairn_fs::FallocateMode::Allocate { keep_size: false };
    fs.fallocate(big, 0, fill, allocate).unwrap();
    fs.sync().unwrap();
    let (free, held) = (
        fs.statfs().unwrap().blocks_free,
        fs.getattr(copy).unwrap().blocks_512,
    );
    let written = fs.write_direct(copy, 7 * 4096, &pattern(14, 0, 2 * 4096), None);
    assert!(matches!(written, Err(FsError::NoSpace)), "{written:?}");
    assert_eq!(fs.getattr(copy).unwrap().blocks_512, held);
    assert_eq!(fs.statfs().unwrap().blocks_free, free);
    same(&read_all(&fs, copy), &want);
    same(&read_all(&fs, source), &data);
    fs.unlink(fs.root(), b"big", &root()).unwrap();
    let fs = remount_checked(fs, &device);
    same(&read_all(&fs, copy), &want);
    fs.unmount().unwrap();
}

/// A copy of what `device` holds durably, as a crash now would leave it, and its mount.
fn crash(
    device: &std::sync::Arc<cairn_blockdev::MemDevice>,
) -> (std::sync::Arc<cairn_blockdev::MemDevice>, Filesystem) {
    let image = cairn_blockdev::MemDevice::from_image(device.durable_image(), common::SECTOR);
    let image = std::sync::Arc::new(image.unwrap());
    let fs = mount(&image);
    (image, fs)
}

// O_TMPFILE files on either side of a clone (#32 with #30): a named file cloned into an
// unnamed one (then written there) and an unnamed one cloned into a named one. A crash
// before the unnamed files are linked frees them at mount, and only what no named file
// maps: the named files read whole and fsck is clean. Linked, an unnamed clone keeps its
// blocks and its own write across a crash.
#[test]
fn unnamed_files_clone_both_ways() {
    let device = make_device(64 * MIB);
    let fs = mount(&device);
    let top = fs.root();
    let (base_data, other_data) = (pattern(21, 0, 32 * 4096), pattern(22, 0, 32 * 4096));
    let base = create(&fs, "base");
    fs.write(base, 0, &base_data).unwrap();
    fs.fsync(base, false).unwrap();
    let len = base_data.len() as u64;
    let into_unnamed = fs.tmpfile(top, 0o644, false, &root()).unwrap().inode;
    let held = fs.open(into_unnamed, true, false, false, &root()).unwrap();
    assert_eq!(
        fs.copy_file_range(base, 0, into_unnamed, 0, len).unwrap(),
        len
    );
    let block = pattern(23, 0, 4096);
    fs.write_direct(into_unnamed, 5 * 4096, &block, None)
        .unwrap();
    fs.fsync(into_unnamed, false).unwrap();
    let unnamed_source = fs.tmpfile(top, 0o644, false, &root()).unwrap().inode;
    let held_source = fs
        .open(unnamed_source, true, false, false, &root())
        .unwrap();
    fs.write(unnamed_source, 0, &other_data).unwrap();
    let from_unnamed = create(&fs, "from_unnamed");
    assert_eq!(
        fs.copy_file_range(unnamed_source, 0, from_unnamed, 0, len)
            .unwrap(),
        len
    );
    fs.fsync(from_unnamed, false).unwrap();
    assert_eq!(fs.stats().reflink.clones, 2);
    let (image, crashed) = crash(&device);
    same(&read_all(&crashed, base), &base_data);
    same(&read_all(&crashed, from_unnamed), &other_data);
    crashed.unmount().unwrap();
    fsck_clean(&image);
    fs.link(into_unnamed, top, b"linked", &root()).unwrap();
    fs.sync().unwrap();
    let (image, crashed) = crash(&device);
    let linked = crashed.lookup(top, b"linked").unwrap().inode;
    let mut want = base_data.clone();
    want[5 * 4096..6 * 4096].copy_from_slice(&block);
    same(&read_all(&crashed, linked), &want);
    same(&read_all(&crashed, base), &base_data);
    crashed.unmount().unwrap();
    fsck_clean(&image);
    fs.release(held).unwrap();
    fs.release(held_source).unwrap();
    let fs = remount_checked(fs, &device);
    same(&read_all(&fs, from_unnamed), &other_data);
    fs.unmount().unwrap();
}
