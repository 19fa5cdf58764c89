//! `cairn-crashtest`: the full run. Explores every one- and two-op workload and a set of long
//! random workloads at every crash point chosen, injects faults, fuzzes images and fills the
//! filesystem; prints the counts and every violation, and exits non-zero on any violation.
//!
//! Usage: `cairn-crashtest [--quick]` (`--quick` runs about a tenth of everything).

use std::process::ExitCode;

use cairn_crashtest::explore::ExploreConfig;
use cairn_crashtest::suite::{self, Tally};
use cairn_crashtest::{CrashError, workload};

/// Long random workloads in the full run, and their length.
const RANDOM_WORKLOADS: u64 = 40;
const RANDOM_LEN: usize = 40;

fn run(quick: bool) -> Result<Tally, CrashError> {
    let stride = if quick { 10 } else { 1 };
    let config = ExploreConfig {
        random_per_flush: 4,
        seed: 2024,
        extra_points_max: if quick { Some(8) } else { None },
    };
    let mut workloads: Vec<_> = workload::seq1().into_iter().step_by(stride).collect();
    workloads.extend(workload::seq2().into_iter().step_by(stride));
    workloads.extend(
        (0..RANDOM_WORKLOADS / stride as u64).map(|seed| workload::random(seed, RANDOM_LEN)),
    );
    eprintln!("exploring {} workloads", workloads.len());
    let mut tally = suite::crash_run(&workloads, &config)?;
    eprintln!("crash: {}", tally.summary());
    for seed in 0..(8 / stride as u64).max(1) {
        suite::merge(
            &mut tally,
            suite::fault_run(&workload::random(100 + seed, 20), 200, 3)?,
        );
    }
    suite::merge(&mut tally, suite::read_fault_run(200 / stride, 9)?);
    eprintln!("faults: {}", tally.summary());
    suite::merge(&mut tally, suite::fuzz_run(2000 / stride as u64, 4)?);
    eprintln!("fuzz: {}", tally.summary());
    suite::merge(&mut tally, suite::space_run(1, 3)?);
    Ok(tally)
}

fn main() -> ExitCode {
    let quick = std::env::args().any(|arg| arg == "--quick");
    match run(quick) {
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
