//! Crash tests on the memory device: random transaction sequences with forces and AIL pushes,
//! crashed at flush points and random points between them (unflushed writes dropped, kept or
//! torn). After recovery the test blocks must equal the state after some prefix of the
//! commits, and that prefix must include everything a completed force covered.
//! `JOURNAL_CRASH_POINTS` sets how many crash points each sequence checks (default 12; the
//! full run uses every enumerated point: `JOURNAL_CRASH_POINTS=all`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use cairn_format::HEADER_SIZE;
use cairn_journal::{LogMode, Reservation};
use common::*;

const BLOCKS: u64 = 6;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }
}

fn points_per_sequence() -> Option<usize> {
    match std::env::var("JOURNAL_CRASH_POINTS") {
        Ok(value) if value == "all" => None,
        Ok(value) => value.parse().ok(),
        Err(_) => Some(12),
    }
}

fn run_sequence(seed: u64, mode: LogMode) {
    run_sequence_ordering(seed, mode, false);
}

/// With `orders_no_data`, every transaction says it orders no earlier device write, so its
/// checkpoints flush only after their commit records: crash points then include commit
/// records on the disk without their data records.
fn run_sequence_ordering(seed: u64, mode: LogMode, orders_no_data: bool) {
    let (device, sb) = make_fs(64 << 20, Some(1 << 20));
    let (journal, _) = open(&device, &sb, quiet(mode));
    let g = sb.geometry;
    let body = g.block_size as usize - HEADER_SIZE;
    let mut rng = Rng(seed);
    let mut state = vec![vec![0u8; body]; BLOCKS as usize];
    let mut tx = journal
        .begin(Reservation::for_items(&g, 6, g.block_size, 0, 0))
        .unwrap();
    for index in 0..BLOCKS {
        create_block(&mut tx, &sb, index, 0);
    }
    tx.commit().unwrap();
    let mut states = vec![state.clone()];
    // (commit count covered, flushes completed when the force returned)
    let mut forced: Vec<(usize, usize)> = Vec::new();
    for _ in 0..40 {
        let mut tx = journal
            .begin(Reservation::for_items(&g, 3, g.block_size, 0, 0))
            .unwrap();
        for _ in 0..1 + rng.below(3) {
            let index = rng.below(BLOCKS);
            let offset = rng.below(body as u64 - 64) as usize;
            let value = rng.next() as u8;
            let len = 1 + rng.below(64) as usize;
            let guard = tx.get_buf(test_block(&sb, index), &spec()).unwrap();
            guard
                .bytes_mut(HEADER_SIZE + offset..HEADER_SIZE + offset + len)
                .unwrap()
                .fill(value);
            state[index as usize][offset..offset + len].fill(value);
        }
        if orders_no_data {
            tx.orders_no_data();
        }
        let sequence = tx.commit().unwrap();
        states.push(state.clone());
        match rng.below(8) {
            0 | 1 => {
                journal.force(sequence).unwrap();
                forced.push((states.len() - 1, device.flush_count()));
            }
            2 => journal.push_ail().unwrap(),
            _ => {}
        }
        journal.check_invariants();
    }
    journal.force_all().unwrap();
    forced.push((states.len() - 1, device.flush_count()));
    check_crash_points(&device, &sb, &states, &forced, seed);
}

fn check_crash_points(
    device: &cairn_blockdev::MemDevice,
    sb: &cairn_format::Superblock,
    states: &[Vec<Vec<u8>>],
    forced: &[(usize, usize)],
    seed: u64,
) {
    let all = device.crash_points(2, seed);
    let chosen: Vec<_> = match points_per_sequence() {
        None => all.iter().collect(),
        Some(count) => {
            let step = (all.len() / count.max(1)).max(1);
            all.iter().step_by(step).collect()
        }
    };
    for point in chosen {
        let crashed = std::sync::Arc::new(device.crash_device(point).unwrap());
        let needs = cairn_journal::Journal::needs_recovery(crashed.as_ref(), sb).unwrap();
        let (journal, report) = open(&crashed, sb, quiet(LogMode::Delayed));
        // The windowed check agrees with what recovery (reading the whole log) did.
        assert_eq!(
            needs,
            !report.clean && report.records > 0,
            "{point:?}: {report:?}"
        );
        let recovered: Vec<Vec<u8>> = (0..BLOCKS)
            .map(|index| read_body(crashed.as_ref(), sb, index))
            .collect();
        let required = forced
            .iter()
            .filter(|(_, flushes)| *flushes <= point.flush_index)
            .map(|(commits, _)| *commits)
            .max()
            .unwrap_or(0);
        let fresh = recovered.iter().all(|b| b.iter().all(|&x| x == 0));
        let matches = (required..states.len()).any(|k| states[k] == recovered);
        if !matches {
            let any: Vec<usize> = (0..states.len())
                .filter(|&k| states[k] == recovered)
                .collect();
            let k = states.len() - 1;
            let diff: Vec<(u64, usize)> = (0..BLOCKS)
                .map(|i| {
                    let n = (0..recovered[i as usize].len())
                        .filter(|&j| recovered[i as usize][j] != states[k][i as usize][j])
                        .count();
                    (i, n)
                })
                .collect();
            eprintln!("equal to states {any:?}; diff vs last {diff:?}; forced {forced:?}");
        }
        assert!(
            matches || (required == 0 && fresh),
            "seed {seed}: crash at {point:?} recovered no prefix >= {required}: {report:?}"
        );
        journal.check_invariants();
        drop(journal);
    }
}

// Delayed mode: random sequences crash to a committed prefix covering every completed force.
#[test]
fn delayed_mode_crashes_recover_a_prefix() {
    for seed in 1..=3 {
        run_sequence(seed, LogMode::Delayed);
    }
}

// Checkpoints of transactions that order no data are flushed once, after the commit record,
// so a crash can keep a commit record and lose a data record before it: recovery still
// replays only whole checkpoints, a prefix covering every completed force.
#[test]
fn single_flush_checkpoints_crash_to_a_prefix() {
    for seed in 21..=23 {
        run_sequence_ordering(seed, LogMode::Delayed, true);
    }
}

// Sync mode: the same property, with every commit durable on return.
#[test]
fn sync_mode_crashes_recover_a_prefix() {
    run_sequence(11, LogMode::Sync);
}
