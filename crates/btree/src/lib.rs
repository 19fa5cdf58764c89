//! A generic on-disk B+tree over the buffer cache, used by every tree of cairn: the per-AG
//! free-space and inode trees, file extent maps and directory hash trees.
//!
//! The tree is generic over a record/key codec (`TreeCodec`, built on the format crate's
//! `OnDisk` types) and gets its buffers and blocks through a context (`Buffers` and
//! `TreeContext`), so it does not depend on the journal: a transaction implements the
//! context, and so does `CacheContext` (a plain buffer cache, for tools and tests). Every change
//! goes through a held `BufGuard` and marks exactly the bytes it changed dirty, so the journal
//! logs tight ranges.
//!
//! Owns: the block layout of tree nodes (via `BtreeLayout`), searches, cursors, splits, merges,
//! rebalancing, root growth and collapse, and the whole-tree `verify` that fsck uses.
//! Invariants:
//! - keys strictly increase along each level, and every node key equals the first key of the
//!   subtree it points to;
//! - every block at a level links to its left and right neighbours at that level (`NULL_BLOCK`
//!   at the ends), every leaf is at level 0, and children sit one level below their parent;
//! - every block but the root holds at least half its capacity (`min_entries`);
//! - an empty tree is a root leaf with no records; a node root has at least two children;
//! - every block carries the tree's kind, owner and its own address in its header.
//! - an insert takes every block its splits need before it changes anything: one that finds
//!   no block fails whole and hands back what it took.

mod codec;
mod context;
mod cursor;
mod delete;
mod error;
mod insert;
mod node;
mod ops;
mod tree;
mod verify;

pub use codec::{BmapCodec, BnoCodec, CntCodec, InoCodec, RefcountCodec, TreeCodec};
pub use context::{Buffers, CacheContext, TreeContext};
pub use cursor::Cursor;
pub use error::TreeError;
pub use ops::{BtreeOps, ops_for};
pub use tree::{Btree, Lookup, TreeSpec};
pub use verify::{TreeProblem, VerifyReport};
