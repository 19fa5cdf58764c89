//! The `fsck.cairn` command line, with fsck(8) exit codes.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

use crate::{FsckError, Report, check_path};

/// fsck(8) exit codes.
pub const EXIT_CLEAN: u8 = 0;
pub const EXIT_CORRECTED: u8 = 1;
pub const EXIT_UNCORRECTED: u8 = 4;
pub const EXIT_OPERATIONAL: u8 = 8;
pub const EXIT_USAGE: u8 = 16;

/// Check a cairn filesystem.
///
/// This version checks and reports; it does not repair. `-y`, `-p` and `-a` are accepted as
/// fsck(8) passes them, and then errors are reported and left uncorrected (exit 4).
#[derive(Debug, Parser)]
#[command(name = "fsck.cairn", version, about, long_about = None)]
pub struct Args {
    /// Block device or image file to check.
    pub device: PathBuf,
    /// Check only; make no changes (the default).
    #[arg(short = 'n', long = "no-modify", conflicts_with_all = ["yes", "preen"])]
    pub no_modify: bool,
    /// Answer yes to every repair (no repairs exist in this version).
    #[arg(short = 'y', long)]
    pub yes: bool,
    /// Repair what is safe without asking (no repairs exist in this version).
    #[arg(short = 'p', short_alias = 'a', long)]
    pub preen: bool,
    /// Check even if the filesystem seems clean (every check is full in this version).
    #[arg(short = 'f', long)]
    pub force: bool,
    /// Read through the page cache instead of O_DIRECT (for tmpfs and similar).
    #[arg(long)]
    pub buffered: bool,
    /// Print nothing but problems.
    #[arg(short = 'q', long)]
    pub quiet: bool,
}

/// Runs fsck.cairn with `args` (including the program name) and returns its exit status.
pub fn main(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    let args = match Args::try_parse_from(args) {
        Ok(args) => args,
        Err(err) => {
            let _ = err.print();
            return ExitCode::from(if err.use_stderr() {
                EXIT_USAGE
            } else {
                EXIT_CLEAN
            });
        }
    };
    ExitCode::from(run(&args))
}

/// Checks as `args` say, prints the outcome and returns the fsck(8) exit code.
pub fn run(args: &Args) -> u8 {
    if args.yes || args.preen {
        eprintln!("fsck.cairn: this version does not repair; checking only");
    }
    match check_path(&args.device, args.buffered) {
        Ok(report) => {
            print_report(args, &report);
            if report.is_clean() {
                EXIT_CLEAN
            } else {
                EXIT_UNCORRECTED
            }
        }
        Err(FsckError::Device(err)) => {
            eprintln!("fsck.cairn: {}: {err}", args.device.display());
            EXIT_OPERATIONAL
        }
    }
}

fn print_report(args: &Args, report: &Report) {
    for problem in &report.problems {
        println!("{problem}");
    }
    if args.quiet {
        return;
    }
    let verdict = if report.is_clean() {
        "clean".to_string()
    } else {
        format!("{} problems left uncorrected", report.problems.len())
    };
    println!(
        "{}: {verdict}; {} blocks and {} inodes checked, {} inodes in use, \
         {} free blocks in {} extents",
        args.device.display(),
        report.blocks_checked,
        report.inodes_checked,
        report.allocated_inodes,
        report.free_blocks,
        report.free_extents,
    );
}
