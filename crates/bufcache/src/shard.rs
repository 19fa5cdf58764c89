//! One AG's part of the cache: the ordered index behind a `RwLock`, and the AG's generation.
//!
//! The generation is bumped, under the write lock, after every removal from the index and
//! every stale marking; threads' lookaside tables compare it with a plain load to know when
//! to drop the stale and dead buffers their slots still own (`lookaside.rs`). It sits on its
//! own cache line, away from the lock word that index lookups write.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use cairn_lockrank::{Rank, RwLock};
use crossbeam::utils::CachePadded;

use crate::buffer::{BufKey, Buffer};

/// The index proper: every cached buffer of the AG by key.
pub(crate) type Index = BTreeMap<BufKey, Arc<Buffer>>;

#[derive(Debug)]
pub(crate) struct AgShard {
    pub(crate) index: RwLock<Index>,
    generation: CachePadded<AtomicU64>,
}

impl AgShard {
    pub(crate) fn new() -> Self {
        Self {
            index: RwLock::new(Rank::BufferIndex, Index::new()),
            generation: CachePadded::new(AtomicU64::new(0)),
        }
    }

    #[inline]
    pub(crate) fn generation(&self) -> &AtomicU64 {
        &self.generation
    }

    /// Called under the write lock after a buffer's `DEAD` or `STALE` flag was set: the
    /// release orders the flag before the new generation for the threads' sweeps.
    pub(crate) fn bump_generation(&self) {
        self.generation.fetch_add(1, Ordering::Release);
    }
}
