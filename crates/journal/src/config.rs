//! Journal configuration and every named limit of the log.

use cairn_format::limits::{BLOCK_SIZE_MAX, LOG_INTENT_EXTENTS_MAX};

/// How committed transactions reach the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogMode {
    /// Delayed logging: commits gather in the CIL; a checkpoint writes each changed item once.
    Delayed,
    /// `logmode=sync`: every commit writes its own checkpoint and waits for it (no
    /// aggregation). Kept to compare the two modes on one build.
    Sync,
}

/// Background push starts when the CIL holds this fraction of the log (1/8, XFS's value) ...
pub const CIL_PUSH_LOG_DIVISOR: u64 = 8;
/// ... or this many bytes, whichever is smaller (XFS: 32 MiB).
pub const CIL_PUSH_BYTES_MAX: u64 = 32 << 20;
/// Committers wait for the push to switch context when the CIL reaches this multiple of the
/// push threshold, so one checkpoint stays well under half the log.
pub const CIL_THROTTLE_MULTIPLE: u64 = 2;
/// The AIL is pushed when less than 1/`AIL_FREE_TARGET_DIVISOR` of the log is free.
pub const AIL_FREE_TARGET_DIVISOR: u64 = 4;
/// Checkpoints in flight at once: data records written (or being written) but not complete.
/// A push whose checkpoint is this many ahead of the oldest uncommitted one waits before
/// writing its data (XFS allows 4; more only contends on the writer).
pub const CHECKPOINTS_IN_FLIGHT_MAX: u64 = 4;
/// Default idle checkpoint interval (XFS: 30 s).
pub const CHECKPOINT_INTERVAL_MS_DEFAULT: u64 = 30_000;
/// A buffer log vector with more regions than this is logged as one whole-buffer region:
/// bounds the worst-case item size independently of how scattered the changes are.
pub const VECTOR_REGIONS_MAX: usize = 32;
/// Bytes of a log item header.
pub const ITEM_HEADER_BYTES: u64 = 16;
/// Largest encoded buffer item: header, count and size words, the region table, the data.
pub const BUFFER_ITEM_BYTES_MAX: u64 =
    ITEM_HEADER_BYTES + 8 + 8 * VECTOR_REGIONS_MAX as u64 + BLOCK_SIZE_MAX as u64;
/// Largest encoded free intent or done item.
pub const INTENT_ITEM_BYTES_MAX: u64 = ITEM_HEADER_BYTES + 8 + 16 * LOG_INTENT_EXTENTS_MAX as u64;
/// Largest payload the writer puts in one record (the format allows 16 MiB; records this size
/// keep one checkpoint write to a few large device writes).
pub const RECORD_PAYLOAD_BYTES_MAX: u64 = 4 << 20;
/// Bytes of the header sector of a record.
pub const RECORD_HEADER_BYTES: u64 = cairn_format::log::LOG_RECORD_HEADER_BYTES as u64;
/// Smallest log the journal runs on, in blocks: it must hold two of the largest checkpoints
/// a single transaction can need plus the fixed overheads.
pub const LOG_BLOCKS_MIN: u32 = 64;

/// Journal options; `JournalConfig::default()` is the delayed mode with XFS-like thresholds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalConfig {
    pub mode: LogMode,
    /// CIL bytes that start a background checkpoint; `None` = min(log / 8, 32 MiB).
    pub push_threshold_bytes: Option<u64>,
    /// Idle checkpoint interval of the background thread.
    pub checkpoint_interval_ms: u64,
    /// Run the background thread (timer and threshold pushes, AIL pushing). Without it,
    /// commits that pass the threshold push the CIL themselves and reservations push the AIL.
    pub background: bool,
    /// Blocks per inode cluster buffer (the buffer the journal writes logged inodes into).
    pub inode_cluster_blocks: u32,
}

impl Default for JournalConfig {
    fn default() -> Self {
        Self {
            mode: LogMode::Delayed,
            push_threshold_bytes: None,
            checkpoint_interval_ms: CHECKPOINT_INTERVAL_MS_DEFAULT,
            background: true,
            inode_cluster_blocks: 1,
        }
    }
}

impl JournalConfig {
    /// The default configuration in `mode`.
    pub fn with_mode(mode: LogMode) -> Self {
        Self {
            mode,
            ..Self::default()
        }
    }

    /// The push threshold for a log of `log_bytes`.
    pub fn push_threshold(&self, log_bytes: u64) -> u64 {
        let default = (log_bytes / CIL_PUSH_LOG_DIVISOR).min(CIL_PUSH_BYTES_MAX);
        self.push_threshold_bytes.unwrap_or(default).max(1)
    }
}
