//! The crate's one error type. Every variant names the block (and length) it concerns.

use cairn_blockdev::DeviceError;
use cairn_format::{FormatError, FsBlock};

/// Errors from the buffer cache.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BufCacheError {
    /// A configuration value is unusable with this device.
    #[error("buffer cache config: {field} = {value}: {why}")]
    Config {
        field: &'static str,
        value: u64,
        why: &'static str,
    },

    /// A buffer address is outside the filesystem, crosses an AG or has a bad length.
    #[error("buffer at block {block} of {block_count} blocks: {why}")]
    BadAddress {
        block: FsBlock,
        block_count: u32,
        why: &'static str,
    },

    /// The device failed to read the buffer; nothing was cached.
    #[error("reading {block_count} blocks at block {block} failed: {source}")]
    Read {
        block: FsBlock,
        block_count: u32,
        source: DeviceError,
    },

    /// The buffer was read but failed its read verifier; nothing was cached.
    #[error("{block_count} blocks at block {block} failed read verification: {source}")]
    Verify {
        block: FsBlock,
        block_count: u32,
        source: FormatError,
    },

    /// A dirty buffer failed its write check; it was not written and stays dirty.
    #[error("{block_count} blocks at block {block} failed the write check, not written: {source}")]
    WriteVerify {
        block: FsBlock,
        block_count: u32,
        source: FormatError,
    },

    /// The device failed a write-back; the buffers in it stay dirty and queued.
    #[error("writing {block_count} blocks at block {block} failed: {source}")]
    Write {
        block: FsBlock,
        block_count: u32,
        source: DeviceError,
    },

    /// A live buffer with the same start block but another length is cached: two overlapping
    /// views of one block would let one overwrite the other's changes.
    #[error("block {block} is cached as {cached_blocks} blocks, requested as {requested_blocks}")]
    LengthMismatch {
        block: FsBlock,
        cached_blocks: u32,
        requested_blocks: u32,
    },

    /// `try_get` found the buffer locked by another holder.
    #[error("buffer at block {block} is locked by another holder")]
    WouldBlock { block: FsBlock },

    /// A byte range given to a buffer operation does not fit the buffer.
    #[error("buffer at block {block}: byte range {start}..{end} outside its {len_bytes} bytes")]
    Range {
        block: FsBlock,
        start: usize,
        end: usize,
        len_bytes: usize,
    },

    /// `unpin` on a buffer that is not pinned (a journal accounting bug).
    #[error("buffer at block {block} unpinned but not pinned")]
    NotPinned { block: FsBlock },

    /// `check_invariants` found the cache inconsistent.
    #[error("buffer cache invariant broken: {what}")]
    Invariant { what: String },
}
