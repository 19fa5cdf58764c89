//! Crash images from a recorded op log (dm-log-writes semantics).
//!
//! The log is a sequence of writes and flushes applied on top of a base image. Flushes cut the
//! log into epochs: epoch 0 holds the writes before the first flush, epoch `i` the writes between
//! flush `i` and flush `i + 1` (or the end of the log). A crash "at flush `i`" keeps the base,
//! every write of epochs `0..i` (a flush made them durable), and any subset of the writes of
//! epoch `i`, which the device may have persisted in any order or not at all. One write of that
//! epoch that is not kept whole may also be torn: only some of its sectors reach the medium.
//!
//! Kept writes are applied in log order, so where two kept writes of one epoch overlap the later
//! one wins; this is what a device with a volatile cache does, because the later write replaces
//! the earlier one in the cache. Writes of later epochs are never kept: they were issued after
//! the crash point.

use std::collections::BTreeSet;

use crate::DeviceError;

/// One recorded device operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogOp {
    /// A completed write of `data` at byte `offset`.
    Write { offset: u64, data: Vec<u8> },
    /// A completed flush: every earlier write is durable.
    Flush,
}

/// Where a write of an epoch lies, for a crash explorer choosing what to keep or tear.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteExtent {
    pub offset: u64,
    pub len: u64,
}

/// A write of the crash epoch of which only some sectors reach the medium.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TornWrite {
    /// Index of the write within the crash epoch (0 = first write after the flush point).
    pub write_index: usize,
    /// One flag per sector of the write, in order: whether that sector was persisted.
    pub sectors_kept: Vec<bool>,
}

/// The device state chosen for one simulated crash; see the module documentation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CrashPoint {
    /// How many flushes of the log completed before the crash (0 to `flush_count`).
    pub flush_index: usize,
    /// Indices, within the crash epoch, of the writes that reached the medium whole.
    pub kept_after: BTreeSet<usize>,
    /// At most one write of the crash epoch, not in `kept_after`, persisted in part.
    pub torn: Option<TornWrite>,
}

impl CrashPoint {
    /// A crash right after flush number `flush_index`, with nothing written after it kept.
    pub fn at_flush(flush_index: usize) -> Self {
        Self {
            flush_index,
            ..Self::default()
        }
    }

    /// Also keep write `write_index` of the crash epoch.
    #[must_use]
    pub fn keep(mut self, write_index: usize) -> Self {
        self.kept_after.insert(write_index);
        self
    }

    /// Also persist the sectors of write `write_index` flagged in `sectors_kept`.
    #[must_use]
    pub fn tear(mut self, write_index: usize, sectors_kept: Vec<bool>) -> Self {
        self.torn = Some(TornWrite {
            write_index,
            sectors_kept,
        });
        self
    }
}

/// Number of flushes in `log`.
pub fn flush_count(log: &[LogOp]) -> usize {
    log.iter().filter(|op| matches!(op, LogOp::Flush)).count()
}

/// Log indices of the writes of epoch `flush_index`, or `None` past the last epoch.
fn epoch_write_indices(log: &[LogOp], flush_index: usize) -> Option<Vec<usize>> {
    let mut epoch = 0usize;
    let mut found = Vec::new();
    for (log_index, op) in log.iter().enumerate() {
        match op {
            LogOp::Flush => {
                if epoch == flush_index {
                    return Some(found);
                }
                epoch += 1;
            }
            LogOp::Write { .. } if epoch == flush_index => found.push(log_index),
            LogOp::Write { .. } => {}
        }
    }
    (epoch == flush_index).then_some(found)
}

/// Extents of the writes of epoch `flush_index`, in log order; empty past the last epoch.
pub fn epoch_writes(log: &[LogOp], flush_index: usize) -> Vec<WriteExtent> {
    let indices = epoch_write_indices(log, flush_index).unwrap_or_default();
    indices
        .iter()
        .filter_map(|&log_index| match &log[log_index] {
            LogOp::Write { offset, data } => Some(WriteExtent {
                offset: *offset,
                len: data.len() as u64,
            }),
            LogOp::Flush => None,
        })
        .collect()
}

fn bad_point(reason: String) -> DeviceError {
    DeviceError::CrashPoint { reason }
}

/// Copies `data` into `image` at `offset`; the log only holds writes that passed the range check.
fn apply(image: &mut [u8], offset: u64, data: &[u8]) -> Result<(), DeviceError> {
    let start = usize::try_from(offset).map_err(|_| bad_point(format!("offset {offset}")))?;
    let end = start
        .checked_add(data.len())
        .filter(|&end| end <= image.len())
        .ok_or_else(|| bad_point(format!("logged write at {offset} runs past the image")))?;
    image[start..end].copy_from_slice(data);
    Ok(())
}

/// Checks `point` against the epoch's writes before any byte is copied.
fn validate(
    log: &[LogOp],
    epoch: &[usize],
    sector: usize,
    point: &CrashPoint,
) -> Result<(), DeviceError> {
    if let Some(&bad) = point.kept_after.iter().find(|&&index| index >= epoch.len()) {
        return Err(bad_point(format!(
            "kept write {bad} but flush point {} has {} writes after it",
            point.flush_index,
            epoch.len()
        )));
    }
    let Some(torn) = &point.torn else {
        return Ok(());
    };
    let Some(&log_index) = epoch.get(torn.write_index) else {
        return Err(bad_point(format!(
            "torn write {} does not exist",
            torn.write_index
        )));
    };
    if point.kept_after.contains(&torn.write_index) {
        return Err(bad_point(format!(
            "write {} is both kept and torn",
            torn.write_index
        )));
    }
    let sectors = match &log[log_index] {
        LogOp::Write { data, .. } => data.len() / sector,
        LogOp::Flush => 0,
    };
    if torn.sectors_kept.len() != sectors {
        return Err(bad_point(format!(
            "torn write {} has {sectors} sectors, {} flags given",
            torn.write_index,
            torn.sectors_kept.len()
        )));
    }
    Ok(())
}

/// The image a crash at `point` leaves, starting from `base` and replaying `log`.
pub fn crash_image(
    base: &[u8],
    log: &[LogOp],
    sector_size: u32,
    point: &CrashPoint,
) -> Result<Vec<u8>, DeviceError> {
    let sector = sector_size as usize;
    debug_assert!(
        sector > 0,
        "sector size is checked when the device is built"
    );
    let epoch = epoch_write_indices(log, point.flush_index).ok_or_else(|| {
        bad_point(format!(
            "flush point {} but the log has {} flushes",
            point.flush_index,
            flush_count(log)
        ))
    })?;
    validate(log, &epoch, sector, point)?;
    let mut image = base.to_vec();
    let mut flushes_seen = 0usize;
    for op in log {
        if flushes_seen == point.flush_index {
            break;
        }
        match op {
            LogOp::Flush => flushes_seen += 1,
            LogOp::Write { offset, data } => apply(&mut image, *offset, data)?,
        }
    }
    for (position, &log_index) in epoch.iter().enumerate() {
        let LogOp::Write { offset, data } = &log[log_index] else {
            continue;
        };
        if point.kept_after.contains(&position) {
            apply(&mut image, *offset, data)?;
        } else if let Some(torn) = point.torn.as_ref().filter(|t| t.write_index == position) {
            apply_torn(&mut image, *offset, data, sector, &torn.sectors_kept)?;
        }
    }
    Ok(image)
}

fn apply_torn(
    image: &mut [u8],
    offset: u64,
    data: &[u8],
    sector: usize,
    sectors_kept: &[bool],
) -> Result<(), DeviceError> {
    for (sector_index, chunk) in data.chunks(sector).enumerate() {
        if sectors_kept.get(sector_index).copied().unwrap_or(false) {
            let chunk_offset = offset + (sector_index * sector) as u64;
            apply(image, chunk_offset, chunk)?;
        }
    }
    Ok(())
}

/// A tiny deterministic generator (splitmix64), so crash enumeration needs no extra crate and
/// the same seed always gives the same crash points.
#[derive(Debug)]
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn coin(&mut self) -> bool {
        self.next() & 1 == 1
    }

    fn below(&mut self, bound: usize) -> usize {
        debug_assert!(bound > 0);
        (self.next() % bound as u64) as usize
    }
}

/// Crash points worth checking for `log`: for every flush point, nothing kept after it, each
/// single write after it kept, every write after it kept, and `random_per_flush` random subsets
/// (half of them with one further write torn at random sectors), drawn from `seed`.
pub fn enumerate_crash_points(
    log: &[LogOp],
    sector_size: u32,
    random_per_flush: usize,
    seed: u64,
) -> Vec<CrashPoint> {
    let mut rng = SplitMix(seed);
    let mut points = Vec::new();
    for flush_index in 0..=flush_count(log) {
        let writes = epoch_writes(log, flush_index);
        points.push(CrashPoint::at_flush(flush_index));
        for write_index in 0..writes.len() {
            points.push(CrashPoint::at_flush(flush_index).keep(write_index));
        }
        if writes.len() > 1 {
            let mut all = CrashPoint::at_flush(flush_index);
            all.kept_after = (0..writes.len()).collect();
            points.push(all);
        }
        if writes.is_empty() {
            continue;
        }
        for _ in 0..random_per_flush {
            points.push(random_point(&mut rng, flush_index, &writes, sector_size));
        }
    }
    points
}

fn random_point(
    rng: &mut SplitMix,
    flush_index: usize,
    writes: &[WriteExtent],
    sector_size: u32,
) -> CrashPoint {
    let mut point = CrashPoint::at_flush(flush_index);
    point.kept_after = (0..writes.len()).filter(|_| rng.coin()).collect();
    let candidates: Vec<usize> = (0..writes.len())
        .filter(|index| !point.kept_after.contains(index))
        .collect();
    if !candidates.is_empty() && rng.coin() {
        let write_index = candidates[rng.below(candidates.len())];
        let sectors = writes[write_index].len / u64::from(sector_size.max(1));
        let kept = (0..sectors).map(|_| rng.coin()).collect();
        point.torn = Some(TornWrite {
            write_index,
            sectors_kept: kept,
        });
    }
    point
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(offset: u64, byte: u8, len: usize) -> LogOp {
        LogOp::Write {
            offset,
            data: vec![byte; len],
        }
    }

    // Checks epochs, kept writes and a torn write on a small hand-built log.
    #[test]
    fn crash_image_keeps_prefix_and_chosen_writes() {
        let log = vec![
            write(0, 1, 4),
            LogOp::Flush,
            write(4, 2, 4),
            write(8, 3, 4),
            LogOp::Flush,
            write(0, 9, 4),
        ];
        let base = vec![0u8; 12];
        assert_eq!(flush_count(&log), 2);
        assert_eq!(epoch_writes(&log, 1).len(), 2);
        assert!(epoch_writes(&log, 3).is_empty());
        let none = crash_image(&base, &log, 2, &CrashPoint::at_flush(0)).unwrap();
        assert_eq!(none, vec![0u8; 12]);
        let first = crash_image(&base, &log, 2, &CrashPoint::at_flush(1).keep(1)).unwrap();
        assert_eq!(first, [1, 1, 1, 1, 0, 0, 0, 0, 3, 3, 3, 3]);
        let torn = CrashPoint::at_flush(1).tear(0, vec![false, true]);
        let image = crash_image(&base, &log, 2, &torn).unwrap();
        assert_eq!(image, [1, 1, 1, 1, 0, 0, 2, 2, 0, 0, 0, 0]);
        let last = crash_image(&base, &log, 2, &CrashPoint::at_flush(2).keep(0)).unwrap();
        assert_eq!(last, [9, 9, 9, 9, 2, 2, 2, 2, 3, 3, 3, 3]);
    }

    // Checks that every malformed crash point is refused with a typed error.
    #[test]
    fn bad_crash_points_are_refused() {
        let log = vec![write(0, 1, 4), LogOp::Flush, write(4, 2, 4)];
        let base = vec![0u8; 8];
        let bad = [
            CrashPoint::at_flush(2),
            CrashPoint::at_flush(1).keep(1),
            CrashPoint::at_flush(1).tear(1, vec![true, true]),
            CrashPoint::at_flush(1).keep(0).tear(0, vec![true, true]),
            CrashPoint::at_flush(1).tear(0, vec![true]),
        ];
        for point in bad {
            let result = crash_image(&base, &log, 2, &point);
            assert!(
                matches!(result, Err(DeviceError::CrashPoint { .. })),
                "{point:?}"
            );
        }
    }

    // Checks that enumeration is deterministic and every point it yields is valid.
    #[test]
    fn enumerated_points_are_valid_and_deterministic() {
        let log = vec![
            write(0, 1, 4),
            write(4, 2, 4),
            LogOp::Flush,
            write(0, 3, 8),
            write(2, 4, 2),
            write(6, 5, 2),
        ];
        let base = vec![0u8; 8];
        let points = enumerate_crash_points(&log, 2, 5, 42);
        assert_eq!(points, enumerate_crash_points(&log, 2, 5, 42));
        // Epoch 0: none, 2 singles, all, 5 random; epoch 1: none, 3 singles, all, 5 random.
        assert_eq!(points.len(), 9 + 10);
        for point in &points {
            crash_image(&base, &log, 2, point).unwrap();
        }
    }
}
