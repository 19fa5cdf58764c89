//! The on-disk log: the record header that opens every log record, and the log items that
//! make up a record's payload.
//!
//! A log record is one header sector (`LOG_RECORD_HEADER_BYTES` = 512 bytes; the header
//! structure below, then zeros) followed by `payload_bytes` of payload, padded with zeros to
//! the next 512-byte boundary. Torn writes are detected by CRC, not by per-sector cycle
//! stamps: a record is valid only if its header CRC and its payload CRC both match. Recovery
//! walks records from the tail; the first record that fails either check (or whose cycle or
//! LSN does not follow) ends the log.
//!
//! Record header (128 bytes, little-endian):
//!
//! | offset | size | field               | meaning                                        |
//! |--------|------|---------------------|------------------------------------------------|
//! | 0      | 4    | magic               | "CLR1", distinct from every metadata magic     |
//! | 4      | 4    | header_crc          | CRC32C of the header sector, this field as 0   |
//! | 8      | 4    | cycle               | pass over the circular log (LSN high half)     |
//! | 12     | 4    | flags               | `LOG_FLAG_COMMIT`, `LOG_FLAG_UNMOUNT`          |
//! | 16     | 8    | lsn                 | this record's LSN (see below)                  |
//! | 24     | 8    | prev_lsn            | LSN of the previous record (0 for the first)   |
//! | 32     | 8    | checkpoint_sequence | checkpoint the payload belongs to              |
//! | 40     | 4    | payload_bytes       | bytes of payload after the header sector       |
//! | 44     | 4    | payload_crc         | CRC32C of those payload bytes                  |
//! | 48     | 4    | op_count            | log items in the payload                       |
//! | 52     | 4    | reserved            | zero                                           |
//! | 56     | 16   | uuid                | filesystem UUID                                |
//! | 72     | 8    | tail_lsn            | log tail when written (recovery starts there)   |
//! | 80     | 48   | spare               | zero                                           |
//!
//! LSN: `(cycle << 32) | offset`, where offset counts 512-byte sectors from the log start.
//! `tail_lsn` is never greater than `lsn`: everything logged before it is already written home.
//!
//! A Buffer item with no regions is a cancel record: the block was freed, and recovery must not
//! replay any earlier image of it. A record with `op_count` 0 is a filler that pads the log to
//! its physical end before the writer wraps to offset 0.
//!
//! Log item (8-byte aligned, packed back to back in the payload): a 16-byte item header
//! (type u16 @0, flags u16 @2, body length u32 @4, object id u64 @8), then the body, padded
//! with zeros to a multiple of 8. Bodies by type:
//!
//! | type | name             | object id | body                                              |
//! |------|------------------|-----------|---------------------------------------------------|
//! | 1    | Buffer           | FsBlock   | count u32, block_bytes u32, regions, region bytes |
//! | 2    | Inode            | inode     | the inode image up to its last non-zero byte      |
//! | 3    | ExtentFreeIntent | intent id | count u32, 4 zero, extents                        |
//! | 4    | ExtentFreeDone   | intent id | same as ExtentFreeIntent                          |
//! | 5    | CheckpointStart  | sequence  | empty                                             |
//! | 6    | CheckpointCommit | sequence  | empty                                             |
//! | 7    | InodeCreate      | FsBlock   | `InodeCreate` (24 bytes)                          |
//! | 10   | RefcountIntent   | intent id | count u32, 4 zero, updates                        |
//! | 11   | RefcountDone     | intent id | count u32 (0), 4 zero                             |
//! | 20   | ShiftIntent      | intent id | `ShiftIntent` (48 bytes)                          |
//! | 21   | ShiftDone        | intent id | empty                                             |
//!
//! An Inode body may stop short of the inode size: the rest of the image is zero (replay
//! zero-fills it), so an inode whose literal area is unused logs little more than its core.
//! An InodeCreate item stands for a new inode cluster logged logically (XFS's icreate): the
//! buffer of `block_bytes` at the block holds `block_bytes / inode_size` free inodes numbered
//! from `first_inode`, all of `generation`. Replay writes those free inodes only where the home
//! copy is not newer (see `docs/journal.md`).
//!
//! Buffer regions: `count` x (offset u32, length u32), sorted, disjoint, non-empty, inside
//! `block_bytes`; then the regions' bytes concatenated in order. Extents: `count` x
//! (FsBlock u64, length u32, 4 zero bytes). Refcount updates (reflink): `count` x (FsBlock
//! u64, length u32, op u8, 3 zero bytes), op 1 Increase (one more file maps the run),
//! 2 Decrease (one file fewer: shared blocks lose a count, the others are freed), 3 Unstage
//! (a copy-on-write's staging run is now in a file map: its staging record goes).
//! InodeCreate: first_inode u64 @0, block_bytes u32
//! @8, inode_size u32 @12, generation u32 @16, 4 zero bytes @20. ShiftIntent (collapse or
//! insert range): inode u64 @0, generation u32 @8, kind u32 @12 (1 collapse, 2 insert),
//! start u64 @16, blocks u64 @24, cursor u64 @32, new_size u64 @40.

use crate::FormatError;
use crate::limits::{
    BLOCK_SIZE_MAX, EXTENT_LEN_MAX, FILE_BLOCK_MAX, FS_BLOCK_MAX, INODE_SIZE_MAX, INODE_SIZE_MIN,
    LOG_INTENT_EXTENTS_MAX, LOG_ITEM_REGIONS_MAX,
};
use crate::ondisk::{
    OnDisk, bad_field, check_zero, get_bytes, get_u16, get_u32, get_u64, need, put_bytes, put_u16,
    put_u32, put_u64,
};
use crate::types::{FsBlock, Lsn, NULL_BLOCK};

/// Bytes of the header sector that opens each log record.
pub const LOG_RECORD_HEADER_BYTES: usize = 512;
/// The log record magic: "CLR1" read as a little-endian `u32`.
pub const LOG_RECORD_MAGIC: u32 = u32::from_le_bytes(*b"CLR1");
/// The record ends a checkpoint (its commit record).
pub const LOG_FLAG_COMMIT: u32 = 1 << 0;
/// The record marks a clean unmount; nothing needs replaying before it.
pub const LOG_FLAG_UNMOUNT: u32 = 1 << 1;
const LOG_FLAGS_KNOWN: u32 = LOG_FLAG_COMMIT | LOG_FLAG_UNMOUNT;
/// Largest payload of one record. A checkpoint may span several records.
pub const LOG_RECORD_PAYLOAD_MAX: u32 = 1 << 24;
const HEADER_CRC_OFFSET: usize = 4;
const ITEM_HEADER_BYTES: usize = 16;

/// The decoded log record header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogRecordHeader {
    pub header_crc: u32,
    pub cycle: u32,
    pub flags: u32,
    pub lsn: Lsn,
    pub prev_lsn: Lsn,
    pub checkpoint_sequence: u64,
    pub payload_bytes: u32,
    pub payload_crc: u32,
    pub op_count: u32,
    pub uuid: [u8; 16],
    pub tail_lsn: Lsn,
}

impl OnDisk for LogRecordHeader {
    const SIZE: usize = 128;
    const NAME: &'static str = "log record header";

    fn encode(&self, out: &mut [u8]) {
        put_u32(out, 0, LOG_RECORD_MAGIC);
        put_u32(out, HEADER_CRC_OFFSET, self.header_crc);
        put_u32(out, 8, self.cycle);
        put_u32(out, 12, self.flags);
        put_u64(out, 16, self.lsn.0);
        put_u64(out, 24, self.prev_lsn.0);
        put_u64(out, 32, self.checkpoint_sequence);
        put_u32(out, 40, self.payload_bytes);
        put_u32(out, 44, self.payload_crc);
        put_u32(out, 48, self.op_count);
        put_u32(out, 52, 0);
        put_bytes(out, 56, &self.uuid);
        put_u64(out, 72, self.tail_lsn.0);
        out[80..Self::SIZE].fill(0);
    }

    fn decode(raw: &[u8]) -> Result<Self, FormatError> {
        need(Self::NAME, raw, Self::SIZE)?;
        let lsn = Lsn(get_u64(raw, 16));
        let bad = |field, value: u64, why| bad_field(Self::NAME, lsn.0, field, value, why);
        let magic = get_u32(raw, 0);
        if magic != LOG_RECORD_MAGIC {
            return Err(FormatError::BadMagic {
                structure: Self::NAME,
                block: lsn.0,
                expected: LOG_RECORD_MAGIC,
                found: magic,
            });
        }
        let header = Self {
            header_crc: get_u32(raw, HEADER_CRC_OFFSET),
            cycle: get_u32(raw, 8),
            flags: get_u32(raw, 12),
            lsn,
            prev_lsn: Lsn(get_u64(raw, 24)),
            checkpoint_sequence: get_u64(raw, 32),
            payload_bytes: get_u32(raw, 40),
            payload_crc: get_u32(raw, 44),
            op_count: get_u32(raw, 48),
            uuid: get_bytes::<16>(raw, 56),
            tail_lsn: Lsn(get_u64(raw, 72)),
        };
        check_zero(Self::NAME, lsn.0, "reserved", raw, 52..56)?;
        check_zero(Self::NAME, lsn.0, "spare", raw, 80..Self::SIZE)?;
        if header.cycle == 0 || header.cycle != lsn.cycle() {
            return Err(bad(
                "cycle",
                header.cycle.into(),
                "zero or disagrees with the LSN",
            ));
        }
        if header.tail_lsn > lsn {
            return Err(bad(
                "tail_lsn",
                header.tail_lsn.0,
                "past the record's own LSN",
            ));
        }
        if header.flags & !LOG_FLAGS_KNOWN != 0 {
            return Err(bad("flags", header.flags.into(), "unknown record flags"));
        }
        if header.payload_bytes > LOG_RECORD_PAYLOAD_MAX {
            return Err(bad(
                "payload_bytes",
                header.payload_bytes.into(),
                "too large",
            ));
        }
        Ok(header)
    }
}

/// CRC32C of a record's header sector with the CRC field taken as zero.
pub fn log_header_crc(sector: &[u8]) -> u32 {
    crate::header::block_crc(sector)
}

/// Writes a complete record: header sector (CRCs computed here), payload, zero padding to a
/// 512-byte multiple. `header.payload_bytes` and both CRC fields are set from `payload`.
pub fn encode_log_record(header: &LogRecordHeader, payload: &[u8]) -> Vec<u8> {
    debug_assert!(payload.len() <= LOG_RECORD_PAYLOAD_MAX as usize);
    let total = (LOG_RECORD_HEADER_BYTES + payload.len()).next_multiple_of(LOG_RECORD_HEADER_BYTES);
    let mut out = vec![0u8; total];
    let mut header = *header;
    header.payload_bytes = payload.len() as u32;
    header.payload_crc = crc32c::crc32c(payload);
    header.header_crc = 0;
    header.encode(&mut out);
    let crc = log_header_crc(&out[..LOG_RECORD_HEADER_BYTES]);
    put_u32(&mut out, HEADER_CRC_OFFSET, crc);
    out[LOG_RECORD_HEADER_BYTES..LOG_RECORD_HEADER_BYTES + payload.len()].copy_from_slice(payload);
    out
}

/// Verifies and splits a record read from the log: header CRC, header fields, then payload
/// CRC. `raw` must hold the header sector and at least the payload.
pub fn decode_log_record(raw: &[u8]) -> Result<(LogRecordHeader, &[u8]), FormatError> {
    need(LogRecordHeader::NAME, raw, LOG_RECORD_HEADER_BYTES)?;
    let header = LogRecordHeader::decode(raw)?;
    let spare = LogRecordHeader::SIZE..LOG_RECORD_HEADER_BYTES;
    check_zero(LogRecordHeader::NAME, header.lsn.0, "spare", raw, spare)?;
    let computed = log_header_crc(&raw[..LOG_RECORD_HEADER_BYTES]);
    if header.header_crc != computed {
        return Err(FormatError::BadCrc {
            structure: LogRecordHeader::NAME,
            block: header.lsn.0,
            found: header.header_crc,
            computed,
        });
    }
    let end = LOG_RECORD_HEADER_BYTES + header.payload_bytes as usize;
    need(LogRecordHeader::NAME, raw, end)?;
    let payload = &raw[LOG_RECORD_HEADER_BYTES..end];
    let computed = crc32c::crc32c(payload);
    if header.payload_crc != computed {
        return Err(FormatError::BadCrc {
            structure: "log record payload",
            block: header.lsn.0,
            found: header.payload_crc,
            computed,
        });
    }
    Ok((header, payload))
}

/// One extent named by an extent-free intent or done item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FreeExtent {
    pub start: FsBlock,
    pub length: u32,
}

/// What a refcount update does to its run (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RefcountOp {
    /// One more file maps the run.
    Increase = 1,
    /// One file fewer maps the run: blocks counted 2 or more lose one, the rest are freed.
    Decrease = 2,
    /// A copy-on-write's staging run entered a file map: its staging record goes.
    Unstage = 3,
}

impl RefcountOp {
    pub const fn from_code(code: u8) -> Option<RefcountOp> {
        match code {
            1 => Some(Self::Increase),
            2 => Some(Self::Decrease),
            3 => Some(Self::Unstage),
            _ => None,
        }
    }
}

/// One run named by a refcount intent: what happens to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RefcountUpdate {
    pub op: RefcountOp,
    pub start: FsBlock,
    pub length: u32,
}

/// The body of an InodeCreate item: a new inode cluster, logged as what it holds rather than
/// as its bytes. Every inode in it is free, of `generation`, numbered consecutively from
/// `first_inode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InodeCreate {
    pub first_inode: u64,
    /// Length of the cluster buffer (a multiple of `inode_size`).
    pub block_bytes: u32,
    pub inode_size: u32,
    pub generation: u32,
}

impl InodeCreate {
    /// Inodes in the cluster.
    pub fn inode_count(&self) -> u32 {
        self.block_bytes / self.inode_size
    }
}

impl OnDisk for InodeCreate {
    const SIZE: usize = 24;
    const NAME: &'static str = "inode create item";

    fn encode(&self, out: &mut [u8]) {
        put_u64(out, 0, self.first_inode);
        put_u32(out, 8, self.block_bytes);
        put_u32(out, 12, self.inode_size);
        put_u32(out, 16, self.generation);
        put_u32(out, 20, 0);
    }

    fn decode(raw: &[u8]) -> Result<Self, FormatError> {
        need(Self::NAME, raw, Self::SIZE)?;
        let create = Self {
            first_inode: get_u64(raw, 0),
            block_bytes: get_u32(raw, 8),
            inode_size: get_u32(raw, 12),
            generation: get_u32(raw, 16),
        };
        let size = create.inode_size;
        if !size.is_power_of_two() || !(INODE_SIZE_MIN..=INODE_SIZE_MAX).contains(&size) {
            return Err(item_bad("inode_size", size.into(), "not an inode size"));
        }
        let bytes = create.block_bytes;
        if bytes == 0 || bytes > BLOCK_SIZE_MAX || !bytes.is_multiple_of(size) {
            let why = "not a block size holding whole inodes";
            return Err(item_bad("block_bytes", bytes.into(), why));
        }
        if create
            .first_inode
            .checked_add(u64::from(create.inode_count()))
            .is_none()
        {
            return Err(item_bad("first_inode", create.first_inode, "overflows"));
        }
        if get_u32(raw, 20) != 0 {
            return Err(item_bad("reserved", get_u32(raw, 20).into(), "not zero"));
        }
        Ok(create)
    }
}

/// Which way a shift (`ShiftIntent`) moves a file's extents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ShiftKind {
    /// `FALLOC_FL_COLLAPSE_RANGE`: the range goes, the extents past it move down.
    Collapse = 1,
    /// `FALLOC_FL_INSERT_RANGE`: the extents from the start move up, leaving a hole.
    Insert = 2,
}

/// A `ShiftIntent` cursor of an insert that has moved nothing yet.
pub const SHIFT_NOTHING_MOVED: u64 = u64::MAX;

/// The body of a ShiftIntent item: a collapse or insert range of regular file `inode` (of
/// `generation`) in progress, which recovery finishes. The extents at and past file block
/// `start` move by `blocks` (down for a collapse, which first unmaps `start..start +
/// blocks`; up for an insert), and the size ends at `new_size`. `cursor` says how far the
/// move got, in the file's original blocks: for a collapse, the extents from `cursor` on
/// are still to move (it starts at `start + blocks`, where the unmapping may be
/// unfinished); for an insert, the extents from `cursor` on have moved (it starts at
/// `SHIFT_NOTHING_MOVED`). Every step relogs the intent with its new cursor in the
/// transaction that moves the extents, so a crash leaves the file before or after the shift.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShiftIntent {
    pub inode: u64,
    pub generation: u32,
    pub kind: ShiftKind,
    pub start: u64,
    pub blocks: u64,
    pub cursor: u64,
    pub new_size: u64,
}

impl OnDisk for ShiftIntent {
    const SIZE: usize = 48;
    const NAME: &'static str = "shift intent item";

    fn encode(&self, out: &mut [u8]) {
        put_u64(out, 0, self.inode);
        put_u32(out, 8, self.generation);
        put_u32(out, 12, self.kind as u32);
        put_u64(out, 16, self.start);
        put_u64(out, 24, self.blocks);
        put_u64(out, 32, self.cursor);
        put_u64(out, 40, self.new_size);
    }

    fn decode(raw: &[u8]) -> Result<Self, FormatError> {
        need(Self::NAME, raw, Self::SIZE)?;
        let kind = match get_u32(raw, 12) {
            1 => ShiftKind::Collapse,
            2 => ShiftKind::Insert,
            other => return Err(item_bad("kind", other.into(), "not a shift kind")),
        };
        let intent = Self {
            inode: get_u64(raw, 0),
            generation: get_u32(raw, 8),
            kind,
            start: get_u64(raw, 16),
            blocks: get_u64(raw, 24),
            cursor: get_u64(raw, 32),
            new_size: get_u64(raw, 40),
        };
        let end = intent.start.checked_add(intent.blocks);
        if intent.blocks == 0 || end.is_none_or(|end| end > FILE_BLOCK_MAX + 1) {
            let why = "empty, or past FILE_BLOCK_MAX";
            return Err(item_bad("blocks", intent.blocks, why));
        }
        let cursor_ok = match kind {
            ShiftKind::Collapse => end.is_some_and(|end| intent.cursor >= end),
            ShiftKind::Insert => intent.cursor >= intent.start,
        };
        if !cursor_ok {
            return Err(item_bad(
                "cursor",
                intent.cursor,
                "before where the shift starts",
            ));
        }
        Ok(intent)
    }
}

/// A log item: the unit of change a checkpoint carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogItem {
    /// Dirty byte ranges of a metadata block: `(offset, length)` pairs, sorted and disjoint,
    /// and the bytes of those ranges concatenated in order.
    Buffer {
        block: FsBlock,
        block_bytes: u32,
        regions: Vec<(u32, u32)>,
        data: Vec<u8>,
    },
    /// An inode image, possibly without its zero tail (replay zero-fills to the inode size).
    Inode {
        inode: u64,
        image: Vec<u8>,
    },
    ExtentFreeIntent {
        intent_id: u64,
        extents: Vec<FreeExtent>,
    },
    ExtentFreeDone {
        intent_id: u64,
        extents: Vec<FreeExtent>,
    },
    CheckpointStart {
        sequence: u64,
    },
    CheckpointCommit {
        sequence: u64,
    },
    /// The buffer at `block` is a new inode cluster of free inodes (see `InodeCreate`).
    InodeCreate {
        block: FsBlock,
        create: InodeCreate,
    },
    /// Refcount updates a later transaction makes (reflink: sharing, dropping, unstaging).
    RefcountIntent {
        intent_id: u64,
        updates: Vec<RefcountUpdate>,
    },
    RefcountDone {
        intent_id: u64,
    },
    /// A collapse or insert range in progress (see `ShiftIntent`).
    ShiftIntent {
        intent_id: u64,
        shift: ShiftIntent,
    },
    ShiftDone {
        intent_id: u64,
    },
}

const TYPE_BUFFER: u16 = 1;
const TYPE_INODE: u16 = 2;
const TYPE_EXTENT_FREE_INTENT: u16 = 3;
const TYPE_EXTENT_FREE_DONE: u16 = 4;
const TYPE_CHECKPOINT_START: u16 = 5;
const TYPE_CHECKPOINT_COMMIT: u16 = 6;
const TYPE_INODE_CREATE: u16 = 7;
const TYPE_REFCOUNT_INTENT: u16 = 10;
const TYPE_REFCOUNT_DONE: u16 = 11;
const TYPE_SHIFT_INTENT: u16 = 20;
const TYPE_SHIFT_DONE: u16 = 21;
const ITEM: &str = "log item";

fn item_bad(field: &'static str, value: u64, why: &'static str) -> FormatError {
    bad_field(ITEM, NULL_BLOCK, field, value, why)
}

impl LogItem {
    fn type_and_id(&self) -> (u16, u64) {
        match self {
            Self::Buffer { block, .. } => (TYPE_BUFFER, block.0),
            Self::Inode { inode, .. } => (TYPE_INODE, *inode),
            Self::ExtentFreeIntent { intent_id, .. } => (TYPE_EXTENT_FREE_INTENT, *intent_id),
            Self::ExtentFreeDone { intent_id, .. } => (TYPE_EXTENT_FREE_DONE, *intent_id),
            Self::CheckpointStart { sequence } => (TYPE_CHECKPOINT_START, *sequence),
            Self::CheckpointCommit { sequence } => (TYPE_CHECKPOINT_COMMIT, *sequence),
            Self::InodeCreate { block, .. } => (TYPE_INODE_CREATE, block.0),
            Self::RefcountIntent { intent_id, .. } => (TYPE_REFCOUNT_INTENT, *intent_id),
            Self::RefcountDone { intent_id } => (TYPE_REFCOUNT_DONE, *intent_id),
            Self::ShiftIntent { intent_id, .. } => (TYPE_SHIFT_INTENT, *intent_id),
            Self::ShiftDone { intent_id } => (TYPE_SHIFT_DONE, *intent_id),
        }
    }

    fn body(&self) -> Vec<u8> {
        match self {
            Self::Buffer {
                block_bytes,
                regions,
                data,
                ..
            } => {
                let mut body = vec![0u8; 8 + 8 * regions.len()];
                put_u32(&mut body, 0, regions.len() as u32);
                put_u32(&mut body, 4, *block_bytes);
                for (index, &(offset, length)) in regions.iter().enumerate() {
                    put_u32(&mut body, 8 + 8 * index, offset);
                    put_u32(&mut body, 12 + 8 * index, length);
                }
                body.extend_from_slice(data);
                body
            }
            Self::Inode { image, .. } => image.clone(),
            Self::ExtentFreeIntent { extents, .. } | Self::ExtentFreeDone { extents, .. } => {
                let mut body = vec![0u8; 8 + 16 * extents.len()];
                put_u32(&mut body, 0, extents.len() as u32);
                for (index, extent) in extents.iter().enumerate() {
                    put_u64(&mut body, 8 + 16 * index, extent.start.0);
                    put_u32(&mut body, 16 + 16 * index, extent.length);
                }
                body
            }
            Self::CheckpointStart { .. } | Self::CheckpointCommit { .. } => Vec::new(),
            Self::InodeCreate { create, .. } => create.to_bytes(),
            Self::RefcountIntent { updates, .. } => {
                let mut body = vec![0u8; 8 + 16 * updates.len()];
                put_u32(&mut body, 0, updates.len() as u32);
                for (index, update) in updates.iter().enumerate() {
                    put_u64(&mut body, 8 + 16 * index, update.start.0);
                    put_u32(&mut body, 16 + 16 * index, update.length);
                    body[20 + 16 * index] = update.op as u8;
                }
                body
            }
            Self::RefcountDone { .. } => vec![0u8; 8],
            Self::ShiftIntent { shift, .. } => shift.to_bytes(),
            Self::ShiftDone { .. } => Vec::new(),
        }
    }

    /// Appends the encoded item (header, body, padding) to `out`, after validating it.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), FormatError> {
        let body = self.body();
        // Validating the encoded body applies exactly the rules the decoder applies.
        let (kind, id) = self.type_and_id();
        Self::decode_body(kind, id, &body)?;
        let start = out.len();
        out.resize(start + ITEM_HEADER_BYTES, 0);
        put_u16(out, start, kind);
        put_u16(out, start + 2, 0);
        put_u32(out, start + 4, body.len() as u32);
        put_u64(out, start + 8, id);
        out.extend_from_slice(&body);
        out.resize(out.len().next_multiple_of(8), 0);
        Ok(())
    }

    /// Decodes one item from the front of `raw`; returns it and the bytes it took.
    pub fn decode(raw: &[u8]) -> Result<(LogItem, usize), FormatError> {
        need(ITEM, raw, ITEM_HEADER_BYTES)?;
        let kind = get_u16(raw, 0);
        let flags = get_u16(raw, 2);
        if flags != 0 {
            return Err(item_bad("flags", flags.into(), "unknown item flags"));
        }
        let length = get_u32(raw, 4) as usize;
        let id = get_u64(raw, 8);
        let end = ITEM_HEADER_BYTES.saturating_add(length);
        need(ITEM, raw, end)?;
        let item = Self::decode_body(kind, id, &raw[ITEM_HEADER_BYTES..end])?;
        Ok((item, end.next_multiple_of(8).min(raw.len().max(end))))
    }

    fn decode_body(kind: u16, id: u64, body: &[u8]) -> Result<LogItem, FormatError> {
        let empty = |item: LogItem| match body.is_empty() {
            true => Ok(item),
            false => Err(item_bad(
                "length",
                body.len() as u64,
                "checkpoint and shift done items have no body",
            )),
        };
        match kind {
            TYPE_BUFFER => decode_buffer(FsBlock(id), body),
            TYPE_INODE => Ok(Self::Inode {
                inode: id,
                image: body.to_vec(),
            }),
            TYPE_EXTENT_FREE_INTENT => {
                let extents = decode_free_extents(body)?;
                Ok(Self::ExtentFreeIntent {
                    intent_id: id,
                    extents,
                })
            }
            TYPE_EXTENT_FREE_DONE => {
                let extents = decode_free_extents(body)?;
                Ok(Self::ExtentFreeDone {
                    intent_id: id,
                    extents,
                })
            }
            TYPE_CHECKPOINT_START => empty(Self::CheckpointStart { sequence: id }),
            TYPE_CHECKPOINT_COMMIT => empty(Self::CheckpointCommit { sequence: id }),
            TYPE_INODE_CREATE => {
                if body.len() != InodeCreate::SIZE {
                    let why = "inode create body is not 24 bytes";
                    return Err(item_bad("length", body.len() as u64, why));
                }
                if id > FS_BLOCK_MAX {
                    return Err(item_bad("block", id, "past FS_BLOCK_MAX"));
                }
                Ok(Self::InodeCreate {
                    block: FsBlock(id),
                    create: InodeCreate::decode(body)?,
                })
            }
            TYPE_REFCOUNT_INTENT => Ok(Self::RefcountIntent {
                intent_id: id,
                updates: decode_refcount_updates(body)?,
            }),
            TYPE_REFCOUNT_DONE => {
                decode_refcount_updates(body)?;
                Ok(Self::RefcountDone { intent_id: id })
            }
            TYPE_SHIFT_INTENT => {
                if body.len() != ShiftIntent::SIZE {
                    let why = "shift intent body is not 48 bytes";
                    return Err(item_bad("length", body.len() as u64, why));
                }
                Ok(Self::ShiftIntent {
                    intent_id: id,
                    shift: ShiftIntent::decode(body)?,
                })
            }
            TYPE_SHIFT_DONE => empty(Self::ShiftDone { intent_id: id }),
            _ => Err(item_bad("type", kind.into(), "unknown log item type")),
        }
    }
}

fn decode_buffer(block: FsBlock, body: &[u8]) -> Result<LogItem, FormatError> {
    need(ITEM, body, 8)?;
    let count = get_u32(body, 0) as usize;
    let block_bytes = get_u32(body, 4);
    if count > LOG_ITEM_REGIONS_MAX {
        return Err(item_bad(
            "count",
            count as u64,
            "more than LOG_ITEM_REGIONS_MAX",
        ));
    }
    if block_bytes == 0 || block_bytes > BLOCK_SIZE_MAX {
        return Err(item_bad(
            "block_bytes",
            block_bytes.into(),
            "not a block size",
        ));
    }
    let data_at = 8 + 8 * count;
    need(ITEM, body, data_at)?;
    let mut regions = Vec::with_capacity(count);
    let mut next_free = 0u64;
    for index in 0..count {
        let offset = get_u32(body, 8 + 8 * index);
        let length = get_u32(body, 12 + 8 * index);
        let end = u64::from(offset) + u64::from(length);
        if length == 0 || u64::from(offset) < next_free || end > u64::from(block_bytes) {
            let why = "region empty, out of order, overlapping or past the block";
            return Err(item_bad("region", offset.into(), why));
        }
        next_free = end;
        regions.push((offset, length));
    }
    let data_bytes: u64 = regions.iter().map(|&(_, length)| u64::from(length)).sum();
    if (body.len() - data_at) as u64 != data_bytes {
        return Err(item_bad(
            "length",
            body.len() as u64,
            "disagrees with the regions",
        ));
    }
    let data = body[data_at..].to_vec();
    Ok(LogItem::Buffer {
        block,
        block_bytes,
        regions,
        data,
    })
}

fn decode_free_extents(body: &[u8]) -> Result<Vec<FreeExtent>, FormatError> {
    need(ITEM, body, 8)?;
    let count = get_u32(body, 0) as usize;
    if count > LOG_INTENT_EXTENTS_MAX {
        return Err(item_bad(
            "count",
            count as u64,
            "more than LOG_INTENT_EXTENTS_MAX",
        ));
    }
    if body.len() != 8 + 16 * count {
        return Err(item_bad(
            "length",
            body.len() as u64,
            "disagrees with the extent count",
        ));
    }
    let mut extents = Vec::with_capacity(count);
    for index in 0..count {
        let start = get_u64(body, 8 + 16 * index);
        let length = get_u32(body, 16 + 16 * index);
        if length == 0 || length > EXTENT_LEN_MAX || start > FS_BLOCK_MAX - u64::from(length) {
            return Err(item_bad(
                "extent",
                start,
                "extent empty, too long or past FS_BLOCK_MAX",
            ));
        }
        extents.push(FreeExtent {
            start: FsBlock(start),
            length,
        });
    }
    Ok(extents)
}

fn decode_refcount_updates(body: &[u8]) -> Result<Vec<RefcountUpdate>, FormatError> {
    need(ITEM, body, 8)?;
    let count = get_u32(body, 0) as usize;
    if count > LOG_INTENT_EXTENTS_MAX {
        let why = "more than LOG_INTENT_EXTENTS_MAX";
        return Err(item_bad("count", count as u64, why));
    }
    if body.len() != 8 + 16 * count || get_u32(body, 4) != 0 {
        let why = "disagrees with the update count, or reserved bytes set";
        return Err(item_bad("length", body.len() as u64, why));
    }
    let mut updates = Vec::with_capacity(count);
    for index in 0..count {
        let at = 8 + 16 * index;
        let start = get_u64(body, at);
        let length = get_u32(body, at + 8);
        if length == 0 || length > EXTENT_LEN_MAX || start > FS_BLOCK_MAX - u64::from(length) {
            let why = "run empty, too long or past FS_BLOCK_MAX";
            return Err(item_bad("update", start, why));
        }
        let op = RefcountOp::from_code(body[at + 12])
            .ok_or_else(|| item_bad("op", body[at + 12].into(), "unknown refcount op"))?;
        if body[at + 13..at + 16] != [0; 3] {
            return Err(item_bad("update", start, "reserved bytes set"));
        }
        updates.push(RefcountUpdate {
            op,
            start: FsBlock(start),
            length,
        });
    }
    Ok(updates)
}

/// Decodes a record payload holding exactly `op_count` items.
pub fn decode_log_items(payload: &[u8], op_count: u32) -> Result<Vec<LogItem>, FormatError> {
    let mut items = Vec::new();
    let mut at = 0;
    for _ in 0..op_count {
        if at >= payload.len() {
            return Err(item_bad(
                "op_count",
                op_count.into(),
                "more items than the payload",
            ));
        }
        let (item, used) = LogItem::decode(&payload[at..])?;
        items.push(item);
        at += used;
    }
    if at != payload.len() {
        return Err(item_bad(
            "length",
            payload.len() as u64,
            "bytes after the last item",
        ));
    }
    Ok(items)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample_header() -> LogRecordHeader {
        LogRecordHeader {
            header_crc: 0,
            cycle: 3,
            flags: LOG_FLAG_COMMIT,
            lsn: Lsn::new(3, 40),
            prev_lsn: Lsn::new(3, 32),
            checkpoint_sequence: 17,
            payload_bytes: 0,
            payload_crc: 0,
            op_count: 2,
            uuid: [7; 16],
            tail_lsn: Lsn::new(3, 8),
        }
    }

    fn sample_items() -> Vec<LogItem> {
        vec![
            LogItem::CheckpointStart { sequence: 17 },
            LogItem::Buffer {
                block: FsBlock(99),
                block_bytes: 4096,
                regions: vec![(0, 48), (128, 8)],
                data: (0..56).collect(),
            },
            LogItem::Inode {
                inode: 4160,
                image: vec![5; 512],
            },
            LogItem::ExtentFreeIntent {
                intent_id: 1,
                extents: vec![FreeExtent {
                    start: FsBlock(1000),
                    length: 8,
                }],
            },
            LogItem::ExtentFreeDone {
                intent_id: 1,
                extents: vec![],
            },
            LogItem::InodeCreate {
                block: FsBlock(4200),
                create: InodeCreate {
                    first_inode: 4160,
                    block_bytes: 4096,
                    inode_size: 512,
                    generation: 0x9e37_79b9,
                },
            },
            LogItem::RefcountIntent {
                intent_id: 2,
                updates: vec![RefcountUpdate {
                    op: RefcountOp::Decrease,
                    start: FsBlock(2000),
                    length: 3,
                }],
            },
            LogItem::RefcountDone { intent_id: 2 },
            LogItem::ShiftIntent {
                intent_id: 3,
                shift: ShiftIntent {
                    inode: 4161,
                    generation: 5,
                    kind: ShiftKind::Collapse,
                    start: 256,
                    blocks: 16,
                    cursor: 300,
                    new_size: 7 << 20,
                },
            },
            LogItem::ShiftDone { intent_id: 3 },
            LogItem::CheckpointCommit { sequence: 17 },
        ]
    }

    // Checks a record with every item kind: encode, verify, decode, and torn-payload detection.
    #[test]
    fn record_round_trip_and_torn_payload() {
        let items = sample_items();
        let mut payload = Vec::new();
        for item in &items {
            item.encode(&mut payload).unwrap();
        }
        let header = LogRecordHeader {
            op_count: items.len() as u32,
            ..sample_header()
        };
        let mut record = encode_log_record(&header, &payload);
        assert_eq!(record.len() % 512, 0);
        let (read, body) = decode_log_record(&record).unwrap();
        assert_eq!(read.payload_bytes as usize, payload.len());
        assert_eq!(decode_log_items(body, read.op_count).unwrap(), items);
        assert!(decode_log_items(body, read.op_count + 1).is_err());
        record[600] ^= 1;
        assert!(matches!(
            decode_log_record(&record),
            Err(FormatError::BadCrc { .. })
        ));
        record[600] ^= 1;
        record[20] ^= 1;
        assert!(decode_log_record(&record).is_err());
    }

    // Checks that a record header with nonzero reserved or spare bytes is refused even when
    // its CRC covers them.
    #[test]
    fn nonzero_reserved_header_bytes_are_refused() {
        for at in [52, 100, 200, 511] {
            let mut record = encode_log_record(&sample_header(), &[]);
            record[at] = 1;
            let crc = log_header_crc(&record[..LOG_RECORD_HEADER_BYTES]);
            put_u32(&mut record, HEADER_CRC_OFFSET, crc);
            assert!(decode_log_record(&record).is_err(), "byte {at} accepted");
        }
    }

    // Checks that malformed items are refused rather than misread.
    #[test]
    fn bad_items_are_refused() {
        let overlapping = LogItem::Buffer {
            block: FsBlock(1),
            block_bytes: 512,
            regions: vec![(0, 16), (8, 8)],
            data: vec![0; 24],
        };
        assert!(overlapping.encode(&mut Vec::new()).is_err());
        let past_end = LogItem::Buffer {
            block: FsBlock(1),
            block_bytes: 512,
            regions: vec![(508, 8)],
            data: vec![0; 8],
        };
        assert!(past_end.encode(&mut Vec::new()).is_err());
        let empty_extent = LogItem::ExtentFreeIntent {
            intent_id: 2,
            extents: vec![FreeExtent {
                start: FsBlock(5),
                length: 0,
            }],
        };
        assert!(empty_extent.encode(&mut Vec::new()).is_err());
        let mut raw = Vec::new();
        LogItem::CheckpointStart { sequence: 1 }
            .encode(&mut raw)
            .unwrap();
        raw[0] = 77;
        assert!(LogItem::decode(&raw).is_err());
        let refcount = LogItem::RefcountIntent {
            intent_id: 3,
            updates: vec![RefcountUpdate {
                op: RefcountOp::Increase,
                start: FsBlock(10),
                length: 2,
            }],
        };
        let mut raw = Vec::new();
        refcount.encode(&mut raw).unwrap();
        for (at, value) in [(16 + 20, 9u8), (16 + 21, 1), (16 + 4, 1)] {
            let mut bad = raw.clone();
            bad[at] = value;
            assert!(
                LogItem::decode(&bad).is_err(),
                "byte {at} = {value} accepted"
            );
        }
    }

    // Checks that inode create items with impossible shapes are refused.
    #[test]
    fn bad_inode_create_is_refused() {
        let good = InodeCreate {
            first_inode: 64,
            block_bytes: 4096,
            inode_size: 512,
            generation: 1,
        };
        assert_eq!(good.inode_count(), 8);
        let bad = [
            InodeCreate {
                inode_size: 300,
                ..good
            },
            InodeCreate {
                inode_size: 4096,
                ..good
            },
            InodeCreate {
                block_bytes: 4000,
                ..good
            },
            InodeCreate {
                block_bytes: 0,
                ..good
            },
            InodeCreate {
                first_inode: u64::MAX - 2,
                ..good
            },
        ];
        for create in bad {
            let item = LogItem::InodeCreate {
                block: FsBlock(9),
                create,
            };
            assert!(item.encode(&mut Vec::new()).is_err(), "{create:?}");
        }
        let mut raw = good.to_bytes();
        raw[20] = 1;
        assert!(InodeCreate::decode(&raw).is_err());
        assert!(InodeCreate::decode(&raw[..20]).is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        #[test]
        fn record_header_round_trip(
            cycle in 1u32.., block: u32, flags in 0u32..4, prev: u64, sequence: u64,
            payload in 0u32..=LOG_RECORD_PAYLOAD_MAX, crcs: (u32, u32), ops: u32, uuid: [u8; 16],
            tail_back: u64,
        ) {
            let lsn = Lsn::new(cycle, block);
            let header = LogRecordHeader {
                header_crc: crcs.0, cycle, flags, lsn, prev_lsn: Lsn(prev),
                checkpoint_sequence: sequence, payload_bytes: payload, payload_crc: crcs.1,
                op_count: ops, uuid, tail_lsn: Lsn(lsn.0.saturating_sub(tail_back)),
            };
            prop_assert_eq!(LogRecordHeader::decode(&header.to_bytes()).unwrap(), header);
        }

        #[test]
        fn buffer_item_round_trip(
            block: u64, cuts in proptest::collection::btree_set(0u32..4096, 0..20), fill: u8,
        ) {
            let cuts: Vec<u32> = cuts.into_iter().collect();
            let regions: Vec<(u32, u32)> = cuts.chunks(2).filter(|c| c.len() == 2)
                .map(|c| (c[0], c[1] - c[0])).collect();
            let bytes: u32 = regions.iter().map(|r| r.1).sum();
            let item = LogItem::Buffer {
                block: FsBlock(block), block_bytes: 4096, regions, data: vec![fill; bytes as usize],
            };
            let mut raw = Vec::new();
            item.encode(&mut raw).unwrap();
            prop_assert_eq!(raw.len() % 8, 0);
            prop_assert_eq!(LogItem::decode(&raw).unwrap(), (item, raw.len()));
        }

        #[test]
        fn extent_free_round_trip(
            id: u64,
            extents in proptest::collection::vec((0u64..1 << 50, 1u32..=EXTENT_LEN_MAX), 0..64),
        ) {
            let extents: Vec<FreeExtent> = extents.into_iter()
                .map(|(start, length)| FreeExtent { start: FsBlock(start), length }).collect();
            let item = LogItem::ExtentFreeIntent { intent_id: id, extents };
            let mut raw = Vec::new();
            item.encode(&mut raw).unwrap();
            prop_assert_eq!(decode_log_items(&raw, 1).unwrap(), vec![item]);
        }

        #[test]
        fn refcount_update_round_trip(
            id: u64,
            updates in proptest::collection::vec(
                (0u64..1 << 50, 1u32..=EXTENT_LEN_MAX, 1u8..=3), 0..64,
            ),
        ) {
            let updates: Vec<RefcountUpdate> = updates.into_iter()
                .filter_map(|(start, length, op)| Some(RefcountUpdate {
                    op: RefcountOp::from_code(op)?, start: FsBlock(start), length,
                }))
                .collect();
            let items = vec![
                LogItem::RefcountIntent { intent_id: id, updates },
                LogItem::RefcountDone { intent_id: id },
            ];
            let mut raw = Vec::new();
            for item in &items {
                item.encode(&mut raw).unwrap();
            }
            prop_assert_eq!(decode_log_items(&raw, 2).unwrap(), items);
        }

        #[test]
        fn inode_create_round_trip(
            block in 0u64..=FS_BLOCK_MAX, first_inode in 0u64..1 << 60, generation: u32,
            size_log in 8u32..=11, block_log in 9u32..=16,
        ) {
            let inode_size = 1u32 << size_log;
            let block_bytes = (1u32 << block_log).max(inode_size);
            let create = InodeCreate { first_inode, block_bytes, inode_size, generation };
            prop_assert_eq!(InodeCreate::decode(&create.to_bytes()).unwrap(), create);
            let item = LogItem::InodeCreate { block: FsBlock(block), create };
            let mut raw = Vec::new();
            item.encode(&mut raw).unwrap();
            prop_assert_eq!(raw.len(), 16 + InodeCreate::SIZE);
            prop_assert_eq!(decode_log_items(&raw, 1).unwrap(), vec![item]);
        }

        #[test]
        fn shift_intent_round_trip(
            id: u64, inode: u64, generation: u32, insert: bool, start in 0u64..1 << 40,
            blocks in 1u64..1 << 40, past in 0u64..1 << 40, new_size: u64,
        ) {
            let (kind, cursor) = match insert {
                true => (ShiftKind::Insert, start + past),
                false => (ShiftKind::Collapse, start + blocks + past),
            };
            let shift = ShiftIntent { inode, generation, kind, start, blocks, cursor, new_size };
            prop_assert_eq!(ShiftIntent::decode(&shift.to_bytes()).unwrap(), shift);
            for item in [
                LogItem::ShiftIntent { intent_id: id, shift },
                LogItem::ShiftDone { intent_id: id },
            ] {
                let mut raw = Vec::new();
                item.encode(&mut raw).unwrap();
                prop_assert_eq!(decode_log_items(&raw, 1).unwrap(), vec![item]);
            }
        }

        #[test]
        fn log_random_bytes_never_panic(
            raw in proptest::collection::vec(any::<u8>(), 0..1200), ops in 0u32..8,
        ) {
            let _ = LogRecordHeader::decode(&raw);
            let _ = decode_log_record(&raw);
            let _ = LogItem::decode(&raw);
            let _ = decode_log_items(&raw, ops);
            let _ = InodeCreate::decode(&raw);
            let _ = ShiftIntent::decode(&raw);
        }
    }
}
