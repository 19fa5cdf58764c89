//! Transactions: buffers joined (and kept locked) until commit or cancel, logical inode
//! images, and extent-free intents and done items.

use std::sync::atomic::Ordering;

use cairn_bufcache::{BufGuard, BufKey, ReadSpec};
use cairn_format::limits::LOG_INTENT_EXTENTS_MAX;
use cairn_format::log::{FreeExtent, InodeCreate, RefcountUpdate, ShiftIntent};
use cairn_format::{InodeNumber, Lsn};

use crate::JournalError;
use crate::cil::BufferCommit;
use crate::config::LogMode;
use crate::item::{CommitSequence, IntentId, IntentKind, IntentWork};
use crate::journal::Journal;
use crate::reservation::Reservation;
use crate::stats::bump;

/// A joined buffer: locked for the transaction's lifetime.
#[derive(Debug)]
struct Joined<'j> {
    guard: BufGuard<'j>,
    spec: ReadSpec,
    /// Freed earlier in this transaction, then created again.
    recreated: bool,
    /// Created as a new inode cluster: logged as this item, not as its bytes.
    create: Option<InodeCreate>,
}

/// One transaction; see the module documentation. Dropping it unfinished is a cancel.
#[derive(Debug)]
pub struct Transaction<'j> {
    journal: &'j Journal,
    reservation: Reservation,
    joined: Vec<Joined<'j>>,
    inodes: Vec<(InodeNumber, Vec<u8>)>,
    intents: Vec<(IntentId, IntentWork)>,
    dones: Vec<(IntentId, IntentKind)>,
    /// Whether device writes that completed before the commit must be durable before its
    /// checkpoint's commit record (see `orders_no_data`).
    orders_data: bool,
    finished: bool,
}

impl<'j> Transaction<'j> {
    pub(crate) fn new(journal: &'j Journal, reservation: Reservation) -> Self {
        Self {
            journal,
            reservation,
            joined: Vec::new(),
            inodes: Vec::new(),
            intents: Vec::new(),
            dones: Vec::new(),
            orders_data: true,
            finished: false,
        }
    }

    /// The reservation this transaction holds.
    pub fn reservation(&self) -> Reservation {
        self.reservation
    }

    fn position(&self, key: BufKey) -> Result<Option<usize>, JournalError> {
        let Some(index) = self
            .joined
            .iter()
            .position(|j| j.guard.block() == key.block)
        else {
            return Ok(None);
        };
        let joined_blocks = self.joined[index].guard.key().block_count;
        if joined_blocks != key.block_count {
            return Err(JournalError::LengthMismatch { key, joined_blocks });
        }
        Ok(Some(index))
    }

    /// The buffer at `key`, read and verified if not cached, locked and joined to this
    /// transaction; the joined guard if it is joined already.
    #[track_caller]
    pub fn get_buf(
        &mut self,
        key: BufKey,
        spec: &ReadSpec,
    ) -> Result<&mut BufGuard<'j>, JournalError> {
        let index = match self.position(key)? {
            Some(index) => index,
            None => {
                let guard = self.journal.inner.cache.get(key, spec)?;
                self.joined.push(Joined {
                    guard,
                    spec: *spec,
                    recreated: false,
                    create: None,
                });
                self.joined.len() - 1
            }
        };
        Ok(&mut self.joined[index].guard)
    }

    /// A newly allocated block: zeroed, joined, and logged whole at commit (so recovery never
    /// depends on what the block held before).
    #[track_caller]
    pub fn get_new_buf(
        &mut self,
        key: BufKey,
        spec: &ReadSpec,
    ) -> Result<&mut BufGuard<'j>, JournalError> {
        let cache = &self.journal.inner.cache;
        let index = match self.position(key)? {
            Some(index) if self.joined[index].guard.is_stale() => {
                self.joined[index].guard = cache.get_new(key, spec)?;
                self.joined[index].recreated = true;
                index
            }
            Some(index) => {
                let len = self.joined[index].guard.len();
                self.joined[index].guard.bytes_mut(0..len)?.fill(0);
                index
            }
            None => {
                let guard = cache.get_new(key, spec)?;
                self.joined.push(Joined {
                    guard,
                    spec: *spec,
                    recreated: false,
                    create: None,
                });
                self.joined.len() - 1
            }
        };
        let joined = &mut self.joined[index];
        joined.spec = *spec;
        joined.create = None;
        let len = joined.guard.len();
        joined.guard.mark_dirty(0..len)?;
        Ok(&mut joined.guard)
    }

    /// A new inode cluster at `key`: every inode in it free, of `generation`, numbered from
    /// `first_inode` (which must be the cluster's first inode). Joined like `get_new_buf`, but
    /// logged as one inode create item of a few dozen bytes instead of the whole buffer
    /// (XFS's icreate); later writes to the guard are logged as usual. The AIL writes the
    /// buffer home like any other, and replay re-creates only inodes not newer at home.
    #[track_caller]
    pub fn get_new_inode_cluster(
        &mut self,
        key: BufKey,
        spec: &ReadSpec,
        first_inode: InodeNumber,
        generation: u32,
    ) -> Result<&mut BufGuard<'j>, JournalError> {
        let inner = &self.journal.inner;
        let geometry = &inner.geometry;
        let create = InodeCreate {
            first_inode: first_inode.0,
            block_bytes: key.block_count * geometry.block_size,
            inode_size: geometry.inode_size,
            generation,
        };
        if !crate::inode_ops::create_fits(geometry, key.block, &create) {
            let why = "not the first inode of this inode cluster";
            return Err(JournalError::BadInode {
                inode: first_inode.0,
                why,
            });
        }
        self.get_new_buf(key, spec)?;
        let index = self.position(key)?.ok_or(JournalError::NotJoined { key })?;
        let joined = &mut self.joined[index];
        let size = create.inode_size as usize;
        let len = joined.guard.len();
        let bytes = joined.guard.bytes_mut(0..len)?;
        for (slot, raw) in bytes.chunks_exact_mut(size).enumerate() {
            let number = create.first_inode + slot as u64;
            crate::inode_ops::write_free_inode(raw, number, spec.uuid, generation, Lsn::ZERO);
        }
        // The item stands for these bytes; only later changes are logged as regions.
        joined.guard.take_dirty_ranges();
        joined.create = Some(create);
        Ok(&mut joined.guard)
    }

    /// How many buffers are joined: a mark for `release_unchanged_since`.
    pub fn joined_count(&self) -> usize {
        self.joined.len()
    }

    /// Unlocks the buffers joined after `mark` that this transaction has not changed (no
    /// changed ranges, not new, not freed): nothing of them would be logged, so letting
    /// another transaction have them changes nothing this one did. Returns whether every
    /// buffer joined after `mark` went.
    pub fn release_unchanged_since(&mut self, mark: usize) -> bool {
        let from = mark.min(self.joined.len());
        let changed: Vec<Joined<'j>> = self
            .joined
            .drain(from..)
            .filter(|joined| {
                !joined.guard.dirty_ranges().is_empty()
                    || joined.guard.is_stale()
                    || joined.recreated
                    || joined.create.is_some()
            })
            .collect();
        let all_released = changed.is_empty();
        self.joined.extend(changed);
        all_released
    }

    /// The joined guard of `key`, if joined.
    pub fn buf_mut(&mut self, key: BufKey) -> Option<&mut BufGuard<'j>> {
        let index = self.position(key).ok().flatten()?;
        Some(&mut self.joined[index].guard)
    }

    /// Frees the metadata block of a joined buffer: it turns stale (never written home) and
    /// the commit logs a cancel record so recovery replays no earlier image of it.
    pub fn invalidate_buf(&mut self, key: BufKey) -> Result<(), JournalError> {
        let index = self.position(key)?.ok_or(JournalError::NotJoined { key })?;
        self.joined[index].guard.mark_stale();
        Ok(())
    }

    /// Logs the whole image of inode `inode` (a logical inode item). A later image of the same
    /// inode in this transaction replaces it. Checked at commit.
    pub fn log_inode(&mut self, inode: InodeNumber, image: &[u8]) {
        match self.inodes.iter_mut().find(|(number, _)| *number == inode) {
            Some((_, old)) => *old = image.to_vec(),
            None => self.inodes.push((inode, image.to_vec())),
        }
    }

    /// Logs the intent to free `extents`; a later transaction logs its done item.
    pub fn log_free_intent(&mut self, extents: &[FreeExtent]) -> IntentId {
        self.log_intent(IntentWork::Free(extents.to_vec()))
    }

    /// Logs the intent to apply refcount `updates` (reflink); a later transaction applies
    /// them and logs the done item (`log_refcount_done`).
    pub fn log_refcount_intent(&mut self, updates: &[RefcountUpdate]) -> IntentId {
        self.log_intent(IntentWork::Refcount(updates.to_vec()))
    }

    /// Logs a collapse or insert range in progress (`shift`); each later step logs the done
    /// item of the previous intent and a new one, the last only the done item
    /// (`log_shift_done`).
    pub fn log_shift_intent(&mut self, shift: &ShiftIntent) -> IntentId {
        self.log_intent(IntentWork::Shift(*shift))
    }

    fn log_intent(&mut self, work: IntentWork) -> IntentId {
        let id = IntentId(
            self.journal
                .inner
                .next_intent
                .fetch_add(1, Ordering::Relaxed),
        );
        self.intents.push((id, work));
        id
    }

    /// Logs that the extent-free intent `intent` is finished.
    pub fn log_free_done(&mut self, intent: IntentId) {
        self.dones.push((intent, IntentKind::Free));
    }

    /// Logs that the refcount intent `intent` is finished.
    pub fn log_refcount_done(&mut self, intent: IntentId) {
        self.dones.push((intent, IntentKind::Refcount));
    }

    /// Logs that the shift intent `intent` is finished (or superseded by a newer one).
    pub fn log_shift_done(&mut self, intent: IntentId) {
        self.dones.push((intent, IntentKind::Shift));
    }

    /// Declares that this transaction makes no device write before it reachable: no block
    /// becomes written or mapped, no size grows (an overwrite in place, which logs only the
    /// inode's times). A checkpoint holding only such transactions writes its commit record
    /// without flushing the device first; its one flush after the commit record still makes
    /// everything before it durable. By default a transaction orders earlier writes: its
    /// checkpoint flushes before its commit record, so a crash never shows a mapping or size
    /// over data that did not reach the disk.
    pub fn orders_no_data(&mut self) {
        self.orders_data = false;
    }

    fn is_dirty(&self) -> bool {
        let buffers = self.joined.iter().any(|j| {
            !j.guard.dirty_ranges().is_empty()
                || j.guard.is_stale()
                || j.recreated
                || j.create.is_some()
        });
        buffers || !self.inodes.is_empty() || !self.intents.is_empty() || !self.dones.is_empty()
    }

    fn check_items(&self) -> Result<(), JournalError> {
        let geometry = &self.journal.inner.geometry;
        for (inode, image) in &self.inodes {
            if image.len() != geometry.inode_size as usize {
                let why = "image size differs from the inode size";
                return Err(JournalError::BadInode {
                    inode: inode.0,
                    why,
                });
            }
            self.journal.inner.cluster_of(*inode)?;
        }
        for (_, work) in &self.intents {
            if work.len() > LOG_INTENT_EXTENTS_MAX {
                let (count, max) = (work.len(), LOG_INTENT_EXTENTS_MAX);
                return Err(JournalError::TooManyExtents { count, max });
            }
        }
        Ok(())
    }

    /// Commits: formats every change into the CIL (replacing earlier copies), releases the
    /// buffers and returns the unused reservation. No I/O in delayed mode; in sync mode the
    /// commit is durable on return.
    pub fn commit(mut self) -> Result<CommitSequence, JournalError> {
        self.finished = true;
        let inner = &self.journal.inner;
        inner.check_shutdown()?;
        if let Err(error) = self.check_items() {
            self.release_reservation();
            return Err(error);
        }
        if !self.is_dirty() {
            self.release_reservation();
            return Ok(CommitSequence(inner.cil.lock().sequence()));
        }
        let sync = (inner.config.mode == LogMode::Sync).then(|| inner.sync_commit.lock());
        let (sequence, items_bytes, used, shrunk) = self.insert_into_cil();
        self.joined.clear();
        bump(&inner.stats.commits, 1);
        // A shrink of the context's charge is given back too: the context's write returns
        // only its final charge, so a shrink kept in the grant would never leave it (a leak
        // that grew with every intent finished in its own checkpoint until no reservation
        // fitted an empty log: the mount stress runs' hang).
        inner.settle_grant(self.reservation.bytes + shrunk, used);
        if used > self.reservation.bytes {
            let error = JournalError::ReservationOverrun {
                used_bytes: used,
                reserved_bytes: self.reservation.bytes,
            };
            inner.shut_down(error.to_string());
            return Err(error);
        }
        match sync {
            Some(_guard) => {
                inner.push_cil()?;
            }
            None => inner.after_commit(sequence, items_bytes)?,
        }
        Ok(CommitSequence(sequence))
    }

    /// Under the CIL lock: every change into the current context. Returns the context's
    /// sequence, its item bytes, and the bytes this commit added to its charge and took off
    /// it (a done item whose intent is in the same context removes both: the charge shrinks).
    fn insert_into_cil(&mut self) -> (u64, u64, u64, u64) {
        let inner = &self.journal.inner;
        let block = u64::from(inner.geometry.block_size);
        let mut cil = inner.cil.lock();
        let before = cil.current.charge(block);
        let (mut logged, mut relogged) = (0u64, 0u64);
        for joined in &mut self.joined {
            let ranges = joined.guard.take_dirty_ranges();
            let changed = joined.guard.is_stale() || joined.recreated || joined.create.is_some();
            if ranges.is_empty() && !changed {
                continue;
            }
            let commit = BufferCommit {
                guard: &joined.guard,
                spec: joined.spec,
                ranges,
                recreated: joined.recreated,
                create: joined.create,
            };
            logged += 1;
            relogged += u64::from(cil.insert_buffer(commit));
        }
        for (inode, image) in self.inodes.drain(..) {
            logged += 1;
            relogged += u64::from(cil.insert_inode(inode, image));
        }
        for (id, work) in self.intents.drain(..) {
            logged += 1;
            cil.insert_intent(id, work);
        }
        for (id, kind) in self.dones.drain(..) {
            logged += 1;
            cil.insert_done(id, kind);
        }
        if cil.current.commits == 0 {
            cil.current.first_commit_at = Some(std::time::Instant::now());
        }
        cil.current.commits += 1;
        cil.current.orders_data |= self.orders_data;
        let after = cil.current.charge(block);
        let result = (
            cil.sequence(),
            cil.current.items_bytes,
            after.saturating_sub(before),
            before.saturating_sub(after),
        );
        drop(cil);
        bump(&inner.stats.items_logged, logged);
        bump(&inner.stats.items_relogged, relogged);
        result
    }

    fn release_reservation(&mut self) {
        self.journal.inner.settle_grant(self.reservation.bytes, 0);
        self.reservation = Reservation::new(0);
    }

    /// Ends a transaction that changed nothing: its buffers are released and its reservation
    /// returned. Cancelling a dirty transaction shuts the journal down (its changes are in
    /// memory but would never be logged) and returns `Shutdown`.
    pub fn cancel(mut self) -> Result<(), JournalError> {
        self.finished = true;
        self.abandon()
    }

    fn abandon(&mut self) -> Result<(), JournalError> {
        let dirty = self.is_dirty();
        self.joined.clear();
        self.release_reservation();
        if dirty {
            let reason = "a dirty transaction was cancelled".to_string();
            self.journal.inner.shut_down(reason.clone());
            return Err(JournalError::Shutdown { reason });
        }
        Ok(())
    }
}

impl Drop for Transaction<'_> {
    fn drop(&mut self) {
        if !self.finished {
            let _ = self.abandon();
        }
    }
}
