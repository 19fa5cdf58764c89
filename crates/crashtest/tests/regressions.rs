#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Minimal reproductions of violations the explorer found (docs/reliability.md, "Result").

use std::sync::Arc;

use cairn_blockdev::{CrashPoint, MemDevice};
use cairn_crashtest::explore::{self, ExploreConfig};
use cairn_crashtest::image::{self, SECTOR_BYTES};
use cairn_crashtest::op::{Op, fallocate, truncate};
use cairn_crashtest::suite;
use cairn_crashtest::workload::Workload;
use cairn_fs::{Credentials, FallocateMode, FileKind, Filesystem, SetAttr};

// Creates two directories, syncs, crashes (durable image) and checks recovery finds both
// inodes allocated and fsck clean. The second directory's inode (a new chunk in another AG)
// used to read back free (docs/reliability.md item 1).
#[test]
fn regression_sync_then_crash_keeps_new_directories() {
    let device = Arc::new(image::formatted_device(image::CRASH_DEVICE_BYTES).unwrap());
    let fs = image::mount(&device).unwrap();
    let who = Credentials::root();
    fs.mkdir(fs.root(), b"A", 0o755, &who).unwrap();
    fs.mkdir(fs.root(), b"B", 0o755, &who).unwrap();
    fs.sync().unwrap();
    let crashed = Arc::new(MemDevice::from_image(device.durable_image(), SECTOR_BYTES).unwrap());
    drop(fs);
    let fs = image::mount(&crashed).unwrap();
    for name in [&b"A"[..], b"B"] {
        let attr = fs.lookup(fs.root(), name).unwrap();
        fs.getattr(attr.inode).unwrap();
    }
    fs.unmount().unwrap();
    image::fsck(crashed.as_ref()).unwrap();
}

// Formats a 16 MiB filesystem with mkfs's default log size and checks that it mounts and
// takes a mkdir (mkfs once chose a 512 KiB log, smaller than the journal accepts).
#[test]
fn regression_mkfs_default_log_mountable() {
    let bytes = 16 << 20;
    let request = cairn_mkfs::Request {
        fs_bytes: Some(bytes),
        ..cairn_mkfs::Request::default()
    };
    let device = Arc::new(image::format_with(bytes, &request).unwrap());
    let fs = image::mount(&device).unwrap();
    fs.mkdir(fs.root(), b"A", 0o755, &Credentials::root())
        .unwrap();
    fs.unmount().unwrap();
}

// Shrinks `foo` (16 KiB) to 5000 bytes, then grows or writes past the end, with every crash
// point and subset explored: each state must show a version of foo. The tail of the end block
// used to be zeroed on disk before the size change committed, so a crash showed the old size
// with zeros at 5000..5120 ("match no version", docs/reliability.md item 4).
#[test]
fn regression_shrink_truncate_crash_shows_a_version() {
    let sequences = [
        vec![truncate("foo", 5000), Op::Fsync("foo".into())],
        vec![truncate("foo", 5000), truncate("foo", 30000), Op::Sync],
        vec![
            truncate("foo", 5000),
            Op::Write {
                path: "foo".into(),
                offset: 9000,
                len: 100,
                id: 77,
            },
            Op::Fdatasync("foo".into()),
        ],
    ];
    explore_every_state("shrink then grow", sequences);
}

/// Explores every crash point and subset of each sequence (named `name` and its index):
/// some crash state is checked and none violates the oracle.
fn explore_every_state<const N: usize>(name: &str, sequences: [Vec<Op>; N]) {
    let workloads: Vec<Workload> = sequences
        .into_iter()
        .enumerate()
        .map(|(index, ops)| Workload {
            name: format!("{name} {index}"),
            ops,
        })
        .collect();
    let config = ExploreConfig {
        random_per_flush: 4,
        seed: 3,
        extra_points_max: None,
        discard: false,
        data_cache: 0,
        log_sync: false,
    };
    let tally = suite::crash_run(&workloads, &config).unwrap();
    assert!(tally.crash_states > 0);
    let report: Vec<String> = tally.violations.iter().map(ToString::to_string).collect();
    assert!(tally.violations.is_empty(), "{}", report.join("\n"));
}

fn read_zeros(fs: &Filesystem, inode: u64, from: u64, to: u64) -> bool {
    let bytes = fs.read(inode, from, (to - from) as u32).unwrap();
    bytes.len() as u64 == to - from && bytes.iter().all(|&byte| byte == 0)
}

// A shrink leaves the old bytes past the new end on disk; every way of growing the file again
// (truncate up, a write past the end, fallocate without keep-size), live and after a crash
// that kept the shrink, must read zeros there.
#[test]
fn regression_grow_after_shrink_reads_zeros() {
    let device = Arc::new(image::formatted_device(image::CRASH_DEVICE_BYTES).unwrap());
    let fs = image::mount(&device).unwrap();
    let who = Credentials::root();
    let file = fs
        .create(fs.root(), b"f", FileKind::Regular, 0o644, 0, &who)
        .unwrap()
        .inode;
    let resize = |fs: &Filesystem, size: u64| {
        let changes = SetAttr {
            size: Some(size),
            ..SetAttr::default()
        };
        fs.setattr(file, &changes, &who).unwrap();
    };
    fs.write(file, 0, &[0xa5; 16384]).unwrap();
    resize(&fs, 5000);
    resize(&fs, 12000);
    assert!(read_zeros(&fs, file, 5000, 12000));
    fs.write(file, 0, &[0xa5; 16384]).unwrap();
    resize(&fs, 5000);
    fs.write(file, 9000, &[1; 100]).unwrap();
    assert!(read_zeros(&fs, file, 5000, 9000));
    fs.write(file, 0, &[0xa5; 16384]).unwrap();
    resize(&fs, 5000);
    let grow = FallocateMode::Allocate { keep_size: false };
    fs.fallocate(file, 6000, 4000, grow).unwrap();
    assert!(read_zeros(&fs, file, 5000, 10000));
    fs.write(file, 0, &[0xa5; 16384]).unwrap();
    resize(&fs, 5000);
    fs.sync().unwrap();
    let crashed = Arc::new(MemDevice::from_image(device.durable_image(), SECTOR_BYTES).unwrap());
    drop(fs);
    let fs = image::mount(&crashed).unwrap();
    assert_eq!(fs.getattr(file).unwrap().size, 5000);
    let zero = FallocateMode::ZeroRange { keep_size: false };
    fs.fallocate(file, 7000, 1000, zero).unwrap();
    assert!(read_zeros(&fs, file, 5000, 8000));
    fs.unmount().unwrap();
    image::fsck(crashed.as_ref()).unwrap();
}

/// Sector patterns for tearing a write of `sectors` 512-byte sectors: the first sector of
/// every 4 KiB block old and the rest new, and the reverse.
fn block_head_tears(sectors: usize) -> [Vec<bool>; 2] {
    let per_block = 4096 / SECTOR_BYTES as usize;
    [
        (0..sectors).map(|s| s % per_block != 0).collect(),
        (0..sectors).map(|s| s % per_block == 0).collect(),
    ]
}

// The setup's sync makes directory E durable with its new chunk's create item and E's inode
// item in one checkpoint; the unmount then writes the cluster home. Every write of every epoch
// is torn (earlier writes of the epoch kept) so that each block's first sector is old and the
// rest new, or the reverse. A cluster whose first sector was old (never written) used to be
// taken for a plain block: replaying the create wiped every inode, and E's newer item was then
// skipped because E's own sector already carried its LSN, so E read back free
// (docs/reliability.md item 5).
#[test]
fn regression_torn_cluster_write_home_keeps_durable_directory() {
    let ops = [
        Op::Create("A/new".into()),
        Op::Write {
            path: "foo".into(),
            offset: 40000,
            len: 100,
            id: 100,
        },
        Op::Fsync(String::new()),
    ];
    let base = cairn_crashtest::explore::base_image(image::CRASH_DEVICE_BYTES).unwrap();
    let device = Arc::new(MemDevice::from_image(base, SECTOR_BYTES).unwrap());
    let trace =
        cairn_crashtest::runner::run(&device, &cairn_crashtest::op::setup_ops(), &ops).unwrap();
    let mut checked = 0;
    for flush_index in 0..=device.flush_count() {
        for (index, write) in device.writes_after_flush(flush_index).iter().enumerate() {
            let sectors = (write.len / u64::from(SECTOR_BYTES)) as usize;
            for kept in block_head_tears(sectors) {
                let point = (0..index).fold(CrashPoint::at_flush(flush_index), CrashPoint::keep);
                let point = point.tear(index, kept);
                let problems = explore::check_point(&device, &trace, &point);
                assert!(problems.is_empty(), "{point:?}: {problems:?}");
                checked += 1;
            }
        }
    }
    assert!(checked > 0);
}

// Shrinks `foo` (16 KiB) to 5000 bytes, then writes in place into its end-of-file block
// (zero range and punch hole reaching past the new end, an overwrite inside it), with every
// crash point and subset explored: each state must show a version of foo. Those in-place
// writes used to reach the disk before the shrink was durable, so a crash showed the old
// size over zeros at 4608..5120 ("match no version", docs/reliability.md item 6).
#[test]
fn regression_write_into_shrunk_end_block_crash_shows_a_version() {
    let zero_keep = FallocateMode::ZeroRange { keep_size: true };
    let sequences = [
        vec![
            truncate("foo", 5000),
            fallocate("foo", 3000, 5000, zero_keep),
            Op::Fsync("foo".into()),
        ],
        vec![
            truncate("foo", 5000),
            fallocate("foo", 3000, 5000, FallocateMode::PunchHole),
            Op::Fdatasync("foo".into()),
        ],
        vec![
            truncate("foo", 5000),
            Op::Write {
                path: "foo".into(),
                offset: 4700,
                len: 100,
                id: 78,
            },
            Op::Sync,
        ],
    ];
    explore_every_state("shrink then write in the end block", sequences);
}

// Makes 100 symlinks with remote target blocks and syncs (their blocks logged whole), fills
// the filesystem, removes the symlinks and syncs, then writes a file into the freed blocks
// and fsyncs it; after a crash the file must read back what was written. Freeing a symlink's
// blocks logged no cancel record, so recovery replayed the old targets over the file's data
// (docs/reliability.md item 8).
#[test]
fn regression_freed_symlink_blocks_not_replayed_over_data() {
    let device = Arc::new(image::formatted_device(image::CRASH_DEVICE_BYTES).unwrap());
    let fs = image::mount(&device).unwrap();
    let (top, who) = (fs.root(), Credentials::root());
    let new_file = |name: &[u8]| {
        let made = fs.create(top, name, FileKind::Regular, 0o644, 0, &who);
        made.unwrap().inode
    };
    let (file, filler) = (new_file(b"f"), new_file(b"filler"));
    for index in 0..100 {
        let name = format!("s{index}");
        let link = fs
            .symlink(top, name.as_bytes(), &[b'q'; 3000], &who)
            .unwrap();
        fs.forget(link.inode, 1);
    }
    fs.sync().unwrap();
    let mut size = 0;
    while let Ok(written) = fs.write(filler, size, &[1; 4096]) {
        size += u64::from(written);
    }
    for index in 0..100 {
        fs.unlink(top, format!("s{index}").as_bytes(), &who)
            .unwrap();
    }
    fs.sync().unwrap();
    let mut written = 0;
    while written < 256 << 10 {
        written += u64::from(fs.write(file, written, &[0x77; 4096]).unwrap());
    }
    fs.fsync(file, false).unwrap();
    let crashed = Arc::new(MemDevice::from_image(device.durable_image(), SECTOR_BYTES).unwrap());
    drop(fs);
    let fs = image::mount(&crashed).unwrap();
    let data = fs.read(file, 0, written as u32).unwrap();
    let wrong = data.iter().filter(|&&byte| byte != 0x77).count();
    assert_eq!((data.len() as u64, wrong), (written, 0));
    fs.unmount().unwrap();
    image::fsck(crashed.as_ref()).unwrap();
}

// Collapses or inserts a block of `foo` (16 KiB), then writes in place into a block the
// shift moved (zero range, punch hole, an overwrite), with every crash point and subset
// explored: each state must show a version of foo. The shift waited in the log while the
// write reached the moved block on the device, so a crash that lost the shift showed the
// new bytes at the block's old offset: "foo: bytes 8192..8704 match no version (all zero:
// true)" (docs/reliability.md item 17).
#[test]
fn regression_write_into_shifted_blocks_crash_shows_a_version() {
    let zero_keep = FallocateMode::ZeroRange { keep_size: true };
    let collapse = || fallocate("foo", 4096, 4096, FallocateMode::CollapseRange);
    let insert = || fallocate("foo", 4096, 4096, FallocateMode::InsertRange);
    let overwrite = |offset: u64| Op::Write {
        path: "foo".into(),
        offset,
        len: 100,
        id: 79,
    };
    let sequences = [
        vec![
            collapse(),
            fallocate("foo", 3000, 5000, zero_keep),
            Op::Fsync("foo".into()),
        ],
        vec![
            collapse(),
            fallocate("foo", 5000, 2000, FallocateMode::PunchHole),
            Op::Fdatasync("foo".into()),
        ],
        vec![collapse(), overwrite(8300), Op::Sync],
        vec![
            insert(),
            fallocate("foo", 9000, 5000, zero_keep),
            Op::Fsync("foo".into()),
        ],
        vec![insert(), overwrite(12600), Op::Sync],
    ];
    explore_every_state("write into shifted blocks", sequences);
}
