//! Work counters of one allocation or free.
//!
//! Wall-clock time on a shared machine mixes the allocator's own work with scheduling and
//! cache noise. These counters are deterministic for a given state and request, so a slow
//! operation can be told apart: one that did more work shows it here, one that was only
//! descheduled does not.

/// What one `allocate_traced` or `free_traced` call did, over every AG it tried.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpCounters {
    /// AGs whose headers were read (locked).
    pub ags_tried: u64,
    /// Free-space records the searches looked at, the free-list refill's included.
    pub records_visited: u64,
    /// Busy ranges looked at while trimming candidates.
    pub busy_ranges_visited: u64,
    /// Busy ranges dropped because their freeing commit had become durable.
    pub busy_cleared: u64,
    /// Searches run to top up the AG free list.
    pub free_list_refills: u64,
    /// Blocks moved from free space onto the free list.
    pub free_list_blocks_added: u64,
    /// Blocks moved from the free list back to free space (over twice the need).
    pub free_list_blocks_returned: u64,
    /// Blocks the free-space trees took from the free list (splits and new roots).
    pub tree_blocks_taken: u64,
    /// Blocks the free-space trees gave back (merges and root collapses).
    pub tree_blocks_freed: u64,
    /// Log forces issued to make busy ranges usable.
    pub log_forces: u64,
    /// Near-mode search rounds (one by-block step each way and one by-length probe).
    pub near_rounds: u64,
    /// Near-mode searches stopped by `NEAR_ROUNDS_MAX` rather than by their own bounds.
    pub near_round_caps: u64,
}

impl OpCounters {
    /// Adds `other`'s counts to `self`'s.
    pub fn add(&mut self, other: &OpCounters) {
        self.ags_tried += other.ags_tried;
        self.records_visited += other.records_visited;
        self.busy_ranges_visited += other.busy_ranges_visited;
        self.busy_cleared += other.busy_cleared;
        self.free_list_refills += other.free_list_refills;
        self.free_list_blocks_added += other.free_list_blocks_added;
        self.free_list_blocks_returned += other.free_list_blocks_returned;
        self.tree_blocks_taken += other.tree_blocks_taken;
        self.tree_blocks_freed += other.tree_blocks_freed;
        self.log_forces += other.log_forces;
        self.near_rounds += other.near_rounds;
        self.near_round_caps += other.near_round_caps;
    }
}
