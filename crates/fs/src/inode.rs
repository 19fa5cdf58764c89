//! In-core inodes: one copy per inode, under its metadata lock, holding the decoded core and
//! the full on-disk image (whose literal area is the authority for the forks).
//!
//! Every change is logged with `Transaction::log_inode(number, image)`; the journal copies the
//! image home later, so until then this copy is the only current one. An inode therefore
//! leaves the cache only when its home copy (through the buffer cache) equals it.

use std::cell::OnceCell;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cairn_bufcache::{BufKey, BufferCache, ReadSpec};
use cairn_format::acl::Acl;
use cairn_format::inode::{FileType, ForkFormat, INODE_CORE_SIZE, InodeCore, Timestamp};
use cairn_format::{Expected, FsBlock, Geometry, InodeNumber, MetaKind, OnDisk, stamp};
use cairn_lockrank::{Mutex, MutexGuard, Order, Rank, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::FsError;
use crate::types::{Attr, FileKind};

/// The soft limit on cached inodes: above it, reclaim passes may run (see `InodeCache`).
pub(crate) const INODE_CACHE_TARGET: usize = 16_384;

/// The mutable state of one inode, behind its metadata lock.
#[derive(Debug)]
pub(crate) struct InodeData {
    pub core: InodeCore,
    /// The whole inode image; the core bytes are re-encoded from `core` before logging.
    pub raw: Vec<u8>,
    /// Commit sequence of the last transaction that logged this inode.
    pub last_sequence: u64,
    /// Commit sequence of the last transaction that logged a change of this inode other
    /// than its timestamps: what `fdatasync` of a file waits for (XFS leaves timestamp-only
    /// changes out of it too).
    pub datasync_sequence: u64,
    /// The size a crash may show: what `image` logs for a regular file. `core.size` runs
    /// ahead of it while write-behind holds data past it. It grows only over data that is
    /// on the device (`cover_written`) and follows every shrink, so a crash never shows a
    /// size over bytes nobody wrote: the file comes back shorter, not full of zeros (XFS
    /// keeps its on-disk size apart from the in-memory one for the same reason).
    pub disk_size: u64,
    /// A truncate emptied the file and its new data has not been written back since: the
    /// last close and the periodic commit write it back, so a crash shows the old content
    /// or the new, rarely an empty file (ext4's `auto_da_alloc`).
    pub emptied_by_truncate: bool,
    /// FUSE lookup references.
    pub lookups: u64,
    /// Open handles.
    pub opens: u64,
    /// The POSIX ACLs as last read from the attributes; emptied by every attribute change.
    pub acls: OnceCell<Acls>,
    /// Blocks cached writes will allocate (`write_behind`), counted in `st_blocks` as XFS
    /// counts its delayed allocations.
    pub delayed_blocks: u64,
    /// Open handles for writing opened while the file was not append-only: only these
    /// may leave data in the kernel's cache that is not an append (see `flags.rs`).
    pub unguarded_writers: u64,
    /// An O_TMPFILE file created without O_EXCL and never linked: `link` may give it a
    /// name although it has no link (the kernel's I_LINKABLE).
    pub linkable: bool,
}

/// An inode's POSIX ACLs (`system.posix_acl_access`, and for directories
/// `system.posix_acl_default`).
#[derive(Debug, Clone, Default)]
pub(crate) struct Acls {
    pub access: Option<Arc<Acl>>,
    pub default: Option<Arc<Acl>>,
}

impl InodeData {
    /// Records that the transaction with `sequence` logged this inode; `times_only`: it
    /// changed nothing of it but timestamps.
    pub fn committed(&mut self, sequence: u64, times_only: bool) {
        self.last_sequence = sequence;
        if !times_only {
            self.datasync_sequence = sequence;
        }
    }

    /// Whether FUSE or an open handle holds the inode.
    pub fn is_referenced(&self) -> bool {
        self.lookups > 0 || self.opens > 0
    }

    /// The data fork bytes.
    pub fn data_fork(&self) -> &[u8] {
        let range = self.core.data_fork_range(self.raw.len() as u32);
        &self.raw[range]
    }

    /// The data fork bytes, for writing.
    pub fn data_fork_mut(&mut self) -> &mut [u8] {
        let range = self.core.data_fork_range(self.raw.len() as u32);
        &mut self.raw[range]
    }

    /// The image to log: the core re-encoded with the size a crash may show
    /// (`disk_size`), and the CRC stamped.
    pub fn image(&mut self) -> &[u8] {
        if self.file_type() != Some(FileType::Regular) || self.core.size < self.disk_size {
            self.disk_size = self.core.size;
        }
        let mut core = self.core;
        core.size = self.disk_size;
        core.encode(&mut self.raw[..INODE_CORE_SIZE]);
        stamp(&mut self.raw, None);
        &self.raw
    }

    /// Lets the logged size grow towards `core.size`, up to byte `written_below`: every
    /// byte under that is on the device or in no cached page (a hole, which reads as the
    /// zeros the file holds there). The caller passes the first byte of the first cached
    /// page past the logged size (`PageSet::first_cached_byte`), or `u64::MAX`.
    pub fn cover_written(&mut self, written_below: u64) {
        let covered = self.core.size.min(written_below);
        self.disk_size = self.disk_size.max(covered);
    }

    /// Whether the logged size is behind the size in memory.
    pub fn size_not_logged(&self) -> bool {
        self.file_type() == Some(FileType::Regular) && self.disk_size < self.core.size
    }

    pub fn file_type(&self) -> Option<FileType> {
        self.core.file_type()
    }

    pub fn is_dir(&self) -> bool {
        self.file_type() == Some(FileType::Directory)
    }

    /// Whether the inode is allocated (mode not 0).
    pub fn is_allocated(&self) -> bool {
        self.core.mode != 0
    }

    /// Sets the data fork format, zeroing the fork.
    pub fn reset_data_fork(&mut self, format: ForkFormat) {
        self.data_fork_mut().fill(0);
        self.core.data_format = format;
        self.core.data_extent_count = 0;
    }

    /// Attributes for the API.
    pub fn attr(&self, number: u64, block_size: u32) -> Attr {
        Attr {
            inode: number,
            generation: self.core.generation,
            kind: kind_of(self.file_type()),
            mode: self.core.mode & cairn_format::inode::MODE_PERMISSION_MASK,
            nlink: self.core.nlink,
            uid: self.core.uid,
            gid: self.core.gid,
            rdev: self.core.rdev,
            size: self.core.size,
            blocks_512: (self.core.block_count + self.delayed_blocks) * u64::from(block_size / 512),
            atime: system_time(self.core.atime),
            mtime: system_time(self.core.mtime),
            ctime: system_time(self.core.ctime),
            btime: system_time(self.core.btime),
            block_size,
            flags: crate::flags::inode_flags(self.core.flags),
        }
    }
}

/// An inode's I/O lock: shared for reads, exclusive for writes that change the data, the
/// mapping or the size; it holds the inode's cached dirty pages (`write_behind`).
///
/// It also counts the reads that gave the lock back while their device transfers are still
/// in flight (`Filesystem::read_handed_over`, `InFlightRead`): an exclusive holder waits for
/// them before it changes anything, so to every change such a read is what a shared holder
/// is (no block it reads is freed, reused or rewritten under it). And it counts exclusive
/// holds (`epoch`): a read-ahead taken at one epoch still shows the file at a later look with
/// the same epoch.
#[derive(Debug)]
pub(crate) struct IoLock {
    lock: RwLock<crate::write_behind::PageSet>,
    /// Reads in flight without the lock, and their completion signal. A leaf: held only to
    /// count, or by a waiter inside `Condvar::wait`.
    reads: parking_lot::Mutex<usize>,
    reads_done: parking_lot::Condvar,
    epoch: AtomicU64,
}

impl IoLock {
    fn new(number: u64) -> Self {
        Self {
            lock: RwLock::keyed(Rank::InodeIo, number, Default::default()),
            reads: parking_lot::Mutex::new(0),
            reads_done: parking_lot::Condvar::new(),
            epoch: AtomicU64::new(0),
        }
    }

    #[track_caller]
    pub(crate) fn read(&self) -> RwLockReadGuard<'_, crate::write_behind::PageSet> {
        self.lock.read()
    }

    /// The exclusive lock, once no read is in flight; a new epoch begins.
    #[track_caller]
    pub(crate) fn write(&self) -> RwLockWriteGuard<'_, crate::write_behind::PageSet> {
        let guard = self.lock.write();
        self.exclusive_begins();
        guard
    }

    /// `write` for a lock taken in `order` beside another inode's (`key` is this inode's
    /// number): a clone locks both of its files.
    #[track_caller]
    pub(crate) fn write_with(
        &self,
        key: u64,
        order: Order,
    ) -> RwLockWriteGuard<'_, crate::write_behind::PageSet> {
        let guard = self.lock.write_with(key, order);
        self.exclusive_begins();
        guard
    }

    /// Waits out the reads in flight and starts a new epoch (the caller now holds the lock
    /// exclusively).
    fn exclusive_begins(&self) {
        let mut reads = self.reads.lock();
        while *reads > 0 {
            self.reads_done.wait(&mut reads);
        }
        drop(reads);
        self.epoch.fetch_add(1, Ordering::SeqCst);
    }

    /// The exclusive lock if it is free and no read is in flight.
    pub(crate) fn try_write(&self) -> Option<RwLockWriteGuard<'_, crate::write_behind::PageSet>> {
        let guard = self.lock.try_write()?;
        if *self.reads.lock() > 0 {
            return None;
        }
        self.epoch.fetch_add(1, Ordering::SeqCst);
        Some(guard)
    }

    /// Exclusive holds so far; the caller holds the shared lock, so it cannot change.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }
}

/// A read whose device transfer is in flight after its I/O lock was given back; taken
/// under the shared lock, it holds off exclusive holders until dropped.
#[derive(Debug)]
pub(crate) struct InFlightRead {
    inode: Arc<Inode>,
}

impl InFlightRead {
    /// Counts a read of `inode`, whose I/O lock the caller holds shared (`_held`).
    pub(crate) fn begin(
        inode: &Arc<Inode>,
        _held: &RwLockReadGuard<'_, crate::write_behind::PageSet>,
    ) -> Self {
        *inode.io.reads.lock() += 1;
        Self {
            inode: Arc::clone(inode),
        }
    }
}

impl Drop for InFlightRead {
    fn drop(&mut self) {
        let io = &self.inode.io;
        let mut reads = io.reads.lock();
        *reads -= 1;
        if *reads == 0 {
            io.reads_done.notify_all();
        }
    }
}

/// One cached inode.
#[derive(Debug)]
pub(crate) struct Inode {
    pub number: u64,
    /// The I/O lock, with the reads in flight that hold off its exclusive holders.
    pub io: IoLock,
    /// The metadata lock and the state it guards.
    pub data: Mutex<InodeData>,
}

impl Inode {
    pub(crate) fn new(number: u64, data: InodeData) -> Self {
        Self {
            number,
            io: IoLock::new(number),
            data: Mutex::keyed(Rank::Inode, number, data),
        }
    }

    /// The metadata lock taken as a directory whose entries the holder reads or changes:
    /// a parent, locked before the inodes its entries name (`Rank::DirInode`).
    #[track_caller]
    pub(crate) fn lock_dir(&self) -> MutexGuard<'_, InodeData> {
        self.data
            .lock_ranked(Rank::DirInode, self.number, Order::Ranked)
    }

    /// `lock_dir` for a second directory, under the rule `rule` (only rename, under the
    /// rename lock, holds two directories).
    #[track_caller]
    pub(crate) fn lock_dir_nested(&self, rule: &'static str) -> MutexGuard<'_, InodeData> {
        self.data
            .lock_ranked(Rank::DirInode, self.number, Order::Declared(rule))
    }

    /// The metadata lock of an inode this transaction just allocated, taken while the
    /// transaction holds its AGI and buffers. Exempt from the order: the inode was free, and
    /// holders of a free inode's lock (a lookup or forget of a stale number, reclaim) only
    /// look at it and wait for nothing.
    #[track_caller]
    pub(crate) fn lock_fresh(&self) -> MutexGuard<'_, InodeData> {
        self.data.lock_ranked(
            Rank::Inode,
            self.number,
            Order::Exempt("a newly allocated inode: holders of a free inode wait for nothing"),
        )
    }

    /// The metadata lock of a second inode (`Rank::Inode`), under the rule `rule`.
    #[track_caller]
    pub(crate) fn lock_nested(&self, rule: &'static str) -> MutexGuard<'_, InodeData> {
        self.data.lock_nested(rule)
    }
}

/// The API kind of a format file type.
pub(crate) fn kind_of(file_type: Option<FileType>) -> FileKind {
    match file_type {
        Some(FileType::Directory) => FileKind::Directory,
        Some(FileType::Symlink) => FileKind::Symlink,
        Some(FileType::CharDevice) => FileKind::CharDevice,
        Some(FileType::BlockDevice) => FileKind::BlockDevice,
        Some(FileType::Fifo) => FileKind::Fifo,
        Some(FileType::Socket) => FileKind::Socket,
        _ => FileKind::Regular,
    }
}

/// The format file type of an API kind.
pub(crate) fn file_type_of(kind: FileKind) -> FileType {
    match kind {
        FileKind::Regular => FileType::Regular,
        FileKind::Directory => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::CharDevice => FileType::CharDevice,
        FileKind::BlockDevice => FileType::BlockDevice,
        FileKind::Fifo => FileType::Fifo,
        FileKind::Socket => FileType::Socket,
    }
}

/// A timestamp as a `SystemTime`.
pub(crate) fn system_time(time: Timestamp) -> SystemTime {
    let nanos = Duration::from_nanos(u64::from(time.nanoseconds));
    if time.seconds >= 0 {
        UNIX_EPOCH + Duration::from_secs(time.seconds as u64) + nanos
    } else {
        UNIX_EPOCH - Duration::from_secs(time.seconds.unsigned_abs()) + nanos
    }
}

/// A `SystemTime` as a timestamp.
pub(crate) fn timestamp(time: SystemTime) -> Timestamp {
    match time.duration_since(UNIX_EPOCH) {
        Ok(since) => Timestamp {
            seconds: since.as_secs() as i64,
            nanoseconds: since.subsec_nanos(),
        },
        Err(before) => {
            let before = before.duration();
            let mut seconds = -(before.as_secs() as i64);
            let mut nanoseconds = 0;
            if before.subsec_nanos() > 0 {
                seconds -= 1;
                nanoseconds = 1_000_000_000 - before.subsec_nanos();
            }
            Timestamp {
                seconds,
                nanoseconds,
            }
        }
    }
}

/// The current time as a timestamp, from the clock the kernel stamps inode times with
/// (`CLOCK_REALTIME_COARSE`, as its `current_time`). With the writeback cache the kernel
/// sets a file's modification and change times itself; a time taken here from the finer
/// clock could be later than the kernel's next stamp (the coarse clock lags by up to a
/// tick), so a new file's birth time would follow its first write's mtime, which statx
/// callers (fstests' generic/423) check never happens.
pub(crate) fn now() -> Timestamp {
    let mut coarse = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into `coarse`, which lives for the call.
    let read = unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut coarse) };
    let nanoseconds = u32::try_from(coarse.tv_nsec)
        .ok()
        .filter(|&n| n < 1_000_000_000);
    match (read, nanoseconds) {
        (0, Some(nanoseconds)) => Timestamp {
            seconds: coarse.tv_sec,
            nanoseconds,
        },
        _ => timestamp(SystemTime::now()),
    }
}

/// The inode cache: inode number to in-core inode.
///
/// Reclaim rule: the table may grow past its soft limit (`target`) while nothing is
/// freeable. A pass runs only when the table is over the limit, some inode is a reclaim
/// candidate, and at least `target / RECLAIM_INTERVAL_DIVISOR` inodes were inserted since
/// the previous pass; it looks at the candidates only, never the whole table.
#[derive(Debug)]
pub(crate) struct InodeCache {
    state: Mutex<CacheState>,
    /// The soft limit on cached inodes.
    target: AtomicUsize,
    pub reclaimed: AtomicU64,
    /// Reclaim passes run (each forces the log and pushes the AIL).
    pub passes: AtomicU64,
}

#[derive(Debug, Default)]
struct CacheState {
    map: HashMap<u64, Arc<Inode>>,
    /// Inodes that may be freeable: cached with no lookup reference and no open handle when
    /// they entered the set (loaded, or their last reference dropped). Superset of the
    /// freeable inodes; a pass drops the ones that turned out referenced.
    candidates: HashSet<u64>,
    /// Inodes inserted since the last pass.
    inserted: usize,
}

/// A pass may run once per `target / RECLAIM_INTERVAL_DIVISOR` insertions.
const RECLAIM_INTERVAL_DIVISOR: usize = 16;

/// What a reclaim pass found for one candidate.
pub(crate) enum Verdict {
    /// Referenced by FUSE or an open handle: no longer a candidate.
    Referenced,
    /// Idle but busy or not yet clean at home: stays a candidate.
    Retry,
    /// Idle and clean: dropped from the cache.
    Drop,
}

/// Where an inode lives: its cluster buffer (one block) and its byte offset in it.
pub(crate) fn inode_home(geometry: &Geometry, number: u64) -> Option<(BufKey, usize)> {
    let (block, offset): (FsBlock, usize) = geometry.inode_position(InodeNumber(number))?;
    Some((BufKey::single(block.0), offset))
}

/// The blocks of the inode chunk that holds `home` (chunks are aligned to their length):
/// read whole on a miss, since a cold inode's neighbours (a directory's other entries, as
/// `readdirplus` and `find` list them) are usually wanted next.
fn inode_chunk(geometry: &Geometry, home: BufKey) -> BufKey {
    let blocks = geometry.chunk_blocks().max(1);
    let ag_block = geometry.ag_block_of(home.block).0;
    let first = home.block.0 - u64::from(ag_block % blocks);
    BufKey::new(FsBlock(first), blocks)
}

impl InodeCache {
    pub fn new() -> Self {
        Self {
            state: Mutex::new(Rank::InodeCache, CacheState::default()),
            target: AtomicUsize::new(INODE_CACHE_TARGET),
            reclaimed: AtomicU64::new(0),
            passes: AtomicU64::new(0),
        }
    }

    /// Lowers (or raises) the soft limit, for tests.
    #[cfg(test)]
    pub fn set_target(&self, target: usize) {
        self.target.store(target, Ordering::Relaxed);
    }

    pub fn len(&self) -> usize {
        self.state.lock().map.len()
    }

    /// Every cached inode (the cache's lock is not held while the caller looks at them).
    pub(crate) fn all(&self) -> Vec<Arc<Inode>> {
        self.state.lock().map.values().cloned().collect()
    }

    /// The cached inode `number`, reading it from its cluster on a miss.
    pub fn get(
        &self,
        cache: &BufferCache,
        spec: &ReadSpec,
        geometry: &Geometry,
        number: u64,
    ) -> Result<Arc<Inode>, FsError> {
        if let Some(inode) = self.state.lock().map.get(&number) {
            return Ok(Arc::clone(inode));
        }
        let loaded = read_inode(cache, spec, geometry, number)?;
        Ok(self.insert(loaded))
    }

    /// The cached inode `number`, if cached.
    pub fn cached(&self, number: u64) -> Option<Arc<Inode>> {
        self.state.lock().map.get(&number).cloned()
    }

    /// Caches `inode` unless a copy is cached already; returns the cached one. A new inode
    /// holds no references yet, so it becomes a reclaim candidate.
    pub fn insert(&self, inode: Inode) -> Arc<Inode> {
        let mut state = self.state.lock();
        let state = &mut *state;
        let number = inode.number;
        if let Some(cached) = state.map.get(&number) {
            return Arc::clone(cached);
        }
        let inode = Arc::new(inode);
        state.map.insert(number, Arc::clone(&inode));
        state.candidates.insert(number);
        state.inserted += 1;
        inode
    }

    /// Records that `number` lost its last lookup reference and open handle.
    pub fn note_idle(&self, number: u64) {
        let mut state = self.state.lock();
        if state.map.contains_key(&number) {
            state.candidates.insert(number);
        }
    }

    /// Whether a reclaim pass should run now (see the rule on `InodeCache`). Claims the pass:
    /// a caller that sees `true` must run it; concurrent callers see `false`.
    pub fn reclaim_due(&self) -> bool {
        let target = self.target.load(Ordering::Relaxed);
        let interval = (target / RECLAIM_INTERVAL_DIVISOR).max(1);
        let mut state = self.state.lock();
        let due =
            state.map.len() > target && !state.candidates.is_empty() && state.inserted >= interval;
        if due {
            state.inserted = 0;
        }
        due
    }

    /// Takes the current candidates for a pass.
    pub fn take_candidates(&self) -> Vec<u64> {
        self.passes.fetch_add(1, Ordering::Relaxed);
        self.state.lock().candidates.drain().collect()
    }

    /// Judges candidate `number` with the cache locked: nobody else may hold it, and `judge`
    /// (given the inode) decides. Drops it, keeps it a candidate, or forgets the candidacy.
    pub fn judge(&self, number: u64, judge: impl FnOnce(&Inode) -> Verdict) {
        let mut state = self.state.lock();
        let Some(inode) = state.map.get(&number) else {
            return;
        };
        if Arc::strong_count(inode) > 1 {
            state.candidates.insert(number);
            return;
        }
        match judge(inode) {
            Verdict::Referenced => {}
            Verdict::Retry => {
                state.candidates.insert(number);
            }
            Verdict::Drop => {
                state.map.remove(&number);
                self.reclaimed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Reads inode `number` from its home cluster through the buffer cache.
pub(crate) fn read_inode(
    cache: &BufferCache,
    spec: &ReadSpec,
    geometry: &Geometry,
    number: u64,
) -> Result<Inode, FsError> {
    let (key, offset) = inode_home(geometry, number).ok_or(FsError::NotFound)?;
    if !cache.is_cached(key) {
        cache.read_ahead(inode_chunk(geometry, key), spec);
    }
    let guard = cache.get(key, spec)?;
    let size = geometry.inode_size as usize;
    let raw = guard
        .get(offset..offset + size)
        .ok_or_else(|| FsError::corrupt("inode", number, "outside its cluster"))?
        .to_vec();
    drop(guard);
    let expected = Expected {
        kind: MetaKind::Inode,
        blkno: number,
        uuid: spec.uuid,
        owner: Some(number),
    };
    let core = InodeCore::read(&raw, &expected)
        .map_err(|e| FsError::corrupt("inode", number, e.to_string()))?;
    Ok(Inode::new(
        number,
        InodeData {
            disk_size: core.size,
            emptied_by_truncate: false,
            core,
            raw,
            last_sequence: 0,
            datasync_sequence: 0,
            lookups: 0,
            opens: 0,
            acls: OnceCell::new(),
            delayed_blocks: 0,
            unguarded_writers: 0,
            linkable: false,
        },
    ))
}

/// Whether the home copy of `data` (in the buffer cache) equals it, ignoring LSN and CRC.
pub(crate) fn home_matches(
    cache: &BufferCache,
    spec: &ReadSpec,
    geometry: &Geometry,
    number: u64,
    data: &mut InodeData,
) -> bool {
    let Some((key, offset)) = inode_home(geometry, number) else {
        return false;
    };
    let Ok(guard) = cache.try_get(key, spec) else {
        return false;
    };
    let image = data.image().to_vec();
    if data.size_not_logged() {
        // The home copy has the logged size: dropping the inode would lose the real one.
        return false;
    }
    let size = image.len();
    let Some(home) = guard.get(offset..offset + size) else {
        return false;
    };
    // Bytes 4..8 are the CRC and 16..24 the LSN, both restamped on the way home.
    let same = |range: std::ops::Range<usize>| home[range.clone()] == image[range];
    same(0..4) && same(8..16) && same(24..size)
}
