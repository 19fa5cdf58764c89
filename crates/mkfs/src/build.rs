//! Builds every metadata block of a fresh filesystem in memory, stamped and ready to write.

use cairn_blockdev::AlignedBuf;
use cairn_format::agf::Agf;
use cairn_format::agfl::{Agfl, agfl_capacity};
use cairn_format::agi::Agi;
use cairn_format::btree_block::{BtreeHeader, BtreeLayout, CntKey, FreeSpaceRecord, InodeRecord};
use cairn_format::limits::{
    AG_AGF_BLOCK, AG_AGFL_BLOCK, AG_AGI_BLOCK, AG_BNO_ROOT, AG_CNT_ROOT, AG_FINO_ROOT,
    AG_FIRST_FREE, AG_INO_ROOT, AG_SUPERBLOCK, AGI_UNLINKED_BUCKETS, INODES_PER_CHUNK,
};
use cairn_format::types::{NULL_AG_INODE, NULL_BLOCK};
use cairn_format::{AgBlock, AgNumber, FsBlock, Lsn, MetaHeader, MetaKind, OnDisk, Superblock};

use crate::plan::{AGFL_INITIAL_BLOCKS, Plan};
use crate::{MkfsError, inodes};

/// Contiguous blocks to write at `start`.
#[derive(Debug)]
pub struct BlockRun {
    pub start: FsBlock,
    pub data: AlignedBuf,
}

/// Everything mkfs writes besides the zeroed log.
#[derive(Debug)]
pub struct Image {
    pub runs: Vec<BlockRun>,
    pub superblock: Superblock,
    pub metadata_blocks: u64,
}

/// Builds the static headers and tree roots of every AG, and the root inode chunk.
pub fn build(plan: &Plan, uuid: [u8; 16], now_secs: i64) -> Result<Image, MkfsError> {
    let g = &plan.geometry;
    let free: Vec<Vec<FreeSpaceRecord>> =
        (0..g.ag_count).map(|ag| free_extents(plan, ag)).collect();
    let free_blocks = free.iter().flatten().map(|r| u64::from(r.length)).sum();
    let superblock = superblock(plan, uuid, now_secs, free_blocks);
    let mut runs = Vec::with_capacity(g.ag_count as usize + 1);
    for ag in 0..g.ag_count {
        runs.push(ag_headers(plan, &superblock, ag, &free[ag as usize])?);
    }
    runs.push(inodes::root_chunk(plan, uuid, now_secs)?);
    let metadata_blocks = runs
        .iter()
        .map(|r| r.data.len() as u64 / u64::from(g.block_size))
        .sum();
    Ok(Image {
        runs,
        superblock,
        metadata_blocks,
    })
}

fn superblock(plan: &Plan, uuid: [u8; 16], now_secs: i64, free_blocks: u64) -> Superblock {
    Superblock {
        header: MetaHeader::new(MetaKind::Superblock, 0, uuid, 0),
        geometry: plan.geometry,
        features_compat: 0,
        features_ro_compat: 0,
        features_incompat: plan.features_incompat,
        root_inode: plan.root_inode.0,
        free_blocks,
        inode_count: u64::from(INODES_PER_CHUNK),
        free_inodes: u64::from(INODES_PER_CHUNK - 1),
        label: plan.label,
        created_secs: now_secs,
        extent_size_hint: 0,
    }
}

/// The free extents of AG `ag`: everything past the reserved blocks except the root inode
/// chunk (AG 0) and the log (its AG), sorted by start.
pub fn free_extents(plan: &Plan, ag: u32) -> Vec<FreeSpaceRecord> {
    let g = &plan.geometry;
    let mut used: Vec<(u32, u32)> = Vec::new();
    if ag == 0 {
        used.push((plan.root_chunk.0, plan.root_chunk.0 + g.chunk_blocks()));
    }
    if ag == plan.log_ag {
        let log_first = g.ag_block_of(FsBlock(g.log_start)).0;
        used.push((log_first, log_first + g.log_blocks));
    }
    used.sort_unstable();
    let mut extents = Vec::new();
    let mut cursor = Plan::reserved_end();
    for (start, end) in used.into_iter().chain([(g.ag_len(ag), g.ag_len(ag))]) {
        if start > cursor {
            extents.push(FreeSpaceRecord {
                start: AgBlock(cursor),
                length: start - cursor,
            });
        }
        cursor = cursor.max(end);
    }
    extents
}

/// Blocks 0 to 7 of AG `ag` as one run: superblock copy, AGF, AGI, AGFL and the four roots.
fn ag_headers(
    plan: &Plan,
    superblock: &Superblock,
    ag: u32,
    free: &[FreeSpaceRecord],
) -> Result<BlockRun, MkfsError> {
    let g = &plan.geometry;
    let bs = g.block_size as usize;
    let uuid = superblock.uuid();
    let mut run = AlignedBuf::zeroed(bs * AG_FIRST_FREE as usize);
    superblock
        .copy_for_ag(ag)
        .encode(block_mut(&mut run, bs, AG_SUPERBLOCK));
    agf(plan, uuid, ag, free).encode(block_mut(&mut run, bs, AG_AGF_BLOCK));
    agi(plan, uuid, ag).encode(block_mut(&mut run, bs, AG_AGI_BLOCK));
    agfl(plan, uuid, ag).encode_block(block_mut(&mut run, bs, AG_AGFL_BLOCK));
    let mut by_length = free.to_vec();
    by_length.sort_by_key(|r| CntKey {
        length: r.length,
        start: r.start,
    });
    let chunk = (ag == 0).then(|| root_chunk_record(plan));
    let roots = [
        (AG_BNO_ROOT, MetaKind::BnoBtree, encode_all(free)),
        (AG_CNT_ROOT, MetaKind::CntBtree, encode_all(&by_length)),
        (
            AG_INO_ROOT,
            MetaKind::InoBtree,
            encode_all(chunk.as_slice()),
        ),
        (
            AG_FINO_ROOT,
            MetaKind::FinoBtree,
            encode_all(chunk.as_slice()),
        ),
    ];
    for (index, kind, records) in roots {
        let at = g.fs_block(AgNumber(ag), AgBlock(index));
        leaf(
            block_mut(&mut run, bs, index),
            kind,
            at,
            uuid,
            u64::from(ag),
            &records,
        )?;
    }
    for index in 0..AG_FIRST_FREE {
        cairn_format::stamp(block_mut(&mut run, bs, index), Some(Lsn::ZERO));
    }
    Ok(BlockRun {
        start: g.fs_block(AgNumber(ag), AgBlock(0)),
        data: run,
    })
}

/// The headers and tree roots of AG `ag` added by a grow to the geometry of `plan` (an AG
/// that holds neither the root chunk nor the log: all free past the reserved blocks),
/// carrying the grown filesystem's `superblock` copy.
pub fn grown_ag(plan: &Plan, superblock: &Superblock, ag: u32) -> Result<BlockRun, MkfsError> {
    if ag == 0 || ag == plan.log_ag {
        return Err(MkfsError::Option(format!("AG {ag} is not a new AG")));
    }
    ag_headers(plan, superblock, ag, &free_extents(plan, ag))
}

fn block_mut(run: &mut [u8], block_size: usize, index: u32) -> &mut [u8] {
    let at = index as usize * block_size;
    &mut run[at..at + block_size]
}

fn encode_all<T: OnDisk>(records: &[T]) -> Vec<Vec<u8>> {
    records.iter().map(OnDisk::to_bytes).collect()
}

/// A single-block tree: a leaf root holding `records` in order.
fn leaf(
    block: &mut [u8],
    kind: MetaKind,
    at: FsBlock,
    uuid: [u8; 16],
    owner: u64,
    records: &[Vec<u8>],
) -> Result<(), MkfsError> {
    let layout = BtreeLayout::for_kind(kind, block.len() as u32)
        .ok_or_else(|| MkfsError::Option(format!("{} is not a tree block", kind.name())))?;
    if records.len() > layout.leaf_capacity() {
        return Err(MkfsError::Option(format!(
            "too many records for one {}",
            kind.name()
        )));
    }
    let header = BtreeHeader {
        header: MetaHeader::new(kind, at.0, uuid, owner),
        level: 0,
        record_count: records.len() as u16,
        left: NULL_BLOCK,
        right: NULL_BLOCK,
    };
    header.encode(block);
    for (index, record) in records.iter().enumerate() {
        if let Some(slot) = layout.record_mut(block, index) {
            slot.copy_from_slice(record);
        }
    }
    Ok(())
}

fn root_chunk_record(plan: &Plan) -> InodeRecord {
    let g = &plan.geometry;
    let start = plan.root_chunk.0 << g.inodes_per_block_log;
    // Slot 0 holds the root directory; every other inode of the chunk is free.
    InodeRecord {
        start,
        free_count: INODES_PER_CHUNK - 1,
        free_mask: !1u64,
    }
}

fn agf(plan: &Plan, uuid: [u8; 16], ag: u32, free: &[FreeSpaceRecord]) -> Agf {
    let g = &plan.geometry;
    let at = g.fs_block(AgNumber(ag), AgBlock(AG_AGF_BLOCK));
    Agf {
        header: MetaHeader::new(MetaKind::Agf, at.0, uuid, u64::from(ag)),
        ag_number: AgNumber(ag),
        ag_length: g.ag_len(ag),
        bno_root: AgBlock(AG_BNO_ROOT),
        bno_levels: 1,
        cnt_root: AgBlock(AG_CNT_ROOT),
        cnt_levels: 1,
        free_blocks: free.iter().map(|r| r.length).sum(),
        longest_free: free.iter().map(|r| r.length).max().unwrap_or(0),
        btree_blocks: 0,
        free_list_first: 0,
        free_list_last: AGFL_INITIAL_BLOCKS - 1,
        free_list_count: AGFL_INITIAL_BLOCKS,
        // The refcount tree's root is made with its first record.
        refcount_root: AgBlock(0),
        refcount_levels: 0,
        refcount_blocks: 0,
    }
}

fn agi(plan: &Plan, uuid: [u8; 16], ag: u32) -> Agi {
    let g = &plan.geometry;
    let at = g.fs_block(AgNumber(ag), AgBlock(AG_AGI_BLOCK));
    let has_root = ag == 0;
    Agi {
        header: MetaHeader::new(MetaKind::Agi, at.0, uuid, u64::from(ag)),
        ag_number: AgNumber(ag),
        ag_length: g.ag_len(ag),
        inode_count: if has_root { INODES_PER_CHUNK } else { 0 },
        free_inodes: if has_root { INODES_PER_CHUNK - 1 } else { 0 },
        ino_root: AgBlock(AG_INO_ROOT),
        ino_levels: 1,
        fino_root: AgBlock(AG_FINO_ROOT),
        fino_levels: 1,
        newest_inode: if has_root {
            root_chunk_record(plan).start
        } else {
            NULL_AG_INODE
        },
        unlinked: [NULL_AG_INODE; AGI_UNLINKED_BUCKETS],
    }
}

fn agfl(plan: &Plan, uuid: [u8; 16], ag: u32) -> Agfl {
    let g = &plan.geometry;
    let at = g.fs_block(AgNumber(ag), AgBlock(AG_AGFL_BLOCK));
    let mut list = Agfl::new(
        MetaHeader::new(MetaKind::Agfl, at.0, uuid, u64::from(ag)),
        g.block_size,
    );
    debug_assert!(AGFL_INITIAL_BLOCKS <= agfl_capacity(g.block_size));
    for (slot, block) in list
        .slots
        .iter_mut()
        .zip(AG_FIRST_FREE..Plan::reserved_end())
    {
        *slot = block;
    }
    list
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Request, plan};
    use proptest::prelude::*;

    proptest! {
        // In every AG, reserved blocks, root chunk, log and free extents tile the AG exactly.
        #[test]
        fn ag_blocks_are_tiled(mib in 4u64..4096, ag_count in 1u32..9, block_log in 9u32..14) {
            let request = Request {
                block_size: 1 << block_log,
                ag_count: Some(ag_count),
                ..Request::default()
            };
            let Ok(plan) = plan(mib << 20, 512, &request) else { return Ok(()) };
            let g = plan.geometry;
            for ag in 0..g.ag_count {
                let free: u64 = free_extents(&plan, ag).iter().map(|r| u64::from(r.length)).sum();
                let mut used = u64::from(Plan::reserved_end());
                if ag == 0 {
                    used += u64::from(g.chunk_blocks());
                    // Alignment of the chunk may leave a free gap; it is counted in `free`.
                }
                if ag == plan.log_ag {
                    used += u64::from(g.log_blocks);
                }
                prop_assert_eq!(free + used, u64::from(g.ag_len(ag)));
            }
        }
    }

    // Every block mkfs builds verifies with the format crate's checks.
    #[test]
    fn built_blocks_verify() {
        let plan = plan(64 << 20, 4096, &Request::default()).unwrap();
        let image = build(&plan, [3; 16], 0).unwrap();
        let g = plan.geometry;
        let primary = Superblock::read_primary(&image.runs[0].data).unwrap();
        assert_eq!(primary.geometry, g);
        assert_eq!(image.runs.len() as u32, g.ag_count + 1);
        assert_eq!(
            image.metadata_blocks,
            u64::from(g.ag_count * AG_FIRST_FREE + g.chunk_blocks())
        );
    }
}
