//! Shared extents (reflink): refcount intents and their finishing, and the staging blocks a
//! crash left behind.
//!
//! A file on a filesystem with the reflink feature may map blocks other files map too
//! (`INODE_FLAG_REFLINK`); the per-AG refcount trees count those mappings
//! (`cairn_alloc::Allocator::change_references`). Changes to the counts of blocks in other
//! AGs than the one a transaction may still lock (AG locks ascend) go through refcount
//! intents: the transaction that changes a file's map names the updates in an intent, and
//! finishing transactions apply them and log the done item (`finish_refcount_intent`),
//! a bounded amount each: one that cannot do all the updates logs the rest as a new intent
//! with the first one's done item, as XFS relogs a deferred operation. Mount finishes what a
//! crash left (`Filesystem::finish_intents`) and frees the blocks of copy-on-writes that
//! never reached a file map (`free_leftover_staging`).

use std::sync::atomic::{AtomicU64, Ordering};

use cairn_format::inode::{INODE_FLAG_REFLINK, INODE_FLAG_SYNC};
use cairn_format::log::RefcountUpdate;
use cairn_format::{AgNumber, Extent, MetaKind};
use cairn_journal::{IntentId, RefcountOp, Reservation};
use cairn_lockrank::{Order, RwLockWriteGuard};

use crate::FsError;
use crate::bmap::{EXTENTS_PER_STEP, FileMap, free_tree_levels, levels_bound, step_reservation};
use crate::data::check_data_file;
use crate::fs::Filesystem;
use crate::glue::{JournalLog, free_sequence};
use crate::inode::{Inode, now};
use crate::write_behind::PageSet;

/// The rule under which `copy_file_range` holds two I/O locks: by inode number, the lower
/// first (nothing else holds two).
const TWO_FILES: &str = "copy_file_range: source and destination by inode number";

/// Bytes one read and write of a data copy moves.
const COPY_CHUNK_BYTES: u64 = 1 << 20;

/// Counters of sharing and copy-on-write, for `cairn stats`.
#[derive(Debug, Default)]
pub(crate) struct ReflinkCounters {
    pub clones: AtomicU64,
    pub shared_blocks: AtomicU64,
    pub copied_bytes: AtomicU64,
    pub cow_writes: AtomicU64,
    pub cow_blocks: AtomicU64,
}

/// A snapshot of `ReflinkCounters`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReflinkStats {
    /// `copy_file_range` calls that shared blocks.
    pub clones: u64,
    /// Blocks those calls shared (mapped into the destination without copying).
    pub shared_blocks: u64,
    /// Bytes `copy_file_range` copied (unaligned heads and tails, or everything when the
    /// offsets differ within a block or the filesystem has no reflink feature).
    pub copied_bytes: u64,
    /// Writes (and other changes) that found shared blocks and copied them first.
    pub cow_writes: u64,
    /// Blocks those copies-on-write allocated.
    pub cow_blocks: u64,
}

impl ReflinkCounters {
    pub(crate) fn snapshot(&self) -> ReflinkStats {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        ReflinkStats {
            clones: load(&self.clones),
            shared_blocks: load(&self.shared_blocks),
            copied_bytes: load(&self.copied_bytes),
            cow_writes: load(&self.cow_writes),
            cow_blocks: load(&self.cow_blocks),
        }
    }
}

/// Refcount updates dropping one mapping of each of `removed`'s blocks.
pub(crate) fn decrease_updates(removed: &[Extent]) -> Vec<RefcountUpdate> {
    removed
        .iter()
        .map(|e| RefcountUpdate {
            op: RefcountOp::Decrease,
            start: e.fs_block,
            length: e.length,
        })
        .collect()
}

/// Records of the refcount tree one `change_references` call may rewrite: bounds the
/// buffers a call joins (`refcount_call_buffers`).
const RECORDS_PER_CALL: usize = 8;

/// Height bound of an AG's refcount tree (at most one record per block).
fn refcount_tree_levels(fs: &Filesystem) -> u32 {
    let records = u64::from(fs.geometry.ag_blocks);
    levels_bound(MetaKind::RefcountBtree, fs.geometry.block_size, records)
}

/// Most buffers one refcount change joins: the AGF and AGFL; both free-space trees twice
/// (the free-list refill before each insert and the frees of a decrease: a split path and
/// new root each, `2 * 2 * (free_levels + 1)`); and in the refcount tree the leaves
/// `RECORDS_PER_CALL` records and their neighbours span (4), a path above them with a
/// sibling at each level for merges and borrows (`3 * levels`), and a split path with a
/// new root (`levels + 1`).
pub(crate) fn refcount_call_buffers(fs: &Filesystem) -> u32 {
    let levels = refcount_tree_levels(fs);
    2 + 4 * (free_tree_levels(fs) + 1) + 4 + 3 * levels + levels + 1
}

/// The reservation of a transaction finishing refcount updates: two calls' buffers, an
/// intent and a done item.
pub(crate) fn refcount_reservation(fs: &Filesystem) -> Reservation {
    let buffers = 2 * refcount_call_buffers(fs);
    Reservation::for_items(&fs.geometry, buffers, fs.geometry.block_size, 0, 2)
}

/// Applies the refcount `updates` intent `intent` named and logs its done item, in as many
/// finishing transactions as they take (each logs the rest as a new intent).
pub(crate) fn finish_refcount_intent(
    fs: &Filesystem,
    intent: IntentId,
    updates: &[RefcountUpdate],
) -> Result<(), FsError> {
    let mut left = updates.to_vec();
    // Ascending blocks are ascending AGs: the allocator's lock order within a transaction.
    // At one start, increases first: a decrease never takes a block another update still
    // counts on to 0.
    left.sort_by_key(|update| (update.start.0, update.op != RefcountOp::Increase));
    let frees = left.iter().any(|update| update.op == RefcountOp::Decrease);
    let per_call = refcount_call_buffers(fs) as usize;
    let mut intent = intent;
    loop {
        let mut tx = fs.begin_finishing(refcount_reservation(fs))?;
        let sequence = free_sequence(&fs.journal);
        let log = JournalLog(&fs.journal);
        while let Some(update) = left.first_mut() {
            if tx.tx.joined_count() + per_call > 2 * per_call {
                break;
            }
            let range = (update.start, update.length);
            let calls = (sequence, RECORDS_PER_CALL);
            let done = fs
                .alloc
                .change_references(&mut tx, &log, range, update.op, calls)?;
            update.start.0 += u64::from(done);
            update.length -= done;
            if update.length == 0 {
                left.remove(0);
            }
        }
        tx.tx.log_refcount_done(intent);
        if !left.is_empty() {
            intent = tx.tx.log_refcount_intent(&left);
        }
        tx.tx.commit()?;
        if left.is_empty() {
            if frees {
                fs.blocks_freed();
            }
            return Ok(());
        }
    }
}

/// At mount, after the intents are finished: frees the staging blocks of every copy-on-write
/// a crash interrupted (their data never reached a file map). A cleanly unmounted
/// filesystem has none (every copy-on-write ends by unstaging or freeing its blocks).
pub(crate) fn free_leftover_staging(fs: &Filesystem) -> Result<(), FsError> {
    if fs.options.read_only || fs.recovery.clean || !fs.superblock.has_reflink() {
        return Ok(());
    }
    for ag in 0..fs.geometry.ag_count {
        let mut tx = fs.begin(Reservation::new(0))?;
        let runs = fs.alloc.staged_runs(&mut tx, AgNumber(ag));
        tx.tx.cancel()?;
        for (start, length) in runs? {
            let mut tx = fs.begin_finishing(refcount_reservation(fs))?;
            let sequence = free_sequence(&fs.journal);
            let log = JournalLog(&fs.journal);
            fs.alloc
                .free_staged(&mut tx, &log, (start, length), sequence)?;
            tx.tx.commit()?;
            fs.blocks_freed();
            tracing::info!(
                block = start.0,
                length,
                "freed copy-on-write staging blocks a crash left"
            );
        }
    }
    Ok(())
}

/// Whether the file `data` may map blocks another file maps (`INODE_FLAG_REFLINK`): only
/// such a file's writes copy on write.
pub(crate) fn may_share(data: &crate::inode::InodeData) -> bool {
    data.core.flags & INODE_FLAG_REFLINK != 0
}

impl Filesystem {
    /// `copy_file_range`: copies up to `len` bytes of file `src` at `src_offset` to file
    /// `dst` at `dst_offset`, stopping at the source's end of file; the destination grows as
    /// needed. Returns the bytes copied. With the reflink feature, when both offsets lie at
    /// the same place in a block, the whole blocks of the range (and the source's last,
    /// partial block when the copy ends at both files' ends) are shared, not copied: both
    /// files map the same blocks until one of them writes there (copy-on-write); the
    /// unaligned head and tail get new blocks of their own. The destination's size changes
    /// once, at the end, so a crash shows its old size or the new one. When the offsets
    /// differ within a block (or without reflink) the bytes are copied by writes. Ranges of
    /// one file must not overlap (checked on the length cut at the source's end, as Linux).
    pub fn copy_file_range(
        &self,
        src: u64,
        src_offset: u64,
        dst: u64,
        dst_offset: u64,
        len: u64,
    ) -> Result<u64, FsError> {
        self.check_writable()?;
        let max = cairn_format::limits::FILE_BLOCK_MAX;
        let too_far = |offset: u64| offset.checked_add(len).is_none_or(|end| end > max);
        if too_far(src_offset) || too_far(dst_offset) {
            return Err(FsError::InvalidArgument("copy range past the largest file"));
        }
        let source = self.live_inode(src)?;
        let target = self.live_inode(dst)?;
        let (src_size, src_flags) = {
            let meta = source.data.lock();
            check_data_file(&meta)?;
            (meta.core.size, meta.core.flags)
        };
        let dst_flags = {
            let meta = target.data.lock();
            check_data_file(&meta)?;
            crate::flags::check_copy_into(&meta, dst_offset)?;
            meta.core.flags
        };
        let len = len.min(src_size.saturating_sub(src_offset));
        let overlap = src_offset < dst_offset + len && dst_offset < src_offset + len;
        if src == dst && overlap {
            return Err(FsError::InvalidArgument("copy within one file onto itself"));
        }
        if len == 0 {
            return Ok(0);
        }
        if !self.copy_shares(src_offset, dst_offset) {
            self.copy_data((src, src_offset), (dst, dst_offset), len)?;
            return Ok(len);
        }
        let done = self.clone_range((&source, &target), (src_offset, dst_offset, len))?;
        self.reflink.clones.fetch_add(1, Ordering::Relaxed);
        // As XFS's remap: a sync-flagged file on either side makes the clone durable now
        // (the copying path's writes already are, through the destination's flag).
        if (src_flags | dst_flags) & INODE_FLAG_SYNC != 0 {
            self.fsync(dst, true)?;
        }
        Ok(done)
    }

    /// The sharing copy of `copy_file_range` (offsets at the same place in a block, `len`
    /// cut at the source's end), under both files' I/O locks (cached pages written back
    /// first), so nothing else changes either file meanwhile: past the destination's end
    /// cleared first; the head and tail blocks built and mapped as new blocks; the blocks
    /// between shared; the size set last. Returns the bytes copied (`len`, cut again at the
    /// source's end as it is under the lock).
    fn clone_range(
        &self,
        (source, target): (&Inode, &Inode),
        (src_offset, dst_offset, len): (u64, u64, u64),
    ) -> Result<u64, FsError> {
        let (mut source_pages, mut target_pages) = lock_two(source, target);
        if let Some(pages) = source_pages.as_deref_mut().filter(|p| !p.is_empty()) {
            self.write_back(source, pages)?;
        }
        if !target_pages.is_empty() {
            self.write_back(target, &mut target_pages)?;
        }
        self.set_reflink_flag(source)?;
        let bs = u64::from(self.geometry.block_size);
        let src_size = source.data.lock().core.size;
        let len = len.min(src_size.saturating_sub(src_offset));
        if len == 0 {
            return Ok(0);
        }
        let (dst_size, end) = {
            let mut meta = target.data.lock();
            let (size, end) = (meta.core.size, dst_offset + len);
            if end > size {
                // What a shrink left past the end must not come back with the new size.
                self.clear_past_eof(target.number, &mut meta, size, end)?;
            }
            (size, end)
        };
        let head = ((bs - src_offset % bs) % bs).min(len);
        // A head that ends inside its block (a copy within one block) leaves nothing to share.
        let (first, mut last) = ((src_offset + head).div_ceil(bs), (src_offset + len) / bs);
        // The source's last, partial block is shared too when the copy ends at the end of
        // the source and at or past the end of the destination: none of the destination's
        // bytes are in it, and the source's bytes past the new end never show (a growth
        // zeroes them first, copying the block).
        if src_offset + len == src_size && end >= dst_size {
            last = (src_offset + len).div_ceil(bs);
        }
        self.place_range((source, target), (src_offset, dst_offset), head)?;
        if last > first {
            let dst_first = (dst_offset + head) / bs;
            self.share_blocks(source, target, (first, last - first), dst_first)?;
        }
        let tail_from = (last * bs).clamp(src_offset + head, src_offset + len);
        let dst_tail = dst_offset + (tail_from - src_offset);
        let tail = src_offset + len - tail_from;
        self.place_range((source, target), (tail_from, dst_tail), tail)?;
        self.grow_to(target, end)?;
        Ok(len)
    }

    /// Copies source bytes `from..from + len` (inside one block of both files) to the
    /// destination at `to`, in a new block built from the destination's old one.
    fn place_range(
        &self,
        (source, target): (&Inode, &Inode),
        (from, to): (u64, u64),
        len: u64,
    ) -> Result<(), FsError> {
        if len == 0 {
            return Ok(());
        }
        let bs = u64::from(self.geometry.block_size);
        let read_block = |handle: &Inode, block: u64| -> Result<Vec<u8>, FsError> {
            let generation = handle.data.lock().core.generation;
            let extents = self.data_cache.inode(handle.number, generation);
            let mut buf = vec![0u8; bs as usize];
            self.read_blocks(handle, &extents, block, &mut buf)?;
            Ok(buf)
        };
        let bytes = read_block(source, from / bs)?;
        let mut block = read_block(target, to / bs)?;
        let (at, src_at) = ((to % bs) as usize, (from % bs) as usize);
        block[at..at + len as usize].copy_from_slice(&bytes[src_at..src_at + len as usize]);
        self.replace_block(target.number, &mut target.data.lock(), to / bs, &block)?;
        self.reflink.copied_bytes.fetch_add(len, Ordering::Relaxed);
        Ok(())
    }

    /// The last transaction of a clone: the destination's size grows to `end` (its data is
    /// all on the device), and its times move.
    fn grow_to(&self, target: &Inode, end: u64) -> Result<(), FsError> {
        let mut meta = target.data.lock();
        let mut tx = self.begin(Reservation::for_items(&self.geometry, 0, 0, 1, 0))?;
        let now = now();
        meta.core.size = meta.core.size.max(end);
        meta.cover_written(u64::MAX);
        meta.core.mtime = now;
        meta.core.ctime = now;
        Self::log_inode(&mut tx, target.number, &mut meta);
        self.commit(tx, &mut [&mut meta])?;
        Ok(())
    }

    /// Whether `copy_file_range` between these offsets shares blocks (reflink feature, both
    /// offsets at the same place in a block) rather than copying every byte.
    pub fn copy_shares(&self, src_offset: u64, dst_offset: u64) -> bool {
        let block_size = u64::from(self.geometry.block_size);
        self.superblock.has_reflink() && src_offset % block_size == dst_offset % block_size
    }

    /// Copies `len` bytes through the ordinary read and write paths (which copy on write
    /// where the destination shares blocks).
    fn copy_data(
        &self,
        (src, from): (u64, u64),
        (dst, to): (u64, u64),
        len: u64,
    ) -> Result<(), FsError> {
        let mut done = 0;
        while done < len {
            let chunk = (len - done).min(COPY_CHUNK_BYTES) as u32;
            let data = self.read_data(src, from + done, chunk)?;
            if data.is_empty() {
                break;
            }
            let wrote = self.write(dst, to + done, &data)?;
            done += u64::from(wrote);
        }
        self.reflink.copied_bytes.fetch_add(done, Ordering::Relaxed);
        Ok(())
    }

    /// Maps source blocks `first..first + count` into the destination from file block
    /// `dst_first` on, sharing them (the caller holds both files' I/O locks; the size is
    /// the caller's). Each step's refcount intent is finished before the next step.
    fn share_blocks(
        &self,
        source: &Inode,
        target: &Inode,
        (first, count): (u64, u64),
        dst_first: u64,
    ) -> Result<(), FsError> {
        let stop = first + count;
        let pieces = {
            let meta = source.data.lock();
            let map = FileMap::read_around(self, source.number, &meta, (first, stop))?;
            written_pieces(map.extents(), first, stop)
        };
        let shift = Shift { first, dst_first };
        let mut at = first;
        while at < stop {
            at = self.share_step(target, &pieces, (at, stop), shift)?;
        }
        Ok(())
    }

    /// One transaction of `share_blocks` from source block `at`: the destination blocks of
    /// up to `EXTENTS_PER_STEP` source pieces (and over up to as many destination extents)
    /// are unmapped and the source's blocks mapped there, with an intent counting the new
    /// mappings and dropping the old; then a second transaction applies it. Returns where
    /// the next step starts.
    fn share_step(
        &self,
        target: &Inode,
        pieces: &[Extent],
        (at, stop): (u64, u64),
        shift: Shift,
    ) -> Result<u64, FsError> {
        let source_runs = pieces.iter().map(|p| (p.file_block, p.file_end()));
        let src_end = step_end(source_runs, at, stop);
        let mut meta = target.data.lock();
        let mut tx = self.begin(step_reservation(self))?;
        let range = (shift.to_dst(at), shift.to_dst(src_end));
        let mut map = FileMap::load_around(self, &mut tx, target.number, &meta, &[range])?;
        let dst_runs = map.extents().iter().map(|e| (e.file_block, e.file_end()));
        let dst_end = step_end(dst_runs, range.0, range.1);
        let removed = map.cut(range.0, dst_end);
        let shared = clip(pieces, at, shift.to_src(dst_end));
        for piece in &shared {
            let to = shift.to_dst(piece.file_block);
            let extent = Extent::new(to, piece.fs_block, piece.length, false)
                .map_err(|e| FsError::corrupt("extent", piece.fs_block.0, e.to_string()))?;
            map.insert(extent);
        }
        if let Err(error) = map.store(self, &mut tx, &mut meta) {
            Self::log_inode(&mut tx, target.number, &mut meta);
            self.commit(tx, &mut [&mut meta])?;
            return Err(error);
        }
        let mut updates = increase_updates(&shared);
        updates.extend(decrease_updates(&removed));
        let intent = (!updates.is_empty()).then(|| tx.tx.log_refcount_intent(&updates));
        let added: u64 = shared.iter().map(|p| u64::from(p.length)).sum();
        let dropped: u64 = removed.iter().map(|e| u64::from(e.length)).sum();
        meta.core.flags |= INODE_FLAG_REFLINK;
        meta.core.block_count = (meta.core.block_count + added).saturating_sub(dropped);
        Self::log_inode(&mut tx, target.number, &mut meta);
        self.commit(tx, &mut [&mut meta])?;
        drop(meta);
        if let Some(intent) = intent {
            finish_refcount_intent(self, intent, &updates)?;
        }
        self.reflink
            .shared_blocks
            .fetch_add(added, Ordering::Relaxed);
        Ok(shift.to_src(dst_end))
    }

    /// Sets `INODE_FLAG_REFLINK` on a file about to share its blocks (before any is shared:
    /// its frees and writes must consult the refcount tree from then on).
    fn set_reflink_flag(&self, handle: &Inode) -> Result<(), FsError> {
        let mut meta = handle.data.lock();
        if meta.core.flags & INODE_FLAG_REFLINK != 0 {
            return Ok(());
        }
        let mut tx = self.begin(Reservation::for_items(&self.geometry, 0, 0, 1, 0))?;
        meta.core.flags |= INODE_FLAG_REFLINK;
        Self::log_inode(&mut tx, handle.number, &mut meta);
        self.commit(tx, &mut [&mut meta])?;
        Ok(())
    }
}

/// Source file blocks to destination file blocks: `first` maps to `dst_first`.
#[derive(Debug, Clone, Copy)]
struct Shift {
    first: u64,
    dst_first: u64,
}

impl Shift {
    fn to_dst(self, block: u64) -> u64 {
        block - self.first + self.dst_first
    }

    fn to_src(self, block: u64) -> u64 {
        block - self.dst_first + self.first
    }
}

/// The I/O locks of both files, the lower inode number first (one lock for one file): the
/// source's (`None` when it is the destination) and the destination's.
fn lock_two<'a>(
    source: &'a Inode,
    target: &'a Inode,
) -> (
    Option<RwLockWriteGuard<'a, PageSet>>,
    RwLockWriteGuard<'a, PageSet>,
) {
    let second = |inode: &'a Inode| {
        inode
            .io
            .write_with(inode.number, Order::Declared(TWO_FILES))
    };
    match source.number.cmp(&target.number) {
        std::cmp::Ordering::Equal => (None, target.io.write()),
        std::cmp::Ordering::Less => {
            let first = source.io.write();
            (Some(first), second(target))
        }
        std::cmp::Ordering::Greater => {
            let first = target.io.write();
            (Some(second(source)), first)
        }
    }
}

/// Refcount updates adding one mapping of each of `shared`'s blocks.
fn increase_updates(shared: &[Extent]) -> Vec<RefcountUpdate> {
    shared
        .iter()
        .map(|e| RefcountUpdate {
            op: RefcountOp::Increase,
            start: e.fs_block,
            length: e.length,
        })
        .collect()
}

/// The written extents of `extents` clipped to file blocks `first..stop` (holes and
/// unwritten extents read as zeros: the destination gets holes there).
fn written_pieces(extents: &[Extent], first: u64, stop: u64) -> Vec<Extent> {
    let written: Vec<Extent> = extents.iter().filter(|e| !e.unwritten).copied().collect();
    clip(&written, first, stop)
}

/// The parts of `extents` (sorted) inside file blocks `from..to`.
fn clip(extents: &[Extent], from: u64, to: u64) -> Vec<Extent> {
    extents
        .iter()
        .filter(|e| e.file_end() > from && e.file_block < to)
        .map(|e| crate::bmap::piece(e, e.file_block.max(from), e.file_end().min(to)))
        .collect()
}

/// Where a step from `at` (of `at..stop`) ends so that it spans at most `EXTENTS_PER_STEP`
/// of the `runs` (sorted `(first, end)` file block ranges): at the start of the first run
/// past that many (which lies past `at`), or `stop`.
fn step_end(runs: impl Iterator<Item = (u64, u64)>, at: u64, stop: u64) -> u64 {
    let mut inside = runs.filter(|&(first, end)| end > at && first < stop);
    match inside.nth(EXTENTS_PER_STEP) {
        Some((first, _)) => first.max(at + 1),
        None => stop,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use cairn_alloc::Request;
    use cairn_blockdev::{BlockDevice, MemDevice};
    use cairn_format::FsBlock;

    use super::*;
    use crate::types::{Credentials, FileKind, MountOptions};

    // Crashes after a transaction logged a refcount intent (sharing a file's blocks and,
    // over 40 alternating records, dropping shares) and another staged blocks for a
    // copy-on-write: mount applies the intents, in transactions of bounded size, and frees
    // the staged blocks.
    #[test]
    fn mount_finishes_refcount_intents_and_frees_staging() {
        let device = Arc::new(crate::test_device::formatted(64 << 20, [7; 16]));
        let dyn_device: Arc<dyn BlockDevice> = device.clone();
        let fs = Filesystem::mount(dyn_device, MountOptions::default()).unwrap();
        let who = Credentials::root();
        let file = fs
            .create(fs.root(), b"f", FileKind::Regular, 0o644, 0, &who)
            .unwrap();
        fs.write(file.inode, 0, &vec![1u8; 384 << 10]).unwrap();
        fs.sync().unwrap();
        let owned_before = owned(&fs);
        let extent = fs.file_extents(file.inode).unwrap()[0];
        let start = FsBlock(extent.physical / 4096);
        share_then_crash(&fs, start);
        let image = device.durable_image();
        drop(fs);
        let crashed: Arc<dyn BlockDevice> = Arc::new(MemDevice::from_image(image, 4096).unwrap());
        let fs = Filesystem::mount(crashed, MountOptions::default()).unwrap();
        assert_eq!(fs.recovery_report().unfinished_intents.len(), 1);
        let ag = fs.geometry.ag_of(start);
        let (records, summary) = {
            let mut tx = fs.begin(Reservation::new(0)).unwrap();
            let records = fs.alloc.refcount_records(&mut tx, ag).unwrap();
            let summary = fs.alloc.check_invariants(&mut tx, ag).unwrap();
            tx.tx.cancel().unwrap();
            (records, summary)
        };
        assert_eq!(records.len(), 1, "{records:?}");
        let first = fs.geometry.ag_block_of(start).0;
        assert_eq!((records[0].start.0, records[0].length), (first + 80, 4));
        assert_eq!(summary.refcount_records, records);
        // The staged blocks are the allocator's again; of the file's 80 blocks, the 40 that
        // counted 1 before the decrease were freed by it (the 40 shared ones count 1 now).
        assert_eq!(owned(&fs), owned_before + 40);
        fs.unmount().unwrap();
    }

    /// Blocks the allocator owns: free, on free lists, in its trees.
    fn owned(fs: &Filesystem) -> u64 {
        let mut tx = fs.begin(Reservation::new(0)).unwrap();
        let mut owned = 0;
        for ag in 0..fs.geometry.ag_count {
            let s = fs.alloc.check_invariants(&mut tx, AgNumber(ag)).unwrap();
            owned += u64::from(s.free_blocks) + s.free_list.len() as u64;
            owned += s.tree_blocks + s.refcount_blocks;
        }
        tx.tx.cancel().unwrap();
        owned
    }

    /// Shares every other block of the 80 at `start`, then logs an intent to share the next
    /// 4 and drop a share of all 80, and stages 8 new blocks; everything durable.
    fn share_then_crash(fs: &Filesystem, start: FsBlock) {
        let log = JournalLog(&fs.journal);
        let mut tx = fs.begin(refcount_reservation(fs)).unwrap();
        for block in (0..80).step_by(2) {
            let at = (FsBlock(start.0 + block), 1);
            let calls = (free_sequence(&fs.journal), RECORDS_PER_CALL);
            fs.alloc
                .change_references(&mut tx, &log, at, RefcountOp::Increase, calls)
                .unwrap();
        }
        tx.tx.commit().unwrap();
        let updates = [
            RefcountUpdate {
                op: RefcountOp::Increase,
                start: FsBlock(start.0 + 80),
                length: 4,
            },
            RefcountUpdate {
                op: RefcountOp::Decrease,
                start,
                length: 80,
            },
        ];
        let mut tx = fs.begin(refcount_reservation(fs)).unwrap();
        tx.tx.log_refcount_intent(&updates);
        let staged = fs
            .alloc
            .allocate(&mut tx, &log, &Request::near(FsBlock(0), 8, 8))
            .unwrap()
            .unwrap();
        fs.alloc
            .stage(&mut tx, &log, (staged.fs_start, staged.length), 1)
            .unwrap();
        tx.tx.commit().unwrap();
        fs.sync().unwrap();
    }
}
