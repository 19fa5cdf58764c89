//! `cairn-repair-sweep`: the full repair sweep (docs/reliability.md, "Repair sweep"). Builds
//! the base image, damages one unit at a time in every way (`repair_fuzz::cases` with
//! `full`), runs `fsck.cairn -y` and judges each case; prints the counts per unit kind and
//! every failed case, and exits 1 on any failure.
//!
//! Usage: `cairn-repair-sweep [--quick] [--stride N] [--threads N] [--kind NAME] [--from N]
//! [--count N] [--list] [--trace]`: `--quick` gives each field the value verbs only (zero,
//! ones, +1, -1, random) and each unit one bit flip; `--stride N` keeps every N-th field of
//! each unit; `--kind` keeps units whose kind name contains NAME; `--from N` skips the first
//! N cases and `--count N` runs N of them; `--list` lists the cases instead of running them;
//! `--trace` names each case on stderr before it runs. `CAIRN_SWEEP_KEEP=PATH` keeps each
//! damaged image (before repair) at PATH, to look at one case by hand.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use cairn_crashtest::repair_base::build_base;
use cairn_crashtest::repair_fuzz::{cases, select_units, sweep};

const USAGE: &str = "usage: cairn-repair-sweep [--quick] [--stride N] [--threads N] \
     [--kind NAME] [--from N] [--count N] [--list] [--trace]";

#[derive(Debug)]
struct Settings {
    full: bool,
    stride: usize,
    threads: usize,
    kind: Option<String>,
    /// Cases to skip at the start, and whether to name each case before it runs.
    from: usize,
    trace: bool,
    /// Run only this many cases (after `from`), or list the cases instead of running them.
    count: Option<usize>,
    list: bool,
}

fn parse_args() -> Result<Option<Settings>, String> {
    let mut settings = Settings {
        full: true,
        stride: 1,
        threads: 2,
        kind: None,
        from: 0,
        trace: false,
        count: None,
        list: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut number = |name: &str| -> Result<usize, String> {
            args.next()
                .and_then(|value| value.parse().ok())
                .filter(|&value: &usize| value > 0)
                .ok_or(format!("{name} needs a number above 0"))
        };
        match arg.as_str() {
            "--quick" => settings.full = false,
            "--stride" => settings.stride = number("--stride")?,
            "--threads" => settings.threads = number("--threads")?,
            "--kind" => settings.kind = Some(args.next().ok_or("--kind needs a name")?),
            "--from" => settings.from = number("--from")?,
            "--trace" => settings.trace = true,
            "--count" => settings.count = Some(number("--count")?),
            "--list" => settings.list = true,
            "--help" | "-h" => return Ok(None),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    Ok(Some(settings))
}

fn main() -> ExitCode {
    let settings = match parse_args() {
        Ok(Some(settings)) => settings,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(message) => {
            eprintln!("cairn-repair-sweep: {message}");
            return ExitCode::from(2);
        }
    };
    let started = Instant::now();
    let base = match build_base() {
        Ok(base) => Arc::new(base),
        Err(error) => {
            eprintln!("cairn-repair-sweep: {error}");
            return ExitCode::from(2);
        }
    };
    let mut units = select_units(&base);
    if let Some(kind) = &settings.kind {
        units.retain(|u| u.kind.name().contains(kind.as_str()));
    }
    let mut cases = cases(&base, &units, settings.full, settings.stride);
    cases.drain(..settings.from.min(cases.len()));
    if let Some(count) = settings.count {
        cases.truncate(count);
    }
    if settings.list {
        for (index, case) in cases.iter().enumerate() {
            let unit = &units[case.unit].label;
            println!("case {}: {unit}, {}", settings.from + index, case.damage);
        }
        return ExitCode::SUCCESS;
    }
    if settings.trace {
        for (index, case) in cases.iter_mut().enumerate() {
            case.trace = Some(format!(
                "case {}: {}",
                settings.from + index,
                units[case.unit].label
            ));
        }
    }
    eprintln!(
        "{} units, {} cases, {} threads (base image built in {:?})",
        units.len(),
        cases.len(),
        settings.threads,
        started.elapsed()
    );
    let total = cases.len();
    let progress = |done: usize, failed: Option<String>| {
        if let Some(failed) = failed {
            eprintln!("FAILED {failed}");
        }
        if done.is_multiple_of(500) {
            eprintln!("{done} of {total} cases ({:?})", started.elapsed());
        }
    };
    let tally = match sweep(&base, &units, &cases, settings.threads, &progress) {
        Ok(tally) => tally,
        Err(error) => {
            eprintln!("cairn-repair-sweep: {error}");
            return ExitCode::from(2);
        }
    };
    for (unit, damage, failures) in &tally.failures {
        println!("FAILED {unit}, {damage}: {}", failures.join("; "));
    }
    print!("{}", tally.table());
    println!(
        "{} cases, {} failed, {:?}",
        tally.cases(),
        tally.failures.len(),
        started.elapsed()
    );
    if tally.failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
