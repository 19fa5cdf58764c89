//! One inode's extent status tree: the ordered map and every edit made to it.
//!
//! Everything here runs under the inode's tree lock (`InodeTree::inner`), read or write as the
//! method's receiver says; the locking and the global accounting live in `inode.rs`.

use crate::error::ExtCacheError;
use crate::extent::{Entry, Extent, ExtentState, can_merge};
use std::collections::BTreeMap;

/// A range the filesystem has pinned: the shrinker leaves entries overlapping it alone.
#[derive(Debug, Clone, Copy)]
struct PinRange {
    pin_id: u64,
    start: u64,
    end: u64,
}

/// What one shrinker visit to a tree did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ScanOutcome {
    pub(crate) examined: u32,
    pub(crate) freed: u32,
    pub(crate) spared_referenced: u32,
    pub(crate) skipped_in_use: u32,
}

#[derive(Debug, Default)]
pub(crate) struct TreeInner {
    map: BTreeMap<u64, Entry>,
    pins: Vec<PinRange>,
    next_pin_id: u64,
    /// Where the next shrinker visit starts: one past the last key it examined.
    cursor: u64,
    delayed_count: u64,
}

impl TreeInner {
    pub(crate) fn len(&self) -> u64 {
        self.map.len() as u64
    }

    pub(crate) fn delayed_count(&self) -> u64 {
        self.delayed_count
    }

    /// The entry holding `block`, if cached.
    pub(crate) fn lookup(&self, block: u64) -> Option<(u64, &Entry)> {
        let (&start, entry) = self.map.range(..=block).next_back()?;
        (block - start < entry.block_count).then_some((start, entry))
    }

    /// Cached extents overlapping `[start, end)`, whole (not clipped), in order.
    pub(crate) fn overlapping(&self, start: u64, end: u64) -> impl Iterator<Item = Extent> + '_ {
        let first = self.lookup(start).map_or(start, |(key, _)| key);
        self.map
            .range(first..end)
            .map(|(&key, entry)| entry.to_extent(key))
    }

    fn put(&mut self, start: u64, entry: Entry) {
        if matches!(entry.state, ExtentState::Delayed) {
            self.delayed_count += 1;
        }
        if let Some(old) = self.map.insert(start, entry)
            && matches!(old.state, ExtentState::Delayed)
        {
            self.delayed_count -= 1;
        }
    }

    fn take(&mut self, start: u64) -> Option<Entry> {
        let entry = self.map.remove(&start)?;
        if matches!(entry.state, ExtentState::Delayed) {
            self.delayed_count -= 1;
        }
        Some(entry)
    }

    /// Removes all coverage of `[start, end)`, splitting entries that straddle either end.
    /// Returns the number of blocks that were cached in the range.
    pub(crate) fn cut(&mut self, start: u64, end: u64) -> u64 {
        let mut removed_blocks = 0;
        if let Some((key, entry)) = self.lookup(start).filter(|(key, _)| *key < start) {
            let entry_end = key + entry.block_count;
            let (state, referenced) = (entry.state, entry.is_referenced());
            if let Some(left) = self.map.get_mut(&key) {
                left.block_count = start - key;
            }
            if entry_end > end {
                let tail = Entry::new(entry_end - end, state.advanced(end - key), referenced);
                self.put(end, tail);
                return end - start;
            }
            removed_blocks += entry_end - start;
        }
        let inside: Vec<u64> = self.map.range(start..end).map(|(&key, _)| key).collect();
        for key in inside {
            let Some(entry) = self.take(key) else {
                continue;
            };
            let entry_end = key + entry.block_count;
            if entry_end > end {
                let referenced = entry.is_referenced();
                let tail = Entry::new(entry_end - end, entry.state.advanced(end - key), referenced);
                self.put(end, tail);
                removed_blocks += end - key;
            } else {
                removed_blocks += entry.block_count;
            }
        }
        removed_blocks
    }

    /// Overwrites the range of a validated `extent` with it and merges with its neighbours.
    pub(crate) fn insert(&mut self, extent: Extent) {
        let end = extent.end_block();
        self.cut(extent.logical_block, end);
        self.put(
            extent.logical_block,
            Entry::new(extent.block_count, extent.state, false),
        );
        self.merge_at(extent.logical_block);
    }

    /// Merges the entry starting at `start` with compatible neighbours on both sides.
    fn merge_at(&mut self, start: u64) {
        let mut start = start;
        let left = self.map.range(..start).next_back().map(|(&key, _)| key);
        if let Some(left_key) = left
            && let (Some(left), Some(this)) = (self.map.get(&left_key), self.map.get(&start))
            && left_key + left.block_count == start
            && can_merge(left, this)
            && let Some(this) = self.take(start)
            && let Some(left) = self.map.get_mut(&left_key)
        {
            left.block_count += this.block_count;
            if this.is_referenced() {
                left.mark_referenced();
            }
            start = left_key;
        }
        let Some(this) = self.map.get(&start) else {
            return;
        };
        let right_key = start + this.block_count;
        if let Some(right) = self.map.get(&right_key)
            && can_merge(this, right)
            && let Some(right) = self.take(right_key)
            && let Some(this) = self.map.get_mut(&start)
        {
            this.block_count += right.block_count;
            if right.is_referenced() {
                this.mark_referenced();
            }
        }
    }

    /// Turns cached unwritten blocks of `[start, end)` into written ones (same physical
    /// blocks). Returns the number of blocks converted; uncached blocks are left uncached.
    pub(crate) fn convert_unwritten(&mut self, start: u64, end: u64) -> u64 {
        let pieces: Vec<Extent> = self
            .overlapping(start, end)
            .filter_map(|extent| {
                let ExtentState::Unwritten { physical_block } = extent.state else {
                    return None;
                };
                let piece_start = extent.logical_block.max(start);
                let piece_end = extent.end_block().min(end);
                let physical_block = physical_block + (piece_start - extent.logical_block);
                Some(Extent {
                    logical_block: piece_start,
                    block_count: piece_end - piece_start,
                    state: ExtentState::Written { physical_block },
                })
            })
            .collect();
        pieces
            .into_iter()
            .map(|piece| {
                self.insert(piece);
                piece.block_count
            })
            .sum()
    }

    /// Ranges of `[start, end)` held by delayed entries, clipped to the range.
    fn delayed_ranges(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        self.overlapping(start, end)
            .filter(|extent| matches!(extent.state, ExtentState::Delayed))
            .map(|extent| (extent.logical_block.max(start), extent.end_block().min(end)))
            .collect()
    }

    /// Caches what the on-disk map says for `[start, end)`: `mapped` (validated, sorted,
    /// disjoint, inside the range) plus holes in every gap. Delayed entries are kept: they
    /// are newer than the disk. Returns the number of blocks cached from disk.
    pub(crate) fn fill(&mut self, start: u64, end: u64, mapped: &[Extent]) -> u64 {
        let delayed = self.delayed_ranges(start, end);
        let mut pieces = Vec::with_capacity(mapped.len() * 2 + 1);
        let mut at = start;
        for extent in mapped {
            if extent.logical_block > at {
                pieces.push(Extent {
                    logical_block: at,
                    block_count: extent.logical_block - at,
                    state: ExtentState::Hole,
                });
            }
            pieces.push(*extent);
            at = extent.end_block();
        }
        if end > at {
            pieces.push(Extent {
                logical_block: at,
                block_count: end - at,
                state: ExtentState::Hole,
            });
        }
        let mut filled = 0;
        for piece in pieces {
            for part in subtract_ranges(piece, &delayed) {
                self.insert(part);
                filled += part.block_count;
            }
        }
        filled
    }

    /// Records a pin on `[start, end)` and returns its id.
    pub(crate) fn pin(&mut self, start: u64, end: u64) -> u64 {
        let pin_id = self.next_pin_id;
        self.next_pin_id += 1;
        self.pins.push(PinRange { pin_id, start, end });
        pin_id
    }

    pub(crate) fn unpin(&mut self, pin_id: u64) {
        self.pins.retain(|pin| pin.pin_id != pin_id);
    }

    pub(crate) fn pin_count(&self) -> usize {
        self.pins.len()
    }

    fn is_pinned(&self, start: u64, block_count: u64) -> bool {
        let end = start.saturating_add(block_count);
        self.pins
            .iter()
            .any(|pin| pin.start < end && start < pin.end)
    }

    /// One shrinker visit: examines at most `budget` entries from the cursor (wrapping round),
    /// skips delayed and pinned ones, spares referenced ones once (clearing the bit) and drops
    /// the rest. `victims` is scratch space kept by the caller.
    pub(crate) fn scan(&mut self, budget: u32, victims: &mut Vec<u64>) -> ScanOutcome {
        let mut outcome = ScanOutcome::default();
        let mut last_key = None;
        victims.clear();
        let cursor = self.cursor;
        for (&key, entry) in self.map.range(cursor..).chain(self.map.range(..cursor)) {
            if outcome.examined >= budget {
                break;
            }
            outcome.examined += 1;
            last_key = Some(key);
            if !entry.is_reclaimable() || self.is_pinned(key, entry.block_count) {
                outcome.skipped_in_use += 1;
            } else if entry.is_referenced() {
                entry.clear_referenced();
                outcome.spared_referenced += 1;
            } else {
                victims.push(key);
            }
        }
        for key in victims.iter() {
            if self.take(*key).is_some() {
                outcome.freed += 1;
            }
        }
        self.cursor = last_key.map_or(0, |key| key.wrapping_add(1));
        outcome
    }

    /// Drops every entry (the inode is going away). Returns how many there were.
    pub(crate) fn clear(&mut self) -> u64 {
        let count = self.len();
        self.map.clear();
        self.delayed_count = 0;
        self.cursor = 0;
        count
    }

    /// Entries are non-empty, in range, disjoint, maximally merged; the delayed count is right.
    pub(crate) fn check_invariants(&self) -> Result<(), ExtCacheError> {
        let broken = |what: String| Err(ExtCacheError::Invariant { what });
        let mut previous: Option<(u64, &Entry)> = None;
        let mut delayed = 0;
        for (&key, entry) in &self.map {
            let extent = entry.to_extent(key);
            if let Err(error) = extent.validate() {
                return broken(format!("entry at {key}: {error}"));
            }
            if let Some((previous_key, previous_entry)) = previous {
                let previous_end = previous_key + previous_entry.block_count;
                if previous_end > key {
                    return broken(format!(
                        "entry at {key} overlaps one ending at {previous_end}"
                    ));
                }
                if previous_end == key && can_merge(previous_entry, entry) {
                    return broken(format!(
                        "entries at {previous_key} and {key} were not merged"
                    ));
                }
            }
            delayed += u64::from(matches!(entry.state, ExtentState::Delayed));
            previous = Some((key, entry));
        }
        if delayed != self.delayed_count {
            return broken(format!(
                "delayed count {} (found {delayed})",
                self.delayed_count
            ));
        }
        Ok(())
    }
}

/// The parts of `piece` not covered by `ranges` (sorted, disjoint).
fn subtract_ranges(piece: Extent, ranges: &[(u64, u64)]) -> Vec<Extent> {
    let mut parts = Vec::new();
    let mut at = piece.logical_block;
    let end = piece.end_block();
    for &(range_start, range_end) in ranges {
        if range_end <= at || range_start >= end {
            continue;
        }
        if range_start > at {
            parts.push(clip(piece, at, range_start));
        }
        at = at.max(range_end);
    }
    if at < end {
        parts.push(clip(piece, at, end));
    }
    parts
}

/// `piece` restricted to `[start, end)`, which must lie inside it.
fn clip(piece: Extent, start: u64, end: u64) -> Extent {
    Extent {
        logical_block: start,
        block_count: end - start,
        state: piece.state.advanced(start - piece.logical_block),
    }
}
