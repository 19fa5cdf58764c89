//! The crate's one error type.

use cairn_btree::TreeError;

/// Errors from the allocator.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AllocError {
    /// A free-space tree operation failed (corrupt block, buffer failure).
    #[error(transparent)]
    Tree(#[from] TreeError),

    /// AG metadata disagrees with itself; names the block (filesystem block number).
    #[error("block {block}: {what}")]
    Corrupt { block: u64, what: String },

    /// The request itself is unusable.
    #[error("bad allocation request: {why}")]
    BadRequest { why: &'static str },

    /// Freeing blocks that are already free, or outside the AG.
    #[error("freeing {length} blocks at AG {ag} block {start}: {why}")]
    BadFree {
        ag: u32,
        start: u32,
        length: u32,
        why: &'static str,
    },

    /// The log could not be forced to make busy extents reusable.
    #[error("forcing the log to sequence {sequence}: {what}")]
    LogForce { sequence: u64, what: String },

    /// A free in an AG below one whose header the transaction already holds: locking it
    /// could deadlock against a transaction locking AGs in ascending order. Callers free in
    /// ascending AG order (or in a later transaction); nothing was changed.
    #[error("freeing in AG {ag} while holding AG {held}'s header (AG locks must ascend)")]
    AgOrder { ag: u32, held: u32 },

    /// An invariant check failed.
    #[error("allocator invariant broken in AG {ag}: {what}")]
    Invariant { ag: u32, what: String },
}

impl AllocError {
    pub(crate) fn corrupt(block: u64, what: impl Into<String>) -> Self {
        Self::Corrupt {
            block,
            what: what.into(),
        }
    }
}
