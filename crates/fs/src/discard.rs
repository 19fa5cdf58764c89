//! Giving freed space back to the device: online discard (`MountOptions::discard`) and trim
//! of all free space (`Filesystem::trim`, what `cairn trim` and FITRIM do).
//!
//! Online discard: every freed range stays busy in the allocator until discarded. When a
//! checkpoint becomes durable, the journal's completion hook wakes the discard thread, which
//! takes the ranges whose free that checkpoint (or an earlier one) made durable, discards
//! them (a hole punched in an image file, `BLKDISCARD` on a device) and reports them done;
//! only then may they be allocated again. So a discard never lands on a block that a crash
//! could still need (its free is durable, and recovery replays no earlier image of a freed
//! metadata block: the free logged a cancel record), nor on a block handed out again.
//! Discard failures only cost space: they are counted and logged, never returned.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use cairn_alloc::Allocator;
use cairn_blockdev::BlockDevice;
use cairn_format::{AgBlock, AgNumber, Geometry};
use cairn_journal::Reservation;
use parking_lot::{Condvar, Mutex};

use crate::FsError;
use crate::fs::Filesystem;
use crate::glue::JournalLog;

/// Ranges one AG lock or one discard batch covers at most.
const DISCARD_BATCH_MAX: usize = 64;
/// How long the discard thread sleeps when nothing wakes it.
const IDLE_WAKE: Duration = Duration::from_secs(1);
/// Least time between the discard thread's own log forces. A free is tagged with the
/// sequence after the current one (its transaction may commit into the next context), so
/// its discard can wait for a checkpoint that an idle filesystem never writes; the thread
/// forces that one itself, at most this often.
const FORCE_INTERVAL: Duration = Duration::from_secs(1);

/// What a trim did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TrimReport {
    /// Bytes of free space discarded.
    pub bytes: u64,
    /// Free extents (or pieces of them between busy ranges) discarded.
    pub extents: u64,
}

/// Counters of online discard.
#[derive(Debug, Default)]
struct Counters {
    extents: AtomicU64,
    bytes: AtomicU64,
    failures: AtomicU64,
}

/// What the discard thread is asked to do.
#[derive(Debug, Default)]
struct Work {
    /// Newest durable checkpoint sequence reported by the journal.
    durable: u64,
    /// Every range freed up to this sequence has been discarded.
    done: u64,
    /// The log is being unmounted: no more forces.
    no_force: bool,
    stop: bool,
}

/// State shared by the filesystem, the journal hook and the discard thread.
#[derive(Debug)]
struct Shared {
    alloc: Arc<Allocator>,
    log: cairn_journal::ForceHandle,
    device: Arc<dyn BlockDevice>,
    geometry: Geometry,
    work: Mutex<Work>,
    wake: Condvar,
    progress: Condvar,
    counters: Counters,
}

/// The online discard thread of a mount with `discard`.
#[derive(Debug)]
pub(crate) struct Discarder {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Discarder {
    /// Starts the thread; `hook` is what the journal must call on each completion.
    pub(crate) fn start(
        alloc: Arc<Allocator>,
        journal: &cairn_journal::Journal,
        device: Arc<dyn BlockDevice>,
        geometry: Geometry,
    ) -> Result<Discarder, FsError> {
        let shared = Arc::new(Shared {
            alloc,
            log: journal.force_handle(),
            device,
            geometry,
            work: Mutex::new(Work::default()),
            wake: Condvar::new(),
            progress: Condvar::new(),
            counters: Counters::default(),
        });
        let worker = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("cairn-discard".into())
            .spawn(move || worker.run())
            .map_err(|error| FsError::Io {
                what: "starting the discard thread",
                source: Box::new(error),
            })?;
        // Weak: the journal holds the hook and `shared` holds the journal (its force
        // handle); a strong reference would keep both, and the device, alive for ever.
        let kicked = Arc::downgrade(&shared);
        journal.on_completion(Arc::new(move |sequence| {
            if let Some(shared) = kicked.upgrade() {
                shared.kick(sequence);
            }
        }));
        Ok(Discarder {
            shared,
            thread: Some(thread),
        })
    }

    /// Before the log is unmounted: the thread stops forcing it.
    pub(crate) fn quiesce(&self) {
        self.shared.work.lock().no_force = true;
    }

    /// Waits until every range freed by a commit up to `durable` has been discarded.
    pub(crate) fn drain(&self, durable: u64) {
        let shared = &self.shared;
        shared.kick(durable);
        let mut work = shared.work.lock();
        while work.done < durable && !work.stop {
            shared.progress.wait_for(&mut work, IDLE_WAKE);
        }
    }

    /// Discards issued, bytes discarded and failures so far.
    pub(crate) fn counts(&self) -> (u64, u64, u64) {
        let c = &self.shared.counters;
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        (load(&c.extents), load(&c.bytes), load(&c.failures))
    }
}

impl Drop for Discarder {
    fn drop(&mut self) {
        self.shared.work.lock().stop = true;
        self.shared.wake.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Shared {
    /// The journal's completion hook: note the durable sequence and wake the thread. Takes
    /// only the work mutex, which nobody holds while waiting for anything else.
    fn kick(&self, sequence: u64) {
        let mut work = self.work.lock();
        work.durable = work.durable.max(sequence);
        drop(work);
        self.wake.notify_all();
    }

    fn run(&self) {
        let mut last_force = std::time::Instant::now();
        loop {
            let (target, may_force) = {
                let mut work = self.work.lock();
                if work.done >= work.durable && !work.stop {
                    self.wake.wait_for(&mut work, IDLE_WAKE);
                }
                if work.stop {
                    return;
                }
                (work.durable, !work.no_force)
            };
            for ag in 0..self.geometry.ag_count {
                self.discard_ag(ag, target);
            }
            self.work.lock().done = target;
            self.progress.notify_all();
            if may_force && last_force.elapsed() >= FORCE_INTERVAL {
                self.force_waiting(target);
                last_force = std::time::Instant::now();
            }
        }
    }

    /// Forces the log up to the newest free still waiting for its discard, if any. A
    /// failure shuts the journal down, which the filesystem reports itself.
    fn force_waiting(&self, durable: u64) {
        let Some(sequence) = self.alloc.pending_discard_sequence() else {
            return;
        };
        if sequence > durable {
            let _ = self.log.force(cairn_journal::CommitSequence(sequence));
        }
    }

    /// Discards every range of AG `ag` whose free is durable at `durable`.
    fn discard_ag(&self, ag: u32, durable: u64) {
        loop {
            let batch = self.alloc.take_discards(ag, durable, DISCARD_BATCH_MAX);
            if batch.is_empty() {
                return;
            }
            for &(start, length) in &batch {
                self.discard(ag, start, length);
            }
            self.alloc.finish_discards(ag, &batch);
        }
    }

    /// Discards one range (AG block `start`, `length` blocks), counting the outcome.
    fn discard(&self, ag: u32, start: u32, length: u32) -> bool {
        let block = self.geometry.fs_block(AgNumber(ag), AgBlock(start));
        let offset = self.geometry.byte_offset(block);
        let bytes = u64::from(length) * u64::from(self.geometry.block_size);
        let counters = &self.counters;
        match self.device.discard(offset, bytes) {
            Ok(true) => {
                counters.extents.fetch_add(1, Ordering::Relaxed);
                counters.bytes.fetch_add(bytes, Ordering::Relaxed);
                true
            }
            Ok(false) => false,
            Err(error) => {
                counters.failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%error, offset, bytes, "discard failed (only space is lost)");
                false
            }
        }
    }
}

impl Filesystem {
    /// Discards every free extent of at least `minimum_bytes` (what FITRIM does): each is
    /// marked busy while it is discarded, so nothing allocates it meanwhile; busy ranges
    /// (frees not yet durable, discards in progress) are skipped.
    pub fn trim(&self, minimum_bytes: u64) -> Result<TrimReport, FsError> {
        self.check_writable()?;
        // Two forces: a free is tagged with the sequence after the current one, so the
        // space freed so far is durable, and no longer busy, only after the second.
        self.journal.force_all()?;
        self.journal.force_all()?;
        let block_size = u64::from(self.geometry.block_size);
        let min_len = u32::try_from(minimum_bytes.div_ceil(block_size)).unwrap_or(u32::MAX);
        let mut report = TrimReport::default();
        for ag in 0..self.geometry.ag_count {
            let mut from = Some(0);
            while let Some(start) = from {
                let mut tx = self.begin(Reservation::new(0))?;
                let log = JournalLog(&self.journal);
                let found =
                    self.alloc
                        .trim_ag(&mut tx, &log, ag, start, min_len, DISCARD_BATCH_MAX);
                tx.tx.cancel()?;
                let (ranges, next) = found?;
                let discarded = self.trim_ranges(ag, &ranges, &mut report);
                // Busy until here whatever happened, so nothing allocated them meanwhile.
                self.alloc.finish_discards(ag, &ranges);
                discarded?;
                from = next;
            }
        }
        Ok(report)
    }

    /// Discards the free `ranges` of AG `ag` a trim took, adding them to `report`.
    fn trim_ranges(
        &self,
        ag: u32,
        ranges: &[(u32, u32)],
        report: &mut TrimReport,
    ) -> Result<(), FsError> {
        let block_size = u64::from(self.geometry.block_size);
        for &(start, length) in ranges {
            let block = self.geometry.fs_block(AgNumber(ag), AgBlock(start));
            let bytes = u64::from(length) * block_size;
            if self
                .device
                .discard(self.geometry.byte_offset(block), bytes)?
            {
                report.extents += 1;
                report.bytes += bytes;
            }
        }
        Ok(())
    }
}
