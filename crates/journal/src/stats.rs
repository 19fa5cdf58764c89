//! Journal counters: atomics bumped on the hot paths, read as a snapshot.

use std::sync::atomic::{AtomicU64, Ordering};

/// A snapshot of the journal's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JournalStats {
    /// Transactions begun and committed (with changes).
    pub transactions: u64,
    pub commits: u64,
    /// Bytes and device writes of log records, and device flushes the log issued.
    pub log_bytes: u64,
    pub log_writes: u64,
    pub log_flushes: u64,
    /// Checkpoints written (contexts with items).
    pub checkpoints: u64,
    /// Calls to `force` and `force_all`.
    pub forces: u64,
    /// Items formatted into the CIL, and of those, how many replaced an earlier copy.
    pub items_logged: u64,
    pub items_relogged: u64,
    /// AIL push passes, and items they sent home.
    pub ail_pushes: u64,
    pub ail_items_pushed: u64,
    /// Reservations that had to wait for log space.
    pub reservation_waits: u64,
    /// Item-less records written to move the recorded tail (or mark a clean unmount).
    pub marker_records: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub(crate) transactions: AtomicU64,
    pub(crate) commits: AtomicU64,
    pub(crate) log_bytes: AtomicU64,
    pub(crate) log_writes: AtomicU64,
    pub(crate) log_flushes: AtomicU64,
    pub(crate) checkpoints: AtomicU64,
    pub(crate) forces: AtomicU64,
    pub(crate) items_logged: AtomicU64,
    pub(crate) items_relogged: AtomicU64,
    pub(crate) ail_pushes: AtomicU64,
    pub(crate) ail_items_pushed: AtomicU64,
    pub(crate) reservation_waits: AtomicU64,
    pub(crate) marker_records: AtomicU64,
}

pub(crate) fn bump(counter: &AtomicU64, by: u64) {
    counter.fetch_add(by, Ordering::Relaxed);
}

impl Stats {
    pub(crate) fn snapshot(&self) -> JournalStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        JournalStats {
            transactions: get(&self.transactions),
            commits: get(&self.commits),
            log_bytes: get(&self.log_bytes),
            log_writes: get(&self.log_writes),
            log_flushes: get(&self.log_flushes),
            checkpoints: get(&self.checkpoints),
            forces: get(&self.forces),
            items_logged: get(&self.items_logged),
            items_relogged: get(&self.items_relogged),
            ail_pushes: get(&self.ail_pushes),
            ail_items_pushed: get(&self.ail_items_pushed),
            reservation_waits: get(&self.reservation_waits),
            marker_records: get(&self.marker_records),
        }
    }
}
