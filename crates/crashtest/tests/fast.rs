#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The fast subset (runs in CI): sampled crash exploration, faults, fuzzing and one fill
//! round. Any violation fails (docs/reliability.md lists none open).

use cairn_crashtest::explore::ExploreConfig;
use cairn_crashtest::suite::{self, Tally};
use cairn_crashtest::workload;

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

fn fast_config() -> ExploreConfig {
    ExploreConfig {
        random_per_flush: 2,
        seed: 7,
        extra_points_max: Some(6),
        discard: false,
        data_cache: 0,
        log_sync: false,
    }
}

// Explores a sample of the one-op workloads at every flush point and a few torn/subset points.
#[test]
fn crash_seq1_sample() {
    let workloads: Vec<_> = workload::seq1().into_iter().step_by(6).collect();
    let tally = suite::crash_run(&workloads, &fast_config()).unwrap();
    assert!(tally.crash_states > 0);
    judge("seq1 sample", &tally);
}

// Explores every op template once (its persistence call rotating through the choices), so
// each kind of operation, rename, xattrs and fallocate included, is crash-tested here.
#[test]
fn crash_every_template_once() {
    let all = workload::seq1();
    let mut chosen = Vec::new();
    for (index, template) in workload::op_templates().iter().enumerate() {
        let group: Vec<_> = all
            .iter()
            .filter(|w| w.ops[0].to_string() == template.to_string())
            .collect();
        assert!(!group.is_empty(), "template {template} gives no workload");
        chosen.push(group[index % group.len()].clone());
    }
    let tally = suite::crash_run(&chosen, &fast_config()).unwrap();
    judge("every template once", &tally);
}

// The same templates on a mount with online discard, and a random workload: a discard may
// only zero blocks whose free is durable and that nothing has taken again, so every crash
// state still recovers to an allowed state with fsck clean.
#[test]
fn crash_with_online_discard() {
    let all = workload::seq1();
    let mut chosen: Vec<_> = all.iter().step_by(7).cloned().collect();
    chosen.push(workload::random(3, 30));
    let config = ExploreConfig {
        discard: true,
        ..fast_config()
    };
    let tally = suite::crash_run(&chosen, &config).unwrap();
    assert!(tally.crash_states > 0);
    judge("online discard", &tally);
}

// Explores a sample of the two-op workloads and one random workload.
#[test]
fn crash_seq2_and_random_sample() {
    let mut workloads: Vec<_> = workload::seq2().into_iter().step_by(250).collect();
    workloads.push(workload::random(11, 12));
    let tally = suite::crash_run(&workloads, &fast_config()).unwrap();
    judge("seq2 and random sample", &tally);
}

// Explores the attribute index workloads (a file with 300 attributes: leaves and an index
// tree): changes, removals, remote values and an unlink freeing them in steps.
#[test]
fn crash_xattr_index() {
    let workloads: Vec<_> = workload::xattr_index().into_iter().step_by(2).collect();
    assert!(workloads.len() >= 7);
    let setup = cairn_crashtest::op::xattr_setup_ops();
    let tally = suite::crash_run_after(&setup, &workloads, &fast_config()).unwrap();
    assert!(tally.crash_states > 0);
    judge("xattr index", &tally);
}

// Explores the reflink workloads (copy_file_range sharing blocks, then each side changed,
// unlinked, truncated or punched; sampled) and a random workload a third of whose ops are
// clones, and injects faults into a clone followed by writes to both sides.
#[test]
fn crash_reflink() {
    let mut workloads: Vec<_> = workload::reflink().into_iter().step_by(3).collect();
    assert!(workloads.len() >= 20);
    workloads.push(workload::random_reflink(1, 16));
    let tally = suite::crash_run(&workloads, &fast_config()).unwrap();
    assert!(tally.crash_states > 0);
    judge("reflink", &tally);
    let clone_then_writes = workload::reflink()
        .into_iter()
        .find(|w| w.name.contains("write(copy, 4096") && w.name.ends_with("sync"))
        .unwrap();
    let tally = suite::fault_run(&clone_then_writes, 16, 1).unwrap();
    assert!(tally.faults_injected > 0);
    judge("reflink faults", &tally);
}

// Injects write failures, a stopped device and a failed flush into a random workload.
#[test]
fn faults_sample() {
    let mut tally = suite::fault_run(&workload::random(5, 10), 60, 12).unwrap();
    suite::merge(&mut tally, suite::read_fault_run(4, 3).unwrap());
    assert!(tally.faults_injected > 0);
    judge("faults", &tally);
}

// Mounts, walks and fscks a few dozen images with one damaged metadata unit each.
#[test]
fn fuzz_sample() {
    let tally = suite::fuzz_run(24, 1).unwrap();
    judge("fuzz", &tally);
}

// Fills the filesystem to 100% from one writer, checks, deletes, fills again.
#[test]
fn fill_to_full_twice() {
    let tally = suite::space_run(1, 2).unwrap();
    judge("fill", &tally);
}

// Fills the filesystem from three writers at once, one round (the writers used to deadlock
// near full: an allocator AG state mutex against an AGF buffer lock; docs/reliability.md).
// A watchdog ends the process instead of letting a deadlock hang CI.
#[test]
fn regression_fill_many_writers_no_deadlock() {
    const WATCHDOG: std::time::Duration = std::time::Duration::from_secs(600);
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let tally = suite::space_run(3, 1);
        let _ = done_tx.send(tally);
    });
    let Ok(tally) = done_rx.recv_timeout(WATCHDOG) else {
        eprintln!("deadlock: three writers did not finish filling the filesystem");
        std::process::exit(101);
    };
    judge("fill, three writers", &tally.unwrap());
}

// The collapse and insert workloads on a tree-mapped file, with every transaction durable at
// its commit (`logmode=sync`: crash points between a shift's steps, where recovery must
// finish it) and with the default log; the oracle holds the file to one whole version.
#[test]
fn crash_collapse_and_insert() {
    let workloads = workload::shift();
    assert!(workloads.len() >= 8);
    let setup = cairn_crashtest::op::shift_setup_ops();
    let log_sync: Vec<_> = workloads.iter().step_by(2).cloned().collect();
    let config = ExploreConfig {
        log_sync: true,
        ..fast_config()
    };
    let tally = suite::crash_run_after(&setup, &log_sync, &config).unwrap();
    assert!(tally.crash_states > 0);
    judge("collapse and insert, sync log", &tally);
    let delayed: Vec<_> = workloads.iter().skip(1).step_by(3).cloned().collect();
    let tally = suite::crash_run_after(&setup, &delayed, &fast_config()).unwrap();
    judge("collapse and insert", &tally);
}

// O_TMPFILE then linkat (crash points before the link find an unnamed file on the
// unlinked list, after it the named file) and whiteout renames, every persistence call.
#[test]
fn crash_tmpfile_and_whiteouts() {
    let wanted = |w: &&workload::Workload| {
        let first = w.ops[0].to_string();
        first.starts_with("tmpfile") || first.contains("whiteout")
    };
    let workloads: Vec<_> = workload::seq1().iter().filter(wanted).cloned().collect();
    assert!(workloads.len() >= 20, "{} workloads", workloads.len());
    let tally = suite::crash_run(&workloads, &fast_config()).unwrap();
    judge("tmpfile and whiteouts", &tally);
    let config = ExploreConfig {
        log_sync: true,
        ..fast_config()
    };
    let sample: Vec<_> = workloads.iter().step_by(4).cloned().collect();
    let tally = suite::crash_run(&sample, &config).unwrap();
    judge("tmpfile and whiteouts, sync log", &tally);
}
