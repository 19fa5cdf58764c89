//! Random interleavings of commits (random changes to random test blocks), forces of recent
//! sequences, checkpoint pushes and AIL pushes on a 1 MiB log with the device's op log on.
//! After every step: `check_invariants`, the order rules read back from the op log (commit
//! records in increasing sequence, each after a flush covering its data records), every
//! forced commit's checkpoint committed, and no checkpoint behind the in-memory tail holding
//! a change whose home copy is older than it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;

use cairn_blockdev::MemDevice;
use cairn_format::{HEADER_SIZE, Lsn, Superblock};
use cairn_journal::{Journal, JournalConfig, LogMode, Reservation};
use common::oplog::{self, Checkpoint};
use common::*;
use proptest::prelude::*;

const BLOCKS: u64 = 5;

#[derive(Debug, Clone)]
enum Op {
    /// Changes `(block, offset, length, value)` in one transaction.
    Commit(Vec<(u64, usize, usize, u8)>),
    /// Logs block `0` whole again (a new buffer), so checkpoints grow and the log wraps.
    Rewrite(u64, u8),
    /// Forces the sequence of the commit this many commits back.
    Force(usize),
    PushCheckpoint,
    PushAil,
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let change = (0..BLOCKS, 0usize..3900, 1usize..120, any::<u8>());
    prop_oneof![
        6 => prop::collection::vec(change, 1..4).prop_map(Op::Commit),
        2 => (0..BLOCKS, any::<u8>()).prop_map(|(b, v)| Op::Rewrite(b, v)),
        2 => (0usize..4).prop_map(Op::Force),
        1 => Just(Op::PushCheckpoint),
        1 => Just(Op::PushAil),
    ]
}

/// The test's model: block bodies after every commit, and the sequence each commit joined.
struct Model {
    states: Vec<Vec<Vec<u8>>>,
    sequences: Vec<u64>,
}

impl Model {
    /// Index of the last commit that went into a checkpoint at or before `sequence`.
    fn last_commit_in(&self, sequence: u64) -> Option<usize> {
        self.sequences.iter().rposition(|&s| s <= sequence)
    }
}

fn apply(journal: &Journal, sb: &Superblock, model: &mut Model, op: &Op) {
    let g = sb.geometry;
    let mut state = model.states.last().unwrap().clone();
    let sequence = match op {
        Op::Commit(changes) => {
            let reservation = Reservation::for_items(&g, 3, g.block_size, 0, 0);
            let mut tx = journal.begin(reservation).unwrap();
            for &(index, offset, length, value) in changes {
                let length = length.min(state[0].len() - offset);
                let guard = tx.get_buf(test_block(sb, index), &spec()).unwrap();
                let at = HEADER_SIZE + offset;
                guard.bytes_mut(at..at + length).unwrap().fill(value);
                state[index as usize][offset..offset + length].fill(value);
            }
            tx.commit().unwrap().0
        }
        Op::Rewrite(index, value) => {
            let reservation = Reservation::for_items(&g, 1, g.block_size, 0, 0);
            let mut tx = journal.begin(reservation).unwrap();
            create_block(&mut tx, sb, *index, *value);
            state[*index as usize].fill(*value);
            tx.commit().unwrap().0
        }
        Op::Force(back) => {
            let index = model.sequences.len().saturating_sub(1 + back);
            journal
                .force(cairn_journal::CommitSequence(model.sequences[index]))
                .unwrap();
            return;
        }
        Op::PushCheckpoint => return journal.push_checkpoint().unwrap(),
        Op::PushAil => return journal.push_ail().unwrap(),
    };
    model.states.push(state);
    model.sequences.push(sequence);
}

/// The op-log and tail checks of one step.
fn check_step(journal: &Journal, device: &MemDevice, sb: &Superblock, model: &Model) {
    journal.check_invariants();
    let (_, tail) = journal.head_and_tail();
    let durable = journal.durable_sequence().0;
    let seen = oplog::records(&device.op_log(), sb);
    let checkpoints = oplog::check_order(&seen, device.flush_count(), false);
    for &sequence in model.sequences.iter().filter(|&&s| s <= durable) {
        assert!(
            checkpoints.contains_key(&sequence),
            "checkpoint {sequence} counted durable without a commit record"
        );
    }
    check_tail(device, sb, model, &checkpoints, tail);
}

/// No committed checkpoint that the tail has passed holds a change to a test block whose home
/// copy is older than that change.
fn check_tail(
    device: &MemDevice,
    sb: &Superblock,
    model: &Model,
    checkpoints: &BTreeMap<u64, Checkpoint>,
    tail: Lsn,
) {
    let homes: Vec<Vec<u8>> = (0..BLOCKS).map(|i| read_body(device, sb, i)).collect();
    for (sequence, checkpoint) in checkpoints {
        if checkpoint.start.is_none_or(|start| start >= tail) {
            continue;
        }
        let Some(first) = model.last_commit_in(*sequence) else {
            continue;
        };
        for index in 0..BLOCKS {
            if !checkpoint.blocks.contains(&test_block(sb, index).block.0) {
                continue;
            }
            let home = &homes[index as usize];
            let current = model.states[first..]
                .iter()
                .any(|state| &state[index as usize] == home);
            assert!(
                current,
                "tail {tail:?} passed checkpoint {sequence} at {:?}, but block {index} is not \
                 written home",
                checkpoint.start
            );
        }
    }
}

fn run(ops: &[Op], config: JournalConfig) {
    let (device, sb) = make_fs(64 << 20, Some(1 << 20));
    let (journal, _) = open(&device, &sb, config);
    let g = sb.geometry;
    let reservation = Reservation::for_items(&g, BLOCKS as u32, g.block_size, 0, 0);
    let mut tx = journal.begin(reservation).unwrap();
    for index in 0..BLOCKS {
        create_block(&mut tx, &sb, index, 0);
    }
    let first = tx.commit().unwrap().0;
    let body = g.block_size as usize - HEADER_SIZE;
    let mut model = Model {
        states: vec![vec![vec![0u8; body]; BLOCKS as usize]],
        sequences: vec![first],
    };
    for op in ops {
        apply(&journal, &sb, &mut model, op);
        check_step(&journal, &device, &sb, &model);
    }
    journal.force_all().unwrap();
    let seen = oplog::records(&device.op_log(), &sb);
    oplog::check_order(&seen, device.flush_count(), true);
    journal.unmount().unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    // Deterministic interleavings (no background thread), both log modes.
    #[test]
    fn interleavings_keep_commit_order_and_tail(
        ops in prop::collection::vec(op_strategy(), 20..90),
        sync in any::<bool>(),
    ) {
        let mode = if sync { LogMode::Sync } else { LogMode::Delayed };
        run(&ops, quiet(mode));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(8))]

    // The same with the background thread pushing (timer at 1 ms, small threshold) meanwhile.
    #[test]
    fn interleavings_with_background_pushes(ops in prop::collection::vec(op_strategy(), 20..60)) {
        let config = JournalConfig {
            checkpoint_interval_ms: 1,
            push_threshold_bytes: Some(16 << 10),
            ..JournalConfig::default()
        };
        run(&ops, config);
    }
}
