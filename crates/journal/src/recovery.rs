//! Recovery on open: find the head and tail, verify every record, replay complete
//! checkpoints in order (never over a newer home copy), skip a torn or partial last
//! checkpoint, and report unfinished intents. Replay works on block numbers and inode
//! positions only, so it needs nothing above the format crate.

use std::collections::{BTreeMap, HashMap};

use cairn_blockdev::{AlignedBuf, BlockDevice};
use cairn_format::header::HEADER_SIZE;
use cairn_format::log::{
    InodeCreate, LOG_FLAG_UNMOUNT, LogItem, LogRecordHeader, decode_log_record,
};
use cairn_format::{FsBlock, Geometry, InodeNumber, Lsn, MetaHeader, MetaKind, OnDisk};

use crate::JournalError;
use crate::inode_ops::{create_fits, write_free_inode};
use crate::item::{IntentId, IntentWork};
use crate::log_scan::LogWindow;
use crate::writer::{Layout, Position};

/// An intent whose done item never reached the log: the filesystem must finish it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingIntent {
    pub id: IntentId,
    pub work: IntentWork,
}

/// What recovery found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// The log needed no replay (freshly made, or cleanly unmounted).
    pub clean: bool,
    pub tail: Lsn,
    pub head: Lsn,
    /// Valid records walked from the tail.
    pub records: u64,
    pub checkpoints_replayed: u64,
    /// Checkpoints without a commit record (torn or partial) that were skipped.
    pub checkpoints_discarded: u64,
    pub items_replayed: u64,
    /// Items skipped because the home copy was as new or newer, or the block was freed later.
    pub items_skipped: u64,
    pub blocks_written: u64,
    pub unfinished_intents: Vec<PendingIntent>,
}

/// Where the journal continues after recovery.
#[derive(Debug)]
pub(crate) struct Recovered {
    pub(crate) report: RecoveryReport,
    pub(crate) head: Position,
    pub(crate) prev_lsn: Lsn,
    pub(crate) next_sequence: u64,
    pub(crate) next_intent: u64,
}

/// Bytes of replayed home blocks held in memory before they are written back: replay never
/// holds more than this plus one block, whatever the size of the log. At most an eighth of
/// the log, so that small logs (the tests') write blocks back mid-replay too.
const REPLAY_HELD_BYTES_MAX: usize = 16 << 20;

/// One checkpoint as the scan found it: where its records are and what replay must know
/// before applying it, without its items (they are read again, a record at a time).
#[derive(Debug, Default)]
struct Checkpoint {
    sequence: u64,
    /// LSN of its first record: the LSN its items carry.
    lsn: Lsn,
    started: bool,
    committed: bool,
    /// Log blocks of its records that hold items, in log order.
    records: Vec<u64>,
    /// Its cancel records: (block, index of the item in the checkpoint).
    cancels: Vec<(u64, usize)>,
    /// Items seen so far (start and commit items not counted).
    items: usize,
}

/// Finds the log's head and tail and replays it onto `device`, reading the log through a
/// bounded window (`LogWindow`): the log can be hundreds of MiB, and recovery holds only
/// the record headers of the walk, one record's items and at most `REPLAY_HELD_BYTES_MAX`
/// of home blocks at a time.
pub(crate) fn recover(
    device: &dyn BlockDevice,
    layout: &Layout,
    geometry: &Geometry,
) -> Result<Recovered, JournalError> {
    let mut window = LogWindow::new(device, layout);
    let Some(newest) = window.newest_record()? else {
        return Ok(empty_log());
    };
    let walk = walk(&mut window, layout, newest.tail_lsn)?;
    let mut report = RecoveryReport {
        tail: newest.tail_lsn,
        records: walk.len() as u64,
        ..RecoveryReport::default()
    };
    let (head, prev_lsn) = match walk.last() {
        Some(last) => {
            let blocks = layout.record_blocks(u64::from(last.payload_bytes));
            (layout.advance(layout.position(last.lsn), blocks), last.lsn)
        }
        None => (layout.position(newest.tail_lsn), Lsn::ZERO),
    };
    report.head = layout.lsn(head);
    report.clean = walk
        .last()
        .is_some_and(|last| last.flags & LOG_FLAG_UNMOUNT != 0 && last.tail_lsn == last.lsn)
        && walk.len() == 1;
    let (checkpoints, max_intent) = scan(&mut window, layout, &walk)?;
    let mut replay = Replay::new(device, layout, geometry);
    let pending = replay.run(&mut window, &checkpoints, &mut report)?;
    report.blocks_written += replay.write_all()?;
    clear_orphans(device, layout, head, &newest)?;
    device
        .flush()
        .map_err(|source| JournalError::device("recovery flush", 0, source))?;
    let max_sequence = walk.iter().map(|h| h.checkpoint_sequence).max();
    report.unfinished_intents = pending
        .into_iter()
        .map(|(id, work)| PendingIntent {
            id: IntentId(id),
            work,
        })
        .collect();
    Ok(Recovered {
        report,
        head,
        prev_lsn,
        next_sequence: max_sequence.unwrap_or(0).max(newest.checkpoint_sequence) + 1,
        next_intent: max_intent.unwrap_or(0) + 1,
    })
}

fn empty_log() -> Recovered {
    let head = Position { cycle: 1, block: 0 };
    Recovered {
        report: RecoveryReport {
            clean: true,
            tail: Lsn::new(1, 0),
            head: Lsn::new(1, 0),
            ..RecoveryReport::default()
        },
        head,
        prev_lsn: Lsn::ZERO,
        next_sequence: 1,
        next_intent: 1,
    }
}

/// The record at the start of `raw`, which is log block `at`, if it is valid: its header
/// and payload verify, it belongs to this filesystem, names this place as its own and fits
/// the log.
pub(crate) fn record_here(raw: &[u8], layout: &Layout, at: u64) -> Option<LogRecordHeader> {
    let (header, _) = decode_log_record(raw).ok()?;
    let here = layout.lsn(Position {
        cycle: header.cycle,
        block: at,
    });
    let blocks = layout.record_blocks(u64::from(header.payload_bytes));
    let fits = at + blocks <= layout.log_blocks;
    (header.uuid == layout.uuid && header.lsn == here && fits).then_some(header)
}

/// Record headers from `tail` forward while each record is valid, sits where its
/// predecessor ended and names it as `prev_lsn`.
fn walk(
    window: &mut LogWindow<'_>,
    layout: &Layout,
    tail: Lsn,
) -> Result<Vec<LogRecordHeader>, JournalError> {
    let mut found: Vec<LogRecordHeader> = Vec::new();
    let mut at = layout.position(tail);
    let mut walked = 0u64;
    while walked < layout.log_blocks {
        let Some(header) = window.record_at(at.block)? else {
            break;
        };
        let follows = found.last().is_none_or(|prev| header.prev_lsn == prev.lsn);
        if header.lsn != layout.lsn(at) || !follows {
            break;
        }
        let blocks = layout.record_blocks(u64::from(header.payload_bytes));
        found.push(header);
        walked += blocks;
        at = layout.advance(at, blocks);
    }
    Ok(found)
}

/// Groups the walked records into checkpoints by sequence (returned in sequence order),
/// noting each one's start and commit items, records and cancel records, and the highest
/// intent id anywhere. Several checkpoints may be in flight, so a later checkpoint's
/// records can lie between an earlier one's data and its commit record.
fn scan(
    window: &mut LogWindow<'_>,
    layout: &Layout,
    walk: &[LogRecordHeader],
) -> Result<(Vec<Checkpoint>, Option<u64>), JournalError> {
    let mut checkpoints: BTreeMap<u64, Checkpoint> = BTreeMap::new();
    let mut max_intent = None;
    for header in walk.iter().filter(|h| h.op_count > 0) {
        let at = layout.position(header.lsn).block;
        let items = window.items_at(at)?;
        let sequence = header.checkpoint_sequence;
        let checkpoint = checkpoints.entry(sequence).or_insert_with(|| Checkpoint {
            sequence,
            lsn: header.lsn,
            ..Checkpoint::default()
        });
        checkpoint.records.push(at);
        for item in items {
            match item {
                LogItem::CheckpointStart { .. } => checkpoint.started = true,
                LogItem::CheckpointCommit { .. } => checkpoint.committed = true,
                other => {
                    match other {
                        LogItem::Buffer { block, regions, .. } if regions.is_empty() => {
                            checkpoint.cancels.push((block.0, checkpoint.items));
                        }
                        LogItem::ExtentFreeIntent { intent_id, .. }
                        | LogItem::RefcountIntent { intent_id, .. }
                        | LogItem::ShiftIntent { intent_id, .. } => {
                            max_intent = max_intent.max(Some(intent_id));
                        }
                        _ => {}
                    }
                    checkpoint.items += 1;
                }
            }
        }
    }
    Ok((checkpoints.into_values().collect(), max_intent))
}

/// Zeroes valid-looking records past the new head (written before the crash but cut off by
/// a torn record before them), so a later recovery cannot mistake them for the newest.
fn clear_orphans(
    device: &dyn BlockDevice,
    layout: &Layout,
    head: Position,
    newest: &LogRecordHeader,
) -> Result<(), JournalError> {
    let newest_at = layout.position(newest.lsn);
    if (newest_at.cycle, newest_at.block) < (head.cycle, head.block) {
        return Ok(());
    }
    let end = newest_at.block + layout.record_blocks(u64::from(newest.payload_bytes));
    let mut ranges = Vec::new();
    if newest_at.cycle == head.cycle {
        ranges.push((head.block, end));
    } else {
        ranges.push((head.block, layout.log_blocks));
        ranges.push((0, end));
    }
    for (from, to) in ranges.into_iter().filter(|(from, to)| from < to) {
        let offset = layout.byte_offset(from);
        let len = (to - from) * layout.block_size;
        device.write_zeroes(offset, len).map_err(|source| {
            JournalError::device("clearing orphaned log records", offset, source)
        })?;
    }
    Ok(())
}

/// Applies checkpoints to home blocks held in memory, then writes them back.
struct Replay<'d> {
    device: &'d dyn BlockDevice,
    geometry: &'d Geometry,
    uuid: [u8; 16],
    blocks: BTreeMap<u64, Vec<u8>>,
    /// Bytes held in `blocks`, and the most it may hold.
    held_bytes: usize,
    held_bytes_max: usize,
    /// Home LSNs of the blocks the current checkpoint touched, as they were before it.
    before: HashMap<u64, HomeLsns>,
}

/// The LSN a home copy carries, if its header is intact (a block that is not valid metadata,
/// such as freed space reused for data, counts as never logged).
fn home_lsn(raw: &[u8]) -> Lsn {
    let Ok(header) = MetaHeader::decode(raw) else {
        return Lsn::ZERO;
    };
    let intact =
        MetaKind::from_magic(header.magic).is_some() && cairn_format::block_crc(raw) == header.crc;
    if intact { header.lsn } else { Lsn::ZERO }
}

impl<'d> Replay<'d> {
    fn new(device: &'d dyn BlockDevice, layout: &Layout, geometry: &'d Geometry) -> Self {
        Self {
            device,
            geometry,
            uuid: layout.uuid,
            blocks: BTreeMap::new(),
            held_bytes: 0,
            held_bytes_max: REPLAY_HELD_BYTES_MAX.min((layout.log_bytes() / 8) as usize),
            before: HashMap::new(),
        }
    }

    /// The in-memory copy of `block_bytes` at `block`, read on first use.
    fn block(&mut self, block: u64, block_bytes: usize) -> Result<&mut Vec<u8>, JournalError> {
        if self
            .blocks
            .get(&block)
            .is_some_and(|b| b.len() != block_bytes)
        {
            self.write_one(block)?;
        }
        if !self.blocks.contains_key(&block) {
            let offset = block * u64::from(self.geometry.block_size);
            let mut raw = AlignedBuf::zeroed(block_bytes);
            self.device
                .read_at(offset, &mut raw)
                .map_err(|source| JournalError::device("recovery read", offset, source))?;
            self.held_bytes += raw.len();
            self.blocks.insert(block, raw.to_vec());
        }
        self.blocks.get_mut(&block).ok_or(JournalError::BadItem {
            what: format!("block {block}"),
            why: "vanished from the replay map",
        })
    }

    fn write_one(&mut self, block: u64) -> Result<(), JournalError> {
        if let Some(raw) = self.blocks.remove(&block) {
            self.held_bytes -= raw.len();
            let offset = block * u64::from(self.geometry.block_size);
            self.device
                .write_at(offset, &AlignedBuf::from_slice(&raw))
                .map_err(|source| JournalError::device("recovery write", offset, source))?;
        }
        Ok(())
    }

    fn write_all(&mut self) -> Result<u64, JournalError> {
        let blocks: Vec<u64> = self.blocks.keys().copied().collect();
        for block in &blocks {
            self.write_one(*block)?;
        }
        Ok(blocks.len() as u64)
    }

    /// Replays the committed checkpoints in sequence order, reading each one's records
    /// through `window`; returns the intents left without a done item. Within a
    /// checkpoint, buffer (and intent) items first, then inode items: a logical inode image
    /// is newer than a buffer image of its cluster in the same checkpoint (XFS reorders the
    /// same way). Replayed blocks go home whenever more than `REPLAY_HELD_BYTES_MAX` is held.
    fn run(
        &mut self,
        window: &mut LogWindow<'_>,
        checkpoints: &[Checkpoint],
        report: &mut RecoveryReport,
    ) -> Result<BTreeMap<u64, IntentWork>, JournalError> {
        let complete: Vec<&Checkpoint> = checkpoints
            .iter()
            .filter(|c| c.started && c.committed)
            .collect();
        let ordered = complete.windows(2).all(|w| w[0].sequence < w[1].sequence);
        debug_assert!(ordered, "checkpoints replayed out of sequence order");
        report.checkpoints_discarded = (checkpoints.len() - complete.len()) as u64;
        let cancels = last_cancels(&complete);
        let mut pending = BTreeMap::new();
        for (index, checkpoint) in complete.iter().enumerate() {
            // Skip decisions compare with the home state from before this checkpoint, so an
            // item replayed (and stamped) here cannot make a later item of it look applied.
            self.before.clear();
            for inodes in [false, true] {
                let pass = Pass {
                    index,
                    inodes,
                    cancels: &cancels,
                };
                self.replay_pass(window, checkpoint, &pass, &mut pending, report)?;
            }
        }
        report.checkpoints_replayed = complete.len() as u64;
        Ok(pending)
    }

    /// One pass over a checkpoint's records: its inode items, or all its other items.
    fn replay_pass(
        &mut self,
        window: &mut LogWindow<'_>,
        checkpoint: &Checkpoint,
        pass: &Pass<'_>,
        pending: &mut BTreeMap<u64, IntentWork>,
        report: &mut RecoveryReport,
    ) -> Result<(), JournalError> {
        let mut item_index = 0;
        for &at in &checkpoint.records {
            for item in window.items_at(at)? {
                if matches!(
                    item,
                    LogItem::CheckpointStart { .. } | LogItem::CheckpointCommit { .. }
                ) {
                    continue;
                }
                let this = item_index;
                item_index += 1;
                if matches!(item, LogItem::Inode { .. }) != pass.inodes {
                    continue;
                }
                let cancelled = |block: FsBlock| {
                    pass.cancels
                        .get(&block.0)
                        .is_some_and(|&c| c > (pass.index, this))
                };
                match self.replay_item(&item, checkpoint.lsn, cancelled, pending)? {
                    true => report.items_replayed += 1,
                    false => report.items_skipped += 1,
                }
                if self.held_bytes > self.held_bytes_max {
                    report.blocks_written += self.write_all()?;
                }
            }
        }
        Ok(())
    }

    /// Replays one item of the checkpoint at `lsn`; returns whether it changed anything.
    fn replay_item(
        &mut self,
        item: &LogItem,
        lsn: Lsn,
        cancelled: impl Fn(FsBlock) -> bool,
        pending: &mut BTreeMap<u64, IntentWork>,
    ) -> Result<bool, JournalError> {
        Ok(match item {
            LogItem::Buffer { regions, .. } if regions.is_empty() => false,
            LogItem::Buffer { block, .. } if cancelled(*block) => false,
            LogItem::Buffer {
                block,
                block_bytes,
                regions,
                data,
            } => self.apply_buffer(*block, *block_bytes, regions, data, lsn)?,
            LogItem::Inode { inode, image } => self.apply_inode(InodeNumber(*inode), image, lsn)?,
            LogItem::InodeCreate { block, .. } if cancelled(*block) => false,
            LogItem::InodeCreate { block, create } => {
                self.apply_inode_create(*block, create, lsn)?
            }
            LogItem::ExtentFreeIntent { intent_id, extents } => {
                pending.insert(*intent_id, IntentWork::Free(extents.clone()));
                true
            }
            LogItem::RefcountIntent { intent_id, updates } => {
                pending.insert(*intent_id, IntentWork::Refcount(updates.clone()));
                true
            }
            LogItem::ShiftIntent { intent_id, shift } => {
                pending.insert(*intent_id, IntentWork::Shift(*shift));
                true
            }
            LogItem::ExtentFreeDone { intent_id, .. }
            | LogItem::RefcountDone { intent_id }
            | LogItem::ShiftDone { intent_id } => {
                pending.remove(intent_id);
                true
            }
            LogItem::CheckpointStart { .. } | LogItem::CheckpointCommit { .. } => true,
        })
    }

    /// The LSNs `block` carried before the current checkpoint touched it, taken on its first
    /// use in the checkpoint.
    fn before(&mut self, block: u64, block_bytes: usize) -> Result<HomeLsns, JournalError> {
        if let Some(before) = self.before.get(&block)
            && before.block_bytes == block_bytes
        {
            return Ok(before.clone());
        }
        let g = self.geometry;
        let first_inode = g.inode_number(g.ag_of(FsBlock(block)), g.ag_block_of(FsBlock(block)), 0);
        let place = SlotPlace {
            inode_size: g.inode_size as usize,
            first_inode: first_inode.0,
            uuid: self.uuid,
        };
        let raw = self.block(block, block_bytes)?;
        let before = HomeLsns::of(raw, &place);
        self.before.insert(block, before.clone());
        Ok(before)
    }

    /// Applies a buffer item's regions. On a block that was an inode cluster before this
    /// checkpoint, each inode is decided and stamped on its own: an inode whose home copy is
    /// as new as the checkpoint keeps it (a cluster's inodes carry their own LSNs, written
    /// home by the AIL from logical inode items). Other blocks are decided as a whole.
    fn apply_buffer(
        &mut self,
        block: FsBlock,
        block_bytes: u32,
        regions: &[(u32, u32)],
        data: &[u8],
        lsn: Lsn,
    ) -> Result<bool, JournalError> {
        let inode_size = self.geometry.inode_size as usize;
        let before = self.before(block.0, block_bytes as usize)?;
        let raw = self.block(block.0, block_bytes as usize)?;
        if !before.inodes {
            if before.whole >= lsn {
                return Ok(false);
            }
            let whole = raw.len();
            copy_regions_in(raw, regions, data, whole, |_| true);
            stamp_block(raw, inode_size, lsn);
            return Ok(true);
        }
        let stale = |slot: usize| before.slots.get(slot).is_none_or(|&home| home < lsn);
        let touched = copy_regions_in(raw, regions, data, inode_size, stale);
        for &slot in &touched {
            let at = slot * inode_size;
            if let Some(inode) = raw.get_mut(at..at + inode_size) {
                cairn_format::stamp(inode, Some(lsn));
            }
        }
        Ok(!touched.is_empty())
    }

    fn apply_inode(
        &mut self,
        inode: InodeNumber,
        image: &[u8],
        lsn: Lsn,
    ) -> Result<bool, JournalError> {
        let size = self.geometry.inode_size as usize;
        let bad = |why| JournalError::BadItem {
            what: format!("inode {inode}"),
            why,
        };
        if image.len() > size {
            return Err(bad("image larger than the inode size"));
        }
        let (block, offset) = self
            .geometry
            .inode_position(inode)
            .ok_or_else(|| bad("inode number outside the filesystem"))?;
        let block_size = self.geometry.block_size as usize;
        let before = self.before(block.0, block_size)?;
        if before
            .slots
            .get(offset / size)
            .is_some_and(|&home| home >= lsn)
        {
            return Ok(false);
        }
        let raw = self.block(block.0, block_size)?;
        let slot = &mut raw[offset..offset + size];
        // Logged without its zero tail: the rest of the image is zero.
        let (used, tail) = slot.split_at_mut(image.len());
        used.copy_from_slice(image);
        tail.fill(0);
        cairn_format::stamp(slot, Some(lsn));
        Ok(true)
    }

    /// Re-creates the free inodes of a new cluster (an inode create item), each only where
    /// the home copy from before this checkpoint is not as new: an inode the AIL wrote home
    /// from a later inode item keeps its image (its own LSN says so), and a block rewritten
    /// as something else since is left alone. Inodes changed after the create are replayed
    /// later from their own items.
    fn apply_inode_create(
        &mut self,
        block: FsBlock,
        create: &InodeCreate,
        lsn: Lsn,
    ) -> Result<bool, JournalError> {
        if !create_fits(self.geometry, block, create) {
            return Err(JournalError::BadItem {
                what: format!("inode create at block {}", block.0),
                why: "inode numbers or size do not match the geometry",
            });
        }
        let bytes = create.block_bytes as usize;
        let before = self.before(block.0, bytes)?;
        if !before.inodes && before.whole >= lsn {
            return Ok(false);
        }
        let uuid = self.uuid;
        let raw = self.block(block.0, bytes)?;
        let mut changed = false;
        for (slot, inode) in raw.chunks_exact_mut(create.inode_size as usize).enumerate() {
            let home = before.slots.get(slot).copied().unwrap_or(Lsn::ZERO);
            if home >= lsn {
                continue;
            }
            let number = create.first_inode + slot as u64;
            write_free_inode(inode, number, uuid, create.generation, lsn);
            changed = true;
        }
        Ok(changed)
    }
}

/// What an intact inode in a home block must say about itself.
struct SlotPlace {
    inode_size: usize,
    /// The number the block's first slot would have if the block is an inode cluster (the
    /// numbers of a cluster's slots follow on, even across blocks of one AG).
    first_inode: u64,
    uuid: [u8; 16],
}

/// The LSN of inode slot `slot` of a home block, if it holds an intact inode: inode magic,
/// its own CRC, this filesystem's UUID and the number of that place (so stale data that
/// looks like an inode does not count); `None` otherwise (never written, torn, not an inode).
fn intact_inode_lsn(raw: &[u8], slot: usize, place: &SlotPlace) -> Option<Lsn> {
    let bytes = raw.get(slot * place.inode_size..(slot + 1) * place.inode_size)?;
    let header = MetaHeader::decode(bytes).ok()?;
    let intact = header.magic == MetaKind::Inode.magic()
        && header.uuid == place.uuid
        && header.blkno == place.first_inode + slot as u64
        && cairn_format::block_crc(bytes) == header.crc;
    intact.then_some(header.lsn)
}

/// The LSNs of a home block as replay found it before the current checkpoint.
#[derive(Debug, Clone)]
struct HomeLsns {
    block_bytes: usize,
    /// The block is an inode cluster: each inode has its own header and LSN. Known from any
    /// intact inode in it, not from the first one alone: a torn write home of a cluster can
    /// leave any sector old (never written) and the others new. Inode chunks are never
    /// freed, so a block holding an intact inode is a cluster.
    inodes: bool,
    /// The whole block's LSN (for blocks that are not inode clusters).
    whole: Lsn,
    /// Each inode slot's LSN (`Lsn::ZERO` where the slot is not an intact inode).
    slots: Vec<Lsn>,
}

impl HomeLsns {
    fn of(raw: &[u8], place: &SlotPlace) -> Self {
        let count = raw.len() / place.inode_size.max(1);
        let slots: Vec<Option<Lsn>> = (0..count)
            .map(|slot| intact_inode_lsn(raw, slot, place))
            .collect();
        let inodes = slots.iter().any(Option::is_some)
            || MetaHeader::decode(raw).is_ok_and(|h| h.magic == MetaKind::Inode.magic());
        Self {
            block_bytes: raw.len(),
            inodes,
            whole: home_lsn(raw),
            slots: slots
                .into_iter()
                .map(|lsn| lsn.unwrap_or(Lsn::ZERO))
                .collect(),
        }
    }
}

/// Copies each region's bytes from `data` into `raw`, cut into `piece`-byte pieces, keeping
/// only the pieces `wanted(index)` accepts; returns the indices of the pieces written to, in
/// order, without repeats.
fn copy_regions_in(
    raw: &mut [u8],
    regions: &[(u32, u32)],
    data: &[u8],
    piece: usize,
    wanted: impl Fn(usize) -> bool,
) -> Vec<usize> {
    let piece = piece.max(1);
    let mut touched: Vec<usize> = Vec::new();
    let mut at = 0usize;
    for &(offset, length) in regions {
        let (mut offset, end) = (offset as usize, offset as usize + length as usize);
        while offset < end {
            let index = offset / piece;
            let run = end.min((index + 1) * piece) - offset;
            if wanted(index) {
                raw[offset..offset + run].copy_from_slice(&data[at..at + run]);
                if touched.last() != Some(&index) {
                    touched.push(index);
                }
            }
            offset += run;
            at += run;
        }
    }
    touched
}

/// Stamps `lsn` and the CRC: per inode for inode clusters, over the whole block otherwise.
fn stamp_block(raw: &mut [u8], inode_size: usize, lsn: Lsn) {
    if raw.len() < HEADER_SIZE {
        return;
    }
    let is_inodes = MetaHeader::decode(raw).is_ok_and(|h| h.magic == MetaKind::Inode.magic());
    if is_inodes {
        for slot in raw.chunks_exact_mut(inode_size) {
            cairn_format::stamp(slot, Some(lsn));
        }
    } else {
        cairn_format::stamp(raw, Some(lsn));
    }
}

/// For each block, where its last cancel record is (checkpoint index, item index): no
/// earlier image of it may be replayed.
fn last_cancels(checkpoints: &[&Checkpoint]) -> HashMap<u64, (usize, usize)> {
    let mut cancels = HashMap::new();
    for (index, checkpoint) in checkpoints.iter().enumerate() {
        for &(block, item_index) in &checkpoint.cancels {
            cancels.insert(block, (index, item_index));
        }
    }
    cancels
}

/// One replay pass over a checkpoint: its place among the complete checkpoints, which items
/// it applies, and the last cancel record of every block.
struct Pass<'a> {
    index: usize,
    inodes: bool,
    cancels: &'a HashMap<u64, (usize, usize)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    const UUID: [u8; 16] = [4; 16];
    const FIRST: u64 = 80;

    fn place() -> SlotPlace {
        SlotPlace {
            inode_size: 512,
            first_inode: FIRST,
            uuid: UUID,
        }
    }

    /// A cluster of 8 free inodes, each stamped with LSN (1, slot).
    fn cluster() -> Vec<u8> {
        let mut block = vec![0u8; 4096];
        for (slot, raw) in block.chunks_exact_mut(512).enumerate() {
            write_free_inode(raw, FIRST + slot as u64, UUID, 1, Lsn::new(1, slot as u32));
        }
        block
    }

    // A torn write home can leave the first sector never written: the block is still an
    // inode cluster, known from its other intact inodes, each with its own LSN.
    #[test]
    fn cluster_with_a_torn_first_inode_is_still_a_cluster() {
        let mut block = cluster();
        block[..512].fill(0);
        let home = HomeLsns::of(&block, &place());
        assert!(home.inodes);
        assert_eq!(home.slots[0], Lsn::ZERO);
        assert_eq!(home.slots[1], Lsn::new(1, 1));
        block.fill(0);
        assert!(!HomeLsns::of(&block, &place()).inodes);
    }

    // Bytes that look like an inode but name another filesystem or another place (stale
    // data, a file holding an image) do not count as an intact inode.
    #[test]
    fn inode_of_another_place_or_filesystem_does_not_count() {
        let block = cluster();
        let elsewhere = SlotPlace {
            first_inode: FIRST + 8,
            ..place()
        };
        let other_fs = SlotPlace {
            uuid: [5; 16],
            ..place()
        };
        for wrong in [elsewhere, other_fs] {
            let home = HomeLsns::of(&block, &wrong);
            assert!(home.slots.iter().all(|&lsn| lsn == Lsn::ZERO));
        }
        let mut corrupt = cluster();
        corrupt[600] ^= 1;
        assert_eq!(intact_inode_lsn(&corrupt, 1, &place()), None);
        assert_eq!(
            intact_inode_lsn(&corrupt, 2, &place()),
            Some(Lsn::new(1, 2))
        );
    }
}
