//! Write-behind with delayed allocation (`MountOptions::data_cache`): a write copies its
//! bytes into the inode's dirty pages and reserves space for the blocks it will need, and
//! returns; the blocks are allocated and written when the pages are written back (by
//! `fsync`, `sync`, unmount, a writer over the cap, an operation that needs the data on the
//! device, or the daemon's background thread). A file written whole before its writeback gets
//! one extent of its size.
//!
//! Owns: each inode's dirty pages (`PageSet`, kept inside the inode's I/O lock, so readers
//! see them under the shared lock and every mapping change holds them exclusively), the
//! count of dirty bytes, the list of inodes with dirty pages and their lost writebacks; the
//! reserved blocks it holds back in the allocator (`Allocator::hold_back`).
//! Invariants:
//! - a page holds its whole block as the file should read; a page over a hole, or over a
//!   block the file shares with others (reflink: writeback copies it first), holds a
//!   reservation of one block (a CoW extent size hint's worth for a shared one), and an
//!   inode with any such page `META_BLOCKS` more, so the writer learns of a full
//!   filesystem, not its writeback;
//! - writeback takes the direct path's steps (allocate unwritten, write the data, mark it
//!   written in a later transaction), so a crash shows each block's old, new or zero bytes,
//!   never stale ones; the size may be logged before the data, which then reads as zeros;
//! - an inode with pages is on the dirty list, which holds a reference: it is never
//!   reclaimed with data in memory;
//! - a writer over the cap writes pages back before its own are accepted, so dirty bytes
//!   exceed the cap by at most one write per writer.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cairn_alloc::{Allocator, ReservedScope};
use cairn_journal::Reservation;
use cairn_lockrank::{Mutex, Rank};

use crate::background::BackgroundSignal;
use crate::bmap::{FileMap, Mapping};
use crate::data::check_data_file;
use crate::fs::Filesystem;
use crate::inode::{Inode, InodeData, now};
use crate::types::Credentials;
use crate::{FsError, iobuf, perm};

/// Blocks reserved beyond its data for each inode with pages over holes: what its extent
/// map may grow by in a writeback (a split at every level of a deep map).
const META_BLOCKS: u64 = 8;
/// Free blocks never promised to cached writes, so operations that allocate without a
/// reservation (directories, inode chunks) still find room once the cache is full.
const SLACK_BLOCKS: u64 = 64;
/// A background pass stops writing back for the cache's fill after this long, so the daemon
/// can take the core out (data the commit window says is due goes whatever the time).
const PASS_BUDGET: Duration = Duration::from_millis(200);
/// The most runs and blocks written back in one batch (its device writes in flight together,
/// then its transactions).
const BATCH_RUNS_MAX: usize = 64;
const BATCH_BLOCKS_MAX: u64 = 4096;

/// One inode's dirty pages, by file block.
#[derive(Debug, Default)]
pub(crate) struct PageSet {
    pages: BTreeMap<u64, Page>,
    /// Pages over holes: the blocks writeback will allocate (`InodeData::delayed_blocks`).
    over_holes: u64,
    /// Blocks this inode holds reserved: one per page over a hole, plus `META_BLOCKS`.
    reserved: u64,
}

/// A cached block. Plain heap memory, not an `AlignedBuf`: writeback copies pages into an
/// aligned buffer anyway, and a 4 KiB-aligned allocation can cost the allocator twice its
/// size, which the cap would not see.
#[derive(Debug)]
struct Page {
    bytes: Box<[u8]>,
    over_hole: bool,
    /// Holds a reserved block: over a hole, or over a block the file shares (reflink), which
    /// writeback copies first.
    reserved: bool,
}

/// What a failed writeback did to cached data (reported once, by the next `fsync`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LostWrite {
    NoSpace,
    Io,
}

impl PageSet {
    pub(crate) fn is_empty(&self) -> bool {
        self.pages.is_empty()
    }

    /// Copies the pages among blocks `first..` over `buf` (whole blocks from `first` on).
    pub(crate) fn overlay(&self, first: u64, buf: &mut [u8], block_size: usize) {
        let last = first + (buf.len() / block_size) as u64;
        for (&block, page) in self.pages.range(first..last) {
            let at = (block - first) as usize * block_size;
            buf[at..at + block_size].copy_from_slice(&page.bytes);
        }
    }

    /// Zeroes the cached bytes from byte `from` to the end of its block: what a size
    /// change leaves past the old end must read as zeros once the size grows again.
    pub(crate) fn zero_from(&mut self, from: u64, block_size: u64) {
        if let Some(page) = self.pages.get_mut(&(from / block_size)) {
            page.bytes[(from % block_size) as usize..].fill(0);
        }
    }

    /// The first byte of the first page holding bytes at or past byte `from` (the logged
    /// size): data the logged size may not cover yet. `u64::MAX` when there is none.
    pub(crate) fn first_cached_byte(&self, from: u64, block_size: u64) -> u64 {
        self.pages
            .range(from / block_size..)
            .next()
            .map_or(u64::MAX, |(&block, _)| block * block_size)
    }

    /// The next runs of consecutive pages to write back together, in file order: at most
    /// `BATCH_RUNS_MAX` runs and `BATCH_BLOCKS_MAX` blocks.
    fn next_batch(&self) -> Vec<(u64, u64)> {
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for (blocks, &block) in (0u64..).zip(self.pages.keys()) {
            let full = runs.len() == BATCH_RUNS_MAX || blocks >= BATCH_BLOCKS_MAX;
            match runs.last_mut() {
                Some((_, last)) if *last == block && blocks < BATCH_BLOCKS_MAX => *last += 1,
                _ if full => break,
                _ => runs.push((block, block + 1)),
            }
        }
        runs
    }
}

/// The list of inodes with dirty pages, oldest first.
#[derive(Debug, Default)]
struct DirtyList {
    by_age: BTreeMap<u64, (Instant, Arc<Inode>)>,
    age_of: HashMap<u64, u64>,
    next: u64,
}

impl DirtyList {
    fn add(&mut self, inode: &Arc<Inode>) {
        if self.age_of.contains_key(&inode.number) {
            return;
        }
        self.next += 1;
        self.age_of.insert(inode.number, self.next);
        self.by_age
            .insert(self.next, (Instant::now(), Arc::clone(inode)));
    }

    fn remove(&mut self, number: u64) {
        if let Some(age) = self.age_of.remove(&number) {
            self.by_age.remove(&age);
        }
    }

    fn oldest(&self) -> Option<(Instant, Arc<Inode>)> {
        let (_, (since, inode)) = self.by_age.first_key_value()?;
        Some((*since, Arc::clone(inode)))
    }

    fn inodes(&self) -> Vec<Arc<Inode>> {
        self.by_age
            .values()
            .map(|(_, inode)| Arc::clone(inode))
            .collect()
    }
}

/// The filesystem-wide state of write-behind.
#[derive(Debug)]
pub(crate) struct WriteBehind {
    /// Dirty bytes allowed; 0 turns write-behind off.
    cap: u64,
    dirty_bytes: AtomicU64,
    /// Holds the reserved blocks back from every other allocation (`hold_back`).
    alloc: Arc<Allocator>,
    /// Inodes whose cached data a failed writeback lost, reported by their next `fsync`;
    /// kept here, not with the pages, so reclaiming the inode cannot lose the report.
    lost: Mutex<HashMap<u64, LostWrite>>,
    list: Mutex<DirtyList>,
    /// Wakes the background pass when dirty bytes pass a quarter of the cap.
    wake: Arc<BackgroundSignal>,
    written_back_bytes: AtomicU64,
    throttled: AtomicU64,
    lost_writes: AtomicU64,
}

/// Write-behind's counters, for `cairn stats`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteBehindStats {
    /// The cap on dirty bytes (0: write-behind is off).
    pub cap_bytes: u64,
    pub dirty_bytes: u64,
    pub reserved_blocks: u64,
    pub written_back_bytes: u64,
    /// Writes that found the cache full and wrote pages back first.
    pub throttled_writes: u64,
    /// Writebacks that failed, losing cached data (reported by the file's next `fsync`).
    pub lost_writebacks: u64,
}

impl WriteBehind {
    pub(crate) fn new(cap: u64, alloc: Arc<Allocator>, wake: Arc<BackgroundSignal>) -> Self {
        Self {
            cap,
            dirty_bytes: AtomicU64::new(0),
            alloc,
            lost: Mutex::new(Rank::Leaf, HashMap::new()),
            list: Mutex::new(Rank::Leaf, DirtyList::default()),
            wake,
            written_back_bytes: AtomicU64::new(0),
            throttled: AtomicU64::new(0),
            lost_writes: AtomicU64::new(0),
        }
    }

    pub(crate) fn is_on(&self) -> bool {
        self.cap > 0
    }

    pub(crate) fn reserved_blocks(&self) -> u64 {
        self.alloc.held_back()
    }

    pub(crate) fn stats(&self) -> WriteBehindStats {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        WriteBehindStats {
            cap_bytes: self.cap,
            dirty_bytes: load(&self.dirty_bytes),
            reserved_blocks: self.reserved_blocks(),
            written_back_bytes: load(&self.written_back_bytes),
            throttled_writes: load(&self.throttled),
            lost_writebacks: load(&self.lost_writes),
        }
    }

    fn over_cap(&self) -> bool {
        self.dirty_bytes.load(Ordering::Relaxed) >= self.cap
    }

    fn over_background(&self) -> bool {
        self.dirty_bytes.load(Ordering::Relaxed) > self.cap / 4
    }

    /// Gives back `blocks` of `pages`' reservation.
    fn unreserve(&self, pages: &mut PageSet, blocks: u64) {
        let blocks = blocks.min(pages.reserved);
        pages.reserved -= blocks;
        self.alloc.release_held_back(blocks);
    }

    /// Drops pages `first..last` (all of them written back or lost), with their
    /// reservations; the inode leaves the list once it has no pages.
    fn remove_pages(&self, number: u64, pages: &mut PageSet, first: u64, last: u64) {
        let keys: Vec<u64> = pages.pages.range(first..last).map(|(&b, _)| b).collect();
        let (mut holes, mut reserved) = (0, 0);
        for block in &keys {
            if let Some(page) = pages.pages.remove(block) {
                holes += u64::from(page.over_hole);
                reserved += u64::from(page.reserved);
                self.dirty_bytes
                    .fetch_sub(page.bytes.len() as u64, Ordering::Relaxed);
            }
        }
        self.unreserve(pages, reserved);
        pages.over_holes -= holes;
        if pages.pages.is_empty() {
            let rest = pages.reserved;
            self.unreserve(pages, rest);
            self.list.lock().remove(number);
        }
    }
}

/// A batch's device writes, and its runs that land in unwritten extents.
struct BatchWrites {
    writes: Vec<DeviceWrite>,
    converts: Vec<(u64, u64)>,
}

/// One device write of a batch: bytes `range` of the batch's buffer at device byte `offset`.
struct DeviceWrite {
    offset: u64,
    range: std::ops::Range<usize>,
}

/// How a block a write lands in is backed before the write.
#[derive(Clone, Copy)]
enum Backing {
    Hole,
    Unwritten,
    Written(u64),
}

impl Filesystem {
    /// Accepts a write into the inode's pages (see the module comment); a full filesystem
    /// is found here, after writing everything back once to turn reservations into exact
    /// allocations.
    pub(crate) fn write_cached(
        &self,
        inode: u64,
        offset: u64,
        data: &[u8],
        clear_set_id_for: Option<&Credentials>,
    ) -> Result<u32, FsError> {
        self.throttle_writer();
        let handle = self.live_inode(inode)?;
        match self.accept_write(&handle, offset, data, clear_set_id_for) {
            Err(FsError::NoSpace) => {
                // Another file's failed writeback is that file's to report.
                let _ = self.write_back_all();
                self.reclaim_speculative(inode)?;
                self.accept_write(&handle, offset, data, clear_set_id_for)
            }
            other => other,
        }
    }

    fn accept_write(
        &self,
        handle: &Arc<Inode>,
        offset: u64,
        data: &[u8],
        clear_set_id_for: Option<&Credentials>,
    ) -> Result<u32, FsError> {
        let mut pages = handle.io.write();
        let old_size = {
            let mut meta = handle.data.lock();
            check_data_file(&meta)?;
            let old_size = meta.core.size;
            if offset > old_size {
                self.clear_past_eof(handle.number, &mut meta, old_size, offset)?;
            }
            old_size
        };
        if data.is_empty() {
            return Ok(0);
        }
        let block_size = u64::from(self.geometry.block_size);
        if offset > old_size {
            pages.zero_from(old_size, block_size);
        }
        let end = offset + data.len() as u64;
        let new_blocks = self.backing_of_new_pages(handle, &pages, offset, end)?;
        let holes = new_blocks
            .iter()
            .filter(|(_, b)| matches!(b, Backing::Hole))
            .count() as u64;
        let (shared, cow_blocks) = self.shared_new_pages(handle, &new_blocks)?;
        self.reserve(&mut pages, holes + cow_blocks)?;
        let filled = self.fill_pages(&mut pages, (&new_blocks, &shared), offset, data);
        if pages.is_empty() {
            self.write_behind
                .remove_pages(handle.number, &mut pages, 0, 0);
        } else {
            self.write_behind.list.lock().add(handle);
        }
        filled?;
        let mut meta = handle.data.lock();
        meta.delayed_blocks = pages.over_holes;
        let now = now();
        meta.core.size = meta.core.size.max(end);
        meta.core.mtime = now;
        meta.core.ctime = now;
        let cleared = clear_set_id_for.is_some_and(|writer| perm::clear_set_id(&mut meta, writer));
        if cleared {
            let mut tx = self.begin(self.write_reservation())?;
            Self::log_inode(&mut tx, handle.number, &mut meta);
            self.commit(tx, &mut [&mut meta])?;
        }
        drop(meta);
        Self::count(&self.counters.writes, 1);
        Self::count(&self.counters.write_bytes, data.len() as u64);
        if self.write_behind.over_background() {
            self.write_behind.wake.wake();
        }
        Ok(data.len() as u32)
    }

    /// The blocks of `offset..end` without a page yet, each with what backs it now.
    fn backing_of_new_pages(
        &self,
        handle: &Inode,
        pages: &PageSet,
        offset: u64,
        end: u64,
    ) -> Result<Vec<(u64, Backing)>, FsError> {
        let block_size = u64::from(self.geometry.block_size);
        let (first, last) = (offset / block_size, end.div_ceil(block_size));
        let generation = handle.data.lock().core.generation;
        let extents = self.data_cache.inode(handle.number, generation);
        let mut found = Vec::new();
        let mut block = first;
        while block < last {
            let (run_end, backing) = match self.map_block(handle, &extents, block)? {
                Mapping::Hole { length } => (block.saturating_add(length), Backing::Hole),
                Mapping::Mapped(run) if run.unwritten => (run.file_end(), Backing::Unwritten),
                Mapping::Mapped(run) => (run.file_end(), Backing::Written(run.fs_block.0)),
            };
            let run_end = run_end.min(last);
            for at in block..run_end {
                if pages.pages.contains_key(&at) {
                    continue;
                }
                let backing = match backing {
                    Backing::Written(start) => Backing::Written(start + (at - block)),
                    other => other,
                };
                found.push((at, backing));
            }
            block = run_end;
        }
        Ok(found)
    }

    /// The new pages over blocks the file shares (reflink: writeback copies them first), and
    /// the blocks those copies may take (a block each, or a CoW extent size hint's worth).
    fn shared_new_pages(
        &self,
        handle: &Inode,
        new_blocks: &[(u64, Backing)],
    ) -> Result<(std::collections::BTreeSet<u64>, u64), FsError> {
        let mut shared = std::collections::BTreeSet::new();
        let hint = {
            let meta = handle.data.lock();
            if meta.core.flags & cairn_format::inode::INODE_FLAG_REFLINK == 0 {
                return Ok((shared, 0));
            }
            u64::from(meta.core.cow_extent_size_hint.max(1))
        };
        // Runs of pages over consecutive written blocks, asked about one run at a time.
        let mut runs: Vec<(u64, u64, u32)> = Vec::new();
        for &(block, backing) in new_blocks {
            let Backing::Written(physical) = backing else {
                continue;
            };
            match runs.last_mut() {
                Some(run)
                    if run.0 + u64::from(run.2) == block
                        && run.1 + u64::from(run.2) == physical =>
                {
                    run.2 += 1
                }
                _ => runs.push((block, physical, 1)),
            }
        }
        for (block, physical, length) in runs {
            let mut ctx = cairn_btree::CacheContext::new(&self.cache);
            let range = (cairn_format::FsBlock(physical), length);
            let log = crate::glue::JournalLog(&self.journal);
            for (start, count, _) in self.alloc.shared_runs(&mut ctx, &log, range)? {
                let first = block + (start.0 - physical);
                shared.extend(first..first + u64::from(count));
            }
        }
        let blocks = shared.len() as u64 * hint;
        Ok((shared, blocks))
    }

    /// Reserves `holes` blocks (pages over holes or over shared blocks; and the inode's
    /// metadata share, if it has none yet) out of the free space not already promised;
    /// `NoSpace` if they do not fit.
    fn reserve(&self, pages: &mut PageSet, holes: u64) -> Result<(), FsError> {
        if holes == 0 {
            return Ok(());
        }
        let wanted = holes + if pages.reserved == 0 { META_BLOCKS } else { 0 };
        // Held back first, then checked: concurrent writers each see the others' share.
        let alloc = &self.write_behind.alloc;
        alloc.hold_back(wanted);
        let fits = self
            .free_blocks_estimate()
            .map(|free| free >= alloc.held_back() + SLACK_BLOCKS);
        match fits {
            Ok(true) => {
                pages.reserved += wanted;
                Ok(())
            }
            Ok(false) => {
                alloc.release_held_back(wanted);
                Err(FsError::NoSpace)
            }
            Err(error) => {
                alloc.release_held_back(wanted);
                Err(error)
            }
        }
    }

    /// Free blocks beyond the AGs' reserves, as the allocator counts them when it holds
    /// reserved blocks back (an AG it has not seen yet is read once, so it counts that too).
    fn free_blocks_estimate(&self) -> Result<u64, FsError> {
        if let Some(free) = self.alloc.free_beyond_reserves() {
            return Ok(free);
        }
        for ag in 0..self.geometry.ag_count {
            if self.alloc.free_blocks_hint(ag).is_none() {
                self.alloc
                    .note_free_blocks(ag, self.read_agf(ag)?.free_blocks);
            }
        }
        Ok(self.alloc.free_beyond_reserves().unwrap_or(0))
    }

    /// Copies `data` (at byte `offset`) into the pages, creating those `new_blocks` names:
    /// a block the write covers only partly starts from its bytes on the device (written)
    /// or zeros.
    fn fill_pages(
        &self,
        pages: &mut PageSet,
        (new_blocks, shared): (&[(u64, Backing)], &std::collections::BTreeSet<u64>),
        offset: u64,
        data: &[u8],
    ) -> Result<(), FsError> {
        let block_size = u64::from(self.geometry.block_size);
        let end = offset + data.len() as u64;
        for &(block, backing) in new_blocks {
            let start = block * block_size;
            let covered = offset <= start && end >= start + block_size;
            let mut bytes = vec![0u8; block_size as usize].into_boxed_slice();
            if let (false, Backing::Written(physical)) = (covered, backing) {
                self.device.read_into(physical * block_size, &mut bytes)?;
            }
            let over_hole = matches!(backing, Backing::Hole);
            pages.over_holes += u64::from(over_hole);
            let reserved = over_hole || shared.contains(&block);
            let page = Page {
                bytes,
                over_hole,
                reserved,
            };
            pages.pages.insert(block, page);
            self.write_behind
                .dirty_bytes
                .fetch_add(block_size, Ordering::Relaxed);
        }
        // Every block of the write has a page now.
        let blocks = offset / block_size..end.div_ceil(block_size);
        for (&block, page) in pages.pages.range_mut(blocks) {
            let start = block * block_size;
            let (from, to) = (start.max(offset), (start + block_size).min(end));
            page.bytes[(from - start) as usize..(to - start) as usize]
                .copy_from_slice(&data[(from - offset) as usize..(to - offset) as usize]);
        }
        Ok(())
    }

    /// While the cache is over its cap, writes back the oldest inode (outside every lock of
    /// the writer's). Its failures are the oldest inode's, reported by its `fsync`.
    fn throttle_writer(&self) {
        let behind = &self.write_behind;
        if behind.over_cap() {
            behind.throttled.fetch_add(1, Ordering::Relaxed);
        }
        while behind.over_cap() {
            let Some((_, inode)) = behind.list.lock().oldest() else {
                return;
            };
            if self.settle(&inode).is_err() && self.check_writable().is_err() {
                return;
            }
        }
    }

    /// Writes the inode's pages back if it has any (taking its I/O lock): what an operation
    /// that reads the mapping itself does first.
    pub(crate) fn settle(&self, handle: &Inode) -> Result<(), FsError> {
        if !self.write_behind.is_on() || handle.io.read().is_empty() {
            return Ok(());
        }
        let mut pages = handle.io.write();
        self.write_back(handle, &mut pages)
    }

    /// Writes back every page of the inode whose I/O lock the caller holds exclusively, a
    /// batch of runs at a time. On failure the pages are dropped (the data is lost, as a
    /// failed writeback loses it on Linux), and the error is kept for the next `fsync` as
    /// well as returned.
    pub(crate) fn write_back(&self, handle: &Inode, pages: &mut PageSet) -> Result<(), FsError> {
        loop {
            let runs = pages.next_batch();
            if runs.is_empty() {
                return Ok(());
            }
            if let Err(error) = self.write_back_batch(handle, pages, &runs) {
                let lost = match error {
                    FsError::NoSpace => LostWrite::NoSpace,
                    _ => LostWrite::Io,
                };
                self.write_behind.lost.lock().insert(handle.number, lost);
                self.write_behind
                    .lost_writes
                    .fetch_add(1, Ordering::Relaxed);
                tracing::error!(
                    inode = handle.number,
                    %error,
                    "writing cached data back failed; the data is lost"
                );
                self.write_behind
                    .remove_pages(handle.number, pages, 0, u64::MAX);
                handle.data.lock().delayed_blocks = 0;
                return Err(error);
            }
            let block_size = u64::from(self.geometry.block_size);
            for &(first, last) in &runs {
                self.write_behind
                    .remove_pages(handle.number, pages, first, last);
                self.write_behind
                    .written_back_bytes
                    .fetch_add((last - first) * block_size, Ordering::Relaxed);
            }
            handle.data.lock().delayed_blocks = pages.over_holes;
        }
    }

    /// Writes back `runs` (consecutive pages each): allocates their holes, writes them to the
    /// device several at a time, then marks them written, as a direct write of each would.
    fn write_back_batch(
        &self,
        handle: &Inode,
        pages: &PageSet,
        runs: &[(u64, u64)],
    ) -> Result<(), FsError> {
        {
            // These allocations are what the reservations were held back for.
            let _scope = ReservedScope::enter();
            // A batch that finds the filesystem full gives back its earlier runs' blocks
            // (only what filled holes: blocks a copy-on-write replaced stay replaced).
            self.allocate_or_give_back(handle.number, &handle.data, runs, || {
                runs.iter().try_for_each(|&(first, last)| {
                    self.allocate_run(handle, first, last)?;
                    self.unshare_for_write(handle.number, handle, (first, last), None)
                        .map(drop)
                        .map_err(|stopped| stopped.error)
                })
            })?;
        }
        let block_size = u64::from(self.geometry.block_size);
        let blocks: u64 = runs.iter().map(|(first, last)| last - first).sum();
        let mut buf = iobuf::take((blocks * block_size) as usize);
        let mut at = 0usize;
        for &(first, last) in runs {
            let len = ((last - first) * block_size) as usize;
            pages.overlay(first, &mut buf[at..at + len], block_size as usize);
            at += len;
        }
        let written = self.device_writes(handle, runs).and_then(|batch| {
            self.submit_writes(&buf, &batch.writes)?;
            Ok(batch.converts)
        });
        iobuf::give_back(buf);
        let converts = written?;
        // The batch is the file's first pages: the rest start after its last run.
        let batch_end = runs.last().map_or(0, |&(_, last)| last);
        let after_batch = pages.first_cached_byte(batch_end * block_size, block_size);
        self.commit_runs(handle, &converts, after_batch)
    }

    /// Allocates what file blocks `first..last` lack (unwritten), with speculative
    /// preallocation past them for an appending file unless free space is short.
    fn allocate_run(&self, handle: &Inode, first: u64, last: u64) -> Result<(), FsError> {
        let inode = handle.number;
        let block_size = u64::from(self.geometry.block_size);
        let end = {
            let meta = handle.data.lock();
            (last * block_size)
                .min(meta.core.size)
                .max(first * block_size + 1)
        };
        let mut plan = self.plan_write(inode, &handle.data.lock(), first, last, end)?;
        if !plan.needs_blocks {
            return Ok(());
        }
        let promised = self.write_behind.reserved_blocks() + SLACK_BLOCKS;
        if self.free_blocks_estimate()? < promised + (plan.last - plan.first) {
            // Speculative blocks would eat other files' reservations.
            plan.last = last;
            plan.speculative_end = None;
        }
        self.allocate_planned(inode, handle, &plan, last)
    }

    /// The device writes of `runs` (laid out one after another in the batch's buffer): byte
    /// range in the buffer and device offset, one per mapped extent; and the runs that
    /// land in unwritten extents, which must be marked written.
    fn device_writes(&self, handle: &Inode, runs: &[(u64, u64)]) -> Result<BatchWrites, FsError> {
        let block_size = u64::from(self.geometry.block_size);
        let generation = handle.data.lock().core.generation;
        let extents = self.data_cache.inode(handle.number, generation);
        let (mut writes, mut converts) = (Vec::new(), Vec::new());
        let mut at = 0u64;
        for &(first, last) in runs {
            let mut block = first;
            let mut unwritten = false;
            while block < last {
                let Mapping::Mapped(extent) = self.map_block(handle, &extents, block)? else {
                    return Err(FsError::corrupt(
                        "file mapping",
                        block,
                        "hole after allocation",
                    ));
                };
                let run_end = extent.file_end().min(last);
                unwritten |= extent.unwritten;
                let physical = extent.fs_block.0 + (block - extent.file_block);
                let from = (at + (block - first) * block_size) as usize;
                writes.push(DeviceWrite {
                    offset: physical * block_size,
                    range: from..from + ((run_end - block) * block_size) as usize,
                });
                block = run_end;
            }
            if unwritten {
                converts.push((first, last));
            }
            at += (last - first) * block_size;
        }
        Ok(BatchWrites { writes, converts })
    }

    /// Submits `writes` of `buf` as one device batch: the device runs them at once (a
    /// 4 KiB write takes about 40 us here alone; 32 in flight finish in about 350 us).
    fn submit_writes(&self, buf: &[u8], writes: &[DeviceWrite]) -> Result<(), FsError> {
        let batch: Vec<_> = writes
            .iter()
            .map(|one| (one.offset, &buf[one.range.clone()]))
            .collect();
        self.device.write_batch(&batch).map_err(FsError::from)
    }

    /// The transactions after a batch's data is on the device: runs in unwritten extents
    /// become written, `EXTENTS_PER_STEP` runs a transaction (the reservation of one mapping
    /// step), and the inode is logged with its times and a size that covers no byte still
    /// unwritten: not the runs of the later transactions, nor `after_batch` (the first byte
    /// of the pages after the batch) and on.
    fn commit_runs(
        &self,
        handle: &Inode,
        converts: &[(u64, u64)],
        after_batch: u64,
    ) -> Result<(), FsError> {
        let inode = handle.number;
        let block_size = u64::from(self.geometry.block_size);
        // With nothing to convert, one transaction still logs the inode.
        let nothing: &[(u64, u64)] = &[];
        let chunks: Vec<&[(u64, u64)]> = match converts.is_empty() {
            true => vec![nothing],
            false => converts.chunks(crate::bmap::EXTENTS_PER_STEP).collect(),
        };
        for (index, chunk) in chunks.iter().enumerate() {
            let written_below = chunks
                .get(index + 1)
                .and_then(|next| next.first())
                .map_or(after_batch, |&(first, _)| first * block_size);
            let mut meta = handle.data.lock();
            let mut tx = self.begin(self.write_reservation())?;
            let mut map = FileMap::load_around(self, &mut tx, inode, &meta, chunk)?;
            for &(first, last) in *chunk {
                map.mark_written(first, last);
            }
            let logged_size = meta.disk_size;
            meta.cover_written(written_below);
            let size_grew = meta.disk_size > logged_size;
            let overwrite = Self::overwrite_orders_no_data(&mut tx, map.is_changed(), size_grew);
            let stored = map.store(self, &mut tx, &mut meta);
            Self::log_inode(&mut tx, inode, &mut meta);
            self.commit_inode(tx, &mut meta, overwrite && stored.is_ok())?;
            stored?;
        }
        Ok(())
    }

    /// Writes back every inode with dirty pages; the first failure is returned after all
    /// were tried.
    pub(crate) fn write_back_all(&self) -> Result<(), FsError> {
        let mut outcome = Ok(());
        loop {
            let oldest = self.write_behind.list.lock().oldest();
            let Some((_, inode)) = oldest else {
                return outcome;
            };
            if let Err(error) = self.settle(&inode)
                && outcome.is_ok()
            {
                outcome = Err(error);
            }
        }
    }

    /// A truncate to `size` of the inode whose I/O and metadata locks the caller holds
    /// (`pages`, `meta`): drops the pages past it, with their reservations, and zeroes the
    /// cached bytes past it in its last block. Size 0 drops them all (an inode being freed).
    pub(crate) fn truncate_pages(
        &self,
        number: u64,
        (pages, meta): (&mut PageSet, &mut InodeData),
        size: u64,
    ) {
        let block_size = u64::from(self.geometry.block_size);
        let first_gone = size.div_ceil(block_size);
        self.write_behind
            .remove_pages(number, pages, first_gone, u64::MAX);
        pages.zero_from(size, block_size);
        meta.delayed_blocks = pages.over_holes;
    }

    /// What the last writeback failure of inode `number` lost, once (for `fsync`); freeing
    /// the inode forgets it (`forget_lost_write`).
    pub(crate) fn take_lost_write(&self, number: u64) -> Result<(), FsError> {
        let lost = self.write_behind.lost.lock().remove(&number);
        match lost {
            None => Ok(()),
            Some(LostWrite::NoSpace) => Err(FsError::NoSpace),
            Some(LostWrite::Io) => Err(FsError::Io {
                what: "writing cached data back",
                source: "an earlier writeback failed; the data was lost".into(),
            }),
        }
    }

    /// Forgets a lost writeback of an inode being freed: its number may be reused.
    pub(crate) fn forget_lost_write(&self, number: u64) {
        if self.write_behind.is_on() {
            self.write_behind.lost.lock().remove(&number);
        }
    }

    /// One background pass as of `now`: writes back the oldest inodes while their pages
    /// have been dirty for `expire` (the commit window's half) or, for at most
    /// `PASS_BUDGET`, while dirty bytes are over a quarter of the cap. Returns whether it
    /// wrote back data that had waited `expire` (which the commit window then forces).
    /// Part of the background pass (`commit::commit_window_pass`).
    pub(crate) fn write_back_background(&self, now: Instant, expire: Duration) -> bool {
        let started = Instant::now();
        let behind = &self.write_behind;
        let mut wrote_expired = false;
        loop {
            let Some((since, inode)) = behind.list.lock().oldest() else {
                return wrote_expired;
            };
            let expired = now.saturating_duration_since(since) >= expire;
            let pressed = behind.over_background() && started.elapsed() < PASS_BUDGET;
            if !expired && !pressed {
                return wrote_expired;
            }
            wrote_expired |= expired;
            if let Err(error) = self.settle(&inode) {
                tracing::warn!(inode = inode.number, %error, "background writeback failed");
                if self.check_writable().is_err() {
                    return wrote_expired;
                }
            }
        }
    }

    /// Writes back the files a truncate emptied that hold cached data (the commit window
    /// does this before it forces the log: the checkpoint that makes such a truncate
    /// durable then holds the file's new data too, as far as it had arrived).
    pub(crate) fn write_back_emptied(&self) {
        let inodes: Vec<Arc<Inode>> = self.write_behind.list.lock().inodes();
        for inode in inodes {
            if !inode.data.lock().emptied_by_truncate {
                continue;
            }
            match self.write_back_whole(&inode) {
                // The force that follows makes the truncate durable with this data.
                Ok(()) => inode.data.lock().emptied_by_truncate = false,
                Err(error) => {
                    let inode = inode.number;
                    tracing::warn!(inode, %error, "writing back a rewritten file failed");
                }
            }
        }
    }

    /// Writes the inode's cached data back and logs its size, if the logged size is behind
    /// (what `fsync`, the last close of a file a truncate emptied and a rename over another
    /// file do first, so the size they make durable covers the data).
    pub(crate) fn write_back_whole(&self, handle: &Inode) -> Result<(), FsError> {
        self.settle(handle)?;
        let pages = handle.io.read();
        let mut meta = handle.data.lock();
        if !meta.size_not_logged() {
            return Ok(());
        }
        let block_size = u64::from(self.geometry.block_size);
        let logged_size = meta.disk_size;
        meta.cover_written(pages.first_cached_byte(logged_size, block_size));
        if meta.disk_size == logged_size {
            return Ok(());
        }
        let mut tx = self.begin(Reservation::for_items(&self.geometry, 0, 0, 1, 0))?;
        Self::log_inode(&mut tx, handle.number, &mut meta);
        self.commit(tx, &mut [&mut meta])?;
        Ok(())
    }
}
