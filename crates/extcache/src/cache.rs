//! The global half of the cache: configuration, the reclaim list, the shrinker and its thread.

use crate::clock::thread_cpu_ns;
use crate::error::ExtCacheError;
use crate::inode::{InodeExtents, InodeTree};
use crate::limits::{
    ENTRY_BYTES_ESTIMATE, INODES_WALKED_PER_CALL_DEFAULT, INODES_WALKED_PER_CALL_MAX,
    MEMORY_HIGH_BYTES_DEFAULT, MEMORY_LOW_BYTES_DEFAULT, SCAN_ENTRIES_PER_CALL_DEFAULT,
    SCAN_ENTRIES_PER_CALL_MAX, SHRINKER_IDLE_WAIT_MS, WORST_INODE_WALK_BATCH,
};
use crate::reclaim::ReclaimList;
use crate::stats::{Stats, StatsSnapshot, WorstInode};
use crate::wake::SleepAnnouncement;
use cairn_lockrank::{Mutex, Rank};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::{self, JoinHandle, Thread};
use std::time::{Duration, Instant};

/// How much memory the cache may use and how much work one shrink call may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheConfig {
    /// Above this many bytes of entries, reclaim starts.
    pub memory_high_bytes: u64,
    /// Reclaim stops once the cache is at or below this.
    pub memory_low_bytes: u64,
    /// Entries one shrink call examines at most (ext4's `nr_to_scan`), default 128.
    pub scan_entries_per_call: u32,
    /// Inodes one shrink call takes off the list at most, whether scanned, passed over as
    /// referenced or skipped as busy.
    pub inodes_walked_per_call: u32,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            memory_high_bytes: MEMORY_HIGH_BYTES_DEFAULT,
            memory_low_bytes: MEMORY_LOW_BYTES_DEFAULT,
            scan_entries_per_call: SCAN_ENTRIES_PER_CALL_DEFAULT,
            inodes_walked_per_call: INODES_WALKED_PER_CALL_DEFAULT,
        }
    }
}

impl CacheConfig {
    /// A configuration with watermarks given in entries rather than bytes.
    pub fn with_entry_watermarks(high_entries: u64, low_entries: u64) -> Self {
        CacheConfig {
            memory_high_bytes: high_entries.saturating_mul(ENTRY_BYTES_ESTIMATE),
            memory_low_bytes: low_entries.saturating_mul(ENTRY_BYTES_ESTIMATE),
            ..CacheConfig::default()
        }
    }

    /// Refuses watermarks out of order and per-call budgets that are zero or too large.
    pub fn validate(&self) -> Result<(), ExtCacheError> {
        let bad = |what, expected, found| {
            Err(ExtCacheError::BadConfig {
                what,
                expected,
                found,
            })
        };
        if self.memory_low_bytes > self.memory_high_bytes {
            return bad(
                "memory_low_bytes",
                "<= memory_high_bytes",
                self.memory_low_bytes,
            );
        }
        let scan = self.scan_entries_per_call;
        if scan == 0 || scan > SCAN_ENTRIES_PER_CALL_MAX {
            return bad(
                "scan_entries_per_call",
                "1..=SCAN_ENTRIES_PER_CALL_MAX",
                u64::from(scan),
            );
        }
        let walk = self.inodes_walked_per_call;
        if walk == 0 || walk > INODES_WALKED_PER_CALL_MAX {
            return bad(
                "inodes_walked_per_call",
                "1..=INODES_WALKED_PER_CALL_MAX",
                u64::from(walk),
            );
        }
        Ok(())
    }
}

/// What one shrink call did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShrinkOutcome {
    pub examined: u32,
    pub freed: u32,
    pub inodes_walked: u32,
    pub inodes_scanned: u32,
    /// Wall-clock time of the call, preemption included.
    pub elapsed_ns: u64,
    /// CPU time the calling thread spent in the call: the call's own work.
    pub cpu_ns: u64,
}

/// State shared by the cache handle, every inode handle and the shrinker thread.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) config: CacheConfig,
    pub(crate) list: Mutex<ReclaimList>,
    pub(crate) stats: Stats,
    /// Set above the high watermark, cleared at the low one (`maybe_shrink`'s hysteresis).
    reclaiming: AtomicBool,
    shrinker_thread: Mutex<Option<Thread>>,
    shrinker_sleeping: SleepAnnouncement,
}

impl Shared {
    fn memory_bytes(&self) -> u64 {
        self.stats
            .objects
            .load(Ordering::Relaxed)
            .saturating_mul(ENTRY_BYTES_ESTIMATE)
    }

    /// Puts an inode that gained its first entry at the tail of the reclaim list.
    pub(crate) fn link(&self, tree: &Arc<InodeTree>) {
        let mut list = self.list.lock();
        let before = list.len();
        // The slab only fails to grow past 4 billion inodes; such an inode stays cached and
        // unreclaimable rather than failing the fs operation that filled it.
        list.push_back(tree);
        let added = list.len() - before;
        drop(list);
        self.stats
            .inodes_on_list
            .fetch_add(added as u64, Ordering::Relaxed);
    }

    /// Takes an inode that lost its last entry off the reclaim list.
    pub(crate) fn unlink(&self, tree: &InodeTree) {
        let list_reference = self.list.lock().remove(tree);
        if list_reference.is_some() {
            self.stats.inodes_on_list.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Called after every edit: above the high watermark, wakes the shrinker thread if one
    /// sleeps. Costs two relaxed loads when below it.
    pub(crate) fn note_growth(&self) {
        if self.memory_bytes() <= self.config.memory_high_bytes {
            return;
        }
        self.reclaiming.store(true, Ordering::Relaxed);
        if self.shrinker_sleeping.take()
            && let Some(thread) = self.shrinker_thread.lock().as_ref()
        {
            thread.unpark();
        }
    }
}

/// The extent status cache of one mounted filesystem. Cheap to clone (one `Arc`).
#[derive(Debug, Clone)]
pub struct ExtentCache {
    shared: Arc<Shared>,
}

impl ExtentCache {
    pub fn new(config: CacheConfig) -> Result<Self, ExtCacheError> {
        config.validate()?;
        let shared = Shared {
            config,
            list: Mutex::new(Rank::Leaf, ReclaimList::new()),
            stats: Stats::default(),
            reclaiming: AtomicBool::new(false),
            shrinker_thread: Mutex::new(Rank::Leaf, None),
            shrinker_sleeping: SleepAnnouncement::new(),
        };
        Ok(ExtentCache {
            shared: Arc::new(shared),
        })
    }

    pub fn config(&self) -> CacheConfig {
        self.shared.config
    }

    /// A new, empty tree for inode `ino` (the fs's inode number, used for statistics). The
    /// in-core inode owns the handle; open one per inode.
    pub fn open_inode(&self, ino: u64) -> InodeExtents {
        InodeExtents::new(ino, Arc::clone(&self.shared))
    }

    /// Estimated bytes used by cached entries (`objects * ENTRY_BYTES_ESTIMATE`).
    pub fn memory_bytes(&self) -> u64 {
        self.shared.memory_bytes()
    }

    pub fn stats(&self) -> StatsSnapshot {
        self.shared.stats.snapshot()
    }

    /// One bounded shrink call: examines at most `nr_to_scan` entries (capped at
    /// `SCAN_ENTRIES_PER_CALL_MAX`) over at most `inodes_walked_per_call` inodes, least
    /// recently used first. Holds the list lock only to rotate one inode at a time and never
    /// waits for an inode's tree lock: a busy inode is skipped.
    pub fn shrink(&self, nr_to_scan: u32) -> ShrinkOutcome {
        let started = Instant::now();
        let cpu_started = thread_cpu_ns();
        let shared = &*self.shared;
        let mut budget = nr_to_scan.min(SCAN_ENTRIES_PER_CALL_MAX);
        let mut outcome = ShrinkOutcome::default();
        let mut victims = Vec::with_capacity(budget as usize);
        let (mut rotated, mut busy) = (0u64, 0u64);
        // Each inode is visited at most once per call: a second visit would find the referenced
        // bits the first one just cleared and take away the entries' second chance.
        let mut walk_limit = shared.config.inodes_walked_per_call;
        while budget > 0 && outcome.inodes_walked < walk_limit {
            let Some((tree, list_len)) = shared.list.lock().rotate_head() else {
                break;
            };
            if outcome.inodes_walked == 0 {
                walk_limit = walk_limit.min(u32::try_from(list_len).unwrap_or(u32::MAX));
            }
            outcome.inodes_walked += 1;
            if tree.referenced.load(Ordering::Relaxed) {
                tree.referenced.store(false, Ordering::Relaxed);
                rotated += 1;
                continue;
            }
            let Some(mut inner) = tree.inner.try_write() else {
                busy += 1;
                continue;
            };
            let (objects_before, delayed_before) = (inner.len(), inner.delayed_count());
            let scan = inner.scan(budget, &mut victims);
            tree.settle(shared, &inner, objects_before, delayed_before);
            drop(inner);
            budget = budget.saturating_sub(scan.examined.max(1));
            outcome.examined += scan.examined;
            outcome.freed += scan.freed;
            outcome.inodes_scanned += 1;
        }
        outcome.elapsed_ns = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        outcome.cpu_ns = thread_cpu_ns().saturating_sub(cpu_started);
        self.record_scan(&outcome, rotated, busy);
        outcome
    }

    fn record_scan(&self, outcome: &ShrinkOutcome, rotated: u64, busy: u64) {
        let stats = &self.shared.stats;
        stats.scans.fetch_add(1, Ordering::Relaxed);
        stats
            .scan_ns_total
            .fetch_add(outcome.elapsed_ns, Ordering::Relaxed);
        stats
            .scan_ns_max
            .fetch_max(outcome.elapsed_ns, Ordering::Relaxed);
        stats
            .scan_cpu_ns_total
            .fetch_add(outcome.cpu_ns, Ordering::Relaxed);
        stats
            .scan_cpu_ns_max
            .fetch_max(outcome.cpu_ns, Ordering::Relaxed);
        if outcome.elapsed_ns > 1_000_000 {
            stats.scans_over_1ms.fetch_add(1, Ordering::Relaxed);
        }
        stats
            .shrunk_total
            .fetch_add(u64::from(outcome.freed), Ordering::Relaxed);
        stats
            .examined_total
            .fetch_add(u64::from(outcome.examined), Ordering::Relaxed);
        stats
            .inodes_rotated_referenced
            .fetch_add(rotated, Ordering::Relaxed);
        stats.inodes_skipped_busy.fetch_add(busy, Ordering::Relaxed);
    }

    /// Direct reclaim for callers without a shrinker thread: once the cache has gone above the
    /// high watermark, each call runs one `shrink` of `scan_entries_per_call` until the cache is
    /// back at the low watermark. Returns `None` when no reclaim was due.
    pub fn maybe_shrink(&self) -> Option<ShrinkOutcome> {
        let shared = &*self.shared;
        let bytes = shared.memory_bytes();
        if bytes > shared.config.memory_high_bytes {
            shared.reclaiming.store(true, Ordering::Relaxed);
        } else if bytes <= shared.config.memory_low_bytes {
            shared.reclaiming.store(false, Ordering::Relaxed);
            return None;
        }
        if !shared.reclaiming.load(Ordering::Relaxed) {
            return None;
        }
        Some(self.shrink(shared.config.scan_entries_per_call))
    }

    /// Starts a background thread that sleeps until the cache goes above the high watermark
    /// and then shrinks in bounded calls, yielding between them, down to the low watermark.
    /// Only one may run per cache.
    pub fn start_shrinker(&self) -> Result<ShrinkerThread, ExtCacheError> {
        let mut registered = self.shared.shrinker_thread.lock();
        if registered.is_some() {
            return Err(ExtCacheError::ShrinkerRunning);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let (cache, thread_stop) = (self.clone(), Arc::clone(&stop));
        let handle = thread::Builder::new()
            .name("extcache-shrinker".to_string())
            .spawn(move || cache.shrinker_loop(&thread_stop))
            .map_err(|error| ExtCacheError::Spawn {
                reason: error.to_string(),
            })?;
        *registered = Some(handle.thread().clone());
        Ok(ShrinkerThread {
            cache: self.clone(),
            stop,
            handle: Some(handle),
        })
    }

    fn shrinker_loop(&self, stop: &AtomicBool) {
        const FRUITLESS_CALLS_BEFORE_SLEEP: u32 = 4;
        let shared = &*self.shared;
        let mut fruitless_calls = 0;
        while !stop.load(Ordering::Acquire) {
            let above_low = shared.memory_bytes() > shared.config.memory_low_bytes;
            if above_low && fruitless_calls < FRUITLESS_CALLS_BEFORE_SLEEP {
                let outcome = self.shrink(shared.config.scan_entries_per_call);
                fruitless_calls = if outcome.freed == 0 {
                    fruitless_calls + 1
                } else {
                    0
                };
                thread::yield_now();
                continue;
            }
            fruitless_calls = 0;
            // Growth between the check above and the announcement would not wake us, so the
            // announcement looks again (`wake.rs`).
            let high = shared.config.memory_high_bytes;
            if !shared
                .shrinker_sleeping
                .announce(|| shared.memory_bytes() > high)
            {
                continue;
            }
            thread::park_timeout(Duration::from_millis(SHRINKER_IDLE_WAIT_MS));
            shared.shrinker_sleeping.woke();
        }
    }

    /// The inode with the most cached entries. Walks the reclaim list in batches of
    /// `WORST_INODE_WALK_BATCH` slots, releasing the list lock between batches, so it never
    /// stalls the shrinker or the insert path for long (and may miss concurrent changes).
    pub fn worst_inode(&self) -> Option<WorstInode> {
        let mut worst: Option<WorstInode> = None;
        let mut first = 0;
        loop {
            let list = self.shared.list.lock();
            let capacity = list.capacity();
            list.visit_slots(first, WORST_INODE_WALK_BATCH, |tree| {
                let objects = tree.object_count.load(Ordering::Relaxed);
                if worst.is_none_or(|w| objects > w.objects) {
                    let delayed = tree.delayed_count.load(Ordering::Relaxed);
                    let reclaimable_objects = objects.saturating_sub(delayed);
                    worst = Some(WorstInode {
                        ino: tree.ino,
                        objects,
                        reclaimable_objects,
                    });
                }
            });
            drop(list);
            first += WORST_INODE_WALK_BATCH;
            if first >= capacity {
                return worst;
            }
        }
    }

    /// The reclaim list's structure, that every linked inode holds entries, and that the
    /// published totals match the linked inodes. Call when no other thread uses the cache.
    pub fn check_invariants(&self) -> Result<(), ExtCacheError> {
        let list = self.shared.list.lock();
        list.check_invariants()?;
        let broken = |what: String| Err(ExtCacheError::Invariant { what });
        let (mut objects, mut delayed, mut empty) = (0u64, 0u64, None);
        list.visit_slots(0, list.capacity(), |tree| {
            let count = tree.object_count.load(Ordering::Relaxed);
            if count == 0 {
                empty = Some(tree.ino);
            }
            objects += count;
            delayed += tree.delayed_count.load(Ordering::Relaxed);
        });
        let linked = list.len() as u64;
        drop(list);
        if let Some(ino) = empty {
            return broken(format!(
                "inode {ino} is on the reclaim list with no entries"
            ));
        }
        let stats = self.stats();
        if stats.objects != objects || stats.objects - stats.reclaimable_objects != delayed {
            return broken(format!(
                "totals {stats:?} but linked inodes hold {objects} ({delayed} delayed)"
            ));
        }
        if stats.inodes_on_list != linked {
            return broken(format!(
                "{} inodes on list published, {linked} linked",
                stats.inodes_on_list
            ));
        }
        Ok(())
    }
}

/// The running background shrinker. Dropping it (or `stop`) ends the thread and joins it.
#[derive(Debug)]
pub struct ShrinkerThread {
    cache: ExtentCache,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl ShrinkerThread {
    /// Stops the thread and waits for it to finish its current (bounded) call.
    pub fn stop(mut self) {
        self.shut_down();
    }

    fn shut_down(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(handle) = self.handle.take() {
            handle.thread().unpark();
            // A panic in the shrinker thread has nothing left to clean up; ignore it here.
            let _ = handle.join();
        }
        *self.cache.shared.shrinker_thread.lock() = None;
    }
}

impl Drop for ShrinkerThread {
    fn drop(&mut self) {
        self.shut_down();
    }
}
