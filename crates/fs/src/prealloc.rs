//! Speculative preallocation past end of file, extent size hints, and trimming what goes
//! unused.
//!
//! An extending write that needs new blocks also maps unwritten blocks past its end: as many
//! as the file is large, rounded up to a power of two (so the reservation doubles as the file
//! grows), capped at `PREALLOC_BYTES_MAX`, none below `PREALLOC_MIN_FILE_BYTES`; the
//! `alloc_size` mount option fixes the amount instead. New extents try first to continue the
//! previous one exactly on disk, then go near it. This is the same for buffered and direct
//! writes (FUSE gives no delayed allocation), and `fsync` keeps the blocks, so an appender
//! that syncs every write still gets a few long extents.
//!
//! An extent size hint (blocks, in the inode; inherited from a directory with the
//! EXTSIZE_INHERIT flag) widens every allocation to whole, aligned hint-sized units.
//!
//! Unused speculative blocks are trimmed on the last close, or by `trim_idle` (run by the
//! thread `start_background_scan` starts) once the inode has been idle for a while. Inodes
//! with an extent size hint keep theirs (the fix XFS adopted for `O_DIRECT` appenders).
//! Only the speculative range recorded in memory is trimmed, so blocks `fallocate` placed
//! past EOF stay. After a crash the record is gone and the blocks stay mapped past EOF: they
//! are real extents (fsck counts them, nothing leaks) and go when the file is truncated or
//! removed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cairn_lockrank::{Mutex, Rank};

use crate::FsError;
use crate::bmap::{EXTENTS_PER_STEP, FileMap, Mapping, Placement, commit_unmap};
use crate::fs::Filesystem;
use crate::inode::{Inode, InodeData};

/// Files smaller than this get no speculative preallocation.
pub(crate) const PREALLOC_MIN_FILE_BYTES: u64 = 64 << 10;
/// Largest speculative preallocation.
pub(crate) const PREALLOC_BYTES_MAX: u64 = 8 << 30;

/// A file being extended is taken for growing while it was written within this long.
const TAIL_IDLE: Duration = Duration::from_secs(5);
/// Tails remembered at most (the oldest go first).
const TAILS_MAX: usize = 256;

/// Where a file being extended took blocks last: fs blocks `start..end`, and when a write
/// last extended it.
#[derive(Debug, Clone, Copy)]
struct Tail {
    start: u64,
    end: u64,
    extended: Instant,
}

/// Speculative ranges past EOF, by inode, the tails of files being extended, and counters.
#[derive(Debug)]
pub(crate) struct Preallocs {
    /// Inode -> (first block past the speculative range, last time it grew or was used).
    ranges: Mutex<HashMap<u64, (u64, Instant)>>,
    /// Open files being extended, by inode: where they took blocks last. A file whose exact
    /// continuation another file took moves apart only from one that is still growing
    /// there (`growing_at`): moving away from a file that stopped split the free space for
    /// nothing (a fill by four writers: 1.5 extents per file against 1.3).
    tails: Mutex<HashMap<u64, Tail>>,
    pub preallocated_blocks: AtomicU64,
    pub trimmed_blocks: AtomicU64,
    pub idle_scans: AtomicU64,
}

impl Default for Preallocs {
    fn default() -> Self {
        Self {
            ranges: Mutex::new(Rank::Leaf, HashMap::new()),
            tails: Mutex::new(Rank::Leaf, HashMap::new()),
            preallocated_blocks: AtomicU64::new(0),
            trimmed_blocks: AtomicU64::new(0),
            idle_scans: AtomicU64::new(0),
        }
    }
}

impl Preallocs {
    fn note(&self, inode: u64, end_block: u64) {
        let mut ranges = self.ranges.lock();
        let entry = ranges.entry(inode).or_insert((end_block, Instant::now()));
        entry.0 = entry.0.max(end_block);
        entry.1 = Instant::now();
    }

    /// An extending write of `inode` took fs blocks `start..end`. Blocks that continue the
    /// tail in place lengthen it: the tail is the whole run the file is growing, so a file
    /// whose continuation lies anywhere in it moves apart (with only the last piece kept, a
    /// file that started right after another's first write and grew in place once fell back
    /// to leapfrogging: 8-9 extents per file in one round of three).
    pub(crate) fn note_tail(&self, inode: u64, start: u64, end: u64) {
        let mut tails = self.tails.lock();
        if tails.len() >= TAILS_MAX && !tails.contains_key(&inode) {
            tails.retain(|_, tail| tail.extended.elapsed() < TAIL_IDLE);
            let oldest = tails.iter().min_by_key(|(_, tail)| tail.extended);
            if let Some((&oldest, _)) = oldest.filter(|_| tails.len() >= TAILS_MAX) {
                tails.remove(&oldest);
            }
        }
        let start = match tails.get(&inode) {
            Some(tail) if tail.end == start => tail.start,
            _ => start,
        };
        let extended = Instant::now();
        tails.insert(
            inode,
            Tail {
                start,
                end,
                extended,
            },
        );
    }

    /// A write extends `inode` (its tail, if it has one, stays growing).
    fn extended(&self, inode: u64) {
        if let Some(tail) = self.tails.lock().get_mut(&inode) {
            tail.extended = Instant::now();
        }
    }

    /// Whether fs block `block` lies in the tail of a file other than `except` that is
    /// still being extended.
    pub(crate) fn growing_at(&self, block: u64, except: u64) -> bool {
        self.tails.lock().iter().any(|(&inode, tail)| {
            inode != except
                && (tail.start..tail.end).contains(&block)
                && tail.extended.elapsed() < TAIL_IDLE
        })
    }

    pub(crate) fn take(&self, inode: u64) -> Option<u64> {
        self.ranges.lock().remove(&inode).map(|(end, _)| end)
    }

    pub fn stats(&self) -> crate::types::DataStats {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        crate::types::DataStats {
            preallocated_blocks: load(&self.preallocated_blocks),
            trimmed_blocks: load(&self.trimmed_blocks),
            idle_scans: load(&self.idle_scans),
        }
    }

    fn idle(&self, idle_for: Duration) -> Vec<u64> {
        let ranges = self.ranges.lock();
        ranges
            .iter()
            .filter(|(_, (_, used))| used.elapsed() >= idle_for)
            .map(|(&inode, _)| inode)
            .collect()
    }
}

/// What an extending write maps: file blocks `first..last` as `placement` says.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WritePlan {
    pub first: u64,
    pub last: u64,
    pub placement: Placement,
    /// End of the speculative range, when the plan reaches past the write.
    pub speculative_end: Option<u64>,
    /// Whether the written blocks have a hole; if not, the write allocates nothing (it
    /// lands in blocks an earlier write or preallocation mapped).
    pub needs_blocks: bool,
}

impl WritePlan {
    /// The allocation unit in blocks (the extent size hint, or 1).
    pub fn alignment_blocks(&self) -> u64 {
        u64::from(self.placement.alignment.max(1))
    }
}

impl Filesystem {
    /// Plans the allocation for a write of file blocks `first..last` ending at byte `end`.
    pub(crate) fn plan_write(
        &self,
        inode: u64,
        meta: &InodeData,
        first: u64,
        last: u64,
        end: u64,
    ) -> Result<WritePlan, FsError> {
        let hint = u64::from(meta.core.extent_size_hint);
        let mut plan = WritePlan {
            first,
            last,
            placement: Placement::near(true),
            speculative_end: None,
            needs_blocks: true,
        };
        plan.placement.exact_first = true;
        if hint > 1 {
            plan.first = first / hint * hint;
            plan.last = last.div_ceil(hint) * hint;
            plan.placement.alignment = hint as u32;
            plan.placement.min_len = hint as u32;
        }
        let map = FileMap::read_around(self, inode, meta, (first, last))?;
        let needs_blocks = has_hole(&map, first, last);
        plan.needs_blocks = needs_blocks;
        let extending = end > meta.core.size;
        if extending {
            self.preallocs.extended(inode);
            plan.placement.extending = true;
        }
        let speculative = self.speculative_blocks(meta.core.size);
        if needs_blocks && extending && speculative > 0 {
            let mut spec_end = last.saturating_add(speculative);
            if hint > 1 {
                spec_end = spec_end.div_ceil(hint) * hint;
            }
            let spec_end = spec_end.min(cairn_format::limits::FILE_BLOCK_MAX);
            plan.last = plan.last.max(spec_end);
            plan.speculative_end = Some(spec_end);
            plan.placement.apart = true;
        }
        Ok(plan)
    }

    /// Blocks to preallocate past a write that extends a file of `size` bytes.
    fn speculative_blocks(&self, size: u64) -> u64 {
        let block_size = u64::from(self.geometry.block_size);
        if let Some(fixed) = self.options.alloc_size {
            return fixed.div_ceil(block_size);
        }
        if size < PREALLOC_MIN_FILE_BYTES {
            return 0;
        }
        size.next_power_of_two().min(PREALLOC_BYTES_MAX) / block_size
    }

    /// Records the speculative range a write mapped (`plan.speculative_end`).
    pub(crate) fn note_preallocation(&self, inode: u64, plan: &WritePlan, mapped_blocks: u64) {
        if let Some(end) = plan.speculative_end {
            self.preallocs.note(inode, end);
            self.preallocs
                .preallocated_blocks
                .fetch_add(mapped_blocks, Ordering::Relaxed);
        }
    }

    /// On the last close: trims unused speculative blocks unless the inode has an extent
    /// size hint.
    pub(crate) fn trim_on_last_close(&self, handle: &Inode) -> Result<(), FsError> {
        self.preallocs.tails.lock().remove(&handle.number);
        self.trim_speculative(handle).map(|_| ())
    }

    /// Trims the speculative blocks of inodes idle for `idle_for` and not open; returns the
    /// blocks freed.
    pub fn trim_idle(&self, idle_for: Duration) -> Result<u64, FsError> {
        self.preallocs.idle_scans.fetch_add(1, Ordering::Relaxed);
        let mut freed = 0;
        for number in self.preallocs.idle(idle_for) {
            let Some(handle) = self.inodes.cached(number) else {
                self.preallocs.take(number);
                continue;
            };
            if handle.data.lock().opens > 0 {
                continue;
            }
            freed += self.trim_speculative(&handle)?;
        }
        Ok(freed)
    }

    /// When an allocation found no space: trims the speculative blocks of every other inode
    /// whose I/O lock is free right now (open or not; a busy one is skipped rather than waited
    /// for, since its writer may be here too), as XFS frees post-EOF blocks on ENOSPC before
    /// retrying. Returns the blocks freed.
    pub(crate) fn reclaim_speculative(&self, except: u64) -> Result<u64, FsError> {
        let mut freed = 0;
        for number in self.preallocs.idle(Duration::ZERO) {
            if number == except {
                continue;
            }
            let Some(handle) = self.inodes.cached(number) else {
                self.preallocs.take(number);
                continue;
            };
            let Some(_io) = handle.io.try_write() else {
                continue;
            };
            freed += self.trim_unused(&handle)?;
        }
        Ok(freed)
    }

    /// Unmaps the unwritten blocks of the recorded speculative range past EOF.
    fn trim_speculative(&self, handle: &Inode) -> Result<u64, FsError> {
        let _io = handle.io.write();
        self.trim_unused(handle)
    }

    /// `trim_speculative` for a caller holding the inode's I/O lock.
    fn trim_unused(&self, handle: &Inode) -> Result<u64, FsError> {
        let mut meta = handle.data.lock();
        if meta.core.extent_size_hint > 1 || !meta.is_allocated() {
            return Ok(0);
        }
        let Some(spec_end) = self.preallocs.take(handle.number) else {
            return Ok(0);
        };
        let block_size = u64::from(self.geometry.block_size);
        let eof_block = meta.core.size.div_ceil(block_size);
        if spec_end <= eof_block {
            return Ok(0);
        }
        let mut blocks = 0;
        loop {
            let mut tx = self.begin(self.write_reservation())?;
            let mut map = FileMap::load(self, &mut tx, handle.number, &meta)?;
            let (written, mut unused): (Vec<_>, Vec<_>) = map
                .cut(eof_block, spec_end)
                .into_iter()
                .partition(|e| !e.unwritten);
            // At most a step's worth of extents per transaction, the last ones first.
            let kept = unused.len().saturating_sub(EXTENTS_PER_STEP);
            for extent in written.into_iter().chain(unused.drain(..kept)) {
                map.insert(extent);
            }
            if unused.is_empty() {
                tx.tx.cancel()?;
                break;
            }
            commit_unmap(self, tx, handle.number, &mut meta, &mut map, &unused)?;
            blocks += unused.iter().map(|e| u64::from(e.length)).sum::<u64>();
        }
        self.preallocs
            .trimmed_blocks
            .fetch_add(blocks, Ordering::Relaxed);
        Ok(blocks)
    }

    /// Starts the thread that trims idle speculative preallocation every `interval`, for
    /// inodes idle that long. It holds only a weak reference: stop it (or drop the handle)
    /// before unmounting.
    pub fn start_background_scan(self: &Arc<Self>, interval: Duration) -> BackgroundScan {
        let weak: Weak<Filesystem> = Arc::downgrade(self);
        let stop = Arc::new(AtomicBool::new(false));
        let stop_flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("cairn-eofscan".into())
            .spawn(move || {
                while !stop_flag.load(Ordering::Acquire) {
                    std::thread::park_timeout(interval);
                    if stop_flag.load(Ordering::Acquire) {
                        break;
                    }
                    let Some(fs) = weak.upgrade() else { break };
                    // A failed scan is retried on the next round; the error has already
                    // shut the filesystem down if it was serious.
                    let _ = fs.trim_idle(interval);
                }
            })
            .ok();
        BackgroundScan { stop, thread }
    }
}

/// Whether file blocks `first..last` have any hole.
fn has_hole(map: &FileMap, first: u64, last: u64) -> bool {
    let mut block = first;
    while block < last {
        match map.lookup(block) {
            Mapping::Hole { .. } => return true,
            Mapping::Mapped(extent) => block = extent.file_end(),
        }
    }
    false
}

/// The background trim thread; stopped and joined by `stop` or on drop.
#[derive(Debug)]
pub struct BackgroundScan {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl BackgroundScan {
    /// Whether the thread could be started.
    pub fn is_running(&self) -> bool {
        self.thread.is_some()
    }

    /// Stops the thread and waits for it.
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}

impl Drop for BackgroundScan {
    fn drop(&mut self) {
        self.halt();
    }
}
