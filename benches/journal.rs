#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Journal benchmarks.
//!
//! Criterion: the commit of a one-inode transaction (`journal/commit_1_inode/{delayed,sync}`),
//! on a 64 MiB memory filesystem.
//!
//! Then the published delayed-logging workload, at library level through `cairn-fs`: create
//! `JOURNAL_BENCH_FILES` (default 100,000) zero-length files, then unlink them, on a 1 GiB
//! memory device formatted by `cairn_mkfs` with the default log (32 MiB), in both log modes.
//! The files go into directories of `JOURNAL_BENCH_FILES_PER_DIR` (default 100,000: one
//! directory, the published run's shape), made before the measured phases. Runs are
//! interleaved (delayed, sync, delayed, sync, ...) for `JOURNAL_BENCH_ROUNDS` rounds
//! (default 3); each phase ends with `sync()` so the last checkpoint is counted. Printed: log
//! bytes per operation and operations per second for each mode and phase, median (min-max),
//! and the delayed/sync ratios. `JOURNAL_BENCH_FILES=0` skips the workload.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use cairn_blockdev::{BlockDevice, MemDevice};
use cairn_bufcache::{BufferCache, CacheConfig};
use cairn_format::{InodeNumber, Superblock};
use cairn_fs::{Credentials, FileKind, Filesystem, LogMode, MountOptions};
use cairn_journal::{Journal, JournalConfig, Reservation};
use cairn_mkfs::{FormatOptions, Request};
use criterion::Criterion;

const SECTOR: u32 = 4096;
const WORKLOAD_FS_BYTES: u64 = 1 << 30;
const COMMIT_FS_BYTES: u64 = 64 << 20;
const FILES_DEFAULT: u64 = 100_000;
const FILES_PER_DIR_DEFAULT: u64 = 100_000;
const ROUNDS_DEFAULT: usize = 3;

/// A memory device of `fs_bytes` formatted with the default options (default log size). The
/// op log is off: the workload writes gigabytes of log in sync mode.
fn formatted(fs_bytes: u64) -> (Arc<MemDevice>, Superblock) {
    let device = MemDevice::new(fs_bytes, SECTOR);
    device.set_recording(false);
    let request = Request {
        fs_bytes: Some(fs_bytes),
        ..Request::default()
    };
    let plan = cairn_mkfs::plan(fs_bytes, SECTOR, &request).unwrap();
    let options = FormatOptions {
        uuid: Some([9; 16]),
        discard: false,
        now_secs: 1_700_000_000,
    };
    let report = cairn_mkfs::format(&device, &plan, &options).unwrap();
    (Arc::new(device), report.superblock)
}

/// The root inode's home image, the payload the commit bench logs.
fn root_image(device: &MemDevice, superblock: &Superblock) -> Vec<u8> {
    let geometry = &superblock.geometry;
    let inode = InodeNumber(superblock.root_inode);
    let (block, offset) = geometry.inode_position(inode).unwrap();
    let start = (block.0 * u64::from(geometry.block_size)) as usize + offset;
    device.snapshot()[start..start + geometry.inode_size as usize].to_vec()
}

fn commit_benches(c: &mut Criterion) {
    let mut group = c.benchmark_group("journal/commit_1_inode");
    for (name, mode) in [("delayed", LogMode::Delayed), ("sync", LogMode::Sync)] {
        let (device, superblock) = formatted(COMMIT_FS_BYTES);
        let dyn_device: Arc<dyn BlockDevice> = device.clone();
        let cache_config = CacheConfig::from_geometry(&superblock.geometry);
        let cache = Arc::new(BufferCache::new(cache_config, Arc::clone(&dyn_device)).unwrap());
        let config = JournalConfig::with_mode(mode);
        let (journal, _) = Journal::open(cache, dyn_device, &superblock, config).unwrap();
        let geometry = superblock.geometry;
        let reservation = Reservation::for_items(&geometry, 0, geometry.block_size, 1, 0);
        let inode = InodeNumber(superblock.root_inode);
        let mut image = root_image(&device, &superblock);
        group.bench_function(name, |b| {
            b.iter(|| {
                image[200] = image[200].wrapping_add(1);
                let mut tx = journal.begin(reservation).unwrap();
                tx.log_inode(inode, &image);
                black_box(tx.commit().unwrap())
            });
        });
        journal.unmount().unwrap();
    }
    group.finish();
}

/// What one phase of the workload did.
#[derive(Debug, Clone, Copy)]
struct Phase {
    ops: u64,
    log_bytes: u64,
    secs: f64,
}

impl Phase {
    fn bytes_per_op(&self) -> f64 {
        self.log_bytes as f64 / self.ops as f64
    }

    fn ops_per_sec(&self) -> f64 {
        self.ops as f64 / self.secs
    }
}

fn file_name(index: u64) -> Vec<u8> {
    format!("f{index:07}").into_bytes()
}

/// One run: mount a fresh filesystem in `mode`, make the directories, create `files` files
/// (`per_dir` to a directory), sync, unlink them all, sync. Returns the two phases.
fn run_workload(mode: LogMode, files: u64, per_dir: u64) -> (Phase, Phase) {
    let (device, _) = formatted(WORKLOAD_FS_BYTES);
    let options = MountOptions {
        log_mode: mode,
        ..MountOptions::default()
    };
    let fs = Filesystem::mount(device, options).unwrap();
    let who = Credentials::root();
    let dirs: Vec<u64> = (0..files.div_ceil(per_dir))
        .map(|index| {
            let name = format!("d{index:05}").into_bytes();
            fs.mkdir(fs.root(), &name, 0o755, &who).unwrap().inode
        })
        .collect();
    fs.sync().unwrap();
    let dir_of = |index: u64| dirs[(index / per_dir) as usize];
    let phase = |work: &dyn Fn(u64)| {
        let before = fs.stats().journal.log_bytes;
        let started = Instant::now();
        for index in 0..files {
            work(index);
        }
        fs.sync().unwrap();
        let secs = started.elapsed().as_secs_f64();
        let log_bytes = fs.stats().journal.log_bytes - before;
        Phase {
            ops: files,
            log_bytes,
            secs,
        }
    };
    let create = phase(&|index| {
        let name = file_name(index);
        let attr = fs
            .create(dir_of(index), &name, FileKind::Regular, 0o644, 0, &who)
            .unwrap();
        // The kernel drops its reference when the dentry goes; unlink then frees the inode.
        fs.forget(attr.inode, 1);
    });
    let unlink = phase(&|index| fs.unlink(dir_of(index), &file_name(index), &who).unwrap());
    fs.unmount().unwrap();
    (create, unlink)
}

/// Median and range of `values`.
fn spread(mut values: Vec<f64>) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    let median = values[values.len() / 2];
    (median, values[0], values[values.len() - 1])
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

fn print_row(label: &str, runs: &[Phase]) -> (f64, f64) {
    let (bytes, bytes_min, bytes_max) = spread(runs.iter().map(Phase::bytes_per_op).collect());
    let (rate, rate_min, rate_max) = spread(runs.iter().map(Phase::ops_per_sec).collect());
    println!(
        "{label:<16} log bytes/op {bytes:>9.0} ({bytes_min:.0}-{bytes_max:.0})   \
         ops/s {rate:>8.0} ({rate_min:.0}-{rate_max:.0})"
    );
    (bytes, rate)
}

fn workload_summary() {
    let files = env_or("JOURNAL_BENCH_FILES", FILES_DEFAULT);
    let per_dir = env_or("JOURNAL_BENCH_FILES_PER_DIR", FILES_PER_DIR_DEFAULT).max(1);
    let rounds = env_or("JOURNAL_BENCH_ROUNDS", ROUNDS_DEFAULT).max(1);
    if files == 0 {
        return;
    }
    let modes = [("delayed", LogMode::Delayed), ("sync", LogMode::Sync)];
    let mut results: Vec<Vec<(Phase, Phase)>> = vec![Vec::new(), Vec::new()];
    for round in 0..rounds {
        for (slot, (name, mode)) in modes.iter().enumerate() {
            let (create, unlink) = run_workload(*mode, files, per_dir);
            println!(
                "round {round} {name:<7}: create {:.0} B/op {:.0} ops/s, \
                 unlink {:.0} B/op {:.0} ops/s",
                create.bytes_per_op(),
                create.ops_per_sec(),
                unlink.bytes_per_op(),
                unlink.ops_per_sec()
            );
            results[slot].push((create, unlink));
        }
    }
    println!(
        "journal/create_unlink/{files}_files_{per_dir}_per_dir: median (min-max) of {rounds} runs"
    );
    let mut rows = Vec::new();
    for (slot, (name, _)) in modes.iter().enumerate() {
        let creates: Vec<Phase> = results[slot].iter().map(|r| r.0).collect();
        let unlinks: Vec<Phase> = results[slot].iter().map(|r| r.1).collect();
        let create = print_row(&format!("{name} create"), &creates);
        let unlink = print_row(&format!("{name} unlink"), &unlinks);
        rows.push((create, unlink));
    }
    let ratio = |phase: usize| {
        let pick = |row: &((f64, f64), (f64, f64))| if phase == 0 { row.0 } else { row.1 };
        let (delayed, sync) = (pick(&rows[0]), pick(&rows[1]));
        (sync.0 / delayed.0, delayed.1 / sync.1)
    };
    for (phase, name) in [(0, "create"), (1, "unlink")] {
        let (bytes, speed) = ratio(phase);
        println!("{name}: sync writes {bytes:.1}x the log bytes; delayed is {speed:.2}x as fast");
    }
}

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    commit_benches(&mut criterion);
    criterion.final_summary();
    workload_summary();
}
