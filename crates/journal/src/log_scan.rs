//! Whether the log needs replay, decided by reading it through a bounded window: the log can
//! be hundreds of MiB, and a check (fsck, a read-only mount) must not hold it all at once.
//! The decision is recovery's: the same record rule (`recovery::record_here`), the newest
//! record, and the walk from its tail, of which only the first two steps matter here.

use cairn_blockdev::{AlignedBuf, BlockDevice};
use cairn_format::log::{
    LOG_FLAG_UNMOUNT, LOG_RECORD_HEADER_BYTES, LogItem, LogRecordHeader, decode_log_items,
    decode_log_record, log_header_crc,
};
use cairn_format::{Lsn, OnDisk};

use crate::JournalError;
use crate::recovery::record_here;
use crate::writer::{Layout, Position};

/// Bytes of log read at a time (a record larger than this is read whole); at most an eighth
/// of the log, so that small logs are read in pieces too and tests meet the window's edges.
const WINDOW_BYTES: u64 = 4 << 20;

/// Whether the log holds checkpoints recovery would replay: false for an empty log and for
/// a log whose only record is a clean unmount record. Reads the log and changes nothing.
pub(crate) fn needs_replay(
    device: &dyn BlockDevice,
    layout: &Layout,
) -> Result<bool, JournalError> {
    let mut window = LogWindow::new(device, layout);
    let Some(newest) = window.newest_record()? else {
        return Ok(false);
    };
    let clean_unmount = newest.flags & LOG_FLAG_UNMOUNT != 0 && newest.tail_lsn == newest.lsn;
    if !clean_unmount {
        // Recovery walks from the tail: it replays something if a record starts there.
        return window.record_named(layout.position(newest.tail_lsn), None);
    }
    // The walk starts at the unmount record itself; the log is dirty if a record follows it.
    let next = layout.advance(
        layout.position(newest.lsn),
        layout.record_blocks(u64::from(newest.payload_bytes)),
    );
    window.record_named(next, Some(newest.lsn))
}

/// Log blocks `first..first + held` read from the device: the only part of the log a check
/// or a recovery holds at a time (plus one record larger than the window).
pub(crate) struct LogWindow<'d> {
    device: &'d dyn BlockDevice,
    layout: &'d Layout,
    first: u64,
    held: u64,
    buf: AlignedBuf,
}

impl<'d> LogWindow<'d> {
    pub(crate) fn new(device: &'d dyn BlockDevice, layout: &'d Layout) -> Self {
        Self {
            device,
            layout,
            first: 0,
            held: 0,
            buf: AlignedBuf::zeroed(0),
        }
    }

    /// The valid record with the highest LSN (found as `recovery` finds it).
    pub(crate) fn newest_record(&mut self) -> Result<Option<LogRecordHeader>, JournalError> {
        let mut newest: Option<LogRecordHeader> = None;
        let mut at = 0;
        while at < self.layout.log_blocks {
            match self.record_at(at)? {
                Some(header) => {
                    let blocks = self.layout.record_blocks(u64::from(header.payload_bytes));
                    if newest.as_ref().is_none_or(|n| header.lsn > n.lsn) {
                        newest = Some(header);
                    }
                    at += blocks.max(1);
                }
                None => at += 1,
            }
        }
        Ok(newest)
    }

    /// Whether a valid record sits at `place`, carrying the LSN of that place and (if given)
    /// naming `prev` as its predecessor.
    fn record_named(&mut self, place: Position, prev: Option<Lsn>) -> Result<bool, JournalError> {
        let Some(header) = self.record_at(place.block)? else {
            return Ok(false);
        };
        let follows = prev.is_none_or(|prev| header.prev_lsn == prev);
        Ok(header.lsn == self.layout.lsn(place) && follows)
    }

    /// The record at log block `at` if it is valid (see `recovery::record_here`).
    pub(crate) fn record_at(&mut self, at: u64) -> Result<Option<LogRecordHeader>, JournalError> {
        self.hold(at, 1)?;
        let raw = self.bytes(at);
        let head = &raw[..LOG_RECORD_HEADER_BYTES];
        // Size the read by a header whose own CRC holds: garbage must not size it.
        let Ok(header) = LogRecordHeader::decode(head) else {
            return Ok(None);
        };
        if header.header_crc != log_header_crc(head) {
            return Ok(None);
        }
        let blocks = self.layout.record_blocks(u64::from(header.payload_bytes));
        if at + blocks > self.layout.log_blocks {
            return Ok(None);
        }
        self.hold(at, blocks)?;
        Ok(record_here(self.bytes(at), self.layout, at))
    }

    /// The items of the valid record at log block `at` (found before by `record_at`).
    pub(crate) fn items_at(&mut self, at: u64) -> Result<Vec<LogItem>, JournalError> {
        let lsn = self.layout.lsn(Position {
            cycle: 0,
            block: at,
        });
        let corrupt = |why: String| JournalError::CorruptLog { lsn, why };
        let Some(header) = self.record_at(at)? else {
            return Err(corrupt("a record read before no longer verifies".into()));
        };
        let corrupt = |why: String| JournalError::CorruptLog {
            lsn: header.lsn,
            why,
        };
        let (_, payload) = decode_log_record(self.bytes(at)).map_err(|e| corrupt(e.to_string()))?;
        decode_log_items(payload, header.op_count).map_err(|e| corrupt(e.to_string()))
    }

    /// The held bytes from log block `at` on.
    fn bytes(&self, at: u64) -> &[u8] {
        let bs = self.layout.block_size;
        &self.buf[((at - self.first) * bs) as usize..(self.held * bs) as usize]
    }

    /// Makes log blocks `at..at + count` held, reading a window from `at` if they are not.
    fn hold(&mut self, at: u64, count: u64) -> Result<(), JournalError> {
        if at >= self.first && at + count <= self.first + self.held {
            return Ok(());
        }
        let bs = self.layout.block_size;
        let blocks = (WINDOW_BYTES.min(self.layout.log_bytes() / 8) / bs)
            .max(count)
            .min(self.layout.log_blocks - at);
        if self.buf.len() as u64 != blocks * bs {
            self.buf = AlignedBuf::zeroed((blocks * bs) as usize);
        }
        let offset = self.layout.byte_offset(at);
        self.device
            .read_at(offset, &mut self.buf)
            .map_err(|source| JournalError::device("log read", offset, source))?;
        self.first = at;
        self.held = blocks;
        Ok(())
    }
}
