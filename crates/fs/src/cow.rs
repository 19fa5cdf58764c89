//! Copy-on-write (reflink): before a write lands in place on blocks a file shares with other
//! files, the file gets blocks of its own holding the same bytes, and the write then goes
//! where it always goes.
//!
//! For each run of shared blocks (widened to the file's CoW extent size hint, within its
//! mapped extents): a transaction allocates new blocks near the file's data and records them
//! as staging in the refcount tree; the old bytes are copied into them (none for unwritten
//! blocks, which read as zeros); a second transaction maps them in place of the old blocks
//! (same written state) with a refcount intent unstaging the new blocks and dropping the old
//! ones' count, which a third transaction applies. Until the second commits, the file maps
//! the old blocks and a crash leaves the new ones staging (mount frees them); its checkpoint
//! flushes the device first, so the copy is durable before the map points at it. Blocks
//! only this file maps are written in place as before; files without `INODE_FLAG_REFLINK`
//! never look at the refcount tree.
//!
//! The caller holds the file's I/O lock exclusively (no other write, writeback or map change
//! of the file can run) and its metadata lock (`meta`).

use std::sync::atomic::Ordering;

use cairn_alloc::Request;
use cairn_btree::CacheContext;
use cairn_format::inode::INODE_FLAG_REFLINK;
use cairn_format::limits::EXTENT_LEN_MAX;
use cairn_format::log::RefcountUpdate;
use cairn_format::{Extent, FsBlock};
use cairn_journal::{IntentId, RefcountOp, Reservation};

use crate::bmap::{FileMap, free_tree_levels, target};
use crate::fs::Filesystem;
use crate::glue::{JournalLog, free_sequence};
use crate::inode::InodeData;
use crate::reflink::{finish_refcount_intent, refcount_call_buffers};
use crate::{FsError, iobuf};

/// Most bytes one copy of old data moves at a time.
const COPY_BYTES_MAX: u64 = 1 << 20;

/// The bytes a write is about to put at byte `offset` of a file: a copy-on-write fills the
/// copies of the blocks they cover whole with them rather than with the old bytes (which
/// the write would overwrite at once), as XFS writes such blocks straight into the staging
/// extent.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Overwrite<'a> {
    pub offset: u64,
    pub data: &'a [u8],
}

impl Overwrite<'_> {
    /// The file blocks the bytes cover whole.
    fn whole_blocks(&self, block_size: u64) -> (u64, u64) {
        let end = self.offset + self.data.len() as u64;
        let first = self.offset.div_ceil(block_size);
        (first, (end / block_size).max(first))
    }
}

/// A copy-on-write that stopped on `error`: every shared block of the range before file
/// block `at` has its copy (0: nothing is known to be done).
#[derive(Debug)]
pub(crate) struct Stopped {
    pub error: FsError,
    pub at: u64,
}

impl Filesystem {
    /// Gives inode `inode` blocks of its own for every block of file blocks `first..last`
    /// that other files share (see the module documentation). Nothing to do for a file
    /// without the reflink flag. `NoSpace` when no block is free for the copy: the file is
    /// unchanged (what was already copied stays its own, with the same bytes).
    pub(crate) fn unshare(
        &self,
        inode: u64,
        meta: &mut InodeData,
        range: (u64, u64),
    ) -> Result<(), FsError> {
        self.unshare_for(inode, meta, range, None)
            .map(|_| ())
            .map_err(|stopped| stopped.error)
    }

    /// `unshare` before a write of `new`: the copies of blocks the write covers whole are
    /// filled with its bytes. Returns how many blocks got their final bytes that way (the
    /// write need not write those again). Pieces are copied in file order, so a failure
    /// (`Stopped`) leaves the file with the write's bytes, if any, only before the block it
    /// names: the write can end there (a short write).
    pub(crate) fn unshare_for(
        &self,
        inode: u64,
        meta: &mut InodeData,
        (first, last): (u64, u64),
        new: Option<Overwrite<'_>>,
    ) -> Result<u64, Stopped> {
        if meta.core.flags & INODE_FLAG_REFLINK == 0 || first >= last {
            return Ok(0);
        }
        let pieces = self
            .shared_pieces(inode, meta, (first, last))
            .map_err(|error| Stopped { error, at: 0 })?;
        if pieces.is_empty() {
            return Ok(0);
        }
        self.reflink.cow_writes.fetch_add(1, Ordering::Relaxed);
        let mut filled = 0;
        for piece in pieces {
            let mut left = piece;
            while left.length > 0 {
                let (done, new_blocks) =
                    self.copy_on_write(inode, meta, left, new)
                        .map_err(|error| Stopped {
                            error,
                            at: left.file_block,
                        })?;
                filled += new_blocks;
                left =
                    crate::bmap::piece(&left, left.file_block + u64::from(done), left.file_end());
            }
        }
        Ok(filled)
    }

    /// Sets inode `inode`'s copy-on-write extent size hint (bytes, whole blocks; 0 clears
    /// it), keeping its other attributes: a write into shared blocks copies whole aligned
    /// units of that many blocks (as far as the file maps them), so a file rewritten in
    /// small pieces after a clone gets long extents rather than one per write. On a
    /// directory the hint is what new files and directories in it take
    /// (`INODE_FLAG_COWEXTSIZE`), so `inherit` must be true for a nonzero one there. As
    /// root; `set_file_attributes` says what is refused.
    pub fn set_cow_extent_size_hint(
        &self,
        inode: u64,
        hint_bytes: u64,
        inherit: bool,
    ) -> Result<(), FsError> {
        let refusal = "a directory's CoW extent size hint is only for inheriting";
        self.set_hint(inode, (hint_bytes, inherit), refusal, |attributes| {
            attributes.cow_extent_size_hint = hint_bytes;
        })
    }

    /// The mapped pieces of file blocks `first..last` to copy: none unless some block there
    /// is shared; then every mapped block of the range widened to the CoW extent size hint.
    fn shared_pieces(
        &self,
        inode: u64,
        meta: &InodeData,
        (first, last): (u64, u64),
    ) -> Result<Vec<Extent>, FsError> {
        let hint = u64::from(meta.core.cow_extent_size_hint.max(1));
        let (wide_first, wide_last) = (first / hint * hint, last.div_ceil(hint) * hint);
        let map = FileMap::read_around(self, inode, meta, (wide_first, wide_last))?;
        let mut pieces = Vec::new();
        for extent in clipped(map.extents(), first, last) {
            for (start, length, _) in self.shared_runs_of(&extent)? {
                let at = extent.file_block + (start.0 - extent.fs_block.0);
                pieces.push(crate::bmap::piece(&extent, at, at + u64::from(length)));
            }
        }
        if pieces.is_empty() || hint == 1 {
            return Ok(pieces);
        }
        Ok(clipped(map.extents(), wide_first, wide_last))
    }

    /// The shared runs of `extent`'s blocks, as the refcount tree says (and those shared
    /// until a decrease not yet durable: see `Allocator::shared_runs`).
    fn shared_runs_of(&self, extent: &Extent) -> Result<Vec<(FsBlock, u32, u32)>, FsError> {
        let mut ctx = CacheContext::new(&self.cache);
        let log = JournalLog(&self.journal);
        Ok(self
            .alloc
            .shared_runs(&mut ctx, &log, (extent.fs_block, extent.length))?)
    }

    /// Copies `piece` (mapped blocks of inode `inode`) into new blocks and maps them in its
    /// place; returns how many of its blocks it did (the allocator may give fewer) and how
    /// many of those it filled with `new`'s bytes.
    fn copy_on_write(
        &self,
        inode: u64,
        meta: &mut InodeData,
        piece: Extent,
        new: Option<Overwrite<'_>>,
    ) -> Result<(u32, u64), FsError> {
        let (start, length) = self.allocate_staging(inode, meta, piece)?;
        let filled = self.fill_copy(piece, (start, length), new);
        let filled = match filled {
            Ok(filled) => filled,
            Err(error) => {
                self.free_staging((start, length));
                return Err(error);
            }
        };
        let done = crate::bmap::piece(
            &piece,
            piece.file_block,
            piece.file_block + u64::from(length),
        );
        let (intent, updates) = match self.remap(inode, meta, done, start) {
            Ok(remapped) => remapped,
            Err(error) => {
                self.free_staging((start, length));
                return Err(error);
            }
        };
        // The file maps the copy now: a failure from here on leaves the intent to mount.
        finish_refcount_intent(self, intent, &updates)?;
        self.reflink
            .cow_blocks
            .fetch_add(u64::from(length), Ordering::Relaxed);
        Ok((length, filled))
    }

    /// Fills the `length` new blocks at `start` for the first blocks of `piece`: `new`'s
    /// bytes where it covers blocks whole, the old blocks' bytes elsewhere (nothing for
    /// unwritten ones, which read as zeros). Returns how many blocks got `new`'s bytes.
    fn fill_copy(
        &self,
        piece: Extent,
        (start, length): (FsBlock, u32),
        new: Option<Overwrite<'_>>,
    ) -> Result<u64, FsError> {
        let block_size = u64::from(self.geometry.block_size);
        let (first, end) = (piece.file_block, piece.file_block + u64::from(length));
        let (cover_first, cover_end) = match new {
            Some(new) => {
                let (from, to) = new.whole_blocks(block_size);
                (from.clamp(first, end), to.clamp(first, end))
            }
            None => (end, end),
        };
        let cover_end = cover_end.max(cover_first);
        // Old bytes before and after the covered blocks.
        for (from, to) in [(first, cover_first), (cover_end, end)] {
            if to > from && !piece.unwritten {
                let old = FsBlock(piece.fs_block.0 + (from - first));
                let copy = FsBlock(start.0 + (from - first));
                self.copy_blocks(old, copy, (to - from) as u32)?;
            }
        }
        if let Some(new) = new.filter(|_| cover_end > cover_first) {
            let at = (cover_first * block_size - new.offset) as usize;
            let len = ((cover_end - cover_first) * block_size) as usize;
            let copy = FsBlock(start.0 + (cover_first - first));
            self.write_new(copy, &new.data[at..at + len])?;
        }
        Ok(cover_end - cover_first)
    }

    /// Writes `bytes` (whole blocks) to the device from block `to` on.
    fn write_new(&self, to: FsBlock, bytes: &[u8]) -> Result<(), FsError> {
        let block_size = u64::from(self.geometry.block_size);
        for (index, chunk) in bytes.chunks(COPY_BYTES_MAX as usize).enumerate() {
            let mut buf = iobuf::take(chunk.len());
            buf.copy_from_slice(chunk);
            let at = to.0 * block_size + index as u64 * COPY_BYTES_MAX;
            let written = self.device.write_at(at, &buf);
            iobuf::give_back(buf);
            written?;
        }
        Ok(())
    }

    /// Allocates up to `piece.length` blocks near the file's data for its copy, recorded as
    /// staging in the same transaction.
    fn allocate_staging(
        &self,
        inode: u64,
        meta: &mut InodeData,
        piece: Extent,
    ) -> Result<(FsBlock, u32), FsError> {
        let mut tx = self.begin(self.cow_reservation())?;
        let map = FileMap::read_around(self, inode, meta, (piece.file_block, piece.file_end()))?;
        let goal = target(self, map.extents(), inode, piece.file_block);
        let wanted = piece.length.min(EXTENT_LEN_MAX);
        let log = JournalLog(&self.journal);
        let found = self
            .alloc
            .allocate(&mut tx, &log, &Request::near(goal, 1, wanted))?;
        let Some(found) = found else {
            tx.tx.cancel()?;
            return Err(FsError::NoSpace);
        };
        let range = (found.fs_start, found.length);
        let staged = self
            .alloc
            .stage(&mut tx, &log, range, free_sequence(&self.journal));
        if let Err(error) = staged {
            // The allocation is in this transaction: committing keeps the blocks in use
            // with no owner, cancelling a dirty transaction shuts the journal down; both
            // are worse than giving them back now.
            self.alloc.free(
                &mut tx,
                &log,
                found.fs_start,
                found.length,
                free_sequence(&self.journal),
            )?;
            tx.tx.commit()?;
            return Err(error.into());
        }
        tx.tx.commit()?;
        Ok(range)
    }

    /// Copies `length` blocks from `from` to `to` on the device.
    fn copy_blocks(&self, from: FsBlock, to: FsBlock, length: u32) -> Result<(), FsError> {
        let block_size = u64::from(self.geometry.block_size);
        let total = u64::from(length) * block_size;
        let mut done = 0;
        while done < total {
            let chunk = (total - done).min(COPY_BYTES_MAX);
            let mut buf = iobuf::take(chunk as usize);
            let copied = self
                .device
                .read_into(from.0 * block_size + done, &mut buf)
                .and_then(|()| self.device.write_at(to.0 * block_size + done, &buf));
            iobuf::give_back(buf);
            copied?;
            done += chunk;
        }
        Ok(())
    }

    /// Maps the copy at `start` in place of `piece`'s file blocks (in `piece`'s written
    /// state), with an intent that unstages the copy and drops the count of the blocks it
    /// replaces (if any: the place may have been a hole), and returns the intent for the
    /// caller to finish. An error means the file does not map the copy: its blocks are
    /// still only staging, for the caller to give back.
    fn remap(
        &self,
        inode: u64,
        meta: &mut InodeData,
        piece: Extent,
        start: FsBlock,
    ) -> Result<(IntentId, Vec<RefcountUpdate>), FsError> {
        let mut tx = self.begin(self.cow_reservation())?;
        let range = (piece.file_block, piece.file_end());
        let mut map = FileMap::load_around(self, &mut tx, inode, meta, &[range])?;
        let removed = map.cut(range.0, range.1);
        let copy = Extent::new(piece.file_block, start, piece.length, piece.unwritten)
            .map_err(|e| FsError::corrupt("extent", start.0, e.to_string()))?;
        map.insert(copy);
        if let Err(error) = map.store(self, &mut tx, meta) {
            Self::log_inode(&mut tx, inode, meta);
            self.commit(tx, &mut [meta])?;
            return Err(error);
        }
        let mut updates = vec![RefcountUpdate {
            op: RefcountOp::Unstage,
            start,
            length: piece.length,
        }];
        updates.extend(crate::reflink::decrease_updates(&removed));
        let intent = tx.tx.log_refcount_intent(&updates);
        let dropped: u64 = removed.iter().map(|e| u64::from(e.length)).sum();
        let count = meta.core.block_count + u64::from(piece.length);
        meta.core.block_count = count.saturating_sub(dropped);
        Self::log_inode(&mut tx, inode, meta);
        self.commit(tx, &mut [meta])?;
        Ok((intent, updates))
    }

    /// Maps a new block holding `content` (one block) at file block `block` of inode
    /// `inode`, in place of whatever was there (a clone's head and tail): staged, written,
    /// then remapped like a copy-on-write.
    pub(crate) fn replace_block(
        &self,
        inode: u64,
        meta: &mut InodeData,
        block: u64,
        content: &[u8],
    ) -> Result<(), FsError> {
        let place = Extent {
            file_block: block,
            fs_block: FsBlock(0),
            length: 1,
            unwritten: false,
        };
        let (start, _) = self.allocate_staging(inode, meta, place)?;
        let block_size = u64::from(self.geometry.block_size);
        let mut buf = iobuf::take(content.len());
        buf.copy_from_slice(content);
        let written = self.device.write_at(start.0 * block_size, &buf);
        iobuf::give_back(buf);
        if let Err(error) = written {
            self.free_staging((start, 1));
            return Err(error.into());
        }
        let (intent, updates) = match self.remap(inode, meta, place, start) {
            Ok(remapped) => remapped,
            Err(error) => {
                self.free_staging((start, 1));
                return Err(error);
            }
        };
        finish_refcount_intent(self, intent, &updates)
    }

    /// Gives back the staging blocks of a copy that failed (best effort: what a failure
    /// here leaves, mount frees).
    fn free_staging(&self, range: (FsBlock, u32)) {
        let freed = self
            .begin_finishing(self.cow_reservation())
            .and_then(|mut tx| {
                let log = JournalLog(&self.journal);
                let sequence = free_sequence(&self.journal);
                self.alloc.free_staged(&mut tx, &log, range, sequence)?;
                tx.tx.commit()?;
                Ok(())
            });
        if let Err(error) = freed {
            tracing::warn!(block = range.0.0, %error, "giving back copy-on-write blocks failed");
        }
    }

    /// The reservation of a copy-on-write transaction: a mapping step's, a staging or
    /// refcount change, the inode and an intent.
    fn cow_reservation(&self) -> Reservation {
        let per_extent = 2 + 2 * (free_tree_levels(self) + 1);
        let buffers = 4 * per_extent + refcount_call_buffers(self);
        let base = crate::bmap::step_reservation(self);
        let extra = Reservation::for_items(&self.geometry, buffers, self.geometry.block_size, 1, 1);
        Reservation::new(base.bytes + extra.bytes)
    }
}

/// The parts of `extents` (sorted) inside file blocks `from..to`.
fn clipped(extents: &[Extent], from: u64, to: u64) -> Vec<Extent> {
    extents
        .iter()
        .filter(|e| e.file_end() > from && e.file_block < to)
        .map(|e| crate::bmap::piece(e, e.file_block.max(from), e.file_end().min(to)))
        .collect()
}
