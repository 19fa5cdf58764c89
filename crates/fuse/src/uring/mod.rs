//! FUSE over io_uring (`-o uring`): the ring transport. After the `FUSE_INIT` handshake
//! negotiates `FUSE_OVER_IO_URING` (Linux 6.14+, protocol 7.42, with the `fuse` module's
//! `enable_uring` parameter on), each CPU's queue gets `uring_queue_depth` ring entries
//! (a header buffer and a payload buffer sized for `max_write`) per worker thread
//! (`uring_queue_threads` of them, each with its own ring). The kernel puts a request on
//! the queue of the CPU that issued it; the worker rebuilds it as `/dev/fuse` would have
//! handed it over and gives it to fuser's dispatcher, the same
//! decoding and the same `fuser::Filesystem` methods the `/dev/fuse` workers use, and its
//! reply lands in the entry, committed together with the fetch of the next request.
//!
//! `/dev/fuse` stays open and served by the session's threads: the kernel still sends
//! `FORGET` and `INTERRUPT` there (and everything, if the ring is refused).
//!
//! Owns: the per-queue rings, buffers and workers, and the negotiation of the ring.
//! Invariants:
//! - the daemon asks for `FUSE_OVER_IO_URING` only once every queue's ring and buffers
//!   exist: once the kernel grants it, requests wait until every queue has an entry,
//!   and only a refused REGISTER (which makes the kernel fall back) would end that wait;
//! - an entry's buffers are touched by the worker only while the kernel has handed the
//!   entry to it, and freed only after the kernel has ended every entry.

mod abi;
mod entry;
mod queue;

use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use fuser::{Dispatcher, Filesystem, InitFlags, KernelConfig};
use parking_lot::Mutex;

use self::entry::PAGE_BYTES;
use self::queue::{QueueSetup, Registered, Worker};

/// The module parameter that lets FUSE connections use io_uring.
pub const ENABLE_PARAMETER: &str = "/sys/module/fuse/parameters/enable_uring";
/// Default ring entries per queue.
pub const QUEUE_DEPTH_DEFAULT: u32 = 8;
/// Largest ring depth accepted.
pub const QUEUE_DEPTH_MAX: u32 = 1024;
/// Default worker threads per queue: with one, a request that waits for the device holds
/// up every other request of its CPU's queue (4 KiB random reads at queue depth 16 ran at
/// 0.81x of /dev/fuse round by round; 1.27x with two, docs/benchmarks.md).
pub const QUEUE_THREADS_DEFAULT: u16 = 2;
/// Most worker threads per queue accepted.
pub const QUEUE_THREADS_MAX: u16 = 16;
/// How long the daemon waits, once `/dev/fuse` is done, for the ring workers to end.
const WORKER_EXIT_WAIT: Duration = Duration::from_secs(10);

/// Whether a mount is served over io_uring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UringMode {
    /// Where the kernel offers it (`enable_uring` on), silently `/dev/fuse` otherwise
    /// (`-o uring=auto`).
    Auto,
    /// Asked for (`-o uring`): a fallback to `/dev/fuse` is logged as a warning.
    On,
    /// Never (`-o nouring`, the default: docs/benchmarks.md has why).
    #[default]
    Off,
}

/// The ring's side of the handshake, shared with the adapter's `init`.
#[derive(Debug, Default)]
pub struct RingOffer {
    /// Every queue is ready to register.
    prepared: bool,
    /// Whether the kernel offered the ring, once the handshake ran.
    offered: Mutex<Option<bool>>,
}

impl RingOffer {
    /// Asks for `FUSE_OVER_IO_URING` if the rings are prepared and the kernel offers it.
    pub fn negotiate(&self, config: &mut KernelConfig) {
        let offered = config
            .capabilities()
            .contains(InitFlags::FUSE_OVER_IO_URING);
        *self.offered.lock() = Some(offered);
        if self.prepared && offered {
            let _ = config.add_capabilities(InitFlags::FUSE_OVER_IO_URING);
        }
    }

    fn granted(&self) -> bool {
        self.prepared && *self.offered.lock() == Some(true)
    }
}

/// Which transport serves a mount, for `cairn stats`.
#[derive(Debug)]
pub struct TransportStatus {
    /// Requests served by each ring queue (empty on `/dev/fuse`).
    pub served_by_queue: Vec<Arc<AtomicU64>>,
    /// Entries per worker ring.
    pub queue_depth: u32,
    pub threads_per_queue: u16,
    /// Why the ring does not serve the mount, if it was asked for.
    pub fallback: Option<String>,
}

impl TransportStatus {
    fn classic(fallback: Option<String>) -> Self {
        TransportStatus {
            served_by_queue: Vec::new(),
            queue_depth: 0,
            threads_per_queue: 0,
            fallback,
        }
    }

    /// `name: value` lines for the statistics text.
    pub fn lines(&self) -> Vec<String> {
        if self.served_by_queue.is_empty() {
            let mut lines = vec!["transport: /dev/fuse".to_string()];
            if let Some(reason) = &self.fallback {
                lines.push(format!("uring_fallback: {reason}"));
            }
            return lines;
        }
        let served: Vec<String> = self
            .served_by_queue
            .iter()
            .map(|count| count.load(Ordering::Relaxed).to_string())
            .collect();
        vec![
            "transport: io_uring".to_string(),
            format!("queues: {}", self.served_by_queue.len()),
            format!("queue_depth: {}", self.queue_depth),
            format!("threads_per_queue: {}", self.threads_per_queue),
            format!("requests_by_queue: {}", served.join(" ")),
        ]
    }
}

/// What a queue thread is told once the handshake is done.
enum Start<FS: Filesystem> {
    Serve {
        fuse_fd: RawFd,
        dispatcher: Arc<Dispatcher<FS>>,
        served: Arc<AtomicU64>,
        registered: mpsc::Sender<Registered>,
    },
}

/// The rings prepared for a mount before its handshake: one thread per queue, waiting.
#[derive(Debug)]
pub struct Rings<FS: Filesystem> {
    offer: Arc<RingOffer>,
    queue_depth: u32,
    queue_count: u16,
    threads_per_queue: u16,
    /// Each worker's start channel and its queue.
    starts: Vec<(mpsc::Sender<Start<FS>>, u16)>,
    threads: Vec<JoinHandle<()>>,
    /// Why the ring cannot be used, found while preparing.
    unavailable: Option<String>,
    /// `prepare` ran: the ring was wanted and looked possible.
    attempted: bool,
}

impl<FS: Filesystem> std::fmt::Debug for Start<FS> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Start")
    }
}

impl<FS: Filesystem> Rings<FS> {
    /// No ring: `-o uring` was not given.
    pub fn off() -> Self {
        Rings {
            offer: Arc::new(RingOffer::default()),
            queue_depth: 0,
            queue_count: 0,
            threads_per_queue: 1,
            starts: Vec::new(),
            threads: Vec::new(),
            unavailable: None,
            attempted: false,
        }
    }

    /// The rings `mode` calls for: prepared for `On`, and for `Auto` where the module
    /// parameter is on; none otherwise.
    pub fn for_mode(mode: UringMode, queue_depth: u32, threads: u16, max_write: u32) -> Self {
        let wanted = match mode {
            UringMode::On => true,
            UringMode::Auto => parameter_enabled() == Some(true),
            UringMode::Off => false,
        };
        match wanted {
            true => Self::prepare(queue_depth, threads, max_write),
            false => Self::off(),
        }
    }

    /// Sets up rings and buffers for every CPU's queue: `threads_per_queue` workers per
    /// queue, each with its own ring of `queue_depth` entries with payloads of
    /// `max_write_bytes`. Problems are kept as the reason to fall back.
    pub fn prepare(queue_depth: u32, threads_per_queue: u16, max_write_bytes: u32) -> Self {
        let mut rings = Self::off();
        rings.attempted = true;
        rings.queue_depth = queue_depth;
        rings.threads_per_queue = threads_per_queue;
        if let Err(reason) = kernel_support() {
            rings.unavailable = Some(reason);
            return rings;
        }
        let queues = match possible_cpus() {
            Ok(count) => count,
            Err(reason) => {
                rings.unavailable = Some(reason);
                return rings;
            }
        };
        rings.queue_count = queues;
        let payload_bytes = payload_bytes(max_write_bytes);
        let (ready_tx, ready_rx) = mpsc::channel();
        let workers = (0..queues).flat_map(|qid| (0..threads_per_queue).map(move |n| (qid, n)));
        for (qid, n) in workers {
            let name = match threads_per_queue {
                1 => format!("cairn-uring-{qid}"),
                _ => format!("cairn-uring-{qid}.{n}"),
            };
            let depth = queue_depth as usize;
            match spawn_queue::<FS>(name, qid, depth, payload_bytes, ready_tx.clone()) {
                Ok((start, thread)) => {
                    rings.starts.push((start, qid));
                    rings.threads.push(thread);
                }
                Err(error) => {
                    rings.unavailable = Some(format!("starting a ring thread: {error}"));
                    break;
                }
            }
        }
        drop(ready_tx);
        for _ in 0..rings.threads.len() {
            match ready_rx.recv() {
                Ok(Ok(())) => {}
                Ok(Err(reason)) => {
                    rings.unavailable.get_or_insert(reason);
                }
                Err(_) => {
                    rings
                        .unavailable
                        .get_or_insert("a ring thread died".to_string());
                }
            }
        }
        rings.offer = Arc::new(RingOffer {
            prepared: rings.unavailable.is_none(),
            offered: Mutex::new(None),
        });
        rings
    }

    /// The handshake's side of the rings (for the adapter's `init`).
    pub fn offer(&self) -> Arc<RingOffer> {
        Arc::clone(&self.offer)
    }

    /// After the handshake: registers the entries and starts serving if the ring was
    /// negotiated, else lets the threads go. A fallback is logged once, as a warning,
    /// where the ring was asked for (`mode` On) or looked possible (prepared).
    pub fn start(
        mut self,
        fuse_fd: RawFd,
        dispatcher: Dispatcher<FS>,
        mode: UringMode,
    ) -> Transport {
        let depth = self.queue_depth;
        if !self.offer.granted() {
            let reason = self.fallback_reason();
            self.starts.clear();
            if mode == UringMode::On || self.attempted {
                tracing::warn!("-o uring: serving through /dev/fuse instead: {reason}");
            }
            let fallback = (mode != UringMode::Off).then_some(reason);
            return Transport::classic(self.threads, fallback);
        }
        let dispatcher = Arc::new(dispatcher);
        let (registered_tx, registered_rx) = mpsc::channel();
        let served: Vec<Arc<AtomicU64>> = (0..self.queue_count)
            .map(|_| Arc::new(AtomicU64::new(0)))
            .collect();
        let workers = self.starts.len();
        for (start, qid) in self.starts.drain(..) {
            let _ = start.send(Start::Serve {
                fuse_fd,
                dispatcher: Arc::clone(&dispatcher),
                served: Arc::clone(&served[usize::from(qid)]),
                registered: registered_tx.clone(),
            });
        }
        drop(registered_tx);
        let mut refused = None;
        for _ in 0..workers {
            match registered_rx.recv() {
                Ok(Ok(())) => {}
                Ok(Err(reason)) => refused = refused.or(Some(reason)),
                Err(_) => refused = refused.or(Some("a ring thread died".to_string())),
            }
        }
        if let Some(reason) = refused {
            // A queue without entries would keep the kernel waiting for the ring to be
            // ready; a refused registration makes it fall back to /dev/fuse.
            force_fallback(fuse_fd);
            tracing::warn!("-o uring: serving through /dev/fuse instead: {reason}");
            return Transport::classic(self.threads, Some(reason));
        }
        tracing::info!(
            queues = served.len(),
            queue_depth = depth,
            threads_per_queue = self.threads_per_queue,
            "serving FUSE requests over io_uring"
        );
        let status = TransportStatus {
            served_by_queue: served,
            queue_depth: depth,
            threads_per_queue: self.threads_per_queue,
            fallback: None,
        };
        Transport {
            status: Arc::new(status),
            threads: std::mem::take(&mut self.threads),
        }
    }

    fn fallback_reason(&self) -> String {
        if let Some(reason) = &self.unavailable {
            return reason.clone();
        }
        match *self.offer.offered.lock() {
            Some(false) if parameter_enabled() == Some(false) => format!(
                "the kernel's fuse.enable_uring is off (as root: echo Y > {ENABLE_PARAMETER})"
            ),
            Some(false) => "the kernel did not offer FUSE_OVER_IO_URING".to_string(),
            _ => "the ring was not negotiated".to_string(),
        }
    }
}

/// The transport serving a mount: its status and the ring threads to wait for.
#[derive(Debug)]
pub struct Transport {
    status: Arc<TransportStatus>,
    threads: Vec<JoinHandle<()>>,
}

impl Transport {
    fn classic(threads: Vec<JoinHandle<()>>, fallback: Option<String>) -> Self {
        Transport {
            status: Arc::new(TransportStatus::classic(fallback)),
            threads,
        }
    }

    pub fn status(&self) -> Arc<TransportStatus> {
        Arc::clone(&self.status)
    }

    /// Waits (a bounded time) for the ring workers, once the connection has ended.
    pub fn finish(self) {
        let deadline = std::time::Instant::now() + WORKER_EXIT_WAIT;
        for thread in self.threads {
            while !thread.is_finished() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            if thread.is_finished() {
                let _ = thread.join();
            } else {
                tracing::error!("a ring worker did not end with the connection");
            }
        }
    }
}

/// Starts a worker thread of queue `qid`: it pins itself to its CPU, sets up its ring and
/// buffers, reports on `ready`, then waits to be started.
fn spawn_queue<FS: Filesystem>(
    name: String,
    qid: u16,
    depth: usize,
    payload_bytes: usize,
    ready: mpsc::Sender<Result<(), String>>,
) -> std::io::Result<(mpsc::Sender<Start<FS>>, JoinHandle<()>)> {
    let (start_tx, start_rx) = mpsc::channel::<Start<FS>>();
    let thread = std::thread::Builder::new().name(name).spawn(move || {
        pin_to_cpu(qid);
        let setup = match QueueSetup::new(qid, depth, payload_bytes) {
            Ok(setup) => setup,
            Err(error) => {
                let _ = ready.send(Err(format!("setting up io_uring: {error}")));
                return;
            }
        };
        let _ = ready.send(Ok(()));
        drop(ready);
        let Ok(Start::Serve {
            fuse_fd,
            dispatcher,
            served,
            registered,
        }) = start_rx.recv()
        else {
            return;
        };
        let mut worker = Worker::new(setup, fuse_fd, dispatcher, served);
        let _ = registered.send(worker.register());
        // Even after a refusal: the entries the kernel took may still get requests.
        worker.serve();
    })?;
    Ok((start_tx, thread))
}

/// Pins the calling thread to CPU `cpu`: the kernel queues a request on the issuing
/// CPU's queue, so its worker then runs where the request came from.
fn pin_to_cpu(cpu: u16) {
    // SAFETY: cpu_set_t is plain data; CPU_SET stays inside it for cpu < CPU_SETSIZE.
    let result = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(usize::from(cpu), &mut set);
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set)
    };
    if result != 0 {
        let error = std::io::Error::last_os_error();
        tracing::debug!(cpu, %error, "ring worker not pinned to its CPU");
    }
}

/// Makes the kernel give up on the ring for this connection: a REGISTER naming a queue
/// that does not exist is refused, and a refused REGISTER turns the ring off.
fn force_fallback(fuse_fd: RawFd) {
    let Ok(setup) = QueueSetup::new(u16::MAX, 1, PAGE_BYTES * 2) else {
        tracing::error!("no ring to turn the kernel's ring off with; requests may wait");
        return;
    };
    let _ = queue::refuse_register(setup, fuse_fd);
}

/// Whether this kernel can serve FUSE over io_uring at all.
fn kernel_support() -> Result<(), String> {
    match std::path::Path::new(ENABLE_PARAMETER).exists() {
        true => Ok(()),
        false => Err(format!(
            "this kernel has no FUSE over io_uring (Linux 6.14 or later built with \
             CONFIG_FUSE_IO_URING; no {ENABLE_PARAMETER})"
        )),
    }
}

/// The `enable_uring` module parameter, if the kernel has it.
pub fn parameter_enabled() -> Option<bool> {
    let text = std::fs::read_to_string(ENABLE_PARAMETER).ok()?;
    Some(text.trim() == "Y" || text.trim() == "1")
}

/// The number of ring queues the kernel expects: one per possible CPU (it registers
/// requests by CPU number, and waits for every queue to have entries).
fn possible_cpus() -> Result<u16, String> {
    let path = "/sys/devices/system/cpu/possible";
    let text = std::fs::read_to_string(path).map_err(|e| format!("reading {path}: {e}"))?;
    parse_cpu_list(text.trim()).ok_or_else(|| format!("{path}: cannot read '{}'", text.trim()))
}

/// The count of CPUs 0..=N in a list like `0-3` or `0,1` (the kernel numbers queues by
/// CPU; a list with gaps is counted up to its highest CPU).
fn parse_cpu_list(text: &str) -> Option<u16> {
    let mut highest: u16 = 0;
    for part in text.split(',') {
        let last = part.rsplit('-').next()?;
        highest = highest.max(last.trim().parse().ok()?);
    }
    highest.checked_add(1)
}

/// The payload buffer an entry needs for `max_write`: at least the kernel's minimum, and
/// whole pages (the kernel sizes it as the larger of `max_write` and `max_pages` pages).
fn payload_bytes(max_write_bytes: u32) -> usize {
    let bytes = (max_write_bytes as usize).max(abi::PAYLOAD_MIN_BYTES);
    bytes.next_multiple_of(PAGE_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;

    // CPU lists as the kernel prints them.
    #[test]
    fn cpu_lists_count_queues() {
        assert_eq!(parse_cpu_list("0"), Some(1));
        assert_eq!(parse_cpu_list("0-1"), Some(2));
        assert_eq!(parse_cpu_list("0-3,8-11"), Some(12));
        assert_eq!(parse_cpu_list("0,2"), Some(3));
        assert_eq!(parse_cpu_list("x"), None);
    }

    // Payload buffers hold max_write in whole pages, and never less than 8 KiB.
    #[test]
    fn payload_sizes() {
        assert_eq!(payload_bytes(1 << 20), 1 << 20);
        assert_eq!(payload_bytes(4096), 8192);
        assert_eq!(payload_bytes(100_000), 102_400);
    }
}
