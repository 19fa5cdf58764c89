//! One cached buffer: its identity, its lock-free state word (`state.rs` has the protocol),
//! and its locked contents.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicU32;

use cairn_blockdev::AlignedBuf;
use cairn_format::{FsBlock, Lsn};
use parking_lot::Mutex;

use crate::BufCacheError;
use crate::ops::BufferOps;
use crate::ranges::DirtyRanges;
use crate::state::{DIRTY, STALE, StateWord, pins};

/// A buffer's identity: start block and length in blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BufKey {
    pub block: FsBlock,
    pub block_count: u32,
}

impl BufKey {
    pub fn new(block: FsBlock, block_count: u32) -> Self {
        Self { block, block_count }
    }

    /// A one-block buffer.
    pub fn single(block: u64) -> Self {
        Self::new(FsBlock(block), 1)
    }

    /// First block past the buffer.
    pub fn end(&self) -> u64 {
        self.block.0 + u64::from(self.block_count)
    }
}

/// The part of a buffer only its lock holder touches.
#[derive(Debug)]
pub(crate) struct BufData {
    pub(crate) bytes: AlignedBuf,
    /// The contents are valid (read and verified, or created). False only while the first
    /// read is in flight or after it failed.
    pub(crate) uptodate: bool,
    pub(crate) ops: &'static dyn BufferOps,
    pub(crate) dirty: DirtyRanges,
    /// LSN to stamp on write-back, set by whoever logged the last change.
    pub(crate) lsn: Option<Lsn>,
}

/// A cached buffer. Owned through `Arc`: the index, a lookaside slot, the LRU, the delwri
/// queue, guards and handles each own a reference, so the memory lives while any can reach it.
pub(crate) struct Buffer {
    pub(crate) key: BufKey,
    /// Index of the AG shard the buffer lives in.
    pub(crate) ag: usize,
    pub(crate) state: StateWord,
    pub(crate) lru_ref: AtomicU32,
    pub(crate) data: Arc<Mutex<BufData>>,
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buffer")
            .field("key", &self.key)
            .field("state", &format_args!("{:#x}", self.state.peek()))
            .finish_non_exhaustive()
    }
}

impl Buffer {
    /// A new buffer of `bytes`, with one hold (the inserter's).
    pub(crate) fn new(
        key: BufKey,
        ag: usize,
        bytes: AlignedBuf,
        ops: &'static dyn BufferOps,
    ) -> Self {
        let data = BufData {
            bytes,
            uptodate: false,
            ops,
            dirty: DirtyRanges::default(),
            lsn: None,
        };
        Self {
            key,
            ag,
            state: StateWord::held_once(),
            lru_ref: AtomicU32::new(1),
            data: Arc::new(Mutex::new(data)),
        }
    }

    pub(crate) fn len_bytes(&self, block_size: u32) -> u64 {
        u64::from(self.key.block_count) * u64::from(block_size)
    }
}

/// An unlocked reference to a buffer, for the journal: it keeps the buffer's memory alive
/// (not its place in the cache; a pin does that) and can unpin it when a checkpoint completes.
#[derive(Clone)]
pub struct BufHandle {
    pub(crate) buffer: Arc<Buffer>,
}

impl fmt::Debug for BufHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("BufHandle").field(&self.buffer.key).finish()
    }
}

impl BufHandle {
    pub fn key(&self) -> BufKey {
        self.buffer.key
    }

    /// Drops one pin: the changes it stood for are checkpointed, so the buffer may be written
    /// home. `NotPinned` if it was not pinned.
    pub fn unpin(&self) -> Result<(), BufCacheError> {
        if self.buffer.state.unpin() {
            Ok(())
        } else {
            Err(BufCacheError::NotPinned {
                block: self.buffer.key.block,
            })
        }
    }

    pub fn pin_count(&self) -> u32 {
        pins(self.buffer.state.load())
    }

    pub fn is_stale(&self) -> bool {
        self.buffer.state.load() & STALE != 0
    }

    pub fn is_dirty(&self) -> bool {
        self.buffer.state.load() & DIRTY != 0
    }
}
