//! One cached buffer: its identity, its lock-free state word, and its locked contents.
//!
//! The state word packs everything a lock-free reader or the reclaimer must decide on in one
//! atomic, so "take a hold" and "mark dead if unheld" are single read-modify-writes on the same
//! word and cannot interleave: either the hold lands first and reclaim's compare-exchange
//! fails, or reclaim lands first and the reader sees `DEAD` and lets go.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use cairn_blockdev::AlignedBuf;
use cairn_format::{FsBlock, Lsn};
use parking_lot::Mutex;

use crate::BufCacheError;
use crate::ops::BufferOps;
use crate::ranges::DirtyRanges;

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

/// Holds: callers with a reference from `get` (or write-back), bits 0..24.
pub(crate) const HOLD_ONE: u64 = 1;
pub(crate) const HOLD_MASK: u64 = (1 << 24) - 1;
/// Pins: log items whose changes are not checkpointed yet, bits 24..48.
pub(crate) const PIN_ONE: u64 = 1 << 24;
pub(crate) const PIN_MASK: u64 = ((1 << 24) - 1) << 24;
/// Has changes not yet written home.
pub(crate) const DIRTY: u64 = 1 << 48;
/// Freed metadata: never written home, never returned by a lookup.
pub(crate) const STALE: u64 = 1 << 49;
/// Removed from the index; a lookup that holds it must let go and look again.
pub(crate) const DEAD: u64 = 1 << 50;
/// Has an entry in the LRU queue.
pub(crate) const ON_LRU: u64 = 1 << 51;
/// Has an entry in the delayed-write queue.
pub(crate) const DELWRI_Q: u64 = 1 << 52;

/// What reclaim may not take: anything held, pinned, dirty or already dead.
pub(crate) const UNRECLAIMABLE: u64 = HOLD_MASK | PIN_MASK | DIRTY | DEAD;

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
    pub(crate) state: AtomicU64,
    pub(crate) lru_ref: AtomicU32,
    pub(crate) data: Arc<Mutex<BufData>>,
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buffer")
            .field("key", &self.key)
            .field(
                "state",
                &format_args!("{:#x}", self.state.load(Ordering::Relaxed)),
            )
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
            state: AtomicU64::new(HOLD_ONE),
            lru_ref: AtomicU32::new(1),
            data: Arc::new(Mutex::new(data)),
        }
    }

    #[inline]
    pub(crate) fn load_state(&self) -> u64 {
        self.state.load(Ordering::Acquire)
    }

    /// Takes a hold; returns the state before. The caller checks `STALE`/`DEAD` if needed.
    #[inline]
    pub(crate) fn hold(&self) -> u64 {
        let prev = self.state.fetch_add(HOLD_ONE, Ordering::Acquire);
        debug_assert!(prev & HOLD_MASK < HOLD_MASK, "hold count overflow");
        prev
    }

    /// Drops one hold; returns the state before.
    #[inline]
    pub(crate) fn unhold(&self) -> u64 {
        let prev = self.state.fetch_sub(HOLD_ONE, Ordering::Release);
        debug_assert!(prev & HOLD_MASK > 0, "hold count underflow");
        prev
    }

    pub(crate) fn set_flags(&self, flags: u64) -> u64 {
        self.state.fetch_or(flags, Ordering::AcqRel)
    }

    pub(crate) fn clear_flags(&self, flags: u64) -> u64 {
        self.state.fetch_and(!flags, Ordering::AcqRel)
    }

    pub(crate) fn len_bytes(&self, block_size: u32) -> u64 {
        u64::from(self.key.block_count) * u64::from(block_size)
    }

    pub(crate) fn unpin(&self) -> Result<(), BufCacheError> {
        let result = self
            .state
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
                (s & PIN_MASK != 0).then_some(s - PIN_ONE)
            });
        result.map(|_| ()).map_err(|_| BufCacheError::NotPinned {
            block: self.key.block,
        })
    }
}

/// Hold and pin count of a state word.
pub(crate) fn holds(state: u64) -> u64 {
    state & HOLD_MASK
}

pub(crate) fn pins(state: u64) -> u32 {
    ((state & PIN_MASK) >> 24) as u32
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
        self.buffer.unpin()
    }

    pub fn pin_count(&self) -> u32 {
        pins(self.buffer.load_state())
    }

    pub fn is_stale(&self) -> bool {
        self.buffer.load_state() & STALE != 0
    }

    pub fn is_dirty(&self) -> bool {
        self.buffer.load_state() & DIRTY != 0
    }
}
