//! The mounted filesystem: mount (with recovery and unfinished-intent processing), the
//! per-AG in-memory state, transactions, the inode cache, sync and unmount.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering};

use cairn_alloc::Allocator;
use cairn_blockdev::{AlignedBuf, BlockDevice, FileDevice, OpenOptions};
use cairn_bufcache::{BufKey, BufferCache, CacheConfig, HeaderOps, ReadSpec};
use cairn_format::limits::BLOCK_SIZE_MAX;
use cairn_format::superblock::FEATURES_INCOMPAT_KNOWN;
use cairn_format::{Agf, BtreeLayout, Geometry, InodeNumber, MetaKind, OnDisk, Superblock};
use cairn_journal::{
    IntentWork, Journal, JournalConfig, RecoveryReport, Reservation, inode_cluster_spec,
};

use crate::FsError;
use crate::glue::Tx;
use crate::inode::{Inode, InodeCache, InodeData, Verdict, home_matches};
use crate::types::{FsOpStats, FsStats, MountOptions, StatFs};

static AGF_OPS: HeaderOps = HeaderOps::new(MetaKind::Agf);

static SUPERBLOCK_OPS: HeaderOps = HeaderOps::new(MetaKind::Superblock);

/// Blocks every AG keeps for its inode trees (`Allocator::with_ag_reserve`): freeing an inode
/// can add a free-inode tree record (a chunk's first free inode), and an unlink must not fail
/// because data or inode chunks filled the AG (XFS reserves for its finobt the same way).
/// The size: the free-inode tree with a record for every chunk the AG could hold (blocks half
/// full), one split path of each inode tree, and the free-list refill their allocations cost.
pub(crate) fn inode_tree_reserve(geometry: &Geometry) -> u32 {
    let levels_max = cairn_format::limits::BTREE_LEVELS_MAX;
    let half_full = |level| {
        BtreeLayout::for_kind(MetaKind::FinoBtree, geometry.block_size)
            .map_or(2, |layout| (layout.capacity(level) as u64 / 2).max(2))
    };
    let chunks = u64::from(geometry.ag_blocks) / u64::from(geometry.chunk_blocks().max(1));
    let (mut level_blocks, mut blocks, mut levels) = (chunks.div_ceil(half_full(0)), 0, 1);
    while level_blocks > 1 && levels < levels_max {
        blocks += level_blocks;
        level_blocks = level_blocks.div_ceil(half_full(1));
        levels += 1;
    }
    blocks += 1;
    let free_list_refill = 2 * (levels_max + 1) + 2;
    let reserve = blocks + 2 * u64::from(levels + 1) + u64::from(free_list_refill);
    u32::try_from(reserve).unwrap_or(u32::MAX)
}

/// In-memory state of one AG's inodes (exact: changed under the AGI buffer lock).
#[derive(Debug)]
pub(crate) struct AgInodes {
    pub count: AtomicI64,
    pub free: AtomicI64,
    /// The `Filesystem::free_epoch` a chunk allocation here last failed in (`u64::MAX`:
    /// none): the AG may hold a chunk again once blocks were freed after that look.
    pub chunk_failed_epoch: AtomicU64,
    /// The AG's unlinked lists in memory (see `unlinked.rs`).
    pub unlinked: cairn_lockrank::Mutex<crate::unlinked::UnlinkedIndex>,
}

impl Default for AgInodes {
    fn default() -> Self {
        Self {
            count: AtomicI64::new(0),
            free: AtomicI64::new(0),
            chunk_failed_epoch: AtomicU64::new(u64::MAX),
            unlinked: cairn_lockrank::Mutex::new(
                cairn_lockrank::Rank::UnlinkedIndex,
                crate::unlinked::UnlinkedIndex::default(),
            ),
        }
    }
}

/// Counters of operations.
#[derive(Debug, Default)]
pub(crate) struct OpCounters {
    pub lookups: AtomicU64,
    pub creates: AtomicU64,
    pub removes: AtomicU64,
    pub renames: AtomicU64,
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub read_bytes: AtomicU64,
    pub write_bytes: AtomicU64,
    pub fsyncs: AtomicU64,
}

/// A mounted cairn filesystem; see the crate documentation.
#[derive(Debug)]
pub struct Filesystem {
    pub(crate) device: Arc<dyn BlockDevice>,
    pub(crate) geometry: Geometry,
    pub(crate) uuid: [u8; 16],
    pub(crate) root: u64,
    pub(crate) superblock: Superblock,
    pub(crate) cache: Arc<BufferCache>,
    pub(crate) journal: Journal,
    pub(crate) alloc: Arc<Allocator>,
    /// The online discard thread (`MountOptions::discard`).
    discarder: Option<crate::discard::Discarder>,
    pub(crate) inodes: InodeCache,
    pub(crate) cluster_spec: ReadSpec,
    pub(crate) options: MountOptions,
    pub(crate) ags: Vec<AgInodes>,
    pub(crate) counters: OpCounters,
    pub(crate) next_handle: AtomicU64,
    pub(crate) generation: AtomicU32,
    /// Counts commits that freed blocks (see `AgInodes::chunk_failed_epoch`).
    pub(crate) free_epoch: AtomicU64,
    pub(crate) dir_rotor: AtomicU32,
    pub(crate) recovery: RecoveryReport,
    /// Serialises renames (see `rename.rs` for the lock order).
    pub(crate) rename_lock: cairn_lockrank::Mutex<()>,
    pub(crate) preallocs: crate::prealloc::Preallocs,
    pub(crate) data_cache: crate::extents::DataCache,
    pub(crate) write_behind: crate::write_behind::WriteBehind,
    /// Reads handed over, read-ahead and read buffers (`reads.rs`).
    pub(crate) reads: crate::reads::Reads,
    /// What the daemon's background thread waits on (`background.rs`).
    pub(crate) background: Arc<crate::background::BackgroundSignal>,
    /// Sharing and copy-on-write counters (`reflink.rs`).
    pub(crate) reflink: crate::reflink::ReflinkCounters,
}

/// Reads and checks the primary superblock of `device`.
pub(crate) fn read_superblock(device: &dyn BlockDevice) -> Result<Superblock, FsError> {
    let sector = u64::from(device.logical_sector_size().max(512));
    let len = u64::from(BLOCK_SIZE_MAX).min(device.size_bytes());
    let len = len - len % sector;
    let mut head = AlignedBuf::zeroed(len as usize);
    device.read_at(0, &mut head)?;
    let superblock = Superblock::read_primary(&head).map_err(|e| match e {
        cairn_format::FormatError::UnsupportedFeatures { features, .. } => {
            FsError::UnsupportedFeatures { incompat: features }
        }
        other => FsError::corrupt("superblock", 0, other.to_string()),
    })?;
    let unknown = superblock.features_incompat & !FEATURES_INCOMPAT_KNOWN;
    if unknown != 0 {
        return Err(FsError::UnsupportedFeatures { incompat: unknown });
    }
    Ok(superblock)
}

impl Filesystem {
    /// Mounts the filesystem on `device`; log recovery runs here.
    pub fn mount(device: Arc<dyn BlockDevice>, options: MountOptions) -> Result<Self, FsError> {
        let superblock = read_superblock(device.as_ref())?;
        let geometry = superblock.geometry;
        let uuid = superblock.uuid();
        let created = superblock.created_secs;
        let mut cache_config = CacheConfig::from_geometry(&geometry);
        if let Some(bytes) = options.cache_bytes {
            cache_config = cache_config.with_memory_limit_bytes(bytes);
        }
        let cache = Arc::new(BufferCache::new(cache_config, Arc::clone(&device))?);
        let config = JournalConfig {
            inode_cluster_blocks: 1,
            ..JournalConfig::with_mode(options.log_mode)
        };
        let (journal, recovery) =
            Journal::open(Arc::clone(&cache), Arc::clone(&device), &superblock, config)?;
        if !recovery.clean && read_superblock(device.as_ref())?.geometry != geometry {
            // The log held a grow: mount again with the geometry it wrote (the log is
            // clean now, or holds only relogged intents).
            drop(journal);
            drop(cache);
            return Self::mount(device, options);
        }
        let cluster_spec =
            inode_cluster_spec(geometry.inode_size, uuid).ok_or(FsError::corrupt(
                "superblock",
                0,
                "no inode cluster verifier for the inode size",
            ))?;
        let alloc = Allocator::new(geometry, uuid)
            .with_ag_reserve(inode_tree_reserve(&geometry))
            .with_discard(options.discard && !options.read_only);
        let alloc = Arc::new(alloc);
        let discarder = match options.discard && !options.read_only {
            true => {
                let discarder = crate::discard::Discarder::start(
                    Arc::clone(&alloc),
                    &journal,
                    Arc::clone(&device),
                    geometry,
                )?;
                Some(discarder)
            }
            false => None,
        };
        let background = Arc::new(crate::background::BackgroundSignal::new());
        let write_behind = crate::write_behind::WriteBehind::new(
            match options.read_only {
                true => 0,
                false => options.data_cache,
            },
            Arc::clone(&alloc),
            Arc::clone(&background),
        );
        let fs = Self {
            write_behind,
            reads: crate::reads::Reads::new(options.read_buffers),
            background,
            device,
            geometry,
            uuid,
            root: superblock.root_inode,
            superblock,
            cache,
            journal,
            alloc,
            discarder,
            inodes: InodeCache::new(),
            cluster_spec,
            options,
            ags: (0..geometry.ag_count)
                .map(|_| AgInodes::default())
                .collect(),
            counters: OpCounters::default(),
            next_handle: AtomicU64::new(1),
            generation: AtomicU32::new(created as u32),
            free_epoch: AtomicU64::new(0),
            dir_rotor: AtomicU32::new(0),
            recovery,
            rename_lock: cairn_lockrank::Mutex::new(cairn_lockrank::Rank::Rename, ()),
            preallocs: crate::prealloc::Preallocs::default(),
            data_cache: crate::extents::DataCache::new()?,
            reflink: crate::reflink::ReflinkCounters::default(),
        };
        fs.finish_intents()?;
        fs.load_ag_counts()?;
        fs.root_inode_check()?;
        crate::unlinked::recover_unlinked(&fs)?;
        Ok(fs)
    }

    /// Opens the image or device at `path` exclusively and mounts it.
    pub fn mount_path(path: &Path, options: MountOptions) -> Result<Self, FsError> {
        let open = OpenOptions::new().read_only(options.read_only);
        let open = if options.buffered {
            open.buffered()
        } else {
            open
        };
        let device: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(path, &open)?);
        Self::mount(device, options)
    }

    /// Flushes everything, writes exact superblock counters and leaves a clean log; with
    /// online discard, also discards everything freed before returning.
    /// Cached data is written back first; if that fails, the unmount still completes and
    /// its error is returned.
    pub fn unmount(self) -> Result<(), FsError> {
        let written_back = self.write_back_all();
        if !self.options.read_only {
            self.write_superblock()?;
        }
        self.finish_unmount()?;
        written_back
    }

    /// `unmount` after the superblock is written: the log made clean, everything home.
    pub(crate) fn finish_unmount(self) -> Result<(), FsError> {
        if let Some(discarder) = &self.discarder {
            discarder.quiesce();
        }
        self.journal.unmount()?;
        if let Some(discarder) = &self.discarder {
            // Every commit is durable now, the last frees' included.
            discarder.drain(u64::MAX);
        }
        self.cache.flush_delwri()?;
        self.device.flush()?;
        Ok(())
    }

    /// The root directory's inode number.
    pub fn root(&self) -> u64 {
        self.root
    }

    /// What recovery did at mount.
    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.recovery
    }

    /// Makes every change so far durable, cached data included (a failed writeback is
    /// returned after everything else was made durable).
    pub fn sync(&self) -> Result<(), FsError> {
        let written_back = self.write_back_all();
        self.journal.force_all()?;
        self.device.flush()?;
        written_back
    }

    /// With online discard: waits until everything freed by a durable commit has been
    /// discarded (the discard thread otherwise does it soon after each checkpoint).
    pub fn drain_discards(&self) {
        if let Some(discarder) = &self.discarder {
            discarder.drain(self.journal.durable_sequence().0);
        }
    }

    /// Online discard so far: ranges discarded, bytes, and failed discards.
    pub fn discard_counts(&self) -> (u64, u64, u64) {
        self.discarder
            .as_ref()
            .map_or((0, 0, 0), crate::discard::Discarder::counts)
    }

    /// Statistics for `statfs`, summed from the AG headers and in-memory inode counts.
    pub fn statfs(&self) -> Result<StatFs, FsError> {
        let mut free_blocks = 0u64;
        for ag in 0..self.geometry.ag_count {
            free_blocks += u64::from(self.read_agf(ag)?.free_blocks);
        }
        // The AGs' reserves (for inode frees, `inode_tree_reserve`) are not free for data. Taken
        // off the total, not per AG, so every block freed counts (an AG may be below its reserve).
        let reserved = u64::from(self.alloc.ag_reserve()) * u64::from(self.geometry.ag_count);
        // Blocks promised to cached writes are not free either.
        let reserved = reserved + self.write_behind.reserved_blocks();
        let free_blocks = free_blocks.saturating_sub(reserved);
        let (inodes, inodes_free) = self.inode_totals();
        // Free blocks can become inodes: 64 per chunk.
        let per_block = u64::from(self.geometry.inodes_per_block());
        Ok(StatFs {
            block_size: self.geometry.block_size,
            blocks: self.geometry.block_count,
            blocks_free: free_blocks,
            blocks_available: free_blocks,
            inodes: inodes + free_blocks * per_block,
            inodes_free: inodes_free + free_blocks * per_block,
            name_max: cairn_format::limits::NAME_LEN_MAX as u32,
        })
    }

    /// The log's space in one line (`Journal::space_report`), for reports of stuck requests.
    pub fn log_space_report(&self) -> String {
        self.journal.space_report()
    }

    /// A snapshot of every subsystem's counters.
    pub fn stats(&self) -> FsStats {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let c = &self.counters;
        FsStats {
            shutdown: self.journal.shutdown_reason(),
            fs: FsOpStats {
                lookups: load(&c.lookups),
                creates: load(&c.creates),
                removes: load(&c.removes),
                renames: load(&c.renames),
                reads: load(&c.reads),
                writes: load(&c.writes),
                read_bytes: load(&c.read_bytes),
                write_bytes: load(&c.write_bytes),
                fsyncs: load(&c.fsyncs),
                inodes_cached: self.inodes.len() as u64,
                inodes_reclaimed: load(&self.inodes.reclaimed),
                inode_reclaim_passes: load(&self.inodes.passes),
            },
            bufcache: self.cache.stats(),
            journal: self.journal.stats(),
            alloc: self.alloc.stats(),
            data: self.preallocs.stats(),
            extcache: self.data_cache.cache.stats(),
            write_behind: self.write_behind.stats(),
            reflink: self.reflink.snapshot(),
            reads: self.reads.stats(),
        }
    }

    fn inode_totals(&self) -> (u64, u64) {
        let sum = |pick: fn(&AgInodes) -> i64| -> u64 {
            self.ags.iter().map(|ag| pick(ag).max(0) as u64).sum()
        };
        (
            sum(|ag| ag.count.load(Ordering::Relaxed)),
            sum(|ag| ag.free.load(Ordering::Relaxed)),
        )
    }

    pub(crate) fn read_agf(&self, ag: u32) -> Result<Agf, FsError> {
        let block = self.geometry.ag_start(ag) + u64::from(cairn_format::limits::AG_AGF_BLOCK);
        let spec = ReadSpec::new(&AGF_OPS, self.uuid).with_owner(u64::from(ag));
        let guard = self.cache.get(BufKey::single(block), &spec)?;
        Agf::decode(&guard).map_err(|e| FsError::corrupt("AGF", block, e.to_string()))
    }

    fn load_ag_counts(&self) -> Result<(), FsError> {
        for ag in 0..self.geometry.ag_count {
            let mut tx = self.begin(Reservation::new(0))?;
            let agi = crate::ialloc::read_agi(self, &mut tx, ag);
            tx.tx.cancel()?;
            let agi = agi?;
            let state = &self.ags[ag as usize];
            state
                .count
                .store(i64::from(agi.inode_count), Ordering::Relaxed);
            state
                .free
                .store(i64::from(agi.free_inodes), Ordering::Relaxed);
            state.chunk_failed_epoch.store(u64::MAX, Ordering::Relaxed);
        }
        Ok(())
    }

    fn root_inode_check(&self) -> Result<(), FsError> {
        let root = self.inode(self.root)?;
        let data = root.data.lock();
        if !data.is_dir() {
            return Err(FsError::corrupt("root inode", self.root, "not a directory"));
        }
        Ok(())
    }

    /// Finishes the intents recovery found unfinished (frees their extents, applies their
    /// refcount updates, or completes their collapse or insert range), logging their done
    /// items; then frees what copy-on-writes a crash interrupted had staged.
    fn finish_intents(&self) -> Result<(), FsError> {
        for intent in self.recovery.unfinished_intents.clone() {
            let extents = match intent.work {
                IntentWork::Free(extents) => extents,
                IntentWork::Refcount(updates) => {
                    crate::reflink::finish_refcount_intent(self, intent.id, &updates)?;
                    continue;
                }
                IntentWork::Shift(shift) => {
                    crate::shift::finish_intent(self, intent.id, &shift)?;
                    continue;
                }
            };
            let mut tx = self.begin_finishing(Reservation::remove(&self.geometry))?;
            let sequence = crate::glue::free_sequence(&self.journal);
            // Ascending AG order, as the allocator requires within one transaction.
            let mut extents = extents.clone();
            extents.sort_by_key(|extent| extent.start.0);
            for extent in &extents {
                self.alloc.free(
                    &mut tx,
                    &crate::glue::JournalLog(&self.journal),
                    extent.start,
                    extent.length,
                    sequence,
                )?;
            }
            tx.tx.log_free_done(intent.id);
            tx.tx.commit()?;
        }
        crate::reflink::free_leftover_staging(self)
    }

    /// The superblock with counters summed from the AG headers and the inode counts.
    pub(crate) fn counted_superblock(&self) -> Result<Superblock, FsError> {
        let mut superblock = self.superblock.clone();
        let mut free_blocks = 0u64;
        for ag in 0..self.geometry.ag_count {
            free_blocks += u64::from(self.read_agf(ag)?.free_blocks);
        }
        let (inodes, free_inodes) = self.inode_totals();
        superblock.free_blocks = free_blocks;
        superblock.inode_count = inodes;
        superblock.free_inodes = free_inodes;
        Ok(superblock)
    }

    /// Writes the superblock with counters summed from the AG headers.
    fn write_superblock(&self) -> Result<(), FsError> {
        let superblock = self.counted_superblock()?;
        let geometry = &self.geometry;
        let reservation = Reservation::for_items(geometry, 1, geometry.block_size, 0, 0);
        let mut tx = self.begin(reservation)?;
        let spec = ReadSpec::new(&SUPERBLOCK_OPS, self.uuid).with_owner(0);
        let guard = tx.tx.get_buf(BufKey::single(0), &spec)?;
        guard.write(0, &superblock.to_bytes())?;
        tx.tx.commit()?;
        Ok(())
    }

    /// Starts a transaction.
    pub(crate) fn begin(&self, reservation: Reservation) -> Result<Tx<'_>, FsError> {
        Ok(Tx {
            tx: self.journal.begin(reservation)?,
            deferred_frees: Vec::new(),
        })
    }

    /// Starts the transaction that finishes an intent a committed one logged (frees its
    /// extents, logs its done item): it draws on log space kept for this, so it never waits
    /// behind reservations waiting for the tail the intent holds (`Journal::begin_finishing`).
    pub(crate) fn begin_finishing(&self, reservation: Reservation) -> Result<Tx<'_>, FsError> {
        Ok(Tx {
            tx: self.journal.begin_finishing(reservation)?,
            deferred_frees: Vec::new(),
        })
    }

    /// Refuses changes on a read-only mount.
    pub(crate) fn check_writable(&self) -> Result<(), FsError> {
        match self.options.read_only {
            true => Err(FsError::ReadOnly),
            false => Ok(()),
        }
    }

    /// Logs the current image of an inode in `tx` (with the size a crash may show,
    /// `InodeData::disk_size`).
    pub(crate) fn log_inode(tx: &mut Tx<'_>, number: u64, data: &mut InodeData) {
        tx.tx.log_inode(InodeNumber(number), data.image());
    }

    /// After a data write into mapped blocks: lets `tx` skip the checkpoint's flush before
    /// its commit record when the write made nothing reachable (`map_changed` false: no
    /// block became written; and `size_grew` false: the logged size did not grow), so only
    /// data already inside the file was overwritten, and a crash may show either version of
    /// it (see `Transaction::orders_no_data`). Call before logging the inode.
    /// Returns whether the write made nothing reachable, which leaves the inode's times
    /// as the transaction's only change to it unless the caller changed something else.
    pub(crate) fn overwrite_orders_no_data(
        tx: &mut Tx<'_>,
        map_changed: bool,
        size_grew: bool,
    ) -> bool {
        let overwrite = !map_changed && !size_grew;
        if overwrite {
            tx.tx.orders_no_data();
        }
        overwrite
    }

    /// Commits `tx`, recording its sequence in every inode it logged, then frees what it
    /// deferred (`Tx::defer_free`), one transaction per intent.
    pub(crate) fn commit(
        &self,
        mut tx: Tx<'_>,
        logged: &mut [&mut InodeData],
    ) -> Result<u64, FsError> {
        let deferred = std::mem::take(&mut tx.deferred_frees);
        let sequence = tx.tx.commit()?.0;
        for data in logged {
            data.committed(sequence, false);
        }
        crate::dir::finish_deferred_frees(self, deferred)?;
        Ok(sequence)
    }

    /// Commits `tx`, which logged the one inode `data`; `times_only`: it changed nothing of
    /// it but timestamps, so `fdatasync` of the file need not wait for it
    /// (`InodeData::datasync_sequence`).
    pub(crate) fn commit_inode(
        &self,
        tx: Tx<'_>,
        data: &mut InodeData,
        times_only: bool,
    ) -> Result<u64, FsError> {
        if !times_only {
            return self.commit(tx, &mut [data]);
        }
        debug_assert!(
            tx.deferred_frees.is_empty(),
            "a times-only change frees nothing"
        );
        let sequence = tx.tx.commit()?.0;
        data.committed(sequence, true);
        Ok(sequence)
    }

    /// The in-core inode `number` (allocated or not), loading it on a miss.
    pub(crate) fn inode(&self, number: u64) -> Result<Arc<Inode>, FsError> {
        if !self.geometry.inode_is_valid(number) {
            return Err(FsError::NotFound);
        }
        let inode = self
            .inodes
            .get(&self.cache, &self.cluster_spec, &self.geometry, number)?;
        if self.inodes.reclaim_due() {
            self.reclaim_claimed();
        }
        Ok(inode)
    }

    /// An allocated inode, or `NotFound`.
    pub(crate) fn live_inode(&self, number: u64) -> Result<Arc<Inode>, FsError> {
        let inode = self.inode(number)?;
        if !inode.data.lock().is_allocated() {
            return Err(FsError::NotFound);
        }
        Ok(inode)
    }

    /// Drops idle candidate inodes whose home copies are current: checkpoints and writes the
    /// log home first, so most idle inodes qualify. Runs only when `InodeCache::reclaim_due`
    /// says so, and looks only at the candidates.
    pub(crate) fn reclaim_inodes(&self) {
        // Referenced candidates leave the set first, without I/O (they come back through
        // `note_idle` when their last reference goes): under FUSE most cached inodes are
        // the kernel's, and a pass that finds none idle must not force the log and push
        // the AIL for nothing.
        let mut candidates = self.inodes.take_candidates();
        candidates.retain(|&number| {
            let mut idle = false;
            self.inodes
                .judge(number, |inode| match inode.data.try_lock() {
                    None => Verdict::Retry,
                    Some(data) if data.is_referenced() => Verdict::Referenced,
                    Some(_) => {
                        idle = true;
                        Verdict::Retry
                    }
                });
            idle
        });
        if candidates.is_empty() {
            return;
        }
        if self.journal.force_all().is_err() || self.journal.push_ail().is_err() {
            return;
        }
        for number in candidates {
            self.inodes.judge(number, |inode| {
                let Some(mut data) = inode.data.try_lock() else {
                    return Verdict::Retry;
                };
                if data.is_referenced() {
                    return Verdict::Referenced;
                }
                let clean = home_matches(
                    &self.cache,
                    &self.cluster_spec,
                    &self.geometry,
                    number,
                    &mut data,
                );
                if clean { Verdict::Drop } else { Verdict::Retry }
            });
        }
    }

    /// A generation number for a new or reused inode.
    pub(crate) fn next_generation(&self) -> u32 {
        self.generation.fetch_add(0x9e37_79b9, Ordering::Relaxed)
    }

    pub(crate) fn ag_inodes_free(&self, ag: u32) -> i64 {
        self.ags[ag as usize].free.load(Ordering::Relaxed)
    }

    pub(crate) fn ag_may_hold_chunk(&self, ag: u32) -> bool {
        let failed = self.ags[ag as usize]
            .chunk_failed_epoch
            .load(Ordering::Acquire);
        failed != self.free_epoch.load(Ordering::Acquire)
    }

    /// The free epoch to pass to `chunk_failed`, read before a chunk allocation looks.
    pub(crate) fn chunk_look_epoch(&self) -> u64 {
        self.free_epoch.load(Ordering::Acquire)
    }

    /// A chunk allocation in `ag` that began at free epoch `epoch` found no room: creates
    /// skip the AG until blocks are freed. A free that commits while the allocation looks
    /// has already moved the epoch past `epoch`, so the AG is never skipped wrongly (a plain
    /// flag stored here could overwrite that free's "may hold" and skip an AG with room).
    pub(crate) fn chunk_failed(&self, ag: u32, epoch: u64) {
        self.ags[ag as usize]
            .chunk_failed_epoch
            .store(epoch, Ordering::Release);
    }

    /// After blocks were freed: every AG may hold a chunk again.
    pub(crate) fn blocks_freed(&self) {
        self.free_epoch.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn add_ag_inodes(&self, ag: u32, count: i64, free: i64) {
        let state = &self.ags[ag as usize];
        state.count.fetch_add(count, Ordering::Relaxed);
        state.free.fetch_add(free, Ordering::Relaxed);
    }

    /// A new open-file handle number.
    pub(crate) fn new_handle(&self) -> u64 {
        self.next_handle.fetch_add(1, Ordering::Relaxed)
    }

    /// Counts one operation.
    pub(crate) fn count(counter: &AtomicU64, amount: u64) {
        counter.fetch_add(amount, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use cairn_blockdev::BlockDevice;

    use super::*;
    use crate::types::{Credentials, FileKind};

    fn mount() -> Filesystem {
        let device = crate::test_device::formatted(64 << 20, [9; 16]);
        let device: Arc<dyn BlockDevice> = Arc::new(device);
        Filesystem::mount(device, MountOptions::default()).unwrap()
    }

    // A chunk allocation that failed while blocks were being freed (its look began before
    // the free committed) does not make creates skip the AG; one that failed after does,
    // until the next free.
    #[test]
    fn a_free_during_a_failed_chunk_allocation_keeps_the_ag_usable() {
        let fs = mount();
        assert!(fs.ag_may_hold_chunk(0));
        let epoch = fs.chunk_look_epoch();
        fs.blocks_freed();
        fs.chunk_failed(0, epoch);
        assert!(fs.ag_may_hold_chunk(0), "the free came after the look");
        fs.chunk_failed(0, fs.chunk_look_epoch());
        assert!(!fs.ag_may_hold_chunk(0));
        assert!(fs.ag_may_hold_chunk(1), "other AGs are untouched");
        fs.blocks_freed();
        assert!(fs.ag_may_hold_chunk(0));
    }

    // With a background thread attached, the accesses that find reclaim passes due hand them
    // over: nothing is judged until the thread's pass, which then drops the idle inodes; once
    // the thread detaches, accesses run the passes themselves again.
    #[test]
    fn an_attached_background_thread_runs_the_reclaim_passes() {
        const TARGET: usize = 64;
        let fs = mount();
        fs.inodes.set_target(TARGET);
        let signal = fs.attach_background();
        let who = Credentials::root();
        let create_idle = |name: String| {
            let attr = fs
                .create(
                    fs.root(),
                    name.as_bytes(),
                    FileKind::Regular,
                    0o644,
                    0,
                    &who,
                )
                .unwrap();
            fs.forget(attr.inode, 1);
        };
        for i in 0..(4 * TARGET) {
            create_idle(format!("f{i}"));
        }
        let handed_over = fs.stats().fs;
        assert_eq!(handed_over.inode_reclaim_passes, 0, "{handed_over:?}");
        assert_eq!(handed_over.inodes_reclaimed, 0, "{handed_over:?}");
        signal.wait(Duration::from_secs(10)); // woken at once: a pass is pending
        fs.background_pass();
        let after = fs.stats().fs;
        assert_eq!(after.inode_reclaim_passes, 1, "{after:?}");
        assert!(after.inodes_reclaimed >= TARGET as u64, "{after:?}");
        fs.detach_background();
        for i in 0..(4 * TARGET) {
            create_idle(format!("g{i}"));
        }
        let inline = fs.stats().fs;
        assert!(inline.inode_reclaim_passes > 1, "{inline:?}");
        fs.unmount().unwrap();
    }

    // Four threads create, look up, write and remove files in their own and a shared
    // directory while a background thread runs the reclaim passes they hand over, with a
    // table limit small enough that passes run all along: no lock-order report, no hang,
    // and every file left reads back what was written.
    #[test]
    fn reclaim_on_the_background_thread_beside_busy_requests() {
        use std::sync::atomic::AtomicBool;
        const TARGET: usize = 32;
        let fs = Arc::new(mount());
        fs.inodes.set_target(TARGET);
        let who = Credentials::root();
        let shared = fs.mkdir(fs.root(), b"shared", 0o777, &who).unwrap().inode;
        let stop = Arc::new(AtomicBool::new(false));
        let background = {
            let (fs, stop) = (Arc::clone(&fs), Arc::clone(&stop));
            let signal = fs.attach_background();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Acquire) {
                    signal.wait(Duration::from_millis(2));
                    fs.background_pass();
                }
                fs.detach_background();
            })
        };
        let workers: Vec<_> = (0..4u8)
            .map(|t| {
                let fs = Arc::clone(&fs);
                std::thread::spawn(move || {
                    let who = Credentials::root();
                    let own_name = format!("t{t}");
                    let own = fs.mkdir(fs.root(), own_name.as_bytes(), 0o777, &who);
                    let own = own.unwrap().inode;
                    for i in 0..1500u32 {
                        let dir = if i % 3 == 0 { shared } else { own };
                        let name = format!("f{t}-{i}");
                        let attr = fs
                            .create(dir, name.as_bytes(), FileKind::Regular, 0o644, 0, &who)
                            .unwrap();
                        fs.write(attr.inode, 0, name.as_bytes()).unwrap();
                        fs.forget(attr.inode, 1);
                        if i % 4 == 0 {
                            fs.unlink(dir, name.as_bytes(), &who).unwrap();
                        }
                    }
                    own
                })
            })
            .collect();
        let owns: Vec<u64> = workers.into_iter().map(|w| w.join().unwrap()).collect();
        stop.store(true, Ordering::Release);
        background.join().unwrap();
        let stats = fs.stats().fs;
        assert!(stats.inode_reclaim_passes > 0, "{stats:?}");
        assert!(stats.inodes_reclaimed > 0, "{stats:?}");
        for (t, own) in owns.into_iter().enumerate() {
            for i in (0..1500u32).filter(|i| i % 4 != 0) {
                let dir = if i % 3 == 0 { shared } else { own };
                let name = format!("f{t}-{i}");
                let attr = fs.lookup(dir, name.as_bytes()).unwrap();
                let data = fs.read(attr.inode, 0, 64).unwrap();
                assert_eq!(&data[..], name.as_bytes(), "{name}");
                fs.forget(attr.inode, 1);
            }
        }
        match Arc::try_unwrap(fs) {
            Ok(fs) => fs.unmount().unwrap(),
            Err(_) => panic!("a thread still holds the filesystem"),
        }
    }

    // Every created inode keeps its lookup reference (as under FUSE), so nothing is freeable:
    // the table grows past its soft limit and reclaim passes stay rare (bounded by the
    // insertion count over the interval), instead of one per inode access.
    #[test]
    fn referenced_inodes_over_the_limit_bound_reclaim_work() {
        const TARGET: usize = 256;
        const FILES: usize = 3_000;
        let fs = mount();
        fs.inodes.set_target(TARGET);
        let who = Credentials::root();
        let mut dirs = Vec::new();
        for d in 0..4 {
            let name = format!("d{d}");
            dirs.push(
                fs.mkdir(fs.root(), name.as_bytes(), 0o755, &who)
                    .unwrap()
                    .inode,
            );
        }
        let forces = fs.stats().journal.forces;
        let mut files = Vec::new();
        for i in 0..FILES {
            let name = format!("f{i}");
            let dir = dirs[i % dirs.len()];
            let attr = fs
                .create(dir, name.as_bytes(), FileKind::Regular, 0o644, 0, &who)
                .unwrap();
            fs.getattr(attr.inode).unwrap();
            files.push(attr.inode);
        }
        let stats = fs.stats().fs;
        // Every referenced inode stayed (only an unreferenced one, like the root, may go).
        assert!(
            stats.inodes_cached as usize >= FILES + dirs.len(),
            "{stats:?}"
        );
        let interval = (TARGET / 16) as u64;
        let bound = (FILES + dirs.len()) as u64 / interval + 1;
        assert!(
            stats.inode_reclaim_passes <= bound,
            "{stats:?} bound {bound}"
        );
        // Passes that found no idle inode forced no log (nor pushed the AIL): only the
        // first found one, the root, which no lookup reference holds here.
        assert!(stats.inode_reclaim_passes > 1, "{stats:?}");
        assert!(fs.stats().journal.forces <= forces + 1, "{stats:?}");

        // Once the references go, the idle inodes are reclaimed by later passes.
        for &inode in &files {
            fs.forget(inode, 1);
        }
        for i in 0..(2 * TARGET) {
            let name = format!("g{i}");
            let attr = fs
                .create(dirs[0], name.as_bytes(), FileKind::Regular, 0o644, 0, &who)
                .unwrap();
            fs.forget(attr.inode, 1);
        }
        let after = fs.stats().fs;
        assert!(after.inodes_reclaimed >= FILES as u64 / 2, "{after:?}");
        assert!(after.inodes_cached < stats.inodes_cached, "{after:?}");
        fs.unmount().unwrap();
    }
}
