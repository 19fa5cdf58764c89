//! Busy extents: ranges freed by transactions whose commit is not yet durable in the log.
//!
//! Reusing such a range for new data could, after a crash that loses the free, leave the new
//! owner's data visible through the old owner. So allocation trims candidates around busy
//! ranges, and forces the log only when nothing else fits. Adjacent ranges freed by the same
//! transaction (same sequence) are merged.

use std::collections::{BTreeMap, BTreeSet};

/// The log's view the allocator needs: how far commits are durable, and a way to force more.
pub trait LogSequence {
    /// Highest commit sequence known durable.
    fn durable_sequence(&self) -> u64;
    /// Makes every commit up to `sequence` durable.
    fn force(&self, sequence: u64) -> Result<(), String>;
}

/// One busy range of an AG.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BusyExtent {
    pub start: u32,
    pub length: u32,
    /// Commit sequence of the freeing transaction.
    pub sequence: u64,
}

impl BusyExtent {
    fn end(&self) -> u64 {
        u64::from(self.start) + u64::from(self.length)
    }
}

/// Most durable ranges one `clear_durable` call drops. A commit can free hundreds of
/// thousands of ranges; dropping them all in the allocation that first sees the commit durable
/// took 46 ms for 252,721 ranges in the benchmark. Past the watermark they no longer count as
/// busy, so the rest can go a batch per call, and a later free over one replaces it.
pub const BUSY_CLEAR_BATCH_MAX: usize = 128;

/// The busy ranges of one AG, keyed by start; stored ranges never overlap. A second index by
/// (sequence, start) finds the ranges that became durable without looking at the rest.
/// Ranges with `sequence <= durable` are dead: every query ignores them, and `clear_durable`
/// drops them a batch at a time.
#[derive(Debug, Clone, Default)]
pub struct BusyExtents {
    ranges: BTreeMap<u32, BusyExtent>,
    by_sequence: BTreeSet<(u64, u32)>,
    /// Highest sequence known durable, as last given to `clear_durable`.
    durable: u64,
}

impl BusyExtents {
    pub fn new() -> Self {
        Self::default()
    }

    /// Ranges stored, dead ones not yet dropped included.
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    /// Whether no range is busy (dead ones not yet dropped do not count).
    pub fn is_empty(&self) -> bool {
        self.max_sequence().is_none()
    }

    /// The busy ranges, in block order (dead ones skipped).
    pub fn iter(&self) -> impl Iterator<Item = &BusyExtent> {
        self.ranges.values().filter(|b| self.live(b))
    }

    fn live(&self, busy: &BusyExtent) -> bool {
        busy.sequence > self.durable
    }

    /// Stored ranges (dead ones included) that could overlap `start..end`, in order.
    fn stored_from(&self, start: u32) -> impl Iterator<Item = &BusyExtent> {
        let from = self
            .ranges
            .range(..=start)
            .next_back()
            .map_or(start, |(s, _)| *s);
        self.ranges.range(from..).map(|(_, b)| b)
    }

    fn remove(&mut self, start: u32) {
        if let Some(old) = self.ranges.remove(&start) {
            self.by_sequence.remove(&(old.sequence, old.start));
        }
    }

    /// Records `start..start + length` as freed by the transaction with `sequence`. The range
    /// was allocated, so it overlaps no busy range, only dead ones, which it replaces; a
    /// neighbour from the same transaction that touches it is merged with it. A range whose
    /// commit is already durable is not busy and is not stored.
    pub fn insert(&mut self, start: u32, length: u32, sequence: u64) {
        debug_assert!(length > 0);
        debug_assert!(self.overlapping(start, length).is_none());
        if sequence <= self.durable {
            return;
        }
        let end = u64::from(start) + u64::from(length);
        let dead: Vec<u32> = self
            .stored_from(start)
            .take_while(|b| u64::from(b.start) < end)
            .filter(|b| b.end() > u64::from(start))
            .map(|b| b.start)
            .collect();
        for old in dead {
            self.remove(old);
        }
        let mut merged = BusyExtent {
            start,
            length,
            sequence,
        };
        if let Some((_, left)) = self.ranges.range(..start).next_back()
            && left.end() == u64::from(start)
            && left.sequence == sequence
        {
            let left = *left;
            self.remove(left.start);
            merged.start = left.start;
            merged.length += left.length;
        }
        if let Some(right) = self.ranges.get(&(start + length)).copied()
            && right.sequence == sequence
        {
            self.remove(right.start);
            merged.length += right.length;
        }
        self.ranges.insert(merged.start, merged);
        self.by_sequence.insert((sequence, merged.start));
    }

    /// The highest sequence of any busy range: what a log force must reach to clear them all.
    pub fn max_sequence(&self) -> Option<u64> {
        self.by_sequence
            .last()
            .map(|(sequence, _)| *sequence)
            .filter(|sequence| *sequence > self.durable)
    }

    /// The first busy range overlapping `start..start + length`.
    pub fn overlapping(&self, start: u32, length: u32) -> Option<BusyExtent> {
        let end = u64::from(start) + u64::from(length);
        self.stored_from(start)
            .take_while(|b| u64::from(b.start) < end)
            .find(|b| b.end() > u64::from(start) && self.live(b))
            .copied()
    }

    /// The longest piece of `start..start + length` that no busy range overlaps, as
    /// `(start, length)`; `None` if every block is busy. `visited` counts ranges looked at.
    pub fn trim(&self, start: u32, length: u32, visited: &mut u64) -> Option<(u32, u32)> {
        let end = u64::from(start) + u64::from(length);
        let mut best: Option<(u32, u32)> = None;
        let mut cursor = u64::from(start);
        for busy in self.stored_from(start) {
            *visited += 1;
            if u64::from(busy.start) >= end {
                break;
            }
            if !self.live(busy) {
                continue;
            }
            consider(&mut best, cursor, u64::from(busy.start).min(end));
            cursor = cursor.max(busy.end());
        }
        consider(&mut best, cursor, end);
        best
    }

    /// Highest sequence among ranges overlapping `start..start + length` (what a log force
    /// must reach to free the range), or `None` if none is busy.
    pub fn sequence_over(&self, start: u32, length: u32) -> Option<u64> {
        let end = u64::from(start) + u64::from(length);
        self.stored_from(start)
            .take_while(|b| u64::from(b.start) < end)
            .filter(|b| b.end() > u64::from(start) && self.live(b))
            .map(|b| b.sequence)
            .max()
    }

    /// Notes that commits up to `durable` are durable (their ranges stop being busy at once)
    /// and drops at most `BUSY_CLEAR_BATCH_MAX` of the dead ranges. Returns how many it
    /// dropped.
    pub fn clear_durable(&mut self, durable: u64) -> usize {
        self.durable = self.durable.max(durable);
        let mut cleared = 0;
        while cleared < BUSY_CLEAR_BATCH_MAX
            && let Some(&(sequence, start)) = self.by_sequence.first()
            && sequence <= self.durable
        {
            self.by_sequence.pop_first();
            self.ranges.remove(&start);
            cleared += 1;
        }
        cleared
    }

    /// Checks that ranges are non-empty, keyed by start, disjoint, and indexed by sequence.
    pub fn check_invariants(&self) -> Result<(), String> {
        if self.by_sequence.len() != self.ranges.len() {
            let counts = (self.ranges.len(), self.by_sequence.len());
            return Err(format!("{counts:?} ranges by start and by sequence"));
        }
        let mut previous_end = 0u64;
        for (key, busy) in &self.ranges {
            if *key != busy.start || busy.length == 0 {
                return Err(format!("busy range {busy:?} under key {key}"));
            }
            if !self.by_sequence.contains(&(busy.sequence, busy.start)) {
                return Err(format!(
                    "busy range {busy:?} missing from the sequence index"
                ));
            }
            if u64::from(busy.start) < previous_end {
                return Err(format!("busy range {busy:?} overlaps its left neighbour"));
            }
            previous_end = busy.end();
        }
        Ok(())
    }
}

fn consider(best: &mut Option<(u32, u32)>, from: u64, to: u64) {
    if to > from {
        let length = (to - from) as u32;
        if best.is_none_or(|(_, l)| length > l) {
            *best = Some((from as u32, length));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks merging of same-transaction neighbours, trimming, and clearing by durability.
    #[test]
    fn merge_trim_and_clear() {
        let mut busy = BusyExtents::new();
        busy.insert(10, 5, 1);
        busy.insert(15, 5, 1);
        busy.insert(20, 5, 2);
        busy.insert(5, 5, 1);
        assert_eq!(busy.len(), 2);
        busy.check_invariants().unwrap();
        assert_eq!(busy.overlapping(0, 6).map(|b| b.start), Some(5));
        assert_eq!(busy.overlapping(0, 5), None);
        let mut visited = 0;
        assert_eq!(busy.trim(0, 40, &mut visited), Some((25, 15)));
        assert_eq!(busy.trim(0, 12, &mut visited), Some((0, 5)));
        assert_eq!(busy.trim(6, 10, &mut visited), None);
        assert_eq!(busy.sequence_over(0, 21), Some(2));
        assert_eq!(busy.sequence_over(30, 5), None);
        assert_eq!(busy.max_sequence(), Some(2));
        assert_eq!(busy.clear_durable(1), 1);
        busy.check_invariants().unwrap();
        assert_eq!(busy.iter().next().map(|b| b.start), Some(20));
        assert_eq!(busy.clear_durable(5), 1);
        assert!(busy.is_empty());
        busy.insert(30, 5, 4);
        assert!(
            busy.is_empty(),
            "a range freed by a durable commit is not busy"
        );
    }

    // Checks that durable ranges stop counting at once, go a batch per call, and that a new
    // busy range over a dead one replaces it.
    #[test]
    fn dead_ranges_go_in_batches() {
        let mut busy = BusyExtents::new();
        let count = 3 * BUSY_CLEAR_BATCH_MAX as u32;
        for n in 0..count {
            busy.insert(n * 4, 2, u64::from(n) + 1);
        }
        assert_eq!(
            busy.clear_durable(u64::from(count) - 1),
            BUSY_CLEAR_BATCH_MAX
        );
        assert_eq!(busy.iter().count(), 1);
        assert_eq!(busy.max_sequence(), Some(u64::from(count)));
        let mut visited = 0;
        assert_eq!(busy.trim(0, 8, &mut visited), Some((0, 8)));
        assert_eq!(busy.overlapping(0, 4 * count - 4), None);
        assert_eq!(busy.sequence_over(0, 4 * count - 4), None);
        let dead_start = 4 * (count - 2);
        busy.insert(dead_start, 3, u64::from(count) + 1);
        busy.check_invariants().unwrap();
        assert_eq!(busy.overlapping(dead_start, 1).map(|b| b.length), Some(3));
        while busy.clear_durable(u64::from(count) - 1) > 0 {}
        assert_eq!(busy.len(), 2);
        busy.check_invariants().unwrap();
    }
}
