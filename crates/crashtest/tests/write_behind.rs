#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The write-behind subset (runs in CI): sampled crash exploration on mounts with
//! `MountOptions::data_cache` on, and the out-of-space rounds with it. Any violation fails.

use std::sync::Arc;

use cairn_crashtest::explore::ExploreConfig;
use cairn_crashtest::image::{self, CRASH_DEVICE_BYTES, WorkloadMount};
use cairn_crashtest::suite::{self, Tally};
use cairn_crashtest::workload::{self, LARGE_DATA_CACHE_BYTES, SMALL_DATA_CACHE_BYTES, Workload};
use cairn_crashtest::{op, runner};

fn judge(what: &str, tally: &Tally) {
    eprintln!("{what}: {}", tally.summary());
    for violation in tally.violations.iter().take(3) {
        eprintln!("  {violation}");
    }
    assert!(
        tally.violations.is_empty(),
        "{what}: {} violations, first: {}",
        tally.violations.len(),
        tally.violations[0]
    );
}

fn config(data_cache: u64, log_sync: bool) -> ExploreConfig {
    ExploreConfig {
        random_per_flush: 2,
        seed: 7,
        extra_points_max: Some(6),
        discard: false,
        data_cache,
        log_sync,
    }
}

/// The write-behind workload whose name contains `needle` (the first one, without persist).
fn targeted(needle: &str) -> Workload {
    workload::write_behind()
        .into_iter()
        .find(|w| w.name.contains(needle))
        .unwrap()
}

// Explores the write-behind workloads (every body once) and a random one with a small cap,
// so writers over it write back mid-workload, then some of them with every transaction
// durable at its commit (crash points inside a writeback). Each crash state must be one the
// oracle allows: fsync promises kept, other bytes old, new, or zero past a size logged early.
#[test]
fn crash_write_behind_small_cap() {
    let started = std::time::Instant::now();
    let targeted = workload::write_behind();
    // A stride of 3 over bodies of 4 variants each takes every body once.
    let mut small: Vec<_> = targeted.iter().step_by(3).cloned().collect();
    small.push(workload::random_write_behind(1, 20));
    let mut tally = suite::crash_run(&small, &config(SMALL_DATA_CACHE_BYTES, false)).unwrap();
    let synced: Vec<_> = targeted.iter().step_by(11).cloned().collect();
    let synced = suite::crash_run(&synced, &config(SMALL_DATA_CACHE_BYTES, true)).unwrap();
    suite::merge(&mut tally, synced);
    assert!(tally.crash_states > 300, "{}", tally.summary());
    eprintln!("took {:?}", started.elapsed());
    judge("write-behind, small cap", &tally);
}

// Explores the other variant of every write-behind body, a random workload and a sample of
// the one- and two-op workloads with a large cap: data stays in memory until an op writes
// it back, so crash points see sizes logged before their data.
#[test]
fn crash_write_behind_large_cap() {
    let started = std::time::Instant::now();
    let mut large: Vec<_> = workload::write_behind()
        .into_iter()
        .skip(1)
        .step_by(3)
        .collect();
    large.push(workload::random_write_behind(2, 20));
    large.extend(workload::seq1().into_iter().step_by(17));
    large.extend(workload::seq2().into_iter().step_by(1000));
    let tally = suite::crash_run(&large, &config(LARGE_DATA_CACHE_BYTES, false)).unwrap();
    assert!(tally.crash_states > 300, "{}", tally.summary());
    eprintln!("took {:?}", started.elapsed());
    judge("write-behind, large cap", &tally);
}

// Explores the patterns of issue 34 (new files, a save by rename, an exchange, a rewrite
// in place, each ended by another file's fsync, nothing, a sync or the commit window) with
// both caps and with a sync log: a file comes back as a prefix of a content it had, a
// replaced file with its old content or its new one, whole; what the window covered is
// all there.
#[test]
fn crash_replace_patterns() {
    let patterns = workload::replace_patterns();
    let mut tally = suite::crash_run(&patterns, &config(LARGE_DATA_CACHE_BYTES, false)).unwrap();
    let small = suite::crash_run(&patterns, &config(SMALL_DATA_CACHE_BYTES, false)).unwrap();
    suite::merge(&mut tally, small);
    let synced: Vec<_> = patterns.iter().step_by(3).cloned().collect();
    let synced = suite::crash_run(&synced, &config(LARGE_DATA_CACHE_BYTES, true)).unwrap();
    suite::merge(&mut tally, synced);
    assert!(tally.crash_states > 200, "{}", tally.summary());
    judge("replace patterns", &tally);
}

// Checks that the workloads reach the cache (so the exploration above is not vacuous): with
// the large cap data is still dirty after the writes, and with the small cap the writer
// over it wrote the oldest file back first.
#[test]
fn write_behind_workloads_reach_the_cache() {
    let over_cap = targeted("write(new, 49152, 4096)");
    for (cap, wanted_throttled) in [
        (SMALL_DATA_CACHE_BYTES, true),
        (LARGE_DATA_CACHE_BYTES, false),
    ] {
        let device = Arc::new(image::formatted_device(CRASH_DEVICE_BYTES).unwrap());
        let choice = WorkloadMount {
            data_cache: cap,
            ..WorkloadMount::default()
        };
        let fs = image::mount_with(&device, choice).unwrap();
        for step in op::setup_ops().iter().chain(&over_cap.ops) {
            runner::perform(&fs, step).unwrap();
        }
        let stats = fs.stats().write_behind;
        assert!(stats.dirty_bytes > 0, "cap {cap}: {stats:?}");
        assert_eq!(
            stats.throttled_writes > 0,
            wanted_throttled,
            "cap {cap}: {stats:?}"
        );
        fs.unmount().unwrap();
    }
}

// Fills the filesystem to 100% with write-behind on (small cap, then large with two
// writers): a full filesystem is reported by the write calls, and every accepted write,
// fsynced, reads back before and after a remount.
#[test]
fn fill_with_write_behind() {
    let mut tally = suite::space_run_with(1, 2, SMALL_DATA_CACHE_BYTES).unwrap();
    suite::merge(
        &mut tally,
        suite::space_run_with(2, 1, LARGE_DATA_CACHE_BYTES).unwrap(),
    );
    assert_eq!(tally.fill_rounds, 3);
    judge("fill with write-behind", &tally);
}

// Caches writes until little unreserved space is left, then fills the rest with files
// holding a large attribute, or with one file written in large (write-through) writes,
// both allocating without a reservation, then fsyncs the cached data: the hog must get
// ENOSPC before it eats the space reserved for the accepted writes. Before the allocator
// held reserved blocks back (`Allocator::hold_back`), the hogs took them and the cached data
// was lost at writeback.
#[test]
fn regression_write_behind_reservations_hold_against_hogs() {
    let mut tally = suite::reserve_run(SMALL_DATA_CACHE_BYTES).unwrap();
    suite::merge(
        &mut tally,
        suite::reserve_run(LARGE_DATA_CACHE_BYTES).unwrap(),
    );
    assert_eq!(tally.fill_rounds, 4);
    judge("reservations against hogs", &tally);
}
