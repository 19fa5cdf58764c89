//! `Allocator::check_invariants`: everything one AG's free-space metadata must agree on.

use std::collections::BTreeSet;

use cairn_btree::Buffers;
use cairn_format::limits::AG_HEADER_BLOCKS;
use cairn_format::{AgNumber, FreeSpaceRecord, RefcountRecord};

use crate::ag::AgCtx;
use crate::space::AgSpace;
use crate::{AllocError, Allocator};

/// Summary of one AG's free space, as the checks found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgSummary {
    /// Free extents by start.
    pub extents: Vec<(u32, u32)>,
    pub free_blocks: u32,
    pub longest_free: u32,
    /// Blocks on the AG free list.
    pub free_list: Vec<u32>,
    /// Blocks of both trees.
    pub tree_blocks: u64,
    /// The refcount tree's records (reflink), in key order.
    pub refcount_records: Vec<cairn_format::RefcountRecord>,
    /// Blocks of the refcount tree.
    pub refcount_blocks: u64,
}

impl Allocator {
    /// Checks AG `ag`: both trees verify clean and hold the same extents; no two extents
    /// overlap or touch; the AGF's free count, longest extent and tree-block count match the
    /// trees; free-list blocks are distinct, allocatable and not free; busy ranges are
    /// disjoint and lie in free space.
    pub fn check_invariants<'c, B: Buffers<'c>>(
        &self,
        bufs: &mut B,
        ag: AgNumber,
    ) -> Result<AgSummary, AllocError> {
        let broken = |what: String| AllocError::Invariant { ag: ag.0, what };
        let mut ctx = AgCtx::open(bufs, &self.geometry, self.uuid, ag)?;
        let space = AgSpace::open(&ctx)?;
        let bno_report = space.bno.verify(&mut ctx);
        let cnt_report = space.cnt.verify(&mut ctx);
        if let Some(problem) = bno_report
            .problems
            .iter()
            .chain(&cnt_report.problems)
            .next()
        {
            return Err(broken(format!("tree problem: {problem}")));
        }
        let by_block = space.bno.records(&mut ctx)?;
        let mut by_length = space.cnt.records(&mut ctx)?;
        by_length.sort_by_key(|r| r.start);
        if by_block != by_length {
            return Err(broken("the two trees hold different extents".into()));
        }
        check_disjoint(&by_block).map_err(broken)?;
        let free: u64 = by_block.iter().map(|r| u64::from(r.length)).sum();
        let longest = by_block.iter().map(|r| r.length).max().unwrap_or(0);
        if free != u64::from(ctx.agf.free_blocks) || longest != ctx.agf.longest_free {
            let agf = (ctx.agf.free_blocks, ctx.agf.longest_free);
            return Err(broken(format!(
                "AGF says {agf:?}, trees say ({free}, {longest})"
            )));
        }
        let tree_blocks = bno_report.blocks + cnt_report.blocks;
        if tree_blocks != u64::from(ctx.agf.btree_blocks) + 2 {
            let counted = ctx.agf.btree_blocks;
            return Err(broken(format!(
                "{tree_blocks} tree blocks, AGF counts {counted} + 2"
            )));
        }
        let free_list = ctx.free_list()?;
        self.check_free_list(&free_list, &by_block, ctx.agf.ag_length)
            .map_err(broken)?;
        let (refcount_records, refcount_blocks) = check_refcount_tree(&mut ctx, &by_block)?;
        let state = self
            .ags
            .get(ag.0 as usize)
            .ok_or(broken("no such AG".into()))?;
        let state = state.lock();
        state.busy.check_invariants().map_err(broken)?;
        for busy in state.busy.iter() {
            if !covered(&by_block, busy.start, busy.length) {
                return Err(broken(format!("busy range {busy:?} is not free")));
            }
        }
        Ok(AgSummary {
            extents: by_block.iter().map(|r| (r.start.0, r.length)).collect(),
            free_blocks: ctx.agf.free_blocks,
            longest_free: longest,
            free_list,
            tree_blocks,
            refcount_records,
            refcount_blocks,
        })
    }

    fn check_free_list(
        &self,
        free_list: &[u32],
        extents: &[FreeSpaceRecord],
        ag_length: u32,
    ) -> Result<(), String> {
        let distinct: BTreeSet<u32> = free_list.iter().copied().collect();
        if distinct.len() != free_list.len() {
            return Err("a block is on the free list twice".into());
        }
        for block in free_list {
            if *block < AG_HEADER_BLOCKS || *block >= ag_length {
                return Err(format!("free-list block {block} outside the AG"));
            }
            if covered(extents, *block, 1) {
                return Err(format!("free-list block {block} is also free space"));
            }
        }
        Ok(())
    }
}

/// The refcount tree verifies, its AGF block count matches, its records of each kind are
/// disjoint and merged, and none covers free space. Returns the records and blocks.
fn check_refcount_tree<'c, B: Buffers<'c>>(
    ctx: &mut AgCtx<'_, B>,
    free: &[FreeSpaceRecord],
) -> Result<(Vec<RefcountRecord>, u64), AllocError> {
    let ag = ctx.ag().0;
    let broken = |what: String| AllocError::Invariant { ag, what };
    let Some(tree) = crate::refcount::open_tree(ctx)? else {
        return Ok((Vec::new(), 0));
    };
    let report = tree.verify(ctx);
    if let Some(problem) = report.problems.first() {
        return Err(broken(format!("refcount tree problem: {problem}")));
    }
    if report.blocks != u64::from(ctx.agf.refcount_blocks) {
        let counted = ctx.agf.refcount_blocks;
        return Err(broken(format!(
            "{} refcount tree blocks, AGF counts {counted}",
            report.blocks
        )));
    }
    let records = tree.records(ctx)?;
    for pair in records.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        let same_kind = a.staging == b.staging;
        if same_kind && a.end() > u64::from(b.start.0) {
            return Err(broken(format!("refcount records {a:?} and {b:?} overlap")));
        }
        if same_kind && a.end() == u64::from(b.start.0) && a.refcount == b.refcount {
            return Err(broken(format!(
                "refcount records {a:?} and {b:?} not merged"
            )));
        }
    }
    for record in &records {
        let (start, end) = (u64::from(record.start.0), record.end());
        let index = free.partition_point(|r| u64::from(r.start.0) + u64::from(r.length) <= start);
        if free.get(index).is_some_and(|r| u64::from(r.start.0) < end) {
            return Err(broken(format!(
                "refcount record {record:?} covers free space"
            )));
        }
    }
    Ok((records, report.blocks))
}

fn check_disjoint(extents: &[FreeSpaceRecord]) -> Result<(), String> {
    for pair in extents.windows(2) {
        let end = u64::from(pair[0].start.0) + u64::from(pair[0].length);
        if end >= u64::from(pair[1].start.0) {
            return Err(format!(
                "extents {:?} and {:?} overlap or touch",
                pair[0], pair[1]
            ));
        }
    }
    Ok(())
}

/// Whether `start..start + length` lies inside one free extent.
fn covered(extents: &[FreeSpaceRecord], start: u32, length: u32) -> bool {
    let index = extents.partition_point(|r| r.start.0 <= start);
    index > 0 && {
        let r = extents[index - 1];
        u64::from(r.start.0) + u64::from(r.length) >= u64::from(start) + u64::from(length)
    }
}
