//! The runs the tests and the binary share: crash exploration over generated workloads, fault
//! injection, image fuzzing and the out-of-space rounds, each returning counts and violations.

use crate::explore::{ExploreConfig, base_image, explore};
use crate::faults::{Fault, run_with_fault, run_with_read_fault};
use crate::fuzz::{apply_mutation, metadata_units, populated_image, random_mutation, run_case};
use crate::image::{self, CRASH_DEVICE_BYTES};
use crate::op::{Op, setup_ops};
use crate::workload::{Rng, Workload};
use crate::{CrashError, Violation};

/// Counts of one run and every violation it found.
#[derive(Debug, Default)]
pub struct Tally {
    pub workloads: u64,
    pub crash_states: u64,
    pub fuzzed_images: u64,
    pub faults_injected: u64,
    pub fill_rounds: u64,
    pub violations: Vec<Violation>,
}

impl Tally {
    pub fn summary(&self) -> String {
        format!(
            "workloads {}, crash states {}, fuzzed images {}, faults injected {}, \
             fill rounds {}, violations {}",
            self.workloads,
            self.crash_states,
            self.fuzzed_images,
            self.faults_injected,
            self.fill_rounds,
            self.violations.len()
        )
    }
}

fn violation(workload: &str, point: String, problems: Vec<String>) -> Violation {
    Violation {
        workload: workload.to_string(),
        point,
        problems,
    }
}

/// Explores every workload of `workloads` (after the standard setup).
pub fn crash_run(workloads: &[Workload], config: &ExploreConfig) -> Result<Tally, CrashError> {
    crash_run_after(&setup_ops(), workloads, config)
}

/// Explores every workload of `workloads` after `setup` (which is not crash-tested).
pub fn crash_run_after(
    setup: &[Op],
    workloads: &[Workload],
    config: &ExploreConfig,
) -> Result<Tally, CrashError> {
    let base = base_image(CRASH_DEVICE_BYTES)?;
    let mut tally = Tally::default();
    for workload in workloads {
        tally.workloads += 1;
        match explore(&workload.name, &base, setup, &workload.ops, config) {
            Ok(outcome) => {
                tally.crash_states += outcome.crash_states;
                tally.violations.extend(outcome.violations);
            }
            Err(error) => tally.violations.push(violation(
                &workload.name,
                "live run".into(),
                vec![error.to_string()],
            )),
        }
    }
    Ok(tally)
}

/// Runs `workload` once per fault: the n-th write failing and the device stopping after n
/// writes for n in `1..=writes_max` stepping by `stride`, and a failed flush.
pub fn fault_run(workload: &Workload, writes_max: u64, stride: u64) -> Result<Tally, CrashError> {
    let base = base_image(CRASH_DEVICE_BYTES)?;
    let mut tally = Tally::default();
    let mut faults = vec![Fault::FailFlush];
    for n in (1..=writes_max).step_by(stride.max(1) as usize) {
        faults.push(Fault::FailWrite(n));
        faults.push(Fault::StopAfter(n));
    }
    for fault in faults {
        let outcome = run_with_fault(&base, &setup_ops(), &workload.ops, fault);
        tally.faults_injected += u64::from(outcome.fired);
        if !outcome.problems.is_empty() {
            tally.violations.push(violation(
                &workload.name,
                format!("{fault:?}"),
                outcome.problems,
            ));
        }
    }
    Ok(tally)
}

/// Mounts a populated image with reads failing in each of `count` metadata blocks.
pub fn read_fault_run(count: usize, seed: u64) -> Result<Tally, CrashError> {
    let populated = populated_image(seed)?;
    let block = 4096;
    let units = metadata_units(&populated, block, 512);
    let mut tally = Tally::default();
    let mut rng = Rng(seed);
    for _ in 0..count.min(units.len()) {
        let unit = units[rng.below(units.len() as u64) as usize];
        let start = (unit.offset / block * block) as u64;
        tally.faults_injected += 1;
        let problems = run_with_read_fault(&populated, start..start + block as u64);
        if !problems.is_empty() {
            tally.violations.push(violation(
                "read faults",
                format!("block at {start}"),
                problems,
            ));
        }
    }
    Ok(tally)
}

/// Mutates `count` copies of a populated image, one metadata unit each, and runs each case.
pub fn fuzz_run(count: u64, seed: u64) -> Result<Tally, CrashError> {
    let populated = populated_image(seed)?;
    let block = 4096;
    let units = metadata_units(&populated, block, 512);
    if units.is_empty() {
        return Err(CrashError::Setup("no metadata units found".into()));
    }
    let mut tally = Tally::default();
    let mut rng = Rng(seed ^ 0xF022);
    for _ in 0..count {
        let unit = units[rng.below(units.len() as u64) as usize];
        let mutation = random_mutation(&mut rng, &unit, &populated);
        let mut image = populated.clone();
        apply_mutation(&mut image, &unit, mutation, block);
        tally.fuzzed_images += 1;
        if let Some(problem) = run_case(image).violation {
            let point = format!("{:?} at {} {mutation:?}", unit.kind, unit.offset);
            tally
                .violations
                .push(violation("fuzz", point, vec![problem]));
        }
    }
    Ok(tally)
}

/// Fills a fresh filesystem with `writers` threads, checks, empties, fills again.
pub fn space_run(writers: u64, rounds: u64) -> Result<Tally, CrashError> {
    space_run_with(writers, rounds, 0)
}

/// `space_run` on mounts with write-behind holding up to `data_cache` bytes (0: off): a
/// full filesystem must be reported by the write calls, and every write fsynced after
/// them must read back.
pub fn space_run_with(writers: u64, rounds: u64, data_cache: u64) -> Result<Tally, CrashError> {
    let device = std::sync::Arc::new(image::formatted_device(CRASH_DEVICE_BYTES)?);
    device.set_recording(false);
    let choice = image::WorkloadMount {
        data_cache,
        ..Default::default()
    };
    let mounted = image::mount_with(&device, choice);
    let mut fs = Some(mounted.map_err(|e| CrashError::Setup(e.to_string()))?);
    let free_before = fs
        .as_ref()
        .map(|fs| fs.statfs().map(|stat| stat.blocks_free))
        .transpose()
        .map_err(|e| CrashError::Setup(e.to_string()))?
        .unwrap_or(0);
    let mut tally = Tally::default();
    for round in 0..rounds {
        let Some(current) = fs.take() else { break };
        let (outcome, remounted) =
            crate::space::fill_round(&device, current, writers, 256 << 10, data_cache);
        tally.fill_rounds += 1;
        let mut problems = outcome.problems;
        if outcome.enospc_seen == 0 {
            problems.push("the filesystem never reported it was full".into());
        }
        if let Some(current) = &remounted {
            problems.extend(crate::space::empty_round(current, free_before));
        }
        if !problems.is_empty() {
            let point = format!("round {round}, data cache {data_cache}");
            tally.violations.push(violation("fill", point, problems));
        }
        fs = remounted;
    }
    if let Some(fs) = fs {
        fs.unmount().map_err(|e| CrashError::Setup(e.to_string()))?;
        if let Err(error) = image::fsck(device.as_ref()) {
            tally.violations.push(violation(
                "fill",
                "final fsck".into(),
                vec![error.to_string()],
            ));
        }
    }
    Ok(tally)
}

/// `space::reserve_round` on a fresh filesystem with write-behind cap `data_cache`, once
/// per kind of hog, each followed by unmount and fsck.
pub fn reserve_run(data_cache: u64) -> Result<Tally, CrashError> {
    let mut tally = Tally::default();
    for hog in [
        crate::space::Hog::Attributes,
        crate::space::Hog::LargeWrites,
    ] {
        let device = std::sync::Arc::new(image::formatted_device(CRASH_DEVICE_BYTES)?);
        device.set_recording(false);
        let choice = image::WorkloadMount {
            data_cache,
            ..Default::default()
        };
        let fs =
            image::mount_with(&device, choice).map_err(|e| CrashError::Setup(e.to_string()))?;
        let mut problems = crate::space::reserve_round(&fs, 256 << 10, hog);
        if let Err(error) = fs.unmount() {
            problems.push(format!("unmount: {error}"));
        }
        if let Err(error) = image::fsck(device.as_ref()) {
            problems.push(format!("fsck: {error}"));
        }
        tally.fill_rounds += 1;
        if !problems.is_empty() {
            let point = format!("{hog:?}, data cache {data_cache}");
            tally
                .violations
                .push(violation("reservations against a hog", point, problems));
        }
    }
    Ok(tally)
}

/// Adds `other`'s counts and violations to `tally`.
pub fn merge(tally: &mut Tally, other: Tally) {
    tally.workloads += other.workloads;
    tally.crash_states += other.crash_states;
    tally.fuzzed_images += other.fuzzed_images;
    tally.faults_injected += other.faults_injected;
    tally.fill_rounds += other.fill_rounds;
    tally.violations.extend(other.violations);
}
