//! Log space accounting: the physical head and tail and the grant of promised bytes.
//!
//! `used` is the distance from the *durable* tail (the one recorded in a flushed record) to
//! the head: the head may never overwrite what a crash-time recovery would start from.
//! `grant` is what live transactions reserved plus what the CIL contexts (current and being
//! written) may take. A reservation is granted when `used + grant + bytes <= capacity`;
//! waiters are served first come, first served (tickets), so none starves.

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
    pub(crate) next_ticket: u64,
    pub(crate) serving_ticket: u64,
}

impl Space {
    pub(crate) fn new(head: Lsn, capacity_bytes: u64) -> Self {
        Self {
            head,
            tail: head,
            durable_tail: head,
            grant_bytes: 0,
            capacity_bytes,
            next_ticket: 0,
            serving_ticket: 0,
        }
    }

    pub(crate) fn used_bytes(&self, layout: &Layout) -> u64 {
        layout.distance_blocks(self.durable_tail, self.head) * layout.block_size
    }

    pub(crate) fn fits(&self, layout: &Layout, bytes: u64) -> bool {
        self.used_bytes(layout) + self.grant_bytes + bytes <= self.capacity_bytes
    }

    pub(crate) fn has_waiters(&self) -> bool {
        self.next_ticket != self.serving_ticket
    }

    /// Moves the in-memory tail forward to `tail` (never back).
    pub(crate) fn advance_tail(&mut self, tail: Lsn) {
        self.tail = self.tail.max(tail.min(self.head));
    }

    /// Checks tail <= durable tail ordering facts and that the head stays in front.
    pub(crate) fn check_invariants(&self, layout: &Layout) {
        assert!(self.durable_tail <= self.tail, "durable tail past the tail");
        assert!(self.tail <= self.head, "tail past the head");
        let used = layout.distance_blocks(self.durable_tail, self.head);
        assert!(used <= layout.log_blocks, "head lapped the durable tail");
    }
}
