//! Reads handed over (`Filesystem::read_handed_over`): the caller gives the read a `Deliver`
//! callback and goes on, so one thread can have many reads at the device.
//!
//! - **Alone, a read is synchronous** (the caller's thread reads into its spare buffer and
//!   delivers before returning): a request served by one thread costs the fewest wake-ups.
//! - **Beside other reads** (another being served or at the device, or requests queued for
//!   the caller, who says so) it goes to the device
//!   with `BlockDevice::read_async` into one of the read buffers and is delivered from the
//!   device's completion thread. Its `InFlightRead` holds off the inode's exclusive I/O
//!   lock holders until the transfer is done, as the shared lock held by a synchronous
//!   read does.
//! - **Read-ahead.** An `O_DIRECT` handle whose requests follow each other gets the next
//!   `window` bytes read ahead in chunks (each one read, at least `CHUNK_MIN_BYTES`), so
//!   the device works on the next request's data while this one is answered. A request
//!   inside a chunk is served from it: at once if it landed, else delivered when it lands.
//!   A chunk is used only while the inode's I/O lock epoch is the one it was read at (no
//!   write, truncation or other change since); any other request drops the window.
//! - **Memory.** Read buffers (async reads and read-ahead chunks) come from `ReadBuffers`,
//!   whose bytes, in use or kept for reuse, never pass its cap
//!   (`MountOptions::read_buffers`); without room a read is synchronous and read-ahead
//!   stops. Cached dirty pages of the inode (write-behind) make a read synchronous too
//!   (they are laid over what the device returns).
//!
//! `Deliver` runs on the completion thread for reads it finishes: it must not wait for a
//! lock a writer may hold while it waits for reads in flight (an inode's I/O lock).

use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use cairn_blockdev::{AlignedBuf, ReadJob};
use cairn_lockrank::{Mutex, Rank};

use crate::FsError;
use crate::fs::Filesystem;
use crate::inode::{InFlightRead, Inode};
use crate::iobuf::{self, ReadData};

/// What receives a handed-over read's bytes, or its error.
pub type Deliver = Box<dyn FnOnce(Result<ReadData, FsError>) + Send>;

/// The most bytes one handle reads ahead of its last request.
const WINDOW_MAX_BYTES: u64 = 4 << 20;
/// Read-ahead chunks are at least this large, so small sequential requests share a device
/// read; a chunk is as large as the request otherwise.
const CHUNK_MIN_BYTES: u64 = 256 << 10;
/// Buffers kept for reuse, at most (beyond this they are freed as they come back).
const BUFFERS_KEPT: usize = 32;
/// Smallest read buffer allocation.
const BUFFER_MIN_BYTES: usize = 16 << 10;

/// Read statistics (`cairn stats`, `[reads]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReadStats {
    /// Reads served on the caller's thread.
    pub sync_reads: u64,
    /// Reads handed to the device's completion thread.
    pub async_reads: u64,
    /// Requests served from read-ahead.
    pub read_ahead_hits: u64,
    /// Read-ahead chunks read, and those dropped before any request used them.
    pub read_ahead_chunks: u64,
    pub read_ahead_unused: u64,
    /// Bytes the read buffers hold now (in use or kept), and their cap.
    pub buffer_bytes: u64,
    pub buffer_cap_bytes: u64,
    /// Times a buffer was refused for the cap (the read went synchronous, or no read-ahead).
    pub buffer_refusals: u64,
}

/// The read buffers and their cap.
#[derive(Debug)]
pub(crate) struct ReadBuffers {
    cap_bytes: usize,
    /// Bytes allocated: buffers in use plus those kept.
    held_bytes: AtomicUsize,
    kept: parking_lot::Mutex<Vec<AlignedBuf>>,
    refusals: AtomicU64,
}

impl ReadBuffers {
    fn new(cap_bytes: u64) -> Self {
        Self {
            cap_bytes: usize::try_from(cap_bytes).unwrap_or(usize::MAX),
            held_bytes: AtomicUsize::new(0),
            kept: parking_lot::Mutex::new(Vec::new()),
            refusals: AtomicU64::new(0),
        }
    }

    /// A buffer of `len` bytes (unspecified contents), or `None` if it would pass the cap.
    fn take(&self, len: usize) -> Option<AlignedBuf> {
        let capacity = len.next_power_of_two().max(BUFFER_MIN_BYTES);
        let mut kept = self.kept.lock();
        if let Some(at) = kept.iter().position(|buf| buf.capacity() == capacity) {
            let mut buf = kept.swap_remove(at);
            buf.set_len(len);
            return Some(buf);
        }
        // Kept buffers of other sizes give way to this one.
        while self.held_bytes.load(Ordering::Relaxed) + capacity > self.cap_bytes {
            let Some(buf) = kept.pop() else {
                self.refusals.fetch_add(1, Ordering::Relaxed);
                return None;
            };
            self.held_bytes.fetch_sub(buf.capacity(), Ordering::Relaxed);
        }
        self.held_bytes.fetch_add(capacity, Ordering::Relaxed);
        drop(kept);
        let mut buf = AlignedBuf::zeroed(capacity);
        buf.set_len(len);
        Some(buf)
    }

    /// `buf`, filled, as a shared buffer that comes back here when its last reader goes.
    fn pooled(self: &Arc<Self>, buf: AlignedBuf) -> Arc<PooledBuf> {
        Arc::new(PooledBuf {
            buf: Some(buf),
            home: Arc::clone(self),
        })
    }

    fn give_back(&self, buf: AlignedBuf) {
        let mut kept = self.kept.lock();
        if kept.len() < BUFFERS_KEPT {
            kept.push(buf);
        } else {
            drop(kept);
            self.held_bytes.fetch_sub(buf.capacity(), Ordering::Relaxed);
        }
    }
}

/// A read buffer with file data, shared by the reads it serves; back to `ReadBuffers` when
/// the last is dropped.
#[derive(Debug)]
pub struct PooledBuf {
    buf: Option<AlignedBuf>,
    home: Arc<ReadBuffers>,
}

impl PooledBuf {
    pub(crate) fn bytes(&self) -> &[u8] {
        self.buf.as_deref().unwrap_or(&[])
    }
}

impl Drop for PooledBuf {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            self.home.give_back(buf);
        }
    }
}

/// A read-ahead chunk: file bytes `offset..offset + len`, at byte `skip` of its buffer
/// (which starts on a block), read at I/O lock epoch `epoch`.
#[derive(Debug)]
struct Chunk {
    offset: u64,
    len: u64,
    skip: usize,
    epoch: u64,
    state: parking_lot::Mutex<ChunkState>,
    /// A request was served from it.
    used: std::sync::atomic::AtomicBool,
}

#[derive(Default)]
enum ChunkState {
    /// At the device; requests served from it wait here.
    #[default]
    Reading,
    Waiting(Vec<Waiter>),
    Landed(Arc<PooledBuf>),
    Failed(String),
}

/// A request waiting for a chunk: its window of the chunk's buffer, and where it goes.
struct Waiter {
    window: Range<usize>,
    deliver: Deliver,
}

impl std::fmt::Debug for ChunkState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ChunkState::Reading => f.write_str("Reading"),
            ChunkState::Waiting(waiters) => write!(f, "Waiting({})", waiters.len()),
            ChunkState::Landed(_) => f.write_str("Landed"),
            ChunkState::Failed(why) => write!(f, "Failed({why})"),
        }
    }
}

impl Chunk {
    /// The chunk's transfer ended with `outcome`: it keeps the buffer (or the error) and
    /// serves the requests that waited for it.
    fn landed(&self, outcome: Result<Arc<PooledBuf>, String>) {
        let previous = {
            let mut state = self.state.lock();
            let now = match &outcome {
                Ok(buf) => ChunkState::Landed(Arc::clone(buf)),
                Err(why) => ChunkState::Failed(why.clone()),
            };
            std::mem::replace(&mut *state, now)
        };
        if let ChunkState::Waiting(waiters) = previous {
            for waiter in waiters {
                (waiter.deliver)(chunk_data(&outcome, waiter.window));
            }
        }
    }

    /// Serves the request for buffer bytes `window` from this chunk: at once if it landed,
    /// else when it does. Returns whether `deliver` ran.
    fn serve(&self, window: Range<usize>, deliver: Deliver) -> bool {
        self.used.store(true, Ordering::Relaxed);
        let mut state = self.state.lock();
        let ready = match &mut *state {
            ChunkState::Landed(buf) => Ok(Arc::clone(buf)),
            ChunkState::Failed(why) => Err(why.clone()),
            ChunkState::Reading => {
                *state = ChunkState::Waiting(vec![Waiter { window, deliver }]);
                return false;
            }
            ChunkState::Waiting(waiters) => {
                waiters.push(Waiter { window, deliver });
                return false;
            }
        };
        drop(state);
        deliver(chunk_data(&ready, window));
        true
    }

    /// Whether the chunk's read failed (a request then reads for itself).
    fn failed(&self) -> bool {
        matches!(&*self.state.lock(), ChunkState::Failed(_))
    }

    fn was_used(&self) -> bool {
        self.used.load(Ordering::Relaxed)
    }
}

fn chunk_data(
    outcome: &Result<Arc<PooledBuf>, String>,
    window: Range<usize>,
) -> Result<ReadData, FsError> {
    match outcome {
        Ok(buf) => Ok(ReadData::shared(
            Arc::clone(buf),
            window.start,
            window.len(),
        )),
        Err(why) => Err(FsError::Io {
            what: "reading ahead",
            source: why.clone().into(),
        }),
    }
}

/// A chunk and the window of its buffer that answers a request.
type ChunkWindow = (Arc<Chunk>, Range<usize>);

/// A chunk to read ahead, its first block and its buffer.
struct PlannedChunk {
    chunk: Arc<Chunk>,
    first: u64,
    buf: AlignedBuf,
}

/// The read-ahead state of one handle.
#[derive(Debug, Default)]
struct Stream {
    /// Where the next sequential request starts.
    next: u64,
    /// Chunks ahead, in file order, back to back.
    chunks: VecDeque<Arc<Chunk>>,
}

/// The read side of a mount: buffers, read-ahead streams, counters.
#[derive(Debug)]
pub(crate) struct Reads {
    buffers: Arc<ReadBuffers>,
    /// Read-ahead streams by open handle. A leaf, taken under an I/O lock.
    streams: Mutex<HashMap<u64, Stream>>,
    /// Reads between their start and their delivery (synchronous ones) or the end of their
    /// transfer (handed over, and read-ahead chunks): a read that finds another here goes to
    /// the device async.
    busy: Arc<AtomicUsize>,
    sync_reads: AtomicU64,
    async_reads: AtomicU64,
    hits: AtomicU64,
    chunks: AtomicU64,
    unused: AtomicU64,
}

impl Reads {
    pub(crate) fn new(cap_bytes: u64) -> Self {
        Self {
            buffers: Arc::new(ReadBuffers::new(cap_bytes)),
            streams: Mutex::new(Rank::Leaf, HashMap::new()),
            busy: Arc::new(AtomicUsize::new(0)),
            sync_reads: AtomicU64::new(0),
            async_reads: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            chunks: AtomicU64::new(0),
            unused: AtomicU64::new(0),
        }
    }

    pub(crate) fn stats(&self) -> ReadStats {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        ReadStats {
            sync_reads: load(&self.sync_reads),
            async_reads: load(&self.async_reads),
            read_ahead_hits: load(&self.hits),
            read_ahead_chunks: load(&self.chunks),
            read_ahead_unused: load(&self.unused),
            buffer_bytes: self.buffers.held_bytes.load(Ordering::Relaxed) as u64,
            buffer_cap_bytes: self.buffers.cap_bytes as u64,
            buffer_refusals: load(&self.buffers.refusals),
        }
    }

    /// Forgets `handle`'s read-ahead (its release); chunks at the device finish unseen.
    pub(crate) fn forget_handle(&self, handle: u64) {
        let stream = self.streams.lock().remove(&handle);
        if let Some(stream) = stream {
            self.drop_chunks(stream.chunks);
        }
    }

    fn drop_chunks(&self, chunks: impl IntoIterator<Item = Arc<Chunk>>) {
        let unused = chunks.into_iter().filter(|chunk| !chunk.was_used()).count();
        self.unused.fetch_add(unused as u64, Ordering::Relaxed);
    }
}

impl Filesystem {
    /// Reads up to `len` bytes at `offset` of `inode` through open handle `handle` and hands
    /// them to `deliver` (short at end of file). `queued` says whether other requests wait
    /// for the caller (asked only when no other read is busy: a read beside them is handed
    /// over, so the caller can take them). Returns `true` when `deliver` ran before this
    /// returned, `false` when it may run on the device's completion thread (see the module
    /// documentation for which reads go which way).
    pub fn read_handed_over(
        &self,
        inode: u64,
        handle: u64,
        (offset, len): (u64, u32),
        queued: impl FnOnce() -> bool,
        deliver: Deliver,
    ) -> bool {
        let (busy, others) = BusyRead::begin(&self.reads.busy);
        let beside_others = others > 0 || queued();
        match self.read_started(inode, handle, (offset, len), beside_others) {
            Ok(Started::Later(job)) => {
                job.go(self, busy, deliver);
                false
            }
            Ok(Started::Now(data)) => {
                drop(busy);
                deliver(Ok(data));
                true
            }
            Ok(Started::FromChunk(chunk, window)) => {
                drop(busy);
                chunk.serve(window, deliver)
            }
            Err(error) => {
                drop(busy);
                deliver(Err(error));
                true
            }
        }
    }

    /// The part of a handed-over read done under the inode's I/O lock: mapping, read-ahead
    /// bookkeeping, and the read itself when it is synchronous.
    fn read_started(
        &self,
        inode: u64,
        handle: u64,
        (offset, len): (u64, u32),
        beside_others: bool,
    ) -> Result<Started, FsError> {
        let file = self.live_inode(inode)?;
        let pages = file.io.read();
        let (size, generation) = {
            let data = file.data.lock();
            crate::data::check_data_file(&data)?;
            (data.core.size, data.core.generation)
        };
        let end = size.min(offset.saturating_add(u64::from(len)));
        if offset >= end {
            self.accessed(inode, &file);
            return Ok(Started::Now(ReadData::empty()));
        }
        Self::count(&self.counters.reads, 1);
        Self::count(&self.counters.read_bytes, end - offset);
        let read_ahead = crate::attr::handle_is_direct(handle) && pages.is_empty();
        let epoch = file.io.epoch();
        let (from_chunk, ahead) = match read_ahead {
            true => self.follow_stream(handle, (offset, end), (size, epoch)),
            false => (None, Vec::new()),
        };
        let extents = self.data_cache.inode(inode, generation);
        let mut jobs = Vec::new();
        for planned in ahead {
            jobs.extend(self.chunk_job(&file, &pages, &extents, planned));
        }
        let started = match from_chunk {
            Some((chunk, window)) => {
                self.reads.hits.fetch_add(1, Ordering::Relaxed);
                Ok(Started::FromChunk(chunk, window))
            }
            None => self.read_range(&file, &pages, &extents, (offset, end), beside_others),
        };
        self.accessed(inode, &file);
        drop(pages);
        for (job, chunk, guard) in jobs {
            self.read_chunk(job, chunk, guard);
        }
        started
    }

    /// A read of file bytes `offset..end` not served by read-ahead: synchronous, or set up
    /// for the device's completion thread when `beside_others` and a buffer is free.
    fn read_range(
        &self,
        file: &Arc<Inode>,
        pages: &cairn_lockrank::RwLockReadGuard<'_, crate::write_behind::PageSet>,
        extents: &cairn_extcache::InodeExtents,
        (offset, end): (u64, u64),
        beside_others: bool,
    ) -> Result<Started, FsError> {
        let block_size = u64::from(self.geometry.block_size);
        let first = offset / block_size;
        let bytes = ((end.div_ceil(block_size) - first) * block_size) as usize;
        let start = (offset - first * block_size) as usize;
        let len = (end - offset) as usize;
        let pooled = match beside_others && pages.is_empty() {
            true => self.reads.buffers.take(bytes),
            false => None,
        };
        if let Some(mut buf) = pooled {
            let planned = self.plan_blocks(file, extents, first, &mut buf);
            let planned = match planned {
                Ok(planned) => planned,
                Err(error) => {
                    self.reads.buffers.give_back(buf);
                    return Err(error);
                }
            };
            if planned.is_empty() {
                // Holes and unwritten blocks only: nothing for the device.
                self.reads.sync_reads.fetch_add(1, Ordering::Relaxed);
                let buf = self.reads.buffers.pooled(buf);
                return Ok(Started::Now(ReadData::shared(buf, start, len)));
            }
            self.reads.async_reads.fetch_add(1, Ordering::Relaxed);
            let guard = InFlightRead::begin(file, pages);
            return Ok(Started::Later(HandedOver {
                job: ReadJob {
                    buf,
                    parts: planned,
                },
                window: start..start + len,
                guard,
            }));
        }
        self.reads.sync_reads.fetch_add(1, Ordering::Relaxed);
        let mut buf = iobuf::take(bytes);
        if let Err(error) = self.read_blocks(file, extents, first, &mut buf) {
            iobuf::give_back(buf);
            return Err(error);
        }
        pages.overlay(first, &mut buf, block_size as usize);
        Ok(Started::Now(ReadData::new(buf, start, len)))
    }

    /// Notes a request of file bytes `offset..end` on `handle`'s stream (the file is `size`
    /// bytes at I/O epoch `epoch`): the chunk that serves it, if one does, and the chunks
    /// to read ahead now.
    fn follow_stream(
        &self,
        handle: u64,
        (offset, end): (u64, u64),
        (size, epoch): (u64, u64),
    ) -> (Option<ChunkWindow>, Vec<PlannedChunk>) {
        let mut streams = self.reads.streams.lock();
        let stream = streams.entry(handle).or_default();
        let sequential = offset == stream.next;
        stream.next = end;
        // Chunks wholly before the request are behind the reader.
        while stream
            .chunks
            .front()
            .is_some_and(|c| c.offset + c.len <= offset)
        {
            let passed = stream.chunks.pop_front();
            self.reads.drop_chunks(passed);
        }
        let serving = stream.chunks.front().filter(|chunk| {
            chunk.epoch == epoch
                && chunk.offset <= offset
                && end <= chunk.offset + chunk.len
                && !chunk.failed()
        });
        let from_chunk = serving.map(|chunk| {
            let at = chunk.skip + (offset - chunk.offset) as usize;
            (Arc::clone(chunk), at..at + (end - offset) as usize)
        });
        if from_chunk.is_none() {
            let dropped = std::mem::take(&mut stream.chunks);
            self.reads.drop_chunks(dropped);
        }
        if !sequential && from_chunk.is_none() {
            return (None, Vec::new());
        }
        let ahead = self.plan_ahead(stream, (end - offset, end), (size, epoch));
        (from_chunk, ahead)
    }

    /// New chunks for `stream` so that `window` bytes past the request's `end` are read
    /// ahead (chunks of the request's length `request`, at least `CHUNK_MIN_BYTES`), within
    /// the file's `size`, each with its buffer; as many as the read buffers' cap allows.
    fn plan_ahead(
        &self,
        stream: &mut Stream,
        (request, end): (u64, u64),
        (size, epoch): (u64, u64),
    ) -> Vec<PlannedChunk> {
        let block_size = u64::from(self.geometry.block_size);
        let chunk_bytes = request.max(CHUNK_MIN_BYTES);
        let window = (4 * chunk_bytes).min(WINDOW_MAX_BYTES.max(chunk_bytes));
        let mut from = stream.chunks.back().map_or(end, |c| c.offset + c.len);
        let mut planned = Vec::new();
        while from < size && from < end + window {
            let to = (from + chunk_bytes).min(size);
            let first = from / block_size;
            let blocks = to.div_ceil(block_size) - first;
            let Some(buf) = self.reads.buffers.take((blocks * block_size) as usize) else {
                break;
            };
            let chunk = Arc::new(Chunk {
                offset: from,
                len: to - from,
                skip: (from - first * block_size) as usize,
                epoch,
                state: parking_lot::Mutex::new(ChunkState::Reading),
                used: std::sync::atomic::AtomicBool::new(false),
            });
            stream.chunks.push_back(Arc::clone(&chunk));
            planned.push(PlannedChunk { chunk, first, buf });
            from = to;
        }
        planned
    }

    /// Sets up the device reads of a read-ahead chunk; `None` if its blocks cannot be
    /// mapped (the chunk then fails, and requests pass it by).
    fn chunk_job(
        &self,
        file: &Arc<Inode>,
        pages: &cairn_lockrank::RwLockReadGuard<'_, crate::write_behind::PageSet>,
        extents: &cairn_extcache::InodeExtents,
        planned: PlannedChunk,
    ) -> Option<(ReadJob, Arc<Chunk>, InFlightRead)> {
        let PlannedChunk {
            chunk,
            first,
            mut buf,
        } = planned;
        match self.plan_blocks(file, extents, first, &mut buf) {
            Ok(parts) => {
                self.reads.chunks.fetch_add(1, Ordering::Relaxed);
                let guard = InFlightRead::begin(file, pages);
                Some((ReadJob { buf, parts }, chunk, guard))
            }
            Err(error) => {
                self.reads.buffers.give_back(buf);
                chunk.landed(Err(error.to_string()));
                None
            }
        }
    }

    /// Hands a read-ahead chunk's reads to the device (busy, so reads beside it go there
    /// too, until it lands).
    fn read_chunk(&self, job: ReadJob, chunk: Arc<Chunk>, guard: InFlightRead) {
        let home = Arc::clone(&self.reads.buffers);
        let (busy, _) = BusyRead::begin(&self.reads.busy);
        self.device.read_async(
            job,
            Box::new(move |buf, outcome| {
                drop(guard);
                drop(busy);
                let outcome = match outcome {
                    Ok(()) => Ok(home.pooled(buf)),
                    Err(error) => {
                        home.give_back(buf);
                        Err(error.to_string())
                    }
                };
                chunk.landed(outcome);
            }),
        );
    }
}

/// How a handed-over read goes on once its I/O lock is given back.
enum Started {
    /// Read (or empty): deliver now.
    Now(ReadData),
    /// To the device: deliver from the completion thread.
    Later(HandedOver),
    /// From a read-ahead chunk's buffer window.
    FromChunk(Arc<Chunk>, Range<usize>),
}

/// A read set up for the device: its job, the window of the buffer it answers with, and
/// what holds off exclusive holders of the inode's I/O lock until the transfer is done.
struct HandedOver {
    job: ReadJob,
    window: Range<usize>,
    guard: InFlightRead,
}

impl HandedOver {
    /// Hands the read to the device; it stays `busy` until its transfer is done.
    fn go(self, fs: &Filesystem, busy: BusyRead, deliver: Deliver) {
        let home = Arc::clone(&fs.reads.buffers);
        let HandedOver { job, window, guard } = self;
        fs.device.read_async(
            job,
            Box::new(move |buf, outcome| {
                drop(guard);
                drop(busy);
                let data = outcome
                    .map_err(FsError::from)
                    .map(|()| ReadData::shared(home.pooled(buf), window.start, window.len()));
                deliver(data);
            }),
        );
    }
}

/// One read counted in `Reads::busy` until dropped.
struct BusyRead(Arc<AtomicUsize>);

impl BusyRead {
    /// Counts a read; also returns how many others were busy.
    fn begin(busy: &Arc<AtomicUsize>) -> (Self, usize) {
        let others = busy.fetch_add(1, Ordering::SeqCst);
        (Self(Arc::clone(busy)), others)
    }
}

impl Drop for BusyRead {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
