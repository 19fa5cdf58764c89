//! Collapse and insert range (`FALLOC_FL_COLLAPSE_RANGE`, `FALLOC_FL_INSERT_RANGE`): the
//! extents past a block-aligned offset move down (after the range is unmapped) or up
//! (leaving a hole), and the size shrinks or grows by the range.
//!
//! A shift takes many transactions on a fragmented file, so it is logged as an intent (a
//! `ShiftIntent` item: inode, range, kind, the final size, and a cursor saying how far the
//! move got). The first transaction logs the intent; every later one does one step (unmaps
//! a few extents of a collapse's range, or moves up to `EXTENTS_PER_SHIFT` extents) and in
//! the same transaction logs the previous intent's done item and a new intent with the new
//! cursor; the last sets the size and logs only the done item. Recovery finishes an
//! intent it finds unfinished (`finish_intent`), so a crash leaves the file as it was before
//! the call (the first transaction was lost) or as it is after (XFS moves extents a
//! transaction at a time without an intent, and a crash there leaves the file in between).
//!
//! Moving an extent changes only its file block: the records of an extent tree are
//! rewritten in place (`FileMap::move_extents`), in an order that keeps every key between
//! its neighbours, so the moves never need a block. A collapse moves extents from the
//! lowest up, an insert from the highest down; between the moved and the unmoved ones lies
//! a gap of the range's length, so neither the cursor nor the extents' order is ever in
//! doubt. Blocks past the end of the file are freed first (XFS trims them too). The
//! caller holds the inode's I/O lock, with its cached pages written back; the extent
//! cache follows every `store`.

use cairn_format::Extent;
use cairn_journal::{
    INTENT_ITEM_BYTES_MAX, IntentId, Reservation, SHIFT_NOTHING_MOVED, ShiftIntent, ShiftKind,
};

use crate::bmap::{FileMap, commit_unmap, step_reservation};
use crate::fs::Filesystem;
use crate::inode::{Inode, InodeData, now};
use crate::types::Credentials;
use crate::{FsError, perm};

/// Extents a shift step moves (in place, in one or two tree leaves and their parents).
const EXTENTS_PER_SHIFT: usize = 16;

/// A step's reservation: a mapping step's (`step_reservation`, which counts one intent or
/// done item) plus the previous shift intent's done item and the next intent.
fn shift_reservation(fs: &Filesystem) -> Reservation {
    let mut reservation = step_reservation(fs);
    reservation.bytes += 2 * INTENT_ITEM_BYTES_MAX;
    reservation
}

/// A shift in progress: the intent that describes it now, and its id.
struct Progress {
    id: IntentId,
    shift: ShiftIntent,
}

impl Filesystem {
    /// Collapses (`kind` Collapse) or inserts `len` bytes at `offset` of regular file
    /// `handle`, whose I/O lock the caller holds with no page cached, by `who` (set-ID bits
    /// go unless root). XFS's rules: both block-aligned (`InvalidArgument`); a collapse
    /// ends before the end of the file and an insert starts inside it (`InvalidArgument`);
    /// an insert that would pass the largest file is `FileTooBig`.
    pub(crate) fn shift_range(
        &self,
        handle: &Inode,
        (offset, len): (u64, u64),
        kind: ShiftKind,
        who: &Credentials,
    ) -> Result<(), FsError> {
        let number = handle.number;
        let block_size = u64::from(self.geometry.block_size);
        if !offset.is_multiple_of(block_size) || !len.is_multiple_of(block_size) {
            return Err(FsError::InvalidArgument(
                "collapse and insert ranges must be block-aligned",
            ));
        }
        let mut data = handle.data.lock();
        let size = data.core.size;
        let new_size = match kind {
            ShiftKind::Collapse if offset.checked_add(len).is_none_or(|end| end >= size) => {
                return Err(FsError::InvalidArgument(
                    "a collapse must end before the end of the file",
                ));
            }
            ShiftKind::Collapse => size - len,
            ShiftKind::Insert if offset >= size => {
                return Err(FsError::InvalidArgument(
                    "an insert must start before the end of the file",
                ));
            }
            ShiftKind::Insert => size
                .checked_add(len)
                .filter(|&end| end <= cairn_format::limits::FILE_BLOCK_MAX)
                .ok_or(FsError::FileTooBig)?,
        };
        // Blocks past the end stay out of the shift: freed now, they need no moving.
        let eof_block = size.div_ceil(block_size);
        crate::fallocate::unmap_blocks(self, number, &mut data, eof_block, u64::MAX)?;
        self.preallocs.take(number);
        let (start, blocks) = (offset / block_size, len / block_size);
        // Extents cut at the range's edges now, while a full filesystem can still refuse the
        // call: after the intent, no step needs a block.
        let edges = match kind {
            ShiftKind::Collapse => vec![start, start + blocks],
            ShiftKind::Insert => vec![start],
        };
        split_at_edges(self, number, &mut data, &edges)?;
        let cursor = match kind {
            ShiftKind::Collapse => start + blocks,
            ShiftKind::Insert => SHIFT_NOTHING_MOVED,
        };
        let shift = ShiftIntent {
            inode: number,
            generation: data.core.generation,
            kind,
            start,
            blocks,
            cursor,
            new_size,
        };
        let mut tx = self.begin(shift_reservation(self))?;
        let id = tx.tx.log_shift_intent(&shift);
        Self::log_inode(&mut tx, number, &mut data);
        self.commit(tx, &mut [&mut data])?;
        let shifted = run(self, number, &mut data, Progress { id, shift }, Some(who));
        if let Err(error) = &shifted {
            // The intent is in the log and the file half shifted: nothing may change it
            // before recovery finishes the shift at the next mount.
            self.journal.shut_down_now(format!(
                "a collapse or insert range of inode {number} failed half way ({error}); \
                 the next mount finishes it"
            ));
        }
        shifted
    }
}

/// Cuts the extents holding file blocks `edges` in two there (one transaction; the file's
/// content is the same, a crash may keep the cut or not).
fn split_at_edges(
    fs: &Filesystem,
    number: u64,
    data: &mut InodeData,
    edges: &[u64],
) -> Result<(), FsError> {
    let mut tx = fs.begin(shift_reservation(fs))?;
    let ranges: Vec<(u64, u64)> = edges.iter().map(|&edge| (edge, edge + 1)).collect();
    let mut map = FileMap::load_around(fs, &mut tx, number, data, &ranges)?;
    for &edge in edges {
        map.split_at(edge);
    }
    if !map.is_changed() {
        tx.tx.cancel()?;
        return Ok(());
    }
    let stored = map.store(fs, &mut tx, data);
    Filesystem::log_inode(&mut tx, number, data);
    fs.commit(tx, &mut [data])?;
    stored
}

/// At mount: finishes the shift intent `id` recovery found unfinished.
pub(crate) fn finish_intent(
    fs: &Filesystem,
    id: IntentId,
    shift: &ShiftIntent,
) -> Result<(), FsError> {
    let inode = fs.inode(shift.inode)?;
    let mut data = inode.data.lock();
    let same = data.is_allocated()
        && data.core.generation == shift.generation
        && data.file_type() == Some(cairn_format::inode::FileType::Regular);
    if !same {
        // Not the file the intent was logged for (only corruption gets here): done with it.
        tracing::warn!(
            inode = shift.inode,
            "a shift intent names a file that is gone"
        );
        let mut tx = fs.begin_finishing(shift_reservation(fs))?;
        tx.tx.log_shift_done(id);
        tx.tx.commit()?;
        return Ok(());
    }
    tracing::info!(inode = shift.inode, "finishing a collapse or insert range");
    let progress = Progress { id, shift: *shift };
    run(fs, shift.inode, &mut data, progress, None)
}

/// Runs a shift from where `progress` says to its end: a collapse's unmapping, the moves,
/// then the size.
fn run(
    fs: &Filesystem,
    number: u64,
    data: &mut InodeData,
    mut progress: Progress,
    who: Option<&Credentials>,
) -> Result<(), FsError> {
    let shift = progress.shift;
    if shift.kind == ShiftKind::Collapse && shift.cursor == shift.start + shift.blocks {
        progress = unmap_range(fs, number, data, progress)?;
    }
    while let Some(next) = move_step(fs, number, data, &progress)? {
        progress = next;
    }
    finish(fs, number, data, progress, who)
}

/// A collapse's unmapping of its range, from the end backwards, a few extents a step; each
/// step relogs the intent (same cursor) so that it never holds the log's tail for long.
fn unmap_range(
    fs: &Filesystem,
    number: u64,
    data: &mut InodeData,
    mut progress: Progress,
) -> Result<Progress, FsError> {
    let start = progress.shift.start;
    let mut end = start + progress.shift.blocks;
    while start < end {
        let mut tx = fs.begin(shift_reservation(fs))?;
        let mut map = FileMap::load_around(fs, &mut tx, number, data, &[(start, end)])?;
        let (step_end, removed) = map.cut_step(start, end);
        if removed.is_empty() {
            tx.tx.cancel()?;
            break;
        }
        tx.tx.log_shift_done(progress.id);
        progress.id = tx.tx.log_shift_intent(&progress.shift);
        commit_unmap(fs, tx, number, data, &mut map, &removed)?;
        end = step_end;
    }
    Ok(progress)
}

/// Moves the next extents (at most `EXTENTS_PER_SHIFT`) and relogs the intent with the new
/// cursor in the same transaction; `None` when nothing is left to move.
fn move_step(
    fs: &Filesystem,
    number: u64,
    data: &mut InodeData,
    progress: &Progress,
) -> Result<Option<Progress>, FsError> {
    let shift = progress.shift;
    // A collapse moves the extents from the cursor on down into the gap below it; an
    // insert the extents below the cursor up into the gap above it.
    let forward = shift.kind == ShiftKind::Collapse;
    let mut tx = fs.begin(shift_reservation(fs))?;
    let span = (shift.cursor, EXTENTS_PER_SHIFT, forward);
    let mut map = FileMap::load_span(fs, &mut tx, number, data, span)?;
    let Some((moves, cursor)) = next_moves(map.extents(), &shift) else {
        tx.tx.cancel()?;
        return Ok(None);
    };
    let stored = map
        .move_extents(&moves)
        .and_then(|()| map.store(fs, &mut tx, data));
    if let Err(error) = stored {
        // The moves are not in the map; the intent stays as it was.
        tx.tx.cancel()?;
        return Err(error);
    }
    let next = ShiftIntent { cursor, ..shift };
    tx.tx.log_shift_done(progress.id);
    let id = tx.tx.log_shift_intent(&next);
    Filesystem::log_inode(&mut tx, number, data);
    fs.commit(tx, &mut [data])?;
    Ok(Some(Progress { id, shift: next }))
}

/// The extents of `list` the next step of `shift` moves, each `(old, new)`, and the cursor
/// after them; `None` when none is left. A collapse takes the lowest extents from its
/// cursor on, an insert the highest ones below its cursor and from its start (no extent
/// spans the start: `split_at_edges` cut there).
fn next_moves(list: &[Extent], shift: &ShiftIntent) -> Option<(Vec<(Extent, Extent)>, u64)> {
    let moved = |old: Extent, file_block: u64| (old, Extent { file_block, ..old });
    match shift.kind {
        ShiftKind::Collapse => {
            let moves: Vec<_> = list
                .iter()
                .filter(|e| e.file_block >= shift.cursor)
                .take(EXTENTS_PER_SHIFT)
                .map(|&e| moved(e, e.file_block - shift.blocks))
                .collect();
            let cursor = moves.last()?.0.file_end();
            Some((moves, cursor))
        }
        ShiftKind::Insert => {
            let mut moves: Vec<_> = list
                .iter()
                .rev()
                .filter(|e| e.file_block < shift.cursor && e.file_block >= shift.start)
                .take(EXTENTS_PER_SHIFT)
                .map(|&e| moved(e, e.file_block + shift.blocks))
                .collect();
            moves.reverse();
            let cursor = moves.first()?.0.file_block;
            Some((moves, cursor))
        }
    }
}

/// The shift's last transaction: the new size, the times, the set-ID bits for a caller
/// other than root, and the intent's done item. The log is forced up to it before
/// returning: later writes into the moved blocks go to the device in place, and under a
/// crash that lost the shift they showed at the blocks' old offsets (bytes nobody wrote
/// there; docs/reliability.md item 17).
fn finish(
    fs: &Filesystem,
    number: u64,
    data: &mut InodeData,
    progress: Progress,
    who: Option<&Credentials>,
) -> Result<(), FsError> {
    let mut tx = fs.begin(shift_reservation(fs))?;
    tx.tx.log_shift_done(progress.id);
    data.core.size = progress.shift.new_size;
    // Nothing of the file is cached (the caller wrote its pages back): every byte is on
    // the device or in a hole.
    data.cover_written(u64::MAX);
    let now = now();
    data.core.mtime = now;
    data.core.ctime = now;
    if let Some(who) = who {
        perm::clear_set_id_unless_root(data, who);
    }
    Filesystem::log_inode(&mut tx, number, data);
    fs.commit(tx, &mut [data])?;
    fs.journal
        .force(cairn_journal::CommitSequence(data.last_sequence))?;
    Ok(())
}
