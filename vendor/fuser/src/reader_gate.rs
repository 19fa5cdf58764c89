//! cairn patch (public so cairn's tests reach it): which worker threads wait in `read(2)` on `/dev/fuse`.
//!
//! The kernel wakes the threads blocked in `read` in turn (its wait queue is first in, first
//! out), so with every worker reading, each request of a client that waits for its answers
//! goes to the thread that slept longest: a sleeping thread is woken for every request, on
//! either core, while the thread that just replied goes back to sleep. One thread alone is
//! faster for such a client: it is often back in `read` before the next request arrives.
//!
//! So one thread reads while requests come one at a time, and more read only when requests
//! queue up: a thread that takes a request while no other thread is reading looks (`poll`,
//! no wait) for more queued requests, and calls a parked thread if there are, unless the
//! request it took is a short one (`is_short_request`: lookups, unlinks, forgets...), which
//! it answers sooner than a parked thread could wake. A thread that finishes its request
//! reads again if nobody is reading or requests are queued (so under a steady backlog the
//! threads stay at work instead of parking to be called back), else parks. A parked thread also
//! looks every `FOLLOWER_CHECK` whether requests wait while nobody reads (every reader busy
//! with a long request), so no request waits longer than that for a free thread.
//!
//! Before its blocking `read`, the reader may spin, looking for the next request without
//! waiting (`spin_for_request`): a client that sends its next request within microseconds of
//! the last answer then finds the thread running instead of asleep on an idle core, whose
//! wake-up costs tens of microseconds on a virtual machine. The spin adapts as the kernel's
//! halt polling does: it doubles (up to the configured most) when the request a read waited
//! for came within that most, and halves when a read waited longer than the most, so a quiet
//! filesystem stops spinning.

use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

/// How often a parked thread looks for requests nobody is reading.
const FOLLOWER_CHECK: Duration = Duration::from_millis(10);

#[derive(Debug, Default)]
struct GateState {
    /// Threads in (or about to enter) `read`.
    readers: usize,
    /// Threads parked in `wait_turn`.
    parked: usize,
    /// Parked threads called to read; at most `parked`.
    calls: usize,
    /// The session is ending: parked threads leave.
    closed: bool,
}

/// The first spin after a quiet spell, in nanoseconds.
const SPIN_START_NS: u64 = 2_000;

/// Decides which of a session's worker threads read from the FUSE device.
#[derive(Debug, Default)]
pub struct ReaderGate {
    state: Mutex<GateState>,
    turn: Condvar,
    /// The longest spin before a blocking read, in nanoseconds (0: never spin).
    spin_max_ns: u64,
    /// The spin now, between 0 and `spin_max_ns`.
    spin_ns: AtomicU64,
    /// A `READ` taken with requests waiting returns at once (`with_reads_handed_over`).
    reads_handed_over: bool,
}

impl ReaderGate {
    /// A gate with no thread reading yet, which never spins.
    pub fn new() -> Self {
        Self::default()
    }

    /// A gate whose reader spins up to `spin_max` for its next request before a blocking
    /// read (adapting below that).
    pub fn with_spin(spin_max: Duration) -> Self {
        let spin_max_ns = u64::try_from(spin_max.as_nanos()).unwrap_or(u64::MAX);
        Self {
            spin_max_ns,
            spin_ns: AtomicU64::new(spin_max_ns),
            ..Self::default()
        }
    }

    /// Before the reader's blocking `read`: looks, without waiting, for a queued request for
    /// the current spin. Returns when the read would take one at once (`true`), or at the
    /// end of the spin (`false`: time the read with `read_waited`). Only a lone reader
    /// spins: several readers mean requests are queueing, and spinning threads would take
    /// the cores from the clients and the threads serving them. A thread told to
    /// (`skip_next_spin`) does not spin and returns `true` (its wait says nothing of the
    /// spin's length).
    pub fn spin_for_request(&self, device: BorrowedFd<'_>) -> bool {
        if SKIP_SPIN.replace(false) {
            return true;
        }
        let spin = match self.state.lock().readers {
            1 => Duration::from_nanos(self.spin_ns.load(Ordering::Relaxed)),
            _ => Duration::ZERO,
        };
        let started = Instant::now();
        loop {
            if requests_waiting(device) {
                return true;
            }
            if started.elapsed() >= spin {
                return false;
            }
            std::hint::spin_loop();
        }
    }

    /// After a blocking read that waited `waited` past the spin: a request that came within
    /// the most spin would have been caught by a longer one, so the spin doubles; a wait
    /// longer than the most halves it; one in between leaves it.
    pub fn read_waited(&self, waited: Duration) {
        if self.spin_max_ns == 0 {
            return;
        }
        let spin = self.spin_ns.load(Ordering::Relaxed);
        let waited = u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX);
        let next = if spin.saturating_add(waited) <= self.spin_max_ns {
            spin.saturating_mul(2).max(SPIN_START_NS)
        } else if waited > self.spin_max_ns {
            spin / 2
        } else {
            spin
        };
        self.spin_ns
            .store(next.min(self.spin_max_ns), Ordering::Relaxed);
    }

    /// A gate for a filesystem that hands a `READ` taken while more requests wait to another
    /// thread to answer: such a `READ` counts as short in `received` (its thread is back in
    /// microseconds), so no parked thread is called for the requests behind it.
    pub fn with_reads_handed_over(mut self, reads_handed_over: bool) -> Self {
        self.reads_handed_over = reads_handed_over;
        self
    }

    /// The spin now (for tests and statistics).
    pub fn spin(&self) -> Duration {
        Duration::from_nanos(self.spin_ns.load(Ordering::Relaxed))
    }

    /// Waits until this thread should read: nobody reads, or it was called, or it found
    /// requests waiting that nobody reads. Returns `false` once the session is closing.
    pub fn wait_turn(&self, device: BorrowedFd<'_>) -> bool {
        let mut state = self.state.lock();
        if state.readers == 0 && !state.closed {
            state.readers += 1;
            return true;
        }
        // Another thread reads, but requests are queued already: read them too. Under a
        // steady backlog the threads then stay at work instead of parking and being called.
        drop(state);
        let queued = requests_waiting(device);
        let mut state = self.state.lock();
        if (queued || state.readers == 0) && !state.closed {
            state.readers += 1;
            return true;
        }
        state.parked += 1;
        let read = loop {
            if state.closed {
                break false;
            }
            if state.calls > 0 {
                state.calls -= 1;
                break true;
            }
            let timed_out = self.turn.wait_for(&mut state, FOLLOWER_CHECK).timed_out();
            if timed_out && state.readers == 0 && requests_waiting(device) {
                break true;
            }
        };
        state.parked -= 1;
        state.calls = state.calls.min(state.parked);
        if read {
            state.readers += 1;
        }
        read
    }

    /// After this thread's `read` returned with `request` (empty when the read failed): if no
    /// other thread is reading and requests are queued, calls a parked thread to read them,
    /// unless the request in hand is a short one (`is_short_request`, or a `READ` the
    /// filesystem hands over, `with_reads_handed_over`): then this thread takes the queued
    /// ones itself in a few microseconds, where waking a parked thread on an idle core
    /// costs tens, and the woken thread would compete with the clients for the cores.
    pub fn received(&self, device: BorrowedFd<'_>, request: &[u8]) {
        let mut state = self.state.lock();
        state.readers -= 1;
        if state.readers > 0 || state.parked == state.calls || is_short_request(request) {
            return;
        }
        drop(state);
        if !requests_waiting(device) || (self.reads_handed_over && is_read(request)) {
            return;
        }
        let mut state = self.state.lock();
        if state.calls < state.parked {
            state.calls += 1;
            self.turn.notify_one();
        }
    }

    /// Threads parked in `wait_turn` (for tests and statistics).
    pub fn parked(&self) -> usize {
        self.state.lock().parked
    }

    /// Threads reading or about to read.
    pub fn readers(&self) -> usize {
        self.state.lock().readers
    }

    /// The session is ending (the device is gone, or the filesystem was destroyed): parked
    /// threads return from `wait_turn` with `false`.
    pub fn close(&self) {
        self.state.lock().closed = true;
        self.turn.notify_all();
    }
}

std::thread_local! {
    static SKIP_SPIN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// The device this thread read its current request from (-1: none).
    static SERVING: std::cell::Cell<std::os::fd::RawFd> = const { std::cell::Cell::new(-1) };
}

/// Notes the device this thread's request came from (`None` once it is answered), for
/// `more_requests_waiting`.
pub(crate) fn serving(device: Option<BorrowedFd<'_>>) {
    SERVING.set(device.map_or(-1, |device| device.as_raw_fd()));
}

/// Whether requests wait unread on the device the calling thread's current request came
/// from (a `poll` without waiting; false outside a request). A handler can tell from it that
/// its client, or another, has more requests queued: a read worth handing over to be
/// answered later, so this thread takes the next one now.
pub fn more_requests_waiting() -> bool {
    let fd = SERVING.get();
    if fd < 0 {
        return false;
    }
    // SAFETY: set only while this thread serves a request of the channel, which outlives it.
    requests_waiting(unsafe { BorrowedFd::borrow_raw(fd) })
}

/// Tells this thread's next `ReaderGate::spin_for_request` not to spin: the request it is
/// serving will be answered by another thread (a read handed to the device's completion
/// thread), so the client's next request follows that answer rather than this thread's
/// return, and a spinning thread would take the core the answering thread needs (4 KiB
/// random reads at queue depth 16 took 21-25 us of the daemon's CPU each with the spin,
/// 13-17 us without).
pub fn skip_next_spin() {
    SKIP_SPIN.set(true);
}

/// Whether `request` (a raw request: `fuse_in_header` first) is one a daemon usually answers
/// in microseconds: name and attribute lookups, attribute changes but a size, opens but
/// truncating ones, releases, xattr reads, unlinks and forgets. One that runs long all the
/// same (a forget or release that frees a big file) delays the requests queued behind it by
/// at most `FOLLOWER_CHECK`, when a parked thread looks. Reads, writes, syncs, truncations,
/// creations, renames and directory listings are not short.
pub fn is_short_request(request: &[u8]) -> bool {
    const SETATTR: u32 = 4;
    const OPEN: u32 = 14;
    const SHORT: [u32; 16] = [
        1,  // LOOKUP
        2,  // FORGET
        3,  // GETATTR
        5,  // READLINK
        10, // UNLINK
        11, // RMDIR
        17, // STATFS
        18, // RELEASE
        22, // GETXATTR
        23, // LISTXATTR
        25, // FLUSH
        27, // OPENDIR
        29, // RELEASEDIR
        34, // ACCESS
        36, // INTERRUPT
        42, // BATCH_FORGET
    ];
    // fuse_in_header: len, opcode (u32 each), ...; 40 bytes. Then fuse_setattr_in's
    // `valid`, or fuse_open_in's `flags`, come first.
    const FATTR_SIZE: u32 = 1 << 3;
    const O_TRUNC: u32 = 0o1000;
    let word = |at: usize| {
        let bytes = request.get(at..at + 4)?;
        Some(u32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    };
    match word(4) {
        Some(SETATTR) => word(40).is_some_and(|valid| valid & FATTR_SIZE == 0),
        Some(OPEN) => word(40).is_some_and(|flags| flags & O_TRUNC == 0),
        Some(opcode) => SHORT.contains(&opcode),
        None => false,
    }
}

/// Whether `request` is a `READ` (opcode 15).
fn is_read(request: &[u8]) -> bool {
    request.get(4..8) == Some(&15u32.to_ne_bytes()[..])
}

/// Whether the device has a request (or an error: a reader must see it) for `read`,
/// looked at without waiting.
fn requests_waiting(device: BorrowedFd<'_>) -> bool {
    let mut poll = libc::pollfd {
        fd: device.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, a borrowed descriptor that outlives the call, no wait.
    let ready = unsafe { libc::poll(&mut poll, 1, 0) };
    ready != 0 && poll.revents != 0
}
