//! Busy extents: ranges freed by transactions whose commit is not yet durable in the log.
//!
//! Reusing such a range for new data could, after a crash that loses the free, leave the new
//! owner's data visible through the old owner. So allocation trims candidates around busy
//! ranges, and forces the log only when nothing else fits. Adjacent ranges freed by the same
//! transaction (same sequence) are merged.

use std::collections::BTreeMap;

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

/// The busy ranges of one AG, keyed by start; ranges never overlap.
#[derive(Debug, Clone, Default)]
pub struct BusyExtents {
    ranges: BTreeMap<u32, BusyExtent>,
}

impl BusyExtents {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &BusyExtent> {
        self.ranges.values()
    }

    /// Records `start..start + length` as freed by the transaction with `sequence`. The range
    /// was allocated, so it overlaps no busy range; a neighbour from the same transaction that
    /// touches it is merged with it.
    pub fn insert(&mut self, start: u32, length: u32, sequence: u64) {
        debug_assert!(length > 0);
        debug_assert!(self.overlapping(start, length).is_none());
        let mut merged = BusyExtent {
            start,
            length,
            sequence,
        };
        if let Some((_, left)) = self.ranges.range(..start).next_back()
            && left.end() == u64::from(start)
            && left.sequence == sequence
        {
            merged.start = left.start;
            merged.length += left.length;
        }
        if let Some(right) = self.ranges.get(&(start + length)).copied()
            && right.sequence == sequence
        {
            self.ranges.remove(&right.start);
            merged.length += right.length;
        }
        self.ranges.insert(merged.start, merged);
    }

    /// The first busy range overlapping `start..start + length`.
    pub fn overlapping(&self, start: u32, length: u32) -> Option<BusyExtent> {
        let end = u64::from(start) + u64::from(length);
        if let Some((_, left)) = self.ranges.range(..=start).next_back()
            && left.end() > u64::from(start)
        {
            return Some(*left);
        }
        self.ranges
            .range(start..)
            .next()
            .map(|(_, r)| *r)
            .filter(|r| u64::from(r.start) < end)
    }

    /// The longest piece of `start..start + length` that no busy range overlaps, as
    /// `(start, length)`; `None` if every block is busy. `visited` counts ranges looked at.
    pub fn trim(&self, start: u32, length: u32, visited: &mut u64) -> Option<(u32, u32)> {
        let end = u64::from(start) + u64::from(length);
        let mut best: Option<(u32, u32)> = None;
        let mut cursor = u64::from(start);
        let from = self
            .ranges
            .range(..=start)
            .next_back()
            .map_or(start, |(s, _)| *s);
        for busy in self.ranges.range(from..).map(|(_, b)| b) {
            *visited += 1;
            if u64::from(busy.start) >= end {
                break;
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
        let from = self
            .ranges
            .range(..=start)
            .next_back()
            .map_or(start, |(s, _)| *s);
        self.ranges
            .range(from..)
            .map(|(_, b)| b)
            .take_while(|b| u64::from(b.start) < end)
            .filter(|b| b.end() > u64::from(start))
            .map(|b| b.sequence)
            .max()
    }

    /// Drops every range whose freeing commit is durable (`sequence <= durable`).
    pub fn clear_durable(&mut self, durable: u64) -> usize {
        let before = self.ranges.len();
        self.ranges.retain(|_, b| b.sequence > durable);
        before - self.ranges.len()
    }

    /// Checks that ranges are non-empty, keyed by start, and disjoint.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut previous_end = 0u64;
        for (key, busy) in &self.ranges {
            if *key != busy.start || busy.length == 0 {
                return Err(format!("busy range {busy:?} under key {key}"));
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
        assert_eq!(busy.clear_durable(1), 1);
        assert_eq!(busy.iter().next().map(|b| b.start), Some(20));
        assert_eq!(busy.clear_durable(5), 1);
        assert!(busy.is_empty());
    }
}
