//! The crate's one error type. Variants name the block, record or item they concern.

use cairn_blockdev::DeviceError;
use cairn_bufcache::{BufCacheError, BufKey};
use cairn_format::{FormatError, Lsn};

/// Errors from the journal.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JournalError {
    /// The journal stopped after an error that may have lost log writes, or after a dirty
    /// transaction was cancelled; every later operation fails with this.
    #[error("the journal is shut down: {reason}")]
    Shutdown { reason: String },

    /// A buffer operation inside a transaction failed.
    #[error("buffer cache: {0}")]
    Buffer(#[from] BufCacheError),

    /// A device read or write of the log (or of recovery's home writes) failed.
    #[error("{what} at byte {offset}: {source}")]
    Device {
        what: &'static str,
        offset: u64,
        source: DeviceError,
    },

    /// A log item could not be encoded (a bug in the caller's regions or extents).
    #[error("encoding a log item for {what}: {source}")]
    Encode { what: String, source: FormatError },

    /// A record inside the part of the log recovery must replay is corrupt.
    #[error("log record at {lsn:?}: {why}")]
    CorruptLog { lsn: Lsn, why: String },

    /// A replayed item does not fit the filesystem.
    #[error("replaying {what}: {why}")]
    BadItem { what: String, why: &'static str },

    /// The configuration or geometry cannot host a log.
    #[error("journal config: {field} = {value}: {why}")]
    Config {
        field: &'static str,
        value: u64,
        why: &'static str,
    },

    /// A reservation larger than the log can ever grant.
    #[error("reservation of {bytes} bytes exceeds the largest grant of {max_bytes} bytes")]
    ReservationTooLarge { bytes: u64, max_bytes: u64 },

    /// A transaction logged more than it reserved.
    #[error("transaction used {used_bytes} log bytes but reserved {reserved_bytes}")]
    ReservationOverrun {
        used_bytes: u64,
        reserved_bytes: u64,
    },

    /// `invalidate_buf` on a buffer the transaction has not joined.
    #[error("buffer {key:?} is not joined to this transaction")]
    NotJoined { key: BufKey },

    /// The same block joined with two lengths.
    #[error("buffer {key:?} is joined with another length ({joined_blocks} blocks)")]
    LengthMismatch { key: BufKey, joined_blocks: u32 },

    /// An inode image of the wrong size, or an inode number outside the filesystem.
    #[error("inode {inode}: {why}")]
    BadInode { inode: u64, why: &'static str },

    /// An extent-free intent with too many extents.
    #[error("free intent with {count} extents (at most {max})")]
    TooManyExtents { count: usize, max: usize },

    /// Log writeback made no progress while space was needed.
    #[error("log space: {why}")]
    NoProgress { why: &'static str },
}

impl JournalError {
    pub(crate) fn device(what: &'static str, offset: u64, source: DeviceError) -> Self {
        Self::Device {
            what,
            offset,
            source,
        }
    }
}
