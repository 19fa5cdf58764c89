//! `cairn-crashtest`: the full run. Explores every one- and two-op workload and a set of long
//! random workloads at every crash point chosen (also with online discard and with
//! write-behind), injects faults, fuzzes images and fills the filesystem (also with
//! write-behind); prints the counts and every violation, and exits non-zero on any violation.
//!
//! Usage: `cairn-crashtest [--quick] [--stride N] [--extra-points N]`: `--stride N` explores
//! every N-th one- and two-op workload and 1/N of the random ones, faults and fuzzed images;
//! `--extra-points N` checks at most N crash points per workload besides the flush points
//! (default: all of them); `--quick` is `--stride 10 --extra-points 8`; `--reflink` runs
//! only the reflink workloads (clones and what follows them) and their faults.

use std::process::ExitCode;
use std::time::Instant;

use cairn_crashtest::explore::ExploreConfig;
use cairn_crashtest::suite::{self, Tally};
use cairn_crashtest::{CrashError, workload};

/// Long random workloads in the full run, and their length.
const RANDOM_WORKLOADS: u64 = 40;
const RANDOM_LEN: usize = 40;

/// How much of everything a run covers.
#[derive(Debug, Clone, Copy)]
struct Bounds {
    stride: usize,
    extra_points_max: Option<usize>,
    reflink_only: bool,
}

const USAGE: &str = "usage: cairn-crashtest [--quick] [--stride N] [--extra-points N] [--reflink]";

/// The bounds asked for, or `None` when the user asked for help.
fn parse_args() -> Result<Option<Bounds>, String> {
    let mut bounds = Bounds {
        stride: 1,
        extra_points_max: None,
        reflink_only: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut number = |name: &str| -> Result<usize, String> {
            args.next()
                .and_then(|value| value.parse().ok())
                .filter(|&value: &usize| value > 0 || name == "--extra-points")
                .ok_or(format!("{name} needs a number"))
        };
        match arg.as_str() {
            "--quick" => {
                bounds.stride = 10;
                bounds.extra_points_max = Some(8);
            }
            "--stride" => bounds.stride = number("--stride")?,
            "--reflink" => bounds.reflink_only = true,
            "--extra-points" => bounds.extra_points_max = Some(number("--extra-points")?),
            "--help" | "-h" => return Ok(None),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    Ok(Some(bounds))
}

fn run(bounds: Bounds) -> Result<Tally, CrashError> {
    let started = Instant::now();
    let stride = bounds.stride;
    let config = ExploreConfig {
        random_per_flush: 4,
        seed: 2024,
        extra_points_max: bounds.extra_points_max,
        discard: false,
        data_cache: 0,
        log_sync: false,
    };
    if bounds.reflink_only {
        return reflink_pass(stride, &config);
    }
    let mut workloads: Vec<_> = workload::seq1().into_iter().step_by(stride).collect();
    workloads.extend(workload::seq2().into_iter().step_by(stride));
    workloads.extend(
        (0..(RANDOM_WORKLOADS / stride as u64).max(1))
            .map(|seed| workload::random(seed, RANDOM_LEN)),
    );
    eprintln!("exploring {} workloads", workloads.len());
    let mut tally = suite::crash_run(&workloads, &config)?;
    let xattrs: Vec<_> = workload::xattr_index()
        .into_iter()
        .step_by(stride.min(2))
        .collect();
    let setup = cairn_crashtest::op::xattr_setup_ops();
    suite::merge(
        &mut tally,
        suite::crash_run_after(&setup, &xattrs, &config)?,
    );
    // Collapse and insert range on a tree-mapped file, with the default log and with every
    // transaction durable at its commit (crash points between the shift's steps).
    let shifts: Vec<_> = workload::shift()
        .into_iter()
        .step_by(stride.min(2))
        .collect();
    let setup = cairn_crashtest::op::shift_setup_ops();
    for log_sync in [false, true] {
        let shift_config = ExploreConfig { log_sync, ..config };
        let shift_tally = suite::crash_run_after(&setup, &shifts, &shift_config)?;
        suite::merge(&mut tally, shift_tally);
    }
    eprintln!("crash: {} ({:?})", tally.summary(), started.elapsed());
    // The one-op and random workloads again on a mount with online discard: no discard may
    // zero a block that recovery or a durable file still needs.
    let discard_workloads: Vec<_> = workload::seq1()
        .into_iter()
        .step_by(stride)
        .chain(
            (0..(RANDOM_WORKLOADS / stride as u64).max(1)).map(|s| workload::random(s, RANDOM_LEN)),
        )
        .collect();
    let discard_config = ExploreConfig {
        discard: true,
        ..config
    };
    let discard_tally = suite::crash_run(&discard_workloads, &discard_config)?;
    eprintln!(
        "discard: {} ({:?})",
        discard_tally.summary(),
        started.elapsed()
    );
    suite::merge(&mut tally, discard_tally);
    suite::merge(&mut tally, write_behind_pass(stride, &config)?);
    eprintln!(
        "write-behind: {} ({:?})",
        tally.summary(),
        started.elapsed()
    );
    suite::merge(&mut tally, reflink_pass(stride, &config)?);
    eprintln!("reflink: {} ({:?})", tally.summary(), started.elapsed());
    for seed in 0..(8 / stride as u64).max(1) {
        suite::merge(
            &mut tally,
            suite::fault_run(&workload::random(100 + seed, 20), 200, 3)?,
        );
    }
    suite::merge(&mut tally, suite::read_fault_run(200 / stride, 9)?);
    eprintln!("faults: {} ({:?})", tally.summary(), started.elapsed());
    suite::merge(&mut tally, suite::fuzz_run(2000 / stride as u64, 4)?);
    eprintln!("fuzz: {} ({:?})", tally.summary(), started.elapsed());
    suite::merge(&mut tally, suite::space_run(1, 3)?);
    Ok(tally)
}

/// The crash runs again on mounts with write-behind: the write-behind workloads, the replace
/// patterns and random ones with a small cap (writers over it write back mid-workload) and
/// a large one (data stays in memory until an op writes it back), the one- and two-op
/// workloads with the
/// large cap, the write-behind workloads with every transaction durable at its commit (so
/// crash points fall inside a writeback), then the out-of-space rounds with write-behind.
fn write_behind_pass(stride: usize, config: &ExploreConfig) -> Result<Tally, CrashError> {
    use workload::{LARGE_DATA_CACHE_BYTES, SMALL_DATA_CACHE_BYTES};
    let started = Instant::now();
    let targeted: Vec<_> = workload::write_behind()
        .into_iter()
        .step_by(stride.min(2))
        .collect();
    let randoms = (0..(RANDOM_WORKLOADS / stride as u64).max(1))
        .map(|seed| workload::random_write_behind(seed, RANDOM_LEN));
    let mut mixed = targeted.clone();
    mixed.extend(workload::replace_patterns());
    mixed.extend(randoms);
    let mut tally = Tally::default();
    let mut explore = |what: &str, workloads: &[workload::Workload], cap, log_sync| {
        let config = ExploreConfig {
            data_cache: cap,
            log_sync,
            ..*config
        };
        let run = suite::crash_run(workloads, &config)?;
        eprintln!(
            "write-behind {what}: {} ({:?})",
            run.summary(),
            started.elapsed()
        );
        suite::merge(&mut tally, run);
        Ok::<(), CrashError>(())
    };
    explore("small cap", &mixed, SMALL_DATA_CACHE_BYTES, false)?;
    explore("large cap", &mixed, LARGE_DATA_CACHE_BYTES, false)?;
    let mut sequences: Vec<_> = workload::seq1().into_iter().step_by(stride).collect();
    sequences.extend(workload::seq2().into_iter().step_by(stride));
    explore("seq1+seq2", &sequences, LARGE_DATA_CACHE_BYTES, false)?;
    explore("sync log", &targeted, SMALL_DATA_CACHE_BYTES, true)?;
    let mut space = suite::space_run_with(1, 2, SMALL_DATA_CACHE_BYTES)?;
    suite::merge(
        &mut space,
        suite::space_run_with(2, 1, LARGE_DATA_CACHE_BYTES)?,
    );
    suite::merge(&mut space, suite::reserve_run(SMALL_DATA_CACHE_BYTES)?);
    suite::merge(&mut space, suite::reserve_run(LARGE_DATA_CACHE_BYTES)?);
    eprintln!("write-behind space: {}", space.summary());
    suite::merge(&mut tally, space);
    Ok(tally)
}

/// The reflink workloads (clone, overwrite either side, unlink either side...) and random
/// ones a third of whose ops are clones: plain, with write-behind at both caps and with a
/// sync log; then faults injected into the targeted ones (every write, a stopped device and
/// a failed flush in the middle of each).
fn reflink_pass(stride: usize, config: &ExploreConfig) -> Result<Tally, CrashError> {
    use workload::{LARGE_DATA_CACHE_BYTES, SMALL_DATA_CACHE_BYTES};
    let started = Instant::now();
    let targeted: Vec<_> = workload::reflink()
        .into_iter()
        .step_by(stride.min(2))
        .collect();
    let mut mixed = targeted.clone();
    mixed.extend(
        (0..(RANDOM_WORKLOADS / stride as u64).max(1))
            .map(|seed| workload::random_reflink(seed, RANDOM_LEN)),
    );
    let mut tally = Tally::default();
    let runs = [
        ("plain", 0, false),
        ("small cap", SMALL_DATA_CACHE_BYTES, false),
        ("large cap", LARGE_DATA_CACHE_BYTES, false),
        ("sync log", 0, true),
    ];
    for (what, cap, log_sync) in runs {
        let config = ExploreConfig {
            data_cache: cap,
            log_sync,
            ..*config
        };
        let run = suite::crash_run(&mixed, &config)?;
        eprintln!(
            "reflink {what}: {} ({:?})",
            run.summary(),
            started.elapsed()
        );
        suite::merge(&mut tally, run);
    }
    for workload in targeted.iter().step_by(4) {
        suite::merge(&mut tally, suite::fault_run(workload, 24, 1)?);
    }
    eprintln!(
        "reflink faults: {} ({:?})",
        tally.summary(),
        started.elapsed()
    );
    Ok(tally)
}

fn main() -> ExitCode {
    let bounds = match parse_args() {
        Ok(Some(bounds)) => bounds,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(message) => {
            eprintln!("cairn-crashtest: {message}");
            return ExitCode::from(2);
        }
    };
    match run(bounds) {
        Ok(tally) => {
            for violation in &tally.violations {
                println!("VIOLATION {violation}");
            }
            println!("{}", tally.summary());
            if tally.violations.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(error) => {
            eprintln!("cairn-crashtest: {error}");
            ExitCode::from(2)
        }
    }
}
