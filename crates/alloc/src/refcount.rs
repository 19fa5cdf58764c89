//! The refcount tree of each AG (reflink): how many file mappings share each shared block,
//! and which blocks are copy-on-write staging (`cairn_format::refcount`).
//!
//! A block no record names counts 1 if some file maps it (or 0 if it is free; the refcount
//! tree does not know which: the free-space trees do). Increasing a run adds one to each of
//! its blocks (1 becomes a record of 2); decreasing takes one away, and blocks whose count
//! reaches 0 are freed in the same call (they join free space, busy until the commit is
//! durable, as `Allocator::free` does). Staging runs are recorded when a copy-on-write
//! allocates them (`stage`) and dropped when the new blocks enter the file's map (`unstage`)
//! or are given back (`free_staged`).
//!
//! Every change rewrites the records around the range: those that overlap or touch it are
//! read, the counts recomputed run by run (`recount`), and the records replaced when they
//! differ, touching runs of equal count merged. The tree's blocks come from the AG free list
//! (counted in the AGF's `refcount_blocks`), topped up before each insert; the root is made
//! with the first record.
//!
//! Lock order: as `Allocator::free` (the AGF, then the AG's state mutex; AGFs ascend within
//! a transaction: a change below a held AG fails with `AgOrder` before changing anything).

use cairn_btree::{Btree, Buffers, Lookup, RefcountCodec, TreeContext, TreeError, TreeSpec};
use cairn_bufcache::BufGuard;
use cairn_format::log::RefcountOp;
use cairn_format::types::NULL_AG_BLOCK;
use cairn_format::{AgBlock, AgNumber, FsBlock, RefcountKey, RefcountRecord};
use cairn_lockrank::MutexGuard;

use crate::ag::{AgCtx, agf_block, field, tree_error};
use crate::allocator::{AgState, trim_free_list_to};
use crate::busy::LogSequence;
use crate::space::{AgSpace, free_list_need, refcount_insert_need};
use crate::{AllocError, Allocator};

/// The refcount tree's view of one AG for one operation: the AG context, whose free list
/// feeds the tree's splits.
struct RefcountCtx<'a, 'x, B> {
    ag: &'a mut AgCtx<'x, B>,
}

impl<'c, B: Buffers<'c>> Buffers<'c> for RefcountCtx<'_, '_, B> {
    fn buffer(
        &mut self,
        block: FsBlock,
        spec: &cairn_bufcache::ReadSpec,
        new: bool,
    ) -> Result<&mut BufGuard<'c>, TreeError> {
        self.ag.buffer(block, spec, new)
    }

    fn invalidate(
        &mut self,
        block: FsBlock,
        spec: &cairn_bufcache::ReadSpec,
    ) -> Result<(), TreeError> {
        self.ag.invalidate(block, spec)
    }

    fn holds(&mut self, block: FsBlock) -> bool {
        self.ag.holds(block)
    }
}

impl<'c, B: Buffers<'c>> TreeContext<'c> for RefcountCtx<'_, '_, B> {
    fn allocate_block(&mut self) -> Result<FsBlock, TreeError> {
        let ag = self.ag.ag().0;
        let block = self
            .ag
            .pop_free_list()
            .map_err(tree_error)?
            .ok_or_else(|| TreeError::NoSpace {
                why: format!("AG {ag} free list is empty"),
            })?;
        self.ag.counters.tree_blocks_taken += 1;
        let used = self.ag.agf.refcount_blocks + 1;
        self.ag
            .set_field(field::REFCOUNT_BLOCKS, used)
            .map_err(tree_error)?;
        Ok(self.ag.fs_block(block))
    }

    fn free_block(&mut self, block: FsBlock) -> Result<(), TreeError> {
        let ag_block = self.ag.geometry.ag_block_of(block).0;
        self.ag.push_free_list(ag_block).map_err(tree_error)?;
        self.ag.counters.tree_blocks_freed += 1;
        let used = self.ag.agf.refcount_blocks.saturating_sub(1);
        self.ag
            .set_field(field::REFCOUNT_BLOCKS, used)
            .map_err(tree_error)
    }
}

/// Runs of AG blocks a refcount decrease took from 2 to 1, with the sequence of the commit
/// that did (kept until that commit is durable). Runs may overlap (the same blocks shared
/// and unshared again); they are few (one checkpoint's worth), so lookups scan them.
#[derive(Debug, Default)]
pub(crate) struct RecentlyUnshared {
    runs: Vec<(u32, u32, u64)>,
}

/// Runs kept before overlapping ones are merged.
const UNSHARED_RUNS_COMPACT: usize = 1024;

impl RecentlyUnshared {
    pub(crate) fn insert(&mut self, start: u32, length: u32, sequence: u64) {
        self.runs.push((start, start + length, sequence));
        if self.runs.len() > UNSHARED_RUNS_COMPACT {
            self.compact();
        }
    }

    /// Drops the runs whose decrease is durable.
    pub(crate) fn clear_durable(&mut self, durable: u64) {
        self.runs.retain(|run| run.2 > durable);
    }

    /// The parts of `start..end` some run covers, in order, merged.
    pub(crate) fn covered(&self, start: u32, end: u32) -> Vec<(u32, u32)> {
        let mut parts: Vec<(u32, u32)> = self
            .runs
            .iter()
            .filter(|run| run.0 < end && run.1 > start)
            .map(|run| (run.0.max(start), run.1.min(end)))
            .collect();
        parts.sort_unstable();
        let mut merged: Vec<(u32, u32)> = Vec::with_capacity(parts.len());
        for (from, to) in parts {
            match merged.last_mut() {
                Some(last) if from <= last.1 => last.1 = last.1.max(to),
                _ => merged.push((from, to)),
            }
        }
        merged
    }

    /// Merges overlapping and touching runs, keeping the newest sequence of each.
    fn compact(&mut self) {
        self.runs.sort_unstable();
        let mut merged: Vec<(u32, u32, u64)> = Vec::with_capacity(self.runs.len());
        for run in self.runs.drain(..) {
            match merged.last_mut() {
                Some(last) if run.0 <= last.1 => {
                    last.1 = last.1.max(run.1);
                    last.2 = last.2.max(run.2);
                }
                _ => merged.push(run),
            }
        }
        self.runs = merged;
    }
}

/// A run of AG blocks `start..end` whose blocks each count `count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Run {
    start: u32,
    end: u32,
    count: u32,
}

/// What a change does to each block's count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Change {
    /// Shared records: add this to every block's count (implied 1 where no record is).
    Shared(i64),
    /// Staging records: record (`true`) or drop (`false`) every block.
    Staging(bool),
}

impl Change {
    fn staging(self) -> bool {
        matches!(self, Self::Staging(_))
    }

    /// A block's count where no record names it.
    fn implied(self) -> u32 {
        match self {
            Self::Shared(_) => 1,
            Self::Staging(_) => 0,
        }
    }

    fn delta(self) -> i64 {
        match self {
            Self::Shared(delta) => delta,
            Self::Staging(true) => 1,
            Self::Staging(false) => -1,
        }
    }

    /// Whether a run of this count is recorded.
    fn recorded(self, count: u32) -> bool {
        match self {
            Self::Shared(_) => count >= 2,
            Self::Staging(_) => count == 1,
        }
    }
}

/// What `recount` gives: the new records, the runs `(AG block, length)` that reached 0, and
/// those that went from 2 to 1 (shared no more).
type Recounted = (Vec<RefcountRecord>, Vec<(u32, u32)>, Vec<(u32, u32)>);

/// The records that replace `old` (the records of the change's kind that overlap or touch
/// `start..end`, in order) once every block of `start..end` has its count changed, and the
/// runs of that range whose count reached 0. Touching runs of equal count are merged. Fails
/// on a count that would go below 0 or a block staged twice.
fn recount(
    old: &[RefcountRecord],
    start: u32,
    end: u32,
    change: Change,
) -> Result<Recounted, String> {
    let mut bounds = vec![start, end];
    for record in old {
        bounds.push(record.start.0);
        bounds.push(record.end() as u32);
    }
    bounds.sort_unstable();
    bounds.dedup();
    let mut runs: Vec<Run> = Vec::new();
    let mut zeroed: Vec<(u32, u32)> = Vec::new();
    let mut unshared: Vec<(u32, u32)> = Vec::new();
    for pair in bounds.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        let covering = old
            .iter()
            .find(|r| r.start.0 <= a && r.end() >= u64::from(b));
        let inside = a >= start && b <= end;
        let count = match (covering, inside) {
            (Some(record), false) => i64::from(record.refcount),
            (None, false) => continue,
            (covering, true) => {
                let before = covering.map_or(change.implied(), |r| r.refcount);
                i64::from(before) + change.delta()
            }
        };
        if count < 0 {
            return Err(format!("blocks {a}..{b}: a count below zero"));
        }
        if change.staging() && count > 1 {
            return Err(format!("blocks {a}..{b}: staged twice"));
        }
        let count = count as u32;
        if count == 0 {
            push_range(&mut zeroed, (a, b));
        }
        if inside && count == 1 && !change.staging() && covering.is_some() {
            push_range(&mut unshared, (a, b));
        }
        if !change.recorded(count) {
            continue;
        }
        match runs.last_mut() {
            Some(last) if last.end == a && last.count == count => last.end = b,
            _ => runs.push(Run {
                start: a,
                end: b,
                count,
            }),
        }
    }
    let staging = change.staging();
    let records = runs
        .into_iter()
        .map(|run| RefcountRecord {
            start: AgBlock(run.start),
            length: run.end - run.start,
            refcount: run.count,
            staging,
        })
        .collect();
    Ok((records, zeroed, unshared))
}

/// Appends AG blocks `a..b` to `ranges` (`(start, length)`, in order), merged with the last.
fn push_range(ranges: &mut Vec<(u32, u32)>, (a, b): (u32, u32)) {
    match ranges.last_mut() {
        Some(last) if last.0 + last.1 == a => last.1 += b - a,
        _ => ranges.push((a, b - a)),
    }
}

/// Where to end a change of `start..end` that may rewrite at most `records_max` (>= 1) of
/// the records `old` (those around the range, in order) that overlap it: at the start of
/// the first record past that many, which lies past `start`.
fn cut_after(old: &[RefcountRecord], (start, end): (u32, u32), records_max: usize) -> u32 {
    let mut overlapping = old
        .iter()
        .filter(|r| r.end() > u64::from(start) && r.start.0 < end);
    match overlapping.nth(records_max) {
        Some(first_left_out) => first_left_out.start.0.max(start + 1),
        None => end,
    }
}

/// The AG's refcount tree, `None` while it has none.
pub(crate) fn open_tree<B>(ctx: &AgCtx<'_, B>) -> Result<Option<Btree<RefcountCodec>>, AllocError> {
    if !ctx.agf.has_refcount_tree() {
        return Ok(None);
    }
    let spec = TreeSpec::ag::<RefcountCodec>(&ctx.geometry, ctx.uuid, ctx.agf.ag_number.0)?;
    let root = u64::from(ctx.agf.refcount_root.0);
    Ok(Some(Btree::open(spec, root, ctx.agf.refcount_levels)?))
}

/// The records of `staging`'s kind that overlap or touch AG blocks `start..end`, in order.
fn records_around<'c, B: Buffers<'c>>(
    ctx: &mut AgCtx<'_, B>,
    tree: &Btree<RefcountCodec>,
    staging: bool,
    (start, end): (u32, u32),
) -> Result<Vec<RefcountRecord>, AllocError> {
    // From the last record starting before the range: it may end where the range starts.
    let key = RefcountKey {
        staging,
        start: AgBlock(start.saturating_sub(1)),
    };
    let mut cursor = match tree.lookup(ctx, &key, Lookup::Le)? {
        Some(cursor) => cursor,
        None => match tree.first(ctx)? {
            Some(cursor) => cursor,
            None => return Ok(Vec::new()),
        },
    };
    let mut found = Vec::new();
    loop {
        let record = tree.record(ctx, &cursor)?;
        let past = (record.staging, record.start.0) > (staging, end);
        if past {
            break;
        }
        if record.staging == staging && record.end() >= u64::from(start) {
            found.push(record);
        }
        if !tree.next(ctx, &mut cursor)? {
            break;
        }
    }
    Ok(found)
}

/// Everything one refcount change holds: the AG context, its free-space trees and state.
struct Held<'s, 'a, 'x, B> {
    ctx: &'a mut AgCtx<'x, B>,
    space: AgSpace,
    state: MutexGuard<'s, AgState>,
}

impl Allocator {
    /// Applies `op` to the blocks `start..start + length` (one AG) for the transaction that
    /// will commit with `sequence`: `Increase` adds a file mapping to each block, `Decrease`
    /// takes one away and frees the blocks no mapping is left on, `Unstage` drops the
    /// staging record of blocks a copy-on-write just put in a file's map. Rewrites at most
    /// `records_max` of the records the range overlaps (at least one), so the buffers a call
    /// dirties are bounded; returns how many blocks from `start` it did (all of them unless
    /// that limit cut the range: the caller goes on from there, maybe in a new transaction).
    pub fn change_references<'c, B: Buffers<'c>>(
        &self,
        bufs: &mut B,
        log: &dyn LogSequence,
        (start, length): (FsBlock, u32),
        op: RefcountOp,
        (sequence, records_max): (u64, usize),
    ) -> Result<u32, AllocError> {
        let change = match op {
            RefcountOp::Increase => Change::Shared(1),
            RefcountOp::Decrease => Change::Shared(-1),
            RefcountOp::Unstage => Change::Staging(false),
        };
        let (done, _) =
            self.rewrite(bufs, log, (start, length), change, (sequence, records_max))?;
        Ok(done)
    }

    /// Records the blocks `start..start + length`, just allocated by this transaction for a
    /// copy-on-write, as staging: mount frees them if a crash comes before they enter a
    /// file's map.
    pub fn stage<'c, B: Buffers<'c>>(
        &self,
        bufs: &mut B,
        log: &dyn LogSequence,
        (start, length): (FsBlock, u32),
        sequence: u64,
    ) -> Result<(), AllocError> {
        // New blocks overlap no staging record: the one call rewrites only neighbours.
        let change = Change::Staging(true);
        let (done, _) = self.rewrite(bufs, log, (start, length), change, (sequence, 4))?;
        debug_assert_eq!(done, length);
        Ok(())
    }

    /// Drops the staging record of `start..start + length` and frees the blocks (a
    /// copy-on-write that failed, or leftovers of a crash found at mount).
    pub fn free_staged<'c, B: Buffers<'c>>(
        &self,
        bufs: &mut B,
        log: &dyn LogSequence,
        (start, length): (FsBlock, u32),
        sequence: u64,
    ) -> Result<(), AllocError> {
        let mut done = 0;
        while done < length {
            let at = FsBlock(start.0 + u64::from(done));
            let range = (at, length - done);
            done += self
                .rewrite(bufs, log, range, Change::Staging(false), (0, 4))?
                .0;
        }
        self.free(bufs, log, start, length, sequence)
    }

    /// The runs of `start..start + length` (one AG) that more than one file maps, as
    /// `(first block, length, count)`, and those a decrease left to one file in a commit not
    /// yet durable (count 1: a crash may bring the other file back, so a write must still
    /// copy them). Reads through `bufs`, holding the AGF meanwhile.
    pub fn shared_runs<'c, B: Buffers<'c>>(
        &self,
        bufs: &mut B,
        log: &dyn LogSequence,
        (start, length): (FsBlock, u32),
    ) -> Result<Vec<(FsBlock, u32, u32)>, AllocError> {
        let ag = self.geometry.ag_of(start);
        let first = self.geometry.ag_block_of(start).0;
        let end = first.saturating_add(length);
        let mut ctx = AgCtx::open(bufs, &self.geometry, self.uuid, ag)?;
        let mut runs: Vec<(u32, u32, u32)> = match open_tree(&ctx)? {
            Some(tree) => records_around(&mut ctx, &tree, false, (first, end))?
                .iter()
                .filter_map(|r| {
                    let from = r.start.0.max(first);
                    let to = (r.end() as u32).min(end);
                    (from < to).then_some((from, to - from, r.refcount))
                })
                .collect(),
            None => Vec::new(),
        };
        if let Some(state) = self.ags.get(ag.0 as usize) {
            let mut state = state.lock();
            state.unshared.clear_durable(log.durable_sequence());
            // Blocks counted 2 or more again since are in `runs` already.
            let mut counted: Vec<(u32, u32)> = runs.iter().map(|r| (r.0, r.0 + r.1)).collect();
            counted.sort_unstable();
            for (from, to) in state.unshared.covered(first, end) {
                let mut at = from;
                for &(start, stop) in counted.iter().filter(|c| c.1 > from && c.0 < to) {
                    if start > at {
                        runs.push((at, start - at, 1));
                    }
                    at = at.max(stop);
                }
                if to > at {
                    runs.push((at, to - at, 1));
                }
            }
        }
        runs.sort_unstable();
        Ok(runs
            .into_iter()
            .map(|(at, count, refcount)| (ctx.fs_block(at), count, refcount))
            .collect())
    }

    /// Every record of AG `ag`'s refcount tree, in key order (shared, then staging).
    pub fn refcount_records<'c, B: Buffers<'c>>(
        &self,
        bufs: &mut B,
        ag: AgNumber,
    ) -> Result<Vec<RefcountRecord>, AllocError> {
        let mut ctx = AgCtx::open(bufs, &self.geometry, self.uuid, ag)?;
        match open_tree(&ctx)? {
            Some(tree) => Ok(tree.records(&mut ctx)?),
            None => Ok(Vec::new()),
        }
    }

    /// The staging runs of AG `ag` (what a crash left, at mount), as `(first block, length)`.
    pub fn staged_runs<'c, B: Buffers<'c>>(
        &self,
        bufs: &mut B,
        ag: AgNumber,
    ) -> Result<Vec<(FsBlock, u32)>, AllocError> {
        let start = self.geometry.ag_start(ag.0);
        Ok(self
            .refcount_records(bufs, ag)?
            .into_iter()
            .filter(|r| r.staging)
            .map(|r| (FsBlock(start + u64::from(r.start.0)), r.length))
            .collect())
    }

    /// Changes the counts of `start..start + length` (cut short after `records_max` of the
    /// records it overlaps); returns the blocks done and the runs that reached 0 (freed
    /// here for shared blocks, left to the caller for staging ones).
    fn rewrite<'c, B: Buffers<'c>>(
        &self,
        bufs: &mut B,
        log: &dyn LogSequence,
        (start, length): (FsBlock, u32),
        change: Change,
        (sequence, records_max): (u64, usize),
    ) -> Result<(u32, Vec<(u32, u32)>), AllocError> {
        let ag = self.geometry.ag_of(start);
        let first = self.geometry.ag_block_of(start).0;
        let bad = |why| AllocError::BadFree {
            ag: ag.0,
            start: first,
            length,
            why,
        };
        let end = u64::from(first) + u64::from(length);
        if length == 0 || end > u64::from(self.geometry.ag_len(ag.0)) {
            return Err(bad("refcount change empty or past the AG's end"));
        }
        let state = self.ags.get(ag.0 as usize).ok_or(bad("no such AG"))?;
        let held = self.floor(bufs, ag);
        if held > ag.0 && !bufs.holds(agf_block(&self.geometry, ag)) {
            return Err(AllocError::AgOrder { ag: ag.0, held });
        }
        let mut ctx = AgCtx::open(bufs, &self.geometry, self.uuid, ag)?;
        let state = state.lock();
        let space = AgSpace::open(&ctx)?;
        let mut held = Held {
            ctx: &mut ctx,
            space,
            state,
        };
        let range = (first, end as u32);
        let list_before = held.ctx.agf.free_list_count;
        let limits = (sequence, records_max);
        let (done_end, zeroed) = self.rewrite_in(&mut held, log, range, change, limits)?;
        if let Change::Shared(_) = change {
            for &(at, blocks) in &zeroed {
                held.space.add(held.ctx, at, blocks)?;
                held.state.busy.insert(at, blocks, sequence, self.discard);
            }
        }
        // What a refill for the refcount tree took beyond the free list's own need goes
        // back: a change leaves the list no longer than it found it (so a share undone
        // leaves free space as it was).
        let need = free_list_need(held.space.bno.levels(), held.space.cnt.levels());
        let freed = (sequence, self.discard);
        let high = list_before.max(need);
        trim_free_list_to(held.ctx, &mut held.space, &mut held.state.busy, freed, high)?;
        self.note_hints(ag.0, &held.ctx.agf);
        Ok((done_end - first, zeroed))
    }

    /// `rewrite` once the AG is locked: reads the records around the range, cuts the range
    /// after `records_max` overlapping records, recounts, and replaces the records if they
    /// changed. Returns where the range now ends and the runs that reached 0.
    fn rewrite_in<'c, B: Buffers<'c>>(
        &self,
        held: &mut Held<'_, '_, '_, B>,
        log: &dyn LogSequence,
        (start, end): (u32, u32),
        change: Change,
        (sequence, records_max): (u64, usize),
    ) -> Result<(u32, Vec<(u32, u32)>), AllocError> {
        let block = held.ctx.fs_block(start).0;
        let mut old = match open_tree(held.ctx)? {
            Some(tree) => records_around(held.ctx, &tree, change.staging(), (start, end))?,
            None => Vec::new(),
        };
        let end = cut_after(&old, (start, end), records_max.max(1));
        old.retain(|r| r.start.0 <= end);
        let (new, zeroed, unshared) = recount(&old, start, end, change)
            .map_err(|why| AllocError::corrupt(block, format!("refcount tree: {why}")))?;
        for &(at, length) in &unshared {
            held.state.unshared.insert(at, length, sequence);
        }
        if new == old {
            return Ok((end, zeroed));
        }
        let mut tree = self.tree_for_insert(held, log)?;
        for record in &old {
            let mut rctx = RefcountCtx { ag: held.ctx };
            tree.delete(&mut rctx, &record.key())?;
        }
        for record in &new {
            self.fill_free_list(
                held.ctx,
                &mut held.space,
                &mut held.state,
                log,
                refcount_insert_need(tree.levels()),
            )?;
            let mut rctx = RefcountCtx { ag: held.ctx };
            tree.insert(&mut rctx, record)?;
        }
        if new.is_empty() && tree.levels() == 1 && tree.first(held.ctx)?.is_none() {
            // The last record went: the root goes back to the free list, and the AG has no
            // tree again (as before its first shared block).
            let mut rctx = RefcountCtx { ag: held.ctx };
            let root = tree.spec().fs_block(tree.root());
            rctx.invalidate(root, &tree.spec().read_spec)?;
            rctx.free_block(root)?;
            held.ctx.set_field(field::REFCOUNT_ROOT, 0)?;
            held.ctx.set_field(field::REFCOUNT_LEVELS, 0)?;
            return Ok((end, zeroed));
        }
        let narrow = |v: u64| u32::try_from(v).unwrap_or(NULL_AG_BLOCK);
        held.ctx
            .set_field(field::REFCOUNT_ROOT, narrow(tree.root()))?;
        held.ctx.set_field(field::REFCOUNT_LEVELS, tree.levels())?;
        Ok((end, zeroed))
    }

    /// The AG's refcount tree, its root made now (from the free list) if it has none.
    fn tree_for_insert<'c, B: Buffers<'c>>(
        &self,
        held: &mut Held<'_, '_, '_, B>,
        log: &dyn LogSequence,
    ) -> Result<Btree<RefcountCodec>, AllocError> {
        if let Some(tree) = open_tree(held.ctx)? {
            return Ok(tree);
        }
        let need = refcount_insert_need(0);
        self.fill_free_list(held.ctx, &mut held.space, &mut held.state, log, need)?;
        let mut rctx = RefcountCtx { ag: held.ctx };
        let root = rctx.allocate_block()?;
        let spec = TreeSpec::ag::<RefcountCodec>(&rctx.ag.geometry, rctx.ag.uuid, rctx.ag.ag().0)?;
        let pointer = spec.pointer_of(root);
        let tree = Btree::create(&mut rctx, spec, pointer)?;
        let narrow = |v: u64| u32::try_from(v).unwrap_or(NULL_AG_BLOCK);
        held.ctx
            .set_field(field::REFCOUNT_ROOT, narrow(tree.root()))?;
        held.ctx.set_field(field::REFCOUNT_LEVELS, tree.levels())?;
        Ok(tree)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(start: u32, length: u32, refcount: u32) -> RefcountRecord {
        RefcountRecord {
            start: AgBlock(start),
            length,
            refcount,
            staging: false,
        }
    }

    // Checks the run arithmetic: an increase over a gap and part of a record splits it and
    // records the gap; a decrease back merges; blocks counted 1 reach 0 on a decrease.
    #[test]
    fn recount_splits_merges_and_zeroes() {
        let old = [record(10, 10, 2)];
        let (new, zeroed, _) = recount(&old, 15, 25, Change::Shared(1)).unwrap();
        assert_eq!(
            new,
            vec![record(10, 5, 2), record(15, 5, 3), record(20, 5, 2)]
        );
        assert!(zeroed.is_empty());
        let (back, _, unshared) = recount(&new, 15, 25, Change::Shared(-1)).unwrap();
        assert_eq!(back, vec![record(10, 10, 2)]);
        assert_eq!(unshared, vec![(20, 5)]);
        let (gone, zeroed, unshared) = recount(&back, 5, 15, Change::Shared(-1)).unwrap();
        assert_eq!(gone, vec![record(15, 5, 2)]);
        assert_eq!(zeroed, vec![(5, 5)]);
        assert_eq!(unshared, vec![(10, 5)]);
        let touching = [record(0, 5, 2), record(10, 5, 2)];
        let (merged, _, _) = recount(&touching, 5, 10, Change::Shared(1)).unwrap();
        assert_eq!(merged, vec![record(0, 15, 2)]);
    }

    // Checks staging: a run is recorded once, unstaging drops it (the range reaches 0), and
    // staging a staged block or unstaging an unstaged one is refused.
    #[test]
    fn recount_staging() {
        let (staged, zeroed, _) = recount(&[], 40, 48, Change::Staging(true)).unwrap();
        assert_eq!(staged.len(), 1);
        assert!(staged[0].staging && staged[0].refcount == 1);
        assert!(zeroed.is_empty());
        let (left, zeroed, _) = recount(&staged, 44, 48, Change::Staging(false)).unwrap();
        assert_eq!(left.len(), 1);
        assert_eq!((left[0].start.0, left[0].length), (40, 4));
        assert_eq!(zeroed, vec![(44, 4)]);
        assert!(recount(&staged, 46, 50, Change::Staging(true)).is_err());
        assert!(recount(&left, 44, 46, Change::Staging(false)).is_err());
    }
}
