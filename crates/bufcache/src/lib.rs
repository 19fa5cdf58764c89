//! The metadata buffer cache: every metadata read and write of cairn goes through it.
//!
//! A buffer is identified by its start block and length in blocks (`BufKey`). `get` returns it
//! held and locked (`BufGuard`), reading and verifying it on a miss; `get_new` creates it
//! zeroed without reading; `try_get` fails with `WouldBlock` instead of waiting for the lock.
//! Each AG has its own index (an ordered map behind a `RwLock`) and, in front of it, a small
//! direct-mapped lookaside array read under the same lock. Guards record dirty byte ranges
//! for the journal; pinned buffers are not written home; a delayed-write queue writes dirty
//! buffers in disk order; an LRU with second chances keeps memory under a limit. The design
//! and its reasons are in `docs/bufcache.md`.
//!
//! Owns: the cached buffers, the per-AG indexes and lookaside slots, the LRU, the delayed-write
//! queue and the cache statistics.
//! Invariants:
//! - at most one live (not stale) buffer per start block is in the index, so no block has two
//!   in-memory copies;
//! - a lookup never returns a stale buffer, a dead (removed) one, or one whose first read
//!   failed: a lookaside hit must match block and length, and is re-checked after its hold;
//! - every removal from the index marks the buffer dead and clears its slot under the AG's
//!   write lock; slots change only under that lock and name only live buffers in the index;
//! - reclaim frees only buffers with no hold, no pin and no unwritten change;
//! - stale buffers are never written home; pinned ones are not written until unpinned;
//! - buffer memory is owned by `Arc`: nothing that can reach a buffer outlives it;
//! - no shard lock is held across device I/O or while waiting for a buffer lock.

mod buffer;
mod cache;
mod config;
mod delwri;
mod error;
mod guard;
mod invariants;
mod lookaside;
mod ops;
mod ranges;
mod reclaim;
mod shard;
mod stats;
pub mod trace;

pub use buffer::{BufHandle, BufKey};
pub use cache::BufferCache;
pub use config::{
    BUFFER_BYTES_MAX, CacheConfig, DELWRI_BATCH_BYTES_DEFAULT, LOOKASIDE_REPLACE_AFTER,
    LOOKASIDE_SLOTS_DEFAULT, MEMORY_LIMIT_BYTES_DEFAULT,
};
pub use delwri::FlushReport;
pub use error::BufCacheError;
pub use guard::BufGuard;
pub use ops::{BufferOps, HeaderOps, LRU_REF_MAX, ReadSpec};
pub use reclaim::ReclaimReport;
pub use stats::StatsSnapshot;
