//! The log and LSNs: the log must be clean (nothing left to replay), and no metadata block or
//! inode may carry an LSN later than the newest record in the log, which would mean the block
//! was written by a checkpoint the log never held (or its header is damaged).

use cairn_blockdev::AlignedBuf;
use cairn_format::header::{block_crc, block_lsn};
use cairn_format::log::{
    LOG_FLAG_UNMOUNT, LOG_RECORD_HEADER_BYTES, LogRecordHeader, decode_log_items,
    decode_log_record, log_header_crc,
};
use cairn_format::ondisk::get_u32;
use cairn_format::{FsBlock, Lsn, MetaKind, OnDisk};
use cairn_journal::Journal;

use crate::check::Checker;
use crate::report::Problem;

/// Log blocks read at a time while looking for the newest record.
const LOG_READ_BLOCKS: u64 = 256;

/// An LSN as administrators read it: cycle and log block.
pub(crate) fn show_lsn(lsn: Lsn) -> String {
    format!("{}/{}", lsn.cycle(), lsn.block())
}

impl Checker<'_> {
    /// Reports a log that needs recovery and records the newest LSN the log holds.
    pub(crate) fn check_log(&mut self) {
        let at = Some(self.geometry.log_start);
        match Journal::needs_recovery(self.device, &self.superblock) {
            Ok(false) => {
                if let Some(fault) = self.head_record_fault() {
                    self.report.add(Problem::new("log", at, fault));
                }
            }
            Ok(true) => {
                let message = "the log holds checkpoints that were never replayed: mount the \
                               filesystem once to replay them, then check again";
                self.report.add(Problem::new("log", at, message));
                self.check_log_items();
            }
            Err(err) => {
                let message = format!("cannot be read: {err}");
                self.report.add(Problem::new("log", at, message));
            }
        }
        self.lsn_limit = self.newest_log_lsn();
    }

    /// The highest LSN of any record in the log whose header verifies and names this
    /// filesystem; zero for an empty log.
    pub(crate) fn newest_log_lsn(&mut self) -> Lsn {
        self.newest_log_record().map_or(Lsn::ZERO, |(lsn, _)| lsn)
    }

    /// Why a log that needs no replay (as `Journal::needs_recovery` found) could not be
    /// opened by recovery, if it could not: its newest record is not a clean unmount record
    /// yet no record sits at the tail it names (recovery would start a log from a tail that
    /// is not there), or its items do not decode (recovery decodes the items of every record
    /// it walks that has any, the unmount record included).
    pub(crate) fn head_record_fault(&mut self) -> Option<String> {
        let (lsn, block) = self.newest_log_record()?;
        let block_size = u64::from(self.geometry.block_size);
        let at = FsBlock(self.geometry.log_start + block);
        let head = self.read_log(at, 1)?;
        let header = LogRecordHeader::decode(&head[..LOG_RECORD_HEADER_BYTES]).ok()?;
        if header.flags & LOG_FLAG_UNMOUNT == 0 || header.tail_lsn != header.lsn {
            return Some(format!(
                "record {} (the newest) names tail {}, where no record is: the log cannot be \
                 replayed; fsck.cairn -y discards it",
                show_lsn(lsn),
                show_lsn(header.tail_lsn)
            ));
        }
        if header.op_count == 0 {
            return None;
        }
        let bytes = LOG_RECORD_HEADER_BYTES as u64 + u64::from(header.payload_bytes);
        let blocks = bytes.div_ceil(block_size);
        let room = u64::from(self.geometry.log_blocks) - block;
        let why = match self.read_log(at, blocks.min(room)) {
            Some(raw) => decode_log_record(&raw)
                .and_then(|(header, payload)| decode_log_items(payload, header.op_count))
                .err()?
                .to_string(),
            None => "it cannot be read".to_string(),
        };
        Some(format!(
            "record {} (the newest) holds items that do not decode ({why}): the log cannot be \
             replayed; fsck.cairn -y discards it",
            show_lsn(lsn)
        ))
    }

    /// `count` log blocks from `at`, or `None` if they cannot be read.
    fn read_log(&self, at: FsBlock, count: u64) -> Option<Vec<u8>> {
        let mut buf = AlignedBuf::zeroed((count * u64::from(self.geometry.block_size)) as usize);
        self.device
            .read_at(self.geometry.byte_offset(at), &mut buf)
            .ok()?;
        Some(buf.to_vec())
    }

    /// The newest record of the log (whose header verifies and names this filesystem): its
    /// LSN and the log block it starts at.
    fn newest_log_record(&mut self) -> Option<(Lsn, u64)> {
        let block_size = u64::from(self.geometry.block_size);
        let log_blocks = u64::from(self.geometry.log_blocks);
        let mut newest: Option<(Lsn, u64)> = None;
        let mut first = 0;
        while first < log_blocks {
            let count = LOG_READ_BLOCKS.min(log_blocks - first);
            let mut buf = AlignedBuf::zeroed((count * block_size) as usize);
            let offset = self
                .geometry
                .byte_offset(FsBlock(self.geometry.log_start + first));
            if self.device.read_at(offset, &mut buf).is_err() {
                // `check_log` has reported an unreadable log already.
                return newest;
            }
            for (index, sector) in buf.chunks_exact(block_size as usize).enumerate() {
                if let Some(lsn) = self.record_lsn(sector)
                    && newest.is_none_or(|(best, _)| lsn > best)
                {
                    newest = Some((lsn, first + index as u64));
                }
            }
            first += count;
        }
        newest
    }

    /// Reports the first log record whose header and payload verify but whose items do not
    /// decode: replay would fail on it (a torn write fails a CRC instead, so this is damage).
    fn check_log_items(&mut self) {
        let block_size = self.geometry.block_size as usize;
        let log_bytes = u64::from(self.geometry.log_blocks) * block_size as u64;
        let mut log = AlignedBuf::zeroed(log_bytes as usize);
        let start = self.geometry.byte_offset(FsBlock(self.geometry.log_start));
        if self.device.read_at(start, &mut log).is_err() {
            return;
        }
        let mut at = 0;
        while at < log.len() {
            let Ok((header, payload)) = decode_log_record(&log[at..]) else {
                at += block_size;
                continue;
            };
            if header.uuid == self.uuid
                && let Err(err) = decode_log_items(payload, header.op_count)
            {
                let message = format!(
                    "record {} holds items that do not decode ({err}): the log cannot be \
                     replayed; fsck.cairn -y discards it",
                    show_lsn(header.lsn)
                );
                let block = self.geometry.log_start + (at / block_size) as u64;
                self.report.add(Problem::new("log", Some(block), message));
                return;
            }
            let record = LOG_RECORD_HEADER_BYTES + header.payload_bytes as usize;
            at += record.next_multiple_of(block_size);
        }
    }

    fn record_lsn(&self, block: &[u8]) -> Option<Lsn> {
        let sector = block.get(..LOG_RECORD_HEADER_BYTES)?;
        let header = LogRecordHeader::decode(sector).ok()?;
        let valid = header.uuid == self.uuid && header.header_crc == log_header_crc(sector);
        valid.then_some(header.lsn)
    }

    /// Checks the header LSN of every metadata block (or inode, in chunk reads) in `buf`
    /// (the first late one is reported; repair notes every one it can set back).
    pub(crate) fn check_lsns(&mut self, at: FsBlock, what: &str, buf: &[u8]) {
        let block_size = self.geometry.block_size as usize;
        let stride = if what == MetaKind::Inode.name() {
            self.geometry.inode_size as usize
        } else {
            block_size
        };
        let mut reported = false;
        for (index, piece) in buf.chunks_exact(stride).enumerate() {
            if MetaKind::from_magic(get_u32(piece, 0)).is_none() {
                continue;
            }
            let Some(lsn) = block_lsn(piece) else {
                continue;
            };
            if lsn <= self.lsn_limit {
                continue;
            }
            let block = at.0 + (index * stride / block_size) as u64;
            // Repair sets the LSN back when the piece's CRC covers it (the LSN itself is the
            // damage); a piece that does not verify is repaired or dropped whole.
            if self.repairing && get_u32(piece, 4) == block_crc(piece) {
                let offset = (index * stride) % block_size;
                self.findings.future_lsns.push((block, offset, stride));
            }
            if !reported {
                let message = format!(
                    "LSN {} is later than the newest log record ({})",
                    show_lsn(lsn),
                    show_lsn(self.lsn_limit)
                );
                self.report.add(Problem::new(what, Some(block), message));
                reported = true;
            }
        }
    }
}
