#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

//! The published preallocation complaint as a test: two writers in one directory, each
//! appending 512 KiB with `O_DIRECT` and `fsync` after every write. Size per file from
//! `CAIRN_APPEND_MIB` (default 32); the full-size run is
//! `CAIRN_APPEND_MIB=256 cargo test --release -p cairn-fs --test append -- --nocapture`.

mod common;

use std::time::{Duration, Instant};

use cairn_fs::{FallocateMode, FileKind, Filesystem};
use common::{fsck_clean, make_device, mount, root};

const CHUNK: usize = 512 << 10;
/// The goal from the issue: at most this many extents per file.
const EXTENTS_PER_FILE_MAX: usize = 16;

fn size_bytes() -> u64 {
    let mib = std::env::var("CAIRN_APPEND_MIB")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(32);
    mib << 20
}

fn appender(fs: &Filesystem, inode: u64, size: u64, fill: u8) {
    let file = fs.open(inode, true, false, true, &root()).unwrap();
    let chunk = vec![fill; CHUNK];
    let mut at = 0;
    while at < size {
        assert_eq!(fs.write(inode, at, &chunk).unwrap() as usize, CHUNK);
        fs.fsync(inode, true).unwrap();
        at += CHUNK as u64;
    }
    fs.release(file).unwrap();
}

/// Reads the whole file in 1 MiB requests; returns the time taken.
fn read_back(fs: &Filesystem, inode: u64, size: u64, fill: u8) -> Duration {
    let started = Instant::now();
    let mut at = 0;
    while at < size {
        let data = fs.read(inode, at, 1 << 20).unwrap();
        assert!(data.iter().all(|&b| b == fill), "offset {at}");
        at += data.len() as u64;
    }
    started.elapsed()
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values[values.len() / 2]
}

// Two threads append 512 KiB + fsync to two files of one directory; each file must end with
// at most 16 extents (a count, asserted), the data must read back, fsck must be clean, and
// the stats must show allocator and extent-cache activity. Read-back time against a
// one-extent file is printed (interleaved runs, medians) for docs/benchmarks.md.
#[test]
fn two_direct_appenders_stay_contiguous() {
    let size = size_bytes();
    let device = make_device(3 * size + size / 4 + (64 << 20));
    let fs = mount(&device);
    let who = root();
    let dir = fs.mkdir(fs.root(), b"db", 0o755, &who).unwrap();
    let create = |name: &[u8]| {
        fs.create(dir.inode, name, FileKind::Regular, 0o644, 0, &who)
            .unwrap()
            .inode
    };
    let (first, second) = (create(b"wal-a"), create(b"wal-b"));
    let started = Instant::now();
    std::thread::scope(|scope| {
        scope.spawn(|| appender(&fs, first, size, 0xa1));
        scope.spawn(|| appender(&fs, second, size, 0xb2));
    });
    let append_time = started.elapsed();
    let mut counts = Vec::new();
    for inode in [first, second] {
        let extents = fs.file_extents(inode).unwrap();
        assert_eq!(fs.getattr(inode).unwrap().size, size);
        assert!(
            extents.len() <= EXTENTS_PER_FILE_MAX,
            "{} extents",
            extents.len()
        );
        assert_eq!(extents.iter().map(|e| e.length).sum::<u64>(), size);
        counts.push(extents.len());
    }
    let reference = create(b"one-extent");
    let falloc = FallocateMode::Allocate { keep_size: false };
    fs.fallocate(reference, 0, size, falloc).unwrap();
    for at in (0..size).step_by(4 << 20) {
        fs.write(
            reference,
            at,
            &vec![0xc3; (4 << 20).min(size - at) as usize],
        )
        .unwrap();
    }
    // One fallocate call: as few extents as the AG layout allows (one unless it spans AGs).
    let reference_extents = fs.file_extents(reference).unwrap().len();
    let (mut appended, mut single) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        appended.push(read_back(&fs, first, size, 0xa1));
        single.push(read_back(&fs, reference, size, 0xc3));
    }
    let (appended, single) = (median(appended), median(single));
    let mib = (size >> 20) as f64;
    let ratio = single.as_secs_f64() / appended.as_secs_f64();
    println!(
        "append: {} MiB per file, extents {counts:?}, append {append_time:?}; read-back \
         median {:.0} MiB/s appended vs {:.0} MiB/s reference ({reference_extents} \
         extents) ({:.0}%)",
        size >> 20,
        mib / appended.as_secs_f64(),
        mib / single.as_secs_f64(),
        ratio * 100.0
    );
    let stats = fs.stats();
    assert!(stats.alloc.allocations > 0);
    assert!(stats.extcache.hits > 0 && stats.extcache.misses > 0);
    assert!(stats.data.preallocated_blocks > 0);
    fs.unmount().unwrap();
    fsck_clean(&device);
}

// Appends in a fixed order that once defeated the appenders' separation: B writes first,
// then A writes twice (its second write continues it in place, so its growing run is two
// allocations long), then both alternate. B's continuation lies in the first part of A's
// run; B must still move apart rather than leapfrog A, so each file ends in at most two
// extents (the first write, then one run).
#[test]
fn an_appender_moves_apart_from_a_run_grown_in_place() {
    // The middle of the longest free extent lies 32 MiB or more from the first files.
    let size = 8u64 << 20;
    let device = make_device(256 << 20);
    let fs = mount(&device);
    let who = root();
    let dir = fs.mkdir(fs.root(), b"db", 0o755, &who).unwrap();
    let create = |name: &[u8]| {
        fs.create(dir.inode, name, FileKind::Regular, 0o644, 0, &who)
            .unwrap()
            .inode
    };
    let (a, b) = (create(b"a"), create(b"b"));
    let handles = [a, b].map(|inode| fs.open(inode, true, false, true, &who).unwrap());
    let chunk = vec![0x5a; CHUNK];
    let append = |inode: u64| {
        let at = fs.getattr(inode).unwrap().size;
        assert_eq!(fs.write(inode, at, &chunk).unwrap() as usize, CHUNK);
        fs.fsync(inode, true).unwrap();
    };
    append(b);
    append(a);
    append(a);
    while fs.getattr(a).unwrap().size < size || fs.getattr(b).unwrap().size < size {
        for inode in [b, a] {
            if fs.getattr(inode).unwrap().size < size {
                append(inode);
            }
        }
    }
    for inode in [a, b] {
        let mut extents = fs.file_extents(inode).unwrap();
        extents.retain(|extent| extent.offset < size);
        let merged = extents
            .windows(2)
            .filter(|pair| pair[0].physical + pair[0].length != pair[1].physical)
            .count()
            + 1;
        assert!(merged <= 2, "inode {inode}: {extents:?}");
    }
    for handle in handles {
        fs.release(handle).unwrap();
    }
    fs.unmount().unwrap();
    fsck_clean(&device);
}
