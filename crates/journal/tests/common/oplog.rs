//! Reading the log back out of a `MemDevice` op log: which records were written, in which
//! flush epoch, and what the order rules of the journal demand of them.

use std::collections::{BTreeMap, BTreeSet};

use cairn_blockdev::LogOp;
use cairn_format::log::{LOG_FLAG_COMMIT, LogItem, decode_log_items, decode_log_record};
use cairn_format::{Lsn, Superblock};

/// One log record seen in a device write.
#[derive(Debug, Clone)]
pub struct Seen {
    pub lsn: Lsn,
    pub sequence: u64,
    pub commit: bool,
    /// Flushes completed before the write that carried it.
    pub epoch: usize,
    /// Blocks named by its buffer items.
    pub blocks: Vec<u64>,
}

/// Every log record in the writes of `ops` that fall inside the log, in write order.
pub fn records(ops: &[LogOp], superblock: &Superblock) -> Vec<Seen> {
    let geometry = &superblock.geometry;
    let block = u64::from(geometry.block_size);
    let start = geometry.log_start * block;
    let end = start + u64::from(geometry.log_blocks) * block;
    let mut seen = Vec::new();
    let mut epoch = 0;
    for op in ops {
        match op {
            LogOp::Flush => epoch += 1,
            LogOp::Write { offset, data } if *offset >= start && *offset < end => {
                split_records(data, block as usize, epoch, &mut seen);
            }
            LogOp::Write { .. } => {}
        }
    }
    seen
}

/// Decodes the block-aligned records of one log write.
fn split_records(data: &[u8], block: usize, epoch: usize, seen: &mut Vec<Seen>) {
    let mut at = 0;
    while at < data.len() {
        let Ok((header, payload)) = decode_log_record(&data[at..]) else {
            panic!("undecodable log record at byte {at} of a log write");
        };
        let items = decode_log_items(payload, header.op_count).unwrap();
        let blocks = items
            .iter()
            .filter_map(|item| match item {
                LogItem::Buffer { block, .. } => Some(block.0),
                _ => None,
            })
            .collect();
        seen.push(Seen {
            lsn: header.lsn,
            sequence: header.checkpoint_sequence,
            commit: header.flags & LOG_FLAG_COMMIT != 0,
            epoch,
            blocks,
        });
        let bytes = 512 + header.payload_bytes as usize;
        at += bytes.next_multiple_of(block);
    }
}

/// Checks the order rules: commit records in strictly increasing sequence, each written in a
/// later flush epoch than every data record of its checkpoint (a flush covers them), no data
/// record of a checkpoint after its commit record, and a flush after the last commit record
/// once `settled`. Returns each committed checkpoint's start LSN and the blocks it logged.
pub fn check_order(seen: &[Seen], flushes: usize, settled: bool) -> BTreeMap<u64, Checkpoint> {
    let mut checkpoints: BTreeMap<u64, Checkpoint> = BTreeMap::new();
    let mut last_commit: Option<(u64, usize)> = None;
    for record in seen.iter().filter(|r| r.sequence > 0) {
        let entry = checkpoints.entry(record.sequence).or_default();
        if record.commit {
            if let Some((previous, _)) = last_commit {
                assert!(
                    record.sequence > previous,
                    "commit record {} after commit record {previous}",
                    record.sequence
                );
            }
            let data_epoch = entry.last_data_epoch.unwrap_or(0);
            assert!(
                entry.last_data_epoch.is_none() || data_epoch < record.epoch,
                "commit record {} in flush epoch {} with its data (epoch {data_epoch})",
                record.sequence,
                record.epoch
            );
            entry.committed = true;
            last_commit = Some((record.sequence, record.epoch));
        } else {
            assert!(
                !entry.committed,
                "data record of checkpoint {} after its commit record",
                record.sequence
            );
            entry.last_data_epoch = Some(record.epoch);
            entry.start = Some(entry.start.map_or(record.lsn, |s: Lsn| s.min(record.lsn)));
            entry.blocks.extend(record.blocks.iter().copied());
        }
    }
    if let (true, Some((sequence, epoch))) = (settled, last_commit) {
        assert!(flushes > epoch, "commit record {sequence} never flushed");
    }
    checkpoints.retain(|_, c| c.committed);
    checkpoints
}

/// What the op log shows of one checkpoint.
#[derive(Debug, Clone, Default)]
pub struct Checkpoint {
    pub start: Option<Lsn>,
    pub blocks: BTreeSet<u64>,
    pub committed: bool,
    pub last_data_epoch: Option<usize>,
}
