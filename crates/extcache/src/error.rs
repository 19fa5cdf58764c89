//! The crate's one error type.

/// Errors from the extent status cache. Every variant is bad input from the caller (or a
/// broken invariant found by `check_invariants`); none of them leaves the cache changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ExtCacheError {
    #[error("range at logical block {start} has zero length")]
    EmptyRange { start: u64 },

    #[error("range at logical block {start} of {block_count} blocks runs past the last block")]
    LogicalOverflow { start: u64, block_count: u64 },

    #[error(
        "extent at logical block {start} of {block_count} blocks maps physical block \
         {physical_block}, which runs past the last block"
    )]
    PhysicalOverflow {
        start: u64,
        block_count: u64,
        physical_block: u64,
    },

    #[error(
        "fill of [{range_start}, +{range_count}): mapping at {start} of {block_count} blocks \
         lies outside the range"
    )]
    FillOutsideRange {
        range_start: u64,
        range_count: u64,
        start: u64,
        block_count: u64,
    },

    #[error(
        "fill mappings are not sorted and disjoint: mapping at {start} begins before the \
         previous one ends at {previous_end}"
    )]
    FillUnsorted { start: u64, previous_end: u64 },

    #[error("fill mapping at {start} is {state}; only written, unwritten and hole come from disk")]
    FillNotOnDisk { start: u64, state: &'static str },

    #[error("bad cache configuration: {what} (expected {expected}, found {found})")]
    BadConfig {
        what: &'static str,
        expected: &'static str,
        found: u64,
    },

    #[error("a shrinker thread is already running for this cache")]
    ShrinkerRunning,

    #[error("cannot start the shrinker thread: {reason}")]
    Spawn { reason: String },

    #[error("invariant broken: {what}")]
    Invariant { what: String },
}
