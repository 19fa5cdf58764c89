//! The allocation modes inside one AG: near (combined by-length and by-block search, with
//! the last-leaf scan for AGs with few free extents), by-size, exact, and apart.

use cairn_btree::{Buffers, Cursor, Lookup};
use cairn_format::{AgBlock, BnoKey, CntKey, FreeSpaceRecord};

use crate::AllocError;
use crate::ag::AgCtx;
use crate::busy::BusyExtents;
use crate::request::{Placement, Request, place};
use crate::space::AgSpace;

/// Most search rounds in near mode (one by-block step each way and one by-length probe per
/// round). The bound on the worst case: past it the best candidate found so far is taken.
pub const NEAR_ROUNDS_MAX: u32 = 1024;
/// Most records the by-size mode looks at past the first fit.
pub const SIZE_STEPS_MAX: u32 = 1024;

/// A free extent and where the request would land in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Candidate {
    pub record: FreeSpaceRecord,
    pub place: Placement,
}

/// The running state of one search.
pub(crate) struct Search<'a> {
    pub request: Request,
    /// The length to aim for: `max_len` capped by the longest free extent and `min_left`.
    pub wanted: u32,
    pub target: u32,
    pub busy: &'a BusyExtents,
    pub best: Option<Candidate>,
    pub records_visited: u64,
    pub busy_visited: u64,
    /// Near mode: rounds run, and whether `NEAR_ROUNDS_MAX` ended the search.
    pub rounds: u64,
    pub round_cap_reached: bool,
    /// Near mode: distance of the nearest usable placement a by-block step found, and
    /// whether the by-length probes have finished (see `could_win`).
    pub walk_hit: Option<u64>,
    pub probes_done: bool,
    /// Highest sequence of a busy range that cost a candidate blocks.
    pub busy_sequence: Option<u64>,
}

impl<'a> Search<'a> {
    pub fn new(request: Request, wanted: u32, target: u32, busy: &'a BusyExtents) -> Self {
        Self {
            request,
            wanted,
            target,
            busy,
            best: None,
            records_visited: 0,
            busy_visited: 0,
            rounds: 0,
            round_cap_reached: false,
            walk_hit: None,
            probes_done: false,
            busy_sequence: None,
        }
    }

    fn full(&self) -> bool {
        self.best.is_some_and(|b| b.place.length >= self.wanted)
    }

    fn exact_hit(&self) -> bool {
        self.full() && self.best.is_some_and(|b| b.place.distance == 0)
    }

    /// Evaluates one free extent: trims busy ranges, places the request, keeps the best.
    /// Returns the placement the extent offers, if any, whether or not it won.
    pub fn consider(&mut self, record: FreeSpaceRecord) -> Option<Placement> {
        self.records_visited += 1;
        if record.length < self.request.min_len {
            return None;
        }
        let usable = self.usable(record);
        let place = place(&self.request, self.wanted, self.target, usable?)?;
        if place.beats(&self.best.map(|b| b.place)) {
            self.best = Some(Candidate { record, place });
        }
        Some(place)
    }

    /// The longest piece of `record` no busy range covers, as `(start, length)`; notes the
    /// sequence a log force must reach when busy ranges cost it blocks.
    fn usable(&mut self, record: FreeSpaceRecord) -> Option<(u32, u32)> {
        let usable = if self.busy.is_empty() {
            Some((record.start.0, record.length))
        } else {
            self.busy
                .trim(record.start.0, record.length, &mut self.busy_visited)
        };
        if usable.is_none_or(|(_, l)| l < record.length) {
            let sequence = self.busy.sequence_over(record.start.0, record.length);
            self.busy_sequence = self.busy_sequence.max(sequence);
        }
        usable
    }

    /// Whether a by-block side whose next record is `distance` from the target goes on. With
    /// a full-length candidate, only a nearer record can win. Without one, anything longer
    /// could, however far; once the by-length probes are done (they look for the longer
    /// extents, nearest first for each length) the walks stop past the nearest placement
    /// either side found, as in the upstream rework's final one-sided walk. Without this the
    /// walks went on to `NEAR_ROUNDS_MAX` whenever alignment or busy ranges left only shorter
    /// candidates.
    fn could_win(&self, distance: u64) -> bool {
        match self.best {
            Some(best) if self.full() => distance < best.place.distance,
            _ => !self.probes_done || self.walk_hit.is_none_or(|hit| distance <= hit),
        }
    }

    /// A by-block step's look at `record`: considered, and its placement bounds both walks.
    fn walk_consider(&mut self, record: FreeSpaceRecord) {
        if let Some(place) = self.consider(record) {
            self.walk_hit = Some(
                self.walk_hit
                    .map_or(place.distance, |d| d.min(place.distance)),
            );
        }
    }
}

fn cnt_key(length: u32, start: u32) -> CntKey {
    CntKey {
        length,
        start: AgBlock(start),
    }
}

/// Near mode. When the extents long enough all sit in the by-length tree's last leaf, that
/// leaf is scanned. Otherwise by-block cursors walk left and right from the target while
/// by-length lookups at (length, target) look for nearby extents of each length, the length
/// doubling once a candidate is known; they stop past the longest extent. A by-block side
/// stops at a full-length candidate's distance, or, when only shorter candidates exist and
/// the probes are done, past the nearest placement either side found: once one side finds
/// space, what is left is a one-sided walk bounded by that distance. `NEAR_ROUNDS_MAX` is a
/// safety net these bounds keep the search well inside.
pub(crate) fn near<'c, B: Buffers<'c>>(
    ctx: &mut AgCtx<'_, B>,
    space: &AgSpace,
    search: &mut Search<'_>,
) -> Result<(), AllocError> {
    let first_fit = space
        .cnt
        .lookup(ctx, &cnt_key(search.wanted, 0), Lookup::Ge)?;
    if let Some(cursor) = first_fit
        && cursor.in_last_leaf()
    {
        return scan_leaf(ctx, space, search, cursor);
    }
    let (mut left, mut right) = walk_start(ctx, space, search.target)?;
    let mut length_key = Some(search.wanted);
    for _round in 0..NEAR_ROUNDS_MAX {
        search.rounds += 1;
        left = step_left(ctx, space, search, left)?;
        right = step_right(ctx, space, search, right)?;
        length_key = probe_length(ctx, space, search, length_key)?;
        search.probes_done = length_key.is_none();
        // With both walks over and a full-length candidate in hand, the walks have seen every
        // extent nearer than it, so no probe can find better: each would only touch one more
        // by-length leaf (a cache miss on a large AG).
        let walks_over = left.is_none() && right.is_none();
        if search.exact_hit() || (walks_over && (search.probes_done || search.full())) {
            return Ok(());
        }
    }
    search.round_cap_reached = true;
    Ok(())
}

/// By-block cursors on the last extent starting at or before `target` and the first one
/// after it.
fn walk_start<'c, B: Buffers<'c>>(
    ctx: &mut AgCtx<'_, B>,
    space: &AgSpace,
    target: u32,
) -> Result<(Option<Cursor>, Option<Cursor>), AllocError> {
    let target_key = BnoKey {
        start: AgBlock(target),
    };
    let left = space.bno.lookup(ctx, &target_key, Lookup::Le)?;
    let mut right = space.bno.lookup(ctx, &target_key, Lookup::Ge)?;
    if left.is_some() && left == right {
        right = match left.clone() {
            Some(mut c) => space.bno.next(ctx, &mut c)?.then_some(c),
            None => None,
        };
    }
    Ok((left, right))
}

fn scan_leaf<'c, B: Buffers<'c>>(
    ctx: &mut AgCtx<'_, B>,
    space: &AgSpace,
    search: &mut Search<'_>,
    mut cursor: Cursor,
) -> Result<(), AllocError> {
    loop {
        search.consider(space.cnt.record(ctx, &cursor)?);
        if cursor.leaf_records_after() == 0 || !space.cnt.next(ctx, &mut cursor)? {
            return Ok(());
        }
    }
}

/// Looks at the by-block record under `cursor` (left of the target) and moves left; `None`
/// once nothing further left can win.
fn step_left<'c, B: Buffers<'c>>(
    ctx: &mut AgCtx<'_, B>,
    space: &AgSpace,
    search: &mut Search<'_>,
    cursor: Option<Cursor>,
) -> Result<Option<Cursor>, AllocError> {
    let Some(mut cursor) = cursor else {
        return Ok(None);
    };
    let record = space.bno.record(ctx, &cursor)?;
    let end = u64::from(record.start.0) + u64::from(record.length);
    let distance = u64::from(search.target).saturating_sub(end.saturating_sub(1));
    if !search.could_win(distance) {
        return Ok(None);
    }
    search.walk_consider(record);
    Ok(space.bno.prev(ctx, &mut cursor)?.then_some(cursor))
}

fn step_right<'c, B: Buffers<'c>>(
    ctx: &mut AgCtx<'_, B>,
    space: &AgSpace,
    search: &mut Search<'_>,
    cursor: Option<Cursor>,
) -> Result<Option<Cursor>, AllocError> {
    let Some(mut cursor) = cursor else {
        return Ok(None);
    };
    let record = space.bno.record(ctx, &cursor)?;
    let distance = u64::from(record.start.0).saturating_sub(u64::from(search.target));
    if !search.could_win(distance) {
        return Ok(None);
    }
    search.walk_consider(record);
    Ok(space.bno.next(ctx, &mut cursor)?.then_some(cursor))
}

/// One by-length probe at (length_key, target): the nearest extent of that length at or right
/// of the target, and the one before it. Returns the next length key, or `None` when done.
fn probe_length<'c, B: Buffers<'c>>(
    ctx: &mut AgCtx<'_, B>,
    space: &AgSpace,
    search: &mut Search<'_>,
    length_key: Option<u32>,
) -> Result<Option<u32>, AllocError> {
    let Some(length) = length_key else {
        return Ok(None);
    };
    let Some(mut cursor) = space
        .cnt
        .lookup(ctx, &cnt_key(length, search.target), Lookup::Ge)?
    else {
        return Ok(None);
    };
    let found = space.cnt.record(ctx, &cursor)?;
    search.consider(found);
    if space.cnt.prev(ctx, &mut cursor)? {
        let before = space.cnt.record(ctx, &cursor)?;
        if before.length >= length {
            search.consider(before);
        }
    }
    let next = if search.best.is_some() {
        length.saturating_mul(2)
    } else {
        found.length.saturating_add(1)
    };
    Ok((next > length && next <= ctx.agf.longest_free).then_some(next))
}

/// By-size mode: the smallest extent that fits the wanted length, else the best shorter one.
pub(crate) fn by_size<'c, B: Buffers<'c>>(
    ctx: &mut AgCtx<'_, B>,
    space: &AgSpace,
    search: &mut Search<'_>,
) -> Result<(), AllocError> {
    let Some(mut cursor) = space
        .cnt
        .lookup(ctx, &cnt_key(search.wanted, 0), Lookup::Ge)?
    else {
        return Ok(());
    };
    for _ in 0..SIZE_STEPS_MAX {
        search.consider(space.cnt.record(ctx, &cursor)?);
        if search.full() || !space.cnt.next(ctx, &mut cursor)? {
            break;
        }
    }
    Ok(())
}

/// Apart mode: the longest free extent (after busy trimming; the by-length tree from its
/// end, at most `SIZE_STEPS_MAX` records, stopping at one too short to beat the best), the
/// request placed from its middle on, so at least as many blocks as it takes stay free
/// before it.
pub(crate) fn apart<'c, B: Buffers<'c>>(
    ctx: &mut AgCtx<'_, B>,
    space: &AgSpace,
    search: &mut Search<'_>,
) -> Result<(), AllocError> {
    let Some(mut cursor) = space.cnt.last(ctx)? else {
        return Ok(());
    };
    let mut longest: Option<(FreeSpaceRecord, (u32, u32))> = None;
    for _ in 0..SIZE_STEPS_MAX {
        let record = space.cnt.record(ctx, &cursor)?;
        if longest.is_some_and(|(_, (_, length))| length >= record.length) {
            break;
        }
        search.records_visited += 1;
        let usable = search.usable(record);
        if let Some(usable) = usable
            && longest.is_none_or(|(_, (_, length))| usable.1 > length)
        {
            longest = Some((record, usable));
        }
        if !space.cnt.prev(ctx, &mut cursor)? {
            break;
        }
    }
    let Some((record, (start, length))) = longest else {
        return Ok(());
    };
    let half = length / 2;
    let middle = start + half;
    if let Some(place) = place(
        &search.request,
        search.wanted,
        middle,
        (middle, length - half),
    ) {
        search.best = Some(Candidate { record, place });
    }
    Ok(())
}

/// Exact mode: the free extent holding the target must offer at least `min_len` blocks from
/// the target on, none of them busy.
pub(crate) fn exact<'c, B: Buffers<'c>>(
    ctx: &mut AgCtx<'_, B>,
    space: &AgSpace,
    search: &mut Search<'_>,
) -> Result<(), AllocError> {
    let key = BnoKey {
        start: AgBlock(search.target),
    };
    let Some(cursor) = space.bno.lookup(ctx, &key, Lookup::Le)? else {
        return Ok(());
    };
    let record = space.bno.record(ctx, &cursor)?;
    search.records_visited += 1;
    let end = u64::from(record.start.0) + u64::from(record.length);
    if end <= u64::from(search.target) || !search.target.is_multiple_of(search.request.alignment) {
        return Ok(());
    }
    let mut room = (end - u64::from(search.target)) as u32;
    if let Some(busy) = search.busy.overlapping(search.target, room) {
        search.busy_sequence = search.busy_sequence.max(Some(busy.sequence));
        room = busy.start.saturating_sub(search.target);
    }
    let got = room.min(search.wanted);
    let got = got - got % search.request.len_multiple;
    if got >= search.request.min_len {
        let place = Placement {
            start: search.target,
            length: got,
            distance: 0,
        };
        search.best = Some(Candidate { record, place });
    }
    Ok(())
}
