//! The two free-space trees of one AG, kept describing the same extents, with the AGF's free
//! count and longest free extent kept exact.

use cairn_btree::{BnoCodec, Btree, Buffers, CntCodec, Lookup};
use cairn_format::{AgBlock, BnoKey, CntKey, FreeSpaceRecord};

use crate::AllocError;
use crate::ag::{AgCtx, field};

/// Free-list blocks kept in reserve for each tree level: one split per level plus a new root,
/// for each of the two trees, for an allocation or free that touches two records per tree.
pub(crate) fn free_list_need(bno_levels: u32, cnt_levels: u32) -> u32 {
    2 * (bno_levels.max(cnt_levels) + 1) + 2
}

/// Free-list blocks one insert into a refcount tree of `levels` levels may take: a split
/// at every level and a new root (a tree not made yet needs its root block).
pub(crate) fn refcount_insert_need(levels: u32) -> u32 {
    levels + 2
}

/// The free-space trees of one AG for one operation.
#[derive(Debug)]
pub(crate) struct AgSpace {
    pub bno: Btree<BnoCodec>,
    pub cnt: Btree<CntCodec>,
}

pub(crate) fn record(start: u32, length: u32) -> FreeSpaceRecord {
    FreeSpaceRecord {
        start: AgBlock(start),
        length,
    }
}

pub(crate) fn cnt_key(r: &FreeSpaceRecord) -> CntKey {
    CntKey {
        length: r.length,
        start: r.start,
    }
}

fn end_of(r: &FreeSpaceRecord) -> u64 {
    u64::from(r.start.0) + u64::from(r.length)
}

impl AgSpace {
    pub fn open<'c, B: Buffers<'c>>(ctx: &AgCtx<'_, B>) -> Result<AgSpace, AllocError> {
        let (bno, cnt) = ctx.trees()?;
        Ok(AgSpace { bno, cnt })
    }

    /// Copies roots and heights back and refreshes `longest_free` from the by-length tree.
    fn finish<'c, B: Buffers<'c>>(
        &self,
        ctx: &mut AgCtx<'_, B>,
        free_delta: i64,
    ) -> Result<(), AllocError> {
        ctx.store_roots(&self.bno, &self.cnt)?;
        let free = i64::from(ctx.agf.free_blocks) + free_delta;
        let free = u32::try_from(free).map_err(|_| AllocError::Invariant {
            ag: ctx.ag().0,
            what: format!("free block count would become {free}"),
        })?;
        ctx.set_field(field::FREE_BLOCKS, free)?;
        let longest = match self.cnt.last(ctx)? {
            Some(cursor) => self.cnt.record(ctx, &cursor)?.length,
            None => 0,
        };
        ctx.set_field(field::LONGEST_FREE, longest)
    }

    /// Removes `start..start + length` from the free extent `found` (which contains it):
    /// both trees lose `found` and gain what is left on either side.
    pub fn carve<'c, B: Buffers<'c>>(
        &mut self,
        ctx: &mut AgCtx<'_, B>,
        found: FreeSpaceRecord,
        start: u32,
        length: u32,
    ) -> Result<(), AllocError> {
        let end = u64::from(start) + u64::from(length);
        if start < found.start.0 || end > end_of(&found) || length == 0 {
            return Err(AllocError::Invariant {
                ag: ctx.ag().0,
                what: format!("carving {start}+{length} out of {found:?}"),
            });
        }
        let left = (start > found.start.0).then(|| record(found.start.0, start - found.start.0));
        let right =
            (end < end_of(&found)).then(|| record(end as u32, (end_of(&found) - end) as u32));
        self.cnt.delete(ctx, &cnt_key(&found))?;
        let bno_key = BnoKey { start: found.start };
        match (left, right) {
            (Some(l), right) => {
                self.bno.update(ctx, &bno_key, &l)?;
                if let Some(r) = right {
                    self.bno.insert(ctx, &r)?;
                }
            }
            (None, Some(r)) => self.bno.update(ctx, &bno_key, &r)?,
            (None, None) => {
                self.bno.delete(ctx, &bno_key)?;
            }
        }
        for piece in [left, right].into_iter().flatten() {
            self.cnt.insert(ctx, &piece)?;
        }
        self.finish(ctx, -i64::from(length))
    }

    /// Adds `start..start + length` to free space, merging with free neighbours. Fails if any
    /// block of it is already free.
    pub fn add<'c, B: Buffers<'c>>(
        &mut self,
        ctx: &mut AgCtx<'_, B>,
        start: u32,
        length: u32,
    ) -> Result<(), AllocError> {
        let end = u64::from(start) + u64::from(length);
        let ag = ctx.agf.ag_number.0;
        let bad = |why| AllocError::BadFree {
            ag,
            start,
            length,
            why,
        };
        let key = BnoKey {
            start: AgBlock(start),
        };
        let left = match self.bno.lookup(ctx, &key, Lookup::Le)? {
            Some(cursor) => Some(self.bno.record(ctx, &cursor)?),
            None => None,
        };
        let right = match self.bno.lookup(ctx, &key, Lookup::Ge)? {
            Some(cursor) => Some(self.bno.record(ctx, &cursor)?),
            None => None,
        };
        if left.is_some_and(|l| end_of(&l) > u64::from(start)) {
            return Err(bad("overlaps a free extent on the left"));
        }
        if right.is_some_and(|r| u64::from(r.start.0) < end) {
            return Err(bad("overlaps a free extent on the right"));
        }
        let left = left.filter(|l| end_of(l) == u64::from(start));
        let right = right.filter(|r| u64::from(r.start.0) == end);
        let merged_start = left.map_or(start, |l| l.start.0);
        let merged_end = right.map_or(end, |r| end_of(&r));
        let merged = record(merged_start, (merged_end - u64::from(merged_start)) as u32);
        for neighbour in [left, right].into_iter().flatten() {
            self.cnt.delete(ctx, &cnt_key(&neighbour))?;
        }
        match (left, right) {
            (Some(l), right) => {
                if let Some(r) = right {
                    self.bno.delete(ctx, &BnoKey { start: r.start })?;
                }
                self.bno.update(ctx, &BnoKey { start: l.start }, &merged)?;
            }
            (None, Some(r)) => self.bno.update(ctx, &BnoKey { start: r.start }, &merged)?,
            (None, None) => self.bno.insert(ctx, &merged)?,
        }
        self.cnt.insert(ctx, &merged)?;
        self.finish(ctx, i64::from(length))
    }
}
