//! Counters of FUSE requests by type (count, errors, latency) and the text `cairn stats`
//! prints: these plus every subsystem's counters from `Filesystem::stats`.
//!
//! `cairn stats MOUNTPOINT` reads the text as the value of the extended attribute
//! [`STATS_XATTR`] on the mount's root directory. The kernel forwards `system.*` names to
//! the daemon without a permission check of its own, so any user who can see the mount
//! can read it; no socket or extra file is involved.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use cairn_atomic::AtomicWord;
use cairn_fs::FsStats;

/// The reserved extended attribute whose value is the statistics text.
pub const STATS_XATTR: &str = "system.cairn.stats";

macro_rules! ops {
    ($($variant:ident => $name:literal),* $(,)?) => {
        /// A FUSE request type.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum Op { $($variant),* }

        /// Names of the request types, in `Op` order.
        pub const OP_NAMES: &[&str] = &[$($name),*];
    };
}

ops! {
    Lookup => "lookup", Forget => "forget", Getattr => "getattr", Setattr => "setattr",
    Statx => "statx", Ioctl => "ioctl",
    Readlink => "readlink", Mknod => "mknod", Mkdir => "mkdir", Unlink => "unlink",
    Rmdir => "rmdir", Symlink => "symlink", Rename => "rename", Link => "link",
    Open => "open", Read => "read", Write => "write", Flush => "flush",
    Release => "release", Fsync => "fsync", Opendir => "opendir", Readdir => "readdir",
    Readdirplus => "readdirplus", Releasedir => "releasedir", Fsyncdir => "fsyncdir",
    Statfs => "statfs", Setxattr => "setxattr", Getxattr => "getxattr",
    Listxattr => "listxattr", Removexattr => "removexattr", Access => "access",
    Create => "create", Fallocate => "fallocate", Lseek => "lseek",
    CopyFileRange => "copy_file_range", Tmpfile => "tmpfile",
}

/// Number of request types.
pub const OP_COUNT: usize = OP_NAMES.len();

/// One request type's counters, on a cache line of its own so threads serving different
/// request types do not contend.
#[derive(Debug)]
#[repr(align(64))]
struct OpSlot {
    count: AtomicU64,
    errors: AtomicU64,
    total_ns: AtomicU64,
    max_ns: AtomicU64,
    /// Time spent in requests that took longer than `SLOW_NS`: whether a type's mean is
    /// its typical cost or a few stalls.
    slow_ns: AtomicU64,
    /// Requests by latency (`latency_bucket`), for the percentiles.
    buckets: [AtomicU64; BUCKETS],
}

impl Default for OpSlot {
    fn default() -> Self {
        Self {
            count: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            total_ns: AtomicU64::new(0),
            max_ns: AtomicU64::new(0),
            slow_ns: AtomicU64::new(0),
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl OpSlot {
    /// Counts one request that took `elapsed_ns`.
    fn record(&self, elapsed_ns: u64) {
        self.count.fetch_add(1, Ordering::Relaxed);
        self.total_ns.fetch_add(elapsed_ns, Ordering::Relaxed);
        self.max_ns.fetch_max(elapsed_ns, Ordering::Relaxed);
        self.buckets[latency_bucket(elapsed_ns)].fetch_add(1, Ordering::Relaxed);
        if elapsed_ns > SLOW_NS {
            self.slow_ns.fetch_add(elapsed_ns, Ordering::Relaxed);
        }
    }
}

/// A request slower than this counts as slow (`OpSnapshot::slow_ns`).
const SLOW_NS: u64 = 1_000_000;
/// Latency buckets: four per power of two of microseconds (so a percentile read from them,
/// a bucket's upper bound, is at most 25% above the true value), from under 1 us up to
/// about 2^31 us (36 minutes).
const SUB_BUCKETS: usize = 4;
const BUCKETS: usize = 32 * SUB_BUCKETS;

/// The bucket of a latency: below 1 us bucket 0; else 4 * log2(us) plus which quarter of
/// that power of two it lies in, plus one.
fn latency_bucket(ns: u64) -> usize {
    let us = ns / 1000;
    if us == 0 {
        return 0;
    }
    let power = 63 - us.leading_zeros() as usize;
    // The two bits below the leading one pick the quarter (shifted in for small values).
    let quarter = ((us << 2) >> power) as usize & (SUB_BUCKETS - 1);
    (1 + power * SUB_BUCKETS + quarter).min(BUCKETS - 1)
}

/// The upper bound, in microseconds, of the latencies in `bucket`.
fn bucket_upper_us(bucket: usize) -> f64 {
    if bucket == 0 {
        return 1.0;
    }
    let power = (bucket - 1) / SUB_BUCKETS;
    let quarter = (bucket - 1) % SUB_BUCKETS;
    (1u64 << power) as f64 * (1.0 + (quarter + 1) as f64 / SUB_BUCKETS as f64)
}

/// Requests tracked in flight at once: one slot per serving thread (each serves one request
/// at a time); threads past this many go untracked.
const FLIGHT_SLOTS: usize = 64;

/// The request one thread is serving, on a cache line of its own. Only that thread writes
/// it; the watchdog and `cairn stats` read it from other threads. Generic over the atomic so
/// the loom model below runs this code.
///
/// A request is known by its `since_ns`: the slot's next request starts later, so it has a
/// later one (or, within one tick of a coarse clock, both are young). So a read that saw
/// `since_ns` change around its field loads is dropped (the request it began with has ended
/// and the next one is young), and the watchdog's mark names the request it reported. Before
/// the loom model (`tests::models`), a mark set just after the slot's request ended landed
/// on the next one, whose hang then went unreported, and a read could give one request's
/// age with the next one's type and node.
#[derive(Debug)]
#[repr(align(64))]
struct FlightSlot<W = AtomicU64> {
    /// When the request arrived, in nanoseconds since the statistics began, plus one; 0 while
    /// the thread is idle.
    since_ns: W,
    /// Index in `OP_NAMES`.
    op: W,
    node: W,
    /// The `since_ns` of the last request the hang watchdog reported (0: none).
    reported_since_ns: W,
}

/// A consistent read of a busy slot.
struct Seen {
    since_ns: u64,
    op: u64,
    node: u64,
}

impl<W: AtomicWord> FlightSlot<W> {
    fn idle() -> Self {
        Self {
            since_ns: W::new(0),
            op: W::new(0),
            node: W::new(0),
            reported_since_ns: W::new(0),
        }
    }

    fn is_idle(&self) -> bool {
        self.since_ns.load(Ordering::Relaxed) == 0
    }

    /// Shows a request the slot's thread starts serving (the slot is idle). The field
    /// stores release the end of the previous request (`since_ns` 0) to a reader that loads
    /// them, so its second look at `since_ns` sees the slot changed; `since_ns` is stored
    /// last and released, so a reader that sees it sees the fields.
    fn begin(&self, op: u64, node: u64, since_ns: u64) {
        self.op.store(op, Ordering::Release);
        self.node.store(node, Ordering::Release);
        self.since_ns.store(since_ns, Ordering::Release);
    }

    fn end(&self) {
        self.since_ns.store(0, Ordering::Release);
    }

    /// The request in the slot, if one was there throughout the read.
    fn seen(&self) -> Option<Seen> {
        let since_ns = self.since_ns.load(Ordering::Acquire);
        if since_ns == 0 {
            return None;
        }
        let op = self.op.load(Ordering::Acquire);
        let node = self.node.load(Ordering::Acquire);
        (self.since_ns.load(Ordering::Relaxed) == since_ns).then_some(Seen { since_ns, op, node })
    }

    /// Marks the request seen as reported; true if it was not already.
    fn mark_reported(&self, seen: &Seen) -> bool {
        self.reported_since_ns
            .swap(seen.since_ns, Ordering::Relaxed)
            != seen.since_ns
    }

    /// The request in this slot at `now_ns` (the statistics' clock), if any.
    fn read(&self, now_ns: u64) -> Option<(Seen, InFlight)> {
        let seen = self.seen()?;
        let found = InFlight {
            name: usize::try_from(seen.op)
                .ok()
                .and_then(|op| OP_NAMES.get(op))
                .copied()
                .unwrap_or("?"),
            node: seen.node,
            age: Duration::from_nanos(now_ns.saturating_sub(seen.since_ns)),
            reported: self.reported_since_ns.load(Ordering::Relaxed) == seen.since_ns,
        };
        Some((seen, found))
    }

    /// The request in this slot if it is older than `limit` at `now_ns` and not reported
    /// yet, marked reported.
    fn take_if_older(&self, now_ns: u64, limit: Duration) -> Option<InFlight> {
        let (seen, found) = self.read(now_ns)?;
        (found.age >= limit && self.mark_reported(&seen)).then_some(found)
    }
}

/// A request that has been served for a while, as `in_flight` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InFlight {
    pub name: &'static str,
    pub node: u64,
    pub age: Duration,
    /// Reported by an earlier `take_unreported_older_than`.
    pub reported: bool,
}

/// Counters for every request type, and the requests in flight.
#[derive(Debug)]
pub struct RequestStats {
    slots: [OpSlot; OP_COUNT],
    flights: [FlightSlot; FLIGHT_SLOTS],
    started: Instant,
    /// Which transport serves the mount, once the session is up.
    transport: std::sync::OnceLock<std::sync::Arc<crate::uring::TransportStatus>>,
}

impl Default for RequestStats {
    fn default() -> Self {
        Self {
            slots: std::array::from_fn(|_| OpSlot::default()),
            flights: std::array::from_fn(|_| FlightSlot::idle()),
            started: Instant::now(),
            transport: std::sync::OnceLock::new(),
        }
    }
}

/// This thread's flight slot index (threads are numbered as they first serve a request).
fn thread_flight_slot() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SLOT: usize = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    SLOT.with(|slot| *slot)
}

/// A snapshot of one request type's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpSnapshot {
    pub name: &'static str,
    pub count: u64,
    pub errors: u64,
    pub total_ns: u64,
    pub max_ns: u64,
    /// Time spent in requests slower than 1 ms.
    pub slow_ns: u64,
    buckets: [u64; BUCKETS],
}

impl OpSnapshot {
    /// The latency, in microseconds, that `fraction` of the requests did not exceed (the
    /// upper bound of its bucket: at most 25% over); 0 with no requests.
    pub fn percentile_us(&self, fraction: f64) -> f64 {
        let total: u64 = self.buckets.iter().sum();
        if total == 0 {
            return 0.0;
        }
        let wanted = ((total as f64 * fraction).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (bucket, &count) in self.buckets.iter().enumerate() {
            seen += count;
            if seen >= wanted {
                return bucket_upper_us(bucket).min(self.max_ns as f64 / 1000.0);
            }
        }
        self.max_ns as f64 / 1000.0
    }
}

/// Measures one request from creation to drop, and shows it in flight meanwhile.
#[derive(Debug)]
pub struct Timer<'a> {
    slot: &'a OpSlot,
    flight: Option<&'a FlightSlot>,
    start: Instant,
}

impl Timer<'_> {
    /// Ends the request's time in flight on this thread without recording it: its reply
    /// comes later from elsewhere (a read handed over), which records it with
    /// `RequestStats::record_since` and the start returned here.
    pub fn hand_over(self) -> Instant {
        let start = self.start;
        if let Some(flight) = self.flight {
            flight.end();
        }
        std::mem::forget(self);
        start
    }
}

impl Drop for Timer<'_> {
    fn drop(&mut self) {
        let elapsed_ns = u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.slot.record(elapsed_ns);
        if let Some(flight) = self.flight {
            flight.end();
        }
    }
}

impl RequestStats {
    /// Starts timing a request of type `op` on FUSE node `node`.
    pub fn start(&self, op: Op, node: u64) -> Timer<'_> {
        let start = Instant::now();
        let since_ns = start.duration_since(self.started).as_nanos() as u64 + 1;
        // Only this thread writes its slot; a busy one (a request started inside another)
        // keeps the outer request.
        let flight = self
            .flights
            .get(thread_flight_slot())
            .filter(|flight| flight.is_idle());
        if let Some(flight) = flight {
            flight.begin(op as u64, node, since_ns);
        }
        Timer {
            slot: &self.slots[op as usize],
            flight,
            start,
        }
    }

    /// The requests in flight, oldest first.
    pub fn in_flight(&self) -> Vec<InFlight> {
        let now_ns = self.started.elapsed().as_nanos() as u64 + 1;
        let mut out: Vec<InFlight> = self
            .flights
            .iter()
            .filter_map(|flight| flight.read(now_ns).map(|(_, found)| found))
            .collect();
        out.sort_by_key(|flight| std::cmp::Reverse(flight.age));
        out
    }

    /// The requests in flight for longer than `limit` not reported before, marked reported.
    pub fn take_unreported_older_than(&self, limit: Duration) -> Vec<InFlight> {
        let now_ns = self.started.elapsed().as_nanos() as u64 + 1;
        self.flights
            .iter()
            .filter_map(|flight| flight.take_if_older(now_ns, limit))
            .collect()
    }

    /// Counts a failed request of type `op`.
    /// Records a request of type `op` started at `start` and answered now (see
    /// `Timer::hand_over`).
    pub fn record_since(&self, op: Op, start: Instant) {
        let elapsed_ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.slots[op as usize].record(elapsed_ns);
    }

    pub fn error(&self, op: Op) {
        self.slots[op as usize]
            .errors
            .fetch_add(1, Ordering::Relaxed);
    }

    /// The counters of every request type.
    pub fn snapshot(&self) -> Vec<OpSnapshot> {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        OP_NAMES
            .iter()
            .zip(&self.slots)
            .map(|(name, slot)| OpSnapshot {
                name,
                count: load(&slot.count),
                errors: load(&slot.errors),
                total_ns: load(&slot.total_ns),
                max_ns: load(&slot.max_ns),
                slow_ns: load(&slot.slow_ns),
                buckets: std::array::from_fn(|bucket| load(&slot.buckets[bucket])),
            })
            .collect()
    }

    /// Records which transport serves the mount (once).
    pub fn set_transport(&self, status: std::sync::Arc<crate::uring::TransportStatus>) {
        let _ = self.transport.set(status);
    }

    /// The transport's status lines (`key: value`), once the session is up.
    pub fn transport_lines(&self) -> Vec<String> {
        self.transport
            .get()
            .map(|transport| transport.lines())
            .unwrap_or_default()
    }

    /// Seconds since the mount.
    pub fn uptime_secs(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }
}

/// The text `cairn stats` prints.
pub fn render(fs: &FsStats, requests: &RequestStats) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "uptime_secs: {:.1}", requests.uptime_secs());
    let shutdown = fs.shutdown.as_deref().unwrap_or("no");
    let _ = writeln!(out, "shut_down: {shutdown}");
    section(&mut out, "fs", &format!("{:#?}", fs.fs));
    section(&mut out, "bufcache", &format!("{:#?}", fs.bufcache));
    section(&mut out, "journal", &format!("{:#?}", fs.journal));
    section(&mut out, "alloc", &format!("{:#?}", fs.alloc));
    section(&mut out, "data", &format!("{:#?}", fs.data));
    section(&mut out, "extcache", &format!("{:#?}", fs.extcache));
    section(&mut out, "write_behind", &format!("{:#?}", fs.write_behind));
    section(&mut out, "reflink", &format!("{:#?}", fs.reflink));
    section(&mut out, "reads", &format!("{:#?}", fs.reads));
    if let Some(transport) = requests.transport.get() {
        let _ = writeln!(out, "[fuse transport]");
        for line in transport.lines() {
            let _ = writeln!(out, "  {line}");
        }
    }
    let flying = requests.in_flight();
    let _ = writeln!(out, "[fuse in flight]");
    let _ = writeln!(out, "  requests: {}", flying.len());
    if let Some(oldest) = flying.first() {
        let _ = writeln!(
            out,
            "  oldest: {} on node {} for {:.3} s",
            oldest.name,
            oldest.node,
            oldest.age.as_secs_f64()
        );
    }
    let _ = writeln!(
        out,
        "  lock_cycle_detector: {}",
        cairn_lockrank::DETECTOR_ENABLED
    );
    let _ = writeln!(out, "[fuse requests]");
    let _ = writeln!(
        out,
        "  {:<16} {:>12} {:>8} {:>12} {:>10} {:>10} {:>12} {:>10}",
        "request", "count", "errors", "avg_us", "p50_us", "p99_us", "max_us", "slow_ms"
    );
    for op in requests.snapshot().iter().filter(|op| op.count > 0) {
        let avg_us = op.total_ns as f64 / op.count as f64 / 1000.0;
        let _ = writeln!(
            out,
            "  {:<16} {:>12} {:>8} {:>12.1} {:>10.0} {:>10.0} {:>12.1} {:>10.1}",
            op.name,
            op.count,
            op.errors,
            avg_us,
            op.percentile_us(0.5),
            op.percentile_us(0.99),
            op.max_ns as f64 / 1000.0,
            op.slow_ns as f64 / 1e6
        );
    }
    out
}

/// Writes a `{:#?}` dump as an indented `[name]` section, one field a line, dropping the
/// struct names and braces.
fn section(out: &mut String, name: &str, debug: &str) {
    let _ = writeln!(out, "[{name}]");
    for line in debug.lines().skip(1) {
        let trimmed = line.trim_end_matches(',');
        if trimmed.trim() == "}" || trimmed.trim() == "]" || trimmed.trim().is_empty() {
            continue;
        }
        let _ = writeln!(out, "  {}", trimmed.trim_start_matches("    "));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Timers count requests and latencies per type; errors are counted apart.
    #[test]
    fn timers_count_per_request_type() {
        let stats = RequestStats::default();
        for _ in 0..3 {
            let _timer = stats.start(Op::Lookup, 1);
        }
        drop(stats.start(Op::Write, 1));
        stats.error(Op::Write);
        let snapshot = stats.snapshot();
        let lookup = snapshot.iter().find(|op| op.name == "lookup").unwrap();
        let write = snapshot.iter().find(|op| op.name == "write").unwrap();
        assert_eq!(lookup.count, 3);
        assert_eq!(write.count, 1);
        assert_eq!(write.errors, 1);
        assert!(lookup.max_ns <= lookup.total_ns);
        assert_eq!(OP_NAMES.len(), Op::Tmpfile as usize + 1);
    }

    // A latency's bucket has an upper bound at or above it and at most 25% over it, and
    // buckets grow with the latency.
    #[test]
    fn latency_buckets_bound_their_latencies() {
        let mut last = 0;
        for us in (1..5000).chain([65_536, 1 << 20, 1 << 30]) {
            let bucket = latency_bucket(us * 1000);
            let upper = bucket_upper_us(bucket);
            assert!(
                upper > us as f64,
                "{us} us in bucket {bucket} up to {upper}"
            );
            assert!(
                upper <= us as f64 * 1.25 + 1.0,
                "{us} us in bucket {bucket}"
            );
            assert!(bucket >= last, "{us} us");
            last = bucket;
        }
        assert_eq!(latency_bucket(999), 0);
        assert_eq!(latency_bucket(u64::MAX), BUCKETS - 1);
    }

    // Percentiles and slow time follow the requests recorded: 99 fast ones and one slow.
    #[test]
    fn percentiles_and_slow_time() {
        let stats = RequestStats::default();
        let slot = &stats.slots[Op::Create as usize];
        for _ in 0..99 {
            slot.record(10_000);
        }
        slot.record(50_000_000);
        let snapshot = stats.snapshot()[Op::Create as usize];
        assert!((10.0..=12.5).contains(&snapshot.percentile_us(0.5)));
        assert!((10.0..=12.5).contains(&snapshot.percentile_us(0.99)));
        assert_eq!(snapshot.percentile_us(1.0), 50_000.0);
        assert_eq!(snapshot.slow_ns, 50_000_000);
    }

    // Every subsystem's counters are in the text, each under its own header.
    #[test]
    fn render_has_a_section_per_subsystem() {
        let mut fs = FsStats {
            shutdown: None,
            fs: Default::default(),
            bufcache: Default::default(),
            journal: Default::default(),
            alloc: Default::default(),
            data: Default::default(),
            extcache: Default::default(),
            write_behind: Default::default(),
            reflink: Default::default(),
            reads: Default::default(),
        };
        let text = render(&fs, &RequestStats::default());
        let sections = [
            "fs",
            "bufcache",
            "journal",
            "alloc",
            "data",
            "extcache",
            "write_behind",
            "reflink",
            "reads",
        ];
        for name in sections {
            assert!(
                text.contains(&format!("[{name}]\n")),
                "no [{name}] in {text}"
            );
        }
        assert!(text.contains("preallocated_blocks: 0"), "{text}");
        assert!(text.contains("reclaimable_objects: 0"), "{text}");
        assert!(text.contains("shut_down: no\n"), "{text}");
        fs.shutdown = Some("a dirty transaction was cancelled".to_string());
        let text = render(&fs, &RequestStats::default());
        assert!(
            text.contains("shut_down: a dirty transaction was cancelled\n"),
            "{text}"
        );
    }

    // A debug dump becomes one indented field a line under its section header.
    #[test]
    fn sections_list_fields() {
        #[derive(Debug)]
        #[allow(dead_code)]
        struct Sample {
            hits: u64,
            misses: u64,
        }
        let mut out = String::new();
        section(
            &mut out,
            "cache",
            &format!("{:#?}", Sample { hits: 5, misses: 2 }),
        );
        assert_eq!(out, "[cache]\n  hits: 5\n  misses: 2\n");
    }

    // A request shows in flight while its timer lives, oldest first; the watchdog's take
    // reports each one once.
    #[test]
    fn requests_in_flight_are_seen_and_reported_once() {
        let stats = RequestStats::default();
        assert!(stats.in_flight().is_empty());
        let timer = stats.start(Op::Fsync, 42);
        let flying = stats.in_flight();
        assert_eq!(flying.len(), 1);
        assert_eq!((flying[0].name, flying[0].node), ("fsync", 42));
        assert!(
            stats
                .take_unreported_older_than(Duration::from_secs(3600))
                .is_empty()
        );
        let taken = stats.take_unreported_older_than(Duration::ZERO);
        assert_eq!(taken.len(), 1);
        assert!(stats.take_unreported_older_than(Duration::ZERO).is_empty());
        assert!(stats.in_flight()[0].reported);
        let other = std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    let _second = stats.start(Op::Lookup, 7);
                    stats.in_flight().len()
                })
                .join()
                .unwrap()
        });
        assert_eq!(other, 2, "each thread has its own slot");
        drop(timer);
        assert!(stats.in_flight().is_empty());
    }

    mod models {
        use std::sync::Arc;
        use std::time::Duration;

        use loom::sync::atomic::AtomicU64 as LoomWord;

        use super::super::{FlightSlot, Op};

        // The slot's thread ends a request that has run long and starts the next while the
        // watchdog takes the old one. A report names one request throughout (its type, node
        // and age), the mark never lands on the next request, and that one is reported once
        // it is old in turn.
        #[test]
        fn watchdog_against_the_next_request() {
            loom::model(|| {
                let slot = Arc::new(FlightSlot::<LoomWord>::idle());
                slot.begin(Op::Fsync as u64, 42, 1);
                let server = {
                    let slot = Arc::clone(&slot);
                    loom::thread::spawn(move || {
                        slot.end();
                        slot.begin(Op::Lookup as u64, 7, 1_000);
                    })
                };
                let limit = Duration::from_nanos(500);
                if let Some(found) = slot.take_if_older(1_100, limit) {
                    let want = ("fsync", 42, Duration::from_nanos(1_099));
                    assert_eq!((found.name, found.node, found.age), want);
                }
                server.join().unwrap();
                let found = slot.take_if_older(2_000, limit);
                let hung = found.is_some_and(|found| (found.name, found.node) == ("lookup", 7));
                assert!(hung, "the hung second request was not reported: {found:?}");
            });
        }
    }
}
