//! Counters of the cache and the shrinker, and the snapshot the stats interface prints.
//!
//! The figures are the ones ext4 exports in `es_shrinker_info`: objects, reclaimable objects,
//! hits and misses, inodes on the reclaim list, average and maximum scan time, objects shrunk
//! per scan, and the inode with the most objects (see `ExtentCache::worst_inode`).

use crate::limits::COUNTER_STRIPES;
use crossbeam::utils::CachePadded;
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// A counter split over cache-padded stripes; each thread adds to its own stripe, so lookups
/// on two cores do not fight over one cache line. Reading sums the stripes.
#[derive(Debug, Default)]
pub(crate) struct StripedCounter {
    stripes: [CachePadded<AtomicU64>; COUNTER_STRIPES],
}

static NEXT_STRIPE: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static STRIPE: usize = NEXT_STRIPE.fetch_add(1, Ordering::Relaxed) % COUNTER_STRIPES;
}

impl StripedCounter {
    pub(crate) fn add(&self, value: u64) {
        let stripe = STRIPE.with(|stripe| *stripe);
        if let Some(counter) = self.stripes.get(stripe) {
            counter.fetch_add(value, Ordering::Relaxed);
        }
    }

    pub(crate) fn sum(&self) -> u64 {
        self.stripes
            .iter()
            .map(|counter| counter.load(Ordering::Relaxed))
            .sum()
    }
}

/// Live counters. Object counts change under some inode's tree write lock; scan figures are
/// written by whichever thread ran the scan.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub(crate) objects: CachePadded<AtomicU64>,
    pub(crate) unreclaimable: CachePadded<AtomicU64>,
    pub(crate) inodes_on_list: CachePadded<AtomicU64>,
    pub(crate) hits: StripedCounter,
    pub(crate) misses: StripedCounter,
    pub(crate) scans: CachePadded<AtomicU64>,
    pub(crate) scan_ns_total: AtomicU64,
    pub(crate) scan_ns_max: AtomicU64,
    pub(crate) scan_cpu_ns_total: AtomicU64,
    pub(crate) scan_cpu_ns_max: AtomicU64,
    pub(crate) scans_over_1ms: AtomicU64,
    pub(crate) shrunk_total: AtomicU64,
    pub(crate) examined_total: AtomicU64,
    pub(crate) inodes_skipped_busy: AtomicU64,
    pub(crate) inodes_rotated_referenced: AtomicU64,
}

/// A point-in-time copy of the counters. Taken without locks, so on a busy cache the fields
/// may come from slightly different instants.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Entries cached, all inodes.
    pub objects: u64,
    /// Entries the shrinker may drop: all but delayed ones (pins are transient, not counted).
    pub reclaimable_objects: u64,
    pub hits: u64,
    pub misses: u64,
    pub inodes_on_list: u64,
    /// Shrink calls made.
    pub scans: u64,
    pub scan_time_avg_ns: u64,
    pub scan_time_max_ns: u64,
    /// CPU time of the scans (wall time minus time spent preempted).
    pub scan_cpu_avg_ns: u64,
    pub scan_cpu_max_ns: u64,
    /// Scans whose wall time exceeded one millisecond.
    pub scans_over_1ms: u64,
    pub shrunk_objects_total: u64,
    pub examined_objects_total: u64,
    /// Inodes the shrinker skipped because their tree was locked (it never waits).
    pub inodes_skipped_busy: u64,
    /// Inodes given a second trip round the list because they were used since the last visit.
    pub inodes_rotated_referenced: u64,
}

impl StatsSnapshot {
    /// Hits over lookups, or 0 with no lookups.
    pub fn hit_rate(&self) -> f64 {
        let lookups = self.hits + self.misses;
        if lookups == 0 {
            0.0
        } else {
            self.hits as f64 / lookups as f64
        }
    }

    /// Average objects dropped per shrink call.
    pub fn shrunk_per_scan_avg(&self) -> f64 {
        if self.scans == 0 {
            0.0
        } else {
            self.shrunk_objects_total as f64 / self.scans as f64
        }
    }

    /// Counter differences `self - earlier` (gauges and maxima are taken from `self`), for
    /// reporting one phase of a run.
    pub fn since(&self, earlier: &StatsSnapshot) -> StatsSnapshot {
        let scans = self.scans.saturating_sub(earlier.scans);
        let scan_ns = (self.scan_time_avg_ns * self.scans)
            .saturating_sub(earlier.scan_time_avg_ns * earlier.scans);
        StatsSnapshot {
            hits: self.hits.saturating_sub(earlier.hits),
            misses: self.misses.saturating_sub(earlier.misses),
            scans,
            scans_over_1ms: self.scans_over_1ms.saturating_sub(earlier.scans_over_1ms),
            scan_time_avg_ns: scan_ns.checked_div(scans).unwrap_or(0),
            shrunk_objects_total: self
                .shrunk_objects_total
                .saturating_sub(earlier.shrunk_objects_total),
            examined_objects_total: self
                .examined_objects_total
                .saturating_sub(earlier.examined_objects_total),
            inodes_skipped_busy: self
                .inodes_skipped_busy
                .saturating_sub(earlier.inodes_skipped_busy),
            inodes_rotated_referenced: self
                .inodes_rotated_referenced
                .saturating_sub(earlier.inodes_rotated_referenced),
            ..*self
        }
    }
}

impl Stats {
    pub(crate) fn snapshot(&self) -> StatsSnapshot {
        let objects = self.objects.load(Ordering::Relaxed);
        let scans = self.scans.load(Ordering::Relaxed);
        StatsSnapshot {
            objects,
            reclaimable_objects: objects.saturating_sub(self.unreclaimable.load(Ordering::Relaxed)),
            hits: self.hits.sum(),
            misses: self.misses.sum(),
            inodes_on_list: self.inodes_on_list.load(Ordering::Relaxed),
            scans,
            scan_time_avg_ns: self
                .scan_ns_total
                .load(Ordering::Relaxed)
                .checked_div(scans)
                .unwrap_or(0),
            scan_time_max_ns: self.scan_ns_max.load(Ordering::Relaxed),
            scan_cpu_avg_ns: (self.scan_cpu_ns_total.load(Ordering::Relaxed))
                .checked_div(scans)
                .unwrap_or(0),
            scan_cpu_max_ns: self.scan_cpu_ns_max.load(Ordering::Relaxed),
            scans_over_1ms: self.scans_over_1ms.load(Ordering::Relaxed),
            shrunk_objects_total: self.shrunk_total.load(Ordering::Relaxed),
            examined_objects_total: self.examined_total.load(Ordering::Relaxed),
            inodes_skipped_busy: self.inodes_skipped_busy.load(Ordering::Relaxed),
            inodes_rotated_referenced: self.inodes_rotated_referenced.load(Ordering::Relaxed),
        }
    }

    /// Applies a change in an inode's entry counts to the global gauges.
    pub(crate) fn apply_delta(
        &self,
        objects_before: u64,
        objects_after: u64,
        delayed_before: u64,
        delayed_after: u64,
    ) {
        adjust(&self.objects, objects_before, objects_after);
        adjust(&self.unreclaimable, delayed_before, delayed_after);
    }
}

fn adjust(counter: &AtomicU64, before: u64, after: u64) {
    if after > before {
        counter.fetch_add(after - before, Ordering::Relaxed);
    } else if before > after {
        counter.fetch_sub(before - after, Ordering::Relaxed);
    }
}

/// The inode with the most cached entries, as `ExtentCache::worst_inode` found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorstInode {
    pub ino: u64,
    pub objects: u64,
    pub reclaimable_objects: u64,
}

/// Prints in the layout of ext4's `es_shrinker_info`, with nanosecond scan times.
impl fmt::Display for StatsSnapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "stats:")?;
        writeln!(f, "  {} objects", self.objects)?;
        writeln!(f, "  {} reclaimable objects", self.reclaimable_objects)?;
        writeln!(
            f,
            "  {}/{} cache hits/misses ({:.3} hit rate)",
            self.hits,
            self.misses,
            self.hit_rate()
        )?;
        writeln!(f, "  {} inodes on list", self.inodes_on_list)?;
        writeln!(
            f,
            "  {} scans, {} inodes skipped busy, {} rotated referenced",
            self.scans, self.inodes_skipped_busy, self.inodes_rotated_referenced
        )?;
        writeln!(f, "average:")?;
        writeln!(f, "  {} ns scan time", self.scan_time_avg_ns)?;
        writeln!(f, "  {} ns scan cpu time", self.scan_cpu_avg_ns)?;
        writeln!(f, "  {:.1} shrunk objects", self.shrunk_per_scan_avg())?;
        writeln!(f, "maximum:")?;
        writeln!(f, "  {} ns max scan time", self.scan_time_max_ns)?;
        writeln!(f, "  {} ns max scan cpu time", self.scan_cpu_max_ns)?;
        write!(f, "  {} scans over 1 ms", self.scans_over_1ms)
    }
}
