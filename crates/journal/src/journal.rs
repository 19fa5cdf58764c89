//! The journal: opening (with recovery), reservations, checkpoint pushes, completion into the
//! AIL, AIL pushing, forces, the background thread and unmount.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cairn_blockdev::BlockDevice;
use cairn_bufcache::{BufCacheError, BufKey, BufferCache, ReadSpec};
use cairn_format::{Geometry, InodeNumber, Lsn, Superblock};
use cairn_lockrank::{Mutex, Rank};
use parking_lot::Condvar;

use crate::JournalError;
use crate::ail::{Ail, AilItem};
use crate::cil::{Cil, Context};
use crate::config::{AIL_FREE_TARGET_DIVISOR, CHECKPOINTS_IN_FLIGHT_MAX, JournalConfig};
use crate::inode_ops::inode_cluster_spec;
use crate::item::{CommitSequence, ItemKey, Vector, encode_items};
use crate::recovery::{RecoveryReport, recover};
use crate::reservation::{Reservation, checkpoint_bytes_max};
use crate::space::Space;
use crate::stats::{JournalStats, Stats, bump};
use crate::transaction::Transaction;
use crate::writer::{Layout, Writer, Written};
use cairn_format::log::LogItem;

/// How long a waiter sleeps between checks for shutdown or progress.
const WAIT_SLICE_MS: u64 = 5;
/// The share of the log (1/n) kept for transactions that finish intents.
const KEPT_FOR_INTENTS_DIVISOR: u64 = 8;
/// A wait for log space gives up (and reports `NoProgress`) once the log's tail has stood
/// still this long while the waiter pushed: a tail that moves, however slowly, frees space
/// and is waited for; one that does not will never grant the wait. (Not the head: the
/// waiter's own marker records move it.)
const SPACE_STALL_LIMIT: Duration = Duration::from_secs(60);

/// Unmount gives up writing the AIL home (nothing else runs then) after this many pushes.
const UNMOUNT_PUSH_ATTEMPTS_MAX: u32 = 2000;

/// Watches a log-space wait for progress: the tail moving.
struct StallClock {
    seen: Lsn,
    since: Instant,
}

impl StallClock {
    fn new(space: &Space) -> Self {
        Self {
            seen: space.tail,
            since: Instant::now(),
        }
    }

    /// Whether the tail has stood still for `SPACE_STALL_LIMIT`.
    fn stuck(&mut self, space: &Space) -> bool {
        if space.tail != self.seen {
            self.seen = space.tail;
            self.since = Instant::now();
        }
        self.since.elapsed() >= SPACE_STALL_LIMIT
    }
}

/// State shared with the background thread.
#[derive(Debug, Default)]
struct WorkerState {
    stop: bool,
    kicked: bool,
}

/// Everything the journal and its background thread share.
#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) cache: Arc<BufferCache>,
    device: Arc<dyn BlockDevice>,
    pub(crate) geometry: Geometry,
    layout: Layout,
    pub(crate) config: JournalConfig,
    push_threshold: u64,
    cluster_spec: ReadSpec,
    pub(crate) cil: Mutex<Cil>,
    cil_switched: Condvar,
    writer: Mutex<Writer>,
    writer_turn: Condvar,
    ail: Mutex<Ail>,
    /// Serializes AIL pushes: a buffer seen clean must have been written by a push whose
    /// device flush has returned.
    push_lock: Mutex<()>,
    space: Mutex<Space>,
    space_changed: Condvar,
    completed: Mutex<u64>,
    completed_changed: Condvar,
    pub(crate) next_intent: AtomicU64,
    pub(crate) sync_commit: Mutex<()>,
    shutdown: Mutex<Option<String>>,
    worker: Mutex<WorkerState>,
    worker_wake: Condvar,
    /// Called with the sequence of each checkpoint once it is durable (`on_completion`).
    completion_hook: HookSlot,
    pub(crate) stats: Stats,
}

/// Forces the log from another thread; see `Journal::force_handle`.
#[derive(Debug, Clone)]
pub struct ForceHandle(Arc<Inner>);

impl ForceHandle {
    /// Makes every commit up to `sequence` durable (as `Journal::force`), but no further
    /// than the current context: a sequence not yet begun would never complete.
    pub fn force(&self, sequence: CommitSequence) -> Result<(), JournalError> {
        let current = self.0.cil.lock().sequence();
        self.0.force(sequence.0.min(current))
    }
}

/// What `Journal::on_completion` registers.
pub type CompletionHook = Arc<dyn Fn(u64) + Send + Sync>;

/// The registered hook, if any (a leaf lock: the hook is cloned out before it runs).
struct HookSlot(Mutex<Option<CompletionHook>>);

impl Default for HookSlot {
    fn default() -> Self {
        Self(Mutex::new(Rank::Leaf, None))
    }
}

impl std::fmt::Debug for HookSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set = self.0.lock().is_some();
        f.debug_struct("HookSlot").field("set", &set).finish()
    }
}

/// The journal of one filesystem; see the crate documentation.
#[derive(Debug)]
pub struct Journal {
    pub(crate) inner: Arc<Inner>,
    worker: Option<JoinHandle<()>>,
}

fn check_config(geometry: &Geometry, config: &JournalConfig) -> Result<ReadSpec, JournalError> {
    let log_bytes = u64::from(geometry.log_blocks) * u64::from(geometry.block_size);
    let block = u64::from(geometry.block_size);
    let needed = 4 * checkpoint_bytes_max(crate::config::BUFFER_ITEM_BYTES_MAX, block);
    if log_bytes < needed || geometry.log_blocks < crate::config::LOG_BLOCKS_MIN {
        return Err(JournalError::Config {
            field: "log_blocks",
            value: u64::from(geometry.log_blocks),
            why: "log too small for two of the largest checkpoints",
        });
    }
    if config.inode_cluster_blocks == 0 {
        return Err(JournalError::Config {
            field: "inode_cluster_blocks",
            value: 0,
            why: "must be at least one block",
        });
    }
    inode_cluster_spec(geometry.inode_size, [0; 16]).ok_or(JournalError::Config {
        field: "inode_size",
        value: u64::from(geometry.inode_size),
        why: "no inode cluster verifier for this size",
    })
}

impl Journal {
    /// Whether the log on `device` has checkpoints that mounting would replay (an unclean
    /// log). Reads only: lets a read-only mount refuse a dirty log instead of replaying it.
    pub fn needs_recovery(
        device: &dyn BlockDevice,
        superblock: &Superblock,
    ) -> Result<bool, JournalError> {
        let layout = Layout::new(&superblock.geometry, superblock.uuid());
        crate::log_scan::needs_replay(device, &layout)
    }

    /// Opens the log of a formatted filesystem (geometry and UUID from its superblock),
    /// running recovery if needed; returns the journal and what recovery did, including the
    /// unfinished intents, which are relogged so they survive until their done items.
    pub fn open(
        cache: Arc<BufferCache>,
        device: Arc<dyn BlockDevice>,
        superblock: &Superblock,
        config: JournalConfig,
    ) -> Result<(Journal, RecoveryReport), JournalError> {
        let geometry = superblock.geometry;
        let spec = check_config(&geometry, &config)?;
        let uuid = superblock.uuid();
        let layout = Layout::new(&geometry, uuid);
        let recovered = recover(device.as_ref(), &layout, &geometry)?;
        let head_lsn = layout.lsn(recovered.head);
        let reserve = 4 * checkpoint_bytes_max(0, layout.block_size) + 4 * layout.block_size;
        let capacity = layout.log_bytes().saturating_sub(reserve);
        let sequence = recovered.next_sequence;
        // Room for a few transactions finishing intents at once; more wait for each other.
        // Never so much that the largest reservation (a quarter of the log) cannot fit.
        let kept = (layout.log_bytes() / KEPT_FOR_INTENTS_DIVISOR)
            .min(capacity.saturating_sub(layout.log_bytes() / 4));
        let mut space = Space::new(head_lsn, capacity, kept);
        space.grant_bytes = checkpoint_bytes_max(0, layout.block_size);
        let inner = Arc::new(Inner {
            cache,
            device,
            geometry,
            layout,
            config,
            push_threshold: config.push_threshold(layout.log_bytes()),
            cluster_spec: ReadSpec::new(spec.ops, uuid),
            cil: Mutex::new(Rank::JournalCil, Cil::new(sequence)),
            cil_switched: Condvar::new(),
            writer: Mutex::new(
                Rank::JournalWriter,
                Writer {
                    head: recovered.head,
                    prev_lsn: recovered.prev_lsn,
                    next_data_sequence: sequence,
                    next_commit_sequence: sequence,
                },
            ),
            writer_turn: Condvar::new(),
            ail: Mutex::new(Rank::JournalAil, Ail::default()),
            push_lock: Mutex::new(Rank::JournalPush, ()),
            space: Mutex::new(Rank::JournalSpace, space),
            space_changed: Condvar::new(),
            completed: Mutex::new(Rank::JournalCompleted, sequence - 1),
            completed_changed: Condvar::new(),
            next_intent: AtomicU64::new(recovered.next_intent),
            sync_commit: Mutex::new(Rank::JournalSyncCommit, ()),
            shutdown: Mutex::new(Rank::JournalState, None),
            worker: Mutex::new(Rank::JournalState, WorkerState::default()),
            worker_wake: Condvar::new(),
            completion_hook: HookSlot::default(),
            stats: Stats::default(),
        });
        let report = recovered.report;
        inner.settle_after_recovery(&report)?;
        let worker = match config.background {
            true => Some(spawn_worker(Arc::clone(&inner))?),
            false => None,
        };
        Ok((Journal { inner, worker }, report))
    }

    /// Starts a transaction holding `reservation` log bytes; waits (pushing the CIL and the
    /// AIL) while the log is short of space. The caller must hold no buffer: a held buffer
    /// may pin the log's tail, and the wait would never end (checked in debug builds).
    #[track_caller]
    pub fn begin(&self, reservation: Reservation) -> Result<Transaction<'_>, JournalError> {
        cairn_lockrank::check_may_wait(cairn_lockrank::Rank::LogSpace);
        self.inner.reserve(reservation)?;
        bump(&self.inner.stats.transactions, 1);
        Ok(Transaction::new(self, reservation))
    }

    /// Starts a transaction that finishes an intent a committed transaction logged (frees
    /// its extents and logs its done item). It draws on log space other reservations may
    /// not use and never queues behind them: they may be waiting for the log's tail, which
    /// the unfinished intent holds. Waits only while other finishing transactions hold that
    /// space. The caller must hold no buffer, as for `begin`.
    #[track_caller]
    pub fn begin_finishing(
        &self,
        reservation: Reservation,
    ) -> Result<Transaction<'_>, JournalError> {
        cairn_lockrank::check_may_wait(cairn_lockrank::Rank::LogSpace);
        self.inner.reserve_finishing(reservation)?;
        bump(&self.inner.stats.transactions, 1);
        Ok(Transaction::new(self, reservation))
    }

    /// Makes every commit up to `sequence` durable, pushing only what it needs: the current
    /// checkpoint context if `sequence` is in it, then waiting for earlier ones in flight.
    pub fn force(&self, sequence: CommitSequence) -> Result<(), JournalError> {
        self.inner.force(sequence.0)
    }

    /// Makes every commit so far durable.
    pub fn force_all(&self) -> Result<(), JournalError> {
        let current = self.inner.cil.lock().sequence();
        self.inner.force(current)
    }

    /// When the oldest commit not yet pushed into a checkpoint arrived (`None`: nothing
    /// waits). The filesystem's commit window forces the log once it is old enough.
    pub fn oldest_unpushed_commit(&self) -> Option<std::time::Instant> {
        self.inner.cil.lock().current.first_commit_at
    }

    /// Registers `hook`, called with a checkpoint's sequence each time one becomes durable
    /// (what online discard waits for: the frees it commits can no longer be undone). It
    /// runs on whichever thread completed the checkpoint, with no journal lock held, but
    /// possibly inside a log force of a caller holding buffer or allocator locks: it must
    /// not take those, nor wait for the journal. Replaces any earlier hook.
    pub fn on_completion(&self, hook: CompletionHook) {
        *self.inner.completion_hook.0.lock() = Some(hook);
    }

    /// A handle that can force the log from another thread (the discard thread, which
    /// holds no lock). It must not be used once `unmount` has begun.
    pub fn force_handle(&self) -> ForceHandle {
        ForceHandle(Arc::clone(&self.inner))
    }

    /// Every commit whose sequence is at most this is on stable storage.
    pub fn durable_sequence(&self) -> CommitSequence {
        CommitSequence(*self.inner.completed.lock())
    }

    /// The sequence of the checkpoint context commits currently go into.
    pub fn current_sequence(&self) -> CommitSequence {
        CommitSequence(self.inner.cil.lock().sequence())
    }

    /// Forces the log, writes everything home, and leaves a clean log (an unmount record
    /// whose tail is itself). Unfinished intents keep the log dirty on purpose.
    pub fn unmount(mut self) -> Result<(), JournalError> {
        self.stop_worker();
        let inner = &self.inner;
        inner.check_shutdown()?;
        let current = inner.cil.lock().sequence();
        inner.force(current)?;
        for _ in 0..UNMOUNT_PUSH_ATTEMPTS_MAX {
            let head = inner.space.lock().head;
            inner.push_ail(head)?;
            if inner.ail.lock().only_intents() {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        if !inner.ail.lock().only_intents() {
            return Err(JournalError::NoProgress {
                why: "unmount could not write every logged item home",
            });
        }
        inner.write_marker(true)
    }

    /// Shuts the journal down for `reason`, as a failed log write would: for a caller that
    /// left a change it cannot finish in memory (a collapse or insert range that failed half
    /// way; recovery finishes it from its intent). Later operations fail with `Shutdown`.
    pub fn shut_down_now(&self, reason: String) {
        self.inner.shut_down(reason);
    }

    /// Why the journal shut down (the first cause), or `None` while it runs.
    pub fn shutdown_reason(&self) -> Option<String> {
        self.inner.shutdown.lock().clone()
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> JournalStats {
        self.inner.stats.snapshot()
    }

    /// Pushes the current CIL context to the log now (what the background thread does when
    /// the CIL passes its threshold or the timer fires).
    pub fn push_checkpoint(&self) -> Result<(), JournalError> {
        self.inner.push_cil().map(|_| ())
    }

    /// Writes home every durable item up to the head and moves the tail.
    pub fn push_ail(&self) -> Result<(), JournalError> {
        let head = self.inner.space.lock().head;
        self.inner.push_ail(head)
    }

    /// Checks the CIL, AIL and space accounting; tests call it after every step.
    pub fn check_invariants(&self) {
        let space = self.inner.space.lock();
        space.check_invariants(&self.inner.layout);
        let (head, tail) = (space.head, space.tail);
        drop(space);
        self.inner.cil.lock().check_invariants();
        let ail = self.inner.ail.lock();
        ail.check_invariants(head);
        if let Some(oldest) = ail.min_lsn() {
            assert!(
                tail <= oldest,
                "tail {tail:?} passed the AIL's oldest item {oldest:?}"
            );
        }
    }

    /// One line on the log's space for reports of stuck requests (the daemon's watchdog):
    /// head, tail, durable tail, bytes granted and kept, reservations waiting, the AIL's
    /// size and the oldest item, which holds the tail.
    pub fn space_report(&self) -> String {
        let space = self.inner.space.lock();
        let line = format!(
            "head {:?} tail {:?} durable tail {:?} used {} granted {} kept {} of {} bytes, \
             {} waiting",
            space.head,
            space.tail,
            space.durable_tail,
            space.used_bytes(&self.inner.layout),
            space.grant_bytes,
            space.kept_bytes,
            space.capacity_bytes,
            space.next_ticket - space.serving_ticket
        );
        drop(space);
        let ail = self.inner.ail.lock();
        format!(
            "{line}; AIL {} items, oldest {}",
            ail.len(),
            ail.describe_oldest()
        )
    }

    /// The current head and tail (in memory) of the log.
    pub fn head_and_tail(&self) -> (Lsn, Lsn) {
        let space = self.inner.space.lock();
        (space.head, space.tail)
    }

    /// Intents whose done item is not durable yet (the allocator's work in progress).
    pub fn pending_intents(&self) -> Vec<crate::PendingIntent> {
        self.inner.ail.lock().intents()
    }

    /// Items in the AIL.
    pub fn ail_len(&self) -> usize {
        self.inner.ail.lock().len()
    }

    /// The geometry the journal was opened with.
    pub fn geometry(&self) -> &Geometry {
        &self.inner.geometry
    }

    /// The buffer cache the journal's transactions use.
    pub fn cache(&self) -> &Arc<BufferCache> {
        &self.inner.cache
    }

    fn stop_worker(&mut self) {
        self.inner.worker.lock().stop = true;
        self.inner.worker_wake.notify_all();
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        self.stop_worker();
    }
}

fn spawn_worker(inner: Arc<Inner>) -> Result<JoinHandle<()>, JournalError> {
    std::thread::Builder::new()
        .name("cairn-log".into())
        .spawn(move || inner.worker_loop())
        .map_err(|error| JournalError::Shutdown {
            reason: format!("cannot start the log thread: {error}"),
        })
}

impl Inner {
    pub(crate) fn check_shutdown(&self) -> Result<(), JournalError> {
        match self.shutdown.lock().as_ref() {
            Some(reason) => Err(JournalError::Shutdown {
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Stops the journal: every later operation fails, and waiters wake up to see it. The
    /// first cause is kept (for `Journal::shutdown_reason`) and logged at error level; later
    /// ones are consequences.
    pub(crate) fn shut_down(&self, reason: String) {
        {
            let mut shutdown = self.shutdown.lock();
            if shutdown.is_none() {
                tracing::error!(%reason, "the filesystem shut down: {reason}");
                *shutdown = Some(reason);
            }
        }
        self.space_changed.notify_all();
        self.completed_changed.notify_all();
        self.writer_turn.notify_all();
        self.cil_switched.notify_all();
        self.worker_wake.notify_all();
    }

    fn fail<T>(&self, error: JournalError) -> Result<T, JournalError> {
        self.shut_down(error.to_string());
        Err(error)
    }

    /// After recovery: relog unfinished intents into a first checkpoint, or mark a recovered
    /// log clean, so the next crash does not replay the same checkpoints again.
    fn settle_after_recovery(&self, report: &RecoveryReport) -> Result<(), JournalError> {
        if !report.unfinished_intents.is_empty() {
            let mut cil = self.cil.lock();
            for intent in &report.unfinished_intents {
                cil.insert_intent(intent.id, intent.work.clone());
            }
            let block = self.layout.block_size;
            let charge = cil.current.charge(block) - checkpoint_bytes_max(0, block);
            drop(cil);
            self.space.lock().grant_bytes += charge;
            let current = self.cil.lock().sequence();
            return self.force(current);
        }
        if !report.clean && report.records > 0 {
            return self.write_marker(true);
        }
        Ok(())
    }

    fn reserve(&self, reservation: Reservation) -> Result<(), JournalError> {
        self.check_shutdown()?;
        self.check_size(reservation)?;
        let ticket = {
            let mut space = self.space.lock();
            if !space.has_waiters() && space.fits(&self.layout, reservation.bytes) {
                space.grant_bytes += reservation.bytes;
                return Ok(());
            }
            space.next_ticket += 1;
            space.next_ticket - 1
        };
        bump(&self.stats.reservation_waits, 1);
        let result = self.wait_for_space(ticket, reservation.bytes);
        let mut space = self.space.lock();
        space.serving_ticket += 1;
        if result.is_ok() {
            space.grant_bytes += reservation.bytes;
        }
        drop(space);
        self.space_changed.notify_all();
        result
    }

    /// Refuses a reservation larger than a quarter of the log.
    fn check_size(&self, reservation: Reservation) -> Result<(), JournalError> {
        let max_bytes = self.layout.log_bytes() / 4;
        if reservation.bytes > max_bytes {
            return Err(JournalError::ReservationTooLarge {
                bytes: reservation.bytes,
                max_bytes,
            });
        }
        Ok(())
    }

    /// Grants a finishing transaction's reservation from the kept space, pushing while it
    /// waits for other finishing transactions to give theirs back.
    fn reserve_finishing(&self, reservation: Reservation) -> Result<(), JournalError> {
        self.check_shutdown()?;
        self.check_size(reservation)?;
        let mut stall = StallClock::new(&self.space.lock());
        loop {
            self.check_shutdown()?;
            {
                let mut space = self.space.lock();
                if space.fits_finishing(&self.layout, reservation.bytes) {
                    space.grant_bytes += reservation.bytes;
                    return Ok(());
                }
                if stall.stuck(&space) {
                    return Err(JournalError::NoProgress {
                        why: "no log space freed while a transaction finishing an intent waited",
                    });
                }
            }
            bump(&self.stats.reservation_waits, 1);
            self.make_space()?;
        }
    }

    /// Waits until ticket `ticket` is first in line and `bytes` fit, pushing as it waits.
    fn wait_for_space(&self, ticket: u64, bytes: u64) -> Result<(), JournalError> {
        let mut stall = StallClock::new(&self.space.lock());
        loop {
            self.check_shutdown()?;
            {
                let mut space = self.space.lock();
                if space.serving_ticket == ticket && space.fits(&self.layout, bytes) {
                    return Ok(());
                }
                if stall.stuck(&space) {
                    return Err(JournalError::NoProgress {
                        why: "no log space freed while a reservation waited",
                    });
                }
                if space.serving_ticket != ticket {
                    let slice = Duration::from_millis(WAIT_SLICE_MS);
                    space.wait_for(&self.space_changed, slice);
                    continue;
                }
            }
            self.make_space()?;
        }
    }

    /// Frees log space: checkpoints the CIL (its items may pin the oldest AIL entries), writes
    /// the AIL home, and records the new tail durably so the head may use the space.
    fn make_space(&self) -> Result<(), JournalError> {
        if !self.cil.lock().current.items.is_empty() {
            self.push_cil()?;
        }
        let head = self.space.lock().head;
        self.push_ail(head)?;
        let (tail, durable_tail) = {
            let space = self.space.lock();
            (space.tail, space.durable_tail)
        };
        if tail > durable_tail {
            self.write_marker(false)?;
        } else {
            let mut space = self.space.lock();
            let slice = Duration::from_millis(WAIT_SLICE_MS);
            space.wait_for(&self.space_changed, slice);
        }
        Ok(())
    }

    /// Returns `reservation` and charges what the commit added to the CIL instead.
    pub(crate) fn settle_grant(&self, reserved: u64, used: u64) {
        let mut space = self.space.lock();
        space.grant_bytes = (space.grant_bytes + used).saturating_sub(reserved);
        drop(space);
        self.space_changed.notify_all();
    }

    /// After a delayed commit: wake the background thread past the threshold, and throttle
    /// (or push, without a background thread) past twice the threshold.
    pub(crate) fn after_commit(&self, sequence: u64, items_bytes: u64) -> Result<(), JournalError> {
        if items_bytes < self.push_threshold {
            return Ok(());
        }
        if !self.config.background {
            self.push_cil()?;
            return Ok(());
        }
        self.kick_worker();
        let hard = self.push_threshold * crate::config::CIL_THROTTLE_MULTIPLE;
        if items_bytes < hard {
            return Ok(());
        }
        let mut cil = self.cil.lock();
        while cil.sequence() == sequence {
            self.check_shutdown()?;
            cil.wait_for(&self.cil_switched, Duration::from_millis(WAIT_SLICE_MS));
        }
        Ok(())
    }

    fn kick_worker(&self) {
        self.worker.lock().kicked = true;
        self.worker_wake.notify_all();
    }

    fn force(&self, sequence: u64) -> Result<(), JournalError> {
        self.check_shutdown()?;
        bump(&self.stats.forces, 1);
        if sequence >= self.cil.lock().sequence() {
            self.push_cil()?;
        }
        let mut completed = self.completed.lock();
        while *completed < sequence {
            self.check_shutdown()?;
            completed.wait_for(
                &self.completed_changed,
                Duration::from_millis(WAIT_SLICE_MS),
            );
        }
        Ok(())
    }

    /// Detaches the current context and writes it as a checkpoint; returns its sequence.
    pub(crate) fn push_cil(&self) -> Result<u64, JournalError> {
        self.check_shutdown()?;
        let context = {
            let mut cil = self.cil.lock();
            let context = cil.switch();
            // The new context's fixed overhead (headers, commit record, wrap filler).
            self.space.lock().grant_bytes += checkpoint_bytes_max(0, self.layout.block_size);
            context
        };
        self.cil_switched.notify_all();
        let sequence = context.sequence;
        self.write_context(context)?;
        Ok(sequence)
    }

    /// Writes `context` as a checkpoint and completes it. Formatting happens outside every
    /// lock; data records are written in sequence order, at most `CHECKPOINTS_IN_FLIGHT_MAX`
    /// checkpoints ahead of the oldest uncommitted one; commit records in sequence order.
    fn write_context(&self, context: Context) -> Result<(), JournalError> {
        match self.write_context_steps(&context) {
            Ok(()) => Ok(()),
            // Later pushes wait for this one's turns; shutting down releases them with an error.
            Err(error) => self.fail(error),
        }
    }

    fn write_context_steps(&self, context: &Context) -> Result<(), JournalError> {
        let items = match context.items.is_empty() {
            true => Vec::new(),
            false => encode_context(context)?,
        };
        let data = self.write_data(context, &items)?;
        let mut writer = self.writer.lock();
        while writer.next_commit_sequence < context.sequence {
            self.check_shutdown()?;
            writer.wait_for(&self.writer_turn, Duration::from_millis(WAIT_SLICE_MS));
        }
        drop(writer);
        let finished = match data {
            Some(written) => self.commit_checkpoint(context, written),
            None => {
                self.settle_grant(context.charge(self.layout.block_size), 0);
                Ok(())
            }
        };
        self.writer.lock().next_commit_sequence = context.sequence + 1;
        self.writer_turn.notify_all();
        finished?;
        let mut completed = self.completed.lock();
        *completed = (*completed).max(context.sequence);
        drop(completed);
        self.completed_changed.notify_all();
        let hook = self.completion_hook.0.lock().clone();
        if let Some(hook) = hook {
            hook(context.sequence);
        }
        Ok(())
    }

    /// Waits for the data turn of `context`, then writes its data records (none for an empty
    /// context) and, if it orders earlier device writes, flushes the device outside the
    /// writer lock, so later checkpoints write theirs meanwhile. Returns what was written,
    /// `None` for an empty context.
    ///
    /// The log itself needs no flush here: recovery walks records from the tail while each
    /// one is valid and names its predecessor, so a commit record that reached the disk
    /// without its data records lies past the walk's end and is never replayed.
    fn write_data(
        &self,
        context: &Context,
        items: &[Vec<u8>],
    ) -> Result<Option<Written>, JournalError> {
        let sequence = context.sequence;
        let mut writer = self.writer.lock();
        while writer.next_data_sequence < sequence
            || sequence >= writer.next_commit_sequence + CHECKPOINTS_IN_FLIGHT_MAX
        {
            self.check_shutdown()?;
            writer.wait_for(&self.writer_turn, Duration::from_millis(WAIT_SLICE_MS));
        }
        debug_assert_eq!(writer.next_data_sequence, sequence, "data turn");
        let result = match items.is_empty() {
            true => Ok(None),
            false => {
                let start = self.layout.lsn(writer.head);
                self.space.lock().in_flight.insert(sequence, start);
                let tail = self.record_tail(start);
                let device = self.device.as_ref();
                writer
                    .write_data(device, &self.layout, sequence, items, tail)
                    .map(Some)
            }
        };
        writer.next_data_sequence = sequence + 1;
        drop(writer);
        self.writer_turn.notify_all();
        let mut written = result?;
        if let Some(written) = written.as_mut()
            && context.orders_data
        {
            // The data a transaction made reachable must be durable before its commit record.
            crate::writer::flush(self.device.as_ref(), written)?;
        }
        Ok(written)
    }

    /// The tail a record written now carries: the oldest of the AIL, the checkpoints in
    /// flight, and `own` (the record's LSN). Called under the writer lock, so records carry
    /// non-decreasing tails in log order.
    fn record_tail(&self, own: Lsn) -> Lsn {
        let ail = self.ail.lock().min_lsn();
        let in_flight = self.space.lock().in_flight_min();
        [ail, in_flight].into_iter().flatten().fold(own, Lsn::min)
    }

    /// With the commit turn held: writes and flushes the commit record of `context`, whose
    /// data records are durable, then completes it (AIL, unpin, space).
    fn commit_checkpoint(
        &self,
        context: &Context,
        mut written: Written,
    ) -> Result<(), JournalError> {
        let charge = context.charge(self.layout.block_size);
        let mut writer = self.writer.lock();
        let tail = self.record_tail(written.start);
        let device = self.device.as_ref();
        let result =
            writer.write_commit(device, &self.layout, context.sequence, tail, &mut written);
        let head = self.layout.lsn(writer.head);
        drop(writer);
        result?;
        crate::writer::flush(device, &mut written)?;
        if written.bytes > charge {
            return Err(JournalError::ReservationOverrun {
                used_bytes: written.bytes,
                reserved_bytes: charge,
            });
        }
        self.account_written(&written);
        bump(&self.stats.checkpoints, 1);
        self.complete(context, written.start);
        let mut space = self.space.lock();
        space.in_flight.remove(&context.sequence);
        space.head = space.head.max(head);
        space.grant_bytes = space.grant_bytes.saturating_sub(charge);
        space.durable_tail = space.durable_tail.max(written.tail.min(space.tail));
        drop(space);
        self.space_changed.notify_all();
        Ok(())
    }

    fn account_written(&self, written: &Written) {
        bump(&self.stats.log_bytes, written.bytes);
        bump(&self.stats.log_writes, written.writes);
        bump(&self.stats.log_flushes, written.flushes);
    }

    /// A durable checkpoint's items enter the AIL at its LSN (moving relogged ones), then its
    /// buffers are unpinned, so the pusher never sees an unpinned buffer missing from the AIL.
    fn complete(&self, context: &Context, lsn: Lsn) {
        let mut ail = self.ail.lock();
        for (key, vector) in &context.items {
            match vector {
                Vector::Buffer(buffer) => match buffer.pinned.last() {
                    Some(handle) if !buffer.regions.is_empty() || buffer.create.is_some() => {
                        let item = AilItem::Buffer {
                            handle: handle.clone(),
                            spec: buffer.spec,
                        };
                        ail.insert_keep_oldest(*key, lsn, item);
                    }
                    _ => {
                        ail.remove(*key);
                    }
                },
                Vector::Inode { image } => {
                    let item = AilItem::Inode {
                        image: image.clone(),
                        version: 0,
                        flushed: None,
                    };
                    ail.insert(*key, lsn, item);
                }
                Vector::Intent { work } => {
                    let item = AilItem::Intent { work: work.clone() };
                    ail.insert(*key, lsn, item);
                }
                Vector::Done { .. } => {
                    ail.remove(*key);
                }
            }
        }
        drop(ail);
        for vector in context.items.values() {
            if let Vector::Buffer(buffer) = vector {
                for handle in &buffer.pinned {
                    let unpinned = handle.unpin();
                    debug_assert!(unpinned.is_ok(), "unpinning {:?}", handle.key());
                }
            }
        }
    }

    /// Writes an item-less record carrying the current tail (an unmount record when
    /// `unmount`), making that tail durable.
    fn write_marker(&self, unmount: bool) -> Result<(), JournalError> {
        let mut writer = self.writer.lock();
        let tail = self.record_tail(self.layout.lsn(writer.head));
        let result = writer.write_marker(self.device.as_ref(), &self.layout, Some(tail), unmount);
        let written = match result {
            Ok(written) => written,
            Err(error) => return self.fail(error),
        };
        self.account_written(&written);
        bump(&self.stats.marker_records, 1);
        let head = self.layout.lsn(writer.head);
        drop(writer);
        let mut space = self.space.lock();
        space.head = space.head.max(head);
        space.advance_tail(written.tail);
        space.durable_tail = space.durable_tail.max(written.tail.min(space.tail));
        space.covering_marker = (written.tail == written.start).then_some((written.start, head));
        drop(space);
        self.space_changed.notify_all();
        Ok(())
    }
}

/// The context's items encoded back to back, opened by its start item.
fn encode_context(context: &Context) -> Result<Vec<Vec<u8>>, JournalError> {
    let mut items = Vec::with_capacity(context.items.len() + 1);
    let mut start = Vec::new();
    let sequence = context.sequence;
    encode_items(&[LogItem::CheckpointStart { sequence }], &mut start)?;
    items.push(start);
    for (key, vector) in &context.items {
        for item in vector.to_log_items(*key) {
            let mut raw = Vec::new();
            encode_items(&[item], &mut raw)?;
            items.push(raw);
        }
    }
    Ok(items)
}

impl Inner {
    /// Writes home the AIL items with LSN at most `target` and moves the tail past those that
    /// reached the disk. Buffers still pinned by the CIL are left for after its next push.
    pub(crate) fn push_ail(&self, target: Lsn) -> Result<(), JournalError> {
        let _serial = self.push_lock.lock();
        bump(&self.stats.ail_pushes, 1);
        let items = self.ail.lock().up_to(target);
        for (key, lsn, item) in &items {
            self.push_item(*key, *lsn, item)?;
        }
        if let Err(error) = self.cache.flush_delwri() {
            return self.fail(error.into());
        }
        if let Err(source) = self.device.flush() {
            return self.fail(JournalError::device("metadata flush", 0, source));
        }
        self.sweep(&items);
        let ail_min = self.ail.lock().min_lsn();
        let mut space = self.space.lock();
        let head = space.head;
        space.advance_tail(ail_min.unwrap_or(head));
        drop(space);
        self.space_changed.notify_all();
        Ok(())
    }

    /// Queues one AIL item for writeback (buffers) or copies it into its cluster (inodes).
    fn push_item(&self, key: ItemKey, lsn: Lsn, item: &AilItem) -> Result<(), JournalError> {
        match (key, item) {
            (_, AilItem::Buffer { handle, spec }) => {
                if handle.is_stale() || handle.pin_count() > 0 || !handle.is_dirty() {
                    return Ok(());
                }
                match self.cache.try_get(handle.key(), spec) {
                    Ok(mut guard) => {
                        guard.set_lsn(lsn);
                        guard.queue_delwri();
                        bump(&self.stats.ail_items_pushed, 1);
                        Ok(())
                    }
                    Err(BufCacheError::WouldBlock { .. }) => Ok(()),
                    Err(error) => Err(error.into()),
                }
            }
            (
                ItemKey::Inode(inode),
                AilItem::Inode {
                    image,
                    version,
                    flushed,
                },
            ) => {
                if flushed
                    .as_ref()
                    .is_some_and(|(_, copied)| copied == version)
                {
                    return Ok(());
                }
                self.copy_inode(inode, lsn, image, *version)
            }
            _ => Ok(()),
        }
    }

    /// Copies a durable inode image (its LSN stamped in) into its cluster buffer and queues
    /// the buffer; the inode item leaves the AIL once that buffer is clean.
    fn copy_inode(
        &self,
        inode: InodeNumber,
        lsn: Lsn,
        image: &[u8],
        version: u64,
    ) -> Result<(), JournalError> {
        let (key, offset) = self.cluster_of(inode)?;
        let mut guard = match self.cache.try_get(key, &self.cluster_spec) {
            Ok(guard) => guard,
            Err(BufCacheError::WouldBlock { .. }) => return Ok(()),
            Err(error) => return Err(error.into()),
        };
        let mut stamped = image.to_vec();
        // The header's LSN field (bytes 16..24): recovery compares it with checkpoint LSNs.
        if stamped.len() < cairn_format::HEADER_SIZE {
            let why = "image too short for a header";
            return Err(JournalError::BadInode {
                inode: inode.0,
                why,
            });
        }
        stamped[16..24].copy_from_slice(&lsn.0.to_le_bytes());
        guard.write(offset, &stamped)?;
        // The copy is not a change to log: it repeats what the log already holds.
        guard.take_dirty_ranges();
        guard.queue_delwri();
        bump(&self.stats.ail_items_pushed, 1);
        let handle = guard.handle();
        drop(guard);
        if let Some((
            current,
            AilItem::Inode {
                version: now,
                flushed,
                ..
            },
        )) = self.ail.lock().get_mut(ItemKey::Inode(inode))
            && *now == version
            && *current == lsn
        {
            *flushed = Some((handle, version));
        }
        Ok(())
    }

    /// The cluster buffer holding `inode`, and the inode's byte offset in it.
    pub(crate) fn cluster_of(&self, inode: InodeNumber) -> Result<(BufKey, usize), JournalError> {
        let (block, offset) =
            self.geometry
                .inode_position(inode)
                .ok_or(JournalError::BadInode {
                    inode: inode.0,
                    why: "outside the filesystem",
                })?;
        let cluster = u64::from(self.config.inode_cluster_blocks);
        let ag_start = self.geometry.ag_start(self.geometry.ag_of(block).0);
        let first = block.0 - (block.0 - ag_start) % cluster;
        let offset = offset + ((block.0 - first) * self.layout.block_size) as usize;
        let key = BufKey::new(
            cairn_format::FsBlock(first),
            self.config.inode_cluster_blocks,
        );
        Ok((key, offset))
    }

    /// Drops the pushed items whose home copies are now clean on stable storage.
    fn sweep(&self, items: &[(ItemKey, Lsn, AilItem)]) {
        let mut ail = self.ail.lock();
        for (key, _, _) in items {
            let done = match ail.get_mut(*key) {
                Some((_, AilItem::Buffer { handle, .. })) => {
                    handle.is_stale() || (!handle.is_dirty() && handle.pin_count() == 0)
                }
                Some((
                    _,
                    AilItem::Inode {
                        version, flushed, ..
                    },
                )) => flushed.as_ref().is_some_and(|(handle, copied)| {
                    copied == version && !handle.is_dirty() && handle.pin_count() == 0
                }),
                _ => false,
            };
            if done {
                ail.remove(*key);
            }
        }
    }

    /// The background thread: timer and threshold checkpoints, and AIL pushes that keep a
    /// quarter of the log free.
    fn worker_loop(&self) {
        let interval = Duration::from_millis(self.config.checkpoint_interval_ms.max(1));
        let mut last_push = Instant::now();
        loop {
            {
                let mut state = self.worker.lock();
                if !state.stop && !state.kicked {
                    state.wait_for(&self.worker_wake, interval.min(Duration::from_millis(100)));
                }
                if state.stop {
                    return;
                }
                state.kicked = false;
            }
            if self.check_shutdown().is_err() {
                return;
            }
            let timer = last_push.elapsed() >= interval;
            if let Err(error) = self.background_step(timer) {
                self.shut_down(format!("background log work failed: {error}"));
                return;
            }
            if timer {
                last_push = Instant::now();
            }
        }
    }

    fn background_step(&self, timer: bool) -> Result<(), JournalError> {
        let items_bytes = self.cil.lock().current.items_bytes;
        if items_bytes >= self.push_threshold || (timer && items_bytes > 0) {
            self.push_cil()?;
        }
        let (used, capacity, head, tail) = {
            let space = self.space.lock();
            let used = space.used_bytes(&self.layout) + space.grant_bytes;
            (used, space.capacity_bytes, space.head, space.tail)
        };
        let short = used > capacity - capacity / AIL_FREE_TARGET_DIVISOR;
        if short || timer {
            let target = self.push_target(tail, head, timer);
            self.push_ail(target)?;
            let space = self.space.lock();
            let moved = space.tail > space.durable_tail && !space.covered();
            drop(space);
            if moved && (short || timer) {
                self.write_marker(false)?;
            }
        }
        Ok(())
    }

    /// The LSN up to which the AIL is pushed: a quarter of the log past the tail when short of
    /// space (or everything on the timer).
    fn push_target(&self, tail: Lsn, head: Lsn, everything: bool) -> Lsn {
        if everything {
            return head;
        }
        let quarter = self.layout.log_blocks / AIL_FREE_TARGET_DIVISOR;
        let target = self.layout.advance(self.layout.position(tail), quarter);
        self.layout.lsn(target).min(head)
    }
}
