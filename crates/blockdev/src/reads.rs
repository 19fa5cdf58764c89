//! Reads in flight without a waiting thread: `FileDevice::read_async`.
//!
//! A thread that serves a read waits for the device, so a daemon whose threads all wait has
//! no more reads in flight than threads (4 KiB random reads at queue depth 16 reached 0.4x of
//! kernel XFS with two). Here the caller hands a read over and goes on; a completion thread
//! per device submits it to an io_uring and, when every part of it has landed, hands the
//! buffer to the read's `done` callback. The completion thread is the ring's only user (the
//! kernel then runs its completions in that thread's own wait, `DEFER_TASKRUN`); callers
//! queue reads under a mutex and wake it through an eventfd the ring polls, only when it
//! sleeps.
//!
//! `done` runs on the completion thread: it must not wait for anything another read's
//! completion could hold up (a lock whose holder waits for reads to finish).

use std::collections::VecDeque;
use std::io;
use std::ops::Range;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use io_uring::{IoUring, cqueue, opcode, types};
use parking_lot::Mutex;

use crate::{AlignedBuf, DeviceError};

/// Submission queue entries: device reads in flight at most (more wait in the queue).
const RING_ENTRIES: u32 = 128;
/// `user_data` of the eventfd poll; reads use their slot number.
const WAKE_TAG: u64 = u64::MAX;
/// A caller that queues a read wakes the completion thread only when it has fewer device
/// reads than this in flight; with more, it wakes for one of them soon and takes the new
/// read then (a wake-up per read cost a context switch per 4 KiB read at queue depth 16).
const WAKE_BELOW_PARTS: usize = 4;

/// One read: a buffer and the device reads that fill parts of it, as `(device offset,
/// byte range of the buffer)`. Offsets, lengths and the parts' addresses must suit the
/// device's direct I/O (the caller checks, `FileDevice::read_async`).
#[derive(Debug)]
pub struct ReadJob {
    pub buf: AlignedBuf,
    pub parts: Vec<(u64, Range<usize>)>,
}

/// What runs once a read's parts have all landed (or the first failure is known): the
/// buffer back, and the outcome.
pub type ReadDone = Box<dyn FnOnce(AlignedBuf, Result<(), DeviceError>) + Send>;

/// A queued or submitted read.
struct Pending {
    job: ReadJob,
    done: ReadDone,
    /// Parts not landed yet.
    remaining: usize,
    outcome: Result<(), DeviceError>,
}

/// The state shared by callers and the completion thread.
struct Shared {
    queue: Mutex<VecDeque<(ReadJob, ReadDone)>>,
    /// The completion thread is about to wait, or waits: a caller that queues must wake it
    /// (unless `in_flight_parts` reaches `WAKE_BELOW_PARTS`).
    sleeping: AtomicBool,
    /// Device reads submitted and not completed, as the completion thread last counted
    /// them (it changes this only while awake).
    in_flight_parts: AtomicUsize,
    closing: AtomicBool,
    wake: OwnedFd,
    /// Reads handed over and not yet done (statistics).
    in_flight: AtomicU64,
}

impl Shared {
    fn wake(&self) {
        #[expect(
            clippy::host_endian_bytes,
            reason = "an eventfd's counter is a native u64"
        )]
        let one = 1u64.to_ne_bytes();
        // SAFETY: an 8-byte write from a valid buffer to our own eventfd.
        let _ = unsafe { libc::write(self.wake.as_raw_fd(), one.as_ptr().cast(), 8) };
    }
}

/// The completion thread of one device and the queue it serves.
pub(crate) struct ReadEngine {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for ReadEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadEngine")
            .field("in_flight", &self.shared.in_flight.load(Ordering::Relaxed))
            .finish()
    }
}

impl ReadEngine {
    /// Starts the completion thread for reads of `fd` (which must outlive the engine);
    /// `None` where the kernel refuses io_uring or an eventfd.
    pub(crate) fn start(fd: RawFd, resume_unit: usize) -> Option<ReadEngine> {
        // SAFETY: eventfd has no memory preconditions; the descriptor is checked below.
        let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if raw < 0 {
            return None;
        }
        // SAFETY: a fresh descriptor owned by nobody else.
        let wake = unsafe { OwnedFd::from_raw_fd(raw) };
        let shared = Arc::new(Shared {
            queue: Mutex::new(VecDeque::new()),
            sleeping: AtomicBool::new(false),
            in_flight_parts: AtomicUsize::new(0),
            closing: AtomicBool::new(false),
            wake,
            in_flight: AtomicU64::new(0),
        });
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("cairn-reads".into())
            .spawn(move || {
                let ring = new_ring();
                let started = ring.is_some();
                let _ = ready_tx.send(started);
                if let Some(ring) = ring {
                    Completion::new(ring, fd, thread_shared, resume_unit).run();
                }
            })
            .ok()?;
        if ready_rx.recv().unwrap_or(false) {
            Some(ReadEngine {
                shared,
                thread: Some(thread),
            })
        } else {
            let _ = thread.join();
            None
        }
    }

    /// Queues `job`; `done` runs on the completion thread.
    pub(crate) fn submit(&self, job: ReadJob, done: ReadDone) {
        self.shared.in_flight.fetch_add(1, Ordering::Relaxed);
        self.shared.queue.lock().push_back((job, done));
        // Pairs with the completion thread's store of `sleeping` and its second look at the
        // queue: either it sees this read, or this sees it sleeping and wakes it, or sees
        // reads in flight that will wake it (it counts them before it sleeps).
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.shared.sleeping.load(Ordering::SeqCst)
            && self.shared.in_flight_parts.load(Ordering::SeqCst) < WAKE_BELOW_PARTS
        {
            self.shared.wake();
        }
    }
}

impl Drop for ReadEngine {
    /// Finishes every read handed over (their `done` runs), then stops the thread.
    fn drop(&mut self) {
        self.shared.closing.store(true, Ordering::SeqCst);
        self.shared.wake();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A ring whose completions run only in its owner's waits, else a plain one.
fn new_ring() -> Option<IoUring> {
    IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .build(RING_ENTRIES)
        .or_else(|_| IoUring::new(RING_ENTRIES))
        .ok()
}

/// The completion thread's state.
struct Completion {
    ring: IoUring,
    fd: RawFd,
    shared: Arc<Shared>,
    /// Partial transfers may continue from a multiple of this (the sector, for `O_DIRECT`).
    resume_unit: usize,
    /// Submitted reads by slot; `None` slots are free.
    slots: Vec<Option<Pending>>,
    free: Vec<usize>,
    /// Parts not yet submitted (the ring was full): slot and part index.
    backlog: VecDeque<(usize, usize)>,
    /// Parts submitted and not completed.
    submitted: usize,
    wake_armed: bool,
}

impl Completion {
    fn new(ring: IoUring, fd: RawFd, shared: Arc<Shared>, resume_unit: usize) -> Self {
        Self {
            ring,
            fd,
            shared,
            resume_unit,
            slots: Vec::new(),
            free: Vec::new(),
            backlog: VecDeque::new(),
            submitted: 0,
            wake_armed: false,
        }
    }

    fn run(mut self) {
        loop {
            self.take_queued();
            self.push_backlog();
            let idle = self.submitted == 0 && self.backlog.is_empty();
            self.shared
                .in_flight_parts
                .store(self.submitted, Ordering::SeqCst);
            // Callers must wake this thread from here on; then one more look at the queue,
            // so a read queued before the store is not left waiting (see `submit`).
            self.shared.sleeping.store(true, Ordering::SeqCst);
            let queued = !self.shared.queue.lock().is_empty();
            if queued || (idle && self.shared.closing.load(Ordering::SeqCst)) {
                self.shared.sleeping.store(false, Ordering::SeqCst);
                if !queued {
                    return;
                }
                continue;
            }
            self.arm_wake();
            self.wait();
            self.shared.sleeping.store(false, Ordering::SeqCst);
            self.reap();
        }
    }

    /// Moves queued reads into slots and their parts into the backlog.
    fn take_queued(&mut self) {
        let queued: Vec<_> = self.shared.queue.lock().drain(..).collect();
        for (job, done) in queued {
            let parts = job.parts.len();
            let pending = Pending {
                job,
                done,
                remaining: parts,
                outcome: Ok(()),
            };
            let slot = match self.free.pop() {
                Some(slot) => {
                    self.slots[slot] = Some(pending);
                    slot
                }
                None => {
                    self.slots.push(Some(pending));
                    self.slots.len() - 1
                }
            };
            if parts == 0 {
                self.finish(slot);
                continue;
            }
            self.backlog.extend((0..parts).map(|part| (slot, part)));
        }
    }

    /// Submits backlog parts while the ring has room (at most `RING_ENTRIES` in flight, so
    /// completions never overflow the completion queue).
    fn push_backlog(&mut self) {
        while let Some(&(slot, part)) = self.backlog.front() {
            if self.submitted >= RING_ENTRIES as usize - 1 {
                break;
            }
            let Some(pending) = self.slots[slot].as_mut() else {
                self.backlog.pop_front();
                continue;
            };
            let (offset, range) = pending.job.parts[part].clone();
            let ptr = pending.job.buf[range.clone()].as_mut_ptr();
            let entry = opcode::Read::new(types::Fd(self.fd), ptr, range.len() as u32)
                .offset(offset)
                .build()
                .user_data(((slot as u64) << 24) | part as u64);
            // SAFETY: the buffer stays in its slot until every submitted part completed.
            if unsafe { self.ring.submission().push(&entry) }.is_err() {
                break;
            }
            self.backlog.pop_front();
            self.submitted += 1;
        }
    }

    /// A multishot poll of the eventfd, so a caller's wake ends the wait.
    fn arm_wake(&mut self) {
        if self.wake_armed {
            return;
        }
        let entry =
            opcode::PollAdd::new(types::Fd(self.shared.wake.as_raw_fd()), libc::POLLIN as u32)
                .multi(true)
                .build()
                .user_data(WAKE_TAG);
        // SAFETY: a poll entry refers to no memory of ours.
        if unsafe { self.ring.submission().push(&entry) }.is_ok() {
            self.wake_armed = true;
        }
    }

    /// Submits what is queued and waits for one completion. A failed wait is retried after
    /// a pause (submitted reads complete whatever `io_uring_enter` said).
    fn wait(&mut self) {
        loop {
            match self.ring.submit_and_wait(1) {
                Ok(_) => return,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    if !self.ring.completion().is_empty() {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
    }

    fn reap(&mut self) {
        let completed: Vec<cqueue::Entry> = self.ring.completion().collect();
        for entry in completed {
            if entry.user_data() == WAKE_TAG {
                self.woken(&entry);
                continue;
            }
            self.submitted -= 1;
            let slot = (entry.user_data() >> 24) as usize;
            let part = (entry.user_data() & 0xff_ffff) as usize;
            self.part_done(slot, part, entry.result());
        }
    }

    fn woken(&mut self, entry: &cqueue::Entry) {
        let mut count = [0u8; 8];
        // SAFETY: an 8-byte read into a valid buffer from our own non-blocking eventfd.
        let _ = unsafe { libc::read(self.shared.wake.as_raw_fd(), count.as_mut_ptr().cast(), 8) };
        if !cqueue::more(entry.flags()) {
            self.wake_armed = false;
        }
    }

    /// Part `part` of the read in `slot` completed with `result` (bytes or `-errno`).
    fn part_done(&mut self, slot: usize, part: usize, result: i32) {
        let (fd, unit) = (self.fd, self.resume_unit);
        let Some(pending) = self.slots[slot].as_mut() else {
            return;
        };
        let (offset, range) = pending.job.parts[part].clone();
        let len = range.len();
        let outcome = match result {
            moved if moved >= 0 && moved as usize == len => Ok(()),
            // Interrupted, or a partial transfer ending on a sector: the rest synchronously.
            moved if moved > 0 && (moved as usize).is_multiple_of(unit) => {
                let done = moved as usize;
                let rest = &mut pending.job.buf[range.start + done..range.end];
                read_rest(fd, offset + done as u64, rest, unit)
            }
            errno if errno == -libc::EINTR || errno == -libc::EAGAIN => {
                read_rest(fd, offset, &mut pending.job.buf[range], unit)
            }
            moved if moved >= 0 => Err(DeviceError::ShortTransfer {
                op: "read",
                offset,
                len: len as u64,
                done: moved as u64,
            }),
            errno => Err(DeviceError::Io {
                op: "read",
                offset,
                len: len as u64,
                source: io::Error::from_raw_os_error(-errno),
            }),
        };
        if pending.outcome.is_ok() {
            pending.outcome = outcome;
        }
        pending.remaining -= 1;
        if pending.remaining == 0 {
            self.finish(slot);
        }
    }

    fn finish(&mut self, slot: usize) {
        let Some(pending) = self.slots[slot].take() else {
            return;
        };
        self.free.push(slot);
        self.shared.in_flight.fetch_sub(1, Ordering::Relaxed);
        let Pending {
            job, done, outcome, ..
        } = pending;
        // A panicking callback must not take the thread, and every later read, with it.
        let call = std::panic::AssertUnwindSafe(move || done(job.buf, outcome));
        if std::panic::catch_unwind(call).is_err() {
            tracing_free_log("a read's completion callback panicked");
        }
    }
}

/// Reads all of `buf` at `offset` from `fd` with `pread`: EINTR retried, a partial transfer
/// continued when it ends on a multiple of `unit`.
fn read_rest(fd: RawFd, offset: u64, buf: &mut [u8], unit: usize) -> Result<(), DeviceError> {
    let len = buf.len();
    let mut done = 0;
    while done < len {
        let at = offset + done as u64;
        let rest = &mut buf[done..];
        // SAFETY: a read into a valid, exclusively borrowed buffer of `rest.len()` bytes.
        let moved = unsafe { libc::pread(fd, rest.as_mut_ptr().cast(), rest.len(), at as i64) };
        if moved < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(DeviceError::Io {
                op: "read",
                offset,
                len: len as u64,
                source: error,
            });
        }
        done += moved as usize;
        if moved == 0 || (done < len && !done.is_multiple_of(unit)) {
            return Err(DeviceError::ShortTransfer {
                op: "read",
                offset,
                len: len as u64,
                done: done as u64,
            });
        }
    }
    Ok(())
}

/// Reports a problem of the completion thread on standard error (this crate does not log).
fn tracing_free_log(what: &str) {
    eprintln!("cairn-reads: {what}");
}
