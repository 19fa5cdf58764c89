//! The `fsck.cairn` command line, with fsck(8) exit codes.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

use crate::repair::{Mode, Outcome, RepairOptions, repair_path};
use crate::{Progress, Report, check_path};

/// fsck(8) exit codes.
pub const EXIT_CLEAN: u8 = 0;
pub const EXIT_CORRECTED: u8 = 1;
pub const EXIT_UNCORRECTED: u8 = 4;
pub const EXIT_OPERATIONAL: u8 = 8;
pub const EXIT_USAGE: u8 = 16;

/// Check a cairn filesystem, and repair it with `-y` or `-p`.
///
/// Without `-y` or `-p` nothing is written (as with `-n`). Repair refuses a device that is
/// mounted or otherwise held.
#[derive(Debug, Parser)]
#[command(name = "fsck.cairn", version, about, long_about = None)]
pub struct Args {
    /// Block device or image file to check.
    pub device: PathBuf,
    /// Check only; make no changes (the default).
    #[arg(short = 'n', long = "no-modify", conflicts_with_all = ["yes", "preen"])]
    pub no_modify: bool,
    /// Repair everything, even what loses data (clearing inodes, dropping entries).
    #[arg(short = 'y', long)]
    pub yes: bool,
    /// Repair only what loses no data; anything else is left uncorrected (exit 4).
    #[arg(short = 'p', short_alias = 'a', long)]
    pub preen: bool,
    /// Check even if the filesystem seems clean (every check is full in this version).
    #[arg(short = 'f', long)]
    pub force: bool,
    /// With -y: also discard a dirty log whose replay fails for a reason outside the log
    /// (such as a device error while writing home), LOSING the changes it holds; without it
    /// such a log is kept and the run exits 4.
    #[arg(short = 'L', long, requires = "yes", conflicts_with_all = ["no_modify", "preen"])]
    pub discard_log: bool,
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
    let progress = if args.quiet {
        Progress::hidden()
    } else {
        Progress::on_terminal()
    };
    if args.yes || args.preen {
        let mode = if args.yes { Mode::Yes } else { Mode::Preen };
        let options = RepairOptions {
            mode,
            discard_log: args.discard_log,
        };
        let repaired = repair_path(&args.device, args.buffered, options, &progress);
        progress.finish();
        return match repaired {
            Ok(outcome) => print_outcome(args, &outcome),
            Err(err) => {
                eprintln!(
                    "fsck.cairn: {}: {err}; nothing was changed",
                    args.device.display()
                );
                EXIT_OPERATIONAL
            }
        };
    }
    let checked = check_path(&args.device, args.buffered, &progress);
    progress.finish();
    match checked {
        Ok(report) => {
            print_report(args, &report);
            if report.is_clean() {
                EXIT_CLEAN
            } else {
                EXIT_UNCORRECTED
            }
        }
        Err(err) => {
            eprintln!("fsck.cairn: {}: {err}", args.device.display());
            EXIT_OPERATIONAL
        }
    }
}

/// Prints what a repair did and what is left; returns the exit code.
fn print_outcome(args: &Args, outcome: &Outcome) -> u8 {
    for warning in &outcome.warnings {
        eprintln!("fsck.cairn: WARNING: {warning}");
    }
    for action in &outcome.actions {
        println!("repaired: {action}");
    }
    for problem in outcome.fixed() {
        println!("fixed: {problem}");
    }
    for skipped in &outcome.skipped {
        println!("left: {skipped}");
    }
    print_report(args, &outcome.after);
    outcome.exit_code()
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
