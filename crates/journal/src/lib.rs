//! The journal: transactions with log space reserved up front, delayed logging through the
//! committed item list (CIL), checkpoints written as block-aligned log records, the active
//! item list (AIL) that writes metadata home and moves the log tail, log forces, and
//! recovery on open. The design, its reasons and its formulas are in `docs/journal.md`.
//!
//! Owns: the log region of the device, the CIL and its checkpoint contexts, the AIL, the
//! grant of log space, and the pins the journal puts on buffers.
//! Invariants:
//! - write-ahead: a buffer is pinned from its first commit into a context until that
//!   context's commit record is durable, and the buffer cache never writes a pinned buffer;
//! - commit records reach the log in checkpoint sequence order, each after the records it
//!   commits (after a flush of them and of every earlier device write, unless no transaction
//!   of the checkpoint orders earlier writes: `Transaction::orders_no_data`), and is itself
//!   flushed before the checkpoint counts as durable; recovery replays a checkpoint only if
//!   every record before its commit record is intact; at most `CHECKPOINTS_IN_FLIGHT_MAX`
//!   checkpoints are written at once;
//! - the tail never passes an AIL item whose home copy is not clean on stable storage, and the
//!   head never overwrites the log past the tail recorded in the newest durable record;
//! - reserved plus promised bytes never exceed the free log space, so a transaction that
//!   began never waits for log space again;
//! - recovery replays only complete checkpoints, in order, never over a newer home copy, and
//!   never an image of a block freed later in the log.

mod ail;
mod cil;
mod config;
mod error;
mod inode_ops;
mod item;
mod journal;
mod log_scan;
mod recovery;
mod reservation;
mod space;
mod stats;
mod transaction;
mod writer;

pub use ail::Ail;
pub use cil::Cil;
pub use config::{
    AIL_FREE_TARGET_DIVISOR, BUFFER_ITEM_BYTES_MAX, CHECKPOINT_INTERVAL_MS_DEFAULT,
    CHECKPOINTS_IN_FLIGHT_MAX, CIL_PUSH_BYTES_MAX, CIL_PUSH_LOG_DIVISOR, CIL_THROTTLE_MULTIPLE,
    INTENT_ITEM_BYTES_MAX, JournalConfig, LogMode, RECORD_PAYLOAD_BYTES_MAX, VECTOR_REGIONS_MAX,
};
pub use error::JournalError;
pub use inode_ops::{InodeClusterOps, inode_cluster_ops, inode_cluster_spec};
pub use item::{CommitSequence, IntentId, IntentWork};
pub use journal::{CompletionHook, ForceHandle, Journal};
pub use recovery::{PendingIntent, RecoveryReport};
pub use reservation::{Reservation, buffer_item_bytes_max, checkpoint_bytes_max, inode_item_bytes};
pub use stats::JournalStats;
pub use transaction::Transaction;

pub use cairn_format::log::{
    FreeExtent, RefcountOp, RefcountUpdate, SHIFT_NOTHING_MOVED, ShiftIntent, ShiftKind,
};
