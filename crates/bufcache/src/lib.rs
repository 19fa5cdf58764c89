//! The metadata buffer cache: every metadata read and write of cairn goes through it.
//!
//! A buffer is identified by its start block and length in blocks (`BufKey`). `get` returns it
//! held and locked (`BufGuard`), reading and verifying it on a miss; `get_new` creates it
//! zeroed without reading; `try_get` fails with `WouldBlock` instead of waiting for the lock.
//! `read_ahead` caches the missing blocks of a range with one device read (an inode chunk).
//! Each AG has its own index (an ordered map behind a `RwLock`) and, in front of it, each
//! thread has a small direct-mapped lookaside array per AG (thread-local: found without a lock
//! or a shared read-modify-write). Guards record dirty byte ranges
//! for the journal; pinned buffers are not written home; a delayed-write queue writes dirty
//! buffers in disk order; an LRU with second chances keeps memory under a limit. The design
//! and its reasons are in `docs/bufcache.md`. The lock-free part (the state word's holds,
//! pins and flags, the AG generations) is in `state.rs`, generic over the atomic so the loom
//! models in `models.rs` check the very functions the cache runs.
//!
//! Owns: the cached buffers, the per-AG indexes and generations, the threads' lookaside slot
//! tables for this cache, the LRU, the delayed-write queue and the cache statistics.
//! Invariants:
//! - at most one live (not stale) buffer per start block is in the index, so no block has two
//!   in-memory copies;
//! - a lookup never returns a stale buffer, a dead (removed) one, or one whose first read
//!   failed: a lookaside hit must match block and length, its hold must see neither stale nor
//!   dead, and it is checked again under the buffer lock;
//! - every removal from the index marks the buffer dead, and every stale marking marks it
//!   stale, under the AG's write lock, then bumps the AG's generation; a thread's slots hold
//!   no stale or dead buffer once swept at the current generation, and the thread that
//!   removes or invalidates a buffer clears its own slot at once;
//! - reclaim frees only buffers with no hold, no pin and no unwritten change;
//! - stale buffers are never written home; pinned ones are not written until unpinned;
//! - buffer memory is owned by `Arc`: nothing that can reach a buffer outlives it; dead
//!   buffers kept by a thread's slots number at most slots x AGs per thread and cache, and go
//!   on that thread's next lookup in the AG;
//! - no shard lock is held across device I/O or while waiting for a buffer lock.

mod buffer;
mod cache;
mod config;
mod delwri;
mod error;
mod guard;
mod invariants;
mod lookaside;
#[cfg(test)]
mod models;
mod ops;
mod ranges;
mod readahead;
mod reclaim;
mod shard;
mod state;
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
