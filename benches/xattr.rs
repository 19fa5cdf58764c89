#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Extended attribute benchmark: set, get, list and remove rates with many attributes on one
//! file, at library level through `cairn-fs` on a 1 GiB memory device (4 KiB blocks, 512-byte
//! inodes), so the figures show the attribute code's own cost and how it grows.
//!
//! For each count in `XATTR_BENCH_COUNTS` (default `100,1000,10000`) one file gets that many
//! attributes `user.attribute-NNNNNNNN` with 24-byte values (set), then every one is read in
//! a shuffled order (get), the whole set is listed 20 times (list: per-attribute cost), and
//! every one is removed in another shuffled order (remove). Counts are interleaved within a
//! round (100, 1000, 10000, 100, ...) for `XATTR_BENCH_ROUNDS` rounds (default 5) on a fresh
//! filesystem each. Printed: operations per second per phase and count, median (min-max),
//! and each count's median over the previous count's: ratios near 1 mean a cost per operation
//! that does not grow with the number of attributes.

use std::sync::Arc;
use std::time::Instant;

use cairn_blockdev::{BlockDevice, MemDevice};
use cairn_fs::{Credentials, FileKind, Filesystem, MountOptions, XattrFlags};
use cairn_mkfs::{FormatOptions, Request};

const SECTOR: u32 = 4096;
const FS_BYTES: u64 = 1 << 30;
const ROUNDS_DEFAULT: usize = 5;
const PHASES: [&str; 4] = ["set", "get", "list", "remove"];
/// Lists per round (one list is too short to time alone).
const LIST_REPEATS: usize = 20;

fn mounted() -> Filesystem {
    let device = MemDevice::new(FS_BYTES, SECTOR);
    device.set_recording(false);
    let request = Request {
        fs_bytes: Some(FS_BYTES),
        ..Request::default()
    };
    let plan = cairn_mkfs::plan(FS_BYTES, SECTOR, &request).unwrap();
    let options = FormatOptions {
        uuid: Some([7; 16]),
        discard: false,
        now_secs: 1_700_000_000,
    };
    cairn_mkfs::format(&device, &plan, &options).unwrap();
    let device: Arc<dyn BlockDevice> = Arc::new(device);
    Filesystem::mount(device, MountOptions::default()).unwrap()
}

/// `0..count` in a fixed pseudo-random order.
fn shuffled(count: usize, seed: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..count).collect();
    let mut state = seed | 1;
    for index in (1..count).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        order.swap(index, (state % (index as u64 + 1)) as usize);
    }
    order
}

fn name(index: usize) -> Vec<u8> {
    format!("user.attribute-{index:08}").into_bytes()
}

/// Operations per second of each phase for `count` attributes.
fn run_once(count: usize, round: usize) -> [f64; 4] {
    let fs = mounted();
    let who = Credentials::root();
    let file = format!("f{count}");
    let inode = fs
        .create(
            fs.root(),
            file.as_bytes(),
            FileKind::Regular,
            0o644,
            0,
            &who,
        )
        .unwrap()
        .inode;
    let value = [0x5au8; 24];
    let rate = |started: Instant, ops: usize| ops as f64 / started.elapsed().as_secs_f64();
    let started = Instant::now();
    for index in 0..count {
        fs.setxattr(inode, &name(index), &value, XattrFlags::Any, &who)
            .unwrap();
    }
    let set = rate(started, count);
    let started = Instant::now();
    for index in shuffled(count, round as u64 + 1) {
        assert_eq!(fs.getxattr(inode, &name(index), &who).unwrap(), value);
    }
    let get = rate(started, count);
    let started = Instant::now();
    for _ in 0..LIST_REPEATS {
        assert_eq!(fs.listxattr(inode, &who).unwrap().len(), count);
    }
    let list = rate(started, count * LIST_REPEATS);
    let started = Instant::now();
    for index in shuffled(count, round as u64 + 99) {
        fs.removexattr(inode, &name(index), &who).unwrap();
    }
    let remove = rate(started, count);
    fs.unmount().unwrap();
    [set, get, list, remove]
}

fn median_min_max(values: &mut [f64]) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    (
        values[values.len() / 2],
        values[0],
        values[values.len() - 1],
    )
}

fn main() {
    let counts: Vec<usize> = std::env::var("XATTR_BENCH_COUNTS")
        .unwrap_or_else(|_| "100,1000,10000".into())
        .split(',')
        .filter_map(|c| c.trim().parse().ok())
        .collect();
    let rounds = std::env::var("XATTR_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(ROUNDS_DEFAULT);
    let mut samples = vec![[const { Vec::<f64>::new() }; 4]; counts.len()];
    for round in 0..rounds {
        for (index, &count) in counts.iter().enumerate() {
            for (phase, rate) in run_once(count, round).into_iter().enumerate() {
                samples[index][phase].push(rate);
            }
        }
    }
    println!("xattr rates (ops/s; list: attributes/s), median (min-max) of {rounds} rounds");
    let mut medians = vec![[0f64; 4]; counts.len()];
    for (index, &count) in counts.iter().enumerate() {
        for phase in 0..4 {
            let (median, min, max) = median_min_max(&mut samples[index][phase]);
            medians[index][phase] = median;
            println!(
                "xattr/{}/{count}: {median:.0} ({min:.0}-{max:.0})",
                PHASES[phase]
            );
        }
    }
    for (index, &count) in counts.iter().enumerate().skip(1) {
        let ratios: Vec<String> = (0..4)
            .map(|p| {
                let ratio = medians[index][p] / medians[index - 1][p];
                format!("{} {ratio:.2}", PHASES[p])
            })
            .collect();
        println!("ratio {count}/{}: {}", counts[index - 1], ratios.join(", "));
    }
}
