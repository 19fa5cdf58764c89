//! In-core extent status cache: what each inode's block map says, kept in memory.
//!
//! Each inode has an ordered tree of what is known about its logical ranges: written and
//! unwritten extents, holes and delayed allocations. A lookup answers "what is at block X and
//! how far does it extend" without reading the on-disk map; a miss is filled from the on-disk
//! map, holes included. A global shrinker keeps the cache under a memory target, taking entries
//! from the least recently used inodes in calls of bounded work. See `docs/extcache.md` for the
//! design and the coherence contract with the filesystem core.
//!
//! Owns: the per-inode trees (`InodeExtents`), the reclaim list of inodes that hold entries,
//! the shrinker (`ExtentCache::shrink`, `maybe_shrink`, `ShrinkerThread`) and the statistics.
//! Invariants:
//! - entries of one inode are non-empty, never overlap, and adjacent compatible entries are
//!   merged (same state and, when mapped, physically contiguous);
//! - a cached entry agrees with the block map for every block it covers, provided the fs
//!   keeps the coherence contract; the cache never invents a mapping;
//! - delayed entries and entries overlapping a live `RangePin` are never dropped by the
//!   shrinker; `fill` never overwrites a delayed entry;
//! - an inode is on the reclaim list exactly when it holds at least one entry, and the global
//!   object count is the sum of the inodes' counts;
//! - a shrink call examines at most `scan_entries_per_call` entries over at most
//!   `inodes_walked_per_call` inodes, holds the global list lock only for O(1) steps, and never
//!   waits for an inode's lock.

mod cache;
mod clock;
mod error;
mod extent;
mod inode;
pub mod limits;
mod reclaim;
mod stats;
mod tree;
mod wake;

pub use cache::{CacheConfig, ExtentCache, ShrinkOutcome, ShrinkerThread};
pub use error::ExtCacheError;
pub use extent::{Extent, ExtentState};
pub use inode::{InodeExtents, RangePin};
pub use stats::{StatsSnapshot, WorstInode};
