//! Dirty byte ranges of one buffer: a sorted list of disjoint, non-touching ranges.

use std::ops::Range;

/// Byte ranges modified since the journal last took them. Ranges are kept sorted, and
/// overlapping or touching ranges are merged, so the list is the minimal cover of what changed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct DirtyRanges {
    ranges: Vec<Range<usize>>,
}

impl DirtyRanges {
    /// Adds `range` (non-empty), merging it with every range it overlaps or touches.
    pub(crate) fn add(&mut self, range: Range<usize>) {
        debug_assert!(range.start < range.end);
        // First range that ends at or after the new start: everything before it stays.
        let first = self.ranges.partition_point(|r| r.end < range.start);
        // Ranges from `first` that start at or before the new end are merged in.
        let last = first + self.ranges[first..].partition_point(|r| r.start <= range.end);
        let mut merged = range;
        if let Some(low) = self.ranges.get(first).filter(|_| first < last) {
            merged.start = merged.start.min(low.start);
        }
        if last > first {
            merged.end = merged.end.max(self.ranges[last - 1].end);
        }
        self.ranges.splice(first..last, std::iter::once(merged));
        debug_assert!(self.is_well_formed());
    }

    pub(crate) fn as_slice(&self) -> &[Range<usize>] {
        &self.ranges
    }

    pub(crate) fn take(&mut self) -> Vec<Range<usize>> {
        std::mem::take(&mut self.ranges)
    }

    pub(crate) fn clear(&mut self) {
        self.ranges.clear();
    }

    /// Sorted, non-empty, and separated by at least one clean byte.
    pub(crate) fn is_well_formed(&self) -> bool {
        self.ranges.iter().all(|r| r.start < r.end)
            && self.ranges.windows(2).all(|w| w[0].end < w[1].start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // Checks merging of overlapping, touching and separate ranges on hand-picked cases.
    #[test]
    fn merges_overlapping_and_touching() {
        let mut d = DirtyRanges::default();
        d.add(10..20);
        d.add(30..40);
        assert_eq!(d.as_slice(), &[10..20, 30..40]);
        d.add(20..25);
        assert_eq!(d.as_slice(), &[10..25, 30..40]);
        d.add(5..35);
        assert_eq!(d.as_slice(), std::slice::from_ref(&(5..40)));
        d.add(41..42);
        assert_eq!(d.as_slice(), &[5..40, 41..42]);
        assert_eq!(d.take(), vec![5..40, 41..42]);
        assert!(d.as_slice().is_empty());
    }

    proptest! {
        // The range list always covers exactly the bytes added, in minimal merged form.
        #[test]
        fn covers_exactly_what_was_added(
            adds in proptest::collection::vec((0usize..200, 1usize..30), 0..20),
        ) {
            let mut d = DirtyRanges::default();
            let mut bytes = [false; 240];
            for (start, len) in adds {
                d.add(start..start + len);
                bytes[start..start + len].iter_mut().for_each(|b| *b = true);
                prop_assert!(d.is_well_formed());
            }
            let mut covered = [false; 240];
            for r in d.as_slice() {
                covered[r.clone()].iter_mut().for_each(|b| *b = true);
            }
            prop_assert_eq!(covered, bytes);
        }
    }
}
