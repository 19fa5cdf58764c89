//! The log writer: positions on the circular log, and checkpoints written as block-aligned
//! records. The commit record is flushed before the checkpoint counts, and the device is
//! flushed between the data records and the commit record too unless no transaction of the
//! checkpoint orders earlier device writes: one or two flushes per checkpoint, never one per
//! log write. The journal issues the flushes outside the writer lock, so a later
//! checkpoint's data records may reach the log between an earlier one's data and its commit
//! record.

use cairn_blockdev::{AlignedBuf, BlockDevice};
use cairn_format::log::{
    LOG_FLAG_COMMIT, LOG_FLAG_UNMOUNT, LogItem, LogRecordHeader, encode_log_record,
};
use cairn_format::{Geometry, Lsn};

use crate::JournalError;
use crate::config::{RECORD_HEADER_BYTES, RECORD_PAYLOAD_BYTES_MAX};
use crate::item::encode_items;

/// Where the log lives and how LSNs map to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    pub(crate) start_byte: u64,
    pub(crate) log_blocks: u64,
    pub(crate) block_size: u64,
    pub(crate) sectors_per_block: u64,
    pub(crate) uuid: [u8; 16],
}

/// A place on the circular log: pass number and block offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Position {
    pub(crate) cycle: u32,
    pub(crate) block: u64,
}

impl Layout {
    pub(crate) fn new(geometry: &Geometry, uuid: [u8; 16]) -> Self {
        Self {
            start_byte: geometry.log_start * u64::from(geometry.block_size),
            log_blocks: u64::from(geometry.log_blocks),
            block_size: u64::from(geometry.block_size),
            sectors_per_block: u64::from(geometry.block_size) / RECORD_HEADER_BYTES,
            uuid,
        }
    }

    pub(crate) fn log_bytes(&self) -> u64 {
        self.log_blocks * self.block_size
    }

    pub(crate) fn lsn(&self, at: Position) -> Lsn {
        Lsn::new(at.cycle, (at.block * self.sectors_per_block) as u32)
    }

    pub(crate) fn position(&self, lsn: Lsn) -> Position {
        Position {
            cycle: lsn.cycle(),
            block: u64::from(lsn.block()) / self.sectors_per_block,
        }
    }

    pub(crate) fn byte_offset(&self, block: u64) -> u64 {
        self.start_byte + block * self.block_size
    }

    /// Blocks from `from` forward to `to` on the circular log (`from <= to`).
    pub(crate) fn distance_blocks(&self, from: Lsn, to: Lsn) -> u64 {
        let (a, b) = (self.position(from), self.position(to));
        let passes = u64::from(b.cycle.saturating_sub(a.cycle));
        (passes * self.log_blocks + b.block).saturating_sub(a.block)
    }

    /// The position `blocks` past `at`.
    pub(crate) fn advance(&self, at: Position, blocks: u64) -> Position {
        let total = at.block + blocks;
        Position {
            cycle: at.cycle + (total / self.log_blocks) as u32,
            block: total % self.log_blocks,
        }
    }

    /// Blocks a record with `payload_bytes` of payload takes.
    pub(crate) fn record_blocks(&self, payload_bytes: u64) -> u64 {
        (RECORD_HEADER_BYTES + payload_bytes).div_ceil(self.block_size)
    }
}

/// What one checkpoint write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Written {
    /// LSN of the checkpoint's first record: the LSN its items carry.
    pub(crate) start: Lsn,
    /// The tail recorded in its records (durable once the commit record is).
    pub(crate) tail: Lsn,
    pub(crate) bytes: u64,
    pub(crate) writes: u64,
    pub(crate) flushes: u64,
}

/// Records being assembled for one contiguous device write.
struct Run {
    start_block: u64,
    bytes: Vec<u8>,
}

/// The writer's state; owned by the journal's writer lock.
#[derive(Debug)]
pub(crate) struct Writer {
    pub(crate) head: Position,
    pub(crate) prev_lsn: Lsn,
    /// Checkpoints write their data records in sequence order; this is the next one.
    pub(crate) next_data_sequence: u64,
    /// Commit records reach the log in sequence order; this is the next one. A checkpoint
    /// passes the turn on once it is complete.
    pub(crate) next_commit_sequence: u64,
}

struct RecordArgs<'a> {
    sequence: u64,
    flags: u32,
    tail: Lsn,
    payload: &'a [u8],
    op_count: u32,
}

impl Writer {
    /// Appends one record at the head; writes the run and wraps when the log end is reached.
    fn emit(
        &mut self,
        device: &dyn BlockDevice,
        layout: &Layout,
        run: &mut Run,
        args: RecordArgs<'_>,
        written: &mut Written,
    ) -> Result<(), JournalError> {
        let lsn = layout.lsn(self.head);
        let header = LogRecordHeader {
            header_crc: 0,
            cycle: self.head.cycle,
            flags: args.flags,
            lsn,
            prev_lsn: self.prev_lsn,
            checkpoint_sequence: args.sequence,
            payload_bytes: 0,
            payload_crc: 0,
            op_count: args.op_count,
            uuid: layout.uuid,
            tail_lsn: args.tail.min(lsn),
        };
        let mut record = encode_log_record(&header, args.payload);
        record.resize(record.len().next_multiple_of(layout.block_size as usize), 0);
        let blocks = record.len() as u64 / layout.block_size;
        debug_assert!(self.head.block + blocks <= layout.log_blocks);
        run.bytes.extend_from_slice(&record);
        self.prev_lsn = lsn;
        self.head.block += blocks;
        if self.head.block == layout.log_blocks {
            write_run(device, layout, run, written)?;
            self.head = Position {
                cycle: self.head.cycle + 1,
                block: 0,
            };
            run.start_block = 0;
        }
        Ok(())
    }

    /// Pads the rest of the log with a filler record and wraps to the next cycle.
    fn wrap(
        &mut self,
        device: &dyn BlockDevice,
        layout: &Layout,
        run: &mut Run,
        sequence: u64,
        tail: Lsn,
        written: &mut Written,
    ) -> Result<(), JournalError> {
        let remaining = layout.log_blocks - self.head.block;
        let payload = vec![0u8; (remaining * layout.block_size - RECORD_HEADER_BYTES) as usize];
        let args = RecordArgs {
            sequence,
            flags: 0,
            tail,
            payload: &payload,
            op_count: 0,
        };
        self.emit(device, layout, run, args, written)
    }

    /// Writes the data records of checkpoint `sequence`: its encoded `items` (each already a
    /// whole item), each record carrying `tail`. No flush: the caller flushes before the
    /// commit record (see `write_commit`).
    pub(crate) fn write_data(
        &mut self,
        device: &dyn BlockDevice,
        layout: &Layout,
        sequence: u64,
        items: &[Vec<u8>],
        tail: Lsn,
    ) -> Result<Written, JournalError> {
        let start = layout.lsn(self.head);
        let mut written = Written {
            start,
            tail: tail.min(start),
            bytes: 0,
            writes: 0,
            flushes: 0,
        };
        let mut run = Run {
            start_block: self.head.block,
            bytes: Vec::new(),
        };
        let mut payload = Vec::new();
        let mut op_count = 0u32;
        for item in items {
            let grown = (payload.len() + item.len()) as u64;
            let too_big = grown > RECORD_PAYLOAD_BYTES_MAX;
            if too_big || self.head.block + layout.record_blocks(grown) > layout.log_blocks {
                if op_count > 0 {
                    let args = RecordArgs {
                        sequence,
                        flags: 0,
                        tail,
                        payload: &payload,
                        op_count,
                    };
                    self.emit(device, layout, &mut run, args, &mut written)?;
                    payload.clear();
                    op_count = 0;
                }
                let alone = layout.record_blocks(item.len() as u64);
                if self.head.block + alone > layout.log_blocks {
                    self.wrap(device, layout, &mut run, sequence, tail, &mut written)?;
                }
            }
            payload.extend_from_slice(item);
            op_count += 1;
        }
        if op_count > 0 {
            let args = RecordArgs {
                sequence,
                flags: 0,
                tail,
                payload: &payload,
                op_count,
            };
            self.emit(device, layout, &mut run, args, &mut written)?;
        }
        write_run(device, layout, &mut run, &mut written)?;
        Ok(written)
    }

    /// Writes the one-block commit record of checkpoint `sequence` at the head, carrying
    /// `tail`. The caller flushed the checkpoint's data records before (a commit record may
    /// only claim durable records) and flushes the commit record after.
    pub(crate) fn write_commit(
        &mut self,
        device: &dyn BlockDevice,
        layout: &Layout,
        sequence: u64,
        tail: Lsn,
        written: &mut Written,
    ) -> Result<(), JournalError> {
        let mut payload = Vec::new();
        encode_items(&[LogItem::CheckpointCommit { sequence }], &mut payload)?;
        let mut run = Run {
            start_block: self.head.block,
            bytes: Vec::new(),
        };
        let tail = tail.min(written.start);
        written.tail = tail;
        let args = RecordArgs {
            sequence,
            flags: LOG_FLAG_COMMIT,
            tail,
            payload: &payload,
            op_count: 1,
        };
        self.emit(device, layout, &mut run, args, written)?;
        write_run(device, layout, &mut run, written)
    }

    /// Writes an item-less record carrying `tail` (with `unmount`, the clean-unmount mark)
    /// and flushes it. Returns what it wrote.
    pub(crate) fn write_marker(
        &mut self,
        device: &dyn BlockDevice,
        layout: &Layout,
        tail: Option<Lsn>,
        unmount: bool,
    ) -> Result<Written, JournalError> {
        let own = layout.lsn(self.head);
        let tail = tail.map_or(own, |t| t.min(own));
        let mut written = Written {
            start: own,
            tail,
            bytes: 0,
            writes: 0,
            flushes: 0,
        };
        let mut run = Run {
            start_block: self.head.block,
            bytes: Vec::new(),
        };
        let args = RecordArgs {
            sequence: 0,
            flags: if unmount { LOG_FLAG_UNMOUNT } else { 0 },
            tail,
            payload: &[],
            op_count: 0,
        };
        self.emit(device, layout, &mut run, args, &mut written)?;
        write_run(device, layout, &mut run, &mut written)?;
        flush(device, &mut written)?;
        Ok(written)
    }
}

fn write_run(
    device: &dyn BlockDevice,
    layout: &Layout,
    run: &mut Run,
    written: &mut Written,
) -> Result<(), JournalError> {
    if run.bytes.is_empty() {
        return Ok(());
    }
    let offset = layout.byte_offset(run.start_block);
    let buffer = AlignedBuf::from_slice(&run.bytes);
    device
        .write_at(offset, &buffer)
        .map_err(|source| JournalError::device("log write", offset, source))?;
    written.bytes += run.bytes.len() as u64;
    written.writes += 1;
    run.start_block += run.bytes.len() as u64 / layout.block_size;
    run.bytes.clear();
    Ok(())
}

pub(crate) fn flush(device: &dyn BlockDevice, written: &mut Written) -> Result<(), JournalError> {
    device
        .flush()
        .map_err(|source| JournalError::device("log flush", 0, source))?;
    written.flushes += 1;
    Ok(())
}
