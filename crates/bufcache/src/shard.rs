//! One AG's part of the cache: the ordered index behind a `RwLock`, and the AG's generation.
//!
//! The generation is bumped, under the write lock, after every removal from the index and
//! every stale marking; threads' lookaside tables compare it with a plain load to know when
//! to drop the stale and dead buffers their slots still own (`lookaside.rs`; the orderings
//! are in `state.rs`). It sits on its own cache line, away from the lock word that index
//! lookups write.

use std::collections::BTreeMap;
use std::sync::Arc;

use cairn_lockrank::{Rank, RwLock};
use crossbeam::utils::CachePadded;

use crate::buffer::{BufKey, Buffer};
use crate::state::Generation;

/// The index proper: every cached buffer of the AG by key.
pub(crate) type Index = BTreeMap<BufKey, Arc<Buffer>>;

#[derive(Debug)]
pub(crate) struct AgShard {
    pub(crate) index: RwLock<Index>,
    generation: CachePadded<Generation>,
}

impl AgShard {
    pub(crate) fn new() -> Self {
        Self {
            index: RwLock::new(Rank::BufferIndex, Index::new()),
            generation: CachePadded::new(Generation::new()),
        }
    }

    #[inline]
    pub(crate) fn generation(&self) -> &Generation {
        &self.generation
    }

    /// Called under the write lock after a buffer's `DEAD` or `STALE` flag was set.
    pub(crate) fn bump_generation(&self) {
        self.generation.bump();
    }
}
