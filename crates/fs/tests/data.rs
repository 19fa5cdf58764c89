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

// Preallocates with and without keep_size, punches a hole across a partial block and zeroes
// a range; reads, seeks, block counts and fsck check each step.
#[test]
fn fallocate_modes_and_seek() {
    use cairn_fs::{FallocateMode, FsError, SeekKind};
    let device = make_device(64 << 20);
    let fs = mount(&device);
    let inode = new_file(&fs, b"falloc");
    let keep = FallocateMode::Allocate { keep_size: true };
    fs.fallocate(inode, 0, 64 * BLOCK, keep).unwrap();
    let attr = fs.getattr(inode).unwrap();
    assert_eq!((attr.size, attr.blocks_512), (0, 64 * 8));
    assert!(matches!(
        fs.seek(inode, 0, SeekKind::Data),
        Err(FsError::NoSuchOffset)
    ));
    fs.fallocate(
        inode,
        0,
        16 * BLOCK,
        FallocateMode::Allocate { keep_size: false },
    )
    .unwrap();
    assert_eq!(fs.getattr(inode).unwrap().size, 16 * BLOCK);
    assert_eq!(fs.read(inode, 0, 100).unwrap(), vec![0u8; 100]);
    assert!(matches!(
        fs.seek(inode, 0, SeekKind::Data),
        Err(FsError::NoSuchOffset)
    ));
    fs.write(inode, 0, &vec![7u8; 16 * BLOCK as usize]).unwrap();
    fs.fallocate(inode, 3 * BLOCK + 100, 4 * BLOCK, FallocateMode::PunchHole)
        .unwrap();
    let data = fs.read(inode, 0, 16 * BLOCK as u32).unwrap();
    let punched = (3 * BLOCK + 100) as usize..(7 * BLOCK + 100) as usize;
    for (at, &byte) in data.iter().enumerate() {
        assert_eq!(byte, if punched.contains(&at) { 0 } else { 7 }, "byte {at}");
    }
    assert_eq!(fs.seek(inode, 0, SeekKind::Hole).unwrap(), 4 * BLOCK);
    assert_eq!(
        fs.seek(inode, 4 * BLOCK, SeekKind::Data).unwrap(),
        7 * BLOCK
    );
    assert_eq!(fs.seek(inode, 10, SeekKind::Data).unwrap(), 10);
    fs.fallocate(
        inode,
        9 * BLOCK,
        3 * BLOCK,
        FallocateMode::ZeroRange { keep_size: true },
    )
    .unwrap();
    let data = fs.read(inode, 9 * BLOCK, 3 * BLOCK as u32).unwrap();
    assert!(data.iter().all(|&b| b == 0));
    assert_eq!(
        fs.seek(inode, 8 * BLOCK, SeekKind::Hole).unwrap(),
        9 * BLOCK
    );
    assert_eq!(
        fs.seek(inode, 9 * BLOCK, SeekKind::Data).unwrap(),
        12 * BLOCK
    );
    assert_eq!(
        fs.seek(inode, 12 * BLOCK, SeekKind::Hole).unwrap(),
        16 * BLOCK
    );
    let zero_past_end = FallocateMode::ZeroRange { keep_size: false };
    fs.fallocate(inode, 15 * BLOCK, 4 * BLOCK, zero_past_end)
        .unwrap();
    assert_eq!(fs.getattr(inode).unwrap().size, 19 * BLOCK);
    assert!(matches!(
        fs.seek(inode, 19 * BLOCK, SeekKind::Hole),
        Err(FsError::NoSuchOffset)
    ));
    assert!(matches!(
        fs.fallocate(inode, 0, 0, keep),
        Err(FsError::InvalidArgument(_))
    ));
    fs.unmount().unwrap();
    fsck_clean(&device);
}

// Punches a large range of a tree-mapped file (many intent/done steps), then truncates to
// zero; all space comes back and fsck is clean.
#[test]
fn large_punch_frees_through_intents() {
    let device = make_device(64 << 20);
    let fs = mount(&device);
    let before = fs.statfs().unwrap().blocks_free;
    let inode = new_file(&fs, b"punch");
    let count = 200;
    write_sparse(&fs, inode, count);
    let punch = cairn_fs::FallocateMode::PunchHole;
    fs.fallocate(inode, 20 * BLOCK, 300 * BLOCK, punch).unwrap();
    let data = fs.read(inode, 20 * BLOCK, 300 * BLOCK as u32).unwrap();
    assert!(data.iter().all(|&b| b == 0));
    check_sparse(&fs, inode, 10);
    let changes = cairn_fs::SetAttr {
        size: Some(0),
        ..Default::default()
    };
    fs.setattr(inode, &changes, &root()).unwrap();
    fs.sync().unwrap();
    assert_eq!(fs.statfs().unwrap().blocks_free, before);
    fs.unmount().unwrap();
    fsck_clean(&device);
}

fn append(fs: &Filesystem, inode: u64, chunk: usize, total: u64) {
    let mut at = 0;
    while at < total {
        fs.write(inode, at, &vec![(at >> 12) as u8; chunk]).unwrap();
        fs.fsync(inode, true).unwrap();
        at += chunk as u64;
    }
}

// Appends with fsync grow a doubling preallocation (few extents, blocks past EOF survive
// fsync); the last close trims what is unused.
#[test]
fn appends_preallocate_and_last_close_trims() {
    let device = make_device(64 << 20);
    let fs = mount(&device);
    let inode = new_file(&fs, b"log");
    let file = fs.open(inode, true, false, true, &root()).unwrap();
    let total = 6 << 20;
    append(&fs, inode, 128 << 10, total);
    let extents = fs.file_extents(inode).unwrap();
    assert!(extents.len() <= 4, "{extents:?}");
    let attr = fs.getattr(inode).unwrap();
    assert!(
        attr.blocks_512 * 512 > total,
        "preallocation kept across fsync"
    );
    assert!(fs.stats().data.preallocated_blocks > 0);
    fs.release(file).unwrap();
    assert_eq!(fs.getattr(inode).unwrap().blocks_512 * 512, total);
    assert!(fs.stats().data.trimmed_blocks > 0);
    let data = fs.read(inode, total - 4096, 8192).unwrap();
    assert_eq!(data, vec![((total - 4096) >> 12) as u8 & 0xe0; 4096]);
    fs.unmount().unwrap();
    fsck_clean(&device);
}

// An extent size hint inherited from the directory aligns allocations to the hint and keeps
// post-EOF blocks on close; the idle scan leaves them too, but trims a hint-less file.
#[test]
fn extent_size_hint_is_inherited_and_kept() {
    let device = make_device(64 << 20);
    let fs = mount(&device);
    let who = root();
    let dir = fs.mkdir(fs.root(), b"db", 0o755, &who).unwrap();
    fs.set_extent_size_hint(dir.inode, 1 << 20, true).unwrap();
    let file = fs
        .create(dir.inode, b"table", FileKind::Regular, 0o644, 0, &who)
        .unwrap();
    let handle = fs.open(file.inode, true, false, true, &who).unwrap();
    fs.write(file.inode, 0, &[1u8; 5000]).unwrap();
    let extents = fs.file_extents(file.inode).unwrap();
    assert_eq!(extents.len(), 2, "{extents:?}");
    assert_eq!(extents[0].physical % (1 << 20), 0, "aligned to the hint");
    assert_eq!(extents.iter().map(|e| e.length).sum::<u64>(), 1 << 20);
    fs.release(handle).unwrap();
    assert_eq!(fs.getattr(file.inode).unwrap().blocks_512 * 512, 1 << 20);
    let plain = new_file(&fs, b"plain");
    append(&fs, plain, 64 << 10, 1 << 20);
    assert!(fs.getattr(plain).unwrap().blocks_512 * 512 > 1 << 20);
    assert!(fs.trim_idle(std::time::Duration::ZERO).unwrap() > 0);
    assert_eq!(fs.getattr(plain).unwrap().blocks_512 * 512, 1 << 20);
    assert_eq!(fs.getattr(file.inode).unwrap().blocks_512 * 512, 1 << 20);
    fs.unmount().unwrap();
    fsck_clean(&device);
}

// The alloc_size mount option fixes the preallocation, from the first extending write on;
// the background thread trims it once idle.
#[test]
fn alloc_size_option_and_background_scan() {
    let device = make_device(64 << 20);
    let options = cairn_fs::MountOptions {
        alloc_size: Some(256 << 10),
        ..Default::default()
    };
    let dyn_device: std::sync::Arc<dyn cairn_blockdev::BlockDevice> = device.clone();
    let fs = std::sync::Arc::new(Filesystem::mount(dyn_device, options).unwrap());
    let inode = new_file(&fs, b"fixed");
    fs.write(inode, 0, &[3u8; 4096]).unwrap();
    assert_eq!(
        fs.getattr(inode).unwrap().blocks_512 * 512,
        (256 << 10) + 4096
    );
    let scan = fs.start_background_scan(std::time::Duration::from_millis(20));
    assert!(scan.is_running());
    for _ in 0..500 {
        if fs.getattr(inode).unwrap().blocks_512 == 8 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(fs.getattr(inode).unwrap().blocks_512, 8);
    scan.stop();
    let fs = std::sync::Arc::into_inner(fs).unwrap();
    fs.unmount().unwrap();
    fsck_clean(&device);
}

/// One step on a fragmented file: write `blocks` blocks of `fill` at file block `at`, punch
/// them out, or fsync.
#[derive(Debug, Clone)]
enum FragmentStep {
    Write { at: u64, blocks: u64, fill: u8 },
    Punch { at: u64, blocks: u64 },
    Fsync,
}

fn fragment_step() -> impl proptest::strategy::Strategy<Value = FragmentStep> {
    use proptest::prelude::*;
    prop_oneof![
        6 => (0u64..320, 1u64..4, 1u8..255)
            .prop_map(|(at, blocks, fill)| FragmentStep::Write { at, blocks, fill }),
        2 => (0u64..320, 1u64..6).prop_map(|(at, blocks)| FragmentStep::Punch { at, blocks }),
        1 => Just(FragmentStep::Fsync),
    ]
}

fn apply_fragment_step(fs: &Filesystem, inode: u64, model: &mut Vec<u8>, step: &FragmentStep) {
    use cairn_fs::FallocateMode;
    let block = BLOCK as usize;
    match *step {
        FragmentStep::Write { at, blocks, fill } => {
            let bytes = vec![fill; blocks as usize * block];
            fs.write(inode, at * BLOCK, &bytes).unwrap();
            let end = (at + blocks) as usize * block;
            if model.len() < end {
                model.resize(end, 0);
            }
            model[at as usize * block..end].fill(fill);
        }
        FragmentStep::Punch { at, blocks } => {
            let mode = FallocateMode::PunchHole;
            fs.fallocate(inode, at * BLOCK, blocks * BLOCK, mode)
                .unwrap();
            let from = (at as usize * block).min(model.len());
            let to = ((at + blocks) as usize * block).min(model.len());
            model[from..to].fill(0);
        }
        FragmentStep::Fsync => fs.fsync(inode, false).unwrap(),
    }
}

fn check_fragment_model(fs: &Filesystem, inode: u64, model: &[u8]) {
    assert_eq!(fs.getattr(inode).unwrap().size, model.len() as u64);
    let data = fs.read(inode, 0, model.len() as u32).unwrap();
    assert!(data[..] == model[..], "file bytes differ from the model");
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]

    // Random writes, punches and fsyncs over a file whose map is a tree of about 160
    // extents (every other block written first), with write-behind off and on: writes
    // change the tree through maps loaded around their ranges, and the bytes match a model
    // after every step and after a remount; fsck finds the map, the tree and the free
    // space consistent.
    #[test]
    fn fragmented_file_matches_a_model(
        steps in proptest::collection::vec(fragment_step(), 1..50),
        cached in proptest::prelude::any::<bool>(),
    ) {
        let device = make_device(64 << 20);
        let options = match cached {
            true => common::write_behind(1 << 20),
            false => cairn_fs::MountOptions::default(),
        };
        let fs = common::mount_with(&device, options.clone());
        let inode = new_file(&fs, b"fragments");
        write_sparse(&fs, inode, 160);
        fs.fsync(inode, false).unwrap();
        let mut model = fs.read(inode, 0, (2 * 160 * BLOCK) as u32).unwrap().to_vec();
        for step in &steps {
            apply_fragment_step(&fs, inode, &mut model, step);
            check_fragment_model(&fs, inode, &model);
        }
        fs.unmount().unwrap();
        fsck_clean(&device);
        let fs = common::mount_with(&device, options);
        check_fragment_model(&fs, inode, &model);
        fs.unmount().unwrap();
    }
}

/// A copy of what `device` holds durably, as a crash right now would leave it, mounted.
fn crash_and_mount(device: &std::sync::Arc<cairn_blockdev::MemDevice>) -> Filesystem {
    let image = device.durable_image();
    let crashed = cairn_blockdev::MemDevice::from_image(image, common::SECTOR).unwrap();
    mount(&std::sync::Arc::new(crashed))
}

// fdatasync after an overwrite in place forces no log (the device flush covers the data) and
// the data survives a crash right after it; after an extending write or a chmod, and for
// fsync, it still forces the log, and the new size survives. With and without write-behind.
#[test]
fn fdatasync_skips_the_log_for_timestamp_only_changes() {
    for options in [
        cairn_fs::MountOptions::default(),
        common::write_behind(1 << 20),
    ] {
        let device = make_device(64 << 20);
        let fs = common::mount_with(&device, options);
        let inode = new_file(&fs, b"db");
        let forces = || fs.stats().journal.forces;
        fs.write(inode, 0, &[1u8; 4 * BLOCK as usize]).unwrap();
        fs.fsync(inode, true).unwrap();

        let before = forces();
        fs.write(inode, BLOCK, &[2u8; BLOCK as usize]).unwrap();
        fs.fsync(inode, true).unwrap();
        assert_eq!(forces(), before, "an overwrite's fdatasync forced the log");
        let crashed = crash_and_mount(&device);
        assert_eq!(crashed.getattr(inode).unwrap().size, 4 * BLOCK);
        let data = crashed.read(inode, 0, 4 * BLOCK as u32).unwrap();
        assert!(
            data[BLOCK as usize..2 * BLOCK as usize]
                .iter()
                .all(|&b| b == 2)
        );
        assert!(data[..BLOCK as usize].iter().all(|&b| b == 1));
        drop(crashed);

        fs.write(inode, 4 * BLOCK, &[3u8; BLOCK as usize]).unwrap();
        fs.fsync(inode, true).unwrap();
        assert!(
            forces() > before,
            "an extending write's fdatasync forced no log"
        );
        let crashed = crash_and_mount(&device);
        assert_eq!(crashed.getattr(inode).unwrap().size, 5 * BLOCK);
        let tail = crashed.read(inode, 4 * BLOCK, BLOCK as u32).unwrap();
        assert!(tail.iter().all(|&b| b == 3));
        drop(crashed);

        let before = forces();
        let chmod = cairn_fs::SetAttr {
            mode: Some(0o600),
            ..Default::default()
        };
        fs.setattr(inode, &chmod, &root()).unwrap();
        fs.fsync(inode, true).unwrap();
        assert!(forces() > before, "a chmod's fdatasync forced no log");

        let before = forces();
        fs.write(inode, 0, &[4u8; BLOCK as usize]).unwrap();
        fs.fsync(inode, false).unwrap();
        assert!(forces() > before, "fsync after an overwrite forced no log");
        fs.unmount().unwrap();
        fsck_clean(&device);
    }
}
