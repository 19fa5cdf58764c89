//! The crate's one error type. Corruption names the block (filesystem block number).

use cairn_bufcache::BufCacheError;
use cairn_format::FormatError;

/// Errors from tree operations.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TreeError {
    /// The buffer of a tree block could not be had (read, verify or range failure).
    #[error("tree block {block}: {source}")]
    Buffer {
        block: u64,
        #[source]
        source: BufCacheError,
    },

    /// A tree block holds something the tree's invariants forbid.
    #[error("tree block {block}: corrupt: {what}")]
    Corrupt { block: u64, what: String },

    /// A record or key in a tree block failed to decode.
    #[error("tree block {block}: {source}")]
    Format {
        block: u64,
        #[source]
        source: FormatError,
    },

    /// `insert` of a key the tree already holds.
    #[error("key {key} is already in the tree")]
    Duplicate { key: String },

    /// `delete` or `update` of a key the tree does not hold.
    #[error("key {key} is not in the tree")]
    NotFound { key: String },

    /// `update_at` with a record whose key would leave the record out of order.
    #[error("updating a record in block {block} would put key {key} out of order")]
    OutOfOrder { block: u64, key: String },

    /// The context had no block to give the tree.
    #[error("no block available for tree growth: {why}")]
    NoSpace { why: String },

    /// The tree description is unusable (layout, capacity).
    #[error("tree spec: {why}")]
    Spec { why: &'static str },

    /// Growing the tree would exceed `BTREE_LEVELS_MAX`.
    #[error("tree would grow to {levels} levels, more than the format allows")]
    TooDeep { levels: u32 },

    /// A failure of the context itself (for example the journal refusing a buffer).
    #[error("tree context: {what}")]
    Context { what: String },
}

impl TreeError {
    pub(crate) fn corrupt(block: u64, what: impl Into<String>) -> Self {
        Self::Corrupt {
            block,
            what: what.into(),
        }
    }
}
