//! Free-space management: the per-AG free-space trees and extent allocation.
//!
//! Each AG indexes its free extents twice, by start block (`bno`) and by (length, start)
//! (`cnt`). Allocation requests name a target, a length range, alignment, a length multiple
//! and blocks to leave free; the near mode combines by-length lookups with a by-block walk
//! around the target so its cost stays bounded on fragmented AGs (see `docs/alloc.md`). Freed
//! ranges stay busy until the freeing commit is durable (`LogSequence`). The crate never calls
//! the journal: it works through `cairn_btree::Buffers` (a transaction, or `CacheContext`).
//!
//! Owns: the by-start and by-length free-extent trees, the AGF free-space fields, the AG free
//! list, the busy-extent lists, AG selection, and the allocator statistics.
//! Invariants:
//! - both trees describe the same set of extents;
//! - no two free extents overlap or touch (touching ones are merged);
//! - sum of free lengths == AGF `free_blocks`, longest == AGF `longest_free`;
//! - tree blocks come from and return to the AG free list, which is topped up before any
//!   search so a split never re-enters the allocator;
//! - no block is handed out while free-busy; AGs are locked in ascending order.
//! - a request without `use_reserve` leaves the per-AG reserve (`with_ag_reserve`) free.

mod ag;
mod allocator;
mod busy;
mod check;
mod counters;
mod error;
mod refcount;
mod request;
mod search;
mod select;
mod space;

pub use allocator::{AllocStats, Allocator, ReservedScope, TrimBatch};
pub use busy::{BUSY_CLEAR_BATCH_MAX, BusyExtent, BusyExtents, Discard, LogSequence};
pub use check::AgSummary;
pub use counters::OpCounters;
pub use error::AllocError;
pub use request::{Allocation, Mode, Request};
pub use search::{NEAR_ROUNDS_MAX, SIZE_STEPS_MAX};
pub use select::{AgSelector, SPREAD_SLOTS};
