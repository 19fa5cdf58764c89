//! Inode allocation: chunks of 64 inodes tracked by each AG's inode tree (every chunk) and
//! free-inode tree (chunks with a free inode), so finding a free inode never scans.

use cairn_alloc::Request;
use cairn_btree::{Btree, InoCodec, TreeCodec, TreeSpec};
use cairn_bufcache::{BufKey, HeaderOps, ReadSpec};
use cairn_format::btree_block::{InoKey, InodeRecord};
use cairn_format::limits::{AG_AGF_BLOCK, AG_AGI_BLOCK, INODES_PER_CHUNK};
use cairn_format::{AgBlock, AgNumber, Agi, FsBlock, MetaKind, OnDisk};

use crate::FsError;
use crate::fs::Filesystem;
use crate::glue::{AgTreeCtx, JournalLog, Tx};

static AGI_OPS: HeaderOps = HeaderOps::new(MetaKind::Agi);

/// Free-inode tree: the same records as the inode tree, only chunks with a free inode.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FinoCodec;

impl TreeCodec for FinoCodec {
    type Record = InodeRecord;
    type Key = InoKey;
    const KIND: MetaKind = MetaKind::FinoBtree;

    fn key(record: &InodeRecord) -> InoKey {
        InoKey {
            start: record.start,
        }
    }
}

/// Block and read spec of AG `ag`'s AGI.
pub(crate) fn agi_location(fs: &Filesystem, ag: u32) -> (FsBlock, ReadSpec) {
    let block = FsBlock(fs.geometry.ag_start(ag) + u64::from(AG_AGI_BLOCK));
    (
        block,
        ReadSpec::new(&AGI_OPS, fs.uuid).with_owner(u64::from(ag)),
    )
}

/// Reads AG `ag`'s AGI inside the transaction.
#[track_caller]
pub(crate) fn read_agi(fs: &Filesystem, tx: &mut Tx<'_>, ag: u32) -> Result<Agi, FsError> {
    let (block, spec) = agi_location(fs, ag);
    let guard = tx.tx.get_buf(BufKey::single(block.0), &spec)?;
    let agi = Agi::decode(guard).map_err(|e| FsError::corrupt("AGI", block.0, e.to_string()))?;
    agi.check(&fs.geometry)
        .map_err(|e| FsError::corrupt("AGI", block.0, e.to_string()))?;
    Ok(agi)
}

/// Writes `agi` back (the transaction holds its buffer).
pub(crate) fn write_agi(fs: &Filesystem, tx: &mut Tx<'_>, agi: &Agi) -> Result<(), FsError> {
    let (block, spec) = agi_location(fs, agi.ag_number.0);
    let guard = tx.tx.get_buf(BufKey::single(block.0), &spec)?;
    guard.write(0, &agi.to_bytes())?;
    Ok(())
}

fn trees(fs: &Filesystem, agi: &Agi) -> Result<(Btree<InoCodec>, Btree<FinoCodec>), FsError> {
    let ag = agi.ag_number.0;
    let ino_spec = TreeSpec::ag::<InoCodec>(&fs.geometry, fs.uuid, ag)?;
    let fino_spec = TreeSpec::ag::<FinoCodec>(&fs.geometry, fs.uuid, ag)?;
    Ok((
        Btree::open(ino_spec, u64::from(agi.ino_root.0), agi.ino_levels)?,
        Btree::open(fino_spec, u64::from(agi.fino_root.0), agi.fino_levels)?,
    ))
}

fn store_roots(agi: &mut Agi, ino: &Btree<InoCodec>, fino: &Btree<FinoCodec>) {
    agi.ino_root = AgBlock(ino.root() as u32);
    agi.ino_levels = ino.levels();
    agi.fino_root = AgBlock(fino.root() as u32);
    agi.fino_levels = fino.levels();
}

/// What `allocate_inode` found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InodeAlloc {
    Allocated(u64),
    /// An AG locked its AGF for a chunk it could not place (and is now marked as having no
    /// room for one): no further AGI may be locked in this transaction, since every AGI
    /// comes before every AGF. The caller commits it and tries again in a new one.
    TryAgain,
}

/// Allocates a free inode, preferring AG `preferred`; returns its number. The caller
/// initialises the inode. `NoSpace` when no AG has a free inode or room for a chunk.
pub(crate) fn allocate_inode(
    fs: &Filesystem,
    tx: &mut Tx<'_>,
    preferred: u32,
) -> Result<InodeAlloc, FsError> {
    let count = fs.geometry.ag_count;
    let preferred = preferred.min(count - 1);
    // AGIs ascend within a transaction: from the preferred AG up, then a wrap to lower AGs
    // only before any AGI was joined.
    for ag in (preferred..count).chain(0..preferred) {
        if ag < preferred && tx_holds_header(tx, preferred..count, |ag| agi_location(fs, ag).0) {
            break;
        }
        if tx_holds_header(tx, 0..count, |ag| agf_block(fs, ag)) {
            return Ok(InodeAlloc::TryAgain);
        }
        if let Some(number) = allocate_in_ag(fs, tx, ag)? {
            return Ok(InodeAlloc::Allocated(number));
        }
    }
    Err(FsError::NoSpace)
}

/// Whether `tx` holds the header `location` names of some AG in `ags`.
fn tx_holds_header(
    tx: &mut Tx<'_>,
    ags: std::ops::Range<u32>,
    block: impl Fn(u32) -> FsBlock,
) -> bool {
    ags.into_iter()
        .any(|ag| tx.tx.buf_mut(BufKey::single(block(ag).0)).is_some())
}

/// AG `ag`'s AGF block.
fn agf_block(fs: &Filesystem, ag: u32) -> FsBlock {
    FsBlock(fs.geometry.ag_start(ag) + u64::from(AG_AGF_BLOCK))
}

/// Whether AG `ag` may have room for a new inode chunk, judged without locking it.
fn chunk_may_fit(fs: &Filesystem, ag: u32) -> bool {
    let chunk_blocks = fs.geometry.chunk_blocks();
    fs.ag_may_hold_chunk(ag)
        && fs
            .alloc
            .longest_free_hint(ag)
            .is_none_or(|longest| longest >= chunk_blocks)
}

fn allocate_in_ag(fs: &Filesystem, tx: &mut Tx<'_>, ag: u32) -> Result<Option<u64>, FsError> {
    // Skip, without locking its AGI, an AG that cannot give an inode: once this transaction
    // holds an AGI it may not wrap to a lower AG, so a needless lock here turns into NoSpace.
    if fs.ag_inodes_free(ag) == 0 && !chunk_may_fit(fs, ag) {
        return Ok(None);
    }
    let epoch = fs.chunk_look_epoch();
    let mut agi = read_agi(fs, tx, ag)?;
    let (mut ino, mut fino) = trees(fs, &agi)?;
    let mut ctx = AgTreeCtx {
        tx,
        alloc: &fs.alloc,
        journal: &fs.journal,
        ag,
    };
    if agi.free_inodes == 0 {
        let Some(record) = new_chunk(fs, &mut ctx, &mut agi)? else {
            fs.chunk_failed(ag, epoch);
            return Ok(None);
        };
        ino.insert(&mut ctx, &record)?;
        fino.insert(&mut ctx, &record)?;
    }
    let first = fino.first(&mut ctx)?.ok_or_else(|| {
        FsError::corrupt("free-inode tree", u64::from(ag), "empty but AGI has free")
    })?;
    let mut record = fino.record(&mut ctx, &first)?;
    if record.free_mask == 0 || record.free_count == 0 {
        return Err(FsError::corrupt(
            "free-inode tree",
            u64::from(ag),
            "record without free",
        ));
    }
    let slot = record.free_mask.trailing_zeros();
    record.free_mask &= !(1u64 << slot);
    record.free_count -= 1;
    let key = InoKey {
        start: record.start,
    };
    ino.update(&mut ctx, &key, &record)?;
    if record.free_count == 0 {
        fino.delete_at(&mut ctx, first)?;
    } else {
        fino.update_at(&mut ctx, &first, &record)?;
    }
    agi.free_inodes -= 1;
    store_roots(&mut agi, &ino, &fino);
    write_agi(fs, ctx.tx, &agi)?;
    fs.add_ag_inodes(ag, 0, -1);
    let ag_inode = record.start + slot;
    Ok(Some(fs.geometry.ag_inode_to_number(ag, ag_inode)))
}

/// Allocates and initialises a new chunk of free inodes in the AG; `None` without room.
fn new_chunk(
    fs: &Filesystem,
    ctx: &mut AgTreeCtx<'_, '_>,
    agi: &mut Agi,
) -> Result<Option<InodeRecord>, FsError> {
    let ag = agi.ag_number.0;
    let blocks = fs.geometry.chunk_blocks();
    let target = FsBlock(fs.geometry.ag_start(ag));
    // In this AG only: another AG's AGF locked here would come before its AGI, which
    // the next AG's try takes (docs/fs.md, lock order).
    let mut request = Request::near(target, blocks, blocks)
        .with_alignment(blocks, blocks)
        .in_target_ag_only();
    request.lowest_ag = AgNumber(ag);
    let log = JournalLog(&fs.journal);
    let Some(found) = fs.alloc.allocate(ctx.tx, &log, &request)? else {
        return Ok(None);
    };
    debug_assert_eq!(found.ag.0, ag, "a chunk from another AG");
    init_chunk(fs, ctx.tx, ag, found.start)?;
    let start = found.start << fs.geometry.inodes_per_block_log;
    agi.inode_count += INODES_PER_CHUNK;
    agi.free_inodes += INODES_PER_CHUNK;
    agi.newest_inode = start;
    fs.add_ag_inodes(ag, i64::from(INODES_PER_CHUNK), i64::from(INODES_PER_CHUNK));
    Ok(Some(InodeRecord {
        start,
        free_count: INODES_PER_CHUNK,
        free_mask: u64::MAX,
    }))
}

/// Creates the chunk at AG block `start`: each cluster block holds free inodes of one new
/// generation, logged as an inode create item per block rather than the blocks' bytes.
fn init_chunk(fs: &Filesystem, tx: &mut Tx<'_>, ag: u32, start: u32) -> Result<(), FsError> {
    let geometry = &fs.geometry;
    let generation = fs.next_generation();
    for block_index in 0..geometry.chunk_blocks() {
        let block = AgBlock(start + block_index);
        let first = geometry.inode_number(AgNumber(ag), block, 0);
        let key = BufKey::single(geometry.fs_block(AgNumber(ag), block).0);
        tx.tx
            .get_new_inode_cluster(key, &fs.cluster_spec, first, generation)?;
    }
    Ok(())
}

/// Marks inode `number` free in its AG's trees and AGI.
pub(crate) fn free_inode(fs: &Filesystem, tx: &mut Tx<'_>, number: u64) -> Result<(), FsError> {
    let (ag, ag_inode) = fs.geometry.split_inode_number(number)?;
    let mut agi = read_agi(fs, tx, ag)?;
    let (mut ino, mut fino) = trees(fs, &agi)?;
    let mut ctx = AgTreeCtx {
        tx,
        alloc: &fs.alloc,
        journal: &fs.journal,
        ag,
    };
    let start = ag_inode - ag_inode % INODES_PER_CHUNK;
    let key = InoKey { start };
    let mut record = ino
        .get(&mut ctx, &key)?
        .ok_or_else(|| FsError::corrupt("inode tree", number, "no chunk for inode"))?;
    let bit = 1u64 << (ag_inode - start);
    if record.free_mask & bit != 0 {
        return Err(FsError::corrupt("inode tree", number, "inode already free"));
    }
    record.free_mask |= bit;
    record.free_count += 1;
    ino.update(&mut ctx, &key, &record)?;
    if record.free_count == 1 {
        fino.insert(&mut ctx, &record)?;
    } else {
        fino.update(&mut ctx, &key, &record)?;
    }
    agi.free_inodes += 1;
    store_roots(&mut agi, &ino, &fino);
    write_agi(fs, ctx.tx, &agi)?;
    fs.add_ag_inodes(ag, 0, 1);
    Ok(())
}

/// Whether inode `number` is allocated, by the inode tree alone (never reading the inode):
/// how an untrusted number, from a file handle, is checked before its cluster is read.
pub(crate) fn inode_in_use(fs: &Filesystem, number: u64) -> Result<bool, FsError> {
    if !fs.geometry.inode_is_valid(number) {
        return Ok(false);
    }
    let (ag, ag_inode) = fs.geometry.split_inode_number(number)?;
    let mut tx = fs.begin(cairn_journal::Reservation::new(0))?;
    let found = read_agi(fs, &mut tx, ag).and_then(|agi| {
        let (ino, _) = trees(fs, &agi)?;
        let mut ctx = AgTreeCtx {
            tx: &mut tx,
            alloc: &fs.alloc,
            journal: &fs.journal,
            ag,
        };
        let start = ag_inode - ag_inode % INODES_PER_CHUNK;
        let record = ino.get(&mut ctx, &InoKey { start })?;
        Ok(record.is_some_and(|r| r.free_mask & (1u64 << (ag_inode - start)) == 0))
    });
    tx.tx.cancel()?;
    found
}

/// Inode-number arithmetic the geometry does not offer directly.
pub(crate) trait InodeNumbers {
    fn ag_inode_to_number(&self, ag: u32, ag_inode: u32) -> u64;
    fn split_inode_number(&self, number: u64) -> Result<(u32, u32), FsError>;
}

impl InodeNumbers for cairn_format::Geometry {
    fn ag_inode_to_number(&self, ag: u32, ag_inode: u32) -> u64 {
        (u64::from(ag) << self.ag_inode_bits()) | u64::from(ag_inode)
    }

    fn split_inode_number(&self, number: u64) -> Result<(u32, u32), FsError> {
        if !self.inode_is_valid(number) {
            return Err(FsError::corrupt(
                "inode number",
                number,
                "outside the filesystem",
            ));
        }
        let bits = self.ag_inode_bits();
        Ok((
            (number >> bits) as u32,
            (number & ((1u64 << bits) - 1)) as u32,
        ))
    }
}
