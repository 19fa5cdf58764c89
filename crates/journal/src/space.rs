//! Log space accounting: the physical head and tail and the grant of promised bytes.
//!
//! `used` is the distance from the *durable* tail (the one recorded in a flushed record) to
//! the head: the head may never overwrite what a crash-time recovery would start from.
//! `grant` is what live transactions reserved plus what the CIL contexts (current and being
//! written) may take. A reservation is granted when `used + grant + bytes <= capacity`;
//! waiters are served first come, first served (tickets), so none starves.
//! `kept_bytes` of the capacity are kept for transactions that finish an intent (the second
//! half of a free): other reservations may not use them. An unfinished intent holds the tail
//! until its done item is logged, so if its finishing transaction queued behind reservations
//! waiting for the tail to move, none would ever be served.
//! `in_flight` holds the start of every checkpoint whose data records are written but which
//! is not complete yet (its items are not in the AIL): the tail never passes one.

use std::collections::BTreeMap;

use cairn_format::Lsn;

use crate::writer::Layout;

#[derive(Debug)]
pub(crate) struct Space {
    pub(crate) head: Lsn,
    /// The tail in memory: nothing older than it is needed any more.
    pub(crate) tail: Lsn,
    /// The tail recorded in the newest durable record.
    pub(crate) durable_tail: Lsn,
    pub(crate) grant_bytes: u64,
    pub(crate) capacity_bytes: u64,
    /// Capacity only transactions finishing an intent may use.
    pub(crate) kept_bytes: u64,
    pub(crate) next_ticket: u64,
    pub(crate) serving_ticket: u64,
    /// Start LSN of every checkpoint in flight, by sequence.
    pub(crate) in_flight: BTreeMap<u64, Lsn>,
    /// Start and end of the newest marker record that named itself as the tail (nothing
    /// older needed): while the log holds only that record, it is covered.
    pub(crate) covering_marker: Option<(Lsn, Lsn)>,
}

impl Space {
    pub(crate) fn new(head: Lsn, capacity_bytes: u64, kept_bytes: u64) -> Self {
        Self {
            head,
            tail: head,
            durable_tail: head,
            grant_bytes: 0,
            capacity_bytes,
            kept_bytes,
            next_ticket: 0,
            covering_marker: None,
            serving_ticket: 0,
            in_flight: BTreeMap::new(),
        }
    }

    pub(crate) fn used_bytes(&self, layout: &Layout) -> u64 {
        layout.distance_blocks(self.durable_tail, self.head) * layout.block_size
    }

    /// Whether a reservation of `bytes` fits, outside the space kept for finishing intents.
    pub(crate) fn fits(&self, layout: &Layout, bytes: u64) -> bool {
        self.fits_finishing(layout, bytes + self.kept_bytes)
    }

    /// Whether a transaction finishing an intent fits (it may use the kept space).
    pub(crate) fn fits_finishing(&self, layout: &Layout, bytes: u64) -> bool {
        self.used_bytes(layout) + self.grant_bytes + bytes <= self.capacity_bytes
    }

    pub(crate) fn has_waiters(&self) -> bool {
        self.next_ticket != self.serving_ticket
    }

    /// The oldest start of a checkpoint in flight.
    pub(crate) fn in_flight_min(&self) -> Option<Lsn> {
        self.in_flight.values().copied().min()
    }

    /// Whether the log holds nothing but the newest covering marker: its tail moved only
    /// past that record, so another marker would record nothing new (and on an idle mount
    /// each would move the tail past the one before, a write per timer tick for ever).
    pub(crate) fn covered(&self) -> bool {
        self.covering_marker == Some((self.durable_tail, self.head)) && self.tail == self.head
    }

    /// Moves the in-memory tail forward to `tail` (never back), but never past the head or a
    /// checkpoint in flight (its items are not in the AIL yet, so the AIL cannot hold it back).
    pub(crate) fn advance_tail(&mut self, tail: Lsn) {
        let limit = self
            .in_flight_min()
            .map_or(self.head, |start| start.min(self.head));
        self.tail = self.tail.max(tail.min(limit));
    }

    /// Checks tail <= durable tail ordering facts and that the head stays in front.
    pub(crate) fn check_invariants(&self, layout: &Layout) {
        assert!(self.durable_tail <= self.tail, "durable tail past the tail");
        assert!(self.tail <= self.head, "tail past the head");
        if let Some(start) = self.in_flight_min() {
            assert!(self.tail <= start, "tail past a checkpoint in flight");
        }
        let used = layout.distance_blocks(self.durable_tail, self.head);
        assert!(used <= layout.log_blocks, "head lapped the durable tail");
    }
}
