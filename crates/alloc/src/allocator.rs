//! The allocator over all AGs: AG order, free-list upkeep, busy extents and statistics.
//!
//! Lock order (see `docs/alloc.md`). The AG lock is the AGF buffer: whoever holds it (joined to
//! a transaction, so until commit or cancel) owns the AG's trees, free list and in-memory
//! state. Then:
//! 1. AGF buffers in ascending AG order across the whole transaction: before locking an AGF
//!    the allocator asks its context which AGFs it already holds (`Buffers::holds`) and never
//!    locks one below the highest of them;
//! 2. the AGF, then that AG's free list and tree buffers (only AGF holders touch them);
//! 3. the `AgState` mutex last, only while holding that AG's AGF, released before the call
//!    returns. Nobody waits for a buffer while holding an `AgState` mutex of another AG, and
//!    nobody takes one without that AG's AGF (the longest-extent hint is a lock-free atomic).
//!
//! The old order (state mutex, then AGF, mutex released on return while the AGF stayed held
//! until commit) deadlocked: a second call of a transaction waited for the mutex while holding
//! the AGF, another transaction held the mutex and waited for that AGF.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cairn_btree::{Buffers, Lookup};
use cairn_format::{AgBlock, AgNumber, BnoKey, FsBlock, Geometry};
use cairn_lockrank::{Mutex, MutexGuard, Rank};

use crate::AllocError;
use crate::ag::{AgCtx, agf_block};
use crate::busy::{BusyExtents, LogSequence};
use crate::counters::OpCounters;
use crate::request::{Allocation, Mode, Request};
use crate::search::{Search, apart, by_size, exact, near};
use crate::space::{AgSpace, free_list_need};

/// In-memory state of one AG, behind its mutex, which is taken only while holding the AG's
/// AGF buffer (the AG lock) and released before the allocator returns.
#[derive(Debug, Default)]
pub(crate) struct AgState {
    pub busy: BusyExtents,
    /// Blocks a refcount decrease left mapped by one file (reflink) until that decrease is
    /// durable: a crash could still bring back the file that shared them, so writes must
    /// copy them rather than write in place (`Allocator::shared_runs` counts them shared).
    pub unshared: crate::refcount::RecentlyUnshared,
}

/// What one `trim_ag` call took: the ranges `(AG block, length)` marked for discard, and
/// where the next call starts (`None` at the end of the AG).
pub type TrimBatch = (Vec<(u32, u32)>, Option<u32>);

/// `longest_hints` value of an AG not read yet.
const HINT_UNKNOWN: u32 = u32::MAX;
/// Longest an allocation short of space waits for discards in progress to finish.
const DISCARD_WAIT_MAX: Duration = Duration::from_secs(30);
/// How often it looks again while waiting.
const DISCARD_WAIT_SLICE: Duration = Duration::from_millis(1);

/// Counters of the allocator (monotonic, relaxed).
#[derive(Debug, Default)]
struct Stats {
    allocations: AtomicU64,
    failures: AtomicU64,
    frees: AtomicU64,
    records_visited: AtomicU64,
    last_records_visited: AtomicU64,
    log_forces: AtomicU64,
    busy_retries: AtomicU64,
    near_round_caps: AtomicU64,
}

/// A snapshot of the allocator's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AllocStats {
    pub allocations: u64,
    pub failures: u64,
    pub frees: u64,
    /// Free-space records looked at by all searches.
    pub records_visited: u64,
    /// Records looked at by the most recent search.
    pub last_records_visited: u64,
    pub log_forces: u64,
    pub busy_retries: u64,
    /// Near searches ended by `NEAR_ROUNDS_MAX` instead of their own bounds (should stay 0).
    pub near_round_caps: u64,
}

/// The extent allocator of one filesystem.
#[derive(Debug)]
pub struct Allocator {
    pub(crate) geometry: Geometry,
    pub(crate) uuid: [u8; 16],
    pub(crate) ags: Vec<Mutex<AgState>>,
    /// Longest free extent of each AG when last seen (`HINT_UNKNOWN` before the AG was first
    /// read): lets the allocator skip AGs without locking their headers. Atomic so reading it
    /// takes no lock; written under the AG's AGF, so it is exact while that is held.
    longest_hints: Vec<AtomicU32>,
    /// Free blocks of each AG when last seen (`HINT_UNKNOWN` before): with the reserve, lets
    /// the allocator skip an AG whose free blocks are all reserved without locking it (a
    /// locked AG that fails keeps the allocator from wrapping to lower AGs).
    free_hints: Vec<AtomicU32>,
    /// Free blocks each AG keeps for requests with `use_reserve` (see `with_ag_reserve`).
    ag_reserve: u32,
    /// Freed ranges wait for a discard before they are reused (`with_discard`).
    pub(crate) discard: bool,
    /// Blocks promised to writers that will allocate them later (write-behind's
    /// reservations): an allocation outside a `ReservedScope` must leave them free.
    held_back: AtomicU64,
    stats: Stats,
}

thread_local! {
    /// How many `ReservedScope`s the thread is in.
    static IN_RESERVED_SCOPE: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// While alive, this thread's allocations may use held-back blocks: it is allocating for
/// the promises they were held back for.
#[derive(Debug)]
pub struct ReservedScope(());

impl ReservedScope {
    pub fn enter() -> ReservedScope {
        IN_RESERVED_SCOPE.with(|depth| depth.set(depth.get() + 1));
        ReservedScope(())
    }
}

impl Drop for ReservedScope {
    fn drop(&mut self) {
        IN_RESERVED_SCOPE.with(|depth| depth.set(depth.get().saturating_sub(1)));
    }
}

impl Allocator {
    pub fn new(geometry: Geometry, uuid: [u8; 16]) -> Self {
        Self {
            ags: (0..geometry.ag_count)
                .map(|_| Mutex::new(Rank::AllocAg, AgState::default()))
                .collect(),
            longest_hints: (0..geometry.ag_count)
                .map(|_| AtomicU32::new(HINT_UNKNOWN))
                .collect(),
            free_hints: (0..geometry.ag_count)
                .map(|_| AtomicU32::new(HINT_UNKNOWN))
                .collect(),
            geometry,
            uuid,
            ag_reserve: 0,
            discard: false,
            held_back: AtomicU64::new(0),
            stats: Stats::default(),
        }
    }

    /// The same allocator keeping `blocks` free in every AG for requests with `use_reserve`:
    /// blocks an operation that frees space may need (an inode free adding a free-inode tree
    /// record must not fail because data or inode chunks filled the AG). Not on disk.
    #[must_use]
    pub fn with_ag_reserve(mut self, blocks: u32) -> Self {
        self.ag_reserve = blocks;
        self
    }

    /// The same allocator with online discard: every freed range stays busy until it has
    /// been discarded (`take_discards`, `finish_discards`), which may happen only once its
    /// free is durable.
    #[must_use]
    pub fn with_discard(mut self, discard: bool) -> Self {
        self.discard = discard;
        self
    }

    /// Free blocks each AG keeps for requests with `use_reserve`.
    pub fn ag_reserve(&self) -> u32 {
        self.ag_reserve
    }

    /// The longest extent an ordinary request (no `use_reserve`) could get in AG `ag`, as
    /// last seen by this allocator (its longest free extent, at most its free blocks beyond
    /// the reserve), or `None` before the AG's header was read. A hint: callers use it to
    /// skip AGs without locking them.
    pub fn longest_free_hint(&self, ag: u32) -> Option<u32> {
        let hint = self.longest_hints.get(ag as usize)?.load(Ordering::Relaxed);
        let spare = self.spare_hint(ag, &Request::near(FsBlock(0), 1, 1));
        (hint != HINT_UNKNOWN).then(|| spare.map_or(hint, |spare| hint.min(spare)))
    }

    /// Free blocks of AG `ag` when last seen by this allocator, or `None` before its header
    /// was read.
    pub fn free_blocks_hint(&self, ag: u32) -> Option<u32> {
        let free = self.free_hints.get(ag as usize)?.load(Ordering::Relaxed);
        (free != HINT_UNKNOWN).then_some(free)
    }

    /// Records AG `ag`'s free blocks as read from its header by someone else.
    pub fn note_free_blocks(&self, ag: u32, free: u32) {
        self.store_free_hint(ag, free);
    }

    /// Holds `blocks` more back from allocations outside a `ReservedScope`.
    pub fn hold_back(&self, blocks: u64) {
        self.held_back.fetch_add(blocks, Ordering::Relaxed);
    }

    /// Gives back `blocks` held back by `hold_back`.
    pub fn release_held_back(&self, blocks: u64) {
        let _ = self
            .held_back
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
                Some(held.saturating_sub(blocks))
            });
    }

    /// Blocks held back now.
    pub fn held_back(&self) -> u64 {
        self.held_back.load(Ordering::Relaxed)
    }

    /// The most blocks `request` may take and leave every held-back block free (by the AGs'
    /// free counts beyond their reserves): `None` for no limit (nothing held back, inside
    /// a `ReservedScope`, or a request that may use the AG reserve: a freeing operation,
    /// which must not fail). An AG not read yet means no limit: holding back reads every
    /// AG first (`note_free_blocks`).
    fn held_back_limit(&self, request: &Request) -> Option<u64> {
        let held = self.held_back();
        if held == 0 || request.use_reserve || IN_RESERVED_SCOPE.with(std::cell::Cell::get) > 0 {
            return None;
        }
        Some(self.free_beyond_reserves()?.saturating_sub(held))
    }

    /// Free blocks of every AG beyond its reserve, by the hints; `None` while an AG has not
    /// been seen (`note_free_blocks` records one read elsewhere).
    pub fn free_beyond_reserves(&self) -> Option<u64> {
        self.free_hints
            .iter()
            .try_fold(0u64, |free, hint| match hint.load(Ordering::Relaxed) {
                HINT_UNKNOWN => None,
                known => Some(free + u64::from(known.saturating_sub(self.ag_reserve))),
            })
    }

    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    pub fn stats(&self) -> AllocStats {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        AllocStats {
            allocations: load(&self.stats.allocations),
            failures: load(&self.stats.failures),
            frees: load(&self.stats.frees),
            records_visited: load(&self.stats.records_visited),
            last_records_visited: load(&self.stats.last_records_visited),
            log_forces: load(&self.stats.log_forces),
            busy_retries: load(&self.stats.busy_retries),
            near_round_caps: load(&self.stats.near_round_caps),
        }
    }

    /// The busy ranges of AG `ag` (a copy). Takes the AG's state mutex without its AGF: call it
    /// only from a thread that holds no AG lock (tests and tools).
    pub fn busy_extents(&self, ag: AgNumber) -> Vec<crate::BusyExtent> {
        self.ags
            .get(ag.0 as usize)
            .map(|s| s.lock().busy.iter().copied().collect())
            .unwrap_or_default()
    }

    /// Blocks `request` may take of an AG with `free` free blocks: all but its `min_left` and,
    /// unless it may use it, the reserve.
    fn spare(&self, free: u32, request: &Request) -> u32 {
        let reserve = if request.use_reserve {
            0
        } else {
            self.ag_reserve
        };
        free.saturating_sub(request.min_left.saturating_add(reserve))
    }

    /// `spare` of AG `ag` by its free-blocks hint (`None` before the AG was read).
    fn spare_hint(&self, ag: u32, request: &Request) -> Option<u32> {
        let free = self.free_hints.get(ag as usize)?.load(Ordering::Relaxed);
        (free != HINT_UNKNOWN).then(|| self.spare(free, request))
    }

    /// Notes AG `ag`'s longest free extent and free blocks from its AGF, held by the caller.
    pub(crate) fn note_hints(&self, ag: u32, agf: &cairn_format::Agf) {
        if let Some(hint) = self.longest_hints.get(ag as usize) {
            hint.store(agf.longest_free, Ordering::Relaxed);
        }
        self.store_free_hint(ag, agf.free_blocks);
    }

    fn store_free_hint(&self, ag: u32, free: u32) {
        if let Some(hint) = self.free_hints.get(ag as usize) {
            hint.store(free, Ordering::Relaxed);
        }
    }

    /// The lowest AG the context may lock: `lowest` raised to the highest AG whose AGF it
    /// already holds (from earlier calls of the same transaction), so AGF locks ascend across
    /// the whole transaction whatever floor the caller tracked. AGIs put no floor on AGFs:
    /// every AGI is taken before every AGF (docs/alloc.md, lock order).
    pub(crate) fn floor<'c, B: Buffers<'c>>(&self, bufs: &mut B, lowest: AgNumber) -> u32 {
        let lowest = lowest.0.min(self.geometry.ag_count);
        (lowest..self.geometry.ag_count)
            .rev()
            .find(|&ag| bufs.holds(agf_block(&self.geometry, AgNumber(ag))))
            .unwrap_or(lowest)
    }

    /// AGs to try, in an order that keeps locks ascending within a transaction: the target's
    /// AG and those above it, then (only if none of those was locked) the ones from `floor`
    /// up to the target's.
    fn ag_order(&self, request: &Request, floor: u32) -> (Vec<u32>, Vec<u32>) {
        let count = self.geometry.ag_count;
        let lowest = floor.min(count);
        let target = self
            .geometry
            .ag_of(request.target)
            .0
            .clamp(lowest, count.saturating_sub(1));
        // Exact mode continues something in place: anywhere else is not the target.
        if request.target_ag_only || request.mode == Mode::Exact {
            let own = self.geometry.ag_of(request.target).0;
            let tried = if own >= lowest { vec![own] } else { Vec::new() };
            return (tried, Vec::new());
        }
        ((target..count).collect(), (lowest..target).collect())
    }

    /// Allocates per `request`, trying AGs in lock order. `Ok(None)` when no AG can satisfy it.
    pub fn allocate<'c, B: Buffers<'c>>(
        &self,
        bufs: &mut B,
        log: &dyn LogSequence,
        request: &Request,
    ) -> Result<Option<Allocation>, AllocError> {
        self.allocate_traced(bufs, log, request)
            .map(|(found, _)| found)
    }

    /// `allocate`, also returning the work it did (for benchmarks and slow-path diagnosis).
    pub fn allocate_traced<'c, B: Buffers<'c>>(
        &self,
        bufs: &mut B,
        log: &dyn LogSequence,
        request: &Request,
    ) -> Result<(Option<Allocation>, OpCounters), AllocError> {
        request.validate()?;
        let mut counters = OpCounters::default();
        let limited;
        let request = match self.held_back_limit(request) {
            None => request,
            Some(limit) if limit < u64::from(request.min_len) => {
                self.stats.failures.fetch_add(1, Ordering::Relaxed);
                return Ok((None, counters));
            }
            Some(limit) => {
                limited = Request {
                    max_len: request
                        .max_len
                        .min(u32::try_from(limit).unwrap_or(u32::MAX)),
                    ..*request
                };
                &limited
            }
        };
        let floor = self.floor(bufs, request.lowest_ag);
        let (first, wrapped) = self.ag_order(request, floor);
        let mut holds_one = false;
        for ag in first {
            let mark = bufs.joined_mark();
            if let Some(found) = self.try_ag(bufs, log, request, ag, &mut counters)? {
                return Ok((Some(found), counters));
            }
            holds_one |= self.still_held(bufs, ag, mark);
        }
        if !holds_one && request.mode != Mode::Exact {
            for ag in wrapped {
                if let Some(found) = self.try_ag(bufs, log, request, ag, &mut counters)? {
                    return Ok((Some(found), counters));
                }
            }
        }
        self.stats.failures.fetch_add(1, Ordering::Relaxed);
        Ok((None, counters))
    }

    /// After AG `ag` failed a request: gives back what the attempt locked without changing
    /// (a failed search changes nothing unless it refilled the free list) and says whether
    /// the AG's AGF is still held, which keeps the search from wrapping to lower AGs. Without
    /// the give-back a nearly full AG near the target ended every search there: `NoSpace`
    /// with most of the filesystem free.
    fn still_held<'c, B: Buffers<'c>>(&self, bufs: &mut B, ag: u32, mark: usize) -> bool {
        bufs.release_unchanged_since(mark);
        bufs.holds(agf_block(&self.geometry, AgNumber(ag)))
    }

    fn try_ag<'c, B: Buffers<'c>>(
        &self,
        bufs: &mut B,
        log: &dyn LogSequence,
        request: &Request,
        ag: u32,
        counters: &mut OpCounters,
    ) -> Result<Option<Allocation>, AllocError> {
        let (Some(state), Some(hint)) = (
            self.ags.get(ag as usize),
            self.longest_hints.get(ag as usize),
        ) else {
            return Ok(None);
        };
        let longest = hint.load(Ordering::Relaxed);
        if longest != HINT_UNKNOWN && longest < request.min_len {
            return Ok(None);
        }
        if self
            .spare_hint(ag, request)
            .is_some_and(|spare| spare < request.min_len)
        {
            return Ok(None);
        }
        // The AGF first (it may wait for another transaction's commit), then the state mutex.
        let mut ctx = AgCtx::open(bufs, &self.geometry, self.uuid, AgNumber(ag))?;
        let mut state = state.lock();
        let cleared = state.busy.clear_durable(log.durable_sequence()) as u64;
        ctx.counters.busy_cleared += cleared;
        let result = self.search_and_carve(&mut ctx, log, request, &mut state);
        counters.add(&ctx.counters);
        hint.store(ctx.agf.longest_free, Ordering::Relaxed);
        self.store_free_hint(ag, ctx.agf.free_blocks);
        result
    }

    /// One AG: refill the free list, search, and carve the winner out of both trees. If busy
    /// ranges cost every candidate, force the log once and search again, then give up
    /// pending discards and wait for those in progress once. The AG's work is added to
    /// `counters` (the AG counts as tried even when this fails).
    fn search_and_carve<'c, B: Buffers<'c>>(
        &self,
        ctx: &mut AgCtx<'_, B>,
        log: &dyn LogSequence,
        request: &Request,
        state: &mut MutexGuard<'_, AgState>,
    ) -> Result<Option<Allocation>, AllocError> {
        let spare = self.spare(ctx.agf.free_blocks, request);
        if ctx.agf.longest_free.min(spare) < request.min_len {
            // Refilling the free list first would change the AGF for nothing and keep it
            // held, ending the search above this AG.
            return Ok(None);
        }
        let mut space = AgSpace::open(ctx)?;
        if !self.fill_free_list(ctx, &mut space, state, log, 0)? {
            return Ok(None);
        }
        let (mut forced, mut reclaimed) = (false, false);
        loop {
            let mut search = self.search(ctx, &space, request, &state.busy)?;
            self.count_search(ctx, &search);
            if let Some(found) = search.best.take() {
                let place = found.place;
                space.carve(ctx, found.record, place.start, place.length)?;
                self.stats.allocations.fetch_add(1, Ordering::Relaxed);
                return Ok(Some(Allocation {
                    ag: ctx.ag(),
                    start: place.start,
                    length: place.length,
                    fs_start: ctx.fs_block(place.start),
                }));
            }
            let Some(sequence) = search.busy_sequence.filter(|_| !forced) else {
                if !reclaimed && self.reclaim_discards(state, log.durable_sequence()) {
                    reclaimed = true;
                    continue;
                }
                return Ok(None);
            };
            forced = true;
            self.force_log(ctx, log, sequence)?;
            let cleared = state.busy.clear_durable(log.durable_sequence()) as u64;
            ctx.counters.busy_cleared += cleared;
            self.stats.busy_retries.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn force_log<'c, B: Buffers<'c>>(
        &self,
        ctx: &mut AgCtx<'_, B>,
        log: &dyn LogSequence,
        sequence: u64,
    ) -> Result<(), AllocError> {
        ctx.counters.log_forces += 1;
        self.stats.log_forces.fetch_add(1, Ordering::Relaxed);
        log.force(sequence)
            .map_err(|what| AllocError::LogForce { sequence, what })
    }

    /// Adds one search's work to the operation's counters and the allocator's statistics.
    fn count_search<'c, B: Buffers<'c>>(&self, ctx: &mut AgCtx<'_, B>, search: &Search<'_>) {
        self.count_visits(search.records_visited);
        let counters = &mut ctx.counters;
        counters.records_visited += search.records_visited;
        counters.busy_ranges_visited += search.busy_visited;
        counters.near_rounds += search.rounds;
        if search.round_cap_reached {
            counters.near_round_caps += 1;
            self.stats.near_round_caps.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn count_visits(&self, visited: u64) {
        self.stats
            .records_visited
            .fetch_add(visited, Ordering::Relaxed);
        self.stats
            .last_records_visited
            .store(visited, Ordering::Relaxed);
    }

    /// Runs the request's mode in one AG; the search holds the winner, if any.
    fn search<'a, 'c, B: Buffers<'c>>(
        &self,
        ctx: &mut AgCtx<'_, B>,
        space: &AgSpace,
        request: &Request,
        busy: &'a BusyExtents,
    ) -> Result<Search<'a>, AllocError> {
        let spare = self.spare(ctx.agf.free_blocks, request);
        let wanted = request.max_len.min(ctx.agf.longest_free).min(spare);
        let wanted = wanted - wanted % request.len_multiple;
        let target = if self.geometry.ag_of(request.target) == ctx.ag() {
            self.geometry.ag_block_of(request.target).0
        } else {
            0
        };
        let mut search = Search::new(*request, wanted, target, busy);
        if wanted < request.min_len {
            return Ok(search);
        }
        match request.mode {
            Mode::Near => near(ctx, space, &mut search)?,
            Mode::Size => by_size(ctx, space, &mut search)?,
            Mode::Exact => exact(ctx, space, &mut search)?,
            Mode::Apart => apart(ctx, space, &mut search)?,
        }
        Ok(search)
    }

    /// Frees `length` blocks at `start` (all in one AG), freed by the transaction that will
    /// commit with `sequence`: they join both trees, merged with free neighbours, and stay
    /// busy until that commit is durable.
    pub fn free<'c, B: Buffers<'c>>(
        &self,
        bufs: &mut B,
        log: &dyn LogSequence,
        start: FsBlock,
        length: u32,
        sequence: u64,
    ) -> Result<(), AllocError> {
        self.free_traced(bufs, log, start, length, sequence)
            .map(|_| ())
    }

    /// `free`, also returning the work it did.
    pub fn free_traced<'c, B: Buffers<'c>>(
        &self,
        bufs: &mut B,
        log: &dyn LogSequence,
        start: FsBlock,
        length: u32,
        sequence: u64,
    ) -> Result<OpCounters, AllocError> {
        let ag = self.geometry.ag_of(start);
        let ag_start = self.geometry.ag_block_of(start).0;
        let bad = |why| AllocError::BadFree {
            ag: ag.0,
            start: ag_start,
            length,
            why,
        };
        let state = self.ags.get(ag.0 as usize).ok_or(bad("no such AG"))?;
        let hint = self
            .longest_hints
            .get(ag.0 as usize)
            .ok_or(bad("no such AG"))?;
        let end = u64::from(ag_start) + u64::from(length);
        if length == 0 || end > u64::from(self.geometry.ag_len(ag.0)) {
            return Err(bad("empty or crosses the AG's end"));
        }
        let held = self.floor(bufs, ag);
        if held > ag.0 && !bufs.holds(agf_block(&self.geometry, ag)) {
            return Err(AllocError::AgOrder { ag: ag.0, held });
        }
        // The AGF first (it may wait for another transaction's commit), then the state mutex.
        let mut ctx = AgCtx::open(bufs, &self.geometry, self.uuid, ag)?;
        let mut state = state.lock();
        let cleared = state.busy.clear_durable(log.durable_sequence()) as u64;
        ctx.counters.busy_cleared += cleared;
        let mut space = AgSpace::open(&ctx)?;
        // Merging into the trees can split blocks, so the free list is topped up first. A full
        // AG may not manage that; the free then fails only if a split really needs a block.
        self.fill_free_list(&mut ctx, &mut space, &mut state, log, 0)?;
        space.add(&mut ctx, ag_start, length)?;
        state.busy.insert(ag_start, length, sequence, self.discard);
        let discard = self.discard;
        trim_free_list(&mut ctx, &mut space, &mut state.busy, (sequence, discard))?;
        hint.store(ctx.agf.longest_free, Ordering::Relaxed);
        self.store_free_hint(ag.0, ctx.agf.free_blocks);
        self.stats.frees.fetch_add(1, Ordering::Relaxed);
        Ok(ctx.counters)
    }
}

impl Allocator {
    /// Tops the free list up to what the worst split chain of both trees needs, plus `extra`
    /// blocks (an insert into the refcount tree). Each refill
    /// takes the whole shortfall in one by-size allocation (the smallest extent that holds it,
    /// busy ranges trimmed), so a refill is one search and one carve, not one per block. When
    /// only busy space is left, forces the log once so it becomes usable. False if the AG
    /// still cannot.
    pub(crate) fn fill_free_list<'c, B: Buffers<'c>>(
        &self,
        ctx: &mut AgCtx<'_, B>,
        space: &mut AgSpace,
        state: &mut MutexGuard<'_, AgState>,
        log: &dyn LogSequence,
        extra: u32,
    ) -> Result<bool, AllocError> {
        let (mut forced, mut reclaimed) = (false, false);
        loop {
            let need = free_list_need(space.bno.levels(), space.cnt.levels()) + extra;
            let have = ctx.agf.free_list_count;
            if have >= need {
                return Ok(true);
            }
            if self.refill_once(ctx, space, &state.busy, need - have)? {
                continue;
            }
            let Some(sequence) = state.busy.max_sequence().filter(|_| !forced) else {
                if !reclaimed && self.reclaim_discards(state, log.durable_sequence()) {
                    reclaimed = true;
                    continue;
                }
                return Ok(false);
            };
            forced = true;
            self.force_log(ctx, log, sequence)?;
            let cleared = state.busy.clear_durable(log.durable_sequence()) as u64;
            ctx.counters.busy_cleared += cleared;
        }
    }

    /// One by-size search for up to `short` blocks, moved onto the free list. False if no
    /// block could be had without a log force.
    fn refill_once<'c, B: Buffers<'c>>(
        &self,
        ctx: &mut AgCtx<'_, B>,
        space: &mut AgSpace,
        busy: &BusyExtents,
        short: u32,
    ) -> Result<bool, AllocError> {
        let wanted = short.min(ctx.agf.longest_free);
        if wanted == 0 {
            return Ok(false);
        }
        let request = Request::near(FsBlock(0), 1, wanted).with_mode(Mode::Size);
        let mut search = Search::new(request, wanted, 0, busy);
        by_size(ctx, space, &mut search)?;
        ctx.counters.free_list_refills += 1;
        self.count_search(ctx, &search);
        let Some(found) = search.best else {
            return Ok(false);
        };
        let (first, length) = (found.place.start, found.place.length);
        space.carve(ctx, found.record, first, length)?;
        for block in first..first + length {
            ctx.push_free_list(block)?;
        }
        ctx.counters.free_list_blocks_added += u64::from(length);
        Ok(true)
    }
}

/// Returns free-list blocks beyond twice the need to free space (busy, as freed now by the
/// commit with `freed.0`, to be discarded if `freed.1`).
pub(crate) fn trim_free_list<'c, B: Buffers<'c>>(
    ctx: &mut AgCtx<'_, B>,
    space: &mut AgSpace,
    busy: &mut BusyExtents,
    freed: (u64, bool),
) -> Result<(), AllocError> {
    let high = 2 * free_list_need(space.bno.levels(), space.cnt.levels());
    trim_free_list_to(ctx, space, busy, freed, high)
}

/// Returns free-list blocks beyond `high` to free space (busy, as `trim_free_list`).
pub(crate) fn trim_free_list_to<'c, B: Buffers<'c>>(
    ctx: &mut AgCtx<'_, B>,
    space: &mut AgSpace,
    busy: &mut BusyExtents,
    (sequence, discard): (u64, bool),
    high: u32,
) -> Result<(), AllocError> {
    while ctx.agf.free_list_count > high {
        let Some(block) = ctx.pop_free_list()? else {
            break;
        };
        space.add(ctx, block, 1)?;
        busy.insert(block, 1, sequence, discard);
        ctx.counters.free_list_blocks_returned += 1;
    }
    Ok(())
}

impl Allocator {
    /// When only discards keep space busy: gives up the discards not yet issued whose free
    /// is durable (their ranges become free) and waits, with the AG's state mutex released
    /// (its AGF stays held: the discarder does not need it), for those in progress. Returns
    /// whether anything may have been freed.
    fn reclaim_discards(&self, state: &mut MutexGuard<'_, AgState>, durable: u64) -> bool {
        if !state.busy.has_discards() {
            return false;
        }
        state.busy.cancel_pending(durable);
        let deadline = Instant::now() + DISCARD_WAIT_MAX;
        while state.busy.issued() > 0 && Instant::now() < deadline {
            MutexGuard::unlocked(state, || std::thread::sleep(DISCARD_WAIT_SLICE));
        }
        true
    }

    /// Takes up to `max` ranges of AG `ag` whose free is durable (commits up to `durable`)
    /// and that wait for a discard; they stay busy until `finish_discards`. Returned as
    /// `(AG block, length)`. Takes the AG's state mutex without its AGF, which is safe from
    /// a thread that holds no AG lock (the mutex is a leaf: nobody waits while holding it).
    pub fn take_discards(&self, ag: u32, durable: u64, max: usize) -> Vec<(u32, u32)> {
        self.ags
            .get(ag as usize)
            .map(|state| state.lock().busy.take_discards(durable, max))
            .unwrap_or_default()
    }

    /// The newest commit sequence a range waiting for a discard was freed by, over all AGs
    /// (the same locking as `take_discards`).
    pub fn pending_discard_sequence(&self) -> Option<u64> {
        self.ags
            .iter()
            .filter_map(|state| state.lock().busy.pending_sequence())
            .max()
    }

    /// Reports the discards of `ranges` of AG `ag` done (or failed): the ranges may be
    /// allocated again. The same locking as `take_discards`.
    pub fn finish_discards(&self, ag: u32, ranges: &[(u32, u32)]) {
        if let Some(state) = self.ags.get(ag as usize) {
            state.lock().busy.finish_discards(ranges);
        }
    }

    /// Finds up to `max` free extents of AG `ag` of at least `min_len` blocks, starting at
    /// AG block `from`, and marks their parts that are not busy as being discarded (busy
    /// until `finish_discards`): a trim of free space (what FITRIM does). Returns the
    /// ranges as `(AG block, length)` and where the next call should start, `None` at the
    /// end of the AG.
    pub fn trim_ag<'c, B: Buffers<'c>>(
        &self,
        bufs: &mut B,
        log: &dyn LogSequence,
        ag: u32,
        from: u32,
        min_len: u32,
        max: usize,
    ) -> Result<TrimBatch, AllocError> {
        let Some(state) = self.ags.get(ag as usize) else {
            return Ok((Vec::new(), None));
        };
        let mut ctx = AgCtx::open(bufs, &self.geometry, self.uuid, AgNumber(ag))?;
        let mut state = state.lock();
        state.busy.clear_durable(log.durable_sequence());
        let space = AgSpace::open(&ctx)?;
        let key = BnoKey {
            start: AgBlock(from),
        };
        let mut cursor = space.bno.lookup(&mut ctx, &key, Lookup::Ge)?;
        let (mut taken, min_len) = (Vec::new(), min_len.max(1));
        while let Some(at) = cursor.as_mut() {
            if taken.len() >= max {
                let next = space.bno.record(&mut ctx, at)?.start.0;
                return Ok((taken, Some(next)));
            }
            let record = space.bno.record(&mut ctx, at)?;
            for (start, length) in state.busy.free_pieces(record.start.0, record.length) {
                if length >= min_len {
                    state.busy.insert_issued(start, length);
                    taken.push((start, length));
                }
            }
            if !space.bno.next(&mut ctx, at)? {
                cursor = None;
            }
        }
        Ok((taken, None))
    }
}

impl Allocator {
    /// Grows the last AG `ag` (this allocator's geometry is the one before the grow) to
    /// `new_len` blocks: the AGF's length, and the new range `old_len..new_len` free in
    /// both trees (merged with a free extent that ends at the old end). Never busy: those
    /// blocks were never allocated. Part of a grow transaction, with the filesystem idle.
    pub fn grow_ag<'c, B: Buffers<'c>>(
        &self,
        bufs: &mut B,
        log: &dyn LogSequence,
        ag: u32,
        new_len: u32,
    ) -> Result<(), AllocError> {
        let old_len = self.geometry.ag_len(ag);
        if ag + 1 != self.geometry.ag_count || new_len <= old_len {
            return Err(AllocError::BadFree {
                ag,
                start: old_len,
                length: new_len.saturating_sub(old_len),
                why: "only the last AG grows, and only longer",
            });
        }
        let Some(state) = self.ags.get(ag as usize) else {
            return Ok(());
        };
        let mut ctx = AgCtx::open(bufs, &self.geometry, self.uuid, AgNumber(ag))?;
        let mut state = state.lock();
        let mut space = AgSpace::open(&ctx)?;
        self.fill_free_list(&mut ctx, &mut space, &mut state, log, 0)?;
        ctx.set_field(crate::ag::field::AG_LENGTH, new_len)?;
        space.add(&mut ctx, old_len, new_len - old_len)?;
        self.store_free_hint(ag, ctx.agf.free_blocks);
        if let Some(hint) = self.longest_hints.get(ag as usize) {
            hint.store(ctx.agf.longest_free, Ordering::Relaxed);
        }
        Ok(())
    }
}
