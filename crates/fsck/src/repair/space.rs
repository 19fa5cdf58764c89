//! Phase 3 of repair: every AG's free-space trees, inode trees, refcount tree (reflink: the
//! runs regular files map more than once, recounted from their maps; staging runs dropped),
//! AGF, AGFL and AGI are rebuilt from the observed in-use map (what the inodes, chunks,
//! headers and log claim; blocks nobody claims become free), and the superblock counters
//! and every secondary superblock are rewritten from the primary.

use std::collections::BTreeMap;

use cairn_format::agf::Agf;
use cairn_format::agfl::{Agfl, agfl_capacity};
use cairn_format::agi::Agi;
use cairn_format::btree_block::{
    BnoKey, BtreeHeader, BtreeLayout, CntKey, FreeSpaceRecord, InoKey, InodeRecord,
};
use cairn_format::limits::{
    AG_AGF_BLOCK, AG_AGFL_BLOCK, AG_AGI_BLOCK, AG_HEADER_BLOCKS, AGI_UNLINKED_BUCKETS,
    INODES_PER_CHUNK,
};
use cairn_format::types::{NULL_AG_INODE, NULL_BLOCK};
use cairn_format::{AgBlock, AgNumber, FsBlock, MetaHeader, MetaKind, OnDisk, RefcountRecord};

use super::{RepairError, Repairer};
use crate::check::Claim;

/// Owners of blocks that this phase rebuilds; their old claims do not count as in use.
const REBUILT_OWNERS: [&str; 3] = ["free space", "AG free list", crate::refcount::STAGING_OWNER];

/// Free-list blocks a rebuilt AG starts with (as mkfs gives a new one).
const FREE_LIST_BLOCKS: u32 = 8;

/// Whether a claim survives a rebuild of the AG trees and free list.
pub(crate) fn is_rebuilt(claim: &Claim) -> bool {
    REBUILT_OWNERS.contains(&claim.owner)
        || [
            MetaKind::BnoBtree,
            MetaKind::CntBtree,
            MetaKind::InoBtree,
            MetaKind::FinoBtree,
            MetaKind::RefcountBtree,
        ]
        .iter()
        .any(|kind| kind.name() == claim.owner)
}

/// A bulk-load entry: first key, record (leaves) and child pointer (nodes).
type LoadItem = (Vec<u8>, Vec<u8>, u32);

/// The new trees of one AG: blocks reserved for them and the records they hold.
struct AgPlan {
    free: Vec<FreeSpaceRecord>,
    reserved: Vec<u32>,
    chunks: Vec<InodeRecord>,
    /// The refcount tree's records (reflink: runs regular files map more than once).
    shared: Vec<RefcountRecord>,
}

/// Blocks a bulk-loaded tree of `records` needs.
fn tree_blocks(layout: &BtreeLayout, records: usize) -> usize {
    let mut level_count = records.div_ceil(layout.leaf_capacity()).max(1);
    let mut total = level_count;
    while level_count > 1 {
        level_count = level_count.div_ceil(layout.node_capacity());
        total += level_count;
    }
    total
}

/// The free extents of an AG of `ag_len` blocks outside `used` (sorted, AG-relative ranges).
fn complement(used: &[(u32, u32)], ag_len: u32) -> Vec<FreeSpaceRecord> {
    let mut free = Vec::new();
    let mut cursor = 0u32;
    for &(start, end) in used.iter().chain([(ag_len, ag_len)].iter()) {
        if start > cursor {
            free.push(FreeSpaceRecord {
                start: AgBlock(cursor),
                length: start - cursor,
            });
        }
        cursor = cursor.max(end);
    }
    free
}

/// Takes `count` blocks from the front of the lowest free extents.
fn take_blocks(free: &mut Vec<FreeSpaceRecord>, count: usize, into: &mut Vec<u32>) {
    let mut wanted = count;
    while wanted > 0 && !free.is_empty() {
        let first = &mut free[0];
        let taken = (first.length as usize).min(wanted) as u32;
        into.extend(first.start.0..first.start.0 + taken);
        first.start = AgBlock(first.start.0 + taken);
        first.length -= taken;
        wanted -= taken as usize;
        if first.length == 0 {
            free.remove(0);
        }
    }
}

impl Repairer<'_> {
    /// Rebuilds every AG from `claims`, `chunks` and the refcount records `shared` (per AG),
    /// then the superblocks.
    pub(crate) fn rebuild_space(
        &mut self,
        claims: &[Claim],
        chunks: &[(u32, InodeRecord)],
        unlinked: &BTreeMap<u32, Vec<u32>>,
        shared: &BTreeMap<u32, Vec<RefcountRecord>>,
    ) -> Result<(), RepairError> {
        let g = self.geometry;
        let mut used: Vec<Vec<(u32, u32)>> = vec![Vec::new(); g.ag_count as usize];
        for claim in claims.iter().filter(|c| !is_rebuilt(c)) {
            let end = claim.start.saturating_add(claim.length).min(g.block_count);
            let mut at = claim.start;
            while at < end {
                let ag = g.ag_of(FsBlock(at)).0;
                let ag_end = g.ag_start(ag) + u64::from(g.ag_len(ag));
                let stop = end.min(ag_end);
                let first = g.ag_block_of(FsBlock(at)).0;
                used[ag as usize].push((first, first + (stop - at) as u32));
                at = stop;
            }
        }
        let (mut free_blocks, mut inodes, mut free_inodes) = (0u64, 0u64, 0u64);
        for ag in 0..g.ag_count {
            let mut ag_used = std::mem::take(&mut used[ag as usize]);
            ag_used.push((0, AG_HEADER_BLOCKS));
            ag_used.sort_unstable();
            let mut ag_chunks: Vec<InodeRecord> = chunks
                .iter()
                .filter(|(a, _)| *a == ag)
                .map(|(_, c)| *c)
                .collect();
            ag_chunks.sort_by_key(|c| c.start);
            ag_chunks.dedup_by_key(|c| c.start);
            let ag_shared = shared.get(&ag).cloned().unwrap_or_default();
            let plan = self.plan_ag(ag, &ag_used, ag_chunks, ag_shared)?;
            free_blocks += plan.free.iter().map(|r| u64::from(r.length)).sum::<u64>();
            inodes += plan.chunks.len() as u64 * u64::from(INODES_PER_CHUNK);
            free_inodes += plan
                .chunks
                .iter()
                .map(|c| u64::from(c.free_count))
                .sum::<u64>();
            let heads = unlinked.get(&ag).cloned();
            self.write_ag(ag, plan, heads)?;
        }
        let mut sb = self.superblock.clone();
        sb.free_blocks = free_blocks;
        sb.inode_count = inodes;
        sb.free_inodes = free_inodes;
        for ag in 0..g.ag_count {
            let copy = sb.copy_for_ag(ag);
            let mut block = vec![0u8; g.block_size as usize];
            copy.encode(&mut block);
            self.write_meta(copy.header.blkno, &mut block)?;
        }
        self.superblock = sb;
        Ok(())
    }

    /// Works out the free extents, the reserved tree and free-list blocks of AG `ag`.
    fn plan_ag(
        &self,
        ag: u32,
        used: &[(u32, u32)],
        chunks: Vec<InodeRecord>,
        shared: Vec<RefcountRecord>,
    ) -> Result<AgPlan, RepairError> {
        let bs = self.geometry.block_size;
        let layout = |kind| {
            BtreeLayout::for_kind(kind, bs)
                .ok_or_else(|| RepairError::Stuck(format!("{} has no tree layout", kind.name())))
        };
        let (free_layout, ino_layout) = (layout(MetaKind::BnoBtree)?, layout(MetaKind::InoBtree)?);
        let mut free = complement(used, self.geometry.ag_len(ag));
        let with_free = chunks.iter().filter(|c| c.free_count > 0).count();
        let mut ino_need =
            tree_blocks(&ino_layout, chunks.len()) + tree_blocks(&ino_layout, with_free);
        if !shared.is_empty() {
            ino_need += tree_blocks(&layout(MetaKind::RefcountBtree)?, shared.len());
        }
        let mut reserved = Vec::new();
        loop {
            let need =
                2 * tree_blocks(&free_layout, free.len()) + ino_need + FREE_LIST_BLOCKS as usize;
            if reserved.len() >= need || free.is_empty() {
                break;
            }
            take_blocks(&mut free, need - reserved.len(), &mut reserved);
        }
        Ok(AgPlan {
            free,
            reserved,
            chunks,
            shared,
        })
    }

    /// Writes AG `ag`'s four trees, AGFL, AGF and AGI as `plan` lays them out.
    fn write_ag(
        &mut self,
        ag: u32,
        plan: AgPlan,
        unlinked: Option<Vec<u32>>,
    ) -> Result<(), RepairError> {
        let AgPlan {
            free,
            mut reserved,
            chunks,
            shared,
        } = plan;
        reserved.reverse();
        let encode = |records: &[Vec<u8>]| records.to_vec();
        let by_block: Vec<Vec<u8>> = free.iter().map(OnDisk::to_bytes).collect();
        let bno_keys: Vec<Vec<u8>> = free
            .iter()
            .map(|r| BnoKey { start: r.start }.to_bytes())
            .collect();
        let mut by_length = free.clone();
        by_length.sort_by_key(|r| (r.length, r.start));
        let cnt_records: Vec<Vec<u8>> = by_length.iter().map(OnDisk::to_bytes).collect();
        let cnt_keys: Vec<Vec<u8>> = by_length
            .iter()
            .map(|r| {
                CntKey {
                    length: r.length,
                    start: r.start,
                }
                .to_bytes()
            })
            .collect();
        let with_free: Vec<InodeRecord> = chunks
            .iter()
            .copied()
            .filter(|c| c.free_count > 0)
            .collect();
        let ino_of = |list: &[InodeRecord]| -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
            (
                list.iter().map(OnDisk::to_bytes).collect(),
                list.iter()
                    .map(|c| InoKey { start: c.start }.to_bytes())
                    .collect(),
            )
        };
        let (ino_records, ino_keys) = ino_of(&chunks);
        let (fino_records, fino_keys) = ino_of(&with_free);
        let bno = self.bulk_load(
            ag,
            MetaKind::BnoBtree,
            &encode(&by_block),
            &bno_keys,
            &mut reserved,
        )?;
        let cnt = self.bulk_load(
            ag,
            MetaKind::CntBtree,
            &cnt_records,
            &cnt_keys,
            &mut reserved,
        )?;
        let ino = self.bulk_load(
            ag,
            MetaKind::InoBtree,
            &ino_records,
            &ino_keys,
            &mut reserved,
        )?;
        let fino = self.bulk_load(
            ag,
            MetaKind::FinoBtree,
            &fino_records,
            &fino_keys,
            &mut reserved,
        )?;
        let refcount = match shared.is_empty() {
            true => (0, 0, 0),
            false => {
                let records: Vec<Vec<u8>> = shared.iter().map(OnDisk::to_bytes).collect();
                let keys: Vec<Vec<u8>> = shared.iter().map(|r| r.key().to_bytes()).collect();
                let kind = MetaKind::RefcountBtree;
                self.bulk_load(ag, kind, &records, &keys, &mut reserved)?
            }
        };
        let g = self.geometry;
        let uuid = self.uuid;
        let capacity = agfl_capacity(g.block_size);
        // Blocks reserved beyond what the trees took go on the free list; any the free list
        // cannot hold go back to free space on the next run (reported as lost until then).
        reserved.truncate(capacity as usize);
        let agfl_at = g.fs_block(AgNumber(ag), AgBlock(AG_AGFL_BLOCK)).0;
        let mut agfl = Agfl::new(
            MetaHeader::new(MetaKind::Agfl, agfl_at, uuid, u64::from(ag)),
            g.block_size,
        );
        for (slot, &block) in agfl.slots.iter_mut().zip(&reserved) {
            *slot = block;
        }
        let mut block = vec![0u8; g.block_size as usize];
        agfl.encode_block(&mut block);
        self.write_meta(agfl_at, &mut block)?;
        let agf_at = g.fs_block(AgNumber(ag), AgBlock(AG_AGF_BLOCK)).0;
        let count = reserved.len() as u32;
        let agf = Agf {
            header: MetaHeader::new(MetaKind::Agf, agf_at, uuid, u64::from(ag)),
            ag_number: AgNumber(ag),
            ag_length: g.ag_len(ag),
            bno_root: AgBlock(bno.0),
            bno_levels: bno.1,
            cnt_root: AgBlock(cnt.0),
            cnt_levels: cnt.1,
            free_blocks: free.iter().map(|r| r.length).sum(),
            longest_free: free.iter().map(|r| r.length).max().unwrap_or(0),
            btree_blocks: (bno.2 + cnt.2).saturating_sub(2),
            free_list_first: 0,
            free_list_last: count.saturating_sub(1),
            free_list_count: count,
            refcount_root: AgBlock(refcount.0),
            refcount_levels: refcount.1,
            refcount_blocks: refcount.2,
        };
        let mut block = vec![0u8; g.block_size as usize];
        agf.encode(&mut block);
        self.write_meta(agf_at, &mut block)?;
        let agi_at = g.fs_block(AgNumber(ag), AgBlock(AG_AGI_BLOCK)).0;
        let mut heads = [NULL_AG_INODE; AGI_UNLINKED_BUCKETS];
        for (head, value) in heads.iter_mut().zip(unlinked.unwrap_or_default()) {
            *head = value;
        }
        let agi = Agi {
            header: MetaHeader::new(MetaKind::Agi, agi_at, uuid, u64::from(ag)),
            ag_number: AgNumber(ag),
            ag_length: g.ag_len(ag),
            inode_count: chunks.len() as u32 * INODES_PER_CHUNK,
            free_inodes: chunks.iter().map(|c| c.free_count).sum(),
            ino_root: AgBlock(ino.0),
            ino_levels: ino.1,
            fino_root: AgBlock(fino.0),
            fino_levels: fino.1,
            newest_inode: chunks.last().map_or(NULL_AG_INODE, |c| c.start),
            unlinked: heads,
        };
        let mut block = vec![0u8; g.block_size as usize];
        agi.encode(&mut block);
        self.write_meta(agi_at, &mut block)?;
        Ok(())
    }

    /// Writes a tree holding `records` (sorted, with their `keys`) into blocks popped from
    /// `reserved`; returns (root, levels, blocks used).
    fn bulk_load(
        &mut self,
        ag: u32,
        kind: MetaKind,
        records: &[Vec<u8>],
        keys: &[Vec<u8>],
        reserved: &mut Vec<u32>,
    ) -> Result<(u32, u32, u32), RepairError> {
        let bs = self.geometry.block_size;
        let layout = BtreeLayout::for_kind(kind, bs)
            .ok_or_else(|| RepairError::Stuck(format!("{} has no tree layout", kind.name())))?;
        let mut level = 0u16;
        // (first key, entries) of each block at the current level: entries are records at
        // level 0, (key, pointer) pairs above.
        let mut items: Vec<LoadItem> = records
            .iter()
            .zip(keys)
            .map(|(r, k)| (k.clone(), r.clone(), 0))
            .collect();
        let mut used = 0u32;
        loop {
            let capacity = layout.capacity(level);
            let groups: Vec<&[LoadItem]> = if items.is_empty() {
                vec![&[]]
            } else {
                items.chunks(capacity).collect()
            };
            let mut blocks = Vec::with_capacity(groups.len());
            for _ in &groups {
                let block = reserved.pop().ok_or_else(|| {
                    RepairError::Stuck(format!("AG {ag}: no space left for the {}", kind.name()))
                })?;
                blocks.push(block);
            }
            used += blocks.len() as u32;
            let mut next = Vec::with_capacity(groups.len());
            for (index, group) in groups.iter().enumerate() {
                let at = self.geometry.fs_block(AgNumber(ag), AgBlock(blocks[index]));
                let header = BtreeHeader {
                    header: MetaHeader::new(kind, at.0, self.uuid, u64::from(ag)),
                    level,
                    record_count: group.len() as u16,
                    left: index
                        .checked_sub(1)
                        .map_or(NULL_BLOCK, |i| u64::from(blocks[i])),
                    right: blocks.get(index + 1).map_or(NULL_BLOCK, |&b| u64::from(b)),
                };
                let mut raw = vec![0u8; bs as usize];
                header.encode(&mut raw);
                for (slot, (key, entry, pointer)) in group.iter().enumerate() {
                    if level == 0 {
                        if let Some(out) = layout.record_mut(&mut raw, slot) {
                            out.copy_from_slice(entry);
                        }
                    } else {
                        if let Some(out) = layout.key_mut(&mut raw, slot) {
                            out.copy_from_slice(key);
                        }
                        layout
                            .set_pointer(&mut raw, slot, u64::from(*pointer))
                            .map_err(RepairError::Format)?;
                    }
                }
                self.write_meta(at.0, &mut raw)?;
                let first_key = group.first().map(|g| g.0.clone()).unwrap_or_default();
                next.push((first_key, Vec::new(), blocks[index]));
            }
            level += 1;
            if next.len() == 1 {
                return Ok((next[0].2, u32::from(level), used));
            }
            items = next;
        }
    }
}
