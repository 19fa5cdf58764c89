//! What the cache says about one logical range: the public `Extent` and the stored `Entry`.

use crate::error::ExtCacheError;
use std::sync::atomic::{AtomicBool, Ordering};

/// The state of a logical range, as the block map says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExtentState {
    /// Allocated and written: reads return the data at `physical_block`.
    Written { physical_block: u64 },
    /// Allocated but not yet written: reads return zeros; a write converts it.
    Unwritten { physical_block: u64 },
    /// Delayed allocation: dirty data with no blocks yet. Exists only in memory, so the
    /// shrinker never drops it and `fill` never overwrites it.
    Delayed,
    /// Known to be unmapped. Caching holes saves a map walk on every sparse read.
    Hole,
}

impl ExtentState {
    /// The physical block of the range's first block, if the range is mapped.
    pub fn physical_block(self) -> Option<u64> {
        match self {
            ExtentState::Written { physical_block } | ExtentState::Unwritten { physical_block } => {
                Some(physical_block)
            }
            ExtentState::Delayed | ExtentState::Hole => None,
        }
    }

    /// A short name for messages.
    pub fn name(self) -> &'static str {
        match self {
            ExtentState::Written { .. } => "written",
            ExtentState::Unwritten { .. } => "unwritten",
            ExtentState::Delayed => "delayed",
            ExtentState::Hole => "hole",
        }
    }

    /// The same state moved `offset` blocks into the range (physical block advanced).
    pub(crate) fn advanced(self, offset: u64) -> ExtentState {
        match self {
            ExtentState::Written { physical_block } => ExtentState::Written {
                physical_block: physical_block.wrapping_add(offset),
            },
            ExtentState::Unwritten { physical_block } => ExtentState::Unwritten {
                physical_block: physical_block.wrapping_add(offset),
            },
            other => other,
        }
    }
}

/// A logical range and its state: the answer to "what is at block X and how far does it go".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Extent {
    pub logical_block: u64,
    pub block_count: u64,
    pub state: ExtentState,
}

impl Extent {
    /// Builds an extent, refusing empty ranges and ranges that overflow logically or physically.
    pub fn new(
        logical_block: u64,
        block_count: u64,
        state: ExtentState,
    ) -> Result<Self, ExtCacheError> {
        let extent = Extent {
            logical_block,
            block_count,
            state,
        };
        extent.validate()?;
        Ok(extent)
    }

    /// First block past the range. Only meaningful for a validated extent.
    pub fn end_block(&self) -> u64 {
        self.logical_block.saturating_add(self.block_count)
    }

    /// Whether `block` lies in the range.
    pub fn contains(&self, block: u64) -> bool {
        block >= self.logical_block && block - self.logical_block < self.block_count
    }

    /// The state of one block of the range (the physical block advanced to it).
    pub fn state_at(&self, block: u64) -> Option<ExtentState> {
        self.contains(block)
            .then(|| self.state.advanced(block - self.logical_block))
    }

    /// Checks the range: not empty, no logical overflow, no physical overflow.
    pub fn validate(&self) -> Result<(), ExtCacheError> {
        check_range(self.logical_block, self.block_count)?;
        if let Some(physical_block) = self.state.physical_block()
            && physical_block.checked_add(self.block_count).is_none()
        {
            return Err(ExtCacheError::PhysicalOverflow {
                start: self.logical_block,
                block_count: self.block_count,
                physical_block,
            });
        }
        Ok(())
    }
}

/// Checks a logical range `[start, start + block_count)`: not empty, representable.
pub(crate) fn check_range(start: u64, block_count: u64) -> Result<u64, ExtCacheError> {
    if block_count == 0 {
        return Err(ExtCacheError::EmptyRange { start });
    }
    start
        .checked_add(block_count)
        .ok_or(ExtCacheError::LogicalOverflow { start, block_count })
}

/// One cached entry, keyed by its logical start in the inode's tree.
///
/// `referenced` is set by lookups under the tree's read lock (an atomic, so readers never need
/// the write lock) and cleared by the shrinker, which spares a referenced entry once.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) block_count: u64,
    pub(crate) state: ExtentState,
    pub(crate) referenced: AtomicBool,
}

impl Entry {
    pub(crate) fn new(block_count: u64, state: ExtentState, referenced: bool) -> Self {
        Entry {
            block_count,
            state,
            referenced: AtomicBool::new(referenced),
        }
    }

    pub(crate) fn is_referenced(&self) -> bool {
        self.referenced.load(Ordering::Relaxed)
    }

    /// Sets the referenced bit, writing only when it is clear so that readers sharing a hot
    /// entry do not keep dirtying its cache line.
    pub(crate) fn mark_referenced(&self) {
        if !self.referenced.load(Ordering::Relaxed) {
            self.referenced.store(true, Ordering::Relaxed);
        }
    }

    pub(crate) fn clear_referenced(&self) {
        self.referenced.store(false, Ordering::Relaxed);
    }

    pub(crate) fn to_extent(&self, logical_block: u64) -> Extent {
        Extent {
            logical_block,
            block_count: self.block_count,
            state: self.state,
        }
    }

    /// Whether the shrinker may drop this entry on its own account (pins are checked apart).
    pub(crate) fn is_reclaimable(&self) -> bool {
        !matches!(self.state, ExtentState::Delayed)
    }
}

/// Whether `left` (ending where `right` begins) and `right` can be one entry.
pub(crate) fn can_merge(left: &Entry, right: &Entry) -> bool {
    match (left.state, right.state) {
        (ExtentState::Hole, ExtentState::Hole) | (ExtentState::Delayed, ExtentState::Delayed) => {
            true
        }
        (
            ExtentState::Written { physical_block: l },
            ExtentState::Written { physical_block: r },
        )
        | (
            ExtentState::Unwritten { physical_block: l },
            ExtentState::Unwritten { physical_block: r },
        ) => l.checked_add(left.block_count) == Some(r),
        _ => false,
    }
}
